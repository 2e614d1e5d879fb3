"""``cuda_gemv_a8_wg``: the fused int8-activation GEMV on the int8 GEMM's ``wgmma_a8_v1`` (gemv_a8_wg.cu; host code
gemv_a8_wg.py), sym / sym_full activations x sym weights, M <= mixgemm.tuning.A8_WG_GEMV_MAX_M (per-block activation
scales over int4 codes: to A8_WG_GEMV_BLOCK_SCALES_MAX_M on layers of up to A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS): every
such M of a weight that keeps only that layout (compacted), and on sm_90 the M above cuda_gemv_a8's range for plain
weights.
"""

from __future__ import annotations

import torch

import mixgemm.tuning as tuning
from mixgemm.kernels import int8_activations as shared
from mixgemm.kernels.layouts import WGMMA_A8_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not

NAME = "cuda_gemv_a8_wg"


def can_run(p: Problem):
    from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg

    if why := shared.symmetric_cuda_reason(p):
        return no(why)
    if p.x_dtype not in shared.X_DTYPES:
        return no(f"activation dtype {p.x_dtype}")
    if why := shared.wgmma_a8_reason(p):
        return no(why)
    if not 1 <= p.m <= gemv_a8_wg.MAX_M:
        return no(f"M={p.m} outside the kernel's 1..{gemv_a8_wg.MAX_M}")
    if not shared.nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    smem = gemv_a8_wg.smem_needed(p.qw, p.m) + 4096
    if smem > p.device.smem_optin:
        return no(f"needs {smem} bytes of shared memory, the GPU has {p.device.smem_optin} per block")
    if p.m > tuning.A8_WG_GEMV_MAX_M:
        why = _block_scales_decline(p)
        if why:
            return prefer_not(f"M={p.m} above the fused GEMV's range M <= {tuning.A8_WG_GEMV_MAX_M} {why} (tuning)")
    if p.bits == 8 and p.m > tuning.A8_GEMV_MAX_M and p.n * p.k > tuning.A8_WG_GEMV_INT8_MAX_WEIGHTS:
        return prefer_not(f"int8 weights of {p.n * p.k >> 20}M > {tuning.A8_WG_GEMV_INT8_MAX_WEIGHTS >> 20}M at "
                          f"M={p.m}: the int8 GEMM measured as fast (tuning)")
    if p.resident != "wgmma_a8_v1" and not p.device.sm90:
        return prefer_not(f"a plain weight takes it on sm_90 only (measured there), the GPU is "
                          f"sm_{p.device.capability[0]}{p.device.capability[1]}")
    return OK


def _block_scales_decline(p: Problem) -> str | None:
    """Why M above tuning.A8_WG_GEMV_MAX_M stays off the fused GEMV on wgmma_a8_v1, None where a weight with
    per-block activation scales over int4 codes keeps it (up to A8_WG_GEMV_BLOCK_SCALES_MAX_M, on layers up to
    A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS weights: the GEMMs pay a per-group fold)."""
    cap = tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS >> 20
    further = (f"(per-block activation scales over int4 codes: M <= "
               f"{tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_M} on layers of <= {cap}M weights)")
    if (p.per_token or p.bits != 4 or p.m > tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_M
            or p.n * p.k > tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS):
        return further
    return None


def config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg

    return gemv_a8_wg.config_for(p.qw.layout(WGMMA_A8_V1.name, WGMMA_A8_V1.builder), p.m, p.device.sm_count,
                                 p.per_token)


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg import complete_config

    return complete_config(forced)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg import prepare_gemv_a8_wg

    return prepare_gemv_a8_wg(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), p.x_dtype, p.per_token,
                              config, p.act_mode)


def run(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg import prepare_gemv_a8_wg

    return prepare_gemv_a8_wg(qw, p.m, x2d.dtype, x2d.device, out_dtype, p.per_token, config, p.act_mode)(
        x2d, bias, lo, hi)


ENTRY = KernelEntry(NAME, "linear_a8", can_run, config, run, WGMMA_A8_V1,
                    "fused activation-quantizing GEMV on the int8 GEMM's layout, small M", complete, prepare=prepare)
