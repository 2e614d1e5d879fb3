// mixgemm weight-only GEMV on tensor cores (mma.sync m16n8k16), fp16 / bf16 activations, M = 1..16.
//
// Why tensor cores for a GEMV: the CUDA-core kernel (gemv.cu) pays one activation load per weight
// row and M times the f16x2 FMAs; here one mma does 16 rows x 16 k x 8 (or 16) activation rows for the
// cost of one instruction, so the per-weight work is only the dequantization (lop3 / prmt magic
// numbers, one sub and one mul per pair) and M = 16 costs about what M = 1 does. Triton could not get
// there: on the H200 of the benchmark protocol a plain Triton GEMV reached 15-27% of copy bandwidth,
// gemlite's tuned Triton ~42% at W4 (unpack-bound).
//
// "Swap AB": A (16 x 16, row) = a 16-row tile of dequantized weights, B (16 x 8, col) = 8 activation
// rows, C (16 x 8, fp32) = y^T. Lane (g = lane / 4, t = lane % 4) holds A rows g and g + 8.
// Weight layout "gemv_mma_v1" (mixgemm/kernels/cuda_gemv_mma/layout.py): tiles of 16 rows x KT k (KT = 64 int4,
// 32 int8), each tile 512 bytes = one uint4 per lane, tiles ordered [N / 16][Kp / KT]. Lane (g, t) of
// a tile covers k = KL * t .. KL * t + KL - 1 (KL = KT / 4) of rows g and g + 8, so its activations are
// one contiguous 2 * KL-byte piece of each x row. The mma k order is permuted (same for A and B, so the
// product is unchanged): in step s, mma k (2t, 2t+1) is k = KL t + 4s + (0, 1) and mma k (2t+8, 2t+9)
// is k = KL t + 4s + (2, 3).
//   int4: word s (s = 0..3) of the lane's uint4 has nibble p = element PERM[p] (PERM = 0,2,4,6,1,3,5,7)
//         of e = (W[g][k0], W[g][k0+1], W[g+8][k0], W[g+8][k0+1], W[g][k0+2], W[g][k0+3],
//         W[g+8][k0+2], W[g+8][k0+3]) with k0 = 16t + 4s: one lop3 gives the A register pair.
//   int8: words 2s / 2s + 1 (s = 0, 1) are the bytes W[g][k0..k0+3] / W[g+8][k0..k0+3], k0 = 8t + 4s.
// Dequantization: w = (q - zc) * s (+ (m + zc * s) for offset) formed exactly as (q - zc) by magic
// numbers, then one rounding to fp16 / bf16 (mul, or fma for offset); mma accumulates in fp32 over all K.
//
// MMA_WG 1 reads the wgmma GEMM's layout "wgmma_v1" (mixgemm/formats/layouts_wgmma.py) instead, so one copy of the
// codes serves this kernel and the GEMM: 64-k tiles for both bit widths (int8: two uint4 per lane), tiles ordered
// [N / 128][Kp / 64][8 row tiles], the natural A-fragment k order (step s = k 16 s .. 16 s + 15; lane t's pairs at
// k 16 s + 2 t and 16 s + 2 t + 8), parameters [N / 128][G][8][16] rows of one group together. In that order a
// lane's B fragment is 8 words of x 16 bytes apart, which per-lane global loads cannot fetch at full width (measured:
// load-issue bound, up to 1.8x slower). So each warp copies its tiles' x rows into its own shared-memory ring with
// cp.async (16-byte pieces, issued with the weight loads) and reads the B fragments with ldmatrix: one x4 gives two
// k16 steps of 8 x rows. Pieces are XOR-swizzled by row so the 8 rows of a matrix hit 8 different bank groups.
// Groups of 32 (MMA_G32) put two parameter sets in a tile: steps 0-1 and 2-3 are scaled apart.
// The default for int8 weights (twice the bytes per lane and tile of gemv_mma_v1's 32-k tiles: faster there); int4
// stays on gemv_mma_v1, where this path is still slower at M = 16 (3-6% by geometric mean over 14 model layers, up to
// 21%; kernels/cuda_gemv_mma/host.py MMA_ON_WGMMA). M = 1 on wgmma_v1 runs on CUDA cores (gemv_wg_simt.cu). The
// ring's cost is its instructions, not shared-memory bandwidth (ncu): B fragments by warp shuffles (a 4 x 4 word transpose over a
// row's lanes) measured the same, and x gathered once per call into B-fragment order by one more launch was slower.

