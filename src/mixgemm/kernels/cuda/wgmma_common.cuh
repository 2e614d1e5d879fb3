// PTX helpers shared by the Hopper wgmma GEMMs (gemm_wgmma.cu, gemm_wgmma_a8.cu): shared-memory addresses,
// mbarriers, TMA / bulk copies, the wgmma fence / commit / wait trio, register pins and the 128-byte-swizzle
// descriptor of a K-major B tile.
#pragma once

#include "gemv_common.cuh"

namespace mgw {

using namespace mg;

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// Thread-block clusters (sm_90): distributed shared memory
__device__ __forceinline__ int cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ int cluster_nctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return (int)r;
}
// The cluster barrier in two halves: arrive (release) after this thread's last access to another CTA's shared memory,
// wait (acquire) before anything that needs every CTA past its arrive -- e.g. exiting, so no CTA leaves while a peer
// may still write into its shared memory or arrive on its mbarriers.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// every thread of every CTA of the cluster: shared-memory writes before are visible to (remote) reads after
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// the shared::cluster address of this CTA's shared::cta address a in CTA `rank` of the cluster
__device__ __forceinline__ u32 mapa_cluster(u32 a, int rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_cluster_v4(u32 a, float x, float y, float z, float w) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4(u32 a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
  return v;
}
// Split-K over a thread-block cluster: the S CTAs of one output tile each ran a slice of K, and each thread holds
// NJ x 4 values of the tile (v[4 j .. 4 j + 3]; fp32 sums, or int32 ones carried bit-exact and added as integers).
// CTA r owns the band of rows j in [r jb, r jb + jb) and receives the peers' values of it in its free shared-memory
// buffer `buf`: slot s (the senders in rank order, itself left out) holds [jb][NT] 16-byte pieces, the same thread
// index on both sides (conflict-free). Why push (remote stores) and not pull: a remote load stalls its thread for the
// round trip, and the loads went out one at a time (H200: +7 us for BM 256 / split 4); stores do not wait. On return
// the band's values of v hold the cluster's sums (the others are stale). The first cluster_sync proves every CTA past
// its main loop (its buffer free) and running; buf must hold (S - 1) x jb x NT x 16 bytes.
__device__ __forceinline__ float sum_bits(float a) { return a; }
__device__ __forceinline__ float sum_bits(int a) { return __int_as_float(a); }
__device__ __forceinline__ void add_bits(float& a, float b) { a += b; }
__device__ __forceinline__ void add_bits(int& a, float b) { a += __float_as_int(b); }
template <int NJ, int NT, typename T>
__device__ __forceinline__ void cluster_band_reduce(T* v, u32 buf, int tid, int jb) {
  const int S = cluster_nctarank(), r = cluster_ctarank(), jlo = r * jb;
  cluster_sync();
  for (int o = 0; o < S; ++o) {
    if (o == r) continue;
    const u32 dst = mapa_cluster(buf, o) + ((r < o ? r : r - 1) * jb * NT + tid) * 16;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      if (j >= o * jb && j < o * jb + jb)
        st_cluster_v4(dst + (j - o * jb) * NT * 16, sum_bits(v[4 * j]), sum_bits(v[4 * j + 1]),
                      sum_bits(v[4 * j + 2]), sum_bits(v[4 * j + 3]));
  }
  cluster_sync();  // every band has landed
  for (int q = 0; q < S - 1; ++q) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      if (j >= jlo && j < jlo + jb) {
        const float4 w = ld_shared_v4(buf + ((q * jb + j - jlo) * NT + tid) * 16);
        add_bits(v[4 * j], w.x), add_bits(v[4 * j + 1], w.y), add_bits(v[4 * j + 2], w.z);
        add_bits(v[4 * j + 3], w.w);
      }
  }
}
// {lo, hi} rounded to the 16-bit output type ACT (0 fp16, 1 bf16), lo in the low half: one cvt for two values
template <int ACT>
__device__ __forceinline__ u32 pack_out16x2(float lo, float hi) {
  if (ACT != 0) return f32_to_bf2(lo, hi);
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// a 16-bit pair clamped to [lo2, hi2] per half; NaN propagates (as torch.clamp), one instruction per bound
template <int ACT>
__device__ __forceinline__ u32 clamp_out16x2(u32 v, u32 lo2, u32 hi2) {
  if (ACT == 0) {
    asm("max.NaN.f16x2 %0, %0, %1;" : "+r"(v) : "r"(lo2));
    asm("min.NaN.f16x2 %0, %0, %1;" : "+r"(v) : "r"(hi2));
  } else {
    asm("max.NaN.bf16x2 %0, %0, %1;" : "+r"(v) : "r"(lo2));
    asm("min.NaN.bf16x2 %0, %0, %1;" : "+r"(v) : "r"(hi2));
  }
  return v;
}
// cp.async writes through the generic proxy, wgmma reads shared memory through the async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// mbarrier + TMA (sm_90)
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{ .reg .pred p; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT_%=; }" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_2d(u32 dst, const void* tmap, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// im2col TMA of a 4-D channels_last tensor (c, w, h, n): the box's pixels start at input pixel (w, h, n) -- the filter's
// top-left corner for the first output pixel, padding included -- and walk the map's bounding box at the conv stride;
// (ow, oh) is the filter tap's offset (kw, kh) x dilation. Pixels outside the tensor (padding) read as zeros.
__device__ __forceinline__ void tma_im2col_4d(u32 dst, const void* tmap, int c, int w, int h, int n, u16 ow, u16 oh,
                                              u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6], {%7, %8};" ::"r"(dst),
      "l"(tmap), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(ow), "h"(oh)
      : "memory");
}
// The same box multicast to the CTAs of the cluster in cta_mask: each gets it at the same shared-memory offset dst and
// its own mbarrier at offset bar receives the bytes (the issuing CTA's too, when its bit is set).
__device__ __forceinline__ void tma_2d_multicast(u32 dst, const void* tmap, int c0, int c1, u32 bar, u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// one arrival on the mbarrier at shared::cluster address bar (mapa_cluster: any CTA of the cluster, this one included),
// with the default .release.cta semantics, as CUTLASS's consumer release: .release.cluster puts a cluster-scope fence
// in front of every arrival (measured: the int8 GEMM's MC 2 build ran 1.9x slower with it, H100)
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// TMA store of a 2-D box from shared memory (the tensor map's swizzle applies); out-of-range parts of the box are
// dropped. The smem must stay untouched until tma_store_wait_read() returns.
__device__ __forceinline__ void tma_store_2d(const void* tmap, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(tmap), "r"(src),
               "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Four 8 x 8 b16 matrices, each stored transposed: memory row k of matrix i (address from lane 8 i + k) gets column k
// of the fragment whose row g, columns 2t, 2t + 1 are register r[i] of lane 4 g + t (the mma / wgmma C layout).
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// The first two of them (lanes 0-15 give the addresses): one 8-row block of the C layout, both column halves.
__device__ __forceinline__ void stmatrix_x2_trans(u32 addr, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// The TMA-store epilogue's staging (WG_TSTORE / A8_TSTORE): warp wq of a warpgroup writes 8-row blocks [jlo, jhi)
// (jlo even) of its 16-row C-layout tile, transposed into stg: [rows][64 columns] x 2 bytes, 128-byte swizzle, block
// jlo at row 0 -- the box a TMA store writes out. block(j) returns block j's two 16-bit pairs, column half h = 0 / 1
// (values 4 j + 2 h and 4 j + 2 h + 1). BM8 = the accumulator's 8-row blocks; an odd last block goes through
// stmatrix .x2.
template <int BM8, class Block>
__device__ __forceinline__ void stage_out_tile(u32 stg, int wq, int lane, int jlo, int jhi, Block block) {
  // lane l addresses row l % 8 of matrix l / 8 = (row block j + l / 16, column half (l / 8) % 2)
  const int mi = lane >> 3, r8 = lane & 7, chunk = 2 * wq + (mi & 1);
#pragma unroll
  for (int j = 0; j < BM8; j += 2) {
    if (j < jlo || j >= jhi) continue;
    const int row = 8 * (j - jlo + (mi >> 1)) + r8;
    const u32 dst = stg + row * 128 + ((chunk ^ (row & 7)) << 4);
    const uint2 a = block(j);
    if (j + 1 < BM8) {
      const uint2 b = block(j + 1);
      stmatrix_x4_trans(dst, a.x, a.y, b.x, b.y);
    } else {  // lanes 0-15 address the block's two column halves
      stmatrix_x2_trans(dst, a.x, a.y);
    }
  }
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// pins register values at this point of the program (the compiler must not move their uses across)
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int S, int I>
__device__ __forceinline__ void fence_regs(u32 (&a)[S][I]) {
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int i = 0; i < I; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
}

// Shared-memory matrix descriptor of a K-major B tile with 128-byte swizzle: rows of 64 k (128 bytes), row r's
// 16-byte chunk c stored at chunk c ^ (r % 8); 8-row groups 1024 bytes apart (stride byte offset); the leading
// byte offset is unused for swizzled K-major layouts. k16 step s starts 32 s bytes into the row.
__device__ __forceinline__ u64 desc_sw128(u32 addr) {
  return (u64)((addr >> 4) & 0x3FFFu) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// The dynamic shared memory rounded up to 1024 bytes (swizzle atoms need that alignment; the host adds the slack):
// its shared-space address, and the generic pointer to it in gen.
__device__ __forceinline__ u32 smem_base_1024(char* raw_ptr, const char*& gen) {
  const u32 raw = smem_addr(raw_ptr);
  const u32 base = (raw + 1023u) & ~1023u;
  gen = raw_ptr + (base - raw);
  return base;
}

// Grouped raster of the output tiles: group_m consecutive m-tiles walk the n-tiles together, so their activations
// stay in L2 while each weight tile is read from HBM once per group instead of once per m-tile. Returns (first
// activation row, first 16-row weight tile) of output tile `tile`; per_group = group_m x the n-tiles.
__device__ __forceinline__ int2 raster_tile(int tile, int tiles_m, int per_group, int group_m, int bm, int warps) {
  const int first_m = (tile / per_group) * group_m, gm = min(tiles_m - first_m, group_m);
  return int2{(first_m + (tile % per_group) % gm) * bm, (tile % per_group) / gm * warps};
}

// a CUtensorMap (opaque 128 bytes, 64-byte aligned), passed by value as a __grid_constant__ kernel parameter
struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

}  // namespace mgw
