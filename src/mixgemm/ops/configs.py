"""The shipped GEMM dispatch tables (src/mixgemm/configs/<gpu>.json) and their lookup.

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
    name = torch.cuda.get_device_name(device).upper()
    for key in ("H200", "H100"):
        if key in name:
            return key.lower()
    return "default"


@functools.cache
def load_table(name: str) -> dict:
    """The parsed table ``name`` (h100, h200, default)."""
    path = resources.files("mixgemm.configs").joinpath(f"{name}.json")
    if not path.is_file():
        path = resources.files("mixgemm.configs").joinpath("default.json")
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


def _table_entry(section: str, m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device) -> dict | None:
    """A copy of the config the shipped table lists for this problem in ``section`` ("gemm" / "wgmma"), or None."""
    entries = table_for(device).get(section, {}).get(weight_key(qw))
    if entries:
        buckets = _nearest_shape(entries, k, n)
        if buckets:
            return dict(_nearest_bucket(buckets, m))
    return None


def gemm_config(m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device) -> dict:
    """The GEMM tile config for this problem on this device (table entry, else the kernel's default)."""
    from mixgemm.kernels.triton.gemm import auto_split, default_config, num_sms

    sms = num_sms(device)
    cfg = _table_entry("gemm", m, n, k, qw, device)
    if cfg is None:
        return default_config(m, n, k, qw.bits, qw.num_groups == 1, sms)
    if cfg.get("SPLIT_K", "auto") == "auto":
        cfg["SPLIT_K"] = auto_split(m, n, k, cfg, sms, qw.bits)
    return cfg


def wgmma_config(m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device) -> dict:
    """The Hopper wgmma GEMM's tile config (table section ``wgmma``, same keys as ``gemm``; else its default)."""
    from mixgemm.kernels.cuda.gemm_wgmma import auto_split, default_config
    from mixgemm.kernels.triton.gemm import num_sms

    sms = num_sms(device)
    cfg = _table_entry("wgmma", m, n, k, qw, device)
    if cfg is None:
        return default_config(m, n, k, sms)
    if cfg.get("SPLIT", "auto") == "auto":
        cfg["SPLIT"] = auto_split(m, n, k, cfg, sms)
    return cfg


def exact_weight_key(qw: QuantizedWeight) -> str:
    """``w<bits>g<group size>`` or ``w<bits>pc``: the key of the per-shape fields that depend on the group size."""
    return f"w{qw.bits}pc" if qw.num_groups == 1 else f"w{qw.bits}g{qw.group_size}"


def gemv_max_m(qw: QuantizedWeight, device: torch.device, n: int | None = None, wgmma: bool = True,
               k: int | None = None) -> int:
    """Largest M that goes to the CUDA GEMV on this device for a layer of n output features and k input features,
    when the wgmma GEMM (wgmma=True) or the Triton GEMM serves larger M (from the table; 16 if not listed)."""
    table = table_for(device)
    if wgmma and n is not None and k is not None:
        from_m = table.get("wgmma_from_m", {}).get(exact_weight_key(qw), {}).get(f"{k}x{n}")
        if from_m is not None:
            return int(from_m) - 1
    if n is not None and n < table.get("gemv_all_m_below_n", 0):
        return 16
    limits = table.get("gemv_max_m", {}) if wgmma else table.get("gemv_max_m_no_wgmma", table.get("gemv_max_m", {}))
    return int(limits.get(str(qw.bits), 16))