#include "mma_frag.cuh"

#ifndef MMA_BITS
#define MMA_BITS 4
#endif
#ifndef MMA_ACT
#define MMA_ACT 0
#endif
#ifndef MMA_SCL
#define MMA_SCL 0
#endif
#ifndef MMA_MODE
#define MMA_MODE 0
#endif
#ifndef MMA_MB
#define MMA_MB 1
#endif
#ifndef MMA_U
#define MMA_U 2
#endif
#ifndef MMA_RG
#define MMA_RG 2
#endif
#ifndef MMA_KS
#define MMA_KS 4
#endif
#ifndef MMA_PF
#define MMA_PF 1
#endif
// MMA_DEFER: where the scale is applied (see "Deferred scaling" below). 0 = per weight pair in fp16/bf16
// (any group size), 1 = A holds the exact integers q - z and each tile's fp32 mma result is scaled once;
// 1 needs every 16 x KT tile inside one quantization group (int4: group >= 64; int8: any group;
// per-channel): the host checks.
#ifndef MMA_DEFER
#define MMA_DEFER 0
#endif

// 1: act-order layer: x[perm[k]] where x[k] is read otherwise (perm: the last kernel parameter, int32; gemv_common.cuh
// ld_perm / gather_x); each lane gathers its own pieces, the indices loaded once for all its B rows.
#ifndef MMA_PERM
#define MMA_PERM 0
#endif

#ifndef MMA_WG
#define MMA_WG 0
#endif
// MMA_ROWS 1: int8 weights in rows_v1 (mixgemm/formats/layouts_rows.py: row-major, k permuted inside each 16 so that
// word w of a 16-byte chunk holds k 2w, 2w + 1, 2w + 8, 2w + 9 of it). Lane (g, t) loads chunk t of each 64-k tile of
// rows g and g + 8 (one uint4 each) and gives word s of it to mma step s: the mma's k slots of lane t in step s are
// chunk t's k 2s, 2s + 1, 2s + 8, 2s + 9, so its B fragment is words s and s + 4 of its own 16 contiguous k of x
// (two uint4 per x row, as gemv_mma_v1's pieces), no ring. Why: the wgmma GEMM and the CUDA-core GEMV read the same
// rows, so an int8 weight kept in rows_v1 holds one copy of its codes (opt-in: a warp load here is 16 rows x 64
// bytes, slower than wgmma_v1's 512 contiguous bytes, docs/kernels/cuda_gemv_mma.md). Parameters as wgmma_v1's. A step spans all 64 k
// of the tile: MMA_DEFER needs groups of at least 64 (the host checks).
#ifndef MMA_ROWS
#define MMA_ROWS 0
#endif
// RT 16-row tiles per warp: one staging of x and one set of B fragments serve RT tiles' mma (at M = 16 the x
// traffic through shared memory / L1 is 4x the int4 weight bytes of a tile, the limit of the MMA_WG ring otherwise)
#ifndef MMA_RT
#define MMA_RT 1
#endif
// 1: the first step's weights and parameters are loaded before the PDL wait (else only prefetched to L2)
#ifndef MMA_EARLY
#define MMA_EARLY 0
#endif
#ifndef MMA_G32
#define MMA_G32 0
#endif

// 1: a zero point's or offset's 16-bit (scale, second) pair stays the one word it was loaded as until the
// dequantization uses it (gemv_common.cuh PackedParam: split where it lands, a prefetched pair stalls the warp there)
#ifndef MMA_PACK
#define MMA_PACK 0
#endif

#define MMA_THREADS (32 * MMA_RG * MMA_KS)
// MMA_MINB: blocks per SM the registers must allow (__launch_bounds__' second argument). Why: a 16-warp block of the
// zero-point kernel at RT 1 takes 74 registers a thread where sym takes 64, which leaves room for one block per SM
// instead of two; capping it at two blocks' worth (a few spilled bytes) gives it the occupancy sym has.
#ifndef MMA_MINB
#define MMA_MINB 0
#endif
#if MMA_MINB > 1
#define MMA_BOUNDS __launch_bounds__(MMA_THREADS, MMA_MINB)
#else  // (without the second argument: an explicit 1 let ptxas take 92 registers where it takes 64)
#define MMA_BOUNDS __launch_bounds__(MMA_THREADS)
#endif

