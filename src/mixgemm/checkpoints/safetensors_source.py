"""A ``TensorSource`` over a checkpoint directory's safetensors files (one file or an index of shards).

Tensors are read one at a time with safetensors' ``safe_open`` (memory-mapped), so a checkpoint is never
loaded whole. Unreadable files (truncated, not safetensors) raise ValueError naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


# the dtype names of safetensors' headers that this torch has
_ALL_DTYPES = {name: getattr(torch, attr) for name, attr in (
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("U16", "uint16"), ("I16", "int16"), ("U32", "uint32"),
    ("I32", "int32"), ("U64", "uint64"), ("I64", "int64"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
    ("F8_E8M0", "float8_e8m0fnu"), ("F16", "float16"), ("BF16", "bfloat16"), ("F32", "float32"),
    ("F64", "float64"), ("C64", "complex64")) if hasattr(torch, attr)}
# those of the tensors whose bytes can be read straight into a buffer (extent)
_DTYPES = {name: _ALL_DTYPES[name] for name in ("F16", "BF16", "F32", "F64")}


@dataclass(frozen=True)
class StoredTensor:
    """A checkpoint tensor as its file's header describes it (no data read)."""

    dtype: torch.dtype | str  # safetensors' own name where torch has none
    shape: tuple[int, ...]

    def is_floating_point(self) -> bool:
        return isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point


def _header(path: str) -> tuple[int, dict]:
    """The header's length and its tensors (name -> dtype, shape, data_offsets) of safetensors file ``path``."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read safetensors file {path}: {e} (truncated or not a safetensors file?)") from None
    return n, {k: v for k, v in header.items() if k != "__metadata__"}


def stored_tensors(paths) -> dict[str, StoredTensor]:
    """Every tensor of the safetensors files ``paths`` (a checkpoint's shards) by name, from their headers."""
    return {key: StoredTensor(_ALL_DTYPES.get(v["dtype"], v["dtype"]), tuple(v["shape"]))
            for path in paths for key, v in _header(path)[1].items()}


@dataclass(frozen=True)
class Extent:
    """Where a tensor's bytes lie: ``offset`` bytes into ``path``, row-major ``shape`` of ``dtype``."""

    path: str
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class SafetensorsSource:
    """Read access to the tensors of ``directory`` by name."""

    def __init__(self, directory: str):
        self.directory = directory
        index = os.path.join(directory, INDEX)
        if os.path.isfile(index):
            with open(index) as f:
                try:
                    weight_map = json.load(f)["weight_map"]
                except (json.JSONDecodeError, KeyError) as e:
                    raise ValueError(f"{index}: not a safetensors index ({e})") from None
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(os.path.join(directory, SINGLE)):
            files, weight_map = [SINGLE], None
        else:
            raise FileNotFoundError(f"{directory} has no {SINGLE} or {INDEX}")
        self._handles = {}
        self._extents: dict[str, Extent] = {}
        self._where: dict[str, str] = {}
        for name in files:
            stored = self._open(name).keys()
            for key in stored:
                self._where[key] = name
        if weight_map is not None:
            missing = sorted(k for k in weight_map if k not in self._where)
            if missing:
                raise ValueError(f"{index} lists tensors that its shards do not hold: {missing[:5]}")

    def _open(self, name: str):
        from safetensors import SafetensorError, safe_open

        path = os.path.join(self.directory, name)
        try:
            handle = safe_open(path, framework="pt")
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"cannot read safetensors file {path}: {e} (truncated or not a safetensors file?)") \
                from None
        self._handles[name] = handle
        self._read_header(path)
        return handle

    def _read_header(self, path: str) -> None:
        # safe_open checks the header; a file cut inside the data would only fail when that tensor is read
        # (or be mapped past its end), so check the data extent from the header now.
        n, tensors = _header(path)
        end, size = max((v["data_offsets"][1] for v in tensors.values()), default=0), os.path.getsize(path)
        if 8 + n + end > size:
            raise ValueError(f"safetensors file {path} is truncated: its header needs {8 + n + end} bytes, the file "
                             f"has {size}")
        for key, v in tensors.items():
            if v.get("dtype") in _DTYPES:
                self._extents[key] = Extent(path, 8 + n + v["data_offsets"][0], _DTYPES[v["dtype"]],
                                            tuple(v["shape"]))

    def extent(self, name: str) -> Extent | None:
        """Where float tensor ``name``'s bytes lie in its file (None for other dtypes): read directly into a buffer
        (os.preadv) rather than through the memory map, whose page faults cost more than the copy."""
        return self._extents.get(name)

    def keys(self):
        return self._where.keys()

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ValueError(f"the checkpoint in {self.directory} has no tensor {name!r}")
        try:
            return self._handles[self._where[name]].get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for unreadable data
            raise ValueError(f"cannot read tensor {name!r} from {os.path.join(self.directory, self._where[name])}: "
                             f"{e}") from None


__all__ = ["Extent", "SafetensorsSource", "StoredTensor", "stored_tensors"]
