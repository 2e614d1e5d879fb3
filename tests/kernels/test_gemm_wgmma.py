"""The Hopper wgmma GEMM (kernels/cuda_wgmma/gemm_wgmma.cu) and its wgmma_v1 layout.

CPU: the layout decoded the way the kernel's lop3 / prmt steps read it (independent of the packing code),
NVRTC compile checks for sm_90a, the generated wgmma wrappers up to date. GPU (sm_90): every format, group
size, mode, activation dtype, odd shapes and tile configs against the float64 reference.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1, unpack_wgmma_v1
from mixgemm.reference.matmul import matmul as ref_matmul
from repo_paths import ROOT

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
ACTS = {None: (-float("inf"), float("inf")), "relu": (0.0, float("inf")), "relu6": (0.0, 6.0)}


def _qw(n, k, bits, gs, mode, device="cpu", seed=0, scale_dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    return quantize_weight(w.to(device), bits=bits, group_size=gs, mode=mode, scale_dtype=scale_dtype)


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("bits,gs,n,k", [(4, 128, 40, 256), (4, 32, 17, 96), (8, 64, 33, 192), (8, -1, 5, 200),
                                         (4, -1, 16, 72)])
def test_layout_roundtrip(bits, gs, n, k):
    qw = _qw(n, k, bits, gs, "zero_point")
    lay = build_wgmma_v1(qw)
    assert torch.equal(unpack_wgmma_v1(lay), qw.codes())
    assert lay.weight.shape == (-(-n // 128), -(-k // 64), 8, 512 if bits == 4 else 1024)
    # groups of the padded K: the padded half of a last 64-k tile reads a group of its own, zero
    groups = qw.num_groups if gs == -1 else max(qw.num_groups, -(-k // 64) * 64 // gs)
    assert lay.params.shape[:3] == (-(-n // 128), groups, 8) and lay.num_groups == groups
    assert not lay.params[:, qw.num_groups:].any()


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_built_in_row_blocks_equals_whole(bits, monkeypatch):
    """build_wgmma_v1 repacks BUILD_ROWS rows at a time; blocks of 128 rows and a short last block (N = 300) give
    the layout of one block over the whole weight."""
    import mixgemm.kernels.cuda_wgmma.layout as lw

    qw = _qw(300, 192, bits, 64, "zero_point", seed=3)
    whole = build_wgmma_v1(qw)
    monkeypatch.setattr(lw, "BUILD_ROWS", 128)
    blocks = build_wgmma_v1(qw)
    assert torch.equal(blocks.weight, whole.weight) and torch.equal(blocks.params, whole.params)
    assert torch.equal(unpack_wgmma_v1(blocks), qw.codes())


def _a_pairs(words: list[int], bits: int, s: int):
    """The four A-register pairs of step s as mma_frag.cuh extracts them (lop3 masks / prmt selectors)."""
    if bits == 4:
        w = words[s]
        nib = lambda v, sh: (v >> sh) & 0xF
        return [(nib(w, 0), nib(w, 16)), (nib(w, 4), nib(w, 20)), (nib(w, 8), nib(w, 24)), (nib(w, 12), nib(w, 28))]
    r0, r1 = words[2 * (s % 2) + 4 * (s // 2)], words[2 * (s % 2) + 1 + 4 * (s // 2)]
    b = lambda v, i: (v >> (8 * i)) & 0xFF
    return [(b(r0, 0), b(r0, 1)), (b(r1, 0), b(r1, 1)), (b(r0, 2), b(r0, 3)), (b(r1, 2), b(r1, 3))]


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_matches_wgmma_a_fragment(bits):
    """Lane (g, t), step s must find A[g][k0..k0+1], A[g+8][k0..], A[g][k0+8..], A[g+8][k0+8..], k0 = 16 s + 2 t."""
    qw = _qw(32, 128, bits, 64, "sym", seed=3)
    codes = qw.codes().to(torch.int64)
    lay = build_wgmma_v1(qw)
    for tile_n in range(2):
        for tile_k in range(2):
            raw = lay.tile(tile_n, tile_k).to(torch.int64)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                if bits == 4:
                    by = raw[lane * 16:(lane + 1) * 16]
                else:
                    by = torch.cat([raw[lane * 16:(lane + 1) * 16], raw[512 + lane * 16:512 + (lane + 1) * 16]])
                words = [int(by[4 * i] | by[4 * i + 1] << 8 | by[4 * i + 2] << 16 | by[4 * i + 3] << 24)
                         for i in range(len(by) // 4)]
                for s in range(4):
                    k0 = tile_k * 64 + 16 * s + 2 * t
                    r0, r1 = tile_n * 16 + g, tile_n * 16 + g + 8
                    want = [(codes[r0, k0], codes[r0, k0 + 1]), (codes[r1, k0], codes[r1, k0 + 1]),
                            (codes[r0, k0 + 8], codes[r0, k0 + 9]), (codes[r1, k0 + 8], codes[r1, k0 + 9])]
                    got = _a_pairs(words, bits, s)
                    assert got == [(int(a), int(b)) for a, b in want], (tile_n, tile_k, lane, s)


def test_generated_wgmma_wrappers_up_to_date():
    r = subprocess.run([sys.executable, "-m", "tools.codegen.wgmma_ops", "--check"], cwd=ROOT)
    assert r.returncode == 0, "run python -m tools.codegen.wgmma_ops: wgmma_ops.cuh is out of date"


COMPILE_CASES = [
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=128, WG_NWG=2, WG_STAGES=4),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=1, WG_MODE=2, WG_BM=256, WG_NWG=2, WG_STAGES=3),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=2, WG_MODE=0, WG_BM=8, WG_NWG=1, WG_STAGES=6, WG_G2=1, WG_SPLIT=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=40, WG_NWG=1, WG_STAGES=5, WG_SPLIT=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_TMA=0, WG_INFLIGHT=2),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=2, WG_STAGES=4, WG_TMA=0, WG_KT=2),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=2, WG_BM=16, WG_NWG=4, WG_STAGES=3, WG_G2=1, WG_KT=4),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=1, WG_STAGES=4, WG_KT=2, WG_G2=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=2, WG_MODE=0, WG_BM=64, WG_NWG=4, WG_STAGES=3, WG_KT=4, WG_PC=1),
    # stream-K: small-M tiles with 2 CTAs per SM, the large-M tile, per-channel row scales, NWG 1
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_SK=1, WG_MINB=2),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_SK=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_PC=1, WG_SK=1,
         WG_MINB=2),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=2, WG_MODE=2, WG_BM=16, WG_NWG=1, WG_STAGES=4, WG_KT=4, WG_G2=1, WG_SK=1),
    # group scales on fp32 partials: groups of 128 / 64, int4 / int8, fp16 / bf16, with stream-K
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_SK=1, WG_FOLD=1,
         WG_GT=2),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_FOLD=1, WG_GT=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=2, WG_MODE=1, WG_BM=16, WG_NWG=1, WG_STAGES=4, WG_KT=4, WG_FOLD=1, WG_GT=2),
    # implicit-GEMM convolution (im2col TMA loader): plain, stream-K, split-K, multi-tile stages with FOLD
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_CONV=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=1, WG_STAGES=4, WG_PC=1, WG_SK=1, WG_CONV=1),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=2, WG_MODE=2, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_SPLIT=1, WG_CONV=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_KT=4, WG_FOLD=1, WG_GT=2,
         WG_CONV=1),
    # TMA-store epilogue: GEMM (fp16, per-channel scale in the epilogue), conv (bf16), NWG 4, FOLD, multi-tile stages
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_TSTORE=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_PC=1, WG_CONV=1,
         WG_TSTORE=1),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=2, WG_MODE=2, WG_BM=64, WG_NWG=4, WG_STAGES=3, WG_KT=2, WG_TSTORE=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=16, WG_NWG=1, WG_STAGES=4, WG_KT=4, WG_FOLD=1, WG_GT=2,
         WG_TSTORE=1),
    # ... BM % 16 == 8 (stmatrix .x2 for the last block); uneven cluster bands, one store per 8-row block
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=1, WG_BM=104, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_TSTORE=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=104, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_SPLIT=2, WG_CONV=1,
         WG_TSTORE=1, WG_TS_BOX=8, WG_WS=1),
    # split-K slices as one cluster (partials through distributed shared memory): GEMM, conv, per-channel, FOLD,
    # cp.async, TMA store
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_SPLIT=2),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_PC=1, WG_SPLIT=2, WG_CONV=1),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_FOLD=1, WG_GT=1,
         WG_SPLIT=2),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=2, WG_MODE=2, WG_BM=24, WG_NWG=1, WG_STAGES=4, WG_TMA=0, WG_G2=1, WG_SPLIT=2),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_SPLIT=2,
         WG_TSTORE=1, WG_CONV=1),
    # programmatic dependent launch (weights before griddepcontrol.wait): GEMM + TMA store, stream-K across tiles,
    # conv in a cluster, workspace split-K with FOLD
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_TSTORE=1, WG_PDL=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_SK=1, WG_MINB=2,
         WG_PDL=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_PC=1, WG_SPLIT=2,
         WG_CONV=1, WG_TSTORE=1, WG_PDL=1),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_FOLD=1, WG_GT=1,
         WG_SPLIT=1, WG_PDL=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=2, WG_BM=64, WG_NWG=4, WG_STAGES=4, WG_KT=2, WG_SK=1, WG_PDL=1),
    # serial split-K (WG_SPLIT 3): the H100 M = 1 tile with FOLD, and a TMA-store tile
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=8, WG_NWG=2, WG_STAGES=4, WG_KT=4, WG_FOLD=1, WG_GT=2,
         WG_SPLIT=3, WG_GROUP_M=1, WG_PDL=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_PC=1, WG_SPLIT=3, WG_TSTORE=1),
    # a producer warp (WG_WS): conv in a cluster with PDL, GEMM + TMA store, persistent whole tiles, stream-K, serial
    # split-K, FOLD
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=104, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_SPLIT=2, WG_CONV=1,
         WG_PDL=1, WG_WS=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=96, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_PC=1, WG_TSTORE=1,
         WG_WS=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=128, WG_NWG=2, WG_STAGES=3, WG_SK=2, WG_TSTORE=1, WG_WS=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_SK=1, WG_WS=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_PC=1, WG_SPLIT=3, WG_WS=1),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=4, WG_STAGES=3, WG_KT=4, WG_FOLD=1, WG_GT=2,
         WG_WS=1),
    # persistent whole tiles (WG_SK 2): conv + TMA store in flight across tiles, GEMM with per-element stores, FOLD
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_SK=2, WG_CONV=1, WG_TSTORE=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=1, WG_STAGES=3, WG_PC=1, WG_SK=2, WG_TSTORE=1,
         WG_MINB=2),
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=2, WG_MODE=2, WG_BM=40, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_SK=2),
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=64, WG_NWG=2, WG_STAGES=3, WG_KT=4, WG_FOLD=1, WG_GT=2,
         WG_SK=2, WG_TSTORE=1, WG_PDL=1),
    # ... staging the TMA stores in pieces beside a 5-stage ring (WG_TS_CHUNK)
    dict(WG_BITS=4, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_SK=2,
         WG_TSTORE=1, WG_TS_CHUNK=16, WG_TS_BOX=128),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=0, WG_BM=256, WG_NWG=2, WG_STAGES=5, WG_INFLIGHT=2, WG_PC=1, WG_SK=2,
         WG_TSTORE=1, WG_TS_CHUNK=8, WG_TS_BOX=64, WG_PDL=1),
    # mixture-of-experts prefill: E experts' layouts, a tile table per launch (WG_GROUPED)
    dict(WG_BITS=4, WG_ACT=1, WG_SCL=0, WG_MODE=1, WG_BM=64, WG_NWG=2, WG_STAGES=4, WG_GROUP_M=1, WG_GROUPED=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=16, WG_NWG=2, WG_STAGES=4, WG_PC=1, WG_GROUPED=1),
    # int8 weights kept in rows_v1 (WG_ROWS): TMA boxes of rows + ldmatrix; per channel with PDL and a TMA store,
    # groups with stream-K, zero point at NWG 4 with cluster split-K, groups of 32 with a producer warp
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=0, WG_BM=128, WG_NWG=2, WG_STAGES=4, WG_KT=2, WG_PC=1, WG_TSTORE=1,
         WG_PDL=1, WG_ROWS=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=0, WG_MODE=2, WG_BM=64, WG_NWG=1, WG_STAGES=4, WG_SK=1, WG_ROWS=1),
    dict(WG_BITS=8, WG_ACT=0, WG_SCL=0, WG_MODE=1, WG_BM=32, WG_NWG=4, WG_STAGES=4, WG_KT=2, WG_SPLIT=2, WG_ROWS=1),
    dict(WG_BITS=8, WG_ACT=1, WG_SCL=1, WG_MODE=0, WG_BM=96, WG_NWG=2, WG_STAGES=3, WG_G2=1, WG_WS=1, WG_ROWS=1),
]


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")
@pytest.mark.parametrize("defs", COMPILE_CASES, ids=lambda d: "-".join(f"{v}" for v in d.values()))
def test_nvrtc_compiles_sm90a(defs):
    cubin = nvrtc.compile_cubin("cuda_wgmma/gemm_wgmma.cu", tuple(sorted(defs.items())), "sm_90a")
    assert len(cubin) > 1000


# ------------------------------------------------------------------------------------------------ GPU


def _gpu_ok():
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _gpu_ok(), reason="needs an sm_90 GPU")


def _run(m, n, k, bits, gs, mode, dtype, config=None, act="relu6", bias=True, seed=0, scale_dtype=torch.float16,
         x=None):
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    qw = _qw(n, k, bits, gs, mode, "cuda", seed, scale_dtype)
    g = torch.Generator().manual_seed(seed + 1)
    if x is None:
        x = torch.randn(m, k, generator=g).to("cuda", dtype)
    b = (torch.randn(n, generator=g) * 0.1).to("cuda", dtype) if bias else None
    x0 = x.clone()
    lo, hi = ACTS[act]
    y = gemm_wgmma(x, qw, b, lo, hi, config)
    ref = ref_matmul(x, qw, b, act, out_dtype=torch.float64)
    assert torch.equal(x, x0), "input modified"
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = float((y.double() - ref).norm() / ref.norm())
    assert err <= TOL[dtype], f"rel err {err:.3e} > {TOL[dtype]:.0e} (m={m} n={n} k={k} {bits} {gs} {mode} {config})"
    return err


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("bits,gs", [(4, 32), (4, 64), (4, 128), (4, 256), (4, -1), (8, 32), (8, 128), (8, -1)])
def test_formats(bits, gs, mode, dtype):
    k = 512 if gs != -1 else 200  # per-channel: K not a multiple of the 64-k tile
    _run(17, 200, k, bits, gs, mode, dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 3, 17, 33, 64, 129, 1000])
def test_m_values(m):
    _run(m, 1000, 1024, 4, 128, "zero_point", torch.float16, act=None)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", [
    dict(BM=8, NWG=1, STAGES=3, SPLIT=1), dict(BM=16, NWG=2, STAGES=6, SPLIT=3), dict(BM=64, NWG=1, STAGES=4, SPLIT=2),
    dict(BM=128, NWG=2, STAGES=4, SPLIT=1, GROUP_M=2), dict(BM=256, NWG=2, STAGES=3, SPLIT=1),
    dict(BM=40, NWG=2, STAGES=5, SPLIT="auto"), dict(BM=256, NWG=1, STAGES=4, SPLIT=5),
    dict(BM=32, NWG=2, STAGES=4, INFLIGHT=2), dict(BM=128, NWG=4, STAGES=6, SPLIT=2, INFLIGHT=2),
    dict(BM=24, NWG=3, STAGES=5, SPLIT=3, INFLIGHT=2, TMA=0),
    dict(BM=64, NWG=2, STAGES=4, TMA=0), dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, TMA=0),
    dict(BM=128, NWG=2, STAGES=3, KT=2), dict(BM=24, NWG=3, STAGES=3, SPLIT=2, KT=4, TMA=0),
    dict(BM=64, NWG=4, STAGES=3, KT=2), dict(BM=256, NWG=2, STAGES=4, INFLIGHT=2),
    dict(BM=16, NWG=1, STAGES=4, SPLIT=3), dict(BM=32, NWG=2, STAGES=6, INFLIGHT=2, GROUP_M=3),
    dict(BM=104, NWG=2, STAGES=4, KT=2), dict(BM=40, NWG=1, STAGES=4),  # TMA store, BM % 16 == 8
], ids=str)
@pytest.mark.parametrize("bits", [4, 8])
def test_configs(cfg, bits):
    _run(300, 520, 1088, bits, 64, "offset", torch.float16, config=cfg, act="relu")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("bm", [144, 160, 176, 192, 208, 224, 240])
@pytest.mark.parametrize("fmt", [(4, 128, "sym", torch.float16), (4, 128, "zero_point", torch.bfloat16),
                                 (8, -1, "sym", torch.float16), (4, 32, "offset", torch.float16)], ids=str)
def test_token_tiles(bm, fmt):
    """The token tiles (wgmma_waves.TokenTiles): the BM 256 tile's pipeline at BM 144..240, one launch; M = 1000 leaves
    a partial last token tile, N = 520 a partial row tile."""
    bits, gs, mode, dtype = fmt
    _run(1000, 520, 1152, bits, gs, mode, dtype, config=dict(BM=bm, NWG=2, STAGES=5, INFLIGHT=2, TMA=1, TAIL=0))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("kt", [1, 2, 4])
@pytest.mark.parametrize("tma", [0, 1])
@pytest.mark.parametrize("bits,gs,mode,k", [(4, 128, "zero_point", 1152), (4, 32, "offset", 1088), (8, 64, "sym", 1088),
                                            (8, -1, "zero_point", 1000), (4, -1, "offset", 1000)])
@pytest.mark.parametrize("split", [1, 3])
def test_multi_tile_stages(kt, tma, bits, gs, mode, k, split):
    # KT 64-k tiles per stage; 17 / 18 / 16 k-tiles and split-K 3 leave partial last stages (skipped tiles)
    cfg = dict(BM=32, NWG=2, STAGES=4, KT=kt, TMA=tma, SPLIT=split)
    _run(67, 264, k, bits, gs, mode, torch.float16, config=cfg)
    if bits == 4 and split == 1:
        _run(9, 72, k, bits, gs, mode, torch.bfloat16, config=dict(cfg, BM=16, NWG=1))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    # split 2 / 3 / 4 / 8: bands of BM / split rows, an uneven last slice (18 k-tiles / 4), a band past M (m = 67)
    (300, 520, 1152, dict(BM=128, NWG=2, STAGES=4, SPLIT=4)),
    (67, 264, 1152, dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, SPLIT=2)),
    (1000, 200, 2048, dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, SPLIT=8)),
    (129, 1000, 1152, dict(BM=24, NWG=1, STAGES=4, SPLIT=3)),  # 3 blocks of 8 rows: TMA-store bands 16, 8, none
    (1568, 512, 2048, dict(BM=104, NWG=2, STAGES=4, KT=2, SPLIT=2)),  # TMA-store bands 64 + 40, 8 rows per store
    (300, 520, 1152, dict(BM=40, NWG=2, STAGES=4, SPLIT=4)),  # bands 16, 16, 8, none
    (300, 520, 1152, dict(BM=64, NWG=2, STAGES=3, KT=4, SPLIT=3)),  # partial last stages
    (300, 520, 1152, dict(BM=64, NWG=4, STAGES=4, TMA=0, SPLIT=2)),
    (17, 520, 4096, dict(BM=16, NWG=1, STAGES=4, SPLIT=20)),  # more than a cluster holds: capped at 8
    (300, 520, 1152, dict(BM=128, NWG=2, STAGES=4, SPLIT=4, TSTORE=0)),  # per-element stores where TSTORE applies
    # the small-M tile (tuning wgmma_small_m): BM 16, one band per CTA of a 16-row pair, M under the tile
    (1, 520, 4096, dict(BM=16, NWG=2, STAGES=4, KT=2, SPLIT=8, GROUP_M=1)),
    (9, 1000, 1152, dict(BM=16, NWG=2, STAGES=4, KT=2, SPLIT=4, GROUP_M=1)),  # 18 k-tiles: slices of 6, 6, 6, 0 -> 3
    (16, 200, 896, dict(BM=16, NWG=2, STAGES=4, KT=2, SPLIT=2, GROUP_M=1)),
    (17, 264, 2048, dict(BM=16, NWG=2, STAGES=4, KT=2, SPLIT=4, GROUP_M=1)),  # two tiles of M
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (4, 32, "offset", torch.bfloat16),
                                 (8, -1, "sym", torch.float16), (4, 64, "sym", torch.bfloat16)], ids=str)
def test_cluster_split(m, n, k, cfg, fmt):
    """CLUSTER 1: the split-K slices of a tile are one cluster; each CTA adds its peers' partials of one band through
    distributed shared memory and stores it (bias, clamp, row scales) -- by TMA (bands of whole 16-row pairs, the last
    ones shorter or empty; one store per band where all are equal, else per 8-row block), per element with TSTORE 0
    or the cp.async loader; FOLD where it applies."""
    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    cfg = dict(cfg, CLUSTER=1, FOLD=int(cfg.get("KT", 1) > 1))
    _run(m, n, k, bits, gs, mode, dtype, config=cfg)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg, seed=3, act=None, bias=False)


def test_tail_rows():
    """TAIL: the first launch takes the weight rows whose tiles fill whole waves (rounded down to the layout's 128-row
    block); off without TAIL, with SK / SPLIT, below one wave, or with no partial wave left. "auto" splits the rest in
    two where its tiles fill at most half the SMs."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import default_config, tail_rows

    cfg = dict(BM=256, NWG=2, TAIL=2)
    # 4096 x 14336 at M = 1024: 112 x 4 tiles = 3.4 waves of 132 -> 99 x 4 = 396 tiles in whole waves
    assert tail_rows(1024, 14336, cfg, 132) == (99 * 128, 2)
    assert tail_rows(1024, 14336, dict(cfg, TAIL=3), 132) == (99 * 128, 3)
    assert tail_rows(1024, 14336, dict(cfg, TAIL=0), 132) == (0, 0)
    assert tail_rows(1024, 14336, dict(BM=256, NWG=2), 132) == (0, 0)
    assert tail_rows(1024, 14336, dict(cfg, SK=2), 132) == (0, 0)
    assert tail_rows(1024, 14336, dict(cfg, SPLIT=2), 132) == (0, 0)
    assert tail_rows(256, 4096, cfg, 132) == (0, 0)  # 32 tiles: less than a wave
    assert tail_rows(1024, 128 * 132, cfg, 132) == (0, 0)  # 132 x 4 tiles: whole waves, no tail
    # NWG 1 (64-row tiles): 33 tiles of 64 rows in whole waves are rounded down to 16 blocks of 128
    assert tail_rows(300, 2900, dict(BM=80, NWG=1, TAIL=2), 132) == (2048, 2)
    assert tail_rows(1024, 14336, dict(cfg, MINB=2), 132) == (66 * 128, 2)  # two CTAs per SM: one wave of 264 tiles
    auto = dict(cfg, TAIL="auto")
    assert tail_rows(1024, 14336, auto, 132) == (99 * 128, 2)  # 52 tail tiles: at most half of 132
    assert tail_rows(512, 28672, auto, 132) == (198 * 128, 2)  # 224 x 2 tiles: the same 3.4 waves
    assert tail_rows(2048, 14336, auto, 132) == (0, 0)  # 6.8 waves: 104 tail tiles, more than half
    assert tail_rows(4096, 14336, auto, 132) == (0, 0)  # 13.6 waves: 80 tail tiles
    assert default_config(2048, 14336, 4096)["TAIL"] == "auto"
    with pytest.raises(ValueError, match="TAIL"):
        tail_rows(1024, 14336, dict(cfg, TAIL=9), 132)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    (300, 3900, 1152, dict(BM=64, NWG=2, STAGES=4, TAIL=2)),  # 31 x 5 tiles: 26 row tiles, then 572 rows split 2
    (300, 2900, 1152, dict(BM=80, NWG=1, STAGES=4, TAIL=3)),  # NWG 1: the cut rounded to 128 rows; split 3
    (300, 8500, 1024, dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, TAIL=2)),  # the table's large-M tile; 52 tail rows
    (600, 7000, 1152, dict(BM=128, NWG=4, STAGES=3, KT=2, TAIL=4, TSTORE=0)),  # per-element stores; FOLD at g64
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (4, 32, "offset", torch.bfloat16),
                                 (8, -1, "sym", torch.float16), (4, 64, "sym", torch.bfloat16)], ids=str)
