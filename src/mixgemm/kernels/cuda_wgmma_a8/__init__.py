"""``cuda_wgmma_a8``: the Hopper int8 wgmma GEMM (gemm_wgmma_a8.cu; host code gemm_wgmma_a8.py) after the activation
quantizer, or with per-token scales quantizing in its own launch (config FQ, ``quantizing_pays``; outside CUDA-graph
capture; "sym" activations only: "sym_full" ones take the quantizer's launch), sym / sym_full activations x sym weights
with a ``wgmma_a8_v1`` weight (mixgemm.formats.layouts_wgmma_a8, shared with cuda_gemv_a8_wg and a compacted weight's
resident layout), in mixgemm.tuning.A8_WGMMA_SMALL_M (per-block activation scales: where its CTAs fill their waves,
A8_WGMMA_BLOCK_SCALES_*) and from M = mixgemm.tuning.A8_WGMMA_MIN_M (int8 per-channel weights go back to the Triton
kernel from A8_W8_PER_CHANNEL_TRITON_FROM_M outside the BM 256 / MC 2 region); at M <= 64 its tile is M rounded up to
16 tokens with a cluster split-K where the CTAs leave SMs idle.
"""

from __future__ import annotations

import functools

import torch

import mixgemm.tuning as tuning
from mixgemm.kernels import int8_activations as shared
from mixgemm.kernels.cuda_wgmma import wave_cost as _wave_cost
from mixgemm.kernels.layouts import WGMMA_A8_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not

NAME = "cuda_wgmma_a8"


def can_run(p: Problem):
    if why := shared.symmetric_cuda_reason(p):
        return no(why)
    if p.act_mode == "sym_full" and p.k > shared.SYM_FULL_MAX_K:
        return no(f"act_mode 'sym_full' at K={p.k} > {shared.SYM_FULL_MAX_K} (codes of -128: int32 range of the sums)")
    if why := shared.wgmma_a8_reason(p):
        return no(why)
    if p.k % 16:
        return no(f"K={p.k} not a multiple of 16")
    if not shared.nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    if not p.device.sm90:
        return no(f"needs sm_90, the GPU is sm_{p.device.capability[0]}{p.device.capability[1]}")
    if p.resident == "wgmma_a8_v1":
        return OK  # a compacted weight: the kernels the tuning would prefer read other layouts
    if p.m < tuning.A8_WGMMA_MIN_M:
        why = _small_m_decline(p)
        if why:
            return prefer_not(f"M={p.m} below M={tuning.A8_WGMMA_MIN_M} and {why}, where the Triton int8 kernel runs "
                              "(tuning)")
    if p.bits == 8 and p.per_channel and p.m >= tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M:
        from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import w8_wide_region

        if not w8_wide_region(p.m, p.n, p.k):
            return prefer_not(f"int8 per-channel at M={p.m} >= {tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M} outside the "
                              "BM 256 / MC 2 region: the Triton kernel measured faster (tuning)")
    return OK


def _small_m_decline(p: Problem) -> str | None:
    """Why a call below A8_WGMMA_MIN_M stays off the CUDA int8 GEMM (tuning.A8_WGMMA_BLOCK_SCALES_FROM_M for per-block
    activation scales, tuning.A8_WGMMA_SMALL_M for per-token ones), None if not."""
    if not p.per_token:
        if p.m < tuning.A8_WGMMA_BLOCK_SCALES_FROM_M:
            from mixgemm.kernels.cuda.gemv_launch import wave_efficiency
            from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import column_tiles

            tiles = column_tiles(p.n, 2)  # (below, split-K fills the SMs: gemm_wgmma_a8.split_k_rule)
            eff = wave_efficiency(tiles, p.device.sm_count)
            if tiles > p.device.sm_count and eff < tuning.A8_WGMMA_BLOCK_SCALES_MIN_WAVE_EFFICIENCY:
                return (f"activation scales per block below M={tuning.A8_WGMMA_BLOCK_SCALES_FROM_M} with {tiles} CTAs "
                        f"filling {eff:.2f} of their waves (< {tuning.A8_WGMMA_BLOCK_SCALES_MIN_WAVE_EFFICIENCY}: the "
                        "per-group fold's last wave)")
        return None
    lo, hi = tuning.A8_WGMMA_SMALL_M
    if not lo <= p.m <= hi:
        return f"outside M {lo}..{hi}"
    return None


def _cluster_slots(p: Problem) -> dict[int, int] | None:
    """{split: clusters of that many CTAs the GPU holds at once}, the GPCs' cluster residency from the table's wave
    model (None without one)."""
    cost = _wave_cost(p.device.table["name"])
    return None if cost is None else {s: cost.slots(s, p.device.sm_count) for s in cost.cluster_slots}


