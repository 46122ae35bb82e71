"""The Hugging Face rule set for BART (encoder-decoder): the set itself, its position-table
transform, and keras-hub's own importer as a second oracle both ways.

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface
from objckpt.rules.hf_bart import SkipRows

from support import bits, by_source

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
BART = {
    "architectures": ["BartForConditionalGeneration"], "model_type": "bart", "vocab_size": 64,
    "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
    "max_position_embeddings": 32, "dropout": 0.1, "torch_dtype": "float32",
    # keras-hub 0.32's importer reads it (transformers 5 no longer writes it)
    "num_hidden_layers": 2,
}


def test_the_folder_chooses_the_set(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BART), encoding="utf-8")
    chosen = huggingface(str(tmp_path))
    assert "bart" in objckpt.rules.supported()
    assert chosen.name == "huggingface('bart')"
    assert list(chosen) == list(huggingface("bart", config=BART))


def test_the_layouts_follow_keras_hubs_importer():
    rules = by_source(huggingface("bart", config=BART))
    assert rules["model.shared.weight"].target == "token_embedding/embeddings"
    cross = rules["model.decoder.layers.{i}.encoder_attn.k_proj.weight"]
    assert cross.target == "transformer_decoder_layer_{i}/cross_attention/key/kernel"
    assert cross.transform == Chain(Transpose(), Reshape((16, 16), (16, 2, 8)))
    assert rules["model.encoder.layers.{i}.self_attn.q_proj.bias"].transform == Reshape(
        (16,), (2, 8))
    assert rules["model.encoder.layers.{i}.self_attn.out_proj.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (2, 8, 16)))
    assert rules["encoder.layers.{i}.fc1.weight"].target == (  # BartModel's bare names
        "transformer_encoder_layer_{i}/feedforward_intermediate_dense/kernel")
    assert rules["model.decoder.embed_positions.weight"].transform == SkipRows(2)
    assert rules["final_logits_bias"].head == "BartForConditionalGeneration"
    assert "tied" in rules["model.encoder.embed_tokens.weight"].head
    assert "tied" in rules["lm_head.weight"].head
    torch_q = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    keras_q = cross.transform(torch_q)
    assert keras_q[5, 1, 3] == torch_q[1 * 8 + 3, 5]


def test_position_tables_drop_two_rows_and_export_writes_zeros_there():
    table = np.arange(34 * 3, dtype=np.float32).reshape(34, 3)
    ours = SkipRows(2)(table)
    assert ours.tobytes() == table[2:].tobytes()
    assert SkipRows(2).output_shape((34, 3)) == (32, 3)
    back = SkipRows(2).inverse()
    assert back.output_shape((32, 3)) == (34, 3)
    written = back(ours)
    assert written[2:].tobytes() == table[2:].tobytes() and not written[:2].any()
    import tensorflow as tf

    assert np.asarray(back(tf.constant(ours))).tobytes() == written.tobytes()
    assert back.inverse() == SkipRows(2)


@pytest.mark.parametrize("drop", ["d_model", "encoder_attention_heads", "encoder_layers"])
def test_a_config_without_sizes_is_refused(drop):
    config = {k: v for k, v in BART.items() if k not in (drop, "num_hidden_layers")}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{drop}`.*received None.*Fix:"):
        huggingface("bart", config=config)


@pytest.mark.parametrize("key,value", [("decoder_layers", 3), ("decoder_ffn_dim", 64),
                                       ("decoder_attention_heads", 4)])
def test_a_decoder_sized_unlike_its_encoder_is_refused(key, value):
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)`{key}` equal to .*received {value}.*one size.*Fix:"):
        huggingface("bart", config={**BART, key: value})


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_bart

    return convert_bart.backbone_cls(**convert_bart.convert_backbone_config(config))


@pytest.mark.parametrize("folder", ["bart-BartForConditionalGeneration-float32",
                                    "bart-BartModel-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, folder):
    """transformers' folder restored by objckpt (one call) == keras-hub's
    `from_preset(folder)` (given the `num_hidden_layers` it needs), every variable."""
    keras_hub = pytest.importorskip("keras_hub")
    path = str(tmp_path / folder)
    shutil.copytree(os.path.join(FIXTURES, folder), path)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["num_hidden_layers"] = config["encoder_layers"]
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('bart')" in str(report)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("task", [False, True])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, task):
    """A random backbone (or its BartSeq2SeqLM) exported with the set -> keras-hub's
    `from_preset(folder)` -> every variable bit-equal; no head entry written."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    backbone = _backbone(BART)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    model = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None) \
        if task else backbone
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BART), encoding="utf-8")
    objckpt.export(model, str(folder), rules=huggingface(str(folder)))
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        names = sorted(f.keys())
        positions = f.get_tensor("model.encoder.embed_positions.weight")
    assert len(names) == len(backbone.weights)
    assert all(name.startswith("model.") for name in names)
    assert positions.shape == (34, 16) and not positions[:2].any()
    loaded = keras_hub.models.Backbone.from_preset(str(folder))
    assert _values(loaded) == _values(backbone)
