"""compressed-tensors checkpoints in the ``pack-quantized`` format (llm-compressor's W4A16 / W8A16 exports) and
the ``int-quantized`` / ``naive-quantized`` one (its W8A8 exports), transformers' ``quant_method:
"compressed-tensors"``.

Per quantized linear ``<prefix>``: ``weight_packed`` int32 [N, ceil(K * bits / 32)] (codes packed along K,
code k in field k % (32 / bits) of word k // (32 / bits), stored as the signed code + 2**(bits-1));
``weight_scale`` [N, G] (G = 1 for the channel strategy, [1] for the tensor one) in its stored dtype;
``weight_shape`` [2] = (N, K); for asymmetric schemes ``weight_zero_point``, signed, packed the same way along
N (int32 [ceil(N * bits / 32), G]; older versions store it unpacked, int8 [N, G]); older act-order exports
add ``weight_g_idx`` [K]; optional ``bias``. The weight is w = (c - zp) * s for the signed code c = q - 2**(bits-1),
i.e. (q - z) * s with z = zp + 2**(bits-1). ``int-quantized`` stores the signed codes unpacked instead, as int8
``weight`` [N, K], with ``weight_scale`` / ``weight_zero_point`` (signed, [N, G]) as above.

Activations: a scheme's ``input_activations`` of dynamic per-token int8 (strategy "token", what llm-compressor
writes for W8A8) load as QuantLinear's per-token int8 activations (``act_block="token"``): symmetric ones as act_mode
"sym_full", compressed-tensors' own scheme (absmax / 127.5, codes in [-128, 127], mixgemm.formats.activation), so the
codes are those transformers' load of the file computes; asymmetric ones as "asym". Static activation scales, other
strategies, float activations and ``output_activations`` are a ValueError naming the scheme.

The scheme of a layer is the ``config_groups`` entry whose ``targets`` match its name (an exact name, a
``re:`` regex, or the class name "Linear"); the most specific match wins.

Lossless: codes, zero points and scales (fp16 / bf16 / fp32) are taken over unchanged: symmetric -> mode
"sym", asymmetric -> "zero_point", channel and tensor strategies -> per-channel. Not held: other formats
(float-quantized, nvfp4-pack-quantized, mxfp*, ...), bits other than 4 / 8, float weights, block / token weight
strategies, group sizes other than 32 / 64 / 128 / 256, each a ValueError naming the tensor and the scheme.
"""

from __future__ import annotations

import re

import torch

from mixgemm.checkpoints.base import ConvertedLinear, TensorSource
from mixgemm.checkpoints.packed_int32 import (
    PackedInt32Format,
    act_order_perm,
    check_bits,
    group_count,
    layers_with,
    to_quantized_weight,
    unpack_int32,
)
from mixgemm.formats.weight import PER_CHANNEL

PACK_QUANTIZED = "pack-quantized"
INT_QUANTIZED = ("int-quantized", "naive-quantized")  # signed codes unpacked in an int8 ``weight``


def _target_rank(target: str, name: str) -> int:
    """How specifically ``target`` names the linear layer ``name``: 3 exact name, 2 regex, 1 class, 0 no match
    (compressed_tensors.utils.match_name's rules; a linear layer's class matches "Linear")."""
    if target.startswith("re:"):
        return 2 if re.match(target[3:], name) else 0
    if target == name:
        return 3
    return 1 if target == "Linear" else 0


def layer_scheme(quantization_config: dict, name: str) -> dict:
    """The config_groups scheme (a dict: targets, weights, input_activations, format...) for layer ``name``."""
    groups = quantization_config.get("config_groups") or {}
    ranked = []
    for key, scheme in groups.items():
        rank = max((_target_rank(t, name) for t in scheme.get("targets", [])), default=0)
        if rank:
            ranked.append((rank, key, scheme))
    if not ranked:
        raise ValueError(f"{name}: stored quantized, but no compressed-tensors config_groups entry targets it")
    best = max(r for r, _, _ in ranked)
    top = [(k, s) for r, k, s in ranked if r == best]
    if len(top) > 1 and any(s.get("weights") != top[0][1].get("weights") for _, s in top):
        raise ValueError(f"{name}: config_groups {[k for k, _ in top]} all target it with different weight schemes")
    return top[0][1]


def _describe(scheme: dict, fmt) -> str:
    """A scheme in a few words, for errors: its format, weight type / bits / strategy and activations."""
    w = scheme.get("weights") or {}
    a = scheme.get("input_activations") or {}
    act = "A16" if not a else (f"A{a.get('num_bits')} {a.get('type', 'int')} {a.get('strategy')} "
                               f"{'dynamic' if a.get('dynamic') else 'static'}")
    return (f"(format {fmt!r}, W{w.get('num_bits')} {w.get('type', 'int')} {w.get('strategy')}"
            f"{' g' + str(w.get('group_size')) if w.get('group_size') else ''}, {act})")


