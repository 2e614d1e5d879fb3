"""The wgmma GEMM against fp16 cuBLAS and the Triton GEMM, benchmark protocol (CUDA graph over C weight copies
exceeding 3x L2, median / C), plus a layout diagnostic that shows where a wrong result comes from.

    PYTHONPATH=src python -m tools.bench.wgmma --diag                 # one-hot check of the fragment mapping
    PYTHONPATH=src python -m tools.bench.wgmma --out r.json [--quick] # timing table (W4 g128, W8 per-channel)
    PYTHONPATH=src python -m tools.bench.wgmma --sweep --ms 32,64 --shapes 8192x28672
    PYTHONPATH=src python -m tools.bench.wgmma --table --grid --ms 256,1024 --shapes 4096x6144 --out r.json
    PYTHONPATH=src python -m tools.bench.wgmma --table --bm-grid 256,240,224,208,192,176,160,144,128 --no-triton \
        --ms 1024,2048,4096 --shapes 3072x3072 --out r.json            # token tiles (tools/bench/wgmma_token_fit.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from mixgemm.bench.protocol import ceilings, copies_for, graph_time_us
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import default_config, gemm_wgmma
from mixgemm.kernels.triton_gemm.gemm import gemm as triton_gemm
from mixgemm.reference.matmul import matmul as ref_matmul
from tools.bench.kernel_choice import entry_config
from tools.bench.launch_spy import prepared_launches

INF = float("inf")
DEV = "cuda"


def diag() -> bool:
    """x = identity rows, so out[m, n] = Wdeq[n, m]: prints where each wrong output value really lives."""
    ok = True
    for bits in (4, 8):
        n = k = 64
        qw = quantize_weight(torch.randn(n, k, device=DEV) * 0.02, bits=bits, group_size=64, mode="sym")
        from mixgemm.formats.weight import dequantize_weight

        wd = dequantize_weight(qw).float()  # [n, k]
        x = torch.eye(64, k, device=DEV, dtype=torch.float16)
        y = gemm_wgmma(x, qw, None, -INF, INF, dict(BM=64, NWG=1, STAGES=3, SPLIT=1)).float()
        want = wd.t()[:64]  # [m, n]
        bad = ((y - want).abs() > 1e-3 * want.abs().max()).nonzero()
        print(f"diag bits={bits}: {len(bad)} of {y.numel()} wrong")
        if len(bad):
            ok = False
            for m, nn in bad[:12].tolist():
                v = y[m, nn]
                idx = (wd - v).abs().argmin()
                print(f"  out[m={m}, n={nn}] = {v:.5f}: want W[{nn}, {m}] = {want[m, nn]:.5f}; "
                      f"value found at W[{int(idx) // k}, {int(idx) % k}]")
    return ok


def fp16_us(n, k, x) -> float:
    c = copies_for(n * k * 2, torch.cuda.get_device_properties(0).L2_cache_size)
    ws = [torch.randn(n, k, device=DEV, dtype=torch.float16) * 0.02 for _ in range(c)]
    t = graph_time_us([lambda w=w: F.linear(x, w) for w in ws], warmup_ms=10, rep_ms=60)
    del ws
    return t


def weights(n, k, bits, gs):
    nbytes = n * k * bits // 8
    c = copies_for(nbytes, torch.cuda.get_device_properties(0).L2_cache_size)
    mode = "zero_point" if bits == 4 else "sym"  # the protocol's formats: W4 g128 asymmetric, W8 per-channel sym
    return [quantize_weight(torch.randn(n, k, device=DEV) * 0.02, bits=bits, group_size=gs, mode=mode)
            for _ in range(c)]


def err_of(y, x, qw) -> float:
    r = ref_matmul(x[:64], qw, None, None, out_dtype=torch.float64)
    return float((y[:64].double() - r).norm() / r.norm())


def candidates(m: int, sms: int) -> list[dict]:
    if m <= 64:
        bm = -(-m // 8) * 8
        base = [(1, 8, 1), (2, 12, 1), (4, 8, 1), (2, 6, 2), (4, 8, 2)]
        return [dict(BM=bm, NWG=nwg, STAGES=st, INFLIGHT=d, SPLIT=s, GROUP_M=1) for nwg, st, d in base
                for s in (1, 2)]
    tiles = [(128, 4, 4, 1), (256, 2, 4, 1), (256, 2, 5, 2)]
    return [dict(BM=bm, NWG=nwg, STAGES=st, INFLIGHT=d, SPLIT=1, GROUP_M=8) for bm, nwg, st, d in tiles]


# --grid: tile shapes (the table's per-M tiles) times cluster split-K factors, each timed beside the table config, to
# see how the tile and the split should follow the wave count (few output tiles, a partial last wave)
GRID_TILES = (
    dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, TMA=1, GROUP_M=8),
    dict(BM=128, NWG=4, STAGES=4, INFLIGHT=1, TMA=1, KT=2, GROUP_M=8),
    dict(BM=128, NWG=2, STAGES=4, INFLIGHT=1, TMA=1, KT=2, GROUP_M=8),
    dict(BM=64, NWG=2, STAGES=4, INFLIGHT=1, TMA=1, KT=2, GROUP_M=1),
    dict(BM=64, NWG=1, STAGES=4, INFLIGHT=1, TMA=1, KT=2, GROUP_M=1),
)
GRID_SPLITS = (1, 2, 3, 4)


def grid_configs() -> list[dict]:
    out = []
    for tile in GRID_TILES:
        for s in GRID_SPLITS:
            out.append({**tile, "SPLIT": s, "CLUSTER": int(s > 1), "FIT": 1})
    return out


def token_grid(bms: list[int]) -> list[dict]:
    """--bm-grid: the BM 256 tile's pipeline (GRID_TILES[0]) at each BM, one launch (split 1, no TAIL, no SK)."""
    return [{**GRID_TILES[0], "BM": bm, "SPLIT": 1, "CLUSTER": 0, "TAIL": 0, "SK": 0, "FIT": 1} for bm in bms]


