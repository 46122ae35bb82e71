"""Hugging Face rule sets for Llama, Mistral and Gemma, against keras-hub.

keras-hub's own Hugging Face importers (`XBackbone.from_preset(folder)`) and exporters
(`export_backbone`) are the oracle: objckpt's export must be what the importer reads, and
what keras-hub's exporter writes must restore through the same rule set. Tiny random
configs; the keras-hub tests run where keras-hub is installed (the Keras 3 session), the
rest (the sets themselves, the choice by `config.json`) everywhere, without keras-hub.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Transpose, huggingface

from support import bits

HIDDEN, HEADS, KV_HEADS, VOCAB, LAYERS, INTERMEDIATE = 16, 4, 2, 64, 2, 32

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
    "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
    "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
MISTRAL = {
    **LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "sliding_window": 512, "rms_norm_eps": 1e-05,
}
# head_dim * heads != hidden_size: keras-hub's importers handle it, its exporters do not
# (their q/o reshapes and Mistral's exported head_dim assume the square case).
MISTRAL_WIDE = {**MISTRAL, "head_dim": 8}
GEMMA = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": VOCAB,
    "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE // 2,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": 1,
    "head_dim": 4, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 128,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
GEMMA2 = {
    **GEMMA, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
    "head_dim": 8, "query_pre_attn_scalar": 8, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0, "sliding_window": 64,
}
CONFIGS = {"llama": LLAMA, "llama-tied": {**LLAMA, "tie_word_embeddings": True},
           "mistral": MISTRAL, "mistral-wide": MISTRAL_WIDE, "gemma": GEMMA, "gemma2": GEMMA2}


# --- the sets themselves (no keras-hub) -------------------------------------------------------

def _folder(tmp_path, config: dict):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(tmp_path)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_folder_chooses_the_set_by_model_type(tmp_path, case):
    config = CONFIGS[case]
    chosen = huggingface(_folder(tmp_path, config))
    assert list(chosen) == list(huggingface(config["model_type"], config=config))
    sources = {rule.source for rule in chosen if not rule.head}  # heads: set aside or restored
    assert "model.layers.{i}.self_attn.q_proj.weight" in sources
    assert ("lm_head.weight" in sources) == (not config["tie_word_embeddings"])
    assert ("model.layers.{i}.pre_feedforward_layernorm.weight" in sources) == (
        case == "gemma2")
    assert {"gemma", "gemma2", "llama", "mistral"} <= set(objckpt.rules.supported())


def test_attention_reshapes_follow_the_config():
    """Llama/Mistral: torch (heads*head_dim, hidden) -> Keras (hidden, heads, head_dim);
    Mistral's `head_dim` may differ from hidden/heads; Gemma's kernels are (heads, hidden,
    head_dim)."""
    by_target = {r.target.rsplit("/", 2)[-2]: r for r in huggingface("mistral",
                                                                     config=MISTRAL_WIDE)
                 if "self_attention/" in r.target}
    assert by_target["query"].transform == Chain(Transpose(), Reshape((16, 32), (16, 4, 8)))
    assert by_target["key"].transform == Chain(Transpose(), Reshape((16, 16), (16, 2, 8)))
    assert by_target["attention_output"].transform == Chain(
        Transpose(), Reshape((32, 16), (4, 8, 16)))
    llama = {r.target.rsplit("/", 2)[-2]: r for r in huggingface("llama", config=LLAMA)}
    assert llama["query"].transform == Chain(Transpose(), Reshape((16, 16), (16, 4, 4)))
    gemma = {r.target.rsplit("/", 2)[-2]: r for r in huggingface("gemma2", config=GEMMA2)}
    torch_q = np.arange(4 * 8 * 16, dtype=np.float32).reshape(32, 16)
    keras_q = gemma["query"].transform(torch_q)
    assert keras_q.shape == (4, 16, 8)
    # head h, input j, dim d of the Keras kernel is torch row h*8+d, column j
    assert keras_q[2, 5, 3] == torch_q[2 * 8 + 3, 5]
    assert bits(gemma["query"].transform.inverse()(keras_q)) == bits(torch_q)
    torch_o = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    keras_o = gemma["attention_output"].transform(torch_o)
    assert keras_o.shape == (4, 8, 16) and keras_o[1, 6, 9] == torch_o[9, 1 * 8 + 6]


def test_the_name_chooses_gemma2_without_a_model_type_in_the_config():
    config = {k: v for k, v in GEMMA2.items() if k != "model_type"}
    targets = {rule.target for rule in huggingface("gemma2", config=config)}
    assert "decoder_block_{i}/post_ffw_norm/scale" in targets
    assert "decoder_block_{i}/post_ffw_norm/scale" not in {
        rule.target for rule in huggingface("gemma", config=config)}


@pytest.mark.parametrize("missing", ["hidden_size", "num_attention_heads"])
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma"])
def test_a_config_without_sizes_is_refused(name, missing):
    config = {k: v for k, v in CONFIGS[name].items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{missing}`.*Fix:"):
        huggingface(name, config=config)


# --- against keras-hub --------------------------------------------------------------------------

def _keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    return keras_hub


def _backbone(case: str, seed: int = 0):
    """A tiny keras-hub backbone for the config, every variable random (norms too); for
    Mistral the values are float16 numbers (keras-hub's importer rounds through float16)."""
    keras_hub = _keras_hub()
    config = CONFIGS[case]
    if case.startswith("llama"):
        model = keras_hub.models.Llama3Backbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS,
            num_key_value_heads=KV_HEADS, hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
            tie_word_embeddings=config["tie_word_embeddings"])
    elif case.startswith("mistral"):
        model = keras_hub.models.MistralBackbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS,
            num_key_value_heads=KV_HEADS, hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
            head_dim=config.get("head_dim"), sliding_window=512, layer_norm_epsilon=1e-05)
    else:
        gemma2 = case == "gemma2"
        model = keras_hub.models.GemmaBackbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS,
            num_key_value_heads=1, hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
            head_dim=config["head_dim"], **(dict(
                query_head_dim_normalize=True, use_post_ffw_norm=True,
                use_post_attention_norm=True, final_logit_soft_cap=30.0,
                attention_logit_soft_cap=50.0, sliding_window_size=64,
                use_sliding_window_attention=True) if gemma2 else {}))
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = rng.normal(0, 0.3, variable.shape).astype(np.float32)
        if case.startswith("mistral"):
            value = value.astype(np.float16).astype(np.float32)
        variable.assign(value)
    return model


