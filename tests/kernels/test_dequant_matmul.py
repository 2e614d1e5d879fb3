"""The dequantize + cuBLAS linear entry (mixgemm.kernels.dequant_matmul) and the race that picks it
(mixgemm.kernels.race, mixgemm.tuning.races): the wgmma_v1 expansion exact against the reference, the entry's output
against float64, and the registry's decisions on described GPUs."""

import pytest
import torch
from tests.described_gpus import A100, H200

import mixgemm
from mixgemm.formats.weight import QuantConfig, dequantize_weight, quantize_weight
from mixgemm.kernels import dequant_matmul, race
from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1
from mixgemm.kernels.linear_common import linear_problem
from mixgemm.tuning import races


@pytest.fixture(autouse=True)
def fresh_races():
    races.forget()
    yield
    races.forget()


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _qw(n, k, bits, gs, mode, seed=0):
    g = torch.Generator().manual_seed(seed)
    return quantize_weight(torch.randn(n, k, generator=g), QuantConfig(bits=bits, group_size=gs, mode=mode))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("gs", [32, 64, 128, -1])
def test_wgmma_v1_expansion_is_exact(interpret, bits, mode, gs):
    from mixgemm.kernels.dequant_matmul.wgmma_v1_dequant import dequantize_wgmma_v1

    n, k = (200, 384) if gs != 64 else (129, 192)
    qw = _qw(n, k, bits, gs, mode, seed=bits * 10 + len(mode))
    lay = build_wgmma_v1(qw)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        out = dequantize_wgmma_v1(lay, torch.empty(n, k, dtype=dtype))
        assert torch.equal(out, dequantize_weight(qw, torch.float64).to(dtype)), (dtype, bits, mode, gs)
    # a row block from row 128: the same rows
    part = dequantize_wgmma_v1(lay, torch.empty(n - 128, k, dtype=torch.float32), 128)
    assert torch.equal(part, dequantize_weight(qw, torch.float32)[128:])


def test_wgmma_v1_expansion_errors(interpret):
    from mixgemm.kernels.dequant_matmul.wgmma_v1_dequant import dequantize_wgmma_v1

    lay = build_wgmma_v1(_qw(256, 128, 4, 32, "sym"))
    with pytest.raises(ValueError, match="128-row blocks"):
        dequantize_wgmma_v1(lay, torch.empty(64, 128), 64)
    with pytest.raises(ValueError, match="does not fit"):
        dequantize_wgmma_v1(lay, torch.empty(256, 96))
    with pytest.raises(TypeError, match="out dtype torch.int32"):
        dequantize_wgmma_v1(lay, torch.empty(256, 128, dtype=torch.int32))


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("row_block_bytes", [None, 128 * 160 * 4])
def test_run_matches_float64(interpret, monkeypatch, m, row_block_bytes):
    if row_block_bytes is not None:  # row blocks of 128: the 300-row layer in three pieces
        monkeypatch.setattr(dequant_matmul, "ROW_BLOCK_BYTES", row_block_bytes)
    qw = _qw(300, 160, 4, 32, "zero_point", seed=m)
    g = torch.Generator().manual_seed(m + 1)
    x = torch.randn(m, 160, generator=g)
    bias = torch.randn(300, generator=g)
    x0, b0 = x.clone(), bias.clone()
    y = dequant_matmul.run(x, qw, bias, -1.0, 2.0, None)
    ref = (x.double() @ dequantize_weight(qw, torch.float64).t() + bias.double()).clamp(-1.0, 2.0)
    assert y.shape == (m, 300) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(x, x0) and torch.equal(bias, b0)


def test_row_block():
    assert dequant_matmul.row_block(4096, 4096, 2) == 4096
    rows = dequant_matmul.row_block(128256, 8192, 2)
    assert rows % 128 == 0 and rows * 8192 * 2 <= dequant_matmul.ROW_BLOCK_BYTES and rows < 128256
    assert dequant_matmul.row_block(512, 10**9, 2) == 128  # never under one row block


def test_race_margin():
    times = {"a": 100.0, "b": 98.0}
    timer = lambda fn, dev: times[fn()]  # noqa: E731
    res = race.race(("a", lambda: "a"), ("b", lambda: "b"), 4096, torch.device("cpu"), timer=timer)
    assert res.winner == "a"  # within the 3% margin the incumbent stays
    times["b"] = 90.0
    res = race.race(("a", lambda: "a"), ("b", lambda: "b"), 4096, torch.device("cpu"), timer=timer)
    assert res.winner == "b" and res.m == 4096 and "b 90.0 us, a 100.0 us" in res.note()


def _explain(m, qw, device=H200, dtype=torch.float16):
    return mixgemm.explain(torch.empty(m, qw.in_features, dtype=dtype), qw, device=device)


