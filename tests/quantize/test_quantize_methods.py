"""method="hqq" / "gptq" (mixgemm.quantize) and mixgemm.evaluate_perplexity on the CPU: the formats they write, that
they beat round to nearest on the error each minimizes, the kernels on their weights against the reference (the
GPU script's grid, tools.checks.hqq_gptq_gpu, with the CPU path), quantize_ / from_pretrained through them, and bad
input."""

from __future__ import annotations

import math

import pytest
import torch

import mixgemm
from mixgemm.formats.weight import QuantConfig, dequantize_weight, quantize_weight
from mixgemm.nn.linear import QuantLinear
from mixgemm.quantize.gptq import GPTQParams, gptq_quantize_weight
from mixgemm.quantize.hqq import HQQParams, hqq_quantize_weight
from tools.checks.hqq_gptq_gpu import build_model, check_kernels

transformers = pytest.importorskip("transformers")

MODES = ("sym", "zero_point", "offset")


def _weight(gen, n=37, k=256, dtype=torch.float32):
    w = torch.randn(n, k, generator=gen) * 0.05
    w[torch.rand(n, k, generator=gen) < 0.01] *= 8  # a few outliers, as real weights have
    return w.to(dtype)


def _inputs(gen, k=256, tokens=2048):
    mix = torch.randn(k, k, generator=gen) / k**0.5
    x = torch.randn(tokens, k, generator=gen) @ mix + 0.1 * torch.randn(tokens, k, generator=gen)
    x[:, :4] *= 10  # a few loud input features
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 128), (8, -1), (8, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hqq_writes_the_plain_format_with_less_error(mode, bits, group_size, dtype, torch_gen):
    w = _weight(torch_gen, dtype=dtype)
    w0 = w.clone()
    cfg = QuantConfig(bits=bits, group_size=group_size, mode=mode, scale_dtype=torch.float16)
    rtn, hqq = quantize_weight(w, cfg), hqq_quantize_weight(w, cfg)
    assert torch.equal(w, w0)
    for a, b in [(rtn.qweight, hqq.qweight), (rtn.scales, hqq.scales), (rtn.zeros, hqq.zeros),
                 (rtn.offsets, hqq.offsets)]:
        assert (a is None) == (b is None) and (a is None or (a.shape, a.dtype) == (b.shape, b.dtype))
    assert hqq.config == cfg and hqq.shape == rtn.shape
    err = lambda qw: float((dequantize_weight(qw, torch.float64) - w.double()).abs().mean())
    assert err(hqq) < err(rtn), (err(hqq), err(rtn))


def test_hqq_settings_and_constant_groups(torch_gen):
    w = _weight(torch_gen)
    w[3, :128] = 0.25  # a constant group: s = 0, still exact
    w[5, 128:] = 0.0
    for mode in MODES:
        for params in (HQQParams(), HQQParams(range_search=0, fit_scale=False), HQQParams(iters=0)):
            d = dequantize_weight(hqq_quantize_weight(w, QuantConfig(mode=mode), params))
            assert torch.equal(d[5, 128:], w[5, 128:])
            if mode != "sym":
                torch.testing.assert_close(d[3, :128], w[3, :128], rtol=1e-3, atol=0)
    with pytest.raises(ValueError, match="lp_norm"):
        HQQParams(lp_norm=0)
    with pytest.raises(ValueError, match="iters"):
        HQQParams(iters=-1)
    with pytest.raises(ValueError, match="non-finite"):
        hqq_quantize_weight(torch.full((4, 128), float("nan")), QuantConfig())


@pytest.mark.parametrize("mode,group_size,bits", [("sym", 128, 4), ("zero_point", 32, 4), ("offset", 64, 4),
                                                  ("sym", -1, 8)])
def test_gptq_beats_rtn_on_the_output_error(mode, group_size, bits, torch_gen):
    w, x = _weight(torch_gen), _inputs(torch_gen)
    cfg = QuantConfig(bits=bits, group_size=group_size, mode=mode)
    out_err = lambda d: float((x @ (w - d).T).square().mean())
    rtn = out_err(dequantize_weight(quantize_weight(w, cfg)))
    for act_order in (False, True):
        res = gptq_quantize_weight(w, 2 * x.T @ x, cfg, GPTQParams(act_order=act_order))
        assert res.weight.config == cfg and (res.perm is not None) == act_order
        layer = QuantLinear.from_quantized(res.weight, None, input_perm=res.perm)
        assert out_err(layer.dequantize()) < 0.6 * rtn  # measured 0.25-0.3x
        torch.testing.assert_close(layer(x[:8]), x[:8] @ layer.dequantize().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,group_size", [("sym", 128), ("zero_point", 32), ("offset", -1)])
def test_gptq_with_an_identity_hessian_is_round_to_nearest(mode, group_size, torch_gen):
    """H = I spreads no error (the inverse's factor is diagonal): every code and parameter is round to nearest's."""
    w = _weight(torch_gen)
    cfg = QuantConfig(group_size=group_size, mode=mode)
    got, want = gptq_quantize_weight(w, torch.eye(256), cfg).weight, quantize_weight(w, cfg)
    assert torch.equal(got.codes(), want.codes()) and torch.equal(got.scales, want.scales)
    for a, b in [(got.zeros, want.zeros), (got.offsets, want.offsets)]:
        assert (a is None and b is None) or torch.equal(a, b)


def test_gptq_bad_hessians(torch_gen):
    w = _weight(torch_gen)
    with pytest.raises(ValueError, match=r"hessian must be a tensor of shape \(256, 256\)"):
        gptq_quantize_weight(w, torch.eye(128), QuantConfig())
    with pytest.raises(ValueError, match="non-finite"):
        gptq_quantize_weight(w, torch.full((256, 256), float("inf")), QuantConfig())
    dead = torch.eye(256)
    dead[:128, :128] = 0  # inputs that never fire: their weights go to 0, the rest is quantized
    d = dequantize_weight(gptq_quantize_weight(w, dead, QuantConfig()).weight)
    assert torch.equal(d[:, :128], torch.zeros(37, 128))


def test_kernels_on_hqq_and_gptq_weights_equal_the_reference():
    rows = check_kernels(torch.device("cpu"), [(96, 256), (40, 384)], ms=(1, 16, 256),
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    assert len(rows) == 2 * 5 * 3 * 3 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model("smoke", None, "cpu", torch.float32)


def _calibration(n=3, t=24, vocab=512):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (2, t), generator=g) for _ in range(n)]


@pytest.mark.parametrize("config", [mixgemm.W4A16(method="gptq"), mixgemm.W4A16(mode="zero_point", method="gptq",
                                                                                act_order=True),
                                    mixgemm.W8A16(method="gptq"), mixgemm.W4A8(method="gptq")])
def test_quantize_gptq_replaces_every_linear(config, tiny):
    import copy

    model = copy.deepcopy(tiny)
    report = mixgemm.quantize_(model, config, calibration=_calibration(), progress=False)
    assert len(report.replaced) == 3 * 7 + 1 and not report.skipped and not report.rounded  # + the untied lm_head
    assert set(report.seconds) == {"capture", "hessians", "gptq", "propagate"}
    assert all(isinstance(m, QuantLinear) for n, m in model.named_modules() if n in report.replaced)
    if config.act_order:
        assert all(model.get_submodule(n).input_perm is not None or n.endswith("down_proj")
                   for n in report.replaced)
    ids = _calibration(1)[0]
    with torch.no_grad():
        got, want = model(ids).logits, tiny(ids).logits
    assert torch.isfinite(got).all() and float((got - want).norm() / want.norm()) < 0.5


def test_gptq_beats_rtn_on_a_model(tiny):
    """The tiny model's logits on held-out ids: GPTQ (calibrated on other ids) closer to float than RTN."""
    import copy

    held = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = tiny(held).logits
    errs = {}
    for method in ("rtn", "hqq", "gptq"):
        model = copy.deepcopy(tiny)
        kw = {"calibration": _calibration(8, 32)} if method == "gptq" else {}
        mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, method=method), progress=False, **kw)
        with torch.no_grad():
            errs[method] = float((model(held).logits - want).norm() / want.norm())
    assert errs["gptq"] < errs["rtn"], errs


