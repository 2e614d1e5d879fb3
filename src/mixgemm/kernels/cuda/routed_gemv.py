"""Routed GEMV for mixture-of-experts decoding: every (token, expert) slot of a routing in one launch.

``routed_gemv(x, route, stack, x_div)`` computes, for each slot s of ``route`` (int64 [S], the router's top-k expert
ids flattened), ``y[s] = x[s // x_div] @ dequant(W[route[s]]).T + bias[route[s]]`` (zeros for an id outside
``[0, E)``: expert parallelism's sentinel), with the experts' ``wgmma_v1`` layouts joined in one E-strided buffer
(``ExpertLayouts``, made by mixgemm.nn.expert_stack). The kernel is the CUDA-core GEMV on wgmma_v1
(gemv_wg_simt.cu, its SIMT_ROUTED build): blockIdx.x is a slot, which reads its expert id on the GPU, blockIdx.y
a tile of rows (so that slots of one expert, adjacent where the caller sorts them, meet its tile in L2 together).

Why: a decoding MoE layer otherwise runs each routed expert's projections as layers of their own, which needs the
routing on the host (a synchronisation per layer, and no CUDA graph) and two launches per routed expert -- 16 for
Qwen3-MoE's top 8 --, where an eager decode step is bound by its host time. Here it is two launches a layer and no
host round trip. The tile is the M = 1 tile (kernels.cuda_gemv_wg_simt.host.wg_simt_config) of an S x N-row layer:
the launch puts S x N rows on the SMs, as one layer of that height would.

x: float16 / bfloat16 [R, K] (R * x_div == S) on an sm_90 GPU; returns [S, N] in x.dtype on the current stream,
capturable in a CUDA graph once compiled (no host synchronisation; the only allocation is the output, and a padded
copy of x where K is no multiple of 64).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import _ACT, _MODE, _SCL
from mixgemm.kernels.cuda.launch import LaunchCache, new_rows, pdl_on
from mixgemm.kernels.cuda_gemv_wg_simt.host import SIMT_KERNEL, SIMT_SOURCE, simt_defines_for, wg_simt_config
from mixgemm.kernels.cuda_wgmma.layout import WgmmaLayout

# the per-call parameters' positions in the kernel's parameter list (_args)
_X, _XSTRIDE, _Y, _YSTRIDE, _ROUTE = 2, 3, 4, 5, 16


@dataclass(eq=False)
class ExpertLayouts:
    """The ``wgmma_v1`` layouts of one projection's E experts as one buffer: ``layout`` is the joined layout (weight
    and params the E experts' back to back, each ``weight.shape[0] // E`` row blocks; n, k one expert's), ``bias``
    None or [E, N] (contiguous), ``scale_dtype`` the experts' scale dtype. Prepared launches are kept here."""

    layout: WgmmaLayout
    num_experts: int
    scale_dtype: torch.dtype
    bias: torch.Tensor | None = None
    launches: LaunchCache = field(default_factory=lambda: LaunchCache(64), repr=False)


