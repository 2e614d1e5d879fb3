"""The kernel registry (mixgemm.kernels.registry): every entry's reasons to decline, the walk order, kernel_options
(force / disable / configs), mixgemm.explain, the per-weight plans, the weight cache of the ops and resident_bytes.

GPU decisions are checked on the CPU against DeviceInfo descriptions of an H100 and an A100 (what the dispatchers
read of a device); NVRTC is declared available so the decisions do not depend on this machine's install."""

from __future__ import annotations

import os

import pytest
import torch

import mixgemm
from described_gpus import A100, H100, H200
from mixgemm import QuantConfig, quantize_conv_weight
from mixgemm.formats.weight import from_codes
from mixgemm.kernels import int8_activations as a8_entries
from mixgemm.kernels import linear_common
from mixgemm.kernels.registry import NoKernel, entries, entry, entry_names

# CPU tensors through the Triton entries need the interpreter (tests/conftest.py sets it when there is no GPU)
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                       reason="runs Triton on CPU tensors (TRITON_INTERPRET=1)")


@pytest.fixture(autouse=True)
def _nvrtc_present(monkeypatch):
    monkeypatch.setattr(linear_common, "nvrtc_ok", lambda: True)
    monkeypatch.setattr(a8_entries, "nvrtc_ok", lambda: True)


def _qw(n, k, bits=4, group_size=128, mode="sym", seed=0):
    """A weight of this shape and format, from random codes and group parameters: the registry's choices read only
    the shape and the format, and quantizing a random float weight of the large layers was most of this file's
    time."""
    gen = torch.Generator().manual_seed(seed)
    cfg = QuantConfig(bits=bits, group_size=group_size, mode=mode)
    _, ng = cfg.groups(k)
    draw = lambda hi, shape: torch.randint(0, hi + 1, shape, generator=gen, dtype=torch.uint8)
    params = {"zeros": draw(cfg.qmax, (n, ng))} if mode == "zero_point" else \
        {"offsets": -0.1 * torch.rand(n, ng, generator=gen)} if mode == "offset" else {}
    return from_codes(draw(cfg.qmax, (n, k)), 1e-3 + 0.01 * torch.rand(n, ng, generator=gen), cfg, **params)


def _explain(m, qw, dtype=torch.float16, device=H100, **kw):
    return mixgemm.explain(torch.empty(m, qw.in_features, dtype=dtype), qw, device=device, **kw)


def _reasons(choice) -> dict:
    return dict(choice.declined)


def test_every_entry_is_listed_once_in_order():
    names = [e.name for op in ("linear", "linear_a8", "conv") for e in entries(op)]
    assert len(names) == len(set(names)) == len(entry_names())
    assert [e.name for e in entries("linear")] == ["cuda_gemv_wg_simt", "cuda_gemv_mma", "cuda_gemv", "dequant_cublas",
                                                   "cuda_wgmma", "triton_gemm"]
    assert [e.name for e in entries("linear_a8")] == ["cuda_gemv_a8", "cuda_gemv_a8_wg", "cuda_wgmma_a8", "triton_a8"]
    for name in ("cuda_gemv_wg_simt", "cuda_gemv_mma", "cuda_gemv", "cuda_wgmma", "cuda_gemv_a8", "cuda_gemv_a8_wg",
                 "cuda_wgmma_a8", "triton_a8"):
        assert entry(name).layout is not None and entry(name).layout.name  # the layout each reads, for accounting


def test_linear_entries_reasons():
    qw = _qw(2048, 2048)
    # fp16 M = 1: the CUDA-core GEMV outside the table's gemv_mma_m1 buckets, the tensor-core one declines softly
    c = _explain(1, _qw(4096, 4096))
    assert c.kernel == "cuda_gemv"
    assert "fp16 at M = 1 outside the h100 table's gemv_mma_m1" in _reasons(c)["cuda_gemv_mma"]
    c = _explain(1, qw)  # a small layer inside them: the tensor-core GEMV's 16-way k-split
    assert c.kernel == "cuda_gemv_mma" and c.config["KS"] == 16 and list(_reasons(c)) == ["cuda_gemv_wg_simt"]
    assert "keeps its plain codes" in _reasons(c)["cuda_gemv_wg_simt"]  # a compacted weight's kernel
    assert _explain(1, qw, device=A100).kernel == "cuda_gemv"  # no such buckets in the default table
    assert _explain(1, _qw(2048, 2048, bits=8, group_size=-1)).kernel == "cuda_gemv"  # W4 buckets only
    assert _explain(1, qw, torch.bfloat16).kernel == "cuda_gemv_mma"
    c = _explain(4, qw, torch.float32)
    assert c.kernel == "cuda_gemv" and "activation dtype torch.float32" in _reasons(c)["cuda_gemv_mma"]
    c = _explain(17, qw)
    assert c.kernel == "cuda_wgmma" and "outside the GEMV's 1..16" in _reasons(c)["cuda_gemv"]
    assert c.config["BM"] >= 17 and "SPLIT" in c.config
    c = _explain(17, qw, device=A100)
    assert c.kernel == "triton_gemm" and "needs sm_90" in _reasons(c)["cuda_wgmma"]
    c = _explain(64, qw, torch.float32)
    assert c.kernel == "triton_gemm" and "activation dtype" in _reasons(c)["cuda_wgmma"]
    big = _qw(14336, 4096)  # N >= 8192 on the H100 table: the GEMV stops at the int4 crossover M = 8
    c = _explain(9, big)  # (112 wgmma output tiles fill 85% of the 132 SMs: gemv_over_wgmma does not apply)
    assert c.kernel == "cuda_wgmma" and "crossover M=8" in _reasons(c)["cuda_gemv"]
    assert _explain(9, big, torch.float32).kernel == "cuda_gemv"  # the Triton GEMM's crossover is 16


