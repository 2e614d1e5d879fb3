"""Several GPU steps in one call of a lent machine, each under its own time cap, inside one total budget.

    PYTHONPATH=src python -m tools.checks.device_batch --out $OUT --budget 560 \
        "tests:240:python -m tools.checks.par_pytest 16 -m gpu tests/nn/test_compact.py" \
        "overhead:150:python -m mixgemm bench --call-overhead --out {res}"

A step is NAME:CAP_SECONDS:COMMAND (a bash command line, run from the repository root with PYTHONPATH=src; ``{res}``
is replaced by the folder for result files, ``{logs}`` by the log folder). A step starts only when its cap still fits
the budget left (else it is reported as not run), and is stopped at its cap. Each step's output goes to NAME.log in
the logs archive; the last lines of each are printed as it ends, and a summary last. Because a machine returns at
most eight files, the logs and the results come back as two archives (OUT/logs.tgz, OUT/results.tgz) beside
OUT/summary.txt.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time


def parse_step(text: str) -> tuple[str, float, str]:
    name, cap, command = text.split(":", 2)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"step name {name!r}: letters, digits, '-' and '_' only")
    return name, float(cap), command


def tail(path: str, lines: int) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--budget", type=float, default=560, help="seconds for all steps together")
    ap.add_argument("--tail", type=int, default=25, help="lines of each step's log to print")
    ap.add_argument("steps", nargs="+")
    args = ap.parse_args()
    steps = [parse_step(s) for s in args.steps]
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="device_batch-")  # outside OUT: only the archives come back
    logs, res = os.path.join(work, "logs"), os.path.join(work, "results")
    os.makedirs(logs, exist_ok=True)
    os.makedirs(res, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.path.abspath("src") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MIXGEMM_CUBIN_CACHE", "/tmp/mixgemm-cubin")
    t_start = time.monotonic()
    summary = []
    for name, cap, command in steps:
        left = args.budget - (time.monotonic() - t_start)
        if cap > left:
            summary.append(f"{name}: not run ({cap:.0f} s cap, {left:.0f} s left)")
            print(summary[-1], flush=True)
            continue
        log = os.path.join(logs, f"{name}.log")
        cmd = command.replace("{res}", res).replace("{logs}", logs)
        t0 = time.monotonic()
        with open(log, "w") as f:
            f.write(f"$ {cmd}\n")
            f.flush()
            proc = subprocess.Popen(["bash", "-c", cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=cap)
            except subprocess.TimeoutExpired:  # the whole process group: pytest workers, compile pools
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout"
        summary.append(f"{name}: rc={rc} in {time.monotonic() - t0:.0f} s")
        print(f"== {summary[-1]}\n{tail(log, args.tail)}", flush=True)
    for folder, archive in ((logs, "logs.tgz"), (res, "results.tgz")):
        with tarfile.open(os.path.join(out, archive), "w:gz") as t:
            t.add(folder, arcname=os.path.basename(folder))
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print("== summary\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
