"""`mixgemm tune` and its cache (mixgemm.tuning.cache): the bucket keys, load / save / corrupt files, the registry's
config step reading the cache (explain names the file; kernel_options(configs=...) still wins; without a cache the
choices are the entries' own rules), the candidates' legality, the tuner's "only improve" rule with a fake timer,
and the CLI without a GPU. GPU decisions are checked on the CPU against a DeviceInfo of an H100 (as test_registry)."""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import mixgemm
import mixgemm.__main__
from described_gpus import A100, H100
from mixgemm import QuantConfig, quantize_weight
from mixgemm.bench import tune
from mixgemm.kernels import cuda_gemv, cuda_gemv_mma, cuda_wgmma, linear_common
from mixgemm.kernels.registry import choose, entries
from mixgemm.tuning import cache as tcache

pytestmark = [pytest.mark.usefixtures("isolated_tuning"), pytest.mark.slow(seconds=47)]  # (conftest.py)


def _qw(n, k, bits=4, group_size=128, mode="sym", seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return quantize_weight(w, QuantConfig(bits=bits, group_size=group_size, mode=mode))


def _problem(m, qw, dtype=torch.float16, device=H100):
    return linear_common.linear_problem(m, qw, dtype, device)


# ------------------------------------------------------------------------------------------------ buckets
def test_half_octave_buckets():
    assert [tcache.half_octave(v) for v in (4096, 5120, 6887, 6889, 8192)] == [24, 25, 25, 26, 26]
    with pytest.raises(ValueError, match="positive"):
        tcache.half_octave(0)


def test_every_shape_has_a_bucket_and_neighbours_share_it():
    qw = _qw(64, 256)
    rnd = random.Random(0)
    for _ in range(200):
        k, n, m = rnd.randint(1, 1 << 17), rnd.randint(1, 1 << 17), rnd.randint(1, 1 << 16)
        key = tcache.bucket_key(replace(_problem(m, qw), k=k, n=n), "cuda_wgmma")
        assert f"/k{tcache.half_octave(k)}/n{tcache.half_octave(n)}/" in key
    p = _problem(16, qw)
    base = tcache.bucket_key(replace(p, k=4096, n=14336), "cuda_wgmma")
    # neighbouring layer sizes and token counts fall into the same bucket, so no key names one exact shape
    assert tcache.bucket_key(replace(p, k=4160, n=14200, m=13), "cuda_wgmma") == base
    assert tcache.bucket_key(replace(p, k=8192, n=14336), "cuda_wgmma") != base
    assert tcache.bucket_key(replace(p, m=17, k=4096, n=14336), "cuda_wgmma") != base
    assert tcache.bucket_key(replace(p, k=4096, n=14336), "triton_gemm") != base  # per entry
    assert "4096" not in base and "14336" not in base
    # the weight format and the activation dtype are part of the key
    q8 = replace(_problem(16, _qw(64, 256, bits=8, group_size=-1)), k=4096, n=14336)
    assert "/w8pc-sym/" in tcache.bucket_key(q8, "cuda_wgmma")
    assert "/bf16/" in tcache.bucket_key(replace(p, k=4096, n=14336, x_dtype=torch.bfloat16), "cuda_wgmma")


# ------------------------------------------------------------------------------------------- load / save
def test_save_load_roundtrip_and_missing_file(tmp_path):
    path = str(tmp_path / "sub" / "c.json")
    assert tcache.load(path) is None
    c = tcache.TuningCache(H100.name)
    c.put("k1", {"BM": 64}, 10.0, 9.0, {"gpu": H100.name, "command": "mixgemm tune --shapes 4096x4096"})
    assert tcache.save(c, path) == path
    back = tcache.load(path)
    assert back.gpu == H100.name and back.entries == c.entries and back.path == path


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1, "gpu": "x"}', '{"version": 99, "gpu": "x", '
                                  '"entries": {}}', '{"version": 1, "gpu": "x", "entries": {"k": {"cfg": 1}}}'])
def test_corrupt_file_warns_and_is_ignored(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match="ignoring the tuning cache .*bad.json"):
        assert tcache.load(str(path)) is None


def test_corrupt_cache_does_not_break_dispatch(tmp_path, monkeypatch):
    path = tmp_path / "bad.json"
    path.write_text("{oops")
    monkeypatch.setenv(tcache.ENV, str(path))
    tcache.reload()
    qw = _qw(2048, 2048)
    with pytest.warns(RuntimeWarning, match="ignoring the tuning cache"):
        c = choose(_problem(64, qw))
    assert c.config == c.entry.config(_problem(64, qw)) and "tuning cache" not in c.config_source


