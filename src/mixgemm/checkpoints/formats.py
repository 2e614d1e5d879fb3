"""The registry of quantized-checkpoint formats that ``mixgemm.from_pretrained`` reads from safetensors.

A format is any object following ``mixgemm.checkpoints.base.CheckpointFormat``. Adding one is one call:

>>> from mixgemm.checkpoints import formats
>>> formats.register(MyFormat())

``find`` asks each registered format, in registration order, whether it ``matches`` a config.json
``quantization_config``; the first that does reads the checkpoint.
"""

from __future__ import annotations

from mixgemm.checkpoints.base import CheckpointFormat

_FORMATS: list[CheckpointFormat] = []


def register(fmt: CheckpointFormat) -> CheckpointFormat:
    """Add ``fmt`` (replacing a format of the same name); returns it, so it can decorate an instance."""
    for attr in ("name", "matches", "quantized_linears", "convert_linear"):
        if not hasattr(fmt, attr):
            raise TypeError(f"a checkpoint format needs {attr!r} (see mixgemm.checkpoints.base.CheckpointFormat)")
    _FORMATS[:] = [f for f in _FORMATS if f.name != fmt.name]
    _FORMATS.append(fmt)
    return fmt


def find(quantization_config: dict) -> CheckpointFormat | None:
    """The first registered format whose ``matches(quantization_config)`` is True, or None."""
    _register_builtin()
    for fmt in _FORMATS:
        if fmt.matches(quantization_config):
            return fmt
    return None


def names() -> list[str]:
    """The names of the registered formats, in lookup order."""
    _register_builtin()
    return [f.name for f in _FORMATS]


_BUILTIN_DONE = False


def _register_builtin() -> None:
    # Imported on first use, so that importing this module stays cheap and format modules can import it.
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    from mixgemm.checkpoints.awq import AWQ
    from mixgemm.checkpoints.compressed_tensors import COMPRESSED_TENSORS
    from mixgemm.checkpoints.gptq import GPTQ
    from mixgemm.checkpoints.native import MixgemmFormat

    for fmt in (MixgemmFormat(), GPTQ, AWQ, COMPRESSED_TENSORS):  # each matches on its own quant_method
        register(fmt)
