"""Hugging Face DINOv2 (`Dinov2Model`, `Dinov2WithRegistersModel`, ...) <-> keras-hub's
`DINOV2Backbone`.

Names and layouts follow keras-hub's own importer (`convert_dinov2.py`, which reads both
model types): the patch projection is a torch `Conv2d` kernel (out, in, h, w) <-> a Keras
`Conv2D` kernel (h, w, in, out); a `Linear` weight (out, in) is a Keras kernel (in, out);
query/key/value (hidden, hidden) <-> (hidden, heads, head_dim), their biases <-> (heads,
head_dim), the attention output <-> (heads, head_dim, hidden). The layer scales
(`layer_scale1.lambda1`, `layer_scale2.lambda1`), the class, mask and register tokens and the
position embeddings keep their shapes. keras-hub computes with `interpolated_position_
embeddings`, which its importer sets from the position embeddings resized from the config's
`image_size` to the backbone's `image_shape` (the same size for the backbone it builds: a
copy): the folder's position embeddings feed both variables (tied), and export writes them
once (a model whose two differ, after training the interpolated ones, is refused by export's
tie check, naming both). A backbone built for another image size (the interpolated ones of
another shape) is refused with a shape error: resizing is a computation, not a layout. A
SwiGLU MLP (`use_swiglu_ffn`) is `mlp.weights_in` (the gate's and the up projection's rows,
one tensor) and `mlp.weights_out`, as keras-hub's.

Restore accepts the names bare (`Dinov2Model`) or under the class's prefix (`dinov2.`,
`dinov2_with_registers.`: the image classifiers); export writes them bare, the form
keras-hub's importer reads and every transformers class loads.

Key forms (`FORMS`): transformers 5 renames the attention (`attention.q_proj` for
`attention.attention.query`, ..., `attention.o_proj` for `attention.output.dense`) and splits
a SwiGLU's `weights_in` into `gate_proj` and `up_proj` (halves, in that order), `weights_out`
being `down_proj` (`conversion_mapping.py`, `"Dinov2Model"` and `"Dinov2WithRegistersModel"`);
`save_pretrained(save_original_format=False)` writes those names. Restore accepts either form
(the halves joined into keras-hub's one kernel); export writes the original.

Hub classes (`CLASSES`): keras-hub has no DINOv2 task model; the image classifiers' `classifier`
(a `Linear` on the class token beside the patch tokens' mean) is set aside. `Dinov2Backbone`
holds the base model's names.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Concat, ConvKernel, Reshape, Rule, RuleSet, \
    Transpose
from objckpt.rules.hf_vit import layer_norm, heads_of

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
_PREFIX = r"^(dinov2\.|dinov2_with_registers\.)?encoder\.layer\.\d+\.attention\."
FORMS = {
    "original": (_PREFIX + r"attention\.",
                 "what save_pretrained writes by default, read by every transformers version"),
    "transformers 5": (_PREFIX + r"[qkvo]_proj\.",
                       "transformers 5's module names, written by save_pretrained("
                       "save_original_format=False)"),
}

_HEAD = ("classifier.weight", "classifier.bias")
# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "Dinov2Model": ("", ()),
    "Dinov2ForImageClassification": ("dinov2.", _HEAD),
    "Dinov2Backbone": ("", ()),
    "Dinov2WithRegistersModel": ("", ()),
    "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers.", _HEAD),
    "Dinov2WithRegistersBackbone": ("", ()),
}
TASKS: dict = {}  # keras-hub has no DINOv2 task model

# Each encoder block's entries in each form (the first: the original, export's).
_LAYER_NAMES = {
    "original": {"query": "attention.attention.query", "key": "attention.attention.key",
                 "value": "attention.attention.value", "output": "attention.output.dense"},
    "transformers 5": {"query": "attention.q_proj", "key": "attention.k_proj",
                       "value": "attention.v_proj", "output": "attention.o_proj"},
}


def _heads() -> list:
    def having(entry):
        return ", ".join(n for n, (_, heads) in CLASSES.items() if entry in heads)

    return [Rule(entry, f"{NOWHERE}/{entry}", head=having(entry)) for entry in _HEAD]


def _layer(form: str, names: dict, hidden: int, heads: int) -> list:
    """An encoder block's rules in the form `form`: the original's every entry, another
    form's only those it names differently."""
    source, target = "encoder.layer.{i}", "encoder/layers/{i}"
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    out = []
    for name in ("query", "key", "value"):
        out += [Rule(f"{source}.{names[name]}.weight",
                     f"{target}/attention/attention/{name}_dense/kernel", into_heads),
                Rule(f"{source}.{names[name]}.bias",
                     f"{target}/attention/attention/{name}_dense/bias",
                     Reshape((hidden,), (heads, head_dim)))]
    out += [
        Rule(f"{source}.{names['output']}.weight",
             f"{target}/attention/attention/output_dense/kernel",
             Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))),
        Rule(f"{source}.{names['output']}.bias",
             f"{target}/attention/attention/output_dense/bias"),
    ]
    def dense(name: str, keras: str, transform=None) -> list:
        return [Rule(f"{source}.mlp.{name}.weight", f"{target}/mlp/{keras}/kernel",
                     Chain(Transpose(), transform) if transform else Transpose()),
                Rule(f"{source}.mlp.{name}.bias", f"{target}/mlp/{keras}/bias",
                     Concat(0, parts=2, index=transform.index) if transform else None)]

    if form == "original":
        out += [*layer_norm(f"{source}.norm1", f"{target}/norm1"),
                *layer_norm(f"{source}.norm2", f"{target}/norm2"),
                Rule(f"{source}.layer_scale1.lambda1", f"{target}/layer_scale1/lambda1"),
                Rule(f"{source}.layer_scale2.lambda1", f"{target}/layer_scale2/lambda1")]
        for name in ("fc1", "fc2", "weights_in", "weights_out"):  # SwiGLU's: the last two
            out += dense(name, name)
    else:  # SwiGLU's projections, the fused input one given in halves (gate, then up)
        out += dense("down_proj", "weights_out")
        for index, half in enumerate(("gate_proj", "up_proj")):
            out += dense(half, "weights_in", Concat(1, parts=2, index=index))
    return out


