"""The CUDA-core GEMV's M = 1 tile from the layer's arithmetic: a step-cost model over its lanes-per-row tiles.

A block of gemv.cu is 8 warps, RG row groups x KS k-slices; a warp's lanes form 32 / LW groups of R rows each, so
P = LW x KS lanes share a row and each walks ceil(kc / P) of its kc 16-byte chunks, U chunks a step (one round trip
to memory the warp waits for). Blocks of gemv.tile_rows rows cover N, and an SM holds as many blocks at once as the
tile's registers leave room for. The model counts what the warps wait for:

    cost = rounds x (steps x c[R, U, LW] + d)

rounds = ceil(blocks / (resident blocks per SM x SMs)), steps = ceil(ceil(kc / P) / U), c the time of one step of
that tile class (its bytes in flight and its math) and d a round's fixed part (start, k-slice reduction, stores).
c and d are measured per GPU and weight family (tuning.gemv_steps); the tile of least cost is the rule for layers
no measured bucket serves. Why a model and not more buckets: the best tile follows K (the steps a row takes) and N
(the rounds its blocks take) together, so a bucket measured on one layer often mis-serves its neighbours, and a shape
outside the measured list falls to whatever rule is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from mixgemm.tuning.gemv_steps import StepCosts

WARPS = 8  # warps per block (gemv.WARPS)
LANE_WIDTHS = (32, 16, 8)  # the lane widths the model chooses from (gemv.cu GEMV_LW; 4 is legal, never measured to win)
K_SLICES = (1, 2, 4, 8)
ROWS = (2, 4)
UNROLLS = (1, 2)

# Registers per thread of gemv.cu at M = 1 with fp16 activations (NVRTC 13.0, sm_90, no PF / XS / ZSUM: the model's
# tiles run without ZSUM), by (bits, mode) and (R, U); LW and KS do not change them (over the whole lane grid LW and KS
# moved them by one register at most). tests/kernels/test_gemv_steps.py checks the resident blocks they give against
# the cubins.
REGISTERS = {
    (4, "sym"): {(2, 1): 40, (2, 2): 48, (4, 1): 64, (4, 2): 75},
    (4, "zero_point"): {(2, 1): 48, (2, 2): 59, (4, 1): 73, (4, 2): 101},
    (4, "offset"): {(2, 1): 48, (2, 2): 64, (4, 1): 64, (4, 2): 80},
    (8, "sym"): {(2, 1): 40, (2, 2): 40, (4, 1): 63, (4, 2): 73},
    (8, "zero_point"): {(2, 1): 40, (2, 2): 48, (4, 1): 75, (4, 2): 82},
    (8, "offset"): {(2, 1): 40, (2, 2): 52, (4, 1): 64, (4, 2): 80},
}


@dataclass(frozen=True)
class LaneTile:
    """One M = 1 tile of the CUDA-core GEMV: R rows per lane group, U chunks a step, KS k-slices, LW lanes per row."""

    R: int
    U: int
    KS: int
    LW: int

    def config(self) -> dict:
        """gemv.choose_config's keys (RG = 8 warps / KS, no register double buffering); LW only where it is not 32,
        as gemv's optional keys appear only when set."""
        cfg = {"R": self.R, "U": self.U, "RG": WARPS // self.KS, "KS": self.KS, "PF": 0}
        return cfg if self.LW == 32 else {**cfg, "LW": self.LW}

    @property
    def lanes_per_row(self) -> int:
        return self.LW * self.KS

    @property
    def rows_per_block(self) -> int:
        return WARPS // self.KS * self.R * (32 // self.LW)  # gemv.tile_rows

    @property
    def step_class(self) -> tuple[int, int, int]:
        return self.R, self.U, self.LW


def lane_tiles(kc: int) -> list[LaneTile]:
    """The tiles the model chooses from for a row of kc chunks: LW 32 / 16 / 8 x KS 1 / 2 / 4 / 8 x U 1 / 2 x R 2 /
    4, where every lane group of every k-slice gets a chunk (kc >= LW x KS), and the whole-warp rows (LW 32, KS 1) on
    any row: on rows shorter than a warp (int4 K = 896: 28 chunks) they were the fastest measured, 1.5-1.9x ahead of
    the narrower lane groups."""
    return [LaneTile(r, u, ks, lw) for lw in LANE_WIDTHS for ks in K_SLICES for u in UNROLLS for r in ROWS
            if kc >= lw * ks or (kc > 0 and lw == 32 and ks == 1)]


def resident_blocks(registers: int, warps: int = WARPS) -> int:
    """Blocks of ``warps`` warps one sm_90 SM holds at once with this many registers per thread: registers allocated
    per warp in units of 256 of the SM's 65536, at most 64 warps and 32 blocks."""
    return max(1, min(32, 64 // warps, 65536 // (-(-registers // 8) * 8 * 32) // warps))


def register_family(bits: int, mode: str) -> tuple[int, str]:
    """REGISTERS' key for a weight's build: bit width and mode."""
    key = (bits, mode)
    if key not in REGISTERS:
        raise ValueError(f"no register counts of the CUDA-core GEMV for {bits}-bit {mode} weights")
    return key


@dataclass(frozen=True)
class TileShape:
    """What the model counts for one tile on one layer: rounds of resident blocks and serial steps per round."""

    rounds: int
    steps: int


def tile_shape(tile: LaneTile, n: int, kc: int, bits: int, mode: str, num_sms: int) -> TileShape:
    """The rounds and steps of ``tile`` on N rows of kc chunks: its blocks over the SMs' resident slots (from the
    build's registers), and ceil(ceil(kc / lanes per row) / U) steps a lane waits for."""
    blocks = -(-n // tile.rows_per_block)
    regs = REGISTERS[register_family(bits, mode)][(tile.R, tile.U)]
    per_round = resident_blocks(regs) * num_sms
    per_lane = -(-kc // tile.lanes_per_row)
    return TileShape(-(-blocks // per_round), -(-per_lane // tile.U))


def ranked_tiles(n: int, kc: int, bits: int, mode: str, num_sms: int, costs: StepCosts) -> list[LaneTile]:
    """lane_tiles by modelled cost, cheapest first (ties: lane_tiles' order)."""
    return sorted(lane_tiles(kc), key=lambda t: costs.cost(tile_shape(t, n, kc, bits, mode, num_sms), t))


def cheapest_tile(n: int, kc: int, bits: int, mode: str, num_sms: int, costs: StepCosts) -> LaneTile | None:
    """The tile of least modelled cost (ties: the first of lane_tiles' order), None when no tile fits the row."""
    tiles = ranked_tiles(n, kc, bits, mode, num_sms, costs)
    return tiles[0] if tiles else None


# ---- the CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu, a compacted weight's M = 1 call) ----
# The same model over that kernel's tiles: a warp owns RT 16-row tiles, KS warps split K, RG row groups a block (RG x
# KS warps), U 64-k tiles a step, PF double buffering; a lane waits ceil(ceil(Kt / KS) / U) steps, and the blocks of
# RT x RG row tiles take rounds of the SMs' resident slots. The tile classes are (RT, U, PF).

# (RT, U, PF) families of the tile space: the gemv_wg_simt.cu grid that tools/bench/gemv_dispatch.py --simt-only times
WG_SIMT_CLASSES = ((1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 2, 1), (2, 1, 1), (2, 2, 0), (2, 2, 1), (4, 1, 1), (4, 2, 0))
WG_SIMT_K_SLICES = (2, 4, 8, 16, 32)

# Registers per thread of each gemv_wg_simt.cu build of the tile space at M = 1 with fp16 scales (NVRTC 13.0, sm_90, the
# GPUs' compiler), by (bits, mode, activation: 0 fp16 / 1 bf16, groups of 32: 0 / 1, SIMT_G32) and (RT, U, PF, KS, RG);
# zero point and offset with PACK where PF is on, as the dispatcher runs them
# (kernels.cuda_gemv_wg_simt.host.wg_simt_packs). Within one (RT, U, PF) class they differ by up to 20 with KS and RG,
# which moves the resident blocks the rounds count (the model fitted with each build's own count chose 1.010x / 1.017x
# the fastest tile's time on the H100 sweep, with each class's largest count 1.016x / 1.027x); bf16 x (the exact-fp16
# conversion) moves 6-17 of the 57 tiles' resident warps, groups of 32 (GGUF blocks) 28-36 against groups of 128, bf16
# scales at most 2 (not kept: the model counts fp16 scales' builds). tests/kernels/test_gemv_steps.py checks the table
# covers the space and, where this machine's NVRTC is 13.0, matches it. Source: tools/bench/wg_simt_fit.py --registers
# (any machine with NVRTC 13.0; no GPU).
WG_SIMT_REGISTERS = {
    (4, "sym", 0, 0): {
        (1, 1, 0, 2, 2): 45, (1, 1, 0, 2, 4): 45, (1, 1, 0, 4, 1): 40, (1, 1, 0, 4, 2): 45, (1, 1, 0, 8, 1): 40,
        (1, 1, 0, 16, 1): 46, (1, 1, 0, 32, 1): 60, (1, 1, 1, 2, 2): 54, (1, 1, 1, 2, 4): 61, (1, 1, 1, 4, 1): 54,
        (1, 1, 1, 4, 2): 61, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 46, (1, 1, 1, 32, 1): 48, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 48, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 48, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 51,
        (1, 2, 0, 32, 1): 49, (1, 2, 1, 2, 2): 56, (1, 2, 1, 2, 4): 63, (1, 2, 1, 4, 1): 55, (1, 2, 1, 4, 2): 63,
        (1, 2, 1, 8, 1): 63, (1, 2, 1, 16, 1): 63, (2, 1, 1, 2, 2): 62, (2, 1, 1, 2, 4): 62, (2, 1, 1, 4, 1): 62,
        (2, 1, 1, 4, 2): 62, (2, 1, 1, 8, 1): 62, (2, 1, 1, 16, 1): 64, (2, 2, 0, 2, 2): 63, (2, 2, 0, 2, 4): 63,
        (2, 2, 0, 4, 1): 64, (2, 2, 0, 4, 2): 63, (2, 2, 0, 8, 1): 64, (2, 2, 0, 16, 1): 64, (2, 2, 1, 2, 2): 95,
        (2, 2, 1, 2, 4): 93, (2, 2, 1, 4, 1): 95, (2, 2, 1, 4, 2): 93, (2, 2, 1, 8, 1): 93, (2, 2, 1, 16, 1): 95,
        (4, 1, 1, 2, 2): 93, (4, 1, 1, 2, 4): 94, (4, 1, 1, 4, 1): 93, (4, 1, 1, 4, 2): 94, (4, 1, 1, 8, 1): 94,
        (4, 1, 1, 16, 1): 96, (4, 2, 0, 2, 2): 80, (4, 2, 0, 2, 4): 95, (4, 2, 0, 4, 1): 96, (4, 2, 0, 4, 2): 95,
        (4, 2, 0, 8, 1): 97, (4, 2, 0, 16, 1): 100,
    },
    (8, "sym", 0, 0): {
        (1, 1, 0, 2, 2): 47, (1, 1, 0, 2, 4): 47, (1, 1, 0, 4, 1): 48, (1, 1, 0, 4, 2): 47, (1, 1, 0, 8, 1): 40,
        (1, 1, 0, 16, 1): 52, (1, 1, 0, 32, 1): 46, (1, 1, 1, 2, 2): 48, (1, 1, 1, 2, 4): 48, (1, 1, 1, 4, 1): 48,
        (1, 1, 1, 4, 2): 48, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 53, (1, 1, 1, 32, 1): 53, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 48, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 48, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 59,
        (1, 2, 0, 32, 1): 58, (1, 2, 1, 2, 2): 64, (1, 2, 1, 2, 4): 64, (1, 2, 1, 4, 1): 72, (1, 2, 1, 4, 2): 64,
        (1, 2, 1, 8, 1): 64, (1, 2, 1, 16, 1): 74, (2, 1, 1, 2, 2): 79, (2, 1, 1, 2, 4): 79, (2, 1, 1, 4, 1): 79,
        (2, 1, 1, 4, 2): 79, (2, 1, 1, 8, 1): 79, (2, 1, 1, 16, 1): 80, (2, 2, 0, 2, 2): 72, (2, 2, 0, 2, 4): 77,
        (2, 2, 0, 4, 1): 80, (2, 2, 0, 4, 2): 77, (2, 2, 0, 8, 1): 79, (2, 2, 0, 16, 1): 84, (2, 2, 1, 2, 2): 124,
        (2, 2, 1, 2, 4): 123, (2, 2, 1, 4, 1): 120, (2, 2, 1, 4, 2): 123, (2, 2, 1, 8, 1): 122, (2, 2, 1, 16, 1): 121,
        (4, 1, 1, 2, 2): 126, (4, 1, 1, 2, 4): 126, (4, 1, 1, 4, 1): 126, (4, 1, 1, 4, 2): 126, (4, 1, 1, 8, 1): 126,
        (4, 1, 1, 16, 1): 125, (4, 2, 0, 2, 2): 123, (4, 2, 0, 2, 4): 123, (4, 2, 0, 4, 1): 122, (4, 2, 0, 4, 2): 123,
        (4, 2, 0, 8, 1): 121, (4, 2, 0, 16, 1): 125,
    },
    (4, "zero_point", 0, 0): {
        (1, 1, 0, 2, 2): 39, (1, 1, 0, 2, 4): 39, (1, 1, 0, 4, 1): 40, (1, 1, 0, 4, 2): 39, (1, 1, 0, 8, 1): 40,
        (1, 1, 0, 16, 1): 50, (1, 1, 0, 32, 1): 50, (1, 1, 1, 2, 2): 56, (1, 1, 1, 2, 4): 48, (1, 1, 1, 4, 1): 56,
        (1, 1, 1, 4, 2): 60, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 50, (1, 1, 1, 32, 1): 50, (1, 2, 0, 2, 2): 48,
        (1, 2, 0, 2, 4): 48, (1, 2, 0, 4, 1): 55, (1, 2, 0, 4, 2): 48, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 51,
        (1, 2, 0, 32, 1): 53, (1, 2, 1, 2, 2): 56, (1, 2, 1, 2, 4): 63, (1, 2, 1, 4, 1): 56, (1, 2, 1, 4, 2): 63,
        (1, 2, 1, 8, 1): 63, (1, 2, 1, 16, 1): 63, (2, 1, 1, 2, 2): 64, (2, 1, 1, 2, 4): 64, (2, 1, 1, 4, 1): 64,
        (2, 1, 1, 4, 2): 64, (2, 1, 1, 8, 1): 64, (2, 1, 1, 16, 1): 64, (2, 2, 0, 2, 2): 64, (2, 2, 0, 2, 4): 64,
        (2, 2, 0, 4, 1): 72, (2, 2, 0, 4, 2): 64, (2, 2, 0, 8, 1): 78, (2, 2, 0, 16, 1): 76, (2, 2, 1, 2, 2): 95,
        (2, 2, 1, 2, 4): 104, (2, 2, 1, 4, 1): 95, (2, 2, 1, 4, 2): 104, (2, 2, 1, 8, 1): 104, (2, 2, 1, 16, 1): 106,
        (4, 1, 1, 2, 2): 96, (4, 1, 1, 2, 4): 98, (4, 1, 1, 4, 1): 96, (4, 1, 1, 4, 2): 98, (4, 1, 1, 8, 1): 98,
        (4, 1, 1, 16, 1): 128, (4, 2, 0, 2, 2): 127, (4, 2, 0, 2, 4): 128, (4, 2, 0, 4, 1): 128, (4, 2, 0, 4, 2): 128,
        (4, 2, 0, 8, 1): 128, (4, 2, 0, 16, 1): 128,
    },
    (4, "sym", 1, 0): {
        (1, 1, 0, 2, 2): 40, (1, 1, 0, 2, 4): 40, (1, 1, 0, 4, 1): 40, (1, 1, 0, 4, 2): 40, (1, 1, 0, 8, 1): 40,
        (1, 1, 0, 16, 1): 48, (1, 1, 0, 32, 1): 49, (1, 1, 1, 2, 2): 54, (1, 1, 1, 2, 4): 48, (1, 1, 1, 4, 1): 54,
        (1, 1, 1, 4, 2): 48, (1, 1, 1, 8, 1): 47, (1, 1, 1, 16, 1): 47, (1, 1, 1, 32, 1): 48, (1, 2, 0, 2, 2): 55,
        (1, 2, 0, 2, 4): 48, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 48, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 56,
        (1, 2, 0, 32, 1): 49, (1, 2, 1, 2, 2): 56, (1, 2, 1, 2, 4): 64, (1, 2, 1, 4, 1): 56, (1, 2, 1, 4, 2): 64,
        (1, 2, 1, 8, 1): 64, (1, 2, 1, 16, 1): 64, (2, 1, 1, 2, 2): 63, (2, 1, 1, 2, 4): 63, (2, 1, 1, 4, 1): 63,
        (2, 1, 1, 4, 2): 63, (2, 1, 1, 8, 1): 63, (2, 1, 1, 16, 1): 64, (2, 2, 0, 2, 2): 63, (2, 2, 0, 2, 4): 64,
        (2, 2, 0, 4, 1): 64, (2, 2, 0, 4, 2): 64, (2, 2, 0, 8, 1): 64, (2, 2, 0, 16, 1): 64, (2, 2, 1, 2, 2): 96,
        (2, 2, 1, 2, 4): 98, (2, 2, 1, 4, 1): 96, (2, 2, 1, 4, 2): 98, (2, 2, 1, 8, 1): 98, (2, 2, 1, 16, 1): 99,
        (4, 1, 1, 2, 2): 96, (4, 1, 1, 2, 4): 96, (4, 1, 1, 4, 1): 96, (4, 1, 1, 4, 2): 96, (4, 1, 1, 8, 1): 96,
        (4, 1, 1, 16, 1): 96, (4, 2, 0, 2, 2): 96, (4, 2, 0, 2, 4): 98, (4, 2, 0, 4, 1): 96, (4, 2, 0, 4, 2): 98,
        (4, 2, 0, 8, 1): 99, (4, 2, 0, 16, 1): 127,
    },
    (8, "sym", 1, 0): {
        (1, 1, 0, 2, 2): 40, (1, 1, 0, 2, 4): 40, (1, 1, 0, 4, 1): 48, (1, 1, 0, 4, 2): 40, (1, 1, 0, 8, 1): 40,
        (1, 1, 0, 16, 1): 51, (1, 1, 0, 32, 1): 49, (1, 1, 1, 2, 2): 56, (1, 1, 1, 2, 4): 48, (1, 1, 1, 4, 1): 56,
        (1, 1, 1, 4, 2): 48, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 55, (1, 1, 1, 32, 1): 51, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 58, (1, 2, 0, 4, 1): 64, (1, 2, 0, 4, 2): 58, (1, 2, 0, 8, 1): 62, (1, 2, 0, 16, 1): 58,
        (1, 2, 0, 32, 1): 58, (1, 2, 1, 2, 2): 72, (1, 2, 1, 2, 4): 77, (1, 2, 1, 4, 1): 72, (1, 2, 1, 4, 2): 77,
        (1, 2, 1, 8, 1): 77, (1, 2, 1, 16, 1): 77, (2, 1, 1, 2, 2): 80, (2, 1, 1, 2, 4): 86, (2, 1, 1, 4, 1): 80,
        (2, 1, 1, 4, 2): 86, (2, 1, 1, 8, 1): 86, (2, 1, 1, 16, 1): 87, (2, 2, 0, 2, 2): 72, (2, 2, 0, 2, 4): 75,
        (2, 2, 0, 4, 1): 80, (2, 2, 0, 4, 2): 75, (2, 2, 0, 8, 1): 80, (2, 2, 0, 16, 1): 88, (2, 2, 1, 2, 2): 121,
        (2, 2, 1, 2, 4): 121, (2, 2, 1, 4, 1): 124, (2, 2, 1, 4, 2): 121, (2, 2, 1, 8, 1): 124, (2, 2, 1, 16, 1): 122,
        (4, 1, 1, 2, 2): 126, (4, 1, 1, 2, 4): 126, (4, 1, 1, 4, 1): 126, (4, 1, 1, 4, 2): 126, (4, 1, 1, 8, 1): 126,
        (4, 1, 1, 16, 1): 125, (4, 2, 0, 2, 2): 121, (4, 2, 0, 2, 4): 125, (4, 2, 0, 4, 1): 122, (4, 2, 0, 4, 2): 125,
        (4, 2, 0, 8, 1): 122, (4, 2, 0, 16, 1): 123,
    },
    (4, "zero_point", 1, 0): {
        (1, 1, 0, 2, 2): 39, (1, 1, 0, 2, 4): 39, (1, 1, 0, 4, 1): 39, (1, 1, 0, 4, 2): 39, (1, 1, 0, 8, 1): 39,
        (1, 1, 0, 16, 1): 40, (1, 1, 0, 32, 1): 51, (1, 1, 1, 2, 2): 56, (1, 1, 1, 2, 4): 48, (1, 1, 1, 4, 1): 56,
        (1, 1, 1, 4, 2): 48, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 48, (1, 1, 1, 32, 1): 48, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 48, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 48, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 51,
        (1, 2, 0, 32, 1): 53, (1, 2, 1, 2, 2): 56, (1, 2, 1, 2, 4): 63, (1, 2, 1, 4, 1): 59, (1, 2, 1, 4, 2): 63,
        (1, 2, 1, 8, 1): 63, (1, 2, 1, 16, 1): 63, (2, 1, 1, 2, 2): 64, (2, 1, 1, 2, 4): 64, (2, 1, 1, 4, 1): 64,
        (2, 1, 1, 4, 2): 64, (2, 1, 1, 8, 1): 64, (2, 1, 1, 16, 1): 64, (2, 2, 0, 2, 2): 72, (2, 2, 0, 2, 4): 64,
        (2, 2, 0, 4, 1): 72, (2, 2, 0, 4, 2): 64, (2, 2, 0, 8, 1): 74, (2, 2, 0, 16, 1): 90, (2, 2, 1, 2, 2): 96,
        (2, 2, 1, 2, 4): 99, (2, 2, 1, 4, 1): 96, (2, 2, 1, 4, 2): 99, (2, 2, 1, 8, 1): 99, (2, 2, 1, 16, 1): 100,
        (4, 1, 1, 2, 2): 127, (4, 1, 1, 2, 4): 127, (4, 1, 1, 4, 1): 127, (4, 1, 1, 4, 2): 127, (4, 1, 1, 8, 1): 127,
        (4, 1, 1, 16, 1): 128, (4, 2, 0, 2, 2): 128, (4, 2, 0, 2, 4): 127, (4, 2, 0, 4, 1): 127, (4, 2, 0, 4, 2): 127,
        (4, 2, 0, 8, 1): 128, (4, 2, 0, 16, 1): 127,
    },
    (4, "sym", 0, 1): {
        (1, 1, 0, 2, 2): 40, (1, 1, 0, 2, 4): 40, (1, 1, 0, 4, 1): 41, (1, 1, 0, 4, 2): 40, (1, 1, 0, 8, 1): 47,
        (1, 1, 0, 16, 1): 46, (1, 1, 0, 32, 1): 48, (1, 1, 1, 2, 2): 56, (1, 1, 1, 2, 4): 57, (1, 1, 1, 4, 1): 63,
        (1, 1, 1, 4, 2): 57, (1, 1, 1, 8, 1): 48, (1, 1, 1, 16, 1): 56, (1, 1, 1, 32, 1): 56, (1, 2, 0, 2, 2): 55,
        (1, 2, 0, 2, 4): 56, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 56, (1, 2, 0, 8, 1): 48, (1, 2, 0, 16, 1): 55,
        (1, 2, 0, 32, 1): 53, (1, 2, 1, 2, 2): 64, (1, 2, 1, 2, 4): 64, (1, 2, 1, 4, 1): 64, (1, 2, 1, 4, 2): 64,
        (1, 2, 1, 8, 1): 64, (1, 2, 1, 16, 1): 64, (2, 1, 1, 2, 2): 72, (2, 1, 1, 2, 4): 71, (2, 1, 1, 4, 1): 72,
        (2, 1, 1, 4, 2): 71, (2, 1, 1, 8, 1): 71, (2, 1, 1, 16, 1): 79, (2, 2, 0, 2, 2): 72, (2, 2, 0, 2, 4): 79,
        (2, 2, 0, 4, 1): 72, (2, 2, 0, 4, 2): 79, (2, 2, 0, 8, 1): 76, (2, 2, 0, 16, 1): 76, (2, 2, 1, 2, 2): 122,
        (2, 2, 1, 2, 4): 123, (2, 2, 1, 4, 1): 128, (2, 2, 1, 4, 2): 123, (2, 2, 1, 8, 1): 128, (2, 2, 1, 16, 1): 128,
        (4, 1, 1, 2, 2): 126, (4, 1, 1, 2, 4): 126, (4, 1, 1, 4, 1): 126, (4, 1, 1, 4, 2): 126, (4, 1, 1, 8, 1): 126,
        (4, 1, 1, 16, 1): 127, (4, 2, 0, 2, 2): 128, (4, 2, 0, 2, 4): 128, (4, 2, 0, 4, 1): 128, (4, 2, 0, 4, 2): 128,
        (4, 2, 0, 8, 1): 127, (4, 2, 0, 16, 1): 128,
    },
    (4, "offset", 0, 1): {
        (1, 1, 0, 2, 2): 48, (1, 1, 0, 2, 4): 48, (1, 1, 0, 4, 1): 48, (1, 1, 0, 4, 2): 48, (1, 1, 0, 8, 1): 48,
        (1, 1, 0, 16, 1): 56, (1, 1, 0, 32, 1): 49, (1, 1, 1, 2, 2): 62, (1, 1, 1, 2, 4): 47, (1, 1, 1, 4, 1): 62,
        (1, 1, 1, 4, 2): 47, (1, 1, 1, 8, 1): 47, (1, 1, 1, 16, 1): 58, (1, 1, 1, 32, 1): 58, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 58, (1, 2, 0, 4, 1): 59, (1, 2, 0, 4, 2): 58, (1, 2, 0, 8, 1): 60, (1, 2, 0, 16, 1): 57,
        (1, 2, 0, 32, 1): 56, (1, 2, 1, 2, 2): 72, (1, 2, 1, 2, 4): 64, (1, 2, 1, 4, 1): 72, (1, 2, 1, 4, 2): 64,
        (1, 2, 1, 8, 1): 64, (1, 2, 1, 16, 1): 64, (2, 1, 1, 2, 2): 79, (2, 1, 1, 2, 4): 79, (2, 1, 1, 4, 1): 79,
        (2, 1, 1, 4, 2): 79, (2, 1, 1, 8, 1): 79, (2, 1, 1, 16, 1): 78, (2, 2, 0, 2, 2): 68, (2, 2, 0, 2, 4): 64,
        (2, 2, 0, 4, 1): 72, (2, 2, 0, 4, 2): 64, (2, 2, 0, 8, 1): 80, (2, 2, 0, 16, 1): 75, (2, 2, 1, 2, 2): 128,
        (2, 2, 1, 2, 4): 128, (2, 2, 1, 4, 1): 128, (2, 2, 1, 4, 2): 128, (2, 2, 1, 8, 1): 128, (2, 2, 1, 16, 1): 126,
        (4, 1, 1, 2, 2): 128, (4, 1, 1, 2, 4): 128, (4, 1, 1, 4, 1): 128, (4, 1, 1, 4, 2): 128, (4, 1, 1, 8, 1): 128,
        (4, 1, 1, 16, 1): 127, (4, 2, 0, 2, 2): 128, (4, 2, 0, 2, 4): 128, (4, 2, 0, 4, 1): 128, (4, 2, 0, 4, 2): 128,
        (4, 2, 0, 8, 1): 126, (4, 2, 0, 16, 1): 126,
    },
    (8, "sym", 0, 1): {
        (1, 1, 0, 2, 2): 48, (1, 1, 0, 2, 4): 48, (1, 1, 0, 4, 1): 48, (1, 1, 0, 4, 2): 48, (1, 1, 0, 8, 1): 48,
        (1, 1, 0, 16, 1): 54, (1, 1, 0, 32, 1): 49, (1, 1, 1, 2, 2): 62, (1, 1, 1, 2, 4): 62, (1, 1, 1, 4, 1): 62,
        (1, 1, 1, 4, 2): 62, (1, 1, 1, 8, 1): 62, (1, 1, 1, 16, 1): 62, (1, 1, 1, 32, 1): 52, (1, 2, 0, 2, 2): 56,
        (1, 2, 0, 2, 4): 62, (1, 2, 0, 4, 1): 56, (1, 2, 0, 4, 2): 62, (1, 2, 0, 8, 1): 64, (1, 2, 0, 16, 1): 64,
        (1, 2, 0, 32, 1): 64, (1, 2, 1, 2, 2): 80, (1, 2, 1, 2, 4): 80, (1, 2, 1, 4, 1): 80, (1, 2, 1, 4, 2): 80,
        (1, 2, 1, 8, 1): 80, (1, 2, 1, 16, 1): 98, (2, 1, 1, 2, 2): 89, (2, 1, 1, 2, 4): 91, (2, 1, 1, 4, 1): 89,
        (2, 1, 1, 4, 2): 91, (2, 1, 1, 8, 1): 91, (2, 1, 1, 16, 1): 94, (2, 2, 0, 2, 2): 85, (2, 2, 0, 2, 4): 80,
        (2, 2, 0, 4, 1): 80, (2, 2, 0, 4, 2): 80, (2, 2, 0, 8, 1): 91, (2, 2, 0, 16, 1): 92, (2, 2, 1, 2, 2): 149,
        (2, 2, 1, 2, 4): 149, (2, 2, 1, 4, 1): 149, (2, 2, 1, 4, 2): 149, (2, 2, 1, 8, 1): 149, (2, 2, 1, 16, 1): 128,
        (4, 1, 1, 2, 2): 163, (4, 1, 1, 2, 4): 162, (4, 1, 1, 4, 1): 163, (4, 1, 1, 4, 2): 162, (4, 1, 1, 8, 1): 162,
        (4, 1, 1, 16, 1): 128, (4, 2, 0, 2, 2): 156, (4, 2, 0, 2, 4): 154, (4, 2, 0, 4, 1): 156, (4, 2, 0, 4, 2): 154,
        (4, 2, 0, 8, 1): 156, (4, 2, 0, 16, 1): 128,
    },
}


@dataclass(frozen=True)
class WgSimtStepTile:
    """One M = 1 tile of the CUDA-core GEMV on wgmma_v1: RT row tiles a warp, U k-tiles a step, PF double buffering,
    KS k-slices, RG row groups a block."""

    RT: int
    U: int
    PF: int
    KS: int
    RG: int

    def config(self) -> dict:
        return {"RT": self.RT, "U": self.U, "PF": self.PF, "KS": self.KS, "RG": self.RG}

    @property
    def step_class(self) -> tuple[int, int, int]:
        return self.RT, self.U, self.PF

    @property
    def warps(self) -> int:
        return self.KS * self.RG


def wg_simt_tiles(k_tiles: int) -> list[WgSimtStepTile]:
    """The tile space for a row of k_tiles 64-k tiles: the classes x KS 2..32 with at least two steps' worth of k-tiles
    a slice (k_tiles >= 2 KS U) x blocks of 4 or 8 warps (RG = warps / KS, at least 1); KS 32 (1024 threads, at most 64
    registers each) only for classes of at most two 512-byte pieces in flight (RT x U x (1 + PF) <= 2)."""
    out: list[WgSimtStepTile] = []
    for rt, u, pf in WG_SIMT_CLASSES:
        for ks in WG_SIMT_K_SLICES:
            if ks == 32 and rt * u * (1 + pf) > 2:
                continue
            for warps in (4, 8):
                t = WgSimtStepTile(rt, u, pf, ks, max(1, warps // ks))
                if k_tiles >= 2 * ks * u and t not in out:
                    out.append(t)
    return out


def wg_simt_tile_registers(tile: WgSimtStepTile, bits: int, mode: str, act: int = 0, g32: int = 0) -> int:
    """WG_SIMT_REGISTERS' count for a tile (act: 0 fp16 x, 1 bf16 x; g32: groups of 32)."""
    return WG_SIMT_REGISTERS[(bits, mode, act, g32)][(tile.RT, tile.U, tile.PF, tile.KS, tile.RG)]


def wg_simt_tile_shape(tile: WgSimtStepTile, n: int, k: int, bits: int, mode: str, num_sms: int,
                       act: int = 0, g32: int = 0) -> TileShape:
    """The rounds and steps of ``tile`` on a K x N layer: blocks of RT x RG 16-row tiles over the SMs' resident slots
    (the registers of the build for this activation dtype and group), ceil(ceil(Kt / KS) / U) steps a lane waits
    for."""
    kt, nt = -(-k // 64), -(-n // 16)
    blocks = -(-nt // (tile.RT * tile.RG))
    per_round = resident_blocks(wg_simt_tile_registers(tile, bits, mode, act, g32), tile.warps) * num_sms
    per_slice = -(-kt // tile.KS)
    return TileShape(-(-blocks // per_round), -(-per_slice // tile.U))


def cheapest_wg_simt_tile(n: int, k: int, bits: int, mode: str, num_sms: int, costs: StepCosts,
                          act: int = 0, g32: int = 0) -> WgSimtStepTile | None:
    """The tile of least modelled cost on a K x N layer (ties: wg_simt_tiles' order), None when none fits its K or the
    register table has no builds of this (bits, mode, act, g32)."""
    tiles = wg_simt_tiles(-(-k // 64))
    if not tiles or (bits, mode, act, g32) not in WG_SIMT_REGISTERS:
        return None
    return min(tiles, key=lambda t: costs.cost(wg_simt_tile_shape(t, n, k, bits, mode, num_sms, act, g32), t))
