"""Reading and writing quantized checkpoints: GGUF, GPTQ, AWQ, compressed-tensors and mixgemm's own format.

``mixgemm.from_pretrained`` (loader.py) reads them; ``formats`` is the registry of safetensors formats;
``native`` is mixgemm's own format (what ``save_pretrained`` writes); ``hf_quantizer`` registers it with
transformers. Importing this package imports neither transformers nor gguf.
"""


def __getattr__(name):  # lazy: the loader imports transformers
    if name in ("from_pretrained", "load_tokenizer", "LoadReport"):
        from mixgemm.checkpoints import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'mixgemm.checkpoints' has no attribute {name!r}")
