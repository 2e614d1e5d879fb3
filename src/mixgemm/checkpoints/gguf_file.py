"""GGUF files (llama.cpp) -> a transformers model whose quantized Linears are QuantLinear.

The file is read with ``gguf.GGUFReader`` (memory-mapped). transformers' own GGUF support supplies everything
model-specific: the config (``AutoConfig.from_pretrained(dir, gguf_file=...)``), the GGUF -> transformers tensor
names (``get_gguf_hf_weights_map``) and the per-architecture tensor processors (e.g. Llama's reverse
permutation of the q / k rows). Quantized Linear weights go to QuantLinear without a float round trip
(mixgemm.ggml.gguf_types: which types are exact); the processors' row reorderings are applied to the packed rows
and their scales, found by running the processor on the row indices. Everything else (embeddings, norms,
float Linears) is dequantized with gguf and cast to the requested dtype, as transformers does.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import torch

from mixgemm.formats.weight import QuantizedWeight


def open_reader(path: str):
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:  # gguf raises ValueError / struct / numpy errors for a damaged file
        raise ValueError(f"cannot read GGUF file {path}: {e} (truncated or not a GGUF file?)") from None


def architecture(reader) -> str:
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError("the GGUF file has no general.architecture")
    return bytes(field.parts[field.data[0]]).decode()


# GGUF metadata (per architecture: "<arch>.<key>") -> config attribute, where transformers' GGUF config mapping has
# no entry for it (qwen2moe / qwen3moe files then took the config class's default expert widths: right for
# Qwen3-30B-A3B's 768, wrong for Qwen3-235B-A22B's 1536)
_MISSED_CONFIG = {"expert_feed_forward_length": "moe_intermediate_size",
                  "expert_shared_feed_forward_length": "shared_expert_intermediate_size"}


def config_fixes(reader, arch: str, config, given: dict) -> dict[str, int]:
    """{config attribute: the file's value} for the metadata transformers does not read (_MISSED_CONFIG) where the
    config has the attribute, the caller did not pass it (``given``) and the file says otherwise."""
    out = {}
    for key, attr in _MISSED_CONFIG.items():
        field = reader.fields.get(f"{arch}.{key}")
        if field is None or attr in given or not hasattr(config, attr):
            continue
        value = int(field.parts[field.data[0]][0])
        if getattr(config, attr) != value:
            out[attr] = value
    return out


def tensor_processor(arch: str, config):
    """transformers' tensor processor for a GGUF architecture (the identity for most)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())


def name_map(model, processor, arch: str) -> dict[str, str]:
    """GGUF tensor name -> transformers state_dict key, as transformers maps them: gguf's tensor-name table for the
    file's architecture, transformers' processor for the renames and fallbacks. (transformers'
    get_gguf_hf_weights_map does the same, but rebuilds the table once per submodule: seconds on a 30-layer
    model.) A key is looked up whole, then without its leading module names, as that function's recursion does."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_ids = [k for k, v in MODEL_ARCH_NAMES.items() if v == arch]
    if not arch_ids:
        raise ValueError(f"GGUF architecture {arch!r} is unknown to the installed gguf package")
    table = get_tensor_name_map(arch_ids[0], model.config.num_hidden_layers)
    out: dict[str, str] = {}
    for key in model.state_dict(keep_vars=True):
        hf_name = processor.preprocess_name(key)
        base, suffix = hf_name, ""
        if hf_name.endswith((".weight", ".bias")):
            base, suffix = hf_name.rsplit(".", 1)
            suffix = "." + suffix
        parts = base.split(".")
        for i in range(len(parts)):
            gguf_name = table.get_name(".".join(parts[i:]))
            if gguf_name is not None:
                out.setdefault(gguf_name + suffix, hf_name)
                break
        else:
            processor.perform_fallback_tensor_mapping(out, suffix, "", hf_name)
    return out


def row_order(processor, gguf_name: str, rows: int) -> np.ndarray | None:
    """The row permutation transformers' processor applies to tensor ``gguf_name`` (None: rows unchanged).
    ValueError when the processor does more than reorder whole rows (it could not be applied to packed rows)."""
    probe = np.arange(rows, dtype=np.int64).reshape(rows, 1)
    out = processor.process(weights=probe.copy(), name=gguf_name)
    got = np.asarray(out.weights)
    if out.name != gguf_name or got.shape != probe.shape or not np.array_equal(np.sort(got[:, 0]), probe[:, 0]):
        raise ValueError(f"GGUF tensor {gguf_name!r}: transformers' tensor processor for this architecture does more "
                         "than reorder its rows, which mixgemm cannot apply to a quantized weight")
    perm = got[:, 0]
    return None if np.array_equal(perm, probe[:, 0]) else perm


def permute_rows(qw: QuantizedWeight, perm: np.ndarray | None) -> QuantizedWeight:
    if perm is None:
        return qw
    idx = torch.from_numpy(perm)
    take = lambda t: None if t is None else t[idx].contiguous()
    return replace(qw, qweight=take(qw.qweight), scales=take(qw.scales), zeros=take(qw.zeros),
                   offsets=take(qw.offsets), _layouts={})


def torch_shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's shape in torch order (GGUF lists the fastest dimension first)."""
    return tuple(int(s) for s in reversed(tensor.shape.tolist()))


def float_tensor(tensor, processor) -> torch.Tensor:
    """A GGUF tensor dequantized by gguf to float32 and passed through transformers' processor."""
    from gguf import quants

    try:
        values = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}: {e}") from None
    values = np.asarray(values).reshape(torch_shape(tensor))
    out = processor.process(weights=values, name=tensor.name)
    return torch.from_numpy(np.array(out.weights, dtype=np.float32, copy=True))


def quantized_weight(tensor, processor, requantize_bits: int = 8,
                     expert: int | None = None) -> tuple[QuantizedWeight, bool]:
    """A quantized GGUF Linear weight as a QuantizedWeight in transformers' row order, and whether it is exact
    (requantize_bits: the width of the types re-quantized, mixgemm.ggml.gguf_types). ``expert``: expert e's weight
    of a 3-D experts tensor [E, out, in] (its slice of the blocks), else the tensor is the 2-D weight."""
    from mixgemm.ggml.gguf_types import route_of, to_quantized_weight

    shape, data, name = torch_shape(tensor), tensor.data, tensor.name
    if expert is not None and len(shape) == 3:
        shape, data, name = shape[1:], data[expert], f"{tensor.name}[{expert}]"
    if len(shape) != 2:
        raise ValueError(f"GGUF tensor {tensor.name!r} has shape {torch_shape(tensor)}; a Linear weight is 2-D"
                         + (", an experts tensor 3-D" if expert is not None else ""))
    qw = to_quantized_weight(data, tensor.tensor_type, shape, name, requantize_bits)
    exact = route_of(tensor.tensor_type.name, requantize_bits).exact
    return permute_rows(qw, row_order(processor, tensor.name, shape[0])), exact


def split(path: str, gguf_file: str | None) -> tuple[str, str]:
    """(directory, file name) of a GGUF checkpoint given as transformers takes it, or as one file path."""
    if gguf_file is None:
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    return path, gguf_file


__all__ = ["architecture", "config_fixes", "float_tensor", "name_map", "open_reader", "permute_rows",
           "quantized_weight", "row_order", "split", "tensor_processor", "torch_shape"]
