"""mixgemm's tuning data and its lookup: the one place where measured numbers live.

The kernels never look tuning up: the registry's entries (mixgemm.kernels.registry) read it here and hand each
kernel its config. Data: the per-GPU tables (src/mixgemm/tuning/<gpu>.json, below; each file's "gpu" field and
each section's "source" say which benchmark measured it), mixgemm.tuning.gemv_m1 (the GEMV's M = 1 tiles) and
mixgemm.tuning.conv_table (the convolution sweeps).

A table is chosen from the GPU name (``H100`` -> h100.json, ``H200`` -> h200.json, anything else ->
default.json). Its fields:

* ``gemv_max_m``: {"4": m, "8": m}: largest M served by the CUDA GEMV per weight bit width (measured
  crossover; the GEMV supports M <= 16). ``gemv_max_m_no_wgmma`` (optional): the same where the Triton GEMM, not the
  wgmma GEMM, takes over (fp32 activations, MIXGEMM_WGMMA=0).
* ``gemv_all_m_below_n`` (optional): layers with fewer output features than this keep the GEMV for every M <= 16
  (their wgmma grid is under one wave and needs split-K, which costs more than it saves at small M).
* ``wgmma_from_m`` (optional): {exact weight key (``w4g128``, ``w8pc``...): {"KxN": m}}: on that exact layer shape
  and weight format the wgmma GEMM serves every M >= m (measured there to beat the GEMV down to that M); it takes
  precedence over the two rules above and applies only where the wgmma GEMM runs.
* ``gemm``: {weight key: {shape key: {M bucket: config}}}, weight key ``w4g`` / ``w4pc`` / ``w8g`` /
  ``w8pc`` (bits, grouped or per-channel), shape key ``KxN`` or ``*`` (any shape), M bucket the
  smallest power of two >= M, capped at 16384 (as a string). A shape without its own entry uses the
  entry of the nearest listed shape (by log-distance of K and N), then ``*``.
* ``wgmma``: the same structure for the Hopper wgmma GEMM (mixgemm.kernels.cuda.gemm_wgmma; keys BM, NWG,
  STAGES, INFLIGHT, SPLIT, GROUP_M), which serves fp16 / bf16 activations on sm_90 past the GEMV.
* A missing M bucket takes the nearest listed bucket.

No autotuning at run time: the same (M, N, K, weight format, GPU) always yields the same config.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

import torch

from mixgemm.formats.weight import QuantizedWeight

BUCKETS = tuple(1 << i for i in range(15))  # 1 .. 16384


def m_bucket(m: int) -> int:
    for b in BUCKETS:
        if m <= b:
            return b
    return BUCKETS[-1]


def gpu_table_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "default"
    return table_name_for(torch.cuda.get_device_name(device))


def table_name_for(gpu_name: str) -> str:
    """The table of a GPU model name ("NVIDIA H100 80GB HBM3" -> "h100"; unknown GPUs -> "default")."""
    name = gpu_name.upper()
    for key in ("H200", "H100"):
        if key in name:
            return key.lower()
    return "default"


@functools.cache
def load_table(name: str) -> dict:
    """The parsed table ``name`` (h100, h200, default)."""
    path = resources.files("mixgemm.tuning").joinpath(f"{name}.json")
    if not path.is_file():
        path = resources.files("mixgemm.tuning").joinpath("default.json")
    return json.loads(path.read_text())


@functools.cache
def _device_table(index: int | None, type_: str) -> dict:
    dev = torch.device(type_, index) if index is not None else torch.device(type_)
    return load_table(gpu_table_name(dev))


def table_for(device: torch.device) -> dict:
    return _device_table(device.index, device.type)


def weight_key(qw: QuantizedWeight) -> str:
    return f"w{qw.bits}{'pc' if qw.num_groups == 1 else 'g'}"


def _nearest_shape(entries: dict, k: int, n: int):
    exact = f"{k}x{n}"
    if exact in entries:
        return entries[exact]
    best, best_d = None, math.inf
    for key, val in entries.items():
        if key == "*":
            continue
        kk, nn = (int(v) for v in key.split("x"))
        d = abs(math.log(kk / k)) + abs(math.log(nn / n))
        if d < best_d:
            best, best_d = val, d
    if best is None or best_d > math.log(4.0):
        return entries.get("*", best)
    return best


def _nearest_bucket(buckets: dict, m: int) -> dict:
    b = m_bucket(m)
    keys = sorted(int(x) for x in buckets)
    pick = min(keys, key=lambda v: (abs(math.log2(v) - math.log2(b)), -v))
    return buckets[str(pick)]


def table_entry(table: dict, section: str, m: int, n: int, k: int, qw: QuantizedWeight) -> dict | None:
    """A copy of the config ``table`` lists for this problem in ``section`` ("gemm" / "wgmma"), or None."""
    entries = table.get(section, {}).get(weight_key(qw))
    if entries:
        buckets = _nearest_shape(entries, k, n)
        if buckets:
            return dict(_nearest_bucket(buckets, m))
    return None


def exact_weight_key(qw: QuantizedWeight) -> str:
    """``w<bits>g<group size>`` or ``w<bits>pc``: the key of the per-shape fields that depend on the group size."""
    return f"w{qw.bits}pc" if qw.num_groups == 1 else f"w{qw.bits}g{qw.group_size}"


def gemv_max_m(table: dict, qw: QuantizedWeight, n: int | None = None, wgmma: bool = True,
               k: int | None = None) -> int:
    """Largest M that goes to the CUDA GEMV for a layer of n output features and k input features, when the wgmma
    GEMM (wgmma=True) or the Triton GEMM serves larger M (from ``table``, a GPU's table; 16 if not listed)."""
    if wgmma and n is not None and k is not None:
        from_m = table.get("wgmma_from_m", {}).get(exact_weight_key(qw), {}).get(f"{k}x{n}")
        if from_m is not None:
            return int(from_m) - 1
    if n is not None and n < table.get("gemv_all_m_below_n", 0):
        return 16
    limits = table.get("gemv_max_m", {}) if wgmma else table.get("gemv_max_m_no_wgmma", table.get("gemv_max_m", {}))
    return int(limits.get(str(qw.bits), 16))


# ------------------------------------------------------------------ int8-activation linear: kernel ranges by M
# Source: tools/bench/gemv_a8.py and tools/bench/int8.py (H200, then H100), the fused CUDA GEMV against the
# Triton kernel's 16-row mma tile: M = 2 won on both LLM shapes, M = 4 lost on 28672x8192 and for W8 per-channel,
# M = 16 was 3.5x slower (the dp4a work grows with M, the tensor-core tile's does not).
A8_GEMV_MAX_M = 2
# Source: tools/bench/wgmma_a8.py (H200 / H100): from this M the sym x sym calls with a wgmma_a8_v1 weight take
# the CUDA int8 wgmma GEMM instead of the Triton kernel.
A8_WGMMA_MIN_M = 128
# Source: tools/bench/wgmma_a8.py cross sweep (H200): int8 per-channel weights go back to the Triton kernel from
# this M (its persistent TMA kernel was ~10% faster at M = 2048 / 16384 on 8192x28672, a tie on 28672x8192; below
# it the CUDA kernel won, 2x at M = 128), except where the CUDA kernel's BM 256 / MC 2 tiles apply
# (gemm_wgmma_a8.w8_wide_region: K >= 8192, M >= 2048), where tools/bench/int8.py --w8-cuda measured it 4-8%
# faster (H100).
A8_W8_PER_CHANNEL_TRITON_FROM_M = 1024
