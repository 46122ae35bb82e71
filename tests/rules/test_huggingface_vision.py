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
import re
import shutil

import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface
from objckpt.rules.core import NOWHERE

import hf_cases
from support import bits, by_source as _by_source, config_folder

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
DINOV3 = {"architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit", "hidden_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32,
          "image_size": 16, "patch_size": 4, "num_register_tokens": 2,
          "layerscale_value": 1.0, "key_bias": False, "use_gated_mlp": False}
CONFIGS = {"deit": DEIT, "dinov2": DINOV2, "dinov2_with_registers": DINOV2_REGISTERS,
           "dinov3_vit": DINOV3}


def _cases(case: str, form: str = ""):
    return [c for c in hf_cases.CASES if c.case == case and c.form == form]


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
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

@pytest.mark.parametrize("cls,task,why", [
    ("DeiTForImageClassificationWithTeacher", "DeiTImageClassifier",
     "average two heads .*DeiTImageClassifier's one head does not compute"),
    ("DeiTModel", "DeiTImageClassifier", "DeiTModel has no classifier"),
    ("SwinModel", "SwinTransformerImageClassifier", "SwinModel has no classifier"),
])
def test_a_folder_without_the_task_models_head_names_why_and_changes_nothing(cls, task, why):
    """A strict restore into the image classifier from a class without its head: each head
    variable named with the reason (WithTeacher's two heads are no DeiTImageClassifier
    head), the Fix that strict=False leaves it, nothing written."""
    _keras_hub()
    case = next(c for c in hf_cases.CASES if (c.cls, c.form) == (cls, ""))
    model = hf_cases.task(case._replace(task=task), hf_cases.backbone(case))
    before = _values(model)
    with pytest.raises(errors.StructureMismatchError,
                       match=rf"(?s)output_dense/_kernel.*gets no value: .*{why}.*Fix: "
                             r"strict=False"):
        objckpt.restore(model, case.folder("float32"))
    assert _values(model) == before

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
                  if c.case.startswith("dinov2") and c.cls.endswith(("Model", "Backbone"))]


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


# --- Swin -----------------------------------------------------------------------------------

SWIN = {"architectures": ["SwinForImageClassification"], "model_type": "swin", "image_size": 32,
        "patch_size": 4, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 4],
        "window_size": 2, "mlp_ratio": 2.0, "qkv_bias": True}
_SWIN = [c for c in hf_cases.CASES if c.case == "swin"]


def test_swin_is_chosen_by_the_folder(tmp_path):
    chosen = huggingface(config_folder(tmp_path, SWIN))
    assert "swin" in objckpt.rules.supported()
    assert chosen.name == "huggingface('swin')"
    assert list(chosen) == list(huggingface("swin", config=SWIN))


@pytest.mark.parametrize("key,value", [("embed_dim", None), ("embed_dim", 0),
                                       ("depths", None), ("depths", []), ("depths", [2, 0])])
def test_swin_refuses_sizes_it_cannot_use(key, value):
    config = {**SWIN, key: value}
    if value is None:
        del config[key]
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"(?s)`{key}`.*{re.escape(repr(value))}.*Fix:"):
        huggingface("swin", config=config)


def test_swin_query_key_value_are_thirds_of_the_fused_qkv_stage_by_stage():
    by_source = _by_source(huggingface("swin", config=SWIN))
    for stage in (0, 1):
        block = f"operations/{3 + stage}/blocks/{{b}}"
        for index, name in enumerate(("query", "key", "value")):
            rule = by_source[f"encoder.layers.{stage}.blocks.{{b}}.attention.self.{name}.weight"]
            assert rule.target == f"{block}/attn/qkv/kernel"
            assert (rule.concat.index, rule.concat.count, rule.concat.axis) == (index, 3, 1)
            new = by_source[f"swin.encoder.layers.{stage}.blocks.{{b}}.attention.{name[0]}_proj"
                            ".bias"]
            assert (new.target, new.concat.index) == (f"{block}/attn/qkv/bias", index)
        table = by_source[f"encoder.layers.{stage}.blocks.{{b}}.attention.self."
                          "relative_position_bias_table"]
        assert (table.target, table.transform) == (
            f"{block}/attn/relative_position_bias_table", None)
        assert by_source[f"encoder.layers.{stage}.blocks.{{b}}.attention.relative_position_bias"
                         ".relative_position_bias_table"].target == table.target
    # the last stage merges no patches
    assert by_source["encoder.layers.0.downsample.reduction.weight"].target == (
        "operations/3/downsample/reduction/kernel")
    assert "encoder.layers.1.downsample.reduction.weight" not in by_source
    assert by_source["embeddings.norm.weight"].target == "patch_embedding/norm/gamma"
    assert by_source["layernorm.bias"].target == "norm/beta"


