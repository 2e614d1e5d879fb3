"""`python -m mixgemm demo` (the README's first command) on the CPU: it quantizes, checks and times a layer."""

from __future__ import annotations

import pytest
import torch

from mixgemm import demo


def test_demo_runs_on_the_cpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert demo.main(["--shape", "1024x512"]) == 0
    out = capsys.readouterr().out
    assert "W4A16 g128 sym" in out and "W8A16 per-channel sym" in out
    # bfloat16 on a CPU: PyTorch's int4 CPU kernels, timed against a bfloat16 linear, and correct
    assert "torch.bfloat16, kernel cpu_torch_kernels" in out and "bfloat16 torch linear" in out
    err = float(out.split("vs float64 reference: rel err ")[1].split()[0])
    assert err < 1e-2
    # timed over rounds: the median and the range of each, and of the speed-up round by round
    assert "time over 5 rounds, median (min-max): mixgemm " in out


def test_demo_spread_is_the_median_and_range_of_the_rounds():
    times = {"mixgemm": [0.010, 0.030, 0.020], "base": [0.040, 0.030, 0.020]}
    line = demo.spread_line(times, "mixgemm", "base")
    assert line == ("time over 3 rounds, median (min-max): mixgemm 20.0 us (10.0-30.0), base 30.0 us (20.0-40.0); "
                    "speed-up 1.00x (1.00-4.00x)")
    calls = []
    rounds = demo.time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                              torch.device("cpu"), rounds=2, reps=1)
    assert [len(v) for v in rounds.values()] == [2, 2] and calls == ["a", "a", "b", "b"] * 2  # interleaved


def test_demo_refuses_zero_rounds(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--shape", "256x128", "--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
