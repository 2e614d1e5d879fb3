"""Where the two GEMVs (mixgemm.kernels.cuda_gemv_mma, cuda_gemv) hand a call to the GEMM: what both decline
(``gemv_reason``) and the GPU table's GEMV / GEMM crossover (``gemv_limit``), raised where the wgmma GEMM's launch would
leave the GPU short and lowered where its small-M tile family or the GEMV's wave fill says so."""

from __future__ import annotations

from dataclasses import replace

import mixgemm.tuning as tuning
from mixgemm.formats.weight import narrow_group_reason
from mixgemm.kernels import cuda_wgmma
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import WGMMA_V1
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import Problem


# ------------------------------------------------------------------------------------------------------ GEMVs
def in_gemv_mma_m1(p: Problem) -> bool:
    """Whether the GPU's table sends the plain codes' fp16 M = 1 call on this layer to the tensor-core GEMV
    (gemv_mma_m1 buckets: cuda_gemv_mma takes it there, cuda_gemv_wg_simt leaves it to it on wgmma_v1 too)."""
    return tuning.gemv_mma_m1_entry(p.device.table, p.bits, p.k, p.n) is not None


def gemv_reason(p: Problem, dtypes) -> str | None:
    if not p.device.is_cuda:
        return "needs a CUDA device"
    if p.x_dtype not in dtypes:
        return f"activation dtype {p.x_dtype} (takes {', '.join(str(d) for d in dtypes)})"
    if p.bits not in (4, 8):
        return f"{p.bits}-bit weights"
    if not 1 <= p.m <= common.GEMV_MAX_M:
        return f"M={p.m} outside the GEMV's 1..{common.GEMV_MAX_M}"
    if narrow := narrow_group_reason(p.group_size, p.num_groups):
        return narrow
    if not common.nvrtc_ok():
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
    family = cuda_wgmma.small_m_family_model(p.device.table["name"])
    if family is None or p.qw is None or p.x_dtype not in common.HALF:
        return None
    hit = family.covers(p.m, p.bits, p.k, p.n)
    if hit is None or "cuda_wgmma" in current_options().disable or not cuda_wgmma.can_run(p).ok:
        return None
    name = p.device.table.get("name", "?")
    return family.m_range[0], (f"the wgmma GEMM's small-M tile family takes M {family.m_range[0]}..{family.m_range[1]} "
                               f"in this layer's bucket ({name}.json wgmma_small_m_family: "
                               f"{hit.where(tuning.ShapeBucket.of(p.k, p.n))})")


def _gemv_underfills(p: Problem) -> str | None:
    """Why the wgmma GEMM takes this M from the GEMVs (the table's gemv_min_wave_fill): at M in its range, on a layer
    of at least ``min_weight_bytes``, the tensor-core GEMV's blocks fill under ``min_fill`` of their waves
    (kernels.cuda_gemv_mma.host.mma_wave_fill), where the GEMM's small-M cluster split fills the GPU; None where
    the rule does not apply (a wgmma_from_m region decides there itself)."""
    rule = p.device.table.get("gemv_min_wave_fill")
    if rule is None or not rule["m"][0] <= p.m <= rule["m"][1] or p.x_dtype not in common.HALF:
        return None
    if p.n * p.k * p.bits // 8 < rule["min_weight_bytes"]:
        return None  # smaller layers: the GEMV's latency-bound blocks finish before the GEMM's fixed costs
    if "cuda_wgmma" in current_options().disable or not cuda_wgmma.can_run(p).ok:
        return None
    if tuning.wgmma_from_m_entry(p.device.table, p.qw, p.k, p.n):
        return None  # the region's crossover decides
    from mixgemm.kernels.cuda_gemv_mma.host import mma_config, mma_wave_fill

    cfg = mma_config(p.m, p.n, p.k, p.bits, p.group_size, p.device.sm_count, p.mode,
                     1 if p.resident == WGMMA_V1.name else None, x_dtype=p.x_dtype, scale_dtype=common.scale_dtype(p),
                     arch=common.arch(p))  # (the fill bar was measured on the RT rule's tiles, not wg_16row's)
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
    wg = "cuda_wgmma" not in current_options().disable and cuda_wgmma.can_run(p).ok
    lim = tuning.gemv_max_m(table, p.qw, p.n, wgmma=wg, k=p.k)
    if not wg or lim >= common.GEMV_MAX_M or p.m > common.GEMV_MAX_M or tuning.wgmma_from_m_entry(table, p.qw,
                                                                                                  p.k, p.n):
        return lim, lim, None
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import output_tiles

    # the output tiles of the wgmma launch that would take this M over; split-K CTAs are not counted: at these M a
    # split's partial sums cost about what it recovers (measured: 3584x8192 at M = 16, split 2 over 64 tiles, 15.4 us
    # against the tensor-core GEMV's 9.6)
    m_over = max(p.m, lim + 1)
    cfg = cuda_wgmma.choose_config(replace(p, m=m_over))
    tiles = output_tiles(m_over, p.n, cfg["BM"], cfg.get("NWG", 2))
    kept = tuning.gemv_over_wgmma(table, p.bits, p.k, tiles, p.device.sm_count)
    if kept is None or kept[0] <= lim:
        return lim, lim, None
    return lim, min(kept[0], common.GEMV_MAX_M), kept[1]


def past_crossover_note(p: Problem, cfg):
    """cfg, and where a GEMV runs past the table's crossover (gemv_over_wgmma) a SourcedConfig saying why."""
    lim, kept, why = _table_limit_and_raise(p) if p.m > 1 else (common.GEMV_MAX_M, common.GEMV_MAX_M, None)
    if why is None or not lim < p.m <= kept or cfg is None:
        return cfg
    src = getattr(cfg, "source", "")
    note = f"kept on the GEMV past the {p.device.table.get('name', '?')} table's crossover M={lim}: {why}"
    return tuning.SourcedConfig(cfg, f"{src}; {note}" if src else note)


def crossover_reason(p: Problem) -> str | None:
    lim, under = _gemv_limit(p)
    if under:
        return f"M={p.m}: {under}"
    if p.m > lim:
        return f"M={p.m} above the GEMV / GEMM crossover M={lim} ({tuning.table_name_for(p.device.name)} table)"
    return None
