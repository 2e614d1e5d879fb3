"""tools/bench/before_after.py: pairing two `mixgemm bench` runs case by case (no GPU needed)."""

from __future__ import annotations

import json

import pytest

from tools.bench.before_after import main


def _run(path, gpu, times):
    """A results file with graph times {(method, M): us} on 4096x4096."""
    results = [{"method": meth, "K": 4096, "N": 4096, "M": m, "status": "ok", "graph_us": us}
               for (meth, m), us in times.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": {"gpu": gpu}, "results": results}))
    return str(path)


def test_pairs_cases_divides_out_the_control_and_flags_slower_ones(tmp_path, capsys):
    _run(tmp_path / "a" / "h100" / "protocol.json", "H100",
         {("fp16 cuBLAS", 1): 10.0, ("mixgemm W4A16 g128", 1): 5.0, ("mixgemm W4A16 g128", 16): 7.0})
    after = _run(tmp_path / "b" / "protocol.json", "H100",
                 {("fp16 cuBLAS", 1): 11.0, ("mixgemm W4A16 g128", 1): 5.6, ("mixgemm W4A16 g128", 16): 7.7,
                  ("mixgemm W4A16 g128 compact", 1): 5.0, ("mixgemm W4A16 g128 compact", 16): 7.0})
    out_json = tmp_path / "pairs.json"
    assert main(["--before", str(tmp_path / "a"), "--after", after, "--compact-to-plain", "--json", str(out_json)]) == 0
    pairs = {(p["after_method"], p["M"]): p for p in json.loads(out_json.read_text())}
    # M = 1: 1.12x, of which the control's drift (1.10x) is divided out -> 1.018x, under the 1.03 limit
    assert pairs[("mixgemm W4A16 g128", 1)]["ratio"] == pytest.approx(1.12)
    assert pairs[("mixgemm W4A16 g128", 1)]["corrected"] == pytest.approx(1.12 / 1.1)
    # M = 16 has no control: 1.10x stays 1.10x and is flagged; the compact method pairs with the plain one
    assert pairs[("mixgemm W4A16 g128", 16)]["drift"] == 1.0
    assert pairs[("mixgemm W4A16 g128 compact", 16)]["before_method"] == "mixgemm W4A16 g128"
    table = capsys.readouterr().out
    assert "| mixgemm W4A16 g128 | mixgemm W4A16 g128 | 4096x4096 | 16 |" in table and "**over**" in table
    assert ("fp16 cuBLAS", 1) not in pairs


def test_refuses_runs_of_two_gpus_and_missing_paths(tmp_path):
    a = _run(tmp_path / "a.json", "H100", {("mixgemm W4A16 g128", 1): 5.0})
    b = _run(tmp_path / "b.json", "H200", {("mixgemm W4A16 g128", 1): 4.0})
    with pytest.raises(SystemExit, match="one GPU model"):
        main(["--before", a, "--after", b])
    with pytest.raises(SystemExit, match="no such file"):
        main(["--before", a, "--after", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="AFTER=BEFORE"):
        main(["--before", a, "--after", a, "--pair", "no equals sign"])
