"""The CUDA-core GEMV's measured M = 1 tiles (fp16 activations), per GPU model and weight mode.

Source: tools/bench/gemv.py --sweep (and --sweep-mode sym) on an H200 and an H100 for the protocol's LLM shapes,
keyed by (bits, N, K); the fastest (R, U, KS, ...) of each sweep. Other shapes use the rule in
mixgemm.kernels.cuda.gemv.choose_config.
"""

from __future__ import annotations

from typing import NamedTuple


class M1Tile(NamedTuple):
    """One tuned M = 1 tile (fp16 activations): R rows per warp, U chunks in flight per lane and row, KS k-slices,
    PF register double buffering, RG row groups per block (0: 8 warps per block, RG = 8 / KS), MINB launch-bounds
    blocks per SM (0: none), LITE f16x2 sum of the two partial chains, BULK stages of the bulk-copy ring (0: weights
    loaded into registers; sm_90 only, persistent grid; gemv.cu GEMV_BULK)."""

    R: int
    U: int
    KS: int
    PF: int = 0
    RG: int = 0
    MINB: int = 0
    LITE: int = 0
    BULK: int = 0


# H200, M = 1, fp16 activations (source: tools/bench/gemv.py --sweep, its KS and bulk-copy sweeps). K = 28672 takes
# the H100's bulk-copy ring tile (below): 28672x8192 zero point 37.7 -> 36.0 us, sym 35.3 -> 34.8 us.
_K28672_BULK = M1Tile(8, 1, 7, RG=1, MINB=2, LITE=1, BULK=2)
TUNED_M1 = {
    (4, 4096, 4096): (2, 2, 2), (4, 14336, 4096): (4, 2, 2), (4, 4096, 14336): (4, 2, 2),
    (4, 28672, 8192): (4, 2, 2), (4, 8192, 28672): _K28672_BULK,
    (8, 4096, 4096): (2, 1, 4), (8, 14336, 4096): (2, 1, 4), (8, 4096, 14336): (2, 1, 8),
    (8, 28672, 8192): (2, 1, 8), (8, 8192, 28672): (2, 1, 8),
}
# H100 (source: the same sweeps there): (R, U, KS, PF); PF = register double buffering, which the W8 kernel gains
# from there. On K = 28672 / 14336 the zero-point kernel wants k-slices that give every lane the same number of steps
# (KS 7: Kc = 896 = 4 x 7 x 32 chunks, 448 = 2 x 7 x 32; with the power-of-two KS 8 half the warps of a block idle for
# the last step): 28672x8192 50.8 -> 49.0 us, 14336x4096 14.4 -> 13.7 us. On K = 28672 the bulk-copy ring with each
# tile's parameters copied in bulk (_K28672_BULK: gemv.cu GEMV_BULK / GEMV_BPAR), 8 rows per warp: zero point
# 48.9 -> 47.4 us, sym 47.3 -> 46.1.
TUNED_M1_H100 = {
    (4, 4096, 4096): (4, 1, 2, 0), (4, 14336, 4096): (4, 1, 2, 0), (4, 4096, 14336): M1Tile(4, 1, 7, RG=2, MINB=2),
    (4, 28672, 8192): (4, 2, 4, 0), (4, 8192, 28672): _K28672_BULK,
    (8, 4096, 4096): (2, 1, 4, 0), (8, 14336, 4096): (2, 1, 8, 0), (8, 4096, 14336): (2, 1, 8, 0),
    (8, 28672, 8192): (2, 2, 8, 1), (8, 8192, 28672): (2, 1, 8, 1),
}


# Symmetric int4 on an H100 (source: tools/bench/gemv.py --sweep --sweep-mode sym): without zero points a lane
# holds fewer registers per row, and one chunk in flight per lane and row (U 1) with more split-K measured fastest (us
# against the zero-point tiles above): 28672x8192 47.5 vs 49.6, 14336x4096 13.2 vs 14.9, 4096x14336 12.8 vs 13.4;
# 28672x8192 then takes the bulk-copy ring tile (46.1). Keyed like the tables above; entries override them for mode
# "sym".
TUNED_M1_H100_SYM = {
    (4, 8192, 28672): _K28672_BULK, (4, 4096, 14336): (4, 1, 4, 0),
    (4, 14336, 4096): (4, 1, 1, 0),
}
# The same for symmetric int4 on an H200 (source: the sym and KS sweeps there; us against the table above): 4096x4096
# 4.2 vs 4.7, 4096x14336 10.9 vs 11.6, 14336x4096 10.6 vs 13.8, 8192x28672 36.1 vs 37.1, 28672x8192 35.1 vs 36.4.
TUNED_M1_SYM = {
    (4, 4096, 4096): (4, 2, 2), (4, 14336, 4096): (4, 1, 1), (4, 4096, 14336): (4, 1, 4),
    (4, 28672, 8192): (4, 2, 4), (4, 8192, 28672): _K28672_BULK,
}
# merged once, not per call
_TUNED_M1_SYM_ALL = {"H100": {**TUNED_M1_H100, **TUNED_M1_H100_SYM}, "": {**TUNED_M1, **TUNED_M1_SYM}}


def tuned_m1(gpu_name: str, mode: str = "") -> dict:
    """The M = 1 tile table measured on this GPU model (H100 / H200) for this weight mode; H200's for any other GPU."""
    gpu = "H100" if "H100" in gpu_name else ""
    if mode == "sym":
        return _TUNED_M1_SYM_ALL[gpu]
    return TUNED_M1_H100 if gpu else TUNED_M1


# The fused activation-quantizing GEMV (W4A8 / W8A8, kernels/cuda/gemv_a8.cu) at M = 1, fp16 output, keyed by
# (bits, N, K) (source: tools/bench/gemv_a8.py --sweep, H200; one-pass prologue with PDL). Times and fractions of
# the HBM floor: W4 N 28672 / K 8192 36.1-36.4 us (81%); W4 N 8192 / K 28672 38.1-38.2 us with per-token, 39.0 us
# with per-group activations (77% / 75%); W8 per-channel N 28672 / K 8192 64.4 us (86%), N 8192 / K 28672 68.0 us
# (82%).
A8_TUNED_M1: dict = {
    (4, 28672, 8192): {"R": 2, "KS": 1, "NW": 8, "PF": 0},
    (4, 8192, 28672): {"R": 4, "KS": 1, "NW": 16, "PF": 0},
    (8, 28672, 8192): {"R": 4, "KS": 1, "NW": 16, "PF": 0},
    (8, 8192, 28672): {"R": 4, "KS": 1, "NW": 16, "PF": 0},
}
