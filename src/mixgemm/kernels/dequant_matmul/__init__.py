"""``dequant_cublas``: a weight-only linear run as dequantize-then-cuBLAS, where that measures faster.

A prefill GEMM is compute-bound; where mixgemm's quantized GEMM loses to fp16 / bf16 cuBLAS (a partial last wave, a
short K, a tile that does not suit the shape), the layer runs its float form instead: one Triton kernel expands the
weight's resident ``wgmma_v1`` codes into a transient [N, K] buffer (the caching allocator hands the same block to
every layer, so it costs one layer's float weight, at most ROW_BLOCK_BYTES: larger layers go in row blocks), then
torch.mm. Which route runs is measured, not guessed: the first eager call of a layer at an M bucket races this entry
against the entry the registry would pick otherwise (mixgemm.kernels.race) and keeps the winner for the process
(mixgemm.tuning.races); until a race has run (e.g. inside a CUDA-graph capture) the quantized kernel runs.
"""

from __future__ import annotations

import torch

from mixgemm.formats.weight import narrow_group_reason
from mixgemm.kernels import race
from mixgemm.kernels.layouts import WGMMA_V1
from mixgemm.kernels.registry import KernelEntry, Problem, no, triton_ok
from mixgemm.tuning.buckets import m_bucket

NAME = "dequant_cublas"
# Below this M the dequantize pass (2.5-3 bytes per weight written and read back by cuBLAS) costs more than the whole
# fp16 GEMM of that M on a GPU with ~150-200 FLOP per byte of bandwidth (H100 / H200): it cannot win, so no race.
DEQUANT_MIN_M = 512
# The float copy's largest block: larger layers (a 128k-vocabulary head) are dequantized and multiplied in row blocks
ROW_BLOCK_BYTES = 512 << 20
_HALF = (torch.float16, torch.bfloat16)


def race_key(p: Problem) -> tuple:
    """The race's key: the exact layer, format, activation dtype and GPU, and M's power-of-two bucket."""
    return ("linear", p.device.name, p.device.index, p.n, p.k, p.bits, p.group_size, p.num_groups, p.mode, p.x_dtype,
            p.resident, m_bucket(p.m))


def _static_reason(p: Problem) -> str | None:
    if not p.device.is_cuda:
        return "needs a CUDA device"
    if not p.device.sm90:
        return "reads wgmma_v1, the layout Hopper (sm_90) weights keep; other GPUs keep the Triton GEMM's"
    if p.x_dtype not in _HALF:
        return f"activation dtype {p.x_dtype} (takes float16 / bfloat16)"
    if p.bits not in (4, 8):
        return f"{p.bits}-bit weights"
    if narrow := narrow_group_reason(p.group_size, p.num_groups):
        return f"reads wgmma_v1, which cannot hold {narrow.split(':')[0]}"
    if p.m < DEQUANT_MIN_M:
        return f"M={p.m} below DEQUANT_MIN_M={DEQUANT_MIN_M} (the dequantize pass alone outweighs the GEMM)"
    if not triton_ok("mixgemm.kernels.dequant_matmul.wgmma_v1_dequant"):
        return "Triton unavailable"
    return None


def can_run(p: Problem):
    why = _static_reason(p)
    if why is not None:
        return no(why)
    return race.decision(p, NAME, race_key(p), torch.device("cuda", p.device.index),
                         p.qw is not None and tuple(p.qw.shape) == (p.n, p.k), _routes(p))


def _routes(p: Problem):
    """The race's two calls on a random x of p's shape: the rival entry's and this one's."""

    def routes(rival):
        qw, inf = p.qw, float("inf")
        x = torch.randn(p.m, p.k, dtype=p.x_dtype, device=qw.device)

        def rival_call():
            return rival.entry.run(x, qw, None, -inf, inf, rival.config)

        def own_call():
            return run(x, qw, None, -inf, inf, None)

        return rival_call, own_call

    return routes


def config(p: Problem):
    return race.measured_config(race_key(p))


def row_block(n: int, k: int, element_size: int) -> int:
    """Rows dequantized at a time: all of them, or a multiple of 128 (the layout's row block) within ROW_BLOCK_BYTES."""
    rows = ROW_BLOCK_BYTES // max(1, k * element_size) // 128 * 128
    return n if rows >= n else max(128, rows)


def run(x2d, qw, bias, lo, hi, config):
    from mixgemm.kernels.dequant_matmul.wgmma_v1_dequant import dequantize_wgmma_v1

    lay = qw.layout(WGMMA_V1.name, WGMMA_V1.builder)
    n, k = qw.shape
    b = None if bias is None else bias.to(x2d.dtype)
    rows = row_block(n, k, x2d.element_size())
    if rows >= n:
        w = dequantize_wgmma_v1(lay, torch.empty(n, k, dtype=x2d.dtype, device=x2d.device))
        y = torch.mm(x2d, w.t()) if b is None else torch.addmm(b, x2d, w.t())
    else:
        y = torch.empty(x2d.shape[0], n, dtype=x2d.dtype, device=x2d.device)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            w = dequantize_wgmma_v1(lay, torch.empty(r1 - r0, k, dtype=x2d.dtype, device=x2d.device), r0)
            y[:, r0:r1] = torch.mm(x2d, w.t()) if b is None else torch.addmm(b[r0:r1], x2d, w.t())
    if lo > float("-inf") or hi < float("inf"):
        y.clamp_(lo, hi)
    return y


def _perm(p: Problem, config) -> str:
    return "cuBLAS reads x as it is; the caller's gather is small next to a prefill GEMM"


def _candidates(p: Problem) -> list[dict]:
    return []  # no config to vary: `mixgemm tune` times the route itself (a bucket's choice of entry)


ENTRY = KernelEntry(NAME, "linear", can_run, config, run, WGMMA_V1,
                    "dequantize to a transient float buffer + cuBLAS, where a race measured it faster",
                    candidates=_candidates, input_perm=_perm, reads_any=(WGMMA_V1.name,))
