"""`mixgemm bench --model`: the committed layer-shape list, config.json parsing, the CLI on the CPU, --merge /
--time-budget, and the acceptance view computed from hand-made results."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from mixgemm.__main__ import main as mixgemm_main
from mixgemm.bench import accept, merge, models
from mixgemm.bench.methods import BASELINE_CPU, BASELINE_GPU, all_methods, select
from mixgemm.bench.runner import SweepConfig, run_sweep

pytestmark = pytest.mark.slow(seconds=50)

ISSUE_MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b",
                "mixtral-8x7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
                "qwen2.5-32b", "qwen2.5-72b", "phi-3-mini", "phi-3-medium", "gemma-2-2b", "gemma-2-9b",
                "gemma-2-27b"]


def _shapes_of(name: str) -> dict[str, tuple[int, int]]:
    return {lay.name: lay.shape for lay in models.linear_layers(models.catalog()[name])}


# ----------------------------------------------------------------------------------------- the shape list
def test_committed_list_covers_the_issue_models_with_40_plus_distinct_shapes():
    cat = models.catalog()
    assert set(ISSUE_MODELS) <= set(cat)
    assert all(m.source for m in cat.values())  # every entry names the config it comes from
    by_shape = models.model_layers(list(cat.values()))
    assert len(by_shape) >= 40
    for (k, n), layers in by_shape.items():  # every shape traces back to a layer of a listed model
        assert layers and all(lay.shape == (k, n) and lay.model in cat for lay in layers)
    names = {lay.name for layers in by_shape.values() for lay in layers}
    assert {"qkv (fused)", "gate_up (fused)", "qkv_proj", "gate_up_proj", "experts.w2 (down)"} <= names


def test_known_layer_shapes():
    llama3 = _shapes_of("llama-3-8b")
    assert llama3["k_proj"] == (4096, 1024) and llama3["q_proj"] == (4096, 4096)
    assert llama3["qkv (fused)"] == (4096, 6144) and llama3["gate_up (fused)"] == (4096, 28672)
    assert llama3["down_proj"] == (14336, 4096)
    assert _shapes_of("qwen2.5-7b")["down_proj"] == (18944, 3584)
    gemma9 = _shapes_of("gemma-2-9b")  # head_dim 256: q is wider than hidden, o narrows it back
    assert gemma9["q_proj"] == (3584, 4096) and gemma9["o_proj"] == (4096, 3584) and gemma9["k_proj"] == (3584, 2048)
    phi = _shapes_of("phi-3-mini")  # Phi-3 stores the fused projections itself: those are its layers
    assert phi == {"qkv_proj": (3072, 9216), "o_proj": (3072, 3072), "gate_up_proj": (3072, 16384),
                   "down_proj": (8192, 3072)}
    assert _shapes_of("phi-3-medium")["qkv_proj"] == (5120, (40 + 2 * 10) * 128)
    mix = _shapes_of("mixtral-8x7b")
    assert mix["experts.w1 (gate)"] == (4096, 14336) and mix["experts.w2 (down)"] == (14336, 4096)
    assert mix["experts.w1+w3 (fused gate+up)"] == (4096, 28672)


# ----------------------------------------------------------------------------------------- config.json
def _write(tmp_path: Path, cfg: dict, folder: str = "m") -> Path:
    d = tmp_path / folder
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_config_json_variants(tmp_path):
    mha = models.resolve([str(_write(tmp_path, {"hidden_size": 96, "intermediate_size": 160,
                                                "num_attention_heads": 6}, "mha"))])[0]
    assert mha.name == "mha" and mha.num_key_value_heads == 6 and mha.head_dim == 16  # MHA, hidden / heads
    s = {lay.name: lay.shape for lay in models.linear_layers(mha)}
    assert s["k_proj"] == (96, 96) and s["qkv (fused)"] == (96, 288) and s["down_proj"] == (160, 96)
    gqa = models.load_config_file(str(_write(tmp_path, {
        "_name_or_path": "org/gqa-model", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32}, "gqa") / "config.json"))
    assert gqa.name == "gqa-model"
    s = {lay.name: lay.shape for lay in models.linear_layers(gqa)}
    assert s["q_proj"] == (64, 128) and s["o_proj"] == (128, 64) and s["qkv (fused)"] == (64, 256)
    nested = models.from_hf_config({"model_type": "llava", "text_config": {
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2}}, "vlm")
    assert nested.hidden_size == 64 and nested.intermediate_size == 96


def test_routed_experts_and_latent_attention(tmp_path):
    """Qwen-MoE / DeepSeek configs: the routed experts of moe_intermediate_size, the shared expert, a dense MLP only
    where some layers keep one, and latent attention's low-rank projections (published DeepSeek-V3 widths)."""
    qwen3 = models.from_hf_config({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                                   "moe_intermediate_size": 768, "num_experts": 128, "num_attention_heads": 32,
                                   "num_key_value_heads": 4, "head_dim": 128, "mlp_only_layers": [],
                                   "decoder_sparse_step": 1}, "qwen3-30b-a3b")
    s = {lay.name: lay.shape for lay in models.linear_layers(qwen3)}
    assert s == {"q_proj": (2048, 4096), "k_proj": (2048, 512), "v_proj": (2048, 512), "qkv (fused)": (2048, 5120),
                 "o_proj": (4096, 2048), "experts.gate_proj": (2048, 768), "experts.up_proj": (2048, 768),
                 "experts.gate_up (fused)": (2048, 1536), "experts.down_proj": (768, 2048)}  # no dense MLP
    qwen2 = models.from_hf_config({"hidden_size": 3584, "intermediate_size": 18944, "moe_intermediate_size": 2560,
                                   "shared_expert_intermediate_size": 20480, "num_experts": 64,
                                   "num_attention_heads": 28, "num_key_value_heads": 4}, "qwen2-57b-a14b")
    s = {lay.name: lay.shape for lay in models.linear_layers(qwen2)}
    assert s["shared_expert.down_proj"] == (20480, 3584) and s["experts.gate_up (fused)"] == (3584, 5120)
    assert "down_proj" not in s
    v3 = models.from_hf_config({"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                                "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3,
                                "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                                "qk_rope_head_dim": 64, "v_head_dim": 128, "num_attention_heads": 128}, "v3")
    s = {lay.name: lay.shape for lay in models.linear_layers(v3)}
    assert (s["q_a_proj"], s["q_b_proj"], s["kv_a_proj_with_mqa"], s["kv_b_proj"], s["o_proj"]) == (
        (7168, 1536), (1536, 24576), (7168, 576), (512, 32768), (16384, 7168))
    assert s["shared_expert.gate_proj"] == s["experts.gate_proj"] == (7168, 2048)
    assert s["down_proj"] == (18432, 7168) and "k_proj" not in s and "qkv (fused)" not in s  # dense first layers
    lite = models.from_hf_config({"hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                                  "n_routed_experts": 64, "kv_lora_rank": 512, "q_lora_rank": None,
                                  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                                  "num_attention_heads": 16}, "lite")
    s = {lay.name: lay.shape for lay in models.linear_layers(lite)}
    assert s["q_proj"] == (2048, 3072) and "q_a_proj" not in s and "shared_expert.up_proj" not in s
    path = _write(tmp_path, {"_name_or_path": "org/lite", "hidden_size": 2048, "intermediate_size": 10944,
                             "moe_intermediate_size": 1408, "n_routed_experts": 64, "num_attention_heads": 16})
    assert models.resolve([str(path)])[0].expert_intermediate == 1408


@pytest.mark.parametrize("cfg, needle", [
    ({"hidden_size": 64, "num_attention_heads": 4}, "'intermediate_size'"),
    ({"intermediate_size": 64, "num_attention_heads": 4}, "'hidden_size'"),
    ({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 0}, "'num_attention_heads' must be"),
    ({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3},
     "not a multiple of num_key_value_heads"),
    ({"hidden_size": 66, "intermediate_size": 64, "num_attention_heads": 4}, "no 'head_dim'"),
    ({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_experts": 60},
     "mixture-of-experts config.*'moe_intermediate_size'"),
    ({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "n_routed_experts": 8,
      "moe_intermediate_size": 0}, "'moe_intermediate_size' must be"),
    ({"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "kv_lora_rank": 32,
      "qk_nope_head_dim": 16, "qk_rope_head_dim": 8}, "latent-attention config.*no 'v_head_dim'"),
])
def test_bad_config_names_the_field(tmp_path, cfg, needle):
    path = _write(tmp_path, cfg)
    with pytest.raises(ValueError, match=needle) as e:
        models.resolve([str(path)])
    assert "config.json" in str(e.value)


def test_resolve_names_all_and_unknown():
    assert [m.name for m in models.resolve(["Llama-3-8B,qwen2.5-7b"])] == ["llama-3-8b", "qwen2.5-7b"]
    assert len(models.resolve(["all", "llama-3-8b"])) == len(models.catalog())
    with pytest.raises(ValueError, match="not a config.json"):
        models.resolve(["no-such-model"])
    lays = models.linear_layers(models.catalog()["llama-3-8b"]) + models.linear_layers(models.catalog()["mistral-7b"])
    label = models.shape_label(models.group_by_shape(lays)[(4096, 1024)])
    assert label == "llama-3-8b: k_proj, v_proj; mistral-7b: k_proj, v_proj"


# ----------------------------------------------------------------------------------------- CLI on the CPU
TINY = {"_name_or_path": "org/tiny", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2}


def test_cli_model_on_cpu_names_the_layers(tmp_path, capsys):
    cfg = _write(tmp_path, TINY, "tiny")
    out = tmp_path / "out"
    argv = ["bench", "--device", "cpu", "--model", str(cfg), "-m", "1", "--methods",
            f"mixgemm W4A16 g128,{BASELINE_CPU}", "--out", str(out), "--no-progress"]
    assert mixgemm_main(argv) == 0
    data = json.loads((out / "cpu" / "model-tiny.json").read_text())
    # k/v 128x64, q/o 128x128, qkv + gate + up 128x256, gate_up 128x512, down 256x128: each timed once
    assert data["layers"] == {"128x128": "q_proj, o_proj", "128x64": "k_proj, v_proj",
                              "128x256": "qkv (fused), gate_proj, up_proj", "128x512": "gate_up (fused)",
                              "256x128": "down_proj"}
    got = {(r["K"], r["N"], r["method"]) for r in data["results"]}
    assert len(got) == 5 * 2 and all(r["status"] == "ok" for r in data["results"])
    assert {r["method"] for r in data["results"]} == {"mixgemm W4A16 g128", BASELINE_CPU}
    md = (out / "cpu" / "model-tiny.md").read_text()
    assert "| K x N | layer | M |" in md and "| 128x256 | qkv (fused), gate_proj, up_proj | 1 |" in md
    assert "qkv (fused), gate_proj, up_proj" in capsys.readouterr().out

    # --merge: the file holds every case of this plan, so nothing is timed again and the file keeps them
    assert mixgemm_main(argv + ["--merge"]) == 0
    err = capsys.readouterr().err
    assert "skipping them" in err and "nothing left to run" in err
    again = json.loads((out / "cpu" / "model-tiny.json").read_text())
    assert again["results"] == data["results"]
    # a part at another M is measured and merged beside the first
    assert mixgemm_main(argv[:6] + ["2"] + argv[7:] + ["--merge"]) == 0
    merged = json.loads((out / "cpu" / "model-tiny.json").read_text())
    assert {(r["K"], r["N"], r["M"], r["method"]) for r in merged["results"]} == \
        {(k, n, m, meth) for k, n, meth in got for m in (1, 2)}
    assert len(merged["meta"]["runs"]) == 2 and merged["layers"] == data["layers"]


def test_cli_fold_puts_a_part_measured_apart_into_the_file(tmp_path, capsys):
    """--fold: a run on another machine (its own OUT) re-measured some cases; folding its file into the committed one
    replaces those cases, keeps the rest, drops from "not run" the shapes the file holds, and renders the Markdown."""
    cfg = _write(tmp_path, TINY, "tiny")
    argv = ["bench", "--device", "cpu", "--model", str(cfg), "--methods", f"mixgemm W4A16 g128,{BASELINE_CPU}",
            "--no-progress", "-m", "1"]
    out, apart = tmp_path / "out", tmp_path / "apart"
    assert mixgemm_main(argv + ["--out", str(out)]) == 0
    assert mixgemm_main(argv + ["2", "--out", str(apart)]) == 0  # M 1 again and M 2, elsewhere
    part_path = apart / "cpu" / "model-tiny.json"
    part = json.loads(part_path.read_text())
    part["meta"]["not_run"] = ["128x128", "999x999"]  # as a time budget would list them: one held, one not
    part_path.write_text(json.dumps(part))
    before = json.loads((out / "cpu" / "model-tiny.json").read_text())
    assert mixgemm_main(["bench", "--fold", str(part_path), "--out", str(out)]) == 0
    assert "folded" in capsys.readouterr().out
    merged = json.loads((out / "cpu" / "model-tiny.json").read_text())
    key = lambda r: (r["K"], r["N"], r["M"], r["method"])  # noqa: E731
    assert sorted(map(key, merged["results"])) == sorted(map(key, part["results"]))  # M 1 replaced, M 2 added
    assert {key(r): r["time_us"] for r in merged["results"]} == {key(r): r["time_us"] for r in part["results"]}
    assert len(before["results"]) == len(merged["results"]) // 2
    assert merged["meta"]["not_run"] == ["999x999"] and len(merged["meta"]["runs"]) == 2
    assert "| 128x256 | qkv (fused), gate_proj, up_proj | 2 |" in (out / "cpu" / "model-tiny.md").read_text()
    # errors name the problem: no file to fold into, not a results file, another device's results
    assert mixgemm_main(["bench", "--fold", str(part_path), "--out", str(tmp_path / "empty")]) == 2
    assert "no " in capsys.readouterr().err
    (tmp_path / "x.json").write_text("[1, 2]")
    assert mixgemm_main(["bench", "--fold", str(tmp_path / "x.json"), "--out", str(out)]) == 2
    assert "not a `mixgemm bench` results file" in capsys.readouterr().err
    other = dict(part, meta={**part["meta"], "gpu": "NVIDIA H100 80GB HBM3"})
    (out / "h100").mkdir()
    (out / "h100" / "model-tiny.json").write_text(json.dumps(before))  # a CPU run's file under the H100's folder
    (tmp_path / "model-tiny.json").write_text(json.dumps(other))
    assert mixgemm_main(["bench", "--fold", str(tmp_path / "model-tiny.json"), "--out", str(out)]) == 2
    assert "holds results of" in capsys.readouterr().err


def test_cli_model_errors(tmp_path, capsys):
    bad = _write(tmp_path, {"hidden_size": 64, "num_attention_heads": 4})
    assert mixgemm_main(["bench", "--device", "cpu", "--model", str(bad), "--out", str(tmp_path)]) == 2
    assert "'intermediate_size'" in capsys.readouterr().err
    assert mixgemm_main(["bench", "--device", "cpu", "--model", "llama-3-8b", "--shapes", "64x64"]) == 2
    assert "give one" in capsys.readouterr().err
    assert mixgemm_main(["bench", "--list-models"]) == 0
    assert "qwen2.5-7b" in capsys.readouterr().out


def test_time_budget_stops_before_the_next_shape():
    meths = select(all_methods([4], 128), BASELINE_CPU, "cpu")
    cfg = SweepConfig(plan=[((64, 32), [1]), ((128, 32), [1])], methods=meths, device="cpu",
                      dtype=torch.float32, deadline=time.time() - 1)
    data = run_sweep(cfg)
    assert data["results"] == [] and data["meta"]["not_run"] == ["64x32", "128x32"]


def test_merge_replaces_measured_cases_and_finds_what_is_left():
    def rec(k, n, m, meth, t, status="ok"):
        return {"K": k, "N": n, "M": m, "method": meth, "status": status, "time_us": t}

    prev = {"meta": {"gpu": "G", "date_utc": "a"}, "ceilings": {"copy_bw": 1.0}, "layers": {"8x8": "q"},
            "results": [rec(8, 8, 1, "A", 1.0), rec(8, 8, 16, "A", 2.0), rec(8, 16, 1, "A", 3.0, "error")]}
    part = {"meta": {"gpu": "G", "date_utc": "b"}, "ceilings": {"copy_bw": 2.0}, "layers": {"8x16": "k"},
            "results": [rec(8, 16, 1, "A", 4.0)]}
    todo, done = merge.remaining([((8, 8), [1, 16]), ((8, 16), [1])], ["A"], prev)
    assert done == [(8, 8)] and todo == [((8, 16), [1])]  # the errored shape runs again
    # per M: a shape keeps only the M values some method lacks there (both methods run again at that M)
    prev_b = {**prev, "results": prev["results"] + [rec(8, 8, 1, "B", 5.0)]}
    todo, done = merge.remaining([((8, 8), [1, 16, 256])], ["A", "B"], prev_b)
    assert done == [] and todo == [((8, 8), [16, 256])]
    todo, done = merge.remaining([((8, 8), [1])], ["A", "B"], prev_b)
    assert done == [(8, 8)] and todo == []
    out = merge.combine(prev, part)
    assert sorted((r["K"], r["N"], r["M"], r["time_us"]) for r in out["results"]) == [
        (8, 8, 1, 1.0), (8, 8, 16, 2.0), (8, 16, 1, 4.0)]
    assert out["layers"] == {"8x8": "q", "8x16": "k"} and out["ceilings"] == {"copy_bw": 2.0}
    assert [r["date_utc"] for r in out["meta"]["runs"]] == ["a", "b"]


# ----------------------------------------------------------------------------------------- acceptance view
def _case(k, n, m, method, time_us, pct=None, speedup=None, status="ok"):
    return {"K": k, "N": n, "M": m, "method": method, "family": "peer" if "mixgemm" not in method else "mixgemm",
            "kind": "matmul", "status": status, "time_us": time_us, "pct_floor": pct, "speedup": speedup,
            "note": ""}


def _synthetic(big_w4_pct=90.0, small_w8_pct=75.0, m16=1.2, gemm=(1.1, 1.2), a8=1.7):
    """Two shapes: 8192x8192 (32 MiB int4, bar 85%) and 4096x4096 (8 MiB, bar 70%); every needed case."""
    res = []
    for k, n, pct in ((8192, 8192, big_w4_pct), (4096, 4096, 80.0)):
        for meth in accept.WEIGHT_ONLY:
            p = small_w8_pct if (meth == accept.W8 and k == 4096) else pct
            res.append(_case(k, n, 1, meth, 10.0, pct=p))
            res.append(_case(k, n, 16, meth, 10.0 * m16))
            for m, s in zip((256, 2048, 4096), (gemm[0], gemm[1], gemm[1]), strict=True):
                res.append(_case(k, n, m, meth, 100.0 / s, speedup=s))
        for m in (1, 16, 256, 2048, 4096):
            res.append(_case(k, n, m, BASELINE_GPU, 100.0, speedup=1.0))
        res.append(_case(k, n, 1, "tinygemm W4 g128", 15.0))
        for meth in accept.ACT_QUANT:
            for m in (2048, 4096):
                res.append(_case(k, n, m, meth, 100.0 / a8, speedup=a8))
    return {"meta": {"gpu": "Test GPU", "device": "cuda"}, "ceilings": {"copy_bw": 3e12, "fp16_flops": 6e14},
            "baseline": BASELINE_GPU, "results": res, "layers": {"8192x8192": "q_proj, o_proj"}}


def _verdicts(data, **kw):
    return {ln.name.split(",")[0].split(" vs")[0]: ln.verdict for ln in accept.evaluate(data, **kw)}


def test_acceptance_all_pass():
    v = _verdicts(_synthetic())
    assert set(v.values()) == {"PASS"}, v


def test_acceptance_failures_are_found_line_by_line():
    lines = accept.evaluate(_synthetic(big_w4_pct=84.0))
    assert [ln.verdict for ln in lines] == ["FAIL", "PASS", "PASS", "PASS"]
    assert len(lines[0].failures) == 3 and "8192x8192" in lines[0].failures[0]  # the three weight-only methods
    assert accept.evaluate(_synthetic(small_w8_pct=69.0))[0].failures == [
        "4096x4096 (8.0 MiB) mixgemm W8A16 per-channel: 69.0% < 70.0%"]
    # a measured read ceiling lowers the big layers' bar to 92% of it: 84% passes against 0.92 * 89 = 81.9%
    assert accept.evaluate(_synthetic(big_w4_pct=84.0), read_ceiling_pct=89.0)[0].verdict == "PASS"
    assert [ln.verdict for ln in accept.evaluate(_synthetic(m16=1.5))] == ["PASS", "FAIL", "PASS", "PASS"]
    # M16/M1 only binds layers >= 16 MiB: the 8 MiB shape is not checked
    assert len(accept.evaluate(_synthetic(m16=1.5))[1].failures) == 3
    # every case >= 0.95x but the median 1.0x < 1.05x at M = 256: FAIL from the medians alone
    gemm = accept.evaluate(_synthetic(gemm=(1.0, 1.2)))[2]
    assert gemm.verdict == "FAIL" and all("median" in f for f in gemm.failures)
    assert accept.evaluate(_synthetic(gemm=(0.9, 1.2)))[2].verdict == "FAIL"
    a8 = accept.evaluate(_synthetic(a8=1.5))[3]
    assert a8.verdict == "FAIL" and len(a8.failures) == 2 * 2 * 2  # 2 shapes x 2 methods x M 2048, 4096


def test_acceptance_missing_and_wrong_cases():
    data = _synthetic()
    data["results"] = [r for r in data["results"] if not (r["method"] == accept.W4_ZP and r["M"] == 1)]
    assert accept.evaluate(data)[0].verdict == "INCOMPLETE"
    data = _synthetic()
    for r in data["results"]:
        if r["method"] == accept.W8A8 and r["M"] == 2048 and r["K"] == 8192:
            r["status"], r["note"] = "wrong", "rel err 1 > tol"
    assert accept.evaluate(data)[3].verdict == "FAIL"
    assert accept.evaluate({"meta": {}, "results": []})[0].verdict == "INCOMPLETE"
    data = _synthetic()  # shapes a --time-budget run left out are missing from the lines they fall under
    data["meta"]["not_run"] = ["8192x28672", "1024x1024"]
    lines = accept.evaluate(data)
    assert [ln.verdict for ln in lines] == ["INCOMPLETE"] * 4
    assert [len(ln.missing) for ln in lines] == [1, 1, 2, 1]  # 1024x1024 (0.5 MiB): GEMM line only
    assert lines[0].missing == ["8192x28672: not run (--time-budget; rerun with --merge)"]


def test_acceptance_markdown_shows_sizes_ratios_and_medians():
    md = accept.to_markdown(_synthetic(m16=1.25))
    assert "| 8192x8192 | q_proj, o_proj | 32.0 | 90% / 90% / 90% | 1.25 / 1.25 / 1.25 | 1.10 / 1.10 / 1.10 | " \
           "1.70 / 1.70 | 1.50 |" in md  # the best peer (tinygemm 15 us) over mixgemm W4 (10 us)
    assert "| mixgemm W4A16 g128 | 1.10 | 1.20 | 1.20 |" in md and md.count("**PASS**") == 4


def test_decode_medians_by_size_class():
    # W8 on the 8 MiB shape at 75%, the others at 80%; the 32 MiB shape at 90% with M = 16 at 1.2x
    assert accept.decode_medians(accept.Cases(_synthetic()), accept.Bars()) == [
        (accept.W4_SYM, 90.0, 80.0, 1.2), (accept.W4_ZP, 90.0, 80.0, 1.2), (accept.W8, 90.0, 75.0, 1.2)]


def test_report_prints_the_acceptance_view_of_a_results_file(tmp_path, capsys):
    path = tmp_path / "model-shapes.json"
    path.write_text(json.dumps(_synthetic(big_w4_pct=84.0)))
    assert mixgemm_main(["report", "--accept", str(path)]) == 0
    out = capsys.readouterr().out
    assert "## Acceptance view: Test GPU" in out and "**FAIL**" in out
    assert mixgemm_main(["report", "--accept", str(path), "--read-ceiling-pct", "89"]) == 0
    assert "**FAIL**" not in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert mixgemm_main(["report", "--accept", str(tmp_path / "bad.json")]) == 2
    assert "not a `mixgemm bench` results file" in capsys.readouterr().err


def test_report_writes_the_readme_block_of_model_runs(tmp_path, capsys):
    gpu_dir = tmp_path / "results" / "test-gpu"
    gpu_dir.mkdir(parents=True)
    (gpu_dir / "model-shapes.json").write_text(json.dumps(_synthetic()))
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- model-shapes:start -->\nold\n<!-- model-shapes:end -->\nbottom\n")
    assert mixgemm_main(["report", "--results", str(tmp_path / "results"), "--suite", "model-shapes",
                         "--markers", "model-shapes", "--readme", str(readme), "--write"]) == 0
    text = readme.read_text()
    assert text.startswith("top\n<!-- model-shapes:start -->\n**Test GPU") and "old" not in text
    assert text.endswith("<!-- model-shapes:end -->\nbottom\n")
    # the README's block: the verdicts and the medians; the per-shape table and the failures stay in the results'
    # own Markdown, which it links
    assert text.count("**PASS**") == 4 and "| mixgemm W4A16 g128 | 90% | 80% | 1.20x |" in text
    assert "| mixgemm W4A16 g128 | 1.10 | 1.20 | 1.20 |" in text
    assert "| 8192x8192 | q_proj, o_proj |" not in text
    assert "[test-gpu/model-shapes.md](results/test-gpu/model-shapes.md)" in text


def test_cli_time_budget_lists_the_shapes_left_out(tmp_path, capsys):
    cfg = _write(tmp_path, TINY, "tiny")
    assert mixgemm_main(["bench", "--device", "cpu", "--model", str(cfg), "--methods", "accept", "-m", "1",
                         "--time-budget", "0.001", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert "5 shape(s) not run" in capsys.readouterr().err
    data = json.loads((tmp_path / "out" / "cpu" / "model-tiny.json").read_text())
    assert data["results"] == [] and len(data["meta"]["not_run"]) == 5
    # 'accept' names the acceptance methods; on a CPU only the weight-only ones run
    assert [m["name"] for m in data["methods"]] == [accept.W4_SYM, accept.W4_ZP, accept.W8]


def test_a_merged_run_keeps_the_read_ceiling_of_its_file():
    from mixgemm.bench.cli import read_ceiling_pct

    stored = {"accept": {"read_ceiling_pct": 89.0}}
    assert read_ceiling_pct(None, stored) == 89.0  # --merge without --read-ceiling-pct: the file's own bar
    assert read_ceiling_pct(92.0, stored) == 92.0  # given: it wins
    assert read_ceiling_pct(None, None) is None and read_ceiling_pct(None, {"accept": None}) is None


def _with_ceilings(data, times):
    """data with the read ceiling's M = 1 cases: {(K, N): ceiling time in us} (the methods take 10 us)."""
    for (k, n), t in times.items():
        for meth in accept.WEIGHT_ONLY:
            data["results"].append({**_case(k, n, 1, accept.ceiling_name(meth), t), "family": "ceiling"})
    return data


def test_acceptance_against_the_read_ceiling_measured_in_the_run():
    # with the ceiling measured, M = 1 is judged against it (90% / 80%), not against the copy floor
    data = _with_ceilings(_synthetic(big_w4_pct=50.0, small_w8_pct=50.0), {(8192, 8192): 9.2, (4096, 4096): 8.1})
    line = accept.evaluate(data)[0]
    assert line.name == "M = 1, % of the read ceiling" and line.verdict == "PASS" and line.checked == 6
    data = _with_ceilings(_synthetic(), {(8192, 8192): 8.9, (4096, 4096): 8.1})
    line = accept.evaluate(data)[0]
    assert line.verdict == "FAIL" and len(line.failures) == 3
    assert line.failures[0] == "8192x8192 (32.0 MiB) mixgemm W4A16 g128: 89.0% < 90.0%"
    data = _with_ceilings(_synthetic(), {(8192, 8192): 9.5})  # the 8 MiB layer's ceiling not measured
    line = accept.evaluate(data)[0]
    assert line.verdict == "INCOMPLETE" and any("read ceiling" in m for m in line.missing)
    assert "read ceiling mixgemm W4A16 g128" in accept.METHODS


def test_read_ceiling_methods_and_bytes():
    from mixgemm.bench import read_ceiling
    from mixgemm.bench.methods import Context, all_methods

    assert read_ceiling.format_bytes(4096, 1024, 4, 128, "sym") == 1024 * 2048 + 1024 * 32 * 2
    assert read_ceiling.format_bytes(4096, 1024, 4, 128, "zero_point") == 1024 * 2048 + 1024 * 32 * 3
    assert read_ceiling.format_bytes(4100, 10, 8, -1, "sym") == 41000 + 20
    names = [m.name for m in all_methods([4, 8], 128)]
    ceilings = [m for m in all_methods([4, 8], 128) if m.family == "ceiling"]
    assert {m.name for m in ceilings} == set(accept.CEILINGS) and set(accept.CEILINGS) <= set(names)
    assert all(m.unavailable(Context(torch.device("cpu"))) == "needs a CUDA GPU" for m in ceilings)
    assert ceilings[0].applies(16, 4096, 4096, None) == "the read ceiling is measured at M = 1"
    assert ceilings[0].applies(1, 4096, 4096, None) is None


def test_read_probe_compiles():
    from mixgemm.bench.read_ceiling import PATTERNS, PROBE
    from mixgemm.kernels.cuda import nvrtc

    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")
    for p in PATTERNS:
        assert len(nvrtc.compile_cubin(PROBE, tuple(sorted(p.defines().items())), "sm_90")) > 1000
