"""The Triton int8 GEMM's tile (int8_gemm.py: Triton constexprs and launch settings, no -D macros; the rule that
picks it: int8_gemm.pick_config)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class Int8GemmConfig(KernelConfig):
    block_m: int = knob("BM", "tokens per program (16: the GEMV regime's one MMA tile)", default=MISSING)
    block_n: int = knob("BN", "weight rows (output channels) per program", default=MISSING)
    block_k: int = knob("BK", "K per step: divides the group (grouped weights), 2 x the half split for int4",
                        default=MISSING)
    group_m: int = knob("GROUP_M", "m-tiles rastered together (L2 reuse of the weight tiles)", default=MISSING)
    num_warps: int = knob("num_warps", "warps per program", default=MISSING)
    num_stages: int = knob("num_stages", "software pipeline stages of the K loop", default=MISSING)
    split_k: int = knob("SPLIT_K", "K splits over whole groups (the GEMV regime), their partial sums added", default=1)
    tma_loads: bool = knob("TMA", "TMA tensor-descriptor loads (sym activations x sym weights on the GPU)",
                           default=False)
    lagged_fold: bool | None = knob("LAG", "the TMA kernel's per-group fold one group behind its MMA (None: the "
                                    "kernel's default)", default=None)
    asm_unpack: bool = knob("ASM", "inline-asm nibble unpack of int4 codes (GPU only)", default=False)
