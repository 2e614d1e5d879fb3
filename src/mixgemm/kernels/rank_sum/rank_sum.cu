// The sum over the ranks of a tensor-parallel group of each rank's partial output (a row-parallel layer's), for the
// small messages of a decode step (one token's hidden state: 16 KB; batch 16: 256 KB), in one kernel on the
// caller's stream. Each rank copies its input y into its own staging buffer (symmetric memory: every rank maps every
// rank's buffer), raises a flag in every other rank's flag array, waits for theirs, then reads the other ranks'
// pieces over NVLink and sums all of them in rank order.
// Why not NCCL: NCCL's all-reduce of 16 KB takes ~12 us on two H200s in a CUDA graph (its ring's steps, each a
// round trip) and, eager, a ProcessGroup call of host work plus a hop to NCCL's own stream; this is one launch whose
// GPU time is a flag round trip and one remote read. Why not torch's symm_mem.one_shot_all_reduce: it reads a buffer
// the caller has already filled (one more kernel: the copy) and measured no faster than NCCL here.
// Every rank adds the same values in the same order (rank 0 first, in fp32, rounded once), so every rank's output is
// bit for bit the same: the replicated residual stream stays replicated.
//
// Reuse without a second barrier: the staging buffer has two halves, used by alternate calls (the call count, kept
// on the GPU in `epochs`, so CUDA-graph replays count too). A rank writes half (e & 1) at call e + 2 only after its
// call e + 1 saw every other rank's flag of e + 1, raised when that rank's call e (and its reads of half (e & 1)) had
// finished: stream order. Hence no PDL on this kernel: it must not start before the kernel ahead of it has finished.
//
// Layout (host.py): staging buffer [2][capacity bytes], then flags u32 [RS_BLOCKS][RS_MAX_WORLD]: flags[b][r] is
// the epoch rank r's block b last raised here. Every call runs RS_BLOCKS blocks (each keeps its own epoch counter,
// all equal), striding over the 16-byte pieces; every rank runs the same calls in the same order.
#include "gemv_common.cuh"

#ifndef RS_ES  // bytes per element: 2 (float16 / bfloat16) or 4 (float32)
#define RS_ES 2
#endif
#ifndef RS_BF16  // with RS_ES 2: 1 bfloat16, 0 float16
#define RS_BF16 0
#endif
#ifndef RS_BLOCKS  // blocks per call (the host's BLOCKS): the flags' rows
#define RS_BLOCKS 32
#endif
#ifndef RS_MAX_WORLD  // ranks a sum can span: the Ranks arrays (the host's MAX_WORLD, whose struct matches)
#define RS_MAX_WORLD 8
#endif
#ifndef RS_THREADS  // threads per block (the host's THREADS)
#define RS_THREADS 256
#endif

#define ELEM_ES RS_ES
#define ELEM_BF16 RS_BF16
#include "elem16.cuh"

struct Ranks {  // every rank's staging buffer and flags, mapped in this process (by value: no pointer chase)
  u64 buffer[RS_MAX_WORLD];
  u64 flags[RS_MAX_WORLD];
};

__device__ __forceinline__ void raise_flag(u32* p, u32 v) {  // release: this block's stores are seen first
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 read_flag(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Another rank's piece: volatile keeps it out of L1, which is not coherent with the other GPU's writes.
__device__ __forceinline__ uint4 ld_remote(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

extern "C" __global__ void __launch_bounds__(RS_THREADS) mixgemm_rank_sum(
    const elem_t* __restrict__ y, elem_t* __restrict__ out, int pieces, Ranks ranks, u32* __restrict__ epochs,
    int rank, int world, long long capacity, long long timeout_ns) {
  const int b = blockIdx.x;
  __shared__ u32 s_epoch;
  if (threadIdx.x == 0) s_epoch = epochs[b] + 1;
  __syncthreads();
  const u32 epoch = s_epoch;
  const long long half = (epoch & 1) ? capacity : 0;
  uint4* mine = (uint4*)(ranks.buffer[rank] + half);
  const int stride = RS_BLOCKS * RS_THREADS;
  for (int p = b * RS_THREADS + threadIdx.x; p < pieces; p += stride) mine[p] = ((const uint4*)y)[p];
  __syncthreads();  // the block's stores before the release below
  if (threadIdx.x < world && threadIdx.x != rank) {
    const int peer = threadIdx.x;
    raise_flag((u32*)ranks.flags[peer] + b * RS_MAX_WORLD + rank, epoch);
    const u32* theirs = (const u32*)ranks.flags[rank] + b * RS_MAX_WORLD + peer;
    const u64 start = now_ns();
    // (int) of the difference: the epoch may wrap
    while ((int)(read_flag(theirs) - epoch) < 0) {
      if ((long long)(now_ns() - start) > timeout_ns) __trap();  // a rank that never comes: an error, not a hang
    }
  }
  __syncthreads();
  for (int p = b * RS_THREADS + threadIdx.x; p < pieces; p += stride) {
    float acc[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[e] = 0.f;
    for (int r = 0; r < world; ++r) {
      Piece v;
      v.v = r == rank ? ((const uint4*)y)[p] : ld_remote((const char*)ranks.buffer[r] + half + (long long)p * 16);
#pragma unroll
      for (int e = 0; e < PER; ++e) acc[e] += to_f(v.e[e]);
    }
    Piece o;
#pragma unroll
    for (int e = 0; e < PER; ++e) o.e[e] = from_f(acc[e]);
    ((uint4*)out)[p] = o.v;
  }
  if (threadIdx.x == 0) epochs[b] = epoch;
}
