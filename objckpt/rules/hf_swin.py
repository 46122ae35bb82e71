"""Hugging Face Swin (`SwinModel`, `SwinForImageClassification`) <-> keras-hub's
`SwinTransformerBackbone`.

Names and layouts follow keras-hub's own importer (`convert_swin_transformer.py`): the patch
projection is a torch `Conv2d` kernel (out, in, h, w) <-> a Keras `Conv2D` kernel (h, w, in,
out); a `Linear` weight (out, in) is a Keras kernel (in, out); the query, key and value
projections (each (dim, dim)) are the three thirds of keras-hub's fused `qkv` kernel (dim, 3
dim) and bias, in that order (export splits them back); each block's relative position bias
table ((2 window - 1)^2, heads) is keras-hub's as it is. The lookup index of that table is a
buffer computed from the window size: transformers 4 saved it
(`attention.self.relative_position_index`), transformers 5 does not; an entry of it is set
aside (keras-hub computes its own). Each stage but the last ends with a patch merging
(`downsample.reduction`, a `Linear` without bias, and its norm). keras-hub's stages are the
backbone's layers 3, 4, ... (`operations/3/blocks/0/attn/qkv/kernel`): the targets are object
paths, one rule per stage (the config's `depths` say how many).

Restore accepts the names bare (`SwinModel`) or under `swin.` (the task classes); export
writes a backbone's bare and a task model's under `swin.`, as its Hub class does (keras-hub's
importer reads either).

Key forms (`FORMS`): transformers 5 renames the attention (`attention.q_proj` for
`attention.self.query`, ..., `attention.o_proj` for `attention.output.dense`, the table as
`attention.relative_position_bias.relative_position_bias_table`) and the MLP (`mlp.fc1`,
`mlp.fc2`) (`conversion_mapping.py`, `"swin"`); `save_pretrained(save_original_format=False)`
writes those names. Restore accepts either form; export writes the original.

Hub classes (`CLASSES`): `SwinForImageClassification`'s classifier (a `Linear` on the mean of
the last stage's tokens after the final norm) is keras-hub's `SwinTransformerImageClassifier`
head, restored there and set aside in the backbone. `SwinForMaskedImageModeling`'s decoder and
mask token have no keras-hub variable. `SwinBackbone` (per-stage output norms, no final norm)
is not keras-hub's backbone and has no set.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Concat, ConvKernel, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("swin",)
_BLOCK = r"^(swin\.)?encoder\.layers\.\d+\.blocks\.\d+\.attention\."
FORMS = {
    "original": (_BLOCK + r"self\.",
                 "what save_pretrained writes by default, read by every transformers version"),
    "transformers 5": (_BLOCK + r"[qkvo]_proj\.",
                       "transformers 5's module names, written by save_pretrained("
                       "save_original_format=False)"),
}
FIRST_STAGE = 3  # keras-hub's backbone: input, patch embedding, dropout, the stages, the norm

_CLASSIFIER = ("classifier.weight", "classifier.bias")
_MASKED = ("swin.embeddings.mask_token", "decoder.0.weight", "decoder.0.bias")
# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "SwinModel": ("", ()),
    "SwinForImageClassification": ("swin.", _CLASSIFIER),
    "SwinForMaskedImageModeling": ("swin.", _MASKED),
}
TASKS = {"SwinTransformerImageClassifier": "SwinForImageClassification"}

# A block's entries in each form (the first: the original, export's).
_BLOCK_NAMES = {
    "original": {"query": "attention.self.query", "key": "attention.self.key",
                 "value": "attention.self.value", "output": "attention.output.dense",
                 "table": "attention.self.relative_position_bias_table",
                 "fc1": "intermediate.dense", "fc2": "output.dense"},
    "transformers 5": {"query": "attention.q_proj", "key": "attention.k_proj",
                       "value": "attention.v_proj", "output": "attention.o_proj",
                       "table": "attention.relative_position_bias.relative_position_bias_table",
                       "fc1": "mlp.fc1", "fc2": "mlp.fc2"},
}


def _depths(config: dict) -> int:
    """How many stages the config describes; InvalidArgumentError for sizes the set cannot
    use."""
    from objckpt import errors

    embed_dim, depths = config.get("embed_dim"), config.get("depths")
    if type(embed_dim) is not int or embed_dim <= 0:
        raise errors.InvalidArgumentError(
            f"The Swin rule set needs `embed_dim` (a positive int) from the Hugging Face "
            f"config; received {embed_dim!r}. Fix: pass the checkpoint's folder (its "
            "config.json), or config={'embed_dim': ..., 'depths': [...]}.")
    if not isinstance(depths, (list, tuple)) or not depths or not all(
            type(d) is int and d > 0 for d in depths):
        raise errors.InvalidArgumentError(
            f"The Swin rule set needs `depths` (a list of positive ints, the blocks of each "
            f"stage) from the Hugging Face config; received {depths!r}. Fix: pass the "
            "checkpoint's folder (its config.json), or config={'embed_dim': ..., "
            "'depths': [...]}.")
    return len(depths)


def _layer_norm(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


def _dense(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def _block(stage: int, form: str, names: dict) -> list:
    """A stage's blocks (`{b}`) in the form `form`: the original's every entry, another
    form's those it names differently."""
    source = f"encoder.layers.{stage}.blocks.{{b}}"
    target = f"operations/{FIRST_STAGE + stage}/blocks/{{b}}"
    out = []
    for index, name in enumerate(("query", "key", "value")):  # thirds of the fused qkv
        out += [Rule(f"{source}.{names[name]}.weight", f"{target}/attn/qkv/kernel",
                     Chain(Transpose(), Concat(1, parts=3, index=index))),
                Rule(f"{source}.{names[name]}.bias", f"{target}/attn/qkv/bias",
                     Concat(0, parts=3, index=index))]
    out += [
        *_dense(f"{source}.{names['output']}", f"{target}/attn/proj"),
        Rule(f"{source}.{names['table']}", f"{target}/attn/relative_position_bias_table"),
        *_dense(f"{source}.{names['fc1']}", f"{target}/mlp/fc1"),
        *_dense(f"{source}.{names['fc2']}", f"{target}/mlp/fc2"),
    ]
    if form == "original":
        index = f"{source}.attention.self.relative_position_index"
        out += [*_layer_norm(f"{source}.layernorm_before", f"{target}/norm1"),
                *_layer_norm(f"{source}.layernorm_after", f"{target}/norm2"),
                # a buffer transformers 4 saved; keras-hub computes its own
                Rule(index, f"{NOWHERE}/{index}",
                     head="transformers 4's Swin files (a buffer, computed from "
                          "window_size)")]
    return out


