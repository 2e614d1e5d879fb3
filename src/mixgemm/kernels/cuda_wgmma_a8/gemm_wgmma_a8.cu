// mixgemm W4A8 / W8A8 GEMM on Hopper int8 tensor cores (wgmma .s8), activations quantized per token and per group.
//
// out.T[n, m] = sum_g sW[n, g] sA[m, g] sum_{k in g} c[n, k] a[m, k]: c = the signed weight codes (sym int4 / int8,
// wgmma_a8_v1 layout, formats/layouts_wgmma_a8.py) as the wgmma A operand in registers, a = the int8 activation codes
// (TMA, 128-byte swizzle) as B in shared memory, int32 accumulation inside each group, then the fold
// acc += sW * sA * float(partial) in fp32 -- in one kernel, inside the K loop (issue #6: no GEMM launch + atomic
// accumulate per block).
// Why CUDA and not Triton: Triton 3.6 waits for each wgmma before the per-group fold (its int32 result must leave the
// tensor core) and cannot specialize warps by hand; the Triton kernel measured 0.73-0.84x of fp16 cuBLAS for W4A8 g128
// at M >= 2048 on H200 (docs/kernels/cuda_wgmma_a8.md) against the 1.5x target.
//
// CTA = NWG consumer warpgroups x 64 weight rows (a warp: one 16-row tile) times BM tokens (the wgmma N), plus (A8_WS)
// one producer warpgroup. K in 128-k tiles (128 activation bytes per token = one swizzle row), KT of them per stage of
// a STAGES-deep ring: TMA for the activations, bulk copies for the weights, their fp32 dot scales and the activation
// scales, landing on one full mbarrier per stage.
// A8_WS 1 (the default for NWG 1 / 2): one producer thread refills a stage as soon as every consumer warp has arrived
// on its empty mbarrier (after the next stage's first wait_group 0 and fold: its wgmmas and scale reads are done);
// the warpgroups run free of each other. NWG 2: the producer warpgroup gives its registers to the consumers
// (setmaxnreg 40 / 232). Measured against A8_WS 0 (thread 0 refills a stage two stages after it was read, a CTA
// barrier per stage), H200, 8192x28672, M = 4096: W4 g128 2829 -> 2351 us, W4 per-channel 1608 -> 1571 us.
// Also measured and not kept (the same runs, docs/kernels/cuda_wgmma_a8.md): the warpgroups queueing their
// k-tiles' wgmmas in strict turn (named barriers) 2361 us; the tensor pipe held by one warpgroup at a time, the other
// folding meanwhile, 2626 us.
// Groups of 128 (A8_GT 1) or 256 (2) k, or per-channel (A8_GT 0: one int32 sum over all of K, converted once in the
// epilogue). Exactness: a group's partial is a sum of <= 256 products (16 c) * a with |16 c| <= 128, |a| <= 127:
// below 2^22, so float(partial) is exact in either conversion.

#ifndef A8_XT  // A8_FQ: the activation dtype (0 fp16, 1 bf16, 2 fp32)
#define A8_XT 0
#endif
#include "wgmma_ops.cuh"
#include "wgmma_common.cuh"
#include "act_quant.cuh"

