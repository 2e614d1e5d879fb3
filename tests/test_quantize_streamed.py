"""Quantize-on-load streams a float weight to the device in row slices (loader.quantize_streamed): the result equals
quantizing the weight whole, in every precision, for slices that split it unevenly."""

import pytest
import torch

import mixgemm
from mixgemm.checkpoints import loader
from mixgemm.quantize_api import scheme_weight


@pytest.mark.parametrize("config", [mixgemm.W4A16(), mixgemm.W4A16(group_size=32, mode="zero_point"),
                                    mixgemm.W8A16(), mixgemm.W8A8(), mixgemm.W4A8(act_block="token")],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_streamed_quantization_equals_whole(config, dtype, monkeypatch, torch_gen):
    w = torch.randn(300, 256, generator=torch_gen).to(dtype)
    before = w.clone()
    monkeypatch.setattr(loader, "CHUNK_ELEMENTS", 128 * 256)  # slices of 128 rows: 128, 128, 44
    got = loader.quantize_streamed(w, config, "cpu", "layer")
    want = scheme_weight(w, config)
    assert torch.equal(w, before)
    assert got.config == want.config and tuple(got.shape) == tuple(want.shape)
    for field in ("scales", "zeros", "offsets"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), field
    assert torch.equal(got.packed(), want.packed())
