"""Weight-only linear (x float, W int4 / int8): the registry's entries, in the order the dispatcher tries them.

* ``cuda_gemv_mma``: the tensor-core GEMV (kernels/cuda/gemv_mma.cu), M <= 16, fp16 / bf16 (fp16 from M = 2: at
  M = 1 the CUDA-core kernel measured faster). It reads its own layout gemv_mma_v1 for int4 and the wgmma GEMM's
  wgmma_v1 for int8 (config key WG; kernels/cuda/gemv.py MMA_ON_WGMMA).
* ``cuda_gemv``: the CUDA-core GEMV (kernels/cuda/gemv.cu), M <= 16, any activation dtype.
  Both GEMVs serve M up to the GPU table's crossover (mixgemm.tuning.gemv_max_m), which depends on whether the wgmma
  GEMM or the Triton GEMM takes over above it.
* ``dequant_cublas`` (mixgemm.kernels.dequant_matmul): M >= 512 on sm_90, the weight dequantized into a transient
  float buffer and cuBLAS, where a race on the layer's first eager call measured it faster than the entry below.
* ``cuda_wgmma``: the Hopper wgmma GEMM (kernels/cuda/gemm_wgmma.cu), sm_90, fp16 / bf16, any M.
* ``triton_gemm``: the Triton tensor-core GEMM, any M, any GPU and activation dtype.

Run contract: ``run(x2d, qw, bias, lo, hi, config) -> [M, N]`` with x2d [M, K] unit stride along K, M >= 1; the
GEMVs also take ``perm=`` (an act-order layer's kernel permutation, mixgemm.ops.dispatch.kernel_perm) and gather x
through it while reading it. The GEMMs do not (their reason says so): the caller gathers x before them, which costs
little next to a prefill GEMM.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import torch

import mixgemm.tuning as tuning
from mixgemm.formats.weight import QuantizedWeight, narrow_group_reason
from mixgemm.kernels.dequant_matmul import ENTRY as DEQUANT_CUBLAS
from mixgemm.kernels.layouts import GEMV_MMA_V1, GEMV_V2, ROWS_V1, WGMMA_V1
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import (
    OK,
    DeviceInfo,
    KernelEntry,
    Layout,
    Problem,
    device_info,
    no,
    prefer_not,
    register,
    triton_ok,
)

GEMV_MAX_M = 16  # the GEMVs' own limit; the tuning table may lower it per bit width
_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def linear_problem(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device | DeviceInfo,
                   act_order: bool = False) -> Problem:
    n, k = qw.shape
    g, ng = qw.config.groups(k)
    dev = device if isinstance(device, DeviceInfo) else device_info(device)
    return Problem("linear", m, n, k, x_dtype, dev, qw.bits, g, ng, qw.mode, act_order=act_order,
                   resident=qw.resident, qw=qw)


@functools.cache
def nvrtc_ok() -> bool:
    from mixgemm.kernels.cuda import nvrtc

    return nvrtc.nvrtc_available()


def triton_device_ok(p: Problem) -> bool:
    return p.device.is_cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ------------------------------------------------------------------------------------------------------ GEMVs
def _gemv_common(p: Problem, dtypes) -> str | None:
    if not p.device.is_cuda:
        return "needs a CUDA device"
    if p.x_dtype not in dtypes:
        return f"activation dtype {p.x_dtype} (takes {', '.join(str(d) for d in dtypes)})"
    if p.bits not in (4, 8):
        return f"{p.bits}-bit weights"
    if not 1 <= p.m <= GEMV_MAX_M:
        return f"M={p.m} outside the GEMV's 1..{GEMV_MAX_M}"
    if narrow := narrow_group_reason(p.group_size, p.num_groups):
        return narrow
    if not nvrtc_ok():
        return "NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable"
    return None


def gemv_limit(p: Problem) -> int:
    """Largest M the GEMVs serve on this GPU: the table's crossover against the GEMM that takes over, raised (up to the
    GEMVs' own limit, or the rule's max_m) where the wgmma GEMM's launch would leave the GPU short (gemv_over_wgmma),
    and lowered below the M range of the table's wgmma_small_m_family on its buckets (_small_m_family_takes) and of its
    gemv_min_wave_fill where the tensor-core GEMV's own blocks would leave the GPU short (_gemv_underfills)."""
    return _gemv_limit(p)[0]


def _gemv_limit(p: Problem) -> tuple[int, str | None]:
    """(gemv_limit, why the small-M family or the wave-fill rule lowered it below p.m, or None)."""
    _, lim, _ = _table_limit_and_raise(p)
    if p.m > lim:
        return lim, None
    family = _small_m_family_takes(p)
    if family:
        return family[0] - 1, family[1]
    under = _gemv_underfills(p)
    if under:
        return p.device.table["gemv_min_wave_fill"]["m"][0] - 1, under
    return lim, None


def _small_m_family_takes(p: Problem) -> tuple[int, str] | None:
    """(the first M of the family's range, why) where the table's wgmma_small_m_family sends this M of this layer to
    the wgmma GEMM (a measured bucket: the family's pick beat the GEMVs and the table's tile on every layer of it),
    else None."""
    family = _small_m_family(p.device.table["name"])
    if family is None or p.qw is None or p.x_dtype not in _HALF:
        return None
    hit = family.covers(p.m, p.bits, p.k, p.n)
    if hit is None or "cuda_wgmma" in current_options().disable or not _wgmma_can_run(p).ok:
        return None
    name = p.device.table.get("name", "?")
    return family.m_range[0], (f"the wgmma GEMM's small-M tile family takes M {family.m_range[0]}..{family.m_range[1]} "
                               f"in this layer's bucket ({name}.json wgmma_small_m_family: "
                               f"{hit.where(tuning.ShapeBucket.of(p.k, p.n))})")


