"""`mixgemm bench --conv-networks`: whole networks quantized with ``mixgemm.quantize_`` against the float network.

For each network of mixgemm.bench.networks (random weights): the float network in the benchmark dtype (fp16 on a GPU,
channels_last input), and two quantized copies, W4 (``W4A16(group_size=32)``: QuantConv2d.from_conv keeps groups of 32
where Ci/groups allows and goes per-channel otherwise) and W8 (``W8A16()``, per-channel). Each network reports:

* agreement: the quantized network's output against its dequantized float twin (mixgemm.integrations.hf
  .dequantized_copy: every QuantConv2d / QuantLinear a float layer holding its dequantized weight) run in float32 (TF32
  off; float64 on the CPU), beside the float twin's own error in the benchmark dtype (what the dtype alone costs);
  the quantized network passes within max(2 x that, 1e-3);
* weight bytes: the quantized layers' packed weights (codes, scales, zeros) against the same layers in fp16, the
  kernel layouts held after the eager calls, and the whole model's parameters and buffers;
* routes: which kernel each QuantConv2d call takes at each batch (mixgemm.explain_conv; QuantLinear calls:
  mixgemm.explain), counted per kernel;
* throughput in images/s (a UNet's: latents per denoising step) at each batch, eager, the eager calls captured in one
  CUDA graph (GPU only) and compiled (``torch.compile(mode="reduce-overhead")``: inductor and CUDA graphs), against the
  float network in the same mode.

Acceptance (issue 109): compiled, batch 32 >= 1.0x the fp16 network's images/s; batch 1 >= 1.2x on ResNet-50 and the
UNet; W4 weights >= 3.5x smaller than fp16. Results go to OUT/<gpu>/conv-networks.{json,md}, rewritten after every
measurement, so a run cut short leaves its table. A network's cases after its time budget are listed as cut; they run
in the acceptance's order (case_order).
"""

from __future__ import annotations

import copy
import gc
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from mixgemm.bench import output, protocol
from mixgemm.bench.networks import SMOKE_NETWORKS, NetworkCase

FLOAT = "float"  # the variant name of the float network
SUITE = "conv-networks"
W4_GROUP = 32
AGREE_FLOOR = 1e-3  # the quantized network passes within max(AGREE_FACTOR x the float twin's own error, this)
AGREE_FACTOR = 2.0
# the acceptance bars: (mode, batch) -> {network: x the float network's images/s}; "*" every network
BARS = {("compiled", 32): {"*": 1.0}, ("compiled", 1): {"resnet50": 1.2, "unet2d_condition": 1.2}}
W4_BYTES_BAR = 3.5


@dataclass
class Plan:
    """What a run measures and where it writes."""

    networks: list[NetworkCase]
    batches: list[int]
    bits: list[int]
    device: torch.device
    dtype: torch.dtype
    compile_mode: str | None  # torch.compile mode of the compiled cases; None: eager only
    smoke: bool
    w4_mode: str = "sym"
    network_budget_s: float | None = None
    time_budget_s: float | None = None
    min_time_s: float = 0.3  # each timing: calls for at least this long, three times, the median
    meta: dict = field(default_factory=dict)
    suite: str = SUITE  # the file name inside OUT/<gpu>/

    def variants(self) -> list[str]:
        return [FLOAT] + [f"W{b}" for b in self.bits]


def quant_config(bits: int, w4_mode: str = "sym"):
    from mixgemm.quantize_api import W4A16, W8A16

    return W4A16(group_size=W4_GROUP, mode=w4_mode) if bits == 4 else W8A16()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (inf where got is not finite)."""
    g, w = got.double(), want.double()
    if not torch.isfinite(g).all():
        return float("inf")
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def first_tensor(y) -> torch.Tensor:
    """A network's output tensor (a UNet returns a tuple with return_dict=False)."""
    return y[0] if isinstance(y, (tuple, list)) else y


