"""tools/bench/launch_spy.py: the launches host code prepares are recorded and still prepared (no GPU needed)."""

from __future__ import annotations

from mixgemm.kernels.cuda import nvrtc
from tools.bench.launch_spy import prepared_launches


def test_prepared_launches_records_and_restores(monkeypatch):
    calls = []

    def fake(fn, device, grid, block, args, shared_bytes=0, pdl=False, cluster=None, first_without_pdl=False):
        calls.append((fn, grid, shared_bytes, cluster, pdl))
        return "launch"

    monkeypatch.setattr(nvrtc, "prepare_launch", fake)
    with prepared_launches() as seen:
        # as the kernels' host code calls it: through the module attribute
        got = nvrtc.prepare_launch("f", None, [6, 1, 1], (256, 1, 1), [], 1024, pdl=True, cluster=(2, 1, 1))
        assert got == "launch"
        nvrtc.prepare_launch("g", None, (3, 1, 1), (128, 2, 1), [])
    assert nvrtc.prepare_launch is fake
    assert calls == [("f", [6, 1, 1], 1024, (2, 1, 1), True), ("g", (3, 1, 1), 0, None, False)]
    assert [(v.fn, v.grid, v.threads, v.shared_bytes, v.cluster) for v in seen] == [
        ("f", (6, 1, 1), 256, 1024, (2, 1, 1)), ("g", (3, 1, 1), 256, 0, None)]
