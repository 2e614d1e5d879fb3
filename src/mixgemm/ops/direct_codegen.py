"""Inductor's codegen of the direct calls (mixgemm.ops.compiled_calls): the entries of its
``CUSTOM_EXTERN_KERNEL_CODEGEN`` registry that write ``bufN = mixgemm_direct_<op>_<overload>(args)`` and import the
function from mixgemm.ops.compiled_calls. Installed by the ops' fake functions (mixgemm.ops.custom_ops calls
``install_if_inductor``); apart from mixgemm.ops.compiled_calls, whose direct calls bind the ops' kernels, so the two
modules do not import each other.
"""

from __future__ import annotations

import contextlib
import functools
import sys

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


def _codegen_key(overload: str) -> str:
    """The op's name in inductor's registry (its Python name, as the generated code would call it)."""
    return f"torch.ops.mixgemm.{overload}"


def direct_name(overload: str) -> str:
    return "direct_" + overload.replace(".", "_")


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
    alias = "mixgemm_" + direct_name(overload)
    wrapper.add_import_once(f"from mixgemm.ops.compiled_calls import {direct_name(overload)} as {alias}")
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
