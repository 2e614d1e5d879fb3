"""`python -m mixgemm demo` (the README's first command) on the CPU: it quantizes, checks and times a layer."""

from __future__ import annotations

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
