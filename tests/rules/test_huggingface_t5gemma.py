"""The Hugging Face rule set for T5Gemma (encoder-decoder): the set itself and keras-hub's
own importer as a second oracle both ways.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits, by_source

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
_STACK = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 8,
    "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "dropout_rate": 0.0,
    "initializer_range": 0.02,
}
T5GEMMA = {"architectures": ["T5GemmaForConditionalGeneration"], "model_type": "t5gemma",
           "encoder": _STACK, "decoder": {**_STACK, "cross_attention_hidden_size": 16},
           "tie_word_embeddings": True, "vocab_size": 64, "torch_dtype": "float32"}


class T5GemmaSeq2SeqLM:  # what a set is remade for: the class name
    pass


def test_the_folder_chooses_the_set(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(T5GEMMA), encoding="utf-8")
    chosen = huggingface(str(tmp_path))
    assert "t5gemma" in objckpt.rules.supported()
    assert chosen.name == "huggingface('t5gemma')"
    assert list(chosen) == list(huggingface("t5gemma", config=T5GEMMA))


def test_the_layouts_follow_keras_hubs_importer():
    rules = by_source(huggingface("t5gemma", config=T5GEMMA))
    cross = rules["model.decoder.layers.{i}.cross_attn.k_proj.weight"]
    assert cross.target == "decoder_layer_{i}/cross_attention/key/kernel"
    assert cross.transform == Chain(Transpose(), Reshape((16, 8), (16, 1, 8)))
    assert rules["model.encoder.layers.{i}.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))
    assert rules["decoder.layers.{i}.post_cross_attn_layernorm.weight"].target == (
        "decoder_layer_{i}/decoder_post_cross_attention_layernorm/scale")
    assert rules["encoder.layers.{i}.pre_self_attn_layernorm.weight"].target == (
        "encoder_layer_{i}/pre_self_attention_layernorm/scale")
    assert rules["model.decoder.embed_tokens.weight"].target == (
        "decoder_token_embedding/embeddings")
    assert "tied" in rules["lm_head.out_proj.weight"].head
    assert rules["score.out_proj.bias"].head == (
        "T5GemmaForSequenceClassification, T5GemmaForTokenClassification")
    torch_q = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    keras_q = rules["model.encoder.layers.{i}.self_attn.q_proj.weight"].transform(torch_q)
    assert keras_q.shape == (16, 4, 8) and keras_q[5, 2, 3] == torch_q[2 * 8 + 3, 5]


def test_the_final_norms_are_named_by_object_path_under_backbone_in_the_task_model():
    """keras-hub leaves them Keras's numbered names (`rms_normalization_<n>`)."""
    backbone = huggingface("t5gemma", config=T5GEMMA)
    task = huggingface("t5gemma", config=T5GEMMA, model=T5GemmaSeq2SeqLM())
    assert backbone.export_name("encoder_norm/scale")[0] == "model.encoder.norm.weight"
    assert backbone.export_name("backbone/decoder_norm/scale") is None
    assert task.export_name("backbone/decoder_norm/scale")[0] == "model.decoder.norm.weight"


@pytest.mark.parametrize("config,named", [
    ({**T5GEMMA, "decoder": None}, "`decoder`"),
    ({**T5GEMMA, "encoder": {k: v for k, v in _STACK.items() if k != "head_dim"}},
     "`head_dim`"),
    ({**T5GEMMA, "tie_word_embeddings": False}, "`tie_word_embeddings`")])
def test_a_config_keras_hub_cannot_hold_is_refused(config, named):
    with pytest.raises(errors.InvalidArgumentError, match=f"(?s){named}.*Fix:"):
        huggingface("t5gemma", config=config)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> list:  # in order: the final norms' names differ between instances
    return [bits(v.numpy()) for v in model.weights]


def _backbone(config: dict):
    import copy

    from keras_hub.src.utils.transformers import convert_t5gemma

    return convert_t5gemma.backbone_cls(
        **convert_t5gemma.convert_backbone_config(copy.deepcopy(config)))


@pytest.mark.parametrize("folder", ["t5gemma-T5GemmaForConditionalGeneration-float32",
                                    "t5gemma-T5GemmaModel-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(folder):
    keras_hub = pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, folder)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('t5gemma')" in str(report)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, task):
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(T5GEMMA)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.T5GemmaSeq2SeqLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(T5GEMMA), encoding="utf-8")
    objckpt.export(model, str(folder), rules=huggingface(str(folder)))
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(backbone.weights)
    assert "model.decoder.norm.weight" in names and "lm_head.out_proj.weight" not in names
    loaded = keras_hub.models.Backbone.from_preset(str(folder))
    assert _values(loaded) == _values(backbone)
