"""mixgemm.conv2d: convolution with a block-quantized kernel.

CUDA dispatch: the registry's conv entries (mixgemm.kernels.conv lists them in order, with when each applies;
``mixgemm.explain_conv`` says which runs and why the earlier ones declined), deterministic in shapes and dtypes.
CPU inputs run the float64 reference (mixgemm.reference.conv2d).
``conv2d_a8``: the INT8-activation variant (activations quantized per pixel and channel block, int8 tensor cores).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm import reference
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.conv_as_matmul import use_gemm
from mixgemm.kernels.conv_geometry import conv_output_size
from mixgemm.kernels.conv_geometry import out_format as _out_format
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import KernelEntry
from mixgemm.ops.dispatch import kept_plan
from mixgemm.ops.matmul import matmul

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
use_gemm(matmul)  # a 1x1 conv's registry entry (conv_as_matmul) runs the GEMM through mixgemm.matmul


def _pair(v, name: str) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return (int(v[0]), int(v[1]))
    raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}")


def check_conv_inputs(x, qweight, bias, stride, padding, dilation, groups):
    """Validate and normalise the arguments; returns (stride, padding, dilation) as int pairs."""
    if not isinstance(qweight, QuantizedConvWeight):
        raise TypeError(f"qweight must be a mixgemm QuantizedConvWeight, got {type(qweight).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; supported activation dtypes are {ACT_DTYPES}")
    if x.dim() != 4:
        raise ValueError(f"conv2d input must be 4-D [B, C, H, W], got shape {tuple(x.shape)}")
    stride, padding, dilation = (
        _pair(stride, "stride"),
        _pair(padding, "padding"),
        _pair(dilation, "dilation"),
    )
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(f"need stride >= 1, dilation >= 1, padding >= 0; got {stride}, {dilation}, {padding}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if x.shape[1] != qweight.in_channels_per_group * groups:
        raise ValueError(
            f"shape mismatch: input has {x.shape[1]} channels, the weight expects "
            f"{qweight.in_channels_per_group} x groups={groups}"
        )
    if qweight.out_channels % groups:
        raise ValueError(f"out_channels={qweight.out_channels} is not divisible by groups={groups}")
    if x.device != qweight.matrix.device:
        raise ValueError(f"device mismatch: x is on {x.device} but the weight is on {qweight.matrix.device}")
    ho, wo = conv_output_size(x.shape[2], x.shape[3], qweight.kernel_size, stride, padding, dilation)
    if ho < 1 or wo < 1:
        raise ValueError(
            f"input {tuple(x.shape[2:])} is too small for kernel {qweight.kernel_size} with "
            f"padding {padding}, "
            f"dilation {dilation}: output would be {ho}x{wo}"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (qweight.out_channels,):
            got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({qweight.out_channels},), got {got}")
        if not bias.is_floating_point():
            raise TypeError(f"bias must be floating point, got {bias.dtype}")
        if bias.device != x.device:
            raise ValueError(f"device mismatch: bias is on {bias.device} but x is on {x.device}")
    return stride, padding, dilation


def conv2d(
    x: torch.Tensor,
    qweight: QuantizedConvWeight,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    activation: str | None = None,
) -> torch.Tensor:
    """y = act(conv2d(x, W) + bias) with W block-quantized (INT4/INT8).

    x: float16 / bfloat16 / float32 [B, Ci, H, W], NCHW or channels_last (any strides), on qweight's device.
    qweight: QuantizedConvWeight [Co, Ci/groups, Kh, Kw] (see mixgemm.formats.conv).
    bias: float [Co] or None. stride / padding / dilation: int or (h, w). groups: Ci and Co divisible by it.
    activation: None, "relu" or "relu6" (fused as a min/max clamp).
    Returns [B, Co, Ho, Wo] in x's dtype and memory format (channels_last in -> channels_last out).
    CUDA: fp32 accumulation; fp32 inputs use exact fp32 products. Depthwise (Ci/groups == 1) needs
    per-channel weights (the only grouping QuantizedConvWeight allows there). Inputs are never modified.
    """
    stride, padding, dilation = check_conv_inputs(x, qweight, bias, stride, padding, dilation, groups)
    lo, hi = clamp_bounds(activation)
    if x.device.type != "cuda":
        return reference.conv2d(x, qweight, bias, stride, padding, dilation, groups, activation)
    return cuda_conv2d(x, qweight, bias, stride, padding, dilation, groups, lo, hi, activation)


def conv_choice(x: torch.Tensor, qweight: QuantizedConvWeight, m: int, stride, padding, groups, dilation=(1, 1)):
    """The registry's choice (mixgemm.kernels.conv) for this convolution: entry, config, declined entries."""
    from mixgemm.kernels.conv_geometry import conv_problem
    from mixgemm.kernels.registry import choose

    return choose(conv_problem(x, qweight, m, stride, padding, groups, dilation))


