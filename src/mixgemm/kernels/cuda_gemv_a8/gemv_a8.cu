// mixgemm activation-quantized GEMV for decode (W4A8 / W8A8), M = 1..16, ONE launch:
//   y[M, N] = clamp(Qa(x)[M, K] @ W[N, K].T + bias), Qa = per-token, per-block int8 quantization of x
//   (mixgemm.formats.activation.quantize_activation, "sym" = q8_1 or "asym" = min / max with an offset).
//
// Why a fused CUDA kernel: at M = 1 the Triton path (act-quant launch + 16-row mma.sync GEMM) reached
// 47-48% of the HBM floor; the separate quantization launch alone is 4.9 us of a 29.5 us floor. x is tiny
// (K = 8192 -> 16 KB), so every block quantizes the activations itself into shared memory (prologue, issued
// after the block's first weight loads so it hides under their latency) and then streams the weights.
//
// Prologue = exactly the reference's float32 ops (IEEE div / mul / sub intrinsics: NVRTC contracts a*b+c
// into FMA otherwise; rounding by + 1.5*2^23 = round half to even like torch.round, see quant8), so the int8
// codes, block sums and scales equal quantize_activation bit for bit. Codes go to shared memory in the order the
// lanes read the weight chunks (below), block scales / offsets / per-chunk sums beside them.
//
// Weight layout "a8gemv_v2" (layout.py beside this file): rows of Kw uint4 chunks of CH k (CH = 32 k for int4,
// 16 k for int8), unsigned codes q in the plain byte order. A step is 32 lanes x U chunks; at (step s, u) lane l
// reads position (s*U + u)*32 + l of the row (a warp load is 512 contiguous bytes), and its U chunks of the step are
// one "unit", folded into fp32 together (one int32 dot, one weight scale).
//   per-channel: position p holds chunk p: the plain buffer itself, no copy; lane l's unit is chunks (s*U + u)*32 + l.
//   grouped: position (s*U + u)*32 + l holds chunk (s*32 + l)*U + u, so a unit is U consecutive chunks inside one
//            group (a copy; on the plain order each chunk needed its own fold: up to 1.3x slower).
// Kp = K padded to a step sizes the shared activation codes; loads past Kw are predicated off (x codes 0 there).
//   int4: byte b of a word = code(k = 2b) | code(2b + 1) << 4 (plain order). w & 0x0F0F0F0F = the even codes as
//         bytes, w & 0xF0F0F0F0 = 16 x the odd codes: one LOP per 4 weights, no shift, no sign extension; the
//         activation codes are stored split the same way (even k, then odd k, per 8 k). dp4a.u32.s32 multiplies the
//         unsigned bytes with the signed x codes, and 16*even + odd - 128*sum(xq over the unit) = 16 * sum(c*xq)
//         exactly (c = q - 8), so the 16 and the +8 bias cost one IMAD each per unit, not per weight.
//   int8: unsigned codes in K order, dp4a.u32.s32; sum(q*xq) - 128*sum(xq over the unit) = sum(c*xq), c = q - 128.
// Per (row, group) float32 params, [N, Gp] (padded groups are zero): sdot = s (int8) or s / 16 (int4),
// moff = m, cterm = s * sum(c) + g * m, with w = c * s + m (layout int8_v1's rewrite of every mode).
// Math per (token m, row n): y = sum_units sA*sdot*dotq + sum_groups (sA*m*sum(xq) + oA*cterm) (the
// four-term formula of mixgemm.reference.block_gemm with the signed codes).

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
#ifndef A8_G  // quantization group along K (32..256), 0 = per-channel (one group = all K)
#define A8_G 128
#endif
#ifndef A8_U  // chunks per lane and step (layout property)
#define A8_U 4
#endif
#ifndef A8_R  // rows per warp
#define A8_R 4
#endif
#ifndef A8_RG  // row groups (warps along N) per block
#define A8_RG 8
#endif
#ifndef A8_KS  // warps along K per block (split-K inside the block)
#define A8_KS 1
#endif
#ifndef A8_AT  // 1 (grouped weights): one activation scale per token over the whole row (act_block "token"),
#define A8_AT 0  // quantized like per-channel, then written per group (scale repeated, code sums per group)
#endif
#ifndef A8_PF  // 1: register double buffering of the weight loads across steps and tiles
#define A8_PF 0
#endif
#ifndef A8_OPC  // > 0 (row-wide activation blocks, K % 8 == 0, Kp <= 8 * A8_OPC * threads): one-pass prologue,
#define A8_OPC 0  // each thread holds A8_OPC 8-k chunks of the row in registers (x read once, not twice)
#endif

