"""The CUDA-core GEMV's step-cost model (kernels/cuda_gemv/gemv_steps.py) and its fit
(tools/bench/gemv_steps_fit.py)."""

import json

import pytest

from mixgemm.kernels.cuda import gemv_launch
from mixgemm.kernels.cuda_gemv import gemv_steps
from mixgemm.kernels.cuda_gemv import host as gemv_host
from mixgemm.kernels.cuda_gemv.gemv_steps import LaneTile, cheapest_tile, lane_tiles, resident_blocks, tile_shape
from mixgemm.tuning import gemv_steps as steps_table
from mixgemm.tuning.gemv_steps import StepCosts

H100 = "NVIDIA H100 80GB HBM3"


def test_lane_tiles_fit_the_row_and_match_the_kernel_rows():
    """Every tile gives each lane group of each k-slice a chunk, and its rows per block are gemv_host.tile_rows'."""
    for kc in (8, 28, 112, 128, 896):
        tiles = lane_tiles(kc)
        assert tiles and all(kc >= t.LW * t.KS or (t.LW, t.KS) == (32, 1) for t in tiles)
        for t in tiles:
            assert t.rows_per_block == gemv_host.tile_rows(t.config())
            assert t.config()["RG"] * t.KS == gemv_launch.WARPS
    assert LaneTile(2, 1, 8, 16) in lane_tiles(128) and LaneTile(2, 1, 8, 32) not in lane_tiles(128)
    # LW appears only where it is not 32 (gemv's optional keys)
    assert "LW" not in LaneTile(2, 1, 1, 32).config() and LaneTile(2, 1, 1, 16).config()["LW"] == 16
    # rows shorter than a warp keep the whole-warp rows (and only them with 7 chunks)
    assert {(t.KS, t.LW) for t in lane_tiles(7)} == {(1, 32)} and lane_tiles(0) == []


def test_resident_blocks_from_registers():
    """Registers allocated per warp in units of 256 of the SM's 65536, at most 64 warps: 8-warp blocks."""
    assert [resident_blocks(r) for r in (32, 40, 48, 59, 64, 73, 80, 101, 255)] == [8, 6, 5, 4, 4, 3, 3, 2, 1]


@pytest.mark.parametrize("family", sorted(gemv_steps.REGISTERS))
def test_register_table_matches_the_cubins(family):
    """REGISTERS gives the resident blocks of the NVRTC cubins (no GPU) for each (R, U), at two lane widths."""
    from mixgemm.kernels.cuda import nvrtc

    bits, mode = family
    for (r, u), regs in gemv_steps.REGISTERS[family].items():
        for lw, ks in ((32, 2), (16, 8)):
            cfg = LaneTile(r, u, ks, lw).config()
            d = gemv_host.defines_for(bits, 0, 0, gemv_launch._MODE[mode], 1, cfg)
            got = max(nvrtc.cubin_registers(nvrtc.compile_cubin(gemv_host.SOURCE, tuple(sorted(d.items())), "sm_90"))
                      .values())
            assert resident_blocks(got) == resident_blocks(regs), (family, r, u, lw, ks, got, regs)


def test_cost_counts_rounds_and_steps():
    """rounds of resident blocks over the SMs x (steps a lane waits for x the class's step cost + a round's part)."""
    t = LaneTile(4, 1, 2, 16)  # 32 rows a block: 4096 rows -> 128 blocks; 64 regs: 4 blocks an SM
    shape = tile_shape(t, 4096, 128, 4, "sym", 132)
    assert shape.rounds == 1 and shape.steps == 4  # 128 chunks over 32 lanes, one a step
    assert tile_shape(t, 4096 * 132, 128, 4, "sym", 132).rounds == 32  # 16896 blocks over 528 slots
    assert tile_shape(LaneTile(4, 2, 2, 16), 4096, 130, 4, "sym", 132).steps == 3  # 5 chunks a lane, 2 a step
    costs = StepCosts({c: 1.0 for c in {x.step_class for x in lane_tiles(10 ** 6)}}, 0.5, "test")
    assert costs.cost(shape, t) == 1 * (4 * 1.0 + 0.5)
    with pytest.raises(ValueError, match="no register counts"):
        tile_shape(t, 4096, 128, 4, "nf4", 132)


