"""Quantization formats: weight blocks, activation blocks, packing, kernel layouts."""

from mixgemm.formats.activation import QuantizedActivation, quantize_activation
from mixgemm.formats.conv import QuantizedConvWeight, quantize_conv_weight
from mixgemm.formats.packing import pack_codes, unpack_codes
from mixgemm.formats.weight import (
    PER_CHANNEL,
    QuantConfig,
    QuantizedWeight,
    dequantize_weight,
    from_codes,
    quantize_weight,
)

__all__ = [
    "PER_CHANNEL",
    "QuantConfig",
    "QuantizedActivation",
    "QuantizedConvWeight",
    "QuantizedWeight",
    "dequantize_weight",
    "from_codes",
    "pack_codes",
    "quantize_activation",
    "quantize_conv_weight",
    "quantize_weight",
    "unpack_codes",
]
