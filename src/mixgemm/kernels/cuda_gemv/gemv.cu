// mixgemm weight-only GEMV for decode: y[M, N] = clamp(x[M, K] @ dequant(W[N, K]).T + bias), M = 1..16.
//
// Why CUDA C++ with inline PTX and not Triton: on the H200 of benchmarks/benchmark-protocol.md a plain
// Triton GEMV (shift/mask unpack, convert, tl.sum) reached 15-27% of copy bandwidth and gemlite's tuned
// Triton W4 ~42% (its W4 time equals its W8 time: the unpack, not memory, limits it). The M = 1 budget is
// ~4 instructions per weight; Triton cannot emit lop3/prmt magic-number conversions or f16x2 FMAs
// over a chosen nibble order, which is what fits that budget.
//
// Compiled at run time by NVRTC (mixgemm/kernels/cuda/nvrtc.py); needs no CUDA header (raw PTX and
// 32-bit words only), so only libnvrtc is required. The template arguments arrive as -D macros.
//
// Weight layout ("gemv_v2", mixgemm/kernels/cuda_gemv/layout.py): the plain packing, so the layout is the weight's own
// buffer (no second copy). Row n is Kp * BITS / 8 bytes, 16-byte aligned; chunk c of a row = one uint4 = CH
// consecutive k (CH = 32 for int4, 16 for int8).
//   int8: byte j of a 32-bit word holds k = 4 * word + j.
//   int4: nibble p (bits 4p..4p+3) of a 32-bit word holds k = 8 * word + p, so (w & 0x000f000f) is the pair
//         (k0, k4), (w & 0x00f000f0) the pair (k1, k5) times 16, and w >> 8 gives (k2, k6), (k3, k7) the same
//         way. The fp16 path pairs x to match with four prmt per 8 k and activation row (shared by the R rows of
//         a lane), which costs nothing measurable against FasterTransformer's interleaved order (that order
//         needed a repacked copy of every weight).
// Params: per (row, group) one scale (MODE 0, "sym") or a pair (scale, z) (MODE 1, "zero_point") or
// (scale, m) (MODE 2, "offset"), in the scale dtype (SCL: 0 f16, 1 bf16, 2 f32). Group of chunk c is
// c >> gshift (gshift = 31 for per-channel: one group).
//
// Math. Per chunk and row: P = sum_k x_k * (q_k - zc), with zc = z (zero_point) or 2^(BITS-1)
// (sym; offset uses it as a centre), exact dequantized integers (q - zc), then in fp32
// acc += s * P (+ (m + zc * s) * sum_k x_k for offset). So scales and zeros are applied once per chunk
// (<= once per group), and acc runs in fp32 over the whole K.
//   ACT 0 (fp16 x): q - zc made in f16x2 (exact: |q - zc| <= 255), P in f16x2 over one chunk (32 or
//                   16 products per lane-half), then fp32.
//   ACT 1 (bf16 x), ACT 2 (fp32 x): q - zc made directly in fp32 by fp32 magic numbers (exact), P and
//                   everything else in fp32 (bf16 x2 math would round the running sum to 8 bits).

#include "gemv_common.cuh"
#if GEMV_BULK
#include "wgmma_common.cuh"  // mbarrier and bulk-copy helpers
#endif

#ifndef GEMV_BITS
#define GEMV_BITS 4
#endif
#ifndef GEMV_ACT
#define GEMV_ACT 0
#endif
#ifndef GEMV_SCL
#define GEMV_SCL 0
#endif
#ifndef GEMV_MODE
#define GEMV_MODE 0
#endif
#ifndef GEMV_M
#define GEMV_M 1
#endif
#ifndef GEMV_R
#define GEMV_R 1
#endif
#ifndef GEMV_U
#define GEMV_U 4
#endif
#ifndef GEMV_RG
#define GEMV_RG 8
#endif
#ifndef GEMV_KS
#define GEMV_KS 1
#endif
#ifndef GEMV_PF
#define GEMV_PF 1
#endif
// Lanes per weight row: 32, or 16 / 8 / 4, where a warp's lanes form 32 / LW groups, each with R rows of its own and
// the row's chunks striding over its LW lanes (tiles of RG x R x 32 / LW rows). Why: a lane's steps are round trips
// to memory that the whole warp waits for, and where a row's chunks are no multiple of KS x 32 (int4 K = 3584: 112
// chunks, 3.5 per lane) the last step is a part-empty round trip, for the lanes that have one more chunk than the
// others, after a divergent branch; over 16 lanes the same row is 7 whole steps. A warp also covers R x 32 / LW rows at
// R rows' registers (tile shapes between the R / KS steps). Register path only (not GEMV_BULK).
#ifndef GEMV_LW
#define GEMV_LW 32
#endif
// __launch_bounds__ minimum resident blocks per SM (0: none), caps the registers per thread.
#ifndef GEMV_MINB
#define GEMV_MINB 0
#endif
// 1 (fp16 activations, M = 1 only): the block first copies x into shared memory, piece-major
// (16-byte piece v of chunk c at v * Kc + c), and reads it from there. Why: a lane needs the 64
// contiguous bytes of x of its own chunk, so each 16-byte global load of a warp touches 16 different
// 128-byte lines (16 L1 wavefronts for 512 bytes); from the piece-major copy the same warp load is 512
// contiguous bytes (4 wavefronts). Needs K * 2 bytes of dynamic shared memory (the host only sets it
// when that fits). Act-order calls take it (gemv.py perm_config: the gather then reads shared memory); plain ones
// do not: on H200 it helped some R = 2 configs (up to 8%) but cost registers (80 -> 97) at R = 4 and never beat the
// R = 4 tiles.
#ifndef GEMV_XS
#define GEMV_XS 0
#endif
// 1: lighter per-chunk bookkeeping for fp16 activations with fp16 zero points: (1024 + z) and
// -(64 + z) built in f16x2 from the raw fp16 z (exact: small integers), and the two f16x2 partial
// chains added in f16x2 before the one conversion to fp32 (5 fewer instructions per row and chunk).
// Set where a tuning table measured it (tuning.gemv_m1); elsewhere within +-3% of 0 on H200.
#ifndef GEMV_LITE
#define GEMV_LITE 0
#endif

