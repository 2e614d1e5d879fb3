"""The CPU path of mixgemm.matmul (mixgemm.kernels.cpu): torch's int4 / int8 kernels on bfloat16 activations, the
blockwise dequantizing fallback otherwise, both against the float64 reference on the same quantized weights."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import mixgemm
import mixgemm.reference as ref
from mixgemm.formats.weight import QuantConfig, quantize_weight
from mixgemm.kernels.cpu import cpu_can_run, cpu_linear, dequant_linear

# norm-wise relative error against the float64 reference, by activation dtype: bfloat16 output rounding (and
# int4 scales rounded to bfloat16) for the kernels; float32 / float16 rounding of the dequantizing GEMM
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float32: 1e-5}


def _problem(n, k, m, bits, group, mode, dtype, gen, scale_dtype=torch.float16, bias=True):
    w = torch.randn(n, k, generator=gen) * 0.05 + 0.01  # nonzero mean: asymmetric groups
    qw = quantize_weight(w, QuantConfig(bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype))
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, qw, b


def _check(y, x, qw, b, activation, rel_err):
    want = ref.matmul(x, qw, b, activation, out_dtype=torch.float64)
    assert y.dtype == x.dtype and y.shape == want.shape
    if want.numel():
        assert rel_err(y, want) < TOL[x.dtype]
        # every element too, relative to the output's scale (a norm can hide a few wrong columns)
        assert float((y.double() - want).abs().max()) <= 4 * TOL[x.dtype] * float(want.abs().max()) + 1e-6


@pytest.mark.parametrize("group", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_int4_kernel_matches_reference(group, mode, torch_gen, rel_err):
    x, qw, b = _problem(48, 512, 5, 4, group, mode, torch.bfloat16, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert ok, why
    assert "int4" in why
    _check(cpu_linear(x, qw, b, None), x, qw, b, None, rel_err)


@pytest.mark.parametrize("group,mode", [(-1, "sym"), (-1, "zero_point"), (-1, "offset"), (32, "sym"),
                                        (128, "zero_point"), (256, "offset")])
@pytest.mark.parametrize("n", [37, 48])
def test_int8_kernel_matches_reference(group, mode, n, torch_gen, rel_err):
    x, qw, b = _problem(n, 256, 3, 8, group, mode, torch.bfloat16, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert ok, why
    # one group (per-channel, or group = K): the int8 kernel; several: the nibble split through the int4 kernel
    # (N % 16 == 0) or the int8 kernel once per group
    want = "_weight_int8pack_mm, bfloat16" if qw.num_groups == 1 else "nibbles" if n % 16 == 0 else "one per group"
    assert want in why
    _check(cpu_linear(x, qw, b, "relu"), x, qw, b, "relu", rel_err)


@pytest.mark.parametrize("n,group", [(48, 32), (37, 32), (48, -1)])  # nibbles, int8 per group, int8 per channel
@pytest.mark.parametrize("mode", ["offset", "zero_point"])
def test_int8_kernels_on_5_bit_codes_are_as_accurate_as_on_8_bit_ones(n, group, mode, torch_gen, rel_err):
    """GGUF Q5_1 / Q5_K weights are 8-bit codes in [0, 31] (offset mode, w = q d + m): the kernels centre the codes
    on their range, so neither the bfloat16 output nor the bfloat16 scales carry a 128 s term the offsets cancel."""
    from mixgemm.formats.weight import from_codes

    k = 256
    ng = 1 if group == -1 else k // group
    codes = torch.randint(0, 32, (n, k), generator=torch_gen).to(torch.uint8)
    d = (torch.rand(n, ng, generator=torch_gen) * 3e-3 + 1e-3).to(torch.float16)
    cfg = QuantConfig(bits=8, group_size=group, mode=mode, scale_dtype=torch.float16)
    if mode == "offset":
        m = (-(torch.rand(n, ng, generator=torch_gen) * 16 + 8) * d.float()).to(torch.float16)
        qw = from_codes(codes, d, cfg, offsets=m)
    else:
        qw = from_codes(codes, d, cfg, zeros=torch.randint(8, 24, (n, ng), generator=torch_gen).to(torch.uint8))
    x = torch.randn(5, k, generator=torch_gen).to(torch.bfloat16)
    b = torch.randn(n, generator=torch_gen).to(torch.bfloat16) * 0.01
    assert cpu_can_run(x, qw)[0]
    y = cpu_linear(x, qw, b, None)
    want = ref.matmul(x, qw, b, None, out_dtype=torch.float64)
    assert rel_err(y, want) < 6e-3


@pytest.mark.parametrize("m", [0, 1, 3, 17, 129])
@pytest.mark.parametrize("bits,group", [(4, 128), (8, -1), (8, 64)])
def test_kernel_rows(m, bits, group, torch_gen, rel_err):
    x, qw, b = _problem(64, 256, m, bits, group, "sym", torch.bfloat16, torch_gen)
    y = mixgemm.matmul(x.reshape(1, m, 256) if m else x, qw, b, "relu6")
    _check(y.reshape(m, 64), x, qw, b, "relu6", rel_err)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_int4_kernel_scale_dtypes(scale_dtype, torch_gen, rel_err):
    x, qw, b = _problem(32, 256, 4, 4, 64, "offset", torch.bfloat16, torch_gen, scale_dtype=scale_dtype)
    _check(cpu_linear(x, qw, b, None), x, qw, b, None, rel_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits,group,mode", [(4, 32, "zero_point"), (4, -1, "offset"), (8, 64, "sym"),
                                             (8, -1, "zero_point")])
def test_matmul_any_dtype_odd_shapes(dtype, bits, group, mode, torch_gen, rel_err):
    """N odd (no int4 kernel), K = 3 groups or K = 90 per-channel (no int8 kernel): whichever route takes it."""
    k = 3 * group if group != -1 else 90
    x, qw, b = _problem(47, k, 17, bits, group, mode, dtype, torch_gen)
    _check(mixgemm.matmul(x, qw, b, "relu"), x, qw, b, "relu", rel_err)


def test_dequant_fallback_blocks(torch_gen, rel_err, monkeypatch):
    """Several output-channel blocks (a block size that does not divide N) give the result of one block (up to
    float32 summation order: the GEMM's blocking depends on the width)."""
    import mixgemm.kernels.cpu.dequant as dq

    x, qw, b = _problem(50, 128, 3, 4, 32, "zero_point", torch.float32, torch_gen)
    whole = dequant_linear(x, qw, b, None)
    monkeypatch.setattr(dq, "BLOCK_ELEMS", 128 * 7)
    torch.testing.assert_close(dequant_linear(x, qw, b, None), whole, rtol=1e-6, atol=1e-6)
    _check(whole, x, qw, b, None, rel_err)


def test_can_run_reasons(torch_gen):
    x, qw, _ = _problem(47, 128, 1, 4, 32, "sym", torch.bfloat16, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert not ok and "N=47" in why
    x, qw, _ = _problem(48, 128, 1, 4, 32, "sym", torch.float32, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert not ok and "float32" in why
    with pytest.raises(ValueError, match="float32"):
        cpu_linear(x, qw, None, None)
    x, qw, _ = _problem(16, 90, 1, 8, -1, "sym", torch.bfloat16, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert not ok and "90" in why
    x, qw, _ = _problem(16, 90, 1, 4, -1, "sym", torch.bfloat16, torch_gen)
    ok, why = cpu_can_run(x, qw)
    assert not ok and "90" in why


def test_layout_cached_and_inputs_untouched(torch_gen):
    x, qw, b = _problem(32, 256, 2, 4, 128, "zero_point", torch.bfloat16, torch_gen)
    before = [t.clone() for t in (x, qw.qweight, qw.scales, qw.zeros, b)]
    y1 = cpu_linear(x, qw, b, None)
    assert qw.has_layout("cpu_int4")
    lay = qw.layout("cpu_int4", None)
    assert lay.packed.numel() == qw.qweight.numel()  # the same size as the codes
    assert torch.equal(cpu_linear(x, qw, b, None), y1)
    assert qw.layout("cpu_int4", None) is lay
    for t, t0 in zip((x, qw.qweight, qw.scales, qw.zeros, b), before, strict=True):
        assert torch.equal(t, t0)


def test_float64_input_is_a_clear_error(torch_gen):
    x, qw, _ = _problem(16, 64, 2, 4, 32, "sym", torch.float32, torch_gen)
    with pytest.raises(TypeError, match="float64"):
        mixgemm.matmul(x.double(), qw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantlinear_cpu_forward(dtype, torch_gen, rel_err):
    from mixgemm.nn import QuantLinear

    lin = torch.nn.Linear(256, 64)
    q = QuantLinear.from_linear(lin, bits=4, group_size=128)
    x = torch.randn(2, 3, 256, generator=torch_gen).to(dtype)
    with torch.no_grad():
        y = q(x)
    want = ref.matmul(x, q.quantized_weight(), q.bias, out_dtype=torch.float64)
    assert rel_err(y, want) < TOL[dtype]
    # with autograd, through the torch.library op: the same numbers
    xg = x.clone().requires_grad_(True)
    yg = q(xg)
    assert torch.equal(yg.detach(), y)
    yg.sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape


_NO_TRITON = """
import sys, torch
from mixgemm.nn import QuantLinear
q = QuantLinear.from_linear(torch.nn.Linear(64, 32), bits=4, group_size=32)
for dtype in (torch.float32, torch.bfloat16):
    q(torch.randn(2, 64).to(dtype))
assert 'triton' not in sys.modules, 'triton was imported by a CPU forward'
print('ok')
"""


def test_cpu_forward_imports_no_triton():
    env = {**__import__("os").environ}
    out = subprocess.run([sys.executable, "-c", _NO_TRITON], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
