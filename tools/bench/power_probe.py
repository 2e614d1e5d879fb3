"""Sustained power draw and SM clock of the acceptance kernels on the H100 / H200: each method replays a
CUDA graph of C layer copies (the benchmark protocol's graph) for SECONDS seconds while nvidia-smi samples the SM
clock and the board power every 100 ms; prints per method the time per call, the mean clock and power of the samples
inside its window, and the energy per call. Why: the acceptance rows run at the 700 W cap, where the clock moves
between 1.1 and 1.9 GHz, so the ratio to fp16 cuBLAS is set by energy per call as much as by cycles.

Usage: PYTHONPATH=src python -m tools.bench.power_probe [--shape 28672x8192] [--m 2048] [--seconds 3]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F

from mixgemm.bench.protocol import capture_graph
from mixgemm.kernels.triton_a8.layout import get_int8_layout
from tools.bench.int8 import a8_runner, clone_qw, copies_for, lay_bytes, make_weight, w8_cuda_options


def run_for(g, calls_per_replay, seconds):
    """Replays g back to back for about `seconds`; returns (t0, t1, us per call)."""
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    per = max(time.perf_counter() - t, 1e-4)
    n = max(1, int(seconds / per))
    t0 = datetime.datetime.now()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    t1 = datetime.datetime.now()
    return t0, t1, e0.elapsed_time(e1) * 1e3 / (n * calls_per_replay)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="28672x8192")
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    m = args.m
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    methods = {}
    # the dispatcher's choice for each, and int8 per-channel on the CUDA wgmma kernel (the dispatcher hands it to the
    # Triton kernel from mixgemm.tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M; tools.bench.int8.w8_cuda_options)
    for name, bits, group, act_block, w8_cuda in (("W4A8 g128 per-token", 4, 128, "token", False),
                                                  ("W4A8 g128 int scales, per-token", 4, 128, "token", False),
                                                  ("W8A8 per-channel", 8, -1, "group", False),
                                                  ("W8A8 per-channel, CUDA kernel", 8, -1, "group", True),
                                                  ("W4A8 g128 per-group act", 4, 128, "group", False)):
        # "int scales" (formats/int_scales.py): the int8 wgmma GEMM runs without the per-group fold
        qw = make_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02, bits, group,
                         int_scales="int scales" in name)
        c = copies_for(lay_bytes(get_int8_layout(qw)))
        qws = [qw] + [clone_qw(qw) for _ in range(c - 1)]
        options = w8_cuda_options(bits, group, m) if w8_cuda else None
        runs = [a8_runner(x, q, "sym", options, act_block=act_block) for q in qws]
        methods[name] = (runs, c)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
    methods["fp16 cuBLAS"] = ([lambda w=w: F.linear(x, w) for w in ws], len(ws))
    xi = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    wi = [torch.randint(-127, 128, (k, n), dtype=torch.int8, device="cuda").t().contiguous().t() for _ in range(3)]
    methods["torch._int_mm"] = ([lambda w=w: torch._int_mm(xi, w) for w in wi], len(wi))
    graphs = {name: (capture_graph(fns), c) for name, (fns, c) in methods.items()}
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; {k}x{n} M = {m}, "
          f"{args.seconds} s per window")
    print_rows(probe(graphs, args.seconds), 2 * m * n * k)


def probe(graphs: dict, seconds: float, rounds: int = 2) -> list[tuple]:
    """Replays each (graph, calls per replay) of `graphs` for `seconds`, `rounds` times in turn, while nvidia-smi
    samples every 100 ms; returns (name, round, us per call, mean SM MHz, mean W) per window, the means over the
    samples after the window's first 0.5 s (the power controller takes that long to settle)."""
    windows = {}
    with tempfile.NamedTemporaryFile("w+", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                                "--format=csv,noheader,nounits", "-lms", "100"], stdout=log, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            for rnd in range(rounds):
                for name, (g, c) in graphs.items():
                    windows[(rnd, name)] = run_for(g, c, seconds)
                    time.sleep(0.5)
        finally:
            smi.terminate()
            smi.wait()
        log.seek(0)
        lines = log.read().splitlines()
    samples = []
    for line in lines:
        p = [v.strip() for v in line.split(",")]
        try:
            samples.append((datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f"), float(p[1]), float(p[2])))
        except (ValueError, IndexError):
            continue
    rows = []
    for (rnd, name), (t0, t1, us) in windows.items():
        inside = [s for s in samples if t0 + datetime.timedelta(seconds=0.5) <= s[0] <= t1]
        mhz = statistics.mean(s[1] for s in inside) if inside else float("nan")
        w = statistics.mean(s[2] for s in inside) if inside else float("nan")
        rows.append((name, rnd, us, mhz, w))
    return rows


def print_rows(rows: list[tuple], ops: float) -> None:
    """One line per probe() window: time, clock, power, energy per call and the rate of `ops` operations per call."""
    width = max(26, *(len(r[0]) for r in rows))
    print(f"{'method':>{width}} {'round':>5} {'us/call':>9} {'MHz':>6} {'W':>6} {'mJ/call':>8} {'TOP/s':>7}")
    for name, rnd, us, mhz, w in rows:
        print(f"{name:>{width}} {rnd:>5} {us:9.1f} {mhz:6.0f} {w:6.0f} {w * us * 1e-3:8.1f} {ops / us / 1e6:7.0f}",
              flush=True)


if __name__ == "__main__":
    main()
