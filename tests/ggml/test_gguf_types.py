"""GGUF quantized types -> QuantizedWeight (mixgemm.ggml.gguf_types) against gguf's own dequantizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_fixtures import random_blocks, within_half_step
from mixgemm.formats.weight import dequantize_weight
from mixgemm.ggml.gguf_types import REQUANTIZED, ROUTES, route_of, to_quantized_weight

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
    group = 16 if qtype_name in ("Q6_K", "Q3_K", "Q2_K") else 32  # sub-blocks of 16: 8-bit groups of 16
    assert (qw.bits, qw.mode, qw.scales.dtype, qw.group_size) == (route.bits, route.mode, route.scale_dtype, group)
    got, want = dequantize_weight(qw, torch.float32), _oracle(raw, qtype_name, n, k)
    assert want.abs().max() > 0
    # sym types may differ only in the sign of a zero ((q - 8) * d with d < 0 gives -0.0 in gguf)
    assert torch.equal(got, want)
    if route.mode == "offset":
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit


KNOWN = [t for t in REQUANTIZED if hasattr(gguf.GGMLQuantizationType, t)]  # (an older gguf knows fewer)
SUB16 = ["Q6_K", "Q3_K", "Q2_K"]  # exact in groups of 16, re-quantized with requantize_bits=4


def _requantized(qtype_name, rng, bits):
    n, k = 6, 512
    raw = random_blocks(qtype_name, n, k, rng)
    qw = to_quantized_weight(raw, gguf.GGMLQuantizationType[qtype_name], (n, k), "w", requantize_bits=bits)
    got, want = dequantize_weight(qw, torch.float64), _oracle(raw, qtype_name, n, k).double()
    assert float(want.abs().max()) > 0 and not route_of(qtype_name, bits).exact
    return qw, got, want


@pytest.mark.parametrize("qtype_name", KNOWN)
def test_requantized_types_within_half_an_int8_step(qtype_name, rng):
    """Types without an exact form (codebooks, fp4, ternary) become 8-bit sym groups of 32 with
    float32 scales by default: every weight within half an int8 step of gguf's own dequantization."""
    qw, got, want = _requantized(qtype_name, rng, 8)
    assert (qw.bits, qw.mode, qw.scales.dtype, qw.group_size) == (8, "sym", torch.float32, 32)
    assert within_half_step(got, want, qw.scales, slack=1e-6, floor=0)
    assert float((got - want).abs().mean() / want.abs().mean()) < 0.01


@pytest.mark.parametrize("qtype_name", KNOWN + SUB16)
def test_requantized_to_4_bit_on_request(qtype_name, rng):
    """requantize_bits=4 (a low-bit file kept in its size class): 4-bit offset groups of 32, fp16 scales / offsets,
    every weight within half a step; the mean error the module docstring states (random blocks: <= 13%)."""
    qw, got, want = _requantized(qtype_name, rng, 4)
    assert (qw.bits, qw.mode, qw.scales.dtype, qw.group_size) == (4, "offset", torch.float16, 32)
    assert within_half_step(got, want, qw.scales)
    assert float((got - want).abs().mean() / want.abs().mean()) < 0.13


def test_requantize_bits_other_than_8_or_4_is_an_error(rng):
    raw = random_blocks("Q3_K", 4, 256, rng)
    with pytest.raises(ValueError, match="requantize_bits must be 8 or 4"):
        to_quantized_weight(raw, gguf.GGMLQuantizationType.Q3_K, (4, 256), "w", requantize_bits=3)
    exact = random_blocks("Q4_K", 4, 256, rng)  # exact types keep their form whatever the width asked
    qw = to_quantized_weight(exact, gguf.GGMLQuantizationType.Q4_K, (4, 256), "w", requantize_bits=8)
    assert (qw.bits, qw.mode) == (4, "offset")


def test_type_without_a_route_names_tensor_and_type():
    raw = np.zeros((4, 34 * 256 // 32), dtype=np.uint8)  # Q8_1: an activation type, never a weight in a file
    with pytest.raises(ValueError, match=r"'blk.3.attn_q.weight'.*Q8_1.*cannot hold"):
        to_quantized_weight(raw, gguf.GGMLQuantizationType.Q8_1, (4, 256), "blk.3.attn_q.weight")


@pytest.mark.parametrize("qtype_name", ["Q3_K", "Q6_K"])
def test_non_finite_weights_are_errors(qtype_name, rng):
    raw = random_blocks(qtype_name, 4, 256, rng)
    raw[1, -2:] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # row 1's super-block d
    with pytest.raises(ValueError, match=r"'w'.*row 1.*non-finite d"):
        to_quantized_weight(raw, gguf.GGMLQuantizationType[qtype_name], (4, 256), "w")
    with pytest.raises(ValueError, match=rf"'w'.*{qtype_name}.*non-finite weight \(row 1"):  # re-quantized
        to_quantized_weight(raw, gguf.GGMLQuantizationType[qtype_name], (4, 256), "w", requantize_bits=4)
    q2 = random_blocks("Q2_K", 4, 256, rng)
    q2[2, 82:84] = np.array([np.nan], dtype=np.float16).view(np.uint8)  # row 2's dmin
    with pytest.raises(ValueError, match=r"'w'.*row 2.*non-finite dmin"):
        to_quantized_weight(q2, gguf.GGMLQuantizationType.Q2_K, (4, 256), "w")


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
