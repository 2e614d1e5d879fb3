"""A ``TensorSource`` over a checkpoint directory's safetensors files (one file or an index of shards).

Tensors are read one at a time with safetensors' ``safe_open`` (memory-mapped), so a checkpoint is never
loaded whole. Unreadable files (truncated, not safetensors) raise ValueError naming the file.
"""

from __future__ import annotations

import json
import os

import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


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
        size = os.path.getsize(path)
        self._handles[name] = handle
        self._check_size(path, size, handle)
        return handle

    @staticmethod
    def _check_size(path: str, size: int, handle) -> None:
        # safe_open checks the header; a file cut inside the data would only fail when that tensor is read
        # (or be mapped past its end), so check the data extent from the header now.
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise ValueError(f"safetensors file {path} is truncated: its header needs {8 + n + end} bytes, the file "
                             f"has {size}")

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


__all__ = ["SafetensorsSource"]