@dataclass(frozen=True)
class ConvPlan:
    """A layer's cached choice for one input signature: the entry, the config it is handed, and the entry's prepared
    launch where it makes one (KernelEntry.prepare: launch(x, bias, lo, hi) -> y)."""

    entry: KernelEntry
    config: object
    launch: object = None


def _plan_key(x: torch.Tensor, stride, padding, groups, dilation) -> tuple:
    # the input's strides carry its memory format; the geometry is in the key because a weight object may serve
    # calls of several geometries (functional mixgemm.conv2d)
    # (and its address modulo 16: the TMA and vector kernels' alignment conditions)
    return ("conv", tuple(x.shape), x.stride(), x.data_ptr() % 16, x.dtype, x.get_device(), tuple(stride),
            tuple(padding), groups, tuple(dilation))


def planned_conv_choice(x: torch.Tensor, qweight: QuantizedConvWeight, m: int, stride, padding, groups,
                        dilation) -> ConvPlan:
    """The registry's choice for this call, made once per input signature and kept on the weight's plan table
    (mixgemm.ops.dispatch.kept_plan): the registry's can_run walk, its tuning lookups and the float route's race
    decision cost far more host time than a small conv's launch. Not kept under non-default kernel options or
    during CUDA-graph capture. The plan holds neither x nor the weight (ConvShape does: a reference cycle, and x
    kept alive)."""
    if not current_options().is_default:
        c = conv_choice(x, qweight, m, stride, padding, groups, dilation)
        return ConvPlan(c.entry, c.config)

    def make() -> ConvPlan:
        c = conv_choice(x, qweight, m, stride, padding, groups, dilation)
        launch = c.entry.prepare(c.problem, qweight, c.config) if c.entry.prepare is not None and x.is_cuda else None
        return ConvPlan(c.entry, c.config, launch)

    return kept_plan(qweight.matrix, _plan_key(x, stride, padding, groups, dilation), make)


def pick_path(x: torch.Tensor, qweight: QuantizedConvWeight, m: int, stride, padding, groups,
              dilation=(1, 1)) -> str:
    """ "dequant" (weight dequantized once + cuDNN), "wgmma" (the Hopper wgmma implicit GEMM), "matmul" (1x1 as a
    GEMM), "dw" / "dw_cuda" (depthwise kernels: Triton / CUDA), "smallk" (whole-K tile for a few input channels) or
    "igemm" (Triton implicit GEMM): the path name of the registry's choice. Deterministic in the shapes and
    dtypes, except "dequant" on the GPU, which a timed race against the quantized kernel decides."""
    from mixgemm.kernels.conv import PATH_NAMES

    return PATH_NAMES[conv_choice(x, qweight, m, stride, padding, groups, dilation).kernel]


