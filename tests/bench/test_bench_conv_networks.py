"""`mixgemm bench --conv-networks` on the CPU, without torchvision or diffusers: a small network standing in for the
real ones (a 3-channel stem, depthwise and 1x1 convs, a Linear head) through the whole run (quantize_, twin agreement,
routes, weight bytes, timing rows, the JSON and markdown written); the table's acceptance logic; the time budget; the
dequantized twin of a QuantConv2d; QuantConv2d as one op under torch.compile; torchvision's tolerant import."""

import json
import sys
import types

import pytest
import torch
from torch import nn

from mixgemm.bench import conv_networks as cn
from mixgemm.bench import networks
from mixgemm.bench.cli import main as bench_main
from mixgemm.integrations.hf import dequantized_copy
from mixgemm.nn.conv import QuantConv2d


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)  # depthwise: per-channel at W4 (Ci/groups = 1)
        self.pw = nn.Conv2d(32, 64, 1)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.pw(self.dw(self.stem(x))))
        return self.head(y.mean((2, 3)))


SMALL = networks.NetworkCase("small", "test", 8, 8, _Small, networks._image)


def _plan(**kw):
    base = dict(networks=[SMALL], batches=[1, 2], bits=[4, 8], device=torch.device("cpu"), dtype=torch.float32,
                compile_mode=None, smoke=True, min_time_s=0.0)
    return cn.Plan(**{**base, **kw})


def test_cpu_run_writes_the_tables(tmp_path):
    data, prefix = cn.run(_plan(), str(tmp_path))
    rec = data["networks"]["small"]
    assert "status" not in rec
    for v in ("W4", "W8"):
        q = rec["quantize"][v]
        assert q["replaced"] == 4 and q["skipped"] == {}
        a = rec["agreement"][v]
        assert a["ok"] and a["rel_err"] < 1e-5, a  # the CPU path computes the dequantized conv in float64
        for b in ("b1", "b2"):  # every conv call and the Linear's, each on its CPU kernel
            assert rec["routes"][v][b] == {"conv": {"cpu_reference": 3}, "linear": {"cpu_dequant": 1}}
        by = rec["bytes"][v]
        assert by["fp16"] == 2 * (32 * 3 * 9 + 32 * 9 + 64 * 32 + 64 * 10)
        assert by["packed"] < by["fp16"] / (3 if v == "W4" else 1.8)
        # the model: the same biases and norms as the float32 network, the weights packed
        assert by["model"] - by["packed"] == rec["bytes"]["float"]["model"] - 2 * by["fp16"]
    assert rec["quantize"]["W4"]["groups"] == {"conv g32": 1, "conv per-channel": 2, "linear g32": 1}
    rows = rec["throughput"]
    assert [(r["variant"], r["batch"]) for r in rows] == [(v, b) for b in (1, 2) for v in ("float", "W4", "W8")]
    assert all(r["status"] == "ok" and r["images_per_s"] > 0 and r["mode"] == "eager" for r in rows)
    assert json.loads((tmp_path / "cpu" / "conv-networks.json").read_text())["networks"]["small"]["throughput"] == rows
    md = (tmp_path / "cpu" / "conv-networks.md").read_text()
    assert prefix.endswith("conv-networks") and md == cn.to_markdown(data)
    assert "| small | W4A16 g32 sym | 0.0 |" in md and "cpu_reference 3" in md and "SMOKE run" in md


