// The M = 1 math of one wgmma_v1 tile (16 rows x 64 k) on CUDA cores, shared by the GEMVs that read that layout a
// tile at a time (gemv_wg_simt.cu from registers, gemv_wg_stream.cu from a shared-memory ring).
//
// Lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 at k 16 s + 2 t + (0, 1) and 16 s + 2 t + 8 + (0, 1),
// s = 0..3 (mma_frag.cuh a_frag_step turns one step into four exact q - z pairs). x: each lane has loaded word `lane`
// of the k-tile's 64 activations (the warp's 128 coalesced bytes) and takes the 8 words its pairs meet (words 8 s + t
// and 8 s + t + 4) by __shfl_sync, once for all the tiles of that k-tile it multiplies. Per tile and row the
// products are summed in f16x2 over the 64 k, then scaled once in fp32 (twice at groups of 32).
#pragma once

#include "mma_frag.cuh"

namespace mg {

// One k-tile's x as lane (g, t)'s pairs meet it: w[2 s], w[2 s + 1] = x pairs k 16 s + 2 t and 16 s + 2 t + 8 (fp16),
// unit = what one unit of those words is worth (1, or bf16's power of two below)
struct TileX {
  u32 w[8];
  float unit;
};

template <int ACT>
__device__ __forceinline__ TileX tile_x(u32 xu, int t) {
  TileX x;
  x.unit = 1.f;
  if constexpr (ACT == 1) {
    // bf16 x as exact fp16: the tile's largest exponent e (one redux over the warp's 64 values) sets a power of
    // two that takes its largest |x| into [8, 16). bf16's 8 significant bits fit fp16's 11, so every value down
    // to 2^-17 of that maximum converts exactly (smaller ones round as fp16 subnormals, below what a bf16 result
    // keeps), and 8 products of |q - z| <= 255 stay under fp16's 65504: the f16x2 math of fp16 x, at its speed.
    // e is clamped to [8, 254] so both powers are normal fp32 (all-zero tiles stay zero, inf / nan propagate).
    const u32 e = max((xu >> 7) & 0xffu, (xu >> 23) & 0xffu);
    const int em = min(max((int)__reduce_max_sync(0xffffffffu, e), 8), 254);
    const float to16 = as_f32((u32)(257 - em) << 23);  // 2^(130 - em)
    x.unit = as_f32((u32)(em - 3) << 23);               // 2^(em - 130)
    u32 h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(as_f32(xu & 0xffff0000u) * to16), "f"(as_f32(xu << 16) * to16));
    xu = h;
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    x.w[2 * s] = __shfl_sync(0xffffffffu, xu, 8 * s + t);
    x.w[2 * s + 1] = __shfl_sync(0xffffffffu, xu, 8 * s + t + 4);
  }
  return x;
}

// acc[0] / acc[1] (rows g / g + 8) += the tile's dot with x: wv the lane's LU uint4 of the tile, p0 / p1 rows g / g + 8's
// parameters (NP sets: 2 at groups of 32 on a 64-k tile)
template <int BITS, int SCL, int MODE, int NP, int LU, class P>
__device__ __forceinline__ void tile_dot(const uint4 (&wv)[LU], const P (&p0)[NP], const P (&p1)[NP], const TileX& x,
                                         float (&acc)[2]) {
  constexpr int SPP = 4 / NP;  // k16 steps per parameter set
  constexpr float ZBIAS = BITS == 4 ? 8.f : 128.f;
  u32 w[4 * LU];
  tile_words(wv, w);
#pragma unroll
  for (int h = 0; h < NP; ++h) {
    const P& q0p = p0[h];
    const P& q1p = p1[h];
    RowQ<0, MODE> q0, q1;  // fp16 math for both activation dtypes
    const float s0 = q0p.scale(), s1 = q1p.scale();
    const float z0 = MODE == 1 ? q0p.second() : ZBIAS, z1 = MODE == 1 ? q1p.second() : ZBIAS;
    if (MODE != 1) {  // the fixed centre: compile-time magic-number constants, no cvt
      q0.zlo = q1.zlo = h16_int(1024 + (int)ZBIAS) * 0x10001u;
      q0.zhi = q1.zhi = h16_int(-(64 + (int)ZBIAS)) * 0x10001u;
    } else if (SCL == 0) {
      // fp16 zero points: 1024 + z and -(64 + z) in f16x2 from the raw bits (small integers: exact), no cvt
      const u32 z20 = q0p.second_x2(), z21 = q1p.second_x2();
      q0.zlo = hadd2(z20, 0x64006400u);
      q1.zlo = hadd2(z21, 0x64006400u);
      q0.zhi = hsub2(0xd400d400u, z20);
      q1.zhi = hsub2(0xd400d400u, z21);
    } else {
      q0.set_exact(z0);
      q1.set_exact(z1);
    }
    u32 h0[2] = {0u, 0u}, h1[2] = {0u, 0u}, hx = 0u;  // two f16x2 chains per row (shorter dependency)
#pragma unroll
    for (int s = h * SPP; s < (h + 1) * SPP; ++s) {
      u32 a[4];  // a0: row g pair 0; a1: row g + 8 pair 0; a2: row g pair 1; a3: row g + 8 pair 1
      a_frag_step<BITS, 0, MODE, false>(w, s, q0, q1, z0, z1, a);
      h0[0] = hfma2(a[0], x.w[2 * s], h0[0]);
      h0[1] = hfma2(a[2], x.w[2 * s + 1], h0[1]);
      h1[0] = hfma2(a[1], x.w[2 * s], h1[0]);
      h1[1] = hfma2(a[3], x.w[2 * s + 1], h1[1]);
      if (MODE == 2) hx = hadd2(hx, hadd2(x.w[2 * s], x.w[2 * s + 1]));
    }
    // the chains meet in f16x2 (8 products a half, fewer than gemv.cu's chunk sums), then one widening: rows g,
    // g + 8: sum of (q - z) x over this piece; xs: sum of x (offset)
    const float c0 = h2sum_f32(hadd2(h0[0], h0[1])), c1 = h2sum_f32(hadd2(h1[0], h1[1]));
    const float xs = MODE == 2 ? h2sum_f32(hx) : 0.f;
    // x's unit on the sums, not the scales: c x unit is the piece's true dot, normal wherever that is
    acc[0] = fmaf(s0, c0 * x.unit, acc[0]);
    acc[1] = fmaf(s1, c1 * x.unit, acc[1]);
    if (MODE == 2) {
      acc[0] = fmaf(fmaf(z0, s0, q0p.second()), xs * x.unit, acc[0]);
      acc[1] = fmaf(fmaf(z1, s1, q1p.second()), xs * x.unit, acc[1]);
    }
  }
}

}  // namespace mg
