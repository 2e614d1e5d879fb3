"""The int8 wgmma GEMM (W4A8 / W8A8 sym x sym, kernels/cuda_wgmma_a8/gemm_wgmma_a8.cu) and its wgmma_a8_v1 layout.

CPU: the layout round trip, its refusals, NVRTC compile checks of the kernel for sm_90a. GPU (sm_90): the kernel
against a float64 GEMM of the same quantized operands (the activation codes and scales the kernel reads, the
dequantized weight), odd shapes, every supported group size, fp16 / bf16 / fp32 output, bias and clamp, every tile
option, and the dispatch through matmul_a8.
"""

from __future__ import annotations

import pytest
import torch

from described_gpus import H100, H200
from mixgemm.formats.int_scales import quantize_weight_int_scales
from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported, build_wgmma_a8_v1, unpack_wgmma_a8_v1
from mixgemm.formats.weight import dequantize_weight, quantize_weight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import SOURCE


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _qw(n, k, bits, gs, seed=0, device="cpu", scale_dtype=torch.float16, int_scales=False):
    w = torch.randn(n, k, generator=_gen(seed)) * 0.05
    if int_scales:
        return quantize_weight_int_scales(w, group_size=gs, scale_dtype=scale_dtype).to(device)
    return quantize_weight(w, bits=bits, group_size=gs, mode="sym", scale_dtype=scale_dtype).to(device)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs,n,k", [(128, 136, 384), (256, 17, 512), (-1, 130, 400)])
def test_layout_roundtrip(bits, gs, n, k):
    qw = _qw(n, k, bits, gs, seed=n)
    before = qw.qweight.clone()
    lay = build_wgmma_a8_v1(qw)
    assert torch.equal(unpack_wgmma_a8_v1(lay), qw.codes().to(torch.int32) - qw.config.sym_bias)
    assert torch.equal(qw.qweight, before)
    s = lay.params.permute(0, 2, 3, 1).reshape(-1, lay.num_groups)[:n]  # [N, G]
    assert torch.equal(s, qw.scales.float() / (16.0 if bits == 4 else 1.0))
    assert lay.k_padded % 128 == 0 and lay.weight.shape[-1] == (1024 if bits == 4 else 2048)


def test_layout_refuses_other_formats():
    for bits, gs, mode in ((4, 64, "sym"), (4, 32, "sym"), (4, 128, "zero_point"), (8, 128, "offset")):
        qw = quantize_weight(torch.randn(16, 256), bits=bits, group_size=gs, mode=mode)
        assert not a8_layout_supported(qw)
        with pytest.raises(ValueError, match="sym int4 / int8"):
            build_wgmma_a8_v1(qw)


COMPILE_CASES = [
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0),
    dict(A8_BITS=4, A8_OUT=1, A8_BM=64, A8_NWG=1, A8_STAGES=5, A8_KT=4, A8_GT=2, A8_NP=2, A8_CVT=1),
    dict(A8_BITS=8, A8_OUT=1, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=2, A8_NP=1, A8_CVT=0),
    dict(A8_BITS=8, A8_OUT=2, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0),
    dict(A8_BITS=8, A8_OUT=0, A8_BM=48, A8_NWG=2, A8_STAGES=4, A8_KT=4, A8_GT=1, A8_NP=2, A8_CVT=1),
    dict(A8_BITS=4, A8_OUT=0, A8_BM=64, A8_NWG=4, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0),
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_WS=0),
    dict(A8_BITS=8, A8_OUT=1, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=2, A8_NP=1, A8_CVT=0, A8_AT=1),
    dict(A8_BITS=4, A8_OUT=2, A8_BM=64, A8_NWG=1, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0, A8_AT=1),
    # the TMA-store epilogue: producer warpgroup (NWG 2), NWG 4 without it, per-channel bf16, per-token, BM 48
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_TSTORE=1),
    dict(A8_BITS=4, A8_OUT=0, A8_BM=64, A8_NWG=4, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_TSTORE=1),
    dict(A8_BITS=8, A8_OUT=1, A8_BM=256, A8_NWG=1, A8_STAGES=3, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_TSTORE=1),
    dict(A8_BITS=4, A8_OUT=1, A8_BM=48, A8_NWG=2, A8_STAGES=4, A8_KT=4, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1),
    # 2-CTA clusters multicasting the activation tile: per-token TMA store, per-group fp32, int8 per-channel, NWG 1
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_MC=2),
    dict(A8_BITS=4, A8_OUT=2, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_MC=2),
    dict(A8_BITS=8, A8_OUT=1, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_TSTORE=1,
         A8_MC=2),
    dict(A8_BITS=4, A8_OUT=0, A8_BM=64, A8_NWG=1, A8_STAGES=4, A8_KT=4, A8_GT=2, A8_NP=2, A8_CVT=0, A8_MC=2),
    # programmatic dependent launch: with and without the cluster, per-group activation scales (copied after the wait)
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_MC=2, A8_PDL=1),
    dict(A8_BITS=8, A8_OUT=1, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=2, A8_NP=1, A8_CVT=0, A8_PDL=1),
    dict(A8_BITS=4, A8_OUT=2, A8_BM=64, A8_NWG=1, A8_STAGES=5, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0, A8_PDL=1),
    # one k-tile per stage (the A buffers alternate by stage parity); the two-stage ring of int8 per-channel BM 256
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=1, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_MC=2),
    dict(A8_BITS=8, A8_OUT=0, A8_BM=256, A8_NWG=2, A8_STAGES=2, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_TSTORE=1,
         A8_MC=2, A8_PDL=1),
    # integer group scales (no fold): the shipped tile, BM 256 with group 256, fp32 per-element stores, NWG 1, KT 1
    dict(A8_BITS=4, A8_OUT=0, A8_BM=128, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_MC=2, A8_PDL=1, A8_QS=1),
    dict(A8_BITS=4, A8_OUT=1, A8_BM=256, A8_NWG=2, A8_STAGES=2, A8_KT=2, A8_GT=2, A8_NP=1, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_MC=2, A8_QS=1),
    dict(A8_BITS=4, A8_OUT=2, A8_BM=64, A8_NWG=1, A8_STAGES=4, A8_KT=1, A8_GT=1, A8_NP=1, A8_CVT=0, A8_AT=1, A8_QS=1),
    # the activation quantizer in the launch: one row per block (bf16 x), several per block (fp32 x), per-channel int8
    dict(A8_BITS=4, A8_OUT=0, A8_BM=64, A8_NWG=2, A8_STAGES=4, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0, A8_AT=1,
         A8_TSTORE=1, A8_PDL=1, A8_QS=1, A8_FQ=2, A8_FQ_WPR=12, A8_XT=1),
    dict(A8_BITS=8, A8_OUT=2, A8_BM=128, A8_NWG=2, A8_STAGES=3, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_FQ=4,
         A8_FQ_WPR=3, A8_XT=2),
    dict(A8_BITS=8, A8_OUT=0, A8_BM=64, A8_NWG=1, A8_STAGES=4, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_FQ=16,
         A8_FQ_WPR=1, A8_PDL=1, A8_TSTORE=1),
    # split-K over a cluster: int32 sums (per-channel, QS with the in-launch quantizer), fp32 folds (per group, AT)
    dict(A8_BITS=8, A8_OUT=0, A8_BM=64, A8_NWG=2, A8_STAGES=5, A8_KT=2, A8_GT=0, A8_NP=1, A8_CVT=0, A8_PDL=1,
         A8_SPLIT=4),
    dict(A8_BITS=4, A8_OUT=1, A8_BM=64, A8_NWG=2, A8_STAGES=5, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0, A8_PDL=1,
         A8_SPLIT=3),
    dict(A8_BITS=4, A8_OUT=2, A8_BM=64, A8_NWG=2, A8_STAGES=5, A8_KT=2, A8_GT=1, A8_NP=2, A8_CVT=0, A8_AT=1,
         A8_QS=1, A8_PDL=1, A8_FQ=2, A8_FQ_WPR=12, A8_SPLIT=2),
    dict(A8_BITS=4, A8_OUT=0, A8_BM=32, A8_NWG=1, A8_STAGES=4, A8_KT=4, A8_GT=2, A8_NP=2, A8_CVT=1, A8_AT=1,
         A8_SPLIT=8),
]


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")
@pytest.mark.parametrize("defs", COMPILE_CASES, ids=lambda d: "-".join(f"{v}" for v in d.values()))
def test_nvrtc_compiles_sm90a(defs):
    cubin = nvrtc.compile_cubin(SOURCE, tuple(sorted(defs.items())), "sm_90a")
    assert len(cubin) > 1000


