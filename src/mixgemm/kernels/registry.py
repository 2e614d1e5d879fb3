"""The kernel registry: every kernel is one entry with one contract, and one ordered list per op.

An entry (:class:`KernelEntry`) says

* ``can_run(problem) -> Decision(ok, reason, soft)``: whether it takes the problem, and if not why ("soft" when the
  reason is tuning -- a measured crossover -- that :func:`mixgemm.kernel_options` ``force`` may override, "hard"
  when the kernel cannot run it);
* ``layout``: the QuantizedWeight layout it reads (name and builder), or ``layout_for(config)`` where the config
  picks it (:meth:`KernelEntry.reads`; a Choice's ``layout``), so that explain says which copy of the weight a call
  holds on the GPU;
* ``config(problem) -> dict | None``: the config it is handed (from mixgemm.tuning or the kernel's rule);
* ``run``: the launch, with the op's own argument list (mixgemm.kernels.linear / a8 / conv say which);
* ``prepare(problem, qw, config)`` (optional): the launch built once for a call plan -- compiled kernel, grid and
  parameters with the weight's pointers in place -- returned as ``launch(x2d, bias, lo, hi) -> y`` (a conv entry:
  qw the QuantizedConvWeight, ``launch(x, bias, lo, hi) -> y``), which a cached plan (mixgemm.ops.dispatch,
  mixgemm.ops.conv) calls instead of ``run``;
* ``complete``: how a config forced through kernel_options is completed (e.g. a partial tile);
* ``candidates(problem) -> list[dict]`` (tunable entries only): a small set of legal configs beside the default,
  which `mixgemm tune` times (mixgemm.tuning.cache holds what it measured faster; the config step uses it);
* ``input_perm(problem, config) -> str | None`` (linear): for act-order problems (``Problem.act_order``), None when
  ``run`` with that config applies the input permutation itself while reading x (it is then handed ``perm=``), else
  why not: the caller gathers x first (mixgemm.ops.dispatch.run_linear). Entries without it never apply one.

Ops (``Problem.op``): "linear" (weight-only, x float), "linear_a8" (activations quantized to int8), "conv". The
dispatcher (:func:`choose`) walks the op's list and takes the first entry that can run; :func:`explain` returns
that choice with the config and why each earlier entry declined. The lists are built on first use from the modules
that define them (mixgemm.kernels.linear, .a8, .conv: each registers its list when the mixgemm.kernels package is
imported), so importing the registry imports no kernel.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

import mixgemm.tuning as tuning
from mixgemm.kernels.options import (
    ACT_ORDER_GATHER,
    KernelOptions,
    current_options,
    pop_options,
    push_options,
)

OPS = ("linear", "linear_a8", "conv")


@dataclass(frozen=True)
class DeviceInfo:
    """What the dispatch decisions read about a device (read once per device; see :func:`device_info`)."""

    type: str
    index: int | None
    capability: tuple[int, int] = (0, 0)
    sm_count: int = 132
    name: str = ""
    smem_optin: int = 99 * 1024  # opt-in shared memory per block

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def sm90(self) -> bool:
        return self.capability == (9, 0)

    @property
    def table(self) -> dict:
        """The per-GPU tuning table (mixgemm.tuning)."""
        return tuning.load_table(tuning.table_name_for(self.name) if self.is_cuda else "default")


@functools.cache
def _device_info(type_: str, index: int | None) -> DeviceInfo:
    if type_ != "cuda":
        return DeviceInfo(type_, index)
    dev = torch.device(type_, index) if index is not None else torch.device(type_)
    props = torch.cuda.get_device_properties(dev)
    return DeviceInfo(type_, index, tuple(torch.cuda.get_device_capability(dev)), props.multi_processor_count,
                      torch.cuda.get_device_name(dev),
                      int(getattr(props, "shared_memory_per_block_optin", 0) or 99 * 1024))


def device_info(device: torch.device) -> DeviceInfo:
    """The DeviceInfo of ``device`` (cached; ``device_info.cache_clear()`` after mocking torch.cuda in tests)."""
    return _device_info(device.type, device.index)


device_info.cache_clear = _device_info.cache_clear  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Problem:
    """One call as the dispatchers see it. ``qw`` (and for conv ``conv``) are the weight objects, for the few
    checks that read the weight's layout geometry; they are not part of equality."""

    op: str
    m: int
    n: int
    k: int
    x_dtype: torch.dtype
    device: DeviceInfo
    bits: int
    group_size: int  # the effective group (K for per-channel)
    num_groups: int
    mode: str
    act_mode: str | None = None  # linear_a8: one of formats.activation.ACT_MODES
    per_token: bool = False  # linear_a8: one activation scale per token (act_block "token", or per-channel weights)
    conv: ConvShape | None = None
    act_order: bool = False  # linear: the layer multiplies x[..., input_perm] (GPTQ desc_act)
    # the one layout a compacted weight keeps (QuantizedWeight.resident): only entries reading it can run
    resident: str | None = None
    qw: object = field(default=None, compare=False, repr=False)

    @property
    def per_channel(self) -> bool:
        return self.num_groups == 1


