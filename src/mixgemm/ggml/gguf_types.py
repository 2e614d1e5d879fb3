"""GGUF weight tensors of every quantized type mixgemm can hold -> QuantizedWeight.

==========  =====================================================  ========================================
GGUF type   QuantizedWeight                                        exact?
==========  =====================================================  ========================================
Q4_0        4-bit sym, group 32, fp16 scales                       yes (mixgemm.ggml.convert)
Q4_1        4-bit offset, group 32, fp16 scales / offsets          yes (mixgemm.ggml.convert)
Q8_0        8-bit sym, group 32, fp16 scales                       yes (mixgemm.ggml.convert)
Q5_0        8-bit sym, group 32, fp16 scales (codes q - 16 + 128)  yes
Q5_1        8-bit offset, group 32, fp16 scales / offsets          yes
Q4_K        4-bit offset, group 32, fp32 s = d*sc, m = -dmin*mn    yes
Q5_K        8-bit offset, group 32, fp32 s = d*sc, m = -dmin*mn    yes (5-bit codes in 8-bit storage)
Q6_K        8-bit sym, group 16, fp32 s = d*sc (codes q - 32)      yes (groups of 16: see below)
Q3_K        8-bit sym, group 16, fp32 s = d*sc (codes q, -4..3)    yes (groups of 16)
Q2_K        8-bit offset, group 16, fp32 s = d*sc, m = -dmin*mn    yes (groups of 16)
IQ*, TQ*    8-bit sym, group 32, fp32 scales, re-quantized         no: see below
MXFP4       (requantize_bits=4: 4-bit offset, group 32, fp16
NVFP4       scales / offsets)
==========  =====================================================  ========================================

"Exact" means ``dequantize_weight(qw, torch.float32)`` equals ``gguf.quants.dequantize`` bit for bit (up to the sign
of a zero): in each block type the scale products (fp16 d times a sub-block scale of at most 8 bits) are exact in
float32, and both sides round ``q * s + m`` once.

Q6_K, Q3_K and Q2_K scale sub-blocks of 16 elements, each with its own scale (a group of 32 would hold two whose
scales generally share no factor small enough for the codes): they are held in mixgemm's groups of 16
(mixgemm.formats.weight.NARROW_GROUP, 8-bit only), at 10 bits per weight (Q2_K, with its offsets: 12) against the
file's 2.6-6.6. The CUDA kernels decline groups of 16; the Triton GEMM and the CPU paths run them. ``requantize_bits=4``
re-quantizes these three too, as below, to keep a low-bit file's size class.

The other types have no exact mixgemm form: the IQ types and the fp4 types (MXFP4, NVFP4) use non-uniform codebooks;
the TQ types are ternary. The route: gguf's float32 dequantization, re-quantized round-to-nearest to groups of 32
(mixgemm.formats.weight.quantize_weight): by default to 8-bit sym with float32 scales, each weight moving by at most
half an int8 step, max|w| / 254 of its group (on random blocks well under 1% of the mean |w|, under the types' own
rounding steps), at 9 bits per weight. ``requantize_bits=4`` keeps a low-bit file's size class instead (for a large
model that must fit): 4-bit offset with fp16 scales and offsets, 5 bits per weight, each weight moving by at most half
of its group's range / 15: on random blocks 3-12% of the mean |w| (Q2_K 3%, Q3_K 7%, IQ4_XS 7%, MXFP4 8%, NVFP4 12%;
on the formats themselves, random sub-block scales are the worst case). The loader reports every re-quantized tensor.

The integer codes are read with gguf's own dequantizers (the oracle): a copy of the blocks with unit scales
(d = 1, every sub-block scale 1, minima 0) dequantizes to the codes themselves, so no bit layout is
re-implemented here. Needs the ``gguf`` package.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mixgemm.formats.weight import NARROW_GROUP, QuantConfig, QuantizedWeight, from_codes, quantize_weight
from mixgemm.ggml import convert as ggml_convert


@dataclass(frozen=True)
class _Route:
    bits: int
    mode: str
    scale_dtype: torch.dtype
    exact: bool
    group: int = 32


ROUTES: dict[str, _Route] = {
    "Q4_0": _Route(4, "sym", torch.float16, True),
    "Q4_1": _Route(4, "offset", torch.float16, True),
    "Q8_0": _Route(8, "sym", torch.float16, True),
    "Q5_0": _Route(8, "sym", torch.float16, True),
    "Q5_1": _Route(8, "offset", torch.float16, True),
    "Q4_K": _Route(4, "offset", torch.float32, True),
    "Q5_K": _Route(8, "offset", torch.float32, True),
    "Q6_K": _Route(8, "sym", torch.float32, True, NARROW_GROUP),
    "Q3_K": _Route(8, "sym", torch.float32, True, NARROW_GROUP),
    "Q2_K": _Route(8, "offset", torch.float32, True, NARROW_GROUP),
}
# Re-quantized (see above): 8-bit sym with float32 scales, or with requantize_bits=4 the 4-bit offset route.
REQUANTIZED = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0",
               "TQ2_0", "MXFP4", "NVFP4")
ROUTES.update({t: _Route(8, "sym", torch.float32, False) for t in REQUANTIZED})
REQUANTIZED_4BIT = _Route(4, "offset", torch.float16, False)
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")

# Byte offsets inside one block (ggml-common.h): fp16 fields and the K-quants' packed 6-bit scales.
_K_SCALE_BYTES = slice(4, 16)  # Q4_K / Q5_K: d (0:2), dmin (2:4), 12 bytes of 6-bit scales and minima
# The 12 scale bytes that decode to every sub-block scale 1 and every minimum 0 (gguf's Q4_K.get_scale_min layout)
_K_UNIT_SCALES = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], dtype=np.uint8)
# The sub-blocks of 16: Q6_K ql (0:128), qh (128:192), int8 scales (192:208), d (208); Q3_K hmask (0:32), qs (32:96),
# 12 bytes of 6-bit scales stored + 32 (96:108), d (108); Q2_K 4-bit scale | 4-bit minimum << 4 (0:16), qs (16:80),
# d (80), dmin (82)
_Q6_K_SCALES, _Q6_K_D = slice(192, 208), 208
_Q3_K_MASK, _Q3_K_QS, _Q3_K_SCALES, _Q3_K_D = slice(0, 32), slice(32, 96), slice(96, 108), 108
_Q2_K_SCALES, _Q2_K_D, _Q2_K_DMIN = slice(0, 16), 80, 82
# Q3_K's scale bytes of every scale 1 (stored 33: low nibbles 1, high bit pairs 2); its code bytes of every q = 1
# (high bits set: no -4; 2-bit fields 1)
_Q3_K_UNIT_SCALES = np.array([0x11] * 8 + [0xAA] * 4, dtype=np.uint8)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16)[:, 0]


def _set_f16(blocks: np.ndarray, start: int, value: float) -> None:
    blocks[:, start:start + 2] = np.array([value], dtype=np.float16).view(np.uint8)


def _check_finite(values: np.ndarray, field: str, name: str, per_row: int) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise ValueError(f"GGUF tensor {name!r}: block {i % per_row} of row {i // per_row} has a non-finite {field} "
                         f"({values[i]}); a QuantizedWeight cannot hold NaN/Inf weights")


def _unit_codes(blocks: np.ndarray, qtype, unit: callable) -> np.ndarray:
    """The integer codes of ``blocks`` [nblocks, type_size]: gguf's dequantization of a copy whose scales
    ``unit`` set to 1 and minima to 0. float32 [nblocks, block_size], integer valued."""
    import gguf

    ones = blocks.copy()
    unit(ones)
    return gguf.quants.dequantize(ones, qtype)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import gguf

    sc, mn = gguf.quants.Q4_K.get_scale_min(blocks[:, _K_SCALE_BYTES].copy())
    return sc.astype(np.float32), mn.astype(np.float32)


def _unit_q5(ones: np.ndarray) -> None:
    _set_f16(ones, 0, 1.0)


def _unit_q5_1(ones: np.ndarray) -> None:
    _set_f16(ones, 0, 1.0)
    _set_f16(ones, 2, 0.0)


def _unit_k(ones: np.ndarray) -> None:
    _set_f16(ones, 0, 1.0)
    _set_f16(ones, 2, 0.0)
    ones[:, _K_SCALE_BYTES] = _K_UNIT_SCALES


def _unit_q6_k(ones: np.ndarray) -> None:
    _set_f16(ones, _Q6_K_D, 1.0)
    ones[:, _Q6_K_SCALES] = 1


def _unit_q3_k(ones: np.ndarray) -> None:
    _set_f16(ones, _Q3_K_D, 1.0)
    ones[:, _Q3_K_SCALES] = _Q3_K_UNIT_SCALES


def _unit_q2_k(ones: np.ndarray) -> None:
    _set_f16(ones, _Q2_K_D, 1.0)
    _set_f16(ones, _Q2_K_DMIN, 0.0)
    ones[:, _Q2_K_SCALES] = 1  # scale 1, minimum 0


def _q3_k_scales(blocks: np.ndarray) -> np.ndarray:
    """Q3_K's signed 6-bit sub-block scales, float32 [nblocks, 16]: gguf's dequantization of a copy with d = 1 and
    every code 1."""
    import gguf

    ones = blocks.copy()
    _set_f16(ones, _Q3_K_D, 1.0)
    ones[:, _Q3_K_MASK] = 0xFF
    ones[:, _Q3_K_QS] = 0x55
    return gguf.quants.dequantize(ones, gguf.GGMLQuantizationType.Q3_K).reshape(-1, 16, 16)[:, :, 0]


def _sub16_params(qname: str, blocks: np.ndarray, name: str, per_row: int):
    """(unit, scales, offsets or None) of Q6_K / Q3_K / Q2_K blocks, float32 [nblocks, 16]: w = s q + m per sub-block
    of 16 (q the unit codes), s = d * sc and m = -dmin * mn exact in float32 (11-bit by at most 8-bit mantissas)."""
    d_at = {"Q6_K": _Q6_K_D, "Q3_K": _Q3_K_D, "Q2_K": _Q2_K_D}[qname]
    d = _f16(blocks, d_at).astype(np.float32)
    _check_finite(d, "d", name, per_row)
    if qname == "Q6_K":
        return _unit_q6_k, d[:, None] * blocks[:, _Q6_K_SCALES].view(np.int8).astype(np.float32), None
    if qname == "Q3_K":
        return _unit_q3_k, d[:, None] * _q3_k_scales(blocks), None
    dmin = _f16(blocks, _Q2_K_DMIN).astype(np.float32)
    _check_finite(dmin, "dmin", name, per_row)
    packed = blocks[:, _Q2_K_SCALES]
    return _unit_q2_k, d[:, None] * (packed & 0xF).astype(np.float32), -(dmin[:, None] * (packed >> 4).astype(
        np.float32))


def route_of(qname: str, requantize_bits: int = 8) -> _Route:
    """The QuantizedWeight format a GGUF type becomes (KeyError for a type without a route). requantize_bits=4 also
    re-quantizes the types held exactly in groups of 16 (their exact form takes 10-12 bits a weight)."""
    route = ROUTES[qname]
    sized = not route.exact or route.group == NARROW_GROUP
    return REQUANTIZED_4BIT if sized and requantize_bits == 4 else route


def to_quantized_weight(raw: np.ndarray, qtype, shape, name: str = "tensor",
                        requantize_bits: int = 8) -> QuantizedWeight:
    """GGUF tensor bytes -> QuantizedWeight (CPU).

    raw: uint8 [N, row bytes] as ``gguf.GGUFReader`` gives ``tensor.data``; qtype: gguf.GGMLQuantizationType;
    shape: (N, K) in torch order; name: the tensor's name, for errors; requantize_bits: 8 or 4, the width the
    types without an exact form are re-quantized to (module docstring). ``route_of(qtype.name, requantize_bits)`` says
    the format and whether it is exact. Types without a route raise ValueError naming the tensor and the type.
    """
    import gguf

    if requantize_bits not in (4, 8):
        raise ValueError(f"requantize_bits must be 8 or 4, got {requantize_bits!r}")
    qname = qtype.name
    if qname not in ROUTES:
        holds = ", ".join(ROUTES)
        raise ValueError(f"GGUF tensor {name!r} has type {qname}, which mixgemm cannot hold (it reads {holds} and "
                         f"the float types {', '.join(FLOAT_TYPES)})")
    n, k = (int(s) for s in shape)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if k % block_size:
        raise ValueError(f"GGUF tensor {name!r}: K={k} is not a multiple of the {qname} block size {block_size}")
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.size != n * k // block_size * type_size:
        raise ValueError(f"GGUF tensor {name!r}: {raw.size} bytes do not hold a {qname} tensor of shape {(n, k)} "
                         f"({n * k // block_size * type_size} expected); the file may be truncated")
    if qname in ("Q4_0", "Q4_1", "Q8_0"):
        try:
            return ggml_convert.to_quantized_weight(raw.reshape(n, -1), qname.lower(), (n, k))
        except ValueError as e:
            raise ValueError(f"GGUF tensor {name!r}: {e}") from None
    route = route_of(qname, requantize_bits)
    config = QuantConfig(bits=route.bits, group_size=route.group, mode=route.mode, scale_dtype=route.scale_dtype)
    blocks = raw.reshape(-1, type_size)
    per_row = k // block_size
    if not route.exact:
        try:
            with np.errstate(all="ignore"):  # a non-finite scale shows as a non-finite weight, reported below
                values = gguf.quants.dequantize(blocks, qtype).reshape(n, k)
        except NotImplementedError:
            raise ValueError(f"GGUF tensor {name!r} has type {qname}, which the installed gguf package "
                             f"({getattr(gguf, '__version__', 'unknown version')}) cannot dequantize; a newer gguf "
                             "can") from None
        bad = ~np.isfinite(values)
        if bad.any():
            r, c = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"GGUF tensor {name!r}: its {qname} blocks decode to a non-finite weight (row {r}, "
                             f"column {c}); a QuantizedWeight cannot hold NaN/Inf weights")
        return quantize_weight(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), config)
    sub = block_size // route.group  # sub-blocks per block: 1 (Q5_0 / Q5_1), 8 (Q4_K / Q5_K) or 16
    if route.group == NARROW_GROUP:
        unit, scales, offsets = _sub16_params(qname, blocks, name, per_row)
        codes = _unit_codes(blocks, qtype, unit) + (128 if route.mode == "sym" else 0)  # signed q + 128 for sym
        return _finish(codes, scales, offsets, route, config, n, k, per_row * sub)
    d = _f16(blocks, 0).astype(np.float32)
    _check_finite(d, "d", name, per_row)
    if qname == "Q5_0":
        codes = _unit_codes(blocks, qtype, _unit_q5) + 128  # gguf gives q - 16; 8-bit sym stores (q - 16) + 128
        scales, offsets = d[:, None], None
    elif qname == "Q5_1":
        m = _f16(blocks, 2).astype(np.float32)
        _check_finite(m, "m", name, per_row)
        codes = _unit_codes(blocks, qtype, _unit_q5_1)
        scales, offsets = d[:, None], m[:, None]
    else:  # Q4_K / Q5_K: w = (d * sc) * q - dmin * mn per sub-block of 32
        dmin = _f16(blocks, 2).astype(np.float32)
        _check_finite(dmin, "dmin", name, per_row)
        sc, mn = _k_scales(blocks)
        codes = _unit_codes(blocks, qtype, _unit_k)
        scales, offsets = d[:, None] * sc, -(dmin[:, None] * mn)  # exact in float32: 11-bit x 6-bit mantissas
    return _finish(codes, scales, offsets, route, config, n, k, per_row * sub)


def _finish(codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, route: _Route, config: QuantConfig,
            n: int, k: int, groups: int) -> QuantizedWeight:
    """The QuantizedWeight of integer-valued codes [nblocks, block] and float32 group parameters [nblocks, sub]."""
    codes = torch.from_numpy(np.rint(codes).astype(np.int16).reshape(n, k))
    to_t = lambda a: torch.from_numpy(np.ascontiguousarray(a.reshape(n, groups))).to(route.scale_dtype)
    return from_codes(codes, to_t(scales), config, offsets=None if offsets is None else to_t(offsets))


__all__ = ["FLOAT_TYPES", "REQUANTIZED", "ROUTES", "route_of", "to_quantized_weight"]
