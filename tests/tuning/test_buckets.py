"""The bucket scheme of the tuning data (mixgemm.tuning.buckets), on the CPU:

* no regression: every lookup the exact-shape tables answered for a measured layer (a frozen copy of those tables is
  tests/data/tuning_before_buckets.json, with their old lookup rules below) gives the same config through the bucket
  entries -- the linear GEMM tables and the GEMV crossover of both GPUs, the M = 1 GEMV tiles, the int8-activation
  GEMV tiles and the conv tables;
* the partition: any shape falls into exactly one entry of a section, and a table whose regions overlap or leave a gap
  is refused;
* unseen shapes: every linear layer of src/mixgemm/bench/model_shapes.json at M in {1, 16, 256, 4096} on a fake H100
  and H200 gets a config the chosen kernel accepts (no GPU: the registry's Problem with a DeviceInfo);
* explain names the bucket and the source of a table config.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import mixgemm
import mixgemm.tuning as tuning
from described_gpus import H100, H200
from mixgemm import QuantConfig, quantize_weight
from mixgemm.kernels import linear_common
from mixgemm.kernels.cuda import gemv_launch
from mixgemm.kernels.cuda_gemv import host as gemv_host
from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host
from mixgemm.kernels.registry import choose
from mixgemm.tuning import buckets, conv_table, gemv_m1
from mixgemm.tuning import cache as tcache
from repo_paths import TESTS

GPU_NAMES = {"h100": H100.name, "h200": H200.name}
PROTOCOL = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192)]  # K x N
PROTOCOL_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384]

with open(TESTS / "data" / "tuning_before_buckets.json") as _f:
    OLD = json.load(_f)


pytestmark = pytest.mark.usefixtures("isolated_tuning")  # (conftest.py)


# ----------------------------------------------------------------------- the old exact-shape rules, frozen
def _old_nearest_shape(entries: dict, k: int, n: int):
    exact = f"{k}x{n}"
    if exact in entries:
        return entries[exact]
    best, best_d = None, math.inf
    for key, val in entries.items():
        if key == "*":
            continue
        kk, nn = (int(v) for v in key.split("x"))
        d = abs(math.log(kk / k)) + abs(math.log(nn / n))
        if d < best_d:
            best, best_d = val, d
    if best is None or best_d > math.log(4.0):
        return entries.get("*", best)
    return best


def _old_nearest_bucket(configs: dict, m: int) -> dict:
    b = buckets.m_bucket(m)
    pick = min((int(x) for x in configs), key=lambda v: (abs(math.log2(v) - math.log2(b)), -v))
    return configs[str(pick)]


def _old_table_entry(table: dict, section: str, m: int, n: int, k: int, wkey: str):
    entries = table.get(section, {}).get(wkey)
    if entries:
        shape = _old_nearest_shape(entries, k, n)
        if shape:
            return dict(_old_nearest_bucket(shape, m))
    return None


def _old_gemv_max_m(table: dict, fmt: str, bits: int, n: int, k: int, wgmma: bool) -> int:
    if wgmma:
        from_m = table.get("wgmma_from_m", {}).get(fmt, {}).get(f"{k}x{n}")
        if from_m is not None:
            return int(from_m) - 1
    if n < table.get("gemv_all_m_below_n", 0):
        return 16
    limits = table["gemv_max_m"] if wgmma else table.get("gemv_max_m_no_wgmma", table["gemv_max_m"])
    return int(limits.get(str(bits), 16))


def _weight(bits: int, group: int):
    """The fields of a QuantizedWeight the table lookups read."""
    return SimpleNamespace(bits=bits, group_size=group, num_groups=1 if group == -1 else 2)


WKEY_FORMATS = {"w4g": (4, 128), "w4pc": (4, -1), "w8g": (8, 128), "w8pc": (8, -1)}


def _measured_shapes(old_table: dict) -> list[tuple[int, int]]:
    """The protocol's layers and every layer an old table had an entry for (K x N)."""
    shapes = set(PROTOCOL)
    for section in ("gemm", "wgmma"):
        for per_shape in old_table[section].values():
            shapes |= {tuple(int(v) for v in s.split("x")) for s in per_shape if s != "*"}
    for per_shape in old_table.get("wgmma_from_m", {}).values():
        shapes |= {tuple(int(v) for v in s.split("x")) for s in per_shape}
    return sorted(shapes)


