"""The tensor-core GEMV's config (gemv_mma.cu): what each short key means and the MMA_* macro it sets."""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class GemvMmaConfig(KernelConfig):
    # macros the problem (or another build) sets, not the config
    derived = {"MMA_BITS": "weight bits", "MMA_ACT": "activation dtype code (fp16 0, bf16 1)",
               "MMA_SCL": "scale dtype code", "MMA_MODE": "sym 0, zero_point 1, offset 2",
               "MMA_MB": "mma n-blocks of 8 x rows (1: M <= 8, 2: M <= 16)"}

    k_tiles_in_flight: int | None = knob("U", "k-tiles each warp loads per step (the step's unroll)", None, "MMA_U",
                                         always=True)
    row_groups: int | None = knob("RG", "warps of a block along N, each on its own 16-row tiles", None, "MMA_RG",
                                  always=True)
    k_slices: int | None = knob("KS", "warps of a block along K, each summing a slice of every row tile (reduced in "
                                      "shared memory)", None, "MMA_KS", always=True)
    prefetch: int = knob("PF", "register double buffering: the next step's weights in flight during this step's "
                               "math", 0, "MMA_PF", always=True)
    deferred_scale: int = knob("DEFER", "the scale applied once per tile to the fp32 mma result (A holds q - z), not "
                                        "per weight pair; needs every tile inside one group (the host checks)", 0,
                               "MMA_DEFER")
    early_loads: int = knob("EARLY", "the first step's weights and parameters loaded before the PDL wait", 0,
                            "MMA_EARLY")
    row_tiles_per_warp: int = knob("RT", "16-row tiles per warp sharing one staging of x and its B fragments", 1,
                                   "MMA_RT")
    min_blocks_per_sm: int = knob("MINB", "blocks per SM the registers must allow (launch bounds; 0 / 1: none)", 0,
                                  "MMA_MINB")
    packed_params: int = knob("PACK", "a zero point's / offset's 16-bit (scale, second) pair kept in one register "
                                      "(dropped where the format has no pair)", 0, "MMA_PACK")
    on_wgmma_v1: int = knob("WG", "read the wgmma GEMM's wgmma_v1 layout (the int8 default), not gemv_mma_v1", 0,
                            "MMA_WG")
    two_groups_per_tile: int = knob("G32", "with WG: groups of 32, two parameter sets per 64-k tile (set by the "
                                           "host)", 0, "MMA_G32")
    gathers_x: int = knob("PERM", "act-order: the kernel reads x through the layer's permutation (set by the host)",
                          0, "MMA_PERM")
    reads_rows_v1: int = knob("ROWS", "int8 codes and parameters read from rows_v1 (a weight kept there)", 0,
                              "MMA_ROWS")

    def build_defines(self, bits: int, act: int, scl: int, mode: int, mb: int, pair_packs: bool) -> dict:
        """NVRTC -D macros of one gemv_mma.cu instantiation; pair_packs: the format has a 16-bit parameter pair
        (PACK applies). DEFER, PERM, EARLY, RT > 1, MINB > 1, PACK, ROWS and WG only appear when set, so the earlier
        compile keys stay."""
        self.check_core_keys("tensor-core GEMV")
        d = {"MMA_BITS": bits, "MMA_ACT": act, "MMA_SCL": scl, "MMA_MODE": mode, "MMA_MB": mb,
             "MMA_U": self.k_tiles_in_flight, "MMA_RG": self.row_groups, "MMA_KS": self.k_slices,
             "MMA_PF": self.prefetch}
        if self.deferred_scale:
            d["MMA_DEFER"] = self.deferred_scale
        if self.gathers_x:
            d["MMA_PERM"] = 1
        if self.early_loads:
            d["MMA_EARLY"] = 1
        if self.row_tiles_per_warp > 1:
            d["MMA_RT"] = self.row_tiles_per_warp
        if self.min_blocks_per_sm > 1:
            d["MMA_MINB"] = self.min_blocks_per_sm
        if self.packed_params and pair_packs:
            d["MMA_PACK"] = 1
        if self.reads_rows_v1:
            d["MMA_ROWS"] = 1
        elif self.on_wgmma_v1:
            d["MMA_WG"] = 1
            if self.two_groups_per_tile:
                d["MMA_G32"] = 1
        return d
