// Per-token / per-block int8 quantization of activations, shared by the kernels that quantize x themselves
// (the fused GEMVs' prologue, a8_prologue.cuh; the long-row quantizer, act_quant_rows.cu; gemm_wgmma_a8.cu: the GEMM's
// quantizer blocks).
// Exactly the float32 ops of mixgemm.formats.activation (IEEE div / mul / sub intrinsics: NVRTC would contract a*b+c
// into FMA otherwise; rounding by + 1.5*2^23 = round half to even like torch.round, see quant8), so the codes, sums
// and scales of every kernel equal the reference's bit for bit. The includer defines A8_XT, the activation dtype
// (0 fp16, 1 bf16, 2 fp32), first, and A8_SF 1 where the symmetric mode is "sym_full" (compressed-tensors' scheme:
// d = amax / 127.5 and x / d each rounded to A8_XT, codes round(clamp(x / d, -128, 127))) instead of "sym" (q8_1).
#pragma once
#include "gemv_common.cuh"

#ifndef A8_XT
#define A8_XT 0
#endif
#ifndef A8_SF
#define A8_SF 0
#endif

namespace actq {

using namespace mg;

// 8 in-range activations as raw 16-byte words (kept raw until used: 4 registers per 8 fp16 values).
constexpr int XV = A8_XT == 2 ? 2 : 1;  // uint4 per 8 activations
// AFTER_WAIT: volatile loads, kept after a pdl_wait() before them (a pure asm could be hoisted above it).
template <bool AFTER_WAIT = false>
__device__ __forceinline__ void load8_raw(const void* X, size_t row_off, int k, uint4 (&raw)[XV]) {
  const unsigned char* p = (const unsigned char*)X + (row_off + k) * (A8_XT == 2 ? 4 : 2);
#pragma unroll
  for (int i = 0; i < XV; ++i) {
    if (AFTER_WAIT) {
      uint4& v = raw[i];
      asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"((const uint4*)p + i));
    } else {
      raw[i] = ld_x((const uint4*)p + i);
    }
  }
}
__device__ __forceinline__ void raw_to_f32(const uint4 (&raw)[XV], float v[8]) {
#pragma unroll
  for (int i = 0; i < XV; ++i) {
    const u32 w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (A8_XT == 2) {
        v[4 * i + j] = as_f32(w[j]);
      } else if (A8_XT == 0) {
        v[2 * j] = h_to_f32((u16)(w[j] & 0xffffu));
        v[2 * j + 1] = h_to_f32((u16)(w[j] >> 16));
      } else {  // bf16 -> fp32 is a shift / mask
        v[2 * j] = as_f32(w[j] << 16);
        v[2 * j + 1] = as_f32(w[j] & 0xffff0000u);
      }
    }
  }
}

// Range of 8 values: sym a = max |v|; asym a = max, b = min.
template <bool ASYM>
__device__ __forceinline__ void range8(const float v[8], float& a, float& b) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (!ASYM) a = fmaxf(a, fabsf(v[j]));
    else { a = fmaxf(a, v[j]); b = fminf(b, v[j]); }
  }
}

// A float32 (finite) rounded to nearest even in the activation dtype, as float32 (the float32 quotient rounded so is
// the dtype's own correctly rounded quotient: float32 holds more than 2p + 2 bits of its significand).
__device__ __forceinline__ float to_xt(float v) {
  if (A8_XT == 2) return v;
  const u16 h = to_out16<A8_XT == 2 ? 0 : A8_XT>(v);
  return A8_XT == 0 ? h_to_f32(h) : bf_to_f32(h);
}

// Block parameters from the reduced range, exactly as formats/activation.py (float32, IEEE-rounded ops).
// sym: d = amax / 127, inv = 1 / d (0 if d == 0). sym_full (A8_SF): d = to_xt(amax / 127.5), inv = the divisor (d,
// or 1 where d == 0). asym: d = (hi - lo) / 255, o = hi - 127 d (o = hi, d = 1 for a constant block).
template <bool ASYM>
__device__ __forceinline__ void block_params(float a, float b, float& d, float& inv, float& o) {
  if (!ASYM) {
    if (A8_SF) {
      d = to_xt(__fdiv_rn(a, 127.5f));
      inv = d > 0.f ? d : 1.f;
    } else {
      d = __fdiv_rn(a, 127.f);
      inv = d > 0.f ? __fdiv_rn(1.f, d) : 0.f;
    }
    o = 0.f;
  } else {  // a = hi, b = lo
    const float dd = __fdiv_rn(__fsub_rn(a, b), 255.f);
    const bool pos = dd > 0.f;
    o = pos ? __fsub_rn(a, __fmul_rn(127.f, dd)) : a;
    d = pos ? dd : 1.f;
    inv = 0.f;
  }
}

