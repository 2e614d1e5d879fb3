"""Activation-quantized int8 path: fused activation quantizer, W8A8 / W4A8 GEMM, static INT8 GEMM.

On a machine without CUDA the kernel tests run the Triton kernels under the interpreter (TRITON_INTERPRET=1,
set below before the kernel modules are imported; no bf16 there); the reference / error tests always run.
GPU tests (marked gpu) run the compiled kernels, bf16 and the TMA / inline-asm variants included.
"""

from __future__ import annotations

import os

import pytest
import torch

from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.weight import quantize_weight
from mixgemm.reference import int8_static as sref
from mixgemm.reference.block_gemm import block_int_gemm, block_int_gemm_parts

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_kernel = pytest.mark.skipif(not INTERP, reason="CPU kernel tests run under TRITON_INTERPRET=1 (no CUDA here)")


def _rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ layout


def test_half_split_roundtrip():
    from mixgemm.kernels.triton_a8.layout import half_split_pack, half_split_unpack

    g = _gen(1)
    for h in (32, 64):
        c = torch.randint(-8, 8, (5, 4 * h), generator=g).to(torch.int8)
        assert torch.equal(half_split_unpack(half_split_pack(c, h), h), c)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_layout_represents_weight(bits, mode):
    """c * s + m of the layout equals the plain dequantized weight (float64), and csum is exact."""
    from mixgemm.formats.weight import dequantize_weight
    from mixgemm.kernels.triton_a8.layout import build_int8_layout, half_split_unpack

    w = torch.randn(24, 256, generator=_gen(2)) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=64, mode=mode)
    lay = build_int8_layout(qw)
    c = lay.codes if bits == 8 else half_split_unpack(lay.codes, lay.half)
    s = lay.scales.double().T.repeat_interleave(64, 1)
    m = lay.moff.double().T.repeat_interleave(64, 1)
    wd = c.double() * s + m
    assert _rel(wd, dequantize_weight(qw, torch.float64)) < 1e-7
    assert torch.equal(lay.csum, c.to(torch.int32).reshape(24, 4, 64).sum(-1, dtype=torch.int32))
    assert qw.qweight.dtype == torch.uint8  # the plain weight was not modified


# ------------------------------------------------------------------ activation quantizer


@needs_kernel
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("m,k,b", [(3, 256, 32), (2, 512, 64), (5, 512, 128), (3, 1024, 256), (2, 96, -1),
                                   (1, 5000, -1)])
def test_act_quant_exact(mode, m, k, b):
    from mixgemm.kernels.triton.act_quant import act_quant

    for dt in (torch.float16, torch.float32):
        x = (torch.randn(m, k, generator=_gen(3)) * 3).to(dt)
        x[0, : min(k, 32)] = 0.5  # a constant block (asym: s = 1, o = max)
        if m > 1:
            x[1, : min(k, 64)] = 0.0  # an all-zero block (sym: d = 0)
        x_copy = x.clone()
        r = quantize_activation(x, b, mode)
        q, s, o, sm = act_quant(x, b, mode)
        assert torch.equal(x, x_copy)
        assert torch.equal(q, r.q)
        assert torch.equal(sm, r.sums)
        assert torch.equal(s, r.scales)
        assert torch.equal(o, r.offsets)


def test_act_quant_bad_input():
    from mixgemm.kernels.triton.act_quant import act_quant

    with pytest.raises(ValueError, match="mode"):
        act_quant(torch.zeros(2, 64), 32, "nope")
    with pytest.raises(ValueError, match="divisible"):
        act_quant(torch.zeros(2, 96), 64, "sym")
    with pytest.raises(TypeError, match="fp16"):
        act_quant(torch.zeros(2, 64, dtype=torch.int32), 32, "sym")


# ------------------------------------------------------------------ W8A8 / W4A8 GEMM


def _case(bits, gs, mode, m, n, k, seed=0):
    g = _gen(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g) * 0.1
    return x, quantize_weight(w, bits=bits, group_size=gs, mode=mode), bias


