// mixgemm weight-only GEMM for small M (prefill chunks, batched decode: M ~ 17..128) on tensor cores,
// fp16 / bf16 activations, int4 / int8 weights in the "gemv_mma_v1" layout (the same weight the
// tensor-core GEMV reads, mixgemm/formats/layouts.py).
// Status (H200, benchmarks/gemm_mma_notes.md): correct on every format; 0.4x-1.1x of fp16 cuBLAS, i.e. NOT
// yet the speed issue 5 asks for (mma.sync issue rate and per-stage instruction count are the limits).
//
// Why a separate kernel from gemv_mma.cu: the GEMV's warps read their activations straight from global
// memory, one 16-row weight tile at a time; at M = 32 those x bytes exceed the tile's weight bytes 8x.
// Here (Marlin's plan, own code) a block of GM_W warps owns GM_W * GM_R 16-row tiles and one M tile of
// 8 * GM_MB activation rows; the activation chunk [M tile x GM_SK k-tiles] is copied ONCE per block into
// shared memory and read by every warp, so x traffic per weight byte drops by the block's row count.
//
// Per block and stage: the weights of its tiles (GM_W * GM_R * GM_SK * 512 bytes, contiguous per row
// tile in the layout) and the x chunk go global -> shared with cp.async into a GM_ST-deep ring, so
// ~GM_ST - 1 stages of HBM reads are in flight without costing registers. Warps then read their 16-byte
// weight fragment and 16-byte activation pieces with ld.shared.v4 (conflict-free, see XROW), dequantize
// with the magic-number tricks of gemv_mma.cu (lop3 / prmt, one sub and one mul per pair) and issue
// mma.sync m16n8k16 in the "swap AB" orientation: A = 16 weight rows, B = 8 activation rows, C = y^T.
//
// Fragment / k order (same as gemv_mma.cu, so the layout is shared): lane (g = lane / 4, t = lane % 4)
// of a k-tile covers k = KL t .. KL t + KL - 1 (KL = 16 int4, 8 int8) of rows g and g + 8; in mma step s,
// mma k (2t, 2t+1) = KL t + 4s + (0, 1) and mma k (2t+8, 2t+9) = KL t + 4s + (2, 3), for A and B alike
// (the product does not depend on the k order). So lane (g, t)'s B registers of a k-tile are ONE
// contiguous 2 KL-byte piece of activation row 8b + g: two (int4) or one (int8) ld.shared.v4, no
// ldmatrix needed (ldmatrix would hand out the unpermuted k order).
//
// Split-K: grid.z splits the k-tiles; each split block leaves its fp32 partial tile in a workspace, the
// last block to arrive (atomic ticket per output tile) adds the partials in split order (deterministic),
// applies bias + clamp, stores, and resets the ticket (so no memset is needed, graph replays included).

// Self-contained on purpose (no gemv_common.cuh): the GEMV's shared header changes independently, and
// every helper here lives in namespace gmm so no name can collide.

#ifndef GM_BITS
#define GM_BITS 4
#endif
#ifndef GM_ACT
#define GM_ACT 0
#endif
#ifndef GM_SCL
#define GM_SCL 0
#endif
#ifndef GM_MODE
#define GM_MODE 0
#endif
#ifndef GM_MB
#define GM_MB 8
#endif
#ifndef GM_W
#define GM_W 8
#endif
#ifndef GM_R
#define GM_R 2
#endif
#ifndef GM_SK
#define GM_SK 2
#endif
#ifndef GM_ST
#define GM_ST 4
#endif
#ifndef GM_MINB
#define GM_MINB 1
#endif
#ifndef GM_PRE
#define GM_PRE 0
#endif

#define GM_THREADS (32 * GM_W)

namespace gmm {

typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ float as_f32(u32 u) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
}
// (a & MASK) | MAGIC in one lop3 (immLut 0xEA = (0xF0 & 0xCC) | 0xAA): one instruction turns two
// nibbles into two fp16 (or bf16) "magic + q" numbers, no shifts, no int->float convert.
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

template <int SCL>
__device__ __forceinline__ float scl_to_f32(u32 bits16or32) {
  if (SCL == 0) return h_to_f32((u16)bits16or32);
  if (SCL == 1) return bf_to_f32((u16)bits16or32);
  return as_f32(bits16or32);
}

