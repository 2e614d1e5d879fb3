"""Tensor parallelism on 2 GPUs (issue 43, GPU part): a Llama-3-70B-shaped model (hidden 8192, intermediate 28672,
64 / 8 heads, vocab 128256, random weights; --layers of its 80 layers, default 8) in W4A16 g128, batch 1 decode under
torch.compile with CUDA graphs (mode "reduce-overhead"), TP 2 over NCCL (mixgemm.distributed.tensor_parallel_) against
TP 1 (the same model on rank 0's GPU alone); also the GPU time of one all-reduce of a decode step's hidden state
(each row-parallel layer's sum: two a decoder layer).

    PYTHONPATH=src torchrun --nproc-per-node 2 -m tools.checks.tp_gpu --out DIR

Checks (exit status 1 when one fails):
* speedup: decode tokens/s at TP 2 >= 1.6x TP 1 (mixgemm.bench.e2e's decode loop: eager prefill, one eager step,
  then timed compiled steps; the same prompt on both ranks);
* floor: on each rank, the sharded decoder layer at M = 1 (the GEMV launches a compiled step makes: q / k / v joined,
  o, gate / up joined, down; each timed alone over fresh layers of its shape replayed in one CUDA graph,
  mixgemm.bench.protocol) runs at >= 80% of its memory floor (weight + scales + x + y bytes / the measured copy
  bandwidth); each launch's and lm_head's own % of floor are printed too;
* equal: teacher-forced on TP 1's greedy tokens, TP 2's logits at every step equal TP 1's within fp16 tolerance
  (max |diff| <= 2e-2 x max |TP 1 logit|: two fp16 models whose sums differ in order).
Prints a table and writes DIR/tp_gpu.json (rank 0) and DIR/layers_rank<r>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from functools import partial

import torch
import torch.distributed as dist

LLAMA3_70B = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
SMOKE_SHAPES = dict(vocab_size=256, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)
SPEEDUP, FLOOR_PCT, LOGIT_TOL = 1.6, 80.0, 2e-2


def build(layers: int, device, shapes: dict):
    """The W4A16 g128 model (every rank builds the same one: the same seed; tensor_parallel_ broadcasts rank 0's
    weights anyway)."""
    from transformers import LlamaConfig

    import mixgemm
    from mixgemm.integrations.hf import random_llama

    cfg = LlamaConfig(**shapes, num_hidden_layers=layers)
    model = random_llama(cfg, dtype=torch.float16 if device.type == "cuda" else torch.float32, device=device, seed=0)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    return model


def forced_logits(model, prompt: torch.Tensor, tokens: torch.Tensor, mode: str | None) -> list[torch.Tensor]:
    """Logits of the prefill and of each compiled decode step fed ``tokens`` (teacher forcing)."""
    from mixgemm.integrations.hf import compiled_step, decode_step, static_cache

    torch._dynamo.reset()
    t = prompt.shape[1]
    cache = static_cache(model, 1, t + tokens.shape[1] + 1)
    with torch.no_grad():
        out = [model(prompt, past_key_values=cache, cache_position=torch.arange(t, device=prompt.device),
                     use_cache=True).logits[:, -1].float()]
        eager = decode_step(model)
        step = eager if mode is None else compiled_step(model, mode=mode)
        for i in range(tokens.shape[1]):
            pos = torch.tensor([t + i], device=prompt.device)
            fn = eager if i == 0 else step  # one eager step first: kernels compiled, layouts built outside graphs
            out.append(fn(tokens[:, i:i + 1], pos, cache)[:, -1].float().clone())
    return out


def launches(model) -> list[tuple[str, int, int]]:
    """(name, K, N) of each weight GEMV this rank's first decoder layer and lm_head run in a compiled decode step:
    a sibling group whose layouts are joined (mixgemm.nn.siblings: q / k / v, gate / up) is one launch over the
    joined rows; another layer is its own."""
    from mixgemm.nn import QuantLinear
    from mixgemm.nn.linear import SIBLINGS_ATTR

    out, seen = [], set()
    named = [(n, m) for n, m in model.model.layers[0].named_modules() if isinstance(m, QuantLinear)]
    named += [("lm_head", model.lm_head)] if isinstance(model.lm_head, QuantLinear) else []
    for name, m in named:
        group = m.__dict__.get(SIBLINGS_ATTR)
        if group is not None and group.joined is not None:
            if id(group) not in seen:
                seen.add(id(group))
                out.append(("+".join(n.split(".")[-1] for n in group.names), m.in_features,
                            sum(layer.out_features for layer in group.members)))
            continue
        out.append((name.split(".")[-1], m.in_features, m.out_features))
    return out


def layer_times(model, bandwidth: float) -> list[dict]:
    """M = 1 time of each launch (``launches``) against its memory floor, plus the decoder layer as a whole (sums
    of times and floors). Each is timed over fresh W4A16 g128 layers of its shape, compacted as the model's are
    (one launch over joined rows reads the same bytes as one layer of that many rows), enough copies that no call
    finds the previous one's weights in L2, replayed in one CUDA graph (mixgemm.bench.protocol)."""
    from mixgemm.bench.floors import case_bytes, floor_of, pct_of_floor, quant_weight_bytes
    from mixgemm.bench.protocol import copies_for, graph_time_us, l2_bytes
    from tools.bench.sibling_join import layer as w4_g128_layer

    dev = next(model.parameters()).device
    rows = []
    for name, k, n in launches(model):
        wbytes = quant_weight_bytes(k, n, 4, 128, param_bytes_per_group=2)
        nbytes = case_bytes(1, k, n, wbytes)
        layers = [w4_g128_layer(k, n, "sym") for _ in range(copies_for(wbytes, l2_bytes()))]
        x = torch.randn(1, k, dtype=torch.float16, device=dev)
        with torch.no_grad():
            us = graph_time_us([partial(layer.forward, x) for layer in layers])
        floor = floor_of(nbytes, 0, bandwidth, None).us
        rows.append({"layer": name, "N": n, "K": k, "us": us, "floor_us": floor, "pct_floor": pct_of_floor(floor, us),
                     "compact": layers[0].compact})
        del layers
    dec = [r for r in rows if r["layer"] != "lm_head"]
    us, floor = sum(r["us"] for r in dec), sum(r["floor_us"] for r in dec)
    rows.append({"layer": "decoder", "N": 0, "K": 0, "us": us, "floor_us": floor, "pct_floor": pct_of_floor(floor, us)})
    torch.cuda.empty_cache()
    return rows


