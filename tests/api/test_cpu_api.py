"""Small API items: short reprs, the top-level QuantConv2d export, quantize_ on float64 models."""

from __future__ import annotations

import torch
from torch import nn

import mixgemm
from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.conv import quantize_conv_weight
from mixgemm.formats.weight import quantize_weight


def test_quantized_weight_repr_is_short(torch_gen):
    qw = quantize_weight(torch.randn(96, 512, generator=torch_gen), bits=4, group_size=128, mode="zero_point")
    r = repr(qw)
    assert r == str(qw)
    assert r == ("QuantizedWeight(shape=(96, 512), bits=4, group_size=128, mode='zero_point', "
                 f"scale_dtype=torch.float16, device=cpu, nbytes={qw.nbytes()})")
    assert "tensor(" not in r
    pc = quantize_weight(torch.randn(8, 64, generator=torch_gen), bits=8, group_size=-1)
    assert "group_size=per-channel" in repr(pc) and "bits=8" in repr(pc)


def test_conv_and_activation_reprs_are_short(torch_gen):
    qcw = quantize_conv_weight(torch.randn(8, 32, 3, 3, generator=torch_gen), bits=4, group_size=32)
    assert "tensor(" not in repr(qcw) and "QuantizedWeight(shape=(8, 288)" in repr(qcw)
    a = quantize_activation(torch.randn(3, 64, generator=torch_gen), 32)
    assert repr(a) == "QuantizedActivation(shape=(3, 64), block_size=32, mode='sym', device=cpu)"


def test_quantconv2d_exported():
    from mixgemm.nn import QuantConv2d

    assert mixgemm.QuantConv2d is QuantConv2d
    assert mixgemm.QuantLinear is not None


def test_quantize_skips_float64_layers(torch_gen):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Conv2d(32, 16, 1)).double()
    keep = nn.Linear(64, 32)
    model.append(nn.Sequential(keep))  # a float32 layer inside a float64 model is still quantized
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert report.replaced == ["3.0"]
    assert set(report.skipped) == {"0", "2"}
    assert all("float64" in why and "model.float()" in why for why in report.skipped.values())
    assert type(model[0]) is nn.Linear and type(model[2]) is nn.Conv2d
    x = torch.randn(2, 64, generator=torch_gen, dtype=torch.float64)
    assert model[0](x).dtype == torch.float64  # the untouched layers still run
    assert model[3](x.float()).shape == (2, 32)