// 1 (zero_point weights, fp16 activations; config ZSUM): the chunk's products use the sym path's fixed centre c (8 /
// 128), sum_k x_k (q_k - z) = sum_k x_k (q_k - c) + (c - z) sum_k x_k, with the x sum made once per chunk and row
// of x and shared by the R weight rows, instead of per-row f16x2 zero constants held through the chunk. Why: those
// constants take registers (R 4 U 1: 73 against 64 with the x sum, the sym kernel's count; U 2: 101 against 80),
// which on some layers costs a resident block per SM (H100, M = 1, the same tile: 5120x13824 22.7 -> 17.6 us,
// 4096x14336 16.4 -> 14.7). The x sum costs instructions per chunk, so elsewhere it loses (1536x8960 5.0 -> 6.3 us):
// the tuning tables say where it runs (tuning.gemv_m1), and mixgemm tune tries both.
#ifndef GEMV_ZSUM
#define GEMV_ZSUM 0
#endif
#define GEMV_ZX (GEMV_ZSUM && GEMV_MODE == 1 && GEMV_ACT == 0)  // zero point by the x sum (fp16 x only)

// S > 0 (sm_90): warp-specialized bulk-copy ring of S stages. One producer warp streams each block's weight rows
// into shared memory with cp.async.bulk (one instruction per row and stage, completion counted on an mbarrier);
// the RG x KS consumer warps read their chunks from there and compute; the grid is persistent (blocks loop
// over row tiles, so the ring runs on across tiles). Why: with registers as the only load buffer, a warp has
// no load in flight while it does its math, and the register-fed kernel plateaued at 82.5% of the copy
// floor on H100 28672x8192 W4 while a no-math read of the same bytes in the same pattern reached 93-97%
// (docs/kernels/cuda_gemv.md). The ring keeps S stages of bytes in flight during the math.
#ifndef GEMV_BULK
#define GEMV_BULK 0
#endif
// 1 (with GEMV_BULK): the producer also bulk-copies each tile's parameters into shared memory (needs each row's
// parameters, G * PB bytes, to be a multiple of 16; the host checks).
#ifndef GEMV_BPAR
#define GEMV_BPAR 0
#endif

// 1: int8 codes in rows_v1 (mixgemm/formats/layouts_rows.py): a row's 16-byte chunks as in the plain codes, k permuted
// inside each (byte 4 w + i holds k 2 w + (i & 1) + 8 (i >> 1)), so a word's low half meets x pair w of the chunk's
// first 8 k and its high half pair w of the last 8 (a compile-time renaming: the same instructions as the plain codes);
// parameters in wgmma_v1's order, row n's group j at ((n >> 7) G + j) 128 + (n & 127) (per channel: row n, the plain
// order, so GEMV_BPAR's per-row copies hold; the host keeps BPAR off for groups). Why: an int8 weight kept in rows_v1
// (opt-in) holds one copy of its codes, which the wgmma GEMM and the tensor-core GEMV read too.
#ifndef GEMV_ROWS
#define GEMV_ROWS 0
#endif

// 1: act-order layer: the kernel multiplies x[perm[k]] (perm: the last kernel parameter, int32; gemv_common.cuh
// ld_perm / gather_x) where it reads x[k] otherwise. With GEMV_XS the block gathers x once while staging it into
// shared memory (K * 4 bytes there: x as it is, then gathered; the main loop is unchanged); without it each lane
// gathers its own pieces from global memory.
#ifndef GEMV_PERM
#define GEMV_PERM 0
#endif

