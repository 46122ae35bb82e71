"""The Hugging Face rule set for the multimodal Gemma 3 (text decoder, SigLIP vision tower,
projector): the set itself, its key forms, and keras-hub's own importer as a second oracle
(what it reads from objckpt's exports, which name the tower as the Hub's folders do).

transformers' side (its folders restored and compared with its outputs on text and images,
objckpt's exports read back by it) is tests/integration/test_hf_transformers.py; here the
configs are dicts (the set needs no keras-hub) and keras-hub's `Backbone.from_preset(folder)`
is the oracle where it is installed.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
EXPORTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf_exports")
TEXT = {"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 16,
        "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 8, "query_pre_attn_scalar": 8,
        "sliding_window": 64, "rms_norm_eps": 1e-6, "max_position_embeddings": 64}
VISION = {"model_type": "siglip_vision_model", "hidden_size": 24, "intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32,
          "patch_size": 4, "layer_norm_eps": 1e-6, "vision_use_head": False}
GEMMA3 = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
          "text_config": TEXT, "vision_config": VISION, "mm_tokens_per_image": 4,
          "image_token_index": 60, "boi_token_index": 61, "eoi_token_index": 62,
          "torch_dtype": "float32"}
FOLDER = "gemma3_vision-Gemma3ForConditionalGeneration-float32"


# --- the set itself (no keras-hub) ------------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, GEMMA3))
    assert "gemma3" in objckpt.rules.supported()
    assert chosen.name == "huggingface('gemma3')"
    assert list(chosen) == list(huggingface("gemma3", config=GEMMA3))
    assert chosen.classes == {"Gemma3CausalLM": "Gemma3ForConditionalGeneration"}


def test_the_three_parts_and_their_layouts():
    rules = by_source(huggingface("gemma3", config=GEMMA3))
    text, tower = "language_model.model.layers.{i}.self_attn", "vision_tower.vision_model."
    # the text decoder: Gemma 3's, its sizes from text_config
    assert rules[f"{text}.q_proj.weight"].transform == Chain(
        Reshape((32, 16), (4, 8, 16)), Transpose((0, 2, 1)))
    assert rules[f"{text}.k_norm.weight"].target == "decoder_block_{i}/attention/key_norm/scale"
    assert rules["language_model.model.embed_tokens.weight"].target == (
        "token_embedding/embeddings")
    # the tower: a Conv2d kernel, Linear weights transposed, norms as they are
    patch = rules[f"{tower}embeddings.patch_embedding.weight"]
    assert patch.target == "image_encoder/encoder_embeddings/embedding_conv/kernel"
    assert patch.transform == ConvKernel("OIHW", "HWIO")
    query = rules[f"{tower}encoder.layers.{{i}}.self_attn.q_proj.weight"]
    assert query.target == "image_encoder/encoder_block_{i}/multi_head_attention/query_proj/kernel"
    assert query.transform == Transpose()
    assert rules[f"{tower}encoder.layers.{{i}}.self_attn.out_proj.bias"].target == (
        "image_encoder/encoder_block_{i}/multi_head_attention/out_proj/bias")
    assert rules[f"{tower}post_layernorm.weight"].target == "image_encoder/encoder_layer_norm/gamma"
    assert rules[f"{tower}embeddings.position_embedding.weight"].transform is None
    # the projector: used as x @ w, so the kernel as it is
    projection = rules["multi_modal_projector.mm_input_projection_weight"]
    assert projection.target == "vision_output_encoder/vision_input_projection/kernel"
    assert projection.transform is None
    # heads set aside, named by their classes
    assert rules["lm_head.weight"].head == (
        "Gemma3ForConditionalGeneration (tied to the token embedding)")
    assert rules["score.weight"].head == "Gemma3ForSequenceClassification"
    assert "never runs" in rules["vision_tower.head.probe"].head
    torch_patch = np.arange(24 * 3 * 4 * 4, dtype=np.float32).reshape(24, 3, 4, 4)
    keras_patch = patch.transform(torch_patch)
    assert keras_patch.shape == (4, 4, 3, 24) and keras_patch[1, 2, 0, 5] == torch_patch[5, 0, 1, 2]


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model.",
                                    "language_model."])
def test_restore_reads_every_spelling_of_the_decoder(prefix):
    rules = by_source(huggingface("gemma3", config=GEMMA3))
    assert rules[f"{prefix}layers.{{i}}.mlp.down_proj.weight"].target == (
        "decoder_block_{i}/ffw_linear/kernel")


@pytest.mark.parametrize("prefix", ["vision_tower.vision_model.", "vision_tower.",
                                    "model.vision_tower.", "model.vision_tower.vision_model."])
def test_restore_reads_every_spelling_of_the_tower(prefix):
    rules = by_source(huggingface("gemma3", config=GEMMA3))
    assert rules[f"{prefix}encoder.layers.{{i}}.mlp.fc2.weight"].target == (
        "image_encoder/encoder_block_{i}/mlp_dense_2/kernel")


def test_export_names_the_hubs_form():
    rules = huggingface("gemma3", config=GEMMA3)
    assert rules.export_name("image_encoder/encoder_block_1/mlp_dense_1/kernel")[0] == (
        "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight")
    assert rules.export_name("decoder_block_0/attention/query_norm/scale")[0] == (
        "language_model.model.layers.0.self_attn.q_norm.weight")
    assert rules.export_name("vision_output_encoder/vision_soft_embedding_norm/scale")[0] == (
        "multi_modal_projector.mm_soft_emb_norm.weight")


@pytest.mark.parametrize("drop,missing", [
    (("text_config",), "text_config"), (("vision_config",), "vision_config")])
def test_a_config_without_a_part_is_refused(drop, missing):
    config = {k: v for k, v in GEMMA3.items() if k not in drop}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"`{missing}` \\(a dict\\).*received None.*Fix:.*gemma3_text"):
        huggingface("gemma3", config=config)


@pytest.mark.parametrize("part,missing", [
    ("text_config", "head_dim"), ("text_config", "hidden_size"),
    ("vision_config", "num_attention_heads"), ("vision_config", "intermediate_size")])
def test_a_part_without_sizes_is_refused(part, missing):
    config = {**GEMMA3, part: {k: v for k, v in GEMMA3[part].items() if k != missing}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"Gemma 3 \\(multimodal\\).*`{missing}`.*received None.*Fix:"):
        huggingface("gemma3", config=config)


# --- key forms --------------------------------------------------------------------------------

@pytest.mark.parametrize("folder,form", [
    (os.path.join(FIXTURES, FOLDER), "transformers 5"),  # save_pretrained's default
    (os.path.join(FIXTURES, FOLDER + "-v5names"), "transformers 5"),
    (os.path.join(FIXTURES, "gemma3_vision-Gemma3Model-float32"), "transformers 5"),
    (os.path.join(EXPORTS, FOLDER), "original")])  # objckpt's export: the Hub's names
def test_the_folders_key_form_is_read_from_its_names(folder, form):
    assert huggingface(folder).key_form == form


def test_a_folder_of_two_forms_is_refused(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    folder = config_folder(tmp_path / "mixed", GEMMA3)
    tensor = np.zeros((4,), np.float32)
    safetensors_numpy.save_file(
        {"vision_tower.vision_model.post_layernorm.bias": tensor,
         "vision_tower.post_layernorm.weight": tensor},
        os.path.join(folder, "model.safetensors"))
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)two forms.*vision_model\.post_layernorm.*original.*"
                             r"vision_tower\.post_layernorm.*transformers 5.*Fix:"):
        huggingface(folder)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_gemma3

    return convert_gemma3.backbone_cls(**convert_gemma3.convert_backbone_config(config))


@pytest.mark.parametrize("folder", [FOLDER, FOLDER + "-v5names",
                                    "gemma3_vision-Gemma3Model-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer_of_the_export(tmp_path, folder):
    """transformers' folder restored by objckpt (one call, no rules), exported, and the
    export read by keras-hub's `from_preset`: every variable bit-equal to objckpt's restore
    (keras-hub's importer reads only the Hub's `vision_tower.vision_model.` names, so not
    the folders transformers 5 writes)."""
    keras_hub = pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, folder)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('gemma3')" in str(report)
    assert "its keys in the transformers 5 form" in str(report)
    out = str(tmp_path / "export")
    objckpt.export(ours, out, rules=huggingface(path))
    theirs = keras_hub.models.Backbone.from_preset(out, dtype="float32")
    assert type(theirs) is type(ours)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, task):
    """A random backbone (or its Gemma3CausalLM) exported with the set -> keras-hub's
    `from_preset(folder)` -> every backbone variable bit-equal; one entry per variable."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(GEMMA3)
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = config_folder(tmp_path / "hf", GEMMA3)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(backbone.trainable_weights)
    assert not [n for n in names if n.startswith("vision_tower.")
                and not n.startswith("vision_tower.vision_model.")]
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)


