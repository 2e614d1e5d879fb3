"""QuantLinears that read one tensor (q / k / v after the attention norm, gate / up after the MLP norm) run as one
launch in compiled one-row decoding.

Which layers share their input is read from the forward sources, as for the norms (mixgemm.nn.norms: a norm whose
output only these layers read, each called with it alone). At batch 1 the small k / v GEMVs run far from the copy
floor, and each launch has its ramp and tail: one GEMV over the joined rows takes about half the GPU time of q, k and
v one by one (H100, W4 g128, CUDA graph: Qwen2-7B shapes 10.5 -> 5.1 us, Llama-3-8B shapes 8.9 -> 5.2, Qwen2.5-1.5B
5.9 -> 2.1; gate / up 0.6-1.05x).

Where every layer of such a group keeps one resident layout (``wgmma_v1``, QuantLinear.compact_) on a GPU, with N a
multiple of the layout's 128-row block (the last layer excepted), their layouts become row slices of one buffer: the
layout is N-major in 128-row blocks, so a layer's slice is its own layout, byte for byte, and no byte is held twice.
Under torch.compile (``torch.compiler.is_compiling()``), the first layer called with a one-row input runs the group's
product through a hidden QuantLinear over the joined layout (the same op, dispatcher and call plans) and returns its
columns; the others, called with the same traced tensor, return theirs (a one-row output's column slice is
contiguous). In eager mode each layer runs by itself on its slice: there decoding is host-bound, and the joined call's
bookkeeping cost about what the saved calls did (docs/architecture.md). More rows, autograd and another input run layer
by layer too.

The join is made when the last member is compacted on the GPU (quantize_, from_pretrained, a move, a reload) and
dropped when a member's weight tensors are replaced or assigned (QuantLinear._weight_changes, __setattr__), so a
compiled function's guards on the group see the change. A member's parameters edited in place (an in-place op on its
scales or bias) are not seen by compiled calls of the joined layer, which read the layout as it was joined; the
layers one by one see such an edit where no CUDA graph was captured.
The group is not part of the state dict, nor of pickles and copies (QuantLinear.__getstate__ leaves it out): a copy
runs its layers one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from mixgemm.formats.layouts import GROUP_TILES, ROWS
from mixgemm.formats.packing import packed_width
from mixgemm.formats.weight import QuantizedWeight, stand_in
from mixgemm.kernels.cuda_wgmma.layout import WgmmaLayout
from mixgemm.nn.linear import SIBLINGS_ATTR, QuantLinear
from mixgemm.ops.custom_ops import cache_weight, drop_cached
from mixgemm.ops.dispatch import plans_of
from mixgemm.ops.kept_launches import forget

LAYOUT = "wgmma_v1"
ROW_BLOCK = GROUP_TILES * ROWS  # wgmma_v1's row block ([N_pad / 128, ...]): every member but the last fills its own
# Devices where layouts are joined. The CPU's compiled code is not launch-bound; tests add "cpu" to exercise the logic.
JOIN_ON = ("cuda",)


@dataclass(eq=False)
class SiblingGroup:
    """QuantLinears fed one tensor, in the order of their columns in the joined output; ``names`` for reports."""

    members: list[QuantLinear]
    names: list[str]
    joined: QuantLinear | None = field(default=None, init=False)  # the hidden layer over the joined layout
    # each member's columns of the joined output, from the members' N when joined (tensor-parallel sharding changes it)
    columns: list[tuple[int, int]] = field(default_factory=list, init=False)
    # while a traced step runs the group: (x, the joined output, which members took their columns)
    _traced: tuple | None = field(default=None, init=False)

    def traced_output(self, member: QuantLinear, x: torch.Tensor) -> torch.Tensor | None:
        """Under torch.compile: member's columns of the joined product for x (run by the first member called with this
        x), or None (not joined, more than one row, autograd to record): the member runs by itself."""
        if self.joined is None or x.dim() == 0 or x.numel() != x.shape[-1] or (torch.is_grad_enabled() and (
                x.requires_grad or any(layer.bias is not None and layer.bias.requires_grad for layer in self.members))):
            return None  # (the joined layer's plain parameters are stand-ins: its backward would read them)
        i = next(j for j, layer in enumerate(self.members) if layer is member)
        a, b = self.columns[i]
        st = self._traced
        if st is not None and st[0] is x and not st[2][i]:
            taken = st[2][:i] + (True,) + st[2][i + 1:]
            self._traced = None if all(taken) else (x, st[1], taken)
            return st[1][..., a:b]
        # a new input (or the same one again): its own product; pending columns of another input are dropped, their
        # layers run this same way when called (a state left over from a step that skipped a member cannot stall it)
        y = self.joined(x)
        self._traced = (x, y, tuple(j == i for j in range(len(self.members))))
        return y[..., a:b]

    def release(self) -> None:
        """Drop the joined layer (a member's weight tensors are being replaced: QuantLinear calls this). The members
        keep their slices, which stay correct; try_join joins the layouts again."""
        if self.joined is not None:
            drop_cached(self.joined._buffers["qweight"])  # (the weight cached on it refers to it: a cycle until gc)
        self.joined, self._traced = None, None

    def try_join(self) -> bool:
        """Make the members' resident layouts row slices of one buffer and the hidden layer over it, where every
        member keeps wgmma_v1 on one device of JOIN_ON and the layouts line up; True when joined."""
        if self.joined is not None:
            return True
        device = self.members[0].scales.device
        if device.type not in JOIN_ON or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return False
        qws = []
        for layer in self.members:
            if layer.scales.device != device or layer.compact != LAYOUT:
                return False
            qws.append(layer.quantized_weight())
        if len({layer.bias.dtype for layer in self.members if layer.bias is not None}) > 1:
            return False
        lays = [qw._layouts[LAYOUT] for qw in qws]
        first = lays[0]
        if any(getattr(lay, f) != getattr(first, f) for lay in lays for f in JOIN_FIELDS) \
                or any(lay.n % ROW_BLOCK for lay in lays[:-1]):
            return False
        weight, params = join_layouts(self.members, qws, lays)
        n, cols = 0, []
        for lay in lays:
            cols.append((n, n + lay.n))
            n += lay.n
        self.columns = cols
        self.joined = _hidden_layer(self.members, qws[0], replace(first, weight=weight, params=params, n=n))
        self._traced = None
        return True


# the wgmma_v1 fields in which layouts joined as row slices of one buffer must agree (N may differ)
JOIN_FIELDS = ("k", "k_padded", "bits", "mode", "group_size", "num_groups", "gk")


def join_layouts(members: list[QuantLinear], qws: list[QuantizedWeight], lays: list[WgmmaLayout]):
    """Make the members' wgmma_v1 layouts ``lays`` (of their weights ``qws``) row slices of one buffer, in member
    order, and return its (weight, params). Each member's layout is replaced by its slice in the weight's own layout
    table, which copies of the weight object share (replace keeps the dict), so none of them holds the old layout on;
    the call plans and kept launches that held it are dropped."""
    weight = torch.cat([lay.weight for lay in lays])
    params = torch.cat([lay.params for lay in lays])
    block = 0
    for layer, qw, lay in zip(members, qws, lays, strict=True):
        blocks = lay.weight.shape[0]
        qw._layouts[LAYOUT] = replace(lay, weight=weight[block:block + blocks], params=params[block:block + blocks])
        block += blocks
        plans_of(qw).clear()
        forget(layer.__dict__)
    return weight, params


def _hidden_layer(members: list[QuantLinear], qw0: QuantizedWeight, layout: WgmmaLayout) -> QuantLinear:
    """A QuantLinear over the joined layout, in no module tree: its codes are the layout's only (a placeholder
    qweight); its plain parameters are stand-ins on the GPU, whose kernels read the layout's, and on the CPU (tests)
    the members' parameters joined, which its reference path reads."""
    c, k, n = qw0.config, qw0.in_features, layout.n
    dev = layout.weight.device
    hidden = QuantLinear(k, n, bias=False, bits=c.bits, group_size=c.group_size, mode=c.mode,
                         scale_dtype=c.scale_dtype, device="meta")

    def joined(name: str, dtype: torch.dtype) -> torch.Tensor:
        parts = [layer._buffers[name] for layer in members]
        if parts[0].numel() == 0:
            return torch.zeros(0, dtype=dtype, device=dev)
        if dev.type == "cpu":
            return torch.cat(parts)
        return stand_in((n, parts[0].shape[1]), dtype, dev)

    b = hidden._buffers
    b["qweight"] = stand_in((n, packed_width(k, c.bits)), torch.uint8, dev)
    b["scales"] = joined("scales", c.scale_dtype)
    b["zeros"] = joined("zeros", torch.uint8)
    b["offsets"] = joined("offsets", c.scale_dtype)
    biases = [layer.bias for layer in members]
    if any(bias is not None for bias in biases):
        dtype = next(bias.dtype for bias in biases if bias is not None)
        hidden.bias = nn.Parameter(torch.cat([
            bias.detach() if bias is not None else torch.zeros(layer.out_features, dtype=dtype, device=dev)
            for bias, layer in zip(biases, members, strict=True)]), requires_grad=False)
    qw = QuantizedWeight(qweight=b["qweight"], scales=b["scales"], zeros=b["zeros"] if c.mode == "zero_point" else None,
                         offsets=b["offsets"] if c.mode == "offset" else None, config=c, shape=(n, k),
                         _layouts={LAYOUT: layout}, resident=LAYOUT)
    cache_weight(b["qweight"], qw)
    return hidden