def cluster_slots() -> dict:
    """{split: clusters of that many CTAs the GPU holds at once} for each GRID_TILES tile (cuOccupancyMaxActiveClusters
    of the launch the GEMM prepares): the wave size of a cluster split-K launch, which the GPCs' SM counts make
    smaller than SMs / split."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import prepare_wgmma

    qw = quantize_weight(torch.randn(4096, 4096, device=DEV) * 0.02, bits=4, group_size=128, mode="zero_point")
    out = {}
    with prepared_launches() as seen:
        for tile in GRID_TILES:
            slots = {}
            for s in GRID_SPLITS[1:]:
                seen.clear()
                prepare_wgmma(qw, 512, torch.float16, torch.device(DEV), {**tile, "SPLIT": s, "CLUSTER": 1}, True)
                slots[str(s)] = next(v for v in seen if v.cluster).clusters_at_once()
            out[f"BM {tile['BM']} NWG {tile['NWG']}"] = slots
    return out


def occupancy(cfgs: list[dict], formats: list[str], m: int) -> list[dict]:
    """Per config and weight format, what the launch the GEMM prepares for M = m gets on this GPU: registers per
    thread, CTAs per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor) and, for a cluster split, the clusters held at
    once (cuOccupancyMaxActiveClusters): the residency a wave count of small-M tiles needs."""
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import prepare_wgmma

    out = []
    with prepared_launches() as seen:
        for fmt in formats:
            bits, gs = int(fmt[1]), (-1 if fmt.endswith("pc") else int(fmt[3:]))
            qw = quantize_weight(torch.randn(4096, 4096, device=DEV) * 0.02, bits=bits, group_size=gs,
                                 mode="zero_point" if bits == 4 else "sym")
            for cfg in cfgs:
                seen.clear()
                prepare_wgmma(qw, m, torch.float16, torch.device(DEV), cfg, True)
                ln = seen[0]
                row = dict(fmt=fmt, cfg=cfg, regs=nvrtc.num_registers(ln.fn), threads=ln.threads,
                           smem=ln.shared_bytes, ctas_per_sm=nvrtc.resident_blocks(ln.fn, ln.threads, ln.shared_bytes))
                if ln.cluster:
                    row["clusters"] = ln.clusters_at_once()
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--diag", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="time every candidate config (else default + a few)")
    ap.add_argument("--ms", default="32,64,256,1024,4096,16384")
    ap.add_argument("--shapes", default="8192x28672,4096x14336", help="KxN list")
    ap.add_argument("--formats", default="w4g128,w8pc")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton GEMM column (slow at large M)")
    ap.add_argument("--table", action="store_true", help="time the config the dispatcher hands the wgmma GEMM (its "
                    "per-GPU table in mixgemm.tuning, else the kernel's default)")
    ap.add_argument("--cfgs", default=None, help="JSON list of configs to time instead of the candidates (keys M, "
                    "FMT, SHAPE select the cases a config is timed on)")
    ap.add_argument("--variants", default=None, help="with --table: JSON list of overrides, each timed as the table "
                    "config updated with it (keys M, FMT, SHAPE select the cases, as in --cfgs)")
    ap.add_argument("--bm-grid", default=None, help="with --table: also time the BM 256 tile's pipeline at these BM "
                    "(comma list), split 1, no TAIL: the token tiles' sweep (tools/bench/wgmma_token_fit.py)")
    ap.add_argument("--grid", action="store_true", help="with --table: also time GRID_TILES x GRID_SPLITS (cluster "
                    "split-K) on every case; every config's time goes to --out")
    ap.add_argument("--cluster-slots", action="store_true", help="print the clusters of each split the GPU holds "
                    "at once, per grid tile (with --grid the run's JSON keeps the first tile's)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of (fp16 cuBLAS, every config) timed in turn; "
                    "the medians are reported (cuBLAS moves by up to 15%% between timings in one run)")
    ap.add_argument("--occupancy", default=None, help="JSON list of configs: print each one's registers, CTAs per SM "
                    "and clusters held at once (per --formats, at the first of --ms) and exit")
    ap.add_argument("--launch", default=None, help="M,K,N,CFG_JSON: just launch that case 5 times (for ncu)")
    a = ap.parse_args(argv)
    if a.launch:
        m, k, n, cfg = a.launch.split(",", 3)
        q = quantize_weight(torch.randn(int(n), int(k), device=DEV) * 0.02, bits=4, group_size=128, mode="sym")
        x = torch.randn(int(m), int(k), device=DEV, dtype=torch.float16)
        for _ in range(5):
            gemm_wgmma(x, q, None, -INF, INF, json.loads(cfg))
        torch.cuda.synchronize()
        return 0
    if a.diag:
        return 0 if diag() else 1
    if a.occupancy:
        rows = occupancy(json.loads(a.occupancy), a.formats.split(","), int(a.ms.split(",")[0]))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rows, f)
        return 0
    slots = cluster_slots() if a.cluster_slots or a.grid else None
    if slots:
        print("cluster slots (clusters of each split held at once):", json.dumps(slots), flush=True)
        if a.cluster_slots and not a.table:
            return 0
    props = torch.cuda.get_device_properties(0)
    ceil = ceilings(quick=True)
    print(f"ceilings: copy {ceil['copy_bw'] / 1e12:.2f} TB/s, fp16 matmul {ceil['fp16_flops'] / 1e12:.0f} TFLOP/s")
    rows = []
    print(f"{'fmt':7s} {'KxN':11s} {'M':>6s} {'cuBLAS':>9s} {'triton':>9s} {'wgmma':>9s} {'x cuBLAS':>8s} "
          f"{'x triton':>8s} err  %floor config", flush=True)
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for fmt in a.formats.split(","):
            bits, gs = int(fmt[1]), (-1 if fmt.endswith("pc") else int(fmt[3:]))  # w4g128, w8pc, w4pc, w8g128
            qws = weights(n, k, bits, gs)
            for m in (int(v) for v in a.ms.split(",")):
                x = torch.randn(m, k, device=DEV, dtype=torch.float16)
                t16s = [fp16_us(n, k, x)]
                # the Triton GEMM with the config the dispatcher hands it (called without one it uses its own rule)
                tcfg = None if a.no_triton else entry_config(x, qws[0], "triton_gemm")
                tt = INF if a.no_triton else graph_time_us(
                    [lambda q=q, x=x, c=tcfg: triton_gemm(x, q, None, -INF, INF, c) for q in qws], 10, 60)
                tg = None  # the CUDA GEMV at the same M: the dispatcher's GEMV / GEMM crossover
                if m <= 16:
                    from mixgemm.kernels.cuda.gemv_direct import gemv

                    tg = graph_time_us([lambda q=q, x=x: gemv(x, q, None, -INF, INF) for q in qws], 10, 60)
                cfgs = candidates(m, props.multi_processor_count) if a.sweep else [default_config(m, n, k)]
                if a.table:  # (forced: at small M the dispatcher itself may pick a GEMV)
                    cfgs = [dict(entry_config(x, qws[0], "cuda_wgmma"), FIT=1)]
                    for v in json.loads(a.variants or "[]"):
                        if v.get("M", m) == m and v.get("FMT", fmt) == fmt and v.get("SHAPE", shape) == shape:
                            cfgs.append({**cfgs[0], **{c: w for c, w in v.items() if c not in ("M", "FMT", "SHAPE")}})
                    if a.bm_grid:
                        cfgs += token_grid([int(b) for b in a.bm_grid.split(",")])
                    if a.grid:
                        cfgs += grid_configs()
                if a.cfgs:
                    cfgs = [{key: w for key, w in c.items() if key not in ("M", "FMT", "SHAPE")}
                            for c in json.loads(a.cfgs)  # optional filters: M, FMT (w4g128...), SHAPE (KxN)
                            if c.get("M", m) == m and c.get("FMT", fmt) == fmt and c.get("SHAPE", shape) == shape]
                best = None
                timed = {}  # config index -> (times, err); --repeat: rounds of cuBLAS then every config, medians
                for rnd in range(a.repeat):
                    if rnd:
                        t16s.append(fp16_us(n, k, x))
                    for i, cfg in enumerate(cfgs):
                        if rnd and i not in timed:
                            continue  # failed in the first round
                        fit = bool(cfg.get("FIT", 0))
                        try:
                            if not rnd:  # checked once against the reference; later rounds only time it
                                timed[i] = ([], err_of(gemm_wgmma(x, qws[0], None, -INF, INF, cfg, fit=fit), x, qws[0]))
                            timed[i][0].append(graph_time_us(
                                [lambda q=q, c=cfg, x=x, f=fit: gemm_wgmma(x, q, None, -INF, INF, c, fit=f)
                                 for q in qws], 10, 60))
                        except Exception as ex:  # noqa: BLE001 - report and go on
                            print(f"  {cfg}: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
                            timed.pop(i, None)
                t16 = statistics.median(t16s)
                for i, (ts, e) in sorted(timed.items()):
                    t, cfg = statistics.median(ts), cfgs[i]
                    if a.sweep or a.variants or a.cfgs or a.grid or a.bm_grid:
                        fmt_ts = lambda v: " / ".join(f"{u:.1f}" for u in v)  # noqa: E731
                        runs = f" (rounds {fmt_ts(ts)}, cuBLAS {fmt_ts(t16s)})"
                        print(f"  {fmt} {shape} M={m} {cfg}: {t:.1f} us err {e:.1e}"
                              + (runs if a.repeat > 1 else ""), flush=True)
                    if e < 2e-3 and (best is None or t < best[0]):
                        best = (t, cfg, e, ts)
                if best is None:
                    print(f"{fmt:7s} {shape:11s} {m:6d} no valid wgmma config", flush=True)
                    continue
                t, cfg, e, t_rounds = best
                groups = 1 if gs == -1 else k // gs  # fp16 scale (+ fp16 zero for the W4 zero_point format)
                nbytes = n * k * bits / 8 + n * groups * (4 if bits == 4 else 2) + 2 * m * (k + n)
                floor_us = max(nbytes / ceil["copy_bw"], 2 * m * n * k / ceil["fp16_flops"]) * 1e6
                rows.append(dict(fmt=fmt, shape=shape, m=m, cublas_us=t16, triton_us=tt, wgmma_us=t, cfg=cfg, err=e,
                                 floor_us=floor_us, gemv_us=tg, cublas_rounds=t16s, wgmma_rounds=t_rounds,
                                 all=[dict(cfg=cfgs[i], us=statistics.median(ts), err=er)
                                      for i, (ts, er) in sorted(timed.items())]))
                print(f"{fmt:7s} {shape:11s} {m:6d} {t16:9.1f} {tt:9.1f} {t:9.1f} {t16 / t:8.2f} {tt / t:8.2f} "
                      f"{e:.0e} {100 * floor_us / t:4.0f}% {cfg}" + (f" gemv {tg:.1f}" if tg else ""), flush=True)
            del qws
            torch.cuda.empty_cache()
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G

    if G._warned:
        print("WARNING: TMA unavailable, cp.async loader used:", G._warned[0])
    if a.out:
        with open(a.out, "w") as f:
            import triton

            json.dump(dict(gpu=props.name, torch=torch.__version__, triton=triton.__version__, ceilings=ceil,
                           sms=props.multi_processor_count,
                           cluster_slots=next(iter(slots.values())) if slots else None, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