def _inputs():
    tokens = np.array([[1, 5, 9, 33, 63, 2], [7, 7, 0, 12, 40, 41]], dtype="int32")
    return {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}


def _outputs(model) -> dict:
    """The sequence output and, with an output embedding, the logits (tied or not)."""
    hidden = model(_inputs())
    logits = model.token_embedding(hidden, reverse=True)
    return {"hidden": np.asarray(hidden), "logits": np.asarray(logits)}


def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_export_is_what_keras_hubs_importer_reads(tmp_path, case):
    """objckpt.export with the set, beside a config.json as transformers writes it ->
    keras-hub's own `from_preset(folder)` (its Hugging Face importer) -> every variable
    bit-equal, outputs equal."""
    keras_hub = _keras_hub()
    model = _backbone(case)
    folder = _folder(tmp_path / "hf", CONFIGS[case])
    objckpt.export(model, folder, rules=huggingface(folder))
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(model)
    assert _values(loaded) == _values(model)
    for key, value in _outputs(model).items():
        np.testing.assert_array_equal(_outputs(loaded)[key], value, err_msg=key)


def _reference_names(case: str, model, include_lm_head: bool) -> dict:
    from keras_hub.src.utils.transformers.export import hf_exporter

    weights = hf_exporter.MODEL_EXPORTERS[type(model).__name__](
        model, include_lm_head=include_lm_head)
    return {name: bits(np.asarray(value)) for name, value in weights.items()}


@pytest.mark.parametrize("case", ["llama", "llama-tied", "mistral", "gemma"])
def test_names_and_bytes_equal_keras_hubs_exporter(tmp_path, case):
    """Tensor by tensor, objckpt's export holds what keras-hub's exporter maps (names,
    shapes, dtypes, bytes), with `lm_head.weight` where the embedding is untied (keras-hub
    writes it only with include_lm_head=True). A tied embedding is written once, as
    transformers saves tied weights (keras-hub's include_lm_head=True repeats it)."""
    _keras_hub()
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    model = _backbone(case, seed=1)
    written = objckpt.export(model, tmp_path / "model.safetensors",
                             rules=huggingface(case.split("-")[0], config=CONFIGS[case]))
    ours = {name: bits(value) for name, value in safetensors_numpy.load_file(written).items()}
    tied = CONFIGS[case]["tie_word_embeddings"]
    assert ours == _reference_names(case, model, include_lm_head=not tied)
    assert ("lm_head.weight" in ours) == (not tied)


