"""``cuda_gemv_mma``: the tensor-core GEMV (gemv_mma.cu), M <= 16, fp16 / bf16 (fp16 from M = 2: at M = 1 the
CUDA-core kernel measured faster). It reads its own layout gemv_mma_v1 for int4 and the wgmma GEMM's wgmma_v1 for
int8 (config key WG; host.MMA_ON_WGMMA), or rows_v1 (config ROWS). With WG and SIMT at M = 1 it runs CUDA-core math
on wgmma_v1 (gemv_wg_simt.cu), a compacted weight's M = 1 call. Up to the GPU table's crossover
(mixgemm.kernels.gemv_crossover).

Run contract (mixgemm.kernels.linear): ``run(x2d, qw, bias, lo, hi, config, perm=None) -> [M, N]``; it gathers x
through an act-order layer's kernel permutation itself (``perm``) up to tuning.MMA_GATHER_MAX_M rows.
"""

from __future__ import annotations

import torch

import mixgemm.tuning as tuning
from mixgemm.kernels import gemv_crossover as crossover
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import GEMV_MMA_V1, ROWS_V1, WGMMA_V1
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import OK, KernelEntry, Layout, Problem, no, prefer_not


def can_run(p: Problem):
    why = crossover.gemv_reason(p, common.HALF)
    if why:
        return no(why)
    why = crossover.crossover_reason(p)
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


def choose_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_gemv_mma.host import MMA_ON_WGMMA, mma_config

    on_wg = p.resident == WGMMA_V1.name
    cfg = mma_config(p.m, p.n, p.k, p.bits, p.group_size, p.device.sm_count, p.mode, 1 if on_wg else None,
                     _one_wave_max_spill(p), _pair_packs(p), p.x_dtype, common.scale_dtype(p), common.arch(p),
                     _wg_16row(p))
    simt = _compact_m1_simt_tile(p) if on_wg else None
    if simt is not None:
        # the CUDA-core GEMV on the same bytes (gemv_wg_simt.cu; tuning.COMPACT_M1_SIMT_DTYPES)
        why = getattr(simt, "source", "the rule of kernels.cuda_gemv_mma.host.wg_simt_config")
        return tuning.SourcedConfig({**cfg, **simt}, f"the weight keeps only wgmma_v1 (compacted): M = 1 on CUDA "
                                                     f"cores, tuning.COMPACT_M1_SIMT_DTYPES; {why}")
    if on_wg and not MMA_ON_WGMMA[p.bits]:
        # a compacted weight keeps only the GEMM's wgmma_v1: the x ring on it (gemv_mma.cu MMA_WG; for int4 RT 2 where
        # kernels.cuda_gemv_mma.host.mma_row_tiles says, docs/kernels/cuda_gemv_mma.md)
        why = "the weight keeps only wgmma_v1 (compacted)"
        if p.m == 1 and p.x_dtype in tuning.COMPACT_M1_SIMT_DTYPES and _in_gemv_mma_m1(p):
            why += f"; M = 1 inside the {p.device.table.get('name', '?')} table's gemv_mma_m1 buckets"
        elif p.m == 1 and p.x_dtype == torch.bfloat16 and not p.act_order:
            why += ("; bf16 at M = 1: the CUDA-core GEMV's tile keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 "
                    "build's resident warps (registers), and the weight's family has no bf16 step costs")
        cfg = tuning.SourcedConfig(cfg, why)
    elif not on_wg and cfg.get("MINB", 0) > 1:
        # (mma_row_tiles capped the registers: say from what count, which is this machine's compiler's)
        from mixgemm.kernels.cuda.gemv_launch import _ACT, _SCL
        from mixgemm.kernels.cuda_gemv_mma.host import mma_cap_registers

        regs = mma_cap_registers(p.mode, _ACT[p.x_dtype], _SCL[common.scale_dtype(p)], common.arch(p))
        cfg = tuning.SourcedConfig(cfg, f"registers capped for two 16-warp blocks per SM (MINB 2): the uncapped build "
                                        f"takes {regs} (NVRTC, {common.arch(p)}), one block past one wave")
    if p.resident == ROWS_V1.name and p.m > 1 and cfg.get("MINB", 0) < 2:
        # rows_v1 keeps x in registers (gemv_mma.cu MMA_ROWS): 70-96 of them leave one 16-warp block per SM; capped at
        # two blocks a SM it took 0.75-0.92x the time at M 2..16 (H100; docs/kernels/cuda_gemv_mma.md, Open items,
        # rows_v1)
        cfg = tuning.SourcedConfig({**cfg, "MINB": 2}, "rows_v1: registers capped for two blocks per SM (MINB 2)")
    return crossover.past_crossover_note(p, cfg)


