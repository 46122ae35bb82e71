"""Hugging Face rule set for ESM (ESM-2's rotary layout and ESM-1b's absolute positions):
the set itself, and keras-hub's own importer as a second oracle.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the set needs no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` reads the committed fixtures. keras-hub
0.32 reads the norms named `LayerNorm` as `weight`/`bias` only (the published checkpoints'
names), while transformers 5 writes them as `gamma`/`beta`: keras-hub is given a copy of the
fixture with those names.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Crop, Pad, Transpose, huggingface
from objckpt.rules.core import NOWHERE

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "hf")

ESM = {
    "architectures": ["EsmForMaskedLM"], "model_type": "esm", "vocab_size": 64,
    "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "max_position_embeddings": 32,
    "position_embedding_type": "rotary", "layer_norm_eps": 1e-5, "pad_token_id": 1,
    "mask_token_id": 32, "token_dropout": False, "emb_layer_norm_before": False,
    "hidden_dropout_prob": 0.1, "tie_word_embeddings": True,
    "id2label": {"0": "A", "1": "B", "2": "C"}, "torch_dtype": "float32",
}
ABSOLUTE = {**ESM, "position_embedding_type": "absolute", "emb_layer_norm_before": True}


class ESMMaskedPLM:  # what the set is chosen by: the class name
    pass


class ESMProteinClassifier:
    pass


# --- the set itself (no keras-hub) ------------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, ESM))
    assert "esm" in objckpt.rules.supported()
    assert chosen.name == "huggingface('esm')"
    assert list(chosen) == list(huggingface("esm", config=ESM))


def test_layers_norms_and_the_prefix_export_writes():
    """A backbone's set writes EsmModel's bare names, a task model's `esm.`; the norms named
    `LayerNorm` as `gamma`/`beta` (what transformers 5 writes), the others `weight`/`bias`;
    both spellings restore."""
    backbone = huggingface("esm", config=ESM)
    task = huggingface("esm", config=ESM, model=ESMProteinClassifier())
    path = "transformer_layer_1/attention_layer/q_dense_layer/kernel"
    assert backbone.export_name(path)[0] == "encoder.layer.1.attention.self.query.weight"
    assert task.export_name(path)[0] == "esm.encoder.layer.1.attention.self.query.weight"
    assert task.export_name("transformer_layer_0/attention_layer/o_dense_layer/bias")[0] == (
        "esm.encoder.layer.0.attention.output.dense.bias")
    assert backbone.export_name("transformer_layer_0/attention_norm/gamma")[0] == (
        "encoder.layer.0.attention.LayerNorm.gamma")
    assert backbone.export_name("transformer_layer_0/ffn_norm/beta")[0] == (
        "encoder.layer.0.LayerNorm.beta")
    assert backbone.export_name("output_layer_norm/gamma")[0] == (
        "encoder.emb_layer_norm_after.weight")
    assert task.export_name("logits/kernel")[0] == "classifier.out_proj.weight"
    assert task.export_name("pooled_dense/bias")[0] == "classifier.dense.bias"
    rules = by_source(backbone)
    assert rules["encoder.layer.{i}.attention.LayerNorm.weight"].target == (
        "transformer_layer_{i}/attention_norm/gamma")
    assert rules["esm.encoder.layer.{i}.intermediate.dense.weight"].transform == Transpose()
    assert rules["encoder.layer.{i}.attention.self.key.bias"].transform is None


def test_the_heads_and_what_no_keras_hub_model_holds_are_set_aside():
    rules = by_source(huggingface("esm", config=ESM))
    assert rules["pooler.dense.weight"].head == "EsmModel"
    assert rules["contact_head.regression.weight"].head == "EsmModel"
    assert rules["esm.contact_head.regression.bias"].head == (
        "EsmForMaskedLM, EsmForSequenceClassification, EsmForTokenClassification")
    assert rules["classifier.weight"].head == "EsmForTokenClassification"
    assert rules["lm_head.bias"].target == "mlm_head/output_bias"
    for source in ("encoder.layer.*.attention.self.rotary_embeddings.inv_freq",
                   "esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq",
                   "rotary_embeddings.inv_freq"):
        assert rules[source].target.startswith(NOWHERE) and "rotary" in rules[source].head
    # absolute positions: no frequencies, keras-hub's row k is transformers' row k + 1
    absolute = by_source(huggingface("esm", config=ABSOLUTE))
    assert not any("inv_freq" in source for source in absolute)
    position = absolute["embeddings.position_embeddings.weight"]
    assert position.target == "position_embedding/embeddings"
    assert position.transform == Chain(Crop(axis=0, before=1), Pad(axis=0, after=1))
    assert absolute["esm.embeddings.layer_norm.weight"].target == "emb_layer_norm/gamma"


def test_the_masked_lm_output_kernel_is_the_word_embedding_when_tied():
    """Tied (ESM's default): the word embedding feeds ESMMaskedPLM's output kernel too, and
    export writes it once; untied, `lm_head.decoder.weight` does. A backbone's set has no
    rule into the head's kernel from the word embedding."""
    tied = huggingface("esm", config=ESM, model=ESMMaskedPLM())
    into_kernel = [r.source for r in tied if r.target == "mlm_head/output_kernel"]
    assert into_kernel == ["esm.embeddings.word_embeddings.weight",
                           "embeddings.word_embeddings.weight", "lm_head.decoder.weight"]
    assert tied.export_name("mlm_head/output_kernel")[0] == (
        "esm.embeddings.word_embeddings.weight")
    untied = huggingface("esm", config={**ESM, "tie_word_embeddings": False},
                         model=ESMMaskedPLM())
    assert untied.export_name("mlm_head/output_kernel")[0] == "lm_head.decoder.weight"
    backbone = huggingface("esm", config=ESM)
    assert [r.source for r in backbone if r.target == "mlm_head/output_kernel"] == [
        "lm_head.decoder.weight"]


@pytest.mark.parametrize("change,said", [
    ({"hidden_size": None}, r"needs `hidden_size` \(a positive int\).*received None.*Fix:"),
    ({"num_attention_heads": 0}, r"needs `num_attention_heads` \(a positive int\).*Fix:"),
    ({"position_embedding_type": "relative_key"},
     r"needs `position_embedding_type` 'rotary' or 'absolute'.*received 'relative_key'"),
    ({"position_embedding_type": "absolute", "pad_token_id": None},
     r"needs `pad_token_id` \(an int >= 0.*received None.*Fix:"),
    ({"position_embedding_type": "absolute", "max_position_embeddings": 0},
     r"needs `max_position_embeddings` \(a positive int\).*received 0"),
])
def test_a_config_esm_cannot_fit_is_refused(change, said):
    with pytest.raises(errors.InvalidArgumentError, match=said) as info:
        huggingface("esm", config={**ESM, **change})
    assert "The ESM rule set" in str(info.value)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


def _for_keras_hub(tmp_path, case: str, cls: str) -> tuple:
    """(the fixture, a copy of it with `LayerNorm.gamma`/`beta` named `weight`/`bias`)."""
    from safetensors.numpy import load_file, save_file

    folder = os.path.join(FIXTURES, f"{case}-{cls}-float32")
    copy = tmp_path / "renamed"
    copy.mkdir()
    shutil.copy(os.path.join(folder, "config.json"), copy)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    renamed = {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias"): value for name, value in tensors.items()}
    assert renamed != tensors  # the fixture holds transformers 5's names
    save_file(renamed, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return folder, str(copy)


@pytest.mark.parametrize("cls", ["EsmModel", "EsmForMaskedLM"])
def test_rotary_restore_is_keras_hubs_import_bit_for_bit(tmp_path, cls):
    """ESM-2's layout: every backbone variable bit-equal to keras-hub's import (of the copy
    it can read), from the fixture as transformers wrote it."""
    keras_hub = pytest.importorskip("keras_hub")
    folder, copy = _for_keras_hub(tmp_path, "esm", cls)
    theirs = keras_hub.models.Backbone.from_preset(copy)
    ours = type(theirs).from_config(theirs.get_config())
    report = objckpt.restore(ours, folder, rules=huggingface(folder))
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)
    # the published checkpoints' names (`LayerNorm.weight`) restore the same
    again = type(theirs).from_config(theirs.get_config())
    objckpt.restore(again, copy, rules=huggingface(copy))
    assert _values(again) == _values(theirs)


def test_absolute_restore_is_keras_hubs_import_with_the_positions_one_row_on(tmp_path):
    """ESM-1b's layout: keras-hub's importer copies the position table as it is and reads it
    from row pad_token_id, transformers from pad_token_id + 1; ours is the table one row on
    (a zero row last), every other variable bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    folder, copy = _for_keras_hub(tmp_path, "esm_absolute", "EsmForMaskedLM")
    theirs = keras_hub.models.Backbone.from_preset(copy)
    ours = type(theirs).from_config(theirs.get_config())
    objckpt.restore(ours, folder, rules=huggingface(folder))
    position = next(v for v in ours.weights if "position_embedding" in v.path)
    table = next(v for v in theirs.weights if "position_embedding" in v.path).numpy()
    want = np.concatenate([table[1:], np.zeros_like(table[:1])])
    assert bits(position.numpy()) == bits(want)
    assert {k: v for k, v in _values(ours).items() if k != position.path} == {
        k: v for k, v in _values(theirs).items() if k != position.path}
