"""tools/bench/moved_calls.py on the CPU: two trees' dispatch of whole calls, the moved groups, their comparison."""

from __future__ import annotations

import json

import pytest

from tools.bench import moved_calls

H100 = "NVIDIA H100 80GB HBM3"


def test_dispatch_of_a_tree_with_itself_moves_nothing():
    shapes, fmts, ms = [[4096, 14336], [2048, 2304]], ["w4z", "w8a8", "w4a8t"], [384, 1024]
    # (two child processes side by side, as for the older tree and this one)
    here, again = moved_calls._dispatch_of([None, None], shapes, fmts, ms, H100, 132)
    assert here == again == moved_calls.dispatch([tuple(s) for s in shapes], fmts, ms, H100, 132)
    assert len(here) == 12 and moved_calls.moved_groups(here, here) == {}
    # the H100's weight-only token tile at M = 384: BM 192 in the wgmma GEMM
    entry, cfg = here["4096x14336 384 w4z"].split(" ", 1)
    assert entry == "cuda_wgmma" and json.loads(cfg)["BM"] == 192
    assert here["4096x14336 384 w8a8"].startswith("cuda_wgmma_a8 ")


def test_moved_groups_split_by_m_and_activation_kind():
    old = {"8x16 384 w4s": "a {}", "8x16 384 w8": "a {}", "8x32 384 w8a8": "b {}", "8x16 1024 w4z": "a {}",
           "8x16 2048 w4s": "a {}"}
    new = {**old, "8x16 384 w4s": "a {\"BM\": 192}", "8x32 384 w8a8": "c {}", "8x16 1024 w4z": "a {\"S\": 2}"}
    groups = moved_calls.moved_groups(old, new)
    assert list(groups) == ["384 wo", "384 a8", "1024 wo"]
    assert groups["384 wo"] == {"shapes": ["8x16"], "methods": ["mixgemm W4A16 g128"], "cases": ["8x16 384 w4s"]}
    assert groups["384 a8"]["methods"] == ["mixgemm W8A8 per-channel"]
    assert groups["1024 wo"]["methods"] == ["mixgemm W4A16 g128 zero-point"]


def test_compare_reads_only_the_moved_cases_with_the_control():
    groups = {"384 wo": {"shapes": ["8x16"], "methods": ["mixgemm W4A16 g128"], "cases": ["8x16 384 w4s"]}}
    w4, ctl, w8 = "mixgemm W4A16 g128", moved_calls.CONTROL, "mixgemm W8A16 per-channel"
    before = {(8, 16, 384, w4): 10.0, (8, 16, 384, ctl): 5.0, (8, 16, 384, w8): 10.0}
    after = {(8, 16, 384, w4): 8.0, (8, 16, 384, ctl): 5.5, (8, 16, 384, w8): 20.0}  # w8 did not move: not counted
    lines = moved_calls.compare(groups, before, after)
    assert lines[0].startswith("384 wo: 1 moved cases, after / before 0.800 (control 1.100)")
    assert lines[-1] == "all: 1 moved cases, after / before 0.800, 0 slower"
    assert moved_calls.compare(groups, {}, after) == ["384 wo: no moved case timed on both sides"]


def test_results_folders_are_read_recursively(tmp_path):
    part = tmp_path / "new" / "h100"
    part.mkdir(parents=True)
    rows = [{"K": 8, "N": 16, "M": 384, "method": "m", "status": "ok", "time_us": 2.0},
            {"K": 8, "N": 16, "M": 384, "method": "x", "status": "error", "time_us": None}]
    (part / "moved-384-wo.json").write_text(json.dumps({"results": rows}))
    assert moved_calls._times(str(tmp_path / "new")) == {(8, 16, 384, "m"): 2.0}


def test_unknown_format_is_refused(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["moved_calls", "--diff", "x", "--formats", "w3"])
    with pytest.raises(SystemExit):
        moved_calls.main()
    assert "unknown ['w3']" in capsys.readouterr().err
