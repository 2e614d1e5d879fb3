"""The protocol's published peer numbers (docs/benchmarking.md, NVIDIA H200, torch 2.11, triton 3.6)
and the comparison of a run's peer ratios against them (the acceptance check: same order, ratios within 15%).

Absolute times move between machines; the ratio of each peer to fp16 cuBLAS in the same run is what must
reproduce.
"""

from __future__ import annotations

PROTOCOL_GPU = "NVIDIA H200"
PROTOCOL_CEILINGS = {"copy_bw": 4.23e12, "fp16_flops": 656e12, "int8_ops": 903e12}
COLUMNS = ["W4 floor", "fp16 cuBLAS", "tinygemm W4 g128", "gemlite W4 g128", "gemlite W8", "gemlite A8W8"]
# (K, N, M): times in microseconds, in COLUMNS order
TABLE: dict[tuple[int, int, int], tuple[float, ...]] = {
    (4096, 4096, 1): (2.1, 14.3, 9.6, 8.7, 8.6, 9.2),
    (4096, 4096, 16): (2.2, 15.1, 25.0, 14.5, 10.8, 10.4),
    (4096, 4096, 256): (3.1, 18.8, 305.7, 62.6, 40.6, 16.5),
    (4096, 4096, 4096): (18.0, 193.4, 4752.3, 565.9, 499.9, 150.7),
    (4096, 14336, 1): (7.4, 36.0, 27.5, 21.3, 20.5, 20.7),
    (4096, 14336, 16): (7.5, 35.9, 72.9, 38.8, 26.0, 22.2),
    (4096, 14336, 64): (7.9, 36.7, 269.5, 50.4, 42.1, 23.2),
    (4096, 14336, 1024): (16.3, 158.3, 4092.9, 548.4, 439.4, 134.7),
    (8192, 28672, 1): (29.5, 113.9, 87.4, 70.9, 69.8, 63.0),
    (8192, 28672, 4): (29.6, 114.1, 99.8, 268.8, 84.2, 66.5),
    (8192, 28672, 16): (29.8, 118.4, 272.1, 166.8, 86.0, 67.0),
    (8192, 28672, 64): (30.6, 120.4, 1034.2, 188.5, 128.8, 72.2),
    (8192, 28672, 256): (34.0, 194.1, 4097.0, 622.4, 451.6, 144.6),
    (8192, 28672, 1024): (47.4, 729.7, 16205.9, 2141.0, 1692.0, 495.7),
    (8192, 28672, 4096): (100.9, 2924.3, 64766.5, 8823.8, 6616.9, 1990.5),
}
PEERS = COLUMNS[2:]
BASE = "fp16 cuBLAS"


def protocol_plan() -> list[tuple[tuple[int, int], list[int]]]:
    """The (K x N, [M...]) rows of the protocol table, as a sweep plan."""
    plan: dict[tuple[int, int], list[int]] = {}
    for k, n, m in TABLE:
        plan.setdefault((k, n), []).append(m)
    return list(plan.items())


def compare(data: dict, tolerance: float = 0.15) -> list[dict]:
    """For every protocol row and peer measured OK in data: the ratio peer / fp16 cuBLAS measured and
    published, and their relative deviation (measured / published - 1). within = |deviation| <= tolerance."""
    t = {(r["K"], r["N"], r["M"], r["method"]): r.get("time_us") for r in data["results"] if r["status"] == "ok"}
    out = []
    for (k, n, m), row in TABLE.items():
        base = t.get((k, n, m, BASE))
        if not base:
            continue
        pub = dict(zip(COLUMNS, row, strict=True))
        for p in PEERS:
            mine = t.get((k, n, m, p))
            if not mine:
                continue
            r_meas, r_pub = mine / base, pub[p] / pub[BASE]
            dev = r_meas / r_pub - 1
            out.append({"K": k, "N": n, "M": m, "peer": p, "ratio": r_meas, "ratio_protocol": r_pub,
                        "time_us": mine, "time_protocol_us": pub[p], "deviation": dev,
                        "within": abs(dev) <= tolerance})
    return out


def order_agreement(data: dict) -> list[dict]:
    """Per protocol row: the peers (and fp16 cuBLAS) ranked fastest first, measured vs published."""
    t = {(r["K"], r["N"], r["M"], r["method"]): r.get("time_us") for r in data["results"] if r["status"] == "ok"}
    out = []
    for (k, n, m), row in TABLE.items():
        pub = dict(zip(COLUMNS, row, strict=True))
        names = [c for c in COLUMNS[1:] if t.get((k, n, m, c))]
        if len(names) < 2:
            continue
        mine = sorted(names, key=lambda c: t[(k, n, m, c)])
        theirs = sorted(names, key=lambda c: pub[c])
        out.append({"K": k, "N": n, "M": m, "order": mine, "order_protocol": theirs, "same": mine == theirs})
    return out


def compare_markdown(data: dict, tolerance: float = 0.15) -> str:
    rows = compare(data, tolerance)
    if not rows:
        return ""
    gpu = data["meta"].get("gpu")
    lines = [f"Peer ratios (time / fp16 cuBLAS time, same run) on {gpu} vs the protocol's {PROTOCOL_GPU} "
             f"table; deviation = measured / published - 1 (within {tolerance:.0%}: ok).", "",
             "| K x N | M | peer | ratio here | ratio protocol | deviation | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['K']}x{r['N']} | {r['M']} | {r['peer']} | {r['ratio']:.3f} | {r['ratio_protocol']:.3f} "
                     f"| {r['deviation']:+.1%} | {'ok' if r['within'] else 'OFF'} |")
    n_ok = sum(r["within"] for r in rows)
    orders = order_agreement(data)
    same = sum(o["same"] for o in orders)
    lines += ["", f"{n_ok}/{len(rows)} ratios within {tolerance:.0%}; fastest-to-slowest order identical in "
              f"{same}/{len(orders)} rows."]
    for o in orders:
        if not o["same"]:
            lines.append(f"- {o['K']}x{o['N']} M={o['M']}: here {' < '.join(o['order'])}; "
                         f"protocol {' < '.join(o['order_protocol'])}")
    return "\n".join(lines)
