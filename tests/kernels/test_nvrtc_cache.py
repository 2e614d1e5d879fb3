"""The on-disk cubin cache of mixgemm.kernels.cuda.nvrtc: a second process (here: a cleared in-process cache) loads
the cubin from disk instead of compiling; other macros, another architecture or a changed source make a new entry."""

from __future__ import annotations

import pytest

from mixgemm.kernels.cuda import nvrtc

pytestmark = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")

DEFINES = (("GEMV_M", 1),)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(nvrtc.CUBIN_CACHE_ENV, str(tmp_path))
    nvrtc.compile_cubin.cache_clear()
    yield tmp_path
    nvrtc.compile_cubin.cache_clear()


def test_a_new_process_reads_the_cubin_from_disk(cache, monkeypatch):
    first = nvrtc.compile_cubin("cuda_gemv/gemv.cu", DEFINES, "sm_90a")
    files = list(cache.glob("*.cubin"))
    assert len(files) == 1 and files[0].read_bytes() == first
    nvrtc.compile_cubin.cache_clear()

    def no_compile(*a):
        raise AssertionError("compiled again although the cubin is on disk")

    monkeypatch.setattr(nvrtc, "_compile", no_compile)
    assert nvrtc.compile_cubin("cuda_gemv/gemv.cu", DEFINES, "sm_90a") == first


def test_macros_arch_and_sources_key_the_entry(cache, monkeypatch):
    nvrtc.compile_cubin("cuda_gemv/gemv.cu", DEFINES, "sm_90a")
    nvrtc.compile_cubin("cuda_gemv/gemv.cu", DEFINES, "sm_80")
    nvrtc.compile_cubin("cuda_gemv/gemv.cu", (("GEMV_M", 2),), "sm_90a")
    assert len(list(cache.glob("*.cubin"))) == 3
    nvrtc.compile_cubin.cache_clear()
    monkeypatch.setattr(nvrtc, "_sources_digest", lambda: "an edited source")
    nvrtc.compile_cubin("cuda_gemv/gemv.cu", DEFINES, "sm_90a")
    assert len(list(cache.glob("*.cubin"))) == 4


def test_off_and_failures_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(nvrtc.CUBIN_CACHE_ENV, "0")
    assert nvrtc.cubin_cache_dir() is None
    monkeypatch.setenv(nvrtc.CUBIN_CACHE_ENV, str(tmp_path))
    nvrtc.compile_cubin.cache_clear()
    with pytest.raises(nvrtc.NvrtcError, match="cuda_gemv/gemv.cu"):
        nvrtc.compile_cubin("cuda_gemv/gemv.cu", (("GEMV_M", 1), ("GEMV_R", "not_a_number")), "sm_90a")
    assert not list(tmp_path.iterdir())
