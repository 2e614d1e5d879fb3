"""Every bad input gets a clear error that names the problem (and never crashes deep inside)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mixgemm
from mixgemm import ggml, reference
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats import (
    QuantConfig,
    from_codes,
    pack_codes,
    quantize_activation,
    quantize_conv_weight,
    quantize_weight,
    unpack_codes,
)
from mixgemm.reference import block_int_gemm


@pytest.fixture
def qw():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    return quantize_weight(w, bits=4, group_size=32)


# --------------------------------------------------------------------------- QuantConfig

@pytest.mark.parametrize("kwargs, exc, match", (
    (dict(bits=3), ValueError, r"bits must be 4 or 8, got 3"),
    (dict(bits=16), ValueError, r"bits must be 4 or 8, got 16"),
    (dict(bits=4.0), ValueError, r"bits must be 4 or 8, got 4.0"),
    (dict(bits=True), ValueError, r"bits must be 4 or 8, got True"),
    (dict(group_size=48), ValueError,
     r"group_size must be one of \(32, 64, 128, 256\), -1 \(per-channel\) or 16 \(8-bit only\), got 48"),
    (dict(group_size=16), ValueError, r"group_size=16 is for 8-bit weights only .* got bits=4"),
    (dict(group_size=8, bits=8), ValueError, r"group_size must be one of .* got 8"),
    (dict(group_size=32.0), ValueError, r"group_size must be one of .* got 32.0"),
    (dict(group_size=0), ValueError, r"group_size must be one of .* got 0"),
    (dict(mode="asym"), ValueError, r"mode must be one of \('sym', 'zero_point', 'offset'\), got 'asym'"),
    (dict(scale_dtype=torch.int8), ValueError, r"scale_dtype must be one of .* got torch.int8"),
    (dict(scale_dtype=torch.float64), ValueError, r"scale_dtype must be one of .* got torch.float64"),
))
def test_config_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        QuantConfig(**kwargs)


@pytest.mark.parametrize("k", (0, -3, 2.5))
def test_k_not_positive(k):
    with pytest.raises(ValueError, match=rf"K must be a positive integer, got {k}"):
        QuantConfig(group_size=32).groups(k)


# --------------------------------------------------------------------------- quantize_weight

def test_weight_type_shape_dtype_device():
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor, got list"):
        quantize_weight([[1.0] * 32])
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor, got ndarray"):
        quantize_weight(np.zeros((2, 32), dtype=np.float32))
    with pytest.raises(ValueError, match=r"weight must be 2-D \[N, K\] .* got shape \(64,\)"):
        quantize_weight(torch.randn(64), group_size=32)
    with pytest.raises(ValueError, match=r"weight must be 2-D .* got shape \(2, 2, 32\)"):
        quantize_weight(torch.randn(2, 2, 32), group_size=32)
    for dt in (torch.int32, torch.uint8, torch.bool, torch.complex64):
        with pytest.raises(TypeError, match=rf"weight must be a floating-point tensor, got dtype {dt}"):
            quantize_weight(torch.zeros(2, 32, dtype=dt), group_size=32)
    with pytest.raises(ValueError, match=r"weight is on the meta device"):
        quantize_weight(torch.empty(2, 32, device="meta"), group_size=32)


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), float("-inf")))
def test_weight_non_finite(bad):
    """Documented behaviour: NaN/Inf weights are rejected, naming the value and its first position."""
    w = torch.randn(4, 64)
    w[2, 37] = bad
    w[3, 1] = bad
    before = w.clone()
    with pytest.raises(ValueError, match=rf"weight has a non-finite value \({bad}\) at \[2, 37\]: "
                                         r"NaN/Inf cannot be block-quantized"):
        quantize_weight(w, group_size=32)
    assert torch.equal(w.isnan(), before.isnan()) and torch.equal(w.nan_to_num(), before.nan_to_num())


def test_weight_scale_overflow():
    w = torch.zeros(1, 32)
    w[0, 0] = 1e6  # 1e6 / 7 > fp16 max
    with pytest.raises(ValueError, match=r"does not fit in torch.float16: weights too large for this scale"):
        quantize_weight(w, bits=4, group_size=32)
    assert quantize_weight(w, bits=4, group_size=32, scale_dtype=torch.float32).scales.dtype == torch.float32


def test_bad_config_keyword():
    with pytest.raises(ValueError, match=r"bits must be 4 or 8, got 2"):
        quantize_weight(torch.randn(2, 32), QuantConfig(group_size=32), bits=2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'group'"):
        quantize_weight(torch.randn(2, 32), group=32)


# --------------------------------------------------------------------------- packing, from_codes

def test_pack_unpack_errors():
    with pytest.raises(TypeError, match=r"codes must be uint8, got torch.int32"):
        pack_codes(torch.zeros(2, 4, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match=r"bits must be 4 or 8, got 2"):
        pack_codes(torch.zeros(2, 4, dtype=torch.uint8), 2)
    with pytest.raises(TypeError, match=r"packed weight must be uint8, got torch.int8"):
        unpack_codes(torch.zeros(2, 4, dtype=torch.int8), 4, 8)
    with pytest.raises(ValueError, match=r"packed width 4 does not hold K=10 codes of 4 bits \(expected 5 bytes"):
        unpack_codes(torch.zeros(2, 4, dtype=torch.uint8), 4, 10)
    with pytest.raises(ValueError, match=r"packed width 4 does not hold K=9 codes of 4 bits \(expected 5 bytes"):
        unpack_codes(torch.zeros(2, 4, dtype=torch.uint8), 4, 9)


def test_from_codes_errors():
    cfg = QuantConfig(bits=4, group_size=32)
    codes = torch.zeros(2, 64, dtype=torch.uint8)
    s = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"codes must be 2-D \[N, K\], got shape \(64,\)"):
        from_codes(codes[0], s, cfg)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 2\), got \(2, 1\)"):
        from_codes(codes, torch.ones(2, 1), cfg)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 2\), got \(2, 1\)"):  # K = 48: 1.5 groups
        from_codes(torch.zeros(2, 48, dtype=torch.uint8), torch.ones(2, 1), cfg)
    with pytest.raises(ValueError, match=r"codes exceed the 4-bit range \[0, 15\]"):
        from_codes(codes + 16, s, cfg)
    with pytest.raises(ValueError, match=r"codes exceed the 4-bit range \[0, 15\]"):
        from_codes(torch.full((2, 64), -1, dtype=torch.int64), s, cfg)  # would wrap to 255 silently
    with pytest.raises(TypeError, match=r"codes must be an integer tensor, got dtype torch.float32"):
        from_codes(torch.full((2, 64), 3.7), s, cfg)  # would be truncated silently
    zp = QuantConfig(bits=4, group_size=32, mode="zero_point")
    with pytest.raises(ValueError, match=r"mode 'zero_point' needs zeros of shape \(2, 2\)"):
        from_codes(codes, s, zp)
    with pytest.raises(ValueError, match=r"mode 'zero_point' needs zeros of shape \(2, 2\)"):
        from_codes(codes, s, zp, zeros=torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"zeros exceed the 4-bit code range \[0, 15\]"):
        from_codes(codes, s, zp, zeros=torch.full((2, 2), 99))
    with pytest.raises(ValueError, match=r"mode 'offset' needs offsets of shape \(2, 2\)"):
        from_codes(codes, s, QuantConfig(bits=4, group_size=32, mode="offset"))


def test_offset_has_no_zero_point():
    w = quantize_weight(torch.randn(2, 32), bits=4, group_size=32, mode="offset")
    with pytest.raises(ValueError, match=r"mode 'offset' has no integer zero point"):
        w.zero_points()


# --------------------------------------------------------------------------- matmul (public op and reference)

MATMULS = pytest.mark.parametrize("mm", (mixgemm.matmul, reference.matmul), ids=("op", "reference"))


@MATMULS
def test_matmul_type_errors(mm, qw):
    x = torch.randn(3, 64)
    with pytest.raises(TypeError, match=r"qweight must be a mixgemm QuantizedWeight, got Tensor"):
        mm(x, torch.randn(8, 64))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got ndarray"):
        mm(x.numpy(), qw)
    for dt in (torch.int32, torch.int8, torch.bool):
        with pytest.raises(TypeError, match=rf"x has dtype {dt}; supported activation dtypes are"):
            mm(x.to(dt), qw)


def test_op_rejects_float64(qw):
    with pytest.raises(TypeError, match=r"x has dtype torch.float64; supported activation dtypes are"):
        mixgemm.matmul(torch.randn(3, 64, dtype=torch.float64), qw)


@MATMULS
def test_matmul_shape_mismatch(mm, qw):
    with pytest.raises(ValueError, match=r"shape mismatch: x has shape \(3, 65\) \(last dim 65\) but the "
                                         r"weight expects K=64 input features "
                                         r"\(weight shape \[N, K\] = \[8, 64\]\)"):
        mm(torch.randn(3, 65), qw)
    with pytest.raises(ValueError, match=r"shape mismatch: x has shape \(\) \(last dim None\)"):
        mm(torch.tensor(1.0), qw)


@MATMULS
def test_matmul_device_mismatch(mm, qw):
    with pytest.raises(ValueError, match=r"device mismatch: x is on meta but the weight is on cpu"):
        mm(torch.empty(3, 64, device="meta"), qw)
    with pytest.raises(ValueError, match=r"device mismatch: bias is on meta but x is on cpu"):
        mm(torch.randn(3, 64), qw, torch.empty(8, device="meta"))


@MATMULS
def test_matmul_bias_errors(mm, qw):
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\), got \(1, 8\)"):
        mm(x, qw, torch.randn(1, 8))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\), got \(7,\)"):
        mm(x, qw, torch.randn(7))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\), got list"):
        mm(x, qw, [0.0] * 8)
    with pytest.raises(TypeError, match=r"bias must be floating point, got torch.int64"):
        mm(x, qw, torch.zeros(8, dtype=torch.int64))


@MATMULS
@pytest.mark.parametrize("act", ("gelu", "ReLU", 1, "silu"))
def test_matmul_bad_activation(mm, qw, act):
    with pytest.raises(ValueError, match=r"activation must be None, 'relu' or 'relu6', got"):
        mm(torch.randn(3, 64), qw, activation=act)


def test_clamp_bounds_unhashable():
    with pytest.raises(ValueError, match=r"activation must be None, 'relu' or 'relu6', got \['relu'\]"):
        clamp_bounds(["relu"])


# --------------------------------------------------------------------------- activations, block GEMM

def test_quantize_activation_errors():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError,
                       match=r"activation quantization mode must be one of \('sym', 'asym', 'sym_full'\), got 'int8'"):
        quantize_activation(x, 32, "int8")
    with pytest.raises(ValueError, match=r"activations must be 2-D \[M, K\], got shape \(64,\)"):
        quantize_activation(x[0], 32)
    with pytest.raises(TypeError, match=r"activations must be floating point, got torch.int64"):
        quantize_activation(x.long(), 32)
    with pytest.raises(ValueError, match=r"K=64 is not divisible by the activation block size 48"):
        quantize_activation(x, 48)
    for b in (0, -2, 32.0, True):  # used to crash with ZeroDivisionError / a reshape error
        with pytest.raises(ValueError, match=r"activation block size must be a positive integer or -1"):
            quantize_activation(x, b)


def test_block_int_gemm_errors(qw):
    with pytest.raises(ValueError, match=r"shape mismatch: activations have K=96, weight has K=64"):
        block_int_gemm(quantize_activation(torch.randn(2, 96), 32), qw)
    with pytest.raises(ValueError, match=r"activation block size 16 must be a multiple of the weight group size 32"):
        block_int_gemm(quantize_activation(torch.randn(2, 64), 16), qw)
    block_int_gemm(quantize_activation(torch.randn(2, 64), 64), qw)  # per-token over groups of 32: regrouped


# --------------------------------------------------------------------------- conv

def test_conv_errors():
    w = torch.randn(8, 64, 3, 3)
    with pytest.raises(ValueError,
                       match=r"conv weight must be 4-D \[Co, Ci/groups, Kh, Kw\], got shape \(8, 64\)"):
        quantize_conv_weight(w[:, :, 0, 0])
    with pytest.raises(ValueError, match=r"group_size=128 must divide the input channels per group \(64\)"):
        quantize_conv_weight(w, group_size=128)
    qcw = quantize_conv_weight(w, group_size=32)
    x = torch.randn(1, 64, 8, 8)
    with pytest.raises(TypeError, match=r"qweight must be a QuantizedConvWeight, got QuantizedWeight"):
        reference.conv2d(x, qcw.matrix)
    with pytest.raises(ValueError, match=r"conv2d input must be 4-D \[B, C, H, W\], got shape \(64, 8, 8\)"):
        reference.conv2d(x[0], qcw)
    with pytest.raises(ValueError,
                       match=r"shape mismatch: input has 32 channels, the weight expects 64 x groups=1"):
        reference.conv2d(x[:, :32], qcw)
    with pytest.raises(ValueError, match=r"out_channels=8 is not divisible by groups=3"):
        reference.conv2d(torch.randn(1, 192, 8, 8), qcw, groups=3)
    with pytest.raises(ValueError, match=r"activation must be None, 'relu' or 'relu6', got 'tanh'"):
        mixgemm.conv2d(x, qcw, activation="tanh")


# --------------------------------------------------------------------------- ggml

def test_ggml_quantize_errors():
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    with pytest.raises(ValueError, match=r"unsupported ggml block type 'q4_k': expected one of"):
        ggml.quantize(x, "q4_k")
    with pytest.raises(ValueError, match=r"unsupported ggml block type 3"):
        ggml.quantize(x, 3)
    with pytest.raises(ValueError,
                       match=r"K=48 \(the last dimension\) is not divisible by the ggml block size 32"):
        ggml.quantize(x[:, :48], "q8_0")
    with pytest.raises(TypeError, match=r"x must be floating point, got dtype int64"):
        ggml.quantize(x.astype(np.int64), "q8_0")
    with pytest.raises(TypeError, match=r"x must be floating point, got dtype torch.int32"):
        ggml.quantize(torch.zeros(2, 64, dtype=torch.int32), "q8_0")
    with pytest.raises(ValueError, match=r"x is on the meta device"):
        ggml.quantize(torch.empty(2, 64, device="meta"), "q8_0")
    with pytest.raises(TypeError, match=r"x must be a numpy array or torch tensor, got list"):
        ggml.quantize([0.0] * 32, "q8_0")
    with pytest.raises(ValueError, match=r"x must have at least one dimension"):
        ggml.quantize(np.array(1.0, dtype=np.float32), "q8_0")
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1, 5] = bad
        with pytest.raises(ValueError, match=rf"x has a non-finite value \({bad}\) at \[1, 5\]: NaN/Inf"):
            ggml.quantize(y, "q4_0")


def test_ggml_dequantize_errors():
    raw = ggml.quantize(np.ones((2, 64), dtype=np.float32), "q4_0")
    with pytest.raises(ValueError, match=r"q4_0 bytes do not match shape \(2, 96\): expected 108 bytes "
                                         r"\(6 blocks of 18\), got 72"):
        ggml.dequantize(raw, "q4_0", (2, 96))
    with pytest.raises(ValueError, match=r"K \(the last dimension\) must be a positive multiple of 32"):
        ggml.dequantize(raw, "q4_0", (4, 16))
    with pytest.raises(TypeError, match=r"raw must hold uint8 bytes, got dtype int8"):
        ggml.dequantize(raw.view(np.int8), "q4_0", (2, 64))
    with pytest.raises(TypeError, match=r"raw must be a numpy array or torch tensor of uint8 bytes, got"):
        ggml.dequantize(raw.tobytes(), "q4_0", (2, 64))


def test_ggml_vec_dot_errors():
    w = ggml.quantize(np.ones((2, 64), dtype=np.float32), "q4_0")
    a = ggml.quantize(np.ones((3, 64), dtype=np.float32), "q8_0")
    with pytest.raises(ValueError, match=r"no ggml dot product for q4_0 x q4_0"):
        ggml.vec_dot(w, "q4_0", w, "q4_0")
    with pytest.raises(ValueError, match=r"no ggml dot product for q8_0 x q4_0"):
        ggml.vec_dot(a, "q8_0", w, "q4_0")  # arguments swapped
    with pytest.raises(ValueError, match=r"shape mismatch: x rows hold K=64 elements, y rows hold K=32"):
        ggml.vec_dot(w, "q4_0", a[:, :34], "q8_0")
    with pytest.raises(ValueError, match=r"q8_0 rows must be a whole number of 34-byte blocks, got a last "
                                         r"dimension of 36 bytes"):
        ggml.vec_dot(w, "q4_0", w, "q8_0")
    with pytest.raises(ValueError, match=r"rows must be 1-D or 2-D byte arrays"):
        ggml.vec_dot(w[None], "q4_0", a, "q8_0")
