"""AWQ checkpoints (AutoAWQ's GEMM packing, transformers' ``quant_method: "awq"``, ``version: "gemm"``).

Per quantized linear ``<prefix>``: ``qweight`` int32 [K, N / 8] and ``qzeros`` int32 [G, N / 8], 4-bit codes
packed along N with AutoAWQ's interleaved order: field i of word j holds output channel 8 j + [0, 2, 4, 6, 1,
3, 5, 7][i]; ``scales`` fp16 [G, N]; optional ``bias`` [N]. The weight is w[n, k] = (q[k, n] - z[k // group,
n]) * s[k // group, n].

Lossless: codes, zero points and scales are taken over unchanged (mode "zero_point", or "sym" when every zero
is 8). ``zero_point: false`` (symmetric, GPTQModel's default AWQ export, which stores every zero as the midpoint
8) loads as mode "sym"; stored zeros other than 8 under it are a ValueError. Not held: bits other than 4, group
sizes other than 32 / 64 / 128 / 256 / per-channel, the GEMV / Marlin packings, each a ValueError naming the
tensor.
"""

from __future__ import annotations

from mixgemm.checkpoints.base import ConvertedLinear, TensorSource
from mixgemm.checkpoints.packed_int32 import (
    PackedInt32Format,
    check_bits,
    check_int32,
    group_count,
    to_quantized_weight,
    unpack_int32,
)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's WQLinear_GEMM.pack: field i holds channel AWQ_ORDER[i]


class AWQFormat(PackedInt32Format):
    name = "awq"
    layer_tensors = (".qweight", ".qzeros")

    def convert_linear(self, source: TensorSource, prefix: str, quantization_config: dict) -> ConvertedLinear:
        qc = quantization_config
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"{prefix}: AWQ version {version!r} is not supported (only the 'gemm' packing)")
        bits = check_bits(qc.get("bits", qc.get("w_bit", 4)), f"{prefix}.qweight (AWQ bits)")
        if bits != 4:
            raise ValueError(f"{prefix}.qweight: AWQ GEMM packing is 4-bit only, the config says {bits}")
        symmetric = not qc.get("zero_point", True)
        group_size = int(qc.get("group_size", qc.get("q_group_size", 128)))

        qweight = check_int32(source.get(prefix + ".qweight"), prefix + ".qweight")
        qzeros = check_int32(source.get(prefix + ".qzeros"), prefix + ".qzeros")
        scales = source.get(prefix + ".scales")
        if scales.dim() != 2:
            raise ValueError(f"{prefix}.scales: expected 2 dimensions [G, N], got shape {tuple(scales.shape)}")
        k = qweight.shape[0]
        n = scales.shape[1]
        g, ng = group_count(k, group_size, f"{prefix}.qweight (AWQ group_size)")
        if scales.shape[0] != ng:
            raise ValueError(f"{prefix}.scales: expected {ng} groups for K={k} and group size {g}, "
                             f"got shape {tuple(scales.shape)}")
        codes = unpack_int32(qweight, bits, n, 1, prefix + ".qweight", order=AWQ_ORDER).T  # [N, K]
        zeros = unpack_int32(qzeros, bits, n, 1, prefix + ".qzeros", order=AWQ_ORDER).T  # [N, G]
        if tuple(zeros.shape) != (n, ng):
            raise ValueError(f"{prefix}.qzeros: expected shape {(ng, -(-n // 8))}, got {tuple(qzeros.shape)}")
        if symmetric and not bool((zeros == 1 << (bits - 1)).all()):
            raise ValueError(f"{prefix}.qzeros: the config says zero_point=false (symmetric), but the stored zeros "
                             f"are {int(zeros.min())} .. {int(zeros.max())}, not all {1 << (bits - 1)}")
        weight = to_quantized_weight(codes, scales.T, zeros, bits, group_size, prefix)
        bias = source.get(prefix + ".bias") if prefix + ".bias" in set(source.keys()) else None
        return ConvertedLinear(weight=weight, bias=bias)


AWQ = AWQFormat()
