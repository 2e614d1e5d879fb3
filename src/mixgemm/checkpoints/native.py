"""mixgemm's own checkpoint format: a transformers model whose Linears are QuantLinear, saved by
``model.save_pretrained``.

The tensors are QuantLinear's state dict, as is (safetensors): ``<layer>.qweight`` / ``scales`` / ``zeros`` /
``offsets`` / ``bias`` / ``_extra_state`` (the int64 format tensor that QuantLinear checks on load). config.json
carries a ``quantization_config``:

    {"quant_method": "mixgemm", "format_version": 1,
     "layers": {"model.layers.0.self_attn.q_proj": {"bits": 4, "group_size": 128, "mode": "sym",
                "scale_dtype": "float16", "act_mode": null, "act_block": "group", "bias": false}, ...}}

(plus ``"input_perm": true`` for a layer that permutes its input features, act-order checkpoints; its
``<layer>.input_perm`` int64 [K] tensor is then in the state dict.)

``quantization_config(model)`` builds that dict from a model (quantize_ and from_pretrained set it on
``model.config``); ``MixgemmFormat`` reads the layers back, checking every tensor's dtype and shape and the
stored format tensor against the config, so that a mismatch names the tensor instead of loading a wrong model;
``check_stored_layer`` does the same from the safetensors headers for transformers' loader (hf_quantizer).
"""

from __future__ import annotations

import torch
from torch import nn

from mixgemm.checkpoints.base import ConvertedLinear, TensorSource
from mixgemm.formats.packing import packed_width
from mixgemm.formats.weight import QuantConfig, QuantizedWeight

QUANT_METHOD = "mixgemm"
FORMAT_VERSION = 1
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_LAYER_KEYS = ("bits", "group_size", "mode", "scale_dtype", "act_mode", "act_block", "bias")


def layer_format(module) -> dict:
    """The per-layer entry of the quantization_config for a QuantLinear."""
    c = module.config
    fmt = {"bits": c.bits, "group_size": c.group_size, "mode": c.mode,
           "scale_dtype": str(c.scale_dtype).replace("torch.", ""), "act_mode": module.act_mode,
           "act_block": module.act_block, "bias": module.bias is not None}
    if getattr(module, "input_perm", None) is not None:  # act-order layers (GPTQ desc_act) permute their input
        fmt["input_perm"] = True
    return fmt


