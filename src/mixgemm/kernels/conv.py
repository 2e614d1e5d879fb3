"""Convolution with a block-quantized kernel: the registry's entries, in the order the dispatcher tries them.

* ``dequant_cudnn``: fp16 / bf16 on CUDA: the weight dequantized (one Triton kernel, a transient [Co, Kh*Kw*Ci_g]
  buffer) and cuDNN, where a race on the layer's first eager call (mixgemm.kernels.race) measured it faster than the
  entry below that would run it; ``kernel_options(conv_dequant_min_m=...)`` replaces the race by a threshold on
  M = B*Ho*Wo (A / B runs). Until a layer has raced (e.g. inside a CUDA-graph capture) the quantized kernel runs.
* ``cuda_dwconv`` / ``triton_dwconv``: depthwise (Ci / groups == 1): the CUDA direct conv for fp16 / bf16
  channels_last inputs with channel multiplier 1 (kernels/cuda/dwconv.cu says why), else the Triton kernel.
* ``cuda_conv_wgmma``: sm_90, fp16 / bf16 channels_last, Ci % 64 == 0, groups 1: the wgmma implicit GEMM (im2col
  TMA loads into the weight-only GEMM's pipeline), unless the GPU's conv sweep measured the layer faster below.
* ``triton_conv_smallk``: at most SMALLK_MAX_CI input channels per group and a padded K <= 256 (the 3-channel stems):
  the whole K in one tile.
* ``conv_as_matmul``: 1x1 / stride 1 / no padding / groups 1 on channels_last: mixgemm.matmul on the [B*H*W, Ci]
  view (no copy), unless the conv sweep measured the implicit GEMM faster for that layer.
* ``triton_conv_igemm``: the Triton implicit GEMM, any stride / padding / dilation / groups.

Run contract: ``run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config)`` with the
arguments checked (mixgemm.ops.conv.check_conv_inputs), M >= 1, and ``out`` the preallocated [B, Co, Ho, Wo] output
in x's memory format (the paths that produce their own output ignore it).
"""

from __future__ import annotations

import torch

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels import race
from mixgemm.kernels.conv_geometry import conv_output_size, out_format  # noqa: F401  (re-exported)
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import (
    OK,
    ConvShape,
    KernelEntry,
    Problem,
    device_info,
    no,
    prefer_not,
    register,
    triton_ok,
)


def conv_problem(x: torch.Tensor, qweight: QuantizedConvWeight, m: int, stride, padding, groups,
                 dilation=(1, 1)) -> Problem:
    q = qweight.matrix
    g, ng = q.config.groups(q.in_features)
    shape = ConvShape(qweight.in_channels_per_group, groups, tuple(qweight.kernel_size), tuple(stride),
                      tuple(padding), tuple(dilation), out_format(x) == torch.channels_last, x=x, weight=qweight)
    return Problem("conv", m, qweight.out_channels, q.in_features, x.dtype, device_info(x.device), q.bits, g, ng,
                   q.mode, conv=shape, qw=q)


def _depthwise(p: Problem):
    return OK if p.conv.depthwise else no("not depthwise (Ci / groups > 1)")


def _dw_cuda_can_run(p: Problem):
    from mixgemm.kernels.cuda.dwconv import dwconv_supported

    if not p.conv.depthwise:
        return no("not depthwise (Ci / groups > 1)")
    if not dwconv_supported(p.conv.x, p.conv.weight, p.conv.groups):
        return no("needs a CUDA fp16 / bf16 channels_last input, channel multiplier 1, even channels and strides, "
                  "int4 / int8 per-channel weights")
    return OK


def _dequant_can_run(p: Problem):
    if p.x_dtype not in (torch.float16, torch.bfloat16):
        return no(f"activation dtype {p.x_dtype} (takes float16 / bfloat16)")
    lim = current_options().conv_dequant_min_m
    if lim is not None:  # an explicit threshold (A / B runs)
        return OK if p.m >= lim else prefer_not(f"M={p.m} below conv_dequant_min_m={lim}")
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    return race.decision(p, DEQUANT, _race_key(p), p.conv.x.device, True, _routes(p))


def _race_key(p: Problem) -> tuple:
    """The race's key: the exact layer (weight, geometry, input shape and memory format), format, dtype and GPU."""
    c = p.conv
    w = c.weight
    return ("conv", p.device.name, p.device.index, w.out_channels, w.in_channels_per_group, tuple(w.kernel_size),
            p.bits, p.group_size, p.mode, c.groups, c.stride, c.padding, c.dilation, tuple(c.x.shape), p.x_dtype,
            c.channels_last_out)