#define GEMV_CTHREADS (32 * GEMV_RG * GEMV_KS)  // compute warps
#define GEMV_THREADS (GEMV_CTHREADS + (GEMV_BULK ? 32 : 0))


using namespace mg;

#if GEMV_MINB > 0
#define GEMV_BOUNDS __launch_bounds__(GEMV_THREADS, GEMV_MINB)
#else
#define GEMV_BOUNDS __launch_bounds__(GEMV_THREADS)
#endif
extern "C" __global__ void GEMV_BOUNDS
mixgemm_gemv(const uint4* __restrict__ W,      // [N, Kc] uint4
             const char* __restrict__ params,  // [N, G] groups of Param::PB bytes
             const uint4* __restrict__ X,      // [M, ldx4] uint4 (activations, zero-padded to Kp)
             int ldx4,                          // row stride of X in uint4
             void* __restrict__ Y,              // [M, ldy] in the activation dtype
             int ldy,
             const void* __restrict__ bias,     // [N] or null
             int bias_kind,                     // 0 none, 1 f16, 2 bf16, 3 f32
             float lo, float hi,                // output clamp
             int N, int Kc, int G, int gshift,
             int Mr,                            // rows of X and Y actually present, 1 <= Mr <= GEMV_M
             const int* __restrict__ perm) {    // GEMV_PERM: [Kp] input permutation (else unused, may be null)
  constexpr int BITS = GEMV_BITS, ACT = GEMV_ACT, SCL = GEMV_SCL, MODE = GEMV_MODE;
  constexpr int M = GEMV_M, R = GEMV_R, U = GEMV_U, RG = GEMV_RG, KS = GEMV_KS;
  constexpr int LW = GEMV_LW, HW = 32 / LW;  // lanes per row group, row groups per warp
  static_assert(LW == 32 || LW == 16 || LW == 8 || LW == 4, "GEMV_LW is 32, 16, 8 or 4");
  static_assert(LW == 32 || !GEMV_BULK, "GEMV_LW < 32: register path only");
  constexpr int XE = ACT == 2 ? 4 : 2;            // bytes per activation element
  constexpr int CH = BITS == 4 ? 32 : 16;         // k per chunk (one uint4 of weights)
  constexpr int XV = CH * XE / 16;                // uint4 of activations per chunk and row
  constexpr float ZBIAS = BITS == 4 ? 8.f : 128.f;
  typedef Param<SCL, MODE> P;
  constexpr bool ROWS = GEMV_ROWS != 0;
  static_assert(!ROWS || BITS == 8, "GEMV_ROWS: int8 codes");
  constexpr int PGS = ROWS ? 128 : 1;  // parameter entries from one group of a row to the next
  // row n's parameters (ROWS: wgmma_v1's order, group j at + j PGS entries)
  auto prow_of = [&](int n) -> const char* {
    return ROWS ? params + ((size_t)(n >> 7) * G * 128 + (n & 127)) * P::PB : params + (size_t)n * G * P::PB;
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp % RG, ks = warp / RG;
  const int sub = lane % LW, hset = lane / LW;  // lane within its row group, row group within the warp
  pdl_launch_dependents();
  // dynamic shared memory: the bulk ring [GEMV_BULK][RG * R][KS * 32 * U] (GEMV_BULK), two tiles' parameters
  // [2][RG * R][G * PB] bytes (GEMV_BPAR), then x (GEMV_XS)
  extern __shared__ __align__(128) uint4 dsm[];
  const int prow_bytes = G * P::PB;  // one row's parameters (GEMV_BPAR: a multiple of 16)
  char* const pbuf = (char*)(dsm + GEMV_BULK * RG * R * KS * 32 * U);
#if GEMV_XS
  static_assert(ACT == 0 && M == 1 && !GEMV_PF, "GEMV_XS: fp16 x, M = 1, PF off");
  // [XV][Kc]: x piece v of chunk c at v * Kc + c
  uint4* const xsm = (uint4*)(pbuf + (GEMV_BPAR ? 2 * RG * R * prow_bytes : 0));
  // batches of 4 loads per thread in flight before their stores (one L2 round trip per batch); the caller syncs
  auto copy_x = [&](uint4* dst, bool piece_major) {
    for (int p0 = threadIdx.x; p0 < Kc * XV; p0 += 4 * GEMV_CTHREADS) {
      uint4 t[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (p0 + i * GEMV_CTHREADS < Kc * XV) t[i] = ld_x(X + p0 + i * GEMV_CTHREADS);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int p = p0 + i * GEMV_CTHREADS;
        if (p < Kc * XV) dst[piece_major ? (p % XV) * Kc + p / XV : p] = t[i];
      }
    }
  };
#if GEMV_PERM
  // act-order: x is first copied as it is (coalesced) to xraw behind xsm, then piece p of xsm gathered from there:
  // x[perm[8p .. 8p + 7]]. Why from shared memory: a warp's 2-byte gather from global memory touches ~32 L1 lines
  // (one wavefront each), from shared memory a few bank conflicts; the host sizes the dynamic shared memory for both
  // copies and the indices.
  const u16* const xraw = (const u16*)(xsm + Kc * XV);
  // The indices (constant) are copied into shared memory behind xraw with cp.async before the PDL wait: their
  // round trip overlaps the wait and the x copy, and the gather after it reads only shared memory. Why: gathered
  // through indices read from L1 / L2 after the x copy (two dependent round trips on the block's critical path),
  // an act-order GEMV cost ~2 us more than the plain one at M = 1 (H100, Llama-3-8B shapes). Shared memory, not
  // registers: holding the indices in registers took the R4 KS2 tile from 74 to 98 registers (ptxas, sm_90).
  const int* const pidx = (const int*)(xsm + 2 * Kc * XV);
  auto copy_perm_async = [&]() {
    for (int q = threadIdx.x; q < 2 * Kc * XV; q += GEMV_CTHREADS) {  // 16 bytes = 4 indices each
      const u32 dst = (u32)__cvta_generic_to_shared(pidx + 4 * q);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(perm + 4 * q) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  auto stage_x = [&]() {
    copy_x(xsm + Kc * XV, false);
    asm volatile("cp.async.wait_all;" ::: "memory");
    asm volatile("bar.sync 1, %0;" ::"n"(GEMV_CTHREADS) : "memory");  // compute warps (GEMV_BULK: not the producer)
    for (int p = threadIdx.x; p < Kc * XV; p += GEMV_CTHREADS) {
      const int4 a = ((const int4*)pidx)[2 * p], b = ((const int4*)pidx)[2 * p + 1];
      const int pk[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      u32 w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = (u32)xraw[pk[2 * j]] | ((u32)xraw[pk[2 * j + 1]] << 16);
      uint4 v;
      v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
      xsm[(p % XV) * Kc + p / XV] = v;
    }
  };
#else
  auto copy_perm_async = [&]() {};
  auto stage_x = [&]() { copy_x(xsm, true); };
#endif
#endif
  float acc[M][R];  // per tile: zeroed at its start
  // Lanes stride along K (each warp reads 512 contiguous bytes of a row per step: coalesced); the KS
  // warps of a row group interleave their chunks (split-K inside the block, when N alone cannot fill
  // the GPU); U chunks per lane are loaded before any is used, so U * R 16-byte loads are in flight.
  constexpr int STRIDE = KS * LW;
  constexpr int PER = 16 / XE;  // activations per 16-byte piece
  // Piece v of chunk c of x row m from global memory (rows >= Mr read row Mr - 1 and are never stored). Act-order
  // (GEMV_PERM) gathers it through the indices pk of that piece, loaded once by the caller for all M rows.
  auto x_piece = [&](int m, int c, int v, const int (&pk)[PER]) -> uint4 {
    const uint4* row = X + (size_t)min(m, Mr - 1) * ldx4;
    if constexpr (GEMV_PERM) return gather_x((const char*)row, pk);
    else return ld_x(row + (size_t)c * XV + v);
  };
  // act-order: the indices of piece v of chunk c (pieces are contiguous: it starts at k = PER * (c * XV + v))
  auto piece_perm = [&](int c, int v, int (&pk)[PER]) {
    if constexpr (GEMV_PERM) ld_perm(perm, (c * XV + v) * PER, pk);
  };
  // One step = UU chunks per lane: all UU * R weight (and parameter) loads are issued before any is
  // used, and the steady-state loop has no bounds checks, so the UU chunk bodies interleave (ILP).
  auto compute = [&](const auto& wv, const auto& pv, int c0) {
    constexpr int UU = sizeof(wv) / sizeof(wv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int c = c0 + u * STRIDE;
      float s[R], zc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s[r] = pv[u][r].scale();
        zc[r] = MODE == 1 && !GEMV_ZX ? pv[u][r].second() : ZBIAS;
      }
      if (ACT == 0) {
        // ---------------- fp16 activations: f16x2 math inside the chunk ----------------
        // Word by word: one 16-byte activation load per row m serves R weight rows (x reuse: the
        // L1 activation traffic, 4x the int4 weight bytes per row, is what limits a 1-row warp).
        u32 zlo[R], zhi[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (GEMV_LITE && MODE == 1 && SCL == 0 && !GEMV_ZX) {
            const u32 zz = prmt<0x1010>(pv[u][r].b, 0u);   // {z, z} as f16x2 (z: raw fp16 bits)
            zlo[r] = hadd2(zz, 0x64006400u);                 // 1024 + z, exact
            zhi[r] = hfma2(zz, 0xBC00BC00u, 0xD400D400u);    // -z - 64, exact
          } else {
            zlo[r] = f32_to_h2(1024.f + zc[r]);    // magic 1024 plus zero, removed by one sub
            zhi[r] = f32_to_h2(-(64.f + zc[r]));   // (1024 + 16q) / 16 - (64 + z) = q - z, one fma
          }
        }
        u32 pacc[M][R][2];  // two independent f16x2 chains per (m, r): halves the FMA latency chain
        u32 xs[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          xs[m] = 0u;
#pragma unroll
          for (int r = 0; r < R; ++r) pacc[m][r][0] = pacc[m][r][1] = 0u;
        }
#pragma unroll
        for (int v = 0; v < XV; ++v) {  // XV 16-byte activation pieces = 8 k each
          u32 xw[M][4];
          int pk[PER];
          if (!GEMV_XS) piece_perm(c, v, pk);
#pragma unroll
          for (int m = 0; m < M; ++m) {
#if GEMV_XS
            const uint4 xv = xsm[v * Kc + c];  // piece-major copy: 512 contiguous bytes per warp
#else
            const uint4 xv = x_piece(m, c, v, pk);
#endif
            if (BITS == 4) {  // (x0, x4), (x1, x5), (x2, x6), (x3, x7): the weight pairs' order
              xw[m][0] = prmt<0x5410>(xv.x, xv.z); xw[m][1] = prmt<0x7632>(xv.x, xv.z);
              xw[m][2] = prmt<0x5410>(xv.y, xv.w); xw[m][3] = prmt<0x7632>(xv.y, xv.w);
            } else {
              xw[m][0] = xv.x; xw[m][1] = xv.y; xw[m][2] = xv.z; xw[m][3] = xv.w;
            }
            if (MODE == 2 || GEMV_ZX) xs[m] = hadd2(hadd2(xs[m], xv.x), hadd2(xv.y, hadd2(xv.z, xv.w)));
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const u32 w4[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
            u32 d[4];  // exact q - zc as f16x2 pairs (k, k + 4), k = 8v + t (int4) or (k, k + 1), k = 8v + 2t (int8)
            if (BITS == 4) {
              const u32 w = w4[v];
              const u32 w8 = w >> 8;  // the only shift: brings (k4..k7) to where (k0..k3) were
              d[0] = hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(w), zlo[r]);
              d[1] = hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(w), 0x2c002c00u, zhi[r]);  // * 1/16
              d[2] = hsub2(lop3_and_or<0x000f000fu, 0x64006400u>(w8), zlo[r]);
              d[3] = hfma2(lop3_and_or<0x00f000f0u, 0x64006400u>(w8), 0x2c002c00u, zhi[r]);
            } else if (ROWS) {  // piece v: k 8v .. 8v + 7 of the chunk, the low (v 0) or high (v 1) half of word t
#pragma unroll
              for (int t = 0; t < 4; ++t)
                d[t] = hsub2(v == 0 ? prmt<0x5140>(w4[t], 0x64646464u) : prmt<0x5342>(w4[t], 0x64646464u), zlo[r]);
            } else {
              d[0] = hsub2(prmt<0x5140>(w4[2 * v], 0x64646464u), zlo[r]);
              d[1] = hsub2(prmt<0x5342>(w4[2 * v], 0x64646464u), zlo[r]);
              d[2] = hsub2(prmt<0x5140>(w4[2 * v + 1], 0x64646464u), zlo[r]);
              d[3] = hsub2(prmt<0x5342>(w4[2 * v + 1], 0x64646464u), zlo[r]);
            }
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
              for (int t = 0; t < 4; ++t) pacc[m][r][t & 1] = hfma2(d[t], xw[m][t], pacc[m][r][t & 1]);
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float xsum = MODE == 2 || GEMV_ZX ? h2sum_f32(xs[m]) : 0.f;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (GEMV_LITE)
              acc[m][r] = fmaf(s[r], h2sum_f32(hadd2(pacc[m][r][0], pacc[m][r][1])), acc[m][r]);
            else
              acc[m][r] = fmaf(s[r], h2sum_f32(pacc[m][r][0]) + h2sum_f32(pacc[m][r][1]), acc[m][r]);
            if (MODE == 2) acc[m][r] = fmaf(fmaf(zc[r], s[r], pv[u][r].second()), xsum, acc[m][r]);
            if (GEMV_ZX) acc[m][r] = fmaf((ZBIAS - pv[u][r].second()) * s[r], xsum, acc[m][r]);
          }
        }
      } else {
        // ---------------- bf16 / fp32 activations: exact fp32 (q - zc), fp32 math ----------------
        float d[R][CH];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const u32 w[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
          const float z0 = -(0x1p23f + zc[r]), z1 = -(0x1p19f + zc[r]);
          const float z2 = -(0x1p15f + zc[r]), z3 = -(0x1p11f + zc[r]);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (BITS == 4) {
              // fp32 2^23 (0x4B000000) has ulp 1 at bit 0 and mantissa bits 0-22: one lop3 per weight
              // puts nibble p (p < 4) of a 16-bit half into (2^23 + 16^p q); one fma by 16^-p with
              // -(2^23 / 16^p + zc) leaves q - zc exactly. w >> 16 does the same for nibbles 4-7.
              const u32 wh = w[j] >> 16;  // the only shift per word
              d[r][8 * j + 0] = as_f32(lop3_and_or<0x0000000fu, 0x4B000000u>(w[j])) + z0;
              d[r][8 * j + 1] = fmaf(as_f32(lop3_and_or<0x000000f0u, 0x4B000000u>(w[j])), 0x1p-4f, z1);
              d[r][8 * j + 2] = fmaf(as_f32(lop3_and_or<0x00000f00u, 0x4B000000u>(w[j])), 0x1p-8f, z2);
              d[r][8 * j + 3] = fmaf(as_f32(lop3_and_or<0x0000f000u, 0x4B000000u>(w[j])), 0x1p-12f, z3);
              d[r][8 * j + 4] = as_f32(lop3_and_or<0x0000000fu, 0x4B000000u>(wh)) + z0;
              d[r][8 * j + 5] = fmaf(as_f32(lop3_and_or<0x000000f0u, 0x4B000000u>(wh)), 0x1p-4f, z1);
              d[r][8 * j + 6] = fmaf(as_f32(lop3_and_or<0x00000f00u, 0x4B000000u>(wh)), 0x1p-8f, z2);
              d[r][8 * j + 7] = fmaf(as_f32(lop3_and_or<0x0000f000u, 0x4B000000u>(wh)), 0x1p-12f, z3);
            } else {
              // byte i of word j: k 4j + i, or (ROWS) k 2j + (i & 1) + 8 (i >> 1)
              d[r][ROWS ? 2 * j : 4 * j] = as_f32(prmt<0x7540>(w[j], 0x4B000000u)) + z0;
              d[r][ROWS ? 2 * j + 1 : 4 * j + 1] = as_f32(prmt<0x7541>(w[j], 0x4B000000u)) + z0;
              d[r][ROWS ? 2 * j + 8 : 4 * j + 2] = as_f32(prmt<0x7542>(w[j], 0x4B000000u)) + z0;
              d[r][ROWS ? 2 * j + 9 : 4 * j + 3] = as_f32(prmt<0x7543>(w[j], 0x4B000000u)) + z0;
            }
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float pacc[R][2];  // two independent chains per row
#pragma unroll
          for (int r = 0; r < R; ++r) pacc[r][0] = pacc[r][1] = 0.f;
          float xs = 0.f;
#pragma unroll
          for (int v = 0; v < XV; ++v) {
            int pk[PER];
            piece_perm(c, v, pk);  // (reloaded per row m: L1 hits; hoisting them costs 32 registers)
            const uint4 xv = x_piece(m, c, v, pk);
            const u32 xw[4] = {xv.x, xv.y, xv.z, xv.w};
            float xf[PER];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              if (ACT == 1) {  // bf16 -> fp32 is a shift / mask
                xf[2 * t] = as_f32(xw[t] << 16);
                xf[2 * t + 1] = as_f32(xw[t] & 0xffff0000u);
              } else {
                xf[t] = as_f32(xw[t]);
              }
            }
#pragma unroll
            for (int e = 0; e < PER; ++e) {
#pragma unroll
              for (int r = 0; r < R; ++r) pacc[r][e & 1] = fmaf(d[r][PER * v + e], xf[e], pacc[r][e & 1]);
              if (MODE == 2) xs += xf[e];
            }
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            acc[m][r] = fmaf(s[r], pacc[r][0] + pacc[r][1], acc[m][r]);
            if (MODE == 2) acc[m][r] = fmaf(fmaf(zc[r], s[r], pv[u][r].second()), xs, acc[m][r]);
          }
        }
      }
    }
  };
  constexpr int TROWS = RG * R * HW;  // rows per tile
  // The KS partial sums of each row of a tile (red: [KS][M][TROWS], written by warp_sums_to_smem and
  // synchronized by the caller) summed and stored by the compute threads.
  auto store_tile = [&](int tile, const float (*red)[M][TROWS]) {
    for (int t = threadIdx.x; t < M * TROWS; t += GEMV_CTHREADS) {
      const int m = t / TROWS, j = t % TROWS;
      const int n = tile * TROWS + j;
      if (n >= N || m >= Mr) continue;
      float v = 0.f;
#pragma unroll
      for (int k = 0; k < KS; ++k) v += red[k][m][j];
      store_output<ACT>(Y, (size_t)m * ldy + n, n, v, bias, bias_kind, lo, hi);
    }
  };
#if GEMV_BULK
  static_assert(!GEMV_PF, "GEMV_BULK: PF off");
  // the grid may be smaller than the tile count (persistent grid: each block loops over tiles blockIdx.x,
  // + gridDim.x, ...; no block launch per tile, no tail of freshly launched blocks)
  const int ntiles = (N + TROWS - 1) / TROWS;
  using namespace mgw;
  constexpr int S = GEMV_BULK;     // ring stages
  constexpr int SC = STRIDE * U;   // chunks per row and stage: one U step of every k-slice warp
  constexpr int TR = RG * R;       // rows per tile
  constexpr int CW = RG * KS;      // compute warps
  uint4* const ring = dsm;         // [S][TR][SC] (bulk-copy targets: 16-byte aligned)
  // GEMV_BPAR: each tile's parameters go to pbuf[tile parity], one bulk copy per row. Why: read as 2-8 byte
  // loads spread over the tile, the 3% of bytes that are parameters cost H100 28672x8192 W4 g128 2.5 us
  // (per-channel 44.8 us, g128 47.3), twice their share of the copy floor.
  __shared__ __align__(8) unsigned long long bars[2 * S + 2];  // full[S], empty[S], params empty[2]
  __shared__ float red[2][KS][M][TR];  // by tile parity, so one consumer barrier per tile suffices
  const u32 full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[S]), pempty0 = smem_addr(&bars[2 * S]);
  const int nst = (Kc + SC - 1) / SC;  // stages per tile (the last may be partial)
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full0 + 8 * s, 1);    // the producer's arrive (+ the copies' bytes)
      mbar_init(empty0 + 8 * s, CW);  // one arrive per compute warp
    }
    mbar_init(pempty0, CW);
    mbar_init(pempty0 + 8, CW);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the last block-wide barrier: the producer warp leaves early
  if (warp == CW) {
    // Producer: one lane issues TR row copies per stage, for every tile of this block, up to S stages
    // ahead of the slowest compute warp (and, GEMV_BPAR, the tile's parameters with its first stage).
    // Weights and parameters are constant, so no PDL wait is needed here.
    if (lane == 0) {
      int it = 0, tl = 0;
      for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, ++tl)
        for (int j = 0; j < nst; ++j, ++it) {
          const int s = it % S;
          if (it >= S) mbar_wait(empty0 + 8 * s, ((it / S) - 1) & 1);
          const bool par = GEMV_BPAR && j == 0;
          if (par && tl >= 2) mbar_wait(pempty0 + 8 * (tl & 1), ((tl >> 1) - 1) & 1);  // tile tl - 2 done
          const int c0 = j * SC, nc = min(SC, Kc - c0);
          mbar_expect_tx(full0 + 8 * s, (u32)(TR * nc * 16 + (par ? TR * prow_bytes : 0)));
          for (int r = 0; r < TR; ++r) {
            const int n = min(tile * TR + r, N - 1);  // rows past N: row N-1, never stored
            bulk_copy(smem_addr(ring + ((size_t)s * TR + r) * SC), W + (size_t)n * Kc + c0, (u32)nc * 16,
                      full0 + 8 * s);
            if (par)
              bulk_copy(smem_addr(pbuf + ((tl & 1) * TR + r) * prow_bytes), params + (size_t)n * prow_bytes,
                        (u32)prow_bytes, full0 + 8 * s);
          }
        }
    }
    return;
  }
  // Release a slot the bulk copies will overwrite. The proxy fence orders this warp's generic-proxy reads
  // of it before the async-proxy writes that follow the producer's wait: without it H100 returned stale
  // or overwritten chunks (rel err up to 0.19 in fp32), with it the error is fp32 rounding.
  auto release = [&](u32 bar) {
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  const int lc = ks * 32 + lane;  // this lane's first chunk inside a stage's row slice
  // Without GEMV_BPAR the parameters come straight from global memory, one stage ahead of their use so their
  // latency hides under a stage of math; group indices past the row are clamped (never used).
  auto load_params = [&](P (&pv)[U][R], int tile, int j) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const char* prow = prow_of(min((tile * RG + rg) * R + r, N - 1));
#pragma unroll
      for (int u = 0; u < U; ++u) pv[u][r].load(prow, (min(j * SC + lc + u * STRIDE, Kc - 1) >> gshift) * PGS);
    }
  };
  P pn[U][R];
  if (!GEMV_BPAR && blockIdx.x < ntiles) load_params(pn, blockIdx.x, 0);
