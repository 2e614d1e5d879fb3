"""Run the collected tests of a pytest selection in N parallel processes (Triton compiles in-process and
single-threaded: N processes compile N kernels at a time). Usage: python -m tools.checks.par_pytest N ARGS..."""

from __future__ import annotations

import subprocess
import sys


def main():
    n = int(sys.argv[1])
    args = sys.argv[2:]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], capture_output=True,
                         text=True).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    chunks = [ids[i::n] for i in range(n)]
    # the node ids are already selected (-m, -k applied at collection): run them as they are
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *c],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in chunks if c]
    rc = 0
    for p in procs:
        o, _ = p.communicate()
        tail = o.strip().splitlines()
        print("\n".join(line for line in tail if "FAILED" in line or "Error" in line or "passed" in line
                        or "failed" in line or "skipped" in line)[-3000:])
        rc |= p.returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
