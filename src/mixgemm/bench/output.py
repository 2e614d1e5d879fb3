"""Writing a sweep: JSON (everything), CSV (one row per case), Markdown (the tables) and the PNG plot.

JSON layout: {"meta": {gpu, clocks, driver, torch, triton, cuda, ...}, "ceilings": {copy_bw [B/s],
fp16_flops [flop/s], int8_ops [op/s]}, "baseline": method name, "results": [case, ...],
"unavailable": {method: why}, "methods": [...]}. A case: K, N, M, method, status, note, rel_err, tol,
weight_bytes, bytes, flops, floor_us (max of floor_mem_us, floor_compute_us), w4_floor_us (the protocol
table's W4 g128 floor), copies, graph_us, eager_us, time_us (graph if any, else eager), pct_floor, speedup
(baseline time / time, graph), speedup_eager.
"""

from __future__ import annotations

import csv
import json
import math
import os

CSV_FIELDS = ["K", "N", "M", "method", "family", "status", "graph_us", "eager_us", "time_us", "floor_us",
              "floor_mem_us", "floor_compute_us", "bound", "pct_floor", "speedup", "speedup_eager",
              "w4_floor_us", "rel_err", "tol", "weight_bytes", "bytes", "flops", "copies", "note"]


def write_json(data: dict, path: str) -> None:
    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, list):
            return [clean(v) for v in o]
        return o

    with open(path, "w") as f:
        json.dump(clean(data), f, indent=1)
        f.write("\n")


def write_csv(data: dict, path: str) -> None:
    meta = data["meta"]
    with open(path, "w", newline="") as f:
        f.write(f"# gpu={meta.get('gpu')} driver={meta.get('driver')} torch={meta.get('torch')} "
                f"triton={meta.get('triton')} cuda={meta.get('cuda')} clocks={meta.get('clocks')}\n")
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in data["results"]:
            w.writerow({k: r.get(k) for k in CSV_FIELDS})


def on_gpu(data: dict) -> bool:
    """Floors and % of floor are columns only for GPU runs: a CPU run is eager wall clock with warm caches, so
    the HBM-style floor means nothing there and the tables leave those columns out."""
    return data["meta"].get("device", "cuda") != "cpu"


def _fmt_us(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] == "ok":
        return _fmt_us(r["time_us"])
    return {"wrong": "WRONG", "error": "error", "n/a": "n/a", "refused": "refused"}.get(r["status"], r["status"])


def _case(r: dict) -> tuple:
    """(K, N, M, layer): conv layers of one implicit-GEMM size differ by their layer name."""
    return (r["K"], r["N"], r["M"], r.get("layer") or "")


def method_order(data: dict) -> list[str]:
    seen = []
    for r in data["results"]:
        if r["method"] not in seen:
            seen.append(r["method"])
    base = data.get("baseline")
    # mixgemm first, then the baseline, then the other peers, in registry order
    fam = {r["method"]: r.get("family") for r in data["results"]}
    mix = [m for m in seen if fam.get(m) == "mixgemm"]
    rest = [m for m in seen if m not in mix and m != base]
    return mix + ([base] if base in seen else []) + rest


def ceilings_line(data: dict) -> str:
    c = data["ceilings"]
    parts = [f"copy {c['copy_bw'] / 1e12:.2f} TB/s"]
    if c.get("fp16_flops"):
        parts.append(f"fp16 matmul {c['fp16_flops'] / 1e12:.0f} TFLOP/s")
    if c.get("fp32_flops"):
        parts.append(f"fp32 matmul {c['fp32_flops'] / 1e9:.1f} GFLOP/s")
    if c.get("int8_ops"):
        parts.append(f"int8 _int_mm {c['int8_ops'] / 1e12:.0f} TOP/s")
    return "Ceilings: " + "; ".join(parts)


