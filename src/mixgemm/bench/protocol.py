"""Timing per the benchmark protocol (docs/benchmarking.md).

* ``graph_time_us(fns)``: ``fns`` are C callables, one per layer copy (the copies together exceed 3x L2).
  One CUDA graph calls them back to back; the median replay time (triton.testing.do_bench,
  return_mode="median") divided by C is the cost of one call in a graph-captured decode step: no L2 reuse
  between calls, no host launch overhead.
* ``eager_time_us(fns)``: the same C calls without a graph (host launch overhead included), median / C.
* ``ceilings()``: device-to-device copy of 1 GiB (bytes read + written / time), an 8192^3 fp16 matmul
  (flop/s) and an 8192^3 ``torch._int_mm`` (int op/s), measured in the same run.
* ``cpu_time_us(fn)``: the CPU path (median wall-clock time), for machines without a GPU.
* ``synced_call_us(fn)``: host wall time per eager call, the device synchronized after each batch of calls (what an
  eager caller waits for; per-call overhead checks, not the protocol's kernel timing).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch

from mixgemm.tuning.cache import gpu_slug as gpu_slug  # the tuning cache names its files with it

MIN_COPIES = 3  # the protocol asks for at least 2-3 copies even when one copy already exceeds 3x L2
DEFAULT_MAX_BYTES = 20 * 2**30  # cap on the memory the C copies of one layer may take


def _do_bench(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    """Median time of fn in ms: triton's do_bench when importable, else CUDA events."""
    try:
        from triton.testing import do_bench
    except ImportError:  # pragma: no cover - triton ships with torch on CUDA machines
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    times = []
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    for _ in range(max(5, int(rep_ms / est))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def l2_bytes(device: torch.device | int | None = None) -> int:
    return int(torch.cuda.get_device_properties(device or 0).L2_cache_size)


def copies_for(bytes_per_copy: int, l2: int, min_copies: int = MIN_COPIES,
               max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Number of layer copies C: together they exceed 3x L2 (C * bytes > 3 * l2), at least ``min_copies``,
    and at most what fits in ``max_bytes`` (never below 1)."""
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy must be positive, got {bytes_per_copy}")
    need = 3 * l2 // bytes_per_copy + 1  # smallest C with C * bytes > 3 * L2
    c = max(min_copies, need)
    return max(1, min(c, max_bytes // bytes_per_copy))


def _warm(fns: Sequence[Callable[[], object]]) -> None:
    # Warm-up on a side stream, as torch.cuda.graphs recommends before capture: lazy initialization
    # (kernel compilation, layout repacking, cuBLAS workspaces) must not happen inside the capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def capture_graph(fns: Sequence[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of the calls fns back to back (warmed up first, outside the capture)."""
    _warm(fns)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def graph_time_us(fns: Sequence[Callable[[], object]], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of one call (us) when C calls over distinct layer copies replay as one CUDA graph."""
    g = capture_graph(fns)
    try:
        return _do_bench(g.replay, warmup_ms, rep_ms) * 1e3 / len(fns)
    finally:
        del g


def eager_time_us(fns: Sequence[Callable[[], object]], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of one call (us) for C eager calls back to back (host launch overhead included)."""

    def run():
        for f in fns:
            f()

    return _do_bench(run, warmup_ms, rep_ms) * 1e3 / len(fns)


def cpu_time_us(fn: Callable[[], object], min_reps: int = 3, budget_s: float = 0.25) -> float:
    """Median wall-clock time (us) of fn on the CPU: one warm-up call, then repeats within a small budget."""
    fn()
    times = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_reps or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def synced_call_us(fn: Callable[[], object], calls: int = 1, repeats: int = 200, warmup: int = 20) -> float:
    """Median over ``repeats`` of the wall time (us) per call of ``calls`` back-to-back calls of fn followed by a device
    synchronize; calls = 1: what an eager caller waits for one synchronized call."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def copy_bandwidth(warmup_ms: float = 25, rep_ms: float = 100, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s (1 GiB, bytes read + written / median time): the memory ceiling
    every floor is measured against."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    t = _do_bench(partial(torch.Tensor.copy_, torch.empty_like(src), src), warmup_ms, rep_ms) * 1e-3
    return 2 * n / t


def ceilings(quick: bool = False, device: str = "cuda") -> dict:
    """The ceilings of this run.

    GPU: copy_bw (bytes/s, 1 GiB device-to-device copy, read + written), fp16_flops (8192^3 F.linear-style
    matmul), int8_ops (8192^3 torch._int_mm, None when unavailable). CPU: a 64 MiB copy and a 1024^3 float32
    matmul, int8 None.
    """
    if device == "cpu":
        n = 64 << 20
        src = torch.empty(n, dtype=torch.uint8)
        t = cpu_time_us(partial(torch.Tensor.copy_, torch.empty_like(src), src), budget_s=0.1) * 1e-6
        s = 1024
        tm = cpu_time_us(partial(torch.mm, torch.randn(s, s), torch.randn(s, s)), budget_s=0.1) * 1e-6
        return {"copy_bw": 2 * n / t, "fp16_flops": None, "fp32_flops": 2 * s**3 / tm, "int8_ops": None}
    warm, rep = (10, 40) if quick else (25, 100)
    copy_bw = copy_bandwidth(warm, rep, device)
    s = 8192
    gen = torch.Generator(device=device).manual_seed(1234)
    # Random data, not zeros: tensor-core power and clocks depend on the bit patterns.
    rnd = partial(torch.randn, s, s, device=device, dtype=torch.float16, generator=gen)
    t_mm = _do_bench(partial(torch.nn.functional.linear, rnd(), rnd()), warm, rep) * 1e-3
    int8_ops = None
    try:
        rint = partial(torch.randint, -128, 128, (s, s), device=device, dtype=torch.int8, generator=gen)
        # column-major B (a transposed view): the layout cuBLASLt's int8 path wants
        t_i8 = _do_bench(partial(torch._int_mm, rint(), rint().t()), warm, rep) * 1e-3
        int8_ops = 2 * s**3 / t_i8
    except (RuntimeError, AttributeError):
        pass
    torch.cuda.empty_cache()
    return {"copy_bw": copy_bw, "fp16_flops": 2 * s**3 / t_mm, "int8_ops": int8_ops}


def _nvidia_smi() -> dict:
    fields = ["driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.limit",
              "temperature.gpu"]
    try:
        cmd = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    line = out.strip().splitlines()[0] if out.strip() else ""
    vals = [v.strip() for v in line.split(",")]
    return dict(zip(fields, vals, strict=False)) if len(vals) == len(fields) else {}


def machine_info(device: str = "cuda") -> dict:
    """GPU name, clocks, driver, L2, SMs and software versions (torch, triton, CUDA, Python)."""
    info = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host_cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import mixgemm

        info["mixgemm"] = mixgemm.__version__
    except ImportError:  # pragma: no cover
        info["mixgemm"] = None
    if device == "cpu":
        info["gpu"] = "CPU (no CUDA GPU)"
        return info
    p = torch.cuda.get_device_properties(0)
    info.update({
        "gpu": p.name,
        "cuda": torch.version.cuda,
        "capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "l2_bytes": int(p.L2_cache_size),
        "memory_bytes": int(p.total_memory),
    })
    smi = _nvidia_smi()
    if smi:
        info["driver"] = smi.pop("driver_version", None)
        info["clocks"] = smi
    return info


def gpu_dir(name: str) -> str:
    """The results folder of a device: the model, without vendor words or memory size ('NVIDIA H100 80GB HBM3' ->
    'h100', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'); 'cpu' for a CPU run."""
    words = [w for w in name.lower().replace("(", " ").split() if w not in ("nvidia", "geforce", "tesla")]
    if not words or words[0] == "cpu":
        return "cpu"
    keep = []
    for w in words:
        keep.append(w)
        if any(ch.isdigit() for ch in w):
            break
    return gpu_slug(" ".join(keep))


def fmt_rate(v: float | None, unit: str) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v / 1e12:.2f} {unit}"
