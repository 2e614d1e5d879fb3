"""End-to-end generation speed and weight memory of Hugging Face models (random weights, published shapes), fp16
against mixgemm.quantize_, batch 1.

Speed, per model (--models, mixgemm.integrations.hf.MODELS: issue 108's architectures "llama3-8b", "qwen2-7b",
"mistral-7b" (sliding window), "mistral-nemo-12b", "gemma2-9b" (hybrid sliding cache, softcapping, tied lm_head, which
stays float), "phi3-mini", "qwen3-8b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite" (MLA), and "qwen3-30b-a3b",
"mixtral-8x7b"): the float model and a copy of it quantized with W4A16(group_size=128), both resident:
* "generate": ``model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)`` with its default cache;
* "static": the same with ``cache_implementation="static"`` (on a GPU transformers then compiles the decode
  forward itself, mode "reduce-overhead": CUDA graphs);
* "continuous": transformers' continuous batching, ``model.generate_batch`` (paged attention) of --cb-requests
  random prompts of --cb-prompt-len tokens to --cb-new-tokens greedy tokens each (32 x 128 + 128), with the fastest
  settings transformers offers, the same for both models: its CUDA graphs on (without a flash attention installed
  transformers leaves them off, 3.5x slower on an H200), flash attention where installed, one persistent manager per
  model (its warm-up call captures the graphs) with a paged cache sized for the requests, and fresh prompts each
  round (no prefix-cache hits); tokens/s = all requests' new tokens / wall time. On a GPU, one more call per model
  runs under torch.profiler: the GPU time of its linear layers, attention and the rest, and so the ratio the quantized
  model would reach if its linear layers cost nothing ("linear_ceiling": float wall / (float wall - float linear
  time)). Where transformers fails on the float model itself (DeepSeek-V2's MLA keys and values of two widths in its
  paged cache), the mode is recorded "not_run" with transformers' error;
* "compiled": mixgemm.bench.e2e.decode_tokens_per_s, the decode step under torch.compile(fullgraph=True) with CUDA
  graphs over a static cache (mixgemm.integrations.hf.static_cache: sliding layers hold the whole run when it fits
  the window; a run longer than the window is refused, recorded "not_run").
A random prompt of --prompt-len tokens; each generate mode is warmed up once per model (which compiles, where it
compiles), then the two models take turns for --repeats rounds (median; tokens/s = N / wall time, the prefill
included, as a user sees it; eager decoding is host-bound, and the host's speed drifts between rounds). Each row
carries the GB of the model's weights (its tensors, and for the quantized model the kernel layouts its calls built).
With --dtype bfloat16 both models are bf16 (as transformers loads most checkpoints), with the default --dtype auto the
mixture-of-experts models are; the rows and ratios keep the tag "fp16" for the unquantized model. Ratios quantized /
float; targets (issue 108, dense / MoE): generate >= 1.1x, static >= 2.4x / 1.8x, continuous >= 1.5x, compiled
>= 2.2x (issue 39); and the quantized model's first --greedy-tokens (16) greedy tokens (``generate``, default cache)
equal to its exact twin's (the dequantized weights in float32; the fp16 twin's own tokens and the exact twin's top-2
margins are reported beside). --layers L builds each model with its first L decoder layers (a GPU run in minutes).

Memory, for the first model: rebuilt, quantized (W4A16 g128, then W8A8; --memory-formats), then forward passes of M
= 1, 8, 16, 256, 4096 tokens (batch 1, no cache: every layer sees each M and builds the kernel layouts it needs).
Reported: mixgemm.resident_bytes (plain + cached kernel layouts), the packed size (the QuantLinear layers' qweight /
scales / zeros / offsets), and from torch.cuda.memory_allocated: what the quantized weights hold = allocated after
the sweep - allocated before the model was built - the model's other tensors (embeddings, norms, biases). Target: <=
1.10x the packed size. quantize_ keeps one resident layout per weight on an sm_90 GPU by default (its compact
argument); a format ending in +plain (W4A16+plain) quantizes with compact=False (the plain codes and each kernel's
layout as calls build them), one ending in +compact compacts explicitly after that (mixgemm.compact_, also on the CPU).
--plain times a compact=False copy of the W4A16 model beside the default one (tag w4a16_plain); --separate a copy
whose layers reading one tensor run one by one (mixgemm.nn.siblings.separate_siblings; tag w4a16_separate);
--zero-point a W4A16 g128 zero-point copy, what GPTQ / AWQ checkpoints load as (tag w4a16_zp).

Checks (exit 1): no error in any phase or mode (a failed one is recorded and the rest still run), quantize_
replaced every Linear (but a tied lm_head), every generation has N new tokens (every request of generate_batch too),
the quantized model's first-step logits (last prompt token) are finite and have cosine > 0.99 (W8A8: 0.95, its
activations are quantized too) with its dequantized float twin's (mixgemm.integrations.hf.dequantized_copy). The speed
and memory targets, the greedy agreement and cosine > 0.9 against the fp16 model are reported, enforced only with
--strict.

    PYTHONPATH=src python -m tools.checks.generate_e2e --out DIR [--models qwen2-7b,llama3-8b] [--new-tokens 64]
        [--modes generate,static,continuous,compiled | --skip-compiled] [--layers L] [--strict]
    PYTHONPATH=src python -m tools.checks.generate_e2e --out DIR --smoke    (the logic on the CPU, tiny shapes)

Prints a table, writes DIR/generate_e2e.json (rewritten after every measurement: a run cut short keeps what it had)
and, at the end, DIR/generate_e2e.md (the results page: benchmarks/results/<gpu>/generate.md).
Runtime is mostly compilation: "static" and "compiled" each compile the whole model once per precision (tens of
seconds each for a 7-8B model); --skip-compiled, --modes, --layers or fewer models per call keep a run short, and
--time-budget S starts no model or mode after S seconds (each recorded as not run). GPU memory at its peak:
the fp16 model, the quantized copy and, for the first-step check, its dequantized fp16 twin (about 38 GB for an 8B
model).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import mixgemm
from mixgemm.integrations.hf import TINY_TWINS, SlidingCacheError
from mixgemm.nn.linear import QuantLinear

MODES = ("generate", "static", "continuous", "compiled")
# the memory sweep's formats (W4A16 with the usual group of 128; the int8 ones per channel)
MEMORY_FORMATS = {"W4A16": lambda: mixgemm.W4A16(group_size=128), "W8A16": mixgemm.W8A16, "W8A8": mixgemm.W8A8}
# quantized / float tokens/s per mode, dense and MoE models (issue 108; "compiled": issue 39)
TARGETS = {"generate": (1.1, 1.1), "static": (2.4, 1.8), "continuous": (1.5, 1.5), "compiled": (2.2, 2.2)}
GREEDY_TOKENS = 16  # greedy tokens of the quantized model that must equal its exact (float32) dequantized twin's
MEMORY_MS = (1, 8, 16, 256, 4096)
COMPACT = "+compact"  # a memory format ending in it: quantize_(compact=False), then mixgemm.compact_
PLAIN = "+plain"  # a memory format ending in it: quantize_(compact=False), the plain codes and kernel layouts kept
MEMORY_TARGET = 1.10
# First-step logits. Against the dequantized float twin only rounding differs, and for W8A8 / W4A8 also the
# activation quantization (~1% per layer, which a random-weight model carries on: cosine 0.996 at 4 layers of Qwen2-7B
# width on the CPU), so the hard check is looser there; a wrong kernel lands far below both. Against fp16 4-bit
# round-to-nearest adds ~12% per linear layer on random weights (cosine 0.75 at 4 layers of that width), so that one is
# reported beside its target.
MIN_COSINE_DEQUANTIZED = {"weight-only": 0.99, "activation-quantized": 0.95}
MIN_COSINE_FP16 = 0.9
PACKED_BUFFERS = ("qweight", "scales", "zeros", "offsets", "input_perm")
# --tiny: the same architectures at CPU sizes; hidden 128 so that every K holds a group of 128
TINY_NAMES = TINY_TWINS
TINY_OVERRIDES = dict(hidden_size=128, intermediate_size=256)


@dataclass(frozen=True)
class Settings:
    device: str
    dtype: torch.dtype
    tiny: bool
    new_tokens: int
    prompt_len: int
    repeats: int
    warmup: int
    seed: int
    memory_ms: tuple[int, ...] = MEMORY_MS
    kernel_steps: int = 0  # compiled mode: profile this many more steps (the GPU kernels per step)
    compiled_repeats: int = 1  # compiled mode: timed loops of new_tokens steps (the median)
    plain: bool = False  # speed: also a quantize_(compact=False) copy of the W4A16 model
    separate: bool = False  # speed: also a copy whose sibling layers (q / k / v, gate / up) run one by one
    zero_point: bool = False  # speed: also a W4A16 g128 zero-point copy (GPTQ / AWQ checkpoints' format)
    layers: int = 0  # the models' first `layers` decoder layers only (0: all; MoE models whose fp16 copy is too big)
    moe_dtype: torch.dtype | None = None  # --dtype auto: MoE models in this dtype (bf16), the rest in ``dtype``
    cb_requests: int = 32  # continuous mode: requests, each of cb_prompt_len random tokens and cb_new_tokens new ones
    cb_prompt_len: int = 128
    cb_new_tokens: int = 128
    greedy_tokens: int = GREEDY_TOKENS
    cb_attention: str = ""  # continuous mode: an attn_implementation set on both models for it ("": the models' own)
    deadline: float = 0.0  # time.perf_counter() after which no model or mode starts (0: none; --time-budget)

    def out_of_time(self) -> bool:
        return bool(self.deadline) and time.perf_counter() > self.deadline

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def settings_from(ap: argparse.ArgumentParser, args: argparse.Namespace, modes: list[str], known_modes: tuple,
                  **extra) -> tuple[list[str], Settings]:
    """The models of ``args.models`` and the run's Settings from the common options (--device, --tiny,
    --new-tokens, --prompt-len, --repeats, --warmup, --seed; also tools.checks.actorder_model's); ap.error on an
    unknown model or mode, or --device cuda without a GPU."""
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in TINY_NAMES] + [m for m in modes if m not in known_modes]
    if unknown:
        ap.error(f"unknown model / mode {unknown}; models: {sorted(TINY_NAMES)}, modes: {known_modes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA GPU (use --device cpu --tiny for the logic)")
    name = getattr(args, "dtype", "float16")
    dtype = getattr(torch, "float16" if name == "auto" else name) if args.device == "cuda" else torch.float32
    if name == "auto" and args.device == "cuda":
        extra["moe_dtype"] = torch.bfloat16
    return models, Settings(device=args.device, dtype=dtype,
                            tiny=args.tiny, new_tokens=args.new_tokens, prompt_len=args.prompt_len,
                            repeats=args.repeats, warmup=args.warmup, seed=args.seed, **extra)


def sync(s: Settings):
    if s.cuda:
        torch.cuda.synchronize()


def free_memory(s: Settings):
    torch._dynamo.reset()  # compiled code and CUDA-graph pools hold the previous model's tensors
    gc.collect()
    if s.cuda:
        torch.cuda.empty_cache()


def build(name: str, s: Settings):
    from mixgemm.integrations.hf import model_config, random_model

    cut = {"num_hidden_layers": s.layers} if s.layers else {}
    cfg = model_config(TINY_NAMES[name], **TINY_OVERRIDES, **cut) if s.tiny else model_config(name, **cut)
    dtype = s.moe_dtype if s.moe_dtype is not None and is_moe(cfg) else s.dtype
    return random_model(cfg, dtype=dtype, device=s.device, seed=s.seed)


def is_moe(config) -> bool:
    return any(getattr(config, f, None) for f in ("num_experts", "n_routed_experts", "num_local_experts"))


def prompt(model, s: Settings) -> torch.Tensor:
    gen = torch.Generator().manual_seed(s.seed + 1)
    return torch.randint(0, model.config.vocab_size, (1, s.prompt_len), generator=gen).to(s.device)


@torch.no_grad()
def last_logits(model, ids) -> torch.Tensor:
    return model(ids, use_cache=False).logits[0, -1].float().cpu()


def quantize(model, config, compact: bool = True) -> dict:
    """quantize_ in place; every Linear must be replaced (else the comparison would not be the one asked for), but an
    lm_head tied to the embeddings (Gemma-2), which quantize_ leaves float as it does for a user."""
    t0 = time.perf_counter()
    report = mixgemm.quantize_(model, config, compact=compact)
    if hasattr(model, "_compiled_call"):  # transformers' compiled forward (static-cache generate) saw the fp16 layers
        del model._compiled_call
    untied = {name: why for name, why in report.skipped.items() if "tied" not in why}
    if untied:
        raise RuntimeError(f"quantize_ {config.name} left layers unquantized: {untied}")
    return {"replaced": len(report.replaced), "quantize_s": time.perf_counter() - t0,
            "tied_float": sorted(report.skipped)}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def first_step(model, ids, fp16_logits: torch.Tensor, config, s: Settings, greedy_tokens: int = 0) -> dict:
    """The quantized model's logits of the last prompt token against the fp16 model's (quantization error and all)
    and against its dequantized float twin's (the same weights: what the kernels must reproduce); with
    ``greedy_tokens``, also the greedy tokens of a default-cache ``generate`` of the quantized model, the twin and
    the exact (float32) twin ("greedy", greedy_agreement)."""
    from mixgemm.integrations.hf import dequantized_copy

    got = last_logits(model, ids)
    twin = dequantized_copy(model)
    want = last_logits(twin, ids)
    greedy = greedy_agreement(model, twin, ids, greedy_tokens) if greedy_tokens else None
    del twin
    free_memory(s)
    kind = "activation-quantized" if config.activation_quantized else "weight-only"
    return {"cosine": cosine(fp16_logits, got), "cosine_dequantized": cosine(want, got),
            "min_cosine_dequantized": MIN_COSINE_DEQUANTIZED[kind], "greedy": greedy,
            "finite": bool(torch.isfinite(got).all()), "argmax_equal": int(fp16_logits.argmax()) == int(got.argmax())}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


@torch.no_grad()
def greedy_agreement(model, twin, ids, n: int) -> dict:
    """The first ``n`` greedy tokens (``generate``, default cache) of ``model``, of its dequantized ``twin`` and of
    the exact twin: ``twin`` turned to float32 with transformers' own norms (the same dequantized weights, computed
    without fp16 / bf16 rounding: what a float64 reference is to a kernel test). On random weights the logits are
    nearly flat, so the twin's own rounding can flip a near tie; the exact twin's top-2 logit margin at each step
    (over the logits' standard deviation, "exact_margins") shows how near. ``twin`` is converted in place; where
    its float32 copy does not fit the GPU, the exact comparison is recorded as not run."""
    from mixgemm.nn.norms import use_inductor_norms

    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  pad_token_id=0)
    got, want = (m.generate(ids, **kwargs)[0, ids.shape[1]:].tolist() for m in (model, twin))
    out = {"tokens": n, "equal": got == want, "first_difference": first_difference(got, want),
           "quantized": got, "dequantized": want}
    try:
        use_inductor_norms(twin)
        twin.float()
        run = twin.generate(ids, **kwargs, output_logits=True, return_dict_in_generate=True)
    except torch.cuda.OutOfMemoryError as e:
        return {**out, "exact": f"not run: the float32 twin does not fit ({str(e).splitlines()[0][:120]})"}
    exact = run.sequences[0, ids.shape[1]:].tolist()
    top2 = [torch.topk(step[0].float(), 2).values for step in run.logits]
    margins = [float((t[0] - t[1]) / step[0].float().std()) for t, step in zip(top2, run.logits, strict=True)]
    return {**out, "exact": exact, "exact_equal": got == exact, "exact_first_difference": first_difference(got, exact),
            "twin_exact_first_difference": first_difference(want, exact), "exact_margins": margins}


@torch.no_grad()
def generate_once(model, ids, s: Settings, static: bool) -> float:
    """Seconds of one ``model.generate`` of s.new_tokens greedy tokens (the prompt's prefill included, as a user
    sees it)."""
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens,
                  do_sample=False, pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    t0 = time.perf_counter()
    out = model.generate(ids, **kwargs)
    sync(s)
    sec = time.perf_counter() - t0
    if out.shape[1] - ids.shape[1] != s.new_tokens:
        raise RuntimeError(f"generate gave {out.shape[1] - ids.shape[1]} new tokens, asked for {s.new_tokens}")
    return sec


def time_generate(models: dict, ids, s: Settings, static: bool) -> dict[str, dict]:
    """tokens/s of each model's ``generate`` (median of s.repeats): each is warmed up once (which compiles, where
    it compiles: transformers compiles the decode forward itself for a static cache on a GPU and keeps it on the
    model), then the models take turns, round by round, so that a drift of the host's speed (eager decoding is
    host-bound) hits each alike."""
    out = {}
    for tag, model in models.items():
        out[tag] = {"warmup_s": generate_once(model, ids, s, static), "runs_s": []}
    for _ in range(s.repeats):
        for tag, model in models.items():
            out[tag]["runs_s"].append(generate_once(model, ids, s, static))
    for tag, model in models.items():
        sec = statistics.median(out[tag]["runs_s"])
        out[tag].update(tokens_per_s=s.new_tokens / sec, s=sec,
                        auto_compiled=static and hasattr(model, "_compiled_call"))
    return out


def time_compiled(model, s: Settings) -> dict:
    from mixgemm.bench.e2e import decode_tokens_per_s

    mode, backend = ("reduce-overhead", "inductor") if s.cuda else (None, "eager")
    r = decode_tokens_per_s(model, 1, s.prompt_len, s.warmup, s.new_tokens, model.config.vocab_size, s.seed, mode,
                            backend, kernel_steps=s.kernel_steps, repeats=s.compiled_repeats)
    return {**r, "mode": mode, "backend": backend}


def cb_requests(vocab: int, s: Settings, round_: int) -> list[list[int]]:
    """The requests of one round (fresh prompts each round, the same for both models)."""
    gen = torch.Generator().manual_seed(s.seed + 3 + 1000 * round_)
    return torch.randint(0, vocab, (s.cb_requests, s.cb_prompt_len), generator=gen).tolist()


def cb_config(n_requests: int, s: Settings):
    """The continuous-batching settings, the same for both models: a paged cache sized for the requests (transformers
    would take 90% of the free memory for each model's persistent manager, and the second model's graph capture would
    run out of memory; twice what the requests need) and batches of up to every prompt's tokens (transformers sizes
    them from the free memory too, which on the CPU takes minutes); on a GPU transformers' CUDA graphs on, the rest
    its defaults; the CPU smoke's batches small."""
    import dataclasses

    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    # (the field of a block's tokens: page_size in recent transformers, block_size before)
    page_field = "page_size" if "page_size" in {f.name for f in dataclasses.fields(ContinuousBatchingConfig)} \
        else "block_size"
    page = 256 if s.cuda else 16
    # every request's blocks twice over: the scheduler never waits for a free block
    blocks = 2 * n_requests * -(-(s.cb_prompt_len + s.cb_new_tokens) // page) + 2
    if s.cuda:  # every prompt prefills in one step (as transformers' own sizing did on an H200: 8192 tokens)
        return ContinuousBatchingConfig(use_cuda_graph=True, num_blocks=blocks,
                                        max_batch_tokens=n_requests * s.cb_prompt_len, **{page_field: page})
    return ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=4 * page, **{page_field: page})


