"""Reading and writing quantized checkpoints: GGUF, GPTQ, AWQ, compressed-tensors and mixgemm's own format."""
