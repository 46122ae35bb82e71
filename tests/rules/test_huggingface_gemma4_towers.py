"""The Hugging Face rule set for the multimodal Gemma 4 (`gemma4`: the text decoder, a vision
tower and an audio tower): the set itself, and keras-hub's own importer as a second oracle
(what it reads from transformers' folders, what it reads from objckpt's exports).

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the set needs no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` is the oracle where it is installed.
keras-hub 0.32 reads the full-attention layers' head width from the published configs' key
(`global_head_dim`), not from the `per_layer_config` transformers 5 writes: its folders here
get a text config in the published form.
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
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0}}
TEXT = {"model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 16,
        "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 16, "sliding_window": 64,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64,
        "rope_parameters": ROPE, "rms_norm_eps": 1e-06, "pad_token_id": 0}
VISION = {"model_type": "gemma4_vision", "hidden_size": 24, "intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": 12, "patch_size": 4, "position_embedding_size": 16,
          "pooling_kernel_size": 2, "use_clipped_linears": True, "standardize": True,
          "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 100.0}}
AUDIO = {"model_type": "gemma4_audio", "hidden_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "subsampling_conv_channels": [128, 4],
         "conv_kernel_size": 3, "attention_chunk_size": 4, "attention_context_left": 5,
         "attention_context_right": 0, "attention_logit_cap": 50.0,
         "attention_invalid_logits_value": -1e9, "residual_weight": 0.5,
         "gradient_clipping": 1e10, "output_proj_dims": 12, "rms_norm_eps": 1e-06,
         "use_clipped_linears": True}
VISION_ONLY = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
               "text_config": TEXT, "vision_config": VISION, "audio_config": None,
               "tie_word_embeddings": True, "torch_dtype": "float32"}
WITH_AUDIO = {**VISION_ONLY, "audio_config": AUDIO}
CONFIGS = {"vision": VISION_ONLY, "audio": WITH_AUDIO}


# --- the set itself (no keras-hub) -----------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, WITH_AUDIO))
    assert "gemma4" in objckpt.rules.supported()
    assert chosen.name == "huggingface('gemma4')"
    assert list(chosen) == list(huggingface("gemma4", config=WITH_AUDIO))


def test_the_text_decoder_is_gemma4_texts_under_language_model():
    text = [r for r in huggingface("gemma4_text", config=TEXT)
            if r.source.startswith("model.") and r.head is None]
    rules = by_source(huggingface("gemma4", config=VISION_ONLY))
    for rule in text:
        for prefix in ("model.language_model.", "language_model."):
            mine = rules[prefix + rule.source[len("model."):]]
            assert (mine.target, mine.transform) == (rule.target, rule.transform)
    assert rules["lm_head.weight"].head == (
        "Gemma4ForConditionalGeneration (tied to the token embedding)")


def test_vision_tower_layouts():
    rules = by_source(huggingface("gemma4", config=VISION_ONLY))
    layer = "model.vision_tower.encoder.layers.1"
    # q/k/v (heads * head_dim, hidden) -> (heads, hidden, head_dim); o the other way
    q = rules[f"{layer}.self_attn.q_proj.linear.weight"]
    assert q.target == "image_encoder/encoder_block_1/attention/query/dense/kernel"
    assert q.transform == Chain(Reshape((24, 24), (2, 12, 24)), Transpose((0, 2, 1)))
    torch_q = np.arange(24 * 24, dtype=np.float32).reshape(24, 24)
    assert q.transform(torch_q)[1, 5, 3] == torch_q[12 + 3, 5]
    o = rules[f"{layer}.self_attn.o_proj.linear.weight"]
    assert o.transform == Chain(Reshape((24, 24), (24, 2, 12)), Transpose((1, 2, 0)))
    assert o.transform(torch_q)[1, 3, 5] == torch_q[5, 12 + 3]
    assert rules[f"{layer}.mlp.up_proj.linear.weight"].target == (
        "image_encoder/encoder_block_1/ffw_gating_2/dense/kernel")
    assert rules[f"{layer}.self_attn.k_proj.output_max"].target == (
        "image_encoder/encoder_block_1/attention/key/output_max")
    assert rules[f"{layer}.input_layernorm.weight"].target == (
        "image_encoder/encoder_block_1/pre_attention_norm/scale")
    assert rules["model.vision_tower.std_scale"].target == "vision_output_encoder/std_scale"
    assert rules["embed_vision.embedding_projection.weight"].transform == Transpose()
    assert not any(r.source.startswith(("audio_tower", "model.audio_tower"))
                   for r in huggingface("gemma4", config=VISION_ONLY))
    # without clipping or standardizing: no bounds, no std entries
    plain = {**VISION_ONLY, "vision_config": {**VISION, "use_clipped_linears": False,
                                              "standardize": False}}
    sources = {r.source for r in huggingface("gemma4", config=plain)}
    assert not any(s.endswith(("input_min", "output_max", "std_bias")) for s in sources)
    assert len(rules) - len(sources) == 2 * (2 * 7 * 4 + 2)  # both prefixes


def test_audio_tower_targets_the_encoder_by_object_path():
    rules = by_source(huggingface("gemma4", config=WITH_AUDIO))
    block = "model.audio_tower.layers.0"
    ours = "audio_encoder/conformer_blocks/0"
    expected = {
        f"{block}.feed_forward2.ffw_layer_1.linear.weight": f"{ours}/ffw_end/ffw_1/dense/kernel",
        f"{block}.feed_forward1.pre_layer_norm.weight": f"{ours}/ffw_start/pre_norm/scale",
        f"{block}.self_attn.relative_k_proj.weight": f"{ours}/attention/attn/rpe/pos_proj",
        f"{block}.self_attn.post.input_min": f"{ours}/attention/out_proj/input_min",
        f"{block}.norm_post_attn.weight": f"{ours}/attention/post_norm/scale",
        f"{block}.lconv1d.conv_norm.weight": f"{ours}/lconv/conv_norm/scale",
        f"{block}.norm_out.weight": f"{ours}/norm/scale",
        "model.audio_tower.subsample_conv_projection.layer1.norm.weight":
            "audio_encoder/subsample_conv_projection/conv_1/norm/gamma",
        "model.embed_audio.embedding_projection.weight":
            "audio_encoder/audio_output_projection/kernel",
    }
    assert {s: rules[s].target for s in expected} == expected
    conv = rules["model.audio_tower.subsample_conv_projection.layer0.conv.weight"]
    assert conv.transform == ConvKernel("OIHW", "HWIO")
    depthwise = rules[f"{block}.lconv1d.depthwise_conv1d.weight"].transform
    torch_kernel = np.arange(16 * 3, dtype=np.float32).reshape(16, 1, 3)  # (channels, 1, k)
    keras_kernel = depthwise(torch_kernel)
    assert keras_kernel.shape == (3, 16, 1) and keras_kernel[2, 5, 0] == torch_kernel[5, 0, 2]
    # in the task model the encoder is the backbone's
    task = by_source(huggingface("gemma4", config={**WITH_AUDIO, "task": "Gemma4CausalLM"}))
    assert task[f"{block}.norm_out.weight"].target == f"backbone/{ours}/norm/scale"
    assert task["model.vision_tower.std_bias"].target == "vision_output_encoder/std_bias"


@pytest.mark.parametrize("part", ["text_config", "vision_config"])
def test_a_config_without_a_part_is_refused(part):
    config = {k: v for k, v in WITH_AUDIO.items() if k != part}
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)Gemma 4 \(multimodal\).*`{part}`.*received None.*Fix:.*"
                             r"gemma4_text"):
        huggingface("gemma4", config=config)


@pytest.mark.parametrize("part,key", [("text_config", "hidden_size"),
                                      ("vision_config", "num_attention_heads"),
                                      ("audio_config", "num_hidden_layers")])
def test_a_config_without_sizes_is_refused(part, key):
    config = {**WITH_AUDIO, part: {k: v for k, v in WITH_AUDIO[part].items() if k != key}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)Gemma 4 \(multimodal\).*`{key}`.*received None.*Fix:"):
        huggingface("gemma4", config=config)


def test_an_audio_config_that_is_no_dict_is_refused():
    with pytest.raises(errors.InvalidArgumentError, match=r"`audio_config` \(a dict\)"):
        huggingface("gemma4", config={**WITH_AUDIO, "audio_config": [1, 2]})


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _published(config: dict) -> dict:
    """transformers 5's config with its text config in the published form (keras-hub reads
    that one)."""
    text = {k: v for k, v in config["text_config"].items() if k != "per_layer_config"}
    full = config["text_config"]["per_layer_config"][
        str(text["layer_types"].index("full_attention"))]
    return {**config, "text_config": {**text, "global_head_dim": full["head_dim"]}}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_gemma4

    return convert_gemma4.backbone_cls(**convert_gemma4.convert_backbone_config(config))


@pytest.mark.parametrize("folder", ["gemma4_vision-Gemma4ForConditionalGeneration-float32",
                                    "gemma4_vision-Gemma4ForConditionalGeneration-bfloat16",
                                    "gemma4_audio-Gemma4ForConditionalGeneration-float32",
                                    "gemma4_audio-Gemma4ForConditionalGeneration-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, folder):
    """transformers' folder restored by objckpt (one call, no rules) == keras-hub's
    `from_preset(folder)`, every variable of the decoder and both towers."""
    keras_hub = pytest.importorskip("keras_hub")
    with open(os.path.join(FIXTURES, folder, "config.json"), encoding="utf-8") as f:
        config = _published(json.load(f))
    path = config_folder(tmp_path / "hf", config)
    shutil.copy(os.path.join(FIXTURES, folder, "model.safetensors"), path)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('gemma4')" in str(report)
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)
    before = _values(ours)
    objckpt.restore(ours, os.path.join(FIXTURES, folder))  # transformers 5's own config
    assert _values(ours) == before


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, name, task):
    """A random backbone (or its task model) exported with the set -> keras-hub's
    `from_preset(folder)` -> every backbone variable bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    config = CONFIGS[name]
    backbone = _backbone(config)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(backbone.weights)
    assert all(n.startswith("model.") for n in names)
    assert ("model.audio_tower.layers.1.lconv1d.depthwise_conv1d.weight" in names) == (
        name == "audio")
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
