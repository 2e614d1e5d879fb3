"""llama.cpp's reference quantizers (quantize_row_*_ref) and dequantizers, vectorized in numpy.

The arithmetic follows ggml-quants.c step by step in float32 so that the bytes are identical to llama.cpp's
reference implementation and to the ``gguf`` Python package (tests/ggml/test_ggml.py checks this):

* q4_0: max = the element of largest magnitude (the first one on ties; +0 for an all-zero block),
  d = max / -8, id = 1 / d (0 if d == 0), code = min(15, trunc(x * id + 8.5)). The codes span
  [-8, 7] d: max is exactly code -8, and elements of the opposite sign beyond 7.5 |d| clamp to 7
  (error up to |d|; elsewhere the error is at most |d| / 2 plus the fp16 rounding of d).
* q4_1: min, max = the first minimum and maximum, d = (max - min) / 15, id = 1 / d (0 if d == 0),
  code = min(15, trunc((x - min) * id + 0.5)), m = min.
* q8_0: d = amax / 127, id = 1 / d (0 if d == 0), q = roundf(x * id) (halves away from zero).
* q8_1: as q8_0, plus s = fp16(float32(sum(q)) * d) with the float32 d (before its fp16 rounding).
* d, m and s are rounded to fp16 to nearest-even (GGML_FP32_TO_FP16). A scale that overflows fp16
  becomes +-inf, exactly as in llama.cpp (it is not an error here; to_quantized_weight rejects it).

Non-finite inputs (NaN, +-Inf) raise ValueError: llama.cpp's result for them is undefined behaviour
(float -> int8 conversion of NaN/Inf), so no byte-exact answer exists.
"""

from __future__ import annotations

import numpy as np

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

_F32 = np.float32


def _as_float32(x) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor (bf16 has no numpy dtype: widen first)
        if not x.is_floating_point():
            raise TypeError(f"x must be floating point, got dtype {x.dtype}")
        if x.device.type == "meta":
            raise ValueError("x is on the meta device (a shape without values): it cannot be quantized")
        x = x.detach().cpu().float().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"x must be floating point, got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (the row of K elements)")
    return np.ascontiguousarray(x, dtype=_F32)  # float64 -> float32 rounds to nearest, as gguf does


def _inv(d: np.ndarray) -> np.ndarray:
    """id = d ? 1.0f / d : 0.0f, in float32."""
    nz = d != 0
    return np.where(nz, _F32(1) / np.where(nz, d, _F32(1)), _F32(0)).astype(_F32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: to nearest, halves away from zero. x - trunc(x) is exact, so no double rounding."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= _F32(0.5), np.sign(v), _F32(0))


def quantize(x, qtype) -> np.ndarray:
    """Quantize rows of floats to ggml blocks.

    x: float array or torch tensor [..., K] (any float dtype; converted to float32 first), K % 32 == 0,
    finite. qtype: "q4_0", "q4_1", "q8_0" or "q8_1" (or a gguf GGMLQuantizationType).
    Returns uint8 [..., K // 32 * type_size], the raw block bytes.
    """
    name = qtype_name(qtype)
    x = _as_float32(x)
    k = x.shape[-1]
    if k == 0 or k % QK:
        raise ValueError(f"K={k} (the last dimension) is not divisible by the ggml block size {QK}")
    bad = ~np.isfinite(x)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"x has a non-finite value ({x[pos]}) at {list(pos)}: NaN/Inf cannot be block-quantized"
        )
    xb = x.reshape(*x.shape[:-1], k // QK, QK)
    blocks = np.zeros(xb.shape[:-1], dtype=BLOCK_DTYPES[name])
    with np.errstate(over="ignore", under="ignore"):  # fp16 overflow -> inf, as GGML_FP32_TO_FP16 does
        if name == "q4_0":
            ax = np.abs(xb)
            i = ax.argmax(-1)[..., None]  # first element of largest magnitude, like the C loop
            mx = np.take_along_axis(xb, i, -1)[..., 0]
            mx = np.where(np.take_along_axis(ax, i, -1)[..., 0] > 0, mx, _F32(0))  # C keeps max = +0.0
            d = mx / _F32(-8)
            v = xb * _inv(d)[..., None] + _F32(8.5)
            blocks["d"] = d
            blocks["qs"] = pack_nibbles(np.clip(np.trunc(v), 0, 15))
        elif name == "q4_1":
            # The first minimum / maximum, as the C loop picks them (differs from min() only in the sign of 0)
            lo = np.take_along_axis(xb, xb.argmin(-1)[..., None], -1)[..., 0]
            hi = np.take_along_axis(xb, xb.argmax(-1)[..., None], -1)[..., 0]
            d = (hi - lo) / _F32(15)
            v = (xb - lo[..., None]) * _inv(d)[..., None] + _F32(0.5)
            blocks["d"] = d
            blocks["m"] = lo
            blocks["qs"] = pack_nibbles(np.clip(np.trunc(v), 0, 15))
        else:  # q8_0, q8_1
            d = np.abs(xb).max(-1) / _F32(127)
            q = _roundf(xb * _inv(d)[..., None]).astype(np.int8)  # |x * id| <= 127 (+ rounding): fits
            blocks["d"] = d
            blocks["qs"] = q
            if name == "q8_1":
                blocks["s"] = q.sum(-1, dtype=np.int32).astype(_F32) * d
    return to_bytes(blocks)


def dequantize(raw, qtype, shape) -> np.ndarray:
    """Float32 values of ggml blocks, computed as ggml's dequantize_row_* does (float32).

    raw: uint8 bytes (numpy or torch), any shape, holding prod(shape) // 32 blocks in row-major order.
    shape: the element shape [..., K] with K % 32 == 0. Returns float32 of that shape.
    q8_1 (which ggml never dequantizes) gives qs * d; its s is not used.
    """
    name = qtype_name(qtype)
    shape = tuple(int(s) for s in (shape if isinstance(shape, tuple | list) else (shape,)))
    if not shape or shape[-1] <= 0 or shape[-1] % QK:
        raise ValueError(f"shape {shape}: K (the last dimension) must be a positive multiple of {QK}")
    n = int(np.prod(shape))
    size = BLOCK_DTYPES[name].itemsize
    raw = as_uint8(raw).reshape(-1)
    if raw.size != n // QK * size:
        raise ValueError(
            f"{name} bytes do not match shape {shape}: expected {n // QK * size} bytes "
            f"({n // QK} blocks of {size}), got {raw.size}"
        )
    blocks = as_blocks(raw, name)
    d = blocks["d"].astype(_F32)[:, None]
    codes = block_codes(blocks)
    with np.errstate(invalid="ignore", over="ignore"):  # an inf d gives inf / NaN, as in ggml
        if name == "q4_0":
            out = (codes.astype(np.int8) - np.int8(8)).astype(_F32) * d
        elif name == "q4_1":
            out = codes.astype(_F32) * d + blocks["m"].astype(_F32)[:, None]
        else:
            out = codes.astype(_F32) * d
    return out.reshape(shape)
