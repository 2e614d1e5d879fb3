"""mixgemm.nn.QuantLinear, mixgemm.quantize_ and the torch.library ops (opcheck, torch.compile, CUDA graphs)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import mixgemm.reference as ref
from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.conv import quantize_conv_weight
from mixgemm.formats.weight import QuantConfig, dequantize_weight, quantize_weight
from mixgemm.nn import QuantLinear
from mixgemm.ops.custom_ops import weight_args
from mixgemm.quantize_api import W4A8, W4A16, W8A8, W8A16, quantize_

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _linear(k, n, bias, gen, dtype=torch.float32):
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * 0.02)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return lin.to(dtype)


# ------------------------------------------------------------------------------------------ QuantLinear

@pytest.mark.parametrize("bits,group,mode", [(4, 32, "sym"), (4, 64, "zero_point"), (4, -1, "offset"),
                                             (8, -1, "sym"), (8, 128, "zero_point"), (8, 32, "offset")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantlinear_matches_reference(bits, group, mode, dtype, torch_gen, rel_err):
    lin = _linear(128, 45, True, torch_gen)
    q = QuantLinear.from_linear(lin, QuantConfig(bits=bits, group_size=group, mode=mode))
    qw = q.quantized_weight()
    for shape in [(128,), (1, 128), (3, 5, 128), (2, 1, 17, 128)]:
        x = torch.randn(*shape, generator=torch_gen).to(dtype)
        x0 = x.clone()
        y = q(x)
        assert y.shape == (*shape[:-1], 45) and y.dtype == dtype
        assert torch.equal(x, x0)
        assert rel_err(y, ref.matmul(x, qw, lin.bias.detach(), out_dtype=torch.float64)) <= TOL[dtype]
    # the quantized layer approximates the float one (int4: a few %, int8: < 1%)
    x = torch.randn(9, 128, generator=torch_gen)
    assert rel_err(q(x), lin(x)) < (0.15 if bits == 4 else 0.02)


def test_quantlinear_strided_input_and_no_bias(torch_gen, rel_err):
    lin = _linear(64, 24, False, torch_gen)
    q = QuantLinear.from_linear(lin, bits=4, group_size=32)
    assert q.bias is None
    x = torch.randn(64, 10, generator=torch_gen).T  # non-contiguous [10, 64]
    assert rel_err(q(x), ref.matmul(x, q.quantized_weight())) <= 1e-5


def test_from_quantized_shares_tensors_and_repr(torch_gen):
    qw = quantize_weight(torch.randn(16, 64, generator=torch_gen), bits=8, group_size=-1, mode="zero_point")
    b = torch.randn(16, generator=torch_gen)
    q = QuantLinear.from_quantized(qw, b)
    assert q.qweight is qw.qweight and q.zeros is qw.zeros and q.in_features == 64 and q.out_features == 16
    assert torch.equal(q.bias, b) and not q.bias.requires_grad
    r = repr(q)
    assert "W8A16" in r and "per-channel" in r and "zero_point" in r
    assert torch.equal(q.dequantize(), dequantize_weight(qw))
    with pytest.raises(ValueError, match="bias must have shape"):
        QuantLinear.from_quantized(qw, torch.zeros(3))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        QuantLinear.from_quantized(torch.zeros(3, 3))


def test_bad_input_is_clear(torch_gen):
    q = QuantLinear.from_linear(_linear(64, 8, True, torch_gen), bits=4, group_size=32)
    with pytest.raises(ValueError, match="shape mismatch"):
        q(torch.randn(2, 63))
    with pytest.raises(TypeError, match="dtype"):
        q(torch.randn(2, 64, dtype=torch.float64))
    assert QuantLinear(40, 8, group_size=32).scales.shape == (8, 2)  # a group of 32 and a partial one of 8
    with pytest.raises(ValueError, match="K must be a positive integer, got 0"):
        QuantLinear(0, 8, group_size=32)
    bad = _linear(64, 8, False, torch_gen)
    with torch.no_grad():
        bad.weight[3, 5] = float("nan")
    rep = quantize_(nn.Sequential(bad), W4A16(group_size=32))
    assert rep.replaced == [] and "non-finite value (nan) at [3, 5]" in rep.skipped["0"]


def test_state_dict_and_safetensors_round_trip(tmp_path, torch_gen):
    from safetensors.torch import load_file, save_file

    model = nn.Sequential(_linear(64, 32, True, torch_gen), nn.GELU(), _linear(32, 16, False, torch_gen))
    quantize_(model, W4A16(group_size=32, mode="offset"))
    x = torch.randn(4, 64, generator=torch_gen)
    y = model(x)
    save_file(model.state_dict(), tmp_path / "m.safetensors")
    # a fresh skeleton of the same format, loaded from the file
    fresh = nn.Sequential(QuantLinear(64, 32, bias=True, bits=4, group_size=32, mode="offset",
                                      bias_dtype=torch.float32),
                          nn.GELU(), QuantLinear(32, 16, bias=False, bits=4, group_size=32, mode="offset"))
    assert not torch.equal(fresh(x), y)
    fresh.load_state_dict(load_file(tmp_path / "m.safetensors"))
    assert torch.equal(fresh(x), y)
    # plain torch.save too, and a format mismatch is refused with the reason
    torch.save(model.state_dict(), tmp_path / "m.pt")
    other = nn.Sequential(QuantLinear(64, 32, bits=4, group_size=32, mode="sym"), nn.GELU(),
                          QuantLinear(32, 16, bias=False, bits=4, group_size=32, mode="sym"))
    sd = torch.load(tmp_path / "m.pt")
    sd = {k: v for k, v in sd.items() if "offsets" not in k}
    with pytest.raises(ValueError, match="mode: checkpoint 2 vs module 0"):
        other.load_state_dict(sd, strict=False)


def test_load_state_dict_in_place_invalidates_layout_cache(torch_gen):
    a = QuantLinear.from_linear(_linear(64, 8, False, torch_gen), bits=8, group_size=-1)
    b = QuantLinear.from_linear(_linear(64, 8, False, torch_gen), bits=8, group_size=-1)
    x = torch.randn(3, 64, generator=torch_gen)
    qw1 = a.quantized_weight()
    assert a.quantized_weight() is qw1  # cached on the buffer: kernel layouts are built once
    a(x)
    a.load_state_dict(b.state_dict())  # in-place copies into a's buffers
    assert a.quantized_weight() is not qw1
    assert torch.equal(a(x), b(x))


def test_to_keeps_scale_dtype_and_deepcopy(torch_gen):
    q = QuantLinear.from_linear(_linear(64, 8, True, torch_gen), QuantConfig(bits=4, group_size=32,
                                                                             scale_dtype=torch.float32))
    s = q.scales.clone()
    q2 = copy.deepcopy(q).to(torch.bfloat16)
    assert q2.scales.dtype == torch.float32 and torch.equal(q2.scales, s)
    assert q2.bias.dtype == torch.bfloat16  # the bias converts like nn.Linear's
    x = torch.randn(2, 64, generator=torch_gen, dtype=torch.bfloat16)
    assert q2(x).dtype == torch.bfloat16
    assert torch.equal(q.scales, s)


# ------------------------------------------------------------------------------------------ quantize_

def test_quantize_report_and_filter(torch_gen):
    emb = nn.Embedding(10, 64)
    head = nn.Linear(64, 10, bias=False)
    head.weight = emb.weight  # tied
    model = nn.ModuleDict({"emb": emb, "a": _linear(64, 40, True, torch_gen), "b": _linear(40, 64, True, torch_gen),
                           "c": _linear(64, 64, True, torch_gen), "head": head})
    rep = quantize_(model, W4A16(group_size=32), filter_fn=lambda m, name: name != "c")
    assert rep.replaced == ["a", "b"]  # b: K = 40, a group of 32 and a partial one of 8
    assert set(rep.skipped) == {"head"} and "tied" in rep.skipped["head"]
    assert model["b"].scales.shape == (64, 2)
    assert rep.excluded == ["c"]
    assert isinstance(model["a"], QuantLinear) and isinstance(model["b"], QuantLinear)
    assert "2 replaced, 1 skipped" in str(rep)
    with pytest.raises(TypeError, match="W4A16"):
        quantize_(model, QuantConfig())
    with pytest.raises(ValueError, match="group_size"):
        W4A16(group_size=100)
    for bad in (dict(group_size=-1), dict(mode="zero_point")):
        with pytest.raises(ValueError, match="int_scales"):
            W4A8(int_scales=True, **bad)


@pytest.mark.parametrize("cfg", [W8A8(), W4A8(group_size=32), W8A8(group_size=64, act_mode="asym"),
                                 W4A8(act_block="token"), W4A8(group_size=64, act_mode="asym", act_block="token"),
                                 W4A8(act_block="token", int_scales=True)])
def test_activation_quantized_formats_match_block_int_gemm(cfg, torch_gen, rel_err):
    lin = _linear(128, 24, True, torch_gen)
    model = nn.Sequential(lin)
    float_model = copy.deepcopy(model)
    rep = quantize_(model, cfg)
    assert rep.replaced == ["0"] and cfg.activation_quantized and model[0].activation_quantized
    x = torch.randn(2, 3, 128, generator=torch_gen)
    qw = model[0].quantized_weight()
    a = quantize_activation(x.reshape(6, 128), -1 if cfg.act_block == "token" else qw.group_size, cfg.act_mode)
    want = (ref.block_int_gemm(a, qw) + lin.bias.double()).reshape(2, 3, 24)
    assert model[0].act_block == cfg.act_block and ("act_block=token" in repr(model[0])) == (cfg.act_block == "token")
    state = model[0].state_dict()  # the activation block is part of the format: a per-group module refuses it
    other = QuantLinear(128, 24, bits=cfg.bits, group_size=cfg.group_size, act_mode=cfg.act_mode,
                        act_block="group" if cfg.act_block == "token" else "token")
    with pytest.raises(ValueError, match="act_mode"):
        other.load_state_dict(state)
    assert rel_err(model(x), want) <= 1e-6
    assert rel_err(model(x), float_model(x)) < (0.15 if cfg.bits == 4 else 0.03)


def test_w8a16_defaults_per_channel(torch_gen):
    model = nn.Sequential(_linear(96, 8, True, torch_gen))
    quantize_(model, W8A16())
    assert model[0].bits == 8 and model[0].group_size == -1 and not model[0].activation_quantized


# ------------------------------------------------------------------------------------------ torch.library

def _op_cases(gen):
    cases = []
    for bits, group, mode, dtype, bias in [(4, 32, "sym", torch.float32, True), (4, -1, "zero_point", torch.float16,
                                                                                   False),
                                           (8, 64, "offset", torch.bfloat16, True)]:
        qw = quantize_weight(torch.randn(24, 128, generator=gen) * 0.02, bits=bits, group_size=group, mode=mode)
        x = torch.randn(2, 3, 128, generator=gen).to(dtype)
        b = torch.randn(24, generator=gen).to(dtype) if bias else None
        cases.append((x, qw, b))
    return cases


def test_opcheck_linear_wxa16(torch_gen):
    for x, qw, b in _op_cases(torch_gen):
        qt, s, z, o, bits, g, mode, n, k = weight_args(qw)
        for lo, hi in [(-math.inf, math.inf), (0.0, 6.0), (-0.5, 0.25)]:
            for overload in (torch.ops.mixgemm.linear_wxa16.default, torch.ops.mixgemm.linear_wxa16.no_grad):
                torch.library.opcheck(overload, (x, qt, s, z, o, b, bits, g, mode, n, k, lo, hi))
        torch.library.opcheck(torch.ops.mixgemm.linear_wxa8.no_grad,
                              (x, qt, s, z, o, b, bits, g, mode, n, k, "sym", 0.0, 6.0, "group"))


@pytest.mark.parametrize("act", [None, "sym"])
def test_compiled_call_takes_the_no_grad_overload_when_nothing_needs_a_gradient(act, torch_gen, rel_err):
    """Under torch.compile a QuantLinear call that records no gradient (grad mode off, or neither x nor the bias
    requires one) goes through the op's no_grad overload, which has no Python autograd kernel; one that does keeps
    the default overload and its backward."""
    torch._dynamo.reset()
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=torch_gen) * 0.1)
    q = QuantLinear.from_linear(lin, bits=8, group_size=32, mode="sym", act_mode=act)
    q.bias.requires_grad_(False)
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "mixgemm" in str(n.target))
        return gm

    op = "linear_wxa16" if act is None else "linear_wxa8"
    compiled = torch.compile(q, backend=backend, fullgraph=True, dynamic=False)
    x = torch.randn(3, 64, generator=torch_gen)
    with torch.no_grad():
        assert torch.equal(compiled(x), q(x))
    compiled(x)  # grad mode on, nothing requires grad
    assert targets == [f"mixgemm.{op}.no_grad"] * 2, targets
    xg = x.clone().requires_grad_()
    y = compiled(xg)
    assert targets[-1] == f"mixgemm.{op}.default", targets
    y.square().sum().backward()
    xe = x.clone().requires_grad_()
    q(xe).square().sum().backward()
    assert rel_err(xg.grad, xe.grad) <= 1e-6


def test_linear_op_clamp_bounds(torch_gen, rel_err):
    x, qw, b = _op_cases(torch_gen)[0]
    args = weight_args(qw)
    y = torch.ops.mixgemm.linear_wxa16(x, *args[:4], b, *args[4:], -0.5, 0.25)
    want = ref.matmul(x, qw, b, out_dtype=torch.float64).clamp(-0.5, 0.25)
    assert rel_err(y, want) <= 1e-5
    y6 = torch.ops.mixgemm.linear_wxa16(x * 50, *args[:4], b, *args[4:], 0.0, 6.0)
    assert rel_err(y6, ref.matmul(x * 50, qw, b, activation="relu6")) <= 1e-5


def test_opcheck_with_autograd(torch_gen):
    """opcheck with inputs that require grad exercises the registered backward (x and bias)."""
    x, qw, b = _op_cases(torch_gen)[0]
    qt, s, z, o, bits, g, mode, n, k = weight_args(qw)
    x = x.clone().requires_grad_()
    b = b.clone().requires_grad_()
    for op, extra in ((torch.ops.mixgemm.linear_wxa16.default, ()), (torch.ops.mixgemm.linear_wxa8.default, ("sym",))):
        torch.library.opcheck(op, (x, qt, s, z, o, b, bits, g, mode, n, k, *extra, -0.5, 0.25))


def test_backward_matches_float_linear(torch_gen, rel_err):
    """Gradients through a frozen QuantLinear (e.g. for adapters on top): dL/dx and dL/dbias equal those of
    nn.Linear with the dequantized weight; with a clamp, masked where it was active."""
    lin = _linear(128, 24, True, torch_gen)
    q = QuantLinear.from_linear(lin, bits=4, group_size=32, mode="zero_point")
    q.bias.requires_grad_()
    w = q.dequantize()
    x = torch.randn(3, 128, generator=torch_gen, requires_grad=True)
    gy = torch.randn(3, 24, generator=torch_gen)
    (q(x) * gy).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    b2 = q.bias.detach().clone().requires_grad_()
    (torch.nn.functional.linear(x2, w, b2) * gy).sum().backward()
    assert rel_err(x.grad, x2.grad) <= 1e-5 and rel_err(q.bias.grad, b2.grad) <= 1e-6
    assert q.qweight.grad is None and q.scales.grad is None
    qt, s, z, o, bits, g, mode, n, k = weight_args(q.quantized_weight())
    x3 = x.detach().clone().requires_grad_()
    y = torch.ops.mixgemm.linear_wxa16(x3, qt, s, z, o, None, bits, g, mode, n, k, 0.0, math.inf)  # relu
    (y * gy).sum().backward()
    x4 = x.detach().clone().requires_grad_()
    (torch.relu(torch.nn.functional.linear(x4, w)) * gy).sum().backward()
    assert rel_err(x3.grad, x4.grad) <= 1e-5


def test_opcheck_linear_wxa8(torch_gen):
    for x, qw, b in _op_cases(torch_gen):
        qt, s, z, o, bits, g, mode, n, k = weight_args(qw)
        torch.library.opcheck(torch.ops.mixgemm.linear_wxa8.default,
                              (x, qt, s, z, o, b, bits, g, mode, n, k, "asym", -math.inf, math.inf))
        torch.library.opcheck(torch.ops.mixgemm.linear_wxa8.default,
                              (x, qt, s, z, o, b, bits, g, mode, n, k, "sym", -math.inf, math.inf, "token"))


@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_conv2d(channels_last, torch_gen, rel_err):
    w = torch.randn(12, 32, 3, 3, generator=torch_gen) * 0.05
    qcw = quantize_conv_weight(w, QuantConfig(bits=4, group_size=32, mode="zero_point"))
    x = torch.randn(2, 64, 9, 7, generator=torch_gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    b = torch.randn(12, generator=torch_gen)
    qt, s, z, o, bits, g, mode, _, _ = weight_args(qcw.matrix)
    args = (x, qt, s, z, o, b, bits, g, mode, [12, 32, 3, 3], [2, 1], [1, 0], [1, 2], 2, 0.0, math.inf)
    torch.library.opcheck(torch.ops.mixgemm.conv2d_wxa16.default, args)
    y = torch.ops.mixgemm.conv2d_wxa16(*args)
    want = ref.conv2d(x, qcw, b, (2, 1), (1, 0), (1, 2), 2, "relu", out_dtype=torch.float64)
    assert rel_err(y, want) <= 1e-5
    assert y.is_contiguous(memory_format=torch.channels_last) == channels_last


class _Block(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.up = _linear(64, 128, True, gen)
        self.down = _linear(128, 64, False, gen)
        self.head = _linear(64, 32, True, gen)

    def forward(self, x):
        return self.head(x + self.down(torch.relu(self.up(x))))


def test_compile_fullgraph_equals_eager(torch_gen):
    """torch.compile(fullgraph=True) (inductor, CPU) of a model made of QuantLinear layers: no graph
    break (fullgraph raises on one) and the same result as eager. Mixed formats, one activation-quantized."""
    torch._dynamo.reset()
    model = _Block(torch_gen)
    quantize_(model, W4A16(group_size=32), filter_fn=lambda m, n: n != "head")
    quantize_(model, W8A8())
    model.eval()
    x = torch.randn(2, 5, 64, generator=torch_gen)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)
        got = compiled(x)
        # the compiled graph hands the op the module's own buffers, so the weight cache (and the kernel
        # layouts on it) lives on them and is reused by later calls
        cached = model.up.qweight.__dict__.pop("_mixgemm_qw")[1]
        got2 = compiled(x * 2)
        assert model.up.qweight._mixgemm_qw[1] is not cached
        again = model.up.qweight._mixgemm_qw[1]
        compiled(x)
        assert model.up.qweight._mixgemm_qw[1] is again
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got2, model(x * 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,held", [("sym", set()), ("zero_point", {"zeros"}), ("offset", {"offsets"})])
def test_compiled_graph_takes_only_the_tensors_its_mode_reads(mode, held, torch_gen):
    """Under torch.compile every tensor a module hands an op is a graph input, guarded on each call: a QuantLinear
    hands the op its zeros / offsets only where its mode reads them (the others go as None), and the result is the
    eager one."""
    torch._dynamo.reset()
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=torch_gen) * 0.1)
    q = QuantLinear.from_linear(lin, bits=4, group_size=32, mode=mode)
    names = []

    def backend(gm, example_inputs):
        names.extend(n.name for n in gm.graph.nodes if n.op == "placeholder")
        return gm

    x = torch.randn(3, 64, generator=torch_gen)
    with torch.no_grad():
        got = torch.compile(q, backend=backend, fullgraph=True)(x)
        assert torch.equal(got, q(x))
    inputs = {b for b in ("qweight", "scales", "zeros", "offsets") if any(b in n for n in names)}
    assert inputs == {"qweight", "scales"} | held, names


def test_op_fields_follow_the_module(torch_gen):
    """forward reads the op's constant arguments from one tuple (one guard under torch.compile); setting any field
    it is made of (tensor-parallel sharding sets in / out features) refreshes it."""
    q = QuantLinear.from_linear(nn.Linear(64, 48), bits=4, group_size=32, mode="zero_point", act_mode="sym",
                                act_block="token")
    assert q._op_fields == (4, 32, "zero_point", 48, 64, "sym", "token", -math.inf, math.inf)
    q.in_features, q.out_features = 32, 24
    assert q._op_fields[3:5] == (24, 32)
    assert copy.deepcopy(q)._op_fields == q._op_fields


@pytest.mark.parametrize("act", [None, "sym"])
def test_torch_export_holds_one_op_node(act, torch_gen):
    """torch.export of a QuantLinear: one mixgemm node (the no_grad overload: exported programs record no gradient),
    and the exported program computes the module's result."""
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=torch_gen) * 0.1)
    q = QuantLinear.from_linear(lin, bits=8 if act else 4, group_size=32, mode="sym", act_mode=act)
    x = torch.randn(3, 64, generator=torch_gen)
    ep = torch.export.export(q, (x,))
    calls = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert calls == [f"mixgemm.linear_wxa{8 if act else 16}.no_grad"], calls
    assert torch.equal(ep.module()(x), q(x))


