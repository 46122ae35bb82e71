"""Hugging Face rule sets for RoBERTa, XLM-RoBERTa and ALBERT: the sets themselves, and
keras-hub's own importer as a second oracle.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the sets need no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` reads the committed fixtures and
objckpt's exports.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Crop, Reshape, Sum, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "hf")

ENCODER = {
    "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "hidden_act": "gelu", "max_position_embeddings": 32,
    "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0,
    "eos_token_id": 2, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "id2label": {"0": "A", "1": "B", "2": "C"}, "torch_dtype": "float32",
}
ROBERTA = {**ENCODER, "architectures": ["RobertaForMaskedLM"], "model_type": "roberta"}
XLM_ROBERTA = {**ENCODER, "architectures": ["XLMRobertaForMaskedLM"],
               "model_type": "xlm-roberta"}
CONFIGS = {"roberta": ROBERTA, "xlm-roberta": XLM_ROBERTA}


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
    assert name in objckpt.rules.supported()
    assert chosen.name == f"huggingface({name!r})"
    assert list(chosen) == list(huggingface(name, config=config))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_roberta_folds_the_token_type_row_into_the_position_rows(name):
    rules = by_source(huggingface(name, config=CONFIGS[name]))
    position = "embeddings/position_embedding/embeddings"
    for prefix in ("", "roberta."):
        first = rules[prefix + "embeddings.position_embeddings.weight"]
        second = rules[prefix + "embeddings.token_type_embeddings.weight"]
        assert (first.target, second.target) == (position, position)
        assert first.transform == Chain(Crop(axis=0, before=2), Sum(2, 0))
        assert second.transform == Sum(2, 1, broadcast=(0,))
    # two token types: row 0 is what a model without token types adds
    two = by_source(huggingface(name, config={**CONFIGS[name], "type_vocab_size": 2}))
    assert two["embeddings.token_type_embeddings.weight"].transform == Chain(
        Crop(axis=0, after=1), Sum(2, 1, broadcast=(0,)))
    assert rules["encoder.layer.{i}.attention.self.query.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (16, 2, 8)))


def test_roberta_heads_and_the_prefix_export_writes():
    """A backbone's set writes RobertaModel's bare names, a task model's `roberta.`; the
    heads name the classes that hold them; the pooler is set aside (keras-hub has none)."""
    class RobertaTextClassifier:  # what the set is chosen by: the class name
        pass

    class XLMRobertaMaskedLM:
        pass

    backbone = huggingface("roberta", config=ROBERTA)
    task = huggingface("roberta", config=ROBERTA, model=RobertaTextClassifier())
    path = "transformer_layer_1/self_attention_layer/query/kernel"
    assert backbone.export_name(path)[0] == "encoder.layer.1.attention.self.query.weight"
    assert task.export_name(path)[0] == "roberta.encoder.layer.1.attention.self.query.weight"
    assert task.export_name("logits/kernel")[0] == "classifier.out_proj.weight"
    assert task.export_name("pooled_dense/bias")[0] == "classifier.dense.bias"
    names = [n for n, _ in task.export_names("embeddings/position_embedding/embeddings")[0]]
    assert names == ["roberta.embeddings.position_embeddings.weight",
                     "roberta.embeddings.token_type_embeddings.weight"]
    xlm = huggingface("xlm-roberta", config=XLM_ROBERTA, model=XLMRobertaMaskedLM())
    assert xlm.classes["XLMRobertaMaskedLM"] == "XLMRobertaForMaskedLM"
    assert xlm.export_name("mlm_head/output_bias")[0] == "lm_head.bias"
    rules = by_source(backbone)
    assert rules["pooler.dense.weight"].head == "RobertaModel"
    assert rules["roberta.pooler.dense.weight"].head == "RobertaForMultipleChoice"
    assert rules["classifier.weight"].head == (
        "RobertaForMultipleChoice, RobertaForTokenClassification")
    assert "tied" in rules["lm_head.decoder.weight"].head
    assert "roberta.embeddings.LayerNorm.gamma" in rules  # the older LayerNorm names


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("change,said", [
    ({"pad_token_id": 0}, r"needs `pad_token_id` 1 .*received 0.*Fix:"),
    ({"hidden_size": None}, r"needs `hidden_size` \(a positive int\).*received None.*Fix:"),
    ({"type_vocab_size": 0}, r"needs `type_vocab_size` \(a positive int\).*Fix:"),
    ({"num_attention_heads": 3}, r"hidden_size divisible by num_attention_heads; received "
                                 r"16 and 3"),
])
def test_a_config_roberta_cannot_fit_is_refused(name, change, said):
    with pytest.raises(errors.InvalidArgumentError, match=said) as info:
        huggingface(name, config={**CONFIGS[name], **change})
    assert ("XLM-RoBERTa" if name == "xlm-roberta" else "The RoBERTa") in str(info.value)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


def _fixture(case: str, cls: str) -> str:
    return os.path.join(FIXTURES, f"{case}-{cls}-float32")


def _position(model):
    return next(v for v in model.weights if "position_embedding" in v.path)


def test_xlm_roberta_restore_is_keras_hubs_import_bit_for_bit():
    """keras-hub's XLM-RoBERTa importer folds the token-type row too: every variable
    bit-equal, the folded position rows included."""
    keras_hub = pytest.importorskip("keras_hub")
    folder = _fixture("xlm_roberta", "XLMRobertaForMaskedLM")
    theirs = keras_hub.models.Backbone.from_preset(folder)
    ours = type(theirs).from_config(theirs.get_config())
    objckpt.restore(ours, folder, rules=huggingface(folder))
    assert _values(ours) == _values(theirs)


def test_roberta_restore_is_keras_hubs_import_plus_the_token_type_row_it_drops():
    """keras-hub's RoBERTa importer drops the token-type row (its outputs are off by it);
    ours adds it: the position rows are keras-hub's plus that row, the rest bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors.numpy import load_file

    folder = _fixture("roberta", "RobertaForMaskedLM")
    theirs = keras_hub.models.Backbone.from_preset(folder)
    ours = type(theirs).from_config(theirs.get_config())
    objckpt.restore(ours, folder, rules=huggingface(folder))
    row = load_file(os.path.join(folder, "model.safetensors"))[
        "roberta.embeddings.token_type_embeddings.weight"]
    assert np.any(row)  # the fixture's row is nonzero
    want = _position(theirs).numpy() + row
    assert bits(_position(ours).numpy()) == bits(want)
    position = _position(ours).path
    assert {k: v for k, v in _values(ours).items() if k != position} == {
        k: v for k, v in _values(theirs).items() if k != position}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_is_what_keras_hubs_importer_reads(tmp_path, name):
    """objckpt.export of a masked LM (its names carry the `roberta.` prefix keras-hub's
    RoBERTa importer needs) -> keras-hub's `from_preset(folder)` -> every backbone variable
    bit-equal (the token-type row exported as zeros: folding it back adds nothing)."""
    keras_hub = pytest.importorskip("keras_hub")
    import importlib

    config = CONFIGS[name]
    converter = importlib.import_module("keras_hub.src.utils.transformers.convert_" +
                                        name.replace("-", "_"))
    backbone = converter.backbone_cls(**converter.convert_backbone_config(config))
    stem = "XLMRoberta" if name == "xlm-roberta" else "Roberta"
    model = getattr(keras_hub.models, f"{stem}MaskedLM")(backbone=backbone,
                                                          preprocessor=None)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)


