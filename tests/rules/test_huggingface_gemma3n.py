"""The Hugging Face rule set for Gemma 3n's text decoder (`gemma3n_text`): the set itself, and
keras-hub's own importer as a second oracle.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py. keras-hub 0.32's `from_preset` reads only the
multimodal model type (`gemma3n`, whose vision encoder its importer fixes at MobileNetV5-300M
whatever the config says), so the second oracle here is its importer's own function for the
decoder, `convert_gemma3n._port_language_model`, run with keras-hub's `SafetensorLoader` on
the text-only folder (the multimodal names `model.language_model.X` read as the folder's).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import ConvKernel, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
# four layers (sliding, full, twice), the last two reusing the first two's keys and values
GEMMA3N = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text",
           "vocab_size": 64, "hidden_size": 16, "intermediate_size": [32] * 4,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "sliding_window": 64, "hidden_activation": "gelu_pytorch_tanh",
           "layer_types": ["sliding_attention", "full_attention"] * 2,
           "max_position_embeddings": 64, "hidden_size_per_layer_input": 4,
           "vocab_size_per_layer_input": 64, "altup_num_inputs": 3, "altup_active_idx": 0,
           "altup_coef_clip": 120.0, "altup_correct_scale": True, "laurel_rank": 4,
           "num_kv_shared_layers": 2, "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
           "final_logit_softcapping": 30.0, "attention_bias": False, "attention_dropout": 0.0,
           "rope_parameters": ROPE, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
           "dtype": "float32"}
SHARED = ("k_proj.weight", "v_proj.weight", "k_norm.weight")


# --- the set itself (no keras-hub) -----------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, GEMMA3N))
    assert "gemma3n_text" in objckpt.rules.supported()
    assert "gemma3n" in objckpt.rules.supported()  # the multimodal set
    assert chosen.name == "huggingface('gemma3n_text')"
    assert list(chosen) == list(huggingface("gemma3n_text", config=GEMMA3N))
    assert chosen.classes == {"Gemma3nCausalLM": "Gemma3nForCausalLM"}


def test_every_linear_is_transposed_and_the_rest_kept_as_they_are():
    rules = by_source(huggingface("gemma3n_text", config=GEMMA3N))
    layer = "language_model/transformer_layers/1"
    for name, target in (
            ("self_attn.q_proj", "attention/q_proj"), ("self_attn.o_proj", "attention/o_proj"),
            ("mlp.down_proj", "mlp/down_proj"), ("altup.prediction_coefs",
                                                 "altup/prediction_coefs"),
            ("altup.modality_router", "altup/modality_router"),
            ("laurel.linear_left", "laurel/linear_left"),
            ("per_layer_projection", "per_layer_projection")):
        rule = rules[f"model.layers.1.{name}.weight"]
        assert (rule.target, rule.transform) == (f"{layer}/{target}/kernel", Transpose())
    for name, target in (("altup.correct_output_scale", "altup/correct_output_scale"),
                         ("altup.router_norm.weight", "altup/router_norm/scale"),
                         ("laurel.post_laurel_norm.weight", "laurel/post_laurel_norm/scale"),
                         ("self_attn.q_norm.weight", "attention/q_norm/scale"),
                         ("post_per_layer_input_norm.weight", "post_per_layer_input_norm/scale")):
        rule = rules[f"model.layers.1.{name}"]
        assert (rule.target, rule.transform) == (f"{layer}/{target}", None)
    # two extra AltUp streams: two projections each way
    assert rules["model.altup_projections.1.weight"].target == (
        "language_model/altup_projections/1/kernel")
    assert "model.altup_projections.2.weight" not in rules
    assert rules["model.embed_tokens_per_layer.weight"].transform is None
    assert "layers.3.laurel.linear_right.weight" in rules  # Gemma3nTextModel saves it bare
    assert rules["lm_head.weight"].head == "Gemma3nForCausalLM (tied to the token embedding)"
    torch_weight = np.arange(4 * 16, dtype=np.float32).reshape(4, 16)  # (out, in)
    kernel = rules["model.layers.0.per_layer_input_gate.weight"].transform(torch_weight)
    assert kernel.shape == (16, 4) and kernel[5, 3] == torch_weight[3, 5]


def test_shared_layers_keys_and_values_are_unused_not_missing():
    rules = by_source(huggingface("gemma3n_text", config=GEMMA3N))
    for i in range(4):
        for name in SHARED:
            rule = rules[f"model.layers.{i}.self_attn.{name}"]
            assert bool(rule.absent) == (i >= 2), (i, name)
            assert rule.unused_by == (("Gemma3nBackbone", "Gemma3nCausalLM") if i >= 2 else ())
    unshared = by_source(huggingface("gemma3n_text", config={**GEMMA3N,
                                                             "num_kv_shared_layers": 0}))
    assert not any(r.unused_by for r in unshared.values())


def test_a_task_model_is_named_under_its_backbone():
    class Gemma3nCausalLM:  # what `model=` reads: the class's name
        pass

    rules = by_source(huggingface("gemma3n_text", config=GEMMA3N, model=Gemma3nCausalLM()))
    assert rules["model.norm.weight"].target == "backbone/language_model/final_normalization/scale"
    assert rules["norm.weight"].target == "backbone/language_model/final_normalization/scale"


def test_without_the_output_scale_its_rule_is_left_out():
    rules = by_source(huggingface("gemma3n_text", config={**GEMMA3N,
                                                          "altup_correct_scale": False}))
    assert "model.layers.0.altup.correct_output_scale" not in rules
    assert "model.layers.0.altup.router_norm.weight" in rules


@pytest.mark.parametrize("missing", ["hidden_size", "head_dim", "num_hidden_layers",
                                     "altup_num_inputs", "laurel_rank",
                                     "hidden_size_per_layer_input"])
def test_a_config_without_sizes_is_refused(missing):
    config = {k: v for k, v in GEMMA3N.items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"Gemma 3n.*`{missing}`.*received None.*Fix:"):
        huggingface("gemma3n_text", config=config)


@pytest.mark.parametrize("key,value,why", [
    ("num_kv_shared_layers", 4, "from 0 to 3"),
    ("num_kv_shared_layers", "2", "from 0 to 3"),
    ("altup_correct_scale", "yes", "needs a bool")])
def test_what_the_set_does_not_cover_is_refused(key, value, why):
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)Gemma 3n.*{why}.*`{key}` = .*Fix:"):
        huggingface("gemma3n_text", config={**GEMMA3N, key: value})


# --- against keras-hub's importer -------------------------------------------------------------

def _backbone(config: dict):
    """keras-hub's backbone of a text config (as tests/helpers/hf_cases.py builds it)."""
    import hf_cases

    return hf_cases.gemma3n_text_backbone(config, "float32")


