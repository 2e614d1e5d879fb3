"""Int8-activation linear (W4A8 / W8A8: x quantized to int8 per token and block): the registry's entries, in order.

* ``cuda_gemv_a8``: the fused CUDA GEMV (kernels/cuda/gemv_a8.cu: activation quantization in its prologue, dp4a),
  one launch, M <= mixgemm.tuning.A8_GEMV_MAX_M.
* ``cuda_gemv_a8_wg``: the same fused GEMV on the int8 GEMM's ``wgmma_a8_v1`` (kernels/cuda/gemv_a8_wg.cu), sym /
  sym_full activations x sym weights, M <= mixgemm.tuning.A8_WG_GEMV_MAX_M (per-block activation scales over int4
  codes: to A8_WG_GEMV_BLOCK_SCALES_MAX_M on layers of up to A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS): every such M of a
  weight that keeps only that layout (compacted), and on sm_90 the M above cuda_gemv_a8's range for plain weights.
* ``cuda_wgmma_a8``: the Hopper int8 wgmma GEMM (kernels/cuda/gemm_wgmma_a8.cu) after the activation quantizer, or
  with per-token scales quantizing in its own launch (config FQ, ``quantizing_pays``; outside CUDA-graph capture; "sym"
  activations only: "sym_full" ones take the quantizer's launch), sym / sym_full activations x sym weights with a
  ``wgmma_a8_v1`` weight, in mixgemm.tuning.A8_WGMMA_SMALL_M (per-block activation scales: where
  its CTAs fill their waves, A8_WGMMA_BLOCK_SCALES_*) and from M = mixgemm.tuning.A8_WGMMA_MIN_M (int8 per-channel
  weights go back to the Triton kernel from A8_W8_PER_CHANNEL_TRITON_FROM_M outside the BM 256 / MC 2 region); at
  M <= 64 its tile is M rounded up to 16 tokens with a cluster split-K where the CTAs leave SMs idle.
* ``triton_a8``: the Triton int8 tensor-core kernel after the activation quantizer, any M.

Run contract: ``run(x2d, qw, bias, lo, hi, config, problem, out_dtype) -> [M, N]`` (problem carries act_mode and
per_token; x2d [M, K], M >= 1). Every entry quantizes the activations in the problem's act_mode
(mixgemm.formats.activation) or declines it in can_run; the integer GEMMs take the codes and scales of either
symmetric mode alike.
"""

from __future__ import annotations

import functools

import torch

import mixgemm.tuning as tuning
from mixgemm.formats.activation import ACT_MODES, SYMMETRIC_ACT_MODES, QuantizedActivation
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda_wgmma import wave_cost as _wave_cost
from mixgemm.kernels.linear_common import nvrtc_ok, triton_device_ok
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

_XT = (torch.float16, torch.bfloat16, torch.float32)
# "sym_full" codes reach -128: an int32 sum of K products of two int8 codes holds K * 128 * 128 for K below this
SYM_FULL_MAX_K = (2**31 - 1) // (128 * 128)


def a8_problem(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device | DeviceInfo, act_mode: str,
               per_token: bool) -> Problem:
    n, k = qw.shape
    g, ng = qw.config.groups(k)
    dev = device if isinstance(device, DeviceInfo) else device_info(device)
    return Problem("linear_a8", m, n, k, x_dtype, dev, qw.bits, g, ng, qw.mode, act_mode, per_token or ng == 1,
                   resident=qw.resident, qw=qw)


# ------------------------------------------------------------------------------------ activation quantizer
def act_quant(x2d: torch.Tensor, block: int, act_mode: str, out=None):
    """(q, scales, offsets, sums) of x2d [M, K] per token and per block (bit-identical either way): the one-pass CUDA
    row kernel (x read once) for whole-row blocks where it applies, else the Triton tile kernel."""
    if x2d.is_cuda and block == x2d.shape[1]:
        from mixgemm.kernels.cuda import gemv_a8

        if gemv_a8.act_quant_rows_supported(x2d, block):
            return gemv_a8.act_quant_rows(x2d, act_mode, out=out)
    from mixgemm.kernels.triton.act_quant import act_quant as triton_act_quant

    return triton_act_quant(x2d, block, act_mode, out=out)