def _bare(config: dict) -> list:
    """The backbone's rules without a prefix, the original form first (export's)."""
    stages = _depths(config)
    out = [
        Rule("embeddings.patch_embeddings.projection.weight", "patch_embedding/proj/kernel",
             ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embeddings.projection.bias", "patch_embedding/proj/bias"),
        *_layer_norm("embeddings.norm", "patch_embedding/norm"),
        *_layer_norm("layernorm", "norm"),
    ]
    for stage in range(stages - 1):  # the last stage merges no patches
        target = f"operations/{FIRST_STAGE + stage}/downsample"
        out += [Rule(f"encoder.layers.{stage}.downsample.reduction.weight",
                     f"{target}/reduction/kernel", Transpose()),
                *_layer_norm(f"encoder.layers.{stage}.downsample.norm", f"{target}/norm")]
    for form, names in _BLOCK_NAMES.items():
        for stage in range(stages):
            out += _block(stage, form, names)
    return out


def _heads(config: dict) -> list:
    def having(entry):
        return ", ".join(n for n, (_, heads) in CLASSES.items() if entry in heads)

    named = config.get("architectures")
    hub = next((n for n in (named if isinstance(named, list) else ())
                if n in CLASSES and n != "SwinForImageClassification"), "")
    why = (f"{hub} has no classifier (its folder holds no `classifier.*`)" if hub else
           "the folder holds no `classifier.*` (only SwinForImageClassification has that "
           "head)")
    out = [Rule("classifier.weight", "output_dense/kernel", Transpose(),
                head=having("classifier.weight"), absent=why),
           Rule("classifier.bias", "output_dense/bias", head=having("classifier.bias"),
                absent=why)]
    for entry in _MASKED:
        out.append(Rule(entry, f"{NOWHERE}/{entry}", head=having(entry)))
    return out


def rules(config: dict) -> RuleSet:
    """The Swin rule set for a Hugging Face config (`embed_dim`, `depths`).

    Example:
      >>> rules = objckpt.rules.huggingface("swin", config=hf_config)
      >>> objckpt.restore(keras_hub.models.SwinTransformerBackbone(...), "swin_dir",
      ...                 rules=rules)
    """
    is_task = config.get("task", "") in TASKS
    root = "backbone/" if is_task else ""
    prefixes = ("swin.", "") if is_task else ("", "swin.")  # the first is what export writes
    out = [Rule(prefix + rule.source, root + rule.target, rule.transform, head=rule.head)
           for prefix in prefixes for rule in _bare(config)]
    return RuleSet(out + _heads(config), alternatives=True, name="huggingface('swin')",
                   classes=TASKS)
