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

from mixgemm.bench.methods import (
    TOL,
    Context,
    Method,
    Prepared,
    Refused,
    _dtype_name,
    _module_unavailable,
    _TrackedLayouts,
    tensor_bytes,
)


def _hw(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


@dataclass(frozen=True)
class ConvSpec:
    """One conv layer: an int where height and width agree, else (h, w) pairs."""

    name: str
    ci: int
    co: int
    k: int | tuple[int, int]  # kernel Kh x Kw
    stride: int | tuple[int, int]
    hw: int | tuple[int, int]  # input H x W
    pad: int | tuple[int, int] | None = None  # default: dilation * (k // 2) per side ("same" for odd kernels)
    groups: int = 1  # groups == ci == co: depthwise
    dilation: int | tuple[int, int] = 1

    def __post_init__(self):
        if self.ci % self.groups or self.co % self.groups:
            raise ValueError(f"conv layer {self.name!r}: groups={self.groups} must divide ci={self.ci} and "
                             f"co={self.co}")
        if min(*self.out_size, *self.kernel_hw, *self.stride_hw, *self.dilation_hw) < 1 or min(self.pad_hw) < 0:
            raise ValueError(f"conv layer {self.name!r}: kernel {self.kernel_hw}, stride {self.stride_hw}, padding "
                             f"{self.pad_hw}, dilation {self.dilation_hw} on {self.in_hw} give no output")

    @property
    def kernel_hw(self) -> tuple[int, int]:
        return _hw(self.k)

    @property
    def stride_hw(self) -> tuple[int, int]:
        return _hw(self.stride)

    @property
    def dilation_hw(self) -> tuple[int, int]:
        return _hw(self.dilation)

    @property
    def in_hw(self) -> tuple[int, int]:
        return _hw(self.hw)

    @property
    def pad_hw(self) -> tuple[int, int]:
        if self.pad is None:
            return tuple(d * (k // 2) for k, d in zip(self.kernel_hw, self.dilation_hw, strict=True))
        return _hw(self.pad)

    @property
    def padding(self) -> int:
        """The padding of a layer padded alike on both axes (the tools' square layers)."""
        ph, pw = self.pad_hw
        if ph != pw:
            raise ValueError(f"conv layer {self.name!r} pads {ph} x {pw}: use pad_hw")
        return ph

    @property
    def out_size(self) -> tuple[int, int]:
        """(Ho, Wo)."""
        return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, p, d, k, s in
                     zip(self.in_hw, self.pad_hw, self.dilation_hw, self.kernel_hw, self.stride_hw, strict=True))

    @property
    def out_hw(self) -> int:
        """Ho of a layer with a square output (the tools' square layers)."""
        ho, wo = self.out_size
        if ho != wo:
            raise ValueError(f"conv layer {self.name!r} outputs {ho} x {wo}: use out_size")
        return ho

    def gemm_dims(self, batch: int) -> tuple[int, int, int]:
        """(M, K, N) of the implicit GEMM."""
        kh, kw = self.kernel_hw
        ho, wo = self.out_size
        return batch * ho * wo, self.ci // self.groups * kh * kw, self.co

    def conv(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """F.conv2d of this layer's geometry (no bias)."""
        return F.conv2d(x, w, None, self.stride_hw, self.pad_hw, self.dilation_hw, self.groups)

    def weight(self, seed: int, device) -> torch.Tensor:
        kh, kw = self.kernel_hw
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + self.ci * 31 + self.co * 7 + kh + 13 * (kw - kh))
        return torch.randn(self.co, self.ci // self.groups, kh, kw, generator=gen, device=device) * 0.02

    def x(self, batch: int, seed: int, device) -> torch.Tensor:
        h, w = self.in_hw
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + batch * 17 + h + 7 * (w - h))
        return torch.randn(batch, self.ci, h, w, generator=gen, device=device)


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


def conv_baseline(dtype: torch.dtype = torch.float16, device: str = "cuda") -> str:
    """The float conv every conv case is compared with: cuDNN on a GPU, PyTorch's CPU conv on the CPU."""
    tag = _dtype_name(dtype)
    return f"cuDNN {tag} conv" if device == "cuda" else f"torch {tag} conv (CPU)"


CONV_BASELINE = conv_baseline()
CONV_BASELINES = frozenset(conv_baseline(dt, dev) for dt in (torch.float16, torch.bfloat16, torch.float32)
                           for dev in ("cuda", "cpu"))


def _prep_float(w: torch.Tensor, ctx: Context) -> Prepared:
    spec: ConvSpec = ctx.notes["conv_spec"]
    wd = w.to(ctx.dtype).contiguous(memory_format=torch.channels_last)
    w64 = wd.double()
    es = wd.element_size()

    def make(t):
        return lambda x: spec.conv(x, t)

    return Prepared(
        layer=make(wd), new_copy=lambda: make(wd.clone()),
        x_map=_to_cl(ctx.dtype), reference=lambda x: spec.conv(x.double(), w64), tol=TOL[ctx.dtype],
        weight_bytes=lambda: wd.numel() * es, act_bytes=es, out_bytes=es,
        compute="fp32" if ctx.dtype == torch.float32 else "fp16",
    )


def preset_config(bits: int, shape: tuple, ctx: Context):
    """--conv's formats: W8 per-channel; W4 sym at --group-size, or what QuantConv2d.from_conv would use for this
    layer (the largest group dividing Ci/groups, else per-channel)."""
    import warnings

    from mixgemm.formats.weight import QuantConfig
    from mixgemm.nn.conv import fit_conv_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_conv_config(QuantConfig(bits=bits, group_size=-1 if bits == 8 else ctx.group_size, mode="sym"),
                               shape)


MODELS_W4_GROUP = 32


def models_config(bits: int, shape: tuple, ctx: Context):
    """--conv-models' formats (issue 109's acceptance): W4 zero point in groups of 32 where Ci/groups allows, else
    per-channel; W8 sym per-channel. A layer the format cannot hold is refused (Refused), not stored otherwise."""
    from mixgemm.formats.weight import QuantConfig
    from mixgemm.nn.conv import fit_conv_config

    ci_g = shape[1]
    if bits == 4:
        cfg = QuantConfig(bits=4, group_size=MODELS_W4_GROUP if ci_g % MODELS_W4_GROUP == 0 else -1,
                          mode="zero_point")
    else:
        cfg = QuantConfig(bits=8, group_size=-1, mode="sym")
    try:
        return fit_conv_config(cfg, shape, strict=True)
    except ValueError as e:
        raise Refused(str(e)) from None


def _prep_mixgemm_conv(bits: int, config_of, dequant_cudnn: bool = False):
    """mixgemm.conv2d with the weight quantized as config_of(bits, weight shape, ctx) says; dequant_cudnn: every call
    forced onto the dequantize + cuDNN route."""

    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        import mixgemm
        from mixgemm import conv2d, quantize_conv_weight

        spec: ConvSpec = ctx.notes["conv_spec"]
        qcfg = config_of(bits, tuple(w.shape), ctx)
        qc0 = quantize_conv_weight(w, qcfg)
        w64 = qc0.dequantize(torch.float64)
        geo = (spec.stride_hw, spec.pad_hw, spec.dilation_hw, spec.groups)

        def fresh(clone: bool):
            m = qc0.matrix
            c = (lambda t: None if t is None else t.clone()) if clone else (lambda t: t)
            mat = dataclasses.replace(m, qweight=c(m.qweight), scales=c(m.scales), zeros=c(m.zeros),
                                      offsets=c(m.offsets), _layouts=_TrackedLayouts())
            return dataclasses.replace(qc0, matrix=mat)

        first = fresh(False)

        def make(qc):
            if not dequant_cudnn:
                return lambda x: conv2d(x, qc, None, *geo)

            def forced(x):
                # conv_dequant_min_m=0: the route taken without its race (a race under force would time the route
                # against itself: mixgemm.kernels.conv._race keeps the options' force)
                with mixgemm.kernel_options(force=DEQUANT_ENTRY, conv_dequant_min_m=0):
                    return conv2d(x, qc, None, *geo)

            return forced

        def weight_bytes() -> int:
            lays = first.matrix._layouts
            return sum(tensor_bytes(lays[n]) for n in sorted(lays.read)) if lays.read else first.matrix.nbytes()

        gname = "per-channel" if qcfg.group_size == -1 else f"g{qcfg.group_size}"
        mode = "" if qcfg.mode == "sym" else f" {qcfg.mode}"
        return Prepared(
            layer=make(first), new_copy=lambda: make(fresh(True)), x_map=_to_cl(ctx.dtype),
            reference=lambda x: spec.conv(x.double(), w64), tol=TOL[ctx.dtype], weight_bytes=weight_bytes,
            act_bytes=ctx.dtype.itemsize, out_bytes=ctx.dtype.itemsize,
            compute="fp32" if ctx.dtype == torch.float32 else "fp16",
            before_call=first.matrix._layouts.read.clear, note=f"W{qcfg.bits} {gname}{mode}",
            chosen=None if dequant_cudnn else lambda x: mixgemm.explain_conv(x, first, *geo).kernel,
        )

    return prepare


def _gpu(ctx: Context) -> str | None:
    return None if ctx.device.type == "cuda" else "needs a CUDA GPU"


_CONV_MODULES = _module_unavailable("mixgemm.ops.conv", "mixgemm.kernels.triton_conv_igemm.igemm")
DEQUANT_ENTRY = "dequant_cudnn"
W4_ZP = "mixgemm conv W4A16 zp"
W8 = "mixgemm conv W8A16"
W4_ZP_DEQUANT = "mixgemm conv W4A16 zp dequant+cuDNN"
W8_DEQUANT = "mixgemm conv W8A16 dequant+cuDNN"


def _float_method(dtype: torch.dtype, device: str) -> Method:
    return Method(conv_baseline(dtype, device), "peer", _prep_float, kind="conv", cpu=True,
                  unavailable=lambda ctx: None if ctx.device.type == device else f"the {device} baseline",
                  description=f"F.conv2d {_dtype_name(dtype)} channels_last"
                              + (" (cuDNN)" if device == "cuda" else " (PyTorch's CPU conv)"))


def conv_methods(dtype: torch.dtype = torch.float16, device: str = "cuda") -> list[Method]:
    """--conv's methods: mixgemm.conv2d W4 / W8 (preset_config) and the float conv."""
    return [
        Method("mixgemm conv W4A16", "mixgemm", _prep_mixgemm_conv(4, preset_config), _CONV_MODULES, kind="conv",
               description="mixgemm.conv2d, W4 sym (group = --group-size, or the largest dividing Ci)"),
        Method(W8, "mixgemm", _prep_mixgemm_conv(8, preset_config), _CONV_MODULES, kind="conv",
               description="mixgemm.conv2d, W8 sym per-channel"),
        _float_method(dtype, device),
    ]


def conv_models_methods(dtype: torch.dtype = torch.float16, device: str = "cuda") -> list[Method]:
    """--conv-models' methods: mixgemm.conv2d W4 zp g32 / W8 per-channel as dispatched (the dequantize + cuDNN
    route raced on the first call), the same with that route forced, and the float conv. On the CPU the dispatched
    ones run mixgemm's CPU path."""
    return [
        Method(W4_ZP, "mixgemm", _prep_mixgemm_conv(4, models_config), _CONV_MODULES, kind="conv", cpu=True,
               description=f"mixgemm.conv2d, W4 zero point g{MODELS_W4_GROUP} (per-channel where Ci/groups is no "
                           "multiple), as dispatched"),
        Method(W8, "mixgemm", _prep_mixgemm_conv(8, models_config), _CONV_MODULES, kind="conv", cpu=True,
               description="mixgemm.conv2d, W8 sym per-channel, as dispatched"),
        Method(W4_ZP_DEQUANT, "mixgemm", _prep_mixgemm_conv(4, models_config, dequant_cudnn=True), _gpu, kind="conv",
               description=f"{W4_ZP} under kernel_options(force='{DEQUANT_ENTRY}'): the weight dequantized, cuDNN"),
        Method(W8_DEQUANT, "mixgemm", _prep_mixgemm_conv(8, models_config, dequant_cudnn=True), _gpu, kind="conv",
               description=f"{W8} under kernel_options(force='{DEQUANT_ENTRY}'): the weight dequantized, cuDNN"),
        _float_method(dtype, device),
    ]
