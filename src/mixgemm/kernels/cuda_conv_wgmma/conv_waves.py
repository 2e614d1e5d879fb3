"""The implicit-GEMM conv's wave model: the tile and cluster split for a layer the conv sweep never measured, at
small M with a long K (a GPU table's ``conv_waves`` section, mixgemm.tuning).

Why a model and not one rule: at batch 1 the output pixels (M) are few and K = Kh * Kw * Ci is long, so the CTA
count, not the tile's efficiency, decides. One fixed tile cannot fit both a ResNet stage-4 layer (M 49, N 512: 8 K
slices of one 56-pixel tile fill the GPU) and a diffusion UNet layer (M 256, N 1280: the same tile makes 800 CTAs,
six waves, where 128 x 128 tiles split 4 ways make 80). The model ranks a small grid of tiles (the 56-pixel
small-M tile, and BM 64 / 128 / 256 pixels x 64 / 128 output channels x cluster splits 1, 2, 4, 8) by

    waves x (launch + k-tiles x max(floor, tile MACs / rate) + stages x stage cost) + reduction

with waves = ceil(CTAs / SMs) (one CTA an SM: the tiles' rings take most of the shared memory), k-tiles the 64-k
tiles of one K slice, stages the ring stages they take (KT k-tiles a stage), and the cluster's reduction of its
split partials through distributed shared memory growing with (split - 1) x the tile's output. Only clustered
splits: a workspace split-K adds a kernel, which at these sizes costs more than it saves.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mixgemm.tuning as tuning
from mixgemm.formats.layouts import K_TILE

PIXEL_TILES = (64, 128, 256)  # BM of the grid (the wgmma N)
SPLITS = (1, 2, 4, 8)  # cluster split-K factors (gemm_wgmma.CLUSTER_MAX: a cluster holds at most 8 CTAs)
MIN_CTAS = 16  # fewer CTAs than this leave the GPU idle whatever the tile (outside the measured grid)
MAX_WAVES = 4  # more CTAs than this many waves: outside the measured grid


def small_m_tile(k: int) -> dict:
    """The batch-1 tile of the rules (conv_wgmma.default_conv_config), which the model ranks with the grid: 8 K
    slices of one 56-pixel tile as one cluster, 4 k-tiles a stage, with the producer warp when a slice holds more
    than one stage (it keeps the ring full)."""
    cfg = {"BM": 56, "NWG": 1, "STAGES": 3, "KT": 4, "SPLIT": 8, "CLUSTER": 1}
    if k > 32 * K_TILE:
        cfg["WS"] = 1
    return cfg


@dataclass(frozen=True)
class ConvWaves:
    """A GPU's ``conv_waves`` section: the model's constants and where it applies."""

    launch_us: float  # a CTA's fixed time: launch, prologue, epilogue
    k_tile_floor_us: float  # the least time a CTA spends on one 64-k tile (its loads' latency through the ring)
    macs_per_us: float  # one SM's tensor-core rate (multiply-adds per microsecond)
    stage_us: float  # a ring stage's fixed cost (barrier, fence, bookkeeping)
    reduce_us: float  # the cluster reduction, per (split - 1) x pixel tile x 64 output channels
    max_m: int  # the model decides up to this many output pixels ...
    min_k: int  # ... on layers of at least this K (the range it was measured over)
    source: str

    @classmethod
    def parse(cls, raw: dict, where: str) -> ConvWaves:
        source = tuning.source_of(raw, where, "the conv_waves section")
        try:
            out = cls(float(raw["launch_us"]), float(raw["k_tile_floor_us"]), float(raw["macs_per_us"]),
                      float(raw["stage_us"]), float(raw["reduce_us"]), int(raw["max_m"]), int(raw["min_k"]), source)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: conv_waves needs launch_us, k_tile_floor_us, macs_per_us, stage_us, reduce_us, "
                             f"max_m and min_k ({type(e).__name__}: {e})") from None
        if out.macs_per_us <= 0 or min(out.launch_us, out.k_tile_floor_us, out.stage_us, out.reduce_us) < 0:
            raise ValueError(f"{where}: conv_waves constants must be >= 0 (macs_per_us > 0)")
        return out

    def covers(self, m: int, k: int) -> bool:
        return m <= self.max_m and k >= self.min_k

    def estimate_us(self, m: int, n: int, k: int, cfg: dict, sms: int) -> float:
        """The model's time for tile ``cfg`` on the GEMM view (M pixels, N output channels, K)."""
        bm, nwg, split, kt = cfg["BM"], cfg.get("NWG", 2), cfg.get("SPLIT", 1), cfg.get("KT", 1)
        ctas = math.ceil(m / bm) * math.ceil(n / (64 * nwg)) * split
        k_tiles = math.ceil(math.ceil(k / K_TILE) / split)
        per_tile = max(self.k_tile_floor_us, bm * 64 * nwg * K_TILE / self.macs_per_us)
        cta_us = (self.launch_us + k_tiles * per_tile + math.ceil(k_tiles / kt) * self.stage_us
                  + (split - 1) * bm * nwg * self.reduce_us)
        return math.ceil(ctas / sms) * cta_us

    def choose(self, m: int, n: int, k: int, sms: int) -> dict | None:
        """The tile the model ranks first for the layer (None: no candidate in the measured range)."""
        cands = candidates(m, n, k, sms)
        return min(cands, key=lambda c: self.estimate_us(m, n, k, c, sms)) if cands else None


def candidates(m: int, n: int, k: int, sms: int) -> list[dict]:
    """The tiles the model ranks, in the order ties keep: the small-M tile, then the grid; each with at least two
    k-tiles per K slice and MIN_CTAS .. MAX_WAVES waves of CTAs."""
    grid = [small_m_tile(k)] + [
        {"BM": bm, "NWG": nwg, "STAGES": 4, "KT": 2 if bm <= 128 else 1, **({"SPLIT": s, "CLUSTER": 1} if s > 1
                                                                            else {})}
        for bm in PIXEL_TILES for nwg in (1, 2) for s in SPLITS]
    out = []
    for cfg in grid:
        nwg, split = cfg["NWG"], cfg.get("SPLIT", 1)
        ctas = math.ceil(m / cfg["BM"]) * math.ceil(n / (64 * nwg)) * split
        if (nwg == 2 and n <= 64) or math.ceil(k / K_TILE) < 2 * split or not MIN_CTAS <= ctas <= MAX_WAVES * sms:
            continue
        out.append(cfg)
    return out


@functools.cache
def _table_waves(table_name: str) -> ConvWaves | None:
    raw = tuning.load_table(table_name).get("conv_waves")
    return None if raw is None else ConvWaves.parse(raw, f"{table_name}.json conv_waves")


def conv_waves_of(device) -> ConvWaves | None:
    """The wave model of a DeviceInfo's tuning table (None where the table has no ``conv_waves`` section)."""
    return _table_waves(device.table["name"])
