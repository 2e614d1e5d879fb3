"""Overrides of the kernel choice: one context manager, ``mixgemm.kernel_options`` (defined with the registry, which
knows the entry names), instead of module flags; here the options' state.

    with mixgemm.kernel_options(force="triton_gemm"):             # this kernel wherever it can run
        ...
    with mixgemm.kernel_options(disable={"cuda_wgmma"}):           # never this one (MIXGEMM_WGMMA=0 does the same)
        ...
    with mixgemm.kernel_options(configs={"cuda_wgmma": {"BM": 64, "NWG": 2}}):   # this config for that kernel
        ...
    with mixgemm.kernel_options(act_order_gather="caller"):       # act-order: one gather before every kernel
        ...
    with mixgemm.kernel_options(pdl=False):                        # no programmatic dependent launch (A/B runs)
        ...

Forcing an entry skips the other entries of its op and the tuning-based declines of the forced one (a "soft"
decline, e.g. the GEMV / GEMM crossover), never what the kernel cannot do (a "hard" decline raises, naming it).
The options live in a context variable, so they are per thread / task and restored on exit; plans cached on a
weight are only used under the default options.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class KernelOptions:
    """force: entry names preferred over the op's ordered list (one per op at most); disable: entry names never
    picked; configs: entry name -> the config it is handed instead of its own choice; conv_dequant_min_m: the conv's
    "dequantize + cuDNN" path from this many output pixels instead of its race (None: the race decides);
    act_order_gather: where an act-order layer's input permutation is applied (ACT_ORDER_GATHER); pdl: programmatic
    dependent launch on sm_90+ for the kernels that use it (the GEMVs, the wgmma GEMMs; default from MIXGEMM_PDL,
    "0" turns it off)."""

    force: frozenset = frozenset()
    disable: frozenset = frozenset()
    configs: Mapping = field(default_factory=lambda: MappingProxyType({}))
    conv_dequant_min_m: int | None = None
    act_order_gather: str = "auto"
    pdl: bool = True

    @property
    def is_default(self) -> bool:
        """True outside any kernel_options block (an identity test: it runs on every call)."""
        return self is _DEFAULT


# Where act-order layers (QuantLinear.input_perm) gather x: "auto" where the GEMVs measured to pay for it
# (mixgemm.kernels.linear), "kernel" in every GEMV that can (per lane where x is not staged in shared memory),
# "caller" never in a kernel (one gather before it). The last two are for A/B measurements.
ACT_ORDER_GATHER = ("auto", "kernel", "caller")

# The environment's default options: MIXGEMM_WGMMA=0 keeps the Hopper wgmma GEMM off unless forced; MIXGEMM_PDL=0
# launches nothing with programmatic dependent launch
_DEFAULT = KernelOptions(disable=frozenset() if os.environ.get("MIXGEMM_WGMMA", "1") != "0"
                         else frozenset({"cuda_wgmma"}), pdl=os.environ.get("MIXGEMM_PDL", "1") != "0")
_current: contextvars.ContextVar[KernelOptions] = contextvars.ContextVar("mixgemm_kernel_options", default=_DEFAULT)


def current_options() -> KernelOptions:
    return _current.get()


def default_options_active() -> bool:
    """current_options().is_default in one call: a kept launch's per-call check (mixgemm.ops.eager)."""
    return _current.get() is _DEFAULT


def push_options(new: KernelOptions):
    """Make ``new`` current; returns the token for pop_options (mixgemm.kernels.registry.kernel_options uses these)."""
    return _current.set(new)


def pop_options(token) -> None:
    _current.reset(token)
