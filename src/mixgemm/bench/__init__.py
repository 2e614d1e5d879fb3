"""mixgemm bench: the scoreboard (docs/benchmarking.md).

protocol: timing (CUDA graph over rotating copies, eager, ceilings); methods: the method registry (mixgemm
paths and peers); floors: bytes/flops/floor per case; runner: the checked sweep; output: JSON/CSV/Markdown/
PNG; cli: `python -m mixgemm bench`; report: `python -m mixgemm report` (README table); models: layer shapes of
a Hugging Face config.json or of the committed list (model_shapes.json); accept: the acceptance view of a --model
run; merge: merging the parts of a split run.
"""