def _pair_packs(p: Problem) -> bool:
    """Whether the weight's groups carry a 16-bit zero point / offset beside an fp16 / bf16 scale (the tensor-core
    GEMV's PACK applies: kernels.cuda_gemv_mma.host.mma_pf_pack)."""
    from mixgemm.kernels.cuda.gemv_launch import weight_pair_packs

    return weight_pair_packs(p.mode, common.scale_dtype(p))


def _one_wave_max_spill(p: Problem) -> float:
    """The table's gemv_one_wave_k_split bound (kernels.cuda_gemv_mma.host.one_wave_k_split), 0 where it has none."""
    return float(p.device.table.get("gemv_one_wave_k_split", {}).get("max_spill", 0.0))


def _wg_16row(p: Problem) -> bool:
    """Whether the table measured the wgmma_v1 16-row tiles (kernels.cuda_gemv_mma.host.wg_16row_tiles:
    gemv_mma_wg_16row)."""
    return "gemv_mma_wg_16row" in p.device.table


def _compact_m1_simt_tile(p: Problem) -> dict | None:
    """The tile a compacted weight's M = 1 call takes on the CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu), or None for
    the tensor-core GEMV: for the activation dtypes of tuning.COMPACT_M1_SIMT_DTYPES (not act-order, whose gather that
    kernel does not read), except on the small layers where the GPU's table sends the plain codes' fp16 M = 1 call to
    the tensor-core GEMV (gemv_mma_m1): its 16-way k-split wins there on wgmma_v1 too (tuning.COMPACT_M1_SIMT_DTYPES
    says where measured), unless the CUDA-core GEMV's one-step tile applies
    (kernels.cuda_gemv_mma.host.wg_simt_one_step, which
    beat both there); and in bf16, for a tile not of the step-cost model (which counts the bf16 build's registers),
    not where the tile's bf16 build keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 build's resident warps: the
    step-cost model's tile for bf16 x there, the tensor-core GEMV where the family has no bf16 costs. H100, against
    the tensor-core GEMV those calls took before (tools/bench/dispatch_ab.py, W4 zero point, 6 layers): 0.805-0.892x
    the time."""
    from mixgemm.kernels.cuda_gemv_mma.host import ModelledConfig, wg_simt_modelled

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
    """Whether the CUDA-core GEMV's ``tile`` keeps more than kernels.cuda_gemv_mma.host.WG_SIMT_BF16_MIN_WARP_SHARE of
    its fp16
    build's resident warps with bf16 x (its registers; else the tensor cores take the bf16 call)."""
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_mma.host import WG_SIMT_BF16_MIN_WARP_SHARE, wg_simt_bf16_warp_share

    return wg_simt_bf16_warp_share(p.bits, _SCL[common.scale_dtype(p)], p.mode, tile,
                                   common.arch(p)) > WG_SIMT_BF16_MIN_WARP_SHARE


def _x_code(p: Problem) -> int:
    """The CUDA-core GEMV on wgmma_v1's activation code for the problem's x (fp16 0, bf16 1; other dtypes, which it does
    not take, ask as fp16)."""
    from mixgemm.kernels.cuda.gemv_launch import _ACT

    return _ACT[p.x_dtype] if p.x_dtype in (torch.float16, torch.bfloat16) else 0


def _wg_simt_one_step(p: Problem):
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_mma.host import wg_simt_one_step

    return wg_simt_one_step(p.n, p.k, p.bits, p.device.sm_count, p.mode, _x_code(p),
                            _SCL[common.scale_dtype(p)], common.arch(p))


def _wg_simt_config(p: Problem, one_step: bool = True) -> dict:
    """The CUDA-core GEMV on wgmma_v1's M = 1 tile for this problem (kernels.cuda_gemv_mma.host.wg_simt_config, its
    one-step
    rule asking the registers of this activation / scale dtype's build; one_step False: the table's or rule's tile)."""
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_mma.host import wg_simt_config

    return wg_simt_config(p.n, p.k, p.bits, p.device.sm_count, p.device.name, p.mode, _x_code(p),
                          _SCL[common.scale_dtype(p)], common.arch(p), one_step, _g32(p))


