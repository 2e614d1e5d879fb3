// mixgemm M = 1 weight-only GEMV on CUDA cores over the wgmma GEMM's layout (wgmma_v1), fp16 / bf16 activations.
//
// Why: a weight that keeps one copy of its codes (mixgemm.compact_) keeps the prefill GEMM's wgmma_v1, and decode
// must read those bytes at the speed the plain-codes GEMV (gemv.cu) reads its own. At M = 1 the tensor-core GEMV uses
// one of the mma's 8 B columns and pays for an x ring in shared memory; here the math runs on CUDA cores, shaped like
// gemv.cu: a warp owns RT 16-row tiles (one x fetch serves all of them), KS warps split K, RG row groups per block, U
// k-tiles in flight per lane and tile, register double buffering with PF, and the first step's weights and
// parameters (constant data) are loaded before the PDL wait, so they arrive while the previous kernel drains.
//
// Layout (mixgemm/formats/layouts_wgmma.py): 16-row x 64-k tiles ordered [N_pad / 128][Kt][8 row tiles], one uint4
// per lane and tile for int4 (two for int8); lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 at k 16 s + 2 t
// + (0, 1) and 16 s + 2 t + 8 + (0, 1), s = 0..3 (mma_frag.cuh a_frag_step turns one step into four exact q - z
// pairs). RT divides 8, so a warp's RT tiles of one k-tile are RT * 512 (int4) contiguous bytes. Parameters:
// [N_pad / 128][G][8][16] rows of one group together, padded rows zero.
//
// x: each lane loads word `lane` of the k-tile's 64 activations (the warp reads 128 coalesced bytes) and takes the 8
// words its pairs meet (words 8 s + t and 8 s + t + 4) by __shfl_sync, once for its RT tiles (bf16 x first becomes
// exact fp16 under a power of two per k-tile, in compute). Per tile and row the products are summed in f16x2 over the
// 64 k, then scaled once in fp32 (twice at groups of 32).

#include "mma_frag.cuh"

#ifndef SIMT_BITS
#define SIMT_BITS 4
#endif
#ifndef SIMT_ACT
#define SIMT_ACT 0
#endif
#ifndef SIMT_SCL
#define SIMT_SCL 0
#endif
#ifndef SIMT_MODE
#define SIMT_MODE 0
#endif
#ifndef SIMT_G32
#define SIMT_G32 0
#endif
#ifndef SIMT_RT
#define SIMT_RT 1
#endif
#ifndef SIMT_U
#define SIMT_U 2
#endif
#ifndef SIMT_RG
#define SIMT_RG 4
#endif
#ifndef SIMT_KS
#define SIMT_KS 2
#endif
#ifndef SIMT_PF
#define SIMT_PF 0
#endif
#ifndef SIMT_ROUTED
#define SIMT_ROUTED 0  // routed experts: blockIdx.x is a routing slot, its expert's weights one E-stride slice
#endif
#ifndef SIMT_PACK
#define SIMT_PACK 0  // zero point / offset with 16-bit parameters: each (row, group) pair held in one register
#endif
#ifndef SIMT_MINB
#define SIMT_MINB 0  // blocks per SM the registers must allow (__launch_bounds__' second argument; 0: no cap)
#endif

#define SIMT_THREADS (32 * SIMT_RG * SIMT_KS)

using namespace mg;

#if SIMT_MINB > 0
#define SIMT_BOUNDS __launch_bounds__(SIMT_THREADS, SIMT_MINB)
#else
#define SIMT_BOUNDS __launch_bounds__(SIMT_THREADS)
#endif

