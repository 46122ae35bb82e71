"""Hugging Face folders of every Hub class of each shipped set, with their heads.

For each set and each class transformers has for it, a folder is made as that class saves
it: the backbone's tensors (objckpt's export of a random keras-hub backbone, renamed to the
class's prefix) plus the class's head entries, named exactly as transformers names them
(the key lists below were read from `state_dict()` of tiny configs of each class with
transformers 5.x; tied tensors, which `save_pretrained` leaves out, are left out here too).
Each folder is restored with one call (no rules: the folder's config.json chooses the set):

- into the keras-hub backbone, strictly: every head entry is set aside and listed under
  `skipped` as the head of its classes; backbone values bit-equal; a class without a part
  the backbone has (BERT's pooler, a decoder's LM head) is refused with that reason;
- into the keras-hub task model of that class where there is one (`BertMaskedLM`,
  `BertTextClassifier`, `ViTImageClassifier`, the causal LMs): the head restored too,
  bit-equal;
- export of a task model writes its class's names and `architectures`, and restores back.

Keras 3 only (keras-hub needs it); tiny configs, one backbone per set.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import huggingface

from support import bits

keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

H, HEADS, LAYERS, V, POS, CLASSES_N = 16, 2, 1, 64, 16, 3

CONFIGS = {
    "bert": {"model_type": "bert", "vocab_size": V, "hidden_size": H,
             "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
             "intermediate_size": 32, "max_position_embeddings": POS, "type_vocab_size": 2},
    "gpt2": {"model_type": "gpt2", "vocab_size": V, "n_embd": H, "n_layer": LAYERS,
             "n_head": HEADS, "n_positions": POS},
    "vit": {"model_type": "vit", "hidden_size": H, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "intermediate_size": 32, "image_size": 8,
            "patch_size": 4, "num_channels": 3},
    "llama": {"model_type": "llama", "vocab_size": V, "hidden_size": H,
              "intermediate_size": 32, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": 1, "head_dim": H // HEADS,
              "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "vocab_size": V, "hidden_size": H,
                "intermediate_size": 32, "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS, "num_key_value_heads": 1,
                "head_dim": H // HEADS, "tie_word_embeddings": False},
    "gemma": {"model_type": "gemma", "vocab_size": V, "hidden_size": H,
              "intermediate_size": 16, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": 1, "head_dim": 4,
              "tie_word_embeddings": True},
}

# The head entries of each Hub class as transformers saves them, with their shapes.
MLM = {"cls.predictions.bias": (V,), "cls.predictions.transform.dense.weight": (H, H),
       "cls.predictions.transform.dense.bias": (H,),
       "cls.predictions.transform.LayerNorm.weight": (H,),
       "cls.predictions.transform.LayerNorm.bias": (H,)}
NSP = {"cls.seq_relationship.weight": (2, H), "cls.seq_relationship.bias": (2,)}
CLASSIFIER = {"classifier.weight": (CLASSES_N, H), "classifier.bias": (CLASSES_N,)}
QA = {"qa_outputs.weight": (2, H), "qa_outputs.bias": (2,)}
SCORE = {"score.weight": (CLASSES_N, H)}
TOKENS = {"score.weight": (CLASSES_N, H), "score.bias": (CLASSES_N,)}

# set -> Hub class -> (prefix of the backbone's names, head entries, what the class lacks
# that the backbone has: the start of the reason a strict restore gives, or None).
CLASSES = {
    "bert": {
        "BertModel": ("", {}, None),
        "BertForPreTraining": ("bert.", {**MLM, **NSP}, None),
        "BertForMaskedLM": ("bert.", MLM, "BertForMaskedLM has no pooler"),
        "BertLMHeadModel": ("bert.", MLM, "BertLMHeadModel has no pooler"),
        "BertForNextSentencePrediction": ("bert.", NSP, None),
        "BertForSequenceClassification": ("bert.", CLASSIFIER, None),
        "BertForMultipleChoice": ("bert.", {"classifier.weight": (1, H),
                                            "classifier.bias": (1,)}, None),
        "BertForTokenClassification": ("bert.", CLASSIFIER,
                                       "BertForTokenClassification has no pooler"),
        "BertForQuestionAnswering": ("bert.", QA, "BertForQuestionAnswering has no pooler"),
    },
    "gpt2": {
        "GPT2Model": ("", {}, None),
        "GPT2LMHeadModel": ("transformer.", {}, None),  # lm_head.weight: tied, not saved
        "GPT2DoubleHeadsModel": ("transformer.", {
            "multiple_choice_head.summary.weight": (1, H),
            "multiple_choice_head.summary.bias": (1,)}, None),
        "GPT2ForSequenceClassification": ("transformer.", SCORE, None),
        "GPT2ForTokenClassification": ("transformer.", CLASSIFIER, None),
        "GPT2ForQuestionAnswering": ("transformer.", QA, None),
    },
    "vit": {
        "ViTModel": ("", {"pooler.dense.weight": (H, H), "pooler.dense.bias": (H,)}, None),
        "ViTForImageClassification": ("vit.", CLASSIFIER, None),
        "ViTForMaskedImageModeling": ("vit.", {"vit.embeddings.mask_token": (1, 1, H),
                                               "decoder.0.weight": (48, H, 1, 1),
                                               "decoder.0.bias": (48,)}, None),
    },
    "llama": {  # tied embeddings: lm_head.weight is not saved
        "LlamaModel": ("", {}, None),
        "LlamaForCausalLM": ("model.", {}, None),
        "LlamaForSequenceClassification": ("model.", SCORE, None),
        "LlamaForTokenClassification": ("model.", TOKENS, None),
        "LlamaForQuestionAnswering": ("transformer.", QA, None),
    },
    "mistral": {  # keras-hub's Mistral always has its own output embedding
        "MistralModel": ("", {}, "MistralModel has no LM head"),
        "MistralForCausalLM": ("model.", {}, None),  # lm_head.weight: the backbone's
        "MistralForSequenceClassification": ("model.", SCORE,
                                             "MistralForSequenceClassification has no LM head"),
        "MistralForTokenClassification": ("model.", TOKENS,
                                          "MistralForTokenClassification has no LM head"),
        "MistralForQuestionAnswering": ("model.", QA,
                                        "MistralForQuestionAnswering has no LM head"),
    },
    "gemma": {
        "GemmaModel": ("", {}, None),
        "GemmaForCausalLM": ("model.", {}, None),
        "GemmaForSequenceClassification": ("model.", SCORE, None),
        "GemmaForTokenClassification": ("model.", TOKENS, None),
    },
}
# The prefix objckpt's export writes for each backbone (stripped before the class's is put).
EXPORTED = {"bert": "", "gpt2": "", "vit": "vit.", "llama": "model.", "mistral": "model.",
            "gemma": "model."}
# Entries the backbone's export holds that a class lacking a part does not save.
NOT_SAVED = {"bert": ("pooler.",), "mistral": ("lm_head.",)}
# Hub class -> (keras-hub task, {head entry: the task's variable path it feeds, transform}).
TASKS = {
    "BertForMaskedLM": ("BertMaskedLM", {
        "cls.predictions.transform.dense.weight": ("masked_lm_head/_intermediate_dense/_kernel",
                                                   "T"),
        "cls.predictions.transform.dense.bias": ("masked_lm_head/_intermediate_dense/bias", ""),
        "cls.predictions.transform.LayerNorm.weight": (
            "masked_lm_head/_intermediate_layer_norm/gamma", ""),
        "cls.predictions.transform.LayerNorm.bias": (
            "masked_lm_head/_intermediate_layer_norm/beta", ""),
        "cls.predictions.bias": ("masked_lm_head/_bias", "")}),
    "BertForSequenceClassification": ("BertTextClassifier", {
        "classifier.weight": ("output_dense/_kernel", "T"),
        "classifier.bias": ("output_dense/bias", "")}),
    "ViTForImageClassification": ("ViTImageClassifier", {
        "classifier.weight": ("output_dense/_kernel", "T"),
        "classifier.bias": ("output_dense/bias", "")}),
    "GPT2LMHeadModel": ("GPT2CausalLM", {}),
    "LlamaForCausalLM": ("Llama3CausalLM", {}),
    "MistralForCausalLM": ("MistralCausalLM", {}),
    "GemmaForCausalLM": ("GemmaCausalLM", {}),
}
CASES = [(name, hub) for name, classes in CLASSES.items() for hub in classes]


def _backbone(name: str, seed: int):
    models = keras_hub.models
    small = dict(num_layers=LAYERS, hidden_dim=H)
    make = {
        "bert": lambda: models.BertBackbone(vocabulary_size=V, num_heads=HEADS,
                                            intermediate_dim=32, max_sequence_length=POS,
                                            **small),
        "gpt2": lambda: models.GPT2Backbone(vocabulary_size=V, num_heads=HEADS,
                                            intermediate_dim=4 * H, max_sequence_length=POS,
                                            **small),
        "vit": lambda: models.ViTBackbone(image_shape=(8, 8, 3), patch_size=4,
                                          num_heads=HEADS, mlp_dim=32, **small),
        "llama": lambda: models.Llama3Backbone(
            vocabulary_size=V, num_query_heads=HEADS, num_key_value_heads=1,
            intermediate_dim=32, tie_word_embeddings=True, **small),
        "mistral": lambda: models.MistralBackbone(
            vocabulary_size=V, num_query_heads=HEADS, num_key_value_heads=1,
            intermediate_dim=32, head_dim=H // HEADS, **small),
        "gemma": lambda: models.GemmaBackbone(
            vocabulary_size=V, num_query_heads=HEADS, num_key_value_heads=1,
            intermediate_dim=32, head_dim=4, **small),
    }[name]
    model = make()
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if "seed_generator" not in variable.path:
            variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))
    return model


def _task(hub: str, backbone):
    task = getattr(keras_hub.models, TASKS[hub][0])
    if task.__name__ in ("BertTextClassifier", "ViTImageClassifier"):
        return task(backbone=backbone, num_classes=CLASSES_N, preprocessor=None)
    return task(backbone=backbone, preprocessor=None)


def _values(model) -> dict:
    return {path: bits(variable.numpy()) for path, variable in objckpt.tree(model).items()
            if "seed_generator" not in path and not path.startswith("optimizer/")}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """set -> (the random backbone, its tensors as objckpt's export names them)."""
    out = {}
    for name, config in CONFIGS.items():
        model = _backbone(name, seed=1)
        folder = tmp_path_factory.mktemp(f"export-{name}")
        objckpt.export(model, str(folder), rules=huggingface(name, config=config))
        out[name] = (model, safetensors_numpy.load_file(str(folder / "model.safetensors")))
    return out


def _class_folder(root, name: str, hub: str, published) -> tuple:
    """A folder as `hub` saves it: (folder, its tensors)."""
    prefix, heads, _ = CLASSES[name][hub]
    exported = EXPORTED[name]
    tensors = {}
    lacks = CLASSES[name][hub][2]
    for key, value in published[name][1].items():
        if lacks is not None and key.startswith(NOT_SAVED[name]):
            continue
        bare = key[len(exported):] if exported and key.startswith(exported) else key
        tensors[key if key.startswith("lm_head.") else prefix + bare] = value
    rng = np.random.default_rng(7)
    tensors.update({k: rng.normal(size=shape).astype(np.float32) for k, shape in heads.items()})
    folder = root / hub
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {**CONFIGS[name], "architectures": [hub]}), encoding="utf-8")
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    return str(folder), tensors


