"""Fixture packers and reference dequantizers for GPTQ and AWQ checkpoints, written from the libraries' own code
(no CPU build of auto-gptq / gptqmodel / autoawq is installable), independently of mixgemm.checkpoints: plain
loops and bit operations the way the libraries pack, and their torch dequantization formulas.

* ``gptq_pack`` mirrors AutoGPTQ ``nn_modules/qlinear/qlinear_cuda_old.py`` ``QuantLinear.pack`` (numpy uint32
  words, ``qweight[row] |= intweight[j] << (bits * (j - i))``; v1 stores ``zeros - 1``); GPTQModel's
  TorchQuantLinear.pack writes the same words, and its ``gptq_v2`` format stores the zeros themselves.
* ``gptq_dequant`` mirrors the torch dequantization of the same module (``torch.bitwise_right_shift`` by
  ``wf``, ``& (2**bits - 1)``, ``zeros + 1`` in v1, ``scales[g_idx] * (weight - zeros[g_idx])`` in fp16).
* ``awq_pack`` mirrors AutoAWQ ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear`` (order map
  [0, 2, 4, 6, 1, 3, 5, 7], ``qweight[:, col] |= qweight_col << (i * w_bit)``).
* ``awq_dequant`` mirrors AutoAWQ ``awq/utils/packing_utils.py`` ``unpack_awq`` + ``reverse_awq_order``
  (AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]) + ``dequantize_gemm``.
"""

from __future__ import annotations

import numpy as np
import torch

AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


class DictSource(dict):
    """A TensorSource over a dict of tensors."""

    def get(self, name):  # noqa: D102  (TensorSource.get raises on a missing name, like dict[...])
        return self[name]


def random_codes(n, k, bits, gen):
    return torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.int64)


def random_scales(shape, dtype, gen):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.02 + 0.001).to(dtype)


def act_order_g_idx(k, group_size, gen):
    """What desc_act gives: the input features in a random (activation) order, cut into groups of group_size."""
    return (torch.randperm(k, generator=gen) // group_size).to(torch.int32)


# ---- GPTQ ----------------------------------------------------------------------------------------------
def gptq_pack(codes_nk: torch.Tensor, zeros_ng: torch.Tensor, bits: int, v1: bool):
    """(qweight int32 [K * bits / 32, N], qzeros int32 [G, N * bits / 32]) from codes [N, K] and real zeros [N, G]."""
    per = 32 // bits
    intweight = codes_nk.T.contiguous().numpy().astype(np.uint32)  # [K, N]
    qweight = np.zeros((intweight.shape[0] // per, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + per):
            qweight[row] |= intweight[j] << (bits * (j - i))
        i += per
        row += 1
    zeros = zeros_ng.T.contiguous().numpy().astype(np.int64)  # [G, N]
    if v1:
        zeros = zeros - 1
    zeros = zeros.astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // per), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + per):
            qzeros[:, col] |= zeros[:, j] << (bits * (j - i))
        i += per
        col += 1
    return torch.from_numpy(qweight.view(np.int32).copy()), torch.from_numpy(qzeros.view(np.int32).copy())


def gptq_dequant(qweight, qzeros, scales, g_idx, bits: int, v1: bool) -> torch.Tensor:
    """The float weight [N, K] (scales' dtype) as the GPTQ library's torch path computes it."""
    per = 32 // bits
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    zeros = torch.bitwise_right_shift(qzeros.unsqueeze(2).expand(-1, -1, per), wf.view(1, 1, -1)).to(torch.int16)
    zeros = torch.bitwise_and(zeros, (2**bits) - 1).reshape(qzeros.shape[0], -1)
    if v1:
        zeros = zeros + 1
    weight = torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, per, -1), wf.view(1, -1, 1)).to(torch.int16)
    weight = torch.bitwise_and(weight, (2**bits) - 1).reshape(-1, qweight.shape[-1])  # [K, N]
    g = g_idx.long()
    return (scales[g] * (weight - zeros[g])).T


def gptq_tensors(n, k, bits, group_size, gen, *, sym=False, v1=True, act_order=False, scale_dtype=torch.float16,
                 prefix="layer", bias=False):
    """A random GPTQ layer: (tensors dict, reference float weight [N, K])."""
    g = k if group_size == -1 else group_size
    ng = -(-k // g)  # AutoGPTQ: ceil(K / group) scale rows, the last group partial
    codes = random_codes(n, k, bits, gen)
    if sym:
        zeros = torch.full((n, ng), 1 << (bits - 1), dtype=torch.int64)
    else:  # v1 cannot store a zero of 0 (z - 1 wraps)
        zeros = torch.randint(1 if v1 else 0, 1 << bits, (n, ng), generator=gen)
    scales = random_scales((ng, n), scale_dtype, gen)
    g_idx = act_order_g_idx(k, g, gen) if act_order else (torch.arange(k) // g).to(torch.int32)
    qweight, qzeros = gptq_pack(codes, zeros, bits, v1)
    t = {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": scales,
         f"{prefix}.g_idx": g_idx}
    if bias:
        t[f"{prefix}.bias"] = torch.randn(n, generator=gen).to(scale_dtype)
    return t, gptq_dequant(qweight, qzeros, scales, g_idx, bits, v1)


# ---- AWQ -----------------------------------------------------------------------------------------------
def awq_pack_rows(int_kn: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 [R, N / 8]: rows of ints [R, N] packed along N in AutoAWQ's interleaved order."""
    per = 32 // bits
    int_kn = int_kn.to(torch.int32)
    # WQLinear_GEMM's buffer shape, out_features // (32 // w_bit) (from_linear writes N // 32 * w_bit, the same
    # for its N, a multiple of 32)
    packed = torch.zeros((int_kn.shape[0], int_kn.shape[1] // per), dtype=torch.int32)
    for col in range(int_kn.shape[1] // per):
        for i in range(per):
            packed[:, col] |= int_kn[:, col * per + AWQ_ORDER_MAP[i]] << (i * bits)
    return packed


def awq_dequant(qweight, qzeros, scales, group_size: int, bits: int = 4) -> torch.Tensor:
    """The float weight [N, K] as AutoAWQ's dequantize_gemm computes it."""
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    reverse = torch.arange(iweights.shape[-1], dtype=torch.int32).view(-1, 32 // bits)[:, AWQ_REVERSE_ORDER].view(-1)
    iweights = iweights[:, reverse] & ((2**bits) - 1)
    izeros = izeros[:, reverse] & ((2**bits) - 1)
    g = qweight.shape[0] if group_size == -1 else group_size
    s = scales.repeat_interleave(g, dim=0)
    z = izeros.repeat_interleave(g, dim=0)
    return ((iweights - z) * s).T


def awq_tensors(n, k, group_size, gen, prefix="layer", bias=False):
    g = k if group_size == -1 else group_size
    codes = random_codes(n, k, 4, gen)
    zeros = torch.randint(0, 16, (n, k // g), generator=gen)
    scales = random_scales((k // g, n), torch.float16, gen)
    qweight, qzeros = awq_pack_rows(codes.T), awq_pack_rows(zeros.T)
    t = {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": scales}
    if bias:
        t[f"{prefix}.bias"] = torch.randn(n, generator=gen).to(torch.float16)
    return t, awq_dequant(qweight, qzeros, scales, group_size)
