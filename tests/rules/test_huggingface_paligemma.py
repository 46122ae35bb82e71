"""The Hugging Face rule set for PaliGemma (Gemma decoder, SigLIP vision tower, linear
projector): the set itself, its embedding rows and key forms, and keras-hub's own importer
as a second oracle (what it reads from objckpt's exports, which name the tower as the Hub's
folders do).

transformers' side (its folders restored and compared with its outputs on an image and a
prefix-and-response text, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Crop, Pad, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
TEXT = {"model_type": "gemma", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 16, "num_image_tokens": 16, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64}
VISION = {"model_type": "siglip_vision_model", "hidden_size": 24, "intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 16,
          "patch_size": 4, "layer_norm_eps": 1e-6, "projection_dim": 16,
          "vision_use_head": False}
PALIGEMMA = {"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"],
             "text_config": TEXT, "vision_config": VISION, "image_token_index": 64,
             "projection_dim": 16, "torch_dtype": "float32"}
FOLDER = "paligemma-PaliGemmaForConditionalGeneration-float32"


# --- the set itself (no keras-hub) ------------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, PALIGEMMA))
    assert "paligemma" in objckpt.rules.supported()
    assert chosen.name == "huggingface('paligemma')"
    assert list(chosen) == list(huggingface("paligemma", config=PALIGEMMA))
    assert chosen.classes == {"PaliGemmaCausalLM": "PaliGemmaForConditionalGeneration"}


def test_the_three_parts_and_their_layouts():
    rules = by_source(huggingface("paligemma", config=PALIGEMMA))
    layer = "language_model.model.layers.{i}"
    # Gemma 1's decoder: the post-attention norm is keras-hub's pre-feed-forward norm
    assert rules[f"{layer}.post_attention_layernorm.weight"].target == (
        "decoder_block_{i}/pre_ffw_norm/scale")
    assert rules[f"{layer}.self_attn.q_proj.weight"].target == (
        "decoder_block_{i}/attention/query/kernel")
    # the vocabulary ends at the image token here: every row restored as it is
    assert rules["language_model.model.embed_tokens.weight"].transform is None
    # the SigLIP tower, as Gemma 3's
    assert rules["vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.weight"].target == (
        "image_encoder/encoder_block_{i}/mlp_dense_1/kernel")
    # the projector: a Linear into keras-hub's `image_classifier` Dense
    assert rules["multi_modal_projector.linear.weight"].target == "image_classifier/kernel"
    assert rules["multi_modal_projector.linear.weight"].transform == Transpose()
    assert rules["model.multi_modal_projector.linear.bias"].target == "image_classifier/bias"
    assert rules["lm_head.weight"].head == (
        "PaliGemmaForConditionalGeneration (tied to the token embedding)")
    assert "never runs" in rules["vision_tower.head.probe"].head


def test_rows_past_the_image_token_are_cropped_and_exported_as_zeros():
    """The Hub's PaliGemma: a vocabulary of 257216 rows, the image token 257152: keras-hub's
    embedding holds the rows before it."""
    config = {**PALIGEMMA, "image_token_index": 60}
    rules = huggingface("paligemma", config=config)
    rule = by_source(rules)["language_model.model.embed_tokens.weight"]
    assert rule.transform == Crop(axis=0, after=4)
    table = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    kept = rule.transform(table)
    assert kept.shape == (60, 16) and kept.tobytes() == table[:60].tobytes()
    name, inverse, _ = rules.export_name("token_embedding/embeddings")
    assert (name, inverse) == ("language_model.model.embed_tokens.weight", Pad(0, 0, 4))
    written = inverse(kept)
    assert written.shape == (64, 16) and not written[60:].any()


def test_export_names_the_hubs_form():
    rules = huggingface("paligemma", config=PALIGEMMA)
    assert rules.export_name("image_encoder/encoder_embeddings/embedding_conv/kernel")[0] == (
        "vision_tower.vision_model.embeddings.patch_embedding.weight")
    assert rules.export_name("image_classifier/bias")[0] == "multi_modal_projector.linear.bias"
    assert rules.export_name("final_normalization/scale")[0] == "language_model.model.norm.weight"


@pytest.mark.parametrize("drop", ["text_config", "vision_config"])
def test_a_config_without_a_part_is_refused(drop):
    config = {k: v for k, v in PALIGEMMA.items() if k != drop}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"PaliGemma.*`{drop}` \\(a dict\\).*received None.*Fix:"):
        huggingface("paligemma", config=config)


@pytest.mark.parametrize("part,missing", [
    ("text_config", "head_dim"), ("vision_config", "hidden_size"), (None, "image_token_index")])
def test_a_config_without_sizes_is_refused(part, missing):
    if part is None:
        config = {k: v for k, v in PALIGEMMA.items() if k != missing}
    else:
        config = {**PALIGEMMA, part: {k: v for k, v in PALIGEMMA[part].items() if k != missing}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"PaliGemma rule set.*`{missing}`.*received None.*Fix:"):
        huggingface("paligemma", config=config)


def test_paligemma_2s_decoder_is_refused():
    config = {**PALIGEMMA, "text_config": {**TEXT, "model_type": "gemma2"}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)received 'gemma2'.*Gemma 1's decoder.*Fix:"):
        huggingface("paligemma", config=config)


@pytest.mark.parametrize("folder,form", [(FOLDER, "transformers 5"),
                                         (FOLDER + "-v5names", "transformers 5"),
                                         ("paligemma-PaliGemmaModel-float32", "transformers 5")])
def test_the_folders_key_form_is_read_from_its_names(folder, form):
    assert huggingface(os.path.join(FIXTURES, folder)).key_form == form


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_pali_gemma

    return convert_pali_gemma.backbone_cls(**convert_pali_gemma.convert_backbone_config(config))


@pytest.mark.parametrize("folder", [FOLDER, FOLDER + "-v5names",
                                    "paligemma-PaliGemmaModel-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer_of_the_export(tmp_path, folder):
    """transformers' folder restored by objckpt (one call, no rules), exported, and the
    export read by keras-hub's `from_preset`: every variable bit-equal to objckpt's restore;
    the export in the Hub's form (keras-hub reads only `vision_tower.vision_model.`)."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    path = os.path.join(FIXTURES, folder)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('paligemma')" in str(report)
    assert "its keys in the transformers 5 form" in str(report)
    out = str(tmp_path / "export")
    objckpt.export(ours, out, rules=huggingface(path))
    with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
        tower = [n for n in f.keys() if n.startswith("vision_tower.")]
    assert tower and all(n.startswith("vision_tower.vision_model.") for n in tower)
    theirs = keras_hub.models.Backbone.from_preset(out, dtype="float32")
    assert type(theirs) is type(ours)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, task):
    """A random backbone (or its PaliGemmaCausalLM) exported with the set -> keras-hub's
    `from_preset(folder)` -> every backbone variable bit-equal; one entry per variable."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(PALIGEMMA)
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.PaliGemmaCausalLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = config_folder(tmp_path / "hf", PALIGEMMA)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(backbone.trainable_weights)
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
