"""Hugging Face ViT (`ViTModel`, `ViTForImageClassification`) <-> keras-hub's `ViTBackbone`.

Names and layouts follow keras-hub's own importer (`convert_vit.py`): the patch projection
is a torch `Conv2d` kernel (out, in, h, w) <-> a Keras `Conv2D` kernel (h, w, in, out); a
`Linear` weight (out, in) is a Keras kernel (in, out); query/key/value (hidden, hidden) <->
(hidden, heads, head_dim), their biases (hidden,) <-> (heads, head_dim), the attention output
(hidden, hidden) <-> (heads, head_dim, hidden); the position embeddings (1, patches + 1,
hidden) <-> (patches + 1, hidden). keras-hub names its encoder blocks from 1
(`transformer_block_1`), so targets are object paths (`operations/2/encoder_layers/0/mha/
query_dense/kernel`: the encoder is the backbone's third layer), which restore matches and
export names.

Restore accepts the names with or without the `vit.` prefix (`ViTForImageClassification`
saves them under `vit.`, `ViTModel` bare); export writes `vit.`, the form keras-hub's
importer reads.

Key forms (`FORMS`): transformers 5 names the encoder's modules anew (`layers.{i}.attention.
q_proj` for `encoder.layer.{i}.attention.attention.query`, `attention.o_proj`, `mlp.fc1`,
`mlp.fc2`: its `conversion_mapping.py`, the `"ViTModel"` entry, which every ViT class picks up
through its `vit` submodule) and renames a folder's keys at load; `save_pretrained` renames
them back by default, `save_pretrained(save_original_format=False)` keeps the new ones.
Restore accepts either form (a folder's form is recognised from its keys; `huggingface`
refuses a folder that holds both); export writes the original form, which every transformers
version reads. Embeddings, the final norm and the heads are named alike in both.

Hub classes (`CLASSES`): `ViTModel`'s pooler (`pooler.dense.*`) has no keras-hub variable and
is set aside; `ViTForImageClassification`'s classifier (`classifier.*`, a `Linear`) is set
aside in the backbone and restored into keras-hub's `ViTImageClassifier` (its
`output_dense`), whose backbone sits under `backbone/` (the set for it, `huggingface(...,
model=classifier)`, as restore and export make it, targets that). `ViTForMaskedImageModeling`
has no keras-hub task model: its `decoder.*` and `embeddings.mask_token` are set aside.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, ConvKernel, Reshape, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("vit",)
# The key forms a folder may use: name -> (a regex that finds an encoder key of that form,
# how a folder comes to hold it); the first is what export writes.
FORMS = {
    "original": (r"^(vit\.)?encoder\.layer\.\d+\.",
                 "what save_pretrained writes by default, read by every transformers version"),
    "transformers 5": (r"^(vit\.)?layers\.\d+\.",
                       "transformers 5's module names, written by save_pretrained("
                       "save_original_format=False)"),
}
PREFIXES = ("vit.", "")  # the first is what export writes
EMBEDDING = "operations/1"  # ViTPatchingAndEmbedding
ENCODER = "operations/2"  # ViTEncoder

# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "ViTModel": ("", ("pooler.dense.weight", "pooler.dense.bias")),
    "ViTForImageClassification": ("vit.", ("classifier.weight", "classifier.bias")),
    "ViTForMaskedImageModeling": ("vit.", ("vit.embeddings.mask_token", "decoder.0.weight",
                                           "decoder.0.bias")),
}
TASKS = {"ViTImageClassifier": "ViTForImageClassification"}


def _heads() -> list:
    def having(entry):
        return ", ".join(n for n, (_, heads) in CLASSES.items() if entry in heads)

    out = [Rule("classifier.weight", "output_dense/kernel", Transpose(),
                head=having("classifier.weight")),
           Rule("classifier.bias", "output_dense/bias", head=having("classifier.bias"))]
    for entry in ("pooler.dense.weight", "pooler.dense.bias", "vit.embeddings.mask_token",
                  "embeddings.mask_token", "decoder.0.weight", "decoder.0.bias"):
        out.append(Rule(entry, f"{NOWHERE}/{entry}",
                        head=having(entry) or having("vit." + entry)))
    return out


def _size(config: dict, key: str, what: str = "ViT") -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {what} rule set needs `{key}` (a positive int) from the Hugging Face config; "
            f"received {value!r}. Fix: pass the checkpoint's folder (its config.json), or "
            f"config={{'hidden_size': ..., 'num_attention_heads': ...}}.")
    return value


def layer_norm(source: str, target: str) -> list:
    """A torch `LayerNorm`'s `weight` and `bias` <-> a Keras one's `gamma` and `beta`."""
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


# Each encoder block's entries in each form (the first: the original).
_LAYER_NAMES = {
    "original": {"source": "encoder.layer.{i}", "query": "attention.attention.query",
                 "key": "attention.attention.key", "value": "attention.attention.value",
                 "output": "attention.output.dense", "fc1": "intermediate.dense",
                 "fc2": "output.dense"},
    "transformers 5": {"source": "layers.{i}", "query": "attention.q_proj",
                       "key": "attention.k_proj", "value": "attention.v_proj",
                       "output": "attention.o_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"},
}


def heads_of(config: dict, what: str = "ViT") -> tuple:
    """(hidden_size, num_attention_heads) of the config; InvalidArgumentError naming the set
    (`what`) when either is no positive int or the heads do not divide the hidden size."""
    hidden = _size(config, "hidden_size", what)
    heads = _size(config, "num_attention_heads", what)
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {what} rule set needs hidden_size divisible by num_attention_heads; "
            f"received {hidden} and {heads}. Fix: pass the checkpoint's own config.json.")
    return hidden, heads


def encoder_forms(hidden: int, heads: int, target: str,
                  mlp: tuple = ("mlp/dense_1", "mlp/dense_2")) -> dict:
    """{form: the rules of each encoder block `{i}`} for a ViT-style encoder (ViT's, DeiT's)
    whose blocks keras-hub builds as `target` (with `{i}`) holding `mha`, `layer_norm_1`,
    `layer_norm_2` and the MLP's two Dense layers at the paths `mlp`."""
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    bias_heads = Reshape((hidden,), (heads, head_dim))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    forms = {}
    for form, names in _LAYER_NAMES.items():
        source = names["source"]
        layer = []
        for name in ("query", "key", "value"):
            layer += [Rule(f"{source}.{names[name]}.weight",
                           f"{target}/mha/{name}_dense/kernel", into_heads),
                      Rule(f"{source}.{names[name]}.bias",
                           f"{target}/mha/{name}_dense/bias", bias_heads)]
        layer += [
            Rule(f"{source}.{names['output']}.weight", f"{target}/mha/output_dense/kernel",
                 from_heads),
            Rule(f"{source}.{names['output']}.bias", f"{target}/mha/output_dense/bias"),
            *layer_norm(f"{source}.layernorm_before", f"{target}/layer_norm_1"),
            *layer_norm(f"{source}.layernorm_after", f"{target}/layer_norm_2"),
            Rule(f"{source}.{names['fc1']}.weight", f"{target}/{mlp[0]}/kernel",
                 Transpose()),
            Rule(f"{source}.{names['fc1']}.bias", f"{target}/{mlp[0]}/bias"),
            Rule(f"{source}.{names['fc2']}.weight", f"{target}/{mlp[1]}/kernel",
                 Transpose()),
            Rule(f"{source}.{names['fc2']}.bias", f"{target}/{mlp[1]}/bias"),
        ]
        forms[form] = layer
    return forms


