"""Tile and split-K of the wgmma GEMM from the wave count: a small cost model over the problem's arithmetic.

Why: a tile tuned on a big layer leaves a small one with a handful of CTAs (896 x 896 at M = 256: 7 CTAs of BM 256
on 132 SMs, 0.42x fp16 cuBLAS), and a split-K factor rounded to the SM count can spill one CTA past a wave (4096 x
6144 at M = 256: 48 tiles x 3 = 144 CTAs, two waves, 0.55x). Neither is a property of one shape, so neither is fixed
by a table entry: the choice follows from how many CTAs a tile makes, how many fit on the GPU at once and how long
each runs.

The model: a CTA runs ``kt_per`` 64-k steps. On its own an SM runs a step in ``step_us`` (latency-bound); when
``ctas_per_sm`` CTAs share it (small tiles, from their shared memory) each step costs ``shared_step_us`` of SM time.
The busiest SM holds q = ceil(CTAs / SMs) CTAs (for a cluster split of s CTAs: clusters over the clusters the GPU holds
at once, ``cluster_slots``, which the GPCs' SM counts make fewer than SMs / s) and runs them in ceil(q / ctas_per_sm)
rounds of max(kt_per * step_us, min(q, ctas_per_sm) * kt_per * shared_step_us), plus per round the cluster's
reduction ((s - 1) tile partials through distributed shared memory, ``reduce_us`` per 1024 output elements), plus
``launch_us`` once. The constants are measured per GPU (the tuning table's ``wgmma_waves`` section; fitted by
``python -m tools.bench.wgmma_fit`` to a ``tools.bench.wgmma --table --grid`` run) and the estimate only ranks
configs: the table's own tile is kept unless another is estimated ``margin`` times faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mixgemm.kernels.cuda_wgmma.gemm_wgmma import (
    CLUSTER_MAX,
    K_TILE,
    TAIL_SPLITS,
    TileKeys,
    fitted_stages,
    k_slices,
    output_tiles,
    stage_bytes,
    tail_rows,
)
from mixgemm.tuning import source_of

SM_SHARED_BYTES = 228 * 1024  # shared memory per SM on sm_90 (each resident block also reserves 1 KiB)
MAX_CTAS_PER_SM = 2  # the most co-resident CTAs measured; the register budget of larger counts was not checked


@dataclass(frozen=True)
class TileCost:
    """One candidate tile and its measured step times."""

    config: dict  # BM, NWG, STAGES, INFLIGHT, TMA, KT, GROUP_M
    step_us: float  # one 64-k step of a CTA alone on its SM
    shared_step_us: float  # SM time per step and CTA when ctas_per_sm CTAs share the SM

    @property
    def key(self) -> tuple[int, int]:
        return int(self.config["BM"]), int(self.config.get("NWG", 2))


@dataclass(frozen=True)
class StoreBound:
    """When a launch of one CTA per output tile is bound by its output stores (the ``persistent`` part of a GPU's
    ``wgmma_waves`` section). The CTAs of a wave run in step, so each wave's tiles reach their epilogue together and
    write their outputs at the copy bandwidth while no SM computes: measured on the H100 (W4 g128, N = 9728, M =
    16384, tools/bench/wgmma.py on a build of gemm_wgmma.cu without the stores), leaving the stores out took a wave
    from 14.3 to 12.0 us at K = 896 and from 5.3 to 2.5 us at K = 128 -- 2.3-2.7 us, about one wave's 8.7 MB of
    output at 3 TB/s (2.9 us).
    Persistent whole tiles (SK 2) keep those stores in flight under the next tile's main loop, but their loop costs
    a little more per step (no hardware balancing of the SMs), so they pay only where the stores are a large share of
    a wave: where ``store_share`` x the wave's main loop (steps x the tile's step_us) is at most the wave's output
    bytes over ``copy_bytes_per_us``, over at least ``min_waves`` waves of tiles (the persistent grid does not even out
    a partial last wave as the hardware's block scheduler and TAIL do)."""

    store_share: float
    copy_bytes_per_us: float
    min_waves: float
    source: str

    @classmethod
    def parse(cls, raw: dict, where: str) -> StoreBound:
        source = source_of(raw, where, "wgmma_waves.persistent")
        return cls(float(raw["store_share"]), float(raw["copy_bytes_per_us"]), float(raw["min_waves"]), source)

    def share(self, tile: TileCost, steps: int, sms: int, out_bytes: int = 2) -> float:
        """A wave's output store time over its main loop's time, for ``tile`` over ``steps`` 64-k steps."""
        bm, nwg = tile.key
        return sms * bm * 64 * nwg * out_bytes / self.copy_bytes_per_us / (steps * tile.step_us)


@dataclass(frozen=True)
class TokenTiles:
    """The token tile of a call the model leaves on the BM 256 x 128-row tile (the ``token_tiles`` part of a GPU's
    ``wgmma_waves`` section). That tile is sized by M alone, so a layer whose tiles make a partial last wave, or fewer
    CTAs than SMs, pays a whole round of 256-token CTAs for it (3072 x 3072 at M = 1024: 96 CTAs on 132 SMs; 896 x 4864:
    152 CTAs, two rounds of a 14-step K). The kernel takes any BM that is a multiple of 8, so from ``from_m`` the BM of
    the ``round_us`` list (the BM 256 tile's pipeline, one CTA per SM, no TAIL) whose ceil(ceil(M / BM) x column tiles /
    SMs) rounds cost least replaces 256 where it is estimated ``margin`` x faster. A round of BM tokens costs
    fixed + step x 64-k steps (fitted per weight width: int8 weights make a cheaper step at small BM, the int4
    dequantization a dearer one); where the BM 256 tile runs its partial wave as TAIL split-K clusters, that wave counts
    fixed + step x steps / split + ``tail_us`` (the tail launch and its reduction)."""

    from_m: int
    margin: float
    tail_us: float
    round_us: dict[int, dict[int, tuple[float, float]]]  # weight bits -> {BM: (fixed us, us per 64-k step)}
    source: str

    @classmethod
    def parse(cls, raw: dict, where: str) -> TokenTiles:
        source = source_of(raw, where, "wgmma_waves.token_tiles")
        costs = {}
        for bits, by_bm in raw["round_us"].items():
            if bits not in ("int4", "int8"):
                raise ValueError(f"{where}: token_tiles.round_us keys are 'int4' / 'int8', got {bits!r}")
            table = {int(b): (float(v["fixed_us"]), float(v["step_us"])) for b, v in by_bm.items()}
            if 256 not in table or any(b % 8 or not 8 <= b <= 256 or s <= 0 for b, (_, s) in table.items()):
                raise ValueError(f"{where}: token_tiles.round_us[{bits!r}] needs BM 256 and BM multiples of 8 in "
                                 "8..256 with step_us > 0")
            costs[int(bits[3:])] = table
        return cls(int(raw["from_m"]), float(raw["margin"]), float(raw["tail_us"]), costs, source)

    def estimate_us(self, m: int, n: int, k: int, bits: int, bm: int, tail: int, sms: int) -> float:
        """The rounds of BM-token CTAs (128 weight rows each) over K = k; ``tail`` > 0: the partial last wave after
        a whole one runs as TAIL clusters of that many k-slices. The launch, common to every BM, is left out."""
        fixed, step = self.round_us[bits][bm]
        steps = math.ceil(k / K_TILE)
        whole, part = divmod(output_tiles(m, n, bm, 2), sms)
        if tail and part and whole:
            return whole * (fixed + step * steps) + fixed + step * steps / tail + self.tail_us
        return (whole + (part > 0)) * (fixed + step * steps)


def token_tile(m: int, n: int, k: int, cfg: dict, bits: int, tt: TokenTiles, sms: int) -> tuple[dict, str] | None:
    """cfg with the BM ``tt`` ranks first and no TAIL, and the estimates behind it; None where cfg stays (below
    from_m, a tile other than the split-1 BM 256 x 128-row one, or no BM estimated margin x faster)."""
    table = tt.round_us.get(bits)
    if (table is None or m < tt.from_m or int(cfg["BM"]) != 256 or int(cfg.get("NWG", 2)) != 2
            or int(cfg.get("SPLIT", 1)) != 1 or int(cfg.get("CLUSTER", 0))
            or any(int(cfg.get(key, 0)) for key in ("SK", "SERIAL", "WS"))):
        return None
    tail = cfg.get("TAIL", 0)
    tail = int(tail) if tail != "auto" else 0
    t_base = tt.estimate_us(m, n, k, bits, 256, tail, sms)
    est = {bm: tt.estimate_us(m, n, k, bits, bm, 0, sms) for bm in table}
    best = min(sorted(est, reverse=True), key=est.get)  # ties: the larger BM
    t_best = est[best]
    if best == 256 or t_best * tt.margin > t_base:
        return None
    ctas = output_tiles(m, n, best, 2)
    return ({**cfg, "BM": best, "TAIL": 0}, f"token tile BM {best} ({ctas} CTAs, est. {t_best:.1f} us against BM 256's "
            f"{output_tiles(m, n, 256, 2)} CTAs{_tail_text(cfg)}, est. {t_base:.1f} us)")


@dataclass(frozen=True)
class WaveCost:
    """A GPU's ``wgmma_waves`` section (mixgemm.tuning): the tiles the model ranks and its constants."""

    tiles: tuple[TileCost, ...]
    launch_us: float
    reduce_us: float  # per (split - 1) x 1024 output elements of a tile, per round
    cluster_slots: dict  # split s -> clusters of s CTAs (one per SM) resident at once
    sms: int  # the SM count the slots were measured with
    from_m: int  # the model ranks configs from this M (the M it was measured over)
    margin: float  # the table's tile is kept unless another is estimated this many times faster
    source: str
    persistent: StoreBound | None = None  # when whole tiles run persistent (SK 2) with their stores in flight
    token_tiles: TokenTiles | None = None  # the BM of a chosen BM 256 tile from its rounds

    @classmethod
    def parse(cls, raw: dict, where: str) -> WaveCost:
        source = source_of(raw, where, "the wgmma_waves section")
        tiles = tuple(TileCost(dict(t["config"]), float(t["step_us"]), float(t["shared_step_us"]))
                      for t in raw["tiles"])
        slots = {int(s): int(v) for s, v in raw["cluster_slots"].items()}
        if not tiles or any(not 2 <= s <= CLUSTER_MAX for s in slots):
            raise ValueError(f"{where}: wgmma_waves needs tiles and cluster_slots for splits 2..{CLUSTER_MAX}")
        persistent = StoreBound.parse(raw["persistent"], where) if "persistent" in raw else None
        tokens = TokenTiles.parse(raw["token_tiles"], where) if "token_tiles" in raw else None
        return cls(tiles, float(raw["launch_us"]), float(raw["reduce_us"]), slots, int(raw["sms"]),
                   int(raw["from_m"]), float(raw["margin"]), source, persistent, tokens)

    def slots(self, split: int, sms: int) -> int:
        """Clusters of ``split`` CTAs resident at once on a GPU of ``sms`` SMs (scaled from the measured GPU)."""
        return max(1, self.cluster_slots[split] * sms // self.sms)


@dataclass(frozen=True)
class WeightBytes:
    """What the shared memory of a stage depends on (gemm_wgmma.stage_bytes)."""

    bits: int
    scale_bytes: int
    mode: str
    group32: bool


def ctas_per_sm(cfg: dict, w: WeightBytes, cap: int = MAX_CTAS_PER_SM) -> int:
    """CTAs of this tile one SM holds at once, from its shared memory (stages cut to fit, as the launch does), at most
    ``cap`` (what the registers allow is not known before compiling: the callers' measured bound)."""
    keys = TileKeys.of(cfg)
    sb = stage_bytes(keys.bm, keys.nwg, w.bits, w.scale_bytes, w.mode, w.group32, keys.ktile, keys.tma)
    threads = 128 * keys.nwg + 32 * keys.ws
    return max(1, min(cap, SM_SHARED_BYTES // (fitted_stages(keys, sb) * sb + 2048), 2048 // threads))


def split_steps(k: int, split: int, ktile: int) -> tuple[int, int]:
    """(k-slices, 64-k steps per slice) of a split-K launch over K = k, as the launch cuts it."""
    return k_slices(math.ceil(k / K_TILE), split, ktile)


def _rounds_us(tile: TileCost, cost: WaveCost, q: int, per_sm: int, steps: int, split: int) -> float:
    """The model's time of the busiest SM holding q CTAs of ``steps`` 64-k steps each, in clusters of ``split``."""
    bm, nwg = tile.key
    step = max(steps * tile.step_us, min(q, per_sm) * steps * tile.shared_step_us)
    reduce = cost.reduce_us * (split - 1) * bm * 64 * nwg / 1024 if split > 1 else 0.0
    return math.ceil(q / per_sm) * (step + reduce)


def tail_split(m: int, n: int, k: int, tile: TileCost, cost: WaveCost, sms: int) -> tuple[int, float] | None:
    """TAIL for a split-1 tile of one CTA per SM: (split, the model's time of the tail launch) for the split of
    TAIL_SPLITS the model ranks first, the partial last wave's tiles run as clusters of that many k-slices, all of
    them held at once (cluster_slots); None where there is no partial wave after a whole one, or no split fits.
    Why more than 2: a partial wave of few tiles leaves most SMs idle even as split-2 pairs, and splitting its K three
    or four ways keeps them busy where the slices stay long and every cluster fits at once (H100, W4 g128, whole
    tails against split 2: 13824x5120 M = 1024 213.4 against 234.5 us, 3584x4608 M = 1024 60.1 against 63.9; but
    2048x2304 M = 4096, 8 steps a slice, 81.2 against 70.3 -- which the reduction term ranks last)."""
    bm, nwg = tile.key
    ktile = int(tile.config.get("KT", 1))
    n0, _ = tail_rows(m, n, {**tile.config, "TAIL": 2, "SPLIT": 1, "SK": 0, "MINB": 1}, sms)
    if not n0:
        return None
    tail_tiles = output_tiles(m, n - n0, bm, nwg)
    best = None
    for s in TAIL_SPLITS:
        got, steps = split_steps(k, s, ktile)
        if got != s or steps < 2 * ktile or tail_tiles > cost.slots(s, sms):
            continue
        t = _rounds_us(tile, cost, 1, 1, steps, s)
        if best is None or t < best[1]:
            best = (s, t)
    return best


def estimate_us(m: int, n: int, k: int, tile: TileCost, split: int, per_sm: int, cost: WaveCost, sms: int) -> float:
    """The model's time of one call with ``tile`` and a cluster split of ``split`` (docstring above). A split-1 tile
    with TAIL "auto" runs the partial last wave as ``tail_split``'s clusters."""
    bm, nwg = tile.key
    ktile = int(tile.config.get("KT", 1))
    split, steps = split_steps(k, split, ktile)
    tiles = output_tiles(m, n, bm, nwg)
    if split > 1:
        q = math.ceil(tiles / (cost.slots(split, sms) * per_sm)) * per_sm
        return cost.launch_us + _rounds_us(tile, cost, q, per_sm, steps, split)
    if tile.config.get("TAIL") == "auto" and per_sm == 1:
        tail = tail_split(m, n, k, tile, cost, sms)
        if tail is not None:
            return cost.launch_us + _rounds_us(tile, cost, tiles // sms, 1, steps, 1) + tail[1]
    return cost.launch_us + _rounds_us(tile, cost, math.ceil(tiles / sms), per_sm, steps, 1)


def _splits(k: int, ktile: int) -> list[int]:
    out = []
    for s in range(1, 5):  # splits past 4 measured slower than a smaller tile on every layer of the sweep
        got, steps = split_steps(k, s, ktile)
        if got == s and (s == 1 or steps >= 2 * ktile):
            out.append(s)
    return out


@dataclass(frozen=True)
class WaveChoice:
    config: dict
    note: str  # the estimates behind the choice, for mixgemm.explain


def choose(m: int, n: int, k: int, base: dict, w: WeightBytes, cost: WaveCost, sms: int) -> WaveChoice | None:
    """The tile and cluster split the model ranks first for this problem, or None where it does not apply (M below
    ``from_m``, or a table config of a kind the model does not rank: stream-K, serial split-K, a producer warp).
    ``base``: the table's config for the problem's bucket; kept (its split set to 1) unless a candidate is estimated
    ``cost.margin`` times faster."""
    if m < cost.from_m or any(int(base.get(key, 0)) for key in ("SK", "SERIAL", "WS")):
        return None
    by_key = {t.key: t for t in cost.tiles}
    base_key = (int(base["BM"]), int(base.get("NWG", 2)))
    best = None
    for tile in cost.tiles:
        per_sm = ctas_per_sm(tile.config, w)
        for s in _splits(k, int(tile.config.get("KT", 1))):
            t = estimate_us(m, n, k, tile, s, per_sm, cost, sms)
            if best is None or t < best[0]:
                best = (t, tile, s)
    if best is None:
        return None
    t_best, tile, split = best
    t_base = None
    if base_key in by_key:
        base_tile = TileCost({**by_key[base_key].config, **base}, by_key[base_key].step_us,
                             by_key[base_key].shared_step_us)
        t_base = estimate_us(m, n, k, base_tile, 1, ctas_per_sm(base_tile.config, w), cost, sms)
        if t_base <= cost.margin * t_best:
            cfg = _with_tail({**base, "SPLIT": 1, "CLUSTER": 0}, m, n, k, base_tile, w, cost, sms)
            return _finish(WaveChoice(cfg, f"the table's tile, split 1{_tail_text(cfg)} (est. {t_base:.1f} us; "
                                           f"best other BM {tile.key[0]} NWG {tile.key[1]} split {split}, est. "
                                           f"{t_best:.1f} us)"), m, n, k, base_tile, w, cost, sms)
    cfg = {**tile.config, "SPLIT": split, "CLUSTER": int(split > 1)}
    if split == 1 and "TAIL" in base and tile.key == base_key:
        cfg = _with_tail({**cfg, "TAIL": base["TAIL"]}, m, n, k, tile, w, cost, sms)
    base_text = f"the table's tile est. {t_base:.1f} us" if t_base is not None else "the table's tile not modelled"
    return _finish(WaveChoice(cfg, f"BM {tile.key[0]} NWG {tile.key[1]} split {split}{_tail_text(cfg)} (est. "
                                   f"{t_best:.1f} us; {base_text})"), m, n, k, tile, w, cost, sms)


def _finish(choice: WaveChoice, m: int, n: int, k: int, tile: TileCost, w: WeightBytes, cost: WaveCost,
            sms: int) -> WaveChoice:
    """The choice with the token tile's BM where it moves one (TokenTiles), else as persistent whole tiles where its
    stores bind it (StoreBound): the token tile serves a few rounds, persistent tiles four waves or more."""
    if cost.token_tiles is not None:
        got = token_tile(m, n, k, choice.config, w.bits, cost.token_tiles, sms)
        if got is not None:
            return WaveChoice(got[0], f"{choice.note}; {got[1]}")
    return _persistent(choice, m, n, k, tile, w, cost, sms)


def _persistent(choice: WaveChoice, m: int, n: int, k: int, tile: TileCost, w: WeightBytes, cost: WaveCost,
                sms: int) -> WaveChoice:
    """The choice as persistent whole tiles (SK 2, no TAIL) where its output stores bind it (StoreBound)."""
    cfg, sb = choice.config, cost.persistent
    if (sb is None or int(cfg.get("SPLIT", 1)) != 1 or not int(cfg.get("TMA", 1)) or ctas_per_sm(cfg, w) != 1
            or output_tiles(m, n, *tile.key) < sb.min_waves * sms):
        return choice
    _, steps = split_steps(k, 1, int(cfg.get("KT", 1)))
    share = sb.share(tile, steps, sms)
    if share < sb.store_share:
        return choice
    return WaveChoice({**cfg, "SK": 2, "TAIL": 0}, f"{choice.note}; persistent whole tiles (SK 2): a wave's output "
                                                   f"stores take {share:.2f} of its main loop")


def _with_tail(cfg: dict, m: int, n: int, k: int, tile: TileCost, w: WeightBytes, cost: WaveCost, sms: int) -> dict:
    """cfg with TAIL "auto" made the split ``tail_split`` ranks first (0 where none applies)."""
    if cfg.get("TAIL") != "auto" or ctas_per_sm(cfg, w) != 1:
        return cfg
    got = tail_split(m, n, k, TileCost(cfg, tile.step_us, tile.shared_step_us), cost, sms)
    return {**cfg, "TAIL": got[0] if got is not None else 0}


def _tail_text(cfg: dict) -> str:
    return f", TAIL {cfg['TAIL']}" if cfg.get("TAIL") not in (None, 0, "auto") else ""


# ----------------------------------------------------------------------------------------------------- small M
# At M <= 16 one BM 16 tile covers every token and the GEMM streams its weights with few FLOPs: a CTA's 64-k step is
# latency-bound (its TMA wait, the dequantization into registers, the wgmma and its wait), so the time follows the
# steps each CTA runs and how many CTAs run at once, not the tile's FLOP rate. A cluster split of s CTAs per output tile
# cuts each CTA's steps by s for one reduction through distributed shared memory, until the CTAs no longer fit at once.
# The model (constants per weight bit width, fitted per GPU): launch_us + rounds * (steps * step_us + split_us [s > 1] +
# steps * (q - 1) * shared_step_us), with rounds = ceil(CTAs / CTAs held at once) -- clusters of s held at once (the
# occupancy query's count, from the CTAs per SM that the tile's registers and shared memory allow) times s -- and q the
# CTAs that share an SM (at most that many). Splits of 3 are left out: clusters of 3 pack the GPCs worse and measured
# slower than 2 or 4 on every layer of the sweep.


@dataclass(frozen=True)
class SmallMCoef:
    launch_us: float
    step_us: float  # one 64-k step of a CTA, per round
    split_us: float  # the cluster's reduction and its band stores, per round
    shared_step_us: float  # per step and further CTA on the same SM


@dataclass(frozen=True)
class SmallMCost:
    """A GPU's ``wgmma_small_m`` section (mixgemm.tuning): the tile the GEMM takes at small M and its split model."""

    tile: dict  # BM, NWG, STAGES, INFLIGHT, TMA, KT, GROUP_M
    m_range: tuple[int, int]  # the M the model chooses for (the M it was measured over)
    splits: tuple[int, ...]
    ctas_per_sm: dict  # bits -> CTAs of the tile one SM holds (registers and shared memory)
    clusters: dict  # bits -> {split: clusters of that many CTAs held at once}
    coef: dict  # bits -> SmallMCoef
    sms: int  # the SM count the clusters were measured with
    source: str
    # the model replaces the table's tile only where that makes fewer output tiles than this many per SM, and (with
    # keep_stream_k) not where the table's config is stream-K
    max_table_tiles_per_sm: float = 1.0
    keep_stream_k: bool = True

    @classmethod
    def parse(cls, raw: dict, where: str) -> SmallMCost:
        source = source_of(raw, where, "the wgmma_small_m section")
        splits = tuple(int(s) for s in raw["splits"])
        bits = {int(b) for b in raw["coef"]}
        if (1 not in splits or any(not 1 <= s <= CLUSTER_MAX for s in splits)
                or bits != {int(b) for b in raw["ctas_per_sm"]} or bits != {int(b) for b in raw["clusters"]}
                or any({s for s in splits if s > 1} - {int(s) for s in raw["clusters"][str(b)]} for b in bits)):
            raise ValueError(f"{where}: wgmma_small_m needs split 1, splits 2..{CLUSTER_MAX} with their cluster "
                             "counts, and coef, ctas_per_sm and clusters for the same bit widths")
        lo, hi = (int(v) for v in raw["m"])
        return cls(dict(raw["tile"]), (lo, hi), splits, {int(b): int(v) for b, v in raw["ctas_per_sm"].items()},
                   {int(b): {int(s): int(c) for s, c in v.items()} for b, v in raw["clusters"].items()},
                   {int(b): SmallMCoef(**{key: float(c) for key, c in v.items()}) for b, v in raw["coef"].items()},
                   int(raw["sms"]), source, float(raw.get("max_table_tiles_per_sm", 1.0)),
                   bool(raw.get("keep_stream_k", True)))

    def applies(self, m: int, bits: int) -> bool:
        return self.m_range[0] <= m <= self.m_range[1] and bits in self.coef


def small_m_estimate_us(m: int, n: int, k: int, split: int, w: WeightBytes, cost: SmallMCost, sms: int) -> float:
    """The small-M model's time of one call with ``cost.tile`` and a cluster split of ``split`` (comment above), one of
    ``cost.splits`` that K's stages fill (split_steps keeps it)."""
    c = cost.coef[w.bits]
    ktile = int(cost.tile.get("KT", 1))
    got, steps = split_steps(k, split, ktile)
    if got != split or split not in cost.splits:
        raise ValueError(f"split {split} is not a split of the small-M model for K = {k} (K's stages make {got} "
                         f"slices; the model's splits: {cost.splits})")
    per_sm = ctas_per_sm(cost.tile, w, cap=cost.ctas_per_sm[w.bits])
    ctas = output_tiles(m, n, int(cost.tile["BM"]), int(cost.tile.get("NWG", 2))) * split
    if split > 1:  # clusters held at once, scaled from the measured count at its CTAs per SM to this SM count and count
        at_once = max(1, cost.clusters[w.bits][split] * per_sm * sms // (cost.ctas_per_sm[w.bits] * cost.sms)) * split
    else:
        at_once = per_sm * sms
    rounds = math.ceil(ctas / at_once)
    q = min(math.ceil(ctas / sms), per_sm)
    return (c.launch_us + rounds * (steps * c.step_us + (c.split_us if split > 1 else 0.0)
                                    + steps * (q - 1) * c.shared_step_us))


def rank_small_m(m: int, n: int, k: int, w: WeightBytes, cost: SmallMCost, sms: int) -> tuple[float, int] | None:
    """(estimated us, cluster split) of the split the small-M model ranks first for ``cost.tile``, or None where the
    model does not apply or K's stages make none of its splits."""
    if not cost.applies(m, w.bits):
        return None
    ktile = int(cost.tile.get("KT", 1))
    best = None
    for s in cost.splits:
        got, steps = split_steps(k, s, ktile)
        if got != s or (s > 1 and steps < 2 * ktile):  # every slice at least two stages
            continue
        t = small_m_estimate_us(m, n, k, s, w, cost, sms)
        if best is None or t < best[0]:
            best = (t, s)
    return best


def _small_m_config(tile: dict, split: int) -> dict:
    return {**tile, "SPLIT": split, "CLUSTER": int(split > 1), "SK": 0, "SERIAL": 0}


# The small-M tile's variants (SmallMFamily below) and the cluster splits its model ranks: what the family's sweep
# times (tools/bench/gemv_dispatch.py --small-m-tiles) and what mixgemm tune tries at small M where a GPU's table has
# no fitted section (or where it has one and the tuner looks beyond its pick).
FAMILY_VARIANTS = ((2, 2), (2, 4), (1, 2), (1, 4))  # (NWG, KT)
FAMILY_SPLITS = (1, 2, 4, 8)


def small_m_family_configs(tile: dict) -> list[dict]:
    """The small-M tile ``tile`` (a table's wgmma_small_m tile) in every family variant at every cluster split."""
    return [_small_m_config({**tile, "NWG": nwg, "KT": kt}, s) for nwg, kt in FAMILY_VARIANTS for s in FAMILY_SPLITS]


def choose_small_m(m: int, n: int, k: int, w: WeightBytes, cost: SmallMCost, sms: int) -> WaveChoice | None:
    """The small-M tile with the cluster split the model ranks first, or None where it does not apply."""
    best = rank_small_m(m, n, k, w, cost, sms)
    if best is None:
        return None
    t, s = best
    cfg = _small_m_config(cost.tile, s)
    return WaveChoice(cfg, f"small-M split model: BM {cfg['BM']} NWG {cfg.get('NWG', 2)} cluster split {s} "
                           f"(est. {t:.1f} us)")


# The small-M tile family. On some layers at M 9..16 neither the GEMVs nor the table's tile use the GPU well: wide
# layers whose GEMV blocks or table tiles leave part of a wave empty, long-K narrow ones (measured: tools/bench/
# gemv_dispatch.py --small-m-tiles; the table's source). There the GEMM takes the layer with the small-M tile in one of
# its variants -- one or two warpgroups (NWG: 64 or 128 weight rows per CTA), one or two 64-k tiles per stage (KT) --
# and the cluster split that the small-M model, fitted per variant, ranks first. Which layers: the section's buckets
# (measured, where the family's pick beat the GEMVs and the table's tile on every layer of the bucket), not a rule,
# because the GEMVs' times are not modelled.


@dataclass(frozen=True)
class SmallMFamily:
    """A GPU's ``wgmma_small_m_family`` section (mixgemm.tuning): the variants of the small-M tile with their fitted
    small-M models, the M range and the buckets where the family takes the layer."""

    tiles: tuple[SmallMCost, ...]
    m_range: tuple[int, int]
    buckets: dict  # bits -> tuple of BucketEntry (value True): the regions where the family takes the layer
    source: str

    @classmethod
    def parse(cls, raw: dict, base: dict, where: str) -> SmallMFamily:
        """raw: the section; base: the table's ``wgmma_small_m`` section, whose tile, splits and SM count the variants
        share (a variant overrides NWG and KT and brings its own ctas_per_sm, clusters and coef per bit width)."""
        from mixgemm.tuning import regions_by_bits

        source = source_of(raw, where, "the wgmma_small_m_family section")
        lo, hi = (int(v) for v in raw["m"])
        tiles = []
        for i, t in enumerate(raw["tiles"]):
            tile = {**base["tile"], "NWG": int(t["NWG"]), "KT": int(t["KT"])}
            tiles.append(SmallMCost.parse({**base, "tile": tile, "m": [lo, hi], "ctas_per_sm": t["ctas_per_sm"],
                                           "clusters": t["clusters"], "coef": t["coef"], "source": source},
                                          f"{where} tile {i}"))
        buckets = regions_by_bits(raw["buckets"], f"{where} buckets")
        for bits in buckets:
            if not any(bits in c.coef for c in tiles):
                raise ValueError(f"{where} buckets: no tile has constants for {bits}-bit weights")
        if not tiles or not buckets:
            raise ValueError(f"{where}: wgmma_small_m_family needs tiles and buckets")
        return cls(tuple(tiles), (lo, hi), buckets, source)

    def covers(self, m: int, bits: int, k: int, n: int):
        """The bucket entry that sends this problem to the family, or None."""
        from mixgemm.tuning.buckets import ShapeBucket, find

        if not self.m_range[0] <= m <= self.m_range[1]:
            return None
        return find(self.buckets.get(bits, ()), ShapeBucket.of(k, n))


def choose_small_m_family(m: int, n: int, k: int, w: WeightBytes, fam: SmallMFamily, sms: int) -> WaveChoice | None:
    """The variant and cluster split of the small-M tile family that the variants' models rank first, or None where
    none applies."""
    best = None
    for cost in fam.tiles:
        got = rank_small_m(m, n, k, w, cost, sms)
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], got[1], cost.tile)
    if best is None:
        return None
    t, s, tile = best
    return WaveChoice(_small_m_config(tile, s), f"small-M tile family: BM {tile['BM']} NWG {tile['NWG']} KT "
                                                f"{tile['KT']} cluster split {s} (est. {t:.1f} us)")
