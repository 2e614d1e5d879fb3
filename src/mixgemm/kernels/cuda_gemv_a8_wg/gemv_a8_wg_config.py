"""The fused int8-activation GEMV's config on the int8 GEMM's layout (gemv_a8_wg.cu)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from mixgemm.kernels.cuda_gemv_a8.gemv_a8_config import A8_PROBLEM_DEFINES
from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class GemvA8WgConfig(KernelConfig):
    row_tiles: int = knob("RT", "16-row tiles of wgmma_a8_v1 per warp (divides 8)", define="A8_RT", default=MISSING)
    k_slices: int = knob("KS", "warps along K per block (split-K inside the block, reduced in shared memory)",
                         define="A8_KS", default=MISSING)
    k_tiles_per_step: int = knob("U", "128-k tiles each warp reads per step: 1 or 2", define="A8_U", default=1)
    row_groups: int | None = knob("RG", "warps along N per block (default: 8 / KS, at least 1)",
                                  define="A8_RG", default=None)
    prefetch: int = knob("PF", "1: register double buffering of the weight loads across steps and tiles",
                         define="A8_PF", default=1)
    one_pass: int = knob("OP", "1: the one-pass prologue where the row fits (A8_OPC), 0: two passes over x",
                         define=None, default=1)
    tensor_cores: int = knob("MMA", "1: the math on the int8 tensor cores (mma.sync), 0: dp4a on the CUDA cores",
                             define="A8_MMA", default=0)
    grid: Any = knob("GRID", "blocks: None persistent, 'tiles' one per row tile, or an int per SM (as cuda_gemv_a8)",
                     define=None, default=None)

    derived = A8_PROBLEM_DEFINES
