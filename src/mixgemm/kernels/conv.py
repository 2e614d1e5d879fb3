"""Convolution with a block-quantized kernel: the registry's entries, in the order the dispatcher tries them. Each
entry lives in its folder (kernels/<name>/: the entry, its host code and source); the op's Problem and run contract
are mixgemm.kernels.conv_geometry, the layout and helpers the conv kernels share mixgemm.kernels.triton.conv_common.

* ``dequant_cudnn``: the weight dequantized + cuDNN, where a race measured it faster than the entry below.
* ``cuda_dwconv`` / ``triton_dwconv``: depthwise (Ci / groups == 1): the CUDA direct conv, else the Triton kernel.
* ``conv_as_matmul``: 1x1 / stride 1 / no padding / groups 1 on channels_last: mixgemm.matmul on the [B*H*W, Ci] view,
  where the conv sweep or a race measured it faster than the entry below.
* ``cuda_conv_wgmma``: the sm_90 wgmma implicit GEMM, unless the conv sweep measured the layer faster below.
* ``triton_conv_smallk``: a few input channels (the 3-channel stems): the whole K in one tile.
* ``triton_conv_igemm``: the Triton implicit GEMM, any stride / padding / dilation / groups.
"""

from __future__ import annotations

from mixgemm.kernels.conv_as_matmul import ENTRY as CONV_AS_MATMUL
from mixgemm.kernels.cuda_conv_wgmma import ENTRY as CUDA_CONV_WGMMA
from mixgemm.kernels.cuda_dwconv import ENTRY as CUDA_DWCONV
from mixgemm.kernels.dequant_cudnn import ENTRY as DEQUANT_CUDNN
from mixgemm.kernels.registry import register
from mixgemm.kernels.triton_conv_igemm import ENTRY as TRITON_CONV_IGEMM
from mixgemm.kernels.triton_conv_smallk import ENTRY as TRITON_CONV_SMALLK
from mixgemm.kernels.triton_dwconv import ENTRY as TRITON_DWCONV

ENTRIES = (DEQUANT_CUDNN, CUDA_DWCONV, TRITON_DWCONV, CONV_AS_MATMUL, CUDA_CONV_WGMMA, TRITON_CONV_SMALLK,
           TRITON_CONV_IGEMM)
# the short path names mixgemm.ops.conv's pick_path / cuda_conv2d(path=...) use
PATH_NAMES = {"cuda_dwconv": "dw_cuda", "triton_dwconv": "dw", "dequant_cudnn": "dequant",
              "cuda_conv_wgmma": "wgmma", "triton_conv_smallk": "smallk", "conv_as_matmul": "matmul",
              "triton_conv_igemm": "igemm"}
BY_PATH = {v: k for k, v in PATH_NAMES.items()}
register("conv", ENTRIES)
