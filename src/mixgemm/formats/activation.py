"""Activation quantization references (per token, per block along K): symmetric (llama.cpp q8_1), symmetric over
the whole int8 range (compressed-tensors) and asymmetric (min/max with an offset).

Three schemes, all producing int8 codes and, per (token, block), the sum of the codes so that the
block-wise integer GEMM can fold the offset terms without another pass:

* ``"sym"`` (llama.cpp's q8_1, vLLM's dynamic int8 quantizer, mixgemm's own quantize_): d = absmax / 127,
  q = round(x * (1 / d)) in [-127, 127], x ~= q * d. Computed in float32.
* ``"sym_full"`` (compressed-tensors' symmetric int8, what llm-compressor's W8A8 checkpoints run with; transformers'
  compressed-tensors forward, compressed_tensors.quantization.utils.calculate_qparams and
  lifecycle.forward_helpers._quantize_dequantize): d = absmax / ((q_max - q_min) / 2) = absmax / 127.5,
  q = round(clamp(x / d, -128, 127)) in [-128, 127], x ~= q * d; d and x / d each rounded to the activation's dtype
  (compressed-tensors computes them in it), round half to even. A block of zeros has codes 0 (compressed-tensors
  puts the dtype's eps in its scale; the codes and their products are the same).
* ``"asym"`` (min/max): s = (max - min) / 255, o = max - 127 * s, q = round((x - o) / s) in
  [-128, 127], x ~= q * s + o. A constant block (max == min) gets s = 1 and o = max, so q = 0.

Everything is computed in float32 (the precision the fused GPU kernels use) from the input cast to float32; for
"sym_full" a float32 quotient rounded to fp16 / bf16 is that dtype's own correctly rounded quotient (float32 carries
more than 2p + 2 bits of a p-bit type's significand, so the double rounding is innocuous).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import partial_group

ACT_MODES = ("sym", "asym", "sym_full")
# The modes the integer GEMM runs with a zero offset (codes times scale only)
SYMMETRIC_ACT_MODES = ("sym", "sym_full")
# How activation blocks relate to the weight's groups (mixgemm.ops.int8.matmul_a8's ``act_block``): "group" = one
# scale per token and weight group (block-wise integer GEMM), "token" = one scale per token over the whole row
# (the usual dynamic W8A8 / W4A8 activation quantization, e.g. torchao's int8 dynamic activations).
ACT_BLOCKS = ("group", "token")


def check_act(act_mode: str | None, act_block: str = "group", optional: bool = False) -> None:
    """ValueError naming the bad argument unless act_mode is in ACT_MODES (or None when ``optional``: weight-only)
    and act_block in ACT_BLOCKS."""
    if not (act_mode in ACT_MODES or (optional and act_mode is None)):
        raise ValueError(f"act_mode must be {'None or ' if optional else ''}one of {ACT_MODES}, got {act_mode!r}")
    if act_block not in ACT_BLOCKS:
        raise ValueError(f"act_block must be one of {ACT_BLOCKS}, got {act_block!r}")


def act_block_size(k: int, group_size: int, act_block: str) -> int:
    """The activation quantization block along K for a weight with ``group_size`` (-1: per-channel): the weight's
    group (K for per-channel weights), or K for "token". The int8-activation format takes whole groups: a weight
    whose K ends in a partial group is an error."""
    if partial := partial_group(k, group_size):
        raise ValueError(f"{partial}: int8 activations need whole groups (a group size that divides K, or "
                         "per-channel)")
    return k if act_block == "token" or group_size == -1 else group_size


@dataclass(frozen=True)
class QuantizedActivation:
    """Per-token, per-block int8 activations.

    q: int8 [M, K]; scales: float32 [M, G]; offsets: float32 [M, G] (zeros for "sym");
    sums: int32 [M, G], the sum of q over each block; block_size: K // G; mode: "sym" or "asym".
    The float value is q * scale + offset of its (token, block).
    """

    q: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    sums: torch.Tensor
    block_size: int
    mode: str

    def __repr__(self) -> str:
        m, k = self.q.shape
        return (f"QuantizedActivation(shape=({m}, {k}), block_size={self.block_size}, mode={self.mode!r}, "
                f"device={self.q.device})")

    def dequantize(self) -> torch.Tensor:
        m, k = self.q.shape
        g = k // self.block_size
        q = self.q.double().reshape(m, g, self.block_size)
        x = q * self.scales.double()[..., None] + self.offsets.double()[..., None]
        return x.reshape(m, k)

    def regroup(self, block_size: int) -> QuantizedActivation:
        """The same codes described per block of ``block_size`` (a divisor of this block size): scales and
        offsets repeated, sums recomputed per new block. The float values are unchanged."""
        m, k = self.q.shape
        if block_size == self.block_size:
            return self
        if block_size <= 0 or self.block_size % block_size:
            raise ValueError(f"cannot regroup activation blocks of {self.block_size} into blocks of {block_size}")
        r = self.block_size // block_size
        sums = self.q.reshape(m, k // block_size, block_size).sum(-1, dtype=torch.int32)
        return QuantizedActivation(q=self.q, scales=self.scales.repeat_interleave(r, dim=1),
                                   offsets=self.offsets.repeat_interleave(r, dim=1), sums=sums,
                                   block_size=block_size, mode=self.mode)


def quantize_activation(x: torch.Tensor, block_size: int = -1, mode: str = "sym") -> QuantizedActivation:
    """Quantize x [M, K] (float) per token and per block of ``block_size`` along K (-1: whole K)."""
    if mode not in ACT_MODES:
        raise ValueError(f"activation quantization mode must be one of {ACT_MODES}, got {mode!r}")
    if x.dim() != 2:
        raise ValueError(f"activations must be 2-D [M, K], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"activations must be floating point, got {x.dtype}")
    m, k = x.shape
    if block_size not in (-1, None) and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                         or block_size <= 0):
        raise ValueError(
            f"activation block size must be a positive integer or -1 (whole K), got {block_size!r}"
        )
    b = k if block_size in (-1, None) else block_size
    if k % b:
        raise ValueError(f"K={k} is not divisible by the activation block size {b}")
    xb = x.float().reshape(m, k // b, b)
    if mode == "sym":
        amax = xb.abs().amax(-1)
        # divide by a tensor, not a Python scalar: CUDA turns x / scalar into x * (1 / scalar), which
        # differs in the last bit; true division keeps the reference identical on every device
        d = amax / torch.full_like(amax, 127.0)
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round(xb * inv[..., None]).clamp(-127, 127)
        o = torch.zeros_like(d)
    elif mode == "sym_full":
        d, q = _sym_full(xb, x.dtype)
        o = torch.zeros_like(d)
    else:
        lo, hi = xb.amin(-1), xb.amax(-1)
        d = (hi - lo) / torch.full_like(hi, 255.0)
        o = torch.where(d > 0, hi - 127.0 * d, hi)  # a constant block: o = max, so q = 0 and x == o exactly
        d = torch.where(d > 0, d, torch.ones_like(d))
        q = torch.round((xb - o[..., None]) / d[..., None]).clamp(-128, 127)
    q = q.to(torch.int8)
    return QuantizedActivation(
        q=q.reshape(m, k),
        scales=d,
        offsets=o,
        sums=q.to(torch.int32).sum(-1, dtype=torch.int32),
        block_size=b,
        mode=mode,
    )


def _sym_full(xb: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, codes) of "sym_full" for float32 blocks xb [M, G, B] of an activation in ``dtype``."""
    amax = xb.abs().amax(-1)
    d = (amax / torch.full_like(amax, 127.5)).to(dtype).float()
    pos = d > 0
    y = (xb / torch.where(pos, d, torch.ones_like(d))[..., None]).to(dtype).float()
    q = torch.where(pos[..., None], torch.round(y.clamp(-128, 127)), torch.zeros_like(y))
    return d, q
