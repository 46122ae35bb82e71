"""The Hugging Face rule set for BLIP-2 (a ViT tower, a Q-Former, a projection, and an OPT or a
Flan-T5 language model): the set itself, the bad configs it refuses, Flan-T5's tied and
untied heads, other depths than the fixtures', and keras-hub's own importer as a second
oracle.

transformers' side (its folders restored and compared with its outputs on an image and text,
objckpt's exports read back by it) is tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Split, Transpose, huggingface

from support import bits, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
OPT_FOLDER = os.path.join(FIXTURES, "blip2_opt-Blip2ForConditionalGeneration-float32")
T5_FOLDER = os.path.join(FIXTURES, "blip2_t5-Blip2ForConditionalGeneration-float32")


def _config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        return json.load(f)


OPT, T5 = _config(OPT_FOLDER), _config(T5_FOLDER)


def _rules(rules, source: str) -> list:
    return [rule for rule in rules if rule.source == source]


def _one(rules, source: str):
    found = _rules(rules, source)
    assert len(found) == 1, (source, found)
    return found[0]


# --- the set itself (no keras-hub) ------------------------------------------------------------

@pytest.mark.parametrize("config", [OPT, T5], ids=["opt", "t5"])
def test_the_folder_chooses_the_set_by_model_type(tmp_path, config):
    chosen = huggingface(config_folder(tmp_path, config))
    assert "blip-2" in objckpt.rules.supported()
    assert chosen.name == "huggingface('blip-2')"
    assert list(chosen) == list(huggingface("blip-2", config=config))
    assert chosen.classes == {"BLIP2CausalLM": "Blip2ForConditionalGeneration",
                              "BLIP2Seq2SeqLM": "Blip2ForConditionalGeneration"}


def test_the_vision_tower_splits_the_fused_qkv_by_head():
    rules = huggingface("blip-2", config=OPT)
    block = "vision_encoder/operations/2/encoder_layers/{i}/mha"
    qkv = _rules(rules, "vision_model.encoder.layers.{i}.self_attn.qkv.weight")
    assert [r.target for r in qkv] == [f"{block}/{n}_dense/kernel"
                                       for n in ("query", "key", "value")]
    assert [r.transform for r in qkv] == [
        Chain(Split(0, parts=3, index=k), Transpose(), Reshape((24, 24), (24, 2, 12)))
        for k in range(3)]
    bias = _rules(rules, "vision_model.encoder.layers.{i}.self_attn.qkv.bias")
    assert bias[2].transform == Chain(Split(0, parts=3, index=2), Reshape((24,), (2, 12)))
    assert _one(rules, "vision_model.embeddings.patch_embedding.weight").transform == \
        ConvKernel("OIHW", "HWIO")
    assert _one(rules, "vision_model.post_layernorm.weight").target == (
        "vision_encoder/operations/2/layer_norm/gamma")


def test_the_qformer_cross_attends_every_second_layer_to_the_vision_width():
    rules = huggingface("blip-2", config=OPT)
    sources = {rule.source for rule in rules}
    first = "qformer.encoder.layer.0.crossattention.attention"
    # queries of the Q-Former's width 8 (2 heads of 4), keys and values of the tower's 24
    assert _one(rules, f"{first}.key.weight").transform == Chain(
        Transpose(), Reshape((24, 8), (24, 2, 4)))
    assert _one(rules, f"{first}.query.weight").transform == Chain(
        Transpose(), Reshape((8, 8), (8, 2, 4)))
    assert _one(rules, f"{first}.key.weight").target == (
        "qformer/operations/4/cross_attention/attention/key_dense/kernel")
    assert "qformer.encoder.layer.1.crossattention.attention.key.weight" not in sources
    assert _one(rules, "qformer.encoder.layer.1.output_query.dense.weight").target == (
        "qformer/operations/5/output_dense/kernel")
    assert _one(rules, "query_tokens").target == "qformer/query_tokens_layer/query_tokens"
    projection = _one(rules, "language_projection.weight")
    assert (projection.target, projection.transform) == (
        "language_model/language_projection/kernel", Transpose())


def test_opts_layers_and_its_tied_head():
    rules = huggingface("blip-2", config=OPT)
    layer = "language_model.model.decoder.layers.1"
    assert _one(rules, f"{layer}.self_attn.q_proj.weight").target == (
        "language_model/operations/13/self_attention_layer/query_dense/kernel")
    assert _one(rules, f"{layer}.self_attn.out_proj.weight").transform == Chain(
        Transpose(), Reshape((16, 16), (2, 8, 16)))
    assert _one(rules, "language_model.model.decoder.embed_tokens.weight").target == (
        "embeddings_layer/token_embedding/embeddings")
    head = _one(rules, "language_model.lm_head.weight")
    assert head.head.endswith("(tied to the token embedding)")
    task = huggingface("blip-2", config={**OPT, "task": "BLIP2CausalLM"})
    assert _one(task, f"{layer}.fc1.weight").target == (
        "backbone/language_model/operations/13/feedforward_intermediate_dense/kernel")


def test_t5s_stacks_and_its_head_by_the_config():
    rules = huggingface("blip-2", config=T5)
    sources = {rule.source for rule in rules}
    lm = "language_model"
    assert _one(rules, f"{lm}.encoder.block.1.layer.0.SelfAttention.q.weight").target == (
        "language_model/operations/14/self_attention/query_projector/kernel")
    assert _one(rules, f"{lm}.encoder.final_layer_norm.weight").target == (
        "language_model/operations/16/weight")
    assert _one(rules, f"{lm}.decoder.block.0.layer.1.EncDecAttention.o.weight").target == (
        "language_model/operations/20/cross_attention/output_projector/kernel")
    assert _one(rules, f"{lm}.decoder.final_layer_norm.weight").target == (
        "language_model/operations/22/weight")
    assert f"{lm}.decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight" in \
        sources
    assert f"{lm}.decoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in \
        sources
    # what transformers 5 writes (tied): `shared` feeds the task model's lm_head too
    assert [r.target for r in _rules(rules, f"{lm}.shared.weight")] == [
        "language_model/operations/5/embeddings"]
    task = huggingface("blip-2", config={**T5, "task": "BLIP2Seq2SeqLM"})
    assert [(r.target, r.transform) for r in _rules(task, f"{lm}.shared.weight")] == [
        ("backbone/language_model/operations/5/embeddings", None),
        ("lm_head/kernel", Transpose())]
    assert f"{lm}.lm_head.weight" not in {r.source for r in task}
    # the Hub's Flan-T5 folders (untied): their own lm_head.weight, a head
    untied = copy.deepcopy(T5)
    untied["text_config"]["tie_word_embeddings"] = False
    head = _one(huggingface("blip-2", config={**untied, "task": "BLIP2Seq2SeqLM"}),
                f"{lm}.lm_head.weight")
    assert (head.target, head.transform, bool(head.head)) == ("lm_head/kernel", Transpose(),
                                                              True)


def test_a_pruned_sub_config_takes_transformers_defaults():
    """The Hub's BLIP-2 configs hold only `model_type` in `vision_config` and
    `qformer_config`: transformers' (and keras-hub's) defaults size the set."""
    config = {**OPT, "vision_config": {"model_type": "blip_2_vision_model"},
              "qformer_config": {"model_type": "blip_2_qformer"}}
    rules = huggingface("blip-2", config=config)
    assert _rules(rules, "vision_model.encoder.layers.{i}.self_attn.qkv.weight")[0].transform \
        == Chain(Split(0, parts=3, index=0), Transpose(), Reshape((1408, 1408), (1408, 16, 88)))
    sources = {rule.source for rule in rules}
    assert "qformer.encoder.layer.11.output_query.dense.weight" in sources  # 12 layers
    assert "qformer.encoder.layer.10.crossattention.attention.key.weight" in sources
    assert "qformer.encoder.layer.11.crossattention.attention.key.weight" not in sources


def _text(config: dict, **changed) -> dict:
    out = copy.deepcopy(config)
    out["text_config"].update(changed)
    return out


@pytest.mark.parametrize("config,named", [
    ({k: v for k, v in OPT.items() if k != "text_config"}, "`text_config`"),
    ({k: v for k, v in OPT.items() if k != "num_query_tokens"}, "`num_query_tokens`"),
    (_text(OPT, model_type="llama"), "'llama'"),
    (_text(OPT, do_layer_norm_before=False), "`text_config.do_layer_norm_before`"),
    (_text(OPT, word_embed_proj_dim=8), "`text_config.word_embed_proj_dim`"),
    (_text(OPT, tie_word_embeddings=False), "`text_config.tie_word_embeddings`"),
    (_text(OPT, num_attention_heads=3), "`text_config.num_attention_heads`"),
    (_text(T5, num_decoder_layers=3), "`text_config.num_decoder_layers`"),
    (_text(T5, feed_forward_proj="relu"), "`text_config.feed_forward_proj`"),
    (_text(T5, relative_attention_num_buckets=64),
     "`text_config.relative_attention_num_buckets`"),
    ({**OPT, "vision_config": {"hidden_size": 24, "num_attention_heads": 5}},
     "`vision_config.num_attention_heads`"),
    ({**OPT, "qformer_config": []}, "`qformer_config`"),
])
def test_a_config_keras_hub_cannot_hold_is_refused(config, named):
    with pytest.raises(errors.InvalidArgumentError) as caught:
        huggingface("blip-2", config=config)
    assert named in str(caught.value)
    assert "BLIP-2" in str(caught.value) and "Fix:" in str(caught.value)


# --- with keras-hub ---------------------------------------------------------------------------

def _values(model) -> list:
    """Every variable's bits, in order (keras-hub leaves some T5 layers Keras's numbered
    names, which differ between two models of one session)."""
    return [bits(v.numpy()) for v in model.weights]


def _backbone(config: dict):
    from keras_hub.src.utils.transformers import convert_blip2

    return convert_blip2.backbone_cls(**convert_blip2.convert_backbone_config(config))


def _randomised(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    return model


def test_restore_is_bit_equal_to_keras_hubs_importer_of_transformers_folder():
    """OPT: keras-hub's `from_preset` of the folder transformers wrote, and objckpt's restore
    of it (one call, no rules): every variable bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    ours = _backbone(OPT)
    report = objckpt.restore(ours, OPT_FOLDER)
    assert "huggingface('blip-2')" in str(report)
    theirs = keras_hub.models.Backbone.from_preset(OPT_FOLDER, dtype="float32")
    assert type(theirs) is type(ours)
    assert _values(ours) == _values(theirs)


