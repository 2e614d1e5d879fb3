"""The float64 references: matmul, the block-wise integer GEMM, activation quantization, conv2d."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mixgemm import reference
from mixgemm.formats import (
    PER_CHANNEL,
    QuantizedWeight,
    quantize_activation,
    quantize_conv_weight,
    quantize_weight,
)
from mixgemm.reference import block_int_gemm, block_int_gemm_parts

MODES = ("sym", "zero_point", "offset")
GROUPS = (32, 64, 128, 256, PER_CHANNEL)


def np_dequant(qw: QuantizedWeight) -> np.ndarray:
    """Independent float64 dequantization straight from the documented bytes (not mixgemm's code path)."""
    n, k = qw.shape
    packed = qw.qweight.cpu().numpy()
    if qw.bits == 4:
        codes = np.empty((n, k), dtype=np.float64)
        codes[:, 0::2] = packed & 0xF
        codes[:, 1::2] = packed >> 4
    else:
        codes = packed.astype(np.float64)
    g = k if qw.config.group_size == PER_CHANNEL else qw.config.group_size
    rep = lambda t: np.repeat(t.cpu().double().numpy(), g, axis=1)
    s = rep(qw.scales)
    if qw.mode == "sym":
        return (codes - 2 ** (qw.bits - 1)) * s
    if qw.mode == "zero_point":
        return (codes - rep(qw.zeros)) * s
    return codes * s + rep(qw.offsets)


# --------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group_size", GROUPS)
def test_matmul_equals_dequant_float64(bits, mode, group_size, torch_gen, rel_err):
    w = torch.randn(48, 256, generator=torch_gen) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group_size, mode=mode)
    x = torch.randn(5, 256, generator=torch_gen, dtype=torch.float64)
    y = reference.matmul(x, qw)
    assert y.dtype == torch.float64 and y.shape == (5, 48)
    assert rel_err(y, x.numpy() @ np_dequant(qw).T) <= 1e-12