# ------------------------------------------------------------------------------------------ no regression
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_linear_tables_give_the_old_configs_on_measured_layers(gpu):
    old, new = OLD[gpu], tuning.load_table(gpu)
    checked = 0
    for section in ("gemm", "wgmma"):
        assert set(new[section]) == set(old[section])
        for wkey in old[section]:
            bits, group = WKEY_FORMATS[wkey]
            for (k, n) in _measured_shapes(old):
                listed = {int(b) for cfgs in old[section][wkey].values() for b in cfgs}
                for m in sorted(set(PROTOCOL_M) | listed):
                    want = _old_table_entry(old, section, m, n, k, wkey)
                    got = tuning.table_entry(new, section, m, n, k, _weight(bits, group))
                    assert got == want, (gpu, section, wkey, k, n, m)
                    assert isinstance(got, buckets.SourcedConfig) and "source:" in got.source
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_gemv_crossover_gives_the_old_limit_on_measured_layers(gpu):
    old, new = OLD[gpu], tuning.load_table(gpu)
    for (k, n) in _measured_shapes(old):
        for bits, group in ((4, 128), (4, 64), (4, -1), (8, -1), (8, 128)):
            fmt = f"w{bits}pc" if group == -1 else f"w{bits}g{group}"
            for wg in (True, False):
                assert (tuning.gemv_max_m(new, _weight(bits, group), n, wgmma=wg, k=k)
                        == _old_gemv_max_m(old, fmt, bits, n, k, wg)), (gpu, fmt, k, n, wg)


def _kernels():
    """The GEMV modules, imported late: gemv_a8 imports Triton kernels, which read TRITON_INTERPRET when imported
    (other test modules set it when collected)."""
    from mixgemm.kernels.cuda_gemv_a8 import gemv_a8

    return gemv_host, gemv_a8


def _old_m1_config(tile: list) -> dict:
    gemv, _ = _kernels()
    t = gemv_m1.M1Tile(*tile)
    cfg = {"R": t.R, "U": t.U, "RG": t.RG or gemv_launch.WARPS // t.KS, "KS": t.KS, "PF": t.PF,
           "XS": gemv_host.DEFAULT_XS, "LITE": gemv_host.DEFAULT_LITE}
    return {**cfg, **{key: getattr(t, key) for key in gemv_host.OPTIONAL_KEYS
                      if getattr(t, key, 0) != gemv_host.OPTIONAL_DEFAULTS.get(key, 0)}}


# Old tiles a later measurement replaced: (GPU, weight mode, old key) -> the tile that replaced it. The H100's second
# model-list sweep (tuning/gemv_m1.py H100_ZP_SWEEP2) measured 4096x4096 zero point at R 2 faster (5.68 -> 5.14 us).
# The fourth (lanes per row, gemv_m1.H100_SYM_SWEEP4) measured 4096x4096 sym faster with 16 lanes a row (5.41 -> 4.72).
REMEASURED = {("H100", mode, "4,4096,4096"): [2, 1, 2] for mode in ("zero_point", "offset")}
REMEASURED[("H100", "sym", "4,4096,4096")] = [4, 2, 4, 0, 0, 0, 0, 0, 0, 16]


