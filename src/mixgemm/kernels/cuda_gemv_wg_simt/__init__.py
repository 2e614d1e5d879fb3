"""``cuda_gemv_wg_simt``: the CUDA-core GEMV on the wgmma GEMM's layout wgmma_v1 (gemv_wg_simt.cu), M = 1, fp16 / bf16
x: the decode call of a compacted weight, which keeps its codes only there. Where the GPU's table sends the plain codes'
fp16 M = 1 call to the tensor-core GEMV (gemv_mma_m1), and for bf16 tiles that keep too few resident warps, it declines
softly and cuda_gemv_mma runs the call on the same bytes.

Run contract (mixgemm.kernels.linear): ``run(x2d, qw, bias, lo, hi, config) -> [1, N]``; it reads x as it is, so it
declines act-order layers.
"""

from __future__ import annotations

import torch

import mixgemm.tuning as tuning
from mixgemm.kernels import gemv_crossover as crossover
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import WGMMA_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not


def can_run(p: Problem):
    why = crossover.gemv_reason(p, tuning.COMPACT_M1_SIMT_DTYPES)
    if why:
        return no(why)
    if p.m != 1:
        return no(f"M={p.m}: it computes one row of x (M = 1)")
    if p.act_order:
        return no("act-order: it reads x without the layer's permutation")
    why = crossover.crossover_reason(p)
    if why:
        return prefer_not(why)
    if p.resident != WGMMA_V1.name:
        return prefer_not("the weight keeps its plain codes, which the GEMVs on them read (cuda_gemv); this kernel "
                          "serves a weight compacted to wgmma_v1")
    _, why = _compact_tile(p)
    return prefer_not(why) if why else OK


def choose_config(p: Problem) -> dict:
    """The compacted weight's tile (_compact_tile), or where it declines (a forced call) the tile rule's
    (host.wg_simt_config)."""
    tile, _ = _compact_tile(p)
    return tile if tile is not None else _wg_simt_config(p)


def _compact_tile(p: Problem) -> tuple[dict | None, str]:
    """(the tile a compacted weight's M = 1 call takes, "") or (None, why the tensor-core GEMV takes it on the same
    bytes): the tensor-core GEMV on the small layers where the GPU's table sends the plain codes' fp16 M = 1 call to it
    (gemv_mma_m1): its 16-way k-split wins there on wgmma_v1 too (tuning.COMPACT_M1_SIMT_DTYPES says where measured),
    unless this kernel's one-step tile applies (host.wg_simt_one_step, which beat both there); and in bf16, for a tile
    not of the step-cost model (which counts the bf16 build's registers), not where the tile's bf16 build keeps at most
    WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 build's resident warps: the step-cost model's tile for bf16 x there, the
    tensor-core GEMV where the family has no bf16 costs. H100, against the tensor-core GEMV those calls took before
    (tools/bench/dispatch_ab.py, W4 zero point, 6 layers): 0.805-0.892x the time."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import ModelledConfig, wg_simt_modelled

    one = _wg_simt_one_step(p)
    if one is None and crossover.in_gemv_mma_m1(p):
        return None, (f"M = 1 inside the {p.device.table.get('name', '?')} table's gemv_mma_m1 buckets: the "
                      "tensor-core GEMV's k-split measured faster there, on wgmma_v1 too")
    tile = one if one is not None else _wg_simt_config(p, one_step=False)
    if p.x_dtype != torch.bfloat16 or isinstance(tile, ModelledConfig) or _bf16_keeps_warps(p, tile):
        return tile, ""
    modelled = wg_simt_modelled(p.n, p.k, p.bits, p.device.sm_count, p.device.name, p.mode,
                                "the bf16 build of the fp16-measured tile keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of "
                                "its fp16 build's resident warps", _x_code(p), _g32(p))
    if isinstance(modelled, ModelledConfig):
        return modelled, ""
    return None, ("bf16 at M = 1: the tile keeps at most WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 build's resident "
                  "warps (registers), and the weight's family has no bf16 step costs")


def _bf16_keeps_warps(p: Problem, tile: dict) -> bool:
    """Whether ``tile`` keeps more than host.WG_SIMT_BF16_MIN_WARP_SHARE of its fp16 build's resident warps with bf16 x
    (its registers)."""
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_wg_simt.host import WG_SIMT_BF16_MIN_WARP_SHARE, wg_simt_bf16_warp_share

    return wg_simt_bf16_warp_share(p.bits, _SCL[common.scale_dtype(p)], p.mode, tile,
                                   common.arch(p)) > WG_SIMT_BF16_MIN_WARP_SHARE


def _x_code(p: Problem) -> int:
    """The kernel's activation code for the problem's x (fp16 0, bf16 1; other dtypes, which it does not take, ask as
    fp16)."""
    from mixgemm.kernels.cuda.gemv_launch import _ACT

    return _ACT[p.x_dtype] if p.x_dtype in (torch.float16, torch.bfloat16) else 0


def _wg_simt_one_step(p: Problem):
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_one_step

    return wg_simt_one_step(p.n, p.k, p.bits, p.device.sm_count, p.mode, _x_code(p),
                            _SCL[common.scale_dtype(p)], common.arch(p))


def _wg_simt_config(p: Problem, one_step: bool = True) -> dict:
    """The M = 1 tile for this problem (host.wg_simt_config, its one-step rule asking the registers of this activation
    / scale dtype's build; one_step False: the table's or rule's tile)."""
    from mixgemm.kernels.cuda.gemv_launch import _SCL
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config

    return wg_simt_config(p.n, p.k, p.bits, p.device.sm_count, p.device.name, p.mode, _x_code(p),
                          _SCL[common.scale_dtype(p)], common.arch(p), one_step, _g32(p))


def _g32(p: Problem) -> int:
    """1 for groups of 32 (two parameter sets per 64-k tile: the G32 build), else 0."""
    return int(p.group_size == 32)



def complete(p: Problem, forced: dict) -> dict:
    """A forced config's keys over the problem's tile."""
    from mixgemm.kernels.cuda_gemv_wg_simt.config import GemvWgSimtConfig

    return {**choose_config(p), **GemvWgSimtConfig.short_keys(forced)}


def candidates(p: Problem) -> list[dict]:
    """Beside the default: the tile rule's (one step a k-slice where it applies), the table's / rule's, and the
    one-step tile also where the rule does not take it (its round of resident warps is a model), and for zero point /
    offset the rule's tile with the parameter pair in one register or two (gemv_wg_simt.cu SIMT_PACK; a no-op with
    fp32 scales)."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_one_step_tile

    base = dict(choose_config(p))
    tile = dict(_wg_simt_config(p))
    out = [tile, dict(_wg_simt_config(p, one_step=False)), wg_simt_one_step_tile(p.k, p.mode)]
    if p.mode != "sym":
        out.append({**tile, "PACK": 1 - tile.get("PACK", 0)})
    return [c for i, c in enumerate(out) if c != base and c not in out[:i]]


def run(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.cuda_gemv_wg_simt.host import gemv_wg_simt

    return gemv_wg_simt(x2d, qw, bias, lo, hi, config)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_gemv_wg_simt.host import prepare_wg_simt

    return prepare_wg_simt(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config)


ENTRY = KernelEntry("cuda_gemv_wg_simt", "linear", can_run, choose_config, run, WGMMA_V1,
                    "CUDA-core GEMV on wgmma_v1, M = 1", complete, candidates, prepare=prepare)
