"""One resident layout per weight: QuantLinear.compact_ / uncompact_, mixgemm.compact_, and what reads a compacted
weight (the dispatcher, the CPU path, state_dict, copies, moves, sharding, the memory summary)."""

from __future__ import annotations

import copy
import ctypes

import pytest
import torch
from torch import nn

import mixgemm
import mixgemm.reference as ref
from mixgemm.formats.layouts import build_gemv_mma_v1
from mixgemm.formats.weight import QuantConfig
from mixgemm.kernels.registry import DeviceInfo, NoKernel
from mixgemm.nn import QuantLinear
from mixgemm.ops.custom_ops import weight_from_tensors

H100 = DeviceInfo("cuda", 0, (9, 0), 132, "NVIDIA H100 80GB HBM3", 227 * 1024)
FORMATS = [(4, 32, "sym"), (4, 128, "zero_point"), (4, -1, "offset"), (8, -1, "sym"), (8, 64, "zero_point"),
           (8, 128, "offset")]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _layer(k, n, bits, group, mode, gen, bias=True, **kw):
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * 0.02)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return QuantLinear.from_linear(lin, QuantConfig(bits=bits, group_size=group, mode=mode), **kw)


@pytest.mark.parametrize("bits,group,mode", FORMATS)
def test_compact_keeps_results_and_checkpoint(bits, group, mode, torch_gen):
    """Odd N, K past a whole k-tile: every M (0 too) gives the same result before and after, the state dict is the
    plain one, the plain codes' memory is gone and only the wgmma_v1 layout is held."""
    k = 200 if group == -1 else 384  # per-channel: K not a multiple of the 64-k tile (padded in the layout)
    q = _layer(k, 75, bits, group, mode, torch_gen)
    xs = {m: torch.randn(m, k, generator=torch_gen) for m in (0, 1, 3, 17, 129)}
    before = {m: q(x) for m, x in xs.items()}
    sd = {k: v.clone() for k, v in q.state_dict().items()}
    assert q.compact_() is q and q.compact == "wgmma_v1"
    for m, x in xs.items():
        assert torch.equal(q(x), before[m]), m
    after = q.state_dict()
    assert set(after) == set(sd) and all(torch.equal(after[k], sd[k]) for k in sd)
    assert after["qweight"].is_contiguous() and after["qweight"].shape == sd["qweight"].shape
    r = mixgemm.resident_bytes(q)
    assert set(r["layouts"]) == {"wgmma_v1"} and r["plain"] == q.quantized_weight().nbytes()
    assert r["plain_held"] == r["plain"] - sd["qweight"].numel() + 1  # the placeholder's one byte
    with pytest.raises(ValueError, match="keeps only its wgmma_v1 layout"):
        q.quantized_weight().layout("gemv_mma_v1", build_gemv_mma_v1)


def test_compact_memory_within_the_target(torch_gen):
    """A model-sized layer holds at most 1.10x its packed size once compacted (plain: 1x, plus every kernel layout
    built: up to 3x); the int8 one too."""
    for bits, group in ((4, 128), (8, -1)):
        q = _layer(1024, 512, bits, group, "sym", torch_gen, bias=False)
        q.compact_()
        assert mixgemm.resident_bytes(q)["ratio"] <= 1.10


def test_compact_load_copy_move_uncompact(torch_gen):
    q = _layer(256, 96, 4, 64, "zero_point", torch_gen)
    other = _layer(256, 96, 4, 64, "zero_point", torch_gen)
    x = torch.randn(5, 256, generator=torch_gen)
    plain = q.qweight.clone()
    q.compact_()
    q.load_state_dict(other.state_dict())  # loads the plain codes and keeps them in the layout again
    assert q.compact == "wgmma_v1" and torch.equal(q(x), other(x))
    from mixgemm.ops.dispatch import plans_of

    plans_of(q.quantized_weight())["a prepared launch"] = ctypes.c_void_p(1)  # (GPU plans hold ctypes parameters)
    twin = copy.deepcopy(q)
    assert twin.compact == "wgmma_v1" and torch.equal(twin(x), other(x))
    assert not plans_of(twin.quantized_weight())  # a copy starts without the original's plans
    q.to("cpu")
    assert q.compact == "wgmma_v1" and torch.equal(q(x), other(x))
    q.load_state_dict({**other.state_dict(), "qweight": plain})
    assert q.uncompact_() is q and q.compact is None and torch.equal(q.qweight, plain)
    assert torch.equal(twin(x), other(x))  # the copy is its own


def test_compact_follows_in_place_parameter_updates(torch_gen):
    """The layout carries the parameters too: scales changed in place are read from the module again."""
    q = _layer(256, 40, 4, 128, "sym", torch_gen)
    ref_layer = copy.deepcopy(q)
    x = torch.randn(3, 256, generator=torch_gen)
    q.compact_()
    with torch.no_grad():
        q.scales.mul_(2)
        ref_layer.scales.mul_(2)
    assert torch.equal(q(x), ref_layer(x))


