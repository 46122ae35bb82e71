"""The Hugging Face rule set for Gemma 4's text decoder (`gemma4_text`): the set itself, and
keras-hub's own importer as a second oracle (what it reads from transformers' folders, what
it reads from objckpt's exports).

transformers' side (its folders restored, objckpt's exports read back by it) is
tests/integration/test_hf_transformers.py; here the configs are dicts (the set needs no
keras-hub) and keras-hub's `Backbone.from_preset(folder)` is the oracle where it is installed.
keras-hub 0.32 reads the full-attention layers' sizes from the published configs' keys
(`global_head_dim`, `num_global_key_value_heads`), not from the `per_layer_config` that
transformers 5 writes: its folders here get a config in the published form.
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

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0}}
# the published form: the full layer's sizes as `global_head_dim` (and key heads)
GEMMA4 = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
          "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
          "head_dim": 8, "global_head_dim": 16, "sliding_window": 64,
          "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
          "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64,
          "rope_parameters": ROPE, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
          "torch_dtype": "float32"}
KEQV = {**GEMMA4, "hidden_size_per_layer_input": 0, "attention_k_eq_v": True,
        "num_global_key_value_heads": 2}
# four layers, the last two reusing the first two's keys and values; experts beside each
MOE = {**GEMMA4, "num_hidden_layers": 4,
       "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2,
       "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
       "moe_intermediate_size": 8}
CONFIGS = {"gemma4": GEMMA4, "gemma4_keqv": KEQV, "gemma4_moe": MOE}


def _published(config: dict) -> dict:
    """transformers 5's config in the published form (keras-hub reads that one)."""
    out = {k: v for k, v in config.items() if k != "per_layer_config"}
    full = config["per_layer_config"][str(config["layer_types"].index("full_attention"))]
    out["global_head_dim"] = full["head_dim"]
    out["num_key_value_heads"] = config["num_key_value_heads"]
    if config.get("attention_k_eq_v"):
        out["num_global_key_value_heads"] = full["num_key_value_heads"]
    return out


# --- the set itself (no keras-hub) -----------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    chosen = huggingface(config_folder(tmp_path, GEMMA4))
    assert "gemma4_text" in objckpt.rules.supported()
    assert chosen.name == "huggingface('gemma4_text')"
    assert list(chosen) == list(huggingface("gemma4_text", config=GEMMA4))


def test_full_attention_layers_get_their_own_head_width():
    rules = by_source(huggingface("gemma4_text", config=GEMMA4))
    # sliding layer 0: heads 8 wide; (heads * head_dim, hidden) -> (heads, hidden, head_dim)
    assert rules["model.layers.0.self_attn.q_proj.weight"].transform == Chain(
        Reshape((32, 16), (4, 8, 16)), Transpose((0, 2, 1)))
    assert rules["model.layers.0.self_attn.k_proj.weight"].transform == Chain(
        Reshape((8, 16), (1, 8, 16)), Transpose((0, 2, 1)))
    # full layer 2: heads 16 wide (global_head_dim)
    assert rules["model.layers.2.self_attn.q_proj.weight"].transform == Chain(
        Reshape((64, 16), (4, 16, 16)), Transpose((0, 2, 1)))
    assert rules["model.layers.2.self_attn.o_proj.weight"].transform == Chain(
        Reshape((16, 64), (16, 4, 16)), Transpose((1, 2, 0)))
    assert rules["model.layers.2.self_attn.v_proj.weight"].target == (
        "decoder_block_2/attention/value/kernel")
    assert rules["model.layers.1.layer_scalar"].transform == Reshape((1,), ())
    assert rules["model.layers.1.per_layer_projection.weight"].target == (
        "decoder_block_1/per_layer_up_proj/kernel")
    assert rules["model.per_layer_model_projection.weight"].transform == Transpose()
    assert "layers.2.self_attn.k_norm.weight" in rules  # Gemma4TextModel saves it bare
    assert rules["lm_head.weight"].head == "Gemma4ForCausalLM (tied to the token embedding)"
    torch_q = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    keras_q = rules["model.layers.2.self_attn.q_proj.weight"].transform(torch_q)
    assert keras_q.shape == (4, 16, 16) and keras_q[2, 5, 3] == torch_q[2 * 16 + 3, 5]


def test_keys_as_values_leave_the_full_layer_without_v_proj():
    rules = by_source(huggingface("gemma4_text", config=KEQV))
    assert "model.layers.2.self_attn.v_proj.weight" not in rules
    assert "model.layers.1.self_attn.v_proj.weight" in rules
    assert rules["model.layers.2.self_attn.k_proj.weight"].transform == Chain(
        Reshape((32, 16), (2, 16, 16)), Transpose((0, 2, 1)))
    assert "model.layers.0.per_layer_input_gate.weight" not in rules
    assert "model.embed_tokens_per_layer.weight" not in rules


def test_transformers_5s_per_layer_config_gives_the_same_set():
    """transformers 5 writes the full layers' sizes in `per_layer_config`, by index."""
    for config in CONFIGS.values():
        written = {k: v for k, v in config.items()
                   if k not in ("global_head_dim", "num_global_key_value_heads")}
        sizes = {"head_dim": 16}
        if config.get("attention_k_eq_v"):
            sizes["num_key_value_heads"] = 2
        written["per_layer_config"] = {str(i): sizes for i, kind in
                                       enumerate(config["layer_types"]) if kind == "full_attention"}
        assert list(huggingface("gemma4_text", config=written)) == list(
            huggingface("gemma4_text", config=config))


