"""End-to-end decode benchmark: a Hugging Face Llama (random weights, real shapes) quantized with
mixgemm.quantize_ against the same model in fp16, both compiled with CUDA graphs.

Method (identical for both models, one process, one GPU):
* Random fp16 Llama (``mixgemm.integrations.hf``; "llama3-8b" = Llama-3-8B shapes), static KV cache of
  ``prompt_len + warmup + steps`` tokens, a random prompt of ``prompt_len`` tokens per sequence.
* Prefill eagerly (not timed), one eager decode step (compiles the kernels and builds their weight layouts
  outside the graph pool), then the decode step under torch.compile(fullgraph=True, dynamic=False,
  mode="reduce-overhead") -- inductor + CUDA graphs: ``warmup`` compiled steps, then ``steps`` timed greedy
  steps (each step = graph replay + argmax of the last logits, as in generation).
* tokens/s = batch * steps / wall time of the timed loop; fp16 and quantized are measured back to back at
  each batch size.

``run_e2e`` returns one dict per batch size; ``format_table`` prints them.
"""

from __future__ import annotations

import time

import torch


def decode_tokens_per_s(model, batch: int, prompt_len: int, warmup: int, steps: int, vocab: int, seed: int,
                         mode: str | None, backend: str, kernel_steps: int = 0, repeats: int = 1) -> dict:
    """Decode tokens/s of ``model`` (module docstring's method; ``repeats`` timed loops of ``steps``, the median, each
    loop's in "runs_tokens_per_s"); with ``kernel_steps`` (CUDA), also the GPU kernels of
    that many more steps under torch.profiler (mixgemm.bench.kernel_profile): "kernels" (per step, largest first) and
    "gpu_us_per_step"."""
    from mixgemm.integrations.hf import check_compilable_cache, decode_step, static_cache

    torch._dynamo.reset()  # a fresh compile per (model, batch): stays clear of the recompile limit
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(dev)
    profiled = kernel_steps + 1 if kernel_steps and dev.type == "cuda" else 0  # (+ its compile step)
    # (the cache holds every token a step writes: it counts them, so a step past its end fails on the GPU)
    cache = static_cache(model, batch, prompt_len + 1 + warmup + steps * repeats + profiled)
    check_compilable_cache(model, cache)  # (a sliding window shorter than the run: refused before any work)
    eager = decode_step(model)
    t0 = time.perf_counter()
    with torch.no_grad():
        pos = torch.arange(prompt_len, device=dev)
        logits = model(ids, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1]
        tok = logits.argmax(-1, keepdim=True)
        p = prompt_len
        tok = eager(tok, torch.tensor([p], device=dev), cache)[:, -1].argmax(-1, keepdim=True)
        p += 1
        step = torch.compile(eager, fullgraph=True, dynamic=False, mode=mode, backend=backend)
        positions = torch.arange(p, p + warmup + steps * repeats + profiled, device=dev)
        for i in range(warmup):
            tok = step(tok, positions[i:i + 1], cache)[:, -1].argmax(-1, keepdim=True)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda d: None)
        sync(dev)
        setup_s = time.perf_counter() - t0
        runs_ms = []
        for r in range(repeats):
            t1 = time.perf_counter()
            for i in range(warmup + r * steps, warmup + (r + 1) * steps):
                tok = step(tok, positions[i:i + 1], cache)[:, -1].argmax(-1, keepdim=True)
            sync(dev)  # the argmax feeds the next step, so steps serialize anyway; wall time over the loop
            runs_ms.append((time.perf_counter() - t1) * 1e3)
        ms = sorted(runs_ms)[len(runs_ms) // 2]
        out = {"tokens_per_s": batch * steps / (ms / 1e3), "ms_per_step": ms / steps, "setup_s": setup_s,
               "runs_tokens_per_s": [batch * steps / (t / 1e3) for t in runs_ms]}
        if profiled:
            from mixgemm.bench.kernel_profile import as_dicts, kernel_times

            # the same step compiled without CUDA graphs (the same inductor kernels, each launch seen by the
            # profiler), on the positions after the timed ones
            plain = torch.compile(eager, fullgraph=True, dynamic=False, backend=backend)
            state = {"tok": tok, "i": warmup + steps * repeats}

            def one_step():
                i = state["i"]
                state["tok"] = plain(state["tok"], positions[i:i + 1], cache)[:, -1].argmax(-1, keepdim=True)
                state["i"] = i + 1

            rows, gpu_us = kernel_times(one_step, kernel_steps, skip=1)
            out.update(kernels=as_dicts(rows), gpu_us_per_step=gpu_us)
    return out


def run_e2e(model_name: str = "llama3-8b", batches=(1, 4, 16), config=None, prompt_len: int = 128,
            steps: int = 64, warmup: int = 8, num_layers: int | None = None, seed: int = 0,
            mode: str | None = "reduce-overhead", backend: str = "inductor", time_budget_s: float | None = None,
            device: str = "cuda", log=print, dtype: torch.dtype = torch.float16) -> list[dict]:
    """Decode tokens/s of ``model_name`` (a mixgemm.integrations.hf.MODELS name: "llama3-8b", "qwen2-7b",
    "qwen2.5-1.5b", "tiny-llama"...) at each batch size, fp16 vs quantized.

    config: a mixgemm precision config (default W4A16(group_size=128)); num_layers: override the layer count
    (None: the model's own, 32 for llama3-8b); mode / backend: torch.compile's ("reduce-overhead" = CUDA
    graphs); time_budget_s: start no new batch size after this many seconds (its row is marked skipped).
    device: "cuda" (the benchmark) or "cpu" (a smoke test of the code path only; use mode=None there). dtype: both
    models' float dtype on CUDA (torch.bfloat16: as transformers loads most checkpoints; the row's "dtype" says it, its
    "fp16_*" keys are the unquantized model's in that dtype); the CPU runs float32.
    Both models stay resident (fp16 + quantized copy: ~21 GB for llama3-8b) so each batch size measures
    them back to back. Needs a CUDA GPU and transformers. Returns one dict per batch: {"model", "format",
    "batch", "fp16_tok_s", "quant_tok_s", "speedup", "fp16_ms_step", "quant_ms_step", "fp16_weight_gb",
    "quant_weight_gb", "quant_layout_ratio", "gpu", "torch"} ("skipped": True when the budget ran out); the weight
    memory is measured after the batch's decode: the fp16 model's parameters and buffers against the quantized
    model's (its quantized weights counted with every kernel layout the decode built, mixgemm.resident_bytes, whose
    total over the plain packed bytes is quant_layout_ratio); ``log`` gets progress lines.
    """
    import copy

    import mixgemm
    from mixgemm.integrations.hf import model_config, random_model

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run_e2e needs a CUDA GPU (it times CUDA-graph decode); device='cpu' only smoke-tests")
    t_start = time.perf_counter()
    config = config or mixgemm.W4A16(group_size=128)
    overrides = {} if num_layers is None else {"num_hidden_layers": num_layers}
    cfg = model_config(model_name, **overrides)
    fp16 = random_model(cfg, dtype=dtype if device == "cuda" else torch.float32, device=device, seed=seed)
    quant = copy.deepcopy(fp16)
    report = mixgemm.quantize_(quant, config)
    if device == "cuda":
        torch.cuda.empty_cache()
    log(f"{model_name}: {cfg.num_hidden_layers} layers; quantize_ {config}: {len(report.replaced)} layers replaced, "
        f"{len(report.skipped)} skipped ({time.perf_counter() - t_start:.0f} s)")
    rows = []
    for b in batches:
        row = {"model": model_name if num_layers is None else f"{model_name} ({num_layers} layers)",
               "format": config.name, "batch": b, "torch": torch.__version__,
               "dtype": str(next(fp16.parameters()).dtype).removeprefix("torch."),
               "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
        rows.append(row)
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            row["skipped"] = True
            log(f"batch {b}: skipped (time budget)")
            continue
        for tag, model in (("fp16", fp16), ("quant", quant)):
            r = decode_tokens_per_s(model, b, prompt_len, warmup, steps, cfg.vocab_size, seed, mode, backend)
            row.update({f"{tag}_tok_s": r["tokens_per_s"], f"{tag}_ms_step": r["ms_per_step"]})
            log(f"{tag:5s} batch {b:3d}: {r['tokens_per_s']:9.1f} tok/s  {r['ms_per_step']:.3f} ms/step "
                f"(setup + compile {r['setup_s']:.0f} s)")
        row["speedup"] = row["quant_tok_s"] / row["fp16_tok_s"]
        row.update(weight_memory(fp16, quant))
        log(f"batch {b}: quantized x{row['speedup']:.2f} vs fp16; weights {row['quant_weight_gb']:.2f} GB "
            f"(layouts {row['quant_layout_ratio']:.2f}x the packed bytes) vs {row['fp16_weight_gb']:.2f} GB")
    return rows


def weight_memory(fp16: torch.nn.Module, quant: torch.nn.Module) -> dict:
    """GB the fp16 model's weights hold and GB the quantized model's hold: its float parameters and buffers other
    than the quantized layers' plus, for those, mixgemm.resident_bytes (plain packed tensors and every cached kernel
    layout); quant_layout_ratio = that quantized total over the plain packed bytes."""
    import mixgemm
    from mixgemm.ops.custom_ops import cached_weight

    def tensor_bytes(module, skip=frozenset()):
        seen, total = set(), 0
        for t in list(module.parameters()) + list(module.buffers()):
            if t.data_ptr() in seen or id(t) in skip:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        return total

    res = mixgemm.resident_bytes(quant)
    packed = set()
    for mod in quant.modules():
        qweight = mod._buffers.get("qweight") if hasattr(mod, "_buffers") else None
        if qweight is not None and cached_weight(qweight) is not None:
            packed.update(id(t) for t in mod.buffers())
    return {"fp16_weight_gb": tensor_bytes(fp16) / 1e9,
            "quant_weight_gb": (tensor_bytes(quant, frozenset(packed)) + res["total"]) / 1e9,
            "quant_layout_ratio": res["ratio"]}


def format_table(rows: list[dict]) -> str:
    """A markdown table of run_e2e's rows."""
    nan = float("nan")
    lines = ["| model | format | batch | fp16 tok/s | quant tok/s | speedup | fp16 weights GB | quant weights GB "
             "(layouts / packed) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = r.get("dtype", "float16")  # (a bf16 run: its baseline and activations are bf16, said in the format)
        fmt = r["format"] if base == "float16" else f"{r['format']}, {base} model"
        lines.append(f"| {r['model']} | {fmt} | {r['batch']} | {r.get('fp16_tok_s', nan):.1f} | "
                     f"{r.get('quant_tok_s', nan):.1f} | {r.get('speedup', nan):.2f} | "
                     f"{r.get('fp16_weight_gb', nan):.2f} | {r.get('quant_weight_gb', nan):.2f} "
                     f"({r.get('quant_layout_ratio', nan):.2f}x) |")
    return "\n".join(lines)
