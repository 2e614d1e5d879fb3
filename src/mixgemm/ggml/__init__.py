"""llama.cpp (ggml) blocks q4_0, q4_1, q8_0, q8_1: raw bytes, reference (de)quantizers, dot products and
lossless conversion to and from QuantizedWeight. Pure numpy; byte-equal with llama.cpp's reference
quantizers and the ``gguf`` package (q8_1: with llama.cpp, see blocks.py).

>>> raw = quantize(x, "q4_0")                  # x float [..., K], K % 32 == 0 -> uint8 [..., K/32*18]
>>> y = dequantize(raw, "q4_0", x.shape)       # float32
>>> qw = to_quantized_weight(raw, "q4_0", (N, K))   # QuantizedWeight(bits=4, sym, group 32, fp16)
"""

from mixgemm.ggml.blocks import BLOCK_DTYPES, QK, QTYPES, as_blocks, block_codes, row_bytes, type_size
from mixgemm.ggml.convert import from_quantized_weight, to_quantized_weight
from mixgemm.ggml.dot import PAIRS, vec_dot
from mixgemm.ggml.quantize import dequantize, quantize

__all__ = [
    "BLOCK_DTYPES",
    "PAIRS",
    "QK",
    "QTYPES",
    "as_blocks",
    "block_codes",
    "dequantize",
    "from_quantized_weight",
    "quantize",
    "row_bytes",
    "to_quantized_weight",
    "type_size",
    "vec_dot",
]
