"""Measured tile choices for the implicit-GEMM conv kernels, per GPU: no run-time autotuning.

``lookup`` returns the fastest entry of the device sweep (tools/checks/conv_gpu_check.py) for a layer's bucket, or
None (then triton_conv_igemm.igemm.pick_config's heuristic decides). The tables below are written with the key of the
layer each entry was measured on (``conv_key(...)`` = "w{bits}{pc|g<group>}|{kh}x{kw}/{stride}|{ci_g}-{co_g}|M{m}",
M the power of two >= B*Ho*Wo; the sweeps print entries in that form), but lookups go by bucket (``bucket_of``): the
channel counts become their half-octave classes (mixgemm.tuning.buckets.half_octave, about +-19% around the measured
count: 256 channels -> class 16 covers 220..310), so a layer of any channel count near a measured one, at a batch
that lands in the same M bucket (e.g. 24..32 at a given spatial size), reuses the measured config. Weight format,
kernel size and stride are categories and stay exact. The measured keys of one table fall into distinct buckets
(checked on import; ResNet-50's channel counts are powers of two, each its own class).
Value: (path, config) where path is "igemm" or "matmul" (1x1 convs: the shared Triton GEMM), config a
tuple (block_m, block_n, block_k, split_k, num_warps, num_stages, swap_ab) for "igemm", None for "matmul". The
"matmul" rows are the sweep's record only: conv_as_matmul races each 1x1 layer instead (mixgemm.kernels.race), and
an "igemm" row only gives the Triton implicit GEMM its tile.
Only GPUs whose name contains a table's key use it (an H100 table is not applied to other GPUs).
"""

from __future__ import annotations

from mixgemm.tuning.buckets import half_octave, pow2_at_least

