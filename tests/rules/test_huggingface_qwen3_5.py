"""Hugging Face rule sets for Qwen3.5's and Qwen3.5-MoE's text decoders (full-attention and
gated-delta-net layers; experts): the sets themselves, and keras-hub's own importer as a
second oracle.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the set needs no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` reads the committed fixtures.
keras-hub 0.32 reads Qwen3.5 (-MoE) under `model_type` "qwen3_5" ("qwen3_5_moe") with the
decoder under `model.language_model.` (the multimodal checkpoints' layout) only: it is given
a copy of the text fixture so named.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "hf")

QWEN3_5 = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 64,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25},
}


class Qwen3_5CausalLM:  # what the set is chosen by: the class name
    pass


def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, QWEN3_5))
    assert "qwen3_5_text" in objckpt.rules.supported()
    assert chosen.name == "huggingface('qwen3_5_text')"
    assert list(chosen) == list(huggingface("qwen3_5_text", config=QWEN3_5))


def test_both_kinds_of_layer_and_their_layouts():
    rules = by_source(huggingface("qwen3_5_text", config=QWEN3_5))
    query = rules["model.layers.{i}.self_attn.q_proj.weight"]
    assert query.target == "transformer_layer_{i}/self_attention/query/kernel"
    # each head's query and its output gate: (4 * 8 * 2, 16) -> (16, 4, 16)
    assert query.transform == Chain(Transpose(), Reshape((16, 64), (16, 4, 16)))
    assert rules["layers.{i}.self_attn.k_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (16, 2, 8)))
    assert rules["model.layers.{i}.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))
    assert rules["model.layers.{i}.self_attn.q_norm.weight"].target == (
        "transformer_layer_{i}/self_attention/query_norm/scale")
    # the depthwise convolution over q, k and v: 2 * 2 * 4 + 4 * 4 = 32 channels
    conv = rules["model.layers.{i}.linear_attn.conv1d.weight"]
    assert conv.target == "transformer_layer_{i}/linear_attn/conv1d_kernel"
    assert conv.transform == Reshape((32, 1, 4), (32, 4))
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        rule = rules[f"model.layers.{{i}}.linear_attn.{name}.weight"]
        assert (rule.target, rule.transform) == (
            f"transformer_layer_{{i}}/linear_attn/{name}/kernel", Transpose())
    for name, target in (("dt_bias", "dt_bias"), ("A_log", "A_log"),
                         ("norm.weight", "norm/scale")):
        rule = rules[f"model.layers.{{i}}.linear_attn.{name}"]
        assert (rule.target, rule.transform) == (
            f"transformer_layer_{{i}}/linear_attn/{target}", None)


def test_export_names_heads_and_the_tied_output_embedding():
    backbone = huggingface("qwen3_5_text", config=QWEN3_5)
    task = huggingface("qwen3_5_text", config=QWEN3_5, model=Qwen3_5CausalLM())
    assert task.classes == {"Qwen3_5CausalLM": "Qwen3_5ForCausalLM"}
    for rules in (backbone, task):
        assert rules.export_name("transformer_layer_0/linear_attn/A_log")[0] == (
            "model.layers.0.linear_attn.A_log")
        assert rules.export_name("transformer_layer_1/self_attention/key/kernel")[0] == (
            "model.layers.1.self_attn.k_proj.weight")
    assert task.export_name("token_embedding/reverse_embeddings")[0] == "lm_head.weight"
    rules = by_source(backbone)
    assert rules["score.weight"].head == (
        "Qwen3_5TextForSequenceClassification, Qwen3_5ForTokenClassification")
    assert rules["embed_tokens.weight"].target == "token_embedding/embeddings"
    tied = by_source(huggingface("qwen3_5_text",
                                  config={**QWEN3_5, "tie_word_embeddings": True}))
    assert "tied" in tied["lm_head.weight"].head
    assert not any(r.target == "token_embedding/reverse_embeddings" for r in tied.values())


@pytest.mark.parametrize("missing", ["hidden_size", "head_dim", "linear_num_key_heads",
                                     "linear_key_head_dim", "linear_conv_kernel_dim"])
def test_a_config_without_sizes_is_refused(missing):
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"The Qwen3.5 rule set needs `{missing}` \(a positive int\)"
                             r".*received None.*Fix:"):
        huggingface("qwen3_5_text", config={k: v for k, v in QWEN3_5.items() if k != missing})


def test_restore_is_keras_hubs_import_bit_for_bit(tmp_path):
    """Every backbone variable bit-equal to keras-hub's import (of a copy of the fixture in
    the layout keras-hub reads), from the fixture as transformers wrote it."""
    keras_hub = pytest.importorskip("keras_hub")
    folder = os.path.join(FIXTURES, "qwen3_5-Qwen3_5ForCausalLM-float32")
    theirs = keras_hub.models.Backbone.from_preset(
        _multimodal_layout(tmp_path, folder, "qwen3_5"))
    ours = type(theirs).from_config(theirs.get_config())
    report = objckpt.restore(ours, folder, rules=huggingface(folder))
    assert len(report.restored) == len(ours.weights)
    assert any(np.any(v.numpy()) for v in ours.weights)
    assert {v.path: bits(v.numpy()) for v in ours.weights} == {
        v.path: bits(v.numpy()) for v in theirs.weights}


# --- Qwen3.5-MoE ------------------------------------------------------------------------------

QWEN3_5_MOE = {**QWEN3_5, "architectures": ["Qwen3_5MoeForCausalLM"],
               "model_type": "qwen3_5_moe_text", "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12}


def test_moe_set_maps_the_experts_in_both_key_forms_and_exports_the_original(tmp_path):
    from objckpt.rules import Concat, Stack

    chosen = huggingface(config_folder(tmp_path, QWEN3_5_MOE))
    assert "qwen3_5_moe_text" in objckpt.rules.supported()
    assert chosen.name == "huggingface('qwen3_5_moe_text')"
    rules = by_source(chosen)
    block = "transformer_layer_{i}/sparse_moe_block"
    gate = rules["model.layers.{i}.mlp.experts.{e}.gate_proj.weight"]
    assert gate.target == f"{block}/experts/expert_feedforward_gate_dense"
    assert gate.transform == Chain(Transpose(), Stack("e", 4), Concat(-1, parts=2, index=0))
    assert rules["model.layers.{i}.mlp.experts.{e}.up_proj.weight"].transform == Chain(
        Transpose(), Stack("e", 4), Concat(-1, parts=2, index=1))
    assert rules["model.layers.{i}.mlp.experts.gate_up_proj"].transform == Transpose((0, 2, 1))
    assert rules["model.layers.{i}.mlp.gate.weight"].target == f"{block}/router_gate/kernel"
    assert rules["model.layers.{i}.mlp.shared_expert_gate.weight"].target == (
        f"{block}/shared_expert_gate/kernel")
    assert rules["layers.{i}.mlp.shared_expert.up_proj.weight"].target == (
        f"{block}/shared_expert/feedforward_intermediate_dense/kernel")
    # Qwen3.5's attention, no dense MLP
    assert "model.layers.{i}.linear_attn.conv1d.weight" in rules
    assert "model.layers.{i}.mlp.up_proj.weight" not in rules
    names = [n for n, _ in chosen.export_names(
        "transformer_layer_0/sparse_moe_block/experts/expert_feedforward_gate_dense")[0]]
    assert sorted(names) == sorted(f"model.layers.0.mlp.experts.{e}.{p}_proj.weight"
                                   for e in range(4) for p in ("gate", "up"))


def test_moe_config_without_experts_is_refused():
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"The Qwen3.5-MoE rule set needs `num_experts`.*received None"):
        huggingface("qwen3_5_moe_text",
                    config={k: v for k, v in QWEN3_5_MOE.items() if k != "num_experts"})
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"The Qwen3.5-MoE rule set needs `linear_value_head_dim`"):
        huggingface("qwen3_5_moe_text", config={**QWEN3_5_MOE, "linear_value_head_dim": 0})


@pytest.mark.parametrize("form", ["", "-v5names"])
def test_moe_restore_is_keras_hubs_import_bit_for_bit(tmp_path, form):
    """Both key forms (keras-hub reads the experts' per-bank tensors or each expert's):
    every backbone variable bit-equal to keras-hub's import of the same tensors."""
    keras_hub = pytest.importorskip("keras_hub")
    folder = os.path.join(FIXTURES, f"qwen3_5_moe-Qwen3_5MoeForCausalLM-float32{form}")
    copy = _multimodal_layout(tmp_path, folder, "qwen3_5_moe")
    theirs = keras_hub.models.Backbone.from_preset(copy)
    ours = type(theirs).from_config(theirs.get_config())
    report = objckpt.restore(ours, folder, rules=huggingface(folder))
    assert len(report.restored) == len(ours.weights)
    assert {v.path: bits(v.numpy()) for v in ours.weights} == {
        v.path: bits(v.numpy()) for v in theirs.weights}