@torch.no_grad()
def generate_batch_once(model, requests: list[list[int]], s: Settings) -> float:
    """Seconds of one transformers continuous-batching ``generate_batch`` (paged attention) of ``requests``, each
    to s.cb_new_tokens greedy tokens (cb_config), on the model's persistent manager (the first call creates it and
    captures its CUDA graphs; close_manager ends it)."""
    import logging

    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=s.cb_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    errors = []  # the batching loop logs its errors and returns the requests unfinished

    class Collect(logging.Handler):
        def emit(self, record):
            errors.append(record.getMessage())

    handler = Collect(level=logging.ERROR)
    logger = logging.getLogger("ContinuousBatchingLogger")
    logger.addHandler(handler)
    own_attention = model.config._attn_implementation
    if s.cb_attention:
        model.set_attn_implementation(s.cb_attention)
    try:
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=requests, generation_config=cfg, progress_bar=False,
                                   continuous_batching_config=cb_config(len(requests), s), persistent_manager=True,
                                   warmup=s.cuda)
        sync(s)
        sec = time.perf_counter() - t0
    finally:
        logger.removeHandler(handler)
        if s.cb_attention:
            model.set_attn_implementation(own_attention)
    short = {rid: len(o.generated_tokens) for rid, o in out.items() if len(o.generated_tokens) != s.cb_new_tokens}
    if len(out) != len(requests) or short:
        raise RuntimeError(f"generate_batch finished {len(out)} of {len(requests)} requests, new tokens "
                           f"{short or '-'} (asked {s.cb_new_tokens}); transformers logged: {errors[:3]}")
    return sec


