"""`mixgemm tune`: measure the registry entries' candidate configs on this GPU for a model's layer shapes and write
the per-GPU tuning cache (mixgemm.tuning.cache) that the dispatcher reads.

For each (layer shape, M, weight format) the registry says which entry runs the problem and what config it is
handed today (the default); the entry's candidates (KernelEntry.candidates) are checked once against the float64
reference (a wrong one is dropped, loudly), then the default and the candidates are timed in rounds with the
benchmark protocol's graph timing over rotating layer copies (mixgemm.bench.protocol). A bucket gets a cache entry
only when its best candidate beats the default by more than the margin and more than the measured spread
(:func:`pick`): tuning can only make a measured shape faster.

Then the op's entries that the tuning data declines softly for the problem (:func:`alternatives`: the tensor-core
GEMV at fp16 M = 1 outside its measured buckets, a GEMV past the crossover, ...) are timed with their own configs
against the chosen entry's best; one that wins the same way becomes the bucket's *choice* (mixgemm.tuning.cache
CHOICE), which the registry then runs for that bucket. Later shapes of a bucket must confirm a choice, or it is
dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import mixgemm.quantize_api as qapi

# the formats tune measures: the quantize_ defaults and their zero-point forms (GPTQ / AWQ checkpoints load as W4 g128
# zero point), whose kernels' tiles differ (the cache keys keep the modes apart)
WEIGHT_ONLY = {"W4A16": qapi.W4A16(), "W4A16-ZP": qapi.W4A16(mode="zero_point"), "W8A16": qapi.W8A16(),
               "W8A16-ZP": qapi.W8A16(mode="zero_point")}
# int8-activation formats: the schemes as quantize_ builds them (W8A8 per channel, its activations per token; W4A8 per
# token with integer group scales), each call quantizing its activations as the layer does
INT8 = {"W8A8": qapi.W8A8(), "W4A8-TOKEN": qapi.W4A8(act_block="token")}
FORMATS = {**WEIGHT_ONLY, **INT8}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
NO_GPU = "mixgemm tune measures kernels on a CUDA GPU and none is available here: there is nothing to tune on a CPU"


@dataclass
class Timed:
    config: dict
    times_us: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times_us)

    @property
    def spread(self) -> float:
        """Run-to-run spread relative to the median: (max - min) / median."""
        return (max(self.times_us) - min(self.times_us)) / self.median


@dataclass
class Verdict:
    best: Timed | None  # the candidate to cache, None to keep the default
    reason: str


def pick(default: Timed, candidates: list[Timed], margin: float) -> Verdict:
    """The candidate that beats the default clearly, or none: its median must be faster by more than ``margin``
    (a fraction) and by more than the spread of either measurement, and its slowest run faster than the default's
    fastest."""
    if not candidates:
        return Verdict(None, "no candidate")
    best = min(candidates, key=lambda t: t.median)
    gain = 1.0 - best.median / default.median
    noise = max(default.spread, best.spread)
    if gain <= margin:
        return Verdict(None, f"best candidate {gain:+.1%} against the default (needs > {margin:.0%})")
    if gain <= noise or max(best.times_us) >= min(default.times_us):
        return Verdict(None, f"best candidate {gain:+.1%} within the run-to-run spread ({noise:.1%})")
    return Verdict(best, f"{gain:+.1%} against the default (spread {noise:.1%})")


def tune_bucket(default_config: dict, candidates: list[dict], time_us: Callable[[dict], float],
                check: Callable[[dict], str | None], rounds: int = 3, margin: float = 0.03,
                log: Callable[[str], None] = print) -> tuple[Timed, Verdict]:
    """Check each candidate (check(config) -> None when its output matches the reference, else why not; a failing
    one is dropped with a message), time the default and the survivors in ``rounds`` interleaved rounds
    (time_us(config) -> us), and :func:`pick`."""
    ok = []
    for cfg in candidates:
        why = check(cfg)
        if why is None:
            ok.append(Timed(dict(cfg)))
        else:
            log(f"DROPPED candidate {cfg}: {why}")
    default = Timed(dict(default_config))
    for _ in range(rounds):
        for t in (default, *ok):
            t.times_us.append(time_us(t.config))
    return default, pick(default, ok, margin)


def confirm(default_config: dict, winner: dict, time_us: Callable[[dict], float], check: Callable[[dict], str | None],
            rounds: int = 3, log: Callable[[str], None] = print) -> bool:
    """Whether a bucket's cached config still holds on another shape of the bucket: its output is right and its
    median time is below the default's there."""
    return _confirm_timed(default_config, winner, time_us, check, rounds, log)[0]


