"""The RMSNorms that mixgemm's norm kernel (kernels/cuda/rms_norm.cu) computes, written as transformers writes them
(Llama / Qwen2 / Mistral's, and Gemma's with its weight an offset from one): the oracles for that kernel, its CPU
fallback, and the formulas a model's norm module is checked against before mixgemm computes it in its place
(mixgemm.nn.norms)."""

from __future__ import annotations

import torch


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (h32 * rsqrt(mean(h32 ** 2, -1) + eps)).to(h.dtype), h32 = h in float32."""
    h32 = h.to(torch.float32)
    variance = h32.pow(2).mean(-1, keepdim=True)
    return weight * (h32 * torch.rsqrt(variance + eps)).to(h.dtype)


def unit_offset_rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(h32 * rsqrt(mean(h32 ** 2, -1) + eps) * (1 + weight32)).to(h.dtype): Gemma's RMSNorm, whose weight is an
    offset from one and which rounds once, at the end."""
    h32 = h.to(torch.float32)
    variance = h32.pow(2).mean(-1, keepdim=True)
    return (h32 * torch.rsqrt(variance + eps) * (1.0 + weight.to(torch.float32))).to(h.dtype)