def _values(model, leave=()) -> dict:
    return {f"{v.path}#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)
            if v.path not in leave}


def _keras_hubs_port(backbone, folder: str, prefix: str) -> list:
    """keras-hub's importer's decoder port (`_port_language_model`) into `backbone` from a
    text-only folder whose entries are named `{prefix}X` (the multimodal ones'
    `model.language_model.X`); returns the Keras paths it found no entry for."""
    from keras_hub.src.utils.transformers import convert_gemma3n
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = set(f.keys())
    lacking = []

    class TextLoader(SafetensorLoader):
        def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):
            name = prefix + hf_weight_key[len("model.language_model."):]
            if name not in names:
                lacking.append(keras_variable.path)
                return
            super().port_weight(keras_variable, name, hook_fn)

    with TextLoader(folder) as loader:
        convert_gemma3n._port_language_model(loader, backbone)
    return lacking


_SHARED_PATHS = sorted(f"text_model/decoder_block_{i}/attention/{name}"
                       for i in (2, 3) for name in ("k_proj/kernel", "v_proj/kernel",
                                                    "k_norm/scale"))


@pytest.mark.parametrize("folder", ["gemma3n-Gemma3nForCausalLM-float32",
                                    "gemma3n-Gemma3nForCausalLM-bfloat16",
                                    "gemma3n-Gemma3nTextModel-float32",
                                    "gemma3n-Gemma3nTextModel-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(folder):
    """transformers' folder restored by objckpt (one call, no rules) == keras-hub's importer's
    port of the decoder, every variable but the shared layers' unused keys and values, which
    neither finds in the folder."""
    pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, folder)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    theirs = _backbone(config)
    lacking = _keras_hubs_port(theirs, path, "model." if "ForCausalLM" in folder else "")
    assert sorted(lacking) == _SHARED_PATHS
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('gemma3n_text')" in str(report)
    assert len(report.restored) == len(ours.weights) - len(_SHARED_PATHS)
    assert _values(ours, _SHARED_PATHS) == _values(theirs, _SHARED_PATHS)


@pytest.mark.parametrize("shared", [0, 2])
@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, shared, task):
    """A random backbone (or its task model) exported with the set -> keras-hub's importer's
    port -> every backbone variable bit-equal; a shared layer's unused keys and values are
    not written."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    config = {**GEMMA3N, "num_kv_shared_layers": shared}
    backbone = _backbone(config)
    rng = np.random.default_rng(shared)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.Gemma3nCausalLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    left = _SHARED_PATHS if shared else []
    assert len(names) == len(backbone.weights) - len(left)
    assert ("model.layers.3.self_attn.k_proj.weight" in names) == (not shared)
    loaded = _backbone(config)
    assert sorted(_keras_hubs_port(loaded, folder, "model.")) == left
    assert _values(loaded, left) == _values(backbone, left)


# --- the multimodal rules (transformers' side: tests/integration/test_hf_transformers.py) --

AUDIO = {"model_type": "gemma3n_audio", "vocab_size": 8, "vocab_offset": 72,
         "input_feat_size": 16, "hidden_size": 16, "rms_norm_eps": 1e-6,
         "gradient_clipping": 1e10, "conf_attention_chunk_size": 4,
         "conf_attention_context_left": 5, "conf_attention_context_right": 0,
         "conf_attention_logit_cap": 50.0, "conf_num_attention_heads": 2,
         "conf_num_hidden_layers": 2, "conf_conv_kernel_size": 3, "conf_reduction_factor": 2,
         "conf_residual_weight": 0.5, "sscp_conv_channel_size": [8, 4],
         "sscp_conv_group_norm_eps": 1e-3, "sscp_conv_kernel_size": [[3, 3], [3, 3]],
         "sscp_conv_stride_size": [[2, 2], [2, 2]]}
MULTIMODAL = {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
              "text_config": {**GEMMA3N, "model_type": "gemma3n_text"}, "audio_config": AUDIO,
              "vision_config": {"model_type": "gemma3n_vision", "hidden_size": 32,
                                "vocab_size": 8, "vocab_offset": 64},
              "vision_soft_tokens_per_image": 4, "audio_soft_tokens_per_image": 4,
              "image_token_id": 60, "audio_token_id": 61, "tie_word_embeddings": True}
# a MobileNetV5 of three stages: an edge residual, inverted residuals with and without their
# depthwise convolutions, attention with and without key/value down-sampling
_TINY_TOWER = [["er_r1_k3_s2_e4_c8"], ["uir_r1_a3_k5_s2_e2_c16", "uir_r1_a0_k0_s1_e2_c16"],
               ["uir_r1_a3_k0_s2_e2_c16", "mqa_r1_k3_h2_v2_s1_d8_c16",
                "mqa_r1_k3_h2_s1_d8_c16"]]


def _multimodal_backbone(config: dict):
    """keras-hub's Gemma3nBackbone of `config` (its importer's reading of it, RoPE's base
    from the full layers' `rope_parameters`), with a tiny vision encoder in place of the
    MobileNetV5-300M its importer always builds."""
    from keras_hub.src.models.mobilenetv5.mobilenetv5_builder import (
        convert_arch_def_to_stackwise)
    from keras_hub.src.utils.transformers import convert_gemma3n

    text = config["text_config"]
    text = dict(text, rope_theta=text["rope_parameters"]["full_attention"]["rope_theta"])
    kwargs = convert_gemma3n.convert_backbone_config({**config, "text_config": text})
    tower = convert_arch_def_to_stackwise(_TINY_TOWER)
    tower.update(stem_size=8, num_features=32, norm_layer="rms_norm", act_layer="gelu",
                 use_msfa=True, layer_scale_init_value=1e-5, msfa_output_resolution=2,
                 image_shape=(32, 32, 3))
    kwargs["vision_encoder_config"] = tower
    return convert_gemma3n.backbone_cls(**kwargs, dtype="float32")


def _keras_hubs_multimodal_port(backbone, folder: str) -> list:
    """keras-hub's importer's ports (`convert_weights`: the vision tower, the decoder, the
    audio tower, the embedders) into `backbone`; the Keras paths it found no entry for."""
    from keras_hub.src.utils.transformers import convert_gemma3n
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = set(f.keys())
    lacking = []

    class Loader(SafetensorLoader):
        def get_tensor(self, hf_weight_key):
            # KeyError for an entry the folder lacks, as from a sharded folder's index: the
            # importer probes for batch norms' `running_mean` and catches KeyError (from one
            # file, safetensors raises its own error, which keras-hub 0.32 does not catch)
            if hf_weight_key not in names:
                raise KeyError(hf_weight_key)
            return super().get_tensor(hf_weight_key)

        def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):
            if hf_weight_key not in names:
                lacking.append(keras_variable.path)
                return
            super().port_weight(keras_variable, hf_weight_key, hook_fn)

    with Loader(folder) as loader:
        convert_gemma3n.convert_weights(backbone, loader, None)
    return lacking


_NO_BIAS = re.compile(r"vision_encoder/_operations/([2-9]|\d\d+)/.*conv/bias$")


def _by_object_path(backbone, *, stem_bias: bool = True) -> dict:
    """{object path: bits} of the backbone's variables the folders feed: all but the
    KV-shared layers' unused keys and values and the vision tower's convolution biases,
    which timm's convolutions (but the stem's, compared when `stem_bias`) lack (keras-hub
    names the audio encoder's and vision tower's layers by a counter, their object paths
    not)."""
    shared = {f"language_model/transformer_layers/{i}/attention/{name}" for i in (2, 3)
              for name in ("k_proj/_kernel", "v_proj/_kernel", "k_norm/scale")}
    stem = "vision_encoder/_operations/1/conv/bias"
    return {path: bits(np.asarray(variable.numpy()))
            for path, variable in objckpt.tree(backbone).items()
            if path not in shared and not _NO_BIAS.match(path)
            and (stem_bias or path != stem)}


def test_the_multimodal_set_by_name_reads_the_300m_tower():
    from objckpt.rules import hf_gemma3n_multimodal

    chosen = huggingface("gemma3n", config=MULTIMODAL)
    assert chosen.name == "huggingface('gemma3n')"
    assert chosen.classes == {"Gemma3nCausalLM": "Gemma3nForConditionalGeneration"}
    assert list(chosen) == list(hf_gemma3n_multimodal.rules(MULTIMODAL))
    rules = by_source(chosen)  # MobileNetV5-300M's tower
    assert rules["model.audio_tower.conformer.1.lconv1d.depthwise_conv1d.weight"].transform == (
        Transpose((2, 0, 1)))
    assert rules["model.language_model.layers.3.laurel.linear_left.weight"].target == (
        "language_model/transformer_layers/3/laurel/linear_left/kernel")
    assert rules["embed_vision.embedding_projection.weight"].target == (
        "embed_vision/embedding_projection/kernel")
    # 84 blocks: stem (1), blocks 2..85, the adapter 86; block 0.0 an edge residual, 2.9
    # (the 18th block) attention with down-sampled keys and values, 3.1 attention without
    timm = "model.vision_tower.timm_model"
    assert rules[f"{timm}.blocks.0.0.conv_exp.weight"].transform == ConvKernel("OIHW", "HWIO")
    assert rules[f"{timm}.blocks.1.0.dw_start.conv.weight"].transform == ConvKernel(
        "OIHW", "HWIO")  # keras-hub's grouped Conv2D
    assert rules[f"{timm}.blocks.2.9.attn.key.down_conv.weight"].transform == ConvKernel(
        "OIHW", "HWOI")  # keras-hub's DepthwiseConv2D
    assert f"{timm}.blocks.1.1.dw_mid.conv.weight" not in rules  # k0: no middle depthwise
    assert rules[f"{timm}.blocks.2.9.attn.key.down_conv.weight"].target == (
        "vision_encoder/operations/19/attn/key_layers/0/kernel")
    assert rules[f"{timm}.blocks.3.1.attn.value.proj.weight"].target == (
        "vision_encoder/operations/48/attn/value_layers/0/kernel")
    assert rules[f"{timm}.msfa.norm.weight"].target == "vision_encoder/operations/86/norm/gamma"
    assert rules[f"{timm}.conv_stem.conv.bias"].unused_by == ()
    assert rules[f"{timm}.blocks.0.0.conv_exp.bias"].unused_by == (
        "Gemma3nBackbone", "Gemma3nCausalLM")
    with pytest.raises(errors.InvalidArgumentError, match="`audio_config`.*Fix:"):
        hf_gemma3n_multimodal.rules({**MULTIMODAL, "audio_config": None})
    with pytest.raises(errors.InvalidArgumentError, match="resnet50.*Fix:"):
        hf_gemma3n_multimodal.rules({**MULTIMODAL, "vision_config": {
            "architecture": "resnet50"}})
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"model_args.*\['channel_multiplier'\].*Fix:"):
        hf_gemma3n_multimodal.rules({**MULTIMODAL, "vision_config": {
            "model_args": {"stem_size": 8, "channel_multiplier": 0.5}}})
    with pytest.raises(errors.InvalidArgumentError, match="'ir_r1_k3_s1_e4_c8'.*Fix:"):
        hf_gemma3n_multimodal.rules(MULTIMODAL, tower=[["ir_r1_k3_s1_e4_c8"]])


@pytest.mark.parametrize("task", [False, True])
def test_multimodal_export_and_restore_agree_with_keras_hubs_importer(tmp_path, task):
    """A random backbone (or its task model) exported with the rules -> keras-hub's
    importer's ports -> every variable a folder holds bit-equal (keras-hub's importer skips
    the stem's bias); restored back by objckpt (strict) into a fresh backbone -> every one
    of them, the stem's bias too."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    from objckpt.rules import hf_gemma3n_multimodal

    backbone = _multimodal_backbone(MULTIMODAL)
    rng = np.random.default_rng(3)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.Gemma3nCausalLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    config = {**MULTIMODAL, "task": "Gemma3nCausalLM" if task else ""}
    folder = config_folder(tmp_path / "hf", MULTIMODAL)
    objckpt.export(model, folder, rules=hf_gemma3n_multimodal.rules(config, tower=_TINY_TOWER))
    expected = _by_object_path(backbone)
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        assert len(list(f.keys())) == len(expected)
    # the decoder (3 AltUp streams), the audio tower (two 22-entry blocks), the embedders,
    # the vision tower (the stem 3; the blocks 4, 9, 5, 7, 10 and 6; the adapter 5)
    assert len(expected) == 99 + 5 + 2 * 22 + 2 * 4 + 3 + (4 + 9 + 5 + 7 + 10 + 6) + 5
    loaded = _multimodal_backbone(MULTIMODAL)
    assert sorted(_keras_hubs_multimodal_port(loaded, folder)) == _SHARED_PATHS
    assert _by_object_path(loaded, stem_bias=False) == _by_object_path(backbone,
                                                                       stem_bias=False)
    fresh = _multimodal_backbone(MULTIMODAL)
    report = objckpt.restore(fresh, folder,
                             rules=hf_gemma3n_multimodal.rules(MULTIMODAL, tower=_TINY_TOWER))
    assert sorted(report.restored) == sorted(expected)
    assert _by_object_path(fresh) == expected


