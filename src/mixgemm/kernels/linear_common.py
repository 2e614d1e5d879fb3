"""What the weight-only linear entries (mixgemm.kernels.cuda_gemv_mma, cuda_gemv, cuda_wgmma, triton_gemm) share: the
problem of a call, the toolchain checks, the rows_v1 config wrapper and the tuning candidates' helpers."""

from __future__ import annotations

import functools
import os

import torch

import mixgemm.tuning as tuning
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.layouts import ROWS_V1
from mixgemm.kernels.registry import DeviceInfo, Layout, Problem, device_info

GEMV_MAX_M = 16  # the GEMVs' own limit; the tuning table may lower it per bit width
HALF = (torch.float16, torch.bfloat16)
FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def linear_problem(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device | DeviceInfo,
                   act_order: bool = False) -> Problem:
    n, k = qw.shape
    g, ng = qw.config.groups(k)
    dev = device if isinstance(device, DeviceInfo) else device_info(device)
    return Problem("linear", m, n, k, x_dtype, dev, qw.bits, g, ng, qw.mode, act_order=act_order,
                   resident=qw.resident, qw=qw)


@functools.cache
def nvrtc_ok() -> bool:
    from mixgemm.kernels.cuda import nvrtc

    return nvrtc.nvrtc_available()


def triton_device_ok(p: Problem) -> bool:
    return p.device.is_cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def scale_dtype(p: Problem) -> torch.dtype:
    """The weight's scale dtype; a problem without its weight object counts as fp16 scales."""
    return torch.float16 if p.qw is None else p.qw.scales.dtype


def arch(p: Problem) -> str:
    """The device's NVRTC target (sm_90 for a problem without one: the rules' reference GPU)."""
    major, minor = p.device.capability
    return f"sm_{major}{minor}" if major else "sm_90"


def one_axis_variants(base: dict, axes: dict, legal) -> list[dict]:
    """Tuning candidates: ``base`` with one key of ``axes`` ({key: values}) changed at a time, kept where
    ``legal(config)``; no duplicates, base itself left out (the tuner times it as the default)."""
    out: list[dict] = []
    for key, values in axes.items():
        for v in values:
            cfg = {**base, key: v}
            if cfg != base and cfg not in out and legal(cfg):
                out.append(cfg)
    return out


def pow2_neighbours(v: int, lo: int, hi: int) -> list[int]:
    return [x for x in (v // 2, v * 2) if lo <= x <= hi]


def gemm_perm(p: Problem, config: dict | None) -> str:
    return "the GEMMs read x in tiles without a gather; the separate gather is small next to a prefill GEMM"


def on_rows(fn):
    """An entry's config (or complete) function that adds ROWS 1 for a weight kept in rows_v1: the same tiles as on the
    plain codes / wgmma_v1, read in rows_v1 (gemv.cu GEMV_ROWS, gemv_mma.cu MMA_ROWS, gemm_wgmma.cu WG_ROWS)."""

    @functools.wraps(fn)
    def wrapped(p: Problem, *args):
        cfg = fn(p, *args)
        if cfg is None or p.resident != ROWS_V1.name:
            return cfg
        out = {**cfg, "ROWS": 1, **({"WG": 0} if "WG" in cfg else {})}
        src = getattr(cfg, "source", "")
        return tuning.SourcedConfig(out, src) if src else out

    return wrapped


def rows_or(layout: Layout):
    """layout_for: rows_v1 with config ROWS, else ``layout``."""
    return lambda config: ROWS_V1 if config and config.get("ROWS", 0) else layout
