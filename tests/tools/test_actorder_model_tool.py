"""tools/checks/actorder_model.py (act-order at model level) on the CPU with a tiny Llama: every variant runs in both
modes, the folded models give the in-kernel model's one-token logits bit for bit, and the act-order layers are the
ones GPTQ would give (q / k / v and gate / up sharing a permutation)."""

from __future__ import annotations

import json

from tools.checks import actorder_model


def test_actorder_model_tool_on_cpu(tmp_path):
    rc = actorder_model.main(["--device", "cpu", "--tiny", "--new-tokens", "3", "--prompt-len", "5", "--repeats", "1",
                              "--warmup", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "actorder_model.json").read_text())
    assert rc == 0 and not res["errors"] and not res["failures"]
    (model,) = res["models"]
    assert model["m1_logits_equal"]
    assert set(model["variants"]) == set(actorder_model.VARIANTS)
    for variant in model["variants"].values():
        assert variant["generate"]["tokens_per_s"] > 0 and variant["compiled"]["tokens_per_s"] > 0


def test_act_order_permutations_are_shared_per_input():
    import mixgemm
    from mixgemm.integrations.hf import model_config, random_model

    model = random_model(model_config("tiny-llama", hidden_size=128, intermediate_size=256), seed=1)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=128, mode="zero_point"))
    assert actorder_model.add_act_order(model, seed=2) == 2 * 7  # every decoder layer's Linear, lm_head left plain
    assert not model.lm_head.act_order
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert attn.q_proj.input_perm is attn.k_proj.input_perm is attn.v_proj.input_perm
    assert mlp.gate_proj.input_perm is mlp.up_proj.input_perm
    assert not (attn.o_proj.input_perm is attn.q_proj.input_perm or mlp.down_proj.input_perm is mlp.up_proj.input_perm)