// Per-(row, group) parameters (the gemv_v1 params tensor), loaded raw (one 2-, 4- or 8-byte load
// through the read-only path: a row's params are re-read by every k-tile of its group), then decoded.
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
  __device__ __forceinline__ float scale() const { return scl_to_f32<SCL>(a); }
  __device__ __forceinline__ float second() const { return scl_to_f32<SCL>(b); }
};

// not volatile: pure arithmetic, free to interleave with the dequantization of the next fragment
template <int ACT>
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if (ACT == 0)
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

// generic -> shared-window address (cp.async and ld.shared take 32-bit shared addresses)
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{.reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a;}" : "=r"(r) : "l"(p));
  return r;
}
// 16-byte global -> shared copy that bypasses registers and L1 (.cg): the copy engine keeps stages in
// flight while the warps compute. src_bytes = 0 zero-fills (k-tiles past this split's range).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

__device__ __forceinline__ uint4 lds128(u32 a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
// partials of other blocks: read from L2 (.cg), never from a possibly stale L1 line
__device__ __forceinline__ float ldcg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// Per-row dequantization constants for one group, in the activation's 16-bit type (as gemv_mma.cu).
template <int ACT, int MODE>
struct RowQ {
  u32 zlo, zhi, s2, off2;
  __device__ __forceinline__ void set(float s, float zc, float m) {
    if (ACT == 0) {
      zlo = f32_to_h2(1024.f + zc);      // (1024 + q) - (1024 + z) = q - z, exact
      zhi = f32_to_h2(-(64.f + zc));     // (1024 + 16q) / 16 - (64 + z) = q - z, exact
      s2 = f32_to_h2(s);
      off2 = MODE == 2 ? f32_to_h2(fmaf(zc, s, m)) : 0u;
    } else {
      const u32 nz = f32_to_bf2(-(128.f + zc), -(128.f + zc));  // bf16 128 has ulp 1: exact
      zlo = nz;
      zhi = 0u;
      s2 = f32_to_bf2(s, s);
      off2 = MODE == 2 ? f32_to_bf2(fmaf(zc, s, m), fmaf(zc, s, m)) : 0x80008000u;  // -0: exact mul
    }
  }
  // d = exact (q - zc) pair -> dequantized pair
  __device__ __forceinline__ u32 finish(u32 d) const {
    if (ACT == 0) return MODE == 2 ? hfma2(d, s2, off2) : hmul2(d, s2);
    return bfma2(d, s2, off2);
  }
};

}  // namespace gmm

using namespace gmm;

