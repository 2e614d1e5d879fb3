"""Integer group scales: sym int4 groups whose scales are integer multiples of one step per output channel.

A weight quantized by :func:`quantize_weight_int_scales` is an ordinary sym int4 ``QuantizedWeight`` (every kernel and
reference reads it as it is), whose scales factor exactly as ``s[n, g] = step[n] * m[n, g]`` with integer
``m`` in 1..16 (the two-level "progressive" group scales of QServe's W4A8). Then ``c * m`` (c = q - 8 in -8..7) is an
int8 in -128..112, so an integer kernel can dequantize each group's codes to int8 in registers and accumulate one int32
sum over all of K, scaled once by ``step * sA`` in its epilogue: no per-group fold of the partial sums
(kernels/cuda_wgmma_a8/gemm_wgmma_a8.cu ``A8_QS``).

The price is the resolution of the group scales: a group's scale is a multiple of step = max_g s[n, g] / 16 (rounded
up to a value whose 16 multiples the scale dtype holds exactly), and each group takes whichever of the two multiples
around its own max-abs / 7 scale gives the smaller squared error (the lower one may clip a code to -8 / 7).

:func:`int_group_scales` finds the factorization of any sym int4 weight's scales (``None`` when a row has none).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import QuantConfig, QuantizedWeight, _check_weight, from_codes, pad_to_groups

MAX_MULT = 16  # c * m >= -8 * 16 = -128 and <= 7 * 16 = 112: an int8
_SIGNIFICAND = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}
_REL_TOL = 1e-6  # a scale / step this close to an integer is that integer (kernels scale in fp32: ~6e-8)


@dataclass(frozen=True)
class IntGroupScales:
    """s[n, g] = step[n] * mult[n, g]: step float64 [N] (>= 0), mult int32 [N, G] in 1..16."""

    step: torch.Tensor
    mult: torch.Tensor


def _round_up_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The smallest value >= x (x > 0, float64) with at most ``bits`` significant bits."""
    e = torch.floor(torch.log2(x))
    unit = torch.exp2(e - (bits - 1))
    return torch.ceil(x / unit) * unit


def quantize_weight_int_scales(weight: torch.Tensor, group_size: int = 128,
                               scale_dtype: torch.dtype = torch.float16) -> QuantizedWeight:
    """Quantize a float weight [N, K] to sym int4 groups with integer group scales (module docstring).

    weight: float16/bfloat16/float32/float64 [N, K], finite, any device; not modified. group_size: 32..256 (a group
    scale per output channel and run of group_size k; per-channel weights need no multiples). scale_dtype: float16,
    bfloat16 or float32. Returns a sym 4-bit QuantizedWeight on weight's device; ``int_group_scales`` of it is never
    None.
    """
    config = QuantConfig(bits=4, group_size=group_size, mode="sym", scale_dtype=scale_dtype)
    if config.group_size == -1:
        raise ValueError("integer group scales need groups (group_size 32, 64, 128 or 256), got per-channel")
    _check_weight(weight)
    n, k = weight.shape
    g, ng = config.groups(k)
    w = pad_to_groups(weight.detach().double(), g, ng, value=0.0).reshape(n, ng, g)  # zeros: no error, no range
    s_opt = w.abs().amax(-1) / 7  # [N, G]: the plain sym scale
    smax = s_opt.amax(-1)
    # 16 multiples of the step must be exact in the scale dtype: m <= 15 takes 4 significant bits, 16 none
    step = torch.where(smax > 0, _round_up_significand(smax.clamp(min=1e-300) / MAX_MULT,
                                                       _SIGNIFICAND[scale_dtype] - 4), torch.ones_like(smax))
    ratio = s_opt / step[:, None]
    best = None
    for m in (torch.floor(ratio), torch.ceil(ratio)):  # ties (ratio an integer) give the same candidate twice
        m = m.clamp(1, MAX_MULT)
        s = step[:, None] * m
        c = torch.round(w / s[..., None]).clamp(-8, 7)
        err = (c * s[..., None] - w).square().sum(-1)
        if best is None:
            best = (m, c, err)
        else:
            keep = best[2] <= err
            best = (torch.where(keep, best[0], m), torch.where(keep[..., None], best[1], c),
                    torch.minimum(best[2], err))
    m, c, _ = best
    scales = (step[:, None] * m).to(scale_dtype)
    if not bool((scales.double() == step[:, None] * m).all()):
        raise ValueError(f"integer group scales: a step * multiple does not fit {scale_dtype} exactly (weights too "
                         "small or too large for it); use scale_dtype=torch.float32")
    codes = (c + 8).to(torch.uint8).reshape(n, ng * g)[:, :k]
    return from_codes(codes, scales, config)


def int_group_scales(qw: QuantizedWeight) -> IntGroupScales | None:
    """The factorization s = step * m (m in 1..16) of a sym int4 grouped weight's scales, or None when some row has
    none (or qw is not sym int4 with groups). Exact to 1e-6 relative (the kernels compute in fp32)."""
    if qw.mode != "sym" or qw.bits != 4 or qw.num_groups == 1:
        return None
    s = qw.scales.double()
    smax = s.amax(-1)
    step = torch.zeros_like(smax)
    mult = torch.ones(s.shape, dtype=torch.int32, device=s.device)
    found = smax == 0  # an all-zero row: step 0
    for top in range(MAX_MULT, 0, -1):  # the largest group is `top` steps
        st = smax / top
        r = s / st[:, None].clamp(min=1e-300)
        mi = torch.round(r)
        ok = ((r - mi).abs() <= _REL_TOL * r).all(-1) & (mi >= 1).all(-1) & ~found
        step = torch.where(ok, st, step)
        mult = torch.where(ok[:, None], mi.to(torch.int32), mult)
        found |= ok
        if bool(found.all()):
            return IntGroupScales(step=step, mult=mult)
    return None
