// mixgemm weight-only GEMM on Hopper tensor cores (wgmma), fp16 / bf16 activations, any M.
//
// out.T[n, m] = sum_k W[n, k] x[m, k]: the *weights* are the wgmma A operand, dequantized straight into
// registers (wgmma may take A from registers, never B), the activations are the B operand in shared memory.
// Why not Triton: Triton 3.6 waits for every register-A wgmma before the next dequantization
// (warp_group_dot_wait pendings = 0), so dequantization and tensor cores never overlap inside a warpgroup;
// measured 0.54-0.71x of fp16 cuBLAS at M >= 256 on H200 (docs/kernels/cuda_wgmma.md). Here each warpgroup
// dequantizes tile i while its wgmma of tile i - 1 runs (wait_group 1), and the A registers are
// double-buffered for it (two named arrays, the loop unrolled by two).
//
// CTA = NWG warpgroups x 64 weight rows (each warp owns one 16-row tile of the wgmma_v1 layout,
// kernels/cuda_wgmma/layout.py) times BM activation rows (the wgmma N). K loop in 64-k tiles, KT of them per stage of a
// STAGES-deep ring (cp.async or TMA): per tile the BM x 64 activation atom (128-byte swizzled, the layout the wgmma
// descriptor reads without bank conflicts), every warp's 512 / 1024 weight bytes and its 16 rows' group
// parameters -- so no register holds a load in flight. A stage is refilled LAG + 1 stages after it was read: LAG
// for the wgmmas still reading it (wait_group INFLIGHT), one for the barrier that proves every warpgroup is past it.
// Scales are applied per weight pair in f16x2 / bf16x2 (mma_frag.cuh), fp32 accumulation over all of K; per-channel
// sym / zero_point weights take the exact q - z and one fp32 scale per row in the epilogue.
// Split-K (grid.z) adds fp32 partials into a zeroed workspace; the host finishes bias / clamp / cast.

#include "mma_frag.cuh"
#include "wgmma_ops.cuh"
#include "wgmma_common.cuh"

#ifndef WG_BITS
#define WG_BITS 4
#endif
#ifndef WG_ACT
#define WG_ACT 0
#endif
#ifndef WG_SCL
#define WG_SCL 0
#endif
#ifndef WG_MODE
#define WG_MODE 0
#endif
#ifndef WG_BM
#define WG_BM 128
#endif
#ifndef WG_NWG
#define WG_NWG 2
#endif
#ifndef WG_STAGES
#define WG_STAGES 4
#endif
// WG_G2: group size 32, so a 64-k tile spans two groups (steps 0-1 and 2-3 take different constants)
#ifndef WG_G2
#define WG_G2 0
#endif
// WG_SPLIT: 0 none; 1 split-K into a zeroed fp32 workspace by atomics, the host finishes; 2 the split-K slices of a
// tile (grid.z) run as one thread-block cluster: each CTA owns a band of BM / split rows, pushes its fp32 partials of
// the other bands into their owners' (drained) rings through distributed shared memory, adds what it received for
// its own band and stores that band with the full epilogue. Why: few output tiles over a long K (batch-32 conv stage 3 / 4, M ~ 1568..6272, N 256-512)
// leave most SMs idle, and the workspace route paid a zeroed M x N workspace, M x N x split atomics and a second
// kernel: H200, 1x1 conv 2048->512 @7 b32 W4, BM 256 split 4 took 19.7 us, of which the main loop is ~4.5 us.
// Measured with it (H200, BM 128 KT 2 split 2): conv b32 3x3 512->512 W8 27.1 -> 19.6 us, W4 30.1 -> 22.1
// us; 1x1 2048->512 W4 15.8 -> 13.2 us. The band goes out by TMA store (bands of whole 16-row pairs, WG_TS_BOX): the
// per-element epilogue (~7000 SASS instructions, run once per CTA) stalled on instruction fetch (41% of the samples).
// WG_SPLIT 3 (serial split-K): each slice leaves its fp32 partial tile in a workspace, counts itself on the tile's
// counter, and the slice that counts last adds the S partials in slice order (the same sum whichever CTA is last) and
// stores the tile with the full epilogue, then zeroes the counter for the next launch. Why: one kernel instead of the
// atomic route's memset + kernel + finishing kernel, and a sum that does not depend on which slice finishes last.
// Measured (H100, W4 g128 28672x8192, split 4): M = 1 52.9 -> 52.1 us, M = 16 54.5 -> 54.3 us -- the two
// extra launches were not the 4 us this split costs against 8192x28672's 224 unsplit tiles (48.1 us).
#ifndef WG_SPLIT
#define WG_SPLIT 0
#endif
// WG_TMA 1: one thread loads a whole stage: the activation atoms by TMA (2-D tensor map, 128-byte swizzle, zero fill
// past M / K), the CTA's weights of KT k-tiles as one 1-D bulk copy per 8-tile block (wgmma_v1 stores the 8 row tiles
// of a k-tile together and k-tiles one after another) and its parameters as one bulk copy of the groups the stage
// spans, all completing on one mbarrier per stage (NWG 1, 2 or 4). 0: per-thread cp.async.
// Why: the cp.async loader cost ~30% of the executed instructions at M = 4096 and ~25% at M = 32 (address / bounds
// arithmetic per 16-byte piece, ncu); an earlier TMA loader with one bulk copy per
// warp, k-tile and parameter block (17 copies per k-tile at NWG 2) was 8-18% slower than this one at every M and
// slower than cp.async below M = 256 (H200, docs/kernels/cuda_wgmma.md).
// WG_ROWS 1: int8 weights in rows_v1 (mixgemm/formats/layouts_rows.py: row-major codes, k permuted inside each 16 so
// that word t of a 16-byte chunk is lane t's A-fragment word of that k16 step) instead of wgmma_v1. A stage's weights
// are one TMA box per k-tile (64 k x the CTA's rows, 64-byte swizzle, rows past N read as zeros) and each lane takes
// its words with ldmatrix (x4: rows g / g + 8 of two k16 steps, the order the wgmma_v1 loads give). Why: the CUDA-core
// GEMV reads those rows as it reads the plain codes, so one copy of the codes can serve every M (opt-in: the
// tensor-core GEMV on rows_v1 is still slower than on wgmma_v1, docs/kernels/cuda_wgmma.md). Needs WG_TMA 1; no convolution or
// grouped experts.
#ifndef WG_ROWS
#define WG_ROWS 0
#endif
#ifndef WG_TMA
#define WG_TMA 1
#endif
// WG_PC: per-channel weights (one group): parameters read once, no parameter stream
#ifndef WG_PC
#define WG_PC 0
#endif
// WG_INFLIGHT: wgmma groups (k-tiles) left in flight per warpgroup (wait_group D); A registers are buffered D + 1
// deep and a stage is refilled D + 1 tiles after it was read. D = 2 hides more of the wgmma chain latency.
#ifndef WG_INFLIGHT
#define WG_INFLIGHT 1
#endif
#ifndef WG_GROUP_M
#define WG_GROUP_M 8
#endif
// WG_KT: 64-k tiles per pipeline stage (1, 2, 4). Why: every stage pays a fixed cost (the CTA barrier, the copy
// wait and proxy fence, the loader's bookkeeping) that at small M is as large as the stage's math and memory time
// (int4, M = 32: the loop with its loads and math removed still took 31 of 70 us; diagnostics in
// docs/kernels/cuda_wgmma.md); more tiles per stage spread it over more bytes.
#ifndef WG_KT
#define WG_KT 1
#endif