@functools.cache
def _token_tile_costs(table_name: str):
    """The table's a8_tiles section (gemm_wgmma_a8.TokenTileCosts), None without one."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import TokenTileCosts

    raw = tuning.load_table(table_name).get("a8_tiles")
    return None if raw is None else TokenTileCosts.parse(raw, f"{table_name}.json a8_tiles")


def _layout(p: Problem):
    """(the weight's int8 GEMM layout, whether the call runs its no-fold tile: per-token activations over integer group
    scales, gemm_wgmma_a8.qs_layout)."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import LAYOUT, build_wgmma_a8_v1, qs_layout

    lay = p.qw.layout(LAYOUT, build_wgmma_a8_v1)
    return lay, bool(p.per_token and lay.num_groups > 1 and qs_layout(lay))


def config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import (
        SPLIT_MAX_M,
        column_tiles,
        default_config,
        split_k_rule,
        tail_split_rule,
        token_tile,
    )

    lay, qs = _layout(p)
    cfg = default_config(p.m, p.n, p.k, lay.group_size, lay.bits, qs=qs)
    # (the in-launch quantizer is compiled for "sym" only: other modes quantize in a launch of their own)
    fq = int(p.per_token and p.act_mode == "sym" and quantizing_pays(p.m, p.n, p.k))
    slots = _cluster_slots(p)
    costs = _token_tile_costs(p.device.table["name"])
    if costs is not None and not fq:
        # the token tile from the wave count (BM 128 .. 256 against the partial last wave; where TAIL takes a partial
        # wave, against its split). Not with the quantizer in the launch (FQ): its blocks hold SMs the rounds do not
        # count, and the token tiles were measured without it.
        tail_slots = (slots or {}) if p.m > SPLIT_MAX_M and p.k >= tuning.A8_TAIL_MIN_K else None
        moved = token_tile(p.m, p.n, lay.bits, lay.per_channel, qs, cfg, costs, p.device.sm_count, tail_slots)
        if moved["BM"] != cfg["BM"]:
            cols = column_tiles(p.n, 2)
            moved = tuning.SourcedConfig(moved, f"{p.device.table['name']}.json a8_tiles: BM {cfg['BM']} -> "
                                                f"{moved['BM']} ({-(-p.m // cfg['BM']) * cols} -> "
                                                f"{-(-p.m // moved['BM']) * cols} CTAs on {p.device.sm_count} SMs: "
                                                "the fewest rounds x round time)")
        cfg = moved
    if p.m <= SPLIT_MAX_M:
        # cluster split-K where the tiles leave SMs idle
        cfg["SPLIT"] = split_k_rule(p.m, p.n, p.k, lay.bits, cfg,
                                    tuning.A8_SPLIT_PER_CHANNEL_MIN_CTA_BYTES if lay.per_channel else None,
                                    p.device.sm_count, slots)
    elif p.k >= tuning.A8_TAIL_MIN_K:
        # a partial last wave runs as cluster split-K tiles, as many slices as the GPU holds clusters of at once
        cfg["TAIL"] = tail_split_rule(p.m, p.n, cfg, p.device.sm_count, slots)
    cfg["FQ"] = fq
    return cfg


def candidates(p: Problem) -> list[dict]:
    """`mixgemm tune`'s configs beside the entry's: past the small-M tiles, the token tiles (BM 128..256 in steps of
    16 with the stages that fit; for the folding tiles, which keep BM <= 128, BM 64 / 128) and, where a partial wave
    follows a whole one, one launch and every TAIL split; at small M (one token tile) the cluster split-K factors;
    MC 1 / 2 where the column tiles pair up."""
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import (
        SPLIT_MAX_M,
        column_tiles,
        ring_stages,
        tail_rows,
        token_tile_kind,
    )

    lay, qs = _layout(p)
    base = dict(config(p))
    nwg, kt = int(base.get("NWG", 2)), int(base.get("KT", 2))
    if p.m <= SPLIT_MAX_M:
        cands = [{**base, "SPLIT": split} for split in (1, 2, 4)]
    else:
        # the token tiles reach BM 256 with two stages; the folding tiles keep BM <= 128 and three (default_config)
        no_fold = token_tile_kind(lay.bits, lay.per_channel, qs) is not None
        bms, least = (range(128, 257, 16), 2) if no_fold else ((64, 128), 3)
        cands = [{**base, "BM": b, "STAGES": ring_stages(b, nwg, lay.bits, kt, lay.per_channel, least, 4)} for b in bms]
        if tail_rows(p.m, p.n, {**base, "TAIL": 2}, p.device.sm_count)[0]:
            cands += [{**base, "TAIL": split} for split in (0, *gemm_wgmma.TAIL_SPLITS)]
        if column_tiles(p.n, nwg) % 2 == 0:
            cands.append({**base, "MC": 1 if int(base.get("MC", 1)) == 2 else 2})
    out: list[dict] = []
    for c in cands:
        if c != base and c not in out:
            out.append(c)
    return out


