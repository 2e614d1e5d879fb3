"""The CUDA-core GEMV's measured M = 1 tiles (fp16 activations), per GPU model and weight mode, as bucket entries.

Source: tools/bench/gemv.py --sweep (and --sweep-mode sym) on an H200 and an H100 for the protocol's LLM layers, the
fastest (R, U, KS, ...) of each sweep; on the H100 also tools/bench/gemv_dispatch.py over the 80 layers of the model
list (the neighbours of the rule's tile, kept where >= 5% faster). Each entry covers the half-octave bucket of the
layer it was measured on (mixgemm.tuning.buckets: K and N each within about +-19% of the measured sizes) for its
weight bit width; layers in other buckets (and in the buckets STEP_MODEL_SERVES lists, per GPU) use the
step-cost model (mixgemm.tuning.gemv_steps) at fp16, else the rule in mixgemm.kernels.cuda_gemv.host.choose_config. A
tile is legal for any K (the k-slices stride over the row's chunks, partial steps in the tail loop); choose_config
uses it where K gives each k-slice a full step or as many chunks as on the measured layer.
"""

from __future__ import annotations

from typing import NamedTuple

from mixgemm.tuning.buckets import BucketEntry, Region, ShapeBucket, check_partition, find


class M1Tile(NamedTuple):
    """One tuned M = 1 tile (fp16 activations): R rows per warp, U chunks in flight per lane and row, KS k-slices,
    PF register double buffering, RG row groups per block (0: 8 warps per block, RG = 8 / KS), MINB launch-bounds
    blocks per SM (0: none), LITE f16x2 sum of the two partial chains, BULK stages of the bulk-copy ring (0: weights
    loaded into registers; sm_90 only, persistent grid; gemv.cu GEMV_BULK), ZSUM zero points through the x sum
    (zero_point weights; gemv.cu GEMV_ZSUM), LW lanes per weight row (32, 16 or 8: a warp works on 32 / LW row sets
    at once; gemv.cu GEMV_LW), MAXB the most blocks per SM (rounded up) of a layer the entry serves, as on the layers
    it was kept for (0: any; kernels.cuda_gemv.host.choose_config)."""

    R: int
    U: int
    KS: int
    PF: int = 0
    RG: int = 0
    MINB: int = 0
    LITE: int = 0
    BULK: int = 0
    ZSUM: int = 0
    LW: int = 32
    MAXB: int = 0


def _entries(source: str, measured: list, tile_type: type = M1Tile) -> dict[int, tuple[BucketEntry, ...]]:
    """{bits: entries} from [(bits, K, N, tile), ...]: each tile (a tile_type) covers the bucket of the K x N layer it
    was measured on."""
    out: dict[int, list] = {}
    for bits, k, n, tile in measured:
        out.setdefault(bits, []).append(BucketEntry(Region.cell(k, n), tile_type(*tile), source, (k, n)))
    return {bits: tuple(lst) for bits, lst in out.items()}


# The bulk-copy ring tile with 8 rows per warp and KS 7 for the K = 28672 bucket (gemv.cu GEMV_BULK / GEMV_BPAR).
_K28672_BULK = M1Tile(8, 1, 7, RG=1, MINB=2, LITE=1, BULK=2)

# H200, M = 1, fp16 activations: tools/bench/gemv.py --sweep, its KS and bulk-copy sweeps. The K = 28672 bucket takes
# the H100's bulk-copy ring tile (below): K 28672 x N 8192 zero point 37.7 -> 36.0 us, sym 35.3 -> 34.8 us.
H200 = _entries("tools/bench/gemv.py --sweep on the H200 (M = 1, fp16 activations; KS and bulk-copy sweeps)", [
    # (bits, K, N, tile (R, U, KS, ...))
    (4, 4096, 4096, (2, 2, 2)), (4, 4096, 14336, (4, 2, 2)), (4, 14336, 4096, (4, 2, 2)),
    (4, 8192, 28672, (4, 2, 2)), (4, 28672, 8192, _K28672_BULK),
    (8, 4096, 4096, (2, 1, 4)), (8, 4096, 14336, (2, 1, 4)), (8, 14336, 4096, (2, 1, 8)),
    (8, 8192, 28672, (2, 1, 8)), (8, 28672, 8192, (2, 1, 8)),
])
# H100: the same sweeps there; (R, U, KS, PF), PF = register double buffering, which the W8 kernel gains from there.
# On the K = 28672 / 14336 buckets the zero-point kernel wants k-slices that give every lane the same number of steps
# (KS 7: Kc = 896 = 4 x 7 x 32 chunks, 448 = 2 x 7 x 32; with the power-of-two KS 8 half the warps of a block idle for
# the last step): K 28672 x N 8192 50.8 -> 49.0 us, K 14336 x N 4096 14.4 -> 13.7 us. On the K = 28672 bucket the
# bulk-copy ring with each tile's parameters copied in bulk, 8 rows per warp: zero point 48.9 -> 47.4 us, sym
# 47.3 -> 46.1.
H100 = _entries("tools/bench/gemv.py --sweep on the H100 (M = 1, fp16 activations; KS and bulk-copy sweeps)", [
    (4, 4096, 14336, (4, 1, 2, 0)), (4, 14336, 4096, M1Tile(4, 1, 7, RG=2, MINB=2)),
    (4, 8192, 28672, (4, 2, 4, 0)), (4, 28672, 8192, _K28672_BULK),
    (8, 4096, 4096, (2, 1, 4, 0)), (8, 4096, 14336, (2, 1, 8, 0)), (8, 14336, 4096, (2, 1, 8, 0)),
    (8, 8192, 28672, (2, 2, 8, 1)), (8, 28672, 8192, (2, 1, 8, 1)),
])
# Symmetric int4 on an H100 (tools/bench/gemv.py --sweep --sweep-mode sym): without zero points a lane holds fewer
# registers per row, and one chunk in flight per lane and row (U 1) with more split-K measured fastest (us against the
# zero-point tiles above): 28672x8192 47.5 vs 49.6, 14336x4096 13.2 vs 14.9, 4096x14336 12.8 vs 13.4; the K = 28672
# bucket then takes the bulk-copy ring tile (46.1). These entries replace the zero-point tables'
# entries of the same bucket for mode "sym".
H100_SYM = _entries("tools/bench/gemv.py --sweep --sweep-mode sym on the H100 (M = 1, fp16 activations)", [
    (4, 28672, 8192, _K28672_BULK), (4, 14336, 4096, (4, 1, 4, 0)), (4, 4096, 14336, (4, 1, 1, 0)),
    (4, 4096, 4096, (4, 1, 2, 0)),
])
# The same for symmetric int4 on an H200 (the sym and KS sweeps there; us against the table above): 4096x4096 4.2 vs
# 4.7, 4096x14336 10.9 vs 11.6, 14336x4096 10.6 vs 13.8, 8192x28672 36.1 vs 37.1, 28672x8192 35.1 vs 36.4.
H200_SYM = _entries("tools/bench/gemv.py --sweep --sweep-mode sym, KS sweeps on the H200 (M = 1, fp16 activations)", [
    (4, 4096, 4096, (4, 2, 2)), (4, 4096, 14336, (4, 1, 1)), (4, 14336, 4096, (4, 1, 4)),
    (4, 8192, 28672, (4, 2, 4)), (4, 28672, 8192, _K28672_BULK),
])


