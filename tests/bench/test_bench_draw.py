"""`mixgemm bench --random N --seed S` (fresh layer shapes drawn from real-model distributions) and `--model` with a
transformers model type: the draw, its seed, the CLI's one-line errors and a CPU run end to end."""

from __future__ import annotations

import json
import re

import pytest

from mixgemm.__main__ import main as mixgemm_main
from mixgemm.bench import draw, models, output
from mixgemm.bench.methods import BASELINE_CPU

SEEDS = range(12)


def _kinds(d: draw.Draw) -> set[str]:
    return {draw._kind(lay) for lay in d.layers}


def test_a_draw_is_the_same_for_a_seed_and_differs_across_seeds():
    a, b = draw.draw_layers(40, 7), draw.draw_layers(40, 7)
    assert a.layers == b.layers and a.models == b.models
    shapes = {tuple(lay.shape for lay in draw.draw_layers(40, s).layers) for s in SEEDS}
    assert len(shapes) == len(SEEDS)
    assert draw.new_seed() != draw.new_seed()  # from the OS: equal once in 2^32


def test_drawn_shapes_are_distinct_aligned_and_in_bounds():
    for s in SEEDS:
        d = draw.draw_layers(40, s)
        shapes = [lay.shape for lay in d.layers]
        assert len(shapes) == 40 and len(set(shapes)) == 40
        for k, n in shapes:
            assert k % 64 == 0 and n % 64 == 0 and min(k, n) >= 512 and max(k, n) <= 32768, (s, k, n)


def test_drawn_layers_are_their_models_layers_with_fused_widths_and_gqa():
    every = [draw.draw_layers(40, s) for s in SEEDS]
    kinds = set().union(*map(_kinds, every))
    assert {"qkv (fused)", "gate_up (fused)", "o_proj", "down_proj"} <= kinds
    shapes = [lay.shape for d in every for lay in d.layers]
    assert any(k == n for k, n in shapes) and any(n > 2 * k for k, n in shapes) and any(k > 2 * n for k, n in shapes)
    gqa = fused = 0
    for d in every:
        for lay, m in zip(d.layers, d.models, strict=True):
            assert lay in models.linear_layers(m)  # the layer is one its drawn model has
            assert m.num_attention_heads % m.num_key_value_heads == 0
            gqa += 1 < m.num_key_value_heads < m.num_attention_heads
            if draw._kind(lay) == "qkv (fused)":
                assert lay.k == m.hidden_size
                assert lay.n == (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim
                fused += 1
            if lay.name == "gate_up (fused)":
                assert lay.shape == (m.hidden_size, 2 * m.intermediate_size)
                fused += 1
            if lay.name == "experts.gate_up (fused)":
                assert lay.shape == (m.hidden_size, 2 * m.expert_intermediate)
    assert gqa > len(shapes) // 3 and fused > len(shapes) // 4
    # a mixture of experts now and then: routed experts narrower than the model
    assert any(m.expert_intermediate and m.expert_intermediate < m.hidden_size for d in every for m in d.models)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_draw_refuses_a_bad_count(bad):
    with pytest.raises(ValueError, match="count must be a positive integer"):
        draw.draw_layers(bad, 1)


@pytest.mark.parametrize("bad", [-1, 2**32, "3"])
def test_draw_refuses_a_bad_seed(bad):
    with pytest.raises(ValueError, match="seed must be an integer"):
        draw.draw_layers(3, bad)


def _one_line_error(capsys, argv: list[str], needle: str) -> None:
    assert mixgemm_main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mixgemm bench: error:") and "\n" not in err and needle in err, err


def test_bad_input_gets_one_line_errors(tmp_path, capsys):
    _one_line_error(capsys, ["--random", "0"], "--random: 0 must be at least 1")
    _one_line_error(capsys, ["--random", "-4"], "--random: -4 must be at least 1")
    _one_line_error(capsys, ["--random", "many"], "--random: 'many' is not an integer")
    _one_line_error(capsys, ["--random", "3", "--seed", "-1"], "--seed: -1 must be in [0, 4294967295]")
    _one_line_error(capsys, ["--random", "3", "--seed", "x"], "--seed: 'x' is not an integer")
    _one_line_error(capsys, ["--random", "3", "--model", "mistral"], "--model and --random both choose the shapes")
    _one_line_error(capsys, ["--model", "no-such-architecture"], "transformers model type")
    _one_line_error(capsys, ["--model", "t5"], "T5Config defaults): config has no 'hidden_size'")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "intermediate_size": 256, "num_attention_heads": 4}))
    _one_line_error(capsys, ["--model", str(cfg)], "config has no 'hidden_size'")


