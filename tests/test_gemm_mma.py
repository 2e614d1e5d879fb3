"""Tensor-core small-M GEMM (mixgemm.kernels.cuda.gemm_mma): CPU checks (NVRTC compiles of the shipped
instantiations, config choice) and GPU checks of every format combination against the float64 reference."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import mixgemm.reference as ref
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda import gemm_mma as gm
from mixgemm.kernels.cuda import nvrtc

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192), (4100, 1000)]  # N, K

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")


# ----------------------------------------------------------------------------------------------- CPU

def _shipped_keys(arch: str) -> set:
    keys = set()
    # every (bits, act, scl, mode) at the M = 64 tile; fp16 scales also at every M bucket (sm_90)
    for i, (bits, act, scl, mode) in enumerate(itertools.product((4, 8), (0, 1), (0, 1, 2), (0, 1, 2))):
        if arch == "sm_80" and scl != 0:
            continue
        ms = (17, 32, 64, 128) if (scl == 0 and arch == "sm_90") else (64,)
        for m in ms:
            n, k = SHAPES[(i + m) % len(SHAPES)]
            cfg = gm.choose_config(m, n, k, 132, bits, gm.SMEM_LIMIT[int(arch[3])])
            keys.add(tuple(sorted(gm.defines_for(bits, act, scl, mode, cfg).items())))
    # every tile structure the config rule can pick, on one format, with and without GM_PRE
    for (n, k), m, bits, pre in itertools.product(SHAPES, (17, 64, 128), (4, 8), (0, 1)):
        cfg = gm.choose_config(m, n, k, 132, bits, gm.SMEM_LIMIT[int(arch[3])])
        keys.add(tuple(sorted(gm.defines_for(bits, (m + pre) % 2, 0, 1, {**cfg, "PRE": pre}).items())))
    return keys


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_gemm_mma_instantiations(arch):
    for key in sorted(_shipped_keys(arch)):
        cubin = nvrtc.compile_cubin("gemm_mma.cu", key, arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", key
    # the mma.sync rate micro-benchmark of scripts/bench_gemm_mma.py --mma-peak
    for act in (0, 1):
        cubin = nvrtc.compile_cubin("gemm_mma.cu", (("GM_ACT", act), ("GM_PEAK", 8)), arch)
        assert b"mixgemm_mma_peak" in cubin


def test_m_block():
    assert [gm.m_block(m) for m in (1, 16, 17, 32, 33, 64, 65, 128, 129, 4096)] == [2, 2, 4, 4, 8, 8, 16, 16, 16, 16]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sms", [132, 108, 78])
def test_choose_config_valid_and_deterministic(bits, sms):
    limit = gm.SMEM_LIMIT[9 if sms == 132 else 8]
    extra = [(16, 64), (17, 32 * 7), (100000, 128)]
    for (n, k), m in itertools.product(SHAPES + extra, (1, 17, 32, 33, 64, 100, 128, 129)):
        cfg = gm.choose_config(m, n, k, sms, bits, limit)
        assert cfg == gm.choose_config(m, n, k, sms, bits, limit)
        assert cfg["MB"] == gm.m_block(m)
        assert cfg["R"] * cfg["MB"] <= 16 and 1 <= cfg["W"] <= 8 and cfg["S"] >= 1
        assert 2 <= cfg["ST"] <= 4
        assert gm.smem_bytes(bits, cfg) <= limit, (n, k, m, cfg)
        kt = -(-k // gm.k_tile(bits))
        assert cfg["S"] == 1 or -(-kt // cfg["S"]) >= 4 * cfg["SK"]


def test_choose_config_fills_the_gpu_on_llm_shapes():
    """The protocol shapes at M = 32 / 64 launch at least ~0.9 x SMs blocks and never more than 16 splits."""
    for (n, k), m in itertools.product(SHAPES[:5], (32, 64)):
        cfg = gm.choose_config(m, n, k, 132, 4)
        nt = -(-n // 16)
        blocks = -(-nt // (cfg["W"] * cfg["R"])) * -(-m // (8 * cfg["MB"])) * cfg["S"]
        assert blocks >= 118, (n, k, m, cfg, blocks)


def test_activation_pitch_is_bank_conflict_free():
    """The shared activation row pitch puts row g + 1 at the bank offset the kernel's comment derives."""
    for bits, sk in itertools.product((4, 8), (1, 2, 3, 4)):
        cfg = {"MB": 1, "W": 1, "R": 1, "SK": sk, "ST": 1}
        kt = gm.k_tile(bits)
        stage = gm.smem_bytes(bits, cfg) - 512 * sk
        xrow = stage // 8
        assert xrow >= sk * kt * 2 and xrow % 16 == 0
        assert xrow % 128 == (16 if bits == 4 else 64)
        # emulate one ld.shared.v4 phase (8 lanes: rows g, g + 1 x t = 0..3): 32 distinct banks
        for sp in ((0, 1) if bits == 4 else (0,)):
            banks = set()
            for g in (0, 1):
                for t in range(4):
                    off = g * xrow + (32 * t + 16 * sp if bits == 4 else 16 * t)
                    banks |= {(off // 4 + i) % 32 for i in range(4)}
            assert len(banks) == 32


def test_gemm_mma_rejects_bad_input():
    qw = quantize_weight(torch.randn(32, 64) * 0.02, bits=4, group_size=32, mode="sym")
    with pytest.raises(ValueError, match="CUDA"):
        gm.gemm_mma(torch.randn(20, 64), qw, None, -math.inf, math.inf)
    assert gm.gemm_mma_supported(64, torch.float16, qw)
    assert not gm.gemm_mma_supported(64, torch.float32, qw)
    assert not gm.gemm_mma_supported(0, torch.float16, qw)


# ----------------------------------------------------------------------------------------------- GPU

def _case(n, k, bits, group, mode, scale_dtype, act_dtype, m, seed, bias_dtype=None, act=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype)
    x = torch.randn(m, k, device="cuda", generator=g).to(act_dtype)
    bias = None if bias_dtype is None else (torch.randn(n, device="cuda", generator=g) * 0.1).to(bias_dtype)
    lo, hi = clamp_bounds(act)
    return qw, x, bias, lo, hi


def _check(qw, x, bias, lo, hi, act, rel_err):
    x0 = x.clone()
    y = gm.gemm_mma(x, qw, bias, lo, hi)
    torch.cuda.synchronize()
    assert torch.equal(x, x0)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], qw.out_features)
    r = ref.matmul(x, qw, bias, activation=act, out_dtype=torch.float64)
    err = rel_err(y, r)
    assert err <= TOL[x.dtype], err
    return y