# The model-list sweep on the H100 (tools/bench/gemv_dispatch.py, M = 1, fp16 activations): on each layer of the 80 the
# CUDA-core GEMV's default tile against its neighbours (R, U, KS one step away), kept where a neighbour was >= 5%
# faster on every measured layer of the bucket (us, default -> tile) and the layer is under 100 MB; buckets holding a
# tile above, or layers the tensor-core GEMV takes at M = 1 (the h100 table's gemv_mma_m1), are left out. Zero point:
# 1536x8960 7.76 -> 4.85, 9216x2304 9.45 -> 6.27, 5120x5120 10.05 -> 7.25, 27648x5120 37.3 -> 32.2; the wide layers
# (N >= 8k, K <= 3k) want R 4 with U 1, the tall ones R 2, U 1, KS 4. int8 per channel (measured sym, serves every
# mode): 3584x512 2.78 -> 1.99, 1536x2048 3.07 -> 2.28, 11008x4096 20.5 -> 18.1, 5120x13824 29.3 -> 27.0.
_SWEEP_SOURCE = "tools/bench/gemv_dispatch.py on the H100 (M = 1, fp16 activations; model-list sweep of the neighbours)"
H100_ZP_SWEEP = _entries(_SWEEP_SOURCE + ", zero point", [
    (4, 896, 128, (2, 1, 1)), (4, 896, 9728, (4, 1, 1)), (4, 1536, 256, (2, 1, 1)), (4, 1536, 8960, (4, 1, 1)),
    (4, 2048, 11008, (4, 1, 1)), (4, 2048, 22016, (4, 1, 1)), (4, 2304, 9216, (4, 1, 1)),
    (4, 3584, 512, (2, 2, 2)),
    (4, 4096, 12288, (4, 1, 2)), (4, 4864, 896, (4, 2, 2)), (4, 5120, 1024, (2, 2, 4)), (4, 5120, 5120, (2, 1, 2)),
    (4, 5120, 7680, (2, 2, 1)), (4, 9216, 2304, (2, 1, 4)), (4, 11008, 2048, (2, 1, 4)),
    (4, 27648, 5120, (2, 1, 4)), (4, 36864, 4608, (2, 1, 4)),
])
H100_W8_SWEEP = _entries(_SWEEP_SOURCE + ", int8", [
    (8, 896, 128, (2, 2, 2)), (8, 896, 4864, (2, 1, 1)), (8, 1536, 256, (2, 2, 2)), (8, 1536, 1536, (2, 2, 2)),
    (8, 1536, 2048, (2, 2, 2)), (8, 2304, 4096, (4, 2, 2)), (8, 2304, 9216, (4, 2, 1)), (8, 2048, 11008, (4, 2, 1)),
    (8, 2048, 22016, (4, 1, 2)), (8, 3072, 3072, (2, 2, 4)), (8, 3584, 512, (2, 2, 4)), (8, 5120, 5120, (2, 2, 2)),
    (8, 5120, 7680, (2, 2, 8)), (8, 5120, 15360, (4, 2, 8)), (8, 8960, 1536, (2, 1, 8)), (8, 9216, 2304, (2, 2, 4)),
    (8, 8192, 3072, (2, 1, 8)), (8, 8192, 10240, (4, 2, 8)), (8, 11008, 4096, (2, 2, 8)),
])
# Symmetric int4, the same sweep: 4096x6144 9.37 -> 6.69, 8192x3072 9.67 -> 7.07, 5120x1024 4.51 -> 3.48, 3072x16384
# 13.3 -> 11.4, 27648x5120 34.3 -> 32.5.
H100_SYM_SWEEP = _entries(_SWEEP_SOURCE + ", sym", [
    (4, 896, 128, (2, 1, 1)), (4, 896, 9728, (4, 1, 1)), (4, 1536, 256, (2, 2, 2)),
    (4, 2048, 22016, (4, 1, 1)), (4, 3072, 16384, (4, 1, 1)), (4, 3584, 512, (2, 2, 2)),
    (4, 4096, 6144, (2, 1, 2)), (4, 4096, 22016, (4, 1, 2)), (4, 5120, 1024, (2, 2, 4)), (4, 5120, 5120, (2, 1, 2)),
    (4, 5120, 7680, (2, 2, 4)), (4, 8192, 1024, (4, 2, 4)), (4, 8192, 3072, (2, 1, 4)),
    (4, 8960, 1536, (4, 2, 4)), (4, 9216, 2304, (4, 2, 4)), (4, 17920, 5120, (2, 1, 4)), (4, 27648, 5120, (2, 2, 2)),
])


# The second model-list sweep on the H100 (tools/bench/gemv_dispatch.py --ms 1 --no-mma-grid over the 62 layers of
# >= 8M weights, the neighbours now with U 4 and PF; entries by its --suggest: a tile >= 5% faster than the default on
# every measured layer of its bucket, layers the CUDA-core GEMV serves). Replaces the entries above of the same bucket
# (us, default -> tile): zero point 3584x3584..4608x4096 (7 layers) 4.9-6.8 -> 4.7-6.3, 3072x9216 8.10 -> 7.52,
# 13824x5120 18.27 -> 16.95, 17920x5120 22.72 -> 21.54, 8192x57344 105.3 -> 92.9; sym 1536x8960 5.85 -> 4.99,
# 5120x13824 17.37 -> 16.38, 8192x57344 102.0 -> 90.1, 11008x2048 6.87 -> 6.40; int8 4608x8192 17.16 -> 15.29. (An int8
# tile for the 4096x4096 bucket, 8.01 -> 7.29 there, lost 6-10% on 3584x4608 and 4096x4608 of the same bucket.)
_SWEEP2_SOURCE = ("tools/bench/gemv_dispatch.py --suggest on the H100 (M = 1, fp16 activations; model-list sweep of "
                  "the neighbours with U 4 and PF, layers of >= 8M weights)")
