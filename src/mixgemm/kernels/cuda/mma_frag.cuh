// Tensor-core A fragments from packed weights: the one dequantization primitive of mixgemm's mma kernels
// (gemv_mma.cu: mma.sync GEMV; gemm_wgmma.cu: wgmma GEMM). Raw PTX on 32-bit words, no CUDA headers.
//
// A fragment of one 16 x 16 step (mma.m16n8k16 and, per warp, wgmma m64nNk16 with A in registers):
// lane (g = lane / 4, t = lane % 4) holds a0 = row g (k pair 0), a1 = row g + 8 (pair 0), a2 = row g (pair 1),
// a3 = row g + 8 (pair 1); which k the pairs are is the layout's business (formats/layouts.py), the
// kernels only see one 32-bit word (int4) or two words (int8) per step:
//   int4, word w: nibble p = element INT4_PERM[p] of (a0.lo, a0.hi, a1.lo, a1.hi, a2.lo, a2.hi, a3.lo, a3.hi)
//         with INT4_PERM = (0, 2, 4, 6, 1, 3, 5, 7): one lop3 per register (no shifts for fp16).
//   int8, words r0 / r1: the bytes (a0.lo, a0.hi, a2.lo, a2.hi) of row g / the same of row g + 8.
#pragma once

#include "gemv_common.cuh"

