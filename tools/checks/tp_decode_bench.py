"""Tensor-parallel decode and prefill on 2 or 4 GPUs against one (issue 113): Llama-3-70B or Yi-34B shapes (random
weights, --layers of the model's layers, default 8), W4A16 g128 decode and W8A8 prefill, TP N over NCCL
(mixgemm.distributed.tensor_parallel_, the model's own plan) against TP 1, which rank 0 runs alone first in the same
invocation on the same model (the other ranks wait), before the model is sharded.

    PYTHONPATH=src torchrun --nproc-per-node 2 -m tools.checks.tp_decode_bench --model llama3-70b --out DIR
    PYTHONPATH=src torchrun --nproc-per-node 4 -m tools.checks.tp_decode_bench --model yi-34b --out DIR
    PYTHONPATH=src torchrun --nproc-per-node 2 -m tools.checks.tp_decode_bench --smoke --out DIR   (CPU, gloo)

Measured at TP 1 and TP N (decode: one token a step, static cache, mixgemm.bench.e2e's loop):
* compiled: torch.compile mode "reduce-overhead" (CUDA graphs), batch 1 and 16, tokens/s; one step's GPU kernels
  under torch.profiler (batch 1): the GEMV kernels' time and the all-reduces' (NCCL) time per step and per layer;
* eager: batch 1, ms per step (the model called step by step, no compile);
* alone, TP N: one all-reduce of a decode step's hidden state in a CUDA graph (1 and 16 tokens), and each rank's
  GEMV launches of one decoder layer at M = 1 against their memory floor (tools.checks.tp_gpu);
* W8A8 (per-channel int8 weights, per-token int8 activations) prefill of 2048 tokens, eager, ms;
* ``--allreduce-only``: NCCL's all-reduce of [1 | 16, hidden] fp16 in a CUDA graph beside torch's
  symmetric-memory one-shot / two-shot all-reduces (no multicast), no model;
* correctness: 32 greedy tokens (prefill, one eager step, then compiled steps): TP N's tokens equal TP 1's, and
  TP N's logits at every step (while the tokens agree) within fp16 tolerance of TP 1's (max |diff| <= 2e-2 x max
  |TP 1 logit|).
Checks (exit status 1 when one fails; the speedups are the issue's acceptance): compiled batch 1 TP 2 >= 1.6x /
TP 4 >= 2.6x; batch 16 TP 2 >= 1.6x; eager TP N >= 0.95x; W8A8 prefill TP 2 >= 1.8x; tokens and logits as above.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1). Writes
DIR/tp_decode_<model>_tp<N>.json and .md (rank 0). One invocation per model keeps each under 8 minutes.
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # (before any NCCL communicator exists)
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tools.checks.tp_gpu import LLAMA3_70B, LOGIT_TOL, finish, finish_as_rank_0, graph_us, layer_times, sum_times  # noqa: E402

MODELS = {
    "llama3-70b": LLAMA3_70B,
    "yi-34b": dict(vocab_size=64000, hidden_size=7168, intermediate_size=20480, num_attention_heads=56,
                   num_key_value_heads=8, max_position_embeddings=4096, rope_theta=5000000.0, rms_norm_eps=1e-5,
                   tie_word_embeddings=False),
}
# vocabulary 1000: a lm_head shard of 500 / 250 rows, not a multiple of the kernels' row tile
SMOKE = dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4,
             max_position_embeddings=512, tie_word_embeddings=False)
# the acceptance: {check: {world: minimum TP N / TP 1}}
ACCEPT = {"compiled batch 1": {2: 1.6, 4: 2.6}, "compiled batch 16": {2: 1.6}, "eager batch 1": {2: 0.95, 4: 0.95},
          "W8A8 prefill 2048": {2: 1.8}}


def build(shapes: dict, layers: int, dev: torch.device, precision):
    from transformers import LlamaConfig

    import mixgemm
    from mixgemm.integrations.hf import random_llama

    cfg = LlamaConfig(**shapes, num_hidden_layers=layers)
    model = random_llama(cfg, dtype=torch.float16 if dev.type == "cuda" else torch.float32, device=dev, seed=0)
    mixgemm.quantize_(model, precision)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return model


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def greedy(model, prompt: torch.Tensor, tokens: int, mode: str | None, backend: str) -> tuple[list, list]:
    """``tokens`` greedy tokens and the float logits of each: an eager prefill, one eager step (kernels compiled and
    layouts built outside the graphs' pool), then compiled steps."""
    from mixgemm.integrations.hf import decode_step, static_cache

    torch._dynamo.reset()
    dev, t = prompt.device, prompt.shape[1]
    cache = static_cache(model, 1, t + tokens + 1)
    eager = decode_step(model)
    step = torch.compile(eager, fullgraph=True, dynamic=False, mode=mode, backend=backend)
    with torch.no_grad():
        logits = model(prompt, past_key_values=cache, cache_position=torch.arange(t, device=dev),
                       use_cache=True).logits[:, -1].float()
        out_tokens, out_logits = [], []
        for i in range(tokens):
            tok = logits.argmax(-1, keepdim=True)
            out_tokens.append(int(tok))
            out_logits.append(logits.cpu())
            fn = eager if i == 0 else step
            logits = fn(tok, torch.tensor([t + i], device=dev), cache)[:, -1].float().clone()
    return out_tokens, out_logits


def _eager_decode(model, vocab: int, prompt_len: int, warmup: int, steps: int, seed: int):
    """Eager decode at batch 1 made ready: the prefill and ``warmup`` steps done (synchronized); the returned call runs
    the next ``steps`` steps, each fed the token before it (so they serialize), and synchronizes."""
    from mixgemm.integrations.hf import decode_step, static_cache

    dev = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed)).to(dev)
    cache = static_cache(model, 1, prompt_len + warmup + steps + 1)
    step = decode_step(model)
    pos = torch.arange(prompt_len, prompt_len + warmup + steps, device=dev)
    with torch.no_grad():
        tok = model(ids, past_key_values=cache, cache_position=torch.arange(prompt_len, device=dev),
                    use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        for i in range(warmup):
            tok = step(tok, pos[i:i + 1], cache)[:, -1].argmax(-1, keepdim=True)
    sync(dev)

    def run() -> None:
        t = tok
        with torch.no_grad():
            for i in range(warmup, warmup + steps):
                t = step(t, pos[i:i + 1], cache)[:, -1].argmax(-1, keepdim=True)
        sync(dev)

    return run


def eager_ms_per_step(model, vocab: int, prompt_len: int, steps: int, warmup: int = 3) -> float:
    """Eager decode, batch 1: ms per step (the next token fed back, so steps serialize; wall time over the loop)."""
    run = _eager_decode(model, vocab, prompt_len, warmup, steps, seed=2)
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3 / steps


def prefill_ms(model, vocab: int, tokens: int, repeats: int = 5) -> float:
    """One forward of ``tokens`` tokens (batch 1, no cache), eager: median ms of ``repeats`` after two warm-ups."""
    dev = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(3)).to(dev)
    times = []
    with torch.no_grad():
        for i in range(repeats + 2):
            sync(dev)
            t0 = time.perf_counter()
            model(ids, use_cache=False, logits_to_keep=1)
            sync(dev)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def symm_mem_times(mesh, hidden: int, tokens: tuple[int, ...] = (1, 16), calls: int = 50) -> list[dict]:
    """torch's symmetric-memory all-reduces (no multicast) of a [tokens, hidden] fp16 tensor in a CUDA graph, beside
    NCCL's (sum_times): one-shot (reads every peer's buffer), one-shot with the copy into the buffer that a layer's
    output would need, and two-shot (in place). An op torch lacks, or one that fails, is reported with its error."""
    from functools import partial

    import torch.distributed._symmetric_memory as symm_mem

    group = mesh.get_group()
    name = group.group_name
    ops = torch.ops.symm_mem
    rows = []
    for m in tokens:
        row: dict = {"tokens": m, "hidden": hidden}
        try:
            buf = symm_mem.empty((m, hidden), dtype=torch.float16, device="cuda")
            symm_mem.rendezvous(buf, name)
            buf.normal_()
            x = torch.randn(m, hidden, dtype=torch.float16, device="cuda")
        except Exception as e:  # noqa: BLE001 -- reported: the machine's torch decides what exists
            rows.append({**row, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        variants = {"one_shot": lambda b=buf: ops.one_shot_all_reduce(b, "sum", name),
                    "one_shot_copy": lambda b=buf, x=x: ops.one_shot_all_reduce_copy(b, x, "sum", name),
                    "two_shot_inplace": lambda b=buf: ops.two_shot_all_reduce_(b, "sum", name)}
        for key, fn in variants.items():
            try:
                row[f"{key}_us"] = graph_us([partial(fn) for _ in range(calls)], group)
            except Exception as e:  # noqa: BLE001
                row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            dist.barrier(group=group)
        rows.append(row)
    return rows


def one_shot_times(mesh, hidden: int, tokens: tuple[int, ...] = (1, 4, 16)) -> list:
    """sum_times of the one-shot sum (mixgemm.distributed.collectives.one_shot_sums) instead of NCCL's all-reduce."""
    from mixgemm.distributed.collectives import one_shot_sums

    one = one_shot_sums(mesh.get_group(), torch.device("cuda", torch.cuda.current_device()))
    return [] if one is None else sum_times(mesh, hidden, tokens, sum_of=one)


def step_kernels(kernels: list[dict], layers: int) -> dict:
    """From one compiled step's kernels: GEMV and all-reduce (NCCL) GPU time per step and per decoder layer."""
    def total(pred) -> tuple[float, float]:
        rows = [k for k in kernels if pred(k["name"].lower())]
        return sum(k["us_per_step"] for k in rows), sum(k["calls_per_step"] for k in rows)

    gemv_us, gemv_calls = total(lambda n: "gemv" in n)
    comm_us, comm_calls = total(lambda n: "nccl" in n or "allreduce" in n or "all_reduce" in n or "rank_sum" in n)
    return {"gemv_us_per_step": gemv_us, "gemv_calls_per_step": gemv_calls, "allreduce_us_per_step": comm_us,
            "allreduce_calls_per_step": comm_calls, "gemv_us_per_layer": gemv_us / layers,
            "allreduce_us_per_layer": comm_us / layers, "top": kernels[:12]}


def measure(model, args, dev, vocab: int, mode, backend: str, smoke: bool, light: bool = False) -> tuple[dict, list]:
    """The decode measures of ``model`` as it is now (TP 1, or TP N with the sums as they are set); ``light``: compiled
    batch 1 (with its kernel profile) and eager only, no greedy tokens."""
    from mixgemm.bench.e2e import decode_tokens_per_s

    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(dev)
    out: dict = {}
    logits = None
    if not light:
        out["tokens"], logits = greedy(model, prompt, args.tokens, mode, backend)
    steps = 4 if smoke else args.steps
    for batch in [1] if light else args.batches:
        r = decode_tokens_per_s(model, batch, args.prompt, 2 if smoke else args.warmup, steps, vocab, 0, mode,
                                backend, kernel_steps=0 if smoke or batch != 1 else 3)
        if "kernels" in r:
            r["split"] = step_kernels(r.pop("kernels"), args.layers)
        out[f"compiled batch {batch}"] = r
    out["eager batch 1"] = {"ms_per_step": eager_ms_per_step(model, vocab, args.prompt, 4 if smoke else 20)}
    out["eager batch 1"]["tokens_per_s"] = 1e3 / out["eager batch 1"]["ms_per_step"]
    out["eager profile"] = eager_profile(model, vocab, args.prompt)
    brief = {k: round(v["tokens_per_s"], 1) for k, v in out.items() if isinstance(v, dict) and "tokens_per_s" in v}
    print(f"[rank {dist.get_rank()}] {time.strftime('%H:%M:%S')} {'light ' if light else ''}measure: {brief}",
          flush=True)
    return out, logits


def eager_profile(model, vocab: int, prompt_len: int, steps: int = 3) -> dict:
    """Where an eager step's host time goes: torch.profiler over ``steps`` eager decode steps (after 3 warm-ups), the
    ops and CUDA runtime calls by their own CPU time per step (largest first), and the wall time per step under the
    profiler."""
    from torch.profiler import ProfilerActivity, profile

    run = _eager_decode(model, vocab, prompt_len, 3, steps, seed=4)
    on_gpu = next(model.parameters()).device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return {"ms_per_step_profiled": wall,
            "top_self_cpu": [{"name": e.key, "calls_per_step": e.count / steps,
                              "self_cpu_us_per_step": e.self_cpu_time_total / steps,
                              "cpu_us_per_step": e.cpu_time_total / steps} for e in rows[:25]]}


def compare(ref_tokens: list, ref_logits: list, tokens: list, logits: list) -> dict:
    agree = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens, strict=True)) if a != b), len(tokens))
    rel = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(logits[:agree + 1], ref_logits[:agree + 1],
                                                                       strict=False)]
    return {"tokens_equal": agree == len(tokens), "first_different_token": None if agree == len(tokens) else agree,
            "max_logit_rel": max(rel), "logit_rel_by_step": rel}