H100_ZP_SWEEP2 = _entries(_SWEEP2_SOURCE + ", zero point", [
    (4, 1536, 17920, (4, 1, 2)), (4, 2304, 18432, (2, 1, 1)), (4, 3072, 9216, (2, 1, 1)), (4, 4096, 4096, (2, 1, 2)),
    (4, 4096, 6144, (4, 2, 1)), (4, 5120, 13824, (4, 2, 1)), (4, 8192, 3072, (4, 2, 2)), (4, 8192, 57344, (4, 2, 2)),
    (4, 11008, 4096, (2, 1, 2)), (4, 17920, 5120, (2, 1, 2)),
])
H100_SYM_SWEEP2 = _entries(_SWEEP2_SOURCE + ", sym", [
    (4, 1536, 8960, (2, 1, 1)), (4, 1536, 17920, (4, 1, 2)), (4, 5120, 15360, (4, 1, 1)), (4, 8192, 57344, (4, 2, 2)),
    (4, 11008, 2048, (4, 2, 4)),
])
H100_W8_SWEEP2 = _entries(_SWEEP2_SOURCE + ", int8", [(8, 4608, 8192, (4, 2, 8))])

# The third zero-point sweep on the H100, after the zero-point kernel could take its zero points through the x sum
# (gemv.cu GEMV_ZSUM: 9-21 registers fewer, the sym kernel's count at R 4 U 1): tools/bench/gemv_dispatch.py --formats
# w4z --ms 1 --no-mma-grid over the 80 model-list layers, every candidate with and without ZSUM, entries by its
# --suggest (>= 5% faster on every measured layer of the bucket; buckets where the CUDA-core GEMV serves M = 1, tiles
# whose every k-slice gets a chunk), checked in a second run with these entries as the defaults. Replaces the entries
# above of the same bucket (us, the tile before -> this one, same run): 5120x13824 19.4 -> 17.6 and 5120x15360 20.9 ->
# 18.9 (ZSUM), 5120x27648 35.9 -> 33.7 and 5120x35840 44.5 -> 41.4 (ZSUM), 3072x16384 14.4 -> 12.3 (ZSUM), 1536x17920
# 9.22 -> 8.67 (ZSUM), 1536x256 2.41 -> 1.68 (ZSUM), 4096x11008 12.27 -> 11.67 and 4096x12288 13.02 -> 12.70,
# 3584x512 3.59 -> 2.73, 5120x1024 3.15 -> 2.86.
_SWEEP3_SOURCE = ("tools/bench/gemv_dispatch.py --suggest on the H100 (M = 1, fp16 activations; model-list sweep of "
                  "the neighbours, each with and without ZSUM)")
H100_ZP_SWEEP3 = _entries(_SWEEP3_SOURCE + ", zero point", [
    (4, 1536, 256, M1Tile(2, 1, 2, ZSUM=1)), (4, 1536, 17920, M1Tile(4, 1, 2, ZSUM=1)),
    (4, 3072, 16384, M1Tile(4, 1, 1, ZSUM=1)), (4, 3584, 512, (2, 2, 4)), (4, 4096, 11008, (4, 1, 1)),
    (4, 5120, 1024, (4, 2, 4)), (4, 5120, 13824, M1Tile(4, 1, 1, ZSUM=1)), (4, 5120, 27648, M1Tile(4, 2, 2, ZSUM=1)),
])

# The fourth H100 sweep, after a row could take fewer lanes than a warp (gemv.cu GEMV_LW): a row of 3.5 chunks per
# lane paid the 4 round trips of the lanes with one more. tools/bench/gemv_dispatch.py --lw-grid --formats w4s,w4z,w8
# --ms 1 over the 80 model-list layers (each layer's default against LW 32 / 16 / 8 x KS 1 / 2 / 4 x U 1 / 2 x R 2 / 4),
# entries by --suggest (>= 5% faster on every measured layer of the bucket) over the layers the CUDA-core GEMV serves at
# M = 1. Over all 80 layers the per-layer best took 0.872x (sym), 0.908x (zero point), 0.950x (int8) the default's
# time by geometric mean, 0.913x / 0.955x / 0.971x with LW 32 only. Replaces the entries above of the same bucket.
# Before / after (mixgemm bench, M = 1, one H100, two rounds each, medians): the 46 (layer, format) cases these entries
# move 0.847x the time by geometric mean, 0.68-0.95x, none slower (us: sym 3584x4608 6.14 -> 4.44, 3584x8192 9.85 ->
# 7.24, 11008x4096 13.73 -> 10.80, 4096x4096 5.41 -> 4.69, 8192x8192 17.07 -> 15.23; zero point 2304x18432 13.00 ->
# 11.35, 3584x8192 9.07 -> 7.95; int8 896x9728 4.67 -> 3.80, 4096x6144 11.24 -> 10.26); the other 62 cases and fp16
# cuBLAS 1.000x. Each entry's MAXB (printed by --suggest) is the most blocks per SM of the layers it was kept for. On
# layers off the model list that fall in these buckets (same tool and run design, sym and int8): 10240x3840 12.72 ->
# 9.72 us, 13696x4096 17.23 -> 13.73, 3840x10240 12.48 -> 10.36, 4352x4352 7.21 -> 6.29, 4096x5120 int8 9.89 -> 9.16,
# 14336x5120 18.14 -> 17.23; slower: 3840x3840 5.28 -> 5.47, 3584x5120 int8 7.90 -> 8.22, and 4096x13696 14.77 -> 16.01
# (7 blocks per SM against the k24/n27 tile's 6), which MAXB now hands back to the rule.
_SWEEP4_SOURCE = ("tools/bench/gemv_dispatch.py --lw-grid --suggest on the H100 (M = 1, fp16 activations; model-list "
                  "sweep of lanes per row x KS x U x R)")
