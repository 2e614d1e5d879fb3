"""mixgemm's checkpoint format registered with transformers, so that a plain
``AutoModelForCausalLM.from_pretrained(dir)`` of a directory written by ``save_pretrained`` from a mixgemm model
rebuilds its QuantLinear layers (``quant_method: "mixgemm"``).

``register()`` adds ``MixgemmConfig`` and ``MixgemmHfQuantizer`` to transformers' registries
(``register_quantization_config`` / ``register_quantizer``). The ``mixgemm-hf.pth`` start-up hook of an installed
mixgemm, and ``import mixgemm``, arrange for it to run when transformers' quantizer registry is imported
(_mixgemm_hf_hook), so neither imports transformers. It also puts a chooser under transformers' "gptq" and "awq"
quant methods: where transformers' own loader for them cannot run (its backend, gptqmodel, is not installed: it
would raise ImportError), ``PackedFormatHfQuantizer`` loads those checkpoints onto mixgemm's layers instead; where
it can, transformers' own runs, unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from mixgemm.checkpoints import native


class MixgemmConfig(QuantizationConfigMixin):
    """A mixgemm quantization_config: ``layers`` maps module paths to their format (mixgemm.checkpoints.native)."""

    def __init__(self, layers: dict | None = None, format_version: int = native.FORMAT_VERSION, **kwargs):
        self.quant_method = native.QUANT_METHOD
        self.format_version = format_version
        self.layers = dict(layers or {})
        native.check_config(self.to_dict())

    def to_dict(self) -> dict:
        return {"quant_method": native.QUANT_METHOD, "format_version": self.format_version,
                "layers": self.layers}


class _LoadingQuantizer(HfQuantizer):
    """What the quantizers here share: they load saved checkpoints (no calibration) for inference."""

    requires_calibration = False

    @property
    def is_trainable(self) -> bool:
        return False


def _stored(checkpoint_files) -> dict | None:
    """The checkpoint's tensors (name -> StoredTensor) from its safetensors headers, or None when it has other
    files (transformers passes the shards it will read as ``checkpoint_files``)."""
    from mixgemm.checkpoints.safetensors_source import stored_tensors

    if checkpoint_files and all(str(f).endswith(".safetensors") for f in checkpoint_files):
        return stored_tensors(checkpoint_files)
    return None


class MixgemmHfQuantizer(_LoadingQuantizer):
    """Loads mixgemm checkpoints: the skeleton's listed Linears become empty QuantLinear before the weights load."""

    def validate_environment(self, *args, **kwargs):
        if not self.pre_quantized:
            raise ValueError("MixgemmConfig describes a saved mixgemm checkpoint; to quantize a float checkpoint "
                             "while loading use mixgemm.from_pretrained(path, quantization_config=mixgemm.W4A16())")

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from mixgemm.checkpoints import skeleton
        from mixgemm.nn.experts import prepare_skeleton

        # transformers would load a missing tensor as "newly initialized" memory and an integer one as it is (it
        # casts only float tensors): the checkpoint's headers are checked against the model first
        stored = _stored(checkpoint_files)
        prepare_skeleton(model, self.quantization_config.layers)  # fused experts: per-expert layer placeholders
        for name, fmt in self.quantization_config.layers.items():
            try:
                linear = model.get_submodule(name)
            except AttributeError:
                raise ValueError(f"the mixgemm quantization_config lists {name!r}, which the model lacks") from None
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"the mixgemm quantization_config lists {name!r}, which is a "
                                 f"{type(linear).__name__}, not a Linear")
            ql = native.empty_quant_linear(fmt, linear.in_features, linear.out_features, name=name)
            if stored is not None:
                native.check_stored_layer(ql, name, stored)
            if ql.bias is not None:  # the float bias loads in the model's dtype, as nn.Linear's would
                ql.bias = nn.Parameter(ql.bias.to(linear.weight.dtype), requires_grad=False)
            skeleton.put_module(model, name, ql)
        if stored is not None:  # the tensors left float (norms, embeddings, unlisted Linears) stored as floats
            for key, t in skeleton.expected_keys(model).items():
                if key in stored and isinstance(t, torch.Tensor):
                    skeleton.check_float(key, stored[key], t)
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        native.keep_module_names(model)  # saved again, it keeps the names it was loaded under
        return _as_from_pretrained(model)

    def is_serializable(self, *args, **kwargs) -> bool:
        return True


def _as_from_pretrained(model):
    """What mixgemm.from_pretrained does to a loaded model's QuantLinears, done to one transformers loaded."""
    from mixgemm.nn.norms import arrange_act_order, norm_kernels
    from mixgemm.nn.siblings import join_siblings
    from mixgemm.quantize_api import auto_compact_

    arrange_act_order(model)  # act-order layers as mixgemm.from_pretrained leaves them (exact)
    norm_kernels(model)  # the other norms: mixgemm's norm kernel on CUDA (those feeding mixgemm layers compiled too)
    auto_compact_(model)  # one resident layout per weight on an sm_90 GPU, as mixgemm.from_pretrained
    join_siblings(model)  # q / k / v and gate / up as one launch in compiled one-row calls
    return model


class _PackedTensors(nn.Module):
    """A GPTQ / AWQ layer while transformers loads it: the checkpoint's tensors of that layer (qweight, qzeros,
    scales, g_idx, bias), as buffers of their stored dtype and shape, turned into a QuantLinear afterwards."""

    def __init__(self, linear: nn.Linear, tensors: dict):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias  # the Linear's float bias loads as it would
        for attr, t in tensors.items():
            if attr != "bias":
                self.register_buffer(attr, torch.empty(t.shape, dtype=t.dtype, device="meta"))