def test_quantizing_default_rule():
    """The default config quantizes in the launch (FQ 1) for per-token calls up to A8_QUANTIZING_MAX_M rows and for
    small products beyond (tuning.A8_QUANTIZING_*), never for per-group activation scales."""
    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.cuda_wgmma_a8 import quantizing_pays
    from mixgemm.kernels.int8_activations import a8_problem
    from mixgemm.tuning import A8_QUANTIZING_MAX_M

    cpu = torch.device("cpu")
    qw = _qw(256, 2048, 8, -1)
    assert _wgmma_a8_config(a8_problem(16, qw, torch.float16, cpu, "sym", True))["FQ"] == 1
    qw = _qw(256, 2048, 4, 128)
    assert _wgmma_a8_config(a8_problem(16, qw, torch.float16, cpu, "sym", True))["FQ"] == 1
    assert _wgmma_a8_config(a8_problem(16, qw, torch.float16, cpu, "sym", False))["FQ"] == 0
    assert quantizing_pays(A8_QUANTIZING_MAX_M, 28672, 8192) and quantizing_pays(512, 2048, 2048)
    assert not quantizing_pays(512, 4096, 4096) and not quantizing_pays(2048, 2048, 2048)


@pytest.mark.parametrize("m", [1, 3, 17, 129, 300, 2000, 20000])
@pytest.mark.parametrize("k", [16, 1040, 4096, 28672, 65536])
@pytest.mark.parametrize("warps", [8, 12])
@pytest.mark.parametrize("gemm_blocks", [0, 64, 500])
def test_quantizer_split_covers_the_rows(m, k, warps, gemm_blocks):
    """The in-launch quantizer's split: at most one block per SM the GEMM leaves free (at least a quarter of them),
    rows held in the registers it allows, every row taken (blocks x rows per block, in turns), one round wherever the
    registers allow it."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import quantizer_split

    sms, max_units = 132, 16
    slots = max(sms - gemm_blocks, sms // 4)
    sp = quantizer_split(m, k, warps, sms, max_units, gemm_blocks)
    if k // 8 > 32 * warps * max_units:
        assert sp is None
        return
    rows = warps // sp.warps_per_row
    assert warps % sp.warps_per_row == 0 and 1 <= sp.blocks <= min(slots, m)
    assert sp.units <= max_units and sp.units * 32 * sp.warps_per_row >= k // 8
    assert sp.blocks * rows >= min(m, slots * rows)  # the blocks' first rows already cover up to one round
    if -(-m // slots) <= rows:  # one round: each block's rows at once, with as many threads per row as that allows
        assert sp.blocks * rows >= m
        wider = [d for d in range(sp.warps_per_row + 1, warps + 1) if warps % d == 0]
        assert all(slots * (warps // d) < m for d in wider)


# ------------------------------------------------------------------------------------------------ GPU

needs_sm90 = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                reason="needs an sm_90 GPU")


def _rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _run(m, n, k, bits, gs, out_dtype=torch.float16, config=None, seed=0, bias=True, activation="relu6",
         per_token=False, int_scales=False):
    """(kernel output, float64 reference on the same quantized operands); per_token: one activation scale per token
    (act_quant block = K) over the grouped weight."""
    from mixgemm.epilogue import clamp_bounds
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import gemm_wgmma_a8
    from mixgemm.kernels.triton.act_quant import act_quant

    qw = _qw(n, k, bits, gs, seed, "cuda", int_scales=int_scales)
    x = (torch.randn(m, k, generator=_gen(seed + 1)) * 2).to("cuda", torch.float16)
    b = (torch.randn(n, generator=_gen(seed + 2)) * 0.5).to("cuda", out_dtype) if bias else None
    blk = k if per_token else qw.config.groups(k)[0]
    aq, sa, _, _ = act_quant(x, blk, "sym")
    aq0, sa0 = aq.clone(), sa.clone()
    lo, hi = clamp_bounds(activation)
    y = gemm_wgmma_a8(aq, sa, qw, b, lo, hi, out_dtype, config=config)
    assert torch.equal(aq, aq0) and torch.equal(sa, sa0)  # inputs untouched
    a = aq.cpu().double() * sa.cpu().double().repeat_interleave(blk, 1)
    ref = a @ dequantize_weight(qw.to("cpu"), torch.float64).T
    if b is not None:
        ref = ref + b.cpu().double()
    return y, ref.clamp(lo, hi)


_TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [128, 256, -1])
@pytest.mark.parametrize("m", [1, 3, 17, 129, 300])
def test_gpu_matches_reference(bits, gs, m):
    n, k = 520, 1024 if gs != -1 else 1040
    for out_dtype, tol in _TOL.items():
        y, ref = _run(m, n, k, bits, gs, out_dtype, seed=m + bits)
        assert y.dtype == out_dtype and y.shape == (m, n)
        assert _rel(y, ref) < tol, (out_dtype, _rel(y, ref))


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    dict(BM=128, NWG=2, STAGES=4, KT=2, NP=2, CVT=0),
    dict(BM=128, NWG=2, STAGES=3, KT=2, NP=1, CVT=1),
    dict(BM=64, NWG=1, STAGES=4, KT=4, NP=2, CVT=1, GROUP_M=1, MINB=2),
    dict(BM=64, NWG=4, STAGES=4, KT=2, NP=1, CVT=0),
    dict(BM=48, NWG=4, STAGES=3, KT=2, NP=2, CVT=0, GROUP_M=2),
    dict(BM=48, NWG=2, STAGES=4, KT=4, NP=1, CVT=0, GROUP_M=3),
    dict(BM=16, NWG=1, STAGES=3, KT=2, NP=2, CVT=0),
    dict(BM=256, NWG=1, STAGES=3, KT=2, NP=1, CVT=0),
    dict(BM=128, NWG=2, STAGES=3, KT=2, NP=1, CVT=0, WS=0),
    dict(BM=96, NWG=2, STAGES=3, KT=4, NP=2, CVT=0, MINB=2),
    dict(BM=256, NWG=2, STAGES=2, KT=2, NP=1, CVT=0),
    dict(BM=128, NWG=2, STAGES=4, KT=1, NP=1, CVT=0),
    dict(BM=256, NWG=2, STAGES=4, KT=1, NP=1, CVT=0, MC=2),
])
@pytest.mark.parametrize("bits,gs", [(4, 128), (8, 128), (4, 256), (8, -1)])
def test_gpu_tile_options(cfg, bits, gs):
    if (gs == 256 and cfg["KT"] % (2 * cfg["NP"])) or (cfg["BM"] > 128 and gs != -1):
        # KT is a multiple of NP x the group's 128-k tiles; grouped tiles hold BM / 2 fp32 + NP x BM / 2 int32 values
        # per thread: BM <= 128
        with pytest.raises(ValueError, match="bad int8 wgmma tile"):
            _run(64, 136, 1024, bits, gs, torch.float16, config=cfg)
        return
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import SMEM_LIMIT, stage_bytes

    if cfg["STAGES"] * stage_bytes(cfg["BM"], cfg["NWG"], bits, cfg["KT"], gs == -1) + 1024 > SMEM_LIMIT:
        with pytest.raises(ValueError, match="bytes of shared memory"):
            _run(64, 136, 1024, bits, gs, torch.float16, config=cfg)
        return
    # KT 1 runs its stages in pairs: 9 k-tiles leave the last pair one stage short
    shapes = ((200, 1000, 2048), (77, 136, 768 if gs != 256 else 1024))
    shapes += ((129, 250, 1152),) if cfg["KT"] == 1 else ()
    for m, n, k in shapes:
        y, ref = _run(m, n, k, bits, gs, torch.float16, config=cfg, seed=m)
        assert _rel(y, ref) < 1e-3, (m, n, k, _rel(y, ref))


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(4, 128), (8, 128), (4, 256)])
@pytest.mark.parametrize("m", [3, 129, 300])
def test_gpu_per_token_activation_scales(bits, gs, m):
    """sa [M, 1] (one activation scale per token) over a grouped weight: the fold uses sW only, sA in the epilogue."""
    for out_dtype, tol in _TOL.items():
        y, ref = _run(m, 264, 1024, bits, gs, out_dtype, seed=m + gs, per_token=True)
        assert _rel(y, ref) < tol, (out_dtype, _rel(y, ref))
    y, ref = _run(200, 1000, 2048, bits, gs, torch.float16, config=dict(BM=64, NWG=1, STAGES=3, KT=4, NP=2),
                  per_token=True)
    assert _rel(y, ref) < 1e-3


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("gs", [128, 256])
@pytest.mark.parametrize("m", [3, 17, 129, 300])
def test_gpu_int_scales(gs, m):
    """QS (int4 with integer group scales, per-token activations: codes x multiples as int8 in registers, no fold)
    against the float64 reference for every output dtype; the same weight with QS 0 (the fold) agrees; per-group
    activation scales over it take the fold."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config

    n, k = 1000, 1152 if gs == 128 else 1536
    for out_dtype, tol in _TOL.items():
        y, ref = _run(m, n, k, 4, gs, out_dtype, seed=m + gs, per_token=True, int_scales=True)
        assert _rel(y, ref) < tol, (out_dtype, _rel(y, ref))
    cfg = default_config(m, n, k, gs, 4)
    y0, ref = _run(m, n, k, 4, gs, torch.float32, config=dict(cfg, QS=0), seed=m, per_token=True, int_scales=True)
    y1, _ = _run(m, n, k, 4, gs, torch.float32, config=dict(cfg, QS=1), seed=m, per_token=True, int_scales=True)
    assert _rel(y1, ref) < 1e-5 and _rel(y0, ref) < 1e-5 and _rel(y1, y0) < 1e-5
    y, ref = _run(m, n, k, 4, gs, torch.float16, seed=m, per_token=False, int_scales=True)
    assert _rel(y, ref) < 1e-3