def test_swin_task_models_set_targets_the_backbone_and_export_writes_swin_prefix():
    rules = huggingface("swin", config={**SWIN, "task": "SwinTransformerImageClassifier"})
    first = rules[0]
    assert first.source.startswith("swin.") and first.target.startswith("backbone/")
    assert huggingface("swin", config=SWIN)[0].source.startswith("embeddings.")
    assert _by_source(rules)["classifier.weight"].target == "output_dense/kernel"


@pytest.mark.parametrize("case", _SWIN, ids=lambda c: c.id)
def test_swin_backbone_is_bit_equal_to_keras_hubs_import(case):
    """keras-hub's `Backbone.from_preset` of the original-form folder and objckpt's restore
    of the folder in either form: the same bits."""
    keras_hub = _keras_hub()
    theirs = keras_hub.models.Backbone.from_preset(case.original.folder("float32"))
    ours = hf_cases.backbone(case)
    objckpt.restore(ours, case.folder("float32"), strict=True)
    assert _values(ours) == _values(theirs)


def test_swin_classifier_is_bit_equal_to_keras_hubs_import(tmp_path):
    """keras-hub's `ImageClassifier.from_preset` (which needs the image processor's config
    too: the folder is copied and given one) and objckpt's restore: the same bits."""
    keras_hub = _keras_hub()
    case = next(c for c in _SWIN if c.task and not c.form)
    folder = str(tmp_path / "with-processor")
    shutil.copytree(case.folder("float32"), folder)
    with open(os.path.join(folder, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump({"size": {"height": 32, "width": 32}}, f)
    theirs = keras_hub.models.ImageClassifier.from_preset(folder)
    ours = hf_cases.task(case, hf_cases.backbone(case))
    objckpt.restore(ours, case.folder("float32"))
    assert type(ours) is type(theirs)
    assert _values(ours) == _values(theirs)


def test_swin_transformers_4_files_relative_position_index_is_set_aside(tmp_path):
    """transformers 4 saved each block's relative position index (a buffer); a folder
    holding it restores the same variables (strict), the index listed as set aside."""
    _keras_hub()
    import numpy as np

    case = next(c for c in _SWIN if c.cls == "SwinModel" and not c.form)
    folder = str(tmp_path / "old")
    shutil.copytree(case.folder("float32"), folder)
    path = os.path.join(folder, "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    index = [f"encoder.layers.{s}.blocks.{b}.attention.self.relative_position_index"
             for s in (0, 1) for b in (0, 1)]
    for name in index:
        tensors[name] = np.arange(16, dtype="int64").reshape(4, 4)
    safetensors_numpy.save_file(tensors, path)
    ours, reference = hf_cases.backbone(case), hf_cases.backbone(case)
    report = objckpt.restore(ours, folder)
    objckpt.restore(reference, case.folder("float32"))
    assert _values(ours) == _values(reference)
    aside = [line for line in report.skipped if "relative_position_index" in line]
    assert sorted(line.split(":")[0] for line in aside) == sorted(index)
    assert all("set aside" in line for line in aside)


# --- DINOv3 ViT -------------------------------------------------------------------------------

def test_dinov3_dense_attention_layer_scales_and_both_block_forms():
    by_source = _by_source(huggingface("dinov3_vit", config=DINOV3))
    query = by_source["layer.{i}.attention.q_proj.weight"]
    assert (query.target, query.transform) == ("encoder/layers/{i}/attention/query_dense/kernel",
                                               Transpose())  # unsplit, as keras-hub keeps it
    assert by_source["model.layer.{i}.attention.q_proj.weight"].target == query.target
    assert by_source["layer.{i}.layer_scale2.lambda1"].target == (
        "encoder/layers/{i}/layer_scale2/lambda1")
    assert by_source["model.layer.{i}.mlp.gate_proj.bias"].target == (
        "encoder/layers/{i}/mlp/gate_proj/bias")
    assert by_source["embeddings.patch_embeddings.weight"].transform == ConvKernel(
        "OIHW", "HWIO")
    assert by_source["norm.weight"].target == "layernorm/gamma"
    # the first rule of each block entry is the original form's: export writes it
    first = next(r for r in huggingface("dinov3_vit", config=DINOV3)
                 if r.target == "encoder/layers/{i}/norm1/gamma")
    assert first.source == "layer.{i}.norm1.weight"


_DINOV3 = [c for c in hf_cases.CASES if c.case.startswith("dinov3")]


@pytest.mark.parametrize("case", _DINOV3, ids=lambda c: c.id)
def test_dinov3_backbone_is_bit_equal_to_keras_hubs_import(case):
    """keras-hub's `Backbone.from_preset` of the original-form folder and objckpt's strict
    restore of the folder in either form: the same bits (the key without a bias, the gated
    MLP's three projections)."""
    keras_hub = _keras_hub()
    theirs = keras_hub.models.Backbone.from_preset(case.original.folder("float32"))
    ours = hf_cases.backbone(case)
    report = objckpt.restore(ours, case.folder("float32"))
    assert len(report.restored) == len(ours.weights)
    assert _values(ours) == _values(theirs)