def test_compact_dispatch_reads_only_the_resident_layout(torch_gen):
    """On a Hopper GPU (described) every M runs from wgmma_v1: the tensor-core GEMV on it up to the GEMM crossover,
    the wgmma GEMM above; the entries that read other layouts say why they decline; fp32 activations, which only such
    entries take, get an error naming the layout."""
    q = _layer(4096, 4096, 4, 128, "sym", torch_gen, bias=False)  # M = 1 fp16 takes the CUDA-core GEMV otherwise
    qw = q.quantized_weight()
    assert mixgemm.explain(torch.empty(1, 4096, dtype=torch.float16), qw, device=H100).kernel == "cuda_gemv"
    q.compact_()
    qw = q.quantized_weight()
    for m, kernel in ((1, "cuda_gemv_mma"), (8, "cuda_gemv_mma"), (16, "cuda_gemv_mma"), (4096, "cuda_wgmma")):
        for dtype in (torch.float16, torch.bfloat16):
            c = mixgemm.explain(torch.empty(m, 4096, dtype=dtype), qw, device=H100)
            assert (c.kernel, c.layout) == (kernel, "wgmma_v1"), (m, dtype, str(c))
    c = mixgemm.explain(torch.empty(64, 4096, dtype=torch.float16), qw, device=H100)
    assert c.kernel == "cuda_wgmma"
    with pytest.raises(NoKernel, match="keeps only its wgmma_v1 layout"):
        mixgemm.explain(torch.empty(1, 4096), qw, device=H100)
    with mixgemm.kernel_options(disable="cuda_gemv_mma"):
        c = mixgemm.explain(torch.empty(1, 4096, dtype=torch.float16), qw, device=H100)
        assert c.kernel == "cuda_wgmma" and "reads gemv_v2; this weight keeps only" in dict(c.declined)["cuda_gemv"]


def test_compact_refusals_and_placeholder_misuse(torch_gen):
    a8 = _layer(128, 32, 8, -1, "sym", torch_gen, act_mode="sym")
    with pytest.raises(ValueError, match="weight-only layers"):
        a8.compact_()
    q = _layer(128, 32, 4, 32, "sym", torch_gen).compact_()
    with pytest.raises(ValueError, match="uncompact_"):
        q.compact_("gemv_mma_v1")
    # the placeholder handed to the ops without the layer's cached weight: a clear error, never zeros for codes
    stray = q.qweight.clone().as_strided(q.qweight.shape, (0, 0))
    with pytest.raises(ValueError, match="placeholder of a compacted layer"):
        weight_from_tensors(stray, q.scales, None, None, 4, 32, "sym", 32, 128)


def test_compact_shard_takes_the_plain_codes(torch_gen):
    from mixgemm.distributed.shard import shard_quantized_weight

    q = _layer(256, 64, 4, 64, "sym", torch_gen)
    full = q.quantized_weight()
    want = [shard_quantized_weight(full, dim, 1, 2) for dim in (0, 1)]
    q.compact_()
    got = [shard_quantized_weight(q.quantized_weight(), dim, 1, 2) for dim in (0, 1)]
    for w, g in zip(want, got, strict=True):
        assert g.resident is None and torch.equal(g.qweight, w.qweight) and torch.equal(g.scales, w.scales)


def test_compact_model_skips_int8_activation_layers(torch_gen):
    model = nn.Sequential(_layer(128, 64, 4, 32, "sym", torch_gen), nn.ReLU(),
                          _layer(64, 32, 8, -1, "sym", torch_gen, act_mode="sym"))
    x = torch.randn(2, 128, generator=torch_gen)
    y = model(x)
    assert mixgemm.compact_(model) == 1 and mixgemm.compact_(model) == 0
    assert model[0].compact == "wgmma_v1" and model[2].compact is None
    assert torch.equal(model(x), y)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,mode", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compact_cuda_every_m(bits, group, mode, dtype):
    """On the GPU a compacted layer runs every M from wgmma_v1 (odd N, bias, against the float64 reference on the same
    codes), holds <= 1.10x its packed size after all of them ran (torch.cuda memory statistics), and writes the
    plain state dict."""
    gen = torch.Generator().manual_seed(7)
    q = _layer(2048, 1000, bits, group, mode, gen).to("cuda", dtype)
    qw_plain = q.quantized_weight()
    sd = {k: v.cpu() for k, v in q.state_dict().items()}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    packed = qw_plain.nbytes()
    q.compact_()
    del qw_plain
    for m in (1, 3, 8, 16, 17, 256, 1000):
        x = torch.randn(m, 2048, generator=gen).to("cuda", dtype)
        y = q(x)
        r = ref.matmul(x, q.quantized_weight(), q.bias, None, out_dtype=torch.float64)
        err = float((y.double() - r).norm() / r.norm())
        assert err <= TOL[dtype], (m, err)
        assert mixgemm.explain(x, q.quantized_weight()).layout == "wgmma_v1"
        del x, y, r
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base + packed  # the plain tensors were counted in base
    assert held <= 1.10 * packed, held / packed
    assert all(torch.equal(v.cpu(), sd[k]) for k, v in q.state_dict().items())
