"""Tests of the Triton tensor-core GEMM (mixgemm.kernels.triton_gemm.gemm), its layout and the dispatcher.

On a machine without CUDA the kernel runs under the Triton CPU interpreter (TRITON_INTERPRET=1, set
here before the kernel module is imported; no bf16 there, small shapes). On a GPU the `gpu` tests run
the compiled kernels against the float64 reference.
"""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

from mixgemm import tuning as cfgmod  # noqa: E402
from mixgemm.formats.weight import QuantConfig, quantize_weight  # noqa: E402
from mixgemm.kernels.triton_gemm.gemm import default_config, gemm  # noqa: E402
from mixgemm.kernels.triton_gemm.layout import build_triton_gemm_v1, pack_words  # noqa: E402
from mixgemm.reference.matmul import matmul as ref_matmul  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
ACTS = {None: (-float("inf"), float("inf")), "relu": (0.0, float("inf")), "relu6": (0.0, 6.0)}


def _case(m, n, k, bits, gs, mode, dtype, device, seed=0, bias=True, act="relu6", scale_dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    qw = quantize_weight(w.to(device), bits=bits, group_size=gs, mode=mode, scale_dtype=scale_dtype)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = (torch.randn(n, generator=g) * 0.1).to(device=device, dtype=dtype) if bias else None
    return qw, x, b, act


def _check(qw, x, b, act, rel_err, config=None):
    x0 = x.clone()
    lo, hi = ACTS[act]
    y = gemm(x, qw, b, lo, hi, config)
    ref = ref_matmul(x, qw, b, act, out_dtype=torch.float64)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert torch.equal(x, x0), "input modified"
    err = rel_err(y, ref)
    assert err <= TOL[x.dtype], f"rel err {err:.3e} > {TOL[x.dtype]:.0e}"
    return y


# ---------------------------------------------------------------- layout (CPU, no Triton)

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ks", [16, 32, 64])
def test_pack_words_field_order(bits, ks):
    e = 32 // bits
    ch = e * ks
    codes = torch.randint(0, 1 << bits, (3, 2 * ch), dtype=torch.uint8)
    words = pack_words(codes, bits, ks)
    assert words.dtype == torch.int32 and words.shape == (3, 2 * ch * bits // 32)
    w64 = words.to(torch.int64) & 0xFFFFFFFF
    for c in range(2):
        for f in range(e):
            got = (w64[:, c * ks:(c + 1) * ks] >> (f * bits)) & ((1 << bits) - 1)
            assert torch.equal(got, codes[:, ch * c + f * ks: ch * c + (f + 1) * ks].to(torch.int64))


def test_layout_pads_and_transposes():
    qw = quantize_weight(torch.randn(70, 96) * 0.02, bits=4, group_size=32, mode="zero_point")
    lay = build_triton_gemm_v1(qw)
    assert (lay.np_, lay.kp, lay.group_size) == (256, 256, 32)
    assert lay.words.shape == (256, 256 // 8) and lay.ks == 16
    assert lay.scales.shape == (8, 256) and torch.equal(lay.scales[:3, :70], qw.scales.T)
    assert torch.all(lay.scales[3:] == 0) and torch.all(lay.scales[:, 70:] == 0)
    assert torch.equal(lay.zeros[:3, :70], qw.zeros.T)
    pc = build_triton_gemm_v1(quantize_weight(torch.randn(8, 100) * 0.02, bits=8, group_size=-1))
    assert pc.group_size == 0 and pc.scales.shape == (1, 256)


# ---------------------------------------------------------------- interpreter (CPU)

INTERP = pytest.mark.skipif(HAS_CUDA, reason="interpreter tests run on CPU-only machines")
SMALL = dict(BM=16, BN=32, KCH=1, SPLIT_K=1, GROUP_M=2)


@INTERP
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_interp_formats(bits, gs, mode, rel_err):
    k = 256 if gs != -1 else 136
    qw, x, b, act = _case(17, 37, k, bits, gs, mode, torch.float16, "cpu", seed=bits * 7 + gs)
    _check(qw, x, b, act, rel_err, dict(SMALL, BM=32))


@INTERP
@pytest.mark.parametrize("m", [1, 3, 16, 33])
def test_interp_small_m_and_fp32(m, rel_err):
    qw, x, b, act = _case(m, 40, 128, 4, 32, "offset", torch.float32, "cpu", seed=m)
    _check(qw, x, b, act, rel_err, SMALL)
    qw, x, b, act = _case(m, 40, 128, 8, 64, "sym", torch.float16, "cpu", seed=m, act=None)
    _check(qw, x, b, act, rel_err, SMALL)


@INTERP
@pytest.mark.parametrize("split", [2, 3])
def test_interp_split_k(split, rel_err):
    qw, x, b, act = _case(20, 33, 512, 4, 128, "zero_point", torch.float16, "cpu", seed=split, act="relu")
    _check(qw, x, b, act, rel_err, dict(SMALL, SPLIT_K=split))


@INTERP
def test_interp_bk_odd_k_bf16_scales(rel_err):
    qw, x, b, act = _case(18, 33, 258, 8, -1, "zero_point", torch.float16, "cpu", scale_dtype=torch.bfloat16)
    _check(qw, x, b, act, rel_err, dict(SMALL, KCH=2))
    qw, x, b, act = _case(18, 33, 384, 4, 64, "sym", torch.float16, "cpu", scale_dtype=torch.float32)
    _check(qw, x, b, act, rel_err, dict(SMALL, KCH=2, SPLIT_K=2))


@INTERP
@pytest.mark.parametrize("ks", [32, 64])
@pytest.mark.parametrize("fmt", [(4, 32, "zero_point"), (8, 32, "offset"), (4, 128, "sym"), (8, -1, "sym")])
def test_interp_wide_fields(ks, fmt, rel_err):
    """KS = 32 / 64 layouts, including groups narrower than a field (parameters per element)."""
    bits, gs, mode = fmt
    k = 1024 if gs != -1 else 520
    qw, x, b, act = _case(9, 33, k, bits, gs, mode, torch.float16, "cpu", seed=ks)
    _check(qw, x, b, act, rel_err, dict(SMALL, KS=ks))
    qw, x, b, act = _case(9, 33, k, bits, gs, mode, torch.float32, "cpu", seed=ks + 1)
    _check(qw, x, b, act, rel_err, dict(SMALL, KS=ks, SPLIT_K=2))


@INTERP
def test_interp_default_config_small(rel_err):
    qw, x, b, act = _case(5, 40, 256, 4, 128, "sym", torch.float16, "cpu", bias=False)
    _check(qw, x, b, act, rel_err, None)
    qw, x, b, act = _case(20, 40, 2048, 8, -1, "sym", torch.float16, "cpu", bias=False)
    star = cfgmod.load_table("h200")["gemm"]["w8pc"][-1]  # the '*' entry (layers without a measured bucket)
    _check(qw, x, b, act, rel_err, star.value["16"])  # SPLIT_K "auto"


def test_gemm_rejects_bad_input():
    qw = quantize_weight(torch.randn(16, 128) * 0.02, bits=4, group_size=32)
    with pytest.raises(ValueError, match="K=128"):
        gemm(torch.randn(2, 64, dtype=torch.float16), qw, None, -float("inf"), float("inf"))
    with pytest.raises(TypeError, match="dtype"):
        gemm(torch.randn(2, 128, dtype=torch.float64), qw, None, -float("inf"), float("inf"))


# ---------------------------------------------------------------- dispatch tables

@pytest.mark.parametrize("name", ["default", "h100", "h200"])
def test_tables_are_valid(name):
    """The tables load (their bucket regions checked: mixgemm.tuning.buckets), every entry has a source, every config
    is a tile the kernel accepts."""
    table = cfgmod.load_table(name)
    assert set(table["gemv_max_m"]) <= {"4", "8"}
    for wkey, entries in table.get("wgmma_from_m", {}).items():  # weight format keys, bucket entries
        assert wkey.startswith(("w4", "w8")) and (wkey[2:] == "pc" or int(wkey[3:]) in (32, 64, 128, 256))
        assert all(1 <= e.value <= 16 and e.source for e in entries)
    for wkey, entries in table["gemm"].items():
        assert wkey in ("w4g", "w4pc", "w8g", "w8pc")
        # one KS per weight format: a weight is repacked once, whatever M it later meets
        assert len({cfg["KS"] for e in entries for cfg in e.value.values()}) == 1
        for e in entries:
            assert e.source
            for bkey, cfg in e.value.items():
                assert int(bkey) in cfgmod.BUCKETS
                assert {"KS", "BM", "BN", "KCH", "num_warps", "num_stages"} <= set(cfg)
                assert 256 % cfg["BN"] == 0 and cfg["BM"] % 16 == 0


def test_config_lookup_is_deterministic():
    """The registry's Triton GEMM entry on a device without a table (the CPU interpreter): the kernel's rule."""
    from dataclasses import replace

    from mixgemm.kernels.linear_common import linear_problem
    from mixgemm.kernels.registry import entry

    qw = quantize_weight(torch.randn(64, 256) * 0.02, bits=4, group_size=128)
    triton = entry("triton_gemm")
    for m in (1, 17, 64, 129, 1000, 4096, 100000):
        p = replace(linear_problem(m, qw, torch.float16, torch.device("cpu")), n=28672, k=8192)
        a = triton.config(p)
        assert a == triton.config(p)
        assert a == default_config(m, 28672, 8192, 4, False)


def test_h200_table_lookup():
    qw4 = quantize_weight(torch.randn(64, 256) * 0.02, bits=4, group_size=128)
    qw8 = quantize_weight(torch.randn(64, 256) * 0.02, bits=8, group_size=-1)
    table = cfgmod.load_table("h200")
    assert table["gemv_max_m"] == {"4": 8, "8": 1} and table["gemv_all_m_below_n"] == 8192
    t = table
    assert cfgmod.gemv_max_m(t, qw4, 28672) == 8 and cfgmod.gemv_max_m(t, qw8, 14336) == 1
    assert cfgmod.gemv_max_m(t, qw4, 4096) == 16 and cfgmod.gemv_max_m(t, qw8, 4096) == 16
    assert cfgmod.gemv_max_m(t, qw4, 28672, wgmma=False) == 16 and cfgmod.gemv_max_m(t, qw8, 28672, False) == 8
    up_small, up_large, star = table["gemm"]["w4g"]  # measured on 4096 x 14336, 8192 x 28672, and the '*' tiles
    assert up_small.measured == (4096, 14336) and up_large.measured == (8192, 28672) and star.measured is None
    # the M bucket of M = 33 is 64; 5000's (8192) is not listed: the nearest, 4096
    assert cfgmod.table_entry(t, "gemm", 33, 28672, 8192, qw4) == up_large.value["64"]
    assert cfgmod.table_entry(t, "gemm", 5000, 14336, 4096, qw4) == up_small.value["4096"]
    # neighbours in the region: Llama-2-13B's up-projection (5120 x 13824) takes the 4096 x 14336 entry, Qwen2.5-72B's
    # (8192 x 29568) the 8192 x 28672 one; small layers and down-projections the '*' tiles
    assert cfgmod.table_entry(t, "gemm", 64, 13824, 5120, qw4) == up_small.value["64"]
    assert cfgmod.table_entry(t, "gemm", 64, 29568, 8192, qw4) == up_large.value["64"]
    assert cfgmod.table_entry(t, "gemm", 64, 100, 100, qw4) == star.value["64"]
    assert cfgmod.table_entry(t, "gemm", 64, 4096, 14336, qw4) == star.value["64"]
    assert cfgmod.weight_key(qw4) == "w4g" and cfgmod.weight_key(qw8) == "w8pc"


def test_h100_wgmma_from_m():
    """wgmma_from_m: the bucket of a measured layer in one weight format (group size included) goes to the wgmma GEMM
    from that M; other group sizes and buckets, and the Triton-GEMM route, keep the per-bit-width crossover."""
    table = cfgmod.load_table("h100")
    entry, tall = table["wgmma_from_m"]["w4g128"]
    assert entry.value == 1 and entry.measured == (8192, 28672) and set(table["wgmma_from_m"]) == {"w4g128", "w8pc"}
    assert tall.value == 9 and tall.measured == (27648, 5120)
    g128 = quantize_weight(torch.randn(64, 256) * 0.02, bits=4, group_size=128)
    g64 = quantize_weight(torch.randn(64, 256) * 0.02, bits=4, group_size=64)
    t = table
    assert cfgmod.exact_weight_key(g128) == "w4g128" and cfgmod.exact_weight_key(g64) == "w4g64"
    assert cfgmod.gemv_max_m(t, g128, 28672, k=8192) == 0
    assert cfgmod.gemv_max_m(t, g128, 29568, k=8192) == 0  # Qwen2.5-72B's up-projection: the same bucket
    assert cfgmod.gemv_max_m(t, g128, 28672) == 8 and cfgmod.gemv_max_m(t, g128, 28672, k=4096) == 8
    assert cfgmod.gemv_max_m(t, g64, 28672, k=8192) == 8
    assert cfgmod.gemv_max_m(t, g128, 28672, wgmma=False, k=8192) == 16
    # tall layers (K >= ~13.8k with N >= ~4.9k, or K >= ~27.5k with N >= ~3.4k): the GEMV up to M = 8
    assert cfgmod.gemv_max_m(t, g128, 5120, k=13824) == 8 and cfgmod.gemv_max_m(t, g128, 4608, k=36864) == 8
    assert cfgmod.gemv_max_m(t, g128, 4096, k=14336) == 16 and cfgmod.gemv_max_m(t, g64, 5120, k=13824) == 16
    w8 = quantize_weight(torch.randn(64, 256) * 0.02, bits=8, group_size=-1)
    assert cfgmod.gemv_max_m(t, w8, 5120, k=27648) == 8 and cfgmod.gemv_max_m(t, w8, 8192, k=28672) == 1
    for m in (1, 2, 4, 8, 16):  # the entries those M meet
        assert cfgmod.table_entry(t, "wgmma", m, 28672, 8192, g128)["FOLD"] == 1


def test_pick_kernel_gemv_range():
    from mixgemm.ops.dispatch import pick_kernel

    qw = quantize_weight(torch.randn(64, 256) * 0.02, bits=4, group_size=128)
    assert pick_kernel(17, 64, 256, qw, torch.device("cpu")) == "gemm"
    assert pick_kernel(4096, 64, 256, qw, torch.device("cpu")) == "gemm"
    assert pick_kernel(1, 64, 256, qw, torch.device("cpu")) in ("gemv", "gemm")


# ---------------------------------------------------------------- GPU

GPU_MS = [17, 33, 64, 129, 1000, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_gpu_formats(bits, gs, mode, rel_err):
    """Every format, fp16 and bf16, odd N; M cycles through the list (table configs of each bucket)."""
    i = (bits // 4) * 15 + [32, 64, 128, 256, -1].index(gs) * 3 + ["sym", "zero_point", "offset"].index(mode)
    m = GPU_MS[i % len(GPU_MS)]
    k = 1024 if gs != -1 else (1000 if bits == 4 else 999)
    for dtype in (torch.float16, torch.bfloat16):
        qw, x, b, act = _case(m, 1001, k, bits, gs, mode, dtype, "cuda", seed=i)
        _check(qw, x, b, act, rel_err)


@pytest.mark.gpu
@pytest.mark.parametrize("m", GPU_MS + [1, 3, 16])
@pytest.mark.parametrize("fmt", [(4, 128, "sym"), (8, -1, "sym"), (4, 32, "zero_point")])
def test_gpu_m_sweep(m, fmt, rel_err):
    bits, gs, mode = fmt
    for dtype in (torch.float16, torch.bfloat16):
        qw, x, b, act = _case(m, 4099 if m < 4096 else 1027, 2048, bits, gs, mode, dtype, "cuda", seed=m)
        _check(qw, x, b, act, rel_err)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [(4, 64, "offset"), (8, -1, "zero_point")])
def test_gpu_fp32_and_public_matmul(fmt, rel_err):
    from mixgemm.ops.matmul import matmul

    bits, gs, mode = fmt
    qw, x, b, act = _case(129, 515, 1024, bits, gs, mode, torch.float32, "cuda")
    _check(qw, x, b, act, rel_err)
    for m in (1, 8, 17, 300):
        qw, x, b, act = _case(m, 515, 1024, bits, gs, mode, torch.float16, "cuda", seed=m)
        y = matmul(x.reshape(1, m, 1024), qw, b, act)
        ref = ref_matmul(x, qw, b, act, out_dtype=torch.float64)
        assert rel_err(y.reshape(m, -1), ref) <= TOL[torch.float16]


@pytest.mark.gpu
def test_gpu_split_k_and_strided_x(rel_err):
    qw, x, b, act = _case(40, 1536, 4096, 4, 128, "zero_point", torch.float16, "cuda")
    for split in (1, 2, 5):
        _check(qw, x, b, act, rel_err, dict(BM=64, BN=128, KCH=1, SPLIT_K=split, GROUP_M=1,
                                            num_warps=4, num_stages=4))
    for ks in (32, 64):  # wider chunk layouts; with g32 and KS=64 the group parameters load per element
        qw2, x2, b2, act2 = _case(33, 1001, 2048, 4, 32, "zero_point", torch.bfloat16, "cuda", seed=ks)
        # small tiles, 2 stages: a KS=64 chunk is 512 k wide, and BM=32 / BN=128 / 3 stages needed 557 KB of
        # shared memory on the H200 (limit 227 KB); these layouts are not in the shipped tables
        _check(qw2, x2, b2, act2, rel_err, dict(KS=ks, BM=16, BN=64, KCH=1, SPLIT_K=1, GROUP_M=1,
                                                num_warps=4, num_stages=2))
    xs = torch.randn(40, 8192, device="cuda", dtype=torch.float16)[:, ::2]
    assert xs.stride(1) == 2
    xs = torch.randn(40, 4096 + 64, device="cuda", dtype=torch.float16)[:, 64:]  # row stride != K
    _check(qw, xs, b, act, rel_err)


def test_quantconfig_sanity():
    assert QuantConfig(bits=8, group_size=-1).group_size == -1


@INTERP
@pytest.mark.parametrize("m", [1, 3, 17, 129])
def test_interp_groups_of_16(m, rel_err):
    """8-bit groups of 16 (GGUF Q6_K / Q3_K / Q2_K held exactly): K a multiple of 16 but not of 32, odd N, sym and
    offset, fp16 / fp32 (the interpreter has no bf16: the gpu test takes it), fp32 scales; KS 16 (a group per field)
    and 32 / 64 (groups narrower than a field: parameters per element)."""
    cases = [("sym", torch.float16, 16), ("offset", torch.float32, 16), ("offset", torch.float16, 32),
             ("sym", torch.float32, 64)]
    for i, (mode, dtype, ks) in enumerate(cases):
        qw, x, b, act = _case(m, 37, 80, 8, 16, mode, dtype, "cpu", seed=m + i, scale_dtype=torch.float32)
        _check(qw, x, b, act, rel_err, dict(SMALL, KS=ks, BM=16 if m < 17 else 64))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 17, 129, 1000])
@pytest.mark.parametrize("mode", ["sym", "offset"])
def test_gpu_groups_of_16(m, mode, rel_err):
    """8-bit groups of 16 on the GPU: the CUDA kernels decline them, the dispatcher (mixgemm.matmul) runs the Triton
    GEMM; fp16 / bf16 / fp32, odd N, K a multiple of 16 but not of 32; the table's config and KS 32 / 64."""
    import mixgemm
    from mixgemm.ops.matmul import matmul

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        qw, x, b, act = _case(m, 1001, 1040, 8, 16, mode, dtype, "cuda", seed=m, scale_dtype=torch.float32)
        _check(qw, x, b, act, rel_err)
        assert mixgemm.explain(x, qw).kernel == "triton_gemm"
        y = matmul(x, qw, b, act)
        assert rel_err(y, ref_matmul(x, qw, b, act, out_dtype=torch.float64)) <= TOL[dtype]
    for ks in (32, 64):
        qw, x, b, act = _case(m, 1001, 1040, 8, 16, mode, torch.bfloat16, "cuda", seed=ks)
        _check(qw, x, b, act, rel_err, dict(KS=ks, BM=16, BN=64, KCH=1, SPLIT_K=1, GROUP_M=1, num_warps=4,
                                            num_stages=2))