def test_default_config_int_scales():
    """QS (no fold) takes BM 256 / KT 2 / 2 stages where they make QS_BM256_MIN_TILES CTAs, with MC 2 where the CTA
    column tiles pair up and K is long or M large; elsewhere the grouped default."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config

    for k, n in ((28672, 8192), (8192, 28672)):
        cfg = default_config(2048, n, k, 128, 4, qs=True)
        assert (cfg["BM"], cfg["KT"], cfg["STAGES"], cfg.get("MC")) == (256, 2, 2, 2)
    assert default_config(1024, 8192, 28672, 128, 4, qs=True).get("MC") == 2  # long K
    cfg = default_config(1024, 28672, 8192, 128, 4, qs=True)
    assert cfg["BM"] == 256 and "MC" not in cfg
    assert "MC" not in default_config(4096, 8200, 8192, 128, 4, qs=True)  # 65 CTA column tiles
    assert default_config(256, 14336, 4096, 128, 4, qs=True)["BM"] == 256  # 112 CTAs
    for m, n, k in ((256, 8192, 28672), (256, 4096, 14336), (200, 28672, 8192)):  # 64, 32 CTAs; M < 256
        assert default_config(m, n, k, 128, 4, qs=True) == default_config(m, n, k, 128, 4)


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    dict(BM=256, NWG=2, STAGES=2, KT=2, NP=1),
    dict(BM=256, NWG=2, STAGES=2, KT=2, NP=1, MC=2, TSTORE=0),
    dict(BM=128, NWG=2, STAGES=4, KT=1, NP=1, MC=2),
    dict(BM=64, NWG=1, STAGES=4, KT=4, NP=1, GROUP_M=2),
    dict(BM=48, NWG=4, STAGES=3, KT=2, NP=1),
    dict(BM=128, NWG=2, STAGES=3, KT=2, NP=1, WS=0),
])
def test_gpu_int_scales_tiles(cfg):
    """QS on other tiles (BM 256, which the fold's accumulators do not fit, clusters, KT 1 with an odd stage count,
    NWG 1 / 4, no producer warpgroup), M and N tails, group 128 and 256."""
    for m, n, k, gs in ((200, 1000, 2048, 128), (77, 1024, 1152, 128), (300, 1016, 1536, 256)):
        if gs == 256 and cfg["KT"] == 1:
            continue
        y, ref = _run(m, n, k, 4, gs, torch.float16, config=cfg, seed=m, per_token=True, int_scales=True)
        assert _rel(y, ref) < 1e-3, (m, n, k, _rel(y, ref))


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs,per_token", [(4, 128, False), (4, 128, True), (8, -1, False), (8, 256, False)])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_gpu_tma_store_epilogue(bits, gs, per_token, out_dtype):
    """TSTORE 1 (each warpgroup's tile staged in the drained ring, one TMA store) is bit-equal to the per-element
    stores (TSTORE 0), with M and N tails, bias and relu6, and within tolerance of the reference; an output whose rows
    the TMA cannot address (N = 100: 200-byte rows) takes the per-element stores."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config

    k = 1024
    for m, n, cfg in ((129, 264, None), (77, 1000, dict(BM=48, NWG=2, STAGES=3, KT=2, NP=1, CVT=0)),
                      (70, 520, dict(BM=32, NWG=4, STAGES=3, KT=2, NP=1, CVT=0)),
                      (300, 136, dict(BM=128, NWG=2, STAGES=3, KT=2, NP=1, CVT=0, WS=0)), (33, 100, None)):
        cfg = cfg or default_config(m, n, k, k if gs == -1 else gs, bits)
        y1, ref = _run(m, n, k, bits, gs, out_dtype, config=dict(cfg, TSTORE=1), seed=m, per_token=per_token)
        y0, _ = _run(m, n, k, bits, gs, out_dtype, config=dict(cfg, TSTORE=0), seed=m, per_token=per_token)
        assert torch.equal(y1, y0), (m, n, cfg)
        assert _rel(y1, ref) < _TOL[out_dtype], (m, n, _rel(y1, ref))


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs,per_token", [(4, 128, True), (4, 128, False), (8, -1, False), (8, 256, False),
                                               (4, 256, True)])
