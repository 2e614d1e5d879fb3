"""One projection's experts as one buffer, for the routed GEMV (mixgemm.kernels.cuda.routed_gemv).

A quantized experts module (mixgemm.nn.experts) holds one QuantLinear per expert and projection. Where all E of a
projection keep their codes in ``wgmma_v1`` on one sm_90 GPU (QuantLinear.compact_, the default there) with one
format and shape, ``ExpertStack.join`` makes their layouts slices of one E-strided buffer, as sibling layers' are
(mixgemm.nn.siblings): each expert's layout is its own bytes at its own offset, so no byte is held twice, and every
kernel that ran an expert by itself runs it the same way on its slice. The routed GEMV reads expert ``e`` at offset
``e`` x stride, with the routing read on the GPU.

The join is made when the model is quantized or loaded (mixgemm.nn.experts.join_experts), when the last member of an
attached stack is compacted (a model moved to the GPU) or else on the first routed call, never while a CUDA graph is
being captured: the joined buffer must not be allocated inside a graph's memory pool (torch.compile's CUDA graphs
warm up in theirs), so a model's first compiled step finds its experts joined. It is dropped when a member's
weight tensors are replaced, moved, reloaded or compacted (QuantLinear._weight_changes calls ``release``: the
stack sits in the member's sibling-group slot, whose protocol it follows); the next routed call joins again. A
projection that cannot be joined keeps the reason (``refused``) until then, so the check is not paid per call.
Biases are stacked into one [E, N] copy at the join (the members keep theirs): an in-place edit of a member's bias
is seen by the routed calls only after a release, as for sibling groups' joined layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mixgemm.nn.linear import SIBLINGS_ATTR, QuantLinear
from mixgemm.nn.siblings import JOIN_FIELDS, LAYOUT, join_layouts


@dataclass(eq=False)
class ExpertStack:
    """The E QuantLinears of one experts projection (in expert order) and, once joined, their ExpertLayouts."""

    members: list[QuantLinear]
    stacked: object | None = None  # mixgemm.kernels.cuda.routed_gemv.ExpertLayouts
    refused: str | None = None

    def attach(self) -> None:
        """Put the stack in its members' group slot, so that their weight changes release it."""
        for layer in self.members:
            layer.__dict__[SIBLINGS_ATTR] = self

    # -- the sibling-group protocol QuantLinear calls (mixgemm.nn.siblings) --
    def traced_output(self, member: QuantLinear, x: torch.Tensor) -> None:
        return None  # a member called by itself runs by itself

    def try_join(self) -> bool:
        """Join once the last member is compacted (compact_ asks after each): True when joined."""
        if self.stacked is None and any(layer.compact != LAYOUT for layer in self.members):
            return False
        return self.join() is None

    def release(self) -> None:
        """Drop the joined buffer's use (a member's weights are changing); the members keep their slices, which stay
        correct, and the next routed call joins again."""
        self.stacked, self.refused = None, None

    # -- the routed calls --
    def join(self) -> str | None:
        """Join the members' layouts (module docstring); None when joined (or already), else why they cannot be."""
        if self.stacked is not None:
            return None
        if self.refused is None:
            device = self.members[0].scales.device
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                # (not kept: the next call outside the capture joins)
                return "a CUDA graph is being captured (the join allocates; run a call before capturing)"
            self.refused = self._join()
        return self.refused

    def _join(self) -> str | None:
        first = self.members[0]
        device = first.scales.device
        if device.type != "cuda":
            return f"the experts are on {device}: the routed GEMV runs on CUDA"
        qws = []
        for layer in self.members:
            if layer.scales.device != device:
                return "the experts are on more than one device"
            if layer.act_mode is not None or layer.input_perm is not None:
                return "int8-activation or act-order experts"
            if layer.compact != LAYOUT:
                return f"an expert keeps {layer.compact or 'its plain codes'}, not one {LAYOUT} layout (compact_)"
            qws.append(layer.quantized_weight())
        if len({qw.scales.dtype for qw in qws}) > 1:
            return "the experts' scale dtypes differ"
        biases = [layer.bias for layer in self.members]
        if any(b is None for b in biases) != all(b is None for b in biases) or len(
                {b.dtype for b in biases if b is not None}) > 1:
            return "some experts have a bias and some not, or biases of two dtypes"
        lays = [qw._layouts[LAYOUT] for qw in qws]
        if any(getattr(lay, f) != getattr(lays[0], f) for lay in lays for f in ("n", *JOIN_FIELDS)):
            return "the experts' layouts differ in shape or format"
        from mixgemm.kernels.cuda.routed_gemv import ExpertLayouts

        weight, params = join_layouts(self.members, qws, lays)  # equal N: expert e at e x a fixed stride
        bias = None if biases[0] is None else torch.stack([b.detach() for b in biases])
        self.stacked = ExpertLayouts(replace(lays[0], weight=weight, params=params), len(lays), qws[0].scales.dtype,
                                     bias)
        return None


__all__ = ["ExpertStack"]
