"""The one dequantize primitive shared by mixgemm's Triton kernels.

A packed tile of int32 words (layout.py: field f of a word holds one code of ``BITS`` bits) becomes
a tile of activation-dtype weights with integer-only unpacking and no int->float conversion
instructions (those run at 1/4 to 1/8 of the ALU rate on sm_90):

* ``h = bitcast(q | MAGIC_BITS)`` is exactly ``MAGIC + q`` in the compute dtype ("magic number"
  trick of the seeds: 0x6400 is fp16 1024.0, whose ulp is 1, so OR-ing a code into the low mantissa
  bits adds it exactly). Compute dtype / MAGIC: fp16 activations -> fp16 / 1024; bf16 with 4-bit codes
  -> bf16 / 128 (0x4300; bf16's 8-bit significand holds 128 + 15 exactly); otherwise (bf16 with 8-bit
  codes, fp32 activations) -> fp32 / 2**23 (0x4B000000).
* ``h - (MAGIC + z)`` is the exact integer q - z; ``* s`` rounds once. Offset mode: ``(h - MAGIC) * s + m``.

ZERO_MODE: 0 = "sym" (z = 2**(BITS-1)), 1 = "zero_point" (per-group z), 2 = "offset" (w = q * s + m).
SCALE=False returns the integer-valued q - z (exact in every compute dtype) so that the caller can apply
a per-channel scale once per output element instead of once per weight.
"""

from __future__ import annotations

import triton
import triton.language as tl

MODE_IDS = {"sym": 0, "zero_point": 1, "offset": 2}


@triton.jit
def group_params(s_raw, p_raw, BITS: tl.constexpr, ZERO_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Per-group parameter vectors [BN] -> (s, p) in the compute dtype.

    p is MAGIC + z for ZERO_MODE 1 (exact: z < 256), the offset m for ZERO_MODE 2, unused (s) for 0.
    """
    if OUT_DTYPE == tl.float16:  # noqa: SIM300
        s = s_raw.to(tl.float16)
        base = 1024.0
    elif OUT_DTYPE == tl.bfloat16 and BITS == 4:  # noqa: SIM300
        s = s_raw.to(tl.bfloat16)
        base = 128.0
    else:
        s = s_raw.to(tl.float32)
        base = 8388608.0
    if ZERO_MODE == 1:
        p = (p_raw.to(tl.float32) + base).to(s.dtype)
    elif ZERO_MODE == 2:
        p = p_raw.to(s.dtype)
    else:
        p = s
    return s, p


@triton.jit
def dequantize(words, FIELD: tl.constexpr, BITS: tl.constexpr, ZERO_MODE: tl.constexpr, s, p,
               OUT_DTYPE: tl.constexpr, SCALE: tl.constexpr):
    """Field FIELD of an int32 word tile [BN, KS] (layout.py) -> weights [BN, KS] in OUT_DTYPE.

    s, p: from group_params, shaped to broadcast against the tile ([BN, 1] when the whole tile lies in
    one group, [BN, KS] when groups are narrower than the tile). SCALE=False: the integer q - z.
    """
    q = (words >> (FIELD * BITS)) & ((1 << BITS) - 1)
    return codes_to_values(q, BITS, ZERO_MODE, s, p, OUT_DTYPE, SCALE)


@triton.jit
def codes_to_values(q, BITS: tl.constexpr, ZERO_MODE: tl.constexpr, s, p, OUT_DTYPE: tl.constexpr,
                    SCALE: tl.constexpr):
    """Unsigned integer codes q (any tile shape, int32) -> weights in OUT_DTYPE, with s, p from group_params
    broadcast against q. The one place that turns codes into values: every Triton kernel unpacks its own
    layout into q and calls this. SCALE=False: the integer q - z.
    """
    # constants are built in the compute dtype (a bare Python float would promote fp16 math to fp32)
    if OUT_DTYPE == tl.float16:  # noqa: SIM300
        h = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)  # 1024 + q exactly
        base = tl.full((), 1024.0, tl.float16)
        zsym = tl.full((), 1024.0 + (1 << (BITS - 1)), tl.float16)
    elif OUT_DTYPE == tl.bfloat16 and BITS == 4:  # noqa: SIM300
        h = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 128 + q exactly
        base = tl.full((), 128.0, tl.bfloat16)
        zsym = tl.full((), 128.0 + (1 << (BITS - 1)), tl.bfloat16)
    else:
        h = (q | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + q exactly
        base = tl.full((), 8388608.0, tl.float32)
        zsym = tl.full((), 8388608.0 + (1 << (BITS - 1)), tl.float32)
    if ZERO_MODE == 0:
        v = h - zsym
        if SCALE:
            v = v * s
    elif ZERO_MODE == 1:
        v = h - p
        if SCALE:
            v = v * s
    else:
        v = h - base
        if SCALE:
            v = v * s + p
    return v.to(OUT_DTYPE)
