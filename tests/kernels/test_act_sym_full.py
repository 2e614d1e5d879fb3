"""Activation mode "sym_full" (compressed-tensors' symmetric int8: absmax / 127.5, codes in [-128, 127], scale and
quotient in the activation's dtype; mixgemm.formats.activation).

CPU: the reference against a float64 re-implementation of compressed-tensors' formula (each step rounded once to the
activation dtype) and against compressed-tensors' own quantizer; the Triton quantizer and the Triton int8 GEMM under
TRITON_INTERPRET=1 (odd K, M = 1, 3, 17); the NVRTC compile of the CUDA quantizers' variant; a QuantLinear with it
saved and reloaded. GPU (@pytest.mark.gpu): every kernel of the registry that takes it (the CUDA row quantizer, the
fused GEMV, the Triton GEMM) against the reference, and the kernels that do not decline by name.
"""

from __future__ import annotations

import os

import pytest
import torch

from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.weight import quantize_weight

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_kernel = pytest.mark.skipif(not INTERP, reason="CPU kernel tests run under TRITON_INTERPRET=1 (no CUDA here)")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Fresh random rows of uneven ranges, a row of zeros and values on the code boundaries (x / d = c + 0.5)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[:, None]
    if m > 1:
        x[1] = 0.0
    if m > 2 and k > 4:
        x[2] = x[2].clamp(-15, 15)
        x[2, :4] = torch.tensor([127.5, -127.5, 2.5, -3.5]) * 0.125  # absmax 127.5 / 8: d = 1 / 8, exact ties
    return x.to(dtype)


def _float64_formula(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' dynamic per-token symmetric int8 (calculate_qparams, _quantize): scale = absmax /
    ((127 - -128) / 2) and q = round(clamp(x / scale, -128, 127)), each computed in float64 and rounded once to x's
    dtype, as x's dtype computes them; (codes as float64, scales as float64)."""
    x64 = x.double()
    amax = x64.abs().amax(-1, keepdim=True)
    scale = (amax / ((127 - -128) / 2)).to(x.dtype).double()
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = (x64 / safe).to(x.dtype).double()
    q = torch.round(y.clamp(-128, 127))
    return torch.where(scale == 0, torch.zeros_like(q), q), scale[:, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 67), (3, 333), (17, 64)])
