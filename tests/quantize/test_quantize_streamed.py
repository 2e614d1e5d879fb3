"""Quantize-on-load streams a float weight to the device in row slices (loader.quantize_streamed): the result equals
quantizing the weight whole, in every precision, for slices that split it unevenly."""

import os

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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_slices_read_from_the_file_equal_the_tensor(dtype, tmp_path, torch_gen):
    """On a GPU the loader reads a float weight's row slices straight from the safetensors file (source.extent, at
    offset + first row * K * element size) into pinned buffers: the bytes of each slice are the tensor's rows."""
    from safetensors.torch import save_file

    from mixgemm.checkpoints.safetensors_source import SafetensorsSource

    tensors = {"a.weight": torch.randn(300, 72, generator=torch_gen).to(dtype),
               "b.weight": torch.randn(5, 3, generator=torch_gen).to(dtype), "ids": torch.arange(7)}
    save_file(tensors, tmp_path / "model.safetensors")
    source = SafetensorsSource(str(tmp_path))
    assert source.extent("ids") is None  # not a float tensor: read through the memory map
    for key in ("a.weight", "b.weight"):
        ext, want = source.extent(key), tensors[key]
        assert (ext.dtype, ext.shape) == (dtype, tuple(want.shape))
        k, size = want.shape[1], want.element_size()
        fd = os.open(ext.path, os.O_RDONLY)
        try:
            for r in range(0, want.shape[0], 128):
                rows = want[r:r + 128]
                raw = torch.empty(rows.numel() * size, dtype=torch.uint8)
                loader._read_into(fd, raw, ext.offset + r * k * size, ext.path)
                assert torch.equal(raw.view(dtype).view(rows.shape), rows)
            with pytest.raises(OSError, match="the file ends"):
                loader._read_into(fd, torch.empty(64, dtype=torch.uint8), os.path.getsize(ext.path) - 8, ext.path)
        finally:
            os.close(fd)
