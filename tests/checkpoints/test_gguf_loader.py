"""mixgemm.from_pretrained on small GGUF files written with gguf.GGUFWriter, against transformers' own GGUF
loading (which dequantizes every tensor with gguf to float32)."""

from __future__ import annotations

import pytest
import torch

import mixgemm
from gguf_fixtures import within_half_step, write_tiny_llama
from mixgemm.nn.linear import QuantLinear

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gguf"))
    f = write_tiny_llama(d)
    ours = mixgemm.from_pretrained(d, gguf_file=f, progress=False, dtype=torch.float32)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    return d, f, ours, ref


def test_every_type_matches_transformers_dequantization(tiny):
    _, _, ours, ref = tiny
    layers = {n: m for n, m in ours.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 8  # 7 per layer + the untied lm_head (Q5_1)
    assert not ours.mixgemm_report.inexact  # (Q6_K in 8-bit groups of 16)
    assert ours.model.layers[0].self_attn.v_proj.config.group_size == 16
    for name, mod in layers.items():
        got, want = mod.dequantize(torch.float32), ref.get_submodule(name).weight.detach()
        assert torch.equal(got, want), name  # incl. q / k (Q4_K / Q5_K) after transformers' row permutation
    for name, p in ref.named_parameters():
        if "norm" in name or "embed" in name:
            assert torch.equal(ours.get_parameter(name), p), name


def test_logits_match(tiny, rel_err):
    _, _, ours, ref = tiny
    ids = torch.randint(0, 320, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids).logits, ref(ids).logits
    assert rel_err(a, b) < 1e-5  # every layer exact (Q6_K in groups of 16): float32 rounding


def test_file_path_form_and_dtype(tiny):
    d, f, _, _ = tiny
    m = mixgemm.from_pretrained(f"{d}/{f}", dtype=torch.bfloat16, progress=False)
    assert m.model.embed_tokens.weight.dtype == torch.bfloat16 and m.model.norm.weight.dtype == torch.bfloat16
    assert isinstance(m.model.layers[0].self_attn.q_proj, QuantLinear)


def test_low_bit_types_requantized_at_the_width_asked(tmp_path):
    """IQ4_XS Linears load re-quantized (8-bit by default, 4-bit offset with gguf_requantize_bits=4), each listed in
    the report with its width, within half a step of transformers' dequantization; Q2_K / Q3_K exact in 8-bit groups
    of 16 by default, re-quantized with gguf_requantize_bits=4 (the file's size class)."""
    f = write_tiny_llama(str(tmp_path), types={"ffn_up": "Q2_K", "ffn_gate": "Q3_K", "attn_output": "IQ4_XS"},
                         name="low.gguf")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f, dtype=torch.float32).eval()
    for bits in (8, 4):
        m = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32,
                                    gguf_requantize_bits=bits)
        for name, qtype in (("model.layers.0.mlp.up_proj", "Q2_K"), ("model.layers.0.mlp.gate_proj", "Q3_K"),
                            ("model.layers.0.self_attn.o_proj", "IQ4_XS")):
            layer = m.get_submodule(name)
            assert isinstance(layer, QuantLinear) and layer.bits == bits, (name, bits)
            got, want = layer.dequantize(torch.float64), ref.get_submodule(name).weight.detach()
            if bits == 8 and qtype != "IQ4_XS":
                assert name not in m.mixgemm_report.inexact and layer.config.group_size == 16
                assert torch.equal(got.float(), want), name
                continue
            assert m.mixgemm_report.inexact[name] == f"GGUF {qtype} re-quantized to {bits}-bit group 32"
            assert within_half_step(got, want, layer.scales), (name, bits)
    with pytest.raises(ValueError, match="gguf_requantize_bits must be 8 or 4"):
        mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32, gguf_requantize_bits=2)


def test_float_linears_stay_float_or_quantize_on_load(tmp_path):
    f = write_tiny_llama(str(tmp_path), types={"output": "F32"}, name="f32out.gguf")
    m = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32)
    assert type(m.lm_head) is torch.nn.Linear and "lm_head" in m.mixgemm_report.skipped
    q = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32,
                                quantization_config=mixgemm.W8A16(group_size=32))
    assert isinstance(q.lm_head, QuantLinear) and q.lm_head.bits == 8
    ref = mixgemm.QuantLinear.from_linear(m.lm_head, mixgemm.W8A16(group_size=32).weight_config())
    assert torch.equal(q.lm_head.qweight, ref.qweight) and torch.equal(q.lm_head.scales, ref.scales)


def test_truncated_gguf_is_an_error_naming_the_file(tmp_path):
    f = write_tiny_llama(str(tmp_path), name="cut.gguf")
    path = tmp_path / f
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.gguf"):
        mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from gguf_fixtures import write_tiny_qwen3_moe

    d = str(tmp_path_factory.mktemp("gguf_moe"))
    f = write_tiny_qwen3_moe(d)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    return d, f, ref


def _experts_weights(module):
    return [torch.stack([q.dequantize(torch.float32) for q in getattr(module, p)]) for p in ("gate_up_proj",
                                                                                          "down_proj")]