def test_default_path_uses_env_then_home(monkeypatch, tmp_path):
    assert tcache.default_path(H100.name) == str(tmp_path / "tuning.json")
    monkeypatch.delenv(tcache.ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tcache.default_path(H100.name) == str(tmp_path / ".cache/mixgemm/tuning/h100-80gb-hbm3.json")


# ----------------------------------------------------------------------------------- the registry reads it
GRID = [(m, n, k, bits, g, mode, dt, dev)
        for m in (1, 3, 16, 64, 300, 4096) for (n, k) in ((2048, 2048), (28672, 256), (4096, 14336))
        for bits, g, mode in ((4, 128, "sym"), (8, -1, "zero_point")) for dt in (torch.float16, torch.float32)
        for dev in (H100, A100)]


def _grid_problem(m, n, k, bits, g, mode, dt, dev):
    """A problem of an N x K layer in the format of a small weight (the decisions read the format from it; quantizing
    the full-size layers on the CPU would take most of the test's time)."""
    p = _problem(m, _qw(128, 256, bits, g, mode), dt, dev)
    return replace(p, n=n, k=k, group_size=k if g == -1 else g, num_groups=1 if g == -1 else k // g)


def test_without_a_cache_the_choice_is_the_entry_rule():
    """Without a cache the entry's own choice runs: a shipped table's bucket entry (config_source names it) or the
    kernel's rule (no source). The A100 has no table; only the GEMV's M = 1 tiles (the H200's serve other GPUs) and
    step costs (the H100's)."""
    for m, n, k, bits, g, mode, dt, dev in GRID:
        p = _grid_problem(m, n, k, bits, g, mode, dt, dev)
        c = choose(p)
        own = c.entry.config(p)
        assert c.config == own and c.config_source == getattr(own, "source", ""), (m, n, k, bits, dt, dev.name)
        if c.config_source:
            want = ("h100 table", "gemv_m1 H100", "kept on the GEMV past the h100 table") if dev is H100 else (
                "gemv_m1 H200",)
            want += ("gemv step-cost model",)  # the CUDA-core GEMV's M = 1 fp16 rule (tuning.gemv_steps)
            assert c.config_source.startswith(want), (c.config_source, dev.name)


def _write_cache(path, gpu, entries_):
    c = tcache.TuningCache(gpu)
    for key, cfg in entries_.items():
        c.put(key, cfg, 10.0, 9.0, {"gpu": gpu, "command": "test"})
    tcache.save(c, str(path))
    tcache.reload()


def test_cached_config_is_used_explained_and_overridden(tmp_path):
    qw = _qw(2048, 2048)
    p = _problem(64, qw)
    assert choose(p).kernel == "cuda_wgmma"
    tuned = {**choose(p).config, "STAGES": choose(p).config["STAGES"] + 1}
    assert tuned != choose(p).config
    _write_cache(tmp_path / "tuning.json", H100.name, {tcache.bucket_key(p, "cuda_wgmma"): tuned})
    x = torch.empty(64, 2048, dtype=torch.float16)
    c = mixgemm.explain(x, qw, device=H100)
    assert c.kernel == "cuda_wgmma" and c.config == tuned
    assert f"from tuning cache {tmp_path / 'tuning.json'}" in str(c)
    # a neighbouring shape in the same bucket takes it too, another M bucket does not
    assert mixgemm.explain(torch.empty(60, 2176, dtype=torch.float16), _qw(2000, 2176), device=H100).config == tuned
    assert mixgemm.explain(torch.empty(200, 2048, dtype=torch.float16), qw, device=H100).config != tuned
    with mixgemm.kernel_options(configs={"cuda_wgmma": {"BM": 32, "NWG": 2}}):
        c = mixgemm.explain(x, qw, device=H100)
        assert c.config == {"BM": 32, "NWG": 2} and "kernel_options" in str(c)
    # the cache never changes which entry runs: with wgmma disabled, Triton runs with its own config
    with mixgemm.kernel_options(disable="cuda_wgmma"):
        c = mixgemm.explain(x, qw, device=H100)
        assert c.kernel == "triton_gemm" and c.config_source.startswith("h100 table, gemm w4g")


def test_a_stale_cached_config_is_skipped_with_a_warning(tmp_path):
    """A cache an older mixgemm wrote, whose config an entry no longer takes (cuda_gemv_mma's former SIMT key), is
    skipped with one warning naming the file: the entry's own config runs, as a cached entry choice's does."""
    qw = _qw(4096, 4096)
    p = _problem(2, qw)
    own = choose(p)
    assert own.kernel == "cuda_gemv_mma"
    stale = {**own.config, "SIMT": 1}
    _write_cache(tmp_path / "tuning.json", H100.name, {tcache.bucket_key(p, "cuda_gemv_mma"): stale})
    with pytest.warns(RuntimeWarning, match=r"ignoring the tuning cache's cuda_gemv_mma config at .*tuning.json.*"
                                            r"unknown config key 'SIMT'"):
        c = choose(p)
    assert c.kernel == "cuda_gemv_mma" and c.config == own.config and "tuning cache" not in c.config_source
    p1 = _problem(1, qw)
    _write_choice(tmp_path / "tuning.json", H100.name, p1, "cuda_gemv_mma", stale)
    with pytest.warns(RuntimeWarning, match="unknown config key 'SIMT'"):
        assert choose(p1).kernel == "cuda_gemv"  # the stale choice is skipped: the list's own pick


def test_cache_of_another_gpu_is_ignored(tmp_path):
    qw = _qw(2048, 2048)
    p = _problem(64, qw)
    _write_cache(tmp_path / "tuning.json", A100.name, {tcache.bucket_key(p, "cuda_wgmma"): {"BM": 32}})
    with pytest.warns(RuntimeWarning, match="measured on NVIDIA A100"):
        assert choose(p).config == choose(p).entry.config(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process
        choose(p)


def test_cache_read_once_until_reload(tmp_path):
    qw = _qw(2048, 2048)
    p = _problem(64, qw)
    default = choose(p).config
    path = tmp_path / "tuning.json"
    tuned = {**default, "GROUP_M": 8}
    c = tcache.TuningCache(H100.name)
    c.put(tcache.bucket_key(p, "cuda_wgmma"), tuned, 10.0, 9.0, {})
    tcache.save(c, str(path))  # written after this process looked (no file then): not seen until reload
    assert choose(p).config == default
    tcache.reload()
    assert choose(p).config == tuned


# ------------------------------------------------------------------------------------------- candidates
def wgmma_tile_error(cfg):
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tile_error

    return tile_error(cfg)


def triton_tile_error(cfg):
    # imported late: the Triton module reads TRITON_INTERPRET when imported, which other test modules set when
    # collected
    from mixgemm.kernels.triton_gemm.gemm import tile_error

    return tile_error(cfg)


def test_candidates_are_small_legal_and_not_the_default():
    seen = set()
    for m, n, k, bits, g, mode, dt, dev in GRID:
        p = _grid_problem(m, n, k, bits, g, mode, dt, dev)
        e = choose(p).entry
        cands = e.candidates(p)
        default = e.config(p)
        family = [c for c in cuda_wgmma.small_m_family_candidates(p) if c != default]
        if e.name == "cuda_wgmma" and m <= 16:  # the small-M tile family is tried on top of the neighbours
            assert all(c in cands for c in family if wgmma_tile_error(c) is None)
            cands = [c for c in cands if c not in family]
        # (at most 12 neighbours, and the CUDA-core GEMV's default over two other lane widths and the step-cost
        # model's four cheapest tiles on top)
        assert len(cands) <= 18 and default not in cands
        assert all(cands.count(c) == 1 for c in cands)
        for c in cands:
            if e.name == "cuda_wgmma":
                assert wgmma_tile_error(c) is None
            elif e.name == "triton_gemm":
                assert triton_tile_error(c) is None
            else:
                assert c["RG"] * c["KS"] == 8 or (e.name == "cuda_gemv_mma" and c["KS"] == 16 and c["RG"] == 1)
        seen.add(e.name)
        if cands:
            seen.add(e.name + "+")
    assert {"cuda_gemv", "cuda_gemv_mma", "cuda_wgmma", "triton_gemm"} <= {s.rstrip("+") for s in seen}
    assert all(e.candidates is not None for e in entries("linear"))


def test_tile_errors_reject_illegal_tiles():
    assert wgmma_tile_error({"BM": 12}) and wgmma_tile_error({"BM": 64, "STAGES": 2, "INFLIGHT": 2})
    assert wgmma_tile_error({"BM": 64, "NWG": 2, "STAGES": 4}) is None
    assert triton_tile_error({"BM": 16, "BN": 96}) and triton_tile_error({"BM": 16, "BN": 128}) is None


# ------------------------------------------------------------------------------------- only improve
def _fake(times: dict):
    """A timer that returns the next of each config's listed times."""
    its = {json.dumps(k, sort_keys=True): iter(v) for k, v in times}
    return lambda cfg: next(its[json.dumps(cfg, sort_keys=True)])


@pytest.mark.parametrize("cand_times, accept", [
    ([12.0, 12.1, 11.9], False),  # slower
    ([9.8, 9.9, 9.85], False),  # 1.5 % faster: under the 3 % margin
    ([9.0, 9.1, 9.05], True),  # 9.5 % faster, tight runs
])
def test_only_improve_margin(cand_times, accept):
    default, cand = {"BM": 64}, {"BM": 32}
    timer = _fake([(default, [10.0, 10.05, 9.95]), (cand, cand_times)])
    d, v = tune.tune_bucket(default, [cand], timer, lambda c: None, rounds=3, margin=0.03, log=lambda s: None)
    assert d.median == 10.0
    assert (v.best is not None) == accept
    if accept:
        assert v.best.config == cand


def test_only_improve_noise():
    # 8 % faster at the median, but the default's runs spread 30 %: within noise, no entry
    default, cand = {"BM": 64}, {"BM": 32}
    timer = _fake([(default, [10.0, 8.5, 11.5]), (cand, [9.2, 9.0, 9.4])])
    _, v = tune.tune_bucket(default, [cand], timer, lambda c: None, rounds=3, log=lambda s: None)
    assert v.best is None and "spread" in v.reason


def test_wrong_candidates_are_dropped_loudly():
    default, bad, good = {"BM": 64}, {"BM": 16}, {"BM": 32}
    timer = _fake([(default, [10.0] * 3), (good, [9.0] * 3), (bad, [1.0] * 3)])
    logs = []
    _, v = tune.tune_bucket(default, [bad, good], timer, lambda c: "wrong output" if c == bad else None,
                            log=logs.append)
    assert v.best.config == good
    assert len(logs) == 1 and "DROPPED" in logs[0] and "wrong output" in logs[0]


# ---------------------------------------------------------------------------------------------- the CLI
def test_cli_without_gpu_exits_nonzero(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mixgemm.__main__.main(["tune", "--shapes", "4096x4096", "-m", "1", "16"]) == 2
    err = capsys.readouterr().err
    assert "CUDA GPU" in err and "nothing to tune on a CPU" in err


def test_cli_jobs_and_bad_arguments(capsys):
    args = tune.build_parser().parse_args(["--model", "llama-3-8b", "-m", "1", "16", "--formats", "w4a16"])
    jobs = tune.jobs_from_args(args)
    assert {(j.k, j.n) for j in jobs} >= {(4096, 4096), (4096, 14336), (14336, 4096)}
    assert {j.m for j in jobs} == {1, 16} and {j.fmt for j in jobs} == {"W4A16"}
    assert tune.parse_shapes("4096x14336, 14336x4096") == [(4096, 14336), (14336, 4096)]
    for bad in ("4096", "4096x0", "axb", ""):
        with pytest.raises(ValueError, match="--shapes"):
            tune.parse_shapes(bad)
    assert tune.main(["--shapes", "4096x4096", "--formats", "W2A16"]) == 2
    args = tune.build_parser().parse_args(["--shapes", "4096x4096,4096x14336", "14336x4096"])
    jobs = tune.jobs_from_args(args)  # by shape, then format, then M: one layer's copies serve its jobs in a row
    assert [(j.k, j.n, j.m, j.fmt) for j in jobs[:4]] == [(4096, 4096, 1, "W4A16"), (4096, 4096, 16, "W4A16"),
                                                          (4096, 4096, 256, "W4A16"), (4096, 4096, 1, "W8A16")]
    assert len(jobs) == 3 * 3 * 2
    assert "tune covers the formats" in capsys.readouterr().err


def test_bucket_winner_confirmed_on_other_shapes():
    default, win = {"BM": 64}, {"BM": 32}
    ok = _fake([(default, [10.0] * 3), (win, [9.5] * 3)])
    assert tune.confirm(default, win, ok, lambda c: None, log=lambda s: None)
    slower = _fake([(default, [10.0] * 3), (win, [10.4] * 3)])
    assert not tune.confirm(default, win, slower, lambda c: None, log=lambda s: None)
    logs = []
    assert not tune.confirm(default, win, ok, lambda c: "wrong output", log=logs.append) and "DROPPED" in logs[0]


# ------------------------------------------------------------------------------------------ choice entries
def test_cached_choice_picks_the_entry_and_its_config(tmp_path):
    """A CHOICE entry runs its registry entry for the bucket, past the tables' soft decline (the tensor-core GEMV at
    fp16 M = 1 outside its measured buckets), with its config; explain names the cache. kernel_options' disable and
    force still win; an entry that cannot run the problem (fp32 activations) is not taken."""
    qw = _qw(4096, 4096)
    p = _problem(1, qw)
    assert choose(p).kernel == "cuda_gemv"
    cfg = {**entry_config("cuda_gemv_mma", p), "KS": 8, "RG": 1}
    _write_choice(tmp_path / "tuning.json", H100.name, p, "cuda_gemv_mma", cfg)
    c = choose(p)
    assert c.kernel == "cuda_gemv_mma" and c.config == cfg and "tuning cache" in c.config_source
    assert "the tuning cache chose cuda_gemv_mma" not in dict(c.declined).get("cuda_gemv", "")  # after it in the list
    x = torch.empty(1, 4096, dtype=torch.float16)
    assert "from tuning cache" in str(mixgemm.explain(x, qw, device=H100))
    with mixgemm.kernel_options(disable="cuda_gemv_mma"):
        assert choose(p).kernel == "cuda_gemv"
    with mixgemm.kernel_options(force="cuda_gemv"):
        assert choose(p).kernel == "cuda_gemv"
    assert choose(_problem(1, qw, torch.float32)).kernel == "cuda_gemv"  # the same bucket key is fp16 only anyway
    assert choose(_problem(2, qw)).config != cfg  # another M bucket: the entry's own config


def test_cached_choice_of_a_later_entry_lists_the_earlier_ones(tmp_path):
    qw = _qw(4096, 4096)
    p = _problem(16, qw)
    assert choose(p).kernel == "cuda_gemv_mma"
    cfg = entry_config("cuda_wgmma", p)
    _write_choice(tmp_path / "tuning.json", H100.name, p, "cuda_wgmma", cfg)
    c = choose(p)
    assert c.kernel == "cuda_wgmma" and c.config == cfg
    assert dict(c.declined) == {n: "the tuning cache chose cuda_wgmma for this bucket"
                                for n in ("cuda_gemv_wg_simt", "cuda_gemv_mma", "cuda_gemv", "dequant_cublas")}


def test_choice_entry_needs_an_entry_name(tmp_path):
    path = tmp_path / "tuning.json"
    key = tcache.bucket_key(_problem(1, _qw(4096, 4096)), tcache.CHOICE)
    path.write_text(json.dumps({"version": 1, "gpu": H100.name, "entries": {key: {"config": {}}}}))
    with pytest.warns(RuntimeWarning, match="has no 'entry' name"):
        assert tcache.load(str(path)) is None


def test_alternatives_are_the_soft_declines_and_the_entries_passed_over():
    p = _problem(1, _qw(4096, 4096))  # fp16 M = 1: the tensor-core GEMV declines softly (tables), the GEMMs can run
    assert choose(p).kernel == "cuda_gemv"  # (and the CUDA-core GEMV on wgmma_v1 on plain codes)
    assert [e.name for e in tune.alternatives(p, choose(p).entry)] == ["cuda_gemv_wg_simt", "cuda_gemv_mma",
                                                                       "cuda_wgmma", "triton_gemm"]
    wide = replace(_problem(16, _qw(128, 256)), n=14336, k=4096)  # past the int4 crossover: the GEMVs
    assert choose(wide).kernel == "cuda_wgmma"
    assert [e.name for e in tune.alternatives(wide, choose(wide).entry)] == ["cuda_gemv_mma", "cuda_gemv",
                                                                             "triton_gemm"]
    square = replace(wide, n=8192, k=8192)  # M = 16 where a GEMV runs: the wgmma GEMM (its small-M family) is tried
    assert choose(square).kernel == "cuda_gemv_mma"
    assert "cuda_wgmma" in [e.name for e in tune.alternatives(square, choose(square).entry)]
    fp32 = _problem(1, _qw(4096, 4096), torch.float32)  # the wgmma GEMM cannot run fp32 activations at all
    assert [e.name for e in tune.alternatives(fp32, choose(fp32).entry)] == ["triton_gemm"]


def _compacted(qw):
    from mixgemm.formats.weight import compact_placeholder
    from mixgemm.ops.custom_ops import compact_weight

    return compact_weight(qw, compact_placeholder(qw.qweight))


def test_a_compacted_weight_keeps_its_own_cache_entries(tmp_path):
    """A weight keeping one resident layout has its own bucket keys (entry@layout): a config tuned on the plain codes
    (here the tensor-core GEMV on gemv_mma_v1) must not reach it, where it would send the call to another entry; its
    own entry (tuned with mixgemm tune --layout compact) does."""
    qw = _qw(2048, 2048)
    cw = _compacted(qw)
    plain_p, comp_p = _problem(16, qw), _problem(16, cw)
    assert tcache.bucket_key(comp_p, "cuda_gemv_mma") == tcache.bucket_key(plain_p, "cuda_gemv_mma").replace(
        "/cuda_gemv_mma/", "/cuda_gemv_mma@wgmma_v1/")
    x = torch.empty(16, 2048, dtype=torch.float16)
    before = mixgemm.explain(x, cw, device=H100)
    assert before.kernel == "cuda_gemv_mma" and before.config["WG"] == 1
    plain_tuned = {**mixgemm.explain(x, qw, device=H100).config, "KS": 4}
    _write_cache(tmp_path / "tuning.json", H100.name, {tcache.bucket_key(plain_p, "cuda_gemv_mma"): plain_tuned})
    c = mixgemm.explain(x, cw, device=H100)
    assert c.kernel == "cuda_gemv_mma" and c.config == before.config  # not the plain codes' entry
    assert mixgemm.explain(x, qw, device=H100).config["KS"] == 4
    _write_cache(tmp_path / "tuning.json", H100.name,
                 {tcache.bucket_key(comp_p, "cuda_gemv_mma"): {**before.config, "KS": 8}})
    c = mixgemm.explain(x, cw, device=H100)
    assert c.kernel == "cuda_gemv_mma" and c.config["KS"] == 8 and c.config["WG"] == 1


def test_alternatives_of_a_compacted_weight_read_its_layout():
    """mixgemm tune times, as alternatives of a compacted weight, only entries that read its resident layout."""
    cw = _compacted(_qw(4096, 4096))
    wide = replace(_problem(16, _compacted(_qw(128, 256))), n=14336, k=4096)
    for p in (_problem(1, cw), wide):
        alts = tune.alternatives(p, choose(p).entry)
        assert "cuda_gemv" not in [e.name for e in alts]  # (it reads the plain codes)
        assert all(e.reads(e.config(p)).name == "wgmma_v1" for e in alts)


class _FakeEntry:
    candidates = None  # (KernelEntry's: a function of the problem, or None)

    def __init__(self, name, cfg):
        self.name, self._cfg = name, cfg

    def config(self, problem):
        return self._cfg


@pytest.mark.parametrize("alt_times, want", [([8.0, 8.1, 7.9], "mma"), ([9.9, 9.8, 10.0], None)])
def test_tune_choice_caches_only_a_clear_win(monkeypatch, tmp_path, alt_times, want):
    p = _problem(1, _qw(4096, 4096))
    alt = _FakeEntry("mma", {"KS": 16})
    monkeypatch.setattr(tune, "alternatives", lambda problem, entry: [alt])
    times = iter(alt_times)
    best = tune.Timed({"R": 4}, [10.0, 10.05, 9.95])
    cache = tcache.TuningCache(H100.name)
    args = SimpleNamespace(rounds=3, margin=0.03)
    chosen = {}
    simt = _FakeEntry("simt", {"R": 4})
    gained = tune._tune_choice(cache, chosen, p, simt, best, lambda c, e=None: next(times), lambda c, e=None: None,
                               args, {"shape": "4096x4096", "m": 1}, lambda s: None)
    key = tcache.bucket_key(p, tcache.CHOICE)
    if want:
        assert gained == 1 and cache.entries[key]["entry"] == want and cache.entries[key]["config"] == {"KS": 16}
        # a later shape of the bucket where it is slower drops it
        times2 = iter([10.5] * 3)
        lost = tune._tune_choice(cache, chosen, p, simt, best, lambda c, e=None: next(times2),
                                 lambda c, e=None: None, args, {"shape": "4000x4100", "m": 1}, lambda s: None)
        assert lost == -1 and key not in cache.entries
    else:
        assert gained == 0 and key not in cache.entries


class _FakeEntryWithCandidates(_FakeEntry):
    def __init__(self, name, cfg, cands):
        super().__init__(name, cfg)
        self._cands = cands

    def candidates(self, problem):
        return self._cands


@pytest.mark.parametrize("own_us, want", [(11.0, {"S": 4}), (16.0, None)])
def test_tune_choice_explores_the_candidates_of_a_close_alternative(monkeypatch, own_us, want):
    """An alternative whose own config runs within EXPLORE_WITHIN of the chosen entry's best has its candidates timed
    too (the wgmma GEMM's small-M family against a GEMV): here its candidate S 4 wins and is cached as the choice; one
    further off is timed with its own config only."""
    p = _problem(16, _qw(4096, 4096))
    alt = _FakeEntryWithCandidates("gemm", {"S": 1}, [{"S": 2}, {"S": 4}])
    monkeypatch.setattr(tune, "alternatives", lambda problem, entry: [alt])
    us = {1: own_us, 2: 10.5, 4: 8.0}
    timed = []

    def time_us(cfg, e=None):
        timed.append(cfg["S"])
        return us[cfg["S"]]

    best = tune.Timed({"KS": 8}, [10.0, 10.05, 9.95])
    cache = tcache.TuningCache(H100.name)
    gained = tune._tune_choice(cache, {}, p, _FakeEntry("gemv", {"KS": 8}), best, time_us, lambda c, e=None: None,
                               SimpleNamespace(rounds=3, margin=0.03), {"shape": "4096x4096", "m": 16}, lambda s: None)
    key = tcache.bucket_key(p, tcache.CHOICE)
    if want:
        assert gained == 1 and cache.entries[key] == {**cache.entries[key], "entry": "gemm", "config": want}
        assert set(timed) == {1, 2, 4}
    else:
        assert gained == 0 and key not in cache.entries and set(timed) == {1}


def entry_config(name, p):
    from mixgemm.kernels.registry import entry

    return dict(entry(name).config(p))


def _write_choice(path, gpu, p, name, cfg):
    c = tcache.TuningCache(gpu)
    c.put(tcache.bucket_key(p, tcache.CHOICE), cfg, 10.0, 9.0, {"gpu": gpu}, entry=name)
    tcache.save(c, str(path))
    tcache.reload()


def test_zero_point_gemv_candidates_try_the_x_sum_form():
    """At M = 1 with fp16 x a zero-point weight's CUDA-core GEMV candidates include each tile with its zero points
    through the x sum (ZSUM, gemv.cu GEMV_ZSUM), whose registers change which tile fits; sym weights have no such
    variant, nor bf16 x (the form is fp16 only)."""
    from mixgemm.kernels.cuda_gemv import candidates as _gemv_candidates

    for mode, dtype, expect in (("zero_point", torch.float16, True), ("sym", torch.float16, False),
                                ("zero_point", torch.bfloat16, False)):
        qw = quantize_weight(torch.randn(6144, 4096), bits=4, group_size=128, mode=mode)
        cands = _gemv_candidates(linear_common.linear_problem(1, qw, dtype, H100))
        with_sum = [c for c in cands if c.get("ZSUM")]
        assert bool(with_sum) == expect, (mode, dtype)
        if expect:  # every tile without it (and without PF's second buffer) also appears with it (the lane-width
            # variants, the default's only, and the step-cost model's tiles, LW 32 or not, come as they are)
            from mixgemm.kernels.cuda.gemv_launch import chunks_per_row
            from mixgemm.kernels.cuda_gemv.gemv_steps import ranked_tiles
            from mixgemm.tuning.gemv_steps import step_costs

            tiles = ranked_tiles(6144, chunks_per_row(4, 4096), 4, mode, 132, step_costs(H100.name, 4, mode))
            model = [(t.R, t.U, t.KS, t.LW) for t in tiles[:cuda_gemv.STEP_MODEL_CANDIDATES]]
            assert sum((c["R"], c["U"], c["KS"], c.get("LW", 32)) in model for c in cands) >= 3
            assert all({**c, "ZSUM": 1} in with_sum for c in cands if not c.get("ZSUM") and not c["PF"]
                       and "LW" not in c and (c["R"], c["U"], c["KS"], c.get("LW", 32)) not in model)


def test_compacted_zero_point_m1_candidates_try_the_other_packing():
    """A compacted (wgmma_v1) weight's M = 1 call runs the CUDA-core GEMV on that layout (cuda_gemv_wg_simt): its
    candidates hold, for zero-point and offset weights, its tile with the parameter pair packed the other way (PACK,
    gemv_wg_simt.cu SIMT_PACK); sym weights have no such variant."""
    from dataclasses import replace

    from mixgemm.kernels import cuda_gemv_wg_simt

    for mode in ("zero_point", "offset", "sym"):
        qw = quantize_weight(torch.randn(14336, 4096), bits=4, group_size=128, mode=mode)
        p = replace(linear_common.linear_problem(1, qw, torch.float16, H100), resident="wgmma_v1")
        tiles = [cuda_gemv_wg_simt.choose_config(p), *cuda_gemv_wg_simt.candidates(p)]
        packs = {c.get("PACK") for c in tiles}
        assert packs == ({None} if mode == "sym" else {0, 1}), (mode, tiles)


def test_compacted_m1_candidates_try_one_step_and_the_rule():
    """A compacted weight's M = 1 candidates hold both the CUDA-core GEMV on wgmma_v1's one-step tile and its table's /
    rule's, whichever the dispatcher took (the one-step rule's round of resident warps is a model)."""
    from dataclasses import replace

    from mixgemm.kernels import cuda_gemv_wg_simt
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config, wg_simt_one_step_tile

    for k, n in ((2048, 2048), (4096, 4096)):  # one step applies / its warps need a second round
        qw = quantize_weight(torch.randn(n, k), bits=4, group_size=128)
        p = replace(linear_common.linear_problem(1, qw, torch.float16, H100), resident="wgmma_v1")
        tiles = [dict(c) for c in [cuda_gemv_wg_simt.choose_config(p), *cuda_gemv_wg_simt.candidates(p)]]
        for want in (wg_simt_one_step_tile(k), wg_simt_config(n, k, 4, 132, H100.name, one_step=False)):
            assert dict(want) in tiles, (k, n, want, tiles)


def test_small_m_candidates_flip_double_buffering():
    """At M 2..16 the tensor-core GEMV's candidates include its default with double buffering flipped, for zero-point /
    offset weights together with the packed parameter pair (kernels.cuda_gemv_mma.host.mma_pf_pack); sym weights never
    pack."""
    from mixgemm.kernels.cuda_gemv_mma import candidates as _gemv_mma_candidates

    for mode in ("zero_point", "offset", "sym"):
        qw = quantize_weight(torch.randn(1024, 2048), bits=4, group_size=128, mode=mode)
        p = linear_common.linear_problem(8, qw, torch.float16, H100)
        base = dict(cuda_gemv_mma.choose_config(p))
        cands = _gemv_mma_candidates(p)
        # (1024 rows at KS 16: one block per SM, so the rule double buffers; the candidate is the default without)
        assert base["PF"] == 1 and base.get("PACK", 0) == (mode != "sym")
        assert ({**base, "PF": 0} if mode == "sym" else {**base, "PF": 0, "PACK": 0}) in cands, (mode, cands)
        assert all(not c.get("PACK") for c in cands) or mode != "sym"


def test_sixteen_warp_candidates_flip_the_register_cap():
    """At the 16-row M bucket a 16-warp tensor-core config's candidates include it with the registers capped for two
    blocks per SM (MINB 2) or not, whichever the rule did not pick (the rule asks this machine's compiler)."""
    from mixgemm.kernels.cuda_gemv_mma import candidates as _gemv_mma_candidates

    qw = quantize_weight(torch.randn(4096, 4096), bits=4, group_size=128)
    for m in (9, 16):
        p = linear_common.linear_problem(m, qw, torch.bfloat16, H100)
        base = dict(cuda_gemv_mma.choose_config(p))
        assert base["KS"] * base["RG"] == 16
        flipped = {**base, "MINB": 0 if base.get("MINB", 0) > 1 else 2}
        assert flipped in _gemv_mma_candidates(p)
    p = linear_common.linear_problem(8, qw, torch.bfloat16, H100)  # (M <= 8: not offered)
    assert not any("MINB" in c for c in _gemv_mma_candidates(p))


def test_tune_formats_include_the_zero_point_forms():
    """GPTQ / AWQ checkpoints load as zero-point weights: tune measures them as their own formats (W4A16-ZP,
    W8A16-ZP), whose cache keys differ from the sym formats' (the kernels' tiles do)."""
    assert tune.parse_formats("w4a16-zp, W8A16-ZP") == ["W4A16-ZP", "W8A16-ZP"]
    zp, sym = tune.WEIGHT_ONLY["W4A16-ZP"].weight_config(), tune.WEIGHT_ONLY["W4A16"].weight_config()
    assert (zp.mode, zp.bits, zp.group_size) == ("zero_point", 4, 128) and sym.mode == "sym"
    keys = {tcache.bucket_key(linear_common.linear_problem(1, quantize_weight(torch.randn(256, 512), c), torch.float16,
                                                            H100), "cuda_gemv") for c in (zp, sym)}
    assert len(keys) == 2


def _a8_problem(m, n, k, bits, fmt_kw, per_token=True):
    from mixgemm.formats.int_scales import quantize_weight_int_scales
    from mixgemm.kernels.int8_activations import a8_problem

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1))
    qw = (quantize_weight_int_scales(w, group_size=128, scale_dtype=torch.float16) if fmt_kw == "int-scales"
          else quantize_weight(w, QuantConfig(bits=bits, **fmt_kw)))
    return a8_problem(m, qw, torch.float16, H100, "sym", per_token)


@pytest.mark.parametrize("m,n,k,bits,fmt_kw", [
    (2048, 4608, 4096, 8, dict(group_size=-1, mode="sym")),  # W8A8: a partial wave, the token tiles
    (1024, 4608, 36864, 4, "int-scales"),  # W4A8 per token: TAIL from K = 8192
    (2048, 4096, 4096, 4, dict(group_size=128, mode="sym")),  # the folding tile: BM <= 128
    (16, 28672, 8192, 8, dict(group_size=-1, mode="sym")),  # the small-M tile: cluster split-K
])
def test_int8_gemm_candidates(m, n, k, bits, fmt_kw):
    """mixgemm tune's candidates for the int8 wgmma GEMM: the token tiles with the stages that fit (BM <= 128 for
    the folding tiles), TAIL's splits where a partial wave follows a whole one, split-K at small M; never the
    default, no repeats, each a complete config of the entry."""
    from mixgemm.kernels.a8 import ENTRIES
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import SMEM_LIMIT, stage_bytes

    entry = next(e for e in ENTRIES if e.name == "cuda_wgmma_a8")
    p = _a8_problem(m, n, k, bits, fmt_kw, per_token=fmt_kw == "int-scales" or bits == 8)
    base = entry.config(p)
    cands = entry.candidates(p)
    assert cands and base not in cands and all(cands.count(c) == 1 for c in cands)
    assert all(set(c) >= set(base) for c in cands)
    bms = {c["BM"] for c in cands}
    if m <= 64:
        assert {c["SPLIT"] for c in cands} | {base.get("SPLIT", 1)} >= {1, 2, 4} and bms == {base["BM"]}
        return
    for c in cands:
        per_channel = fmt_kw != "int-scales" and fmt_kw["group_size"] == -1
        sb = stage_bytes(c["BM"], c["NWG"], bits, c["KT"], per_channel)
        assert c["BM"] % 16 == 0 and c["STAGES"] * sb + 1024 <= SMEM_LIMIT
    if fmt_kw == dict(group_size=128, mode="sym"):
        assert bms <= {64, 128}
    else:
        assert bms | {base["BM"]} == set(range(128, 257, 16))
    if k >= 8192:
        assert {c.get("TAIL") for c in cands} | {base.get("TAIL")} >= {0, 2, 3, 4}


def test_int8_cache_entry_is_used(tmp_path):
    """A tuned config of an int8-activation bucket (the wgmma GEMM's) is what the dispatcher hands that entry."""
    p = _a8_problem(2048, 4608, 4096, 8, dict(group_size=-1, mode="sym"))
    c0 = choose(p)
    assert c0.kernel == "cuda_wgmma_a8"
    tuned = c0.entry.candidates(p)[0]
    _write_cache(tmp_path / "tuning.json", H100.name, {tcache.bucket_key(p, "cuda_wgmma_a8"): tuned})
    c = choose(p)
    assert c.config == tuned and "tuning cache" in c.config_source


def test_tune_takes_the_int8_formats():
    assert tune.parse_formats("w8a8, W4A8-token") == ["W8A8", "W4A8-TOKEN"]
    assert tune.INT8["W4A8-TOKEN"].uses_int_scales and tune.INT8["W4A8-TOKEN"].act_block == "token"
    assert tune.INT8["W8A8"].weight_config().group_size == -1
