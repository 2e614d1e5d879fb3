"""Driver of readbw_probe_s21.cu (not shipped): how fast this GPU *reads* the 117 MB int4 weight of a K = 28672,
N = 8192 layer with no math, flat grid-stride and in the GEMV's row pattern, timed by the benchmark protocol (CUDA
graph over copies > 3x L2, median), as a fraction of the copy-bandwidth floor of those bytes.

    PYTHONPATH=src python benchmarks/experiments/readbw_probe.py
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from mixgemm.bench.protocol import ceilings, copies_for, graph_time_us
from mixgemm.kernels.cuda import nvrtc

SRC = Path(__file__).with_name("readbw_probe_s21.cu").read_text()
_read = nvrtc.read_source
nvrtc.read_source = lambda name: SRC if name == "readbw_probe.cu" else _read(name)  # includes gemv_common.cuh


def main() -> None:
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    bw = ceilings(quick=True)["copy_bw"]
    n, k = 8192, 28672
    kc = k // 2 // 16  # 16-byte chunks per int4 row
    nbytes = n * kc * 16
    c = copies_for(nbytes, props.L2_cache_size)
    ws = [torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=dev) for _ in range(c)]
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    floor = nbytes / bw * 1e6
    print(f"{props.name} copy bw {bw / 1e12:.3f} TB/s; weights only: {nbytes / 1e6:.1f} MB, floor {floor:.2f} us, "
          f"C={c}")

    def timed(defs: dict, grid: int, threads: int) -> float:
        fn = nvrtc.get_function("readbw_probe.cu", "probe", defs, dev)

        def call(w):
            args = [ctypes.c_void_p(w.data_ptr()), ctypes.c_int(n), ctypes.c_int(kc), ctypes.c_void_p(out.data_ptr())]
            # the current stream at call time: graph capture runs on a side stream
            nvrtc.launch(fn, (grid, 1, 1), (threads, 1, 1), args, torch.cuda.current_stream(dev).cuda_stream)

        return graph_time_us([lambda w=w: call(w) for w in ws], 10, 60)

    for thr in (256, 512, 1024):
        for u in (1, 2, 4, 8):
            for bps in (1, 2, 4):
                if thr * bps > 2048:
                    continue
                t = timed(dict(PR_MODE=0, PR_U=u, PR_THREADS=thr, PR_MINB=bps), props.multi_processor_count * bps, thr)
                print(f"flat thr {thr:4d} U {u} bps {bps}: {t:.2f} us = {100 * floor / t:.1f}%", flush=True)
    for r in (4, 8):
        for ks in (7, 8, 14):
            for u in (1, 2):
                for minb in (1, 2):
                    defs = dict(PR_MODE=1, PR_R=r, PR_KS=ks, PR_U=u, PR_MINB=minb)
                    t = timed(defs, -(-n // r), 32 * ks)
                    print(f"gemvpat R {r} KS {ks:2d} U {u} MINB {minb}: {t:.2f} us = {100 * floor / t:.1f}%",
                          flush=True)


if __name__ == "__main__":
    main()
