"""``triton_conv_igemm``: the Triton implicit GEMM (igemm.py), any stride / padding / dilation / groups: the conv
list's last entry, which takes every problem."""

from __future__ import annotations

from mixgemm.kernels.registry import OK, KernelEntry, Problem

NAME = "triton_conv_igemm"


def can_run(p: Problem):
    return OK


def config(p: Problem) -> None:
    return None  # the host code picks the tile (igemm.default_config: the conv sweep's entry, else its rule)


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton_conv_igemm.igemm import igemm_conv2d

    return igemm_conv2d(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, config)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="Triton implicit GEMM")
