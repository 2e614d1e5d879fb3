"""The RMSNorm that mixgemm's fused norm kernel (kernels/cuda/rms_norm_gather.cu) computes, written as transformers'
Llama / Qwen2 / Mistral RMSNorm writes it: the oracle for that kernel, its CPU fallback, and the formula a model's norm
module is checked against before mixgemm computes it in its place (mixgemm.nn.norms)."""

from __future__ import annotations

import torch


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (h32 * rsqrt(mean(h32 ** 2, -1) + eps)).to(h.dtype), h32 = h in float32."""
    h32 = h.to(torch.float32)
    variance = h32.pow(2).mean(-1, keepdim=True)
    return weight * (h32 * torch.rsqrt(variance + eps)).to(h.dtype)
