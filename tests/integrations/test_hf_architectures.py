"""The architectures of issue 108 (Llama, Qwen2, Mistral with a sliding window, Mistral-Nemo, Gemma-2, Phi-3, Qwen3,
Qwen1.5-MoE, DeepSeek-V2's MLA + MoE) at tiny sizes on the CPU: quantize_ (W4A16 g32), transformers' generate with
its default cache and a static one, and mixgemm.integrations.hf's decode helpers give the dequantized twin's greedy
tokens; the compiled decode step refuses a cache that slides, and compiles once on one that does not."""

from __future__ import annotations

import pytest
import torch

import mixgemm
from mixgemm.integrations.hf import (
    MODELS,
    TINY_TWINS,
    compiled_step,
    dequantized_copy,
    greedy_decode,
    model_config,
    random_model,
    sliding_layers,
    static_cache,
)

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-mistral-nemo", "tiny-gemma2", "tiny-phi3", "tiny-qwen3",
         "tiny-qwen1.5-moe", "tiny-deepseek-v2"]
PROMPT, NEW = 7, 4  # 11 tokens: past the tiny sliding windows (4, 5), so the sliding layers slide


def _quantized(name: str):
    model = random_model(model_config(name), seed=1)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    # only a lm_head tied to the embeddings stays float (Gemma-2)
    assert set(report.skipped) <= {"lm_head"} and report.replaced
    return model


@torch.no_grad()
def _generate(model, ids, cache_implementation, new=NEW):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, cache_implementation=cache_implementation,
                         output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:], torch.stack(out.logits)


@pytest.mark.parametrize("name", ARCHS)
def test_quantized_generate_matches_dequantized_twin(name):
    model = _quantized(name)
    twin = dequantized_copy(model)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    for cache in (None, "static"):
        tokens, logits = _generate(model, ids, cache)
        want_tokens, want_logits = _generate(twin, ids, cache)
        assert tokens.tolist() == want_tokens.tolist(), (name, cache)
        torch.testing.assert_close(logits, want_logits, rtol=1e-3, atol=1e-3)
    # the project's eager decode loop over its static cache: the same greedy tokens
    helper_tokens, helper_logits = greedy_decode(model, ids, NEW)
    assert helper_tokens[0].tolist() == want_tokens.tolist()
    torch.testing.assert_close(torch.stack(helper_logits)[:, 0], want_logits[:, 0], rtol=1e-3, atol=1e-3)


def test_every_published_model_has_a_tiny_twin_of_its_architecture():
    for full, tiny in TINY_TWINS.items():
        assert type(model_config(full)) is type(model_config(tiny)), full
    nemo = model_config("mistral-nemo-12b")
    assert (nemo.hidden_size, nemo.num_attention_heads * nemo.head_dim, nemo.sliding_window) == (5120, 4096, None)
    lite = model_config("deepseek-v2-lite")
    assert (lite.kv_lora_rank, lite.q_lora_rank, lite.n_routed_experts, lite.num_experts_per_tok,
            lite.first_k_dense_replace, lite.qk_nope_head_dim + lite.qk_rope_head_dim) == (512, None, 64, 6, 1, 192)
    assert MODELS["gemma2-9b"]["tie_word_embeddings"] and model_config("gemma2-9b").final_logit_softcapping == 30.0


def test_static_cache_within_the_window_does_not_slide():
    model = random_model(model_config("tiny-gemma2"), seed=0)  # sliding window 4 on every other layer
    assert sliding_layers(static_cache(model, 1, 5)) == [0]
    assert sliding_layers(static_cache(model, 1, 4)) == []


def test_compiled_step_refuses_a_sliding_cache():
    model = random_model(model_config("tiny-mistral"), seed=0)  # window 4
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mistral's sliding-window cache layers \[0, 1\] \(window 4"):
        greedy_decode(model, ids, 3, step_fn=compiled_step(model, backend="eager"))


def test_compiled_step_compiles_once_on_a_sliding_window_model():
    from torch._dynamo.utils import counters

    model = _quantized("tiny-mistral")
    ids = torch.randint(0, model.config.vocab_size, (1, 1), generator=torch.Generator().manual_seed(3))
    want, want_logits = greedy_decode(model, ids, 3)  # a cache of 1 + 3 tokens: the window, its layers not sliding
    tokens, logits = _generate(model, ids, "static", new=3)  # transformers' own sliding layers
    assert want[0].tolist() == tokens.tolist()
    torch.testing.assert_close(torch.stack(want_logits)[:, 0], logits[:, 0], rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    counters.clear()
    got, _ = greedy_decode(model, ids, 3, step_fn=compiled_step(model, backend="eager"))
    assert got.tolist() == want.tolist()
    assert counters["stats"]["unique_graphs"] == 1  # two steps, one graph: no recompile per position


def test_decode_benchmark_refuses_a_run_past_the_window():
    from mixgemm.bench.e2e import decode_tokens_per_s
    from mixgemm.integrations.hf import SlidingCacheError

    model = random_model(model_config("tiny-phi3"), seed=0)  # window 5: a prompt of 4 + 3 steps slides
    with pytest.raises(SlidingCacheError, match=r"phi3's sliding-window cache layers \[0, 1\] \(window 5"):
        decode_tokens_per_s(model, 1, 4, 1, 1, model.config.vocab_size, 0, None, "eager")
