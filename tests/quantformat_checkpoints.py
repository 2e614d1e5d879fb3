"""Per-format checkpoint tensors of one quantized layer, written the way GPTQ (v1; v2 with act-order), AWQ and
compressed-tensors write them (quantformat_fixtures' packers, compressed-tensors' own compressor), with the
library's dequantization in its scale dtype (``native``) and in float32 (``exact``): the cases the checkpoint tests
(tests/checkpoints/test_quantformats_models.py) and the mixture-of-experts loading tests (tests/nn/test_experts.py)
write."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.checkpoints.awq import AWQ
from mixgemm.checkpoints.compressed_tensors import COMPRESSED_TENSORS
from mixgemm.checkpoints.gptq import GPTQ
from mixgemm.formats.weight import QuantConfig, quantize_weight
from quantformat_fixtures import act_order_g_idx, awq_dequant, awq_pack_rows, gptq_dequant, gptq_pack


@dataclass
class Case:
    name: str
    fmt: object
    quantization_config: dict


CASES = [
    Case("gptq-v1-sym-g128", GPTQ, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                    "sym": True, "checkpoint_format": "gptq", "damp_percent": 0.01,
                                    "true_sequential": True, "static_groups": False}),
    Case("gptq-v2-actorder-g32", GPTQ, {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                                        "sym": False, "checkpoint_format": "gptq_v2"}),
    Case("awq-g128", AWQ, {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128,
                           "zero_point": True, "modules_to_not_convert": None}),
    Case("ct-int4-g128-sym", COMPRESSED_TENSORS, {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                      "format": "pack-quantized",
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 128, "dynamic": False,
                                                  "actorder": None, "observer": "minmax"}}}}),
    Case("ct-int8-channel-asym", COMPRESSED_TENSORS, {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["re:.*_proj$"],
                                      "weights": {"num_bits": 8, "type": "int", "symmetric": False,
                                                  "strategy": "channel", "group_size": None}}}}),
]


def _codes(w: torch.Tensor, bits: int, group: int, sym: bool, g_idx: torch.Tensor | None = None):
    """Codes [N, K], zero points [N, G] and fp16 scales [N, G] of w, grouped by g_idx (default k // group)."""
    order = torch.argsort(g_idx, stable=True) if g_idx is not None else torch.arange(w.shape[1])
    qw = quantize_weight(w[:, order], QuantConfig(bits=bits, group_size=group, mode="sym" if sym else "zero_point"))
    codes = torch.empty_like(qw.codes())
    codes[:, order] = qw.codes()
    return codes.long(), qw.zero_points().long(), qw.scales


# Layers that read the same tensor share GPTQ's act-order g_idx (the same Hessian of their inputs): q / k / v, gate / up
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}


def _gptq(prefix, w, qc, gen, shared):
    bits, group, v1 = qc["bits"], qc["group_size"], qc["checkpoint_format"] == "gptq"
    k = w.shape[1]
    if qc["desc_act"]:
        parent, _, child = prefix.rpartition(".")
        key = (parent.rpartition(".")[0], SHARED_INPUT[child]) if child in SHARED_INPUT else prefix
        g_idx = shared.setdefault(key, act_order_g_idx(k, group, gen)).clone()
    else:
        g_idx = (torch.arange(k) // group).to(torch.int32)
    codes, zeros, scales = _codes(w, bits, group, qc["sym"], g_idx)
    qweight, qzeros = gptq_pack(codes, zeros, bits, v1)
    t = {"qweight": qweight, "qzeros": qzeros, "scales": scales.T.contiguous(), "g_idx": g_idx}
    native = gptq_dequant(qweight, qzeros, t["scales"], g_idx, bits, v1)
    exact = gptq_dequant(qweight, qzeros, t["scales"].float(), g_idx, bits, v1)
    return t, native, exact


def _awq(prefix, w, qc, gen, shared):
    codes, zeros, scales = _codes(w, 4, qc["group_size"], False)
    t = {"qweight": awq_pack_rows(codes.T), "qzeros": awq_pack_rows(zeros.T), "scales": scales.T.contiguous()}
    native = awq_dequant(t["qweight"], t["qzeros"], t["scales"], qc["group_size"])
    exact = awq_dequant(t["qweight"], t["qzeros"], t["scales"].float(), qc["group_size"])
    return t, native, exact


def _compressed_tensors(prefix, w, qc, gen, shared):
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**qc["config_groups"]["group_0"]["weights"])
    scheme = QuantizationScheme(targets=["Linear"], weights=args, format="pack-quantized")
    w = w.to(torch.bfloat16 if args.num_bits == 4 else torch.float16)  # the scales take the weight's dtype
    g = args.group_size or w.shape[1]
    wg = w.reshape(w.shape[0], -1, g)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    t = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    native = PackedQuantizationCompressor.decompress(dict(t), scheme)["weight"]
    exact = PackedQuantizationCompressor.decompress({**t, "weight_scale": t["weight_scale"].float()}, scheme)["weight"]
    return t, native, exact


WRITERS = {GPTQ: _gptq, AWQ: _awq, COMPRESSED_TENSORS: _compressed_tensors}