def quantizing_pays(m: int, n: int, k: int) -> bool:
    """Whether a call quantizes its activations inside the GEMM's launch (one launch, gemm_wgmma_a8.cu A8_FQ) rather
    than in a launch of its own: up to tuning.A8_QUANTIZING_MAX_M rows on any layer, and small products beyond (its
    GPU time measured lower or level there; its host time is one launch less everywhere)."""
    return m <= tuning.A8_QUANTIZING_MAX_M or m * n * k <= tuning.A8_QUANTIZING_MAX_MACS


def run(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import gemm_wgmma_a8

    aq, sa, _, _ = shared.act_quant(x2d, p.k if p.per_token else p.group_size, p.act_mode)
    return gemm_wgmma_a8(aq, sa, qw, bias, lo, hi, out_dtype, config=config)


def prepare(p: Problem, qw, config):
    from mixgemm.kernels.cuda import act_quant_rows
    from mixgemm.kernels.cuda.launch import new_rows
    from mixgemm.kernels.cuda.stream_buffers import SCRATCH_LOCK, quantizer_counters, stream_scratch
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import OutputRows
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import prepare_wgmma_a8, scratch_bytes

    dev = torch.device("cuda", p.device.index if p.device.index is not None else torch.cuda.current_device())
    k, per_token, act_mode = p.k, p.per_token, p.act_mode
    m, n, x_dtype, block = p.m, p.n, p.x_dtype, k if per_token else p.group_size
    index = dev.index
    rows = OutputRows(x_dtype, n, True, dev)
    # FQ 1 (per-token scales, where the tile allows): the GEMM that quantizes x itself, one launch for the eager call;
    # under CUDA-graph capture, whose replays pay no host time, the two launches (their GPU time is the lower one).
    # Where the tile does not allow it, the launch prepared is the plain GEMM itself. Its quantizer is "sym"'s only.
    fq = per_token and act_mode == "sym" and config is not None and config.get("FQ", 0)
    gemm = prepare_wgmma_a8(qw, m, k, per_token, rows, config, quantize_from=x_dtype if fq else None)
    quantizing = None
    if gemm.quantizes:
        quantizing, gemm = gemm, prepare_wgmma_a8(qw, m, k, per_token, rows, dict(config, FQ=0))
    rows_quantizer = None
    if per_token and k % 8 == 0 and k <= 8 * act_quant_rows.ACTQ_NT * act_quant_rows.ACTQ_MAX_CPT:
        # prepared, the one-pass row kernel costs no more host time than the GEMM launch at any K
        rows_quantizer = act_quant_rows.prepare_act_quant_rows(m, k, x_dtype, dev, act_mode)
    scales_at = m * k  # a multiple of 16 (K % 16 == 0): the scales' float32 [M] start aligned
    quantizing_bytes = scratch_bytes(m, k)

    def launch(x2d, bias, lo, hi):
        y = new_rows(m, n, x_dtype, dev)
        aligned = x2d.data_ptr() % 16 == 0 and (x2d.stride(0) * x2d.element_size()) % 16 == 0  # 16-byte row loads
        if quantizing is not None and not torch._C._cuda_isCurrentStreamCapturing():
            if not aligned:
                x2d = x2d.clone()  # rows the kernel's 16-byte loads can read (the caller's tensor is untouched)
            # the launch's scratch and counters are this stream's (a launch on it uses them only after the one before
            # it is done): no lock, a single launch has nothing to queue between
            stream = torch._C._cuda_getCurrentRawStream(index)
            scratch = stream_scratch(index, stream, quantizing_bytes)  # (held through the launch)
            return quantizing.launch_quantizing(x2d, scratch.data_ptr(), quantizer_counters(index, stream).data_ptr(),
                                                bias, lo, hi, y, stream)
        if rows_quantizer is not None and aligned:
            # the codes, the scales and (unused by the sym GEMM, one slot for both) the offsets and sums, consumed by
            # the GEMM right after on the same stream: that stream's scratch (kept between calls at decode sizes)
            stream = torch._C._cuda_getCurrentRawStream(index)
            with SCRATCH_LOCK:  # the quantizer and the GEMM reading its scratch are queued together
                scratch = stream_scratch(index, stream, scales_at + 8 * m)  # (held through the launches)
                base = scratch.data_ptr()
                rows_quantizer.launch_into(x2d, base, k, base + scales_at, base + scales_at + 4 * m,
                                           base + scales_at + 4 * m, stream)
                return gemm.launch_from(base, base + scales_at, bias, lo, hi, y, stream)
        aq, sa, _, _ = shared.act_quant(x2d, block, act_mode)
        return gemm(aq, sa, bias, lo, hi, y)

    launch.quantizes = quantizing is not None  # (outside graph capture)
    return launch


ENTRY = KernelEntry(NAME, "linear_a8", can_run, config, run, WGMMA_A8_V1, "Hopper int8 wgmma GEMM, large M",
                    candidates=candidates, prepare=prepare)