def quantization_config(model: nn.Module) -> dict:
    """The ``quantization_config`` dict describing every QuantLinear of ``model`` (module path -> format)."""
    from mixgemm.nn.linear import QuantLinear

    layers = {name: layer_format(m) for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    return {"quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION, "layers": layers}


def attach_quantization_config(model: nn.Module) -> None:
    """Set ``model.config.quantization_config`` (transformers models) so that ``save_pretrained`` records it, and
    have ``save_pretrained`` write the model's own tensor names (keep_module_names)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        config.quantization_config = quantization_config(model)
        keep_module_names(model)


def keep_module_names(model: nn.Module) -> None:
    """transformers 5 saves some architectures under their original checkpoints' names (Mixtral's experts as
    ``block_sparse_moe.experts.<e>.w1 / w2 / w3``, split out of the fused 3-D tensors), reversing the conversions it
    applies on loading. A quantized layer's tensors are not weights such a conversion can split, and the loaders
    read the module names the layers are listed under, so a mixgemm checkpoint is written under the model's own
    names: no conversion to reverse (transformers reads ``_weight_conversions`` of a loaded model first)."""
    model._weight_conversions = []


def check_config(qc: dict) -> dict[str, dict]:
    """The validated ``layers`` of a mixgemm quantization_config; ValueError naming the bad entry."""
    if qc.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise ValueError(f"mixgemm checkpoint format_version {qc.get('format_version')!r}; this mixgemm reads "
                         f"version {FORMAT_VERSION}")
    layers = qc.get("layers")
    if not isinstance(layers, dict):
        raise ValueError("mixgemm quantization_config has no 'layers' dict (module path -> format)")
    for name, fmt in layers.items():
        missing = [k for k in _LAYER_KEYS if k not in fmt]
        if missing:
            raise ValueError(f"mixgemm quantization_config: layer {name!r} lacks {missing}")
        if fmt["scale_dtype"] not in _DTYPES:
            raise ValueError(f"mixgemm quantization_config: layer {name!r} has scale_dtype {fmt['scale_dtype']!r}")
        weight_config(fmt, name)
    return layers


def weight_config(fmt: dict, name: str) -> QuantConfig:
    try:
        return QuantConfig(bits=fmt["bits"], group_size=fmt["group_size"], mode=fmt["mode"],
                           scale_dtype=_DTYPES[fmt["scale_dtype"]])
    except (ValueError, KeyError) as e:
        raise ValueError(f"mixgemm quantization_config: layer {name!r}: {e}") from None


def empty_quant_linear(fmt: dict, in_features: int, out_features: int, device="meta", name: str = "layer"):
    """A QuantLinear of format ``fmt`` with empty buffers on ``device`` (the skeleton's layers)."""
    from mixgemm.nn.linear import QuantLinear

    c = weight_config(fmt, name)
    ql = QuantLinear(in_features, out_features, bias=fmt["bias"], bits=c.bits, group_size=c.group_size,
                     mode=c.mode, scale_dtype=c.scale_dtype, act_mode=fmt["act_mode"], act_block=fmt["act_block"],
                     device=device)
    if fmt.get("input_perm"):
        if not hasattr(ql, "input_perm"):
            raise ValueError(f"layer {name!r} permutes its input (act-order), which this QuantLinear cannot hold")
        ql.input_perm = torch.empty(in_features, dtype=torch.int64, device=device)
    return ql


def _expect(t, name: str, dtype: torch.dtype | None, shape: tuple):
    """``t`` (a tensor, or a StoredTensor of the checkpoint's header) when it has ``dtype`` (None: any float dtype)
    and ``shape``; else a ValueError naming the tensor."""
    dtype_ok = t.is_floating_point() if dtype is None else t.dtype == dtype
    if not dtype_ok or tuple(t.shape) != tuple(shape):
        raise ValueError(f"tensor {name!r} is {t.dtype} {tuple(t.shape)}, but the quantization_config's format "
                         f"needs {dtype or 'a float dtype'} {tuple(shape)}: the checkpoint and its config.json "
                         "disagree")
    return t


def check_stored_layer(layer: nn.Module, prefix: str, stored: dict) -> None:
    """A ValueError naming the first tensor that QuantLinear ``layer``, saved under ``prefix``, needs and the
    checkpoint (``stored``: name -> StoredTensor, from its headers) lacks or holds in another dtype or shape. The
    float bias may have any float dtype (it loads in the model's); buffers the format leaves empty are not needed."""
    for key, want in layer.state_dict().items():
        name = f"{prefix}.{key}"
        if want.numel() == 0:
            continue
        if name not in stored:
            raise ValueError(f"the checkpoint has no tensor {name!r}, which its quantization_config's format needs")
        _expect(stored[name], name, None if key == "bias" else want.dtype, want.shape)


class MixgemmFormat:
    """``CheckpointFormat`` for checkpoints written by ``save_pretrained`` from a mixgemm-quantized model."""

    name = QUANT_METHOD

    def matches(self, quantization_config: dict) -> bool:
        return quantization_config.get("quant_method") == QUANT_METHOD

    def quantized_linears(self, source: TensorSource, quantization_config: dict) -> list[str]:
        return list(check_config(quantization_config))

    def convert_linear(self, source: TensorSource, prefix: str, quantization_config: dict) -> ConvertedLinear:
        fmt = check_config(quantization_config)[prefix]
        c = weight_config(fmt, prefix)
        state = source.get(f"{prefix}._extra_state")
        if state.dtype != torch.int64 or state.dim() != 1 or state.numel() not in (8, 9):
            raise ValueError(f"tensor {prefix + '._extra_state'!r} is {state.dtype} {tuple(state.shape)}, not the "
                             "int64 [8] (act-order: [9]) format tensor of a QuantLinear")
        n, k = int(state[6]), int(state[7])
        want = empty_quant_linear(fmt, k, n, name=prefix).get_extra_state()
        if not torch.equal(state.cpu(), want):
            raise ValueError(f"tensor {prefix + '._extra_state'!r} stores format {state.tolist()}, but the "
                             f"quantization_config says {fmt} (format tensor {want.tolist()})")
        _, ng = c.groups(k)
        qweight = _expect(source.get(f"{prefix}.qweight"), f"{prefix}.qweight", torch.uint8,
                          (n, packed_width(k, c.bits)))
        scales = _expect(source.get(f"{prefix}.scales"), f"{prefix}.scales", c.scale_dtype, (n, ng))
        zeros = offsets = None
        if c.mode == "zero_point":
            zeros = _expect(source.get(f"{prefix}.zeros"), f"{prefix}.zeros", torch.uint8, (n, ng))
            if zeros.numel() and int(zeros.max()) > c.qmax:
                raise ValueError(f"tensor {prefix + '.zeros'!r} holds zero points above {c.qmax} ({c.bits}-bit)")
        if c.mode == "offset":
            offsets = _expect(source.get(f"{prefix}.offsets"), f"{prefix}.offsets", c.scale_dtype, (n, ng))
        bias = None
        if fmt["bias"]:
            bias = _expect(source.get(f"{prefix}.bias"), f"{prefix}.bias", None, (n,))
        perm_name = f"{prefix}.input_perm"
        stored = source.keys()
        perm = source.get(perm_name) if perm_name in stored else None
        if (perm is None) == bool(fmt.get("input_perm")):
            raise ValueError(f"tensor {perm_name!r} is {'missing' if perm is None else 'present'}, but the "
                             f"quantization_config says the layer is {'' if perm is None else 'not '}act-order")
        qw = QuantizedWeight(qweight=qweight, scales=scales, zeros=zeros, offsets=offsets, config=c, shape=(n, k))
        return ConvertedLinear(weight=qw, bias=bias, input_perm=perm, act_mode=fmt["act_mode"],
                               act_block=fmt["act_block"])


__all__ = ["QUANT_METHOD", "MixgemmFormat", "attach_quantization_config", "check_config", "check_stored_layer",
           "empty_quant_linear", "keep_module_names", "layer_format", "quantization_config"]