def join_siblings(model: nn.Module) -> list[list[str]]:
    """Give the QuantLinears that read one norm's output (mixgemm.nn.norms: q / k / v, gate / up) a SiblingGroup, and
    join their layouts where they are compacted on the GPU already (else when the last of them is), so that compiled
    one-row calls run them as one launch (module docstring). Layers that cannot share a launch are left alone: an
    input permutation, int8 activations, another K or format, biases of two dtypes, more than one N that is not a
    multiple of 128. Returns the groups' layer names; the model computes the same outputs (up to the order of the
    k-split's sums, as any other tile choice). Running it again changes nothing."""
    from mixgemm.nn.norms import norm_consumers

    groups = []
    for _, _, consumers in norm_consumers(model):
        layers = list(consumers)
        if len(layers) < 2 or any(layer.__dict__.get(SIBLINGS_ATTR) is not None for _, layer in layers):
            continue
        first = layers[0][1]
        fmt = (first.in_features, first.config, first.act_mode)
        biases = {layer.bias.dtype for _, layer in layers if layer.bias is not None}
        if first.act_mode is not None or len(biases) > 1 or any(
                (layer.in_features, layer.config, layer.act_mode) != fmt or layer.input_perm is not None
                for _, layer in layers):
            continue
        ragged = [item for item in layers if item[1].out_features % ROW_BLOCK]  # at most one, and it goes last
        if len(ragged) > 1:
            continue
        layers = [item for item in layers if item not in ragged] + ragged
        group = SiblingGroup([layer for _, layer in layers], [name for name, _ in layers])
        for _, layer in layers:
            layer.__dict__[SIBLINGS_ATTR] = group
        group.try_join()
        groups.append(group.names)
    return groups


def separate_siblings(model: nn.Module) -> int:
    """Undo join_siblings: every layer runs by itself again (on its slice of the joined layout until it is moved or
    reloaded). For A/B runs. Returns the number of layers changed."""
    done = 0
    for mod in model.modules():
        if isinstance(mod, QuantLinear) and isinstance(mod.__dict__.get(SIBLINGS_ATTR), SiblingGroup):
            del mod.__dict__[SIBLINGS_ATTR]  # (an expert's stack, mixgemm.nn.expert_stack, stays)
            done += 1
    return done
