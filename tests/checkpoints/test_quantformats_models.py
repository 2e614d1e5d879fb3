"""Whole tiny Llamas written as GPTQ (v1; v2 with act-order), AWQ and compressed-tensors (int4 group 128, int8
channel) checkpoint directories (config.json with the format's quantization_config + model.safetensors), loaded
through the converters: the logits equal those of the float model built from the library's own dequantization.

The libraries dequantize in the scale dtype (fp16 / bf16); mixgemm holds the exact products (q - z) * s, so the
float reference evaluates the library's formula with the scales upcast to float32 (exact: each product fits),
after checking that it rounds to the library's own output, and the logits agree to float32 rounding.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from mixgemm.formats.weight import QuantConfig, quantize_weight
from mixgemm.integrations.hf import llama_config, random_llama
from mixgemm.nn.linear import QuantLinear
from quantformat_checkpoints import CASES, WRITERS, Case

# hidden 128 so that every K (128, 256) holds a group of 128
CONFIG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2)


def write_checkpoint(case: Case, directory, seed=0):
    """Write a tiny random Llama in ``case``'s format; returns the float reference model (the library's
    dequantization of every quantized layer, exact in float32)."""
    gen = torch.Generator().manual_seed(seed)
    model = random_llama(llama_config(**CONFIG), seed=seed)
    tensors, quantized, shared = {}, set(), {}
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        t, native, exact = WRITERS[case.fmt](name, mod.weight.detach(), case.quantization_config, gen, shared)
        assert native.dtype != torch.float32 and torch.equal(exact.to(native.dtype), native)
        tensors.update({f"{name}.{key}": v for key, v in t.items()})
        quantized.add(name)
        mod.weight = nn.Parameter(exact.float(), requires_grad=False)
    for key, v in model.state_dict().items():
        if key.rsplit(".", 1)[0] not in quantized:
            tensors[key] = v.contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = case.quantization_config
    config["torch_dtype"] = config["dtype"] = "float32"
    (directory / "config.json").write_text(json.dumps(config))
    return model


class SafetensorsSource:
    def __init__(self, path):
        self._file = safe_open(str(path), framework="pt")

    def keys(self):
        return self._file.keys()

    def get(self, name):
        return self._file.get_tensor(name)


def load_with_converters(directory, fmt) -> nn.Module:
    """A test-local loader: the float skeleton from config.json, every quantized Linear replaced by a QuantLinear
    from ``fmt.convert_linear``, the other tensors loaded as stored."""
    from transformers import LlamaConfig

    config = json.loads((directory / "config.json").read_text())
    qc = config.pop("quantization_config")
    assert fmt.matches(qc)
    model = random_llama(LlamaConfig.from_dict(config), seed=123)  # every tensor is overwritten below
    source = SafetensorsSource(directory / "model.safetensors")
    layers = fmt.quantized_linears(source, qc)
    assert len(layers) == 7 * CONFIG["num_hidden_layers"]
    for prefix in layers:
        conv = fmt.convert_linear(source, prefix, qc)
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent), child,
                QuantLinear.from_quantized(conv.weight, conv.bias, input_perm=conv.input_perm))
    names = list(source.keys())
    floats = {k: source.get(k) for k in names if k.rsplit(".", 1)[0] not in layers}
    missing, unexpected = model.load_state_dict(floats, strict=False)
    assert not unexpected
    assert all(k.rsplit(".", 1)[0] in layers for k in missing)
    return model


def _assert_same_logits(model, reference):
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_checkpoint_loads_and_matches_library_dequantization(case, tmp_path):
    reference = write_checkpoint(case, tmp_path)
    model = load_with_converters(tmp_path, case.fmt)
    quant = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(quant) == 7 * CONFIG["num_hidden_layers"]
    assert any(m.act_order for m in quant) == (case.name == "gptq-v2-actorder-g32")
    _assert_same_logits(model, reference)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_from_pretrained_reads_the_checkpoint(case, tmp_path):
    import mixgemm

    reference = write_checkpoint(case, tmp_path)
    model = mixgemm.from_pretrained(str(tmp_path), dtype=torch.float32, progress=False)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 7 * CONFIG["num_hidden_layers"]
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(CONFIG["num_hidden_layers"])]
    if case.name == "gptq-v2-actorder-g32":  # down's permutation went into gate / up; q / k / v / o keep theirs
        assert model.mixgemm_report.perm_folded == downs
        assert not any(model.get_submodule(d).act_order for d in downs)
        assert model.get_submodule("model.layers.0.self_attn.q_proj").act_order
        _assert_same_logits(model, reference)
        # q / k / v and gate / up (the checkpoint gives them shared permutations) take theirs from the norm under
        # torch.compile; a second pass finds nothing left
        assert model.mixgemm_report.perm_at_norms == [
            f"model.layers.{i}.{name}" for i in range(CONFIG["num_hidden_layers"])
            for name in ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")]
        assert mixgemm.gather_act_order_at_norms(model) == []
        q = model.get_submodule("model.layers.0.self_attn.q_proj")
        assert q.act_order and q.input_gathered_by == "model.layers.0.input_layernorm"
        assert model.get_submodule("model.layers.0.self_attn.o_proj").input_gathered_by is None
        assert "fed gathered by their norm" in str(model.mixgemm_report)
    else:
        assert model.mixgemm_report.perm_folded == [] and model.mixgemm_report.perm_at_norms == []
    _assert_same_logits(model, reference)


class _NotGated(nn.Module):
    """Layers named like a gated MLP's, combined otherwise: its down permutation must stay."""

    def __init__(self, qw_gate, qw_up, qw_down, perm):
        super().__init__()
        self.gate_proj = QuantLinear.from_quantized(qw_gate)
        self.up_proj = QuantLinear.from_quantized(qw_up)
        self.down_proj = QuantLinear.from_quantized(qw_down, input_perm=perm)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x) + self.up_proj(x))


