PYTHONPATH=src python3 -m tools.checks.device_batch --out $OUT --budget 200 \
 'cmp:180:python -m mixgemm bench --shapes 4096x14336 14336x4096 5120x13824 3584x18944 8192x8192 4096x4096 3072x16384 3584x28672 -m 1 --methods "mixgemm W4A16 g128,mixgemm W4A16 g128 zero-point,mixgemm W4A16 g128 compact,mixgemm W4A16 g128 zero-point compact" --rounds 3 --no-progress --out {res}/cmp'
