"""``cuda_gemv``: the CUDA-core GEMV (gemv.cu), M <= 16, any activation dtype, on the weight's own packed codes
(gemv_v2) or rows_v1 (config ROWS). Up to the GPU table's crossover (mixgemm.kernels.gemv_crossover).

Run contract (mixgemm.kernels.linear): ``run(x2d, qw, bias, lo, hi, config, perm=None) -> [M, N]``; it gathers x
through an act-order layer's kernel permutation where x is staged in shared memory (host.stages_perm).
"""

from __future__ import annotations

import torch

from mixgemm.kernels import gemv_crossover as crossover
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import GEMV_V2, ROWS_V1
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not


def can_run(p: Problem):
    why = crossover.gemv_reason(p, common.FLOAT)
    if why:
        return no(why)
    why = crossover.crossover_reason(p)
    return prefer_not(why) if why else OK


def choose_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_gemv.host import simt_config

    return simt_config(p.m, p.n, p.k, p.bits, p.x_dtype, p.mode, p.device.sm_count, p.device.name)


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda_gemv.config import GemvConfig
    from mixgemm.kernels.cuda_gemv.host import simt_override

    return simt_override(GemvConfig.short_keys(forced))


def candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda.gemv_launch import WARPS, chunks_per_row
    from mixgemm.kernels.cuda_gemv.gemv_steps import ranked_tiles as step_ranked_tiles
    from mixgemm.tuning.gemv_steps import step_costs

    base = choose_config(p)
    if base.get("BULK", 0) or base["RG"] * base["KS"] != WARPS:
        return []  # a hand-tuned special tile (bulk ring): not varied
    # the choose_config space: KS a power of two <= 8 with RG = 8 warps / KS; at M = 1 R 2 or 4, U 1, 2 or 4 and
    # register double buffering (PF: the next step's weights in flight during this step's math)
    out = [{**base, "KS": ks, "RG": WARPS // ks} for ks in common.pow2_neighbours(base["KS"], 1, WARPS)]
    if p.m == 1:
        out += common.one_axis_variants(base, {"R": (2, 4), "U": (1, 2, 4), "PF": (0, 1)}, lambda c: True)
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
            # the step-cost model's cheapest tiles (kernels/cuda_gemv/gemv_steps.py): where its ranking is close, or the
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
def input_perm(p: Problem, config: dict | None) -> str | None:
    from mixgemm.kernels.cuda_gemv.host import stages_perm

    mode = current_options().act_order_gather
    if mode == "caller":
        return "kernel_options(act_order_gather='caller')"
    if config is not None and stages_perm(config, p.m, p.x_dtype, p.bits, p.k):
        return None
    if mode == "kernel":
        return None
    return ("x is not staged in shared memory here (fp16 M = 1 and K * 4 bytes <= 64 KiB only), and per-lane gathers "
            "from global memory run only under kernel_options(act_order_gather='kernel')")


def run(x2d, qw, bias, lo, hi, config, perm=None):
    from mixgemm.kernels.cuda_gemv.host import gemv_simt

    return gemv_simt(x2d, qw, bias, lo, hi, config, perm)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_gemv.host import prepare_simt

    gathers = p.act_order and input_perm(p, config) is None
    return prepare_simt(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, gathers)


ENTRY = KernelEntry("cuda_gemv", "linear", can_run, common.on_rows(choose_config), run, GEMV_V2,
                    "CUDA-core GEMV, M <= 16", common.on_rows(complete), candidates, input_perm, prepare=prepare,
                    layout_for=common.rows_or(GEMV_V2), reads_any=(GEMV_V2.name, ROWS_V1.name))