@pytest.mark.parametrize("config", [OPT, T5], ids=["opt", "t5"])
def test_export_is_what_keras_hubs_importer_reads(tmp_path, config):
    """A random task model exported with the set (Flan-T5's untied, as the Hub's folders
    are: keras-hub's importer reads its `lm_head.weight`) -> keras-hub's `from_preset` ->
    every backbone variable bit-equal; one entry per variable."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors import safe_open

    t5 = config["text_config"]["model_type"] == "t5"
    if t5:
        config = _text(config, tie_word_embeddings=False)
    backbone = _backbone(config)
    cls = keras_hub.models.BLIP2Seq2SeqLM if t5 else keras_hub.models.BLIP2CausalLM
    model = _randomised(cls(backbone=backbone, preprocessor=None))
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        names = sorted(f.keys())
    # the tower's q/k/v kernels and biases: one fused `qkv` weight and bias per layer
    expected = len(backbone.trainable_weights) - 4 * config["vision_config"]["num_hidden_layers"]
    assert len(names) == expected and ("language_model.lm_head.weight" in names) == t5
    loaded = keras_hub.models.Backbone.from_preset(folder)
    assert type(loaded) is type(backbone)
    if t5:  # keras-hub's importer builds and fills the lm_head of its backbone's T5
        assert bits(loaded.language_model.lm_head.kernel.numpy()) == bits(
            backbone.language_model.lm_head.kernel.numpy())
        def without_head(model):
            return [bits(v.numpy()) for v in model.weights if "lm_head" not in v.path]

        assert without_head(loaded) == without_head(backbone)
    else:
        assert _values(loaded) == _values(backbone)


def test_an_untied_flan_t5_folder_fills_the_task_models_head(tmp_path):
    """A folder with its own `language_model.lm_head.weight` and `tie_word_embeddings` false
    (the Hub's Flan-T5 BLIP-2s; transformers 5 keeps such a head where it differs from
    `shared`): restored into BLIP2Seq2SeqLM's lm_head, set aside in a backbone, and exported
    back byte for byte."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors.numpy import load_file, save_file

    folder = str(tmp_path / "untied")
    shutil.copytree(T5_FOLDER, folder)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    head = np.random.default_rng(1).normal(size=tensors["language_model.shared.weight"].shape)
    tensors["language_model.lm_head.weight"] = head.astype(np.float32)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    config = _text(T5, tie_word_embeddings=False)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    report = objckpt.restore(_backbone(config), folder)
    assert any(line.startswith("language_model.lm_head.weight:") for line in report.skipped)
    model = keras_hub.models.BLIP2Seq2SeqLM(backbone=_backbone(config), preprocessor=None)
    objckpt.restore(model, folder)
    kernel = model.backbone.language_model.lm_head.kernel.numpy()
    assert bits(kernel) == bits(head.astype(np.float32).T)
    out = str(tmp_path / "out")
    objckpt.export(model, out, rules=huggingface(folder))
    written = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(written) == sorted(tensors)
    assert all(bits(written[k]) == bits(v) for k, v in tensors.items())


