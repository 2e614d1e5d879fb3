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
    parameter's model key -> {expert: its checkpoint keys in the converter's pattern order}, with ``concat`` per fused
    key (whether the patterns are concatenated along dim 1, else one pattern stacked)."""

    renamed: dict[str, str] = field(default_factory=dict)
    experts: dict[str, dict[int, list[str | None]]] = field(default_factory=dict)
    concat: dict[str, bool] = field(default_factory=dict)

    def consumed(self) -> set[str]:
        """The checkpoint keys the fused parameters read."""
        return {k for per in self.experts.values() for keys in per.values() for k in keys if k is not None}


def read_conversions(model, keys) -> Conversions | None:
    """The Conversions of the checkpoint ``keys`` for ``model`` (its transformers conversion mapping), or None when the
    model has no mapping or this transformers has none. ValueError for a converter whose operations are not the
    stack-and-concatenate of per-expert weights."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model, add_legacy=False)
    except Exception:  # an older transformers, or a model it has no mapping for
        return None
    if not mapping:
        return None
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    out = Conversions()
    for key in keys:
        new, pattern = rename_source_key(key, renamings, converters)
        if pattern is None:
            if new != key:
                out.renamed[new] = key
            continue
        conv = by_pattern.get(pattern)
        if conv is None:
            raise ValueError(f"checkpoint tensor {key!r}: transformers converts it by pattern {pattern!r}, which "
                             f"mixgemm could not trace to a converter")
        ops = [(type(op).__name__, getattr(op, "dim", None)) for op in conv.operations]
        if ops not in ([_STACK], [_STACK, _CONCAT]):
            raise ValueError(f"checkpoint tensor {key!r}: transformers converts it to {new!r} with {conv.operations}; "
                             f"mixgemm's loader reads per-expert tensors stacked (MergeModulelist(dim=0)) and "
                             f"concatenated (Concatenate(dim=1)) only: load the float model with transformers and "
                             f"quantize it with mixgemm.quantize_")
        found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), key)
        if found is None or not found.groups():
            raise ValueError(f"checkpoint tensor {key!r}: no expert index where pattern {pattern!r} has one")
        slots = out.experts.setdefault(new, {}).setdefault(int(found.group(1)), [None] * len(conv.source_patterns))
        slots[conv.source_patterns.index(pattern)] = key
        out.concat[new] = len(ops) == 2
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
    return torch.cat(stacked, dim=1) if conv.concat[key] else stacked[0]


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


__all__ = ["Conversions", "RenamedSource", "fused_expert_tensor", "read_conversions"]