def test_calibration_forms(tiny):
    import copy

    ids = _calibration(1)[0]
    forms = [[ids], [ids.tolist()], [ids[0].tolist()], [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}],
             (b for b in [ids])]
    for calibration in forms:
        model = copy.deepcopy(tiny)
        report = mixgemm.quantize_(model, mixgemm.W4A16(method="gptq"), calibration=calibration, progress=False)
        assert len(report.replaced) == 22


def test_bad_input(tiny):
    import copy

    model = copy.deepcopy(tiny)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gptq = mixgemm.W4A16(method="gptq")
    cases = [
        (dict(calibration=None), ValueError, "needs calibration"),
        (dict(calibration=[]), ValueError, "calibration is empty"),
        (dict(calibration=iter([])), ValueError, "calibration is empty"),
        (dict(calibration=torch.zeros(2, 8, dtype=torch.long)), TypeError, "wrap a single batch in a list"),
        (dict(calibration=[torch.zeros(2, 8)]), TypeError, r"calibration\[0\] must hold integer token ids"),
        (dict(calibration=[torch.zeros(2, 0, dtype=torch.long)]), ValueError, r"calibration\[0\] must be token ids"),
        (dict(calibration=[torch.zeros(1, 2, 8, dtype=torch.long)]), ValueError, r"calibration\[0\]"),
        (dict(calibration=[{"ids": 1}]), ValueError, "without 'input_ids'"),
        (dict(calibration=[[[1, 2], [3]]]), TypeError, r"calibration\[0\] is not a batch"),
        (dict(calibration=42), TypeError, "iterable of token-id batches"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            mixgemm.quantize_(model, gptq, progress=False, **kw)
    with pytest.raises(ValueError, match="calibration is read by method='gptq' and 'hqq'; this config has "
                                         "method='rtn'"):
        mixgemm.quantize_(model, mixgemm.W4A16(), calibration=_calibration())
    with pytest.raises(ValueError, match="calibration is empty"):
        mixgemm.quantize_(model, mixgemm.W4A16(method="hqq"), calibration=[])
    with pytest.raises(ValueError, match="hqq_weighting='none' turns off"):
        mixgemm.quantize_(model, mixgemm.W4A16(method="hqq", hqq_weighting="none"), calibration=_calibration())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # nothing was quantized
    with pytest.raises(ValueError, match=r"method must be one of \('rtn', 'hqq', 'gptq'\), got 'awq'"):
        mixgemm.W4A16(method="awq")
    with pytest.raises(ValueError, match=r"hqq_weighting must be one of \('inputs', 'none'\), got 'x'"):
        mixgemm.W4A16(method="hqq", hqq_weighting="x")
    with pytest.raises(ValueError, match="act_order=True .* needs method='gptq'"):
        mixgemm.W4A16(method="hqq", act_order=True)
    with pytest.raises(ValueError, match="W4A8 cannot hold act_order=True"):
        mixgemm.W4A8(method="gptq", act_order=True)
    with pytest.raises(ValueError, match="int_scales=True\\) cannot hold method='hqq'"):
        mixgemm.W4A8(act_block="token", int_scales=True, method="hqq")
    assert not mixgemm.W4A8(act_block="token", method="hqq").uses_int_scales
    from mixgemm.quantize_api import quantize_weight_tensor

    with pytest.raises(ValueError, match="needs calibration data"):
        quantize_weight_tensor(torch.randn(8, 128), None, gptq)


def test_hqq_input_weighting_lowers_the_output_error(torch_gen):
    """Weighed by its inputs' mean squares, HQQ trades weight error on quiet channels for less on loud ones: less
    error in the layer's output on inputs of those statistics (held out), more in the weight."""
    w, x = _weight(torch_gen), _inputs(torch_gen)
    held = _inputs(torch_gen)
    for mode in MODES:
        cfg = QuantConfig(group_size=128, mode=mode)
        plain, weighted = hqq_quantize_weight(w, cfg), hqq_quantize_weight(w, cfg, importance=x.square().mean(0))
        out_err = lambda qw: float((held @ (w - dequantize_weight(qw)).T).square().mean())
        w_err = lambda qw: float((w - dequantize_weight(qw)).square().mean())
        assert out_err(weighted) < 0.8 * out_err(plain), (mode, out_err(weighted), out_err(plain))
        assert w_err(weighted) > w_err(plain), mode
    # equal weights are no weights; one weight per input channel, finite and >= 0
    cfg = QuantConfig(group_size=128, mode="zero_point")
    assert torch.equal(hqq_quantize_weight(w, cfg, importance=torch.full((256,), 3.0)).codes(),
                       hqq_quantize_weight(w, cfg).codes())
    for bad, match in [(torch.ones(255), r"shape \(256,\)"), (-torch.ones(256), ">= 0"),
                       (torch.full((256,), float("nan")), "finite")]:
        with pytest.raises(ValueError, match=match):
            hqq_quantize_weight(w, cfg, importance=bad)


def test_quantize_hqq_weighs_each_linear_by_its_inputs(tiny):
    """quantize_'s HQQ runs random tokens (fixed seed) through the float model and weighs each Linear by its
    inputs' mean squares: the codes are hqq_quantize_weight's with those moments; calibration batches take the
    random tokens' place; hqq_weighting="none" and a model that takes no token ids quantize unweighted. The model's
    mode and the float layers it reads are not modified."""
    import copy

    from mixgemm.quantize.input_moments import input_second_moments, random_token_batches

    config = mixgemm.W4A16(group_size=32, mode="zero_point", method="hqq")
    names = [n for n, m in tiny.named_modules() if type(m) is torch.nn.Linear]
    groups, why = random_token_batches(tiny)
    assert tiny.config.max_position_embeddings == 256  # the longest length, 1024, is capped there
    assert why is None and [g[0]["input_ids"].shape[1] for g in groups] == [16, 64, 256]
    for calibration in (None, _calibration()):
        model = copy.deepcopy(tiny).train()
        source = groups if calibration is None else [[{"input_ids": ids} for ids in calibration]]
        moments = input_second_moments(tiny, {n: tiny.get_submodule(n) for n in names}, source)
        assert sorted(moments) == sorted(names)
        report = mixgemm.quantize_(model, config, calibration=calibration, progress=False)
        assert model.training and len(report.replaced) == 22
        assert report.hqq_inputs.startswith("random tokens" if calibration is None else "calibration (3 batches)")
        for name in names:
            want = hqq_quantize_weight(tiny.get_submodule(name).weight.detach(), config.weight_config(),
                                       importance=moments[name])
            assert torch.equal(model.get_submodule(name).quantized_weight().codes(), want.codes()), name
    model = copy.deepcopy(tiny)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="zero_point", method="hqq",
                                                    hqq_weighting="none"), progress=False)
    assert report.hqq_inputs == "none (hqq_weighting='none')"
    name = names[0]
    want = hqq_quantize_weight(tiny.get_submodule(name).weight.detach(), config.weight_config())
    assert torch.equal(model.get_submodule(name).quantized_weight().codes(), want.codes())
    seq = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    report = mixgemm.quantize_(seq, config, progress=False)
    assert report.hqq_inputs == "none (the model has no config.vocab_size to draw random tokens from)"
    assert "HQQ's input weighting: none" in str(report)