def _choose(m, k, n, bits=4, group_size=128, dtype=torch.float16, device=H100):
    """The registry's choice for a K x N layer (the problem's sizes replaced on a small weight of that format)."""
    from dataclasses import replace

    from mixgemm.kernels.registry import choose

    qw = _qw(64, 256, bits=bits, group_size=group_size)
    return choose(replace(linear_common.linear_problem(m, qw, dtype, device), n=n, k=k))


def test_gemv_over_wgmma_crossover():
    """H100, int4 at M = 9..16: the GEMVs keep layers whose wgmma output tiles would fill under 70% of their last wave,
    or need more than one wave at K <= 5120 (gemv_over_wgmma); the table's wgmma_from_m regions (tall layers) and the
    small-M tile family's buckets win."""
    from mixgemm import tuning

    c = _choose(16, 8192, 8192)  # 64 tiles: 48% of a wave; explain says why the GEMV runs past M = 8
    assert c.entry.name == "cuda_gemv_mma" and c.config_source == (
        "kept on the GEMV past the h100 table's crossover M=8: the wgmma GEMM's 64 output tiles fill 48% of their "
        "last wave (< 70%)")
    assert _choose(8, 8192, 8192).config_source == ""  # below the crossover: the rule, no note
    assert _choose(16, 3584, 8192).entry.name == "cuda_gemv_mma"  # the same with the wgmma's split 2 (not counted)
    assert _choose(16, 5120, 55296).entry.name == "cuda_gemv_mma"  # 432 tiles, 4 waves, K <= 5120
    # the small-M tile family's measured buckets come first (4096 x 22016: 172 tiles, 2 waves, K <= 5120)
    assert "wgmma_small_m_family" in _choose(16, 4096, 22016).config_source
    assert _choose(16, 4096, 14336).entry.name == "cuda_wgmma"  # 112 tiles: 85%
    assert _choose(16, 8192, 57344).entry.name == "cuda_wgmma"  # 448 tiles over 4 waves (85%), K > 5120
    assert _choose(8, 8192, 57344).entry.name == "cuda_gemv_mma"  # below the int4 crossover
    for k, n in ((13824, 5120), (27648, 5120), (36864, 4608), (28672, 8192)):  # tall: the wgmma GEMM's split-K
        assert _choose(16, k, n).entry.name == "cuda_wgmma", (k, n)
        assert _choose(8, k, n).entry.name == "cuda_gemv_mma", (k, n)
    assert _choose(16, 14336, 4096).entry.name == "cuda_gemv_mma"  # N 4096: outside the tall region
    # int8 per channel: tall layers below N 8192 leave the GEMV from M = 9 (test_gemv_over_wgmma_int8: wide ones)
    assert _choose(16, 27648, 5120, 8, -1).entry.name == "cuda_wgmma"
    assert _choose(8, 27648, 5120, 8, -1).entry.name == "cuda_gemv_mma"
    t = tuning.load_table("h100")
    why = "the wgmma GEMM's 64 output tiles fill 48% of their last wave (< 70%)"
    assert tuning.gemv_over_wgmma(t, 4, 8192, 64, 132) == (16, why)
    assert "2 waves on a layer with K = 4096" in tuning.gemv_over_wgmma(t, 4, 4096, 224, 132)[1]  # 85%
    assert tuning.gemv_over_wgmma(t, 4, 8192, 224, 132) is None
    assert tuning.gemv_over_wgmma(t, 8, 8192, 64, 132)[0] == 8  # int8's rule keeps M <= 8
    assert tuning.gemv_over_wgmma(t, 2, 8192, 64, 132) is None  # no rule for the bit width
    assert tuning.gemv_over_wgmma(tuning.load_table("default"), 4, 8192, 64, 132) is None


@pytest.mark.parametrize("device", [H100, H200], ids=["h100", "h200"])
def test_gemv_over_wgmma_int8(device):
    """int8 per channel on layers of N >= 8192 (the tables send int8 to the wgmma GEMM from M = 2): the tensor-core GEMV
    keeps M 2..8 where the GEMM's tiles fill under 70% of their last wave, fit one wave or need several at K <= 5120,
    and the GEMM takes K = 8192 over several full waves and every M > 8."""
    name = "h100" if device is H100 else "h200"
    for k, n in ((3584, 18944), (4096, 14336), (8192, 8192), (28672, 8192), (3584, 8192), (1536, 8960)):
        for m in (2, 5, 8):
            c = _choose(m, k, n, 8, -1, device=device)
            assert c.entry.name == "cuda_gemv_mma", (k, n, m)
            assert c.config_source.startswith(f"kept on the GEMV past the {name} table's crossover M=1: the wgmma GEMM")
        assert _choose(9, k, n, 8, -1, device=device).entry.name == "cuda_wgmma", (k, n)
    for k, n in ((8192, 28672), (8192, 57344)):
        for m in (2, 8, 16):
            assert _choose(m, k, n, 8, -1, device=device).entry.name == "cuda_wgmma", (k, n, m)
    assert _choose(1, 3584, 18944, 8, -1, device=device).entry.name == "cuda_gemv"  # M = 1: the CUDA-core GEMV
    assert _choose(16, 4096, 4096, 8, -1, device=device).entry.name == "cuda_gemv_mma"  # N < 8192: every M <= 16


def test_gemv_over_wgmma_rules_checked():
    """A table's gemv_over_wgmma rules need their fields and a source, one rule per bit width."""
    from mixgemm import tuning

    rule = {"bits": [8], "min_fill": 0.7, "multiwave_max_k": 5120, "source": "s"}
    assert tuning.parse_table({"gemv_over_wgmma": [rule]}, "t")["gemv_over_wgmma"] == {8: rule}
    with pytest.raises(ValueError, match="t.json gemv_over_wgmma 0 needs 'bits', 'min_fill', 'multiwave_max_k'"):
        tuning.parse_table({"gemv_over_wgmma": [{"bits": [8], "source": "s"}]}, "t")
    with pytest.raises(ValueError, match="gemv_over_wgmma 1: a second rule for int8"):
        tuning.parse_table({"gemv_over_wgmma": [rule, {**rule, "bits": [4, 8]}]}, "t")


