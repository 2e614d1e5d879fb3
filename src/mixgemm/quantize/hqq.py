"""HQQ: half-quadratic quantization of a weight without calibration data (Badri & Shaji 2023).

Each group's codes are q = clamp(round(w / s + z), 0, qmax) and its dequantized weight w_r = (q - z) s (the plain
format's modes: mixgemm.formats.weight). Round to nearest picks s and z from the group's range; HQQ instead
minimizes the lp-norm (p = 0.7, sparsity promoting) of the error w - w_r by half-quadratic splitting, as the ``hqq``
package's ``optimize_weights_proximal_legacy``: with an auxiliary error variable w_e, alternate

* w_e = shrink_p(w - w_r, beta): the proximal step of the lp-norm (generalized soft thresholding), and
* the closed-form least-squares update of the group's parameter against the target w - w_e:
  z = mean(q - (w - w_e) / s) for modes with a zero point ("zero_point", "offset"; s fixed, as published),
  s = <c, w - w_e> / <c, c> with c = q - 2**(bits-1) for "sym" (no zero point: the scale is the free parameter),

with beta growing by kappa each step, a fixed number of steps, stopping early once the mean absolute error of the
whole weight stops improving. Two departures from the published loop, both measured better on real weights
(all-MiniLM-L6-v2 at W4 g128, tests/checkpoints/test_minilm.py) and both switchable (HQQParams): modes with a zero
point fit the scale together with the zero point (the 2 x 2 least squares, ``fit_scale``), and the loop starts from
the best of a few ranges shrunk from the group's full range (``range_search``) rather than the full range itself.
Each group keeps the parameters of its own best step (the published loop returns the last, which can be the step
after the best). Mode "zero_point" stores integer zero points: z is rounded (and clamped to the code range) at every
step, so the loop optimizes over the values it can store. The final codes are recomputed from the stored
(scale-dtype) parameters, so the weight is exactly what the returned format holds.

``importance`` (E[x_k^2] per input channel, mixgemm.quantize.input_moments) weighs every part of the objective by
channel: the error norm is sum_k imp_k |e_k|^p (the shrink's penalty per element becomes beta / imp_k), the fits are
weighted least squares, the range search and the best step compare weighted errors. The loop then minimizes the
error of the layer's output on inputs of those statistics instead of the weight's own error; weights all equal
change nothing.

Everything is batched over all groups of the weight at once in float32, on the weight's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import QuantConfig, QuantizedWeight, _check_weight, from_codes, pad_to_groups

# the least weight of an input channel, relative to the mean (importance weighting)
IMPORTANCE_FLOOR = 1e-3


@dataclass(frozen=True)
class HQQParams:
    """The optimizer's settings (defaults: the published ones). lp_norm: p of the error's norm (0 < p <= 1);
    beta: the first penalty weight, multiplied by kappa (> 1) each step; iters: the most steps; early_stop: stop once
    the mean absolute error stops improving; fit_scale: modes with a zero point fit the scale with the zero point
    (least squares of both against the shrunk target) instead of the zero point alone, as the published loop;
    range_search: the loop starts from the best (least squared error, per group) of this many ranges shrunk from the
    group's full range down to half of it (0: from the full range, as published)."""

    lp_norm: float = 0.7
    beta: float = 10.0
    kappa: float = 1.01
    iters: int = 20
    early_stop: bool = True
    fit_scale: bool = True
    range_search: int = 26

    def __post_init__(self):
        if not 0 < self.lp_norm <= 1:
            raise ValueError(f"lp_norm must be in (0, 1], got {self.lp_norm!r}")
        if not self.beta > 0 or not self.kappa >= 1:
            raise ValueError(f"beta must be > 0 and kappa >= 1, got beta={self.beta!r} kappa={self.kappa!r}")
        for name in ("iters", "range_search"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")


def _shrink(x: torch.Tensor, beta: float | torch.Tensor, p: float) -> torch.Tensor:
    """The proximal operator of the lp-norm (generalized soft thresholding) at penalty weight beta."""
    a = x.abs()
    if p == 1:
        return torch.sign(x) * torch.relu(a - 1.0 / beta)
    return torch.sign(x) * torch.relu(a - a.add(1e-8).pow(p - 1) / beta)


def _inverse(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s > 0, 1.0 / s, torch.zeros_like(s))


def _optimize(w: torch.Tensor, s: torch.Tensor, z: torch.Tensor, qmax: int, params: HQQParams, sym: bool,
              round_zero: bool, imp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The half-quadratic loop over w [N, G, g] from s, z [N, G, 1]: the (s, z) of each group's best step. ``imp``
    [1, G, g] weighs each input channel's error in the norm, the shrink and the fits."""
    best_s, best_z = s, z
    best_err = torch.full_like(s, float("inf"))
    beta, last = params.beta, float("inf")
    for step in range(params.iters + 1):
        q = (w * _inverse(s) + z).round_().clamp_(0, qmax)
        wr = (q - z) * s
        err = ((w - wr).abs() * imp).mean(-1, keepdim=True)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s, best_z = torch.where(better, s, best_s), torch.where(better, z, best_z)
        total = float(err.mean())
        if step == params.iters or (params.early_stop and total >= last):
            break
        last = total
        # the proximal step of sum(imp |e|^p): the penalty weight of each element is beta / imp
        target = w - _shrink(w - wr, beta / imp, params.lp_norm)
        if sym:
            c = q - z
            ci = c * imp
            num, den = (ci * target).sum(-1, keepdim=True), (ci * c).sum(-1, keepdim=True)
            s = torch.where((den > 0) & (num > 0), num / den.clamp(min=1e-30), s)
        elif params.fit_scale:  # least squares of target ~ s q + m over both, then z = -m / s
            s, z = _fit_scale_and_zero(q, target, s, z, imp)
            if round_zero:
                z = z.round().clamp(0, qmax)
        else:
            r = q - target * _inverse(s)
            z = (r * imp).sum(-1, keepdim=True) / imp.sum(-1, keepdim=True)
            if round_zero:
                z = z.round().clamp(0, qmax)
        beta *= params.kappa
    return best_s, best_z


def _range_params(lo: torch.Tensor, hi: torch.Tensor, ratio: float, qmax: int, mode: str, bias: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, z) of round to nearest over the range [lo, hi] shrunk by ``ratio`` (mode "sym": hi is the largest
    magnitude; "zero_point": the range holds 0, so the integer zero point lies in [0, qmax])."""
    if mode == "sym":
        s = hi * ratio / (bias - 1)
        return s, torch.full_like(s, float(bias))
    lo, hi = lo * ratio, hi * ratio
    s = (hi - lo) / qmax
    z = -lo * _inverse(s)
    return s, (z.round().clamp(0, qmax) if mode == "zero_point" else z)


def _initial(w: torch.Tensor, config: QuantConfig, searches: int, imp: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The starting (s, z) [N, G, 1]: the full range, or of ``searches`` ranges from full to half, each group's
    of least (``imp``-weighted) squared error."""
    qmax, bias = config.qmax, config.sym_bias
    if config.mode == "sym":
        lo, hi = None, w.abs().amax(-1, keepdim=True)
    else:
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        if config.mode == "zero_point":
            lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
    if searches <= 1:
        return _range_params(lo, hi, 1.0, qmax, config.mode, bias)
    best_err = best_s = best_z = None
    for ratio in torch.linspace(1.0, 0.5, searches).tolist():
        s, z = _range_params(lo, hi, ratio, qmax, config.mode, bias)
        q = (w * _inverse(s) + z).round_().clamp_(0, qmax)
        err = (((q - z) * s - w).square_() * imp).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_s, best_z = err, s, z
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s, best_z = torch.where(better, s, best_s), torch.where(better, z, best_z)
    return best_s, best_z


def _fit_scale_and_zero(q: torch.Tensor, target: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                        imp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's (s, z) minimizing sum(imp (s q + m - target)^2) (m = -z s) in closed form (the 2 x 2 normal
    equations); groups whose fit is degenerate or gives s <= 0 keep theirs."""
    qi = q * imp
    g = imp.sum(-1, keepdim=True)
    sq, st = qi.sum(-1, keepdim=True), (target * imp).sum(-1, keepdim=True)
    sqq, sqt = (qi * q).sum(-1, keepdim=True), (qi * target).sum(-1, keepdim=True)
    det = g * sqq - sq * sq
    s_new = (g * sqt - sq * st) / det.clamp(min=1e-30)
    ok = (det > 0) & (s_new > 0)
    m_new = (st - s_new * sq) / g
    return torch.where(ok, s_new, s), torch.where(ok, -m_new / s_new.clamp(min=1e-30), z)


def _stored(x: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    y = x.to(dtype)
    if not bool(torch.isfinite(y).all()):
        raise ValueError(f"a block {what} does not fit in {dtype}: weights too large for this scale dtype")
    return y


def _channel_weights(importance: torch.Tensor | None, k: int, ng: int, g: int, device) -> torch.Tensor:
    """``importance`` [K] (each input channel's mean squared activation) as the optimizer's weights [1, G, g],
    normalized to mean 1 so that the penalty schedule keeps its scale; all 1 without importance (or where it is all
    zero): the weight's own error."""
    # a partial last group's padding (copies of the row's last weight) counts as little as a channel never reached
    pad = lambda t: pad_to_groups(t, g, ng, value=IMPORTANCE_FLOOR).reshape(1, ng, g)
    ones = pad(torch.ones(k, device=device))
    if importance is None:
        return ones
    imp = torch.as_tensor(importance).detach().to(device=device, dtype=torch.float32)
    if imp.shape != (k,):
        raise ValueError(f"importance must have one value per input channel, shape ({k},); got {tuple(imp.shape)}")
    if not bool(torch.isfinite(imp).all()) or bool((imp < 0).any()):
        raise ValueError("importance must be finite and >= 0")
    mean = float(imp.mean())
    if mean <= 0:
        return ones
    # a channel no input ever reached still counts a little: its weight must not be left to chance
    return pad((imp / mean).clamp_(min=IMPORTANCE_FLOOR))


def hqq_quantize_weight(weight: torch.Tensor, config: QuantConfig, params: HQQParams | None = None,
                        importance: torch.Tensor | None = None) -> QuantizedWeight:
    """``weight`` [N, K] (float, finite; not modified) in ``config``'s plain format with HQQ-optimized group
    parameters, on the weight's device. Same format as mixgemm.quantize_weight: every kernel reads it.
    ``importance`` [K] (optional): each input channel's mean squared activation E[x_k^2]; the optimizer then
    minimizes the error of the layer's output, sum_k E[x_k^2] |w_k - w_r,k|^p, rather than of the weight."""
    params = HQQParams() if params is None else params
    _check_weight(weight)
    n, k = weight.shape
    g, ng = config.groups(k)
    w = pad_to_groups(weight.detach().float(), g, ng).reshape(n, ng, g)
    qmax = config.qmax
    imp = _channel_weights(importance, k, ng, g, w.device)
    s, z = _initial(w, config, params.range_search, imp)
    s, z = _optimize(w, s, z, qmax, params, sym=config.mode == "sym", round_zero=config.mode == "zero_point",
                     imp=imp)
    s = _stored(s, config.scale_dtype, "scale")
    m = None
    if config.mode == "offset":  # w = q s + m with m = -z s (a constant group, s = 0: m is its value)
        m = _stored(torch.where(s > 0, -z * s.float(), w.amin(-1, keepdim=True)), config.scale_dtype, "offset")
    # the codes of the stored parameters, as the kernels read them
    inv = _inverse(s.float())
    codes = ((w - m.float()) * inv if m is not None else w * inv + z).round_().clamp_(0, qmax)
    return from_codes(codes.to(torch.uint8).reshape(n, ng * g)[:, :k], s.reshape(n, ng), config,
                      zeros=z.reshape(n, ng).to(torch.uint8) if config.mode == "zero_point" else None,
                      offsets=m.reshape(n, ng) if config.mode == "offset" else None)


__all__ = ["HQQParams", "hqq_quantize_weight"]