def routed_gemv(x: torch.Tensor, route: torch.Tensor, stack: ExpertLayouts, x_div: int) -> torch.Tensor:
    """y [S, N] with y[s] = x[s // x_div] @ dequant(W[route[s]]).T + bias[route[s]] (module docstring)."""
    lay = stack.layout
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 2 or x.shape[1] != lay.k:
        raise ValueError(f"routed_gemv takes float16 / bfloat16 x [rows, {lay.k}], got {x.dtype} {tuple(x.shape)}")
    if route.dtype != torch.int64 or route.dim() != 1 or not route.is_contiguous():
        raise ValueError(f"route must be a contiguous int64 [slots], got {route.dtype} {tuple(route.shape)}")
    slots = route.shape[0]
    if x_div < 1 or x.shape[0] * x_div != slots:
        raise ValueError(f"{slots} slots need {slots} / x_div = {slots / max(x_div, 1):g} rows of x, got "
                         f"{x.shape[0]} (x_div {x_div})")
    if x.device != lay.weight.device or route.device != x.device:
        raise ValueError(f"x ({x.device}), route ({route.device}) and the experts ({lay.weight.device}) must be on "
                         f"one device")
    if slots == 0:
        return x.new_empty(0, lay.n)
    xk = x
    if lay.k_padded != lay.k or x.stride(1) != 1 or (x.stride(0) * x.element_size()) % 16 or x.data_ptr() % 16:
        xk = x.new_zeros(x.shape[0], lay.k_padded)
        xk[:, :lay.k] = x
    launch = stack.launches.get((slots, x.dtype, x_div, x.device.index),
                                lambda: _prepare(stack, slots, x.dtype, x.device, x_div))
    y = new_rows(slots, lay.n, x.dtype, x.device)
    v = launch.params.values
    with launch.params.lock:  # (launch.Params: written and launched by one thread at a time)
        v[_X].value = xk.data_ptr()
        v[_XSTRIDE].value = xk.stride(0) * xk.element_size() // 16
        v[_Y].value = y.data_ptr()
        v[_YSTRIDE].value = lay.n
        v[_ROUTE].value = route.data_ptr()
        launch()
    return y


def routed_config(stack: ExpertLayouts, slots: int, x_dtype: torch.dtype, device: torch.device) -> dict:
    """The tile of a routed launch: the M = 1 tile of the CUDA-core GEMV on wgmma_v1 for a layer of slots x N rows."""
    lay = stack.layout
    props = torch.cuda.get_device_properties(device)
    cfg = wg_simt_config(slots * lay.n, lay.k, lay.bits, props.multi_processor_count, props.name, lay.mode,
                         _ACT[x_dtype], _SCL[stack.scale_dtype], nvrtc.arch_of(device), True,
                         int(lay.group_size == 32))
    return {**cfg, "G32": int(lay.group_size == 32)}


def _prepare(stack: ExpertLayouts, slots: int, x_dtype: torch.dtype, dev: torch.device, x_div: int):
    lay, e = stack.layout, stack.num_experts
    cfg = routed_config(stack, slots, x_dtype, dev)
    defs = {**simt_defines_for(lay.bits, _ACT[x_dtype], _SCL[stack.scale_dtype], _MODE[lay.mode], cfg),
            "SIMT_ROUTED": 1}
    fn = nvrtc.get_function(SIMT_SOURCE, SIMT_KERNEL, defs, dev)
    rows = cfg["RG"] * cfg.get("RT", 1) * 16
    grid = (slots, -(-lay.n // rows), 1)  # (slots first: the kernel's SIMT_ROUTED order)
    if grid[1] > 65535:
        raise ValueError(f"routed_gemv: {lay.n} rows per expert make {grid[1]} row tiles, over the grid's 65535")
    block = (32 * cfg["RG"] * cfg["KS"], 1, 1)
    bias = stack.bias
    args = [
        ctypes.c_void_p(lay.weight.data_ptr()), ctypes.c_void_p(lay.params.data_ptr()),
        ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(0),  # x, its stride, y, its stride
        *nvrtc.bias_clamp_args(bias, -math.inf, math.inf),
        ctypes.c_int(lay.n), ctypes.c_int(lay.k_tiles), ctypes.c_int(lay.num_groups), ctypes.c_int(lay.gk),
        ctypes.c_int(1), ctypes.c_void_p(0),  # one row a slot; no permutation
        ctypes.c_void_p(0),  # the routing (per call)
        ctypes.c_int(e),
        ctypes.c_longlong(lay.weight.numel() // e // 16),  # uint4 a expert
        ctypes.c_longlong(lay.params.numel() // e * lay.params.element_size()),
        ctypes.c_int(x_div),
        ctypes.c_longlong(0 if bias is None else bias.stride(0) * bias.element_size()),
    ]
    return nvrtc.prepare_launch(fn, dev, grid, block, args, 0, pdl=pdl_on(dev))


__all__ = ["ExpertLayouts", "routed_config", "routed_gemv"]
