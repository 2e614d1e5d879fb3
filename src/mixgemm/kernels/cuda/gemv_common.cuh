// Shared device helpers of mixgemm's CUDA kernels: raw PTX on 32-bit words, so no CUDA header is needed.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

namespace mg {

__device__ __forceinline__ float as_f32(u32 u) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
}

// (a & MASK) | MAGIC in one lop3 (immLut 0xEA = (0xF0 & 0xCC) | 0xAA): one instruction turns two
// nibbles into two fp16 (or one into an fp32) "magic + q" numbers, no shifts, no int->float convert.
template <u32 MASK, u32 MAGIC>
__device__ __forceinline__ u32 lop3_and_or(u32 a) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "n"(MAGIC));
  return r;
}

// prmt picks bytes of {b:a}: one instruction builds two fp16 (1024 + u) from two int8 codes (0x64 is
// the high byte of fp16 1024, whose ulp is 1), or one fp32 (2^23 + u) with 0x4B000000.
template <u32 SEL>
__device__ __forceinline__ u32 prmt(u32 a, u32 b) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "n"(SEL));
  return r;
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
  u32 r;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
  u32 r;
  asm("add.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// bf16x2 a * b + c (fma.rn.bf16x2 exists from sm_80; sub/mul.bf16x2 only from sm_90)
__device__ __forceinline__ u32 bfma2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
__device__ __forceinline__ u32 f32_to_bf2(float lo, float hi) {  // {lo, hi} as bf16x2
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float h2sum_f32(u32 h) {
  float a, b;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}"
      : "=f"(a), "=f"(b) : "r"(h));
  return a + b;
}
__device__ __forceinline__ u32 f32_to_h2(float f) {  // {f, f} as f16x2
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(f));
  return r;
}
__device__ __forceinline__ float h_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float bf_to_f32(u16 h) { return as_f32(((u32)h) << 16); }

// Weights are read exactly once: stream them past L1 (no_allocate) so L1 keeps the activations that
// every warp of the block re-reads.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  // volatile: keeps all of a step's weight loads issued before the compute that uses them
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Activations: read-only path, L1-cached (shared by all warps of the block).
__device__ __forceinline__ uint4 ld_x(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Act-order layers (GPTQ desc_act) multiply x[perm[k]] where plain ones read x[k]: the GEMVs gather x through perm
// while loading it (no separate gather kernel). perm: int32, padded by the host with the identity to a multiple of
// 64 k (so padded k read the zero-padded x like plain layers, no bounds checks), 16-byte aligned. Per-lane gathers
// read it after pdl_wait(); the shared-memory path (gemv.cu, GEMV_XS) copies it before, as constant data like the
// weights (made once per layer by ops.dispatch.kernel_perm, which lets its kernels finish before any launch reads it).
// The loads are volatile asm: kept after pdl_wait() (a pure asm could be hoisted above it).
// ld_perm: the PER indices perm[k0 .. k0 + PER - 1] (k0 a multiple of 4: whole 16-byte loads).
template <int PER>
__device__ __forceinline__ void ld_perm(const int* perm, int k0, int (&idx)[PER]) {
#pragma unroll
  for (int i = 0; i < PER; i += 4)
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(idx[i]), "=r"(idx[i + 1]), "=r"(idx[i + 2]), "=r"(idx[i + 3]) : "l"(perm + k0 + i));
}
// gather_x: the 16 bytes x_row[idx[0]], ..., x_row[idx[PER - 1]] (elements of XE = 16 / PER bytes) packed like one
// plain 16-byte load of x: same registers, same element order, so the math after it is unchanged.
template <int PER>
__device__ __forceinline__ uint4 gather_x(const char* xrow, const int (&idx)[PER]) {
  u32 w[4];
  if constexpr (PER == 8) {  // 16-bit elements: two per word, low half first
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u16 lo, hi;
      asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(lo) : "l"(xrow + 2 * (size_t)idx[2 * j]));
      asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(hi) : "l"(xrow + 2 * (size_t)idx[2 * j + 1]));
      w[j] = (u32)lo | ((u32)hi << 16);
    }
  } else {  // 32-bit elements
#pragma unroll
    for (int j = 0; j < 4; ++j)
      asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(w[j]) : "l"(xrow + 4 * (size_t)idx[j]));
  }
  uint4 r;
  r.x = w[0]; r.y = w[1]; r.z = w[2]; r.w = w[3];
  return r;
}

