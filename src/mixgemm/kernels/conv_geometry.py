"""The conv op's Problem, a convolution's output size and memory format (shared by the conv dispatcher and the conv
entries).

Run contract of the op: ``run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config)``
with the arguments checked (mixgemm.ops.conv.check_conv_inputs), M >= 1, and ``out`` the preallocated
[B, Co, Ho, Wo] output in x's memory format (the paths that produce their own output ignore it).
"""

from __future__ import annotations

import torch

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.registry import ConvShape, Problem, device_info


def conv_output_size(h: int, w: int, kernel_size, stride, padding, dilation) -> tuple[int, int]:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def out_format(x: torch.Tensor) -> torch.memory_format:
    """The reference's rule: channels_last in -> channels_last out (a 1-channel tensor counts as NCHW)."""
    if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1:
        return torch.channels_last
    return torch.contiguous_format


def conv_problem(x: torch.Tensor, qweight: QuantizedConvWeight, m: int, stride, padding, groups,
                 dilation=(1, 1)) -> Problem:
    q = qweight.matrix
    g, ng = q.config.groups(q.in_features)
    shape = ConvShape(qweight.in_channels_per_group, groups, tuple(qweight.kernel_size), tuple(stride),
                      tuple(padding), tuple(dilation), out_format(x) == torch.channels_last, x=x, weight=qweight)
    return Problem("conv", m, qweight.out_channels, q.in_features, x.dtype, device_info(x.device), q.bits, g, ng,
                   q.mode, conv=shape, qw=q)


def conv_race_key(p: Problem, route: str) -> tuple:
    """The key of ``route``'s race on a conv layer: the route, the exact layer (weight, geometry, input shape and memory
    format), format, dtype and GPU."""
    c = p.conv
    w = c.weight
    return (route, p.device.name, p.device.index, w.out_channels, w.in_channels_per_group, tuple(w.kernel_size),
            p.bits, p.group_size, p.mode, c.groups, c.stride, c.padding, c.dilation, tuple(c.x.shape), p.x_dtype,
            c.channels_last_out)


def conv_race_routes(p: Problem, own_run):
    """A conv race's two calls on the call's own input (mixgemm.kernels.race.decision's routes): the rival entry's,
    and ``own_run``'s (a conv entry's run)."""

    def routes(rival):
        c = p.conv
        x, w = c.x, c.weight
        ho, wo = conv_output_size(x.shape[2], x.shape[3], w.kernel_size, c.stride, c.padding, c.dilation)
        out = torch.empty((x.shape[0], w.out_channels, ho, wo), device=x.device, dtype=x.dtype,
                          memory_format=out_format(x))
        inf = float("inf")
        args = (c.stride, c.padding, c.dilation, c.groups, -inf, inf, None)

        def rival_call():
            return rival.entry.run(x, w, None, out, *args, rival.config)

        def own_call():
            return own_run(x, w, None, out, *args, None)

        return rival_call, own_call

    return routes
