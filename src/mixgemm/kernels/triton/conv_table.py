"""Measured tile choices for the implicit-GEMM conv kernel (issue 8), per GPU: no run-time autotuning.

``lookup`` returns the fastest entry of the device sweep (scripts/conv_gpu_check.py) for a layer shape, or
None (then kernels.triton.conv.pick_config's heuristic decides). Key: ``conv_key(...)`` =
"w{bits}{pc|g<group>}|{kh}x{kw}/{stride}|{ci_g}-{co_g}|M{bucket}" with bucket the power of two >= M, so a
batch that lands in the same bucket (e.g. 24..32 at a given spatial size) reuses the measured config.
Value: (path, config) where path is "igemm" or "matmul" (1x1 convs: the shared Triton GEMM), config a
tuple (block_m, block_n, block_k, split_k, num_warps, num_stages, swap_ab) for "igemm", None for "matmul".
Only GPUs whose name contains a table's key use it (an H100 table is not applied to other GPUs).
"""

from __future__ import annotations

# NVIDIA H200 (132 SMs), torch 2.11 / triton 3.6, 2026-11-21 07:21 UTC: scripts/conv_gpu_check.sh, protocol graph
# timing; per layer of mixgemm.bench.conv.CONV_PRESET at batch 1 and 32, the fastest correct variant of the sweep
# (comment: its time, and the time of what the run's dispatch picked).
# Raw data: benchmarks/results/h200-conv-sweep.json.
_H200: dict[str, tuple] = {
    # r50.s3 1x1 1024-256 @14 b1: 11.54 us (the run's dispatch: 18.57)
    "w4g128|1x1/1|1024-256|M256": ("igemm", (64, 128, 64, 8, 4, 4, True)),
    # r50.s3 1x1 1024-256 @14 b32: 21.17 us (the run's dispatch: 21.26)
    "w4g128|1x1/1|1024-256|M8192": ("matmul", None),
    # r50.s4 1x1 2048-512 @7 b32: 32.69 us (the run's dispatch: 34.54)
    "w4g128|1x1/1|2048-512|M2048": ("igemm", (64, 128, 64, 3, 4, 3, False)),
    # r50.s4 1x1 2048-512 @7 b1: 12.73 us (the run's dispatch: 26.71)
    "w4g128|1x1/1|2048-512|M64": ("igemm", (64, 128, 64, 16, 4, 4, True)),
    # r50.s3 1x1 256-1024 @14 b1: 6.22 us (the run's dispatch: 6.66)
    "w4g128|1x1/1|256-1024|M256": ("igemm", (64, 64, 128, 1, 4, 3, True)),
    # r50.s3 1x1 256-1024 @14 b32: 16.46 us (the run's dispatch: 16.46)
    "w4g128|1x1/1|256-1024|M8192": ("matmul", None),
    # r50.s1 1x1 256-64 @56 b32: 30.84 us (the run's dispatch: 32.93)
    "w4g128|1x1/1|256-64|M131072": ("igemm", (256, 64, 64, 1, 8, 3, False)),
    # r50.s1 1x1 256-64 @56 b1: 6.67 us (the run's dispatch: 6.67)
    "w4g128|1x1/1|256-64|M4096": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b32: 15.79 us (the run's dispatch: 15.84)
    "w4g128|1x1/1|512-2048|M2048": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b1: 8.15 us (the run's dispatch: 8.15)
    "w4g128|1x1/1|512-2048|M64": ("matmul", None),
    # r50.s2 1x1/2 256-512 @56 (down) b1: 7.35 us (the run's dispatch: 7.35)
    "w4g128|1x1/2|256-512|M1024": ("igemm", (64, 128, 64, 1, 4, 3, False)),
    # r50.s2 1x1/2 256-512 @56 (down) b32: 39.59 us (the run's dispatch: 66.55)
    "w4g128|1x1/2|256-512|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b1: 12.52 us (the run's dispatch: 12.52)
    "w4g128|3x3/1|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b32: 41.64 us (the run's dispatch: 75.26)
    "w4g128|3x3/1|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s3 3x3 256-256 @14 b1: 14.18 us (the run's dispatch: 16.17)
    "w4g128|3x3/1|256-256|M256": ("igemm", (64, 128, 64, 16, 4, 4, True)),
    # r50.s3 3x3 256-256 @14 b32: 59.44 us (the run's dispatch: 84.04)
    "w4g128|3x3/1|256-256|M8192": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s4 3x3 512-512 @7 b32: 62.6 us (the run's dispatch: 62.6)
    "w4g128|3x3/1|512-512|M2048": ("igemm", (64, 128, 64, 3, 4, 3, False)),
    # r50.s4 3x3 512-512 @7 b1: 16.54 us (the run's dispatch: 16.54)
    "w4g128|3x3/1|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 3, True)),
    # r50.s2 3x3/2 128-128 @56 b1: 12.53 us (the run's dispatch: 12.53)
    "w4g128|3x3/2|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b32: 41.96 us (the run's dispatch: 75.88)
    "w4g128|3x3/2|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s3 3x3/2 256-256 @28 b1: 14.22 us (the run's dispatch: 16.16)
    "w4g128|3x3/2|256-256|M256": ("igemm", (64, 128, 64, 16, 4, 4, True)),
    # r50.s3 3x3/2 256-256 @28 b32: 59.59 us (the run's dispatch: 83.69)
    "w4g128|3x3/2|256-256|M8192": ("igemm", (128, 128, 64, 1, 4, 4, True)),
    # r50.s4 3x3/2 512-512 @14 b32: 62.99 us (the run's dispatch: 62.99)
    "w4g128|3x3/2|512-512|M2048": ("igemm", (64, 128, 64, 3, 4, 3, False)),
    # r50.s4 3x3/2 512-512 @14 b1: 16.54 us (the run's dispatch: 16.54)
    "w4g128|3x3/2|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 3, True)),
    # r50.s1 3x3 64-64 @56 b32: 62.37 us (the run's dispatch: 74.97)
    "w4g64|3x3/1|64-64|M131072": ("igemm", (256, 64, 64, 1, 8, 3, False)),
    # r50.s1 3x3 64-64 @56 b1: 13.45 us (the run's dispatch: 13.45)
    "w4g64|3x3/1|64-64|M4096": ("igemm", (64, 64, 64, 2, 4, 3, False)),
    # r50.s2 1x1 128-512 @28 b1: 5.03 us (the run's dispatch: 5.03)
    "w4pc|1x1/1|128-512|M1024": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b32: 20.3 us (the run's dispatch: 20.36)
    "w4pc|1x1/1|128-512|M32768": ("matmul", None),
    # r50.s1 1x1 64-256 @56 b32: 37.72 us (the run's dispatch: 37.72)
    "w4pc|1x1/1|64-256|M131072": ("matmul", None),
    # r50.s1 1x1 64-256 @56 b1: 4.93 us (the run's dispatch: 4.93)
    "w4pc|1x1/1|64-256|M4096": ("matmul", None),
    # r50.s1 1x1 64-64 @56 b32: 16.05 us (the run's dispatch: 17.67)
    "w4pc|1x1/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-64 @56 b1: 4.51 us (the run's dispatch: 4.51)
    "w4pc|1x1/1|64-64|M4096": ("matmul", None),
    # r50.s3 1x1 1024-256 @14 b1: 9.31 us (the run's dispatch: 9.31)
    "w8pc|1x1/1|1024-256|M256": ("matmul", None),
    # r50.s3 1x1 1024-256 @14 b32: 14.27 us (the run's dispatch: 14.28)
    "w8pc|1x1/1|1024-256|M8192": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b1: 4.89 us (the run's dispatch: 4.89)
    "w8pc|1x1/1|128-512|M1024": ("matmul", None),
    # r50.s2 1x1 128-512 @28 b32: 25.42 us (the run's dispatch: 25.45)
    "w8pc|1x1/1|128-512|M32768": ("matmul", None),
    # r50.s4 1x1 2048-512 @7 b32: 22.61 us (the run's dispatch: 22.61)
    "w8pc|1x1/1|2048-512|M2048": ("matmul", None),
    # r50.s4 1x1 2048-512 @7 b1: 10.66 us (the run's dispatch: 15.24)
    "w8pc|1x1/1|2048-512|M64": ("igemm", (64, 64, 128, 4, 4, 3, True)),
    # r50.s3 1x1 256-1024 @14 b1: 4.54 us (the run's dispatch: 4.55)
    "w8pc|1x1/1|256-1024|M256": ("matmul", None),
    # r50.s3 1x1 256-1024 @14 b32: 16.8 us (the run's dispatch: 16.8)
    "w8pc|1x1/1|256-1024|M8192": ("matmul", None),
    # r50.s1 1x1 256-64 @56 b32: 26.78 us (the run's dispatch: 36.51)
    "w8pc|1x1/1|256-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 256-64 @56 b1: 5.93 us (the run's dispatch: 5.93)
    "w8pc|1x1/1|256-64|M4096": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b32: 15.66 us (the run's dispatch: 15.66)
    "w8pc|1x1/1|512-2048|M2048": ("matmul", None),
    # r50.s4 1x1 512-2048 @7 b1: 6.0 us (the run's dispatch: 6.0)
    "w8pc|1x1/1|512-2048|M64": ("matmul", None),
    # r50.s1 1x1 64-256 @56 b32: 42.11 us (the run's dispatch: 49.39)
    "w8pc|1x1/1|64-256|M131072": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-256 @56 b1: 4.89 us (the run's dispatch: 4.89)
    "w8pc|1x1/1|64-256|M4096": ("matmul", None),
    # r50.s1 1x1 64-64 @56 b32: 14.26 us (the run's dispatch: 23.39)
    "w8pc|1x1/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 3, False)),
    # r50.s1 1x1 64-64 @56 b1: 4.49 us (the run's dispatch: 4.49)
    "w8pc|1x1/1|64-64|M4096": ("matmul", None),
    # r50.s2 1x1/2 256-512 @56 (down) b1: 6.72 us (the run's dispatch: 6.72)
    "w8pc|1x1/2|256-512|M1024": ("igemm", (64, 128, 64, 1, 4, 3, False)),
    # r50.s2 1x1/2 256-512 @56 (down) b32: 37.22 us (the run's dispatch: 46.55)
    "w8pc|1x1/2|256-512|M32768": ("igemm", (256, 128, 64, 1, 8, 3, False)),
    # r50.s2 3x3 128-128 @28 b1: 12.25 us (the run's dispatch: 12.25)
    "w8pc|3x3/1|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3 128-128 @28 b32: 38.64 us (the run's dispatch: 48.22)
    "w8pc|3x3/1|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s3 3x3 256-256 @14 b1: 12.24 us (the run's dispatch: 12.81)
    "w8pc|3x3/1|256-256|M256": ("igemm", (64, 64, 64, 4, 4, 4, True)),
    # r50.s3 3x3 256-256 @14 b32: 41.94 us (the run's dispatch: 56.86)
    "w8pc|3x3/1|256-256|M8192": ("igemm", (128, 128, 128, 1, 8, 3, False)),
    # r50.s4 3x3 512-512 @7 b32: 48.46 us (the run's dispatch: 56.76)
    "w8pc|3x3/1|512-512|M2048": ("igemm", (128, 128, 64, 2, 8, 3, False)),
    # r50.s4 3x3 512-512 @7 b1: 12.93 us (the run's dispatch: 13.03)
    "w8pc|3x3/1|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 4, True)),
    # r50.s1 3x3 64-64 @56 b32: 41.59 us (the run's dispatch: 44.64)
    "w8pc|3x3/1|64-64|M131072": ("igemm", (128, 64, 64, 1, 4, 4, True)),
    # r50.s1 3x3 64-64 @56 b1: 7.86 us (the run's dispatch: 7.86)
    "w8pc|3x3/1|64-64|M4096": ("igemm", (64, 64, 64, 2, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b1: 12.26 us (the run's dispatch: 12.26)
    "w8pc|3x3/2|128-128|M1024": ("igemm", (64, 128, 64, 4, 4, 3, False)),
    # r50.s2 3x3/2 128-128 @56 b32: 39.19 us (the run's dispatch: 48.96)
    "w8pc|3x3/2|128-128|M32768": ("igemm", (128, 128, 64, 1, 4, 3, False)),
    # r50.s3 3x3/2 256-256 @28 b1: 12.19 us (the run's dispatch: 12.85)
    "w8pc|3x3/2|256-256|M256": ("igemm", (64, 64, 64, 4, 4, 4, True)),
    # r50.s3 3x3/2 256-256 @28 b32: 42.09 us (the run's dispatch: 57.52)
    "w8pc|3x3/2|256-256|M8192": ("igemm", (128, 128, 128, 1, 8, 3, False)),
    # r50.s4 3x3/2 512-512 @14 b32: 49.44 us (the run's dispatch: 57.37)
    "w8pc|3x3/2|512-512|M2048": ("igemm", (128, 128, 64, 2, 8, 3, False)),
    # r50.s4 3x3/2 512-512 @14 b1: 13.09 us (the run's dispatch: 13.1)
    "w8pc|3x3/2|512-512|M64": ("igemm", (64, 64, 64, 16, 4, 4, True)),
    # r50.stem 7x7/2 3-64 @224 b1: 25.25 us (the run's dispatch: 25.25)
    "w8pc|7x7/2|3-64|M16384": ("igemm", (128, 64, 32, 1, 4, 4, False)),
    # r50.stem 7x7/2 3-64 @224 b32: 343.44 us (the run's dispatch: 343.44)
    "w8pc|7x7/2|3-64|M524288": ("igemm", (128, 64, 32, 1, 4, 4, False)),
}

TABLES: dict[str, dict[str, tuple]] = {"h200": _H200}


def _bucket(m: int) -> int:
    b = 1
    while b < m:
        b *= 2
    return b


def key_group(q) -> int:
    """The group size a QuantizedWeight is keyed by: -1 when it has one group per channel."""
    return q.group_size if q.num_groups > 1 else -1


def conv_key(bits: int, group_size: int, kh: int, kw: int, stride: int, ci_g: int, co_g: int, m: int) -> str:
    fmt = "pc" if group_size == -1 else f"g{group_size}"
    return f"w{bits}{fmt}|{kh}x{kw}/{stride}|{ci_g}-{co_g}|M{_bucket(m)}"


def gpu_table(gpu_name: str) -> dict[str, tuple]:
    name = gpu_name.lower()
    for key, table in TABLES.items():
        if key in name:
            return table
    return {}


def lookup(gpu_name: str, key: str) -> tuple | None:
    return gpu_table(gpu_name).get(key)