#ifndef A8_BITS
#define A8_BITS 4
#endif
#ifndef A8_OUT
#define A8_OUT 0  // output dtype: 0 fp16, 1 bf16, 2 fp32
#endif
#ifndef A8_BM
#define A8_BM 128
#endif
#ifndef A8_NWG
#define A8_NWG 2
#endif
#ifndef A8_STAGES
#define A8_STAGES 4
#endif
#ifndef A8_KT
#define A8_KT 2
#endif
#ifndef A8_GT
#define A8_GT 1
#endif
// A8_NP: int32 partials per thread. 2: group g + 1's wgmmas write one while the fold reads the other (the fold runs
// under the MMA); 1: the fold runs before the next group's wgmmas are queued (fewer registers: BM / 2 less)
#ifndef A8_NP
#define A8_NP 2
#endif
// A8_CVT: int32 partial -> float. 0: cvt.rn.f32.s32 (I2FP) then one multiply by sA; 1: the 2^23 + 2^22 magic number
// (integer add, then one FFMA with a per-column constant -1.5 * 2^23 * sA)
#ifndef A8_CVT
#define A8_CVT 0
#endif
// A8_WS 1: warp-specialized -- one extra producer warpgroup fills the ring, consumers release each stage on its own
// empty mbarrier; 0: thread 0 of the consumers fills it and a CTA barrier per stage proves a stage free
#ifndef A8_WS
#define A8_WS (A8_NWG == 1 || (A8_NWG == 2 && A8_MINB == 1))
#endif
// A8_AT 1 (grouped weights): the activations have one scale per token (act_quant block = K), applied in the epilogue;
// the fold is then acc += sW * float(partial), 2 instructions per element instead of 3
#ifndef A8_AT
#define A8_AT 0
#endif
// A8_QS 1 (int4 groups, per-token activation scales, weights from formats/int_scales.py): every group scale is an
// integer multiple m (1..16) of one step per channel, so each k-tile's codes become the int8 c * m in registers
// (|c m| <= 128) and one int32 sum runs over all of K, as per-channel weights: no fold at all, sW = step in the
// epilogue. Why: the fold (I2FP + FFMA per accumulator element and group) is a quarter of the grouped kernel's energy
// at the H100's power cap (docs/kernels/cuda_wgmma_a8.md); the dequantization is 7 instructions per 8 codes
// of a tile shared by BM tokens. Exact while K * 128 * 127 < 2^31 (the host checks K).
#ifndef A8_QS
#define A8_QS 0
#endif
#ifndef A8_GROUP_M
#define A8_GROUP_M 8
#endif
#ifndef A8_MINB
#define A8_MINB 1
#endif
// A8_TSTORE 1 (fp16 / bf16 output): the epilogue stages each warpgroup's 64-channel x BM-token tile in the drained
// ring (stmatrix .trans, 128-byte swizzle) and writes it with one TMA store, as gemm_wgmma.cu's WG_TSTORE. Why: the
// accumulator holds two consecutive *tokens* of one output column per register pair, so per-element stores write 2
// bytes per row and instruction (16 contiguous bytes per warp); the TMA store writes whole 128-byte lines.
#ifndef A8_TSTORE
#define A8_TSTORE 0
#endif
// A8_MC 2 (with A8_WS): the two CTAs of a thread-block cluster take adjacent 64 x NWG-row weight tiles of the same BM
// tokens; each producer loads half of every activation box and multicasts it to both CTAs, and a ring slot is
// refilled only once the consumer warps of both CTAs released it (each consumer warp arrives on the slot's empty
// mbarrier in both CTAs). Why: the activation tile (BM x 128 bytes per k-tile, 16 KB at BM 128) is twice the int4
// weight tile, so the CTAs of one token tile re-reading it from L2 are most of the L2 -> SM traffic; the cluster
// reads it once per pair (24.5 -> 16.5 KB per CTA and k-tile at BM 128, NWG 2, int4). Measured (GEMM only, W4 g128
// per-token, same-run medians of 3, docs/kernels/cuda_wgmma_a8.md): 28672x8192 M = 2048 / 4096 H100
// 925 -> 877 / 1857 -> 1742 us, H200 914 -> 882 / 1878 -> 1796 us; 8192x28672 (K = 8192) -1..+2%: the host's default
// takes MC 2 for K >= 16384. The first build, whose remote arrivals carried .release.cluster, ran 1.9x slower.
#ifndef A8_MC
#define A8_MC 1
#endif
// A8_PDL 1 (with A8_WS): programmatic dependent launch, as gemm_wgmma.cu's WG_PDL. Why: the kernel before this one is
// the activation quantizer, which triggers its dependents at its start; the CTAs then start during the quantizer's
// last wave, and the producer queues the first stages' weights and weight scales (never written by other kernels)
// before griddepcontrol.wait, their activation codes and scales after it. Consumers wait before touching global
// memory. A no-op when launched without the PDL attribute. Measured neutral (H100, quantizer + GEMM, 5 alternating
// rounds: -3.6..+0.5%, inside a round-to-round spread of 8%); on by default like the other CUDA kernels' PDL.
#ifndef A8_PDL
#define A8_PDL 0
#endif
// A8_CHAIN (with A8_PDL; the two launches of a TAIL, gemm_wgmma_a8.py): 1 = the whole-wave launch, whose CTAs
// trigger their dependents only once their producer is past griddepcontrol.wait; 2 = the tail launch after it, which
// reads nothing the whole-wave launch writes (its own output columns), so it loads without waiting and one thread
// waits for the first launch only before the CTA exits. Why: with the usual wait the tail's CTAs, queued during the
// first launch's last wave, idled until its slowest CTA had finished; now each starts as an SM frees up, as the last
// wave of one launch would. Safe because a CTA of launch 1 past its wait proves the kernel before it (the quantizer)
// complete, and launch 2 cannot complete before launch 1 (the kernel after it waits for launch 2).
#ifndef A8_CHAIN
#define A8_CHAIN 0
#endif
// A8_FQ > 0 (with A8_WS, MC 1, per-token activation scales): the activation quantizer runs inside this launch, so a
// call is one launch instead of two (the host time of the second is what an eager decode step or a compiled graph
// without CUDA graphs pays per layer). The grid's first QB blocks are quantizer blocks: groups of A8_FQ_WPR warps,
// each quantizing one token row at a time with its A8_FQ 16-byte units per thread in registers (act_quant.cuh: the
// reference's exact ops), into the codes buffer the activation tensor map reads and the scales SQ = SA; then each
// block counts itself done in sync[0] (release). The GEMM blocks come after them in the grid, so they are scheduled
// later (blocks are dispatched in index order, as CUB's decoupled look-back relies on) and wait for quantizer blocks
// that already run: no deadlock at any grid size. Each GEMM block's producer queues the weights of its first stages,
// waits until sync[0] == QB (acquire), and only then the activation codes; the activation scales of the block's
// tokens come with the first stage into shared memory (no consumer reads global memory another block wrote). The
// producers count themselves in sync[1]; the last one sets both counters back to zero, so the next launch on the
// stream (which waits for this grid in griddepcontrol.wait or by stream order before touching them) finds them zero.
#ifndef A8_FQ
#define A8_FQ 0
#endif
// A8_SPLIT S > 1 (MC 1, per-element stores): split-K over a thread-block cluster. The S CTAs of a cluster take the
// same output tile, CTA rank r the k-tiles [r kps, r kps + kps) (kps = kt_per_split, a multiple of KT, so slices
// start on group and stage boundaries), and meet their int32 sums (per-channel, QS) or fp32 folds through
// distributed shared memory (wgmma_common.cuh cluster_band_reduce), each storing a band of the tile's tokens. Why:
// at small M the tiles are one row of CTAs along N (14336x4096 at BM 64: 32 CTAs on 132 SMs), each streaming all of
// K; splitting K fills the SMs without a workspace, atomics or a second kernel. With A8_FQ the host makes the
// quantizer blocks a multiple of S, so every GEMM cluster starts at a multiple of S in the grid.
#ifndef A8_SPLIT
#define A8_SPLIT 1
#endif
#ifndef A8_FQ_WPR
#define A8_FQ_WPR 1
#endif

