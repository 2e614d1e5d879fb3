"""GPTQ for one weight (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"), as its reference implementation's ``fasterquant``.

Given H = 2 X^T X over the layer's inputs X [tokens, K] (mixgemm.quantize.sequential gathers it), the columns of W
[N, K] are quantized one at a time and each column's error is spread over the columns not yet quantized through
the inverse Hessian: H is dampened (percdamp times its mean diagonal), inverted through its Cholesky factor and the
upper Cholesky factor U of that inverse drives the updates, in blocks of ``block_size`` columns whose updates to the
rest of W are applied once per block (lazy batch). A group's scale and zero point / offset are computed (round to
nearest's rule, mixgemm.quantize_weight) from the group's columns as updated when its first column is reached.
Inputs that never fire (zero Hessian diagonal) get weight 0, as the reference does.

``act_order``: columns are taken in decreasing Hessian diagonal; groups are runs of that order, so the weight is
stored with its columns permuted and the layer multiplies x[..., perm] (QuantLinear.input_perm, the form mixgemm's
act-order kernels run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mixgemm.formats.weight import QuantConfig, QuantizedWeight, _check_weight, from_codes, quantize_weight


@dataclass(frozen=True)
class GPTQParams:
    """percdamp: the dampening added to H's diagonal, as a fraction of its mean; block_size: columns per lazy
    batch (rounded up to a multiple of the group size); act_order: columns in decreasing Hessian diagonal."""

    percdamp: float = 0.01
    block_size: int = 128
    act_order: bool = False

    def __post_init__(self):
        if not self.percdamp > 0:
            raise ValueError(f"percdamp must be > 0, got {self.percdamp!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")


@dataclass(frozen=True)
class GPTQResult:
    """The quantized weight (its columns in ``perm`` order when act-order) and the permutation (int64 [K]), or
    None."""

    weight: QuantizedWeight
    perm: torch.Tensor | None


def _inverse_cholesky(h: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp I)^-1; the dampening grows tenfold (up to 4 times) while H is not
    positive definite in float32."""
    k = h.shape[0]
    diag = torch.arange(k, device=h.device)
    damp = percdamp * float(h.diagonal().mean())
    for _ in range(5):
        hd = h.clone()
        hd[diag, diag] += damp
        low, info = torch.linalg.cholesky_ex(hd)
        if int(info) == 0:  # (H)^-1 = L^-T L^-1 (two triangular solves: cholesky_inverse is slow on some CPUs)
            low_inv = torch.linalg.solve_triangular(low, torch.eye(k, dtype=low.dtype, device=low.device),
                                                    upper=False)
            inv = low_inv.T @ low_inv
            up, info = torch.linalg.cholesky_ex(inv, upper=True)
            if int(info) == 0:
                return up
        damp *= 10
    raise ValueError(f"the Hessian ({k} x {k}) is not positive definite even dampened by {damp / 10:.3g}: the "
                     "calibration inputs are degenerate (NaN / Inf, or too few tokens)")


def _group_params(cols: torch.Tensor, config: QuantConfig) -> tuple[QuantizedWeight, torch.Tensor, torch.Tensor]:
    """Round to nearest's parameters of one group's columns [N, g] (one group: per-channel over them), and the
    float32 (s, m) of w = q s + m."""
    qw = quantize_weight(cols, replace(config, group_size=-1))
    s, m = qw.group_params_float64()
    return qw, s[:, 0].float(), m[:, 0].float()


def gptq_quantize_weight(weight: torch.Tensor, hessian: torch.Tensor, config: QuantConfig,
                         params: GPTQParams | None = None) -> GPTQResult:
    """``weight`` [N, K] (float, finite; not modified) quantized in ``config``'s format by GPTQ against
    ``hessian`` [K, K] (2 X^T X over the layer's inputs, any positive scale), on the weight's device in float32."""
    params = GPTQParams() if params is None else params
    _check_weight(weight)
    n, k = weight.shape
    if not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) != (k, k):
        raise ValueError(f"hessian must be a tensor of shape ({k}, {k}), got "
                         f"{tuple(hessian.shape) if isinstance(hessian, torch.Tensor) else type(hessian).__name__}")
    if not bool(torch.isfinite(hessian).all()):
        raise ValueError("hessian has non-finite values (NaN / Inf in the calibration inputs)")
    g, ng = config.groups(k)
    w = weight.detach().to(torch.float32).clone()
    h = hessian.detach().to(device=w.device, dtype=torch.float32).clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = None
    if params.act_order:
        perm = torch.argsort(h.diagonal(), descending=True)
        w, h = w[:, perm], h[perm][:, perm]
    hinv = _inverse_cholesky(h, params.percdamp)
    del h
    block = -(-max(params.block_size, g) // g) * g if g < k else params.block_size
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    scales, zeros, offsets = [], [], []
    s = m = None
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        w1 = w[:, b0:b1].clone()
        err1 = torch.empty_like(w1)
        h1 = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            if (b0 + i) % g == 0:  # a group starts: its parameters from its columns as updated so far
                gq, s, m = _group_params(w1[:, i:i + g] if g < k else w, config)
                scales.append(gq.scales)
                zeros.append(gq.zeros)
                offsets.append(gq.offsets)
                inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
            col = w1[:, i]
            q = ((col - m) * inv).round_().clamp_(0, config.qmax)
            codes[:, b0 + i] = q.to(torch.uint8)
            e = (col - (q * s + m)) / h1[i, i]
            w1[:, i:].addr_(e, h1[i, i:], alpha=-1)
            err1[:, i] = e
        w[:, b1:].addmm_(err1, hinv[b0:b1, b1:], alpha=-1)
    cat = lambda ts: None if ts[0] is None else torch.cat(ts, 1)
    qw = from_codes(codes, cat(scales), config, zeros=cat(zeros), offsets=cat(offsets))
    return GPTQResult(weight=qw, perm=perm)


__all__ = ["GPTQParams", "GPTQResult", "gptq_quantize_weight"]
