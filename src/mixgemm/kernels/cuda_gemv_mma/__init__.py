"""``cuda_gemv_mma``: the tensor-core GEMV (gemv_mma.cu), M <= 16, fp16 / bf16 (fp16 from M = 2: at M = 1 the
CUDA-core kernel measured faster). It reads its own layout gemv_mma_v1 for int4 and the wgmma GEMM's wgmma_v1 for
int8 (config key WG; host.MMA_ON_WGMMA) and for a compacted weight (whose M = 1 call cuda_gemv_wg_simt takes where it
does not decline), or rows_v1 (config ROWS). Up to the GPU table's crossover (mixgemm.kernels.gemv_crossover).

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
        return OK  # a compacted weight: the CUDA-core GEMV on plain codes is not there to prefer
    if p.x_dtype == torch.float16 and p.m == 1 and not crossover.in_gemv_mma_m1(p):
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
    if on_wg and not MMA_ON_WGMMA[p.bits]:
        # a compacted weight keeps only the GEMM's wgmma_v1: the x ring on it (gemv_mma.cu MMA_WG; for int4 RT 2 where
        # kernels.cuda_gemv_mma.host.mma_row_tiles says, docs/kernels/cuda_gemv_mma.md)
        cfg = tuning.SourcedConfig(cfg, "the weight keeps only wgmma_v1 (compacted)")
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
    # the first weights before the PDL wait and two row tiles per warp (gemv.mma_row_tiles), absent keys read as off;
    # within the k-slice reduction's shared memory
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
    default, and a compacted weight), else its own gemv_mma_v1."""
    if config and config.get("ROWS", 0):
        return ROWS_V1
    return WGMMA_V1 if config and config.get("WG", 0) else GEMV_MMA_V1


ENTRY = KernelEntry("cuda_gemv_mma", "linear", can_run, common.on_rows(choose_config), run, GEMV_MMA_V1,
                    "tensor-core GEMV, M <= 16 (int8: on wgmma_v1, or rows_v1)", common.on_rows(complete), candidates,
                    input_perm, prepare=prepare, layout_for=layout_for,
                    reads_any=(GEMV_MMA_V1.name, WGMMA_V1.name, ROWS_V1.name))
