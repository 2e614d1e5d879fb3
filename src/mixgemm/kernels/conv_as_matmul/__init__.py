"""``conv_as_matmul``: a 1x1 / stride 1 / no padding / groups 1 conv on channels_last runs mixgemm.matmul on the
[B*H*W, Ci] view (no copy), where a race on the layer's first eager call (mixgemm.kernels.race) measured it faster than
the entry below that would run it (an implicit GEMM). Until a layer has raced (e.g. inside a CUDA-graph capture) that
entry runs. Why a race, not a rule: the layer is a GEMM both ways, and which of the linear op's choice (its own tiles,
splits and races) and the conv kernel's tile is faster moves with the pixels and the channels."""

from __future__ import annotations

from mixgemm.kernels import race
from mixgemm.kernels.conv_geometry import conv_race_key, conv_race_routes
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, triton_ok

NAME = "conv_as_matmul"


def can_run(p: Problem):
    c = p.conv
    if not (c.kernel_size == (1, 1) and c.stride == (1, 1) and c.padding == (0, 0) and c.groups == 1):
        return no("not a 1x1 / stride 1 / no padding / groups 1 convolution")
    if not c.channels_last_out:
        return no("input not channels_last (the [B*H*W, Ci] view needs it)")
    if not triton_ok("mixgemm.kernels.triton_gemm.gemm"):
        return no("Triton unavailable")
    if p.device.is_cuda:
        return race.decision(p, NAME, conv_race_key(p, NAME), c.x.device, True, conv_race_routes(p, run))
    return OK


def config(p: Problem):
    """None: mixgemm.matmul makes its own choice (its registry entries and cached plans); a raced layer's times as
    the source explain prints."""
    if p.device.is_cuda and p.conv.x is not None:
        return race.measured_config(conv_race_key(p, NAME))
    return None


# The GEMM a 1x1 conv runs through: mixgemm.matmul (its own registry entries and cached plans), in the ops layer
# above this one; mixgemm.ops.conv hands it in when imported (importing mixgemm imports it): kernels never import ops.
_gemm = None


def use_gemm(matmul) -> None:
    """Install ``matmul(x2d, qweight, bias, activation)``, the GEMM this entry runs."""
    global _gemm
    _gemm = matmul


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    if _gemm is None:
        raise RuntimeError("conv_as_matmul has no GEMM: mixgemm.ops.conv installs mixgemm.matmul (use_gemm)")
    b, _, h, w = x.shape
    co = qweight.out_channels
    # 1x1 conv on channels_last == GEMM on the [B*H*W, Ci] view (no copy); W is the [Co, Ci] matrix.
    y = _gemm(x.permute(0, 2, 3, 1).reshape(b * h * w, x.shape[1]), qweight.matrix, bias, activation)
    return y.reshape(b, h, w, co).permute(0, 3, 1, 2)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="1x1 conv as mixgemm.matmul")
