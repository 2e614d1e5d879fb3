"""How fast can this GPU read a layer's weight bytes, and how close does the M = 1 GEMV come?

A no-math read probe (src/mixgemm/kernels/cuda/read_probe.cu) in several access patterns, timed as the protocol
times a GEMV (one CUDA graph of C calls over distinct copies > 3x L2, PDL launches, median per call), for the int4
sizes of model layers; beside it mixgemm.matmul at M = 1 (W4 g128 sym) on the same layer. The best probe per size is
the read ceiling of that size; `mixgemm bench` times a few of these patterns beside every decode kernel
(mixgemm.bench.read_ceiling), this tool sweeps them all.

--tiles times only the GEMV on given tiles (R,U,KS,RG,PF[,KEY=V...], e.g. 4,1,4,2,0,BULK=4,BPS=1), beside the
dispatcher's tile with PF 0 and 1.

Usage: PYTHONPATH=src python -m tools.bench.read_ceiling [--shapes 4096x4096 5120x7168 ...] [--out r.json]
       PYTHONPATH=src python -m tools.bench.read_ceiling --shapes 5120x7168 --tiles 4,1,1,8,1 2,2,4,2,0
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
from pathlib import Path

import torch

from mixgemm.bench import protocol
from mixgemm.kernels.cuda import nvrtc

PROBE = "read_probe.cu"  # beside the kernels: mixgemm bench times it too (mixgemm.bench.read_ceiling)
SHAPES = [
    "4096x4096",
    "5120x5120",
    "5120x7168",
    "4096x11008",
    "4096x14336",
    "8192x8192",
    "3584x18944",
    "5120x13824",
    "3584x28672",
    "5120x27648",
    "8192x28672",
]


def probe_configs(sms: int):
    """(label, defines, grid_for(n16, Kc), block, pdl) of the patterns tried at every size."""
    out = []
    for mode, thr, bps, u in itertools.chain(
        itertools.product([0], [512], [1, 2, 4], [2, 4, 8]), itertools.product([2], [512], [1, 2], [4, 8])
    ):
        d = dict(RC_MODE=mode, RC_THREADS=thr, RC_U=u, RC_MINB=bps, RC_WAIT=1)
        out.append(
            (f"{'flat' if mode == 0 else 'span'} t{thr} b{bps} U{u}", d, lambda n16, kc, bps=bps: sms * bps, thr, True)
        )
    for r, ks, u, minb in [
        (4, 4, 2, 1),
        (4, 8, 2, 1),
        (2, 8, 2, 2),
        (4, 8, 1, 1),
        (8, 4, 1, 1),
        (2, 16, 2, 2),
        (2, 4, 2, 1),
        (4, 16, 2, 1),
    ]:
        d = dict(RC_MODE=1, RC_R=r, RC_KS=ks, RC_U=u, RC_MINB=minb, RC_THREADS=32 * ks, RC_WAIT=1)
        out.append((f"tile R{r} KS{ks} U{u} MINB{minb}", d, lambda n16, kc, r=r: -(-(n16 // kc) // r), 32 * ks, True))
    return out


def time_probe(fn, bufs, kc, grid, block, pdl, out) -> float:
    calls = []
    for b in bufs:
        args = [
            ctypes.c_void_p(b.data_ptr()),
            ctypes.c_longlong(b.numel() * b.element_size() // 16),
            ctypes.c_int(kc),
            ctypes.c_void_p(out.data_ptr()),
        ]
        calls.append(
            lambda a=args: nvrtc.launch(
                fn, (grid, 1, 1), (block, 1, 1), a, torch.cuda.current_stream().cuda_stream, pdl=pdl
            )
        )
    return protocol.graph_time_us(calls, warmup_ms=10, rep_ms=60)


def _layer(k: int, n: int, dev) -> tuple[torch.Tensor, list]:
    """x [1, K] and the protocol's rotating copies of a W4 g128 sym K x N layer."""
    from mixgemm.formats.weight import quantize_weight

    x = torch.randn(1, k, device=dev, dtype=torch.float16)
    c = protocol.copies_for(k * n // 2, protocol.l2_bytes(dev), min_copies=2)
    qws = [quantize_weight(torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02, bits=4, group_size=128,
                           mode="sym", scale_dtype=torch.float16) for _ in range(c)]
    return x, qws


def _gemv_timer(x: torch.Tensor, qws: list):
    """(the config the dispatcher hands the CUDA-core GEMV, time(cfg) -> us of that GEMV forced on cfg)."""
    import mixgemm
    from tools.bench.kernel_choice import entry_config, gemv_options

    def time_us(cfg: dict) -> float:
        with gemv_options("simt", cfg):
            return protocol.graph_time_us([lambda q=q: mixgemm.matmul(x, q) for q in qws], warmup_ms=10, rep_ms=60)

    return entry_config(x, qws[0], "cuda_gemv"), time_us


def gemv_time(k: int, n: int, dev) -> tuple[float, str]:
    """mixgemm.matmul at M = 1 on the layer as dispatched: (us, the choice's first line)."""
    import mixgemm

    x, qws = _layer(k, n, dev)
    choice = str(mixgemm.explain(x, qws[0])).splitlines()[0]
    return protocol.graph_time_us([lambda q=q: mixgemm.matmul(x, q) for q in qws], warmup_ms=10, rep_ms=60), choice


def gemv_tiles(k: int, n: int, dev, tiles: list[str]) -> dict:
    """The CUDA-core GEMV (W4 g128 sym, M = 1) on the dispatcher's tile, that tile with PF 1, and each "R,U,KS,RG,PF"
    tile: times in us."""
    base, t = _gemv_timer(*_layer(k, n, dev))
    out = {"rule": t(base), "rule PF1": t({**base, "PF": 1})}
    for tile in tiles:
        fields = tile.split(",")
        r, u, ks, rg, pf = (int(v) for v in fields[:5])
        extra = {key: int(val) for key, val in (f.split("=") for f in fields[5:])}  # e.g. BULK=4,BPS=1
        out[tile] = t(dict(R=r, U=u, KS=ks, RG=rg, PF=pf, **extra))
    out["rule cfg"] = str(base)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="K x N layers (int4 bytes = K * N / 2)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-gemv", action="store_true")
    ap.add_argument(
        "--tiles",
        nargs="*",
        default=None,
        help="time the GEMV on these R,U,KS,RG,PF[,KEY=V...] tiles (and the rule's, with PF 0 and 1); no probe",
    )
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    bw = protocol.copy_bandwidth()
    l2 = protocol.l2_bytes(dev)
    configs = probe_configs(props.multi_processor_count)
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    rows = []
    print(f"{props.name}: copy {bw / 1e12:.3f} TB/s, {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB")
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        if args.tiles is not None:
            floor_us = k * n // 2 / bw * 1e6
            res = gemv_tiles(k, n, dev, args.tiles)
            torch.cuda.empty_cache()
            rows.append(dict(shape=shape, floor_us=floor_us, tiles=res))
            best = min((v, lb) for lb, v in res.items() if lb != "rule cfg")
            print(
                f"{shape:>11} rule {res['rule']:.2f} us {100 * floor_us / res['rule']:.0f}%, rule PF1 "
                f"{100 * floor_us / res['rule PF1']:.0f}%, best {best[1]} {100 * floor_us / best[0]:.0f}% | "
                + ", ".join(f"{lb} {100 * floor_us / v:.0f}" for lb, v in res.items() if lb != "rule cfg")
                + f" | {res['rule cfg']}",
                flush=True,
            )
            continue
        nbytes = k * n // 2
        kc = k // 32
        floor_us = nbytes / bw * 1e6
        c = protocol.copies_for(nbytes, l2, min_copies=2)
        bufs = [torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=dev) for _ in range(c)]
        res = {}
        for label, d, grid_for, block, pdl in configs:
            fn = nvrtc.get_function(PROBE, "read_probe", d, dev)
            grid = grid_for(nbytes // 16, kc)
            res[label] = time_probe(fn, bufs, kc, grid, block, pdl, out)
        best = min(res, key=res.get)
        # the best pattern again without PDL, and with no dependency wait at all
        _, d, grid_for, block, _ = next(cfg for cfg in configs if cfg[0] == best)
        fn = nvrtc.get_function(PROBE, "read_probe", d, dev)
        res[best + " no-PDL"] = time_probe(fn, bufs, kc, grid_for(nbytes // 16, kc), block, False, out)
        fn2 = nvrtc.get_function(PROBE, "read_probe", dict(d, RC_WAIT=2), dev)
        res[best + " no-wait"] = time_probe(fn2, bufs, kc, grid_for(nbytes // 16, kc), block, True, out)
        del bufs
        torch.cuda.empty_cache()
        row = dict(
            shape=shape,
            mib=nbytes / 2**20,
            floor_us=floor_us,
            probes=res,
            best=best,
            best_pct=100 * floor_us / res[best],
        )
        tile_best = min((v, lb) for lb, v in res.items() if lb.startswith("tile") and "no-" not in lb)
        row["tile_best"], row["tile_best_pct"] = tile_best[1], 100 * floor_us / tile_best[0]
        if not args.no_gemv:
            import mixgemm

            t, choice = gemv_time(k, n, dev)
            with mixgemm.kernel_options(pdl=False):
                t_nopdl, _ = gemv_time(k, n, dev)
            torch.cuda.empty_cache()
            row.update(gemv_us=t, gemv_pct=100 * floor_us / t, gemv_choice=choice, gemv_nopdl_us=t_nopdl)
        rows.append(row)
        print(
            f"{shape:>11} {nbytes / 2**20:6.1f} MiB floor {floor_us:6.2f} us | best read {res[best]:6.2f} us "
            f"{row['best_pct']:5.1f}% ({best}; no-PDL {100 * floor_us / res[best + ' no-PDL']:.1f}%, no-wait "
            f"{100 * floor_us / res[best + ' no-wait']:.1f}%) | tile-pattern best {row['tile_best_pct']:5.1f}% "
            f"({tile_best[1]})"
            + (
                f" | GEMV {row['gemv_us']:6.2f} us {row['gemv_pct']:5.1f}% (no-PDL {row['gemv_nopdl_us']:.2f} us)"
                f" [{row['gemv_choice'][:90]}]"
                if not args.no_gemv
                else ""
            ),
            flush=True,
        )
    if args.tiles is None:
        print("median best read % of copy floor:", statistics.median(r["best_pct"] for r in rows))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=props.name, copy_bw=bw, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
