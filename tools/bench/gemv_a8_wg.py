"""The fused activation-quantizing GEMV on the int8 GEMM's layout (registry entry cuda_gemv_a8_wg, the decode kernel
of a compacted W8A8 / W4A8 weight) beside what a plain weight runs and what a compacted one ran before it (the CUDA
int8 GEMM), with a tile sweep; benchmark protocol (CUDA graph over C layer copies > 3x L2, median / C), activation
quantization inside every time.

    PYTHONPATH=src python -m tools.bench.gemv_a8_wg                       # default layers, M 1 2 4 16
    PYTHONPATH=src python -m tools.bench.gemv_a8_wg --shapes 4096x4096 --ms 1 --no-sweep

Columns: plain = the dispatch on the plain weight without this entry (what it ran before: cuda_gemv_a8 at M <=
tuning.A8_GEMV_MAX_M, then the int8 GEMMs); now = the plain weight's dispatch as it is (this entry from that M on
sm_90); gemm = the compacted weight with cuda_gemv_a8_wg disabled; wg = the compacted weight forced onto
cuda_gemv_a8_wg with its rule's tile (gemv_a8_wg.choose_config); best = the fastest tile of the sweep. Floor = (weight
bytes + fp16 x and y) / measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import mixgemm
from mixgemm.bench.protocol import graph_time_us
from mixgemm.formats.int_scales import quantize_weight_int_scales
from mixgemm.formats.weight import compact_placeholder, quantize_weight
from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg as gw
from mixgemm.ops.custom_ops import compact_weight
from mixgemm.ops.int8 import make_a8_runner
from tools.bench.gemv_a8 import err_of
from tools.bench.int8 import clone_qw, copies_for, copy_bandwidth

ENTRY = "cuda_gemv_a8_wg"
SHAPES = ["2048x2048", "4096x4096", "4096x14336", "14336x4096", "3584x18944", "5120x5120", "8192x28672", "28672x8192"]
# (name, bits, group, act_block, integer group scales)
FORMATS = [("W4A8 g128", 4, 128, "group", False), ("W4A8 g128 token int", 4, 128, "token", True),
           ("W8A8 per-channel", 8, -1, "group", False)]


def sweep_configs(rule: dict, m: int) -> list[dict]:
    """The rule's tile and its neighbours: RT x2 / /2, KS x2 / /2 (blocks of 8 warps or KS), the other U and PF."""
    ks, rt = rule["KS"], rule["RT"]

    def cfg(**kw):
        c = {**rule, **kw}
        c["RG"] = max(1, max(8, c["KS"]) // c["KS"]) if "RG" not in kw else c["RG"]
        return c

    out = [dict(rule)]
    for c in (cfg(RT=rt * 2) if rt < 4 else None, cfg(RT=rt // 2) if rt > 1 else None,
              cfg(KS=ks * 2) if ks < 16 else None, cfg(KS=ks // 2) if ks > 1 else None,
              cfg(U=3 - rule["U"]) if m <= 2 else None, cfg(PF=1 - rule["PF"]) if m <= 2 else None,
              cfg(RT=max(1, rt // 2), KS=min(16, ks * 2)) if m <= 2 else None):
        if c is not None and c not in out and c["RG"] * c["KS"] <= gw.MAX_WARPS:
            out.append(c)
    return out


def grid_configs(rule: dict, bits: int) -> list[dict]:
    """The rule's tile, then the (RT, U, KS, PF) grid at M <= 2: RT 1, 2 (and 4 for int4), U 1 / 2, KS 4 / 8 / 16 in
    blocks of 8 warps (or KS), PF on / off."""
    out = [dict(rule)]
    for rt in ((1, 2, 4) if bits == 4 else (1, 2)):
        for u in (1, 2):
            for ks in (4, 8, 16):
                for pf in (0, 1):
                    c = {**rule, "RT": rt, "U": u, "KS": ks, "RG": max(1, 8 // ks), "PF": pf}
                    if c not in out:
                        out.append(c)
    return out


def _weights(k, n, bits, group, int_scales, copies):
    torch.manual_seed(k + n + bits)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    qw0 = (quantize_weight_int_scales(w, group_size=group, scale_dtype=torch.float16) if int_scales
           else quantize_weight(w, bits=bits, group_size=group, mode="sym", scale_dtype=torch.float16))
    del w
    plain = [qw0] + [clone_qw(qw0) for _ in range(copies - 1)]
    compact = [compact_weight(clone_qw(q), compact_placeholder(q.qweight), "wgmma_a8_v1") for q in plain]
    return plain, compact


def time_a8_calls(x, qws, block, opts, rep):
    """(us per call, the output) of whole int8-activation calls (quantizer + kernel) over the layer copies qws, under
    kernel_options(**opts), protocol graph timing."""
    with mixgemm.kernel_options(**opts):
        runs = [make_a8_runner(x, q, "sym", act_block=block) for q in qws]
        y = runs[0]()
        return graph_time_us(runs, warmup_ms=10, rep_ms=rep), y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES), help="K x N list")
    ap.add_argument("--ms", default="1,2,4,16")
    ap.add_argument("--formats", default=",".join(f[0] for f in FORMATS))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--grid", action="store_true", help="at M <= 2 the whole (RT, U, KS, PF) grid (grid_configs)")
    ap.add_argument("--mma", default="0", help="A8_MMA values each tile is timed with (0 dp4a, 1 tensor cores), e.g. "
                    "0,1")
    ap.add_argument("--json", default=None, help="also write every timed config here")
    args = ap.parse_args()
    dump = []
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"GPU {props.name}, {props.multi_processor_count} SMs, copy {bw / 1e12:.2f} TB/s, torch {torch.__version__}",
          flush=True)
    fmts = [f for f in FORMATS if f[0] in args.formats.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for name, bits, group, block, int_scales in fmts:
            plain, compact = _weights(k, n, bits, group, int_scales, copies_for(n * k * bits // 8))
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                t_plain, _ = time_a8_calls(x, plain, block, {"disable": ENTRY}, args.rep)
                t_now, _ = time_a8_calls(x, plain, block, {}, args.rep)
                t_gemm, _ = time_a8_calls(x, compact, block, {"disable": ENTRY}, args.rep)
                per_token = block == "token" or group == -1  # (as the registry's Problem.per_token)
                rule = gw.choose_config(gw.m_bucket(m), n, -(-k // 128), props.multi_processor_count, bits,
                                        per_token)
                if args.no_sweep:
                    cfgs = [rule]
                else:
                    cfgs = grid_configs(rule, bits) if args.grid and m <= 2 else sweep_configs(rule, m)
                mma = [int(v) for v in args.mma.split(",")]
                cfgs = [c if v == c.get("MMA", 0) else {**c, "MMA": v} for c in cfgs for v in mma]
                cfgs = [c for i, c in enumerate(cfgs) if c not in cfgs[:i]]
                res = []
                for cfg in cfgs:
                    try:
                        t, y = time_a8_calls(x, compact, block, {"force": ENTRY, "configs": {ENTRY: cfg}}, args.rep)
                    except Exception as ex:  # noqa: BLE001  (a tile that does not launch: report, go on)
                        print(f"  {shape} M{m} {name} {cfg}: {type(ex).__name__}: {ex}", flush=True)
                        continue
                    err = err_of(x, plain[0], "sym", y, block=block)
                    res.append((t, cfg, err))
                    print(f"  {shape:>11} M{m:<2} {name:>20} {cfg}: {t:7.2f} us err {err:.1e}", flush=True)
                dump.append({"K": k, "N": n, "format": name, "M": m, "plain": t_plain, "now": t_now, "gemm": t_gemm,
                             "rule": rule, "res": [{"cfg": c, "us": t} for t, c, _ in res]})
                if not res:
                    continue
                t_wg, _, err_wg = res[0]
                t_best, best, _ = min(res, key=lambda r: r[0])
                floor = (n * k * bits / 8 + n * math.ceil(k / (k if group == -1 else group)) * 4 + 2 * m * (k + n)) / bw
                rows.append((shape, m, name, t_plain, t_gemm, t_wg, t_best, best, floor * 1e6, err_wg, t_now))
                print(f"{shape:>11} M{m:<2} {name:>20} plain {t_plain:7.2f} now {t_now:7.2f} gemm {t_gemm:7.2f} "
                      f"wg {t_wg:7.2f} "
                      f"({t_wg / t_plain:.2f}x plain, {t_wg / t_gemm:.2f}x gemm, {100 * floor * 1e6 / t_wg:.0f}% "
                      f"floor) best {t_best:7.2f} {best}", flush=True)
            del plain, compact
            torch.cuda.empty_cache()
    print("\n== table (us; ratios: wg / plain, wg / gemm, now / plain) ==")
    print(f"{'KxN':>11} {'M':>3} {'format':>20} {'plain':>7} {'now':>7} {'gemm':>7} {'wg':>7} {'/plain':>6} "
          f"{'/gemm':>6} {'now/pl':>6} {'%floor':>6} {'best':>7} err")
    for shape, m, name, tp, tg, tw, tb, best, fl, err, tn in rows:
        print(f"{shape:>11} {m:>3} {name:>20} {tp:7.2f} {tn:7.2f} {tg:7.2f} {tw:7.2f} {tw / tp:6.2f} {tw / tg:6.2f} "
              f"{tn / tp:6.2f} {100 * fl / tw:5.0f}% {tb:7.2f} {err:.1e} {best if tb < tw * 0.97 else ''}")
    for m in ms:
        sel = [r for r in rows if r[1] == m]
        if sel:
            gp = math.exp(sum(math.log(r[5] / r[3]) for r in sel) / len(sel))
            gg = math.exp(sum(math.log(r[5] / r[4]) for r in sel) / len(sel))
            gb = math.exp(sum(math.log(r[6] / r[5]) for r in sel) / len(sel))
            gn = math.exp(sum(math.log(r[10] / r[3]) for r in sel) / len(sel))
            print(f"M = {m}: geomean wg / plain {gp:.3f}, wg / gemm {gg:.3f}, best tile / rule {gb:.3f}, plain now / "
                  f"before {gn:.3f} ({len(sel)} cases)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": props.name, "res": dump}, f)


if __name__ == "__main__":
    main()
