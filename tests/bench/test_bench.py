"""`mixgemm bench` / `mixgemm report` on the CPU: floors arithmetic, the CLI's CPU path and its files,
wrong-result detection, error/unavailable handling, README table rendering. Fast (a few seconds)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mixgemm.__main__ import main as mixgemm_main
from mixgemm.bench import floors, output, protocol, report
from mixgemm.bench.cli import PRESETS, parse_ints, parse_shapes
from mixgemm.bench.methods import (
    BASELINE_CPU,
    Context,
    Method,
    Prepared,
    _prep_mixgemm_a8,
    all_methods,
    select,
    tensor_bytes,
)
from mixgemm.bench.runner import SweepConfig, rel_err, run_sweep

pytestmark = pytest.mark.slow(seconds=33)

H200_COPY_BW = 4.23e12  # the protocol table's measured copy bandwidth


# ------------------------------------------------------------------------------------------------ floors
def test_protocol_w4_floor_matches_the_protocol_table():
    # the protocol's published table (docs/benchmarking.md), H200 at 4.23 TB/s: 4096x4096 M=1 -> 2.1 us,
    # 8192x28672 M=1 -> 29.5 us, 8192x28672 M=4096 -> 100.9 us, 4096x14336 M=1024 -> 16.3 us
    # (bytes only, "at copy bandwidth").
    for (k, n, m), want in {(4096, 4096, 1): 2.1, (8192, 28672, 1): 29.5, (8192, 28672, 4096): 100.9,
                            (4096, 14336, 1024): 16.3, (8192, 28672, 256): 34.0}.items():
        got = floors.floor_of(floors.protocol_w4_bytes(m, k, n), 0, H200_COPY_BW, None).us
        assert got == pytest.approx(want, abs=0.06), (k, n, m, got)


def test_weight_bytes_and_floor_arithmetic():
    assert floors.quant_weight_bytes(4096, 4096, 4, 128, 4) == 4096 * 2048 + 4096 * 32 * 4
    assert floors.quant_weight_bytes(4096, 1024, 8, -1, 2) == 4096 * 1024 + 1024 * 2
    assert floors.case_bytes(2, 10, 20, 100, 2, 4) == 100 + 2 * 10 * 2 + 2 * 20 * 4
    assert floors.matmul_flops(3, 5, 7) == 210
    fl = floors.floor_of(nbytes=1_000_000, flops=10**12, bandwidth=1e12, rate=1e15)
    assert fl.mem_us == pytest.approx(1.0) and fl.compute_us == pytest.approx(1000.0)
    assert fl.us == pytest.approx(1000.0) and fl.bound == "compute"
    assert floors.floor_of(10**9, 10**6, 1e12, None).bound == "memory"
    assert floors.pct_of_floor(5.0, 10.0) == pytest.approx(50.0)
    assert floors.pct_of_floor(5.0, None) is None
    assert floors.quant_weight_bytes(100, 10, 4, 64) == 10 * 50 + 10 * 2 * 4  # a group of 64 and a partial one
    with pytest.raises(ValueError, match="group_size must be positive or -1, got 0"):
        floors.quant_weight_bytes(100, 10, 4, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        floors.floor_of(1, 1, 0.0, None)


def test_copies_exceed_three_l2_and_respect_the_cap():
    l2 = 50 * 2**20
    for nbytes in (8_912_896, 124_780_544, 470 * 2**20, 1000):
        c = protocol.copies_for(nbytes, l2, min_copies=3, max_bytes=2**40)
        assert c * nbytes > 3 * l2 and c >= 3
        assert (c - 1) * nbytes <= 3 * l2 or c == 3  # the smallest count that does it
    assert protocol.copies_for(470 * 2**20, l2, min_copies=3, max_bytes=1000 * 2**20) == 2  # memory cap wins
    assert protocol.copies_for(10**12, l2, max_bytes=10) == 1
    with pytest.raises(ValueError):
        protocol.copies_for(0, l2)


def test_gpu_slug():
    assert protocol.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert protocol.gpu_slug("NVIDIA H200") == "h200"


# ---------------------------------------------------------------------------------------------- options
def test_parse_shapes_and_ints():
    assert parse_shapes(["llama3-8b"]) == PRESETS["llama3-8b"]
    assert parse_shapes(["4096x14336,4096X4096", "4096x14336"]) == [(4096, 14336), (4096, 4096)]
    assert (8192, 28672) in parse_shapes(["llama3-70b"])
    with pytest.raises(ValueError, match="expected KxN"):
        parse_shapes(["4096by4096"])
    with pytest.raises(ValueError, match="positive"):
        parse_shapes(["0x16"])
    assert parse_ints(["1,16", "256", "16"], "-m") == [1, 16, 256]
    with pytest.raises(ValueError, match="not an integer"):
        parse_ints(["1,a"], "-m")


def test_method_selection():
    meths = all_methods([4, 8], 128)
    names = [m.name for m in meths]
    assert {"mixgemm W4A16 g128", "mixgemm W8A16 per-channel", "fp16 cuBLAS", "bf16 cuBLAS", "tinygemm W4 g128",
            "torch._int_mm", "gemlite W4 g128", "gemlite A8W8"} <= set(names)
    cpu = [m.name for m in select(meths, None, "cpu")]
    assert cpu == ["mixgemm W4A16 g128", "mixgemm W8A16 per-channel", BASELINE_CPU]
    # the CPU defaults take torch's linear in the activation dtype as the baseline (like with like)
    assert [m.name for m in select(meths, None, "cpu", dtype=torch.bfloat16)][-1] == "bf16 torch"
    assert [m.name for m in select(meths, None, "cpu", dtype=torch.float16)][-1] == "fp16 torch"
    gpu_quick = [m.name for m in select(meths, None, "cuda", quick=True)]
    assert "gemlite W8" not in gpu_quick and "gemlite W8" in [m.name for m in select(meths, None, "cuda")]
    assert [m.name for m in select(meths, "tinygemm W4 g128", "cuda")] == ["tinygemm W4 g128"]
    assert {m.name for m in select(meths, "gemlite", "cuda")} == {"gemlite W4 g128", "gemlite W8", "gemlite A8W8"}
    with pytest.raises(ValueError, match="no method matches"):
        select(meths, "nonexistent", "cuda")
    # each mixgemm method has a "... compact" twin (the weight holding one resident layout), off by default, GPU only
    compact = {m.name: m for m in meths if m.name.endswith(" compact")}
    assert {"mixgemm W4A16 g128 compact", "mixgemm W8A8 per-channel compact"} <= set(compact)
    assert not any(m.default or m.cpu for m in compact.values())
    assert "sm_90" in compact["mixgemm W4A16 g128 compact"].unavailable(Context(torch.device("cpu")))
    assert [m.name for m in select(meths, "mixgemm W4A16 g128", "cuda")] == ["mixgemm W4A16 g128"]


def test_compact_method_times_the_resident_layout_only():
    """A compact method's weight keeps only its resident layout over a placeholder of the codes (as
    QuantLinear.compact_): the call reads that layout (its bytes are the weight bytes) and still matches the float64
    reference (CPU: the plain codes rebuilt from the layout)."""
    meths = {m.name: m for m in all_methods([4, 8], 128)}
    ctx = Context(torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(200, 384, generator=gen) * 0.02
    for name, layout in (("mixgemm W4A16 g128 compact", "wgmma_v1"), ("mixgemm W8A8 per-channel compact",
                                                                      "wgmma_a8_v1")):
        prep = meths[name].prepare(w, ctx)
        x = prep.x_map(torch.randn(3, 384, generator=gen))
        ref = prep.reference(x)
        prep.before_call()
        assert rel_err(prep.layer(x), ref) < 1e-4 and rel_err(prep.new_copy()(x), ref) < 1e-4
        assert layout in meths[name].description
        assert prep.weight_bytes() >= w.numel() * (4 if "W4" in name else 8) // 8  # the layout's codes were read


# ----------------------------------------------------------------------------------------- CLI, CPU path
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    rc = mixgemm_main(["bench", "--device", "cpu", "--shapes", "256x384", "-m", "1", "3", "--out", str(d),
                       "--csv", "--no-progress", "--dtype", "fp32"])
    return rc, str(d / "cpu" / "cpu")  # OUT/<gpu folder>/<suite>: a CPU run is cpu/cpu


def test_cli_cpu_path_writes_json_csv_md(cpu_run, capsys):
    rc, prefix = cpu_run
    assert rc == 0
    data = json.loads(Path(prefix + ".json").read_text())
    meta = data["meta"]
    assert meta["device"] == "cpu" and "CPU" in meta["gpu"] and meta["torch"] == torch.__version__
    assert "triton" in meta and data["baseline"] == BASELINE_CPU
    assert data["ceilings"]["copy_bw"] > 0 and data["ceilings"]["fp32_flops"] > 0
    res = data["results"]
    assert {r["method"] for r in res} == {"mixgemm W4A16 g128", "mixgemm W8A16 per-channel", BASELINE_CPU}
    assert {(r["K"], r["N"], r["M"]) for r in res} == {(256, 384, 1), (256, 384, 3)}
    for r in res:
        assert r["status"] == "ok", r
        assert r["rel_err"] <= r["tol"]
        assert r["eager_us"] > 0 and r["graph_us"] is None and r["time_us"] == r["eager_us"]
        assert r["floor_us"] > 0 and r["speedup"] > 0
        assert r["pct_floor"] is None  # a % of the GPU floor means nothing for eager CPU wall clock
    w4 = next(r for r in res if r["method"] == "mixgemm W4A16 g128" and r["M"] == 1)
    assert w4["weight_bytes"] == 384 * 128 + 384 * 2 * 2  # codes + fp16 scales (sym: no zeros)
    assert w4["note"] == "cpu_dequant"  # the entry the layer ran (float32 x: the dequantizing CPU path)
    assert w4["bytes"] == w4["weight_bytes"] + 256 * 4 + 384 * 4  # float32 x in, y out on the CPU
    base = [r for r in res if r["method"] == BASELINE_CPU]
    assert all(r["speedup"] == pytest.approx(1.0) for r in base)
    with open(prefix + ".csv") as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    assert len(rows) == len(res) and rows[0]["method"]
    md = Path(prefix + ".md").read_text()
    assert "| K x N | M | mixgemm" in md and "256x384" in md
    assert "W4 floor" not in md and "% floor" not in md  # GPU-only columns are left out of a CPU run


def test_cli_cpu_honours_dtype_and_defaults_to_bf16(tmp_path, capsys):
    """A CPU run's activations are --dtype's (bf16 when not given: torch's int4 / int8 CPU kernels take it), beside
    torch's linear in that same dtype; no speed-up prints as 0.00x."""
    for flag, dtype, baseline in ((["--dtype", "bf16"], "bfloat16", "bf16 torch"), ([], "bfloat16", "bf16 torch"),
                                  (["--dtype", "fp16"], "float16", "fp16 torch")):
        d = tmp_path / (flag[-1] if flag else "default")
        assert mixgemm_main(["bench", "--quick", "--device", "cpu", "--shapes", "256x384", "-m", "1", "--out", str(d),
                             "--no-progress", *flag]) == 0
        out, err = capsys.readouterr()
        data = json.loads((d / "cpu" / "cpu.json").read_text())
        assert data["meta"]["dtype"] == dtype and data["baseline"] == baseline
        assert {r["method"] for r in data["results"]} == {"mixgemm W4A16 g128", "mixgemm W8A16 per-channel", baseline}
        assert all(r["status"] == "ok" and r["speedup"] > 0 for r in data["results"])
        w4 = next(r for r in data["results"] if r["method"] == "mixgemm W4A16 g128")
        assert w4["bytes"] == w4["weight_bytes"] + (256 + 384) * 2  # 16-bit x in, y out
        assert f"{dtype} activations" in err and "0.00x" not in out
        rows = [ln.split() for ln in out.splitlines() if ln.rstrip().endswith(" ok")]
        assert len(rows) == 3 and all(float(row[-2]) > 0 for row in rows)  # the terminal table's speed-up column


def test_ratio_text_never_reads_zero():
    assert [output.ratio_text(r) for r in (2.345, 1.0, 0.1, 0.0612, 0.0011, 0.000123)] == \
        ["2.35", "1.00", "0.10", "0.061", "0.0011", "0.00012"]


def test_cli_cpu_default_plan_says_which_shapes_and_writes_no_csv(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = mixgemm_main(["bench", "--device", "cpu", "-m", "1", "--methods", "W4A16", "--no-progress"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "CPU fallback" in err and "1024x2048 at M = 1" in err and "one small layer" in err  # what, and why
    # the default output folder, never files in the current directory itself
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixgemm-results"]
    assert sorted(p.name for p in (tmp_path / "mixgemm-results" / "cpu").iterdir()) == ["cpu.json", "cpu.md"]


def test_wrong_result_is_reported_not_timed():
    def prep_wrong(w: torch.Tensor, ctx: Context) -> Prepared:
        bad = w.clone()
        bad[0, 0] += 1.0  # one corrupted weight: a deliberately wrong kernel
        return Prepared(layer=lambda x: F.linear(x, bad), new_copy=lambda: (lambda x: F.linear(x, bad)),
                        x_map=lambda x: x, reference=lambda x: x.double() @ w.double().T, tol=2e-3,
                        weight_bytes=lambda: w.numel() * 4, act_bytes=4, out_bytes=4, compute="fp32")

    def prep_raises(w, ctx):
        raise RuntimeError("kernel exploded")

    def prep_unexplained(w: torch.Tensor, ctx: Context) -> Prepared:  # right, but its entry cannot be asked

        def chosen(x):
            raise ValueError("no such entry")

        return Prepared(layer=lambda x: F.linear(x, w), new_copy=lambda: (lambda x: F.linear(x, w)),
                        x_map=lambda x: x, reference=lambda x: x.double() @ w.double().T, tol=2e-3,
                        weight_bytes=lambda: w.numel() * 4, act_bytes=4, out_bytes=4, compute="fp32",
                        note="fp32", chosen=chosen)

    meths = [m for m in all_methods([4], 128) if m.name == BASELINE_CPU]
    meths += [Method("deliberately wrong", "peer", prep_wrong, cpu=True),
              Method("raises", "peer", prep_raises, cpu=True),
              Method("unexplained", "peer", prep_unexplained, cpu=True),
              Method("absent", "peer", prep_raises, unavailable=lambda ctx: "not installed", cpu=True),
              Method("partial", "peer", prep_wrong, applies=lambda m, k, n, ctx: "M too small" if m < 2 else None,
                     cpu=True)]
    data = run_sweep(SweepConfig(plan=[((64, 32), [1, 4])], methods=meths, device="cpu", dtype=torch.float32))
    by = {(r["method"], r["M"]): r for r in data["results"]}
    for m in (1, 4):
        r = by[("deliberately wrong", m)]
        assert r["status"] == "wrong" and r["rel_err"] > r["tol"] and "eager_us" not in r
        assert "not timed" in r["note"]
        assert by[("raises", m)]["status"] == "error" and "kernel exploded" in by[("raises", m)]["note"]
        assert by[(BASELINE_CPU, m)]["status"] == "ok"
        r = by[("unexplained", m)]  # timed: the entry is a note, not the case's outcome
        assert r["status"] == "ok" and r["note"] == "fp32, entry unknown: ValueError: no such entry"
    assert by[("partial", 1)]["status"] == "n/a" and by[("partial", 4)]["status"] == "wrong"
    assert data["unavailable"] == {"absent": "not installed"}
    assert not any(r["method"] == "absent" for r in data["results"])
    table = output.terminal_table(data)
    assert "WRONG" in table and "ERROR" in table and "not run: absent" in table
    assert "WRONG" in output.pivot_markdown(data)


def test_cli_exit_code_and_bad_options(tmp_path, capsys):
    assert mixgemm_main(["bench", "--device", "cpu", "--shapes", "12by3"]) == 2
    assert "expected KxN" in capsys.readouterr().err
    assert mixgemm_main(["bench", "--device", "cpu", "--bits", "3"]) == 2
    assert mixgemm_main(["bench", "--device", "cpu", "--methods", "nope"]) == 2
    assert mixgemm_main(["bench", "--device", "cpu", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
    assert mixgemm_main(["frobnicate"]) == 2


def test_rel_err():
    a = torch.tensor([1.0, 2.0])
    assert rel_err(a, a) == 0.0
    assert rel_err(torch.zeros(2), torch.zeros(2)) == 0.0
    assert rel_err(a, torch.zeros(2)) == float("inf")
    assert rel_err(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(2**0.5)


def test_tensor_bytes_counts_each_tensor_once():
    t = torch.zeros(10, dtype=torch.float16)
    assert tensor_bytes([t, t, {"a": torch.zeros(3, dtype=torch.int32)}]) == 20 + 12


def test_a8_reference_matches_mixgemm_block_int_gemm_oracle():
    # The bench's reference for the activation-quantized methods (dequantized int8 activations @ float64 W)
    # must equal mixgemm's oracle (quantize_activation + block_int_gemm), which matmul_a8 runs on the CPU.
    pytest.importorskip("mixgemm.ops.int8")
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(48, 256, generator=gen) * 0.02
    x = torch.randn(5, 256, generator=gen)
    for bits, g in ((4, 64), (8, -1)):
        ctx = Context(torch.device("cpu"), torch.float32, group_size=g)
        prep = _prep_mixgemm_a8(bits, g)(w, ctx)
        y = prep.layer(x)
        assert rel_err(y, prep.reference(x)) < 1e-6


# ------------------------------------------------------------------------------------------------ report
def test_report_renders_and_rewrites_marked_block(cpu_run, tmp_path):
    _, prefix = cpu_run
    data = json.loads(Path(prefix + ".json").read_text())
    results = tmp_path / "results"
    (results / "h100").mkdir(parents=True)
    (results / "h100" / "quick.json").write_text(json.dumps(data))
    (results / "h100" / "other.json").write_text(json.dumps(data))  # another suite: not rendered
    (results / "h200").mkdir()
    (results / "h200" / "quick.json").write_text("{\"other\": 1}")  # not a sweep: ignored
    loaded = report.load_results(str(results))
    assert len(loaded) == 1
    md = report.render(loaded)
    assert "| K x N | M | mixgemm" in md and "256x384" in md and "Ceilings:" in md
    assert report.render([]).startswith("_No GPU results")
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\nbefore\n<!-- results:start -->\nold table\n<!-- results:end -->\nafter\n")
    rc = mixgemm_main(["report", "--results", str(results), "--readme", str(readme), "--write"])
    assert rc == 0
    text = readme.read_text()
    assert "old table" not in text and "256x384" in text
    assert text.startswith("# t\n\nbefore\n<!-- results:start -->\n") and text.endswith("<!-- results:end -->\nafter\n")
    # idempotent
    mixgemm_main(["report", "--results", str(results), "--readme", str(readme), "--write"])
    assert readme.read_text() == text
    bad = tmp_path / "BAD.md"
    bad.write_text("no markers")
    assert mixgemm_main(["report", "--results", str(results), "--readme", str(bad), "--write"]) == 2
    with pytest.raises(ValueError, match="markers"):
        report.replace_block("<!-- results:end --> <!-- results:start -->", "x")


def test_report_finds_results_outside_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ./benchmarks/results here
    installed = report.checkout_results()
    if installed is not None:  # running from a checkout (editable install or PYTHONPATH=src): its results
        assert mixgemm_main(["report"]) == 0
        assert "| K x N | M | W4 floor |" in capsys.readouterr().out
    monkeypatch.setattr(report, "checkout_results", lambda: None)  # a wheel install: a clear message
    assert mixgemm_main(["report"]) == 2
    assert "pass --results DIR" in capsys.readouterr().err
    assert mixgemm_main(["report", "--results", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_plot_when_matplotlib_present(cpu_run, tmp_path):
    pytest.importorskip("matplotlib")
    _, prefix = cpu_run
    data = json.loads(Path(prefix + ".json").read_text())
    path = output.write_plot(data, str(tmp_path / "p.png"))
    assert path and Path(path).read_bytes()[:4] == b"\x89PNG"


def test_conv_cases_run_through_the_sweep_on_cpu():
    # The conv path (GPU-only in the CLI) on the CPU: mixgemm.conv2d falls back to its float64 reference,
    # which must match the bench's own reference; records carry the implicit-GEMM dims and the layer name.
    import dataclasses

    from mixgemm.bench.conv import ConvSpec, conv_methods

    spec = ConvSpec("tiny 3x3 32-16 @6", 32, 16, 3, 1, 6)
    assert spec.out_hw == 6 and spec.gemm_dims(2) == (72, 288, 16)
    meths = [dataclasses.replace(m, cpu=True) for m in conv_methods() if m.name.startswith("mixgemm")]
    data = run_sweep(SweepConfig(plan=[(spec, [1, 2])], methods=meths, device="cpu", dtype=torch.float32,
                                 group_size=32))
    assert len(data["results"]) == 4
    for r in data["results"]:
        assert r["status"] == "ok", r
        assert r["layer"] == spec.name and r["K"] == 288 and r["N"] == 16 and r["M"] == 36 * r["batch"]
        # the activations in the run's dtype (float32 here)
        assert r["bytes"] == r["weight_bytes"] + 4 * (r["batch"] * 32 * 36 + r["batch"] * 16 * 36)
    assert "tiny 3x3 32-16 @6" in output.pivot_markdown(data)


def test_protocol_reference_numbers_comparison():
    from mixgemm.bench import reference_numbers as rn

    plan = dict(rn.protocol_plan())
    assert plan[(8192, 28672)] == [1, 4, 16, 64, 256, 1024, 4096]
    # a run that reproduces the table exactly (times x 1.1: same ratios) compares at 0% deviation
    res = []
    for (k, n, m), row in rn.TABLE.items():
        for name, t in zip(rn.COLUMNS[1:], row[1:], strict=True):
            res.append({"K": k, "N": n, "M": m, "method": name, "status": "ok", "time_us": 1.1 * t})
    data = {"meta": {"gpu": "test"}, "results": res}
    cmp = rn.compare(data)
    assert len(cmp) == 15 * 4 and all(abs(c["deviation"]) < 1e-9 and c["within"] for c in cmp)
    assert all(o["same"] for o in rn.order_agreement(data))
    res[2]["time_us"] *= 2  # tinygemm 4096x4096 M=1 twice as slow
    assert sum(not c["within"] for c in rn.compare(data)) == 1
    assert "60/60" not in rn.compare_markdown(data) and "59/60" in rn.compare_markdown(data)


def test_weight_bytes_count_the_layouts_a_call_reads_not_their_build():
    # a layer whose first call builds its layout from another one (as gemv_mma_v1 is made from gemv_v2): the floor
    # must count the bytes the call reads, not the bytes its first call's build touched too
    def prep_building(w: torch.Tensor, ctx: Context) -> Prepared:
        read, built = [], []

        def layer(x):
            if not built:
                read.append("build_source")
                built.append(True)
            read.append("kernel_layout")
            return F.linear(x, w)

        sizes = {"build_source": 1000, "kernel_layout": w.numel() * 4}
        return Prepared(layer=layer, new_copy=lambda: (lambda x: F.linear(x, w)), x_map=lambda x: x,
                        reference=lambda x: x.double() @ w.double().T, tol=2e-3,
                        weight_bytes=lambda: sum(sizes[r] for r in set(read)), act_bytes=4, out_bytes=4,
                        compute="fp32", before_call=read.clear)

    data = run_sweep(SweepConfig(plan=[((64, 32), [1])], methods=[Method("builds", "peer", prep_building, cpu=True)],
                                 device="cpu", dtype=torch.float32))
    (r,) = data["results"]
    assert r["status"] == "ok" and r["weight_bytes"] == 64 * 32 * 4


def test_synced_call_us_runs_warmup_then_batches():
    calls = []
    t = protocol.synced_call_us(lambda: calls.append(1), calls=3, repeats=4, warmup=2)
    assert len(calls) == 2 + 3 * 4 and t > 0


def test_kernel_profile_names_one_row_per_kernel():
    from mixgemm.bench.kernel_profile import kernel_name

    assert kernel_name("void gemv_kernel<4, 128>(half const*, int)") == "gemv_kernel"
    assert kernel_name("void at::native::(anonymous namespace)::index_select_kernel<float>(float*)") == \
        "at::native::::index_select_kernel"
    # Triton's numeric suffix (one kernel compiled for several shapes) is cut; other names stay as they are
    assert kernel_name("triton_red_fused_add_mean_mul_pow_rsqrt_3") == "triton_red_fused_add_mean_mul_pow_rsqrt"
    assert kernel_name("ampere_fp16_s16816gemm_fp16_64x64_ldg8_f2f_stages_64x5_tn") == \
        "ampere_fp16_s16816gemm_fp16_64x64_ldg8_f2f_stages_64x5_tn"


def test_decode_tokens_per_s_times_each_repeat_on_cpu():
    pytest.importorskip("transformers")
    from mixgemm.bench.e2e import decode_tokens_per_s
    from mixgemm.integrations.hf import model_config, random_model

    model = random_model(model_config("tiny-llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1),
                         seed=1).eval()
    # kernel_steps is CUDA only (the CPU run leaves it out); the cache holds the prompt, warm-up and every loop
    r = decode_tokens_per_s(model, 1, 5, 2, 3, model.config.vocab_size, 0, None, "eager", kernel_steps=2, repeats=3)
    assert len(r["runs_tokens_per_s"]) == 3 and all(t > 0 for t in r["runs_tokens_per_s"])
    assert sorted(r["runs_tokens_per_s"])[1] == pytest.approx(r["tokens_per_s"])
    assert "kernels" not in r


def test_call_overhead_markdown_and_timing_helpers(capsys):
    """`mixgemm bench --call-overhead`: the result's Markdown marks ratios over the bar; the paired timer times each
    function (best round); the CLI names the missing GPU instead of timing the CPU."""
    from mixgemm.bench import call_overhead as co

    calls = [0, 0]

    def one():
        calls[0] += 1

    def two():
        calls[1] += 1

    us = co.paired_rate_us([one, two], calls=50, rounds=3)
    assert len(us) == 2 and all(0 < u < 1e4 for u in us) and calls[0] == calls[1] == 20 + 3 * 50
    assert co.paired_ratio([2.0, 9.0, 3.0], [1.0, 3.0, 1.0]) == 3.0  # the median of 2, 3, 3: round by round
    row = dict(scheme="W8A8", K=2048, N=2048, M=16, kernel="cuda_wgmma_a8", eager_us=20.0, eager_linear_us=16.0,
               eager_ratio=1.25, compiled_us=80.0, compiled_linear_us=50.0, compiled_ratio=1.6, gpu_us=8.4,
               gpu_linear_us=5.4)
    md = co.to_markdown(dict(machine=dict(gpu="NVIDIA H200", torch="2.11", date_utc="today"), rows=[row]))
    assert "| W8A8 | 16 | cuda_wgmma_a8 | 20.0 | 16.0 | 1.25x | 80.0 | 50.0 | 1.60x * | 8.4 (5.4) |" in md
    if not torch.cuda.is_available():
        assert mixgemm_main(["bench", "--call-overhead"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_rounds_report_the_median_of_interleaved_timings(monkeypatch):
    """rounds > 1: every checked case is timed once per round, the methods of a shape in turn (round 1 all of
    them, then round 2 ...), on fresh copies each round, and reports the median; wrong cases stay untimed and are
    not prepared again; rounds 1 keeps no per-round lists in the record."""
    from mixgemm.bench import runner

    order, prepared = [], []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([50.0, 10.0, 30.0])}  # each method's timings, round by round

    def fake_cpu_time(fn, *a, **k):
        seen = len(order)
        fn()
        return next(times[order[-1]]) if len(order) > seen else 1.0  # (1.0: the ceilings' own timings)

    monkeypatch.setattr(runner.protocol, "cpu_time_us", fake_cpu_time)

    def prep_named(name, wrong=False):
        def prep(w: torch.Tensor, ctx: Context) -> Prepared:
            prepared.append(name)

            def layer(x):
                order.append(name)
                return F.linear(x, w) * (2 if wrong else 1)

            return Prepared(layer=layer, new_copy=lambda: layer, x_map=lambda x: x,
                            reference=lambda x: x.double() @ w.double().T, tol=2e-3, weight_bytes=lambda: 1,
                            act_bytes=4, out_bytes=4, compute="fp32")
        return prep

    meths = [Method("a", "peer", prep_named("a"), cpu=True), Method("b", "peer", prep_named("b"), cpu=True),
             Method("w", "peer", prep_named("w", wrong=True), cpu=True)]
    data = run_sweep(SweepConfig(plan=[((64, 32), [1])], methods=meths, device="cpu", dtype=torch.float32,
                                 rounds=3))
    by = {r["method"]: r for r in data["results"]}
    assert by["a"]["eager_us"] == 3.0 and by["b"]["eager_us"] == 30.0  # medians of (5, 1, 3) and (50, 10, 30)
    assert by["a"]["rounds"] == 3 and by["w"]["status"] == "wrong" and "eager_us" not in by["w"]
    assert prepared == ["a", "b", "w", "a", "b", "a", "b"]
    assert not any(k.endswith("_rounds") for r in data["results"] for k in r)
    times["a"] = iter([7.0])
    (one,) = run_sweep(SweepConfig(plan=[((64, 32), [1])], methods=meths[:1], device="cpu",
                                   dtype=torch.float32))["results"]
    assert one["eager_us"] == 7.0 and "rounds" not in one and "eager_us_rounds" not in one
