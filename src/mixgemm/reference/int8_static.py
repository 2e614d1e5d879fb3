"""Static per-tensor INT8 x INT8 -> INT8 GEMM (MNN ConvInt8 semantics): the CPU reference.

Real values: x = sI (xq - zI) (per tensor), w = sW[n] wq (symmetric, signed int8; sW per tensor or per
output channel), y = x @ w.T + bias, output yq = clamp(round(y / sO) + zO, lo, hi).

Folded as MNN does (M = sI sW / sO, FusedBias = B / (sI sW) - zI sum(wq)); we add zO after rounding
instead of folding round(zO / M) into the bias (exact, where MNN's fold loses up to M / 2):

    mq[n]         = float32(sI * sW[n] / sO)                                 (float64, rounded once)
    fused_bias[n] = rint(bias[n] / (sI * sW[n])) - zI * sum_k wq[n, k]         (int32)
    yq[m, n]      = clamp(rint(float32(acc[m, n] + fused_bias[n]) * mq[n]) + zO, lo, hi),
    acc           = xq @ wq.T (exact integers)

with float32 products rounded to nearest even and rint = round half to even. The GPU kernel
(mixgemm.ops.int8.int8_static_gemm) performs exactly these float32 operations, so it must match bit for bit.
"""

from __future__ import annotations

import math

import torch

from mixgemm.epilogue import clamp_bounds

_I32 = (-(2**31), 2**31 - 1)


def _as_vec(v, n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float64).flatten().cpu()
    if t.numel() == 1:
        t = t.expand(n)
    if t.numel() != n:
        raise ValueError(f"{name} must be a scalar or have {n} entries, got {t.numel()}")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"{name} must be finite and > 0")
    return t


def quant_clamp(out_scale: float, out_zero: int, activation: str | None = None,
                clamp: tuple[int, int] | None = None) -> tuple[int, int]:
    """Integer output bounds: [-128, 127] intersected with the activation in the quantized domain
    (relu: >= zO; relu6: <= zO + round(6 / sO)) and an optional explicit (lo, hi)."""
    a_lo, a_hi = clamp_bounds(activation)
    lo, hi = -128, 127
    if a_lo == 0.0:
        lo = max(lo, int(out_zero))
    if math.isfinite(a_hi):
        hi = min(hi, int(out_zero) + round(a_hi / float(out_scale)))
    if clamp is not None:
        lo, hi = max(lo, int(clamp[0])), min(hi, int(clamp[1]))
    if lo > hi:
        raise ValueError(f"empty output clamp range [{lo}, {hi}]")
    return lo, hi


def static_params(w_q: torch.Tensor, w_scale, x_scale: float, x_zero: int, out_scale: float,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mq float32 [N], fused_bias int32 [N]) on w_q's device, from int8 weights [N, K] (see module doc)."""
    if w_q.dtype != torch.int8 or w_q.dim() != 2:
        raise TypeError(f"w_q must be int8 [N, K], got {w_q.dtype} {tuple(w_q.shape)}")
    if not -128 <= int(x_zero) <= 127:
        raise ValueError(f"x_zero must be in [-128, 127], got {x_zero}")
    n = w_q.shape[0]
    sw = _as_vec(w_scale, n, "w_scale")
    si = float(_as_vec(x_scale, 1, "x_scale")[0])
    so = float(_as_vec(out_scale, 1, "out_scale")[0])
    mq = (si * sw / so).to(torch.float32)
    if not bool(torch.isfinite(mq).all()) or bool((mq == 0).any()):
        raise ValueError("sI * sW / sO does not fit float32")
    sum_w = w_q.to(torch.int64).sum(1).cpu()
    fb = -int(x_zero) * sum_w
    if bias is not None:
        b = bias.detach().double().flatten().cpu()
        if b.numel() != n:
            raise ValueError(f"bias must have {n} entries, got {b.numel()}")
        fb = fb + torch.round(b / (si * sw)).to(torch.int64)
    if int(fb.min()) < _I32[0] or int(fb.max()) > _I32[1]:
        raise ValueError("fused bias overflows int32 (bias too large for sI * sW)")
    return mq.to(w_q.device), fb.to(torch.int32).to(w_q.device)


def int8_static_gemm(x_q: torch.Tensor, w_q: torch.Tensor, w_scale, x_scale: float, x_zero: int,
                     out_scale: float, out_zero: int, bias: torch.Tensor | None = None,
                     activation: str | None = None, clamp: tuple[int, int] | None = None) -> torch.Tensor:
    """Reference int8 [M, N]. x_q: int8 [M, K]; w_q: int8 [N, K] (signed, symmetric)."""
    if x_q.dtype != torch.int8 or x_q.dim() != 2:
        raise TypeError(f"x_q must be int8 [M, K], got {x_q.dtype} {tuple(x_q.shape)}")
    if x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"shape mismatch: x_q K={x_q.shape[1]}, w_q K={w_q.shape[1]}")
    mq, fb = static_params(w_q, w_scale, x_scale, x_zero, out_scale, bias)
    lo, hi = quant_clamp(out_scale, out_zero, activation, clamp)
    acc = x_q.to(torch.int64).cpu() @ w_q.to(torch.int64).cpu().T
    v = acc + fb.cpu().to(torch.int64)[None, :]
    if v.numel() and int(v.abs().max()) >= 2**31:
        raise ValueError("int32 accumulator overflow")
    y = v.to(torch.float32) * mq.cpu()[None, :]
    y = torch.round(y) + float(out_zero)
    return y.clamp(lo, hi).to(torch.int8).to(x_q.device)


def int8_static_gemm_float64(x_q, w_q, w_scale, x_scale, x_zero, out_scale, out_zero, bias=None):
    """The unrounded real result y / sO + zO in float64 (for error bounds, not for bit equality)."""
    n = w_q.shape[0]
    sw = _as_vec(w_scale, n, "w_scale")
    x = float(x_scale) * (x_q.double().cpu() - int(x_zero))
    w = sw[:, None] * w_q.double().cpu()
    y = x @ w.T
    if bias is not None:
        y = y + bias.double().cpu()[None, :]
    return y / float(out_scale) + int(out_zero)
