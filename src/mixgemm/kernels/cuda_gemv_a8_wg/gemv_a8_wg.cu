// mixgemm activation-quantizing GEMV on the int8 wgmma GEMM's weights (W4A8 / W8A8, sym x sym), M = 1..16, ONE launch:
//   y[M, N] = clamp(Qa(x)[M, K] @ C[N, K].T * s + bias), Qa = per-token, per-block (or per-token) sym int8 codes of x.
//
// Why: a weight that keeps one resident layout (mixgemm.compact_) holds only wgmma_a8_v1, the int8 GEMM's register
// A-operand tiles. Without a GEMV reading those bytes its decode calls ran the GEMM (a 64-row tile for one token: up
// to 3x the fused GEMV's time on the plain codes). This is gemv_a8.cu's design on that layout: every block quantizes
// x into shared memory in its prologue (the same code, a8_prologue.cuh), after its first weight loads, then streams
// the weights with dp4a (A8_MMA 1: with mma.sync on the int8 tensor cores, whose fragments these words already are).
//
// Weight layout wgmma_a8_v1 (mixgemm/formats/layouts_wgmma_a8.py): 16-row x 128-k tiles, [N_pad / 128][KT][8 row
// tiles], TB = 1024 (int4) or 2048 (int8) bytes; lane l (g = l / 4, t = l % 4) holds 16-byte piece p at byte
// 512 p + 16 l. Its words hold rows g and g + 8 at k = 32 s + 4 t + (0..3) ("lo") and + 16 ("hi"), signed codes:
//   int4: piece p = words (s 2p, row g), (2p, g + 8), (2p + 1, g), (2p + 1, g + 8); each word's low nibbles are lo,
//         high nibbles hi (4-bit two's complement): (w << 4) & 0xF0F0F0F0 and w & 0xF0F0F0F0 are 16 c as exact
//         signed bytes (2 LOP + 1 shift per 8 codes), the 16 is in the params (s / 16).
//   int8: piece p = step s = p: (g, lo), (g + 8, lo), (g, hi), (g + 8, hi).
// So a lane's k never depend on g: the x codes are stored per (k-tile, piece pair, t) as the 16 bytes its lanes need,
// (s 2p lo, 2p hi, 2p + 1 lo, 2p + 1 hi) of quad t (WgPlace), one uint4 shared load (a broadcast to the 8 lanes of
// a quad, 64 distinct bytes per warp) per two steps serves both rows of every row tile. Sym weights and activations:
// no code sums, no offsets; y = sum over k-tiles of sA(token, block) * sW(row, group) * dot(k-tile).
// Params float32 [N_pad / 128][Gw][8][16]: s / 16 (int4) or s (int8) per row and weight group.
//
// Work: RT row tiles (16 rows) per warp share each x load; RG warps along N and KS along K per block; U k-tiles per
// step; PF register double buffering; a persistent grid (each block quantizes x once for all its tiles). Per k-tile
// the lane's int32 dot (|v| <= 32 k x 128 x 127 < 2^22) is folded into fp32 with the magic-number conversion; per
// channel the int32 dot runs over the whole K and is converted once.

#include "gemv_common.cuh"

#ifndef A8_BITS
#define A8_BITS 4
#endif
#ifndef A8_XT  // activation dtype: 0 fp16, 1 bf16, 2 fp32
#define A8_XT 0
#endif
#ifndef A8_M  // compiled token count (bucket); rows >= Mr are computed on row Mr - 1 and never stored
#define A8_M 1
#endif
#ifndef A8_G  // activation block / weight group along K (128, 256), 0 = per-channel (one block = the row)
#define A8_G 128
#endif
#ifndef A8_AT  // 1 (grouped weights): one activation scale per token over the whole row (act_block "token")
#define A8_AT 0
#endif
#ifndef A8_RT  // 16-row tiles per warp (divides 8)
#define A8_RT 1
#endif
#ifndef A8_U  // 128-k tiles per step
#define A8_U 1
#endif
#ifndef A8_RG  // warps along N per block
#define A8_RG 4
#endif
#ifndef A8_KS  // warps along K per block
#define A8_KS 2
#endif
#ifndef A8_PF  // 1: register double buffering of the weight loads across steps and tiles
#define A8_PF 0
#endif
#ifndef A8_OPC  // > 0 (row-wide activation blocks, K % 8 == 0): one-pass prologue (gemv_a8.cu)
#define A8_OPC 0
#endif