namespace mg {

// fp16 bits of a nonzero integer |v| < 2048 (exact), at compile time
__host__ __device__ constexpr u32 h16_int(int v) {
  const u32 a = v < 0 ? -v : v;
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return (v < 0 ? 0x8000u : 0u) | (u32)(e + 15) << 10 | ((a << (10 - e)) & 0x3ffu);
}
static_assert(h16_int(1032) == 0x6408u && h16_int(-72) == 0xd480u && h16_int(1152) == 0x6480u, "fp16 bits");

// Per-row dequantization constants for one group, in the activation's 16-bit type (ACT 0 fp16, 1 bf16;
// MODE 0 sym, 1 zero_point, 2 offset).
template <int ACT, int MODE>
struct RowQ {
  u32 zlo, zhi, s2, off2;
  // only what the exact q - zc needs (A unscaled: the scale is applied to the fp32 result)
  __device__ __forceinline__ void set_exact(float zc) {
    if (ACT == 0) {
      zlo = f32_to_h2(1024.f + zc);   // (1024 + q) - (1024 + z) = q - z, exact
      zhi = f32_to_h2(-(64.f + zc));  // (1024 + 16q) / 16 - (64 + z) = q - z, exact
    } else {
      zlo = f32_to_bf2(-(128.f + zc), -(128.f + zc));  // bf16 128 has ulp 1: exact
      zhi = 0u;
    }
    s2 = 0u, off2 = 0u;
  }
  __device__ __forceinline__ void set(float s, float zc, float m) {
    set_exact(zc);
    if (ACT == 0) {
      s2 = f32_to_h2(s);
      off2 = MODE == 2 ? f32_to_h2(fmaf(zc, s, m)) : 0u;
    } else {
      s2 = f32_to_bf2(s, s);
      off2 = MODE == 2 ? f32_to_bf2(fmaf(zc, s, m), fmaf(zc, s, m)) : 0x80008000u;  // -0: exact mul
    }
  }
  // Symmetric fp16 weights from an fp16 scale's raw bits: the scale duplicated into both halves (no fp32 round
  // trip) and the magic-number constants of the fixed zero point Z (8 / 128) known at compile time, so a group
  // decode costs no cvt. Same values as set(h_to_f32(bits), Z, 0).
  template <int Z>
  __device__ __forceinline__ void set_sym_f16_bits(u32 bits) {
    static_assert(ACT == 0 && MODE == 0, "fp16 sym only");
    zlo = h16_int(1024 + Z) * 0x10001u;
    zhi = h16_int(-(64 + Z)) * 0x10001u;
    s2 = bits | (bits << 16);
    off2 = 0u;
  }
  // d = exact (q - zc) pair -> dequantized pair
  __device__ __forceinline__ u32 finish(u32 d) const {
    if (ACT == 0) return MODE == 2 ? hfma2(d, s2, off2) : hmul2(d, s2);
    return bfma2(d, s2, off2);
  }
};

// ldmatrix x4 (b16): lane (g, t) gets word t of row g of each of the four 8 x 16-byte matrices whose row addresses
// (shared memory) lanes 8 q .. 8 q + 7 give
__device__ __forceinline__ void ldmatrix_x4(u32 a, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}

// A lane's weight words of one tile (LU 16-byte loads) in the order a_frag_step reads them
template <int LU>
__device__ __forceinline__ void tile_words(const uint4 (&v)[LU], u32 (&w)[4 * LU]) {
#pragma unroll
  for (int l = 0; l < LU; ++l) {
    w[4 * l] = v[l].x;
    w[4 * l + 1] = v[l].y;
    w[4 * l + 2] = v[l].z;
    w[4 * l + 3] = v[l].w;
  }
}

// The four A registers of step s from the lane's words w (int4: w[s]; int8: w[2s], w[2s + 1]).
// q0 / z0: row g's group constants, q1 / z1: row g + 8's (z = the zero point used, 8 / 128 for sym and
// offset). SCALED: A holds dequantized weights (q - z) * s (+ m + z s); else the exact integers q - z.
template <int BITS, int ACT, int MODE, bool SCALED, int NW>
__device__ __forceinline__ void a_frag_step(const u32 (&w)[NW], int s, const RowQ<ACT, MODE>& q0,
                                            const RowQ<ACT, MODE>& q1, float z0, float z1, u32 (&a)[4]) {
  auto fin0 = [&](u32 d) { return SCALED ? q0.finish(d) : d; };
  auto fin1 = [&](u32 d) { return SCALED ? q1.finish(d) : d; };
  if (BITS == 4) {
    const u32 ws = w[s];
    if (ACT == 0) {
      const u32 w8 = ws >> 8;  // the only shift for fp16
      a[0] = fin0(hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(ws), q0.zlo));
      a[1] = fin1(hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(ws), 0x2c002c00u, q1.zhi));
      a[2] = fin0(hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(w8), q0.zlo));
      a[3] = fin1(hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(w8), 0x2c002c00u, q1.zhi));
    } else {
      // bf16 has 7 mantissa bits: magic 0x4300 (128, ulp 1) takes only the low nibble of each
      // half, so three shifts bring nibbles 1..3 down; fma(v, 1, -(128 + z)) is exact.
      a[0] = fin0(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws), 0x3f803f80u, q0.zlo));
      a[1] = fin1(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws >> 4), 0x3f803f80u, q1.zlo));
      a[2] = fin0(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws >> 8), 0x3f803f80u, q0.zlo));
      a[3] = fin1(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws >> 12), 0x3f803f80u, q1.zlo));
    }
  } else {
    const u32 r0 = w[2 * s], r1 = w[2 * s + 1];
    if (ACT == 0) {
      a[0] = fin0(hsub2(prmt<0x5140>(r0, 0x64646464u), q0.zlo));
      a[1] = fin1(hsub2(prmt<0x5140>(r1, 0x64646464u), q1.zlo));
      a[2] = fin0(hsub2(prmt<0x5342>(r0, 0x64646464u), q0.zlo));
      a[3] = fin1(hsub2(prmt<0x5342>(r1, 0x64646464u), q1.zlo));
    } else {
      // bf16 cannot hold 128 + u exactly for u > 127: go through fp32 2^23 + u (exact).
      const float zz0 = -(0x1p23f + z0);
      const float zz1 = -(0x1p23f + z1);
      float f[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        f[0][i] = as_f32(i == 0 ? prmt<0x7540>(r0, 0x4B000000u) : prmt<0x7541>(r0, 0x4B000000u)) + zz0;
        f[1][i] = as_f32(i == 0 ? prmt<0x7540>(r1, 0x4B000000u) : prmt<0x7541>(r1, 0x4B000000u)) + zz1;
        f[2][i] = as_f32(i == 0 ? prmt<0x7542>(r0, 0x4B000000u) : prmt<0x7543>(r0, 0x4B000000u)) + zz0;
        f[3][i] = as_f32(i == 0 ? prmt<0x7542>(r1, 0x4B000000u) : prmt<0x7543>(r1, 0x4B000000u)) + zz1;
      }
      // q - z (|.| <= 255) is exact in bf16 too: pack, then the shared finish
      a[0] = fin0(f32_to_bf2(f[0][0], f[0][1]));
      a[1] = fin1(f32_to_bf2(f[1][0], f[1][1]));
      a[2] = fin0(f32_to_bf2(f[2][0], f[2][1]));
      a[3] = fin1(f32_to_bf2(f[3][0], f[3][1]));
    }
  }
}

}  // namespace mg
