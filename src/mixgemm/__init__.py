"""mixgemm: floating-point activations x block-quantized INT4/INT8 weights on NVIDIA GPUs.

Entry points: ``quantize_weight`` (formats), ``matmul`` (dispatching op), ``reference`` (CPU oracle),
``ggml`` (llama.cpp blocks), ``nn`` (modules), ``bench`` (the scoreboard).
"""

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
