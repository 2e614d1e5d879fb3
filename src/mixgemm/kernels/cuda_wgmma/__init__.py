"""``cuda_wgmma``: the Hopper wgmma GEMM (gemm_wgmma.cu), sm_90, fp16 / bf16, any M, on wgmma_v1 (or rows_v1 with
config ROWS). Its config: the GPU table's bucket tile, re-ranked by the wave model and the small-M split models
(wgmma_waves.py), else the rule (gemm_wgmma.default_config).

Run contract (mixgemm.kernels.linear): ``run(x2d, qw, bias, lo, hi, config) -> [M, N]``; the caller gathers an
act-order layer's x first.
"""

from __future__ import annotations

import functools

import torch

import mixgemm.tuning as tuning
from mixgemm.formats.weight import narrow_group_reason
from mixgemm.kernels import linear_common as common
from mixgemm.kernels.layouts import ROWS_V1, WGMMA_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no


# ------------------------------------------------------------------------------------------------ wgmma GEMM
def can_run(p: Problem):
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if not p.device.sm90:
        return no(f"needs sm_90, the GPU is sm_{p.device.capability[0]}{p.device.capability[1]}")
    if p.x_dtype not in common.HALF:
        return no(f"activation dtype {p.x_dtype} (takes float16 / bfloat16)")
    if p.bits not in (4, 8):
        return no(f"{p.bits}-bit weights")
    if narrow := narrow_group_reason(p.group_size, p.num_groups):
        return no(narrow)
    if not common.nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    return OK


@functools.cache
def wave_cost(table_name: str):
    from mixgemm.kernels.cuda_wgmma.wgmma_waves import WaveCost

    raw = tuning.load_table(table_name).get("wgmma_waves")
    return None if raw is None else WaveCost.parse(raw, f"{table_name}.json wgmma_waves")


@functools.cache
def small_m_cost(table_name: str):
    from mixgemm.kernels.cuda_wgmma.wgmma_waves import SmallMCost

    raw = tuning.load_table(table_name).get("wgmma_small_m")
    return None if raw is None else SmallMCost.parse(raw, f"{table_name}.json wgmma_small_m")


@functools.cache
def small_m_family_model(table_name: str):
    from mixgemm.kernels.cuda_wgmma.wgmma_waves import SmallMFamily

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
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import default_config, output_tiles

    base = cfg if cfg is not None else default_config(p.m, p.n, p.k, p.device.sm_count)
    if (small.keep_stream_k and int(base.get("SK", 0))) or int(base.get("SERIAL", 0)):
        return False
    tiles = output_tiles(p.m, p.n, int(base["BM"]), int(base.get("NWG", 2)))
    return tiles < small.max_table_tiles_per_sm * p.device.sm_count


def choose_config(p: Problem, small_m_family: bool = True) -> dict:
    """The wgmma GEMM's config for p (small_m_family False: as if the table had no wgmma_small_m_family section, the
    baseline its sweep measures the family against)."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import auto_split, default_config

    cfg = tuning.table_entry(p.device.table, "wgmma", p.m, p.n, p.k, p.qw)
    family = small_m_family_model(p.device.table["name"]) if small_m_family else None
    if family is not None and p.qw is not None and family.covers(p.m, p.bits, p.k, p.n):
        # a measured bucket of the small-M tile family: the variant and cluster split its models rank first
        from mixgemm.kernels.cuda_wgmma.wgmma_waves import WeightBytes, choose_small_m_family

        w = WeightBytes(p.bits, p.qw.scales.element_size(), p.mode, p.group_size == 32)
        got = choose_small_m_family(p.m, p.n, p.k, w, family, p.device.sm_count)
        if got is not None:
            return tuning.SourcedConfig(got.config, f"{p.device.table['name']}.json wgmma_small_m_family: {got.note}")
    small = small_m_cost(p.device.table["name"])
    if small is not None and p.qw is not None and _table_tile_idles_sms(p, cfg, small):
        # small M where the table's tile leaves SMs idle: the BM 16 tile with the cluster split the model ranks first
        # (kernels/cuda_wgmma/wgmma_waves.py)
        from mixgemm.kernels.cuda_wgmma.wgmma_waves import WeightBytes, choose_small_m

        w = WeightBytes(p.bits, p.qw.scales.element_size(), p.mode, p.group_size == 32)
        got = choose_small_m(p.m, p.n, p.k, w, small, p.device.sm_count)
        if got is not None:
            return tuning.SourcedConfig(got.config, f"{p.device.table['name']}.json wgmma_small_m: {got.note}")
    if cfg is None:
        return default_config(p.m, p.n, p.k, p.device.sm_count)
    cost = wave_cost(p.device.table["name"])
    if cost is not None and p.qw is not None:
        # the table's tile against smaller tiles and cluster splits, from the wave count
        # (kernels/cuda_wgmma/wgmma_waves.py)
        from mixgemm.kernels.cuda_wgmma.wgmma_waves import WeightBytes, choose

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
    from mixgemm.kernels.cuda_wgmma.wgmma_waves import small_m_family_configs

    return small_m_family_configs(p.device.table.get("wgmma_small_m", {}).get("tile", SMALL_M_TILE))


def candidates(p: Problem) -> list[dict]:
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import TAIL_SPLITS, auto_split, stage_bytes, tail_rows, tile_error

    base = choose_config(p)
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
    out = [c for c in (with_bm(v) for v in common.pow2_neighbours(bm, 8, 256)) if legal(c)]
    cost = wave_cost(p.device.table["name"])
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
    out += [c for c in common.one_axis_variants(base, axes, legal) if c not in out]
    if p.m <= SMALL_M_TILE_MAX_M:
        # the small-M tile family, so that mixgemm tune reaches its variants on a GPU whose table has no fitted
        # wgmma_small_m_family section, and beyond the section's buckets where it has one
        out += [c for c in small_m_family_candidates(p) if legal(c) and c not in out and c != base]
    return out


def run(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    # fit: the table's configs were measured on int4 fp16-scale weights, whose stages are the smallest
    return gemm_wgmma(x2d, qw, bias, lo, hi, config, fit=True)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import prepare_wgmma

    return prepare_wgmma(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), config, fit=True)


def complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda_wgmma.config import WgmmaConfig

    return WgmmaConfig.short_keys(forced)


ENTRY = KernelEntry("cuda_wgmma", "linear", can_run, common.on_rows(choose_config), run, WGMMA_V1,
                    "Hopper wgmma GEMM, any M", common.on_rows(complete), candidates=candidates,
                    input_perm=common.gemm_perm, prepare=prepare, layout_for=common.rows_or(WGMMA_V1),
                    reads_any=(WGMMA_V1.name, ROWS_V1.name))
