"""The CUDA-core GEMV on wgmma_v1's config (gemv_wg_simt.cu): what each short key means and the SIMT_* macro it sets."""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.kernels.kernel_config import KernelConfig, knob


@dataclass(frozen=True)
class GemvWgSimtConfig(KernelConfig):
    # macros the problem (or another build) sets, not the config
    derived = {"SIMT_BITS": "weight bits", "SIMT_ACT": "activation dtype code (fp16 0, bf16 1)",
               "SIMT_SCL": "scale dtype code", "SIMT_MODE": "sym 0, zero_point 1, offset 2",
               "SIMT_ROUTED": "the experts' routed GEMV build (kernels/cuda/routed_gemv.py), not this entry's"}

    row_tiles_per_warp: int = knob("RT", "16-row tiles per warp sharing one fetch of x (a divisor of the 8 row tiles "
                                         "stored together)", 1, "SIMT_RT", always=True)
    k_tiles_in_flight: int | None = knob("U", "64-k tiles each lane loads per step and row tile (the step's unroll)",
                                         None, "SIMT_U", always=True)
    prefetch: int = knob("PF", "register double buffering: the next step's weights and parameters in flight during "
                               "this step's math", 0, "SIMT_PF", always=True)
    k_slices: int | None = knob("KS", "warps of a block along K, each summing a slice of every row tile (reduced in "
                                      "shared memory)", None, "SIMT_KS", always=True)
    row_groups: int | None = knob("RG", "warps of a block along N, each on its own row tiles", None, "SIMT_RG",
                                  always=True)
    packed_params: int = knob("PACK", "a zero point's / offset's 16-bit (scale, second) pair kept in one register "
                                      "(dropped where the format has no pair)", 0, "SIMT_PACK")
    min_blocks_per_sm: int = knob("MINB", "blocks per SM the registers must allow (launch bounds; 0: none)", 0,
                                  "SIMT_MINB")
    two_groups_per_tile: int = knob("G32", "groups of 32: two parameter sets per 64-k tile (set by the host)", 0,
                                    "SIMT_G32")
    serves_blocks_per_sm: int = knob("BPS", "a measured tile's bound: the blocks per SM up to which it serves its "
                                             "bucket (0: any; read by the tile rule, not the kernel)", 0)

    def build_defines(self, bits: int, act: int, scl: int, mode: int, pair_packs: bool) -> dict:
        """NVRTC -D macros of one gemv_wg_simt.cu instantiation; pair_packs: the format has a 16-bit parameter pair
        (PACK applies). PACK and MINB only appear when set, so the earlier compile keys stay."""
        self.check_core_keys("CUDA-core GEMV on wgmma_v1")
        d = {"SIMT_BITS": bits, "SIMT_ACT": act, "SIMT_SCL": scl, "SIMT_MODE": mode,
             "SIMT_G32": self.two_groups_per_tile, "SIMT_RT": self.row_tiles_per_warp,
             "SIMT_U": self.k_tiles_in_flight, "SIMT_RG": self.row_groups, "SIMT_KS": self.k_slices,
             "SIMT_PF": self.prefetch}
        if self.packed_params and pair_packs:
            d["SIMT_PACK"] = 1
        if self.min_blocks_per_sm:
            d["SIMT_MINB"] = self.min_blocks_per_sm
        return d
