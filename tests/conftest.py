"""Shared test fixtures: seeded generators, rel_err, and auto-skip of `gpu`-marked tests without CUDA.

* ``rng``: numpy Generator, seed 0 (fresh per test). ``torch_gen``: torch.Generator (CPU), seed 0.
* ``rel_err``: fixture returning the function rel_err(a, b) = ||a - b|| / ||b|| in float64
  (numpy arrays or torch tensors; 0 when both are zero, inf when only b is). Session-scoped, so it is
  usable in hypothesis tests.
* ``@pytest.mark.gpu``: such tests are skipped when torch.cuda.is_available() is False.
* hypothesis profile "mixgemm": no example database (nothing written to .hypothesis/), no deadline.
* MIXGEMM_TUNING_CACHE points at a file that does not exist: the tests see the untuned dispatch, whatever
  `mixgemm tune` wrote on this machine (tests/tuning/test_tuning.py points it at its own files).
* ``isolated_tuning``: NVRTC reported available and the tuning cache at the test's tmp_path / "tuning.json", for
  registry tests (``pytestmark = pytest.mark.usefixtures("isolated_tuning")``).
* Under pytest-xdist each worker runs torch on its share of the cores (cores // workers threads, at least 1): two
  workers of two threads each on 2 cores spend their time switching and spinning, not computing.
* Modules marked ``pytestmark = pytest.mark.slow(seconds=S)`` (S: about how many CPU seconds the module takes on
  one core, its fixtures and the processes it starts included) run first, longest first, the rest as collected.
  scripts/test.sh hands out whole modules (``--dist loadfile``: a module-scoped fixture is built once, not once per
  worker) in this order (``--no-loadscope-reorder``), so the longest modules start at once instead of bounding the
  run's end.
* The run ends with one line saying how many tests were skipped and why (on a CPU machine almost all are the GPU
  tests).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import settings

# CPU machines run the Triton kernels under the interpreter. Set here, before pytest imports any test module: triton
# reads the switch when a kernel module decorates its kernels, so a kernel module imported before it was set would run
# compiled-mode Triton on CPU tensors, in whichever test files happen to be collected after it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))  # the processes a test starts

# No example database: keeps .hypothesis/ out of the working tree; examples come from the seeds in each test.
settings.register_profile("mixgemm", database=None, deadline=None)
settings.load_profile("mixgemm")
os.environ["MIXGEMM_TUNING_CACHE"] = os.path.join(tempfile.gettempdir(), f"mixgemm-tests-{os.getpid()}",
                                                  "no-tuning-cache.json")


def _rel_err(a, b) -> float:
    a = a.detach().cpu().double().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.float64)
    b = b.detach().cpu().double().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"rel_err: shapes differ, {a.shape} vs {b.shape}")
    num, den = float(np.linalg.norm((a - b).ravel())), float(np.linalg.norm(b.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


@pytest.fixture(scope="session")
def rel_err():
    return _rel_err


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def torch_gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.fixture
def isolated_tuning(monkeypatch, tmp_path):
    """Registry tests without a GPU or the user's tuning: NVRTC reported available, the tuning cache at
    tmp_path / "tuning.json" (absent until a test writes it), reloaded before and after."""
    from mixgemm.kernels import linear_common
    from mixgemm.tuning import cache as tcache

    monkeypatch.setattr(linear_common, "nvrtc_ok", lambda: True)
    monkeypatch.setenv(tcache.ENV, str(tmp_path / "tuning.json"))
    tcache.reload()
    yield
    tcache.reload()


NO_GPU = "needs a CUDA GPU"


def _slow_seconds(item) -> float:
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", 1))


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -_slow_seconds(item))  # stable: the rest stay in collection order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """One line saying why tests were skipped: the GPU tests first (those whose reason names a GPU or CUDA), by
    reason, then the other reasons."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    by_count = lambda d: "; ".join(f"{n} {why}" for why, n in sorted(d.items(), key=lambda kv: -kv[1]))
    gpu = {why: n for why, n in reasons.items() if "GPU" in why or "CUDA" in why}
    other = {why: n for why, n in reasons.items() if why not in gpu}
    parts = []
    if gpu:
        where = "no CUDA device" if not torch.cuda.is_available() else "not for this GPU"
        parts.append(f"{sum(gpu.values())} GPU tests skipped: {where} ({by_count(gpu)})")
    if other:
        parts.append(f"{sum(other.values())} other tests skipped ({by_count(other)})")
    if parts:
        terminalreporter.write_line("; ".join(parts))