def cuda_conv2d(
    x, qweight, bias, stride, padding, dilation, groups, lo, hi, activation=None, config=None, path: str | None = None
):
    """The CUDA conv (also runs on CPU tensors under TRITON_INTERPRET=1, for tests). Arguments already checked.
    config: a triton_conv_igemm ConvConfig (implicit GEMM) or triton_dwconv DwConfig (depthwise) forcing that kernel's
    tiles, a conv_smallk.SmallKConfig (path "smallk"), a cuda.dwconv.DwCudaConfig (path "dw_cuda"), or a dict of wgmma
    tiles (path "wgmma"); path: force "igemm" / "dw" / "dw_cuda" / "smallk" / "matmul" / "dequant" / "wgmma" (default:
    pick_path)."""
    from mixgemm.kernels.conv import BY_PATH
    from mixgemm.kernels.registry import entry

    b, _, h, w = x.shape
    co = qweight.out_channels
    ho, wo = conv_output_size(h, w, qweight.kernel_size, stride, padding, dilation)
    fmt = _out_format(x)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # a copy: the caller's tensor is untouched
    if b * ho * wo == 0 or co == 0:  # empty batch / output: no path choice (its tables index by M) and no launch
        return torch.empty((b, co, ho, wo), device=x.device, dtype=x.dtype, memory_format=fmt)
    if path is None and config is not None:  # a kernel config names its kernel
        from mixgemm.kernels.cuda_dwconv.dwconv import DwCudaConfig
        from mixgemm.kernels.triton_conv_smallk.conv_smallk import SmallKConfig

        depthwise = qweight.in_channels_per_group == 1 and groups > 1
        path = ("smallk" if isinstance(config, SmallKConfig) else "dw_cuda" if isinstance(config, DwCudaConfig)
                else "dw" if depthwise else "igemm")
    if path is None:
        plan = planned_conv_choice(x, qweight, b * ho * wo, stride, padding, groups, dilation)
        if plan.launch is not None:
            return plan.launch(x, bias, lo, hi)
        ent, config = plan.entry, plan.config
    elif path in BY_PATH:
        ent = entry(BY_PATH[path])
    else:
        raise ValueError(f"unknown conv path {path!r}")
    out = torch.empty((b, co, ho, wo), device=x.device, dtype=x.dtype, memory_format=fmt)
    return ent.run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config)


# ------------------------------------------------------------------------------------------- INT8 activations
def _a8_act_block(qweight: QuantizedConvWeight, act_block: int | None) -> int:
    ci_g = qweight.in_channels_per_group
    if act_block is None:
        g = qweight.matrix.group_size  # the effective group: K for per-channel weights
        act_block = g if g < ci_g else ci_g  # the weight's group, else per pixel and conv group
    if not isinstance(act_block, int) or isinstance(act_block, bool) or act_block <= 0 or ci_g % act_block:
        raise ValueError(f"act_block_size={act_block!r} must be a positive divisor of Ci/groups={ci_g}")
    return act_block


def _a8_view(x: torch.Tensor) -> torch.Tensor:
    """x [B, Ci, H, W] -> its channels_last [B*H*W, Ci] view (a copy only when x is not channels_last)."""
    b, c, h, w = x.shape
    xc = x.contiguous(memory_format=torch.channels_last)
    return xc.permute(0, 2, 3, 1).reshape(b * h * w, c)


