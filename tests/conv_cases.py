"""Random conv test cases shared by test_conv.py and test_conv_int8.py (fresh data, never zeros)."""

from __future__ import annotations

import torch

from mixgemm import quantize_conv_weight
from mixgemm.formats.weight import QuantConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_conv_case(b, ci, h, w, co, k, groups, dtype, channels_last, bits, gs, mode, seed, bias=True):
    """(x [b, ci, h, w] in dtype (channels_last if asked), QuantizedConvWeight of a [co, ci/groups, kh, kw] weight
    with std 0.02, bias [co] or None), all on DEV; k is an int or (kh, kw)."""
    g = torch.Generator().manual_seed(seed)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = torch.randn(b, ci, h, w, generator=g).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    wt = torch.randn(co, ci // groups, kh, kw, generator=g) * 0.02
    qw = quantize_conv_weight(wt, QuantConfig(bits=bits, group_size=gs, mode=mode))
    bt = (torch.randn(co, generator=g) * 0.1).to(dtype) if bias else None
    return x.to(DEV), qw.to(DEV), None if bt is None else bt.to(DEV)


TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def assert_conv_matches(y, ref, x, x_before, rel_err):
    """y (kernel output) against ref (reference on the CPU): shape, dtype and memory format equal, relative error
    within the dtype's tolerance, and the input x unchanged (x_before: its clone taken before the call)."""
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert y.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)
    err = rel_err(y.cpu(), ref)
    assert err <= TOL[x.dtype], f"rel err {err:.2e}"
    assert torch.equal(x, x_before)