def test_reference_is_compressed_tensors_formula(dtype, m, k):
    x = _x(m, k, dtype, m * k)
    x0 = x.clone()
    a = quantize_activation(x, -1, "sym_full")
    assert torch.equal(x, x0)
    q, scale = _float64_formula(x)
    assert torch.equal(a.q.double(), q)
    assert torch.equal(a.scales[:, 0].double(), scale)
    assert torch.equal(a.offsets, torch.zeros_like(a.offsets))
    assert torch.equal(a.sums, a.q.sum(-1, keepdim=True, dtype=torch.int32))
    assert int(a.q.min()) >= -128 and int(a.q.max()) <= 127
    if m > 2:
        assert a.q[2, :4].tolist() == [127, -128, 2, -4]  # clamped, and ties to even (-127.5 -> -128, 2.5 -> 2)
    if m > 1:
        assert not a.q[1].any()
    sym = quantize_activation(x, -1, "sym")
    assert not torch.equal(sym.q, a.q)  # the two schemes differ (absmax / 127, [-127, 127])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_compressed_tensors_own_quantizer(dtype):
    """compressed-tensors' own functions (what its forward runs on a Linear's input) give the same codes and the
    same dequantized activations."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize, quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    x = _x(17, 333, dtype, 5)[None]  # [batch, tokens, K], as a Linear sees it
    scale, zp = compute_dynamic_scales_and_zp(x, args, module=None)
    codes = quantize(x, scale, zp, args, dtype=torch.int8)
    a = quantize_activation(x[0], -1, "sym_full")
    assert torch.equal(a.q, codes[0])
    fake = fake_quantize(x, scale, zp, args)[0]
    assert torch.equal(a.dequantize().to(dtype), fake)


def test_reference_blocks_and_errors():
    """Per block of the weight's group too; the mode's name in the error of a bad one."""
    x = _x(3, 256, torch.float16, 1)
    a = quantize_activation(x, 64, "sym_full")
    for j in range(4):
        assert torch.equal(a.q[:, 64 * j: 64 * (j + 1)], quantize_activation(x[:, 64 * j: 64 * (j + 1)], -1,
                                                                             "sym_full").q)
    with pytest.raises(ValueError, match="sym_full"):
        quantize_activation(x, -1, "sym_half")


@needs_kernel
@pytest.mark.parametrize("m,k,block", [(m, k, b) for m in (1, 3, 17) for k, b in ((67, -1), (333, -1), (256, 32))]
                         + [(1, 4104, -1)])  # (the long-row kernel)
def test_triton_act_quant_exact(m, k, block):
    from mixgemm.kernels.triton.act_quant import act_quant

    for dtype in DTYPES:
        x = _x(m, k, dtype, m + k)
        r = quantize_activation(x, block, "sym_full")
        q, s, o, sm = act_quant(x, block, "sym_full")
        assert torch.equal(q, r.q), dtype
        assert torch.equal(s, r.scales), dtype
        assert torch.equal(o, r.offsets), dtype
        assert torch.equal(sm, r.sums), dtype


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 17])
def test_triton_a8_gemm_sym_full(m):
    """The Triton int8 GEMM after the Triton quantizer, per token over int8 per-channel weights (the compressed-tensors
    W8A8 layer) and over a grouped int4 one, against the block reference of the same codes."""
    from mixgemm.ops.int8 import matmul_a8
    from mixgemm.reference.block_gemm import block_int_gemm

    g = torch.Generator().manual_seed(m)
    for bits, group, k in ((8, -1, 333), (4, 64, 128)):
        qw = quantize_weight(torch.randn(40, k, generator=g) * 0.05, bits=bits, group_size=group, mode="sym")
        x = torch.randn(m, k, generator=g) * 2
        ref = block_int_gemm(quantize_activation(x, -1, "sym_full"), qw)
        y = matmul_a8(x, qw, "sym_full", out_dtype=torch.float32, force_kernel=True, act_block="token")
        assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
        other = block_int_gemm(quantize_activation(x, -1, "sym"), qw)
        assert (other - ref).abs().max() > 1e-4 * ref.abs().max()  # the mode is not ignored


def test_nvrtc_compiles_the_sym_full_quantizers():
    """The CUDA quantizers with A8_SF: the row quantizer, the fused GEMV's prologue (gemv_a8.cu) and the one on the
    int8 GEMM's layout (gemv_a8_wg.cu), for each activation dtype."""
    from mixgemm.kernels.cuda import act_quant_rows as aq
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda_gemv_a8 import gemv_a8 as ga
    from mixgemm.kernels.cuda_gemv_a8.layout import get_a8gemv_layout
    from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg as gw

    if not nvrtc.nvrtc_available():
        pytest.skip("cuda-bindings / libnvrtc not installed")
    qw = quantize_weight(torch.randn(64, 256) * 0.05, bits=8, group_size=-1, mode="sym")
    lay = get_a8gemv_layout(qw)
    cfg = ga.choose_config(1, 64, 1, 132, 8, 0)
    wg = {"A8_BITS": 8, "A8_M": 1, "A8_G": 0, "A8_AT": 0, "A8_RT": 1, "A8_U": 2, "A8_RG": 4, "A8_KS": 2, "A8_PF": 1,
          "A8_OPC": 0, "A8_MMA": 0}
    for xt in (0, 1, 2):
        rows = {"A8_ACTQ": 7, "A8_XT": xt, **aq.mode_defines("sym_full")}
        fused = ga.defines_for(lay, xt, 1, cfg, per_token=True, act_mode="sym_full")
        assert rows["A8_SF"] == fused["A8_SF"] == 1
        assert "A8_SF" not in ga.defines_for(lay, xt, 1, cfg, per_token=True)  # sym keeps its compile keys
        for source, defines, arch in ((aq.SOURCE, rows, "sm_90"), (ga.SOURCE, fused, "sm_80"),
                                      (gw.SOURCE, {**wg, "A8_XT": xt, "A8_SF": 1}, "sm_90")):
            assert len(nvrtc.compile_cubin(source, tuple(sorted(defines.items())), arch)), (source, xt)


def test_saved_and_reloaded_layer_keeps_the_mode(tmp_path):
    """A compressed-tensors W8A8 layer (sym_full, per token) through mixgemm's own format and state dicts."""
    from mixgemm.nn.linear import QuantLinear

    qw = quantize_weight(torch.randn(32, 64) * 0.05, bits=8, group_size=-1, mode="sym")
    layer = QuantLinear.from_quantized(qw, None, act_mode="sym_full", act_block="token")
    path = tmp_path / "layer.pt"
    torch.save(layer.state_dict(), path)
    c = layer.config
    shape = dict(bias=False, bits=8, group_size=-1, mode="sym", scale_dtype=c.scale_dtype, act_block="token")
    back = QuantLinear(64, 32, act_mode="sym_full", **shape)
    back.load_state_dict(torch.load(path))
    assert (back.act_mode, back.act_block) == ("sym_full", "token")
    wrong = QuantLinear(64, 32, act_mode="sym", **shape)
    with pytest.raises(ValueError, match="act_mode"):
        wrong.load_state_dict(torch.load(path))
    x = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.equal(back(x), layer(x))