extern "C" __global__ void __launch_bounds__(GM_THREADS, GM_MINB)
mixgemm_gemm_mma(const uint4* __restrict__ W,      // [Nt][Kt][32] uint4 (gemv_mma_v1)
                 const char* __restrict__ params,  // [N, G] groups of Param::PB bytes
                 const uint4* __restrict__ X,      // [M, ldx4] uint4, zero-padded to Kp
                 int ldx4,
                 void* __restrict__ Y, int ldy,    // [M, ldy] activation dtype
                 const void* __restrict__ bias, int bias_kind,
                 float lo, float hi,
                 int N, int Kt, int G, int gk,     // gk: group of k is min(k >> gk, G - 1)
                 int M,
                 int kps,                          // k-tiles per split (grid.z splits)
                 float* __restrict__ ws,           // split partials [splits][tiles][MT][BR] fp32
                 int* __restrict__ tickets) {      // [tiles] int, zero between launches
  constexpr int BITS = GM_BITS, ACT = GM_ACT, SCL = GM_SCL, MODE = GM_MODE;
  constexpr int MB = GM_MB, NW = GM_W, R = GM_R, SK = GM_SK, ST = GM_ST;
  constexpr int KT = BITS == 4 ? 64 : 32, KL = KT / 4;
  constexpr int MT = 8 * MB;             // activation rows per block
  constexpr int TR = NW * R;             // 16-row tiles per block
  constexpr int BR = 16 * TR;            // weight rows per block
  constexpr int XKT = KT * 2 / 16;       // uint4 of one activation row per k-tile (8 int4, 4 int8)
  // Activation row pitch in shared memory (bytes): one warp-wide ld.shared.v4 runs as 4 phases of 8
  // lanes = rows g, g + 1 x t = 0..3. int4 lanes read 32t (+16) within the row, so row g + 1 must sit
  // 16 bytes further mod 128 to fill the other banks; int8 lanes read 16t, so g + 1 sits at +64 mod 128.
  constexpr int XRAW = SK * KT * 2;
  constexpr int XTGT = BITS == 4 ? 16 : 64;
  constexpr int XROW = XRAW + ((XTGT - XRAW % 128) + 128) % 128;
  constexpr int XROW4 = XROW / 16;
  constexpr int WST4 = TR * SK * 32;     // uint4 of weights per stage
  constexpr int STG4 = WST4 + MT * XROW4;  // uint4 per stage
  constexpr float ZBIAS = BITS == 4 ? 8.f : 128.f;
  typedef Param<SCL, MODE> P;

  extern __shared__ uint4 smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, rblk = blockIdx.y, split = blockIdx.z;
  const int m0 = mtile * MT;
  const int Nt = (N + 15) >> 4;
  const int kbeg = split * kps;
  const int kend = min(Kt, kbeg + kps);
  const int nstage = (kend - kbeg + SK - 1) / SK;
  const u32 sbase = smem_addr(smem);

  // ---- global -> shared copy of stage i (k-tiles kbeg + i SK ..) into ring slot i % ST
#if GM_PRE
  // Each thread's cp.async chunks never change across stages except by the stage's k offset: their source
  // offsets (32-bit, in uint4) and k-tile index are computed once here, so a stage costs a few integer ops
  // per 16-byte copy instead of the div / mod / clamp / 64-bit math of the generic loop (SASS showed ~1/3
  // of a stage's instructions there). Same addresses as the #else branch (tests/test_gemm_mma.py emulates both).
  constexpr int XC = MT * SK * XKT;
  constexpr int WU = (WST4 + GM_THREADS - 1) / GM_THREADS;  // = R * SK exactly (WST4 = 32 W R SK)
  constexpr int XU = (XC + GM_THREADS - 1) / GM_THREADS;
  const int klen = kend - kbeg;
  u32 woff[WU], xoff[XU], xdst[XU];
  int wj[WU], xj[XU];
#pragma unroll
  for (int u = 0; u < WU; ++u) {
    const int c = tid + u * GM_THREADS;
    const int tr = c / (SK * 32), l = c % 32;
    const int nt = min(rblk * TR + tr, Nt - 1);  // tiles past the last are recomputed, never stored
    wj[u] = (c / 32) % SK;
    woff[u] = (u32)(((size_t)nt * Kt + kbeg) * 32 + l);
  }
#pragma unroll
  for (int u = 0; u < XU; ++u) {
    const int c = min(tid + u * GM_THREADS, XC - 1);
    const int m = c / (SK * XKT), q = c % (SK * XKT);
    xj[u] = tid + u * GM_THREADS < XC ? q / XKT : (1 << 30);  // past the chunk: never copied
    xoff[u] = (u32)((size_t)min(m0 + m, M - 1) * ldx4 + (size_t)kbeg * XKT + q % XKT);
    xdst[u] = (u32)(WST4 + m * XROW4 + q) * 16u;
  }
  auto copy_stage = [&](int i) {
    const u32 dst = sbase + (u32)((i % ST) * STG4) * 16u;
#pragma unroll
    for (int u = 0; u < WU; ++u) {
      const int kk = i * SK + wj[u];  // k-tile within the split
      const bool ok = kk < klen;
      cp_async16(dst + (u32)(tid + u * GM_THREADS) * 16u, W + (ok ? woff[u] + (u32)kk * 32u : woff[u]), ok ? 16 : 0);
    }
#pragma unroll
    for (int u = 0; u < XU; ++u) {
      if (xj[u] >= (1 << 30)) continue;
      const int kk = i * SK + xj[u];
      const bool ok = kk < klen;
      cp_async16(dst + xdst[u], X + (ok ? xoff[u] + (u32)kk * (u32)XKT : xoff[u]), ok ? 16 : 0);
    }
  };
#else
  auto copy_stage = [&](int i) {
    const int kt0 = kbeg + i * SK;
    const u32 dst = sbase + (u32)((i % ST) * STG4) * 16u;
    // weights: TR row tiles x SK contiguous 512-byte k-tiles; consecutive threads, consecutive 16 B
#pragma unroll
    for (int c = tid; c < WST4; c += GM_THREADS) {
      const int tr = c / (SK * 32), j = (c / 32) % SK, l = c % 32;
      const int nt = min(rblk * TR + tr, Nt - 1);  // tiles past the last are recomputed, never stored
      const int kt = kt0 + j;
      const bool ok = kt < kend;
      const uint4* src = W + ((size_t)nt * Kt + (ok ? kt : kbeg)) * 32 + l;
      cp_async16(dst + (u32)c * 16u, src, ok ? 16 : 0);
    }
    // activations: MT rows x SK * XKT uint4 (rows past M repeat row M - 1, never stored)
    constexpr int XC = MT * SK * XKT;
#pragma unroll
    for (int c = tid; c < XC; c += GM_THREADS) {
      const int m = c / (SK * XKT), q = c % (SK * XKT);
      const int kt = kt0 + q / XKT;
      const bool ok = kt < kend;
      const uint4* src = X + (size_t)min(m0 + m, M - 1) * ldx4 + (size_t)(ok ? kt : kbeg) * XKT + q % XKT;
      cp_async16(dst + (u32)(WST4 + m * XROW4 + q) * 16u, src, ok ? 16 : 0);
    }
  };

#endif

  // ---- per-lane params of a stage: rows g / g + 8 of each of the warp's R tiles, for each k-tile
  const char* prow[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int nt = min(rblk * TR + warp * R + r, Nt - 1);
    prow[r][0] = params + (size_t)min(nt * 16 + g, N - 1) * G * P::PB;
    prow[r][1] = params + (size_t)min(nt * 16 + g + 8, N - 1) * G * P::PB;
  }
  auto load_params = [&](P (&p)[R][SK][2], int i) {
#pragma unroll
    for (int j = 0; j < SK; ++j) {
      const int kt = kbeg + i * SK + j;
      const int grp = min((kt * KT + KL * t) >> gk, G - 1);  // one lane's KL k lie in one group
#pragma unroll
      for (int r = 0; r < R; ++r) {
        p[r][j][0].load(prow[r][0], grp);
        p[r][j][1].load(prow[r][1], grp);
      }
    }
  };

  float acc[R][MB][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < MB; ++b) acc[r][b][0] = acc[r][b][1] = acc[r][b][2] = acc[r][b][3] = 0.f;

  // ---- one stage of math: warp's R tiles x SK k-tiles x MB n8 blocks
  auto compute = [&](int i, const P (&p)[R][SK][2]) {
    const u32 sw = sbase + (u32)((i % ST) * STG4) * 16u;
    const u32 sx = sw + (u32)WST4 * 16u;
#pragma unroll
    for (int j = 0; j < SK; ++j) {
      if (kbeg + i * SK + j >= kend) break;  // block-uniform: the partial last stage
      uint4 wv[R];
      RowQ<ACT, MODE> q0[R], q1[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[r] = lds128(sw + (u32)(((warp * R + r) * SK + j) * 32 + lane) * 16u);
        const float s0 = p[r][j][0].scale(), s1 = p[r][j][1].scale();
        const float z0 = MODE == 1 ? p[r][j][0].second() : ZBIAS, z1 = MODE == 1 ? p[r][j][1].second() : ZBIAS;
        q0[r].set(s0, z0, MODE == 2 ? p[r][j][0].second() : 0.f);
        q1[r].set(s1, z1, MODE == 2 ? p[r][j][1].second() : 0.f);
      }
      constexpr int PAIRS = BITS == 4 ? 2 : 1;  // uint4 of activations per lane, k-tile and n8 block
#pragma unroll
      for (int sp = 0; sp < PAIRS; ++sp) {
        uint4 xv[MB];
#pragma unroll
        for (int b = 0; b < MB; ++b)
          xv[b] = lds128(sx + (u32)((8 * b + g) * XROW4 + j * XKT + (BITS == 4 ? 2 * t + sp : t)) * 16u);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int s = 2 * sp + h;  // mma step within the k-tile
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const u32 w[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
            u32 a[4];  // a0: row g k(0,1); a1: row g+8 k(0,1); a2: row g k(2,3); a3: row g+8 k(2,3)
            if (BITS == 4) {
              const u32 ws_ = w[s];
              if (ACT == 0) {
                const u32 w8 = ws_ >> 8;  // the only shift for fp16
                a[0] = q0[r].finish(hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(ws_), q0[r].zlo));
                a[1] = q1[r].finish(hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(ws_), 0x2c002c00u, q1[r].zhi));
                a[2] = q0[r].finish(hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(w8), q0[r].zlo));
                a[3] = q1[r].finish(hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(w8), 0x2c002c00u, q1[r].zhi));
              } else {
                // bf16 has 7 mantissa bits: magic 0x4300 (128, ulp 1) takes only the low nibble of each
                // half, so three shifts bring nibbles 1..3 down; fma(v, 1, -(128 + z)) is exact.
                a[0] = q0[r].finish(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws_), 0x3f803f80u, q0[r].zlo));
                a[1] = q1[r].finish(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws_ >> 4), 0x3f803f80u, q1[r].zlo));
                a[2] = q0[r].finish(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws_ >> 8), 0x3f803f80u, q0[r].zlo));
                a[3] = q1[r].finish(bfma2(lop3_and_or<0x000f000fu, 0x43004300u>(ws_ >> 12), 0x3f803f80u, q1[r].zlo));
              }
            } else {
              const u32 r0 = w[2 * s], r1 = w[2 * s + 1];
              if (ACT == 0) {
                a[0] = q0[r].finish(hsub2(prmt<0x5140>(r0, 0x64646464u), q0[r].zlo));
                a[1] = q1[r].finish(hsub2(prmt<0x5140>(r1, 0x64646464u), q1[r].zlo));
                a[2] = q0[r].finish(hsub2(prmt<0x5342>(r0, 0x64646464u), q0[r].zlo));
                a[3] = q1[r].finish(hsub2(prmt<0x5342>(r1, 0x64646464u), q1[r].zlo));
              } else {
                // bf16 cannot hold 128 + u exactly for u > 127: go through fp32 2^23 + u (exact).
                const float zz0 = -(0x1p23f + (MODE == 1 ? p[r][j][0].second() : ZBIAS));
                const float zz1 = -(0x1p23f + (MODE == 1 ? p[r][j][1].second() : ZBIAS));
                float f[4][2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  f[0][e] = as_f32(e == 0 ? prmt<0x7540>(r0, 0x4B000000u) : prmt<0x7541>(r0, 0x4B000000u)) + zz0;
                  f[1][e] = as_f32(e == 0 ? prmt<0x7540>(r1, 0x4B000000u) : prmt<0x7541>(r1, 0x4B000000u)) + zz1;
                  f[2][e] = as_f32(e == 0 ? prmt<0x7542>(r0, 0x4B000000u) : prmt<0x7543>(r0, 0x4B000000u)) + zz0;
                  f[3][e] = as_f32(e == 0 ? prmt<0x7542>(r1, 0x4B000000u) : prmt<0x7543>(r1, 0x4B000000u)) + zz1;
                }
                // q - z (|.| <= 255) is exact in bf16 too: pack, then the shared finish
                a[0] = q0[r].finish(f32_to_bf2(f[0][0], f[0][1]));
                a[1] = q1[r].finish(f32_to_bf2(f[1][0], f[1][1]));
                a[2] = q0[r].finish(f32_to_bf2(f[2][0], f[2][1]));
                a[3] = q1[r].finish(f32_to_bf2(f[3][0], f[3][1]));
              }
            }
            // B registers of step s: bytes 8 (s % 2) .. + 7 of the lane's uint4 of this pair
