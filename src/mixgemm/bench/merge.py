"""Splitting a long run and merging its parts into one results file per GPU (`mixgemm bench --merge`, `--fold`).

A part replaces the cases (K, N, M, method) it measures and keeps the others; a shape's M is measured whole within
one run (every method at that M), so each speedup still compares two timings of the same run.
"""

from __future__ import annotations

import json
import os

from mixgemm.bench import protocol

RUN_FIELDS = ("date_utc", "argv", "wall_s", "torch", "triton", "driver", "clocks_after")


def load(path: str, gpu: str) -> dict | None:
    """The results file to merge into, or None when there is none yet. Refuses another GPU's file."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--merge: cannot read {path} ({e})") from None
    if not (isinstance(data, dict) and "meta" in data and isinstance(data.get("results"), list)):
        raise ValueError(f"--merge: {path} is not a `mixgemm bench` results file")
    theirs = data["meta"].get("gpu")
    mine = "CPU (no CUDA GPU)" if gpu == "cpu" else gpu
    if theirs != mine:
        raise ValueError(f"--merge: {path} holds results of {theirs!r}, this run is on {mine!r}")
    return data


def _key(r: dict) -> tuple:
    return (r.get("layer"), r["K"], r["N"], r["M"], r["method"])


def _plan_key(shape, m: int) -> tuple:
    """(layer, K, N, M) of a plan entry's case at M: a (K, N) shape's, or a conv layer's name and implicit GEMM."""
    if isinstance(shape, tuple):
        return (None, *shape, m)
    mm, k, n = shape.gemm_dims(m)
    return (shape.name, k, n, mm)


def remaining(plan: list[tuple], methods: list[str], previous: dict) -> tuple[list[tuple], list[tuple]]:
    """(the plan less what previous already holds, the shapes left out whole). A matmul shape keeps the M values at
    which some method's case is not held (all methods run again there, so the speedups compare timings of one run);
    a shape with none left is left out; a conv layer (ConvSpec) likewise by batch. A case counts as held when it was
    measured, does not apply (n/a), its format cannot hold the layer (refused) or its method cannot run on this
    machine; an M with a WRONG or error case runs again."""
    held = {_key(r) for r in previous["results"] if r.get("status") in ("ok", "n/a", "refused")}
    skip_methods = set(previous.get("unavailable") or {})
    todo, done = [], []
    for shape, ms in plan:
        left = [m for m in ms
                if not all((*_plan_key(shape, m), meth) in held or meth in skip_methods for meth in methods)]
        if left:
            todo.append((shape, left))
        else:
            done.append(shape)
    return todo, done


def _run_summary(meta: dict, ceilings: dict | None) -> dict:
    return {**{k: meta[k] for k in RUN_FIELDS if k in meta}, "ceilings": ceilings}


def combine(previous: dict, part: dict) -> dict:
    """previous with part's cases replacing the same (K, N, M, method) cases; meta and ceilings of part, and
    meta["runs"] listing every run merged so far (date, argv, ceilings...)."""
    new_keys = {_key(r) for r in part["results"]}
    results = [r for r in previous["results"] if _key(r) not in new_keys] + list(part["results"])
    runs = list(previous["meta"].get("runs") or [_run_summary(previous["meta"], previous.get("ceilings"))])
    meta = {**part["meta"], "runs": runs + [_run_summary(part["meta"], part.get("ceilings"))]}
    # a shape the part's time budget left out is missing only if no run holds it (a part measured apart from the
    # file, then folded in, lists shapes the file already has)
    held = {r.get("layer") or f"{r['K']}x{r['N']}" for r in results}
    left = [s for s in meta.get("not_run") or [] if s not in held]
    meta.pop("not_run", None)
    if left:
        meta["not_run"] = left
    out = {**previous, **part, "meta": meta, "results": results}
    if previous.get("layers") or part.get("layers"):
        out["layers"] = {**(previous.get("layers") or {}), **(part.get("layers") or {})}
    names = {m["name"]: m for m in (previous.get("methods") or []) + (part.get("methods") or [])}
    if names:
        out["methods"] = list(names.values())
    return out


def fold(part_path: str, out_dir: str, suite: str | None = None) -> tuple[dict, str]:
    """(the merged data, its path prefix): a results file measured apart (another run's OUT/<gpu>/<suite>.json) folded
    into OUT/<gpu>/<suite>.json, its cases replacing the same (K, N, M, method) cases (combine). The suite is the
    part's file name unless given; the GPU its own meta's. Refuses a file that is not a results file or another GPU's
    results."""
    try:
        with open(part_path) as f:
            part = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--fold: cannot read {part_path} ({e})") from None
    if not (isinstance(part, dict) and isinstance(part.get("meta"), dict) and isinstance(part.get("results"), list)):
        raise ValueError(f"--fold: {part_path} is not a `mixgemm bench` results file")
    gpu = part["meta"].get("gpu") or "cpu"
    suite = suite or os.path.splitext(os.path.basename(part_path))[0]
    prefix = os.path.join(out_dir, protocol.gpu_dir(gpu), suite)
    previous = load(prefix + ".json", gpu)
    if previous is None:
        raise ValueError(f"--fold: no {prefix}.json to fold {part_path} into")
    data = combine(previous, part)
    if previous.get("accept") is not None or part.get("accept") is not None:
        # a model run's acceptance view: the part's read ceiling, else the file's (as --merge keeps it)
        pct = (part.get("accept") or {}).get("read_ceiling_pct")
        if pct is None:
            pct = (previous.get("accept") or {}).get("read_ceiling_pct")
        data["accept"] = {"read_ceiling_pct": pct}
    return data, prefix