# --- ALBERT -----------------------------------------------------------------------------------

ALBERT = {
    "architectures": ["AlbertForSequenceClassification"], "model_type": "albert",
    "vocab_size": 64, "embedding_size": 8, "hidden_size": 16, "num_hidden_layers": 2,
    "num_hidden_groups": 1, "inner_group_num": 1, "num_attention_heads": 2,
    "intermediate_size": 32, "hidden_act": "gelu_new", "max_position_embeddings": 32,
    "type_vocab_size": 2, "attention_probs_dropout_prob": 0.0,
    "id2label": {"0": "A", "1": "B", "2": "C"}, "torch_dtype": "float32",
}


def test_albert_set_maps_its_shared_layer_groups_and_the_embedding_projection(tmp_path):
    chosen = huggingface(config_folder(tmp_path, ALBERT))
    assert "albert" in objckpt.rules.supported() and chosen.name == "huggingface('albert')"
    rules = by_source(chosen)
    layer = "encoder.albert_layer_groups.{g}.albert_layers.{j}"
    assert rules[f"{layer}.attention.query.weight"].target == (
        "group_{g}_inner_layer_{j}/self_attention_layer/query/kernel")
    assert rules[f"{layer}.attention.dense.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (2, 8, 16)))
    assert rules[f"{layer}.full_layer_layer_norm.weight"].target == (
        "group_{g}_inner_layer_{j}/feedforward_layer_norm/gamma")
    assert rules["albert.encoder.embedding_hidden_mapping_in.weight"].target == (
        "embedding_projection/kernel")
    assert rules["embeddings.token_type_embeddings.weight"].target == (
        "segment_embedding/embeddings")
    assert chosen.export_name("group_0_inner_layer_0/ffn") is None
    assert chosen.export_name("group_0_inner_layer_0/feedforward_output_dense/bias")[0] == (
        "encoder.albert_layer_groups.0.albert_layers.0.ffn_output.bias")


def test_albert_heads_the_pooler_and_the_prefix_export_writes():
    class AlbertMaskedLM:  # what the set is chosen by: the class name
        pass

    task = huggingface("albert", config=ALBERT, model=AlbertMaskedLM())
    assert task.export_name("mlm_head/output_bias")[0] == "predictions.bias"
    assert task.export_name("token_embedding/embeddings")[0] == (
        "albert.embeddings.word_embeddings.weight")
    rules = by_source(huggingface("albert", config={**ALBERT,
                                                     "architectures": ["AlbertForMaskedLM"]}))
    assert rules["pooler.weight"].absent == (
        "AlbertForMaskedLM has no pooler (its folder holds no `pooler.*`)")
    assert rules["pooler.weight"].unused_by == ("AlbertMaskedLM",)
    assert rules["sop_classifier.classifier.weight"].head == "AlbertForPreTraining"
    assert "tied" in rules["predictions.decoder.weight"].head


@pytest.mark.parametrize("change,said", [
    ({"hidden_size": "16"}, r"ALBERT rule set needs `hidden_size` \(a positive int\).*"
                            r"received '16'.*Fix:"),
    ({"num_attention_heads": 0}, r"`num_attention_heads` \(a positive int\).*received 0"),
    ({"num_attention_heads": 3}, r"hidden_size divisible by num_attention_heads; received "
                                 r"16 and 3"),
])
def test_an_albert_config_without_usable_sizes_is_refused(change, said):
    with pytest.raises(errors.InvalidArgumentError, match=said):
        huggingface("albert", config={**ALBERT, **change})


def test_albert_restore_is_keras_hubs_import_bit_for_bit():
    keras_hub = pytest.importorskip("keras_hub")
    folder = _fixture("albert", "AlbertForSequenceClassification")
    theirs = keras_hub.models.Backbone.from_preset(folder)
    ours = type(theirs).from_config(theirs.get_config())
    objckpt.restore(ours, folder, rules=huggingface(folder))
    assert _values(ours) == _values(theirs)


def test_albert_export_is_what_keras_hubs_importer_reads(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    from keras_hub.src.utils.transformers import convert_albert

    backbone = convert_albert.backbone_cls(**convert_albert.convert_backbone_config(ALBERT))
    model = keras_hub.models.AlbertTextClassifier(backbone=backbone, num_classes=3,
                                                   preprocessor=None)
    rng = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    folder = config_folder(tmp_path / "hf", ALBERT)
    objckpt.export(model, folder, rules=huggingface(folder))
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