def test_gemv_over_wgmma_on_the_h200():
    """The H200's rule differs from the H100's (measured): int4 at M 9..16 keeps the GEMV wherever the wgmma GEMM's
    tiles fit in one wave at K <= 5120, and gives it every multi-wave layer at any K."""
    assert _choose(16, 8192, 10240, device=H200).entry.name == "cuda_wgmma"  # one wave, but K 8192
    assert _choose(16, 4096, 14336, device=H200).entry.name == "cuda_gemv_mma"  # 112 tiles: one wave
    assert _choose(16, 4096, 14336).entry.name == "cuda_wgmma"  # (the H100 there)
    assert _choose(16, 4096, 28672, device=H200).entry.name == "cuda_wgmma"  # 224 tiles over 2 waves, K 4096
    assert _choose(16, 27648, 5120, device=H200).entry.name == "cuda_wgmma"  # tall: the wgmma_from_m region
    assert _choose(8, 4096, 28672, device=H200).entry.name == "cuda_gemv_mma"  # below the crossover
    assert _choose(16, 8192, 8192, 8, -1, device=H200).entry.name == "cuda_wgmma"  # int8: the table's limit


def test_gemv_mma_m1_buckets():
    """H100, fp16 at M = 1: the tensor-core GEMV on small int4 layers (the table's gemv_mma_m1 regions), the CUDA-core
    GEMV elsewhere."""
    for k, n in ((1536, 1536), (2048, 2048), (3072, 3072), (2304, 4096), (3584, 2048), (896, 4864)):
        assert _choose(1, k, n).entry.name == "cuda_gemv_mma", (k, n)
    for k, n in ((2048, 256), (4096, 4096), (3584, 4096), (2048, 11008), (5120, 1024), (8192, 1024), (4096, 1024),
                 (3584, 512)):
        assert _choose(1, k, n).entry.name == "cuda_gemv", (k, n)
    assert _choose(1, 2048, 2048, dtype=torch.float32).entry.name == "cuda_gemv"
    # the H200's buckets (measured there): N up to ~9.7k at short K
    assert _choose(1, 2304, 9216, device=H200).entry.name == "cuda_gemv_mma"
    assert _choose(1, 2304, 9216).entry.name == "cuda_gemv"
    assert _choose(1, 4096, 4096, device=H200).entry.name == "cuda_gemv"


def test_gemv_simt_m1_bf16_buckets():
    """bf16 at M = 1 on int8 weights: the CUDA-core GEMV inside the tables' gemv_simt_m1_bf16 regions (K from ~1.2k,
    but K ~1.2-1.7k x N ~1.7-2.4k), the tensor-core GEMV elsewhere; int4 weights and fp16 keep their own rules."""
    for device in (H100, H200):
        for k, n in ((4096, 1024), (1536, 1536), (4096, 4096), (14336, 4096), (8192, 28672)):
            c = _choose(1, k, n, 8, -1, dtype=torch.bfloat16, device=device)
            assert c.entry.name == "cuda_gemv", (device.name, k, n)
            assert "gemv_simt_m1_bf16" in dict(c.declined)["cuda_gemv_mma"]
        for k, n in ((896, 896), (896, 9728), (1536, 2048)):
            assert _choose(1, k, n, 8, -1, dtype=torch.bfloat16, device=device).entry.name == "cuda_gemv_mma"
        assert _choose(1, 4096, 1024, 4, dtype=torch.bfloat16, device=device).entry.name == "cuda_gemv_mma"
        assert _choose(2, 4096, 1024, 8, -1, dtype=torch.bfloat16, device=device).entry.name != "cuda_gemv"
    assert _choose(1, 4096, 1024, 8, -1, dtype=torch.bfloat16, device=A100).entry.name == "cuda_gemv_mma"  # no data
    # int4 on the H200 (measured there): tall narrow layers and a few measured buckets take the CUDA-core GEMV
    for k, n in ((8192, 1024), (11008, 2048), (4096, 11008), (17920, 5120), (36864, 4608)):
        c = _choose(1, k, n, 4, dtype=torch.bfloat16, device=H200)
        assert c.entry.name == "cuda_gemv" and "gemv_simt_m1_bf16" in dict(c.declined)["cuda_gemv_mma"], (k, n)
    for k, n in ((14336, 4096), (4096, 4096), (28672, 8192), (896, 896)):
        assert _choose(1, k, n, 4, dtype=torch.bfloat16, device=H200).entry.name == "cuda_gemv_mma", (k, n)
    assert _choose(1, 8192, 1024, 4, dtype=torch.bfloat16).entry.name == "cuda_gemv_mma"  # the H100: not measured


