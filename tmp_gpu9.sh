PYTHONPATH=src python3 -m tools.checks.device_batch --out $OUT --budget 560 \
 'tune:300:python -m mixgemm tune --model llama-3-8b mistral-7b -m 1 --formats W4A16-ZP --layout plain --out {res}/tune.json --time-budget 260' \
 'before:60:python -m mixgemm bench --shapes 4096x14336 14336x4096 4096x4096 4096x1024 -m 1 --methods "mixgemm W4A16 g128 zero-point" --rounds 3 --no-progress --out {res}/before' \
 'after:60:MIXGEMM_TUNING_CACHE={res}/tune.json python -m mixgemm bench --shapes 4096x14336 14336x4096 4096x4096 4096x1024 -m 1 --methods "mixgemm W4A16 g128 zero-point" --rounds 3 --no-progress --out {res}/after'
