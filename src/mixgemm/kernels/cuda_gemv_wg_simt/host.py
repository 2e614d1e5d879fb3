"""The CUDA-core GEMV on wgmma_v1's host code (gemv_wg_simt.cu, compiled by NVRTC), M = 1, float16 / bfloat16
activations, on the wgmma GEMM's layout (a compacted weight's only copy of its codes): its tile rules
(``wg_simt_config``: one step a k-slice, the measured buckets, the step-cost model, the rule), its compile-time defines
and its launch (``prepare_wg_simt`` / ``gemv_wg_simt``). The call contract is mixgemm.kernels.cuda.gemv_launch's, at
one row of x without a permutation.
"""

from __future__ import annotations

import functools
import math

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import (
    _ACT,
    _MODE,
    _SCL,
    GemvLaunch,
    _prepare_and_run,
    k_tile_args,
    param_pair_packs,
)
from mixgemm.kernels.cuda.launch import pdl_on
from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile, resident_blocks
from mixgemm.kernels.cuda_gemv_wg_simt.config import GemvWgSimtConfig
from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1
from mixgemm.tuning.buckets import ShapeBucket, SourcedConfig
from mixgemm.tuning.gemv_m1 import wg_simt_m1_entry
from mixgemm.tuning.gemv_steps import wg_simt_step_costs

SIMT_SOURCE = "cuda_gemv_wg_simt/gemv_wg_simt.cu"
SIMT_KERNEL = "mixgemm_gemv_wg_simt"
WG_LAYOUT = "wgmma_v1"  # the wgmma GEMM's layout: the kernel reads no copy of its own


# The rule of the CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu) at M = 1: from WG_SIMT_BIG_BYTES of codes two row tiles
# per warp, two k-tiles a step, double buffered, at ~14 warps per SM; below, one tile, one k-tile a step, double
# buffered, at ~27 warps per SM (more warps with less each: a small layer is latency-bound). Source: the H100 grid of
# tools/bench/gemv_dispatch.py --simt-only (17 layers, W4 sym / zero point, W8): geometric mean 1.044x the grid's best
# per layer (one family for all sizes: 1.065x); over the 80 model-list layers 1.08-1.09x on int4 layers of >= 16 MiB,
# so tuning.gemv_m1.WG_SIMT_M1 keeps measured buckets per GPU (tools/bench/gemv_dispatch.py --suggest-simt).
WG_SIMT_BIG_BYTES = 16 << 20
WG_SIMT_WARPS_PER_SM = {True: 14, False: 27}
# Resident warps per SM of the small-layer int4 tile (U 1, PF 1) at RT 1 / 2 (NVRTC 13.0: 46-50 registers at RT 1, 64
# at RT 2), for the rule's wave guard (wg_simt_rule): RT 1 takes one 16-row tile a warp, so on a layer of a few
# hundred row tiles its blocks can spill just past one round of the SMs' resident slots (N 4608: 288 16-warp blocks
# against 264 slots), which RT 2 halves into one round. Source: tools/bench/gemv_dispatch.py --compact-only --wg-simt
# (H100, W4 g128 sym, M = 1, us, RT 1 -> RT 2 at the same U 1 PF 1 KS 16): 3584x4608 6.60 -> 5.81, 4096x4608 7.05 ->
# 6.24, while the layers of that bucket whose RT 1 blocks fit one round (N 3584 / 4096) are best at RT 1 or within 2%.
WG_SIMT_SMALL_RESIDENT_WARPS = {1: 40, 2: 32}


def wg_simt_blocks_per_sm(n: int, rt: int, rg: int, num_sms: int) -> int:
    """Blocks per SM (rounded up) of the CUDA-core GEMV on wgmma_v1 over N rows: one block per RG x RT 16-row tiles."""
    row_tiles = (n + 15) // 16
    blocks = (row_tiles + rt * rg - 1) // (rt * rg)
    return (blocks + num_sms - 1) // num_sms