// WG_SK: stream-K. A persistent grid (the host launches as many CTAs as fit at once) splits the flat sequence of
// (output tile, k-stage) work evenly: each CTA runs a contiguous range, which may start and end inside a tile, and
// keeps its stage ring streaming across tile boundaries. A tile that several CTAs share is finished by whichever of
// them arrives last (an atomic count of its stages): the others leave fp32 partials in a workspace. Never waits on
// another CTA. Why: with one CTA per output tile, 224 tiles on 132 SMs x 2 CTAs (8192x28672, M <= 64) leave 40
// SMs at half load, and K-long layers have too few tiles (28672x8192: 64), where split-K pays a zeroed workspace,
// atomics and a second kernel. Measured (H200, W4 g128, docs/kernels/cuda_wgmma.md): 28672x8192
// M = 16 / 32 / 64 68.6 / 73.2 / 89.1 -> 55.5 / 60.7 / 76.8 us, 8192x28672 M = 16 / 32 -3%; slower at large M (the
// BM 256 partials cost more than the 3.4-wave tail) and on 4096x14336 (as many warps per SM did not help there).
// WG_SK 2: persistent whole tiles. The same persistent grid and tile loop, but CTA c runs output tiles c, c + grid,
// c + 2 grid, ... from their first stage to their last (no partials, no workspace, no counters); with WG_TSTORE each
// warpgroup stages its tile in a buffer of its own past the ring, and the TMA store stays in flight under the next
// tile's loads and wgmmas (waited for only before the buffer is written again). Why: on output-bound layers (1x1
// convolutions with K = 64..256 per output: 64 -> 256 writes 4x the bytes it reads) a CTA per tile is a serial chain
// of launch, first load, a few wgmmas and a store whose read of shared memory the CTA waits for before it exits; the
// persistent ring loads the next tiles while the current one is computed and stored. Measured (protocol
// graph timing, conv batch 32): 1x1 64->256 @56 34.5 -> 28.3 us on an H100 and 29.9 -> 23.8 us on an H200 (cuDNN
// 28.7 / 24.0), 1x1 256->64 22.6 -> 21.4 us (H200); it loses where K is long or the tiles are few (3x3 512, 1x1
// 2048->512: one CTA per SM holds no second tile's epilogue under a main loop), so the tables choose per layer.
#ifndef WG_SK
#define WG_SK 0
#endif

// WG_FOLD: grouped sym / zero_point weights keep the exact integers q - z in A (no per-pair scale multiply) and wgmma
// accumulates each group into its own fp32 partial (two, alternating), which is scaled into the accumulator once the
// group's wgmmas are done: BM / 2 FFMA per thread and group instead of 4 HMUL2 per k16 step, and one dependent
// instruction less between the weight load and the wgmma. WG_GT: 64-k tiles per group (1 or 2); a stage holds an
// even number of groups (KT % (2 GT) == 0), so every stage starts a group pair and the partial of each k-tile is
// known at compile time. Why two partials although the fold waits for every wgmma (wait_group 0 at a group's first
// k-tile): the next group's wgmmas then write the other partial while the fold's FFMAs still read this one; one
// partial with a run-time group test measured 2-5% slower (H200).
// Measured (W4 g128, H200): 4096x14336 M = 16 / 32 20.4 / 21.5 -> 19.2 / 20.4 us, 14336x4096 M = 16 21.3 ->
// 20.0 us; slower on the stream-K tiles of 8192x28672 / 28672x8192 (the partials do not fit the 2 CTAs per SM those
// need: 53 -> 59-63 us at M = 16), so the table uses it on the mid shapes only.
#ifndef WG_FOLD
#define WG_FOLD 0
#endif

// WG_CONV: implicit-GEMM convolution on this same kernel. The activations are a channels_last input
// [B, H, W, Ci] read through an im2col tensor map: for BM consecutive output pixels TMA gathers the 64 channels of one
// filter tap straight into the swizzled B atom the wgmma reads, zero-filling the padding. Why: no im2col buffer and
// no per-thread gather arithmetic -- the loader stays one thread per stage, exactly as for the GEMM. The weight's K
// order (kh, kw, ci) with Ci % 64 == 0 puts every 64-k tile inside one tap. Needs WG_TMA 1.
#ifndef WG_CONV
#define WG_CONV 0
#endif
// WG_TSTORE: the epilogue stages each warpgroup's 64-channel x BM-row output tile in shared memory (stmatrix .trans,
// 128-byte swizzle, in the ring the main loop has finished with) and writes it with one TMA store, instead of one
// 2-byte store per element. Why: the accumulator holds two consecutive *rows* of one output column per register pair,
// so the direct stores cover 16 contiguous bytes per row and warp instruction (BM / 2 store instructions per thread);
// the TMA store writes whole 128-byte lines. Layers with little K per output byte (1x1 convolutions, K = 64..256)
// are bound by those stores. Needs WG_TMA 1, no split-K / stream-K (WG_SK 2 is fine) and a 16-bit output. An odd
// last 8-row block (BM % 16 == 8) goes through stmatrix .x2.
// Measured (H200, same-run A/B): conv batch 32 1x1 64->256 W4 47.2 -> 31.9 us,
// 1x1/2 256->512 31.6 -> 23.6 us, 3x3 64->64 27.6 -> 24.4 us; GEMM W4 g128 M = 1024 695-706 -> 672-679 us
// (8192x28672) and 198-203 -> 187-192 us (4096x14336), W8 per-channel M = 4096 2950 -> 2655 us (8192x28672).
#ifndef WG_TSTORE
#define WG_TSTORE 0
#endif
// WG_TS_BOX: rows per TMA store box (the output map's box): the CTA's rows in one store (BM; WG_SPLIT 2: the band
// when every band has the same whole 16-row pairs), else 8, one store per 8-row block. Why: with bands of unequal
// size (BM 104 / split 2: 64 + 40 rows) one box cannot fit both, and a box past the band would overwrite the next
// tile's rows; before, such tiles took the per-element epilogue.
#ifndef WG_TS_BOX
#define WG_TS_BOX WG_BM
#endif
// WG_TS_CHUNK (WG_SK 2 with WG_TSTORE): 8-row blocks per staged piece of a warpgroup's output tile (an even divisor
// of BM / 8, or BM / 8); the staging buffer past the ring holds one piece per warpgroup, staged and stored in turn.
// Why: a whole BM 256 tile's staging (64 KiB for two warpgroups) took the ring from 5 stages to 4, and the persistent
// loop lost more in its main loop than the stores in flight saved; a quarter or half of it fits beside 5 stages.
#ifndef WG_TS_CHUNK
#define WG_TS_CHUNK (WG_BM / 8)
#endif

#ifndef WG_GT
#define WG_GT 1
#endif
// WG_GROUPED: a mixture-of-experts projection, E experts' wgmma_v1 layouts back to back (one E-strided buffer) and
// x's rows sorted by expert. blockIdx.y is an entry of a tile table {expert, first row, end row, -} (int4, built on
// the GPU from the routing; expert < 0: no tile): the CTA offsets the weight, parameter and bias pointers by its
// expert, loads BM rows of x from the first row and stores only the rows before the end row (the rest of the tile
// belongs to the next expert or past x). Why: a prefill's experts as one launch per projection, each expert's tokens
// an M tile of the tensor-core GEMM, where one layer per expert paid a host round trip and two launches per expert,
// and the routed CUDA-core GEMV multiplies every slot by all of its expert's weights. Needs no split-K, no stream-K,
// no TMA store (a box would write past the end row) and no PDL (the table is written by the kernels just before).
#ifndef WG_GROUPED
#define WG_GROUPED 0
#endif

