"""Rule sets mapping Hugging Face checkpoints to keras-hub backbones, both ways.

Each supported architecture has a module `hf_<name>` with `MODEL_TYPES` (the `model_type`
values of a Hugging Face `config.json` it covers) and `rules(config) -> RuleSet`, where
`config` is that `config.json` as a dict (sizes such as the number of heads decide the
reshapes). `huggingface(name_or_folder)` picks one by name or by the folder's `config.json`.
"""

from __future__ import annotations

import importlib
import json
import os
import re

from objckpt import errors
from objckpt._base import render as _render
from objckpt.rules import core as _core

__all__ = ["for_model", "head_entries", "huggingface", "read_config", "supported"]

# model_type -> the module holding its rule set (filled as sets are added).
_MODULES: dict[str, str] = {
    "albert": "objckpt.rules.hf_albert",
    "bart": "objckpt.rules.hf_bart",
    "bert": "objckpt.rules.hf_bert",
    "blip-2": "objckpt.rules.hf_blip2",
    "deit": "objckpt.rules.hf_deit",
    "dinov2": "objckpt.rules.hf_dinov2",
    "dinov2_with_registers": "objckpt.rules.hf_dinov2",
    "dinov3_vit": "objckpt.rules.hf_dinov3",
    "distilbert": "objckpt.rules.hf_distilbert",
    "esm": "objckpt.rules.hf_esm",
    "gemma": "objckpt.rules.hf_gemma",
    "gemma2": "objckpt.rules.hf_gemma",
    "gemma3": "objckpt.rules.hf_gemma3_vision",
    "gemma3_text": "objckpt.rules.hf_gemma3",
    "gemma3n": "objckpt.rules.hf_gemma3n_multimodal",
    "gemma3n_text": "objckpt.rules.hf_gemma3n",
    "gemma4": "objckpt.rules.hf_gemma4_towers",
    "gemma4_assistant": "objckpt.rules.hf_gemma4_assistant",
    "gemma4_text": "objckpt.rules.hf_gemma4",
    "gpt2": "objckpt.rules.hf_gpt2",
    "gpt_oss": "objckpt.rules.hf_gpt_oss",
    "llama": "objckpt.rules.hf_llama",
    "metaclip_2": "objckpt.rules.hf_metaclip2",
    "mistral": "objckpt.rules.hf_mistral",
    "mixtral": "objckpt.rules.hf_mixtral",
    "paligemma": "objckpt.rules.hf_paligemma",
    "qwen2": "objckpt.rules.hf_qwen",
    "qwen2_moe": "objckpt.rules.hf_qwen_moe",
    "qwen3": "objckpt.rules.hf_qwen",
    "qwen3_5": "objckpt.rules.hf_qwen3_5_vl",
    "qwen3_5_moe": "objckpt.rules.hf_qwen3_5_vl",
    "qwen3_5_moe_text": "objckpt.rules.hf_qwen3_5_moe",
    "qwen3_5_text": "objckpt.rules.hf_qwen3_5",
    "qwen3_moe": "objckpt.rules.hf_qwen_moe",
    "roberta": "objckpt.rules.hf_roberta",
    "sam3": "objckpt.rules.hf_sam3",
    "sam3_video": "objckpt.rules.hf_sam3",
    "smollm3": "objckpt.rules.hf_smollm3",
    "swin": "objckpt.rules.hf_swin",
    "t5gemma": "objckpt.rules.hf_t5gemma",
    "t5gemma2": "objckpt.rules.hf_t5gemma2",
    "vit": "objckpt.rules.hf_vit",
    "xlm-roberta": "objckpt.rules.hf_roberta",
}
_CONFIG_LIMIT = 1 << 20  # bytes of config.json read


def supported() -> list[str]:
    """The `model_type` names a rule set exists for."""
    return sorted(_MODULES)