def test_act_order_choice_says_who_gathers():
    """Act-order problems: the GEMVs gather x through the permutation in the kernel, the GEMMs say why not (the
    caller gathers first); plain problems carry no permutation note."""
    qw = _qw(2048, 2048)
    # decode: fp16 M = 1 stages x in shared memory (the CUDA-core GEMV), bf16 M = 1 and fp16 M = 1 on a small layer
    # (the gemv_mma_m1 buckets) gather per lane (tensor cores)
    for m, dtype, kernel, w in ((1, torch.float16, "cuda_gemv", _qw(4096, 4096)),
                                (1, torch.bfloat16, "cuda_gemv_mma", qw), (1, torch.float16, "cuda_gemv_mma", qw)):
        c = _explain(m, w, dtype, act_order=True)
        assert c.kernel == kernel and c.perm_in_kernel and "gathered in the kernel" in str(c)
    c = _explain(1, _qw(64, 16384 + 128), act_order=True)  # x and its gathered copy exceed 64 KiB
    assert c.kernel == "cuda_gemv" and not c.perm_in_kernel and "not staged in shared memory" in c.perm_note
    for m, dtype, device, kernel, why in ((4, torch.float16, H100, "cuda_gemv_mma", "MMA_GATHER_MAX_M"),
                                          (16, torch.float32, H100, "cuda_gemv", "act_order_gather='kernel'"),
                                          (17, torch.float16, H100, "cuda_wgmma", "GEMMs"),
                                          (64, torch.float16, A100, "triton_gemm", "GEMMs")):
        c = _explain(m, qw, dtype, device=device, act_order=True)
        assert c.kernel == kernel and not c.perm_in_kernel and why in c.perm_note
        assert "separate gather before the kernel" in c.perm_note and c.perm_note in str(c)
    with mixgemm.kernel_options(act_order_gather="kernel"):  # every GEMV gathers (A/B measurements)
        assert _explain(4, qw, act_order=True).perm_in_kernel
        assert _explain(16, qw, torch.float32, act_order=True).perm_in_kernel
    with mixgemm.kernel_options(act_order_gather="caller"):  # no kernel gathers
        c = _explain(1, qw, act_order=True)
        assert not c.perm_in_kernel and "act_order_gather='caller'" in c.perm_note
    with pytest.raises(ValueError, match="act_order_gather must be one of"), \
            mixgemm.kernel_options(act_order_gather="never"):
        pass
    plain = _explain(1, qw)
    assert not plain.perm_in_kernel and plain.perm_note == "" and "permutation" not in str(plain)
    with mixgemm.kernel_options(force="cuda_wgmma"):  # a forced entry answers for itself too
        assert not _explain(1, qw, act_order=True).perm_in_kernel


def test_run_linear_gathers_only_for_entries_that_cannot(torch_gen):
    from dataclasses import replace

    from mixgemm.ops.dispatch import kernel_perm, run_linear

    calls = []

    def run(x2d, qw, bias, lo, hi, config, perm=None):
        calls.append((x2d, perm))
        return x2d

    c = _explain(1, _qw(64, 256), act_order=True)
    x = torch.randn(1, 256, generator=torch_gen)
    perm = torch.randperm(256, generator=torch_gen)
    gathering = replace(c, entry=replace(c.entry, run=run))
    run_linear(gathering, x, None, None, 0.0, 0.0, perm)
    assert calls[-1][0] is x and calls[-1][1] is kernel_perm(perm)
    run_linear(replace(gathering, perm_in_kernel=False), x, None, None, 0.0, 0.0, perm)
    assert torch.equal(calls[-1][0], x[:, perm]) and calls[-1][1] is None
    run_linear(gathering, x, None, None, 0.0, 0.0, None)
    assert calls[-1][0] is x and calls[-1][1] is None