def _routes(p: Problem):
    """The race's two calls on the call's own input: the rival entry's and the dequantize + cuDNN route."""

    def routes(rival):
        c = p.conv
        x, w = c.x, c.weight
        ho, wo = conv_output_size(x.shape[2], x.shape[3], w.kernel_size, c.stride, c.padding, c.dilation)
        out = torch.empty((x.shape[0], w.out_channels, ho, wo), device=x.device, dtype=x.dtype,
                          memory_format=out_format(x))
        inf = float("inf")
        args = (c.stride, c.padding, c.dilation, c.groups, -inf, inf, None)

        def rival_call():
            return rival.entry.run(x, w, None, out, *args, rival.config)

        def own_call():
            return _run_dequant(x, w, None, out, *args, None)

        return rival_call, own_call

    return routes


def _wgmma_can_run(p: Problem):
    from mixgemm.kernels.cuda.conv_wgmma import conv_wgmma_supported

    c = p.conv
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if not conv_wgmma_supported(c.x, c.weight, c.stride, c.padding, c.dilation, c.groups):
        return no("needs sm_90, fp16 / bf16 channels_last input with Ci % 64 == 0, groups 1, stride <= 8 and "
                  "padding / dilation within the im2col map's corner range")
    measured, cfg = _tuned_wgmma(p)
    if measured and cfg is None:
        return prefer_not("this GPU's conv sweep measured the layer faster on the kernels below (tuning)")
    return OK


def _tuned_wgmma(p: Problem):
    from mixgemm.kernels.triton.conv import tuned_wgmma_choice

    return tuned_wgmma_choice(torch.device(p.device.type, p.device.index), p.conv.weight, p.conv.stride, p.m)


def _wgmma_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda.conv_wgmma import conv_config
    from mixgemm.tuning import conv_table
    from mixgemm.tuning.buckets import SourcedConfig

    tuned = _tuned_wgmma(p)[1]
    cfg = conv_config(p.m, p.n, p.k, tuned)
    if tuned is None:
        return cfg
    key = conv_table.layer_key(p.conv.weight, p.conv.stride, 1, p.m)
    return SourcedConfig(cfg, conv_table.measured_on(p.device.name, key, wgmma=True))


def _smallk_can_run(p: Problem):
    from mixgemm.kernels.triton.conv_smallk import SMALLK_MAX_CI, smallk_supported

    if p.conv.ci_g > SMALLK_MAX_CI:
        return no(f"Ci / groups = {p.conv.ci_g} > {SMALLK_MAX_CI}")
    if not smallk_supported(p.conv.x, p.conv.weight, p.conv.groups):
        return no("needs groups 1 and a padded K <= 256")
    return OK


def _matmul_can_run(p: Problem):
    c = p.conv
    if not (c.kernel_size == (1, 1) and c.stride == (1, 1) and c.padding == (0, 0) and c.groups == 1):
        return no("not a 1x1 / stride 1 / no padding / groups 1 convolution")
    if not c.channels_last_out:
        return no("input not channels_last (the [B*H*W, Ci] view needs it)")
    if not triton_ok("mixgemm.kernels.triton_gemm.gemm"):
        return no("Triton unavailable")
    if p.device.is_cuda:
        from mixgemm.kernels.triton.conv import tuned_choice

        tuned = tuned_choice(torch.device(p.device.type, p.device.index), c.weight, c.stride, c.groups, p.m)
        if tuned is not None and tuned[0] != "matmul":
            return prefer_not(f"this GPU's conv sweep measured {tuned[0]} faster for the layer (tuning)")
    return OK


