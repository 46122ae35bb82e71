"""docs/huggingface.md's table of shipped Hugging Face sets is what tests/helpers/hf_table.py
generates from the sets' modules and the fixtures transformers wrote: a set added to
objckpt.rules (or a fixture added for one) changes the table, and this fails until the page
is regenerated (`python3 tests/helpers/hf_table.py --write`)."""

from __future__ import annotations

import pytest

import objckpt

pytest.importorskip("keras_hub", reason="keras-hub names the backbones of the table")
keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("keras-hub's models need Keras 3", allow_module_level=True)

import hf_table  # noqa: E402


def test_the_docs_table_is_the_generated_one():
    with open(hf_table.PAGE, encoding="utf-8") as f:
        page = hf_table.page_table(f.read())
    assert page, f"docs/huggingface.md has no table between {hf_table.BEGIN!r} and its end"
    assert page == hf_table.render(), (
        "docs/huggingface.md's table of shipped sets is stale: run "
        "python3 tests/helpers/hf_table.py --write")


def test_the_table_has_a_row_per_supported_type_with_its_classes():
    rows = hf_table.rows()
    assert [row[0] for row in rows] == [f"`{t}`" for t in objckpt.rules.supported()]
    llama = dict((row[0], row) for row in rows)["`llama`"]
    assert "`LlamaForCausalLM`" in llama[1] and "`GemmaModel`" not in llama[1]
    assert llama[2].startswith("`Llama3Backbone` (every class; heads set aside)")
    assert "`Llama3CausalLM` as `LlamaForCausalLM`" in llama[3]
    assert llama[4].startswith("transformers 5.24.0: in `LlamaModel`")
    gemma2 = dict((row[0], row) for row in rows)["`gemma2`"]  # a module of two types
    assert "`Gemma2Model`" in gemma2[1] and "`GemmaModel`" not in gemma2[1]
    assert "`GemmaCausalLM` as `Gemma2ForCausalLM`" in gemma2[3]


def test_a_supported_type_without_a_module_is_named(monkeypatch):
    monkeypatch.setattr(objckpt.rules, "supported", lambda: ["bert", "nosuchtype"])
    with pytest.raises(LookupError, match="nosuchtype"):
        hf_table.set_modules()


def _keras_hub_model_types() -> set:
    """The `model_type`s keras-hub's transformers importer dispatches on, read from its
    source (the strings its loader compares `model_type` with)."""
    import ast
    import inspect

    from keras_hub.src.utils.transformers import preset_loader

    types = set()
    for node in ast.walk(ast.parse(inspect.getsource(preset_loader))):
        if isinstance(node, ast.Compare) and getattr(node.left, "id", None) == "model_type":
            for right in node.comparators:
                types.update(n.value for n in ast.walk(right)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return types


def test_every_model_type_keras_hub_imports_has_a_shipped_set():
    types = _keras_hub_model_types()
    assert {"llama", "bert", "gemma3", "blip-2", "sam3_video"} <= types, sorted(types)
    missing = sorted(types - set(objckpt.rules.supported()))
    assert not missing, (
        f"keras-hub's transformers importer reads {missing}, which objckpt.rules ships no "
        "set for: write one (see docs/huggingface.md) or pin keras-hub")
