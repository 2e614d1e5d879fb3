"""Run-time compilation (NVRTC) and launching (CUDA driver API) of mixgemm's CUDA C++ kernels.

Users need no CUDA toolkit: only the pip packages ``cuda-bindings`` and ``nvidia-cuda-nvrtc``.
Kernel sources live in their kernel's folder (``mixgemm/kernels/<entry>/*.cu``, named ``"<entry>/<file>.cu"``) or,
for the shared ones and the headers every kernel includes, beside this file (``*.cu`` / ``*.cuh``, named by file
name alone); each compile key is a set of ``-D`` macros, compiled
once per (source, macros, architecture) to a cubin, and loaded once per device into the primary
context that PyTorch uses. Launches go on a given stream (normally ``torch.cuda.current_stream()``),
take no host synchronization and allocate nothing, so they can be captured in CUDA graphs.

Reusable by any mixgemm CUDA kernel: ``compile_cubin`` (also works without a GPU, for CPU-side
compile checks), ``get_function`` and ``launch``.

Compiled cubins are also kept on disk (``$MIXGEMM_CUBIN_CACHE``, else ``~/.cache/mixgemm/cubin``; ``0`` turns it
off), keyed by a hash of the sources, the macros, the architecture and the NVRTC version: a new process (a restarted
server, each test worker) loads a kernel in milliseconds instead of recompiling it for seconds.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import struct
import tempfile
import threading
from pathlib import Path

from mixgemm.kernels.cuda.driver import check as _check
from mixgemm.kernels.cuda.driver import driver_api as _driver  # conv_wgmma / gemm_wgmma and tools call nvrtc._driver
from mixgemm.kernels.cuda.driver import make_primary_context_current

HERE = Path(__file__).resolve().parent  # the shared sources and headers (-I: every kernel includes from here)
KERNELS = HERE.parent  # a kernel folder's source is named "<folder>/<file>.cu" from here
_lock = threading.Lock()
_modules: dict = {}  # (device index, source, defines, arch) -> (module, function)


class NvrtcError(RuntimeError):
    """NVRTC failed to compile a kernel (the message holds NVRTC's log)."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "mixgemm's CUDA kernels need the packages 'cuda-bindings' and 'nvidia-cuda-nvrtc' "
            "(pip install 'mixgemm[gpu]')"
        ) from e
    return nvrtc


def source_path(name: str) -> Path:
    """The file of kernel source ``name``: a file name beside this module, or a path under mixgemm/kernels."""
    return KERNELS / name if "/" in name else HERE / name


@functools.cache
def read_source(name: str) -> str:
    """Text of the kernel source ``name`` (:func:`source_path`)."""
    return source_path(name).read_text()


