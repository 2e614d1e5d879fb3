"""QuantConfig, plain packing, QuantizedWeight: round trips, nibble order, error bounds, layout cache."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mixgemm.formats import (
    PER_CHANNEL,
    QuantConfig,
    QuantizedWeight,
    dequantize_weight,
    from_codes,
    pack_codes,
    quantize_weight,
    unpack_codes,
)
from mixgemm.formats.weight import GROUP_SIZES, MODES, SCALE_DTYPES

ALL_GROUPS = (*GROUP_SIZES, PER_CHANNEL)


# --------------------------------------------------------------------------- QuantConfig

@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("group_size", ALL_GROUPS)
@pytest.mark.parametrize("mode", MODES)
def test_config_valid_and_derived_fields(bits, group_size, mode):
    c = QuantConfig(bits=bits, group_size=group_size, mode=mode)
    assert c.qmax == 2**bits - 1
    assert c.sym_bias == 2 ** (bits - 1)
    assert c.symmetric == (mode == "sym")
    k = 512
    g = k if group_size == PER_CHANNEL else group_size
    assert c.groups(k) == (g, k // g)


def test_config_defaults_and_normalization():
    c = QuantConfig()
    assert (c.bits, c.group_size, c.mode, c.scale_dtype) == (4, 128, "sym", torch.float16)
    assert QuantConfig(group_size=None).group_size == PER_CHANNEL
    c = QuantConfig(bits=np.int64(8), group_size=np.int32(64))  # numpy integers become int
    assert type(c.bits) is int and type(c.group_size) is int and (c.bits, c.group_size) == (8, 64)


def test_config_per_channel_groups_any_k():
    c = QuantConfig(bits=8, group_size=-1)
    assert c.groups(7) == (7, 1)
    assert QuantConfig(bits=4, group_size=-1).groups(10) == (10, 1)


# --------------------------------------------------------------------------- packing

def test_unpack_every_byte_nibble_order():
    """Exhaustive: byte j holds code 2j in bits 0-3 and code 2j+1 in bits 4-7."""
    packed = torch.arange(256, dtype=torch.uint8).reshape(1, 256)
    codes = unpack_codes(packed, 4, 512)
    assert codes.dtype == torch.uint8 and codes.shape == (1, 512)
    b = np.arange(256)
    assert np.array_equal(codes[0, 0::2].numpy(), b & 0xF)
    assert np.array_equal(codes[0, 1::2].numpy(), b >> 4)
    assert torch.equal(pack_codes(codes, 4), packed)


def test_pack_every_code_pair():
    pairs = np.array(list(itertools.product(range(16), repeat=2)), dtype=np.uint8)  # (lo, hi), 256 pairs
    codes = torch.from_numpy(pairs.reshape(1, -1))  # k = 2j is lo, 2j + 1 is hi
    packed = pack_codes(codes, 4)
    assert packed.shape == (1, 256)
    assert np.array_equal(packed[0].numpy(), pairs[:, 0] | (pairs[:, 1] << 4))
    assert torch.equal(unpack_codes(packed, 4, 512), codes)


def test_pack_8bit_every_code_identity():
    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    packed = pack_codes(codes, 8)
    assert torch.equal(packed, codes)
    assert torch.equal(unpack_codes(packed, 8, 128), codes)


@pytest.mark.parametrize("bits", (4, 8))
def test_pack_leading_dims_round_trip(bits, torch_gen):
    codes = torch.randint(0, 2**bits, (2, 3, 10), dtype=torch.uint8, generator=torch_gen)
    packed = pack_codes(codes, bits)
    assert packed.shape == (2, 3, 10 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, 10), codes)


@settings(max_examples=25, deadline=None)
@given(bits=st.sampled_from((4, 8)), rows=st.integers(1, 4), half_k=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_pack_round_trip_property(bits, rows, half_k, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (rows, 2 * half_k), dtype=torch.uint8, generator=g)
    assert torch.equal(unpack_codes(pack_codes(codes, bits), bits, 2 * half_k), codes)


def test_qweight_bytes_follow_plain_layout():
    """The packed qweight of a QuantizedWeight is exactly pack_codes(codes): byte j = q[2j] | q[2j+1] << 4."""
    codes = torch.arange(64, dtype=torch.uint8).remainder(16).reshape(1, 64)
    qw = from_codes(codes, torch.ones(1, 2), QuantConfig(bits=4, group_size=32))
    expected = (codes[0, 0::2] | (codes[0, 1::2] << 4)).reshape(1, 32)
    assert torch.equal(qw.qweight, expected)
    assert torch.equal(qw.codes(), codes)


# --------------------------------------------------------------------------- quantization error

def _weights(n_rand: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random rows plus degenerate ones: zeros, constants (+/-), one huge value, tiny values, one-signed."""
    rand = torch.randn(n_rand, k, generator=gen) * 0.02
    special = torch.stack([
        torch.zeros(k),
        torch.full((k,), 0.37),
        torch.full((k,), -1.5),
        torch.cat([torch.full((1,), 3.0e4), torch.randn(k - 1, generator=gen) * 0.02]),
        torch.cat([torch.randn(k - 1, generator=gen) * 0.02, torch.full((1,), -3.0e4)]),
        torch.randn(k, generator=gen) * 1e-6,  # fp16 scales are subnormal here
        torch.rand(k, generator=gen) + 1.0,  # all positive
        -torch.rand(k, generator=gen) - 1.0,  # all negative
    ])
    return torch.cat([rand, special])