// CUDA-core GEMV epilogue, first half: each group of LW lanes sums its lanes' partials acc[m][r] (the group's lanes
// split K) and its first lane writes them to red_ks[m][(rg * 32 / LW + lane / LW) * R + r], this warp's k-slice of the
// block's shared reduction buffer (LW 32: one group, rows rg * R + r).
template <int M, int R, int W, int LW = 32>
__device__ __forceinline__ void warp_sums_to_smem(const float (&acc)[M][R], float (&red_ks)[M][W], int rg, int lane) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int o = LW / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane % LW == 0) red_ks[m][(rg * (32 / LW) + lane / LW) * R + r] = v;
    }
}

// Bias of output column n: bias_kind 0 none, 1 fp16, 2 bf16, 3 fp32.
__device__ __forceinline__ float bias_at(const void* bias, int bias_kind, int n) {
  if (bias_kind == 1) return h_to_f32(((const u16*)bias)[n]);
  if (bias_kind == 2) return bf_to_f32(((const u16*)bias)[n]);
  if (bias_kind == 3) return ((const float*)bias)[n];
  return 0.f;
}
// v clamped to [lo, hi] -- compares, not fminf/fmaxf: NaN propagates like torch.clamp
__device__ __forceinline__ float clamp_lo_hi(float v, float lo, float hi) {
  if (v < lo) v = lo;
  if (v > hi) v = hi;
  return v;
}
// v rounded to the 16-bit OUT dtype (0 fp16, 1 bf16)
template <int OUT>
__device__ __forceinline__ u16 to_out16(float v) {
  u16 h;
  if (OUT == 0) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}

// One output element: + bias, clamp to [lo, hi], store at Y[o] as OUT (0 fp16, 1 bf16, 2 fp32). Shared by the
// epilogues of every GEMV kernel. (The bias chain is bias_at's, written out: calling bias_at here grew the wgmma GEMM's
// BM 256 build from 8247 to 13263 SASS instructions.)
template <int OUT>
__device__ __forceinline__ void store_output(void* Y, size_t o, int n, float v, const void* bias, int bias_kind,
                                             float lo, float hi) {
  if (bias_kind == 1) v += h_to_f32(((const u16*)bias)[n]);
  else if (bias_kind == 2) v += bf_to_f32(((const u16*)bias)[n]);
  else if (bias_kind == 3) v += ((const float*)bias)[n];
  v = clamp_lo_hi(v, lo, hi);
  if (OUT == 2) ((float*)Y)[o] = v;
  else ((u16*)Y)[o] = to_out16<OUT>(v);
}

// The fused activation-quantizing GEMVs' epilogue (gemv_a8.cu, gemv_a8_wg.cu): thread-strided over a tile's M x W
// outputs, the KS k-slices of red[k][m][j] summed and stored at column n0 + j of token m (out_kind at run time: 0 fp16,
// 1 bf16, 2 fp32; columns >= N and tokens >= Mr skipped). The caller synchronizes before and after.
template <int KS, int M, int W, int NT>
__device__ __forceinline__ void store_slices(const float (&red)[KS][M][W], int n0, int N, int Mr, void* Y, int ldy,
                                             int out_kind, const void* bias, int bias_kind, float lo, float hi) {
  for (int i = threadIdx.x; i < M * W; i += NT) {
    const int m = i / W, j = i % W;
    const int n = n0 + j;
    if (n >= N || m >= Mr) continue;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) v += red[k][m][j];
    const size_t o = (size_t)m * ldy + n;
    if (out_kind == 0) store_output<0>(Y, o, n, v, bias, bias_kind, lo, hi);
    else if (out_kind == 1) store_output<1>(Y, o, n, v, bias, bias_kind, lo, hi);
    else store_output<2>(Y, o, n, v, bias, bias_kind, lo, hi);
  }
}

