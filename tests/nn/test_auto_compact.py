"""One resident layout by default: quantize_ / from_pretrained set QuantLinear.auto_compact, and a layer then keeps its
codes in one layout wherever it lands on a device whose kernels read one (an sm_90 GPU). On the CPU the policy is
checked with that device test pointed at the CPU (compact_ runs there too); the GPU tests run it for real."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import mixgemm
import mixgemm.nn.linear as linear_mod
from mixgemm.nn import QuantLinear


def _model(gen) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(256, 96), nn.ReLU(), nn.Linear(96, 64, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


@pytest.fixture
def cpu_keeps_one_layout(monkeypatch):
    """The CPU treated as a device whose kernels read one layout (as an sm_90 GPU)."""
    monkeypatch.setattr(linear_mod, "one_layout_device", lambda device: device.type in ("cpu", "cuda"))


def _layers(model):
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


def test_quantize_compacts_by_default(cpu_keeps_one_layout, torch_gen):
    model = _model(torch_gen)
    x = torch.randn(5, 256, generator=torch_gen)
    plain = copy.deepcopy(model)
    mixgemm.quantize_(plain, mixgemm.W4A16(group_size=32), compact=False)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert [q.compact for q in _layers(model)] == ["wgmma_v1", "wgmma_v1"]
    assert all(q.auto_compact for q in _layers(model))
    assert [q.compact for q in _layers(plain)] == [None, None] and not any(q.auto_compact for q in _layers(plain))
    assert torch.equal(model(x), plain(x))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values(),
                                                    strict=True))  # the plain interchange format either way
    assert set(mixgemm.resident_bytes(model)["layouts"]) == {"wgmma_v1"}


def test_auto_compact_follows_moves_copies_and_loads(cpu_keeps_one_layout, torch_gen):
    model = _model(torch_gen)
    mixgemm.quantize_(model, mixgemm.W8A16())
    x = torch.randn(3, 256, generator=torch_gen)
    y = model(x)
    model.to("cpu", torch.float32)  # moved as plain codes, kept in one layout again where it lands
    assert [q.compact for q in _layers(model)] == ["wgmma_v1", "wgmma_v1"] and torch.equal(model(x), y)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert [q.compact for q in _layers(twin)] == ["wgmma_v1", "wgmma_v1"] and torch.equal(twin(x), y)
    other = _model(torch_gen)
    mixgemm.quantize_(other, mixgemm.W8A16(), compact=False)
    model.load_state_dict(other.state_dict())
    assert [q.compact for q in _layers(model)] == ["wgmma_v1", "wgmma_v1"] and torch.equal(model(x), other(x))


def test_uncompact_keeps_the_plain_codes_from_then_on(cpu_keeps_one_layout, torch_gen):
    model = _model(torch_gen)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="zero_point"))
    first = _layers(model)[0]
    assert first.uncompact_() is first and first.compact is None and not first.auto_compact
    model.to("cpu")
    twin = copy.deepcopy(model)
    assert [q.compact for q in _layers(model)] == [None, "wgmma_v1"]
    assert [q.compact for q in _layers(twin)] == [None, "wgmma_v1"]


def test_explicit_compact_survives_moves_without_auto(cpu_keeps_one_layout, torch_gen):
    """compact_ on a layer built directly (auto_compact off) keeps its layout through a move as before."""
    q = QuantLinear.from_linear(nn.Linear(128, 32), bits=4, group_size=32)
    assert not q.auto_compact and q.compact is None
    q.compact_()
    q.to("cpu")
    assert q.compact == "wgmma_v1" and not q.auto_compact


def test_layers_that_cannot_compact_keep_their_codes_silently(cpu_keeps_one_layout, torch_gen, recwarn):
    model = _model(torch_gen)
    report = mixgemm.quantize_(model, mixgemm.W8A8(act_mode="asym"))
    assert len(report.replaced) == 2 and [q.compact for q in _layers(model)] == [None, None]
    model.to("cpu")
    assert [q.compact for q in _layers(model)] == [None, None]
    assert not [w for w in recwarn if "keeps its plain codes" in str(w.message)]


def test_cpu_keeps_the_plain_codes(torch_gen):
    """On the CPU (its kernels read the plain codes) the default leaves the codes plain, with the policy set for a
    move to a GPU."""
    model = _model(torch_gen)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert all(q.auto_compact and q.compact is None for q in _layers(model))
    model.to("cpu")
    assert all(q.compact is None for q in _layers(model))
    assert not linear_mod.one_layout_device(torch.device("cpu"))
    assert not linear_mod.one_layout_device(torch.device("meta"))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [mixgemm.W4A16(group_size=128), mixgemm.W8A8()], ids=["W4A16", "W8A8"])
def test_quantize_on_the_gpu_holds_one_layout(config):
    """quantize_ on an sm_90 GPU, and quantize_ on the CPU then .to("cuda"): each layer holds one layout, runs M 1..300
    against the same model quantized with compact=False within the fp16 tolerance, and stays <= 1.10x its packed
    size after every M ran."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("one resident layout by default on sm_90 GPUs")
    gen = torch.Generator().manual_seed(3)
    base = nn.Sequential(nn.Linear(1024, 768), nn.ReLU(), nn.Linear(768, 512))
    with torch.no_grad():
        for p in base.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.03)
    plain = copy.deepcopy(base).to("cuda", torch.float16)
    mixgemm.quantize_(plain, config, compact=False)
    on_gpu = copy.deepcopy(base).to("cuda", torch.float16)
    mixgemm.quantize_(on_gpu, config)
    moved = copy.deepcopy(base).half()
    mixgemm.quantize_(moved, config)
    assert all(q.compact is None for q in _layers(moved))
    moved.to("cuda")
    for model in (on_gpu, moved):
        assert all(q.compact is not None for q in _layers(model))
        for m in (1, 3, 16, 17, 300):
            x = torch.randn(m, 1024, generator=gen).to("cuda", torch.float16)
            want, got = plain(x).double(), model(x).double()
            assert float((got - want).norm() / want.norm()) <= 2e-3, m
        r = mixgemm.resident_bytes(model)
        assert len(r["layouts"]) == 1 and r["ratio"] <= 1.10, r


def test_sharding_a_compacted_layer_keeps_one_layout(cpu_keeps_one_layout, torch_gen, tmp_path):
    """tensor_parallel sharding takes an auto-compacted layer's plain codes and the shard keeps one layout again
    (a gloo world of one process, in this one)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from mixgemm.distributed import ColwiseParallel, RowwiseParallel

    model = _model(torch_gen)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    x = torch.randn(4, 256, generator=torch_gen)
    y = model(x)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        assert [q.compact for q in _layers(model)] == ["wgmma_v1", "wgmma_v1"]
        assert torch.equal(model(x), y)
    finally:
        dist.destroy_process_group()
