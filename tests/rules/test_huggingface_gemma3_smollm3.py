"""Hugging Face rule sets for Gemma 3's text decoder and SmolLM3: the sets themselves, and
keras-hub's own importer as a second oracle (what it reads from transformers' folders, what
it reads from objckpt's exports).

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the sets need no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` is the oracle where it is installed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
DECODER = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 64, "torch_dtype": "float32",
}
GEMMA3 = {**DECODER, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
          "num_key_value_heads": 1, "head_dim": 8, "query_pre_attn_scalar": 8,
          "sliding_window": 64, "tie_word_embeddings": True}
SMOLLM3 = {**DECODER, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
           "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
           "attention_dropout": 0.0, "no_rope_layers": [1, 0],
           "layer_types": ["full_attention", "full_attention"],
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
CONFIGS = {"gemma3_text": GEMMA3, "smollm3": SMOLLM3}
CONVERTERS = {"gemma3_text": "convert_gemma3", "smollm3": "convert_smollm3"}
TASKS = {"gemma3_text": "Gemma3CausalLM", "smollm3": "SmolLM3CausalLM"}


class SmolLM3CausalLM:  # what a set is remade for: the class name
    pass


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
    assert name in objckpt.rules.supported()
    assert chosen.name == f"huggingface({name!r})"
    assert list(chosen) == list(huggingface(name, config=config))


def test_gemma3_is_gemma2s_layer_with_query_and_key_norms():
    rules = by_source(huggingface("gemma3_text", config=GEMMA3))
    source = "model.layers.{i}.self_attn"
    # (heads * head_dim, hidden) -> (heads, hidden, head_dim), head_dim from the config
    assert rules[f"{source}.q_proj.weight"].transform == Chain(
        Reshape((32, 16), (4, 8, 16)), Transpose((0, 2, 1)))
    assert rules[f"{source}.k_proj.weight"].transform == Chain(
        Reshape((8, 16), (1, 8, 16)), Transpose((0, 2, 1)))
    assert rules[f"{source}.q_norm.weight"].target == "decoder_block_{i}/attention/query_norm/scale"
    assert rules[f"{source}.k_norm.weight"].target == "decoder_block_{i}/attention/key_norm/scale"
    assert rules["model.layers.{i}.pre_feedforward_layernorm.weight"].target == (
        "decoder_block_{i}/pre_ffw_norm/scale")
    assert rules["model.layers.{i}.post_attention_layernorm.weight"].target == (
        "decoder_block_{i}/post_attention_norm/scale")
    # Gemma3TextModel saves the decoder bare; the heads name the Gemma 3 classes
    assert "layers.{i}.self_attn.k_norm.weight" in rules
    assert rules["lm_head.weight"].head == "Gemma3ForCausalLM (tied to the token embedding)"
    assert rules["score.weight"].head == "Gemma3TextForSequenceClassification"
    torch_q = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    keras_q = rules[f"{source}.q_proj.weight"].transform(torch_q)
    assert keras_q.shape == (4, 16, 8) and keras_q[2, 5, 3] == torch_q[2 * 8 + 3, 5]


def test_smollm3_targets_each_layers_output_projection_by_object_path():
    """keras-hub names every layer's o_proj `o_proj/kernel`: the set names the backbone's
    operation (decoder layer i is operation 3 + i), under `backbone/` in the task model."""
    backbone = huggingface("smollm3", config=SMOLLM3)
    task = huggingface("smollm3", config=SMOLLM3, model=SmolLM3CausalLM())
    rules = by_source(backbone)
    assert rules["model.layers.1.self_attn.o_proj.weight"].target == (
        "operations/4/self_attn/o_proj/kernel")
    assert rules["model.layers.{i}.self_attn.q_proj.weight"].transform == Transpose()
    assert rules["model.layers.0.self_attn.o_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (4, 4, 16)))
    assert backbone.export_name("_operations/3/self_attn/o_proj/_kernel")[0] == (
        "model.layers.0.self_attn.o_proj.weight")
    assert backbone.export_name("backbone/_operations/3/self_attn/o_proj/_kernel") is None
    assert task.export_name("backbone/_operations/4/self_attn/o_proj/_kernel")[0] == (
        "model.layers.1.self_attn.o_proj.weight")
    frequencies = rules["model.layers.1.self_attn.rotary_emb.inv_freq"]
    assert "computes them" in frequencies.absent
    assert set(frequencies.unused_by) == {"SmolLM3Backbone", "SmolLM3CausalLM"}
    # SmolLM3ForQuestionAnswering saves the decoder under `transformer.`
    assert "transformer.layers.1.self_attn.o_proj.weight" in rules
    assert "SmolLM3ForQuestionAnswering" in rules["qa_outputs.weight"].head


@pytest.mark.parametrize("name,missing", [
    ("gemma3_text", "head_dim"), ("gemma3_text", "hidden_size"),
    ("smollm3", "num_hidden_layers"), ("smollm3", "num_attention_heads")])
def test_a_config_without_sizes_is_refused(name, missing):
    config = {k: v for k, v in CONFIGS[name].items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{missing}`.*received None.*Fix:"):
        huggingface(name, config=config)


@pytest.mark.parametrize("key,value,why", [
    ("tie_word_embeddings", False, "no output embedding of its own"),
    ("attention_bias", True, "reads no biases"),
    ("mlp_bias", True, "reads no biases"),
    ("head_dim", 8, "builds no other")])
def test_smollm3_refuses_what_keras_hubs_backbone_cannot_hold(key, value, why):
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)`{key}`.*received {value!r}: .*{why}.*Fix:"):
        huggingface("smollm3", config={**SMOLLM3, key: value})


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _backbone(name: str, config: dict):
    import importlib

    converter = importlib.import_module(
        "keras_hub.src.utils.transformers." + CONVERTERS[name])
    return converter.backbone_cls(**converter.convert_backbone_config(config))


@pytest.mark.parametrize("folder", ["gemma3-Gemma3ForCausalLM-float32",
                                    "gemma3-Gemma3TextModel-bfloat16",
                                    "smollm3-SmolLM3ForCausalLM-float32",
                                    "smollm3-SmolLM3ForSequenceClassification-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(folder):
    """transformers' folder restored by objckpt (one call, no rules) == keras-hub's
    `from_preset(folder)`, every variable (the RoPE frequencies computed alike). keras-hub's
    SmolLM3 importer reads only `model.` names, so not SmolLM3Model's bare folders (objckpt
    reads both)."""
    keras_hub = pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, folder)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ours = _backbone(config["model_type"], config)
    report = objckpt.restore(ours, path)
    assert f"huggingface({config['model_type']!r})" in str(report)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, name, task):
    """A random backbone (or its task model) exported with the set -> keras-hub's
    `from_preset(folder)` -> every backbone variable bit-equal; no RoPE frequencies written."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    config = CONFIGS[name]
    backbone = _backbone(name, config)
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = getattr(keras_hub.models, TASKS[name])(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert not [n for n in names if "inv_freq" in n]
    assert len(names) == len(backbone.trainable_weights)
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
