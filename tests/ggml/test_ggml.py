"""mixgemm.ggml: byte equality with llama.cpp's reference quantizers (via the gguf package and a scalar
transliteration of ggml-quants.c), dequantization, dot products, lossless conversion to QuantizedWeight."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mixgemm import ggml, reference
from mixgemm.formats import QuantConfig, dequantize_weight, from_codes, quantize_weight

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

F32 = np.float32
GGUF_TYPES = {"q4_0": GT.Q4_0, "q4_1": GT.Q4_1, "q8_0": GT.Q8_0}
ignore_overflow = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's own fp16 overflow warnings


def special_rows(rng: np.random.Generator, k: int = 128) -> np.ndarray:
    rows = [
        rng.standard_normal(k),
        rng.standard_normal(k) * 1e-3,
        rng.standard_normal(k) * 100,
        np.zeros(k),
        np.full(k, 0.3),
        np.full(k, -7.25),
        rng.uniform(1, 2, k),  # one-signed
        np.tile([3.0, -3.0], k // 2),  # magnitude ties between signs
        np.tile([-3.0, 3.0], k // 2),
        rng.standard_normal(k) * 1e-6,  # fp16-subnormal scales
    ]
    for huge in (1e4, -6e4, 1e6, 3e38):  # 1e6 and 3e38 overflow the fp16 scale to inf, as in llama.cpp
        r = rng.standard_normal(k)
        r[rng.integers(k)] = huge
        rows.append(r)
    return np.stack(rows).astype(F32)


# --------------------------------------------------------------------------- scalar transliteration of C

def _f16_bytes(v) -> bytes:
    with np.errstate(over="ignore"):
        return np.float16(v).tobytes()


def _roundf(v) -> int:
    return int(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))  # exact in float64 for float32 v


def c_quantize_row(x: np.ndarray, qtype: str) -> np.ndarray:
    """quantize_row_{qtype}_ref from ggml-quants.c, one float32 scalar operation at a time."""
    out = bytearray()
    for i in range(0, len(x), 32):
        xs = [F32(v) for v in x[i:i + 32]]
        if qtype == "q4_0":
            amax, mx = F32(0), F32(0)
            for v in xs:
                if amax < abs(v):
                    amax, mx = abs(v), v
            d = mx / F32(-8)
            inv = F32(1) / d if d != 0 else F32(0)
            q = [min(15, int(xs[j] * inv + F32(8.5))) for j in range(32)]  # (int8_t) truncates
            out += _f16_bytes(d) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
        elif qtype == "q4_1":
            lo, hi = F32(np.finfo(F32).max), F32(-np.finfo(F32).max)
            for v in xs:
                lo = v if v < lo else lo
                hi = v if v > hi else hi
            d = (hi - lo) / F32(15)
            inv = F32(1) / d if d != 0 else F32(0)
            q = [min(15, int((xs[j] - lo) * inv + F32(0.5))) for j in range(32)]
            out += _f16_bytes(d) + _f16_bytes(lo) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
        else:
            amax = F32(0)
            for v in xs:
                amax = max(amax, abs(v))
            d = amax / F32(127)
            inv = F32(1) / d if d != 0 else F32(0)
            q = [_roundf(v * inv) for v in xs]
            out += _f16_bytes(d)
            if qtype == "q8_1":
                with np.errstate(over="ignore"):
                    out += _f16_bytes(F32(sum(q)) * d)
            out += np.array(q, dtype=np.int8).tobytes()
    return np.frombuffer(bytes(out), dtype=np.uint8)


# --------------------------------------------------------------------------- quantize / dequantize

@ignore_overflow
@pytest.mark.parametrize("qtype", list(GGUF_TYPES))
def test_bytes_equal_gguf(qtype, rng):
    x = np.concatenate([special_rows(rng), rng.standard_normal((6, 128)).astype(F32)])
    raw = ggml.quantize(x, qtype)
    ref = gguf_quantize(x, GGUF_TYPES[qtype])
    assert raw.dtype == np.uint8 and raw.shape == ref.shape == (x.shape[0], 4 * ggml.type_size(qtype))
    assert np.array_equal(raw, ref)
    deq = ggml.dequantize(raw, qtype, x.shape)
    assert deq.dtype == np.float32 and deq.shape == x.shape
    assert np.array_equal(deq, gguf_dequantize(ref, GGUF_TYPES[qtype]), equal_nan=True)


@ignore_overflow
@settings(max_examples=25, deadline=None)
@given(qtype=st.sampled_from(list(GGUF_TYPES)), rows=st.integers(1, 5), blocks=st.integers(1, 4),
       log_scale=st.floats(-6, 4), seed=st.integers(0, 2**31))
def test_bytes_equal_gguf_property(qtype, rows, blocks, log_scale, seed):
    x = (np.random.default_rng(seed).standard_normal((rows, 32 * blocks)) * 10**log_scale).astype(F32)
    raw = ggml.quantize(x, qtype)
    assert np.array_equal(raw, gguf_quantize(x, GGUF_TYPES[qtype]))
    assert np.array_equal(ggml.dequantize(raw, qtype, x.shape), gguf_dequantize(raw, GGUF_TYPES[qtype]),
                          equal_nan=True)


@pytest.mark.parametrize("qtype", ggml.QTYPES)
def test_bytes_equal_llama_cpp_reference(qtype, rng):
    """Against the scalar C transliteration; covers q8_1 (not in gguf) and -0.0 blocks."""
    x = special_rows(rng, 64)
    x = np.concatenate([x, np.full((1, 64), -0.0, dtype=F32), np.array([[-0.0, 0.0] * 32], dtype=F32)])
    raw = ggml.quantize(x, qtype)
    for r in range(x.shape[0]):
        assert np.array_equal(raw[r], c_quantize_row(x[r], qtype)), f"row {r}"


def test_q8_1_layout_and_sum(rng):
    x = special_rows(rng, 64)[:10]
    raw = ggml.quantize(x, "q8_1")
    assert raw.shape == (10, 2 * 36) and ggml.type_size("q8_1") == 36
    b1 = ggml.as_blocks(raw, "q8_1")
    b0 = ggml.as_blocks(ggml.quantize(x, "q8_0"), "q8_0")
    assert np.array_equal(b1["d"], b0["d"]) and np.array_equal(b1["qs"], b0["qs"])  # same d and codes as q8_0
    # s = fp16(sum(q) * d) with the float32 d, before its fp16 rounding
    d32 = np.abs(x.reshape(10, 2, 32)).max(-1) / F32(127)
    s = (b1["qs"].astype(np.int32).sum(-1).astype(F32) * d32).astype(np.float16)
    assert np.array_equal(b1["s"], s)
    assert np.array_equal(ggml.dequantize(raw, "q8_1", x.shape), b1["qs"].astype(F32).reshape(10, 64)
                          * np.repeat(b1["d"].astype(F32), 32, axis=1))


@pytest.mark.parametrize("qtype", ("q4_0", "q4_1"))
def test_nibble_order_every_byte(qtype):
    """Exhaustive: byte j of a block holds element j (low nibble) and element j + 16 (high nibble)."""
    blocks = np.zeros(16, dtype=ggml.BLOCK_DTYPES[qtype])
    blocks["d"] = 0.5
    if qtype == "q4_1":
        blocks["m"] = -2.0
    allbytes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    blocks["qs"] = allbytes
    raw = blocks.view(np.uint8)
    deq = ggml.dequantize(raw, qtype, (16, 32))
    lo, hi = (allbytes & 0xF).astype(F32), (allbytes >> 4).astype(F32)
    bias, m = (8.0, 0.0) if qtype == "q4_0" else (0.0, -2.0)
    assert np.array_equal(deq[:, :16], (lo - bias) * 0.5 + m)
    assert np.array_equal(deq[:, 16:], (hi - bias) * 0.5 + m)
    assert np.array_equal(deq, gguf_dequantize(raw.reshape(16, -1), GGUF_TYPES[qtype]))


@pytest.mark.parametrize("qtype", ("q8_0", "q8_1"))
def test_every_int8_code_dequantizes(qtype):
    blocks = np.zeros(8, dtype=ggml.BLOCK_DTYPES[qtype])
    blocks["d"] = -0.25
    blocks["qs"] = np.arange(-128, 128, dtype=np.int8).reshape(8, 32)
    deq = ggml.dequantize(blocks.view(np.uint8), qtype, (256,))
    assert np.array_equal(deq, np.arange(-128, 128, dtype=F32) * F32(-0.25))


@settings(max_examples=25, deadline=None)
@given(qtype=st.sampled_from(ggml.QTYPES), seed=st.integers(0, 2**31), log_scale=st.floats(-3, 3))
def test_quantization_error_at_most_half_step(qtype, seed, log_scale):
    x = (np.random.default_rng(seed).standard_normal((3, 96)) * 10**log_scale).astype(F32)
    deq = ggml.dequantize(ggml.quantize(x, qtype), qtype, x.shape).astype(np.float64)
    b = ggml.as_blocks(ggml.quantize(x, qtype), qtype)
    d_signed = np.repeat(b["d"].astype(np.float64), 32, axis=1)
    d = np.abs(d_signed)
    err = np.abs(x.astype(np.float64) - deq)
    # Codes are chosen against the float32 d; the stored fp16 d is off by at most half an fp16 spacing
    # (relative 2**-11, or 2**-25 absolute for subnormals), which moves code c's value by |c| times that.
    f16_err = lambda v: np.maximum(np.abs(v) * 2.0**-11, 2.0**-25)
    if qtype == "q4_0":
        # Codes span [-8, 7] d with d = max / -8: max itself is code -8; elements on the other side beyond
        # 7.5 |d| are clamped to code 7 (error up to |d|); all others round to nearest (error <= |d| / 2).
        slop = 8.5 * f16_err(d)
        clamped = x / d_signed > 7.5
        assert np.all(err[~clamped] <= (d * 0.5 + slop)[~clamped])
        assert np.all(err[clamped] <= (d + slop)[clamped])
    else:
        qmax = 15 if qtype == "q4_1" else 127
        slop = (qmax + 0.5) * f16_err(d)
        if qtype == "q4_1":
            slop = slop + f16_err(np.repeat(b["m"].astype(np.float64), 32, axis=1))
        assert np.all(err <= d * 0.5 + slop)


def test_quantize_accepts_torch_and_float64(rng):
    x = rng.standard_normal((2, 3, 64))
    raw = ggml.quantize(x, "q4_0")  # float64 -> float32 first, as gguf does
    assert raw.shape == (2, 3, 36)
    assert np.array_equal(raw, ggml.quantize(x.astype(F32), "q4_0"))
    assert np.array_equal(ggml.quantize(torch.from_numpy(x), GT.Q4_0), raw)  # gguf's enum works too
    assert np.array_equal(ggml.quantize(torch.from_numpy(x).to(torch.bfloat16), "Q8_0"),
                          ggml.quantize(torch.from_numpy(x).to(torch.bfloat16).float().numpy(), "q8_0"))
    x_before = x.copy()
    ggml.quantize(x, "q4_1")
    assert np.array_equal(x, x_before)
    assert np.array_equal(ggml.dequantize(torch.from_numpy(raw), "q4_0", (2, 3, 64)),
                          ggml.dequantize(raw, "q4_0", (2, 3, 64)))


# --------------------------------------------------------------------------- dot products

def _f64_dequant(raw, qtype, shape):
    b = ggml.as_blocks(raw.reshape(shape[0], -1), qtype)
    q = ggml.block_codes(b).astype(np.float64)
    d = b["d"].astype(np.float64)[..., None]
    if qtype == "q4_0":
        return ((q - 8) * d).reshape(shape)
    if qtype == "q4_1":
        return (q * d + b["m"].astype(np.float64)[..., None]).reshape(shape)
    return (q * d).reshape(shape)


@pytest.mark.parametrize("pair", ggml.PAIRS)
def test_vec_dot_against_float(pair, rng, rel_err):
    xt, yt = pair
    n, m, k = 12, 5, 256
    w = rng.standard_normal((n, k)).astype(F32)
    a = (rng.standard_normal((m, k)) + 0.5).astype(F32)  # a non-zero mean so that the sum terms matter
    wr, ar = ggml.quantize(w, xt), ggml.quantize(a, yt)
    out = ggml.vec_dot(wr, xt, ar, yt)
    assert out.shape == (m, n) and out.dtype == np.float64
    direct = _f64_dequant(ar, yt, (m, k)) @ _f64_dequant(wr, xt, (n, k)).T
    if yt == "q8_1" and xt in ("q4_0", "q4_1"):
        # llama.cpp folds the weight's -8 / m through the *stored* s = fp16(sum(q) d_f32); the difference
        # to the dequantized product is exactly that rounding, times -8 dx resp. m per block.
        bx, by = ggml.as_blocks(wr, xt), ggml.as_blocks(ar, yt)
        s_err = by["s"].astype(np.float64) - by["d"].astype(np.float64) * by["qs"].astype(np.float64).sum(-1)
        coef = -8 * bx["d"].astype(np.float64) if xt == "q4_0" else bx["m"].astype(np.float64)
        correction = s_err @ coef.T  # sum over blocks of s_err[m, b] * coef[n, b]
        assert np.abs(correction).max() > 0  # the stored sum really is used
        direct = direct + correction
    assert rel_err(out, direct) <= 1e-12
    # and it approximates the float product of the original vectors
    assert rel_err(out, a.astype(np.float64) @ w.astype(np.float64).T) < 0.2


def test_vec_dot_shapes(rng):
    w = ggml.quantize(rng.standard_normal((4, 64)), "q4_0")
    a = ggml.quantize(rng.standard_normal((3, 64)), "q8_0")
    full = ggml.vec_dot(w, "q4_0", a, "q8_0")
    assert full.shape == (3, 4)
    assert np.array_equal(ggml.vec_dot(w[1], "q4_0", a, "q8_0"), full[:, 1])
    assert np.array_equal(ggml.vec_dot(w, "q4_0", a[2], "q8_0"), full[2])
    one = ggml.vec_dot(w[1], "q4_0", a[2], "q8_0")
    assert isinstance(one, float) and one == full[2, 1]


def test_vec_dot_matches_llama_cpp_loop(rng):
    """ggml_vec_dot_q4_0_q8_0 (generic C): sumi per block over nibble pairs, float32 accumulation."""
    w = ggml.quantize(rng.standard_normal(128), "q4_0")
    a = ggml.quantize(rng.standard_normal(128), "q8_0")
    bx, by = ggml.as_blocks(w, "q4_0"), ggml.as_blocks(a, "q8_0")
    sumf = F32(0)
    for b in range(4):
        sumi = 0
        for j in range(16):
            v0 = int(bx["qs"][b, j] & 0x0F) - 8
            v1 = int(bx["qs"][b, j] >> 4) - 8
            sumi += v0 * int(by["qs"][b, j]) + v1 * int(by["qs"][b, j + 16])
        sumf += F32(sumi) * F32(bx["d"][b]) * F32(by["d"][b])
    ours = ggml.vec_dot(w, "q4_0", a, "q8_0")
    assert abs(ours - float(sumf)) <= 1e-5 * abs(ours)


# --------------------------------------------------------------------------- conversions

def _random_raw(rng, qtype, n, k):
    """Random block bytes with every code pattern (incl. q8_0's -128) and finite fp16 d (and m)."""
    blocks = np.zeros((n, k // 32), dtype=ggml.BLOCK_DTYPES[qtype])
    blocks["d"] = (rng.standard_normal(blocks.shape) * 0.01).astype(np.float16)
    if qtype == "q4_1":
        blocks["m"] = (rng.standard_normal(blocks.shape) * 0.1).astype(np.float16)
    if qtype == "q8_0":
        blocks["qs"] = rng.integers(-128, 128, blocks["qs"].shape)
        blocks["qs"][0, 0, :] = -128
    else:
        blocks["qs"] = rng.integers(0, 256, blocks["qs"].shape)
    return blocks.view(np.uint8)


@pytest.mark.parametrize("qtype, bits, mode", (("q4_0", 4, "sym"), ("q4_1", 4, "offset"), ("q8_0", 8, "sym")))
def test_conversion_round_trip_lossless(qtype, bits, mode, rng, rel_err):
    n, k = 9, 256
    for raw in (_random_raw(rng, qtype, n, k), ggml.quantize(rng.standard_normal((n, k)), qtype)):
        qw = ggml.to_quantized_weight(raw, qtype, (n, k))
        assert (qw.bits, qw.mode, qw.group_size, qw.scales.dtype) == (bits, mode, 32, torch.float16)
        assert qw.shape == (n, k)
        # same values, bit for bit (q * s + m is exact in float64, then one rounding, like ggml's float32)
        deq = ggml.dequantize(raw, qtype, (n, k))
        assert np.array_equal(dequantize_weight(qw, torch.float32).numpy(), deq)
        back = ggml.from_quantized_weight(qw)
        assert back.shape == (n, k // 32 * ggml.type_size(qtype)) and np.array_equal(back, raw)
        assert np.array_equal(ggml.from_quantized_weight(qw, qtype), raw)
        x = torch.from_numpy(rng.standard_normal((3, k)))
        assert rel_err(reference.matmul(x, qw), x.numpy() @ _f64_dequant(raw, qtype, (n, k)).T) <= 1e-12


@pytest.mark.parametrize("bits, mode, qtype", ((4, "sym", "q4_0"), (4, "offset", "q4_1"), (8, "sym", "q8_0")))
def test_quantized_weight_to_ggml_and_back(bits, mode, qtype, torch_gen):
    qw = quantize_weight(torch.randn(6, 128, generator=torch_gen), bits=bits, group_size=32, mode=mode)
    raw = ggml.from_quantized_weight(qw)
    again = ggml.to_quantized_weight(raw, qtype, qw.shape)
    assert torch.equal(again.codes(), qw.codes()) and torch.equal(again.scales, qw.scales)
    if mode == "offset":
        assert torch.equal(again.offsets, qw.offsets)
    assert torch.equal(dequantize_weight(again, torch.float64), dequantize_weight(qw, torch.float64))


def test_q4_0_negative_scales_survive(rng):
    x = np.abs(rng.standard_normal((2, 64))).astype(F32)  # largest element positive -> d = max / -8 < 0
    raw = ggml.quantize(x, "q4_0")
    qw = ggml.to_quantized_weight(raw, "q4_0", (2, 64))
    assert bool((qw.scales < 0).all())
    assert np.array_equal(dequantize_weight(qw, torch.float32).numpy(), ggml.dequantize(raw, "q4_0", (2, 64)))


def test_zero_point_to_q4_1_when_exact():
    codes = torch.arange(64, dtype=torch.uint8).remainder(16).reshape(2, 32)
    cfg = QuantConfig(bits=4, group_size=32, mode="zero_point")
    qw = from_codes(codes, torch.tensor([[0.25], [0.5]]), cfg, zeros=torch.tensor([[3], [12]]))
    raw = ggml.from_quantized_weight(qw)  # m = -z * s = -0.75, -6: exact in fp16
    assert np.array_equal(ggml.dequantize(raw, "q4_1", (2, 32)), dequantize_weight(qw, torch.float32).numpy())
    lossy = from_codes(codes, torch.tensor([[0.1], [0.5]]), cfg, zeros=torch.tensor([[7], [12]]))
    with pytest.raises(ValueError, match=r"zero_point -> q4_1 would be lossy: m = -z \* s"):
        ggml.from_quantized_weight(lossy)


def test_per_channel_k32_is_one_block(torch_gen):
    qw = quantize_weight(torch.randn(3, 32, generator=torch_gen), bits=8, group_size=-1, mode="sym")
    raw = ggml.from_quantized_weight(qw)
    assert raw.shape == (3, 34)
    assert torch.equal(ggml.to_quantized_weight(raw, "q8_0", (3, 32)).codes(), qw.codes())


@pytest.mark.parametrize("kwargs, qtype, match", (
    (dict(bits=4, group_size=64), None, r"ggml blocks hold 32 weights; this weight has group_size=64"),
    (dict(bits=4, group_size=-1), None, r"group_size=64: converting would re-quantize"),
    (dict(bits=4, group_size=32, scale_dtype=torch.bfloat16), None, r"torch.bfloat16 scales.*lossy"),
    (dict(bits=8, group_size=32, scale_dtype=torch.float32), None, r"torch.float32 scales.*lossy"),
    (dict(bits=8, group_size=32, mode="offset"), None, r"no ggml block type holds a 8-bit mode='offset'"),
    (dict(bits=8, group_size=32, mode="zero_point"), None, r"8-bit mode='zero_point'"),
    (dict(bits=4, group_size=32), "q8_0", r"q8_0 holds 8-bit mode='sym' weights, got 4-bit mode='sym'"),
    (dict(bits=4, group_size=32), "q4_1", r"q4_1 holds 4-bit mode='offset' weights, got 4-bit mode='sym'"),
    (dict(bits=4, group_size=32, mode="offset"), "q4_0", r"q4_0 holds 4-bit mode='sym'"),
    (dict(bits=8, group_size=32), "q8_1", r"q8_1 is llama.cpp's activation type"),
    (dict(bits=8, group_size=32), "q5_0", r"unsupported ggml block type 'q5_0'"),
))
def test_lossy_conversion_errors(kwargs, qtype, match, torch_gen):
    qw = quantize_weight(torch.randn(2, 64, generator=torch_gen), **kwargs)
    with pytest.raises(ValueError, match=match):
        ggml.from_quantized_weight(qw, qtype)


@ignore_overflow
def test_to_quantized_weight_errors(rng):
    raw = ggml.quantize(rng.standard_normal((2, 64)), "q8_1")
    with pytest.raises(ValueError, match="q8_1 is llama.cpp's activation type"):
        ggml.to_quantized_weight(raw, "q8_1", (2, 64))
    x = rng.standard_normal((2, 64)).astype(F32)
    x[1, 40] = 1e6  # d = 1e6 / -8 overflows fp16
    raw = ggml.quantize(x, "q4_0")
    with pytest.raises(ValueError, match=r"q4_0 block 1 of row 1 has a non-finite d \(-inf\)"):
        ggml.to_quantized_weight(raw, "q4_0", (2, 64))
    raw = ggml.quantize(rng.standard_normal((2, 64)), "q4_0")
    with pytest.raises(ValueError, match=r"q4_0 bytes do not match shape \(2, 96\): expected 108 bytes"):
        ggml.to_quantized_weight(raw, "q4_0", (2, 96))
    with pytest.raises(ValueError, match=r"shape must be \(N, K\)"):
        ggml.to_quantized_weight(raw, "q4_0", (2, 2, 32))
    with pytest.raises(ValueError, match=r"K a positive multiple of 32"):
        ggml.to_quantized_weight(raw, "q4_0", (4, 16))
    with pytest.raises(TypeError, match="must be a mixgemm QuantizedWeight"):
        ggml.from_quantized_weight(raw)
