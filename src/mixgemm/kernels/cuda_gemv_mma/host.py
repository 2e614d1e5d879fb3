"""The tensor-core weight-only GEMV's host code (gemv_mma.cu, compiled by NVRTC), M = 1..16, float16 / bfloat16
activations: its config rule (``mma_config``), its compile-time defines and its launch (``prepare_mma`` /
``gemv_mma``). It reads its own ``gemv_mma_v1`` layout (layout.py), the wgmma GEMM's ``wgmma_v1`` with config WG
(the int8 default, and for a compacted weight), or rows_v1 for a weight kept there. The call contract is
mixgemm.kernels.cuda.gemv_launch's.
"""

from __future__ import annotations

import functools

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import (
    _ACT,
    _MODE,
    _SCL,
    WARPS,
    GemvLaunch,
    _prepare_and_run,
    k_tile_args,
    param_pair_packs,
    wave_efficiency,
)
from mixgemm.kernels.cuda.launch import pdl_on
from mixgemm.kernels.cuda.rows_layout import ROWS_LAYOUT, build_rows_v1
from mixgemm.kernels.cuda_gemv_mma.config import GemvMmaConfig
from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1
from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1

MMA_SOURCE = "cuda_gemv_mma/gemv_mma.cu"
MMA_KERNEL = "mixgemm_gemv_mma"
MMA_LAYOUT = "gemv_mma_v1"
WG_LAYOUT = "wgmma_v1"  # config WG 1 (the int8 default): the wgmma GEMM's own layout, no copy of the GEMV's own


