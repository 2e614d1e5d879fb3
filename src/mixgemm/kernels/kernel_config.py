"""Typed kernel configs: each kernel's config is a frozen dataclass whose fields say what they are, each documented
once (``knob``'s ``doc``), each with its short key (the alias the tuning JSON, the Python tuning tables and
``kernel_options(configs=...)`` use: ``R``, ``KS``, ``BM``...) and the compile-time define it becomes.

Configs still travel between the registry, tuning and the host code as dicts of short keys (what the JSON holds and
``mixgemm.explain`` prints); :meth:`KernelConfig.from_dict` reads one (short keys or field names; an unknown key is a
ValueError naming it) and :meth:`KernelConfig.to_dict` writes one back. A config forced through
``kernel_options(configs=...)`` may name its keys by field (``{"cuda_gemv": {"rows_per_warp": 4, ...}}``): the entry's
``complete`` turns them into the short keys (:meth:`KernelConfig.short_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar


def knob(key: str, doc: str, default=0, define: str | None = None, always: bool = False):
    """A config field: its short ``key``, what it is (``doc``), its ``default`` (MISSING: required) and the -D macro
    it sets (``define``, None where it is read by the host code only). ``always``: the key is written by to_dict even
    at its default (the tile's core keys, which every config of the kernel carries)."""
    return field(default=default, metadata={"key": key, "doc": doc, "define": define, "always": always})


@dataclass(frozen=True)
class KernelConfig:
    """Base of the kernels' typed configs (see the module docstring)."""

    # macros the kernel's source reads that the problem or the layout sets, not the config: {macro: what it is}
    # (with the fields' own macros, every #ifndef of the source is named: tests/kernels/test_kernel_configs.py)
    derived: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def keys(cls) -> dict[str, str]:
        """{short key: field name} of every field."""
        return {f.metadata["key"]: f.name for f in fields(cls)}

    @classmethod
    def macros(cls) -> dict[str, str]:
        """{-D macro: field name} of every field that sets one."""
        return {f.metadata["define"]: f.name for f in fields(cls) if f.metadata["define"]}

    def defines(self) -> dict[str, int]:
        """The -D macros of this config's fields that have one and a value."""
        return {f.metadata["define"]: int(getattr(self, f.name)) for f in fields(self)
                if f.metadata["define"] and getattr(self, f.name) is not None}

    def check_core_keys(self, what: str) -> None:
        """ValueError naming the first core key (a field without a default value, None) this config leaves unset;
        ``what`` names the kernel in the message."""
        for f in fields(self):
            if getattr(self, f.name) is None:
                raise ValueError(f"{what} config: key {f.metadata['key']} missing")

    def as_dict(self) -> dict:
        """{short key: value} of every field (to_dict leaves out the fields at their defaults)."""
        return {f.metadata["key"]: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def glossary(cls) -> str:
        """One line per field: short key, field name, define and what it is."""
        return "\n".join(f"{f.metadata['key']:>8} {f.name} ({f.metadata['define'] or 'host'}): {f.metadata['doc']}"
                         for f in fields(cls))

    @classmethod
    def from_dict(cls, config: Mapping):
        """The typed config of a dict of short keys (or field names); keys it does not set take the field's default."""
        if not isinstance(config, Mapping):
            raise TypeError(f"{cls.__name__}: a config is a dict of short keys, got {type(config).__name__}")
        by_key = cls.keys()
        names = set(by_key.values())
        values = {}
        for key, value in config.items():
            name = by_key.get(key, key if key in names else None)
            if name is None:
                raise ValueError(f"{cls.__name__}: unknown config key {key!r}; its keys: "
                                 + ", ".join(f"{k} ({n})" for k, n in by_key.items()))
            values[name] = value
        return cls(**values)

    @classmethod
    def short_keys(cls, config: Mapping) -> dict:
        """``config`` with every field name replaced by its short key, in its order and with its values (a forced
        config of kernel_options may use either); an unknown key is a ValueError naming it."""
        cls.from_dict({k: v for k, v in config.items() if v is not None})  # (checks the keys)
        by_name = {f.name: f.metadata["key"] for f in fields(cls)}
        return {by_name.get(k, k): v for k, v in config.items()}

    def to_dict(self) -> dict:
        """The short-key dict of this config: the core keys always, the others where they differ from their default."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and (f.metadata["always"] or f.default is MISSING or v != f.default):
                out[f.metadata["key"]] = v
        return out
