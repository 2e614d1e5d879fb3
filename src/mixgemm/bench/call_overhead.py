"""`mixgemm bench --call-overhead`: the host time of one QuantLinear call beside nn.Linear's, as an eager decode loop
and a torch.compile'd graph without CUDA graphs pay it per layer.

Why it is measured apart from the kernels: a decode step of a 7-8B model makes a few hundred layer calls whose GPU
time is a few microseconds each, so outside CUDA graphs tokens/s follow the host time per call. For each scheme
(W4A16 g128, W8A16, W8A8, W4A8 with per-token activation scales) and M, back-to-back calls of the same layer are
timed without a sync (the rate a loop issues them at; the GPU keeps up, see ``gpu_us``), the quantized layer and an
nn.Linear of the same shape taking turns within each round (21 rounds); times: the best round of each; ratio: the
median over rounds of QuantLinear / nn.Linear in the same round, the bar is RATIO_BAR. ``gpu_us``: the same call
replayed from a CUDA graph (what back-to-back calls cannot go below).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

RATIO_BAR = 1.3
DEFAULT_SHAPE = (2048, 2048)  # K, N
DEFAULT_MS = (1, 16, 512)
SCHEMES = ("W4A16", "W8A16", "W8A8", "W4A8-token")


def scheme_config(name: str):
    """The quantize_ config of a scheme name."""
    import mixgemm

    return {"W4A16": mixgemm.W4A16(group_size=128), "W8A16": mixgemm.W8A16(), "W8A8": mixgemm.W8A8(),
            "W4A8-token": mixgemm.W4A8(act_block="token")}[name]


def paired_rounds(fns: list[Callable[[], object]], calls: int = 500, rounds: int = 21,
                  sync: Callable[[], None] = lambda: None) -> list[list[float]]:
    """Host microseconds per call of each fn in each round ([fn][round]), back-to-back calls without a sync; the fns
    take turns within each round (host speed drifts over seconds: a ratio of two of them is taken round by round)."""
    for fn in fns:
        for _ in range(max(20, calls // 50)):
            fn()
    sync()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[i].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return times


def paired_rate_us(fns: list[Callable[[], object]], calls: int = 500, rounds: int = 21,
                   sync: Callable[[], None] = lambda: None) -> list[float]:
    """paired_rounds' best round of each fn."""
    return [min(t) for t in paired_rounds(fns, calls, rounds, sync)]


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of a's time over b's in the same round: robust to the host's drift between rounds and
    to a lucky round of either (the devices' hosts moved nn.Linear's own time by 2x between rows of one run)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def time_case(q, lin, x: torch.Tensor, compiled: bool) -> dict:
    """Host and GPU time of QuantLinear q and nn.Linear lin on x, eager and (compiled) under torch.compile without
    CUDA graphs: best round of each, and the median of the per-round ratios."""
    from mixgemm.bench.protocol import graph_time_us

    sync = torch.cuda.synchronize
    ql, li = paired_rounds([lambda: q(x), lambda: lin(x)], sync=sync)
    r = dict(eager_us=min(ql), eager_linear_us=min(li), eager_ratio=paired_ratio(ql, li),
             gpu_us=graph_time_us([lambda: q(x)] * 20), gpu_linear_us=graph_time_us([lambda: lin(x)] * 20))
    if compiled:
        # a fresh dynamo cache per case: the same module compiled for every M would reach the recompile limit and then
        # run eager, unreported
        torch._dynamo.reset()
        cq, cl = torch.compile(q, dynamic=False), torch.compile(lin, dynamic=False)
        cqt, clt = paired_rounds([lambda: cq(x), lambda: cl(x)], calls=300, sync=sync)
        r.update(compiled_us=min(cqt), compiled_linear_us=min(clt), compiled_ratio=paired_ratio(cqt, clt))
    return r