AUDIO_PART = os.path.join(os.path.dirname(FIXTURES), "hf_parts", "gemma3n_audio")


def test_the_audio_tower_transformers_wrote_computes_what_transformers_computes():
    """transformers' own `Gemma3nAudioEncoder` (tests/helpers/make_gemma3n_audio_fixture.py,
    its entries named as the multimodal classes name them) restored by the rules into
    keras-hub's float32 audio encoder: every entry restored, the encodings and their mask
    transformers' (within 1e-4; measured 1.3e-6)."""
    pytest.importorskip("keras_hub")
    from safetensors.numpy import load_file

    from objckpt.rules import hf_gemma3n_multimodal

    with open(os.path.join(AUDIO_PART, "audio_config.json"), encoding="utf-8") as f:
        config = {**MULTIMODAL, "audio_config": {**AUDIO, **json.load(f)}}
    backbone = _multimodal_backbone(config)
    path = os.path.join(AUDIO_PART, "model.safetensors")
    names = set(load_file(path))
    rules = hf_gemma3n_multimodal.rules(config, tower=_TINY_TOWER)
    report = objckpt.restore(backbone, path, rules=rules, strict=False)
    audio = [p for p in report.restored if p.startswith("audio_encoder/")]
    assert len(audio) == len(names) == 5 + 2 * 22 and not report.unexpected
    oracle = load_file(os.path.join(AUDIO_PART, "oracle.safetensors"))
    encodings, mask = backbone.audio_encoder((oracle["input_features"],
                                              oracle["input_features_mask"]))
    np.testing.assert_array_equal(np.asarray(mask), oracle["audio_mask"])
    np.testing.assert_allclose(np.asarray(encodings), oracle["audio_encodings"],
                               rtol=1e-4, atol=1e-4)


