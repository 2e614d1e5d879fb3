"""tools/bench/dispatch_ab.py on the CPU: two trees' dispatch, their difference, a timed run's summary."""

from __future__ import annotations

from tools.bench import dispatch_ab

H100 = "NVIDIA H100 80GB HBM3"


def test_diff_of_a_tree_with_itself_is_empty_and_a_changed_tile_is_a_case():
    shapes, fmts = [(4096, 4096), (3584, 18944)], ["w4s", "w8"]
    # (two child processes side by side, as for the older tree and this one)
    here, again = dispatch_ab._dispatch_of([None, None], shapes, fmts, H100, 132)
    assert here == again == dispatch_ab.dispatch(shapes, fmts, H100, 132)
    assert dispatch_ab.diff(here, here) == ([], [])
    key = "4096x4096 w8"
    kernel, cfg = here[key]
    assert kernel in dispatch_ab.KERNELS
    moved = {**here, key: [kernel, {**cfg, "KS": 2 * cfg["KS"], "XS": 1}]}
    cases, kernels = dispatch_ab.diff(here, moved)
    assert kernels == [] and len(cases) == 1
    case = cases[0]
    assert (case["K"], case["N"], case["fmt"], case["M"], case["dtype"], case["kernel"]) == (4096, 4096, "w8", 1,
                                                                                          "float16", kernel)
    assert case["cfgs"]["new"]["KS"] == 2 * case["cfgs"]["old"]["KS"] and "XS" not in case["cfgs"]["new"]
    other = {**here, key: ["cuda_gemv_mma", {}]}
    assert dispatch_ab.diff(here, other) == ([], [f"{key}: {kernel} -> cuda_gemv_mma"])


def test_summary_reports_geomean_worst_and_protocol():
    timed = [{"K": 4096, "N": 4096, "fmt": "w8", "us": {"old": 8.0, "new": 7.2}},
             {"K": 5000, "N": 3000, "fmt": "w8", "us": {"old": 5.0, "new": 5.5}}]
    lines = dispatch_ab.summary(timed, listed={(4096, 4096)}, protocol={(4096, 4096)})
    assert lines[0] == f"all: 2 cases, {(0.9 * 1.1) ** 0.5:.3f}x"
    assert "w8 model list: 1 cases, 0.900x (0.900-0.900)" in lines
    assert "w8 other layers: 1 cases, 1.100x (1.100-1.100)" in lines
    assert lines[-2].startswith("worst: w8 5000x3000 1.100x")
    assert lines[-1] == "protocol: w8 4096x4096 8.00 -> 7.20 us"


def test_keys_of_m_and_dtypes_and_a_tensor_core_case():
    """M and the dtypes enter the keys where not 1 / fp16 and come back from them; a tensor-core GEMV case (and a
    wgmma_v1 CUDA-core one) is forced with every optional key explicit (its forced config is laid over the
    dispatcher's own)."""
    key = dispatch_ab.problem_key(4096, 4096, "w4s", 16, "bfloat16", "bfloat16")
    assert key == "4096x4096 w4s M=16 x=bfloat16 s=bfloat16" and dispatch_ab.problem_key(8, 16, "w8") == "8x16 w8"
    assert dispatch_ab.parse_key(key) == {"K": 4096, "N": 4096, "fmt": "w4s", "M": 16, "dtype": "bfloat16",
                                          "scale_dtype": "bfloat16", "resident": ""}
    compact = dispatch_ab.dispatch([(4096, 4096)], ["w4s"], H100, 132, ms=(16,), resident="wgmma_v1")
    (ck, (kern, cfg)), = compact.items()
    assert ck == "4096x4096 w4s M=16 r=wgmma_v1" and kern == "cuda_gemv_mma" and cfg["WG"] == 1
    assert dispatch_ab.parse_key(ck)["resident"] == "wgmma_v1"
    here = dispatch_ab.dispatch([(4096, 4096)], ["w4s"], H100, 132, ms=(16,), dtypes=("bfloat16",))
    (kernel, cfg), = here.values()
    assert list(here) == ["4096x4096 w4s M=16 x=bfloat16"] and kernel == "cuda_gemv_mma"
    moved = {k: [kernel, {**cfg, "RT": 2}] for k in here}
    (case,), _ = dispatch_ab.diff(here, moved)
    assert case["kernel"] == "cuda_gemv_mma" and case["M"] == 16 and case["dtype"] == "bfloat16"
    assert dispatch_ab.forced("cuda_gemv_mma", {"KS": 16})["MINB"] == 0
    assert dispatch_ab.forced("cuda_gemv_mma", {"KS": 16, "MINB": 2})["MINB"] == 2
    # a wgmma_v1 CUDA-core tile: its optional keys explicit too
    assert dispatch_ab.forced("cuda_gemv_wg_simt", {"KS": 16}) == {"KS": 16, "MINB": 0, "PACK": 0}
    assert dispatch_ab.forced("cuda_gemv_wg_simt", {"KS": 16, "PACK": 1})["PACK"] == 1
    assert dispatch_ab.forced("cuda_gemv", {"R": 2}) == {"R": 2}
    assert dispatch_ab.label({**case, "us": {}}) == "w4s M=16 x=bfloat16"