# ------------------------------------------------------------------------------------------------------------ GPU
GPU_ENTRIES = ("cuda_gemv_a8", "cuda_gemv_a8_wg", "cuda_wgmma_a8", "triton_a8")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 4104), (3, 8192), (17, 4096), (3, 333), (17, 67)])
def test_gpu_quantizers_equal_the_reference(dtype, m, k):
    """The Triton quantizer and (K % 8 == 0) the CUDA row quantizer on the GPU: codes, scales and sums bit for bit."""
    from mixgemm.kernels.cuda.act_quant_rows import act_quant_rows
    from mixgemm.kernels.triton.act_quant import act_quant

    x = _x(m, k, dtype, m * k)
    r = quantize_activation(x, -1, "sym_full")
    got = [act_quant(x.cuda(), -1, "sym_full")]
    if k % 8 == 0:
        got.append(act_quant_rows(x.cuda(), "sym_full"))
    for q, s, o, sm in got:
        assert torch.equal(q.cpu(), r.q)
        assert torch.equal(s.cpu(), r.scales)
        assert torch.equal(o.cpu(), r.offsets)
        assert torch.equal(sm.cpu(), r.sums)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", GPU_ENTRIES)
@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gpu_entries_quantize_sym_full(entry, bits, group, dtype, m):
    """Each int8 entry of the registry, forced, on per-token "sym_full" activations (the compressed-tensors W8A8 layer:
    int8 per-channel weights; and int4 group 128) against the block reference of the reference's codes, both through
    the call plan (out dtype = x's) and the entry's run (float32 out); and "sym" codes would be off by far more."""
    from mixgemm.kernels.registry import kernel_options
    from mixgemm.ops.int8 import a8_choice, matmul_a8
    from mixgemm.reference.block_gemm import block_int_gemm

    g = torch.Generator().manual_seed(bits * 100 + m)
    n, k = 1000, 4096
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, bits=bits, group_size=group, mode="sym")
    x = (torch.randn(m, k, generator=g) * torch.linspace(0.1, 3, k)).to(dtype)
    ref = block_int_gemm(quantize_activation(x, -1, "sym_full"), qw)
    far = block_int_gemm(quantize_activation(x, -1, "sym"), qw)
    xc, qg = x.cuda(), qw.to("cuda")
    with kernel_options(force=entry):
        assert a8_choice(m, qg, dtype, xc.device, "sym_full", True).kernel == entry
        for out_dtype in (dtype, torch.float32):
            y = matmul_a8(xc, qg, "sym_full", out_dtype=out_dtype, act_block="token").double().cpu()
            tol = 1e-5 if out_dtype == torch.float32 else (4e-3 if dtype == torch.bfloat16 else 1e-3)
            err = (y - ref).abs().max() / ref.abs().max()
            assert err <= tol, (entry, out_dtype, float(err))
    assert (far - ref).abs().max() / ref.abs().max() > 5e-3  # every tolerance above tells the two schemes apart


@pytest.mark.gpu
def test_gpu_wgmma_in_launch_quantizer_is_sym_only():
    """The wgmma GEMM's in-launch quantizer (config FQ) is compiled for "sym": a sym_full call's config never asks
    for it, so the quantizer of the mode runs in its own launch."""
    from mixgemm.kernels.registry import kernel_options
    from mixgemm.ops.int8 import a8_choice

    qw = quantize_weight(torch.randn(512, 4096) * 0.02, bits=8, group_size=-1, mode="sym").to("cuda")
    dev = torch.device("cuda")
    with kernel_options(force="cuda_wgmma_a8"):
        for m in (1, 64, 512):
            choice = a8_choice(m, qw, torch.float16, dev, "sym_full", True)
            assert choice.kernel == "cuda_wgmma_a8" and not choice.config.get("FQ", 0), m
            assert not getattr(choice.launch, "quantizes", False), m
        # where "sym" quantizes in the GEMM's launch
        assert any(a8_choice(m, qw, torch.float16, dev, "sym", True).config.get("FQ", 0) for m in (1, 64, 512))