def test_kept_launch_applies_only_while_nothing_changed(torch_gen):
    """The eager fast path (ops/eager.fast_call) launches what a module kept for an input shape only while the
    compiler, autograd, kernel options, the bias and the weight's buffers are as they were; a copy starts without
    launches. (On the CPU no launch is kept: one is put in by hand, a recorder standing for the kernel.)"""
    import pickle

    import mixgemm
    from mixgemm.ops.eager import _token, fast_call
    from mixgemm.ops.kept_launches import keep

    q = QuantLinear.from_linear(_linear(64, 48, True, torch_gen), bits=4, group_size=32, mode="zero_point")
    x = torch.randn(2, 3, 64, generator=torch_gen)
    calls = []

    def launch(x2d, bias, lo, hi):
        calls.append(tuple(x2d.shape))
        return torch.full((x2d.shape[0], 48), 7.0)

    def keep_it():
        keep(q.__dict__, (x.shape, x.dtype, x.get_device()), _token(q), launch, 48, -math.inf, math.inf, x)

    keep_it()
    with torch.no_grad():  # a compiled graph traces none of it (it keeps the op), even with a launch kept
        torch._dynamo.reset()
        assert not torch.equal(torch.compile(q, backend="eager", fullgraph=True)(x), torch.full((2, 3, 48), 7.0))
        assert calls == []
    assert fast_call(q, torch.randn(5, 64)) is None  # another shape
    with torch.no_grad():
        y = fast_call(q, x)
        assert y.shape == (2, 3, 48) and calls == [(6, 64)]
        assert fast_call(q, x.transpose(0, 1).contiguous().transpose(0, 1)) is None  # not contiguous
        with mixgemm.kernel_options(force="cuda_gemv"):
            assert fast_call(q, x) is None
        bias = q.bias
        q.bias = nn.Parameter(torch.zeros(47), requires_grad=False)  # not [N]: the full way, which names it
        assert fast_call(q, x) is None
        q.bias = bias
    assert fast_call(q, x.clone().requires_grad_()) is None  # autograd records through the op
    with torch.no_grad():
        q.zeros.add_(0)  # an in-place write to a buffer the mode reads: the kept launch no longer applies
        assert fast_call(q, x) is None
        keep_it()
        q.offsets.add_(0)  # a buffer the mode does not read
        assert fast_call(q, x) is not None
    assert not copy.deepcopy(q).__dict__["_mixgemm_launches"]
    assert not pickle.loads(pickle.dumps(q.__dict__["_mixgemm_launches"]))
    # kept for a changed weight: a new launch replaces them all (they would hold the old layouts alive)
    other = torch.randn(1, 64, generator=torch_gen)
    with torch.no_grad():
        q.scales.mul_(1)
    keep(q.__dict__, (other.shape, other.dtype, -1), _token(q), launch, 48, -math.inf, math.inf, other)
    assert list(q.__dict__["_mixgemm_launches"]) == [(other.shape, other.dtype, -1)]
    q.to(torch.float64)  # a move or cast (Module._apply) drops them
    assert "_mixgemm_launches" not in q.__dict__