H100_SYM_SWEEP4 = _entries(_SWEEP4_SOURCE + ", sym", [
    (4, 1536, 256, M1Tile(2, 2, 2, LW=16, MAXB=1)), (4, 1536, 8960, M1Tile(4, 2, 4, LW=8, MAXB=3)),
    (4, 1536, 17920, M1Tile(4, 2, 1, LW=16, MAXB=3)), (4, 2048, 256, M1Tile(4, 1, 4, LW=16, MAXB=1)),
    (4, 2304, 9216, M1Tile(4, 2, 4, LW=8, MAXB=3)), (4, 2304, 18432, M1Tile(2, 1, 2, LW=8, MAXB=5)),
    (4, 2048, 22016, M1Tile(2, 1, 1, LW=16, MAXB=6)), (4, 3584, 512, M1Tile(4, 2, 4, LW=16, MAXB=1)),
    (4, 3584, 3584, M1Tile(4, 2, 4, LW=16, MAXB=3)), (4, 3584, 8192, M1Tile(4, 1, 4, LW=16, MAXB=4)),
    (4, 4096, 11008, M1Tile(2, 1, 1, MAXB=6)), (4, 5120, 1024, M1Tile(4, 2, 4, MAXB=1)),
    (4, 5120, 7168, M1Tile(4, 1, 4, LW=16, MAXB=4)), (4, 8192, 8192, M1Tile(4, 1, 2, MAXB=4)),
    (4, 11008, 4096, M1Tile(4, 1, 4, MAXB=4)), (4, 13824, 5120, M1Tile(2, 1, 4, LW=16, MAXB=5)),
])
H100_ZP_SWEEP4 = _entries(_SWEEP4_SOURCE + ", zero point", [
    (4, 1536, 8960, M1Tile(2, 1, 2, LW=16, MAXB=5)), (4, 1536, 17920, M1Tile(2, 1, 1, ZSUM=1, LW=16, MAXB=5)),
    (4, 2048, 256, M1Tile(2, 1, 2, MAXB=1)), (4, 2304, 9216, M1Tile(2, 1, 4, LW=8, MAXB=5)),
    (4, 2304, 18432, M1Tile(2, 1, 2, LW=8, MAXB=5)), (4, 3584, 512, M1Tile(4, 2, 4, LW=16, MAXB=1)),
    (4, 3584, 8192, M1Tile(4, 2, 2, LW=16, MAXB=2)), (4, 4608, 73728, M1Tile(2, 1, 2, LW=16, MAXB=35)),
    (4, 8192, 10240, M1Tile(2, 1, 1, MAXB=5)),
])
# int8 per channel (measured sym, serves every mode)
H100_W8_SWEEP4 = _entries(_SWEEP4_SOURCE + ", int8", [
    (8, 896, 128, M1Tile(4, 2, 4, LW=8, MAXB=1)), (8, 896, 896, M1Tile(2, 2, 4, LW=8, MAXB=1)),
    (8, 896, 4864, M1Tile(4, 2, 4, LW=8, MAXB=2)), (8, 896, 9728, M1Tile(4, 2, 4, LW=8, MAXB=3)),
    (8, 1536, 1536, M1Tile(4, 2, 4, LW=16, MAXB=1)), (8, 2048, 256, M1Tile(2, 1, 4, MAXB=1)),
    (8, 2304, 1024, M1Tile(2, 1, 4, MAXB=2)), (8, 2304, 9216, M1Tile(2, 1, 2, LW=16, MAXB=5)),
    (8, 4096, 6144, M1Tile(2, 1, 4, LW=16, MAXB=6)),
])

# The same sweep on the H200 (buckets the h200 table's gemv_mma_m1 sends to the tensor-core GEMV left out):
# zero point 9216x2304 8.51 -> 5.70 us, 5120x5120 9.13 -> 6.44, 27648x5120 32.2 -> 27.2; sym 8192x3072 8.67 -> 6.11,
# 4096x6144 8.25 -> 6.11, 5120x1024 4.66 -> 3.45.
_SWEEP_SOURCE_H200 = ("tools/bench/gemv_dispatch.py on the H200 (M = 1, fp16 activations; model-list sweep of the "
                      "neighbours)")
H200_SWEEP = _entries(_SWEEP_SOURCE_H200 + ", zero point", [
    (4, 896, 128, (2, 1, 1)), (4, 1536, 256, (2, 1, 1)), (4, 1536, 17920, (4, 1, 1)), (4, 2048, 11008, (4, 1, 1)),
    (4, 2048, 22016, (4, 1, 1)), (4, 2304, 18432, (4, 1, 1)), (4, 3584, 512, (2, 2, 2)), (4, 4096, 6144, (2, 2, 1)),
    (4, 4096, 12288, (4, 1, 2)), (4, 4608, 8192, (4, 2, 1)), (4, 4864, 896, (4, 2, 2)), (4, 5120, 1024, (2, 2, 4)),
    (4, 5120, 5120, (2, 1, 2)), (4, 5120, 7680, (2, 2, 1)), (4, 5120, 15360, (4, 2, 1)), (4, 8192, 1024, (4, 2, 4)),
    (4, 8192, 3072, (2, 2, 2)), (4, 8192, 8192, (4, 2, 2)), (4, 8960, 1536, (4, 2, 4)), (4, 9216, 2304, (2, 1, 4)),
    (4, 11008, 2048, (4, 2, 4)), (4, 11008, 4096, (4, 2, 4)), (4, 17920, 5120, (2, 1, 4)), (4, 27648, 5120, (2, 1, 4)),
    (4, 36864, 4608, (2, 1, 4)),
])
H200_SYM_SWEEP = _entries(_SWEEP_SOURCE_H200 + ", sym", [
    (4, 896, 128, (2, 1, 1)), (4, 1536, 256, (2, 2, 2)), (4, 1536, 17920, (4, 1, 1)), (4, 3072, 16384, (4, 1, 1)),
    (4, 3584, 512, (2, 2, 2)), (4, 4096, 6144, (4, 2, 2)), (4, 4864, 896, (4, 2, 2)), (4, 5120, 1024, (2, 2, 4)),
    (4, 5120, 5120, (4, 2, 2)), (4, 5120, 7680, (2, 2, 4)), (4, 5120, 15360, (4, 1, 2)), (4, 8192, 1024, (2, 2, 8)),
    (4, 8192, 3072, (4, 2, 4)), (4, 8960, 1536, (4, 2, 4)), (4, 9216, 2304, (4, 2, 4)), (4, 11008, 4096, (4, 2, 4)),
    (4, 17920, 5120, (2, 2, 2)), (4, 27648, 5120, (4, 2, 4)), (4, 36864, 4608, (4, 2, 4)),
])

# int8 per channel, the same sweep on the H200 (measured sym, serves every mode; buckets of the protocol entries above
# left out): 1536x2048 3.21 -> 2.24 us, 896x4864 4.25 -> 3.01, 3584x512 2.73 -> 1.98, 2048x11008 8.58 -> 7.48,
# 4096x6144 9.12 -> 8.03, 11008x4096 16.4 -> 14.8, 8192x10240 25.9 -> 24.2.
H200_W8_SWEEP = _entries(_SWEEP_SOURCE_H200 + ", int8", [
    (8, 896, 128, (2, 1, 2)), (8, 896, 896, (2, 1, 2)), (8, 896, 4864, (2, 1, 2)), (8, 896, 9728, (2, 1, 1)),
    (8, 1536, 256, (2, 2, 2)), (8, 1536, 1536, (2, 2, 2)), (8, 1536, 2048, (4, 2, 2)), (8, 2048, 11008, (4, 2, 1)),
    (8, 2304, 1024, (2, 1, 4)), (8, 2304, 4096, (4, 2, 2)), (8, 2304, 9216, (4, 2, 1)), (8, 3072, 3072, (2, 2, 4)),
    (8, 3072, 9216, (4, 2, 1)), (8, 3072, 16384, (4, 1, 2)), (8, 3584, 512, (2, 2, 4)), (8, 4096, 6144, (2, 2, 2)),
    (8, 5120, 1024, (2, 2, 8)), (8, 5120, 5120, (2, 2, 2)), (8, 5120, 7168, (2, 2, 8)), (8, 8192, 3072, (2, 1, 8)),
    (8, 8192, 10240, (4, 2, 8)), (8, 8960, 1536, (2, 1, 8)), (8, 9216, 2304, (2, 1, 4)), (8, 11008, 4096, (2, 2, 8)),
])


