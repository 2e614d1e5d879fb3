"""Act-order (GPTQ desc_act) costs nothing at decode: a Llama-3-8B-shaped stack of W4 g128 zero_point fp16-scale
QuantLinear layers, the same weights with and without an input permutation, M = 1 (--m) calls replayed from CUDA
graphs.

Per decoder block: q (4096x4096), k, v (1024x4096), o (4096x4096), gate, up (14336x4096), down (4096x14336),
as (N, K); q / k / v and gate / up share their input permutation, as GPTQ's act-order gives layers that see the
same inputs (the same Hessian). The act-order layers are built as the GPTQ converter builds them (the
permutation from a random g_idx through mixgemm.checkpoints.packed_int32.act_order_perm).

The act-order layers run the GEMVs that gather x through the permutation while reading it (gemv.cu GEMV_PERM: at
M = 1 fp16 the block gathers x once into shared memory; gemv_mma.cu MMA_PERM: each lane its pieces), where
mixgemm.kernels.linear's rules say so. The table also times the act-order stack with every gather left to the separate
PDL gather kernel (gather_x.cu) and with every GEMV gathering itself (per lane where x is not staged;
kernel_options(act_order_gather="caller" / "kernel")), each layer kind alone those ways, the stack with down's
permutation folded into gate / up (mixgemm.nn.fold_perm: down then runs plain) with in-kernel and with
separate gathers, and the folded stack with one gather per shared input (the PDL gather op, gather_columns: what a
compiled model's norms run when mixgemm's norm kernel cannot write their output gathered itself,
mixgemm.nn.norms; the stack has no norms, tools.checks.actorder_model times whole models), and prints
each layer's path: the data for those rules at other M (--m) and bf16 (--dtype).

Checks: every act-order layer's output equals the plain layer applied to x[..., perm] in every variant (bit for bit:
the same arithmetic on the same numbers, only where x is read from differs), and at M = 1 the act-order stack as
loaded (compiled: norms gathering) is at most --tolerance (3%) slower than the plain one (other M: times reported, not
checked).

    PYTHONPATH=src python -m tools.checks.actorder_gpu --out DIR [--blocks 4] [--m 1] [--dtype float16]

Prints a table, writes DIR/actorder_gpu.json, exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

import mixgemm
from mixgemm.checkpoints.packed_int32 import act_order_perm
from mixgemm.formats.weight import QuantConfig, from_codes
from mixgemm.nn.linear import QuantLinear

HIDDEN, INTER, KV = 4096, 14336, 1024
GROUP = 128
GATHERS = 50
# (name, N, K, which input permutation it shares)
BLOCK = [("q", HIDDEN, HIDDEN, "attn_in"), ("k", KV, HIDDEN, "attn_in"), ("v", KV, HIDDEN, "attn_in"),
         ("o", HIDDEN, HIDDEN, "o_in"), ("gate", INTER, HIDDEN, "mlp_in"), ("up", INTER, HIDDEN, "mlp_in"),
         ("down", HIDDEN, INTER, "down_in")]


def random_weight(n, k, gen, device):
    """A random W4 g128 zero_point fp16 weight whose outputs keep unit scale (no fp16 overflow down the stack)."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = torch.randint(4, 12, (n, k // GROUP), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.5 + 0.75) / (5.0 * k**0.5)
    cfg = QuantConfig(bits=4, group_size=GROUP, mode="zero_point", scale_dtype=torch.float16)
    return from_codes(codes, scales.half(), cfg, zeros=zeros).to(device)


def build(blocks, device):
    gen = torch.Generator().manual_seed(0)
    plain, ordered = [], []
    for _ in range(blocks):
        perms = {}
        p_block, o_block = {}, {}
        for name, n, k, share in BLOCK:
            if share not in perms:
                g_idx = torch.randperm(k, generator=gen) // GROUP  # desc_act: groups scattered over K
                perms[share] = act_order_perm(g_idx, GROUP, f"{name}.g_idx").to(device)
            qw = random_weight(n, k, gen, device)
            p_block[name] = QuantLinear.from_quantized(qw)
            o_block[name] = QuantLinear.from_quantized(qw, input_perm=perms[share])
        plain.append(p_block)
        ordered.append(o_block)
    return plain, ordered


def stack_forward(blocks, x):
    h = x
    for b in blocks:
        q = b["q"](h)
        b["k"](h), b["v"](h)  # attention's other inputs: in the graph like in a model, their values unused here
        a = b["o"](q)
        h = b["down"](b["gate"](a) * b["up"](a))
    return h


def stack_forward_shared_gather(plain, ordered, x):
    """The act-order stack with one gather per shared input (q / k / v's, gate / up's: the gather_columns op once,
    then the plain layers on it), o gathering as its plan says and down folded: what mixgemm.from_pretrained's model
    runs under torch.compile where its norms are not transformers' RMSNorm (mixgemm.nn.norms; an
    RMSNorm writes its output gathered in mixgemm's norm kernel, no gather kernel at all)."""
    gather = torch.ops.mixgemm.gather_columns
    h = x
    for p, o in zip(plain, ordered, strict=True):
        hq = gather(h, o["q"].input_perm)
        q = p["q"](hq)
        p["k"](hq), p["v"](hq)
        a = o["o"](q)
        am = gather(a, o["gate"].input_perm)
        h = p["down"](p["gate"](am) * p["up"](am))
    return h


