"""``cuda_gemv_a8``: the fused int8-activation GEMV (gemv_a8.cu: the activation quantization in its prologue, dp4a),
one launch, M <= mixgemm.tuning.A8_GEMV_MAX_M, on its own layout ``a8gemv_v2`` (layout.py: per channel the plain
buffer, grouped weights a unit-ordered copy). Host code: gemv_a8.py.
"""

from __future__ import annotations

import torch

import mixgemm.tuning as tuning
from mixgemm.formats.activation import ACT_MODES
from mixgemm.kernels import int8_activations as shared
from mixgemm.kernels.layouts import A8GEMV_V2
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not

NAME = "cuda_gemv_a8"


def can_run(p: Problem):
    from mixgemm.kernels.cuda_gemv_a8 import gemv_a8

    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if p.x_dtype not in shared.X_DTYPES or p.bits not in (4, 8) or p.act_mode not in ACT_MODES:
        return no(f"activation dtype {p.x_dtype}, {p.bits}-bit weights, act_mode {p.act_mode!r}")
    if not 1 <= p.m <= gemv_a8.MAX_M:
        return no(f"M={p.m} outside the kernel's 1..{gemv_a8.MAX_M}")
    if p.group_size < 32 and not p.per_channel:
        return no(f"groups of {p.group_size}: the int8-activation kernels take groups of 32 or more")
    if not shared.nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    if p.per_channel and p.k > 65536:
        return no(f"per-channel K={p.k} > 65536 (int32 range of the unit sums)")
    if p.m > tuning.A8_GEMV_MAX_M:  # (before the shared-memory check, which builds the layout)
        return prefer_not(f"M={p.m} above the fused GEMV's range M <= {tuning.A8_GEMV_MAX_M} (tuning)")
    lay = gemv_a8.get_a8gemv_layout(p.qw)
    smem = gemv_a8.smem_bytes(lay, gemv_a8.m_bucket(p.m)) + 4096
    if smem > p.device.smem_optin:
        return no(f"needs {smem} bytes of shared memory, the GPU has {p.device.smem_optin} per block")
    return OK


def config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_gemv_a8 import gemv_a8

    lay = gemv_a8.get_a8gemv_layout(p.qw)
    return gemv_a8.config_for(lay, p.m, p.n, p.k, p.device.sm_count)


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda_gemv_a8.gemv_a8 import complete_config

    return complete_config(forced)


def run(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda_gemv_a8.gemv_a8 import gemv_a8

    return gemv_a8(x2d, qw, p.act_mode, bias, lo, hi, out_dtype, per_token=p.per_token, config=config)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_gemv_a8.gemv_a8 import prepare_gemv_a8

    # a plan's output dtype is its activation dtype (the linear ops return x.dtype)
    return prepare_gemv_a8(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), p.act_mode, p.x_dtype,
                           p.per_token, config)


ENTRY = KernelEntry(NAME, "linear_a8", can_run, config, run, A8GEMV_V2, "fused activation-quantizing GEMV, small M",
                    complete, prepare=prepare)
