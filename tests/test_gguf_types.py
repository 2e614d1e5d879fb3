"""GGUF quantized types -> QuantizedWeight (mixgemm.ggml.gguf_types) against gguf's own dequantizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_fixtures import random_blocks
from mixgemm.formats.weight import dequantize_weight
from mixgemm.ggml.gguf_types import ROUTES, to_quantized_weight

gguf = pytest.importorskip("gguf")
EXACT = [t for t, r in ROUTES.items() if r.exact]


def _oracle(raw, qtype_name, n, k):
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype_name]).reshape(n, k))


@pytest.mark.parametrize("qtype_name", EXACT)
@pytest.mark.parametrize("shape", [(3, 256), (17, 768)])
def test_exact_types_equal_gguf(qtype_name, shape, rng):
    n, k = shape
    raw = random_blocks(qtype_name, n, k, rng)
    qw = to_quantized_weight(raw, gguf.GGMLQuantizationType[qtype_name], (n, k), "w")
    route = ROUTES[qtype_name]
    assert (qw.bits, qw.mode, qw.scales.dtype, qw.group_size) == (route.bits, route.mode, route.scale_dtype, 32)
    got, want = dequantize_weight(qw, torch.float32), _oracle(raw, qtype_name, n, k)
    assert want.abs().max() > 0
    # sym types may differ only in the sign of a zero ((q - 8) * d with d < 0 gives -0.0 in gguf)
    assert torch.equal(got, want)
    if route.mode == "offset":
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit


def test_q6_k_requantized_within_half_an_int8_step(rng):
    n, k = 24, 512
    raw = random_blocks("Q6_K", n, k, rng)
    qw = to_quantized_weight(raw, gguf.GGMLQuantizationType.Q6_K, (n, k), "w")
    assert (qw.bits, qw.mode, qw.scales.dtype) == (8, "sym", torch.float32) and not ROUTES["Q6_K"].exact
    got, want = dequantize_weight(qw, torch.float64), _oracle(raw, "Q6_K", n, k).double()
    step = qw.scales.double().repeat_interleave(32, dim=1)
    assert bool(((got - want).abs() <= step / 2 * (1 + 1e-6)).all())
    rel = float((got - want).abs().mean() / want.abs().mean())
    assert 0 < rel < 0.01  # documented: about 0.5% of the mean |w|


@pytest.mark.parametrize("qtype_name", ["Q2_K", "Q3_K"])
def test_unsupported_type_names_tensor_and_type(qtype_name, rng):
    raw = random_blocks(qtype_name, 4, 256, rng)
    with pytest.raises(ValueError, match=rf"'blk.3.attn_q.weight'.*{qtype_name}"):
        to_quantized_weight(raw, gguf.GGMLQuantizationType[qtype_name], (4, 256), "blk.3.attn_q.weight")


def test_truncated_bytes_and_bad_scales_are_errors(rng):
    raw = random_blocks("Q4_K", 4, 256, rng)
    with pytest.raises(ValueError, match="'w'.*truncated"):
        to_quantized_weight(raw.reshape(-1)[:-10], gguf.GGMLQuantizationType.Q4_K, (4, 256), "w")
    bad = raw.copy()
    bad[2, 0:2] = np.array([np.nan], dtype=np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="'w'.*row 2.*non-finite d"):
        to_quantized_weight(bad, gguf.GGMLQuantizationType.Q4_K, (4, 256), "w")
    with pytest.raises(ValueError, match="not a multiple"):
        to_quantized_weight(raw, gguf.GGMLQuantizationType.Q4_K, (8, 128), "w")


def test_input_not_modified(rng):
    raw = random_blocks("Q5_K", 4, 256, rng)
    before = raw.copy()
    to_quantized_weight(raw, gguf.GGMLQuantizationType.Q5_K, (4, 256), "w")
    assert np.array_equal(raw, before)