#ifndef A8_MMA  // 1: the math on the int8 tensor cores (below), 0: dp4a on CUDA cores
#define A8_MMA 0
#endif

#define A8_THREADS (32 * A8_RG * A8_KS)

#include "a8_prologue.cuh"  // (after A8_XT)

// 8 codes of row m at k (k % 8 == 0: quad t even, w1 is quad t + 1) -> the word (s, hi) of quad t's 16 bytes.
struct WgPlace {
  static constexpr bool split() { return false; }
  static __device__ __forceinline__ void store(const Smem& sm, int m, int k, u32 w0, u32 w1) {
    const int kk = k & 127, s = kk >> 5, hi = (kk >> 4) & 1, t = (kk >> 2) & 3;
    unsigned char* p = sm.codes + (size_t)m * sm.Kp + (k & ~127) + ((s >> 1) * 4 + t) * 16 + ((s & 1) * 2 + hi) * 4;
    *(u32*)p = w0;
    *(u32*)(p + 16) = w1;
  }
};

__device__ __forceinline__ int dp4a_ss(u32 a, u32 b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// D = A (16 x 32 int8, row) * B (32 x 8 int8, col) + D, int32: the layout's four words of one step are A's fragment
// and quad t's lo / hi x words of token g are B's, so neither needs a shuffle or a repack.
__device__ __forceinline__ void mma_s8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(A8_THREADS)
mixgemm_gemv_a8_wg(const uint4* __restrict__ W,     // wgmma_a8_v1 weight
                   const float* __restrict__ P,     // params [N_pad / 128][Gw][8][16]
                   const void* __restrict__ X,      // [Mr, ldx] activations (fp16 / bf16 / fp32), rows 16-byte aligned
                   int ldx,
                   void* __restrict__ Y,            // [Mr, ldy] output
                   int ldy,
                   int out_kind,                    // 0 fp16, 1 bf16, 2 fp32
                   const void* __restrict__ bias,   // [N] or null
                   int bias_kind,                   // 0 none, 1 f16, 2 bf16, 3 f32
                   float lo, float hi,              // output clamp
                   int N, int K, int Kp,            // K real; Kp: K padded to whole steps (and activation blocks)
                   int KT, int Gw, int Gp,          // the layout's k-tiles and weight groups; activation blocks (smem)
                   int Mr) {                        // rows of X / Y present, 1 <= Mr <= A8_M
  constexpr int BITS = A8_BITS, M = A8_M, G = A8_G, RT = A8_RT, U = A8_U, RG = A8_RG, KS = A8_KS;
  constexpr int NT = A8_THREADS;
  constexpr int PC = BITS == 4 ? 2 : 4;  // 16-byte pieces per lane and k-tile
  constexpr int TBU = 32 * PC;           // uint4 per 16 x 128 tile
  constexpr int WR = 16 * RG * RT;       // rows per block tile
  static_assert(8 % RT == 0, "a warp's row tiles lie in one 128-row group");

  extern __shared__ uint4 smem4[];
  Smem sm;
  sm.Kp = Kp; sm.Gp = Gp; sm.NC = Kp / 32;
  sm.codes = (unsigned char*)smem4;
  sm.sA = (float*)(sm.codes + (size_t)M * Kp);
  sm.oA = sm.sA + M * Gp;
  sm.SAg = (int*)(sm.oA + M * Gp);
  sm.SAc = sm.SAg + M * Gp;
  const uint4* xs = smem4;
  __shared__ float red[KS][M][WR];
  __shared__ float pcr[2 * (NT / 32)];
  __shared__ int pcs;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rg = warp % RG, ks = warp / RG;
  const int S = Kp / (128 * U);  // steps per row
  const int tiles16 = (N + 15) / 16;
  const int ntiles = (tiles16 + RG * RT - 1) / (RG * RT);
  const int nsteps = ks < S ? (S - ks + KS - 1) / KS : 0;

  // first row tile of this warp in block tile bt (its RT tiles are contiguous, inside one 128-row group)
  auto first_tile = [&](int bt) { return (bt * RG + rg) * RT; };
  // One work item = (block tile, step): the lane's PC pieces of its RT tiles for U k-tiles, and (grouped weights)
  // the two rows' scales of each.
  auto load = [&](uint4 (&wv)[U][RT][PC], float (&sb)[U][RT][2], int bt, int s) {
    const int rt0 = first_tile(bt);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = s * U + u;
      const bool in = kt < KT;  // past the layout's k-tiles: zero words (the x codes there are 0 too)
      const int gi = G > 0 ? min(kt, KT - 1) * 128 / (G > 0 ? G : 128) : 0;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const int rt = rt0 + r;
        const uint4* base = W + (((size_t)(rt >> 3) * KT + min(kt, KT - 1)) * 8 + (rt & 7)) * TBU + lane;
#pragma unroll
        for (int p = 0; p < PC; ++p) wv[u][r][p] = in ? ld_stream(base + 32 * p) : make_uint4(0u, 0u, 0u, 0u);
        if (G > 0) {
          const float* pr = P + (((size_t)(rt >> 3) * Gw + gi) * 8 + (rt & 7)) * 16 + g;
          sb[u][r][0] = __ldg(pr);
          sb[u][r][1] = __ldg(pr + 8);
        }
      }
    }
  };

