// The prologue of the fused activation-quantizing GEMVs (gemv_a8.cu on the a8gemv_v2 codes, gemv_a8_wg.cu on the
// int8 wgmma GEMM's wgmma_a8_v1): every block quantizes x[0:M, 0:K] into shared memory, exactly the reference's
// float32 ops (act_quant.cuh), in the order its lanes read the weights (the includer's Place policy). The includer
// defines A8_XT first.
#pragma once
#include "act_quant.cuh"

using namespace mg;
using namespace actq;

namespace a8 {

// a: 4 unsigned bytes (int8 codes, int4 codes or 16x int4 codes), b: 4 signed int8 activation codes
__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// |v| < 2^22: v + 0x4B400000 is the fp32 1.5*2^23 + v (ulp 1), so one IADD + FADD replace cvt.rn.f32.s32
// (a 1/8-rate instruction on sm_90); exact.
__device__ __forceinline__ float i2f_small(int v) {
  return __int_as_float(v + 0x4B400000) - 12582912.f;
}
__device__ __forceinline__ float x_at(const void* X, size_t i) {
  if (A8_XT == 0) return h_to_f32(((const u16*)X)[i]);
  if (A8_XT == 1) return bf_to_f32(((const u16*)X)[i]);
  return ((const float*)X)[i];
}
// 8 activations of row `row` at k (k % 8 == 0): vector loads when all 8 are inside K (rows 16-byte
// aligned: the host checks), else scalar loads; elements past K read as `pad` (0 for sym: it changes
// neither the absmax nor the codes; NaN for asym: fmaxf / fminf ignore NaN, and the code is zeroed).
__device__ __forceinline__ void load8(const void* X, size_t row_off, int k, int K, float pad, float v[8]) {
  if (k + 8 <= K) {
    if (A8_XT == 2) {
      const uint4 a = ld_x((const uint4*)((const float*)X + row_off + k));
      const uint4 b = ld_x((const uint4*)((const float*)X + row_off + k + 4));
      v[0] = as_f32(a.x); v[1] = as_f32(a.y); v[2] = as_f32(a.z); v[3] = as_f32(a.w);
      v[4] = as_f32(b.x); v[5] = as_f32(b.y); v[6] = as_f32(b.z); v[7] = as_f32(b.w);
    } else {
      const uint4 a = ld_x((const uint4*)((const u16*)X + row_off + k));
      const u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (A8_XT == 0) {
          v[2 * j] = h_to_f32((u16)(w[j] & 0xffffu));
          v[2 * j + 1] = h_to_f32((u16)(w[j] >> 16));
        } else {  // bf16 -> fp32 is a shift / mask
          v[2 * j] = as_f32(w[j] << 16);
          v[2 * j + 1] = as_f32(w[j] & 0xffff0000u);
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = k + j < K ? x_at(X, row_off + k + j) : pad;
  }
}

}  // namespace a8

using namespace a8;

// ---------------------------------------------------------------------------------------------------------
// Prologue: quantize x[0:M, 0:K] into shared memory. Shared layout (bytes; the host's smem_bytes matches):
//   codes [M][Kp] (in the kernel's read order: Place::store(sm, m, k, w0, w1) puts the 8 codes of row m at k,
//   k % 8 == 0, as w0 = k..k+3 and w1 = k+4..k+7, or even / odd k when Place::split()), sA [M][Gp], oA [M][Gp],
//   SAg [M][Gp] (sum of codes per block), SAc [M][NC] (sum of codes per chunk of CH k, NC = Kp / CH).
struct Smem {
  unsigned char* codes;
  float* sA;
  float* oA;
  int* SAg;
  int* SAc;
  int Kp, Gp, NC;
};

// Group-wise blocks (G <= 256): G / 8 consecutive lanes own one block (8 k each) and reduce it with xor
// shuffles; NB units per thread are loaded before any is used (NB 16-byte loads in flight per thread). A unit that
// no thread of the block holds (base + b NT past the end: uniform, so shuffles still see whole warps) is skipped: a
// small x (M K / 8 at most NT: decode) is one unit per thread, and this runs after the PDL wait, on the call's path.
// SUMS = false (sym weights and activations: no offset terms) leaves out the code sums SAc / SAg.
template <bool ASYM, int M, int G, int CH, int NT, class Place, bool SUMS = true>
__device__ __forceinline__ void prologue_grouped(const Smem& sm, const void* X, int ldx, int K, int Mr) {
  constexpr int GL = G / 8, CL = CH / 8, NB = 4;
  const int tid = threadIdx.x, lane = tid & 31;
  const int K8 = sm.Kp / 8, total = M * K8;
  for (int base = 0; base < total; base += NT * NB) {  // uniform trip count: shuffles see full warps
    uint4 raw[NB][XV];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (base + b * NT >= total) break;
      const int idx = base + b * NT + tid;
      const int m = idx / K8, k = (idx % K8) * 8;
      if (idx < total && k < K) {  // whole blocks are in or out (K % G == 0)
        load8_raw(X, (size_t)min(m, Mr - 1) * ldx, k, raw[b]);
      } else {
#pragma unroll
        for (int i = 0; i < XV; ++i) raw[b][i] = make_uint4(0u, 0u, 0u, 0u);  // zeros in any dtype
      }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (base + b * NT >= total) break;
      const int idx = base + b * NT + tid;
      const bool live = idx < total;
      const int m = idx / K8, k = (idx % K8) * 8;
      float vb[8];
      raw_to_f32(raw[b], vb);
      float a = ASYM ? vb[0] : 0.f, c = vb[0];
      range8<ASYM>(vb, a, c);
#pragma unroll
      for (int o = 1; o < GL; o <<= 1) {  // max / min are exact: any reduction order equals the reference
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (ASYM) c = fminf(c, __shfl_xor_sync(0xffffffffu, c, o));
      }
      float d, inv, off;
      block_params<ASYM>(a, c, d, inv, off);
      u32 w0, w1;
      int su = quant8<ASYM, false, Place::split()>(vb, d, inv, off, w0, w1);
      if (!(live && k < K)) { d = 0.f; off = 0.f; su = 0; w0 = w1 = 0u; }  // padding: zero codes, zero scale
      if (live) Place::store(sm, m, k, w0, w1);
      if (SUMS) {
#pragma unroll
        for (int o = 1; o < CL; o <<= 1) su += __shfl_xor_sync(0xffffffffu, su, o);
        if (live && (lane % CL) == 0) sm.SAc[m * sm.NC + k / CH] = su;
#pragma unroll
        for (int o = CL; o < GL; o <<= 1) su += __shfl_xor_sync(0xffffffffu, su, o);
      }
      if (live && (lane % GL) == 0) {
        const int g = k / G;
        sm.sA[m * sm.Gp + g] = d;
        sm.oA[m * sm.Gp + g] = off;
        if (SUMS) sm.SAg[m * sm.Gp + g] = su;
      }
    }
  }
}

// NB chunks of 8 activations of one row, chunk index base + b * NT + tid; chunks past the row (KR8) are pad.
template <int NB, int NT>
__device__ __forceinline__ void load_chunks(const void* X, size_t roff, int base, int tid, int KR8, int K,
                                            float pad, float (&v)[NB][8]) {
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int k8 = base + b * NT + tid;
    if (k8 < KR8) load8(X, roff, k8 * 8, K, pad, v[b]);
    else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[b][j] = pad;
    }
  }
}

