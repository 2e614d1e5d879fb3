"""Shared check for the GEMV kernels launched with programmatic dependent launch (PDL): a chain of kernels in
which each one reads the output of the kernel right before it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


def assert_pdl_chain_matches(chain: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor,
                             rel_tol: float = 0.0) -> None:
    """Run ``chain(x0)`` eagerly and replayed from a CUDA graph, under kernel_options(pdl=False) and then with the
    default options (PDL on unless MIXGEMM_PDL=0; calls through mixgemm's ops use their cached plans and prepared
    launches there). Every result must equal the PDL-off eager one bit for bit (the kernels are deterministic), so no
    kernel read its input before the kernel producing it had finished.

    rel_tol > 0: for kernels whose fp32 sums are added in a run-dependent order (stream-K, atomic split-K), each result
    must instead be within rel_tol relative error (Frobenius norm) of the first; an input read too early gives a
    different chain, far outside it."""
    import mixgemm

    results = []
    for options in (mixgemm.kernel_options(pdl=False), contextlib.nullcontext()):
        with options:
            eager = chain(x0)
            xs = x0.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                yg = chain(xs)
        graph.replay()
        torch.cuda.synchronize()
        results += [eager, yg.clone()]
    for i, r in enumerate(results[1:], 1):
        what = f"run {i} (PDL {'on' if i >= 2 else 'off'}, {'graph' if i % 2 else 'eager'})"
        if rel_tol == 0.0:
            assert torch.equal(r, results[0]), what
        else:
            err = float((r.double() - results[0].double()).norm() / results[0].double().norm())
            assert err <= rel_tol, f"{what}: rel err {err:.2e} > {rel_tol:.0e}"