#if A8_MMA
  // Tensor-core math: per 32 k one mma.m16n8k32 per row tile and 8 tokens (NN column tiles), where dp4a takes
  // 4 M instructions a lane; at M = 1..2 on a layer small enough that its math follows the PDL wait undivided (the
  // loads issued before it), the dp4a math is what the call waits on. Lane (g, t) ends with rows g, g + 8 of tokens
  // 2t, 2t + 1 (+ 8 nn): c[2h + j]. Same exactness as dp4a: a k-tile's int32 sum stays below 2^22.
  // NCH independent accumulator chains per row tile (the steps of a k-tile take turns): a lone chain of dependent
  // mmas waits out the mma's latency at every step where RT x NN are too few to fill it.
  constexpr int NN = (M + 7) / 8, NCH = RT >= 4 ? 1 : 4 / RT;
  float acc[RT][NN][4];
  int cm[NCH][RT][NN][4];  // int32 dots: grouped, of one k-tile (folded into acc after it); per channel, of all K
  auto zero_dots = [&] {
#pragma unroll
    for (int c = 0; c < NCH; ++c)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nn = 0; nn < NN; ++nn)
#pragma unroll
          for (int j = 0; j < 4; ++j) cm[c][r][nn][j] = 0;
  };
  auto dot = [&](int r, int nn, int j) {
    int v = cm[0][r][nn][j];
#pragma unroll
    for (int c = 1; c < NCH; ++c) v += cm[c][r][nn][j];
    return v;
  };
  auto compute = [&](const uint4 (&wv)[U][RT][PC], const float (&sb)[U][RT][2], int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = s * U + u;
      if (G > 0) zero_dots();
#pragma unroll
      for (int q = 0; q < 2; ++q) {  // piece pairs: steps 2q, 2q + 1
        uint4 xv[NN];  // token nn 8 + g's (2q lo, 2q hi, 2q + 1 lo, 2q + 1 hi) of quad t; tokens past M: zero
#pragma unroll
        for (int nn = 0; nn < NN; ++nn) {
          const int tok = nn * 8 + g;
          xv[nn] = tok < M ? xs[((size_t)tok * Kp + (size_t)kt * 128) / 16 + q * 4 + t] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          u32 a[2][4];  // A of steps 2q, 2q + 1: (row g lo, g + 8 lo, g hi, g + 8 hi)
          if (BITS == 4) {
            const uint4 w = wv[u][r][q];  // (2q, g), (2q, g + 8), (2q + 1, g), (2q + 1, g + 8); 16 c as bytes
            const u32 wd[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              a[j][0] = (wd[2 * j] << 4) & 0xF0F0F0F0u;
              a[j][1] = (wd[2 * j + 1] << 4) & 0xF0F0F0F0u;
              a[j][2] = wd[2 * j] & 0xF0F0F0F0u;
              a[j][3] = wd[2 * j + 1] & 0xF0F0F0F0u;
            }
          } else {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint4 w = wv[u][r][2 * q + j];  // step 2q + j: (g lo, g + 8 lo, g hi, g + 8 hi)
              a[j][0] = w.x; a[j][1] = w.y; a[j][2] = w.z; a[j][3] = w.w;
            }
          }
#pragma unroll
          for (int nn = 0; nn < NN; ++nn) {
            mma_s8(cm[(2 * q) % NCH][r][nn], a[0], xv[nn].x, xv[nn].y);
            mma_s8(cm[(2 * q + 1) % NCH][r][nn], a[1], xv[nn].z, xv[nn].w);
          }
        }
      }
      if (G > 0) {
        const int ga = min(kt * 128 / (G > 0 ? G : 128), Gp - 1);
#pragma unroll
        for (int nn = 0; nn < NN; ++nn)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float sa = sm.sA[min(nn * 8 + 2 * t + j, M - 1) * Gp + ga];  // (tokens past M: never stored)
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                acc[r][nn][2 * h + j] = fmaf(i2f_small(dot(r, nn, 2 * h + j)), sa * sb[u][r][h], acc[r][nn][2 * h + j]);
          }
      }
    }
  };
