"""GPTQ, AWQ and compressed-tensors converters (mixgemm.checkpoints.gptq / awq / compressed_tensors), one layer at
a time: the converted QuantizedWeight (with its act-order permutation) dequantizes bit for bit to what the
format's own library computes, and bad checkpoints get clear errors naming the tensor.

GPTQ / AWQ fixtures come from tests/quantformat_fixtures.py (the libraries' packing and dequantization written
out); compressed-tensors fixtures from the compressed-tensors library itself (PackedQuantizationCompressor).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixgemm.checkpoints.awq import AWQ
from mixgemm.checkpoints.compressed_tensors import COMPRESSED_TENSORS
from mixgemm.checkpoints.gptq import GPTQ
from mixgemm.nn.linear import QuantLinear
from quantformat_fixtures import (
    DictSource,
    act_order_g_idx,
    awq_dequant,
    awq_pack_rows,
    awq_tensors,
    gptq_pack,
    gptq_tensors,
    random_codes,
    random_scales,
)


def _layer(converted):
    return QuantLinear.from_quantized(converted.weight, converted.bias, input_perm=converted.input_perm)


def _check_exact(converted, want: torch.Tensor, gen):
    """The layer's weight (original input order), rounded to the library's dtype, is bit for bit ``want``, and
    its forward is F.linear with its exact (float32) weight."""
    layer = _layer(converted)
    assert torch.equal(layer.dequantize(want.dtype), want)
    x = torch.randn(3, want.shape[1], generator=gen)
    bias = None if converted.bias is None else converted.bias.float()
    torch.testing.assert_close(layer(x), F.linear(x, layer.dequantize(torch.float32), bias), rtol=1e-5, atol=1e-5)


def _gptq_config(bits, group_size, v1=True, sym=False, desc_act=False):
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
            "checkpoint_format": "gptq" if v1 else "gptq_v2"}


# ---- GPTQ ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,group_size,n", [(4, 32, 40), (4, 64, 24), (4, 128, 72), (4, -1, 40), (8, 32, 36),
                                               (8, 128, 20), (8, -1, 12)])
@pytest.mark.parametrize("v1", [True, False])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_layer_dequantizes_exactly(bits, group_size, n, v1, sym, act_order, torch_gen):
    k = 256
    t, want = gptq_tensors(n, k, bits, group_size, torch_gen, sym=sym, v1=v1, act_order=act_order, bias=True)
    src = DictSource(t)
    assert GPTQ.quantized_linears(src, {}) == ["layer"]
    conv = GPTQ.convert_linear(src, "layer", _gptq_config(bits, group_size, v1, sym, act_order))
    assert conv.weight.mode == ("sym" if sym else "zero_point")
    assert conv.weight.config.scale_dtype == torch.float16
    assert (conv.input_perm is not None) == (act_order and group_size != -1)
    _check_exact(conv, want, torch_gen)


def test_gptq_trivial_g_idx_or_none_needs_no_permutation(torch_gen):
    t, want = gptq_tensors(16, 128, 4, 32, torch_gen)
    conv = GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 32))
    assert conv.input_perm is None
    del t["layer.g_idx"]  # old AutoGPTQ checkpoints without g_idx
    conv2 = GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 32))
    assert conv2.input_perm is None and torch.equal(_layer(conv2).dequantize(torch.float16), want)


def test_gptq_act_order_permutes_groups_contiguous(torch_gen):
    t, _ = gptq_tensors(16, 128, 4, 32, torch_gen, act_order=True)
    conv = GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 32))
    g_idx = t["layer.g_idx"].long()
    assert torch.equal(g_idx[conv.input_perm], torch.arange(128) // 32)


def test_gptq_bad_inputs_are_clear(torch_gen):
    t, _ = gptq_tensors(16, 128, 4, 32, torch_gen, act_order=True)
    before = {key: v.clone() for key, v in t.items()}
    with pytest.raises(ValueError, match=r"layer.qweight.*3-bit"):
        GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(3, 32))
    with pytest.raises(ValueError, match=r"layer.qweight.*group size 16"):
        GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 16))
    with pytest.raises(ValueError, match=r"marlin"):
        GPTQ.convert_linear(DictSource(t), "layer", {**_gptq_config(4, 32), "checkpoint_format": "marlin"})
    with pytest.raises(ValueError, match=r"layer.scales: expected shape"):  # config says 64, tensors hold 32
        GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 64))
    unequal = dict(t)
    g_idx = t["layer.g_idx"].clone()
    g_idx[g_idx == 1] = 0  # group 0 gets 64 members, group 1 none
    unequal["layer.g_idx"] = g_idx
    with pytest.raises(ValueError, match=r"layer.g_idx: act-order groups must each hold exactly 32"):
        GPTQ.convert_linear(DictSource(unequal), "layer", _gptq_config(4, 32))
    wrong_dtype = {**t, "layer.qweight": t["layer.qweight"].to(torch.int64)}
    with pytest.raises(ValueError, match=r"layer.qweight: expected an int32"):
        GPTQ.convert_linear(DictSource(wrong_dtype), "layer", _gptq_config(4, 32))
    short = {**t, "layer.qzeros": t["layer.qzeros"][:, :1]}
    with pytest.raises(ValueError, match=r"layer.qzeros.*int32 words"):
        GPTQ.convert_linear(DictSource(short), "layer", _gptq_config(4, 32))
    GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 32))
    assert all(torch.equal(t[key], v) for key, v in before.items())  # inputs are not modified


def test_gptq_transposed_qweight_is_named(torch_gen):
    t, _ = gptq_tensors(64, 128, 4, 32, torch_gen)
    bad = {**t, "layer.qweight": t["layer.qweight"].T.contiguous()}
    with pytest.raises(ValueError, match=r"layer.qweight: shape \(64, 16\) is not \[K \* 4 / 32, N\].*transposed"):
        GPTQ.convert_linear(DictSource(bad), "layer", _gptq_config(4, 32))


def test_gptq_v1_wrapped_zero_is_reported(torch_gen):
    """AutoGPTQ's v1 pack stores z - 1; a zero of 0 wraps and decodes to 2**bits, which mixgemm cannot hold."""
    n, k = 8, 64
    codes = random_codes(n, k, 4, torch_gen)
    zeros = torch.randint(1, 16, (n, 2), generator=torch_gen)
    qweight, _ = gptq_pack(codes, zeros, 4, v1=True)
    _, qzeros = gptq_pack(codes, torch.full((n, 2), 16), 4, v1=True)  # every stored nibble 15 -> z = 16
    t = {"layer.qweight": qweight, "layer.qzeros": qzeros, "layer.scales": random_scales((2, n), torch.float16,
                                                                                         torch_gen)}
    with pytest.raises(ValueError, match=r"layer.qzeros: a v1 zero point decodes to 16"):
        GPTQ.convert_linear(DictSource(t), "layer", _gptq_config(4, 32))


