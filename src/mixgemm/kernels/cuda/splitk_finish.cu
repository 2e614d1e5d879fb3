// The epilogue of a split-K GEMM whose slices added their fp32 partials into a zeroed workspace:
// y[m, n] = clamp(ws[m, n] + bias[n], lo, hi) as y's dtype, through the GEMV kernels' store_output (the same bias,
// clamp and rounding as every other epilogue). One thread per 4 consecutive outputs of a row.
#include "gemv_common.cuh"

#ifndef SF_OUT  // 0 float16, 1 bfloat16, 2 float32
#define SF_OUT 0
#endif

extern "C" __global__ void __launch_bounds__(256)
mixgemm_splitk_finish(const float* __restrict__ ws, const void* __restrict__ bias, int bias_kind, float lo, float hi,
                      void* __restrict__ y, int ldy, int M, int N) {
  const int per_row = (N + 3) / 4;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (long long)M * per_row) return;
  const int m = (int)(t / per_row), n0 = (int)(t % per_row) * 4;
  const float* w = ws + (size_t)m * N;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = n0 + j;
    if (n < N) mg::store_output<SF_OUT>(y, (size_t)m * ldy + n, n, w[n], bias, bias_kind, lo, hi);
  }
}