def to_device(net: nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    return net.to(device=device, dtype=dtype, memory_format=torch.channels_last)


# ------------------------------------------------------------------------------------------- what the network is
def quantize_copy(net: nn.Module, bits: int, w4_mode: str) -> tuple[nn.Module, dict]:
    """A quantized deep copy of ``net`` and what quantize_ did: format, layers replaced and skipped, the
    group sizes the convs got."""
    from mixgemm.nn.conv import QuantConv2d
    from mixgemm.nn.linear import QuantLinear
    from mixgemm.quantize_api import quantize_

    q = copy.deepcopy(net)
    cfg = quant_config(bits, w4_mode)
    with warnings.catch_warnings():  # (from_conv's "group_size does not divide Ci/groups": counted in "groups")
        warnings.simplefilter("ignore")
        rep = quantize_(q, cfg, progress=False)
    groups: dict[str, int] = {}
    for m in q.modules():
        if isinstance(m, (QuantConv2d, QuantLinear)):
            g = m.qconfig.group_size if isinstance(m, QuantConv2d) else m.group_size
            key = f"{'conv' if isinstance(m, QuantConv2d) else 'linear'} " + ("per-channel" if g == -1 else f"g{g}")
            groups[key] = groups.get(key, 0) + 1
    return q, {"format": cfg.name, "replaced": len(rep.replaced), "skipped": dict(rep.skipped),
               "groups": dict(sorted(groups.items()))}


def layer_bytes(net: nn.Module) -> dict:
    """{"fp16": the quantized layers' weights in fp16, "packed": their packed format (codes, scales, zeros /
    offsets), "held": what their weights hold now with the kernel layouts built so far}."""
    from mixgemm.nn.conv import QuantConv2d
    from mixgemm.nn.linear import QuantLinear
    from mixgemm.ops.explain import resident_bytes

    weights = 0
    for m in net.modules():
        if isinstance(m, QuantConv2d):
            weights += m.out_channels * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, QuantLinear):
            weights += m.in_features * m.out_features
    held = resident_bytes(net)
    return {"fp16": 2 * weights, "packed": held["plain"], "held": held["total"]}


def model_bytes(net: nn.Module) -> int:
    """The network's parameters and buffers, each quantized layer's weight at its packed size (a compacted layer's
    buffers are placeholders: its codes live in the kernel layout)."""
    from mixgemm.nn.conv import QuantConv2d
    from mixgemm.nn.linear import QuantLinear
    from mixgemm.ops.explain import resident_bytes

    packed = {id(getattr(m, n)) for m in net.modules() if isinstance(m, (QuantConv2d, QuantLinear))
              for n in ("qweight", "scales", "zeros", "offsets") if isinstance(getattr(m, n, None), torch.Tensor)}
    others = {id(t): t for t in [*net.parameters(), *net.buffers()] if id(t) not in packed}
    return sum(t.numel() * t.element_size() for t in others.values()) + resident_bytes(net)["plain"]


@torch.no_grad()
def routes(net: nn.Module, args: tuple, kwargs: dict) -> dict:
    """{"conv": {kernel: calls}, "linear": {kernel: calls}} of one call of the quantized ``net`` (untimed):
    mixgemm.explain_conv / mixgemm.explain of each QuantConv2d / QuantLinear call."""
    from mixgemm.nn.conv import QuantConv2d
    from mixgemm.nn.linear import QuantLinear
    from mixgemm.ops.explain import explain, explain_conv

    counts: dict[str, dict[str, int]] = {"conv": {}, "linear": {}}

    def hook(mod, inp):
        x = inp[0]
        if isinstance(mod, QuantConv2d):
            kind, c = "conv", explain_conv(x, mod.quantized_weight(), mod.stride, mod.padding, mod.dilation, mod.groups)
        else:
            kind, c = "linear", explain(x, mod.quantized_weight(), mod.act_mode)
        counts[kind][c.kernel] = counts[kind].get(c.kernel, 0) + 1

    handles = [m.register_forward_pre_hook(hook) for m in net.modules() if isinstance(m, (QuantConv2d, QuantLinear))]
    try:
        net(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in counts.items() if v}


