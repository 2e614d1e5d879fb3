"""Before / after of a dispatch change as the GPU sees it: the problems whose GEMV config (the CUDA-core GEMV's tile,
the tensor-core GEMV's or the CUDA-core GEMV on wgmma_v1's) differs between two package trees, each timed with both
configs forced in interleaved rounds (benchmark protocol graph timing).

    python -m tools.bench.dispatch_ab --diff OLD_SRC --gpu-name "NVIDIA H200" --out cases.json   # no GPU
        [--ms 1,9,16] [--dtypes float16,bfloat16] [--scale-dtypes float16,bfloat16] [--formats w4s,w4z,w8]
        [--resident wgmma_v1]
    PYTHONPATH=src python -m tools.bench.dispatch_ab --time cases.json [--rounds 3] [--out DIR]    # GPU
    python -m tools.bench.dispatch_ab --summary DIR/cases.json                                    # no GPU

--diff asks the dispatcher (kernels.registry.choose, a DeviceInfo of --gpu-name and --sms) for every layer of
--shapes (default: the model list) in every --formats, M of --ms, activation dtype of --dtypes and scale dtype of
--scale-dtypes, on the plain codes or (--resident wgmma_v1) on compacted weights, once with this tree's package and
once with OLD_SRC's (a `git archive REV src | tar -x -C DIR` copy: DIR/src), and writes the cases whose GEMV config
changed ({"old": cfg, "new": cfg} with the kernel, M, dtypes and layout); cases where the kernel itself changed are
listed, not timed. Rules that read the compiler's register counts (kernels.cuda_gemv_mma.host.mma_cap_registers,
kernels.cuda_gemv_wg_simt.host.wg_simt_registers) answer for the NVRTC of the machine --diff runs on: run it where the
GPU's NVRTC is. --time times each case's configs forced on its kernel, every optional key explicit (a forced
tensor-core or wgmma_v1 CUDA-core config is laid over the dispatcher's own, so a key one config leaves out would take
the new rule's value), over weight copies past 3x L2 (compacted where the case's layout
says), the configs in turn each round, and keeps each config's fastest round (the rounds are there to catch a slow
first timing, not to average noise away). --summary prints the geometric mean of new / old by format, M, dtypes and
layout, on and off the model list, the worst cases and the protocol shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from tools.bench.gemv_tables import FORMATS, geomean

KERNELS = ("cuda_gemv", "cuda_gemv_mma", "cuda_gemv_wg_simt")  # the GEMVs whose configs a case compares
# the optional keys of a tensor-core config (kernels.cuda_gemv_mma.host.mma_defines_for) and of a CUDA-core GEMV on
# wgmma_v1 one (kernels.cuda_gemv_wg_simt.host.simt_defines_for) at their "off" values, so that a forced config is the
# whole config whichever keys the dispatcher's own sets
NEUTRAL = {"cuda_gemv_mma": {"EARLY": 0, "RT": 1, "MINB": 0, "PF": 0, "PACK": 0, "PERM": 0, "G32": 0},
           "cuda_gemv_wg_simt": {"MINB": 0, "PACK": 0}}


def problem_key(k: int, n: int, fmt: str, m: int = 1, dtype: str = "float16", scale_dtype: str = "float16",
                resident: str = "") -> str:
    """A dispatch() key: "KxN fmt", then " M=m" / " x=dtype" / " s=scale_dtype" / " r=resident" where not 1 / float16
    / the plain codes."""
    key = f"{k}x{n} {fmt}"
    if m != 1:
        key += f" M={m}"
    if dtype != "float16":
        key += f" x={dtype}"
    if scale_dtype != "float16":
        key += f" s={scale_dtype}"
    if resident:
        key += f" r={resident}"
    return key


def parse_key(key: str) -> dict:
    """problem_key's fields back: K, N, fmt, M, dtype, scale_dtype, resident ("" for the plain codes)."""
    shape, fmt, *rest = key.split()
    k, n = (int(v) for v in shape.split("x"))
    extra = dict(part.split("=") for part in rest)
    return {"K": k, "N": n, "fmt": fmt, "M": int(extra.get("M", 1)), "dtype": extra.get("x", "float16"),
            "scale_dtype": extra.get("s", "float16"), "resident": extra.get("r", "")}