using namespace mg;

namespace mgm {

// not volatile: pure arithmetic, free to interleave with the next tile's dequantization
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

// 16-byte global -> shared copy through L1 (.ca: the x rows are read by every row-group warp of the block); d: a
// shared-memory address
__device__ __forceinline__ void cp_async16(u32 d, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

}  // namespace mgm

using namespace mgm;

extern "C" __global__ void MMA_BOUNDS
mixgemm_gemv_mma(const uint4* __restrict__ W,      // gemv_mma_v1: [Nt][Kt][32] uint4; MMA_WG: wgmma_v1
                 const char* __restrict__ params,  // gemv_mma_v1: [N, G] groups of Param::PB bytes; MMA_WG: wgmma_v1's
                 const uint4* __restrict__ X,      // [M, ldx4] uint4, zero-padded to Kp
                 int ldx4,
                 void* __restrict__ Y, int ldy,    // [M, ldy] activation dtype
                 const void* __restrict__ bias, int bias_kind,
                 float lo, float hi,
                 int N, int Kt, int G, int gk,     // gk: group of k is min(k >> gk, G - 1)
                 int Mr,
                 const int* __restrict__ perm) {   // MMA_PERM: [Kp] input permutation (else unused, may be null)
  constexpr int BITS = MMA_BITS, ACT = MMA_ACT, SCL = MMA_SCL, MODE = MMA_MODE;
  constexpr int MB = MMA_MB, U = MMA_U, RG = MMA_RG, KS = MMA_KS, RT = MMA_RT;
  constexpr bool WG = MMA_WG != 0;
  constexpr bool ROWS = MMA_ROWS != 0;
  static_assert(!ROWS || (BITS == 8 && !WG && !MMA_G32), "MMA_ROWS: int8 rows_v1 (groups of 32 per lane)");
  constexpr int KT = (WG || ROWS || BITS == 4) ? 64 : 32, KL = KT / 4;
  constexpr int LU = KT * BITS / 256;          // uint4 of weights per lane and tile (int8 on wgmma_v1: 2)
  constexpr int STEPS = KT / 16;               // k16 mma steps per tile
  constexpr int NP = WG && MMA_G32 ? 2 : 1;    // parameter sets per tile (groups of 32 in a 64-k tile)
  constexpr int XV = WG ? 1 : KL * 2 / 16;     // uint4 of activations per lane, tile and B block (gemv_mma_v1)
  constexpr int XR = 8 * MB;                   // activation rows a tile's B fragments cover
  // uint4 from one k-tile of a row tile to the next
  constexpr size_t TSTEP = WG ? 8 * 32 * LU : ROWS ? 4 : 32;
  constexpr int GSTR = WG || ROWS ? 128 : 1;   // parameter entries from one group of a row to the next
  const size_t lstep = ROWS ? (size_t)8 * Kt * 4 : 32;  // uint4 from a lane's load l to l + 1 (ROWS: row g + 8)
  constexpr float ZBIAS = BITS == 4 ? 8.f : 128.f;
  static_assert(!MMA_PACK || (MODE != 0 && SCL != 2), "MMA_PACK: two 16-bit parameters per group");
  typedef typename PickParam<MMA_PACK != 0, SCL, MODE>::T P;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int rg = warp % RG, ks = warp / RG;
  const int nt0 = (blockIdx.x * RG + rg) * RT;  // this warp's first row tile
  const int Nt = (N + 15) >> 4;
  const uint4* wt[RT];
  const char* prow0[RT];  // row g's and row g + 8's parameters (wgmma_v1 pads rows to 128 with zeros: no clamp)
  const char* prow1[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int ntc = min(nt0 + r, Nt - 1);  // tiles past the last one redo it and are never stored
    // (rows_v1 pads its rows to a multiple of 16: row g + 8 of the last tile exists)
    wt[r] = WG     ? W + ((size_t)(ntc >> 3) * Kt * 8 + (ntc & 7)) * 32 * LU + lane
            : ROWS ? W + (size_t)(ntc * 16 + g) * Kt * 4 + t
                   : W + (size_t)ntc * Kt * 32 + lane;
    prow0[r] = WG || ROWS ? params + ((size_t)(ntc >> 3) * G * 128 + (ntc & 7) * 16 + g) * P::PB
                  : params + (size_t)min(ntc * 16 + g, N - 1) * G * P::PB;
    prow1[r] = WG || ROWS ? prow0[r] + 8 * P::PB : params + (size_t)min(ntc * 16 + g + 8, N - 1) * G * P::PB;
  }
  const uint4* xrow[MB];  // this lane's piece of each B row (MMA_PERM: the row itself)
#pragma unroll
  for (int b = 0; b < MB; ++b) xrow[b] = X + (size_t)min(g + 8 * b, Mr - 1) * ldx4 + (MMA_PERM ? 0 : t * XV);
  const int xrows = min(Mr, XR);  // activation rows copied (the ring); B columns past them read the last one
#if MMA_WG
  // this warp's ring: (MMA_PF ? 2 : 1) x U slots of XR rows x 64 k (8 uint4 per row, swizzled by row)
  extern __shared__ uint4 xsm[];
  constexpr int SLOTS = (MMA_PF ? 2 : 1) * U;
  uint4* const ring = xsm + (size_t)warp * SLOTS * XR * 8;
  constexpr u32 SLOT_BYTES = XR * 8 * 16;
  const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
  // Copies at RT 1: a lane's piece i (of PIECES) is row (l >> 3) + 4 i, 16-byte column l & 7, stored at column
  // (l & 7) ^ (row & 7) = (l & 7) ^ (l >> 3) ^ 4 (i & 1) (l >> 3 < 4): a per-lane constant plus the slot, the k-tile
  // and i, so the unrolled copies cost an add each. Why: with each piece's row, column and swizzle worked out per k-tile
  // the ring issued about twice the instructions of the plain-layout kernel (ncu), and one row tile per warp has too
  // few warps to hide them. At RT 2 the unrolled copies' hoisted addresses took 96 registers (80 as a loop) and cost
  // resident warps, so RT > 1 keeps the loop.
  constexpr int PIECES = XR * 8 / 32;
  const int xr0 = lane >> 3;
  const int xsrc = xr0 * ldx4 + (lane & 7);               // piece 0 of k-tile 0 (uint4); piece i of kt: + 4 i rows + 8 kt
  const u32 xdst0 = (xr0 * 8 + ((lane & 7) ^ xr0)) * 16;  // even pieces (odd: ^ 64); + 512 i bytes
  // ldmatrix h of B block b: lane l addresses row min(8 b + (l & 7), xrows - 1) at 16-byte column 4 h + (l >> 3),
  // swizzled as stored
  auto ldm_offset = [&](int b, int h) -> u32 {
    const int r = min(8 * b + (lane & 7), xrows - 1), j = 4 * h + (lane >> 3);
    return (r * 8 + (j ^ (r & 7))) * 16;
  };
#endif

  float acc[RT][MB][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int b = 0; b < MB; ++b) acc[r][b][0] = acc[r][b][1] = acc[r][b][2] = acc[r][b][3] = 0.f;

  auto group_of = [&](int kt, int h) { return min((kt * KT + (WG ? 32 * h : KL * t)) >> gk, G - 1); };
  // the ring: the x rows of k-tile kt into ring slot `slot` (cp.async, or gathered through perm for act-order layers)
  auto stage_x = [&](int slot, int kt) {
#if MMA_WG && MMA_PERM
    uint4* dst = ring + slot * XR * 8;
    for (int p = lane; p < xrows * 8; p += 32) {
      const int r = p >> 3, j = p & 7;
      int pk[8];
      ld_perm(perm, kt * KT + 8 * j, pk);
      dst[r * 8 + (j ^ (r & 7))] = gather_x((const char*)(X + (size_t)r * ldx4), pk);
    }
#elif MMA_WG
    const u32 dst = ring_s + slot * SLOT_BYTES;
    if (RT == 1) {
      const int src = xsrc + kt * 8;
#pragma unroll
      for (int i = 0; i < PIECES; ++i)
        if (xr0 + 4 * i < xrows) cp_async16(dst + (xdst0 ^ (64 * (i & 1))) + 512 * i, X + (src + i * 4 * ldx4));
    } else {
      for (int p = lane; p < xrows * 8; p += 32) {
        const int r = p >> 3, j = p & 7;
        cp_async16(dst + (r * 8 + (j ^ (r & 7))) * 16, X + (size_t)r * ldx4 + (size_t)kt * 8 + j);
      }
    }
#endif
  };
  // the constant bytes of a step (weights and parameters): free to load before pdl_wait()
  auto load_w = [&](auto& wv, auto& p0, auto& p1, int kt0) {
    constexpr int UU = sizeof(wv) / sizeof(wv[0]);
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int kt = kt0 + u * KS;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int l = 0; l < LU; ++l) wv[u][r][l] = ld_stream(wt[r] + (size_t)kt * TSTEP + l * lstep);
#pragma unroll
        for (int h = 0; h < NP; ++h) {
          p0[u][r][h].load(prow0[r], group_of(kt, h) * GSTR);
          p1[u][r][h].load(prow1[r], group_of(kt, h) * GSTR);
        }
      }
    }
  };
  // a step's activations (the previous kernel's output: only after pdl_wait())
  auto load_x = [&](auto& xv, int kt0, int buf) {
    constexpr int UU = sizeof(xv) / sizeof(xv[0]);
    if (WG) __syncwarp();  // every lane is done reading the ring slots this step refills
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int kt = kt0 + u * KS;
      if (WG) {
        stage_x(buf * U + u, kt);
        continue;
      }
#if MMA_PERM
      // act-order: piece v of the lane's activations starts at k = KT kt + KL t + 8 v in the stored (permuted) order
#pragma unroll
      for (int v = 0; v < XV; ++v) {
        int pk[8];
        ld_perm(perm, kt * KT + KL * t + 8 * v, pk);
#pragma unroll
        for (int b = 0; b < MB; ++b) xv[u][b][v] = gather_x((const char*)xrow[b], pk);
      }
#else
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int v = 0; v < XV; ++v) xv[u][b][v] = ld_x(xrow[b] + (size_t)kt * (KT * 2 / 16) + v);
#endif
    }
    if (WG) asm volatile("cp.async.commit_group;" ::: "memory");
  };
  // all loads of a step together: UU weight tiles in flight per lane, activations alongside
  auto load = [&](auto& wv, auto& p0, auto& p1, auto& xv, int kt0, int buf) {
    load_w(wv, p0, p1, kt0);
    load_x(xv, kt0, buf);
  };
  // Deferred scaling (MMA_DEFER 1). Why: the per-pair "* s" rounds every dequantized weight to fp16/bf16
  // (scales below ~6e-5 lose digits); here A holds the exact integers q - z, the mma sums them times x in
  // fp32, and one FMA per C element and tile applies the scale: acc += s * C_t (+ (m + zc * s) * X_t for
  // offset, X_t = the tile's activation sums from one more mma with an all-ones A).
  // Measured on H200 (gemv_notes v7): the same speed as DEFER 0 (the kernel is not issue-bound), so it is
  // the default for its accuracy. A variant with the raw magic codes (1024 + q) in A and the bias removed
  // through X_t was 2x off the fp16 tolerance: the fp32 accumulation inside mma.sync is not exact enough
  // to subtract 1024 * X_t afterwards.
  constexpr int DEFER = MMA_DEFER;
  constexpr bool XSUM = DEFER != 0 && MODE == 2;
  constexpr u32 ONES = ACT == 0 ? 0x3c003c00u : 0x3f803f80u;  // 1.0 in fp16x2 / bf16x2
  // pending: cp.async groups issued after this step's that may stay in flight (the ring)
  auto compute = [&](const auto& wv, const auto& p0, const auto& p1, const auto& xv, int buf, bool pending) {
    constexpr int UU = sizeof(wv) / sizeof(wv[0]);
    if (WG) {
      if (pending) asm volatile("cp.async.wait_group 1;" ::: "memory");
      else asm volatile("cp.async.wait_group 0;" ::: "memory");
      __syncwarp();  // the other lanes' pieces (and act-order's plain stores) are visible
    }
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      u32 xw[MB][8];  // B fragments: word 2 s = b0 of step s, 2 s + 1 = b1
#if MMA_WG
      {
        // ldmatrix.x4 h: lanes 8 q .. 8 q + 7 address row (lane & 7) of matrix q = k 8 (4 h + q) .. + 7; lane (g, t)
        // gets k 2t, 2t + 1 of row g from each: b0 / b1 of step 2 h, then of step 2 h + 1
        const u32 slot = ring_s + (buf * U + u) * SLOT_BYTES;
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            ldmatrix_x4(slot + ldm_offset(b, h), xw[b][4 * h], xw[b][4 * h + 1], xw[b][4 * h + 2], xw[b][4 * h + 3]);
      }
#else
      if constexpr (ROWS) {  // step s: words s and s + 4 of the lane's 16 k (uint4 0 and 1)
#pragma unroll
        for (int b = 0; b < MB; ++b) {
          const uint4 lo = xv[u][b][0], hi = xv[u][b][1];
          xw[b][0] = lo.x, xw[b][1] = hi.x, xw[b][2] = lo.y, xw[b][3] = hi.y;
          xw[b][4] = lo.z, xw[b][5] = hi.z, xw[b][6] = lo.w, xw[b][7] = hi.w;
        }
      } else {
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int v = 0; v < XV; ++v) {
            xw[b][4 * v + 0] = xv[u][b][v].x;
            xw[b][4 * v + 1] = xv[u][b][v].y;
            xw[b][4 * v + 2] = xv[u][b][v].z;
            xw[b][4 * v + 3] = xv[u][b][v].w;
          }
      }