def wg_simt_serves(n: int, rt: int, rg: int, bps: int, num_sms: int) -> bool:
    """Whether a measured M = 1 tile with blocks-per-SM limit ``bps`` (0: none) serves a layer of N rows."""
    return not bps or wg_simt_blocks_per_sm(n, rt, rg, num_sms) <= bps


# One step a k-slice for small layers: at M = 1 a layer of a few MiB is latency-bound, and the fastest tile is the one
# whose warps each issue their whole k-slice's loads at once: U 2 k-tiles a step, no double buffering, KS the power of
# two (<= 32) leaving at most two k-tiles a slice (at most WG_SIMT_ONE_STEP_MAX_STEPS steps where K needs KS past 32),
# one 16-row tile a warp, as long as all its warps fit in one round of the SMs' resident warps
# (gemv_steps.resident_blocks of the build's registers: past one round a second wave of warps costs more than the short
# slices save). Source: H200, 71 (layer, format) cases under 16 MiB of the model list (W4 g128 sym, W8 per channel, fp16
# x, compacted weights, best of two rounds): where it applies 0.51-0.92x the time of the dispatcher's choice before (the
# CUDA-core GEMV's rule or the tensor-core GEMV of the gemv_mma_m1 buckets; 3584x512 W4 3.59 -> 1.82 us, 896x9728 4.02
# -> 2.72, 4608x2048 4.52 -> 3.61, 896x4864 2.47 -> 1.98), level at two steps (8192x1024 1.01x); where its warps need a
# second round it lost (2304x4096 1.24x, 3584x4096 1.15x, 1536x8960 W8 1.18x), and at three steps and more (9216x2304
# 1.38x). Before / after (tools/bench/dispatch_ab.py, both configs forced, fp16 x, the 41 changed (layer, format)
# cases): H100 W4 sym 0.79x / W8 0.69-0.85x the time by geometric mean per size class (0.52-0.98x), H200 0.71-0.82x
# (0.51-1.00x).
WG_SIMT_ONE_STEP_MAX_STEPS = 2


@functools.cache
def wg_simt_registers(bits: int, act: int, scl: int, mode: str, cfg_items: tuple, arch: str = "sm_90") -> int:
    """Registers per thread of one gemv_wg_simt.cu build as the NVRTC here compiles it for ``arch`` (the cubin, no GPU;
    cached on disk like every build); 64 where no NVRTC can compile it."""
    if not nvrtc.nvrtc_available():
        return 64
    return nvrtc.build_registers(SIMT_SOURCE, tuple(sorted(simt_defines_for(bits, act, scl, _MODE[mode],
                                                                         dict(cfg_items)).items())), arch)


# bf16 x on a tile measured in fp16: the exact-fp16 conversion takes registers of its own, and where that leaves the
# SMs at most this share of the fp16 build's resident warps the tile's measured speed does not carry over. Source:
# H100, compacted bf16 M = 1 against the tensor-core GEMV (tools/bench/dispatch_ab.py, one run): the zero-point
# table's RT 2 U 2 PF 0 KS 16 PACK tile, 64 -> 76 registers (two 16-warp blocks a SM -> one), took 1.06-1.19x
# (4096x6144 7.80 -> 9.30 us, 13824x5120, 17920x5120) while the 21 other cases with fewer resident warps in bf16 (at
# most 0.75x fp16's) took 0.53-0.98x.
WG_SIMT_BF16_MIN_WARP_SHARE = 0.5


def wg_simt_bf16_warp_share(bits: int, scl: int, mode: str, cfg: dict, arch: str = "sm_90") -> float:
    """The bf16 build's resident warps per SM over the fp16 build's, for one CUDA-core GEMV on wgmma_v1 tile."""
    block = cfg["KS"] * cfg["RG"]
    warps = [resident_blocks(wg_simt_registers(bits, act, scl, mode, tuple(sorted(cfg.items())), arch), block) * block
             for act in (0, 1)]
    return warps[1] / warps[0]


