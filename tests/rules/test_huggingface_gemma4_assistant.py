"""The Hugging Face rule set for Gemma 4's assistant (`gemma4_assistant`, the draft model of
Gemma 4's multi-token prediction): the set itself, and keras-hub's own importer as a second
oracle (what it reads from transformers' folder, what it reads from objckpt's exports).

transformers' side (its folders restored, one draft step compared, objckpt's exports read
back by it) is tests/integration/test_hf_transformers.py; here the configs are dicts (the set
needs no keras-hub) and keras-hub's `Gemma4AssistantCausalLM.from_preset(folder)` is the
oracle where it is installed.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
FOLDER = "gemma4_assistant-Gemma4AssistantForCausalLM-{}"
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0}}
TEXT = {"model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 16,
        "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 8, "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"], "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
        "rope_parameters": ROPE, "rms_norm_eps": 1e-06, "pad_token_id": 0}
ASSISTANT = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
             "text_config": TEXT, "backbone_hidden_size": 24, "use_ordered_embeddings": False,
             "num_centroids": 4, "centroid_intermediate_top_k": 2, "tie_word_embeddings": True,
             "torch_dtype": "float32"}
ORDERED = {**ASSISTANT, "use_ordered_embeddings": True}


# --- the set itself (no keras-hub) -----------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, ASSISTANT))
    assert "gemma4_assistant" in objckpt.rules.supported()
    assert chosen.name == "huggingface('gemma4_assistant')"
    assert list(chosen) == list(huggingface("gemma4_assistant", config=ASSISTANT))


def test_every_layer_reads_the_targets_keys_and_values():
    rules = by_source(huggingface("gemma4_assistant", config=ASSISTANT))
    for i in (0, 1):
        for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
            assert f"model.layers.{i}.self_attn.{name}" not in rules
        assert rules[f"model.layers.{i}.self_attn.q_proj.weight"].transform == Chain(
            Reshape((32, 16), (4, 8, 16)), Transpose((0, 2, 1)))
    assert rules["model.norm.weight"].target == "final_normalization/scale"
    # whatever the config says of its shared layers (transformers makes them all shared)
    config = {**ASSISTANT, "text_config": {**TEXT, "num_kv_shared_layers": 0}}
    assert list(huggingface("gemma4_assistant", config=config)) == list(
        huggingface("gemma4_assistant", config=ASSISTANT))


def test_the_projections_are_the_task_models_heads():
    rules = by_source(huggingface("gemma4_assistant", config=ASSISTANT))
    pre = rules["pre_projection.weight"]
    assert (pre.target, pre.transform, pre.head) == (
        "pre_projection/kernel", Transpose(), "Gemma4AssistantForCausalLM")
    assert rules["post_projection.weight"].target == "post_projection/kernel"
    assert rules["lm_head.weight"].head == (
        "Gemma4AssistantForCausalLM (tied to the token embedding)")
    assert "masked_embedding.centroids.weight" not in rules
    ordered = by_source(huggingface("gemma4_assistant", config=ORDERED))
    assert ordered["masked_embedding.centroids.weight"].transform == Transpose()
    assert ordered["masked_embedding.token_ordering"].target == "token_ordering"
    assert ordered["masked_embedding.token_ordering"].transform is None


@pytest.mark.parametrize("config,missing", [
    (ASSISTANT, "text_config"), (ASSISTANT, "backbone_hidden_size"),
    (ORDERED, "num_centroids")])
def test_a_config_without_sizes_is_refused(config, missing):
    config = {k: v for k, v in config.items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)Gemma 4 assistant.*`{missing}`.*received None.*Fix:"):
        huggingface("gemma4_assistant", config=config)


def test_a_text_config_without_sizes_is_refused():
    config = {**ASSISTANT, "text_config": {k: v for k, v in TEXT.items() if k != "head_dim"}}
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)Gemma 4 assistant.*`head_dim`.*received None.*Fix:"):
        huggingface("gemma4_assistant", config=config)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    """Each variable's bits by path (the task model's own name, numbered by Keras per
    session, left out) and place."""
    return {re.sub(r"^gemma4_assistant_causal_lm(_[0-9]+)?/", "", v.path) + f"#{i}":
            bits(v.numpy()) for i, v in enumerate(model.weights)}


def _task(config: dict):
    import keras_hub
    from keras_hub.src.utils.transformers import convert_gemma4_assistant as convert

    backbone = convert.backbone_cls(**convert.convert_backbone_config(config))
    return keras_hub.models.Gemma4AssistantCausalLM(
        backbone=backbone, preprocessor=None, **convert.convert_task_config(config))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(dtype):
    """transformers' folder restored by objckpt into the task model (one call, no rules) ==
    keras-hub's `Gemma4AssistantCausalLM.from_preset(folder)`, every variable."""
    keras_hub = pytest.importorskip("keras_hub")
    folder = os.path.join(FIXTURES, FOLDER.format(dtype))
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    theirs = keras_hub.models.Gemma4AssistantCausalLM.from_preset(
        folder, preprocessor=None, dtype="float32")
    ours = _task(config)
    report = objckpt.restore(ours, folder)
    assert "huggingface('gemma4_assistant')" in str(report)
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("config", [ASSISTANT, ORDERED], ids=["plain", "ordered"])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, config):
    """A random task model exported with the set -> keras-hub's `from_preset(folder)` ->
    every variable bit-equal (the ordered embeddings' centroids and token order too)."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    model = _task(config)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    if config["use_ordered_embeddings"]:  # token ids, as the file holds them
        model.token_ordering.assign(rng.permutation(64).astype(np.float32))
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    assert len(names) == len(model.weights)
    assert ("masked_embedding.token_ordering" in names) == config["use_ordered_embeddings"]
    loaded = keras_hub.models.Gemma4AssistantCausalLM.from_preset(folder, preprocessor=None)
    assert _values(loaded) == _values(model)


def test_int64_token_order_needs_the_lossy_cast_and_is_then_exact(tmp_path):
    """transformers writes the token order as int64 ids; keras-hub holds float32: a restore
    names the cast and changes nothing, with cast="lossy" the ids arrive exactly."""
    pytest.importorskip("keras_hub")
    from safetensors.numpy import load_file, save_file

    source = _task(ORDERED)
    rng = np.random.default_rng(1)
    for variable in source.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    folder = config_folder(tmp_path / "hf", ORDERED)
    objckpt.export(source, folder, rules=huggingface(folder))
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    order = rng.permutation(64)
    tensors["masked_embedding.token_ordering"] = order.astype(np.int64)
    save_file(tensors, path)
    model = _task(ORDERED)
    before = _values(model)
    with pytest.raises(errors.ObjckptError, match=r"(?s)int64.*float32.*Fix:.*cast="):
        objckpt.restore(model, folder)
    assert _values(model) == before
    report = objckpt.restore(model, folder, cast="lossy")
    assert report.cast == {"token_ordering": "int64 -> float32"}
    assert np.array_equal(model.token_ordering.numpy(), order.astype(np.float32))
    assert np.array_equal(model.pre_projection.kernel.numpy(),
                          source.pre_projection.kernel.numpy())
