// mixgemm per-token activation quantizer for LONG rows (one block = a whole row of K, K % 8 == 0), shared by the
// int8-activation kernels: the large-M W8A8 / W4A8 path quantizes x with it before the int8 GEMM (and a call plan
// from any K: mixgemm.kernels.cuda.act_quant_rows), so x is read from HBM once (the Triton row kernel reads it twice).
// The float32 ops are act_quant.cuh's (mixgemm.formats.activation's, bit for bit).
//
// Macros: A8_XT the activation dtype (0 fp16, 1 bf16, 2 fp32), A8_SF 1 for "sym_full" (act_quant.cuh), A8_ACTQ the
// 16-byte units of the row each thread holds in registers, AQ_NT the threads per row block.

#include "gemv_common.cuh"

#ifndef A8_XT
#define A8_XT 0
#endif
#ifndef A8_ACTQ  // 16-byte units of the row per thread (K <= 8 * A8_ACTQ * AQ_NT)
#define A8_ACTQ 1
#endif

#include "act_quant.cuh"

using namespace mg;
using namespace actq;

// One CUDA block per row holds the row in registers (A8_ACTQ 16-byte units per thread).
#ifndef AQ_NT
#define AQ_NT 512
#endif
extern "C" __global__ void __launch_bounds__(AQ_NT)
mixgemm_act_quant_rows(const void* __restrict__ X, int ldx,   // [M, ldx] activations, rows 16-byte aligned
                       signed char* __restrict__ Q, int ldq,  // [M, ldq] int8 codes (ldq % 8 == 0)
                       float* __restrict__ S, float* __restrict__ O, int* __restrict__ SUM,  // [M]
                       int K, int asym) {                     // K % 8 == 0, K <= 8 * A8_ACTQ * AQ_NT
  constexpr int NT = AQ_NT, CPT = A8_ACTQ;
  // the next kernel, if launched with PDL (the int8 wgmma GEMM, A8_PDL), may start once every row block runs: it
  // loads its first weights during this grid's last wave and waits (griddepcontrol.wait) before reading the codes
  pdl_launch_dependents();
  // launched with PDL itself, this grid's blocks are queued during the previous kernel (its launch latency hidden);
  // x, the codes and the scales belong to other kernels, so nothing is read or written before the wait
  pdl_wait();
  __shared__ float ra[NT / 32], rc[NT / 32];
  __shared__ int rs[NT / 32];
  const size_t m = blockIdx.x;
  const int K8 = K / 8;
  uint4 raw[CPT][XV];
#pragma unroll
  for (int i = 0; i < CPT; ++i) {  // all loads first: CPT x 16 bytes in flight per thread
    const int u = threadIdx.x + i * NT;
    if (u < K8) load8_raw(X, m * ldx, u * 8, raw[i]);
  }
  auto sync = [] { __syncthreads(); };
  if (asym) actq_row<true, CPT, NT>(raw, Q, S, O, SUM, m, ldq, K8, threadIdx.x, ra, rc, rs, sync);
  else actq_row<false, CPT, NT>(raw, Q, S, O, SUM, m, ldq, K8, threadIdx.x, ra, rc, rs, sync);
}
