"""What the int8-activation entries (op "linear_a8": cuda_gemv_a8, cuda_gemv_a8_wg, cuda_wgmma_a8, triton_a8) share:
the op's Problem, the activation quantizer the GEMMs run before their launch, and the checks of their can_run.

Run contract of the op: ``run(x2d, qw, bias, lo, hi, config, problem, out_dtype) -> [M, N]`` (problem carries
act_mode and per_token; x2d [M, K], M >= 1). Every entry quantizes the activations in the problem's act_mode
(mixgemm.formats.activation) or declines it in can_run; the integer GEMMs take the codes and scales of either
symmetric mode alike.
"""

from __future__ import annotations

import torch

from mixgemm.formats.activation import SYMMETRIC_ACT_MODES, QuantizedActivation
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.linear_common import nvrtc_ok, triton_device_ok  # noqa: F401  (the entries call them through here)
from mixgemm.kernels.registry import DeviceInfo, Problem, device_info

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# "sym_full" codes reach -128: an int32 sum of K products of two int8 codes holds K * 128 * 128 for K below this
SYM_FULL_MAX_K = (2**31 - 1) // (128 * 128)


def a8_problem(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device | DeviceInfo, act_mode: str,
               per_token: bool) -> Problem:
    n, k = qw.shape
    g, ng = qw.config.groups(k)
    dev = device if isinstance(device, DeviceInfo) else device_info(device)
    return Problem("linear_a8", m, n, k, x_dtype, dev, qw.bits, g, ng, qw.mode, act_mode, per_token or ng == 1,
                   resident=qw.resident, qw=qw)


def act_quant(x2d: torch.Tensor, block: int, act_mode: str, out=None):
    """(q, scales, offsets, sums) of x2d [M, K] per token and per block (bit-identical either way): the one-pass CUDA
    row kernel (x read once) for whole-row blocks where it applies, else the Triton tile kernel."""
    if x2d.is_cuda and block == x2d.shape[1]:
        from mixgemm.kernels.cuda import act_quant_rows

        if act_quant_rows.act_quant_rows_supported(x2d, block):
            return act_quant_rows.act_quant_rows(x2d, act_mode, out=out)
    from mixgemm.kernels.triton.act_quant import act_quant as triton_act_quant

    return triton_act_quant(x2d, block, act_mode, out=out)


def per_group_params(q: torch.Tensor, sa: torch.Tensor, oa: torch.Tensor, sums: torch.Tensor, act_mode: str,
                     group: int):
    """Per-token activation parameters ([M, 1]) described per weight group ([M, G]) for the Triton kernel, which
    takes them per group (QuantizedActivation.regroup: one extra pass over the codes for the sums; the CUDA kernels
    take per-token scales directly)."""
    r = QuantizedActivation(q, sa, oa, sums, q.shape[1], act_mode).regroup(group)
    return r.scales, r.offsets, r.sums


def symmetric_cuda_reason(p: Problem) -> str | None:
    """Why an entry of the symmetric int8 kernels (cuda_wgmma_a8, cuda_gemv_a8_wg) cannot run p for its device or its
    activation mode (None when it can)."""
    if not p.device.is_cuda:
        return "needs a CUDA device"
    if p.act_mode not in SYMMETRIC_ACT_MODES:
        return f"act_mode {p.act_mode!r} (takes sym activations: {SYMMETRIC_ACT_MODES})"
    return None


def wgmma_a8_reason(p: Problem) -> str | None:
    """Why the ``wgmma_a8_v1`` layout cannot hold p's weight (None when it can): what cuda_wgmma_a8 and
    cuda_gemv_a8_wg, which both read it, decline."""
    from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported

    if a8_layout_supported(p.qw):
        return None
    return (f"the wgmma_a8_v1 layout takes sym int4 / int8 weights with group 128, 256 or per-channel, got "
            f"mode={p.mode!r} bits={p.bits} group={p.group_size}")