def mma_override(base: dict, forced: dict) -> dict:
    """A forced tensor-core config (kernel_options(configs={"cuda_gemv_mma": {...}})): its keys over ``base``, RG
    following a forced KS unless given."""
    cfg = {**base, **forced}
    if "KS" in forced and "RG" not in forced:
        cfg["RG"] = max(1, WARPS // cfg["KS"])
    return cfg


def choose_mma_config(mb: int, n: int, kt: int, num_sms: int, bits: int = 4) -> dict:
    """Tensor-core kernel tiles: each warp owns 16 rows; KS warps split K (power of two, 8 <= KS <= 16 where the
    k-tiles allow) until the grid holds MMA_WARPS_PER_SM[bits] warps per SM; U k-tiles (512 B per warp each) in flight
    per warp: 2, or 1 at the 16-row M bucket (mb 2) when each k-slice still gets 3 or more k-tiles (int4: with KS 8)."""
    nt = -(-n // 16)
    target = MMA_WARPS_PER_SM[bits] * num_sms
    ks = 1
    while ks < 16 and (ks < 8 or nt * ks < target) and kt >= 2 * ks:
        ks *= 2
    # at mb 2 a warp holds two 16-row x fragments and twice the accumulators: one k-tile in flight keeps more warps
    # resident, which pays once every slice has a few k-tiles to stream (int4 at KS 16 measured no gain)
    u = 1 if mb == 2 and kt >= 3 * ks and (ks <= 8 or bits == 8) else 2
    return {"U": u, "KS": ks, "RG": max(1, WARPS // ks), "PF": 0, "DEFER": DEFAULT_MMA_DEFER}


# Warps per SM the tensor-core GEMV's k-split aims for, per weight bit width. Source: the H100 sweep of (KS, U) on the
# 80 model-list layers at M = 1, 8 and 16 (docs/kernels/cuda_gemv_mma.md, tensor-core GEMV). Against the earlier rule
# (30 warps per
# SM, U 2), int4 with 16 and the U rule above: geometric mean of the time over the layers 0.986 / 0.983 / 0.975 at
# M = 1 / 8 / 16 (sym; zero point 0.989 / 0.989 / 0.973), 3584x4608, 5120x5120 and 27648x5120 15-20% faster, no
# layer slower. int8's k-tiles cover half the K of int4's: 24 with U 1 at M = 16 gave 0.997 at M = 1 and 0.97 at
# M = 16 (1536x256 at M = 16 7% slower, 3.8 -> 4.0 us), where 16 was 1.7% slower at M = 1.
MMA_WARPS_PER_SM = {4: 16, 8: 24}


# Where the tensor-core kernel applies the scale (gemv_mma.cu MMA_DEFER): 0 per weight pair, 1 exact q - z
# in the mma and one fp32 scale per tile (same speed on H200, more accurate). 1 needs each 16 x KT
# tile inside one group (defer_ok).
DEFAULT_MMA_DEFER = 1


def defer_ok(group_size: int, k_tile: int) -> bool:
    """Deferred scaling needs every k-tile of the mma layout inside one quantization group."""
    return group_size == -1 or group_size % k_tile == 0


def mma_defines_for(bits: int, act: int, scl: int, mode: int, mb: int, cfg: dict) -> dict:
    """NVRTC -D macros of one gemv_mma.cu instantiation (config.GemvMmaConfig.build_defines)."""
    return GemvMmaConfig.from_dict(cfg).build_defines(bits, act, scl, mode, mb, param_pair_packs(mode, scl))


def mma_x_smem_bytes(cfg: dict, mb: int) -> int:
    """Dynamic shared memory of the tensor-core GEMV on wgmma_v1 (MMA_WG): each warp's ring of (PF ? 2 : 1) x U
    slots of 8 * mb activation rows x 64 k in fp16 / bf16 (gemv_mma.cu); 0 on gemv_mma_v1."""
    if not cfg.get("WG", 0):
        return 0
    return cfg["RG"] * cfg["KS"] * (2 if cfg.get("PF", 0) else 1) * cfg["U"] * 8 * mb * 64 * 2


def mma_k_tiles(bits: int, k: int) -> int:
    """k units per row the config rule counts: gemv_mma_v1's k-tiles (64 k at 4 bits, 32 at 8; int8 on wgmma_v1 reads
    64-k tiles, two units each, with the configs the rule was measured with)."""
    kt = 64 if bits == 4 else 32
    return -(-k // kt)


def mma_config(m: int, n: int, k: int, bits: int, group_size: int, num_sms: int, mode: str = "sym",
               wg: int | None = None, one_wave_max_spill: float = 0.0, pair_packs: bool = False,
               x_dtype: torch.dtype = torch.float16, scale_dtype: torch.dtype = torch.float16,
               arch: str = "sm_90", wg_16row: bool = False) -> dict:
    """The tensor-core GEMV's config (choose_mma_config, at M 2..8 one_wave_k_split where a GPU's table measured it --
    ``one_wave_max_spill`` > 0 --, then mma_row_tiles for the build of x_dtype and scale_dtype on ``arch``, with the
    wgmma_v1 16-row tiles of wg_16row_tiles where the GPU's table measured them -- ``wg_16row``; DEFER off
    where a k-tile straddles groups; with ``pair_packs`` -- a 16-bit zero point / offset beside each fp16 / bf16 scale,
    param_pair_packs -- mma_pf_pack; int8 on wgmma_v1 at M 2..8: int8_k_slices) on the layout it reads: ``wg`` 1
    wgmma_v1, 0 gemv_mma_v1, None the bit width's default (MMA_ON_WGMMA)."""
    wg = MMA_ON_WGMMA[bits] if wg is None else wg
    mb = 1 if m <= 8 else 2
    cfg = {**choose_mma_config(mb, n, mma_k_tiles(bits, k), num_sms, bits), "WG": wg}
    if 2 <= m <= 8 and one_wave_max_spill > 0:
        cfg = one_wave_k_split(cfg, n, num_sms, one_wave_max_spill)
    cfg = mma_row_tiles(cfg, m, n, bits, mode, num_sms, mma_k_tiles(bits, k), _ACT[x_dtype], _SCL[scale_dtype],
                        arch, wg_16row)
    if not defer_ok(group_size, 64 if bits == 4 or wg else 32):
        cfg = {**cfg, "DEFER": 0}
    if mode == "sym" or (bits == 4 and pair_packs):
        cfg = mma_pf_pack(cfg, m, n, mma_k_tiles(bits, k), num_sms, pair=mode != "sym", bits=bits)
    if bits == 8 and wg and 2 <= m <= 8:
        cfg = int8_k_slices(cfg, k)
    return cfg


def int8_k_slices(cfg: dict, k: int) -> dict:
    """cfg with no more k-slices than the layer has 64-k tiles: the k-split rule counts int8 in 32-k units (the unit of
    the configs it was measured with), but wgmma_v1's tiles are 64 k, so K = 896 (14 tiles) got 16 slices and two warps
    of each block did nothing (KS 16 -> 8 at K = 896 took 0.65-1.01x the time on the H100:
    docs/kernels/cuda_gemv_mma.md, the tensor-core GEMV section)."""
    kt64, ks = -(-k // 64), cfg["KS"]
    while ks > max(1, kt64):
        ks //= 2
    return cfg if ks == cfg["KS"] else {**cfg, "KS": ks, "RG": max(1, WARPS // ks)}


# Where the int4 tensor-core GEMV double buffers (PF) with each group's zero point / offset pair held as the one word
# it was loaded as (PACK, gemv_mma.cu MMA_PACK). Why the pair: split on arrival, the next step's prefetched parameters
# stall the warp where they land (PF alone lost on most layers, 1.1-1.5x). Why only where the grid is thin: PF+PACK
# holds more registers (a 16-warp block 64 -> 86 at M = 16: one block per SM instead of two) and twice the x
# ring, which pays where the SMs hold few warps and loses where they are full. Source: tools/bench/gemv_dispatch.py
# --compact-only --mma-pack (W4 g128 zero point, M = 2, 8, 16, both layouts, PF and PACK on and off): H100 all 80
# model-list layers, H200 31 of >= 4 MiB, the same regions on both:
# * 16-warp blocks (KS 16) whose grid fits one block per SM, with EARLY: 0.66-0.82x at M = 16 on wgmma_v1, 0.72-0.94x
#   at M 2..8 on both layouts (past one block per SM 1.13-1.47x; on gemv_mma_v1 at M = 16, without EARLY, 1.03-1.16x);
# * M 9..16, smaller blocks, deferred scaling (one group per k-tile), a grid of at most MMA_PF_PACK_WARPS_PER_SM warps
#   per SM (one wave) and a full step per k-slice: 0.81-0.96x on both layouts (27-31 warps per SM: 1.14-1.33x; groups
#   of 32, two parameter sets a tile: 1.05-1.09x);
# * wgmma_v1 at M 2..8, smaller blocks, two full steps per k-slice, from MMA_PF_PACK_WIDE_WARPS_PER_SM warps per SM
#   (several waves): 0.90-0.99x on the H100, 0.92-1.03x on the H200 (few warps per SM: 0.96-1.03x, not taken).
# Over every measured case the rule's choice took (H100 / H200) 0.948 / 0.962x the time by geometric mean at M 2..8 on
# wgmma_v1, 0.922 / 0.951x at M = 16, on gemv_mma_v1 0.973 / 0.985x and 0.991 / 0.987x; the worst case it takes is
# 1.04x (2048x2048 M = 2, 2 us). Offset weights (GGUF q4_1 / Q4_K, groups of 32; H100, same sweep) 0.952 / 0.928 /
# 0.978 / 0.991x, worst 1.07x (2048x2048).
# Sym weights (one scale a group, nothing to split: PF alone), same sweep with --formats w4s,w8 (80 layers, H200 and
# H100, geometric mean H100 / H200, range over both):
# * 16-warp blocks at one per SM with EARLY, M 2..8, both layouts: int4 0.80-0.85x / 0.78-0.84x (0.68-1.02x), int8
#   (wgmma_v1) 0.88-0.90x / 0.84-0.87x (0.69-1.00x); M = 16 0.93-1.17x, not taken;
# * int4 on gemv_mma_v1 (M 2..16) and int8 (M 2..8), smaller blocks, one wave of at most MMA_PF_PACK_WARPS_PER_SM
#   warps per SM: int4 0.85x / 0.85x at M 2..8 and 0.92x / 0.94x at M = 16 (0.81-0.99x), int8 0.92x on the H200
#   (0.85-0.97x; no H100 layer's default lands there); int4 on wgmma_v1 0.97-1.09x, not taken; 27-31 warps per SM
#   1.03-1.33x;
# * int4 on wgmma_v1 at M 2..8, the zero point's wide region (two full steps a slice, from
#   MMA_PF_PACK_WIDE_WARPS_PER_SM warps per SM) up to MMA_PF_SYM_WIDE_MAX_WARPS_PER_SM, three waves of the 32 warps
#   an SM holds: 0.88-0.98x on the H100 and 0.88-0.998x on the H200 (35-83 warps per SM, 15 layers at M 2 and 8). Deeper
#   grids hide the latency with other warps' loads and lose the registers PF holds: 0.94-0.99x on the H100 but
#   0.95-1.065x on the H200 (105-279 warps per SM; `mixgemm bench` 8192x57344 M = 8 84.5 -> 91.8 us). int8 there
#   0.98x / 0.99x (up to 1.09x), not taken.
MMA_PF_PACK_WARPS_PER_SM = 24
MMA_PF_PACK_WIDE_WARPS_PER_SM = 32
MMA_PF_SYM_WIDE_MAX_WARPS_PER_SM = 96


def mma_pf_pack(cfg: dict, m: int, n: int, k_tiles: int, num_sms: int, pair: bool = True, bits: int = 4) -> dict:
    """cfg with double buffering where the measurements above say it pays (M 2..16, one row tile per warp): with PACK
    for int4 weights whose groups carry a zero point / offset pair (``pair``), alone for sym weights (one scale a
    group: nothing to split, so PF alone behaves as PF + PACK does; the sym regions below, int4 and int8)."""
    if m < 2 or cfg.get("RT", 1) != 1:
        return cfg
    warps = cfg["KS"] * cfg["RG"]
    blocks, _ = _mma_grid(cfg, n, num_sms)
    full_steps = k_tiles // (cfg["KS"] * cfg["U"])  # whole U-steps per k-slice (what PF overlaps)
    one_wave = blocks * warps <= MMA_PF_PACK_WARPS_PER_SM * num_sms and full_steps >= 1
    wide = full_steps >= 2 and blocks * warps >= MMA_PF_PACK_WIDE_WARPS_PER_SM * num_sms
    early_one_per_sm = bool(cfg.get("EARLY", 0)) and blocks <= num_sms  # (the 16-warp region, both weight kinds)
    if not pair:
        if warps >= 16:
            pays = m <= 8 and early_one_per_sm
        elif bits == 8:  # (int8 reads wgmma_v1, MMA_ON_WGMMA)
            pays = m <= 8 and bool(cfg["WG"]) and one_wave
        elif cfg["WG"]:
            pays = m <= 8 and wide and blocks * warps <= MMA_PF_SYM_WIDE_MAX_WARPS_PER_SM * num_sms
        else:
            pays = one_wave
        return {**cfg, "PF": 1} if pays else cfg
    if warps >= 16:
        pays = early_one_per_sm
    elif m > 8:
        pays = bool(cfg.get("DEFER", 0)) and one_wave
    else:
        pays = bool(cfg["WG"]) and wide
    return {**cfg, "PF": 1, "PACK": 1} if pays else cfg


# Where the tensor-core GEMV loads its first step's weights before the PDL wait (EARLY) and where a warp takes two row
# tiles (RT 2: one x fetch and one set of B fragments serve both). Source: H100, tools/bench/gemv_dispatch.py
# --compact-only (W4 g128 sym / zero point, the configs with and without timed side by side: M = 16 on the 80
# model-list layers, M = 8 on their 26 smallest, then both and bf16 M = 1 on 12 / 5 layers from 2 to 112 MiB).
# * M <= 8 (mb 1): EARLY made sym 0.78-0.99x (geometric mean 0.92x at M = 8, 0.91x at bf16 M = 1) and zero point
#   0.72-0.95x where the k-split is at its cap of 16 slices (few row tiles); on wider zero-point layers it was mixed
#   (0.92-1.37x), so off there. On wgmma_v1 0.86-0.99x at both.
# * M = 16, at most one block per SM: EARLY lost at sym on gemv_mma_v1 (1.10x: blocks that all start early mostly
#   wait), RT 2 everywhere; EARLY on wgmma_v1 0.93x. With more blocks: gemv_mma_v1 sym EARLY 0.64-0.75x at the cap,
#   0.94-0.98x on wider layers; zero point EARLY alone ~1.0x, with RT 2 0.70-0.80x at the cap, 1.2-1.4x below it.
#   wgmma_v1 (each warp copies its x rows through shared memory per 512-byte int4 tile, at M = 16 four times the
#   weight bytes; RT 2 halves that): EARLY with RT 2 0.76-0.81x at the cap and 0.82-0.90x on wide layers that keep
#   >= MMA_WG_RT2_WARPS_PER_SM warps per SM with half the warps; with fewer warps RT 2 lost (1.3x) and EARLY ~4%.
#   Over 12 layers at M = 16: gemv_mma_v1 0.89x (sym) / 0.93x (zero point), wgmma_v1 0.89x / 0.91x, none slower.
# * After the ring's copy addresses became per-lane constants (H100, M = 16, 23 of the model-list layers that took RT 2,
#   every second one, W4 g128 sym / zero point, RT 1 / 2 with and without EARLY side by side): at the k-split's cap
#   zero point takes EARLY with RT 1 (0.994x the plain layout's time by geometric mean against RT 2's 1.034x, faster on
#   8 of 9 layers: 4608x4096 8.51 -> 7.68 us, 14336x4096 19.8 -> 18.8; offset, which holds a second parameter per
#   group as zero point does, follows it untimed); sym keeps RT 2 there (1.10x against 1.30x).
#   On wide layers (KS 8 or less: 256-thread blocks) RT 2 lost where its blocks spill a little past one wave
#   (3072x16384, 5120x15360, 4096x14336: 1.12-1.22x against RT 1's 1.05-1.12x). The wave efficiency (waves over whole
#   waves) of each tile count, at the blocks per SM their registers allow (MMA_WG_BLOCKS_PER_SM), separates them: RT 2
#   lost on every layer where its efficiency was 0.66x RT 1's (waves 1.09-1.29) and won or tied from 0.89x (H100 and
#   H200, the other 22 layers of that list on the H200, 60 wide cases in all): wide layers take RT 2 only from
#   MMA_WG_RT2_MIN_WAVE_EFFICIENCY of RT 1's, which took those cases from 1.010x to 0.990x the plain layout's time
#   (best of the three 0.983x). It misses short K (896x9728: 1.75 k-tiles per slice, RT 2 1.14-1.36x).
# * int8 weights on wgmma_v1 (their default layout), M 2..16: EARLY. Same tool, 12 layers of 4-224 MiB (2048x2048 to
#   8192x28672, W8 per channel), M = 2, 8 and 16 with and without, after the ring's copy addresses became per-lane
#   constants: 0.86-0.96x the time on layers under 32 MiB (2048x2048 M = 2 3.41 -> 2.93 us, 4096x4096 M = 8 7.90 ->
#   7.17), 0.98-1.005x on the larger ones; RT 2 lost everywhere (up to 1.27x). M = 1 (bf16 on tensor cores) not timed.
MMA_WG_RT2_WARPS_PER_SM = 16
# Resident warps per SM of the tensor-core GEMV at the 16-row M bucket, by row tiles per warp: 64 registers at RT 1, 80
# at RT 2 with NVRTC 13.0 (int4 sym / zero point, int8; the occupancy query on the H200 gave 2 blocks of 16 warps and 4
# of 8 at RT 1; U 2 at zero point, 74 registers, holds one block of 16; offset, 75 at RT 1, was not timed and shares the
# constants); MMA_WG_BLOCKS_PER_SM are its 256-thread blocks. And the least wave efficiency against RT 1's at which a
# wide layer still takes RT 2 (measurements above).
MMA_RESIDENT_WARPS = {1: 32, 2: 24}
MMA_WG_BLOCKS_PER_SM = {rt: warps // 8 for rt, warps in MMA_RESIDENT_WARPS.items()}
MMA_WG_RT2_MIN_WAVE_EFFICIENCY = 0.8
# int4 on gemv_mma_v1 at the k-split's cap (16-warp blocks) past one wave of blocks: what the RT 1 build's registers
# leave. Two blocks per SM fit at <= 64 registers (EARLY alone). Above, one block per SM, and RT 2 (104-128) one too,
# with each warp on two row tiles; MINB 2 caps RT 1 at 64 registers for two blocks, which pays where the cap spills
# little (<= MMA_MINB2_MAX_REGISTERS) and each k-slice has MMA_MINB2_MIN_STEPS 64-k steps; else RT 2. The registers are
# the compiler's (mma_cap_registers): they follow neither the arithmetic nor one NVRTC version (bf16 zero point with
# 16-bit scales: 64 from NVRTC 13.5, more from 13.0, where the capped build took 0.68-0.78x the time of the uncapped
# one on the 15 model-list layers past one wave, H100).
# Measured (protocol graph timing through mixgemm.matmul, M = 9 and 16): fp16 zero point (74 registers, 52 bytes of
# spills under the cap), the 15 model-list layers that took RT 2 there, against RT 2 in the same run: H100 0.89-0.99x
# from K = 3072 (14336x3584 M = 16 19.4 -> 18.1 us, 18944x3584 M = 9 24.0 -> 21.4), 1.02-1.09x on K = 2048 / 2304
# (2-2.25 64-k steps per slice), 0.970x by geometric mean over all 30 cases; H200 0.91-0.95x on 11008x4096,
# 14336x3584, 14336x4096, 18944x3584. Offset (86 registers, 120 bytes of spills) took 1.3-1.5x: RT 2 there. bf16 sym
# (74 registers where fp16's build has 64), the 15 model-list layers past one wave at the cap (H100, both configs
# forced, M = 9 and 16): MINB 2 / RT 2 0.70x the time of the uncapped build by geometric mean (0.62-0.79x; 18944x3584
# M = 16 36.8 -> 23.0 us, 4096x4096 9.2 -> 7.3; fp16's own call 21.6 / 6.8), RT 2 on K = 2048 / 2304 (2048x2304 5.1 ->
# 3.8). docs/kernels/cuda_gemv_mma.md.
MMA_MINB2_MIN_STEPS = 3
MMA_MINB2_MAX_REGISTERS = 74
# That RT 1 build: the k-split at its cap, one row group, two k-tiles a step, the first step before the PDL wait,
# deferred scaling, the 16-row M bucket (the registers the rule asks about; PF / PACK are not taken there)
MMA_CAP_BUILD = {"U": 2, "KS": 16, "RG": 1, "PF": 0, "DEFER": 1, "WG": 0, "EARLY": 1}


@functools.cache
def mma_cap_registers(mode: str, act: int, scl: int, arch: str = "sm_90") -> int:
    """Registers per thread of MMA_CAP_BUILD (int4, ``mode``, activation / scale codes act / scl) as the NVRTC here
    compiles it for ``arch`` (the cubin, no GPU needed; cached on disk like every build); 64 (two blocks per SM) where
    no NVRTC can compile it, so a machine without one dispatches as if the build fit, and for fp32 x (act 2), which the
    tensor-core GEMV does not take."""
    if act not in (0, 1) or not nvrtc.nvrtc_available():
        return 64
    return nvrtc.build_registers(MMA_SOURCE, tuple(sorted(mma_defines_for(4, act, scl, _MODE[mode], 2,
                                                                        MMA_CAP_BUILD).items())), arch)


# The tensor-core GEMV's k-slice reduction keeps 1 KiB of static shared memory per k-slice and row tile of a block
# (gemv_mma.cu `red`), so a block holds at most this many (KS x RG x RT; 32 KiB of the 48 KiB static limit).
MMA_REDUCTION_TILES = 32


def mma_reduction_fits(cfg: dict) -> bool:
    """Whether a tensor-core GEMV config's k-slice reduction fits its shared memory (MMA_REDUCTION_TILES)."""
    return cfg["KS"] * cfg["RG"] * cfg.get("RT", 1) <= MMA_REDUCTION_TILES


def _mma_grid(cfg: dict, n: int, num_sms: int) -> tuple[int, int]:
    """(blocks, block slots per wave) of a tensor-core GEMV config's grid over N output rows: its blocks of KS x RG
    warps against the slots MMA_RESIDENT_WARPS leaves per SM (RT > 2, never a rule's choice, counted as RT 2)."""
    rt, warps = cfg.get("RT", 1), cfg["KS"] * cfg["RG"]
    row_tiles = -(-n // 16)
    blocks = -(-row_tiles // (cfg["RG"] * rt))
    per_sm = max(1, MMA_RESIDENT_WARPS.get(rt, MMA_RESIDENT_WARPS[2]) // warps)
    return blocks, per_sm * num_sms


def mma_waves(cfg: dict, n: int, num_sms: int) -> tuple[int, float]:
    """(blocks, waves) of a tensor-core GEMV config's grid over N output rows (_mma_grid)."""
    blocks, per_wave = _mma_grid(cfg, n, num_sms)
    return blocks, blocks / per_wave


def mma_wave_fill(cfg: dict, n: int, num_sms: int) -> tuple[int, float]:
    """(blocks, wave efficiency) of a tensor-core GEMV config's grid over N output rows (_mma_grid)."""
    blocks, per_wave = _mma_grid(cfg, n, num_sms)
    return blocks, wave_efficiency(blocks, per_wave)


def one_wave_k_split(cfg: dict, n: int, num_sms: int, max_spill: float) -> dict:
    """cfg with KS 8 instead of 16 where KS 16's blocks (two of 16 warps per SM) take 1 to ``max_spill`` waves and KS
    8's (four of 8 warps) fit in one: the same row tiles without a mostly empty second wave (a table's
    gemv_one_wave_k_split says where it was measured; int4 reaches KS 16 only under 264 row tiles, within a wave)."""
    if cfg["KS"] != 16 or cfg["RG"] != 1 or cfg.get("RT", 1) != 1:
        return cfg
    half = {**cfg, "KS": 8}
    if 1 < mma_waves(cfg, n, num_sms)[1] <= max_spill and mma_waves(half, n, num_sms)[1] <= 1:
        return half
    return cfg


def rt2_fills_waves(nt: int, rg: int, num_sms: int) -> bool:
    """Whether two row tiles per warp keep at least MMA_WG_RT2_MIN_WAVE_EFFICIENCY of one row tile's wave efficiency on
    wgmma_v1 at the 16-row M bucket (nt row tiles, rg row groups per block, MMA_WG_BLOCKS_PER_SM)."""
    eff = {rt: wave_efficiency(-(-nt // (rt * rg)), MMA_WG_BLOCKS_PER_SM[rt] * num_sms) for rt in (1, 2)}
    return eff[2] >= MMA_WG_RT2_MIN_WAVE_EFFICIENCY * eff[1]


# int4 sym on wgmma_v1 at the 16-row M bucket, where a GPU's table says it was measured (tuning: gemv_mma_wg_16row).
# Source: H200, M = 16 and 9, the compacted layers that run the tensor-core GEMV (21 of the model list, 8 others),
# each tile forced beside the dispatcher's (tools/bench/wg_16row.py; docs/kernels/cuda_gemv_mma.md, tensor-core GEMV
# section). At the
# k-split's cap with more than one block per SM the rule took RT 2 at KS 16; KS 8 at RT 1 and U 2, with the registers
# bounded for two 8-warp blocks a SM (MINB 2: the GPUs' NVRTC 13.0 then takes 94 registers where it takes 64 without),
# took 0.90-1.01x its time at M = 16 (17 layers; 4096x4096 6.99 -> 6.31 us) and 0.89-0.98x at M = 9 (13). Below the
# cap, where the wide rule left RT 1 (too few warps) although RT 2's blocks fit one wave, RT 2 with U 2 and EARLY took
# 0.88-0.95x at M = 16 (10 layers; 5120x5120 12.94 -> 11.54 us) and 0.89-0.97x at M = 9 (7), each k-slice with two
# full U 2 steps; past one wave (4096x14336: 448 blocks where 264 fit) it lost (1.05x).
WG_16ROW_CAP = {"KS": 8, "RG": 1, "RT": 1, "U": 2, "EARLY": 1, "MINB": 2}
# 8-warp blocks a SM of the RT 2 / U 2 tile below the cap (NVRTC 13.0: 128 registers)
WG_16ROW_RT2_BLOCKS_PER_SM = 2


def wg_16row_tiles(cfg: dict, nt: int, num_sms: int, k_tiles: int) -> dict | None:
    """The wgmma_v1 int4 sym tile at the 16-row bucket (measurement above) for cfg (the k-split rule's, more than one
    block per SM), nt row tiles and k_tiles 64-k tiles, or None where the rule's own RT / EARLY choice stands: at the
    k-split's cap WG_16ROW_CAP; below it RT 2, U 2, EARLY where its blocks fit one wave (WG_16ROW_RT2_BLOCKS_PER_SM),
    each k-slice gets two U 2 steps and the warps are too few for the wide rule's RT 2."""
    if cfg["KS"] >= 16:
        return {**cfg, **WG_16ROW_CAP}
    rt2 = {**cfg, "RT": 2, "U": 2, "EARLY": 1}
    one_wave = -(-nt // (2 * cfg["RG"])) <= WG_16ROW_RT2_BLOCKS_PER_SM * num_sms
    few_warps = nt // 2 * cfg["KS"] < MMA_WG_RT2_WARPS_PER_SM * num_sms
    if one_wave and few_warps and k_tiles >= 4 * cfg["KS"] and mma_reduction_fits(rt2):
        return rt2
    return None


def mma_row_tiles(cfg: dict, m: int, n: int, bits: int, mode: str, num_sms: int, k_tiles: int, act: int = 0,
                  scl: int = 0, arch: str = "sm_90", wg_16row: bool = False) -> dict:
    """EARLY and RT of the tensor-core GEMV's config (the measurements above). int4, M <= 8 (mb 1): EARLY, on
    gemv_mma_v1 at zero point / offset only where the k-split is at its cap (KS 16). The 16-row M bucket: with at
    most one block per SM, EARLY on wgmma_v1 only; with more, EARLY and RT 2 where the k-split is at its cap (on
    wgmma_v1 at zero point / offset: EARLY alone; on gemv_mma_v1 by what the RT 1 build's registers (act, scl: the
    activation and scale codes, compiled for arch) leave: EARLY alone at two 16-warp blocks per SM, else EARLY with
    the registers capped for two (MINB 2) where that spills little and each k-slice gets MMA_MINB2_MIN_STEPS of the
    k_tiles 64-k tiles, else EARLY and RT 2) or, on wgmma_v1, where half the warps still fill the GPU and RT 2's waves
    are not much emptier than RT 1's (rt2_fills_waves); EARLY alone on the other gemv_mma_v1 sym layers. int8 on
    wgmma_v1 at M >= 2: EARLY. ``wg_16row`` (a GPU's table measured it): int4 sym on wgmma_v1 in the 16-row bucket,
    fp16 x and scales, takes wg_16row_tiles where it applies."""
    if bits != 4:
        return {**cfg, "EARLY": 1} if cfg["WG"] and m >= 2 else cfg
    mb = 1 if m <= 8 else 2
    nt, wg, at_cap = -(-n // 16), cfg["WG"], cfg["KS"] >= 16
    if mb == 1:
        return {**cfg, "EARLY": 1} if wg or mode == "sym" or at_cap else cfg
    if -(-nt // cfg["RG"]) <= num_sms:
        return {**cfg, "EARLY": 1} if wg else cfg
    if wg and wg_16row and mode == "sym" and act == 0 and scl == 0:  # (as measured: fp16 x and scales)
        tiles = wg_16row_tiles(cfg, nt, num_sms, k_tiles)
        if tiles is not None:
            return tiles
    if wg and at_cap and mode != "sym":
        return {**cfg, "EARLY": 1}
    if not wg and at_cap:
        regs = mma_cap_registers(mode, act, scl, arch)
        if regs <= 64:
            return {**cfg, "EARLY": 1}
        if regs <= MMA_MINB2_MAX_REGISTERS and k_tiles >= MMA_MINB2_MIN_STEPS * cfg["KS"]:
            return {**cfg, "EARLY": 1, "MINB": 2}
    # wide: half the warps still fill the GPU, and (below the cap, 256-thread blocks) RT 2's waves are not much emptier
    wide = nt // 2 * cfg["KS"] >= MMA_WG_RT2_WARPS_PER_SM * num_sms
    if wide and wg and not at_cap:
        wide = rt2_fills_waves(nt, cfg["RG"], num_sms)
    if mma_reduction_fits({**cfg, "RT": 2}) and ((wg and (at_cap or wide)) or (not wg and at_cap)):
        return {**cfg, "EARLY": 1, "RT": 2}
    if wg:
        return cfg
    return {**cfg, "EARLY": 1} if mode == "sym" else cfg


# Which layout the tensor-core GEMV reads by default, per weight bit width: 1 = wgmma_v1 (the prefill GEMM's, so M <= 16
# and the GEMM share one copy of the codes), 0 = its own gemv_mma_v1. Source: H100, 18 model layers (Llama-3-8B / 70B,
# Llama-2-13B, Qwen2-7B, Qwen2.5-0.5B / 1.5B / 32B shapes), M = 1 / 8 / 16, protocol graph timing, same configs: int8
# per channel on wgmma_v1 geometric mean 0.97 / 0.97 / 0.93x the time on gemv_mma_v1 (0.75-1.33x per layer; more than
# 3% slower on 3584x4608, 1536x8960, 13824x5120 and 896x4864 at M <= 8, 8960x1536 and 896x4864 at M = 16), with bf16
# activations 0.88 / 0.86 / 0.88x; int4 g128 1.02-1.10x (sym 1.06 / 1.10 / 1.10x, up to 1.6x on small layers). After
# the ring's copy addresses became per-lane constants (14 layers, M = 2 / 8 / 16, gemv_dispatch.py --compact-only):
# int4 sym 1.00 / 1.00 / 1.06x, zero point 0.94 / 0.96 / 1.03x, up to 1.21x at M = 16 and 1.31x on small layers at
# M = 8, so int4 keeps its own layout (docs/kernels/cuda_gemv_mma.md).
MMA_ON_WGMMA = {4: 0, 8: 1}


@torch.compiler.disable
def gemv_mma(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
             cfg: dict, perm: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor-core GEMV (fp16 / bf16 activations) with the config ``cfg`` (mma_config's keys); perm: an
    act-order layer's kernel permutation (module docstring), applied while x is read."""
    if x2d.dtype == torch.float32:
        raise TypeError("the tensor-core GEMV takes float16 / bfloat16 activations, got float32")
    return _prepare_and_run(prepare_mma, x2d, qw, bias, lo, hi, cfg, perm)


def prepare_mma(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device, cfg: dict,
                act_order: bool = False) -> GemvLaunch:
    """The tensor-core GEMV's launch for M rows of x_dtype (float16 / bfloat16) with the config ``cfg``, built once;
    call it with x2d, bias, lo, hi (and an act_order layer's kernel permutation)."""
    n = qw.out_features
    rows = qw.resident == ROWS_LAYOUT  # an int8 weight kept in rows_v1: read there whatever the tile's WG says
    wg = bool(cfg.get("WG", 0)) and not rows
    cfg = {**cfg, "WG": int(wg), "ROWS": int(rows)}
    name, build = ((ROWS_LAYOUT, build_rows_v1) if rows else (WG_LAYOUT, build_wgmma_v1) if wg
                   else (MMA_LAYOUT, build_gemv_mma_v1))
    fresh = not qw.has_layout(name)
    lay = qw.layout(name, build)
    mb = 1 if m <= 8 else 2
    k_tile = 64 if wg or rows else lay.k_tile
    # DEFER 1 wherever every k-tile lies in one group, whatever the config asks: DEFER 0 rounds each row's offset term
    # (m + z s) to the activation dtype once, an error every k of the row shares (bf16, offset mode, per channel: 4-10%
    # relative at K 14336 with activations of mean 3, H100), at DEFER 1's speed; 0 only where a k-tile straddles
    # groups (int4 groups of 32 on 64-k tiles)
    cfg = {**cfg, "DEFER": int(defer_ok(lay.group_size, k_tile)), "PERM": int(act_order)}
    if wg:
        cfg = {**cfg, "G32": int(lay.group_size == 32)}
    if not mma_reduction_fits(cfg):
        raise ValueError(f"tensor-core GEMV config {cfg}: KS x RG x RT must be <= {MMA_REDUCTION_TILES} (the "
                         f"k-slice reduction keeps 1 KiB of shared memory per slice and row tile)")
    codes = (qw.bits, _ACT[x_dtype], _SCL[qw.scales.dtype], _MODE[qw.mode])
    fn = nvrtc.get_function(MMA_SOURCE, MMA_KERNEL, mma_defines_for(*codes, mb, cfg), dev)
    smem = mma_x_smem_bytes(cfg, mb)
    if smem:
        nvrtc.allow_dynamic_smem(fn, smem)
    nt = -(-n // 16)
    grid = (-(-nt // (cfg["RG"] * cfg.get("RT", 1))), 1, 1)
    block = (32 * cfg["RG"] * cfg["KS"], 1, 1)
    args = k_tile_args(lay, n, m)
    pdl = pdl_on(dev)
    return GemvLaunch(nvrtc.prepare_launch(fn, dev, grid, block, args, smem, pdl=pdl, first_without_pdl=fresh),
                      lay, m, n, x_dtype, dev)