@pytest.mark.parametrize("x_dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64))
def test_matmul_leading_dims_bias_out_dtype(x_dtype, torch_gen, rel_err):
    qw = quantize_weight(torch.randn(40, 96, generator=torch_gen), bits=4, group_size=32, mode="zero_point")
    x = torch.randn(2, 3, 96, generator=torch_gen).to(x_dtype)
    bias = torch.randn(40, generator=torch_gen)
    x_before = x.clone()
    y = reference.matmul(x, qw, bias, out_dtype=torch.float64)
    assert y.shape == (2, 3, 40) and y.dtype == torch.float64
    ref = x.double().numpy().reshape(6, 96) @ np_dequant(qw).T + bias.double().numpy()
    assert rel_err(y.reshape(6, 40), ref) <= 1e-12
    assert torch.equal(x, x_before)  # inputs never modified
    default = reference.matmul(x, qw, bias)
    assert default.dtype == x_dtype and torch.equal(default, y.to(x_dtype))
    for out in (torch.float16, torch.bfloat16, torch.float32):
        assert torch.equal(reference.matmul(x, qw, bias, out_dtype=out), y.to(out))


@pytest.mark.parametrize("activation, lo, hi", (("relu", 0.0, None), ("relu6", 0.0, 6.0), (None, None, None),
                                                ("none", None, None)))
def test_matmul_activation_clamp(activation, lo, hi, torch_gen, rel_err):
    qw = quantize_weight(torch.randn(64, 128, generator=torch_gen), bits=8, group_size=64, mode="offset")
    x = torch.randn(8, 128, generator=torch_gen, dtype=torch.float64)
    bias = torch.randn(64, generator=torch_gen, dtype=torch.float64)
    raw = x.numpy() @ np_dequant(qw).T + bias.numpy()
    assert raw.min() < 0 and raw.max() > 6  # the clamps below really cut something
    y = reference.matmul(x, qw, bias, activation=activation)
    assert rel_err(y, np.clip(raw, lo, hi)) <= 1e-12
    if lo is not None:
        assert float(y.min()) == lo
    if hi is not None:
        assert float(y.max()) == hi


# --------------------------------------------------------------------------- block_int_gemm

@pytest.mark.parametrize("act_mode", ("sym", "asym"))
@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group_size", GROUPS)
def test_block_int_gemm_equals_direct(act_mode, bits, mode, group_size, torch_gen, rel_err):
    m, n, k = 7, 24, 256
    w = torch.randn(n, k, generator=torch_gen) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group_size, mode=mode)
    x = torch.randn(m, k, generator=torch_gen) + 0.3  # an offset so that asym's o term matters
    a = quantize_activation(x, block_size=group_size, mode=act_mode)
    direct = a.dequantize().numpy() @ np_dequant(qw).T
    c = block_int_gemm(a, qw)
    assert c.dtype == torch.float64 and c.shape == (m, n)
    assert rel_err(c, direct) <= 1e-12

    # The integer parts, exactly, against an independent int64 computation.
    cq, sum_b = block_int_gemm_parts(a, qw)
    g = qw.group_size
    aq = a.q.numpy().astype(np.int64)
    bq = qw.codes().numpy().astype(np.int64)
    assert cq.dtype == torch.int64 and cq.shape == (k // g, m, n)
    for i in range(k // g):
        sl = slice(i * g, (i + 1) * g)
        assert np.array_equal(cq[i].numpy(), aq[:, sl] @ bq[:, sl].T)
    assert np.array_equal(sum_b.numpy(), bq.reshape(n, k // g, g).sum(-1))


@settings(max_examples=25, deadline=None)
@given(act_mode=st.sampled_from(("sym", "asym")), bits=st.sampled_from((4, 8)), mode=st.sampled_from(MODES),
       group_size=st.sampled_from((32, 64)), m=st.integers(1, 9), n=st.integers(1, 17),
       groups=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_block_int_gemm_property(act_mode, bits, mode, group_size, m, n, groups, seed, rel_err):
    gen = torch.Generator().manual_seed(seed)
    k = group_size * groups
    qw = quantize_weight(torch.randn(n, k, generator=gen), bits=bits, group_size=group_size, mode=mode)
    a = quantize_activation(torch.randn(m, k, generator=gen) * 3 - 1, block_size=group_size, mode=act_mode)
    assert rel_err(block_int_gemm(a, qw), a.dequantize().numpy() @ np_dequant(qw).T) <= 1e-12


# --------------------------------------------------------------------------- quantize_activation

def _act_inputs(gen):
    x = torch.randn(6, 128, generator=gen)
    x[1] = 0.0
    x[2] = 0.75  # constant
    x[3, 5] = 1e4  # one huge value
    x[4] = x[4].abs() + 2.0  # one-signed, far from 0
    return x


@pytest.mark.parametrize("block_size", (32, 64, -1))
@pytest.mark.parametrize("x_dtype", (torch.float16, torch.bfloat16, torch.float32))
def test_quantize_activation_sym(block_size, x_dtype, torch_gen):
    x = _act_inputs(torch_gen).to(x_dtype)
    a = quantize_activation(x, block_size, "sym")
    b = 128 if block_size == -1 else block_size
    assert a.block_size == b and a.mode == "sym"
    assert a.q.dtype == torch.int8 and a.scales.dtype == torch.float32 and a.sums.dtype == torch.int32
    q = a.q.to(torch.int64).reshape(6, 128 // b, b)
    assert torch.equal(a.sums.to(torch.int64), q.sum(-1))  # sums exact
    assert int(a.q.min()) >= -127 and int(a.q.max()) <= 127
    assert torch.equal(a.offsets, torch.zeros_like(a.offsets))
    xb = x.float().reshape(6, 128 // b, b)
    assert torch.equal(a.scales, xb.abs().amax(-1) / 127.0)
    # |x - q d| <= d/2 up to float32 rounding of x * (1/d): |x / d| <= 127, so within 127 * 2**-22 of d/2.
    d = a.scales.double()[..., None]
    err = (xb.double() - q.double() * d).abs()
    assert bool((err <= d * (0.5 + 127 * 2.0**-22)).all())
    assert torch.equal(a.dequantize()[1], torch.zeros(128, dtype=torch.float64))


@pytest.mark.parametrize("block_size", (32, 128))
def test_quantize_activation_asym(block_size, torch_gen):
    x = _act_inputs(torch_gen)
    a = quantize_activation(x, block_size, "asym")
    b = block_size
    q = a.q.to(torch.int64).reshape(6, 128 // b, b)
    assert torch.equal(a.sums.to(torch.int64), q.sum(-1))
    assert int(a.q.min()) >= -128 and int(a.q.max()) <= 127
    xb = x.double().reshape(6, 128 // b, b)
    s, o = a.scales.double()[..., None], a.offsets.double()[..., None]
    err = (xb - (q.double() * s + o)).abs()
    # float32 arithmetic on (x - o) / s with |x - o| <= 255 s: within 255 * 2**-22 of s/2.
    assert bool((err <= s * (0.5 + 255 * 2.0**-22)).all())
    # Constant blocks (rows 1 and 2): s = 1, o = the value, q = 0, reconstructed exactly.
    for r, v in ((1, 0.0), (2, 0.75)):
        assert torch.equal(a.q[r], torch.zeros(128, dtype=torch.int8))
        assert bool((a.scales[r] == 1.0).all()) and bool((a.offsets[r] == v).all())
        assert torch.equal(a.dequantize()[r], x[r].double())


def test_quantize_activation_per_token_independent(torch_gen):
    x = torch.randn(5, 64, generator=torch_gen) * torch.linspace(0.1, 10, 5)[:, None]
    for mode in ("sym", "asym"):
        whole = quantize_activation(x, 32, mode)
        for r in range(5):
            row = quantize_activation(x[r:r + 1], 32, mode)
            assert torch.equal(row.q, whole.q[r:r + 1]) and torch.equal(row.scales, whole.scales[r:r + 1])


# --------------------------------------------------------------------------- conv2d

def _conv_dequant(qcw) -> torch.Tensor:
    kh, kw = qcw.kernel_size
    co, ci_g = qcw.out_channels, qcw.in_channels_per_group
    w = torch.from_numpy(np_dequant(qcw.matrix)).reshape(co, kh, kw, ci_g)  # K = (kh * Kw + kw) * Ci_g + ci
    return w.permute(0, 3, 1, 2)


@pytest.mark.parametrize("group_size", (32, PER_CHANNEL))
def test_conv_weight_layout_and_error(group_size, torch_gen):
    w = torch.randn(8, 64, 3, 3, generator=torch_gen)
    qcw = quantize_conv_weight(w, bits=4, group_size=group_size, mode="zero_point")
    assert qcw.matrix.shape == (8, 9 * 64) and qcw.kernel_size == (3, 3) and qcw.in_channels_per_group == 64
    deq = qcw.dequantize(torch.float64)
    assert deq.shape == w.shape and torch.equal(deq, _conv_dequant(qcw))
    # Each element of the kernel is within s/2 of its own block's scale: proves the (tap, channel) order.
    g = 9 * 64 if group_size == PER_CHANNEL else group_size
    kidx = (torch.arange(3)[:, None, None] * 3 + torch.arange(3)[None, :, None]) * 64 + torch.arange(64)
    grp = (kidx // g).permute(2, 0, 1)  # [Ci, Kh, Kw]
    s = qcw.matrix.scales.double()[:, grp.reshape(-1)].reshape(8, 64, 3, 3)
    assert bool(((w.double() - deq).abs() <= s * (0.5 + 1e-12)).all())


@pytest.mark.parametrize("stride, padding, dilation, groups, activation", (
    (1, 0, 1, 1, None),
    (2, 1, 1, 1, "relu"),
    (1, 2, 2, 2, "relu6"),
    ((2, 1), (0, 1), 1, 4, None),
))
@pytest.mark.parametrize("channels_last", (False, True))
def test_conv2d_reference(stride, padding, dilation, groups, activation, channels_last, torch_gen, rel_err):
    ci, co = 64 * groups, 16
    w = torch.randn(co, 64, 3, 3, generator=torch_gen) * 0.1
    qcw = quantize_conv_weight(w, bits=8, group_size=32, mode="sym")
    x = torch.randn(2, ci, 9, 11, generator=torch_gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(co, generator=torch_gen)
    x_before = x.clone()
    y = reference.conv2d(x, qcw, bias, stride, padding, dilation, groups, activation, out_dtype=torch.float64)
    lo, hi = {None: (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0)}[activation]
    ref = F.conv2d(x.double(), _conv_dequant(qcw), bias.double(), stride, padding, dilation, groups)
    ref = ref.clamp(lo, hi) if lo is not None else ref
    assert y.dtype == torch.float64 and y.shape == ref.shape
    assert rel_err(y, ref) <= 1e-12
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(x, x_before)
    default = reference.conv2d(x, qcw, bias, stride, padding, dilation, groups, activation)
    assert default.dtype == x.dtype and torch.equal(default, y.float())
