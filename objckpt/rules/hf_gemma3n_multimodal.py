"""Hugging Face's multimodal Gemma 3n (`Gemma3nForConditionalGeneration`, `Gemma3nModel`, model
type `gemma3n`) <-> keras-hub's `Gemma3nBackbone` with its vision and audio encoders.
Checked against folders of both classes that transformers wrote (it builds the vision tower
with timm: a tiny MobileNetV5 from the vision config's timm `model_args`, whose
`block_args` the vision rules read) and against keras-hub's importer (both ways); the audio
tower also against a `Gemma3nAudioEncoder` transformers wrote, the text decoder as the
`gemma3n_text` set.

The parts, named as keras-hub's importer `convert_gemma3n.py` reads them, under `model.` in
`Gemma3nForConditionalGeneration` and bare in `Gemma3nModel`:

- `language_model.`: the text decoder (`text_config`), the `gemma3n_text` set's
  (`objckpt.rules.hf_gemma3n`);
- `vision_tower.timm_model.`: the MobileNetV5 tower (`vision_config`'s `architecture`),
  `objckpt.rules.hf_gemma3n_vision`;
- `audio_tower.`, `embed_audio.`, `embed_vision.`: the Conformer audio tower (`audio_config`)
  and the two embedders, `objckpt.rules.hf_gemma3n_audio`.

Hub classes (`CLASSES`): `lm_head.weight` (tied to the token embedding) has no keras-hub
variable and is set aside; keras-hub's `Gemma3nCausalLM` has none beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules.core import RuleSet
from objckpt.rules.hf_gemma3n import decoder_rules
from objckpt.rules.hf_gemma3n_audio import audio_rules, embedder_rules
from objckpt.rules.hf_gemma3n_vision import ARCHITECTURES, block_strings, tower_rules
from objckpt.rules.hf_llama import config_part, head_rules

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("gemma3n",)
CLASSES = {
    "Gemma3nModel": ("", ()),
    "Gemma3nForConditionalGeneration": ("model.", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma3nCausalLM": "Gemma3nForConditionalGeneration"}
_MODEL = "Gemma 3n (multimodal)"


def _refuse(what: str, fix: str):
    from objckpt import errors

    raise errors.InvalidArgumentError(f"The {_MODEL} rule set {what}. Fix: {fix}")


def _part(config: dict, key: str) -> dict:
    return config_part(config, key, _MODEL, "{'text_config': {...}, 'audio_config': {...}, "
                       "'vision_config': {...}}; a text-only Gemma 3n is model type "
                       "'gemma3n_text'")


# the timm `model_args` a vision config may hold: the tower's blocks (`block_args`, timm's
# decoded blocks) and sizes that change no entry's name
_MODEL_ARGS = ("block_args", "stem_size", "msfa_output_resolution")


def _tower(vision: dict):
    """The architecture definition of the vision config's timm `architecture`, its blocks
    from `model_args["block_args"]` where given."""
    name = vision.get("architecture", "mobilenetv5_300m_enc")
    model_args = vision.get("model_args") or {}
    others = sorted(set(model_args) - set(_MODEL_ARGS)) if isinstance(model_args, dict) \
        else model_args
    if name not in ARCHITECTURES or others:
        _refuse(f"knows the vision towers {sorted(ARCHITECTURES)} as timm builds them, with "
                f"`model_args` of {list(_MODEL_ARGS)} at most; the vision_config has "
                f"`architecture` = {name!r} and `model_args` other than those: {others!r}",
                "pass the block strings of the tower's stages as `tower=` (timm's "
                "architecture definition).")
    if "block_args" in model_args:
        return block_strings(model_args["block_args"])
    return ARCHITECTURES[name]


def rules(config: dict, *, tower=None) -> RuleSet:
    """The multimodal Gemma 3n rule set for a Hugging Face config (`text_config`,
    `audio_config`, `vision_config`), the vision tower's blocks from `tower` (stages of timm
    block strings) or else from the vision config's `architecture`."""
    where = "backbone/" if config.get("task") in TASKS else ""
    text, audio = _part(config, "text_config"), _part(config, "audio_config")
    if tower is None:
        tower = _tower(_part(config, "vision_config"))
    parts = [r.with_source("language_model." + r.source[len("model."):])
             for r in decoder_rules(text, where)]
    parts += [r.with_source("audio_tower." + r.source) for r in audio_rules(audio, where)]
    parts += embedder_rules("embed_audio", where) + embedder_rules("embed_vision", where)
    parts += tower_rules(tower, where)
    out = [r.with_source(prefix + r.source) for prefix in ("model.", "") for r in parts]
    return RuleSet(out + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('gemma3n')", classes=TASKS)