#define WG_THREADS (128 * WG_NWG)
// WG_WS: warp specialization -- one more warp (after the consumer warpgroups) only loads: it waits for a slot's
// "empty" mbarrier (each consumer warp arrives once the wgmmas that read the slot are complete) and refills it, so the
// consumers never wait for each other per stage and no consumer thread issues copies. Why: the per-stage CTA barrier
// was 15-22% of the stall samples of the one-CTA-per-SM long-K W4 convs (ncu, H100), and the same
// release with the loader inside warpgroup 0 was 10-60% slower (its waits held that warpgroup's wgmmas).
// Measured (H100, conv batch 32, same runs): W4 3x3 512 @7 20.4 -> 18.7 us, 3x3/2 512 20.6 -> 19.5 us, 1x1 2048->512
// 12.7 -> 12.0-12.2 us (W8 11.6 -> 11.1). Costs 32 threads' registers: MINB 1 only.
#ifndef WG_WS
#define WG_WS 0
#endif
#define WG_CTA_THREADS (WG_THREADS + (WG_WS ? 32 : 0))
// WG_PDL: programmatic dependent launch (as the GEMVs, gemv_common.cuh). Why: at batch-32 conv and mid-M GEMM sizes
// a launch's fixed cost (barrier setup, the ring's first weight loads, the previous kernel's tail wave) is 3.7-5 us of
// a 10-20 us kernel; the weights and parameters never depend on the previous kernel, so thread 0 queues the first
// stages' weight bulk copies before griddepcontrol.wait and only the activation loads (and every global write,
// the bias read included) come after it. Needs WG_TMA 1. A no-op when launched without the PDL attribute.
#ifndef WG_PDL
#define WG_PDL 0
#endif
// WG_CHAIN (with WG_PDL; the two launches of a TAIL, gemm_wgmma.py): 1 = the whole-wave launch, whose CTAs trigger
// their dependents only once past griddepcontrol.wait; 2 = the tail launch after it, which reads nothing the first
// launch writes (its own output columns, no workspace), so it loads without waiting and thread 0 waits for the first
// launch only before the CTA exits. Why: with the usual wait the tail's CTAs, queued during the first launch's last
// wave, idled until its slowest CTA had finished; now each starts as an SM frees up, as the last wave of one launch
// would. Safe because a CTA of launch 1 past its wait proves the kernel before it complete, and launch 2 cannot
// complete before launch 1 (the kernel after it waits for launch 2).
#ifndef WG_CHAIN
#define WG_CHAIN 0
#endif
// WG_MINB: CTAs per SM the register allocation must allow (__launch_bounds__ min blocks); more resident warps
// for the latency-bound small-M tiles
#ifndef WG_MINB
#define WG_MINB 1
#endif

using namespace mg;

