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

WARPS = 8  # warps per block (gemv.WARPS)
LANE_WIDTHS = (32, 16, 8)  # the lane widths the model chooses from (gemv.cu GEMV_LW; 4 is legal, never measured to win)
K_SLICES = (1, 2, 4, 8)
ROWS = (2, 4)
UNROLLS = (1, 2)

# Registers per thread of gemv.cu at M = 1 with fp16 activations (NVRTC 13.0, sm_90, no PF / XS / ZSUM: the model's
# tiles run without ZSUM), by (bits, mode) and (R, U); LW and KS do not change them (over the whole lane grid LW and KS
# moved them by one register at most). tests/test_gemv_steps.py checks the resident blocks they give against the cubins.
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


@dataclass(frozen=True)
class StepCosts:
    """Fitted costs of one GPU and weight family: ``step`` {(R, U, LW): time of one step}, ``round`` a round's fixed
    part, in the same arbitrary unit (only their ratios choose), and where they came from."""

    step: dict
    round: float
    source: str

    def cost(self, shape: TileShape, tile: LaneTile) -> float:
        return shape.rounds * (shape.steps * self.step[tile.step_class] + self.round)


def ranked_tiles(n: int, kc: int, bits: int, mode: str, num_sms: int, costs: StepCosts) -> list[LaneTile]:
    """lane_tiles by modelled cost, cheapest first (ties: lane_tiles' order)."""
    return sorted(lane_tiles(kc), key=lambda t: costs.cost(tile_shape(t, n, kc, bits, mode, num_sms), t))


def cheapest_tile(n: int, kc: int, bits: int, mode: str, num_sms: int, costs: StepCosts) -> LaneTile | None:
    """The tile of least modelled cost (ties: the first of lane_tiles' order), None when no tile fits the row."""
    tiles = ranked_tiles(n, kc, bits, mode, num_sms, costs)
    return tiles[0] if tiles else None
