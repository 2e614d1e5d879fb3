"""QuantLinear with an input permutation (act-order checkpoints): forward, dequantize in the original input order,
state-dict round trips, and that ordinary layers' state dicts are unchanged."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from mixgemm.formats.weight import QuantConfig, dequantize_weight, quantize_weight
from mixgemm.nn.linear import QuantLinear


def _layer(torch_gen, k=128, n=24, mode="zero_point", bits=4, group_size=32, bias=True):
    qw = quantize_weight(torch.randn(n, k, generator=torch_gen),
                         QuantConfig(bits=bits, group_size=group_size, mode=mode))
    perm = torch.randperm(k, generator=torch_gen)
    b = torch.randn(n, generator=torch_gen) if bias else None
    return QuantLinear.from_quantized(qw, b, input_perm=perm), qw, perm, b


@pytest.mark.parametrize("bits,group_size,mode", [(4, 32, "zero_point"), (4, 128, "sym"), (8, -1, "sym"),
                                                  (8, 64, "offset")])
def test_forward_and_weight_follow_the_permutation(bits, group_size, mode, torch_gen):
    layer, qw, perm, b = _layer(torch_gen, k=256, n=37, mode=mode, bits=bits, group_size=group_size)
    stored = dequantize_weight(qw, torch.float32)  # columns in perm order
    x = torch.randn(2, 5, 256, generator=torch_gen)
    want = F.linear(x[..., perm], stored, b)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer.dequantize()[:, perm], stored)  # original order: column perm[j] is stored column j
    assert torch.equal(layer.weight[:, perm], dequantize_weight(qw, qw.config.scale_dtype))
    torch.testing.assert_close(F.linear(x, layer.dequantize(), b), want, rtol=1e-5, atol=1e-5)
    assert layer.act_order and "act_order=True" in repr(layer)


def test_op_takes_the_permutation_and_its_gradient(torch_gen):
    """With a gradient to record, forward goes through torch.library's op, which takes the permutation itself (the
    GEMVs gather x while reading it); its backward returns the gradient in the original input order."""
    layer, qw, perm, b = _layer(torch_gen, k=256, n=37)
    stored = dequantize_weight(qw, torch.float32)
    x = torch.randn(3, 256, generator=torch_gen, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)
    want = F.linear(ref_x[..., perm], stored, b)
    y = layer(x)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    g = torch.randn(want.shape, generator=torch_gen)
    y.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    args = (layer.qweight, layer.scales, layer.zeros, layer.offsets, layer.bias, 4, 32, "zero_point", 37, 256,
            -math.inf, math.inf)
    torch.testing.assert_close(torch.ops.mixgemm.linear_wxa16(x.detach(), *args, perm), want.detach(), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match=r"input_perm must be int64 \[256\]"):
        torch.ops.mixgemm.linear_wxa16(x.detach(), *args, perm.int())
    torch.library.opcheck(torch.ops.mixgemm.linear_wxa16.default, (x.detach(), *args, perm))


def test_state_dict_round_trip(tmp_path, torch_gen):
    layer, _, perm, _ = _layer(torch_gen)
    sd = layer.state_dict()
    assert torch.equal(sd["input_perm"], perm) and sd["input_perm"].dtype == torch.int64
    save_file(sd, tmp_path / "m.safetensors")
    fresh = QuantLinear(128, 24, bits=4, group_size=32, mode="zero_point", act_order=True, bias_dtype=torch.float32)
    fresh.load_state_dict(load_file(tmp_path / "m.safetensors"))
    x = torch.randn(3, 128, generator=torch_gen)
    assert torch.equal(fresh(x), layer(x))
    twin = copy.deepcopy(layer).half()
    assert twin.input_perm.dtype == torch.int64 and torch.equal(twin.input_perm, perm)
    # an ordinary module refuses an act-order state dict, and the other way round, with a clear error
    plain = QuantLinear(128, 24, bits=4, group_size=32, mode="zero_point")
    with pytest.raises(ValueError, match="act-order .* present in the checkpoint and absent in the module"):
        plain.load_state_dict(sd, strict=False)
    corrupt = {**sd, "input_perm": torch.zeros_like(perm)}
    with pytest.raises(ValueError, match="not a permutation"):
        fresh.load_state_dict(corrupt)
    plain_sd = plain.state_dict()
    with pytest.raises(ValueError, match="act-order .* absent in the checkpoint and present in the module"):
        fresh.load_state_dict(plain_sd, strict=False)


def test_ordinary_layers_state_dict_unchanged(torch_gen):
    qw = quantize_weight(torch.randn(8, 64, generator=torch_gen), QuantConfig(group_size=32))
    layer = QuantLinear.from_quantized(qw)
    sd = layer.state_dict()
    assert set(sd) == {"qweight", "scales", "zeros", "offsets", "_extra_state"}
    assert sd["_extra_state"].tolist() == [1, 4, 32, 0, 0, 0, 8, 64]  # version 1, as before act-order existed
    assert layer.input_perm is None and not layer.act_order


def test_bad_permutation_is_clear(torch_gen):
    qw = quantize_weight(torch.randn(8, 64, generator=torch_gen), QuantConfig(group_size=32))
    with pytest.raises(ValueError, match=r"input_perm must have shape \(64,\)"):
        QuantLinear.from_quantized(qw, input_perm=torch.arange(32))
    with pytest.raises(ValueError, match="not a permutation"):
        QuantLinear.from_quantized(qw, input_perm=torch.zeros(64, dtype=torch.int64))
    with pytest.raises(TypeError, match="integer tensor"):
        QuantLinear.from_quantized(qw, input_perm=torch.arange(64).float())
    with pytest.raises(ValueError, match="weight-only"):
        QuantLinear.from_quantized(qw, input_perm=torch.arange(64), act_mode="sym")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 33])
def test_act_order_cuda_and_cuda_graph(m, torch_gen):
    layer, qw, perm, b = _layer(torch_gen, k=512, n=256)
    layer = layer.cuda()
    x = torch.randn(m, 512, generator=torch_gen).half().cuda()
    want = F.linear(x.float()[:, perm.cuda()], dequantize_weight(qw, torch.float32).cuda(), b.cuda())
    got = layer(x)
    # norm-wise against the float32 reference, the fp16 tolerance of the GEMV tests (an elementwise bound trips on
    # near-zero outputs: the fp16 GEMV accumulates in half2)
    err = float((got.double() - want.double()).norm() / want.double().norm())
    assert err <= 2e-3, err
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    layer(static_x)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    static_x.copy_(torch.randn(m, 512, generator=torch_gen).half().cuda())
    graph.replay()
    torch.testing.assert_close(static_y, layer(static_x), rtol=0, atol=0)