def test_kept_launch_of_inference_tensors(torch_gen):
    """Weights made under torch.inference_mode have no version counter: the kept launch's check compares their
    pointers only (kept_launches.holds_weight), and a swapped tensor still turns it off."""
    from mixgemm.ops.eager import _token, fast_call
    from mixgemm.ops.kept_launches import keep

    with torch.inference_mode():
        q = QuantLinear.from_linear(_linear(64, 48, False, torch_gen), bits=4, group_size=32, mode="offset")
        x = torch.randn(1, 64, generator=torch_gen)
    assert _token(q)[1] == -1  # (version_of: an inference tensor)

    def launch(x2d, bias, lo, hi):
        return torch.full((x2d.shape[0], 48), 3.0)

    keep(q.__dict__, (x.shape, x.dtype, x.get_device()), _token(q), launch, 48, -math.inf, math.inf, x)
    with torch.no_grad():
        assert torch.equal(fast_call(q, x), torch.full((1, 48), 3.0))
        q.offsets = q.offsets.clone()  # another tensor: the full path
        assert fast_call(q, x) is None


# ------------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantlinear_cuda_and_cuda_graph(dtype, torch_gen, rel_err):
    """On CUDA: QuantLinear (GEMV kernel) against the float64 reference, then captured in a CUDA graph
    (no host sync / allocation breaks capture) and replayed on new input."""
    lin = _linear(4096, 1000, True, torch_gen).cuda()
    q = QuantLinear.from_linear(lin, bits=4, group_size=128).cuda()
    x = torch.randn(4, 4096, generator=torch_gen).to(dtype).cuda()
    qw = q.quantized_weight()
    y = q(x)
    assert rel_err(y, ref.matmul(x, qw, q.bias, out_dtype=torch.float64)) <= TOL[dtype]
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q(static_x)  # warm-up: compiles the kernel, builds the layout
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = q(static_x)
    x2 = torch.randn(4, 4096, generator=torch_gen).to(dtype).cuda()
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(static_y, ref.matmul(x2, qw, q.bias, out_dtype=torch.float64)) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [W4A16(group_size=128), W8A16(), W8A8(), W4A8(act_block="token")])
def test_eager_kept_launch_cuda(cfg, torch_gen, rel_err):
    """Eager calls on CUDA: the second call of an input shape takes the launch the first one kept (ops/eager.py),
    with the first call's result; an in-place change of the weight, a new shape and a kernel_options block go the
    full way and keep the reference."""
    import mixgemm
    from mixgemm.ops.eager import fast_call

    model = nn.Sequential(_linear(512, 1000, True, torch_gen)).half().cuda()
    quantize_(model, cfg)
    q = model[0]
    with torch.no_grad():
        for shape in ((1, 512), (2, 3, 512), (40, 512)):
            x = torch.randn(*shape, generator=torch_gen).half().cuda()
            first = q(x)
            # (split-K tiles add with atomics: two calls may differ in the last bits, hence rel_err, not equality)
            kept = fast_call(q, x)  # none where the chosen kernel has no prepared launch (the Triton ones)
            assert (kept is not None or shape[0] == 40) and (kept is None or rel_err(kept, first) <= 1e-4)
            with mixgemm.kernel_options(pdl=False):  # options of its own: the full way
                assert rel_err(q(x), first) <= 1e-4
            want = ref.matmul(x, q.quantized_weight(), q.bias, out_dtype=torch.float64)
            tol = TOL[torch.float16] if cfg.act_mode is None else 2e-2  # A8: against the float weights' product
            assert rel_err(first, want) <= tol, shape
        # a contiguous x whose size-1 dim carries an odd stride (PyTorch calls it contiguous): rows are K apart
        base = torch.randn(2, 512, generator=torch_gen).half().cuda()
        odd = base.as_strided((2, 1, 512), (512, 7, 1))
        assert odd.is_contiguous()
        want = ref.matmul(base.view(2, 1, 512), q.quantized_weight(), q.bias, out_dtype=torch.float64)
        tol = TOL[torch.float16] if cfg.act_mode is None else 2e-2
        for _ in range(2):  # the full path, then the kept launch
            assert rel_err(q(odd), want) <= tol
        q.scales.mul_(2)
        assert fast_call(q, x) is None
        doubled = q(x)
        assert rel_err(doubled, ref.matmul(x, q.quantized_weight(), q.bias, out_dtype=torch.float64)) <= tol
        with mixgemm.kernel_options(pdl=False):
            assert fast_call(q, x) is None and rel_err(q(x), doubled) <= 1e-4


