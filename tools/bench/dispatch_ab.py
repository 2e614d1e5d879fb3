"""Before / after of a dispatch change as the GPU sees it: the layers whose M = 1 CUDA-core GEMV tile differs between
two package trees, each timed with both tiles forced in interleaved rounds (benchmark protocol graph timing).

    python -m tools.bench.dispatch_ab --diff OLD_SRC --gpu-name "NVIDIA H200" --out cases.json   # no GPU
    PYTHONPATH=src python -m tools.bench.dispatch_ab --time cases.json [--rounds 3] [--out DIR]    # GPU
    python -m tools.bench.dispatch_ab --summary DIR/cases.json                                    # no GPU

--diff asks the dispatcher (kernels.registry.choose, fp16 activations, a DeviceInfo of --gpu-name and --sms) for every
layer of --shapes (default: the model list) in every --formats, once with this tree's package and once with OLD_SRC's
(a `git archive REV src | tar -x -C DIR` copy: DIR/src), and writes the (layer, format) cases whose CUDA-core GEMV
config changed ({"old": cfg, "new": cfg}); cases where the kernel itself changed are listed, not timed. --time times
each case's configs forced on the CUDA-core GEMV over weight copies past 3x L2, the configs in turn each round, and
keeps each config's fastest round (the rounds are there to catch a slow first timing, not to average noise away).
--summary prints the geometric mean of new / old by format, on and off the model list, the worst cases and the
protocol shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

from tools.bench.gemv_tables import FORMATS

KERNEL = "cuda_gemv"


def dispatch(shapes: list[tuple[int, int]], fmts: list[str], gpu_name: str, sms: int) -> dict:
    """{"KxN fmt": [kernel, config]} of the package on sys.path, M = 1, fp16 activations."""
    from dataclasses import replace

    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import linear
    from mixgemm.kernels.registry import DeviceInfo, choose

    dev = DeviceInfo("cuda", 0, (9, 0), sms, gpu_name, 227 * 1024)
    out = {}
    for fmt in fmts:
        bits, group, mode = FORMATS[fmt]
        qw = quantize_weight(torch.randn(128, 256), bits=bits, group_size=group, mode=mode)
        base = linear.linear_problem(1, qw, torch.float16, dev)
        for k, n in shapes:
            if group > 0 and k % group:
                continue
            p = replace(base, n=n, k=k, group_size=k if group == -1 else group,
                        num_groups=1 if group == -1 else -(-k // group))
            c = choose(p)
            out[f"{k}x{n} {fmt}"] = [c.kernel, dict(c.config)]
    return out


def _dispatch_of(src: str | None, shapes, fmts, gpu_name: str, sms: int) -> dict:
    """dispatch() in a child process whose package comes from ``src`` (None: this tree's)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src) if src else os.path.join(root, "src"), root])
    arg = json.dumps({"shapes": shapes, "fmts": fmts, "gpu": gpu_name, "sms": sms})
    done = subprocess.run([sys.executable, "-m", "tools.bench.dispatch_ab", "--dump", arg], env=env, cwd=root,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def diff(old: dict, new: dict) -> tuple[list[dict], list[str]]:
    """(cases whose CUDA-core GEMV config changed, keys whose kernel changed); per-call keys (XS, LITE) left out."""
    strip = lambda c: {k: v for k, v in c.items() if k not in ("XS", "LITE")}  # noqa: E731
    cases, kernels = [], []
    for key in sorted(old):
        (ko, co), (kn, cn) = old[key], new[key]
        if ko != kn:
            kernels.append(f"{key}: {ko} -> {kn}")
        elif ko == KERNEL and strip(co) != strip(cn):
            shape, fmt = key.split()
            k, n = (int(v) for v in shape.split("x"))
            cases.append({"K": k, "N": n, "fmt": fmt, "cfgs": {"old": strip(co), "new": strip(cn)}})
    return cases, kernels


def time_cases(cases: list[dict], rounds: int) -> list[dict]:
    """Each case's configs forced on the CUDA-core GEMV, in turn each round; the fastest round per config (us)."""
    import torch

    from mixgemm.bench import protocol
    from tools.bench.gemv_dispatch import forced_time_us, layer_copies

    l2 = protocol.l2_bytes()
    out = []
    for c in cases:
        k, n = c["K"], c["N"]
        weights = layer_copies(k, n, c["fmt"], l2)
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        times: dict = {}
        for _ in range(rounds):
            for name, cfg in c["cfgs"].items():
                times.setdefault(name, []).append(forced_time_us(KERNEL, cfg, x, weights))
        out.append({**c, "us": {name: min(v) for name, v in times.items()}})
        print(f"{c['fmt']} {k}x{n} " + " ".join(f"{name} {v:.2f}" for name, v in out[-1]["us"].items()), flush=True)
        del weights
        torch.cuda.empty_cache()
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary(timed: list[dict], listed: set, protocol: set) -> list[str]:
    """Lines: new / old by geometric mean overall, per format on and off ``listed`` shapes, the worst, the protocol."""
    ratio = lambda c: c["us"]["new"] / c["us"]["old"]  # noqa: E731
    lines = [f"all: {len(timed)} cases, {_geomean([ratio(c) for c in timed]):.3f}x"]
    for fmt in sorted({c["fmt"] for c in timed}):
        for on in (True, False):
            v = [ratio(c) for c in timed if c["fmt"] == fmt and ((c["K"], c["N"]) in listed) == on]
            if v:
                lines.append(f"{fmt} {'model list' if on else 'other layers'}: {len(v)} cases, {_geomean(v):.3f}x")
    worst = sorted(timed, key=ratio)[-5:][::-1]
    lines.append("worst: " + ", ".join(f"{c['fmt']} {c['K']}x{c['N']} {ratio(c):.3f}x" for c in worst))
    prot = [c for c in timed if (c["K"], c["N"]) in protocol]
    if prot:
        lines.append("protocol: " + ", ".join(f"{c['fmt']} {c['K']}x{c['N']} {c['us']['old']:.2f} -> "
                                              f"{c['us']['new']:.2f} us" for c in prot))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--diff", metavar="OLD_SRC", help="the older tree's src folder")
    ap.add_argument("--time", metavar="CASES_JSON")
    ap.add_argument("--summary", metavar="TIMED_JSON")
    ap.add_argument("--dump", help=argparse.SUPPRESS)  # (the child process of --diff)
    ap.add_argument("--shapes", default="", help="KxN,... (default: every layer of the model list)")
    ap.add_argument("--formats", default="w4s,w4z,w8")
    ap.add_argument("--gpu-name", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.dump:
        a = json.loads(args.dump)
        print(json.dumps(dispatch([tuple(s) for s in a["shapes"]], a["fmts"], a["gpu"], a["sms"])))
        return
    from mixgemm.bench.cli import PRESETS
    from mixgemm.bench.models import catalog, model_layers

    listed = set(model_layers(list(catalog().values())))
    if args.diff:
        shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes
                  else sorted(listed))
        fmts = args.formats.split(",")
        old = _dispatch_of(args.diff, shapes, fmts, args.gpu_name, args.sms)
        new = _dispatch_of(None, shapes, fmts, args.gpu_name, args.sms)
        cases, kernels = diff(old, new)
        with open(args.out if args.out.endswith(".json") else os.path.join(args.out, "cases.json"), "w") as f:
            json.dump(cases, f)
        print(f"{len(cases)} cases whose tile changed, of {len(old)}; kernel changed (not timed): {kernels or 'none'}")
    elif args.time:
        with open(args.time) as f:
            timed = time_cases(json.load(f), args.rounds)
        with open(os.path.join(args.out, os.path.basename(args.time)), "w") as f:
            json.dump(timed, f)
        print("\n".join(summary(timed, listed, set(PRESETS["protocol"]))))
    elif args.summary:
        with open(args.summary) as f:
            print("\n".join(summary(json.load(f), listed, set(PRESETS["protocol"]))))
    else:
        ap.error("give --diff, --time or --summary")


if __name__ == "__main__":
    main()