def _run_dw_cuda(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.cuda.dwconv import dwconv_cuda, dwconv_supported

    if not dwconv_supported(x, qweight, groups, out):
        raise ValueError("conv path 'dw_cuda' needs a CUDA fp16 / bf16 channels_last input with an even channel "
                         "count and even strides, groups == Ci == Co, and int4 / int8 per-channel weights; got "
                         f"{x.dtype} on {x.device}, strides {tuple(x.stride())}, groups={groups}, "
                         f"Co={qweight.out_channels}, group_size={qweight.matrix.group_size}")
    return dwconv_cuda(x, qweight, bias, out, stride, padding, dilation, lo, hi, config)


def _run_dw(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton import conv as K

    kw_ = {} if config is None else dict(block_m=config.block_m, block_c=config.block_c, num_warps=config.num_warps)
    return K.dw_conv2d(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, **kw_)


def _run_dequant(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    import torch.nn.functional as F

    from mixgemm.kernels.triton import conv as K

    co, (kh, kw) = qweight.out_channels, qweight.kernel_size
    fmt = out_format(x)
    wm = K.dequantize_matrix(qweight.matrix, x.dtype)  # [Co, Kh*Kw*Ci_g], K order (kh, kw, ci)
    wt = wm.view(co, kh, kw, qweight.in_channels_per_group).permute(0, 3, 1, 2)  # channels_last strides
    if fmt != torch.channels_last:
        wt = wt.contiguous()  # an NCHW weight keeps cuDNN (and the output) in NCHW
    y = F.conv2d(x, wt, None if bias is None else bias.to(x.dtype), stride, padding, dilation, groups)
    if lo > float("-inf") or hi < float("inf"):
        y = y.clamp_(lo, hi)
    return y.contiguous(memory_format=fmt)


def _run_wgmma(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.cuda.conv_wgmma import conv_wgmma

    return conv_wgmma(x, qweight, bias, stride, padding, dilation, lo, hi, config)


def _run_smallk(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton.conv_smallk import smallk_conv2d, smallk_supported

    if not smallk_supported(x, qweight, groups):
        raise ValueError(f"conv path 'smallk' needs groups 1 and a padded K <= 256, got groups={groups}, "
                         f"kernel {qweight.kernel_size}, Ci_g={qweight.in_channels_per_group}")
    return smallk_conv2d(x, qweight, bias, out, stride, padding, dilation, lo, hi, config)


# The GEMM a 1x1 conv runs through: mixgemm.matmul (its own registry entries and cached plans), in the ops layer
# above this one; mixgemm.ops.conv hands it in when imported (importing mixgemm imports it): kernels never import ops.
_gemm = None


def use_gemm(matmul) -> None:
    """Install ``matmul(x2d, qweight, bias, activation)``, the GEMM the conv_as_matmul entry runs."""
    global _gemm
    _gemm = matmul


def _run_matmul(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    if _gemm is None:
        raise RuntimeError("conv_as_matmul has no GEMM: mixgemm.ops.conv installs mixgemm.matmul (use_gemm)")
    b, _, h, w = x.shape
    co = qweight.out_channels
    # 1x1 conv on channels_last == GEMM on the [B*H*W, Ci] view (no copy); W is the [Co, Ci] matrix.
    y = _gemm(x.permute(0, 2, 3, 1).reshape(b * h * w, x.shape[1]), qweight.matrix, bias, activation)
    return y.reshape(b, h, w, co).permute(0, 3, 1, 2)


def _run_igemm(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton import conv as K

    return K.igemm_conv2d(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, config)


def _none(p: Problem) -> None:
    return None


def _dequant_config(p: Problem):
    return race.measured_config(_race_key(p)) if p.device.is_cuda and p.conv.x is not None else None


DEQUANT = "dequant_cudnn"


ENTRIES = (
    KernelEntry(DEQUANT, "conv", _dequant_can_run, _dequant_config, _run_dequant,
                doc="weight dequantized + cuDNN, where a race measured it faster"),
    KernelEntry("cuda_dwconv", "conv", _dw_cuda_can_run, _none, _run_dw_cuda, doc="CUDA depthwise conv"),
    KernelEntry("triton_dwconv", "conv", _depthwise, _none, _run_dw, doc="Triton depthwise conv"),
    KernelEntry("cuda_conv_wgmma", "conv", _wgmma_can_run, _wgmma_config, _run_wgmma, doc="wgmma implicit GEMM"),
    KernelEntry("triton_conv_smallk", "conv", _smallk_can_run, _none, _run_smallk, doc="whole-K tile, few channels"),
    KernelEntry("conv_as_matmul", "conv", _matmul_can_run, _none, _run_matmul, doc="1x1 conv as mixgemm.matmul"),
    KernelEntry("triton_conv_igemm", "conv", lambda p: OK, _none, _run_igemm, doc="Triton implicit GEMM"),
)

PATH_NAMES = {"cuda_dwconv": "dw_cuda", "triton_dwconv": "dw", "dequant_cudnn": "dequant",
              "cuda_conv_wgmma": "wgmma", "triton_conv_smallk": "smallk", "conv_as_matmul": "matmul",
              "triton_conv_igemm": "igemm"}
BY_PATH = {v: k for k, v in PATH_NAMES.items()}
register("conv", ENTRIES)