namespace mga8 {

using namespace mgw;
using namespace actq;

constexpr int BITS = A8_BITS, OUT = A8_OUT, BM = A8_BM, NWG = A8_NWG, STAGES = A8_STAGES, KT = A8_KT, GT = A8_GT;
constexpr int NP = A8_NP;
constexpr bool PC = GT == 0;    // per-channel weights and per-token activation scales
constexpr bool AT = PC || A8_AT;  // per-token activation scales (in the epilogue)
constexpr bool QS = A8_QS != 0;
static_assert(!QS || (A8_BITS == 4 && A8_GT >= 1 && A8_AT), "A8_QS: int4 groups with per-token activation scales");
constexpr bool NOFOLD = PC || QS;  // one int32 sum over all of K, scaled in the epilogue
constexpr bool WS = A8_WS;
constexpr int MC = A8_MC;
static_assert(MC == 1 || (MC == 2 && WS), "A8_MC 2 takes the producer warpgroup (A8_WS 1)");
constexpr bool PDL = A8_PDL != 0;
static_assert(!PDL || WS, "A8_PDL takes the producer warpgroup (A8_WS 1)");
constexpr int CHAIN = PDL ? A8_CHAIN : 0;
static_assert(CHAIN >= 0 && CHAIN <= 2 && (CHAIN == 0 || !A8_FQ), "A8_CHAIN is 0, 1 or 2 (not with A8_FQ)");
constexpr int ISSUE_W = 1, ISSUE_X = 2, ISSUE_ALL = 3;  // the parts of a stage issue() queues
// WS: warpgroup NWG produces (one thread issues the copies). NWG 2: it gives its registers to the consumers
// (setmaxnreg 40 / 232: 384 threads would otherwise cap every thread at 168, and the consumers' BM / 2 fp32
// accumulators + BM / 2 int32 partials + A fragments then spill, which also serializes the wgmmas)
constexpr int WARPS = 4 * NWG, THREADS = 128 * NWG + (WS ? 128 : 0);
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
constexpr int FQ = A8_FQ, FQ_WPR = A8_FQ_WPR;  // units of 8 k per quantizer thread; warps per quantized row
constexpr int FQ_UNITS = FQ > 0 ? FQ : 1;      // (an array size even where FQ is off)
static_assert(!FQ || (WS && MC == 1 && AT), "A8_FQ: the producer warpgroup, MC 1, per-token activation scales");
static_assert(!FQ || (THREADS / 32) % FQ_WPR == 0, "A8_FQ_WPR divides the block's warps");
constexpr bool REALLOC = WS && NWG == 2;
constexpr int SPLIT = A8_SPLIT;
static_assert(SPLIT >= 1 && SPLIT <= 8 && (SPLIT == 1 || MC == 1),
              "A8_SPLIT: 1..8 CTAs of a (portable) cluster, not with A8_MC 2");
static_assert(!WS || NWG == 1 || (NWG == 2 && A8_MINB == 1),
              "A8_WS: NWG 1, or NWG 2 with one CTA per SM (the consumers take the producer's registers)");
constexpr int TB = BITS == 4 ? 1024 : 2048;  // weight bytes of one 16-row x 128-k tile
constexpr int X_BYTES = KT * BM * 128;        // KT swizzle atoms of BM tokens x 128 k
constexpr int W_BYTES = KT * WARPS * TB;      // [KT][WARPS][TB]
constexpr int SW_BYTES = PC ? 0 : KT * WARPS * 64;  // [KT][WARPS][16] fp32 dot scales of the k-tile's group
constexpr int SA_BYTES = PC ? 0 : KT * BM * 4;      // [KT][BM] fp32 activation scales of the k-tile's group (unused: AT)
constexpr int STAGE = (X_BYTES + W_BYTES + SW_BYTES + SA_BYTES + 1023) / 1024 * 1024;
static_assert(BITS == 4 || BITS == 8, "A8_BITS is 4 or 8");
static_assert(NWG == 1 || NWG == 2 || NWG == 4, "A8_NWG is 1, 2 or 4");
// the CTA's row tiles in whole 8-tile blocks of wgmma_a8_v1 (NWG 4: two blocks, one copy each); stage layout
// [SEGS][KT][SEGW][TB]
constexpr int SEGW = WARPS < 8 ? WARPS : 8, SEGS = WARPS / SEGW;
static_assert(KT == 1 || KT == 2 || KT == 4, "A8_KT is 1, 2 or 4");
static_assert(GT == 0 || (GT <= 2 && KT % (NP * GT) == 0), "A8_GT is 0 (per-channel), 1 or 2; KT a multiple of NP GT");
static_assert(NP == 1 || NP == 2, "A8_NP is 1 or 2");
static_assert(BM % 16 == 0 && BM >= 16 && BM <= 256, "BM is the wgmma N: 16..256, a multiple of 16");
static_assert(STAGES >= 3 || (WS && STAGES == 2), "A8_WS 0 refills a stage two stages after it was read");
constexpr bool TSTORE = A8_TSTORE != 0;
static_assert(!TSTORE || (OUT != 2 && SPLIT == 1 && STAGES * STAGE >= NWG * BM * 128),
              "A8_TSTORE: fp16 / bf16 output, no A8_SPLIT, a ring that holds the NWG staging tiles of BM rows x 128 "
              "bytes");
constexpr float MAGIC = 12582912.f;  // 1.5 * 2^23: its float bits + n (|n| < 2^22) are the float MAGIC + n
template <int V>
struct IC {
  static constexpr int value = V;
};

__device__ __forceinline__ float to_float(int v) {
  if (A8_CVT == 0) return (float)v;
  return __int_as_float(v + 0x4B400000);  // = MAGIC + v exactly; the caller subtracts MAGIC * sA
}

}  // namespace mga8