def test_moe_experts_load_quantized_and_match_transformers(tiny_moe, rel_err):
    """llama.cpp's 3-D expert tensors (gate Q4_0, up Q4_1, down Q8_0) become one QuantLinear per expert and
    projection without a float round trip: gate and up rows in one layer, in the common exact format (offset), equal
    to transformers' dequantization of the file."""
    from mixgemm.nn.experts import QuantizedExperts

    d, f, ref = tiny_moe
    ours = mixgemm.from_pretrained(d, gguf_file=f, progress=False, dtype=torch.float32)
    report = ours.mixgemm_report
    assert report.ignored == [] and report.inexact == {}
    for i, layer in enumerate(ours.model.layers):
        experts = layer.mlp.experts
        assert isinstance(experts, QuantizedExperts)
        assert experts.gate_up_proj[0].mode == "offset" and experts.down_proj[0].bits == 8
        want = ref.model.layers[i].mlp.experts
        got = _experts_weights(experts)
        assert torch.equal(got[0], want.gate_up_proj.detach()) and torch.equal(got[1], want.down_proj.detach())
        assert f"model.layers.{i}.mlp.experts.gate_up_proj.3" in report.quantized
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_err(ours(ids).logits, ref(ids).logits) < 1e-5


def test_moe_experts_of_inexact_or_float_types(tmp_path, rel_err):
    from gguf_fixtures import write_tiny_qwen3_moe
    from mixgemm.nn.experts import QuantizedExperts

    d = str(tmp_path)
    f = write_tiny_qwen3_moe(d, types={"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q6_K", "ffn_down_exps": "Q6_K"},
                             name="k.gguf", hidden=256)
    ours = mixgemm.from_pretrained(d, gguf_file=f, progress=False, dtype=torch.float32)
    assert not ours.mixgemm_report.inexact  # Q4_K, and Q6_K in 8-bit groups of 16: exact
    gate_up0 = ours.model.layers[0].mlp.experts.gate_up_proj[0]  # Q4_K gate rows beside Q6_K up rows: groups of 16
    assert (gate_up0.bits, gate_up0.config.group_size, gate_up0.mode) == (8, 16, "offset")
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    gate_up, down = _experts_weights(ours.model.layers[0].mlp.experts)
    assert torch.equal(gate_up, ref.model.layers[0].mlp.experts.gate_up_proj.detach())
    assert torch.equal(down, ref.model.layers[0].mlp.experts.down_proj.detach())
    four = mixgemm.from_pretrained(d, gguf_file=f, progress=False, dtype=torch.float32, gguf_requantize_bits=4)
    assert four.mixgemm_report.inexact["model.layers.0.mlp.experts.down_proj.2"].startswith("GGUF Q6_K re-quantized")

    f = write_tiny_qwen3_moe(d, types={"ffn_gate_exps": "F16", "ffn_up_exps": "F16", "ffn_down_exps": "F32"},
                             name="f.gguf")
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    plain = mixgemm.from_pretrained(d, gguf_file=f, progress=False, dtype=torch.float32)
    experts = plain.model.layers[1].mlp.experts
    assert not isinstance(experts, QuantizedExperts)
    assert "stored as float" in plain.mixgemm_report.skipped["model.layers.1.mlp.experts"]
    assert torch.equal(experts.gate_up_proj, ref.model.layers[1].mlp.experts.gate_up_proj)
    quantized = mixgemm.from_pretrained(d, gguf_file=f, quantization_config=mixgemm.W4A16(group_size=32),
                                        progress=False)
    assert isinstance(quantized.model.layers[1].mlp.experts, QuantizedExperts)
    kept = mixgemm.from_pretrained(d, gguf_file="k.gguf", filter_fn=lambda mod, name: "experts" not in name,
                                   progress=False)
    assert kept.mixgemm_report.skipped["model.layers.0.mlp.experts"].startswith("excluded by filter_fn")
    assert not isinstance(kept.model.layers[0].mlp.experts, QuantizedExperts)


def test_moe_file_missing_an_expert_tensor_is_an_error(tmp_path):
    from gguf_fixtures import write_tiny_qwen3_moe

    f = write_tiny_qwen3_moe(str(tmp_path), drop=("blk.1.ffn_up_exps.weight",), name="cut.gguf")
    with pytest.raises(ValueError, match=r"lacks expert tensors of \['model.layers.1.mlp.experts.gate_up_proj'"):
        mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32)


def test_moe_expert_width_read_from_the_file(tmp_path):
    """transformers' GGUF config mapping reads no expert width for qwen3moe (the config class's 768 then): mixgemm
    takes the file's expert_feed_forward_length, and each expert's weights are the file's blocks."""
    import gguf

    from gguf_fixtures import write_tiny_qwen3_moe

    f = write_tiny_qwen3_moe(str(tmp_path), expert_ffn=256, name="w256.gguf")
    ours = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32)
    assert ours.config.moe_intermediate_size == 256
    reader = gguf.GGUFReader(str(tmp_path / f))
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down_exps.weight")
    want = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).copy()).reshape(4, 64, 256)
    got = torch.stack([q.dequantize(torch.float32) for q in ours.model.layers[0].mlp.experts.down_proj])
    assert torch.equal(got, want)


def test_quantized_embedding_held_as_float_is_reported_with_its_size(tmp_path):
    """A Q8_0 token embedding becomes the model's float Embedding (no quantized embedding type): the report states
    it and the size it takes in the file and in the model, which is what a re-saved model stores."""
    import gguf

    f = write_tiny_llama(str(tmp_path), types={"token_embd": "Q8_0"}, name="q8emb.gguf")
    m = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.bfloat16)
    emb = m.model.embed_tokens.weight
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    file_bytes = emb.numel() // block * size
    assert m.mixgemm_report.dequantized == {
        "model.embed_tokens.weight": f"GGUF Q8_0, {file_bytes} bytes in the file, {emb.numel() * 2} as torch.bfloat16 "
                                     "in the model"}
    assert "dequantized model.embed_tokens.weight: GGUF Q8_0" in str(m.mixgemm_report)