def test_from_pretrained_quantizes_with_hqq_while_loading(tiny, tmp_path):
    tiny.save_pretrained(str(tmp_path))
    config = mixgemm.W4A16(group_size=64, mode="zero_point", method="hqq")
    model = mixgemm.from_pretrained(str(tmp_path), quantization_config=config, progress=False)
    assert len(model.mixgemm_report.quantized) == 22 and not model.mixgemm_report.skipped
    assert model.mixgemm_report.hqq_inputs.startswith("none: each layer is quantized as it is read")
    for name in model.mixgemm_report.quantized:
        want = hqq_quantize_weight(tiny.get_submodule(name).weight.detach(), config.weight_config())
        got = model.get_submodule(name).quantized_weight()
        assert torch.equal(got.codes(), want.codes()) and torch.equal(got.scales, want.scales), name
    model.save_pretrained(str(tmp_path / "q"))  # the same format: saved and read back bit for bit
    again = mixgemm.from_pretrained(str(tmp_path / "q"), progress=False)
    ids = _calibration(1)[0]
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="method='gptq' needs calibration data"):
        mixgemm.from_pretrained(str(tmp_path), quantization_config=mixgemm.W4A16(method="gptq"), progress=False)


def _hf_doc_perplexity(model, ids, max_length, stride):
    """transformers' "Perplexity of fixed-length models" as its docs write it (labels, the model's own loss), with
    one fix: a window's loss averages the labels after the shift (target_ids[:, 1:]), so that many tokens weigh it
    (the docs subtract one per window, exact for the first window only)."""
    seq_len, nll_sum, n_tokens, prev_end = ids.shape[1], 0.0, 0, 0
    for begin in range(0, seq_len, stride):
        end = min(begin + max_length, seq_len)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss
        num_loss_tokens = int((target_ids[:, 1:] != -100).sum())
        nll_sum += float(loss) * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end = end
        if end == seq_len:
            break
    return math.exp(nll_sum / n_tokens)


