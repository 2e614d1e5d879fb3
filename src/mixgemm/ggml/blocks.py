"""The llama.cpp (ggml) block structs q4_0, q4_1, q8_0, q8_1 as numpy structured dtypes.

Each block covers QK = 32 consecutive elements of a row along K; a row of K elements is K // 32 blocks
stored back to back, little-endian, without padding (ggml-common.h):

=========  =====  ==============================================  ==========================================
type       bytes  fields                                          value of element j (0 <= j < 32)
=========  =====  ==============================================  ==========================================
``q4_0``   18     d: fp16, qs: uint8[16]                          (nib(j) - 8) * d
``q4_1``   20     d: fp16, m: fp16, qs: uint8[16]                 nib(j) * d + m
``q8_0``   34     d: fp16, qs: int8[32]                           qs[j] * d
``q8_1``   36     d: fp16, s: fp16, qs: int8[32]                  qs[j] * d;  s = d * sum(qs) (see below)
=========  =====  ==============================================  ==========================================

Nibble order (4-bit types): byte i of ``qs`` holds element i in its low nibble and element i + 16 in its
high nibble, i.e. nib(j) = qs[j] & 0xF for j < 16 and qs[j - 16] >> 4 for j >= 16. This is *not* the
order of mixgemm's plain layout (consecutive pairs, see mixgemm.formats.packing); convert.py maps one to
the other.

q8_1 is llama.cpp's activation type: ``s`` is fp16(sum(qs) * d) with d the float32 scale *before* its
rounding to fp16 (quantize_row_q8_1_ref), so that q4_0 / q4_1 dot products can fold the weight's +8 bias
or minimum with one multiply. Note: the ``gguf`` Python package lists q8_1 as 40 bytes (the old layout
with float32 d and s); current ggml stores two fp16, 36 bytes, which is what this module uses.

InferLLM's q4_0 / q8_0 use the *older* ggml layout (float32 d, nibbles in consecutive pairs, d = amax / 7);
it is not these bytes.
"""

from __future__ import annotations

import numpy as np

QK = 32  # elements per block, every type here

BLOCK_DTYPES: dict[str, np.dtype] = {
    "q4_0": np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))]),
    "q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (QK // 2,))]),
    "q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (QK,))]),
    "q8_1": np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))]),
}
QTYPES = tuple(BLOCK_DTYPES)


def qtype_name(qtype) -> str:
    """Normalize a block type: "q4_0" (any case) or an enum with that name (gguf.GGMLQuantizationType)."""
    name = qtype.lower() if isinstance(qtype, str) else getattr(qtype, "name", None)
    name = name.lower() if isinstance(name, str) else name
    if name not in BLOCK_DTYPES:
        raise ValueError(f"unsupported ggml block type {qtype!r}: expected one of {QTYPES}")
    return name


def type_size(qtype) -> int:
    """Bytes per block of 32 elements."""
    return BLOCK_DTYPES[qtype_name(qtype)].itemsize


def row_bytes(k: int, qtype) -> int:
    """Bytes of one row of k elements; k must be a multiple of 32."""
    if k <= 0 or k % QK:
        raise ValueError(f"K={k} is not divisible by the ggml block size {QK}")
    return k // QK * type_size(qtype)


def as_uint8(raw, what: str = "raw") -> np.ndarray:
    """A C-contiguous uint8 ndarray from a numpy array or a torch uint8 tensor (any device; copied)."""
    if hasattr(raw, "detach") and hasattr(raw, "cpu"):  # torch.Tensor without importing torch here
        raw = raw.detach().cpu().numpy()
    if not isinstance(raw, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy array or torch tensor of uint8 bytes, got {type(raw).__name__}"
        )
    if raw.dtype != np.uint8:
        raise TypeError(f"{what} must hold uint8 bytes, got dtype {raw.dtype}")
    return np.ascontiguousarray(raw)


def as_blocks(raw, qtype) -> np.ndarray:
    """View bytes uint8 [..., nb * type_size] as a structured array [..., nb] of the block dtype (no copy)."""
    name = qtype_name(qtype)
    raw = as_uint8(raw)
    size = BLOCK_DTYPES[name].itemsize
    if raw.ndim == 0 or raw.shape[-1] % size:
        raise ValueError(
            f"{name} rows must be a whole number of {size}-byte blocks, got a last dimension of "
            f"{raw.shape[-1] if raw.ndim else 'a 0-d array'} bytes"
        )
    return raw.view(BLOCK_DTYPES[name])


def to_bytes(blocks: np.ndarray) -> np.ndarray:
    """Structured blocks [..., nb] -> uint8 [..., nb * type_size]."""
    return np.ascontiguousarray(blocks).view(np.uint8)


def block_codes(blocks: np.ndarray) -> np.ndarray:
    """Codes of each block in element order, [..., nb, 32]: uint8 nibbles 0..15 for q4_*, int8 for q8_*."""
    qs = blocks["qs"]
    if qs.dtype == np.int8:
        return qs
    return np.concatenate((qs & 0x0F, qs >> 4), axis=-1)  # low nibbles = elements 0..15, high = 16..31


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Codes uint8 [..., 32] in element order (each 0..15) -> ggml qs uint8 [..., 16]."""
    codes = codes.astype(np.uint8, copy=False)
    return codes[..., : QK // 2] | (codes[..., QK // 2:] << np.uint8(4))