def wg_simt_one_step_tile(k: int, mode: str = "sym") -> dict:
    """The one-step tile (above) for a K: KS the power of two in 2..32 leaving at most two k-tiles a slice where it can;
    PACK off for zero point / offset (wg_simt_packs: without double buffering the packed pair only costs its split)."""
    kt, ks = -(-k // 64), 2
    while ks < 32 and 2 * ks < kt:
        ks *= 2
    return wg_simt_packs({"RT": 1, "U": 2, "PF": 0, "KS": ks, "RG": 1}, mode)


def wg_simt_one_step(n: int, k: int, bits: int, num_sms: int, mode: str = "sym", act: int = 0, scl: int = 0,
                     arch: str = "sm_90") -> dict | None:
    """The one-step tile above where it applies (act / scl: the activation and scale codes of the build whose
    registers decide how many warps an SM holds; groups of 32 count as larger groups' build, as the rule was measured:
    with the G32 build's registers GGUF q4_1's 896x9728 lost it and took 1.37x the time, H100), else None."""
    cfg = wg_simt_one_step_tile(k, mode)
    kt, nt, ks = -(-k // 64), -(-n // 16), cfg["KS"]
    if kt > 2 * ks * WG_SIMT_ONE_STEP_MAX_STEPS:
        return None
    per_sm = resident_blocks(wg_simt_registers(bits, act, scl, mode, tuple(sorted(cfg.items())), arch), ks) * ks
    if nt * ks > per_sm * num_sms:
        return None
    return SourcedConfig(cfg, f"one step a k-slice (kernels.cuda_gemv_wg_simt.host.wg_simt_one_step): {nt * ks} warps "
                              f"within one round of {per_sm} a SM x {num_sms} SMs, {-(-kt // ks)} k-tiles a slice")


def wg_simt_config(n: int, k: int, bits: int, num_sms: int, gpu_name: str = "", mode: str = "sym", act: int = 0,
                   scl: int = 0, arch: str = "sm_90", one_step: bool = True, g32: int = 0) -> dict:
    """The M = 1 tile of the CUDA-core GEMV on wgmma_v1: one step a k-slice where that applies (wg_simt_one_step; not
    asked with one_step False), else the measured bucket's on this GPU for this mode (tuning.gemv_m1.wg_simt_m1_entry;
    measured with fp16 x, bf16 x takes it too) where the layer's blocks per SM are within the entry's BPS (an entry
    kept for layers whose blocks all fit on the SMs at once serves no layer that needs a second round: there the tile
    lost up to 1.25x), else the tile of least modelled cost for this activation dtype and group (wg_simt_modelled),
    else wg_simt_rule. Why the buckets first in bf16 too: against them the bf16 costs' tiles took 0.987x the time on the
    model-list layers but up to 1.15x on the widest (5120x55296: KS 2 where the bucket's KS 4 / 8 wins), H100."""
    one = wg_simt_one_step(n, k, bits, num_sms, mode, act, scl, arch) if one_step else None
    if one is not None:
        return one
    hit = wg_simt_m1_entry(gpu_name, bits, k, n, mode)
    if hit is None:
        return wg_simt_modelled(n, k, bits, num_sms, gpu_name, mode, "", act, g32)
    gpu, entry = hit
    t = entry.value
    where = f"gemv_m1 {gpu} wgmma_v1 W{bits}, {entry.where(ShapeBucket.of(k, n))}"
    if not wg_simt_serves(n, t.RT, t.RG, t.BPS, num_sms):
        per_sm = wg_simt_blocks_per_sm(n, t.RT, t.RG, num_sms)
        return wg_simt_modelled(n, k, bits, num_sms, gpu_name, mode,
                                f"{per_sm} blocks per SM of the tile of {where} exceed its BPS {t.BPS}", act, g32)
    cfg = {"RT": t.RT, "U": t.U, "PF": t.PF, "KS": t.KS, "RG": t.RG}
    return SourcedConfig(wg_simt_packs(cfg, mode, t.PACK), where)


class ModelledConfig(SourcedConfig):
    """A tile the step-cost model chose (wg_simt_modelled): it counted the resident warps of the activation dtype's
    build (bf16 x included; groups of 32 without a family of their own as larger groups'), so the bf16 warp-share guard
    for fp16-measured tiles (WG_SIMT_BF16_MIN_WARP_SHARE) does not apply."""


def wg_simt_modelled(n: int, k: int, bits: int, num_sms: int, gpu_name: str, mode: str, why: str,
                     act: int = 0, g32: int = 0) -> dict:
    """The tile of least modelled cost (gemv_steps.cheapest_wg_simt_tile, costs fitted per GPU, weight family,
    activation dtype and groups of 32 in tuning.gemv_steps.WG_SIMT; zero point / offset with PACK where PF is on, as
    timed; a groups-of-32 weight without a family of its own takes its larger groups' family, registers and costs),
    else wg_simt_rule (no fitted costs, e.g. int8 with a zero point; or no tile fits K). ``why``: why no measured bucket
    served ("" when there is none)."""
    for g in dict.fromkeys((g32, 0)):
        costs = wg_simt_step_costs(gpu_name, bits, mode, act, g)
        if costs is not None:
            break
    tile = cheapest_wg_simt_tile(n, k, bits, mode, num_sms, costs, act, g) if costs is not None else None
    pre = f"{why}; " if why else ""
    if tile is None:
        cfg = wg_simt_packs(wg_simt_rule(n, k, bits, num_sms), mode)
        return SourcedConfig(cfg, f"the rule: {why}") if why else cfg
    return ModelledConfig(wg_simt_packs(tile.config(), mode),
                          f"{pre}CUDA-core GEMV on wgmma_v1 step-cost model ({costs.source})")


def wg_simt_packs(cfg: dict, mode: str, pack: int | None = None) -> dict:
    """cfg with PACK (gemv_wg_simt.cu SIMT_PACK: a group's scale and zero point or offset held in one register) for
    zero-point and offset weights: ``pack`` where a measured entry gives it, else on with double buffering (PF). Why
    PF: the next step's parameters are loaded during this step's math, and split into two registers they are split
    where they arrive, so the warp waits for them there (in the SASS 6-25 instructions after the load); kept whole
    until used, the loads overlap the math as PF means them to. H100, tools/bench/gemv_dispatch.py --simt-only
    --simt-pack (M = 1, fp16 x), on the tiles the tables and rule give: W4 g128 zero point over the 80 model-list
    layers 0.966x the time by geometric mean where PF is on (44 layers; 3584x18944 19.8 -> 15.8 us; worst 1.02x),
    1.00x where it is off; W4 g32 offset (GGUF q4_1 / Q4_K blocks), 31 layers of >= 4 MiB, 0.941x where PF is on (15;
    1536x8960 7.18 -> 5.83, worst 0.997x), 1.00x where it is off. Over the whole grid the PF tile families took
    0.83-0.95x their unpacked time, the others 0.98-1.01x."""
    if mode == "sym":
        return cfg
    return {**cfg, "PACK": int(cfg.get("PF", 0) if pack is None else pack)}


def wg_simt_rule(n: int, k: int, bits: int, num_sms: int) -> dict:
    """The rule above: KS the power of two in 2..32 whose warps per SM come closest to the target, with at least two
    steps per k-slice (KS 32, 1024 threads, only for one tile in flight); an int4 layer under WG_SIMT_BIG_BYTES takes
    RT 2 where RT 1's blocks need a second round of the resident slots that RT 2's do not (wg_simt_rounds)."""
    nt, kt = -(-n // 16), -(-k // 64)
    big = n * k * bits // 8 >= WG_SIMT_BIG_BYTES
    rt, u, pf = (2, 2, 1) if big else (1, 1, 1)
    target = WG_SIMT_WARPS_PER_SM[big] * num_sms
    ks_all = [ks for ks in (2, 4, 8, 16, 32) if kt >= 2 * u * ks and (ks < 32 or rt * u * (1 + pf) <= 2)] or [2]
    ks = min(ks_all, key=lambda s: abs(math.log(-(-nt // rt) * s / target)))
    rg = max(1, 4 // ks)
    # the wave guard (WG_SIMT_SMALL_RESIDENT_WARPS): RT 1's blocks spill past a round of the slots that RT 2's fit in
    small_int4 = not big and bits == 4
    if small_int4 and wg_simt_rounds(n, 1, rg, ks, num_sms) > 1 and wg_simt_rounds(n, 2, rg, ks, num_sms) == 1:
        rt = 2
    return {"RT": rt, "U": u, "PF": pf, "KS": ks, "RG": rg}


def wg_simt_rounds(n: int, rt: int, rg: int, ks: int, num_sms: int) -> int:
    """Rounds of the SMs' resident slots that the small-layer int4 tile's blocks (RG x KS warps each) take over N rows
    at RT 1 or 2: its blocks per SM (wg_simt_blocks_per_sm) over the blocks an SM holds
    (WG_SIMT_SMALL_RESIDENT_WARPS)."""
    per_sm = max(1, WG_SIMT_SMALL_RESIDENT_WARPS[rt] // (rg * ks))
    return -(-wg_simt_blocks_per_sm(n, rt, rg, num_sms) // per_sm)


def simt_defines_for(bits: int, act: int, scl: int, mode: int, cfg: dict) -> dict:
    """NVRTC -D macros of one gemv_wg_simt.cu instantiation (config.GemvWgSimtConfig.build_defines)."""
    return GemvWgSimtConfig.from_dict(cfg).build_defines(bits, act, scl, mode, param_pair_packs(mode, scl))


@torch.compiler.disable
def gemv_wg_simt(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
                 cfg: dict) -> torch.Tensor:
    """The CUDA-core GEMV on wgmma_v1 (one float16 / bfloat16 row of x) with the tile ``cfg`` (wg_simt_config's
    keys)."""
    return _prepare_and_run(prepare_wg_simt, x2d, qw, bias, lo, hi, cfg, None)


def prepare_wg_simt(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device, cfg: dict,
                    act_order: bool = False) -> GemvLaunch:
    """The CUDA-core GEMV on wgmma_v1's launch for one row of x_dtype (float16 / bfloat16) with the tile ``cfg``,
    built once; call it with x2d, bias, lo, hi."""
    if m != 1 or act_order or x_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"the CUDA-core GEMV on wgmma_v1 takes one float16 / bfloat16 row of x without a "
                         f"permutation, got M={m} {x_dtype}{' with act-order' if act_order else ''}")
    n = qw.out_features
    fresh = not qw.has_layout(WG_LAYOUT)
    lay = qw.layout(WG_LAYOUT, build_wgmma_v1)
    cfg = {**cfg, "G32": int(lay.group_size == 32)}
    defines = simt_defines_for(qw.bits, _ACT[x_dtype], _SCL[qw.scales.dtype], _MODE[qw.mode], cfg)
    fn = nvrtc.get_function(SIMT_SOURCE, SIMT_KERNEL, defines, dev)
    grid = (-(-n // (16 * cfg["RG"] * cfg.get("RT", 1))), 1, 1)
    block = (32 * cfg["RG"] * cfg["KS"], 1, 1)
    args = k_tile_args(lay, n, m)
    return GemvLaunch(nvrtc.prepare_launch(fn, dev, grid, block, args, 0, pdl=pdl_on(dev), first_without_pdl=fresh),
                      lay, m, n, x_dtype, dev)
