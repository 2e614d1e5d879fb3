"""``mixgemm.from_pretrained``: a transformers causal LM whose Linear layers are QuantLinear, from

* a GGUF file (llama.cpp): ``from_pretrained(dir, gguf_file="model.Q4_K_M.gguf")`` or the file's path;
* a directory written by ``save_pretrained`` from a mixgemm model (``quant_method: "mixgemm"``), or by another
  quantizer whose format is registered in ``mixgemm.checkpoints.formats``;
* a float checkpoint directory with ``quantization_config=mixgemm.W4A16(...)`` (or W8A16 / W8A8 / W4A8): each
  Linear is quantized as it is read, so the float model never exists whole.

The skeleton is built on the meta device and filled tensor by tensor on ``device`` (a tqdm bar shows the
progress). Layers mixgemm cannot hold stay float and are listed with the reason in ``model.mixgemm_report``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from mixgemm.checkpoints import native, skeleton
from mixgemm.checkpoints.base import ConvertedLinear, cast_to, quant_linear
from mixgemm.checkpoints.conversions import (
    RenamedSource,
    fuse_rows,
    fused_expert_tensor,
    name_mapping,
    read_conversions,
    split_quantized,
)
from mixgemm.nn.experts import holds_fused_experts, join_experts, prepare_skeleton
from mixgemm.nn.norms import arrange_act_order, norm_kernels
from mixgemm.nn.siblings import join_siblings


@dataclass
class LoadReport:
    """What from_pretrained did: ``source`` (the format read), ``quantized`` (layer names, with ``inexact`` the ones
    whose weights are a re-quantization, e.g. GGUF Q6_K), ``skipped`` ({name: why} for Linears left float),
    ``ignored`` (checkpoint tensors that the model has no place for), ``perm_folded`` (act-order down projections
    whose input permutation went into their MLP's gate / up rows, mixgemm.nn.fold_perm) and ``perm_at_norms``
    (act-order layers whose input the norm before them gathers under torch.compile, mixgemm.nn.norms),
    ``norm_kernels`` (the other norms that mixgemm's norm kernel computes on CUDA: those feeding QuantLinears, and
    in eager mode the model's other RMSNorms), ``sibling_groups`` (the layers reading one tensor that compiled
    one-row calls run as one launch, mixgemm.nn.siblings) and ``experts_joined`` (the experts modules whose decoding
    runs routed, their layouts joined at load: mixgemm.nn.experts.join_experts). ``dequantized``: {tensor: what} for
    GGUF tensors stored quantized that the model holds as float (embeddings; Linears excluded or tied), with their
    bytes in the file and in the model (a re-saved model stores them as float). ``hqq_inputs``: with a
    quantization_config of method "hqq", what weighed its inputs (none while loading: mixgemm.quantize_ on a float
    model weighs them)."""

    source: str
    quantized: list[str] = field(default_factory=list)
    inexact: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    perm_folded: list[str] = field(default_factory=list)
    perm_at_norms: list[str] = field(default_factory=list)
    norm_kernels: list[str] = field(default_factory=list)
    sibling_groups: list[list[str]] = field(default_factory=list)
    experts_joined: list[str] = field(default_factory=list)
    dequantized: dict[str, str] = field(default_factory=dict)
    hqq_inputs: str = ""

    def __str__(self) -> str:
        lines = [f"from_pretrained ({self.source}): {len(self.quantized)} QuantLinear ({len(self.inexact)} "
                 f"re-quantized), {len(self.skipped)} Linear left float, {len(self.ignored)} tensors ignored"
                 + (f", {len(self.perm_folded)} act-order permutations folded into gate / up" if self.perm_folded
                    else "")
                 + (f", {len(self.perm_at_norms)} act-order layers fed gathered by their norm under torch.compile"
                    if self.perm_at_norms else "")]
        lines += [f"  re-quantized {n}: {why}" for n, why in self.inexact.items()]
        lines += [f"  dequantized {n}: {what}" for n, what in self.dequantized.items()]
        lines += [f"  float {n}: {why}" for n, why in self.skipped.items()]
        if self.hqq_inputs:
            lines.append(f"  HQQ's input weighting: {self.hqq_inputs}")
        return "\n".join(lines)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", disable=not enabled)


def _device(device) -> torch.device:
    return torch.device("cpu" if device is None else device)


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    from mixgemm.nn.linear import QuantLinear

    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, QuantLinear)}


def _tied_names(model: nn.Module) -> dict[str, list[str]]:
    """parameter name -> the other names of the same parameter (tied weights)."""
    out = {}
    for names in skeleton.tied_parameters(model).values():
        for n in names:
            out[n] = [o for o in names if o != n]
    return out


def _fill_rest(model, source, device, dtype, report, bar) -> None:
    """Every skeleton tensor still on the meta device, read by name from ``source`` (tied aliases are tied later)."""
    keys = source.keys()
    tied = _tied_names(model)
    for key, t in skeleton.expected_keys(model).items():
        if not isinstance(t, torch.Tensor) or t.device.type != "meta":
            continue
        if key not in keys:
            if any(o in keys for o in tied.get(key, ())):
                continue
            raise ValueError(f"the checkpoint has no tensor {key!r}, which the model needs")
        value = source.get(key)
        if tuple(value.shape) != tuple(t.shape):
            raise ValueError(f"tensor {key!r} has shape {tuple(value.shape)}, the model expects {tuple(t.shape)}")
        skeleton.check_float(key, value, t)
        skeleton.put_tensor(model, key, cast_to(value, dtype if t.is_floating_point() else None, device))
        bar.update(1)


# A float weight goes to the device this many elements at a time, each slice quantized once it is there: the float
# layer never exists whole on the device and its quantization's temporaries stay a few slices' size.
CHUNK_ELEMENTS = 1 << 23
# Slices read from the checkpoint's files at once: one thread moves a few GB/s from the page cache into pinned memory,
# the copy to the device several times that.
READ_THREADS = 4
SLICES_IN_FLIGHT = READ_THREADS + 2  # pinned slices being read or waiting for their copy to the device


def _slice_rows(k: int) -> int:
    return max(128, CHUNK_ELEMENTS // max(k, 1) // 128 * 128)


def quantize_streamed(weight: torch.Tensor, config, device, name: str):
    """The QuantizedWeight of a float ``weight`` [N, K] (on the CPU) in ``config``'s format, quantized on ``device``
    in slices of rows (row groups are independent, so the result equals quantizing it whole)."""
    rows = _slice_rows(weight.shape[1])
    return _quantize_slices([weight[r:r + rows].to(device) for r in range(0, weight.shape[0], rows)], config, name)


def _quantize_slices(slices, config, name: str):
    from mixgemm.quantize_api import scheme_weight

    return fuse_rows([ConvertedLinear(scheme_weight(s, config)) for s in slices], name).weight


def _read_into(fd: int, buffer: torch.Tensor, offset: int, path: str) -> None:
    """``buffer``'s bytes (uint8, CPU) read from file ``fd`` at ``offset``."""
    view = memoryview(buffer.numpy())
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise OSError(f"{path}: the file ends at byte {offset + done}, inside a tensor its header places there")
        done += got


class _SliceCopier:
    """Copies the float weights of ``layers`` [(name, in_features, out_features)] to ``device`` slice by slice.
    ``layer()`` gives the next layer's (name, why, slices): why (a reason it is not quantized, e.g. not floating
    point) or None with an iterator of its slices on the device. On a GPU a thread hands each slice to one of
    SLICES_IN_FLIGHT pinned buffers ahead of the caller: READ_THREADS threads read the slices whose bytes the source
    locates in its files (``source.extent``) straight into them, others are copied from the memory map; the
    caller's copies to the device are then asynchronous and overlap the quantization of the slices before them."""

    def __init__(self, source, layers, device, cfg):
        import queue
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self.queue = queue.Queue()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.free = queue.Queue()
        self.buffers, self.copied = [], []
        self.files: dict[str, int] = {}
        self.readers = None
        self.stopping = False
        if self.cuda:
            nbytes = CHUNK_ELEMENTS * 4 + max((k for _, k, _ in layers), default=0) * 4 * 128
            for i in range(SLICES_IN_FLIGHT):
                self.buffers.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))
                self.copied.append(None)
                self.free.put(i)
            if hasattr(os, "preadv") and hasattr(source, "extent"):
                self.readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="mixgemm-read")
        self.thread = threading.Thread(target=self._run, args=(source, layers, cfg), daemon=True)
        self.thread.start()

    def _fd(self, path: str) -> int:
        if path not in self.files:
            self.files[path] = os.open(path, os.O_RDONLY)
        return self.files[path]

    def _run(self, source, layers, cfg):
        from mixgemm.quantize_api import _why_not_weight

        try:
            for name, k, n in layers:
                key = f"{name}.weight"
                extent = source.extent(key) if self.readers is not None else None
                # located bytes need no tensor (a stand-in of the shape and dtype, no memory); others are
                # memory-mapped, read as they are copied
                weight = (torch.empty((), dtype=extent.dtype).expand(extent.shape) if extent is not None
                          else source.get(key))
                why = _why_not_weight(weight, k, cfg, set())
                if why is None and tuple(weight.shape) != (n, k):
                    why = f"the checkpoint's weight is {tuple(weight.shape)}, the model expects {(n, k)}"
                rows = _slice_rows(k)
                self.queue.put((name, why, 0 if why else -(-n // rows)))
                for r in range(0, 0 if why else n, rows):
                    if self.stopping:
                        return
                    part = weight[r:r + rows]
                    if not self.cuda:
                        self.queue.put((None, part, None))
                        continue
                    i = self.free.get()
                    if self.copied[i] is not None:
                        self.copied[i].synchronize()  # its last copy to the device has read it
                    raw = self.buffers[i][:part.numel() * part.element_size()]
                    staged = raw.view(part.dtype).view(part.shape)
                    if extent is None:
                        staged.copy_(part)
                        self.queue.put((i, staged, None))
                    else:
                        read = self.readers.submit(_read_into, self._fd(extent.path), raw,
                                                   extent.offset + r * k * part.element_size(), extent.path)
                        self.queue.put((i, staged, read))
        except BaseException as e:  # handed to the caller
            self.queue.put(e)

    def _get(self):
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def _slices(self, count):
        for _ in range(count):
            i, staged, read = self._get()
            if i is None:
                yield staged.to(self.device)
                continue
            if read is not None:
                read.result()
            t = staged.to(self.device, non_blocking=True)
            self.copied[i] = torch.cuda.Event()
            self.copied[i].record()
            self.free.put(i)
            yield t

    def layer(self):
        name, why, count = self._get()
        return name, why, self._slices(count)

    def close(self, stop: bool = False) -> None:
        """Waits for the thread and the reads, and closes the files. stop: the caller gave up (an error), so the
        thread stops at its next slice (every buffer handed back, so it is not left waiting for one)."""
        if stop:
            self.stopping = True
            for i in range(len(self.buffers)):
                self.free.put(i)
        self.thread.join()
        if self.readers is not None:
            self.readers.shutdown(wait=True)
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()


def _quantize_on_load(model, source, config, filter_fn, device, report, bar) -> None:
    """Float checkpoint: each Linear's weight copied to ``device`` in slices on a thread (_SliceCopier) while the
    slices before it are quantized, so the float model never exists on the device and the copies and the
    quantization overlap."""
    tied = _tied_names(model)
    keys = source.keys()
    todo = []
    for name, lin in _linears(model).items():
        if filter_fn is not None and not filter_fn(lin, name):
            report.skipped[name] = "excluded by filter_fn"
        elif tied.get(f"{name}.weight"):
            report.skipped[name] = "weight is shared (tied) with another module; quantizing it would untie it"
        elif f"{name}.weight" in keys:  # (else _fill_rest reports it)
            todo.append((name, lin))
    copier = _SliceCopier(source, [(n, lin.in_features, lin.out_features) for n, lin in todo], device,
                          config.weight_config())
    try:
        _quantize_layers(model, source, config, todo, copier, device, report, bar)
    except BaseException:
        copier.close(stop=True)
        raise
    copier.close()


def _quantize_layers(model, source, config, todo, copier, device, report, bar) -> None:
    from mixgemm.nn.linear import QuantLinear

    for name, lin in todo:
        _, why, slices = copier.layer()
        if why is None:
            try:
                qw = _quantize_slices(slices, config, name)  # each slice quantized as it arrives
            except ValueError as e:
                why = str(e)
                for _ in slices:  # the rest of this layer's slices off the queue
                    pass
        if why is not None:
            report.skipped[name] = why
            continue
        bias = source.get(f"{name}.bias").to(device) if lin.bias is not None else None
        ql = QuantLinear.from_quantized(qw, bias, act_mode=config.act_mode, act_block=config.act_block)
        skeleton.put_module(model, name, ql)
        report.quantized.append(name)
        bar.update(1 + (lin.bias is not None))


def _load_safetensors(path, config, qc, quantization_config, filter_fn, device, dtype, progress, trust_remote_code):
    from mixgemm.checkpoints import formats
    from mixgemm.checkpoints.safetensors_source import SafetensorsSource

    source = SafetensorsSource(path)
    model = skeleton.build(config, trust_remote_code)
    if qc is not None:
        qc = qc if isinstance(qc, dict) else qc.to_dict()
        fmt = formats.find(qc)
        if fmt is None:
            raise ValueError(f"{path}: quantization_config quant_method {qc.get('quant_method')!r} is not a format "
                             f"mixgemm reads (registered: {formats.names()})")
        report = LoadReport(source=fmt.name)
        if dtype is None and torch.device(device).type == "cpu" and fmt.name != native.QUANT_METHOD:
            # GPTQ / AWQ / compressed-tensors store fp16 embeddings and norms; on the CPU fp16 runs neither torch's
            # fast int4 / int8 kernels (bfloat16) nor the exact float32 path
            dtype = torch.bfloat16
        stored_names = fmt.quantized_linears(source, qc)
        # under the model's names (conversions.py): renamed layers, and experts stored per expert and projection
        # (GPTQ / AWQ / compressed-tensors MoE checkpoints) fused into the model's per-expert layers
        mapping = name_mapping(model)
        plain, parts = split_quantized(mapping, stored_names)
        prepare_skeleton(model, [*plain, *parts])  # fused experts: their per-expert layer placeholders
        linears = _linears(model)
        conv = read_conversions(mapping, source.keys())
        view = source if conv is None else RenamedSource(source, conv)
        total = len(skeleton.expected_keys(model))
        with _progress(total, f"mixgemm: loading {fmt.name}", progress) as bar:
            for name, stored in [*((n, [s]) for n, s in plain.items()), *parts.items()]:
                if name not in linears:
                    raise ValueError(f"{path}: the checkpoint quantizes {stored[0]!r}, which is not a Linear of the "
                                     f"model" + (f" (its {name!r})" if name != stored[0] else ""))
                converted = fuse_rows([fmt.convert_linear(source, s, qc) for s in stored], name)
                skeleton.put_module(model, name, quant_linear(converted, linears[name], name, device, dtype))
                report.quantized.append(name)
                bar.update(1)
            _fill_rest(model, view, device, dtype, report, bar)
        # a quantized layer's tensors, under its stored name and its renamed one, are not "ignored"
        prefixes = tuple({f"{n}." for n in report.quantized} | {f"{n}." for n in stored_names} | (
            set() if mapping is None else {mapping.rename(f"{n}.weight")[:-len("weight")] for n in stored_names}))
        model_keys, stored = set(skeleton.expected_keys(model)), view.keys()
        report.ignored = [k for k in stored if k not in model_keys and not k.startswith(prefixes)]
    else:
        if quantization_config is None:
            raise ValueError(f"{path} holds a float checkpoint: pass quantization_config=mixgemm.W4A16() (or W8A16, "
                             "W8A8, W4A8) to quantize it while loading")
        report = LoadReport(source=f"float, quantized on load to {quantization_config.name}")
        # checkpoints under their original names (conversions.py): read through the model's names
        conv = read_conversions(name_mapping(model), source.keys())
        view = source if conv is None else RenamedSource(source, conv)
        total = len(skeleton.expected_keys(model))
        with _progress(total, "mixgemm: loading and quantizing", progress) as bar:
            _quantize_on_load(model, view, quantization_config, filter_fn, device, report, bar)
            fused = _quantize_experts_on_load(model, view, conv, source.get, quantization_config, filter_fn, device,
                                              dtype, report, bar)
            _fill_rest(model, view, device, dtype, report, bar)
        model_keys = set(skeleton.expected_keys(model)) | fused
        stored, prefixes = view.keys(), tuple(n + "." for n in report.quantized)
        report.ignored = [k for k in stored if k not in model_keys and not k.startswith(prefixes)]
    return model, report


def _quantize_experts_on_load(model, source, conv, read, config, filter_fn, device, dtype, report, bar) -> set[str]:
    """Fused experts modules one at a time: their 3-D parameters read (fused on disk, or built from the per-expert
    tensors ``conv`` lists, read by checkpoint key with ``read``), put in place on ``device`` and the module quantized
    before the next is read, so the float experts of one module are all that is held at once. A module left float
    (filter_fn, or quantize_ cannot take it) keeps them, in ``dtype``; one whose tensors are missing is left for
    _fill_rest to report. Returns the fused parameters' keys it read."""
    from mixgemm.quantize_api import quantize_experts_module

    keys, read_keys = source.keys(), set()
    for name, mod in [(n, m) for n, m in model.named_modules() if n and holds_fused_experts(m)]:
        for attr, t in list(mod._parameters.items()):
            key = f"{name}.{attr}"
            if t is None or t.device.type != "meta":
                continue
            if key in keys:
                value = source.get(key)
            elif conv is not None and key in conv.experts:
                value = fused_expert_tensor(conv, key, t.shape[0], read)
            else:
                continue
            if tuple(value.shape) != tuple(t.shape):
                raise ValueError(f"tensor {key!r} has shape {tuple(value.shape)}, the model expects {tuple(t.shape)}")
            skeleton.put_tensor(model, key, value.to(device))
            read_keys.add(key)
            bar.update(1)
        if any(t is not None and t.device.type == "meta" for t in mod._parameters.values()):
            continue  # (_fill_rest names the missing tensor)
        excluded: list[str] = []
        # compact=False: from_pretrained compacts every layer as its ``compact`` says
        quantize_experts_module(name, mod, config, filter_fn, set(), False, report.quantized, report.skipped,
                                excluded)
        report.skipped.update(dict.fromkeys(excluded, "excluded by filter_fn"))
        if dtype is not None and holds_fused_experts(mod):  # left float: in the model's dtype
            for attr, t in list(mod._parameters.items()):
                if t is not None and t.is_floating_point():
                    mod._parameters[attr] = nn.Parameter(t.to(dtype), requires_grad=False)
    return read_keys


def _load_gguf(directory, file_name, quantization_config, filter_fn, device, dtype, progress, config_kwargs,
               requantize_bits: int = 8):
    from transformers import AutoConfig

    from mixgemm.checkpoints import gguf_experts, gguf_file
    from mixgemm.ggml.gguf_types import FLOAT_TYPES

    path = os.path.join(directory, file_name)
    reader = gguf_file.open_reader(path)
    config = AutoConfig.from_pretrained(directory, gguf_file=file_name, **config_kwargs)
    arch = gguf_file.architecture(reader)
    for attr, value in gguf_file.config_fixes(reader, arch, config, config_kwargs).items():
        setattr(config, attr, value)
    model = skeleton.build(config)
    processor = gguf_file.tensor_processor(arch, config)
    names = gguf_file.name_map(model, processor, arch)
    linears = _linears(model)
    tied = _tied_names(model)
    if dtype is None:
        # on the CPU torch's int4 / int8 kernels run bfloat16 activations (float32 takes the dequantize-per-call path,
        # several times slower than a float model); on a GPU float32 as the file's float tensors are
        dtype = torch.bfloat16 if torch.device(device).type == "cpu" else torch.float32
    report = LoadReport(source=f"GGUF {file_name}")
    float_linears = []
    experts = gguf_experts.GgufExperts(model, names)
    with _progress(len(reader.tensors), f"mixgemm: loading {file_name}", progress) as bar:
        for tensor in reader.tensors:
            key = names.get(tensor.name)
            taken = key is None and experts.take(tensor)  # a 3-D expert tensor: its module loads once complete
            if taken:
                if isinstance(taken, str):
                    experts.load(taken, processor, quantization_config, filter_fn, device, dtype, requantize_bits,
                                 report)
                bar.update(1)
                continue
            if key is None:
                report.ignored.append(tensor.name)
                bar.update(1)
                continue
            layer, _, attr = key.rpartition(".")
            qtype = tensor.tensor_type.name
            if layer in linears and attr == "weight" and qtype not in FLOAT_TYPES:
                excluded = filter_fn is not None and not filter_fn(linears[layer], layer)
                if excluded or tied.get(key):
                    why = "excluded by filter_fn" if excluded else "weight is shared (tied) with another module"
                    report.skipped[layer] = f"{why}; dequantized to {dtype}"
                    value = gguf_file.float_tensor(tensor, processor).to(dtype)
                    report.dequantized[key] = _dequantized_note(tensor, value)
                    skeleton.put_tensor(model, key, value.to(device))
                else:  # types without a QuantLinear format raise here, naming the tensor and its type
                    qw, exact = gguf_file.quantized_weight(tensor, processor, requantize_bits)
                    lin = linears[layer]
                    conv = ConvertedLinear(weight=qw, bias=lin.bias)  # a meta bias: filled when its tensor comes
                    skeleton.put_module(model, layer, quant_linear(conv, lin, layer, device))
                    report.quantized.append(layer)
                    if not exact:
                        report.inexact[layer] = f"GGUF {qtype} re-quantized to {qw.bits}-bit group {qw.group_size}"
            else:
                value = gguf_file.float_tensor(tensor, processor).to(dtype)
                if qtype not in FLOAT_TYPES:
                    report.dequantized[key] = _dequantized_note(tensor, value)
                if layer in linears and attr == "weight":
                    float_linears.append(layer)
                skeleton.put_tensor(model, key, value.to(device))
            bar.update(1)
    if experts.missing():
        raise ValueError(f"{path}: the GGUF file lacks expert tensors of {experts.missing()} (ffn_gate_exps and "
                         f"ffn_up_exps make gate_up_proj, ffn_down_exps down_proj; it has others of the same layers)")
    for layer in float_linears:
        if quantization_config is None:
            report.skipped[layer] = "stored as float in the GGUF file (pass quantization_config to quantize it)"
            continue
        if tied.get(f"{layer}.weight"):
            report.skipped[layer] = "weight is shared (tied) with another module; quantizing it would untie it"
            continue
        _quantize_float_linear(model, layer, quantization_config, filter_fn, report)
    for layer in linears:
        if layer not in report.quantized and layer not in report.skipped and tied.get(f"{layer}.weight"):
            report.skipped[layer] = "weight is shared (tied) with another module"
    return model, report


def _dequantized_note(tensor, value: torch.Tensor) -> str:
    return (f"GGUF {tensor.tensor_type.name}, {int(tensor.n_bytes)} bytes in the file, "
            f"{value.numel() * value.element_size()} as {value.dtype} in the model")


def _quantize_float_linear(model, layer, config, filter_fn, report) -> None:
    from mixgemm.quantize_api import _why_not, quantize_linear

    lin = model.get_submodule(layer)
    if filter_fn is not None and not filter_fn(lin, layer):
        report.skipped[layer] = "excluded by filter_fn"
        return
    why = _why_not(lin, config.weight_config(), set(), config.act_mode)
    if why is None:
        try:
            skeleton.put_module(model, layer, quantize_linear(lin, config))
            report.quantized.append(layer)
            return
        except ValueError as e:
            why = str(e)
    report.skipped[layer] = why


# HQQ while loading weighs no inputs: the model runs on random tokens only once it is whole and float, and loading
# keeps one float layer at a time
HQQ_WHILE_LOADING = ("none: each layer is quantized as it is read, before the model could run; for HQQ weighted by "
                     "the inputs, load the float model and call mixgemm.quantize_")


def from_pretrained(path: str, gguf_file: str | None = None, device=None, dtype: torch.dtype | None = None,
                    quantization_config=None, filter_fn=None, progress: bool = True, trust_remote_code: bool = False,
                    compact: bool = True, gguf_requantize_bits: int = 8, **kwargs) -> nn.Module:
    """A transformers causal LM with QuantLinear layers, read from a quantized checkpoint (module docstring).

    path: a checkpoint directory, or a .gguf file. gguf_file: the GGUF file's name inside ``path`` (as
    transformers takes it). device: where the model is built (default CPU). dtype: the dtype of the tensors that
    stay float (embeddings, norms, biases, Linears left float), which the model computes in; default: bfloat16 on
    the CPU for GGUF and for other producers' quantized checkpoints (GPTQ, AWQ, compressed-tensors), where torch's
    int4 / int8 kernels run (float32 on request: exact, several times slower); else the checkpoint's (float32 for
    GGUF).
    quantization_config: W4A16 / W8A16 / W8A8 / W4A8 to quantize a float checkpoint (or a GGUF file's float
    Linears) while loading, each layer on ``device`` as it is read (``method="hqq"`` optimizes its codes there,
    without the input weighting quantize_ adds: ``model.mixgemm_report.hqq_inputs``);
    filter_fn(module, name) -> bool limits which Linears are quantized. compact (default
    True): each QuantLinear keeps its codes in one resident layout on an sm_90 GPU, now or once the model is moved
    there (as quantize_'s ``compact``). gguf_requantize_bits (8 or 4): the width GGUF types without an exact
    mixgemm form (IQ*, TQ*, MXFP4, NVFP4) are re-quantized to: 8 (default) stays within half an int8 step of the
    file's weights at 9 bits a weight, 4 keeps a low-bit file's size class (5 bits a weight, a few % more error; it
    also re-quantizes Q6_K, Q3_K and Q2_K, which 8 holds exactly in 8-bit groups of 16 at 10-12 bits a weight;
    mixgemm.ggml.gguf_types). Other keyword arguments go to ``AutoConfig.from_pretrained``.

    The model is in eval mode; ``model.mixgemm_report`` (a LoadReport) lists what was quantized and what not, and
    ``model.config.quantization_config`` describes every QuantLinear, so ``model.save_pretrained`` writes a
    checkpoint that this function (or ``AutoModelForCausalLM.from_pretrained`` after ``import mixgemm``)
    reads back bit for bit. The tokenizer: ``mixgemm.checkpoints.load_tokenizer(path, gguf_file)``. Act-order down
    projections of gated MLPs get their input permutation folded into gate / up's rows (exact; listed in
    ``model.mixgemm_report.perm_folded``), so they decode without gathering x; the layers that share a norm's
    output (q / k / v, gate / up) take it gathered once by that norm under torch.compile
    (``perm_at_norms``, mixgemm.nn.norms; in eager mode they gather in their kernels).
    """
    from mixgemm.checkpoints.native import attach_quantization_config
    from mixgemm.quantize_api import auto_compact_

    if quantization_config is not None:
        from mixgemm.quantize_api import _Precision

        if not isinstance(quantization_config, _Precision):
            raise TypeError(f"quantization_config must be mixgemm.W4A16, W8A16, W8A8 or W4A8, got "
                            f"{type(quantization_config).__name__}")
        if quantization_config.method == "gptq":
            raise ValueError("quantization_config with method='gptq' needs calibration data and the float model "
                             "whole: load it with transformers, then mixgemm.quantize_(model, config, "
                             "calibration=batches); from_pretrained quantizes while loading with 'rtn' or 'hqq'")
    device = _device(device)
    if gguf_file is not None or str(path).endswith(".gguf"):
        directory, name = _gguf_location(path, gguf_file)
        if gguf_requantize_bits not in (4, 8):
            raise ValueError(f"gguf_requantize_bits must be 8 or 4, got {gguf_requantize_bits!r}")
        model, report = _load_gguf(directory, name, quantization_config, filter_fn, device, dtype, progress, kwargs,
                                   gguf_requantize_bits)
    else:
        from transformers import AutoConfig

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} is not a checkpoint directory (or a .gguf file)")
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
        qc = getattr(config, "quantization_config", None)
        if qc is not None and quantization_config is not None:
            raise ValueError(f"{path} is already quantized ({_quant_method(qc)}); drop quantization_config")
        if qc is not None:
            del config.quantization_config  # the skeleton is built plain, then its layers are swapped
        model, report = _load_safetensors(path, config, qc, quantization_config, filter_fn, device, dtype, progress,
                                          trust_remote_code)
    skeleton.finish(model, device)
    if quantization_config is not None and quantization_config.method == "hqq":
        report.hqq_inputs = HQQ_WHILE_LOADING
    report.perm_folded, report.perm_at_norms = arrange_act_order(model)
    report.norm_kernels = norm_kernels(model)
    if report.ignored:
        warnings.warn(f"from_pretrained: {len(report.ignored)} checkpoint tensors have no place in the model and were "
                      f"ignored, e.g. {report.ignored[:5]}", stacklevel=2)
    attach_quantization_config(model)
    auto_compact_(model, compact)  # act-order folding above rewrites plain codes
    report.sibling_groups = join_siblings(model)  # after compacting: joins the layouts compacted on the GPU
    report.experts_joined = join_experts(model)  # (likewise)
    model.mixgemm_report = report
    return model.eval()


def _quant_method(qc) -> str:
    return (qc if isinstance(qc, dict) else qc.to_dict()).get("quant_method", "?")


def _gguf_location(path, gguf_file) -> tuple[str, str]:
    from mixgemm.checkpoints.gguf_file import split

    directory, name = split(path, gguf_file)
    if not os.path.isfile(os.path.join(directory, name)):
        raise FileNotFoundError(f"no GGUF file {os.path.join(directory, name)}")
    return directory, name


def load_tokenizer(path: str, gguf_file: str | None = None, **kwargs):
    """The tokenizer of a checkpoint: transformers builds it from the GGUF file's vocabulary, or reads the
    directory's tokenizer files."""
    from transformers import AutoTokenizer

    if gguf_file is not None or str(path).endswith(".gguf"):
        directory, name = _gguf_location(path, gguf_file)
        return AutoTokenizer.from_pretrained(directory, gguf_file=name, **kwargs)
    return AutoTokenizer.from_pretrained(path, **kwargs)


__all__ = ["LoadReport", "from_pretrained", "load_tokenizer", "quant_linear"]