namespace mgw {

constexpr int BITS = WG_BITS, ACT = WG_ACT, SCL = WG_SCL, MODE = WG_MODE;
constexpr int BM = WG_BM, NWG = WG_NWG, STAGES = WG_STAGES;
constexpr bool G2 = WG_G2 != 0;
constexpr int WARPS = 4 * NWG;
constexpr int TB = BITS == 4 ? 512 : 1024;   // weight bytes of one 16-row x 64-k tile
constexpr int SB = SCL == 2 ? 4 : 2;         // bytes per scale-dtype value
constexpr int PB = SB * (MODE == 0 ? 1 : 2); // parameter bytes per (row, group)
constexpr int PBLK = 16 * PB;                // one warp's 16 rows of one group
constexpr int NPB = G2 ? 2 : 1;              // parameter blocks per warp and tile
constexpr int KT = WG_KT;
static_assert(KT == 1 || KT == 2 || KT == 4, "WG_KT is 1, 2 or 4");
// (KT > 1 with INFLIGHT 2 unrolls 3 stages per loop step, and ptxas then serializes the wgmmas: C7515)
static_assert(KT == 1 || WG_INFLIGHT == 1, "WG_KT > 1 takes WG_INFLIGHT 1");
constexpr int X_BYTES = KT * BM * 128;       // KT atoms of BM rows x 64 k x 2 bytes
constexpr int W_BYTES = KT * WARPS * TB;     // [KT][WARPS][TB]
// WG_TMA stage layout: weights [WARPS / SEGLEN][KT][SEGLEN][TB] (a segment = the CTA's row tiles inside one 8-tile
// block of wgmma_v1), parameters [WARPS / SEGLEN][NGMAX][8][PBLK] (whole 8-tile blocks of the groups the stage spans)
constexpr bool BULK = WG_TMA != 0;
constexpr bool SK = WG_SK != 0;   // a persistent grid whose CTAs loop over output tiles (stream-K or whole tiles)
constexpr bool SKW = WG_SK == 2;  // whole tiles: a CTA runs each of its tiles start to finish
static_assert(WG_SK >= 0 && WG_SK <= 2, "WG_SK is 0, 1 or 2");
static_assert(!SK || (BULK && WG_SPLIT == 0), "WG_SK takes the TMA loader (WG_TMA 1) and no split-K");
constexpr bool CSPLIT = WG_SPLIT == 2;  // split-K slices of a tile as one cluster, partials added through DSMEM
constexpr bool SSPLIT = WG_SPLIT == 3;  // serial split-K: the last slice of a tile adds the partials and stores it
static_assert(WG_SPLIT >= 0 && WG_SPLIT <= 3, "WG_SPLIT is 0, 1, 2 or 3");
constexpr int SEGLEN = WARPS < 8 ? WARPS : 8;
constexpr int NGMAX = NPB * KT;  // groups one stage can span (group size >= 64: <= KT; 32: 2 KT)
static_assert(!BULK || WARPS % SEGLEN == 0, "WG_TMA takes NWG 1, 2 or 4");
constexpr int P_BYTES = KT * (BULK ? WARPS / SEGLEN * 8 : WARPS) * NPB * PBLK;
constexpr int STAGE = (X_BYTES + W_BYTES + P_BYTES + 1023) / 1024 * 1024;  // keeps swizzle atoms aligned
static_assert((WG_THREADS / 8) % 8 == 0, "swizzle phase of a thread's chunks must not change");
constexpr int INFL = WG_INFLIGHT;
static_assert(INFL == 1 || INFL == 2, "WG_INFLIGHT is 1 or 2");
// LAG: stages a stage must wait after it was read before it is refilled (its last INFL k-tiles' wgmmas may still
// read it); UNR: stages per unrolled loop step, so that a k-tile's A-register buffer ((stage KT + j) % (INFL + 1))
// is a compile-time index (KT > 1 has INFLIGHT 1: its two buffers repeat within every stage)
constexpr int LAG = (INFL + KT - 1) / KT;
constexpr int UNR = KT == 1 ? INFL + 1 : 1;
static_assert(STAGES >= LAG + 2, "a stage is reused LAG + 1 stages after it was read");
template <int V>
struct IC {
  static constexpr int value = V;
};
static_assert(BM % 8 == 0 && BM >= 8 && BM <= 256, "BM is the wgmma N: 8..256, a multiple of 8");
constexpr bool FOLD = WG_FOLD != 0;
constexpr int GT = WG_GT;
constexpr bool CONV = WG_CONV != 0;
static_assert(!CONV || BULK, "WG_CONV takes the TMA loader (WG_TMA 1)");
constexpr bool PDL = WG_PDL != 0;
// the loader's parts of a stage (issue() in the kernel): W = its barrier (all its bytes expected) and its weight /
// parameter copies, X = its activation loads
constexpr int ISSUE_W = 1, ISSUE_X = 2, ISSUE_ALL = 3;
static_assert(!PDL || BULK, "WG_PDL takes the TMA loader (WG_TMA 1)");
constexpr bool ROWS = WG_ROWS != 0;
static_assert(!ROWS || (BULK && BITS == 8 && !CONV && !WG_GROUPED),
              "WG_ROWS: int8 weights, the TMA loader, no convolution or grouped experts");
static_assert(!WG_GROUPED || (!PDL && !SK && WG_SPLIT == 0 && !WG_TSTORE && !WG_CONV),
              "WG_GROUPED takes no PDL, stream-K, split-K, TMA store or convolution");
constexpr int CHAIN = PDL ? WG_CHAIN : 0;
static_assert(CHAIN >= 0 && CHAIN <= 2 && (CHAIN != 2 || (WG_SPLIT != 1 && WG_SPLIT != 3 && WG_SK == 0)),
              "WG_CHAIN is 0, 1 or 2 (2: no workspace, which another launch could still use)");
constexpr bool WS = WG_WS != 0;
static_assert(!WS || BULK, "WG_WS takes the TMA loader (WG_TMA 1)");
constexpr int LOADER = WS ? WG_THREADS : 0;  // the thread that issues every stage's copies
// the consumer warps only (WG_WS: the producer warp may have exited): named barrier 8 (1..4 are the warpgroups')
__device__ __forceinline__ void consumer_sync() {
  if (WS) asm volatile("bar.sync 8, %0;" ::"n"(WG_THREADS) : "memory");
  else __syncthreads();
}
constexpr bool TSTORE = WG_TSTORE != 0;
constexpr int TS_CHUNK = WG_TS_CHUNK;
static_assert(TS_CHUNK == BM / 8 || (SKW && TS_CHUNK % 2 == 0 && (BM / 8) % TS_CHUNK == 0 && WG_TS_BOX == 8 * TS_CHUNK),
              "WG_TS_CHUNK: BM / 8, or with WG_SK 2 an even divisor of BM / 8 with WG_TS_BOX = 8 WG_TS_CHUNK");
static_assert(!TSTORE || (BULK && (!SK || SKW) && WG_SPLIT != 1 && ACT != 2 && WG_TS_BOX % 8 == 0 &&
                           (SKW || STAGES * STAGE >= NWG * BM * 128)),
              "WG_TSTORE: TMA loader, no workspace split-K / stream-K (WG_SK 2 is fine), fp16 / bf16 output, "
              "WG_TS_BOX % 8 == 0, ring >= the staging tiles (WG_SK 2: staging past the ring)");
// WG_CONV geometry: output pixel m = (n * P + p) * Q + q reads input pixel (q sw - pw + kw dw, p sh - ph + kh dh) of
// image n for tap (kh, kw); k-tile kk is channels 64 (kk % cpt) .. of tap kk / cpt = kh * kw_taps + kw.
struct ConvGeo {
  int cpt, kw_taps, q, pq, sw, sh, pw, ph, dw, dh;
};
static_assert(!FOLD || (!G2 && WG_PC == 0 && MODE != 2 && (GT == 1 || GT == 2) && KT % (2 * GT) == 0),
              "WG_FOLD takes sym / zero_point groups of 64 or 128 (WG_GT 1, 2) and KT a multiple of 2 WG_GT");

// 16-byte global -> shared copy that bypasses registers and L1; bytes = 0 writes zeros (out-of-range rows / k)
__device__ __forceinline__ void cp16(u32 dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ float scl_at(const char* p) {
  if (SCL == 2) return *(const float*)p;
  const u16 h = *(const u16*)p;
  return SCL == 0 ? h_to_f32(h) : bf_to_f32(h);
}

}  // namespace mgw

using namespace mgw;

extern "C" __global__ void __launch_bounds__(WG_CTA_THREADS, WG_MINB)
mixgemm_gemm_wgmma(const char* __restrict__ W,      // wgmma_v1 weight tiles [Nt / 8][Kt][8][TB]
                   const char* __restrict__ P,      // wgmma_v1 params [Nt / 8][G][8][16][PB]
                   const char* __restrict__ X,      // [M, ldx] activations, 16-byte aligned rows, K % 8 == 0
                   int ldx,
                   void* __restrict__ Y, int ldy,   // [M, ldy] activation dtype
                   const void* __restrict__ bias, int bias_kind, float lo, float hi,
                   float* __restrict__ ws,          // WG_SPLIT 1: fp32 [M, N] zeroed workspace;
                                                    // WG_SPLIT 3: fp32 [tiles][S][BM / 2][WG_THREADS] partials;
                                                    // WG_SK: fp32 [grid][2][BM / 2][WG_THREADS] partials
                   int* __restrict__ sk_count,      // WG_SK / WG_SPLIT 3: [tiles] zeroed counts (left zeroed again)
                   int N, int M, int K, int Kt, int G, int gk, int kt_per_split,
                   const __grid_constant__ TmaDesc xmap,  // WG_TMA: activations [M, K], box 64 k x BM rows;
                                                          // WG_CONV: im2col map of the input, 64 channels x BM pixels
                   const ConvGeo cg,                      // WG_CONV: the convolution's geometry
                   const __grid_constant__ TmaDesc ymap  // WG_TSTORE: Y [M, N], box 64 columns x BM rows
#if WG_ROWS
                   ,
                   const __grid_constant__ TmaDesc wmap  // rows_v1 codes [N, Kp] uint8, box 64 k x the CTA's rows
#endif
#if WG_GROUPED
                   ,
                   const int4* __restrict__ gtab,  // [gridDim.y] {expert, first row, end row, -}
                   long long w_estride, long long p_estride, long long b_estride  // bytes per expert
#endif
) {
  // the next PDL kernel may launch once every CTA of this grid runs (it then waits in griddepcontrol.wait for this
  // grid to finish): its CTAs take the SMs this grid leaves idle and load their first weights meanwhile
  if (PDL && CHAIN != 1) pdl_launch_dependents();
  int m_base = 0;  // WG_GROUPED: the first row of x of this CTA's tile
#if WG_GROUPED
  {
    const int4 e = gtab[blockIdx.y];
    if (e.x < 0) return;
    W += e.x * w_estride, P += e.x * p_estride;
    if (bias) bias = (const char*)bias + e.x * b_estride;
    m_base = e.y, M = e.z;
  }
#endif
  extern __shared__ char smem_raw[];
  const char* sgen;
  const u32 sbase = smem_base_1024(smem_raw, sgen);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int Nt = (N + 15) >> 4;
  const int tiles_n = (Nt + WARPS - 1) / WARPS, tiles_m = WG_GROUPED ? 1 : (M + BM - 1) / BM;
  const int per_group = WG_GROUP_M * tiles_n;
  auto tile_pos = [&](int tile) { return raster_tile(tile, tiles_m, per_group, WG_GROUP_M, BM, WARPS); };
  // Work of this CTA: stages [q0, q1) of the flat (tile, stage) sequence, U stages per tile (WG_SK); else the k-tiles
  // [kt0, kt0 + nk) of tile blockIdx.x (split-K: blockIdx.z picks the slice)
  // (the host keeps tiles x U < 2^31). CTA c runs per + (c < rem) stages from c per + min(c, rem).
  const int U = (Kt + KT - 1) / KT;
  const int sk_per = tiles_n * tiles_m * U / gridDim.x, sk_rem = tiles_n * tiles_m * U % gridDim.x;
  auto cta_start = [&](int c) { return c * sk_per + min(c, sk_rem); };
  // the step from one of the CTA's tiles to its next: WG_SK 2 strides by the grid (tiles running at the same time are
  // neighbours in the raster, as without a persistent grid), stream-K ranges are contiguous (host: grid <= tiles)
  const int tile_step = SKW ? (int)gridDim.x : 1;
  int q0 = 0, kt0 = 0, nk = Kt, nst, first_tile;
  if (SKW) {
    first_tile = blockIdx.x;
    q0 = first_tile * U;
    nst = ((tiles_n * tiles_m - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * U;
  } else if (SK) {
    q0 = cta_start(blockIdx.x);
    nst = sk_per + ((int)blockIdx.x < sk_rem);
    first_tile = q0 / U;
  } else {
    kt0 = blockIdx.z * kt_per_split;
    nk = min(Kt - kt0, kt_per_split);
    nst = (nk + KT - 1) / KT;  // stages of this split (the last one may hold fewer than KT tiles)
    first_tile = blockIdx.x;
  }
  if (nst <= 0) {
    if (CHAIN == 2 && tid == 0) pdl_wait();  // WG_CHAIN 2: exit only once the whole-wave launch is complete
    return;
  }

  // The consumers' tile: m0, rt_raw (this warp's 16-row tile), rt (clamped: warps past the last tile load a valid
  // one and never store); cs_sk: the stage of it being read
  int cs_tile = first_tile, cs_sk = SK ? q0 - first_tile * U : 0;
  int m0, rt_raw, rt;
  auto consumer_tile = [&]() {
    const int2 p = tile_pos(cs_tile);
    m0 = m_base + p.x, rt_raw = p.y + warp, rt = min(rt_raw, Nt - 1);
  };
  consumer_tile();

  // Loader state: everything that does not change from tile to tile is computed once (measured: address math
  // redone per tile made the loop issue-bound, ~280 instructions per warp and k-tile at M = 4096).
  constexpr int XCH = BM * 8;                                    // 16-byte chunks of one 64-k activation atom
  constexpr int XJ = (XCH + WG_THREADS - 1) / WG_THREADS;        // chunks per thread and atom
  constexpr int XROWS = WG_THREADS / 8;                          // rows between a thread's chunks
  const int xr0 = tid >> 3, xch = tid & 7;
  // row r's chunk c sits at chunk c ^ (r % 8) of its 128-byte row (128-byte swizzle); XROWS % 8 == 0
  const u32 xdst = xr0 * 128 + ((xch ^ (xr0 & 7)) << 4);
  const char* xsrc = X + ((size_t)min(m0 + xr0, M - 1) * ldx + (size_t)kt0 * 64 + xch * 8) * 2;
  const size_t xstep = (size_t)XROWS * ldx * 2;
  u32 xrow_ok = 0;  // bit j: chunk j's row exists
#pragma unroll
  for (int j = 0; j < XJ; ++j)
    if ((XCH % WG_THREADS == 0 || tid + j * WG_THREADS < XCH) && m0 + xr0 + j * XROWS < M) xrow_ok |= 1u << j;
  // wgmma_v1 stores 8 row tiles together per k-tile: tile (rt, kt) at ((rt / 8 * Kt + kt) * 8 + rt % 8) * TB
  const char* wsrc = W + (((size_t)(rt >> 3) * Kt + kt0) * 8 + (rt & 7)) * TB + lane * 16;
  constexpr bool PC = WG_PC != 0;  // per-channel: one parameter set, read once per tile before its loop
  constexpr int PCH = PBLK / 16;   // 16-byte pieces of one parameter block
  const int pb = lane / PCH;
  // params [Nt / 8][G][8][16 rows]: block (rt, grp) at ((rt / 8 * G + grp) * 8 + rt % 8) * PBLK
  const char* psrc = P + ((size_t)(rt >> 3) * G * 8 + (rt & 7)) * PBLK + (lane % PCH) * 16;
  const u32 pdst = X_BYTES + W_BYTES + (warp * NPB + pb) * PBLK + (lane % PCH) * 16;
  const int nblk = (Nt + 7) >> 3;  // WG_TMA: 8-tile blocks stored
  const int seg = warp / SEGLEN;   // WG_TMA: this warp's segment
  u32 st_issue = sbase;            // stage buffer of the next stage to load
  // the loader's tile (WG_TMA: only thread LOADER issues; it runs up to STAGES - 1 stages ahead of the consumers)
  int ld_tile = cs_tile, ld_sk = cs_sk, ld_m0 = m0, ld_rt = rt_raw - warp;

  // WG_CONV loader cursor (the loading thread): the next k-tile's channel tile, filter column and filter row, and the
  // input pixel under the filter's top-left corner for the output tile's first pixel. Loop-carried, so that the main loop
  // does no run-time integer division (measured in SASS: the divisions inline cost 31 registers at BM 32).
  int cv_c = 0, cv_s = 0, cv_r = 0, cv_w0 = 0, cv_h0 = 0, cv_img = 0;
  auto conv_cursor = [&](int m0_, int kk) {  // output tile from pixel m0_, at its k-tile kk
    if (CONV && tid == LOADER) {
      cv_img = m0_ / cg.pq;
      const int pix = m0_ - cv_img * cg.pq, p = pix / cg.q;
      cv_w0 = (pix - p * cg.q) * cg.sw - cg.pw, cv_h0 = p * cg.sh - cg.ph;
      const int tap = kk / cg.cpt;
      cv_c = kk - tap * cg.cpt, cv_r = tap / cg.kw_taps, cv_s = tap - cv_r * cg.kw_taps;
    }
  };
  conv_cursor(ld_m0, kt0 + ld_sk * KT);

  __shared__ __align__(8) u64 full_bar[STAGES];  // WG_TMA: stage s's bytes have landed (phase flips per use)
  __shared__ __align__(8) u64 empty_bar[WS ? STAGES : 1];  // WG_WS: every consumer warp is done with slot s
  __shared__ int sk_last;                        // WG_SK / WG_SPLIT 3: this CTA finishes the tile
  if (WG_TMA) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) mbar_init(smem_addr(&full_bar[s]), 1);
      if (WS) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) mbar_init(smem_addr(&empty_bar[s]), WARPS);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  int slot_issue = 0;

  // part: ISSUE_W / ISSUE_X / ISSUE_ALL (WG_PDL issues the first stages in two passes); either way the loader moves
  // to the next stage
  auto issue = [&](int sg, int part = ISSUE_ALL) {  // the CTA's stage sg (tile ld_tile, k-tiles kt0 + KT ld_sk ..)
    if (sg < nst) {
      const int tiles = min(KT, nk - ld_sk * KT);
      if (BULK) {
        if (tid == LOADER) {
          // WG_WS: the slot's previous stage (sg - STAGES) was released by every consumer warp (round r = sg / STAGES
          // waits for the empty barrier's r-th phase completion: parity (r - 1) & 1)
          if (WS && sg >= STAGES) mbar_wait(smem_addr(&empty_bar[slot_issue]), ((sg / STAGES) & 1) ^ 1);
          const u32 bar = smem_addr(&full_bar[slot_issue]);
          const int ks = kt0 + ld_sk * KT;  // first k-tile of the stage (a multiple of KT, so groups start aligned)
          const int g_lo = (ks * 64) >> gk, ng = min(((ks + tiles) * 64 - 1) >> gk, G - 1) - g_lo + 1;
          const int blk0 = ld_rt >> 3;
          u32 bytes = tiles * BM * 128 + (ROWS ? tiles * WARPS * TB : 0);  // (a TMA box counts its zero fill)
#pragma unroll
          for (int sgm = 0; sgm < WARPS / SEGLEN; ++sgm)
            if (blk0 + sgm < nblk) bytes += (ROWS ? 0 : tiles * SEGLEN * TB) + (PC ? 0 : ng * 8 * PBLK);
          if (part & ISSUE_W) mbar_expect_tx(bar, bytes);
          if ((part & ISSUE_X) && CONV) {
#pragma unroll
            for (int j = 0; j < KT; ++j)
              if (j < tiles) {
                tma_im2col_4d(st_issue + j * BM * 128, &xmap, cv_c * 64, cv_w0, cv_h0, cv_img, (u16)(cv_s * cg.dw),
                              (u16)(cv_r * cg.dh), bar);
                if (++cv_c == cg.cpt) {  // next tap: filter column, then row
                  cv_c = 0;
                  if (++cv_s == cg.kw_taps) cv_s = 0, ++cv_r;
                }
              }
          } else if (part & ISSUE_X) {
#pragma unroll
            for (int j = 0; j < KT; ++j)
              if (j < tiles) tma_2d(st_issue + j * BM * 128, &xmap, (ks + j) * 64, ld_m0, bar);
          }
#if WG_ROWS
          if (part & ISSUE_W) {
#pragma unroll
            for (int j = 0; j < KT; ++j)
              if (j < tiles) tma_2d(st_issue + X_BYTES + j * WARPS * TB, &wmap, (ks + j) * 64, ld_rt * 16, bar);
          }
#endif
#pragma unroll
          for (int sgm = 0; sgm < WARPS / SEGLEN; ++sgm) {
            const int blk = blk0 + sgm;
            if (blk >= nblk || !(part & ISSUE_W)) continue;  // NWG 4 on the last 8-tile block: its warps never store
            const u32 wd = st_issue + X_BYTES + sgm * KT * SEGLEN * TB;
            if (ROWS) {
              // (the weights came as TMA boxes above)
            } else if (SEGLEN == 8) {
              bulk_copy(wd, W + ((size_t)blk * Kt + ks) * 8 * TB, tiles * 8 * TB, bar);
            } else {
#pragma unroll
              for (int j = 0; j < KT; ++j)
                if (j < tiles)
                  bulk_copy(wd + j * SEGLEN * TB, W + (((size_t)blk * Kt + ks + j) * 8 + (ld_rt & 7)) * TB,
                            SEGLEN * TB, bar);
            }
            if (!PC)
              bulk_copy(st_issue + X_BYTES + W_BYTES + sgm * NGMAX * 8 * PBLK, P + ((size_t)blk * G + g_lo) * 8 * PBLK,
                        ng * 8 * PBLK, bar);
          }
        }
        slot_issue = slot_issue + 1 == STAGES ? 0 : slot_issue + 1;
      } else {
#pragma unroll
        for (int j = 0; j < KT; ++j) {
          if (j < tiles) {
            const int k = (kt0 + ld_sk * KT + j) * 64 + xch * 8;
            const bool kok = k < K;
#pragma unroll
            for (int r = 0; r < XJ; ++r)
              if (XCH % WG_THREADS == 0 || tid + r * WG_THREADS < XCH) {
                const bool ok = ((xrow_ok >> r) & 1) && kok;  // else zeros, read from nowhere (a valid dummy address)
                cp16(st_issue + j * BM * 128 + xdst + r * XROWS * 128, ok ? xsrc + j * 128 + r * xstep : X,
                     ok ? 16 : 0);
              }
#pragma unroll
            for (int u = 0; u < TB / 512; ++u)
              cp16(st_issue + X_BYTES + (j * WARPS + warp) * TB + u * 512 + lane * 16, wsrc + j * 8 * TB + u * 512,
                   16);
            if (!PC && lane < NPB * PCH) {
              const int grp = min(((kt0 + ld_sk * KT + j) * 64 + 32 * pb) >> gk, G - 1);
              cp16(st_issue + pdst + j * WARPS * NPB * PBLK, psrc + (size_t)grp * 8 * PBLK, 16);
            }
          }
        }
        xsrc += 128 * KT;
        wsrc += 8 * TB * KT;
      }
      st_issue = st_issue + STAGE == sbase + STAGES * STAGE ? sbase : st_issue + STAGE;
      if (++ld_sk == U && SK) {  // next tile of the stream-K range
        ld_sk = 0;
        const int2 p = tile_pos(ld_tile += tile_step);
        ld_m0 = p.x, ld_rt = p.y;
        if (part & ISSUE_X) conv_cursor(ld_m0, 0);  // (read by the activation loads only)
      }
    }
    if (!WG_TMA) cp_commit();
  };

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;

  // group constants of rows g, g + 8 (per block b of the tile), decoded only when the group changes
  RowQ<ACT, MODE> q[NPB][2];
  float z[NPB][2], rscale[2];  // rscale: the fp32 scales of rows g, g + 8 (block 0): FOLD and the PCS epilogue
  auto decode = [&](const char* pbase, int bstride) {  // bstride: bytes between the NPB blocks of a tile
#pragma unroll
    for (int b = 0; b < NPB; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const char* p = pbase + b * bstride + (g + 8 * h) * PB;
        if constexpr (ACT == 0 && SCL == 0 && MODE == 0 && !FOLD) {
          // fp16 sym: the scale's bits straight into the half2 pair, compile-time magic constants (no cvt per group:
          // the W4 g128 convs decode a group every 2 k-tiles)
          const u32 bits = *(const u16*)p;
          z[b][h] = BITS == 4 ? 8.f : 128.f;
          q[b][h].template set_sym_f16_bits<BITS == 4 ? 8 : 128>(bits);
          if (b == 0) rscale[h] = h_to_f32((u16)bits);
          continue;
        }
        const float s = scl_at(p);
        const float sec = MODE == 0 ? 0.f : scl_at(p + SB);
        z[b][h] = MODE == 1 ? sec : (BITS == 4 ? 8.f : 128.f);
        if (!FOLD) q[b][h].set(s, z[b][h], MODE == 2 ? sec : 0.f);
        else q[b][h].set_exact(z[b][h]);
        if (b == 0) rscale[h] = s;
      }
  };
  // WG_FOLD: the groups' partial accumulators, their row scales and whether they hold a group not yet folded
  float tacc[2][BM / 2];  // (unused, and so never allocated, without WG_FOLD)
  float tscale[2][2];
  bool tpend[2] = {false, false};
  auto fold = [&](auto b) {  // acc += tacc[b] x its group's row scales (its wgmmas must be complete)
    constexpr int B = decltype(b)::value;
    if constexpr (FOLD) {
      if (tpend[B]) {
        fence_regs(tacc[B]);
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) acc[i] = fmaf(tacc[B][i], tscale[B][(i >> 1) & 1], acc[i]);
        tpend[B] = false;
      }
    }
  };
  // Per-channel sym / zero_point: A holds the exact integers q - z and each row's scale multiplies its fp32 result
  // once in the epilogue (why: one mul per A register less -- a third of the int8 dequantization -- and no fp16 /
  // bf16 rounding of the weights). Offset mode needs the per-row m * sum(x) term, so it keeps the scaled path.
  constexpr bool PCS = PC && MODE != 2;
  auto tile_params = [&]() {  // per-channel: the tile's one parameter set (and its row scales in rscale)
    if (PC) decode(P + ((size_t)(rt >> 3) * 8 + (rt & 7)) * PBLK, PBLK);  // G == 1
  };
  int cur_grp = -1;
  u32 st_read = sbase;  // stage buffer being consumed
  int slot_read = 0, slot_rel = 0;  // slot_rel (WG_WS): the slot of the next stage this warp releases
  u32 phase = 0;
  u32 afr[INFL + 1][4][4];  // A registers of the last INFL + 1 k-tiles (indices fixed at compile time)