def arch_of(device) -> str:
    """'sm_XY' for a torch device (its compute capability)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


CUBIN_CACHE_ENV = "MIXGEMM_CUBIN_CACHE"


def cubin_cache_dir() -> Path | None:
    """Where compiled cubins are kept across processes: $MIXGEMM_CUBIN_CACHE ('0' or '' for none), else
    ~/.cache/mixgemm/cubin."""
    env = os.environ.get(CUBIN_CACHE_ENV)
    if env is not None:
        return None if env in ("", "0") else Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "mixgemm" / "cubin"


@functools.cache
def _sources_digest() -> str:
    """Hash of every kernel source and header under mixgemm/kernels (a kernel's includes are among them)."""
    h = hashlib.sha256()
    for f in sorted(KERNELS.rglob("*.cu*")):
        h.update(f.relative_to(KERNELS).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _cubin_key(source_name: str, defines: tuple, arch: str) -> str:
    err, major, minor = _nvrtc().nvrtcVersion()
    text = repr((_sources_digest(), source_name, defines, arch, int(major), int(minor)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=256)
def compile_cubin(source_name: str, defines: tuple[tuple[str, int], ...], arch: str) -> bytes:
    """Compile the kernel source ``source_name`` with ``-D`` macros for ``arch`` ('sm_80', 'sm_90'...).

    Returns the cubin bytes, from the on-disk cache when an earlier process compiled the same thing. Raises
    NvrtcError with NVRTC's log on failure. Needs no GPU.
    """
    d = cubin_cache_dir()
    key = _cubin_key(source_name, defines, arch)
    path = d / f"{source_name.replace('/', '.')}.{arch}.{key}.cubin" if d is not None else None
    if path is not None and path.is_file():
        try:
            return path.read_bytes()
        except OSError:
            pass  # unreadable: compile afresh
    cubin = _compile(source_name, defines, arch)
    if path is not None:
        try:  # write beside, then rename: concurrent processes never read a half-written file
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(cubin)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the in-process cache still holds it
    return cubin


def _compile(source_name: str, defines: tuple[tuple[str, int], ...], arch: str) -> bytes:
    nvrtc = _nvrtc()
    src = read_source(source_name).encode()
    prog = _check(nvrtc.nvrtcCreateProgram(src, source_name.encode(), 0, [], []), "nvrtcCreateProgram")
    # No --use_fast_math: the kernels' fp32 math must round exactly as written.
    opts = [f"--gpu-architecture={arch}", "-default-device", "--std=c++17", "-lineinfo", f"-I{HERE}",
            f"-I{source_path(source_name).parent}"]
    opts += [f"-D{k}={v}" for k, v in defines]
    opts = [o.encode() for o in opts]
    try:
        err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # NVRTC writes into the buffer: it must be a fresh mutable one. (b" " * size is immutable and, for a
        # 1-byte log, CPython's shared b" " singleton: writing into it corrupted bytes constants process-wide.)
        log = bytearray(max(size, 1))
        nvrtc.nvrtcGetProgramLog(prog, log)
        if int(err) != 0:
            raise NvrtcError(
                f"NVRTC could not compile {source_name} for {arch} with {dict(defines)}:\n"
                f"{bytes(log).rstrip(bytes(1)).decode(errors='replace')}"
            )
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def get_function(source_name: str, kernel_name: str, defines: dict, device, arch_suffix: str = ""):
    """The CUfunction ``kernel_name`` of ``source_name`` compiled with ``defines`` for ``device``.

    Compiled and loaded on first use, cached afterwards (per device, source and macros). Loads into
    the device's primary context (the one PyTorch uses), made current here. arch_suffix "a" compiles for
    the architecture-specific target (sm_90a: wgmma, setmaxnreg), which runs only on that exact GPU family.
    """
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, source_name, kernel_name, tuple(sorted(defines.items())), arch_suffix)
    fn = _modules.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _modules.get(key)
        if fn is not None:
            return fn
        arch = arch_of(torch.device("cuda", idx)) + arch_suffix
        cubin = compile_cubin(source_name, key[3], arch)
        drv = _driver()
        with torch.cuda.device(idx):
            torch.cuda.init()
            make_primary_context_current(idx)
            module = _check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
            fn = _check(drv.cuModuleGetFunction(module, kernel_name.encode()), "cuModuleGetFunction")
        _modules[key] = fn
        return fn


_smem_set: dict = {}


def allow_dynamic_smem(fn, nbytes: int) -> None:
    """Raise fn's dynamic shared memory limit to nbytes where its static and dynamic shared memory together pass the
    default 48 KiB (the default allows 48 KiB minus the static part); once per function and size."""
    if nbytes <= 0 or _smem_set.get(id(fn), 0) >= nbytes:
        return
    drv = _driver()
    err, static = drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn)
    if int(err) == 0 and static + nbytes <= 48 * 1024:
        return
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    err, = drv.cuFuncSetAttribute(fn, attr, nbytes)
    if int(err) != 0:
        raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) failed: {err!r}")
    _smem_set[id(fn)] = nbytes


_occupancy: dict = {}


