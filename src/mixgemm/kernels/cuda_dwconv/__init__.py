"""``cuda_dwconv``: the CUDA direct depthwise conv (dwconv.cu; host code dwconv.py) for fp16 / bf16 channels_last inputs
with channel multiplier 1 (dwconv.cu says why), on the shared ``conv_triton_v1`` layout."""

from __future__ import annotations

from mixgemm.kernels.registry import OK, KernelEntry, Problem, no

NAME = "cuda_dwconv"


def can_run(p: Problem):
    from mixgemm.kernels.cuda_dwconv.dwconv import dwconv_supported

    if not p.conv.depthwise:
        return no("not depthwise (Ci / groups > 1)")
    if not dwconv_supported(p.conv.x, p.conv.weight, p.conv.groups):
        return no("needs a CUDA fp16 / bf16 channels_last input, channel multiplier 1, even channels and strides, "
                  "int4 / int8 per-channel weights")
    return OK


def config(p: Problem) -> None:
    return None  # the host code picks the tile (dwconv.default_config); kernel_options may force a DwCudaConfig


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.cuda_dwconv.dwconv import dwconv_cuda, dwconv_supported

    if not dwconv_supported(x, qweight, groups, out):
        raise ValueError("conv path 'dw_cuda' needs a CUDA fp16 / bf16 channels_last input with an even channel "
                         "count and even strides, groups == Ci == Co, and int4 / int8 per-channel weights; got "
                         f"{x.dtype} on {x.device}, strides {tuple(x.stride())}, groups={groups}, "
                         f"Co={qweight.out_channels}, group_size={qweight.matrix.group_size}")
    return dwconv_cuda(x, qweight, bias, out, stride, padding, dilation, lo, hi, config)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="CUDA depthwise conv")