def per_group_params(q: torch.Tensor, sa: torch.Tensor, oa: torch.Tensor, sums: torch.Tensor, act_mode: str,
                     group: int):
    """Per-token activation parameters ([M, 1]) described per weight group ([M, G]) for the Triton kernel, which
    takes them per group (QuantizedActivation.regroup: one extra pass over the codes for the sums; the CUDA kernels
    take per-token scales directly)."""
    r = QuantizedActivation(q, sa, oa, sums, q.shape[1], act_mode).regroup(group)
    return r.scales, r.offsets, r.sums


# ----------------------------------------------------------------------------------------------- fused GEMV
def _gemv_a8_can_run(p: Problem):
    from mixgemm.kernels.cuda import gemv_a8

    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if p.x_dtype not in _XT or p.bits not in (4, 8) or p.act_mode not in ACT_MODES:
        return no(f"activation dtype {p.x_dtype}, {p.bits}-bit weights, act_mode {p.act_mode!r}")
    if not 1 <= p.m <= gemv_a8.MAX_M:
        return no(f"M={p.m} outside the kernel's 1..{gemv_a8.MAX_M}")
    if p.group_size < 32 and not p.per_channel:
        return no(f"groups of {p.group_size}: the int8-activation kernels take groups of 32 or more")
    if not nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    if p.per_channel and p.k > 65536:
        return no(f"per-channel K={p.k} > 65536 (int32 range of the unit sums)")
    if p.m > tuning.A8_GEMV_MAX_M:  # (before the shared-memory check, which builds the layout)
        return prefer_not(f"M={p.m} above the fused GEMV's range M <= {tuning.A8_GEMV_MAX_M} (tuning)")
    lay = gemv_a8.get_a8gemv_layout(p.qw)
    smem = gemv_a8.smem_bytes(lay, gemv_a8.m_bucket(p.m)) + 4096
    if smem > p.device.smem_optin:
        return no(f"needs {smem} bytes of shared memory, the GPU has {p.device.smem_optin} per block")
    return OK


def _gemv_a8_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda import gemv_a8

    lay = gemv_a8.get_a8gemv_layout(p.qw)
    return gemv_a8.config_for(lay, p.m, p.n, p.k, p.device.sm_count)


def _gemv_a8_complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda.gemv_a8 import complete_config

    return complete_config(forced)


def _run_gemv_a8(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda.gemv_a8 import gemv_a8

    return gemv_a8(x2d, qw, p.act_mode, bias, lo, hi, out_dtype, per_token=p.per_token, config=config)


def _prepare_gemv_a8(p: Problem, qw, config):
    from mixgemm.kernels.cuda.gemv_a8 import prepare_gemv_a8

    # a plan's output dtype is its activation dtype (the linear ops return x.dtype)
    return prepare_gemv_a8(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), p.act_mode, p.x_dtype,
                           p.per_token, config)