def _gemv_underfills(p: Problem) -> str | None:
    """Why the wgmma GEMM takes this M from the GEMVs (the table's gemv_min_wave_fill): at M in its range, on a layer
    of at least ``min_weight_bytes``, the tensor-core GEMV's blocks fill under ``min_fill`` of their waves
    (kernels.cuda.gemv.mma_wave_fill), where the GEMM's small-M cluster split fills the GPU; None where the rule does
    not apply (a wgmma_from_m region decides there itself)."""
    rule = p.device.table.get("gemv_min_wave_fill")
    if rule is None or not rule["m"][0] <= p.m <= rule["m"][1] or p.x_dtype not in _HALF:
        return None
    if p.n * p.k * p.bits // 8 < rule["min_weight_bytes"]:
        return None  # smaller layers: the GEMV's latency-bound blocks finish before the GEMM's fixed costs
    if "cuda_wgmma" in current_options().disable or not _wgmma_can_run(p).ok:
        return None
    if tuning.wgmma_from_m_entry(p.device.table, p.qw, p.k, p.n):
        return None  # the region's crossover decides
    from mixgemm.kernels.cuda.gemv import mma_config, mma_wave_fill

    cfg = mma_config(p.m, p.n, p.k, p.bits, p.group_size, p.device.sm_count, p.mode,
                     1 if p.resident == WGMMA_V1.name else None, x_dtype=p.x_dtype, scale_dtype=_scale_dtype(p),
                     arch=_arch(p))  # (the fill bar was measured on the RT rule's tiles, not wg_16row's)
    blocks, fill = mma_wave_fill(cfg, p.n, p.device.sm_count)
    if fill >= rule["min_fill"]:
        return None
    return (f"the tensor-core GEMV's {blocks} blocks fill {fill:.0%} of their waves (< {rule['min_fill']:.0%}, "
            f"{p.device.table.get('name', '?')}.json gemv_min_wave_fill): the wgmma GEMM's small-M cluster split "
            "fills the GPU")


def _table_limit_and_raise(p: Problem) -> tuple[int, int, str | None]:
    """(the table's GEMV / GEMM crossover, the largest M the GEMVs keep -- past it where tuning.gemv_over_wgmma says
    why --, that why or None)."""
    table = p.device.table
    wg = "cuda_wgmma" not in current_options().disable and _wgmma_can_run(p).ok
    lim = tuning.gemv_max_m(table, p.qw, p.n, wgmma=wg, k=p.k)
    if not wg or lim >= GEMV_MAX_M or p.m > GEMV_MAX_M or tuning.wgmma_from_m_entry(table, p.qw, p.k, p.n):
        return lim, lim, None
    from mixgemm.kernels.cuda.gemm_wgmma import output_tiles

    # the output tiles of the wgmma launch that would take this M over; split-K CTAs are not counted: at these M a
    # split's partial sums cost about what it recovers (measured: 3584x8192 at M = 16, split 2 over 64 tiles, 15.4 us
    # against the tensor-core GEMV's 9.6)
    m_over = max(p.m, lim + 1)
    cfg = _wgmma_config(replace(p, m=m_over))
    tiles = output_tiles(m_over, p.n, cfg["BM"], cfg.get("NWG", 2))
    kept = tuning.gemv_over_wgmma(table, p.bits, p.k, tiles, p.device.sm_count)
    if kept is None or kept[0] <= lim:
        return lim, lim, None
    return lim, min(kept[0], GEMV_MAX_M), kept[1]


def _past_crossover_note(p: Problem, cfg):
    """cfg, and where a GEMV runs past the table's crossover (gemv_over_wgmma) a SourcedConfig saying why."""
    lim, kept, why = _table_limit_and_raise(p) if p.m > 1 else (GEMV_MAX_M, GEMV_MAX_M, None)
    if why is None or not lim < p.m <= kept or cfg is None:
        return cfg
    src = getattr(cfg, "source", "")
    note = f"kept on the GEMV past the {p.device.table.get('name', '?')} table's crossover M={lim}: {why}"
    return tuning.SourcedConfig(cfg, f"{src}; {note}" if src else note)


def _gemv_crossover(p: Problem) -> str | None:
    lim, under = _gemv_limit(p)
    if under:
        return f"M={p.m}: {under}"
    if p.m > lim:
        return f"M={p.m} above the GEMV / GEMM crossover M={lim} ({tuning.table_name_for(p.device.name)} table)"
    return None


def _gemv_mma_can_run(p: Problem):
    why = _gemv_common(p, _HALF)
    if why:
        return no(why)
    why = _gemv_crossover(p)
    if why:
        return prefer_not(why)
    if p.resident == WGMMA_V1.name:
        return OK  # a compacted weight: the CUDA-core GEMV (plain codes) is not there to prefer
    if p.x_dtype == torch.float16 and p.m == 1 and not _in_gemv_mma_m1(p):
        return prefer_not(f"fp16 at M = 1 outside the {p.device.table.get('name', '?')} table's gemv_mma_m1 buckets "
                          "for this bit width: the CUDA-core GEMV measured faster")
    if (p.x_dtype == torch.bfloat16 and p.m == 1
            and tuning.gemv_simt_m1_bf16_entry(p.device.table, p.bits, p.k, p.n) is not None):
        return prefer_not(f"bf16 at M = 1 inside the {p.device.table.get('name', '?')} table's gemv_simt_m1_bf16 "
                          "buckets for this bit width: the CUDA-core GEMV measured faster")
    return OK