def test_model_type_gives_the_architectures_default_shapes():
    mistral, phi3 = models.resolve(["mistral", "phi3"])  # MistralConfig(), Phi3Config()
    got = {lay.name: lay.shape for lay in models.linear_layers(mistral)}
    assert got["qkv (fused)"] == (4096, 4096 + 2 * 8 * 128) and got["gate_up (fused)"] == (4096, 2 * 14336)
    assert got["down_proj"] == (14336, 4096) and mistral.source == "transformers MistralConfig() defaults"
    assert {lay.name: lay.shape for lay in models.linear_layers(phi3)}["qkv_proj"] == (3072, 3 * 3072)
    # a name of the committed list, and a path, still win over a model type
    assert models.resolve(["llama-3-8b"])[0].source == "meta-llama/Meta-Llama-3-8B"


def _small_seed(count: int) -> int:
    """A seed whose draw holds a layer small enough for the CPU run (at most CPU_MODEL_MAX_WEIGHTS weights)."""
    from mixgemm.bench.cli import CPU_MODEL_MAX_WEIGHTS

    return next(s for s in range(1000) if any(k * n <= CPU_MODEL_MAX_WEIGHTS
                                               for k, n in draw.draw_layers(count, s).by_shape()))


def test_cli_random_prints_its_seed_and_reruns_the_same_draw(tmp_path, capsys, monkeypatch):
    seed = _small_seed(3)
    monkeypatch.setattr(draw, "new_seed", lambda: seed)  # the seed a run without --seed would pick
    argv = ["bench", "--device", "cpu", "--random", "3", "-m", "1", "--methods", f"mixgemm W4A16 g128,{BASELINE_CPU}",
            "--out", str(tmp_path), "--no-progress"]
    assert mixgemm_main(argv) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "--random 3 --seed" in ln)
    printed = int(re.search(r"--seed (\d+)", line).group(1))
    assert printed == seed and f"--random 3 --seed {seed} draws these shapes again" in out
    drawn = [f"{k}x{n}" for k, n in draw.draw_layers(3, seed).by_shape()]
    assert line.endswith(" ".join(drawn))
    data = json.loads((tmp_path / "cpu" / f"random-{seed}.json").read_text())
    assert data["meta"]["random"] == {"count": 3, "seed": seed} and data["meta"]["seed"] == seed
    assert list(data["layers"]) == drawn and all(":" in v for v in data["layers"].values())
    assert data["results"] and all(r["status"] == "ok" for r in data["results"])
    assert f"fresh draw of 3 layer shapes, seed {seed}" in output.header_line(data)

    # --seed given: the same shapes, and new_seed is not asked
    monkeypatch.setattr(draw, "new_seed", lambda: pytest.fail("--seed was given"))
    assert mixgemm_main(argv + ["--seed", str(seed), "--time-budget", "0.001"]) == 0
    again = capsys.readouterr().out
    assert next(ln for ln in again.splitlines() if "--random 3 --seed" in ln) == line


def test_cli_model_type_names_its_file_and_layers(tmp_path, capsys):
    assert mixgemm_main(["bench", "--device", "cpu", "--model", "gemma2", "--methods", "accept", "-m", "1",
                         "--time-budget", "0.001", "--out", str(tmp_path), "--no-progress"]) == 0
    data = json.loads((tmp_path / "cpu" / "model-gemma2.json").read_text())
    # Gemma2Config(): hidden 2304, 8 heads of 256 (query width 2048), 4 key/value heads, intermediate 9216
    assert data["layers"]["2304x9216"] == "gate_proj, up_proj" and data["layers"]["2048x2304"] == "o_proj"
    assert data["layers"]["2304x4096"] == "qkv (fused)"


def test_the_acceptance_view_of_a_draw_names_its_seed():
    from mixgemm.bench import accept

    data = {"meta": {"gpu": "Test GPU", "device": "cuda", "random": {"count": 40, "seed": 123}}, "results": [],
            "baseline": "fp16 cuBLAS"}
    assert "Fresh draw, seed 123 (`mixgemm bench --random 40 --seed 123`): 0 shapes" in accept.to_markdown(data)
    del data["meta"]["random"]
    assert "Fresh draw" not in accept.to_markdown(data)
