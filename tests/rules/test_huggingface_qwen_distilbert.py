"""Hugging Face rule sets for Qwen2, Qwen3 and DistilBERT: the sets themselves, and keras-hub's
own importer reading what objckpt exports.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the sets need no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` is the oracle where it is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

DECODER = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "max_position_embeddings": 64, "sliding_window": None,
    "use_sliding_window": False, "torch_dtype": "float32",
}
QWEN2 = {**DECODER, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
         "tie_word_embeddings": False}
QWEN3 = {**DECODER, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
         "tie_word_embeddings": True, "head_dim": 8}
DISTILBERT = {
    "architectures": ["DistilBertForSequenceClassification"], "model_type": "distilbert",
    "vocab_size": 64, "dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32,
    "activation": "gelu", "max_position_embeddings": 32, "dropout": 0.1,
    "id2label": {"0": "A", "1": "B", "2": "C"}, "torch_dtype": "float32",
}
CONFIGS = {"qwen2": QWEN2, "qwen3": QWEN3, "distilbert": DISTILBERT}


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
    assert name in objckpt.rules.supported()
    assert chosen.name == f"huggingface({name!r})"
    assert list(chosen) == list(huggingface(name, config=config))


def test_qwen2_has_llamas_decoder_and_attention_biases_split_by_head():
    rules = by_source(huggingface("qwen2", config=QWEN2))
    assert rules["model.layers.{i}.self_attn.q_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (16, 4, 4)))
    assert rules["model.layers.{i}.self_attn.q_proj.bias"].transform == Reshape((16,), (4, 4))
    assert rules["model.layers.{i}.self_attn.k_proj.bias"].transform == Reshape((8,), (2, 4))
    assert rules["model.layers.{i}.self_attn.v_proj.bias"].target == (
        "transformer_layer_{i}/self_attention/value/bias")
    assert "lm_head.weight" in rules and not rules["lm_head.weight"].head  # untied
    assert "model.layers.{i}.self_attn.q_norm.weight" not in rules
    # Qwen2Model saves the decoder bare, Qwen2ForQuestionAnswering under `transformer.`
    assert "layers.{i}.self_attn.k_proj.bias" in rules
    assert "transformer.layers.{i}.self_attn.k_proj.bias" in rules


def test_qwen3_takes_head_dim_from_the_config_and_norms_queries_and_keys():
    rules = by_source(huggingface("qwen3", config=QWEN3))
    assert rules["model.layers.{i}.self_attn.q_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 32), (16, 4, 8)))
    assert rules["model.layers.{i}.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))
    assert rules["model.layers.{i}.self_attn.k_norm.weight"].target == (
        "transformer_layer_{i}/self_attention/key_dense_layernorm/scale")
    assert "model.layers.{i}.self_attn.q_proj.bias" not in rules
    assert rules["lm_head.weight"].head  # tied: set aside where a folder has one


@pytest.mark.parametrize("name,missing", [("qwen3", "head_dim"), ("qwen2", "hidden_size"),
                                          ("distilbert", "dim"), ("distilbert", "n_heads")])
def test_a_config_without_sizes_is_refused(name, missing):
    config = {k: v for k, v in CONFIGS[name].items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{missing}`.*Fix:"):
        huggingface(name, config=config)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_a_head_dim_that_is_no_positive_int_is_refused(name):
    with pytest.raises(errors.InvalidArgumentError, match=r"`head_dim`.*received 'x'.*Fix:"):
        huggingface(name, config={**CONFIGS[name], "head_dim": "x"})


def test_qwen2_reshapes_by_the_configs_head_dim():
    """transformers' Qwen2 reads `head_dim` where config.json has one, so the set does."""
    rules = by_source(huggingface("qwen2", config={**QWEN2, "head_dim": 8}))
    assert rules["model.layers.{i}.self_attn.q_proj.bias"].transform == Reshape((32,), (4, 8))
    assert rules["model.layers.{i}.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))


def test_distilbert_heads_and_the_prefix_export_writes():
    """A backbone's set writes DistilBertModel's bare names, a task model's `distilbert.`;
    restore reads both; the heads name the classes that hold them."""
    class DistilBertTextClassifier:  # what the set is chosen by: the class name
        pass

    backbone = huggingface("distilbert", config=DISTILBERT)
    task = huggingface("distilbert", config=DISTILBERT, model=DistilBertTextClassifier())
    path = "transformer_layer_1/self_attention_layer/query/kernel"
    assert backbone.export_name(path)[0] == "transformer.layer.1.attention.q_lin.weight"
    assert task.export_name(path)[0] == "distilbert.transformer.layer.1.attention.q_lin.weight"
    assert task.export_name("logits/kernel")[0] == "classifier.weight"
    rules = by_source(backbone)
    assert "distilbert.embeddings.LayerNorm.gamma" in rules  # the older LayerNorm names
    assert rules["classifier.weight"].head == (
        "DistilBertForSequenceClassification, DistilBertForMultipleChoice, "
        "DistilBertForTokenClassification")
    assert "tied" in rules["vocab_projector.weight"].head
    torch_q = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    keras_q = rules["transformer.layer.{i}.attention.q_lin.weight"].transform(torch_q)
    assert keras_q.shape == (16, 2, 8) and keras_q[5, 1, 3] == torch_q[1 * 8 + 3, 5]


# --- against keras-hub's importer -------------------------------------------------------------

def _random(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    return model


def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_is_what_keras_hubs_importer_reads(tmp_path, name):
    """objckpt.export with the set (DistilBERT: of the text classifier, whose names carry
    the `distilbert.` prefix keras-hub's importer needs) -> keras-hub's `from_preset(folder)`
    -> every backbone variable bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    import importlib

    config = CONFIGS[name]
    converter = importlib.import_module("keras_hub.src.utils.transformers.convert_" + {
        "qwen2": "qwen", "qwen3": "qwen3", "distilbert": "distilbert"}[name])
    backbone = _random(converter.backbone_cls(**converter.convert_backbone_config(config)))
    model = backbone
    if name == "distilbert":
        model = keras_hub.models.DistilBertTextClassifier(backbone=backbone, num_classes=3,
                                                           preprocessor=None)
        _random(model, seed=1)
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
