"""The Triton GEMM's config (gemm.py): what each short key of a tile means. Triton takes them as constexpr arguments
and launch options, not -D macros."""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class TritonGemmConfig(KernelConfig):
    rows_per_block: int | None = knob("BM", "activation rows per program", None, always=True)
    cols_per_block: int | None = knob("BN", "weight rows (output columns) per program", None, always=True)
    chunk_words: int = knob("KS", "32-bit words per chunk row of the layout (triton_gemm_v1_ks<KS>)", 16)
    chunks_per_k_tile: int = knob("KCH", "layout chunks per K tile (the inner step)", 1)
    group_m: int = knob("GROUP_M", "m-tiles rastered together", 1)
    split_k: int | str = knob("SPLIT_K", "split-K factor, or \"auto\" (the rule's)", 1)
    num_warps: int = knob("num_warps", "warps per program (Triton launch option)", 4)
    num_stages: int = knob("num_stages", "software pipeline stages (Triton launch option)", 3)