def _gemv_can_run(p: Problem):
    why = _gemv_common(p, _FLOAT)
    if why:
        return no(why)
    why = _gemv_crossover(p)
    return prefer_not(why) if why else OK


def _gemv_mma_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda.gemv import MMA_ON_WGMMA, mma_config

    on_wg = p.resident == WGMMA_V1.name
    cfg = mma_config(p.m, p.n, p.k, p.bits, p.group_size, p.device.sm_count, p.mode, 1 if on_wg else None,
                     _one_wave_max_spill(p), _pair_packs(p), p.x_dtype, _scale_dtype(p), _arch(p), _wg_16row(p))
    simt = _compact_m1_simt_tile(p) if on_wg else None
    if simt is not None:
        # the CUDA-core GEMV on the same bytes (gemv_wg_simt.cu; tuning.COMPACT_M1_SIMT_DTYPES)
        why = getattr(simt, "source", "the rule of kernels.cuda.gemv.wg_simt_config")
        return tuning.SourcedConfig({**cfg, **simt}, f"the weight keeps only wgmma_v1 (compacted): M = 1 on CUDA "
                                                     f"cores, tuning.COMPACT_M1_SIMT_DTYPES; {why}")
    if on_wg and not MMA_ON_WGMMA[p.bits]:
        # a compacted weight keeps only the GEMM's wgmma_v1: the x ring on it (gemv_mma.cu MMA_WG; for int4 RT 2 where
        # kernels.cuda.gemv.mma_row_tiles says, docs/kernels/cuda_gemv_mma.md)
        why = "the weight keeps only wgmma_v1 (compacted)"
        if p.m == 1 and p.x_dtype in tuning.COMPACT_M1_SIMT_DTYPES and _in_gemv_mma_m1(p):
            why += f"; M = 1 inside the {p.device.table.get('name', '?')} table's gemv_mma_m1 buckets"
        elif p.m == 1 and p.x_dtype == torch.bfloat16 and not p.act_order:
            why += ("; bf16 at M = 1: the CUDA-core GEMV's tile keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 "
                    "build's resident warps (registers), and the weight's family has no bf16 step costs")
        cfg = tuning.SourcedConfig(cfg, why)
    elif not on_wg and cfg.get("MINB", 0) > 1:
        # (mma_row_tiles capped the registers: say from what count, which is this machine's compiler's)
        from mixgemm.kernels.cuda.gemv import _ACT, _SCL, mma_cap_registers

        regs = mma_cap_registers(p.mode, _ACT[p.x_dtype], _SCL[_scale_dtype(p)], _arch(p))
        cfg = tuning.SourcedConfig(cfg, f"registers capped for two 16-warp blocks per SM (MINB 2): the uncapped build "
                                        f"takes {regs} (NVRTC, {_arch(p)}), one block past one wave")
    if p.resident == ROWS_V1.name and p.m > 1 and cfg.get("MINB", 0) < 2:
        # rows_v1 keeps x in registers (gemv_mma.cu MMA_ROWS): 70-96 of them leave one 16-warp block per SM; capped at
        # two blocks a SM it took 0.75-0.92x the time at M 2..16 (H100; docs/kernels/cuda_gemv_mma.md, Open items,
        # rows_v1)
        cfg = tuning.SourcedConfig({**cfg, "MINB": 2}, "rows_v1: registers capped for two blocks per SM (MINB 2)")
    return _past_crossover_note(p, cfg)


def _scale_dtype(p: Problem) -> torch.dtype:
    """The weight's scale dtype; a problem without its weight object counts as fp16 scales."""
    return torch.float16 if p.qw is None else p.qw.scales.dtype


def _arch(p: Problem) -> str:
    """The device's NVRTC target (sm_90 for a problem without one: the rules' reference GPU)."""
    major, minor = p.device.capability
    return f"sm_{major}{minor}" if major else "sm_90"


def _pair_packs(p: Problem) -> bool:
    """Whether the weight's groups carry a 16-bit zero point / offset beside an fp16 / bf16 scale (the tensor-core
    GEMV's PACK applies: kernels.cuda.gemv.mma_pf_pack)."""
    from mixgemm.kernels.cuda.gemv import weight_pair_packs

    return weight_pair_packs(p.mode, _scale_dtype(p))


def _one_wave_max_spill(p: Problem) -> float:
    """The table's gemv_one_wave_k_split bound (kernels.cuda.gemv.one_wave_k_split), 0 where it has none."""
    return float(p.device.table.get("gemv_one_wave_k_split", {}).get("max_spill", 0.0))


def _wg_16row(p: Problem) -> bool:
    """Whether the table measured the wgmma_v1 16-row tiles (kernels.cuda.gemv.wg_16row_tiles: gemv_mma_wg_16row)."""
    return "gemv_mma_wg_16row" in p.device.table


