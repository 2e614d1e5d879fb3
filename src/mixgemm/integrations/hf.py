"""Hugging Face transformers helpers: configs of published models (Llama, Qwen2 / Qwen3, Mistral, Gemma-2, Phi-3 and
mixture-of-experts ones) with random weights, the dequantized-float twin of a quantized model (convolutions too), and a
greedy decode loop over a static KV cache (eager or torch.compile'd; a compiled step refuses a cache that slides).

Needs ``transformers`` (imported lazily, so that mixgemm itself does not depend on it).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mixgemm.nn.conv import QuantConv2d
from mixgemm.nn.experts import QuantizedExperts, dequantize_experts_
from mixgemm.nn.linear import QuantLinear

# Llama-3-8B's shapes (random weights: no checkpoint is downloaded).
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
# Qwen2-7B's shapes (q / k / v carry biases in transformers' Qwen2 architecture).
QWEN2_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rope_theta=1000000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False)
# Qwen2.5-1.5B's shapes, lm_head untied (the checkpoint ties it to the embeddings): a small decode-bound model.
QWEN2_5_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                    num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False)
# A tiny model for CPU tests: hidden 64 (group sizes 32 / 64 fit every K), 2 layers, GQA.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
# Mixture-of-experts models (transformers' fused experts modules, mixgemm.nn.experts): Qwen3-30B-A3B's shapes (128
# experts of width 768, 8 per token) and Mixtral-8x7B's (8 experts of width 14336, 2 per token)
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
MIXTRAL_8X7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
TINY_MOE = dict(TINY, num_experts=4, num_local_experts=4, moe_intermediate_size=128, num_experts_per_tok=2)
# The other architectures of issue 108's list, their published config.json sizes. Mistral-7B-v0.1 (sliding window
# 4096); Mistral-Nemo-Base-2407 (head_dim 128 != hidden / heads; no sliding window); Gemma-2-9B (sliding window on
# every other layer, attention and final logit softcapping, embeddings tied to the lm_head); Phi-3-mini-4k (fused
# qkv_proj / gate_up_proj, sliding window 2047); Qwen3-8B (q / k norms); Qwen1.5-MoE-A2.7B (60 experts of width 1408,
# 4 per token, a gated shared expert of width 5632); DeepSeek-V2-Lite (MLA: kv_lora_rank 512, no q_lora; 64 routed
# experts of width 1408, 6 per token, 2 shared; layer 0 dense; its yarn rope scaling left out: no size changes).
MISTRAL_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                  rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False)
MISTRAL_NEMO_12B = dict(vocab_size=131072, hidden_size=5120, intermediate_size=14336, num_hidden_layers=40,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=1024000,
                        rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False)
GEMMA2_9B = dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                 max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096,
                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                 tie_word_embeddings=True)
PHI3_MINI = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                 original_max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=2047,
                 tie_word_embeddings=False)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
QWEN1_5_MOE_A2_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                         shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                         norm_topk_prob=False, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                         max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=False)
DEEPSEEK_V2_LITE = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
                        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512,
                        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64,
                        topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
                        max_position_embeddings=163840, rope_theta=10000.0, rms_norm_eps=1e-6,
                        tie_word_embeddings=False)
# Their tiny CPU twins: every in_features a multiple of 128 (W4A16 g128 fits), windows short enough to slide
TINY_128 = dict(TINY, hidden_size=128, intermediate_size=256, head_dim=32)
TINY_ARCHS = {
    "tiny-mistral": dict(TINY_128, sliding_window=4),
    "tiny-mistral-nemo": dict(TINY_128, head_dim=64, sliding_window=None),  # heads x head_dim != hidden
    "tiny-gemma2": dict(TINY_128, query_pre_attn_scalar=32, sliding_window=4, attn_logit_softcapping=50.0,
                        final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    "tiny-phi3": dict(TINY_128, num_key_value_heads=4, sliding_window=5, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2),
    "tiny-qwen3": TINY_128,
    "tiny-qwen1.5-moe": dict(TINY_128, moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=4,
                             num_experts_per_tok=2, norm_topk_prob=False),
    "tiny-deepseek-v2": dict(TINY_128, num_key_value_heads=4, moe_intermediate_size=128, n_routed_experts=4,
                             n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=128,
                             q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, head_dim=16,
                             topk_method="greedy", norm_topk_prob=False),
}
MODELS = {"llama3-8b": LLAMA3_8B, "tiny-llama": TINY, "qwen2-7b": QWEN2_7B, "qwen2.5-1.5b": QWEN2_5_1_5B,
          "tiny-qwen2": TINY, "qwen3-30b-a3b": QWEN3_30B_A3B, "mixtral-8x7b": MIXTRAL_8X7B,
          "tiny-qwen3-moe": TINY_MOE, "tiny-mixtral": TINY_MOE, "mistral-7b": MISTRAL_7B,
          "mistral-nemo-12b": MISTRAL_NEMO_12B, "gemma2-9b": GEMMA2_9B, "phi3-mini": PHI3_MINI, "qwen3-8b": QWEN3_8B,
          "qwen1.5-moe-a2.7b": QWEN1_5_MOE_A2_7B, "deepseek-v2-lite": DEEPSEEK_V2_LITE, **TINY_ARCHS}
# transformers model_type of each entry (the rest are "llama")
ARCHITECTURES = {"qwen2-7b": "qwen2", "qwen2.5-1.5b": "qwen2", "tiny-qwen2": "qwen2", "qwen3-30b-a3b": "qwen3_moe",
                 "tiny-qwen3-moe": "qwen3_moe", "mixtral-8x7b": "mixtral", "tiny-mixtral": "mixtral",
                 "mistral-7b": "mistral", "tiny-mistral": "mistral", "mistral-nemo-12b": "mistral",
                 "tiny-mistral-nemo": "mistral", "gemma2-9b": "gemma2", "tiny-gemma2": "gemma2", "phi3-mini": "phi3",
                 "tiny-phi3": "phi3", "qwen3-8b": "qwen3", "tiny-qwen3": "qwen3", "qwen1.5-moe-a2.7b": "qwen2_moe",
                 "tiny-qwen1.5-moe": "qwen2_moe", "deepseek-v2-lite": "deepseek_v2", "tiny-deepseek-v2": "deepseek_v2"}
# the tiny CPU twin of each full-size model
TINY_TWINS = {"llama3-8b": "tiny-llama", "qwen2-7b": "tiny-qwen2", "qwen3-30b-a3b": "tiny-qwen3-moe",
              "mixtral-8x7b": "tiny-mixtral", "mistral-7b": "tiny-mistral", "mistral-nemo-12b": "tiny-mistral-nemo",
              "gemma2-9b": "tiny-gemma2", "phi3-mini": "tiny-phi3", "qwen3-8b": "tiny-qwen3",
              "qwen1.5-moe-a2.7b": "tiny-qwen1.5-moe", "deepseek-v2-lite": "tiny-deepseek-v2"}


def model_config(name: str = "tiny-llama", **overrides):
    """A transformers config of ``name``'s architecture (ARCHITECTURES: model types, "llama" where absent) with its
    shapes (MODELS), fields overridable."""
    from transformers import AutoConfig

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return AutoConfig.for_model(ARCHITECTURES.get(name, "llama"), **{**MODELS[name], **overrides})


def llama_config(name: str = "tiny-llama", **overrides):
    """A transformers LlamaConfig with ``name``'s shapes ("llama3-8b" or "tiny-llama"), fields overridable."""
    if ARCHITECTURES.get(name, "llama") != "llama":
        raise ValueError(f"{name!r} is a {ARCHITECTURES[name]} model, not a Llama: use model_config")
    return model_config(name, **overrides)