@pytest.mark.gpu
def test_op_kept_launch_cuda(torch_gen, rel_err):
    """The op (what a compiled graph calls) keeps its launch on qweight per input shape and clamp: the second call
    takes it, with the reference's result; a bias of the wrong shape still goes the full way and is named."""
    qw = quantize_weight(torch.randn(1000, 512, generator=torch_gen) * 0.02, bits=4, group_size=128,
                         mode="zero_point").to("cuda")
    qt, s, z, o, bits_, g, mode_, n, k = weight_args(qw)
    b = torch.randn(1000, generator=torch_gen).half().cuda()
    for shape, (lo, hi) in (((1, 1, 512), (-math.inf, math.inf)), ((3, 512), (0.0, math.inf))):
        x = torch.randn(*shape, generator=torch_gen).half().cuda()
        args = (x, qt, s, z, o, b, bits_, g, mode_, n, k, lo, hi)
        first = torch.ops.mixgemm.linear_wxa16(*args)
        assert qt.__dict__["_mixgemm_launches"]
        again = torch.ops.mixgemm.linear_wxa16(*args)
        want = ref.matmul(x, qw, b, out_dtype=torch.float64).clamp(lo, hi)
        assert rel_err(first, want) <= TOL[torch.float16] and rel_err(again, want) <= TOL[torch.float16]
        with pytest.raises(ValueError, match="bias"):
            torch.ops.mixgemm.linear_wxa16(x, qt, s, z, o, b[:999], bits_, g, mode_, n, k, lo, hi)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,act_block", [(8, -1, "group"), (4, 128, "token")])