def test_gpu_cluster_multicast(bits, gs, per_token):
    """MC 2 (two CTAs of the same tokens as a cluster, each loading half of the activation box and multicasting it)
    is bit-equal to MC 1: M tails where the box's second half holds some tokens (M = 200), none (M = 150 and M = 3:
    that half is skipped by both CTAs), a last CTA pair with rows past N (N = 1000), both epilogues, NWG 1 and 2."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config

    k = 2048 if gs != 256 else 1536
    for m, n, cfg in ((200, 1024, None), (150, 1000, None), (3, 1024, None), (300, 512, dict(TSTORE=0)),
                      (77, 1000, dict(BM=64, NWG=1, STAGES=4, KT=2, NP=1, CVT=0)),
                      (129, 500, dict(BM=32, NWG=1, STAGES=3, KT=2, NP=1, CVT=0, GROUP_M=2))):
        cfg = {**default_config(m, n, k, k if gs == -1 else gs, bits), **(cfg or {})}
        y2, ref = _run(m, n, k, bits, gs, torch.float16, config=dict(cfg, MC=2), seed=m + n, per_token=per_token)
        y1, _ = _run(m, n, k, bits, gs, torch.float16, config=dict(cfg, MC=1), seed=m + n, per_token=per_token)
        assert torch.equal(y2, y1), (m, n, cfg)
        assert _rel(y2, ref) < 1e-3, (m, n, _rel(y2, ref))
    cfg = dict(default_config(129, 1024, k, k if gs == -1 else gs, bits), MC=2)
    y2, ref = _run(129, 1024, k, bits, gs, torch.bfloat16, config=cfg, seed=5, per_token=per_token)
    assert _rel(y2, ref) < 1e-2


def test_default_config_cluster_multicast():
    """default_config takes MC 2 (activation multicast over 2-CTA clusters) at long K and large M, where it measured
    faster, and only when the CTA column tiles pair up."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import MC_MIN_K, MC_MIN_M, default_config

    assert default_config(2048, 8192, 28672, 128)["MC"] == 2
    assert default_config(16384, 8192, 28672, 28672, 8).get("MC") == 2
    assert "MC" not in default_config(2048, 28672, 8192, 128)  # K below MC_MIN_K
    assert "MC" not in default_config(MC_MIN_M // 2, 8192, 28672, 128)
    assert "MC" not in default_config(4096, 8200, MC_MIN_K, 128)  # 513 row tiles: 65 CTA column tiles of 128 rows


def test_default_config_int8_per_channel_wide():
    """int8 per-channel weights in w8_wide_region (K >= W8_WIDE_MIN_K, M >= 2048, pairing column tiles) take BM 256
    tokens per CTA with a 2-stage ring (fits the shared memory) and MC 2; grouped or int4 weights, shorter K and
    smaller M keep BM 128."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import (
        SMEM_LIMIT,
        W8_WIDE_MIN_K,
        default_config,
        multicast_region,
        stage_bytes,
        w8_wide_region,
    )

    for n, k in ((8192, 28672), (28672, 8192)):
        cfg = default_config(2048, n, k, k, 8)
        assert (cfg["BM"], cfg["KT"], cfg["STAGES"], cfg["MC"]) == (256, 2, 2, 2)
    assert cfg["STAGES"] * stage_bytes(256, cfg["NWG"], 8, cfg["KT"], True) + 1024 <= SMEM_LIMIT
    assert default_config(2048, 8192, 28672, 128, 8)["BM"] == 128
    assert default_config(2048, 8192, 28672, 28672, 4)["BM"] == 128
    assert default_config(4096, 28672, W8_WIDE_MIN_K // 2, W8_WIDE_MIN_K // 2, 8)["BM"] == 128
    assert default_config(1024, 28672, 8192, 8192, 8)["BM"] == 128
    assert w8_wide_region(2048, 28672, 8192) and not w8_wide_region(2048, 8200, 8192)
    assert not w8_wide_region(1024, 8192, 28672) and not w8_wide_region(2048, 8192, W8_WIDE_MIN_K - 128)
    assert multicast_region(2048, 8192, 28672) and not multicast_region(2048, 28672, 8192)
    assert not multicast_region(1024, 8192, 28672) and not multicast_region(2048, 8200, 28672)


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("mc", [1, 2])
@pytest.mark.parametrize("tail", [0, 2])
def test_gpu_pdl_chain(mc, tail):
    """PDL (the weights of the first stages queued before griddepcontrol.wait): a chain quantizer -> GEMM -> quantizer
    -> GEMM ..., each GEMM reading the codes the kernel right before it wrote, eager and in a CUDA graph, equals the
    PDL-off chain bit for bit. TAIL 2: each GEMM is two chained launches (A8_CHAIN: the tail loads without waiting
    for the first launch and waits for it only before exiting), so the quantizer after them must still see every
    column of both."""
    from mixgemm.kernels.cuda.act_quant_rows import act_quant_rows
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config, gemm_wgmma_a8, tail_rows
    from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

    k = n = 8192
    qws = [_qw(n, k, 4, 128, seed, "cuda") for seed in range(3)]
    cfg = dict(default_config(300, n, k, 128), MC=mc, PDL=1, TAIL=tail)
    if tail:
        assert tail_rows(300, n, cfg, torch.cuda.get_device_properties(0).multi_processor_count)[0]
    inf = float("inf")

    def chain(x):
        for qw in qws:
            aq, sa, _, _ = act_quant_rows(x)
            x = gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=cfg)
        return x

    x0 = (torch.randn(300, k, generator=_gen(4))).to("cuda", torch.float16)
    assert_pdl_chain_matches(chain, x0)


def _quantizing_launch(qw, m, x_dtype, fq=1):
    """The call plan's prepared launch for M rows (the registry's cuda_wgmma_a8 entry, per-token scales), its default
    config with FQ (1: the GEMM quantizes x in its own launch outside graph capture, wherever the tile allows; 0:
    never)."""
    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.cuda_wgmma_a8 import prepare as _prepare_wgmma_a8
    from mixgemm.kernels.int8_activations import a8_problem

    p = a8_problem(m, qw, x_dtype, torch.device("cuda"), "sym", True)
    return _prepare_wgmma_a8(p, qw, dict(_wgmma_a8_config(p), FQ=fq))


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(4, 128), (8, 128), (4, 256), (8, -1), (4, -1)])
@pytest.mark.parametrize("m", [1, 3, 17, 129, 300])
def test_gpu_quantizing_launch(bits, gs, m):
    """The GEMM that quantizes its activations in the same launch (A8_FQ): per-token codes and scales equal to the
    reference quantizer's, so its output matches the float64 GEMM of them within the dtype's tolerance and equals
    the two-launch path (quantizer, then the GEMM: config FQ 0) bit for bit; x untouched; fp16 / bf16 / fp32 x; N and
    K off every tile."""
    from mixgemm.epilogue import clamp_bounds
    from mixgemm.formats.activation import quantize_activation

    n, k = 520, 1040 if gs == -1 else 1024
    qw = _qw(n, k, bits, gs, m + bits, "cuda")
    lo, hi = clamp_bounds("relu6")
    for x_dtype, tol in _TOL.items():
        x = (torch.randn(m, k, generator=_gen(m)) * 2).to("cuda", x_dtype)
        if m > 2:
            x[1] = 0.0  # scale 0, codes 0
            x[2] = -1.5  # every code -127
        x0 = x.clone()
        bias = (torch.randn(n, generator=_gen(m + 1)) * 0.5).to("cuda", x_dtype)
        launch = _quantizing_launch(qw, m, x_dtype)
        assert launch.quantizes
        y = launch(x, bias, lo, hi)
        assert torch.equal(x, x0) and y.dtype == x_dtype and y.shape == (m, n)
        a = quantize_activation(x.cpu().float(), k, "sym").dequantize().double()
        ref = (a @ dequantize_weight(qw.to("cpu"), torch.float64).T + bias.cpu().double()).clamp(lo, hi)
        assert _rel(y, ref) < tol, (x_dtype, _rel(y, ref))
        two = _quantizing_launch(qw, m, x_dtype, fq=0)
        assert not two.quantizes
        assert torch.equal(two(x, bias, lo, hi), y), x_dtype
        y2 = launch(x, bias, lo, hi)  # the counters were left zero: the next launch runs the same
        assert torch.equal(y2, y)


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("m,k", [(17, 28672), (2000, 4096), (4000, 1024)])
def test_gpu_quantizing_launch_splits(m, k):
    """The quantizer's other splits: a whole block per row of a long K; several rows per block, blocks taking rows in
    turns (more rows than one round); x whose rows are not 16-byte aligned (copied first)."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import quantizer_split
    from mixgemm.kernels.registry import device_info

    n = 264
    qw = _qw(n, k, 8, -1, m, "cuda")
    x = (torch.randn(m, k, generator=_gen(m)) * 2).to("cuda", torch.float16)
    sp = quantizer_split(m, k, 12, device_info(x.device).sm_count, 16)
    assert sp is not None
    launch = _quantizing_launch(qw, m, torch.float16)
    assert launch.quantizes
    inf = float("inf")
    y = launch(x, None, -inf, inf)
    assert torch.equal(_quantizing_launch(qw, m, torch.float16, fq=0)(x, None, -inf, inf), y)
    buf = torch.empty(m * k + 1, device="cuda", dtype=torch.float16)
    xu = buf[1:].view(m, k)
    xu.copy_(x)
    assert xu.data_ptr() % 16
    assert torch.equal(launch(xu, None, -inf, inf), y)


