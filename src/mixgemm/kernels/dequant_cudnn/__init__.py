"""``dequant_cudnn``: a conv run as dequantize-then-cuDNN (fp16 / bf16 on CUDA), where that measures faster.

The weight is dequantized by one Triton kernel (dequant.py) into a transient [Co, Kh*Kw*Ci_g] buffer and cuDNN
convolves it, where a race on the layer's first eager call (mixgemm.kernels.race) measured it faster than the entry
below that would run it; ``kernel_options(conv_dequant_min_m=...)`` replaces the race by a threshold on M = B*Ho*Wo
(A / B runs). Until a layer has raced (e.g. inside a CUDA-graph capture) the quantized kernel runs.
"""

from __future__ import annotations

import torch

from mixgemm.kernels import race
from mixgemm.kernels.conv_geometry import conv_race_key, conv_race_routes, out_format
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not

NAME = "dequant_cudnn"


def can_run(p: Problem):
    if p.x_dtype not in (torch.float16, torch.bfloat16):
        return no(f"activation dtype {p.x_dtype} (takes float16 / bfloat16)")
    lim = current_options().conv_dequant_min_m
    if lim is not None:  # an explicit threshold (A / B runs)
        return OK if p.m >= lim else prefer_not(f"M={p.m} below conv_dequant_min_m={lim}")
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    return race.decision(p, NAME, race_key(p), p.conv.x.device, True, conv_race_routes(p, run))


def race_key(p: Problem) -> tuple:
    """The race's key (conv_geometry.conv_race_key): the exact layer, format, dtype and GPU."""
    return conv_race_key(p, NAME)


def config(p: Problem):
    return race.measured_config(race_key(p)) if p.device.is_cuda and p.conv.x is not None else None


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    import torch.nn.functional as F

    from mixgemm.kernels.dequant_cudnn.dequant import dequantize_matrix

    co, (kh, kw) = qweight.out_channels, qweight.kernel_size
    fmt = out_format(x)
    wm = dequantize_matrix(qweight.matrix, x.dtype)  # [Co, Kh*Kw*Ci_g], K order (kh, kw, ci)
    wt = wm.view(co, kh, kw, qweight.in_channels_per_group).permute(0, 3, 1, 2)  # channels_last strides
    if fmt != torch.channels_last:
        wt = wt.contiguous()  # an NCHW weight keeps cuDNN (and the output) in NCHW
    y = F.conv2d(x, wt, None if bias is None else bias.to(x.dtype), stride, padding, dilation, groups)
    if lo > float("-inf") or hi < float("inf"):
        y = y.clamp_(lo, hi)
    return y.contiguous(memory_format=fmt)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run,
                    doc="weight dequantized + cuDNN, where a race measured it faster")