@torch.no_grad()
def warm_kernels(model, s: Settings) -> None:
    """Forward passes of the token counts continuous batching runs the layers at (one decoding token, one per
    request, a prompt), eager and without a cache."""
    for m in (1, s.cb_requests, s.cb_prompt_len):
        model(torch.zeros(1, m, dtype=torch.long, device=s.device), use_cache=False)
    sync(s)


class FloatModelFails(RuntimeError):
    """transformers fails on the float model itself in this mode (e.g. continuous batching on DeepSeek-V2's MLA):
    nothing of mixgemm's to measure."""


def close_manager(model) -> None:
    if hasattr(model, "_cached_continuous_batching_manager"):
        model.destroy_cached_continuous_batching_manager()


# GPU kernels by what they compute, from their names (a kernel's name is all the profiler gives): attention first
# (cuDNN's fused attention names its wgmma), then the linear layers (cuBLAS' nvjet / cutlass / gemm, mixgemm's
# GEMV / GEMM and split-k finish); the rest (elementwise, norms, copies, sampling) is "other"
ATTENTION_KERNELS = ("sdpa", "attn", "attention", "fmha", "flash")
LINEAR_KERNELS = ("nvjet", "gemm", "gemv", "cublas", "cutlass", "xmma", "splitk")


def kernel_kind(name: str) -> str:
    n = name.lower().replace("mixgemm_", "")
    if any(k in n for k in ATTENTION_KERNELS):
        return "attention"
    return "linear" if any(k in n for k in LINEAR_KERNELS) else "other"