def test_fold_leaves_other_mlps_and_the_input_tensors_alone():
    from transformers.models.llama.modeling_llama import LlamaMLP

    from mixgemm.nn.fold_perm import GATED_MLPS, fold_mlp_input_perms, gated_mlp_form

    gen = torch.Generator().manual_seed(3)
    cfg = QuantConfig(bits=4, group_size=32, mode="zero_point")
    gate, up = (quantize_weight(torch.randn(96, 64, generator=gen), cfg) for _ in range(2))
    down = quantize_weight(torch.randn(64, 96, generator=gen), cfg)
    perm = torch.randperm(96, generator=gen)
    odd = _NotGated(gate, up, down, perm)
    assert gated_mlp_form(odd) is None and gated_mlp_form(LlamaMLP(llama_config(**CONFIG))) is GATED_MLPS[0]
    assert fold_mlp_input_perms(odd) == [] and odd.down_proj.act_order

    mlp = LlamaMLP(llama_config(**{**CONFIG, "hidden_size": 64, "intermediate_size": 96}))
    mlp.gate_proj, mlp.up_proj = QuantLinear.from_quantized(gate), QuantLinear.from_quantized(up)
    mlp.down_proj = QuantLinear.from_quantized(down, input_perm=perm)
    x = torch.randn(5, 64, generator=gen)
    before_rows = gate.qweight.clone()
    want = mlp(x)
    assert fold_mlp_input_perms(mlp) == ["down_proj"]
    assert not mlp.down_proj.act_order
    assert torch.equal(gate.qweight, before_rows)  # the QuantizedWeight handed in is not modified
    assert torch.equal(mlp.gate_proj.qweight, before_rows[perm])
    torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-6)


def test_fold_into_a_fused_gate_up_projection():
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    from mixgemm.nn.fold_perm import GATED_MLPS, fold_mlp_input_perms, gated_mlp_form

    gen = torch.Generator().manual_seed(4)
    cfg = QuantConfig(bits=4, group_size=32, mode="sym")
    mlp = Phi3MLP(Phi3Config(hidden_size=64, intermediate_size=96))
    assert gated_mlp_form(mlp) is GATED_MLPS[1]
    mlp.gate_up_proj = QuantLinear.from_quantized(quantize_weight(torch.randn(192, 64, generator=gen), cfg),
                                                  torch.randn(192, generator=gen))
    mlp.down_proj = QuantLinear.from_quantized(quantize_weight(torch.randn(64, 96, generator=gen), cfg),
                                               input_perm=torch.randperm(96, generator=gen))
    x = torch.randn(5, 64, generator=gen)
    want = mlp(x)
    assert fold_mlp_input_perms(mlp) == ["down_proj"]
    assert not mlp.down_proj.act_order
    torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-6)


def test_act_order_model_saves_and_reloads(tmp_path):
    """A loaded act-order GPTQ model (down folded, q / k / v and gate / up gathered by their norms) written by
    save_pretrained reads back with the same logits, through mixgemm.from_pretrained and through transformers'
    AutoModelForCausalLM (the registered quantizer): each layer's permutation is in the checkpoint, the norms'
    gathers (runtime only) are not, and both loaders set them up again; down stays folded."""
    import transformers

    import mixgemm

    case = next(c for c in CASES if c.name == "gptq-v2-actorder-g32")
    src, out = tmp_path / "gptq", tmp_path / "saved"
    src.mkdir()
    reference = write_checkpoint(case, src)
    model = mixgemm.from_pretrained(str(src), dtype=torch.float32, progress=False)
    assert model.mixgemm_report.perm_at_norms
    assert not any("mixgemm_output_perm" in key for key in model.state_dict())
    model.save_pretrained(str(out))
    for again in (mixgemm.from_pretrained(str(out), progress=False),
                  transformers.AutoModelForCausalLM.from_pretrained(str(out))):
        layers = {n: m for n, m in again.named_modules() if isinstance(m, QuantLinear)}
        assert {n: m.act_order for n, m in layers.items()} == {
            n: m.act_order for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        assert {n: m.input_gathered_by for n, m in layers.items()} == {
            n: m.input_gathered_by for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        _assert_same_logits(again, reference)


def test_saved_act_order_layer_without_its_permutation_is_an_error(tmp_path):
    from safetensors.torch import load_file

    import mixgemm

    case = next(c for c in CASES if c.name == "gptq-v2-actorder-g32")
    src, out = tmp_path / "gptq", tmp_path / "saved"
    src.mkdir()
    write_checkpoint(case, src)
    mixgemm.from_pretrained(str(src), dtype=torch.float32, progress=False).save_pretrained(str(out))
    (path,) = out.glob("*.safetensors")
    tensors = load_file(str(path))
    del tensors["model.layers.1.self_attn.o_proj.input_perm"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="'model.layers.1.self_attn.o_proj.input_perm' is missing"):
        mixgemm.from_pretrained(str(out), progress=False)