def cubin_registers(cubin: bytes) -> dict[str, int]:
    """{kernel name: registers per thread} of an ELF64 cubin, read without a GPU or a toolkit: the EIATTR_REGCOUNT
    records (format 4 = sized, attribute 0x2f: the kernel's symbol index and its count) of its .nv.info sections, what
    cuobjdump --dump-resource-usage prints as REG."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not an ELF64 cubin")
    shoff = int.from_bytes(cubin[0x28:0x30], "little")
    shentsize, shnum, shstrndx = (int.from_bytes(cubin[o:o + 2], "little") for o in (0x3A, 0x3C, 0x3E))
    # section headers: (name, type, flags, addr, offset, size, link, info, align, entsize)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off: int) -> str:
        return cubin[off:cubin.index(b"\0", off)].decode()

    names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
    symtab = next(s for s, n in zip(secs, names, strict=True) if n == ".symtab")
    out = {}
    for sec, name in zip(secs, names, strict=True):
        if not name.startswith(".nv.info"):
            continue
        data, i = cubin[sec[4]:sec[4] + sec[5]], 0
        while i + 4 <= len(data):
            fmt, attr, size = data[i], data[i + 1], int.from_bytes(data[i + 2:i + 4], "little")
            if fmt == 4 and attr == 0x2F:
                sym, regs = struct.unpack_from("<II", data, i + 4)
                out[cstr(secs[symtab[6]][4] + struct.unpack_from("<I", cubin, symtab[4] + 24 * sym)[0])] = regs
            i += 4 + (size if fmt == 4 else 0)  # formats 1-3 hold no value or a 16-bit one in the size's place
    return out


def build_registers(source_name: str, defines: tuple[tuple[str, int], ...], arch: str) -> int:
    """Registers per thread of one build (the most of its kernels), from its cubin (compile_cubin, cached on disk; no
    GPU), for rules that follow what this machine's compiler allocates."""
    return max(cubin_registers(compile_cubin(source_name, defines, arch)).values())


def num_registers(fn) -> int:
    """Registers per thread of the CUfunction fn (what bounds how many of its blocks an SM holds)."""
    drv = _driver()
    return int(_check(drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn),
                      "cuFuncGetAttribute(NUM_REGS)"))


def resident_blocks(fn, threads: int, smem: int = 0) -> int:
    """Blocks of ``threads`` threads (``smem`` dynamic shared bytes each) of the CUfunction fn that fit on one
    SM (driver occupancy query, cached; fn objects live for the process in the module cache)."""
    key = (id(fn), threads, smem)
    v = _occupancy.get(key)
    if v is None:
        err, v = _driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, smem)
        if int(err) != 0:
            raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err!r}")
        v = max(1, int(v))
        _occupancy[key] = v
    return v


@functools.cache
def _cluster_attr(dims: tuple[int, int, int]) -> list:
    """The launch attribute list [thread-block cluster dimensions] (built once per dims)."""
    drv = _driver()
    a = drv.CUlaunchAttribute()
    a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = dims
    return [a]


def launch(fn, grid: tuple[int, int, int], block: tuple[int, int, int], args: list, stream: int,
           shared_bytes: int = 0, pdl: bool = False, cluster: tuple[int, int, int] | None = None) -> None:
    """Launch ``fn`` on the CUDA stream handle ``stream`` (e.g. torch.cuda.current_stream().cuda_stream).

    args: ctypes values (ctypes.c_void_p for pointers, ctypes.c_int, ctypes.c_float), in the kernel's
    parameter order. Asynchronous; no synchronization, no allocation (CUDA-graph capturable).
    pdl: programmatic dependent launch (sm_90): the kernel may start before the previous kernel in the
    stream has finished, so it must call griddepcontrol.wait before reading anything that kernel may write
    (the GEMV kernels do; see gemv_common.cuh).
    cluster: thread-block cluster dimensions (sm_90; each grid dimension a multiple of its cluster dimension).
    A call plan launching the same kernel again keeps a mixgemm.kernels.cuda.launch.PreparedLaunch instead.
    """
    from mixgemm.kernels.cuda.launch import Params, launch_config, raw_launch

    params = Params(args)
    raw_launch(int(fn), grid, block, shared_bytes, stream, params.addr,
               launch_config(grid, block, shared_bytes, pdl, cluster))


