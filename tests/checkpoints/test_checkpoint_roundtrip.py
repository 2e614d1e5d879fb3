"""save_pretrained -> from_pretrained of mixgemm models (mixgemm's own format), through mixgemm.from_pretrained and
through transformers' AutoModelForCausalLM (the registered quantizer); float checkpoints quantized on load;
corrupt and mismatched checkpoints."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import mixgemm
from mixgemm.integrations.hf import llama_config, random_llama
from mixgemm.nn.linear import QuantLinear

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# hidden 128 so that group 128 fits; attention biases so that QuantLinear biases are saved too
SHAPES = dict(hidden_size=128, intermediate_size=256, attention_bias=True)
PRECISIONS = {
    "w4a16-g32-offset-fp32": mixgemm.W4A16(group_size=32, mode="offset", scale_dtype=torch.float32),
    "w4a16-g128-zp-bf16": mixgemm.W4A16(group_size=128, mode="zero_point", scale_dtype=torch.bfloat16),
    "w8a16": mixgemm.W8A16(),
    "w8a8": mixgemm.W8A8(),
    "w4a8": mixgemm.W4A8(),
    "w4a8-token-int-scales": mixgemm.W4A8(act_block="token"),
}


def _quantized(config, **overrides):
    model = random_llama(llama_config(**{**SHAPES, **overrides}))
    report = mixgemm.quantize_(model, config)
    assert report.replaced
    return model


def _assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_round_trip_bit_exact(name, tmp_path):
    model = _quantized(PRECISIONS[name])
    if name == "w4a8-token-int-scales":
        assert PRECISIONS[name].uses_int_scales
    model.save_pretrained(tmp_path)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mixgemm" and len(qc["layers"]) == 2 * 7 + 1
    ours = mixgemm.from_pretrained(str(tmp_path), progress=False)
    assert all(isinstance(ours.get_submodule(n), QuantLinear) for n in qc["layers"])
    _assert_same(model, ours)
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # the quantizer registered by mixgemm
    _assert_same(model, auto)
    ours.save_pretrained(tmp_path / "again")  # what from_pretrained returns saves again
    _assert_same(model, mixgemm.from_pretrained(str(tmp_path / "again"), progress=False))
    # one resident layout per weight once on an sm_90 GPU (the default; on the CPU the codes stay plain)
    plain = mixgemm.from_pretrained(str(tmp_path), progress=False, compact=False)
    for m, want in ((ours, True), (auto, True), (plain, False)):
        layers = [q for q in m.modules() if isinstance(q, QuantLinear)]
        assert layers and all(q.auto_compact is want and q.compact is None for q in layers)


def test_tied_embeddings_stay_tied_and_shards_load(tmp_path):
    model = _quantized(mixgemm.W4A16(group_size=32), tie_word_embeddings=True)
    assert type(model.lm_head) is torch.nn.Linear
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = mixgemm.from_pretrained(str(tmp_path))  # with the progress bar
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    _assert_same(model, ours)


def test_import_mixgemm_registers_without_importing_transformers(tmp_path):
    _quantized(mixgemm.W8A16()).save_pretrained(tmp_path)
    code = ("import sys, mixgemm\n"
            "assert 'transformers' not in sys.modules, 'import mixgemm imported transformers'\n"
            "from transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
            "print(type(m.model.layers[0].mlp.down_proj).__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "QuantLinear"


def test_start_up_hook_loads_a_checkpoint_without_import_mixgemm(tmp_path):
    """An installed mixgemm's mixgemm-hf.pth (setup.py puts it in site-packages) registers the format at start-up:
    AutoModelForCausalLM reads a mixgemm checkpoint into QuantLinears in a process that never imports mixgemm, and
    its logits equal the saved model's. site.addsitedir runs the .pth as start-up runs site-packages' ones."""
    model = _quantized(mixgemm.W8A16()).eval()
    model.save_pretrained(tmp_path)
    src = os.path.dirname(os.path.dirname(os.path.abspath(mixgemm.__file__)))
    assert os.path.isfile(os.path.join(src, "mixgemm-hf.pth"))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    code = ("import site, sys\n"
            f"site.addsitedir({src!r})\n"
            "assert 'mixgemm' not in sys.modules and 'torch' not in sys.modules\n"
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, dtype=torch.float32)\n"
            f"torch.save(m(torch.tensor({ids.tolist()})).logits, {str(tmp_path / 'logits.pt')!r})\n"
            "print(type(m.model.layers[0].mlp.down_proj).__name__)\n")
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "QuantLinear"
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "logits.pt"), model(ids).logits)


def test_float_checkpoint_quantized_on_load(tmp_path):
    model = random_llama(llama_config(**SHAPES))
    model.save_pretrained(tmp_path)
    config = mixgemm.W4A16(group_size=32)
    with pytest.raises(ValueError, match="float checkpoint.*quantization_config"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)
    ours = mixgemm.from_pretrained(str(tmp_path), quantization_config=config, progress=False,
                                   filter_fn=lambda m, n: "down_proj" not in n)
    assert "model.layers.0.mlp.down_proj" in ours.mixgemm_report.skipped
    mixgemm.quantize_(model, config, filter_fn=lambda m, n: "down_proj" not in n)
    _assert_same(model, ours)


def _saved(tmp_path, config=None):
    model = _quantized(config or mixgemm.W4A16(group_size=32))
    model.save_pretrained(tmp_path)
    return model


def test_truncated_safetensors_is_an_error_naming_the_file(tmp_path):
    _saved(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match="model.safetensors.*truncated"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)
    path.write_bytes(data[:100])
    with pytest.raises(ValueError, match="model.safetensors"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)


def test_config_format_mismatch_names_the_tensor(tmp_path):
    _saved(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"]["layers"]["model.layers.1.self_attn.k_proj"]["bits"] = 8
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\._extra_state"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)


@pytest.fixture(scope="module")
def zero_point_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("zp")
    _quantized(mixgemm.W4A16(group_size=32, mode="zero_point")).save_pretrained(path)
    return path


def _edited(src, out, edit):
    """A copy of checkpoint ``src`` in ``out`` whose tensors ``edit`` changed."""
    out.mkdir()
    shutil.copy(src / "config.json", out)
    tensors = safetensors_torch.load_file(str(src / "model.safetensors"))
    edit(tensors)
    safetensors_torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _refused_by_both_loaders(path, match):
    """transformers' loader (the registered quantizer) and mixgemm's refuse the checkpoint before any forward."""
    with pytest.raises(ValueError, match=match):
        transformers.AutoModelForCausalLM.from_pretrained(path)
    with pytest.raises(ValueError, match=match):
        mixgemm.from_pretrained(str(path), progress=False)


def _set(key, change):
    return lambda tensors: tensors.__setitem__(key, change(tensors[key]).contiguous())


LAYER = "model.layers.1.mlp.up_proj"
BAD_LAYER_TENSORS = {  # case -> (edit, what the error says)
    "qweight missing": (lambda t: t.pop(f"{LAYER}.qweight"), rf"no tensor '{LAYER}\.qweight'"),
    "zeros missing": (lambda t: t.pop(f"{LAYER}.zeros"), rf"no tensor '{LAYER}\.zeros'"),
    "bias missing": (lambda t: t.pop("model.layers.0.self_attn.v_proj.bias"),
                     r"no tensor 'model\.layers\.0\.self_attn\.v_proj\.bias'"),
    "qweight float16": (_set(f"{LAYER}.qweight", torch.Tensor.half),
                        rf"'{LAYER}\.qweight' is torch\.float16 \(256, 64\).*needs torch\.uint8 \(256, 64\)"),
    "qweight int32": (_set(f"{LAYER}.qweight", torch.Tensor.int), rf"'{LAYER}\.qweight' is torch\.int32 .*uint8"),
    "scales int32": (_set(f"{LAYER}.scales", torch.Tensor.int), rf"'{LAYER}\.scales' is torch\.int32 .*float16"),
    "scales shape": (_set(f"{LAYER}.scales", lambda x: x[:, :-1]),
                     rf"'{LAYER}\.scales' is torch\.float16 \(256, 3\).*needs torch\.float16 \(256, 4\)"),
}


@pytest.mark.parametrize("case", list(BAD_LAYER_TENSORS))
def test_missing_or_mistyped_layer_tensor_names_it(case, zero_point_checkpoint, tmp_path):
    """Through transformers' loader too: a missing tensor would load as uninitialized memory, an integer one as it is
    (transformers casts only float tensors), a float one cast to the codes' dtype."""
    edit, match = BAD_LAYER_TENSORS[case]
    _refused_by_both_loaders(_edited(zero_point_checkpoint, tmp_path / "bad", edit), match)


def test_integer_float_tensor_is_an_error_at_load(tmp_path):
    """A float Linear of a mixgemm checkpoint stored as integers: transformers' loader kept the int32 weight and the
    forward failed in F.linear."""
    model = random_llama(llama_config(**SHAPES))
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32), filter_fn=lambda m, n: "down_proj" not in n)
    model.save_pretrained(tmp_path / "q")
    key = "model.layers.1.mlp.down_proj.weight"
    path = _edited(tmp_path / "q", tmp_path / "bad", _set(key, lambda w: (w * 100).int()))
    _refused_by_both_loaders(path, rf"'{re.escape(key)}' is torch\.int32 in the checkpoint, the model expects a float")


def test_unknown_quant_method_is_an_error(tmp_path):
    _saved(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = {"quant_method": "no-such-method"}
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no-such-method"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)


def test_format_registry():
    from mixgemm.checkpoints import formats

    assert formats.find({"quant_method": "mixgemm", "layers": {}}).name == "mixgemm"
    assert formats.find({"quant_method": "other"}) is None
    with pytest.raises(TypeError, match="needs .name."):
        formats.register(object())
