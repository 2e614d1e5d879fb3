"""``triton_a8``: the Triton int8 tensor-core GEMM (int8_gemm.py) after the activation quantizer, any M, on its own
layout ``int8_v1`` (layout.py: signed codes, every weight mode rewritten as w = c * s + m).
"""

from __future__ import annotations

from mixgemm.kernels import int8_activations as shared
from mixgemm.kernels.layouts import INT8_V1
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, triton_ok

NAME = "triton_a8"


def can_run(p: Problem):
    if not shared.triton_device_ok(p):
        return no("needs a CUDA device (or TRITON_INTERPRET=1)")
    if not (triton_ok("mixgemm.kernels.triton_a8.int8_gemm") and triton_ok("mixgemm.kernels.triton_a8.layout")):
        return no("Triton unavailable")
    if p.group_size < 32 and not p.per_channel:
        return no(f"groups of {p.group_size}: the int8-activation kernels take groups of 32 or more")
    if p.bits == 4:
        from mixgemm.kernels.triton_a8.layout import pick_half

        try:
            pick_half(p.group_size, p.k)
        except ValueError as e:
            return no(str(e))
    return OK


def config(p: Problem) -> dict:
    from mixgemm.kernels.triton_a8.int8_gemm import pick_config
    from mixgemm.kernels.triton_a8.layout import pick_half

    half = pick_half(p.group_size, p.k) if p.bits == 4 else 0
    return pick_config(p.m, p.n, p.k, p.bits, p.group_size, p.per_channel, half)


def run(x2d, qw, bias, lo, hi, config, p: Problem, out_dtype):
    from mixgemm.kernels.triton_a8.int8_gemm import a8_gemm
    from mixgemm.kernels.triton_a8.layout import get_int8_layout

    lay = get_int8_layout(qw)
    blk = p.k if p.per_token else p.group_size
    aq, sa, oa, suma = shared.act_quant(x2d, blk, p.act_mode)
    if blk != lay.group_size:
        sa, oa, suma = shared.per_group_params(aq, sa, oa, suma, p.act_mode, lay.group_size)
    return a8_gemm(aq, sa, oa, suma, lay, p.act_mode == "asym", bias, lo, hi, out_dtype, config=config)


ENTRY = KernelEntry(NAME, "linear_a8", can_run, config, run, INT8_V1, "Triton int8 tensor-core GEMM, any M")
