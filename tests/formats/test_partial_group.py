"""Weights whose K the group size does not divide (an MoE expert's K = 960 in groups of 128, GPTQ's ceil(K / group)
scale rows): G = ceil(K / group_size) groups, the last one partial, its parameters from its own k alone.

CPU: the format (parameters, codes, half-a-step bound, from_codes, per-k parameter spread), every kernel layout's
codes and finite parameters, the CPU matmul, HQQ / GPTQ / integer scales, quantize_, state dicts and mixmgemm's
checkpoint, GPTQ checkpoints with a partial group, row-parallel shards, and the int8-activation format's clear
refusal; the Triton GEMM under the interpreter.
GPU (gpu, sm_90): every weight-only linear entry, forced, against the float64 reference; a compacted layer.
"""

from __future__ import annotations

import pytest
import torch
from test_odd_k import (
    INTERP,
    LINEAR_ENTRIES,
    TOL,
    check_cpu_matmul,
    check_forced_entry,
    check_round_trip,
    check_triton_gemm,
    needs_sm90,
)

import mixgemm
from mixgemm.formats.weight import MODES, dequantize_weight, from_codes, quantize_weight
from mixgemm.nn.linear import QuantLinear
from mixgemm.reference.matmul import matmul as ref_matmul

# (K, group size): 7.5 groups of 128, 3.125 of 64, an odd K over 7.8 groups of 128, 2.5 of 32, one partial group
PARTIAL = ((960, 128), (200, 64), (1001, 128), (80, 32), (96, 128))


