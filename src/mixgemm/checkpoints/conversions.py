"""Float checkpoints stored under their original names, which transformers converts on loading.

transformers 5 keeps some architectures' tensors under other names than their published checkpoints: Mixtral's
``block_sparse_moe`` is its ``mlp``, and the experts of Mixtral, Qwen2 / Qwen3 MoE, OLMoE, DeepSeek ... are stored one
tensor per expert and projection (``experts.<e>.gate_proj.weight`` / ``up_proj`` / ``down_proj``, Mixtral's ``w1`` /
``w3`` / ``w2``) but held fused, ``gate_up_proj`` [E, 2 I, H] and ``down_proj`` [E, H, I]. The model's conversion
mapping (``transformers.conversion_mapping.get_model_conversion_mapping``) says how: WeightRenaming rules, and
WeightConverters that stack a pattern's experts (MergeModulelist, dim 0) and concatenate the patterns (Concatenate,
dim 1). ``read_conversions`` applies transformers' own renaming (``core_model_loading.rename_source_key``) to the
checkpoint's keys and returns the renamed keys and, per fused parameter, each expert's checkpoint keys, so the
layer-by-layer loader reads one experts module at a time, builds its fused parameters with those two operations and
quantizes it before the next (``fused_expert_tensor``). Converters with other operations are refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

# the converter operations fused_expert_tensor applies: (class name, dim)
_STACK, _CONCAT = ("MergeModulelist", 0), ("Concatenate", 1)


@dataclass
class Conversions:
    """What a checkpoint's names become: ``renamed`` model key -> checkpoint key (renamings); ``experts`` fused
    parameter's model key -> {expert: its checkpoint keys in the converter's pattern order} (one pattern stacked, or
    several stacked and concatenated along dim 1)."""

    renamed: dict[str, str] = field(default_factory=dict)
    experts: dict[str, dict[int, list[str | None]]] = field(default_factory=dict)

    def consumed(self) -> set[str]:
        """The checkpoint keys the fused parameters read."""
        return {k for per in self.experts.values() for keys in per.values() for k in keys if k is not None}


@dataclass
class NameMapping:
    """A model's transformers conversion mapping, split into its renamings and its converters."""

    renamings: list
    converters: list
    rename_source_key: object  # transformers.core_model_loading.rename_source_key

    def rename(self, key: str) -> str:
        """``key`` after the renamings only (a quantized layer's tensors match no converter pattern)."""
        return self.rename_source_key(key, self.renamings, [])[0]

    def classify(self, key: str) -> tuple[str, tuple[int, int, int] | None]:
        """(the model key, None) for a key the converters leave alone, else (the fused parameter's key, (expert,
        pattern index, patterns)). ValueError for a converter that is not stack-and-concatenate."""
        new, pattern = self.rename_source_key(key, self.renamings, self.converters)
        if pattern is None:
            return new, None
        conv = next((c for c in self.converters if pattern in c.source_patterns), None)
        if conv is None:
            raise ValueError(f"checkpoint tensor {key!r}: transformers converts it by pattern {pattern!r}, which "
                             f"mixgemm could not trace to a converter")
        ops = [(type(op).__name__, getattr(op, "dim", None)) for op in conv.operations]
        if ops not in ([_STACK], [_STACK, _CONCAT]) or (ops == [_STACK] and len(conv.source_patterns) > 1):
            raise ValueError(f"checkpoint tensor {key!r}: transformers converts it to {new!r} with {conv.operations}; "
                             f"mixgemm's loader reads per-expert tensors stacked (MergeModulelist(dim=0)) and "
                             f"concatenated (Concatenate(dim=1)) only: load the float model with transformers and "
                             f"quantize it with mixgemm.quantize_")
        found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), key)
        if found is None or not found.groups():
            raise ValueError(f"checkpoint tensor {key!r}: no expert index where pattern {pattern!r} has one")
        return new, (int(found.group(1)), conv.source_patterns.index(pattern), len(conv.source_patterns))


