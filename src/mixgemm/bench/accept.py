"""The acceptance view of a model-shapes run (the targets in docs/benchmarking.md, "Model layer shapes"): one
row per (K, N) layer shape and a verdict per line.

Computed from the JSON `mixgemm bench --model ...` writes (one run, or several merged with --merge):

* decode (M = 1): W4A16 g128 (sym and zero-point) and W8A16 per-channel reach >= 90% of the read ceiling measured in
  the same run (mixgemm.bench.read_ceiling: a no-math read of the same weight bytes, timed as the kernel is) on layers
  whose int4 weight is >= 16 MiB and >= 80% on 4-16 MiB layers (smaller layers: reported, no bar). A run without
  the ceiling's cases is judged against the copy floor instead: >= 85% / 70%, the big layers' bar min(85%, 92% of
  ``read_ceiling_pct``) where that ceiling is given in % of the copy bandwidth.
* M = 16 costs at most 1.25x the M = 1 time on layers of >= 16 MiB (same three methods).
* every M in [256, 16384]: the weight-only methods >= 0.95x fp16 cuBLAS on every shape, and the median over the
  shapes >= 1.05x for each M.
* W8A8 per-token and W4A8 per-token with integer group scales (activation quantization inside the call): >= 1.7x
  fp16 cuBLAS for M >= 2048 on every shape with N and K >= 4096.

A line PASSes when every case it needs was measured and meets its bar, FAILs when a measured case misses it (or a
case was WRONG or raised), and is INCOMPLETE when cases are missing but none failed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from mixgemm.bench.methods import BASELINE_GPU, mixgemm_weight_only_name
from mixgemm.bench.read_ceiling import ceiling_name

MIB = 2**20
W4_SYM = mixgemm_weight_only_name(4, 128)
W4_ZP = mixgemm_weight_only_name(4, 128, "zero_point")
W8 = mixgemm_weight_only_name(8, -1)
W8A8 = "mixgemm W8A8 per-channel"
W4A8 = "mixgemm W4A8 g128 int-scales act per-token"
WEIGHT_ONLY = (W4_SYM, W4_ZP, W8)
ACT_QUANT = (W8A8, W4A8)
CEILINGS = tuple(ceiling_name(m) for m in WEIGHT_ONLY)
METHODS = (BASELINE_GPU, *WEIGHT_ONLY, *ACT_QUANT, *CEILINGS)  # what the acceptance needs measured


@dataclass(frozen=True)
class Bars:
    big_mib: float = 16.0  # int4 weight size from which the big-layer bars hold
    small_mib: float = 4.0
    big_pct: float = 85.0
    small_pct: float = 70.0
    read_ceiling_share: float = 0.92  # of a no-math read ceiling given in % of the copy bandwidth
    big_read_pct: float = 90.0  # of the read ceiling measured in the same run
    small_read_pct: float = 80.0
    m16_ratio: float = 1.25
    gemm_m: tuple[int, int] = (256, 16384)
    gemm_min: float = 0.95
    gemm_median: float = 1.05
    a8_min_m: int = 2048
    a8_min_kn: int = 4096
    a8_min: float = 1.7


@dataclass
class Line:
    """One acceptance line: its verdict and the cases behind it."""

    name: str
    bar: str
    failures: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    checked: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.failures:
            return "FAIL"
        if self.missing or not self.checked:
            return "INCOMPLETE"
        return "PASS"


def int4_mib(k: int, n: int) -> float:
    """Size of the int4 codes of a K x N layer in MiB (the size class of the decode bars)."""
    return k * n / 2 / MIB


class Cases:
    """The results of a run indexed by (K, N, M, method)."""

    def __init__(self, data: dict):
        self.by = {(r["K"], r["N"], r["M"], r["method"]): r for r in data["results"] if r.get("kind", "matmul")
                   == "matmul"}
        self.shapes = sorted({(k, n) for k, n, _, _ in self.by})
        self.ms = sorted({m for _, _, m, _ in self.by})
        self.peers = sorted({r["method"] for r in data["results"]
                             if r.get("family") == "peer" and r["method"] != data.get("baseline")})

    def get(self, k: int, n: int, m: int, method: str) -> dict | None:
        return self.by.get((k, n, m, method))

    def has_ceiling(self) -> bool:
        """True when the run measured the read ceiling of its decode methods (mixgemm.bench.read_ceiling)."""
        return any(meth == ceiling_name(w) for _, _, _, meth in self.by for w in WEIGHT_ONLY)

    def read_pct(self, line: Line, k: int, n: int, method: str) -> float | None:
        """100 x the read ceiling's time / the method's time at M = 1 (both ok cases), else None (noted)."""
        t = self.value(line, "time", k, n, 1, method, "time_us")
        ceiling = self.value(line, "time", k, n, 1, ceiling_name(method), "time_us")
        return None if not (t and ceiling) else 100.0 * ceiling / t

    def value(self, line: Line, what: str, k: int, n: int, m: int, method: str, key: str) -> float | None:
        """r[key] of an ok case; a missing case is noted as missing, a wrong/error one as a failure."""
        r = self.get(k, n, m, method)
        where = f"{k}x{n} M={m} {method}"
        if r is None:
            line.missing.append(f"{where}: not measured")
            return None
        if r["status"] != "ok":
            if r["status"] in ("wrong", "error"):
                line.failures.append(f"{where}: {r['status'].upper()} ({(r.get('note') or '')[:80]})")
            else:
                line.missing.append(f"{where}: {r['status']} ({(r.get('note') or '')[:80]})")
            return None
        v = r.get(key)
        if v is None:
            line.missing.append(f"{where}: no {what}")
        return v


def _read_bar(mib: float, bars: Bars) -> float | None:
    if mib >= bars.big_mib:
        return bars.big_read_pct
    return bars.small_read_pct if mib >= bars.small_mib else None


def _decode_bar(mib: float, bars: Bars, read_ceiling_pct: float | None) -> float | None:
    if mib >= bars.big_mib:
        if read_ceiling_pct:
            return min(bars.big_pct, bars.read_ceiling_share * read_ceiling_pct)
        return bars.big_pct
    if mib >= bars.small_mib:
        return bars.small_pct
    return None


def evaluate(data: dict, bars: Bars | None = None, read_ceiling_pct: float | None = None) -> list[Line]:
    """The four acceptance lines of the run in data (see the module docstring)."""
    bars = bars or Bars()
    cs = Cases(data)
    big = (f"min({bars.big_pct:.0f}%, {bars.read_ceiling_share:.0%} of the read ceiling {read_ceiling_pct:.0f}%)"
           if read_ceiling_pct else f"{bars.big_pct:.0f}%")
    decode = Line("M = 1, % of floor", f"W4A16 g128 sym / zero-point and W8A16 per-channel: >= {big} of the floor "
                  f"when the int4 weight is >= {bars.big_mib:.0f} MiB, >= {bars.small_pct:.0f}% for "
                  f"{bars.small_mib:.0f}-{bars.big_mib:.0f} MiB")
    m16 = Line("M = 16 / M = 1 time", f"<= {bars.m16_ratio}x on layers >= {bars.big_mib:.0f} MiB (same methods)")
    lo, hi = bars.gemm_m
    gemm = Line(f"M {lo}-{hi} vs fp16 cuBLAS", f"W4A16 / W8A16 >= {bars.gemm_min}x on every shape and M, median "
                f"over the shapes >= {bars.gemm_median}x per M")
    a8 = Line("W8A8 / W4A8 per-token vs fp16 cuBLAS", f">= {bars.a8_min}x for M >= {bars.a8_min_m} on shapes with "
              f"N and K >= {bars.a8_min_kn} (activation quantization included)")
    measured = cs.has_ceiling()
    if measured:
        decode.name = "M = 1, % of the read ceiling"
        decode.bar = (f"W4A16 g128 sym / zero-point and W8A16 per-channel: >= {bars.big_read_pct:.0f}% of the read "
                      f"ceiling measured in this run when the int4 weight is >= {bars.big_mib:.0f} MiB, >= "
                      f"{bars.small_read_pct:.0f}% for {bars.small_mib:.0f}-{bars.big_mib:.0f} MiB")
    for k, n in cs.shapes:
        mib = int4_mib(k, n)
        bar = _read_bar(mib, bars) if measured else _decode_bar(mib, bars, read_ceiling_pct)
        for meth in WEIGHT_ONLY:
            if bar is not None:
                pct = (cs.read_pct(decode, k, n, meth) if measured
                       else cs.value(decode, "% of floor", k, n, 1, meth, "pct_floor"))
                if pct is not None:
                    decode.checked += 1
                    if pct < bar:
                        decode.failures.append(f"{k}x{n} ({mib:.1f} MiB) {meth}: {pct:.1f}% < {bar:.1f}%")
            if mib >= bars.big_mib:
                t1 = cs.value(m16, "time", k, n, 1, meth, "time_us")
                t16 = cs.value(m16, "time", k, n, 16, meth, "time_us")
                if t1 and t16:
                    m16.checked += 1
                    if t16 / t1 > bars.m16_ratio:
                        m16.failures.append(f"{k}x{n} {meth}: {t16 / t1:.2f}x")
            for m in (m for m in cs.ms if lo <= m <= hi):
                s = cs.value(gemm, "speedup", k, n, m, meth, "speedup")
                if s is not None:
                    gemm.checked += 1
                    if s < bars.gemm_min:
                        gemm.failures.append(f"{k}x{n} M={m} {meth}: {s:.2f}x")
        if k >= bars.a8_min_kn and n >= bars.a8_min_kn:
            for meth in ACT_QUANT:
                for m in (m for m in cs.ms if m >= bars.a8_min_m):
                    s = cs.value(a8, "speedup", k, n, m, meth, "speedup")
                    if s is not None:
                        a8.checked += 1
                        if s < bars.a8_min:
                            a8.failures.append(f"{k}x{n} M={m} {meth}: {s:.2f}x")
    for meth, m, med in gemm_medians(cs, bars):
        if med < bars.gemm_median:
            gemm.failures.append(f"{meth} M={m}: median over the shapes {med:.2f}x < {bars.gemm_median}x")
    for shape in data.get("meta", {}).get("not_run", []):  # shapes a --time-budget run left out
        k, n = (int(v) for v in shape.split("x"))
        why = f"{shape}: not run (--time-budget; rerun with --merge)"
        for ln, applies in ((decode, _decode_bar(int4_mib(k, n), bars, read_ceiling_pct) is not None),
                            (m16, int4_mib(k, n) >= bars.big_mib), (gemm, True),
                            (a8, k >= bars.a8_min_kn and n >= bars.a8_min_kn)):
            if applies:
                ln.missing.append(why)
    if not any(m >= bars.a8_min_m for m in cs.ms):
        a8.missing.append(f"no M >= {bars.a8_min_m} in this run")
    if not any(lo <= m <= hi for m in cs.ms):
        gemm.missing.append(f"no M in [{lo}, {hi}] in this run")
    return [decode, m16, gemm, a8]


def gemm_medians(cs: Cases, bars: Bars) -> list[tuple[str, int, float]]:
    """(method, M, median over the shapes of the speedup over fp16 cuBLAS) for the weight-only methods."""
    lo, hi = bars.gemm_m
    out = []
    for meth in WEIGHT_ONLY:
        for m in (m for m in cs.ms if lo <= m <= hi):
            vals = [r["speedup"] for k, n in cs.shapes if (r := cs.get(k, n, m, meth)) and r["status"] == "ok"
                    and r.get("speedup") is not None]
            if vals:
                out.append((meth, m, statistics.median(vals)))
    return out


def decode_medians(cs: Cases, bars: Bars) -> list[tuple[str, float | None, float | None, float | None]]:
    """(method, median % of floor at M = 1 on layers >= bars.big_mib, the same on bars.small_mib..big_mib layers, median
    M = 16 / M = 1 time on the big layers) for the weight-only methods (None where nothing was measured)."""
    out = []
    for meth in WEIGHT_ONLY:
        big, small, m16 = [], [], []
        for k, n in cs.shapes:
            r1 = cs.get(k, n, 1, meth)
            one = _ok(r1, "pct_floor")
            if one is None:
                continue
            mib = int4_mib(k, n)
            if mib >= bars.big_mib:
                big.append(one)
                t1, t16 = _ok(r1, "time_us"), _ok(cs.get(k, n, 16, meth), "time_us")
                if t1 and t16:
                    m16.append(t16 / t1)
            elif mib >= bars.small_mib:
                small.append(one)
        if big or small:
            out.append((meth, *(statistics.median(v) if v else None for v in (big, small, m16))))
    return out


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _ok(r: dict | None, key: str) -> float | None:
    return r.get(key) if r is not None and r["status"] == "ok" else None


def _read_pct(cs: Cases, k: int, n: int, meth: str) -> float | None:
    """100 x the read ceiling's time / meth's time at M = 1, None unless both were measured."""
    t, ceiling = _ok(cs.get(k, n, 1, meth), "time_us"), _ok(cs.get(k, n, 1, ceiling_name(meth)), "time_us")
    return 100.0 * ceiling / t if t and ceiling else None


def _worst(cs: Cases, k: int, n: int, meth: str, ms: list[int]) -> float | None:
    """The smallest speedup over fp16 cuBLAS of meth on K x N over the M in ms (None when none was measured)."""
    vals = [v for m in ms if (v := _ok(cs.get(k, n, m, meth), "speedup")) is not None]
    return min(vals) if vals else None


def shape_table(data: dict, bars: Bars | None = None) -> str:
    """Markdown: per shape its layers, int4 size, M = 1 % of floor, M16/M1, the worst ratio to fp16 cuBLAS over
    M in the GEMM range (weight-only) and over M >= 2048 (int8 activations), and the best W4 peer's time over
    mixgemm W4's at M = 1."""
    bars = bars or Bars()
    cs = Cases(data)
    lo, hi = bars.gemm_m
    labels = data.get("layers") or {}
    read = cs.has_ceiling()
    head = ["K x N", "layers", "int4 MiB", "M=1 % floor W4 sym / zp / W8",
            *(["M=1 % of read ceiling W4 sym / zp / W8"] if read else []), "M16/M1 W4 sym / zp / W8",
            f"min x cuBLAS M {lo}-{hi} W4 sym / zp / W8", f"min x cuBLAS M>={bars.a8_min_m} W8A8 / W4A8",
            "M=1 W4 sym speedup over the best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, n in cs.shapes:
        pct = [_ok(cs.get(k, n, 1, m), "pct_floor") for m in WEIGHT_ONLY]
        ratio = []
        for m in WEIGHT_ONLY:
            t1, t16 = _ok(cs.get(k, n, 1, m), "time_us"), _ok(cs.get(k, n, 16, m), "time_us")
            ratio.append(t16 / t1 if t1 and t16 else None)

        gm = [_worst(cs, k, n, m, [x for x in cs.ms if lo <= x <= hi]) for m in WEIGHT_ONLY]
        a8 = [_worst(cs, k, n, m, [x for x in cs.ms if x >= bars.a8_min_m]) for m in ACT_QUANT]
        peers = [t for p in cs.peers if (t := _ok(cs.get(k, n, 1, p), "time_us"))]
        mine = _ok(cs.get(k, n, 1, W4_SYM), "time_us")
        peer = min(peers) / mine if peers and mine else None
        lines.append("| " + " | ".join([
            f"{k}x{n}", labels.get(f"{k}x{n}", ""), f"{int4_mib(k, n):.1f}",
            " / ".join(_fmt(v, ".0f", "%") for v in pct),
            *([" / ".join(_fmt(_read_pct(cs, k, n, m), ".0f", "%") for m in WEIGHT_ONLY)] if read else []),
            " / ".join(_fmt(v, ".2f") for v in ratio),
            " / ".join(_fmt(v, ".2f") for v in gm), " / ".join(_fmt(v, ".2f") for v in a8), _fmt(peer, ".2f"),
        ]) + " |")
    return "\n".join(lines)


def _capped(items: list[str], max_items: int, what: str = "") -> list[str]:
    """Markdown bullets of the first max_items items and how many more there are."""
    out = [f"- {what}{x}" for x in items[:max_items]]
    if len(items) > max_items:
        out.append(f"- {what}... and {len(items) - max_items} more")
    return out


def lines_markdown(lines_: list[Line], max_items: int = 12, details: bool = True) -> list[str]:
    """The verdict table of acceptance lines and, with details, each line's notes, failures and missing cases."""
    out = ["| line | bar | verdict | cases | failures | missing |", "|---|---|---|---|---|---|"]
    for ln in lines_:
        out.append(f"| {ln.name} | {ln.bar} | **{ln.verdict}** | {ln.checked} | {len(ln.failures)} | "
                   f"{len(ln.missing)} |")
    for ln in lines_ if details else ():
        if ln.failures or ln.missing or ln.notes:
            out += ["", f"**{ln.name}** ({ln.verdict})"]
            for what, items in (("", ln.notes), ("fail: ", ln.failures), ("missing: ", ln.missing)):
                out += _capped(items, max_items, what)
    return out


def to_markdown(data: dict, bars: Bars | None = None, read_ceiling_pct: float | None = None,
                max_items: int = 12, title: bool = True, details: bool = True) -> str:
    """The acceptance view: the verdict of each line (with its failures), the medians and the per-shape table;
    details False: the verdicts and the medians only (the README's block)."""
    bars = bars or Bars()
    lines_ = evaluate(data, bars, read_ceiling_pct)
    drawn = data["meta"].get("random")
    draw = (f"Fresh draw, seed {drawn['seed']} (`mixgemm bench --random {drawn['count']} --seed {drawn['seed']}`): "
            if drawn else "")
    cs = Cases(data)
    out = ([f"## Acceptance view: {data['meta'].get('gpu')}", ""] if title else []) + [
           f"{draw}{len(cs.shapes)} shapes; M measured: {', '.join(map(str, cs.ms))}. Sizes in MiB of int4 codes; "
           "% of floor = floor / time (docs/benchmarking.md); ratios = fp16 cuBLAS time / time, same run.",
           ""] + lines_markdown(lines_, max_items, details)
    dec = decode_medians(Cases(data), bars)
    if dec:
        out += ["", f"Decode, medians over the shapes (% of floor at M = 1; M = 16 time over M = 1 on >= "
                    f"{bars.big_mib:.0f} MiB):", "",
                f"| method | M = 1, >= {bars.big_mib:.0f} MiB | M = 1, {bars.small_mib:.0f}-{bars.big_mib:.0f} MiB | "
                "M = 16 / M = 1 |", "|---|---|---|---|"]
        for meth, big, small, m16 in dec:
            out.append(f"| {meth} | {_fmt(big, '.0f', '%')} | {_fmt(small, '.0f', '%')} | {_fmt(m16, '.2f', 'x')} |")
    meds = gemm_medians(Cases(data), bars)
    if meds:
        ms = sorted({m for _, m, _ in meds})
        table = {(meth, m): v for meth, m, v in meds}
        out += ["", "Median over the shapes of the ratio to fp16 cuBLAS:", "",
                "| method | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
        for meth in WEIGHT_ONLY:
            if any((meth, m) in table for m in ms):
                out.append(f"| {meth} | " + " | ".join(_fmt(table.get((meth, m)), ".2f") for m in ms) + " |")
    if details:
        out += ["", shape_table(data, bars)]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- conv layers
@dataclass(frozen=True)
class ConvBars:
    """issue 109's conv acceptance: W4 / W8 against cuDNN in the run's dtype."""

    per_layer: float = 0.95  # every layer and batch
    median: float = 1.1  # the median over the layers at median_batch
    median_batch: int = 1
    race_slack: float = 1.05  # dispatched slower than the forced dequantize + cuDNN route by more: listed


def _conv_cases(data: dict) -> dict[tuple[str, int, str], dict]:
    return {(r["layer"], r["batch"], r["method"]): r for r in data["results"] if r.get("kind") == "conv"}


def conv_evaluate(data: dict, bars: ConvBars | None = None) -> list[Line]:
    """The conv acceptance lines of a --conv-models run: every (layer, batch) of W4 zp and W8 >= bars.per_layer x the
    float conv (a refused, wrong or failed case fails it), and the median over the layers at bars.median_batch >=
    bars.median x for each of the two."""
    from mixgemm.bench.conv import W4_ZP, W8

    bars = bars or ConvBars()
    cases = _conv_cases(data)
    layers = list(dict.fromkeys(lay for lay, _, _ in cases))
    batches = sorted({b for _, b, _ in cases})
    base = data.get("baseline") or "the float conv"
    every = Line("every layer and batch", f"{W4_ZP} and {W8} >= {bars.per_layer}x {base}")
    median = Line(f"median at batch {bars.median_batch}", f"each >= {bars.median}x {base} (median over the layers)")
    worst: list[tuple[float, str]] = []
    for meth in (W4_ZP, W8):
        for lay in layers:
            for b in batches:
                r = cases.get((lay, b, meth))
                where = f"{lay} B={b} {meth}"
                if r is None:
                    every.missing.append(f"{where}: not measured")
                elif r["status"] == "refused":
                    every.failures.append(f"{where}: refused: {r.get('note') or ''}")
                elif r["status"] != "ok" or r.get("speedup") is None:
                    what = (r.get("note") or "no baseline time")[:80]
                    (every.failures if r["status"] in ("wrong", "error") else every.missing).append(
                        f"{where}: {r['status']} ({what})")
                else:
                    every.checked += 1
                    if r["speedup"] < bars.per_layer:
                        worst.append((r["speedup"], f"{where}: {r['speedup']:.2f}x"))
        vals = [r["speedup"] for lay in layers if (r := cases.get((lay, bars.median_batch, meth)))
                and r["status"] == "ok" and r.get("speedup") is not None]
        if not vals:
            median.missing.append(f"{meth}: nothing measured at batch {bars.median_batch}")
            continue
        median.checked += 1
        med = statistics.median(vals)
        median.notes.append(f"{meth}: {med:.2f}x over {len(vals)} layers")
        if med < bars.median:
            median.failures.append(f"{meth}: median {med:.2f}x < {bars.median}x")
    every.failures += [text for _, text in sorted(worst)]  # slowest first
    for lay in data.get("meta", {}).get("not_run", []):
        every.missing.append(f"{lay}: not run (--time-budget; rerun with --merge)")
    return [every, median]


def conv_summary(data: dict, bars: ConvBars | None = None) -> list[tuple]:
    """(method, batch, layers measured, min, median speedup over the float conv, layers under bars.per_layer,
    refused) per mixgemm method and batch."""
    bars = bars or ConvBars()
    cases = _conv_cases(data)
    out = []
    meths = list(dict.fromkeys(m for _, _, m in cases if m not in (data.get("baseline"),)))
    for meth in meths:
        for b in sorted({b for _, b, _ in cases}):
            rs = [r for (_, bb, m), r in cases.items() if m == meth and bb == b]
            ok = [r["speedup"] for r in rs if r["status"] == "ok" and r.get("speedup") is not None]
            out.append((meth, b, len(ok), min(ok) if ok else None, statistics.median(ok) if ok else None,
                        sum(v < bars.per_layer for v in ok), sum(r["status"] == "refused" for r in rs)))
    return out


def race_misses(data: dict, bars: ConvBars | None = None) -> list[str]:
    """Cases where mixgemm's dispatch (which races the dequantize + cuDNN route on a layer's first call) was slower
    than that route forced by more than bars.race_slack."""
    from mixgemm.bench.conv import W4_ZP, W4_ZP_DEQUANT, W8, W8_DEQUANT

    bars = bars or ConvBars()
    cases = _conv_cases(data)
    out = []
    for (lay, b, meth), r in cases.items():
        forced = {W4_ZP: W4_ZP_DEQUANT, W8: W8_DEQUANT}.get(meth)
        f = cases.get((lay, b, forced)) if forced else None
        t, tf = _ok(r, "time_us"), _ok(f, "time_us")
        if t and tf and t > bars.race_slack * tf:
            out.append((t / tf, f"{lay} B={b} {meth}: {t:.1f} us, forced dequant+cuDNN {tf:.1f} us ({t / tf:.2f}x)"))
    return [text for _, text in sorted(out, reverse=True)]


def conv_layer_table(data: dict) -> str:
    """Markdown: per conv layer and batch its users, the float conv's time and each mixgemm method's time (ratio), and
    the weight floors of W4 and W8 (the time to read the weights each stores, alone, at the copy bandwidth)."""
    from mixgemm.bench.conv import W4_ZP, W4_ZP_DEQUANT, W8, W8_DEQUANT

    cases = _conv_cases(data)
    base = data.get("baseline")
    meths = (W4_ZP, W8, W4_ZP_DEQUANT, W8_DEQUANT)
    users = data.get("layers") or {}
    head = ["layer", "used by", "B", f"{base} us", *meths, "weight floor W4 / W8 us"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lay, b in dict.fromkeys((lay, b) for lay, b, _ in cases):
        cells = []
        for meth in meths:
            r = cases.get((lay, b, meth))
            if r is None:
                cells.append("")
            elif r["status"] == "ok":
                cells.append(f"{r['time_us']:.1f}" + (f" ({r['speedup']:.2f}x)" if r.get("speedup") else ""))
            else:
                cells.append(r["status"])
        floors = [_ok(cases.get((lay, b, m)), "weight_floor_us") for m in (W4_ZP, W8)]
        lines.append("| " + " | ".join([lay, users.get(lay, ""), str(b),
                                         _fmt(_ok(cases.get((lay, b, base)), "time_us"), ".1f"), *cells,
                                         " / ".join(_fmt(v, ".2f") for v in floors)]) + " |")
    return "\n".join(lines)


def conv_to_markdown(data: dict, bars: ConvBars | None = None, max_items: int = 25) -> str:
    """The conv acceptance view: the verdicts, the failures (slowest first), a summary per method and batch and the
    cases where the dispatch lost to the dequantize + cuDNN route it races."""
    bars = bars or ConvBars()
    lines_ = conv_evaluate(data, bars)
    cases = _conv_cases(data)
    n_layers = len({lay for lay, _, _ in cases})
    out = [f"## Conv acceptance view: {data['meta'].get('gpu')}", "",
           f"{n_layers} conv layers; batches {', '.join(map(str, sorted({b for _, b, _ in cases})))}; ratios = "
           f"{data.get('baseline')} time / time, same run (CUDA graph over layer copies, docs/benchmarking.md).",
           "", *lines_markdown(lines_, max_items)]
    summary = conv_summary(data, bars)
    if summary:
        out += ["", f"Per method and batch (ratio to {data.get('baseline')}):", "",
                f"| method | batch | layers | min | median | under {bars.per_layer}x | refused |",
                "|---|---|---|---|---|---|---|"]
        for meth, b, n, lo, med, under, refused in summary:
            out.append(f"| {meth} | {b} | {n} | {_fmt(lo, '.2f')} | {_fmt(med, '.2f')} | {under} | {refused} |")
    misses = race_misses(data, bars)
    out += ["", f"Dispatch slower than the forced dequantize + cuDNN route by more than {bars.race_slack}x: "
                f"{len(misses)} case(s)"]
    out += _capped(misses, max_items)
    out += ["", conv_layer_table(data)]
    return "\n".join(out) + "\n"
