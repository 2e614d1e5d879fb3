"""The typed kernel configs (mixgemm.kernels.kernel_config), every kernel's: every field named and documented once;
every macro a kernel's source reads (its ``#ifndef``, and those of the headers it includes) is a config field's define
or named in the config's ``derived`` (set by the problem or another build); every key the tuning data, the rules
and ``kernel_options(configs=...)`` hold maps to a named field; the short keys read back as they were written; the
defines are the ones the kernels were compiled with."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from mixgemm.kernels.cuda_dwconv.dwconv import DwCudaConfig
from mixgemm.kernels.cuda_gemv import config as gemv_config
from mixgemm.kernels.cuda_gemv_a8.gemv_a8_config import GemvA8Config
from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg_config import GemvA8WgConfig
from mixgemm.kernels.cuda_gemv_mma import config as mma_config
from mixgemm.kernels.cuda_gemv_wg_simt.config import GemvWgSimtConfig
from mixgemm.kernels.cuda_wgmma import config as wgmma_config
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8_config import WgmmaA8Config
from mixgemm.kernels.triton_a8.int8_gemm_config import Int8GemmConfig
from mixgemm.kernels.triton_conv_igemm.igemm import ConvConfig
from mixgemm.kernels.triton_conv_smallk.conv_smallk import SmallKConfig
from mixgemm.kernels.triton_dwconv.dwconv import DwConfig
from mixgemm.kernels.triton_gemm.config import TritonGemmConfig
from mixgemm.tuning import gemv_m1

KERNELS = Path(gemv_config.__file__).resolve().parents[1]
TABLES = sorted((KERNELS.parent / "tuning").glob("*.json"))
ALL = (gemv_config.GemvConfig, mma_config.GemvMmaConfig, GemvWgSimtConfig, wgmma_config.WgmmaConfig, TritonGemmConfig,
       GemvA8Config, GemvA8WgConfig, WgmmaA8Config, Int8GemmConfig, DwCudaConfig, ConvConfig, DwConfig, SmallKConfig)
# each CUDA source, the config whose fields it reads, and the macro prefix of that config's family in it (None: every
# macro the source and its headers read)
SOURCES = [
    ("cuda_gemv/gemv.cu", gemv_config.GemvConfig, "GEMV_"),
    ("cuda_gemv_mma/gemv_mma.cu", mma_config.GemvMmaConfig, "MMA_"),
    ("cuda_gemv_wg_simt/gemv_wg_simt.cu", GemvWgSimtConfig, "SIMT_"),
    ("cuda_wgmma/gemm_wgmma.cu", wgmma_config.WgmmaConfig, "WG_"),
    ("cuda_gemv_a8/gemv_a8.cu", GemvA8Config, None),
    ("cuda_gemv_a8_wg/gemv_a8_wg.cu", GemvA8WgConfig, None),
    ("cuda_wgmma_a8/gemm_wgmma_a8.cu", WgmmaA8Config, None),
    ("cuda_dwconv/dwconv.cu", DwCudaConfig, None),
]


def _macros(path: Path, seen: set | None = None) -> set[str]:
    """The macros ``#ifndef`` in a source and, recursively, in the headers it includes (kernels/cuda)."""
    seen = set() if seen is None else seen
    if path in seen:
        return set()
    seen.add(path)
    text = path.read_text()
    found = set(re.findall(r"^#ifndef\s+(\w+)", text, re.M))
    for inc in re.findall(r'^#include\s+"([\w.]+)"', text, re.M):
        here = path.parent / inc
        found |= _macros(here if here.exists() else KERNELS / "cuda" / inc, seen)
    return found


def _field_macros(cls) -> set[str]:
    """The macros ``cls``'s fields set."""
    return {f.metadata["define"] for f in dataclasses.fields(cls) if f.metadata["define"]}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_fields_named_and_documented_once(cls):
    fields = dataclasses.fields(cls)
    keys = [f.metadata["key"] for f in fields]
    assert len(set(keys)) == len(keys), keys
    defines = [f.metadata["define"] for f in fields if f.metadata["define"]]
    assert len(set(defines)) == len(defines), defines
    for f in fields:
        assert len(f.name) > 3 or f.name in ("grid", "tail", "pdl"), f"{cls.__name__}.{f.name}: a name that says it"
        assert len(f.metadata["doc"]) > 10, f"{cls.__name__}.{f.name} undocumented"
    assert not set(defines) & set(cls.derived), "a macro both a field's and derived"
    assert len(cls.glossary().splitlines()) == len(keys)


