"""Empty batches (M = 0) return [..., 0, N] on every path: weight-only and int8-activation linears, convolutions with
batch 0, on the CPU and on CUDA; the CUDA dispatchers return before any kernel math (their tile rules divide by M)."""

from __future__ import annotations

import pytest
import torch

import mixgemm
from mixgemm import QuantConfig, quantize_conv_weight, quantize_weight
from mixgemm.ops.conv import conv2d_a8
from mixgemm.ops.int8 import make_a8_runner, matmul_a8

N, K = 48, 128
CASES = [(4, 32, "sym"), (4, 64, "zero_point"), (8, -1, "sym"), (8, 128, "offset")]


def _weight(bits, group_size, mode, device="cpu"):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(bits * 7 + group_size))
    return quantize_weight(w, QuantConfig(bits=bits, group_size=group_size, mode=mode)).to(device)


def _lead_shapes():
    return [(0,), (3, 0), (0, 5)]


def _check_empty(y, lead, dtype):
    assert tuple(y.shape) == (*lead, N)
    assert y.dtype == dtype


@pytest.mark.parametrize("bits,group_size,mode", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul_empty_cpu(bits, group_size, mode, dtype):
    qw = _weight(bits, group_size, mode)
    for lead in _lead_shapes():
        _check_empty(mixgemm.matmul(torch.randn(*lead, K).to(dtype), qw), lead, dtype)


@pytest.mark.parametrize("bits,group_size,mode", CASES)
def test_cuda_dispatch_returns_before_kernels(bits, group_size, mode):
    """The CUDA dispatcher's empty-batch return comes before any kernel choice, so it answers for CPU tensors too."""
    from mixgemm.ops.dispatch import cuda_matmul

    qw = _weight(bits, group_size, mode)
    for lead in _lead_shapes():
        _check_empty(cuda_matmul(torch.randn(*lead, K).half(), qw, None, "relu"), lead, torch.float16)


@pytest.mark.parametrize("bits,group_size,mode", CASES)
@pytest.mark.parametrize("act_block", ["group", "token"])
def test_matmul_a8_empty(bits, group_size, mode, act_block, monkeypatch):
    qw = _weight(bits, group_size, mode)
    for lead in _lead_shapes():
        x = torch.randn(*lead, K).half()
        _check_empty(matmul_a8(x, qw, act_block=act_block), lead, torch.float16)
        _check_empty(matmul_a8(x, qw, act_block=act_block, out_dtype=torch.float32), lead, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel branch (force_kernel) returns before any launch too
    _check_empty(matmul_a8(torch.randn(0, K).half(), qw, "asym", act_block=act_block, force_kernel=True), (0,),
                 torch.float16)
    assert tuple(make_a8_runner(torch.randn(0, K).half(), qw, act_block=act_block)().shape) == (0, N)


@pytest.mark.parametrize("scheme", ["W4A16", "W8A16", "W8A8", "W4A8"])
def test_quantlinear_empty(scheme):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, N))
    kw = {"act_block": "token"} if scheme == "W4A8" else {}
    mixgemm.quantize_(model, getattr(mixgemm, scheme)(**kw))
    for lead in _lead_shapes():
        x = torch.randn(*lead, K)
        _check_empty(model(x), lead, torch.float32)
    x = torch.randn(0, K, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and tuple(x.grad.shape) == (0, K)


@pytest.mark.parametrize("groups,ci", [(1, 8), (8, 8), (2, 64)])
def test_conv_batch0(groups, ci):
    co = 16
    cw = quantize_conv_weight(torch.randn(co, ci // groups, 3, 3), QuantConfig(bits=4, group_size=-1))
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(0, ci, 6, 6).to(memory_format=fmt)
        y = mixgemm.conv2d(x, cw, padding=1, groups=groups)
        assert tuple(y.shape) == (0, co, 6, 6)
        if ci // groups > 1:
            assert tuple(conv2d_a8(x, cw, padding=1, groups=groups).shape) == (0, co, 6, 6)


def test_cuda_conv_returns_before_path_choice():
    """cuda_conv2d's empty-batch return precedes pick_path (whose tables index by M) and every launch."""
    from mixgemm.ops.conv import cuda_conv2d

    cw = quantize_conv_weight(torch.randn(16, 64, 1, 1), QuantConfig(bits=4, group_size=64))
    x = torch.randn(0, 64, 5, 5).half().to(memory_format=torch.channels_last)
    y = cuda_conv2d(x, cw, None, (1, 1), (0, 0), (1, 1), 1, 0.0, float("inf"))
    assert tuple(y.shape) == (0, 16, 5, 5) and y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group_size,mode", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_empty_cuda(bits, group_size, mode, dtype):
    qw = _weight(bits, group_size, mode, "cuda")
    for lead in _lead_shapes():
        x = torch.randn(*lead, K, device="cuda").to(dtype)
        _check_empty(mixgemm.matmul(x, qw), lead, dtype)
        for act_block in ("group", "token"):
            _check_empty(matmul_a8(x, qw, act_block=act_block), lead, dtype)
    conv_group = group_size if group_size != -1 and 64 % group_size == 0 else -1  # a group lies inside one tap
    cw = quantize_conv_weight(torch.randn(64, 64, 3, 3), QuantConfig(bits=bits, group_size=conv_group, mode=mode))
    cw = cw.to("cuda")
    x = torch.randn(0, 64, 7, 7, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    assert tuple(mixgemm.conv2d(x, cw, padding=1).shape) == (0, 64, 7, 7)
    assert tuple(conv2d_a8(x, cw, padding=1).shape) == (0, 64, 7, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["W4A16", "W8A16", "W8A8", "W4A8"])
def test_quantlinear_empty_cuda(scheme):
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048)).half().cuda()
    kw = {"act_block": "token"} if scheme == "W4A8" else {}
    mixgemm.quantize_(model, getattr(mixgemm, scheme)(**kw))
    assert tuple(model(torch.randn(0, 2048, device="cuda", dtype=torch.float16)).shape) == (0, 2048)
    compiled = torch.compile(model, fullgraph=True)
    assert tuple(compiled(torch.randn(2, 0, 2048, device="cuda", dtype=torch.float16)).shape) == (2, 0, 2048)
