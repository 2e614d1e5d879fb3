"""8-bit weights in groups of 16 (mixgemm.formats.weight.NARROW_GROUP: GGUF's Q6_K / Q3_K / Q2_K held exactly): the
format, the CPU paths against the float64 reference, the layers' state dict and checkpoint round trip, and the clear
refusals where no kernel takes them (4-bit, the CUDA layouts and compaction, int8 activations, convolutions). The
Triton GEMM runs them (tests/kernels/test_gemm.py), the CUDA entries decline them (tests/kernels/test_registry.py)."""

from __future__ import annotations

import pytest
import torch

import mixgemm
from mixgemm import QuantConfig, quantize_weight
from mixgemm.formats.weight import MODES, SCALE_DTYPES, dequantize_weight, from_codes
from mixgemm.nn.linear import QuantLinear
from mixgemm.reference.matmul import matmul as ref_matmul

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _weight(n, k, mode, seed=0, scale_dtype=torch.float32):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return w, quantize_weight(w, bits=8, group_size=16, mode=mode, scale_dtype=scale_dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_format_within_half_a_step(mode, scale_dtype):
    w, qw = _weight(5, 48, mode, scale_dtype=scale_dtype)
    assert (qw.group_size, qw.num_groups, tuple(qw.scales.shape)) == (16, 3, (5, 3))
    step = qw.scales.double().repeat_interleave(16, dim=1)
    assert bool(((dequantize_weight(qw, torch.float64) - w.double()).abs() <= step / 2 * (1 + 1e-3) + 1e-9).all())
    again = from_codes(qw.codes(), qw.scales, qw.config, zeros=qw.zeros, offsets=qw.offsets)
    assert torch.equal(dequantize_weight(again), dequantize_weight(qw))


def test_four_bit_and_other_narrow_groups_are_errors():
    with pytest.raises(ValueError, match="group_size=16 is for 8-bit weights only"):
        QuantConfig(bits=4, group_size=16)
    with pytest.raises(ValueError, match="group_size=16 is for 8-bit weights only"):
        mixgemm.W4A16(group_size=16)
    with pytest.raises(ValueError, match="W8A8 cannot hold group_size=16"):
        mixgemm.W8A8(group_size=16)
    with pytest.raises(ValueError, match="group_size must be one of"):
        QuantConfig(bits=8, group_size=8)


@pytest.mark.parametrize("mode", ["sym", "offset"])
@pytest.mark.parametrize("n", [37, 64])
def test_cpu_matmul_against_the_reference(mode, n, rel_err):
    """mixgemm.matmul on the CPU (torch's kernels in bfloat16 where they take it, the dequantizing fallback
    otherwise), K a multiple of 16 but not of 32, M 1 / 3 / 17, with bias and activation; inputs not modified."""
    _, qw = _weight(n, 80, mode, seed=n)
    route = mixgemm.explain(torch.empty(1, 80, dtype=torch.bfloat16), qw).entry.name
    assert route == ("cpu_torch_kernels" if n % 16 == 0 else "cpu_dequant")  # (torch's int4 layout: N % 16 == 0)
    g = torch.Generator().manual_seed(1)
    b = torch.randn(n, generator=g) * 0.1
    for m in (1, 3, 17):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            x = torch.randn(2, m, 80, generator=g).to(dtype)
            x0 = x.clone()
            y = mixgemm.matmul(x, qw, b.to(dtype), "relu")
            assert torch.equal(x, x0) and y.dtype == dtype and y.shape == (2, m, n)
            ref = ref_matmul(x, qw, b.to(dtype), "relu", out_dtype=torch.float64)
            assert rel_err(y, ref) <= TOL[dtype], (m, dtype)


def test_layer_state_dict_and_checkpoint_round_trip(tmp_path):
    """A W8A16 group-16 model saves and loads back bit for bit (mixgemm's own format), through mixgemm.from_pretrained
    and transformers' AutoModelForCausalLM."""
    from transformers import AutoModelForCausalLM

    from mixgemm.integrations.hf import llama_config, random_llama

    model = random_llama(llama_config(hidden_size=64, intermediate_size=128))
    mixgemm.quantize_(model, mixgemm.W8A16(group_size=16, mode="offset", scale_dtype=torch.float32))
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, QuantLinear) and layer.config.group_size == 16 and layer.scales.shape == (64, 8)
    fresh = QuantLinear(128, 64, bias=False, bits=8, group_size=16, mode="offset", scale_dtype=torch.float32)
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(3, 128)
    assert torch.equal(fresh(x), layer(x))
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(0))
    for loaded in (mixgemm.from_pretrained(str(tmp_path), progress=False),
                   AutoModelForCausalLM.from_pretrained(tmp_path)):
        back = loaded.model.layers[0].mlp.down_proj
        assert isinstance(back, QuantLinear) and back.config == layer.config
        assert torch.equal(back.dequantize(torch.float32), layer.dequantize(torch.float32))
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_cuda_layouts_compaction_and_int8_activations_refuse_them():
    from mixgemm.kernels.cuda.rows_layout import build_rows_v1
    from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2
    from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1
    from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1

    _, qw = _weight(32, 64, "sym")
    for build in (build_gemv_v2, build_gemv_mma_v1, build_wgmma_v1, build_rows_v1):
        with pytest.raises(ValueError, match="groups of 16"):
            build(qw)
    layer = QuantLinear.from_quantized(qw)
    for layout in (None, "rows_v1"):
        assert "groups of 16" in layer.compact_reason(layout)
        with pytest.raises(ValueError, match="groups of 16"):
            layer.compact_(layout)
    layer.set_auto_compact(True)  # (on the CPU: nothing to compact)
    assert layer.compact is None
    with pytest.raises(ValueError, match="act_mode='sym' with group_size=16"):
        QuantLinear.from_quantized(qw, act_mode="sym")


