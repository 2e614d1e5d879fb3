"""The M = 1 GEMV that reads ``wgmma_v1`` as one stream of bulk copies (gemv_wg_stream.cu; why there).

``prepare_stream(qw, x_dtype, device, cfg)`` builds the launch once (a GemvLaunch: call it with x2d [1, K], bias, lo,
hi). Config keys: CW consumer warps (8 / 4 / 2), S ring stages, BPS blocks per SM (0: as many as fit).
"""

from __future__ import annotations

import ctypes

import torch

from mixgemm.formats.layouts_wgmma import build_wgmma_v1
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import pdl_on

SOURCE = "gemv_wg_stream.cu"
KERNEL = "mixgemm_gemv_wg_stream"
LAYOUT = "wgmma_v1"
ROW_GROUP = 128

_ACT = {torch.float16: 0, torch.bfloat16: 1}
_SCL = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_MODE = {"sym": 0, "zero_point": 1, "offset": 2}


def stream_defines(bits: int, act: int, scl: int, mode: int, g32: bool, cfg: dict) -> dict:
    d = {"WGS_BITS": bits, "WGS_ACT": act, "WGS_SCL": scl, "WGS_MODE": mode, "WGS_G32": int(g32),
         "WGS_CW": cfg["CW"], "WGS_S": cfg["S"]}
    if cfg.get("PACK", 0) and mode != 0 and scl != 2:
        d["WGS_PACK"] = 1
    return d


def unit_bytes(bits: int) -> int:
    """Bytes of one unit: the 8 row tiles (128 rows) of one 64-k tile."""
    return 8 * 512 * (bits // 4)


def stream_grid(n: int, k_tiles: int, per_sm: int, num_sms: int) -> int:
    """Blocks: as many as the SMs hold (per_sm each), at most one per unit."""
    return max(1, min(-(-n // ROW_GROUP) * k_tiles, per_sm * num_sms))


class StreamLaunch:
    """A prepared stream GEMV: the GemvLaunch and the workspace it reduces split row groups through."""

    def __init__(self, launch, workspace: torch.Tensor, counters: torch.Tensor, grid: int):
        self.launch, self.workspace, self.counters, self.grid = launch, workspace, counters, grid

    def __call__(self, x2d, bias=None, lo=float("-inf"), hi=float("inf")):
        return self.launch(x2d, bias, lo, hi)


def prepare_stream(qw: QuantizedWeight, x_dtype: torch.dtype, dev: torch.device, cfg: dict) -> StreamLaunch:
    from mixgemm.kernels.cuda.gemv import GemvLaunch, _common_args

    n = qw.out_features
    fresh = not qw.has_layout(LAYOUT)
    lay = qw.layout(LAYOUT, build_wgmma_v1)
    props = torch.cuda.get_device_properties(dev)
    defs = stream_defines(qw.bits, _ACT[x_dtype], _SCL[qw.scales.dtype], _MODE[qw.mode], lay.group_size == 32, cfg)
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, dev)
    smem = cfg["S"] * unit_bytes(qw.bits)
    nvrtc.allow_dynamic_smem(fn, smem)
    threads = 32 * (cfg["CW"] + 1)
    per_sm = nvrtc.resident_blocks(fn, threads, smem)
    if cfg.get("BPS", 0):
        per_sm = min(per_sm, cfg["BPS"])
    grid = stream_grid(n, lay.k_tiles, per_sm, props.multi_processor_count)
    groups = -(-n // ROW_GROUP)
    ws = torch.zeros(groups * ROW_GROUP, dtype=torch.float32, device=dev)
    cnt = torch.zeros(groups, dtype=torch.int32, device=dev)
    args = _common_args(lay, n) + [
        ctypes.c_int(lay.k_tiles),
        ctypes.c_int(lay.num_groups),
        ctypes.c_int(lay.gk),
        ctypes.c_int(1),
        ctypes.c_void_p(ws.data_ptr()),
        ctypes.c_void_p(cnt.data_ptr()),
        ctypes.c_void_p(0),  # the permutation slot GemvLaunch writes (act-order is not served)
    ]
    launch = nvrtc.prepare_launch(fn, dev, (grid, 1, 1), (threads, 1, 1), args, smem, pdl=pdl_on(dev),
                                  first_without_pdl=fresh)
    return StreamLaunch(GemvLaunch(launch, lay, 1, n, x_dtype, dev), ws, cnt, grid)
