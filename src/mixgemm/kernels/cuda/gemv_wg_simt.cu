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
// x and the per-tile math: wg_tile_math.cuh (one x fetch and its shuffles serve the warp's RT tiles).

#include "wg_tile_math.cuh"

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

// Diagnostic only (never a shipped config; results are wrong with any bit set): 1 no dequantization or math (the
// weight words are xor-folded, x is not read), 4 no griddepcontrol.wait, 8 the weights addressed as if the row tiles
// kept their k-tiles together ([N / 16][Kt] tiles instead of [N / 128][Kt][8]): what the access order costs.
#ifndef SIMT_DIAG
#define SIMT_DIAG 0
#endif

#define SIMT_THREADS (32 * SIMT_RG * SIMT_KS)

using namespace mg;

extern "C" __global__ void __launch_bounds__(SIMT_THREADS)
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
  constexpr size_t TSTEP = 8 * 32 * LU;       // uint4 from one k-tile of a row tile to the next
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
  const uint4* const wt = (SIMT_DIAG & 8) ? W + (size_t)nt0 * Kt * 32 * LU + lane
                                           : W + ((size_t)(nt0 >> 3) * Kt * 8 + (nt0 & 7)) * 32 * LU + lane;
  // uint4 from one k-tile of a row tile to the next, and from one row tile to the next at the same k-tile
  constexpr size_t KSTEP = (SIMT_DIAG & 8) ? 32 * LU : TSTEP;
  const size_t rstep = (SIMT_DIAG & 8) ? (size_t)Kt * 32 * LU : 32 * LU;
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
        for (int l = 0; l < LU; ++l) wv[u][r][l] = ld_stream(wt + (size_t)kt * KSTEP + r * rstep + l * 32);
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
      if constexpr ((SIMT_DIAG & 1) != 0) xv[u] = 0u;
      else asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(xv[u]) : "l"(xw32 + (size_t)(kt0 + u * KS) * 32));
  };
  auto compute = [&](const auto& wv, const auto& p0, const auto& p1, const auto& xv) {
    constexpr int UU = sizeof(xv) / sizeof(xv[0]);
    if constexpr ((SIMT_DIAG & 1) != 0) {
#pragma unroll
      for (int u = 0; u < UU; ++u)
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int l = 0; l < LU; ++l)
            acc[r][l & 1] += as_f32((wv[u][r][l].x ^ wv[u][r][l].y ^ wv[u][r][l].z ^ wv[u][r][l].w) & 0x3f7fffffu) +
                             p0[u][r][0].scale() + p1[u][r][0].scale();
      return;
    }
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const TileX x = tile_x<ACT>(xv[u], t);
#pragma unroll
      for (int r = 0; r < RT; ++r) tile_dot<BITS, SCL, MODE, NP>(wv[u][r], p0[u][r], p1[u][r], x, acc[r]);
    }
  };

  if (!ROUTED) pdl_launch_dependents();
  int kt0 = ks;
  uint4 wA[U][RT][LU], wB[U][RT][LU];
  P a0[U][RT][NP], a1[U][RT][NP], b0[U][RT][NP], b1[U][RT][NP];
  u32 xA[U], xB[U];
  const bool full = kt0 + (U - 1) * KS < Kt;
  if (full) load_w(wA, a0, a1, kt0);  // the first step's constant bytes in flight before the wait
  if (!ROUTED && (SIMT_DIAG & 4) == 0) pdl_wait();  // x, bias and y only from here on (gemv_common.cuh)
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