@pytest.mark.parametrize("source, cls, prefix", SOURCES, ids=[s[0] for s in SOURCES])
def test_every_source_macro_is_named(source, cls, prefix):
    read = {m for m in _macros(KERNELS / source) if prefix is None or m.startswith(prefix)}
    assert read, source
    named = _field_macros(cls) | set(cls.derived)
    assert read - named == set(), f"{source} reads macros no field or derived entry names: {sorted(read - named)}"


@pytest.mark.parametrize("cls", sorted({c for _, c, _ in SOURCES}, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_define_and_derived_entry_is_read(cls):
    """What a config emits or names, some source of its kernel reads."""
    read = set().union(*(_macros(KERNELS / s) for s, c, _ in SOURCES if c is cls))
    assert _field_macros(cls) - read == set(), f"{cls.__name__}: defines no source reads"
    assert set(cls.derived) - read == set(), f"{cls.__name__}: derived entries no source reads"


def _table_configs(section: str):
    """Every config dict of a tuning table section (bucket entries' configs, small-M tiles, wave-model tiles)."""
    found = []

    def walk(node, inside):
        if isinstance(node, dict):
            if inside and node and all(isinstance(k, str) and k[:1].isupper() or k.startswith("num_") for k in node):
                found.append(node)
                return
            for k, v in node.items():
                walk(v, inside or k in ("configs", "tile", "config", "tiles"))
        elif isinstance(node, list):
            for v in node:
                walk(v, inside)

    for path in TABLES:
        walk(json.loads(path.read_text()).get(section, {}), False)
    return found


@pytest.mark.parametrize("section, cls", [("wgmma", wgmma_config.WgmmaConfig),
                                          ("wgmma_waves", wgmma_config.WgmmaConfig),
                                          ("wgmma_small_m", wgmma_config.WgmmaConfig), ("gemm", TritonGemmConfig)])
def test_every_tuning_table_key_is_a_field(section, cls):
    configs = _table_configs(section)
    assert configs, section
    for cfg in configs:
        typed = cls.from_dict(cfg)  # (an unknown key raises, naming it)
        assert cls.from_dict(typed.to_dict()) == typed


def test_the_python_tuning_tables_keys_are_fields():
    """The GEMVs' measured M = 1 tiles (tuning.gemv_m1) carry the configs' short keys, and read as configs."""
    assert set(gemv_m1.M1Tile._fields) <= set(gemv_config.GemvConfig.keys())
    assert set(gemv_m1.WgSimtTile._fields) <= set(GemvWgSimtConfig.keys())
    for tables, cls in ((gemv_m1.TABLES, gemv_config.GemvConfig),):
        for by_bits in tables.values():
            for entries in by_bits.values():
                for e in entries:
                    assert cls.from_dict(e.value._asdict()).rows_per_warp == e.value.R


def test_unknown_keys_and_round_trips():
    with pytest.raises(ValueError, match="'RX'"):
        gemv_config.GemvConfig.from_dict({"R": 4, "U": 2, "RG": 8, "KS": 1, "RX": 1})
    with pytest.raises(TypeError, match="dict"):
        wgmma_config.WgmmaConfig.from_dict([("BM", 64)])
    cfg = {"R": 4, "U": 2, "RG": 4, "KS": 2, "PF": 1, "LW": 16, "ZSUM": 1}
    typed = gemv_config.GemvConfig.from_dict(cfg)
    assert (typed.rows_per_warp, typed.chunks_in_flight, typed.k_slices, typed.lanes_per_row) == (4, 2, 2, 16)
    assert typed.to_dict() == cfg
    assert gemv_config.GemvConfig.from_dict({"rows_per_warp": 4, "U": 2, "RG": 4, "KS": 2, "PF": 1, "LW": 16,
                                              "ZSUM": 1}) == typed
    with pytest.raises(ValueError, match="key R missing"):
        gemv_config.GemvConfig.from_dict({"U": 2, "RG": 4, "KS": 2}).build_defines(4, 0, 0, 0, 1)


def test_defines_are_the_compile_keys():
    """The macros the typed configs emit: the core keys always, the optional ones only when set (so the compile keys
    of the default tiles stay what they were)."""
    g = gemv_config.GemvConfig.from_dict({"R": 4, "U": 2, "RG": 8, "KS": 1, "XS": 1, "LW": 32, "BULK": 2, "BPAR": 1})
    assert g.build_defines(4, 0, 0, 1, 1) == {"GEMV_BITS": 4, "GEMV_ACT": 0, "GEMV_SCL": 0, "GEMV_MODE": 1, "GEMV_M": 1,
                                              "GEMV_R": 4, "GEMV_U": 2, "GEMV_RG": 8, "GEMV_KS": 1, "GEMV_PF": 0,
                                              "GEMV_XS": 1, "GEMV_BULK": 2, "GEMV_BPAR": 1}
    assert "GEMV_XS" not in g.build_defines(4, 1, 0, 1, 1)  # bf16 x: no staged x
    m = mma_config.GemvMmaConfig.from_dict({"U": 2, "RG": 1, "KS": 16, "PF": 0, "RT": 2, "WG": 1, "G32": 1, "PACK": 1,
                                            "MINB": 1})
    assert m.build_defines(4, 0, 0, 1, 1, pair_packs=True) == {
        "MMA_BITS": 4, "MMA_ACT": 0, "MMA_SCL": 0, "MMA_MODE": 1, "MMA_MB": 1, "MMA_U": 2, "MMA_RG": 1, "MMA_KS": 16,
        "MMA_PF": 0, "MMA_RT": 2, "MMA_PACK": 1, "MMA_WG": 1, "MMA_G32": 1}
    assert "MMA_PACK" not in m.build_defines(4, 0, 0, 0, 1, pair_packs=False)
    w = GemvWgSimtConfig.from_dict({"U": 2, "RG": 1, "KS": 16, "PF": 0, "RT": 2, "G32": 1, "PACK": 1, "MINB": 1})
    assert w.build_defines(4, 1, 0, 1, pair_packs=True) == {
        "SIMT_BITS": 4, "SIMT_ACT": 1, "SIMT_SCL": 0, "SIMT_MODE": 1, "SIMT_G32": 1, "SIMT_RT": 2, "SIMT_U": 2,
        "SIMT_RG": 1, "SIMT_KS": 16, "SIMT_PF": 0, "SIMT_PACK": 1, "SIMT_MINB": 1}
    assert "SIMT_PACK" not in w.build_defines(4, 1, 0, 0, pair_packs=False)
    with pytest.raises(ValueError, match="key KS missing"):
        GemvWgSimtConfig.from_dict({"U": 2, "RG": 1}).build_defines(4, 0, 0, 0, False)


def test_kernel_options_configs_take_field_names(isolated_tuning):
    """kernel_options(configs=...) takes a config by its short keys or by field names (the same config handed to the
    kernel), and names an unknown key."""
    import torch

    import mixgemm
    from described_gpus import H100
    from mixgemm import quantize_weight

    qw = quantize_weight(torch.randn(256, 512), bits=4, group_size=128)
    x = torch.empty(1, 512, dtype=torch.float16)
    short = {"R": 2, "U": 1, "KS": 4, "LITE": 1}
    named = {"rows_per_warp": 2, "chunks_in_flight": 1, "k_slices": 4, "lite": 1}
    with mixgemm.kernel_options(force="cuda_gemv", configs={"cuda_gemv": short}):
        a = mixgemm.explain(x, qw, device=H100)
    with mixgemm.kernel_options(force="cuda_gemv", configs={"cuda_gemv": named}):
        b = mixgemm.explain(x, qw, device=H100)
    assert a.config == b.config and a.config["R"] == 2 and a.config["LITE"] == 1
    with mixgemm.kernel_options(force="cuda_wgmma", configs={"cuda_wgmma": {"rows_per_cta": 64, "stages": 3}}):
        c = mixgemm.explain(torch.empty(64, 512, dtype=torch.float16), qw, device=H100)
    assert c.config == {"BM": 64, "STAGES": 3}
    with (mixgemm.kernel_options(force="cuda_gemv", configs={"cuda_gemv": {**short, "ROWZ": 1}}),
          pytest.raises(ValueError, match="'ROWZ'")):
        mixgemm.explain(x, qw, device=H100)


def test_of_reads_keys_and_names_unknown_ones():
    c = GemvA8Config.from_dict({"R": 2, "KS": 1, "NW": 8, "PF": 0, "RG": 8})
    assert (c.rows_per_warp, c.k_slices, c.warps, c.row_groups) == (2, 1, 8, 8)
    assert c.defines() == {"A8_R": 2, "A8_KS": 1, "A8_RG": 8, "A8_PF": 0}
    assert GemvA8Config.from_dict(c.as_dict()) == c
    assert GemvA8Config.from_dict({"rows_per_warp": 2, "k_slices": 1}) == GemvA8Config.from_dict({"R": 2, "KS": 1})
    with pytest.raises(ValueError, match="unknown config key 'XS'.*R \\(rows_per_warp\\)"):
        GemvA8Config.from_dict({"R": 2, "KS": 1, "XS": 1})
    assert DwCudaConfig(8, 32).defines() == {"DW_TW": 8, "DW_CB": 32}
    assert ConvConfig(*(64, 128, 32, 2, 4, 3, True)).as_dict()["SWAP_AB"] is True


def test_default_tiles_are_their_configs():
    """The rules that pick a tile on the GPU build their config type (they run only there: a CPU check of the
    construction)."""
    from mixgemm.kernels.cuda_dwconv.dwconv import default_config

    for c, runs, wo, taps in ((96, 8 * 56 * 56, 56, 49), (384, 14 * 14, 14, 49), (6, 30, 30, 9)):
        cfg = default_config(c, runs, wo, taps, 132)
        assert isinstance(cfg, DwCudaConfig) and cfg.channels_per_block % 2 == 0 and 1 <= cfg.pixels_per_thread <= 32


def test_tuning_data_and_rules_use_named_keys():
    """The measured M = 1 tiles and the rules' configs (what explain prints, the tuning cache stores and
    kernel_options(configs=...) takes) only use keys of the kernels' configs."""
    from mixgemm.kernels.cuda_gemv_a8 import gemv_a8
    from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config
    from mixgemm.kernels.triton_a8.int8_gemm import pick_config
    from mixgemm.tuning.gemv_m1 import A8_M1

    for entries in A8_M1.values():
        for e in entries:
            GemvA8Config.from_dict(e.value)
    for mb in (1, 2, 4, 8, 16):
        GemvA8Config.from_dict(gemv_a8.choose_config(mb, 4096, 8, 132, 4, 4096))
        for bits, per_token in ((4, False), (4, True), (8, True)):
            GemvA8WgConfig.from_dict(gemv_a8_wg.choose_config(mb, 4096, 32, 132, bits, per_token))
    for m in (1, 16, 64, 256, 2048):
        for bits, group in ((4, 128), (8, 8192)):
            WgmmaA8Config.from_dict(default_config(m, 4096, 8192, group, bits))
            Int8GemmConfig.from_dict(pick_config(m, 4096, 8192, bits, group, group == 8192, 64 if bits == 4 else 0))


def test_wg_simt_tiles_use_named_keys():
    """The CUDA-core GEMV on wgmma_v1's tiles (the measured buckets, the step-cost model, the rule, the one-step tile)
    read as its config."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config, wg_simt_one_step_tile, wg_simt_rule
    from mixgemm.tuning.gemv_m1 import WG_SIMT_M1, WG_SIMT_M1_ZP

    for tables in (WG_SIMT_M1, WG_SIMT_M1_ZP):
        for by_bits in tables.values():
            for entries in by_bits.values():
                for e in entries:
                    assert GemvWgSimtConfig.from_dict(e.value._asdict()).serves_blocks_per_sm == e.value.BPS
    for n, k in ((4096, 4096), (14336, 4096), (28672, 8192)):
        for gpu, mode in (("NVIDIA H100 80GB HBM3", "zero_point"), ("NVIDIA H200", "sym"), ("some GPU", "offset")):
            for cfg in (wg_simt_config(n, k, 4, 132, gpu, mode, one_step=False), wg_simt_rule(n, k, 8, 132),
                        wg_simt_one_step_tile(k, mode)):
                typed = GemvWgSimtConfig.from_dict(cfg)
                assert GemvWgSimtConfig.from_dict(typed.to_dict()) == typed, cfg


def test_entry_configs_use_named_keys():
    """The int8 GEMM entry's whole config (token tile, SPLIT / TAIL, FQ) on a described H200."""
    from described_gpus import H200
    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels.cuda_wgmma_a8 import candidates, config
    from mixgemm.kernels.int8_activations import a8_problem

    qw = quantize_weight(torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)) * 0.05, bits=4,
                         group_size=128, mode="sym")
    for m in (16, 512):
        p = a8_problem(m, qw, torch.float16, H200, "sym", True)
        for cfg in (config(p), *candidates(p)):
            WgmmaA8Config.from_dict(cfg)


def test_kernel_options_config_with_an_unknown_key_is_an_error(monkeypatch):
    """A config forced through kernel_options names the key the kernel does not have (it was ignored before)."""
    import mixgemm
    from described_gpus import H200
    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import int8_activations

    monkeypatch.setattr(int8_activations, "nvrtc_ok", lambda: True)
    qw = quantize_weight(torch.randn(256, 512, generator=torch.Generator().manual_seed(1)) * 0.05, bits=4,
                         group_size=128, mode="sym")
    x = torch.randn(1, 512)
    with mixgemm.kernel_options(configs={"cuda_gemv_a8": {"R": 2, "KS": 1}}):
        assert mixgemm.explain(x, qw, act_mode="sym", device=H200).config["R"] == 2
    with (mixgemm.kernel_options(configs={"cuda_gemv_a8": {"R": 2, "KS": 1, "ROWS": 4}}),
          pytest.raises(ValueError, match="unknown config key 'ROWS'")):
        mixgemm.explain(x, qw, act_mode="sym", device=H200)