def _compact_m1_simt_tile(p: Problem) -> dict | None:
    """The tile a compacted weight's M = 1 call takes on the CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu), or None for
    the tensor-core GEMV: for the activation dtypes of tuning.COMPACT_M1_SIMT_DTYPES (not act-order, whose gather that
    kernel does not read), except on the small layers where the GPU's table sends the plain codes' fp16 M = 1 call to
    the tensor-core GEMV (gemv_mma_m1): its 16-way k-split wins there on wgmma_v1 too (tuning.COMPACT_M1_SIMT_DTYPES
    says where measured), unless the CUDA-core GEMV's one-step tile applies (kernels.cuda.gemv.wg_simt_one_step, which
    beat both there); and in bf16, for a tile not of the step-cost model (which counts the bf16 build's registers),
    not where the tile's bf16 build keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 build's resident warps: the
    step-cost model's tile for bf16 x there, the tensor-core GEMV where the family has no bf16 costs. H100, against
    the tensor-core GEMV those calls took before (tools/bench/dispatch_ab.py, W4 zero point, 6 layers): 0.805-0.892x
    the time."""
    from mixgemm.kernels.cuda.gemv import ModelledConfig, wg_simt_modelled

    if p.m != 1 or p.act_order or p.x_dtype not in tuning.COMPACT_M1_SIMT_DTYPES:
        return None
    one = _wg_simt_one_step(p)
    if one is None and _in_gemv_mma_m1(p):
        return None
    tile = one if one is not None else _wg_simt_config(p, one_step=False)
    if p.x_dtype != torch.bfloat16 or isinstance(tile, ModelledConfig) or _bf16_keeps_warps(p, tile):
        return tile
    modelled = wg_simt_modelled(p.n, p.k, p.bits, p.device.sm_count, p.device.name, p.mode,
                                "the bf16 build of the fp16-measured tile keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of "
                                "its fp16 build's resident warps", _x_code(p), _g32(p))
    return modelled if isinstance(modelled, ModelledConfig) else None


def _bf16_keeps_warps(p: Problem, tile: dict) -> bool:
    """Whether the CUDA-core GEMV's ``tile`` keeps more than kernels.cuda.gemv.WG_SIMT_BF16_MIN_WARP_SHARE of its fp16
    build's resident warps with bf16 x (its registers; else the tensor cores take the bf16 call)."""
    from mixgemm.kernels.cuda.gemv import _SCL, WG_SIMT_BF16_MIN_WARP_SHARE, wg_simt_bf16_warp_share

    return wg_simt_bf16_warp_share(p.bits, _SCL[_scale_dtype(p)], p.mode, tile, _arch(p)) > WG_SIMT_BF16_MIN_WARP_SHARE


def _x_code(p: Problem) -> int:
    """The CUDA-core GEMV on wgmma_v1's activation code for the problem's x (fp16 0, bf16 1; other dtypes, which it does
    not take, ask as fp16)."""
    from mixgemm.kernels.cuda.gemv import _ACT

    return _ACT[p.x_dtype] if p.x_dtype in (torch.float16, torch.bfloat16) else 0


def _wg_simt_one_step(p: Problem):
    from mixgemm.kernels.cuda.gemv import _SCL, wg_simt_one_step

    return wg_simt_one_step(p.n, p.k, p.bits, p.device.sm_count, p.mode, _x_code(p), _SCL[_scale_dtype(p)], _arch(p))


def _wg_simt_config(p: Problem, one_step: bool = True) -> dict:
    """The CUDA-core GEMV on wgmma_v1's M = 1 tile for this problem (kernels.cuda.gemv.wg_simt_config, its one-step
    rule asking the registers of this activation / scale dtype's build; one_step False: the table's or rule's tile)."""
    from mixgemm.kernels.cuda.gemv import _SCL, wg_simt_config

    return wg_simt_config(p.n, p.k, p.bits, p.device.sm_count, p.device.name, p.mode, _x_code(p),
                          _SCL[_scale_dtype(p)], _arch(p), one_step, _g32(p))


def _g32(p: Problem) -> int:
    """1 for groups of 32 (two parameter sets per 64-k tile: the CUDA-core GEMV on wgmma_v1's G32 build), else 0."""
    return int(p.group_size == 32)


def _in_gemv_mma_m1(p: Problem) -> bool:
    """Whether the GPU's table sends the plain codes' fp16 M = 1 call on this layer to the tensor-core GEMV."""
    return tuning.gemv_mma_m1_entry(p.device.table, p.bits, p.k, p.n) is not None


def _gemv_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda.gemv import simt_config

    return simt_config(p.m, p.n, p.k, p.bits, p.x_dtype, p.mode, p.device.sm_count, p.device.name)


def _gemv_mma_complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda.gemv import mma_override

    return mma_override(_gemv_mma_config(p), forced)


def _gemv_complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda.gemv import simt_override

    return simt_override(forced)


def one_axis_variants(base: dict, axes: dict, legal) -> list[dict]:
    """Tuning candidates: ``base`` with one key of ``axes`` ({key: values}) changed at a time, kept where
    ``legal(config)``; no duplicates, base itself left out (the tuner times it as the default)."""
    out: list[dict] = []
    for key, values in axes.items():
        for v in values:
            cfg = {**base, key: v}
            if cfg != base and cfg not in out and legal(cfg):
                out.append(cfg)
    return out