def head_entries() -> frozenset:
    """Every head entry of every Hub class of the shipped sets, as transformers names them
    (`cls.predictions.bias`, `classifier.weight`, `score.weight`, ...): what a proposal
    never pairs with a variable. Entries some set's backbone has (`lm_head.weight`: Llama's
    untied output embedding; `pooler.dense.*`: BERT's pooler) are left out."""
    global _HEADS
    if _HEADS is None:
        found = set()
        for module in sorted(set(_MODULES.values())):
            for value in importlib.import_module(module).CLASSES.values():
                found.update(value[1])
        _HEADS = frozenset(found - _BACKBONE_TOO)
    return _HEADS


_HEADS = None
_BACKBONE_TOO = {"lm_head.weight", "pooler.dense.weight", "pooler.dense.bias"}


def read_config(folder: str) -> dict:
    """The folder's `config.json` as a dict, read as data (at most 1 MiB);
    InvalidArgumentError when it cannot be read or is no JSON object."""
    return _read_config(folder)


def _read_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, "rb") as f:
            data = f.read(_CONFIG_LIMIT + 1)
    except OSError as err:
        raise errors.InvalidArgumentError(
            f"huggingface({folder!r}) reads the folder's `config.json` to choose a rule set; "
            f"it cannot be read: {err}. Fix: pass the architecture's name, e.g. "
            f"objckpt.rules.huggingface('llama', config={{...}}).", source=folder) from err
    if len(data) > _CONFIG_LIMIT:
        raise errors.InvalidArgumentError(
            f"`{path}` is larger than {_CONFIG_LIMIT:,} bytes; expected a Hugging Face "
            "config.json. Fix: pass the architecture's name and its config as a dict.",
            source=path)
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise errors.InvalidArgumentError(
            f"`{path}` is not JSON ({err}). Expected a Hugging Face config.json. Fix: pass "
            "the architecture's name and its config as a dict.", source=path) from err
    if not isinstance(config, dict):
        raise errors.InvalidArgumentError(
            f"`{path}` holds a {type(config).__name__}; expected a JSON object. Fix: pass "
            "the architecture's name and its config as a dict.", source=path)
    return config


def huggingface(name_or_folder: str, *, config: dict | None = None,
                model=None) -> _core.RuleSet:
    """The rule set between a Hugging Face checkpoint and its keras-hub backbone or task
    model.

    Every set knows the Hub classes of its architecture (`CLASSES` of its module) and their
    head entries: into a backbone a head is set aside (listed under the report's
    `skipped`), into the keras-hub task model that has it (`BertMaskedLM`, ...) it is
    restored, and `export` writes it back.

    Args:
      name_or_folder: a `model_type` (`"llama"`, `"gpt2"`, ...), or a folder holding a
        Hugging Face `config.json` (its `model_type` chooses, its sizes configure, its
        `architectures` name the class, whose names export writes).
      config: the config as a dict, when a name is given (sizes the set needs).
      model: the keras-hub model the set is for (optional): a task model's class chooses
        the Hub class export names (`BertMaskedLM`: `BertForMaskedLM`, `bert.` names). A
        set whose targets depend on the model's layer names (the mixture-of-experts
        decoders': keras-hub numbers each layer's expert block by a counter of the session,
        `mixtral_sparse_moe_block_3`) reads them from it; restore, plan, export and the
        other operations make it again for the model they are given (`RuleSet.for_model`),
        so a set made without one works for every model of its architecture.

    A set whose architecture transformers 5 renames at load (ViT: `FORMS` of its module)
    restores a folder in either key form; made from a folder, it reads the names in the
    folder's safetensors headers (no value) and records their form as `key_form`.

    Raises:
      InvalidArgumentError: no rule set for that model type (the supported ones are named),
        a config that cannot be read, or a folder whose keys are in two forms (both named).
    """
    name = str(name_or_folder)
    folder = name if os.path.isdir(name) else ""
    if folder:
        config = _read_config(name)
        model_type = str(config.get("model_type", ""))
    else:
        model_type = name
    if model_type.lower() not in _MODULES:
        raise errors.InvalidArgumentError(
            f"No Hugging Face rule set for model type {model_type!r}. Supported: "
            f"{', '.join(supported()) or 'none yet'}. Fix: pass one of them, or write the "
            "rules with objckpt.rules.Rule (objckpt.plan(model, source) proposes some).")
    return _made(model_type.lower(), config, model, folder=folder)


