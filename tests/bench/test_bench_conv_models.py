"""`mixgemm bench --conv-models`: the committed conv layer file, the tool that writes it (its hook code, without
torchvision), ConvSpec's geometry, the CPU run of the CLI and the conv acceptance view."""

import importlib.util
import json
import pathlib
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mixgemm.bench import accept, conv_models
from mixgemm.bench.cli import main as bench_main
from mixgemm.bench.conv import CONV_PRESET, W4_ZP, W4_ZP_DEQUANT, W8, W8_DEQUANT, ConvSpec
from repo_paths import ROOT

FAMILIES = {"ResNet", "ResNeXt", "Wide-ResNet", "VGG", "DenseNet", "Inception-v3", "GoogLeNet", "MobileNetV2",
            "MobileNetV3", "EfficientNet", "EfficientNetV2", "RegNet", "ConvNeXt", "ShuffleNet", "SqueezeNet",
            "MNASNet", "FCN", "DeepLabV3", "RetinaNet", "FasterRCNN", "UNet2DConditionModel", "AutoencoderKL"}


def _tool():
    path = ROOT / "tools" / "bench" / "conv_layers.py"
    spec = importlib.util.spec_from_file_location("tools_bench_conv_layers", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_data_file_schema_and_coverage():
    data = json.loads(pathlib.Path(conv_models.DATA_FILE).read_text())
    models, layers = data["models"], data["layers"]
    assert {m["family"] for m in models.values()} == FAMILIES
    assert {f"efficientnet_b{i}" for i in range(8)} | {"efficientnet_v2_s", "efficientnet_v2_m"} <= set(models)
    assert {"unet2d_condition", "autoencoder_kl"} <= set(models)
    for name, m in models.items():
        assert m["source"] in ("torchvision", "diffusers") and m["conv_calls"] >= m["distinct"] > 0, name
        assert m["distinct"] == sum(name in r["models"] for r in layers), name  # each model's layers all kept
    geometries = set()
    for r in layers:
        assert set(r) == set(conv_models.LAYER_FIELDS), r
        for key in ("kernel", "stride", "padding", "dilation", "hw"):
            assert len(r[key]) == 2 and all(isinstance(v, int) for v in r[key]), r
        assert r["ci"] % r["groups"] == 0 and r["co"] % r["groups"] == 0, r
        assert r["models"] and set(r["models"]) <= set(models), r
        assert 0 < len(r["used_by"]) <= 3 and r["uses"] >= len(r["used_by"]), r
        assert all(u.split(":")[0] in r["models"] for u in r["used_by"]), r
        geometries.add(tuple(json.dumps(r[k]) for k in ("ci", "co", "kernel", "stride", "padding", "dilation",
                                                        "groups", "hw")))
    assert len(geometries) == len(layers)  # one record per distinct geometry
    specs = [lay.spec for lay in conv_models.conv_layers()]
    assert len({s.name for s in specs}) == len(specs)  # names are the results' keys
    assert any(s.kernel_hw == (1, 7) for s in specs) and any(s.kernel_hw == (7, 1) for s in specs)
    assert any(s.dilation_hw != (1, 1) for s in specs) and any(s.groups == s.ci > 1 for s in specs)
    names = {s.name for s in specs}
    assert {"7x7/2 3-64 @224x224", "3x3 1280-1280 @16x16", "7x7 dw 96-96 @56x56"} <= names  # ResNet, UNet, ConvNeXt


def test_filters_pick_models_families_and_text():
    r50 = conv_models.conv_layers(["resnet50"])
    assert r50 and all("resnet50" in lay.models for lay in r50)  # the model, not wide_resnet50_2's own layers
    assert len(conv_models.conv_layers(["ResNet"])) >= len(r50)
    sevens = conv_models.conv_layers(["7x7"])  # the kernel, or a module name (Inception's branch7x7)
    assert any(lay.spec.kernel_hw == (7, 7) for lay in sevens) and any(lay.spec.kernel_hw != (7, 7) for lay in sevens)
    assert all("7x7" in lay.spec.name or any("7x7" in u for u in lay.used_by) for lay in sevens)
    assert conv_models.conv_layers(["no such layer"]) == []


def test_conv_spec_geometry_matches_torch():
    specs = [ConvSpec("a", 6, 4, (1, 7), 1, (9, 11), (0, 3)), ConvSpec("b", 6, 6, 3, (2, 1), 10, 2, 3, 2),
             ConvSpec("c", 4, 8, (3, 5), 2, (7, 12), None, 1, (1, 2)), CONV_PRESET[0]]
    for s in specs:
        w, x = s.weight(0, "cpu"), s.x(2, 0, "cpu")
        y = F.conv2d(x, w, None, s.stride_hw, s.pad_hw, s.dilation_hw, s.groups)
        assert tuple(y.shape[2:]) == s.out_size and s.gemm_dims(2) == (2 * y.shape[2] * y.shape[3],
                                                                      w[0].numel(), s.co)
        assert torch.equal(s.conv(x, w), y)
    assert CONV_PRESET[0].out_hw == 112 and CONV_PRESET[0].padding == 3  # the tools' square accessors
    with pytest.raises(ValueError, match="pads 0 x 3"):
        _ = specs[0].padding
    with pytest.raises(ValueError, match="groups=4 must divide"):
        ConvSpec("bad", 6, 8, 3, 1, 8, groups=4)
    with pytest.raises(ValueError, match="give no output"):
        ConvSpec("tiny", 4, 4, 5, 1, 2, pad=0)


class _Shared(nn.Module):
    """One conv called twice (as RetinaNet's head runs over the FPN levels), and one on a pooled input."""

    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        return self.head(x) + self.pool(self.head(self.pool(x))).sum()


def _toy():
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                         nn.Conv2d(8, 8, (1, 7), padding=(0, 3)), nn.Conv2d(8, 8, 3, padding="same", dilation=2),
                         _Shared())


