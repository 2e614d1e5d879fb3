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
functions of DIRECT_OPS: compiled code cached on disk imports them by these names.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch.autograd import profiler

# op overload (as in torch.ops.mixgemm.<op>.<overload>) -> the name of its Python kernel in mixgemm.ops.custom_ops
DIRECT_OPS = {
    "linear_wxa16.default": "linear_wxa16",
    "linear_wxa16.no_grad": "linear_wxa16",
    "linear_wxa8.default": "linear_wxa8",
    "linear_wxa8.no_grad": "linear_wxa8",
    "rms_norm.default": "rms_norm",
    "add_rms_norm.default": "add_rms_norm",
    "gather_columns.default": "gather_columns",
}
_INSTALLED = False


def profiled(fn, label: str):
    """fn, under a record_function named ``label`` while the profiler records (as the dispatcher's call would be)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if profiler._is_profiler_enabled:
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def _codegen_key(overload: str) -> str:
    """The op's name in inductor's registry (its Python name, as the generated code would call it)."""
    return f"torch.ops.mixgemm.{overload}"


def _direct_name(overload: str) -> str:
    return "direct_" + overload.replace(".", "_")


def __getattr__(attr: str):
    """direct_<op>_<overload> (what generated code imports): the op's Python kernel, profiled, bound on first use
    (custom_ops imports this module, so it is not imported here at module level)."""
    for overload, name in DIRECT_OPS.items():
        if attr == _direct_name(overload):
            from mixgemm.ops import custom_ops

            globals()[attr] = call = profiled(getattr(custom_ops, name), f"mixgemm::{name}")
            return call
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def _write_direct_call(overload: str, node, writeline) -> None:
    """Inductor's codegen for a FallbackKernel of ``overload``: the direct call, or where inductor asks for more than
    a plain call (intermediate hooks), the dispatcher call it would write itself."""
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import ExternKernelAllocLine
    from torch._inductor.virtualized import V

    wrapper = V.graph.wrapper_code
    if config.generate_intermediate_hooks or not hasattr(wrapper, "add_import_once"):
        writeline(ExternKernelAllocLine(wrapper, node))
        return
    alias = "mixgemm_" + _direct_name(overload)
    wrapper.add_import_once(f"from mixgemm.ops.compiled_calls import {_direct_name(overload)} as {alias}")
    args = [*node.codegen_args(), *node.codegen_kwargs()]
    writeline(f"{node.get_name()} = {alias}({', '.join(args)})")


def install() -> bool:
    """Register the direct calls with inductor's wrapper codegen (once); False where this torch has no such
    registry."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN, CustomCodegen
    except ImportError:
        return False
    for overload in DIRECT_OPS:
        CUSTOM_EXTERN_KERNEL_CODEGEN.setdefault(
            _codegen_key(overload), CustomCodegen(python=functools.partial(_write_direct_call, overload)))
    _INSTALLED = True
    return True


@contextlib.contextmanager
def dispatcher_calls():
    """Within the block, graphs inductor compiles call the ops through the dispatcher (the direct calls' codegen is
    taken out of the registry and put back after): for an A / B of the two in one process, or to rule the direct
    calls out when debugging. Inductor's graph caches know nothing of it (a graph cached with the other calls comes
    back from them): turn them off around it (torch._inductor.config.force_disable_caches)."""
    from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN

    install()
    taken = {k: CUSTOM_EXTERN_KERNEL_CODEGEN.pop(k) for k in map(_codegen_key, DIRECT_OPS)
             if k in CUSTOM_EXTERN_KERNEL_CODEGEN}
    try:
        yield
    finally:
        CUSTOM_EXTERN_KERNEL_CODEGEN.update(taken)


def install_if_inductor() -> None:
    """install() when inductor is compiling (its compile_fx module is loaded): called from the ops' fake functions,
    which run while a compiler traces them."""
    if not _INSTALLED and "torch._inductor.compile_fx" in sys.modules:
        install()
