"""The CUDA-core GEMV's config (gemv.cu): what each short key of a tile means and the GEMV_* macro it sets."""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class GemvConfig(KernelConfig):
    # macros the problem (or another build) sets, not the config
    derived = {"GEMV_BITS": "weight bits", "GEMV_ACT": "activation dtype code (fp16 0, bf16 1, fp32 2)",
               "GEMV_SCL": "scale dtype code", "GEMV_MODE": "sym 0, zero_point 1, offset 2",
               "GEMV_M": "the compiled M bucket (1, 2, 4, 8, 16)"}

    rows_per_warp: int | None = knob("R", "weight rows each lane group works on at once (registers per row)",
                                     None, "GEMV_R", always=True)
    chunks_in_flight: int | None = knob("U", "16-byte chunks of a row each lane loads per step (the step's unroll)",
                                        None, "GEMV_U", always=True)
    row_groups: int | None = knob("RG", "warps of a block along N, each on its own rows", None, "GEMV_RG",
                                  always=True)
    k_slices: int | None = knob("KS", "warps of a block along K, each summing a slice of every row (reduced in "
                                      "shared memory)", None, "GEMV_KS", always=True)
    prefetch: int = knob("PF", "register double buffering: the next step's weights in flight during this step's "
                               "math", 0, "GEMV_PF", always=True)
    min_blocks_per_sm: int = knob("MINB", "launch-bounds minimum blocks per SM (caps the registers; 0: none)", 0,
                                  "GEMV_MINB")
    x_in_smem: int = knob("XS", "x staged in shared memory, piece-major (fp16, M = 1 only)", 0, "GEMV_XS")
    lite: int = knob("LITE", "lighter per-chunk bookkeeping for fp16 x with fp16 zero points (f16x2 sum of the two "
                             "partial chains)", 0, "GEMV_LITE")
    bulk_stages: int = knob("BULK", "stages of the bulk-copy ring (0: weights loaded into registers; sm_90, "
                                    "persistent grid)", 0, "GEMV_BULK")
    bulk_params: int = knob("BPAR", "with BULK: each tile's parameters bulk-copied too (whole 16-byte rows)", 0,
                            "GEMV_BPAR")
    bulk_blocks_per_sm: int = knob("BPS", "with BULK: the most blocks per SM of the persistent grid (0: as many as "
                                          "fit)", 0)
    max_blocks_per_sm: int = knob("MAXB", "a measured tile's bound: the most blocks per SM (rounded up) of a layer it "
                                          "serves (0: any; read by the tile rule, not the kernel)", 0)
    zero_by_x_sum: int = knob("ZSUM", "zero points through the x sum (zero_point weights, fp16 x)", 0, "GEMV_ZSUM")
    lanes_per_row: int = knob("LW", "lanes per weight row: 32, or 16 / 8 / 4 (a warp works on 32 / LW row sets)", 32,
                              "GEMV_LW")
    gathers_x: int = knob("PERM", "act-order: the kernel reads x through the layer's permutation (set by the host)",
                          0, "GEMV_PERM")
    reads_rows_v1: int = knob("ROWS", "int8 codes and parameters read from rows_v1 (a weight kept there)", 0,
                              "GEMV_ROWS")

    def build_defines(self, bits: int, act: int, scl: int, mode: int, m: int) -> dict:
        """NVRTC -D macros of one gemv.cu instantiation. The optional keys (MINB, XS, LITE, PERM, ZSUM, BULK, BPAR,
        LW, ROWS) only appear when set, so default compile keys are unchanged."""
        self.check_core_keys("CUDA-core GEMV")
        d = {"GEMV_BITS": bits, "GEMV_ACT": act, "GEMV_SCL": scl, "GEMV_MODE": mode, "GEMV_M": m,
             "GEMV_R": self.rows_per_warp, "GEMV_U": self.chunks_in_flight, "GEMV_RG": self.row_groups,
             "GEMV_KS": self.k_slices, "GEMV_PF": self.prefetch}
        if self.min_blocks_per_sm:
            d["GEMV_MINB"] = self.min_blocks_per_sm
        if self.x_in_smem and m == 1 and act == 0 and not self.prefetch:
            d["GEMV_XS"] = 1  # (the host also drops XS when K * 2 bytes exceed XS_MAX_BYTES)
        if self.lite:
            d["GEMV_LITE"] = 1
        if self.gathers_x:
            d["GEMV_PERM"] = 1
        if self.zero_by_x_sum:
            d["GEMV_ZSUM"] = 1
        if self.bulk_stages:
            d["GEMV_BULK"] = self.bulk_stages
            if self.bulk_params:
                d["GEMV_BPAR"] = 1
        if self.lanes_per_row != 32:
            d["GEMV_LW"] = self.lanes_per_row
        if self.reads_rows_v1:
            d["GEMV_ROWS"] = 1
        return d