@dataclass(frozen=True)
class ConvShape:
    """A convolution's geometry and input properties (ops "conv")."""

    ci_g: int
    groups: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    channels_last_out: bool
    x: object = field(default=None, compare=False, repr=False)  # the input (alignment / stride checks)
    weight: object = field(default=None, compare=False, repr=False)  # the QuantizedConvWeight

    @property
    def depthwise(self) -> bool:
        return self.ci_g == 1 and self.groups > 1


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str = ""
    soft: bool = False  # a tuning decline (a measured crossover), which forcing the entry overrides

    def __bool__(self) -> bool:
        return self.ok


OK = Decision(True)


def no(reason: str) -> Decision:
    """A hard decline: the kernel cannot run the problem."""
    return Decision(False, reason)


def prefer_not(reason: str) -> Decision:
    """A soft decline: the kernel could run it, but the tuning data sends the problem elsewhere."""
    return Decision(False, reason, soft=True)


@dataclass(frozen=True)
class Layout:
    """The weight layout an entry reads: QuantizedWeight.layout(name, builder) builds and caches it."""

    name: str
    builder: Callable

    @classmethod
    def lazy(cls, name: str, module: str, fn: str) -> Layout:
        """The layout ``name`` built by ``module.fn(qw)``, imported on the first build (listing an entry imports no
        kernel module)."""

        def build(qw):
            import importlib

            return getattr(importlib.import_module(module), fn)(qw)

        build.__name__ = fn
        return cls(name, build)


@dataclass(frozen=True)
class KernelEntry:
    name: str
    op: str
    can_run: Callable[[Problem], Decision]
    config: Callable[[Problem], dict | None]
    run: Callable
    layout: Layout | None = None
    doc: str = ""
    # a config forced through kernel_options -> the config handed to run (completes partial configs); default: as is
    complete: Callable[[Problem, dict], dict] | None = None
    # a small set of legal configs besides the default for `mixgemm tune` (None: not tunable)
    candidates: Callable[[Problem], list[dict]] | None = None
    # act-order problems: None when run with the config applies the input permutation itself (run(..., perm=)), else
    # why not
    input_perm: Callable[[Problem, dict | None], str | None] | None = None
    # (problem, qw, config) -> launch(x2d, bias, lo, hi[, perm]) -> y, built once per call plan (None: run per call)
    prepare: Callable | None = None
    # config -> the Layout this entry reads with it, for entries whose config picks one (None: always ``layout``)
    layout_for: Callable[[dict | None], Layout] | None = None
    # with layout_for: the names of every layout it may read (a compacted weight keeping another is declined first)
    reads_any: tuple[str, ...] = ()

    def reads(self, config: dict | None) -> Layout | None:
        """The weight layout this entry reads when run with ``config`` (None: the plain tensors or none declared)."""
        return self.layout_for(config) if self.layout_for is not None else self.layout

    def perm_reason(self, problem: Problem, config: dict | None) -> str | None:
        """None when this entry, run with ``config``, gathers x through an act-order problem's permutation itself,
        else why not."""
        if self.input_perm is None:
            return "applies no input permutation"
        return self.input_perm(problem, config)


