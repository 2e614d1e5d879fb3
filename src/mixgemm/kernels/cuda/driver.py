"""The CUDA driver API through cuda-bindings, as mixgemm's compile / load (nvrtc.py) and launch (launch.py) code both
need it: the module, its error check, cuInit once, and making PyTorch's primary context current on a thread."""

from __future__ import annotations

_inited = False


def driver_api():
    from cuda.bindings import driver

    return driver


def check(result, what: str):
    """cuda-bindings calls return (err, *values); raise on error, return the values."""
    err, *vals = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else tuple(vals)


def init_driver():
    global _inited
    if not _inited:
        check(driver_api().cuInit(0), "cuInit")
        _inited = True


def make_primary_context_current(idx: int) -> None:
    """Make device idx's primary context (the one PyTorch uses) current on this thread."""
    drv = driver_api()
    init_driver()
    ctx = check(drv.cuDevicePrimaryCtxRetain(check(drv.cuDeviceGet(idx), "cuDeviceGet")), "cuDevicePrimaryCtxRetain")
    check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