@needs_kernel
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("gs", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act_mode", ["sym", "asym"])
def test_a8_gemm_matches_block_reference(bits, gs, mode, act_mode):
    from mixgemm.ops.int8 import matmul_a8

    m, n, k = (3, 40, 512) if gs != 32 else (17, 33, 256)
    x, qw, bias = _case(bits, gs, mode, m, n, k)
    ref = block_int_gemm(quantize_activation(x, qw.group_size, act_mode), qw) + bias.double()
    y = matmul_a8(x, qw, act_mode=act_mode, bias=bias, out_dtype=torch.float32, force_kernel=True)
    assert _rel(y, ref) < 1e-5
    y16 = matmul_a8(x, qw, act_mode=act_mode, bias=bias, out_dtype=torch.float16, force_kernel=True)
    assert y16.dtype == torch.float16 and _rel(y16, ref) < 1e-3


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 17, 129])
@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
def test_a8_gemm_odd_shapes_and_epilogue(m, activation):
    """Odd N and K not a multiple of the tile (per-channel int8: K = 200), M across the tile regimes."""
    from mixgemm.ops.int8 import matmul_a8

    x, qw, bias = _case(8, -1, "sym", m, 37, 200, seed=m)
    x = x * 40  # outputs beyond 6 so relu6 clamps
    lo, hi = {None: (-1e30, 1e30), "relu": (0, 1e30), "relu6": (0, 6)}[activation]
    ref = (block_int_gemm(quantize_activation(x, -1, "sym"), qw) + bias.double()).clamp(lo, hi)
    y = matmul_a8(x, qw, act_mode="sym", bias=bias, activation=activation, out_dtype=torch.float32,
                  force_kernel=True)
    assert _rel(y, ref) < 1e-5


@needs_kernel
def test_a8_integer_parts_exact():
    """The kernel's int32 block products equal the integer reference exactly: with unit scales and zero
    offsets the fp32 output is the integer sum itself (|sum| < 2**24 is exact in fp32)."""
    from mixgemm.kernels.triton_a8.int8_gemm import a8_gemm
    from mixgemm.kernels.triton_a8.layout import build_int8_layout

    for bits in (8, 4):
        x, qw, _ = _case(bits, 64, "sym", 5, 24, 256, seed=7)
        a = quantize_activation(x, 64, "sym")
        lay = build_int8_layout(qw)
        one = torch.ones_like(lay.scales)
        lay1 = type(lay)(**{**lay.__dict__, "scales": one, "dot_scales": one / (16 if bits == 4 else 1)})
        y = a8_gemm(a.q, torch.ones_like(a.scales), a.offsets, a.sums, lay1, False, None,
                    float("-inf"), float("inf"), torch.float32)
        cq, _ = block_int_gemm_parts(a, qw)  # codes-based: unsigned weights; convert to the signed form
        bias = qw.config.sym_bias
        signed = cq - bias * a.sums.to(torch.int64).T[:, :, None]
        assert torch.equal(y.to(torch.int64), signed.sum(0))


@needs_kernel
@pytest.mark.parametrize("bits,gs,mode", [(4, 128, "sym"), (4, 32, "zero_point"), (8, 64, "offset"), (8, 256, "sym")])
@pytest.mark.parametrize("act_mode", ["sym", "asym"])
@pytest.mark.parametrize("m", [3, 17])
def test_a8_gemm_per_token_activations(bits, gs, mode, act_mode, m):
    """act_block "token" on the Triton kernel: per-token activation parameters described per weight group."""
    from mixgemm.ops.int8 import matmul_a8

    x, qw, bias = _case(bits, gs, mode, m, 40, 512, seed=gs + m)
    x = x * torch.linspace(0.2, 4, 512)  # uneven column ranges: per-token and per-group scales differ
    ref = block_int_gemm(quantize_activation(x, -1, act_mode), qw) + bias.double()
    y = matmul_a8(x, qw, act_mode=act_mode, bias=bias, out_dtype=torch.float32, force_kernel=True,
                  act_block="token")
    assert _rel(y, ref) < 1e-5
    per_group = block_int_gemm(quantize_activation(x, qw.group_size, act_mode), qw) + bias.double()
    assert _rel(y, per_group) > 1e-4  # the option is not ignored


def test_per_token_reference_regroups():
    """The block reference over per-token activations equals the float64 product of the dequantized operands
    (regroup keeps the values: scales repeated, sums per weight group)."""
    from mixgemm.formats.weight import dequantize_weight

    x, qw, _ = _case(4, 64, "offset", 5, 12, 256, seed=3)
    a = quantize_activation(x, -1, "asym")
    r = a.regroup(64)
    assert r.block_size == 64 and r.scales.shape == (5, 4) and torch.equal(r.q, a.q)
    assert torch.equal(r.sums.sum(1), a.sums[:, 0])
    assert torch.allclose(r.dequantize(), a.dequantize(), rtol=0, atol=0)
    ref = a.dequantize() @ dequantize_weight(qw, torch.float64).T
    assert _rel(block_int_gemm(a, qw), ref) < 1e-12
    with pytest.raises(ValueError, match="regroup"):
        quantize_activation(x, 64, "sym").regroup(48)
    with pytest.raises(ValueError, match="multiple of the weight group"):
        block_int_gemm(quantize_activation(x, 32, "sym"), qw)