extern "C" __global__ void SIMT_BOUNDS
mixgemm_gemv_wg_simt(const uint4* __restrict__ W,      // wgmma_v1 codes
                     const char* __restrict__ params,  // wgmma_v1 parameters
                     const uint4* __restrict__ X,      // [1, >= 64 Kt] activations, zero-padded past K
                     int ldx4,
                     void* __restrict__ Y, int ldy,    // [1, N] activation dtype
                     const void* __restrict__ bias, int bias_kind,
                     float lo, float hi,
                     int N, int Kt, int G, int gk,     // gk: group of k is min(k >> gk, G - 1)
                     int Mr,
                     const int* __restrict__ perm     // (the tensor-core GEMV's parameter list; unused here)
#if SIMT_ROUTED
                     ,
                     const long long* __restrict__ route,  // [slots] expert of each slot (>= n_experts: none)
                     int n_experts,
                     long long w_estride,  // uint4 from one expert's codes to the next
                     long long p_estride,  // bytes from one expert's parameters to the next
                     int x_div,            // slot s reads x row s / x_div
                     long long b_estride   // bytes from one expert's bias to the next
#endif
) {
  constexpr int BITS = SIMT_BITS, ACT = SIMT_ACT, SCL = SIMT_SCL, MODE = SIMT_MODE;
  constexpr int RT = SIMT_RT, U = SIMT_U, RG = SIMT_RG, KS = SIMT_KS;
  static_assert(8 % RT == 0, "SIMT_RT divides the 8 row tiles stored together");
  static_assert(ACT == 0 || ACT == 1, "fp16 or bf16 activations");
  constexpr int LU = BITS == 4 ? 1 : 2;       // uint4 per lane and tile
  constexpr int NP = SIMT_G32 ? 2 : 1;        // parameter sets per tile (groups of 32 in a 64-k tile)
  constexpr int SPP = 4 / NP;                 // k16 steps per parameter set
  constexpr size_t TSTEP = 8 * 32 * LU;       // uint4 from one k-tile of a row tile to the next
  constexpr float ZBIAS = BITS == 4 ? 8.f : 128.f;
  static_assert(!SIMT_PACK || (MODE != 0 && SCL != 2), "SIMT_PACK: two 16-bit parameters per group");
  typedef typename PickParam<SIMT_PACK != 0, SCL, MODE>::T P;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int rg = warp % RG, ks = warp / RG;
  const int Nt = (N + 15) >> 4;
  constexpr bool ROUTED = SIMT_ROUTED != 0;
  // the block's tile of rows; routed, blockIdx.x is the slot: the blocks of one row tile over the slots are launched
  // together, so slots of one expert (the caller sorts many tokens' slots by expert) read its tile once from DRAM
  const int row_block = ROUTED ? blockIdx.y : blockIdx.x;
#if SIMT_ROUTED
  // Routed experts (mixgemm.nn.experts): the experts' layouts are one buffer, E-strided; block (s, row tile)
  // computes slot s with expert route[s], x row s / x_div, y row s. The routing is the previous kernel's output, so
  // here the dependency wait comes first and no weight load precedes it: what a launch per expert would have
  // overlapped, against one launch for every slot with no host round trip for the routing.
  pdl_launch_dependents();
  pdl_wait();
  {
    const int slot = blockIdx.x;
    const long long e = route[slot];
    Y = (u16*)Y + (size_t)slot * ldy;
    if (e < 0 || e >= n_experts) {  // a slot of no local expert (expert parallelism's sentinel) adds nothing
      for (int idx = threadIdx.x; idx < RG * RT * 16; idx += SIMT_THREADS) {
        const int n = row_block * RG * RT * 16 + idx;
        if (n < N) ((u16*)Y)[n] = 0;
      }
      return;  // (the whole block: no barrier is left waiting)
    }
    W += e * w_estride;
    params += e * p_estride;
    X += (size_t)(slot / x_div) * ldx4;
    if (bias_kind != 0) bias = (const char*)bias + e * b_estride;
  }
#endif
  // a warp past the last tile redoes the last RT-aligned tiles and never stores; the RT tiles of a warp share one
  // group of 8, which the layout pads with zero rows, so none needs a clamp
  const int nt0 = min((int)(row_block * RG + rg) * RT, (Nt - 1) / RT * RT);
  const uint4* const wt = W + ((size_t)(nt0 >> 3) * Kt * 8 + (nt0 & 7)) * 32 * LU + lane;
  constexpr size_t RSTEP = 32 * LU;  // uint4 from one row tile to the next at the same k-tile
  const char* const prow = params + ((size_t)(nt0 >> 3) * G * 128 + (nt0 & 7) * 16 + g) * P::PB;  // row g of tile 0
  const u32* const xw32 = (const u32*)X + lane;

  float acc[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r) acc[r][0] = acc[r][1] = 0.f;

  // the weights and parameters of k-tiles kt0, kt0 + KS, ... (UU of them), every row tile
  auto load_w = [&](auto& wv, auto& p0, auto& p1, int kt0) {
    constexpr int UU = sizeof(wv) / sizeof(wv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int kt = kt0 + u * KS;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int l = 0; l < LU; ++l) wv[u][r][l] = ld_stream(wt + (size_t)kt * TSTEP + r * RSTEP + l * 32);
#pragma unroll
      for (int h = 0; h < NP; ++h) {
        const int grp = min((kt * 64 + 32 * h) >> gk, G - 1) * 128;  // parameter entries of this group
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          p0[u][r][h].load(prow + r * 16 * P::PB, grp);
          p1[u][r][h].load(prow + (r * 16 + 8) * P::PB, grp);
        }
      }
    }
  };
  // word `lane` of each k-tile's 64 activations (volatile: kept after the PDL wait)
  auto load_x = [&](auto& xv, int kt0) {
    constexpr int UU = sizeof(xv) / sizeof(xv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u)
      asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(xv[u]) : "l"(xw32 + (size_t)(kt0 + u * KS) * 32));
  };
  auto compute = [&](const auto& wv, const auto& p0, const auto& p1, const auto& xv) {
    constexpr int UU = sizeof(xv) / sizeof(xv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      u32 xu = xv[u];
      float xunit = 1.f;  // what one unit of the tile's x words is worth (bf16 as scaled fp16: 2^(e - 130))
      if constexpr (ACT == 1) {
        // bf16 x as exact fp16: the tile's largest exponent e (one redux over the warp's 64 values) sets a power of
        // two that takes its largest |x| into [8, 16). bf16's 8 significant bits fit fp16's 11, so every value down
        // to 2^-17 of that maximum converts exactly (smaller ones round as fp16 subnormals, below what a bf16 result
        // keeps), and 8 products of |q - z| <= 255 stay under fp16's 65504: the f16x2 math of fp16 x, at its speed.
        // e is clamped to [8, 254] so both powers are normal fp32 (all-zero tiles stay zero, inf / nan propagate).
        const u32 e = max((xu >> 7) & 0xffu, (xu >> 23) & 0xffu);
        const int em = min(max((int)__reduce_max_sync(0xffffffffu, e), 8), 254);
        const float to16 = as_f32((u32)(257 - em) << 23);  // 2^(130 - em)
        xunit = as_f32((u32)(em - 3) << 23);                // 2^(em - 130)
        u32 h;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;"
            : "=r"(h) : "f"(as_f32(xu & 0xffff0000u) * to16), "f"(as_f32(xu << 16) * to16));
        xu = h;
      }
      u32 xw[8];  // x pairs of step s: k 16 s + 2 t (word 8 s + t) and k 16 s + 2 t + 8 (word 8 s + t + 4)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        xw[2 * s] = __shfl_sync(0xffffffffu, xu, 8 * s + t);
        xw[2 * s + 1] = __shfl_sync(0xffffffffu, xu, 8 * s + t + 4);
      }
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        u32 w[4 * LU];
        tile_words(wv[u][r], w);
