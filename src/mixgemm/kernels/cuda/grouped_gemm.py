"""Grouped GEMM for mixture-of-experts prefill: every expert's tokens through its weights in one tensor-core launch.

``grouped_gemm(x, route, stack)`` computes, for each row s of ``x`` (float16 / bfloat16 [S, K], rows sorted by
expert: ``route`` int64 [S] ascending, ids past the experts last), ``y[s] = x[s] @ dequant(W[route[s]]).T +
bias[route[s]]``, and zeros for the rows of no local expert (expert parallelism's sentinel ids), with the experts'
``wgmma_v1`` layouts joined in one E-strided buffer (``ExpertLayouts``, mixgemm.nn.expert_stack). The kernel is the
Hopper wgmma GEMM (gemm_wgmma.cu) built with ``WG_GROUPED``: grid x the weight-row tiles of one expert, grid y the
entries of a tile table made on the GPU from the routing (``tile_table``): each entry one expert and BM of its rows,
so each expert's weights are read once per BM of its tokens and multiplied on the tensor cores.

Why: past a few tokens per expert the routed GEMV (mixgemm.kernels.cuda.routed_gemv) is bound by its CUDA-core math
(each slot multiplies all of its expert's weights), and the per-expert path by the host (two layers' launches and a
host round trip per routed expert). Here it is one launch a projection, no host round trip (the table's size is an
upper bound: S / BM + min(E, S) entries), capturable in a CUDA graph.

The tile: BM rows of one expert per CTA, the power of two (16..128) at or above the slots' mean per reached expert,
two warpgroups (128 weight rows), the TMA loader, two 64-k tiles a stage (``grouped_config``;
tools/bench/moe_grouped_tiles.py times its variants).
"""

from __future__ import annotations

import ctypes
import math

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import LaunchCache
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import Grouped, OutputRows, _prepare_launch, _prepare_x


def reached_experts(slots: int, num_experts: int) -> float:
    """The experts a uniform routing of ``slots`` (token, expert) pairs reaches, on average."""
    return num_experts * (1 - (1 - 1 / num_experts) ** slots) if num_experts else 0.0


def grouped_config(slots: int, num_experts: int) -> dict:
    """The tile of a grouped launch of ``slots`` rows over ``num_experts`` experts (module docstring)."""
    mean = slots / max(reached_experts(slots, num_experts), 1.0)
    bm = 16
    while bm < min(mean, 128):
        bm *= 2
    return {"BM": bm, "NWG": 2, "STAGES": 4, "INFLIGHT": 1, "TMA": 1, "KT": 2, "GROUP_M": 1, "SPLIT": 1,
            "TSTORE": 0, "PDL": 0}


