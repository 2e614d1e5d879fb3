"""cuda_gemv_wg_simt, the CUDA-core GEMV on wgmma_v1 (a compacted weight's M = 1 call), on described GPUs: its can_run
rules, its candidates, and the same tiles, defines and launches as when it was a config of cuda_gemv_mma (the tables
below are the choices of that code, commit e980a5a)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from described_gpus import H100, H200
from mixgemm.formats.weight import QuantConfig, from_codes
from mixgemm.kernels import cuda_gemv_wg_simt, linear_common
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_gemv import gemv_steps
from mixgemm.kernels.cuda_gemv_wg_simt import host
from mixgemm.kernels.cuda_gemv_wg_simt.config import GemvWgSimtConfig
from mixgemm.kernels.registry import DeviceInfo, choose, kernel_options

GPUS = {"H100": H100, "H200": H200}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TILE = ("RT", "U", "PF", "KS", "RG", "PACK")

# (GPU, K, N, bits, group, mode, x) -> the compacted M = 1 call's tile "RT U PF KS RG [PACK]" (PACK for zero point /
# offset), or None where the tensor-core GEMV took it: one step a k-slice, the measured buckets (BPS kept and exceeded),
# the step-cost model (groups of 32, bf16), the rule, and the gemv_mma_m1 buckets
TILES = [
    ("H200", 3584, 4608, 8, -1, "sym", "fp16", "2 2 1 8 1"),
    ("H200", 3584, 18944, 4, -1, "offset", "fp16", "2 2 1 4 1 1"),
    ("H200", 3584, 4608, 8, -1, "sym", "bf16", "1 2 1 8 1"),
    ("H200", 3584, 18944, 4, -1, "offset", "bf16", "2 2 1 4 1 1"),
    ("H200", 3584, 4608, 8, 32, "offset", "fp16", "1 1 1 16 1 1"),
    ("H200", 3584, 18944, 4, 32, "sym", "fp16", "1 2 0 4 1"),
    ("H200", 3584, 4608, 8, 32, "offset", "bf16", "1 1 1 16 1 1"),
    ("H200", 3584, 18944, 4, 32, "sym", "bf16", "2 2 1 4 1"),
    ("H100", 1536, 8960, 4, 128, "zero_point", "fp16", "1 1 0 8 1 1"),
    ("H100", 4096, 28672, 8, 128, "zero_point", "fp16", "1 1 1 16 1 1"),
    ("H200", 8192, 28672, 4, -1, "offset", "fp16", "2 2 0 4 1 0"),
    ("H200", 5120, 17920, 4, -1, "offset", "fp16", "4 2 0 8 1 0"),
    ("H100", 1536, 8960, 4, 128, "zero_point", "bf16", "1 1 0 8 1 1"),
    ("H200", 5120, 17920, 4, -1, "offset", "bf16", "4 2 0 8 1 0"),
    ("H100", 3584, 18944, 8, 32, "offset", "fp16", "1 1 1 16 1 1"),
    ("H200", 5120, 17920, 4, 32, "sym", "fp16", "4 2 0 8 1"),
    ("H100", 3584, 18944, 8, 32, "offset", "bf16", "1 1 1 16 1 1"),
    ("H200", 5120, 17920, 4, 32, "sym", "bf16", "4 2 0 8 1"),
    ("H100", 896, 4864, 4, 128, "sym", "fp16", "1 2 0 8 1"),
    ("H200", 1024, 2048, 4, 128, "zero_point", "fp16", "1 2 0 8 1 0"),
    ("H100", 2048, 2048, 8, 128, "zero_point", "fp16", "1 2 0 16 1 0"),
    ("H200", 2048, 512, 4, -1, "offset", "fp16", "1 2 0 16 1 0"),
    ("H100", 896, 4864, 4, 128, "sym", "bf16", "1 2 0 8 1"),
    ("H200", 2048, 512, 4, -1, "offset", "bf16", "1 2 0 16 1 0"),
    ("H100", 896, 4864, 4, 32, "offset", "fp16", "1 2 0 8 1 0"),
    ("H200", 2048, 512, 8, 32, "offset", "fp16", "1 2 0 16 1 0"),
    ("H100", 896, 4864, 4, 32, "offset", "bf16", "1 2 0 8 1 0"),
    ("H200", 2048, 512, 8, 32, "offset", "bf16", "1 2 0 16 1 0"),
    ("H100", 896, 18944, 4, 128, "sym", "fp16", "1 1 1 4 1"),
    ("H100", 3584, 4608, 4, 128, "zero_point", "fp16", "2 1 1 16 1 1"),
    ("H100", 14336, 4096, 4, 128, "sym", "fp16", "1 2 1 16 1"),
    ("H200", 5120, 17920, 8, -1, "sym", "fp16", "1 2 0 4 1"),
    ("H100", 896, 18944, 4, 128, "sym", "bf16", "1 1 1 4 1"),
    ("H200", 5120, 17920, 8, -1, "sym", "bf16", "1 1 1 4 1"),
    ("H100", 896, 18944, 4, 32, "offset", "fp16", "2 1 1 4 1 1"),
    ("H100", 28672, 8192, 4, 32, "sym", "fp16", "4 1 1 16 1"),
    ("H100", 896, 18944, 4, 32, "sym", "bf16", "1 1 1 4 1"),
    ("H100", 28672, 8192, 4, 32, "sym", "bf16", "2 1 1 16 1"),
    ("H200", 1536, 8960, 4, 128, "sym", "fp16", None),
    ("H100", 2304, 2560, 4, 128, "zero_point", "bf16", None),
    ("H200", 3072, 4096, 4, 128, "sym", "bf16", None),
    ("H200", 3072, 4096, 4, -1, "offset", "bf16", None),
    ("H100", 896, 18944, 8, 128, "zero_point", "fp16", "2 2 1 2 2 1"),
    ("H100", 3584, 4608, 8, 128, "zero_point", "fp16", "1 1 1 16 1 1"),
    ("H200", 14336, 4096, 8, 128, "zero_point", "fp16", "2 2 1 16 1 1"),
    ("H200", 5120, 17920, 8, 128, "zero_point", "fp16", "2 2 1 4 1 1"),
    ("H100", 896, 18944, 8, 128, "zero_point", "bf16", "2 2 1 2 2 1"),
    ("H200", 5120, 17920, 8, 128, "zero_point", "bf16", "2 2 1 4 1 1"),
    ("H100", 896, 18944, 8, 32, "offset", "fp16", "2 2 1 2 2 1"),
    ("H200", 5120, 17920, 8, 32, "offset", "fp16", "2 2 1 4 1 1"),
    ("H100", 896, 18944, 4, 32, "offset", "bf16", "1 1 1 4 1 1"),
    ("H200", 5120, 17920, 8, 32, "offset", "bf16", "2 2 1 4 1 1"),
]
# (GPU, K, N, bits, group, mode, x) -> that launch's grid, block (threads) and gemv_wg_simt.cu defines (SIMT_ dropped)
LAUNCHES = [
    (("H200", 3584, 4608, 8, -1, "sym", "fp16"), 144, 256,
     "ACT=0 BITS=8 G32=0 KS=8 MODE=0 PF=1 RG=1 RT=2 SCL=0 U=2"),
    (("H200", 3584, 4608, 8, 32, "offset", "bf16"), 288, 512,
     "ACT=1 BITS=8 G32=1 KS=16 MODE=2 PACK=1 PF=1 RG=1 RT=1 SCL=0 U=1"),
    (("H100", 1536, 8960, 4, 128, "zero_point", "bf16"), 560, 256,
     "ACT=1 BITS=4 G32=0 KS=8 MODE=1 PACK=1 PF=0 RG=1 RT=1 SCL=0 U=1"),
    (("H100", 896, 4864, 4, 128, "sym", "fp16"), 304, 256,
     "ACT=0 BITS=4 G32=0 KS=8 MODE=0 PF=0 RG=1 RT=1 SCL=0 U=2"),
    (("H100", 896, 4864, 4, 32, "offset", "fp16"), 304, 256,
     "ACT=0 BITS=4 G32=1 KS=8 MODE=2 PF=0 RG=1 RT=1 SCL=0 U=2"),
    (("H100", 14336, 4096, 4, 128, "sym", "fp16"), 256, 512,
     "ACT=0 BITS=4 G32=0 KS=16 MODE=0 PF=1 RG=1 RT=1 SCL=0 U=2"),
]


@pytest.fixture(autouse=True)
def _gpus_compiler(monkeypatch):
    """NVRTC reported present, and every build's registers the GPUs' compiler's (gemv_steps.WG_SIMT_REGISTERS, NVRTC
    13.0; 64 outside its tile space): the tiles do not depend on this machine's NVRTC."""
    def registers(bits, act, scl, mode, items, arch="sm_90"):
        c = dict(items)
        key = (c.get("RT", 1), c["U"], c.get("PF", 0), c["KS"], c["RG"])
        return gemv_steps.WG_SIMT_REGISTERS.get((bits, mode, act, c.get("G32", 0)), {}).get(key, 64)

    monkeypatch.setattr(linear_common, "nvrtc_ok", lambda: True)
    monkeypatch.setattr(host, "wg_simt_registers", registers)