# ---- AWQ -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_size,n", [(32, 40), (64, 24), (128, 72), (-1, 16)])
def test_awq_layer_dequantizes_exactly(group_size, n, torch_gen):
    t, want = awq_tensors(n, 256, group_size, torch_gen, bias=True)
    src = DictSource(t)
    assert AWQ.quantized_linears(src, {}) == ["layer"]
    conv = AWQ.convert_linear(src, "layer", {"quant_method": "awq", "version": "gemm", "bits": 4,
                                             "group_size": group_size, "zero_point": True})
    assert conv.weight.mode == "zero_point" and conv.input_perm is None
    _check_exact(conv, want, torch_gen)


def test_awq_zero_point_false_loads_sym_when_zeros_are_the_midpoint(torch_gen):
    """GPTQModel's default AWQ export: zero_point false, every stored zero 8."""
    n, k, g = 40, 256, 64
    codes = random_codes(n, k, 4, torch_gen)
    scales = random_scales((k // g, n), torch.float16, torch_gen)
    qweight, qzeros = awq_pack_rows(codes.T), awq_pack_rows(torch.full((k // g, n), 8))
    t = {"layer.qweight": qweight, "layer.qzeros": qzeros, "layer.scales": scales}
    qc = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": g, "zero_point": False}
    conv = AWQ.convert_linear(DictSource(t), "layer", qc)
    assert conv.weight.mode == "sym"
    _check_exact(conv, awq_dequant(qweight, qzeros, scales, g), torch_gen)
    zeros = torch.full((k // g, n), 8)
    zeros[1, 3] = 7
    with pytest.raises(ValueError, match=r"layer.qzeros: the config says zero_point=false.*7 .. 8, not all 8"):
        AWQ.convert_linear(DictSource({**t, "layer.qzeros": awq_pack_rows(zeros)}), "layer", qc)


def test_awq_bad_inputs_are_clear(torch_gen):
    t, _ = awq_tensors(16, 128, 32, torch_gen)
    qc = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32, "zero_point": True}
    with pytest.raises(ValueError, match=r"version 'gemv'"):
        AWQ.convert_linear(DictSource(t), "layer", {**qc, "version": "gemv"})
    with pytest.raises(ValueError, match=r"layer.qweight.*4-bit only"):
        AWQ.convert_linear(DictSource(t), "layer", {**qc, "bits": 8})
    with pytest.raises(ValueError, match=r"layer.qweight.*group size 48"):
        AWQ.convert_linear(DictSource(t), "layer", {**qc, "group_size": 48})
    with pytest.raises(ValueError, match=r"layer.scales: expected 2 groups"):
        AWQ.convert_linear(DictSource(t), "layer", {**qc, "group_size": 64})
    with pytest.raises(ValueError, match=r"layer.qweight.*int32 words"):
        AWQ.convert_linear(DictSource({**t, "layer.qweight": t["layer.qweight"][:, :1]}), "layer", qc)


# ---- compressed-tensors --------------------------------------------------------------------------------
def ct_tensors(n, k, bits, symmetric, strategy, group_size, dtype, gen, prefix="layer"):
    """A layer compressed by compressed-tensors' own PackedQuantizationCompressor from a random float weight,
    and the library's own decompression: (tensors, reference float weight [N, K], the scheme as a dict)."""
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=bits, symmetric=symmetric, strategy=strategy, group_size=group_size)
    scheme = QuantizationScheme(targets=["Linear"], weights=args, format="pack-quantized")
    w = torch.randn(n, k, generator=gen).to(dtype)
    g = group_size or k
    wg = w.reshape(n, k // g, g)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    sd = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    want = PackedQuantizationCompressor.decompress(dict(sd), scheme)["weight"]
    return {f"{prefix}.{key}": v for key, v in sd.items()}, want, scheme.model_dump(mode="json")


def _ct_config(scheme: dict, **kw) -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": scheme},
            "ignore": ["lm_head"], "quantization_status": "compressed", **kw}


@pytest.mark.parametrize("bits,strategy,group_size", [(4, "group", 32), (4, "group", 128), (4, "channel", None),
                                                      (8, "group", 64), (8, "channel", None)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_compressed_tensors_layer_dequantizes_exactly(bits, strategy, group_size, symmetric, dtype, torch_gen):
    t, want, scheme = ct_tensors(37, 256, bits, symmetric, strategy, group_size, dtype, torch_gen)
    src = DictSource(t)
    assert COMPRESSED_TENSORS.quantized_linears(src, {}) == ["layer"]
    conv = COMPRESSED_TENSORS.convert_linear(src, "layer", _ct_config(scheme))
    assert conv.weight.mode == ("sym" if symmetric else "zero_point")
    assert conv.weight.config.scale_dtype == dtype
    assert conv.weight.config.group_size == (group_size or -1)
    assert want.dtype == dtype
    _check_exact(conv, want, torch_gen)


def test_compressed_tensors_act_order_g_idx_and_unpacked_zero_point(torch_gen):
    """Older exports: weight_g_idx (actorder "group") and int8 zero points stored unpacked, w = (c - zp) * s."""
    n, k, g = 24, 128, 32
    signed = random_codes(n, k, 4, torch_gen) - 8
    zp = torch.randint(-8, 8, (n, k // g), generator=torch_gen, dtype=torch.int8)
    scale = random_scales((n, k // g), torch.float16, torch_gen)
    g_idx = act_order_g_idx(k, g, torch_gen)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    t = {"layer.weight_packed": pack_to_int32(signed.to(torch.int8), 4), "layer.weight_scale": scale,
         "layer.weight_zero_point": zp, "layer.weight_shape": torch.tensor([n, k]), "layer.weight_g_idx": g_idx}
    want = (scale[:, g_idx.long()] * (signed - zp[:, g_idx.long()].long())).to(torch.float16)
    scheme = {"targets": ["re:.*layer$"], "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                      "strategy": "group", "group_size": g, "actorder": "group"}}
    conv = COMPRESSED_TENSORS.convert_linear(DictSource(t), "layer", _ct_config(scheme))
    assert conv.input_perm is not None
    _check_exact(conv, want, torch_gen)


def test_compressed_tensors_scheme_matching_and_bad_inputs(torch_gen):
    t, _, scheme = ct_tensors(16, 128, 4, True, "group", 32, torch.float16, torch_gen, prefix="model.q_proj")
    src = DictSource(t)
    w8 = {**scheme, "targets": ["model.q_proj"], "weights": {**scheme["weights"], "num_bits": 8}}
    # an exact name beats the class target: this layer is read as 8-bit, and its packed width disagrees
    with pytest.raises(ValueError, match=r"model.q_proj.weight_packed: 16 int32 words.*128 8-bit codes"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", {**_ct_config(scheme),
                                                                "config_groups": {"a": scheme, "b": w8}})
    with pytest.raises(ValueError, match=r"model.q_proj: stored quantized, but no .*config_groups"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config({**scheme, "targets": ["re:.*k_proj"]}))
    for group_fmt, top_fmt in (("int-quantized", "pack-quantized"), (None, "int-quantized")):  # a group's wins
        with pytest.raises(ValueError, match=r"format 'int-quantized'"):
            COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config({**scheme, "format": group_fmt},
                                                                              format=top_fmt))
    with pytest.raises(ValueError, match=r"model.q_proj: compressed-tensors scheme .*A8 int tensor static.*static"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config(
            {**scheme, "input_activations": {"num_bits": 8, "strategy": "tensor", "dynamic": False}}))
    with pytest.raises(ValueError, match=r"model.q_proj.weight_packed.*2-bit"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config(
            {**scheme, "weights": {**scheme["weights"], "num_bits": 2}}))
    with pytest.raises(ValueError, match=r"model.q_proj.weight_scale.*group size 16"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config(
            {**scheme, "weights": {**scheme["weights"], "group_size": 16}}))
    with pytest.raises(ValueError, match=r"model.q_proj.weight_scale: expected shape \(16, 2\)"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config(
            {**scheme, "weights": {**scheme["weights"], "group_size": 64}}))
    with pytest.raises(ValueError, match=r"model.q_proj.weight_zero_point: missing"):
        COMPRESSED_TENSORS.convert_linear(src, "model.q_proj", _ct_config(
            {**scheme, "weights": {**scheme["weights"], "symmetric": False}}))
    with pytest.raises(ValueError, match=r"model.q_proj.weight_packed: expected 8 rows"):
        COMPRESSED_TENSORS.convert_linear(DictSource({**t, "model.q_proj.weight_shape": torch.tensor([8, 128])}),
                                          "model.q_proj", _ct_config(scheme))


def _int_quantized(n, k, gen, symmetric=True, strategy="channel", group_size=None, prefix="layer"):
    """A layer compressed by compressed-tensors' own IntQuantizationCompressor (llm-compressor's W8A8 format) and
    its scheme, with the library's own fp32 decompression."""
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=8, symmetric=symmetric, strategy=strategy, group_size=group_size)
    acts = QuantizationArgs(num_bits=8, symmetric=True, strategy="token", dynamic=True)
    scheme = QuantizationScheme(targets=["Linear"], weights=args, input_activations=acts, format="int-quantized")
    w = torch.randn(n, k, generator=gen).to(torch.float16)
    g = group_size or k
    wg = w.reshape(n, k // g, g)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    sd = IntQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    exact = {key: v.float() if v.is_floating_point() else v for key, v in sd.items()}
    want = IntQuantizationCompressor.decompress(exact, scheme)["weight"]
    return {f"{prefix}.{key}": v for key, v in sd.items()}, want, scheme.model_dump(mode="json")


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("strategy,group_size", [("channel", None), ("group", 64)])
def test_compressed_tensors_int_quantized_w8a8_is_exact_and_per_token(symmetric, strategy, group_size, torch_gen):
    t, want, scheme = _int_quantized(40, 128, torch_gen, symmetric, strategy, group_size)
    src = DictSource(t)
    assert COMPRESSED_TENSORS.quantized_linears(src, {}) == ["layer"]
    conv = COMPRESSED_TENSORS.convert_linear(src, "layer", _ct_config(scheme, format="int-quantized"))
    assert (conv.act_mode, conv.act_block, conv.weight.config.bits) == ("sym_full", "token", 8)
    assert conv.weight.mode == ("sym" if symmetric else "zero_point")
    assert torch.equal(_layer(conv).dequantize(torch.float32), want.float())


def test_compressed_tensors_schemes_mixgemm_cannot_hold_are_refused_by_name(torch_gen):
    t, _, scheme = _int_quantized(16, 128, torch_gen)
    src = DictSource(t)
    static = {**scheme, "input_activations": {**scheme["input_activations"], "dynamic": False, "strategy": "tensor"}}
    with pytest.raises(ValueError, match=r"layer: compressed-tensors scheme \(format 'int-quantized', W8 int channel, "
                                         r"A8 int tensor static\): static"):
        COMPRESSED_TENSORS.convert_linear(src, "layer", _ct_config(static))
    fp8 = {**scheme, "format": "float-quantized", "weights": {**scheme["weights"], "type": "float"}}
    fp8_src = DictSource({**t, "layer.weight": t["layer.weight"].view(torch.float8_e4m3fn)})
    assert COMPRESSED_TENSORS.quantized_linears(fp8_src, {}) == ["layer"]  # found, so never loaded as a float weight
    with pytest.raises(ValueError, match=r"layer: compressed-tensors scheme \(format 'float-quantized'.*not supported"):
        COMPRESSED_TENSORS.convert_linear(fp8_src, "layer", _ct_config(fp8))
    block = {**scheme, "weights": {**scheme["weights"], "strategy": "block", "block_structure": [32, 32]}}
    with pytest.raises(ValueError, match=r"layer.weight_scale: strategy 'block' is not supported"):
        COMPRESSED_TENSORS.convert_linear(src, "layer", _ct_config(block))
    with pytest.raises(ValueError, match=r"layer.weight: expected int8 codes"):
        COMPRESSED_TENSORS.convert_linear(DictSource({**t, "layer.weight": t["layer.weight"].float()}), "layer",
                                          _ct_config(scheme))
    out = {**scheme, "output_activations": {"num_bits": 8, "dynamic": True, "strategy": "token"}}
    with pytest.raises(ValueError, match=r"output activation quantization"):
        COMPRESSED_TENSORS.convert_linear(src, "layer", _ct_config(out))