_K_FOR_GROUP = {32: 32 * 37, 64: 64 * 19, 128: 128 * 11, 256: 256 * 5, -1: 1000}


@pytest.mark.gpu
@pytest.mark.parametrize("pre", [0, 1])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("act_dtype", [torch.float16, torch.bfloat16])
def test_gemm_mma_formats(bits, group, mode, act_dtype, pre, rel_err, monkeypatch):
    """Every group / mode / activation dtype, odd N and K (not a multiple of the 128-k stage), M = 17..129,
    with the generic and the precomputed (GM_PRE) copy addressing."""
    monkeypatch.setattr(gm, "DEFAULT_PRE", pre)
    k = _K_FOR_GROUP[group]
    for i, m in enumerate((17, 33, 64, 129)):
        scl = (torch.float16, torch.bfloat16, torch.float32)[(i + bits) % 3]
        qw, x, bias, lo, hi = _case(4100 + 3 * i, k, bits, group, mode, scl, act_dtype, m, seed=100 * i + bits,
                                    bias_dtype=(None, torch.float16, torch.float32, torch.bfloat16)[i],
                                    act=(None, "relu6", None, "relu")[i])
        _check(qw, x, bias, lo, hi, (None, "relu6", None, "relu")[i], rel_err)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    {"W": 4, "R": 1, "S": 3}, {"W": 7, "R": 2, "S": 2, "ST": 3}, {"W": 8, "R": 4, "S": 5}, {"W": 5, "R": 1, "S": 16},
    {"W": 8, "R": 2, "S": 1, "ST": 2},
])
@pytest.mark.parametrize("m", [20, 64, 128])
@pytest.mark.parametrize("pre", [0, 1])
def test_gemm_mma_tile_configs_and_split_k(cfg, m, pre, rel_err):
    """Forced tile structures / split-K factors (incl. splits with a partial last stage), twice in a row
    (the split-K tickets must reset themselves)."""
    if cfg["R"] * gm.m_block(m) > 16:
        pytest.skip("accumulators would not fit in registers: choose_config never picks this")
    gm.CFG_OVERRIDE = {**cfg, "PRE": pre}
    try:
        for bits, act_dtype in ((4, torch.float16), (8, torch.bfloat16)):
            qw, x, bias, lo, hi = _case(3000 + 8, 64 * 45, bits, 64, "zero_point", torch.float16, act_dtype, m,
                                        seed=7, bias_dtype=torch.float16, act="relu6")
            y1 = _check(qw, x, bias, lo, hi, "relu6", rel_err)
            y2 = gm.gemm_mma(x, qw, bias, lo, hi)
            assert torch.equal(y1, y2)  # deterministic, tickets reset
    finally:
        gm.CFG_OVERRIDE = None