@pytest.mark.parametrize("gpu", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_gemv_m1_tiles_unchanged_on_measured_layers(gpu, mode):
    gemv, _ = _kernels()
    old = OLD["gemv_m1"]
    base = old["TUNED_M1_H100" if "H100" in gpu else "TUNED_M1"]
    table = {**base, **old["TUNED_M1_H100_SYM" if "H100" in gpu else "TUNED_M1_SYM"]} if mode == "sym" else base
    from mixgemm.tuning.gemv_m1 import STEP_MODEL_SERVES

    short = "H100" if "H100" in gpu else "H200"
    for key, tile in table.items():
        bits, n, k = (int(v) for v in key.split(","))
        cfg = gemv_host.choose_config(1, n, gemv_launch.chunks_per_row(bits, k), 132, 0, bits, k, gpu, mode)
        if (k, n) in STEP_MODEL_SERVES.get((short, mode == "sym"), {}).get(bits, ()):
            # the entry left the tables for the step-cost model, which was no slower on this layer (gemv_steps_fit)
            assert "step-cost model" in cfg.source, (gpu, mode, key)
            continue
        newer = REMEASURED.get((short, mode, key))
        assert cfg == _old_m1_config(newer or tile), (gpu, mode, key)
        # (a replacing tile may have been measured on another layer of the bucket)
        assert "gemv_m1" in cfg.source and (newer or f"K {k} x N {n}" in cfg.source)
        # other M, other activations: the rule, as before
        assert not hasattr(gemv_host.choose_config(2, n, gemv_launch.chunks_per_row(bits, k), 132, 0, bits, k,
                                                   gpu, mode),
                           "source")
        assert not hasattr(gemv_host.choose_config(1, n, gemv_launch.chunks_per_row(bits, k), 132, 1, bits, k,
                                                   gpu, mode),
                           "source")


def test_gemv_a8_m1_tiles_unchanged_on_measured_layers():
    _, gemv_a8 = _kernels()
    for key, tuned in OLD["gemv_m1"]["A8_TUNED_M1"].items():
        bits, n, k = (int(v) for v in key.split(","))
        cfg = gemv_a8.choose_config(1, n, 64, 132, bits, k)
        assert cfg == dict(tuned, RG=tuned["NW"] // tuned["KS"]) and "gemv_a8" in cfg.source, key
        assert gemv_a8.choose_config(2, n, 64, 132, bits, k)["R"] == gemv_a8.ROWS_PER_WARP[2]


def test_conv_tables_unchanged_on_measured_layers():
    for gpu, table in OLD["conv"]["igemm"].items():
        for key, (path, cfg) in table.items():
            assert conv_table.lookup(f"NVIDIA {gpu.upper()}", key) == (path, None if cfg is None else tuple(cfg)), key
            assert conv_table.measured_on(f"NVIDIA {gpu.upper()}", key).endswith(f"measured on {key} by "
                                                                                  "tools/checks/conv_gpu_check.py "
                                                                                  "(conv_table.py)")
    for gpu, table in OLD["conv"]["wgmma"].items():
        for key, cfg in table.items():
            assert conv_table.lookup_wgmma(f"NVIDIA {gpu.upper()}", key) == (True, cfg), key
    # a neighbouring channel count shares the bucket; a far one does not; other GPUs have no table
    assert conv_table.lookup("NVIDIA H200", "w8pc|3x3/1|240-272|M8192") == conv_table.lookup(
        "NVIDIA H200", "w8pc|3x3/1|256-256|M8192") is not None
    assert conv_table.lookup("NVIDIA H200", "w8pc|3x3/1|192-256|M8192") is None
    assert conv_table.lookup("NVIDIA A100", "w8pc|3x3/1|256-256|M8192") is None


# ------------------------------------------------------------------------------------------- the partition
def test_half_octave_classes_and_ranges():
    assert [buckets.half_octave(v) for v in (4096, 5120, 6888, 6889, 8192, 14336, 28672)] == [24, 25, 25, 26, 26, 28,
                                                                                              30]
    for c in range(3, 40):  # (class 1, sizes 1.19..1.68, holds no integer)
        lo, hi = buckets.class_range(c)
        assert buckets.half_octave(lo) == buckets.half_octave(hi) == c
        assert buckets.half_octave(lo - 1) == c - 1 and buckets.half_octave(hi + 1) == c + 1
    with pytest.raises(ValueError, match="positive"):
        buckets.half_octave(0)
    assert [buckets.m_bucket(m) for m in (0, 1, 3, 16, 17, 16384, 10**6)] == [1, 1, 4, 16, 32, 16384, 16384]


@pytest.mark.parametrize("gpu", ["h100", "h200", "default"])
def test_every_shape_is_in_exactly_one_entry(gpu):
    table = tuning.load_table(gpu)
    for section in ("gemm", "wgmma"):
        for wkey, entries in table[section].items():
            for k in buckets.GRID:
                for n in buckets.GRID:
                    hits = [e for e in entries if e.region.contains(buckets.ShapeBucket(k, n))]
                    assert len(hits) == 1, (gpu, section, wkey, k, n)
            for e in entries:  # an entry measured on a layer holds that layer's bucket; every entry has a source
                assert e.source and (e.measured is None or e.region.contains(buckets.ShapeBucket.of(*e.measured)))
    for k, n in ((1, 1), (7, 100000), (100000, 7), (1 << 20, 1 << 20)):  # far outside the grid: open ranges
        for section in ("gemm", "wgmma"):
            for entries in table[section].values():
                assert buckets.find(entries, buckets.ShapeBucket.of(k, n)) is not None


def _raw_section(regions: list) -> dict:
    cfgs = {"16": {"BM": 16}}
    return {"wgmma": {"w4g": [{"region": r, "source": f"test {i}", "configs": cfgs} for i, r in enumerate(regions)]}}


def test_overlapping_or_incomplete_regions_are_refused():
    ok = _raw_section([{"aspect": [0, None]}, {"aspect": [None, -1]}])
    assert len(tuning.parse_table(ok, "t")["wgmma"]["w4g"]) == 2
    with pytest.raises(ValueError, match="is in 2 entries"):
        tuning.parse_table(_raw_section([{"aspect": [0, None]}, {"k": [None, 30]}]), "t")
    with pytest.raises(ValueError, match="is in no entry"):
        tuning.parse_table(_raw_section([{"aspect": [1, None]}, {"aspect": [None, -1]}]), "t")
    with pytest.raises(ValueError, match="region box"):
        tuning.parse_table(_raw_section([{"K": [0, 3]}]), "t")
    bad = _raw_section([{}])
    bad["wgmma"]["w4g"][0]["measured"] = {"k": 4096, "n": 14336}
    bad["wgmma"]["w4g"][0]["region"] = {"k": [26, 26]}
    with pytest.raises(ValueError, match="does not cover that layer's bucket"):
        tuning.parse_table(bad, "t")
    nosrc = _raw_section([{}])
    del nosrc["wgmma"]["w4g"][0]["source"]
    with pytest.raises(ValueError, match="'source'"):
        tuning.parse_table(nosrc, "t")


# --------------------------------------------------------------------------------------------- unseen shapes
def _model_layers() -> list[tuple[int, int]]:
    from mixgemm.bench import models

    return sorted(models.model_layers(list(models.catalog().values())))


FORMATS = [(4, 128, "sym"), (4, 128, "zero_point"), (4, -1, "sym"), (8, -1, "sym"), (8, 64, "offset")]


def _tile_or_split_error(cfg: dict, tile_error, split_key: str, steps: int, unit: str) -> str | None:
    """A GEMM config's tile error, else why its split of K (key split_key) does not fit the layer's ``steps``."""
    err = tile_error(cfg)
    if err:
        return err
    split = cfg.get(split_key, 1)
    if not (isinstance(split, int) and 1 <= split <= max(1, steps)):
        return f"{split_key} {split} for {steps} {unit}"
    return None


def _legal(p, choice) -> str | None:
    """Why the chosen config cannot run on the problem's layer (None when it can)."""
    gemv, _ = _kernels()
    cfg, k = choice.config, p.k
    if choice.kernel == "cuda_wgmma":
        from mixgemm.kernels.cuda_wgmma.gemm_wgmma import K_TILE, tile_error

        return _tile_or_split_error(cfg, tile_error, "SPLIT", math.ceil(k / K_TILE), "k-tiles")
    if choice.kernel == "triton_gemm":
        from mixgemm.kernels.triton_gemm.gemm import DEFAULT_KS, chunk_k, tile_error

        steps = math.ceil(k / (chunk_k(p.bits, cfg.get("KS", DEFAULT_KS)) * cfg.get("KCH", 1)))
        return _tile_or_split_error(cfg, tile_error, "SPLIT_K", steps, "k-chunks")
    if choice.kernel == "cuda_gemv":
        if not all(isinstance(cfg[key], int) and cfg[key] >= 1 for key in ("R", "U", "KS", "RG")):
            return "R, U, KS, RG must be positive"
        kc = gemv_launch.chunks_per_row(p.bits, k)
        # the tail loop takes partial U steps; a whole k-slice warp without a chunk would only idle (a k-slice's lane
        # group is LW lanes)
        if cfg["KS"] > 1 and kc <= cfg.get("LW", 32) * (cfg["KS"] - 1):
            return f"KS {cfg['KS']} k-slices of {cfg.get('LW', 32)} lanes for {kc} chunks per row"
        return None
    if choice.kernel == "cuda_gemv_mma":
        kt = gemv_mma_host.mma_k_tiles(p.bits, k)
        return None if kt >= cfg["KS"] else f"KS {cfg['KS']} for {kt} k-tiles"
    return f"unexpected kernel {choice.kernel}"


@pytest.mark.parametrize("dev", [H100, H200], ids=["h100", "h200"])
def test_model_shapes_get_legal_configs(dev):
    """Every linear layer of the model catalogue (Qwen2.5, Gemma-2, Phi-3, Llama...), M 1 / 16 / 256 / 4096, each
    weight format, fp16 (and fp32 activations for W4): the dispatch picks a kernel whose config runs the layer."""
    layers = _model_layers()
    assert len(layers) > 50
    small = {f: quantize_weight(torch.randn(128, 256), QuantConfig(bits=f[0], group_size=f[1], mode=f[2]))
             for f in FORMATS}
    seen = set()
    for (k, n) in layers:
        for f, qw in small.items():
            for dt in (torch.float16, torch.float32) if f == FORMATS[0] else (torch.float16,):
                base = linear_common.linear_problem(16, qw, dt, dev)
                g = k if f[1] == -1 else f[1]
                for m in (1, 16, 256, 4096):
                    p = replace(base, m=m, n=n, k=k, group_size=g, num_groups=1 if f[1] == -1 else -(-k // g))
                    c = choose(p)
                    why = _legal(p, c)
                    assert why is None, (dev.name, k, n, m, f, dt, c.kernel, c.config, why)
                    seen.add(c.kernel)
    assert seen == {"cuda_gemv", "cuda_gemv_mma", "cuda_wgmma", "triton_gemm"}


# ----------------------------------------------------------------------------------------------------- explain
def test_explain_names_the_bucket_and_the_source():
    qw = quantize_weight(torch.randn(512, 256), QuantConfig(bits=4, group_size=128))
    p = linear_common.linear_problem(32, qw, torch.float16, H100)
    c = choose(replace(p, k=5120, n=13824))  # a Llama-2-13B up-projection: the bucket region of the 4096 x 14336 entry
    assert c.kernel == "cuda_wgmma"
    text = str(c)
    assert "h100 table, wgmma w4g, M bucket 32, bucket k25/n28 (K 4871..6888, N 13778..19483)" in text
    assert "measured on K 4096 x N 14336" in text and "source: measured on this layer" in text
    # a small layer: the '*' entry, named as such
    c = mixgemm.explain(torch.empty(64, 256, dtype=torch.float16), qw, device=H100)
    assert c.kernel == "cuda_wgmma" and "the '*' tiles" in c.config_source and "bucket k16/n18" in c.config_source
    # the GEMV's measured M = 1 tile
    c = choose(replace(p, m=1, k=4096, n=4096, mode="zero_point"))
    assert c.kernel == "cuda_gemv" and "gemv_m1 H100 W4" in c.config_source


def test_tuning_cache_entries_are_bucket_keyed_and_explained(tmp_path):
    """A `mixgemm tune` entry is stored under the layer's bucket key (no exact shape in it) and explain names the key
    and the layer it was measured on; a neighbouring layer in the bucket takes it."""
    qw = quantize_weight(torch.randn(512, 256), QuantConfig(bits=4, group_size=128))
    p = replace(linear_common.linear_problem(16, qw, torch.float16, H100), k=4096, n=14336)
    key = tcache.bucket_key(p, "cuda_wgmma")
    assert key.endswith("/k24/n28/m16") and "4096" not in key and "14336" not in key
    tuned = {**choose(p).config, "STAGES": 3}
    c = tcache.TuningCache(H100.name)
    c.put(key, tuned, 10.0, 9.0, {"gpu": H100.name, "shape": "4096x14336", "m": 16,
                                  "bucket": buckets.ShapeBucket.of(4096, 14336).describe()})
    tcache.save(c, os.environ[tcache.ENV])
    tcache.reload()
    got = choose(replace(p, k=4200, n=15000, m=9))
    assert got.config == tuned and f"{key} (measured on K x N 4096x14336)" in got.config_source
