"""Registers mixgemm's checkpoint format with transformers without importing transformers (or mixgemm).

transformers keeps its quantization registries in ``transformers.quantizers.auto``, imported only when a model
with a quantization_config is loaded. ``install()`` registers at once if that module is already imported;
otherwise it puts a finder on ``sys.meta_path`` that runs the registration right after the module executes.

It runs at interpreter start-up from ``mixgemm-hf.pth`` (which an installed mixgemm wheel puts in site-packages,
setup.py), so that ``AutoModelForCausalLM.from_pretrained`` of a mixgemm checkpoint loads its QuantLinear layers
whatever was imported before, and again on ``import mixgemm`` (for source checkouts without the .pth). This is a
top-level module, not part of the mixgemm package, so that start-up imports neither mixgemm nor torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

TARGET = "transformers.quantizers.auto"


def _register() -> None:
    try:
        from mixgemm.checkpoints.hf_quantizer import register

        register()
    except Exception as e:  # a transformers without these APIs: mixgemm works, AutoModel loading does not
        warnings.warn(f"mixgemm could not register its checkpoint format with transformers: {e}", stacklevel=2)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        uninstall()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    if TARGET in sys.modules:
        _register()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