def _union(*tables: dict) -> dict:
    """{bits: entries} of every table (their buckets must not overlap: _check)."""
    return {bits: sum((t.get(bits, ()) for t in tables), ()) for bits in {b for t in tables for b in t}}


def _replacing(base: dict, newer: dict) -> dict:
    """base's entries with newer's replacing those of the same bucket."""
    out = {}
    for bits in set(base) | set(newer):
        over = newer.get(bits, ())
        out[bits] = over + tuple(e for e in base.get(bits, ()) if all(e.region != o.region for o in over))
    return out


# {(gpu, sym?): {bits: entries}}, merged once, not per call: every measured entry (TABLES: less STEP_MODEL_SERVES)
MEASURED = {("H100", False): _replacing(_replacing(_union(H100, H100_ZP_SWEEP, H100_ZP_SWEEP2, H100_W8_SWEEP,
                                                       H100_W8_SWEEP2), H100_ZP_SWEEP3),
                                     _union(H100_ZP_SWEEP4, H100_W8_SWEEP4)),
          ("H100", True): _replacing(_replacing(_union(H100, H100_W8_SWEEP, H100_W8_SWEEP2),
                                                _union(H100_SYM, H100_SYM_SWEEP, H100_SYM_SWEEP2)),
                                     _union(H100_SYM_SWEEP4, H100_W8_SWEEP4)),
          ("H200", False): _union(H200, H200_SWEEP, H200_W8_SWEEP),
          ("H200", True): _replacing(_union(H200, H200_W8_SWEEP), _union(H200_SYM, H200_SYM_SWEEP))}


# Entries the step-cost model (tuning.gemv_steps) serves as well, listed by the layer each was measured on: on every
# swept layer the entry serves, the tile the model dispatches took at most 1.02x the entry's time, and on the layer of
# an entry measured on a protocol shape at most its time (tools/bench/gemv_steps_fit.py --prune over the H100
# lanes-per-row sweeps of the 80 model-list layers and 37 others, plus timings of the model's KS 8 picks and its
# zero-point tiles without ZSUM; entries with tiles, or whose layers' model tiles, the sweeps did not time stay). They
# leave the tables, so their buckets, and the other models' layers that fall in them, take the model, which carries to
# unseen shapes where a bucket's one tile does not (W4 zero point on the 29 other layers: 1.074x -> 1.006x the fastest
# tile's time, the tables and model against the model alone).
STEP_MODEL_SERVES = {
    ("H100", False): {4: [(896, 128), (1536, 8960), (2048, 11008), (2048, 22016), (2304, 9216), (3072, 9216),
                          (3584, 512), (3584, 8192), (4096, 6144), (4096, 11008), (4096, 14336), (4864, 896),
                          (5120, 1024), (5120, 5120), (5120, 7680), (5120, 27648), (8192, 3072), (8192, 10240),
                          (8192, 57344), (9216, 2304), (11008, 2048), (11008, 4096), (17920, 5120), (27648, 5120),
                          (36864, 4608)]},
    ("H100", True): {4: [(896, 9728), (1536, 8960), (1536, 17920), (2304, 9216), (3072, 16384), (3584, 8192),
                         (4096, 14336), (5120, 1024), (5120, 7168), (5120, 15360), (8192, 1024), (8192, 8192),
                         (8960, 1536), (9216, 2304), (11008, 2048), (11008, 4096)],
                     8: [(896, 128), (896, 896), (1536, 2048), (2048, 256), (2048, 11008), (2048, 22016), (2304, 4096),
                         (3072, 3072), (3584, 512), (4096, 4096), (8192, 10240), (8960, 1536), (9216, 2304),
                         (11008, 4096)]},
    ("H200", False): {4: [(896, 128), (1536, 256), (1536, 17920), (2048, 11008), (2048, 22016), (2304, 18432),
                          (3584, 512), (4096, 4096), (4096, 6144), (4096, 12288), (4096, 14336), (4608, 8192),
                          (4864, 896), (5120, 1024), (5120, 5120), (5120, 7680), (5120, 15360), (8192, 1024),
                          (8192, 3072), (8192, 8192), (9216, 2304), (11008, 2048), (11008, 4096), (14336, 4096),
                          (17920, 5120), (27648, 5120)]},
    ("H200", True): {4: [(896, 128), (1536, 256), (1536, 17920), (3072, 16384), (3584, 512), (4096, 6144),
                         (4096, 14336), (4864, 896), (5120, 1024), (5120, 5120), (5120, 7680), (5120, 15360),
                         (8192, 1024), (8192, 3072), (9216, 2304), (11008, 4096), (14336, 4096), (17920, 5120),
                         (27648, 5120)],
                     8: [(896, 9728), (1536, 1536), (1536, 2048), (2048, 11008), (2304, 9216), (3072, 3072),
                         (3072, 9216), (3072, 16384), (3584, 512), (4096, 4096), (5120, 1024), (5120, 5120),
                         (5120, 7168), (8192, 3072), (8192, 10240), (8960, 1536), (9216, 2304), (11008, 4096),
                         (14336, 4096)]},
}


def _without(table: dict, measured: dict) -> dict:
    """table's entries less those measured on the layers of ``measured`` ({bits: [(K, N), ...]})."""
    return {bits: tuple(e for e in entries if e.measured not in measured.get(bits, ())) for bits, entries in
            table.items()}


TABLES = {key: _without(table, STEP_MODEL_SERVES.get(key, {})) for key, table in MEASURED.items()}


def _check() -> None:
    for (gpu, sym), table in TABLES.items():
        for bits, entries in table.items():
            check_partition(entries, f"gemv_m1 {gpu}{' sym' if sym else ''} W{bits}", complete=False)


_check()


def tuned_m1(gpu_name: str, mode: str = "") -> dict[int, tuple[BucketEntry, ...]]:
    """The M = 1 tile entries ({bits: entries}) measured on this GPU model (H100 / H200) for this weight mode; the
    H200's for any other GPU."""
    return TABLES[("H100" if "H100" in gpu_name else "H200", mode == "sym")]


