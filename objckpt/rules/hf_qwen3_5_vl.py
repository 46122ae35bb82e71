"""Hugging Face Qwen3.5 and Qwen3.5-MoE as published (`Qwen3_5ForConditionalGeneration`,
`Qwen3_5MoeModel`, ..., `model_type` "qwen3_5" and "qwen3_5_moe": a text decoder and a vision
tower) <-> keras-hub's `Qwen3_5Backbone` and `Qwen3_5MoeBackbone` (with the vision encoder
keras-hub's importers build from `vision_config`, or without one).

The decoder is Qwen3.5's (Qwen3.5-MoE's) text decoder (`objckpt.rules.hf_qwen3_5`,
`hf_qwen3_5_moe`: the experts in either key form; its sizes read from `text_config`) under
`model.language_model.` (the base classes: `language_model.`). The vision tower, the same in
both, under `model.visual.` (`visual.`), follows keras-hub's importers
(`convert_qwen3_5.py`, `convert_qwen3_5_moe.py`): the patch embedding's `Conv3d` weight (out,
in, t, h, w) <-> Keras's `Conv3D` kernel (t, h, w, in, out); each block's LayerNorms
(`norm1`, `norm2`: `gamma`, `beta`), its fused `attn.qkv` and `attn.proj`, its
`mlp.linear_fc1|2` (-> `mlp/fc1|2`), transposed; the position table as it is; the merger's
`norm` (-> `ln_q`), `linear_fc1` (-> `mlp_0`) and `linear_fc2` (-> `mlp_2`). keras-hub names
the vision encoder by Keras's automatic name, with a counter of the session
(`qwen3_5_vision_encoder_1`): the set is made for the model it restores or exports (the
operations do so themselves), reading that name from the model. Into a backbone built
without a vision encoder the tower's entries are set aside (listed as the vision tower).

`lm_head.weight` feeds the untied output embedding (`tie_word_embeddings`, at the top of the
config, false); tied, it is set aside and the token embedding is both.
"""

from __future__ import annotations

import re

from objckpt.rules.core import NOWHERE, Rule, RuleSet, Transpose
from objckpt.rules.hf_moe import variable_paths
from objckpt.rules.hf_qwen3_5 import decoder_rules
from objckpt.rules.hf_qwen3_5_moe import decoder_rules as moe_rules

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
PER_MODEL = True  # the vision encoder's automatic name is read from the model
# model_type -> (the set's name in errors, the Hub classes' stem)
_KINDS = {"qwen3_5": ("Qwen3.5", "Qwen3_5"), "qwen3_5_moe": ("Qwen3.5-MoE", "Qwen3_5Moe")}
# Hub class -> (its decoder prefix, head entries as transformers names them)
CLASSES = {name: value for stem in ("Qwen3_5", "Qwen3_5Moe") for name, value in (
    (f"{stem}Model", ("language_model.", ())),
    (f"{stem}ForConditionalGeneration", ("model.language_model.", ("lm_head.weight",))))}
# keras-hub task model -> the Hub class of its heads (export's `architectures`)
TASKS = {"Qwen3_5CausalLM": "Qwen3_5ForConditionalGeneration",
         "Qwen3_5MoeCausalLM": "Qwen3_5MoeForConditionalGeneration"}
_ENCODER = "qwen3_5_vision_encoder"
_TOWER = "the vision tower (a Qwen3_5Backbone built without a vision encoder has none)"


def encoder_name(model=None) -> str:
    """The vision encoder's layer name in `model` (else the first one a session builds)."""
    for path in variable_paths(model) if model is not None else ():
        found = re.search(rf"(?:^|/)({_ENCODER}(?:_\d+)?)/patch_embed/", path)
        if found:
            return found.group(1)
    return _ENCODER


def _tower(encoder: str) -> list:
    def rule(source, target, transform=None):
        return Rule(f"visual.{source}", f"{encoder}/{target}", transform, head=_TOWER)

    block = "blocks.{b}"
    out = [rule("patch_embed.proj.weight", "patch_embed/proj/kernel",
                Transpose((2, 3, 4, 1, 0))),
           rule("patch_embed.proj.bias", "patch_embed/proj/bias"),
           rule("pos_embed.weight", "pos_embed/embeddings")]
    for hf, keras in (("norm1", "norm1"), ("norm2", "norm2"), ("merger.norm", "merger/ln_q")):
        where = hf if hf.startswith("merger") else f"{block}.{hf}"
        at = keras if keras.startswith("merger") else "blocks_{b}/" + keras
        out += [rule(f"{where}.weight", f"{at}/gamma"), rule(f"{where}.bias", f"{at}/beta")]
    for hf, keras in (("attn.qkv", "attn/qkv"), ("attn.proj", "attn/proj"),
                      ("mlp.linear_fc1", "mlp/fc1"), ("mlp.linear_fc2", "mlp/fc2"),
                      ("merger.linear_fc1", "merger/mlp_0"),
                      ("merger.linear_fc2", "merger/mlp_2")):
        where = hf if hf.startswith("merger") else f"{block}.{hf}"
        at = keras if keras.startswith("merger") else "blocks_{b}/" + keras
        out += [rule(f"{where}.weight", f"{at}/kernel", Transpose()),
                rule(f"{where}.bias", f"{at}/bias")]
    return out


def rules(config: dict, model=None) -> RuleSet:
    """The Qwen3.5 rule set for a Hugging Face config (the decoder's sizes from
    `text_config`, `tie_word_embeddings`), its vision targets named as `model`'s encoder is.

    Example:
      >>> rules = objckpt.rules.huggingface("Qwen3.5-0.8B")  # the folder
      >>> objckpt.restore(keras_hub.models.Qwen3_5CausalLM(...), "Qwen3.5-0.8B", rules=rules)
    """
    model_type = str(config.get("model_type", "qwen3_5")).lower()
    shown, stem = _KINDS.get(model_type, _KINDS["qwen3_5"])
    tasks = {k: v for k, v in TASKS.items() if v.startswith(stem + "For")}
    text = config.get("text_config")
    text = dict(text) if isinstance(text, dict) else dict(config)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings")))
    hub = tasks.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else "model.language_model."
    prefixes = list(dict.fromkeys([first, "model.language_model.", "language_model."]))
    decoder = moe_rules(text) if stem == "Qwen3_5Moe" else decoder_rules(text, shown)
    tower = _tower(encoder_name(model))
    towers = list(dict.fromkeys(["model." if first.startswith("model.") else "", "model.", ""]))
    head = f"{stem}ForConditionalGeneration"
    lm_head = (Rule("lm_head.weight", f"{NOWHERE}/lm_head.weight",
                    head=head + " (tied to the token embedding)") if tied else
               Rule("lm_head.weight", "token_embedding/reverse_embeddings", Transpose(),
                    head=head))
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in decoder]
                   + [rule.with_source(prefix + rule.source) for prefix in towers
                      for rule in tower] + [lm_head],
                   alternatives=True, name=f"huggingface({model_type!r})", classes=tasks)