// 8 codes -> 2 words (byte j = code j) and their sum. Rounding: y + 1.5*2^23 (fp32 ulp 1 there) rounds
// half to even to an integer, exactly torch.round for |y| < 2^22, and its low byte IS the two's-complement
// code (bits = 0x4B400000 + q): no cvt (1/4 rate), one prmt per 2 codes. sym needs no clamp: |x| <= amax
// gives |x * inv| <= 127 (1 + 3 * 2^-24) < 127.5. asym and sym_full clamp y to [-128, 127] first (same result as
// clamping the rounded value: the bounds are integers). MASKED (asym, per-channel tail): NaN pads -> 0.
// SPLIT (int4 weights): w0 = the codes of k 0, 2, 4, 6 and w1 = those of k 1, 3, 5, 7, the weight bytes' nibble pairs.
template <bool ASYM, bool MASKED, bool SPLIT = false>
__device__ __forceinline__ int quant8(const float v[8], float d, float inv, float o, u32& w0, u32& w1) {
  u32 bits[8];
  int s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float y;
    if (!ASYM && A8_SF) {
      y = d > 0.f ? fminf(fmaxf(to_xt(__fdiv_rn(v[j], inv)), -128.f), 127.f) : 0.f;
    } else if (!ASYM) {
      y = __fmul_rn(v[j], inv);
    } else {
      y = __fdiv_rn(__fsub_rn(v[j], o), d);
      y = fminf(fmaxf(y, -128.f), 127.f);
    }
    bits[j] = __float_as_uint(__fadd_rn(y, 12582912.f));
    if (ASYM && MASKED && !(v[j] == v[j])) bits[j] = 0x4B400000u;  // a pad (NaN): code 0
    s += (int)bits[j];
  }
  s -= 8 * 0x4B400000;  // exact modulo 2^32, and the true sum is small
  constexpr int A = SPLIT ? 2 : 1, B = SPLIT ? 1 : 4;  // w0 = codes 0, A, 2A, 3A; w1 = codes B, B + A, ...
  w0 = prmt<0x5410>(prmt<0x0040>(bits[0], bits[A]), prmt<0x0040>(bits[2 * A], bits[3 * A]));
  w1 = prmt<0x5410>(prmt<0x0040>(bits[B], bits[B + A]), prmt<0x0040>(bits[B + 2 * A], bits[B + 3 * A]));
  return s;
}


// The running (max, min) of the 8-k units a thread holds in registers (unit i is k8 = tid + i * NT; those from n on
// are not the row's).
template <bool ASYM, int NT, int CPT>
__device__ __forceinline__ void range_units(const uint4 (&raw)[CPT][XV], int tid, int n, float& a, float& c) {
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    if (tid + i * NT < n) {
      float v[8];
      raw_to_f32(raw[i], v);
      range8<ASYM>(v, a, c);
    }
  }
}


// One row m quantized as one block (the whole row; K8 = K / 8 units of 8 k) by a group of NT threads (tid 0..NT - 1
// within the group, NT a multiple of 32) holding the row in registers (CPT 16-byte units each, unit u at thread
// u % NT): codes into Q[m, :] (row stride ldq), scale S[m], offset O[m], code sum SUM[m]. ra, rc, rs: the group's
// NT / 32 slots of shared memory; sync(): the group's barrier (__syncthreads for a whole block, a named barrier for
// part of one). Exact in any order of the reductions (max / min, integer sums).
template <bool ASYM, int CPT, int NT, class Sync>
__device__ __forceinline__ void actq_row(const uint4 (&raw)[CPT][XV], signed char* Q, float* S, float* O, int* SUM,
                                         size_t m, int ldq, int K8, int tid, float* ra, float* rc, int* rs, Sync sync) {
  constexpr int NW = NT / 32;
  const int lane = tid & 31, warp = tid >> 5;
  float a = ASYM ? -__int_as_float(0x7f800000) : 0.f, c = __int_as_float(0x7f800000);
  range_units<ASYM, NT>(raw, tid, K8, a, c);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    c = fminf(c, __shfl_xor_sync(0xffffffffu, c, o));
  }
  if (lane == 0) { ra[warp] = a; rc[warp] = c; }
  sync();
  a = ra[0]; c = rc[0];
  for (int w = 1; w < NW; ++w) { a = fmaxf(a, ra[w]); c = fminf(c, rc[w]); }  // exact: any order
  float d, inv, off;
  block_params<ASYM>(a, c, d, inv, off);
  int tot = 0;
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int u = tid + i * NT;
    if (u < K8) {
      float v[8];
      raw_to_f32(raw[i], v);
      u32 w0, w1;
      tot += quant8<ASYM, false>(v, d, inv, off, w0, w1);
      *(uint2*)(Q + m * ldq + (size_t)u * 8) = make_uint2(w0, w1);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
  if (lane == 0) rs[warp] = tot;
  sync();
  if (tid == 0) {
    int t = 0;
    for (int w = 0; w < NW; ++w) t += rs[w];
    S[m] = d;
    O[m] = off;
    SUM[m] = t;
  }
}

}  // namespace actq