def m1_entry(gpu_name: str, mode: str, bits: int, k: int, n: int) -> BucketEntry | None:
    """The measured M = 1 tile entry whose bucket holds a K x N layer of this bit width, or None."""
    return find(tuned_m1(gpu_name, mode).get(bits, ()), ShapeBucket.of(k, n))


# The fused activation-quantizing GEMV (W4A8 / W8A8, kernels/cuda_gemv_a8/gemv_a8.cu) at M = 1, fp16 output (source:
# tools/bench/gemv_a8.py --sweep, H200; one-pass prologue with PDL). Times and fractions of the HBM floor: W4 K 8192 x
# N 28672 36.1-36.4 us (81%); W4 K 28672 x N 8192 38.1-38.2 us with per-token, 39.0 us with per-group activations
# (77% / 75%); W8 per-channel K 8192 x N 28672 64.4 us (86%), K 28672 x N 8192 68.0 us (82%).
_A8_SOURCE = "tools/bench/gemv_a8.py --sweep on the H200 (M = 1, fp16 output; one-pass prologue with PDL)"
A8_M1: dict[int, tuple[BucketEntry, ...]] = {
    bits: tuple(BucketEntry(Region.cell(k, n), cfg, _A8_SOURCE, (k, n)) for b, k, n, cfg in (
        (4, 8192, 28672, {"R": 2, "KS": 1, "NW": 8, "PF": 0}),
        (4, 28672, 8192, {"R": 4, "KS": 1, "NW": 16, "PF": 0}),
        (8, 8192, 28672, {"R": 4, "KS": 1, "NW": 16, "PF": 0}),
        (8, 28672, 8192, {"R": 4, "KS": 1, "NW": 16, "PF": 0}),
    ) if b == bits)
    for bits in (4, 8)
}
for _bits, _entries_a8 in A8_M1.items():
    check_partition(_entries_a8, f"gemv_a8 M = 1 W{_bits}", complete=False)


def a8_m1_entry(bits: int, k: int, n: int) -> BucketEntry | None:
    """The measured M = 1 tile entry of the fused int8-activation GEMV whose bucket holds a K x N layer, or None."""
    return find(A8_M1.get(bits, ()), ShapeBucket.of(k, n))


class WgSimtTile(NamedTuple):
    """One measured M = 1 tile of the CUDA-core GEMV on wgmma_v1 (kernels/cuda_gemv_wg_simt/gemv_wg_simt.cu, fp16
    activations): RT 16-row tiles per warp, U 64-k tiles in flight per step, PF register double buffering, KS
    k-slices, RG row groups per block; BPS: the blocks per SM up to which it serves its bucket (0: any), as many rounds
    of the blocks an SM holds as on the layers it was kept for (kernels.cuda_gemv_wg_simt.host.wg_simt_config); PACK: a
    zero point's 16-bit parameter pair held in one register (gemv_wg_simt.cu SIMT_PACK), None: as PF says
    (kernels.cuda_gemv_wg_simt.host.wg_simt_packs)."""

    RT: int
    U: int
    PF: int
    KS: int
    RG: int
    BPS: int = 0
    PACK: int | None = None


# H100, M = 1, fp16 activations: tools/bench/gemv_dispatch.py --simt-only over the 80 layers of the model list (the
# (RT, U, PF) x KS x block grid of gemv_wg_simt.cu, W4 g128 sym and zero point, W8 per channel; 2026-11-26), the entries
# printed by its --suggest-simt. Kept where the bucket's fastest common tile (geometric mean over its layers and, for
# W4, both modes) took <= 0.97x the time of the rule in kernels.cuda_gemv_wg_simt.host.wg_simt_config by geometric mean
# and at most 1.05x on any of its layers. Over the 80 layers, in the same run: W4 sym on >= 16 MiB layers 1.082x ->
# 1.019x the grid's best per layer (zero point 1.093x -> 1.014x, W8 1.051x -> 1.010x); us rule -> tile (plain-codes
# GEMV): W4 36864x4608 sym 50.8 -> 39.3 (39.7), 27648x5120 sym 40.0 -> 32.5 (32.4), 5120x35840 zero point 54.8 -> 41.9
# (44.0), 8192x10240 zero point 25.0 -> 19.4 (21.0). Timed again against the plain codes in mixgemm bench
# (docs/kernels/cuda_gemv_mma.md, tensor-core GEMV section).
# An entry with a BPS serves only the layers of its bucket whose blocks fit on the SMs at once, as on the layers it was
# kept for; the others take the rule (the selection weighs both ways per tile: every layer, or those in one round of
# the blocks an SM holds, registers from the tile's cubin). The k24/n28 int4 entry (RT 4 U 2 KS 8, BPS 2): 4096x14336
# 14.29 -> 13.27 us sym (plain 13.09), 3584x14336 12.71 -> 12.14, while 3584x18944 (3 blocks per SM) keeps the rule's
# 15.39 (the tile's 19.12); without the limit no tile qualified for the bucket.
_WG_SIMT_SOURCE = ("tools/bench/gemv_dispatch.py --simt-only on the H100, the 80 model-list layers (M = 1, fp16 "
                   "activations; gemv_wg_simt.cu grid)")
