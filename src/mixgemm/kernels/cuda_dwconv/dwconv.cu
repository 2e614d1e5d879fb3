// Depthwise conv2d with per-channel int8 / int4 weights on fp16 / bf16 channels_last activations: a direct
// convolution on the CUDA cores (dwconv.py is the host side; mixgemm.ops.conv dispatches to it).
//
// Why not the Triton kernel (kernels/triton_dwconv/dwconv.py, _dwconv_kernel): it loads, converts and multiplies one
// [pixels, channels] tile per tap, i.e. 49 loads and 49 fp16 -> fp32 conversions per output of a 7x7, and it took
// 124 us / 36 us for ConvNeXt's 7x7 96 @ 56 / 384 @ 14 at batch 32 on the H200 against cuDNN's 71 / 23 us
// (0.57x / 0.64x; its tile sweeps found nothing faster).
// Here each input value is loaded and converted once per kernel row and feeds every output of the thread's run
// that uses it (a sliding window unrolled at compile time), the weights are dequantized once per block into
// shared memory, and the sums stay in fp32. Measured (H200): 62.9 / 21.1 us at
// batch 32 (1.12x / 1.10x cuDNN), 6.8 / 5.9 us at batch 1 (2.2x / 2.0x).
//
// Thread = 2 adjacent channels (one 32-bit fp16x2 / bf16x2 load: a warp reads 64 contiguous channels) x DW_TW
// consecutive output pixels of one output row. Block = 128 threads = (DW_CB / 2 channel pairs) x (segments).
// grid.y: blocks of DW_CB channels; grid.x: blocks that walk the runs of DW_TW output pixels (batch, row, column) with a
// grid stride.
//
// Compile-time: DW_KH, DW_KW (kernel), DW_SW, DW_DW (stride and dilation along W, which shape the window),
// DW_TW, DW_CB, DW_ACT (0 fp16, 1 bf16), DW_BITS (4, 8), DW_AFFINE (0: w = (q - z) * s, 1: w = q * s + m).
// Run time: the rest of the geometry (stride / dilation / padding along H, padding along W), strides in elements.
#include "gemv_common.cuh"

#ifndef DW_KH
#define DW_KH 7
#endif
#ifndef DW_KW
#define DW_KW 7
#endif
#ifndef DW_SW
#define DW_SW 1
#endif
#ifndef DW_DW
#define DW_DW 1
#endif
#ifndef DW_TW
#define DW_TW 8
#endif
#ifndef DW_CB
#define DW_CB 64
#endif
#ifndef DW_ACT
#define DW_ACT 0
#endif
#ifndef DW_BITS
#define DW_BITS 8
#endif
#ifndef DW_AFFINE
#define DW_AFFINE 0
#endif

constexpr int THREADS = 128;
constexpr int KH = DW_KH, KW = DW_KW, SW = DW_SW, DWD = DW_DW, TW = DW_TW, CB = DW_CB;
constexpr int CT = CB / 2;          // threads along the channels
constexpr int ST = THREADS / CT;    // output runs per block
constexpr int SPAN = (TW - 1) * SW + (KW - 1) * DWD + 1;  // input pixels of one kernel row a run reads
static_assert(CB >= 2 && CB <= 2 * THREADS && THREADS % CT == 0, "DW_CB: an even divisor of 256");
static_assert(KH * KW * CB * 4 <= 48 * 1024, "weights of one channel block must fit 48 KB of shared memory");

struct f2 {
  float x, y;
};

// two activations (one 32-bit word) -> fp32: fp16 by cvt, bf16 by moving its bits into the high half
__device__ __forceinline__ f2 to_f2(u32 v) {
  f2 r;
#if DW_ACT == 0
  asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;}"
      : "=f"(r.x), "=f"(r.y) : "r"(v));
#else
  r.x = mg::as_f32(v << 16);
  r.y = mg::as_f32(v & 0xffff0000u);
#endif
  return r;
}