def test_registry_takes_the_race_winner():
    qw = _qw(4096, 4096, 4, 128, "sym")
    c = _explain(4096, qw)
    why = dict(c.declined)["dequant_cublas"]
    assert c.kernel != "dequant_cublas" and "not measured yet" in why  # no GPU here: nothing raced
    key = dequant_matmul.race_key(linear_problem(4096, qw, torch.float16, H200))
    races.record(key, races.RaceResult({"cuda_wgmma": 500.0, "dequant_cublas": 400.0}, "dequant_cublas", 4096))
    c = _explain(4096, qw)
    assert c.kernel == "dequant_cublas" and "dequant_cublas 400.0 us, cuda_wgmma 500.0 us" in c.config_source
    assert _explain(3000, qw).kernel == "dequant_cublas"  # the same M bucket
    assert _explain(8192, qw).kernel != "dequant_cublas"  # another bucket: not raced yet
    races.record(key, races.RaceResult({"cuda_wgmma": 400.0, "dequant_cublas": 500.0}, "cuda_wgmma", 4096))
    c = _explain(4096, qw)
    assert c.kernel == "cuda_wgmma" and "slower than cuda_wgmma" in dict(c.declined)["dequant_cublas"]


def test_registry_hard_declines():
    qw = _qw(1024, 1024, 4, 128, "sym")
    assert "below DEQUANT_MIN_M" in dict(_explain(256, qw).declined)["dequant_cublas"]
    assert "sm_90" in dict(_explain(4096, qw, device=A100).declined)["dequant_cublas"]
    assert "activation dtype torch.float32" in dict(_explain(4096, qw, dtype=torch.float32).declined)["dequant_cublas"]
    narrow = _qw(256, 256, 8, 16, "sym")
    assert "cannot hold groups of 16" in dict(_explain(4096, narrow).declined)["dequant_cublas"]


# ------------------------------------------------------------------------------------------------ GPU
_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits,gs,mode", [(4, 128, "sym"), (4, 32, "zero_point"), (8, -1, "sym"), (4, 64, "offset")])
def test_gpu_race_and_both_routes_match_the_reference(dtype, bits, gs, mode, monkeypatch):
    n, k, m = 1000, 1536, 600  # N, K not multiples of the tiles
    qw = _qw(n, k, bits, gs, mode, seed=bits + gs).to("cuda")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=g).to("cuda", dtype)
    bias = torch.randn(n, generator=g).to("cuda", dtype)
    ref = x.double() @ dequantize_weight(qw, torch.float64).t() + bias.double()
    tol = 1e-3 if dtype == torch.float16 else 1e-2
    y = mixgemm.matmul(x, qw, bias)  # the first call races
    res = races.result(dequant_matmul.race_key(linear_problem(m, qw, dtype, x.device)))
    assert res is not None and "dequant_cublas" in res.times_us and len(res.times_us) == 2
    assert (mixgemm.explain(x, qw).kernel == "dequant_cublas") == (res.winner == "dequant_cublas")
    assert ((y.double() - ref).norm() / ref.norm()).item() < tol
    with mixgemm.kernel_options(force="dequant_cublas"):
        y2 = mixgemm.matmul(x, qw, bias, activation="relu")
    assert ((y2.double() - ref.clamp_min(0)).norm() / ref.norm()).item() < tol
    monkeypatch.setattr(dequant_matmul, "ROW_BLOCK_BYTES", 256 * k * 2)  # four row blocks
    y3 = dequant_matmul.run(x, qw, bias, float("-inf"), float("inf"), None)
    assert ((y3.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.gpu
@needs_sm90
def test_gpu_conv_race_picks_and_matches():
    from mixgemm.formats.conv import quantize_conv_weight
    from mixgemm.reference.conv import conv2d as ref_conv2d

    g = torch.Generator().manual_seed(3)
    w = torch.randn(136, 200, 3, 3, generator=g)  # odd channel counts: the slow layer
    qw = quantize_conv_weight(w, QuantConfig(bits=4, group_size=-1, mode="zero_point")).to("cuda")
    x = torch.randn(4, 200, 30, 30, generator=g).half().to("cuda").contiguous(memory_format=torch.channels_last)
    y = mixgemm.conv2d(x, qw, None, 1, 1)
    ref = ref_conv2d(x.double().cpu(), qw.to("cpu"), None, (1, 1), (1, 1), (1, 1), 1, None)
    assert ((y.double().cpu() - ref).norm() / ref.norm()).item() < 1e-3
    c = mixgemm.explain_conv(x, qw, 1, 1)
    why = c.config_source if c.kernel == "dequant_cudnn" else dict(c.declined)["dequant_cudnn"]
    assert "measured at M=3600" in why


@pytest.mark.gpu
@needs_sm90
def test_gpu_forced_float_routes_before_any_race():
    """Forcing a float route on a layer that has not raced runs its race against the rival without re-entering
    itself, then the forced route."""
    from mixgemm.formats.conv import quantize_conv_weight

    qw = _qw(512, 1024, 4, 128, "sym").to("cuda")
    x = torch.randn(512, 1024, device="cuda", dtype=torch.float16)
    with mixgemm.kernel_options(force="dequant_cublas"):
        y = mixgemm.matmul(x, qw)
        assert mixgemm.explain(x, qw).kernel == "dequant_cublas"
    ref = x.double() @ dequantize_weight(qw, torch.float64).t()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-3
    cw = quantize_conv_weight(torch.randn(64, 64, 3, 3), QuantConfig(bits=8, group_size=-1)).to("cuda")
    xc = torch.randn(2, 64, 16, 16, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    with mixgemm.kernel_options(force="dequant_cudnn"):
        mixgemm.conv2d(xc, cw, None, 1, 1)
        assert mixgemm.explain_conv(xc, cw, 1, 1).kernel == "dequant_cudnn"
