"""Run the collected tests of a pytest selection in N parallel processes (Triton compiles in-process and
single-threaded: N processes compile N kernels at a time).

    python -m tools.checks.par_pytest N [--gpus G] [--logs DIR] ARGS...

With --logs, each process writes its verbose log (one PASSED / FAILED line per test as it finishes) to
DIR/chunk_<i>.log, so a run cut short by a time limit still says which tests passed and which failed. With --gpus G
(a machine of G GPUs), process i sees GPU i % G only (CUDA_VISIBLE_DEVICES): no test needs two GPUs, and the GPU suite
(~3,300 tests, more than one 600 s call on one GPU with 16 processes) spreads over them."""

from __future__ import annotations

import os
import subprocess
import sys


def main():
    n = int(sys.argv[1])
    args = sys.argv[2:]
    logs, gpus = None, 0
    if args[:1] == ["--gpus"]:
        gpus, args = int(args[1]), args[2:]
    if args[:1] == ["--logs"]:
        logs, args = args[1], args[2:]
        os.makedirs(logs, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], capture_output=True,
                         text=True).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    chunks = [c for c in (ids[i::n] for i in range(n)) if c]
    # the node ids are already selected (-m, -k applied at collection): run them as they are
    procs, files = [], []
    for i, c in enumerate(chunks):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % gpus)) if gpus > 0 else None
        if logs is None:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *c]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        else:
            cmd = [sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:cacheprovider", *c]
            f = open(os.path.join(logs, f"chunk_{i}.log"), "w")  # noqa: SIM115 - closed below
            files.append(f)
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env))
    rc = 0
    for p in procs:
        o, _ = p.communicate()
        if o is not None:
            tail = o.strip().splitlines()
            print("\n".join(line for line in tail if "FAILED" in line or "Error" in line or "passed" in line
                            or "failed" in line or "skipped" in line)[-3000:])
        rc |= p.returncode
    for f in files:
        f.close()
    sys.exit(rc)


if __name__ == "__main__":
    main()