def _made(model_type: str, config, model, *, folder: str = "", key_form: str = ""):
    """The set of a supported `model_type` for `config` (and `model`), its key form read
    from `folder` (else `key_form`); `remake` makes it again, by type (never by a path: a
    folder of the type's name in the working directory is not read)."""
    config = dict(config or {})
    config.setdefault("model_type", model_type)  # a module may cover several types
    found = importlib.import_module(_MODULES[model_type])
    given = dict(config)
    if model is not None:
        kinds = [kind.__name__ for kind in type(model).__mro__]
        config["task"] = next((k for k in kinds if k in getattr(found, "TASKS", {})), "")
    per_model = bool(getattr(found, "PER_MODEL", False))  # its targets read from the model
    rules = found.rules(config, model=model) if per_model else found.rules(config)
    rules.per_model = per_model
    rules.key_form = _key_form(folder, found) if folder else key_form
    rules.config = given
    form = rules.key_form
    rules.remake = lambda other: _made(model_type, given, other, key_form=form)
    return rules


def _key_form(folder: str, found) -> str:
    """The key form (`FORMS` of the set's module) the folder's safetensors names use: '' for
    a module with one form or a folder without a readable safetensors file (restore names
    what is wrong with it); InvalidArgumentError for a folder holding two forms."""
    forms = getattr(found, "FORMS", None)
    if not forms:
        return ""
    from objckpt._formats import safetensors as _safetensors  # header names only

    try:
        model = _safetensors.read_model(folder)
    except (errors.CheckpointCorruptError, OSError):  # the restore names the problem
        return ""
    names = list(model.tensors) if model is not None else []
    seen = {}  # form -> its first key in the folder
    for form, (pattern, _) in forms.items():
        first = next((name for name in names if re.match(pattern, name)), None)
        if first is not None:
            seen[form] = first
    if len(seen) > 1:
        shown = " and ".join(f"`{_render.safe(name)}` ({form}: {forms[form][1]})"
                             for form, name in seen.items())
        raise errors.InvalidArgumentError(
            f"The Hugging Face folder `{_render.safe(folder)}` holds keys in two forms: "
            f"{shown}. A folder transformers writes holds one; objckpt reads one form, never "
            "a mix, and read no value from this folder. Fix: load it with transformers and "
            "save it again with save_pretrained (it writes the original form), or keep one "
            "form's entries.", source=folder)
    return next(iter(seen), "")


def _is_keras_hub(obj) -> bool:
    return any(str(getattr(kind, "__module__", "")).startswith("keras_hub.")
               for kind in type(obj).__mro__)


def for_model(obj, source):
    """(the shipped set, a note saying which) for `restore(obj, source)` without rules: obj
    is a keras-hub model and source a local Hugging Face folder (or a file in one) whose
    `config.json` names a `model_type` a set exists for; else None (nothing chosen: the
    restore goes on as it would without a set). keras_hub is never imported here."""
    if not _is_keras_hub(obj) or not isinstance(source, (str, os.PathLike)):
        return None
    folder = os.fspath(source)
    if "://" in folder:
        return None
    if os.path.isfile(folder):
        folder = os.path.dirname(folder) or "."
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    try:
        config = _read_config(folder)
    except errors.InvalidArgumentError:
        return None
    model_type = str(config.get("model_type", "")).lower()
    if model_type not in _MODULES:
        return None
    rules = huggingface(folder, model=obj)
    classes = config.get("architectures")
    classes = [c for c in classes if isinstance(c, str) and c.isidentifier()] if isinstance(
        classes, list) else []
    named = f" ({', '.join(classes)})" if classes else ""
    form = f", its keys in the {rules.key_form} form" if rules.key_form else ""
    return rules, (f"rules: the shipped Hugging Face set objckpt.rules.huggingface("
                   f"{model_type!r}), chosen by the folder's config.json{named}{form}; pass "
                   "rules=... to use others")