@needs_sm90
@pytest.mark.gpu
def test_gpu_quantizing_launch_chain():
    """Quantizing launches back to back, each reading the output of the one before (PDL lets the next start early;
    its quantizer blocks and producers wait first) on one stream's counters and scratch, eagerly and in a CUDA
    graph, with PDL off and on: bit-equal."""
    from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

    k = n = 4096
    qws = [_qw(n, k, bits, gs, seed, "cuda") for seed, (bits, gs) in enumerate([(4, -1), (8, -1), (4, -1)])]
    inf = float("inf")
    for m in (16, 300):

        def chain(x, m=m):
            for qw in qws:
                launch = _quantizing_launch(qw, m, torch.float16)  # prepared under the chain's options
                assert launch.quantizes
                x = launch(x, None, -inf, inf)
            return x

        assert_pdl_chain_matches(chain, torch.randn(m, k, generator=_gen(m)).to("cuda", torch.float16))


@needs_sm90
@pytest.mark.gpu
def test_gpu_int8_per_channel_long_k_default():
    """The default tile at long K and large M (int8 per-channel: BM 256, two stages, MC 2) against the float64
    reference and bit for bit against BM 128."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config

    m, n, k = 2048, 250, 16384
    assert default_config(m, n, k, k, 8)["BM"] == 256
    y, ref = _run(m, n, k, 8, -1, torch.bfloat16, seed=5)
    assert _rel(y, ref) < 1e-2
    y128, _ = _run(m, n, k, 8, -1, torch.bfloat16, seed=5, config=dict(default_config(m, n, k, k, 8), BM=128, STAGES=3))
    assert torch.equal(y, y128)


@needs_sm90
@pytest.mark.gpu
def test_gpu_large_k_no_bias():
    y, ref = _run(64, 384, 8192, 4, 128, torch.bfloat16, bias=False, activation=None)
    assert _rel(y, ref) < 1e-2
    y, ref = _run(64, 384, 28672, 8, -1, torch.float16, bias=False, activation="relu")
    assert _rel(y, ref) < 1e-3


@needs_sm90
@pytest.mark.gpu
def test_gpu_int_scales_through_matmul_a8():
    """matmul_a8 with act_block "token" over an integer-scale weight, at a size where default_config takes BM 256
    (QS), against the float64 reference on the same quantized operands, and the runner bit-equal to it."""
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config
    from mixgemm.ops import int8 as ops

    m, n, k = 300, 14336, 1024
    assert default_config(m, n, k, 128, 4, qs=True)["BM"] == 256
    qw = _qw(n, k, 4, 128, 11, "cuda", int_scales=True)
    x = (torch.randn(m, k, generator=_gen(12)) * 2).to("cuda", torch.bfloat16)
    y = ops.matmul_a8(x, qw, act_block="token")
    a = quantize_activation(x.cpu().float(), k, "sym").dequantize()
    ref = a.double() @ dequantize_weight(qw.to("cpu"), torch.float64).T
    assert y.dtype == torch.bfloat16 and _rel(y, ref) < 1e-2
    assert torch.equal(ops.make_a8_runner(x, qw, act_block="token")(), y)


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(4, 128), (8, 256), (4, -1)])
def test_gpu_dispatch_through_matmul_a8(bits, gs):
    """M >= tuning.A8_WGMMA_MIN_M takes this kernel (the runner too); the result matches the float64 reference and the
    Triton kernel that it replaces."""
    import mixgemm
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.kernels.registry import kernel_options
    from mixgemm.ops import int8 as ops

    n, k = 1000, 2048
    qw = _qw(n, k, bits, gs, 7, "cuda")
    x = (torch.randn(300, k, generator=_gen(8)) * 2).to("cuda", torch.float16)
    bias = torch.randn(n, generator=_gen(9)).to("cuda", torch.float16)
    y = ops.matmul_a8(x, qw, bias=bias, activation="relu")
    assert qw._layouts.get("wgmma_a8_v1") is not None
    a = quantize_activation(x.cpu().float(), qw.config.groups(k)[0], "sym").dequantize()
    ref = (a.double() @ dequantize_weight(qw.to("cpu"), torch.float64).T + bias.cpu().double()).clamp(min=0)
    assert _rel(y, ref) < 2e-3
    y2 = ops.make_a8_runner(x, qw, bias=bias, activation="relu")()
    assert torch.equal(y, y2)
    with kernel_options(disable="cuda_wgmma_a8"):
        assert mixgemm.explain(x, qw, act_mode="sym").kernel == "triton_a8"
        y3 = ops.matmul_a8(x, qw, bias=bias, activation="relu")
    assert _rel(y, y3) < 2e-3


@needs_sm90
@pytest.mark.gpu
def test_gpu_int8_per_channel_dispatch():
    """int8 per-channel: the CUDA kernel for 128 <= M < A8_W8_PER_CHANNEL_TRITON_FROM_M, the Triton kernel above, except
    where its BM 256 / MC 2 tiles apply (w8_wide_region), where the CUDA kernel keeps every M."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import MC_MIN_M, W8_WIDE_MIN_K
    from mixgemm.ops import int8 as ops
    from mixgemm.tuning import A8_W8_PER_CHANNEL_TRITON_FROM_M

    qw = _qw(256, 1024, 8, -1, 3, "cuda")
    x = torch.randn(A8_W8_PER_CHANNEL_TRITON_FROM_M, 1024, device="cuda", dtype=torch.float16)
    y = ops.matmul_a8(x, qw)
    assert "wgmma_a8_v1" not in qw._layouts
    y2 = ops.matmul_a8(x[:300], qw)
    assert "wgmma_a8_v1" in qw._layouts
    assert _rel(y2, y[:300]) < 1e-3
    qw = _qw(250, W8_WIDE_MIN_K, 8, -1, 4, "cuda")
    x = torch.randn(MC_MIN_M, W8_WIDE_MIN_K, device="cuda", dtype=torch.float16)
    y = ops.matmul_a8(x, qw)
    assert "wgmma_a8_v1" in qw._layouts
    y_triton = ops.matmul_a8(x, qw, config={})  # an explicit Triton config keeps the Triton kernel
    assert _rel(y, y_triton) < 1e-3


@needs_sm90
@pytest.mark.gpu
def test_gpu_errors():
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import gemm_wgmma_a8

    qw = _qw(64, 256, 4, 128, 0, "cuda")
    aq = torch.randint(-127, 128, (5, 256), dtype=torch.int8, device="cuda")
    sa = torch.rand(5, 2, device="cuda")
    inf = float("inf")
    with pytest.raises(ValueError, match="int8"):
        gemm_wgmma_a8(aq.float(), sa, qw, None, -inf, inf, torch.float16)
    with pytest.raises(ValueError, match="sa must be float32"):
        gemm_wgmma_a8(aq, torch.rand(5, 3, device="cuda"), qw, None, -inf, inf, torch.float16)
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):  # the producer's registers go to NWG 2 consumers
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(NWG=2, MINB=2, WS=1))
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(NWG=4, BM=64, WS=1))
    with pytest.raises(ValueError, match="shape mismatch"):
        gemm_wgmma_a8(aq[:, :128], sa, qw, None, -inf, inf, torch.float16)
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(BM=24))
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):  # the cluster's producers multicast: WS only
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(NWG=2, MC=2, WS=0))
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(MC=3))
    with pytest.raises(ValueError, match="bad int8 wgmma tile"):  # the producer queues the weights before the wait
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(NWG=2, PDL=1, WS=0))
    with pytest.raises(ValueError, match="MC 2 pairs the CTAs along N"):  # N = 64: one column tile of 128 rows
        gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=dict(MC=2))
    with pytest.raises(ValueError, match="sym int4 / int8"):
        q64 = quantize_weight(torch.randn(64, 256), bits=4, group_size=64, mode="sym").to("cuda")
        gemm_wgmma_a8(aq, torch.rand(5, 4, device="cuda"), q64, None, -inf, inf, torch.float16)


