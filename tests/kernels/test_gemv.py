"""CUDA GEMV (mixgemm.kernels.cuda_gemv.host): CPU checks (NVRTC compiles, gemv_v2 layout round trips) and
GPU checks of every format combination against the float64 reference."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

import mixgemm
import mixgemm.reference as ref
from described_gpus import H100, H200
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import m_bucket, wave_efficiency
from mixgemm.kernels.cuda_gemv.gemv_steps import lane_tiles
from mixgemm.kernels.cuda_gemv.host import choose_config, defines_for
from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2, unpack_gemv_v2
from mixgemm.kernels.cuda_gemv_mma.host import (
    choose_mma_config,
    mma_config,
    mma_defines_for,
    mma_pf_pack,
)
from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1, unpack_gemv_mma_v1
from mixgemm.kernels.cuda_gemv_wg_simt.host import simt_defines_for
from mixgemm.kernels.registry import kernel_options
from mixgemm.tuning import gemv_m1
from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

BITS = (4, 8)
ACTS = (0, 1, 2)  # fp16, bf16, fp32 activations
SCLS = (0, 1, 2)  # fp16, bf16, fp32 scales
MODES = (0, 1, 2)  # sym, zero_point, offset
GROUPS = (32, 64, 128, 256, -1)
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")


# ----------------------------------------------------------------------------------------------- CPU

@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_every_instantiation(arch):
    """Every (bits, activation dtype, scale dtype, mode) at the M buckets and the tile configs that the
    dispatcher can pick (split-K on and off) compiles for sm_90 and sm_80."""
    keys = set()
    for i, (bits, act, scl, mode) in enumerate(itertools.product(BITS, ACTS, SCLS, MODES)):
        # every combination at M = 1; the fp16-scale ones (the scale dtype only changes one load) at
        # every M bucket on sm_90 and at M = 16 on sm_80; tile configs alternate between no split-K
        # and split-K 8 so both code shapes are compiled (keeps this test near a minute on 2 cores)
        buckets = [1]
        if scl == 0:
            buckets += [2, 4, 8, 16] if arch == "sm_90" else [16]
        for mb in buckets:
            n, kc = ((28672, 256), (64, 4096))[(i + mb) % 2]
            cfg = choose_config(mb, n, kc, 132, act)
            keys.add(tuple(sorted(defines_for(bits, act, scl, mode, mb, cfg).items())))
    if arch == "sm_90":  # the tuned M = 1 tiles of both GPUs on their measured layers, fp16 activations and scales
        for gpu, mode in itertools.product(("NVIDIA H200", "NVIDIA H100 80GB HBM3"), range(len(MODES))):
            mode_name = ("sym", "zero_point", "offset")[mode]
            for bits, entries in gemv_m1.tuned_m1(gpu, mode_name).items():
                for e in entries:
                    k, n = e.measured
                    cfg = choose_config(1, n, k // (32 if bits == 4 else 16), 132, 0, bits, k, gpu, mode_name)
                    assert (cfg["R"], cfg["U"], cfg["KS"]) == e.value[:3]
                    keys.add(tuple(sorted(defines_for(bits, 0, 0, mode, 1, cfg).items())))
                if cfg.get("BULK"):  # gemv() adds BPAR where a row's parameters are whole 16-byte units
                    keys.add(tuple(sorted(defines_for(bits, 0, 0, mode, 1, {**cfg, "BPAR": 1}).items())))
        # the bulk ring's test tiles with every activation dtype (M buckets 1, 4, 2), parameters by bulk copy
        for i, tile in enumerate(BULK_TILES):
            for act, mb in ((0, 1), (1, 4), (2, 2)):
                cfg = {**tile._asdict(), "BPAR": 1}
                keys.add(tuple(sorted(defines_for((4, 8)[i % 2], act, act, (i + act) % 3, mb, cfg).items())))
    for key in sorted(keys):
        cubin = nvrtc.compile_cubin("cuda_gemv/gemv.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key
    # NVRTC writes its (here 1-byte) log into a buffer we pass: it must not have been a shared bytes object.
    # b" " * 1 is CPython's cached 1-byte b" "; a corrupted one broke torch.save in the same process.
    assert (b" " * 1)[0] == 32 and (bytes(1) * 1)[0] == 0


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_mma_instantiations(arch):
    """Tensor-core kernel: every (bits, fp16/bf16, mode) with fp16 scales at both M blocks (M <= 8, <= 16);
    bf16 / fp32 scales at M <= 8 (sm_90 only: the scale dtype changes one load)."""
    keys = set()
    for i, (bits, act, scl, mode) in enumerate(itertools.product(BITS, (0, 1), SCLS, MODES)):
        if scl != 0 and arch == "sm_80":
            continue
        for mb in ((1, 2) if scl == 0 else (1,)):
            n, kt = ((28672, 128), (64, 4096))[(i + mb) % 2]
            cfg = choose_mma_config(mb, n, kt, 132, bits)  # (U 1 at mb 2: int4 at KS 8, int8 at KS 16)
            # every scaling scheme (MMA_DEFER 0 / 1 / 2) for fp16 scales, the default one otherwise
            for defer in ((0, 1) if scl == 0 else (cfg["DEFER"],)):
                keys.add(tuple(sorted(mma_defines_for(bits, act, scl, mode, mb, {**cfg, "DEFER": defer}).items())))
    # on wgmma_v1 (WG), groups of 32 too
    for bits, act, mb in itertools.product(BITS, (0, 1), (1, 2)):
        cfg = {**choose_mma_config(mb, 4096, 64, 132, bits), "WG": 1}
        for extra in ({"G32": 0}, {"G32": 1, "DEFER": 0}):
            mode = extra.pop("MODE", 1)
            keys.add(tuple(sorted(mma_defines_for(bits, act, 0, mode, mb, {**cfg, **extra}).items())))
    # several row tiles per warp, the first weights before the PDL wait, double buffering; both layouts
    for i, (bits, wg, rt) in enumerate(itertools.product(BITS, (0, 1), (2, 4))):
        cfg = {**choose_mma_config(2, 4096, 64, 132, bits), "WG": wg, "RT": rt, "EARLY": 1, "PF": i % 2}
        cfg["KS"] = min(cfg["KS"], 32 // rt)  # (the k-slice reduction's 1 KiB per slice and tile: <= 32 KiB)
        keys.add(tuple(sorted(mma_defines_for(bits, i % 2, 0, i % 3, 1 + i % 2, cfg).items())))
    for key in sorted(keys):
        cubin = nvrtc.compile_cubin("cuda_gemv_mma/gemv_mma.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_wg_simt_instantiations(arch):
    """The M = 1 CUDA-core math on wgmma_v1 (gemv_wg_simt.cu): every (bits, fp16/bf16, mode), groups of 32, and tiles
    from one row tile to eight, with and without double buffering."""
    tiles = ({"RT": 1, "U": 2, "KS": 2, "RG": 4}, {"RT": 4, "U": 1, "KS": 4, "RG": 2, "PF": 1},
             {"RT": 8, "U": 1, "KS": 16, "RG": 1})
    for i, (bits, act, mode, g32) in enumerate(itertools.product(BITS, (0, 1), (0, 1, 2), (0, 1))):
        key = tuple(sorted(simt_defines_for(bits, act, 0, mode, {**tiles[i % 3], "G32": g32}).items()))
        cubin = nvrtc.compile_cubin("cuda_gemv_wg_simt/gemv_wg_simt.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key
    # a register cap for more resident blocks (MINB), compiled and in the key only when set
    for bits in BITS:
        key = tuple(sorted(simt_defines_for(bits, 1, 0, 1, {**tiles[1], "MINB": 2}).items()))
        assert dict(key)["SIMT_MINB"] == 2
        cubin = nvrtc.compile_cubin("cuda_gemv_wg_simt/gemv_wg_simt.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key
    assert "SIMT_MINB" not in simt_defines_for(4, 0, 0, 0, tiles[0])
    # the routed experts' build (mixgemm.kernels.cuda.routed_gemv)
    for i, (bits, mode) in enumerate(itertools.product(BITS, (0, 1, 2))):
        key = tuple(sorted({**simt_defines_for(bits, i % 2, 0, mode, tiles[i % 3]), "SIMT_ROUTED": 1}.items()))
        cubin = nvrtc.compile_cubin("cuda_gemv_wg_simt/gemv_wg_simt.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key


@needs_nvrtc
def test_wg_simt_packed_params_instantiations():
    """PACK (a zero point's or offset's 16-bit parameter pair in one register) compiles for both activation dtypes and
    holds fewer registers on a tile of many rows and k-tiles in flight (what it is for); sym weights and fp32 scales
    have no pair, so the key drops it."""
    heavy = {"RT": 2, "U": 2, "PF": 1, "KS": 8, "RG": 1}

    def regs(bits, act, mode, cfg, scl=0):
        key = tuple(sorted(simt_defines_for(bits, act, scl, mode, cfg).items()))
        return nvrtc.cubin_registers(nvrtc.compile_cubin("cuda_gemv_wg_simt/gemv_wg_simt.cu", key,
                                                         "sm_90"))["mixgemm_gemv_wg_simt"]

    for bits in BITS:
        assert regs(bits, 0, 1, {**heavy, "PACK": 1}) < regs(bits, 0, 1, heavy)
        for act, mode, g32 in itertools.product((0, 1), (1, 2), (0, 1)):
            assert 16 <= regs(bits, act, mode, {**heavy, "PACK": 1, "G32": g32}) <= 255
    assert "SIMT_PACK" not in simt_defines_for(4, 0, 0, 0, {**heavy, "PACK": 1})
    assert "SIMT_PACK" not in simt_defines_for(4, 0, 2, 1, {**heavy, "PACK": 1})
    assert simt_defines_for(4, 0, 0, 1, {**heavy, "PACK": 1})["SIMT_PACK"] == 1


@needs_nvrtc
def test_gemv_mma_packed_params_instantiations():
    """MMA_PACK (the tensor-core GEMV's zero-point / offset pair in one register) compiles on both layouts, both
    activation dtypes, deferred scaling or not, groups of 32 on wgmma_v1, and double buffered with two row tiles a warp;
    sym weights and fp32 scales have no pair, so the key drops it."""
    base = {**choose_mma_config(2, 4096, 64, 132, 4), "PF": 1, "EARLY": 1, "PACK": 1}
    for i, (bits, wg, act, mode) in enumerate(itertools.product(BITS, (0, 1), (0, 1), (1, 2))):
        cfg = {**base, "WG": wg, "RT": 1 + i % 2, "KS": 8, "RG": 1, "DEFER": int(i % 3 != 0),
               "G32": int(wg and i % 4 == 1)}
        d = mma_defines_for(bits, act, 0, mode, 1 + i % 2, cfg)
        assert d["MMA_PACK"] == 1
        regs = nvrtc.cubin_registers(nvrtc.compile_cubin("cuda_gemv_mma/gemv_mma.cu", tuple(sorted(d.items())),
                                                         "sm_90"))
        assert 16 <= regs["mixgemm_gemv_mma"] <= 255, d
    assert "MMA_PACK" not in mma_defines_for(4, 0, 0, 0, 2, base)
    assert "MMA_PACK" not in mma_defines_for(4, 0, 2, 1, 2, base)


@needs_nvrtc
def test_cubin_registers_reads_the_register_count():
    """nvrtc.cubin_registers reads a kernel's registers from its cubin (no GPU): a tile of more rows per warp, more
    k-tiles in flight and double buffering holds more than one row tile of one k-tile; the GPU test compares it with
    the driver's count."""
    def regs(cfg):
        key = tuple(sorted(simt_defines_for(4, 0, 0, 0, cfg).items()))
        return nvrtc.cubin_registers(nvrtc.compile_cubin("cuda_gemv_wg_simt/gemv_wg_simt.cu", key, "sm_90"))

    small, big = regs({"RT": 1, "U": 1, "KS": 4, "RG": 1}), regs({"RT": 4, "U": 2, "KS": 8, "RG": 1, "PF": 1})
    assert list(small) == list(big) == ["mixgemm_gemv_wg_simt"]
    assert 16 <= small["mixgemm_gemv_wg_simt"] < big["mixgemm_gemv_wg_simt"] <= 255
    with pytest.raises(ValueError, match="not an ELF64 cubin"):
        nvrtc.cubin_registers(b"PTX")


@pytest.mark.gpu
def test_cubin_registers_match_the_driver():
    """What nvrtc.cubin_registers reads from the cubin is what the driver reports for the loaded kernel."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import SIMT_KERNEL, SIMT_SOURCE

    major, minor = torch.cuda.get_device_capability()
    for bits, mode, cfg in ((4, 0, {"RT": 1, "U": 1, "KS": 4, "RG": 1}), (4, 1, {"RT": 4, "U": 2, "KS": 8, "RG": 1}),
                            (8, 0, {"RT": 2, "U": 2, "KS": 16, "RG": 1, "PF": 1})):
        d = simt_defines_for(bits, 0, 0, mode, cfg)
        fn = nvrtc.get_function(SIMT_SOURCE, SIMT_KERNEL, d, torch.device("cuda"))
        cubin = nvrtc.compile_cubin(SIMT_SOURCE, tuple(sorted(d.items())), f"sm_{major}{minor}")
        assert nvrtc.num_registers(fn) == nvrtc.cubin_registers(cubin)[SIMT_KERNEL], cfg


def test_wg_simt_config_keeps_a_tile_to_its_rounds():
    """The H100's k24/n28 int4 tile (4 row tiles a warp, BPS 2) serves 4096x14336 (224 blocks: 2 per SM) and not
    3584x18944 (296: 3 per SM, a second round of resident blocks), which takes the step-cost model's tile (sym) or the
    rule (zero point) and says why."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config, wg_simt_packs, wg_simt_rule
    from mixgemm.tuning.gemv_steps import WG_SIMT

    name = "NVIDIA H100 80GB HBM3"
    tile = wg_simt_config(14336, 4096, 4, 132, name)
    assert (tile["RT"], tile["U"], tile["PF"], tile["KS"]) == (4, 2, 0, 8) and "k24/n28" in tile.source
    wide = wg_simt_config(18944, 3584, 4, 132, name)
    want = cheapest_wg_simt_tile(18944, 3584, 4, "sym", 132, WG_SIMT["H100"]["w4 sym"]).config()
    assert dict(wide) == want and "exceed its BPS 2" in wide.source and "step-cost model" in wide.source
    zp = wg_simt_config(18944, 3584, 4, 132, name, "zero_point")
    want = cheapest_wg_simt_tile(18944, 3584, 4, "zero_point", 132, WG_SIMT["H100"]["w4 zero_point"]).config()
    assert dict(zp) == wg_simt_packs(want, "zero_point")
    assert "exceed its BPS 2" in zp.source and "step-cost model" in zp.source
    off = wg_simt_config(18944, 3584, 4, 132, name, "offset")
    assert dict(off) == wg_simt_packs(wg_simt_rule(18944, 3584, 4, 132), "offset") and "the rule" in off.source


def test_wg_simt_config_models_layers_no_bucket_serves():
    """Where no measured bucket serves an fp16 layer (4096x4096 on the H100) it takes the tile of least modelled cost
    with its GPU's costs for its family (the H200's on an H200, the H100's on another GPU): int4 sym and zero point
    (PACK where PF is on, as the costs were timed), int8 sym; offset weights and int8 with a zero point keep the rule
    (no fitted costs)."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile
    from mixgemm.kernels.cuda_gemv_wg_simt.host import ModelledConfig, wg_simt_config, wg_simt_packs, wg_simt_rule
    from mixgemm.tuning.gemv_steps import WG_SIMT, wg_simt_step_costs

    for gpu, costs in (("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("some GPU", "H100")):
        assert wg_simt_step_costs(gpu, 4, "sym") is WG_SIMT[costs]["w4 sym"]
        assert wg_simt_step_costs(gpu, 8, "sym") is WG_SIMT[costs]["w8"]
        assert wg_simt_step_costs(gpu, 4, "zero_point") is WG_SIMT[costs]["w4 zero_point"]
        assert wg_simt_step_costs(gpu, 4, "zero_point", 1) is WG_SIMT[costs]["w4 zero_point bf16"]
        assert wg_simt_step_costs(gpu, 4, "offset") is None and wg_simt_step_costs(gpu, 8, "zero_point") is None
    h100 = "NVIDIA H100 80GB HBM3"
    sym = wg_simt_config(4096, 4096, 4, 132, h100, one_step=False)
    assert dict(sym) == cheapest_wg_simt_tile(4096, 4096, 4, "sym", 132, WG_SIMT["H100"]["w4 sym"]).config()
    assert isinstance(sym, ModelledConfig) and "step-cost model" in sym.source and "PACK" not in sym
    other = wg_simt_config(4096, 4096, 8, 132, "some GPU", one_step=False)
    assert dict(other) == cheapest_wg_simt_tile(4096, 4096, 8, "sym", 132, WG_SIMT["H100"]["w8"]).config()
    zp = wg_simt_config(4096, 4096, 4, 132, h100, "zero_point", one_step=False)
    tile = cheapest_wg_simt_tile(4096, 4096, 4, "zero_point", 132, WG_SIMT["H100"]["w4 zero_point"])
    assert dict(zp) == wg_simt_packs(tile.config(), "zero_point") and zp["PACK"] == tile.PF
    for bits, mode in ((4, "offset"), (8, "zero_point")):
        got = wg_simt_config(4096, 4096, bits, 132, h100, mode, one_step=False)
        assert got == wg_simt_packs(wg_simt_rule(4096, 4096, bits, 132), mode) and not isinstance(got, ModelledConfig)


def test_wg_simt_config_models_groups_of_32_with_their_own_family():
    """GGUF's groups of 32 (the G32 build: two parameter sets per 64-k tile, other registers): W4 sym (q4_0) and W4
    offset (q4_1 / Q4_K) take their own fitted costs and the G32 builds' registers where no bucket serves (the H200 the
    H100's: no H200 fit); a groups-of-32 family without costs (int8, q8_0; bf16 x) takes its larger groups' family,
    registers and costs; offset at larger groups keeps the rule."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile
    from mixgemm.kernels.cuda_gemv_wg_simt.host import ModelledConfig, wg_simt_config, wg_simt_packs, wg_simt_rule
    from mixgemm.tuning.gemv_steps import WG_SIMT, wg_simt_step_costs

    h100 = "NVIDIA H100 80GB HBM3"
    for gpu in (h100, "NVIDIA H200"):
        assert wg_simt_step_costs(gpu, 4, "sym", 0, 1) is WG_SIMT["H100"]["w4 sym g32"]
        assert wg_simt_step_costs(gpu, 4, "offset", 0, 1) is WG_SIMT["H100"]["w4 offset g32"]
        assert wg_simt_step_costs(gpu, 8, "sym", 0, 1) is None and wg_simt_step_costs(gpu, 4, "offset") is None
    for mode, family in (("sym", "w4 sym g32"), ("offset", "w4 offset g32")):
        got = wg_simt_config(4096, 4096, 4, 132, h100, mode, one_step=False, g32=1)
        tile = cheapest_wg_simt_tile(4096, 4096, 4, mode, 132, WG_SIMT["H100"][family], 0, 1)
        assert isinstance(got, ModelledConfig) and dict(got) == wg_simt_packs(tile.config(), mode), mode
        assert "G32" not in got  # the launch sets it from the layout's group size
    for bits, act, family in ((8, 0, "w8"), (4, 1, "w4 sym bf16")):
        got = wg_simt_config(4096, 4096, bits, 132, h100, "sym", act, one_step=False, g32=1)
        tile = cheapest_wg_simt_tile(4096, 4096, bits, "sym", 132, WG_SIMT["H100"][family], act, 0)
        assert dict(got) == tile.config(), (bits, act)
    off = wg_simt_config(4096, 4096, 4, 132, h100, "offset", one_step=False)
    assert dict(off) == wg_simt_packs(wg_simt_rule(4096, 4096, 4, 132), "offset")


def test_wg_simt_config_bf16_models_with_its_own_costs():
    """bf16 x: a bucket measured with fp16 x serves it as it serves fp16 (the H100's k24/n28 int4 tile on 4096x14336);
    where none serves, the tile of least modelled cost with the bf16 costs and the bf16 build's registers (its own
    tile, not fp16's where they differ); a family without bf16 costs (offset) the rule."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile
    from mixgemm.kernels.cuda_gemv_wg_simt.host import ModelledConfig, wg_simt_config, wg_simt_packs, wg_simt_rule
    from mixgemm.tuning.gemv_steps import WG_SIMT

    h100 = "NVIDIA H100 80GB HBM3"
    assert wg_simt_config(14336, 4096, 4, 132, h100, act=1) == wg_simt_config(14336, 4096, 4, 132, h100)
    differ = 0
    for mode in ("sym", "zero_point"):
        got = wg_simt_config(18944, 3584, 4, 132, h100, mode, act=1, one_step=False)
        tile = cheapest_wg_simt_tile(18944, 3584, 4, mode, 132, WG_SIMT["H100"][f"w4 {mode} bf16"], 1)
        assert isinstance(got, ModelledConfig) and dict(got) == wg_simt_packs(tile.config(), mode)
        assert "bf16 activations" in got.source
        differ += dict(got) != dict(wg_simt_config(18944, 3584, 4, 132, h100, mode, one_step=False))
    assert differ
    off = wg_simt_config(18944, 3584, 4, 132, h100, "offset", act=1, one_step=False)
    assert dict(off) == wg_simt_packs(wg_simt_rule(18944, 3584, 4, 132), "offset")


def test_wg_simt_config_zero_point_packs_and_has_its_own_table():
    """Zero-point weights: their table's bucket first (4096x28672: RT 2 U 2 KS 4 unpacked, BPS 7), else the shared
    table's tile or the step-cost model's, with the parameter pair in one register (PACK) exactly where the tile double
    buffers (PF); offset weights the same without a table or costs of their own (the rule); sym weights never carry
    PACK; a GPU without tables takes the model with the H100's costs, packed as PF says."""
    from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_wg_simt_tile
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config, wg_simt_packs, wg_simt_rule
    from mixgemm.tuning.gemv_steps import WG_SIMT

    name = "NVIDIA H100 80GB HBM3"
    own = wg_simt_config(28672, 4096, 4, 132, name, "zero_point")
    assert (own["RT"], own["U"], own["PF"], own["KS"], own["PACK"]) == (2, 2, 0, 4, 0)
    assert "H100 zero point" in own.source and "k24/n30" in own.source
    assert "PACK" not in wg_simt_config(28672, 4096, 4, 132, name, "sym")
    for n, k in ((14336, 4096), (57344, 8192)):  # the shared table's tile, as sym weights take it
        zp, sym = wg_simt_config(n, k, 4, 132, name, "zero_point"), wg_simt_config(n, k, 4, 132, name, "sym")
        assert {**sym, "PACK": sym["PF"]} == dict(zp) and "PACK" not in sym, (n, k)
    costs = WG_SIMT["H100"]["w4 zero_point"]
    for gpu, n, k in ((name, 18944, 3584), (name, 4096, 4096), ("some GPU", 4096, 4096)):  # BPS fallback, no bucket
        zp = wg_simt_config(n, k, 4, 132, gpu, "zero_point", one_step=False)
        tile = cheapest_wg_simt_tile(n, k, 4, "zero_point", 132, costs).config()
        assert dict(zp) == {**tile, "PACK": tile["PF"]}, (n, k)
    # offset weights (GGUF q4_1 / Q4_K): the shared table or the rule, packed as PF says
    for n, k in ((28672, 4096),):
        off, sym = wg_simt_config(n, k, 4, 132, name, "offset"), wg_simt_config(n, k, 4, 132, name, "sym")
        assert dict(off) == {**sym, "PACK": sym["PF"]}, (n, k)
    off = wg_simt_config(4096, 4096, 4, 132, "some GPU", "offset", one_step=False)
    assert off == wg_simt_packs(wg_simt_rule(4096, 4096, 4, 132), "offset")


@pytest.mark.parametrize("bits,group,mode,n,k", [
    (4, 128, "sym", 40, 256), (4, 32, "zero_point", 17, 96), (8, -1, "offset", 5, 40), (8, 64, "sym", 33, 192),
])
def test_gemv_mma_layout_round_trip(bits, group, mode, n, k, torch_gen):
    qw = quantize_weight(torch.randn(n, k, generator=torch_gen) * 0.02, bits=bits, group_size=group, mode=mode)
    lay = qw.layout("gemv_mma_v1", build_gemv_mma_v1)
    kt = 64 if bits == 4 else 32
    assert lay.weight.shape == (-(-n // 16), -(-k // kt), 32, 16)
    assert torch.equal(unpack_gemv_mma_v1(lay), qw.codes())
    base = qw.layout("gemv_v2", build_gemv_v2).params
    if group == -1 or -(-k // kt) * kt <= qw.num_groups * group:
        assert lay.params is base  # shared
    else:  # the padded half of the last 64-k tile reads a group of its own, zero
        assert torch.equal(lay.params[:, :qw.num_groups], base) and not lay.params[:, qw.num_groups:].any()
    c = qw.codes().long()
    if bits == 4:  # lane 5 = (g 1, t 1), word s = 2: e0 = W[1][16 + 8], e1 = W[1][16 + 9], e2 = W[9][16 + 8]
        by = lay.weight[0, 0, 5].long()
        word = by[8] | by[9] << 8 | by[10] << 16 | by[11] << 24
        assert int(word & 0xF) == c[1, 24] and int((word >> 16) & 0xF) == c[1, 25]
        assert int((word >> 4) & 0xF) == c[9, 24]
    else:  # lane 1 = (g 0, t 1), word 0 (s 0, row g): bytes W[0][8 .. 11]; word 2 (s 1): W[0][12 .. 15]
        assert lay.weight[0, 0, 1, 0:4].tolist() == c[0, 8:12].tolist()
        assert lay.weight[0, 0, 1, 8:12].tolist() == c[0, 12:16].tolist()
    assert lay.gk == (31 if group == -1 else group.bit_length() - 1)


@needs_nvrtc
def test_nvrtc_error_is_clear():
    with pytest.raises(nvrtc.NvrtcError, match="GEMV_BITS"):
        nvrtc.compile_cubin("cuda_gemv/gemv.cu", (("GEMV_BITS", "x+"),), "sm_90")


def test_mma_row_tiles_rule():
    """kernels.cuda_gemv_mma.host.mma_row_tiles: EARLY / RT 2 by layout, mode, M bucket, k-split cap and blocks per
    SM; int8 and
    every config's k-slice reduction within 32 KiB (KS x RG x RT <= 32)."""
    def pick(m, k, n, mode="sym", wg=None, bits=4):
        cfg = mma_config(m, n, k, bits, 128, 132, mode, wg)
        return cfg.get("EARLY", 0), cfg.get("RT", 1)

    def minb(m, k, n, mode="sym", wg=None):
        return mma_config(m, n, k, 4, 128, 132, mode, wg).get("MINB", 0)

    # M <= 8: EARLY, except zero point on gemv_mma_v1 below the k-split's cap
    assert pick(8, 8192, 28672) == (1, 1) and pick(1, 4096, 4096, "zero_point") == (1, 1)  # (4096 x 4096: KS 16)
    assert pick(8, 8192, 28672, "zero_point") == (0, 1) and pick(8, 8192, 28672, "zero_point", wg=1) == (1, 1)
    # M = 16, at most one block per SM (2048 rows: 128 blocks): EARLY on wgmma_v1 only
    assert pick(16, 2048, 2048) == (0, 1) and pick(16, 2048, 2048, wg=1) == (1, 1)
    # more blocks, k-split at its cap (4096 x 4096: KS 16): sym EARLY; zero point and wgmma_v1 EARLY + RT 2
    assert pick(16, 4096, 4096) == (1, 1)
    assert pick(16, 2048, 2560, "zero_point") == (1, 2) and pick(16, 4096, 4096, wg=1) == (1, 2)
    assert pick(16, 4096, 4096, "offset") == (1, 2) and minb(16, 4096, 4096, "offset") == 0
    # ... except zero point on gemv_mma_v1 with >= 3 64-k steps a slice: EARLY, RT 1 in two blocks per SM (MINB 2)
    assert pick(16, 4096, 4096, "zero_point") == (1, 1) and minb(16, 4096, 4096, "zero_point") == 2
    assert minb(9, 14336, 3584, "zero_point") == 2 and minb(16, 2048, 2560, "zero_point") == 0
    assert minb(8, 14336, 3584, "zero_point") == 0 and minb(16, 14336, 3584, "zero_point", wg=1) == 0
    # (fp16 activations: the same configs whatever the scale dtype; the registers' rule: test_mma_cap_rule_*)
    for sd in (torch.bfloat16, torch.float32):
        for mode in ("sym", "zero_point", "offset"):
            assert mma_config(16, 4096, 4096, 4, 128, 132, mode, scale_dtype=sd) == mma_config(16, 4096, 4096, 4, 128,
                                                                                              132, mode)
    # ... except zero point on wgmma_v1 at the cap: EARLY alone
    assert pick(16, 4096, 4096, "zero_point", wg=1) == (1, 1) and pick(16, 4096, 4096, "offset", wg=1) == (1, 1)
    # wide layers (KS 8): gemv_mma_v1 sym EARLY, zero point neither; wgmma_v1 RT 2 where half the warps fill the GPU
    assert pick(16, 8192, 28672) == (1, 1) and pick(16, 8192, 28672, "zero_point") == (0, 1)
    assert pick(16, 8192, 28672, wg=1) == (1, 2) and pick(16, 8192, 8192, wg=1) == (0, 1)
    assert wave_efficiency(396, 396) == 1.0 and wave_efficiency(448, 396) == pytest.approx(448 / 792)
    # ... unless RT 2's blocks spill just past one wave where RT 1's fill theirs better (3 against 4 blocks per SM)
    assert pick(16, 4096, 14336, wg=1) == (0, 1) and pick(16, 3072, 16384, wg=1) == (0, 1)
    assert pick(16, 3584, 18944, wg=1) == (1, 2) and pick(16, 4096, 12288, wg=1) == (1, 2)
    # int8 weights: EARLY on wgmma_v1 (their default layout) from M = 2, never RT 2; neither on gemv_mma_v1
    assert pick(16, 4096, 4096, bits=8) == (1, 1) and pick(2, 28672, 8192, bits=8) == (1, 1)
    assert pick(1, 4096, 4096, bits=8) == (0, 1) and pick(16, 4096, 4096, wg=0, bits=8) == (0, 1)
    for m, k, n, mode, wg, bits in itertools.product((1, 5, 16), (64, 896, 4096, 28672), (16, 200, 2048, 4096, 57344),
                                                     ("sym", "zero_point", "offset"), (0, 1), (4, 8)):
        cfg = mma_config(m, n, k, bits, 128, 132, mode, wg)
        assert cfg["KS"] * cfg["RG"] * cfg.get("RT", 1) <= 32, (m, k, n, cfg)


def test_mma_cap_rule_follows_the_registers(monkeypatch):
    """At the k-split's cap on gemv_mma_v1 past one wave, the 16-row bucket's RT 1 build decides by its registers
    (mma_cap_registers): EARLY alone in two blocks per SM (<= 64), capped to two (MINB 2) where that spills little and
    the slices are long, else RT 2; fp16 x never asks a different question than before (its builds' counts)."""
    from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host

    for regs, long_k, short_k in ((64, (1, 1, 0), (1, 1, 0)), (74, (1, 1, 2), (1, 2, 0)), (90, (1, 2, 0), (1, 2, 0))):
        monkeypatch.setattr(gemv_mma_host, "mma_cap_registers", lambda mode, act, scl, arch="sm_90", r=regs: r)
        for (k, n), want in (((4096, 4096), long_k), ((2048, 2560), short_k)):
            cfg = mma_config(16, n, k, 4, 128, 132, "sym", x_dtype=torch.bfloat16)
            assert (cfg.get("EARLY", 0), cfg.get("RT", 1), cfg.get("MINB", 0)) == want, (regs, k, n, cfg)
        # within one wave of blocks, or below the cap, or on wgmma_v1: not asked
        assert mma_config(16, 2048, 2048, 4, 128, 132, x_dtype=torch.bfloat16).get("MINB", 0) == 0
        assert mma_config(16, 28672, 8192, 4, 128, 132, x_dtype=torch.bfloat16).get("MINB", 0) == 0
        assert mma_config(16, 4096, 4096, 4, 128, 132, wg=1, x_dtype=torch.bfloat16).get("MINB", 0) == 0


def test_explain_says_why_the_registers_are_capped(monkeypatch):
    """mixgemm.explain's config source names the capped registers' count and the target it was compiled for."""
    from mixgemm.kernels import linear_common
    from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host
    from mixgemm.kernels.registry import choose

    monkeypatch.setattr(gemv_mma_host, "mma_cap_registers", lambda mode, act, scl, arch="sm_90": 74)
    qw = quantize_weight(torch.randn(4096, 4096), bits=4, group_size=128, scale_dtype=torch.bfloat16)
    c = choose(linear_common.linear_problem(16, qw, torch.bfloat16, H100))
    assert c.config["MINB"] == 2 and "takes 74 (NVRTC, sm_90)" in c.config_source


def test_mma_cap_registers_from_the_compiler():
    """mma_cap_registers reads the NVRTC cubin of the build it names (no GPU): the fp16 counts the rule was measured
    with (sym 64: two blocks per SM; zero point and offset more), and 64 for fp32 x, which that kernel does not take."""
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host

    if not nvrtc.nvrtc_available():
        pytest.skip("no NVRTC")
    assert gemv_mma_host.mma_cap_registers("sym", 0, 0) <= 64 < gemv_mma_host.mma_cap_registers("zero_point", 0, 0)
    assert gemv_mma_host.mma_cap_registers("offset", 0, 0) > gemv_mma_host.MMA_MINB2_MAX_REGISTERS
    assert gemv_mma_host.mma_cap_registers("sym", 2, 0) == 64


def test_wg_16row_tiles_rule():
    """Where a GPU's table has gemv_mma_wg_16row (the H200's), int4 sym on wgmma_v1 at M 9..16 takes KS 8 / RT 1 / U 2
    with two blocks' registers at the k-split's cap (more than one block per SM), RT 2 / U 2 / EARLY below it where RT
    2's blocks fit one wave, the wide rule did not take RT 2 and each slice gets two U 2 steps; the RT rule's choice
    elsewhere: one block per SM, past one wave, short K, zero point, bf16 x, M <= 8, the plain codes, and the H100 (no
    section). The GEMV / GEMM crossover of the wave fill (gemv_min_wave_fill) still reads the RT rule's tiles, so no
    layer changes kernel (4608x8192 and 5120x7168 at M = 16 stay on the GEMV)."""
    from mixgemm.kernels import cuda_gemv_mma, linear_common
    from mixgemm.kernels.cuda_gemv_mma.host import WG_16ROW_CAP, mma_config
    from mixgemm.kernels.registry import choose

    def cfg(k, n, m=16, mode="sym", gpu=H200, resident="wgmma_v1", act=torch.float16):
        qw = quantize_weight(torch.randn(128, 256), bits=4, group_size=128, mode=mode)
        p = replace(linear_common.linear_problem(m, qw, act, gpu), n=n, k=k, num_groups=-(-k // 128),
                    resident=resident)
        return dict(cuda_gemv_mma.choose_config(p))

    assert "gemv_mma_wg_16row" in H200.table and "gemv_mma_wg_16row" not in H100.table
    for k, n in ((4096, 4096), (2048, 2304), (14336, 4096)):  # at the cap, 144..256 row tiles
        for m in (9, 16):
            c = cfg(k, n, m)
            assert {key: c.get(key) for key in WG_16ROW_CAP} == WG_16ROW_CAP, (k, n, m, c)
        assert cfg(k, n, gpu=H100)["RT"] == 2 and cfg(k, n, gpu=H100)["KS"] == 16  # the RT rule's
    for k, n in ((5120, 5120), (4096, 6144), (3584, 8192)):  # below the cap, RT 2's blocks within one wave
        c = cfg(k, n)
        assert (c["RT"], c["KS"], c["U"], c["EARLY"], c.get("MINB", 0)) == (2, 8, 2, 1, 0), (k, n, c)
        assert cfg(k, n, gpu=H100).get("RT", 1) == 1
    assert cfg(4096, 14336).get("RT", 1) == 1  # 448 RT 2 blocks where 396 fit
    for k, n in ((4608, 8192), (5120, 7168)):  # >= 16 MiB: the crossover's fill is the RT rule's tiles'
        qw = quantize_weight(torch.randn(n, k), bits=4, group_size=128)
        p = replace(linear_common.linear_problem(16, qw, torch.float16, H200), resident="wgmma_v1")
        assert choose(p).kernel == "cuda_gemv_mma", (k, n)
    assert (cfg(3200, 8640)["RT"], cfg(3200, 8640)["U"]) == (2, 1)  # the wide rule's RT 2 stands
    assert cfg(896, 4864).get("RT", 1) == 1 and not cfg(896, 4864).get("EARLY", 0)  # 14 k-tiles: short slices
    assert "MINB" not in cfg(2048, 2048)  # 128 row tiles: one block per SM
    assert cfg(4096, 4096, mode="zero_point").get("MINB", 0) == 0
    assert cfg(4096, 4096, act=torch.bfloat16).get("MINB", 0) == 0  # measured with fp16 x and scales only
    assert cfg(4096, 4096, m=8)["KS"] == 16 and "MINB" not in cfg(4096, 4096, m=8)
    assert cfg(4096, 4096, resident=None)["WG"] == 0 and "MINB" not in cfg(4096, 4096, resident=None)
    # the function alone: the flag off is the RT rule
    assert mma_config(16, 4096, 4096, 4, 128, 132, wg=1)["RT"] == 2
    assert mma_config(16, 4096, 4096, 4, 128, 132, wg=1, wg_16row=True)["MINB"] == 2


def test_mma_pf_pack_rule():
    """kernels.cuda_gemv_mma.host.mma_pf_pack: double buffering with the zero point / offset pair in one register (PF
    + PACK)
    for int4 weights with such a pair, on the measured regions: 16-warp blocks at one per SM with EARLY, M 9..16
    grids of at most 24 warps per SM with deferred scaling, wgmma_v1 at M 2..8 from 32 warps per SM with two full steps
    a slice; never with two row tiles a warp. Sym weights take PF alone on their own regions."""
    def packed(m, k, n, mode="zero_point", wg=0, group=128, bits=4, pair=True):
        cfg = mma_config(m, n, k, bits, group, 132, mode, wg, pair_packs=pair)
        assert cfg.get("PF", 0) == cfg.get("PACK", 0), cfg
        return cfg.get("PACK", 0)

    # 16-warp blocks (KS 16), 64 of them: both layouts at M 2..8 (EARLY); at M = 16 only wgmma_v1 has EARLY
    assert packed(2, 8192, 1024) and packed(8, 8192, 1024, wg=1) and packed(16, 8192, 1024, wg=1)
    assert not packed(16, 8192, 1024) and not packed(2, 4096, 4096, wg=1)  # (256 blocks: two per SM)
    # M = 16, 8-warp blocks: 320 blocks (19 warps per SM) yes, 448 (27) no; groups of 32 (no deferred scaling) no
    assert packed(16, 5120, 5120) and packed(16, 5120, 5120, wg=1) and packed(16, 5120, 5120, "offset", wg=1)
    assert not packed(16, 5120, 7168, wg=1) and not packed(16, 5120, 5120, "offset", wg=1, group=32)
    # M 2..8 on wgmma_v1: many waves and two full steps a slice (4096 x 14336: 54 warps per SM, 4 steps) yes; the
    # plain layout, one step a slice (1536 x 8960) or a thin grid (5120 x 5120) no
    assert packed(2, 4096, 14336, wg=1) and packed(8, 8192, 28672, "offset", wg=1)
    assert not packed(2, 4096, 14336) and not packed(8, 1536, 8960, wg=1) and not packed(8, 5120, 5120, wg=1)
    # two row tiles a warp, fp32 scales (pair_packs False) and int8 weights never
    assert mma_config(16, 18944, 3584, 4, 128, 132, "zero_point", 1, pair_packs=True).get("RT") == 2
    assert not packed(16, 3584, 18944, wg=1) and not packed(2, 8192, 1024, pair=False)
    assert not packed(2, 8192, 1024, bits=8) and not packed(16, 5120, 5120, bits=8, wg=1)
    assert not packed(1, 8192, 1024) and not packed(1, 8192, 1024, wg=1)  # (M = 1 not measured)

    # sym weights: PF alone (no pair to pack), 16-warp blocks at one per SM only at M 2..8 (both layouts), smaller
    # blocks in one wave of at most 24 warps per SM on gemv_mma_v1 (M 2..16), and on wgmma_v1 the zero point's wide
    # region at M 2..8 up to 96 warps per SM (4096 x 14336: 54 warps per SM, 4 steps a slice)
    def pf_sym(m, k, n, wg=0, bits=4):
        cfg = mma_config(m, n, k, bits, 128 if bits == 4 else k, 132, "sym", wg)
        assert "PACK" not in cfg, cfg
        return cfg.get("PF", 0)

    assert pf_sym(2, 8192, 1024) and pf_sym(8, 8192, 1024, wg=1) and not pf_sym(16, 8192, 1024, wg=1)
    assert not pf_sym(1, 8192, 1024) and not pf_sym(1, 5120, 5120)
    assert pf_sym(2, 5120, 5120) and pf_sym(16, 5120, 5120) and not pf_sym(2, 5120, 5120, wg=1)
    assert not pf_sym(2, 5120, 7168) and not pf_sym(2, 4096, 4096) and not pf_sym(2, 4096, 14336)
    assert pf_sym(2, 4096, 14336, wg=1) and pf_sym(8, 4096, 22016, wg=1) and not pf_sym(16, 4096, 14336, wg=1)
    assert not pf_sym(8, 8192, 28672, wg=1)  # (109 warps per SM: past three waves)
    assert not pf_sym(2, 5120, 5120, wg=1) and not pf_sym(8, 1536, 8960, wg=1)  # (19 warps per SM; one step a slice)
    # int8 (per channel, wgmma_v1): 16-warp blocks at one per SM at M 2..8, not past one block per SM nor at M = 16
    def pf8(m, k, n):
        return pf_sym(m, k, n, wg=None, bits=8)  # (int8's default layout)

    assert pf8(2, 8192, 1024) and pf8(8, 8192, 1024) and not pf8(16, 8192, 1024)
    assert not pf8(2, 4096, 4096) and not pf8(2, 4096, 14336)  # (256 blocks; 54 warps per SM)
    # and 8-warp blocks in one wave of at most 24 warps per SM (an H200 table's tile: 320 blocks, 19 warps per SM) at
    # M 2..8 only
    one_wave = {"U": 2, "KS": 8, "RG": 1, "WG": 1, "EARLY": 1, "DEFER": 1}
    assert mma_pf_pack(one_wave, 2, 5120, 80, 132, pair=False, bits=8)["PF"] == 1
    assert "PF" not in mma_pf_pack(one_wave, 16, 5120, 80, 132, pair=False, bits=8)
    assert mma_pf_pack(one_wave, 2, 5120, 80, 132, pair=False, bits=4) == one_wave  # (int4 on wgmma_v1: not there)


def test_choose_config_fills_gpu():
    for n, kc in ((4096, 128), (4096, 448), (28672, 256), (8192, 896), (7, 40), (100000, 8)):
        for m in (1, 2, 16):
            cfg = choose_config(m, n, kc, 132, act=int(m == 1))  # (fp16 at M = 1: the step-cost model, below)
            assert cfg["RG"] * cfg["KS"] == 8 and cfg["PF"] in (0, 1)
            warps = -(-n // cfg["R"]) * cfg["KS"]
            # split-K stops once the grid has ~62 warps per SM, at 8 slices, or when lanes run dry
            assert warps >= 132 * 62 or cfg["KS"] == 8 or kc < 32 * cfg["U"] * cfg["KS"] * 2, (n, kc, m, cfg)
            mcfg = choose_mma_config(1 if m <= 8 else 2, n, kc // 2, 132)
            assert mcfg["RG"] * mcfg["KS"] >= 8 and mcfg["KS"] <= 16
    # the tensor-core GEMV's split: KS 8..16 until 16 (int4) / 24 (int8) warps per SM; U 1 at the 16-row M bucket
    # once every slice streams >= 3 k-tiles (int4 only at KS 8)
    assert choose_mma_config(1, 4608, 56, 132) == {"U": 2, "KS": 8, "RG": 1, "PF": 0, "DEFER": 1}  # 288 x 8 warps
    assert choose_mma_config(1, 4096, 56, 132)["KS"] == 16  # 256 x 8 < 16 x 132
    assert choose_mma_config(2, 4096, 56, 132)["U"] == 2 and choose_mma_config(2, 4608, 56, 132)["U"] == 1
    assert choose_mma_config(2, 4608, 20, 132)["U"] == 2  # 20 k-tiles over 8 slices
    assert choose_mma_config(1, 4608, 112, 132, 8)["KS"] == 16 and choose_mma_config(2, 4608, 112, 132, 8)["U"] == 1
    # kt >= 2 KS caps the split
    assert choose_mma_config(1, 4096, 14, 132)["KS"] == 8 and choose_mma_config(1, 4096, 7, 132)["KS"] == 4
    # the tuned table wins for the protocol shapes (M = 1, fp16)
    for mode in ("", "sym"):  # K = 28672: the bulk-copy ring tile
        cfg = choose_config(1, 8192, 896, 132, 0, 4, 28672, "NVIDIA H200", mode)
        assert {k: cfg.get(k) for k in ("R", "U", "RG", "KS", "PF", "BULK")} == {"R": 8, "U": 1, "RG": 1, "KS": 7,
                                                                                 "PF": 0, "BULK": 2}
    cfg = choose_config(1, 28672, 256, 132, 0, 4, 8192, "NVIDIA H200", "sym")
    assert {k: cfg[k] for k in ("R", "U", "RG", "KS", "PF")} == {"R": 4, "U": 2, "RG": 2, "KS": 4, "PF": 0}
    assert [m_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    # H100 tiles with non-power-of-two k-slices, their own row groups, launch bounds and LITE
    h100 = "NVIDIA H100 80GB HBM3"
    # and, K = 28672, the bulk-copy ring with 8 rows per warp
    for mode in ("sym", "zero_point"):
        want = {"R": 8, "KS": 7, "RG": 1, "MINB": 2, "LITE": 1, "BULK": 2}
        cfg = choose_config(1, 8192, 896, 132, 0, 4, 28672, h100, mode)
        assert {k: cfg.get(k) for k in want} == want, (mode, cfg)
    cfg = choose_config(1, 4096, 448, 132, 0, 4, 14336, h100, "offset")
    assert (cfg["KS"], cfg["RG"], cfg["MINB"]) == (7, 2, 2) and not cfg.get("LITE")
    assert "MINB" not in choose_config(1, 4096, 448, 132, 0, 4, 14336, h100, "sym")


@pytest.mark.parametrize("bits,group,mode,k", [
    (4, 128, "sym", 256), (4, 32, "zero_point", 96), (4, -1, "offset", 72), (4, -1, "zero_point", 40),
    (8, 64, "zero_point", 192), (8, -1, "sym", 40), (8, 256, "offset", 512),
])
def test_gemv_v2_is_the_plain_buffer(bits, group, mode, k, torch_gen):
    """gemv_v2 holds the codes in the plain order: the weight's own qweight wherever K is a whole number of chunks
    (no copy); a per-channel K past the last chunk gets a padded copy with the zero point (offset: 0) as codes; a
    misaligned or strided qweight gets a copy too."""
    n = 7
    qw = quantize_weight(torch.randn(n, k, generator=torch_gen) * 0.02, bits=bits, group_size=group, mode=mode)
    before = qw.qweight.clone()
    lay = qw.layout("gemv_v2", build_gemv_v2)
    assert torch.equal(qw.qweight, before)
    chunk = 32 if bits == 4 else 16
    assert (lay.weight is qw.qweight) == (k % chunk == 0)
    assert lay.weight.shape == (n, lay.k_padded * bits // 8) and lay.weight.is_contiguous()
    assert torch.equal(unpack_gemv_v2(lay), qw.codes())
    if k % chunk == 0:  # a qweight view at a 2-byte offset, or strided: copied into an aligned contiguous buffer
        wide = torch.zeros(n, qw.qweight.shape[1] + 2, dtype=torch.uint8)
        wide[:, 2:] = qw.qweight
        for view in (wide[:, 2:], torch.stack([qw.qweight, qw.qweight], 1)[:, 0]):
            other = replace(qw, qweight=view, _layouts={})
            lay = other.layout("gemv_v2", build_gemv_v2)
            assert lay.weight is not view and lay.weight.is_contiguous() and torch.equal(lay.weight, qw.qweight)


@pytest.mark.parametrize("bits,group,mode,k", [
    (4, 128, "sym", 256), (4, 32, "zero_point", 96), (4, -1, "offset", 72), (4, -1, "zero_point", 40),
    (8, 64, "zero_point", 192), (8, -1, "sym", 40), (8, 256, "offset", 512),
])
def test_gemv_layout_round_trip(bits, group, mode, k, torch_gen):
    n = 7
    w = torch.randn(n, k, generator=torch_gen) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group, mode=mode)
    before = qw.qweight.clone()
    lay = qw.layout("gemv_v2", build_gemv_v2)
    assert torch.equal(qw.qweight, before)  # plain packing untouched
    assert qw.layout("gemv_v2", build_gemv_v2) is lay  # cached
    chunk = 32 if bits == 4 else 16
    assert lay.k_padded % chunk == 0 and lay.k_padded >= k and lay.k_padded - k < chunk
    assert lay.weight.shape == (n, lay.k_padded * bits // 8) and lay.weight.dtype == torch.uint8
    assert torch.equal(unpack_gemv_v2(lay), qw.codes())
    codes = qw.codes()
    if bits == 4:  # nibble p of 32-bit word i holds k = 8 i + p, read bit by bit here
        by = lay.weight[:, :4].to(torch.int64)
        word = by[:, 0] | by[:, 1] << 8 | by[:, 2] << 16 | by[:, 3] << 24
        for p in range(8):
            assert torch.equal((word >> (4 * p)) & 0xF, codes[:, p].to(torch.int64))
        # the pair that one lop3 with mask 0x000f000f extracts is (k0, k0+4): the kernel pairs x the same way
        assert torch.equal(word & 0xF, codes[:, 0].long())
        assert torch.equal((word >> 16) & 0xF, codes[:, 4].long())
    g = qw.group_size
    if mode == "sym":
        assert torch.equal(lay.params, qw.scales)
    else:
        second = qw.zeros.to(qw.scales.dtype) if mode == "zero_point" else qw.offsets
        assert torch.equal(lay.params[..., 0], qw.scales) and torch.equal(lay.params[..., 1], second)
    # group of chunk c is c >> gshift
    for c in range(lay.chunks_per_row):
        expect = 0 if group == -1 else (c * chunk) // g
        assert (c >> lay.gshift) == expect
    if lay.k_padded > k:  # padding codes are the zero point (offset: 0)
        pad = unpack_gemv_v2(replace(lay, k=lay.k_padded))[:, k:]
        zc = 0 if mode == "offset" else qw.zero_points()[:, :1]
        assert torch.equal(pad.long(), (torch.zeros_like(pad).long() + zc))


# ----------------------------------------------------------------------------------------------- GPU


@pytest.fixture(autouse=True)
def _gemv_up_to_m16(monkeypatch):
    """These tests run the GEMV at every M up to 16 through mixgemm.matmul; the shipped GPU table hands M above its
    gemv_max_m (H200: 8 for int4, 1 for int8) to the wgmma GEMM, so the dispatch limit is lifted to 16 here."""
    from mixgemm.kernels import gemv_crossover

    monkeypatch.setattr(gemv_crossover, "_gemv_limit", lambda problem: (16, None))

def _make(n, k, bits, group, mode, scale_dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
    return quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype), gen


def _check(x, qw, bias=None, activation=None):
    y = mixgemm.matmul(x, qw, bias, activation)
    r = ref.matmul(x, qw, bias, activation, out_dtype=torch.float64)
    assert y.dtype == x.dtype and y.shape == r.shape
    err = float((y.double() - r).norm() / r.norm())
    assert err <= TOL[x.dtype], f"rel err {err:.2e} > {TOL[x.dtype]:.0e}"
    return err


# the GEMV entries a kernel kind forces (fp32 activations take the CUDA-core kernel either way); wg_simt: the CUDA-core
# GEMV on wgmma_v1 at M = 1, the tensor-core GEMV on that layout at M > 1
FORCE = {"mma": ("cuda_gemv_mma", "cuda_gemv"), "mma_wg": ("cuda_gemv_mma", "cuda_gemv"),
         "wg_simt": ("cuda_gemv_wg_simt", "cuda_gemv_mma", "cuda_gemv"), "simt": "cuda_gemv"}
# the tensor-core kernel on each layout, whichever is the bit width's default: gemv_mma_v1 (WG 0) and wgmma_v1 (WG 1)
CONFIGS = {"mma": {"cuda_gemv_mma": {"WG": 0}}, "mma_wg": {"cuda_gemv_mma": {"WG": 1}},
           "wg_simt": {"cuda_gemv_mma": {"WG": 1}}}


@pytest.fixture(params=["mma", "mma_wg", "wg_simt", "simt"])
def kernel(request):
    """Run a test through the tensor-core kernel (default for fp16/bf16) and the CUDA-core one."""
    with kernel_options(force=FORCE[request.param], configs=CONFIGS.get(request.param, {})):
        yield request.param


@pytest.mark.gpu
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16, torch.float32])
def test_gemv_every_format(bits, mode, group, act, kernel):
    """Odd N (not a multiple of any row tile), K a multiple of the group (per-channel: not a multiple of
    the 32/16 chunk), M = 1 and 5, with bias and relu6 at M = 5."""
    k = 200 if group == -1 else 3 * 256
    qw, gen = _make(203, k, bits, group, mode, torch.float16, 1)
    for m in (1, 5):
        x = torch.randn(m, k, generator=gen, device="cuda").to(act)
        if m == 1:
            _check(x, qw)
        else:
            bias = torch.randn(203, generator=gen, device="cuda").to(act) * 0.1
            _check(x * 4, qw, bias, "relu6")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["mma", "wg_simt", "simt"])
def test_gemv_epilogue_follows_each_call(kind):
    """A prepared GEMV launch writes its bias / clamp parameters only when a call asks for other ones than the last
    (kernels/cuda/gemv_launch.GemvLaunch): one weight and M, calls alternating none, bias + relu6, none, relu, bias,
    none, each against the reference."""
    qw, gen = _make(211, 768, 4, 128, "zero_point", torch.float16, 5)
    bias = torch.randn(211, generator=gen, device="cuda").half() * 0.1
    x = torch.randn(1, 768, generator=gen, device="cuda").half() * 4
    with kernel_options(force=FORCE[kind], configs=CONFIGS.get(kind, {})):
        for b, activation in ((None, None), (bias, "relu6"), (None, None), (None, "relu"), (bias, None), (None, None)):
            _check(x, qw, b, activation)


def _check_every_group(bits, mode, act, ms, long_ms, seed, config_has=None):
    """The kernel the caller's kernel_options select, over every group size with odd N (211: 14 row tiles) at each M of
    ``ms`` (plain, and x 4 with bias + relu6), then x + 3 (a large common offset) on a long K (14336) at each M of
    ``long_ms``, groups of 128 and per channel; ``config_has``: a string the explained config must contain."""
    for group in GROUPS:
        k = 200 if group == -1 else 3 * 256
        qw, gen = _make(211, k, bits, group, mode, torch.float16, seed)
        bias = torch.randn(211, generator=gen, device="cuda").to(act) * 0.1
        for m in ms:
            x = torch.randn(m, k, generator=gen, device="cuda").to(act)
            _check(x, qw)
            _check(x * 4, qw, bias, "relu6")
        if config_has is not None:
            assert config_has in str(mixgemm.explain(x, qw).config)
    for group in (128, -1):
        qw, gen = _make(129, 14336, bits, group, mode, torch.float16, seed + 1)
        for m in long_ms:
            _check((torch.randn(m, 14336, generator=gen, device="cuda") + 3).to(act), qw)


@pytest.mark.gpu
@pytest.mark.parametrize("wg", [0, 1])
@pytest.mark.parametrize("defer", [0, 1])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_mma_scaling_schemes(wg, defer, bits, mode, act):
    """Every scaling scheme of the tensor-core kernel over every group size (MMA_DEFER asked 0 or 1: the kernel takes 1
    wherever each k-tile lies in one group, 0 where one straddles groups, int4 group 32), M = 1, 7 and 16, odd N,
    bias + relu6, and activations with a large common offset (x + 3) on a long K, grouped and per channel."""
    with kernel_options(force=FORCE["mma"], configs={"cuda_gemv_mma": {"DEFER": defer, "WG": wg}}):
        _check_every_group(bits, mode, act, (1, 7, 16), (1, 16), 11)


@pytest.mark.gpu
@pytest.mark.parametrize("wg", [0, 1])
@pytest.mark.parametrize("ks,u,rt,pf,early,minb", [(8, 1, 2, 0, 1, 0), (4, 2, 2, 1, 1, 0), (16, 1, 2, 0, 0, 0),
                                                   (2, 2, 4, 1, 1, 0), (8, 2, 1, 1, 1, 0), (16, 2, 1, 0, 1, 0),
                                                   (16, 2, 1, 0, 1, 2), (8, 2, 1, 0, 1, 2), (8, 2, 2, 0, 1, 0)])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_mma_row_tiles(wg, ks, u, rt, pf, early, minb, bits, mode, act):
    """The tensor-core GEMV with RT row tiles per warp sharing the B fragments, the first step's weights loaded before
    the PDL wait (EARLY), double buffering and registers capped for two blocks per SM (MINB 2: spills), on both
    layouts: every group size, row tiles past the last one (N 211: 14 tiles), k-slices with a partial step or none,
    M = 2, 9 and 16, bias + relu6, and x + 3 on a long K."""
    cfg = {"WG": wg, "KS": ks, "RG": max(1, 8 // ks), "U": u, "RT": rt, "PF": pf, "EARLY": early, "MINB": minb}
    with kernel_options(force=FORCE["mma"], configs={"cuda_gemv_mma": cfg}):
        _check_every_group(bits, mode, act, (2, 9, 16), (16,), 15, f"'RT': {rt}")


@pytest.mark.gpu
@pytest.mark.parametrize("wg", [0, 1])
@pytest.mark.parametrize("ks,u,rt,pf,early", [(8, 1, 1, 1, 1), (4, 2, 2, 1, 1), (16, 2, 1, 0, 1), (8, 2, 1, 1, 0)])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["zero_point", "offset"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_mma_packed_params(wg, ks, u, rt, pf, early, bits, mode, act):
    """The tensor-core GEMV with each (row, group)'s scale and zero point / offset held in one register (MMA_PACK), on
    both layouts, double buffered or not: every group size, row tiles past the last one, partial k-slices, M = 2, 9 and
    16, bias + relu6, and x + 3 on a long K."""
    cfg = {"WG": wg, "KS": ks, "RG": max(1, 8 // ks), "U": u, "RT": rt, "PF": pf, "EARLY": early, "PACK": 1}
    with kernel_options(force=FORCE["mma"], configs={"cuda_gemv_mma": cfg}):
        _check_every_group(bits, mode, act, (2, 9, 16), (16,), 19, "'PACK': 1")


def test_wg_simt_rule_wave_guard():
    """The small-layer int4 tile of the CUDA-core GEMV on wgmma_v1 takes RT 2 where RT 1's 16-warp blocks need a second
    round of the SMs' resident slots and RT 2's fit in one (N 4352-4864 on 132 SMs; N 4096 on 114); RT 1 where its
    blocks fit (N 4096 on 132 SMs) or smaller blocks hold more of them (KS 8 from N 5120); int8 and layers of >= 16
    MiB keep their tiles."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_rounds, wg_simt_rule

    for n, sms, rt in ((4096, 132, 1), (4224, 132, 1), (4352, 132, 2), (4608, 132, 2), (4864, 132, 2), (5120, 132, 1),
                       (4096, 114, 2)):
        c = wg_simt_rule(n, 3584, 4, sms)
        assert (c["RT"], c["U"], c["PF"]) == (rt, 1, 1), (n, sms, c)
        assert (wg_simt_rounds(n, 1, c["RG"], c["KS"], sms) > 1) == (rt == 2)
    assert wg_simt_rule(4608, 3584, 8, 132)["RT"] == 1  # int8
    assert wg_simt_rule(4608, 8192, 4, 132)["U"] == 2  # >= 16 MiB: the big-layer tile


@pytest.mark.gpu
@pytest.mark.parametrize("ks,u,rt,pf", [(1, 1, 1, 0), (4, 2, 2, 1), (16, 4, 1, 0), (2, 1, 8, 0), (8, 2, 4, 1),
                                        (32, 1, 1, 1), (16, 1, 2, 1), (8, 2, 1, 0), (32, 2, 1, 0), (32, 1, 2, 1)])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_simt_on_wgmma_v1(ks, u, rt, pf, bits, mode, act):
    """The M = 1 CUDA-core math on wgmma_v1 (gemv_wg_simt.cu) over every group size, k-splits that leave slices with a
    partial step or none, row tiles per warp past the last tile (N 211: 14 tiles), double buffering, odd N, bias +
    relu6, and activations with a large common offset (x + 3) on a long K."""
    cfg = {"KS": ks, "RG": max(1, 8 // ks), "U": u, "RT": rt, "PF": pf}
    with kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": cfg}):
        _check_every_group(bits, mode, act, (1,), (1,), 13, f"'KS': {ks}")


@pytest.mark.gpu
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_gemv_simt_bf16_range(bits, mode):
    """bf16 x on the M = 1 CUDA-core math on wgmma_v1 (exact fp16 under a power of two per k-tile): magnitudes far
    outside fp16's range (2^-120 .. 2^100), k-tiles 2^80 apart in one row (the small ones below what the result
    keeps), a tile spanning 2^-30 of its maximum, all-zero tiles, and inf / nan propagating."""
    cfg = {"KS": 4, "RG": 2, "U": 2, "RT": 2, "PF": 1}
    qw, gen = _make(211, 1024, bits, 128, mode, torch.float16, 91)
    x = torch.randn(1, 1024, generator=gen, device="cuda", dtype=torch.float64)
    with kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": cfg}):
        for p in (-120, -40, 0, 17, 100):
            _check((x * 2.0 ** p).to(torch.bfloat16), qw)
        tiles = x.view(1, 16, 64) * (2.0 ** torch.tensor([40, -40] * 8, device="cuda", dtype=torch.float64))[:, None]
        _check(tiles.view(1, 1024).to(torch.bfloat16), qw)
        span = x * 2.0 ** (-30 * torch.rand(1, 1024, generator=gen, device="cuda", dtype=torch.float64))
        _check(span.to(torch.bfloat16), qw)
        half_zero = x.clone()
        half_zero[:, 128:640] = 0
        _check(half_zero.to(torch.bfloat16), qw)
        assert not mixgemm.matmul(torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16), qw).any()
        special = x.to(torch.bfloat16)
        special[0, 70] = float("inf")
        assert not mixgemm.matmul(special, qw).isfinite().any()
        special[0, 70] = float("nan")
        assert mixgemm.matmul(special, qw).isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("ks,u,rt,pf", [(4, 2, 2, 1), (2, 1, 8, 0), (8, 2, 4, 0), (32, 1, 1, 1), (32, 1, 2, 1)])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", ["zero_point", "offset"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_simt_packed_params(ks, u, rt, pf, bits, mode, act):
    """The M = 1 CUDA-core math on wgmma_v1 with each (row, group)'s scale and zero point / offset held in one register
    (PACK): the same cases as the unpacked tiles (every group size, per channel, partial k-slices, rows past the last
    tile, bias + relu6, x + 3 on a long K)."""
    cfg = {"KS": ks, "RG": max(1, 8 // ks), "U": u, "RT": rt, "PF": pf, "PACK": 1}
    with kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": cfg}):
        _check_every_group(bits, mode, act, (1,), (1,), 17, "'PACK': 1")


@pytest.mark.gpu
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bits,mode", [(4, "sym"), (4, "zero_point"), (4, "offset"), (8, "zero_point"),
                                       (8, "offset")])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16, torch.float32])
def test_gemv_scale_dtypes(scale_dtype, bits, mode, act, kernel):
    qw, gen = _make(77, 512, bits, 64, mode, scale_dtype, 2)
    for m in (1, 16):
        _check(torch.randn(m, 512, generator=gen, device="cuda").to(act), qw)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_every_m(act, kernel):
    """M = 1..16 (every bucket and the rows it does not store), bias + relu, a split-K shape."""
    qw, gen = _make(96, 4096, 4, 128, "zero_point", torch.float16, 3)
    bias = torch.randn(96, generator=gen, device="cuda").to(act)
    qw8, _ = _make(96, 4096, 8, -1, "sym", torch.float16, 4)
    for m in range(1, 17):
        x = torch.randn(m, 4096, generator=gen, device="cuda").to(act)
        _check(x, qw, bias, "relu")
        _check(x, qw8)


@pytest.mark.gpu
@pytest.mark.parametrize("zsum", [0, 1])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_zero_points_at_the_range_ends(zsum, bits, group, act):
    """Zero-point rows at both ends of the code range (all-positive rows: z = 0; all-negative: z = 2^bits - 1), where
    the CUDA-core GEMV's x-sum form (ZSUM 1, gemv.cu GEMV_ZSUM) adds the largest (c - z) sum_k x_k, against x with a
    large common offset, M = 1 and 4; ZSUM 0: the per-row zero constants."""
    k, n = 14336 if group != 32 else 2048, 96
    gen = torch.Generator(device="cuda").manual_seed(21)
    w = torch.rand(n, k, generator=gen, device="cuda") * 0.02 + 1e-3
    w[n // 2:] = -w[n // 2:]
    qw = quantize_weight(w, bits=bits, group_size=group, mode="zero_point")
    z = qw.zero_points().float()
    assert z[: n // 2].max() == 0 and z[n // 2:].min() == 2**bits - 1
    with kernel_options(force="cuda_gemv", configs={"cuda_gemv": {"R": 4, "U": 1, "KS": 2, "ZSUM": zsum}}):
        for m in (1, 4):
            _check((torch.randn(m, k, generator=gen, device="cuda") + 3).to(act), qw)


@pytest.mark.gpu
def test_gemv_large_shape_split_k(kernel):
    qw, gen = _make(4096, 14336, 4, 128, "zero_point", torch.float16, 5)
    for m in (1, 3, 16):
        _check(torch.randn(m, 14336, generator=gen, device="cuda").half(), qw)


@pytest.mark.gpu
def test_gemv_strided_misaligned_and_3d_inputs(kernel):
    qw, gen = _make(130, 320, 4, 64, "offset", torch.float16, 6)
    base = torch.randn(4, 700, generator=gen, device="cuda").half()
    xs = [
        base[:, 1:321],                    # misaligned rows (2-byte offset)
        base[:, :640:2],                   # non-unit stride along K
        base.t().contiguous().t()[:, :320],  # column-major
        base[:3, 8:328].reshape(3, 320),
    ]
    for x in xs:
        before = x.clone()
        _check(x, qw)
        assert torch.equal(x, before)  # inputs never modified
    x3 = torch.randn(2, 3, 320, generator=gen, device="cuda").half()
    y = mixgemm.matmul(x3, qw)
    assert y.shape == (2, 3, 130)
    r = ref.matmul(x3, qw, out_dtype=torch.float64)
    assert float((y.double() - r).norm() / r.norm()) <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("bias_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gemv_bias_dtypes(bias_dtype, kernel):
    qw, gen = _make(64, 256, 4, 32, "sym", torch.float16, 7)
    x = torch.randn(2, 256, generator=gen, device="cuda").half()
    _check(x, qw, torch.randn(64, generator=gen, device="cuda").to(bias_dtype), None)
    nb = torch.randn(128, generator=gen, device="cuda").to(bias_dtype)[::2]  # non-contiguous bias
    _check(x, qw, nb, "relu")


@pytest.mark.gpu
def test_gemv_cuda_graph_and_stream(kernel):
    from mixgemm.kernels.cuda.gemv_direct import gemv

    qw, gen = _make(256, 1024, 4, 128, "zero_point", torch.float16, 8)
    x = torch.randn(1, 1024, generator=gen, device="cuda").half()
    y0 = gemv(x, qw, None, -math.inf, math.inf)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y1 = gemv(x, qw, None, -math.inf, math.inf)
    s.synchronize()
    assert torch.equal(y0, y1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = gemv(x, qw, None, -math.inf, math.inf)
    x.copy_(torch.randn(1, 1024, generator=gen, device="cuda").half())
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, gemv(x, qw, None, -math.inf, math.inf))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_kind", ["simt", "mma"])
def test_gemv_pdl_dependent_chain(kernel_kind):
    """Programmatic dependent launch: each GEMV reads the output of the kernel right before it (another GEMV,
    or a torch elementwise op), eagerly and replayed from a CUDA graph; results equal the PDL-off run bit for
    bit (the kernels are deterministic), so no GEMV read its x before the producer had finished."""
    with kernel_options(force=FORCE[kernel_kind]):
        from mixgemm.kernels.cuda.gemv_direct import gemv

        qa, gen = _make(2048, 2048, 4, 128, "zero_point", torch.float16, 21)
        qb, _ = _make(2048, 2048, 8, -1, "sym", torch.float16, 22)
        x0 = torch.randn(1, 2048, generator=gen, device="cuda").half()

        def chain(x):
            for _ in range(4):
                x = gemv(x, qa, None, -math.inf, math.inf)
                x = gemv(x * 0.05, qb, None, -math.inf, math.inf)  # the elementwise op writes gemv's x
                x = torch.tanh(x)
            return x

        assert_pdl_chain_matches(chain, x0)


# x in shared memory (XS) and light bookkeeping (LITE): (R, U, KS, XS, LITE, MINB)
XS_VARIANTS = [(4, 2, 2, 1, 1, 0), (4, 2, 2, 1, 1, 3), (4, 1, 8, 1, 0, 0), (2, 2, 2, 0, 1, 0), (2, 1, 8, 1, 1, 0),
               (4, 1, 2, 1, 1, 3)]


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_xs_variants(arch):
    for r, u, ks, xs, lite, minb in XS_VARIANTS:
        for bits, mode, scl in ((4, 1, 0), (8, 0, 0), (4, 2, 1), (8, 1, 2)):
            cfg = {"R": r, "U": u, "RG": 8 // ks, "KS": ks, "PF": 0, "XS": xs, "LITE": lite, "MINB": minb}
            key = tuple(sorted(defines_for(bits, 0, scl, mode, 1, cfg).items()))
            cubin = nvrtc.compile_cubin("cuda_gemv/gemv.cu", key, arch)
            assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key


@pytest.mark.gpu
@pytest.mark.parametrize("variant", XS_VARIANTS)
@pytest.mark.parametrize("bits,group,mode,scale_dtype", [
    (4, 128, "zero_point", torch.float16), (4, 64, "sym", torch.float16), (4, 32, "offset", torch.float16),
    (4, 128, "zero_point", torch.bfloat16), (8, -1, "sym", torch.float16), (8, 128, "zero_point", torch.float16),
    (8, -1, "zero_point", torch.float32)])
def test_gemv_xs_lite(variant, bits, group, mode, scale_dtype):
    """fp16 M = 1 with x in shared memory; K = 200 (per-channel, padded) or 3 * 256 and K = 8192; odd N;
    M = 3 and fp32 x fall back to the global-memory x path with the same config."""
    r, u, ks, xs, lite, minb = variant
    cfg = {"R": r, "U": u, "KS": ks, "PF": 0, "XS": xs, "LITE": lite, "MINB": minb}
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": cfg}):
        for n, k in ((203, 200 if group == -1 else 768), (1001, 8192)):
            qw, gen = _make(n, k, bits, group, mode, scale_dtype, 11)
            for m, act in ((1, torch.float16), (3, torch.float16), (1, torch.float32)):
                _check(torch.randn(m, k, generator=gen, device="cuda").to(act), qw)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 32, "zero_point"), (8, -1, "sym"),
                                             (8, 64, "offset")])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_gemv_mma_split_rule_at_m9_to_16(bits, group, mode, act):
    """The tensor-core GEMV's own configs at the 16-row M bucket where the split rule picks one k-tile in flight
    (choose_mma_config: int4 at KS 8 on >= 264 row tiles, int8 at KS 16): odd N past 4224 rows and K with a partial
    last k-tile, M = 9 and 16, against the reference."""
    n, k = 4233, 2048 + (0 if group != -1 else 40)
    qw, gen = _make(n, k, bits, group, mode, torch.float16, 23)
    for m in (9, 16):
        with kernel_options(force=FORCE["mma"]):
            c = mixgemm.explain(torch.empty(m, k, dtype=act, device="cuda"), qw)
            assert c.kernel == "cuda_gemv_mma" and c.config["U"] == 1, c.config
            _check(torch.randn(m, k, generator=gen, device="cuda").to(act), qw)


# The formats a forced tile runs in: both int widths, every mode, per-channel and grouped, every scale dtype.
TILE_FORMATS = [(4, 128, "sym", torch.float16), (4, 128, "zero_point", torch.float16),
                (4, 32, "offset", torch.bfloat16), (4, -1, "zero_point", torch.float32),
                (8, 64, "sym", torch.float16), (8, -1, "offset", torch.float16)]
# the tiles with their own row groups, launch bounds, LITE or bulk ring (KS 7 among them)
M1_TILES = sorted({e.value for table in gemv_m1.TABLES.values() for entries in table.values() for e in entries
                   if e.value.RG or e.value.MINB or e.value.LITE or e.value.BULK})


@pytest.mark.gpu
@pytest.mark.parametrize("tile", M1_TILES)
@pytest.mark.parametrize("bits,group,mode,scale_dtype", TILE_FORMATS)
def test_gemv_shipped_m1_tiles(tile, bits, group, mode, scale_dtype):
    """The shipped M = 1 tiles with non-power-of-two k-slices (KS 7 / 14), their own row groups, launch bounds
    and LITE, forced on any GPU: K = 14336 (every lane the same steps) and K = 14336 - 128 * 3 (uneven), odd N,
    M = 1 fp16 (the tile's case) and M = 3 / fp32 x with the same tile."""
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": dict(tile._asdict(), RG=tile.RG or 8 // tile.KS)}):
        for k in (14336, 14336 - 384):
            qw, gen = _make(1001, k, bits, group, mode, scale_dtype, 13)
            for m, act in ((1, torch.float16), (3, torch.float16), (1, torch.float32)):
                _check(torch.randn(m, k, generator=gen, device="cuda").to(act), qw)


# Every shipped M = 1 tile entry, by its table (GPU, sym or not), bit width and the K it was measured on.
M1_ENTRIES = sorted({(gpu, sym, bits, e.measured[0], e.value) for (gpu, sym), table in gemv_m1.TABLES.items()
                     for bits, entries in table.items() for e in entries})


@pytest.mark.gpu
@pytest.mark.parametrize("gpu,sym,bits,k,tile", M1_ENTRIES)
def test_gemv_m1_entries_on_their_measured_k(gpu, sym, bits, k, tile):
    """Each shipped tile as the dispatcher hands it over (forced, so on any GPU) at the K it was measured on, where
    a k-slice's lanes may get only part of a U step or no chunk at all (the tail loop), and 3 groups shorter (int4 g128)
    or 200 k shorter (int8 per channel); odd N."""
    cfg = dict(tile._asdict(), RG=tile.RG or 8 // tile.KS)
    mode = "sym" if sym else "zero_point"
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": cfg}):
        for kk in (k, max(128, k - (384 if bits == 4 else 200))):
            qw, gen = _make(203, kk, bits, 128 if bits == 4 else -1, mode, torch.float16, 17)
            _check(torch.randn(1, kk, generator=gen, device="cuda").half(), qw)


# Every entry of the zero-point tables of the CUDA-core GEMV on wgmma_v1, with the K it was measured on.
WG_SIMT_ZP_ENTRIES = sorted({(gpu, bits, e.measured[0], e.value) for gpu, table in gemv_m1.WG_SIMT_M1_ZP.items()
                             for bits, entries in table.items() for e in entries})


@pytest.mark.gpu
@pytest.mark.parametrize("gpu,bits,k,tile", WG_SIMT_ZP_ENTRIES)
def test_wg_simt_zero_point_entries_on_their_measured_k(gpu, bits, k, tile):
    """Each zero-point tile as wg_simt_config hands it over (forced, so on any GPU), PACK as the entry says, at the K
    it was measured on and 3 groups shorter, odd N, on a compacted weight's layout."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_packs

    base = {"RT": tile.RT, "U": tile.U, "PF": tile.PF, "KS": tile.KS, "RG": tile.RG}
    cfg = wg_simt_packs(base, "zero_point", tile.PACK)
    with kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": cfg}):
        for kk in (k, k - 384):
            qw, gen = _make(203, kk, bits, 128, "zero_point", torch.float16, 19)
            _check(torch.randn(1, kk, generator=gen, device="cuda").half(), qw)
            assert f"'PACK': {cfg['PACK']}" in str(mixgemm.explain(torch.empty(1, kk, dtype=torch.float16,
                                                                               device="cuda"), qw).config)


@pytest.mark.gpu
@pytest.mark.parametrize("r,u,ks", [(2, 1, 1), (4, 2, 2), (2, 4, 1)])
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 128, "zero_point"), (8, -1, "sym")])
def test_gemv_double_buffered_steps(r, u, ks, bits, group, mode):
    """Register double buffering (PF 1, both buffers' first loads before the PDL wait) over 1 to 5 whole steps per
    lane, with and without a partial tail step, odd N; M = 1 fp16 (its case), M = 3 and fp32 x with the same tile."""
    ch = 32 if bits == 4 else 16  # k per 16-byte chunk
    step_k = u * ks * 32 * ch
    cfg = {"R": r, "U": u, "KS": ks, "RG": 8 // ks, "PF": 1}
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": cfg}):
        for steps in range(1, 6):
            for k in (steps * step_k, steps * step_k + 3 * 128):
                qw, gen = _make(203, k, bits, group, mode, torch.float16, steps)
                for m, act in ((1, torch.float16), (3, torch.float16), (1, torch.float32)):
                    _check(torch.randn(m, k, generator=gen, device="cuda").to(act), qw)


# Lane groups (gemv.cu GEMV_LW): (LW, R, U, KS, PF, extra keys) over the register path's variants
LW_TILES = [(16, 4, 2, 1, 0, {}), (16, 4, 1, 2, 0, {"ZSUM": 1}), (8, 2, 2, 2, 1, {}), (4, 4, 1, 1, 0, {"XS": 1}),
            (16, 2, 4, 4, 0, {"MINB": 2})]


def test_lane_groups_tile_rows():
    """tile_rows counts the 32 / LW lane groups of each warp, and LW is checked."""
    from mixgemm.kernels.cuda_gemv.host import tile_rows

    assert tile_rows({"R": 4, "RG": 8, "KS": 1}) == 32 and tile_rows({"R": 4, "RG": 8, "KS": 1, "LW": 8}) == 128
    with pytest.raises(ValueError, match="LW"):
        tile_rows({"R": 4, "RG": 8, "KS": 1, "LW": 12})
    with pytest.raises(ValueError, match="LW"):
        tile_rows({"R": 4, "RG": 1, "KS": 7, "LW": 16, "BULK": 2})


def test_m1_entries_keep_to_their_blocks_per_sm():
    """A measured M = 1 tile with MAXB serves its bucket's layers up to that many blocks per SM (rounded up) and hands
    larger ones to the rule: the H100 sym k24/n27 tile (R 2 U 1 KS 1, 16 rows a block, kept at 6 blocks per SM on
    4096x11008 / 4096x12288) serves 4096x12288 (768 blocks) but not 4096x13696 (856: 7 per SM)."""
    from mixgemm.kernels.cuda.gemv_launch import chunks_per_row
    from mixgemm.kernels.cuda_gemv.host import m1_tile_serves

    h100 = "NVIDIA H100 80GB HBM3"
    tile = gemv_m1.M1Tile(2, 1, 1, MAXB=6)
    assert m1_tile_serves(tile, 12288, 132) and not m1_tile_serves(tile, 13696, 132)
    assert m1_tile_serves(gemv_m1.M1Tile(2, 1, 1), 10**6, 132)  # MAXB 0: any
    assert m1_tile_serves(gemv_m1.M1Tile(4, 2, 4, LW=16, MAXB=3), 4352, 132)  # 16 rows a block: 272 blocks, 3 per SM
    kc = chunks_per_row(4, 4096)
    served = choose_config(1, 12288, kc, 132, 0, 4, 4096, h100, "sym")
    assert (served["R"], served["U"], served["KS"]) == (2, 1, 1) and "gemv_m1" in served.source
    assert "gemv_m1" not in choose_config(1, 13696, kc, 132, 0, 4, 4096, h100, "sym").source  # the step-cost model


@needs_nvrtc
def test_nvrtc_compiles_lane_groups():
    """Every LW_TILES tile compiles for sm_90 and sm_80 at M = 1 (fp16, zero point) and M = 4 (bf16, offset)."""
    for (lw, r, u, ks, pf, extra), arch in itertools.product(LW_TILES, ("sm_90", "sm_80")):
        cfg = {"R": r, "U": u, "KS": ks, "RG": 8 // ks, "PF": pf, "LW": lw, **extra}
        for act, mode, mb in ((0, 1, 1), (1, 2, 4)):
            key = tuple(sorted(defines_for(4, act, 0, mode, mb, cfg).items()))
            assert ("GEMV_LW", lw) in key
            assert nvrtc.compile_cubin("cuda_gemv/gemv.cu", key, arch)[:4] == b"\x7fELF"


@pytest.mark.gpu
@pytest.mark.parametrize("tile", LW_TILES)
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 32, "zero_point"), (4, 64, "offset"),
                                             (8, -1, "sym"), (8, 128, "zero_point")])
def test_gemv_lane_groups(tile, bits, group, mode):
    """Lanes in groups of LW per row: K whose chunks split evenly over the lane groups (int4 3584 = 112 chunks) and
    K that leaves a partial step (3584 - 384), N = 203 (one partial tile) and 4099 (many tiles, the last past N);
    M = 1 / 3 in fp16, bf16 and fp32 x, with bias and relu at M = 3."""
    lw, r, u, ks, pf, extra = tile
    cfg = {"R": r, "U": u, "KS": ks, "RG": 8 // ks, "PF": pf, "LW": lw, **extra}
    for x, qw in _check_forced_cuda_core_tile(cfg, bits, group, mode, 23):
        assert f"'LW': {lw}" in str(mixgemm.explain(x, qw).config)


def _check_forced_cuda_core_tile(cfg, bits, group, mode, seed):
    """The CUDA-core GEMV forced to tile ``cfg`` against the reference: N = 203 / 4099 with K = 3584 and 3584 - 384
    (a partial step), M = 1 / 3 in fp16, bf16 and fp32 x, bias and relu at M = 3; yields each shape's last (x, qw)."""
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": cfg}):
        for n, k in ((203, 3584), (4099, 3584 - 384)):
            qw, gen = _make(n, k, bits, group, mode, torch.float16, seed)
            for m, act in ((1, torch.float16), (3, torch.float16), (1, torch.bfloat16), (2, torch.float32)):
                x = torch.randn(m, k, generator=gen, device="cuda").to(act)
                bias = torch.randn(n, generator=gen, device="cuda").to(act)
                _check(x, qw, bias if m == 3 else None, "relu" if m == 3 else None)
            yield x, qw


# The step-cost model's tiles that no measured table held before it: eight k-slices over 16 or 8 lanes a row.
STEP_MODEL_KS8 = [t for t in lane_tiles(10 ** 6) if t.KS == 8 and t.LW != 32]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", STEP_MODEL_KS8, ids=str)
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 64, "zero_point"), (8, -1, "sym")])
def test_gemv_step_model_tiles(tile, bits, group, mode):
    """KS 8 with LW 16 / 8 (gemv_steps.lane_tiles' tiles past the old grids): a partial step (K = 3584 - 384) and N
    = 203 / 4099, M = 1 / 3 in fp16, bf16 and fp32 x, bias and relu at M = 3."""
    for _ in _check_forced_cuda_core_tile(tile.config(), bits, group, mode, 29):
        pass


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 128, "zero_point"), (4, 32, "offset"),
                                             (8, -1, "sym"), (8, 128, "zero_point")])
def test_gemv_step_model_dispatch(bits, group, mode):
    """Layers no measured bucket serves run the step-cost model's tile at M = 1 in fp16 (explain's source says so),
    against the reference, on shapes of no model list (odd N)."""
    for n, k in ((6915, 2560), (2567, 10240), (13699, 1536)):
        qw, gen = _make(n, k, bits, group, mode, torch.float16, 31)
        x = torch.randn(1, k, generator=gen, device="cuda").half()
        choice = mixgemm.explain(x, qw)
        if choice.entry.name != "cuda_gemv" or "gemv_m1" in choice.config_source:
            continue
        assert "step-cost model" in choice.config_source
        _check(x, qw)
        _check(x * 4, qw, torch.randn(n, generator=gen, device="cuda").half(), "relu")


def test_bulk_config_needs_sm90_room_and_whole_param_rows():
    """BULK runs only on sm_90 with a ring that fits one block; BPAR only where a row's parameters are whole 16-byte
    units (the bulk copy's granule) and the config does not say BPAR 0."""
    from types import SimpleNamespace

    from mixgemm.kernels.cuda_gemv.host import BULK_MAX_BYTES, _bulk_config, bulk_smem_bytes

    hopper, ampere = SimpleNamespace(major=9), SimpleNamespace(major=8)
    tile = {"R": 8, "U": 1, "KS": 7, "RG": 1, "BULK": 2}
    assert bulk_smem_bytes(tile) == 2 * 8 * 7 * 32 * 16
    assert _bulk_config(tile, hopper, 448, 0) == {**tile, "BPAR": 1}
    assert bulk_smem_bytes({**tile, "BPAR": 1}, 448) == 2 * 8 * 7 * 32 * 16 + 2 * 8 * 448
    assert _bulk_config(tile, hopper, 2, 0)["BPAR"] == 0  # per-channel sym: 2 bytes per row
    assert _bulk_config({**tile, "BPAR": 0}, hopper, 448, 0)["BPAR"] == 0
    assert _bulk_config(tile, ampere, 448, 0)["BULK"] == 0
    assert _bulk_config(tile, hopper, 448, BULK_MAX_BYTES)["BULK"] == 0  # with x in shared memory it cannot fit
    assert _bulk_config({"R": 4, "U": 1, "KS": 7, "RG": 1}, ampere, 448, 0) == {"R": 4, "U": 1, "KS": 7, "RG": 1}


# Bulk-copy ring tiles (GEMV_BULK): one row per warp up to 8, U 1 / 2, rings of 2..6 stages, 7 / 8 / 14 k-slices.
BULK_TILES = [gemv_m1.M1Tile(4, 1, 14, RG=1, BULK=4), gemv_m1.M1Tile(2, 2, 8, RG=2, BULK=3),
              gemv_m1.M1Tile(4, 2, 4, RG=2, BULK=2, LITE=1), gemv_m1.M1Tile(8, 1, 7, RG=1, BULK=6, MINB=1)]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", BULK_TILES)
@pytest.mark.parametrize("bits,group,mode,scale_dtype", TILE_FORMATS)
def test_gemv_bulk_ring(tile, bits, group, mode, scale_dtype):
    """The bulk-copy ring (sm_90; elsewhere the host falls back to register loads): N = 4099 gives each persistent
    block several tiles (the ring and its phases run on across tiles) and a last tile past N; K = 14336 and
    14336 - 384 give whole and partial last stages; M = 1 / 3 fp16, bf16 and fp32 x."""
    with kernel_options(force=FORCE["simt"], configs={"cuda_gemv": dict(tile._asdict(), RG=tile.RG or 8 // tile.KS)}):
        for k in (14336, 14336 - 384):
            qw, gen = _make(4099, k, bits, group, mode, scale_dtype, 17)
            for m, act in ((1, torch.float16), (3, torch.float16), (1, torch.bfloat16), (2, torch.float32)):
                _check(torch.randn(m, k, generator=gen, device="cuda").to(act), qw,
                       torch.randn(4099, generator=gen, device="cuda").to(act), "relu" if m == 3 else None)


@pytest.mark.gpu
def test_gemv_rejects_bad_input():
    from mixgemm.kernels.cuda.gemv_direct import gemv

    qw, gen = _make(16, 64, 4, 32, "sym", torch.float16, 9)
    with pytest.raises(ValueError, match="M <= 16"):
        gemv(torch.randn(17, 64, device="cuda").half(), qw, None, 0.0, 1.0)
    with pytest.raises(TypeError, match="activation dtype"):
        gemv(torch.randn(1, 64, device="cuda").double(), qw, None, 0.0, 1.0)
    with pytest.raises(ValueError, match="K=63"):
        gemv(torch.randn(1, 63, device="cuda").half(), qw, None, 0.0, 1.0)