def _g32(p: Problem) -> int:
    """1 for groups of 32 (two parameter sets per 64-k tile: the CUDA-core GEMV on wgmma_v1's G32 build), else 0."""
    return int(p.group_size == 32)


def _in_gemv_mma_m1(p: Problem) -> bool:
    """Whether the GPU's table sends the plain codes' fp16 M = 1 call on this layer to the tensor-core GEMV."""
    return tuning.gemv_mma_m1_entry(p.device.table, p.bits, p.k, p.n) is not None


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda_gemv_mma.config import GemvMmaConfig
    from mixgemm.kernels.cuda_gemv_mma.host import mma_override

    return mma_override(choose_config(p), GemvMmaConfig.short_keys(forced))


def candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda.gemv_launch import WARPS
    from mixgemm.kernels.cuda_gemv_mma.host import mma_k_tiles, mma_reduction_fits

    base = choose_config(p)
    kt = mma_k_tiles(p.bits, p.k)
    # the choose_mma_config space: KS a power of two <= 16 with kt >= 2 KS, RG = 8 warps / KS; U 1 or 2 k-tiles
    out = [{**base, "KS": ks, "RG": max(1, WARPS // ks)} for ks in common.pow2_neighbours(base["KS"], 1, 16)
           if kt >= 2 * ks]
    out += common.one_axis_variants(base, {"U": (1, 2)}, lambda c: True)
    if not base.get("SIMT", 0):
        # the first weights before the PDL wait and two row tiles per warp (gemv.mma_row_tiles), absent keys read as
        # off; within the k-slice reduction's shared memory
        plain = {**base, "EARLY": base.get("EARLY", 0), "RT": base.get("RT", 1)}
        out += [c for c in common.one_axis_variants(plain, {"EARLY": (0, 1), "RT": (1, 2)}, mma_reduction_fits)
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
        from mixgemm.kernels.cuda_gemv_mma.host import wg_simt_one_step_tile

        simt = {**base, **_wg_simt_config(p)}
        for c in (simt, {**base, **_wg_simt_config(p, one_step=False)}, {**base, **wg_simt_one_step_tile(p.k, p.mode)}):
            if c != base and c not in out:
                out.append(c)
        if p.mode != "sym":
            # the zero point / offset parameter pair in one register or two (gemv_wg_simt.cu SIMT_PACK; a no-op with
            # fp32 scales)
            out.append({**simt, "PACK": 1 - simt.get("PACK", 0)})
    return out


def input_perm(p: Problem, config: dict | None) -> str | None:
    mode = current_options().act_order_gather
    if mode == "caller":
        return "kernel_options(act_order_gather='caller')"
    if mode == "kernel" or p.m <= tuning.MMA_GATHER_MAX_M:
        return None
    return (f"M={p.m} above MMA_GATHER_MAX_M={tuning.MMA_GATHER_MAX_M} (per-lane gathers touch 4 * M addresses per "
            "load; tuning)")


def run(x2d, qw, bias, lo, hi, config, perm=None):
    from mixgemm.kernels.cuda_gemv_mma.host import gemv_mma

    return gemv_mma(x2d, qw, bias, lo, hi, config, perm)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_gemv_mma.host import prepare_mma

    gathers = p.act_order and input_perm(p, config) is None
    return prepare_mma(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, gathers)


def layout_for(config: dict | None) -> Layout:
    """The tensor-core GEMV reads rows_v1 with config ROWS, the wgmma GEMM's wgmma_v1 with config WG (the int8
    default, and MMA_SIMT), else its own gemv_mma_v1."""
    if config and config.get("ROWS", 0):
        return ROWS_V1
    return WGMMA_V1 if config and config.get("WG", 0) else GEMV_MMA_V1


ENTRY = KernelEntry("cuda_gemv_mma", "linear", can_run, common.on_rows(choose_config), run, GEMV_MMA_V1,
                    "tensor-core GEMV, M <= 16 (int8: on wgmma_v1, or rows_v1)", common.on_rows(complete), candidates,
                    input_perm, prepare=prepare, layout_for=layout_for,
                    reads_any=(GEMV_MMA_V1.name, WGMMA_V1.name, ROWS_V1.name))