def _bare(config: dict) -> list:
    """The backbone's rules without a prefix, the original form first (export's)."""
    hidden, heads = heads_of(config, "DINOv2")
    out = [
        Rule("embeddings.cls_token", "embeddings/cls_token"),
        Rule("embeddings.mask_token", "embeddings/mask_token"),
        Rule("embeddings.register_tokens", "embeddings/register_tokens"),
        # keras-hub's importer sets both from the one entry (resized where the backbone's
        # image_shape differs from the config's image_size: it does not, built from it)
        Rule("embeddings.position_embeddings", "embeddings/position_embeddings"),
        Rule("embeddings.position_embeddings", "embeddings/interpolated_position_embeddings"),
        Rule("embeddings.patch_embeddings.projection.weight",
             "embeddings/patch_embeddings/projection/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embeddings.projection.bias",
             "embeddings/patch_embeddings/projection/bias"),
        *layer_norm("layernorm", "layernorm"),
    ]
    for form, names in _LAYER_NAMES.items():
        out += _layer(form, names, hidden, heads)
    return out


def rules(config: dict) -> RuleSet:
    """The DINOv2 rule set for a Hugging Face config (`hidden_size`,
    `num_attention_heads`; `model_type` names the classes' prefix).

    Example:
      >>> rules = objckpt.rules.huggingface("dinov2", config=hf_config)
      >>> objckpt.restore(keras_hub.models.DINOV2Backbone(...), "dinov2_dir", rules=rules)
    """
    model_type = str(config.get("model_type") or "dinov2")
    if model_type not in MODEL_TYPES:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The DINOv2 rule set covers the model types {', '.join(MODEL_TYPES)}; received "
            f"{model_type!r}. Fix: pass the checkpoint's own config.json.")
    prefixes = ("", f"{model_type}.")  # the first is what export writes
    out = [Rule(prefix + rule.source, rule.target, rule.transform)
           for prefix in prefixes for rule in _bare(config)]
    return RuleSet(out + _heads(), alternatives=True, name=f"huggingface({model_type!r})",
                   classes=TASKS)
