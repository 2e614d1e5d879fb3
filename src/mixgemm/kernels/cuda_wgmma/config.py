"""The Hopper wgmma GEMM's config (gemm_wgmma.cu): what each short key of a tile means and the WG_* macro it sets.
The host code (gemm_wgmma.prepare_wgmma) completes a config (defaults, the split's kind, FOLD where it applies) and
turns it into the macros; this class is where each key is defined and documented.

The keys in full: BM (activation rows per CTA = the wgmma N: 8..256, multiple
of 8), NWG (warpgroups = 64 weight rows each), STAGES (ring depth, >= 2 + INFLIGHT), INFLIGHT (wgmma groups in
flight, 1 or 2), KT (64-k tiles per stage: 1, 2, 4), SPLIT (split-K factor or "auto"), GROUP_M (m-tiles
rastered together), TMA (1, the default: one thread loads each stage with TMA and bulk copies, NWG 1, 2 or 4;
0: per-thread cp.async), SK (1: stream-K -- a persistent grid of as many CTAs as fit at once splits the (tile,
k-stage) work evenly, CTAs that share a tile combine fp32 partials; 2: persistent whole tiles -- the same grid, each
CTA runs every grid-th output tile start to finish, and with TSTORE its TMA stores stay in flight under the next
tile (a staging buffer past the ring: NWG x BM x 128 bytes, or a piece of it staged and stored in turn where the
whole would cut the ring's stages, ``staging_chunk``); SK needs TMA 1 and ignores SPLIT), FOLD (1: grouped
sym / zero_point weights enter the wgmma as exact integers q - z and each group's fp32 partial is scaled into the
accumulator; applies to groups of 64 with KT 2 or 4 and groups of 128 with KT 4, ignored otherwise), MINB (CTAs per
SM the register allocation must allow; default 2 for SK 1 tiles of BM <= 64 without FOLD, else 1), TSTORE (1, the
default: the epilogue writes each warpgroup's output tile with one TMA store from shared memory where it applies
-- TMA 1, no SK 1 / workspace split-K, 16-byte aligned output rows; 0: one store per element), CLUSTER (1: the
SPLIT <= 8 k-slices of an output tile run as one thread-block cluster and add their fp32 partials through
distributed shared memory, each CTA storing a band of about BM / SPLIT rows (with TSTORE whole 16-row pairs, so the
last bands may be shorter) with the full epilogue; 0, the default: an fp32 workspace and a second kernel), SERIAL
(1, without CLUSTER: serial split-K -- each slice writes its fp32 partial tile to a workspace and the slice that
finishes last adds them in slice order and stores the tile with the full epilogue, in the same kernel; 0, the
default: the zeroed workspace of atomics and a second kernel), PDL (programmatic dependent launch, sm_90,
TMA 1: the first stages' weights are loaded before griddepcontrol.wait, everything else after it; never on the
first launch after the layout was built, whose build kernels write those weights. Default 1, but 0 with SK: a
persistent grid fills every SM slot, and stream-K measured 0.4-4 us slower with it; MIXGEMM_PDL=0 turns it off
everywhere), WS (TMA 1: one more warp only loads, refilling each slot once its consumers released it on an mbarrier;
no CTA barrier per stage; needs MINB 1; default 0), TAIL (2..8 or "auto", not with SK or SPLIT: the tiles of whole
waves run as one launch over the first weight rows, and the rows of the last partial wave as a second, CLUSTER
split-K launch of TAIL slices per tile, which finishes in about 1 / TAIL of a tile's time; "auto": split 2 where the
partial wave fills at most half the SMs, else one launch (`tail_rows`); default 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class WgmmaConfig(KernelConfig):
    # macros the problem (or another build) sets, not the config
    derived = {"WG_BITS": "weight bits", "WG_ACT": "activation dtype code (fp16 0, bf16 1)",
               "WG_SCL": "scale dtype code", "WG_MODE": "sym 0, zero_point 1, offset 2",
               "WG_G2": "groups of 32: two parameter sets per 64-k tile", "WG_PC": "per-channel weights",
               "WG_GT": "with FOLD: 64-k tiles per group", "WG_CONV": "the wgmma convolution's activation loads",
               "WG_GROUPED": "the experts' grouped launch (kernels/cuda/grouped_gemm.py)",
               "WG_CHAIN": "a TAIL pair's role (the tail's CTAs start as the first launch's free their SMs)",
               "WG_TS_BOX": "with TSTORE: rows per TMA store box", "WG_TS_CHUNK": "SK 2's TMA-store staging piece"}

    rows_per_cta: int | None = knob("BM", "activation rows per CTA (the wgmma's N): 8..256, a multiple of 8", None,
                                    "WG_BM", always=True)
    warpgroups: int = knob("NWG", "warpgroups per CTA, 64 weight rows each", 2, "WG_NWG")
    stages: int = knob("STAGES", "depth of the shared-memory ring (>= 2 + INFLIGHT)", 4, "WG_STAGES")
    groups_in_flight: int = knob("INFLIGHT", "wgmma groups in flight, 1 or 2", 1, "WG_INFLIGHT")
    k_tiles_per_stage: int = knob("KT", "64-k tiles per stage: 1, 2 or 4", 1, "WG_KT")
    split_k: int | str = knob("SPLIT", "split-K factor, or \"auto\" (the rule's)", 1, "WG_SPLIT")
    group_m: int = knob("GROUP_M", "m-tiles rastered together", 8, "WG_GROUP_M")
    tma_loader: int = knob("TMA", "1: one thread loads each stage by TMA and bulk copies; 0: per-thread cp.async", 1,
                           "WG_TMA")
    persistent: int = knob("SK", "1: stream-K over (tile, k-stage) work; 2: persistent whole tiles; 0: one CTA per "
                                 "tile (needs TMA 1, ignores SPLIT)", 0, "WG_SK")
    fold_groups: int = knob("FOLD", "grouped sym / zero_point weights enter the wgmma as q - z, each group's fp32 "
                                    "partial scaled into the accumulator (groups of 64 with KT 2 / 4, 128 with KT 4)",
                            0, "WG_FOLD")
    min_blocks_per_sm: int | None = knob("MINB", "CTAs per SM the registers must allow (None: the host's rule, 2 "
                                                 "for SK 1 tiles of BM <= 64 without FOLD, else 1)", None, "WG_MINB")
    tma_store: int = knob("TSTORE", "the epilogue writes each warpgroup's output tile with one TMA store where it "
                                    "applies", 1, "WG_TSTORE")
    cluster_split: int = knob("CLUSTER", "the SPLIT <= 8 k-slices of a tile run as one cluster and add their partials "
                                         "through distributed shared memory (0: a workspace and a second kernel)", 0)
    serial_split: int = knob("SERIAL", "without CLUSTER: the slice that finishes last adds the partials in slice "
                                       "order, in the same kernel", 0)
    pdl: int | None = knob("PDL", "programmatic dependent launch: the first stages' weights loaded before the wait "
                                  "(None: the host's rule, 1, but 0 with SK)", None, "WG_PDL")
    producer_warp: int = knob("WS", "one more warp only loads, refilling each slot its consumers released (TMA 1, "
                                    "MINB 1)", 0, "WG_WS")
    tail_split: int | str = knob("TAIL", "the last partial wave's rows as a second, cluster split-K launch of TAIL "
                                         "slices per tile (2..8, or \"auto\"; not with SK or SPLIT)", 0)
    tail_waits: int = knob("TAIL_WAIT", "with TAIL: the tail launch waits for the first instead of starting as its "
                                        "CTAs free their SMs", 0)
    reads_rows_v1: int = knob("ROWS", "int8 codes read from rows_v1 (a weight kept there)", 0, "WG_ROWS")
