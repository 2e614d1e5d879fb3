"""``triton_gemm``: the Triton tensor-core GEMM (gemm.py), any M, any GPU and activation dtype (and the CPU under
TRITON_INTERPRET=1), on its own layout triton_gemm_v1_ks16 (layout.py).

Run contract (mixgemm.kernels.linear): ``run(x2d, qw, bias, lo, hi, config) -> [M, N]``; the caller gathers an
act-order layer's x first.
"""

from __future__ import annotations

import mixgemm.tuning as tuning
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import TRITON_GEMM_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, triton_ok


# ----------------------------------------------------------------------------------------------- Triton GEMM
def can_run(p: Problem):
    if not common.triton_device_ok(p):
        return no("needs a CUDA device (or TRITON_INTERPRET=1)")
    if p.bits not in (4, 8):
        return no(f"{p.bits}-bit weights")
    if not triton_ok("mixgemm.kernels.triton_gemm.gemm"):
        return no("Triton unavailable")
    return OK


def choose_config(p: Problem) -> dict:
    from mixgemm.kernels.triton_gemm.gemm import auto_split, default_config

    sms = p.device.sm_count
    cfg = tuning.table_entry(p.device.table, "gemm", p.m, p.n, p.k, p.qw)
    if cfg is None:
        return default_config(p.m, p.n, p.k, p.bits, p.per_channel, sms)
    if cfg.get("SPLIT_K", "auto") == "auto":
        cfg["SPLIT_K"] = auto_split(p.m, p.n, p.k, cfg, sms, p.bits)
    return cfg


def candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.triton_gemm.gemm import auto_split, tile_error

    base = choose_config(p)

    def resplit(cfg: dict) -> dict:
        return {**cfg, "SPLIT_K": auto_split(p.m, p.n, p.k, cfg, p.device.sm_count, p.bits)}

    tiles = [resplit({**base, "BM": v}) for v in common.pow2_neighbours(int(base["BM"]), 16, 128)]
    tiles += [resplit({**base, "BN": v}) for v in common.pow2_neighbours(int(base["BN"]), 32, 256)]
    out = [c for c in tiles if tile_error(c) is None]
    axes = {"num_stages": (2, 3, 4), "num_warps": (4, 8), "SPLIT_K": (1, 2, 4)}
    return out + [c for c in common.one_axis_variants(base, axes, lambda c: tile_error(c) is None) if c not in out]


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.triton_gemm.config import TritonGemmConfig

    return TritonGemmConfig.short_keys(forced)


def run(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.triton_gemm.gemm import gemm

    return gemm(x2d, qw, bias, lo, hi, config)


ENTRY = KernelEntry("triton_gemm", "linear", can_run, choose_config, run, TRITON_GEMM_V1,
                    "Triton tensor-core GEMM, any M", complete, candidates, common.gemm_perm)