def _weight(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05 + torch.randn(n, 1, generator=g) * 0.02


def _qw(n, k, group, mode, bits=4, seed=0, device="cpu"):
    return quantize_weight(_weight(n, k, seed), bits=bits, group_size=group, mode=mode).to(device)


# ------------------------------------------------------------------------------------------- format
@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, group", PARTIAL)
def test_the_partial_group_is_its_own_k(k, group, mode, bits):
    """G = ceil(K / group) parameter columns; the last group's parameters and codes are those of its k quantized
    alone; every weight within half a step; from_codes round-trips; the input is not modified."""
    w = _weight(13, k, seed=k + bits)
    w0 = w.clone()
    qw = quantize_weight(w, bits=bits, group_size=group, mode=mode)
    ng = -(-k // group)
    assert torch.equal(w, w0) and qw.num_groups == ng and qw.group_size == group and qw.scales.shape == (13, ng)
    assert qw.qweight.shape == (13, (k * bits + 7) // 8)
    start = (ng - 1) * group
    tail = quantize_weight(w[:, start:].contiguous(), bits=bits, group_size=-1, mode=mode)
    assert torch.equal(qw.scales[:, -1], tail.scales[:, 0]) and torch.equal(qw.codes()[:, start:], tail.codes())
    for name in ("zeros", "offsets"):
        if getattr(qw, name) is not None:
            assert torch.equal(getattr(qw, name)[:, -1], getattr(tail, name)[:, 0])
    step = qw.scales.double().repeat_interleave(group, dim=1)[:, :k]  # each k's scale
    assert bool(((dequantize_weight(qw, torch.float64) - w.double()).abs() <= step / 2 * (1 + 1e-3) + 1e-9).all())
    again = from_codes(qw.codes(), qw.scales, qw.config, zeros=qw.zeros, offsets=qw.offsets)
    assert torch.equal(again.qweight, qw.qweight)
    csum, wsum = qw.centered_group_sums()
    want = dequantize_weight(qw, torch.float64)
    assert torch.allclose(wsum[:, -1], want[:, start:].sum(1), rtol=1e-9, atol=1e-9)
    assert csum.shape == (13, ng)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, group", PARTIAL)
def test_every_layout_holds_the_codes_and_finite_parameters(k, group, mode):
    """Each weight-only CUDA / Triton layout builder reads back the plain codes and holds a finite parameter for every
    group it reads (the partial group padded to the layout's k tiles)."""
    from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2, unpack_gemv_v2
    from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1, unpack_gemv_mma_v1
    from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1, unpack_wgmma_v1
    from mixgemm.kernels.triton_gemm.layout import build_triton_gemm_v1

    qw = _qw(19, k, group, mode, seed=k)
    codes = qw.codes()
    for build, unpack in ((build_gemv_v2, unpack_gemv_v2), (build_gemv_mma_v1, unpack_gemv_mma_v1),
                          (build_wgmma_v1, unpack_wgmma_v1)):
        lay = build(qw)
        assert torch.equal(unpack(lay), codes), build.__name__
        assert lay.num_groups >= qw.num_groups and bool(torch.isfinite(lay.params.float()).all()), build.__name__
        assert lay.params.numel() % lay.num_groups == 0
    tri = build_triton_gemm_v1(qw)
    assert tri.scales.shape[0] >= qw.num_groups and torch.equal(tri.scales[: qw.num_groups, :19], qw.scales.T)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, group", PARTIAL)
def test_cpu_matmul_against_the_reference(k, group, mode, rel_err):
    check_cpu_matmul(_qw(24, k, group, mode, seed=k + 1), rel_err)


def test_hqq_gptq_and_integer_scales_quantize_partial_groups():
    """HQQ (with and without input weights), GPTQ (with act-order) and integer group scales give the format's shapes,
    and HQQ / GPTQ keep the error of their objective no worse than round to nearest's."""
    from mixgemm.formats.int_scales import int_group_scales, quantize_weight_int_scales
    from mixgemm.formats.weight import QuantConfig
    from mixgemm.quantize.gptq import GPTQParams, gptq_quantize_weight
    from mixgemm.quantize.hqq import hqq_quantize_weight

    k, group = 200, 64
    w = _weight(32, k, seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(512, k, generator=g) * (1 + 4 * torch.rand(k, generator=g))
    cfg = QuantConfig(bits=4, group_size=group, mode="zero_point")
    rtn = quantize_weight(w, cfg)
    out_err = lambda q: float((x @ (dequantize_weight(q) - w).T).norm())
    for imp in (None, x.square().mean(0)):
        h = hqq_quantize_weight(w, cfg, importance=imp)
        assert h.scales.shape == (32, 4) and h.zeros.shape == (32, 4)
        if imp is not None:
            assert out_err(h) <= out_err(rtn)
    for act_order in (False, True):
        res = gptq_quantize_weight(w, 2 * x.T @ x, cfg, GPTQParams(act_order=act_order))
        assert res.weight.scales.shape == (32, 4)
        wq = dequantize_weight(res.weight)
        if res.perm is not None:
            wq = torch.empty_like(wq).index_copy_(1, res.perm, wq)  # back to the input order
        assert float((x @ (wq - w).T).norm()) <= out_err(rtn)
    iq = quantize_weight_int_scales(w, group_size=group)
    assert iq.scales.shape == (32, 4) and int_group_scales(iq) is not None


def test_quantize_state_dict_and_checkpoint_round_trip(tmp_path):
    """A model whose down_proj has K = 200 in groups of 64 is quantized whole, saves and loads back bit for bit
    (mixgemm's format, through mixgemm.from_pretrained and transformers)."""
    from mixgemm.integrations.hf import llama_config, random_llama

    model = random_llama(llama_config(hidden_size=64, intermediate_size=200))
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=64, mode="zero_point"))
    name = "model.layers.0.mlp.down_proj"
    assert name in report.replaced and not report.skipped
    assert model.get_submodule(name).scales.shape == (64, 4)
    check_round_trip(model, name, tmp_path / "ok")
    fresh = QuantLinear(200, 64, group_size=64, mode="zero_point", bias=False)
    fresh.load_state_dict(model.get_submodule(name).state_dict())
    x = torch.randn(3, 200)
    assert torch.equal(fresh(x), model.get_submodule(name)(x))


@pytest.mark.parametrize("act_order", (False, True))
def test_gptq_checkpoint_with_a_partial_group(act_order):
    """A GPTQ layer with K = 200 in groups of 64 (4 scale rows, AutoGPTQ's ceil) converts to the same weight."""
    from mixgemm.checkpoints.gptq import GPTQFormat
    from quantformat_fixtures import DictSource, gptq_tensors

    t, want = gptq_tensors(24, 200, 4, 64, torch.Generator().manual_seed(3), act_order=act_order)
    conv = GPTQFormat().convert_linear(DictSource(t), "layer", {"bits": 4, "group_size": 64, "desc_act": act_order})
    got = dequantize_weight(conv.weight, torch.float64)
    if conv.input_perm is not None:
        got = torch.empty_like(got).index_copy_(1, conv.input_perm, got)
    assert conv.weight.scales.shape == (24, 4) and torch.equal(got.to(want.dtype), want)


def test_row_parallel_shards_re_group_a_partial_group():
    """K = 960 in groups of 128 over 2 ranks (480 each): a weight-only row split re-groups into groups of 32, whole on
    each rank; the shards reassemble the weight exactly. Activation-quantized layers refuse the cut by name."""
    from mixgemm.distributed.shard import ROWWISE, shard_quantized_weight

    qw = _qw(8, 960, 128, "offset", seed=9)
    shards = [shard_quantized_weight(qw, ROWWISE, r, 2, "mlp.down_proj", regroup=True) for r in range(2)]
    assert all(s.config.group_size == 32 and s.scales.shape == (8, 15) for s in shards)
    assert torch.equal(torch.cat([dequantize_weight(s, torch.float64) for s in shards], dim=1),
                       dequantize_weight(qw, torch.float64))
    with pytest.raises(ValueError, match=r"mlp.down_proj: row-parallel split .* not a multiple of the group size 128"):
        shard_quantized_weight(qw, ROWWISE, 0, 2, "mlp.down_proj")


def test_int8_activations_refuse_a_partial_group():
    from mixgemm.ops.int8 import matmul_a8

    qw = _qw(16, 960, 128, "sym", bits=8)
    for block in ("group", "token"):
        with pytest.raises(ValueError, match=r"K=960 ends in a partial group of 64 \(group size 128\): int8 "
                                             r"activations need whole groups"):
            matmul_a8(torch.randn(2, 960), qw, "sym", act_block=block)
    model = torch.nn.Sequential(torch.nn.Linear(960, 16), torch.nn.Linear(16, 1024))
    rep = mixgemm.quantize_(model, mixgemm.W8A8(group_size=128))
    assert "0" in rep.skipped and "partial group" in rep.skipped["0"]


def test_convolutions_keep_whole_groups():
    """A conv block must lie inside one tap: a QuantConv2d whose group does not divide Ci / groups is refused at
    construction (K = 3 x 3 x 48 = 432 would be 3.4 groups of 128)."""
    from mixgemm.nn.conv import QuantConv2d

    with pytest.raises(ValueError, match=r"group_size=128 must divide the input channels per group \(48\)"):
        QuantConv2d(48, 8, 3, group_size=128)


@INTERP
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, group", PARTIAL)
def test_interp_triton_gemm(k, group, mode, rel_err):
    check_triton_gemm(_qw(40, k, group, mode, seed=k), rel_err, k)


# ----------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("name", sorted(LINEAR_ENTRIES))
@pytest.mark.parametrize("mode", MODES)
def test_gpu_linear_entries(name, mode, rel_err):
    """Every weight-only linear entry that takes a partial group, forced: 4 bits on three K (7.5 groups of 128, an odd
    K over 7.8 groups of 128, 2.5 groups of 32), 8 bits on one (3.1 groups of 64)."""
    for bits, k, group in ((4, 960, 128), (4, 1001, 128), (4, 80, 32), (8, 200, 64)):
        check_forced_entry(name, _qw(203, k, group, mode, bits=bits, seed=k, device="cuda"), rel_err, k)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("mode", MODES)
def test_gpu_dispatched_and_compacted_layers(mode, rel_err):
    """What the registry picks by itself at every M, on a plain and on a compacted layer of K = 960 in groups of
    128, against the reference; the compacted layer's state dict keeps the plain codes."""
    lin = torch.nn.Linear(960, 4224)
    layer = QuantLinear.from_linear(lin, mixgemm.QuantConfig(bits=4, group_size=128, mode=mode))
    plain = layer.qweight.clone()
    g = torch.Generator().manual_seed(0)
    for compact in (False, True):
        dev = layer.to("cuda", torch.float16)
        dev.set_auto_compact(compact)
        for m in (1, 5, 16, 17, 600):
            x = torch.randn(m, 960, generator=g).to("cuda", torch.float16)
            with torch.no_grad():
                y = dev(x)
            ref = ref_matmul(x, dev.quantized_weight(), dev.bias, out_dtype=torch.float64)
            assert rel_err(y, ref) <= TOL[torch.float16], (compact, m, rel_err(y, ref))
        assert torch.equal(dev.state_dict()["qweight"].cpu(), plain)
