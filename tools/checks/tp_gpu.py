"""Tensor parallelism on 2 GPUs (issue 43, GPU part): a Llama-3-70B-shaped model (hidden 8192, intermediate 28672,
64 / 8 heads, vocab 128256, random weights; --layers of its 80 layers, default 8) in W4A16 g128, batch 1 decode under
torch.compile with CUDA graphs (mode "reduce-overhead"), TP 2 over NCCL (mixgemm.distributed.tensor_parallel_) against
TP 1 (the same model on rank 0's GPU alone).

    torchrun --nproc-per-node 2 tools/checks/tp_gpu.py --out DIR

Checks (exit status 1 when one fails):
* speedup: decode tokens/s at TP 2 >= 1.6x TP 1 (mixgemm.bench.e2e's decode loop: eager prefill, one eager step,
  then timed compiled steps; the same prompt on both ranks);
* floor: on each rank, every sharded layer shape at M = 1 (kernel alone, layer copies replayed in one CUDA graph,
  mixgemm.bench.protocol) runs at >= 80% of its memory floor (weight + scales + x + y bytes / the measured copy
  bandwidth);
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
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist

LLAMA3_70B = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
SPEEDUP, FLOOR_PCT, LOGIT_TOL = 1.6, 80.0, 2e-2


def build(layers: int, device):
    """The W4A16 g128 model (every rank builds the same one: the same seed; tensor_parallel_ broadcasts rank 0's
    weights anyway)."""
    from transformers import LlamaConfig

    import mixgemm
    from mixgemm.integrations.hf import random_llama

    cfg = LlamaConfig(**LLAMA3_70B, num_hidden_layers=layers)
    model = random_llama(cfg, dtype=torch.float16, device=device, seed=0)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    torch.cuda.empty_cache()
    return model


def forced_logits(model, prompt: torch.Tensor, tokens: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """Logits of the prefill and of each compiled decode step fed ``tokens`` (teacher forcing)."""
    from mixgemm.integrations.hf import compiled_step, decode_step, static_cache

    torch._dynamo.reset()
    t = prompt.shape[1]
    cache = static_cache(model, 1, t + tokens.shape[1] + 1)
    with torch.no_grad():
        out = [model(prompt, past_key_values=cache, cache_position=torch.arange(t, device=prompt.device),
                     use_cache=True).logits[:, -1].float()]
        eager, step = decode_step(model), compiled_step(model, mode=mode)
        for i in range(tokens.shape[1]):
            pos = torch.tensor([t + i], device=prompt.device)
            fn = eager if i == 0 else step  # one eager step first: kernels compiled, layouts built outside graphs
            out.append(fn(tokens[:, i:i + 1], pos, cache)[:, -1].float().clone())
    return out


def layer_times(model, bandwidth: float) -> list[dict]:
    """M = 1 time of each distinct QuantLinear shape of this rank's model against its memory floor."""
    from mixgemm.bench.floors import case_bytes, floor_of, pct_of_floor, quant_weight_bytes
    from mixgemm.bench.protocol import copies_for, graph_time_us, l2_bytes
    from mixgemm.nn import QuantLinear

    rows, seen = [], set()
    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear) or (m.out_features, m.in_features) in seen:
            continue
        seen.add((m.out_features, m.in_features))
        qw = m.quantized_weight()  # sym: no zeros / offsets to copy
        wbytes = quant_weight_bytes(m.in_features, m.out_features, 4, 128, param_bytes_per_group=2)
        nbytes = case_bytes(1, m.in_features, m.out_features, wbytes)
        c = copies_for(wbytes, l2_bytes())
        # distinct copies, so that no call finds the previous one's weights in L2
        layers = [QuantLinear.from_quantized(replace(qw, _layouts={}, qweight=qw.qweight.clone(),
                                                     scales=qw.scales.clone())) for _ in range(c)]
        x = torch.randn(1, m.in_features, dtype=torch.float16, device=qw.device)
        with torch.no_grad():
            us = graph_time_us([partial(layer.forward, x) for layer in layers])
        floor = floor_of(nbytes, 0, bandwidth, None).us
        rows.append({"layer": name.split(".")[-1], "N": m.out_features, "K": m.in_features, "us": us,
                     "floor_us": floor, "pct_floor": pct_of_floor(floor, us)})
        del layers
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the 70B shape (80 = the whole model)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--mode", default="reduce-overhead", help="torch.compile mode (reduce-overhead: CUDA graphs)")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(minutes=30))
    from torch.distributed.device_mesh import init_device_mesh

    from mixgemm.bench.e2e import _decode_tokens_per_s
    from mixgemm.bench.protocol import ceilings
    from mixgemm.distributed import tensor_parallel_
    from mixgemm.integrations.hf import greedy_decode

    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    model = build(args.layers, dev)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(dev)
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": args.layers,
                 "world": world, "mode": args.mode}
    if rank == 0:  # TP 1: rank 0 alone, the other ranks wait
        torch._dynamo.reset()
        tokens, _ = greedy_decode(model, prompt, 16)  # eager: the tokens both runs are then fed
        ref = forced_logits(model, prompt, tokens, args.mode)
        res["tp1"] = _decode_tokens_per_s(model, 1, args.prompt, args.warmup, args.steps, vocab, 0, args.mode,
                                          "inductor")
        obj = [tokens.cpu()]
    else:
        obj = [None]
    dist.broadcast_object_list(obj, src=0)
    tokens = obj[0].to(dev)
    mesh = init_device_mesh("cuda", (world,))
    report = tensor_parallel_(model, mesh)
    torch.cuda.empty_cache()
    got = forced_logits(model, prompt, tokens, args.mode)
    res[f"tp{world}"] = _decode_tokens_per_s(model, 1, args.prompt, args.warmup, args.steps, vocab, 0, args.mode,
                                             "inductor")
    bw = ceilings(quick=True)["copy_bw"]
    rows = layer_times(model, bw)
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
            f"every rank's M = 1 layer >= {FLOOR_PCT:.0f}% of floor": all(
                r["pct_floor"] >= FLOOR_PCT for rr in gathered for r in rr),
            f"logits == TP 1 (max rel diff <= {LOGIT_TOL})": res["max_logit_rel"] <= LOGIT_TOL,
        }
        res["checks"] = checks
        res["wall_s"] = time.time() - t0
        with open(os.path.join(args.out, "tp_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(f"\n{res['gpu']}, torch {res['torch']}, Llama-3-70B shapes x {args.layers} layers, W4A16 g128, batch 1, "
              f"{args.mode}")
        print(f"{'':28s}{'tok/s':>10s}{'ms/step':>10s}")
        for k in ("tp1", f"tp{world}"):
            print(f"{k.upper():28s}{res[k]['tokens_per_s']:10.1f}{res[k]['ms_per_step']:10.3f}")
        print(f"speedup {res['speedup']:.2f}x; logits max rel diff {res['max_logit_rel']:.2e}")
        print(f"{'rank':>4s} {'layer':10s}{'N':>7s}{'K':>7s}{'us':>9s}{'floor us':>10s}{'% floor':>9s}")
        for r, rr in enumerate(gathered):
            for row in rr:
                print(f"{r:4d} {row['layer']:10s}{row['N']:7d}{row['K']:7d}{row['us']:9.1f}{row['floor_us']:10.1f}"
                      f"{row['pct_floor']:9.1f}")
        for name, passed in checks.items():
            print(f"{'PASS' if passed else 'FAIL'}  {name}")
        ok = all(checks.values())
    flag = [ok]
    dist.broadcast_object_list(flag, src=0)
    dist.destroy_process_group()
    return 0 if flag[0] else 1


if __name__ == "__main__":
    sys.exit(main())
