"""Hugging Face PaliGemma (`PaliGemmaForConditionalGeneration`, `PaliGemmaModel`, model type
`paligemma`) <-> keras-hub's `PaliGemmaBackbone`.

Three parts, named as keras-hub's importer `convert_pali_gemma.py` reads them:

- the text decoder (`text_config`, a Gemma): Gemma's rules (`objckpt.rules.hf_gemma`) under
  `language_model.model.`. keras-hub's embedding has `image_token_index` rows (its
  vocabulary stops before the image token): where the text config's `vocab_size` is larger
  (the Hub's checkpoints: 257216 against 257152) restore drops the rows from there on
  (`Crop`) and export writes zeros in their place (`Pad`);
- the SigLIP vision tower (`vision_config`) <-> keras-hub's `image_encoder`: the rules of
  Gemma 3's tower (`objckpt.rules.hf_gemma3_vision.vision_rules`), the same layers;
- the projector: `multi_modal_projector.linear` (a `Linear`, vision hidden -> text hidden)
  <-> `image_classifier` (a `Dense`: the weight transposed).

What keras-hub's importer builds from the config: its head size is the text config's
`num_image_tokens` (transformers sets that to the image's patch count), not `head_dim`; the
set reshapes by `head_dim`, so a checkpoint whose two differ restores only into a backbone
built with `head_dim`. PaliGemma 2 (a Gemma 2 text decoder) is refused: keras-hub's importer
builds Gemma 1's decoder.

Key forms (`FORMS`, as Gemma 3's): the Hub's folders name the tower
`vision_tower.vision_model.` ("original", what keras-hub's importer reads and export
writes); transformers 5 saves it without `vision_model.` ("transformers 5"), under `model.`
with `save_original_format=False`. Restore accepts every spelling.

Hub classes (`CLASSES`): `PaliGemmaForConditionalGeneration`'s `lm_head.weight` is tied to
the token embedding (set aside where a folder has it); keras-hub's `PaliGemmaCausalLM` has
no variable beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules import hf_gemma
from objckpt.rules.core import Crop, Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma3_vision import (FORMS, PROJECTOR_PREFIXES, TEXT_PREFIXES,
                                             VISION_PREFIXES, siglip_head, vision_rules)
from objckpt.rules.hf_llama import config_part, config_size, head_rules

__all__ = ["FORMS", "MODEL_TYPES", "rules"]

MODEL_TYPES = ("paligemma",)
CLASSES = {
    "PaliGemmaModel": ("", ()),
    "PaliGemmaForConditionalGeneration": ("", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"PaliGemmaCausalLM": "PaliGemmaForConditionalGeneration"}
MODEL = "PaliGemma"


def _invalid(text: str, fix: str):
    """The error for a config the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"The {MODEL} rule set {text} Fix: {fix}")


def _part(config: dict, key: str) -> dict:
    return config_part(config, key, MODEL, "{'text_config': {...}, 'vision_config': {...}, "
                       "'image_token_index': ...}")


def _decoder(config: dict, text: dict) -> list:
    kind = str(text.get("model_type", "gemma")).lower()
    if kind != "gemma":
        raise _invalid(
            f"reads a Gemma text decoder (`text_config.model_type` 'gemma'); received "
            f"{kind!r}: keras-hub's importer (convert_pali_gemma.py) builds Gemma 1's decoder, "
            "not PaliGemma 2's.", "restore PaliGemma 1 checkpoints, or "
            "write the rules with objckpt.rules.Rule for a backbone built to match.")
    for key in ("hidden_size", "num_attention_heads", "head_dim"):
        config_size(text, key, MODEL)
    rows = config_size(config, "image_token_index", MODEL)
    vocabulary = config_size(text, "vocab_size", MODEL, rows)
    decoder = [r for r in hf_gemma.rules({**text, "model_type": "gemma"})
               if r.source.startswith("model.")]
    if vocabulary > rows:  # keras-hub's vocabulary stops before the image token
        decoder = [Rule(r.source, r.target, Crop(axis=0, after=vocabulary - rows))
                   if r.source == "model.embed_tokens.weight" else r for r in decoder]
    return decoder


def rules(config: dict) -> RuleSet:
    """The PaliGemma rule set for a Hugging Face config (`text_config`, `vision_config`,
    `image_token_index`: their sizes decide the reshapes and the embedding's rows).

    Example:
      >>> rules = objckpt.rules.huggingface("paligemma", config=hf_config)
      >>> objckpt.restore(keras_hub.models.PaliGemmaBackbone(...), "pg_dir", rules=rules)
    """
    text, vision = _part(config, "text_config"), _part(config, "vision_config")
    decoder = _decoder(config, text)
    out = [r.with_source(prefix + r.source[len("model."):])
           for prefix in TEXT_PREFIXES for r in decoder]
    tower = vision_rules(vision, MODEL)
    out += [r.with_source(prefix + r.source) for prefix in VISION_PREFIXES for r in tower]
    projector = [Rule("linear.weight", "image_classifier/kernel", Transpose()),
                 Rule("linear.bias", "image_classifier/bias")]
    out += [r.with_source(prefix + r.source) for prefix in PROJECTOR_PREFIXES
            for r in projector]
    out += siglip_head(", ".join(CLASSES))
    return RuleSet(out + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('paligemma')", classes=TASKS)
