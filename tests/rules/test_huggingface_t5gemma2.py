"""The Hugging Face rule set for T5Gemma 2 (encoder-decoder with a SigLIP vision tower): the
set itself and keras-hub's own importer as a second oracle both ways.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface

from support import bits, by_source as _by_source

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
EXPORTS = os.path.join(os.path.dirname(FIXTURES), "hf_exports")
_TEXT = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
    "query_pre_attn_scalar": 8, "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "dropout_rate": 0.0, "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 1e6}},
}
_VISION = {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
           "layer_norm_eps": 1e-6, "vision_use_head": False}
T5GEMMA2 = {"architectures": ["T5Gemma2ForConditionalGeneration"], "model_type": "t5gemma2",
            "encoder": {"text_config": _TEXT, "vision_config": _VISION,
                        "mm_tokens_per_image": 4},
            "decoder": _TEXT, "eoi_token_index": 63, "vocab_size": 64}
TEXT_ONLY = {**T5GEMMA2, "encoder": {"text_config": _TEXT}}


class T5Gemma2Seq2SeqLM:  # what a set is remade for: the class name
    pass


def _targets(rules, source: str) -> list:
    return [rule.target for rule in rules if rule.source == source]


def test_the_folder_chooses_the_set(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(T5GEMMA2), encoding="utf-8")
    chosen = huggingface(str(tmp_path))
    assert "t5gemma2" in objckpt.rules.supported()
    assert chosen.name == "huggingface('t5gemma2')"
    assert list(chosen) == list(huggingface("t5gemma2", config=T5GEMMA2))


def test_the_layouts_follow_keras_hubs_importer():
    rules = list(huggingface("t5gemma2", config=T5GEMMA2))
    by_source = _by_source(rules)
    merged = by_source["model.decoder.layers.{i}.self_attn.k_proj.weight"]
    assert merged.target == "decoder_layer_{i}/merged_attention/key/kernel"
    assert merged.transform == Chain(Transpose(), Reshape((16, 8), (16, 1, 8)))
    assert by_source["encoder.layers.{i}.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))
    assert by_source["encoder.layers.{i}.self_attn.q_norm.weight"].target == (
        "encoder_layer_{i}/self_attention/query_norm/scale")
    assert by_source["decoder.layers.{i}.post_feedforward_layernorm.weight"].target == (
        "decoder_layer_{i}/decoder_post_feedforward_layernorm/scale")
    # one token embedding and one end-of-image vector feed both stacks
    assert _targets(rules, "model.encoder.embed_tokens.weight") == [
        "encoder_token_embedding/embeddings", "decoder_token_embedding/embeddings"]
    assert _targets(rules, "encoder.embed_tokens.eoi_embedding") == [
        "encoder_eoi_embedding", "decoder_eoi_embedding"]
    assert "tied" in by_source["model.decoder.embed_tokens.weight"].head
    assert "tied" in by_source["lm_head.out_proj.weight"].head
    assert by_source["score.out_proj.bias"].head == (
        "T5Gemma2ForSequenceClassification, T5Gemma2ForTokenClassification")
    # the SigLIP tower under encoder., in both spellings
    for tower in ("encoder.vision_tower.vision_model.", "model.encoder.vision_tower."):
        assert by_source[tower + "embeddings.patch_embedding.weight"].transform == ConvKernel(
            "OIHW", "HWIO")
    assert by_source["model.encoder.multi_modal_projector.mm_input_projection_weight"
                     ].target == "vision_output_encoder/vision_input_projection/kernel"
    torch_q = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    keras_q = by_source["model.encoder.layers.{i}.self_attn.q_proj.weight"].transform(torch_q)
    assert keras_q.shape == (16, 4, 8) and keras_q[5, 2, 3] == torch_q[2 * 8 + 3, 5]


def test_a_text_only_config_has_no_vision_rules():
    sources = [rule.source for rule in huggingface("t5gemma2", config=TEXT_ONLY)]
    assert not [s for s in sources if "vision" in s or "eoi" in s or "multi_modal" in s]
    assert "encoder.layers.{i}.mlp.up_proj.weight" in sources


def test_the_final_norms_are_named_by_object_path_under_backbone_in_the_task_model():
    backbone = huggingface("t5gemma2", config=T5GEMMA2)
    task = huggingface("t5gemma2", config=T5GEMMA2, model=T5Gemma2Seq2SeqLM())
    assert backbone.export_name("encoder_norm/scale")[0] == "model.encoder.norm.weight"
    assert backbone.export_name("backbone/decoder_norm/scale") is None
    assert task.export_name("backbone/decoder_norm/scale")[0] == "model.decoder.norm.weight"


@pytest.mark.parametrize("config,named", [
    ({**T5GEMMA2, "decoder": None}, "`decoder`"),
    ({**T5GEMMA2, "encoder": {"vision_config": _VISION}}, "`encoder.text_config`"),
    ({**T5GEMMA2, "encoder": {"text_config": _TEXT, "vision_config": 3}},
     "`encoder.vision_config`"),
    ({**T5GEMMA2, "decoder": {k: v for k, v in _TEXT.items() if k != "head_dim"}},
     "`head_dim`"),
    ({**T5GEMMA2, "encoder": {"text_config": {**_TEXT, "tie_word_embeddings": False}}},
     "`encoder.text_config.tie_word_embeddings`")])
def test_a_config_keras_hub_cannot_hold_is_refused(config, named):
    with pytest.raises(errors.InvalidArgumentError, match=f"(?s){named}.*Fix:"):
        huggingface("t5gemma2", config=config)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> list:  # in order: the final norms' names differ between instances
    return [bits(v.numpy()) for v in model.weights]


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_t5gemma2

    return convert_t5gemma2.backbone_cls(
        **convert_t5gemma2.convert_backbone_config(copy.deepcopy(config)))


@pytest.mark.parametrize("name", ["t5gemma2-T5Gemma2ForConditionalGeneration-float32",
                                  "t5gemma2-T5Gemma2Model-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(name):
    """keras-hub's importer reads the tower as the Hub names it (`vision_model.`), as export
    writes it: it reads objckpt's export of transformers' folder; objckpt restores that folder
    itself (transformers 5's names) to the same values."""
    keras_hub = pytest.importorskip("keras_hub")
    theirs = keras_hub.models.Backbone.from_preset(os.path.join(EXPORTS, name),
                                                   dtype="float32")
    path = os.path.join(FIXTURES, name)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        ours = _backbone(json.load(f))
    report = objckpt.restore(ours, path)
    assert "huggingface('t5gemma2')" in str(report)
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("config,task", [(T5GEMMA2, False), (T5GEMMA2, True),
                                         (TEXT_ONLY, False)])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, config, task):
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(config)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    # the two stacks' embeddings are one tensor in the folder: export refuses them unequal
    backbone.get_layer("decoder_token_embedding").embeddings.assign(
        backbone.get_layer("encoder_token_embedding").embeddings)
    if config is T5GEMMA2:
        backbone.decoder_eoi_embedding.assign(backbone.encoder_eoi_embedding)
    model = keras_hub.models.T5Gemma2Seq2SeqLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    objckpt.export(model, str(folder), rules=huggingface(str(folder)))
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    tied = 2 if config is T5GEMMA2 else 1  # one embedding (and one eoi vector) for two
    assert len(names) == len(backbone.weights) - tied
    assert "model.decoder.norm.weight" in names and "lm_head.out_proj.weight" not in names
    loaded = keras_hub.models.Backbone.from_preset(str(folder))
    assert _values(loaded) == _values(backbone)


def test_export_refuses_stacks_whose_shared_embedding_differs(tmp_path):
    """The folder holds one token embedding for both stacks: a model whose two differ (the
    decoder's trained alone) is refused, naming both, and nothing is written."""
    pytest.importorskip("keras_hub")
    backbone = _backbone(TEXT_ONLY)
    decoder = backbone.get_layer("decoder_token_embedding").embeddings
    decoder.assign(decoder.numpy() + 1.0)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TEXT_ONLY), encoding="utf-8")
    with pytest.raises(errors.ObjckptError, match="(?s)token_embedding.*decoder_token_embedding"):
        objckpt.export(backbone, str(folder), rules=huggingface(str(folder)))
    assert not (folder / "model.safetensors").exists()
