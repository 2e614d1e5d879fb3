"""Prepared launches kept by input shape: the path of a repeated call with nothing in between.

A call plan (mixgemm.ops.dispatch) already holds its prepared launch, but reaching it takes a weight lookup, a plan
lookup and the input checks, several microseconds of Python per call. An eager decode step makes a few hundred such
calls and is bound by their host time, which must stay at nn.Linear's for a quantized model to decode as fast as the
fp16 one; under torch.compile without CUDA graphs each layer's op call pays it too. So once a call has run through a
prepared launch, its owner (a QuantLinear for the eager path, the qweight tensor for the op) keeps that launch under
the call's key (x's shape, dtype and device, and for the op its format and clamp arguments), with a token of the
weight's tensors. The next call with the same key launches after checking only what can change between calls: the
weight's tensors (data pointers and version counters: ``.data`` swaps, moves, in-place writes, load_state_dict), the
kernel options (a ``mixgemm.kernel_options`` block chooses afresh), and x being contiguous. What the key fixes (M,
dtype, device, K) was checked when the plan was made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.kernels.options import current_options

MAX_KEPT = 256  # prefill lengths vary: a bounded table, emptied when full
KEPT_ATTR = "_mixgemm_launches"  # the owner's __dict__ entry holding its PreparedTable


class PreparedTable(dict):
    """A table of prepared launches held by their owner (its kept launches, key -> Kept; a weight's call plans,
    mixgemm.ops.dispatch). Not copied with the owner: a deep copy or a pickle starts empty (the launches hold ctypes
    parameters pointing at the original's kernel layouts)."""

    def __deepcopy__(self, memo):
        return PreparedTable()

    def __reduce__(self):
        return PreparedTable, ()


@dataclass(frozen=True)
class Kept:
    token: tuple  # weight_token of the tensors the launch was prepared for
    launch: object  # a prepared launch: launch(x2d, bias, lo, hi) -> y
    n: int
    lo: float
    hi: float
    takes_rows: bool  # the launch reads a contiguous [..., K] of any rank and returns [..., N]


def version_of(t: torch.Tensor | None) -> int:
    """t's in-place version counter (0 for None, -1 for an inference tensor, which has none and cannot change outside
    inference mode)."""
    if t is None:
        return 0
    try:
        return t._version
    except RuntimeError:
        return -1


def weight_token(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 offsets: torch.Tensor | None) -> tuple:
    """What identifies the weight tensors a launch was prepared for (zeros / offsets None where the mode does not
    read them). Spelled out, not looped: it runs on every kept call."""
    return (qweight.data_ptr(), version_of(qweight), scales.data_ptr(), version_of(scales),
            -1 if zeros is None else zeros.data_ptr(), version_of(zeros),
            -1 if offsets is None else offsets.data_ptr(), version_of(offsets))


def holds_weight(token: tuple, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 offsets: torch.Tensor | None) -> bool:
    """Whether ``token`` (weight_token of the same arguments when kept) still holds for these tensors, compared in
    place rather than by building the token: the eager path's per-call check (one frame where weight_token takes
    five). An inference tensor (version -1 in the token: it has no counter) is compared by its pointer."""
    q_ptr, q_ver, s_ptr, s_ver, z_ptr, z_ver, o_ptr, o_ver = token
    if qweight.data_ptr() != q_ptr or scales.data_ptr() != s_ptr \
            or (q_ver >= 0 and qweight._version != q_ver) or (s_ver >= 0 and scales._version != s_ver):
        return False
    if zeros is None:
        if z_ptr != -1:
            return False
    elif zeros.data_ptr() != z_ptr or (z_ver >= 0 and zeros._version != z_ver):
        return False
    if offsets is None:
        return o_ptr == -1
    return offsets.data_ptr() == o_ptr and (o_ver < 0 or offsets._version == o_ver)


def forget(owner: dict) -> None:
    """Drop the launches ``owner`` keeps (its weight moved: they point at the old device's layouts)."""
    owner.pop(KEPT_ATTR, None)


def kept(owner: dict, key) -> Kept | None:
    """The launch ``owner`` (an object's __dict__) keeps under ``key``, if any and the kernel options are the
    default ones."""
    launches = owner.get(KEPT_ATTR)
    if not launches:
        return None
    hit = launches.get(key)
    return hit if hit is not None and current_options().is_default else None


def run_kept(hit: Kept, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """hit's product for x [..., K], or None when x is not contiguous or the bias is not an [N] vector on x's device
    (the caller takes the full path, which checks and names the problem)."""
    if not x.is_contiguous():
        return None
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != hit.n or bias.get_device() != x.get_device()):
        return None
    if hit.takes_rows or x.dim() == 2:
        return hit.launch(x, bias, hit.lo, hit.hi)
    return hit.launch(x.view(-1, x.shape[-1]), bias, hit.lo, hit.hi).view(*x.shape[:-1], hit.n)


def keep(owner: dict, key, token: tuple, launch, n: int, lo: float, hi: float, x: torch.Tensor) -> None:
    """Keep ``launch`` (None: nothing to keep) under key for the next call, when x is contiguous and the kernel
    options are the default ones."""
    if launch is None or not x.is_contiguous() or not current_options().is_default:
        return
    launches = owner.get(KEPT_ATTR)
    if launches is None:
        launches = owner[KEPT_ATTR] = PreparedTable()
    elif len(launches) >= MAX_KEPT or next(iter(launches.values())).token != token:
        # full, or kept for weight tensors that have changed since: their launches would hold the old layouts alive
        launches.clear()
    launches[key] = Kept(token, launch, n, lo, hi, bool(getattr(launch, "takes_rows", False)))
