"""Integer group scales (formats/int_scales.py): the quantizer, the factorization, the wgmma_a8_v1 tensors of the
int8 GEMM's QS mode, and its in-register dequantization of codes times multiples, all on the CPU."""

from __future__ import annotations

import pytest
import torch

from mixgemm.formats.int_scales import MAX_MULT, int_group_scales, quantize_weight_int_scales
from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1
from mixgemm.formats.weight import QuantConfig, dequantize_weight, from_codes, quantize_weight


def _w(n, k, seed=0, outliers=False):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    if outliers:  # a few large input channels, as in LLM activations' weights
        w[:, 5] *= 25
        w[:, k // 2] *= 8
    return w


def _err(qw, w) -> float:
    return float((dequantize_weight(qw, torch.float64) - w.double()).norm() / w.double().norm())


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("gs", [32, 64, 128, 256])
@pytest.mark.parametrize("outliers", [False, True])
def test_scales_factor_exactly(scale_dtype, gs, outliers):
    w = _w(37, 1024, seed=gs, outliers=outliers)
    w0 = w.clone()
    qw = quantize_weight_int_scales(w, group_size=gs, scale_dtype=scale_dtype)
    assert torch.equal(w, w0)  # input untouched
    assert qw.mode == "sym" and qw.bits == 4 and qw.scales.dtype == scale_dtype and qw.group_size == gs
    isc = int_group_scales(qw)
    assert isc is not None
    assert int(isc.mult.min()) >= 1 and int(isc.mult.max()) <= MAX_MULT
    assert torch.allclose(isc.step[:, None] * isc.mult.double(), qw.scales.double(), rtol=1e-12, atol=0)
    # at least as accurate as the plain max-abs / 7 scales (each group picks the better of two multiples)
    plain = quantize_weight(w, bits=4, group_size=gs, mode="sym", scale_dtype=scale_dtype)
    assert _err(qw, w) <= _err(plain, w) * 1.02, (_err(qw, w), _err(plain, w))


def test_quantizer_refuses():
    with pytest.raises(ValueError, match="need groups"):
        quantize_weight_int_scales(_w(8, 256), group_size=-1)
    w = _w(8, 256)
    w[3, 7] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        quantize_weight_int_scales(w)
    with pytest.raises(ValueError, match="group_size"):
        quantize_weight_int_scales(_w(8, 256), group_size=100)


def test_factorization_of_other_weights():
    w = _w(64, 1024, seed=3)
    assert int_group_scales(quantize_weight(w, bits=4, group_size=128, mode="sym")) is None  # free fp16 scales
    assert int_group_scales(quantize_weight(w, bits=8, group_size=128, mode="sym")) is None  # int8: c m overflows
    assert int_group_scales(quantize_weight(w, bits=4, group_size=-1, mode="sym")) is None  # nothing to fold
    # hand-made: steps times multiples, an all-zero row, a row whose largest group is 9 steps
    cfg = QuantConfig(bits=4, group_size=128, mode="sym", scale_dtype=torch.float32)
    mult = torch.randint(1, 17, (4, 8), generator=torch.Generator().manual_seed(0))
    mult[2] = torch.tensor([9, 1, 3, 9, 2, 5, 7, 4])
    step = torch.tensor([0.001, 0.25, 3e-5, 0.0], dtype=torch.float64)
    scales = step[:, None] * mult
    codes = torch.randint(0, 16, (4, 1024), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    isc = int_group_scales(from_codes(codes, scales.float(), cfg))
    assert isc is not None
    assert torch.allclose(isc.step[:, None] * isc.mult.double(), scales.float().double(), rtol=1e-6, atol=0)
    assert float(isc.step[3]) == 0.0
    scales[1, 3] *= 1.3  # no longer a multiple of the row's step
    assert int_group_scales(from_codes(codes, scales.float(), cfg)) is None


def test_layout_tensors():
    """wgmma_a8_v1 of an integer-scale weight: steps x multiples equal the dot scales (s / 16 for int4 codes 16 c);
    a plain weight has neither."""
    qw = quantize_weight_int_scales(_w(200, 512, seed=1), group_size=128)
    lay = build_wgmma_a8_v1(qw)
    assert lay.mults.dtype == torch.int32 and lay.mults.shape == lay.params.shape
    assert lay.channel_steps.shape == (lay.params.shape[0], 1, 8, 16)
    assert torch.allclose(lay.channel_steps * lay.mults.float() / 16, lay.params, rtol=1e-6, atol=0)
    plain = build_wgmma_a8_v1(quantize_weight(_w(200, 512, seed=1), bits=4, group_size=128, mode="sym"))
    assert plain.mults is None and plain.channel_steps is None


def test_register_dequantization():
    """The kernel's QS step on packed words: u = nibble ^ 8, (u m + (128 - 8 m) x 0x01010101) ^ 0x80808080 has byte
    i = c_i m as a signed int8, for every code c in -8..7 and multiple m in 1..16 (no carry crosses a byte)."""
    c = torch.arange(-8, 8, dtype=torch.int64)
    for m in range(1, MAX_MULT + 1):
        for rot in range(4):  # each code in each byte position, with three other codes beside it
            cs = torch.stack([c.roll(rot + j) for j in range(4)], dim=1)  # [16, 4]
            nib = cs & 0xF  # 4-bit two's complement, as the layout stores it
            word = (nib << torch.tensor([0, 8, 16, 24])).sum(1)  # the low nibbles of 4 bytes
            u = (word & 0x0F0F0F0F) ^ 0x08080808
            x = ((u * m + (128 - 8 * m) * 0x01010101) & 0xFFFFFFFF) ^ 0x80808080
            got = torch.stack([(x >> (8 * i)) & 0xFF for i in range(4)], dim=1)
            got = got - ((got & 0x80) << 1)
            assert torch.equal(got, cs * m), m


def test_quantize_api_int_scales():
    """quantize_ with W4A8(act_block="token") (int_scales by default) stores a weight whose scales factor (the QS
    kernel's input), at least as accurate as the plain weight (int_scales=False); per-group activations keep plain
    scales unless asked."""
    from torch import nn

    from mixgemm.quantize_api import W4A8, quantize_

    torch.manual_seed(0)
    lin = nn.Linear(512, 48)
    models = [nn.Sequential(lin), nn.Sequential(nn.Linear(512, 48))]
    models[1].load_state_dict(models[0].state_dict())
    quantize_(models[0], W4A8(act_block="token"))
    quantize_(models[1], W4A8(act_block="token", int_scales=False))
    qi, qp = (m[0].quantized_weight() for m in models)
    assert int_group_scales(qi) is not None and int_group_scales(qp) is None
    w = lin.weight.detach()
    assert _err(qi, w) <= _err(qp, w) * 1.02
    assert "int scales" in W4A8(act_block="token").name and W4A8(act_block="token").uses_int_scales
    assert not W4A8().uses_int_scales and W4A8(int_scales=True).uses_int_scales
    assert not W4A8(act_block="token", mode="zero_point").uses_int_scales
