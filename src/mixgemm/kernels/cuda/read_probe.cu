// No-math read probe: how fast can the GPU read a layer's weight bytes, timed as a GEMV is (CUDA graph over rotating
// copies), in a given access pattern? Not a kernel of any op: `mixgemm bench` times it beside the decode kernels as
// their read ceiling (mixgemm.bench.read_ceiling), tools/bench/read_ceiling.py sweeps its patterns.
//   RC_MODE 0: persistent flat grid-stride, each thread RC_U 16-byte loads per step
//   RC_MODE 1: the GEMV's tile pattern, one block per RC_R rows, RC_KS warps interleaving 32-chunk slices
//   RC_MODE 2: persistent, each block streams one contiguous span (the bytes split evenly over the grid)
//   RC_WAIT 0: griddepcontrol.wait first (a kernel that reads nothing before its dependency)
//           1: after the first step's loads (the GEMV today)  2: never (no dependency at all: the upper bound)
#include "gemv_common.cuh"
#ifndef RC_MODE
#define RC_MODE 0
#endif
#ifndef RC_R
#define RC_R 4
#endif
#ifndef RC_KS
#define RC_KS 8
#endif
#ifndef RC_U
#define RC_U 2
#endif
#ifndef RC_MINB
#define RC_MINB 1
#endif
#ifndef RC_THREADS
#define RC_THREADS 256
#endif
#ifndef RC_WAIT
#define RC_WAIT 1
#endif
using namespace mg;

extern "C" __global__ void __launch_bounds__(RC_THREADS, RC_MINB)
read_probe(const uint4* __restrict__ W, long long n16, int Kc, unsigned* out) {
  constexpr int U = RC_U;
  unsigned acc = 0;
  pdl_launch_dependents();
  if (RC_WAIT == 0) pdl_wait();
  bool waited = RC_WAIT != 1;
  auto fold = [&](const uint4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    if (!waited) { pdl_wait(); waited = true; }
  };
#if RC_MODE == 0 || RC_MODE == 2
#if RC_MODE == 0
  long long i = (long long)blockIdx.x * RC_THREADS * U + threadIdx.x;
  const long long stride = (long long)gridDim.x * RC_THREADS * U, end = n16;
#else
  const long long span = (n16 + gridDim.x - 1) / gridDim.x;
  long long i = span * blockIdx.x + threadIdx.x;
  const long long stride = (long long)RC_THREADS * U, end = min(n16, span * (blockIdx.x + 1));
#endif
  for (; i + (U - 1) * RC_THREADS < end; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(W + i + u * RC_THREADS);
    fold(v);
  }
  for (; i < end; i += RC_THREADS) {
    uint4 v[U] = {};
    v[0] = ld_stream(W + i);
    fold(v);
  }
#else
  constexpr int R = RC_R, STRIDE = RC_KS * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long N = n16 / Kc;
  const long long row0 = (long long)blockIdx.x * R;
  int c0 = warp * 32 + lane;
  for (; c0 + (U - 1) * STRIDE < Kc; c0 += U * STRIDE) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      v[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 t = ld_stream(W + min(row0 + r, N - 1) * Kc + c0 + u * STRIDE);
        v[u].x ^= t.x; v[u].y ^= t.y; v[u].z ^= t.z; v[u].w ^= t.w;
      }
    }
    fold(v);
  }
  for (; c0 < Kc; c0 += STRIDE) {
    uint4 v[U] = {};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 t = ld_stream(W + min(row0 + r, N - 1) * Kc + c0);
      v[0].x ^= t.x; v[0].y ^= t.y; v[0].z ^= t.z; v[0].w ^= t.w;
    }
    fold(v);
  }
  __syncthreads();  // the GEMV's k-slices meet before the tile's output
#endif
  if (!waited) pdl_wait();
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