// One block = the whole row (per-channel weights, G = 0; or per-token activations over groups of G): the range is
// block-reduced, then the row is quantized. OPC > 0: each thread keeps its OPC chunks of 8 k in registers between the
// two (x read once from L2; the host sets it when K % 8 == 0 and Kp <= 8 * OPC * NT); OPC = 0: two passes over x.
// G > 0: the row's scale / offset are written for every group and the code sums per group are the sums of the
// group's chunk sums. SUMS = false (sym weights and activations) leaves the code sums out, and with them a barrier.
template <bool ASYM, int M, int CH, int NT, int G, int OPC, class Place, bool SUMS = true>
__device__ __forceinline__ void prologue_channel(const Smem& sm, const void* X, int ldx, int K, int Mr,
                                                 float* pcr, int* pcs) {
  constexpr int CL = CH / 8, NB = 2, NW = NT / 32;
  const float pad = ASYM ? __int_as_float(0x7fffffff) : 0.f;  // NaN pads for asym (see load8)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int K8 = sm.Kp / 8, KR8 = (K + 7) / 8;
  // the one-pass form needs whole chunks (no scalar tail) and the row inside the registers; else two passes
  const bool one = OPC > 0 && (K & 7) == 0 && K8 <= OPC * NT;
  for (int m = 0; m < M; ++m) {
    const size_t roff = (size_t)min(m, Mr - 1) * ldx;
    float a = ASYM ? -__int_as_float(0x7f800000) : 0.f, c = __int_as_float(0x7f800000);
    uint4 raw[OPC > 0 ? OPC : 1][XV];
    if (one) {  // every load first: OPC x 16 bytes in flight per thread
#pragma unroll
      for (int i = 0; i < OPC; ++i) {
        const int k8 = tid + i * NT;
        if (k8 < KR8) {
          load8_raw(X, roff, k8 * 8, raw[i]);
        } else {
#pragma unroll
          for (int j = 0; j < XV; ++j) raw[i][j] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      range_units<ASYM, NT>(raw, tid, KR8, a, c);
    } else {
      for (int base = 0; base < KR8; base += NT * NB) {
        float v[NB][8];
        load_chunks<NB, NT>(X, roff, base, tid, KR8, K, pad, v);
#pragma unroll
        for (int b = 0; b < NB; ++b) range8<ASYM>(v[b], a, c);
      }
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      c = fminf(c, __shfl_xor_sync(0xffffffffu, c, o));
    }
    if (lane == 0) { pcr[warp] = a; pcr[NW + warp] = c; }
    if (tid == 0) *pcs = 0;
    __syncthreads();
    a = pcr[0]; c = pcr[NW];
    for (int w = 1; w < NW; ++w) { a = fmaxf(a, pcr[w]); c = fminf(c, pcr[NW + w]); }
    float d, inv, off;
    block_params<ASYM>(a, c, d, inv, off);
    int tot = 0;
    // piece k8 (8 values, padded past K) -> codes in shared memory, chunk sums, the thread's running total
    auto emit = [&](int k8, const float (&v)[8]) {
      u32 w0, w1;
      int su = quant8<ASYM, true, Place::split()>(v, d, inv, off, w0, w1);
      if (k8 >= KR8) { su = 0; w0 = w1 = 0u; }
      if (k8 < K8) Place::store(sm, m, k8 * 8, w0, w1);
      if (!SUMS) return;
      tot += su;
#pragma unroll
      for (int o = 1; o < CL; o <<= 1) su += __shfl_xor_sync(0xffffffffu, su, o);
      if (k8 < K8 && (lane % CL) == 0) sm.SAc[m * sm.NC + k8 * 8 / CH] = su;
    };
    if (one) {
#pragma unroll
      for (int i = 0; i < OPC; ++i) {
        float v[8];
        raw_to_f32(raw[i], v);
        emit(tid + i * NT, v);
      }
    } else {
      for (int base = 0; base < K8; base += NT * NB) {
        float v[NB][8];
        load_chunks<NB, NT>(X, roff, base, tid, KR8, K, pad, v);
#pragma unroll
        for (int b = 0; b < NB; ++b) emit(base + b * NT + tid, v[b]);
      }
    }
    if (SUMS) {
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
      if (lane == 0) atomicAdd(pcs, tot);  // integer: order-independent
      __syncthreads();
    }
    if (G == 0) {
      if (tid == 0) { sm.sA[m] = d; sm.oA[m] = off; if (SUMS) sm.SAg[m] = *pcs; }
    } else {
      constexpr int CPG = G > 0 ? G / CH : 1;  // chunks per group
      const int Gr = K / (G > 0 ? G : 1);
      for (int gi = tid; gi < sm.Gp; gi += NT) {   // padded groups: zero scale and sum, like prologue_grouped
        int su = 0;
        if (SUMS && gi < Gr)
          for (int c = 0; c < CPG; ++c) su += sm.SAc[m * sm.NC + gi * CPG + c];
        sm.sA[m * sm.Gp + gi] = gi < Gr ? d : 0.f;
        sm.oA[m * sm.Gp + gi] = gi < Gr ? off : 0.f;
        if (SUMS) sm.SAg[m * sm.Gp + gi] = su;
      }
    }
    __syncthreads();  // pcr / pcs are rewritten for the next row
  }
}
