"""GPTQ checkpoints (AutoGPTQ / GPTQModel, transformers' ``quant_method: "gptq"``).

Per quantized linear ``<prefix>``: ``qweight`` int32 [K * bits / 32, N] (codes packed along K, code k of a
column in field k % (32 / bits) of word k // (32 / bits)); ``qzeros`` int32 [G, N * bits / 32] (zero points
packed along N the same way); ``scales`` fp16 [G, N]; ``g_idx`` int32 [K] (the group of each input feature),
optional ``bias`` [N]. The weight is w[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n], where the zero
point z is the stored one + 1 in the original format (``checkpoint_format: "gptq"``, "v1") and the stored one
in GPTQModel's ``"gptq_v2"``.

Lossless: codes, zero points and fp16 scales are taken over unchanged (symmetric layers, every zero
2**(bits-1), become mode "sym"). Act-order (``desc_act``) layers, whose g_idx scatters the groups over K,
get their K sorted by group once here (``ConvertedLinear.input_perm``). Not held: 2 / 3-bit weights, group
sizes other than 32 / 64 / 128 / 256 / per-channel, and v1 zero points that decode to 2**bits (a zero of 0
stored as -1), each a ValueError naming the tensor.
"""

from __future__ import annotations

import torch

from mixgemm.checkpoints.base import ConvertedLinear, TensorSource
from mixgemm.checkpoints.packed_int32 import (
    PackedInt32Format,
    act_order_perm,
    check_bits,
    check_int32,
    group_count,
    to_quantized_weight,
    unpack_int32,
)

_V1, _V2 = "gptq", "gptq_v2"


class GPTQFormat(PackedInt32Format):
    name = "gptq"
    layer_tensors = (".qweight", ".qzeros")

    def convert_linear(self, source: TensorSource, prefix: str, quantization_config: dict) -> ConvertedLinear:
        qc = quantization_config
        # transformers' GPTQConfig writes checkpoint_format, GPTQModel's own quantize_config writes format
        fmt = str(qc.get("checkpoint_format", qc.get("format", _V1))).lower()
        if fmt not in (_V1, _V2):
            raise ValueError(f"{prefix}: GPTQ checkpoint_format {fmt!r} is not supported (only {_V1!r} and "
                             f"{_V2!r}: the other formats pack the weight differently)")
        bits = check_bits(qc.get("bits"), f"{prefix}.qweight (GPTQ bits)")
        group_size = int(qc.get("group_size", 128))

        qweight = check_int32(source.get(prefix + ".qweight"), prefix + ".qweight")
        qzeros = check_int32(source.get(prefix + ".qzeros"), prefix + ".qzeros")
        scales = source.get(prefix + ".scales")
        keys = set(source.keys())
        if scales.dim() == 2 and qweight.shape[1] != scales.shape[1]:
            raise ValueError(f"{prefix}.qweight: shape {tuple(qweight.shape)} is not [K * {bits} / 32, N] for the "
                             f"N = {scales.shape[1]} of {prefix}.scales {tuple(scales.shape)}"
                             + (" (it looks transposed)" if qweight.shape[0] == scales.shape[1] else ""))
        n = qweight.shape[1]
        k = qweight.shape[0] * 32 // bits
        g_idx = source.get(prefix + ".g_idx") if prefix + ".g_idx" in keys else None
        if g_idx is not None and g_idx.dim() == 1 and g_idx.numel() != k:
            # K is not a multiple of 32 / bits: the last word is padded; g_idx has the true K
            k = g_idx.numel()
        g, ng = group_count(k, group_size, f"{prefix}.qweight (GPTQ group_size)")
        if scales.dim() != 2 or tuple(scales.shape) != (ng, n):
            raise ValueError(f"{prefix}.scales: expected shape {(ng, n)} for K={k}, N={n}, group size {g}, "
                             f"got {tuple(scales.shape)}")
        codes = unpack_int32(qweight, bits, k, 0, prefix + ".qweight").T  # [N, K]
        zeros = unpack_int32(qzeros, bits, n, 1, prefix + ".qzeros").T.to(torch.int32)  # [N, G]
        if tuple(zeros.shape) != (n, ng):
            raise ValueError(f"{prefix}.qzeros: expected {ng} groups, got shape {tuple(qzeros.shape)}")
        if fmt == _V1:
            zeros = zeros + 1
            if bool((zeros > (1 << bits) - 1).any()):
                raise ValueError(f"{prefix}.qzeros: a v1 zero point decodes to {1 << bits} (stored "
                                 f"{(1 << bits) - 1} = z - 1, a zero of 0 wrapped around): outside the {bits}-bit "
                                 "range, mixgemm cannot hold it")

        perm = None
        if g_idx is not None:
            perm = act_order_perm(g_idx.to(codes.device), g, prefix + ".g_idx")
        if perm is not None:
            codes = codes.index_select(1, perm)
        weight = to_quantized_weight(codes, scales.T, zeros, bits, group_size, prefix)
        bias = source.get(prefix + ".bias") if prefix + ".bias" in keys else None
        return ConvertedLinear(weight=weight, bias=bias, input_perm=perm)


GPTQ = GPTQFormat()