def test_a8_cpu_fallback_and_errors():
    from mixgemm.ops.int8 import matmul_a8

    x, qw, bias = _case(4, 128, "sym", 2, 16, 256)
    y = matmul_a8(x, qw, act_mode="asym", bias=bias)  # CPU: the float64 reference path
    ref = block_int_gemm(quantize_activation(x, 128, "asym"), qw) + bias.double()
    assert _rel(y, ref) < 1e-6
    with pytest.raises(ValueError, match="act_mode"):
        matmul_a8(x, qw, act_mode="int4")
    with pytest.raises(ValueError, match="act_block"):
        matmul_a8(x, qw, act_block="channel")
    y = matmul_a8(x, qw, act_mode="sym", bias=bias, act_block="token")
    ref = block_int_gemm(quantize_activation(x, -1, "sym"), qw) + bias.double()
    assert _rel(y, ref) < 1e-6
    with pytest.raises(ValueError, match="shape mismatch"):
        matmul_a8(x[:, :128], qw)
    with pytest.raises(ValueError, match="activation"):
        matmul_a8(x, qw, activation="gelu")


# ------------------------------------------------------------------ static INT8 GEMM


def _static_case(m, n, k, seed, per_channel=True):
    g = _gen(seed)
    xq = torch.randint(-128, 128, (m, k), generator=g).to(torch.int8)
    wq = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    ws = (torch.rand(n, generator=g) * 0.01 + 0.001) if per_channel else 0.004
    bias = torch.randn(n, generator=g)
    return xq, wq, ws, bias


def test_static_reference_close_to_float64():
    xq, wq, ws, bias = _static_case(7, 19, 96, 0)
    args = dict(w_scale=ws, x_scale=0.05, x_zero=3, out_scale=0.8, out_zero=-5)
    y = sref.int8_static_gemm(xq, wq, bias=bias, **args)
    f = sref.int8_static_gemm_float64(xq, wq, bias=bias, **args).clamp(-128, 127)
    # requantization: rint of a float32 product of an int32 sum + the rounded bias: within 1 of the real value
    assert float((y.double() - f).abs().max()) <= 1.0
    assert float((y.double() - f.round()).abs().gt(0).double().mean()) < 0.05


@needs_kernel
@pytest.mark.parametrize("m,n,k", [(1, 33, 64), (17, 40, 200), (129, 24, 128)])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
def test_static_kernel_exact(m, n, k, per_channel, activation):
    from mixgemm.ops.int8 import int8_static_gemm

    xq, wq, ws, bias = _static_case(m, n, k, m + n, per_channel)
    args = dict(w_scale=ws, x_scale=0.05, x_zero=-7, out_scale=0.5, out_zero=4, bias=bias, activation=activation)
    ref = sref.int8_static_gemm(xq, wq, **args)
    y = int8_static_gemm(xq, wq, force_kernel=True, **args)
    assert y.dtype == torch.int8
    assert torch.equal(y, ref)
    assert int(ref.min()) < int(ref.max())  # not a degenerate all-clamped case


def test_static_errors():
    from mixgemm.ops.int8 import int8_static_gemm

    xq, wq, ws, bias = _static_case(2, 8, 32, 0)
    with pytest.raises(TypeError, match="int8"):
        int8_static_gemm(xq.float(), wq, ws, 0.1, 0, 0.1, 0)
    with pytest.raises(ValueError, match="w_scale"):
        int8_static_gemm(xq, wq, torch.ones(3), 0.1, 0, 0.1, 0)
    with pytest.raises(ValueError, match="x_zero"):
        int8_static_gemm(xq, wq, ws, 0.1, 300, 0.1, 0)


# ------------------------------------------------------------------ GPU


def _cuda_case(bits, gs, mode, m, n, k, dt, seed=0):
    x, qw, bias = _case(bits, gs, mode, m, n, k, seed)
    return x.to("cuda", dt), qw.to("cuda"), bias.to("cuda", dt)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("b", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_act_quant_exact(mode, b, dt):
    from mixgemm.kernels.triton.act_quant import act_quant

    for m, k in ((1, 4096), (129, 1280), (7, 28672), (3, 40000)):
        if b != -1 and k % b:
            continue
        x = (torch.randn(m, k, generator=_gen(m)) * 2).to("cuda", dt)
        # the reference runs on the CPU: torch's CUDA division by a scalar multiplies by its reciprocal,
        # so quantize_activation on a CUDA tensor is not bit-identical to the CPU (IEEE) one
        r = quantize_activation(x.cpu(), b, mode)
        q, s, o, sm = (t.cpu() for t in act_quant(x, b, mode))
        assert torch.equal(q, r.q) and torch.equal(sm, r.sums)
        assert torch.equal(s, r.scales) and torch.equal(o, r.offsets)


def _f64_ref(x, qw, act_mode, bias, act_block=None):
    """float64 GEMM of the same quantized operands (dequantized activations x dequantized weights); act_block:
    the activation block (default: the weight group; -1: per token)."""
    from mixgemm.formats.weight import dequantize_weight

    a = quantize_activation(x, qw.group_size if act_block is None else act_block, act_mode).dequantize()
    return a @ dequantize_weight(qw, torch.float64).T + bias.double()


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("gs", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act_mode", ["sym", "asym"])
@pytest.mark.parametrize("m", [1, 40, 300])  # (40: per-block activation scales on the CUDA int8 GEMM from M = 17)
def test_gpu_a8_gemm(bits, gs, mode, act_mode, m):
    from mixgemm.ops.int8 import matmul_a8

    n, k = 520, 1024
    dts = ((torch.float16, 1e-3), (torch.bfloat16, 1e-2)) if gs in (128, -1) else ((torch.float16, 1e-3),)
    for dt, tol in dts:
        x, qw, bias = _cuda_case(bits, gs, mode, m, n, k, dt, seed=m)
        ref = _f64_ref(x, qw, act_mode, bias).clamp(min=0)
        y = matmul_a8(x, qw, act_mode=act_mode, bias=bias, activation="relu")
        assert y.dtype == dt
        assert _rel(y, ref) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs,mode", [(4, 128, "sym"), (4, 256, "sym"), (8, 128, "sym"), (4, 64, "zero_point"),
                                          (8, 32, "offset")])