class _DictSource:
    def __init__(self, tensors: dict):
        self.tensors = tensors

    def keys(self):
        return self.tensors.keys()

    def get(self, key: str):
        if key not in self.tensors:
            raise ValueError(f"the checkpoint has no tensor {key!r}")
        return self.tensors[key]


class PackedFormatHfQuantizer(_LoadingQuantizer):
    """Loads GPTQ and AWQ checkpoints (transformers' "gptq" and "awq" quant methods) onto mixgemm's QuantLinear,
    after ``import mixgemm``, with no GPTQ / AWQ package installed: each quantized Linear holds the checkpoint's
    tensors while transformers loads them, then becomes the QuantLinear mixgemm.from_pretrained would make
    (mixgemm.checkpoints.gptq / awq convert them, exactly)."""

    def validate_environment(self, *args, **kwargs):
        if not self.pre_quantized:
            raise ValueError(f"mixgemm loads saved {self._qc()['quant_method']} checkpoints; to quantize a float "
                             "model use mixgemm.quantize_(model, mixgemm.W4A16(method='gptq'), calibration=...)")

    def _qc(self) -> dict:
        qc = self.quantization_config
        qc = dict(qc if isinstance(qc, dict) else qc.to_dict())
        method = qc.get("quant_method")
        qc["quant_method"] = getattr(method, "value", method)  # transformers' QuantizationMethod enum
        return qc

    def _format(self):
        """(the quantization_config as a dict, mixgemm's reader of its format)."""
        from mixgemm.checkpoints import formats

        qc = self._qc()
        fmt = formats.find(qc)
        if fmt is None:
            raise ValueError(f"quant_method {qc.get('quant_method')!r} is not a format mixgemm reads")
        return qc, fmt

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from mixgemm.checkpoints import skeleton

        qc, fmt = self._format()
        stored = _stored(checkpoint_files)
        if stored is None:
            raise ValueError(f"mixgemm reads {fmt.name} checkpoints stored as safetensors; got {checkpoint_files}")
        for name in fmt.quantized_linears(_DictSource(stored), qc):
            try:
                linear = model.get_submodule(name)
            except AttributeError:
                raise ValueError(f"the checkpoint quantizes {name!r}, which the model lacks (a layer stored under "
                                 "another name, e.g. per-expert MoE layers: mixgemm.from_pretrained maps the names)"
                                 ) from None
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"the checkpoint quantizes {name!r}, which is a {type(linear).__name__}, not a "
                                 "Linear")
            prefix = f"{name}."
            tensors = {k[len(prefix):]: t for k, t in stored.items()
                       if k.startswith(prefix) and "." not in k[len(prefix):]}
            skeleton.put_module(model, name, _PackedTensors(linear, tensors))
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        from mixgemm.checkpoints import skeleton
        from mixgemm.checkpoints.base import quant_linear

        qc, fmt = self._format()
        for name, held in [(n, m) for n, m in model.named_modules() if isinstance(m, _PackedTensors)]:
            tensors = {f"{name}.{k}": v for k, v in held.named_buffers(recurse=False)}
            if held.bias is not None:
                tensors[f"{name}.bias"] = held.bias.detach()
            device = next(iter(tensors.values())).device
            converted = fmt.convert_linear(_DictSource(tensors), name, qc)
            skeleton.put_module(model, name, quant_linear(converted, held, name, device))
        return _as_from_pretrained(model)

    def is_serializable(self, *args, **kwargs) -> bool:
        return False


PACKED_METHODS = ("gptq", "awq")


def _theirs_usable() -> bool:
    """Whether transformers' own GPTQ / AWQ loaders can run here (in transformers 5 both need gptqmodel); a
    transformers that cannot say keeps its own."""
    try:
        from transformers.utils import is_gptqmodel_available
    except ImportError:
        return True
    return is_gptqmodel_available()


def _chooser(theirs: type) -> type:
    """What AUTO_QUANTIZER_MAPPING holds for a packed method: called as a quantizer class, it builds transformers'
    own (``theirs``) where that can run, else PackedFormatHfQuantizer. A subclass of ``theirs``, so that whatever
    transformers reads off the mapping's class (not an instance) is still transformers' own."""

    class PackedFormatChooser(theirs):
        original = theirs

        def __new__(cls, quantization_config, **kwargs):
            target = theirs if _theirs_usable() else PackedFormatHfQuantizer
            return target(quantization_config, **kwargs)

    return PackedFormatChooser


def register() -> None:
    """Register the config and the quantizer under "mixgemm", and the choosers under "gptq" and "awq" (once; later
    calls do nothing)."""
    if native.QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(native.QUANT_METHOD)(MixgemmConfig)
    if native.QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(native.QUANT_METHOD)(MixgemmHfQuantizer)
    for method in PACKED_METHODS:
        theirs = AUTO_QUANTIZER_MAPPING.get(method)
        if theirs is not None and not hasattr(theirs, "original"):  # (transformers' config class parses the config)
            AUTO_QUANTIZER_MAPPING[method] = _chooser(theirs)


__all__ = ["MixgemmConfig", "MixgemmHfQuantizer", "PackedFormatHfQuantizer", "register"]