def dispatch(shapes: list[tuple[int, int]], fmts: list[str], gpu_name: str, sms: int, ms=(1,), dtypes=("float16",),
             scale_dtypes=("float16",), resident: str = "") -> dict:
    """{problem_key: [kernel, config]} of the package on sys.path; resident: the one layout a compacted weight keeps
    (QuantLinear.compact_), "" for the plain codes."""
    from dataclasses import replace

    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels.registry import DeviceInfo, choose

    try:
        from mixgemm.kernels.linear_common import linear_problem
    except ImportError:  # a tree from before the kernel folders (the A side of an A / B comparison)
        from mixgemm.kernels.linear_common import linear_problem

    dev = DeviceInfo("cuda", 0, (9, 0), sms, gpu_name, 227 * 1024)
    out = {}
    for fmt in fmts:
        bits, group, mode = FORMATS[fmt]
        for sd in scale_dtypes:
            qw = quantize_weight(torch.randn(128, 256), bits=bits, group_size=group, mode=mode,
                                 scale_dtype=getattr(torch, sd))
            for m in ms:
                for dt in dtypes:
                    base = linear_problem(m, qw, getattr(torch, dt), dev)
                    for k, n in shapes:
                        if group > 0 and k % group:
                            continue
                        p = replace(base, n=n, k=k, group_size=k if group == -1 else group,
                                    num_groups=1 if group == -1 else -(-k // group), resident=resident or None)
                        c = choose(p)
                        out[problem_key(k, n, fmt, m, dt, sd, resident)] = [c.kernel, dict(c.config)]
    return out


def dump_in_trees(srcs: list[str | None], module: str, payload: dict) -> list[dict]:
    """``python -m module --dump PAYLOAD_JSON`` in one child process per package tree (an older tree's src folder;
    None: this tree's), run side by side, each one's last line of output read as JSON: how a tool asks two package
    trees the same question in one run (the dumps build kernel layouts on the CPU: minutes each on the model list)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    children = []
    for src in srcs:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src) if src else os.path.join(root, "src"), root])
        children.append(subprocess.Popen([sys.executable, "-m", module, "--dump", json.dumps(payload)], env=env,
                                         cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for src, child in zip(srcs, children, strict=True):
        stdout, stderr = child.communicate()
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, f"{module} --dump in {src or 'this tree'}",
                                                stdout, stderr)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def add_tree_options(ap: argparse.ArgumentParser) -> None:
    """The options of a two-tree dispatch tool (this one, moved_calls): the older tree (--diff), the child's --dump,
    the layers, the GPU described, the timing rounds and the output folder."""
    ap.add_argument("--dump", help=argparse.SUPPRESS)  # (the child process of --diff)
    ap.add_argument("--diff", metavar="OLD_SRC", help="the older tree's src folder")
    ap.add_argument("--shapes", default="", help="KxN,... (default: every layer of the model list)")
    ap.add_argument("--gpu-name", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))


def shape_list(text: str) -> list[tuple[int, int]]:
    """--shapes as (K, N) pairs; empty: every layer of the model list."""
    from mixgemm.bench.models import catalog, model_layers

    if text:
        return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
    return sorted(model_layers(list(catalog().values())))


def _dispatch_of(srcs: list[str | None], shapes, fmts, gpu_name: str, sms: int, ms=(1,), dtypes=("float16",),
                 scale_dtypes=("float16",), resident: str = "") -> list[dict]:
    """dispatch() of each package tree (an src folder; None: this tree's), in child processes side by side."""
    return dump_in_trees(srcs, "tools.bench.dispatch_ab", {
        "shapes": shapes, "fmts": fmts, "gpu": gpu_name, "sms": sms, "ms": list(ms), "dtypes": list(dtypes),
        "scale_dtypes": list(scale_dtypes), "resident": resident})


def diff(old: dict, new: dict) -> tuple[list[dict], list[str]]:
    """(cases whose GEMV config changed, keys whose kernel changed); per-call keys (XS, LITE) left out."""
    strip = lambda c: {k: v for k, v in c.items() if k not in ("XS", "LITE")}  # noqa: E731
    cases, kernels = [], []
    for key in sorted(old):
        (ko, co), (kn, cn) = old[key], new[key]
        if ko != kn:
            kernels.append(f"{key}: {ko} -> {kn}")
        elif ko in KERNELS and strip(co) != strip(cn):
            cases.append({**parse_key(key), "kernel": ko, "cfgs": {"old": strip(co), "new": strip(cn)}})
    return cases, kernels


def forced(kernel: str, cfg: dict) -> dict:
    """The config to force: a tensor-core or wgmma_v1 CUDA-core one with every optional key explicit (NEUTRAL under
    it); a CUDA-core one on the plain codes as it is (kernels.cuda_gemv.host.simt_override completes it from defaults,
    never from the dispatcher's own)."""
    return {**NEUTRAL.get(kernel, {}), **cfg}


def time_cases(cases: list[dict], rounds: int) -> list[dict]:
    """Each case's configs forced on its kernel (forced()), in turn each round; the fastest round per config (us)."""
    import torch

    from mixgemm.bench import protocol
    from mixgemm.formats.weight import compact_placeholder
    from mixgemm.ops.custom_ops import compact_weight
    from tools.bench.gemv_dispatch import forced_time_us, layer_copies

    l2 = protocol.l2_bytes()
    out, held, weights = [], None, None
    for c in sorted(cases, key=lambda c: (c["K"], c["N"], c["fmt"], c.get("scale_dtype", "float16"),
                                          c.get("resident", ""))):
        c = {"M": 1, "dtype": "float16", "scale_dtype": "float16", "kernel": "cuda_gemv", "resident": "", **c}
        k, n = c["K"], c["N"]
        layer = (k, n, c["fmt"], c["scale_dtype"], c["resident"])
        if layer != held:  # (cases of one layer follow each other in --diff's order: one set of copies for them)
            weights = None
            torch.cuda.empty_cache()
            weights, held = layer_copies(k, n, c["fmt"], l2, getattr(torch, c["scale_dtype"])), layer
            if c["resident"]:  # each copy keeps only that layout, as QuantLinear.compact_ leaves it
                weights = [compact_weight(q, compact_placeholder(q.qweight), c["resident"]) for q in weights]
        x = torch.randn(c["M"], k, device="cuda", dtype=getattr(torch, c["dtype"]))
        times: dict = {}
        for _ in range(rounds):
            for name, cfg in c["cfgs"].items():
                times.setdefault(name, []).append(forced_time_us(c["kernel"], forced(c["kernel"], cfg), x, weights))
        out.append({**c, "us": {name: min(v) for name, v in times.items()}})
        print(f"{label(c)} {k}x{n} " + " ".join(f"{name} {v:.2f}" for name, v in out[-1]["us"].items()), flush=True)
    return out


def label(c: dict) -> str:
    """A case's format, with its M, dtypes and layout where not 1 / float16 / plain (summary's groups): its
    problem_key less the shape."""
    key = problem_key(c["K"], c["N"], c["fmt"], c.get("M", 1), c.get("dtype", "float16"),
                      c.get("scale_dtype", "float16"), c.get("resident", ""))
    return key.split(" ", 1)[1]


def summary(timed: list[dict], listed: set, protocol: set) -> list[str]:
    """Lines: new / old by geometric mean overall, per format on and off ``listed`` shapes, the worst, the protocol."""
    ratio = lambda c: c["us"]["new"] / c["us"]["old"]  # noqa: E731
    lines = [f"all: {len(timed)} cases, {geomean([ratio(c) for c in timed]):.3f}x"]
    for group in sorted({label(c) for c in timed}):
        for on in (True, False):
            v = [ratio(c) for c in timed if label(c) == group and ((c["K"], c["N"]) in listed) == on]
            if v:
                lines.append(f"{group} {'model list' if on else 'other layers'}: {len(v)} cases, {geomean(v):.3f}x "
                             f"({min(v):.3f}-{max(v):.3f})")
    worst = sorted(timed, key=ratio)[-5:][::-1]
    lines.append("worst: " + ", ".join(f"{label(c)} {c['K']}x{c['N']} {ratio(c):.3f}x" for c in worst))
    prot = [c for c in timed if (c["K"], c["N"]) in protocol]
    if prot:
        lines.append("protocol: " + ", ".join(f"{label(c)} {c['K']}x{c['N']} {c['us']['old']:.2f} -> "
                                              f"{c['us']['new']:.2f} us" for c in prot))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time", metavar="CASES_JSON")
    ap.add_argument("--summary", metavar="TIMED_JSON")
    add_tree_options(ap)
    ap.add_argument("--formats", default="w4s,w4z,w8")
    ap.add_argument("--ms", default="1", help="M values, comma list")
    ap.add_argument("--dtypes", default="float16", help="activation dtypes, comma list (float16, bfloat16)")
    ap.add_argument("--scale-dtypes", default="float16", help="weight scale dtypes, comma list")
    ap.add_argument("--resident", default="", help="the one layout compacted weights keep (wgmma_v1, wgmma_a8_v1); "
                    "default: the plain codes")
    args = ap.parse_args()
    if args.dump:
        a = json.loads(args.dump)
        print(json.dumps(dispatch([tuple(s) for s in a["shapes"]], a["fmts"], a["gpu"], a["sms"], a["ms"], a["dtypes"],
                                  a["scale_dtypes"], a["resident"])))
        return
    from mixgemm.bench.cli import PRESETS
    from mixgemm.bench.models import catalog, model_layers

    listed = set(model_layers(list(catalog().values())))
    if args.diff:
        shapes = shape_list(args.shapes)
        fmts = args.formats.split(",")
        axes = ([int(m) for m in args.ms.split(",")], args.dtypes.split(","), args.scale_dtypes.split(","),
                args.resident)
        old, new = _dispatch_of([args.diff, None], shapes, fmts, args.gpu_name, args.sms, *axes)
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
