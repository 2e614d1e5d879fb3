"""What GPTQ, AWQ and compressed-tensors checkpoints share: codes packed in int32 words, group parameters per
(output channel, group), act-order group indices, and the step to mixgemm's QuantizedWeight.

Every format here packs ``32 // bits`` unsigned codes per int32 word, code i of a word in bits
``[i * bits, (i + 1) * bits)`` (AWQ then interleaves the order of the codes inside a word). Unpacking works
on the bit pattern only, so int32's sign bit is just the top bit of the last code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mixgemm.formats.weight import GROUP_SIZES, PER_CHANNEL, QuantConfig, QuantizedWeight, from_codes


def layers_with(keys, *suffixes: str) -> list[str]:
    """The module paths that hold a tensor for every one of ``suffixes`` (e.g. ".qweight", ".qzeros"), sorted."""
    keys = set(keys)
    first, *rest = suffixes
    return sorted(p for p in (k[: -len(first)] for k in keys if k.endswith(first))
                  if all(p + s in keys for s in rest))


class PackedInt32Format:
    """What GPTQ, AWQ and compressed-tensors share: a checkpoint is theirs when its ``quant_method`` is their
    ``name``, and its quantized layers are the module paths that hold every tensor of ``layer_tensors``."""

    name: str
    layer_tensors: tuple[str, ...]

    def matches(self, quantization_config: dict) -> bool:
        return str(quantization_config.get("quant_method", "")).lower() == self.name

    def quantized_linears(self, source, quantization_config: dict) -> list[str]:
        return layers_with(source.keys(), *self.layer_tensors)


def check_bits(bits, what: str) -> int:
    """bits as an int if mixgemm holds it (4 or 8), else a ValueError naming ``what``."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in (4, 8):
        raise ValueError(f"{what}: {bits!r}-bit weights cannot be held by mixgemm (4 or 8 bits only)")
    return bits


def check_int32(t: torch.Tensor, name: str, dim: int = 2) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise ValueError(f"{name}: expected an int32 tensor of packed codes, got {getattr(t, 'dtype', type(t))}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dimensions, got shape {tuple(t.shape)}")
    return t


def unpack_int32(packed: torch.Tensor, bits: int, length: int, dim: int, name: str,
                 order: Sequence[int] | None = None) -> torch.Tensor:
    """Codes uint8 with ``length`` entries along ``dim`` from int32 words packed along ``dim`` (2-D ``packed``).

    Word w holds the codes ``w * per + order[i]`` for its fields i = 0 .. per - 1 (``per = 32 // bits``,
    field i in bits ``[i * bits, (i + 1) * bits)``; ``order`` defaults to the identity). The packed extent
    along ``dim`` must be ceil(length / per); padding codes past ``length`` are dropped."""
    check_int32(packed, name)
    per = 32 // bits
    words = packed.shape[dim]
    if words != -(-length // per):
        raise ValueError(f"{name}: {words} int32 words along dim {dim} do not hold {length} {bits}-bit codes "
                         f"(expected {-(-length // per)}); shape {tuple(packed.shape)}")
    p = packed.movedim(dim, -1)
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=p.device)
    fields = (p.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., words, per]: field i of each word
    if order is not None:
        # field i holds code order[i]: put it at position order[i]
        fields = fields[..., torch.argsort(torch.as_tensor(order, device=p.device))]
    codes = fields.reshape(*p.shape[:-1], words * per)[..., :length]
    return codes.to(torch.uint8).movedim(-1, dim).contiguous()


def group_count(k: int, group_size: int, name: str) -> tuple[int, int]:
    """(effective group size, number of groups) for a mixgemm group size (or -1), else a ValueError."""
    if group_size != PER_CHANNEL and group_size not in GROUP_SIZES:
        raise ValueError(f"{name}: group size {group_size} cannot be held by mixgemm "
                         f"(supported: {GROUP_SIZES} or -1 per-channel)")
    g = k if group_size == PER_CHANNEL else group_size
    return g, -(-k // g)  # a partial last group where g does not divide K (GPTQ's ceil(K / group_size) rows)


def act_order_perm(g_idx: torch.Tensor, group_size: int, name: str) -> torch.Tensor | None:
    """The input permutation that makes act-order groups contiguous, or None when ``g_idx`` is already the
    trivial k // group_size.

    g_idx int [K]: the group of each input feature. Sorting K by group (stably) gives runs of group_size
    features per group exactly when every group 0 .. K/group_size - 1 has group_size members."""
    if g_idx.is_floating_point() or g_idx.dim() != 1:
        raise ValueError(f"{name}: expected an integer vector [K], got {g_idx.dtype} {tuple(g_idx.shape)}")
    k = g_idx.numel()
    g_idx = g_idx.to(torch.int64)
    expected = torch.arange(k, device=g_idx.device) // group_size
    if torch.equal(g_idx, expected):
        return None
    perm = torch.sort(g_idx, stable=True).indices
    if not torch.equal(g_idx[perm], expected):
        ng = -(-k // group_size)
        want = torch.bincount(expected, minlength=ng)  # group_size each, a partial last group's remainder
        counts = torch.bincount(g_idx.clamp(min=0), minlength=ng)[:ng]
        bad = int((counts != want).nonzero()[0]) if (counts != want).any() else -1
        raise ValueError(f"{name}: act-order groups must each hold exactly {group_size} input features "
                         f"(groups 0 .. {ng - 1}, the last one the rest of K); group {bad} has "
                         f"{int(counts[bad]) if bad >= 0 else '?'} (or a group index is out of range)")
    return perm


def to_quantized_weight(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int,
                        group_size: int, name: str) -> QuantizedWeight:
    """mixgemm's QuantizedWeight for w = (q - z) * s (``zeros`` None: the symmetric bias 2**(bits-1)).

    codes uint8 [N, K]; scales float [N, G] (kept in their dtype: exact); zeros integer [N, G]. Mode "sym" when
    every zero is 2**(bits-1), else "zero_point"; a zero outside [0, 2**bits - 1] cannot be held."""
    if scales.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{name}: scales of dtype {scales.dtype} cannot be held by mixgemm (fp16, bf16 or fp32)")
    if not bool(torch.isfinite(scales).all()):
        raise ValueError(f"{name}: scales hold a non-finite value")
    bias = 1 << (bits - 1)
    if zeros is not None:
        zeros = zeros.to(torch.int32)
        if zeros.numel() and (int(zeros.min()) < 0 or int(zeros.max()) > (1 << bits) - 1):
            raise ValueError(f"{name}: a zero point ({int(zeros.min())} .. {int(zeros.max())}) is outside the "
                             f"{bits}-bit code range [0, {(1 << bits) - 1}]: mixgemm cannot hold it")
        if bool((zeros == bias).all()):
            zeros = None
    mode = "sym" if zeros is None else "zero_point"
    config = QuantConfig(bits=bits, group_size=group_size, mode=mode, scale_dtype=scales.dtype)
    return from_codes(codes, scales, config, zeros=zeros)
