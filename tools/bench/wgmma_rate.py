"""How many SM cycles one wgmma m64nNk16 (fp16 in, fp32 accumulate) costs, by N, operand source and resident
warpgroups: the question behind the small-M wgmma GEMM (its time barely changes from M = 16 to M = 64).

    PYTHONPATH=src python -m tools.bench.wgmma_rate [--out r.json]

Each warpgroup issues ROUNDS x 4 wgmmas the way gemm_wgmma.cu does (fence, 4 k16 steps, commit, wait_group 1) on a
fixed shared-memory B tile (and A tile for SS); thread 0 of each CTA records clock64 around the loop. Reported:
SM cycles per wgmma = CTA cycles / (wgmmas per SM), and the tensor-core floor 64 N 16 / 2048 FMA per SM cycle
(dense fp16 on sm_90). Modes: rs (A in registers, one accumulator: gemm_wgmma.cu's loop), rs2 (A in registers, two
accumulators alternating per round: no accumulator dependency between consecutive groups), ss (A and B in shared
memory).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile

import torch

from mixgemm.kernels.cuda import nvrtc

ROUNDS = 2048


def _asm(n: int, mode: str) -> str:
    """The wgmma inline asm of one k16 step into acc (rs: a[4] registers; ss: descriptor da)."""
    d = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(acc[{i}])' for i in range(n // 2))
    head = f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 '
    if mode == "ss":
        return head + f'{{{d}}}, %{n // 2}, %{n // 2 + 1}, p, 1, 1, 0, 0; }}" : {outs} : "l"(da), "l"(db));'
    a = ", ".join(f"%{n // 2 + i}" for i in range(4))
    ins = ", ".join(f'"r"(a[s][{i}])' for i in range(4))
    return head + f'{{{d}}}, {{{a}}}, %{n // 2 + 4}, p, 1, 1, 0; }}" : {outs} : {ins}, "l"(db));'


def source(n: int, mode: str) -> str:
    step = _asm(n, mode).replace("acc[", "ACC[")
    return f"""
typedef unsigned int u32; typedef unsigned long long u64;
__device__ __forceinline__ u64 desc_sw128(u32 addr) {{
  return (u64)((addr >> 4) & 0x3FFFu) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}}
extern "C" __global__ void wg_rate(float* out, long long* cyc, int rounds) {{
  __shared__ __align__(1024) unsigned short tile[64 * 256 + 64 * 64];
  for (int i = threadIdx.x; i < 64 * 256 + 64 * 64; i += blockDim.x) tile[i] = 0x3c00u ^ (i & 0x3ff);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  u32 sa; asm("{{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}" : "=r"(sa) : "l"(tile));
  const u64 db = desc_sw128(sa), da0 = desc_sw128(sa + 64 * 256 * 2);
  u32 a[4][4];
  for (int s = 0; s < 4; ++s) for (int i = 0; i < 4; ++i) a[s][i] = 0x3c003c00u ^ (threadIdx.x * 7 + s * 4 + i);
  float acc0[{n // 2}], acc1[{n // 2}];
  for (int i = 0; i < {n // 2}; ++i) acc0[i] = acc1[i] = 0.f;
  __syncthreads();
  long long t0 = clock64();
  for (int r = 0; r < rounds; ++r) {{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    #pragma unroll
    for (int s = 0; s < 4; ++s) {{
      const u64 da = da0 + 2 * s; (void)da;
      if ({int(mode == "rs2")} && (r & 1)) {{ {step.replace("ACC[", "acc1[")} }}
      else {{ {step.replace("ACC[", "acc0[")} }}
    }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < {n // 2}; ++i) s += acc0[i] + acc1[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}}
"""


def measure(n: int, mode: str, nwg: int, per_sm: int, sms: int) -> float | None:
    fd, path = tempfile.mkstemp(suffix=".cu")
    with os.fdopen(fd, "w") as f:
        f.write(source(n, mode))
    fn = nvrtc.get_function(path, "wg_rate", {}, torch.device("cuda"), arch_suffix="a")
    err, fit = nvrtc._driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 128 * nwg, 0)
    if int(err) != 0 or fit < per_sm:
        return None
    grid = sms * per_sm
    out = torch.empty(grid * 128 * nwg, device="cuda")
    cyc = torch.zeros(grid, dtype=torch.int64, device="cuda")
    args = [ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(cyc.data_ptr()), ctypes.c_int(ROUNDS)]
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(2):
        nvrtc.launch(fn, (grid, 1, 1), (128 * nwg, 1, 1), args, stream)
    torch.cuda.synchronize()
    wgmmas_per_sm = per_sm * nwg * ROUNDS * 4
    return float(cyc.double().median()) / wgmmas_per_sm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="16,32,64,128,256")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: SM cycles per wgmma m64nNk16 (median CTA), floor = 64 N 16 / 2048")
    print(f"{'N':>4s} {'mode':5s} {'warpgroups/SM':>14s} {'cycles':>8s} {'floor':>6s}")
    rows = []
    for n in (int(v) for v in a.ns.split(",")):
        for mode in ("rs", "rs2", "ss") if n <= 128 else ("rs", "ss"):
            for nwg, per_sm in ((1, 1), (2, 1), (2, 2), (4, 1)):
                try:
                    c = measure(n, mode, nwg, per_sm, sms)
                except RuntimeError as e:  # too many registers for this many warpgroups per SM
                    print(f"{n:4d} {mode:5s} {nwg}x{per_sm:<12d} does not fit: {str(e)[:80]}")
                    continue
                if c is None:
                    print(f"{n:4d} {mode:5s} {nwg}x{per_sm:<12d} does not fit")
                    continue
                rows.append(dict(n=n, mode=mode, warpgroups_per_sm=nwg * per_sm, ctas_per_sm=per_sm, cycles=c))
                print(f"{n:4d} {mode:5s} {nwg}x{per_sm:<12d} {c:8.1f} {64 * n * 16 / 2048:6.1f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rounds=ROUNDS, rows=rows), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
