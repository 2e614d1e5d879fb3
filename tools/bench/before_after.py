"""Before / after on the same machine: the cases of two or more `mixgemm bench` result files, paired by (K, N, M,
method), as time ratios after / before, with fp16 cuBLAS (timed in both) as the control for drift.

    PYTHONPATH=src python -m tools.bench.before_after --before DIR_OR_JSON... --after DIR_OR_JSON... \
        [--pair "mixgemm W4A16 g128 compact=mixgemm W4A16 g128"] [--compact-to-plain] [--limit 1.03] [--json OUT]

A directory is searched for `*.json` result files (any depth); several files per side merge (each case once). A
method of the after side is compared with the before side's method of the same name, or with the one `--pair` names
(``AFTER=BEFORE``); `--compact-to-plain` pairs every ``... compact`` method with its name less `` compact`` (what a
model holds now against what the functional API ran before). Printed: each pair's cases with after / before and
whether it is over `--limit` both as measured and with the control's drift at that (K, N, M) divided out, then per
method the geometric mean and the worst case. Exit 0; the verdict is in the table (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass

CONTROL = "fp16 cuBLAS"


@dataclass
class Pair:
    after_method: str
    before_method: str
    K: int
    N: int
    M: int
    before_us: float
    after_us: float
    ratio: float        # after / before
    drift: float        # the control's after / before at this (K, N, M), 1.0 when it was not timed in both
    corrected: float    # ratio / drift

    def over(self, limit: float) -> bool:
        """Slower than ``limit`` both as measured and with the control's drift divided out."""
        return self.ratio > limit and self.corrected > limit


def load_cases(paths: list[str]) -> tuple[dict[tuple, float], set[str]]:
    """((K, N, M, method) -> graph time in us, the GPUs named in the files' meta), from result files or folders
    holding them."""
    files: list[str] = []
    gpus: set[str] = set()
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"{p}: no such file or folder")
        files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True)) if os.path.isdir(p) else [p]
    cases: dict[tuple, float] = {}
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        if not (isinstance(data, dict) and isinstance(data.get("results"), list)):
            continue
        gpus.add(str(data.get("meta", {}).get("gpu", "unknown")))
        for r in data["results"]:
            t = r.get("graph_us") or r.get("time_us")
            if r.get("status", "ok") == "ok" and t and "K" in r:
                cases[(r["K"], r["N"], r["M"], r["method"])] = float(t)
    if not cases:
        raise SystemExit(f"no `mixgemm bench` cases in {paths}")
    return cases, gpus


def method_pairs(after_methods: set[str], before_methods: set[str], explicit: list[str],
                 compact_to_plain: bool) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for spec in explicit:
        a, sep, b = spec.partition("=")
        if not sep:
            raise SystemExit(f"--pair {spec!r}: expected AFTER=BEFORE")
        pairs.append((a.strip(), b.strip()))
    named = {a for a, _ in pairs}
    for a in sorted(after_methods - named):
        if compact_to_plain and a.endswith(" compact") and a[: -len(" compact")] in before_methods:
            pairs.append((a, a[: -len(" compact")]))
        if a in before_methods and a != CONTROL:
            pairs.append((a, a))
    return pairs


def compare(before: dict[tuple, float], after: dict[tuple, float], pairs: list[tuple[str, str]]) -> list[Pair]:
    out = []
    for a, b in pairs:
        for (k, n, m, meth), t_after in sorted(after.items()):
            if meth != a or (k, n, m, b) not in before:
                continue
            t_before = before[(k, n, m, b)]
            c_b, c_a = before.get((k, n, m, CONTROL)), after.get((k, n, m, CONTROL))
            drift = c_a / c_b if c_a and c_b else 1.0
            ratio = t_after / t_before
            out.append(Pair(a, b, k, n, m, t_before, t_after, ratio, drift, ratio / drift))
    return out


def report(pairs: list[Pair], limit: float) -> str:
    lines = ["| after | before | K x N | M | before us | after us | after / before | cuBLAS drift | corrected | |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        flag = "**over**" if p.over(limit) else ""
        lines.append(f"| {p.after_method} | {p.before_method} | {p.K}x{p.N} | {p.M} | {p.before_us:.1f} | "
                     f"{p.after_us:.1f} | {p.ratio:.3f} | {p.drift:.3f} | {p.corrected:.3f} | {flag} |")
    lines += ["", "| after | before | cases | geomean after / before | worst | over the limit |",
              "|---|---|---|---|---|---|"]
    for a, b in dict.fromkeys((p.after_method, p.before_method) for p in pairs):
        mine = [p for p in pairs if (p.after_method, p.before_method) == (a, b)]
        worst = max(mine, key=lambda p: min(p.ratio, p.corrected))
        over = sum(1 for p in mine if p.over(limit))
        lines.append(f"| {a} | {b} | {len(mine)} | {statistics.geometric_mean([p.ratio for p in mine]):.3f} | "
                     f"{min(worst.ratio, worst.corrected):.3f} ({worst.K}x{worst.N} M={worst.M}) | {over} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--pair", action="append", default=[], help="AFTER=BEFORE method names (repeatable)")
    ap.add_argument("--compact-to-plain", action="store_true",
                    help="pair each '... compact' method of the after side with its plain name on the before side")
    ap.add_argument("--limit", type=float, default=1.03,
                    help="flag cases slower than this, as measured and with the drift divided out")
    ap.add_argument("--json", default=None, help="write the pairs here")
    args = ap.parse_args(argv)
    (before, gpus_before), (after, gpus_after) = load_cases(args.before), load_cases(args.after)
    if gpus_before != gpus_after or len(gpus_before) != 1:
        raise SystemExit(f"before ({sorted(gpus_before)}) and after ({sorted(gpus_after)}) must come from one GPU "
                         "model: compare timings of the same machine only")
    pairs = compare(before, after, method_pairs({k[3] for k in after}, {k[3] for k in before}, args.pair,
                                                args.compact_to_plain))
    if not pairs:
        print("no case is in both sides", file=sys.stderr)
        return 1
    print(report(pairs, args.limit))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(p) for p in pairs], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