def markdown(res: dict) -> str:
    w = res["world"]
    lines = [f"# TP {w} against TP 1: {res['model']} shapes, {res['layers']} layers ({res['gpu']}, torch "
             f"{res['torch']})", "", "| measure | TP 1 | TP " + str(w) + " | TP N / TP 1 |", "|---|---|---|---|"]
    for key in [k for k in res["tpn"] if k.startswith(("compiled", "eager")) and "profile" not in k]:
        a, b = res["tp1"][key]["tokens_per_s"], res["tpn"][key]["tokens_per_s"]
        lines.append(f"| {key} tokens/s | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    for key in [k for k in res.get("tpn_nccl", {}) if k.startswith(("compiled", "eager")) and "profile" not in k]:
        a, b = res["tp1"][key]["tokens_per_s"], res["tpn_nccl"][key]["tokens_per_s"]
        lines.append(f"| {key} tokens/s, sums through NCCL | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    if res.get("one_shot_refused"):
        lines.append(f"\none-shot sums not used: {res['one_shot_refused']}")
    if "prefill" in res:
        a, b = res["prefill"]["tp1_ms"], res["prefill"]["tpn_ms"]
        lines.append(f"| W8A8 prefill 2048 ms | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    for tag in ("tp1", "tpn", "tpn_nccl"):
        split = res.get(tag, {}).get("compiled batch 1", {}).get("split")
        if split:
            lines.append(f"\n{tag.upper()} one compiled batch-1 step (torch.profiler): GEMV "
                         f"{split['gemv_us_per_step']:.1f} us/step ({split['gemv_us_per_layer']:.1f} us/layer), "
                         f"all-reduce {split['allreduce_us_per_step']:.1f} us/step "
                         f"({split['allreduce_us_per_layer']:.1f} us/layer, {split['allreduce_calls_per_step']:.0f} "
                         "calls)")
    for row in res.get("sum_times", []):
        lines.append(f"\nall-reduce of [{row['tokens']}, {row['hidden']}] fp16 alone in a CUDA graph: "
                     f"{row['us']:.2f} us")
    for row in res.get("one_shot_times", []):
        lines.append(f"\none-shot sum (mixgemm rank_sum) of [{row['tokens']}, {row['hidden']}] fp16 alone in a CUDA "
                     f"graph: {row['us']:.2f} us")
    for tag in ("tp1", "tpn", "tpn_nccl"):
        prof = res.get(tag, {}).get("eager profile")
        if prof:
            top = ", ".join(f"{r['name']} {r['self_cpu_us_per_step']:.0f} us ({r['calls_per_step']:.0f}x)"
                            for r in prof["top_self_cpu"][:8])
            lines.append(f"\n{tag.upper()} eager step under torch.profiler: {prof['ms_per_step_profiled']:.2f} ms; "
                         f"own CPU time per step: {top}")
    for row in res.get("symm_mem_times", []):
        lines.append(f"\nsymmetric-memory all-reduce of [{row['tokens']}, {row['hidden']}] fp16 in a CUDA graph: "
                     + ", ".join(f"{k} {v:.2f} us" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                                 if k not in ("tokens", "hidden")))
    for r, rows in enumerate(res.get("layers_by_rank", [])):
        for row in rows:
            lines.append(f"\nrank {r} {row['layer']} [{row['N']}x{row['K']}] M=1: {row['us']:.1f} us, floor "
                         f"{row['floor_us']:.1f} us ({row['pct_floor'] or 0:.0f}%)")
    lines.append("")
    lines += [f"- {'PASS' if ok else 'FAIL'} {name}" for name, ok in res["checks"].items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3-70b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens compared")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--allreduce-only", action="store_true",
                    help="GPU: only time the all-reduces of a decode step's hidden state in a CUDA graph, NCCL against "
                         "torch's symmetric-memory one-shot / two-shot (no model); writes tp_allreduce_tp<N>.json")
    ap.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",")], default=[1, 16],
                    help="compiled decode batches (comma-separated; the acceptance: 1,16)")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a small Llama (vocabulary 1000), backend eager: "
                    "checks the script; only the tokens / logits checks decide the exit status")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    smoke = args.smoke
    if smoke:
        dev, shapes, mode, backend = torch.device("cpu"), SMOKE, None, "eager"
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
        args.layers, args.tokens, args.prefill = 2, min(args.tokens, 8), 64
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev, shapes, mode, backend = torch.device("cuda", local), MODELS[args.model], "reduce-overhead", "inductor"
        dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(minutes=30))
    from torch.distributed.device_mesh import init_device_mesh

    import mixgemm
    from mixgemm.distributed import tensor_parallel_
    from mixgemm.distributed.collectives import use_one_shot_sums, why_no_one_shot

    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    vocab = shapes["vocab_size"]
    res: dict = {"gpu": "cpu (smoke)" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
                 "model": "smoke" if smoke else args.model, "layers": args.layers, "world": world, "mode": mode,
                 "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
    mesh = init_device_mesh(dev.type, (world,))
    if args.allreduce_only and not smoke:
        try:
            import torch.distributed._symmetric_memory as symm_mem

            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(mesh.get_group().group_name)
        except Exception as e:  # noqa: BLE001 -- reported in the rows' errors
            res["symm_mem_setup_error"] = f"{type(e).__name__}: {e}"[:300]
        res["sum_times"] = sum_times(mesh, shapes["hidden_size"], tokens=(1, 16))
        res["symm_mem_times"] = symm_mem_times(mesh, shapes["hidden_size"])
        if rank == 0:
            with open(os.path.join(args.out, f"tp_allreduce_tp{world}.json"), "w") as f:
                json.dump(res, f, indent=1)
            print(json.dumps({k: res[k] for k in ("sum_times", "symm_mem_times")}, indent=1))
        return finish(True, gpu=True)
    model = build(shapes, args.layers, dev, mixgemm.W4A16(group_size=128))
    ref = [None]
    if rank == 0:  # TP 1: rank 0 alone on the whole model, the other ranks wait
        res["tp1"], logits = measure(model, args, dev, vocab, mode, backend, smoke)
        ref = [(res["tp1"]["tokens"], logits)]
    dist.broadcast_object_list(ref, src=0)
    use_one_shot_sums(True)  # (before sharding: the group's workspace is made then)
    report = tensor_parallel_(model, mesh)
    res["sharded"] = len(report.sharded)
    res["one_shot_refused"] = why_no_one_shot(mesh.get_group(), dev)
    res["tpn"], logits = measure(model, args, dev, vocab, mode, backend, smoke)
    res["correct"] = compare(*ref[0], res["tpn"]["tokens"], logits)
    if not smoke and res["one_shot_refused"] is None:  # A/B: the same shards, the sums through NCCL
        use_one_shot_sums(False)
        res["tpn_nccl"], _ = measure(model, args, dev, vocab, mode, backend, smoke, light=True)
    if not smoke:
        res["sum_times"] = sum_times(mesh, shapes["hidden_size"])
        res["one_shot_times"] = one_shot_times(mesh, shapes["hidden_size"])
        from mixgemm.bench.protocol import ceilings

        rows = layer_times(model, ceilings(quick=True)["copy_bw"])
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        res["layers_by_rank"] = gathered
    del model
    if not args.no_prefill:  # W8A8 prefill: TP 1 on rank 0, then TP N
        model = build(shapes, args.layers, dev, mixgemm.W8A8())
        tp1 = [prefill_ms(model, vocab, args.prefill) if rank == 0 else None]
        dist.broadcast_object_list(tp1, src=0)
        tensor_parallel_(model, mesh)
        res["prefill"] = {"tokens": args.prefill, "tp1_ms": tp1[0], "tpn_ms": prefill_ms(model, vocab, args.prefill)}
        del model
    ok = True
    if rank == 0:
        checks = {}
        for key, needs in ACCEPT.items():
            if world not in needs:
                continue
            need = needs[world]
            if key.startswith("W8A8"):
                if "prefill" not in res:
                    continue
                ratio = res["prefill"]["tp1_ms"] / res["prefill"]["tpn_ms"]
            elif key in res["tpn"]:
                ratio = res["tpn"][key]["tokens_per_s"] / res["tp1"][key]["tokens_per_s"]
            else:
                continue
            res.setdefault("ratios", {})[key] = ratio
            checks[f"{key}: TP {world} / TP 1 = {ratio:.2f}x >= {need}x"] = ratio >= need
        if smoke:  # a CPU run's timings say nothing about the GPUs
            checks = {}
        c = res["correct"]
        checks[f"greedy tokens equal TP 1's ({args.tokens})"] = c["tokens_equal"]
        checks[f"logits at every step within {LOGIT_TOL} of TP 1's (max {c['max_logit_rel']:.2e})"] = \
            c["max_logit_rel"] <= LOGIT_TOL
        res["checks"] = checks
        res["wall_s"] = time.time() - t0
        name = f"tp_decode_{res['model']}_tp{world}"
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(res, f, indent=1)
        text = markdown(res)
        with open(os.path.join(args.out, name + ".md"), "w") as f:
            f.write(text)
        print(text)
        ok = all(checks.values())
    return finish_as_rank_0(ok, gpu=not smoke)


if __name__ == "__main__":
    sys.exit(main())