def test_convolutions_refuse_them():
    from torch import nn

    from mixgemm.nn.conv import QuantConv2d

    with pytest.raises(ValueError, match="group_size=16 is for linear weights"):
        mixgemm.quantize_conv_weight(torch.randn(8, 32, 3, 3), bits=8, group_size=16)
    with pytest.raises(ValueError, match="group_size=16 is for linear weights"):
        QuantConv2d(32, 8, 3, bits=8, group_size=16)
    with pytest.raises(ValueError, match="group_size=16 is for linear weights"):
        QuantConv2d.from_conv(nn.Conv2d(32, 8, 3), bits=8, group_size=16)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sym", "offset"])
def test_gpu_layer_runs_the_triton_gemm(mode, rel_err):
    """A group-16 QuantLinear on the GPU (sm_90: auto-compaction declines it) runs the Triton GEMM at every M, within
    the kernel tests' bound of the float64 reference; a forced CUDA kernel is an error naming groups of 16."""
    from mixgemm.kernels.registry import NoKernel

    _, qw = _weight(1001, 1040, mode, seed=3)
    layer = QuantLinear.from_quantized(qw.to("cuda"))
    layer.set_auto_compact(True)
    assert layer.compact is None
    g = torch.Generator().manual_seed(2)
    for m in (1, 3, 17, 129):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            x = torch.randn(m, 1040, generator=g).to("cuda", dtype)
            assert mixgemm.explain(x, layer.quantized_weight()).kernel == "triton_gemm"
            with torch.no_grad():
                y = layer(x)
            assert rel_err(y, ref_matmul(x, layer.quantized_weight(), out_dtype=torch.float64)) <= TOL[dtype]
    x = torch.randn(1, 1040, device="cuda", dtype=torch.float16)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for name in ("cuda_gemv_mma", "cuda_gemv") + (("cuda_wgmma",) if hopper else ()):
        with mixgemm.kernel_options(force=name), pytest.raises(NoKernel, match="groups of 16"):
            mixgemm.matmul(x, qw.to("cuda"))


def test_fused_parts_of_groups_of_16_and_32_meet_exactly():
    """A fused layer whose parts are a group-16 weight and a 4-bit group-32 one (a GGUF expert's Q6_K beside a Q4_K):
    both as 8-bit offset groups of 16, exactly; other differing group sizes stay an error."""
    from mixgemm.checkpoints.conversions import common_format

    _, narrow = _weight(8, 64, "sym")
    wide = quantize_weight(torch.randn(8, 64), bits=4, group_size=32, mode="offset", scale_dtype=torch.float32)
    out = common_format([narrow, wide], "layer")
    assert {(w.bits, w.group_size, w.mode) for w in out} == {(8, 16, "offset")}
    for got, want in zip(out, (narrow, wide), strict=True):
        assert torch.equal(dequantize_weight(got), dequantize_weight(want))
    with pytest.raises(ValueError, match="different group sizes"):
        common_format([wide, quantize_weight(torch.randn(8, 64), bits=4, group_size=64)], "layer")