def test_a_tied_config_refuses_a_folders_own_head_and_changes_nothing(tmp_path):
    """transformers 5's T5 config (tied) with a `lm_head.weight` in the folder: transformers
    would read that head; the set has no rule that could, so a strict restore names it."""
    keras_hub = pytest.importorskip("keras_hub")
    from safetensors.numpy import load_file, save_file

    folder = str(tmp_path / "odd")
    shutil.copytree(T5_FOLDER, folder)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    tensors["language_model.lm_head.weight"] = tensors["language_model.shared.weight"] * 2
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    model = keras_hub.models.BLIP2Seq2SeqLM(backbone=_backbone(T5), preprocessor=None)
    before = _values(model)
    with pytest.raises(errors.StructureMismatchError, match="language_model.lm_head.weight"):
        objckpt.restore(model, folder)
    assert _values(model) == before


@pytest.mark.parametrize("text", [{"model_type": "opt", "num_hidden_layers": 3},
                                  {"model_type": "t5", "num_layers": 1,
                                   "num_decoder_layers": 1},
                                  {"model_type": "t5", "num_layers": 3,
                                   "num_decoder_layers": 3}],
                         ids=["opt-3", "t5-1", "t5-3"])
def test_other_depths_round_trip_through_an_export(tmp_path, text):
    """Depths other than the fixtures' (the rules name keras-hub's layers by their operation
    numbers, which the depth moves): a random task model exported, the export restored
    strictly into a fresh one, every variable bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    base = T5 if text["model_type"] == "t5" else OPT
    config = _text(base, **text)
    config["qformer_config"] = {**config["qformer_config"], "num_hidden_layers": 3}
    config["vision_config"] = {**config["vision_config"], "num_hidden_layers": 1}
    cls = keras_hub.models.BLIP2Seq2SeqLM if text["model_type"] == "t5" else \
        keras_hub.models.BLIP2CausalLM
    model = _randomised(cls(backbone=_backbone(config), preprocessor=None), seed=2)
    if text["model_type"] == "t5":  # tied, as transformers 5 writes T5: one tensor for both
        t5 = model.backbone.language_model
        t5.lm_head.kernel.assign(np.transpose(t5.token_embedding.embeddings.numpy()))
    folder = config_folder(tmp_path / "hf", config)
    objckpt.export(model, folder, rules=huggingface(folder))
    fresh = cls(backbone=_backbone(config), preprocessor=None)
    report = objckpt.restore(fresh, folder)
    assert not report.missing and not report.unexpected
    assert _values(fresh) == _values(model)


def test_a_tied_t5_exports_only_when_its_head_is_its_embedding(tmp_path):
    """transformers 5 writes one tensor for Flan-T5's embedding and head: a task model whose
    two differ is refused, naming both, and nothing is written."""
    keras_hub = pytest.importorskip("keras_hub")
    model = _randomised(keras_hub.models.BLIP2Seq2SeqLM(backbone=_backbone(T5),
                                                        preprocessor=None))
    folder = config_folder(tmp_path / "hf", T5)
    with pytest.raises(errors.InvalidArgumentError) as caught:
        objckpt.export(model, folder, rules=huggingface(folder))
    assert "language_model.shared.weight" in str(caught.value)
    assert "lm_head/kernel" in str(caught.value) and "Fix:" in str(caught.value)
    assert not os.path.exists(os.path.join(folder, "model.safetensors"))