@torch.no_grad()
def agreement(qnet: nn.Module, plan: Plan, case: NetworkCase, hw: int) -> dict:
    """The quantized network (benchmark dtype) and its float twin in the benchmark dtype, each against the twin in
    float32 with TF32 off (float64 on the CPU), on one batch-1 input."""
    from mixgemm.integrations.hf import dequantized_copy

    ref_dtype = torch.float32 if plan.device.type == "cuda" else torch.float64
    twin = dequantized_copy(qnet, ref_dtype).to(device=plan.device, dtype=ref_dtype)
    args, kwargs = case.inputs(twin, 1, hw, torch.float32, plan.device)
    cast = lambda t, dt: t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        want = first_tensor(twin(*[cast(a, ref_dtype) for a in args], **{k: cast(v, ref_dtype)
                                                                            for k, v in kwargs.items()}))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    bench_args = [cast(a, plan.dtype) for a in args], {k: cast(v, plan.dtype) for k, v in kwargs.items()}
    got = first_tensor(qnet(*bench_args[0], **bench_args[1]))
    twin = to_device(twin, plan.dtype, plan.device)
    floor = first_tensor(twin(*bench_args[0], **bench_args[1]))
    err, twin_err = rel_err(got, want), rel_err(floor, want)
    # (a float twin that overflows the dtype gives no yardstick: the floor alone then)
    bar = max(AGREE_FACTOR * twin_err, AGREE_FLOOR) if twin_err < float("inf") else AGREE_FLOOR
    return {"rel_err": err, "twin_rel_err": twin_err, "bar": bar, "ok": err <= bar}