@pytest.mark.parametrize("name,hub", CASES)
def test_one_call_into_the_backbone_sets_the_heads_aside(tmp_path, published, name, hub):
    folder, tensors = _class_folder(tmp_path, name, hub, published)
    _, heads, lacks = CLASSES[name][hub]
    fresh = _backbone(name, seed=2)
    before = _values(fresh)
    if lacks is not None:  # strict: the part the class lacks is named, nothing changes
        with pytest.raises(errors.StructureMismatchError) as raised:
            objckpt.restore(fresh, folder)
        assert f"gets no value: {lacks}" in str(raised.value)
        assert "strict=False leaves it at its initial value" in str(raised.value)
        assert _values(fresh) == before
        report = objckpt.restore(fresh, folder, strict=False)
        assert report.missing
    else:
        report = objckpt.restore(fresh, folder)
        assert _values(fresh) == _values(published[name][0])
    assert tuple(report.unexpected) == ()
    assert f"objckpt.rules.huggingface({CONFIGS[name]['model_type']!r})" in " ".join(
        report.notes)
    set_aside = {line.split(": ", 1)[0]: line for line in report.skipped
                 if ": head of " in line}
    assert sorted(set_aside) == sorted(heads)
    for entry, line in set_aside.items():
        assert hub in line.split(": head of ", 1)[1].split(", set aside")[0], line


