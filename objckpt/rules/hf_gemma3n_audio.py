"""Hugging Face's multimodal Gemma 3n (`Gemma3nForConditionalGeneration`, `Gemma3nModel`, model
type `gemma3n`) <-> keras-hub's `Gemma3nBackbone`: the text decoder, the audio tower and the
two multimodal embedders. NOT a shipped set (not in `huggingface._MODULES`): the MobileNetV5
vision tower has no rules yet, and no folder of these classes could be written by transformers
here to check the set against (transformers builds the vision tower with timm).

Names and layouts follow keras-hub's importer `convert_gemma3n.py`:

- the text decoder (`text_config`) under `model.language_model.`: the `gemma3n_text` set's
  (`objckpt.rules.hf_gemma3n.decoder_rules`);
- the Conformer audio tower (`audio_config`) under `model.audio_tower.` <-> keras-hub's
  `audio_encoder`: the two sub-sampling convolutions, torch `Conv2d` kernels (out, in, h, w)
  <-> Keras (h, w, in, out), their norms' weights as they are; each conformer block's
  `Linear` weights transposed, its light convolution's depthwise `Conv1d` kernel (channels,
  1, k) <-> Keras (k, channels, 1); RMS norm weights and the attention's `per_dim_scale` as
  they are;
- the embedders `model.embed_vision.` and `model.embed_audio.` <-> keras-hub's
  `embed_vision` and `embed_audio`: the embedding table and the two norms as they are, the
  projection transposed.

Targets are the backbone's object paths, under `backbone/` in the task model (keras-hub names
the audio encoder's layers by a counter of the session).
"""

from __future__ import annotations

from objckpt.rules.core import ConvKernel, Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma3n import decoder_rules
from objckpt.rules.hf_llama import config_size, head_rules

__all__ = ["MODEL_TYPES", "audio_rules", "embedder_rules", "rules"]

MODEL_TYPES = ("gemma3n",)
CLASSES = {
    "Gemma3nModel": ("", ()),
    "Gemma3nForConditionalGeneration": ("model.", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma3nCausalLM": "Gemma3nForConditionalGeneration"}
_MODEL = "Gemma 3n (multimodal)"


def _part(config: dict, key: str) -> dict:
    value = config.get(key)
    if not isinstance(value, dict):
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {_MODEL} rule set needs `{key}` (a dict) from the Hugging Face config; "
            f"received {value!r}. Fix: pass the checkpoint's folder (its config.json), or "
            "config={'text_config': {...}, 'audio_config': {...}, 'vision_config': {...}}; a "
            "text-only Gemma 3n is model type 'gemma3n_text'.")
    return value


def _dense(source: str, target: str) -> Rule:
    return Rule(f"{source}.weight", f"{target}/kernel", Transpose())


def _norm(source: str, target: str) -> Rule:
    return Rule(f"{source}.weight", f"{target}/scale")


def audio_rules(audio: dict, where: str = "") -> list:
    """The audio tower's rules, its entries named without a prefix (`subsample_conv_projection.`,
    `conformer.{i}.`), for an audio config; InvalidArgumentError for a size that is missing."""
    config_size(audio, "hidden_size", _MODEL)
    blocks = config_size(audio, "conf_num_hidden_layers", _MODEL)
    tower, projection = f"{where}audio_encoder", "subsample_conv_projection"
    out = []
    for j in (0, 1):
        conv, target = f"{projection}.conv_{j}", f"{tower}/{projection}/conv_{j}"
        out += [Rule(f"{conv}.conv.weight", f"{target}/conv/kernel", ConvKernel("OIHW", "HWIO")),
                _norm(f"{conv}.norm", f"{target}/norm")]
    out.append(_dense(f"{projection}.input_proj_linear",
                      f"{tower}/{projection}/input_proj_linear"))
    for i in range(blocks):
        source, block = f"conformer.{i}", f"{tower}/conformer/{i}"
        for ffw in ("ffw_layer_start", "ffw_layer_end"):
            out += [_norm(f"{source}.{ffw}.{n}", f"{block}/{ffw}/{n}")
                    for n in ("pre_layer_norm", "post_layer_norm")]
            out += [_dense(f"{source}.{ffw}.{n}", f"{block}/{ffw}/{n}")
                    for n in ("ffw_layer_1", "ffw_layer_2")]
        attention, target = f"{source}.attention", f"{block}/attention"
        out += [_norm(f"{attention}.{n}", f"{target}/{n}") for n in ("pre_attn_norm", "post_norm")]
        out += [_dense(f"{attention}.post", f"{target}/post"),
                Rule(f"{attention}.attn.per_dim_scale", f"{target}/attn/per_dim_scale"),
                _dense(f"{attention}.attn.relative_position_embedding.pos_proj",
                       f"{target}/attn/relative_position_embedding/pos_proj")]
        out += [_dense(f"{attention}.attn.{p}_proj", f"{target}/attn/{p}_proj") for p in "qkv"]
        lconv, target = f"{source}.lconv1d", f"{block}/lconv1d"
        out += [_norm(f"{lconv}.{n}", f"{target}/{n}") for n in ("pre_layer_norm", "conv_norm")]
        out += [_dense(f"{lconv}.{n}", f"{target}/{n}") for n in ("linear_start", "linear_end")]
        out += [Rule(f"{lconv}.depthwise_conv1d.weight", f"{target}/depthwise_conv1d/kernel",
                     Transpose((2, 0, 1))),
                _norm(f"{source}.norm", f"{block}/norm")]
    return out


def embedder_rules(modality: str, where: str = "") -> list:
    """A multimodal embedder's rules (`embed_vision` or `embed_audio`), its entries named
    `{modality}.` (`embed_audio.embedding.weight`, ...)."""
    target = f"{where}{modality}"
    return [Rule(f"{modality}.embedding.weight", f"{target}/embedding/embeddings"),
            _norm(f"{modality}.hard_embedding_norm", f"{target}/hard_embedding_norm"),
            _norm(f"{modality}.soft_embedding_norm", f"{target}/soft_embedding_norm"),
            _dense(f"{modality}.embedding_projection", f"{target}/embedding_projection")]


def rules(config: dict) -> RuleSet:
    """The multimodal Gemma 3n rule set, the vision tower left out, for a Hugging Face config
    (`text_config` and `audio_config`: their sizes decide the layers)."""
    where = "backbone/" if config.get("task") in TASKS else ""
    text, audio = _part(config, "text_config"), _part(config, "audio_config")
    parts = [r.with_source("language_model." + r.source[len("model."):])
             for r in decoder_rules(text, where)]
    parts += [r.with_source("audio_tower." + r.source) for r in audio_rules(audio, where)]
    parts += embedder_rules("embed_audio", where) + embedder_rules("embed_vision", where)
    out = [r.with_source(prefix + r.source) for prefix in ("model.", "") for r in parts]
    return RuleSet(out + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('gemma3n')", classes=TASKS)