def test_the_300m_tower_is_keras_hubs_importers():
    """The rules' MobileNetV5-300M is the one keras-hub's importer builds, block for block."""
    pytest.importorskip("keras_hub")
    from keras_hub.src.utils.transformers import convert_gemma3n

    from objckpt.rules import hf_gemma3n_vision

    ours = hf_gemma3n_vision.ARCHITECTURES["mobilenetv5_300m_enc"]
    assert [list(stage) for stage in ours] == convert_gemma3n.MOBILENETV5_300M_ENC_ARCH_DEF
    assert len(hf_gemma3n_vision.blocks(ours)) == 84


MULTIMODAL_FOLDER = os.path.join(FIXTURES, "gemma3n_multimodal-Gemma3nForConditionalGeneration-"
                                 "float32")


def _folder_config() -> dict:
    with open(os.path.join(MULTIMODAL_FOLDER, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_vision_rules_read_timms_decoded_blocks():
    """A folder transformers wrote with a tower timm built from `model_args`: its decoded
    `block_args` read back into the block strings they came from (make_hf_fixtures.py's
    GEMMA3N_TOWER), the rules those strings give; blocks the rules do not cover refused."""
    from objckpt.rules import hf_gemma3n_multimodal
    from objckpt.rules.hf_gemma3n_vision import block_strings

    config = _folder_config()
    decoded = config["vision_config"]["model_args"]["block_args"]
    assert decoded[2][1] == {"block_type": "mqa", "out_chs": 8, "stride": 1, "act_layer": None,
                             "dw_kernel_size": 3, "num_heads": 2, "key_dim": 4,
                             "value_dim": 4, "kv_stride": 2, "noskip": False}
    assert block_strings(decoded) == _FOLDER_TOWER
    assert list(huggingface(MULTIMODAL_FOLDER)) == list(
        hf_gemma3n_multimodal.rules(config, tower=_FOLDER_TOWER))
    assert list(hf_gemma3n_multimodal.rules(config)) != list(
        hf_gemma3n_multimodal.rules(MULTIMODAL))  # not the 300M tower
    end = [[{**decoded[1][0], "dw_kernel_size_end": 3}]]
    with pytest.raises(errors.InvalidArgumentError, match="'uir_r1_a3_k5_p3_s2_e2_c8'.*Fix:"):
        hf_gemma3n_multimodal.rules({**config, "vision_config": {
            "model_args": {"block_args": end}}})
    for bad in ([[{"block_type": "ir", "out_chs": 8}]], [[{"block_type": "mqa"}]], "er"):
        with pytest.raises(errors.InvalidArgumentError, match="decoded blocks.*Fix:"):
            hf_gemma3n_multimodal.rules({**config, "vision_config": {
                "model_args": {"block_args": bad}}})


# make_hf_fixtures.py's GEMMA3N_TOWER
_FOLDER_TOWER = [["er_r1_k3_s2_e2_c8"], ["uir_r1_a3_k5_s2_e2_c8", "uir_r1_a0_k0_s1_e2_c8"],
                 ["uir_r1_a3_k0_s2_e2_c8", "mqa_r1_k3_h2_v2_s1_d4_c8",
                  "mqa_r1_k3_h2_s1_d4_c8", "uir_r1_a0_k0_s1_e2_c8"]]


def test_a_folder_transformers_wrote_restores_as_keras_hubs_importer_ports_it():
    """The multimodal folder transformers wrote restored by objckpt (one call) == keras-hub's
    importer's ports of it (its decoder, vision and audio towers, embedders) into the same
    backbone, every variable both read (the importer leaves the stem's bias out); the
    KV-shared layers' keys and values in neither."""
    pytest.importorskip("keras_hub")
    import hf_cases

    config = _folder_config()
    theirs = hf_cases.gemma3n_backbone(config, "float32")
    assert sorted(_keras_hubs_multimodal_port(theirs, MULTIMODAL_FOLDER)) == _SHARED_PATHS
    ours = hf_cases.gemma3n_backbone(config, "float32")
    report = objckpt.restore(ours, MULTIMODAL_FOLDER)
    assert "huggingface('gemma3n')" in str(report)
    assert len(report.restored) == len(_by_object_path(ours)) == 208
    assert _by_object_path(ours, stem_bias=False) == _by_object_path(theirs, stem_bias=False)
    stem = "vision_encoder/_operations/1/conv/bias"
    assert _by_object_path(ours)[stem] != _by_object_path(theirs)[stem]  # zeros in theirs
