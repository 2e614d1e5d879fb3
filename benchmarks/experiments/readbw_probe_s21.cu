// Session 21 probe (not shipped): how fast can the GPU *read* a 117 MB weight in a given access pattern with no math?
// To run it, copy it beside src/mixgemm/kernels/cuda/gemv_common.cuh and load it with nvrtc.get_function(
// "readbw_probe.cu", "probe", {PR_MODE, PR_R, PR_KS, PR_U, PR_MINB, PR_THREADS}, device); numbers in
// benchmarks/results/gemv_readbw_probe_h100_s21.log and gemv_notes.md "Session 21".
#include "gemv_common.cuh"
#ifndef PR_MODE
#define PR_MODE 0
#endif
#ifndef PR_R
#define PR_R 4
#endif
#ifndef PR_KS
#define PR_KS 8
#endif
#ifndef PR_U
#define PR_U 1
#endif
#ifndef PR_MINB
#define PR_MINB 1
#endif
#ifndef PR_THREADS
#define PR_THREADS (32 * PR_KS)
#endif
using namespace mg;
extern "C" __global__ void __launch_bounds__(PR_THREADS, PR_MINB)
probe(const uint4* __restrict__ W, int N, int Kc, unsigned* out) {
  constexpr int R = PR_R, U = PR_U;
  unsigned acc = 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_launch_dependents();
#if PR_MODE == 0
  // flat grid-stride: each thread U loads of 16 B per iteration, a block reads U * THREADS * 16 contiguous bytes
  const size_t n16 = (size_t)N * Kc;
  size_t i = (size_t)blockIdx.x * PR_THREADS * U + threadIdx.x;
  const size_t stride = (size_t)gridDim.x * PR_THREADS * U;
  for (; i + (U - 1) * PR_THREADS < n16; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(W + i + u * PR_THREADS);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
#else
  // the GEMV's pattern: block = R rows, KS warps interleave 32-chunk slices, U chunks per lane per step
  constexpr int STRIDE = PR_KS * 32;
  const int row0 = blockIdx.x * R;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = W + (size_t)min(row0 + r, N - 1) * Kc;
  int c0 = warp * 32 + lane;
  for (; c0 + (U - 1) * STRIDE < Kc; c0 += U * STRIDE) {
    uint4 v[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) v[u][r] = ld_stream(wr[r] + c0 + u * STRIDE);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) acc ^= v[u][r].x ^ v[u][r].y ^ v[u][r].z ^ v[u][r].w;
  }
  for (; c0 < Kc; c0 += STRIDE)
#pragma unroll
    for (int r = 0; r < R; ++r) { uint4 v = ld_stream(wr[r] + c0); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  __syncthreads();
#endif
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