#pragma unroll
            for (int b = 0; b < MB; ++b)
              mma16816<ACT>(acc[r][b], a, h == 0 ? xv[b].x : xv[b].z, h == 0 ? xv[b].y : xv[b].w);
          }
        }
      }
    }
  };

  // ---- the pipeline: ST - 1 stages in flight ahead of the math; one commit group per stage (empty
  // groups keep the counting uniform), params one stage ahead in registers
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    if (i < nstage) copy_stage(i);
    cp_async_commit();
  }
  P pc[R][SK][2], pn[R][SK][2];
  load_params(pc, 0);
  for (int i = 0; i < nstage; ++i) {
    cp_async_wait<ST - 2>();  // stage i has landed (this thread's copies) ...
    __syncthreads();          // ... everyone's, and slot (i - 1) % ST is free again
    if (i + ST - 1 < nstage) copy_stage(i + ST - 1);
    cp_async_commit();
    if (i + 1 < nstage) load_params(pn, i + 1);
    compute(i, pc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < SK; ++j) {
        pc[r][j][0] = pn[r][j][0];
        pc[r][j][1] = pn[r][j][1];
      }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it for the output tile

  // ---- epilogue: C fragment c0 = (row g, m 2t), c1 = (row g, m 2t+1), c2 = (row g+8, m 2t),
  // c3 = (row g+8, m 2t+1) -> red[m][row] in shared memory (pitch BR + 4 floats: the 8 g x 4 t lanes of
  // one store hit 32 different banks), then coalesced along n.
  constexpr int RP = BR + 4;
  float* red = (float*)smem;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = (warp * R + r) * 16 + g;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + 2 * t;
      red[m * RP + row] = acc[r][b][0];
      red[(m + 1) * RP + row] = acc[r][b][1];
      red[m * RP + row + 8] = acc[r][b][2];
      red[(m + 1) * RP + row + 8] = acc[r][b][3];
    }
  }
  __syncthreads();

  const int nsplit = gridDim.z;
  const int tile = rblk * gridDim.x + mtile;
  const size_t tiles = (size_t)gridDim.x * gridDim.y;
  if (nsplit > 1) {
    float* mine = ws + ((size_t)split * tiles + tile) * (MT * BR);
    for (int idx = tid; idx < MT * BR; idx += GM_THREADS) mine[idx] = red[(idx / BR) * RP + idx % BR];
    __threadfence();  // partial visible GPU-wide before the ticket says so
    __syncthreads();
    __shared__ int last;
    if (tid == 0) {
      const int tk = atomicAdd(tickets + tile, 1);
      last = tk == nsplit - 1;
      if (last) tickets[tile] = 0;  // self-reset for the next launch (stream order)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // acquire side: the other blocks' partials
  }
  const int n0 = rblk * BR;
  for (int idx = tid; idx < MT * BR; idx += GM_THREADS) {
    const int m = idx / BR, j = idx % BR;  // consecutive threads: consecutive n
    const int n = n0 + j;
    if (n >= N || m0 + m >= M) continue;
    float v;
    if (nsplit > 1) {
      v = 0.f;
      for (int sp = 0; sp < nsplit; ++sp)  // split order: the same sum whichever block came last
        v += sp == split ? red[m * RP + j] : ldcg_f32(ws + ((size_t)sp * tiles + tile) * (MT * BR) + idx);
    } else {
      v = red[m * RP + j];
    }
    if (bias_kind == 1) v += h_to_f32(((const u16*)bias)[n]);
    else if (bias_kind == 2) v += bf_to_f32(((const u16*)bias)[n]);
    else if (bias_kind == 3) v += ((const float*)bias)[n];
    if (v < lo) v = lo;  // compares, not fminf/fmaxf: NaN propagates like torch.clamp
    if (v > hi) v = hi;
    u16 hv;
    if (ACT == 0) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hv) : "f"(v));
    else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hv) : "f"(v));
    ((u16*)Y)[(size_t)(m0 + m) * ldy + n] = hv;
  }
}

#ifdef GM_PEAK
// Micro-benchmark (scripts/bench_gemm_mma.py --mma-peak): the raw mma.sync m16n8k16 (fp32 accumulate) rate of
// the GPU, independent of any memory traffic: GM_PEAK independent accumulator chains per warp, operands in
// registers, `iters` rounds. Its result bounds what any mma.sync GEMM (this kernel) can reach.
extern "C" __global__ void mixgemm_mma_peak(float* __restrict__ out, int iters, u32 seed) {
  constexpr int C = GM_PEAK;
  float acc[C][4];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  const u32 v = seed ^ (threadIdx.x * 0x9E3779B9u);
  const u32 a[4] = {v & 0x3bff3bffu, (v >> 1) & 0x3bff3bffu, (v >> 2) & 0x3bff3bffu, (v >> 3) & 0x3bff3bffu};
  const u32 b0 = (v >> 4) & 0x3bff3bffu, b1 = (v >> 5) & 0x3bff3bffu;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < C; ++c) mma16816<GM_ACT>(acc[c], a, b0, b1);
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the math alive
}
#endif
