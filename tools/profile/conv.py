"""Launch one conv layer for Nsight Compute: warm-up calls, then one call between cudaProfilerStart / Stop
(ncu --profile-from-start off profiles only that call, all of its kernels).

  PYTHONPATH=src python -m tools.profile.conv LAYER_SUBSTRING BATCH BITS ['{"BM": 128, ...}' | auto | cudnn]
The layer comes from mixgemm.bench.conv.CONV_PRESET; the config goes to the wgmma conv (auto: the dispatch;
cudnn: the peer, torch fp16 conv2d on channels_last with cudnn.benchmark, as the benchmark runs it).
"""

from __future__ import annotations

import json
import sys

import torch

from mixgemm import quantize_conv_weight
from mixgemm.bench.conv import CONV_PRESET
from mixgemm.ops.conv import cuda_conv2d
from tools.checks.conv_gpu_check import _inputs, qconfig


def main():
    name, batch, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "auto"
    cfg = None if mode in ("auto", "cudnn") else {"TMA": 1, "GROUP_M": 8, **json.loads(mode)}
    spec = next(s for s in CONV_PRESET if name in s.name)
    xs, w = _inputs(spec, batch, 1)
    st, pd = (spec.stride,) * 2, (spec.padding,) * 2
    if mode == "cudnn":
        torch.backends.cudnn.benchmark = True
        wh = w.half().contiguous(memory_format=torch.channels_last)

        def call():
            return torch.nn.functional.conv2d(xs[0], wh, None, st, pd, 1, spec.groups)
    else:
        qw = quantize_conv_weight(w, qconfig(spec, bits))
        path = None if cfg is None else "wgmma"

        def call():
            return cuda_conv2d(xs[0], qw, None, st, pd, (1, 1), spec.groups, -float("inf"), float("inf"), None,
                               cfg, path)
    for _ in range(4):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(spec.name, batch, bits, mode)


if __name__ == "__main__":
    main()