def test_op_kept_launch_a8_cuda(bits, group, act_block, torch_gen, rel_err):
    """linear_wxa8 keeps its launch on qweight too: repeated calls (M = 1: the fused GEMV; M = 16: the row quantizer
    into the stream's kept scratch, then the int8 GEMM) on fresh inputs each match the op's float64 reference, also
    interleaved with a CUDA-graph replay of the same shape captured in between (the graph's scratch is its own)."""
    from mixgemm.ops.custom_ops import _linear_wxa8_reference

    qw = quantize_weight(torch.randn(1000, 512, generator=torch_gen) * 0.02, bits=bits, group_size=group,
                         mode="sym").to("cuda")
    qt, s, z, o, bits_, g, mode_, n, k = weight_args(qw)
    b = torch.randn(1000, generator=torch_gen).half().cuda()
    op = torch.ops.mixgemm.linear_wxa8.no_grad
    for m in (1, 16):
        def call(x):
            return op(x, qt, s, z, o, b, bits_, g, mode_, n, k, "sym", -math.inf, math.inf, act_block)

        def want(x):
            return _linear_wxa8_reference(x, qw, b, "sym", -math.inf, math.inf, act_block)

        xs = [torch.randn(m, 512, generator=torch_gen).half().cuda() for _ in range(3)]
        outs = [call(x) for x in xs]
        assert any(key[8] == "sym" for key in qt.__dict__["_mixgemm_launches"])
        static_x = xs[0].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = call(static_x)
        for x, y in zip(xs, outs, strict=True):
            assert rel_err(y, want(x)) <= TOL[torch.float16]
            static_x.copy_(x.flip(0) * 2)
            graph.replay()
            again = call(x)
            torch.cuda.synchronize()
            assert rel_err(again, want(x)) <= TOL[torch.float16]
            assert rel_err(static_y, want(x.flip(0) * 2)) <= TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 40])
