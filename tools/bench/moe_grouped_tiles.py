"""The grouped experts GEMM's tile (mixgemm.kernels.cuda.grouped_gemm) against variants of it: one MoE layer's two
projections (the layer of tools/bench/moe_experts.py, W4A16 g128, uniform random routing sorted by expert, one table
shared by both), CUDA-graph timing per config, us.

Variants of ``grouped_config``'s tile: NWG 1 (64 weight rows a CTA: twice the CTAs), KT 1 and KT 4 (64-k tiles a
stage), STAGES 6, BM doubled and halved (16 at least).

Usage: PYTHONPATH=src python -m tools.bench.moe_grouped_tiles [--models qwen3-30b-a3b,mixtral-8x7b]
       [--tokens qwen3-30b-a3b:32,128,512;mixtral-8x7b:8,32,128] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from tools.bench import moe_experts

COPIES = 4


def variants(base: dict) -> dict[str, dict]:
    bm = base["BM"]
    return {"rule": base, "NWG 1": {**base, "NWG": 1}, "KT 1": {**base, "KT": 1}, "KT 4": {**base, "KT": 4},
            "STAGES 6": {**base, "STAGES": 6}, "BM x2": {**base, "BM": min(2 * bm, 256)},
            "BM / 2": {**base, "BM": max(bm // 2, 16)}}


def layer_calls(stacks, x, route, e, cfg):
    from mixgemm.kernels.cuda.grouped_gemm import grouped_gemm, tile_table

    def call():
        table = tile_table(route, e, cfg["BM"])
        y = grouped_gemm(x, route, stacks[0], cfg, zero_unrouted=False, table=table)
        grouped_gemm(y[:, : stacks[1].layout.k].contiguous(), route, stacks[1], cfg, table=table)

    return call


def measure(name: str, tokens: list[int]) -> list[dict]:
    import mixgemm
    import mixgemm.nn.experts as experts
    from mixgemm.bench.protocol import graph_time_us
    from mixgemm.kernels.cuda.grouped_gemm import grouped_config

    cfg, model = moe_experts.one_layer(name)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    mod = model.model.layers[0].mlp.experts
    stacks = experts._joined(mod)
    k, e, h = cfg.num_experts_per_tok, mod.num_experts, cfg.hidden_size
    rows = []
    for t in tokens:
        g = torch.Generator().manual_seed(t)
        ins = []
        for _ in range(COPIES):
            ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).reshape(-1)
            route = ids.sort().values.cuda()
            ins.append((torch.randn(t * k, h, generator=g).to("cuda", torch.bfloat16), route))
        row = dict(model=name, tokens=t)
        for label, c in variants(grouped_config(t * k, e)).items():
            try:
                row[label] = graph_time_us([layer_calls(stacks, x, r, e, c) for x, r in ins])
            except Exception as exc:  # noqa: BLE001 - a variant that cannot run (shared memory) is reported
                row[label] = f"{type(exc).__name__}: {exc}"[:120]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b")
    ap.add_argument("--tokens", default="qwen3-30b-a3b:32,128,512;mixtral-8x7b:8,32,128")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    moe_experts.DTYPE[0] = torch.bfloat16
    counts = {m: [int(t) for t in ts.split(",")] for m, ts in (p.split(":") for p in a.tokens.split(";"))}
    moe_experts.run_models(a.models.split(","), lambda name: measure(name, counts[name]), a.json)


if __name__ == "__main__":
    main()
