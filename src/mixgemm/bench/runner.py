"""The sweep: every (shape, method, M) case checked against its reference, then timed per the protocol.

Loop order is shape -> method -> M so that only one method's layer copies (and its float64 reference
weight) live at a time; with rounds > 1, shape -> round -> method -> M (later rounds time the cases that were
checked and timed in the first, on fresh copies, and each reports the median of its rounds). A case ends in one of
these statuses:

* ``ok``: the output matched the reference within the method's tolerance, then was timed.
* ``wrong``: the output did not match; it is reported with its error and NOT timed.
* ``error``: the method raised (message in ``note``); ``n/a``: the case does not apply (``note`` says why);
  ``refused``: the method's format cannot hold the layer (its prepare raised methods.Refused; ``note`` says why);
  ``unavailable``: the method cannot run on this machine (import failed, no GPU...).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from mixgemm.bench import floors, protocol
from mixgemm.bench.conv import CONV_BASELINE, CONV_BASELINES, ConvSpec
from mixgemm.bench.methods import BASELINE_GPU, CPU_BASELINES, Context, Method, Prepared, Refused

CHECK_ROWS = 256  # rows checked at each end of the output when M > 2 * CHECK_ROWS (bounds reference memory)


@dataclass
class SweepConfig:
    plan: list[tuple]  # [((K, N), [M, ...]), ...] and/or [(ConvSpec, [batch, ...]), ...]
    methods: list[Method]
    device: str = "cuda"
    dtype: torch.dtype = torch.float16
    group_size: int = 128
    seed: int = 0
    quick: bool = False
    max_bytes: int = protocol.DEFAULT_MAX_BYTES
    min_copies: int = protocol.MIN_COPIES
    warmup_ms: float = 25
    rep_ms: float = 100
    extra_meta: dict = field(default_factory=dict)
    deadline: float | None = None  # time.time() after which no new shape starts (the run ends short)
    # rounds > 1: every method of a shape is timed again in turn (after all of them ran once) and each case reports
    # the median of its rounds: power-capped GPUs move single timings by up to 15% within a run (docs/benchmarking.md)
    rounds: int = 1


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = float(b.norm())
    num = float((a - b).norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _x_for(m: int, k: int, seed: int, device: str) -> torch.Tensor:
    """The activation of case M: float32 N(0, 1), the same for every method (seeded by seed and M)."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + m)
    return torch.randn(m, k, generator=gen, device=device, dtype=torch.float32)


def _weight_for(k: int, n: int, seed: int, device: str) -> torch.Tensor:
    """The layer weight [N, K]: float32 N(0, 0.02^2) like a real projection, never zeros."""
    gen = torch.Generator(device=device).manual_seed(seed * 7919 + k * 31 + n)
    return torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * 0.02


def _dims(shape, m: int) -> dict:
    """Record fields of a case: K, N, M (the implicit GEMM's for a conv, plus layer and batch)."""
    if isinstance(shape, ConvSpec):
        mm, k, n = shape.gemm_dims(m)
        return {"K": k, "N": n, "M": mm, "layer": shape.name, "batch": m}
    k, n = shape
    return {"K": k, "N": n, "M": m}


def _check_rows(m: int, device) -> torch.Tensor | None:
    if m <= 2 * CHECK_ROWS:
        return None
    return torch.cat([torch.arange(CHECK_ROWS), torch.arange(m - CHECK_ROWS, m)]).to(device)


def _chosen(prep: Prepared, x: torch.Tensor) -> str:
    """The entry the layer runs on x (Prepared.chosen), or why that could not be asked: a note, never the case's
    failure."""
    try:
        return prep.chosen(x)
    except Exception as e:
        return "entry unknown: " + _short(e)


