"""Splitting a long run and merging its parts into one results file per GPU (`mixgemm bench --merge`).

A part replaces the cases (K, N, M, method) it measures and keeps the others; a shape is measured whole within
one run (every method at each of its M), so each speedup still compares two timings of the same run.
"""

from __future__ import annotations

import json
import os

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
    return (r["K"], r["N"], r["M"], r["method"])


def remaining(plan: list[tuple], methods: list[str], previous: dict) -> tuple[list[tuple], list[tuple]]:
    """(the plan less the matmul shapes whose every (method, M) case previous already holds, the shapes left out).
    A case counts as held when it was measured, does not apply (n/a) or its method cannot run on this machine;
    shapes with a WRONG or error case run again."""
    held = {_key(r) for r in previous["results"] if r.get("status") in ("ok", "n/a")}
    skip_methods = set(previous.get("unavailable") or {})
    todo, done = [], []
    for shape, ms in plan:
        if isinstance(shape, tuple) and all((*shape, m, meth) in held or meth in skip_methods
                                            for m in ms for meth in methods):
            done.append(shape)
        else:
            todo.append((shape, ms))
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
    out = {**previous, **part, "meta": meta, "results": results}
    if previous.get("layers") or part.get("layers"):
        out["layers"] = {**(previous.get("layers") or {}), **(part.get("layers") or {})}
    names = {m["name"]: m for m in (previous.get("methods") or []) + (part.get("methods") or [])}
    if names:
        out["methods"] = list(names.values())
    return out
