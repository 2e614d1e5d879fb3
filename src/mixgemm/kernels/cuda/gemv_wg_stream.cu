// mixgemm M = 1 weight-only GEMV over the wgmma GEMM's layout (wgmma_v1) as one contiguous stream of bulk copies.
//
// Why: in wgmma_v1 the 8 row tiles of a 128-row group lie together for each 64-k tile (a "unit": 4 KiB of int4, 8 KiB
// of int8), and the units of a row group follow each other along K, so the whole weight is one array of units. A GEMV
// that reads it a 16-row tile at a time (gemv_wg_simt.cu) issues 512-byte pieces 4-8 KiB apart; this one splits the
// array into one contiguous range per block (stream-K over units, every block the same share of bytes) and reads
// each range front to back with one cp.async.bulk per unit into a ring of S stages, so DRAM sees a few hundred long
// sequential streams, as it does for the plain codes' row-major GEMV.
//
// Block: CW consumer warps (warp w multiplies row tiles w * RT .. w * RT + RT - 1 of every unit, RT = 8 / CW) and one
// producer warp whose lane 0 issues the copies. Weights are constant, so the producer never waits for the previous
// kernel (PDL): the ring fills while that kernel drains; consumers wait before reading x. Per unit a consumer loads
// its x word and its rows' group parameters from global memory (L1 / L2) before waiting for the unit's bytes.
//
// Row groups split between blocks: each block adds its partial rows into a fp32 workspace (atomics) and counts itself
// in on the row group's counter; the block that counts last stores the rows (bias, clamp) and leaves the workspace and
// the counter zero for the next call. A row group inside one block's range is stored directly.

#include "wg_tile_math.cuh"
#include "wgmma_common.cuh"

#ifndef WGS_BITS
#define WGS_BITS 4
#endif
#ifndef WGS_ACT
#define WGS_ACT 0
#endif
#ifndef WGS_SCL
#define WGS_SCL 0
#endif
#ifndef WGS_MODE
#define WGS_MODE 0
#endif
#ifndef WGS_G32
#define WGS_G32 0
#endif
#ifndef WGS_CW
#define WGS_CW 8  // consumer warps: 8, 4 or 2 (RT = 8 / CW row tiles each)
#endif
#ifndef WGS_S
#define WGS_S 8  // ring stages (units)
#endif
#ifndef WGS_PACK
#define WGS_PACK 0
#endif

#define WGS_THREADS (32 * (WGS_CW + 1))

using namespace mgw;