@pytest.mark.parametrize("max_length,stride", [(64, 64), (64, 16), (40, 25), (300, 7)])
def test_evaluate_perplexity_is_the_documented_measure(max_length, stride, tiny):
    ids = torch.randint(0, 512, (1, 150), generator=torch.Generator().manual_seed(3))
    got = mixgemm.evaluate_perplexity(tiny, None, ids, max_length=max_length, stride=stride)
    assert got == pytest.approx(_hf_doc_perplexity(tiny, ids, max_length, stride), rel=1e-5)
    assert mixgemm.evaluate_perplexity(tiny, None, ids[0], max_length=max_length, stride=stride,
                                       max_tokens=100) == pytest.approx(
        _hf_doc_perplexity(tiny, ids[:, :100], max_length, stride), rel=1e-5)


def test_evaluate_perplexity_bad_input(tiny):
    ids = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        mixgemm.evaluate_perplexity(tiny, None, ids, max_length=1)
    with pytest.raises(ValueError, match=r"stride must be an int in \[1, max_length=16\]"):
        mixgemm.evaluate_perplexity(tiny, None, ids, max_length=16, stride=17)
    with pytest.raises(ValueError, match="at least 2"):
        mixgemm.evaluate_perplexity(tiny, None, ids[:1])
    with pytest.raises(TypeError, match="text must be a str"):
        mixgemm.evaluate_perplexity(tiny, None, [1, 2, 3])
    with pytest.raises(ValueError, match="a tokenizer is needed"):
        mixgemm.evaluate_perplexity(tiny, None, "some text")
    with pytest.raises(ValueError, match="integer tensor"):
        mixgemm.evaluate_perplexity(tiny, None, ids.float())