def _short(e: BaseException, limit: int = 300) -> str:
    msg = f"{type(e).__name__}: {e}".replace("\n", " ")
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_sweep(cfg: SweepConfig, progress: Callable[[str], None] | None = None,
              checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Run every case; returns {"meta", "ceilings", "results", "unavailable"} (see output.py for the JSON).
    checkpoint(partial) is called after each method of each shape with the results so far (so a run cut
    short by a time limit still leaves its numbers)."""
    device = cfg.device
    t_start = time.time()
    meta = protocol.machine_info(device)
    meta.update({"quick": cfg.quick, "dtype": str(cfg.dtype).replace("torch.", ""),
                 "group_size": cfg.group_size, "seed": cfg.seed, "protocol": "docs/benchmarking.md"})
    meta.update(cfg.extra_meta)
    ceil = protocol.ceilings(quick=cfg.quick, device=device)
    l2 = protocol.l2_bytes() if device == "cuda" else 0
    ctx = Context(torch.device(device), cfg.dtype, cfg.group_size)
    baseline = BASELINE_GPU if device == "cuda" else CPU_BASELINES[cfg.dtype]
    results: list[dict] = []
    unavailable: dict[str, str] = {}
    methods = []
    for mth in cfg.methods:
        why = mth.unavailable(ctx)
        if why:
            unavailable[mth.name] = why
        else:
            methods.append(mth)

    rate = {"fp16": ceil.get("fp16_flops"), "int8": ceil.get("int8_ops"),
            "fp32": ceil.get("fp32_flops") or ceil.get("fp16_flops")}

    not_run: list[str] = []
    for shape, ms in cfg.plan:
        conv = isinstance(shape, ConvSpec)
        if cfg.deadline is not None and time.time() > cfg.deadline:
            not_run.append(shape.name if conv else f"{shape[0]}x{shape[1]}")
            continue
        if conv:
            ctx.notes["conv_spec"] = shape
            w = shape.weight(cfg.seed, device)
            label = shape.name
        else:
            k, n = shape
            w = _weight_for(k, n, cfg.seed, device)
            label = f"{k}x{n}"
        timed: dict[tuple, dict] = {}  # (method, M) -> the record of a case checked and timed in the first round
        for mth in methods:
            if mth.kind != ("conv" if conv else "matmul"):
                continue
            base = {"method": mth.name, "family": mth.family, "kind": mth.kind}
            todo = [m for m in ms]
            try:
                prep = mth.prepare(w, ctx)
                _sync(device)
            except Exception as e:
                refused = isinstance(e, Refused)
                for m in todo:
                    results.append({**base, **_dims(shape, m), "status": "refused" if refused else "error",
                                    "note": str(e) if refused else "prepare: " + _short(e)})
                    if progress:
                        progress(f"{label} {mth.name}")
                _free(device)
                continue
            layers = [prep.layer]
            for m in todo:
                dims = _dims(shape, m)
                k, n, mm = dims["K"], dims["N"], dims["M"]
                rec = {**base, **dims, "status": None, "note": prep.note}
                t_case = time.time()
                if progress:
                    progress(f"{label} {'B' if conv else 'M'}={m} {mth.name}")
                why = mth.applies(mm, k, n, ctx)
                if why:
                    results.append({**rec, "status": "n/a", "note": why})
                    continue
                x_in = prep.x_map(shape.x(m, cfg.seed, device) if conv else _x_for(m, k, cfg.seed, device))
                try:
                    # a first call builds the kernel layouts (a build may read other layouts, e.g. gemv_mma_v1 is
                    # made from gemv_v2); the bytes counted are those of the layouts the second call reads
                    warm = prep.layer(x_in)
                    _sync(device)
                    del warm
                    if prep.chosen is not None:
                        rec["note"] = ", ".join(s for s in (prep.note, _chosen(prep, x_in)) if s)
                    prep.before_call()
                    y = prep.layer(x_in)
                    _sync(device)
                    wbytes = int(prep.weight_bytes())
                    y_numel = y.numel()
                    rows = None if conv else _check_rows(m, x_in.device)
                    if rows is None:
                        ys, xs = y, x_in
                    else:
                        ys, xs = y.index_select(0, rows), x_in.index_select(0, rows)
                    err = rel_err(ys, prep.reference(xs))
                    del y, ys, xs
                except Exception as e:
                    results.append({**rec, "status": "error", "note": _short(e)})
                    _free(device)
                    continue
                rec.update({"rel_err": err, "tol": prep.tol, "weight_bytes": wbytes})
                # bytes: weights as read + the activation tensor in + the output tensor out, each once
                nbytes = wbytes + x_in.numel() * prep.act_bytes + y_numel * prep.out_bytes
                flops = floors.matmul_flops(mm, k, n)
                fl = floors.floor_of(nbytes, flops, ceil["copy_bw"], rate.get(prep.compute))
                w4_bytes = floors.protocol_w4_bytes(0, k, n) + 2 * (x_in.numel() + y_numel)
                w4 = floors.floor_of(w4_bytes, 0, ceil["copy_bw"], None)
                rec.update({"bytes": nbytes, "flops": flops, "floor_us": fl.us, "floor_mem_us": fl.mem_us,
                            "floor_compute_us": fl.compute_us, "bound": fl.bound, "w4_floor_us": w4.us})
                if conv:  # the time to read the weights this method stores, alone (a conv's activations often dominate)
                    rec["weight_floor_us"] = floors.floor_of(wbytes, 0, ceil["copy_bw"], None).us
                if not (err <= prep.tol):  # NaN counts as wrong
                    results.append({**rec, "status": "wrong",
                                    "note": f"rel err {err:.3g} > tol {prep.tol:.3g}: not timed"})
                    continue
                try:
                    _time_case(rec, prep, layers, x_in, _copy_bytes(rec), cfg, l2)
                    rec["status"] = "ok"
                    timed[(mth.name, m)] = rec
                except Exception as e:
                    rec["status"] = "error"
                    rec["note"] = "timing: " + _short(e)
                rec["case_s"] = round(time.time() - t_case, 2)
                results.append(rec)
                _free(device)
            prep = layers = None  # drop this method's copies before the next one
            _free(device)
            if checkpoint:
                derive(results, baseline, device)
                checkpoint({"meta": {**meta, "partial": True}, "ceilings": ceil, "baseline": baseline,
                            "results": results, "unavailable": unavailable})
        for _ in range(1, cfg.rounds):
            for mth in methods:
                again = [(m, rec) for (name, m), rec in timed.items() if name == mth.name]
                if again:
                    _time_again(mth, shape, again, w, ctx, cfg, l2, progress, label)
        for rec in timed.values():
            for key in ("graph_us", "eager_us"):
                got = [t for t in rec.pop(f"{key}_rounds", []) if t is not None]
                if got and cfg.rounds > 1:
                    rec[key] = statistics.median(got)
            if cfg.rounds > 1:
                rec["rounds"] = cfg.rounds
        w = None
        _free(device)

    derive(results, baseline, device)
    if not_run:
        meta["not_run"] = not_run  # shapes a time budget left out
    meta["wall_s"] = round(time.time() - t_start, 1)
    if device == "cuda":
        after = protocol._nvidia_smi()  # clocks under load (the first reading is usually the idle clock)
        if after:
            after.pop("driver_version", None)
            meta["clocks_after"] = after
    listed = [{"name": m.name, "family": m.family, "description": m.description} for m in cfg.methods]
    if cfg.plan and all(isinstance(s, ConvSpec) for s, _ in cfg.plan):
        baseline = next((m.name for m in cfg.methods if m.name in CONV_BASELINES), CONV_BASELINE)
    return {"meta": meta, "ceilings": ceil, "baseline": baseline, "results": results,
            "unavailable": unavailable, "methods": listed}


def _copy_bytes(rec: dict) -> int:
    """The bytes one call's copy counts toward the protocol's C copies > 3x L2: a matmul's weights; a conv layer's
    weights, input and output (its activations usually outweigh its weights and are as large at every copy)."""
    return rec["bytes"] if rec.get("layer") else rec["weight_bytes"]


def _time_case(rec: dict, prep, layers: list, x_in: torch.Tensor, copy_bytes: int, cfg: SweepConfig,
               l2: int) -> None:
    """Time one checked case per the protocol into rec (graph_us / eager_us, copies), adding layer copies to
    ``layers`` as needed; each time is also appended to rec's ``*_rounds`` list (medians taken when rounds > 1)."""
    if cfg.device == "cuda":
        copy_bytes = max(copy_bytes, 1)
        c = protocol.copies_for(copy_bytes, l2, cfg.min_copies, cfg.max_bytes)
        while len(layers) < c:
            layers.append(prep.new_copy())
        fns = [partial(f, x_in) for f in layers[:c]]
        rec["copies"] = c
        rec["copies_bytes"] = c * copy_bytes
        try:
            rec["graph_us"] = protocol.graph_time_us(fns, cfg.warmup_ms, cfg.rep_ms)
        except Exception as e:
            rec["graph_us"] = None
            msg = "graph capture failed: " + _short(e)
            if msg not in (rec["note"] or ""):
                rec["note"] = f"{rec['note']}; {msg}" if rec["note"] else msg
            torch.cuda.synchronize()
        rec["eager_us"] = protocol.eager_time_us(fns, cfg.warmup_ms, cfg.rep_ms)
    else:
        rec["copies"] = 1
        rec["graph_us"] = None
        rec["eager_us"] = protocol.cpu_time_us(partial(prep.layer, x_in))
    for key in ("graph_us", "eager_us"):
        rec.setdefault(f"{key}_rounds", []).append(rec[key])


def _time_again(mth: Method, shape, again: list[tuple[int, dict]], w, ctx: Context, cfg: SweepConfig, l2: int,
                progress, label: str) -> None:
    """A later round of one method on one shape: fresh copies, each case of ``again`` ((M, its first-round
    record)) warmed and timed once more. A failure ends the method's round, noted on its cases."""
    device = cfg.device
    conv = isinstance(shape, ConvSpec)
    try:
        prep = mth.prepare(w, ctx)
        layers = [prep.layer]
        for m, rec in again:
            if progress:
                progress(f"{label} {'B' if conv else 'M'}={m} {mth.name} (again)")
            x_in = prep.x_map(shape.x(m, cfg.seed, device) if conv else _x_for(m, rec["K"], cfg.seed, device))
            warm = prep.layer(x_in)
            _sync(device)
            del warm
            prep.before_call()
            _time_case(rec, prep, layers, x_in, _copy_bytes(rec), cfg, l2)
            _free(device)
    except Exception as e:
        for _, rec in again:
            msg = "a later round failed: " + _short(e)
            rec["note"] = f"{rec['note']}; {msg}" if rec["note"] else msg
    _free(device)


def case_key(r: dict) -> tuple:
    """What a case measures, less the method: (kind, layer, K, N, M); conv layers of one implicit-GEMM size differ by
    their layer (stride, padding, dilation, input size)."""
    return (r["kind"], r.get("layer"), r["K"], r["N"], r["M"])


def derive(results: list[dict], baseline: str, device: str) -> None:
    """The derived columns of each case, in place: time_us (graph when there is one), % of floor and the speedup
    over the baseline measured on the same case (K, N, M)."""
    base_t = {}
    for r in results:
        r["time_us"] = r.get("graph_us") if r.get("graph_us") is not None else r.get("eager_us")
        is_base = r["method"] in CONV_BASELINES if r["kind"] == "conv" else r["method"] == baseline
        if is_base and r["status"] == "ok":
            base_t[case_key(r)] = r
    for r in results:
        if r["status"] != "ok":
            continue
        # % of the memory/compute floor means something only for the GPU kernels timed under the protocol; a CPU
        # run is eager wall clock with warm caches, so it gets no % of floor
        r["pct_floor"] = floors.pct_of_floor(r["floor_us"], r["time_us"]) if device == "cuda" else None
        b = base_t.get(case_key(r))
        r["speedup"] = b["time_us"] / r["time_us"] if b and r["time_us"] else None
        r["speedup_eager"] = (b["eager_us"] / r["eager_us"]
                              if b and r.get("eager_us") and b.get("eager_us") else None)