def test_tail_launch(m, n, k, cfg, fmt):
    """TAIL: whole waves of tiles over the first weight rows, then the rest as a cluster split-K launch from a row
    offset into the layout, the output columns, and the bias -- against the reference, with and without bias."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tail_rows

    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 0 < tail_rows(m, n, cfg, sms)[0] < n, "the case must exercise both launches"
    cfg = dict(cfg, FOLD=int(cfg.get("KT", 1) > 1))
    _run(m, n, k, bits, gs, mode, dtype, config=cfg)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg, seed=3, act=None, bias=False)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    (1, 1000, 4608, dict(BM=8, NWG=2, STAGES=4, KT=4, SPLIT=4)),  # the H100 M = 1 shape class; partial row box
    (3, 520, 2304, dict(BM=8, NWG=2, STAGES=4, KT=4, SPLIT=3)),  # an uneven last slice (36 k-tiles = 16 + 16 + 4)
    (16, 1000, 4608, dict(BM=16, NWG=2, STAGES=4, KT=4, SPLIT=8)),
    (300, 520, 1152, dict(BM=128, NWG=2, STAGES=4, SPLIT=4)),  # TMA store of the summed tile; a tile past M
    (129, 264, 1152, dict(BM=64, NWG=4, STAGES=3, KT=2, SPLIT=2, TSTORE=0)),
    (67, 200, 1024, dict(BM=32, NWG=1, STAGES=4, TMA=0, SPLIT=5)),  # cp.async loader, more slices than stages fit
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (4, 128, "sym", torch.bfloat16),
                                 (4, 32, "offset", torch.float16), (8, -1, "sym", torch.bfloat16)], ids=str)
def test_serial_split(m, n, k, cfg, fmt):
    """SERIAL 1: each split-K slice leaves its partial tile in a workspace and the last one to count adds them in
    slice order and stores (bias, clamp, row scales; FOLD where it applies). The tile counters are left zero for the
    next launch: a second call with other operands and a third with the first again are right, and the third is
    bit-identical to the first (the sum order does not depend on which slice finishes last)."""
    from mixgemm.kernels.cuda import stream_buffers
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G

    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    cfg = dict(cfg, SERIAL=1, FOLD=int(cfg.get("KT", 1) > 1))
    qw = _qw(n, k, bits, gs, mode, "cuda", 0)
    x = torch.randn(m, k, device="cuda").to(dtype)
    b = (torch.randn(n, device="cuda") * 0.1).to(dtype)
    y1 = G.gemm_wgmma(x, qw, b, 0.0, 6.0, cfg)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg, seed=3, act=None, bias=False)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg)
    y3 = G.gemm_wgmma(x, qw, b, 0.0, 6.0, cfg)
    assert torch.equal(y1, y3)
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for c in stream_buffers._COUNTERS.values()), "tile counters left non-zero"


@pytest.mark.gpu
@needs_sm90
def test_serial_split_in_cuda_graphs_takes_capture_counters():
    """CUDA graphs of serial split-K launches (three layers, each called twice) take their tile counters from the
    capture arena, one slice per capture (kernels/cuda/stream_buffers.graph_counters: no zeroing node per call); two
    graphs replayed in turn, several times, are bit-identical to eager calls, and leave their counters zero."""
    from mixgemm.kernels.cuda import stream_buffers as sb
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G

    cfg = dict(BM=16, NWG=2, STAGES=4, KT=4, SPLIT=4, SERIAL=1, FOLD=1)
    qws = [_qw(1000, 4608, 4, 128, "sym", "cuda", s) for s in range(3)]
    xs = [torch.randn(16, 4608, device="cuda").half() for _ in range(2)]
    eager = [[G.gemm_wgmma(x, q, None, -math.inf, math.inf, cfg) for q in qws] for x in xs]

    def capture(x):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph asks
            for q in qws:
                G.gemm_wgmma(x, q, None, -math.inf, math.inf, cfg)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [G.gemm_wgmma(x, q, None, -math.inf, math.inf, cfg) for q in qws for _ in range(2)]
        return g, outs

    before = {k for k in sb._GRAPH_COUNTERS if k[0] == "tiles"}
    graphs = [capture(x) for x in xs]
    made = {k for k in sb._GRAPH_COUNTERS if k[0] == "tiles"} - before
    assert len(made) == 2 and len({k[2] for k in made}) == 2, made  # one slice per capture
    for _ in range(3):
        for (g, outs), want in zip(graphs, eager, strict=True):
            g.replay()
            torch.cuda.synchronize()
            for i, y in enumerate(outs):
                assert torch.equal(y, want[i // 2]), i
    assert all(int(sb._GRAPH_COUNTERS[k].abs().sum()) == 0 for k in made), "tile counters left non-zero"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    # tiny grids: every tile shared by many CTAs of one stage or so
    (67, 264, 1152, dict(BM=32, NWG=2, STAGES=4, KT=1)),
    (67, 264, 1152, dict(BM=32, NWG=2, STAGES=3, KT=4)),
    (9, 72, 1088, dict(BM=16, NWG=1, STAGES=4, KT=2)),
    # ranges of several stages that start and end inside tiles, some whole tiles between
    (300, 1000, 1024, dict(BM=32, NWG=2, STAGES=4, KT=4)),
    (1000, 2000, 1024, dict(BM=64, NWG=2, STAGES=4, KT=2)),
    (2000, 3000, 1088, dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2)),
    (700, 1500, 2048, dict(BM=128, NWG=4, STAGES=3, KT=2, GROUP_M=3)),
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (4, 32, "offset", torch.bfloat16),
                                 (8, -1, "sym", torch.float16), (4, -1, "offset", torch.float16)], ids=str)
def test_stream_k(m, n, k, cfg, fmt):
    """SK 1: CTAs that share a tile leave partials; the last one to count its stages adds them and stores."""
    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    cfg = dict(cfg, SK=1, TMA=1)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg)
    _run(m, n, k, bits, gs, mode, dtype, config=cfg, seed=5, act=None, bias=False)  # the counts were left zero


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    (8000, 1000, 64, dict(BM=32, NWG=1, STAGES=4)),             # one stage per tile, several tiles per CTA
    (3001, 777, 192, dict(BM=128, NWG=2, STAGES=3, MINB=2)),     # tails in M and N, 3 k-tiles
    (1500, 2000, 1088, dict(BM=64, NWG=2, STAGES=4, KT=2)),      # several stages per tile, a partial last stage
    (2900, 1000, 896, dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2)),  # staged in pieces beside the 5-stage ring
    (2000, 3000, 1024, dict(BM=192, NWG=2, STAGES=4, INFLIGHT=2)),
    (900, 520, 512, dict(BM=40, NWG=4, STAGES=3)),               # BM % 16 != 0: per-element stores
    (5000, 1000, 256, dict(BM=64, NWG=2, STAGES=3, KT=4, FOLD=1)),
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 64, "zero_point", torch.float16), (8, -1, "sym", torch.bfloat16),
                                 (4, 32, "offset", torch.float16)], ids=str)
def test_persistent_whole_tiles(m, n, k, cfg, fmt):
    """SK 2: a CTA runs every grid-th output tile whole and its TMA stores stay in flight under the next tile. The
    same sums in the same order as one CTA per tile, so the output is bit-equal to that; and within tolerance."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    cfg = dict(cfg, TMA=1)
    _run(m, n, k, bits, gs, mode, dtype, config=dict(cfg, SK=2))
    qw = _qw(n, k, bits, gs, mode, "cuda", 7, torch.float16)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(m, k, generator=g).to("cuda", dtype)
    b = (torch.randn(n, generator=g) * 0.1).to("cuda", dtype)
    for lo, hi in ((0.0, 6.0), (-math.inf, math.inf)):
        assert torch.equal(gemm_wgmma(x, qw, b, lo, hi, dict(cfg, SK=2)), gemm_wgmma(x, qw, b, lo, hi, cfg))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    (300, 520, 1152, dict(BM=128, NWG=2, STAGES=4)),                          # M / N tails, TMA store
    (1568, 512, 2048, dict(BM=104, NWG=2, STAGES=4, KT=2, SPLIT=2, CLUSTER=1)),  # cluster split-K, uneven bands
    (257, 136, 640, dict(BM=256, NWG=2, STAGES=4, INFLIGHT=2, SPLIT=3, SERIAL=1)),  # serial split-K
    (3001, 777, 192, dict(BM=128, NWG=2, STAGES=3, SK=2)),                     # persistent whole tiles
    (33, 8192, 1024, dict(BM=32, NWG=2, STAGES=3, KT=4, SK=1)),               # stream-K
    (129, 264, 1024, dict(BM=32, NWG=2, STAGES=4, KT=4, FOLD=1)),
    (77, 1000, 768, dict(BM=64, NWG=4, STAGES=3, KT=2)),                       # 17 warps: 4 warpgroups + the producer
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (8, -1, "sym", torch.bfloat16),
                                 (4, 64, "offset", torch.bfloat16)], ids=str)
