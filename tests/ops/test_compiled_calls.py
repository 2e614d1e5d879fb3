"""Inductor's generated code calls mixgemm's op kernels directly (mixgemm.ops.compiled_calls), with the dispatcher's
results, for every op it covers, and keeps the profiler's record of each call."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

import mixgemm
from mixgemm.nn import QuantLinear
from mixgemm.ops import compiled_calls


def _no_inductor_caches(monkeypatch):
    """Inductor's graph caches off: a graph cached by another test (or inside dispatcher_calls) would bring its code
    along. (The environment variable is read when inductor's config is imported: too late here.)"""
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "force_disable_caches", True)


def _fresh_compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)


def _layer(act_mode, gen, bias=True):
    lin = nn.Linear(96, 40, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen) * 0.1)
    return QuantLinear.from_linear(lin, bits=8 if act_mode else 4, group_size=32, mode="zero_point" if not act_mode
                                   else "sym", act_mode=act_mode)


@pytest.mark.parametrize("act_mode", [None, "sym"])
@pytest.mark.parametrize("grad", [False, True])
def test_compiled_layer_calls_its_kernel_directly(act_mode, grad, torch_gen, monkeypatch):
    """Both overloads (no_grad, and default when x needs a gradient): the generated code imports and calls the
    kernel, never the dispatcher, and computes what the eager layer does (gradients too)."""
    _no_inductor_caches(monkeypatch)
    q = _layer(act_mode, torch_gen)
    x = torch.randn(3, 96, generator=torch_gen, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        y, codes = run_and_get_code(_fresh_compile(q), x)
        ref = q(x)
    code = "\n".join(codes)
    op = f"linear_wxa{8 if act_mode else 16}_{'default' if grad else 'no_grad'}"
    assert f"import direct_{op} as mixgemm_direct_{op}" in code
    assert f"= mixgemm_direct_{op}(" in code
    assert "torch.ops.mixgemm.linear" not in code.replace("# ", "").split("def call")[-1].split("assert_size")[0]
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    if grad:
        (gx,) = torch.autograd.grad(y.sum(), x)
        (gref,) = torch.autograd.grad(ref.sum(), x)
        torch.testing.assert_close(gx, gref)


def test_compiled_norm_with_two_outputs_calls_its_kernel_directly(torch_gen, monkeypatch):
    """add_rms_norm returns two tensors: the generated code unpacks the direct call's tuple as the dispatcher's."""
    _no_inductor_caches(monkeypatch)
    a, b = (torch.randn(2, 5, 64, generator=torch_gen) for _ in range(2))
    w = torch.rand(64, generator=torch_gen) + 0.5
    perm = torch.randperm(64, generator=torch_gen)

    def f(a, b):
        h, y = torch.ops.mixgemm.add_rms_norm(a, b, w, 1e-6, perm)
        return h * 2, y + 1, torch.ops.mixgemm.gather_columns(y, perm)

    out, codes = run_and_get_code(_fresh_compile(f), a, b)
    code = "\n".join(codes)
    assert "mixgemm_direct_add_rms_norm_default(" in code and "mixgemm_direct_gather_columns_default(" in code
    h, y = torch.ops.mixgemm.add_rms_norm(a, b, w, 1e-6, perm)
    for got, want in zip(out, (h * 2, y + 1, y[..., perm]), strict=True):
        torch.testing.assert_close(got, want)


def test_direct_call_is_profiled_as_the_op(torch_gen):
    """Under the profiler the direct call records the op's name, as the dispatcher's call does; outside it, nothing."""
    fn = compiled_calls.direct_linear_wxa16_no_grad
    q = _layer(None, torch_gen, bias=False)
    x = torch.randn(2, 96, generator=torch_gen)
    args = (x, q.qweight, q.scales, q.zeros, None, None, 4, 32, "zero_point", 40, 96, -float("inf"), float("inf"))
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = fn(*args)
    assert any(e.name == "mixgemm::linear_wxa16" for e in prof.events())
    torch.testing.assert_close(y, q(x), rtol=0, atol=0)
    with pytest.raises(AttributeError, match="no attribute 'direct_nothing'"):
        compiled_calls.direct_nothing  # noqa: B018


def test_install_is_lazy_and_idempotent():
    """Importing mixgemm leaves inductor alone; install() registers every op of DIRECT_OPS once."""
    import subprocess
    import sys

    code = ("import sys, torch, torch.nn as nn; from mixgemm.nn import QuantLinear; "
            "q = QuantLinear.from_linear(nn.Linear(64, 8), group_size=32); "
            "q(torch.randn(1, 64)); print('torch._inductor.compile_fx' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
    from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN

    assert compiled_calls.install() and compiled_calls.install()
    for overload in compiled_calls.DIRECT_OPS:
        assert f"torch.ops.mixgemm.{overload}" in CUSTOM_EXTERN_KERNEL_CODEGEN
    assert mixgemm.ops.custom_ops.linear_wxa16 is compiled_calls.direct_linear_wxa16_default.__wrapped__


@pytest.mark.gpu
@pytest.mark.parametrize("act_mode", [None, "sym"])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_compiled_layer_direct_call_on_cuda(act_mode, m, torch_gen, monkeypatch):
    """On the GPU (prepared launches, kept launches on the qweight): the compiled layer's direct call gives the eager
    layer's result, call after call."""
    _no_inductor_caches(monkeypatch)
    q = _layer(act_mode, torch_gen).cuda().half()
    with torch.no_grad():
        compiled = _fresh_compile(q)
        x = torch.randn(m, 96, generator=torch_gen).cuda().half()
        y, codes = run_and_get_code(compiled, x)
        assert "= mixgemm_direct_linear_wxa" in "\n".join(codes)
        torch.testing.assert_close(y, q(x), rtol=0, atol=0)
        for _ in range(3):
            x = torch.randn(m, 96, generator=torch_gen).cuda().half()
            torch.testing.assert_close(compiled(x), q(x), rtol=0, atol=0)


def test_dispatcher_calls_block_compiles_the_dispatcher_call(torch_gen, monkeypatch):
    """Inside compiled_calls.dispatcher_calls() inductor writes the dispatcher call (the A / B of
    tools/profile/direct_calls.py); the direct calls are back after the block."""
    _no_inductor_caches(monkeypatch)
    q = _layer(None, torch_gen)
    x = torch.randn(2, 96, generator=torch_gen)
    with torch.no_grad():
        with compiled_calls.dispatcher_calls():
            y, codes = run_and_get_code(_fresh_compile(q), x)
        code = "\n".join(codes)
        assert "mixgemm_direct_" not in code and "torch.ops.mixgemm.linear_wxa16.no_grad(" in code
        y2, codes = run_and_get_code(_fresh_compile(q), x)
    assert "mixgemm_direct_linear_wxa16_no_grad(" in "\n".join(codes)
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
