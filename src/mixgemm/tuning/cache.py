"""The per-GPU tuning cache that `mixgemm tune` writes and the registry reads (mixgemm.kernels.registry).

Where: ``$MIXGEMM_TUNING_CACHE`` when set, else ``~/.cache/mixgemm/tuning/<gpu-slug>.json`` (the slug of the GPU's
name, :func:`gpu_slug`). Read once per process (:func:`reload` reads it again; plans a weight has
already made keep their config).

Keys are buckets, never exact shapes: a problem falls into the bucket of (op, weight format, activation dtype, entry
name, K class, N class, M bucket), with the shipped tables' bucket scheme (mixgemm.tuning.buckets: K and N as
half-octave classes round(2 log2 v), M as its power-of-two bucket). A cache entry, measured on one layer, covers
that layer's bucket (a shipped table's entry may cover a region of buckets). Each entry holds the config, the
measured times (default and tuned) and where it came from (GPU, date, mixgemm version, the command, the layer and
the bucket's K / N ranges). The registry uses an entry only for the entry it names, only on the
GPU the file was measured on, and an explicit ``kernel_options(configs=...)`` still wins. A *choice* entry (the key's
entry part ``CHOICE``, with an ``"entry"`` field) says which registry entry runs the bucket, with its config: `mixgemm
tune` writes one where an entry the tables decline softly (e.g. the tensor-core GEMV at fp16 M = 1, a GEMV past the
crossover) measured faster than the one chosen; the registry takes it while that entry can run (kernel_options'
force and disable still win).

File format (JSON): {"version": 1, "gpu": name, "entries": {bucket key: {"config": {...}, "default_us": t,
"tuned_us": t, "source": {...}}}}. A file that cannot be read or parsed gives a warning and is ignored.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from dataclasses import dataclass, field

import torch

from mixgemm.tuning.buckets import ShapeBucket, m_bucket
from mixgemm.tuning.buckets import half_octave as half_octave  # the K / N classes of the keys

VERSION = 1
ENV = "MIXGEMM_TUNING_CACHE"
CHOICE = "@entry"  # the entry part of a choice entry's key: which registry entry runs the bucket
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def gpu_slug(name: str) -> str:
    """A file-name-safe short name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    s = name.lower().replace("nvidia", "").strip()
    out = "".join(ch if ch.isalnum() else "-" for ch in s)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "gpu"


def format_key(bits: int, group_size: int, num_groups: int, mode: str) -> str:
    """``w4g128-sym`` / ``w8pc-zero_point``: the weight format a bucket is measured with."""
    grouping = "pc" if num_groups == 1 else f"g{group_size}"
    return f"w{bits}{grouping}-{mode}"


def bucket_key(problem, entry_name: str) -> str:
    """The cache key of a registry Problem for ``entry_name``: op, weight format, activation dtype, entry (with
    ``@layout`` for a weight that keeps one resident layout: its configs differ, and a plain weight's tuned config
    would send a compacted one's call to another entry), then the (K, N) bucket (half-octave classes) and M
    (power-of-two bucket)."""
    p = problem
    dtype = _DTYPES.get(p.x_dtype, str(p.x_dtype).replace("torch.", ""))
    fmt = format_key(p.bits, p.group_size, p.num_groups, p.mode)
    extra = f"/{p.act_mode}{'-token' if p.per_token else ''}" if p.op == "linear_a8" else ""
    entry = f"{entry_name}@{p.resident}" if p.resident else entry_name
    return f"{p.op}{extra}/{fmt}/{dtype}/{entry}/{ShapeBucket.of(p.k, p.n).key}/m{m_bucket(p.m)}"


def default_path(gpu_name: str) -> str:
    """$MIXGEMM_TUNING_CACHE, else ~/.cache/mixgemm/tuning/<gpu-slug>.json."""
    return _path(os.environ.get(ENV), os.environ.get("HOME"), gpu_name)


@functools.lru_cache(maxsize=16)
def _path(env: str | None, home: str | None, gpu_name: str) -> str:
    # cached on what it reads: the registry asks on every choice of a tunable entry
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "mixgemm", "tuning", f"{gpu_slug(gpu_name)}.json")


