"""GGUF mixture-of-experts tensors -> a model's quantized experts modules.

llama.cpp stores a layer's experts as 3-D tensors, ``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``
[E, out, in] of blocks along ``in``, expert-major, where transformers 5 holds ``gate_up_proj`` [E, 2 I, H] (the gate
rows, then the up rows) and ``down_proj`` [E, H, I]; transformers' GGUF name map maps those tensors' names without
their ``.weight`` suffix to the fused parameters (its MoE tensor processor's fallback), which ``GgufExperts.take``
follows. A module is loaded once all of its tensors have been read. Where all are quantized types, each expert's
slice of the blocks converts like a 2-D GGUF weight (exact where the type has an exact form, no float round trip) and
its gate and up rows become one ``gate_up_proj.<e>`` layer (conversions.fuse_rows). Where one is float, or filter_fn
leaves the module out, the tensors are dequantized into the fused float parameters, which ``quantization_config``
then quantizes as quantize_ does (else they stay float). Experts with biases (GPT-OSS) are refused by name.
"""

from __future__ import annotations

import re

import torch

from mixgemm.checkpoints import gguf_file, skeleton
from mixgemm.checkpoints.base import ConvertedLinear, quant_linear
from mixgemm.checkpoints.conversions import fuse_rows
from mixgemm.nn.experts import experts_shape, holds_fused_experts, prepare_skeleton

_PART = re.compile(r"^(?P<base>.*\.ffn_(?P<w>gate|up|down)_exps)\.weight$")
_ORDER = {"gate": 0, "up": 1, "down": 0}  # the row order of a fused parameter's parts (gate rows first)


class GgufExperts:
    """The GGUF file's expert tensors, gathered per fused parameter of ``model`` until each experts module is whole
    (``names``: gguf_file.name_map's GGUF name -> transformers key)."""

    def __init__(self, model, names: dict[str, str]):
        self.model, self.names = model, names
        self.owner: dict[str, str] = {}  # fused parameter key -> its experts module's name
        for name, mod in model.named_modules():
            shape = experts_shape(mod) if name and holds_fused_experts(mod) else None
            if shape is not None and not isinstance(shape, str):
                self.owner.update({f"{name}.{proj}": name for proj in shape.names})
        # fused parameter key -> how many GGUF tensors make it: gate and up for gate_up_proj, else one
        self.expected = {key: 2 if key.endswith(".gate_up_proj") else 1 for key in self.owner}
        self.keys: dict[str, list[str]] = {}  # experts module -> its fused parameter keys
        for key, module in self.owner.items():
            self.keys.setdefault(module, []).append(key)
        self.parts: dict[str, dict[int, object]] = {}
        self.loaded: set[str] = set()

    def _key(self, gguf_name: str) -> str | None:
        m = _PART.match(gguf_name)
        key = self.names.get(m["base"]) if m else None
        return key if key in self.owner else None

    def take(self, tensor) -> str | bool:
        """Keep ``tensor`` if it is one of an experts module's 3-D tensors: the module's name when its tensors are now
        all taken (load it), else True; False for any other tensor."""
        key = self._key(tensor.name)
        if key is None:
            return False
        slot = _ORDER[_PART.match(tensor.name)["w"]] if self.expected[key] > 1 else 0
        self.parts.setdefault(key, {})[slot] = tensor
        module = self.owner[key]
        if all(len(self.parts.get(k, ())) == self.expected[k] for k in self.keys[module]):
            self.loaded.add(module)
            return module
        return True

    def missing(self) -> list[str]:
        """The fused parameters short of their tensors in modules some of whose expert tensors the file has."""
        started = {self.owner[k] for k in self.parts}
        return [k for k, m in self.owner.items()
                if m in started and m not in self.loaded and len(self.parts.get(k, ())) < self.expected[k]]

    def load(self, name: str, processor, quantization_config, filter_fn, device, dtype, requantize_bits: int,
             report) -> None:
        """Put the experts module ``name`` into the model (module docstring), recording it in ``report``."""
        from mixgemm.ggml.gguf_types import FLOAT_TYPES

        mod = self.model.get_submodule(name)
        shape = experts_shape(mod)
        if shape.has_bias or shape.transposed:
            raise ValueError(f"GGUF experts of {name!r}: mixgemm reads GGUF experts into modules without biases whose "
                             f"weights are [E, out, in] ({type(mod).__name__} has biases or transposed weights)")
        tensors = {proj: [self.parts[f"{name}.{proj}"][i] for i in sorted(self.parts[f"{name}.{proj}"])]
                   for proj in shape.names}
        excluded = filter_fn is not None and not filter_fn(mod, name)
        floats = [t.tensor_type.name in FLOAT_TYPES for ts in tensors.values() for t in ts]
        quantized = not any(floats)
        if quantized and not excluded:
            prepare_skeleton(self.model, [f"{name}.{proj}.{e}" for proj in shape.names
                                          for e in range(shape.num_experts)])
            for proj in shape.names:
                for e in range(shape.num_experts):
                    layer = f"{name}.{proj}.{e}"
                    parts, exact = [], True
                    for t in tensors[proj]:
                        qw, ok = gguf_file.quantized_weight(t, processor, requantize_bits, expert=e)
                        parts.append(ConvertedLinear(weight=qw))
                        exact = exact and ok
                    ql = quant_linear(fuse_rows(parts, layer), getattr(mod, proj)[e], layer, device)
                    skeleton.put_module(self.model, layer, ql)
                    report.quantized.append(layer)
                    if not exact:
                        qtypes = "/".join(t.tensor_type.name for t in tensors[proj])
                        report.inexact[layer] = f"GGUF {qtypes} re-quantized to {ql.bits}-bit group {ql.group_size}"
            return
        for proj, ts in tensors.items():
            value = torch.cat([gguf_file.float_tensor(t, processor) for t in ts], dim=1)
            skeleton.put_tensor(self.model, f"{name}.{proj}", value.to(dtype).to(device))
        if excluded:
            report.skipped[name] = f"excluded by filter_fn; dequantized to {dtype}"
        elif quantization_config is None:
            report.skipped[name] = ("stored as float in the GGUF file" if all(floats) else
                                    "stored partly as float in the GGUF file: dequantized") + \
                " (pass quantization_config to quantize it)"
        else:
            from mixgemm.quantize_api import quantize_experts_module

            quantize_experts_module(name, mod, quantization_config, None, set(), False, report.quantized,
                                    report.skipped, [])


__all__ = ["GgufExperts"]