def _pow2_neighbours(v: int, lo: int, hi: int) -> list[int]:
    return [x for x in (v // 2, v * 2) if lo <= x <= hi]


def _gemv_mma_candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda.gemv import WARPS, mma_k_tiles, mma_reduction_fits

    base = _gemv_mma_config(p)
    kt = mma_k_tiles(p.bits, p.k)
    # the choose_mma_config space: KS a power of two <= 16 with kt >= 2 KS, RG = 8 warps / KS; U 1 or 2 k-tiles
    out = [{**base, "KS": ks, "RG": max(1, WARPS // ks)} for ks in _pow2_neighbours(base["KS"], 1, 16)
           if kt >= 2 * ks]
    out += one_axis_variants(base, {"U": (1, 2)}, lambda c: True)
    if not base.get("SIMT", 0):
        # the first weights before the PDL wait and two row tiles per warp (gemv.mma_row_tiles), absent keys read as
        # off; within the k-slice reduction's shared memory
        plain = {**base, "EARLY": base.get("EARLY", 0), "RT": base.get("RT", 1)}
        out += [c for c in one_axis_variants(plain, {"EARLY": (0, 1), "RT": (1, 2)}, mma_reduction_fits)
                if c not in out]
        if p.m > 1:
            # double buffering (with the zero point / offset pair in one register), or not (gemv.mma_pf_pack)
            flip = 1 - base.get("PF", 0)
            out.append({**base, "PF": flip, "PACK": flip} if p.mode != "sym" else {**base, "PF": flip})
        if p.m > 8 and base["KS"] * base["RG"] == 16 and base.get("RT", 1) == 1:
            # 16-warp blocks: registers capped for two of them per SM, or not (gemv.mma_row_tiles asks the compiler's
            # count; another NVRTC may count otherwise)
            out.append({**base, "MINB": 0 if base.get("MINB", 0) > 1 else 2})
    # the CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu) at its default tile: M = 1 from the GEMM's bytes (a compacted
    # weight's base may already be it), and at the other of its one-step tile and its table's / rule's (the one-step
    # rule's round of resident warps is a model)
    if p.m == 1 and not p.act_order:
        from mixgemm.kernels.cuda.gemv import wg_simt_one_step_tile

        simt = {**base, **_wg_simt_config(p)}
        for c in (simt, {**base, **_wg_simt_config(p, one_step=False)}, {**base, **wg_simt_one_step_tile(p.k, p.mode)}):
            if c != base and c not in out:
                out.append(c)
        if p.mode != "sym":
            # the zero point / offset parameter pair in one register or two (gemv_wg_simt.cu SIMT_PACK; a no-op with
            # fp32 scales)
            out.append({**simt, "PACK": 1 - simt.get("PACK", 0)})
    return out


def _gemv_candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda.gemv import WARPS, chunks_per_row
    from mixgemm.kernels.cuda.gemv_steps import ranked_tiles as step_ranked_tiles
    from mixgemm.tuning.gemv_steps import step_costs

    base = _gemv_config(p)
    if base.get("BULK", 0) or base["RG"] * base["KS"] != WARPS:
        return []  # a hand-tuned special tile (bulk ring): not varied
    # the choose_config space: KS a power of two <= 8 with RG = 8 warps / KS; at M = 1 R 2 or 4, U 1, 2 or 4 and
    # register double buffering (PF: the next step's weights in flight during this step's math)
    out = [{**base, "KS": ks, "RG": WARPS // ks} for ks in _pow2_neighbours(base["KS"], 1, WARPS)]
    if p.m == 1:
        out += one_axis_variants(base, {"R": (2, 4), "U": (1, 2, 4), "PF": (0, 1)}, lambda c: True)
        if p.mode == "zero_point" and p.x_dtype == torch.float16:
            # each tile also with the zero points through the x sum (gemv.cu GEMV_ZSUM), which changes the registers
            # and so the tile that fits best; not with PF, whose second buffer takes the registers it frees (the
            # sweep behind the tables found no PF tile among the winners)
            out += [c for c in ({**t, "ZSUM": int(not t.get("ZSUM", 0))} for t in [base, *out] if not t.get("PF", 0))
                    if c != base]
        # lanes per row (gemv.cu GEMV_LW): the default tile over the other lane widths of 32, 16 and 8, where every
        # k-slice's lane group gets a chunk of the row
        kc = chunks_per_row(p.bits, p.k)
        out += [{**base, "LW": lw} for lw in (32, 16, 8) if lw != base.get("LW", 32) and kc >= lw * base["KS"]]
        if p.x_dtype == torch.float16:
            # the step-cost model's cheapest tiles (kernels/cuda/gemv_steps.py): where its ranking is close, or the
            # layer sits in a measured bucket, the GPU decides
            extra = {key: base[key] for key in ("XS", "LITE") if key in base}
            for t in step_ranked_tiles(p.n, kc, p.bits, p.mode, p.device.sm_count,
                                       step_costs(p.device.name, p.bits, p.mode))[:STEP_MODEL_CANDIDATES]:
                c = {**t.config(), **extra}
                if c != base and c not in out:
                    out.append(c)
    return out


# the step-cost model's cheapest tiles that mixgemm tune times beside the default's neighbours at M = 1 (fp16)
STEP_MODEL_CANDIDATES = 4


# Act-order layers (Problem.act_order): where the GEMVs gather x through the permutation themselves (no extra launch,
# which a host-bound eager decode loop would pay for; the gather's loads come after their PDL wait, under the first
# weight loads), else the caller gathers first (at decode sizes on CUDA mixgemm's PDL gather kernel,
# mixgemm.kernels.cuda.gather_x). The CUDA-core GEMV gathers where x is staged in shared memory (fp16, M = 1,
# gemv.perm_config): once per block, from shared memory; its per-lane gathers from global memory (32 random addresses
# per warp load) only under kernel_options(act_order_gather="kernel"). The tensor-core GEMV gathers per lane up to
# tuning.MMA_GATHER_MAX_M rows (lanes of one k-quad share indices, so a warp load touches 4 * M addresses of x), any M
# under "kernel"; act_order_gather="caller" keeps every gather out of the kernels (tools/checks/actorder_gpu.py times
# the three).
def _gemv_perm(p: Problem, config: dict | None) -> str | None:
    from mixgemm.kernels.cuda.gemv import stages_perm

    mode = current_options().act_order_gather
    if mode == "caller":
        return "kernel_options(act_order_gather='caller')"
    if config is not None and stages_perm(config, p.m, p.x_dtype, p.bits, p.k):
        return None
    if mode == "kernel":
        return None
    return ("x is not staged in shared memory here (fp16 M = 1 and K * 4 bytes <= 64 KiB only), and per-lane gathers "
            "from global memory run only under kernel_options(act_order_gather='kernel')")


def _gemv_mma_perm(p: Problem, config: dict | None) -> str | None:
    mode = current_options().act_order_gather
    if mode == "caller":
        return "kernel_options(act_order_gather='caller')"
    if mode == "kernel" or p.m <= tuning.MMA_GATHER_MAX_M:
        return None
    return (f"M={p.m} above MMA_GATHER_MAX_M={tuning.MMA_GATHER_MAX_M} (per-lane gathers touch 4 * M addresses per "
            "load; tuning)")


def _run_gemv_mma(x2d, qw, bias, lo, hi, config, perm=None):
    from mixgemm.kernels.cuda.gemv import gemv_mma

    return gemv_mma(x2d, qw, bias, lo, hi, config, perm)


def _run_gemv(x2d, qw, bias, lo, hi, config, perm=None):
    from mixgemm.kernels.cuda.gemv import gemv_simt

    return gemv_simt(x2d, qw, bias, lo, hi, config, perm)


def _prepare_gemv_mma(p: Problem, qw, config):
    from mixgemm.kernels.cuda.gemv import prepare_mma

    gathers = p.act_order and _gemv_mma_perm(p, config) is None
    return prepare_mma(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, gathers)


def _prepare_gemv(p: Problem, qw, config):
    from mixgemm.kernels.cuda.gemv import prepare_simt

    gathers = p.act_order and _gemv_perm(p, config) is None
    return prepare_simt(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, gathers)


# ------------------------------------------------------------------------------------------------ wgmma GEMM
def _wgmma_can_run(p: Problem):
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if not p.device.sm90:
        return no(f"needs sm_90, the GPU is sm_{p.device.capability[0]}{p.device.capability[1]}")
    if p.x_dtype not in _HALF:
        return no(f"activation dtype {p.x_dtype} (takes float16 / bfloat16)")
    if p.bits not in (4, 8):
        return no(f"{p.bits}-bit weights")
    if narrow := narrow_group_reason(p.group_size, p.num_groups):
        return no(narrow)
    if not nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    return OK


@functools.cache
def _wave_cost(table_name: str):
    from mixgemm.kernels.cuda.wgmma_waves import WaveCost

    raw = tuning.load_table(table_name).get("wgmma_waves")
    return None if raw is None else WaveCost.parse(raw, f"{table_name}.json wgmma_waves")


@functools.cache
def _small_m_cost(table_name: str):
    from mixgemm.kernels.cuda.wgmma_waves import SmallMCost

    raw = tuning.load_table(table_name).get("wgmma_small_m")
    return None if raw is None else SmallMCost.parse(raw, f"{table_name}.json wgmma_small_m")


@functools.cache
def _small_m_family(table_name: str):
    from mixgemm.kernels.cuda.wgmma_waves import SmallMFamily

    table = tuning.load_table(table_name)
    raw = table.get("wgmma_small_m_family")
    if raw is None:
        return None
    if "wgmma_small_m" not in table:
        raise ValueError(f"{table_name}.json: wgmma_small_m_family extends the wgmma_small_m section, which is missing")
    return SmallMFamily.parse(raw, table["wgmma_small_m"], f"{table_name}.json wgmma_small_m_family")


def _table_tile_idles_sms(p: Problem, cfg: dict | None, small) -> bool:
    """Whether the table's wgmma config for p makes fewer output tiles than the small-M section's
    max_table_tiles_per_sm x the GPU's SMs (split-K not counted; 1 on the H200, 0.5 on the H100, where the table's KT 4
    tile with FOLD at 96-112 tiles beat the model's pick 1.06-1.18x on W4 4096 x 12288-14336) and
    is not serial split-K, nor stream-K where the section keeps it (keep_stream_k): the few-tile layers the small-M
    split model was measured on. With more tiles the table's tile stays (measured: where it already filled the SMs,
    e.g. W4 g128 3584 x 28672 and W8 4096 x 14336 at M = 16 on the H200, the model's tile took 1.2-1.45x its time), and
    so do serial split-K configs and the H200's stream-K ones (faster on the K >= 8192 rows they were tuned on:
    28672 x 8192 W4 at M = 16 57.0 us serial on the H100, 53.8 stream-K on the H200, against the model's 67.0 / 67.5;
    the H100's stream-K configs lost to it, 8192 x 8192 W4 33.1 against 22.6)."""
    from mixgemm.kernels.cuda.gemm_wgmma import default_config, output_tiles

    base = cfg if cfg is not None else default_config(p.m, p.n, p.k, p.device.sm_count)
    if (small.keep_stream_k and int(base.get("SK", 0))) or int(base.get("SERIAL", 0)):
        return False
    tiles = output_tiles(p.m, p.n, int(base["BM"]), int(base.get("NWG", 2)))
    return tiles < small.max_table_tiles_per_sm * p.device.sm_count


def _wgmma_config(p: Problem, small_m_family: bool = True) -> dict:
    """The wgmma GEMM's config for p (small_m_family False: as if the table had no wgmma_small_m_family section, the
    baseline its sweep measures the family against)."""
    from mixgemm.kernels.cuda.gemm_wgmma import auto_split, default_config

    cfg = tuning.table_entry(p.device.table, "wgmma", p.m, p.n, p.k, p.qw)
    family = _small_m_family(p.device.table["name"]) if small_m_family else None
    if family is not None and p.qw is not None and family.covers(p.m, p.bits, p.k, p.n):
        # a measured bucket of the small-M tile family: the variant and cluster split its models rank first
        from mixgemm.kernels.cuda.wgmma_waves import WeightBytes, choose_small_m_family

        w = WeightBytes(p.bits, p.qw.scales.element_size(), p.mode, p.group_size == 32)
        got = choose_small_m_family(p.m, p.n, p.k, w, family, p.device.sm_count)
        if got is not None:
            return tuning.SourcedConfig(got.config, f"{p.device.table['name']}.json wgmma_small_m_family: {got.note}")
    small = _small_m_cost(p.device.table["name"])
    if small is not None and p.qw is not None and _table_tile_idles_sms(p, cfg, small):
        # small M where the table's tile leaves SMs idle: the BM 16 tile with the cluster split the model ranks first
        # (kernels/cuda/wgmma_waves.py)
        from mixgemm.kernels.cuda.wgmma_waves import WeightBytes, choose_small_m

        w = WeightBytes(p.bits, p.qw.scales.element_size(), p.mode, p.group_size == 32)
        got = choose_small_m(p.m, p.n, p.k, w, small, p.device.sm_count)
        if got is not None:
            return tuning.SourcedConfig(got.config, f"{p.device.table['name']}.json wgmma_small_m: {got.note}")
    if cfg is None:
        return default_config(p.m, p.n, p.k, p.device.sm_count)
    cost = _wave_cost(p.device.table["name"])
    if cost is not None and p.qw is not None:
        # the table's tile against smaller tiles and cluster splits, from the wave count (kernels/cuda/wgmma_waves.py)
        from mixgemm.kernels.cuda.wgmma_waves import WeightBytes, choose

        w = WeightBytes(p.bits, p.qw.scales.element_size(), p.mode, p.group_size == 32)
        got = choose(p.m, p.n, p.k, cfg, w, cost, p.device.sm_count)
        if got is not None:
            return tuning.SourcedConfig(got.config, f"{cfg.source}; wave model ({p.device.table['name']}.json "
                                        f"wgmma_waves: {cost.source.split(' (')[0]}): {got.note}")
    if cfg.get("SPLIT", "auto") == "auto":
        cfg["SPLIT"] = auto_split(p.m, p.n, p.k, cfg, p.device.sm_count)
    return cfg


# the wgmma GEMM's small-M tile (a table's wgmma_small_m tile where it has one): BM 16 holds M <= 16 in one tile
SMALL_M_TILE = {"BM": 16, "NWG": 2, "STAGES": 4, "INFLIGHT": 1, "TMA": 1, "KT": 2, "GROUP_M": 1}
SMALL_M_TILE_MAX_M = 16


def small_m_family_candidates(p: Problem) -> list[dict]:
    """The small-M tile of p's GPU (its table's wgmma_small_m tile, else SMALL_M_TILE) in every variant and cluster
    split of the family (wgmma_waves.small_m_family_configs): what the family's sweep and mixgemm tune time."""
    from mixgemm.kernels.cuda.wgmma_waves import small_m_family_configs

    return small_m_family_configs(p.device.table.get("wgmma_small_m", {}).get("tile", SMALL_M_TILE))


def _wgmma_candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda.gemm_wgmma import TAIL_SPLITS, auto_split, stage_bytes, tail_rows, tile_error

    base = _wgmma_config(p)
    bits, bm = p.bits, int(base["BM"])
    scl = p.qw.scales.element_size() if p.qw is not None else 2

    def legal(cfg: dict) -> bool:
        if tile_error(cfg) is not None:
            return False
        # stages that do not fit would be cut back at launch (fit=True) and time the default's depth again
        sb = stage_bytes(int(cfg["BM"]), int(cfg.get("NWG", 2)), bits, scl, p.mode, p.group_size == 32,
                         int(cfg.get("KT", 1)), int(cfg.get("TMA", 1)))
        return int(cfg.get("STAGES", 4)) * sb + 1024 <= p.device.smem_optin

    def with_bm(v: int) -> dict:
        cfg = {**base, "BM": v}
        cfg["SPLIT"] = auto_split(p.m, p.n, p.k, cfg, p.device.sm_count)
        return cfg

    stages = int(base.get("STAGES", 4))
    out = [c for c in (with_bm(v) for v in _pow2_neighbours(bm, 8, 256)) if legal(c)]
    cost = _wave_cost(p.device.table["name"])
    tokens = cost.token_tiles if cost is not None else None
    if (tokens is not None and p.m >= tokens.from_m and p.bits in tokens.round_us and int(base.get("NWG", 2)) == 2
            and int(base.get("SPLIT", 1)) == 1 and not int(base.get("SK", 0))):
        # the token tiles' other BMs (wgmma_waves.TokenTiles: the model ranks them by rounds; tune times them)
        out += [c for c in ({**base, "BM": v, "TAIL": 0} for v in tokens.round_us[p.bits] if v != bm)
                if legal(c) and c not in out]
    axes = {"STAGES": (stages - 1, stages + 1), "GROUP_M": (1, 8)}
    if not int(base.get("SK", 0)):  # stream-K ignores SPLIT
        axes["SPLIT"] = (1, 2, 4, 8)
        if int(base.get("SPLIT", 1)) == 1 and tail_rows(p.m, p.n, {**base, "TAIL": 2}, p.device.sm_count)[0]:
            # a partial last wave: one launch, or TAIL's k-slices (the default takes the wave model's split)
            axes["TAIL"] = (0, *TAIL_SPLITS)
    out += [c for c in one_axis_variants(base, axes, legal) if c not in out]
    if p.m <= SMALL_M_TILE_MAX_M:
        # the small-M tile family, so that mixgemm tune reaches its variants on a GPU whose table has no fitted
        # wgmma_small_m_family section, and beyond the section's buckets where it has one
        out += [c for c in small_m_family_candidates(p) if legal(c) and c not in out and c != base]
    return out


def _run_wgmma(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.cuda.gemm_wgmma import gemm_wgmma

    # fit: the table's configs were measured on int4 fp16-scale weights, whose stages are the smallest
    return gemm_wgmma(x2d, qw, bias, lo, hi, config, fit=True)


def _prepare_wgmma(p: Problem, qw, config):
    from mixgemm.kernels.cuda.gemm_wgmma import prepare_wgmma

    return prepare_wgmma(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, fit=True)


# ----------------------------------------------------------------------------------------------- Triton GEMM
def _triton_can_run(p: Problem):
    if not triton_device_ok(p):
        return no("needs a CUDA device (or TRITON_INTERPRET=1)")
    if p.bits not in (4, 8):
        return no(f"{p.bits}-bit weights")
    if not triton_ok("mixgemm.kernels.triton.gemm"):
        return no("Triton unavailable")
    return OK


def _triton_config(p: Problem) -> dict:
    from mixgemm.kernels.triton.gemm import auto_split, default_config

    sms = p.device.sm_count
    cfg = tuning.table_entry(p.device.table, "gemm", p.m, p.n, p.k, p.qw)
    if cfg is None:
        return default_config(p.m, p.n, p.k, p.bits, p.per_channel, sms)
    if cfg.get("SPLIT_K", "auto") == "auto":
        cfg["SPLIT_K"] = auto_split(p.m, p.n, p.k, cfg, sms, p.bits)
    return cfg


def _triton_candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.triton.gemm import auto_split, tile_error

    base = _triton_config(p)

    def resplit(cfg: dict) -> dict:
        return {**cfg, "SPLIT_K": auto_split(p.m, p.n, p.k, cfg, p.device.sm_count, p.bits)}

    tiles = [resplit({**base, "BM": v}) for v in _pow2_neighbours(int(base["BM"]), 16, 128)]
    tiles += [resplit({**base, "BN": v}) for v in _pow2_neighbours(int(base["BN"]), 32, 256)]
    out = [c for c in tiles if tile_error(c) is None]
    axes = {"num_stages": (2, 3, 4), "num_warps": (4, 8), "SPLIT_K": (1, 2, 4)}
    return out + [c for c in one_axis_variants(base, axes, lambda c: tile_error(c) is None) if c not in out]


def _run_triton(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.triton.gemm import gemm

    return gemm(x2d, qw, bias, lo, hi, config)


def _gemm_perm(p: Problem, config: dict | None) -> str:
    return "the GEMMs read x in tiles without a gather; the separate gather is small next to a prefill GEMM"


def _on_rows(fn):
    """An entry's config (or complete) function that adds ROWS 1 for a weight kept in rows_v1: the same tiles as on the
    plain codes / wgmma_v1, read in rows_v1 (gemv.cu GEMV_ROWS, gemv_mma.cu MMA_ROWS, gemm_wgmma.cu WG_ROWS)."""

    @functools.wraps(fn)
    def wrapped(p: Problem, *args):
        cfg = fn(p, *args)
        if cfg is None or p.resident != ROWS_V1.name:
            return cfg
        out = {**cfg, "ROWS": 1, **({"WG": 0} if "WG" in cfg else {})}
        src = getattr(cfg, "source", "")
        return tuning.SourcedConfig(out, src) if src else out

    return wrapped


def _rows_or(layout: Layout):
    """layout_for: rows_v1 with config ROWS, else ``layout``."""
    return lambda config: ROWS_V1 if config and config.get("ROWS", 0) else layout


def _gemv_mma_layout(config: dict | None) -> Layout:
    """The tensor-core GEMV reads rows_v1 with config ROWS, the wgmma GEMM's wgmma_v1 with config WG (the int8
    default, and MMA_SIMT), else its own gemv_mma_v1."""
    if config and config.get("ROWS", 0):
        return ROWS_V1
    return WGMMA_V1 if config and config.get("WG", 0) else GEMV_MMA_V1


def _wgmma_complete(p: Problem, forced: dict) -> dict:
    return forced


ENTRIES = (
    KernelEntry("cuda_gemv_mma", "linear", _gemv_mma_can_run, _on_rows(_gemv_mma_config), _run_gemv_mma, GEMV_MMA_V1,
                "tensor-core GEMV, M <= 16 (int8: on wgmma_v1, or rows_v1)", _on_rows(_gemv_mma_complete),
                _gemv_mma_candidates, _gemv_mma_perm, prepare=_prepare_gemv_mma, layout_for=_gemv_mma_layout,
                reads_any=(GEMV_MMA_V1.name, WGMMA_V1.name, ROWS_V1.name)),
    KernelEntry("cuda_gemv", "linear", _gemv_can_run, _on_rows(_gemv_config), _run_gemv, GEMV_V2,
                "CUDA-core GEMV, M <= 16", _on_rows(_gemv_complete), _gemv_candidates, _gemv_perm,
                prepare=_prepare_gemv, layout_for=_rows_or(GEMV_V2), reads_any=(GEMV_V2.name, ROWS_V1.name)),
    DEQUANT_CUBLAS,
    KernelEntry("cuda_wgmma", "linear", _wgmma_can_run, _on_rows(_wgmma_config), _run_wgmma, WGMMA_V1,
                "Hopper wgmma GEMM, any M", _on_rows(_wgmma_complete), candidates=_wgmma_candidates,
                input_perm=_gemm_perm, prepare=_prepare_wgmma, layout_for=_rows_or(WGMMA_V1),
                reads_any=(WGMMA_V1.name, ROWS_V1.name)),
    KernelEntry("triton_gemm", "linear", _triton_can_run, _triton_config, _run_triton,
                Layout.lazy("triton_gemm_v1_ks16", "mixgemm.kernels.triton.layout", "get_layout"),
                "Triton tensor-core GEMM, any M", candidates=_triton_candidates, input_perm=_gemm_perm),
)
register("linear", ENTRIES)