#define A8_THREADS (32 * A8_RG * A8_KS)

#include "a8_prologue.cuh"  // (after A8_XT)

// Where the lanes read weight chunk kc: position p = (s*U + u)*32 + l of the row (the kernel's chunk_at inverted:
// p = kc for per-channel weights, the unit order for grouped ones). 8 codes of row m at k -> shared memory at piece
// v (16 k) of position p, ((p / 32) * NP + v) * 32 + p % 32: 16 contiguous bytes per lane, conflict-free reads.
template <int G, int U, int CH>
__device__ __forceinline__ int chunk_position(int kc) {
  return G > 0 ? ((kc / (32 * U)) * U + kc % U) * 32 + (kc / U) % 32 : kc;
}
// int4 codes go split (even k, then odd k), as the weight bytes' nibble pairs.
template <int G, int U, int CH>
struct ChunkPlace {
  static constexpr bool split() { return CH == 32; }
  static __device__ __forceinline__ void store(const Smem& sm, int m, int k, u32 w0, u32 w1) {
    constexpr int NP = CH / 16;
    const int p = chunk_position<G, U, CH>(k / CH), v = (k % CH) / 16, half = (k / 8) & 1;
    const int idx = ((p / 32) * NP + v) * 32 + p % 32;
    *(uint2*)(sm.codes + (size_t)m * sm.Kp + (size_t)idx * 16 + half * 8) = make_uint2(w0, w1);
  }
};

