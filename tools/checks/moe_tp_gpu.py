"""Tensor parallelism of a quantized mixture-of-experts model on 2 GPUs: Qwen3-30B-A3B shapes (128 experts of 2048 ->
2 x 768 -> 2048, top 8, 32 / 4 heads of 128; --layers of its 48, random weights), W4A16 g128, split along the
model's own plan (mixgemm.distributed.tensor_parallel_: every expert's gate / up packed column-parallel, down
row-parallel, the experts' output summed over the ranks; ``--plan ep``: its expert-parallel plan, each rank keeping
64 whole experts) against the same model on one GPU.

    PYTHONPATH=src torchrun --nproc-per-node 2 -m tools.checks.moe_tp_gpu --out DIR
    PYTHONPATH=src torchrun --nproc-per-node 2 -m tools.checks.moe_tp_gpu --out DIR --device cpu   (the logic, gloo)

Checks (exit status 1 when one fails):
* routed (GPU): after sharding, every experts module of every rank still decodes routed
  (mixgemm.nn.experts.routed_why_not: the experts' shards joined again);
* equal: teacher-forced on TP 1's greedy tokens, TP 2's logits at every step (eager) equal TP 1's within fp16
  tolerance (max |diff| <= 2e-2 x max |TP 1 logit|: the two sum in another order).
Reported: decode tokens/s at TP 1 and TP 2 under torch.compile with CUDA graphs (mixgemm.bench.e2e's loop), and each
rank's resident weight bytes. Writes DIR/moe_tp_gpu.json (rank 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

QWEN3_30B_A3B = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                     intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     vocab_size=32000)
SMOKE = dict(hidden_size=128, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, intermediate_size=256,
             num_attention_heads=8, num_key_value_heads=4, head_dim=16, vocab_size=256)
LOGIT_TOL = 2e-2


def build(shapes: dict, layers: int, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    import mixgemm

    cfg = AutoConfig.for_model("qwen3_moe", num_hidden_layers=layers, **shapes)
    torch.manual_seed(0)  # every rank builds the same model (tensor_parallel_ broadcasts rank 0's anyway)
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    for p in model.parameters():
        if p.dim() >= 2:
            p.data.normal_(0, 0.02)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128 if shapes is QWEN3_30B_A3B else 32))
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8, help="greedy tokens to compare")
    ap.add_argument("--steps", type=int, default=32, help="timed compiled decode steps")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--plan", default="tp", choices=["tp", "ep"],
                    help="tp: the model's tensor-parallel plan; ep: its expert-parallel plan (model_ep_plan)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    from torch.distributed.device_mesh import init_device_mesh

    from mixgemm import resident_bytes
    from mixgemm.bench.e2e import decode_tokens_per_s
    from mixgemm.distributed import model_ep_plan, tensor_parallel_
    from mixgemm.integrations.hf import greedy_decode
    from mixgemm.nn.experts import QuantizedExperts, routed_why_not
    from tools.checks.tp_gpu import finish, forced_logits  # (eager: teacher-forced logits over a static cache)

    shapes = QWEN3_30B_A3B if cuda else SMOKE
    dtype = torch.float16 if cuda else torch.float32
    dev = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    model = build(shapes, a.layers, dev, dtype)
    prompt = torch.randint(0, shapes["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1)).to(dev)
    res: dict = {"world": world, "plan": a.plan, "layers": a.layers, "shapes": shapes,
                 "device": torch.cuda.get_device_name() if cuda else "cpu"}
    mode, backend = ("reduce-overhead", "inductor") if cuda else (None, "eager")
    timing = dict(batch=1, prompt_len=16, warmup=4, steps=a.steps, vocab=shapes["vocab_size"], seed=0, mode=mode,
                  backend=backend)
    tokens = torch.empty(1, a.tokens, dtype=torch.int64, device=dev)
    if rank == 0:  # TP 1: the whole model on this GPU, before it is sharded (not a copy: the same layers and joins)
        toks, _ = greedy_decode(model, prompt, a.tokens)
        tokens.copy_(toks)
        ref = forced_logits(model, prompt, tokens, None)
        res["tp1_tokens_per_s"] = decode_tokens_per_s(model, **timing)["tokens_per_s"]
        res["tp1_weight_bytes"] = resident_bytes(model)["total"]
    dist.barrier()
    dist.broadcast(tokens, src=0)
    report = tensor_parallel_(model, init_device_mesh(a.device, (world,)),
                              model_ep_plan(model) if a.plan == "ep" else None)
    why = {name: routed_why_not(m) for name, m in model.named_modules() if isinstance(m, QuantizedExperts)}
    got = forced_logits(model, prompt, tokens, None)
    res["tp2_tokens_per_s"] = decode_tokens_per_s(model, **timing)["tokens_per_s"]
    weight = torch.tensor([resident_bytes(model)["total"]], dtype=torch.int64, device=dev)
    all_why = [None] * world
    dist.all_gather_object(all_why, why)
    weights = [torch.zeros_like(weight) for _ in range(world)]
    dist.all_gather(weights, weight)
    if rank == 0:
        worst = max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref, strict=True))
        not_routed = {f"rank {r} {n}": w for r, d in enumerate(all_why) for n, w in d.items() if w is not None}
        res.update(sharded=len(report.sharded), logits_rel_diff=worst, not_routed=not_routed,
                   tp2_weight_bytes_per_rank=[int(w) for w in weights],
                   speedup=res["tp2_tokens_per_s"] / res["tp1_tokens_per_s"],
                   checks={"equal": worst <= LOGIT_TOL, **({"routed": not not_routed} if cuda else {})})
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "moe_tp_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps({k: v for k, v in res.items() if k != "shapes"}, indent=1), flush=True)
    ok = torch.tensor([1 if rank != 0 or all(res["checks"].values()) else 0], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return finish(bool(int(ok)), gpu=cuda)


if __name__ == "__main__":
    sys.exit(main())
