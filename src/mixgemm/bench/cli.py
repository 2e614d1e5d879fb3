"""`python -m mixgemm bench`: the scoreboard (benchmark protocol: docs/benchmarking.md).

Every method (mixgemm's paths and the peers: fp16/bf16 cuBLAS, tinygemm, torch._int_mm, gemlite when
importable) runs on the same shapes in one process; each output is checked against its float64
reference before it is timed. Prints a table and writes OUT/<gpu>/<suite>.{json,md} (.png with --plot,
.csv with --csv), the layout of the committed benchmarks/results. Without a CUDA GPU it says so and times the CPU
fallback on a small shape.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from mixgemm.bench import accept, conv_models, conv_networks, draw, merge, models, output, protocol
from mixgemm.bench.conv import CONV_BATCHES, CONV_PRESET, conv_methods, conv_models_methods
from mixgemm.bench.methods import BASELINE_CPU, _dtype_name, all_methods, select
from mixgemm.bench.reference_numbers import compare_markdown, protocol_plan
from mixgemm.bench.runner import SweepConfig, run_sweep

PROTOCOL_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384]
# K x N of each linear layer (nn.Linear: K in_features, N out_features)
PRESETS: dict[str, list[tuple[int, int]]] = {
    "protocol": [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192)],
    # Llama-3-8B: q/o proj 4096x4096, k/v proj 4096x1024 (8 KV heads), gate/up 4096x14336, down 14336x4096
    "llama3-8b": [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096)],
    # Llama-3-70B: q/o 8192x8192, k/v 8192x1024, gate/up 8192x28672, down 28672x8192
    "llama3-70b": [(8192, 8192), (8192, 1024), (8192, 28672), (28672, 8192)],
}
# --quick: the protocol table's rows for two shapes (about a minute on an H100/H200)
QUICK_PLAN = [((4096, 4096), [1, 16, 256, 4096]), ((8192, 28672), [1, 4, 16, 64, 256])]
# the CPU fallback is eager PyTorch: one small layer keeps a CPU run to seconds
CPU_PLAN = [((1024, 2048), [1, 16])]
# --conv-models on a CPU: only layers up to this many multiply-adds at batch 1 (mixgemm's CPU conv is eager PyTorch)
CPU_CONV_MAX_MACS = 1 << 26
# --model on a CPU: only layers up to this many weights (the big ones take minutes per case in eager PyTorch)
CPU_MODEL_MAX_WEIGHTS = 1 << 22
# --model: decode (1, 16) and the GEMM range of the acceptance (256-16384, 2048 for the int8-activation line)
MODEL_M = [1, 16, 256, 1024, 2048, 4096, 16384]
DEFAULT_OUT = "mixgemm-results"
DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "float32": torch.float32}


def parse_shapes(items: list[str]) -> list[tuple[int, int]]:
    """Preset names and/or explicit KxN (e.g. 4096x14336), comma- or space-separated, duplicates dropped."""
    out: list[tuple[int, int]] = []
    for item in (p.strip() for s in items for p in s.split(",")):
        if not item:
            continue
        if item.lower() in PRESETS:
            shapes = PRESETS[item.lower()]
        else:
            try:
                k, n = (int(v) for v in item.lower().split("x"))
            except ValueError:
                raise ValueError(f"shape {item!r}: expected KxN (e.g. 4096x14336) or a preset "
                                 f"({', '.join(PRESETS)})") from None
            if k <= 0 or n <= 0:
                raise ValueError(f"shape {item!r}: K and N must be positive")
            shapes = [(k, n)]
        out += [s for s in shapes if s not in out]
    return out


def parse_int(text: str, what: str, minimum: int, maximum: int | None = None) -> int:
    """One integer option given as text, in [minimum, maximum]: a bad value is a one-line error naming the option."""
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an integer") from None
    if v < minimum or (maximum is not None and v > maximum):
        raise ValueError(f"{what}: {v} must be " + (f"in [{minimum}, {maximum}]" if maximum is not None
                                                    else f"at least {minimum}"))
    return v


def parse_ints(items: list[str], what: str) -> list[int]:
    vals: list[int] = []
    for p in (p.strip() for s in items for p in s.split(",")):
        if not p:
            continue
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"{what}: {p!r} is not an integer") from None
        if v <= 0:
            raise ValueError(f"{what}: {v} must be positive")
        if v not in vals:
            vals.append(v)
    return vals


class Progress:
    """tqdm when importable and enabled, else a one-line counter on stderr."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.n, self.enabled = total, 0, enabled
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True, leave=False)
            except ImportError:
                pass

    def __call__(self, label: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description_str(label[:48])
            self.bar.update(1)
        else:
            sys.stderr.write(f"\r[{self.n}/{self.total}] {label[:60]:<60}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixgemm bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="presets: " + "; ".join(f"{k}: " + ", ".join(f"{a}x{b}" for a, b in v)
                                                               for k, v in PRESETS.items()))
    p.add_argument("--shapes", nargs="+", default=None,
                   help="presets (protocol, llama3-8b, llama3-70b) and/or KxN; default: protocol")
    p.add_argument("--model", nargs="+", default=None,
                   help="a model's layer shapes: a Hugging Face config.json (or its folder), a model of the "
                        "committed list (e.g. llama-3-8b, qwen2.5-7b; see --list-models), 'all', or a transformers "
                        "model type (e.g. mistral: its config class's defaults); default M: "
                        + ",".join(map(str, MODEL_M)) + "; the report adds the acceptance view")
    p.add_argument("--list-models", action="store_true", help="list the committed models and their layer shapes")
    p.add_argument("--random", default=None, metavar="N",
                   help="N layer shapes drawn fresh from the distribution of real transformer layers (drawn models' "
                        "fused QKV, o, gate+up, down...; K and N multiples of 64 in 512..32768), timed and judged "
                        "as --model's; --seed S draws the same shapes again, without it the seed is new and printed")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no new shape after S seconds; the shapes left out are listed (rerun with --merge)")
    p.add_argument("--merge", action="store_true",
                   help="merge into OUT/<gpu>/<suite>.json: skip the shapes and M values whose cases it already holds, "
                        "replace the cases this run measures, keep the rest (split a long run: --m 1,16 then --m "
                        "256,...; a run cut by --time-budget resumes where it stopped)")
    p.add_argument("--fold", default=None, metavar="PART_JSON",
                   help="no timing: fold a results file measured apart (e.g. OUT/<gpu>/<suite>.json of a run on "
                        "another machine) into OUT/<gpu>/<suite>.json, its cases replacing the same cases, and "
                        "render the Markdown (with --out benchmarks/results: re-measured rows into the committed file)")
    p.add_argument("--read-ceiling-pct", type=float, default=None, metavar="PCT",
                   help="measured no-math read ceiling in %% of the copy bandwidth (e.g. 89 on the H200): the big "
                        "layers' decode bar becomes min(85%%, 92%% of it)")
    p.add_argument("-m", "--m", nargs="+", default=None, dest="ms",
                   help="M values (tokens), e.g. 1 16 256 or 1,16,256; default: the protocol's list")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="activation dtype of mixgemm's methods (default: fp16 on a GPU; bf16 on the CPU, whose "
                        "int4 / int8 kernels take bf16; a CPU run's baseline is torch's linear in the same dtype)")
    p.add_argument("--bits", nargs="+", default=["4", "8"], help="mixgemm weight bits to run (4 and/or 8)")
    p.add_argument("--group-size", type=int, default=128,
                   help="mixgemm W4 group size (32/64/128/256, -1 per-channel)")
    p.add_argument("--methods", default=None,
                   help="comma list of method names or substrings ('all'; 'accept': only those the acceptance "
                        "view of --model reads; default: every default method, with --model also those)")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="time every case R times, a shape's methods in turn each round, and report the median "
                        "(docs/benchmarking.md: interleave and repeat when methods are close); the checks run once")
    p.add_argument("--list-methods", action="store_true", help="list the methods and whether they run here")
    p.add_argument("--quick", action="store_true",
                   help="about a minute: 4096x4096 (M 1,16,256,4096) and 8192x28672 (M 1,4,16,64,256)")
    p.add_argument("--conv", action="store_true",
                   help="conv layers instead of matmuls: mixgemm.conv2d W4/W8 vs cuDNN fp16 (ResNet-50 stages and a "
                        "ConvNeXt 7x7 depthwise block; -m gives the batch sizes, default "
                        + " ".join(map(str, CONV_BATCHES)) + ")")
    p.add_argument("--conv-models", action="store_true",
                   help="every distinct Conv2d of torchvision's classification, segmentation and detection models and "
                        "diffusers' UNet / VAE (the committed conv_layers.json): mixgemm.conv2d W4 zero point g32 "
                        "(per-channel where Ci/groups is no multiple of 32) and W8 per-channel, as dispatched and with "
                        "the dequantize + cuDNN route forced, against cuDNN in --dtype; -m gives the batch sizes, "
                        "default " + " ".join(map(str, CONV_BATCHES)) + "; the report adds the acceptance view")
    p.add_argument("--conv-filter", nargs="+", default=None, metavar="TEXT",
                   help="--conv-models: only these layers: a model (resnet50) or family (EfficientNet) name, or "
                        "text in a layer's name or its models' module names (7x7, 'dw', unet); comma- or "
                        "space-separated, any of them")
    conv_networks.add_arguments(p)
    p.add_argument("--call-overhead", action="store_true",
                   help="host time of one QuantLinear call (W4A16, W8A16, W8A8, W4A8 per token) against nn.Linear, "
                        "eager and under torch.compile without CUDA graphs (--shapes: one KxN, default 2048x2048; "
                        "-m default 1 16 512); writes OUT/<gpu>/call-overhead.{json,md}; CUDA only")
    p.add_argument("--protocol-rows", action="store_true",
                   help="exactly the rows (K x N, M) of the protocol's published table, to compare with it")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"results folder: files go to OUT/<gpu>/<suite>.json and .md (default: ./{DEFAULT_OUT}; "
                        "--out benchmarks/results refreshes the committed results)")
    p.add_argument("--suite", default=None,
                   help="file name of this run inside OUT/<gpu>/ (default: quick, protocol, protocol-rows, conv, "
                        "custom when --shapes/-m choose, cpu on a CPU)")
    p.add_argument("--plot", action="store_true",
                   help="also write <suite>.png (speedup vs M per shape + roofline)")
    p.add_argument("--csv", action="store_true", help="also write <suite>.csv (one row per case)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: CUDA when available, else the CPU path")
    p.add_argument("--seed", default=None, metavar="S",
                   help=f"0..{draw.MAX_SEED}: the seed of --random's draw and of the weights and activations "
                        "(default: new for --random, else 0)")
    p.add_argument("--max-mem-gb", type=float, default=20.0, help="cap on the memory of one layer's C copies")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def suite_name(args: argparse.Namespace, device: str, shapes, ms, model_suite: str | None = None) -> str:
    """The default file name of a run: what it measured."""
    if model_suite:
        return model_suite
    if args.conv_models:
        tag = _dtype_name(DTYPES[args.dtype or "fp16"])
        return "conv-models" + ("" if device == "cpu" or tag == "fp16" else "-" + tag)
    if device == "cpu":
        return "cpu"
    if args.conv:
        return "conv"
    if shapes or ms:
        return "custom"
    if args.protocol_rows:
        return "protocol-rows"
    return "quick" if args.quick else "protocol"