def conv2d_a8(
    x: torch.Tensor,
    qweight: QuantizedConvWeight,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    activation: str | None = None,
    act_block_size: int | None = None,
    act_mode: str = "sym",
) -> torch.Tensor:
    """conv2d with INT8-quantized activations and block-quantized INT4/INT8 weights (W8A8 / W4A8 conv).

    The input is quantized per input pixel and per block of ``act_block_size`` channels (default: the weight's
    group size, or Ci/groups for per-channel weights; it must divide Ci/groups), ``act_mode`` "sym" (q8_1) or
    "asym" (min / max with an offset), exactly as mixgemm.formats.activation.quantize_activation does on the
    channels_last [B*H*W, Ci] view; the convolution then runs int8 x int8 -> int32 on tensor cores with the
    per-block scales folded in fp32 (kernels/triton/conv_int8.py). x: fp16 / bf16 / fp32 [B, Ci, H, W]
    (NCHW inputs are copied to channels_last for the quantization). Depthwise (Ci/groups == 1) is not supported.
    Output: x's dtype and memory format. CPU: float64 reference on the same quantized activations.
    """
    from mixgemm.formats.activation import ACT_MODES

    stride, padding, dilation = check_conv_inputs(x, qweight, bias, stride, padding, dilation, groups)
    lo, hi = clamp_bounds(activation)
    if act_mode not in ACT_MODES:
        raise ValueError(f"act_mode must be one of {ACT_MODES}, got {act_mode!r}")
    ab = _a8_act_block(qweight, act_block_size)
    if qweight.in_channels_per_group == 1:
        raise ValueError("conv2d_a8: depthwise convolution (Ci/groups == 1) has no int8 GEMM; use mixgemm.conv2d")
    if x.device.type != "cuda":
        return conv2d_a8_reference(x, qweight, bias, stride, padding, dilation, groups, activation, ab, act_mode)
    return cuda_conv2d_a8(x, qweight, bias, stride, padding, dilation, groups, lo, hi, ab, act_mode)


def conv2d_a8_reference(x, qweight, bias, stride, padding, dilation, groups, activation, act_block, act_mode):
    """float64 oracle: quantize_activation on the channels_last [B*H*W, Ci] view, dequantize, conv in float64."""
    from mixgemm.formats.activation import quantize_activation

    b, c, h, w = x.shape
    qa = quantize_activation(_a8_view(x), act_block, act_mode)
    xd = qa.dequantize().reshape(b, h, w, c).permute(0, 3, 1, 2)  # float64, channels_last strides
    if _out_format(x) != torch.channels_last:
        xd = xd.contiguous()
    return reference.conv2d(xd, qweight, bias, stride, padding, dilation, groups, activation, out_dtype=x.dtype)


def a8_fold_ok(qweight: QuantizedConvWeight, act_block: int) -> bool:
    """Whether the int8 kernel runs this format: the fold length (kernels/triton/conv_int8.fold_length) must be
    a multiple of 32 (the int8 tensor-core K step)."""
    from mixgemm.kernels.triton.conv_int8 import fold_length

    ci_g = qweight.in_channels_per_group
    kh, kw = qweight.kernel_size
    return fold_length(ci_g, kh * kw * ci_g, qweight.matrix.group_size, act_block) % 32 == 0


def cuda_conv2d_a8(x, qweight, bias, stride, padding, dilation, groups, lo, hi, act_block, act_mode, config=None):
    """The CUDA INT8-activation conv (also runs on CPU tensors under TRITON_INTERPRET=1). Arguments checked."""
    from mixgemm.kernels.triton.act_quant import act_quant
    from mixgemm.kernels.triton.conv_int8 import igemm_conv2d_a8

    if not a8_fold_ok(qweight, act_block):
        raise ValueError(
            f"conv2d_a8: Ci/groups={qweight.in_channels_per_group}, weight group {qweight.matrix.group_size} and "
            f"act_block_size={act_block} leave a constant-scale run that is not a multiple of 32 channels"
        )
    b, _, h, w = x.shape
    co = qweight.out_channels
    ho, wo = conv_output_size(h, w, qweight.kernel_size, stride, padding, dilation)
    fmt = _out_format(x)
    out = torch.empty((b, co, ho, wo), device=x.device, dtype=x.dtype, memory_format=fmt)
    if out.numel() == 0:
        return out
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    qa, sa, oa, _ = act_quant(_a8_view(x), act_block, act_mode)
    return igemm_conv2d_a8(
        qa, sa, oa, act_block, act_mode == "asym", (h, w), qweight, bias, out, stride, padding, dilation, groups,
        lo, hi, config,
    )