#if GEMV_XS
  copy_perm_async();
#endif
  pdl_wait();  // x is read from here on
#if GEMV_XS
  stage_x();  // once per (persistent) block
  asm volatile("bar.sync 1, %0;" ::"n"(GEMV_CTHREADS) : "memory");
#endif
  int it = 0, tl = 0;
  for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, ++tl) {
    const char* tpar = pbuf + ((tl & 1) * TR + rg * R) * prow_bytes;  // this warp's rows' parameters
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    for (int j = 0; j < nst; ++j, ++it) {
      const int s = it % S;
      const int c0 = j * SC + lc;
      P pc[U][R];
      if (!GEMV_BPAR) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r) pc[u][r] = pn[u][r];
        if (j + 1 < nst) load_params(pn, tile, j + 1);
        else if (tile + (int)gridDim.x < ntiles) load_params(pn, tile + gridDim.x, 0);
      }
      mbar_wait(full0 + 8 * s, (it / S) & 1);
      if (GEMV_BPAR) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r)
            pc[u][r].load_generic(tpar + r * prow_bytes, min(c0 + u * STRIDE, Kc - 1) >> gshift);
      }
      const uint4* st = ring + ((size_t)s * TR + rg * R) * SC + lc;
      uint4 wv[U][R];
      const bool full = c0 + (U - 1) * STRIDE < Kc;  // every chunk of this lane inside the row
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (full || c0 + u * STRIDE < Kc) wv[u][r] = st[r * SC + u * STRIDE];
      release(empty0 + 8 * s);  // the slot is free once every lane has its chunks
      if (full) {
        compute(wv, pc, c0);
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (c0 + u * STRIDE >= Kc) break;
          uint4 w1[1][R];
          P p1[1][R];
#pragma unroll
          for (int r = 0; r < R; ++r) { w1[0][r] = wv[u][r]; p1[0][r] = pc[u][r]; }
          compute(w1, p1, c0 + u * STRIDE);
        }
      }
    }
    if (GEMV_BPAR) release(pempty0 + 8 * (tl & 1));  // this tile's parameters are read
    warp_sums_to_smem(acc, red[tl & 1][ks], rg, lane);
    asm volatile("bar.sync 1, %0;" ::"n"(GEMV_CTHREADS) : "memory");  // compute warps only
    store_tile(tile, red[tl & 1]);
  }
