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
