"""The typed configs of the weight-only linear kernels (kernels/<entry>/config.py): every compile-time macro the
kernel's source reads and every key the tuning tables hold maps to a named, documented field; the short keys read
back as they were written; the defines are the ones the kernels were compiled with."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from mixgemm.kernels.cuda_gemv import config as gemv_config
from mixgemm.kernels.cuda_gemv_mma import config as mma_config
from mixgemm.kernels.cuda_wgmma import config as wgmma_config
from mixgemm.kernels.triton_gemm.config import TritonGemmConfig
from mixgemm.tuning import gemv_m1

KERNELS = Path(gemv_config.__file__).resolve().parents[1]
TABLES = sorted((KERNELS.parent / "tuning").glob("*.json"))


def _macros(source: str, prefix: str) -> set[str]:
    text = (KERNELS / source).read_text()
    return {m for m in re.findall(r"#ifndef (\w+)", text) if m.startswith(prefix)}


@pytest.mark.parametrize("source, prefix, cls, extra", [
    ("cuda_gemv/gemv.cu", "GEMV_", gemv_config.GemvConfig, gemv_config.PROBLEM_DEFINES),
    ("cuda_gemv_mma/gemv_mma.cu", "MMA_", mma_config.GemvMmaConfig, mma_config.PROBLEM_DEFINES),
    ("cuda_gemv_mma/gemv_wg_simt.cu", "SIMT_", mma_config.GemvMmaConfig,
     {**mma_config.PROBLEM_DEFINES, **mma_config.SIMT_DEFINES}),
    ("cuda_wgmma/gemm_wgmma.cu", "WG_", wgmma_config.WgmmaConfig, wgmma_config.PROBLEM_DEFINES),
])
def test_every_macro_of_the_source_is_a_named_field(source, prefix, cls, extra):
    macros = _macros(source, prefix)
    assert macros, source
    named = set(cls.macros()) | set(extra)
    assert macros <= named, f"{source}: macros without a field: {sorted(macros - named)}"
    if source.endswith("gemv_wg_simt.cu"):  # the same fields under SIMT_ names
        assert set(mma_config.SIMT_DEFINES.values()) <= {f.name for f in dataclasses.fields(cls)}
    else:
        assert set(cls.macros()) <= macros, f"{cls.__name__}: defines the source does not read"


@pytest.mark.parametrize("cls", [gemv_config.GemvConfig, mma_config.GemvMmaConfig, wgmma_config.WgmmaConfig,
                                 TritonGemmConfig])
def test_each_field_has_a_key_and_a_doc(cls):
    keys = [f.metadata["key"] for f in dataclasses.fields(cls)]
    assert len(keys) == len(set(keys))
    assert all(len(f.metadata["doc"]) > 10 for f in dataclasses.fields(cls))
    assert all(f.name != f.metadata["key"] or f.name.islower() for f in dataclasses.fields(cls))
    assert len(cls.glossary().splitlines()) == len(keys)


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
    assert set(gemv_m1.WgSimtTile._fields) <= set(mma_config.GemvMmaConfig.keys())
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
                                            "MINB": 1, "SIMT": 0})
    assert m.build_defines(4, 0, 0, 1, 1, pair_packs=True) == {
        "MMA_BITS": 4, "MMA_ACT": 0, "MMA_SCL": 0, "MMA_MODE": 1, "MMA_MB": 1, "MMA_U": 2, "MMA_RG": 1, "MMA_KS": 16,
        "MMA_PF": 0, "MMA_RT": 2, "MMA_PACK": 1, "MMA_WG": 1, "MMA_G32": 1}
    assert "MMA_PACK" not in m.build_defines(4, 0, 0, 0, 1, pair_packs=False)
    assert m.build_simt_defines(4, 1, 0, 1, pair_packs=True) == {
        "SIMT_BITS": 4, "SIMT_ACT": 1, "SIMT_SCL": 0, "SIMT_MODE": 1, "SIMT_G32": 1, "SIMT_RT": 2, "SIMT_U": 2,
        "SIMT_RG": 1, "SIMT_KS": 16, "SIMT_PF": 0, "SIMT_PACK": 1, "SIMT_MINB": 1}


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