def _problem(gpu, k, n, bits, group, mode, x, resident="wgmma_v1"):
    """The M = 1 problem of a K x N layer of this format (a small weight's problem with the layer's sizes)."""
    cfg = QuantConfig(bits=bits, group_size=group, mode=mode)
    _, ng_small = cfg.groups(256)
    gen = torch.Generator().manual_seed(0)
    params = {"zeros": torch.zeros(64, ng_small, dtype=torch.uint8)} if mode == "zero_point" else \
        {"offsets": torch.zeros(64, ng_small)} if mode == "offset" else {}
    qw = from_codes(torch.randint(0, cfg.qmax + 1, (64, 256), generator=gen, dtype=torch.uint8),
                    torch.full((64, ng_small), 1e-2), cfg, **params)
    g, ng = cfg.groups(k)
    p = linear_common.linear_problem(1, qw, DTYPES[x], GPUS[gpu])
    return replace(p, n=n, k=k, group_size=g, num_groups=ng, resident=resident)


def _tile(text: str, mode: str) -> dict:
    return dict(zip(TILE[:5] if mode == "sym" else TILE, map(int, text.split()), strict=True))


@pytest.mark.parametrize("case", TILES, ids=lambda c: "-".join(map(str, c[:7])))
def test_compacted_m1_tiles_as_before(case):
    """Each compacted M = 1 call takes the same kernel and tile as before, where the CUDA-core GEMV on wgmma_v1 was
    cuda_gemv_mma's SIMT config; where it was not, this entry declines softly and the tensor-core GEMV runs it."""
    *problem, want = case
    c = choose(_problem(*problem))
    if want is None:
        assert c.kernel == "cuda_gemv_mma" and "gemv_mma_m1" in dict(c.declined)["cuda_gemv_wg_simt"], str(c)
        return
    assert (c.kernel, c.layout, c.config) == ("cuda_gemv_wg_simt", "wgmma_v1", _tile(want, problem[5])), str(c)


