"""GPU check of `mixgemm bench --model`: one model's layer shapes through the whole path on a CUDA GPU.

Runs the acceptance methods (fp16 cuBLAS, W4A16 g128 sym and zero-point, W8A16 per-channel, W8A8 per-token, W4A8
per-token with integer group scales) on every distinct layer shape of one model at M = 1, 16, 2048, then a
second part at M = 256 merged into the same file (--merge), and prints the acceptance view. About 2 minutes on
an H100 for llama-3-8b (6 shapes).

    PYTHONPATH=src python -m tools.checks.model_bench --out DIR [--model llama-3-8b]

Writes DIR/<gpu>/model-<name>.{json,md}. Exits non-zero when a case is WRONG or raised, when the merge lost
cases, or when the acceptance view is missing; the acceptance verdicts themselves are reported, not asserted.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import torch

from mixgemm.bench import accept, models
from mixgemm.bench.cli import main as bench_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="llama-3-8b")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("model_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    base = ["--model", args.model, "--methods", "accept", "--out", args.out, "--no-progress"]
    rc1 = bench_main(base + ["-m", "1", "16", "2048"])
    rc2 = bench_main(base + ["-m", "256", "--merge"])
    chosen = models.resolve([args.model])
    (path,) = glob.glob(os.path.join(args.out, "*", models.suite_for(chosen, False) + ".json"))
    with open(path) as f:
        data = json.load(f)
    shapes = models.model_layers(chosen)
    problems = []
    if rc1 or rc2:
        problems.append(f"bench exit codes {rc1}, {rc2}")
    bad = [r for r in data["results"] if r["status"] in ("wrong", "error")]
    problems += [f"{r['K']}x{r['N']} M={r['M']} {r['method']}: {r['status']} {r.get('note')}" for r in bad]
    want = {(k, n, m, meth) for k, n in shapes for m in (1, 16, 256, 2048) for meth in accept.METHODS}
    have = {(r["K"], r["N"], r["M"], r["method"]) for r in data["results"]}
    if want - have:
        problems.append(f"{len(want - have)} cases missing after the merge, e.g. {sorted(want - have)[:3]}")
    if len(data["meta"].get("runs", [])) != 2:
        problems.append("meta.runs does not list the two merged runs")
    with open(path[:-5] + ".md") as f:
        md = f.read()
    if "## Acceptance view" not in md or "| K x N | layer |" not in md:
        problems.append("the .md lacks the layer column or the acceptance view")
    print(accept.to_markdown(data))
    for line in problems:
        print("PROBLEM:", line)
    print(f"model_bench: {'FAILED' if problems else 'ok'} ({path})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
