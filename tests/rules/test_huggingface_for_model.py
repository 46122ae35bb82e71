"""`objckpt.rules.huggingface.for_model`: which shipped set a restore without rules uses.

Only a keras-hub model (a class from the `keras_hub` package: told from its module's name,
keras_hub never imported) and a local folder, or a file in one, whose config.json names a
`model_type` with a set get one; anything else gets none and restores as before. No
keras-hub needed: stand-in classes carry keras-hub's module name.
"""

from __future__ import annotations

import json

import pytest

from objckpt.rules import huggingface
from objckpt.rules.huggingface import for_model, head_entries

CONFIG = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 8,
          "num_attention_heads": 2}


class BertMaskedLM:  # a stand-in for keras-hub's class of that name
    pass


BertMaskedLM.__module__ = "keras_hub.src.models.bert.bert_masked_lm"


class BertBackbone:
    pass


BertBackbone.__module__ = "keras_hub.src.models.bert.bert_backbone"


def _folder(tmp_path, config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"")
    return str(tmp_path)


def test_a_keras_hub_model_and_a_folder_get_the_set_it_names(tmp_path):
    folder = _folder(tmp_path, CONFIG)
    rules, note = for_model(BertBackbone(), folder)
    assert list(rules) == list(huggingface(folder, model=BertBackbone()))
    assert note == ("rules: the shipped Hugging Face set objckpt.rules.huggingface('bert'), "
                    "chosen by the folder's config.json (BertForMaskedLM); pass rules=... to "
                    "use others")
    # a file in the folder, and a task model: its class's names (`bert.` first)
    rules, _ = for_model(BertMaskedLM(), str(tmp_path / "model.safetensors"))
    assert rules[0].source.startswith("bert.")
    assert rules.classes["BertMaskedLM"] == "BertForMaskedLM"


@pytest.mark.parametrize("obj,source,config", [
    (object(), None, CONFIG),  # not a keras-hub model
    (BertBackbone(), "gs://bucket/folder", CONFIG),  # not a local folder
    (BertBackbone(), None, {**CONFIG, "model_type": "t5"}),  # no set for that type
    (BertBackbone(), None, None),  # no config.json
])
def test_anything_else_gets_no_set(tmp_path, obj, source, config):
    if config is not None:
        _folder(tmp_path, config)
    assert for_model(obj, source or str(tmp_path)) is None


def test_names_from_the_file_are_shown_only_as_plain_identifiers(tmp_path):
    folder = _folder(tmp_path, {**CONFIG, "architectures": ["\x1b[31mX", "BertModel", 3]})
    _, note = for_model(BertBackbone(), folder)
    assert "(BertModel)" in note and "\x1b" not in note


def test_head_entries_are_heads_only():
    heads = head_entries()
    assert {"cls.predictions.bias", "classifier.weight", "score.weight",
            "qa_outputs.bias"} <= heads
    # entries some backbone restores (Llama's untied output embedding, BERT's pooler)
    assert not {"lm_head.weight", "pooler.dense.weight", "pooler.dense.bias"} & heads
