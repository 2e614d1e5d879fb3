// One element type of 16 or 32 bits picked at compile time (ELEM_ES bytes: 2 or 4; with 2, ELEM_BF16 1 bfloat16,
// 0 float16), its fp32 conversions (rounding to nearest even), and the 16-byte piece the row kernels move at a time.
// The includer defines ELEM_ES and ELEM_BF16 first (from its own macros).
#pragma once
#include "gemv_common.cuh"

#if ELEM_ES == 4
typedef float elem_t;
__device__ __forceinline__ float to_f(elem_t v) { return v; }
__device__ __forceinline__ elem_t from_f(float f) { return f; }
#else
typedef u16 elem_t;
__device__ __forceinline__ float to_f(elem_t v) {
#if ELEM_BF16
  return mg::bf_to_f32(v);
#else
  return mg::h_to_f32(v);
#endif
}
__device__ __forceinline__ elem_t from_f(float f) {
  u16 h;
#if ELEM_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
  return h;
}
#endif

constexpr int PER = 16 / ELEM_ES;  // elements per 16-byte piece

union Piece {
  uint4 v;
  elem_t e[PER];
};