# ------------------------------------------------------------------------------------------- timing
def time_ms(fn, device: torch.device, min_time_s: float) -> float:
    """Milliseconds per call of ``fn`` (already warm): calls for at least min_time_s, three times, the median."""
    cuda = device.type == "cuda"

    def clock(n: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3 / n

    one = clock(1)
    n = max(1, min(500, int(min_time_s * 1e3 / max(one, 1e-3))))
    return statistics.median(clock(n) for _ in range(3))


def warm(fn, device: torch.device, calls: int) -> float:
    """Seconds the first ``calls`` calls take (compiles, kernel layouts, races, CUDA-graph recording)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------- the run
class Budget:
    """The network's and the run's deadlines: a case starts only before both."""

    def __init__(self, plan: Plan, t_run: float):
        self.run_end = t_run + plan.time_budget_s if plan.time_budget_s else None
        self.net_s = plan.network_budget_s
        self.net_end = None

    def start_network(self) -> None:
        self.net_end = time.time() + self.net_s if self.net_s else None

    def why_stop(self) -> str | None:
        now = time.time()
        if self.run_end is not None and now > self.run_end:
            return "cut: the run's --time-budget was spent"
        if self.net_end is not None and now > self.net_end:
            return f"cut: the network's budget ({self.net_s:.0f} s, --network-budget) was spent"
        return None


def run_network(case: NetworkCase, plan: Plan, budget: Budget, record: dict, save) -> None:
    """Measure one network into ``record`` (the JSON's entry), calling save() after each measurement."""
    dev, dt = plan.device, plan.dtype
    hw = case.smoke_hw if plan.smoke else case.hw
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(dev):
        net = to_device(case.make(plan.smoke), dt, dev)  # quantized as users do: the model as it runs
    record.update(source=case.source, input_hw=hw, build_s=round(time.time() - t0, 1))
    nets: dict[str, nn.Module] = {FLOAT: net}
    record["quantize"], record["agreement"], record["bytes"], record["routes"] = {}, {}, {}, {}
    for bits in plan.bits:
        name = f"W{bits}"
        t1 = time.time()
        q, info = quantize_copy(net, bits, plan.w4_mode)
        info["seconds"] = round(time.time() - t1, 1)
        record["quantize"][name] = info
        record["agreement"][name] = agreement(q, plan, case, hw)
        nets[name] = q
        save()
    record["bytes"][FLOAT] = {"model": model_bytes(nets[FLOAT])}
    rows = record["throughput"] = []
    inputs = {b: case.inputs(nets[FLOAT], b, hw, dt, dev) for b in plan.batches}
    for i, (mode, b) in enumerate(case_order(plan)):
        for v, n in nets.items():
            if v != FLOAT and f"b{b}" not in record["routes"].get(v, {}) and not budget.why_stop():
                record["routes"].setdefault(v, {})[f"b{b}"] = _routes_or_error(n, inputs[b])
            rows.append(timed_case(n, v, mode, b, inputs[b], plan, budget))
            save()
            if mode == "compiled":
                torch._dynamo.reset()
        if i == 0:  # the layouts the first calls built
            for v, n in nets.items():
                record["bytes"][v] = {**(layer_bytes(n) if v != FLOAT else {}), "model": model_bytes(n)}
            save()
    record["wall_s"] = round(time.time() - t0, 1)


def case_order(plan: Plan) -> list[tuple[str, int]]:
    """(mode, batch) in the order a run measures them, the acceptance's first where a budget may cut the rest: eager
    at the smallest batch (its first calls build the kernel layouts), on a GPU (not a smoke run) the eager network
    captured in one CUDA graph (cheap, no compile), compiled from the largest batch down, then eager at the other
    batches."""
    first, down = min(plan.batches), sorted(plan.batches, reverse=True)
    on_gpu = plan.device.type == "cuda" and not plan.smoke
    graphs = [("graph", b) for b in [first, *[b for b in down if b != first]]] if on_gpu else []
    compiled = [("compiled", b) for b in down] if plan.compile_mode else []
    return [("eager", first), *graphs, *compiled, *[("eager", b) for b in plan.batches if b != first]]


def _routes_or_error(net: nn.Module, inp: tuple) -> dict:
    try:
        return routes(net, *inp)
    except Exception as e:  # (the timed rows say whether the network itself runs)
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


@torch.no_grad()
def timed_case(net: nn.Module, variant: str, mode: str, batch: int, inp: tuple, plan: Plan, budget: Budget) -> dict:
    """One row of the throughput table: ``net`` eager or compiled (plan.compile_mode) at this batch; a failure or a
    spent budget is the row's status, not the end of the run."""
    row = {"variant": variant, "mode": mode, "batch": batch, "ms": None, "images_per_s": None, "status": "ok"}
    why = budget.why_stop()
    if why:
        row["status"] = why
        return row
    args, kwargs = inp
    try:
        if mode == "eager":
            fn = lambda: net(*args, **kwargs)  # noqa: E731
            row["warm_s"] = round(warm(fn, plan.device, 2), 2)
        elif mode == "graph":  # the eager calls captured in one CUDA graph: no host launch path, no compile
            t0 = time.perf_counter()
            fn = protocol.capture_graph([lambda: net(*args, **kwargs)]).replay
            row["warm_s"] = round(time.perf_counter() - t0, 2)
        else:
            fn = _compiled(net, args, kwargs, plan, row)
        row["ms"] = time_ms(fn, plan.device, plan.min_time_s)
        row["images_per_s"] = batch * 1e3 / row["ms"]
    except Exception as e:
        row["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"
    _progress(row)
    return row


def _compiled(net: nn.Module, args: tuple, kwargs: dict, plan: Plan, row: dict):
    """The compiled call of ``net``, warm (compiled, CUDA graphs recorded); row gets the warm-up seconds, the graphs
    traced (more than one: graph breaks), the graphs inductor left out of CUDA graphs and the error against eager."""
    from torch._dynamo.utils import counters

    want = first_tensor(net(*args, **kwargs)).clone()
    compiled = torch.compile(net, mode=plan.compile_mode, dynamic=False)
    fn = lambda: compiled(*args, **kwargs)  # noqa: E731
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    row["compile_s"] = round(warm(fn, plan.device, 3), 1)
    row["graphs"] = counters["stats"]["unique_graphs"] - graphs
    row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
    row["vs_eager_rel_err"] = rel_err(first_tensor(fn()), want)
    return fn


def _progress(row: dict) -> None:
    what = f"{row['images_per_s']:.1f} images/s" if row["images_per_s"] else row["status"]
    extra = f" (warm-up {row.get('compile_s', row.get('warm_s'))} s)"
    print(f"  {row['mode']:<8} {row['variant']:<5} batch {row['batch']:<3} {what}{extra}", file=sys.stderr, flush=True)


def run(plan: Plan, out: str) -> tuple[dict, str]:
    """Every network of the plan; returns the data and the path prefix written (OUT/<gpu>/conv-networks)."""
    name = torch.cuda.get_device_name(plan.device) if plan.device.type == "cuda" else "cpu"
    prefix = os.path.join(out, protocol.gpu_dir(name), plan.suite)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    t_run = time.time()
    data = {"meta": {**protocol.machine_info(plan.device.type), **plan.meta,
                     "plan": {"networks": [c.name for c in plan.networks], "batches": plan.batches,
                              "variants": plan.variants(), "dtype": str(plan.dtype).replace("torch.", ""),
                              "compile_mode": plan.compile_mode, "smoke": plan.smoke, "w4_mode": plan.w4_mode,
                              "network_budget_s": plan.network_budget_s, "time_budget_s": plan.time_budget_s}},
            "networks": {}}

    def save() -> None:
        data["meta"]["wall_s"] = round(time.time() - t_run, 1)
        output.write_json(data, prefix + ".json")
        with open(prefix + ".md", "w") as f:
            f.write(to_markdown(data))

    budget = Budget(plan, t_run)
    if plan.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # the float network as users run it: cuDNN's fastest algorithm per layer
    for case in plan.networks:
        print(f"mixgemm bench --conv-networks: {case.name}", file=sys.stderr, flush=True)
        record = data["networks"][case.name] = {}
        budget.start_network()
        why = budget.why_stop()
        if why:
            record["status"] = why
        else:
            try:
                run_network(case, plan, budget, record, save)
            except Exception as e:  # (building or quantizing the network failed: the next network still runs)
                record["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"
        save()
        gc.collect()
        if plan.device.type == "cuda":
            torch.cuda.empty_cache()
    return data, prefix


# ------------------------------------------------------------------------------------------- the table
def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def bar_of(network: str, mode: str, batch: int) -> float | None:
    bars = BARS.get((mode, batch), {})
    return bars.get(network, bars.get("*"))


def _speed_cell(row: dict | None, base: dict | None) -> str:
    if row is None:
        return "-"
    if not row["images_per_s"]:
        return row["status"][:60]
    cell = f"{row['images_per_s']:.1f}"
    if base and base.get("images_per_s"):
        cell += f" ({row['images_per_s'] / base['images_per_s']:.2f}x)"
    return cell


def throughput_markdown(data: dict) -> list[str]:
    variants = data["meta"]["plan"]["variants"]
    base_name = f"{data['meta']['plan']['dtype']} network"
    lines = ["## Throughput", "",
             f"Images/s (a UNet: latents per step); in brackets x the {base_name}'s in the same mode. Bar: issue 109's "
             "acceptance (x the float network), met when every quantized variant reaches it.", "",
             "| network | batch | mode | " + " | ".join(base_name if v == FLOAT else v for v in variants)
             + " | bar | met |",
             "|---|---|---|" + "---|" * (len(variants) + 2)]
    for net, rec in data["networks"].items():
        rows = rec.get("throughput", [])
        modes = ("eager", "graph", "compiled")
        keys = sorted(dict.fromkeys((r["mode"], r["batch"]) for r in rows), key=lambda k: (k[1], modes.index(k[0])))
        for mode, batch in keys:
            by = {r["variant"]: r for r in rows if (r["mode"], r["batch"]) == (mode, batch)}
            base = by.get(FLOAT)
            bar = bar_of(net, mode, batch)
            met = "-"
            if bar is not None:
                ratios = [by[v]["images_per_s"] / base["images_per_s"] for v in variants[1:]
                          if v in by and by[v]["images_per_s"] and base and base["images_per_s"]]
                met = ("yes" if min(ratios) >= bar else "no") if len(ratios) == len(variants) - 1 else "not measured"
            cells = [_speed_cell(by.get(v), None if v == FLOAT else base) for v in variants]
            lines.append(f"| {net} | {batch} | {mode} | " + " | ".join(cells)
                         + f" | {'-' if bar is None else f'{bar:.1f}x'} | {met} |")
    return lines


def bytes_markdown(data: dict) -> list[str]:
    lines = ["## Weights", "",
             f"The quantized layers' weights: fp16 against the packed format (codes, scales, zeros), MiB; bar: W4 "
             f">= {W4_BYTES_BAR}x smaller. Held: with the kernel layouts built by the first calls. Model: every "
             "parameter and buffer, the quantized weights packed.", "",
             "| network | format | fp16 | packed | smaller | held | model (float network) |",
             "|---|---|---|---|---|---|---|"]
    for net, rec in data["networks"].items():
        by = rec.get("bytes", {})
        base_model = by.get(FLOAT, {}).get("model")
        for v, b in by.items():
            if v == FLOAT or "fp16" not in b:
                continue
            ratio = b["fp16"] / b["packed"] if b["packed"] else 0.0
            met = f" ({'meets' if ratio >= W4_BYTES_BAR else 'misses'} {W4_BYTES_BAR}x)" if v == "W4" else ""
            lines.append(f"| {net} | {rec['quantize'][v]['format']} | {_mib(b['fp16'])} | {_mib(b['packed'])} | "
                         f"{ratio:.2f}x{met} | {_mib(b['held'])} | {_mib(b['model'])} ({_mib(base_model)}) |")
    return lines


def agreement_markdown(data: dict) -> list[str]:
    lines = ["## Agreement with the dequantized float twin", "",
             f"||y - y_twin|| / ||y_twin||, the twin in float32 (TF32 off; float64 on the CPU), batch 1. Float twin: "
             f"the same twin in the benchmark dtype (what the dtype alone costs); bar max({AGREE_FACTOR:g} x that, "
             f"{AGREE_FLOOR:g}).", "",
             "| network | format | quantized | float twin | bar | ok | layers replaced | skipped | groups |",
             "|---|---|---|---|---|---|---|---|---|"]
    for net, rec in data["networks"].items():
        for v, a in rec.get("agreement", {}).items():
            q = rec["quantize"][v]
            groups = ", ".join(f"{k} {n}" for k, n in q["groups"].items())
            lines.append(f"| {net} | {q['format']} | {a['rel_err']:.2e} | {a['twin_rel_err']:.2e} | {a['bar']:.2e} | "
                         f"{'yes' if a['ok'] else 'NO'} | {q['replaced']} | {len(q['skipped'])} | {groups} |")
    return lines


def routes_markdown(data: dict) -> list[str]:
    lines = ["## Routes", "", "Calls per kernel in one eager call of the quantized network (mixgemm.explain_conv, "
             "mixgemm.explain).", "", "| network | format | batch | conv | linear |", "|---|---|---|---|---|"]
    for net, rec in data["networks"].items():
        for v, by_batch in rec.get("routes", {}).items():
            for b, r in by_batch.items():
                if "error" in r:
                    lines.append(f"| {net} | {v} | {b[1:]} | {r['error'][:120]} | |")
                    continue
                conv = ", ".join(f"{k} {n}" for k, n in r.get("conv", {}).items()) or "-"
                lin = ", ".join(f"{k} {n}" for k, n in r.get("linear", {}).items()) or "-"
                lines.append(f"| {net} | {v} | {b[1:]} | {conv} | {lin} |")
    return lines


def compiled_markdown(data: dict) -> list[str]:
    rows = [(net, r) for net, rec in data["networks"].items() for r in rec.get("throughput", [])
            if r["mode"] == "compiled" and r["status"] == "ok"]
    if not rows:
        return []
    lines = ["## Compiled", "", "Warm-up (compile, CUDA-graph recording), graphs traced (more than one: graph breaks), "
             "graphs left out of CUDA graphs, and the compiled output against the eager one.", "",
             "| network | variant | batch | warm-up s | graphs | cudagraph skips | vs eager |",
             "|---|---|---|---|---|---|---|"]
    for net, r in rows:
        lines.append(f"| {net} | {r['variant']} | {r['batch']} | {r['compile_s']} | {r['graphs']} | "
                     f"{r['cudagraph_skips']} | {r['vs_eager_rel_err']:.2e} |")
    return lines + [""]


def to_markdown(data: dict) -> str:
    m = data["meta"]
    p = m["plan"]
    head = [f"# Whole networks: mixgemm.quantize_ against the {p['dtype']} network ({m.get('gpu', 'cpu')})", "",
            f"torch {m.get('torch')}, triton {m.get('triton')}; input channels_last; compiled: "
            + (f"torch.compile(mode={p['compile_mode']!r}, dynamic=False)" if p["compile_mode"] else "not run")
            + ("; SMOKE run (tiny inputs and configs: no acceptance)" if p["smoke"] else "")
            + f"; wall {m.get('wall_s')} s.", ""]
    stopped = [f"- {n}: {r['status']}" for n, r in data["networks"].items() if r.get("status")]
    body = throughput_markdown(data) + [""] + compiled_markdown(data) + bytes_markdown(data) + [""] \
        + agreement_markdown(data) + [""] + routes_markdown(data)
    return "\n".join(head + (["Networks not measured:", *stopped, ""] if stopped else []) + body) + "\n"


def smoke_networks(cases: list[NetworkCase], named: bool) -> list[NetworkCase]:
    """A smoke run's networks: the named ones, else SMOKE_NETWORKS."""
    return cases if named else [c for c in cases if c.name in SMOKE_NETWORKS]


# ------------------------------------------------------------------------------------------- the command line
def add_arguments(p) -> None:
    """--conv-networks' options of `mixgemm bench`."""
    from mixgemm.bench.networks import NETWORKS

    p.add_argument("--conv-networks", nargs="*", default=None, metavar="NAME",
                   help="whole networks quantized with quantize_ (W4 g32 / W8 per-channel) against the float network "
                        "in --dtype: images/s eager and compiled at -m batches (default 1 32), agreement with the "
                        "dequantized float twin, weight bytes and each conv's kernel; names: " + ", ".join(NETWORKS)
                        + " (default all); writes OUT/<gpu>/conv-networks.{json,md}. Needs torchvision / diffusers. "
                        "Without a CUDA GPU (or with --smoke): the smoke run")
    p.add_argument("--smoke", action="store_true",
                   help="--conv-networks: tiny inputs (and a tiny UNet), batch 1, eager only, float32 on the CPU; "
                        f"networks {', '.join(SMOKE_NETWORKS)} unless named")
    p.add_argument("--compile-mode", default="reduce-overhead",
                   help="--conv-networks: torch.compile mode of the compiled cases ('none': eager only)")
    p.add_argument("--network-budget", type=float, default=None, metavar="S",
                   help="--conv-networks: start no new case of a network after S seconds on it (listed as cut)")
    p.add_argument("--w4-mode", default="sym", choices=["sym", "zero_point"],
                   help="--conv-networks: the W4 format's mode (W8 is sym)")


def main(args, batches: list[int] | None, bits: list[int], dtype: torch.dtype) -> int:
    """`mixgemm bench --conv-networks`: the run and its table (``dtype``: the float network's on a GPU); 1 when a
    network disagrees with its twin or a case failed, 2 on bad options."""
    from mixgemm.bench.networks import resolve

    cuda = torch.cuda.is_available() and args.device != "cpu"
    try:
        cases = resolve(args.conv_networks)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA GPU is available")
        if args.network_budget is not None and args.network_budget <= 0:
            raise ValueError(f"--network-budget: {args.network_budget} must be positive")
    except ValueError as e:
        print(f"mixgemm bench: error: {e}", file=sys.stderr)
        return 2
    smoke = args.smoke or not cuda
    if smoke:
        cases = smoke_networks(cases, bool(args.conv_networks))
        print("mixgemm bench --conv-networks: smoke run (" + ("--smoke" if cuda else "no CUDA GPU") + "): "
              f"{', '.join(c.name for c in cases)} at tiny sizes, eager only, no acceptance", file=sys.stderr)
    plan = Plan(networks=cases, batches=batches or ([1] if smoke else [1, 32]), bits=bits,
                device=torch.device("cuda" if cuda else "cpu"),
                dtype=dtype if cuda else torch.float32,
                compile_mode=None if smoke or args.compile_mode == "none" else args.compile_mode, smoke=smoke,
                w4_mode=args.w4_mode, network_budget_s=args.network_budget, time_budget_s=args.time_budget,
                min_time_s=0.02 if smoke else 0.3, meta={"argv": sys.argv[1:]}, suite=args.suite or SUITE)
    data, prefix = run(plan, args.out)
    print(to_markdown(data))
    print(f"wrote {prefix}.json, {prefix}.md in {data['meta']['wall_s']} s")
    bad = [f"{n} {v}" for n, r in data["networks"].items() for v, a in r.get("agreement", {}).items() if not a["ok"]]
    failed = [f"{n} {row['variant']} {row['mode']} b{row['batch']}" for n, r in data["networks"].items()
              for row in r.get("throughput", []) if row["status"].startswith("error")]
    failed += [n for n, r in data["networks"].items() if r.get("status", "").startswith("error")]
    if bad or failed:
        print("mixgemm bench --conv-networks: " + "; ".join(
            ([f"outside the twin's bar: {', '.join(bad)}"] if bad else [])
            + ([f"failed: {', '.join(failed)}"] if failed else [])), file=sys.stderr)
        return 1
    return 0
