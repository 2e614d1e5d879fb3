"""Host side of rank_sum.cu: the symmetric-memory workspace a tensor-parallel group's one-shot sums share, and the
prepared launches.

A ``RankSum`` belongs to one process group on one CUDA device. Making one is collective (every rank of the group,
in the same order): it allocates the staging buffer and flags in symmetric memory (torch.distributed's
``_symmetric_memory``, which maps every rank's buffer into every process over NVLink) and exchanges the handles.
Calling it sums a tensor over the ranks: every rank must then make the same calls, in the same order, with tensors
of the same shape and dtype (as a row-parallel layer's all-reduce).
"""

from __future__ import annotations

import ctypes
import itertools
import warnings

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import LaunchCache, new_rows_like

SOURCE, KERNEL = "rank_sum/rank_sum.cu", "mixgemm_rank_sum"
MAX_WORLD = 8  # RS_MAX_WORLD: ranks a sum can span (one NVLink domain of a host)
BLOCKS = 32  # RS_BLOCKS: blocks of every call; each moves 4 KB a pass, and 32 keep a 256 KB sum to two passes
THREADS = 256  # RS_THREADS
# Bytes one call sums at most: a decode step's messages (one token's hidden state is 16 KB at hidden 8192, a batch
# of 64 tokens 1 MiB). Larger sums (prefill) go to NCCL, whose ring reads each byte once where this reads it once
# from every other rank.
CAPACITY = 1 << 20
TIMEOUT_S = 600  # a rank waiting this long for another traps (a CUDA error) instead of hanging the GPU
_ES = {torch.float16: (2, 0), torch.bfloat16: (2, 1), torch.float32: (4, 0)}
_Y, _OUT = 0, 1  # per-call parameters' positions


class Ranks(ctypes.Structure):
    """rank_sum.cu's ``Ranks``: every rank's staging buffer and flags, as this process maps them."""

    _fields_ = [("buffer", ctypes.c_uint64 * MAX_WORLD), ("flags", ctypes.c_uint64 * MAX_WORLD)]


def unsupported_reason(y: torch.Tensor) -> str | None:
    """Why a one-shot sum cannot take ``y`` (None when it can): read from its dtype, device and size only, so that a
    traced (fake) tensor gets the same answer as the real one."""
    if not y.is_cuda:
        return "the tensor is not on a CUDA device"
    if y.dtype not in _ES:
        return f"dtype {y.dtype} (float16, bfloat16 or float32)"
    nbytes = y.numel() * y.element_size()
    if nbytes % 16:
        return f"{nbytes} bytes, not a multiple of 16"
    if nbytes > CAPACITY:
        return f"{nbytes} bytes, over the {CAPACITY} a one-shot sum holds (NCCL's ring is faster there)"
    return None


def group_reason(device: torch.device, world: int) -> str | None:
    """Why ranks of a group of ``world`` on ``device`` cannot sum one-shot (None when they may try: symmetric memory
    between them decides the rest)."""
    if device.type != "cuda":
        return f"the ranks are on {device.type}, not CUDA"
    if world > MAX_WORLD:
        return f"{world} ranks, over the {MAX_WORLD} the one-shot kernel spans"
    if not nvrtc.nvrtc_available():
        return "NVRTC is not available"
    return None


def defines(dtype: torch.dtype) -> dict:
    """rank_sum.cu's -D macros for sums of ``dtype``: the element type and the sizes the host's structures share."""
    es, bf16 = _ES[dtype]
    return {"RS_ES": es, "RS_BF16": bf16, "RS_BLOCKS": BLOCKS, "RS_THREADS": THREADS, "RS_MAX_WORLD": MAX_WORLD}


_keys = itertools.count()


class RankSum:
    """The one-shot sum over the ranks of ``group`` on ``device`` (collective to make: see the module docstring)."""

    def __init__(self, group, device: torch.device):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)  # (world <= MAX_WORLD: group_reason)
        self.device = device
        flags_bytes = BLOCKS * MAX_WORLD * 4
        buf = symm_mem.empty(2 * CAPACITY + flags_bytes, dtype=torch.uint8, device=device)
        buf.zero_()  # the flags start at 0 on every rank before any rank raises one: the rendezvous below is collective
        torch.cuda.synchronize(device)
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.9, a deprecation warning after
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(group.group_name)
        handle = symm_mem.rendezvous(buf, group.group_name)
        ptrs = [int(p) for p in handle.buffer_ptrs]
        self.ranks = Ranks()
        for r, p in enumerate(ptrs):
            self.ranks.buffer[r] = p
            self.ranks.flags[r] = p + 2 * CAPACITY
        self._buf, self._handle = buf, handle  # kept alive: the other ranks read this buffer
        self.epochs = torch.zeros(BLOCKS, dtype=torch.int32, device=device)
        self.key = next(_keys)
        self._launches = LaunchCache(64)

    def _launch(self, pieces: int, dtype: torch.dtype):
        def make():
            fn = nvrtc.get_function(SOURCE, KERNEL, defines(dtype), self.device)
            args = [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(pieces), self.ranks,
                    ctypes.c_void_p(self.epochs.data_ptr()), ctypes.c_int(self.rank), ctypes.c_int(self.world),
                    ctypes.c_longlong(CAPACITY), ctypes.c_longlong(TIMEOUT_S * 10**9)]
            # no PDL: the reuse of the staging buffer relies on stream order (rank_sum.cu)
            return nvrtc.prepare_launch(fn, self.device, (BLOCKS, 1, 1), (THREADS, 1, 1), args)

        return self._launches.get((pieces, dtype), make)

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` summed over the ranks, a new tensor (``y`` unchanged); the caller checked unsupported_reason."""
        if not y.numel():
            return y.clone()
        if not y.is_contiguous() or y.data_ptr() % 16:
            # (a fresh, aligned copy: every rank still makes the call, no rank-dependent path)
            y = y.clone(memory_format=torch.contiguous_format)
        out = new_rows_like(y.shape[:-1], y.shape[-1], y.dtype, y.device)
        launch = self._launch(y.numel() * y.element_size() // 16, y.dtype)
        v = launch.params.values
        with launch.params.lock:
            v[_Y].value, v[_OUT].value = y.data_ptr(), out.data_ptr()
            launch()
        return out