def name_mapping(model) -> NameMapping | None:
    """The model's NameMapping, or None when it has none or this transformers has no conversion mappings."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model, add_legacy=False)
    except Exception:  # an older transformers, or a model it has no mapping for
        return None
    if not mapping:
        return None
    return NameMapping([m for m in mapping if isinstance(m, WeightRenaming)],
                       [m for m in mapping if isinstance(m, WeightConverter)], rename_source_key)


def read_conversions(mapping: NameMapping | None, keys) -> Conversions | None:
    """The Conversions of the checkpoint ``keys`` under a model's ``mapping`` (name_mapping), or None without one.
    ValueError for a converter whose operations are not the stack-and-concatenate of per-expert weights."""
    if mapping is None:
        return None
    out = Conversions()
    for key in keys:
        new, part = mapping.classify(key)
        if part is None:
            if new != key:
                out.renamed[new] = key
            continue
        expert, slot, slots = part
        out.experts.setdefault(new, {}).setdefault(expert, [None] * slots)[slot] = key
    return out


def fused_expert_tensor(conv: Conversions, key: str, num_experts: int, read) -> torch.Tensor:
    """The fused parameter ``key`` built from its experts' checkpoint tensors (``read(checkpoint key)``): each
    pattern's experts stacked along dim 0, the patterns concatenated along dim 1 (the converter's operations).
    ValueError when an expert or a pattern is missing, or the experts are not 0..num_experts - 1."""
    per = conv.experts[key]
    if sorted(per) != list(range(num_experts)):
        have = sorted(per)
        raise ValueError(f"the checkpoint holds experts {have[:4]}{'...' if len(have) > 4 else ''} ({len(have)}) of "
                         f"{key!r}, the model has {num_experts}")
    missing = [(e, j) for e, keys in per.items() for j, k in enumerate(keys) if k is None]
    if missing:
        e, j = missing[0]
        raise ValueError(f"the checkpoint lacks part {j} of expert {e} of {key!r} (it has {per[e]})")
    parts = len(per[0])
    stacked = [torch.stack([read(per[e][j]) for e in range(num_experts)]) for j in range(parts)]
    return torch.cat(stacked, dim=1) if parts > 1 else stacked[0]


def split_quantized(mapping: NameMapping | None, names: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A quantized checkpoint's layers (``names``, as stored) as the model's: {model layer: stored layer} for layers
    the converters leave alone (renamed), and {per-expert layer ``<experts>.<projection>.<e>``: the stored layers
    whose rows it concatenates, in the converter's order} for experts stored per expert (GPTQ / AWQ /
    compressed-tensors MoE checkpoints). ValueError when an expert lacks one of its parts."""
    plain: dict[str, str] = {}
    parts: dict[str, list[str | None]] = {}
    for name in names:
        if mapping is None:
            plain[name] = name
            continue
        new, part = mapping.classify(f"{name}.weight")
        if part is None:
            plain[new[:-len(".weight")] if new.endswith(".weight") else name] = name
            continue
        expert, slot, slots = part
        parts.setdefault(f"{new}.{expert}", [None] * slots)[slot] = name
    for layer, stored in parts.items():
        if None in stored:
            raise ValueError(f"the checkpoint quantizes {[n for n in stored if n is not None]} for {layer!r}, which "
                             f"needs {len(stored)} parts (part {stored.index(None)} is missing)")
    return plain, parts


