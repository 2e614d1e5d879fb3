// Act-order layers (GPTQ desc_act) multiply x[:, perm]: this kernel writes that gathered copy, zero-padded to Kp (the
// kernel permutation's padded length, >= every layout's padded K), for the plain kernel launched right after it.
// Why a kernel of its own, launched with PDL: it lets its dependents launch at once, so the GEMV after it is resident
// and has its first weight loads (constant data, issued before its griddepcontrol.wait) in flight while this gather
// waits for x; the GEMV then reads the gathered x as a plain layer reads x, with no per-block staging.
// One thread per 16 bytes of output (8 fp16 / bf16 or 4 fp32 elements); grid (ceil(Kp / (16 / ES * 128)), M). Each
// thread reads its elements straight from global memory (L2-resident x): staging the row in shared memory first, with
// coalesced loads and a block barrier, measured slower on an H100 (q 1.28x the plain GEMV against 1.18x).
#include "gemv_common.cuh"

#ifndef GX_ES  // bytes per element: 2 (float16 / bfloat16) or 4 (float32)
#define GX_ES 2
#endif

extern "C" __global__ void __launch_bounds__(128)
mixgemm_gather_x(const char* __restrict__ X, int ldx,  // [M, >= K], row stride in elements
                 int K,
                 const int* __restrict__ perm,          // [Kp] int32, padded with the identity (entries >= K: zero)
                 uint4* __restrict__ Y, int ldy4,       // [M, Kp], row stride in 16-byte units
                 int Kp) {
  constexpr int PER = 16 / GX_ES;
  mg::pdl_launch_dependents();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;  // this thread's 16-byte piece of the row
  const int m = blockIdx.y;
  const bool live = p * PER < Kp;
  int idx[PER];
  if (live) mg::ld_perm(perm, p * PER, idx);  // constant (made once per layer): read before the wait
  mg::pdl_wait();                             // x is written by the kernels before this one
  if (!live) return;
  const char* src = X + (size_t)m * ldx * GX_ES;
  u32 w[4];
  if constexpr (GX_ES == 2) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u16 lo = 0, hi = 0;
      if (idx[2 * j] < K) asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(lo) : "l"(src + 2 * (size_t)idx[2 * j]));
      if (idx[2 * j + 1] < K)
        asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(hi) : "l"(src + 2 * (size_t)idx[2 * j + 1]));
      w[j] = (u32)lo | ((u32)hi << 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = 0u;
      if (idx[j] < K) asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(w[j]) : "l"(src + 4 * (size_t)idx[j]));
    }
  }
  uint4 v;
  v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
  Y[(size_t)m * ldy4 + p] = v;
}
