"""Gemma 3n's Conformer audio tower and multimodal embedders <-> keras-hub's `audio_encoder`,
`embed_audio` and `embed_vision`: part of the multimodal Gemma 3n rules
(`objckpt.rules.hf_gemma3n_multimodal`).

Names and layouts follow keras-hub's importer `convert_gemma3n.py`:

- the audio tower (`audio_config`, under `audio_tower.` in the Hub's classes): the two
  sub-sampling convolutions, torch `Conv2d` kernels (out, in, h, w) <-> Keras (h, w, in,
  out), their norms' weights as they are; each conformer block's `Linear` weights
  transposed, its light convolution's depthwise `Conv1d` kernel (channels, 1, k) <-> Keras
  (k, channels, 1); RMS norm weights and the attention's `per_dim_scale` as they are;
- the embedders `embed_vision.` and `embed_audio.`: the embedding table and the two norms as
  they are, the projection transposed.

Targets are the backbone's object paths, under `backbone/` in the task model (keras-hub names
the audio encoder's layers by a counter of the session).
"""

from __future__ import annotations

from objckpt.rules.core import ConvKernel, Rule, Transpose
from objckpt.rules.hf_llama import config_size

__all__ = ["audio_rules", "embedder_rules"]

_MODEL = "Gemma 3n (multimodal)"


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