def _confirm_timed(default_config: dict, winner: dict, time_us, check, rounds: int, log) -> tuple[bool, Timed | None]:
    """(confirm's answer, the faster of the two timings it took -- None when the winner's output is wrong)."""
    why = check(winner)
    if why is not None:
        log(f"DROPPED the bucket's config {winner}: {why}")
        return False, None
    d, w = Timed(dict(default_config)), Timed(dict(winner))
    for _ in range(rounds):
        for t in (d, w):
            t.times_us.append(time_us(t.config))
    return w.median < d.median, min(d, w, key=lambda t: t.median)


# ------------------------------------------------------------------------------------------------ the CLI
@dataclass(frozen=True)
class Job:
    k: int
    n: int
    m: int
    fmt: str  # a FORMATS name
    x_dtype: torch.dtype
    layers: str = ""  # which model layers have this shape (for the log)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'4096x4096,4096x14336' -> [(K, N), ...] (K = in_features, N = out_features)."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes {item!r}: write each shape as KxN with positive integers (K in, N out)")
        out.append((int(parts[0]), int(parts[1])))
    if not out:
        raise ValueError("--shapes: no shape given")
    return out


def parse_formats(text: str) -> list[str]:
    names = [s.strip().upper() for s in text.split(",") if s.strip()]
    for nm in names:
        if nm not in FORMATS:
            raise ValueError(f"--formats {nm}: tune covers the formats {', '.join(FORMATS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixgemm tune", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", nargs="+", help="config.json path(s), folders holding one, names of the committed "
                     "list, or 'all' (mixgemm bench --model's list)")
    src.add_argument("--shapes", nargs="+", help="KxN,... (K in_features, N out_features)")
    p.add_argument("-m", nargs="+", type=int, default=[1, 16, 256], help="token counts M (default 1 16 256)")
    p.add_argument("--formats", default="W4A16,W8A16", help=f"formats: {', '.join(FORMATS)} (default W4A16,W8A16; "
                   "-ZP: zero point, as GPTQ / AWQ checkpoints load; W8A8 / W4A8-TOKEN: int8 activations, the "
                   "activation quantizer timed with the GEMM)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="activation dtype (default fp16)")
    p.add_argument("--out", help="cache file (default $MIXGEMM_TUNING_CACHE or ~/.cache/mixgemm/tuning/<gpu>.json)")
    p.add_argument("--time-budget", type=float, default=None, help="stop starting new buckets after S seconds")
    p.add_argument("--margin", type=float, default=0.03, help="required gain over the default (default 0.03)")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds per config (default 3)")
    p.add_argument("--layout", choices=("compact", "plain"), default="compact",
                   help="compact (default): weights keeping one resident layout, what quantize_ leaves on an sm_90 "
                        "GPU; plain: the plain codes with each kernel's layout (quantize_(compact=False), "
                        "mixgemm.matmul on a QuantizedWeight). The cache keeps the two apart")
    return p


def jobs_from_args(args) -> list[Job]:
    from mixgemm.bench import models

    if args.shapes:
        shapes = {s: "" for s in parse_shapes(",".join(args.shapes))}
    else:
        grouped = models.model_layers(models.resolve(args.model))
        shapes = {s: models.shape_label(layers) for s, layers in grouped.items()}
    if any(m < 1 for m in args.m):
        raise ValueError(f"-m: token counts must be >= 1, got {args.m}")
    fmts = parse_formats(args.formats)
    return [Job(k, n, m, f, DTYPES[args.dtype], label) for (k, n), label in shapes.items() for f in fmts
            for m in sorted(set(args.m))]


def _reference_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    from mixgemm.bench.runner import rel_err

    return rel_err(y, ref)


@dataclass
class LayerCopies:
    """One layer's random quantized weight and its copies (together over 3x L2), kept while the jobs of that
    (shape, format) run: the jobs are ordered shape, format, then M."""

    key: tuple
    weights: list
    w64: torch.Tensor  # the dequantized weight (float64), for the reference


def _layer(job: Job, l2: int, compact: bool = False) -> LayerCopies:
    """compact: each copy keeps only its resident layout (as a compacted QuantLinear's weight)."""
    from mixgemm.bench import protocol
    from mixgemm.formats import dequantize_weight
    from mixgemm.formats.weight import compact_placeholder
    from mixgemm.ops.custom_ops import compact_weight

    key = (job.k, job.n, job.fmt)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(job.k * 7919 + job.n)
    w = torch.randn(job.n, job.k, device=dev, generator=gen)
    qw0 = qapi.scheme_weight(w, FORMATS[job.fmt])  # as quantize_ quantizes a layer of this format
    copies = protocol.copies_for(qw0.nbytes(), l2)

    def clone():
        c = lambda t: None if t is None else t.clone()  # noqa: E731
        return dataclasses.replace(qw0, qweight=c(qw0.qweight), scales=c(qw0.scales), zeros=c(qw0.zeros),
                                   offsets=c(qw0.offsets), _layouts={})

    weights = [qw0] + [clone() for _ in range(copies - 1)]
    w64 = dequantize_weight(qw0, torch.float64)
    if compact:  # the layout the layer keeps: the int8 GEMM's for int8-activation formats (QuantLinear.compact_)
        name = "wgmma_a8_v1" if job.fmt in INT8 else "wgmma_v1"
        weights = [compact_weight(q, compact_placeholder(q.qweight), name) for q in weights]
    return LayerCopies(key, weights, w64)


def _measure(job: Job, layer: LayerCopies):
    """(problem, entry, default config, time_us, check) of one job on the GPU; time_us and check take an optional
    second argument, another registry entry to run the config with (default: the chosen one)."""
    from mixgemm.bench import protocol
    from mixgemm.bench.methods import TOL
    from mixgemm.formats import quantize_activation
    from mixgemm.kernels.int8_activations import a8_problem
    from mixgemm.kernels.linear_common import linear_problem
    from mixgemm.kernels.registry import choose

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(job.m)
    x = torch.randn(job.m, job.k, device=dev, generator=gen).to(job.x_dtype)
    weights = layer.weights
    qw0 = weights[0]
    ninf, inf = -math.inf, math.inf
    if job.fmt in INT8:
        scheme = INT8[job.fmt]
        per_token = scheme.act_block == "token"
        problem = a8_problem(job.m, qw0, job.x_dtype, dev, scheme.act_mode, per_token)
        # the exact result of the int8 scheme: x quantized as the call does, then the float64 product
        blk = -1 if per_token else qw0.group_size
        ref = quantize_activation(x, blk, scheme.act_mode).dequantize() @ layer.w64.T

        def call(run_entry, q, cfg):  # the int8-activation entries quantize x inside run
            return run_entry.run(x, q, None, ninf, inf, cfg, problem, job.x_dtype)
    else:
        problem = linear_problem(job.m, qw0, job.x_dtype, dev)
        ref = x.double() @ layer.w64.T

        def call(run_entry, q, cfg):
            return run_entry.run(x, q, None, ninf, inf, cfg)
    chosen = choose(problem)
    entry = chosen.entry
    default = entry.config(problem)  # the entry's own rule: what the dispatcher picks without a tuning cache

    def time_us(cfg: dict, run_entry=entry) -> float:
        fns = [lambda q=q: call(run_entry, q, cfg) for q in weights]
        return protocol.graph_time_us(fns, warmup_ms=10, rep_ms=40)

    def check(cfg: dict, run_entry=entry) -> str | None:
        try:
            y = call(run_entry, qw0, cfg)
        except Exception as e:  # a candidate that fails to compile or launch is dropped like a wrong one
            return f"raised {type(e).__name__}: {e}"
        err = _reference_error(y, ref)
        tol = TOL[job.x_dtype]
        return None if err <= tol else f"relative error {err:.3g} > {tol:.3g} against the float64 reference"

    return problem, entry, default, time_us, check


def _tune_entry(cache, done: dict, key: str, problem, entry, default: dict, time_us, check, args, info: dict,
                log) -> tuple[Timed | None, int]:
    """Tune the chosen entry's config for one job's bucket (the cache entry ``key``): (the best measured timing of
    that entry here -- its winner or default -- or None when its default is wrong, buckets improved by this job)."""
    why = check(default)
    if why is not None:
        log(f"{key}: WRONG DEFAULT config {default} on {info['shape']} M={info['m']}: {why}; not tuned")
        cache.entries.pop(key, None)
        done[key] = None
        return None, 0
    if key in done:  # another shape of this run in a tuned bucket: the bucket's winner must hold here too
        winner = done[key]
        if winner is None:
            return _timed(default, time_us, args.rounds), 0
        holds, faster = _confirm_timed(default, winner, time_us, check, args.rounds, log)
        if holds:
            return faster, 0
        cache.entries.pop(key, None)
        done[key] = None
        log(f"{key}: entry dropped: not faster than the default on {info['shape']} M={info['m']}")
        return faster or _timed(default, time_us, args.rounds), -1
    done[key] = None
    cands = entry.candidates(problem) if entry.candidates is not None else []
    if not cands:
        log(f"{key}: {entry.name} has no candidates here; default kept")
        return _timed(default, time_us, args.rounds), 0
    dflt, verdict = tune_bucket(default, cands, time_us, check, args.rounds, args.margin, log)
    if verdict.best is None:
        cache.entries.pop(key, None)  # a re-run that no longer beats the default drops the old entry
        log(f"{key}: default kept ({dflt.median:.2f} us; {verdict.reason})")
        return dflt, 0
    cache.put(key, verdict.best.config, dflt.median, verdict.best.median, info)
    done[key] = verdict.best.config
    log(f"{key}: {dflt.median:.2f} -> {verdict.best.median:.2f} us ({verdict.reason}): {verdict.best.config}")
    return verdict.best, 1


def _timed(config: dict, time_us, rounds: int) -> Timed:
    t = Timed(dict(config))
    t.times_us = [time_us(t.config) for _ in range(rounds)]
    return t


def alternatives(problem, entry) -> list:
    """The op's other registry entries that a CHOICE cache entry may pick instead of ``entry``: those declined softly
    (by tuning data: a crossover, a measured bucket) and those after it in the list that can run the problem (passed
    over because ``entry`` came first: at M 9..16 the GEMVs run ahead of the wgmma GEMM outside the measured
    buckets)."""
    from mixgemm.kernels.registry import entries, resident_reason

    def reads_resident(e) -> bool:  # a weight with one resident layout runs only the entries reading it (checked
        # before can_run, which may build the entry's layout; again with the config where the config picks it)
        if e.layout_for is None:
            return resident_reason(e, problem, None) is None
        return resident_reason(e, problem, e.config(problem)) is None

    def may_run(e) -> bool:
        d = e.can_run(problem)
        return d.ok or d.soft

    return [e for e in entries(problem.op) if e is not entry and reads_resident(e) and may_run(e)]


# an alternative whose own config runs within this factor of the chosen entry's best has its candidates timed too: the
# small-M tile family's variants ran up to 1.42x faster than the wgmma GEMM's own small-M tile
# (docs/kernels/cuda_wgmma.md)
EXPLORE_WITHIN = 1.5


def _tune_choice(cache, chosen: dict, problem, entry, best: Timed, time_us, check, args, info: dict, log) -> int:
    """Time the alternatives' own configs against ``best`` (the chosen entry's) -- and, for one within EXPLORE_WITHIN
    of it, that entry's candidates too (the small-M tile family of the wgmma GEMM against a GEMV at M 9..16); cache a
    CHOICE entry for the bucket where one wins by the margin (pick), and drop one a later shape of the bucket does not
    confirm. Returns the buckets improved (+1 / -1 / 0)."""
    from mixgemm.tuning import cache as tcache

    ckey = tcache.bucket_key(problem, tcache.CHOICE)
    if ckey in chosen:  # another shape of the bucket: the choice must hold here too
        prev = chosen[ckey]
        if prev is None:
            return 0
        alt = next((e for e in alternatives(problem, entry) if e.name == prev[0]), None)
        t = None if alt is None or check(prev[1], alt) is not None else _timed(prev[1], lambda c: time_us(c, alt),
                                                                                 args.rounds)
        if t is not None and t.median < best.median:
            return 0
        cache.entries.pop(ckey, None)
        chosen[ckey] = None
        log(f"{ckey}: choice of {prev[0]} dropped: not faster than {entry.name} on {info['shape']} M={info['m']}")
        return -1
    chosen[ckey] = None
    timed = []
    for alt in alternatives(problem, entry):
        cfg = alt.config(problem)
        cfg = {} if cfg is None else dict(cfg)
        why = check(cfg, alt)
        if why is not None:
            log(f"{ckey}: {alt.name} left out: {why}")
            continue
        own = _timed(cfg, lambda c, a=alt: time_us(c, a), args.rounds)
        cands = alt.candidates(problem) if alt.candidates is not None else []
        if cands and own.median <= EXPLORE_WITHIN * best.median:
            own, verdict = tune_bucket(cfg, cands, lambda c, a=alt: time_us(c, a), lambda c, a=alt: check(c, a),
                                       args.rounds, 0.0, log)
            own = verdict.best or own
        timed.append((alt, own))
    verdict = pick(best, [t for _, t in timed], args.margin)
    if verdict.best is None:
        cache.entries.pop(ckey, None)
        return 0
    alt = next(a for a, t in timed if t is verdict.best)
    cache.put(ckey, verdict.best.config, best.median, verdict.best.median, info, entry=alt.name)
    chosen[ckey] = (alt.name, verdict.best.config)
    log(f"{ckey}: {entry.name} {best.median:.2f} us -> {alt.name} {verdict.best.median:.2f} us ({verdict.reason})")
    return 1


def _source(gpu: str, argv: list[str]) -> dict:
    import mixgemm

    return {"gpu": gpu, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mixgemm": mixgemm.__version__, "command": "mixgemm tune " + shlex.join(argv)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        jobs = jobs_from_args(args)
    except ValueError as e:
        print(f"mixgemm tune: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"mixgemm tune: {NO_GPU}", file=sys.stderr)
        return 2
    try:
        from tqdm import tqdm
    except ImportError:
        print("mixgemm tune: needs tqdm for its progress bar (pip install tqdm, or mixgemm[gpu])", file=sys.stderr)
        return 2

    from mixgemm.bench import protocol
    from mixgemm.nn.linear import one_layout_device
    from mixgemm.tuning import cache as tcache
    from mixgemm.tuning.buckets import ShapeBucket

    gpu = torch.cuda.get_device_name(0)
    compact = args.layout == "compact" and one_layout_device(torch.device("cuda"))
    if args.layout == "compact" and not compact:
        print("mixgemm tune: this GPU keeps the plain codes (one resident layout is for sm_90): tuning those")
    path = args.out or tcache.default_path(gpu)
    cache = tcache.load(path)
    if cache is None or cache.gpu != gpu:
        cache = tcache.TuningCache(gpu, path)
    source = _source(gpu, argv)
    l2 = protocol.l2_bytes()
    t0 = time.monotonic()
    done: dict[str, dict | None] = {}  # bucket -> the config cached for it in this run (None: the default kept)
    chosen: dict[str, tuple | None] = {}  # choice key -> (entry, config) cached in this run (None: none)
    improved = 0
    layer = None
    bar = tqdm(jobs, desc="mixgemm tune", unit="bucket")
    for job in bar:
        if args.time_budget is not None and time.monotonic() - t0 > args.time_budget:
            tqdm.write(f"time budget of {args.time_budget:g} s spent: {len(jobs) - bar.n} buckets left untuned")
            break
        if layer is None or layer.key != (job.k, job.n, job.fmt):
            layer = None  # the previous layer's copies are freed before the next one's are made
            torch.cuda.empty_cache()
            layer = _layer(job, l2, compact)
        problem, entry, default, time_us, check = _measure(job, layer)
        key = tcache.bucket_key(problem, entry.name)
        bar.set_postfix_str(f"{job.fmt} K={job.k} N={job.n} M={job.m} {entry.name}")
        info = {**source, "shape": f"{job.k}x{job.n}", "m": job.m, "bucket": ShapeBucket.of(job.k, job.n).describe()}
        best, gained = _tune_entry(cache, done, key, problem, entry, default, time_us, check, args, info, tqdm.write)
        improved += gained
        if best is not None:
            improved += _tune_choice(cache, chosen, problem, entry, best, time_us, check, args, info, tqdm.write)
    bar.close()
    written = tcache.save(cache, path)
    print(f"mixgemm tune: {improved} bucket(s) improved, {len(cache.entries)} entries in {written}")
    return 0
