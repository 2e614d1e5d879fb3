"""Lossless conversion between ggml blocks and mixgemm's QuantizedWeight.

==========  =====================================================  ==============================
ggml        QuantizedWeight (group_size 32, scale_dtype float16)   codes
==========  =====================================================  ==============================
``q4_0``    bits=4, mode="sym"    (scales = d)                     same nibble value (both +8 bias)
``q4_1``    bits=4, mode="offset" (scales = d, offsets = m)        same nibble value
``q8_0``    bits=8, mode="sym"    (scales = d)                     ours = qs + 128 (0..255 holds -128)
==========  =====================================================  ==============================

Only the element order changes for 4 bits: ggml puts elements 0..15 of a block in the low nibbles and
16..31 in the high nibbles of its 16 bytes; the plain layout packs consecutive pairs (k, k+1).

q4_0 stores d = max / -8, so its scales are negative whenever the largest-magnitude element of the block
is positive: a QuantizedWeight made from q4_0 has negative scales (w = (q - 8) * s still holds exactly).
mode="zero_point" converts to q4_1 when every m = -z * s is exactly an fp16 number, else the error says
it would be lossy. Everything else that cannot be converted exactly raises ValueError saying why: group
size other than 32, scale dtype other than float16, q8_1 (an activation type whose stored
s = fp16(sum * d_f32) has no place in QuantizedWeight), non-finite d or m.
"""

from __future__ import annotations

import numpy as np
import torch

from mixgemm.formats.weight import QuantConfig, QuantizedWeight, from_codes
from mixgemm.ggml.blocks import (
    BLOCK_DTYPES,
    QK,
    as_blocks,
    as_uint8,
    block_codes,
    pack_nibbles,
    qtype_name,
    to_bytes,
)

_WEIGHT_TYPES = {"q4_0": (4, "sym"), "q4_1": (4, "offset"), "q8_0": (8, "sym")}


def _no_q8_1(name: str) -> None:
    if name == "q8_1":
        raise ValueError(
            "q8_1 is llama.cpp's activation type: its stored s = fp16(sum(q) * d) (rounded from the "
            "float32 d) has no place in a QuantizedWeight, so the conversion would not be lossless; use q8_0"
        )


def _check_finite(values: np.ndarray, field: str, name: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        r, b = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} block {b} of row {r} has a non-finite {field} ({values[r, b]}): "
            "a QuantizedWeight cannot hold NaN/Inf weights"
        )


def to_quantized_weight(raw, qtype, shape) -> QuantizedWeight:
    """ggml weight bytes -> QuantizedWeight (CPU), losslessly.

    raw: uint8 (numpy or torch) holding N * K / 32 blocks of qtype ("q4_0", "q4_1" or "q8_0"), row-major.
    shape: (N, K), K % 32 == 0. dequantize_weight of the result equals ggml.dequantize(raw, qtype, shape).
    """
    name = qtype_name(qtype)
    _no_q8_1(name)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise ValueError(f"shape must be (N, K), got {shape}")
    n, k = shape
    if n <= 0 or k <= 0 or k % QK:
        raise ValueError(f"shape {shape}: N must be positive and K a positive multiple of {QK}")
    raw = as_uint8(raw).reshape(-1)
    size = BLOCK_DTYPES[name].itemsize
    if raw.size != n * k // QK * size:
        raise ValueError(
            f"{name} bytes do not match shape {shape}: expected {n * k // QK * size} bytes, got {raw.size}"
        )
    blocks = as_blocks(raw.reshape(n, -1), name)  # [N, nb]
    d = blocks["d"]
    _check_finite(d, "d", name)
    codes = block_codes(blocks)  # [N, nb, 32] in element order
    if name == "q8_0":
        codes = (codes.astype(np.int16) + 128).astype(np.uint8)  # int8 -128..127 -> 0..255
    bits, mode = _WEIGHT_TYPES[name]
    offsets = None
    if name == "q4_1":
        _check_finite(blocks["m"], "m", name)
        offsets = torch.from_numpy(blocks["m"].copy())
    config = QuantConfig(bits=bits, group_size=QK, mode=mode, scale_dtype=torch.float16)
    return from_codes(torch.from_numpy(codes.reshape(n, k).copy()), torch.from_numpy(d.copy()), config,
                      offsets=offsets)


def from_quantized_weight(qw: QuantizedWeight, qtype=None) -> np.ndarray:
    """QuantizedWeight -> ggml bytes uint8 [N, K / 32 * type_size], losslessly, or ValueError.

    qtype: "q4_0", "q4_1" or "q8_0"; None picks it from the weight (4-bit sym -> q4_0, 4-bit offset or
    zero_point -> q4_1, 8-bit sym -> q8_0). Needs group size 32 and float16 scales.
    """
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qw must be a mixgemm QuantizedWeight, got {type(qw).__name__}")
    if qtype is None:
        qtype = {(4, "sym"): "q4_0", (4, "offset"): "q4_1", (4, "zero_point"): "q4_1",
                 (8, "sym"): "q8_0"}.get((qw.bits, qw.mode))
        if qtype is None:
            raise ValueError(
                f"no ggml block type holds a {qw.bits}-bit mode={qw.mode!r} weight losslessly "
                "(q8_0 is symmetric only)"
            )
    name = qtype_name(qtype)
    _no_q8_1(name)
    bits, mode = _WEIGHT_TYPES[name]
    if qw.bits != bits or qw.mode != mode and not (name == "q4_1" and qw.mode == "zero_point"):
        raise ValueError(f"{name} holds {bits}-bit mode={mode!r} weights, got {qw.bits}-bit mode={qw.mode!r}")
    if qw.group_size != QK:
        raise ValueError(
            f"ggml blocks hold {QK} weights; this weight has group_size={qw.group_size}: converting would "
            "re-quantize (lossy). Quantize with group_size=32"
        )
    if qw.scales.dtype != torch.float16:
        raise ValueError(
            f"ggml stores fp16 block scales; this weight has {qw.scales.dtype} scales, which would be "
            "rounded (lossy). Quantize with scale_dtype=torch.float16"
        )
    n, k = qw.shape
    codes = qw.codes().cpu().numpy().reshape(n, k // QK, QK)
    blocks = np.zeros((n, k // QK), dtype=BLOCK_DTYPES[name])
    blocks["d"] = qw.scales.cpu().numpy()
    if name == "q8_0":
        blocks["qs"] = (codes.astype(np.int16) - 128).astype(np.int8)
    else:
        blocks["qs"] = pack_nibbles(codes)
    if name == "q4_1":
        if qw.mode == "offset":
            blocks["m"] = qw.offsets.cpu().numpy()
        else:
            m = -qw.zeros.cpu().numpy().astype(np.float64) * qw.scales.cpu().numpy().astype(np.float64)
            m16 = m.astype(np.float16)
            if not np.array_equal(m16.astype(np.float64), m):
                r, b = (int(i) for i in np.argwhere(m16.astype(np.float64) != m)[0])
                raise ValueError(
                    f"zero_point -> q4_1 would be lossy: m = -z * s = {m[r, b]!r} (row {r}, group {b}) "
                    "is not an fp16 number"
                )
            blocks["m"] = m16
    return to_bytes(blocks)