@pytest.mark.parametrize("act_mode", ["sym", "asym"])
@pytest.mark.parametrize("m", [1, 2, 3, 17, 129, 300])
def test_gpu_a8_per_token(bits, gs, mode, act_mode, m):
    """matmul_a8(act_block="token") on every CUDA path: the GEMV (M <= 2), the Triton kernel (asym, small M, other
    groups), the int8 wgmma GEMM (sym x sym group 128 / 256, M >= 128), fp16 and bf16."""
    from mixgemm.ops.int8 import matmul_a8

    n, k = 520, 1024
    for dt, tol in ((torch.float16, 1e-3), (torch.bfloat16, 1e-2)):
        x, qw, bias = _cuda_case(bits, gs, mode, m, n, k, dt, seed=m + gs)
        x0 = x.clone()
        ref = _f64_ref(x, qw, act_mode, bias, act_block=-1)
        y = matmul_a8(x, qw, act_mode=act_mode, bias=bias, act_block="token")
        assert torch.equal(x, x0) and y.dtype == dt
        assert _rel(y, ref) < tol, (_rel(y, ref), dt)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("k,n", [(8192, 1000), (4096, 384)])
@pytest.mark.parametrize("m", [1, 16, 64, 2048])
def test_gpu_a8_default_tiles(bits, k, n, m):
    """The shapes / M regimes the benchmark times, with their default tile configs (per-channel W8,
    group-128 W4, fp16 out)."""
    from mixgemm.ops.int8 import matmul_a8

    gs = -1 if bits == 8 else 128
    x, qw, bias = _cuda_case(bits, gs, "sym", m, n, k, torch.float16, seed=k + m)
    ref = _f64_ref(x, qw, "sym", bias)
    y = matmul_a8(x, qw, act_mode="sym", bias=bias)
    assert _rel(y, ref) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 300, 2048])
def test_gpu_static_exact(m):
    from mixgemm.ops.int8 import int8_static_gemm

    xq, wq, ws, bias = _static_case(m, 1000, 1024, m)
    args = dict(w_scale=ws * 0.05, x_scale=0.02, x_zero=5, out_scale=0.3, out_zero=-3, bias=bias)
    ref = sref.int8_static_gemm(xq, wq, **args)
    y = int8_static_gemm(xq.cuda(), wq.cuda(), **args).cpu()
    assert int((y.int() - ref.int()).abs().max()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("gs", [32, 128, -1])
# the TMA kernels serve large M only: M = 1 runs the inline-asm variant alone
@pytest.mark.parametrize("variant,m", [("asm", 1), ("asm", 300), ("tma_asm", 300), ("tma_lag", 300)])
def test_gpu_a8_int4_variants(gs, m, variant):
    """Tile-config variants the benchmark may pick: inline-asm nibble unpack, TMA grouped kernel (+LAG)."""
    from mixgemm.ops.int8 import matmul_a8

    n, k = 520, 1024
    x, qw, bias = _cuda_case(4, gs, "sym", m, n, k, torch.float16, seed=3)
    bk = 64 if gs == 32 else 128
    cfg = dict(BM=16 if m == 1 else 64, BN=64, BK=bk, GROUP_M=1, num_warps=4, num_stages=3)
    if m == 1:
        cfg["SPLIT_K"] = 4
    cfg["ASM"] = variant != "tma_lag"
    cfg["TMA"] = variant.startswith("tma")
    cfg["LAG"] = variant == "tma_lag"
    ref = _f64_ref(x, qw, "sym", bias)
    y = matmul_a8(x, qw, act_mode="sym", bias=bias, config=cfg)
    assert _rel(y, ref) < 1e-3
