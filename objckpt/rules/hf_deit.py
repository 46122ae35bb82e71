"""Hugging Face DeiT (`DeiTModel`, `DeiTForImageClassification...`) <-> keras-hub's
`DeiTBackbone`.

Names and layouts follow keras-hub's own importer (`convert_deit.py`), which reads DeiT as it
reads ViT (`hf_vit`): the patch projection is a torch `Conv2d` kernel (out, in, h, w) <-> a
Keras `Conv2D` kernel (h, w, in, out); a `Linear` weight (out, in) is a Keras kernel (in,
out); query/key/value split by head, the attention output from the heads. DeiT adds a
distillation token beside the class token, and keeps its position embeddings (1, patches +
2, hidden) as they are (keras-hub's variable has the same shape). keras-hub's DeiT block
names its MLP `mlp/dense` and `output_layer/dense` (ViT's: `mlp/dense_1`, `mlp/dense_2`).
Targets are object paths (`operations/2/encoder_layers/0/mha/query_dense/kernel`).

Restore accepts the names with or without the `deit.` prefix (the task classes save them
under `deit.`, `DeiTModel` bare); export writes `deit.`, the form keras-hub's importer reads
(transformers reads both).

Key forms (`FORMS`): transformers 5 renames DeiT's encoder as it renames ViT's
(`conversion_mapping.py` maps `"DeiTModel"` to the `"ViTModel"` entry: `layers.{i}.attention.
q_proj`, `attention.o_proj`, `mlp.fc1`, `mlp.fc2`); `save_pretrained(save_original_format=
False)` writes those names. Restore accepts either form; export writes the original.

Hub classes (`CLASSES`): `DeiTModel`'s pooler (`pooler.dense.*`) has no keras-hub variable and
is set aside. `DeiTForImageClassification`'s classifier (`classifier.*`, a `Linear` on the
class token) is keras-hub's `DeiTImageClassifier` head (`output_dense`, on the class token)
and is restored there; into the backbone it is set aside. `DeiTForImageClassificationWith
Teacher` averages two heads, the class token's (`cls_classifier`) and the distillation
token's (`distillation_classifier`); keras-hub has no model computing that (its importer
loads `cls_classifier` alone into `DeiTImageClassifier`, whose logits then differ from
transformers'), so both are set aside and the class restores into the backbone only.
`DeiTForMaskedImageModeling`'s `decoder.*` and mask token have no keras-hub variable either.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, ConvKernel, Rule, RuleSet, Transpose
from objckpt.rules.hf_vit import layer_norm, encoder_forms, heads_of

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("deit",)
FORMS = {
    "original": (r"^(deit\.)?encoder\.layer\.\d+\.",
                 "what save_pretrained writes by default, read by every transformers version"),
    "transformers 5": (r"^(deit\.)?layers\.\d+\.",
                       "transformers 5's module names, written by save_pretrained("
                       "save_original_format=False)"),
}
PREFIXES = ("deit.", "")  # the first is what export writes
EMBEDDING = "operations/1"  # DeiTEmbeddings
ENCODER = "operations/2"  # DeiTEncoder

_WITH_TEACHER = ("cls_classifier.weight", "cls_classifier.bias",
                 "distillation_classifier.weight", "distillation_classifier.bias")
# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "DeiTModel": ("", ("pooler.dense.weight", "pooler.dense.bias")),
    "DeiTForImageClassification": ("deit.", ("classifier.weight", "classifier.bias")),
    "DeiTForImageClassificationWithTeacher": ("deit.", _WITH_TEACHER),
    "DeiTForMaskedImageModeling": ("deit.", ("deit.embeddings.mask_token", "decoder.0.weight",
                                             "decoder.0.bias")),
}
TASKS = {"DeiTImageClassifier": "DeiTForImageClassification"}


def _lacking(config: dict) -> str:
    """Why a folder has no `classifier.*` for keras-hub's DeiTImageClassifier."""
    named = config.get("architectures")
    hub = next((n for n in (named if isinstance(named, list) else ())
                if n in CLASSES and n != "DeiTForImageClassification"), "")
    if hub == "DeiTForImageClassificationWithTeacher":
        return (f"{hub} has no `classifier.*`: its logits average two heads (`cls_classifier` "
                "on the class token, `distillation_classifier` on the distillation token), "
                "which DeiTImageClassifier's one head does not compute; restore the folder "
                "into DeiTBackbone (its heads set aside)")
    if hub:
        return f"{hub} has no classifier (its folder holds no `classifier.*`)"
    return ("the folder holds no `classifier.*` (only DeiTForImageClassification has that "
            "head)")


def _heads(config: dict) -> list:
    def having(entry):
        return ", ".join(n for n, (_, heads) in CLASSES.items() if entry in heads)

    why = _lacking(config)
    out = [Rule("classifier.weight", "output_dense/kernel", Transpose(),
                head=having("classifier.weight"), absent=why),
           Rule("classifier.bias", "output_dense/bias", head=having("classifier.bias"),
                absent=why)]
    for entry in ("pooler.dense.weight", "pooler.dense.bias", *_WITH_TEACHER,
                  "deit.embeddings.mask_token", "embeddings.mask_token", "decoder.0.weight",
                  "decoder.0.bias"):
        out.append(Rule(entry, f"{NOWHERE}/{entry}",
                        head=having(entry) or having("deit." + entry)))
    return out


def _bare(config: dict) -> list:
    """The backbone's rules without a prefix, the original form first (export's)."""
    hidden, heads = heads_of(config, "DeiT")
    out = [
        Rule("embeddings.patch_embeddings.projection.weight",
             f"{EMBEDDING}/patch_embedding/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embeddings.projection.bias", f"{EMBEDDING}/patch_embedding/bias"),
        Rule("embeddings.cls_token", f"{EMBEDDING}/class_token"),
        Rule("embeddings.distillation_token", f"{EMBEDDING}/distillation_token"),
        Rule("embeddings.position_embeddings", f"{EMBEDDING}/position_embedding"),
        *layer_norm("layernorm", f"{ENCODER}/layer_norm"),
    ]
    forms = encoder_forms(hidden, heads, f"{ENCODER}/encoder_layers/{{i}}",
                          mlp=("mlp/dense", "output_layer/dense"))
    for layers in forms.values():
        out += layers
    return out


def rules(config: dict) -> RuleSet:
    """The DeiT rule set for a Hugging Face config (`hidden_size`, `num_attention_heads`).

    Example:
      >>> rules = objckpt.rules.huggingface("deit", config=hf_config)
      >>> objckpt.restore(keras_hub.models.DeiTBackbone(...), "deit_dir", rules=rules)
    """
    root = "backbone/" if config.get("task", "") in TASKS else ""
    out = [Rule(prefix + rule.source, root + rule.target, rule.transform)
           for prefix in PREFIXES for rule in _bare(config)]
    return RuleSet(out + _heads(config), alternatives=True, name="huggingface('deit')",
                   classes=TASKS)