extern "C" __global__ void __launch_bounds__(A8_THREADS)
mixgemm_gemv_a8(const uint4* __restrict__ W,        // [N, Kw] uint4, layout a8gemv_v2
                const float* __restrict__ sdot,     // [N, Gp]
                const float* __restrict__ moff,     // [N, Gp] or null (no m term)
                const float* __restrict__ cterm,    // [N, Gp] (read only for asym activations)
                const void* __restrict__ X,         // [Mr, ldx] activations (fp16 / bf16 / fp32)
                int ldx,                            // row stride of X in elements (rows 16-byte aligned)
                void* __restrict__ Y,               // [Mr, ldy] output
                int ldy,
                int out_kind,                       // 0 fp16, 1 bf16, 2 fp32
                const void* __restrict__ bias,      // [N] or null
                int bias_kind,                      // 0 none, 1 f16, 2 bf16, 3 f32
                float lo, float hi,                 // output clamp
                int N, int K, int Kp, int Gp,       // K real, Kp padded, Gp = padded group count
                int asym,                           // activation mode: 0 sym, 1 asym
                int Mr,                             // rows of X / Y present, 1 <= Mr <= A8_M
                int Kw) {                           // uint4 chunks per weight row (Kw * CH >= K, <= Kp)
  constexpr int BITS = A8_BITS, M = A8_M, G = A8_G, U = A8_U, R = A8_R, RG = A8_RG, KS = A8_KS;
  constexpr int NT = A8_THREADS;
  constexpr int CH = BITS == 4 ? 32 : 16;  // k per chunk (one uint4 of weights)
  constexpr int NP = CH / 16;              // 16-byte pieces of x codes per chunk
  constexpr int UK = U * CH;               // k per unit (lane, step)
  static_assert(G == 0 || (G % UK == 0 && G <= 256), "a unit must lie inside one group");

  extern __shared__ uint4 smem4[];
  Smem sm;
  sm.Kp = Kp; sm.Gp = Gp; sm.NC = Kp / CH;
  sm.codes = (unsigned char*)smem4;
  sm.sA = (float*)(sm.codes + (size_t)M * Kp);
  sm.oA = sm.sA + M * Gp;
  sm.SAg = (int*)(sm.oA + M * Gp);
  sm.SAc = sm.SAg + M * Gp;
  const uint4* xs = smem4;
  __shared__ float red[KS][M][RG * R];
  __shared__ float pcr[2 * (NT / 32)];
  __shared__ int pcs;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp % RG, ks = warp / RG;
  const int S = Kp / (32 * UK);   // steps per row
  const int kp16 = Kp / 16;
  const int ntiles = (N + RG * R - 1) / (RG * R);
  const bool offs = asym || moff != nullptr;
  const int nsteps = ks < S ? (S - ks + KS - 1) / KS : 0;  // this warp's steps per tile

  // Lane l's U chunks at step s are one unit, folded into fp32 together (one int32 dot, one weight scale): chunks
  // (s*U + u)*32 + l for per-channel weights (the plain order), (s*32 + l)*U + u for grouped ones (inside one group).
  auto chunk_at = [&](int s, int u) { return G > 0 ? (s * 32 + lane) * U + u : (s * U + u) * 32 + lane; };
  // One work item = (tile, step): the U x R weight chunks of this lane and the R weight scales of its group.
  auto load = [&](uint4 (&wv)[U][R], float (&sb)[R], int tile, int s) {
    const int row0 = (tile * RG + rg) * R;
    const int grp = G ? chunk_at(s, 0) * CH / (G ? G : 1) : 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = min(row0 + r, N - 1);  // rows past N read row N-1 (valid memory), never stored
      const uint4* wr = W + (size_t)n * Kw;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int at = (s * U + u) * 32 + lane;  // 512 contiguous bytes per warp load
        wv[u][r] = at < Kw ? ld_stream(wr + at) : make_uint4(0u, 0u, 0u, 0u);  // past the row: x codes are 0
      }
      sb[r] = __ldg(sdot + (size_t)n * Gp + grp);
    }
  };
  float acc[M][R];
  auto compute = [&](const uint4 (&wv)[U][R], const float (&sb)[R], int s) {
    int ia[M][R][2];  // two independent dp4a chains per (token, row)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) ia[m][r][0] = ia[m][r][1] = 0;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < NP; ++v)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          // 16 contiguous bytes per lane, 512 per warp: conflict-free shared loads
          const uint4 xv = xs[(size_t)m * kp16 + ((s * U + u) * NP + v) * 32 + lane];
          const u32 xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const u32 w4[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
            if (BITS == 4) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const u32 w = w4[2 * v + h];
                ia[m][r][0] = dp4a_us(w & 0x0F0F0F0Fu, xw[2 * h], ia[m][r][0]);      // even-k codes
                ia[m][r][1] = dp4a_us(w & 0xF0F0F0F0u, xw[2 * h + 1], ia[m][r][1]);  // 16 x odd-k codes
              }
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) ia[m][r][t & 1] = dp4a_us(w4[t], xw[t], ia[m][r][t & 1]);
            }
          }
        }
    const int grp = G ? chunk_at(s, 0) * CH / (G ? G : 1) : 0;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float sa = sm.sA[m * Gp + grp];
      int corr = 0;  // sum of the x codes of this unit's chunks