def _activation_mode(scheme: dict, what: str) -> str | None:
    """QuantLinear's act_mode for the scheme's activations: None (weight-only), or "sym_full" / "asym" for dynamic
    per-token int8; anything else a ValueError naming the scheme."""
    if scheme.get("output_activations"):
        raise ValueError(f"{what}: output activation quantization is not supported")
    a = scheme.get("input_activations")
    if not a:
        return None
    if a.get("type", "int") != "int" or a.get("num_bits") != 8:
        raise ValueError(f"{what}: input activations {a.get('type', 'int')} {a.get('num_bits')}-bit are not "
                         "supported (int8 only)")
    if a.get("dynamic") is not True:
        raise ValueError(f"{what}: static (calibrated) activation scales are not supported: mixgemm quantizes "
                         "activations per token at run time (dynamic: true)")
    if a.get("strategy") != "token":
        raise ValueError(f"{what}: activation strategy {a.get('strategy')!r} is not supported (token only)")
    return "sym_full" if a.get("symmetric", True) else "asym"


def _group_size(args: dict, strategy: str, k: int, prefix: str, what: str) -> tuple[int, int]:
    """(mixgemm group size, number of scale columns) of a weight strategy."""
    if strategy == "group":
        group_size = int(args.get("group_size") or 0)
    elif strategy in ("channel", "tensor"):
        group_size = PER_CHANNEL
    else:
        raise ValueError(f"{prefix}.weight_scale: strategy {strategy!r} is not supported (group, channel, tensor; "
                         f"{what})")
    return group_size, group_count(k, group_size, f"{prefix}.weight_scale (group_size)")[1]


def _scale(scale: torch.Tensor, n: int, ng: int, strategy: str, prefix: str) -> torch.Tensor:
    """The scales as [N, G] (the tensor strategy's one scale repeated)."""
    if strategy == "tensor":
        if scale.numel() != 1:
            raise ValueError(f"{prefix}.weight_scale: the tensor strategy needs one scale, got {tuple(scale.shape)}")
        scale = scale.reshape(1, 1).expand(n, 1)
    if tuple(scale.shape) != (n, ng):
        raise ValueError(f"{prefix}.weight_scale: expected shape {(n, ng)} ({strategy} strategy), "
                         f"got {tuple(scale.shape)}")
    return scale