#else
  const int tile = blockIdx.x;
  const int row0 = (tile * RG + rg) * R * HW + hset * R;

  const uint4* wrow[R];
  const char* prow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = min(row0 + r, N - 1);  // rows past N read row N-1 (valid memory) and are never stored
    wrow[r] = W + (size_t)n * Kc;
    prow[r] = prow_of(n);
  }

#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  auto load = [&](auto& wv, auto& pv, int c0) {
    constexpr int UU = sizeof(wv) / sizeof(wv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = ld_stream(wrow[r] + c0 + u * STRIDE);
        pv[u][r].load(prow[r], ((c0 + u * STRIDE) >> gshift) * PGS);
      }
  };
  int c0 = ks * LW + sub;
  uint4 wA[U][R], wB[U][R];
  P pA[U][R], pB[U][R];
  if (GEMV_PF && c0 + (U - 1) * STRIDE < Kc) {
    // Register double buffering: the next step's U * R weight loads are issued before this step's
    // math, so every warp keeps loads in flight while it computes (latency hidden without needing
    // more resident warps). Ping-pong written out twice so no buffer is copied.
    load(wA, pA, c0);
    pdl_wait();  // x is read from here on (see gemv_common.cuh)
    while (true) {
      int c1 = c0 + U * STRIDE;
      bool more = c1 + (U - 1) * STRIDE < Kc;
      if (more) load(wB, pB, c1);
      compute(wA, pA, c0);
      c0 = c1;
      if (!more) break;
      c1 = c0 + U * STRIDE;
      more = c1 + (U - 1) * STRIDE < Kc;
      if (more) load(wA, pA, c1);
      compute(wB, pB, c0);
      c0 = c1;
      if (!more) break;
    }
  } else {
    bool have = false;
    // the first step's weight and parameter loads (constant data) go out before the PDL wait, and
    // before the XS x copy, so both hide under their latency
    if (c0 + (U - 1) * STRIDE < Kc) { load(wA, pA, c0); have = true; }
#if GEMV_XS
    copy_perm_async();
#endif
    pdl_wait();
#if GEMV_XS
    stage_x();
    __syncthreads();
#endif
    for (; c0 + (U - 1) * STRIDE < Kc; c0 += U * STRIDE) {
      if (!have) load(wA, pA, c0);
      have = false;
      compute(wA, pA, c0);
    }
  }
  for (; c0 < Kc; c0 += STRIDE) {
    uint4 w1[1][R];
    P p1[1][R];
    load(w1, p1, c0);
    compute(w1, p1, c0);
  }

  // Epilogue: warp reduce, then the KS k-slices of each row meet in shared memory.
  __shared__ float red[KS][M][TROWS];
  warp_sums_to_smem<M, R, TROWS, LW>(acc, red[ks], rg, lane);
  __syncthreads();
  store_tile(tile, red);
#endif  // GEMV_BULK
}