@pytest.mark.parametrize("case", ["llama", "mistral", "gemma"])
def test_keras_hubs_export_restores_through_the_set(tmp_path, case):
    """keras-hub's own exporter writes a Hugging Face folder -> objckpt.restore(fresh,
    folder, rules=huggingface(folder)) -> bit-equal variables, equal outputs."""
    _keras_hub()
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    model = _backbone(case, seed=2)
    folder = tmp_path / "hf"
    export_backbone(model, str(folder), include_lm_head=True)
    fresh = _backbone(case, seed=3)
    report = objckpt.restore(fresh, str(folder), rules=huggingface(str(folder)))
    assert len(report.restored) == len(model.weights)
    assert _values(fresh) == _values(model)
    for key, value in _outputs(model).items():
        np.testing.assert_array_equal(_outputs(fresh)[key], value, err_msg=key)


def test_keras_hubs_mistral_export_without_lm_head_is_incomplete(tmp_path):
    """keras-hub's Mistral export by default leaves `lm_head.weight` out; the rule set says
    so at restore (strict: the output embedding is missing) and changes nothing."""
    _keras_hub()
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    model = _backbone("mistral", seed=4)
    folder = tmp_path / "hf"
    export_backbone(model, str(folder))
    fresh = _backbone("mistral", seed=5)
    before = _values(fresh)
    with pytest.raises(errors.StructureMismatchError, match="reverse_embeddings"):
        objckpt.restore(fresh, str(folder), rules=huggingface(str(folder)))
    assert _values(fresh) == before


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_round_trip_is_exact(tmp_path, case):
    """Keras -> safetensors (the set's inverse transforms) -> Keras (the set): bit-exact."""
    model = _backbone(case, seed=6)
    rules = huggingface(case.split("-")[0], config=CONFIGS[case])
    written = objckpt.export(model, tmp_path / "model.safetensors", rules=rules)
    fresh = _backbone(case, seed=7)
    assert _values(fresh) != _values(model)
    objckpt.restore(fresh, written, rules=rules)
    assert _values(fresh) == _values(model)


def test_a_tied_llama_export_with_lm_head_sets_it_aside(tmp_path):
    """keras-hub's Llama export with include_lm_head=True repeats a tied embedding as
    `lm_head.weight`; the tied set has no variable for it: a strict restore sets it aside as
    the tied head of LlamaForCausalLM (listed under skipped) and restores the rest exactly."""
    _keras_hub()
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    model = _backbone("llama-tied", seed=9)
    folder = str(tmp_path / "hf")
    export_backbone(model, folder, include_lm_head=True)
    fresh = _backbone("llama-tied", seed=10)
    report = objckpt.restore(fresh, folder, rules=huggingface(folder))
    assert tuple(report.unexpected) == ()
    assert [s for s in report.skipped if s.startswith("lm_head.weight")] == [
        "lm_head.weight: head of LlamaForCausalLM (tied to the token embedding), set aside "
        "(no keras-hub model has a variable for it)"]
    assert _values(fresh) == _values(model)


def test_keras_hubs_own_mistral_round_trip(tmp_path):
    """keras-hub's Mistral export read back by keras-hub's Mistral importer. keras-hub 0.32
    leaves out the `lm_head.weight` its importer requires: recorded as an xfail with the
    importer's message (objckpt's export of the same backbone loads, above)."""
    keras_hub = _keras_hub()
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    model = _backbone("mistral", seed=8)
    export_backbone(model, str(tmp_path / "hf"))
    try:
        loaded = keras_hub.models.Backbone.from_preset(str(tmp_path / "hf"))
    except Exception as err:  # the safetensors library's own error type
        if "lm_head.weight" not in str(err):
            raise
        pytest.xfail(f"keras-hub's Mistral importer on keras-hub's Mistral export: {err}")
    assert _values(loaded) == _values(model)