def test_compiled_case_traces_the_quantized_network_whole(monkeypatch):
    """The compiled row (torch.compile's eager backend standing in for inductor on the CPU): one graph, no graph break
    at the QuantConv2d / QuantLinear layers, the compiled output the eager one."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, mode=None, dynamic=None: real(m, backend="eager", dynamic=dynamic))
    torch._dynamo.reset()
    q, _ = cn.quantize_copy(_Small().eval(), 4, "sym")
    plan = _plan(compile_mode="reduce-overhead")
    row = cn.timed_case(q, "W4", "compiled", 2, SMALL.inputs(q, 2, 8, torch.float32, plan.device), plan,
                        cn.Budget(plan, 0.0))
    torch._dynamo.reset()
    assert row["status"] == "ok" and row["images_per_s"] > 0, row
    assert row["graphs"] == 1 and row["cudagraph_skips"] == 0 and row["vs_eager_rel_err"] < 1e-6


def _row(variant, mode, batch, ips, status="ok"):
    return {"variant": variant, "mode": mode, "batch": batch, "ms": None, "images_per_s": ips, "status": status}


def test_throughput_table_judges_every_quantized_variant_against_its_bar():
    rows = [_row("float", "compiled", 32, 100.0), _row("W4", "compiled", 32, 101.0), _row("W8", "compiled", 32, 99.0),
            _row("float", "compiled", 1, 10.0), _row("W4", "compiled", 1, 13.0), _row("W8", "compiled", 1, 12.5),
            _row("float", "eager", 1, 10.0), _row("W4", "eager", 1, None, "cut: the run's --time-budget was spent"),
            _row("W8", "eager", 1, 5.0)]
    data = {"meta": {"plan": {"variants": ["float", "W4", "W8"], "dtype": "float16"}},
            "networks": {"resnet50": {"throughput": rows}, "convnext_tiny": {"throughput": rows[3:6]}}}
    lines = cn.throughput_markdown(data)
    assert "| resnet50 | 32 | compiled | 100.0 | 101.0 (1.01x) | 99.0 (0.99x) | 1.0x | no |" in lines
    assert "| resnet50 | 1 | compiled | 10.0 | 13.0 (1.30x) | 12.5 (1.25x) | 1.2x | yes |" in lines
    assert "| resnet50 | 1 | eager | 10.0 | cut: the run's --time-budget was spent | 5.0 (0.50x) | - | - |" in lines
    assert "| convnext_tiny | 1 | compiled | 10.0 | 13.0 (1.30x) | 12.5 (1.25x) | - | - |" in lines  # no b1 bar
    assert cn.bar_of("unet2d_condition", "compiled", 1) == 1.2 and cn.bar_of("efficientnet_b0", "compiled", 32) == 1.0


def test_case_order_puts_the_acceptance_first():
    assert cn.case_order(_plan(batches=[1, 32], compile_mode="reduce-overhead")) == [
        ("eager", 1), ("compiled", 32), ("compiled", 1), ("eager", 32)]
    assert cn.case_order(_plan(batches=[2, 1])) == [("eager", 1), ("eager", 2)]
    gpu = _plan(batches=[1, 8, 32], compile_mode="reduce-overhead", device=torch.device("cuda"), smoke=False)
    assert cn.case_order(gpu) == [("eager", 1), ("graph", 1), ("graph", 32), ("graph", 8), ("compiled", 32),
                                  ("compiled", 8), ("compiled", 1), ("eager", 8), ("eager", 32)]


def test_time_budget_cuts_and_says_so(tmp_path):
    data, _ = cn.run(_plan(time_budget_s=1e-9), str(tmp_path))
    assert data["networks"]["small"]["status"] == "cut: the run's --time-budget was spent"
    assert "- small: cut: the run's --time-budget was spent" in (tmp_path / "cpu" / "conv-networks.md").read_text()


@pytest.mark.parametrize("activation", [None, "relu6"])
def test_twin_of_quantconv2d_holds_its_dequantized_weight(activation, torch_gen, rel_err):
    conv = nn.Conv2d(16, 8, (3, 1), stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)
    q = QuantConv2d.from_conv(conv, bits=4, group_size=-1, mode="zero_point", activation=activation)
    net = nn.Sequential(q, nn.BatchNorm2d(8).eval())
    twin = dequantized_copy(net, torch.float64)
    assert type(net[0]) is QuantConv2d  # the model itself is left as it was
    float_conv = twin[0][0] if activation else twin[0]
    assert type(float_conv) is nn.Conv2d and torch.equal(float_conv.weight, q.dequantized_weight(torch.float64))
    x = torch.randn(2, 16, 9, 10, generator=torch_gen)
    assert rel_err(net(x), twin.float()(x)) < 1e-5


def test_quantconv2d_is_one_op_under_compile(torch_gen):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    q = QuantConv2d.from_conv(nn.Conv2d(64, 12, 3, padding=1, groups=2), bits=4, group_size=32, activation="relu")
    x = torch.randn(2, 64, 6, 5, generator=torch_gen).contiguous(memory_format=torch.channels_last)
    y = torch.compile(q, backend=backend, fullgraph=True)(x)
    calls = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.mixgemm.conv2d_wxa16.default] or calls == [torch.ops.mixgemm.conv2d_wxa16]
    assert torch.equal(y, q(x)) and y.is_contiguous(memory_format=torch.channels_last)


def test_unknown_network_is_named(capsys):
    assert bench_main(["--conv-networks", "resnet50,vgg16", "--device", "cpu"]) == 2
    assert "unknown network(s) vgg16" in capsys.readouterr().err


def test_torchvision_without_its_compiled_ops(tmp_path, monkeypatch):
    """A torchvision whose ops do not load (its extension raises at import) still gives its model definitions."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import extension\nfrom torchvision import _meta_registrations, models\n")
    (pkg / "extension.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    (pkg / "_meta_registrations.py").write_text("raise RuntimeError('registers torchvision::nms')\n")
    (pkg / "models.py").write_text("def get_model(name, weights=None):\n    return name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        monkeypatch.delitem(sys.modules, name)
    try:
        with pytest.warns(UserWarning, match="compiled ops did not load"):
            tv = networks.import_torchvision()
        assert tv.models.get_model("resnet50") == "resnet50"
        assert isinstance(sys.modules["torchvision.extension"], types.ModuleType)
        with pytest.raises(RuntimeError, match="did not load"):
            sys.modules["torchvision.extension"]._assert_has_ops()
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
