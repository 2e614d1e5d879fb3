"""GPU time of layers that read one tensor, one by one against one layer over their joined rows (mixgemm.nn.siblings):
M = 1, compacted W4 g128 layers (sym and zero point), each side's calls back to back in a CUDA graph, the best of 7
replays.

    PYTHONPATH=src python -m tools.bench.sibling_join [--reps 50]
"""

from __future__ import annotations

import argparse

import torch

from mixgemm.formats.weight import QuantConfig
from mixgemm.nn.linear import QuantLinear

# (K, [N of each layer]) of the q / k / v and gate / up groups of three models
GROUPS = {"qwen2-7b qkv": (3584, [3584, 512, 512]), "qwen2-7b gate/up": (3584, [18944, 18944]),
          "llama3-8b qkv": (4096, [4096, 1024, 1024]), "llama3-8b gate/up": (4096, [14336, 14336]),
          "qwen2.5-1.5b qkv": (1536, [1536, 256, 256]), "qwen2.5-1.5b gate/up": (1536, [8960, 8960])}


def layer(k: int, n: int, mode: str) -> QuantLinear:
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.float16)
    return QuantLinear.from_linear(linear, QuantConfig(bits=4, group_size=128, mode=mode)).compact_()


def graph_us(fn, x: torch.Tensor, reps: int) -> float:
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn(x)
    best = float("inf")
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / reps)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50, help="calls per side in the graph")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("times CUDA kernels and needs a CUDA GPU")
    torch.manual_seed(0)
    for mode in ("sym", "zero_point"):
        for name, (k, ns) in GROUPS.items():
            layers = [layer(k, n, mode) for n in ns]
            joined = layer(k, sum(ns), mode)
            x = torch.randn(1, k, device="cuda", dtype=torch.float16)
            with torch.no_grad():
                apart = graph_us(lambda t, ls=layers: [lay(t) for lay in ls], x, args.reps)
                one = graph_us(joined, x, args.reps)
            print(f"{mode:10s} {name:22s} one by one {apart:7.2f} us  joined {one:7.2f} us  ({one / apart:.3f}x)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