@pytest.mark.parametrize("hub", sorted(TASKS))
def test_one_call_into_the_task_model_restores_the_head(tmp_path, published, hub):
    name = next(n for n, classes in CLASSES.items() if hub in classes)
    folder, tensors = _class_folder(tmp_path, name, hub, published)
    task = _task(hub, _backbone(name, seed=3))
    report = objckpt.restore(task, folder)
    assert tuple(report.unexpected) == () and tuple(report.missing) == ()
    assert not [line for line in report.skipped if ": head of " in line]
    tree = objckpt.tree(task)
    for entry, (path, transform) in TASKS[hub][1].items():
        value = tensors[entry].T if transform == "T" else tensors[entry]
        assert bits(tree[path].numpy()) == bits(value), entry
    source = _values(published[name][0])
    restored = {p[len("backbone/"):]: v for p, v in _values(task).items()
                if p.startswith("backbone/")}
    lacks = CLASSES[name][hub][2]
    assert restored.keys() == source.keys()
    for path, value in restored.items():  # the backbone: as published (a lacked pooler aside)
        if lacks is None or "pooled_dense" not in path:
            assert value == source[path], path
    # export writes the class's names and architectures; one call brings it back
    out = tmp_path / "out"
    written = objckpt.export(task, str(out), rules=huggingface(folder))
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == [hub]
    names = set(safetensors_numpy.load_file(written))
    assert set(TASKS[hub][1]) <= names
    prefix = CLASSES[name][hub][0]
    assert prefix and all(n.startswith((prefix, *TASKS[hub][1], "lm_head.")) for n in names)
    back = _task(hub, _backbone(name, seed=4))
    objckpt.restore(back, str(out))
    assert {p: v for p, v in _values(back).items() if "pooled_dense" not in p} == {
        p: v for p, v in _values(task).items() if "pooled_dense" not in p}
    if lacks is None:
        assert _values(back) == _values(task)


