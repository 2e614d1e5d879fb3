"""The conv GPU check (driven by tools/checks/conv_gpu_check.sh): compile warm-up, ResNet-50, conv timing.

Sub-commands (PYTHONPATH=src):
  warm --worker I --workers N   compile every kernel variant the other stages use (task i % N == I), one call
                                each, so that the timing process finds them in Triton's cache (compiles run in
                                N processes in parallel instead of one after the other in the timed process)
  resnet --out DIR              ResNet-50 (random weights) quantized with mixgemm.quantize_ (W8A16 per-channel,
                                W4A16 g128) on fp16 channels_last input vs the same net with dequantized float
                                weights: rel err (vs fp32, TF32 off) and CUDA-graph time at batch 1 and 32 vs the
                                dequantized net in fp16 channels_last (cuDNN). --deployed: the BNs folded into the
                                convs and the ReLUs after conv1 / conv2 fused into the quantized convs' epilogues
  bench --out DIR [--budget-s S]
                                every layer of mixgemm.bench.conv.CONV_PRESET (ResNet-50 stages + ConvNeXt 7x7
                                depthwise) at batch 1 and 32: cuDNN fp16 channels_last vs mixgemm W8A16 (per-channel)
                                and W4A16 (g128, or the fitted group) -- what dispatch picks, and a tile sweep of the
                                Triton kernel on the layers that matter for the acceptance; writes bench.json and
                                conv_table_<gpu>.json (the fastest correct variant per layer: the measured table)

Timing = the benchmark protocol adapted to conv: C copies of the layer (input activation AND weights, since a
conv's activations usually outweigh its weights), C x (input + output + weight bytes of the method with the
smallest footprint) > 3 x L2 (so every method's copies exceed it), one CUDA graph running the C calls back to
back, median replay (triton do_bench) / C. Correctness first: every timed variant's output is compared with
F.conv2d in fp32 (TF32 off) on the dequantized weights; a variant over 2e-3 relative error is not timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

from mixgemm import quantize_conv_weight
from mixgemm.bench.conv import CONV_BATCHES, CONV_PRESET, ConvSpec
from mixgemm.bench.protocol import graph_time_us, l2_bytes
from mixgemm.formats.weight import QuantConfig
from mixgemm.kernels.triton.conv_int8 import fold_length
from mixgemm.kernels.triton_conv_igemm.igemm import ConvConfig, _bk_fits, default_config
from mixgemm.kernels.triton_dwconv.dwconv import DwConfig
from mixgemm.nn.conv import fit_conv_config
from mixgemm.ops.conv import cuda_conv2d, cuda_conv2d_a8, pick_path
from mixgemm.tuning import conv_table

DEV = "cuda"
TOL = 2e-3
WARM_MS, REP_MS = 10, 25


# ------------------------------------------------------------------------------------------- variants
def qconfig(spec: ConvSpec, bits: int) -> QuantConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_conv_config(
            QuantConfig(bits=bits, group_size=-1 if bits == 8 else 128, mode="sym"),
            (spec.co, spec.ci // spec.groups, spec.k, spec.k),
        )


def _splits(m, n, kk, bm, bn, bk, sms=132):
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    steps = math.ceil(kk / bk)
    out = [1]
    for s in (2, 4, 8, 16):
        if tiles * s <= 3 * sms and steps // s >= 2:
            out.append(s)
    return out


def sweep_variants(spec: ConvSpec, batch: int, qc: QuantConfig) -> list[tuple[str, str | None, object]]:
    """(label, path, config): None/None = what mixgemm.conv2d dispatches to; then the kernel's tile sweep."""
    ci_g, co_g, k = spec.ci // spec.groups, spec.co // spec.groups, spec.k
    m = batch * spec.out_hw**2
    kk = ci_g * k * k
    out: list[tuple[str, str | None, object]] = [("auto", None, None)]
    if spec.groups > 1 and ci_g == 1:  # depthwise: CUDA-core kernel tiles
        for c in (DwConfig(64, 64, 4), DwConfig(128, 32, 4), DwConfig(32, 128, 4), DwConfig(128, 64, 8),
                  DwConfig(256, 32, 8), DwConfig(16, 128, 4)):
            out.append((f"dw{c.block_m}x{c.block_c}w{c.num_warps}", "dw", c))
        out.append(("dequant+cudnn", "dequant", None))
        return out
    pointwise = k == 1 and spec.stride == 1
    if pointwise:
        out.append(("matmul", "matmul", None))
        out.append(("igemm-default", "igemm", None))
    pc = qc.group_size == -1
    bks = [b for b in (128, 64, 32) if _bk_fits(b, ci_g, qc.group_size, pc)]
    if not bks:
        out.append(("dequant+cudnn", "dequant", None))
        return out
    bk = 64 if 64 in bks else bks[0]
    cfgs = []
    if m >= 1024:
        big_n = 128 if co_g >= 128 else 64
        cfgs += [
            (128, 64, bk, 1, 4, 4, False),
            (128, big_n, bk, 1, 8, 3, False),
            (256, 64, bk, 1, 8, 3, False),
            (256, big_n, bk, 1, 8, 3, False),
            (64, big_n, bk, 1, 4, 4, False),
            (128, big_n, bk, 1, 4, 3, False),
            (128, big_n, bk, 1, 4, 4, True),
        ]
        if co_g >= 256:
            cfgs.append((128, 256, bk, 1, 8, 3, False))
        # under ~2 waves of 128 x big_n tiles (stage 3-4 layers): split-K, or smaller tiles
        if math.ceil(m / 128) * math.ceil(co_g / big_n) < 2 * 132:
            sp = _splits(m, co_g, kk, 128, big_n, bk)
            for sk in sorted({sp[len(sp) // 2], sp[-1]} - {1}):
                cfgs.append((128, big_n, bk, sk, 8, 3, False))
                cfgs.append((64, 64, bk, sk, 4, 4, False))
            cfgs.append((64, 64, bk, 1, 4, 4, False))
        if 128 in bks:
            cfgs.append((128, big_n, 128, 1, 8, 3, False))
            cfgs.append((256, big_n, 128, 1, 8, 2, False))
    else:
        bm = 16
        while bm < min(m, 64):
            bm *= 2
        for bn in (64, 128):
            if bn > 64 and co_g < 128:
                continue
            sp = _splits(m, co_g, kk, bm, bn, bk)
            for s in sorted({sp[0], sp[len(sp) // 2], sp[-1]}):  # no split, a middle one, the largest
                cfgs.append((bm, bn, bk, s, 4, 4, True))
        if 128 in bks:
            sp = _splits(m, co_g, kk, bm, 64, 128)
            cfgs.append((bm, 64, 128, sp[len(sp) // 2], 4, 3, True))
        if m > 64:
            cfgs.append((64, 64, bk, 1, 4, 4, False))
    seen = set()
    for c in cfgs:
        if c in seen:
            continue
        seen.add(c)
        bm, bn, bk_, s, nw, ns, sw = c
        out.append((f"{'S' if sw else 'N'}{bm}x{bn}x{bk_}s{s}w{nw}p{ns}", "igemm", ConvConfig(*c)))
    out.append(("dequant+cudnn", "dequant", None))  # reference point only: materializes the float weight
    if batch >= 32 and a8_applies(spec, qc):
        out.append(("a8", "a8", None))  # INT8-activation conv: another precision, reported apart
    return out


def sweep_wanted(spec: ConvSpec, batch: int) -> bool:
    """Sweep every layer at batch 32; at batch 1 the weight-dominated ones (weights > activations)."""
    if batch >= 32:
        return True
    w = spec.co * spec.ci // spec.groups * spec.k**2
    a = batch * (spec.ci * spec.hw**2 + spec.co * spec.out_hw**2)
    return w > a


def plan(batches=None) -> list[tuple[ConvSpec, int]]:
    return [(s, b) for s in CONV_PRESET for b in (batches or CONV_BATCHES)]


# ------------------------------------------------------------------------------------------- helpers
def _inputs(spec: ConvSpec, batch: int, copies: int, seed: int = 0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    xs = [
        torch.randn(batch, spec.ci, spec.hw, spec.hw, device=DEV, generator=gen)
        .half()
        .contiguous(memory_format=torch.channels_last)
        for _ in range(copies)
    ]
    w = torch.randn(spec.co, spec.ci // spec.groups, spec.k, spec.k, device=DEV, generator=gen) * 0.02
    return xs, w


def _call(spec, x, qw, path, cfg):
    p = spec.padding
    inf = float("inf")
    if path == "a8":  # INT8 activations (conv2d_a8, sym, act block = the weight group or Ci): another precision
        ab = min(qw.in_channels_per_group, qw.matrix.group_size)
        return cuda_conv2d_a8(x, qw, None, (spec.stride,) * 2, (p, p), (1, 1), spec.groups, -inf, inf, ab, "sym", cfg)
    return cuda_conv2d(x, qw, None, (spec.stride,) * 2, (p, p), (1, 1), spec.groups, -inf, inf, None, cfg, path)


def a8_applies(spec: ConvSpec, qc: QuantConfig) -> bool:
    ci_g = spec.ci // spec.groups
    if ci_g < 32:
        return False
    ab = ci_g if qc.group_size == -1 else min(ci_g, qc.group_size)
    return fold_length(ci_g, ci_g * spec.k**2, qc.group_size, ab) % 32 == 0


def _rel(y, ref):
    return float((y.float() - ref).norm() / ref.norm())


# ------------------------------------------------------------------------------------------- warm
def cmd_warm(a):
    tasks = []
    for spec, batch in plan():
        for bits in (8, 4):
            qc = qconfig(spec, bits)
            vs = sweep_variants(spec, batch, qc) if sweep_wanted(spec, batch) else [("auto", None, None)]
            for v in vs:
                tasks.append((spec, batch, bits, v))
    mine = [t for i, t in enumerate(tasks) if i % a.workers == a.worker]
    t0 = time.time()
    cache = {}
    for spec, batch, bits, (label, path, cfg) in mine:
        try:
            key = (spec.name, batch)
            if key not in cache:
                cache.clear()
                cache[key] = _inputs(spec, batch, 1)
            xs, w = cache[key]
            qw = quantize_conv_weight(w, qconfig(spec, bits))
            _call(spec, xs[0], qw, path, cfg)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"warm FAIL {spec.name} b{batch} w{bits} {label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    print(f"warm worker {a.worker}: {len(mine)} tasks in {time.time() - t0:.0f}s", flush=True)


# ------------------------------------------------------------------------------------------- resnet
@torch.no_grad()
def cmd_warm_resnet(a):
    """Compile what the ResNet-50 stage runs (both formats, batch 2 / 1 / 32), untimed."""
    from tools.bench import conv as bc

    t0 = time.time()
    for bits in (8, 4):
        try:
            qnet, _ = _quantize_net(bc.resnet50().to(DEV), bits)
            qnet = qnet.half().to(memory_format=torch.channels_last)
            for batch in (2, 1, 32):
                qnet(torch.randn(batch, 3, 224, 224, device=DEV).half().contiguous(memory_format=torch.channels_last))
            torch.cuda.synchronize()
            del qnet
        except Exception as e:
            print(f"warm FAIL resnet w{bits}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    print(f"warm resnet: {time.time() - t0:.0f}s", flush=True)


def _quantize_net(net, bits):
    from mixgemm.quantize_api import W4A16, W8A16, quantize_

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = quantize_(net, W4A16(group_size=128) if bits == 4 else W8A16())
    return net, len(rep.replaced)


def _graph_ms(fn, reps_ms=60):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    import triton

    t = triton.testing.do_bench(g.replay, warmup=10, rep=reps_ms, return_mode="median")
    del g
    return t


@torch.no_grad()
def cmd_resnet(a):
    from mixgemm.nn.conv import QuantConv2d
    from tools.bench import conv as bc

    torch.backends.cudnn.benchmark = True
    res_all = []
    for bits in (8, 4):
        t0 = time.time()
        res = dict(bits=bits)
        try:
            net = bc.resnet50().to(DEV)
            if a.deployed:  # BNs folded into the convs, ReLUs after conv1 / conv2 / stem fused into their epilogues
                net = bc.deployed(net)
            qnet, nrep = _quantize_net(net, bits)
            res["replaced"] = nrep
            if a.deployed:
                res["deployed"], res["relu_fused"] = True, bc.fuse_conv_relu(qnet)
            res["n_quantconv"] = sum(isinstance(m, QuantConv2d) for m in qnet.modules())
            res["formats"] = sorted(
                {f"int{m.qconfig.bits}/g{m.qconfig.group_size}" for m in qnet.modules() if isinstance(m, QuantConv2d)}
            )
            ref_net = bc.dequantized_copy(qnet).float()
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            x = torch.randn(2, 3, 224, 224, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))
            ref = ref_net(x)
            del ref_net
            qnet = qnet.half().to(memory_format=torch.channels_last)
            y = qnet(x.half().to(memory_format=torch.channels_last)).float()
            res["rel_err"] = _rel(y, ref)
            fnet = bc.dequantized_copy(qnet).half().to(memory_format=torch.channels_last)
            for batch in (1, 32):
                xin = torch.randn(batch, 3, 224, 224, device=DEV).half().contiguous(memory_format=torch.channels_last)
                res[f"b{batch}_quant_ms"] = _graph_ms(lambda q=qnet, xi=xin: q(xi))
                res[f"b{batch}_cudnn_fp16_ms"] = _graph_ms(lambda f=fnet, xi=xin: f(xi))
            del fnet, qnet
        except Exception as e:
            traceback.print_exc()
            res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["stage_s"] = round(time.time() - t0, 1)
        print("RESNET50", json.dumps(res), flush=True)
        res_all.append(res)
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "resnet.json"), "w") as f:
        json.dump(res_all, f, indent=1)


# ------------------------------------------------------------------------------------------- bench
def bench_one(spec: ConvSpec, batch: int, sweep: bool, l2: int) -> dict:
    ho = spec.out_hw
    m = batch * ho * ho
    x_b = batch * spec.ci * spec.hw**2 * 2
    o_b = batch * spec.co * ho * ho * 2
    w16 = spec.co * spec.ci // spec.groups * spec.k**2 * 2
    w4 = w16 // 4  # smallest weight footprint of the methods timed (W4)
    per = x_b + o_b + w4
    C = max(3, min(400, 3 * l2 // per + 1, (8 << 30) // (per + w16)))
    xs, w = _inputs(spec, batch, C)
    row = dict(layer=spec.name, batch=batch, M=m, N=spec.co, K=spec.ci // spec.groups * spec.k**2, copies=C)
    p = spec.padding
    whs = [w.half().contiguous(memory_format=torch.channels_last) for _ in range(C)]
    torch.backends.cudnn.benchmark = True
    row["cudnn_us"] = graph_time_us(
        [lambda i=i, xs=xs, whs=whs: F.conv2d(xs[i], whs[i], None, spec.stride, p, 1, spec.groups) for i in range(C)],
        WARM_MS,
        REP_MS,
    )
    whs = None
    for bits in (8, 4):
        qc = qconfig(spec, bits)
        tag = f"w{bits}"
        row[f"{tag}_fmt"] = f"int{qc.bits} {'pc' if qc.group_size == -1 else f'g{qc.group_size}'}"
        q0 = quantize_conv_weight(w, qc)
        qws = [q0] + [q0.to("cpu").to(DEV) for _ in range(C - 1)]
        torch.backends.cudnn.allow_tf32 = False
        ref = F.conv2d(xs[0].float(), q0.dequantize(torch.float32), None, spec.stride, p, 1, spec.groups)
        row[f"{tag}_auto_path"] = pick_path(xs[0], q0, m, (spec.stride,) * 2, (p, p), spec.groups)
        variants = sweep_variants(spec, batch, qc) if sweep else [("auto", None, None)]
        times = {}
        for label, path, cfg in variants:
            try:
                err = _rel(_call(spec, xs[0], q0, path, cfg), ref)
                if label == "a8":  # vs the float conv: the activation quantization error (~1e-2), not a kernel error
                    row[f"{tag}_a8_err"] = err
                if not err <= (0.05 if label == "a8" else TOL):
                    times[label] = f"WRONG {err:.2e}"
                    continue
                t = graph_time_us(
                    [lambda i=i, pa=path, c=cfg, xs=xs, qws=qws: _call(spec, xs[i], qws[i], pa, c) for i in range(C)],
                    WARM_MS,
                    REP_MS,
                )
                times[label] = round(t, 2)
                if label == "auto":
                    row[f"{tag}_err"] = err
            except Exception as e:
                times[label] = f"ERR {type(e).__name__}: {str(e)[:100]}"
        row[f"{tag}_times"] = times
        row[f"{tag}_us"] = times.get("auto") if isinstance(times.get("auto"), float) else float("nan")
        ours = {k: v for k, v in times.items() if isinstance(v, float) and k not in ("dequant+cudnn", "a8")}
        if ours:
            best = min(ours, key=ours.get)
            row[f"{tag}_best"], row[f"{tag}_best_us"] = best, ours[best]
            vd = dict((lab, (pa, c)) for lab, pa, c in variants)
            pa, c = vd[best]
            if best == "auto":
                pa = row[f"{tag}_auto_path"]
            if pa == "igemm" and c is None:  # dispatch's own tiles (table entry or heuristic): record them
                c = default_config(xs[0].device, q0, (spec.stride,) * 2, spec.groups, m)[0]
            if pa in ("igemm", "matmul"):
                row[f"{tag}_table"] = (
                    conv_table.conv_key(q0.matrix.bits, conv_table.key_group(q0.matrix), spec.k, spec.k, spec.stride,
                                        spec.ci // spec.groups, spec.co // spec.groups, m),
                    [pa, None if c is None else [c.block_m, c.block_n, c.block_k, c.split_k, c.num_warps,
                                                 c.num_stages, c.swap_ab]],
                )
        qws = None
    xs = None
    torch.cuda.empty_cache()
    return row


def cmd_bench(a):
    import triton

    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = l2_bytes()
    print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    rows = []
    todo = plan()
    # the acceptance's cases first (batch 32, then batch 1 weight-dominated), so a tight budget still covers them
    todo.sort(key=lambda sb: (sb[1] != 32, not sweep_wanted(*sb)))
    for spec, batch in todo:
        if time.time() - t0 > a.budget_s:
            print(f"# budget: skipped {spec.name} b{batch}", flush=True)
            continue
        try:
            r = bench_one(spec, batch, sweep_wanted(spec, batch), l2)
        except Exception as e:
            traceback.print_exc()
            print(f"# FAILED {spec.name} b{batch}: {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(r)
        print("ROW", json.dumps(r), flush=True)
        with open(os.path.join(a.out, "bench.json"), "w") as f:
            json.dump(rows, f, indent=1)
    table = {}
    for r in rows:
        for bits in (8, 4):
            if f"w{bits}_table" in r:
                k, v = r[f"w{bits}_table"]
                table[k] = v
    slug = "h200" if "H200" in props.name else "h100" if "H100" in props.name else "gpu"
    with open(os.path.join(a.out, f"conv_table_{slug}.json"), "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    print_table(rows)
    print(f"# bench done in {time.time() - t0:.0f}s", flush=True)


def print_table(rows):
    print("\n| layer | B | M | cuDNN us | W8 auto us (x) | W8 best us (x) | W4 auto us (x) | W4 best us (x) | "
          "dq+cuDNN W8/W4 | A8: W8A8/W4A8 us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["batch"], r["layer"])):
        c = r["cudnn_us"]
        cells = []
        for bits in (8, 4):
            au = r.get(f"w{bits}_us", float("nan"))
            bu = r.get(f"w{bits}_best_us", float("nan"))
            cells.append(f"{au:.1f} ({c / au:.2f})")
            cells.append(f"{bu:.1f} ({c / bu:.2f}) {r.get(f'w{bits}_best', '')}")
        dq = [r.get(f"w{b}_times", {}).get("dequant+cudnn") for b in (8, 4)]
        a8 = [r.get(f"w{b}_times", {}).get("a8") for b in (8, 4)]
        print(f"| {r['layer']} | {r['batch']} | {r['M']} | {c:.1f} | " + " | ".join(cells) + f" | {dq[0]}/{dq[1]} "
              f"| {a8[0]}/{a8[1]} |")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["warm", "warm-resnet", "resnet", "bench", "table"])
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/conv_out"))
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--deployed", action="store_true", help="resnet: BN folded into the convs and the ReLUs that "
                    "follow conv1 / conv2 fused into their epilogues (the fp16 twin: the same folded convs, separate "
                    "ReLUs)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.cmd == "table":  # re-print the table of a bench.json
        with open(os.path.join(a.out, "bench.json")) as f:
            print_table(json.load(f))
        return
    {"warm": cmd_warm, "warm-resnet": cmd_warm_resnet, "resnet": cmd_resnet, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    main()