def _bare(config: dict) -> tuple:
    """(the embeddings, {form: each encoder block's entries}, the final norm): the
    embeddings and the final norm are named alike in both forms."""
    hidden, heads = heads_of(config)
    out = [
        Rule("embeddings.patch_embeddings.projection.weight",
             f"{EMBEDDING}/patch_embedding/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embeddings.projection.bias", f"{EMBEDDING}/patch_embedding/bias"),
        Rule("embeddings.cls_token", f"{EMBEDDING}/class_token"),
        Rule("embeddings.position_embeddings", f"{EMBEDDING}/position_embedding/embeddings",
             Reshape((1, -1, hidden), (-1, hidden))),
    ]
    forms = encoder_forms(hidden, heads, f"{ENCODER}/encoder_layers/{{i}}")
    return out, forms, layer_norm("layernorm", f"{ENCODER}/layer_norm")


def rules(config: dict) -> RuleSet:
    """The ViT rule set for a Hugging Face config (`hidden_size`, `num_attention_heads`).

    Example:
      >>> rules = objckpt.rules.huggingface("vit", config=hf_config)
      >>> objckpt.restore(keras_hub.models.ViTBackbone(...), "vit_dir", rules=rules)
    """
    root = "backbone/" if config.get("task", "") in TASKS else ""
    embeddings, forms, final = _bare(config)
    out = []
    for index, layers in enumerate(forms.values()):  # the original form first: export's
        bare = embeddings + layers + final if index == 0 else layers
        out += [Rule(prefix + rule.source, root + rule.target, rule.transform)
                for prefix in PREFIXES for rule in bare]
    return RuleSet(out + _heads(), alternatives=True, name="huggingface('vit')",
                   classes=TASKS)