def test_triton_entry_needs_cuda_or_interpreter(monkeypatch):
    qw = _qw(64, 256)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(NoKernel, match="triton_gemm: needs a CUDA device"):
        _explain(3, qw, device=torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c = _explain(3, qw, device=torch.device("cpu"))
    assert c.kernel == "triton_gemm" and _reasons(c)["cuda_gemv"] == "needs a CUDA device"


def test_a8_entries_reasons():
    qw = _qw(2048, 2048)
    c = _explain(1, qw, act_mode="sym", act_block="token")
    assert c.kernel == "cuda_gemv_a8" and {"R", "KS", "RG", "NW"} <= set(c.config)
    c = _explain(4, qw, act_mode="sym", act_block="token")  # then the same GEMV on the int8 GEMM's layout (sm_90)
    assert c.kernel == "cuda_gemv_a8_wg" and "above the fused GEMV's range" in _reasons(c)["cuda_gemv_a8"]
    c = _explain(5, qw, act_mode="sym", act_block="token")  # the CUDA int8 GEMM also at small M (tuning)
    assert c.kernel == "cuda_wgmma_a8" and c.config["BM"] == 16  # M rounded up to the wgmma N
    assert "above the fused GEMV's range" in _reasons(c)["cuda_gemv_a8_wg"]
    c = _explain(100, qw, act_mode="sym", act_block="token")
    assert c.kernel == "triton_a8" and "below M=128 and outside M 3..64" in _reasons(c)["cuda_wgmma_a8"]
    c = _explain(5, _qw(256, 1024, bits=8, group_size=-1), act_mode="sym")
    assert c.kernel == "cuda_wgmma_a8" and c.config["BM"] == 16
    # per-block activation scales: the CUDA int8 GEMM (its split-K fills the SMs) except where its CTAs spill into a
    # poorly filled second wave below M = 17
    for m in (9, 16, 17, 64, 100):
        assert _explain(m, qw, act_mode="sym", act_block="group").kernel == "cuda_wgmma_a8"
    assert _explain(8, qw, act_mode="sym", act_block="group").kernel == "cuda_gemv_a8_wg"  # (tuning: <= 16M weights)
    spill = _qw(18944, 3584)  # (N, K): 148 CTAs of 128 rows on 132 SMs
    c = _explain(16, spill, act_mode="sym", act_block="group")
    assert c.kernel == "triton_a8" and "filling 0.56 of their waves" in _reasons(c)["cuda_wgmma_a8"]
    assert _explain(17, spill, act_mode="sym", act_block="group").kernel == "cuda_wgmma_a8"
    # int8 per-channel and per-token scales over a long K with few CTAs: the CUDA GEMM with its cluster split-K
    tall = _qw(4096, 14336, bits=8, group_size=-1)  # (N, K)
    c = _explain(8, tall, act_mode="sym")
    assert c.kernel == "cuda_wgmma_a8" and c.config["SPLIT"] == 3 and c.config["BM"] == 16
    c = _explain(5, _qw(4096, 14336, bits=4, group_size=128), act_mode="sym", act_block="token")
    assert c.kernel == "cuda_wgmma_a8" and c.config["SPLIT"] == 3
    assert _explain(16, _qw(14336, 4096, bits=8, group_size=-1), act_mode="sym").config["SPLIT"] == 1
    assert _explain(17, qw, act_mode="sym").declined[0] == ("cuda_gemv_a8", "M=17 outside the kernel's 1..16")
    assert _explain(512, qw, act_mode="sym").kernel == "cuda_wgmma_a8"
    c = _explain(512, qw, act_mode="asym")
    assert c.kernel == "triton_a8" and "act_mode 'asym'" in _reasons(c)["cuda_wgmma_a8"]
    c = _explain(512, _qw(256, 512, mode="zero_point"), act_mode="sym")
    assert "wgmma_a8_v1 layout takes sym" in _reasons(c)["cuda_wgmma_a8"]
    assert "needs sm_90" in _reasons(_explain(512, qw, act_mode="sym", device=A100))["cuda_wgmma_a8"]
    w8 = _qw(256, 1024, bits=8, group_size=-1)
    from_m = mixgemm.tuning.A8_W8_PER_CHANNEL_TRITON_FROM_M
    assert _explain(from_m - 1, w8, act_mode="sym").kernel == "cuda_wgmma_a8"
    c = _explain(from_m, w8, act_mode="sym")  # int8 per-channel outside the BM 256 / MC 2 region (K < W8_WIDE_MIN_K)
    assert c.kernel == "triton_a8" and "Triton kernel measured faster" in _reasons(c)["cuda_wgmma_a8"]
    long_pc = _qw(2, 65600, bits=8, group_size=-1)
    assert "int32 range" in _reasons(_explain(1, long_pc, act_mode="sym"))["cuda_gemv_a8"]
    with pytest.raises(NoKernel, match="triton_a8: 4-bit int8_v1 layout needs K % 128 == 0"):
        _explain(64, _qw(64, 192, group_size=64), act_mode="sym")


def test_one_by_one_conv_takes_its_race():
    """A 1x1 conv's GEMM route (conv_as_matmul) runs where the layer's race measured it faster than the implicit GEMM
    below it; unraced, the entry below runs; a layer this GPU's conv sweep measured keeps the sweep's path."""
    from dataclasses import replace

    from mixgemm.kernels.conv_as_matmul import NAME
    from mixgemm.kernels.conv_geometry import conv_problem, conv_race_key
    from mixgemm.kernels.registry import choose
    from mixgemm.tuning import races

    qw = quantize_conv_weight(torch.randn(96, 160, 1, 1), QuantConfig(bits=4, group_size=32, mode="zero_point"))
    x = torch.randn(1, 160, 7, 9, dtype=torch.float16).to(memory_format=torch.channels_last)
    p = replace(conv_problem(x, qw, 63, (1, 1), (0, 0), 1), device=H200)
    races.forget()
    try:
        c = choose(p)
        assert c.kernel != NAME and "not measured yet" in _reasons(c)[NAME]
        rival = c.kernel
        key = conv_race_key(p, NAME)
        races.record(key, races.RaceResult({rival: 9.0, NAME: 6.0}, NAME, p.m))
        c = choose(p)
        assert c.kernel == NAME and f"{NAME} 6.0 us, {rival} 9.0 us" in c.config_source
        races.record(key, races.RaceResult({rival: 6.0, NAME: 6.1}, rival, p.m))
        c = choose(p)
        assert c.kernel == rival and f"slower than {rival}" in _reasons(c)[NAME]
        other = replace(conv_problem(x[:, :, :5], qw, 45, (1, 1), (0, 0), 1), device=H200)
        assert "not measured yet" in _reasons(choose(other))[NAME]  # another input shape: its own race
    finally:
        races.forget()


def test_nested_races_race_downwards(monkeypatch):
    """dequant_cudnn races against the registry's choice without it, which is conv_as_matmul's own race against the
    entries below both: each race's rival is chosen with the racing entries above it disabled (no loop back up)."""
    from dataclasses import replace

    from mixgemm.kernels import race
    from mixgemm.kernels.conv_geometry import conv_problem
    from mixgemm.kernels.registry import choose
    from mixgemm.tuning import races

    held = []

    def fake_race(incumbent, challenger, m, device, margin=1.03, timer=None):
        held.append((incumbent[0], challenger[0]))
        winner = challenger[0] if challenger[0] == "conv_as_matmul" else incumbent[0]
        return races.RaceResult({incumbent[0]: 2.0, challenger[0]: 1.0}, winner, m)

    monkeypatch.setattr(race, "can_time", lambda device: True)
    monkeypatch.setattr(race, "race", fake_race)
    qw = quantize_conv_weight(torch.randn(96, 160, 1, 1), QuantConfig(bits=8, group_size=-1))
    x = torch.randn(1, 160, 7, 9, dtype=torch.float16).to(memory_format=torch.channels_last)
    p = replace(conv_problem(x, qw, 63, (1, 1), (0, 0), 1), device=H200)
    races.forget()
    try:
        c = choose(p)
        below = held[0][0]
        assert held == [(below, "conv_as_matmul"), ("conv_as_matmul", "dequant_cudnn")]
        assert below not in ("dequant_cudnn", "conv_as_matmul") and c.kernel == "conv_as_matmul"
        assert choose(p).kernel == "conv_as_matmul" and len(held) == 2  # kept: no second race
    finally:
        races.forget()


def test_conv_entries_reasons():
    from mixgemm.ops.conv import conv_choice

    def choice(ci, co, groups, k, x, stride=1, pad=0, bits=4, gs=-1):
        qw = quantize_conv_weight(torch.randn(co, ci // groups, k, k), QuantConfig(bits=bits, group_size=gs))
        return conv_choice(x, qw, x.shape[0] * 9, (stride, stride), (pad, pad), groups)

    cl = torch.randn(1, 64, 3, 3).to(memory_format=torch.channels_last)
    c = choice(64, 32, 1, 1, cl)
    assert c.kernel == "conv_as_matmul"
    assert _reasons(c)["triton_dwconv"].startswith("not depthwise")
    assert "activation dtype torch.float32" in _reasons(c)["dequant_cudnn"]
    assert choice(64, 32, 1, 1, cl.half()).declined[0] == ("dequant_cudnn", "needs a CUDA device")
    c = choice(64, 32, 1, 1, torch.randn(1, 64, 3, 3))
    assert c.kernel == "triton_conv_igemm" and "not channels_last" in _reasons(c)["conv_as_matmul"]
    assert _reasons(c)["cuda_conv_wgmma"] == "needs a CUDA device"
    c = choice(3, 16, 1, 3, torch.randn(1, 3, 5, 5), pad=1, bits=8)
    assert c.kernel == "triton_conv_smallk"
    c = choice(16, 16, 16, 3, torch.randn(1, 16, 5, 5), pad=1, bits=8)
    assert c.kernel == "triton_dwconv" and "channel multiplier 1" in _reasons(c)["cuda_dwconv"]
    with mixgemm.kernel_options(conv_dequant_min_m=1):
        assert choice(64, 32, 1, 3, cl.half(), pad=1).kernel == "dequant_cudnn"
        c = choice(64, 32, 1, 3, cl, pad=1)
        assert "activation dtype torch.float32" in _reasons(c)["dequant_cudnn"]


def test_kernel_options_pdl_and_act_order_gather_nest():
    """pdl and act_order_gather live in the options (no module flags): a block sets them, an inner block inherits
    them, leaving restores the defaults (pdl from MIXGEMM_PDL)."""
    import os

    from mixgemm.kernels.options import current_options

    default = current_options()
    assert default.is_default and default.pdl == (os.environ.get("MIXGEMM_PDL", "1") != "0")
    assert default.act_order_gather == "auto"
    with mixgemm.kernel_options(pdl=False, act_order_gather="caller"):
        with mixgemm.kernel_options(force="cuda_gemv"):
            inner = current_options()
            assert (inner.pdl, inner.act_order_gather, inner.force) == (False, "caller", frozenset({"cuda_gemv"}))
        with mixgemm.kernel_options(pdl=True):
            assert current_options().pdl and current_options().act_order_gather == "caller"
    assert current_options() is default


def test_kernel_options_force_disable_configs():
    qw = _qw(2048, 2048)
    with mixgemm.kernel_options(force="cuda_gemv_mma"):  # a soft decline is overridden
        assert _explain(1, qw).kernel == "cuda_gemv_mma"
        with pytest.raises(NoKernel, match="forced kernel cannot run.*activation dtype"):  # a hard one is not
            _explain(1, qw, torch.float32)
    with mixgemm.kernel_options(disable={"cuda_wgmma"}):
        c = _explain(64, qw)
        assert c.kernel == "triton_gemm" and _reasons(c)["cuda_wgmma"] == "disabled by kernel_options"
        with mixgemm.kernel_options(force="cuda_wgmma"):  # forcing lifts an enclosing disable
            assert _explain(64, qw).kernel == "cuda_wgmma"
        assert _explain(64, qw).kernel == "triton_gemm"
    assert _explain(64, qw).kernel == "cuda_wgmma"  # restored on exit
    with mixgemm.kernel_options(configs={"cuda_gemv": {"R": 2, "U": 1, "KS": 4, "LITE": 1}}):
        assert _explain(1, _qw(4096, 4096)).config == {"R": 2, "U": 1, "RG": 2, "KS": 4, "PF": 0, "LITE": 1}
    with mixgemm.kernel_options(force="cuda_gemv_mma", configs={"cuda_gemv_mma": {"DEFER": 0}}):
        assert _explain(3, qw).config["DEFER"] == 0
    with mixgemm.kernel_options(configs={"cuda_wgmma": {"BM": 64, "NWG": 2}}):
        assert _explain(300, qw).config == {"BM": 64, "NWG": 2}
    with pytest.raises(ValueError, match="unknown kernel 'gemv'"), mixgemm.kernel_options(force="gemv"):
        pass


def test_explain_cpu_and_str():
    qw = _qw(64, 256)
    c = mixgemm.explain(torch.randn(2, 256), qw)
    assert c.kernel == "cpu_dequant" and "bfloat16" in dict(c.declined)["cpu_torch_kernels"]
    assert mixgemm.explain(torch.randn(2, 256, dtype=torch.bfloat16), qw).kernel == "cpu_torch_kernels"
    assert mixgemm.explain(torch.randn(2, 256), qw, act_mode="sym").kernel == "cpu_reference"
    s = str(_explain(1, _qw(4096, 4096)))
    assert s.startswith("linear: cuda_gemv with config") and "cuda_gemv_mma declined: fp16 at M = 1" in s


def test_choice_says_which_layout_it_reads():
    """A choice names the weight layout its entry reads with its config (the copy of the weight a call keeps on the
    GPU): the tensor-core GEMV reads gemv_mma_v1 for int4 and the wgmma GEMM's wgmma_v1 for int8 or with WG; the
    CUDA-core GEMV the plain codes' gemv_v2."""
    w4, w8 = _qw(2048, 2048), _qw(2048, 2048, bits=8, group_size=-1)
    assert (_explain(1, _qw(4096, 4096)).layout, _explain(1, w4).layout) == ("gemv_v2", "gemv_mma_v1")
    assert (_explain(16, w4).layout, _explain(16, w8).layout) == ("gemv_mma_v1", "wgmma_v1")
    assert _explain(4096, w4).layout == "wgmma_v1" and _explain(4096, w4, device=A100).layout == "triton_gemm_v1_ks16"
    assert str(_explain(16, w8)).splitlines()[0].endswith(", reads layout wgmma_v1")
    with mixgemm.kernel_options(force="cuda_gemv_mma", configs={"cuda_gemv_mma": {"WG": 1}}):
        c = _explain(1, _qw(4096, 4096))
        assert (c.kernel, c.layout, c.config["WG"]) == ("cuda_gemv_mma", "wgmma_v1", 1)
    with mixgemm.kernel_options(force="cuda_gemv_wg_simt"):  # the CUDA-core GEMV on wgmma_v1, on a plain weight too
        c = _explain(1, _qw(4096, 4096))
        assert (c.kernel, c.layout) == ("cuda_gemv_wg_simt", "wgmma_v1") and "WG" not in c.config
    assert mixgemm.explain(torch.randn(2, 256), _qw(64, 256)).layout is None  # the CPU fallback declares none


@needs_interpreter
def test_plans_cached_per_weight_without_the_weight():
    from mixgemm.ops import dispatch

    qw = _qw(64, 256)
    dev = torch.device("cpu")  # the Triton entry under the interpreter
    a = dispatch.linear_choice(5, qw, torch.float16, dev)
    assert dispatch.linear_choice(5, qw, torch.float16, dev) is a  # one dict lookup per call
    assert a.problem.qw is None  # no reference cycle through the plan
    assert dispatch.linear_choice(6, qw, torch.float16, dev) is not a
    with mixgemm.kernel_options(disable="cuda_gemv"):
        assert dispatch.linear_choice(5, qw, torch.float16, dev) is not a  # options: chosen afresh, not cached
    assert len(dispatch.plans_of(qw)) == 2
    for m in range(dispatch.MAX_PLANS + 5):
        dispatch.linear_choice(m + 1, qw, torch.float16, dev)
    assert len(dispatch.plans_of(qw)) <= dispatch.MAX_PLANS
    x = torch.randn(3, 256)
    y = dispatch.cuda_matmul(x, qw, None, None)  # the plan's launch (Triton under the interpreter)
    r = mixgemm.matmul(x, qw)  # the CPU fallback
    assert float((y - r).norm() / r.norm()) <= 1e-5


def test_weight_cache_fast_path():
    from mixgemm.ops.custom_ops import cached_weight, weight_args, weight_from_tensors

    qw = _qw(32, 128, mode="zero_point")
    args = weight_args(qw)
    a = weight_from_tensors(*args)
    assert weight_from_tensors(*args) is a and cached_weight(args[0]) is a
    alias = (args[0], args[1].view_as(args[1]), *args[2:])  # equal tensors through another object: same weight
    assert weight_from_tensors(*alias) is a
    args[1].mul_(2)  # an in-place change: a fresh weight over the changed tensors
    b = weight_from_tensors(*args)
    assert b is not a and b.scales is args[1]
    # the tensors a mode does not read: None (the compiled path) and an empty placeholder (the module's buffer, the
    # eager path) meet the same entry, so alternating eager and compiled calls keep one weight and its layouts
    sym = _qw(32, 128, mode="sym")
    plain = weight_args(sym)
    assert plain[2] is None and plain[3] is None
    s = weight_from_tensors(*plain)
    empty = (plain[0], plain[1], torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.float16), *plain[4:])
    assert weight_from_tensors(*empty) is s and s.zeros is None and s.offsets is None
    with pytest.raises(ValueError, match="zeros uint8 .* got None"):
        weight_from_tensors(args[0], args[1], None, None, *args[4:])


def test_resident_bytes():
    from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2
    from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1

    qw = _qw(64, 40, group_size=-1, mode="zero_point")  # K = 40 is no whole number of chunks: a padded copy
    r = mixgemm.resident_bytes(qw)
    assert r["plain"] == qw.nbytes() and r["layouts"] == {} and r["ratio"] == 1.0
    lay = qw.layout("gemv_v2", build_gemv_v2)
    r = mixgemm.resident_bytes(qw)
    assert r["layouts"]["gemv_v2"] == lay.weight.numel() + lay.params.numel() * lay.params.element_size()
    assert r["total"] == r["plain"] + r["layouts"]["gemv_v2"]
    # memory shared with the plain buffers or another layout is counted once: gemv_v2 reads qweight itself (a zero
    # point weight's (scale, z) pairs are its own), a sym weight's params are its scales, gemv_mma_v1 shares params
    qw = _qw(64, 256, mode="zero_point")
    lay2 = qw.layout("gemv_v2", build_gemv_v2)
    assert lay2.weight is qw.qweight
    assert mixgemm.resident_bytes(qw)["layouts"] == {"gemv_v2": lay2.params.numel() * lay2.params.element_size()}
    qw = _qw(64, 256, mode="sym")
    qw.layout("gemv_v2", build_gemv_v2)
    mma = qw.layout("gemv_mma_v1", build_gemv_mma_v1)
    r = mixgemm.resident_bytes(qw)
    assert r["layouts"] == {"gemv_v2": 0, "gemv_mma_v1": mma.weight.numel()}
    assert r["total"] == r["plain"] + mma.weight.numel()
    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.Linear(64, 32))
    mixgemm.quantize_(model, mixgemm.W4A16())
    model(torch.randn(2, 256))
    r = mixgemm.resident_bytes(model)
    assert r["plain"] > 0 and set(r["by_precision"]) == {"w4"} and r["by_precision"]["w4"]["plain"] == r["plain"]
    with pytest.raises(TypeError, match="resident_bytes takes"):
        mixgemm.resident_bytes(torch.zeros(3))


@needs_interpreter
@pytest.mark.parametrize("scheme", ["W4A16", "W8A16", "W8A8", "W4A8"])
def test_eager_forward_matches_the_ops(scheme):
    """QuantLinear's eager fast path (ops/eager.py; here through the Triton entries under the interpreter) equals the
    custom op's result, checks K, and answers an empty batch."""
    from mixgemm.ops.eager import eager_forward

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 64))
    mixgemm.quantize_(model, getattr(mixgemm, scheme)(**({"act_block": "token"} if scheme == "W4A8" else {})))
    q, x = model[0], torch.randn(2, 3, 256)
    y, r = eager_forward(q, x), q(x)
    assert y.shape == r.shape == (2, 3, 64) and float((y - r).norm() / r.norm()) <= 1e-5
    assert eager_forward(q, torch.randn(0, 256)).shape == (0, 64)
    with pytest.raises(ValueError, match="shape mismatch"):
        eager_forward(q, torch.randn(2, 255))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["W4A16", "W8A16", "W8A8", "W4A8"])
