"""``triton_dwconv``: the Triton depthwise conv (dwconv.py), any depthwise layer the CUDA one declines."""

from __future__ import annotations

from mixgemm.kernels.registry import OK, KernelEntry, Problem, no

NAME = "triton_dwconv"


def can_run(p: Problem):
    return OK if p.conv.depthwise else no("not depthwise (Ci / groups > 1)")


def config(p: Problem) -> None:
    return None  # the host code picks the tile; kernel_options may force a DwConfig


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton_dwconv.dwconv import dw_conv2d

    kw_ = {} if config is None else dict(block_m=config.block_m, block_c=config.block_c, num_warps=config.num_warps)
    return dw_conv2d(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, **kw_)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="Triton depthwise conv")
