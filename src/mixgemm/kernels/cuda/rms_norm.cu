// mixgemm's RMSNorm for the norms that feed its layers, under torch.compile (mixgemm.nn.norms).
// Why a kernel of its own where inductor fuses the residual add and the norm into one already:
// * programmatic dependent launch. It lets its dependents launch at once, so the GEMV after it is resident with its
//   first weight loads in flight while the norm runs; it starts early itself, behind the GEMV before it, with its
//   constants (weight, permutation) read before its PDL wait. Inductor's kernel has neither end.
// * act-order layers (GPTQ desc_act gives q / k / v one input permutation, gate / up another; RN_PERM) need
//   norm(h)[:, perm]: written here straight from the row held in shared memory, where the alternative is a gather
//   kernel after the norm (one more kernel on the decode step's critical path; inductor fusing the gather into its
//   norm reloads the inputs at the gathered positions, 5.5 us against 2.4 on an H100).
// With RN_ADD it also does the residual add before the norm (h = a + b, written out for the residual stream; the
// inductor pass mixgemm.ops.fuse_norm_add hands it over), so the step runs no more kernels than inductor's own.
// Arithmetic as transformers' RMSNorm: h in fp32, mean of squares, * rsqrt(mean + eps), rounded to the input dtype,
// times the weight and rounded (the product of two 16-bit floats is exact in fp32, so this is the 16-bit multiply);
// RN_UNIT as Gemma's: the normalized row times (1 + weight), all in fp32, rounded once.
// Eager mode also runs it for the model's other norms of either formula (one launch where transformers' is eight).
// The add rounds a + b computed in fp32, as torch's elementwise add does.
// One block per row: the row of h goes to shared memory (in the input dtype: exact) with coalesced 16-byte loads; the
// output is read from there (gathered with RN_PERM) and stored coalesced.
#include "gemv_common.cuh"

#ifndef RN_ES  // bytes per element: 2 (float16 / bfloat16) or 4 (float32)
#define RN_ES 2
#endif
#ifndef RN_BF16  // with RN_ES 2: 1 bfloat16, 0 float16
#define RN_BF16 0
#endif
#ifndef RN_ADD  // 1: the input is a + b (written to H); 0: the input is A
#define RN_ADD 0
#endif
#ifndef RN_PERM  // 1: the output is gathered through perm; 0: in order (perm unused)
#define RN_PERM 1
#endif
#ifndef RN_UNIT  // 1: Gemma's formula, h * rsqrt(mean + eps) * (1 + weight) in fp32, rounded once
#define RN_UNIT 0
#endif
#ifndef RN_PRE  // 16-byte output pieces per thread whose indices and weights are read before the PDL wait
#define RN_PRE 2
#endif

#define ELEM_ES RN_ES
#define ELEM_BF16 RN_BF16
#include "elem16.cuh"

__device__ __forceinline__ uint4 ld_row(const elem_t* p) {  // written by the kernels before this one: after the wait
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Indices and weights of output piece p (constant data).
__device__ __forceinline__ void load_piece_consts(const int* perm, const elem_t* W, int p, int (&idx)[PER],
                                                  float (&w)[PER]) {
#if RN_PERM
  mg::ld_perm(perm, p * PER, idx);
#else
#pragma unroll
  for (int j = 0; j < PER; ++j) idx[j] = p * PER + j;
#endif
#pragma unroll
  for (int j = 0; j < PER; ++j) w[j] = RN_UNIT ? 1.f + to_f(W[idx[j]]) : to_f(W[idx[j]]);
}

__device__ __forceinline__ uint4 norm_piece(const elem_t* hs, const int (&idx)[PER], const float (&w)[PER],
                                            float rstd) {
  Piece out;
#pragma unroll
  for (int j = 0; j < PER; ++j)
    out.e[j] = RN_UNIT ? from_f(to_f(hs[idx[j]]) * rstd * w[j]) : from_f(w[j] * to_f(from_f(to_f(hs[idx[j]]) * rstd)));
  return out.v;
}

extern "C" __global__ void __launch_bounds__(1024)
mixgemm_rms_norm(const elem_t* __restrict__ A, int lda,  // [M, K] the norm's input (RN_ADD: its first term)
                 const elem_t* __restrict__ B, int ldb,  // RN_ADD: the second term
                 elem_t* __restrict__ H, int ldh,        // RN_ADD: a + b
                 const elem_t* __restrict__ W,           // [K] the norm's weight
                 const int* __restrict__ perm,           // RN_PERM: [>= K] int32, a permutation of range(K) first
                 elem_t* __restrict__ Y, int ldy,        // [M, K] norm(h) (RN_PERM: norm(h)[:, perm])
                 int K, float eps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  elem_t* hs = reinterpret_cast<elem_t*>(smem_raw);  // [K]
  __shared__ float red[32];
  const int m = blockIdx.x, t = threadIdx.x, T = blockDim.x;
  const int pieces = K / PER;  // the host checks K % PER == 0 and 16-byte aligned rows
  mg::pdl_launch_dependents();
  int idx[RN_PRE][PER];
  float w[RN_PRE][PER];
#pragma unroll
  for (int v = 0; v < RN_PRE; ++v)
    if (t + v * T < pieces) load_piece_consts(perm, W, t + v * T, idx[v], w[v]);
  mg::pdl_wait();

  float ss = 0.f;
  const elem_t* a = A + (size_t)m * lda;
  for (int p = t; p < pieces; p += T) {
    Piece h;
    h.v = ld_row(a + p * PER);
#if RN_ADD
    Piece b;
    b.v = ld_row(B + (size_t)m * ldb + p * PER);
#pragma unroll
    for (int j = 0; j < PER; ++j) h.e[j] = from_f(to_f(h.e[j]) + to_f(b.e[j]));
    *reinterpret_cast<uint4*>(H + (size_t)m * ldh + p * PER) = h.v;
#endif
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const float f = to_f(h.e[j]);
      ss = fmaf(f, f, ss);
    }
    *reinterpret_cast<uint4*>(hs + p * PER) = h.v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((t & 31) == 0) red[t >> 5] = ss;
  __syncthreads();  // (also: the row of h is in shared memory)
  if (t < 32) {
    float s = t < (T >> 5) ? red[t] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (t == 0) red[0] = s;
  }
  __syncthreads();
  const float rstd = rsqrtf(red[0] / (float)K + eps);

  uint4* y = reinterpret_cast<uint4*>(Y + (size_t)m * ldy);
#pragma unroll
  for (int v = 0; v < RN_PRE; ++v)
    if (t + v * T < pieces) y[t + v * T] = norm_piece(hs, idx[v], w[v], rstd);
  for (int p = t + RN_PRE * T; p < pieces; p += T) {  // rows longer than RN_PRE pieces per thread
    int i2[PER];
    float w2[PER];
    load_piece_consts(perm, W, p, i2, w2);
    y[p] = norm_piece(hs, i2, w2, rstd);
  }
}