def measure(shape: tuple[int, int] = DEFAULT_SHAPE, ms=DEFAULT_MS, schemes=SCHEMES, compiled: bool = True,
            log: Callable[[str], None] = print) -> list[dict]:
    """One row per (scheme, M): the kernel, eager / compiled host us of QuantLinear and nn.Linear and their ratios,
    GPU us. CUDA only."""
    import mixgemm
    from mixgemm.ops.custom_ops import weight_from_tensors
    from mixgemm.ops.dispatch import plans_of

    k, n = shape
    rows = []
    with torch.no_grad():
        lin = torch.nn.Linear(k, n, bias=False).half().cuda()
        for name in schemes:
            model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).half().cuda()
            mixgemm.quantize_(model, scheme_config(name))
            q = model[0]
            c = q.config
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                q(x)
                qw = weight_from_tensors(q.qweight, q.scales, q.zeros, q.offsets, c.bits, c.group_size, c.mode, n, k)
                kernel = next((v.kernel for key, v in plans_of(qw).items() if key[1] == m), None)
                r = dict(scheme=name, K=k, N=n, M=m, kernel=kernel, **time_case(q, lin, x, compiled))
                rows.append(r)
                text = f"{name:10s} M={m:<4d} {kernel or '-':15s} eager {r['eager_ratio']:.2f}x nn.Linear"
                if compiled:
                    text += f", compiled {r['compiled_ratio']:.2f}x"
                log(text)
    return rows


def to_markdown(data: dict) -> str:
    """The result file's Markdown: one row per (scheme, M), ratios marked where they miss RATIO_BAR."""
    info = data["machine"]
    rows = data["rows"]
    k, n = rows[0]["K"], rows[0]["N"]
    lines = [f"# Host time per call: QuantLinear against nn.Linear, {info.get('gpu')}, torch {info.get('torch')}",
             "",
             f"`python -m mixgemm bench --call-overhead` ({info.get('date_utc')}): a {k}x{n} fp16 layer, back-to-back "
             "calls without a sync, the quantized layer and nn.Linear taking turns within each of 21 rounds; us: the "
             "best round of each; ratio: the median over rounds of the two in the same round "
             f"(mixgemm.bench.call_overhead). Bar: {RATIO_BAR}x nn.Linear; `*` marks a miss. GPU us: the same "
             "call replayed from a CUDA graph.",
             "",
             "| scheme | M | kernel | eager us | nn.Linear us | eager ratio | compiled us | compiled nn.Linear us | "
             "compiled ratio | GPU us (nn.Linear) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(v):
        return "" if v is None else f"{v:.2f}x" + (" *" if v > RATIO_BAR else "")

    def us(v):
        return "" if v is None else f"{v:.1f}"

    for r in rows:
        lines.append(f"| {r['scheme']} | {r['M']} | {r['kernel'] or '-'} | {us(r['eager_us'])} | "
                     f"{us(r['eager_linear_us'])} | {ratio(r['eager_ratio'])} | {us(r.get('compiled_us'))} | "
                     f"{us(r.get('compiled_linear_us'))} | {ratio(r.get('compiled_ratio'))} | "
                     f"{r['gpu_us']:.1f} ({r['gpu_linear_us']:.1f}) |")
    return "\n".join(lines) + "\n"


def run(out_dir: str, shape: tuple[int, int] = DEFAULT_SHAPE, ms=DEFAULT_MS, compiled: bool = True,
        suite: str = "call-overhead") -> str:
    """Measure and write OUT/<gpu>/<suite>.{json,md}; returns the Markdown."""
    import json
    import os

    from mixgemm.bench import protocol

    if not torch.cuda.is_available():
        raise RuntimeError("--call-overhead times CUDA launches: it needs a CUDA GPU")
    data = dict(machine=protocol.machine_info("cuda"), rows=measure(shape, ms, compiled=compiled))
    prefix = os.path.join(out_dir, protocol.gpu_dir(data["machine"]["gpu"]), suite)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump(data, f, indent=1)
    md = to_markdown(data)
    with open(prefix + ".md", "w") as f:
        f.write(md)
    return md