def random_model(config, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0):
    """The causal LM of ``config``'s architecture with transformers' random init (normal, std initializer_range =
    0.02), in eval mode, built directly on ``device`` in ``dtype`` (seconds for an 8B model on a GPU)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # built in place in the target dtype: an 8B model in fp32 would need 32 GB
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


random_llama = random_model  # the name the Llama-only helpers had


def dequantized_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A deep copy of ``model`` in which every QuantLinear is an nn.Linear and every QuantConv2d an nn.Conv2d (followed
    by its fused ReLU / ReLU6) holding its dequantized weight (in ``dtype``, default: the dtype of the model's other
    float parameters, e.g. its embeddings or norms): the float model that the quantized one must reproduce."""
    # the kernel-layout caches hang on the qweight buffers (mixgemm.ops.custom_ops) and on QuantConv2d: leave them out
    # of the copy
    stash = {}
    for m in model.modules():
        if isinstance(m, (QuantLinear, QuantConv2d)) and "_mixgemm_qw" in m.qweight.__dict__:
            stash[m.qweight] = m.qweight.__dict__.pop("_mixgemm_qw")
    conv_caches = {m: m._qw_cache for m in model.modules() if isinstance(m, QuantConv2d)}
    for m in conv_caches:
        m._qw_cache = None
    try:
        twin = copy.deepcopy(model)
    finally:
        for t, v in stash.items():
            t._mixgemm_qw = v
        for m, v in conv_caches.items():
            m._qw_cache = v
    if dtype is None:
        quant = {id(p) for m in twin.modules() if isinstance(m, QuantLinear) for p in m.parameters()}
        floats = [p.dtype for p in twin.parameters() if p.is_floating_point() and id(p) not in quant]
        dtype = floats[0] if floats else torch.float32
    for mod in list(twin.modules()):
        if isinstance(mod, QuantizedExperts):
            dequantize_experts_(mod, dtype)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, QuantLinear):
            fl = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
            fl.weight = nn.Parameter(mod.dequantize(dtype), requires_grad=False)
        elif isinstance(mod, QuantConv2d):
            fl = nn.Conv2d(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride, mod.padding, mod.dilation,
                           mod.groups, mod.bias is not None, device="meta")
            fl.weight = nn.Parameter(mod.dequantized_weight(dtype), requires_grad=False)
        else:
            continue
        if mod.bias is not None:
            fl.bias = nn.Parameter(mod.bias.detach().to(dtype), requires_grad=False)
        act = getattr(mod, "activation", None)
        if act is not None:  # a fused activation: the float layer, then the activation
            fl = nn.Sequential(fl, {"relu": nn.ReLU(), "relu6": nn.ReLU6()}[act])
        parent, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent), child, fl)
    return twin