def gpu_time_by_kind(events) -> dict[str, float]:
    """Milliseconds of GPU kernel time per kernel_kind of a profiler's key_averages()."""
    ms = {"linear": 0.0, "attention": 0.0, "other": 0.0}
    for e in events:
        if str(e.device_type).endswith("CUDA") and e.self_device_time_total > 0:
            ms[kernel_kind(e.key)] += e.self_device_time_total / 1e3
    return ms


def profiled_batch(model, requests, s: Settings) -> dict:
    """One generate_batch under torch.profiler (GPU activity only): its GPU milliseconds per kernel kind."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sec = generate_batch_once(model, requests, s)
    return {"profiled_wall_s": sec, "gpu_ms": gpu_time_by_kind(prof.key_averages())}


def time_continuous(models: dict, s: Settings) -> dict[str, dict]:
    """tokens/s (every request's new tokens over the wall time) of each model's ``generate_batch``: a warm-up call
    each (which captures transformers' CUDA graphs), then s.repeats rounds in turns, each round's requests fresh;
    on a GPU one profiled call more per model (profiled_batch)."""
    float_model = models["fp16"]
    vocab = float_model.config.vocab_size
    for model in models.values():  # the kernels compile (and build their layouts) before transformers captures graphs
        warm_kernels(model, s)
    warmup = cb_requests(vocab, s, 0)
    try:
        try:
            out = {"fp16": {"warmup_s": generate_batch_once(float_model, warmup, s), "runs_s": []}}
        except RuntimeError as e:
            raise FloatModelFails(f"transformers' continuous batching fails on the float "
                                  f"{float_model.config.model_type} model itself: {e}") from e
        out.update({tag: {"warmup_s": generate_batch_once(model, warmup, s), "runs_s": []}
                    for tag, model in models.items() if tag != "fp16"})
        for r in range(s.repeats):
            requests = cb_requests(vocab, s, r + 1)
            for tag, model in models.items():
                out[tag]["runs_s"].append(generate_batch_once(model, requests, s))
        if s.cuda:
            requests = cb_requests(vocab, s, s.repeats + 1)
            for tag, model in models.items():
                out[tag].update(profiled_batch(model, requests, s))
    finally:
        for model in models.values():
            close_manager(model)
    for tag in models:
        sec = statistics.median(out[tag]["runs_s"])
        out[tag].update(tokens_per_s=s.cb_requests * s.cb_new_tokens / sec, s=sec, requests=s.cb_requests)
    if "gpu_ms" in out["fp16"]:
        wall, linear = out["fp16"]["s"], out["fp16"]["gpu_ms"]["linear"] / 1e3
        out["fp16"]["linear_ceiling"] = wall / max(wall - linear, 1e-9)
    return out


def run_mode(mode: str, models: dict, ids, s: Settings) -> dict[str, dict]:
    """Each model's tokens/s in ``mode``: the generate modes in turns (time_generate, time_continuous), "compiled"
    one model after the other (each compiles afresh); with the weight GB each model holds."""
    free_memory(s)
    if mode == "compiled":
        out = {tag: time_compiled(model, s) for tag, model in models.items()}
    elif mode == "continuous":
        out = time_continuous(models, s)
    else:
        out = time_generate(models, ids, s, static=mode == "static")
    for tag, model in models.items():
        out[tag]["weight_gb"] = weight_bytes(model) / 1e9
    return out


def speed(res: dict, modes, s: Settings, log):
    """fp16 and W4A16 tokens/s of the model res["model"] in each mode, filled into ``res`` as they come: the
    quantized model is a copy of the fp16 one (both resident), so that the generate modes can time them in turns."""
    name = res["model"]
    res["modes"] = {m: {} for m in modes}
    models = {"fp16": build(name, s)}
    res["architecture"] = models["fp16"].config.model_type
    res["decoder_layers"] = models["fp16"].config.num_hidden_layers
    res["moe"] = moe = is_moe(models["fp16"].config)
    res["dtype"] = str(next(models["fp16"].parameters()).dtype).removeprefix("torch.")
    # MoE models: the experts implementation transformers runs the float experts with (the quantized ones run
    # mixgemm.nn.experts' per-expert layers)
    res["experts_implementation"] = getattr(models["fp16"].config, "_experts_implementation", None)
    ids = prompt(models["fp16"], s)
    ref = last_logits(models["fp16"], ids)
    models["w4a16"] = copy.deepcopy(models["fp16"])
    config = mixgemm.W4A16(group_size=128)
    res["quantize"] = quantize(models["w4a16"], config)
    if s.plain:  # a copy keeping the plain codes and every kernel's layout, timed in the same turns
        models["w4a16_plain"] = copy.deepcopy(models["fp16"])
        quantize(models["w4a16_plain"], config, compact=False)
    if s.separate:  # the layers that read one tensor one by one (no joined launch), timed in the same turns
        from mixgemm.nn.siblings import separate_siblings

        models["w4a16_separate"] = copy.deepcopy(models["fp16"])
        quantize(models["w4a16_separate"], config)
        separate_siblings(models["w4a16_separate"])
    if s.zero_point:  # the format GPTQ / AWQ checkpoints load as, timed in the same turns
        models["w4a16_zp"] = copy.deepcopy(models["fp16"])
        quantize(models["w4a16_zp"], mixgemm.W4A16(group_size=128, mode="zero_point"))
    free_memory(s)
    f = res["first_step"] = first_step(models["w4a16"], ids, ref, config, s, s.greedy_tokens)
    log(f"{name}: W4A16 g128 first-step logits cosine {f['cosine']:.4f} vs fp16, "
        f"{f['cosine_dequantized']:.5f} vs the dequantized twin; {greedy_text(f['greedy'])}")
    for mode in modes:
        if s.out_of_time():
            res["modes"][mode] = {"not_run": "time budget (--time-budget) spent"}
            log(f"{name} {mode}: not run (time budget)")
            continue
        try:
            r = run_mode(mode, models, ids, s)
        except (SlidingCacheError, FloatModelFails) as e:  # a refusal, or transformers' own limit: recorded as such
            res["modes"][mode] = {"not_run": str(e)}
            log(f"{name} {mode}: not run: {e}")
            free_memory(s)
            continue
        except Exception:  # one mode failing (a compile error, say) leaves the others to run
            res.setdefault("errors", {})[mode] = err = traceback.format_exc()
            log(f"{name} {mode}: ERROR\n{err}")
            free_memory(s)
            continue
        m = res["modes"][mode]
        m.update(r, ratio=r["w4a16"]["tokens_per_s"] / r["fp16"]["tokens_per_s"], target=TARGETS[mode][moe])
        m["meets"] = m["ratio"] >= m["target"]
        how = " (transformers compiled the decode forward)" if r["w4a16"].get("auto_compiled") else ""
        for tag in r:
            log(f"{name} {tag:5s} {mode:8s}: {r[tag]['tokens_per_s']:8.1f} tok/s  weights "
                f"{r[tag]['weight_gb']:.1f} GB{how if tag != 'fp16' else ''}")
    del models
    free_memory(s)


def weight_bytes(model) -> int:
    """Bytes the model's tensors hold: its parameters and buffers other than the quantized layers' packed ones
    (other_bytes) plus the quantized weights with every kernel layout cached on them (mixgemm.resident_bytes)."""
    return other_bytes(model) + mixgemm.resident_bytes(model)["total"]


def other_bytes(model) -> int:
    """Bytes of the model's tensors other than the quantized layers' packed buffers (storages counted once)."""
    packed = {id(getattr(m, b)) for m in model.modules() if isinstance(m, QuantLinear) for b in PACKED_BUFFERS
              if getattr(m, b, None) is not None}
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in packed or t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()
    return total


def packed_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for m in model.modules() if isinstance(m, QuantLinear)
               for t in (getattr(m, b) for b in PACKED_BUFFERS) if t is not None)


@torch.no_grad()
def memory(res: dict, config, s: Settings, log):
    """Weight memory after M = s.memory_ms have run through every layer of a fresh ``config``-quantized model
    res["model"], filled into ``res``."""
    name = res["model"]
    free_memory(s)
    before = torch.cuda.memory_allocated() if s.cuda else 0
    model = build(name, s)
    ids = prompt(model, s)
    ref = last_logits(model, ids)
    res["quantize"] = quantize(model, config, compact=not (res.get("plain") or res.get("compact")))
    if res.get("compact"):
        report = mixgemm.compact_(model)
        res["quantize"].update(compacted=len(report.compacted), not_compacted=report.skipped)
    free_memory(s)
    res["first_step"] = first_step(model, ids, ref, config, s)
    after_quant = torch.cuda.memory_allocated() if s.cuda else 0
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(s.seed + 2)
    for m in s.memory_ms:
        x = torch.randint(0, vocab, (1, m), generator=gen).to(s.device)
        logits = model(x, use_cache=False).logits
        if not torch.isfinite(logits).all():
            raise RuntimeError(f"{config.name}: non-finite logits at M = {m}")
        del logits
    sync(s)
    gc.collect()
    after = torch.cuda.memory_allocated() if s.cuda else 0
    rb = mixgemm.resident_bytes(model)
    packed, others = packed_bytes(model), other_bytes(model)
    res.update(packed_bytes=packed, other_bytes=others, resident=rb, resident_ratio=rb["total"] / packed)
    if s.cuda:
        held = after - before - others
        res.update(allocated_before_gb=before / 1e9, allocated_after_quantize_gb=after_quant / 1e9,
                   allocated_after_sweep_gb=after / 1e9, quantized_cuda_bytes=held, cuda_ratio=held / packed)
    ratio = res.get("cuda_ratio", res["resident_ratio"])
    res["meets"] = ratio <= MEMORY_TARGET
    cuda = f", cuda x{res['cuda_ratio']:.3f}" if s.cuda else ""
    log(f"{name} {config.name}: packed {packed / 1e6:.1f} MB, resident x{res['resident_ratio']:.3f}{cuda}, "
        f"cosine {res['first_step']['cosine']:.4f} vs fp16, {res['first_step']['cosine_dequantized']:.5f} vs twin")
    del model
    free_memory(s)


def failures(results: dict) -> list[str]:
    bad = [f"{phase}: {err.splitlines()[-1]}" for phase, err in results["errors"].items()]
    bad += [f"speed {r['model']} {key}: {err.splitlines()[-1]}" for r in results["speed"]
            for key, err in r.get("errors", {}).items()]
    for what, f in first_steps(results):
        if not (f["finite"] and f["cosine_dequantized"] > f["min_cosine_dequantized"]):
            bad.append(f"{what}: first-step logits cosine {f['cosine_dequantized']:.5f} (finite {f['finite']}) "
                       f"against the dequantized float model, needs > {f['min_cosine_dequantized']}")
    return bad


def first_steps(results: dict) -> list[tuple[str, dict]]:
    found = [(r["model"] + " W4A16", r.get("first_step")) for r in results["speed"]]
    found += [(f"{r['model']} {r['format']}", r.get("first_step")) for r in results["memory"]]
    return [(what, f) for what, f in found if f is not None]


def misses(results: dict) -> list[str]:
    out = [f"{r['model']} {mode}: x{m['ratio']:.2f} < {m['target']}x" for r in results["speed"]
           for mode, m in r.get("modes", {}).items() if "ratio" in m and not m["meets"]]
    out += [f"{r['model']} {r['format']}: weights x{r.get('cuda_ratio', r['resident_ratio']):.3f} > "
            f"{MEMORY_TARGET}x packed" for r in results["memory"] if r.get("meets") is False]
    out += [f"{what}: first-step logits cosine {f['cosine']:.4f} vs fp16 <= {MIN_COSINE_FP16}"
            for what, f in first_steps(results) if not f["cosine"] > MIN_COSINE_FP16]
    out += [f"{what}: {greedy_text(f['greedy'])}" for what, f in first_steps(results)
            if f.get("greedy") and not greedy_meets(f["greedy"])]
    return out


def greedy_meets(g: dict) -> bool:
    """The greedy line: the quantized model's tokens equal the exact (float32) twin's, where it ran; else the
    twin's."""
    return g["exact_equal"] if "exact_equal" in g else g["equal"]


def same_for(first_difference: int | None, n: int) -> str:
    return f"{n} of {n}" if first_difference is None else f"{first_difference} of {n}"


def greedy_text(g: dict) -> str:
    """Tokens the quantized model shares with the dequantized twin and with the exact twin, and how many the twin
    shares with the exact one; with the exact twin's top-2 margin where the first of them parts."""
    n = g["tokens"]
    text = f"greedy tokens equal to the dequantized twin's for {same_for(g['first_difference'], n)}"
    if "exact_equal" not in g:
        return text + (f"; exact twin {g['exact']}" if "exact" in g else "")
    text += (f", to the exact (float32) twin's for {same_for(g['exact_first_difference'], n)} (the twin's own: "
             f"{same_for(g['twin_exact_first_difference'], n)})")
    i = first_parting(g)
    if i is not None:
        text += f"; exact twin's top-2 margin at token {i}: {g['exact_margins'][i]:.2g} std"
    return text


def first_parting(g: dict) -> int | None:
    """The first token at which any two of the quantized model's, the twin's and the exact twin's sequences part."""
    parts = [i for i in (g["first_difference"], g["exact_first_difference"], g["twin_exact_first_difference"])
             if i is not None]
    return min(parts) if parts else None


def table(results: dict) -> str:
    def gb(x):
        return "-" if x is None else f"{x:.1f}"

    lines = ["| model | mode | fp16 tok/s | fp16 weights GB | W4A16 tok/s | W4A16 weights GB | ratio | target |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["speed"]:
        for mode, m in r.get("modes", {}).items():
            if "not_run" in m:
                lines.append(f"| {r['model']} | {mode} | not run: {m['not_run'][:150]} |  |  |  |  |  |")
            if "ratio" not in m:
                continue
            f, q = m["fp16"], m["w4a16"]
            lines.append(f"| {r['model']} | {mode} | {f['tokens_per_s']:.1f} | {gb(f['weight_gb'])} | "
                         f"{q['tokens_per_s']:.1f} | {gb(q['weight_gb'])} | {m['ratio']:.2f} | "
                         f">= {m['target']} {'ok' if m['meets'] else 'MISS'} |")
    cb = [(r["model"], r["modes"]["continuous"]) for r in results["speed"]
          if "linear_ceiling" in r.get("modes", {}).get("continuous", {}).get("fp16", {})]
    if cb:
        lines += ["", "| model | continuous: float wall s | float GPU ms: linear / attention / other | W4A16 GPU ms: "
                  "linear / attention / other | ratio if the quantized linear layers cost nothing |",
                  "|---|---|---|---|---|"]
    for name, m in cb:
        f, q = m["fp16"], m["w4a16"]
        fms, qms = (" / ".join(f"{t['gpu_ms'][k]:.0f}" for k in ("linear", "attention", "other")) for t in (f, q))
        lines.append(f"| {name} | {f['s']:.2f} | {fms} | {qms} | {f['linear_ceiling']:.2f} |")
    lines += ["", "| model | architecture | decoder layers | dtype | layers quantized | greedy tokens equal: W4A16 / "
              "twin, W4A16 / exact twin, twin / exact twin | exact twin's top-2 margin where one parts | first-step "
              "cosine fp16 / dequantized |", "|---|---|---|---|---|---|---|---|"]
    for r in results["speed"]:
        f = r.get("first_step")
        if f is None or not f.get("greedy"):
            continue
        g, n = f["greedy"], f["greedy"]["tokens"]
        if "exact_equal" in g:
            same = ", ".join(same_for(g[k], n) for k in ("first_difference", "exact_first_difference",
                                                          "twin_exact_first_difference"))
            i = first_parting(g)
            margin = "-" if i is None else f"{g['exact_margins'][i]:.2g} std (token {i})"
        else:
            exact = g.get("exact", "not measured")[:80]
            same, margin = f"{same_for(g['first_difference'], n)}, exact twin {exact}", "-"
        lines.append(f"| {r['model']} | {r['architecture']} | {r['decoder_layers']} | {r['dtype']} | "
                     f"{r['quantize']['replaced']} | {same} | {margin} | "
                     f"{f['cosine']:.4f} / {f['cosine_dequantized']:.5f} |")
    if any("meets" in r for r in results["memory"]):
        lines += ["", "| model | format | packed MB | resident / packed | cuda-held / packed | allocated after sweep "
                  "GB | cosine fp16 / dequantized |", "|---|---|---|---|---|---|---|"]
    for r in results["memory"]:
        if "meets" not in r:
            continue
        cuda = f"{r['cuda_ratio']:.3f}" if "cuda_ratio" in r else "-"
        lines.append(f"| {r['model']} | {r['format']} | {r['packed_bytes'] / 1e6:.1f} | {r['resident_ratio']:.3f} | "
                     f"{cuda} | {gb(r.get('allocated_after_sweep_gb'))} | {r['first_step']['cosine']:.4f} / "
                     f"{r['first_step']['cosine_dequantized']:.5f} |")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The run as a results page: what ran it, then table()."""
    st = results["settings"]
    modes = st["modes"]
    generate = [m for m in modes if m != "continuous"]
    head = (f"# Generation, quantized against float: {results['gpu']}\n\n"
            f"`python -m tools.checks.generate_e2e --models {','.join(st['models'])} --modes {','.join(modes)} "
            f"--new-tokens {st['new_tokens']} --repeats {st['repeats']}` (torch {results['torch']}, transformers "
            f"{results.get('transformers', '-')}): random weights at the published sizes. Quantized: "
            "`mixgemm.quantize_(model, W4A16(group_size=128))`; MoE models in bfloat16 (the float column then holds "
            "bf16). Ratio: quantized / float tokens/s, median of "
            f"{st['repeats']} rounds in which the two models take turns; targets: issue 108."
            + (f" {', '.join(generate)}: batch 1, a {st['prompt_len']}-token prompt, tokens/s of `model.generate` as "
               "a user times it (prefill included)." if generate else "")
            + (f" Continuous: `generate_batch` of {st['cb_requests']} requests of {st['cb_prompt_len']} + "
               f"{st['cb_new_tokens']} tokens, transformers' CUDA graphs on, a persistent manager per model, fresh "
               "prompts each round; the GPU split comes from one more call per model under torch.profiler."
               if "continuous" in modes else "")
            + " Greedy tokens: `generate` (default cache) of the quantized model, its dequantized twin and the exact "
            "(float32) twin.\n\n")
    return head + table(results) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="qwen2-7b,llama3-8b", help=f"comma list of {sorted(TINY_NAMES)}; the "
                    "first also gets the memory measurement")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1, help="timed generate calls per mode (median)")
    ap.add_argument("--warmup", type=int, default=8, help="compiled decode steps before timing")
    ap.add_argument("--compiled-repeats", type=int, default=1, help="compiled mode: timed decode loops (the median)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    ap.add_argument("--skip-compiled", action="store_true", help="leave out the compiled + CUDA graphs mode")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-formats", default="W4A16,W8A8",
                    help=f"comma list of {sorted(MEMORY_FORMATS)} for the memory sweep, in order")
    ap.add_argument("--memory-ms", default=",".join(map(str, MEMORY_MS)), help="token counts of the memory sweep")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny configs of the same architectures (CPU test)")
    ap.add_argument("--strict", action="store_true",
                    help="also exit 1 when a target is missed (speed, memory, cosine against fp16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0,
                    help="build the models with only their first N decoder layers (0: all), e.g. an MoE model whose "
                         "fp16 copy, quantized copy and dequantized twin would not fit the GPU together")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16"],
                    help="the models' float dtype on the GPU (the rows tagged fp16 are the unquantized model in it); "
                         "auto: float16, mixture-of-experts models bfloat16")
    ap.add_argument("--cb-requests", type=int, default=32, help="continuous mode: requests per generate_batch")
    ap.add_argument("--cb-prompt-len", type=int, default=128, help="continuous mode: prompt tokens per request")
    ap.add_argument("--cb-new-tokens", type=int, default=128, help="continuous mode: new tokens per request")
    ap.add_argument("--cb-attention", default="",
                    help="continuous mode: an attn_implementation for both models (e.g. flash_attention_2, "
                         "paged|sdpa); default: the models' own, which transformers switches to a flash one where "
                         "installed")
    ap.add_argument("--greedy-tokens", type=int, default=GREEDY_TOKENS,
                    help="greedy tokens the quantized model must share with its dequantized twin")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds after which no model or mode starts (recorded as not run; 0: no budget)")
    ap.add_argument("--smoke", action="store_true",
                    help="the whole run on the CPU at tiny sizes: --device cpu --tiny, 3 new tokens of a 5-token "
                         "prompt, 3 continuous requests of 8 + 4 tokens, 4 greedy tokens, memory M = 1, 16")
    ap.add_argument("--plain", action="store_true",
                    help="also time a quantize_(compact=False) copy of the W4A16 model (the plain codes and each "
                         "kernel's layout, against the default one resident layout per weight)")
    ap.add_argument("--separate", action="store_true",
                    help="also time a W4A16 copy whose layers reading one tensor run one by one (no joined launch)")
    ap.add_argument("--zero-point", action="store_true",
                    help="also time a W4A16 g128 zero-point copy (the format GPTQ / AWQ checkpoints load as)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.device, args.tiny, args.new_tokens, args.prompt_len, args.warmup = "cpu", True, 3, 5, 1
        args.cb_requests, args.cb_prompt_len, args.cb_new_tokens, args.greedy_tokens = 3, 8, 4, 4
        args.memory_ms = "1,16"
    modes = [m for m in args.modes.split(",") if m and not (args.skip_compiled and m == "compiled")]
    models, s = settings_from(ap, args, modes, MODES, memory_ms=tuple(int(m) for m in args.memory_ms.split(",")),
                              plain=args.plain, separate=args.separate, zero_point=args.zero_point,
                              compiled_repeats=args.compiled_repeats, layers=args.layers,
                              cb_requests=args.cb_requests, cb_prompt_len=args.cb_prompt_len,
                              cb_new_tokens=args.cb_new_tokens, greedy_tokens=args.greedy_tokens,
                              cb_attention=args.cb_attention,
                              deadline=time.perf_counter() + args.time_budget if args.time_budget else 0.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    results: dict = {"settings": {**asdict(s), "dtype": str(s.dtype), "modes": modes, "models": models},
                     "gpu": torch.cuda.get_device_name() if s.cuda else "cpu", "torch": torch.__version__,
                     "speed": [], "memory": [], "errors": {}}
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except ImportError:
        pass

    def save():
        results["elapsed_s"] = time.perf_counter() - t_start
        (out / "generate_e2e.json").write_text(json.dumps(results, indent=1, default=str))

    def phase(key, fn, *a):
        try:
            fn(*a)
        except Exception:  # a failed phase is recorded and the next one still runs (one GPU call, many results)
            results["errors"][key] = traceback.format_exc()
            log(f"{key}: ERROR\n{results['errors'][key]}")
            free_memory(s)
        save()

    def log_and_save(msg):
        log(msg)
        save()

    if modes:
        for name in models:
            if s.out_of_time():
                results["not_run"] = [*results.get("not_run", []), f"{name}: time budget (--time-budget) spent"]
                log(f"{name}: not run (time budget)")
                continue
            results["speed"].append(res := {"model": name})
            phase(f"speed {name}", speed, res, modes, s, log_and_save)
    formats = [f for f in args.memory_formats.split(",") if f]
    if [f for f in formats if f.removesuffix(COMPACT).removesuffix(PLAIN) not in MEMORY_FORMATS]:
        ap.error(f"unknown memory format in {formats}; known: {sorted(MEMORY_FORMATS)} (each may end in {COMPACT} "
                 f"or {PLAIN})")
    if not args.skip_memory and models:
        for f in formats:
            config = MEMORY_FORMATS[f.removesuffix(COMPACT).removesuffix(PLAIN)]()
            compact, plain = f.endswith(COMPACT), f.endswith(PLAIN)
            label = config.name + (" compact_" if compact else " compact=False" if plain else "")
            results["memory"].append(res := {"model": models[0], "format": label, "compact": compact,
                                             "plain": plain})
            phase(f"memory {models[0]} {label}", memory, res, config, s, log_and_save)
    bad, missed = failures(results), misses(results)
    results["failures"], results["missed_targets"] = bad, missed
    save()
    (out / "generate_e2e.md").write_text(markdown(results))
    print(table(results))
    for line in results.get("not_run", []):
        print(f"not run: {line}")
    for line in missed:
        print(f"target missed: {line}")
    for line in bad:
        print(f"FAILED: {line}")
    print(f"total {time.perf_counter() - t_start:.0f} s; {out / 'generate_e2e.json'}")
    return 1 if bad or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
