"""Hugging Face rule sets for the vision encoders keras-hub reads (DeiT, ...): the sets
themselves, and keras-hub's own importer as a second oracle.

transformers' side (its folders restored into keras-hub's backbone and task model, outputs
compared, objckpt's exports read back by it) is tests/integration/test_hf_transformers.py;
here the sets are made from config dicts (no keras-hub needed) and keras-hub's
`from_preset(folder)` reads the same folders where it can.
"""

from __future__ import annotations

import json
import os

import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface
from objckpt.rules.core import NOWHERE

import hf_cases
from support import bits

safetensors_numpy = pytest.importorskip("safetensors.numpy")

DEIT = {"architectures": ["DeiTForImageClassification"], "model_type": "deit",
        "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "image_size": 16, "patch_size": 4, "num_channels": 3,
        "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "id2label": {"0": "A", "1": "B", "2": "C"}}
DINOV2 = {"architectures": ["Dinov2Model"], "model_type": "dinov2", "hidden_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_ratio": 2, "image_size": 16,
          "patch_size": 4, "layerscale_value": 1.0, "use_swiglu_ffn": False,
          "hidden_dropout_prob": 0.0, "drop_path_rate": 0.0}
DINOV2_REGISTERS = {**DINOV2, "architectures": ["Dinov2WithRegistersModel"],
                    "model_type": "dinov2_with_registers", "num_register_tokens": 2}
CONFIGS = {"deit": DEIT, "dinov2": DINOV2, "dinov2_with_registers": DINOV2_REGISTERS}


def _folder(path, config: dict) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def _by_source(rules) -> dict:
    return {rule.source: rule for rule in rules}


def _cases(case: str, form: str = ""):
    return [c for c in hf_cases.CASES if c.case == case and c.form == form]


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(_folder(tmp_path, config))
    assert name in objckpt.rules.supported()
    assert chosen.name == f"huggingface({name!r})"
    assert list(chosen) == list(huggingface(name, config=config))


@pytest.mark.parametrize("missing", ["hidden_size", "num_attention_heads"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_without_sizes_is_refused(name, missing):
    config = {k: v for k, v in CONFIGS[name].items() if k != missing}
    with pytest.raises(errors.InvalidArgumentError, match=rf"(?s)`{missing}`.*Fix:"):
        huggingface(name, config=config)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_heads_that_do_not_divide_the_hidden_size_are_refused(name):
    config = {**CONFIGS[name], "num_attention_heads": 3}
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)divisible by num_attention_heads.*16 and 3.*Fix:"):
        huggingface(name, config=config)


def test_deit_reads_vits_encoder_with_its_own_mlp_and_tokens():
    rules = _by_source(huggingface("deit", config=DEIT))
    block = "operations/2/encoder_layers/{i}"
    query = rules["deit.encoder.layer.{i}.attention.attention.query.weight"]
    assert (query.target, query.transform) == (f"{block}/mha/query_dense/kernel", Chain(
        Transpose(), Reshape((16, 16), (16, 2, 8))))
    assert rules["deit.encoder.layer.{i}.attention.output.dense.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (2, 8, 16)))
    assert rules["deit.encoder.layer.{i}.intermediate.dense.weight"].target == (
        f"{block}/mlp/dense/kernel")
    assert rules["deit.encoder.layer.{i}.output.dense.bias"].target == (
        f"{block}/output_layer/dense/bias")
    assert rules["deit.embeddings.distillation_token"].target == (
        "operations/1/distillation_token")
    position = rules["deit.embeddings.position_embeddings"]  # (1, patches + 2, hidden) as is
    assert (position.target, position.transform) == ("operations/1/position_embedding", None)
    assert rules["deit.embeddings.patch_embeddings.projection.weight"].transform == (
        ConvKernel("OIHW", "HWIO"))
    # transformers 5's names of the same entries, and DeiTModel's bare ones
    assert rules["deit.layers.{i}.attention.q_proj.weight"].target == query.target
    assert rules["layers.{i}.mlp.fc2.weight"].target == f"{block}/output_layer/dense/kernel"
    assert rules["encoder.layer.{i}.attention.attention.key.bias"].target == (
        f"{block}/mha/key_dense/bias")


def test_deit_heads_by_class():
    rules = _by_source(huggingface("deit", config=DEIT))
    assert rules["classifier.weight"].target == "output_dense/kernel"
    assert rules["classifier.weight"].head == "DeiTForImageClassification"
    for entry in ("cls_classifier.weight", "distillation_classifier.bias"):
        assert rules[entry].target.startswith(NOWHERE)
        assert rules[entry].head == "DeiTForImageClassificationWithTeacher"
    assert rules["pooler.dense.weight"].head == "DeiTModel"
    assert rules["deit.embeddings.mask_token"].head == "DeiTForMaskedImageModeling"
    # the task model's set targets its backbone under `backbone/`
    for_task = huggingface("deit", config={**DEIT, "task": "DeiTImageClassifier"})
    assert _by_source(for_task)["deit.layernorm.weight"].target == (
        "backbone/operations/2/layer_norm/gamma")


@pytest.mark.parametrize("case", _cases("deit", hf_cases.NEW_FORM), ids=lambda c: c.id)
def test_a_folders_key_form_is_recognised(case):
    assert huggingface(case.folder("float32")).key_form == "transformers 5"
    assert huggingface(case.original.folder("float32")).key_form == "original"


# --- keras-hub's importer as a second oracle ---------------------------------------------------

def _values(model) -> dict:
    return {v.path: bits(v.numpy()) for v in model.weights}


def _keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3"):
        pytest.skip("keras-hub's models need Keras 3")
    return keras_hub


@pytest.mark.parametrize("case", [c for c in _cases("deit") if c.cls != "DeiTModel"],
                         ids=lambda c: c.id)
def test_deit_backbone_is_bit_equal_to_keras_hubs_import(case):
    """keras-hub's `Backbone.from_preset(folder)` and objckpt's restore give the same bits
    (DeiTModel's folder, whose names have no `deit.` prefix, keras-hub cannot read)."""
    keras_hub = _keras_hub()
    folder = case.folder("float32")
    theirs = keras_hub.models.Backbone.from_preset(folder)
    ours = hf_cases.backbone(case)
    objckpt.restore(ours, folder, rules=huggingface(folder))
    assert type(ours) is type(theirs)
    assert _values(ours) == _values(theirs)


def test_deit_export_is_what_keras_hubs_importer_reads(tmp_path):
    """The model restored from DeiTModel's folder (bare names, which keras-hub's importer
    cannot read), exported: `deit.` names, which it reads, every variable bit-equal."""
    keras_hub = _keras_hub()
    case = _cases("deit")[0]
    assert case.cls == "DeiTModel"
    with pytest.raises(Exception, match="deit.embeddings"):
        keras_hub.models.Backbone.from_preset(case.folder("float32"))
    ours = hf_cases.backbone(case)
    report = objckpt.restore(ours, case.folder("float32"))
    assert len(report.restored) == len(ours.weights)
    out = str(tmp_path / "out")
    os.makedirs(out)
    objckpt.export(ours, out, rules=huggingface(case.folder("float32")))
    theirs = keras_hub.models.Backbone.from_preset(out)
    assert _values(theirs) == _values(ours)


# --- DINOv2 ---------------------------------------------------------------------------------

def test_dinov2_layer_scales_tokens_and_the_tied_position_embeddings():
    rules = huggingface("dinov2", config=DINOV2)
    by_source = _by_source(rules)
    assert by_source["encoder.layer.{i}.layer_scale1.lambda1"].target == (
        "encoder/layers/{i}/layer_scale1/lambda1")
    assert by_source["dinov2.embeddings.mask_token"].target == "embeddings/mask_token"
    assert by_source["embeddings.register_tokens"].target == "embeddings/register_tokens"
    # one entry feeds both: keras-hub computes with the interpolated copy
    assert sorted(r.target for r in rules if r.source == "embeddings.position_embeddings") == [
        "embeddings/interpolated_position_embeddings", "embeddings/position_embeddings"]
    assert by_source["encoder.layer.{i}.attention.attention.value.weight"].transform == Chain(
        Transpose(), Reshape((16, 16), (16, 2, 8)))
    assert by_source["encoder.layer.{i}.attention.o_proj.weight"].target == (
        "encoder/layers/{i}/attention/attention/output_dense/kernel")
    # the classifier on the class token and the patches' mean: no keras-hub variable
    assert by_source["classifier.weight"].target.startswith(NOWHERE)
    assert by_source["classifier.weight"].head == (
        "Dinov2ForImageClassification, Dinov2WithRegistersForImageClassification")


def test_dinov2_swiglu_halves_join_into_keras_hubs_one_kernel():
    by_source = _by_source(huggingface("dinov2", config=DINOV2))
    fused = by_source["encoder.layer.{i}.mlp.weights_in.weight"]
    assert (fused.target, fused.transform) == ("encoder/layers/{i}/mlp/weights_in/kernel",
                                               Transpose())
    for index, half in enumerate(("gate_proj", "up_proj")):
        rule = by_source[f"encoder.layer.{{i}}.mlp.{half}.weight"]
        assert rule.target == fused.target
        assert rule.concat.index == index and rule.concat.count == 2
    assert by_source["encoder.layer.{i}.mlp.down_proj.bias"].target == (
        "encoder/layers/{i}/mlp/weights_out/bias")


def test_dinov2_prefix_is_the_model_types():
    plain = _by_source(huggingface("dinov2", config=DINOV2))
    registers = _by_source(huggingface("dinov2_with_registers", config=DINOV2_REGISTERS))
    assert "dinov2.layernorm.weight" in plain and "dinov2_with_registers.layernorm.weight" \
        not in plain
    assert "dinov2_with_registers.layernorm.weight" in registers
    assert huggingface("dinov2_with_registers", config=DINOV2_REGISTERS).name == (
        "huggingface('dinov2_with_registers')")


def test_dinov2_refuses_a_model_type_it_does_not_cover():
    from objckpt.rules import hf_dinov2

    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)dinov2, dinov2_with_registers.*'dinov3_vit'.*Fix:"):
        hf_dinov2.rules({**DINOV2, "model_type": "dinov3_vit"})


_DINOV2_MODELS = [c for c in hf_cases.CASES
                  if c.case.startswith("dinov2") and c.cls.endswith("Model")]


@pytest.mark.parametrize("case", _DINOV2_MODELS, ids=lambda c: c.id)
def test_dinov2_backbone_is_bit_equal_to_keras_hubs_import(case):
    """keras-hub's `Backbone.from_preset` of the original-form folder and objckpt's restore
    of the folder (either form: transformers 5's SwiGLU halves joined) give the same bits,
    the interpolated position embeddings included."""
    keras_hub = _keras_hub()
    theirs = keras_hub.models.Backbone.from_preset(case.original.folder("float32"))
    ours = hf_cases.backbone(case)
    report = objckpt.restore(ours, case.folder("float32"))
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)


def test_dinov2_export_is_what_keras_hubs_importer_reads(tmp_path):
    """Dinov2ForImageClassification's folder (names under `dinov2.`) restored and
    exported (bare names): keras-hub's import of the folder and of the export, and
    objckpt's restore, all bit-equal."""
    keras_hub = _keras_hub()
    case = next(c for c in hf_cases.CASES
                if (c.cls, c.form) == ("Dinov2ForImageClassification", ""))
    folder = case.folder("float32")
    ours = hf_cases.backbone(case)
    objckpt.restore(ours, folder)
    out = str(tmp_path / "out")
    os.makedirs(out)
    objckpt.export(ours, out, rules=huggingface(folder))
    assert not [name for name in safetensors_numpy.load_file(
        os.path.join(out, "model.safetensors")) if name.startswith("dinov2.")]
    assert _values(keras_hub.models.Backbone.from_preset(out)) == _values(ours)
    assert _values(keras_hub.models.Backbone.from_preset(folder)) == _values(ours)


def test_dinov2_export_refuses_position_embeddings_that_no_longer_agree(tmp_path):
    """Training changes the interpolated copy only (keras-hub's trainable one): export's
    tie check names both variables and writes nothing."""
    _keras_hub()
    case = _DINOV2_MODELS[0]
    ours = hf_cases.backbone(case)
    objckpt.restore(ours, case.folder("float32"))
    copy = ours.embeddings.interpolated_position_embeddings
    copy.assign(copy.numpy() + 1.0)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"(?s)position_embeddings.*interpolated_position_embeddings.*tied"
                             r".*Nothing was written.*Fix:"):
        objckpt.export(ours, str(out), rules=huggingface(case.folder("float32")))
    assert not list(out.iterdir())