def test_producer_warp(m, n, k, cfg, fmt):
    """WS 1: one more warp only loads, each slot refilled once every consumer warp released it on an mbarrier (no CTA
    barrier per stage). The same wgmmas in the same order: bit-equal to WS 0, and within tolerance."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    bits, gs, mode, dtype = fmt
    k = k if gs == -1 else -(-k // gs) * gs
    cfg = dict(cfg, TMA=1)
    _run(m, n, k, bits, gs, mode, dtype, config=dict(cfg, WS=1))
    if cfg.get("SK") == 1:  # stream-K adds a shared tile's partials in arrival order: not bit-reproducible, WS or not
        _run(m, n, k, bits, gs, mode, dtype, config=dict(cfg, WS=1))  # (and its counters were left zeroed)
        return
    qw = _qw(n, k, bits, gs, mode, "cuda", 9, torch.float16)
    g = torch.Generator().manual_seed(10)
    x = torch.randn(m, k, generator=g).to("cuda", dtype)
    b = (torch.randn(n, generator=g) * 0.1).to("cuda", dtype)
    for lo, hi in ((0.0, 6.0), (-math.inf, math.inf)):
        for _ in range(2):  # repeated calls: the serial split-K counters are left zeroed
            assert torch.equal(gemm_wgmma(x, qw, b, lo, hi, dict(cfg, WS=1)), gemm_wgmma(x, qw, b, lo, hi, cfg))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", [
    dict(BM=32, NWG=2, STAGES=3, KT=4), dict(BM=16, NWG=1, STAGES=4, KT=2), dict(BM=64, NWG=2, STAGES=3, KT=4, SPLIT=3),
    dict(BM=32, NWG=2, STAGES=3, KT=4, SK=1), dict(BM=8, NWG=4, STAGES=3, KT=4, SK=1),
    dict(BM=128, NWG=2, STAGES=3, KT=2, TMA=0),
], ids=str)
@pytest.mark.parametrize("fmt", [
    (4, 128, "zero_point", torch.float16), (4, 128, "sym", torch.bfloat16), (4, 64, "zero_point", torch.bfloat16),
    (8, 128, "zero_point", torch.float16), (8, 64, "sym", torch.float16),
    # FOLD does not apply (offset, group 32 / 256, per-channel): the request is ignored
    (4, 128, "offset", torch.float16), (4, 32, "zero_point", torch.float16), (4, 256, "sym", torch.float16),
    (8, -1, "zero_point", torch.bfloat16),
], ids=str)
def test_fold(cfg, fmt):
    """FOLD 1: exact q - z in A, each group's fp32 partial scaled into the accumulator. K of 18 / 17 k-tiles leaves
    a partial last stage (a group without its pair, or half a group); M tails; split-K slices and stream-K ranges
    that start inside a tile."""
    bits, gs, mode, dtype = fmt
    cfg = dict(cfg, FOLD=1)
    for m, n, k in ((67, 264, 1152), (5, 200, 1088 if gs in (32, 64, -1) else 1152), (130, 1000, 2048)):
        k = k if gs == -1 else -(-k // gs) * gs
        _run(m, n, k, bits, gs, mode, dtype, config=cfg)


def _h100_small_m_entries():
    """The small-M W4 entries of the H100 table (FOLD without stream-K, BM 8 / 16 / 32)."""
    from mixgemm.tuning import load_table

    w4g = load_table("h100")["wgmma"]["w4g"]
    return [(f"{e.measured[0]}x{e.measured[1]}", int(b), cfg) for e in w4g
            if e.measured in ((8192, 28672), (28672, 8192), (4096, 14336))
            for b, cfg in e.value.items() if int(b) <= 32]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("entry", _h100_small_m_entries(), ids=lambda e: f"{e[0]}-M{e[1]}")
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16), (4, 128, "sym", torch.bfloat16),
                                 (4, 64, "zero_point", torch.float16), (4, 32, "sym", torch.float16)], ids=str)
def test_h100_small_m_entries(entry, fmt):
    """The shipped H100 small-M configs (any sm_90 runs them) on odd shapes at every M of their bucket's range:
    M = 1 and 3 on the BM 8 tiles, up to the bucket; N = 1000 leaves a partial warpgroup box, K = 2304 / 2240 a partial
    last stage (FOLD, split-K slices that start inside a group)."""
    _, bucket, cfg = entry
    bits, gs, mode, dtype = fmt
    k = 2304 if gs != 32 else 2240
    for m in sorted({1, 3, max(1, bucket // 2 + 1), bucket}):
        _run(m, 1000, k, bits, gs, mode, dtype, config=cfg, seed=m)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m,n,k,cfg", [
    (300, 520, 1152, dict(BM=128, NWG=2, STAGES=4)),  # partial row and column boxes
    (1, 200, 512, dict(BM=16, NWG=1, STAGES=4, KT=4)),  # one row; N = 200: the last warpgroup box is 8 columns wide
    (257, 136, 640, dict(BM=256, NWG=2, STAGES=4, INFLIGHT=2)),  # the second warpgroup's box starts past N
    (77, 1000, 768, dict(BM=64, NWG=4, STAGES=3, KT=2)),
    (129, 264, 1024, dict(BM=32, NWG=2, STAGES=4, KT=4, FOLD=1)),
], ids=str)
@pytest.mark.parametrize("fmt", [(4, 128, "zero_point", torch.float16, "relu6"), (8, -1, "sym", torch.bfloat16, None),
                                 (4, 64, "offset", torch.bfloat16, "relu")], ids=str)
def test_tma_store_epilogue(m, n, k, cfg, fmt):
    # TSTORE 1 (stmatrix into the freed ring + one TMA store per warpgroup) against TSTORE 0 (one store per element):
    # the same fp32 values through the same bias / clamp / rounding, so equal bit for bit, and both right
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    bits, gs, mode, dtype, act = fmt
    qw = _qw(n, k, bits, gs, mode, "cuda", 3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(m, k, generator=g).to("cuda", dtype)
    b = (torch.randn(n, generator=g) * 0.1).to("cuda", torch.float32)
    lo, hi = ACTS[act]
    y1 = gemm_wgmma(x, qw, b, lo, hi, {**cfg, "TSTORE": 1})
    y0 = gemm_wgmma(x, qw, b, lo, hi, {**cfg, "TSTORE": 0})
    assert torch.equal(y1, y0)
    ref = ref_matmul(x, qw, b, act, out_dtype=torch.float64)
    assert float((y1.double() - ref).norm() / ref.norm()) <= TOL[dtype]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_clamp_keeps_nan(dtype, act):
    # the TMA-store epilogue clamps the rounded 16-bit pairs with NaN-propagating min / max: a NaN in x must reach
    # its output row through relu / relu6 (as torch.clamp), exactly as the per-element epilogue's compares do
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    qw = _qw(256, 256, 4, 128, "sym", "cuda", 5)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(6)).to("cuda", dtype)
    x[3, 5] = float("nan")
    lo, hi = ACTS[act]
    cfg = dict(BM=64, NWG=2, STAGES=4)
    y1 = gemm_wgmma(x, qw, None, lo, hi, {**cfg, "TSTORE": 1})
    y0 = gemm_wgmma(x, qw, None, lo, hi, {**cfg, "TSTORE": 0})
    assert bool(y1[3].isnan().all()) and bool(y0[3].isnan().all())
    rest = torch.arange(64, device="cuda") != 3
    assert torch.equal(y1[rest], y0[rest]) and not bool(y1[rest].isnan().any())
    assert float(y1[rest].min()) >= lo and float(y1[rest].max()) <= hi


@pytest.mark.gpu
@needs_sm90
def test_tma_store_applies_only_to_addressable_outputs():
    # rows of N = 100 fp16 values are 200 bytes apart (not a multiple of 16): the TMA cannot address them, so the
    # per-element epilogue runs, and for BM = 8; BM = 40 (its last 8-row block goes through stmatrix .x2) does not
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tstore_fits

    y = torch.empty(64, 100, device="cuda", dtype=torch.float16)
    assert not tstore_fits(y, 64, 2, 1 << 20)
    assert tstore_fits(torch.empty(64, 128, device="cuda", dtype=torch.float16), 40, 2, 1 << 20)
    assert not tstore_fits(torch.empty(64, 128, device="cuda", dtype=torch.float16), 8, 2, 1 << 20)  # BM 8
    assert not tstore_fits(torch.empty(64, 128, device="cuda", dtype=torch.float32), 64, 2, 1 << 20)
    assert not tstore_fits(torch.empty(64, 128, device="cuda", dtype=torch.float16), 256, 2, 2 * 256 * 128 - 1024)
    assert tstore_fits(torch.empty(64, 128, device="cuda", dtype=torch.float16), 256, 2, 2 * 256 * 128)
    _run(70, 100, 512, 4, 128, "sym", torch.float16, config=dict(BM=64, NWG=2, STAGES=4))
    _run(70, 200, 512, 4, 128, "sym", torch.float16, config=dict(BM=40, NWG=2, STAGES=4))


@pytest.mark.gpu
@needs_sm90
def test_m_and_k_tails_zero_filled():
    # M not a multiple of BM and K not a multiple of 64: the TMA box reads past both and must bring zeros
    for tma in (1, 0):
        _run(77, 136, 1000, 8, -1, "zero_point", torch.float16, config=dict(BM=64, NWG=2, STAGES=4, TMA=tma))
        _run(130, 200, 4160, 4, 64, "sym", torch.bfloat16, config=dict(BM=128, NWG=1, STAGES=3, TMA=tma))


@pytest.mark.gpu
@needs_sm90
def test_misaligned_and_odd_k():
    # x a view with a 2-byte offset (not 16-byte aligned) and K % 8 != 0: the padded-copy path
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    qw = _qw(96, 100, 8, -1, "sym", "cuda")
    base = torch.randn(5, 101, device="cuda", dtype=torch.float16)
    x = base[:, 1:]
    y = gemm_wgmma(x, qw, None, -float("inf"), float("inf"))
    ref = ref_matmul(x, qw, None, None, out_dtype=torch.float64)
    assert float((y.double() - ref).norm() / ref.norm()) <= TOL[torch.float16]
    _run(33, 96, 160, 4, 32, "zero_point", torch.bfloat16)  # K % 64 != 0 with groups of 32


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_scale_dtypes(scale_dtype):
    _run(65, 136, 768, 4, 128, "offset", torch.float16, scale_dtype=scale_dtype)
    _run(65, 136, 768, 8, -1, "zero_point", torch.bfloat16, scale_dtype=scale_dtype)


@pytest.mark.gpu
@needs_sm90
def test_bad_inputs():
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma

    qw = _qw(64, 128, 4, 64, "sym", "cuda")
    inf = float("inf")
    with pytest.raises(TypeError, match="float16 / bfloat16"):
        gemm_wgmma(torch.randn(4, 128, device="cuda"), qw, None, -inf, inf)
    with pytest.raises(ValueError, match="K=128"):
        gemm_wgmma(torch.randn(4, 64, device="cuda", dtype=torch.float16), qw, None, -inf, inf)
    with pytest.raises(ValueError, match="shared memory"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw, None, -inf, inf,
                   dict(BM=256, NWG=2, STAGES=8))
    with pytest.raises(ValueError, match="TMA=1"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw, None, -inf, inf,
                   dict(BM=32, NWG=3, STAGES=4, TMA=1))
    with pytest.raises(ValueError, match="SK 0, 1 or 2"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw, None, -inf, inf,
                   dict(BM=32, NWG=2, STAGES=4, TMA=0, SK=1))
    with pytest.raises(ValueError, match="not with CLUSTER 1"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw, None, -inf, inf,
                   dict(BM=32, NWG=2, STAGES=4, SPLIT=2, CLUSTER=1, SERIAL=1))
    with pytest.raises(ValueError, match="WS 0 or 1 \\(1 with TMA 1 and MINB 1"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw, None, -inf, inf,
                   dict(BM=32, NWG=2, STAGES=4, MINB=2, WS=1))
    with pytest.raises(ValueError, match="bias"):
        gemm_wgmma(torch.randn(4, 128, device="cuda", dtype=torch.float16), qw,
                   torch.zeros(63, device="cuda"), -inf, inf)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("bits,gs,dtype", [(4, 128, torch.float16), (8, -1, torch.bfloat16), (8, 32, torch.float16)])
def test_dispatch_uses_wgmma(bits, gs, dtype):
    """Past the GEMV, fp16 / bf16 on sm_90 go to the wgmma GEMM with the shipped table config (STAGES fitted)."""
    import mixgemm
    from mixgemm.ops.dispatch import pick_kernel

    qw = _qw(4096, 1024, bits, gs, "zero_point", "cuda", scale_dtype=torch.float32)
    for m in (17, 64, 300):
        assert pick_kernel(m, 4096, 1024, qw, torch.device("cuda"), dtype) == "wgmma"
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        y = mixgemm.matmul(x, qw)
        ref = ref_matmul(x, qw, None, None, out_dtype=torch.float64)
        assert float((y.double() - ref).norm() / ref.norm()) <= TOL[dtype]
    assert pick_kernel(64, 4096, 1024, qw, torch.device("cuda"), torch.float32) == "gemm"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("bits,gs", [(4, 128), (8, -1)])
def test_dispatch_crossover_follows_table(bits, gs):
    """The GEMV serves M up to the table's crossover for the GEMM that takes over: the wgmma GEMM for fp16 (per layer
    width), the Triton GEMM for fp32 activations."""
    from mixgemm.ops.dispatch import GEMV_MAX_M, pick_kernel
    from mixgemm.tuning import gemv_max_m, table_for

    dev = torch.device("cuda")
    qw = _qw(64, 256, bits, gs, "zero_point", "cuda")
    for n in (4096, 28672):
        # (the H100 table sends W4 g128 8192x28672 to the wgmma GEMM from M = 1)
        lim = gemv_max_m(table_for(dev), qw, n, k=8192)
        if lim >= 1:
            assert pick_kernel(lim, n, 8192, qw, dev, torch.float16) == "gemv"
        if lim < GEMV_MAX_M:
            assert pick_kernel(lim + 1, n, 8192, qw, dev, torch.float16) == "wgmma"
        lim32 = gemv_max_m(table_for(dev), qw, n, wgmma=False)
        assert pick_kernel(lim32, n, 8192, qw, dev, torch.float32) == "gemv"


@pytest.mark.gpu
@needs_sm90
def test_tma_loader_is_used():
    """The default loader is TMA: building the activation tensor map must not fall back to cp.async here."""
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G

    _run(40, 256, 512, 4, 128, "zero_point", torch.float16, config=dict(BM=64, NWG=2, STAGES=4, TMA=1))
    assert not G._warned, f"tensor map fell back to cp.async: {G._warned}"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tma", [0, 1])
def test_per_channel_scale_in_epilogue_with_split(tma):
    """Per-channel sym / zero_point: exact q - z in A, row scale in the epilogue -- also on split-K partials."""
    cfg = dict(BM=64, NWG=2, STAGES=4, SPLIT=3, TMA=tma)
    _run(300, 520, 1088, 8, -1, "sym", torch.float16, config=cfg)
    _run(129, 264, 1000, 4, -1, "zero_point", torch.bfloat16, config=cfg, scale_dtype=torch.float32)
    _run(129, 264, 1000, 8, -1, "offset", torch.float16, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", [
    dict(BM=128, NWG=2, STAGES=4),                              # TMA-store epilogue, several waves of CTAs
    dict(BM=32, NWG=2, STAGES=3, KT=4, SK=1, PDL=1),            # stream-K (PDL off by default): stages span tiles
    dict(BM=128, NWG=2, STAGES=4, KT=2, SPLIT=4, CLUSTER=1),    # split-K as clusters
    dict(BM=64, NWG=2, STAGES=4, KT=2, SPLIT=3, FOLD=1),        # workspace split-K (zeroed by the kernel before)
    dict(BM=16, NWG=1, STAGES=6, KT=1),                         # more prologue stages than a small M needs
], ids=str)
def test_pdl_dependent_chain(cfg):
    """Programmatic dependent launch (PDL 1): each GEMM reads the output of the kernel right before it (another GEMM
    or a torch elementwise op), eagerly and replayed from a CUDA graph; results equal the PDL-off run bit for bit, so
    no GEMM read its activations, bias or workspace, or wrote its output, before the producer had finished. Stream-K
    and the workspace split-K add partials in a run-dependent order: within the fp16 tolerance instead. The layouts
    are built before the chain (the first launch after a build runs without PDL)."""
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G
    from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

    k = 1024
    qa, qb = _qw(k, k, 4, 128, "zero_point", "cuda", 21), _qw(k, k, 8, -1, "sym", "cuda", 22)
    g = torch.Generator().manual_seed(23)
    x0 = torch.randn(300, k, generator=g).to("cuda", torch.float16)
    ba = (torch.randn(k, generator=g) * 0.1).to("cuda", torch.float16)
    inf = float("inf")

    def chain(x):
        for _ in range(3):
            x = G.gemm_wgmma(x, qa, ba, -inf, inf, cfg)
            x = G.gemm_wgmma(x, qb, None, 0.0, inf, cfg)  # reads the GEMM right before it (PDL on both)
            x = torch.tanh(x * 0.5)  # an elementwise op writes the next GEMM's x
        return x

    chain(x0)  # builds both layouts
    torch.cuda.synchronize()
    assert qa.has_layout(G.LAYOUT) and qb.has_layout(G.LAYOUT)
    exact = not cfg.get("SK") and (cfg.get("SPLIT", 1) == 1 or cfg.get("CLUSTER"))
    assert_pdl_chain_matches(chain, x0, 0.0 if exact else TOL[torch.float16])


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tail_wait", [0, 1])
def test_pdl_chain_tail(tail_wait):
    """TAIL (whole waves, then the partial wave's rows as a cluster split-K launch) in a PDL chain: GEMM -> GEMM ->
    elementwise ..., both GEMMs as TAIL pairs. With WG_CHAIN (TAIL_WAIT 0) the tail launch loads without waiting for
    the first and waits for it only before exiting, so the next GEMM must still see every column of both launches
    and the tail must not read x before its producer finished: bit-equal to the PDL-off chain, eager and in a CUDA
    graph, and within the fp16 tolerance of one launch per GEMM (the split adds its fp32 halves in another order)."""
    from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G
    from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

    k = n = 3840  # 30 column tiles x 5 m-tiles of BM 64: a partial second wave on an H100 (132 SMs) or H100 PCIe
    cfg = dict(BM=64, NWG=2, STAGES=4, TAIL=2, TAIL_WAIT=tail_wait)
    m = 300
    assert G.tail_rows(m, n, cfg, torch.cuda.get_device_properties(0).multi_processor_count)[0]
    qa, qb = _qw(n, k, 4, 128, "zero_point", "cuda", 31), _qw(n, k, 8, -1, "sym", "cuda", 32)
    g = torch.Generator().manual_seed(33)
    x0 = torch.randn(m, k, generator=g).to("cuda", torch.float16)
    ba = (torch.randn(n, generator=g) * 0.1).to("cuda", torch.float16)
    inf = float("inf")

    def chain(x, c=cfg):
        for _ in range(2):
            x = G.gemm_wgmma(x, qa, ba, -inf, inf, c)
            x = G.gemm_wgmma(x, qb, None, -inf, inf, c) * 0.05  # reads the TAIL pair right before it
            x = torch.tanh(x)
        return x

    one = chain(x0, {key: v for key, v in cfg.items() if key not in ("TAIL", "TAIL_WAIT")})  # builds both layouts
    torch.cuda.synchronize()
    y = chain(x0)
    assert float((y.double() - one.double()).norm() / one.double().norm()) < TOL[torch.float16]
    assert_pdl_chain_matches(chain, x0)


def test_sk2_staging_pieces():
    """SK 2's staging buffer: the whole tile where it fits beside the ring, else the largest even divisor of BM / 8
    that does, else the whole tile (the ring is cut to fit); every piece size the kernel accepts."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import SMEM_LIMIT, staging_chunk

    assert staging_chunk(128, 2, 3 * 20 * 1024) == 16  # 32 KiB beside 60 KiB of ring
    ring = 5 * 37888  # BM 256 NWG 2 W4 g128 zero point, 5 stages
    assert staging_chunk(256, 2, ring) == 16  # 32 of the 64 KiB fit
    assert staging_chunk(256, 2, 5 * 41984) == 8  # W8: 16 KiB
    assert staging_chunk(256, 2, SMEM_LIMIT - 1024) == 32  # nothing fits: the whole tile, the ring gets cut
    for bm in range(8, 257, 8):
        for ring in range(0, SMEM_LIMIT, 8192):
            d = staging_chunk(bm, 2, ring)
            assert d == bm // 8 or (d % 2 == 0 and (bm // 8) % d == 0)

