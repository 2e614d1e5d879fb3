"""Summarize Nsight Compute SASS source-page CSVs (``ncu --page source --print-source sass --csv``, plain or .gz):
executed warp instructions, stall-reason shares, opcodes by share of stall samples / of executed instructions.

    python -m tools.profile.sass_stalls OUTDIR/sass_wgmma_m32.csv [...]
"""

from __future__ import annotations

import collections
import csv
import gzip
import sys


def opcode(sass: str) -> str:
    """'@!P2 LOP3.LUT R1, ...' -> 'LOP3'."""
    words = sass.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summarize(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header = rows[1]  # rows[0] names the kernel
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [c for c in header if c.startswith("stall_") and "(Not Issued)" not in c]
    stalls, samples_by_op, executed_by_op = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows[2:]:
        op = opcode(r[col["Source"]]) if len(r) == len(header) else ""
        if not op:
            continue
        executed_by_op[op] += int(r[col["Instructions Executed"]] or 0)
        samples_by_op[op] += int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        for c in stall_cols:
            stalls[c] += int(r[col[c]] or 0)
    n_exec, n_samples, n_stalls = (max(1, sum(c.values())) for c in (executed_by_op, samples_by_op, stalls))
    reasons = " ".join(f"{c[6:]} {100 * v / n_stalls:.0f}%" for c, v in stalls.most_common(10) if v)
    ops = " ".join(f"{o} {100 * v / n_samples:.0f}/{100 * executed_by_op[o] / n_exec:.0f}"
                   for o, v in samples_by_op.most_common(18))
    return (f"== {path}: executed warp instructions {sum(executed_by_op.values())}\n"
            f"  stall reasons: {reasons}\n"
            f"  by opcode (share of stall samples / of executed instructions): {ops}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(summarize(p))
