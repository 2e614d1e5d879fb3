"""mixgemm's tuning data and its lookup: the one place where measured numbers live.

The kernels never look tuning up: the registry's entries (mixgemm.kernels.registry) read it here and hand each
kernel its config. Data: the per-GPU tables (src/mixgemm/tuning/<gpu>.json, below), mixgemm.tuning.gemv_m1 (the
GEMV's M = 1 tiles), mixgemm.tuning.gemv_steps (its fitted step costs for the other layers) and
mixgemm.tuning.conv_table (the convolution sweeps). All of it is keyed by buckets
(mixgemm.tuning.buckets: half-octave classes of K and N, regions of them, power-of-two M buckets), never by an exact
layer shape, and every entry says where its numbers came from (``source``; ``measured``: the layer it was measured
on). :func:`table_entry` returns the config with that provenance attached (mixgemm.explain prints it).

A table is chosen from the GPU name (``H100`` -> h100.json, ``H200`` -> h200.json, anything else ->
default.json). Its fields:

* ``gemv_max_m``: {"4": m, "8": m}: largest M served by the CUDA GEMV per weight bit width (measured
  crossover; the GEMV supports M <= 16). ``gemv_max_m_no_wgmma`` (optional): the same where the Triton GEMM, not the
  wgmma GEMM, takes over (fp32 activations, MIXGEMM_WGMMA=0).
* ``gemv_all_m_below_n`` (optional): layers with fewer output features than this keep the GEMV for every M <= 16
  (their wgmma grid is under one wave and needs split-K, which costs more than it saves at small M).
* ``wgmma_from_m`` (optional): a list of entries {"format": ``w4g128`` / ``w8pc``... (bits and group size),
  "region", "from_m", "measured", "source"}: layers of that format in the region go to the wgmma GEMM for every
  M >= from_m (measured to beat the GEMV down to that M); it takes precedence over the two rules above and applies
  only where the wgmma GEMM runs. The regions are single buckets (a partial section: other layers keep the rules).
* ``gemv_over_wgmma`` (optional): a list of rules {"bits": [...], "min_fill": f, "multiwave_max_k": k, "source"}, at
  most one per bit width: for weights of those bit widths the GEMVs keep every M <= ``max_m`` (optional, 16 if not
  given) where the output tiles of the wgmma GEMM that would take over (its config at that M, split-K not counted)
  fill less than ``f`` of their last wave, or need more than one wave on a layer with K <= ``k``
  (its small-M tiles then idle SMs or re-stream short rows, while the tensor-core GEMV's k-split fills the GPU);
  with ``"single_wave_max_k": k1`` also wherever the tiles fit in one wave on a layer with K <= k1.
  Applied by the registry's crossover (mixgemm.kernels.gemv_crossover.gemv_limit); ``wgmma_from_m`` regions win over it.
* ``gemv_min_wave_fill`` (optional): {"m": [lo, hi], "min_fill": f, "min_weight_bytes": b, "source"}: at M lo..hi,
  on layers of at least b bytes of codes, the wgmma GEMM takes over from the GEMVs where the tensor-core GEMV's blocks
  fill less than ``f`` of their waves (mixgemm.kernels.cuda_gemv_mma.host.mma_wave_fill); ``wgmma_from_m`` regions
  decide
  their own layers. Applied by the registry's crossover (mixgemm.kernels.gemv_crossover.gemv_limit).
* ``gemv_one_wave_k_split`` (optional): {"max_spill": w, "source"}: at M 2..8 the tensor-core GEMV takes KS 8 instead
  of the k-split rule's 16 where KS 16's blocks take 1 to w waves and KS 8's fit in one
  (mixgemm.kernels.cuda_gemv_mma.host.one_wave_k_split).
* ``gemv_mma_wg_16row`` (optional): {"source"}: int4 sym weights on wgmma_v1 (compacted) at M 9..16 take the tensor-core
  GEMV tiles of mixgemm.kernels.cuda_gemv_mma.host.wg_16row_tiles (KS 8 with two blocks' registers at the k-split's
  cap, RT 2
  with U 2 below it where its blocks fit one wave) instead of the RT rule's.
* ``wgmma_small_m`` (optional): the wgmma GEMM's small-M split model
(mixgemm.kernels.cuda_wgmma.wgmma_waves.SmallMCost):
  the tile, the M range, the cluster splits it ranks, CTAs per SM and clusters held at once per bit width (the
  driver's occupancy counts), the fitted constants per bit width and ``source``. In its M range, where the ``wgmma``
  section's tile makes fewer output tiles than ``max_table_tiles_per_sm`` (default 1) x SMs and is neither serial
  split-K nor (with ``keep_stream_k``, the default) stream-K, the wgmma entry takes the tile with the split the model
  ranks first.
* ``wgmma_small_m_family`` (optional, with ``wgmma_small_m``): {"m": [lo, hi], "tiles": [...], "buckets": [...],
  "source"} (mixgemm.kernels.cuda_wgmma.wgmma_waves.SmallMFamily): variants of the small-M tile (NWG, KT), each with its
  CTAs per SM, clusters held at once and fitted constants per bit width (the ``wgmma_small_m`` model's), and entries
  {"bits", "region", "source"}: at M lo..hi a layer of that bit width in a region goes to the wgmma GEMM (ahead of
  the GEMVs, gemv_over_wgmma and gemv_min_wave_fill) with the variant and cluster split the models rank first
  (measured buckets: ``python -m tools.bench.small_m_family`` over a ``gemv_dispatch.py --small-m-tiles`` sweep).
* ``gemv_mma_m1`` (optional): a list of entries {"bits", "region", "source"}: fp16 activations at M = 1 take the
  tensor-core GEMV (not the CUDA-core one) on layers of that bit width in the region (small layers, where its 16-way
  k-split finishes first). The entries of one bit width are disjoint.
* ``gemv_simt_m1_bf16`` (optional): the same form for bf16 activations at M = 1, which take the tensor-core GEMV
  except in these regions, where they take the CUDA-core GEMV (its exact fp32 math measured faster there).
* ``gemm``: {weight key: [entry, ...]}, weight key ``w4g`` / ``w4pc`` / ``w8g`` / ``w8pc`` (bits, grouped or
  per-channel); each entry {"region", "measured" (optional), "source", "configs": {M bucket: config}}. The
  entries of a weight key partition all shapes (checked on load). The measured layers are the protocol's
  up-projections K x N = 4096 x 14336 and 8192 x 28672 and down-projections 14336 x 4096 and 28672 x 8192; their
  entries reach over the buckets of their kind: layers of size class k + n >= 48 (4096 x 4096 and up), wide (aspect
  n - k >= 0) ones split at K 6888 | 6889 (k class 25 | 26), tall (aspect < 0) ones at K 19483 | 19484 (k class
  28 | 29): the class boundary nearest the geometric mean of the two measured K (5793, a tie between 24 | 25 and
  25 | 26; 20274). The split is by K because what the tiles tune (pipeline depth, KT, FOLD, split-K, stream-K)
  follows the k-tiles per CTA; N is left to the configs' "auto" split, computed from the N tiles against the SMs.
  The ``'*'`` entry takes the smaller layers and, in a weight key without measured down-projections, the tall ones,
  as the old "nearest measured shape within a factor of 4, else '*'" rule did for every protocol shape.
* ``wgmma``: the same structure for the Hopper wgmma GEMM (mixgemm.kernels.cuda_wgmma.gemm_wgmma; keys BM, NWG,
  STAGES, INFLIGHT, SPLIT, GROUP_M...), which serves fp16 / bf16 activations on sm_90 past the GEMV.
* ``gemm_source`` / ``wgmma_source``: the benchmarks behind the sections (each entry's source points there).
* ``wgmma_waves`` (optional): the wgmma GEMM's wave model (mixgemm.kernels.cuda_wgmma.wgmma_waves): candidate tiles with
  their measured step times, the launch and cluster-reduction costs, the clusters of each split the GPU holds at once,
  ``from_m``, ``margin`` and ``source``. From ``from_m`` the wgmma entry ranks the ``wgmma`` section's tile against
  them and cluster split-K by the wave count; the table's tile stays unless another is estimated ``margin`` x faster.
  Its optional ``token_tiles`` part ({"from_m", "margin", "tail_us", "round_us": {"int4" / "int8": {BM: {"fixed_us",
  "step_us"}}}, "source"}, wgmma_waves.TokenTiles) sizes a BM 256 one-launch choice's BM from its rounds.
* ``a8_tiles`` (optional): the int8 wgmma GEMM's token tile model
  (mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8.TokenTileCosts): {"from_m", "margin", "tail_round", "round_us": {family:
  {"mc1" / "mc2": {BM: us}}}, "source"}, families ``w4 qs`` (int4 with integer group scales, per-token activations) and
  ``w8 per channel``: the time one round of CTAs of each BM takes per 1024 k. From ``from_m`` the int8-activation entry
  takes the BM of fewest rounds x round time where it is estimated ``margin`` x faster than default_config's
  (gemm_wgmma_a8.token_tile).
* ``conv_waves`` (optional): the implicit-GEMM conv's wave model (mixgemm.kernels.cuda_conv_wgmma.conv_waves):
  {"launch_us", "k_tile_floor_us", "macs_per_us", "stage_us", "reduce_us", "max_m", "min_k", "source"}. A conv layer
  the conv sweep does not hold, with at most ``max_m`` output pixels and K of at least ``min_k``, takes the tile and
  cluster split the model ranks first.
* ``routed_experts`` (optional): {"grouped_from_rows", "source"}: past a few tokens a quantized MoE layer runs its
  slots through the grouped tensor-core GEMM where they number at least ``grouped_from_rows`` per expert they reach,
  else through the routed GEMV (mixgemm.nn.experts.path). Without it calls past the few tokens take the per-expert
  layers.
* A missing M bucket takes the nearest listed bucket.

No autotuning at run time: the same (M, N, K, weight format, GPU) always yields the same config.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.tuning.buckets import (
    M_BUCKETS,
    BucketEntry,
    Region,
    ShapeBucket,
    SourcedConfig,
    check_partition,
    find,
    m_bucket,
    nearest_m,
)

BUCKETS = M_BUCKETS  # the M buckets (1 .. 16384)


def gpu_table_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "default"
    return table_name_for(torch.cuda.get_device_name(device))


def table_name_for(gpu_name: str) -> str:
    """The table of a GPU model name ("NVIDIA H100 80GB HBM3" -> "h100"; unknown GPUs -> "default")."""
    name = gpu_name.upper()
    for key in ("H200", "H100"):
        if key in name:
            return key.lower()
    return "default"


def source_of(raw: dict, where: str, what: str) -> str:
    """The 'source' string of a table section or entry (where its numbers came from), or a ValueError naming
    ``what`` (every measured value in a table says where it came from)."""
    if not isinstance(raw.get("source"), str) or not raw["source"]:
        raise ValueError(f"{where}: {what} needs a 'source' string")
    return raw["source"]


def _entry(raw: dict, value, where: str) -> BucketEntry:
    measured = raw.get("measured")
    source = source_of(raw, where, "every entry")
    return BucketEntry(Region.parse(raw.get("region"), where), value, source,
                       None if measured is None else (int(measured["k"]), int(measured["n"])))


# the M = 1 kernel-choice sections: {"bits", "region", "source"} entries, disjoint per bit width
M1_SECTIONS = ("gemv_mma_m1", "gemv_simt_m1_bf16")


def regions_by_bits(entries: list[dict], where: str) -> dict[int, tuple[BucketEntry, ...]]:
    """{"bits", "region", "source"} entries (the M = 1 sections, wgmma_small_m_family's buckets) grouped by bit width,
    checked disjoint within each."""
    by_bits: dict[int, list] = {}
    for i, e in enumerate(entries):
        by_bits.setdefault(int(e["bits"]), []).append(_entry(e, True, f"{where} {i}"))
    for bits, lst in by_bits.items():
        check_partition(lst, f"{where} w{bits}", complete=False)
    return {bits: tuple(lst) for bits, lst in by_bits.items()}


def parse_table(raw: dict, name: str) -> dict:
    """The table ``raw`` (parsed JSON) with its bucket sections as BucketEntry lists, checked: in "gemm" and
    "wgmma" each weight key's entries partition all shapes, "wgmma_from_m" entries of one format are disjoint."""
    table = dict(raw)
    for section in ("gemm", "wgmma"):
        parsed = {}
        for wkey, lst in raw.get(section, {}).items():
            where = f"{name}.json {section} {wkey}"
            parsed[wkey] = tuple(_entry(e, e["configs"], f"{where} entry {i}") for i, e in enumerate(lst))
            check_partition(parsed[wkey], where, complete=True)
        table[section] = parsed
    by_format: dict[str, list] = {}
    for i, e in enumerate(raw.get("wgmma_from_m", [])):
        by_format.setdefault(e["format"], []).append(_entry(e, int(e["from_m"]), f"{name}.json wgmma_from_m {i}"))
    for fmt, lst in by_format.items():
        check_partition(lst, f"{name}.json wgmma_from_m {fmt}", complete=False)
    table["wgmma_from_m"] = {fmt: tuple(lst) for fmt, lst in by_format.items()}
    for section in M1_SECTIONS:
        table[section] = regions_by_bits(raw.get(section, []), f"{name}.json {section}")
    table["gemv_over_wgmma"] = _gemv_over_wgmma_rules(raw, name)
    _check_section(raw, name, "routed_experts", ("grouped_from_rows",))
    table["name"] = name
    return table


def _gemv_over_wgmma_rules(raw: dict, name: str) -> dict[int, dict]:
    """The table's gemv_over_wgmma rules by bit width, checked (ValueError naming the rule otherwise)."""
    by_bits: dict[int, dict] = {}
    for i, rule in enumerate(raw.get("gemv_over_wgmma", [])):
        _check_entry(rule, f"{name}.json gemv_over_wgmma {i}", ("bits", "min_fill", "multiwave_max_k"))
        for bits in map(int, rule["bits"]):
            if bits in by_bits:
                raise ValueError(f"{name}.json gemv_over_wgmma {i}: a second rule for int{bits}")
            by_bits[bits] = rule
    return by_bits


def _check_entry(entry, where: str, fields: tuple[str, ...]) -> None:
    """``entry`` holds ``fields`` and a 'source' string (ValueError naming them otherwise)."""
    if not (isinstance(entry, dict) and isinstance(entry.get("source"), str) and entry["source"]
            and set(fields) <= set(entry)):
        raise ValueError(f"{where} needs {', '.join(repr(f) for f in fields)} and 'source'")


def _check_section(raw: dict, name: str, section: str, fields: tuple[str, ...]) -> None:
    """An optional one-entry section holds ``fields`` and a 'source' string (ValueError naming them otherwise)."""
    entry = raw.get(section)
    if entry is not None:
        _check_entry(entry, f"{name}.json {section}", fields)


@functools.cache
def load_table(name: str) -> dict:
    """The parsed, checked table ``name`` (h100, h200, default)."""
    path = resources.files("mixgemm.tuning").joinpath(f"{name}.json")
    if not path.is_file():
        name = "default"
        path = resources.files("mixgemm.tuning").joinpath("default.json")
    return parse_table(json.loads(path.read_text()), name)


@functools.cache
def _device_table(index: int | None, type_: str) -> dict:
    dev = torch.device(type_, index) if index is not None else torch.device(type_)
    return load_table(gpu_table_name(dev))


def table_for(device: torch.device) -> dict:
    return _device_table(device.index, device.type)


def weight_key(qw: QuantizedWeight) -> str:
    return f"w{qw.bits}{'pc' if qw.num_groups == 1 else 'g'}"


def table_entry(table: dict, section: str, m: int, n: int, k: int, qw: QuantizedWeight) -> SourcedConfig | None:
    """A copy of the config ``table`` lists for this problem in ``section`` ("gemm" / "wgmma"), or None; its
    ``source`` names the table, the bucket, the entry's region and where the entry's numbers came from."""
    entries = table.get(section, {}).get(weight_key(qw))
    if not entries:
        return None
    bucket = ShapeBucket.of(k, n)
    hit = find(entries, bucket)
    if hit is None:
        return None
    mb, listed = m_bucket(m), nearest_m(hit.value, m)
    m_text = f"M bucket {mb}" + (f" (the entry's nearest listed: {listed})" if listed != mb else "")
    where = f"{table.get('name', '?')} table, {section} {weight_key(qw)}, {m_text}, {hit.where(bucket)}"
    return SourcedConfig(hit.value[str(listed)], where)


def exact_weight_key(qw: QuantizedWeight) -> str:
    """``w<bits>g<group size>`` or ``w<bits>pc``: the format key of the fields that depend on the group size."""
    return f"w{qw.bits}pc" if qw.num_groups == 1 else f"w{qw.bits}g{qw.group_size}"


def wgmma_from_m_entry(table: dict, qw: QuantizedWeight, k: int, n: int) -> BucketEntry | None:
    """The table's wgmma_from_m entry whose region holds a K x N layer of this weight format, or None."""
    return find(table.get("wgmma_from_m", {}).get(exact_weight_key(qw), ()), ShapeBucket.of(k, n))


def m1_entry(table: dict, section: str, bits: int, k: int, n: int) -> BucketEntry | None:
    """The entry of an M = 1 section (M1_SECTIONS) holding a K x N layer of that bit width, or None."""
    return find(table.get(section, {}).get(bits, ()), ShapeBucket.of(k, n))


def gemv_mma_m1_entry(table: dict, bits: int, k: int, n: int) -> BucketEntry | None:
    """The table's gemv_mma_m1 entry (fp16 at M = 1 on the tensor-core GEMV) holding a K x N layer, or None."""
    return m1_entry(table, "gemv_mma_m1", bits, k, n)


def gemv_simt_m1_bf16_entry(table: dict, bits: int, k: int, n: int) -> BucketEntry | None:
    """The table's gemv_simt_m1_bf16 entry (bf16 at M = 1 on the CUDA-core GEMV) holding a K x N layer, or None."""
    return m1_entry(table, "gemv_simt_m1_bf16", bits, k, n)


def gemv_over_wgmma(table: dict, bits: int, k: int, tiles: int, num_sms: int) -> tuple[int, str] | None:
    """(the largest M the GEMVs keep, why) against a wgmma launch of ``tiles`` output tiles on a layer of K = k (the
    table's gemv_over_wgmma rule for the bit width), or None when no rule applies."""
    rule = table.get("gemv_over_wgmma", {}).get(bits)
    if rule is None or tiles < 1:
        return None
    waves = -(-tiles // num_sms)
    fill = tiles / (waves * num_sms)
    if waves == 1 and k <= rule.get("single_wave_max_k", 0):
        why = f"the wgmma GEMM's {tiles} output tiles fit in one wave ({fill:.0%} of the SMs) at K = {k}"
    elif fill < rule["min_fill"]:
        why = f"the wgmma GEMM's {tiles} output tiles fill {fill:.0%} of their last wave (< {rule['min_fill']:.0%})"
    elif waves > 1 and k <= rule["multiwave_max_k"]:
        why = f"the wgmma GEMM needs {waves} waves on a layer with K = {k} <= {rule['multiwave_max_k']}"
    else:
        return None
    return int(rule.get("max_m", 16)), why


def routed_experts(table: dict) -> dict | None:
    """The table's ``routed_experts`` costs (above), or None."""
    return table.get("routed_experts")


def gemv_max_m(table: dict, qw: QuantizedWeight, n: int | None = None, wgmma: bool = True,
               k: int | None = None) -> int:
    """Largest M that goes to the CUDA GEMV for a layer of n output features and k input features, when the wgmma
    GEMM (wgmma=True) or the Triton GEMM serves larger M (from ``table``, a GPU's table; 16 if not listed)."""
    if wgmma and n is not None and k is not None:
        hit = wgmma_from_m_entry(table, qw, k, n)
        if hit is not None:
            return hit.value - 1
    if n is not None and n < table.get("gemv_all_m_below_n", 0):
        return 16
    limits = table.get("gemv_max_m", {}) if wgmma else table.get("gemv_max_m_no_wgmma", table.get("gemv_max_m", {}))
    return int(limits.get(str(qw.bits), 16))


# ------------------------------------------------------------------ act-order: where the tensor-core GEMV gathers x
# Source: none measured beyond the decode case: the tensor-core GEMV gathers per lane at M = 1; larger M keep one
# gather before the kernel until tools/checks/actorder_gpu.py --m M --dtype bfloat16 (which times both) says otherwise.
MMA_GATHER_MAX_M = 1


# ------------------------------------------------------------------ compacted weights: M = 1 on wgmma_v1
# A compacted layer (QuantLinear.compact_) keeps its codes only in wgmma_v1, so its M = 1 call runs either the
# tensor-core GEMV on that layout (cuda_gemv_mma: gemv_mma.cu MMA_WG) or the CUDA-core GEMV on it (cuda_gemv_wg_simt:
# gemv_wg_simt.cu, tiles from kernels.cuda_gemv_wg_simt.host.wg_simt_config). Source: tools/bench/gemv_dispatch.py
# --compact-only over the 80 layers of the model list (H100, fp16, W4 g128 sym / zero point, W8 per channel): the
# CUDA-core GEMV was the faster of the two on 174 of 240 (layer, format) cases and by geometric mean in every size class
# (time against the plain codes' GEMV, CUDA-core / tensor-core: W4 sym < 4 MiB 0.83 / 0.92, 4-16 MiB 0.96 / 1.18, >= 16
# MiB 1.02 / 1.10; W8 4-16 MiB 1.07 / 1.32, >= 16 MiB 1.04 / 1.08). Except on the small layers of the table's
# gemv_mma_m1 buckets (where the plain codes take the tensor-core GEMV at fp16 M = 1): the same tool on the 19 layers
# under 8M weights after the CUDA-core GEMV's tiles (H100, us, CUDA-core / tensor-core on wgmma_v1 / the plain codes'
# dispatch), int4 on wgmma_v1 0.68-1.03x the CUDA-core GEMV's time on the 11 layers in those buckets (1536x2048 sym 3.36
# / 2.19 / 2.00, 896x4864 3.51 / 2.49 / 2.17, 3584x2048 zero point 4.10 / 3.75 / 3.67; 2304x1024 sym 2.85 / 2.93 / 2.56
# the one loss), 0.75-1.67x outside them; where the CUDA-core GEMV's one-step tile applies
# (kernels.cuda_gemv_wg_simt.host.wg_simt_one_step) it beat both there too, so those layers take it. bf16 x runs the
# same fp16 math there (exact fp16 under a power of two per k-tile, gemv_wg_simt.cu) and takes the same tiles: before /
# after (tools/bench/dispatch_ab.py, both configs forced, the 80 layers, W4 g128 sym and W8 per channel, compacted; the
# tensor-core GEMV bf16 took before against this), H100 0.80-0.92x the time by geometric mean per format and size class
# for W4, 0.64-0.94x for W8 (0.43-1.05x per layer; 36864x4608 W4 47.5 -> 39.9 us), H200 0.78-0.87x / 0.63-0.92x
# (0.41-1.06x), the worst the large W8 layers (4096x14336, 3584x14336 1.04-1.06x); fp16's own call and the bf16 one
# level (1.00-1.03x). The activation dtypes at which a compacted M = 1 call takes the CUDA-core GEMV:
COMPACT_M1_SIMT_DTYPES = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ int8-activation linear: kernel ranges by M
# Source: tools/bench/gemv_a8.py and tools/bench/int8.py (H200, then H100), the fused CUDA GEMV against the
# Triton kernel's 16-row mma tile: M = 2 won on both LLM shapes, M = 4 lost on 28672x8192 and for W8 per-channel,
# M = 16 was 3.5x slower (the dp4a work grows with M, the tensor-core tile's does not).
A8_GEMV_MAX_M = 2
# The same fused GEMV on the int8 GEMM's layout (kernels/cuda_gemv_a8_wg/gemv_a8_wg.cu; the only copy a compacted W8A8 /
# W4A8 weight keeps) up to this M; above, the GEMMs. Source: tools/bench/gemv_a8_wg.py (H100, 6 layers of 2048x2048 to
# 28672x8192, W4A8 g128 per-block and per-token, W8A8 per channel): at M = 4 0.52-0.97x the time of what the plain
# weight ran (the Triton / CUDA int8 GEMM), one case of 18 1.04x; at M = 16 1.4-2.5x (the dp4a work grows with M).
A8_WG_GEMV_MAX_M = 4
# ... except int8 weights of more than this many weights above M = A8_GEMV_MAX_M: the same benchmark measured the CUDA
# int8 GEMM level or faster there (8192x28672 1.00-1.01x, 28672x8192 1.04-1.08x the GEMV's time at M = 4; 14336x4096
# and smaller 0.68-0.99x).
A8_WG_GEMV_INT8_MAX_WEIGHTS = 64 << 20
# A weight with per-block activation scales over int4 codes keeps the GEMV up to this M on layers of at most
# A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS weights. Source: tools/bench/gemv_a8_wg.py --ms 5,8 (H200, W4A8 g128, whole
# calls, against the CUDA int8 GEMM with its BM 16 tile and cluster split-K): the GEMV took 0.52x its time on
# 2048x2048 (4.7 against 9.1 us; the Triton kernel 9.4) and 0.87x on 4096x4096, but 1.12-1.91x from 26M weights
# (5120x5120, 4096x14336, 14336x4096, 3584x18944, 8192x28672).
A8_WG_GEMV_BLOCK_SCALES_MAX_M = 8
A8_WG_GEMV_BLOCK_SCALES_MAX_WEIGHTS = 16 << 20
# Source: tools/bench/wgmma_a8.py (H200 / H100): from this M the sym x sym calls with a wgmma_a8_v1 weight take
# the CUDA int8 wgmma GEMM instead of the Triton kernel.
A8_WGMMA_MIN_M = 128
# Source: tools/bench/a8_small_m.py (H200, whole calls: the activation quantizer and the GEMM, CUDA graph over layer
# copies; 4 layers of 59-235M weights, M = 5 / 16) with the CUDA kernel's small-M tile (BM = M rounded up to 16) and
# cluster split-K (gemm_wgmma_a8.split_k_rule), against the Triton int8 kernel: W8 per-channel 0.84-0.94x its time
# (8192x28672 65.7 vs 72.0 us at M = 5, 14336x4096 23.3 vs 24.9, 3584x18944 28.8 vs 30.9), W4 g128 per-token
# 0.52-0.75x (the Triton path regroups per-token scales per weight group), integer group scales 0.57-0.84x; GEMM only
# (tools/bench/wgmma_a8.py --splits, 8 layers of 4-235M weights) 0.49-0.96x at M = 5 and 16. Before the BM 16 tile
# and the split, BM 64 tiles lost on layers of few long CTAs (14336x4096: 32 CTAs streaming 1.8 MB each, 32.9 vs 29.3
# us at M = 4). So sym calls with per-token scales in this M range take the CUDA kernel (M 65..127 were not measured
# and stay with the Triton kernel).
A8_WGMMA_SMALL_M = (A8_GEMV_MAX_M + 1, 64)
# The int8 GEMM's cluster split-K at M <= 64 (gemm_wgmma_a8.split_k_rule: the split with the fewest k-tiles on the
# busiest SM, cluster residency from the table's wgmma_waves.cluster_slots). Per-channel weights (one int32 sum over
# K, nothing to dequantize but the codes) split only where a CTA of SPLIT 1 streams at least this many weight bytes.
# Source: tools/bench/wgmma_a8.py --splits 1,2,3,4,8 (H200, GEMM only, M 4 / 5 / 16 / 64; 10 layers from 2048x2048 to
# 28672x8192, W8 per-channel, W4 g128 per-block, per-token and with integer group scales): W8 per-channel took
# 0.70-0.94x the SPLIT 1 time at 1.75-3.5 MiB a CTA (14336x4096 S 3, 18944x3584 S 4, 28672x8192 and 13824x5120 S 2)
# but 0.93-1.10x at 0.25-1 MiB (2048x2048, 4096x4096, 5120x5120, 8192x8192); the int4 kernels (the fold, and the
# integer group scales' multiplies) gained at every size (0.42-0.94x), and the rule's split was the fastest measured
# or within 5% of it on every case (the threshold and the rule were fitted on these cases).
A8_SPLIT_PER_CHANNEL_MIN_CTA_BYTES = 3 << 19
# Per-block activation scales (act_block "group") take the CUDA int8 GEMM from this M, and below it (from M = 3) unless
# its CTAs (64 x NWG rows each, one per SM) spill past one wave and fill under A8_WGMMA_BLOCK_SCALES_MIN_WAVE_EFFICIENCY
# of their waves (mixgemm.kernels.cuda.gemv_launch.wave_efficiency; under one wave the split-K fills the SMs): there the
# Triton kernel. Source: H200, tools/bench/a8_small_m.py (whole
# calls, W4A8 g128, M = 5 / 16) with the BM 16 tile and cluster split-K: the CUDA GEMM took 0.71-0.88x the Triton
# kernel's time on 8192x28672 (224 CTAs: 0.85 of two waves), 14336x4096 and 4096x14336 (112: 0.85 of one), but
# 1.09-1.12x on 3584x18944, whose 148 CTAs leave the second wave 12% full (wave efficiency 0.56); GEMM only
# (tools/bench/wgmma_a8.py --splits) 0.81-0.96x on 8 layers of 4-235M weights at M = 5 and 16. From M = 17: H100,
# `mixgemm bench` with the "mixgemm W4A8 g128" method beside "... compact", whole calls, 8 layers of 2048x2048 to
# 28672x8192: at M = 64 the CUDA GEMM (BM 64, no split) took 0.40-0.61x the Triton kernel's time on every layer
# (2048x2048 13.5 vs 22.1 us, 4096x4096 20.0 vs 39.4, 8192x28672 67.7 vs 115.3, 28672x8192 97.5 vs 246.3: the Triton
# kernel's time doubles to triples from M = 16 to 64).
A8_WGMMA_BLOCK_SCALES_FROM_M = 17
A8_WGMMA_BLOCK_SCALES_MIN_WAVE_EFFICIENCY = 0.75
# int8 per-channel weights go back to the Triton kernel from this M, except where the CUDA kernel's BM 256 / MC 2
# tiles apply (gemm_wgmma_a8.w8_wide_region: K >= 3584, M >= 2048; there tools/bench/int8.py --w8-cuda measured the
# CUDA kernel 4-8% faster at K >= 8192 and mixgemm bench 1.5-6.5% at K 3584..4096, H100 whole calls). Source: H100,
# whole W8A8 per-token calls, the dispatch's kernel against the CUDA GEMM forced (kernel_options(force=
# "cuda_wgmma_a8"), as tools/bench/int8.py --w8-cuda; protocol graph timing, medians of 3 in turns, one process): the
# Triton kernel from M = 4096 at K <= 3072 (the CUDA GEMM 1.07-1.12x its time on 2048x2048, 2304x9216, 3072x9216 at
# M = 4096, 2048x11008 and 3072x3072 at M = 16384);
# below, the CUDA GEMM: at M = 1024 0.47-0.98x on all 13 layers timed (2048x2048 22.8 -> 15.2 us, 8192x1024 65.4 ->
# 31.0, 28672x8192 454.0 -> 410.5), at M = 2048 0.98-1.02x on six K <= 3072 layers and 0.59x on 4864x896. (The
# earlier H200 cross sweep, tools/bench/wgmma_a8.py, before the BM 256 / MC 2 tiles and TAIL, had put it at 1024.)
A8_W8_PER_CHANNEL_TRITON_FROM_M = 4096
# The int8 wgmma GEMM with the per-token activation quantizer inside its launch (gemm_wgmma_a8.cu A8_FQ: one launch
# per call instead of the row quantizer's and the GEMM's). Source: mixgemm bench --call-overhead (H100, 2048x2048,
# median of paired rounds): host time per eager call 1.25-1.34x nn.Linear's with two launches, 0.96-1.05x with one;
# compiled without CUDA graphs 1.26-1.35x -> 1.14-1.21x (three runs). GPU time, one launch over two
# (tools/bench/a8_quantizing.py, H100, protocol graph timing, medians of 3, W8 per channel and W4 g128 integer scales):
# M 16..64 0.82-0.997x on 2048x2048, 4096x4096, 4096x14336 and 8192x28672 (4096x4096 M = 16 12.5 / 14.0 us); M = 256
# 0.90-0.98x up to 4096x4096, 1.01-1.04x on the two large layers; M = 512 0.99-1.00x on 2048x2048, 1.02-1.21x from
# 4096x4096 (its quantizer blocks hold SMs that the GEMM's blocks then wait for); M = 2048 1.02-1.22x. So the one
# launch up to this M on any layer, and beyond it while the product has at most A8_QUANTIZING_MAX_MACS
# multiply-adds (2048x2048 at M = 512); outside CUDA-graph capture only (cuda_wgmma_a8: a captured call would need its
# counters zeroed by a memset node of the graph's own, which costs what the one launch saves).
A8_QUANTIZING_MAX_M = 64
A8_QUANTIZING_MAX_MACS = 1 << 31
# The int8 wgmma GEMM's TAIL past the small-M tiles (gemm_wgmma_a8.tail_split_rule: the partial last wave's weight
# rows run as a second, chained launch of split-K clusters, as many slices as fit at once) from this K. Source of the
# split-2 figures, measured before the launches were chained:
# tools/bench/a8_tail.py (H100, whole calls with the quantizer, medians of 3 in turns, W8 per channel and W4 g128
# integer scales per token, M 1024 / 2048 / 4096, time against one launch; every pair bit-equal): K 13824-36864
# 0.82-0.96x (27648x5120 M = 2048 W8A8 581.6 -> 512.3 us, 1.48x -> 1.68x fp16 cuBLAS; 36864x4608 M = 1024 W4A8
# 449.6 -> 369.0), K 8192-9216 0.95-1.00x (8192x3072, 9216x2304), but K 4096-5120 1.01-1.06x (4096x4608, 5120x5120,
# 5120x7168): a split slice there is too short for its pipeline fill and the second launch's wait for the first.
# Chained, K 4096-5120 still measured 0.96-1.04x one launch (split 3 / 4 up to 1.41x), so the bound stays.
A8_TAIL_MIN_K = 8192
# The per-token row quantizer (kernels/cuda_gemv_a8/gemv_a8.py act_quant_rows): 8-element units per thread its row block
# aims at. One block per row, so fewer threads per row put more rows (more bytes) in flight per SM; the quantizer is
# latency-bound per wave of blocks. H100, tools/bench/a8_parts.py (protocol
# graph timing, medians of 3, per-token, W8 per channel): the quantizer alone at K = 4096 M = 2048 / 4096 10.8 / 25.5
# us with 1 unit (512 threads a row), 7.6 / 18.5 with 2, 6.9 / 18.2 with 4, 7.3 / 18.8 with 8; K = 5120 11.5 / 25.9
# -> 9.7 / 22.9 with 4; whole calls 4096x4096 71.3 -> 67.7 us, 4608x4096 M = 4096 156.6 -> 150.2; K >= 16384 rows
# already run 512 threads of >= 4 units (unchanged).
A8_ACTQ_UNITS = 4
