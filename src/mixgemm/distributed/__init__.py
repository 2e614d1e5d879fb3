"""Tensor parallelism for quantized models through torch.distributed (DeviceMesh, parallelize_module).

* ``ColwiseParallel`` / ``RowwiseParallel``: torch's parallel styles, same options, that also shard QuantLinear
  (mixgemm.distributed.styles); float nn.Linear / nn.Embedding layers go to torch's implementation.
  ``PackedColwiseParallel`` / ``ExpertsParallel``: transformers' "packed_colwise" and "moe_tp_experts" for quantized
  mixture-of-experts modules (every expert's intermediate features split, the experts' output summed);
  ``LocalExpertsParallel`` / ``ExpertDispatchParallel``: "grouped_gemm" and "ep_dispatch_experts", expert
  parallelism (each rank keeps whole experts; ``model_ep_plan(model)`` is the plan to pass to tensor_parallel_).
* ``tensor_parallel_(model, device_mesh)``: applies a Hugging Face model's own ``base_model_tp_plan`` with them
  (mixgemm.distributed.plan).
* ``shard_quantized_weight`` / ``shard_quant_linear`` / ``check_split``: the split itself, pure functions of
  (weight, rank, world size) (mixgemm.distributed.shard).

Each rank runs the single-GPU kernels on its shard; the all-reduce / all-gather come from torch.distributed.
"""

from mixgemm.distributed.plan import TensorParallelReport, model_ep_plan, model_tp_plan, tensor_parallel_
from mixgemm.distributed.shard import check_split, shard_quant_linear, shard_quantized_weight
from mixgemm.distributed.styles import (
    ColwiseParallel,
    ExpertDispatchParallel,
    ExpertsParallel,
    LocalExpertsParallel,
    PackedColwiseParallel,
    RowwiseParallel,
)

__all__ = [
    "ColwiseParallel",
    "ExpertDispatchParallel",
    "ExpertsParallel",
    "LocalExpertsParallel",
    "PackedColwiseParallel",
    "RowwiseParallel",
    "TensorParallelReport",
    "check_split",
    "model_ep_plan",
    "model_tp_plan",
    "shard_quant_linear",
    "shard_quantized_weight",
    "tensor_parallel_",
]
