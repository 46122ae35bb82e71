"""Hugging Face rule sets for the mixture-of-experts decoders (Mixtral, Qwen2-MoE,
Qwen3-MoE): the sets themselves, the layer names they read from the model, and keras-hub's
own importer as a second oracle.

keras-hub names each layer's expert block by a counter shared by every model of the session
(`mixtral_sparse_moe_block_3`), so the sets are made again for the model they restore or
export; the tests build other models first, so the counter is never 0 where it matters.
transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the folders are the same fixtures, and
keras-hub's `Backbone.from_preset(folder)` is the oracle where it reads them.
"""

from __future__ import annotations

import json
import os
import shutil
import types

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Concat, Reshape, Stack, Transpose, huggingface
from objckpt.rules import hf_moe

import hf_cases
from support import bits, by_source, config_folder

DECODER = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": False,
}
MIXTRAL = {**DECODER, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
           "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN2_MOE = {**DECODER, "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
             "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
             "shared_expert_intermediate_size": 12, "decoder_sparse_step": 1,
             "mlp_only_layers": []}
# transformers 5 writes the number of Qwen3-MoE's experts as `num_local_experts`
QWEN3_MOE = {**DECODER, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
             "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "norm_topk_prob": True}
CONFIGS = {"mixtral": MIXTRAL, "qwen2_moe": QWEN2_MOE, "qwen3_moe": QWEN3_MOE}


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
    assert name in objckpt.rules.supported()
    assert chosen.name == f"huggingface({name!r})"
    assert chosen.per_model  # made again for each model it is used with
    assert list(chosen) == list(huggingface(name, config=config))


def test_mixtral_router_and_experts_as_keras_hubs_importer_reads_them():
    rules = by_source(huggingface("mixtral", config=MIXTRAL))
    # without a model: the names the first model of a fresh session has
    router = rules["model.layers.1.block_sparse_moe.gate.weight"]
    assert router.target == ("transformer_layer_1/mixtral_sparse_moe_block_1/"
                             "sparse_feedforward_gate_dense/kernel")
    assert router.transform == Transpose()
    for name, bank in (("w1", "gate"), ("w3", "intermediate"), ("w2", "output")):
        rule = rules[f"model.layers.0.block_sparse_moe.experts.{{e}}.{name}.weight"]
        assert rule.target == ("transformer_layer_0/mixtral_sparse_moe_block/experts/"
                               f"expert_feedforward_{bank}_dense")
        assert rule.transform == Chain(Transpose(), Stack("e", 4))
    assert "lm_head.weight" in rules and not rules["lm_head.weight"].head
    assert "model.layers.{i}.mlp.gate_proj.weight" not in rules  # no dense MLP
    assert "layers.0.block_sparse_moe.gate.weight" in rules  # MixtralModel: bare
    names, _ = huggingface("mixtral", config=MIXTRAL).export_names(
        "transformer_layer_1/mixtral_sparse_moe_block_1/experts/expert_feedforward_output_dense")
    assert [n for n, _ in names] == [
        f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight" for e in range(4)]
    torch_w2 = np.arange(4 * 16 * 32, dtype=np.float32).reshape(4, 16, 32)
    assert names[3][1](torch_w2.transpose(0, 2, 1).copy()).tobytes() == torch_w2[3].tobytes()


def test_qwen3_moe_joins_gate_and_up_per_expert_and_reads_num_local_experts():
    rules = by_source(huggingface("qwen3_moe", config=QWEN3_MOE))
    block = "transformer_layer_0/qwen3_sparse_moe_block"
    for index, name in enumerate(("gate_proj", "up_proj")):
        rule = rules[f"model.layers.0.mlp.experts.{{e}}.{name}.weight"]
        assert rule.target == f"{block}/experts/expert_feedforward_gate_dense"
        assert rule.transform == Chain(Transpose(), Stack("e", 4),
                                       Concat(-1, parts=2, index=index))
    assert rules["model.layers.0.mlp.experts.{e}.down_proj.weight"].transform == Chain(
        Transpose(), Stack("e", 4))
    assert rules["model.layers.{i}.self_attn.q_norm.weight"].target == (
        "transformer_layer_{i}/self_attention/query_dense_layernorm/scale")
    # norm_topk_prob is a setting of the model, not a weight: the set is the same
    assert list(huggingface("qwen3_moe", config={**QWEN3_MOE, "norm_topk_prob": False})) == \
        list(huggingface("qwen3_moe", config=QWEN3_MOE))
    older = {**QWEN3_MOE, "num_experts": 4}
    del older["num_local_experts"]
    assert list(huggingface("qwen3_moe", config=older)) == list(
        huggingface("qwen3_moe", config=QWEN3_MOE))
    assert "transformer.layers.0.mlp.gate.weight" in rules  # the question-answering class


def test_qwen2_moe_shared_expert_and_its_gate():
    rules = by_source(huggingface("qwen2_moe", config=QWEN2_MOE))
    block = "transformer_layer_1/qwen_sparse_moe_block_1"
    for hf, keras in (("gate_proj", "gate"), ("up_proj", "intermediate"),
                      ("down_proj", "output")):
        rule = rules[f"model.layers.1.mlp.shared_expert.{hf}.weight"]
        assert rule.target == f"{block}/shared_expert_dense/feedforward_{keras}_dense/kernel"
        assert rule.transform == Transpose()
    gate = rules["model.layers.1.mlp.shared_expert_gate.weight"]
    assert (gate.target, gate.transform) == (f"{block}/shared_expert_gate_dense/kernel",
                                             Transpose())
    assert rules["model.layers.{i}.self_attn.q_proj.bias"].target == (
        "transformer_layer_{i}/self_attention/query/bias")


@pytest.mark.parametrize("name", ["qwen2_moe", "qwen3_moe"])
def test_dense_layers_are_where_transformers_puts_them(name):
    """decoder_sparse_step and mlp_only_layers decide which layers hold experts; the others'
    MLP is a dense block of its own name."""
    config = {**CONFIGS[name], "num_hidden_layers": 4, "decoder_sparse_step": 2,
              "mlp_only_layers": [3]}
    rules = by_source(huggingface(name, config=config))
    moe, mlp = {"qwen2_moe": ("qwen_sparse_moe_block", "qwen_moe_mlp"),
                "qwen3_moe": ("qwen3_sparse_moe_block", "qwen3_moe_mlp")}[name]
    # layers 0 and 2: (i + 1) % 2 != 0; layer 3 listed; layer 1 the only sparse one
    assert rules["model.layers.1.mlp.gate.weight"].target.startswith(
        f"transformer_layer_1/{moe}/")
    for i, k in ((0, ""), (2, "_1"), (3, "_2")):
        assert f"model.layers.{i}.mlp.gate.weight" not in rules
        rule = rules[f"model.layers.{i}.mlp.up_proj.weight"]
        assert rule.target == (f"transformer_layer_{i}/{mlp}{k}/"
                               "feedforward_intermediate_dense/kernel")


@pytest.mark.parametrize("name,change,said", [
    ("mixtral", {"num_local_experts": None}, "`num_local_experts`"),
    ("mixtral", {"num_hidden_layers": 0}, "`num_hidden_layers`"),
    ("qwen2_moe", {"num_experts": "4"}, "`num_experts`"),
    ("qwen2_moe", {"mlp_only_layers": "0"}, "`mlp_only_layers`"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "`decoder_sparse_step`"),
    ("qwen3_moe", {"head_dim": "x"}, "`head_dim`"),
    ("qwen3_moe", {"hidden_size": None}, "`hidden_size`"),
])
def test_a_bad_config_is_refused_by_name(name, change, said):
    config = {**CONFIGS[name], **change}
    with pytest.raises(errors.InvalidArgumentError, match=f"{said}.*Fix:"):
        huggingface(name, config=config)


GPT_OSS = {**DECODER, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
           "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2}


def test_gpt_oss_sinks_router_and_experts_as_keras_hubs_importer_places_them(tmp_path):
    """keras-hub names GPT-OSS's blocks itself: one set for every model; the experts are one
    tensor per layer on both sides, in the same layout."""
    rules = huggingface(config_folder(tmp_path, GPT_OSS))
    assert rules.name == "huggingface('gpt_oss')" and not rules.per_model
    by = by_source(rules)
    layer = "transformer_layer_{i}"
    assert by["model.layers.{i}.self_attn.sinks"].target == f"{layer}/self_attention/sinks"
    assert by["model.layers.{i}.self_attn.q_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 32), (16, 4, 8)))
    assert by["model.layers.{i}.self_attn.k_proj.bias"].transform == Reshape((16,), (2, 8))
    assert by["model.layers.{i}.self_attn.o_proj.bias"].transform is None
    router = by["model.layers.{i}.mlp.router.weight"]
    assert (router.target, router.transform) == (
        f"{layer}/sparse_moe_block/router/router_dense/kernel", Transpose())
    assert by["model.layers.{i}.mlp.router.bias"].transform is None
    for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
        rule = by[f"model.layers.{{i}}.mlp.experts.{name}"]
        assert (rule.target, rule.transform) == (f"{layer}/sparse_moe_block/experts/{name}",
                                                 None)
    assert by["score.weight"].head and "lm_head.weight" in by
    assert by["layers.{i}.mlp.router.bias"]  # GptOssModel: bare
    with pytest.raises(errors.InvalidArgumentError, match="`head_dim`.*Fix:"):
        huggingface("gpt_oss", config={**GPT_OSS, "head_dim": 0})


def _fake(*paths):
    return types.SimpleNamespace(weights=[types.SimpleNamespace(path=p) for p in paths])


def test_block_names_are_read_from_the_models_variables():
    prefixes = ["mixtral_sparse_moe_block"] * 3
    assert hf_moe.block_names(prefixes) == [
        "mixtral_sparse_moe_block", "mixtral_sparse_moe_block_1", "mixtral_sparse_moe_block_2"]
    model = _fake("token_embedding/embeddings",
                  "transformer_layer_0/mixtral_sparse_moe_block_7/experts/bank",
                  "transformer_layer_0/self_attention/query/kernel",
                  "transformer_layer_2/mixtral_sparse_moe_block_9/gate/kernel")
    # layer 1 not in the model: the fresh-session name, which restore then reports
    assert hf_moe.block_names(prefixes, model) == [
        "mixtral_sparse_moe_block_7", "mixtral_sparse_moe_block_1", "mixtral_sparse_moe_block_9"]
    two = _fake("transformer_layer_0/mixtral_sparse_moe_block_1/a",
                "transformer_layer_0/mixtral_sparse_moe_block_4/b")
    with pytest.raises(errors.InvalidArgumentError, match=(
            r"layer 0 holds 2: `transformer_layer_0/mixtral_sparse_moe_block_1`, "
            r"`transformer_layer_0/mixtral_sparse_moe_block_4`.*Fix:")):
        hf_moe.block_names(prefixes, two, what="Mixtral")


def test_a_set_made_by_name_is_made_again_for_each_model(tmp_path, monkeypatch):
    class MixtralBackbone:  # named as keras-hub's; its layers named by a later session
        weights = _fake(*(f"transformer_layer_{i}/mixtral_sparse_moe_block_{i + 4}/x"
                          for i in range(2))).weights

    rules = huggingface("mixtral", config=MIXTRAL)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mixtral").mkdir()  # a folder of the type's name is not read when remade
    made = rules.for_model(MixtralBackbone())
    assert made is not rules and made.per_model and made.config == rules.config
    assert by_source(made)["model.layers.1.block_sparse_moe.gate.weight"].target == (
        "transformer_layer_1/mixtral_sparse_moe_block_5/sparse_feedforward_gate_dense/kernel")
    plain = huggingface("llama", config={**DECODER, "model_type": "llama"})
    assert not plain.per_model and plain.for_model(MixtralBackbone()) is plain


# --- keras-hub: two models in one session, and its importer -----------------------------------

def _keras_hub():
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3"):
        pytest.skip("keras-hub's models need Keras 3")
    return keras_hub


def _case(case: str, cls: str):
    return next(c for c in hf_cases.CASES if (c.case, c.cls) == (case, cls))


def _values(model) -> list:
    """Every variable's bits, in the model's order (paths differ between models: counters)."""
    return [bits(v.numpy()) for v in model.weights]


def _blocks(model) -> set:
    return {p.split("/")[1] for p in hf_moe.variable_paths(model)
            if "moe_block" in p or "moe_mlp" in p}


MOE_CASES = [("mixtral", "MixtralForCausalLM"), ("qwen2_moe", "Qwen2MoeForCausalLM"),
             ("qwen3_moe", "Qwen3MoeForCausalLM"), ("qwen3_moe_dense", "Qwen3MoeForCausalLM")]


@pytest.mark.parametrize("case,cls", MOE_CASES)
def test_the_second_model_of_a_session_restores_plans_and_exports(tmp_path, case, cls):
    """A set made from the folder before any model exists, used with a model whose blocks
    carry counters (another model built first): plan complete, strict restore, every
    variable bit-equal to the first model's restore, export the folder's tensors."""
    _keras_hub()
    row = _case(case, cls)
    folder = row.folder("float32")
    rules = huggingface(folder)
    first, second = hf_cases.backbone(row), hf_cases.backbone(row)
    assert _blocks(first).isdisjoint(_blocks(second))
    assert any(name[-1].isdigit() for name in _blocks(second))
    the_plan = objckpt.plan(second, folder, rules=rules)
    assert the_plan.complete, the_plan.describe()
    objckpt.restore(first, folder, rules=rules)
    report = objckpt.restore(second, folder, rules=rules)
    assert not report.missing and not report.unexpected
    assert len(report.restored) == len(second.weights)
    assert _values(second) == _values(first)
    out = objckpt.export(second, tmp_path / "out", rules=rules)
    ours = _file_tensors(out)
    theirs = _file_tensors(os.path.join(folder, "model.safetensors"))
    assert ours == theirs


def _file_tensors(path: str) -> dict:
    from safetensors.numpy import load_file

    return {k: bits(v) for k, v in load_file(path).items()}


@pytest.mark.parametrize("case,cls", MOE_CASES[:3])
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, case, cls):
    """keras-hub's `from_preset(folder)` and objckpt's restore of the same folder into a
    backbone built after it: every variable bit-equal. keras-hub 0.32 reads Qwen3-MoE's
    number of experts as `num_experts` only (transformers 5 writes `num_local_experts`):
    for it, a copy of the folder whose config.json has both."""
    keras_hub = _keras_hub()
    row = _case(case, cls)
    folder = row.folder("float32")
    if case == "qwen3_moe":
        copy = str(tmp_path / "copy")
        shutil.copytree(folder, copy)
        config = hf_cases.config(row)
        config["num_experts"] = config["num_local_experts"]
        with open(os.path.join(copy, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        folder = copy
    oracle = keras_hub.models.Backbone.from_preset(folder)
    ours = hf_cases.backbone(row)
    objckpt.restore(ours, folder)  # one call: the set config.json names, made for `ours`
    assert type(ours) is type(oracle)
    assert _values(ours) == _values(oracle)


def test_ensembles_and_averages_of_moe_folders(tmp_path):
    """load_ensemble and average, whose members and templates are other models of the
    session: the values of a plain restore."""
    _keras_hub()
    row = _case("mixtral", "MixtralForCausalLM")
    folder = row.folder("float32")
    reference = hf_cases.backbone(row)
    objckpt.restore(reference, folder)
    rules = huggingface(folder)
    ensemble = objckpt.load_ensemble(hf_cases.backbone(row), [folder, folder], rules=rules)
    for member in ensemble.members:
        assert _values(member) == _values(reference)
    averaged = hf_cases.backbone(row)
    objckpt.average(averaged, [folder, folder], rules=rules)
    assert _values(averaged) == _values(reference)


def test_a_model_of_another_layout_is_refused_by_name():
    """A Qwen2-MoE folder whose layers hold experts into a backbone of dense layers only:
    each bank named, nothing changed."""
    _keras_hub()
    sparse, dense = _case("qwen2_moe", "Qwen2MoeForCausalLM"), _case(
        "qwen2_moe_dense", "Qwen2MoeForCausalLM")
    model = hf_cases.backbone(dense)
    before = _values(model)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(model, sparse.folder("float32"))
    said = str(caught.value)
    assert "model.layers.1.mlp.shared_expert_gate.weight" in said
    assert "experts.{0..3}.down_proj.weight" in said
    assert _values(model) == before


# --- transformers 5's form: each layer's experts in one tensor per bank -----------------------

def test_mixtral_banks_in_transformers_5s_form_are_split_and_swapped():
    """`mlp.experts.gate_up_proj` (experts, 2 * inner, hidden) is w1 then w3 along axis 1:
    each keras-hub bank takes its half with the last two axes swapped."""
    rules = huggingface("mixtral", config=MIXTRAL)
    by = {}
    for rule in rules:
        by.setdefault(rule.source, []).append(rule)
    gate, intermediate = by["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate.target.endswith("/experts/expert_feedforward_gate_dense")
    assert intermediate.target.endswith("/experts/expert_feedforward_intermediate_dense")
    fused = np.arange(4 * 64 * 16, dtype=np.float32).reshape(4, 64, 16)
    assert gate.transform(fused).tobytes() == fused[:, :32].transpose(0, 2, 1).copy().tobytes()
    assert intermediate.transform(fused).tobytes() == (
        fused[:, 32:].transpose(0, 2, 1).copy().tobytes())
    (down,) = by["model.layers.1.mlp.experts.down_proj"]
    assert down.transform == Transpose((0, 2, 1))
    (router,) = by["model.layers.1.mlp.gate.weight"]
    assert router.target.endswith("/sparse_feedforward_gate_dense/kernel")
    # export writes the original form: the first rule of a bank is its Stack
    names, _ = rules.export_names(gate.target)
    assert names[0][0] == "model.layers.1.block_sparse_moe.experts.0.w1.weight"


@pytest.mark.parametrize("case", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_the_folders_key_form_is_named_and_a_mix_is_refused(tmp_path, case):
    row = _case(case, {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                       "qwen3_moe": "Qwen3MoeForCausalLM"}[case])
    assert huggingface(row.folder("float32")).key_form == "original"
    new = row._replace(form=hf_cases.NEW_FORM)
    assert huggingface(new.folder("float32")).key_form == "transformers 5"
    from safetensors.numpy import load_file, save_file

    mixed = tmp_path / "mixed"
    shutil.copytree(row.folder("float32"), mixed)
    entries = load_file(str(mixed / "model.safetensors"))
    entries.update({k: v for k, v in load_file(
        os.path.join(new.folder("float32"), "model.safetensors")).items()
        if k.endswith("experts.down_proj")})
    save_file(entries, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(errors.InvalidArgumentError, match=(
            r"holds keys in two forms: `model\.layers\.0\..*experts\.0\..*` \(original.*"
            r"`model\.layers\.0\.mlp\.experts\.down_proj` \(transformers 5.*Fix:")):
        huggingface(str(mixed))


def test_one_call_names_the_form_it_read():
    _keras_hub()
    row = _case("qwen3_moe", "Qwen3MoeForCausalLM")._replace(form=hf_cases.NEW_FORM)
    model = hf_cases.backbone(row)
    report = objckpt.restore(model, row.folder("bfloat16"))
    assert "huggingface('qwen3_moe')" in str(report)
    assert "its keys in the transformers 5 form" in str(report)
    assert len(report.restored) == len(model.weights)
