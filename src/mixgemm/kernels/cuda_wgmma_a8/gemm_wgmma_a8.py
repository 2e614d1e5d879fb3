"""W4A8 / W8A8 GEMM on Hopper int8 tensor cores (CUDA C++ / inline PTX, gemm_wgmma_a8.cu, NVRTC for sm_90a).

``gemm_wgmma_a8(aq, sa, qw, bias, lo, hi, out_dtype, config=None, out=None)`` computes
``clamp(sum_g sA[:, g] * (aq_g @ c_g.T) * sW[:, g] + bias, lo, hi)``:

* aq: int8 [M, K] activation codes (``act_quant(x, group, "sym")``), unit stride along K, row stride a multiple
  of 16 bytes, on an sm_90 GPU. sa: float32 [M, G] their per-token, per-group scales, or [M, 1] one scale per
  token (``act_quant(x, K, "sym")``; over a grouped weight the fold is then sW * partial only, sA in the epilogue).
* qw: a QuantizedWeight [N, K] with ``a8_layout_supported(qw)``: mode "sym", 4 or 8 bits, group 128, 256 or
  per-channel (then G = 1). Its ``wgmma_a8_v1`` layout is built on first use and cached.
* bias: None or float16 / bfloat16 / float32 [N]; lo, hi: output clamp (may be +-inf).
* config: None (``default_config``) or a dict: BM (tokens per CTA = the wgmma N: 16..256, a multiple of 16;
  grouped weights hold BM / 2 fp32 accumulators and NP x BM / 2 int32 partials per thread, so BM <= 128 there), NWG
  (warpgroups of 64 weight rows: 1, 2, 4), MINB (CTAs per SM the registers must allow), STAGES (ring depth >= 3; 2
  with WS), KT (128-k tiles per stage: 1, 2, 4; a multiple of NP x the group's 128-k tiles), NP (int32 partials: 2 =
  fold under the next group's wgmmas, 1 = before them), CVT (0: cvt.rn.f32.s32, 1: magic number), GROUP_M (m-tiles
  rastered together), WS (1: a producer warpgroup and per-stage empty barriers, the default for NWG 1 and for NWG 2 with
  MINB 1; 0: thread 0 refills and a CTA barrier per stage), TSTORE (1, the default: a 16-bit output whose rows the
  TMA can address goes out by one TMA store per warpgroup tile, staged in the drained ring; 0: one store per
  element; the two are bit-equal), MC (1, or 2: two CTAs of the same tokens as a thread-block cluster, each loading
  half of the activation tile and multicasting it to both; needs WS and an even number of CTA column tiles,
  ceil(N / 16 / (4 NWG)); bit-equal to MC 1), PDL (1, the default with WS: programmatic dependent launch -- the
  first stages' weights are queued before griddepcontrol.wait, so the kernel starts during the activation
  quantizer's last wave; never on the first call after the layout is built, whose build kernels write the weights;
  MIXGEMM_PDL=0 turns it off everywhere), QS (1, the default: an int4 grouped weight whose scales are integer
  multiples of a per-channel step (formats/int_scales.py), under per-token activation scales and K <= QS_MAX_K, runs
  without the per-group fold -- codes times multiples as int8 in registers, one int32 sum over K; 0: the fold), FQ (a
  call plan with per-token scales: 1 quantizes the activations in the GEMM's own launch, ``launch_quantizing``,
  where the tile has the producer warpgroup and MC 1; the default where the call is bound by host time, see
  kernels/cuda_wgmma_a8; 0: the row quantizer's launch, then the GEMM), SPLIT (1, or 2..8: split-K over a thread-block
  cluster of that many CTAs per output tile, each a slice of K, the sums met in distributed shared memory; MC 1,
  per-element stores; ``split_slices`` gives the slices, ``split_k_rule`` the default's choice), TAIL (0, "auto" or
  2..8: the tiles of whole waves in one launch and the weight rows of the partial last wave in a second, cluster
  split-K launch, as the weight-only GEMM's TAIL; ``tail_rows``; not with SPLIT or a launch that quantizes),
  TAIL_WAIT (0, the default: the tail launch's CTAs start as the first launch's free their SMs, A8_CHAIN; 1: they
  wait for the whole first launch, as before A8_CHAIN -- an A/B switch).
* Returns [M, N] in out_dtype (float16 / bfloat16 / float32), or writes ``out``. Launched on the current stream,
  no host synchronization; allocates the output (unless given) and, for per-group activation scales (or a [M, 1]
  sa whose column is not contiguous), a transposed copy of sa [G, M_pad].
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch

from mixgemm.formats.activation import SYMMETRIC_ACT_MODES
from mixgemm.formats.layouts_wgmma_a8 import WgmmaA8Layout, a8_layout_supported, build_wgmma_a8_v1
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import pdl_on
from mixgemm.kernels.cuda_wgmma import gemm_wgmma
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import _MAP_PLACEHOLDER, SMEM_LIMIT, TensorMapParam, encode_tensor_map
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8_config import WgmmaA8Config
from mixgemm.tuning import source_of

SOURCE = "cuda_wgmma_a8/gemm_wgmma_a8.cu"
KERNEL = "mixgemm_gemm_wgmma_a8"
LAYOUT = "wgmma_a8_v1"
QS_MAX_K = (2**31 - 1) // (128 * 127)  # A8_QS: one int32 sum of K products |c m a| <= 128 * 127
_OUT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_XT = _OUT  # A8_XT: the activation dtype the in-launch quantizer reads (same codes)
# A8_FQ: 16-byte units of x a quantizer thread holds in registers (fp32 x takes two registers' worth per unit)
FQ_MAX_UNITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 8}
_BIAS = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}


def wgmma_a8_supported(aq: torch.Tensor, qw: QuantizedWeight, act_mode: str) -> bool:
    """True when this kernel runs the problem: an sm_90 GPU, symmetric activations ("sym" / "sym_full"), a
    ``wgmma_a8_v1`` weight, K % 16 == 0."""
    if (aq.device.type != "cuda" or act_mode not in SYMMETRIC_ACT_MODES or not a8_layout_supported(qw)
            or aq.shape[-1] % 16 or not nvrtc.nvrtc_available()):
        return False
    return torch.cuda.get_device_capability(aq.device) == (9, 0)


# default_config: MC 2 from this K and M (see there)
MC_MIN_K, MC_MIN_M = 16384, 2048


def column_tiles(n: int, nwg: int) -> int:
    """CTAs along N: 64 x NWG weight rows each (MC 2 pairs them, so it needs an even count)."""
    return math.ceil(-(-n // 16) / (4 * nwg))


def multicast_region(m: int, n: int, k: int) -> bool:
    """Where default_config takes MC 2 for grouped weights (long K, large M, CTA column tiles of its NWG 2 that pair
    up)."""
    return k >= MC_MIN_K and m >= MC_MIN_M and column_tiles(n, 2) % 2 == 0


# int8 per-channel weights: BM 256 tiles with MC 2 from this K (the shortest where whole calls measured faster than the
# Triton kernel; see default_config)
W8_WIDE_MIN_K = 3584


def w8_wide_region(m: int, n: int, k: int) -> bool:
    """Where default_config takes BM 256 / KT 2 / 2 stages with MC 2 for int8 per-channel weights (K >= W8_WIDE_MIN_K,
    M >= MC_MIN_M, CTA column tiles that pair up); the dispatcher keeps int8 per-channel on this kernel there at
    every M (mixgemm.tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M)."""
    return k >= W8_WIDE_MIN_K and m >= MC_MIN_M and column_tiles(n, 2) % 2 == 0


def qs_layout(lay: WgmmaA8Layout) -> bool:
    """True when A8_QS can run this layout (int4 groups with integer multiples of a channel step, K <= QS_MAX_K);
    it then takes per-token activation scales."""
    return lay.mults is not None and lay.k_padded <= QS_MAX_K


@dataclass(frozen=True)
class QuantizerSplit:
    """How the in-launch activation quantizer (A8_FQ) covers M rows of K: ``blocks`` quantizer blocks ahead of the
    GEMM's, groups of ``warps_per_row`` warps each quantizing one row at a time, ``units`` 16-byte pieces of x per
    thread in registers."""

    blocks: int
    warps_per_row: int
    units: int


def quantizer_split(m: int, k: int, warps: int, sm_count: int, max_units: int,
                    gemm_blocks: int = 0) -> QuantizerSplit | None:
    """The split for M rows of K over blocks of ``warps`` warps: each row held in registers (at most max_units pieces
    per thread), at most one block per SM (the GEMM's shared memory allows no more) on the SMs the GEMM's
    ``gemm_blocks`` leave free (at least a quarter of them: the GEMM's blocks then queue their weights beside the
    quantizer instead of after it); as many threads per row as still let one round of blocks take every row (rows
    per block = warps / warps_per_row), else the fewest that fit the registers (the blocks then take several rows
    each in turn). None when even a whole block cannot hold a row."""
    k8 = k // 8
    fits = [d for d in range(1, warps + 1) if warps % d == 0 and -(-k8 // (32 * d)) <= max_units]
    if not fits:
        return None
    slots = max(sm_count - gemm_blocks, sm_count // 4)
    rows_wanted = -(-m // slots)
    one_round = [d for d in fits if warps // d >= rows_wanted]
    wpr = max(one_round) if one_round else min(fits)
    rows = warps // wpr
    return QuantizerSplit(min(-(-m // rows), slots), wpr, -(-k8 // (32 * wpr)))


def split_slices(k_tiles: int, split: int, kt: int) -> int | None:
    """k-tiles per CTA of a SPLIT cluster: K's 128-k tiles over ``split`` slices, rounded up to whole stages of KT
    tiles (slices start on stage and group boundaries; gemm_wgmma.k_slices); None when that leaves a slice empty."""
    slices, per = gemm_wgmma.k_slices(k_tiles, split, kt)
    return per if slices == split else None


SPLIT_MAX_M = 64  # split_k_rule applies to default_config's small-M tiles, where it was measured
SPLIT_MAX = 4  # cluster splits the rule considers (measured 1, 2, 3, 4, 8: 8 never won)
SPLIT_MIN_STAGES = 2  # each slice keeps at least this many stages of KT k-tiles


def split_k_rule(m: int, n: int, k: int, bits: int, cfg: dict, nofold_bytes_min: int | None, sms: int,
                 cluster_slots: dict[int, int] | None = None) -> int:
    """SPLIT for the tile ``cfg`` from the wave count: where its CTAs leave SMs idle, the split with the fewest k-tiles
    per slice among those whose clusters all fit on the GPU at once (cluster_slots: clusters of S CTAs resident at
    once, fewer than SMs / S since a cluster must fit in one GPC; one CTA per SM, as these tiles' registers allow),
    each slice keeping SPLIT_MIN_STAGES stages. A split past one wave of clusters was slower than none (whole calls,
    H200, 3584x18944 at M = 5 / 16: 148 CTAs, SPLIT 3 in four waves of clusters 1.28-1.30x SPLIT 1's time).
    nofold_bytes_min: for per-channel weights (one int32 sum over K, little work per byte), split only where a CTA of
    SPLIT 1 streams at least this many weight bytes (below, the slices' pipeline fill costs what the extra SMs
    bring); None for grouped weights."""
    bm, nwg, kt = int(cfg["BM"]), int(cfg.get("NWG", 2)), int(cfg.get("KT", 2))
    tiles = -(-m // bm) * column_tiles(n, nwg)
    k_tiles = -(-k // 128)
    if tiles >= sms or (nofold_bytes_min is not None and k * 64 * nwg * bits // 8 < nofold_bytes_min):
        return 1
    best, best_per = 1, k_tiles
    for split in range(2, SPLIT_MAX + 1):
        per = split_slices(k_tiles, split, kt)
        if per is None or per < SPLIT_MIN_STAGES * kt or tiles > (cluster_slots or {}).get(split, sms // split):
            continue
        if per < best_per:
            best, best_per = split, per
    return best


def split_exchange_bytes(bm: int, nwg: int, split: int) -> int:
    """Shared memory the SPLIT reduction receives into (the drained ring): split - 1 peers' bands of ceil(BM / 8 /
    split) blocks, 16 bytes per consumer thread and block (wgmma_common.cuh cluster_band_reduce)."""
    return (split - 1) * -(-(bm // 8) // split) * 128 * nwg * 16


def tail_rows(m: int, n: int, cfg: dict, sms: int) -> tuple[int, int]:
    """Config key TAIL: (n0, split) -- weight rows [0, n0) run as whole waves of tiles, the rows past n0 as cluster
    split-K tiles of ``split`` slices; (0, 0) when TAIL is off or does not apply. The weight-only GEMM's rule
    (gemm_wgmma.tail_rows: split 2 where the partial wave's tiles fill at most half the SMs), with n0 kept to whole
    MC pairs of column tiles."""
    n0, split = gemm_wgmma.tail_rows(m, n, cfg, sms)  # (0, 0) with SPLIT > 1 too
    pair = 64 * int(cfg.get("NWG", 2)) * int(cfg.get("MC", 1))
    n0 = n0 // pair * pair  # (a multiple of 128 too: NWG 2, or MC 2 of NWG 1)
    return (n0, split) if 0 < n0 < n else (0, 0)


def tail_split_rule(m: int, n: int, cfg: dict, sms: int, slots: dict[int, int] | None) -> int:
    """TAIL for a config past the small-M tiles: 0 where no partial wave follows a whole one, else the most k-slices
    of gemm_wgmma.TAIL_SPLITS whose clusters, one per tile of the partial wave, all run at once (``slots``: clusters
    of each split the GPU holds at once, the table's wave model; without it, split 2 where they fill at most half the
    SMs).
    Why the most that fit: the callers take TAIL from K = tuning.A8_TAIL_MIN_K, where even four slices stay long, and
    there (H100, tools/bench/a8_tail.py, whole calls, medians of 3) every case measured ran fastest at that split or
    within 4% of it (36864x4608 W4A8 M = 1024: 16 tail tiles, split 4 0.88x split 2's time; 9216x2304 M = 1024 0.90-
    0.93x; M = 2048 32 tiles, split 3 0.95-0.97x), while a split whose clusters did not all fit lost (27648x5120 W8A8
    M = 1024, 56 tiles: split 3 / 4 1.05x split 2)."""
    n0, _ = tail_rows(m, n, {**cfg, "TAIL": 2}, sms)
    if not n0:
        return 0
    tail_tiles = gemm_wgmma.output_tiles(m, n - n0, int(cfg["BM"]), int(cfg.get("NWG", 2)))
    def held(s: int) -> int:  # clusters of s CTAs the GPU holds at once
        return slots.get(s, 0) if slots else (sms // 2 if s == 2 else 0)

    return max((s for s in gemm_wgmma.TAIL_SPLITS if tail_tiles <= held(s)), default=0)


def scratch_bytes(m: int, k: int) -> int:
    """The codes [M, K] int8, then scales [M_pad] (M_pad = M rounded up to 4), offsets [M] and code sums [M] (4 bytes
    each) that the in-launch quantizer writes (gemm_wgmma_a8.cu, A8_FQ)."""
    return m * k + 4 * (-(-m // 4) * 4) + 8 * m


def stage_bytes(bm: int, nwg: int, bits: int, kt: int, per_channel: bool) -> int:
    """Shared memory of one pipeline stage (must match gemm_wgmma_a8.cu's STAGE)."""
    warps = 4 * nwg
    raw = kt * (bm * 128 + warps * (1024 if bits == 4 else 2048) + (0 if per_channel else warps * 64 + bm * 4))
    return -(-raw // 1024) * 1024


def ring_stages(bm: int, nwg: int, bits: int, kt: int, per_channel: bool, least: int, most: int) -> int:
    """The pipeline stages of a tile: as many as its shared memory holds (1 KB kept for barriers), within
    [least, most] (a config past the memory is refused when prepared)."""
    return max(least, min(most, (SMEM_LIMIT - 1024) // stage_bytes(bm, nwg, bits, kt, per_channel)))


# default_config with QS (no fold): BM 256 tiles where they make at least this many CTAs (H100 / H200: 132 SMs)
QS_BM256_MIN_TILES = 96


def default_config(m: int, n: int, k: int, group_size: int, bits: int = 4, qs: bool = False) -> dict:
    """Tile choice from the problem size (deterministic): at M <= 64 one tile of M rounded up to 16 tokens with up to
    5 stages, else as many stages as fit, at most 4. qs: the call runs A8_QS (qs_layout and per-token activation
    scales)."""
    kt, nwg = 2, 2
    if m <= 64:
        # small M: one tile of tokens, M rounded up to the wgmma's 16 (the tokens past M are work for nothing: BM 16
        # against BM 64 took 0.62-0.92x the time at M = 5 and 16, H200, tools/bench/wgmma_a8.py, 8192x28672,
        # 4096x14336, 3584x18944, 5120x13824, W8 per-channel, W4 g128 per-block and per-token; NWG 1, BM 32 and 2 CTAs
        # per SM were slower), five stages, the group fold overlapping the next wgmmas (NP 2): BM 64 was the fastest
        # of the tiles measured before at M = 4 / 16 / 64 (H100, 2048x2048 .. 14336x4096; BM 128 with NP 1 ran
        # 1.2-1.4x longer)
        bm = 16 * -(-m // 16)
        stages = ring_stages(bm, nwg, bits, kt, group_size == k, 2, 5)
        # NP 2 needs KT a multiple of 2 x the group's 128-k tiles: group 256 takes NP 1
        np_ = 2 if group_size in (128, k) else 1
        return {"BM": bm, "NWG": nwg, "STAGES": stages, "KT": kt, "NP": np_, "CVT": 0, "GROUP_M": 8}
    bm = 16
    while bm < min(m, 128):
        bm *= 2
    stages = ring_stages(bm, nwg, bits, kt, group_size == k, 3, 4)
    # NP 1: folding a group while the warpgroup's own next wgmmas run (NP 2) measured 23-28% slower, also with the
    # four wgmmas issued back to back (docs/kernels/cuda_wgmma_a8.md)
    cfg = {"BM": bm, "NWG": nwg, "STAGES": stages, "KT": kt, "NP": 1, "CVT": 0, "GROUP_M": 8}
    # MC 2 (activation tile multicast over 2-CTA clusters) where it measured faster: long K at large M (GEMM only,
    # W4 g128 per-token, same-run medians: 28672x8192 M = 2048 / 4096 H100 925 -> 877 / 1857 -> 1742 us,
    # H200 914 -> 882 / 1878 -> 1796 us; 8192x28672 H100 +0.5..2%, H200 -1%); GROUP_M stays 8 (H100 28672x8192 with
    # MC 2, GROUP_M 8 / 16 / 4 / 2: M = 2048 873 / 864-866 / 905 / 921 us, M = 4096 1728 / 1799 us). The CTA column
    # tiles must pair up.
    if qs and m >= 256 and column_tiles(n, nwg) * -(-m // 256) >= QS_BM256_MIN_TILES:
        # no fold, so no fp32 accumulators: BM 256 tokens per CTA fits the registers and halves the weight bytes each
        # CTA pulls from L2 per MAC; MC 2 halves the activation bytes where K is long or M large. H100,
        # GEMM only, same-run medians of 3, us, BM 128 MC 2 / BM 256 MC 1 / BM 256 MC 2: 28672x8192 M = 1024 / 2048 /
        # 4096 406 / 355 / 345, 787 / 755 / 672, 1558 / 1590 / 1361; 8192x28672 M = 1024 / 2048 / 4096 437 / 379 /
        # 383, 871 / 805 / 741, 1640 / 1610 / 1488. BM 128 MC 1 against BM 256 MC 1 at M = 256: 8192x28672 (224 BM 256
        # CTAs) 123 / 108, 4096x14336 (112) 33.5 / 30.4, 28672x8192 (64) 101 / 159, 14336x4096 (32) 46 / 78
        cfg.update(BM=256, KT=2, STAGES=2)
        if column_tiles(n, nwg) % 2 == 0 and (m >= MC_MIN_M or k >= MC_MIN_K):
            cfg["MC"] = 2
        return cfg
    if bits == 8 and group_size == k and w8_wide_region(m, n, k):
        # int8 per-channel: BM 256 tokens per CTA halves the weight bytes each CTA pulls from L2 per MAC (the kernel
        # moves ~7.5 TB/s from L2 at BM 128); its 96 KB stage leaves room for 2, which the producer warpgroup keeps
        # full; MC 2 halves the activation bytes. Measured (H100, GEMM only, 3 s sustained windows,
        # bit-equal): 28672x8192 M = 2048 745 -> 720 us, 505 -> 488 mJ per call. Then (H100, GEMM only, same-run
        # medians of 3, us, BM 128 MC 1 / BM 128 MC 2 / BM 256 MC 1 / BM 256 MC 2 / the Triton kernel): 8192x28672
        # M = 2048 802 / 807 / 833 / 735 / 786, M = 4096 1596 / 1571 / 1672 / 1501 / 1587; 28672x8192 M = 2048
        # 738 / 724 / 791 / 694 / 761, M = 4096 1518 / 1445 / 1632 / 1385 / 1589: BM 256 pays only with MC 2. The
        # same on short K (H100, same run, M = 2048 / 4096 / 16384, us, BM 128 / BM 256 MC 1 / BM 256 MC 2 / Triton):
        # 4096x4096 64.4 / 59.7 / 57.0 / 63.4, 131.0 / 121.5 / 116.3 / 146.7, 504 / 498 / 458 / 502; 4096x14336
        # 229.8 / 209.8 / 197.2 / 219.6, 446 / 428 / 400 / 435, 1750 / 1731 / 1561 / 1646; 3584x18944 M = 4096 535 /
        # 503 / 461 / 515; 2048x8192 M = 4096 157.0 / 136.9 / 135.8 / 138.0. H200, M = 2048 / 4096, BM 256 MC 1 / MC 2
        # / Triton: 4096x4096 56.0 / 59.9 / 60.8, 114.6 / 117.1 / 126.0; 4096x14336 199.5 / 199.0 / 238.6, 402.6 /
        # 410.0 / 446.0; 5120x13824 M = 4096 477.8 / 473.3 / 582.8. Whole calls (mixgemm bench, H100, same run, M =
        # 2048 / 4096 / 16384, Triton -> BM 256 MC 2): 4096x14336 0.956 / 0.936 / 0.972x the time, 4096x4096 0.98x,
        # 3584x18944 0.984 / 0.987 / 0.957x, but 2048x8192 1.01-1.02x, so from K = 3584
        cfg.update(BM=256, KT=2, STAGES=2, MC=2)
        return cfg
    if multicast_region(m, n, k):
        cfg["MC"] = 2
    return cfg


# the token tiles a8_tiles ranks: default_config's BM 256 / BM 128 tiles of NWG 2, KT 2 and their neighbours
TOKEN_TILE_KINDS = ("w4 qs", "w8 per channel")


def token_tile_kind(bits: int, per_channel: bool, qs: bool) -> str | None:
    """The a8_tiles cost family of a weight whose tile default_config sizes by tokens alone (no per-group fold, so
    any BM up to 256 fits the registers): int4 with integer group scales under per-token activations (QS), int8 per
    channel; None for the folding tiles (BM <= 128)."""
    if bits == 4 and qs:
        return "w4 qs"
    if bits == 8 and per_channel:
        return "w8 per channel"
    return None


@dataclass(frozen=True)
class TokenTileCosts:
    """A GPU's ``a8_tiles`` section (mixgemm.tuning): what one round of CTAs of each token tile (BM tokens x 128 weight
    rows, KT 2, as many stages as fit) takes per 1024 k, by cost family and MC, fitted over whole rounds
    (tools/bench/a8_tile_fit.py); ``tail_round``: what a TAIL split's partial wave costs beyond 1 / split of a round;
    the model runs from ``from_m`` and moves a tile only where it estimates ``margin`` x less time."""

    from_m: int
    margin: float
    tail_round: float
    round_us: dict[tuple[str, int], dict[int, float]]  # (family, MC) -> {BM: us per round per 1024 k}
    source: str

    @classmethod
    def parse(cls, raw: dict, where: str) -> TokenTileCosts:
        source = source_of(raw, where, "the a8_tiles section")
        costs = {}
        for fam, by_mc in raw["round_us"].items():
            if fam not in TOKEN_TILE_KINDS:
                raise ValueError(f"{where}: unknown cost family {fam!r} (known: {', '.join(TOKEN_TILE_KINDS)})")
            for mc, by_bm in by_mc.items():
                bms = {int(b): float(v) for b, v in by_bm.items()}
                if any(b % 16 or not 16 <= b <= 256 or v <= 0 for b, v in bms.items()):
                    raise ValueError(f"{where}: {fam} MC {mc}: BM must be a multiple of 16 in 16..256, costs > 0")
                costs[(fam, int(mc.removeprefix("mc")))] = bms
        return cls(int(raw["from_m"]), float(raw.get("margin", 1.0)), float(raw.get("tail_round", 0.0)), costs,
                   source)


def token_tile(m: int, n: int, bits: int, per_channel: bool, qs: bool, cfg: dict, costs: TokenTileCosts, sms: int,
               tail_slots: dict[int, int] | None = None) -> dict:
    """``cfg`` (default_config's) with BM and STAGES from the wave count: each BM the costs list makes
    ceil(M / BM) x column_tiles CTAs, one per SM, so the call takes ceil(CTAs / SMs) rounds of that tile's round
    time; the cheapest BM replaces cfg's where it is estimated ``margin`` x faster. Why: a tile sized by M alone leaves
    a partial last wave on many layers (BM 256 on 4096x4608 at M = 2048: 288 CTAs, 2.2 waves, so 3 rounds; BM 192:
    396 CTAs in 3 rounds of a smaller tile), and a smaller or odd BM that fills its rounds wins more than its lower
    reuse costs. K scales every candidate alike, so it does not enter the choice. tail_slots (the calls that take
    TAIL, from tuning.A8_TAIL_MIN_K; clusters of each split held at once): a tile whose partial wave runs as TAIL
    split-K clusters (tail_split_rule) pays 1 / split + costs.tail_round of a round for it instead of a whole one."""
    fam = token_tile_kind(bits, per_channel, qs)
    bm0 = int(cfg["BM"])
    table = costs.round_us.get((fam, int(cfg.get("MC", 1))))
    if (fam is None or m < costs.from_m or not table or bm0 not in table or int(cfg.get("NWG", 2)) != 2
            or int(cfg.get("KT", 2)) != 2):
        return cfg
    cols = column_tiles(n, 2)

    def est(bm: int) -> float:
        whole, part = divmod(-(-m // bm) * cols, sms)
        rounds = whole + (part > 0)
        split = tail_split_rule(m, n, dict(cfg, BM=bm), sms, tail_slots) if tail_slots is not None and part else 0
        if split:
            rounds = whole + min(1.0, 1 / split + costs.tail_round)
        return rounds * table[bm]

    best = min(sorted(table, reverse=True), key=est)
    if est(best) * costs.margin >= est(bm0):
        return cfg
    return dict(cfg, BM=best, STAGES=ring_stages(best, 2, bits, 2, per_channel, 2, 4))


def _check(aq: torch.Tensor, sa: torch.Tensor, qw: QuantizedWeight, bias, out_dtype, out):
    if aq.dim() != 2 or aq.dtype != torch.int8:
        raise ValueError(f"aq must be int8 [M, K], got {aq.dtype} {tuple(aq.shape)}")
    if not aq.is_cuda or aq.device != qw.device:
        raise ValueError(f"aq ({aq.device}) and the weight ({qw.device}) must be on the same CUDA device")
    if aq.shape[1] != qw.in_features:
        raise ValueError(f"shape mismatch: aq has K={aq.shape[1]}, the weight K={qw.in_features}")
    if aq.stride(1) != 1 or aq.stride(0) % 16 or aq.data_ptr() % 16:
        raise ValueError("aq needs unit stride along K and 16-byte aligned rows")
    if not a8_layout_supported(qw):
        raise ValueError(f"the int8 wgmma GEMM takes sym int4 / int8 weights with group 128, 256 or per-channel, got "
                         f"mode={qw.mode!r} bits={qw.bits} group_size={qw.config.group_size}")
    g = qw.config.groups(qw.in_features)[1]
    if sa.dtype != torch.float32 or sa.shape not in ((aq.shape[0], g), (aq.shape[0], 1)) or sa.device != aq.device:
        raise ValueError(f"sa must be float32 [M, G] = {(aq.shape[0], g)} (per group) or [M, 1] (per token) on "
                         f"{aq.device}, got {sa.dtype} {tuple(sa.shape)} on {sa.device}")
    if out_dtype not in _OUT:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    if bias is not None and (bias.dtype not in _BIAS or tuple(bias.shape) != (qw.out_features,)):
        raise ValueError(f"bias must be float16/bfloat16/float32 [N={qw.out_features}], got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    if out is not None and (out.dtype != out_dtype or tuple(out.shape) != (aq.shape[0], qw.out_features)
                            or out.stride(1) != 1):
        raise ValueError("out must be a [M, N] tensor of out_dtype with unit stride along N")


@torch.compiler.disable
def gemm_wgmma_a8(aq: torch.Tensor, sa: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float,
                  hi: float, out_dtype: torch.dtype, config: dict | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring."""
    _check(aq, sa, qw, bias, out_dtype, out)
    m, k = aq.shape
    n = qw.out_features
    y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=aq.device)
    if m == 0 or n == 0:
        return y
    rows = gemm_wgmma.OutputRows(out_dtype, y.stride(0), y.data_ptr() % 16 == 0, aq.device)
    launch = prepare_wgmma_a8(qw, m, aq.stride(0), sa.shape[1] == 1, rows, config)
    return launch(aq, sa, bias, lo, hi, y)


def prepare_wgmma_a8(qw: QuantizedWeight, m: int, aq_row_stride: int, sa_per_token: bool,
                     out: gemm_wgmma.OutputRows, config: dict | None,
                     quantize_from: torch.dtype | None = None) -> WgmmaA8Launch | WgmmaA8TailLaunch:
    """The int8 GEMM's launch for M rows of codes (rows aq_row_stride apart) and per-token (sa [M, 1]) or per-group
    activation scales into an output with the rows ``out``, built once; call it with aq, sa, bias, lo, hi, y.
    quantize_from: the activation dtype, when the caller hands the activations themselves (per-token scales,
    aq_row_stride = K): the launch then quantizes them too where the tile allows (config FQ 1, A8_FQ) and is called
    through ``launch_quantizing`` (``.quantizes`` says whether it does). Config TAIL: two launches (tail_rows)."""
    n, k = qw.out_features, qw.in_features
    fresh = not qw.has_layout(LAYOUT)  # its build kernels write the weights read before griddepcontrol.wait: no PDL
    lay: WgmmaA8Layout = qw.layout(LAYOUT, build_wgmma_a8_v1)
    qs_ok = bool(sa_per_token and lay.num_groups > 1) and qs_layout(lay)
    cfg = dict(config) if config is not None else default_config(m, n, k, lay.group_size, lay.bits, qs=qs_ok)
    WgmmaA8Config.from_dict(cfg)  # (a ValueError naming a key the kernel does not have)
    tail = cfg.pop("TAIL", 0)
    tail_wait = int(cfg.pop("TAIL_WAIT", 0))
    if tail_wait not in (0, 1):
        raise ValueError(f"bad int8 wgmma TAIL_WAIT={tail_wait}: 0 (the tail launch overlaps the first) or 1")
    if tail and not (quantize_from is not None and int(cfg.get("FQ", 1))):  # (a launch that quantizes is one launch)
        from mixgemm.kernels.registry import device_info

        n0, split = tail_rows(m, n, {**cfg, "TAIL": tail}, device_info(out.device).sm_count)
        if n0:
            # the whole waves over weight rows [0, n0), then the partial wave's rows as split-K clusters (MC 1: a
            # cluster is the split's), so that wave takes about 1 / split of a tile's time; chained (A8_CHAIN) so
            # that the tail's CTAs start as the first launch's free their SMs, unless TAIL_WAIT
            tail_cfg = {**cfg, "SPLIT": split, "MC": 1}
            chain = (0, 0) if tail_wait else (1, 2)
            return WgmmaA8TailLaunch(
                _prepare_rows(qw, m, aq_row_stride, sa_per_token, out, cfg, None, 0, n0, fresh, chain[0]),
                _prepare_rows(qw, m, aq_row_stride, sa_per_token, out, tail_cfg, None, n0, n, fresh, chain[1]), n0)
    return _prepare_rows(qw, m, aq_row_stride, sa_per_token, out, cfg, quantize_from, 0, n, fresh)


def _prepare_rows(qw: QuantizedWeight, m: int, aq_row_stride: int, sa_per_token: bool, out: gemm_wgmma.OutputRows,
                  cfg: dict, quantize_from: torch.dtype | None, r0: int, r1: int, fresh: bool,
                  chain: int = 0) -> WgmmaA8Launch:
    """prepare_wgmma_a8's launch over weight rows [r0, r1) (r0 a multiple of the layout's 128-row blocks) into output
    columns [r0, r1); fresh: the layout was built for this launch (no PDL on its first call); chain: A8_CHAIN, the
    role in a TAIL pair (1 the whole waves, 2 the tail; with PDL only)."""
    k = qw.in_features
    n = r1 - r0
    out_dtype = out.dtype
    lay: WgmmaA8Layout = qw.layout(LAYOUT, build_wgmma_a8_v1)
    at = int(sa_per_token and lay.num_groups > 1)  # per-token activation scales over grouped weights
    qs_ok = bool(at) and qs_layout(lay)
    c = WgmmaA8Config.from_dict(cfg)
    bm, nwg, stages, kt = int(c.block_m), int(c.warpgroups), int(c.stages), int(c.k_tiles_per_stage)
    np_, cvt, group_m = int(c.partials), int(c.cvt_magic), int(c.group_m)
    minb = int(c.min_blocks)
    ws = int(c.producer_warpgroup if c.producer_warpgroup is not None else (nwg == 1 or (nwg == 2 and minb == 1)))
    mc = int(c.multicast)
    pdl_req = int(c.pdl if c.pdl is not None else ws)
    gt = 0 if lay.per_channel else lay.group_size // 128
    qs_req = int(c.int_scales)
    qs = qs_req == 1 and qs_ok
    fq_req = int(c.quantize_in_launch)
    ksplit = int(c.split)
    if (bm % 16 or not 16 <= bm <= 256 or nwg not in (1, 2, 4) or minb not in (1, 2, 3) or kt not in (1, 2, 4)
            or stages < (2 if ws else 3) or np_ not in (1, 2) or cvt not in (0, 1) or group_m < 1
            or kt % (np_ * max(gt, 1))
            or (gt and not qs and bm > 128) or ws not in (0, 1) or (ws and (nwg == 4 or (nwg == 2 and minb != 1)))
            or mc not in (1, 2) or (mc == 2 and not ws) or pdl_req not in (0, 1) or (pdl_req and not ws)
            or qs_req not in (0, 1) or fq_req not in (0, 1) or not 1 <= ksplit <= 8 or (ksplit > 1 and mc != 1)):
        raise ValueError(f"bad int8 wgmma tile {cfg}: BM 16..256 (multiple of 16; <= 128 for groups but QS), NWG 1, "
                         "2, 4, KT 1, 2 or 4 (a multiple of NP x 128-k tiles per group), STAGES >= 3 (2 with WS), NP 1 "
                         "or 2, CVT 0 or 1, GROUP_M >= 1, MINB 1..3, WS 0 or 1 (WS: NWG 1, or NWG 2 with MINB 1), MC 1 "
                         "or 2 (MC 2: WS), PDL 0 or 1 (PDL 1: WS), QS 0 or 1, FQ 0 or 1, SPLIT 1..8 (SPLIT > 1: MC 1)")
    col_tiles = column_tiles(n, nwg)
    if col_tiles % mc:
        raise ValueError(f"int8 wgmma tile {cfg}: MC {mc} pairs the CTAs along N, but N = {n} makes {col_tiles} "
                         f"column tiles of {64 * nwg} rows (not a multiple of {mc})")
    ring = stages * stage_bytes(bm, nwg, lay.bits, kt, lay.per_channel)
    smem = ring + 1024
    if smem > SMEM_LIMIT:
        raise ValueError(f"int8 wgmma tile {cfg} needs {smem} bytes of shared memory (limit {SMEM_LIMIT})")
    kt_per_split = lay.k_tiles
    if ksplit > 1:
        kt_per_split = split_slices(lay.k_tiles, ksplit, kt)
        if kt_per_split is None:
            raise ValueError(f"int8 wgmma tile {cfg}: SPLIT {ksplit} of K's {lay.k_tiles} 128-k tiles in stages of KT "
                             f"{kt} leaves a slice empty")
        if split_exchange_bytes(bm, nwg, ksplit) > ring:
            raise ValueError(f"int8 wgmma tile {cfg}: the SPLIT {ksplit} reduction needs "
                             f"{split_exchange_bytes(bm, nwg, ksplit)} bytes of the ring's {ring}")
    split = None
    if (fq_req and quantize_from is not None and sa_per_token and ws and mc == 1 and aq_row_stride == k
            and k % 16 == 0 and smem + 4 * bm + 256 <= SMEM_LIMIT):
        from mixgemm.kernels.registry import device_info

        warps = 4 * nwg + 4
        split = quantizer_split(m, k, warps, device_info(out.device).sm_count, FQ_MAX_UNITS[quantize_from],
                                column_tiles(n, nwg) * math.ceil(m / bm))
    if split is not None:
        smem += 4 * bm  # the token scales of the CTA's tile, behind the ring
        # SPLIT: whole clusters of quantizer blocks, so the GEMM's clusters start at a multiple of SPLIT in the grid
        split = QuantizerSplit(-(-split.blocks // ksplit) * ksplit, split.warps_per_row, split.units)
    # activation scales transposed to [G, M_pad] (M_pad % 4 == 0): one bulk copy per (group, m-tile) in the kernel.
    # One scale per token ([M, 1]: per-channel weights, or AT) is read as SA[m] in the epilogue only, so a contiguous
    # column goes in as it is (no transpose kernel between the quantizer and the GEMM)
    ldsa = -(-m // 4) * 4
    defs = {"A8_BITS": lay.bits, "A8_OUT": _OUT[out_dtype], **c.defines(), "A8_GT": gt, "A8_WS": ws, "A8_AT": at,
            "A8_QS": int(qs)}
    if ksplit > 1:
        defs["A8_SPLIT"] = ksplit
    if split is not None:
        defs.update(A8_FQ=split.units, A8_FQ_WPR=split.warps_per_row, A8_XT=_XT[quantize_from])
    pdl = bool(pdl_req and pdl_on(out.device))
    if pdl:
        defs["A8_PDL"] = 1
        if chain and split is None:
            defs["A8_CHAIN"] = chain
    ymap = None
    if int(c.tma_store) and ksplit == 1 and out.tstore_fits(bm, nwg, ring):
        # 64 output columns (128 bytes) x BM rows; the address is written per call
        ymap = TensorMapParam(encode_tensor_map(_MAP_PLACEHOLDER, m, n, out.row_stride, out_dtype, 64, bm))
        defs["A8_TSTORE"] = 1
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, out.device, arch_suffix="a")
    nvrtc.allow_dynamic_smem(fn, smem)
    # 128 k (bytes) x BM rows (MC 2: each CTA loads half); the address is written per call
    xmap = TensorMapParam(encode_tensor_map(_MAP_PLACEHOLDER, m, k, aq_row_stride, torch.int8, 128, bm // mc))
    tiles = col_tiles * math.ceil(m / bm)

    def rows_from(t: torch.Tensor) -> int:  # the address of 128-row block r0 / 128 of a [N_pad / 128, ...] tensor
        return t.data_ptr() + r0 // 128 * t.stride(0) * t.element_size()

    args = [
        ctypes.c_void_p(rows_from(lay.weight)),
        ctypes.c_void_p(rows_from(lay.mults if qs else lay.params)),
        ctypes.c_void_p(rows_from(lay.channel_steps if qs else lay.params)),
        ctypes.c_void_p(0),  # activation scales (per call)
        ctypes.c_int(ldsa),
        ctypes.c_void_p(0),  # y (per call)
        ctypes.c_int(out.row_stride),
        *nvrtc.bias_clamp_args(None, -math.inf, math.inf),  # per call
        ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(lay.k_tiles), ctypes.c_int(lay.num_groups),
        # A8_FQ (per call): x, its row stride, the codes, K, the scales (offsets and sums after them), the counters;
        # the quantizer blocks
        ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(k), ctypes.c_void_p(0),
        ctypes.c_void_p(0), ctypes.c_int(0 if split is None else split.blocks),
        xmap.value,
        # the output's tensor map by value (zeros when the kernel does not use it)
        ymap.value if ymap is not None else (ctypes.c_ubyte * 128)(),
        ctypes.c_int(kt_per_split),
    ]
    # WS: one more warpgroup, the producer
    grid = (tiles * ksplit + (0 if split is None else split.blocks), 1, 1)
    cluster = mc * ksplit
    launch = nvrtc.prepare_launch(fn, out.device, grid, (128 * (nwg + ws), 1, 1), args, smem, pdl=pdl,
                                  first_without_pdl=fresh, cluster=(cluster, 1, 1) if cluster > 1 else None)
    return WgmmaA8Launch(launch, lay, m, n, ldsa, xmap, ymap, out.device, split is not None)


def scales_arg(sa: torch.Tensor, m: int, ldsa: int) -> torch.Tensor:
    """The activation scales as the kernel reads them. One scale per token ([M, 1]: per-channel weights, or AT) is
    read as SA[m] in the epilogue only, so a contiguous column goes in as it is (no transpose kernel between the
    quantizer and the GEMM); scales per group are transposed to [G, M_pad]."""
    if sa.shape[1] == 1 and (sa.stride(0) == 1 or m == 1):
        return sa
    sat = torch.empty(sa.shape[1], ldsa, dtype=torch.float32, device=sa.device)
    sat[:, :m].copy_(sa.T)
    return sat


class _CodesCall:
    """The call of a prepared int8 GEMM on tensors: the scales as the kernel reads them, then launch_from."""

    def __call__(self, aq: torch.Tensor, sa: torch.Tensor, bias, lo: float, hi: float, y: torch.Tensor) -> torch.Tensor:
        sat = scales_arg(sa, self.m, self.ldsa)
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        return self.launch_from(aq.data_ptr(), sat.data_ptr(), bias, lo, hi, y)


class WgmmaA8TailLaunch(_CodesCall):
    """Config TAIL: the launch over weight rows [0, n0) (whole waves of tiles), then the split-K launch over the rest
    (the partial last wave), into the two column ranges of one output; called as a WgmmaA8Launch is."""

    quantizes = False

    def __init__(self, main: WgmmaA8Launch, tail: WgmmaA8Launch, n0: int):
        self.main, self.tail, self.n0 = main, tail, n0
        self.layout, self.m, self.n, self.ldsa = main.layout, main.m, n0 + tail.n, main.ldsa
        self.device = main.device

    def launch_from(self, aq_ptr: int, sat_ptr: int, bias, lo: float, hi: float, y: torch.Tensor,
                    stream: int | None = None) -> torch.Tensor:
        """WgmmaA8Launch.launch_from over both launches (the tail's output and bias from column n0)."""
        n0 = self.n0
        self.main.launch_from(aq_ptr, sat_ptr, bias, lo, hi, y, stream)
        self.tail.launch_from(aq_ptr, sat_ptr, None if bias is None else bias[n0:], lo, hi, y[:, n0:], stream)
        return y


class WgmmaA8Launch(_CodesCall):
    """The int8 GEMM prepared for one weight and M (a call plan's second step): a call writes the code, scale, output
    and bias pointers and the tensor maps' addresses, and launches. Holds the layout, so the weight pointers stay
    valid. Scales given per group (or per token but strided) are transposed to [G, M_pad] per call."""

    def __init__(self, launch, layout, m, n, ldsa, xmap, ymap, device, quantizes=False):
        self.launch, self.layout, self.m, self.n, self.ldsa = launch, layout, m, n, ldsa
        self.xmap, self.ymap, self.device = xmap, ymap, device
        self.quantizes = quantizes  # A8_FQ: call launch_quantizing (the activations), not the codes
        self._vals, self._lock = launch.params.values, launch.params.lock

    def launch_from(self, aq_ptr: int, sat_ptr: int, bias, lo: float, hi: float, y: torch.Tensor,
                    stream: int | None = None) -> torch.Tensor:
        """The product from codes at aq_ptr (rows as prepared) and activation scales at sat_ptr (float32 [M] per
        token, or [G, M_pad]), on ``stream`` (default: the current one)."""
        v = self._vals
        with self._lock:  # (launch.Params: parameters and tensor maps written and launched by one thread at a time)
            v[3].value = sat_ptr
            v[5].value = y.data_ptr()
            nvrtc.set_bias_clamp(v, 7, bias, lo, hi)
            self.xmap.point_to(aq_ptr)
            if self.ymap is not None:
                self.ymap.point_to(y.data_ptr())
            self.launch(stream)
        return y

    def launch_quantizing(self, x: torch.Tensor, scratch_ptr: int, counters_ptr: int, bias, lo: float, hi: float,
                          y: torch.Tensor, stream: int | None = None) -> torch.Tensor:
        """The product of the activations x [M, K] (unit stride, 16-byte aligned rows), quantized in this launch into
        scratch_ptr (scratch_bytes(M, K) bytes, 16-byte aligned, free for this launch on ``stream``); counters_ptr:
        two int32 zeros kept for launches on ``stream`` (each launch leaves them zero). Needs ``quantizes``."""
        v = self._vals
        sq = scratch_ptr + self.m * v[18].value  # the scales after the codes [M, K] (K % 16 == 0: aligned)
        with self._lock:  # (launch.Params: parameters and tensor maps written and launched by one thread at a time)
            v[3].value = sq
            v[5].value = y.data_ptr()
            nvrtc.set_bias_clamp(v, 7, bias, lo, hi)
            v[15].value, v[16].value = x.data_ptr(), x.stride(0)
            v[17].value, v[19].value, v[20].value = scratch_ptr, sq, counters_ptr
            self.xmap.point_to(scratch_ptr)
            if self.ymap is not None:
                self.ymap.point_to(y.data_ptr())
            self.launch(stream)
        return y