def _group_params(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """|s| broadcast to [N, K] and the codes as float64 [N, K]."""
    s = qw.scales.double().abs().repeat_interleave(qw.group_size, dim=1)
    return s, qw.codes().double()


def _check_error_bound(w: torch.Tensor, qw: QuantizedWeight):
    deq = dequantize_weight(qw, torch.float64)
    s, codes = _group_params(qw)
    err = (w.double() - deq).abs()
    # Rounding to nearest against the stored parameters: <= s/2 (1e-12 covers float64 rounding of w / s).
    excess = err - s * (0.5 + 1e-12)
    worst = divmod(int(excess.argmax()), w.shape[1])
    assert float(excess.max()) <= 0.0, f"max excess {float(excess.max())} at {worst}"
    assert int(codes.min()) >= 0 and int(codes.max()) <= qw.config.qmax
    if qw.mode == "sym":
        assert int(codes.min()) >= 1  # |w| <= (2**(bits-1) - 1) s: the most negative code is never needed


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group_size", ALL_GROUPS)
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_error_at_most_half_scale(bits, mode, group_size, scale_dtype, torch_gen):
    w = _weights(3, 256, torch_gen)
    qw = quantize_weight(w, bits=bits, group_size=group_size, mode=mode, scale_dtype=scale_dtype)
    assert qw.scales.dtype == scale_dtype and qw.scales.shape == (w.shape[0], qw.num_groups)
    assert qw.qweight.dtype == torch.uint8 and qw.qweight.shape == (w.shape[0], 256 * bits // 8)
    assert (qw.zeros is not None) == (mode == "zero_point")
    assert (qw.offsets is not None) == (mode == "offset")
    _check_error_bound(w, qw)
    zero_row = dequantize_weight(qw, torch.float64)[3]
    assert torch.equal(zero_row, torch.zeros_like(zero_row))  # zeros stay exactly zero


@settings(max_examples=25, deadline=None)
@given(
    bits=st.sampled_from((4, 8)),
    mode=st.sampled_from(MODES),
    group_size=st.sampled_from(ALL_GROUPS),
    scale_dtype=st.sampled_from(SCALE_DTYPES),
    n=st.integers(1, 4),
    groups=st.integers(1, 3),
    log_scale=st.floats(-4, 3),
    in_dtype=st.sampled_from((torch.float32, torch.float16, torch.bfloat16, torch.float64)),
    seed=st.integers(0, 2**31),
)
def test_error_bound_property(bits, mode, group_size, scale_dtype, n, groups, log_scale, in_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = groups * (group_size if group_size != PER_CHANNEL else 34)
    w = (torch.randn(n, k, generator=g, dtype=torch.float64) * 10**log_scale).to(in_dtype)
    qw = quantize_weight(w, bits=bits, group_size=group_size, mode=mode, scale_dtype=scale_dtype)
    _check_error_bound(w, qw)


def test_quantize_does_not_modify_input_and_accepts_dtypes(torch_gen):
    w = torch.randn(4, 64, generator=torch_gen)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = w.to(dt)
        before = x.clone()
        qw = quantize_weight(x, bits=4, group_size=32)
        assert torch.equal(x, before)
        assert qw.shape == (4, 64) and qw.device == x.device


def test_dequantize_dtype_is_cast_of_float64(torch_gen):
    qw = quantize_weight(torch.randn(3, 64, generator=torch_gen), bits=4, group_size=32, mode="offset")
    ref = dequantize_weight(qw, torch.float64)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        out = dequantize_weight(qw, dt)
        assert out.dtype == dt and torch.equal(out, ref.to(dt))
    assert dequantize_weight(qw).dtype == torch.float32


def test_sym_scale_is_absmax_over_qpos_rounded_up(torch_gen):
    w = torch.randn(5, 128, generator=torch_gen)
    for bits, qpos in ((4, 7), (8, 127)):
        qw = quantize_weight(w, bits=bits, group_size=32, mode="sym", scale_dtype=torch.float16)
        exact = w.double().reshape(5, 4, 32).abs().amax(-1) / qpos
        s = qw.scales.double()
        assert bool((s >= exact).all())
        below = torch.nextafter(qw.scales, torch.zeros_like(qw.scales)).double()
        assert bool((below < exact).all())  # the smallest fp16 at or above the exact scale


def test_per_channel_weight_properties(torch_gen):
    qw = quantize_weight(torch.randn(6, 96, generator=torch_gen), bits=8, group_size=-1, mode="zero_point")
    assert qw.group_size == 96 and qw.num_groups == 1 and qw.scales.shape == (6, 1)
    assert qw.zero_points().dtype == torch.int32 and qw.zero_points().shape == (6, 1)


def test_zero_points_and_group_params(torch_gen):
    w = torch.randn(3, 64, generator=torch_gen)
    sym = quantize_weight(w, bits=4, group_size=32, mode="sym")
    assert torch.equal(sym.zero_points(), torch.full((3, 2), 8, dtype=torch.int32))
    s, m = sym.group_params_float64()
    assert torch.equal(m, -8 * sym.scales.double())
    zp = quantize_weight(w, bits=8, group_size=32, mode="zero_point")
    assert torch.equal(zp.zero_points(), zp.zeros.to(torch.int32))
    off = quantize_weight(w, bits=4, group_size=32, mode="offset")
    s, m = off.group_params_float64()
    assert torch.equal(m, off.offsets.double()) and torch.equal(s, off.scales.double())


@pytest.mark.parametrize("bits,gs,mode", [(4, 32, "sym"), (8, 32, "zero_point"), (4, -1, "offset"), (8, 64, "offset")])
def test_centered_params_and_group_sums(torch_gen, bits, gs, mode):
    """w = (q - sym_bias) s + m (the integer paths' form) and the per-group sums of c = q - sym_bias."""
    qw = quantize_weight(torch.randn(5, 128, generator=torch_gen), bits=bits, group_size=gs, mode=mode)
    n, k = qw.shape
    g = k // qw.num_groups
    s, m = qw.centered_params_float64()
    c = qw.codes().to(torch.int32) - qw.config.sym_bias
    w = (c.double().reshape(n, -1, g) * s[..., None] + m[..., None]).reshape(n, k)
    assert torch.allclose(w, dequantize_weight(qw, torch.float64), rtol=0, atol=1e-12)
    if mode == "sym":
        assert torch.equal(m, torch.zeros_like(m))
    csum, cterm = qw.centered_group_sums()
    assert csum.dtype == torch.int32 and torch.equal(csum, c.reshape(n, -1, g).sum(-1, dtype=torch.int32))
    assert torch.allclose(cterm, w.reshape(n, -1, g).sum(-1), rtol=1e-12, atol=1e-12)


def test_nbytes(torch_gen):
    w = torch.randn(8, 256, generator=torch_gen)
    assert quantize_weight(w, bits=4, group_size=128).nbytes() == 8 * 128 + 8 * 2 * 2
    zp = quantize_weight(w, bits=8, group_size=64, mode="zero_point")
    assert zp.nbytes() == 8 * 256 + 8 * 4 * 2 + 8 * 4
    assert quantize_weight(w, bits=4, group_size=32, mode="offset", scale_dtype=torch.float32).nbytes() == \
        8 * 128 + 2 * 8 * 8 * 4


# --------------------------------------------------------------------------- from_codes

@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("mode", MODES)
def test_from_codes_rebuilds_quantized_weight(bits, mode, torch_gen):
    qw = quantize_weight(torch.randn(5, 128, generator=torch_gen), bits=bits, group_size=64, mode=mode)
    again = from_codes(qw.codes(), qw.scales, qw.config, zeros=qw.zeros, offsets=qw.offsets)
    assert torch.equal(again.qweight, qw.qweight)
    assert torch.equal(again.scales, qw.scales)
    for a, b in ((again.zeros, qw.zeros), (again.offsets, qw.offsets)):
        assert (a is None and b is None) or torch.equal(a, b)
    assert again.shape == qw.shape and again.config == qw.config
    assert torch.equal(dequantize_weight(again, torch.float64), dequantize_weight(qw, torch.float64))


def test_from_codes_every_code_dequantizes_exactly():
    """Every code of every mode maps to its documented value, exactly."""
    for bits in (4, 8):
        qmax = 2**bits - 1
        codes = torch.arange(qmax + 1, dtype=torch.uint8).reshape(1, -1).repeat(2, 1)
        k = qmax + 1
        cfg = lambda mode, bits=bits: QuantConfig(bits=bits, group_size=-1, mode=mode)
        s = torch.tensor([[0.25], [-3.0]])
        q = codes.double()
        w = dequantize_weight(from_codes(codes, s, cfg("sym")), torch.float64)
        assert torch.equal(w, (q - 2 ** (bits - 1)) * s.double())
        z = torch.tensor([[3], [qmax]], dtype=torch.uint8)
        w = dequantize_weight(from_codes(codes, s, cfg("zero_point"), zeros=z), torch.float64)
        assert torch.equal(w, (q - z.double()) * s.double())
        m = torch.tensor([[-1.5], [0.125]])
        w = dequantize_weight(from_codes(codes, s, cfg("offset"), offsets=m), torch.float64)
        assert torch.equal(w, q * s.double() + m.double())
        assert w.shape == (2, k)


# --------------------------------------------------------------------------- layout cache

def test_layout_cache_builds_once_per_name(torch_gen):
    qw = quantize_weight(torch.randn(4, 64, generator=torch_gen), bits=4, group_size=32)
    before = qw.qweight.clone(), qw.scales.clone()
    calls = []

    def build(w):
        assert w is qw
        calls.append(1)
        return torch.flip(w.qweight, dims=(1,))

    a = qw.layout("flip", build)
    b = qw.layout("flip", build)
    assert a is b and len(calls) == 1
    c = qw.layout("other", build)
    assert c is not a and len(calls) == 2
    assert torch.equal(qw.qweight, before[0]) and torch.equal(qw.scales, before[1])  # plain tensors untouched

    moved = qw.to("cpu")
    assert moved._layouts == {}  # a moved weight rebuilds its layouts
    moved.layout("flip", lambda w: 1)
    assert moved.layout("flip", build) == 1 and len(calls) == 2
    assert qw.layout("flip", build) is a  # the original's cache is unaffected