def test_eager_forward_cuda_matches_ops_and_keeps_grads(scheme):
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048)).half().cuda()
    mixgemm.quantize_(model, getattr(mixgemm, scheme)(**({"act_block": "token"} if scheme == "W4A8" else {})))
    q = model[0]
    c = q.config
    for m in (1, 16, 512):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
        y = model(x)  # the fast path
        if q.act_mode is None:
            r = torch.ops.mixgemm.linear_wxa16(x, q.qweight, q.scales, q.zeros, q.offsets, q.bias, c.bits,
                                               c.group_size, c.mode, 2048, 2048, -float("inf"), float("inf"))
        else:
            r = torch.ops.mixgemm.linear_wxa8(x, q.qweight, q.scales, q.zeros, q.offsets, q.bias, c.bits,
                                              c.group_size, c.mode, 2048, 2048, q.act_mode, -float("inf"),
                                              float("inf"), q.act_block)
        # the split-K wgmma tiles (M = 512 here) reduce with atomics: two calls of the same path may differ in the
        # last bits, so the paths agree within the fp16 tolerance rather than bit for bit
        assert float((y.double() - r.double()).norm() / r.double().norm()) <= 1e-3, m
    x = torch.randn(4, 2048, device="cuda", dtype=torch.float16, requires_grad=True)
    model(x).float().sum().backward()  # x needs a gradient: the op with its backward
    assert x.grad is not None and x.grad.shape == x.shape