def header_line(data: dict) -> str:
    m = data["meta"]
    clocks = m.get("clocks_after") or m.get("clocks") or {}
    clk = f", SM clock {clocks.get('clocks.sm')}/{clocks.get('clocks.max.sm')} MHz" if clocks else ""
    drawn = m.get("random")
    draw = f"; fresh draw of {drawn['count']} layer shapes, seed {drawn['seed']}" if drawn else ""
    return (f"{m.get('gpu')} (driver {m.get('driver', '-')}{clk}), torch {m.get('torch')}, "
            f"triton {m.get('triton')}, CUDA {m.get('cuda', '-')}, {m.get('date_utc')}{draw}")


def ratio_text(ratio: float) -> str:
    """A speedup as printed: two decimals, and two significant digits below 0.1 (a slower method never reads
    0.00x)."""
    return f"{ratio:.2f}" if ratio >= 0.095 else f"{ratio:.2g}"


def pivot_markdown(data: dict, speedups: bool = True) -> str:
    """The protocol-style table: one row per (K x N, M), one column per method; times in microseconds
    (CUDA graph over rotating copies; eager on the CPU), '(1.23x)' = speedup over the baseline."""
    meths = method_order(data)
    # a case: (K, N, M, layer); conv layers of one implicit-GEMM size differ by their layer
    by = {(*_case(r), r["method"]): r for r in data["results"]}
    cases = []
    for r in data["results"]:
        key = _case(r)
        if key not in cases:
            cases.append(key)
    cases.sort()
    w4 = {}
    for r in data["results"]:
        if r.get("w4_floor_us") is not None:
            w4[_case(r)] = r["w4_floor_us"]
    gpu = on_gpu(data)
    names = data.get("layers") or {}  # a --model run: the model layers of each K x N; --conv-models: a layer's users
    conv = any(r.get("layer") for r in data["results"])
    head = ["K x N"] + ([("used by" if conv else "layer")] if names else []) + ["M"] + (["W4 floor"] if gpu else []) + \
        meths
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    batch = {(r["K"], r["N"], r["M"], r["layer"]): r["batch"] for r in data["results"] if r.get("layer")}
    for k, n, m, lay in cases:
        kn, mm = (f"{lay} ({k}x{n})", f"B={batch[(k, n, m, lay)]} ({m})") if lay else (f"{k}x{n}", str(m))
        row = [kn] + ([names.get(lay or f"{k}x{n}", "")] if names else []) + [mm] + \
            ([_fmt_us(w4.get((k, n, m, lay)))] if gpu else [])
        for meth in meths:
            r = by.get((k, n, m, lay, meth))
            cell = _cell(r)
            ok = r is not None and r["status"] == "ok" and r.get("speedup")
            if speedups and ok and meth != data.get("baseline"):
                cell += f" ({ratio_text(r['speedup'])}x)"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def long_markdown(data: dict) -> str:
    """One row per case: graph and eager time, floor, % of floor, speedup, error."""
    gpu = on_gpu(data)
    head = ["K x N", "M", "method", "graph us", "eager us"] + (["floor us", "% floor"] if gpu else []) + \
        ["speedup", "rel err", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {m: i for i, m in enumerate(method_order(data))}
    rows = sorted(data["results"], key=lambda r: (*_case(r), order.get(r["method"], 99)))
    for r in rows:
        ok = r["status"] == "ok"
        floor = [_fmt_us(r.get("floor_us")), f"{r['pct_floor']:.0f}%" if ok and r.get("pct_floor") else ""]
        lines.append("| " + " | ".join([
            f"{r['layer']} ({r['K']}x{r['N']})" if r.get("layer") else f"{r['K']}x{r['N']}",
            f"B={r['batch']} ({r['M']})" if r.get("layer") else str(r["M"]), r["method"],
            _fmt_us(r.get("graph_us")) if ok else r["status"].upper(),
            _fmt_us(r.get("eager_us")) if ok else "",
            *(floor if gpu else []),
            ratio_text(r["speedup"]) if ok and r.get("speedup") else "",
            f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "",
            (r.get("note") or "").replace("|", "/"),
        ]) + " |")
    return "\n".join(lines)


def to_markdown(data: dict) -> str:
    if on_gpu(data):
        how = ("Times in microseconds per call: CUDA graph over rotating layer copies > 3x L2, median (docs/"
               f"benchmarking.md). `(x)` = speedup over {data.get('baseline')}. W4 floor = int4 weights + fp16 g128 "
               "scales and zeros + activations + output at copy bandwidth.")
    else:
        how = ("CPU run: eager wall clock in microseconds per call, warm caches, mixgemm's CPU fallback beside "
               f"{data.get('baseline')} (`(x)` = speedup over it). No floors: they describe the GPU kernels.")
    out = [f"# mixgemm bench: {data['meta'].get('gpu')}", "", header_line(data), "", ceilings_line(data), "",
           how, "", pivot_markdown(data), "", "## Every case", "", long_markdown(data)]
    from mixgemm.bench.reference_numbers import compare_markdown

    cmp = compare_markdown(data)
    if cmp:
        out += ["", "## Against the protocol's published peer numbers", "", cmp]
    if data.get("accept") is not None and on_gpu(data):
        from mixgemm.bench import accept

        out += ["", accept.to_markdown(data, read_ceiling_pct=data["accept"].get("read_ceiling_pct")).rstrip()]
    if data.get("accept_conv") is not None and on_gpu(data):
        from mixgemm.bench import accept

        out += ["", accept.conv_to_markdown(data).rstrip()]
    if data["meta"].get("not_run"):
        out += ["", "## Not run (time budget)", "", ", ".join(data["meta"]["not_run"])]
    if data.get("unavailable"):
        out += ["", "## Not run here", ""] + [f"- {k}: {v}" for k, v in data["unavailable"].items()]
    return "\n".join(out) + "\n"


def terminal_table(data: dict) -> str:
    """Plain-text table for the terminal: one row per case and method."""
    gpu = on_gpu(data)
    floor_head = f"{'floor us':>10}{'%floor':>8}" if gpu else ""
    mw = min(40, max([22] + [len(r["method"]) + 1 for r in data["results"]]))
    head = (f"{'K x N':>12} {'M':>6}  {'method':<{mw}}{'graph us':>10}{'eager us':>10}{floor_head}"
            f"{'speedup':>8}  status")
    lines = [header_line(data), ceilings_line(data), head, "-" * len(head)]
    order = {m: i for i, m in enumerate(method_order(data))}
    rows = sorted(data["results"], key=lambda r: (*_case(r), order.get(r["method"], 99)))
    names = data.get("layers") or {}
    last = None
    for r in rows:
        key = _case(r)
        if last is not None and key != last:
            lines.append("")
        if r.get("layer") and key != last:
            lines.append(f"{r['layer']} B={r['batch']}")
        kn = f"{r['K']}x{r['N']}"
        if names.get(kn) and (last is None or key[:2] != last[:2]):
            lines.append(f"{kn}: {names[kn]}")
        last = key
        ok = r["status"] == "ok"
        status = "ok" if ok else f"{r['status'].upper()}: {r.get('note', '')}"
        if ok and r.get("note", "").startswith("graph capture failed"):
            status = "ok (" + r["note"][:60] + ")"
        floor = (f"{_fmt_us(r.get('floor_us')):>10}"
                 f"{(format(r['pct_floor'], '.0f') + '%') if ok and r.get('pct_floor') else '':>8}") if gpu else ""
        lines.append(
            f"{r['K']:>5}x{r['N']:<6} {r['M']:>6}  {r['method'][:mw - 1]:<{mw}}"
            f"{_fmt_us(r.get('graph_us')) if ok else '':>10}{_fmt_us(r.get('eager_us')) if ok else '':>10}"
            f"{floor}{ratio_text(r['speedup']) if ok and r.get('speedup') else '':>8}  {status}")
    if data.get("unavailable"):
        lines.append("")
        lines += [f"not run: {k}: {v}" for k, v in data["unavailable"].items()]
    return "\n".join(lines)


def write_plot(data: dict, path: str) -> str | None:
    """One PNG: speedup over the baseline vs M for each shape (with the W4 floor's speedup drawn), and a
    roofline (achieved TFLOP/s vs arithmetic intensity under the measured ceilings). Returns None when
    matplotlib is missing (and says so), else the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    res = [r for r in data["results"] if r["status"] == "ok" and r.get("time_us")]
    shapes = sorted({(r["K"], r["N"]) for r in data["results"]})
    meths = method_order(data)
    cols = min(3, len(shapes) + 1)
    rows = -(-(len(shapes) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    color = {m: cmap(i % 10) for i, m in enumerate(meths)}
    base = data.get("baseline")
    for ax, (k, n) in zip(axes.flat, shapes, strict=False):
        for meth in meths:
            pts = sorted((r["M"], r["speedup"]) for r in res
                         if r["method"] == meth and (r["K"], r["N"]) == (k, n) and r.get("speedup"))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=meth, color=color[meth])
        # the W4 floor as an attainable bound: max(W4 bytes / copy BW, flops / fp16 matmul rate)
        rate = data["ceilings"].get("fp16_flops") or data["ceilings"].get("fp32_flops")
        fl = sorted((r["M"], r["time_us"] / max(r["w4_floor_us"], r["flops"] / rate * 1e6 if rate else 0.0))
                    for r in res if r["method"] == base and (r["K"], r["N"]) == (k, n) and r.get("w4_floor_us"))
        if fl:
            ax.plot(*zip(*fl, strict=True), "k--", lw=1, label="W4 floor: max(bytes/BW, flops/fp16 peak)")
        ax.axhline(1.0, color="grey", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        layer = next((r["layer"] for r in data["results"] if (r["K"], r["N"]) == (k, n) and r.get("layer")), None)
        ax.set_title(f"{layer} (GEMM {k} x {n})" if layer else f"K x N = {k} x {n}", fontsize=10)
        ax.set_xlabel("M (GEMM rows = batch x Ho x Wo)" if layer else "M (tokens)")
        ax.set_ylabel(f"speedup over {base}")
        ax.grid(True, which="both", alpha=0.3)
    ax = axes.flat[len(shapes)]
    c = data["ceilings"]
    bw = c["copy_bw"]
    peak = c.get("fp16_flops") or c.get("fp32_flops") or 1.0
    ai = [2.0**i for i in range(-2, 14)]
    ax.plot(ai, [min(bw * a, peak) / 1e12 for a in ai], "k-", lw=1, label="roof (copy BW, matmul)")
    if c.get("int8_ops"):
        ax.plot(ai, [min(bw * a, c["int8_ops"]) / 1e12 for a in ai], "k:", lw=1, label="roof (int8)")
    for meth in meths:
        pts = [(r["flops"] / r["bytes"], r["flops"] / (r["time_us"] * 1e-6) / 1e12) for r in res
               if r["method"] == meth and r.get("bytes")]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=10, color=color[meth], label=meth)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("roofline")
    ax.grid(True, which="both", alpha=0.3)
    for extra in list(axes.flat)[len(shapes) + 1:]:
        extra.axis("off")
    handles, labels = [], []
    for a in axes.flat:
        for h, lab in zip(*a.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
    fig.suptitle(f"mixgemm bench: {data['meta'].get('gpu')}", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(data: dict, prefix: str, plot: bool, csv_too: bool = False) -> list[str]:
    """Write PREFIX.json and PREFIX.md (PREFIX.png with plot=True, PREFIX.csv with csv_too=True); returns the
    paths."""
    d = os.path.dirname(prefix)
    if d:
        os.makedirs(d, exist_ok=True)
    paths = [prefix + ".json", prefix + ".md"]
    write_json(data, paths[0])
    with open(paths[1], "w") as f:
        f.write(to_markdown(data))
    if csv_too:
        write_csv(data, prefix + ".csv")
        paths.append(prefix + ".csv")
    if plot:
        p = write_plot(data, prefix + ".png")
        if p:
            paths.append(p)
    return paths
