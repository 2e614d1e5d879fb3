"""tools/checks/generate_e2e.py (generate speed and weight memory of 7-8B HF models, fp16 vs quantized) on the CPU
with tiny configs of the same architectures; and the Qwen2 entry of mixgemm.integrations.hf."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from mixgemm.integrations.hf import llama_config, model_config, random_model
from mixgemm.nn import QuantLinear
from repo_paths import ROOT

pytestmark = pytest.mark.slow(seconds=28)

TOOL = ROOT / "tools" / "checks" / "generate_e2e.py"
ARGS = ["--device", "cpu", "--tiny", "--models", "qwen2-7b", "--new-tokens", "3", "--prompt-len", "5",
        "--warmup", "1"]


def _tool():
    spec = importlib.util.spec_from_file_location("generate_e2e_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_qwen2_config_and_random_model():
    cfg = model_config("qwen2-7b")
    assert (type(cfg).__name__, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (
        "Qwen2Config", 3584, 18944, 28, 28, 4, 152064)
    model = random_model(model_config("tiny-qwen2"), seed=3)
    attn = model.model.layers[0].self_attn
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert attn.q_proj.bias.abs().sum() == 0  # transformers' init zeroes biases; the weights are random
    assert attn.q_proj.weight.std() > 0.01
    with pytest.raises(ValueError, match="qwen2 model, not a Llama"):
        llama_config("qwen2-7b")
    with pytest.raises(ValueError, match="unknown model"):
        model_config("qwen3")


def test_generate_e2e_tool_on_cpu(tmp_path):
    rc = _tool().main([*ARGS, "--out", str(tmp_path), "--memory-ms", "1,16", "--modes", "generate,static,compiled"])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"]
    page = (tmp_path / "generate_e2e.md").read_text()  # the results page: the command, then the tables
    assert page.startswith("# Generation") and "--modes generate,static,compiled" in page
    assert "| qwen2-7b | generate |" in page and "| model | format | packed MB" in page
    (speed,) = res["speed"]
    assert set(speed["modes"]) == {"generate", "static", "compiled"}
    for mode, m in speed["modes"].items():
        assert m["fp16"]["tokens_per_s"] > 0 and m["w4a16"]["tokens_per_s"] > 0
        assert m["ratio"] == pytest.approx(m["w4a16"]["tokens_per_s"] / m["fp16"]["tokens_per_s"])
        assert 0 < m["w4a16"]["weight_gb"] < m["fp16"]["weight_gb"]  # both models resident, each counted alone
        if mode != "compiled":  # the generate modes time the two models in turns
            assert len(m["fp16"]["runs_s"]) == len(m["w4a16"]["runs_s"]) == 1
    assert speed["first_step"]["cosine_dequantized"] > 0.99 and speed["quantize"]["replaced"] == 2 * 7 + 1
    greedy = speed["first_step"]["greedy"]
    assert greedy["equal"] and greedy["quantized"] == greedy["dequantized"] and len(greedy["quantized"]) == 16
    # the exact twin (float32 on the CPU too) gives the same tokens, with a top-2 margin at each step
    assert greedy["exact_equal"] and greedy["exact"] == greedy["quantized"] and len(greedy["exact_margins"]) == 16
    assert greedy["exact_first_difference"] is None and all(m >= 0 for m in greedy["exact_margins"])
    assert [r["format"].split()[0] for r in res["memory"]] == ["W4A16", "W8A8"]
    for r in res["memory"]:
        # the CPU path builds no kernel layouts: resident = the plain buffers = the packed size
        assert r["resident"]["plain"] == r["packed_bytes"] == r["resident"]["total"] and r["meets"]


def test_generate_e2e_tool_fails_on_wrong_quantized_model(tmp_path, monkeypatch):
    tool = _tool()
    forward = QuantLinear.forward

    def wrong(self, x):  # output channels reversed: a wrong kernel result from the right weights, that still runs
        return forward(self, x).flip(-1)

    monkeypatch.setattr(QuantLinear, "forward", wrong)
    rc = tool.main([*ARGS, "--out", str(tmp_path), "--modes", "generate", "--skip-memory"])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 1 and any("against the dequantized float model" in f for f in res["failures"])


def test_generate_e2e_tool_times_a_plain_copy(tmp_path):
    """--plain: a quantize_(compact=False) copy of the W4A16 model is timed beside the default one."""
    rc = _tool().main([*ARGS, "--out", str(tmp_path), "--modes", "generate", "--skip-memory", "--plain"])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"], res["errors"]
    (speed,) = res["speed"]
    assert speed["first_step"]["cosine_dequantized"] > 0.99
    gen = speed["modes"]["generate"]
    assert gen["w4a16"]["tokens_per_s"] > 0 and gen["w4a16_plain"]["tokens_per_s"] > 0
    assert gen["w4a16_plain"]["weight_gb"] > 0  # (the CPU builds no kernel layouts: no size comparison here)


def test_generate_e2e_tool_times_a_zero_point_copy(tmp_path):
    """--zero-point: a W4A16 g128 zero-point copy (GPTQ / AWQ checkpoints' format) is timed beside the sym one, its
    layers quantized with zero points."""
    tool = _tool()
    seen = []
    quantize = tool.quantize

    def spy(model, config, **kw):
        seen.append(config.mode)
        return quantize(model, config, **kw)

    tool.quantize = spy
    rc = tool.main([*ARGS, "--out", str(tmp_path), "--modes", "generate", "--skip-memory", "--zero-point"])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"], res["errors"]
    gen = res["speed"][0]["modes"]["generate"]
    assert gen["w4a16"]["tokens_per_s"] > 0 and gen["w4a16_zp"]["tokens_per_s"] > 0
    assert seen == ["sym", "zero_point"]


def test_generate_e2e_tool_memory_of_a_compacted_model(tmp_path):
    """--memory-formats W4A16+compact: the model is compacted after quantize_ (mixgemm.compact_), runs every M, and
    its first-step logits still match its dequantized twin; the plain codes are not held (the tiny layers pad to the
    layout's 128-row blocks, so the ratio is no figure here)."""
    rc = _tool().main([*ARGS, "--out", str(tmp_path), "--memory-ms", "1,16", "--modes", "",
                       "--memory-formats", "W4A16+compact"])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"], res["errors"]
    (r,) = res["memory"]
    assert r["compact"] and r["format"].endswith("compact_") and r["quantize"]["compacted"] == r["quantize"]["replaced"]
    assert set(r["resident"]["layouts"]) == {"wgmma_v1"} and r["resident"]["plain_held"] < r["packed_bytes"]


def test_generate_e2e_tool_continuous_batching_and_sliding_window(tmp_path):
    """--smoke on Mistral (sliding window 4 at tiny size): transformers' generate_batch times both models over every
    request's new tokens; the compiled decode step refuses the cache that slides (recorded, not a failure); the
    greedy tokens equal the dequantized twin's."""
    rc = _tool().main(["--smoke", "--models", "mistral-7b", "--modes", "continuous,compiled", "--skip-memory",
                       "--out", str(tmp_path)])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"], res["errors"]
    (speed,) = res["speed"]
    cb = speed["modes"]["continuous"]
    assert cb["w4a16"]["requests"] == 3 and cb["fp16"]["tokens_per_s"] > 0 and cb["w4a16"]["tokens_per_s"] > 0
    assert cb["target"] == 1.5
    assert cb["ratio"] == pytest.approx(cb["w4a16"]["tokens_per_s"] / cb["fp16"]["tokens_per_s"])
    assert "mistral's sliding-window cache layers" in speed["modes"]["compiled"]["not_run"]
    assert speed["architecture"] == "mistral" and speed["first_step"]["greedy"]["equal"]


def test_generate_e2e_tool_counts_short_continuous_requests_as_failures(tmp_path, monkeypatch):
    """A quantized model whose generate_batch returns fewer tokens than asked fails the run (the float one ran)."""
    from transformers import GenerationMixin

    real = GenerationMixin.generate_batch

    def short(self, *a, **kw):
        out = real(self, *a, **kw)
        if any(isinstance(m, QuantLinear) for m in self.modules()):
            for o in out.values():
                o.generated_tokens = o.generated_tokens[:-1]
        return out

    monkeypatch.setattr(GenerationMixin, "generate_batch", short)
    rc = _tool().main(["--smoke", "--models", "qwen2-7b", "--modes", "continuous", "--skip-memory",
                       "--out", str(tmp_path)])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 1 and any("new tokens" in f and "asked 4" in f for f in res["failures"]), res["failures"]


def test_generate_e2e_tool_time_budget(tmp_path):
    """--time-budget: no model starts once it is spent; each is recorded as not run, which is no failure."""
    rc = _tool().main(["--smoke", "--models", "qwen2-7b,gemma2-9b", "--skip-memory", "--time-budget", "1e-9",
                       "--out", str(tmp_path)])
    res = json.loads((tmp_path / "generate_e2e.json").read_text())
    assert rc == 0 and res["speed"] == [] and not res["failures"]
    assert res["not_run"] == [f"{m}: time budget (--time-budget) spent" for m in ("qwen2-7b", "gemma2-9b")]


def test_generate_e2e_tool_kernel_kinds_and_greedy_line():
    """GPU kernels sorted by what they compute (attention before the linear names a fused attention also carries;
    mixgemm's own prefix is no linear layer), and the greedy line judged against the exact twin."""
    tool = _tool()
    kinds = {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7": "attention",
             "nvjet_sm90_hsh_128x64_64x8_4x1_v_bz_TNT": "linear", "mixgemm_gemm_wgmma": "linear",
             "mixgemm_splitk_finish": "linear", "mixgemm_gemv_m1": "linear", "mixgemm_rms_norm": "other",
             "void at::native::elementwise_kernel<128, 4>": "other"}
    assert {name: tool.kernel_kind(name) for name in kinds} == kinds
    g = {"tokens": 16, "equal": False, "first_difference": 6, "exact_equal": True, "exact_first_difference": None,
         "twin_exact_first_difference": 6, "exact_margins": [1.0] * 6 + [0.004] + [1.0] * 9}
    assert tool.greedy_meets(g)
    assert tool.greedy_text(g) == ("greedy tokens equal to the dequantized twin's for 6 of 16, to the exact (float32) "
                                   "twin's for 16 of 16 (the twin's own: 6 of 16); exact twin's top-2 margin at "
                                   "token 6: 0.004 std")
    assert not tool.greedy_meets({**g, "exact_equal": False, "exact_first_difference": 9})
    assert not tool.greedy_meets({"tokens": 16, "equal": False, "first_difference": 3, "exact": "not run: oom"})
