"""The typed kernel configs (mixgemm.kernels.kernel_config): every field named and documented once, every macro a
kernel's source reads (its ``#ifndef`` and those of the headers it includes) is a config field's define or named as
derived from the problem, and every key the tuning data and the rules produce maps to a named field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from mixgemm.kernels.cuda_dwconv.dwconv import DwCudaConfig
from mixgemm.kernels.cuda_gemv_a8.gemv_a8_config import GemvA8Config
from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg_config import GemvA8WgConfig
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8_config import WgmmaA8Config
from mixgemm.kernels.triton_a8.int8_gemm_config import Int8GemmConfig
from mixgemm.kernels.triton_conv_igemm.igemm import ConvConfig
from mixgemm.kernels.triton_conv_smallk.conv_smallk import SmallKConfig
from mixgemm.kernels.triton_dwconv.dwconv import DwConfig

KERNELS = Path(__file__).resolve().parents[1] / "src" / "mixgemm" / "kernels"
ALL = (GemvA8Config, GemvA8WgConfig, WgmmaA8Config, Int8GemmConfig, DwCudaConfig, ConvConfig, DwConfig, SmallKConfig)
SOURCES = {GemvA8Config: "cuda_gemv_a8/gemv_a8.cu", GemvA8WgConfig: "cuda_gemv_a8_wg/gemv_a8_wg.cu",
           WgmmaA8Config: "cuda_wgmma_a8/gemm_wgmma_a8.cu", DwCudaConfig: "cuda_dwconv/dwconv.cu"}


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


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_fields_named_and_documented_once(cls):
    fields = dataclasses.fields(cls)
    keys = [f.metadata["key"] for f in fields]
    assert len(set(keys)) == len(keys), keys
    defines = [f.metadata["define"] for f in fields if f.metadata["define"]]
    assert len(set(defines)) == len(defines), defines
    for f in fields:
        assert len(f.name) > 3 or f.name in ("grid", "tail", "pdl"), f"{cls.__name__}.{f.name}: a name that says it"
        assert len(f.metadata["doc"]) > 15, f"{cls.__name__}.{f.name} undocumented"
    assert not set(defines) & set(cls.derived), "a macro both a field's and derived"


@pytest.mark.parametrize("cls", sorted(SOURCES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_source_macro_is_named(cls):
    read = _macros(KERNELS / SOURCES[cls])
    named = {f.metadata["define"] for f in dataclasses.fields(cls)} | set(cls.derived)
    assert read - named == set(), f"{SOURCES[cls]} reads macros no field or derived entry names"
    assert set(cls.derived) - read == set(), "derived entries the source does not read"


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
