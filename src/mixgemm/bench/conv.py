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
    groups: int = 1  # groups == ci == co: depthwise

    @property
    def padding(self) -> int:
        return self.k // 2 if self.pad is None else self.pad

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.padding - self.k) // self.stride + 1

    def gemm_dims(self, batch: int) -> tuple[int, int, int]:
        """(M, K, N) of the implicit GEMM."""
        return batch * self.out_hw**2, self.ci // self.groups * self.k * self.k, self.co

    def weight(self, seed: int, device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + self.ci * 31 + self.co * 7 + self.k)
        return torch.randn(self.co, self.ci // self.groups, self.k, self.k, generator=gen, device=device) * 0.02

    def x(self, batch: int, seed: int, device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + batch * 17 + self.hw)
        return torch.randn(batch, self.ci, self.hw, self.hw, generator=gen, device=device)


# The conv benchmark's layers: every distinct conv shape of ResNet-50 (v1.5: stride on the 3x3) but the 1x1
# repeats of the stem, by stage, and ConvNeXt-T's 7x7 depthwise conv at stages 1 and 3. Batch 1 and 32.
CONV_PRESET = [
    ConvSpec("r50.stem 7x7/2 3-64 @224", 3, 64, 7, 2, 224),
    ConvSpec("r50.s1 1x1 64-64 @56", 64, 64, 1, 1, 56),
    ConvSpec("r50.s1 3x3 64-64 @56", 64, 64, 3, 1, 56),
    ConvSpec("r50.s1 1x1 64-256 @56", 64, 256, 1, 1, 56),
    ConvSpec("r50.s1 1x1 256-64 @56", 256, 64, 1, 1, 56),
    ConvSpec("r50.s2 3x3/2 128-128 @56", 128, 128, 3, 2, 56),
    ConvSpec("r50.s2 3x3 128-128 @28", 128, 128, 3, 1, 28),
    ConvSpec("r50.s2 1x1 128-512 @28", 128, 512, 1, 1, 28),
    ConvSpec("r50.s2 1x1/2 256-512 @56 (down)", 256, 512, 1, 2, 56),
    ConvSpec("r50.s3 3x3/2 256-256 @28", 256, 256, 3, 2, 28),
    ConvSpec("r50.s3 3x3 256-256 @14", 256, 256, 3, 1, 14),
    ConvSpec("r50.s3 1x1 1024-256 @14", 1024, 256, 1, 1, 14),
    ConvSpec("r50.s3 1x1 256-1024 @14", 256, 1024, 1, 1, 14),
    ConvSpec("r50.s4 3x3/2 512-512 @14", 512, 512, 3, 2, 14),
    ConvSpec("r50.s4 3x3 512-512 @7", 512, 512, 3, 1, 7),
    ConvSpec("r50.s4 1x1 512-2048 @7", 512, 2048, 1, 1, 7),
    ConvSpec("r50.s4 1x1 2048-512 @7", 2048, 512, 1, 1, 7),
    ConvSpec("cnx.s1 dw7x7 96 @56", 96, 96, 7, 1, 56, groups=96),
    ConvSpec("cnx.s3 dw7x7 384 @14", 384, 384, 7, 1, 14, groups=384),
]
CONV_BATCHES = [1, 32]


def _to_cl(dtype):
    return lambda x: x.to(dtype).contiguous(memory_format=torch.channels_last)


def _prep_cudnn(spec_of):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        spec: ConvSpec = spec_of(ctx)
        wd = w.to(torch.float16).contiguous(memory_format=torch.channels_last)
        w64 = wd.double()

        def make(t):
            return lambda x: F.conv2d(x, t, None, spec.stride, spec.padding, 1, spec.groups)

        return Prepared(
            layer=make(wd), new_copy=lambda: make(wd.clone()), x_map=_to_cl(torch.float16),
            reference=lambda x: F.conv2d(x.double(), w64, None, spec.stride, spec.padding, 1, spec.groups),
            tol=TOL[torch.float16], weight_bytes=lambda: wd.numel() * 2, act_bytes=2, out_bytes=2,
        )

    return prepare


def _prep_mixgemm_conv(bits: int):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        import warnings

        from mixgemm import conv2d, quantize_conv_weight
        from mixgemm.formats.weight import QuantConfig
        from mixgemm.nn.conv import fit_conv_config

        spec: ConvSpec = ctx.notes["conv_spec"]
        # W8: per-channel; W4: --group-size, or what QuantConv2d.from_conv would use for this layer (the largest
        # group dividing Ci/groups, else per-channel)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qcfg = fit_conv_config(QuantConfig(bits=bits, group_size=-1 if bits == 8 else ctx.group_size, mode="sym"),
                                   tuple(w.shape))
        g = qcfg.group_size
        qc0 = quantize_conv_weight(w, qcfg)
        w64 = qc0.dequantize(torch.float64)

        def fresh(clone: bool):
            m = qc0.matrix
            c = (lambda t: None if t is None else t.clone()) if clone else (lambda t: t)
            mat = dataclasses.replace(m, qweight=c(m.qweight), scales=c(m.scales), zeros=c(m.zeros),
                                      offsets=c(m.offsets), _layouts=_TrackedLayouts())
            return dataclasses.replace(qc0, matrix=mat)

        first = fresh(False)

        def make(qc):
            return lambda x: conv2d(x, qc, None, spec.stride, spec.padding, 1, spec.groups)

        def weight_bytes() -> int:
            lays = first.matrix._layouts
            return sum(tensor_bytes(lays[n]) for n in sorted(lays.read)) if lays.read else first.matrix.nbytes()

        gname = "per-channel" if g == -1 else f"g{g}"
        return Prepared(
            layer=make(first), new_copy=lambda: make(fresh(True)), x_map=_to_cl(torch.float16),
            reference=lambda x: F.conv2d(x.double(), w64, None, spec.stride, spec.padding, 1, spec.groups),
            tol=TOL[torch.float16], weight_bytes=weight_bytes, act_bytes=2, out_bytes=2,
            before_call=first.matrix._layouts.read.clear, note=f"W{qcfg.bits} {gname}",
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
