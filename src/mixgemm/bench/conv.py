"""Conv cases for `mixgemm bench --conv`: mixgemm.conv2d (W4/W8 block-quantized kernels) vs cuDNN fp16.

A case is a :class:`ConvSpec` layer and a batch size B. Records use the implicit-GEMM dimensions
(K = Ci * Kh * Kw, N = Co, M = B * Ho * Wo) so the tables line up with the matmul ones; ``layer`` names it.
Activations are fp16 channels_last (the layout both cuDNN and mixgemm's conv prefer). The reference is the
float64 convolution with the method's stored (dequantized) weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mixgemm.bench.methods import TOL, Context, Method, Prepared, _module_unavailable, _TrackedLayouts, tensor_bytes


@dataclass(frozen=True)
class ConvSpec:
    name: str
    ci: int
    co: int
    k: int  # square kernel Kh = Kw
    stride: int
    hw: int  # square input H = W
    pad: int | None = None  # default k // 2

    @property
    def padding(self) -> int:
        return self.k // 2 if self.pad is None else self.pad

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.padding - self.k) // self.stride + 1

    def gemm_dims(self, batch: int) -> tuple[int, int, int]:
        """(M, K, N) of the implicit GEMM."""
        return batch * self.out_hw**2, self.ci * self.k * self.k, self.co

    def weight(self, seed: int, device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + self.ci * 31 + self.co * 7 + self.k)
        return torch.randn(self.co, self.ci, self.k, self.k, generator=gen, device=device) * 0.02

    def x(self, batch: int, seed: int, device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + batch * 17 + self.hw)
        return torch.randn(batch, self.ci, self.hw, self.hw, generator=gen, device=device)


# A few ResNet-50 layers (v1.5) and a Stable-Diffusion-UNet-like 3x3 at 64x64: 3x3 and 1x1, early and late.
CONV_PRESET = [
    ConvSpec("r50 3x3 64-64 @56", 64, 64, 3, 1, 56),
    ConvSpec("r50 3x3 256-256 @14", 256, 256, 3, 1, 14),
    ConvSpec("r50 1x1 1024-256 @14", 1024, 256, 1, 1, 14),
    ConvSpec("r50 3x3 512-512 @7", 512, 512, 3, 1, 7),
    ConvSpec("unet 3x3 320-320 @64", 320, 320, 3, 1, 64),
]
CONV_BATCHES = [1, 8]


def _to_cl(dtype):
    return lambda x: x.to(dtype).contiguous(memory_format=torch.channels_last)


def _prep_cudnn(spec_of):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        spec: ConvSpec = spec_of(ctx)
        wd = w.to(torch.float16).contiguous(memory_format=torch.channels_last)
        w64 = wd.double()

        def make(t):
            return lambda x: F.conv2d(x, t, None, spec.stride, spec.padding)

        return Prepared(
            layer=make(wd), new_copy=lambda: make(wd.clone()), x_map=_to_cl(torch.float16),
            reference=lambda x: F.conv2d(x.double(), w64, None, spec.stride, spec.padding),
            tol=TOL[torch.float16], weight_bytes=lambda: wd.numel() * 2, act_bytes=2, out_bytes=2,
        )

    return prepare


def _prep_mixgemm_conv(bits: int):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        from mixgemm import conv2d, quantize_conv_weight
        from mixgemm.formats.weight import QuantConfig

        spec: ConvSpec = ctx.notes["conv_spec"]
        g = -1 if bits == 8 else ctx.group_size
        if g != -1 and spec.ci % g:
            g = max([d for d in (32, 64, 128, 256) if d <= g and spec.ci % d == 0], default=-1)
        qc0 = quantize_conv_weight(w, QuantConfig(bits=bits, group_size=g, mode="sym"))
        w64 = qc0.dequantize(torch.float64)

        def fresh(clone: bool):
            m = qc0.matrix
            c = (lambda t: None if t is None else t.clone()) if clone else (lambda t: t)
            mat = dataclasses.replace(m, qweight=c(m.qweight), scales=c(m.scales), zeros=c(m.zeros),
                                      offsets=c(m.offsets), _layouts=_TrackedLayouts())
            return dataclasses.replace(qc0, matrix=mat)

        first = fresh(False)

        def make(qc):
            return lambda x: conv2d(x, qc, None, spec.stride, spec.padding)

        def weight_bytes() -> int:
            lays = first.matrix._layouts
            return sum(tensor_bytes(lays[n]) for n in sorted(lays.read)) if lays.read else first.matrix.nbytes()

        gname = "per-channel" if g == -1 else f"g{g}"
        return Prepared(
            layer=make(first), new_copy=lambda: make(fresh(True)), x_map=_to_cl(torch.float16),
            reference=lambda x: F.conv2d(x.double(), w64, None, spec.stride, spec.padding),
            tol=TOL[torch.float16], weight_bytes=weight_bytes, act_bytes=2, out_bytes=2,
            before_call=first.matrix._layouts.read.clear, note=f"W{bits} {gname}",
        )

    return prepare


def conv_methods() -> list[Method]:
    spec_of = lambda ctx: ctx.notes["conv_spec"]
    gpu = lambda ctx: None if ctx.device.type == "cuda" else "needs a CUDA GPU"
    return [
        Method("mixgemm conv W4A16", "mixgemm", _prep_mixgemm_conv(4),
               _module_unavailable("mixgemm.ops.conv", "mixgemm.kernels.triton.conv"), kind="conv",
               description="mixgemm.conv2d, W4 sym (group = --group-size, or the largest dividing Ci), fp16"),
        Method("mixgemm conv W8A16", "mixgemm", _prep_mixgemm_conv(8),
               _module_unavailable("mixgemm.ops.conv", "mixgemm.kernels.triton.conv"), kind="conv",
               description="mixgemm.conv2d, W8 sym per-channel, fp16"),
        Method("cuDNN fp16 conv", "peer", _prep_cudnn(spec_of), gpu, kind="conv",
               description="F.conv2d fp16 channels_last (cuDNN)"),
    ]


CONV_BASELINE = "cuDNN fp16 conv"