extern "C" __global__ void __launch_bounds__(WGS_THREADS)
mixgemm_gemv_wg_stream(const uint4* __restrict__ W,      // wgmma_v1 codes
                       const char* __restrict__ params,  // wgmma_v1 parameters
                       const uint4* __restrict__ X,      // [1, >= 64 Kt] activations, zero-padded past K
                       int ldx4,
                       void* __restrict__ Y, int ldy,    // [1, N] activation dtype
                       const void* __restrict__ bias, int bias_kind,
                       float lo, float hi,
                       int N, int Kt, int G, int gk,     // gk: group of k is min(k >> gk, G - 1)
                       int Mr,
                       float* __restrict__ ws,           // [N_pad] fp32, zero on entry and on exit
                       int* __restrict__ cnt,            // [N_pad / 128], zero on entry and on exit
                       const int* __restrict__ perm      // (the GEMV parameter list's permutation; unused here)
) {
  constexpr int BITS = WGS_BITS, ACT = WGS_ACT, SCL = WGS_SCL, MODE = WGS_MODE;
  constexpr int CW = WGS_CW, S = WGS_S, RT = 8 / CW;
  static_assert(CW == 8 || CW == 4 || CW == 2, "WGS_CW: 8, 4 or 2 consumer warps");
  static_assert(ACT == 0 || ACT == 1, "fp16 or bf16 activations");
  constexpr int LU = BITS == 4 ? 1 : 2;      // uint4 per lane and tile
  constexpr int NP = WGS_G32 ? 2 : 1;        // parameter sets per tile (groups of 32 in a 64-k tile)
  constexpr int UNIT = 8 * 32 * LU;          // uint4 per unit (8 row tiles of one k-tile)
  static_assert(!WGS_PACK || (MODE != 0 && SCL != 2), "WGS_PACK: two 16-bit parameters per group");
  typedef typename PickParam<WGS_PACK != 0, SCL, MODE>::T P;

  extern __shared__ __align__(128) uint4 ring[];  // [S][UNIT]
  __shared__ __align__(8) unsigned long long bars[2 * S];
  __shared__ int last_flag;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const long long T = (long long)((N + 127) >> 7) * Kt;  // units
  const long long B = gridDim.x;
  const long long u0 = T * blockIdx.x / B, u1 = T * (blockIdx.x + 1) / B;
  const u32 full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[S]);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full0 + 8 * s, 1);    // the producer's arrive (+ the copy's bytes)
      mbar_init(empty0 + 8 * s, CW);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the last block-wide barrier: the producer warp leaves early
  pdl_launch_dependents();
  if (warp == CW) {
    if (lane == 0) {
      for (long long u = u0; u < u1; ++u) {
        const int i = (int)(u - u0), s = i % S;
        if (i >= S) mbar_wait(empty0 + 8 * s, ((i / S) - 1) & 1);
        mbar_expect_tx(full0 + 8 * s, (u32)(UNIT * 16));
        bulk_copy(smem_addr(ring + s * UNIT), W + u * UNIT, (u32)(UNIT * 16), full0 + 8 * s);
      }
    }
    return;
  }

  const u32* const xw32 = (const u32*)X + lane;
  auto load_params = [&](P (&p0)[RT][NP], P (&p1)[RT][NP], int rg, int kt) {
    const char* prow = params + ((size_t)rg * G * 128 + warp * RT * 16 + g) * P::PB;  // row g of the warp's tile 0
#pragma unroll
    for (int h = 0; h < NP; ++h) {
      const int grp = min((kt * 64 + 32 * h) >> gk, G - 1) * 128;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        p0[r][h].load(prow + r * 16 * P::PB, grp);
        p1[r][h].load(prow + (r * 16 + 8) * P::PB, grp);
      }
    }
  };
  auto load_x = [&](int kt) {
    u32 xu;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(xu) : "l"(xw32 + (size_t)kt * 32));
    return xu;
  };
  // Rows of row group rg: lanes t == 0 hold rows (warp RT + r) 16 + g and + 8 after the xor shuffles
  auto flush = [&](float (&acc)[RT][2], int rg, bool whole) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
    const int nb = rg * 128 + warp * RT * 16 + g;
    if (whole) {
      if (t == 0) {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int n = nb + r * 16 + 8 * i;
            if (n < N) store_output<ACT>(Y, n, n, acc[r][i], bias, bias_kind, lo, hi);
          }
      }
      return;
    }
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < 2; ++i) atomicAdd(ws + nb + r * 16 + 8 * i, acc[r][i]);
    }
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");  // consumer warps only
    if (threadIdx.x == 0) {
      // the blocks whose ranges meet this row group: block of unit u is floor(((u + 1) B - 1) / T)
      const long long first = ((long long)rg * Kt + 1) * B - 1, last = ((long long)(rg + 1) * Kt) * B - 1;
      const int parts = (int)(last / T - first / T) + 1;
      last_flag = atomicAdd(cnt + rg, 1) == parts - 1;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");
    if (last_flag) {
      __threadfence();
      for (int j = threadIdx.x; j < 128; j += 32 * CW) {
        const int n = rg * 128 + j;
        const float v = __ldcg(ws + n);
        ws[n] = 0.f;
        if (n < N) store_output<ACT>(Y, n, n, v, bias, bias_kind, lo, hi);
      }
      if (threadIdx.x == 0) cnt[rg] = 0;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");  // last_flag is rewritten by the next flush
  };

  pdl_wait();  // x, bias, y and the workspace only from here on (gemv_common.cuh)
  // x and the parameters of the next unit are loaded while this one is multiplied (register double buffering: an
  // L2 round trip per unit would otherwise sit between every unit's math and the next)
  P pa0[RT][NP], pa1[RT][NP], pb0[RT][NP], pb1[RT][NP];
  u32 xa = 0u, xb = 0u;
  auto step = [&](int s, int i, P (&p0)[RT][NP], P (&p1)[RT][NP], u32 xu, float (&acc)[RT][2]) {
    mbar_wait(full0 + 8 * s, (i / S) & 1);
    uint4 wv[RT][LU];
    const uint4* st = ring + s * UNIT + warp * RT * 32 * LU + lane;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int l = 0; l < LU; ++l) wv[r][l] = st[(r * LU + l) * 32];
    // release the slot once every lane has its words; the proxy fence orders these generic-proxy reads before the
    // async-proxy refill that follows the producer's wait (gemv.cu GEMV_BULK: stale chunks without it)
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
    const TileX x = tile_x<ACT>(xu, t);
#pragma unroll
    for (int r = 0; r < RT; ++r) tile_dot<BITS, SCL, MODE, NP>(wv[r], p0[r], p1[r], x, acc[r]);
  };
  long long u = u0;
  int i = 0;
  if (u < u1) {
    load_params(pa0, pa1, (int)(u / Kt), (int)(u % Kt));
    xa = load_x((int)(u % Kt));
  }
  while (u < u1) {
    const int rg = (int)(u / Kt), kt0 = (int)(u % Kt);
    const int kt1 = (int)min((long long)Kt, kt0 + (u1 - u));
    float acc[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r][0] = acc[r][1] = 0.f;
    // pairs of units, the buffers alternating without copies; the next unit's row group may be the next one
    int kt = kt0;
    for (; kt + 1 < kt1; kt += 2, i += 2) {
      load_params(pb0, pb1, rg, kt + 1);
      xb = load_x(kt + 1);
      step(i % S, i, pa0, pa1, xa, acc);
      const long long un = (long long)rg * Kt + kt + 2;  // the unit after the pair
      if (un < u1) {
        load_params(pa0, pa1, (int)(un / Kt), (int)(un % Kt));
        xa = load_x((int)(un % Kt));
      }
      step((i + 1) % S, i + 1, pb0, pb1, xb, acc);
    }
    if (kt < kt1) {
      const long long un = (long long)rg * Kt + kt + 1;
      if (un < u1) {
        load_params(pb0, pb1, (int)(un / Kt), (int)(un % Kt));
        xb = load_x((int)(un % Kt));
      }
      step(i % S, i, pa0, pa1, xa, acc);
      ++i;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < NP; ++h) {
          pa0[r][h] = pb0[r][h];
          pa1[r][h] = pb1[r][h];
        }
      xa = xb;
    }
    flush(acc, rg, kt0 == 0 && kt1 == Kt);
    u += kt1 - kt0;
  }
}