def test_opcheck_linear_cuda(m, torch_gen, rel_err):
    """The op on CUDA (GEMV kernel for M <= 16; the GEMM, or its announced fallback, above): opcheck and the
    float64 reference, odd N and every mode."""
    for bits, group, mode in [(4, 128, "sym"), (4, 32, "zero_point"), (8, -1, "offset")]:
        qw = quantize_weight(torch.randn(1000, 512, generator=torch_gen) * 0.02, bits=bits, group_size=group,
                             mode=mode).to("cuda")
        x = torch.randn(m, 512, generator=torch_gen).half().cuda()
        b = torch.randn(1000, generator=torch_gen).half().cuda()
        qt, s, z, o, bits_, g, mode_, n, k = weight_args(qw)
        args = (x, qt, s, z, o, b, bits_, g, mode_, n, k, -math.inf, math.inf)
        torch.library.opcheck(torch.ops.mixgemm.linear_wxa16.default, args)
        y = torch.ops.mixgemm.linear_wxa16(*args)
        assert rel_err(y, ref.matmul(x, qw, b, out_dtype=torch.float64)) <= TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [W8A8(), W4A8(group_size=128), W4A16(group_size=128), W4A8(act_block="token"),
                                 W4A8(act_block="token", int_scales=True)])
def test_quantized_model_cuda_compiled_reduce_overhead(cfg, torch_gen, rel_err):
    """A small model quantized on CUDA (every format; the A8 ones run the int8 tensor-core kernels) against
    the float64 reference, then torch.compile(fullgraph=True, mode="reduce-overhead") (CUDA graphs) equals
    eager, at decode (M = 4) and prefill (M = 96) sizes."""
    torch._dynamo.reset()
    model = _Block(torch_gen)
    with torch.no_grad():  # K = 256 / 512 so the 4-bit int8 layout (K % 128) takes every layer
        model.up, model.down, model.head = (_linear(256, 512, True, torch_gen), _linear(512, 256, False, torch_gen),
                                            _linear(256, 96, True, torch_gen))
    model = model.half().cuda().eval()
    rep = quantize_(model, cfg)
    assert len(rep.replaced) == 3
    for m in (4, 96):
        x = torch.randn(m, 256, generator=torch_gen).half().cuda()
        with torch.no_grad():
            eager = model(x)
            for layer in (model.up,):
                qw = layer.quantized_weight()
                if cfg.act_mode is None:
                    want = ref.matmul(x, qw, layer.bias, out_dtype=torch.float64)
                else:
                    a = quantize_activation(x, -1 if cfg.act_block == "token" else qw.group_size, cfg.act_mode)
                    want = a.dequantize() @ dequantize_weight(qw, torch.float64).T + layer.bias.double()
                assert rel_err(layer(x), want) <= 2e-3
            step = torch.compile(model, fullgraph=True, mode="reduce-overhead")
            for _ in range(3):  # warm-up, record, replay
                got = step(x).clone()
        assert rel_err(got, eager) <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,kernel,config", [
    (W4A16(group_size=128), "cuda_wgmma", dict(BM=16, NWG=2, STAGES=4, KT=4, SPLIT=4, SERIAL=1)),
    (W8A8(), None, None)], ids=["serial-split-k", "int8-scratch"])