__device__ __forceinline__ u32 from_f2(float lo, float hi) {  // rounded to nearest, lo in the low half
  u32 r;
#if DW_ACT == 0
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ float bias_at(const void* bias, int kind, int c) {
  if (kind == 3) return static_cast<const float*>(bias)[c];
  const u16 h = static_cast<const u16*>(bias)[c];
  if (kind == 2) return mg::as_f32(static_cast<u32>(h) << 16);
  float f;
  asm("{.reg .b16 t;\n\tmov.b16 t, %1;\n\tcvt.f32.f16 %0, t;}" : "=f"(f) : "h"(h));
  return f;
}

extern "C" __global__ void __launch_bounds__(THREADS) mixgemm_dwconv(
    const u32* __restrict__ x, const unsigned char* __restrict__ wq, int wrow, const float* __restrict__ scale,
    const float* __restrict__ shift, u32* __restrict__ out, int C, int H, int W, int HO, int WO, int SH, int DH,
    int PH, int PW, int runs_w, int runs, const void* bias, int bias_kind, float lo, float hi) {
  // x and out are channels_last-contiguous (dwconv.py checks it): pixel p's channel pair c / 2 is word p * C / 2 + c / 2
  // weights of this block's channels, dequantized once per block: [tap][channel] in fp32 ((q - z) exact, times s)
  __shared__ float wsm[KH * KW * CB];
  const int c0 = blockIdx.y * CB;
  for (int i = threadIdx.x; i < KH * KW * CB; i += THREADS) {
    const int tap = i / CB, ch = c0 + i % CB;
    float w = 0.f;
    if (ch < C) {
#if DW_BITS == 8
      const float q = static_cast<float>(wq[static_cast<long long>(ch) * wrow + tap]);
#else
      const float q = static_cast<float>((wq[static_cast<long long>(ch) * wrow + tap / 2] >> (4 * (tap & 1))) & 15);
#endif
#if DW_AFFINE
      w = fmaf(q, scale[ch], shift[ch]);
#else
      w = (q - shift[ch]) * scale[ch];
#endif
    }
    wsm[i] = w;
  }
  __syncthreads();

  const int cl = threadIdx.x % CT;
  const int c = c0 + 2 * cl;
  if (c >= C) return;
  const int C2 = C / 2;  // words per pixel
  float b0 = 0.f, b1 = 0.f;
  if (bias_kind) {
    b0 = bias_at(bias, bias_kind, c);
    b1 = bias_at(bias, bias_kind, c + 1);
  }
  // the block's runs: a grid-stride loop, so that each block's weight prologue serves several runs
  for (int run = blockIdx.x * ST + threadIdx.x / CT; run < runs; run += gridDim.x * ST) {
    const int rw = run % runs_w, t = run / runs_w;
    const int oh = t % HO, b = t / HO;
    const int ow0 = rw * TW;
    const int iw0 = ow0 * SW - PW;

    f2 acc[TW];
#pragma unroll
    for (int i = 0; i < TW; ++i) acc[i] = f2{0.f, 0.f};

    for (int kh = 0; kh < KH; ++kh) {
      const int ih = oh * SH - PH + kh * DH;
      if (static_cast<unsigned>(ih) >= static_cast<unsigned>(H)) continue;  // zero padding: the row adds nothing
      // word offsets of this input row stay below 2^31 per image row; the image base is 64-bit
      const u32* xr = x + (static_cast<long long>(b) * H + ih) * W * C2 + (c >> 1);
      f2 wr[KW];
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        wr[kw].x = wsm[(kh * KW + kw) * CB + 2 * cl];
        wr[kw].y = wsm[(kh * KW + kw) * CB + 2 * cl + 1];
      }
      // the row's SPAN input pixels: all loads first (independent, in flight together), then the window
      u32 v[SPAN];
#pragma unroll
      for (int j = 0; j < SPAN; ++j) {
        const int iw = iw0 + j;
        v[j] = static_cast<unsigned>(iw) < static_cast<unsigned>(W) ? xr[iw * C2] : 0u;
      }
#pragma unroll
      for (int j = 0; j < SPAN; ++j) {
        const f2 f = to_f2(v[j]);
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const int d = j - kw * DWD;  // input pixel j is tap kw of output d / SW (compile-time after unrolling)
          if (d >= 0 && d % SW == 0 && d / SW < TW) {
            acc[d / SW].x = fmaf(f.x, wr[kw].x, acc[d / SW].x);
            acc[d / SW].y = fmaf(f.y, wr[kw].y, acc[d / SW].y);
          }
        }
      }
    }

    u32* ob = out + (static_cast<long long>(b) * HO + oh) * WO * C2 + (c >> 1);
#pragma unroll
    for (int i = 0; i < TW; ++i) {
      const int ow = ow0 + i;
      if (ow < WO) {
        const float y0 = fminf(fmaxf(acc[i].x + b0, lo), hi);
        const float y1 = fminf(fmaxf(acc[i].y + b1, lo), hi);
        ob[ow * C2] = from_f2(y0, y1);
      }
    }
  }
}