  // one k-tile (tile j of the stage being read, k-tile i of the output tile's range): dequantize its A fragments
  // into afr_t, queue its four wgmma k16 steps as one group
  auto tile = [&](int i, auto jc, u32(&afr_t)[4][4]) {
    constexpr int j = decltype(jc)::value;
    const char* stg = sgen + (st_read - sbase);
    u32 w[TB / 128];
    if (ROWS) {
      // k-tile j's box: the CTA's rows x 64 bytes, 64-byte swizzle (16-byte chunk c of row r at c ^ ((r >> 1) & 3));
      // ldmatrix x4 number h: matrices (rows 0-7, step 2h), (rows 8-15, step 2h), (rows 0-7, 2h + 1), (rows 8-15,
      // 2h + 1) of this warp's 16 rows; lane l addresses row l & 7 of matrix l >> 3
      const u32 box = st_read + X_BYTES + j * WARPS * TB;
      const int q = lane >> 3, rr = 16 * warp + (lane & 7) + 8 * (q & 1);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ldmatrix_x4(box + rr * 64 + (((2 * h + (q >> 1)) ^ ((rr >> 1) & 3)) << 4), w[4 * h], w[4 * h + 1],
                    w[4 * h + 2], w[4 * h + 3]);
    } else {
      const char* wp = stg + X_BYTES + (BULK ? (seg * KT + j) * SEGLEN + warp % SEGLEN : j * WARPS + warp) * TB + lane * 16;
      const uint4 v0 = *(const uint4*)wp;
      w[0] = v0.x, w[1] = v0.y, w[2] = v0.z, w[3] = v0.w;
      if (TB == 1024) {
        const uint4 v1 = *(const uint4*)(wp + 512);
        w[TB / 128 - 4] = v1.x, w[TB / 128 - 3] = v1.y, w[TB / 128 - 2] = v1.z, w[TB / 128 - 1] = v1.w;
      }
    }
    if (!PC) {
      const int grp = ((kt0 + i) * 64) >> gk;  // warp-uniform
      // (int8 decodes every tile: with the cached constants the fp16 int8 sym / offset kernels returned wrong
      // results on an H200 -- zero_point, bf16 and int4 were right; not understood, see docs/kernels/cuda_wgmma.md)
      if (G2 || BITS == 8 || grp != cur_grp) {
        if (BULK) {  // the stage holds whole 8-tile blocks of its groups, from the group of its first k-tile
          const int gi = grp - (((kt0 + i - j) * 64) >> gk);
          decode(stg + X_BYTES + W_BYTES + ((seg * NGMAX + gi) * 8 + (rt_raw & 7)) * PBLK, 8 * PBLK);
        } else {
          decode(stg + X_BYTES + W_BYTES + (j * WARPS + warp) * NPB * PBLK, PBLK);
        }
        cur_grp = grp;
      }
    }
    constexpr bool SCALED = !PCS && !FOLD;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int b = G2 ? s / 2 : 0;
      if (BITS == 4) {
        a_frag_step<4, ACT, MODE, SCALED>(w, s, q[b][0], q[b][1], z[b][0], z[b][1], afr_t[s]);
      } else {
        const u32 wu[4] = {w[4 * (s / 2)], w[4 * (s / 2) + 1], w[4 * (s / 2) + 2], w[4 * (s / 2) + 3]};
        a_frag_step<8, ACT, MODE, SCALED>(wu, s % 2, q[b][0], q[b][1], z[b][0], z[b][1], afr_t[s]);
      }
    }
    fence_regs(afr_t);
    const u64 desc = desc_sw128(st_read + j * BM * 128);
    // WG_FOLD: this k-tile's partial -- the stage starts a group pair, so it is (j / GT) % 2 (j is unrolled)
    constexpr int B = (j / GT) % 2;
    constexpr bool FIRST = FOLD && j % GT == 0;  // the group's first k-tile: overwrite the partial
    if constexpr (FIRST) {
      // fold the previous group before queueing this one: ptxas serializes every wgmma (C7514) when registers of
      // a wgmma that may still be in flight are read, and it cannot see that wait_group 1 covered that group
      wg_wait<0>();
      fold(IC<1 - B>{});
      tscale[B][0] = rscale[0], tscale[B][1] = rscale[1], tpend[B] = true;
    }
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)  // + 32 bytes per k16 step
      Wgmma<BM, ACT>::mma(FOLD ? tacc[B] : acc, afr_t[s], desc + 2 * s, FIRST && s == 0 ? 0 : 1);
    wg_commit();
    wg_wait<INFL>();  // the wgmma of k-tile i - INFL is done: its A registers may be reused
  };
  // one stage: wait for its bytes, refill the stage the wgmmas are done with, run its KT k-tiles. u = the stage's
  // place in the unrolled loop, so that the A-register buffer of every k-tile is known at compile time.
  auto stage = [&](int sg, auto u) {
    if (WG_TMA) {
      mbar_wait(smem_addr(&full_bar[slot_read]), phase);  // stage sg's bytes have landed
      slot_read = slot_read + 1 == STAGES ? 0 : slot_read + 1;
      phase ^= slot_read == 0;
    } else {
      cp_wait<STAGES - 2 - LAG>();  // this thread's pieces of stage sg have landed
      fence_proxy_async();
    }
    if (!WS) {
      __syncthreads();  // everyone's pieces landed; every warpgroup is past stage sg - 1, so stage sg - 1 - LAG is free
      issue(sg + STAGES - 1 - LAG);
    }
    auto run = [&](auto jc) {  // k-tile j of the stage (j a compile-time constant)
      constexpr int j = decltype(jc)::value;
      if constexpr (j < KT) {
        const int i = cs_sk * KT + j;
        if (KT == 1 || i < nk) tile(i, jc, afr[(decltype(u)::value * KT + j) % (INFL + 1)]);
      }
    };
    run(IC<0>{}), run(IC<1>{}), run(IC<2>{}), run(IC<3>{});
    if (WS && sg >= LAG) {  // the wgmmas of stage sg - LAG are complete (wait_group INFLIGHT, LAG KT >= INFLIGHT)
      if (lane == 0) mbar_arrive(smem_addr(&empty_bar[slot_rel]));
      slot_rel = slot_rel + 1 == STAGES ? 0 : slot_rel + 1;
    }
    st_read = st_read + STAGE == sbase + STAGES * STAGE ? sbase : st_read + STAGE;
    ++cs_sk;
  };

  // the output tile's epilogue: acc[4j + 2h + c] = (weight row 16 * (warp % 4) + g + 8 h of the warpgroup, activation
  // row 8 j + 2 t + c). WG_SK: a tile this CTA ran only part of goes through the workspace; the CTA that completes
  // its stage count adds the others' partials and stores it.
  auto finish_tile = [&](int k_stages) {  // k_stages: stages of the tile this CTA ran
    wg_wait<0>();
    fold(IC<0>{}), fold(IC<1>{});  // WG_FOLD: the last group (and the one before, after a partial last stage)
    fence_regs(acc);
    // WG_SPLIT 3 / WG_SK: write this thread's partial tile (acc, BM / 2 floats at stride WG_THREADS from p), add
    // `count` to the tile's counter, and return in every thread whether this CTA's count completed `total` (it then
    // finishes the tile; the fence after the count makes the other CTAs' partials visible to its loads)
    auto publish_partial = [&](float* p, int* counter, int count, int total) {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) __stcg(p + i * WG_THREADS, acc[i]);
      __threadfence();  // the partial is visible GPU-wide before the count says so
      consumer_sync();
      if (tid == 0) sk_last = atomicAdd(counter, count) + count == total;
      consumer_sync();
      const bool last = sk_last != 0;
      if (last) __threadfence();
      return last;
    };
    bool store = true;
    int jlo = 0, jhi = BM / 8;  // WG_SPLIT 2: the band of accumulator rows (8 activation rows each) this CTA stores
    if (CSPLIT) {
      // each CTA stores a band of jb accumulator rows (8 activation rows each), the cluster's sums
      // (wgmma_common.cuh cluster_band_reduce; TSTORE: whole 16-row pairs per band, so each band's stmatrix .x4 pairs
      // start at an even block; its CTA barrier keeps the staging writes behind the reduction's reads)
      const int S = cluster_nctarank(), r = cluster_ctarank();
      const int jb = TSTORE ? 2 * ((BM / 16 + BM / 8 % 2 + S - 1) / S) : (BM / 8 + S - 1) / S;
      jlo = r * jb, jhi = min(BM / 8, jlo + jb);
      cluster_band_reduce<BM / 8, WG_THREADS>(acc, sbase, tid, jb);
    }
    if (SSPLIT) {
      const int S = (Kt + kt_per_split - 1) / kt_per_split, z = blockIdx.z;
      float* part = ws + (size_t)blockIdx.x * S * (BM / 2) * WG_THREADS + tid;  // [S][BM / 2][WG_THREADS] of the tile
      store = publish_partial(part + (size_t)z * (BM / 2) * WG_THREADS, sk_count + blockIdx.x, 1, S);
      if (store) {
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) {
          float v = 0.f;
          for (int q = 0; q < S; ++q) v += q == z ? acc[i] : __ldcg(part + ((size_t)q * (BM / 2) + i) * WG_THREADS);
          acc[i] = v;
        }
        if (tid == 0) sk_count[blockIdx.x] = 0;  // every slice has counted: zero for the next launch
      }
    }
    if (SK && !SKW && k_stages != U) {
      const int slot = cs_tile == first_tile ? 0 : 1;  // a CTA's range starts and ends inside at most 2 tiles
      float* mine = ws + (size_t)(blockIdx.x * 2 + slot) * (BM / 2) * WG_THREADS + tid;
      store = publish_partial(mine, sk_count + cs_tile, k_stages, U);
      if (store) {
        // the tile's other CTAs: those whose ranges hold its first and last stage, and all between
        const int big = sk_rem * (sk_per + 1);  // stages of the CTAs that run one more
        auto cta_of = [&](int q) { return q < big ? q / (sk_per + 1) : sk_rem + (q - big) / sk_per; };
        const int c_hi = cta_of(cs_tile * U + U - 1);
        for (int c = cta_of(cs_tile * U); c <= c_hi; ++c) {
          if (c == (int)blockIdx.x) continue;
          const int c_first = cta_start(c) / U;
          const float* other = ws + (size_t)(c * 2 + (cs_tile == c_first ? 0 : 1)) * (BM / 2) * WG_THREADS + tid;
#pragma unroll
          for (int i = 0; i < BM / 2; ++i) acc[i] += __ldcg(other + i * WG_THREADS);
        }
        if (tid == 0) sk_count[cs_tile] = 0;  // every CTA of the tile has counted: zero for the next launch
      }
    }
    if (TSTORE && store) {
      const int wg = warp >> 2, wq = warp & 3;
      // [BM rows][64 columns] of 2 bytes, 128-byte swizzle (1024-aligned)
      const u32 stg = sbase + (SKW ? STAGES * STAGE : 0) + wg * (TS_CHUNK * 8 * 128);
      // every warpgroup's wgmmas are complete and every stage was consumed: the ring is free (WG_SK 2 stages past it)
      if (!SKW) consumer_sync();
      const int nb = rt_raw * 16 + g;
      float bv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) bv[h] = bias_kind && nb + 8 * h < N ? bias_at(bias, bias_kind, nb + 8 * h) : 0.f;
      // Values i, i + 1 (one row pair of column h) as a clamped 16-bit pair: scale and bias in one FFMA, one cvt for
      // the pair, then the clamp on the rounded pair with NaN-propagating min / max (NaN stays NaN, as torch.clamp).
      // Rounding is monotone, so clamp(round(v)) == round(clamp(v)) for any lo <= hi. Why: compare-and-select per
      // value (FSETP + FSEL, two each) was 26-30% of the executed instructions of the K = 128..256 1x1 convs, whose
      // epilogue outweighs their main loop (ncu, H100).
      const u32 lo2 = pack_out16x2<ACT>(lo, lo), hi2 = pack_out16x2<ACT>(hi, hi);
      auto val2 = [&](int i, int h) {
        const float v0 = PCS ? fmaf(acc[i], rscale[h], bv[h]) : acc[i] + bv[h];
        const float v1 = PCS ? fmaf(acc[i + 1], rscale[h], bv[h]) : acc[i + 1] + bv[h];
        return clamp_out16x2<ACT>(pack_out16x2<ACT>(v0, v1), lo2, hi2);
      };