@pytest.mark.parametrize("case", LAUNCHES, ids=lambda c: "-".join(map(str, c[0])))
def test_launches_as_before(case, monkeypatch):
    """The prepared launch of the chosen tile: the same source's kernel, defines, grid and block as before, and the
    GEMVs' parameter list ending in k-tiles, groups, log2 group, M = 1 and no permutation."""
    problem, grid, threads, defines = case
    p = _problem(*problem)
    got = {}

    def prepare_launch(fn, dev, grid, block, args, smem=0, pdl=False, first_without_pdl=False):
        got.update(fn=fn, grid=grid, block=block, smem=smem, args=[a.value for a in args])
        return SimpleNamespace(params=SimpleNamespace(values=[], lock=None))

    monkeypatch.setattr(nvrtc, "get_function", lambda src, kernel, defs, dev: (src, kernel, defs))
    monkeypatch.setattr(nvrtc, "prepare_launch", prepare_launch)
    monkeypatch.setattr(host, "pdl_on", lambda dev: True)
    kt = -(-p.k // 64)
    lay = SimpleNamespace(group_size=p.group_size, k_tiles=kt, k_padded=64 * kt, num_groups=p.num_groups, gk=7,
                          weight=torch.empty(1), params=torch.empty(1))
    qw = SimpleNamespace(out_features=p.n, bits=p.bits, mode=p.mode, scales=p.qw.scales,
                         has_layout=lambda name: True, layout=lambda name, build: lay)
    c = choose(p)
    c.entry.prepare(p, qw, c.config)
    want = {f"SIMT_{k}": int(v) for k, v in (kv.split("=") for kv in defines.split())}
    assert got["fn"] == ("cuda_gemv_wg_simt/gemv_wg_simt.cu", "mixgemm_gemv_wg_simt", want)
    assert (got["grid"], got["block"], got["smem"]) == ((grid, 1, 1), (threads, 1, 1), 0)
    assert len(got["args"]) == 16 and got["args"][-5:] == [kt, p.num_groups, 7, 1, None]


def test_can_run_rules():
    """Hard declines for what the kernel cannot run (no CUDA, activation dtype, bits, M != 1, act-order); soft ones
    where another entry measured faster (plain codes, the gemv_mma_m1 buckets); a weight keeping another layout is
    declined before (it reads wgmma_v1)."""
    can_run = cuda_gemv_wg_simt.can_run
    p = _problem("H100", 4096, 4096, 4, 128, "sym", "fp16")
    assert can_run(p).ok
    cpu = DeviceInfo("cpu", None)
    hard = {"needs a CUDA device": replace(p, device=cpu), "activation dtype": replace(p, x_dtype=torch.float32),
            "3-bit weights": replace(p, bits=3), "M=2: it computes one row": replace(p, m=2),
            "outside the GEMV's 1..16": replace(p, m=17), "act-order": replace(p, act_order=True)}
    for why, q in hard.items():
        d = can_run(q)
        assert not d.ok and not d.soft and why in d.reason, (why, d)
    d = can_run(replace(p, resident=None))
    assert d.soft and "keeps its plain codes" in d.reason
    d = can_run(_problem("H100", 2304, 2560, 4, 128, "zero_point", "fp16"))
    assert d.soft and "gemv_mma_m1 buckets" in d.reason
    rows = choose(_problem("H100", 4096, 4096, 8, -1, "sym", "fp16", resident="rows_v1"))
    assert "reads wgmma_v1; this weight keeps only its rows_v1" in dict(rows.declined)["cuda_gemv_wg_simt"]


def test_forced_on_plain_codes_and_in_the_tensor_cores_buckets():
    """Forced, it runs where it declines softly: the compacted tile on plain codes (the wgmma_v1 copy is built), the
    tile rule's where the tensor-core GEMV took a compacted weight's call; a forced config's keys lay over it."""
    plain = _problem("H100", 4096, 4096, 4, 128, "sym", "fp16", resident=None)
    with kernel_options(force="cuda_gemv_wg_simt"):
        c = choose(plain)
        assert (c.kernel, c.layout) == ("cuda_gemv_wg_simt", "wgmma_v1")
        assert c.config == choose(replace(plain, resident="wgmma_v1")).config
        small = _problem("H100", 2304, 2560, 4, 128, "zero_point", "fp16")
        assert choose(small).config == host.wg_simt_config(2560, 2304, 4, 132, H100.name, "zero_point")
    with kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": {"k_slices": 4, "U": 1}}):
        c = choose(plain)
        assert (c.config["KS"], c.config["U"]) == (4, 1) and "RT" in c.config
    with (kernel_options(force="cuda_gemv_wg_simt", configs={"cuda_gemv_wg_simt": {"SIMT": 1}}),
          pytest.raises(ValueError, match="unknown config key 'SIMT'")):
        choose(plain)


@pytest.mark.parametrize("mode", ["sym", "zero_point"])
def test_candidates(mode):
    """The tuning candidates: the tile rule's (one step a k-slice where it applies), the table's / rule's, the one-step
    tile, and for zero point / offset the parameter pair packed or not; each a config of the kernel, none the
    default."""
    p = _problem("H200", 2048, 2048, 4, 128, mode, "fp16")
    base = cuda_gemv_wg_simt.choose_config(p)
    cands = cuda_gemv_wg_simt.candidates(p)
    assert cands and base not in cands and len(cands) == len({str(c) for c in cands})
    for c in cands:
        GemvWgSimtConfig.from_dict(c)
    assert dict(host.wg_simt_config(2048, 2048, 4, 132, H200.name, mode, one_step=False)) in cands
    assert any(c.get("PACK") != base.get("PACK") for c in cands) == (mode != "sym")
