"""Typed kernel configs: a kernel's config is a frozen dataclass whose fields say what they are.

Each field is declared with :func:`knob`: its short key (the alias the tuning JSON, the tuning tables,
``kernel_options(configs=...)`` and ``explain`` use: ``R``, ``KS``, ``BM`` ...), what it means (documented once, here),
and the compile-time macro it becomes (``define``; None for a launch-time setting such as a grid). The config emits
its own macros (:meth:`KernelConfig.defines`). Configs travel through the registry as dicts keyed by the short keys
(that is what ``explain`` prints and the tuning cache stores); :meth:`KernelConfig.of` reads such a dict, naming any key
the kernel does not have. ``derived`` on the class lists the macros a kernel's source reads that come from the problem
or the layout instead of the config, each with its meaning, so that every ``#ifndef`` of the source is named
(tests/test_kernel_configs.py checks this).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar


def knob(key: str, doc: str, define: str | None = None, default: Any = dataclasses.MISSING):
    """A config field: ``key`` its short alias, ``doc`` what it is, ``define`` the -D macro it becomes (None: read by
    the host code only), ``default`` its value when a config leaves it out (none: required)."""
    return dataclasses.field(default=default, metadata={"key": key, "doc": doc, "define": define})


class KernelConfig:
    """Mixin of the kernels' frozen config dataclasses (fields declared with :func:`knob`)."""

    # macros the kernel's source reads that the problem or the layout sets, not the config: {macro: what it is}
    derived: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def keys(cls) -> dict[str, dataclasses.Field]:
        """{short key: field}."""
        return {f.metadata["key"]: f for f in dataclasses.fields(cls)}

    @classmethod
    def of(cls, config: Mapping[str, Any]):
        """The config a dict describes, by short keys (or field names); a key the kernel does not have is a
        ValueError naming it and the kernel's keys."""
        keys = cls.keys()
        names = {f.name: f for f in keys.values()}
        values = {}
        for k, v in config.items():
            f = keys.get(k) or names.get(k)
            if f is None:
                raise ValueError(f"{cls.__name__}: unknown config key {k!r}; the keys are "
                                 + ", ".join(f"{key} ({f.name})" for key, f in keys.items()))
            values[f.name] = v
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """{short key: value} (the form the tuning data and kernel_options use)."""
        return {f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)}

    def defines(self) -> dict[str, int]:
        """The -D macros of this config's fields that have one."""
        return {f.metadata["define"]: int(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.metadata["define"] is not None and getattr(self, f.name) is not None}
