"""The int8 wgmma GEMM's config (gemm_wgmma_a8.cu; the rules that pick it: gemm_wgmma_a8.default_config and the
entry's config). Where a default is None the host code derives it (gemm_wgmma_a8._prepare_rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class WgmmaA8Config(KernelConfig):
    block_m: int = knob("BM", "tokens per CTA, the wgmma N: 16..256, a multiple of 16 (<= 128 for grouped weights "
                        "that fold)", define="A8_BM", default=128)
    warpgroups: int = knob("NWG", "consumer warpgroups of 64 weight rows each: 1, 2 or 4", define="A8_NWG", default=2)
    stages: int = knob("STAGES", "depth of the shared-memory ring (>= 3; 2 with the producer warpgroup)",
                       define="A8_STAGES", default=4)
    k_tiles_per_stage: int = knob("KT", "128-k tiles per stage: 1, 2 or 4 (a multiple of NP x the group's tiles)",
                                  define="A8_KT", default=2)
    partials: int = knob("NP", "int32 partials per group: 2 folds under the next group's wgmmas, 1 before them",
                         define="A8_NP", default=1)
    cvt_magic: int = knob("CVT", "int32 -> fp32 of the partials: 0 cvt.rn.f32.s32, 1 the magic-number add",
                          define="A8_CVT", default=0)
    group_m: int = knob("GROUP_M", "m-tiles rastered together (L2 reuse of the weight tiles)",
                        define="A8_GROUP_M", default=8)
    min_blocks: int = knob("MINB", "CTAs per SM the registers must allow (__launch_bounds__): 1..3",
                           define="A8_MINB", default=1)
    producer_warpgroup: int | None = knob(
        "WS", "1: a producer warpgroup and per-stage empty barriers; 0: thread 0 refills, a CTA barrier per stage "
        "(default: 1 for NWG 1, and NWG 2 with MINB 1; sets A8_WS)", define=None, default=None)
    tma_store: int = knob("TSTORE", "1: a 16-bit output the TMA can address is stored by one TMA store per "
                          "warpgroup tile (sets A8_TSTORE where it fits); 0: one store per element",
                          define=None, default=1)
    multicast: int = knob("MC", "CTAs of the same tokens as one cluster, each loading half the activation tile and "
                          "multicasting it: 1 or 2 (2 needs WS and an even number of column tiles)",
                          define="A8_MC", default=1)
    pdl: int | None = knob("PDL", "1: programmatic dependent launch, the first stages' weights loaded before the "
                           "wait (default: WS; sets A8_PDL where the GPU and kernel_options allow)",
                           define=None, default=None)
    int_scales: int = knob("QS", "1: an int4 weight with integer group scales under per-token activation scales runs "
                           "without the per-group fold (sets A8_QS where the layout allows); 0: the fold",
                           define=None, default=1)
    quantize_in_launch: int = knob("FQ", "a call plan with per-token scales: 1 quantizes x in the GEMM's own launch "
                                   "(sets A8_FQ / A8_FQ_WPR / A8_XT where the tile allows), 0 the row quantizer first",
                                   define=None, default=1)
    split: int = knob("SPLIT", "split-K over a cluster of that many CTAs per output tile, 1..8 (the sums met in "
                      "distributed shared memory; sets A8_SPLIT when > 1)", define=None, default=1)
    tail: Any = knob("TAIL", "0, 'auto' or 2..8: the partial last wave's weight rows in a second, cluster split-K "
                     "launch of that many slices (gemm_wgmma_a8.tail_rows)", define=None, default=0)
    tail_wait: int = knob("TAIL_WAIT", "0: the tail launch's CTAs start as the first launch's free their SMs "
                          "(A8_CHAIN); 1: they wait for the whole first launch", define=None, default=0)

    derived = {
        "A8_BITS": "weight bits (4 or 8)",
        "A8_OUT": "output dtype: 0 fp16, 1 bf16, 2 fp32",
        "A8_GT": "128-k tiles per weight group (0: per channel)",
        "A8_AT": "1: per-token activation scales over a grouped weight",
        "A8_WS": "the producer warpgroup (WS, or its default)",
        "A8_QS": "QS where the layout holds integer group scales and the scales are per token",
        "A8_TSTORE": "TSTORE where the output's rows fit a TMA store",
        "A8_PDL": "PDL where the GPU and kernel_options(pdl=...) allow it",
        "A8_CHAIN": "the launch's role in a TAIL pair (1 the whole waves, 2 the tail; with PDL)",
        "A8_SPLIT": "SPLIT when > 1",
        "A8_FQ": "FQ's quantizer: 16-byte units per thread of the quantizer blocks (gemm_wgmma_a8.quantizer_split)",
        "A8_FQ_WPR": "FQ's quantizer: warps per activation row",
        "A8_XT": "FQ's quantizer: the activation dtype (0 fp16, 1 bf16, 2 fp32)",
        "A8_SF": "1: 'sym_full' activations (act_quant.cuh; the GEMM's own quantizer is compiled for 'sym')",
    }