@pytest.mark.gpu
def test_gemm_mma_strided_input_and_graph(rel_err):
    qw, x, bias, lo, hi = _case(4096, 4096, 4, 128, "zero_point", torch.float16, torch.float16, 48, seed=3)
    xs = torch.randn(48, 4096 * 2, device="cuda", dtype=torch.float16)[:, ::2]  # non-unit stride along K
    _check(qw, xs, None, -math.inf, math.inf, None, rel_err)
    y = gm.gemm_mma(x, qw, bias, lo, hi)  # compile + tickets first
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gm.gemm_mma(x, qw, bias, lo, hi)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = gm.gemm_mma(x, qw, bias, lo, hi)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)


def test_tuned_table_applies_on_132_sms_only():
    for (bits, mb, n, k), entry in gm.TUNED.items():
        m = 8 * mb
        cfg = gm.choose_config(m, n, k, 132, bits)
        assert {key: cfg[key] for key in entry} == entry
        assert gm.smem_bytes(bits, cfg) <= 226 * 1024
        other = gm.choose_config(m, n, k, 108, bits, gm.SMEM_LIMIT[8])
        assert gm.smem_bytes(bits, other) <= gm.SMEM_LIMIT[8]


def _copies_v1(bits, mb, w, r, sk, n, kt, m, mtile, rblk, kbeg, kend, ldx4, i):
    """gemm_mma.cu copy_stage (generic loops, GM_PRE=0): {(smem uint4 offset in the stage): (tensor, offset) or
    None for a zero-filled chunk} -- written in Python from the kernel source."""
    ktile = gm.k_tile(bits)
    mt, tr_, xkt = 8 * mb, w * r, ktile * 2 // 16
    xraw = sk * ktile * 2
    xrow4 = (xraw + ((16 if bits == 4 else 64) - xraw % 128 + 128) % 128) // 16
    wst4, nt_all, threads = tr_ * sk * 32, -(-n // 16), 32 * w
    kt0 = kbeg + i * sk
    out = {}
    for tid in range(threads):
        for c in range(tid, wst4, threads):
            tr, j, l = c // (sk * 32), (c // 32) % sk, c % 32
            nt = min(rblk * tr_ + tr, nt_all - 1)
            ok = kt0 + j < kend
            out[c] = ("w", (nt * kt + (kt0 + j)) * 32 + l) if ok else None
        for c in range(tid, mt * sk * xkt, threads):
            mm, q = c // (sk * xkt), c % (sk * xkt)
            ok = kt0 + q // xkt < kend
            out[wst4 + mm * xrow4 + q] = ("x", min(mtile * mt + mm, m - 1) * ldx4 + (kt0 + q // xkt) * xkt + q % xkt) \
                if ok else None
    return out


def _copies_v2(bits, mb, w, r, sk, n, kt, m, mtile, rblk, kbeg, kend, ldx4, i):
    """The GM_PRE=1 branch: offsets precomputed once per thread, advanced by the stage's k-tile."""
    ktile = gm.k_tile(bits)
    mt, tr_, xkt = 8 * mb, w * r, ktile * 2 // 16
    xraw = sk * ktile * 2
    xrow4 = (xraw + ((16 if bits == 4 else 64) - xraw % 128 + 128) % 128) // 16
    wst4, nt_all, threads = tr_ * sk * 32, -(-n // 16), 32 * w
    xc = mt * sk * xkt
    wu, xu = -(-wst4 // threads), -(-xc // threads)
    klen = kend - kbeg
    out = {}
    for tid in range(threads):
        for u in range(wu):
            c = tid + u * threads
            tr, l = c // (sk * 32), c % 32
            nt = min(rblk * tr_ + tr, nt_all - 1)
            wj, woff = (c // 32) % sk, (nt * kt + kbeg) * 32 + l
            kk = i * sk + wj
            out[c] = ("w", woff + kk * 32) if kk < klen else None
        for u in range(xu):
            c = min(tid + u * threads, xc - 1)
            mm, q = c // (sk * xkt), c % (sk * xkt)
            if tid + u * threads >= xc:
                continue
            xoff = min(mtile * mt + mm, m - 1) * ldx4 + kbeg * xkt + q % xkt
            kk = i * sk + q // xkt
            out[wst4 + mm * xrow4 + q] = ("x", xoff + kk * xkt) if kk < klen else None
    return out


@pytest.mark.parametrize("case", [
    (4, 4, 8, 1, 2, 4100, 23, 33, 1, 3, 8, 16, 600),
    (4, 8, 7, 2, 2, 1000, 45, 64, 0, 2, 40, 45, 400),
    (8, 16, 7, 1, 4, 300, 37, 129, 1, 1, 0, 37, 160),
    (8, 4, 8, 2, 8, 5000, 90, 20, 0, 19, 80, 90, 800),
])
def test_precomputed_copy_offsets_match_the_generic_loops(case):
    """GM_PRE=1 copies exactly the chunks of GM_PRE=0 (same smem slot -> same global uint4 or zero-fill), for
    every stage of a split, including partial last stages and clamped rows / tiles."""
    bits, mb, w, r, sk, n, kt, m, mtile, rblk, kbeg, kend, ldx4 = case
    for i in range(-(-(kend - kbeg) // sk)):
        v1 = _copies_v1(bits, mb, w, r, sk, n, kt, m, mtile, rblk, kbeg, kend, ldx4, i)
        v2 = _copies_v2(bits, mb, w, r, sk, n, kt, m, mtile, rblk, kbeg, kend, ldx4, i)
        assert v1 == v2, i
        # every copied chunk lies inside its tensor
        for v in v1.values():
            if v is not None:
                assert 0 <= v[1] < ((-(-n // 16)) * kt * 32 if v[0] == "w" else m * ldx4)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n", [1, 17, 300])
def test_gemm_mma_tiny_shapes(bits, n, rel_err):
    """One k-tile (K = 64 / 32), N smaller than one 16-row tile, M = 1 and 20: clamped rows / tiles everywhere."""
    k = 64 if bits == 4 else 32
    for m in (1, 20):
        qw, x, bias, lo, hi = _case(n, k, bits, 32, "zero_point", torch.float16, torch.float16, m, seed=n + m,
                                    bias_dtype=torch.float32)
        _check(qw, x, bias, lo, hi, None, rel_err)