def test_bias_clamp_args():
    """The shared epilogue parameters of the CUDA kernels: bias pointer / dtype code, clamp bounds."""
    inf = float("inf")
    args = nvrtc.bias_clamp_args(None, -inf, 6.0)
    assert [a.value for a in args] == [None, 0, -inf, 6.0]
    for dt, code in ((torch.float16, 1), (torch.bfloat16, 2), (torch.float32, 3)):
        b = torch.zeros(4, dtype=dt)
        args = nvrtc.bias_clamp_args(b, 0.0, inf)
        assert args[0].value == b.data_ptr() and args[1].value == code and args[2].value == 0.0 and args[3].value == inf


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs,per_token,int_scales", [(8, -1, False, False), (4, 128, False, False),
                                                          (4, 128, True, False), (4, 256, False, False),
                                                          (8, 128, True, False), (4, 128, True, True)])
def test_gpu_cluster_split_k(bits, gs, per_token, int_scales):
    """SPLIT S (the S CTAs of a cluster each run a slice of K and meet their sums in distributed shared memory, each
    storing a band of the tile's tokens): int32 sums (per-channel, integer group scales) bit-equal to SPLIT 1, fp32
    folds within the tolerance; M tails inside a band and across bands (M = 1, 3, 17, 64, 100), N off the tiles, a
    last slice shorter than the others, splits 2..8; a split that would leave a slice empty is refused."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config, split_slices

    exact = gs == -1 or int_scales
    k = 4224 if gs != 256 else 4352  # 33 / 34 k-tiles: S 4 takes 10, 10, 10 and 3 / 4; S 8 would leave one empty
    for m, n, split, kk in ((1, 1000, 2, k), (3, 520, 3, k), (17, 136, 4, k), (64, 1000, 4, k), (100, 264, 2, k),
                            (17, 520, 8, k), (5, 1000, 8, 8192)):
        cfg = dict(default_config(m, n, kk, kk if gs == -1 else gs, bits, qs=int_scales and per_token), SPLIT=split)
        if split_slices(-(-kk // 128), split, cfg["KT"]) is None:
            with pytest.raises(ValueError, match="leaves a slice empty"):
                _run(m, n, kk, bits, gs, config=cfg, per_token=per_token, int_scales=int_scales)
            continue
        ys, ref = _run(m, n, kk, bits, gs, config=cfg, seed=m + n, per_token=per_token, int_scales=int_scales)
        y1, _ = _run(m, n, kk, bits, gs, config=dict(cfg, SPLIT=1), seed=m + n, per_token=per_token,
                     int_scales=int_scales)
        assert _rel(ys, ref) < 1e-3, (m, n, split, _rel(ys, ref))
        if exact:
            assert torch.equal(ys, y1), (m, n, split)
    cfg = dict(default_config(17, 520, k, k if gs == -1 else gs, bits), SPLIT=2)
    y, ref = _run(17, 520, k, bits, gs, torch.bfloat16, config=cfg, seed=7, per_token=per_token, int_scales=int_scales)
    assert _rel(y, ref) < 1e-2
    y, ref = _run(17, 520, k, bits, gs, torch.float32, config=cfg, seed=7, per_token=per_token, int_scales=int_scales)
    assert _rel(y, ref) < 1e-5


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(8, -1), (4, 128)])
@pytest.mark.parametrize("m", [1, 5, 33])
def test_gpu_cluster_split_k_quantizing_launch(bits, gs, m):
    """SPLIT with the activation quantizer in the launch (A8_FQ: its blocks rounded to whole clusters ahead of the
    GEMM's): equal to the two-launch path bit for bit and to the float64 GEMM within the tolerance."""
    from mixgemm.epilogue import clamp_bounds
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.cuda_wgmma_a8 import prepare as _prepare_wgmma_a8
    from mixgemm.kernels.int8_activations import a8_problem

    n, k = 1000, 4096
    qw = _qw(n, k, bits, gs, m, "cuda")
    lo, hi = clamp_bounds("relu6")
    p = a8_problem(m, qw, torch.float16, torch.device("cuda"), "sym", True)
    for split in (3, 4):
        cfg = dict(_wgmma_a8_config(p), SPLIT=split)
        quantizing = _prepare_wgmma_a8(p, qw, dict(cfg, FQ=1))
        two = _prepare_wgmma_a8(p, qw, dict(cfg, FQ=0))
        assert quantizing.quantizes and not two.quantizes
        x = (torch.randn(m, k, generator=_gen(m)) * 2).to("cuda", torch.float16)
        bias = (torch.randn(n, generator=_gen(m + 1)) * 0.5).to("cuda", torch.float16)
        y = quantizing(x, bias, lo, hi)
        assert torch.equal(y, two(x, bias, lo, hi)), split
        a = quantize_activation(x.cpu().float(), k, "sym").dequantize().double()
        ref = (a @ dequantize_weight(qw.to("cpu"), torch.float64).T + bias.cpu().double()).clamp(lo, hi)
        assert _rel(y, ref) < 1e-3, (split, _rel(y, ref))


def test_split_slices():
    """k-tiles per SPLIT slice: whole stages, every slice non-empty, the slices covering K."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import split_slices

    for kt_total in range(1, 80):
        for split in range(1, 9):
            for kt in (1, 2, 4):
                per = split_slices(kt_total, split, kt)
                if per is None:
                    continue
                assert per % kt == 0 and (split - 1) * per < kt_total <= split * per
    assert split_slices(112, 4, 2) == 28 and split_slices(8, 8, 2) is None


def test_split_k_rule():
    """The cluster split from the wave count (H100 / H200 cluster residency: 66 / 39 / 30 clusters of 2 / 3 / 4), as
    measured fastest (tools/bench/wgmma_a8.py --splits, tools/bench/a8_small_m.py): only where the CTAs leave SMs
    idle, the fewest k-tiles per slice among the splits whose clusters all fit at once, and per-channel weights split
    only where a CTA streams at least the given bytes."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config, split_k_rule

    slots = {2: 66, 3: 39, 4: 30}
    one_mib = 1 << 20

    def rule(k, n, bits=4, gs=128, m=16, nofold=None, cluster_slots=slots):
        cfg = default_config(m, n, k, k if gs == -1 else gs, bits)
        return split_k_rule(m, n, k, bits, cfg, nofold, 132, cluster_slots)

    assert rule(14336, 4096) == 3  # 32 CTAs: 32 clusters of 4 would take two waves (30 resident)
    assert rule(18944, 3584) == 4  # 28 CTAs
    assert rule(28672, 8192) == 2 and rule(8192, 8192) == 2  # 64 CTAs: 2 x 64 fits, 3 x 64 does not
    assert rule(5120, 5120) == 2  # 40 clusters of 3 are past the 39 resident
    assert rule(4096, 4096) == 3 and rule(2048, 2048) == 4
    assert rule(4096, 14336) == 1  # 112 CTAs already fill the SMs
    assert rule(3584, 18944) == 1  # 148 CTAs: past one wave, where splitting lost
    assert rule(5120, 5120, cluster_slots=None) == 3  # without measured residency: SMs / S clusters
    assert rule(14336, 4096, bits=8, gs=-1, nofold=3 * one_mib // 2) == 3  # 1.75 MiB a CTA
    assert rule(8192, 8192, bits=8, gs=-1, nofold=3 * one_mib // 2) == 1  # 1 MiB a CTA: no split
    assert rule(512, 4096) == 1  # 4 k-tiles: no slice would keep two stages


def test_tail_rows():
    """TAIL: whole waves of tiles over weight rows [0, n0), the partial last wave's rows as split-K clusters; split 2
    where that wave fills at most half the SMs (the weight-only GEMM's rule), n0 in whole MC pairs of column tiles,
    nothing with SPLIT or TAIL 0, a forced split as given."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config, tail_rows

    cfg = dict(default_config(2048, 4608, 4096, 4096, 8), TAIL="auto")  # BM 256, MC 2: 8 x 36 tiles on 132 SMs
    assert (cfg["BM"], cfg["MC"]) == (256, 2)
    assert tail_rows(2048, 4608, cfg, 132) == (4096, 2)  # 2 waves are 33 column tiles: 32 pair up
    assert tail_rows(2048, 4608, dict(cfg, MC=1), 132) == (4224, 2)
    assert tail_rows(2048, 4608, dict(cfg, TAIL=0), 132) == (0, 0)
    assert tail_rows(2048, 4608, dict(cfg, SPLIT=2), 132) == (0, 0)
    assert tail_rows(2048, 4608, dict(cfg, TAIL=3), 132) == (4096, 3)
    assert tail_rows(2048, 4096, cfg, 132) == (0, 0)  # 256 tiles: the last wave 0.94 full
    assert tail_rows(2048, 4096, cfg, 300) == (0, 0)  # less than one wave
    with pytest.raises(ValueError, match="TAIL"):
        tail_rows(2048, 4608, dict(cfg, TAIL=9), 132)


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs,int_scales", [(8, -1, False), (4, 128, True), (4, 128, False)])
@pytest.mark.parametrize("mc", [1, 2])
@pytest.mark.parametrize("tail", ["auto", 4])
def test_gpu_tail_launch(bits, gs, int_scales, mc, tail):
    """TAIL (two launches: whole waves, then the rest as split-K clusters of 2 or 4 slices into the output's last
    columns) against one launch: bit-equal where the sums are int32 over K (per channel, integer group scales; the
    split adds them exactly), within the fp16 tolerance with the per-group fp32 fold; bias, clamp, an N past the last
    128-row block, eager and through the functional call; inputs untouched."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import tail_rows

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    k, m = 1024, 512
    bm = 256 if (bits == 8 or int_scales) else 128
    cfg = dict(BM=bm, NWG=2, STAGES=2 if bm == 256 else 4, KT=2, NP=1, CVT=0, MC=mc)
    # N: about a wave and a quarter of tiles (column tiles that pair up for MC 2), the last one of 40 rows
    n = (sms * 5 // 4 // -(-m // bm)) // (2 * mc) * (2 * mc) * 128 - 88
    n0, split = tail_rows(m, n, dict(cfg, TAIL=tail), sms)
    assert n0 and split == (2 if tail == "auto" else tail), (n, n0, split)
    per_token = int_scales
    y1, ref = _run(m, n, k, bits, gs, torch.float16, config=dict(cfg, TAIL=tail), seed=7, per_token=per_token,
                   int_scales=int_scales)
    y0, _ = _run(m, n, k, bits, gs, torch.float16, config=cfg, seed=7, per_token=per_token, int_scales=int_scales)
    if bits == 8 or int_scales:
        assert torch.equal(y1, y0)
    assert _rel(y1, ref) < 1e-3, _rel(y1, ref)


def test_tail_default_rule(monkeypatch):
    """Past the small-M tiles, the registry's config takes TAIL from K = tuning.A8_TAIL_MIN_K (where the split slices
    are long enough to pay): the most k-slices whose clusters, one per tile of the partial last wave, the GPU holds at
    once (the H100 table's 66 pairs, 39 triples, 30 quads), 0 without a partial wave; none below that K nor at small M
    (there the cluster split covers the SMs). (default_config's tiles: the token tiles are off here; with them, see
    test_token_tile_against_tail.)"""
    import dataclasses

    from mixgemm.kernels import cuda_wgmma_a8 as a8
    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.int8_activations import a8_problem

    monkeypatch.setattr(a8, "_token_tile_costs", lambda name: None)
    from mixgemm.tuning import A8_TAIL_MIN_K

    long_k = _qw(256, A8_TAIL_MIN_K, 8, -1)
    short_k = _qw(256, A8_TAIL_MIN_K // 2, 8, -1)

    def tail(m, qw, n):  # the config for an N-row layer of qw's format and K (the rule reads N, not the rows)
        return _wgmma_a8_config(dataclasses.replace(a8_problem(m, qw, torch.float16, H100, "sym", True), n=n))

    # M = 2048, BM 256 tiles in MC pairs: 8 x (N / 128) tiles, 264 in two whole waves (32 column tiles)
    assert tail(2048, long_k, 2304)["TAIL"] == 4  # 144 tiles: 16 in the partial wave
    assert tail(2048, long_k, 4608)["TAIL"] == 3  # 288: 32 (more than 30 quads)
    assert tail(2048, long_k, 5120)["TAIL"] == 2  # 320: 64 (more than 39 triples)
    assert tail(2048, long_k, 4096)["TAIL"] == 0  # 256: less than two waves, none after a whole one
    assert "TAIL" not in tail(2048, short_k, 4608)
    assert "TAIL" not in tail(16, long_k, 4608)


def test_token_tile_against_tail():
    """Where TAIL would take the default tile's partial wave (K >= tuning.A8_TAIL_MIN_K), the token tile counts that
    wave at 1 / split + tail_round of a round: on the H100, W8 per channel at M = 2048, K = 8192, N = 2304 (BM 256: 144
    CTAs, one wave and 12 split 4 ways) moves to a BM whose CTAs take two whole rounds, N = 4608 / 5120 (BM 256 with
    TAIL 3 / 2) keep BM 256 and their TAIL; at K = 36864, N = 4608, M = 1024 the default BM 128 (two waves and 24 CTAs
    split 4 ways) stays, where counting that wave as a whole round had sent it to BM 160 (measured 1.17x the time)."""
    import dataclasses

    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.int8_activations import a8_problem


    def cfg(m, k, n):
        qw = _qw(256, k, 8, -1)
        return _wgmma_a8_config(dataclasses.replace(a8_problem(m, qw, torch.float16, H100, "sym", True), n=n))

    moved = cfg(2048, 8192, 2304)
    assert moved["BM"] < 256 and moved["TAIL"] == 0 and -(-2048 // moved["BM"]) * 18 <= 2 * 132
    assert (cfg(2048, 8192, 4608)["BM"], cfg(2048, 8192, 4608)["TAIL"]) == (256, 3)
    assert (cfg(2048, 8192, 5120)["BM"], cfg(2048, 8192, 5120)["TAIL"]) == (256, 2)
    assert (cfg(1024, 36864, 4608)["BM"], cfg(1024, 36864, 4608)["TAIL"]) == (128, 4)


def test_token_tile_not_with_the_quantizer_in_the_launch():
    """A call that quantizes its activations in the GEMM's launch (FQ 1: small products, kernels/a8.quantizing_pays)
    keeps default_config's tile: its quantizer blocks hold SMs, and the token tiles were measured without them.
    512x4096 at M = 1024 (2^31 multiply-adds): BM 128 makes 256 CTAs, two rounds, which BM 256 would halve."""
    import dataclasses

    from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
    from mixgemm.kernels.cuda_wgmma_a8 import quantizing_pays
    from mixgemm.kernels.int8_activations import a8_problem

    assert quantizing_pays(1024, 4096, 512) and not quantizing_pays(1024, 4096, 1024)
    qw = _qw(256, 512, 8, -1)
    cfg = _wgmma_a8_config(dataclasses.replace(a8_problem(1024, qw, torch.float16, H100, "sym", True), n=4096))
    assert (cfg["FQ"], cfg["BM"]) == (1, 128)
    qw = _qw(256, 1024, 8, -1)
    cfg = _wgmma_a8_config(dataclasses.replace(a8_problem(1024, qw, torch.float16, H100, "sym", True), n=4096))
    assert cfg["FQ"] == 0 and cfg["BM"] > 128  # the same layer at K = 1024: two quantizer launches, one round of BM 256


def test_tail_split_rule_without_a_wave_model():
    """Without the table's cluster residency, split 2 where the partial wave's pairs fill at most half the SMs."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import default_config, tail_split_rule

    cfg = default_config(2048, 4608, 8192, 8192, 8)
    assert tail_split_rule(2048, 4608, cfg, 132, None) == 2  # 32 tail tiles
    assert tail_split_rule(2048, 5376, cfg, 132, None) == 0  # 336 tiles: 80 past two waves (n0 in MC pairs)
    assert tail_split_rule(2048, 4608, cfg, 132, {2: 66, 3: 39, 4: 30}) == 3


def _h100_token_costs():
    import mixgemm.tuning as tuning
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import TokenTileCosts

    return TokenTileCosts.parse(tuning.load_table("h100")["a8_tiles"], "h100.json a8_tiles")


def test_token_tile_from_the_wave_count():
    """The H100's a8_tiles move a tile whose last wave is partial to one that fills its rounds (4096x4608 at M =
    2048: BM 256 makes 288 CTAs, 3 rounds on 132 SMs), keep one that fills them (4096x4096: 256 CTAs, 2 rounds), and
    hand back a config whose stages fit the shared memory; below from_m, for the folding tiles, and for tiles the
    costs do not list, default_config's config stays."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import SMEM_LIMIT, default_config, stage_bytes, token_tile

    costs = _h100_token_costs()
    for bits, qs, gs in ((4, True, 128), (8, False, 4096)):
        base = default_config(2048, 4608, 4096, gs, bits, qs=qs)
        cfg = token_tile(2048, 4608, bits, bits == 8, qs, base, costs, 132)
        assert base["BM"] == 256 and cfg["BM"] < 256 and cfg["BM"] % 16 == 0
        table = costs.round_us[(("w4 qs" if bits == 4 else "w8 per channel"), 2)]

        def est(bm, table=table):  # rounds of 132 CTAs (36 column tiles) x the tile's round time
            return -(-(-(-2048 // bm) * 36) // 132) * table[bm]

        assert est(cfg["BM"]) * costs.margin < est(256) and -(-(-(-2048 // 256) * 36) // 132) == 3
        assert {k: v for k, v in cfg.items() if k not in ("BM", "STAGES")} == \
            {k: v for k, v in base.items() if k not in ("BM", "STAGES")}
        assert cfg["STAGES"] >= 2 and cfg["STAGES"] * stage_bytes(cfg["BM"], 2, bits, 2, bits == 8) + 1024 <= SMEM_LIMIT
        full = default_config(2048, 4096, 4096, gs, bits, qs=qs)
        assert token_tile(2048, 4096, bits, bits == 8, qs, full, costs, 132) == full
        # M = 512: BM 128 makes 144 CTAs, two rounds; BM 176 108, one round of a larger tile
        half = default_config(512, 4608, 4096, gs, bits, qs=qs)
        assert (half["BM"], token_tile(512, 4608, bits, bits == 8, qs, half, costs, 132)["BM"]) == (128, 176)
        # M = 256 on 4096x11008: BM 128 makes 172 CTAs, two rounds; BM 256 86, one round
        quarter = default_config(256, 11008, 4096, gs, bits, qs=qs)
        assert (quarter["BM"], token_tile(256, 11008, bits, bits == 8, qs, quarter, costs, 132)["BM"]) == (128, 256)
        below = costs.from_m // 2
        small = default_config(below, 11008, 4096, gs, bits, qs=qs)
        assert below >= 16 and token_tile(below, 11008, bits, bits == 8, qs, small, costs, 132) == small
    fold = default_config(2048, 4608, 4096, 128, 4)  # grouped int4 with the fold: BM <= 128, not a token tile
    assert token_tile(2048, 4608, 4, False, False, fold, costs, 132) == fold
    odd = dict(default_config(2048, 4608, 4096, 128, 4, qs=True), NWG=1)
    assert token_tile(2048, 4608, 4, False, True, odd, costs, 132) == odd


def test_token_tile_costs_refuse_bad_sections():
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import TokenTileCosts

    good = {"from_m": 1024, "margin": 1.05, "tail_round": 0.1, "round_us": {"w4 qs": {"mc1": {"128": 4.0, "256": 6.7}}},
            "source": "x"}
    parsed = TokenTileCosts.parse(good, "t")
    assert parsed.round_us == {("w4 qs", 1): {128: 4.0, 256: 6.7}} and parsed.tail_round == 0.1
    with pytest.raises(ValueError, match="source"):
        TokenTileCosts.parse(dict(good, source=""), "t")
    with pytest.raises(ValueError, match="unknown cost family"):
        TokenTileCosts.parse(dict(good, round_us={"w4 fold": {"mc1": {"128": 4.0}}}), "t")
    with pytest.raises(ValueError, match="multiple of 16"):
        TokenTileCosts.parse(dict(good, round_us={"w4 qs": {"mc1": {"200": 4.0}}}), "t")


def test_token_tile_in_the_registry():
    """The int8-activation entry hands the wgmma GEMM the token tile on a described H100 (mixgemm.explain's config):
    W8A8 per channel, 3584x4608 at M = 2048, BM 256 with MC 2 by default_config."""
    import mixgemm

    qw = _qw(4608, 3584, 8, -1, 0, "cpu")
    c = mixgemm.explain(torch.empty(2048, 3584, dtype=torch.float16), qw, act_mode="sym", device=H100)
    assert c.kernel == "cuda_wgmma_a8" and c.config["BM"] < 256 and c.config.get("MC") == 2, c
    assert "a8_tiles: BM 256 -> " in c.config_source and "288 -> " in c.config_source, c.config_source


def test_token_tile_on_the_h200_reads_its_own_table():
    """The H200's a8_tiles (its own table's section, checked there down to M = 256) move W4A8 per token with integer
    scales on 4096x11008 at M = 384 from BM 256 (172 CTAs: two rounds, the second 40 CTAs) to BM 128 (258 CTAs, two
    rounds of a tile half as long) as the H100's do."""
    import mixgemm
    import mixgemm.tuning as tuning
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import TokenTileCosts

    costs = TokenTileCosts.parse(tuning.load_table("h200")["a8_tiles"], "h200.json a8_tiles")
    assert costs.from_m <= 384 and costs.source
    qw = _qw(11008, 4096, 4, 128, int_scales=True)
    x = torch.empty(384, 4096, dtype=torch.float16)
    for dev in (H200, H100):
        c = mixgemm.explain(x, qw, act_mode="sym", act_block="token", device=dev)
        assert c.kernel == "cuda_wgmma_a8" and c.config["BM"] == 128, c
        assert "a8_tiles: BM 256 -> 128 " in c.config_source, c.config_source


@needs_sm90
@pytest.mark.gpu
@pytest.mark.parametrize("bm", [144, 160, 176, 192, 208, 224, 240])
@pytest.mark.parametrize("fmt", ["w8 per channel", "w4 qs"])
@pytest.mark.parametrize("mc", [1, 2])
def test_gpu_token_tiles(bm, fmt, mc):
    """The BMs a8_tiles ranks (multiples of 16 past 128, stages as token_tile sets them), per channel int8 and QS
    int4, with and without the activation multicast, on M that leaves a partial token tile and N a partial row tile."""
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import ring_stages

    bits, gs, qs = (8, -1, False) if fmt == "w8 per channel" else (4, 128, True)
    stages = ring_stages(bm, 2, bits, 2, gs == -1, 2, 4)
    cfg = dict(BM=bm, NWG=2, STAGES=stages, KT=2, NP=1, CVT=0, GROUP_M=8, MC=mc)
    for m, n, k in ((300, 1000, 1152), (129, 136, 768)):
        y, ref = _run(m, n, k, bits, gs, torch.float16, config=cfg, seed=m + bm, per_token=qs, int_scales=qs)
        assert _rel(y, ref) < 1e-3, (m, n, k, _rel(y, ref))