// Programmatic dependent launch (sm_90; no-ops when the kernel was launched without the attribute).
// Why: a GEMV's weights do not depend on the kernel before it, only x does; launched with PDL, the GEMV's
// blocks start while the previous kernel drains, load their first weights, and wait (griddepcontrol.wait
// = until the previous grid has finished and its writes are visible) only before touching x, bias or y.
// launch_dependents at the start lets the next PDL kernel do the same during this kernel's last wave.
// Nothing that another kernel may write is read or written before pdl_wait().
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}

template <int SCL>
__device__ __forceinline__ float scl_to_f32(u32 bits16or32) {
  if (SCL == 0) return h_to_f32((u16)bits16or32);
  if (SCL == 1) return bf_to_f32((u16)bits16or32);
  return as_f32(bits16or32);
}

// Per-(row, group) parameters, loaded raw (one 2-, 4- or 8-byte load) then decoded.
template <int SCL, int MODE>
struct Param {
  static constexpr int SB = SCL == 2 ? 4 : 2;            // bytes per scale-dtype value
  static constexpr int PB = SB * (MODE == 0 ? 1 : 2);    // bytes per group
  u32 a, b;
  __device__ __forceinline__ void load(const char* base, int g) {
    const char* p = base + (size_t)g * PB;
    if (PB == 2) {
      u16 h;
      asm("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(p));
      a = h; b = 0;
    } else if (PB == 4) {
      u32 w;
      asm("ld.global.nc.u32 %0, [%1];" : "=r"(w) : "l"(p));
      if (SB == 2) { a = w & 0xffffu; b = w >> 16; } else { a = w; b = 0; }
    } else {
      asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p));
    }
  }
  // the same from any address space (GEMV_BULK's parameters in shared memory)
  __device__ __forceinline__ void load_generic(const char* base, int g) {
    const char* p = base + (size_t)g * PB;
    if (PB == 2) { a = *(const u16*)p; b = 0; }
    else if (PB == 4) {
      const u32 w = *(const u32*)p;
      if (SB == 2) { a = w & 0xffffu; b = w >> 16; } else { a = w; b = 0; }
    } else { const uint2 v = *(const uint2*)p; a = v.x; b = v.y; }
  }
  __device__ __forceinline__ float scale() const { return scl_to_f32<SCL>(a); }
  __device__ __forceinline__ float second() const { return scl_to_f32<SCL>(b); }
  __device__ __forceinline__ u32 second_x2() const { return b * 0x10001u; }  // 16-bit second in both halves
};

// The same parameters kept as the one raw word they were loaded as (a 16-bit scale and a 16-bit zero / offset),
// split where used. Why: Param splits them where the load lands, so a double-buffered kernel's prefetched pair makes
// the warp wait right there (the prefetch hides nothing); whole, it also takes one register instead of two.
template <int SCL, int MODE>
struct PackedParam {
  static_assert(SCL != 2 && MODE != 0, "two 16-bit values per group");
  static constexpr int SB = 2, PB = 4;
  u32 w;
  __device__ __forceinline__ void load(const char* base, int g) {
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(w) : "l"(base + (size_t)g * PB));
  }
  __device__ __forceinline__ float scale() const { return scl_to_f32<SCL>(w & 0xffffu); }
  __device__ __forceinline__ float second() const { return scl_to_f32<SCL>(w >> 16); }
  __device__ __forceinline__ u32 second_x2() const { return prmt<0x3232>(w, w); }
};

// Param or PackedParam, as a kernel's PACK define says
template <bool PACKED, int SCL, int MODE> struct PickParam { typedef Param<SCL, MODE> T; };
template <int SCL, int MODE> struct PickParam<true, SCL, MODE> { typedef PackedParam<SCL, MODE> T; };

}  // namespace mg
