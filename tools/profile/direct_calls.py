"""A / B of the compiled ops' direct calls (mixgemm.ops.compiled_calls) against the dispatcher calls inductor writes
otherwise, in one process: for each scheme and M, the same QuantLinear compiled twice (torch.compile without CUDA
graphs, a fresh dynamo cache each, inductor's caches off), once inside ``dispatcher_calls()``; the two compiled
functions take turns within each of 21 rounds (mixgemm.bench.call_overhead.paired_rounds), and the ratio is the
median of direct / dispatcher over the rounds. The host of a device machine drifts too much between processes for
two runs of `mixgemm bench --call-overhead` to show a few microseconds.

    PYTHONPATH=src python -m tools.profile.direct_calls [--out DIR] [--device cuda|cpu]

On the CPU the layers run the CPU fallback (its kernel time dilutes the difference); the GPU is the measurement."""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch._inductor.utils import run_and_get_code

import mixgemm
from mixgemm.bench.call_overhead import DEFAULT_MS, DEFAULT_SHAPE, SCHEMES, paired_ratio, paired_rounds, scheme_config
from mixgemm.ops.compiled_calls import dispatcher_calls


def ab_case(q, x: torch.Tensor, sync) -> dict:
    """Direct against dispatcher calls of QuantLinear q on x: best round of each, median ratio direct / dispatcher."""

    def direct_frame(t):  # two functions of their own (two code objects): dynamo compiles each separately
        return q(t)

    def dispatcher_frame(t):
        return q(t)

    torch._dynamo.reset()
    direct = torch.compile(direct_frame, dynamic=False)
    codes = run_and_get_code(direct, x)[1]
    with dispatcher_calls():
        via = torch.compile(dispatcher_frame, dynamic=False)
        codes_via = run_and_get_code(via, x)[1]
    if "mixgemm_direct_" not in "".join(codes) or "mixgemm_direct_" in "".join(codes_via):
        raise RuntimeError("the two compiled functions do not differ in the op calls: nothing to compare")
    torch.testing.assert_close(direct(x), via(x), rtol=0, atol=0)
    d, v = paired_rounds([lambda: direct(x), lambda: via(x)], calls=300, sync=sync)
    return dict(direct_us=min(d), dispatcher_us=min(v), ratio=paired_ratio(d, v))


def measure(device: str, shape=DEFAULT_SHAPE, ms=DEFAULT_MS, schemes=SCHEMES) -> list[dict]:
    torch._inductor.config.force_disable_caches = True
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.float16 if device == "cuda" else torch.float32
    k, n = shape
    rows = []
    with torch.no_grad():
        for name in schemes:
            model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(device, dtype)
            mixgemm.quantize_(model, scheme_config(name))
            for m in ms:
                r = dict(scheme=name, M=m, **ab_case(model[0], torch.randn(m, k, device=device, dtype=dtype), sync))
                rows.append(r)
                print(f"{name:10s} M={m:<4d} direct {r['direct_us']:6.1f} us, dispatcher {r['dispatcher_us']:6.1f} us, "
                      f"median ratio {r['ratio']:.3f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    a = ap.parse_args()
    rows = measure(a.device, ms=[int(v) for v in a.ms.split(",")], schemes=a.schemes.split(","))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "direct_calls.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
