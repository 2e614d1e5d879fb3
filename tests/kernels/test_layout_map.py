"""mixgemm.kernels.layouts is the one map from a weight-only linear layout's name to its builder: every layout an
entry reads is in it (the same Layout object), and the resident ones read their codes back."""

from __future__ import annotations

import torch

from mixgemm import quantize_weight
from mixgemm.formats.weight import RESIDENT_LAYOUTS
from mixgemm.kernels import layouts
from mixgemm.kernels.registry import entries


def test_every_entry_reads_a_mapped_layout():
    for e in entries("linear"):
        names = set(e.reads_any) | ({e.layout.name} if e.layout is not None else set())
        assert names <= set(layouts.BY_NAME), e.name
        if e.layout is not None:
            assert layouts.BY_NAME[e.layout.name] is e.layout


def test_resident_layouts_registered_by_the_map_round_trip():
    qw = quantize_weight(torch.randn(64, 128), bits=8, group_size=-1)
    for name in ("wgmma_v1", "rows_v1"):
        lay = RESIDENT_LAYOUTS[name].build(qw)
        assert torch.equal(RESIDENT_LAYOUTS[name].codes(lay), qw.codes()), name


def test_layouts_hold_a_zero_group_for_every_padded_k():
    """Groups of 32 with K % 64 == 32: the 64-k tiles' padded half reads a group of its own, which every layout read
    in 64-k tiles holds, zero (before, the kernels read the next rows' or unallocated parameters there: a non-finite
    value times the padded zero activations broke ConvNeXt-T's 96-channel Linears)."""
    from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1
    from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1

    for bits, mode in ((4, "sym"), (4, "zero_point"), (8, "offset")):
        qw = quantize_weight(torch.randn(136, 96), bits=bits, group_size=32, mode=mode)
        wg = build_wgmma_v1(qw)
        assert wg.num_groups == 4 and wg.params.shape[1] == 4
        assert torch.equal(wg.params[:, 3], torch.zeros_like(wg.params[:, 3]))
        assert torch.equal(wg.params[:, :3].float().abs().sum(), wg.params.float().abs().sum())
        if bits == 4:
            mma = build_gemv_mma_v1(qw)
            assert mma.num_groups == 4 and mma.params.shape[:2] == (136, 4)
            assert torch.equal(mma.params[:, :3], qw.layout("gemv_v2", None).params)
            assert not mma.params[:, 3].any()