using namespace mga8;

extern "C" __global__ void __launch_bounds__(THREADS, A8_MINB)
mixgemm_gemm_wgmma_a8(const char* __restrict__ W,    // wgmma_a8_v1 weight tiles [Nt / 8][Kt][8][TB]
                      const float* __restrict__ P,   // wgmma_a8_v1 dot scales [Nt / 8][G][8][16] (QS: int32 m)
                      const float* __restrict__ CS,  // QS: the channel steps [Nt / 8][8][16]
                      const float* __restrict__ SA,  // activation scales [G][ldsa] (ldsa >= M, a multiple of 4)
                      int ldsa,
                      void* __restrict__ Y, int ldy,  // [M, ldy] in the OUT dtype
                      const void* __restrict__ bias, int bias_kind, float lo, float hi,
                      int N, int M, int Kt, int G,
                      const void* __restrict__ X, int ldx,   // A8_FQ: the activations [M, ldx] (rows 16-byte aligned)
                      signed char* __restrict__ QX, int K,    // A8_FQ: their codes [M, K] (what xmap reads)
                      float* __restrict__ SQ,                 // A8_FQ: their scales [M] (= SA), offsets, sums [M] after
                      int* __restrict__ sync, int QB,         // A8_FQ: two counters, zero on entry; quantizer blocks
                      const __grid_constant__ TmaDesc xmap,  // int8 activation codes [M, K], box 128 k x BM rows
                      const __grid_constant__ TmaDesc ymap,  // A8_TSTORE: Y [M, N], box 64 columns x BM rows
                      int kt_per_split) {                     // A8_SPLIT: k-tiles per CTA of a cluster
  // the next PDL kernel may launch once every CTA of this grid runs (it waits in griddepcontrol.wait for this grid)
  if (PDL && CHAIN != 1) pdl_launch_dependents();
  if (FQ && (int)blockIdx.x < QB) {  // a quantizer block: ROWS rows at a time (FQ_WPR warps each), then QB ROWS on
    constexpr int NT = FQ_WPR * 32, ROWS = THREADS / NT;
    __shared__ float ra[THREADS / 32], rc[THREADS / 32];
    __shared__ int rs[THREADS / 32];
    if (PDL) pdl_wait();  // x is the previous kernel's output; the codes buffer may still be read by the one before
    const int grp = threadIdx.x / NT, gt = threadIdx.x % NT, K8 = K >> 3;
    auto gsync = [&] {
      if (ROWS == 1) __syncthreads();
      else asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "n"(NT) : "memory");
    };
    float *O = SQ + ((M + 3) & ~3), *SUMF = O + M;
    for (int m = blockIdx.x * ROWS + grp; m < M; m += QB * ROWS) {
      uint4 raw[FQ_UNITS][XV];
#pragma unroll
      for (int i = 0; i < FQ; ++i) {  // all loads first: FQ x 16 bytes in flight per thread
        const int u = gt + i * NT;
        if (u < K8) load8_raw<true>(X, (size_t)m * ldx, u * 8, raw[i]);
      }
      actq_row<false, FQ_UNITS, NT>(raw, QX, SQ, O, (int*)SUMF, m, K, K8, gt, ra + grp * FQ_WPR, rc + grp * FQ_WPR,
                                    rs + grp * FQ_WPR, gsync);
    }
    // the codes are read by other blocks' TMA (the async proxy): ordered for it, then released to the producers
    asm volatile("fence.proxy.async.global;" ::: "memory");
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sync, 1);
    return;
  }
  extern __shared__ char smem_raw[];
  const char* sgen;
  const u32 sbase = smem_base_1024(smem_raw, sgen);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int Nt = (N + 15) >> 4;
  // MC 2: the cluster (CTAs 2 c, 2 c + 1) is one raster tile of MC x WARPS row tiles; CTA rank r takes the r-th WARPS
  // (the host launches MC 2 only when the CTA column tiles pair up: ceil(Nt / WARPS) % MC == 0)
  const int rank = MC > 1 ? cluster_ctarank() : 0;
  const int bid = (int)blockIdx.x - (FQ ? QB : 0);  // A8_FQ: the quantizer blocks come first
  const int2 pos = raster_tile(bid / (MC * SPLIT), (M + BM - 1) / BM,
                               A8_GROUP_M * ((Nt + MC * WARPS - 1) / (MC * WARPS)), A8_GROUP_M, BM, MC * WARPS);
  const int m0 = pos.x, rt0 = pos.y + rank * WARPS;
  const int rt_raw = rt0 + warp;
  // A8_SPLIT: this CTA's k-tiles [kt0, kt0 + nk) (the host leaves no slice empty)
  const int kslice = SPLIT > 1 ? cluster_ctarank() : 0;
  const int kt0 = kslice * kt_per_split, nk = SPLIT > 1 ? min(Kt - kt0, kt_per_split) : Kt;
  const int nst = (nk + KT - 1) / KT;
  const int blk = rt0 >> 3, nblk = (Nt + 7) >> 3;  // first 8-tile block of the CTA, blocks stored

  __shared__ __align__(8) u64 full_bar[STAGES];   // stage s's bytes have landed (phase flips per use)
  __shared__ __align__(8) u64 empty_bar[STAGES];  // WS: every consumer warp is done with stage s
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(smem_addr(&full_bar[s]), 1);
      if (WS) mbar_init(smem_addr(&empty_bar[s]), WARPS * MC);  // MC 2: the consumer warps of both CTAs
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (MC > 1) cluster_sync();  // the peer's mbarriers exist before any multicast or remote arrival reaches them
  else __syncthreads();

  const int sa_rows = min(BM, ldsa - m0);  // activation scales of the tile that exist (x 4 bytes: a multiple of 16)
  // MC 2: CTA rank h loads half h of the activation box (BM / 2 tokens) for both CTAs; a half of tokens >= M only is
  // skipped (its rows are never stored), so both CTAs expect the same bytes
  constexpr int XH = BM / MC;
  const int x_rows = MC == 1 || m0 + XH < M ? BM : XH;
  const bool x_mine = MC == 1 || m0 + rank * XH < M;
  // stage sg: k-tiles KT sg .. into ring slot slot_issue; part ISSUE_W: the expected bytes of the whole stage, the
  // weights and their scales; ISSUE_X: the activation codes (and per-group scales). PDL queues the two apart.
  auto issue = [&](int sg, int slot_issue, u32 st_issue, int part) {
    const u32 bar = smem_addr(&full_bar[slot_issue]);
    const int ks = kt0 + sg * KT, tiles = min(KT, kt0 + nk - ks);
    const int segs = min(SEGS, nblk - blk);  // NWG 4 on the last block: its second segment is not stored
    if (part & ISSUE_W)
      mbar_expect_tx(bar, tiles * (x_rows * 128 + (AT ? 0 : sa_rows * 4) + segs * SEGW * (TB + (PC ? 0 : 64))) +
                              (FQ && sg == 0 ? sa_rows * 4 : 0));
    if (FQ && sg == 0 && (part & ISSUE_X))  // the block's token scales, behind the ring (read in the epilogue)
      bulk_copy(sbase + STAGES * STAGE, SA + m0, sa_rows * 4, bar);
#pragma unroll
    for (int j = 0; j < KT; ++j)
      if (j < tiles && (part & ISSUE_X)) {
        if (MC == 1) tma_2d(st_issue + j * BM * 128, &xmap, (ks + j) * 128, m0, bar);
        else if (x_mine)  // rows rank x XH.. of the box, at the same offset in both CTAs (XH x 128: 1024-byte aligned)
          tma_2d_multicast(st_issue + j * BM * 128 + rank * XH * 128, &xmap, (ks + j) * 128, m0 + rank * XH, bar,
                           (1 << MC) - 1);
        if (!AT)
          bulk_copy(st_issue + X_BYTES + W_BYTES + SW_BYTES + j * BM * 4, SA + (size_t)(ks + j) / GT * ldsa + m0,
                    sa_rows * 4, bar);
      }
#pragma unroll
    for (int sgm = 0; sgm < SEGS; ++sgm) {
      if (sgm >= segs || !(part & ISSUE_W)) continue;
      const char* wsrc = W + (((size_t)(blk + sgm) * Kt + ks) * 8 + (rt0 & 7)) * TB;
      const u32 wdst = st_issue + X_BYTES + sgm * KT * SEGW * TB;
      if (SEGW == 8) {
        bulk_copy(wdst, wsrc, tiles * 8 * TB, bar);  // the k-tiles' 8-tile blocks are contiguous
      } else {
#pragma unroll
        for (int j = 0; j < KT; ++j)
          if (j < tiles) bulk_copy(wdst + j * SEGW * TB, wsrc + (size_t)j * 8 * TB, SEGW * TB, bar);
      }
      if (!PC) {
#pragma unroll
        for (int j = 0; j < KT; ++j)
          if (j < tiles)
            bulk_copy(st_issue + X_BYTES + W_BYTES + (j * WARPS + sgm * SEGW) * 64,
                      P + (((size_t)(blk + sgm) * G + (ks + j) / GT) * 8 + (rt0 & 7)) * 16, SEGW * 64, bar);
      }
    }
  };

  if (WS && warp >= WARPS) {  // the producer: stage sg into slot sg % STAGES once its last use is released
    if (REALLOC) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (warp == WARPS && lane == 0) {
      int sg = 0, slot = 0;
      if (PDL || FQ) {  // the first stages' weights before the wait(s), their activations after
        const int pre = min(STAGES, nst);
        for (int s = 0; s < pre; ++s) issue(s, s, sbase + s * STAGE, ISSUE_W);
        if (PDL && CHAIN != 2) pdl_wait();
        if (CHAIN == 1) pdl_launch_dependents();  // the kernel before this one is complete (A8_CHAIN)
        if (FQ) {  // every quantizer block is done (their codes and scales are visible to this thread's TMA)
          int done;
          for (;;) {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(sync) : "memory");
            if (done >= QB) break;
            __nanosleep(32);
          }
          asm volatile("fence.proxy.async.global;" ::: "memory");
        }
        for (int s = 0; s < pre; ++s) issue(s, s, sbase + s * STAGE, ISSUE_X);
        // (after the loads: the atomic's round trip is off their path) the last producer past the wait resets both
        if (FQ && atomicAdd(sync + 1, 1) == (int)gridDim.x - QB - 1) {
          atomicExch(sync, 0);
          atomicExch(sync + 1, 0);
        }
        sg = pre, slot = pre == STAGES ? 0 : pre;
      }
      for (; sg < nst; ++sg) {
        if (sg >= STAGES) mbar_wait(smem_addr(&empty_bar[slot]), (sg / STAGES - 1) & 1);
        issue(sg, slot, sbase + slot * STAGE, ISSUE_ALL);
        slot = slot + 1 == STAGES ? 0 : slot + 1;
      }
    }
    // A8_CHAIN 2: this CTA exits only once the whole-wave launch before it is complete
    if (CHAIN == 2 && warp == WARPS + 1 && lane == 0) pdl_wait();
    return;
  }
  if (REALLOC) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
  if (PDL && CHAIN != 2) pdl_wait();  // the activation scales, bias and output belong to other kernels

  float acc[NOFOLD ? 1 : BM / 2];