def test_plans_keep_a_prepared_launch_and_calls_use_it(torch_gen):
    """An entry with ``prepare`` gets its launch built once, when the plan is made (CUDA problems only), and
    run_linear calls that launch instead of ``run`` -- with the kernel permutation when the entry gathers x itself."""
    from dataclasses import replace

    from mixgemm.ops import dispatch

    qw = _qw(64, 256)
    c = _explain(1, qw, act_order=True)
    prepared, launched = [], []

    def prepare(problem, weight, config):
        prepared.append((problem.m, weight is qw, config))

        def launch(x2d, bias, lo, hi, perm=None):
            launched.append((x2d, perm))
            return x2d

        return launch

    def run(*a, **k):
        raise AssertionError("a plan with a prepared launch must not call run")

    entry = replace(c.entry, prepare=prepare, run=run)
    chosen = replace(c, entry=entry)
    plans = dispatch.plans_of(qw)
    plans.clear()
    key = ("linear", 1, torch.float16, 0, True)
    orig = dispatch.choose
    try:
        dispatch.choose = lambda problem, opts=None: chosen
        plan = dispatch.cached_choice(qw, key, lambda: c.problem)
        assert dispatch.cached_choice(qw, key, lambda: c.problem) is plan  # built once
    finally:
        dispatch.choose = orig
    assert prepared == [(1, True, c.config)] and plan.launch is not None and plan.problem.qw is None
    x = torch.randn(1, 256, generator=torch_gen)
    perm = torch.randperm(256, generator=torch_gen)
    dispatch.run_linear(plan, x, qw, None, 0.0, 0.0, perm)
    assert launched[-1][0] is x and launched[-1][1] is dispatch.kernel_perm(perm)
    dispatch.run_linear(replace(plan, perm_in_kernel=False), x, qw, None, 0.0, 0.0, perm)
    assert torch.equal(launched[-1][0], x[:, perm]) and launched[-1][1] is None
    plans.clear()


