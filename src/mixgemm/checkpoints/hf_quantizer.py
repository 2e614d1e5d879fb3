"""mixgemm's checkpoint format registered with transformers, so that a plain
``AutoModelForCausalLM.from_pretrained(dir)`` of a directory written by ``save_pretrained`` from a mixgemm model
rebuilds its QuantLinear layers (``quant_method: "mixgemm"``).

``register()`` adds ``MixgemmConfig`` and ``MixgemmHfQuantizer`` to transformers' registries
(``register_quantization_config`` / ``register_quantizer``). The ``mixgemm-hf.pth`` start-up hook of an installed
mixgemm, and ``import mixgemm``, arrange for it to run when transformers' quantizer registry is imported
(_mixgemm_hf_hook), so neither imports transformers.
"""

from __future__ import annotations

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


class MixgemmHfQuantizer(HfQuantizer):
    """Loads mixgemm checkpoints: the skeleton's listed Linears become empty QuantLinear before the weights load."""

    requires_calibration = False

    def validate_environment(self, *args, **kwargs):
        if not self.pre_quantized:
            raise ValueError("MixgemmConfig describes a saved mixgemm checkpoint; to quantize a float checkpoint "
                             "while loading use mixgemm.from_pretrained(path, quantization_config=mixgemm.W4A16())")

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        import torch
        from torch import nn

        from mixgemm.checkpoints import skeleton
        from mixgemm.checkpoints.safetensors_source import stored_tensors
        from mixgemm.nn.experts import prepare_skeleton

        # transformers would load a missing tensor as "newly initialized" memory and an integer one as it is (it
        # casts only float tensors): the checkpoint's headers are checked against the model first
        stored = None
        if checkpoint_files and all(str(f).endswith(".safetensors") for f in checkpoint_files):
            stored = stored_tensors(checkpoint_files)
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
        from mixgemm.nn.norms import arrange_act_order, norm_kernels_at_norms

        native.keep_module_names(model)  # saved again, it keeps the names it was loaded under

        arrange_act_order(model)  # act-order layers as mixgemm.from_pretrained leaves them (exact)
        norm_kernels_at_norms(model)  # the other norms feeding mixgemm layers: its norm kernel on CUDA
        from mixgemm.quantize_api import auto_compact_

        auto_compact_(model)  # one resident layout per weight on an sm_90 GPU, as mixgemm.from_pretrained
        from mixgemm.nn.siblings import join_siblings

        join_siblings(model)  # q / k / v and gate / up as one launch in compiled one-row calls
        return model

    def is_serializable(self, *args, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def register() -> None:
    """Register the config and the quantizer under "mixgemm" (once; later calls do nothing)."""
    if native.QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(native.QUANT_METHOD)(MixgemmConfig)
    if native.QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(native.QUANT_METHOD)(MixgemmHfQuantizer)


__all__ = ["MixgemmConfig", "MixgemmHfQuantizer", "register"]