def estimate_seconds(plan: list[tuple], n_methods: int, warmup_ms: float = 25, rep_ms: float = 100,
                     l2_bytes: int = 50 << 20, copy_bw: float = 3.0e12, matmul_rate: float = 6.0e14) -> float:
    """Rough duration of a GPU matmul run under the protocol (H100 defaults). A case is two do_bench windows (graph
    and eager), each the warm-up and repetition time plus about 6 extra replays of the C copies (one call, then 5
    to estimate); C * weight bytes > 3 x L2. One call is priced as fp16 cuBLAS: max(fp16 bytes / copy bandwidth,
    2MNK / fp16 rate). Plus ~0.15 s a case for the check, the copies and the capture."""
    total = 0.0
    for shape, ms in plan:
        if not isinstance(shape, tuple):
            continue
        k, n = shape
        w = 2 * k * n
        copies = max(protocol.MIN_COPIES, 3 * l2_bytes // w + 1)
        for m in ms:
            call = max((w + 2 * m * (k + n)) / copy_bw, 2 * m * k * n / matmul_rate)
            window = (warmup_ms + rep_ms) / 1e3 + 6 * copies * call
            total += n_methods * (2 * window + 0.15)
    return total


def _conv_models_plan(filters: list[str], batches: list[int] | None, device: str) -> tuple[list[tuple], dict]:
    """--conv-models' plan: the data file's layers (those matching a filter) at the batches (default CONV_BATCHES; on
    a CPU batch 1 and only layers up to CPU_CONV_MAX_MACS); and who uses each layer, by name."""
    layers = conv_models.conv_layers(filters or None)
    if not layers:
        raise ValueError(f"--conv-filter {','.join(filters)}: no layer of {conv_models.DATA_FILE} matches")
    if device == "cpu":
        small = [lay for lay in layers if conv_models.macs(lay.spec, 1) <= CPU_CONV_MAX_MACS]
        print(f"mixgemm bench: no CUDA GPU used: timing mixgemm's CPU conv (float32, eager wall clock) on the "
              f"{len(small)} of {len(layers)} layers with at most {CPU_CONV_MAX_MACS:,} multiply-adds at batch 1. "
              "No floors or acceptance view: they need a CUDA GPU.", file=sys.stderr)
        if not small:
            raise ValueError("no layer small enough for the CPU; --conv-filter others")
        layers = small
    plan = [(lay.spec, batches or ([1] if device == "cpu" else CONV_BATCHES)) for lay in layers]
    return plan, {lay.spec.name: lay.label for lay in layers}


def _call_overhead(args: argparse.Namespace, shapes, ms) -> int:
    from mixgemm.bench import call_overhead

    if not torch.cuda.is_available() or args.device == "cpu":
        print("mixgemm bench: error: --call-overhead times CUDA launches and needs a CUDA GPU", file=sys.stderr)
        return 2
    if shapes and len(shapes) != 1:
        print(f"mixgemm bench: error: --call-overhead takes one KxN shape, got {len(shapes)}", file=sys.stderr)
        return 2
    print(call_overhead.run(args.out, shapes[0] if shapes else call_overhead.DEFAULT_SHAPE,
                            tuple(ms) if ms else call_overhead.DEFAULT_MS, suite=args.suite or "call-overhead"))
    return 0


def _fold(args) -> int:
    """--fold: the part's cases into the results file of its GPU and suite, rendered (merge.fold); a model run's
    acceptance view with --read-ceiling-pct's read ceiling where given."""
    try:
        data, prefix = merge.fold(args.fold, args.out, args.suite)
    except ValueError as e:
        print(f"mixgemm bench: error: {e}", file=sys.stderr)
        return 2
    if data.get("accept") is not None:
        if args.read_ceiling_pct is not None:
            data["accept"] = {"read_ceiling_pct": args.read_ceiling_pct}
        print(accept.to_markdown(data, read_ceiling_pct=data["accept"]["read_ceiling_pct"]))
    paths = output.write_all(data, prefix, args.plot, csv_too=args.csv)
    print(f"folded {args.fold} into {', '.join(paths)}")
    return 0


def read_ceiling_pct(given: float | None, previous: dict | None) -> float | None:
    """The read ceiling a --model run's acceptance view uses: --read-ceiling-pct, else (a --merge into a file measured
    against one) the file's own, so that a partial re-run does not drop the bar the file was judged by."""
    if given is not None or not previous:
        return given
    return (previous.get("accept") or {}).get("read_ceiling_pct")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        bits = parse_ints(args.bits, "--bits")
        if any(b not in (4, 8) for b in bits):
            raise ValueError(f"--bits: mixgemm supports 4 and 8, got {bits}")
        shapes = parse_shapes(args.shapes) if args.shapes else None
        ms = parse_ints(args.ms, "-m") if args.ms else None
        count = parse_int(args.random, "--random", 1) if args.random is not None else None
        seed = parse_int(args.seed, "--seed", 0, draw.MAX_SEED) if args.seed is not None else None
        chosen_models = models.resolve(args.model) if args.model else None
        if args.time_budget is not None and args.time_budget <= 0:
            raise ValueError(f"--time-budget: {args.time_budget} must be positive")
        if args.rounds < 1:
            raise ValueError(f"--rounds: {args.rounds} must be at least 1")
        conv_filter = [p.strip() for s in args.conv_filter or [] for p in s.split(",") if p.strip()]
        if conv_filter and not args.conv_models:
            raise ValueError("--conv-filter chooses layers of --conv-models; give --conv-models too")
    except ValueError as e:
        print(f"mixgemm bench: error: {e}", file=sys.stderr)
        return 2
    if args.fold:
        return _fold(args)
    if args.list_models:
        for m in models.catalog().values():
            layers = ", ".join(f"{lay.name} {lay.k}x{lay.n}" for lay in models.linear_layers(m))
            print(f"{m.name:<14} {m.source:<36} {layers}")
        return 0
    choosers = [opt for opt, given in (("--model", chosen_models), ("--shapes", shapes), ("--random", count),
                                       ("--conv", args.conv), ("--conv-models", args.conv_models),
                                       ("--conv-networks", args.conv_networks is not None)) if given]
    if len(choosers) > 1:
        print(f"mixgemm bench: error: {' and '.join(choosers)} both choose the shapes; give one", file=sys.stderr)
        return 2
    if args.conv_networks is not None:
        return conv_networks.main(args, ms, bits, DTYPES[args.dtype or "fp16"])
    if args.call_overhead:
        return _call_overhead(args, shapes, ms)
    # the layer shapes of a --model or --random run (timed and judged alike), by (K, N)
    by_shape = models.model_layers(chosen_models) if chosen_models else {}
    model_suite = None
    if chosen_models:
        every = any(p.strip().lower() == models.ALL for s in args.model for p in s.split(","))
        model_suite = models.suite_for(chosen_models, every)
    extra_meta = {}
    if count:
        if seed is None:
            seed = draw.new_seed()
        drawn = draw.draw_layers(count, seed)
        by_shape, model_suite = drawn.by_shape(), f"random-{seed}"
        extra_meta["random"] = {"count": count, "seed": seed}
        print(f"mixgemm bench: --random {count} --seed {seed} (the same seed draws the same shapes): "
              + " ".join(f"{k}x{n}" for k, n in by_shape))
    cuda = torch.cuda.is_available()
    device = "cuda" if (args.device == "cuda" or (args.device == "auto" and cuda)) else "cpu"
    dtype = DTYPES[args.dtype or ("fp16" if device == "cuda" else "bf16")]
    dtype_name = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    if device == "cuda" and not cuda:
        print("mixgemm bench: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if args.conv_models:
        meths_all = conv_models_methods(torch.float32 if device == "cpu" else dtype, device)
    elif args.conv:
        meths_all = conv_methods(dtype, device)
    else:
        meths_all = all_methods(bits, args.group_size)
    if args.conv and device == "cpu":
        print("mixgemm bench: error: --conv times GPU kernels against cuDNN; no CUDA GPU here", file=sys.stderr)
        return 2
    spec = args.methods
    if spec is None and device == "cuda" and dtype == torch.float32 and not (args.conv or args.conv_models):
        spec = "default," + BASELINE_CPU  # fp32 activations: put fp32 cuBLAS beside them
    # the methods the acceptance view reads, as far as --bits / --group-size give them
    accept_names = ",".join(n for n in accept.METHODS if any(m.name == n for m in meths_all))
    if spec is None and by_shape:
        spec = "default," + accept_names  # the peers and every method the acceptance view needs
    elif spec == "accept":
        spec = accept_names
    try:
        if spec and spec.startswith("default,"):
            # a model run has many shapes: leave out the methods too slow to set up for each (as --quick does)
            slow_out = args.quick or bool(by_shape)
            chosen = select(meths_all, None, device, slow_out, dtype) + select(meths_all, spec[8:], device)
            chosen = list(dict.fromkeys(chosen))
        else:
            chosen = select(meths_all, spec, device, args.quick, dtype)
    except ValueError as e:
        print(f"mixgemm bench: error: {e}", file=sys.stderr)
        return 2

    if args.list_methods:
        from mixgemm.bench.methods import Context

        ctx = Context(torch.device(device), dtype, args.group_size)
        width = max(len(m.name) for m in meths_all) + 2
        for m in meths_all:
            why = m.unavailable(ctx) if (device == "cuda" or m.cpu) else "GPU only"
            print(f"{m.name:<{width}}{'runs here' if not why else 'not here: ' + why}   {m.description}")
        return 0

    if args.conv_models:
        try:
            plan, conv_labels = _conv_models_plan(conv_filter, ms, device)
        except ValueError as e:
            print(f"mixgemm bench: error: {e}", file=sys.stderr)
            return 2
        if device == "cpu":
            dtype = torch.float32
        else:
            torch.backends.cudnn.benchmark = True  # the peer as users run it: cuDNN's fastest algorithm per layer
    elif device == "cpu" and by_shape:
        small = [s for s in by_shape if s[0] * s[1] <= CPU_MODEL_MAX_WEIGHTS]
        plan = [(s, ms or CPU_PLAN[0][1]) for s in small]
        print(f"mixgemm bench: no CUDA GPU{' used' if cuda else ' found'}: timing mixgemm's CPU fallback "
              f"({dtype_name}, eager wall clock) on the {len(small)} of {len(by_shape)} layer shapes with at most "
              f"{CPU_MODEL_MAX_WEIGHTS:,} weights (larger ones take minutes per case in eager PyTorch). No floors: "
              "the acceptance view needs a CUDA GPU.", file=sys.stderr)
        if not plan:
            print("mixgemm bench: nothing to run on the CPU", file=sys.stderr)
            return 2
    elif by_shape:
        plan = [(s, ms or MODEL_M) for s in by_shape]
    elif device == "cpu":
        plan = [((k, n), ms or CPU_PLAN[0][1]) for k, n in (shapes or [CPU_PLAN[0][0]])]
        what = "; ".join(f"{k}x{n} at M = {', '.join(map(str, m))}" for (k, n), m in plan)
        why = ("the shapes you named" if shapes else
               "one small layer, not the GPU plan: the CPU fallback is eager PyTorch and the GPU shapes would take "
               "minutes per case (--shapes / -m choose others)")
        print(f"mixgemm bench: no CUDA GPU{' used' if cuda else ' found'}, so this run times mixgemm's CPU "
              f"fallback ({dtype_name} activations, eager wall clock, warm caches) beside {dtype_name} "
              f"torch.nn.functional.linear on {what}: {why}. No floors or % of floor: they describe the GPU kernels. "
              "Run on a CUDA GPU for the scoreboard.", file=sys.stderr)
    elif args.conv:
        plan = [(spec, ms or CONV_BATCHES) for spec in CONV_PRESET]
        torch.backends.cudnn.benchmark = True
    elif shapes or ms:
        plan = [(s, ms or PROTOCOL_M) for s in (shapes or PRESETS["protocol"])]
    elif args.protocol_rows:
        plan = protocol_plan()
    elif args.quick:
        plan = QUICK_PLAN
    else:
        plan = [(s, PROTOCOL_M) for s in PRESETS["protocol"]]

    quick = args.quick
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    suite = args.suite or suite_name(args, device, shapes, ms, model_suite)
    prefix = os.path.join(args.out, protocol.gpu_dir(name), suite)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with_model = bool(count) or len(chosen_models or ()) > 1
    labels = {f"{k}x{n}": models.shape_label(lays, with_model) for (k, n), lays in by_shape.items()}
    if args.conv_models:
        labels = conv_labels  # a conv layer's users, by its name
    try:
        previous = merge.load(prefix + ".json", name) if args.merge else None
    except ValueError as e:
        print(f"mixgemm bench: error: {e}", file=sys.stderr)
        return 2
    if previous:
        before = sum(len(ms) for _, ms in plan)
        plan, done = merge.remaining(plan, [m.name for m in chosen], previous)
        held = before - sum(len(ms) for _, ms in plan)
        if held:
            print(f"mixgemm bench: --merge: {prefix}.json already holds {held} (shape, M) pair(s) of this plan "
                  f"({len(done)} shape(s) whole); skipping them", file=sys.stderr)

    def finish(part: dict) -> dict:
        """This run's data as written: with the layer names, merged into the previous file when asked."""
        if labels:
            part["layers"] = labels
        return merge.combine(previous, part) if previous else part

    t0 = time.time()
    deadline = t0 + args.time_budget if args.time_budget else None
    cfg = SweepConfig(plan=plan, methods=chosen, device=device, dtype=dtype, group_size=args.group_size,
                      seed=seed or 0, quick=quick, max_bytes=int(args.max_mem_gb * 2**30),
                      warmup_ms=10 if quick else 25, rep_ms=40 if quick else 100, deadline=deadline,
                      rounds=args.rounds,
                      extra_meta={"argv": list(argv) if argv is not None else sys.argv[1:], **extra_meta})
    total = sum(len(m) for _, m in plan) * len(chosen)
    if device == "cuda" and total and args.conv_models:
        print(f"mixgemm bench: {len(plan)} conv layer(s), {total} cases (a few seconds a layer; --time-budget S stops "
              "starting layers after S seconds, --merge continues)", file=sys.stderr)
    elif device == "cuda" and total:
        est = estimate_seconds(plan, len(chosen), cfg.warmup_ms, cfg.rep_ms)
        print(f"mixgemm bench: {len(plan)} shape(s), {total} cases: roughly {est / 60:.0f} min on an H100 (more "
              "when slow peers run at large M, or kernels compile)", file=sys.stderr)
    if previous and not plan:
        print(f"mixgemm bench: --merge: nothing left to run; rendering {prefix}.json", file=sys.stderr)
        data = previous
    else:
        progress = Progress(total, enabled=not args.no_progress)
        try:
            data = run_sweep(cfg, progress,
                             checkpoint=lambda part: output.write_json(finish(part), prefix + ".json"))
        finally:
            progress.close()
        data = finish(data)
    print(output.terminal_table(data))
    print()
    print(output.pivot_markdown(data))
    cmp = compare_markdown(data)
    if cmp:
        print("\n" + cmp)
    if by_shape and device == "cuda":
        pct = read_ceiling_pct(args.read_ceiling_pct, previous)
        data["accept"] = {"read_ceiling_pct": pct}
        print("\n" + accept.to_markdown(data, read_ceiling_pct=pct))
    if args.conv_models and device == "cuda":
        data["accept_conv"] = {}
        print("\n" + accept.conv_to_markdown(data))
    paths = output.write_all(data, prefix, args.plot, csv_too=args.csv)
    if data["meta"].get("not_run"):
        left = data["meta"]["not_run"]
        print(f"mixgemm bench: --time-budget: {len(left)} shape(s) not run ({', '.join(left[:8])}"
              f"{', ...' if len(left) > 8 else ''}); run the same command with --merge to add them", file=sys.stderr)
    if args.plot and not any(p.endswith(".png") for p in paths):
        print("mixgemm bench: --plot needs matplotlib (pip install matplotlib); no PNG written",
              file=sys.stderr)
    again = f" (--random {count} --seed {seed} draws these shapes again)" if count else ""
    print(f"\nwrote {', '.join(paths)} in {time.time() - t0:.0f} s{again}")
    bad = [r for r in data["results"] if r["status"] == "wrong"]
    if bad:
        print(f"mixgemm bench: {len(bad)} case(s) gave WRONG results (see the table): "
              + ", ".join(sorted({r['method'] for r in bad})), file=sys.stderr)
        return 1
    return 0