def test_hook_code_enumerates_a_plain_module(tmp_path):
    tool = _tool()
    rec = tool.ConvRecorder()
    assert rec.run("toy", _toy, lambda m: m(torch.empty(1, 3, 16, 20))) == "meta"

    def needs_values():  # a constructor computing with tensors (RegNet's widths) cannot build on meta
        width = int(torch.arange(3).sum()) + 5
        return nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.Conv2d(width, width, 1))

    assert rec.run("valued", needs_values, lambda m: m(torch.empty(1, 3, 16, 20))) == "cpu->meta"
    assert rec.calls == {"toy": 6, "valued": 2}
    records = rec.records()
    by = {(tuple(r["kernel"]), r["groups"], tuple(r["hw"]), tuple(r["dilation"])): r for r in records}
    assert by[((3, 3), 1, (16, 20), (1, 1))]["stride"] == [2, 2]
    assert by[((3, 3), 1, (16, 20), (1, 1))]["models"] == ["toy", "valued"]  # same geometry, both models
    assert by[((3, 3), 8, (8, 10), (1, 1))]["used_by"] == ["toy:2"]
    assert by[((1, 7), 1, (8, 10), (1, 1))]["padding"] == [0, 3]
    assert by[((3, 3), 1, (8, 10), (2, 2))]["padding"] == [2, 2]  # "same" with dilation 2
    head = by[((3, 3), 1, (8, 10), (1, 1))]
    assert head["used_by"] == ["toy:5.head"] and head["uses"] == 1 and by[((3, 3), 1, (4, 5), (1, 1))]["uses"] == 1
    assert len(records) == 7
    path = tmp_path / "layers.json"
    path.write_text(tool.to_json({"toy": {"family": "Toy"}, "valued": {"family": "Valued"}}, records, {}))
    assert len(conv_models.conv_layers(path=str(path))) == 7
    layers = conv_models.conv_layers(["toy"], path=str(path))
    assert len(layers) == 6 and conv_models.conv_layers(["1x1"], path=str(path))[0].models == ("valued",)
    # the ConvSpec of each record gives the output the real module gives
    convs = [m for m in _toy().modules() if isinstance(m, nn.Conv2d)]
    for lay in layers:
        s = lay.spec
        conv = next(c for c in convs if (c.in_channels, c.out_channels, c.kernel_size, c.groups, c.dilation) ==
                    (s.ci, s.co, s.kernel_hw, s.groups, s.dilation_hw) and c.stride == s.stride_hw)
        y = conv(torch.randn(1, s.ci, *s.in_hw))
        assert tuple(y.shape[2:]) == s.out_size, s.name