def prepare_launch(fn, device, grid: tuple[int, int, int], block: tuple[int, int, int], args: list,
                   shared_bytes: int = 0, pdl: bool = False, cluster: tuple[int, int, int] | None = None,
                   first_without_pdl: bool = False):
    """The launch of :func:`launch` on the CUDA ``device``, kept for repeated calls
    (mixgemm.kernels.cuda.launch.PreparedLaunch): call it after writing the changing parameters into
    ``.params.values``; it goes on the device's current stream."""
    import torch

    from mixgemm.kernels.cuda.launch import Params, PreparedLaunch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    return PreparedLaunch(int(fn), idx, tuple(grid), tuple(block), shared_bytes, Params(args), pdl,
                          None if cluster is None else tuple(cluster), first_without_pdl)


def max_active_clusters(fn, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
                        cluster: tuple[int, int, int]) -> int:
    """How many thread-block clusters of ``cluster`` CTAs of ``fn`` (with this block and dynamic shared memory) the
    GPU holds at once (cuOccupancyMaxActiveClusters): the wave size of a cluster launch."""
    drv = _driver()
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = shared_bytes
    attrs = _cluster_attr(tuple(cluster))
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return int(_check(drv.cuOccupancyMaxActiveClusters(fn, cfg), "cuOccupancyMaxActiveClusters"))


@functools.cache
def nvrtc_available() -> bool:
    """True when cuda-bindings and a loadable libnvrtc are present (checked once per process: the dispatchers ask
    on every call)."""
    try:
        nvrtc = _nvrtc()
        err, _, _ = nvrtc.nvrtcVersion()
        return int(err) == 0
    except Exception:
        return False


if os.environ.get("MIXGEMM_NVRTC_DEBUG"):  # pragma: no cover
    print("mixgemm.nvrtc: sources in", HERE)


def bias_code(dtype) -> int:
    """The kernels' bias dtype code: 1 float16, 2 bfloat16, 3 float32 (0: no bias)."""
    code = _BIAS_CODES.get(str(dtype))
    if code is None:
        raise TypeError(f"bias dtype {dtype} is not supported (float16, bfloat16, float32)")
    return code


_BIAS_CODES = {"torch.float16": 1, "torch.bfloat16": 2, "torch.float32": 3}


def bias_clamp_args(bias, lo: float, hi: float) -> list:
    """The epilogue parameters the CUDA kernels share, in their order: bias pointer (0 for none), bias dtype code
    (0 none, 1 float16, 2 bfloat16, 3 float32), clamp lo, clamp hi (+-inf for none)."""
    return [
        ctypes.c_void_p(0 if bias is None else bias.data_ptr()),
        ctypes.c_int(0 if bias is None else bias_code(bias.dtype)),
        *map(ctypes.c_float, _clamp_bounds(lo, hi)),
    ]


def _clamp_bounds(lo: float, hi: float) -> tuple[float, float]:
    """The kernels' clamp parameters: a bound that is not finite means none (-inf / +inf)."""
    return (lo if math.isfinite(lo) else -math.inf), (hi if math.isfinite(hi) else math.inf)


def set_bias_clamp(vals: list, at: int, bias, lo: float, hi: float) -> None:
    """Write bias_clamp_args' four parameters for this call into a prepared launch's values, from position ``at``."""
    if bias is None:
        write_epilogue(vals, at, 0, 0, lo, hi)
    else:
        if not bias.is_contiguous():
            raise ValueError(f"the bias must be contiguous, got strides {bias.stride()}")
        write_epilogue(vals, at, bias.data_ptr(), bias_code(bias.dtype), lo, hi)


def write_epilogue(vals: list, at: int, bias_ptr: int, code: int, lo: float, hi: float) -> None:
    """set_bias_clamp with the bias as an address and its dtype code."""
    vals[at].value, vals[at + 1].value = bias_ptr, code
    vals[at + 2].value, vals[at + 3].value = _clamp_bounds(lo, hi)
