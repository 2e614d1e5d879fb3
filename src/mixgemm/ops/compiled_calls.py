"""Direct calls of mixgemm's ops from torch.compile'd code.

Why: inductor calls an op it cannot lower (a custom op's kernel is opaque to it) as
``torch.ops.mixgemm.<op>.<overload>(...)``: through the dispatcher, which converts every argument into the C++ stack
and back into Python objects for the op's Python kernel. For linear_wxa16's fourteen arguments that round trip costs
more than the kernel's own host code (3.3 against 1.9 us on the 2-core CPU), and a compiled decode step without CUDA
graphs pays it for every layer. The generated code can call the Python kernel itself instead: what the dispatcher adds
on this path (no autograd kernel runs below a compiled graph's own autograd function, no device guard, no dispatch
mode is active where the generated code runs) is a record_function for the profiler, which the direct call keeps.

How: inductor's wrapper codegen looks an op up in ``CUSTOM_EXTERN_KERNEL_CODEGEN`` (torch._inductor.codegen.
custom_extern_kernel_codegen, keyed by the op's Python name) before it writes the dispatcher call; for each op here,
the entry writes ``bufN = mixgemm_direct_<op>_<overload>(args)`` and imports the kernel under that name at the top of
the generated module. Installed the first time a compile that uses inductor traces a mixgemm op (the ops' fake
functions call ``install_if_inductor``), so importing mixgemm does not import inductor. Where that registry is missing
(another torch version) nothing is installed and inductor calls the ops as before. The generated code names the
functions of DIRECT_OPS: compiled code cached on disk imports them by these names. The codegen and its
installation: mixgemm.ops.direct_codegen (which the ops import; this module imports the ops).
"""

from __future__ import annotations

import functools

import torch
from torch.autograd import profiler

from mixgemm.ops import custom_ops
from mixgemm.ops.direct_codegen import DIRECT_OPS, direct_name
from mixgemm.ops.direct_codegen import dispatcher_calls as dispatcher_calls  # the A / B switch, named here too
from mixgemm.ops.direct_codegen import install as install


def profiled(fn, label: str):
    """fn, under a record_function named ``label`` while the profiler records (as the dispatcher's call would be)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if profiler._is_profiler_enabled:
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def __getattr__(attr: str):
    """direct_<op>_<overload> (what generated code imports): the op's Python kernel, profiled, bound on first use."""
    for overload, name in DIRECT_OPS.items():
        if attr == direct_name(overload):
            globals()[attr] = call = profiled(getattr(custom_ops, name), f"mixgemm::{name}")
            return call
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