class CompressedTensorsFormat(PackedInt32Format):
    name = "compressed-tensors"
    layer_tensors = (".weight_packed",)

    def quantized_linears(self, source, quantization_config: dict) -> list[str]:
        """Layers with ``weight_packed``, and those with a ``weight_scale`` beside their ``weight`` (int-quantized,
        and the float8 / fp4 formats, which convert_linear refuses by name rather than loading their codes as a
        float weight)."""
        return sorted(set(layers_with(source.keys(), ".weight_packed"))
                      | set(layers_with(source.keys(), ".weight", ".weight_scale")))

    def convert_linear(self, source: TensorSource, prefix: str, quantization_config: dict) -> ConvertedLinear:
        scheme = layer_scheme(quantization_config, prefix)
        fmt = scheme.get("format") or quantization_config.get("format")
        what = f"{prefix}: compressed-tensors scheme {_describe(scheme, fmt)}"
        if fmt != PACK_QUANTIZED and fmt not in INT_QUANTIZED:
            raise ValueError(f"{what}: format {fmt!r} is not supported (only {PACK_QUANTIZED!r} and "
                             f"{INT_QUANTIZED[0]!r} integer weights)")
        args = scheme.get("weights") or {}
        act_mode = _activation_mode(scheme, what)
        if args.get("type", "int") != "int":
            raise ValueError(f"{what}: weight type {args.get('type')!r} is not supported (int only)")
        if fmt in INT_QUANTIZED:
            return self._int_quantized(source, prefix, args, act_mode, what)
        bits = check_bits(args.get("num_bits"), f"{prefix}.weight_packed (num_bits; {what})")
        strategy = args.get("strategy") or ("group" if args.get("group_size") else "tensor")
        symmetric = args.get("symmetric", True)

        keys = set(source.keys())
        packed = source.get(prefix + ".weight_packed")
        scale = source.get(prefix + ".weight_scale")
        shape = source.get(prefix + ".weight_shape").tolist() if prefix + ".weight_shape" in keys else None
        if shape is None or len(shape) != 2:
            raise ValueError(f"{prefix}.weight_shape: expected (N, K), got {shape}")
        n, k = (int(v) for v in shape)
        if packed.dim() != 2 or packed.shape[0] != n:
            raise ValueError(f"{prefix}.weight_packed: expected {n} rows (weight_shape {shape}), "
                             f"got shape {tuple(packed.shape)}")
        group_size, ng = _group_size(args, strategy, k, prefix, what)
        g = k if group_size == PER_CHANNEL else group_size
        scale = _scale(scale, n, ng, strategy, prefix)

        codes = unpack_int32(packed, bits, k, 1, prefix + ".weight_packed")  # [N, K], signed code + 2**(bits-1)
        zeros = None
        if not symmetric:
            zeros = self._zero_points(source, prefix, bits, n, ng, strategy)
        perm = None
        if prefix + ".weight_g_idx" in keys:
            perm = act_order_perm(source.get(prefix + ".weight_g_idx"), g, prefix + ".weight_g_idx")
            if perm is not None:
                codes = codes.index_select(1, perm)
        if perm is not None and act_mode is not None:
            raise ValueError(f"{what}: act-order (weight_g_idx) with int8 activations is not supported")
        weight = to_quantized_weight(codes, scale, zeros, bits, group_size, prefix)
        bias = source.get(prefix + ".bias") if prefix + ".bias" in keys else None
        return ConvertedLinear(weight=weight, bias=bias, input_perm=perm, act_mode=act_mode,
                               act_block="token" if act_mode else "group")

    def _int_quantized(self, source, prefix: str, args: dict, act_mode: str | None, what: str) -> ConvertedLinear:
        """int-quantized: signed codes in an int8 ``weight`` [N, K], w = (c - zp) * s."""
        bits = check_bits(args.get("num_bits"), f"{prefix}.weight (num_bits; {what})")
        strategy = args.get("strategy") or ("group" if args.get("group_size") else "tensor")
        if prefix + ".weight" not in set(source.keys()):
            raise ValueError(f"{prefix}.weight: missing; {what} stores the int8 codes there")
        weight = source.get(prefix + ".weight")
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError(f"{prefix}.weight: expected int8 codes [N, K] ({what}), got {weight.dtype} "
                             f"{tuple(weight.shape)}")
        n, k = weight.shape
        group_size, ng = _group_size(args, strategy, k, prefix, what)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if weight.numel() and (int(weight.min()) < lo or int(weight.max()) > hi):
            raise ValueError(f"{prefix}.weight: codes {int(weight.min())} .. {int(weight.max())} are outside the "
                             f"{bits}-bit range [{lo}, {hi}] ({what})")
        scale = _scale(source.get(prefix + ".weight_scale"), n, ng, strategy, prefix)
        zeros = None
        if not args.get("symmetric", True):
            zeros = self._zero_points(source, prefix, bits, n, ng, strategy)
        codes = (weight.to(torch.int32) + (1 << (bits - 1))).to(torch.uint8)
        qw = to_quantized_weight(codes, scale, zeros, bits, group_size, prefix)
        bias = source.get(prefix + ".bias") if prefix + ".bias" in set(source.keys()) else None
        return ConvertedLinear(weight=qw, bias=bias, act_mode=act_mode, act_block="token" if act_mode else "group")

    @staticmethod
    def _zero_points(source: TensorSource, prefix: str, bits: int, n: int, ng: int, strategy: str) -> torch.Tensor:
        """Unsigned zero points int32 [N, G] (the signed zero point + 2**(bits-1))."""
        name = prefix + ".weight_zero_point"
        if name not in set(source.keys()):
            raise ValueError(f"{name}: missing for an asymmetric scheme")
        zp = source.get(name)
        if strategy == "tensor":
            if zp.numel() != 1:
                raise ValueError(f"{name}: the tensor strategy needs one zero point, got {tuple(zp.shape)}")
            zp = zp.reshape(1, 1).expand(n, 1)
        if zp.dtype == torch.int32 and zp.dim() == 2 and tuple(zp.shape) != (n, ng):
            # packed along N like the weight along K; stored unsigned (+ 2**(bits-1)) by pack_to_int32
            return unpack_int32(zp, bits, n, 0, name).to(torch.int32)
        if zp.is_floating_point() or tuple(zp.shape) != (n, ng):
            raise ValueError(f"{name}: expected integer zero points [{n}, {ng}] or int32 packed along N, "
                             f"got {zp.dtype} {tuple(zp.shape)}")
        return zp.to(torch.int32) + (1 << (bits - 1))


COMPRESSED_TENSORS = CompressedTensorsFormat()