#else
  float acc[M][RT][2];
  int ia[M][RT][2];  // the int32 dot: grouped, of one k-tile (folded into acc after it); per channel, over all of K
  auto compute = [&](const uint4 (&wv)[U][RT][PC], const float (&sb)[U][RT][2], int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = s * U + u;
      if (G > 0) {
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < RT; ++r) ia[m][r][0] = ia[m][r][1] = 0;
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {  // piece pairs: the x words of steps 2q, 2q + 1
        // per tile, the 8 words that meet x's (2q lo, 2q hi, 2q + 1 lo, 2q + 1 hi): row g in a[r][0..3], g + 8 in
        // a[r][4..7]; int4 as 16 c bytes (lo nibbles shifted up, hi nibbles masked)
        u32 a[RT][8];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          if (BITS == 4) {
            const uint4 w = wv[u][r][q];  // (2q, g), (2q, g + 8), (2q + 1, g), (2q + 1, g + 8)
            const u32 wd[4] = {w.x, w.z, w.y, w.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              a[r][2 * i] = (wd[i] << 4) & 0xF0F0F0F0u;
              a[r][2 * i + 1] = wd[i] & 0xF0F0F0F0u;
            }
          } else {
            const uint4 w0 = wv[u][r][2 * q], w1 = wv[u][r][2 * q + 1];  // (g lo, g + 8 lo, g hi, g + 8 hi)
            a[r][0] = w0.x; a[r][1] = w0.z; a[r][2] = w1.x; a[r][3] = w1.z;
            a[r][4] = w0.y; a[r][5] = w0.w; a[r][6] = w1.y; a[r][7] = w1.w;
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = xs[((size_t)m * Kp + (size_t)kt * 128) / 16 + q * 4 + t];
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const u32* ah = a[r] + 4 * h;
              ia[m][r][h] = dp4a_ss(ah[3], xv.w, dp4a_ss(ah[2], xv.z, dp4a_ss(ah[1], xv.y, dp4a_ss(ah[0], xv.x,
                            ia[m][r][h]))));
            }
        }
      }
      if (G > 0) {
        const int ga = kt * 128 / (G > 0 ? G : 128);  // activation block (k-tiles past K: zero codes, any scale)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float sa = sm.sA[m * Gp + min(ga, Gp - 1)];
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) acc[m][r][h] = fmaf(i2f_small(ia[m][r][h]), sa * sb[u][r][h], acc[m][r][h]);
        }
      }
    }
  };

