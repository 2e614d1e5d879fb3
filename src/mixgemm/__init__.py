"""mixgemm: floating-point activations x block-quantized INT4/INT8 weights on NVIDIA GPUs.

Entry points: ``quantize_weight`` (formats), ``matmul`` (dispatching op), ``reference`` (CPU oracle),
``ggml`` (llama.cpp blocks), ``nn`` (modules), ``quantize_`` (models), ``from_pretrained`` (quantized checkpoints:
GGUF, GPTQ, AWQ, compressed-tensors, mixgemm's own format; mixgemm.checkpoints; ``gather_act_order_at_norms`` for
compiled act-order models, ``use_inductor_norms`` to leave a model's norms to inductor), ``distributed`` (tensor
parallel),
``bench`` (the scoreboard); ``explain`` / ``explain_conv`` (which kernel runs a call and why), ``kernel_options``
(overrides of that choice), ``resident_bytes`` (weight memory), ``compact_`` (one resident layout per weight),
``evaluate_perplexity`` (stride-window perplexity of a causal LM).
"""

from _mixgemm_hf_hook import install as _install_hf_hook
from mixgemm.formats import (
    QuantConfig,
    QuantizedActivation,
    QuantizedConvWeight,
    QuantizedWeight,
    dequantize_weight,
    quantize_activation,
    quantize_conv_weight,
    quantize_weight,
)
from mixgemm.ops import conv2d, matmul

__version__ = "0.1.0"

_install_hf_hook()  # transformers' AutoModel*.from_pretrained reads mixgemm checkpoints (never imports transformers)

_LAZY = {"quantize_": "mixgemm.quantize_api", "compact_": "mixgemm.quantize_api", "W4A16": "mixgemm.quantize_api",
         "W8A16": "mixgemm.quantize_api",
         "W8A8": "mixgemm.quantize_api", "W4A8": "mixgemm.quantize_api", "QuantLinear": "mixgemm.nn",
         "QuantConv2d": "mixgemm.nn",
         "from_pretrained": "mixgemm.checkpoints.loader",
         "gather_act_order_at_norms": "mixgemm.nn.norms",
         "use_inductor_norms": "mixgemm.nn.norms",
         "explain": "mixgemm.ops.explain", "explain_conv": "mixgemm.ops.explain",
         "resident_bytes": "mixgemm.ops.explain", "kernel_options": "mixgemm.kernels.registry",
         "evaluate_perplexity": "mixgemm.evaluate"}


# subpackages reachable as attributes (mixgemm.distributed.tensor_parallel_ after a plain import mixgemm), imported on
# first use
_SUBPACKAGES = ("bench", "checkpoints", "distributed", "ggml", "integrations", "nn", "tuning")


def __getattr__(name):  # lazy: importing mixgemm does not import the nn / torch.library layer
    if name in _LAZY or name in _SUBPACKAGES:
        import importlib

        if name in _SUBPACKAGES:
            return importlib.import_module(f"mixgemm.{name}")
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mixgemm' has no attribute {name!r}")

__all__ = [
    "QuantConfig",
    "QuantizedActivation",
    "QuantizedConvWeight",
    "QuantizedWeight",
    "conv2d",
    "dequantize_weight",
    "matmul",
    "quantize_activation",
    "quantize_conv_weight",
    "quantize_weight",
]