# NVIDIA H200 (132 SMs), torch 2.11 / triton 3.6. Source: tools/checks/conv_gpu_check.sh (after the K-loop rewrite),
# protocol graph timing; per layer of mixgemm.bench.conv.CONV_PRESET at batch 1 and 32, the fastest correct variant
# of the sweep (comment: its time, and the time of what the run's dispatch picked).
_H200: dict[str, tuple] = {
    # r50.s3 1x1 1024-256 @14 b1: 9.01 us (the run's dispatch: 10.60)
    "w4g128|1x1/1|1024-256|M256": ("igemm", (64, 64, 64, 4, 4, 4, True)),
    # r50.s3 1x1 1024-256 @14 b32: 18.33 us (the run's dispatch: 21.19)
    "w4g128|1x1/1|1024-256|M8192": ("igemm", (128, 64, 64, 1, 4, 4, False)),
    # r50.s4 1x1 2048-512 @7 b32: 22.47 us (the run's dispatch: 24.47)
    "w4g128|1x1/1|2048-512|M2048": ("igemm", (128, 128, 64, 2, 8, 3, False)),
    # r50.s4 1x1 2048-512 @7 b1: 10.90 us (the run's dispatch: 11.65)
    "w4g128|1x1/1|2048-512|M64": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s3 1x1 256-1024 @14 b1: 4.42 us (the run's dispatch: 4.44)
    "w4g128|1x1/1|256-1024|M256": ("igemm", (64, 64, 128, 1, 4, 3, True)),
    # r50.s3 1x1 256-1024 @14 b32: 16.41 us (the run's dispatch: 16.41)
    "w4g128|1x1/1|256-1024|M8192": ("matmul", None),
    # r50.s1 1x1 256-64 @56 b32: 26.52 us (the run's dispatch: 28.31)
    "w4g128|1x1/1|256-64|M131072": ("igemm", (128, 64, 64, 1, 8, 3, False)),
    # r50.s1 1x1 256-64 @56 b1: 6.60 us (the run's dispatch: 6.60)
    "w4g128|1x1/1|256-64|M4096": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b32: 15.82 us (the run's dispatch: 15.84)
    "w4g128|1x1/1|512-2048|M2048": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b1: 7.16 us (the run's dispatch: 8.07)
    "w4g128|1x1/1|512-2048|M64": ("igemm", (64, 64, 64, 1, 4, 4, True)),
    # r50.s2 1x1/2 256-512 @56 (down) b1: 6.05 us (the run's dispatch: 6.05)
    "w4g128|1x1/2|256-512|M1024": ("igemm", (64, 128, 64, 1, 4, 3, False)),
    # r50.s2 1x1/2 256-512 @56 (down) b32: 33.33 us (the run's dispatch: 33.33)
    "w4g128|1x1/2|256-512|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b1: 10.75 us (the run's dispatch: 10.75)
    "w4g128|3x3/1|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b32: 31.47 us (the run's dispatch: 33.07)
    "w4g128|3x3/1|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s3 3x3 256-256 @14 b1: 12.05 us (the run's dispatch: 13.08)
    "w4g128|3x3/1|256-256|M256": ("igemm", (64, 64, 64, 4, 4, 4, True)),
    # r50.s3 3x3 256-256 @14 b32: 36.29 us (the run's dispatch: 48.39)
    "w4g128|3x3/1|256-256|M8192": ("igemm", (128, 64, 64, 1, 4, 4, False)),
    # r50.s4 3x3 512-512 @7 b32: 37.93 us (the run's dispatch: 44.28)
    "w4g128|3x3/1|512-512|M2048": ("igemm", (128, 128, 64, 4, 8, 3, False)),
    # r50.s4 3x3 512-512 @7 b1: 12.83 us (the run's dispatch: 12.83)
    "w4g128|3x3/1|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 3, True)),
    # r50.s2 3x3/2 128-128 @56 b1: 10.90 us (the run's dispatch: 10.90)
    "w4g128|3x3/2|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b32: 32.17 us (the run's dispatch: 34.04)
    "w4g128|3x3/2|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s3 3x3/2 256-256 @28 b1: 12.12 us (the run's dispatch: 13.04)
    "w4g128|3x3/2|256-256|M256": ("igemm", (64, 64, 64, 4, 4, 4, True)),
    # r50.s3 3x3/2 256-256 @28 b32: 36.21 us (the run's dispatch: 48.61)
    "w4g128|3x3/2|256-256|M8192": ("igemm", (128, 64, 64, 1, 4, 4, False)),
    # r50.s4 3x3/2 512-512 @14 b32: 38.09 us (the run's dispatch: 44.49)
    "w4g128|3x3/2|512-512|M2048": ("igemm", (128, 128, 64, 4, 8, 3, False)),
    # r50.s4 3x3/2 512-512 @14 b1: 12.70 us (the run's dispatch: 12.70)
    "w4g128|3x3/2|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 3, True)),
    # r50.s1 3x3 64-64 @56 b32: 35.56 us (the run's dispatch: 38.06)
    "w4g64|3x3/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 4, True)),
    # r50.s1 3x3 64-64 @56 b1: 7.53 us (the run's dispatch: 7.53)
    "w4g64|3x3/1|64-64|M4096": ("igemm", (64, 64, 64, 2, 4, 3, False)),
    # r50.s2 1x1 128-512 @28 b1: 5.00 us (the run's dispatch: 5.00)
    "w4pc|1x1/1|128-512|M1024": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b32: 20.18 us (the run's dispatch: 20.18)
    "w4pc|1x1/1|128-512|M32768": ("matmul", None),
    # r50.s1 1x1 64-256 @56 b32: 37.45 us (the run's dispatch: 37.56)
    "w4pc|1x1/1|64-256|M131072": ("matmul", None),
    # r50.s1 1x1 64-256 @56 b1: 4.86 us (the run's dispatch: 4.86)
    "w4pc|1x1/1|64-256|M4096": ("matmul", None),
    # r50.s1 1x1 64-64 @56 b32: 13.58 us (the run's dispatch: 13.58)
    "w4pc|1x1/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-64 @56 b1: 4.49 us (the run's dispatch: 4.49)
    "w4pc|1x1/1|64-64|M4096": ("matmul", None),
    # r50.s3 1x1 1024-256 @14 b1: 7.70 us (the run's dispatch: 9.23)
    "w8pc|1x1/1|1024-256|M256": ("igemm", (64, 64, 64, 1, 4, 4, True)),
    # r50.s3 1x1 1024-256 @14 b32: 14.21 us (the run's dispatch: 14.25)
    "w8pc|1x1/1|1024-256|M8192": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b1: 4.85 us (the run's dispatch: 4.85)
    "w8pc|1x1/1|128-512|M1024": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b32: 23.98 us (the run's dispatch: 25.36)
    "w8pc|1x1/1|128-512|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s4 1x1 2048-512 @7 b32: 21.39 us (the run's dispatch: 22.71)
    "w8pc|1x1/1|2048-512|M2048": ("igemm", (64, 64, 64, 1, 4, 4, False)),
    # r50.s4 1x1 2048-512 @7 b1: 9.01 us (the run's dispatch: 9.01)
    "w8pc|1x1/1|2048-512|M64": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s3 1x1 256-1024 @14 b1: 3.94 us (the run's dispatch: 4.49)
    "w8pc|1x1/1|256-1024|M256": ("igemm", (64, 64, 64, 1, 4, 4, True)),
    # r50.s3 1x1 256-1024 @14 b32: 16.76 us (the run's dispatch: 16.78)
    "w8pc|1x1/1|256-1024|M8192": ("matmul", None),
    # r50.s1 1x1 256-64 @56 b32: 25.90 us (the run's dispatch: 26.03)
    "w8pc|1x1/1|256-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 256-64 @56 b1: 5.89 us (the run's dispatch: 5.89)
    "w8pc|1x1/1|256-64|M4096": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b32: 15.39 us (the run's dispatch: 15.70)
    "w8pc|1x1/1|512-2048|M2048": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s4 1x1 512-2048 @7 b1: 5.22 us (the run's dispatch: 5.96)
    "w8pc|1x1/1|512-2048|M64": ("igemm", (64, 64, 64, 1, 4, 4, True)),
    # r50.s1 1x1 64-256 @56 b32: 40.03 us (the run's dispatch: 40.27)
    "w8pc|1x1/1|64-256|M131072": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-256 @56 b1: 4.84 us (the run's dispatch: 4.84)
    "w8pc|1x1/1|64-256|M4096": ("matmul", None),
    # r50.s1 1x1 64-64 @56 b32: 13.40 us (the run's dispatch: 13.55)
    "w8pc|1x1/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-64 @56 b1: 4.45 us (the run's dispatch: 4.45)
    "w8pc|1x1/1|64-64|M4096": ("matmul", None),
    # r50.s2 1x1/2 256-512 @56 (down) b1: 5.84 us (the run's dispatch: 5.84)
    "w8pc|1x1/2|256-512|M1024": ("igemm", (64, 128, 64, 1, 4, 3, False)),
    # r50.s2 1x1/2 256-512 @56 (down) b32: 32.33 us (the run's dispatch: 35.13)
    "w8pc|1x1/2|256-512|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b1: 10.40 us (the run's dispatch: 10.40)
    "w8pc|3x3/1|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b32: 27.56 us (the run's dispatch: 28.60)
    "w8pc|3x3/1|128-128|M32768": ("igemm", (64, 128, 64, 1, 4, 4, False)),
    # r50.s3 3x3 256-256 @14 b1: 9.60 us (the run's dispatch: 10.87)
    "w8pc|3x3/1|256-256|M256": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s3 3x3 256-256 @14 b32: 26.12 us (the run's dispatch: 37.56)
    "w8pc|3x3/1|256-256|M8192": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s4 3x3 512-512 @7 b32: 38.72 us (the run's dispatch: 38.72)
    "w8pc|3x3/1|512-512|M2048": ("igemm", (128, 128, 64, 2, 8, 3, False)),
    # r50.s4 3x3 512-512 @7 b1: 11.66 us (the run's dispatch: 12.29)
    "w8pc|3x3/1|512-512|M64": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s1 3x3 64-64 @56 b32: 33.16 us (the run's dispatch: 33.67)
    "w8pc|3x3/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 3x3 64-64 @56 b1: 7.04 us (the run's dispatch: 7.04)
    "w8pc|3x3/1|64-64|M4096": ("igemm", (64, 64, 64, 2, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b1: 10.51 us (the run's dispatch: 10.51)
    "w8pc|3x3/2|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b32: 28.34 us (the run's dispatch: 29.11)
    "w8pc|3x3/2|128-128|M32768": ("igemm", (64, 128, 64, 1, 4, 4, False)),
    # r50.s3 3x3/2 256-256 @28 b1: 9.60 us (the run's dispatch: 10.93)
    "w8pc|3x3/2|256-256|M256": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s3 3x3/2 256-256 @28 b32: 26.77 us (the run's dispatch: 38.02)
    "w8pc|3x3/2|256-256|M8192": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s4 3x3/2 512-512 @14 b32: 40.10 us (the run's dispatch: 40.11)
    "w8pc|3x3/2|512-512|M2048": ("igemm", (128, 128, 64, 2, 8, 3, False)),
    # r50.s4 3x3/2 512-512 @14 b1: 11.67 us (the run's dispatch: 12.32)
    "w8pc|3x3/2|512-512|M64": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.stem 7x7/2 3-64 @224 b1: 20.82 us (the run's dispatch: 20.82)
    "w8pc|7x7/2|3-64|M16384": ("igemm", (128, 64, 32, 1, 4, 4, False)),
    # r50.stem 7x7/2 3-64 @224 b32: 278.35 us (the run's dispatch: 278.35)
    "w8pc|7x7/2|3-64|M524288": ("igemm", (128, 64, 32, 1, 4, 4, False)),
}

TABLES: dict[str, dict[str, tuple]] = {"h200": _H200}

# The Hopper wgmma implicit GEMM (cuda_conv_wgmma/conv_wgmma.py), same keys. Value: the fastest wgmma tile of the
# sweeps (source: tools/bench/conv_wgmma.py, three device runs) when it beat
# what the table above picks (the Triton implicit GEMM or the 1x1 matmul) in the same run, else None (measured and
# slower: the table above decides). A layer missing here takes the wgmma path with conv_wgmma.default_conv_config.
# The batch-32 1x1 layers were re-swept with the TMA-store epilogue (WG_TSTORE; CONV_SWEEP=all; "TMA-store tile" in
# the comments): every one of them runs faster on the wgmma path. The batch-32 layers were re-swept with persistent
# whole tiles (CONV_SWEEP=persist; "SK 2" in the comments); the four entries where they won by more than 1.5% take
# them. Entries marked "wave" won by more than 1.5% in CONV_SWEEP=wave (BM any multiple of 8, sized so the CTAs
# fill whole waves of the 132 SMs) or CONV_SWEEP=custom (BM 104 KT 4 cluster split-K for the W4 stage-4 3x3s).
# Entries marked "custom": CONV_SWEEP=custom with the H100's winners (TMA-store bands for BM % 16 == 8, the
# producer warp, batch-1 8-slice clusters).
_H200_WGMMA: dict[str, dict | None] = {
    # r50.s1 1x1 256-64 @56 b1: wgmma 4.9 us, Triton / matmul 10.0 us, cuDNN 4.7 us
    "w4g128|1x1/1|256-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s1 1x1 256-64 @56 b1: wgmma 5.4 us, Triton / matmul 10.7 us, cuDNN 4.7 us
    "w8pc|1x1/1|256-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 64-256 @56 b1: wgmma 4.7 us, Triton / matmul 9.8 us, cuDNN 3.4 us
    "w4pc|1x1/1|64-256|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 64-256 @56 b1: wgmma 4.7 us, Triton / matmul 9.8 us, cuDNN 3.4 us
    "w8pc|1x1/1|64-256|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 64-64 @56 b1: wgmma 4.4 us, Triton / matmul 8.9 us, cuDNN 4.0 us
    "w4pc|1x1/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 64-64 @56 b1: wgmma 4.4 us, Triton / matmul 8.9 us, cuDNN 4.0 us
    "w8pc|1x1/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 3x3 64-64 @56 b1: wgmma 7.0 us, Triton / matmul 7.5 us, cuDNN 6.1 us
    "w4g64|3x3/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s1 3x3 64-64 @56 b1: wgmma 6.9 us, Triton / matmul 7.0 us, cuDNN 6.1 us
    "w8pc|3x3/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1 128-512 @28 b1: wgmma 4.6 us, Triton / matmul 10.1 us, cuDNN 3.9 us
    "w4pc|1x1/1|128-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4},
    # r50.s2 1x1 128-512 @28 b1: wgmma 4.6 us, Triton / matmul 10.0 us, cuDNN 3.9 us
    "w8pc|1x1/1|128-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b1: wgmma 5.0 us, Triton / matmul 6.1 us, cuDNN 5.2 us
    "w4g128|1x1/2|256-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b1: wgmma 5.5 us, Triton / matmul 5.8 us, cuDNN 5.2 us
    "w8pc|1x1/2|256-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 3x3 128-128 @28 b1: wgmma 8.5 us, Triton / matmul 10.8 us, cuDNN 7.8 us
    "w4g128|3x3/1|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s2 3x3 128-128 @28 b1: wgmma 8.7 us, Triton / matmul 10.4 us, cuDNN 7.8 us
    "w8pc|3x3/1|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s2 3x3/2 128-128 @56 b1: wgmma 8.6 us, Triton / matmul 10.8 us, cuDNN 7.9 us
    "w4g128|3x3/2|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s2 3x3/2 128-128 @56 b1: wgmma 8.7 us, Triton / matmul 10.4 us, cuDNN 7.9 us
    "w8pc|3x3/2|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s3 1x1 1024-256 @14 b1: wgmma 4.3 us (8 K slices as a cluster; was 7.7), cuDNN 4.4 us; custom
    "w4g128|1x1/1|1024-256|M256": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 1024-256 @14 b1: wgmma 3.9 us (8 K slices as a cluster; was 7.4), cuDNN 4.4 us; custom
    "w8pc|1x1/1|1024-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 256-1024 @14 b1: wgmma 4.8 us, Triton / matmul 4.4 us, cuDNN 5.1 us
    "w4g128|1x1/1|256-1024|M256": None,
    # r50.s3 1x1 256-1024 @14 b1: wgmma 5.3 us, Triton / matmul 3.9 us, cuDNN 5.1 us
    "w8pc|1x1/1|256-1024|M256": None,
    # r50.s3 3x3 256-256 @14 b1: wgmma 5.7 us (8 K slices as a cluster; was 10.2), cuDNN 8.6 us; custom
    "w4g128|3x3/1|256-256|M256": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 3x3 256-256 @14 b1: wgmma 5.0 us (8 K slices as a cluster; was 9.7), cuDNN 8.6 us; custom
    "w8pc|3x3/1|256-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s3 3x3/2 256-256 @28 b1: wgmma 5.7 us (8 K slices as a cluster; was 10.3), cuDNN 8.5 us; custom
    "w4g128|3x3/2|256-256|M256": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 3x3/2 256-256 @28 b1: wgmma 5.0 us (8 K slices as a cluster; was 9.7), cuDNN 8.5 us; custom
    "w8pc|3x3/2|256-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s4 1x1 2048-512 @7 b1: wgmma 4.8 us (8 K slices as a cluster; was 8.9), cuDNN 5.8 us; custom
    "w4g128|1x1/1|2048-512|M64": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s4 1x1 2048-512 @7 b1: wgmma 4.4 us (8 K slices as a cluster; was 9.1), cuDNN 5.8 us; custom
    "w8pc|1x1/1|2048-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s4 1x1 512-2048 @7 b1: wgmma 6.6 us, Triton / matmul 7.2 us, cuDNN 5.3 us
    "w4g128|1x1/1|512-2048|M64": {"BM": 64, "NWG": 1, "STAGES": 4},
    # r50.s4 1x1 512-2048 @7 b1: wgmma 6.8 us, Triton / matmul 5.2 us, cuDNN 5.3 us
    "w8pc|1x1/1|512-2048|M64": None,
    # r50.s4 3x3 512-512 @7 b1: wgmma 6.6 us (8 K slices as a cluster; was 12.7), cuDNN 12.1 us; custom
    "w4g128|3x3/1|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3 512-512 @7 b1: wgmma 5.8 us (8 K slices as a cluster; was 10.6), cuDNN 12.1 us; custom
    "w8pc|3x3/1|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b1: wgmma 6.6 us (8 K slices as a cluster; was 12.7), cuDNN 13.1 us; custom
    "w4g128|3x3/2|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b1: wgmma 5.8 us (8 K slices as a cluster; was 10.7), cuDNN 13.2 us; custom
    "w8pc|3x3/2|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s1 1x1 256-64 @56 b32: wgmma 21.4 us (TMA-store tile: 22.6), cuDNN 20.9 us (persistent whole tiles, SK 2)
    "w4g128|1x1/1|256-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 4, "SK": 2},
    # r50.s1 1x1 256-64 @56 b32: wgmma 21.8 us (TMA-store tile: 22.2), cuDNN 21.0 us (SK 2)
    "w8pc|1x1/1|256-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 4, "SK": 2},
    # r50.s1 1x1 64-256 @56 b32: wgmma 23.8 us (TMA-store tile: 29.9), cuDNN 24.0 us (SK 2)
    "w4pc|1x1/1|64-256|M131072": {"BM": 128, "NWG": 2, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s1 1x1 64-256 @56 b32: wgmma 23.7 us (TMA-store tile: 30.2), cuDNN 24.0 us (SK 2)
    "w8pc|1x1/1|64-256|M131072": {"BM": 128, "NWG": 2, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s1 1x1 64-64 @56 b32: wgmma 11.1 us, Triton / matmul 13.6 us, cuDNN 8.7 us (TMA-store tile)
    "w4pc|1x1/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 1x1 64-64 @56 b32: wgmma 11.3 us, Triton / matmul 13.5 us, cuDNN 8.7 us (TMA-store tile)
    "w8pc|1x1/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 3x3 64-64 @56 b32: wgmma 27.6 us, Triton / matmul 35.5 us, cuDNN 24.7 us
    "w4g64|3x3/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 3x3 64-64 @56 b32: wgmma 29.1 us, Triton / matmul 33.0 us, cuDNN 24.7 us
    "w8pc|3x3/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s2 1x1 128-512 @28 b32: wgmma 17.7 us, Triton / matmul 20.6 us, cuDNN 14.0 us (TMA-store tile)
    "w4pc|1x1/1|128-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s2 1x1 128-512 @28 b32: wgmma 14.4 us (B192N2S3K1M2; was 14.7), cuDNN 13.8 us; wave
    "w8pc|1x1/1|128-512|M32768": {"BM": 192, "NWG": 2, "STAGES": 3, "KT": 1, "MINB": 2},
    # r50.s2 1x1/2 256-512 @56 (down) b32: wgmma 23.7 us, Triton / matmul 33.3 us, cuDNN 21.3 us (TMA-store tile)
    "w4g128|1x1/2|256-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b32: wgmma 23.4 us, Triton / matmul 32.4 us, cuDNN 21.2 us (TMA-store tile)
    "w8pc|1x1/2|256-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2},
    # r50.s2 3x3 128-128 @28 b32: wgmma 21.3 us, Triton / matmul 31.2 us, cuDNN 18.5 us
    "w4g128|3x3/1|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s2 3x3 128-128 @28 b32: wgmma 19.8 us, Triton / matmul 27.5 us, cuDNN 18.5 us
    "w8pc|3x3/1|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s2 3x3/2 128-128 @56 b32: wgmma 22.3 us, Triton / matmul 31.8 us, cuDNN 19.8 us
    "w4g128|3x3/2|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s2 3x3/2 128-128 @56 b32: wgmma 21.3 us, Triton / matmul 28.2 us, cuDNN 19.8 us
    "w8pc|3x3/2|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s3 1x1 1024-256 @14 b32: wgmma 9.6 us (BM 104, producer warp; was 9.9), cuDNN 12.4 us; custom
    "w4g128|1x1/1|1024-256|M8192": {"BM": 104, "NWG": 2, "STAGES": 4, "KT": 2, "WS": 1},
    # r50.s3 1x1 1024-256 @14 b32: wgmma 9.0 us (BM 104, producer warp; was 9.1), cuDNN 8.6 us; custom
    "w8pc|1x1/1|1024-256|M8192": {"BM": 104, "NWG": 2, "STAGES": 4, "KT": 2, "WS": 1},
    # r50.s3 1x1 256-1024 @14 b32: wgmma 9.7 us (B192N2S3K1M2; was 11.5), cuDNN 9.6 us; wave
    "w4g128|1x1/1|256-1024|M8192": {"BM": 192, "NWG": 2, "STAGES": 3, "KT": 1, "MINB": 2},
    # r50.s3 1x1 256-1024 @14 b32: wgmma 9.6 us (B192N2S3K1M2; was 10.9), cuDNN 9.5 us; wave
    "w8pc|1x1/1|256-1024|M8192": {"BM": 192, "NWG": 2, "STAGES": 3, "KT": 1, "MINB": 2},
    # r50.s3 3x3 256-256 @14 b32: wgmma 16.7 us (B192N2S4K2sp2c1; was 19.0), cuDNN 17.8 us; wave
    "w4g128|3x3/1|256-256|M8192": {"BM": 192, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1},
    # r50.s3 3x3 256-256 @14 b32: wgmma 15.2 us (B96N2S4K2; was 16.7), cuDNN 17.8 us; wave
    "w8pc|3x3/1|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s3 3x3/2 256-256 @28 b32: wgmma 17.3 us (B192N2S4K2sp2c1; was 19.3), cuDNN 18.2 us; wave
    "w4g128|3x3/2|256-256|M8192": {"BM": 192, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1},
    # r50.s3 3x3/2 256-256 @28 b32: wgmma 15.7 us (B96N2S4K2; was 17.1), cuDNN 18.1 us; wave
    "w8pc|3x3/2|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 1x1 2048-512 @7 b32: wgmma 10.6 us (BM 112, producer warp; was 12.0), cuDNN 8.3 us; custom
    "w4g128|1x1/1|2048-512|M2048": {"BM": 112, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 1x1 2048-512 @7 b32: wgmma 10.3 us (BM 112, producer warp; was 11.0), cuDNN 8.3 us; custom
    "w8pc|1x1/1|2048-512|M2048": {"BM": 112, "NWG": 2, "STAGES": 5, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 1x1 512-2048 @7 b32: wgmma 8.2 us (BM 200; was 8.4), cuDNN 8.8 us; custom
    "w4g128|1x1/1|512-2048|M2048": {"BM": 200, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 1x1 512-2048 @7 b32: wgmma 8.1 us (BM 200; was 8.3), cuDNN 8.8 us; custom
    "w8pc|1x1/1|512-2048|M2048": {"BM": 200, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 3x3 512-512 @7 b32: wgmma 17.2 us (BM 104, producer warp; was 18.4), cuDNN 17.3 us; custom
    "w4g128|3x3/1|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3 512-512 @7 b32: wgmma 16.9 us (BM 104, producer warp; was 18.1), cuDNN 17.3 us; custom
    "w8pc|3x3/1|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b32: wgmma 17.2 us (BM 104, producer warp; was 18.5), cuDNN 18.0 us; custom
    "w4g128|3x3/2|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b32: wgmma 16.9 us (BM 104, producer warp; was 18.3), cuDNN 17.7 us; custom
    "w8pc|3x3/2|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
}

# NVIDIA H100 80GB HBM3 (132 SMs), torch 2.11 / triton 3.6. Source: tools/bench/conv_wgmma.py with
# CONV_SWEEP=table (the default, "occ", persistent whole-tile (SK 2), cluster split-K and KT 2 / FOLD tiles beside the
# Triton kernels; batch 1 and 32, W4 g128 (g64 at 64 channels) and W8 per-channel), entries printed by its
# --emit-table (layers it did not list run default_conv_config). Entries marked "wave": CONV_SWEEP=wave (tiles
# whose BM, any multiple of 8, makes the CTAs fill whole waves of the 132 SMs) and CONV_SWEEP=custom runs for the W4
# stage-4 layers. Entries marked "custom": CONV_SWEEP=custom runs once tiles of BM % 16 == 8 and uneven cluster
# bands had the TMA-store epilogue.
_H100_WGMMA: dict[str, dict | None] = {
    # r50.s3 1x1 1024-256 @14 b1: wgmma 4.5 us (8 K slices as a cluster; was 7.8), cuDNN 4.4-6.9 us; custom
    "w4g128|1x1/1|1024-256|M256": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 1024-256 @14 b32: wgmma 10.2 us (BM 104, producer warp; BM 96 10.5), cuDNN 9.8 us; custom
    "w4g128|1x1/1|1024-256|M8192": {"BM": 104, "NWG": 2, "STAGES": 4, "KT": 2, "WS": 1},
    # r50.s4 1x1 2048-512 @7 b32: wgmma 11.4 us (BM 112: TMA-store bands of 64 + 48; BM 128 12.3), cuDNN 10.9; custom
    "w4g128|1x1/1|2048-512|M2048": {"BM": 112, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 1x1 2048-512 @7 b1: wgmma 5.1 us (8 K slices as a cluster; stream-K 9.2), cuDNN 5.7-8.2 us; custom
    "w4g128|1x1/1|2048-512|M64": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 256-1024 @14 b1: wgmma 4.1 us, Triton / matmul 6.2 us, cuDNN 4.5 us
    "w4g128|1x1/1|256-1024|M256": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s3 1x1 256-1024 @14 b32: wgmma 10.4 us (BM 192: 264 CTAs: one wave at 2 per SM; was 11.9), cuDNN 10.1 us; wave
    "w4g128|1x1/1|256-1024|M8192": {"BM": 192, "NWG": 2, "STAGES": 3, "MINB": 2},
    # r50.s1 1x1 256-64 @56 b32: wgmma 27.3 us, Triton / matmul 33.4 us, cuDNN 27.7 us
    "w4g128|1x1/1|256-64|M131072": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 256-64 @56 b1: wgmma 3.5 us, Triton / matmul 6.3 us, cuDNN 5.3 us
    "w4g128|1x1/1|256-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s4 1x1 512-2048 @7 b32: wgmma 8.5 us (BM 200: 128 CTAs; BM 128 9.4), cuDNN 9.0 us; custom
    "w4g128|1x1/1|512-2048|M2048": {"BM": 200, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 1x1 512-2048 @7 b1: wgmma 5.2 us, Triton / matmul 4.4 us, cuDNN 5.3 us
    "w4g128|1x1/1|512-2048|M64": None,
    # r50.s2 1x1/2 256-512 @56 (down) b1: wgmma 4.1 us, Triton / matmul 6.1 us, cuDNN 5.2 us
    "w4g128|1x1/2|256-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b32: wgmma 24.8 us, Triton / matmul 34.8 us, cuDNN 23.0 us
    "w4g128|1x1/2|256-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2},
    # r50.s2 3x3 128-128 @28 b1: wgmma 8.9 us, Triton / matmul 10.8 us, cuDNN 6.8 us
    "w4g128|3x3/1|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s2 3x3 128-128 @28 b32: wgmma 18.6 us, Triton / matmul 31.7 us, cuDNN 19.0 us
    "w4g128|3x3/1|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s3 3x3 256-256 @14 b1: wgmma 6.3 us (8 K slices as a cluster; stream-K 10.6), cuDNN 8.2 us; custom
    "w4g128|3x3/1|256-256|M256": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 3x3 256-256 @14 b32: wgmma 18.0 us (BM 96: 132 CTAs; BM 128 19.5), cuDNN 17.7 us; wave
    "w4g128|3x3/1|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 3x3 512-512 @7 b32: wgmma 17.7 us (BM 104 KT 4 split 2, producer warp, TMA-store bands, custom; 18.7 with
    # per-element bands, 20.4 without the producer warp), cuDNN 18.3-18.5; wave
    "w4g128|3x3/1|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3 512-512 @7 b1: wgmma 7.0 us (8 K slices as a cluster; Triton 12.6-13.0), cuDNN 11.9-13.1 us; custom
    "w4g128|3x3/1|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s2 3x3/2 128-128 @56 b1: wgmma 8.9 us, Triton / matmul 10.9 us, cuDNN 6.7 us
    "w4g128|3x3/2|128-128|M1024": {"BM": 32, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 2},
    # r50.s2 3x3/2 128-128 @56 b32: wgmma 22.0 us, Triton / matmul 32.7 us, cuDNN 21.4 us
    "w4g128|3x3/2|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4},
    # r50.s3 3x3/2 256-256 @28 b1: wgmma 6.3 us (8 K slices as a cluster; stream-K 10.6), cuDNN 8.4 us; custom
    "w4g128|3x3/2|256-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s3 3x3/2 256-256 @28 b32: wgmma 18.4 us (BM 96: 132 CTAs; BM 128 20.1), cuDNN 18.8 us; wave
    "w4g128|3x3/2|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 3x3/2 512-512 @14 b32: wgmma 18.1 us (BM 104 KT 4 split 2, producer warp, TMA-store bands; 19.5 with
    # per-element bands, 20.6 without the producer warp), cuDNN 18.2-18.4; wave
    "w4g128|3x3/2|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 3, "KT": 4, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b1: wgmma 7.0 us (8 K slices as a cluster; Triton 13.0), cuDNN 12.0-13.2 us; custom
    "w4g128|3x3/2|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s1 3x3 64-64 @56 b32: wgmma 25.7 us, Triton / matmul 37.0 us, cuDNN 27.9 us
    "w4g64|3x3/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 3x3 64-64 @56 b1: wgmma 6.2 us, Triton / matmul 7.6 us, cuDNN 6.0 us
    "w4g64|3x3/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s2 1x1 128-512 @28 b1: wgmma 2.9 us, Triton / matmul 5.3 us, cuDNN 3.9 us
    "w4pc|1x1/1|128-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1 128-512 @28 b32: wgmma 17.1 us, Triton / matmul 21.1 us, cuDNN 14.6 us
    "w4pc|1x1/1|128-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s1 1x1 64-256 @56 b32: wgmma 28.2 us, Triton / matmul 40.1 us, cuDNN 28.7 us
    "w4pc|1x1/1|64-256|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s1 1x1 64-256 @56 b1: wgmma 2.4 us, Triton / matmul 4.8 us, cuDNN 5.8 us
    "w4pc|1x1/1|64-256|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s1 1x1 64-64 @56 b32: wgmma 10.6 us, Triton / matmul 17.3 us, cuDNN 10.1 us
    "w4pc|1x1/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 1x1 64-64 @56 b1: wgmma 2.3 us, Triton / matmul 4.4 us, cuDNN 3.9 us
    "w4pc|1x1/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s3 1x1 1024-256 @14 b1: wgmma 4.2 us (8 K slices as a cluster; was 6.7), cuDNN 4.4 us; custom
    "w8pc|1x1/1|1024-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 1024-256 @14 b32: wgmma 9.9 us (BM 96: 132 CTAs, one wave; BM 128 10.8), cuDNN 9.8 us; wave
    "w8pc|1x1/1|1024-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s2 1x1 128-512 @28 b1: wgmma 2.9 us, Triton / matmul 5.3 us, cuDNN 3.9 us
    "w8pc|1x1/1|128-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1 128-512 @28 b32: wgmma 17.4 us, Triton / matmul 21.2 us, cuDNN 14.6 us
    "w8pc|1x1/1|128-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s4 1x1 2048-512 @7 b32: wgmma 10.9 us (BM 112, TMA-store bands; BM 128 11.5), cuDNN 10.7-11.7; custom
    "w8pc|1x1/1|2048-512|M2048": {"BM": 112, "NWG": 2, "STAGES": 5, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 1x1 2048-512 @7 b1: wgmma 4.7 us (8 K slices as a cluster; stream-K 9.1), cuDNN 5.7-8.1 us; custom
    "w8pc|1x1/1|2048-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1},
    # r50.s3 1x1 256-1024 @14 b1: wgmma 3.8 us, Triton / matmul 6.1 us, cuDNN 4.5 us
    "w8pc|1x1/1|256-1024|M256": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s3 1x1 256-1024 @14 b32: wgmma 10.3 us (BM 192: 264 CTAs: one wave at 2 per SM; was 11.6), cuDNN 10.0 us; wave
    "w8pc|1x1/1|256-1024|M8192": {"BM": 192, "NWG": 2, "STAGES": 3, "MINB": 2},
    # r50.s1 1x1 256-64 @56 b32: wgmma 27.4 us, Triton / matmul 33.0 us, cuDNN 27.7 us
    "w8pc|1x1/1|256-64|M131072": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s1 1x1 256-64 @56 b1: wgmma 3.4 us, Triton / matmul 6.1 us, cuDNN 5.2 us
    "w8pc|1x1/1|256-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s4 1x1 512-2048 @7 b32: wgmma 8.5 us (BM 200: 128 CTAs; BM 128 9.0), cuDNN 9.1 us; custom
    "w8pc|1x1/1|512-2048|M2048": {"BM": 200, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 1x1 512-2048 @7 b1: wgmma 4.7 us, Triton / matmul 4.5 us, cuDNN 5.3 us
    "w8pc|1x1/1|512-2048|M64": None,
    # r50.s1 1x1 64-256 @56 b32: wgmma 28.4 us, Triton / matmul 40.2 us, cuDNN 28.7 us
    "w8pc|1x1/1|64-256|M131072": {"BM": 128, "NWG": 2, "STAGES": 3, "SK": 2, "MINB": 2},
    # r50.s1 1x1 64-256 @56 b1: wgmma 2.5 us, Triton / matmul 4.9 us, cuDNN 5.9 us
    "w8pc|1x1/1|64-256|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s1 1x1 64-64 @56 b32: wgmma 10.6 us, Triton / matmul 17.4 us, cuDNN 10.1 us
    "w8pc|1x1/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3},
    # r50.s1 1x1 64-64 @56 b1: wgmma 2.4 us, Triton / matmul 4.4 us, cuDNN 3.6 us
    "w8pc|1x1/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b1: wgmma 3.8 us, Triton / matmul 5.9 us, cuDNN 5.2 us
    "w8pc|1x1/2|256-512|M1024": {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4},
    # r50.s2 1x1/2 256-512 @56 (down) b32: wgmma 24.2 us, Triton / matmul 34.0 us, cuDNN 23.4 us
    "w8pc|1x1/2|256-512|M32768": {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2},
    # r50.s2 3x3 128-128 @28 b1: wgmma 8.0 us, Triton / matmul 10.4 us, cuDNN 6.7 us
    "w8pc|3x3/1|128-128|M1024": {"BM": 64, "NWG": 1, "STAGES": 4},
    # r50.s2 3x3 128-128 @28 b32: wgmma 17.0 us, Triton / matmul 28.6 us, cuDNN 18.7 us
    "w8pc|3x3/1|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2},
    # r50.s3 3x3 256-256 @14 b1: wgmma 5.0 us (8 K slices as a cluster; stream-K 10.9), cuDNN 8.3 us; custom
    "w8pc|3x3/1|256-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s3 3x3 256-256 @14 b32: wgmma 15.7 us (BM 96: 132 CTAs; BM 128 17.4), cuDNN 17.9 us; wave
    "w8pc|3x3/1|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 3x3 512-512 @7 b32: wgmma 17.7 us (BM 112, producer warp, TMA-store bands; BM 128 18.5), cuDNN 18.2; custom
    "w8pc|3x3/1|512-512|M2048": {"BM": 112, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3 512-512 @7 b1: wgmma 5.8 us (8 K slices as a cluster; stream-K 10.7), cuDNN 11.9-13.0 us; custom
    "w8pc|3x3/1|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s1 3x3 64-64 @56 b32: wgmma 25.1 us, Triton / matmul 34.1 us, cuDNN 27.7 us
    "w8pc|3x3/1|64-64|M131072": {"BM": 128, "NWG": 1, "STAGES": 4, "SK": 2},
    # r50.s1 3x3 64-64 @56 b1: wgmma 5.0 us, Triton / matmul 7.2 us, cuDNN 6.0 us
    "w8pc|3x3/1|64-64|M4096": {"BM": 64, "NWG": 1, "STAGES": 3, "KT": 2, "MINB": 4},
    # r50.s2 3x3/2 128-128 @56 b1: wgmma 7.6 us, Triton / matmul 10.5 us, cuDNN 6.7 us
    "w8pc|3x3/2|128-128|M1024": {"BM": 64, "NWG": 1, "STAGES": 4},
    # r50.s2 3x3/2 128-128 @56 b32: wgmma 21.0 us, Triton / matmul 30.0 us, cuDNN 21.6 us
    "w8pc|3x3/2|128-128|M32768": {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2},
    # r50.s3 3x3/2 256-256 @28 b1: wgmma 5.1 us (8 K slices as a cluster; stream-K 10.8), cuDNN 8.3 us; custom
    "w8pc|3x3/2|256-256|M256": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
    # r50.s3 3x3/2 256-256 @28 b32: wgmma 16.4 us (BM 96: 132 CTAs; BM 128 17.8), cuDNN 18.8 us; wave
    "w8pc|3x3/2|256-256|M8192": {"BM": 96, "NWG": 2, "STAGES": 4, "KT": 2},
    # r50.s4 3x3/2 512-512 @14 b32: wgmma 17.6 us (BM 104, TMA-store bands; BM 128 18.8-19.0), cuDNN 18.1 us; custom
    "w8pc|3x3/2|512-512|M2048": {"BM": 104, "NWG": 2, "STAGES": 5, "KT": 2, "SPLIT": 2, "CLUSTER": 1, "WS": 1},
    # r50.s4 3x3/2 512-512 @14 b1: wgmma 5.8 us (8 K slices as a cluster; stream-K 10.8), cuDNN 12.0-13.9 us; custom
    "w8pc|3x3/2|512-512|M64": {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1},
}

WGMMA_TABLES: dict[str, dict[str, dict | None]] = {"h200": _H200_WGMMA, "h100": _H100_WGMMA}


def key_group(q) -> int:
    """The group size a QuantizedWeight is keyed by: -1 when it has one group per channel."""
    return q.group_size if q.num_groups > 1 else -1


def conv_key(bits: int, group_size: int, kh: int, kw: int, stride: int, ci_g: int, co_g: int, m: int) -> str:
    """The key of one layer at M = B*Ho*Wo output pixels (how the tables name the layer an entry was measured on)."""
    fmt = "pc" if group_size == -1 else f"g{group_size}"
    return f"w{bits}{fmt}|{kh}x{kw}/{stride}|{ci_g}-{co_g}|M{pow2_at_least(m)}"


def layer_key(qw, stride, groups: int, m: int) -> str:
    """conv_key of a QuantizedConvWeight run with stride (h, w) and groups over M = B*Ho*Wo output pixels."""
    kh, kw = qw.kernel_size
    sh, sw = stride
    q = qw.matrix
    return conv_key(q.bits, key_group(q), kh, kw, sh if sh == sw else f"{sh}x{sw}", qw.in_channels_per_group,
                    qw.out_channels // groups, m)


def bucket_of(key: str) -> str:
    """The bucket of a layer key: its channel counts replaced by their half-octave classes
    ("w4g128|3x3/1|256-256|M8192" -> "w4g128|3x3/1|c16-c16|M8192")."""
    fmt, geometry, channels, mb = key.split("|")
    ci, co = (int(c) for c in channels.split("-"))
    return f"{fmt}|{geometry}|c{half_octave(ci)}-c{half_octave(co)}|{mb}"


def _by_bucket(table: dict, name: str) -> dict:
    """{bucket: (measured key, value)} of a table; two measured layers in one bucket are an error."""
    out: dict = {}
    for key, value in table.items():
        b = bucket_of(key)
        if b in out:
            raise ValueError(f"conv_table {name}: {key} and {out[b][0]} fall into one bucket {b}")
        out[b] = (key, value)
    return out


_BUCKETS = {gpu: _by_bucket(t, gpu) for gpu, t in TABLES.items()}
_WGMMA_BUCKETS = {gpu: _by_bucket(t, f"{gpu} wgmma") for gpu, t in WGMMA_TABLES.items()}


def _find(tables: dict, gpu_name: str, key: str) -> tuple[str, object] | None:
    """(measured key, value) of the layer's bucket in the first table whose GPU key is in the GPU's name."""
    name = gpu_name.lower()
    for gpu, table in tables.items():
        if gpu in name:
            return table.get(bucket_of(key))
    return None


def lookup(gpu_name: str, key: str) -> tuple | None:
    """The measured (path, config) of the layer's bucket on this GPU, or None."""
    hit = _find(_BUCKETS, gpu_name, key)
    return None if hit is None else hit[1]


def lookup_wgmma(gpu_name: str, key: str) -> tuple[bool, dict | None]:
    """(measured, config) of the wgmma conv for this layer's bucket: (False, None) when this GPU's table has no entry,
    (True, None) when the wgmma path was measured slower than the other kernels, (True, config) when it won."""
    hit = _find(_WGMMA_BUCKETS, gpu_name, key)
    return (False, None) if hit is None else (True, hit[1])


def measured_on(gpu_name: str, key: str, wgmma: bool = False) -> str:
    """Where the entry of the layer's bucket came from ("" when none): the bucket, the layer it was measured on and
    the sweep (the source comment of its table)."""
    hit = _find(_WGMMA_BUCKETS if wgmma else _BUCKETS, gpu_name, key)
    if hit is None:
        return ""
    tool = "tools/bench/conv_wgmma.py" if wgmma else "tools/checks/conv_gpu_check.py"
    return f"conv_table bucket {bucket_of(key)}, measured on {hit[0]} by {tool} (conv_table.py)"
