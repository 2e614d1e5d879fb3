"""The read ceiling of a decode layer, measured in the same run as the kernels: a no-math read of the same weight
bytes (src/mixgemm/kernels/cuda/read_probe.cu), timed as every method is (the protocol's CUDA graph over rotating
copies, programmatic dependent launch as the GEMVs use it).

One method per weight-only format of the acceptance (``read ceiling <method>``): it reads as many bytes as that
method's weight holds (codes, scales, zero points), at M = 1 only. The probe's access pattern is picked per layer
from PATTERNS by a short timing in ``prepare`` (the best one is the ceiling). Its output is not a product (a zero
tensor, ``tol`` infinite): the acceptance view reads its time, not its values.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from mixgemm.bench.method_types import Context, Method, Prepared, mixgemm_weight_only_name

PROBE = "read_probe.cu"
PREFIX = "read ceiling "


@dataclass(frozen=True)
class Pattern:
    """A read pattern of read_probe.cu: flat grid-stride (span False) or one contiguous span per block, threads per
    block, blocks per SM, 16-byte loads in flight per thread."""

    span: bool
    threads: int
    blocks_per_sm: int
    loads: int

    def defines(self) -> dict:
        return dict(RC_MODE=2 if self.span else 0, RC_THREADS=self.threads, RC_U=self.loads,
                    RC_MINB=self.blocks_per_sm, RC_WAIT=1)


PATTERNS = (Pattern(False, 512, 1, 4), Pattern(False, 512, 2, 4), Pattern(False, 512, 4, 2), Pattern(True, 512, 2, 8))


def format_bytes(k: int, n: int, bits: int, group_size: int, mode: str) -> int:
    """Bytes of a K x N weight in mixgemm's format: codes, fp16 scales, uint8 zero points (mode "zero_point")."""
    groups = 1 if group_size == -1 else -(-k // group_size)
    return n * k * bits // 8 + n * groups * 2 + (n * groups if mode == "zero_point" else 0)


FORMATS = ((4, 128, "sym"), (4, 128, "zero_point"), (8, -1, "sym"))


def _launcher(buf: torch.Tensor, pattern: Pattern, sms: int, scratch: torch.Tensor):
    from mixgemm.kernels.cuda import nvrtc

    fn = nvrtc.get_function(PROBE, "read_probe", pattern.defines(), buf.device)
    grid = sms * pattern.blocks_per_sm
    args = [ctypes.c_void_p(buf.data_ptr()), ctypes.c_longlong(buf.numel() // 4), ctypes.c_int(1),
            ctypes.c_void_p(scratch.data_ptr())]

    def call():
        nvrtc.launch(fn, (grid, 1, 1), (pattern.threads, 1, 1), args, torch.cuda.current_stream().cuda_stream,
                     pdl=True)

    return call


def _prepare(fmt):
    bits, group_size, mode = fmt

    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        from mixgemm.bench import protocol

        n, k = w.shape
        nbytes = -(-format_bytes(k, n, bits, group_size, mode) // 16) * 16
        dev = w.device
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        scratch = torch.zeros(sms * 8, dtype=torch.int32, device=dev)
        out = torch.zeros(1, n, dtype=ctx.dtype, device=dev)

        def buffer():
            return torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=dev)

        trial = [buffer() for _ in range(protocol.copies_for(nbytes, protocol.l2_bytes(dev), min_copies=2))]
        times = {p: protocol.graph_time_us([_launcher(b, p, sms, scratch) for b in trial], warmup_ms=5, rep_ms=15)
                 for p in PATTERNS}
        best = min(times, key=times.get)

        def make(buf):
            call = _launcher(buf, best, sms, scratch)

            def layer(x):
                call()
                return out

            layer.buf = buf
            return layer

        # the timed layer and its copies read the pattern trial's buffers first: no second fill of the same bytes
        first = make(trial.pop())
        return Prepared(
            layer=first, new_copy=lambda: make(trial.pop() if trial else buffer()), x_map=lambda x: x.to(ctx.dtype),
            reference=lambda x: torch.zeros(x.shape[0], n, dtype=torch.float64, device=x.device),
            tol=float("inf"), weight_bytes=lambda: nbytes, act_bytes=0, out_bytes=0,
            note=f"no-math read of {nbytes} bytes, pattern {best}",
        )

    return prepare


def _applies(m, k, n, ctx) -> str | None:
    return None if m == 1 else "the read ceiling is measured at M = 1"


def _unavailable(ctx: Context) -> str | None:
    if ctx.device.type != "cuda":
        return "needs a CUDA GPU"
    from mixgemm.kernels.cuda import nvrtc

    return None if nvrtc.nvrtc_available() else "needs NVRTC (cuda-bindings / nvidia-cuda-nvrtc)"


def ceiling_name(method: str) -> str:
    return PREFIX + method


def methods() -> list[Method]:
    return [Method(ceiling_name(mixgemm_weight_only_name(b, g, mode)), "ceiling", _prepare((b, g, mode)),
                   _unavailable, _applies, default=False,
                   description=f"no-math read of the bytes of {mixgemm_weight_only_name(b, g, mode)}'s weight, at "
                               "M = 1 (the decode read ceiling)")
            for b, g, mode in FORMATS]