#pragma unroll
      for (int c = 0; c < BM / 8; c += TS_CHUNK) {  // one piece (the whole tile unless WG_SK 2 stages in pieces)
        if (SKW) {
          // the warpgroup's own buffer past the ring: its previous piece's TMA store may still be reading it
          if ((tid & 127) == 0) tma_store_wait_read();
          asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        }
        // WG_SPLIT 2: this CTA's band only (it starts at an even block), staged from row 0 of the tile
        const int lo = TS_CHUNK == BM / 8 ? jlo : c, hi = TS_CHUNK == BM / 8 ? jhi : c + TS_CHUNK;
        stage_out_tile<BM / 8>(stg, wq, lane, lo, hi,
                               [&](int j) { return make_uint2(val2(4 * j, 0), val2(4 * j + 2, 1)); });
        fence_proxy_async();  // the generic-proxy smem writes are visible to the TMA engine
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        if ((tid & 127) == 0) {
          // one store per WG_TS_BOX rows of the piece (WG_SPLIT 2: the band; an empty band stores nothing)
          const int rows = 8 * (hi - lo);
          for (int r0 = 0; r0 < rows; r0 += WG_TS_BOX)
            tma_store_2d(&ymap, stg + r0 * 128, (rt_raw - wq) * 16, m0 + 8 * lo + r0);
          if (!SKW) tma_store_wait_read();  // the smem is read before the CTA exits (WG_SK 2: after its last tile)
        }
      }
    } else if (store) {
      const int nb = rt_raw * 16 + g;
#pragma unroll
      for (int j = 0; j < BM / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int n = nb + 8 * h, m = m0 + 8 * j + 2 * t + c;
            if (n < N && m < M && (!CSPLIT || (j >= jlo && j < jhi))) {
              const float v = PCS ? acc[4 * j + 2 * h + c] * rscale[h] : acc[4 * j + 2 * h + c];
              if (WG_SPLIT == 1) atomicAdd(ws + (size_t)m * N + n, v);
              else store_output<ACT>(Y, (size_t)m * ldy + n, n, v, bias, bias_kind, lo, hi);
            }
          }
    }
  };

  if (PDL) {
    // the first stages' weights go out before the wait; then the loader rewinds and queues their activations
    // (measured the same: stage 0's weights only, or an L2 prefetch of them -- docs/kernels/cuda_wgmma.md)
    const u32 st0 = st_issue;
    const int slot0 = slot_issue, sk0 = ld_sk, tile0 = ld_tile, m00 = ld_m0, rt0 = ld_rt;
#pragma unroll
    for (int s = 0; s < STAGES - 1 - LAG; ++s) issue(s, ISSUE_W);
    st_issue = st0, slot_issue = slot0, ld_sk = sk0, ld_tile = tile0, ld_m0 = m00, ld_rt = rt0;
    if (CHAIN != 2) pdl_wait();  // every thread: x (by TMA), y, bias and the split / stream-K workspaces belong to
                                 // other kernels
    if (CHAIN == 1) pdl_launch_dependents();  // the kernel before this one is complete (WG_CHAIN)
#pragma unroll
    for (int s = 0; s < STAGES - 1 - LAG; ++s) issue(s, ISSUE_X);
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1 - LAG; ++s) issue(s);
  }
  if (WS && warp == WARPS) {  // the producer warp: every further stage, each into a slot its consumers released
    for (int q = STAGES - 1 - LAG; q < nst; ++q) issue(q);
    return;  // (cluster barriers count non-exited threads only; the consumers' CTA barriers are named, WARPS warps)
  }
  // the first tile's per-channel parameters: read from global memory after the first stages are queued, so that
  // their latency overlaps the loads' (before the queueing, the scale loads' wait was 5-8% of the stall samples of
  // the one-tile-per-CTA 1x1 convs: ncu, H100)
  tile_params();
  int sg = 0;
  while (true) {  // one output tile (or the CTA's part of it) per pass
    const int seg_end = SK ? min(nst, sg + U - cs_sk) : nst;
    const int k_stages = seg_end - sg;
    for (; sg + UNR <= seg_end; sg += UNR) {
      stage(sg, IC<0>{});
      if (UNR > 1) stage(sg + 1, IC<1 % UNR>{});
      if (UNR > 2) stage(sg + 2, IC<2 % UNR>{});
    }
    if (UNR > 1 && sg < seg_end) stage(sg++, IC<0>{});
    if (UNR > 2 && sg < seg_end) stage(sg++, IC<1 % UNR>{});
    finish_tile(k_stages);
    if (!SK || sg >= nst) break;
    // the next tile (the A-register buffers restart at 0: finish_tile waited for every wgmma)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
    cs_tile += tile_step;
    cs_sk = 0;
    consumer_tile();
    cur_grp = -1;
    tile_params();
  }
  if (TSTORE && SKW && (tid & 127) == 0) tma_store_wait_read();  // the last tile's store has read its smem
  if (CHAIN == 2 && tid == 0) pdl_wait();  // WG_CHAIN 2: exit only once the whole-wave launch is complete
}
