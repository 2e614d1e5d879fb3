"""The fused int8-activation GEMV's config (gemv_a8.cu): one block = RG x KS warps over R rows per warp."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from mixgemm.kernels.kernel_config import KernelConfig, knob

# the macros gemv_a8.cu reads from the problem and the layout (defines_for), and the activation quantizer's
A8_PROBLEM_DEFINES = {
    "A8_BITS": "weight bits (4 or 8)",
    "A8_XT": "activation dtype: 0 fp16, 1 bf16, 2 fp32",
    "A8_M": "the compiled token count (M's power-of-two bucket)",
    "A8_G": "the weight group along K (0: per channel)",
    "A8_AT": "1: one activation scale per token over the whole row (act_block 'token') of a grouped weight",
    "A8_OPC": "8-k chunks of x per thread of the one-pass prologue (0: two passes; from OP and the row length)",
    "A8_SF": "1: 'sym_full' activations (act_quant_rows.mode_defines)",
}


@dataclass(frozen=True)
class GemvA8Config(KernelConfig):
    rows_per_warp: int = knob("R", "weight rows each warp computes (registers: M x R x 3 accumulators)",
                              define="A8_R", default=MISSING)
    k_slices: int = knob("KS", "warps along K per block (split-K inside the block, reduced in shared memory)",
                         define="A8_KS", default=MISSING)
    row_groups: int | None = knob("RG", "warps along N per block (default: NW / KS)", define="A8_RG", default=None)
    warps: int = knob("NW", "warps per block (RG x KS)", define=None, default=8)
    prefetch: int = knob("PF", "1: register double buffering of the weight loads across steps and tiles",
                         define="A8_PF", default=0)
    one_pass: int = knob("OP", "1: the one-pass prologue where the row fits (A8_OPC), 0: two passes over x",
                         define=None, default=1)
    grid: Any = knob("GRID", "blocks: None persistent (resident blocks x SMs, balanced), 'tiles' one per row tile, or "
                     "an int: that many blocks per SM", define=None, default=None)

    derived = {**A8_PROBLEM_DEFINES,
               "A8_U": "chunks per lane and step (a property of the a8gemv_v2 layout, layout.pick_u)"}
