"""The ViT set (`objckpt.rules.hf_vit`) and transformers 5's key form.

transformers 5 names ViT's encoder anew (`layers.{i}.attention.q_proj` for
`encoder.layer.{i}.attention.attention.query`, ...) and `save_pretrained(
save_original_format=False)` writes those names. The oracle is transformers' own pair of
folders: tests/fixtures/hf/vit-<Class>-float32/ and its `-v5names` twin hold the same model
saved both ways, so their tensors' bytes pair the two names of each entry (every tensor is
random, no two alike). No keras-hub needed, except where a restore is the point.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from objckpt import errors
from objckpt._planning.rules import parse_rules, rewrite
from objckpt.rules import huggingface
from objckpt.rules.huggingface import for_model

import hf_cases

safetensors_numpy = pytest.importorskip("safetensors.numpy")

CLASSES = ("ViTModel", "ViTForImageClassification")
VIT_MODEL = next(c for c in hf_cases.CASES if (c.cls, c.form) == ("ViTModel", ""))


def _folder(cls: str, new_form: bool = False) -> str:
    suffix = f"-{hf_cases.NEW_FORM}" if new_form else ""
    return os.path.join(hf_cases.FIXTURES, f"vit-{cls}-float32{suffix}")


def _arrays(folder: str) -> dict:
    return safetensors_numpy.load_file(os.path.join(folder, "model.safetensors"))


def _pairs(cls: str) -> dict:
    """{transformers 5's name: the original name} of each entry, paired by bytes."""
    original = {value.tobytes(): name for name, value in _arrays(_folder(cls)).items()}
    assert len(original) == len(_arrays(_folder(cls)))  # no two tensors alike
    return {name: original[value.tobytes()]
            for name, value in _arrays(_folder(cls, True)).items()}


def _target(name: str, parsed) -> str | None:
    new, rule = rewrite(name, parsed)
    return new if rule is not None else None


class ViTBackbone:  # a stand-in for keras-hub's class of that name
    pass


ViTBackbone.__module__ = "keras_hub.src.models.vit.vit_backbone"


@pytest.mark.parametrize("cls", CLASSES)
def test_either_form_of_an_entry_feeds_the_same_variable(cls):
    pairs = _pairs(cls)
    renamed = {new: old for new, old in pairs.items() if new != old}
    assert len(renamed) == 2 * 16  # two blocks, 16 entries each: every encoder block entry
    parsed = parse_rules(huggingface(_folder(cls)))
    for new, old in pairs.items():
        target = _target(old, parsed)
        assert target is not None, old
        assert _target(new, parsed) == target, (new, old)


def test_export_names_every_variable_in_the_original_form():
    """The name export gives each variable of the classifier is the original folder's."""
    rules = huggingface(_folder("ViTForImageClassification"))
    parsed = parse_rules(rules)
    for new, old in _pairs("ViTForImageClassification").items():
        name, _, _ = rules.export_name(_target(new, parsed))
        assert name == old


def test_a_folders_key_form_is_told_from_its_names(tmp_path):
    for cls in CLASSES:
        assert huggingface(_folder(cls)).key_form == "original"
        assert huggingface(_folder(cls, True)).key_form == "transformers 5"
    assert huggingface(os.path.join(hf_cases.FIXTURES, "bert-BertModel-float32")).key_form == ""
    config = hf_cases.config(VIT_MODEL)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert huggingface(str(tmp_path)).key_form == ""  # no weights beside it
    (tmp_path / "model.safetensors").write_bytes(b"")  # unreadable: restore says why
    assert huggingface(str(tmp_path)).key_form == ""
    assert huggingface("vit", config=config).key_form == ""  # no folder, no names


def _mixed(tmp_path, extra=None) -> str:
    """The ViTModel folder in transformers 5's form with block 0 back in the original."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(os.path.join(_folder("ViTModel", True), "config.json"), folder)
    pairs = _pairs("ViTModel")
    arrays = {(pairs[name] if name.startswith("layers.0.") else name): value
              for name, value in _arrays(_folder("ViTModel", True)).items()}
    arrays.update(extra or {})
    safetensors_numpy.save_file(arrays, str(folder / "model.safetensors"))
    return str(folder)


def test_a_folder_mixing_the_forms_is_refused_naming_one_key_of_each(tmp_path):
    folder = _mixed(tmp_path)
    with pytest.raises(errors.InvalidArgumentError) as caught:
        huggingface(folder)
    text = str(caught.value)
    assert "holds keys in two forms" in text
    assert "`encoder.layer.0.attention.attention.key.bias` (original: " in text
    assert "`layers.1.attention.k_proj.bias` (transformers 5: " in text
    assert "save_original_format=False" in text and "Fix: " in text
    with pytest.raises(errors.InvalidArgumentError, match="two forms"):
        for_model(ViTBackbone(), folder)  # the one call refuses it too


def test_names_in_the_refusal_are_escaped(tmp_path):
    import numpy as np

    folder = _mixed(tmp_path, {"\x1b[31mlayers.9.x": np.zeros(1, "float32"),
                               "layers.0.\x1b[31mx": np.zeros(1, "float32")})
    with pytest.raises(errors.InvalidArgumentError) as caught:
        huggingface(folder)
    assert "\x1b" not in str(caught.value)


def test_a_mixed_folder_restores_nothing(tmp_path):
    pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3"):
        pytest.skip("keras-hub's models need Keras 3")
    import numpy as np

    import objckpt

    folder = _mixed(tmp_path)
    model = hf_cases.backbone(VIT_MODEL)
    before = [np.asarray(v.numpy()).tobytes() for v in model.weights]
    with pytest.raises(errors.InvalidArgumentError, match="two forms"):
        objckpt.restore(model, folder)
    assert [np.asarray(v.numpy()).tobytes() for v in model.weights] == before