def _multimodal_layout(tmp_path, folder: str, model_type: str) -> str:
    """A copy of a text fixture as keras-hub 0.32 reads it: `model_type` the multimodal
    one, the decoder under `model.language_model.`."""
    pytest.importorskip("safetensors.numpy")
    from safetensors.numpy import load_file, save_file

    copy = tmp_path / "multimodal_layout"
    copy.mkdir()
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    (copy / "config.json").write_text(json.dumps({**config, "model_type": model_type}),
                                      encoding="utf-8")
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    save_file({name.replace("model.", "model.language_model.", 1): value
               for name, value in tensors.items()}, str(copy / "model.safetensors"),
              metadata={"format": "pt"})
    return str(copy)


# --- Qwen3.5 as published: the decoder and a vision tower ---------------------------------------

def _vl_folder() -> str:
    return os.path.join(FIXTURES, "qwen3_5_vl-Qwen3_5ForConditionalGeneration-float32")


def test_published_layout_maps_the_decoder_and_the_vision_tower():
    folder = _vl_folder()
    chosen = huggingface(folder)
    assert "qwen3_5" in objckpt.rules.supported()
    assert chosen.name == "huggingface('qwen3_5')"
    rules = by_source(chosen)
    assert rules["model.language_model.layers.{i}.linear_attn.A_log"].target == (
        "transformer_layer_{i}/linear_attn/A_log")
    patch = rules["model.visual.patch_embed.proj.weight"]
    assert patch.target == "qwen3_5_vision_encoder/patch_embed/proj/kernel"
    assert patch.transform == Transpose((2, 3, 4, 1, 0))
    assert rules["model.visual.blocks.{b}.attn.qkv.weight"].target == (
        "qwen3_5_vision_encoder/blocks_{b}/attn/qkv/kernel")
    assert rules["visual.merger.linear_fc2.bias"].target == (
        "qwen3_5_vision_encoder/merger/mlp_2/bias")
    assert rules["model.visual.merger.norm.weight"].target == (
        "qwen3_5_vision_encoder/merger/ln_q/gamma")
    assert "vision tower" in patch.head
    assert rules["lm_head.weight"].target == "token_embedding/reverse_embeddings"
    assert chosen.export_name("transformer_layer_1/self_attention/key_norm/scale")[0] == (
        "model.language_model.layers.1.self_attn.k_norm.weight")
    moe = huggingface(os.path.join(
        FIXTURES, "qwen3_5_moe_vl-Qwen3_5MoeForConditionalGeneration-float32"))
    assert moe.name == "huggingface('qwen3_5_moe')"
    assert moe.classes == {"Qwen3_5MoeCausalLM": "Qwen3_5MoeForConditionalGeneration"}
    assert by_source(moe)["model.language_model.layers.{i}.mlp.experts.down_proj"].target == (
        "transformer_layer_{i}/sparse_moe_block/experts/expert_feedforward_output_dense")
    assert "model.visual.pos_embed.weight" in by_source(moe)
    with pytest.raises(errors.InvalidArgumentError, match=r"needs `linear_key_head_dim`"):
        huggingface("qwen3_5", config={"text_config": {
            k: v for k, v in QWEN3_5.items() if k != "linear_key_head_dim"}})


