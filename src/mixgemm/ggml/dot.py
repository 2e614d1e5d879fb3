"""Reference dot products between ggml blocks, as llama.cpp's vec_dot kernels define them.

x is the weight type, y the activation type (llama.cpp's vec_dot_type). Per block b of 32 elements,
with d, m, s read from the fp16 fields and sumi an exact integer dot product of the codes:

==============  =================================================  =====================================
pair            block term                                         llama.cpp
==============  =================================================  =====================================
q4_0 . q8_0     dx dy sum((nib - 8) qy)                            ggml_vec_dot_q4_0_q8_0 (CPU)
q8_0 . q8_0     dx dy sum(qx qy)                                   ggml_vec_dot_q8_0_q8_0 (CPU)
q8_0 . q8_1     dx dy sum(qx qy)   (s unused)                      vec_dot_q8_0_q8_1 (CUDA mmvq)
q4_0 . q8_1     dx (dy sum(nib qy) - 8 sy)   (stored sum)          vec_dot_q4_0_q8_1 (CUDA mmvq)
q4_1 . q8_1     dx dy sum(nib qy) + mx sy    (stored sum)          ggml_vec_dot_q4_1_q8_1 (CPU and CUDA)
==============  =================================================  =====================================

The two pairs with q8_1 use the stored sy = fp16(d_f32 * sum(qy)), not dy * sum(qy): they differ from the
dot product of the dequantized vectors by the fp16 rounding of sy (at most 8 |dx| ulp(sy) / 2, resp.
|mx| ulp(sy) / 2, per block). Everything is evaluated in float64, where every block term except the last
subtraction / addition is exact; llama.cpp accumulates in float32 and so differs by ~1e-7 relative.
"""

from __future__ import annotations

import numpy as np

from mixgemm.ggml.blocks import QK, as_blocks, as_uint8, block_codes, qtype_name

PAIRS = (("q4_0", "q8_0"), ("q8_0", "q8_0"), ("q8_0", "q8_1"), ("q4_0", "q8_1"), ("q4_1", "q8_1"))


def vec_dot(x_raw, x_type, y_raw, y_type) -> np.ndarray | float:
    """Dot products of ggml rows, float64.

    x_raw: uint8 [N, row_bytes_x] or [row_bytes_x], weight rows of type x_type (q4_0, q4_1 or q8_0).
    y_raw: uint8 [M, row_bytes_y] or [row_bytes_y], activation rows of type y_type (q8_0 or q8_1).
    Both must hold the same number of blocks (the same K). Returns out[m, n] = dot(y[m], x[n]) as float64
    [M, N], with the dimension of a 1-D input dropped (a Python float when both are 1-D).
    """
    xt, yt = qtype_name(x_type), qtype_name(y_type)
    if (xt, yt) not in PAIRS:
        raise ValueError(
            f"no ggml dot product for {xt} x {yt}; supported (weight, activation) pairs: {PAIRS}"
        )
    x_raw, y_raw = as_uint8(x_raw, "x_raw"), as_uint8(y_raw, "y_raw")
    if x_raw.ndim not in (1, 2) or y_raw.ndim not in (1, 2):
        raise ValueError(f"rows must be 1-D or 2-D byte arrays, got shapes {x_raw.shape} and {y_raw.shape}")
    bx = as_blocks(np.atleast_2d(x_raw), xt)  # [N, nb]
    by = as_blocks(np.atleast_2d(y_raw), yt)  # [M, nb]
    if bx.shape[1] != by.shape[1]:
        raise ValueError(
            f"shape mismatch: x rows hold K={bx.shape[1] * QK} elements, y rows hold K={by.shape[1] * QK}"
        )
    qx = block_codes(bx).astype(np.float64)  # nibbles 0..15 (unsigned) or int8 values
    qy = block_codes(by).astype(np.float64)
    if (xt, yt) == ("q4_0", "q8_0"):
        qx -= 8.0
    dx, dy = bx["d"].astype(np.float64), by["d"].astype(np.float64)  # [N, nb], [M, nb]
    out = np.zeros((by.shape[0], bx.shape[0]), dtype=np.float64)
    for b in range(bx.shape[1]):
        # Integer codes in float64: every product and partial sum is an integer < 2**53, so exact.
        sumi = qy[:, b] @ qx[:, b].T  # [M, N]
        if (xt, yt) == ("q4_0", "q8_1"):
            term = dx[None, :, b] * (dy[:, None, b] * sumi - 8.0 * by["s"][:, None, b].astype(np.float64))
        elif (xt, yt) == ("q4_1", "q8_1"):
            term = (dx[None, :, b] * dy[:, None, b]) * sumi + (
                bx["m"][None, :, b].astype(np.float64) * by["s"][:, None, b].astype(np.float64))
        else:
            term = (dx[None, :, b] * dy[:, None, b]) * sumi
        out += term
    if x_raw.ndim == 1:
        out = out[:, 0]
    if y_raw.ndim == 1:
        out = out[0]
    return float(out) if out.ndim == 0 else out