#pragma unroll
  for (int i = 0; i < (NOFOLD ? 1 : BM / 2); ++i) acc[i] = 0.f;
  int part[NP][BM / 2];
  u32 afr[2][4][4];
  const float* prev_sw = nullptr;  // scales of the last k-tile queued (the group the next fold finishes)
  const float* prev_sa = nullptr;

  // acc += sW (rows g, g + 8) x sA (this thread's tokens) x float(part[b]); its wgmmas must be complete
  auto fold = [&](auto bc) {
    constexpr int b = decltype(bc)::value;
    const float sw0 = prev_sw[warp * 16 + g], sw1 = prev_sw[warp * 16 + g + 8];
    if (AT) {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) acc[i] = fmaf((float)part[b][i], (i & 2) ? sw1 : sw0, acc[i]);
      return;
    }
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const float2 sa = *(const float2*)(prev_sa + 8 * j + 2 * t);
      const float ms0 = A8_CVT ? -MAGIC * sa.x : 0.f, ms1 = A8_CVT ? -MAGIC * sa.y : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * j + 2 * h + c;
          const float v = A8_CVT ? fmaf(to_float(part[b][i]), c ? sa.y : sa.x, c ? ms1 : ms0)
                                 : to_float(part[b][i]) * (c ? sa.y : sa.x);
          acc[i] = fmaf(v, h ? sw1 : sw0, acc[i]);
        }
    }
  };

  u32 st_read = sbase;
  int slot_read = 0, slot_prev = 0;
  u32 phase = 0;

  // k-tile i (= j of the stage being read): its A fragments, then its four k32 wgmmas as one group
  auto ktile = [&](int i, auto jc, auto abc) {
    constexpr int j = decltype(jc)::value;
    // A-register buffer (the other may still feed the last k-tile); KT 1 alternates it by stage parity (abc)
    constexpr int AB = (j + decltype(abc)::value) % 2;
    constexpr int B = NOFOLD ? 0 : (j / GT) % NP;   // the partial of this k-tile's group (a stage starts NP groups)
    constexpr bool FIRST = !NOFOLD && j % GT == 0;  // the group's first k-tile: overwrite the partial
    const char* stg = sgen + (st_read - sbase);
    const char* wp = stg + X_BYTES + ((warp / SEGW * KT + j) * SEGW + warp % SEGW) * TB + lane * 16;
    if (QS) {
      // bytes c m of rows g, g + 8 (this k-tile's group multipliers m0, m1): u = c + 8 = nibble ^ 8 (0..15) per byte,
      // u m + 128 - 8 m = c m + 128 in 0..240 (no carry between bytes, one IMAD for 4 codes), ^ 0x80: the signed byte
      const int* mq = (const int*)(stg + X_BYTES + W_BYTES + j * WARPS * 64) + warp * 16 + g;
      const u32 m0 = (u32)mq[0], m1 = (u32)mq[8];
      const u32 add0 = (128u - 8u * m0) * 0x01010101u, add1 = (128u - 8u * m1) * 0x01010101u;
      const uint4 v0 = *(const uint4*)wp, v1 = *(const uint4*)(wp + 512);
      const u32 w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      auto deq = [](u32 u, u32 m, u32 add) { return (u * m + add) ^ 0x80808080u; };
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        afr[AB][s][0] = deq((w[2 * s] & 0x0F0F0F0Fu) ^ 0x08080808u, m0, add0);
        afr[AB][s][1] = deq((w[2 * s + 1] & 0x0F0F0F0Fu) ^ 0x08080808u, m1, add1);
        afr[AB][s][2] = deq(((w[2 * s] >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u, m0, add0);
        afr[AB][s][3] = deq(((w[2 * s + 1] >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u, m1, add1);
      }
    } else if (BITS == 4) {
      // bytes 16 c straight from the nibbles: (w << 4) & 0xF0F0F0F0 keeps the low nibbles, w & 0xF0F0F0F0 the high
      const uint4 v0 = *(const uint4*)wp, v1 = *(const uint4*)(wp + 512);
      const u32 w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        afr[AB][s][0] = (w[2 * s] << 4) & 0xF0F0F0F0u;
        afr[AB][s][1] = (w[2 * s + 1] << 4) & 0xF0F0F0F0u;
        afr[AB][s][2] = w[2 * s] & 0xF0F0F0F0u;
        afr[AB][s][3] = w[2 * s + 1] & 0xF0F0F0F0u;
      }
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 v = *(const uint4*)(wp + 512 * s);
        afr[AB][s][0] = v.x, afr[AB][s][1] = v.y, afr[AB][s][2] = v.z, afr[AB][s][3] = v.w;
      }
    }
    fence_regs(afr[AB]);
    const u64 desc = desc_sw128(st_read + j * BM * 128);
    // every earlier wgmma is complete: the other A buffer is free, and the partial of the group that ended with the
    // last k-tile is final (ptxas serializes wgmmas whose registers are read while it cannot prove them complete)
    wg_wait<0>();
    if constexpr (NP == 1 && FIRST) {
      if (i > 0) fold(IC<0>{});
    }
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)  // + 32 bytes per k32 step
      WgmmaS8<BM>::mma(part[B], afr[AB][s], desc + 2 * s, NOFOLD ? (i > 0 || s > 0) : !(FIRST && s == 0));
    wg_commit();
    if constexpr (NP == 2 && FIRST) {
      if (i > 0) fold(IC<1 - B>{});  // under this group's wgmmas
    }
    if (WS && j == 0 && i > 0) {
      // the last stage is done: its wgmmas completed at the wait above and the fold that read its scales ran
      __syncwarp();
      if (lane == 0) {
        if (MC == 1) {
          mbar_arrive(smem_addr(&empty_bar[slot_prev]));
        } else {  // both CTAs' producers multicast into this slot: release it to each
#pragma unroll
          for (int r = 0; r < MC; ++r) mbar_arrive_cluster(mapa_cluster(smem_addr(&empty_bar[slot_prev]), r));
        }
      }
    }
    if (!NOFOLD) {
      prev_sw = (const float*)(stg + X_BYTES + W_BYTES + j * WARPS * 64);
      prev_sa = (const float*)(stg + X_BYTES + W_BYTES + SW_BYTES + j * BM * 4);
    }
  };

  if (!WS && tid == 0)
    for (int s = 0; s < STAGES - 2 && s < nst; ++s) issue(s, s, sbase + s * STAGE, ISSUE_ALL);
  auto stage = [&](int sg, auto abc) {
    mbar_wait(smem_addr(&full_bar[slot_read]), phase);  // stage sg's bytes have landed
    const int slot_now = slot_read;
    slot_read = slot_read + 1 == STAGES ? 0 : slot_read + 1;
    phase ^= slot_read == 0;
    if (!WS) {
      __syncthreads();  // every warpgroup is past stage sg - 1 (its wgmmas and the fold that read stage sg - 2)
      const int sn = sg + STAGES - 2, slot = sn % STAGES;
      if (sn < nst && tid == 0) issue(sn, slot, sbase + slot * STAGE, ISSUE_ALL);
    }
    auto run = [&](auto jc) {
      constexpr int j = decltype(jc)::value;
      if constexpr (j < KT) {
        const int i = sg * KT + j;
        if (i < nk) ktile(i, jc, abc);
      }
    };
    run(IC<0>{}), run(IC<1>{}), run(IC<2>{}), run(IC<3>{});
    slot_prev = slot_now;
    st_read = st_read + STAGE == sbase + STAGES * STAGE ? sbase : st_read + STAGE;
  };
  if constexpr (KT == 1) {  // two stages per iteration, so each k-tile's A buffer is known at compile time
    for (int sg = 0; sg < nst; sg += 2) {
      stage(sg, IC<0>{});
      if (sg + 1 < nst) stage(sg + 1, IC<1>{});
    }
  } else {
    for (int sg = 0; sg < nst; ++sg) stage(sg, IC<0>{});
  }
  wg_wait<0>();
  if constexpr (!NOFOLD) {
    // the last group's partial: its index is that of the last k-tile's group
    if (NP == 1 || ((nk - 1) % KT / GT) % NP == 0) fold(IC<0>{});
    else fold(IC<NP - 1>{});
  }
  // MC 2: this thread's last remote access (an empty-barrier arrival) is behind it; the wait is at the exits
  if (MC > 1) cluster_arrive();
  // A8_SPLIT: the cluster's sums of this CTA's band of blocks j (8 tokens each), which it alone stores
  int jlo = 0, jhi = BM / 8;
  if constexpr (SPLIT > 1) {
    const int jb = (BM / 8 + SPLIT - 1) / SPLIT;
    jlo = kslice * jb, jhi = min(BM / 8, jlo + jb);
    if constexpr (NOFOLD) cluster_band_reduce<BM / 8, WARPS * 32>(part[0], sbase, tid, jb);
    else cluster_band_reduce<BM / 8, WARPS * 32>(acc, sbase, tid, jb);
  }

  // epilogue: value i = 4 j + 2 h + c is (weight row 16 warp + g + 8 h, token 8 j + 2 t + c)
  // A8_FQ: the token scales the first stage brought into shared memory (behind the ring), indexed by token
  const float* SAe = FQ ? (const float*)(sgen + STAGES * STAGE) - m0 : SA;
  const int nb = rt_raw * 16 + g;
  float pw[2] = {0.f, 0.f};
  if (NOFOLD) {
    const float* pp = (QS ? CS : P) + ((size_t)(rt_raw >> 3) * 8 + (rt_raw & 7)) * 16;  // G == 1
    pw[0] = pp[g], pw[1] = pp[g + 8];
  }
  auto value = [&](int i, int h, float sa) {  // before bias and clamp
    return NOFOLD ? (float)part[0][i] * sa * pw[h] : AT ? acc[i] * sa : acc[i];
  };
  if (TSTORE) {
    // every consumer warp is past its last wgmma, so the ring is free (WS: the producer has issued its last stage and
    // returned; barrier 1 counts the consumer warps only)
    asm volatile("bar.sync 1, %0;" ::"n"(WARPS * 32) : "memory");
    const int wg = warp >> 2, wq = warp & 3;
    const u32 stg = sbase + wg * (BM * 128);
    float bv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) bv[h] = bias_kind && nb + 8 * h < N ? bias_at(bias, bias_kind, nb + 8 * h) : 0.f;
    // block j's tokens m, m + 1 of each column half h as a clamped 16-bit pair; clamping the rounded pair equals
    // rounding the clamped values (rounding is monotone), so the output is bit-equal to the per-element stores
    const u32 lo2 = pack_out16x2<OUT>(lo, lo), hi2 = pack_out16x2<OUT>(hi, hi);
    auto block = [&](int j) {
      const int m = m0 + 8 * j + 2 * t;
      const float sa0 = AT && m < M ? SAe[m] : 0.f, sa1 = AT && m + 1 < M ? SAe[m + 1] : 0.f;  // one load per token
      auto pair = [&](int h) {
        const int i = 4 * j + 2 * h;
        return clamp_out16x2<OUT>(pack_out16x2<OUT>(value(i, h, sa0) + bv[h], value(i + 1, h, sa1) + bv[h]), lo2,
                                  hi2);
      };
      return make_uint2(pair(0), pair(1));
    };
    stage_out_tile<BM / 8>(stg, wq, lane, 0, BM / 8, block);
    fence_proxy_async();  // the generic-proxy smem writes are visible to the TMA engine
    asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
    if ((tid & 127) == 0) {
      tma_store_2d(&ymap, stg, (rt_raw - wq) * 16, m0);  // rows past M and columns past N are dropped
      tma_store_wait_read();  // the smem is read before the CTA exits
    }
    if (MC > 1) {  // the warp converged again: .aligned
      __syncwarp();
      cluster_wait();
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int m = m0 + 8 * j + 2 * t + c;
      if (m >= M || j < jlo || j >= jhi) continue;
      const float sa = AT ? SAe[m] : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = nb + 8 * h, i = 4 * j + 2 * h + c;
        if (n < N) store_output<OUT>(Y, (size_t)m * ldy + n, n, value(i, h, sa), bias, bias_kind, lo, hi);
      }
    }
  if (MC > 1) cluster_wait();
}