def graph_of(fn, x):
    for _ in range(3):  # compile kernels, build layouts
        fn(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn(x)
    return g, y


def time_graphs(graphs, reps, inner):
    """Median microseconds per replay of each graph, the graphs interleaved rep by rep (drift cancels)."""
    times = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for g in graphs.values():
        for _ in range(inner):
            g.replay()
    torch.cuda.synchronize()
    for _ in range(reps):
        for name, g in graphs.items():
            start.record()
            for _ in range(inner):
                g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000.0 / inner)
    return {name: statistics.median(t) for name, t in times.items()}


# The act-order stack's variants: the defaults (the cached plans with their prepared launches, as users run them),
# then kernel_options(act_order_gather=...) (mixgemm.kernels.options): every GEMV leaving the gather to the separate
# PDL gather kernel, every GEMV gathering itself (per lane where x is not staged); calls under non-default options
# choose afresh, so each variant's graph is captured with its own choice.
VARIANTS = {"act_order": None, "act_order_separate_gather": "caller", "act_order_all_in_kernel": "kernel"}


# variants also timed layer kind by layer kind
PER_LAYER = ("act_order", "act_order_separate_gather")


def sweep_configs(args, plain, ordered, device, dtype) -> int:
    """Each layer kind, plain and act-order, under each forced GEMV tile (kernel_options(configs=...)) beside the
    defaults: which tiles make the in-kernel gather cheap (the per-block x staging is paid once per block)."""
    rows, graphs, failed = [], {}, []
    with torch.no_grad():
        for name, _n, k, _ in BLOCK:
            xl = torch.randn(args.m, k, device=device, dtype=dtype)
            graphs[(name, "default", "plain")], _ = graph_of(lambda t, nm=name: [b[nm](t) for b in plain], xl)
            graphs[(name, "default", "act")], _ = graph_of(lambda t, nm=name: [b[nm](t) for b in ordered], xl)
            for i, cfg in enumerate(args.configs):
                with mixgemm.kernel_options(configs={"cuda_gemv": cfg}):
                    lp, lo = plain[0][name], ordered[0][name]
                    try:
                        if not torch.equal(lo(xl), lp(xl.index_select(-1, lo.input_perm))):
                            failed.append(f"{name} {cfg}: act-order output differs")
                        for kind, stack in (("plain", plain), ("act", ordered)):
                            graphs[(name, i, kind)], _ = graph_of(lambda t, nm=name, s=stack: [b[nm](t) for b in s],
                                                                  xl)
                    except Exception as e:  # noqa: BLE001 - a tile this layer cannot take: reported, skipped
                        failed.append(f"{name} {cfg}: {type(e).__name__}: {str(e)[:120]}")
        times = time_graphs(graphs, args.reps, args.inner)
    print(f"{'layer':6s} {'tile':60s} {'plain us':>9s} {'act us':>8s} {'act/plain':>9s} {'act/default plain':>17s}")
    for name, *_ in BLOCK:
        base = times[(name, "default", "plain")] / args.blocks
        for i, label in [("default", "default"), *((i, json.dumps(c)) for i, c in enumerate(args.configs))]:
            if (name, i, "act") not in times:
                continue
            tp, ta = times[(name, i, "plain")] / args.blocks, times[(name, i, "act")] / args.blocks
            rows.append(dict(layer=name, tile=label, plain_us=tp, act_us=ta))
            print(f"{name:6s} {label:60s} {tp:9.2f} {ta:8.2f} {ta / tp:9.3f} {ta / base:17.3f}")
    for f in failed:
        print("FAILED:", f)
    (args.out / "actorder_tiles.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows,
                                                                  failed=failed), indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--m", type=int, default=1, help="rows per call (1: decode)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--configs", type=json.loads, default=None, metavar="JSON",
                    help="a list of CUDA-core GEMV tiles (R, U, KS, ... as kernel_options(configs=) takes them): time "
                         "each layer kind plain and act-order under each, beside the defaults, and stop")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("actorder_gpu: needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    plain, ordered = build(args.blocks, device)
    if args.configs:
        return sweep_configs(args, plain, ordered, device, dtype)

    mismatches, paths, graphs, outs = [], {}, {}, {}
    with torch.no_grad():
        x = torch.randn(args.m, HIDDEN, device=device, dtype=dtype)
        graphs["plain"], outs["plain"] = graph_of(lambda t: stack_forward(plain, t), x)
        for label, gather in VARIANTS.items():
            with contextlib.nullcontext() if gather is None else mixgemm.kernel_options(act_order_gather=gather):
                # correctness: act-order layer(x) == plain layer(x[..., perm]), bit for bit
                for name, _n, k, _ in BLOCK:
                    xl = torch.randn(args.m, k, device=device, dtype=dtype)
                    lp, lo = plain[0][name], ordered[0][name]
                    if not torch.equal(lo(xl), lp(xl.index_select(-1, lo.input_perm))):
                        mismatches.append(f"{name} ({label})")
                    # which kernel the layer runs and whether it gathers x itself
                    paths.setdefault(label, {})[name] = str(mixgemm.explain(xl, lo.quantized_weight(), act_order=True))
                graphs[label], outs[label] = graph_of(lambda t: stack_forward(ordered, t), x)
                if label in PER_LAYER:
                    for name, _n, k, _ in BLOCK:  # each layer kind alone: the blocks' layers of that kind in a row
                        xl = torch.randn(args.m, k, device=device, dtype=dtype)
                        graphs[f"{name}:{label}"], _ = graph_of(
                            lambda t, nm=name: [b[nm](t) for b in ordered], xl)
                        if label == "act_order":
                            graphs[f"{name}:plain"], _ = graph_of(lambda t, nm=name: [b[nm](t) for b in plain], xl)
        # as mixgemm.from_pretrained loads it: down's permutation folded into gate / up's output rows
        # (mixgemm.nn.fold_perm; exact), so down runs as a plain layer
        folded = [{**o, "down": p["down"]} for o, p in zip(ordered, plain, strict=True)]
        graphs["act_order_as_loaded"], outs["act_order_as_loaded"] = graph_of(lambda t: stack_forward(folded, t), x)
        with mixgemm.kernel_options(act_order_gather="caller"):
            graphs["folded_separate_gather"], outs["folded_separate_gather"] = graph_of(
                lambda t: stack_forward(folded, t), x)
        graphs["act_order_shared_gather"], outs["act_order_shared_gather"] = graph_of(
            lambda t: stack_forward_shared_gather(plain, ordered, t), x)
        gather_x = torch.randn(args.m, INTER, device=device, dtype=dtype)
        perm = ordered[0]["down"].input_perm
        # one separate gather, 50 in one graph so that the graph launch does not count
        graphs["gathers"], _ = graph_of(lambda t: [t[..., perm] for _ in range(GATHERS)], gather_x)
        times = time_graphs(graphs, args.reps, args.inner)
        times["one_gather"] = times.pop("gathers") / GATHERS
        # (graph outputs hold values once replayed, as they now have been, on the same x)
        if not torch.equal(outs["act_order_shared_gather"], outs["act_order_as_loaded"]):
            mismatches.append("the stack with shared gathers")
        if not torch.equal(outs["folded_separate_gather"], outs["act_order_as_loaded"]):
            mismatches.append("the folded stack with separate gathers")

    finite = all(bool(torch.isfinite(o).all()) for o in outs.values())
    weight_bytes = sum(m.quantized_weight().nbytes() for b in plain for m in b.values())
    ratio = times["act_order_shared_gather"] / times["plain"]  # the compiled model's arrangement
    result = {
        "device": torch.cuda.get_device_name(), "blocks": args.blocks, "layers_per_block": len(BLOCK), "m": args.m,
        "dtype": args.dtype, "times_us": times, "ratio": ratio, "weight_bytes": weight_bytes,
        "plain_GBps": weight_bytes / times["plain"] / 1e3, "tolerance": args.tolerance,
        "layer_mismatches": mismatches, "outputs_finite": finite, "paths": paths,
    }
    # the acceptance line is decode (M = 1): the stack as loaded within the tolerance of plain; other M check the
    # outputs and report the times
    ok = not mismatches and finite and (args.m > 1 or ratio <= 1.0 + args.tolerance)
    result["ok"] = ok
    (args.out / "actorder_gpu.json").write_text(json.dumps(result, indent=2))

    print(f"{f'stack (M = {args.m}, {args.dtype}, CUDA graph)':40s} {'us':>9s} {'GB/s':>8s} {'/ plain':>8s}")
    for label in ("plain", *VARIANTS, "act_order_as_loaded", "folded_separate_gather", "act_order_shared_gather"):
        print(f"{label:40s} {times[label]:9.1f} {weight_bytes / times[label] / 1e3:8.0f} "
              f"{times[label] / times['plain']:8.3f}")
    print(f"per layer kind ({args.blocks} layers each, us): plain | " + " | ".join(PER_LAYER))
    for name, *_ in BLOCK:
        print(f"  {name:6s} {times[f'{name}:plain']:8.1f} | "
              + " | ".join(f"{times[f'{name}:{v}']:8.1f} ({times[f'{name}:{v}'] / times[f'{name}:plain']:.3f})"
                           for v in PER_LAYER))
    print(f"{f'one separate gather (K = {INTER})':40s} {times['one_gather']:9.1f}")
    for name, p in paths["act_order"].items():
        lines = p.splitlines()
        print(f"{name}: {lines[0]} | {lines[1].strip() if len(lines) > 1 else ''}")
    print(f"act-order as loaded, compiled (shared gathers) / plain = {ratio:.4f} (limit {1 + args.tolerance:.2f}); "
          f"eager arrangement (folded, in-kernel) / plain = {times['act_order_as_loaded'] / times['plain']:.4f}; "
          "per-layer outputs "
          f"{'equal' if not mismatches else 'DIFFER: ' + ', '.join(mismatches)}; finite {finite}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