def table_entries(slots: int, num_experts: int, bm: int) -> int:
    """Rows of the tile table: an upper bound of sum over experts of ceil(rows / BM)."""
    return -(-slots // bm) + min(num_experts, slots)


def tile_table_reference(route: torch.Tensor, num_experts: int, bm: int, entries: int) -> torch.Tensor:
    """int32 [entries, 4]: {expert, first row, end row, 0} of each BM-row tile of each expert's run of the sorted
    ``route``, then {-1, 0, 0, 0} (no tile): what expert_tiles.cu computes, in torch ops (any device; the test
    oracle)."""
    experts = torch.arange(num_experts, device=route.device)
    ends = torch.searchsorted(route, experts, right=True)
    counts = ends - torch.searchsorted(route, experts)
    tiles = (counts + bm - 1) // bm
    tile_ends = torch.cumsum(tiles, 0)
    j = torch.arange(entries, device=route.device)
    e = torch.searchsorted(tile_ends, j, right=True).clamp_(max=num_experts - 1)
    first = ends[e] - counts[e] + (j - (tile_ends[e] - tiles[e])) * bm
    valid = j < tile_ends[-1]
    zero = torch.zeros_like(e)
    table = torch.stack([torch.where(valid, e, -1), torch.where(valid, first, zero), torch.where(valid, ends[e], zero),
                         zero], dim=1)
    return table.to(torch.int32)


_TABLES = LaunchCache(64)  # the table kernel's launches by (S, E, BM, entries, device)


def tile_table(route: torch.Tensor, num_experts: int, bm: int) -> torch.Tensor:
    """The tile table (tile_table_reference) of the sorted int64 ``route`` on its CUDA device, in one launch
    (expert_tiles.cu); [table_entries(S, E, BM), 4] int32."""
    slots = route.shape[0]
    entries = table_entries(slots, num_experts, bm)
    table = torch.empty(entries, 4, dtype=torch.int32, device=route.device)

    def prepare():
        fn = nvrtc.get_function("expert_tiles.cu", "mixgemm_expert_tiles", {}, route.device)
        args = [ctypes.c_void_p(0), ctypes.c_int(slots), ctypes.c_int(num_experts), ctypes.c_int(bm),
                ctypes.c_int(entries), ctypes.c_void_p(0)]
        return nvrtc.prepare_launch(fn, route.device, (1, 1, 1), (min(1024, max(32, num_experts)), 1, 1), args,
                                    (3 * num_experts + 1) * 4)

    launch = _TABLES.get((slots, num_experts, bm, entries, route.device.index), prepare)
    v = launch.params.values
    with launch.params.lock:  # (launch.Params: written and launched by one thread at a time)
        v[0].value, v[5].value = route.data_ptr(), table.data_ptr()
        launch()
    return table


def grouped_gemm(x: torch.Tensor, route: torch.Tensor, stack, config: dict | None = None,
                 zero_unrouted: bool = True, table: torch.Tensor | None = None) -> torch.Tensor:
    """y [S, N] (module docstring); ``stack`` an ExpertLayouts, ``config`` the tile (None: grouped_config);
    zero_unrouted False leaves the rows of no local expert unwritten (a caller that never reads them); ``table`` the
    routing's tile table for the config's BM (tile_table; None: made here), shared by a layer's two projections."""
    lay, e = stack.layout, stack.num_experts
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 2 or x.shape[1] != lay.k:
        raise ValueError(f"grouped_gemm takes float16 / bfloat16 x [rows, {lay.k}], got {x.dtype} {tuple(x.shape)}")
    if route.dtype != torch.int64 or route.shape != (x.shape[0],):
        raise ValueError(f"route must be int64 [{x.shape[0]}] (one expert id per row of x), got {route.dtype} "
                         f"{tuple(route.shape)}")
    if x.device != lay.weight.device or route.device != x.device:
        raise ValueError(f"x ({x.device}), route ({route.device}) and the experts ({lay.weight.device}) must be on "
                         f"one device")
    slots = x.shape[0]
    if slots == 0:
        return x.new_empty(0, lay.n)
    y = (torch.zeros if zero_unrouted else torch.empty)(slots, lay.n, dtype=x.dtype, device=x.device)
    cfg = dict(config) if config is not None else grouped_config(slots, e)
    xk = _prepare_x(x if x.stride(1) == 1 else x.contiguous())
    bm = int(cfg["BM"])
    entries = table_entries(slots, e, bm)
    if entries > 65535:
        raise ValueError(f"grouped_gemm: {slots} rows over {e} experts make up to {entries} tiles of {bm} rows, over "
                         f"the grid's 65535; run fewer tokens a call")
    bias = stack.bias
    key = ("grouped", slots, x.dtype, xk.stride(0), x.device.index, tuple(sorted(cfg.items())))

    def prepare():
        props = torch.cuda.get_device_properties(x.device)
        grouped = Grouped(lay, e, entries, 0 if bias is None else bias.stride(0) * bias.element_size())
        return _prepare_launch(None, slots, x.dtype, xk.stride(0), xk.shape[1], None,
                               OutputRows(x.dtype, lay.n, True, x.device), lay.n, cfg, True, props, 0,
                               grouped=grouped)

    part = stack.launches.get(key, prepare)
    if table is None:
        table = tile_table(route, e, bm)
    elif table.shape != (entries, 4) or table.dtype != torch.int32:
        raise ValueError(f"table must be int32 [{entries}, 4] (tile_table for BM {bm}), got {table.dtype} "
                         f"{tuple(table.shape)}")
    part(xk, y, bias, -math.inf, math.inf, table)
    return y


__all__ = ["grouped_config", "grouped_gemm", "reached_experts", "table_entries", "tile_table", "tile_table_reference"]
