"""The benchmarks' kernel choices through mixgemm.kernel_options (the registry, mixgemm.kernels.registry): which
entry runs a call, and the config the dispatcher hands an entry, so that a tool times the kernel and config it names.
"""

from __future__ import annotations

import torch

import mixgemm
from mixgemm.formats.weight import QuantizedWeight

# the CUDA GEMV kernels by the names the GEMV tools use (simt: CUDA cores, mma: tensor cores) -> registry entries
GEMV_ENTRIES = {"simt": "cuda_gemv", "mma": "cuda_gemv_mma"}


def gemv_options(kind: str, cfg: dict | None = None):
    """kernel_options under which mixgemm.kernels.cuda.gemv_direct.gemv runs the ``kind`` kernel ("simt" / "mma") with
    the
    tile config ``cfg`` when given (completed as the entry completes a forced config: gemv.simt_override needs R, U
    and KS; gemv.mma_override lays the keys given over the kernel's own config)."""
    if kind not in GEMV_ENTRIES:
        raise ValueError(f"GEMV kernel {kind!r}: expected one of {sorted(GEMV_ENTRIES)}")
    entry = GEMV_ENTRIES[kind]
    return mixgemm.kernel_options(force=entry, configs=None if cfg is None else {entry: cfg})


def entry_config(x: torch.Tensor, qw: QuantizedWeight, entry: str, **explain_kw) -> dict | None:
    """The config the dispatcher hands ``entry`` for x [..., K] @ qw (its tuning table's, or the entry's rule), with
    the entry forced past its tuning declines; ``explain_kw``: act_mode / act_block for the int8-activation entries.
    Raises mixgemm.kernels.registry.NoKernel when the entry cannot run the call."""
    with mixgemm.kernel_options(force=entry):
        return mixgemm.explain(x, qw, **explain_kw).config

