"""One MoE layer's quantized experts from decode to prefill sizes: each path forced (the routed GEMV,
mixgemm.kernels.cuda.routed_gemv, and the grouped tensor-core GEMM, mixgemm.kernels.cuda.grouped_gemm, one launch a
projection each; the sorted per-expert layers) and the path the rule takes, against transformers' fp16 / bf16 experts
module, the grouped and sorted outputs against the routed one, and each routed GEMV against its floor (the routed
experts' int4 codes and fp16 g128 scales at copy bandwidth, per distinct expert of the routing).

The layer is built from the model's shapes (one decoder layer of a transformers config, random weights) and
quantized with W4A16 g128; inputs rotate over 8 random routings. Times in us: ``*_graph`` protocol graph timing
(mixgemm.bench.protocol.graph_time_us), ``*_eager`` back-to-back eager calls (host time included).

Usage: PYTHONPATH=src python -m tools.bench.moe_experts [--models qwen3-30b-a3b,mixtral-8x7b] [--tokens 1,2,4]
       [--dtype bfloat16] [--paths routed,grouped,sorted] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings
from functools import partial

import torch

SHAPES = {
    "qwen3-30b-a3b": dict(arch="qwen3_moe", hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, intermediate_size=6144),
    "mixtral-8x7b": dict(arch="mixtral", hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                         num_experts_per_tok=2),
}
COPIES = 8
PATHS = ["routed", "grouped", "sorted"]  # --paths
DTYPE = [torch.float16]  # --dtype (transformers' experts take grouped_mm in bf16, a fallback in fp16)


def one_layer(name: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(SHAPES[name])
    arch = kw.pop("arch")
    cfg = AutoConfig.for_model(arch, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4,
                               vocab_size=128, **kw)
    with warnings.catch_warnings(), torch.device("cuda"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg).to(DTYPE[0]).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    return cfg, model


def int4_g128_bytes(layout) -> int:
    return layout.n * layout.k // 2 + layout.n * (layout.k // 128) * 2


def measure(name: str, tokens: list[int], bandwidth: float) -> list[dict]:
    import mixgemm
    import mixgemm.nn.experts as experts
    from mixgemm import tuning
    from mixgemm.bench.protocol import eager_time_us, graph_time_us
    from mixgemm.kernels.cuda.routed_gemv import routed_config, routed_gemv

    cfg, model = one_layer(name)
    fp16 = copy.deepcopy(model.model.layers[0].mlp.experts)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128))
    mod = model.model.layers[0].mlp.experts
    k, e, h = cfg.num_experts_per_tok, mod.num_experts, cfg.hidden_size
    rows = []
    for t in tokens:
        g = torch.Generator().manual_seed(t)
        xs = [torch.randn(t, h, generator=g).to("cuda", DTYPE[0]) for _ in range(COPIES)]
        ids = [torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).cuda() for _ in range(COPIES)]
        ws = [torch.rand(t, k, generator=g).to("cuda", DTYPE[0]) for _ in range(COPIES)]
        calls = [partial(mod, xs[i], ids[i], ws[i]) for i in range(COPIES)]
        with torch.no_grad():
            y, want = mod(xs[0], ids[0], ws[0]), fp16(xs[0], ids[0], ws[0])
            costs = tuning.routed_experts(tuning.table_for(xs[0].device))
            row = dict(model=name, tokens=t, routed_why_not=experts.routed_why_not(mod),
                       rule_path=experts.path(t, k, e, costs),
                       cosine_fp16=torch.nn.functional.cosine_similarity(y.float().flatten(), want.float().flatten(),
                                                                         dim=0).item())
            rule = experts.path
            try:
                for forced in PATHS:  # each forced (the sorted one reads the routing on the host: no graph)
                    if forced == "routed" and t > 4096 or forced == "sorted" and t > 512:
                        continue  # (minutes of timing at these counts; their trend is plain by then)
                    experts.path = lambda *a, _f=forced: _f
                    if forced != "sorted":
                        row[f"{forced}_graph"] = graph_time_us(calls)
                    row[f"{forced}_eager"] = eager_time_us(calls)
                    if forced != "routed":  # each path against the routed one on the same inputs
                        got = mod(xs[0], ids[0], ws[0])
                        experts.path = lambda *a: "routed"
                        ref = mod(xs[0], ids[0], ws[0])
                        row[f"{forced}_max_rel_err"] = ((got.float() - ref.float()).abs().max()
                                                        / ref.float().abs().max()).item()
            finally:
                experts.path = rule
            row["fp16_eager"] = eager_time_us([partial(fp16, xs[i], ids[i], ws[i]) for i in range(COPIES)])
            stacks = experts._joined(mod)
            routes = [i.reshape(-1).contiguous() for i in ids]
            mids = [torch.randn(t * k, stacks[1].layout.k, generator=g).to("cuda", DTYPE[0]) for _ in range(COPIES)]
            distinct = sum(len(set(i.reshape(-1).tolist())) for i in ids) / COPIES
            for label, st, xin, div in (("gate_up", stacks[0], xs, k), ("down", stacks[1], mids, 1)):
                row[label] = graph_time_us([partial(routed_gemv, xin[i], routes[i], st, div) for i in range(COPIES)])
                row[f"{label}_floor"] = distinct * int4_g128_bytes(st.layout) / bandwidth * 1e6
                row[f"{label}_config"] = dict(routed_config(st, t * k, DTYPE[0], torch.device("cuda")))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", default=",".join(PATHS), help="the paths to time, forced (comma list)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    a = ap.parse_args()
    DTYPE[0] = getattr(torch, a.dtype)
    PATHS[:] = a.paths.split(",")
    from mixgemm.bench.protocol import copy_bandwidth

    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    tokens = [int(t) for t in a.tokens.split(",")]
    run_models(a.models.split(","), lambda name: measure(name, tokens, bandwidth), a.json)


def run_models(names: list[str], measure_one, json_path: str | None) -> list[dict]:
    """measure_one(name)'s rows for each model (the GPU's cache emptied between), written to json_path if given."""
    rows = []
    for name in names:
        rows += measure_one(name)
        torch.cuda.empty_cache()
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