@dataclass(frozen=True)
class Choice:
    """The dispatcher's answer: the entry, the config it is handed, and the entries before it with why they
    declined (also the ones the options skipped)."""

    entry: KernelEntry
    config: dict | None
    declined: tuple[tuple[str, str], ...] = ()
    problem: Problem | None = None
    # where the config came from: kernel_options, a tuning cache file, a shipped table's bucket entry ("": a rule)
    config_source: str = ""
    # act-order problems: True when the entry applies the input permutation itself; perm_note says how x is permuted
    perm_in_kernel: bool = False
    perm_note: str = ""
    launch: Callable | None = field(default=None, compare=False, repr=False)  # the prepared launch of a cached plan

    @property
    def kernel(self) -> str:
        return self.entry.name

    @property
    def layout(self) -> str | None:
        """The name of the weight layout the chosen entry reads with its config (None where it declares none)."""
        lay = self.entry.reads(self.config)
        return None if lay is None else lay.name

    def __str__(self) -> str:
        lay = self.layout
        lines = [f"{self.entry.op}: {self.entry.name} with config {self.config}"
                 + (f" (from {self.config_source})" if self.config_source else "")
                 + (f", reads layout {lay}" if lay else "")]
        if self.perm_note:
            lines.append(f"  input permutation: {self.perm_note}")
        lines += [f"  {name} declined: {why}" for name, why in self.declined]
        return "\n".join(lines)


@functools.cache
def triton_ok(module: str) -> bool:
    """True when the Triton kernel module ``module`` imports (Triton installed and the module compiles its decorators):
    what an entry's can_run checks before naming Triton unavailable."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


class NoKernel(ValueError):
    """No entry of the op takes the problem; the message lists every entry's reason."""


_ENTRIES: dict[str, tuple[KernelEntry, ...]] = {}


