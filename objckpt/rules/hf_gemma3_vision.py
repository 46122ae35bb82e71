"""Hugging Face's multimodal Gemma 3 (`Gemma3ForConditionalGeneration`, `Gemma3Model`, model
type `gemma3`) <-> keras-hub's `Gemma3Backbone` with a vision encoder.

Three parts, named as keras-hub's importer `convert_gemma3.py` reads them:

- the text decoder (`text_config`): Gemma 3's (`objckpt.rules.hf_gemma3.decoder_rules`),
  under `language_model.model.`;
- the SigLIP vision tower (`vision_config`) <-> keras-hub's `image_encoder`: the patch
  projection a torch `Conv2d` kernel (out, in, h, w) <-> a Keras `Conv2D` kernel (h, w, in,
  out); the position embedding (patches, hidden) as it is; each `Linear` weight (out, in) a
  Keras kernel (in, out), biases and layer norms as they are;
- the projector: `multi_modal_projector.mm_soft_emb_norm.weight` (an RMS norm over the
  vision width) <-> `vision_output_encoder/vision_soft_embedding_norm/scale`, and
  `multi_modal_projector.mm_input_projection_weight`, a parameter (vision hidden, text
  hidden) used as `x @ w`, <-> `vision_output_encoder/vision_input_projection/kernel` as it
  is.

What keras-hub builds from the config, not the weights: the average pooling of the patch
grid into image tokens (keras-hub pools by 4: a config whose `mm_tokens_per_image` asks
otherwise gives other outputs from the same tensors).

Key forms (`FORMS`), told apart by the vision tower's names: the Hub's folders and
keras-hub's importer name it `vision_tower.vision_model.` ("original"); transformers 5 loads
that and saves the tower without `vision_model.` ("transformers 5": `save_pretrained` by
default writes `language_model.model.`, `vision_tower.embeddings...`,
`multi_modal_projector.`; with `save_original_format=False` it writes its module names,
`model.language_model.`, `model.vision_tower.`, `model.multi_modal_projector.`, or without
`model.` for `Gemma3Model`). Restore accepts every one of these spellings; export writes the
original form, which keras-hub's importer and every transformers version read.

Hub classes (`CLASSES`): `lm_head.weight` (tied to the token embedding) and
`Gemma3ForSequenceClassification`'s `score.weight` have no keras-hub variable and are set
aside; keras-hub's `Gemma3CausalLM` has no variable beyond its backbone. SigLIP's pooling
head (`vision_tower.head.*`, present where `vision_config.vision_use_head` is true; the Hub's
Gemma 3 configs say false) is never read by Gemma 3 and is set aside too.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, ConvKernel, Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma3 import decoder_rules
from objckpt.rules.hf_llama import config_part, config_size, head_rules

__all__ = ["FORMS", "MODEL_TYPES", "rules", "siglip_head", "vision_rules"]

MODEL_TYPES = ("gemma3",)
FORMS = {
    "original": (r"^(model\.)?vision_tower\.vision_model\.",
                 "the Hub's folders' names, read by keras-hub's importer"),
    "transformers 5": (r"^(model\.)?vision_tower\.(?!vision_model\.)",
                       "what transformers 5's save_pretrained writes (the vision tower "
                       "without `vision_model.`)"),
}
# Each part's prefixes in a folder, the first what export writes.
TEXT_PREFIXES = ("language_model.model.", "model.language_model.", "language_model.")
VISION_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.",
                   "vision_tower.", "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
CLASSES = {
    "Gemma3Model": ("", ()),
    "Gemma3ForConditionalGeneration": ("", ("lm_head.weight",)),
    "Gemma3ForSequenceClassification": ("", ("score.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma3CausalLM": "Gemma3ForConditionalGeneration"}
ENCODER = "image_encoder"
OUTPUT = "vision_output_encoder"
# SigLIP's pooling head, under the vision tower's prefix
_SIGLIP_HEAD = ("head.probe", "head.attention.in_proj_weight", "head.attention.in_proj_bias",
                "head.attention.out_proj.weight", "head.attention.out_proj.bias",
                "head.layernorm.weight", "head.layernorm.bias", "head.mlp.fc1.weight",
                "head.mlp.fc1.bias", "head.mlp.fc2.weight", "head.mlp.fc2.bias")


def _part(config: dict, key: str) -> dict:
    return config_part(config, key, "Gemma 3 (multimodal)", "{'text_config': {...}, "
                       "'vision_config': {...}}; a text-only Gemma 3 is model type "
                       "'gemma3_text'")


def _dense(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def _layer_norm(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


def vision_rules(vision: dict, model: str) -> list:
    """The SigLIP tower's rules, its entries unprefixed (`embeddings.`, `encoder.layers.{i}.`,
    `post_layernorm.`), for a vision config."""
    for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
        config_size(vision, key, model)
    embeddings = f"{ENCODER}/encoder_embeddings"
    block, layer = f"{ENCODER}/encoder_block_{{i}}", "encoder.layers.{i}"
    out = [
        Rule("embeddings.patch_embedding.weight", f"{embeddings}/embedding_conv/kernel",
             ConvKernel("OIHW", "HWIO")),
        Rule("embeddings.patch_embedding.bias", f"{embeddings}/embedding_conv/bias"),
        Rule("embeddings.position_embedding.weight",
             f"{embeddings}/position_embedding/embeddings"),
        *_layer_norm("post_layernorm", f"{ENCODER}/encoder_layer_norm"),
        *_layer_norm(f"{layer}.layer_norm1", f"{block}/layer_norm_1"),
        *_layer_norm(f"{layer}.layer_norm2", f"{block}/layer_norm_2"),
        *_dense(f"{layer}.mlp.fc1", f"{block}/mlp_dense_1"),
        *_dense(f"{layer}.mlp.fc2", f"{block}/mlp_dense_2"),
    ]
    for source, target in (("q_proj", "query_proj"), ("k_proj", "key_proj"),
                           ("v_proj", "value_proj"), ("out_proj", "out_proj")):
        out += _dense(f"{layer}.self_attn.{source}", f"{block}/multi_head_attention/{target}")
    return out


def siglip_head(classes: str) -> list:
    """SigLIP's pooling head (`vision_tower.head.*`, in every spelling of the tower), set
    aside as a head of `classes`: the model never runs it."""
    return [Rule(prefix + entry, f"{NOWHERE}/vision_tower.{entry}",
                 head=f"{classes} (SigLIP's pooling head, which the model never runs)")
            for prefix in VISION_PREFIXES for entry in _SIGLIP_HEAD]


def rules(config: dict) -> RuleSet:
    """The multimodal Gemma 3 rule set for a Hugging Face config (`text_config` and
    `vision_config`: their sizes decide the reshapes).

    Example:
      >>> rules = objckpt.rules.huggingface("gemma3", config=hf_config)
      >>> objckpt.restore(keras_hub.models.Gemma3Backbone(...), "gemma3_dir", rules=rules)
    """
    model = "Gemma 3 (multimodal)"
    text, vision = _part(config, "text_config"), _part(config, "vision_config")
    decoder = decoder_rules(text, model)
    out = [r.with_source(prefix + r.source[len("model."):])
           for prefix in TEXT_PREFIXES for r in decoder]
    tower = vision_rules(vision, model)
    out += [r.with_source(prefix + r.source) for prefix in VISION_PREFIXES for r in tower]
    projector = [Rule("mm_soft_emb_norm.weight", f"{OUTPUT}/vision_soft_embedding_norm/scale"),
                 Rule("mm_input_projection_weight", f"{OUTPUT}/vision_input_projection/kernel")]
    out += [r.with_source(prefix + r.source) for prefix in PROJECTOR_PREFIXES
            for r in projector]
    out += siglip_head(", ".join(CLASSES))
    return RuleSet(out + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('gemma3')", classes=TASKS)
