"""An inductor graph pass: ``mixgemm.rms_norm(a + b, ...)`` becomes ``mixgemm.add_rms_norm(a, b, ...)``, whose first
output replaces the sum everywhere else.

Why: in a decoder layer the residual add comes right before the norm (``h = residual + attn_out; norm(h)``). For a
norm of its own torch.compile fuses the two into one kernel; a norm computed by mixgemm's norm kernel (the norms that
feed mixgemm layers, mixgemm.nn.norms) would otherwise leave the add in a kernel of its own, one more
kernel per norm on the decode step's critical path. The pass sees the traced graph, so it finds the add whatever the
model's source calls it.

Installed as inductor's ``post_grad_custom_post_pass`` (next to one already there, which keeps running) when
mixgemm.nn.norms gives a norm that kernel; it changes only ``mixgemm.rms_norm`` nodes whose input is an
``aten.add.Tensor`` of two tensors of the sum's shape and dtype.
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files


def fuse_residual_adds(graph: fx.Graph) -> int:
    """Rewrite every rms_norm(add(a, b), w, eps, perm) of ``graph`` in place; returns how many."""
    norm_op = torch.ops.mixgemm.rms_norm.default
    fused_op = torch.ops.mixgemm.add_rms_norm.default
    order = {node: i for i, node in enumerate(graph.nodes)}
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not norm_op or node.kwargs:
            continue
        add = node.args[0]
        if not (isinstance(add, fx.Node) and add.op == "call_function" and add.target is torch.ops.aten.add.Tensor
                and len(add.args) == 2 and not add.kwargs and all(isinstance(t, fx.Node) for t in add.args)):
            continue
        vals = [t.meta.get("val") for t in (*add.args, add)]
        if not all(isinstance(v, torch.Tensor) for v in vals) or len({(tuple(v.shape), v.dtype) for v in vals}) != 1:
            continue  # (a broadcast or type-promoting add is not the kernel's)
        first_use = min(add.users, key=order.__getitem__)
        args = (*add.args, *node.args[1:])
        if any(isinstance(t, fx.Node) and order[t] >= order[first_use] for t in args):
            continue
        with graph.inserting_before(first_use):
            fused = graph.call_function(fused_op, args)
            h = graph.call_function(operator.getitem, (fused, 0))
            y = graph.call_function(operator.getitem, (fused, 1))
        fake_args = [t.meta["val"] if isinstance(t, fx.Node) else t for t in args]
        fake_mode = torch._guards.detect_fake_mode(fake_args)
        if fake_mode is not None:
            with fake_mode:
                fused.meta["val"] = fused_op(*fake_args)
            h.meta["val"], y.meta["val"] = fused.meta["val"]
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        add.replace_all_uses_with(h)
        graph.erase_node(add)
        order = {n: i for i, n in enumerate(graph.nodes)}
        done += 1
    return done


class FuseNormAdd(CustomGraphPass):
    """fuse_residual_adds as an inductor custom pass (its uuid: this file, for inductor's graph cache)."""

    def __call__(self, graph: fx.Graph) -> None:
        fuse_residual_adds(graph)

    def uuid(self):
        return get_hash_for_files((__file__,))


class _Both(CustomGraphPass):
    """A pass that was installed before, then ours."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, graph: fx.Graph) -> None:
        self.first(graph)
        self.second(graph)

    def uuid(self):
        first = self.first.uuid() if isinstance(self.first, CustomGraphPass) else None
        return None if first is None else (first, self.second.uuid())


PASS = FuseNormAdd()


def install() -> None:
    """Make inductor run the pass after its post-grad passes (once; a pass already installed keeps running first)."""
    from torch._inductor import config

    current = config.post_grad_custom_post_pass
    if current is PASS or (isinstance(current, _Both) and current.second is PASS):
        return
    config.post_grad_custom_post_pass = PASS if current is None else _Both(current, PASS)
