"""Hugging Face Llama (random weights) quantized with mixgemm.quantize_: generate equals the dequantized-float
model token for token, static KV cache + torch.compile(fullgraph=True) decode equals eager, checkpoints
round-trip. CPU tests use a tiny Llama (hidden 64, 2 layers); the GPU test uses Llama-3-8B layer shapes."""

from __future__ import annotations

import pytest
import torch
import transformers  # noqa: F401  (required: installed in CI, not an optional extra)

import mixgemm
from mixgemm.integrations.hf import (
    compiled_step,
    dequantized_copy,
    greedy_decode,
    llama_config,
    random_llama,
)
from mixgemm.nn import QuantLinear

PROMPT_LEN, NEW = 7, 8


def _prompt(batch=2, vocab=256, seed=1, device="cpu"):
    return torch.randint(0, vocab, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("cfg", [mixgemm.W4A16(group_size=32), mixgemm.W8A16(),
                                 mixgemm.W4A16(group_size=64, mode="zero_point"), mixgemm.W8A8(group_size=32)])
def test_generate_matches_dequantized_float_model(cfg):
    model = random_llama(llama_config())
    rep = mixgemm.quantize_(model, cfg)
    assert len(rep.replaced) == 2 * 7 + 1 and not rep.skipped  # q k v o gate up down per layer + lm_head
    ids = _prompt()
    mask = torch.ones_like(ids)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    if not cfg.activation_quantized:
        twin = dequantized_copy(model)
        assert not any(isinstance(m, QuantLinear) for m in twin.modules())
        want = twin.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        assert torch.equal(got, want)
        # the CPU path dequantizes exactly like the twin, so the logits agree to float32 rounding
        _, lq = greedy_decode(model, ids, NEW)
        _, lf = greedy_decode(twin, ids, NEW)
        for a, b in zip(lq, lf, strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    # same tokens from the explicit static-cache loop as from generate
    toks, _ = greedy_decode(model, ids, NEW)
    assert torch.equal(toks, got[:, PROMPT_LEN:])


def test_quantize_reports_unfit_layers():
    """Weight-only, K = 64 is one partial group of 128; int8 activations need whole groups, so those layers stay
    float with the reason."""
    model = random_llama(llama_config())
    rep = mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    assert len(rep.replaced) == 15 and not rep.skipped
    model = random_llama(llama_config())
    rep = mixgemm.quantize_(model, mixgemm.W8A8(group_size=128))
    assert rep.replaced == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]  # K = 128
    assert len(rep.skipped) == 13 and all("K=64 ends in a partial group of 64 (group size 128): int8 activations "
                                          "need whole groups" in w for w in rep.skipped.values())


def test_static_cache_compiled_decode_equals_eager():
    """Decode steps under torch.compile(fullgraph=True) with a static KV cache give the eager tokens and
    logits (one compile; inductor on the CPU)."""
    torch._dynamo.reset()
    model = random_llama(llama_config())
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    ids = _prompt()
    eager_toks, eager_logits = greedy_decode(model, ids, NEW)
    comp_toks, comp_logits = greedy_decode(model, ids, NEW, step_fn=compiled_step(model))
    assert torch.equal(eager_toks, comp_toks)
    for a, b in zip(eager_logits, comp_logits, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_checkpoint_round_trip_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    model = random_llama(llama_config(), seed=0)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="offset"))
    save_file(model.state_dict(), tmp_path / "q.safetensors")
    fresh = random_llama(llama_config(), seed=123)  # different weights, same architecture and format
    mixgemm.quantize_(fresh, mixgemm.W4A16(group_size=32, mode="offset"))
    ids = _prompt()
    assert not torch.equal(greedy_decode(fresh, ids, NEW)[0], greedy_decode(model, ids, NEW)[0])
    fresh.load_state_dict(load_file(tmp_path / "q.safetensors"))
    assert torch.equal(greedy_decode(fresh, ids, NEW)[0], greedy_decode(model, ids, NEW)[0])


@pytest.mark.gpu
def test_llama3_8b_shapes_cuda_generate_and_compiled_decode():
    """Llama-3-8B layer shapes (2 of the 32 layers, to keep the test short), fp16, W4A16 g128 on CUDA.

    * Compiled (fullgraph, CUDA graphs) decode equals eager decode: same tokens, logits within fp16 noise.
    * Against the dequantized fp16 model: the kernels and cuBLAS round differently, so exact logits cannot be
      compared; the quantized model's greedy token at each step is the float model's argmax (teacher-forced
      on the same sequence) up to that numerical difference (a near-tie in the float model may flip).
    """
    torch._dynamo.reset()
    cfg = llama_config("llama3-8b", num_hidden_layers=2)
    model = random_llama(cfg, dtype=torch.float16, device="cuda")
    rep = mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    assert not rep.skipped
    ids = _prompt(vocab=cfg.vocab_size, device="cuda")
    eager_toks, eager_logits = greedy_decode(model, ids, 16)
    comp_toks, comp_logits = greedy_decode(model, ids, 16, step_fn=compiled_step(model, mode="reduce-overhead"))
    assert torch.equal(eager_toks, comp_toks)
    for a, b in zip(eager_logits, comp_logits, strict=True):
        assert float((a - b).norm() / b.norm()) <= 2e-3
    twin = dequantized_copy(model)
    with torch.no_grad():
        full = torch.cat([ids, eager_toks], dim=1)
        lf = twin(full).logits[:, PROMPT_LEN - 1:-1].float()  # [B, 16, V]
    lq = torch.stack(eager_logits, dim=1)
    assert float((lq - lf).norm() / lf.norm()) <= 5e-3
    tol = 4 * float((lq - lf).abs().max())
    chosen = lf.gather(-1, eager_toks[..., None])[..., 0]
    assert bool((chosen >= lf.amax(-1) - tol).all())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_e2e_bench_smoke_cpu(name):
    """The e2e decode benchmark's code path (mixgemm.bench.e2e.run_e2e) on the CPU with the tiny models (Llama and
    Qwen2 architectures) and dynamo's eager backend (no timing claims: the numbers come from the GPU)."""
    from mixgemm.bench.e2e import format_table, run_e2e

    rows = run_e2e(name, batches=(1, 3), config=mixgemm.W4A16(group_size=32), prompt_len=5, steps=2,
                   warmup=1, mode=None, backend="eager", device="cpu", log=lambda s: None)
    assert [r["batch"] for r in rows] == [1, 3]
    assert all(r["fp16_tok_s"] > 0 and r["quant_tok_s"] > 0 and r["speedup"] > 0 for r in rows)
    assert "W4A16 g32 sym" in format_table(rows) and "quant weights GB" in format_table(rows)
    assert rows[0]["dtype"] == "float32" and "W4A16 g32 sym, float32 model" in format_table(rows)
    # the memory next to tokens/s: the quantized Linears' packed int4 (+ fp16 scales) against their fp32 weights,
    # everything else (embeddings, norms) held by both; the CPU path builds no kernel layouts
    r = rows[-1]
    assert r["quant_layout_ratio"] == 1.0 and 0 < r["quant_weight_gb"] < r["fp16_weight_gb"]
