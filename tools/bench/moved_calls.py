"""Whole calls before / after a dispatch change: which (layer, M, format) calls the change moves to another kernel or
config, `mixgemm bench` on exactly those, and the moved cases' after / before.

    python -m tools.bench.moved_calls --diff OLD_SRC --gpu-name "NVIDIA H200" --ms 512,1024 --out moved.json  # no GPU
        [--shapes KxN,...] [--formats w4s,w4z,w8,w8a8,w4a8t]
    PYTHONPATH=OLD_SRC:. python -m tools.bench.moved_calls --bench moved.json --out $OUT/old [--rounds 2]      # GPU
    PYTHONPATH=src:. python -m tools.bench.moved_calls --bench moved.json --out $OUT/new [--rounds 2]         # GPU
    python -m tools.bench.moved_calls --compare moved.json --before DIR_old --after DIR_new                   # no GPU

--diff asks the dispatcher (mixgemm.explain with a DeviceInfo of --gpu-name: no GPU needed) for every layer of
--shapes (default: the model list), format and M, once with OLD_SRC's package (a `git archive REV src | tar -x -C
DIR` copy: DIR/src) and once with this tree's, each in a child process, and writes the calls whose kernel or config
differs, grouped by M and by weight-only / int8-activation methods (the shapes to bench and the `mixgemm bench`
methods of the formats). --bench runs `mixgemm bench` on each group with the package on sys.path (run it once per
tree, in one device call, so both sides share the machine). --compare pairs the two sides' cases by (K, N, M,
method) and prints, for the moved cases only (a group's shape list is a union over formats), the geometric mean of
after / before per group, the worst and best cases, and fp16 cuBLAS's own after / before as the drift control.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

from tools.bench.dispatch_ab import add_tree_options, dump_in_trees, shape_list

# format -> (bits, group size, weight mode, int8 activations per token, integer group scales, bench method)
FORMATS = {
    "w4s": (4, 128, "sym", False, False, "mixgemm W4A16 g128"),
    "w4z": (4, 128, "zero_point", False, False, "mixgemm W4A16 g128 zero-point"),
    "w8": (8, -1, "sym", False, False, "mixgemm W8A16 per-channel"),
    "w8a8": (8, -1, "sym", True, False, "mixgemm W8A8 per-channel"),
    "w4a8t": (4, 128, "sym", True, True, "mixgemm W4A8 g128 int-scales act per-token"),
}
CONTROL = "fp16 cuBLAS"


def _weight(n: int, k: int, fmt: str):
    """A weight of this shape and format for the dispatcher, which reads its shape, format and scales, not its codes
    (uninitialised codes: quantizing a 28672 x 8192 weight on the CPU would take seconds per format). Integer group
    scales are exact multiples of 2^-10, which formats.int_scales recognises."""
    import torch

    from mixgemm.formats.weight import QuantConfig, QuantizedWeight

    bits, group, mode, _, int_scales, _ = FORMATS[fmt]
    groups = 1 if group == -1 else -(-k // group)
    gen = torch.Generator().manual_seed(n * 131 + k)
    if int_scales:
        scales = (torch.randint(1, 17, (n, groups), generator=gen) * 2.0 ** -10).half()
    else:
        scales = torch.rand(n, groups, generator=gen).half() + 0.01
    zeros = torch.randint(0, 16, (n, groups), dtype=torch.uint8, generator=gen) if mode == "zero_point" else None
    return QuantizedWeight(torch.empty(n, k * bits // 8, dtype=torch.uint8), scales, zeros, None,
                           QuantConfig(bits=bits, group_size=group, mode=mode), (n, k))


def dispatch(shapes: list[tuple[int, int]], fmts: list[str], ms: list[int], gpu_name: str, sms: int) -> dict:
    """{"KxN M fmt": "kernel config"} of the package on sys.path, for a GPU of that name (fp16 activations)."""
    import torch

    import mixgemm
    from mixgemm.kernels.registry import DeviceInfo

    dev = DeviceInfo("cuda", 0, (9, 0), sms, gpu_name, 227 * 1024)
    out = {}
    for k, n in shapes:
        for fmt in fmts:
            a8 = FORMATS[fmt][3]
            qw = _weight(n, k, fmt)
            for m in ms:
                x = torch.empty(m, k, dtype=torch.float16)
                kw = {"act_mode": "sym", "act_block": "token"} if a8 else {}
                c = mixgemm.explain(x, qw, device=dev, **kw)
                out[f"{k}x{n} {m} {fmt}"] = f"{c.entry.name} {json.dumps(c.config, sort_keys=True)}"
    return out


def _dispatch_of(srcs: list[str | None], shapes, fmts, ms, gpu_name: str, sms: int) -> list[dict]:
    """dispatch() of each package tree (an src folder; None: this tree's), in child processes side by side."""
    return dump_in_trees(srcs, "tools.bench.moved_calls",
                         {"shapes": [list(s) for s in shapes], "fmts": fmts, "ms": ms, "gpu": gpu_name, "sms": sms})


def moved_groups(old: dict, new: dict) -> dict:
    """{"M wo" / "M a8": {"shapes": [...], "methods": [...], "cases": ["KxN M fmt", ...]}} of the calls whose
    kernel or config differs between the two dispatch() dumps."""
    groups: dict = {}
    for key in sorted(old, key=lambda s: (int(s.split()[1]), s)):
        if key not in new or old[key] == new[key]:
            continue
        shape, m, fmt = key.split()
        g = groups.setdefault(f"{m} {'a8' if FORMATS[fmt][3] else 'wo'}", {"shapes": [], "methods": [], "cases": []})
        if shape not in g["shapes"]:
            g["shapes"].append(shape)
        if FORMATS[fmt][5] not in g["methods"]:
            g["methods"].append(FORMATS[fmt][5])
        g["cases"].append(key)
    return groups


def bench(groups: dict, out: str, rounds: int) -> None:
    """mixgemm bench on each group (fp16 cuBLAS beside the group's methods), results under out/<gpu>/moved-*.json."""
    from mixgemm.bench.cli import main as bench_main

    for name, g in groups.items():
        m, kind = name.split()
        bench_main(["--shapes", *g["shapes"], "-m", m, "--methods", ",".join([CONTROL, *g["methods"]]),
                    "--rounds", str(rounds), "--suite", f"moved-{m}-{kind}", "--out", out, "--no-progress"])


def _times(folder: str) -> dict:
    out = {}
    for path in glob.glob(os.path.join(folder, "**", "*.json"), recursive=True):
        with open(path) as f:
            data = json.load(f)
        for r in data.get("results", []) if isinstance(data, dict) else []:
            if r.get("status") == "ok" and r.get("time_us"):
                out[(r["K"], r["N"], r["M"], r["method"])] = r["time_us"]
    return out


def compare(groups: dict, before: dict, after: dict) -> list[str]:
    """Per group: the moved cases' geometric mean of after / before (and the control's), worst and best."""
    method_of = {fmt: spec[5] for fmt, spec in FORMATS.items()}
    lines, every = [], []
    for name, g in groups.items():
        ratios, control = [], []
        for case in g["cases"]:
            shape, m, fmt = case.split()
            k, n = (int(v) for v in shape.split("x"))
            key = (k, n, int(m), method_of[fmt])
            if key in before and key in after:
                ratios.append((after[key] / before[key], case, before[key], after[key]))
            ctl = (k, n, int(m), CONTROL)
            if ctl in before and ctl in after:
                control.append(after[ctl] / before[ctl])
        if not ratios:
            lines.append(f"{name}: no moved case timed on both sides")
            continue
        every += ratios
        ratios.sort()
        gm = math.exp(sum(math.log(r[0]) for r in ratios) / len(ratios))
        ctl = math.exp(sum(math.log(r) for r in control) / len(control)) if control else float("nan")
        lines.append(f"{name}: {len(ratios)} moved cases, after / before {gm:.3f} (control {ctl:.3f}); "
                     f"best {ratios[0][1]} {ratios[0][2]:.1f} -> {ratios[0][3]:.1f} us, "
                     f"worst {ratios[-1][1]} {ratios[-1][2]:.1f} -> {ratios[-1][3]:.1f} us ({ratios[-1][0]:.3f}x)")
    if every:
        gm = math.exp(sum(math.log(r[0]) for r in every) / len(every))
        lines.append(f"all: {len(every)} moved cases, after / before {gm:.3f}, "
                     f"{sum(r[0] > 1.0 for r in every)} slower")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", metavar="MOVED_JSON")
    ap.add_argument("--compare", metavar="MOVED_JSON")
    ap.add_argument("--before", help="--compare: the old side's results folder")
    ap.add_argument("--after", help="--compare: the new side's results folder")
    add_tree_options(ap)
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {', '.join(FORMATS)}")
    ap.add_argument("--ms", default="512,1024,2048,4096", help="M values, comma list")
    args = ap.parse_args()
    if args.dump:
        a = json.loads(args.dump)
        print(json.dumps(dispatch([tuple(s) for s in a["shapes"]], a["fmts"], a["ms"], a["gpu"], a["sms"])))
    elif args.diff:
        fmts = args.formats.split(",")
        unknown = [f for f in fmts if f not in FORMATS]
        if unknown:
            ap.error(f"--formats: unknown {unknown}; expected some of {sorted(FORMATS)}")
        shapes = shape_list(args.shapes)
        ms = [int(m) for m in args.ms.split(",")]
        old, new = _dispatch_of([args.diff, None], shapes, fmts, ms, args.gpu_name, args.sms)
        groups = moved_groups(old, new)
        path = args.out if args.out.endswith(".json") else os.path.join(args.out, "moved.json")
        with open(path, "w") as f:
            json.dump(groups, f, indent=1)
        for name, g in groups.items():
            print(f"{name}: {len(g['cases'])} moved calls on {len(g['shapes'])} shapes")
        print(f"{sum(len(g['cases']) for g in groups.values())} of {len(old)} calls moved; wrote {path}")
    elif args.bench:
        with open(args.bench) as f:
            bench(json.load(f), args.out, args.rounds)
    elif args.compare:
        if not (args.before and args.after):
            ap.error("--compare needs --before and --after")
        with open(args.compare) as f:
            groups = json.load(f)
        print("\n".join(compare(groups, _times(args.before), _times(args.after))))
    else:
        ap.error("give --diff, --bench or --compare")


if __name__ == "__main__":
    main()
