"""Hugging Face rule set for Qwen3.5's text decoder (full-attention and gated-delta-net
layers): the set itself, and keras-hub's own importer as a second oracle.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the set needs no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` reads a committed fixture. keras-hub
0.32 reads Qwen3.5 under `model_type` "qwen3_5" with the decoder under
`model.language_model.` (the multimodal checkpoints' layout) only: it is given a copy of the
text fixture so named.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits

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


def _folder(path, config: dict) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def _by_source(rules) -> dict:
    return {rule.source: rule for rule in rules}


def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(_folder(tmp_path, QWEN3_5))
    assert "qwen3_5_text" in objckpt.rules.supported()
    assert chosen.name == "huggingface('qwen3_5_text')"
    assert list(chosen) == list(huggingface("qwen3_5_text", config=QWEN3_5))


def test_both_kinds_of_layer_and_their_layouts():
    rules = _by_source(huggingface("qwen3_5_text", config=QWEN3_5))
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
    rules = _by_source(backbone)
    assert rules["score.weight"].head == (
        "Qwen3_5TextForSequenceClassification, Qwen3_5ForTokenClassification")
    assert rules["embed_tokens.weight"].target == "token_embedding/embeddings"
    tied = _by_source(huggingface("qwen3_5_text",
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
    from safetensors.numpy import load_file, save_file

    folder = os.path.join(FIXTURES, "qwen3_5-Qwen3_5ForCausalLM-float32")
    copy = tmp_path / "multimodal_layout"
    copy.mkdir()
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5"}),
                                      encoding="utf-8")
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    save_file({name.replace("model.", "model.language_model.", 1): value
               for name, value in tensors.items()}, str(copy / "model.safetensors"),
              metadata={"format": "pt"})
    theirs = keras_hub.models.Backbone.from_preset(str(copy))
    ours = type(theirs).from_config(theirs.get_config())
    report = objckpt.restore(ours, folder, rules=huggingface(folder))
    assert len(report.restored) == len(ours.weights)
    assert any(np.any(v.numpy()) for v in ours.weights)
    assert {v.path: bits(v.numpy()) for v in ours.weights} == {
        v.path: bits(v.numpy()) for v in theirs.weights}