def register(op: str, ordered: Iterable[KernelEntry]) -> None:
    """Install ``op``'s ordered entry list (called once by the module that defines it)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {OPS}")
    ordered = tuple(ordered)
    if any(e.op != op for e in ordered):
        raise ValueError(f"entries of op {op!r} must say op={op!r}")
    _ENTRIES[op] = ordered


def entries(op: str) -> tuple[KernelEntry, ...]:
    """The ordered entry list of ``op``."""
    if op not in _ENTRIES:
        raise ValueError(f"unknown op {op!r}; ops: {tuple(_ENTRIES)}")
    return _ENTRIES[op]


def entry(name: str) -> KernelEntry:
    for op in OPS:
        for e in entries(op):
            if e.name == name:
                return e
    raise ValueError(f"unknown kernel {name!r}; the registry has {sorted(entry_names())}")


def entry_names() -> frozenset:
    return frozenset(e.name for op in OPS for e in entries(op))


def choose(problem: Problem, options: KernelOptions | None = None) -> Choice:
    """The first entry of the problem's op that can run it (after the options' force / disable and a tuning cache's
    choice of entry for the problem's bucket), with its config. Raises NoKernel when none can (a forced entry that
    cannot run raises too, with its reason)."""
    opts = current_options() if options is None else options
    declined: list[tuple[str, str]] = []
    lst = entries(problem.op)
    forced = [e for e in lst if e.name in opts.force]
    for e in forced:
        chosen = _try_entry(e, problem, opts, declined, take_soft=True)
        if chosen is not None:
            return chosen
    if forced:
        raise NoKernel(f"forced kernel cannot run this {problem.op} problem: "
                       + "; ".join(f"{n}: {r}" for n, r in declined))
    chosen = _cached_choice(problem, lst, opts)
    if chosen is not None:
        return chosen
    for e in lst:
        if e.name in opts.disable:
            declined.append((e.name, "disabled by kernel_options"))
            continue
        chosen = _try_entry(e, problem, opts, declined, take_soft=False)
        if chosen is not None:
            return chosen
    raise NoKernel(f"no kernel takes this {problem.op} problem (m={problem.m}, n={problem.n}, k={problem.k}, "
                   f"{problem.bits}-bit, group {problem.group_size}, x {problem.x_dtype}): "
                   + "; ".join(f"{n}: {r}" for n, r in declined))


def _try_entry(e: KernelEntry, problem: Problem, opts: KernelOptions, declined: list, take_soft: bool) -> Choice | None:
    """e's Choice for the problem (after the entries in ``declined``), or None with e's reason appended to declined:
    it reads another layout than a compacted weight keeps (checked before can_run, which may build the entry's
    layout, and again with the config where the config picks the layout), or can_run declines (take_soft: a tuning
    reason does not, as for a forced entry)."""
    if e.layout_for is None or (problem.resident is not None and e.reads_any
                                and problem.resident not in e.reads_any):
        why = resident_reason(e, problem, None)
    else:
        why = None
    d = no(why) if why is not None else e.can_run(problem)
    if d.ok or (take_soft and d.soft):
        cfg, source = _config(e, problem, opts)
        why = resident_reason(e, problem, cfg)
        if why is None:
            return Choice(e, cfg, tuple(declined), problem, source, *_perm_fields(e, problem, cfg))
        d = no(why)
    declined.append((e.name, d.reason))
    return None


def _cached_choice(problem: Problem, lst, opts: KernelOptions) -> Choice | None:
    """The tuning cache's choice of entry for the problem's bucket (mixgemm.tuning.cache.choice) with its config,
    where that entry is in the op's list, not disabled and can run the problem (a soft decline is what the choice
    overrides); else None."""
    from mixgemm.tuning import cache

    hit = cache.choice(problem)
    if hit is None:
        return None
    name, cfg, where = hit
    e = next((x for x in lst if x.name == name), None)
    if e is None or name in opts.disable or (e.layout_for is None and resident_reason(e, problem, None)):
        return None
    d = e.can_run(problem)
    if not (d.ok or d.soft):
        return None
    forced = opts.configs.get(name)
    source = "kernel_options(configs=...)" if forced is not None else f"tuning cache {where}"
    cfg = dict(forced if forced is not None else cfg)
    if e.complete is not None:
        cfg = e.complete(problem, cfg) if forced is not None else _complete_cached(e, problem, cfg, where)
    if cfg is None or resident_reason(e, problem, cfg) is not None:
        return None
    declined = tuple((x.name, f"the tuning cache chose {name} for this bucket") for x in lst[:lst.index(e)])
    return Choice(e, cfg, declined, problem, source, *_perm_fields(e, problem, cfg))


def resident_reason(e: KernelEntry, problem: Problem, config: dict | None) -> str | None:
    """Why ``e`` with ``config`` cannot run a compacted weight's problem (it reads another layout than the one the
    weight keeps), or None."""
    if problem.resident is None:
        return None
    lay = e.reads(config)
    if lay is not None and lay.name == problem.resident:
        return None
    return (f"reads {lay.name if lay is not None else 'the plain codes'}; this weight keeps only its "
            f"{problem.resident} layout (compacted: QuantLinear.compact_)")


def _perm_fields(e: KernelEntry, problem: Problem, config: dict | None) -> tuple[bool, str]:
    """(perm_in_kernel, perm_note) of a Choice of ``e`` with ``config`` for ``problem`` (nothing unless act-order)."""
    if not problem.act_order:
        return False, ""
    why = e.perm_reason(problem, config)
    return why is None, "gathered in the kernel" if why is None else f"separate gather before the kernel ({why})"


def _config(e: KernelEntry, problem: Problem, opts: KernelOptions) -> tuple[dict | None, str]:
    """The config handed to the chosen entry and where it came from: kernel_options(configs=...), else the tuning
    cache's entry for the problem's bucket (mixgemm.tuning.cache), else the entry's own choice: a shipped tuning
    table's bucket entry (its bucket and source) or the kernel's rule ("")."""
    from mixgemm.tuning import cache

    forced = opts.configs.get(e.name)
    source = "kernel_options(configs=...)"
    if forced is None and e.candidates is not None:
        hit = cache.lookup(problem, e.name)
        if hit is not None:
            cfg = _complete_cached(e, problem, *hit) if e.complete is not None else dict(hit[0])
            if cfg is not None:
                return cfg, f"tuning cache {hit[1]}"
    if forced is None:
        cfg = e.config(problem)  # a tuning-table config carries its bucket and source (mixgemm.tuning.buckets)
        return (None if cfg is None else dict(cfg)), getattr(cfg, "source", "")
    return (e.complete(problem, dict(forced)) if e.complete is not None else dict(forced)), source


_STALE_WARNED: set = set()


def _complete_cached(e: KernelEntry, problem: Problem, config: dict, where: str) -> dict | None:
    """A tuning cache's config completed by its entry, or None (with one warning a cache entry) where the entry no
    longer takes it: a cache written by an older mixgemm whose kernel configs have changed since is skipped, never an
    error in the user's call."""
    try:
        return e.complete(problem, dict(config))
    except (ValueError, TypeError) as err:
        if where not in _STALE_WARNED:
            _STALE_WARNED.add(where)
            warnings.warn(f"mixgemm: ignoring the tuning cache's {e.name} config at {where}: {err} (written by an "
                          "older mixgemm? run `mixgemm tune` again)", RuntimeWarning, stacklevel=3)
        return None