def sliding_window(model) -> int | None:
    """The attention window of ``model``'s sliding layers (Mistral, Gemma-2, Phi-3...), None without one."""
    cfg = model.config.get_text_config()
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types) or getattr(
            cfg, "use_sliding_window", True) is False:
        return None
    return int(window)


def static_cache(model, batch: int, max_len: int):
    """transformers' StaticCache of ``max_len`` tokens for ``model``. Where every token fits the sliding window
    (max_len <= the window), the sliding layers are plain static layers: they hold the same keys, and their update
    reads no Python counter (a sliding layer's position count, which a compiled step would recompile on at every
    token)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=max_len)
    window = sliding_window(model)
    if window is not None and max_len <= window:
        cache.layers = [StaticLayer(max_cache_len=max_len) if getattr(layer, "is_sliding", False) else layer
                        for layer in cache.layers]
    return cache


def sliding_layers(cache) -> list[int]:
    """The indices of ``cache``'s layers that slide (keep the last window tokens only)."""
    return [i for i, layer in enumerate(getattr(cache, "layers", ())) if getattr(layer, "is_sliding", False)]


@torch.no_grad()
def greedy_decode(model, input_ids: torch.Tensor, new_tokens: int, cache=None, step_fn=None,
                  max_len: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy generation over a static KV cache: one eager prefill, then ``new_tokens - 1`` decode steps
    through ``step_fn(input_ids [B, 1], cache_position [1], cache) -> logits [B, 1, V]`` (default: the eager
    model; pass ``compiled_step(model)`` for torch.compile). Returns (tokens [B, new_tokens], the logits of
    every step as float32 [B, V])."""
    b, t = input_ids.shape
    max_len = max_len or t + new_tokens
    cache = cache if cache is not None else static_cache(model, b, max_len)
    step_fn = step_fn or decode_step(model)
    pos = torch.arange(t, device=input_ids.device)
    logits = model(input_ids, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1]
    out, all_logits = [], []
    for i in range(new_tokens):
        all_logits.append(logits.float().clone())  # a CUDA-graph replay reuses its output buffer
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
        if i == new_tokens - 1:
            break
        pos = torch.tensor([t + i], device=input_ids.device)
        logits = step_fn(tok, pos, cache)[:, -1]
    return torch.cat(out, dim=1), all_logits


def decode_step(model):
    """The eager decode step: (input_ids [B, 1], cache_position [1], cache) -> logits [B, 1, V]."""

    def step(tok, pos, cache):
        return model(tok, past_key_values=cache, cache_position=pos, position_ids=pos[None].expand(tok.shape[0], 1),
                     use_cache=True).logits

    return step


def compiled_step(model, mode: str | None = None, fullgraph: bool = True, backend: str = "inductor"):
    """decode_step(model) under torch.compile(fullgraph=True, dynamic=False); ``mode="reduce-overhead"``
    adds CUDA graphs on a GPU. Run one eager decode step first on a GPU, so that the kernels compile and
    their weight layouts are built outside the graphs' memory pool. The cache it is called with must not slide
    (static_cache with max_len <= the model's sliding window): a sliding layer counts positions in a Python int, on
    which every step would compile afresh; the step refuses such a cache (ValueError)."""
    compiled = torch.compile(decode_step(model), fullgraph=fullgraph, dynamic=False, mode=mode, backend=backend)

    def step(tok, pos, cache):
        check_compilable_cache(model, cache)
        return compiled(tok, pos, cache)

    return step


class SlidingCacheError(ValueError):
    """A compiled decode step was handed a cache whose layers slide."""


def check_compilable_cache(model, cache) -> None:
    """SlidingCacheError (a ValueError) naming the architecture where ``cache`` has layers that slide (a compiled
    decode step would recompile at every token on them)."""
    sliding = sliding_layers(cache)
    if sliding:
        raise SlidingCacheError(
            f"a compiled decode step cannot run {model.config.model_type}'s sliding-window cache layers {sliding} "
            f"(window {sliding_window(model)} tokens, shorter than the cache): each step would recompile. Use a "
            f"cache of at most the window (mixgemm.integrations.hf.static_cache), the eager step (decode_step), or "
            f"model.generate(cache_implementation='static')")