@pytest.mark.parametrize("device", [H100, H200])
def test_groups_of_16_decline_the_cuda_kernels(device):
    """8-bit groups of 16 (GGUF Q6_K / Q3_K / Q2_K): every CUDA entry, weight-only and int8-activation, declines them
    with the reason, whatever M and activation dtype; the Triton GEMM takes them; the int8-activation path has no
    kernel for them (the Triton int8 GEMM's K step is wider than a group) and says so."""
    qw = _qw(1000, 1040, bits=8, group_size=16, mode="offset")
    for m in (1, 3, 16, 17, 129):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            c = _explain(m, qw, dtype, device=device)
            assert c.kernel == "triton_gemm"
            for name in ("cuda_gemv_mma", "cuda_gemv", "cuda_wgmma"):
                why = _reasons(c)[name]
                assert "groups of 16" in why or (m > 16 and name != "cuda_wgmma") or (
                    dtype == torch.float32 and "activation dtype" in why), (name, why)
    c = _explain(4, qw, device=device)
    assert all("groups of 16" in why for _, why in c.declined)
    assert "groups of 16" in _reasons(_explain(64, qw, device=device))["cuda_wgmma"]
    with pytest.raises(NoKernel, match=r"cuda_gemv_a8: groups of 16.*triton_a8: groups of 16"):
        _explain(4, qw, act_mode="sym", device=device)
    with pytest.raises(NoKernel, match=r"triton_a8: groups of 16"):
        _explain(200, qw, act_mode="asym", device=device)
    # per-channel over K = 16 (one group) is not a group of 16: the CUDA kernels keep it
    assert _explain(1, _qw(64, 16, bits=8, group_size=16), device=device).kernel.startswith("cuda_gemv")