def _names(v: str | Iterable[str] | None) -> frozenset:
    if v is None:
        return frozenset()
    return frozenset((v,) if isinstance(v, str) else v)


_UNSET = object()


@contextlib.contextmanager
def kernel_options(force: str | Iterable[str] | None = None, disable: str | Iterable[str] | None = None,
                   configs: Mapping[str, dict] | None = None, conv_dequant_min_m=_UNSET,
                   act_order_gather: str | None = None, pdl: bool | None = None):
    """Within the block, mixgemm's dispatchers honour these overrides, added to the enclosing block's (see
    mixgemm.kernels.options): ``force`` entry names (one per op) preferred over the op's list, also past their tuning
    declines; ``disable`` entry names never picked; ``configs`` {entry name: config} handed to that entry instead of
    its own choice (completed by the entry where partial); ``conv_dequant_min_m`` the dequantize + cuDNN conv
    from that many output pixels instead of its race (None: the race decides, mixgemm.kernels.conv);
    ``act_order_gather`` where act-order layers gather x ("auto",
    "kernel", "caller": mixgemm.kernels.options.ACT_ORDER_GATHER); ``pdl`` programmatic dependent launch on / off.
    Unknown entry names raise ValueError."""
    known = entry_names()
    for name in _names(force) | _names(disable) | frozenset(configs or {}):
        if name not in known:
            raise ValueError(f"unknown kernel {name!r}; the registry has {sorted(known)}")
    if act_order_gather is not None and act_order_gather not in ACT_ORDER_GATHER:
        raise ValueError(f"act_order_gather must be one of {ACT_ORDER_GATHER}, got {act_order_gather!r}")
    old = current_options()
    new = KernelOptions(
        force=old.force | _names(force),
        disable=(old.disable | _names(disable)) - _names(force),
        configs=MappingProxyType({**old.configs, **{k: dict(v) for k, v in (configs or {}).items()}}),
        conv_dequant_min_m=old.conv_dequant_min_m if conv_dequant_min_m is _UNSET else conv_dequant_min_m,
        act_order_gather=old.act_order_gather if act_order_gather is None else act_order_gather,
        pdl=old.pdl if pdl is None else bool(pdl),
    )
    token = push_options(new)
    try:
        yield new
    finally:
        pop_options(token)