# ------------------------------------------------------------------------- fused GEMV on the GEMM's layout
def _gemv_a8_wg_can_run(p: Problem):
    from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported
    from mixgemm.kernels.cuda import gemv_a8_wg

    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if p.act_mode not in SYMMETRIC_ACT_MODES:
        return no(f"act_mode {p.act_mode!r} (takes sym activations: {SYMMETRIC_ACT_MODES})")
    if p.x_dtype not in _XT:
        return no(f"activation dtype {p.x_dtype}")
    if not a8_layout_supported(p.qw):
        return no(f"the wgmma_a8_v1 layout takes sym int4 / int8 weights with group 128, 256 or per-channel, got "
                  f"mode={p.mode!r} bits={p.bits} group={p.group_size}")
    if not 1 <= p.m <= gemv_a8_wg.MAX_M:
        return no(f"M={p.m} outside the kernel's 1..{gemv_a8_wg.MAX_M}")
    if not nvrtc_ok():
        return no("NVRTC (cuda-bindings / nvidia-cuda-nvrtc) unavailable")
    smem = gemv_a8_wg.smem_needed(p.qw, p.m) + 4096
    if smem > p.device.smem_optin:
        return no(f"needs {smem} bytes of shared memory, the GPU has {p.device.smem_optin} per block")
    if p.m > tuning.A8_WG_GEMV_MAX_M:
        why = _wg_gemv_block_scales_decline(p)
        if why:
            return prefer_not(f"M={p.m} above the fused GEMV's range M <= {tuning.A8_WG_GEMV_MAX_M} {why} (tuning)")
    if p.bits == 8 and p.m > tuning.A8_GEMV_MAX_M and p.n * p.k > tuning.A8_WG_GEMV_INT8_MAX_WEIGHTS:
        return prefer_not(f"int8 weights of {p.n * p.k >> 20}M > {tuning.A8_WG_GEMV_INT8_MAX_WEIGHTS >> 20}M at "
                          f"M={p.m}: the int8 GEMM measured as fast (tuning)")
    if p.resident != "wgmma_a8_v1" and not p.device.sm90:
        return prefer_not(f"a plain weight takes it on sm_90 only (measured there), the GPU is "
                          f"sm_{p.device.capability[0]}{p.device.capability[1]}")
    return OK


def _wg_gemv_block_scales_decline(p: Problem) -> str | None:
    """Why M above tuning.A8_WG_GEMV_MAX_M stays off the fused GEMV on wgmma_a8_v1, None where a weight with
    per-block activation scales over int4 codes keeps it (up to A8_WG_GEMV_BLOCK_SCALES_MAX_M, on layers up to
    A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS weights: the GEMMs pay a per-group fold)."""
    cap = tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS >> 20
    further = (f"(per-block activation scales over int4 codes: M <= "
               f"{tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_M} on layers of <= {cap}M weights)")
    if (p.per_token or p.bits != 4 or p.m > tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_M
            or p.n * p.k > tuning.A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS):
        return further
    return None


def _gemv_a8_wg_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda import gemv_a8_wg
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import LAYOUT, build_wgmma_a8_v1

    return gemv_a8_wg.config_for(p.qw.layout(LAYOUT, build_wgmma_a8_v1), p.m, p.device.sm_count, p.per_token)


def _gemv_a8_wg_complete(p: Problem, forced: dict) -> dict:
    from mixgemm.kernels.cuda.gemv_a8_wg import complete_config

    return complete_config(forced)


def _prepare_gemv_a8_wg(p: Problem, qw, config):
    from mixgemm.kernels.cuda.gemv_a8_wg import prepare_gemv_a8_wg

    return prepare_gemv_a8_wg(qw, p.m, p.x_dtype, torch.device("cuda", p.device.index), p.x_dtype, p.per_token,
                              config, p.act_mode)