def test_cheapest_tile_follows_the_costs():
    """With one step class much cheaper the model takes a tile of it; equal costs take the fewest serial steps."""
    classes = {x.step_class for x in lane_tiles(10 ** 6)}
    cheap = StepCosts({c: (0.1 if c == (2, 2, 8) else 1.0) for c in classes}, 0.0, "test")
    assert cheapest_tile(8192, 256, 4, "sym", 132, cheap).step_class == (2, 2, 8)
    flat = StepCosts({c: 1.0 for c in classes}, 0.0, "test")
    t = cheapest_tile(8192, 256, 8, "sym", 132, flat)
    s = tile_shape(t, 8192, 256, 8, "sym", 132)
    assert all(s.rounds * s.steps <= (o := tile_shape(x, 8192, 256, 8, "sym", 132)).rounds * o.steps
               for x in lane_tiles(256))
    assert cheapest_tile(8192, 7, 4, "sym", 132, flat).LW == 32 and cheapest_tile(8192, 0, 4, "sym", 132, flat) is None


def test_choose_config_takes_the_model_where_no_bucket_serves():
    """M = 1 fp16 layers outside the measured buckets take the model's tile (its source says so); the buckets keep
    their layers; other activation dtypes and M keep the rule; every GPU takes the H100's costs."""
    k, n = 2560, 6912  # no H100 bucket for W4 sym
    kc = gemv_launch.chunks_per_row(4, k)
    for gpu in (H100, "NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        cfg = gemv_host.choose_config(1, n, kc, 132, 0, 4, k, gpu, "sym")
        want = cheapest_tile(n, kc, 4, "sym", 132, steps_table.step_costs(gpu, 4, "sym"))
        if "gemv_m1" in cfg.source:
            continue  # (the H200's buckets)
        assert "step-cost model" in cfg.source
        assert (cfg["R"], cfg["U"], cfg["KS"], cfg.get("LW", 32)) == (want.R, want.U, want.KS, want.LW)
    served = gemv_host.choose_config(1, 4096, gemv_launch.chunks_per_row(4, 4096), 132, 0, 4, 4096, H100, "sym")
    assert "gemv_m1" in served.source  # the protocol layer keeps its measured bucket
    assert not hasattr(gemv_host.choose_config(1, n, kc, 132, 1, 4, k, H100, "sym"), "source")  # bf16: the rule
    assert not hasattr(gemv_host.choose_config(2, n, kc, 132, 0, 4, k, H100, "sym"), "source")  # M = 2: the rule
    assert steps_table.step_family(4, "offset") == steps_table.step_family(4, "zero_point") == "w4 params"
    assert steps_table.step_family(8, "zero_point") == "w8"


def _sweep(costs: StepCosts, layers, fmt: str) -> dict:
    """A --lw-grid sweep file whose times are the model's own costs (the default: the first tile)."""
    bits = 8 if fmt == "w8" else 4
    res = []
    for k, n in layers:
        kc = gemv_launch.chunks_per_row(bits, k)
        rows = [{"cfg": t.config(), "us": costs.cost(tile_shape(t, n, kc, bits, "sym", 132), t), "default": i == 0}
                for i, t in enumerate(lane_tiles(kc))]
        res.append({"K": k, "N": n, "fmt": fmt, "M": 1, "default_entry": "cuda_gemv", "rows": {"cuda_gemv": rows}})
    return {"gpu": "test", "dtype": "float16", "res": res}


def test_fit_recovers_costs_that_made_the_times(tmp_path):
    """Fitted to times the model itself made, the fit's choice is the fastest tile on training and test layers."""
    from tools.bench import gemv_steps_fit as fit

    classes = sorted({x.step_class for x in lane_tiles(10 ** 6)})
    truth = StepCosts({c: 0.5 + 0.1 * i for i, c in enumerate(classes)}, 0.8, "truth")
    train, test = tmp_path / "train.json", tmp_path / "test.json"
    train.write_text(json.dumps(_sweep(truth, [(4096, 4096), (3584, 18944), (8192, 1024), (14336, 4096)], "w4s")))
    test.write_text(json.dumps(_sweep(truth, [(5120, 13824), (2560, 6912)], "w4s")))
    layers = fit.load([str(train)])
    assert len(layers) == 4 and all(lay.default_us >= lay.best_us for lay in layers)
    costs, score = fit.fit(layers, 132)
    assert score < 1.02
    assert fit.geomean([fit.chosen_ratio(lay, costs, 132) for lay in fit.load([str(test)])]) < 1.05


def test_buckets_the_model_serves_leave_the_tables():
    """STEP_MODEL_SERVES names measured entries; TABLES is MEASURED less them, so their layers take the model."""
    from mixgemm.tuning import gemv_m1

    for key, by_bits in gemv_m1.STEP_MODEL_SERVES.items():
        for bits, shapes in by_bits.items():
            measured = {e.measured for e in gemv_m1.MEASURED[key][bits]}
            kept = {e.measured for e in gemv_m1.TABLES[key][bits]}
            assert set(shapes) <= measured and not set(shapes) & kept
            assert len(kept) == len(measured - set(shapes))
    k, n = 5120, 5120  # zero point: its entry left the table, the model takes it; sym keeps its entry
    kc = gemv_launch.chunks_per_row(4, k)
    assert "step-cost model" in gemv_host.choose_config(1, n, kc, 132, 0, 4, k, H100, "zero_point").source
    assert "gemv_m1" in gemv_host.choose_config(1, n, kc, 132, 0, 4, k, H100, "sym").source


def test_prune_takes_a_protocol_entry_only_where_the_model_is_no_slower_there():
    """--prune: an entry measured on a protocol layer leaves the tables only where the tile the model dispatches was no
    slower on that layer itself (within 2% elsewhere); a ZSUM tile counts for the entry, never for the model."""
    from mixgemm.tuning import gemv_m1
    from mixgemm.tuning.buckets import ShapeBucket, find
    from mixgemm.tuning.gemv_steps import step_costs
    from tools.bench import gemv_steps_fit as fit

    entry = find(gemv_m1.MEASURED[("H100", True)][8], ShapeBucket.of(4096, 4096))
    assert entry.measured == (4096, 4096)
    t = entry.value
    tile = LaneTile(t.R, t.U, t.KS, t.LW)
    pick = cheapest_tile(4096, gemv_launch.chunks_per_row(8, 4096), 8, "sym", 132, step_costs("H100", 8, "sym"))
    assert pick != tile

    def pruned(model_us: float) -> bool:
        lay = fit.Layer(4096, 4096, "w8", {(pick, 0): model_us, (tile, 0): 8.0}, 8.0)
        return (4096, 4096) in fit.prune([lay], 132).get(("H100", True), {}).get(8, [])

    assert pruned(7.4) and pruned(8.0) and not pruned(8.1)  # a protocol layer: no slower; elsewhere 1.02x would do
    assert fit._tile({"R": 2, "U": 1, "KS": 4, "RG": 2, "PF": 0, "ZSUM": 1}) is None
    assert fit._tile({"R": 2, "U": 1, "KS": 4, "RG": 2, "PF": 0, "ZSUM": 1}, zsum_ok=True) == LaneTile(2, 1, 4, 32)


def test_fit_load_merges_sweeps_per_layer_and_keeps_zsum_apart(tmp_path):
    """A layer in several sweep files is one Layer, each tile at its fastest time; ZSUM tiles count only as what an
    entry ran (entry_times), and a layer first swept only with ZSUM keeps them when a later file times the model's."""
    from tools.bench import gemv_steps_fit as fit

    a, b = LaneTile(4, 1, 1, 32), LaneTile(2, 1, 2, 16)

    def sweep(rows):
        res = [{"K": 4096, "N": 4096, "fmt": "w4z", "M": 1, "default_entry": "cuda_gemv",
                "rows": {"cuda_gemv": [{"cfg": cfg, "us": us, "default": i == 0} for i, (cfg, us) in enumerate(rows)]}}]
        return {"gpu": "test", "dtype": "float16", "res": res}

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(sweep([({**a.config(), "ZSUM": 1}, 5.0), ({**b.config(), "ZSUM": 1}, 6.0)])))
    second.write_text(json.dumps(sweep([(a.config(), 5.5), (b.config(), 4.9), (a.config(), 5.2)])))
    assert fit.load([str(first)]) == []  # no tile as the model runs it
    (lay,) = fit.load([str(first), str(second)])
    assert lay.times == {a: 5.2, b: 4.9} and lay.default_us == 5.0
    assert lay.entry_times == {(a, 1): 5.0, (b, 1): 6.0, (a, 0): 5.2, (b, 0): 4.9}