@pytest.mark.parametrize("case", ["qwen3_5_vl-Qwen3_5ForConditionalGeneration",
                                  "qwen3_5_moe_vl-Qwen3_5MoeForConditionalGeneration"])
def test_published_layout_is_keras_hubs_import_bit_for_bit_vision_encoder_included(case):
    """keras-hub's importers read this layout themselves (the vision encoder built from
    vision_config, named with a counter of the session: the set reads the name from the
    model): every variable bit-equal, Qwen3.5-MoE's experts too."""
    keras_hub = pytest.importorskip("keras_hub")
    folder = os.path.join(FIXTURES, f"{case}-float32")
    theirs = keras_hub.models.Backbone.from_preset(folder)
    ours = type(theirs).from_config(theirs.get_config())
    encoder = {v.path.split("/")[0] for v in ours.weights if "patch_embed" in v.path}
    assert len(encoder) == 1 and encoder != {"qwen3_5_vision_encoder"}  # a second one
    report = objckpt.restore(ours, folder, rules=huggingface(folder))
    assert len(report.restored) == len(ours.weights)
    # variable by variable, in order (the two encoders' names differ by their counter)
    assert [bits(v.numpy()) for v in ours.weights] == [bits(v.numpy()) for v in theirs.weights]


def test_published_layout_into_a_text_only_backbone_sets_the_vision_tower_aside():
    keras_hub = pytest.importorskip("keras_hub")
    folder = _vl_folder()
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    from keras_hub.src.utils.transformers import convert_qwen3_5

    text = convert_qwen3_5.convert_backbone_config(
        {k: v for k, v in config.items() if k != "vision_config"})
    model = keras_hub.models.Qwen3_5Backbone(**text)
    report = objckpt.restore(model, folder, rules=huggingface(folder))
    assert len(report.restored) == len(model.weights)
    tower = [line for line in report.skipped if line.startswith("model.visual.")]
    assert len(tower) == 21 and all("vision tower" in line for line in tower)