def test_kept_buffers_under_compiled_cuda_graphs(cfg, kernel, config, torch_gen, rel_err):
    """Buffers kept per stream between calls (the serial split-K's tile counters, the int8 row quantizer's scratch:
    kernels/cuda/stream_buffers.py) are driver memory, so a model compiled with mode="reduce-overhead" warms up and
    records its CUDA graphs with them (a kept buffer from the graphs' memory pool fails cudagraph-trees' check), and
    replays match eager calls."""
    import mixgemm

    torch._dynamo.reset()
    model = nn.Sequential(_linear(4608, 1000, True, torch_gen)).half().cuda().eval()
    quantize_(model, cfg)
    forced = (mixgemm.kernel_options(force=kernel, configs={kernel: config}) if kernel
              else mixgemm.kernel_options())
    with torch.no_grad(), forced:
        step = torch.compile(model, fullgraph=True, mode="reduce-overhead")
        for _ in range(2):
            for m in (16, 3):
                x = torch.randn(m, 4608, generator=torch_gen).half().cuda()
                eager = model(x)
                for _ in range(3):  # warm-up, record, replay
                    got = step(x).clone()
                assert rel_err(got, eager) <= 1e-3, m
                if kernel:
                    assert rel_err(got, ref.matmul(x, model[0].quantized_weight(), model[0].bias,
                                                   out_dtype=torch.float64)) <= TOL[torch.float16]


def test_quantize_replaces_conv2d_and_matches_dequantized_float(rel_err):
    """quantize_ covers nn.Conv2d (weight-only configs) and reports convs it cannot take (A8 configs)."""
    import mixgemm
    from mixgemm.nn import QuantConv2d

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 32, 1, stride=2),
                          nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    x = torch.randn(2, 64, 8, 8)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert report.replaced == ["0", "2", "4"] and not report.skipped
    assert isinstance(model[0], QuantConv2d) and isinstance(model[2], QuantConv2d)
    twin = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 32, 1, stride=2),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    with torch.no_grad():
        for i in (0, 2):
            twin[i].weight.copy_(model[i].dequantized_weight(torch.float32))
            twin[i].bias.copy_(model[i].bias)
        twin[4].weight.copy_(model[4].dequantize())
        twin[4].bias.copy_(model[4].bias)
        assert rel_err(model(x), twin(x)) < 1e-5
    a8 = mixgemm.quantize_(nn.Sequential(nn.Conv2d(8, 8, 3), nn.Linear(64, 64)), mixgemm.W8A8())
    assert list(a8.skipped) == ["0"] and "activation-quantized convolution" in a8.skipped["0"]