@dataclass
class TuningCache:
    gpu: str
    path: str = ""
    entries: dict = field(default_factory=dict)

    def lookup(self, problem, entry_name: str) -> dict | None:
        """A copy of the tuned config of the problem's bucket for ``entry_name``, or None."""
        hit = self.entries.get(bucket_key(problem, entry_name))
        return dict(hit["config"]) if hit else None

    def put(self, key: str, config: dict, default_us: float, tuned_us: float, source: dict,
            entry: str | None = None) -> None:
        """Store a bucket's config (``entry``: the registry entry that runs it, for a CHOICE key)."""
        self.entries[key] = {"config": dict(config), "default_us": round(default_us, 3),
                             "tuned_us": round(tuned_us, 3), "source": dict(source)}
        if entry is not None:
            self.entries[key]["entry"] = entry

    def to_json(self) -> dict:
        return {"version": VERSION, "gpu": self.gpu, "entries": dict(sorted(self.entries.items()))}


def _validate(data, path: str) -> TuningCache:
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("gpu"), str):
        raise ValueError(f"not a version-{VERSION} mixgemm tuning cache (needs 'version', 'gpu', 'entries')")
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise ValueError("'entries' must be an object")
    for key, val in entries.items():
        if not isinstance(val, dict) or not isinstance(val.get("config"), dict):
            raise ValueError(f"entry {key!r} has no 'config' object")
        if f"/{CHOICE}/" in key and not isinstance(val.get("entry"), str):
            raise ValueError(f"choice entry {key!r} has no 'entry' name")
    return TuningCache(data["gpu"], path, dict(entries))


def load(path: str) -> TuningCache | None:
    """The cache at ``path``; None when there is no file. A corrupt file warns and gives None (never raises)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return _validate(json.load(f), path)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        warnings.warn(f"mixgemm: ignoring the tuning cache {path}: {e}", RuntimeWarning, stacklevel=2)
        return None


def save(cache: TuningCache, path: str | None = None) -> str:
    """Write the cache (atomically: a temporary file renamed over the old one); returns the path."""
    path = path or cache.path or default_path(cache.gpu)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(cache.to_json(), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    cache.path = path
    return path


_LOADED: dict[str, TuningCache | None] = {}
_WARNED: set = set()


def for_gpu(gpu_name: str) -> TuningCache | None:
    """The cache this process uses for a GPU (read on first use; None when absent, corrupt, or measured on another
    GPU -- that one warns once)."""
    path = default_path(gpu_name)
    if path not in _LOADED:
        _LOADED[path] = load(path)
    cache = _LOADED[path]
    if cache is None:
        return None
    if cache.gpu != gpu_name:
        if (path, gpu_name) not in _WARNED:
            _WARNED.add((path, gpu_name))
            warnings.warn(f"mixgemm: ignoring the tuning cache {path} on {gpu_name}: it was measured on {cache.gpu}",
                          RuntimeWarning, stacklevel=2)
        return None
    return cache


def lookup(problem, entry_name: str) -> tuple[dict, str] | None:
    """(config, where: the cache file, the bucket key and the layer it was measured on) for the problem's bucket and
    entry on its GPU, or None (CPU problems: None)."""
    dev = problem.device
    if not dev.is_cuda or not dev.name:
        return None
    cache = for_gpu(dev.name)
    if cache is None:
        return None
    key = bucket_key(problem, entry_name)
    hit = cache.entries.get(key)
    if hit is None:
        return None
    shape = hit.get("source", {}).get("shape")
    return dict(hit["config"]), f"{cache.path}, {key}" + (f" (measured on K x N {shape})" if shape else "")


def choice(problem) -> tuple[str, dict, str] | None:
    """(entry name, config, where) of the CHOICE entry for the problem's bucket on its GPU, or None."""
    hit = lookup(problem, CHOICE)
    if hit is None:
        return None
    cfg, where = hit
    cache = for_gpu(problem.device.name)
    return cache.entries[bucket_key(problem, CHOICE)]["entry"], cfg, where


def reload() -> None:
    """Forget the caches read so far: the next lookup reads the file again."""
    _LOADED.clear()
    _WARNED.clear()