def test_cli_conv_models_on_the_cpu(tmp_path, capsys, monkeypatch):
    # a 1x1 layer (W4 per-channel: Ci = 8) and a 3x3 depthwise one, which 4-bit holds (K = 9, a padded nibble); a
    # format that cannot hold a layer gives a refused row: here the W4 depthwise, through fit_conv_config
    import mixgemm.nn.conv as nn_conv

    fit = nn_conv.fit_conv_config

    def refusing(cfg, shape, **kw):
        if cfg.bits == 4 and shape[1] == 1:
            raise ValueError("4-bit depthwise refused (test)")
        return fit(cfg, shape, **kw)

    monkeypatch.setattr(nn_conv, "fit_conv_config", refusing)
    layers = "1x1 8-16 @1x1,3x3 dw 96-96 @7x7"
    args = ["--conv-models", "--conv-filter", layers, "--device", "cpu", "--out", str(tmp_path), "--no-progress"]
    assert bench_main(args) == 0
    data = json.loads((tmp_path / "cpu" / "conv-models.json").read_text())
    by = {(r["layer"], r["method"]): r for r in data["results"]}
    assert len(by) == 6 and {r["batch"] for r in data["results"]} == {1}
    base = "torch fp32 conv (CPU)"
    assert data["baseline"] == base
    for lay in layers.split(","):
        assert by[(lay, base)]["status"] == "ok" and by[(lay, W8)]["status"] == "ok"
        assert by[(lay, W8)]["speedup"] > 0 and by[(lay, W8)]["rel_err"] <= by[(lay, W8)]["tol"]
    assert by[("1x1 8-16 @1x1", W4_ZP)]["status"] == "ok"
    # the format, then the entry the layer ran (asked after its first call)
    assert by[("1x1 8-16 @1x1", W4_ZP)]["note"] == "W4 per-channel zero_point, cpu_reference"
    refused = by[("3x3 dw 96-96 @7x7", W4_ZP)]
    assert refused["status"] == "refused" and "4-bit" in refused["note"]
    md = (tmp_path / "cpu" / "conv-models.md").read_text()
    assert "| refused |" in md and "mobilenet_v3_small:" in md  # who uses the layer
    capsys.readouterr()
    assert bench_main(args + ["--merge"]) == 0  # every case held: nothing runs again
    assert "nothing left to run" in capsys.readouterr().err
    assert bench_main(["--conv-models", "--conv-filter", "no such layer", "--device", "cpu"]) == 2
    assert "no layer" in capsys.readouterr().err
    assert bench_main(["--conv-filter", "7x7", "--device", "cpu"]) == 2
    assert "give --conv-models too" in capsys.readouterr().err


def _case(layer, batch, method, status="ok", time_us=None, note=""):
    return {"kind": "conv", "layer": layer, "batch": batch, "method": method, "status": status, "time_us": time_us,
            "note": note, "K": 9, "N": 8, "M": batch}


def test_conv_acceptance_view():
    base = "cuDNN fp16 conv"
    res = []
    # layer a: W4 1.5x, W8 1.2x at batch 1; W4 0.9x at batch 32 (fails); layer b: W4 refused, W8 1.0x
    times = {("a", 1): {base: 30, W4_ZP: 20, W8: 25, W4_ZP_DEQUANT: 21, W8_DEQUANT: 20},
             ("a", 32): {base: 90, W4_ZP: 100, W8: 90, W4_ZP_DEQUANT: 97, W8_DEQUANT: 90},
             ("b", 1): {base: 10, W8: 10, W8_DEQUANT: 9}}
    for (lay, b), ts in times.items():
        for meth, t in ts.items():
            res.append(_case(lay, b, meth, time_us=t))
    res.append(_case("b", 1, W4_ZP, "refused", note="4-bit packing needs an even K"))
    res.append(_case("b", 1, W4_ZP_DEQUANT, "refused", note="4-bit packing needs an even K"))
    for r in res:
        if r["status"] == "ok":
            r["speedup"] = times[(r["layer"], r["batch"])][base] / r["time_us"]
            r["weight_floor_us"] = {W4_ZP: 1.25, W8: 2.5}.get(r["method"])
    data = {"meta": {"gpu": "test GPU"}, "baseline": base, "results": res, "layers": {"a": "resnet50:conv1"}}
    every, median = accept.conv_evaluate(data)
    assert every.verdict == "FAIL" and every.checked == 5
    assert every.failures[0].startswith("b B=1 mixgemm conv W4A16 zp: refused: 4-bit")
    assert every.failures[1] == f"a B=32 {W4_ZP}: 0.90x"
    assert "b B=32" in " ".join(every.missing)  # b was measured at batch 1 only
    assert median.verdict == "PASS"  # W8: the median of 1.2x and 1.0x is the bar, 1.1x
    assert median.notes == [f"{W4_ZP}: 1.50x over 1 layers", f"{W8}: 1.10x over 2 layers"]
    misses = accept.race_misses(data)  # the dispatch more than 1.05x slower than the forced route: 1.25x, 1.11x
    assert len(misses) == 2 and misses[0].startswith(f"a B=1 {W8}: 25.0 us") and misses[1].startswith(f"b B=1 {W8}")
    md = accept.conv_to_markdown(data)
    assert "| every layer and batch |" in md and "**FAIL**" in md and "refused: 4-bit" in md
    assert f"| {W4_ZP} | 1 | 1 | 1.50 | 1.50 | 0 | 1 |" in md
    assert ("| a | resnet50:conv1 | 1 | 30.0 | 20.0 (1.50x) | 25.0 (1.20x) | 21.0 (1.43x) | 20.0 (1.50x) | "
            "1.25 / 2.50 |") in md
    assert "| b |  | 1 | 10.0 | refused | 10.0 (1.00x) | refused | 9.0 (1.11x) | - / 2.50 |" in md