def fuse_rows(parts: list, layer: str):
    """One ConvertedLinear whose rows are ``parts``' in order (an expert's gate and up projections as its gate_up
    layer): the plain interchange layout is row-major, so its codes and group parameters concatenate along N.
    ValueError when the parts differ in format, K, activation mode or act-order permutation."""
    from mixgemm.checkpoints.base import ConvertedLinear
    from mixgemm.formats.weight import QuantizedWeight

    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    w0 = first.weight
    for p in parts[1:]:
        if (p.weight.shape[1], p.act_mode, p.act_block) != (w0.shape[1], first.act_mode, first.act_block):
            raise ValueError(f"{layer!r}: its parts in the checkpoint differ in K or activation mode ({w0} and "
                             f"{p.weight}): they cannot be one layer")
        if (p.input_perm is None) != (first.input_perm is None) or (
                p.input_perm is not None and not torch.equal(p.input_perm, first.input_perm)):
            raise ValueError(f"{layer!r}: its parts in the checkpoint have different act-order permutations: they "
                             f"cannot be one layer")
    if len({p.bias is None for p in parts}) > 1:
        raise ValueError(f"{layer!r}: some of its parts in the checkpoint have a bias and some not")

    weights = common_format([p.weight for p in parts], layer)

    def cat(get):
        ts = [get(w) for w in weights]
        return None if ts[0] is None else torch.cat(ts)

    qw = QuantizedWeight(qweight=cat(lambda w: w.packed()), scales=cat(lambda w: w.scales),
                         zeros=cat(lambda w: w.zeros), offsets=cat(lambda w: w.offsets), config=weights[0].config,
                         shape=(sum(w.shape[0] for w in weights), w0.shape[1]))
    bias = None if first.bias is None else torch.cat([p.bias for p in parts])
    return ConvertedLinear(qw, bias, first.input_perm, first.act_mode, first.act_block)


def common_format(weights: list, layer: str) -> list:
    """``weights`` in one format, exactly: unchanged where their formats agree; else each as offset weights (w = q s +
    m, which holds sym and zero-point weights too) of the widest bit width, with scales and offsets in the one scale
    dtype they share, else float32 -- where every m = -z s rounds to it exactly (a llama.cpp file may store an
    expert's gate as Q4_0 and its up as Q4_1); parts in groups of 16 (GGUF Q6_K / Q3_K / Q2_K) beside wider groups
    in 8-bit groups of 16, each wider group's parameters repeated. ValueError where the group sizes differ otherwise
    or an offset would round."""
    from mixgemm.formats.weight import NARROW_GROUP, QuantConfig, from_codes

    configs = {w.config for w in weights}
    if len(configs) == 1:
        return weights
    groups = {w.group_size for w in weights}
    group = min(groups)
    if len(groups) > 1 and (group != NARROW_GROUP or any(g % group for g in groups)):
        raise ValueError(f"{layer!r}: its parts in the checkpoint have different group sizes "
                         f"({sorted(map(str, configs))}): they cannot be one layer")
    bits = max(w.bits for w in weights)
    dtypes = {w.scales.dtype for w in weights}
    for dtype in ([*dtypes, torch.float32] if len(dtypes) == 1 else [torch.float32]):
        config = QuantConfig(bits=bits, group_size=group if len(groups) > 1 else weights[0].config.group_size,
                             mode="offset", scale_dtype=dtype)
        out = []
        for w in weights:
            s64, m64 = (p.repeat_interleave(w.group_size // group, dim=1) for p in w.group_params_float64())
            scales, offsets = s64.to(dtype), m64.to(dtype)
            if not (torch.equal(scales.double(), s64) and torch.equal(offsets.double(), m64)):
                break
            out.append(from_codes(w.codes(), scales, config, offsets=offsets))
        else:
            return out
    raise ValueError(f"{layer!r}: its parts in the checkpoint ({sorted(map(str, configs))}) have no common format "
                     f"that holds them exactly")


class RenamedSource:
    """A checkpoint source (keys(), get(key)) seen under the model's names: renamed keys under their new names, the
    per-expert tensors of fused parameters left out (fused_expert_tensor reads them)."""

    def __init__(self, source, conv: Conversions):
        self.source, self.conv = source, conv
        hidden = set(conv.renamed.values()) | conv.consumed()
        stored = source.keys()
        self._keys = {k for k in stored if k not in hidden} | set(conv.renamed)

    def keys(self):
        return self._keys

    def get(self, key: str) -> torch.Tensor:
        return self.source.get(self.conv.renamed.get(key, key))

    def extent(self, key: str):
        extent = getattr(self.source, "extent", None)
        return None if extent is None else extent(self.conv.renamed.get(key, key))


__all__ = ["Conversions", "NameMapping", "RenamedSource", "common_format", "fuse_rows", "fused_expert_tensor",
           "name_mapping", "read_conversions", "split_quantized"]
