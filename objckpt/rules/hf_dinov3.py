"""Hugging Face DINOv3 ViT (`DINOv3ViTModel`) <-> keras-hub's `DINOV3Backbone`.

Names and layouts follow keras-hub's own importer (`convert_dinov3.py`): the patch projection
(`embeddings.patch_embeddings`, a torch `Conv2d`) kernel (out, in, h, w) <-> a Keras `Conv2D`
kernel (h, w, in, out); every `Linear` weight (out, in) is a Keras `Dense` kernel (in, out),
the attention's too (keras-hub's DINOv3 attention keeps them unsplit); the layer scales, the
class, mask and register tokens keep their shapes. The position information is rotary
(computed, no entry). Which biases exist follows the config (`query_bias`, `key_bias`,
`value_bias`, `proj_bias`, `mlp_bias`) in the folder and in keras-hub's backbone built from
it alike (the set has a rule for each; export writes the variables the model has); a gated
MLP (`use_gated_mlp`) adds `mlp.gate_proj`.

Key forms (`FORMS`): transformers 5 holds the blocks under `model.layer.{i}` (its
`conversion_mapping.py`, `"dinov3_vit"`, renames `layer.` to `model.layer.` at load), and
`save_pretrained` writes them back as `layer.{i}` unless told `save_original_format=False`.
Restore accepts either form; export writes the original, which keras-hub's importer reads.

Hub classes (`CLASSES`): `DINOv3ViTModel`; `DINOv3ViTBackbone` holds the same names. There is
no DINOv3 ViT task class in transformers and no task model in keras-hub.
"""

from __future__ import annotations

from objckpt.rules.core import ConvKernel, Rule, RuleSet, Transpose
from objckpt.rules.hf_vit import layer_norm, heads_of

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("dinov3_vit",)
FORMS = {
    "original": (r"^layer\.\d+\.",
                 "what save_pretrained writes by default, read by every transformers version"),
    "transformers 5": (r"^model\.layer\.\d+\.",
                       "transformers 5's module names, written by save_pretrained("
                       "save_original_format=False)"),
}
PREFIXES = ("", "model.")  # the blocks' in each form: the first is what export writes

# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {"DINOv3ViTModel": ("", ()), "DINOv3ViTBackbone": ("", ())}
TASKS: dict = {}  # keras-hub has no DINOv3 task model


def _dense(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def rules(config: dict) -> RuleSet:
    """The DINOv3 ViT rule set for a Hugging Face config (`hidden_size`,
    `num_attention_heads`, the bias flags).

    Example:
      >>> rules = objckpt.rules.huggingface("dinov3_vit", config=hf_config)
      >>> objckpt.restore(keras_hub.models.DINOV3Backbone(...), "dinov3_dir", rules=rules)
    """
    heads_of(config, "DINOv3")  # the sizes keras-hub's backbone needs, checked
    out = [
        Rule("embeddings.cls_token", "embeddings/cls_token"),
        Rule("embeddings.mask_token", "embeddings/mask_token"),
        Rule("embeddings.register_tokens", "embeddings/register_tokens"),
        Rule("embeddings.patch_embeddings.weight",
             "embeddings/patch_embeddings/projection/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embeddings.bias", "embeddings/patch_embeddings/projection/bias"),
        *layer_norm("norm", "layernorm"),
    ]
    target = "encoder/layers/{i}"
    for prefix in PREFIXES:
        source = prefix + "layer.{i}"
        out += [
            *layer_norm(f"{source}.norm1", f"{target}/norm1"),
            *layer_norm(f"{source}.norm2", f"{target}/norm2"),
            *_dense(f"{source}.attention.q_proj", f"{target}/attention/query_dense"),
            *_dense(f"{source}.attention.k_proj", f"{target}/attention/key_dense"),
            *_dense(f"{source}.attention.v_proj", f"{target}/attention/value_dense"),
            *_dense(f"{source}.attention.o_proj", f"{target}/attention/output_dense"),
            Rule(f"{source}.layer_scale1.lambda1", f"{target}/layer_scale1/lambda1"),
            Rule(f"{source}.layer_scale2.lambda1", f"{target}/layer_scale2/lambda1"),
        ]
        for name in ("gate_proj", "up_proj", "down_proj"):
            out += _dense(f"{source}.mlp.{name}", f"{target}/mlp/{name}")
    return RuleSet(out, alternatives=True, name="huggingface('dinov3_vit')", classes=TASKS)
