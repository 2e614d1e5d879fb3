"""Launch one conv layer a few times (for Nsight Compute: ncu -k regex:mixgemm --launch-skip 2 --launch-count 1).

  PYTHONPATH=src python scripts/profile_conv.py LAYER_SUBSTRING BATCH BITS ['{"BM": 128, ...}' | auto]
The layer comes from mixgemm.bench.conv.CONV_PRESET; the config goes to the wgmma conv (auto: the dispatch).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conv_gpu_check import _inputs, qconfig  # noqa: E402

from mixgemm import quantize_conv_weight  # noqa: E402
from mixgemm.bench.conv import CONV_PRESET  # noqa: E402
from mixgemm.ops.conv import cuda_conv2d  # noqa: E402


def main():
    name, batch, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = None if len(sys.argv) < 5 or sys.argv[4] == "auto" else {"TMA": 1, "GROUP_M": 8, **json.loads(sys.argv[4])}
    spec = next(s for s in CONV_PRESET if name in s.name)
    xs, w = _inputs(spec, batch, 1)
    qw = quantize_conv_weight(w, qconfig(spec, bits))
    st, pd = (spec.stride,) * 2, (spec.padding,) * 2
    path = None if cfg is None else "wgmma"
    for _ in range(4):
        cuda_conv2d(xs[0], qw, None, st, pd, (1, 1), spec.groups, -float("inf"), float("inf"), None, cfg, path)
    torch.cuda.synchronize()
    print(spec.name, batch, bits, cfg)


if __name__ == "__main__":
    main()
