"""Shared check for the GEMV kernels launched with programmatic dependent launch (PDL): a chain of kernels in
which each one reads the output of the kernel right before it."""

from __future__ import annotations

from collections.abc import Callable

import torch


def assert_pdl_chain_matches(module, chain: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor) -> None:
    """Run ``chain(x0)`` eagerly and replayed from a CUDA graph, with ``module.PDL`` off and on. Every result must
    equal the PDL-off eager one bit for bit (the kernels are deterministic), so no kernel read its input before the
    kernel producing it had finished. ``module.PDL`` is restored afterwards."""
    old = module.PDL
    results = []
    try:
        for pdl in (False, True):
            module.PDL = pdl
            eager = chain(x0)
            xs = x0.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                yg = chain(xs)
            graph.replay()
            torch.cuda.synchronize()
            results += [eager, yg.clone()]
    finally:
        module.PDL = old
    for i, r in enumerate(results[1:], 1):
        assert torch.equal(r, results[0]), f"run {i} (PDL {'on' if i >= 2 else 'off'}, {'graph' if i % 2 else 'eager'})"