H100_WG_SIMT = _entries(_WG_SIMT_SOURCE, [
    # (bits, K, N, (RT, U, PF, KS, RG[, BPS]))
    (4, 1536, 1536, (1, 2, 1, 4, 2)), (4, 1536, 2048, (2, 2, 0, 4, 1)), (4, 1536, 17920, (1, 2, 0, 4, 1)),
    (4, 2048, 256, (1, 2, 1, 8, 1)), (4, 2304, 9216, (1, 2, 0, 8, 1)), (4, 2048, 11008, (2, 2, 0, 8, 1)),
    (4, 2304, 18432, (1, 2, 0, 4, 1)), (4, 2048, 22016, (2, 2, 0, 4, 1)), (4, 3072, 9216, (1, 2, 0, 8, 1)),
    (4, 3072, 16384, (4, 2, 0, 8, 1)), (4, 4096, 6144, (2, 2, 1, 8, 1)), (4, 3584, 8192, (2, 2, 1, 8, 1)),
    (4, 4096, 11008, (2, 2, 0, 8, 1)), (4, 3584, 14336, (4, 2, 0, 8, 1, 2)), (4, 4096, 22016, (2, 2, 0, 4, 1)),
    (4, 3584, 28672, (1, 2, 0, 4, 1)),
    (4, 4608, 73728, (1, 2, 0, 4, 1)), (4, 5120, 5120, (2, 2, 1, 8, 1)), (4, 5120, 13824, (4, 2, 0, 8, 1)),
    (4, 5120, 27648, (1, 2, 0, 8, 1)), (4, 5120, 55296, (2, 2, 0, 4, 1)), (4, 8192, 1024, (1, 2, 0, 32, 1)),
    (4, 9216, 2304, (2, 2, 1, 16, 1)), (4, 8192, 3072, (1, 2, 0, 16, 1)), (4, 8192, 10240, (1, 2, 0, 8, 1)),
    (4, 8192, 28672, (2, 2, 0, 4, 1)), (4, 8192, 57344, (1, 2, 0, 8, 1)), (4, 13824, 5120, (4, 2, 0, 16, 1)),
    (4, 36864, 4608, (4, 2, 0, 16, 1)), (4, 27648, 5120, (4, 2, 0, 16, 1)),
    (8, 896, 4864, (1, 1, 0, 4, 1)), (8, 1536, 2048, (1, 2, 0, 4, 1)), (8, 1536, 17920, (1, 1, 1, 8, 1)),
    (8, 2304, 9216, (1, 1, 1, 8, 1)), (8, 2048, 11008, (2, 2, 1, 8, 1)), (8, 2304, 18432, (1, 2, 0, 8, 1)),
    (8, 2048, 22016, (1, 2, 1, 8, 1)), (8, 3072, 9216, (1, 2, 0, 8, 1)), (8, 4096, 6144, (1, 2, 0, 16, 1)),
    (8, 4096, 11008, (1, 2, 0, 16, 1)), (8, 3584, 14336, (1, 1, 1, 16, 1)), (8, 4096, 22016, (1, 2, 0, 16, 1)),
    (8, 3584, 28672, (1, 1, 1, 16, 1)), (8, 5120, 5120, (4, 2, 0, 16, 1)), (8, 5120, 27648, (1, 1, 1, 8, 1)),
    (8, 5120, 55296, (2, 2, 1, 8, 1)), (8, 9216, 2304, (1, 2, 0, 16, 1)), (8, 8192, 3072, (1, 2, 0, 16, 1)),
    (8, 8192, 10240, (1, 2, 0, 32, 1)), (8, 8192, 28672, (1, 2, 0, 16, 1)), (8, 8192, 57344, (1, 2, 0, 16, 1)),
    (8, 11008, 2048, (1, 2, 0, 32, 1)), (8, 13824, 5120, (1, 2, 0, 8, 1)), (8, 36864, 4608, (1, 2, 0, 8, 1)),
    (8, 27648, 5120, (1, 2, 0, 8, 1)),
], WgSimtTile)
# The same sweep and selection on the H200 (2026-11-26; 57 buckets). Over the 80 layers, in the same run, against
# the grid's best per layer: W4 sym on >= 16 MiB layers 1.125x -> 1.029x (zero point 1.152x -> 1.026x, W8 1.077x ->
# 1.011x); us rule -> tile (plain-codes GEMV's default): 8192x28672 sym 43.0 -> 35.7 (35.9), zero point 43.2 -> 35.5
# (42.2), 36864x4608 sym 42.7 -> 35.1, 4096x22016 sym 22.2 -> 17.4. With BPS (above) two more: k24/n28 int4 (mixgemm
# bench, one run, one layout: 4096x14336 sym 12.7 -> 10.5 us, plain 11.3; zero point 12.5 -> 11.0; 3584x14336 11.5 ->
# 9.7; 3584x18944 12.3 on the rule) and k24/n24 int8 (4096x4096 6.4 -> 5.7, plain 6.5; 4608x4096 7.2 -> 6.6). And
# k28/n24 int4, BPS 1 (one block a SM, as measured): RT 2 U 1 PF 1 KS 32, 32-warp blocks of <= 64 registers (no
# spill in the groups-of-128 builds, 1-6 spilled words in the groups-of-32 ones). Why KS 32: each warp's slice of
# these long rows is half as long, so the pipeline's ramp and drain take half the time in a kernel of ~10 us. H200,
# tools/bench/wg_simt_diag.py (one run, 2026-11-28, us, the tile before -> this one): fp16 x, W4 g128 sym 14336x3584
# 10.53 -> 9.73, 14336x4096 11.08 -> 10.38, 18944x3584 13.65 -> 12.51, and two layers of the bucket outside the model
# list, 16384x4096 12.35 -> 11.67, 17408x3584 12.67 -> 11.54 (plain codes' GEMV 10.04 / 10.88 / 13.02 / 12.28 /
# 12.19); zero point (PACK) 0.90-0.93x on the same five, GGUF groups of 32 sym / offset 0.94-0.98x; bf16 x, sym and
# zero point on the three model-list layers, 0.96-0.98x. The tile before (RT 2 U 2 PF 1 KS 16) had taken 14336x3584 sym
# 11.04 -> 10.56 us from the step-cost model's pick; KS 32 is outside that model's tile space (gemv_steps.wg_simt_tiles:
# KS 32 only for at most two 512-byte pieces in flight), so only this measured entry takes it.
_WG_SIMT_SOURCE_H200 = _WG_SIMT_SOURCE.replace("H100", "H200")
H200_WG_SIMT = _entries(_WG_SIMT_SOURCE_H200, [
    # (bits, K, N, (RT, U, PF, KS, RG[, BPS]))
    (4, 896, 4864, (2, 1, 1, 4, 1)), (4, 1536, 1536, (1, 2, 1, 4, 2)), (4, 1536, 2048, (2, 2, 0, 4, 1)),
    (4, 1536, 17920, (1, 2, 0, 4, 1)), (4, 2048, 256, (1, 2, 1, 8, 1)), (4, 2304, 9216, (1, 2, 0, 8, 1)),
    (4, 2048, 11008, (2, 2, 0, 8, 1)), (4, 2304, 18432, (1, 2, 0, 4, 1)), (4, 2048, 22016, (2, 2, 0, 8, 1)),
    (4, 3072, 9216, (1, 2, 0, 8, 1)), (4, 3072, 16384, (4, 2, 0, 8, 1)), (4, 4096, 6144, (2, 2, 1, 8, 1)),
    (4, 3584, 8192, (2, 2, 1, 8, 1)), (4, 4096, 11008, (2, 2, 0, 8, 1)), (4, 3584, 14336, (4, 2, 0, 8, 1, 2)),
    (4, 4096, 22016, (2, 2, 0, 8, 1)),
    (4, 3584, 28672, (4, 2, 0, 4, 1)), (4, 4608, 73728, (2, 2, 0, 4, 1)), (4, 5120, 5120, (4, 1, 1, 16, 1)),
    (4, 5120, 13824, (4, 2, 0, 8, 1)), (4, 5120, 27648, (2, 2, 0, 8, 1)), (4, 5120, 55296, (2, 2, 0, 4, 1)),
    (4, 8192, 1024, (1, 2, 0, 32, 1)), (4, 9216, 2304, (2, 2, 1, 16, 1)), (4, 8192, 3072, (2, 2, 1, 16, 1)),
    (4, 8192, 10240, (1, 2, 0, 8, 1)), (4, 8192, 28672, (2, 2, 0, 4, 1)), (4, 8192, 57344, (2, 2, 0, 4, 1)),
    (4, 13824, 5120, (4, 2, 0, 16, 1)), (4, 36864, 4608, (4, 2, 0, 16, 1)), (4, 27648, 5120, (4, 2, 0, 16, 1)),
    (4, 28672, 8192, (4, 2, 0, 16, 1)), (4, 14336, 3584, (2, 1, 1, 32, 1, 1)),
    (8, 896, 4864, (1, 1, 0, 4, 1)), (8, 1536, 2048, (1, 2, 0, 4, 1)),
    (8, 1536, 17920, (1, 2, 0, 4, 1)), (8, 2304, 9216, (1, 1, 1, 8, 1)), (8, 2048, 11008, (2, 2, 0, 8, 1)),
    (8, 2304, 18432, (1, 2, 0, 4, 1)), (8, 2048, 22016, (2, 2, 0, 8, 1)), (8, 3072, 9216, (1, 2, 0, 8, 1)),
    (8, 3584, 3584, (1, 1, 1, 16, 1, 2)), (8, 4096, 11008, (2, 2, 0, 8, 1)), (8, 3584, 14336, (1, 2, 0, 4, 1)),
    (8, 4096, 22016, (1, 2, 1, 8, 1)),
    (8, 3584, 28672, (1, 2, 0, 8, 1)), (8, 4608, 73728, (1, 2, 0, 8, 1)), (8, 5120, 5120, (1, 2, 0, 8, 1)),
    (8, 5120, 27648, (1, 2, 0, 8, 1)), (8, 5120, 55296, (1, 2, 0, 4, 1)), (8, 8192, 1024, (1, 2, 0, 32, 1)),
    (8, 9216, 2304, (1, 2, 0, 16, 1)), (8, 8192, 3072, (1, 2, 0, 16, 1)), (8, 8192, 10240, (1, 2, 0, 8, 1)),
    (8, 8192, 28672, (1, 2, 0, 8, 1)), (8, 8192, 57344, (2, 2, 1, 8, 1)), (8, 11008, 2048, (1, 1, 1, 32, 1)),
    (8, 13824, 5120, (1, 2, 0, 8, 1)), (8, 36864, 4608, (4, 2, 0, 16, 1)), (8, 27648, 5120, (1, 2, 0, 8, 1)),
], WgSimtTile)
# per GPU model (a substring of the device name): the tables above; a GPU without one uses the rule
WG_SIMT_M1 = {"H100": H100_WG_SIMT, "H200": H200_WG_SIMT}
# Zero-point weights (what GPTQ / AWQ checkpoints load as), looked up before the tables above: H100, M = 1, fp16
# activations, tools/bench/gemv_dispatch.py --simt-only --simt-pack --formats w4z over the 80 model-list layers (each
# tile of the grid with and without PACK, 2026-11-26), the entries printed by --suggest-simt --simt-formats w4z
# --simt-shipped --simt-worst 1.02: kept where the bucket's fastest common tile took <= 0.97x the time of the pick
# without this table (the tables above or the rule, PACK as PF says: kernels.cuda_gemv_wg_simt.host.wg_simt_packs) by
# geometric mean and at most 1.02x on each of its layers. 13 buckets; us, that pick -> the tile, same run: 4096x28672
# 28.26 -> 25.83, 3584x28672 25.64 -> 23.33, 17920x5120 23.52 -> 22.87, 5120x15360 19.70 -> 18.94, 3072x16384 12.00 ->
# 11.62, 4608x8192 9.67 -> 9.20, 896x4864 3.65 -> 3.35. The tuple's last field is PACK.
_WG_SIMT_ZP_SOURCE = ("tools/bench/gemv_dispatch.py --simt-only --simt-pack --formats w4z on the H100, the 80 "
                      "model-list layers (M = 1, fp16 activations; gemv_wg_simt.cu grid with and without PACK)")
