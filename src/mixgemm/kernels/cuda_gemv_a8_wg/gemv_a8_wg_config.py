"""The fused int8-activation GEMV's config on the int8 GEMM's layout (gemv_a8_wg.cu)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mixgemm.kernels.cuda_gemv_a8.gemv_a8_config import A8_PROBLEM_DEFINES
from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class GemvA8WgConfig(KernelConfig):
    row_tiles: int = knob("RT", "16-row tiles of wgmma_a8_v1 per warp (divides 8)", "A8_RT")
    k_slices: int = knob("KS", "warps along K per block (split-K inside the block, reduced in shared memory)",
                         "A8_KS")
    k_tiles_per_step: int = knob("U", "128-k tiles each warp reads per step: 1 or 2", "A8_U", 1)
    row_groups: int | None = knob("RG", "warps along N per block (default: 8 / KS, at least 1)", "A8_RG", None)
    prefetch: int = knob("PF", "1: register double buffering of the weight loads across steps and tiles", "A8_PF", 1)
    one_pass: int = knob("OP", "1: the one-pass prologue where the row fits (A8_OPC), 0: two passes over x", None, 1)
    tensor_cores: int = knob("MMA", "1: the math on the int8 tensor cores (mma.sync), 0: dp4a on the CUDA cores",
                             "A8_MMA", 0)
    grid: Any = knob("GRID", "blocks: None persistent, 'tiles' one per row tile, or an int per SM (as cuda_gemv_a8)",
                     None, None)

    derived = A8_PROBLEM_DEFINES
