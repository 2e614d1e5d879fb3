// The grouped experts GEMM's tile table (gemm_wgmma.cu WG_GROUPED) from a routing sorted by expert, in one launch of
// one block: entry i = {expert, first row, end row, 0} for each BM-row tile of each expert's run of rows, then
// {-1, 0, 0, 0} up to `entries` (the launch's grid, an upper bound). Why a kernel: the same table from torch ops took
// ~25 small launches (~70 us of a CUDA graph, more eager), more than the GEMM itself at decode-like token counts.
// Each expert's run is found by binary search in the sorted ids (ids >= E, expert parallelism's sentinels, sort last
// and fall in no run); one thread adds up the experts' tile counts (E is at most a few hundred).
#include "gemv_common.cuh"

__device__ __forceinline__ int lower_bound(const long long* __restrict__ v, int n, long long key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (v[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

extern "C" __global__ void __launch_bounds__(1024)
mixgemm_expert_tiles(const long long* __restrict__ route,  // [S] expert ids, ascending
                     int S, int E, int bm, int entries,
                     int4* __restrict__ tab) {            // [entries]
  extern __shared__ int sh[];                             // first row [E], end row [E], first entry [E + 1]
  int* first = sh;
  int* end = sh + E;
  int* start = sh + 2 * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    first[e] = lower_bound(route, S, e);
    end[e] = lower_bound(route, S, e + 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int e = 0; e < E; ++e) {
      start[e] = acc;
      acc += (end[e] - first[e] + bm - 1) / bm;
    }
    start[E] = acc;
  }
  __syncthreads();
  const int used = start[E];
  for (int i = threadIdx.x; i < entries; i += blockDim.x) {
    int4 v = make_int4(-1, 0, 0, 0);
    if (i < used) {
      int lo = 0, hi = E;  // the last expert whose first entry is <= i (experts of no tile share their next's)
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (start[mid] <= i) lo = mid;
        else hi = mid;
      }
      v = make_int4(lo, first[lo] + (i - start[lo]) * bm, end[lo], 0);
    }
    tab[i] = v;
  }
}