def test_restore_into_keras_hubs_importer_model_changes_nothing_it_read(tmp_path):
    """keras-hub's importer of objckpt's committed export, restored again from the
    transformers-written folder: every variable as it was (the same model)."""
    keras_hub = pytest.importorskip("keras_hub")
    export = str(tmp_path / "export")
    shutil.copytree(os.path.join(EXPORTS, FOLDER), export)
    theirs = keras_hub.models.Backbone.from_preset(export, dtype="float32")
    before = _values(theirs)
    objckpt.restore(theirs, os.path.join(FIXTURES, FOLDER))
    assert _values(theirs) == before


def test_a_folder_in_the_hubs_form_restores_what_transformers_folder_restores():
    """The committed export names the tower as the Hub's folders do (transformers 5.24's
    save_pretrained cannot write that form): restored, every variable bit-equal to the
    restore of the folder transformers wrote, and the report names the original form."""
    pytest.importorskip("keras_hub")
    with open(os.path.join(FIXTURES, FOLDER, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours, theirs = _backbone(config), _backbone(config)
    report = objckpt.restore(ours, os.path.join(EXPORTS, FOLDER))
    assert "its keys in the original form" in str(report)
    objckpt.restore(theirs, os.path.join(FIXTURES, FOLDER))
    assert _values(ours) == _values(theirs)
