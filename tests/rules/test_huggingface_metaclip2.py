"""The Hugging Face rule set for MetaCLIP 2 (a text tower, a vision tower, their projections
and the contrastive head's temperature): the set itself, its bad configs, and keras-hub's
own importer as a second oracle (what it reads from the fixtures and from objckpt's
exports).

transformers' side (its folders restored and compared with its outputs on text and an
image, objckpt's exports read back by it) is tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
TEXT = {"model_type": "metaclip_2_text_model", "vocab_size": 64, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "max_position_embeddings": 32, "hidden_act": "quick_gelu", "eos_token_id": 2}
VISION = {"model_type": "metaclip_2_vision_model", "hidden_size": 24, "intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
          "hidden_act": "quick_gelu"}
METACLIP2 = {"model_type": "metaclip_2", "architectures": ["MetaClip2Model"],
             "text_config": TEXT, "vision_config": VISION, "projection_dim": 8}
FOLDERS = ["metaclip_2-MetaClip2Model-float32", "metaclip_2-MetaClip2Model-bfloat16"]


# --- the set itself (no keras-hub) ------------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, METACLIP2))
    assert "metaclip_2" in objckpt.rules.supported()
    assert chosen.name == "huggingface('metaclip_2')"
    assert list(chosen) == list(huggingface("metaclip_2", config=METACLIP2))
    assert chosen.classes == {}  # keras-hub has no MetaCLIP 2 task model


def test_both_towers_their_layouts_and_the_head():
    rules = by_source(huggingface("metaclip_2", config=METACLIP2))
    # the vision tower (width 24, 2 heads): block i is its encoder's operation 3 + i
    query = rules["vision_model.encoder.layers.1.self_attn.q_proj.weight"]
    assert query.target == "vision_encoder/operations/4/attention/query_dense/kernel"
    assert query.transform == Chain(Transpose(), Reshape((24, 24), (24, 2, 12)))
    output = rules["vision_model.encoder.layers.0.self_attn.out_proj.weight"]
    assert output.transform == Chain(Transpose(), Reshape((24, 24), (2, 12, 24)))
    assert rules["vision_model.encoder.layers.0.self_attn.k_proj.bias"].transform == (
        Reshape((24,), (2, 12)))
    assert rules["vision_model.embeddings.patch_embedding.weight"].transform == (
        ConvKernel("OIHW", "HWIO"))
    assert rules["vision_model.pre_layrnorm.weight"].target == (
        "vision_encoder/pre_layer_norm/gamma")
    assert rules["vision_model.post_layernorm.bias"].target == "vision_post_layer_norm/beta"
    # the text tower (width 16, 2 heads): block i is its encoder's operation 2 + i
    value = rules["text_model.encoder.layers.0.self_attn.v_proj.weight"]
    assert value.target == "text_encoder/operations/2/attention/value_dense/kernel"
    assert value.transform == Chain(Transpose(), Reshape((16, 16), (16, 2, 8)))
    assert rules["text_model.encoder.layers.1.mlp.fc2.weight"].target == (
        "text_encoder/operations/3/dense_2/kernel")
    assert rules["text_model.final_layer_norm.weight"].target == "text_encoder/layer_norm/gamma"
    # projections without bias, and the temperature
    assert rules["visual_projection.weight"].target == "vision_projection/kernel"
    assert rules["text_projection.weight"].transform == Transpose()
    assert "visual_projection.bias" not in rules
    assert rules["logit_scale"].target == "metaclip_2_head/logit_scale"
    assert rules["classifier.weight"].head == "MetaClip2ForImageClassification"
    # one rule per block entry and layer: 16 per block, 2 + 2 blocks
    assert sum(".encoder.layers." in source for source in rules) == 16 * 4


def test_export_names_each_variable_as_the_hub_does():
    rules = huggingface("metaclip_2", config=METACLIP2)
    assert rules.export_name("vision_encoder/operations/3/attention/output_dense/bias")[0] == (
        "vision_model.encoder.layers.0.self_attn.out_proj.bias")
    assert rules.export_name("text_encoder/embedding/token_embedding/embeddings")[0] == (
        "text_model.embeddings.token_embedding.weight")
    assert rules.export_name("metaclip_2_head/logit_scale")[0] == "logit_scale"


@pytest.mark.parametrize("drop", ["text_config", "vision_config"])
def test_a_config_without_a_tower_is_refused(drop):
    config = {k: v for k, v in METACLIP2.items() if k != drop}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"MetaCLIP 2.*`{drop}` \\(a dict\\).*received None.*Fix:"):
        huggingface("metaclip_2", config=config)


@pytest.mark.parametrize("part,missing", [
    ("text_config", "hidden_size"), ("vision_config", "num_attention_heads"),
    ("vision_config", "num_hidden_layers"), ("text_config", "intermediate_size")])
def test_a_config_without_sizes_is_refused(part, missing):
    config = {**METACLIP2, part: {k: v for k, v in METACLIP2[part].items() if k != missing}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"MetaCLIP 2 rule set.*`{missing}`.*received None.*Fix:"):
        huggingface("metaclip_2", config=config)


def test_heads_that_do_not_divide_the_width_are_refused():
    config = {**METACLIP2, "vision_config": {**VISION, "num_attention_heads": 5}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"MetaCLIP 2.*divisible.*received 24 and 5.*Fix:"):
        huggingface("metaclip_2", config=config)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_metaclip_2

    return convert_metaclip_2.backbone_cls(**convert_metaclip_2.convert_backbone_config(config))


@pytest.mark.parametrize("folder", FOLDERS)
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, folder):
    """transformers' folder restored by objckpt (one call, no rules) and read by keras-hub's
    `from_preset(folder)`: every variable bit-equal; so is keras-hub's read of objckpt's
    export, which holds the folder's entries and no other."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    path = os.path.join(FIXTURES, folder)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('metaclip_2')" in str(report)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    assert type(theirs) is type(ours)
    assert _values(ours) == _values(theirs)
    out = str(tmp_path / "export")
    objckpt.export(ours, out, rules=huggingface(path))
    with safe_open(os.path.join(out, "model.safetensors"), "np") as f, \
            safe_open(os.path.join(path, "model.safetensors"), "np") as g:
        assert sorted(f.keys()) == sorted(g.keys())
    assert _values(keras_hub.models.Backbone.from_preset(out, dtype="float32")) == (
        _values(ours))


def test_export_is_what_keras_hubs_importer_reads(tmp_path):
    """A random backbone exported with the set -> keras-hub's `from_preset(folder)` -> every
    variable bit-equal; one entry per variable."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(METACLIP2)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    folder = config_folder(tmp_path / "hf", METACLIP2)
    objckpt.export(backbone, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(backbone.weights)
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