def test_shared_layers_have_no_keys_and_experts_are_cut_from_one_bank():
    rules = by_source(huggingface("gemma4_text", config=MOE))
    for i in (2, 3):  # the shared layers: no k/v projections, no key norm
        for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
            assert f"model.layers.{i}.self_attn.{name}" not in rules
        assert f"model.layers.{i}.self_attn.q_norm.weight" in rules
    assert rules["model.layers.1.self_attn.v_proj.weight"].transform == Chain(
        Reshape((16, 16), (1, 16, 16)), Transpose((0, 2, 1)))
    assert rules["model.layers.3.router.proj.weight"].target == (
        "decoder_block_3/moe_router/proj/kernel")
    assert rules["model.layers.0.pre_feedforward_layernorm_2.weight"].target == (
        "decoder_block_0/pre_ffw_norm_moe/scale")
    gate_up = [r for r in huggingface("gemma4_text", config=MOE)
               if r.source == "model.layers.1.experts.gate_up_proj"]
    assert [r.target for r in gate_up] == ["decoder_block_1/moe_expert_bank/gate_proj",
                                           "decoder_block_1/moe_expert_bank/up_proj"]
    torch_bank = np.arange(4 * 16 * 16, dtype=np.float32).reshape(4, 16, 16)  # (E, 2I, H)
    gate, up = (r.transform(torch_bank) for r in gate_up)
    assert gate.shape == up.shape == (4, 16, 8)  # (E, H, I)
    assert gate[3, 5, 2] == torch_bank[3, 2, 5] and up[3, 5, 2] == torch_bank[3, 8 + 2, 5]
    down = rules["model.layers.1.experts.down_proj"].transform(torch_bank[:, :, :8])
    assert down.shape == (4, 8, 16) and down[1, 7, 3] == torch_bank[1, 3, 7]


def test_the_last_layer_is_full_attention_as_transformers_makes_it():
    """transformers turns a last sliding layer into a full one (heads global_head_dim wide),
    and makes every sixth layer full where the config lists no types."""
    config = {**GEMMA4, "layer_types": ["sliding_attention"] * 3}
    assert list(huggingface("gemma4_text", config=config)) == list(
        huggingface("gemma4_text", config=GEMMA4))
    config = {k: v for k, v in GEMMA4.items() if k != "layer_types"}
    assert list(huggingface("gemma4_text", config=config)) == list(
        huggingface("gemma4_text", config=GEMMA4))
    rules = by_source(huggingface("gemma4_text", config={**config, "num_hidden_layers": 7}))
    q_heads = [rules[f"model.layers.{i}.self_attn.q_proj.weight"].transform for i in range(7)]
    wide = Chain(Reshape((64, 16), (4, 16, 16)), Transpose((0, 2, 1)))
    narrow = Chain(Reshape((32, 16), (4, 8, 16)), Transpose((0, 2, 1)))
    assert q_heads == [narrow] * 5 + [wide] * 2


@pytest.mark.parametrize("config,missing", [
    (GEMMA4, "head_dim"), (GEMMA4, "hidden_size"), (GEMMA4, "num_hidden_layers"),
    (MOE, "num_experts"), (MOE, "moe_intermediate_size")])
def test_a_config_without_sizes_is_refused(config, missing):
    config = {k: v for k, v in config.items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{missing}`.*received None.*Fix:"):
        huggingface("gemma4_text", config=config)


@pytest.mark.parametrize("key,value,why", [
    ("num_kv_shared_layers", 3, "from 0 to 2"),
    ("num_kv_shared_layers", "2", "from 0 to 2"),
    ("layer_types", ["full_attention"], "needs 3 layer types"),
    ("per_layer_config", {"2": 16}, "layer 2's sizes as a dict")])
def test_what_the_set_does_not_cover_is_refused(key, value, why):
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)Gemma 4.*{why}.*`{key}` = .*Fix:"):
        huggingface("gemma4_text", config={**GEMMA4, key: value})


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> dict:
    return {v.path + f"#{i}": bits(v.numpy()) for i, v in enumerate(model.weights)}


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_gemma4

    return convert_gemma4.backbone_cls(**convert_gemma4.convert_backbone_config(config))


@pytest.mark.parametrize("folder", ["gemma4-Gemma4ForCausalLM-float32",
                                    "gemma4-Gemma4TextModel-bfloat16",
                                    "gemma4_keqv-Gemma4ForCausalLM-bfloat16",
                                    "gemma4_keqv-Gemma4TextModel-float32",
                                    "gemma4_moe-Gemma4ForCausalLM-float32",
                                    "gemma4_moe-Gemma4TextModel-bfloat16"])
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, folder):
    """transformers' folder restored by objckpt (one call, no rules) == keras-hub's
    `from_preset(folder)`, every variable (its config in the published form, which
    keras-hub reads)."""
    keras_hub = pytest.importorskip("keras_hub")
    with open(os.path.join(FIXTURES, folder, "config.json"), encoding="utf-8") as f:
        config = _published(json.load(f))
    path = config_folder(tmp_path / "hf", config)
    shutil.copy(os.path.join(FIXTURES, folder, "model.safetensors"), path)
    theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    ours = _backbone(config)
    report = objckpt.restore(ours, path)
    assert "huggingface('gemma4_text')" in str(report)
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
    # one entry a variable, but each layer's gate and up banks joined into `gate_up_proj`
    joined = config["num_hidden_layers"] if config.get("enable_moe_block") else 0
    assert len(names) == len(backbone.weights) - joined
    assert ("model.layers.2.self_attn.v_proj.weight" in names) == (name == "gemma4")
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    assert _values(loaded) == _values(backbone)