#pragma unroll
        for (int h = 0; h < NP; ++h) {
          const P& q0p = p0[u][r][h];
          const P& q1p = p1[u][r][h];
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
            h0[0] = hfma2(a[0], xw[2 * s], h0[0]);
            h0[1] = hfma2(a[2], xw[2 * s + 1], h0[1]);
            h1[0] = hfma2(a[1], xw[2 * s], h1[0]);
            h1[1] = hfma2(a[3], xw[2 * s + 1], h1[1]);
            if (MODE == 2) hx = hadd2(hx, hadd2(xw[2 * s], xw[2 * s + 1]));
          }
          // the chains meet in f16x2 (8 products a half, fewer than gemv.cu's chunk sums), then one widening: rows g,
          // g + 8: sum of (q - z) x over this piece; xs: sum of x (offset)
          const float c0 = h2sum_f32(hadd2(h0[0], h0[1])), c1 = h2sum_f32(hadd2(h1[0], h1[1]));
          const float xs = MODE == 2 ? h2sum_f32(hx) : 0.f;
          // x's unit on the sums, not the scales: c x unit is the piece's true dot, normal wherever that is
          acc[r][0] = fmaf(s0, c0 * xunit, acc[r][0]);
          acc[r][1] = fmaf(s1, c1 * xunit, acc[r][1]);
          if (MODE == 2) {
            acc[r][0] = fmaf(fmaf(z0, s0, q0p.second()), xs * xunit, acc[r][0]);
            acc[r][1] = fmaf(fmaf(z1, s1, q1p.second()), xs * xunit, acc[r][1]);
          }
        }
      }
    }
  };

  if (!ROUTED) pdl_launch_dependents();
  int kt0 = ks;
  uint4 wA[U][RT][LU], wB[U][RT][LU];
  P a0[U][RT][NP], a1[U][RT][NP], b0[U][RT][NP], b1[U][RT][NP];
  u32 xA[U], xB[U];
  const bool full = kt0 + (U - 1) * KS < Kt;
  if (full) load_w(wA, a0, a1, kt0);  // the first step's constant bytes in flight before the wait
  if (!ROUTED) pdl_wait();  // x, bias and y only from here on (gemv_common.cuh)
  if (full) {
    load_x(xA, kt0);
    if (SIMT_PF) {
      // Register double buffering: the next step's loads (into the other buffer) are in flight while this step
      // computes; false after the last full step. Called with the buffers swapped, so no buffer is copied.
      auto step = [&](auto& wc, auto& pc0, auto& pc1, auto& xc, auto& wn, auto& pn0, auto& pn1, auto& xn) {
        const int kt1 = kt0 + U * KS;
        const bool more = kt1 + (U - 1) * KS < Kt;
        if (more) {
          load_w(wn, pn0, pn1, kt1);
          load_x(xn, kt1);
        }
        compute(wc, pc0, pc1, xc);
        kt0 = kt1;
        return more;
      };
      while (step(wA, a0, a1, xA, wB, b0, b1, xB) && step(wB, b0, b1, xB, wA, a0, a1, xA)) {
      }
    } else {
      compute(wA, a0, a1, xA);
      for (kt0 += U * KS; kt0 + (U - 1) * KS < Kt; kt0 += U * KS) {
        load_w(wA, a0, a1, kt0);
        load_x(xA, kt0);
        compute(wA, a0, a1, xA);
      }
    }
  }
  for (; kt0 < Kt; kt0 += KS) {  // the slice's last k-tiles, one at a time
    uint4 w1[1][RT][LU];
    P q0[1][RT][NP], q1[1][RT][NP];
    u32 x1[1];
    load_w(w1, q0, q1, kt0);
    load_x(x1, kt0);
    compute(w1, q0, q1, x1);
  }

  // Epilogue: rows g / g + 8 summed over the row's four lanes t, the KS k-slices meet in shared memory, then bias,
  // clamp, store (rows numbered by the warp's own tiles: a warp that redid the last tiles stores nothing)
  __shared__ float red[KS][RG * RT * 16];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      red[ks][(rg * RT + r) * 16 + g] = acc[r][0];
      red[ks][(rg * RT + r) * 16 + g + 8] = acc[r][1];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < RG * RT * 16; idx += SIMT_THREADS) {
    const int n = row_block * RG * RT * 16 + idx;
    if (n >= N) continue;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) v += red[k][idx];
    store_output<ACT>(Y, n, n, v, bias, bias_kind, lo, hi);
  }
}