def _run_gemv_a8_wg(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda.gemv_a8_wg import prepare_gemv_a8_wg

    return prepare_gemv_a8_wg(qw, p.m, x2d.dtype, x2d.device, out_dtype, p.per_token, config, p.act_mode)(
        x2d, bias, lo, hi)


# ---------------------------------------------------------------------------------------------- wgmma GEMM
def _wgmma_a8_can_run(p: Problem):
    from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported

    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if p.act_mode not in SYMMETRIC_ACT_MODES:
        return no(f"act_mode {p.act_mode!r} (takes sym activations: {SYMMETRIC_ACT_MODES})")
    if p.act_mode == "sym_full" and p.k > SYM_FULL_MAX_K:
        return no(f"act_mode 'sym_full' at K={p.k} > {SYM_FULL_MAX_K} (codes of -128: int32 range of the sums)")
    if not a8_layout_supported(p.qw):
        return no(f"the wgmma_a8_v1 layout takes sym int4 / int8 weights with group 128, 256 or per-channel, got "
                  f"mode={p.mode!r} bits={p.bits} group={p.group_size}")
    if p.k % 16:
        return no(f"K={p.k} not a multiple of 16")
    if not nvrtc_ok():
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
        from mixgemm.kernels.cuda.gemm_wgmma_a8 import w8_wide_region

        if not w8_wide_region(p.m, p.n, p.k):
            return prefer_not(f"int8 per-channel at M={p.m} >= {tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M} outside the "
                              "BM 256 / MC 2 region: the Triton kernel measured faster (tuning)")
    return OK


def _small_m_decline(p: Problem) -> str | None:
    """Why a call below A8_WGMMA_MIN_M stays off the CUDA int8 GEMM (tuning.A8_WGMMA_BLOCK_SCALES_FROM_M for per-block
    activation scales, tuning.A8_WGMMA_SMALL_M for per-token ones), None if not."""
    if not p.per_token:
        if p.m < tuning.A8_WGMMA_BLOCK_SCALES_FROM_M:
            from mixgemm.kernels.cuda.gemm_wgmma_a8 import column_tiles
            from mixgemm.kernels.cuda.gemv_launch import wave_efficiency

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
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import TokenTileCosts

    raw = tuning.load_table(table_name).get("a8_tiles")
    return None if raw is None else TokenTileCosts.parse(raw, f"{table_name}.json a8_tiles")


def _wgmma_a8_layout(p: Problem):
    """(the weight's int8 GEMM layout, whether the call runs its no-fold tile: per-token activations over integer group
    scales, gemm_wgmma_a8.qs_layout)."""
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import LAYOUT, build_wgmma_a8_v1, qs_layout

    lay = p.qw.layout(LAYOUT, build_wgmma_a8_v1)
    return lay, bool(p.per_token and lay.num_groups > 1 and qs_layout(lay))


def _wgmma_a8_config(p: Problem) -> dict:
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import (
        SPLIT_MAX_M,
        column_tiles,
        default_config,
        split_k_rule,
        tail_split_rule,
        token_tile,
    )

    lay, qs = _wgmma_a8_layout(p)
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


def _wgmma_a8_candidates(p: Problem) -> list[dict]:
    """`mixgemm tune`'s configs beside the entry's: past the small-M tiles, the token tiles (BM 128..256 in steps of
    16 with the stages that fit; for the folding tiles, which keep BM <= 128, BM 64 / 128) and, where a partial wave
    follows a whole one, one launch and every TAIL split; at small M (one token tile) the cluster split-K factors;
    MC 1 / 2 where the column tiles pair up."""
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import SPLIT_MAX_M, column_tiles, ring_stages, tail_rows, token_tile_kind
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma

    lay, qs = _wgmma_a8_layout(p)
    base = dict(_wgmma_a8_config(p))
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


def _run_wgmma_a8(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import gemm_wgmma_a8

    aq, sa, _, _ = act_quant(x2d, p.k if p.per_token else p.group_size, p.act_mode)
    return gemm_wgmma_a8(aq, sa, qw, bias, lo, hi, out_dtype, config=config)


def _prepare_wgmma_a8(p: Problem, qw, config):
    from mixgemm.kernels.cuda import gemv_a8
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import prepare_wgmma_a8, scratch_bytes
    from mixgemm.kernels.cuda.launch import new_rows
    from mixgemm.kernels.cuda.stream_buffers import SCRATCH_LOCK, quantizer_counters, stream_scratch
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import OutputRows

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
    if per_token and k % 8 == 0 and k <= 8 * gemv_a8.ACTQ_NT * gemv_a8.ACTQ_MAX_CPT:
        # prepared, the one-pass row kernel costs no more host time than the GEMM launch at any K
        rows_quantizer = gemv_a8.prepare_act_quant_rows(m, k, x_dtype, dev, act_mode)
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
        aq, sa, _, _ = act_quant(x2d, block, act_mode)
        return gemm(aq, sa, bias, lo, hi, y)

    launch.quantizes = quantizing is not None  # (outside graph capture)
    return launch


# ----------------------------------------------------------------------------------------------- Triton int8
def _triton_a8_can_run(p: Problem):
    if not triton_device_ok(p):
        return no("needs a CUDA device (or TRITON_INTERPRET=1)")
    if not (triton_ok("mixgemm.kernels.triton.int8_gemm") and triton_ok("mixgemm.kernels.triton.int8_layout")):
        return no("Triton unavailable")
    if p.group_size < 32 and not p.per_channel:
        return no(f"groups of {p.group_size}: the int8-activation kernels take groups of 32 or more")
    if p.bits == 4:
        from mixgemm.kernels.triton.int8_layout import pick_half

        try:
            pick_half(p.group_size, p.k)
        except ValueError as e:
            return no(str(e))
    return OK


def _triton_a8_config(p: Problem) -> dict:
    from mixgemm.kernels.triton.int8_gemm import pick_config
    from mixgemm.kernels.triton.int8_layout import pick_half

    half = pick_half(p.group_size, p.k) if p.bits == 4 else 0
    return pick_config(p.m, p.n, p.k, p.bits, p.group_size, p.per_channel, half)


def _run_triton_a8(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.triton.int8_gemm import a8_gemm
    from mixgemm.kernels.triton.int8_layout import get_int8_layout

    lay = get_int8_layout(qw)
    blk = p.k if p.per_token else p.group_size
    aq, sa, oa, suma = act_quant(x2d, blk, p.act_mode)
    if blk != lay.group_size:
        sa, oa, suma = per_group_params(aq, sa, oa, suma, p.act_mode, lay.group_size)
    return a8_gemm(aq, sa, oa, suma, lay, p.act_mode == "asym", bias, lo, hi, out_dtype, config=config)


ENTRIES = (
    KernelEntry("cuda_gemv_a8", "linear_a8", _gemv_a8_can_run, _gemv_a8_config, _run_gemv_a8,
                Layout.lazy("a8gemv_v2", "mixgemm.formats.layouts_a8", "build_a8gemv_v2"),
                "fused activation-quantizing GEMV, small M", _gemv_a8_complete, prepare=_prepare_gemv_a8),
    KernelEntry("cuda_gemv_a8_wg", "linear_a8", _gemv_a8_wg_can_run, _gemv_a8_wg_config, _run_gemv_a8_wg,
                Layout.lazy("wgmma_a8_v1", "mixgemm.formats.layouts_wgmma_a8", "build_wgmma_a8_v1"),
                "fused activation-quantizing GEMV on the int8 GEMM's layout, small M", _gemv_a8_wg_complete,
                prepare=_prepare_gemv_a8_wg),
    KernelEntry("cuda_wgmma_a8", "linear_a8", _wgmma_a8_can_run, _wgmma_a8_config, _run_wgmma_a8,
                Layout.lazy("wgmma_a8_v1", "mixgemm.formats.layouts_wgmma_a8", "build_wgmma_a8_v1"),
                "Hopper int8 wgmma GEMM, large M", candidates=_wgmma_a8_candidates, prepare=_prepare_wgmma_a8),
    KernelEntry("triton_a8", "linear_a8", _triton_a8_can_run, _triton_a8_config, _run_triton_a8,
                Layout.lazy("int8_v1", "mixgemm.kernels.triton.int8_layout", "build_int8_layout"),
                "Triton int8 tensor-core GEMM, any M"),
)
register("linear_a8", ENTRIES)