def test_bert_masked_lm_folder_into_bert_masked_lm_lists_the_unused_pooler(tmp_path,
                                                                         published):
    folder, _ = _class_folder(tmp_path, "bert", "BertForMaskedLM", published)
    task = _task("BertForMaskedLM", _backbone("bert", seed=5))
    pooler = bits(task.backbone.get_layer("pooled_dense").kernel.numpy())
    report = objckpt.restore(task, folder)
    lines = [line for line in report.skipped if "pooled_dense" in line]
    assert len(lines) == 2 and all(
        "BertForMaskedLM has no pooler (its folder holds no `pooler.dense.*`); unused by "
        "BertMaskedLM, left as is" in line for line in lines)
    assert bits(task.backbone.get_layer("pooled_dense").kernel.numpy()) == pooler
    out = objckpt.export(task, str(tmp_path / "out"), rules=huggingface(folder))
    assert not [n for n in safetensors_numpy.load_file(out) if "pooler" in n]
    assert {p: why for p, why in out.left_out.items() if "pooled_dense" in p} == dict.fromkeys(
        ["backbone/pooled_dense/_kernel", "backbone/pooled_dense/bias"],
        "BertForMaskedLM has no pooler (its folder holds no `pooler.dense.*`); unused by "
        "BertMaskedLM")


def test_tied_decoder_weight_and_head_never_become_pairs(tmp_path, published):
    """The tied decoder weight a file may hold is set aside; the masked-LM head's LayerNorm
    is never paired with the pooler (same shape, unrelated meaning), with or without rules."""
    folder, tensors = _class_folder(tmp_path, "bert", "BertForPreTraining", published)
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    safetensors_numpy.save_file(tensors, os.path.join(folder, "model.safetensors"))
    fresh = _backbone("bert", seed=6)
    report = objckpt.restore(fresh, folder)
    assert any(line.startswith("cls.predictions.decoder.weight: head of BertForPreTraining")
               and "no keras-hub model has a variable for it" in line
               for line in report.skipped)
    the_plan = objckpt.plan(fresh, folder)
    assert not [m for m in the_plan.matches if m.source.startswith("cls.")]


def test_rules_override_and_no_set_gives_todays_error(tmp_path, published):
    folder, _ = _class_folder(tmp_path, "bert", "BertModel", published)
    fresh = _backbone("bert", seed=7)
    own = [(r"^(.*)$", r"\1")]  # given rules are used as given: no set chosen
    with pytest.raises(errors.StructureMismatchError):
        objckpt.restore(fresh, folder, rules=own)
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "model_type": "not-shipped"}, f)
    with pytest.raises(errors.StructureMismatchError, match=r"objckpt\.plan\(obj, source\)"
                                                            r"\.proposed"):
        objckpt.restore(fresh, folder)
    assert "rules: the shipped" not in " ".join(objckpt.plan(fresh, folder).notes)