def test_wg_simt_model_covers_its_tile_space():
    """Every tile of the CUDA-core GEMV on wgmma_v1's space has a register count for every family of builds (bits,
    mode, activation dtype, groups of 32), every fitted family of costs has its registers (the H200's families are
    the H100's or fewer: it takes the H100's where it has none) and a cost per class; the cheapest tile fits its K (two
    steps' worth of k-tiles a slice), and a layer too short for any tile or a family without register counts gets
    None."""
    from mixgemm.kernels.cuda_gemv import gemv_steps as steps
    from mixgemm.tuning.gemv_steps import WG_SIMT, wg_simt_family, wg_simt_step_costs

    space = steps.wg_simt_tiles(1 << 12)
    assert set(WG_SIMT["H200"]) <= set(WG_SIMT["H100"])
    families = {wg_simt_family(*key): key for key in steps.WG_SIMT_REGISTERS}
    assert set(WG_SIMT["H100"]) <= set(families)
    for key in steps.WG_SIMT_REGISTERS:
        assert {(t.RT, t.U, t.PF, t.KS, t.RG) for t in space} == set(steps.WG_SIMT_REGISTERS[key])
        assert all(32 <= steps.wg_simt_tile_registers(t, *key) <= 255 for t in space)
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        for family in WG_SIMT["H100"]:
            bits, mode, act, g32 = families[family]
            costs = wg_simt_step_costs(gpu, bits, mode, act, g32)
            assert costs is WG_SIMT["H200" if "H200" in gpu and family in WG_SIMT["H200"] else "H100"][family]
            assert set(costs.step) == {t.step_class for t in space}
            for k, n in ((896, 4864), (4096, 14336), (28672, 8192), (5120, 27648)):
                t = steps.cheapest_wg_simt_tile(n, k, bits, mode, 132, costs, act, g32)
                assert t in space and -(-k // 64) >= 2 * t.KS * t.U
    assert steps.cheapest_wg_simt_tile(4096, 192, 4, "sym", 132, WG_SIMT["H100"]["w4 sym"]) is None
    assert steps.cheapest_wg_simt_tile(4096, 4096, 4, "offset", 132, WG_SIMT["H100"]["w4 sym"]) is None


def test_wg_simt_registers_match_this_nvrtc_where_it_is_the_gpus():
    """Where this machine's NVRTC is the GPUs' version (13.0), its cubins give WG_SIMT_REGISTERS' counts, zero point
    with PACK where PF is on and bf16 x included (a sample of the tile space; the table is that compiler's)."""
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda_gemv import gemv_steps as steps

    if not nvrtc.nvrtc_available():
        pytest.skip("no NVRTC here")
    from cuda.bindings import nvrtc as raw

    if tuple(raw.nvrtcVersion()[1:]) != (13, 0):
        pytest.skip("the table is NVRTC 13.0's; register counts differ between its versions")
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_packs, wg_simt_registers

    for bits, mode, act, g32 in steps.WG_SIMT_REGISTERS:
        for t in steps.wg_simt_tiles(1 << 12)[::9]:
            cfg = {**wg_simt_packs(t.config(), mode), **({"G32": 1} if g32 else {})}
            got = wg_simt_registers(bits, act, 0, mode, tuple(sorted(cfg.items())))
            assert got == steps.wg_simt_tile_registers(t, bits, mode, act, g32), (bits, mode, act, g32, t)


def test_wg_simt_model_counts_rounds_from_registers():
    """A tile's rounds are its blocks over the SMs' resident slots from the build's registers: RT 4 U 2 PF 0 KS 8 (97
    registers, 2 blocks of 8 warps a SM) takes 4096x14336 (224 blocks) in one round of 132 SMs and 3584x18944 (296) in
    two; the KS term adds per doubling of the k-slices."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import WgSimtStepTile, wg_simt_tile_shape
    from mixgemm.tuning.gemv_steps import StepCosts

    t = WgSimtStepTile(4, 2, 0, 8, 1)
    assert wg_simt_tile_shape(t, 14336, 4096, 4, "sym", 132).rounds == 1
    assert wg_simt_tile_shape(t, 18944, 3584, 4, "sym", 132).rounds == 2
    shape = wg_simt_tile_shape(t, 14336, 4096, 4, "sym", 132)
    assert shape.steps == 4  # 64 k-tiles over 8 slices, 2 a step
    costs = StepCosts({t.step_class: 1.0}, 0.5, "test", 0.25)
    assert costs.cost(shape, t) == 1 * (4 * 1.0 + 0.5 + 0.25 * 3)
