"""``triton_conv_smallk``: at most SMALLK_MAX_CI input channels per group and a padded K <= 256 (the 3-channel stems):
the whole K in one tile (conv_smallk.py)."""

from __future__ import annotations

from mixgemm.kernels.registry import OK, KernelEntry, Problem, no

NAME = "triton_conv_smallk"


def can_run(p: Problem):
    from mixgemm.kernels.triton_conv_smallk.conv_smallk import SMALLK_MAX_CI, smallk_supported

    if p.conv.ci_g > SMALLK_MAX_CI:
        return no(f"Ci / groups = {p.conv.ci_g} > {SMALLK_MAX_CI}")
    if not smallk_supported(p.conv.x, p.conv.weight, p.conv.groups):
        return no("needs groups 1 and a padded K <= 256")
    return OK


def config(p: Problem) -> None:
    return None  # the host code picks the tile (default_smallk_config); kernel_options may force a SmallKConfig


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.triton_conv_smallk.conv_smallk import smallk_conv2d, smallk_supported

    if not smallk_supported(x, qweight, groups):
        raise ValueError(f"conv path 'smallk' needs groups 1 and a padded K <= 256, got groups={groups}, "
                         f"kernel {qweight.kernel_size}, Ci_g={qweight.in_channels_per_group}")
    return smallk_conv2d(x, qweight, bias, out, stride, padding, dilation, lo, hi, config)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="whole-K tile, few channels")