#endif

  int bt = blockIdx.x;
  pdl_launch_dependents();
  uint4 wA[U][RT][PC];
  float sA_[U][RT][2];
  const bool live0 = bt < ntiles && first_tile(bt) < tiles16;
  if (live0 && nsteps > 0) load(wA, sA_, bt, ks);  // first weight loads fly during the prologue
  pdl_wait();  // x, bias and y belong to other kernels: nothing touches them before this
  if (G > 0 && !A8_AT) {
    prologue_grouped<false, M, (G > 0 ? G : 128), 32, NT, WgPlace, false>(sm, X, ldx, K, Mr);
  } else {
    prologue_channel<false, M, 32, NT, G, A8_OPC, WgPlace, false>(sm, X, ldx, K, Mr, pcr, &pcs);
  }
  __syncthreads();

  for (; bt < ntiles; bt += gridDim.x) {
    const int rt0 = first_tile(bt);
    const bool live = rt0 < tiles16;  // (uniform per warp)
#if A8_MMA
    zero_dots();
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int nn = 0; nn < NN; ++nn)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][nn][j] = 0.f;
#else
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < RT; ++r) acc[m][r][0] = acc[m][r][1] = 0.f, ia[m][r][0] = ia[m][r][1] = 0;
#endif
    if (live) {
      for (int j = 0; j < nsteps; ++j) {
        const int s = ks + j * KS;
#if A8_PF
        // the next work item (next step, or the first step of the block's next tile) loads before this one's math
        uint4 wB[U][RT][PC];
        float sB_[U][RT][2];
        const bool last = j + 1 == nsteps;
        const int nb = last ? bt + (int)gridDim.x : bt;
        if (nb < ntiles && first_tile(nb) < tiles16) load(wB, sB_, nb, last ? ks : s + KS);
        compute(wA, sA_, s);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int p = 0; p < PC; ++p) wA[u][r][p] = wB[u][r][p];
            sA_[u][r][0] = sB_[u][r][0];
            sA_[u][r][1] = sB_[u][r][1];
          }
#else
        if (j > 0 || bt != (int)blockIdx.x) load(wA, sA_, bt, s);
        compute(wA, sA_, s);
#endif
      }
      if (G == 0) {  // per channel: one scale per row
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const int rt = rt0 + r;
          const float* pr = P + ((size_t)(rt >> 3) * 8 + (rt & 7)) * 16 + g;
          const float s0 = __ldg(pr), s1 = __ldg(pr + 8);
#if A8_MMA
#pragma unroll
          for (int nn = 0; nn < NN; ++nn)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float sa = sm.sA[min(nn * 8 + 2 * t + j, M - 1) * Gp];
              acc[r][nn][j] = (float)dot(r, nn, j) * (sa * s0);
              acc[r][nn][2 + j] = (float)dot(r, nn, 2 + j) * (sa * s1);
            }
#else
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float sa = sm.sA[m * Gp];
            acc[m][r][0] = (float)ia[m][r][0] * (sa * s0);
            acc[m][r][1] = (float)ia[m][r][1] * (sa * s1);
          }
#endif
        }
      }
    }
#if A8_MMA
    // each lane holds whole dots of its (row, token) pairs
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int nn = 0; nn < NN; ++nn)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int tok = nn * 8 + 2 * t + (j & 1);
          if (tok < M) red[ks][tok][(rg * RT + r) * 16 + g + 8 * (j >> 1)] = acc[r][nn][j];
        }
#else
    // the quad's four lanes split k: two xor shuffles; then lane t == 0 holds rows g and g + 8 of each tile
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = acc[m][r][h];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (t == 0) red[ks][m][(rg * RT + r) * 16 + g + 8 * h] = v;
        }
#endif
    __syncthreads();
    store_slices<KS, M, WR, NT>(red, bt * WR, N, Mr, Y, ldy, out_kind, bias, bias_kind, lo, hi);
    __syncthreads();  // red[] is rewritten by the next tile
  }
}
