"""``cuda_conv_wgmma``: sm_90, fp16 / bf16 channels_last, Ci % 64 == 0, groups 1: the wgmma implicit GEMM
(conv_wgmma.py: im2col TMA loads into the weight-only GEMM's pipeline, kernels/cuda/gemm_wgmma.cu), unless the GPU's
conv sweep measured the layer faster below."""

from __future__ import annotations

import torch

from mixgemm.kernels.cuda_conv_wgmma.conv_waves import conv_waves_of
from mixgemm.kernels.registry import OK, KernelEntry, Problem, no, prefer_not

NAME = "cuda_conv_wgmma"


def can_run(p: Problem):
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import conv_wgmma_supported

    c = p.conv
    if not p.device.is_cuda:
        return no("needs a CUDA device")
    if not conv_wgmma_supported(c.x, c.weight, c.stride, c.padding, c.dilation, c.groups):
        return no("needs sm_90, fp16 / bf16 channels_last input with Ci % 64 == 0, groups 1, stride <= 8 and "
                  "padding / dilation within the im2col map's corner range")
    measured, cfg = _tuned(p)
    if measured and cfg is None:
        return prefer_not("this GPU's conv sweep measured the layer faster on the kernels below (tuning)")
    return OK


def _tuned(p: Problem):
    from mixgemm.kernels.triton.conv_common import tuned_wgmma_choice

    return tuned_wgmma_choice(torch.device(p.device.type, p.device.index), p.conv.weight, p.conv.stride, p.m)


def config(p: Problem) -> dict:
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import conv_config
    from mixgemm.tuning import conv_table
    from mixgemm.tuning.buckets import SourcedConfig

    tuned = _tuned(p)[1]
    cfg = conv_config(p.m, p.n, p.k, tuned, p.device.sm_count, conv_waves_of(p.device))
    if tuned is None:
        return cfg
    key = conv_table.layer_key(p.conv.weight, p.conv.stride, 1, p.m)
    return SourcedConfig(cfg, conv_table.measured_on(p.device.name, key, wgmma=True))


def run(x, qweight, bias, out, stride, padding, dilation, groups, lo, hi, activation, config):
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import conv_wgmma

    return conv_wgmma(x, qweight, bias, stride, padding, dilation, lo, hi, config)


def prepare(p: Problem, qweight, config):
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import prepare_conv_wgmma

    c = p.conv
    return prepare_conv_wgmma(c.x, qweight, c.stride, c.padding, c.dilation, config)


ENTRY = KernelEntry(NAME, "conv", can_run, config, run, doc="wgmma implicit GEMM", prepare=prepare)