#endif
#pragma unroll
      for (int r = 0; r < RT; ++r) {  // the B fragments above serve every row tile
        u32 w[4 * LU];
        tile_words(wv[u][r], w);
        if constexpr (ROWS) {  // step s: word s of row g's chunk and of row g + 8's (a_frag_step: w[2 s], w[2 s + 1])
          const u32 c[8] = {w[0], w[4], w[1], w[5], w[2], w[6], w[3], w[7]};
#pragma unroll
          for (int i = 0; i < 8; ++i) w[i] = c[i];
        }
#pragma unroll
        for (int h = 0; h < NP; ++h) {  // one parameter set per STEPS / NP steps
          RowQ<ACT, MODE> q0, q1;
          const float s0 = p0[u][r][h].scale(), s1 = p1[u][r][h].scale();
          const float z0 = MODE == 1 ? p0[u][r][h].second() : ZBIAS, z1 = MODE == 1 ? p1[u][r][h].second() : ZBIAS;
          const float m0 = MODE == 2 ? p0[u][r][h].second() : 0.f, m1 = MODE == 2 ? p1[u][r][h].second() : 0.f;
          q0.set(s0, z0, m0);
          q1.set(s1, z1, m1);
          float cacc[MB][4], xacc[MB][4];  // this piece's mma sums (DEFER) and activation sums (XSUM)
#pragma unroll
          for (int b = 0; b < MB; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) cacc[b][i] = xacc[b][i] = 0.f;
#pragma unroll
          for (int s = h * (STEPS / NP); s < (h + 1) * (STEPS / NP); ++s) {
            u32 a[4];  // a0: row g pair 0; a1: row g+8 pair 0; a2: row g pair 1; a3: row g+8 pair 1
            a_frag_step<BITS, ACT, MODE, DEFER == 0>(w, s, q0, q1, z0, z1, a);
#pragma unroll
            for (int b = 0; b < MB; ++b) {
              if (DEFER) mma16816<ACT>(cacc[b], a, xw[b][2 * s], xw[b][2 * s + 1]);
              else mma16816<ACT>(acc[r][b], a, xw[b][2 * s], xw[b][2 * s + 1]);
              if (XSUM) {
                const u32 ones[4] = {ONES, ONES, ONES, ONES};
                mma16816<ACT>(xacc[b], ones, xw[b][2 * s], xw[b][2 * s + 1]);
              }
            }
          }
          if (DEFER) {
            // per-row coefficients of this piece (row g: c0, c1; row g + 8: c2, c3)
            const float al0 = s0, al1 = s1;
            const float be0 = MODE == 2 ? fmaf(z0, s0, m0) : 0.f, be1 = MODE == 2 ? fmaf(z1, s1, m1) : 0.f;
#pragma unroll
            for (int b = 0; b < MB; ++b) {
              float* ac = acc[r][b];
              ac[0] = fmaf(al0, cacc[b][0], ac[0]);
              ac[1] = fmaf(al0, cacc[b][1], ac[1]);
              ac[2] = fmaf(al1, cacc[b][2], ac[2]);
              ac[3] = fmaf(al1, cacc[b][3], ac[3]);
              if (XSUM) {
                ac[0] = fmaf(be0, xacc[b][0], ac[0]);
                ac[1] = fmaf(be0, xacc[b][1], ac[1]);
                ac[2] = fmaf(be1, xacc[b][2], ac[2]);
                ac[3] = fmaf(be1, xacc[b][3], ac[3]);
              }
            }
          }
        }
      }
    }
  };
  int kt0 = ks;
  uint4 wA[U][RT][LU], wB[U][RT][LU];
  P a0[U][RT][NP], a1[U][RT][NP], b0[U][RT][NP], b1[U][RT][NP];
  uint4 xA[U][MB][XV], xB[U][MB][XV];
  const bool full = kt0 + (U - 1) * KS < Kt;
  // PDL (gemv_common.cuh): x, bias and y are touched only after pdl_wait(). MMA_EARLY: the first step's weights and
  // parameters are loaded before it, so a block that starts during the previous kernel's tail has its first bytes in
  // flight; otherwise they only go to L2.
  pdl_launch_dependents();
  if (MMA_EARLY && full) {
    load_w(wA, a0, a1, kt0);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (ks + u * KS < Kt)
#pragma unroll
        for (int r = 0; r < RT; ++r) prefetch_l2(wt[r] + (size_t)(ks + u * KS) * TSTEP);
  }
  pdl_wait();
  if (full) {
    if (!MMA_EARLY) load_w(wA, a0, a1, kt0);
    load_x(xA, kt0, 0);
    if (MMA_PF) {
      // Register double buffering: the next step's loads (into the other buffer) are in flight while this step
      // computes; false after the last full step. Called with the buffers swapped, so no buffer is copied.
      auto step = [&](auto& wc, auto& pc0, auto& pc1, auto& xc, int bc, auto& wn, auto& pn0, auto& pn1, auto& xn) {
        const int kt1 = kt0 + U * KS;
        const bool more = kt1 + (U - 1) * KS < Kt;
        if (more) load(wn, pn0, pn1, xn, kt1, 1 - bc);
        compute(wc, pc0, pc1, xc, bc, more);
        kt0 = kt1;
        return more;
      };
      while (step(wA, a0, a1, xA, 0, wB, b0, b1, xB) && step(wB, b0, b1, xB, 1, wA, a0, a1, xA)) {
      }
    } else {
      compute(wA, a0, a1, xA, 0, false);
      for (kt0 += U * KS; kt0 + (U - 1) * KS < Kt; kt0 += U * KS) {
        load(wA, a0, a1, xA, kt0, 0);
        compute(wA, a0, a1, xA, 0, false);
      }
    }
  }
  for (; kt0 < Kt; kt0 += KS) {
    uint4 w1[1][RT][LU];
    P q0[1][RT][NP], q1[1][RT][NP];
    uint4 x1[1][MB][XV];
    load(w1, q0, q1, x1, kt0, 0);
    compute(w1, q0, q1, x1, 0, false);
  }

  // Epilogue: C fragment c0 = (n g, m 2t), c1 = (n g, m 2t+1), c2 = (n g+8, m 2t), c3 = (n g+8, m 2t+1);
  // the KS k-slices meet in shared memory, then bias, clamp, store.
  __shared__ float red[KS][RG * RT][16][16];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      float(&rd)[16][16] = red[ks][rg * RT + r];
      rd[g][2 * t + 8 * b] = acc[r][b][0];
      rd[g][2 * t + 1 + 8 * b] = acc[r][b][1];
      rd[g + 8][2 * t + 8 * b] = acc[r][b][2];
      rd[g + 8][2 * t + 1 + 8 * b] = acc[r][b][3];
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < RG * RT * 16 * 16; idx += MMA_THREADS) {
    const int r = idx / 256, m = (idx / 16) % 16, j = idx % 16;  // consecutive threads: consecutive n
    const int n = (blockIdx.x * RG * RT + r) * 16 + j;
    if (n >= N || m >= Mr || m >= 8 * MB) continue;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) v += red[k][r][j][m];
    store_output<ACT>(Y, (size_t)m * ldy + n, n, v, bias, bias_kind, lo, hi);
  }
}