#pragma unroll
      for (int u = 0; u < U; ++u) corr += sm.SAc[m * sm.NC + chunk_at(s, u)];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // int4: 16*even + odd = 16 sum(q xq); - 128 sum(xq) removes the +8 code bias: 16 sum(c xq), exact.
        // int8: sum(q xq) - 128 sum(xq) = sum(c xq), c = q - 128, exact.
        const int t = (BITS == 4 ? ia[m][r][0] * 16 : ia[m][r][0]) + ia[m][r][1] - 128 * corr;
        acc[m][r] = fmaf(i2f_small(t), sa * sb[r], acc[m][r]);
      }
    }
  };

  int tile = blockIdx.x;
  // PDL (sm_90, launched with programmatic stream serialization): the next kernel may start its own weight loads
  // during this one's last wave; this one loads only weights (never written by other kernels) before pdl_wait()
  pdl_launch_dependents();
  uint4 wA[U][R];
  float sA_[R];
  if (tile < ntiles && nsteps > 0) load(wA, sA_, tile, ks);  // first weight loads fly during the prologue
  pdl_wait();  // x, bias and y belong to other kernels: nothing touches them before this
  if (G > 0 && !A8_AT) {
    if (asym) prologue_grouped<true, M, (G > 0 ? G : 32), CH, NT, ChunkPlace<G, U, CH>>(sm, X, ldx, K, Mr);
    else prologue_grouped<false, M, (G > 0 ? G : 32), CH, NT, ChunkPlace<G, U, CH>>(sm, X, ldx, K, Mr);
  } else {
    if (asym) prologue_channel<true, M, CH, NT, G, A8_OPC, ChunkPlace<G, U, CH>>(sm, X, ldx, K, Mr, pcr, &pcs);
    else prologue_channel<false, M, CH, NT, G, A8_OPC, ChunkPlace<G, U, CH>>(sm, X, ldx, K, Mr, pcr, &pcs);
  }
  __syncthreads();

  // ------------------------------ main loop: persistent over row tiles ------------------------------
  for (; tile < ntiles; tile += gridDim.x) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    for (int j = 0; j < nsteps; ++j) {
      const int s = ks + j * KS;
#if A8_PF
      // Register double buffering: the next work item (next step, or the first step of the block's next
      // tile) is loaded before this one's math, so the warp keeps weight loads in flight while it computes.
      uint4 wB[U][R];
      float sB_[R];
      const bool last = j + 1 == nsteps;
      const int nt = last ? tile + (int)gridDim.x : tile;
      if (nt < ntiles) load(wB, sB_, nt, last ? ks : s + KS);
      compute(wA, sA_, s);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) wA[u][r] = wB[u][r];
#pragma unroll
      for (int r = 0; r < R; ++r) sA_[r] = sB_[r];
#else
      if (j > 0 || tile != (int)blockIdx.x) load(wA, sA_, tile, s);
      compute(wA, sA_, s);
#endif
    }
    if (offs) {
      // per (row, group): sA * m * sum(xq) + oA * (s sum(c) + g m)
      const int Gr = G ? K / (G ? G : 1) : 1;
      const int row0 = (tile * RG + rg) * R;
      for (int jg = ks * 32 + lane; jg < Gr; jg += 32 * KS) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int n = min(row0 + r, N - 1);
          const float mb = moff ? __ldg(moff + (size_t)n * Gp + jg) : 0.f;
          const float ct = asym ? __ldg(cterm + (size_t)n * Gp + jg) : 0.f;
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float t1 = sm.sA[m * Gp + jg] * mb * (float)sm.SAg[m * Gp + jg];
            acc[m][r] += asym ? fmaf(sm.oA[m * Gp + jg], ct, t1) : t1;
          }
        }
      }
    }

    // epilogue: warp reduce, the KS k-slices of each row meet in shared memory
    warp_sums_to_smem(acc, red[ks], rg, lane);
    __syncthreads();
    store_slices<KS, M, RG * R, NT>(red, tile * RG * R, N, Mr, Y, ldy, out_kind, bias, bias_kind, lo, hi);
    __syncthreads();  // red[] is rewritten by the next tile
  }
}