H100_WG_SIMT_ZP = _entries(_WG_SIMT_ZP_SOURCE, [
    # (bits, K, N, (RT, U, PF, KS, RG, BPS, PACK))
    (4, 896, 4864, (2, 1, 1, 4, 1, 0, 1)), (4, 896, 9728, (1, 1, 1, 4, 2, 0, 1)),
    (4, 1536, 1536, (2, 1, 1, 8, 1, 0, 1)), (4, 1536, 2048, (2, 1, 1, 8, 1, 0, 0)),
    (4, 1536, 8960, (1, 1, 0, 8, 1, 0, 1)), (4, 1536, 17920, (2, 2, 1, 4, 1, 0, 1)),
    (4, 3072, 16384, (2, 2, 0, 8, 1, 0, 1)), (4, 4096, 6144, (2, 2, 0, 16, 1, 0, 1)),
    (4, 3584, 8192, (2, 1, 1, 16, 1, 0, 1)), (4, 3584, 28672, (2, 2, 0, 4, 1, 7, 0)),
    (4, 5120, 5120, (2, 1, 1, 16, 1, 0, 1)), (4, 5120, 13824, (2, 1, 1, 8, 1, 0, 1)),
    (4, 13824, 5120, (2, 2, 0, 16, 1, 0, 1)),
], WgSimtTile)
WG_SIMT_M1_ZP = {"H100": H100_WG_SIMT_ZP}
for _name, _tables in (("", WG_SIMT_M1), (" zero point", WG_SIMT_M1_ZP)):
    for _gpu, _table in _tables.items():
        for _bits, _entries_simt in _table.items():
            check_partition(_entries_simt, f"gemv_wg_simt M = 1 {_gpu} W{_bits}{_name}", complete=False)


def wg_simt_m1_entry(gpu_name: str, bits: int, k: int, n: int,
                     mode: str = "sym") -> tuple[str, BucketEntry] | None:
    """(table name, entry): the measured M = 1 tile of the CUDA-core GEMV on wgmma_v1 whose bucket holds a K x N layer
    on this GPU (for zero-point weights the zero-point table's first), or None."""
    tables = ((" zero point", WG_SIMT_M1_ZP),) if mode == "zero_point" else ()
    for name, by_gpu in (*tables, ("", WG_SIMT_M1)):
        for gpu, table in by_gpu.items():
            if gpu in gpu_name:
                hit = find(table.get(bits, ()), ShapeBucket.of(k, n))
                if hit is not None:
                    return gpu + name, hit
    return None