def finish(ok: bool, gpu: bool) -> int:
    """The exit status; on GPUs the process leaves at once: after CUDA-graph runs with NCCL, destroy_process_group
    did not return (two H200s, torchrun waited minutes), and the results are written by then."""
    if not gpu:
        dist.destroy_process_group()
        return 0 if ok else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def graph_us(fns: list, group, replays: int = 20) -> float:
    """GPU time of one of ``fns`` run back to back in one CUDA graph: median of ``replays`` (every rank replays
    alike: a collective's count must match)."""
    from mixgemm.bench.protocol import capture_graph

    graph = capture_graph(fns)
    times = []
    for _ in range(replays):
        dist.barrier(group=group)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    del graph
    return sorted(times)[len(times) // 2]


def finish_as_rank_0(ok: bool, gpu: bool) -> int:
    """finish, every rank with rank 0's verdict (the one that ran the checks)."""
    flag = [ok]
    dist.broadcast_object_list(flag, src=0)
    return finish(flag[0], gpu)


def sum_times(mesh, hidden: int, tokens: tuple[int, ...] = (1, 4, 16), calls: int = 50, sum_of=None) -> list:
    """GPU time of one sum over the ranks of a [tokens, hidden] fp16 tensor, as the row-parallel layers' outputs are
    summed: ``calls`` back to back in a CUDA graph (graph_us), after one call outside it. ``sum_of``: the sum (a call
    of one tensor); default torch.distributed's all-reduce (NCCL) in place."""
    group = mesh.get_group()
    sum_of = sum_of or partial(dist.all_reduce, group=group)
    rows = []
    for m in tokens:
        bufs = [torch.randn(m, hidden, dtype=torch.float16, device="cuda") for _ in range(calls)]
        sum_of(bufs[0])  # (kernels compiled and launches prepared before the capture)
        rows.append({"tokens": m, "hidden": hidden, "us": graph_us([partial(sum_of, b) for b in bufs], group)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the 70B shape (80 = the whole model)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--kernel-steps", type=int, default=0,
                    help="also profile the GPU kernels of this many decode steps (per step, largest first: json)")
    ap.add_argument("--mode", default="reduce-overhead", help="torch.compile mode (reduce-overhead: CUDA graphs)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the same steps on the CPU (gloo, a small Llama, eager, no layer timings): checks the "
                         "script itself, not the acceptance; only the logits check decides the exit status")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    smoke = args.cpu_smoke
    if smoke:
        dev, shapes, mode, backend = torch.device("cpu"), SMOKE_SHAPES, None, "eager"
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    else:
        torch.cuda.set_device(local)
        dev, shapes, mode, backend = torch.device("cuda", local), LLAMA3_70B, args.mode, "inductor"
        dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(minutes=30))
    from torch.distributed.device_mesh import init_device_mesh

    from mixgemm.bench.e2e import decode_tokens_per_s
    from mixgemm.bench.protocol import ceilings
    from mixgemm.distributed import tensor_parallel_
    from mixgemm.integrations.hf import greedy_decode

    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    model = build(args.layers, dev, shapes)
    if not smoke:
        torch.cuda.empty_cache()
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(dev)
    res: dict = {"gpu": "cpu (smoke)" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
                 "layers": args.layers, "world": world, "mode": mode}
    if rank == 0:  # TP 1: rank 0 alone, the other ranks wait
        torch._dynamo.reset()
        tokens, _ = greedy_decode(model, prompt, 16)  # eager: the tokens both runs are then fed
        ref = forced_logits(model, prompt, tokens, mode)
        res["tp1"] = decode_tokens_per_s(model, 1, args.prompt, args.warmup, args.steps, vocab, 0, mode, backend,
                                                 kernel_steps=args.kernel_steps)
        obj = [tokens.cpu()]
    else:
        obj = [None]
    dist.broadcast_object_list(obj, src=0)
    tokens = obj[0].to(dev)
    mesh = init_device_mesh(dev.type, (world,))
    report = tensor_parallel_(model, mesh)
    got = forced_logits(model, prompt, tokens, mode)
    res[f"tp{world}"] = decode_tokens_per_s(model, 1, args.prompt, args.warmup, args.steps, vocab, 0, mode, backend,
                                            kernel_steps=args.kernel_steps)
    bw = None if smoke else ceilings(quick=True)["copy_bw"]
    rows = [] if smoke else layer_times(model, bw)
    res["sum_times"] = [] if smoke else sum_times(mesh, shapes["hidden_size"])
    with open(os.path.join(args.out, f"layers_rank{rank}.json"), "w") as f:
        json.dump({"copy_bw": bw, "rows": rows}, f, indent=1)
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    ok = True
    if rank == 0:
        res["sharded"] = len(report.sharded)
        diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref, strict=True)]
        res["max_logit_rel"] = max(diffs)
        res["speedup"] = res[f"tp{world}"]["tokens_per_s"] / res["tp1"]["tokens_per_s"]
        res["layers_by_rank"] = gathered
        checks = {
            f"decode TP {world} / TP 1 >= {SPEEDUP}x": res["speedup"] >= SPEEDUP,
            f"every rank's M = 1 decoder layer (its GEMV launches) >= {FLOOR_PCT:.0f}% of floor": all(
                (r["pct_floor"] or 0) >= FLOOR_PCT for rr in gathered for r in rr if r["layer"] == "decoder"),
            f"logits == TP 1 (max rel diff <= {LOGIT_TOL})": res["max_logit_rel"] <= LOGIT_TOL,
        }
        if smoke:  # timings of a CPU run say nothing about the GPU acceptance
            checks = {k: v for k, v in checks.items() if k.startswith("logits")}
        res["checks"] = checks
        res["wall_s"] = time.time() - t0
        with open(os.path.join(args.out, "tp_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
        shape = "small Llama (smoke)" if smoke else "Llama-3-70B shapes"
        print(f"\n{res['gpu']}, torch {res['torch']}, {shape} x {args.layers} layers, W4A16 g128, batch 1, {mode}")
        print(f"{'':28s}{'tok/s':>10s}{'ms/step':>10s}")
        for k in ("tp1", f"tp{world}"):
            gpu = res[k].get("gpu_us_per_step")
            print(f"{k.upper():28s}{res[k]['tokens_per_s']:10.1f}{res[k]['ms_per_step']:10.3f}"
                  + (f"  (GPU {gpu / 1e3:.3f} ms/step)" if gpu else ""))
            for row in res[k].get("kernels", [])[:12]:
                print(f"    {row}")
        print(f"speedup {res['speedup']:.2f}x; logits max rel diff {res['max_logit_rel']:.2e}")
        for row in res["sum_times"]:
            print(f"all-reduce of [{row['tokens']}, {row['hidden']}] fp16 in a CUDA graph: {row['us']:.2f} us")
        print(f"{'rank':>4s} {'layer':24s}{'N':>7s}{'K':>7s}{'us':>9s}{'floor us':>10s}{'% floor':>9s}")
        for r, rr in enumerate(gathered):
            for row in rr:
                print(f"{r:4d} {row['layer']:24s}{row['N']:7d}{row['K']:7d}{row['us']:9.1f}{row['floor_us']:10.1f}"
                      f"{row['pct_floor'] or 0:9.1f}")
        for name, passed in checks.items():
            print(f"{'PASS' if passed else 'FAIL'}  {name}")
        ok = all(checks.values())
    return finish_as_rank_0(ok, gpu=not smoke)


if __name__ == "__main__":
    sys.exit(main())
