"""Hugging Face's multimodal Gemma 4 (`Gemma4ForConditionalGeneration`, `Gemma4Model`, model
type `gemma4`) <-> keras-hub's `Gemma4Backbone` with its vision encoder and, where the config
has an `audio_config`, its audio encoder.

Names and layouts follow keras-hub's importer `convert_gemma4.py`:

- the text decoder (`text_config`): Gemma 4's (`objckpt.rules.hf_gemma4.decoder_rules`),
  under `model.language_model.`;
- the vision tower (`vision_config`) <-> keras-hub's `image_encoder`: the patch projection
  `patch_embedder.input_proj` (a `Linear`, transposed) and the position table (2, positions,
  hidden) as it is; each layer Gemma 4's vision block: q/k/v weights (heads * head_dim,
  hidden) <-> kernels (heads, hidden, head_dim), o (hidden, heads * head_dim) <-> (heads,
  head_dim, hidden), the MLP's weights transposed, the four norms and the per-head q/k norms
  as they are; where `use_clipped_linears` is set, each projection's four clipping bounds
  (`input_min`, `input_max`, `output_min`, `output_max`, scalars) as they are; where
  `standardize` is set, `std_bias` and `std_scale` <-> `vision_output_encoder`'s;
  `embed_vision.embedding_projection` (transposed) <-> its `vision_input_projection`;
- the audio tower (`audio_config`, a Conformer) <-> keras-hub's `audio_encoder`: the two
  subsampling convolutions (torch (out, in, h, w) <-> Keras (h, w, in, out)) and their norms,
  `input_proj_linear`, each block's two feed-forward modules, its attention (q/k/v, the
  relative position projection `relative_k_proj` <-> `rpe/pos_proj`, `per_dim_scale`,
  `post` <-> `out_proj`), its light convolution (the depthwise kernel (channels, 1, k) <->
  (k, channels, 1)), every `Linear` transposed, the norms and clipping bounds as they are;
  `output_proj` and `embed_audio.embedding_projection` (transposed). keras-hub gives the audio
  layers names shared between blocks (`pre_norm/scale`, `conv/kernel`), so these rules target
  the encoder's attributes by object path (`audio_encoder/conformer_blocks/0/...`, under
  `backbone/` in the task model).

Parameter-free norms (the vision `v_norm`, `embedding_pre_projection_norm`) have no entry on
either side. Hub classes (`CLASSES`): `Gemma4ForConditionalGeneration` names every part under
`model.`, `Gemma4Model` without it; restore reads both, export writes `model.`.
`lm_head.weight` (tied to the token embedding) has no keras-hub variable and is set aside;
keras-hub's `Gemma4CausalLM` has none beyond its backbone. transformers' `Gemma4VisionModel`
and `Gemma4AudioModel` (one tower alone) have no keras-hub model.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, ConvKernel, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma4 import decoder_rules
from objckpt.rules.hf_llama import config_part, config_size, head_rules

__all__ = ["MODEL_TYPES", "audio_rules", "rules", "vision_rules"]

MODEL_TYPES = ("gemma4",)
CLASSES = {
    "Gemma4Model": ("", ()),
    "Gemma4ForConditionalGeneration": ("", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma4CausalLM": "Gemma4ForConditionalGeneration"}
_MODEL = "Gemma 4 (multimodal)"
# the parts' prefixes in a folder, the first what export writes
PREFIXES = ("model.", "")
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


def _part(config: dict, key: str, *, required: bool = True):
    if config.get(key) is None and not required:
        return None
    return config_part(config, key, _MODEL, "{'text_config': {...}, 'vision_config': {...}}; "
                       "a text-only Gemma 4 is model type 'gemma4_text'")


def _linear(source: str, target: str, clipped: bool) -> list:
    """A `Gemma4ClippableLinear` (`{source}.linear.weight`, its bounds) <-> a keras-hub
    clipped dense layer (`{target}/dense/kernel`, its bounds)."""
    out = [Rule(f"{source}.linear.weight", f"{target}/dense/kernel", Transpose())]
    if clipped:
        out += [Rule(f"{source}.{bound}", f"{target}/{bound}") for bound in _BOUNDS]
    return out


def _heads(source: str, target: str, n: int, head_dim: int, hidden: int, clipped: bool,
           *, output: bool = False) -> list:
    """A clipped attention projection, split into heads as keras-hub's einsum kernels are."""
    if output:  # (hidden, n * head_dim) -> (n, head_dim, hidden)
        layout = Chain(Reshape((hidden, n * head_dim), (hidden, n, head_dim)),
                       Transpose((1, 2, 0)))
    else:  # (n * head_dim, hidden) -> (n, hidden, head_dim)
        layout = Chain(Reshape((n * head_dim, hidden), (n, head_dim, hidden)),
                       Transpose((0, 2, 1)))
    out = [Rule(f"{source}.linear.weight", f"{target}/dense/kernel", layout)]
    if clipped:
        out += [Rule(f"{source}.{bound}", f"{target}/{bound}") for bound in _BOUNDS]
    return out


def vision_rules(vision: dict) -> list:
    """The vision tower's and its projector's rules, their entries named `vision_tower.`
    and `embed_vision.` (unprefixed), for a vision config."""
    hidden = config_size(vision, "hidden_size", _MODEL)
    heads = config_size(vision, "num_attention_heads", _MODEL)
    kv_heads = config_size(vision, "num_key_value_heads", _MODEL, heads)
    head_dim = config_size(vision, "head_dim", _MODEL, 64)
    layers = config_size(vision, "num_hidden_layers", _MODEL)
    clipped = bool(vision.get("use_clipped_linears", False))
    out = [
        Rule("vision_tower.patch_embedder.input_proj.weight",
             "image_encoder/patch_embedder/input_proj/kernel", Transpose()),
        Rule("vision_tower.patch_embedder.position_embedding_table",
             "patch_embedder/position_embedding_table"),
        Rule("embed_vision.embedding_projection.weight",
             "vision_output_encoder/vision_input_projection/kernel", Transpose()),
    ]
    if vision.get("standardize", False):
        out += [Rule("vision_tower.std_bias", "vision_output_encoder/std_bias"),
                Rule("vision_tower.std_scale", "vision_output_encoder/std_scale")]
    for i in range(layers):
        source, block = f"vision_tower.encoder.layers.{i}", f"image_encoder/encoder_block_{i}"
        attention, target = f"{source}.self_attn", f"{block}/attention"
        out += [
            Rule(f"{source}.input_layernorm.weight", f"{block}/pre_attention_norm/scale"),
            Rule(f"{source}.post_attention_layernorm.weight",
                 f"{block}/post_attention_norm/scale"),
            Rule(f"{source}.pre_feedforward_layernorm.weight", f"{block}/pre_ffw_norm/scale"),
            Rule(f"{source}.post_feedforward_layernorm.weight", f"{block}/post_ffw_norm/scale"),
            Rule(f"{attention}.q_norm.weight", f"{target}/query_norm/scale"),
            Rule(f"{attention}.k_norm.weight", f"{target}/key_norm/scale"),
            *_heads(f"{attention}.q_proj", f"{target}/query", heads, head_dim, hidden, clipped),
            *_heads(f"{attention}.k_proj", f"{target}/key", kv_heads, head_dim, hidden,
                    clipped),
            *_heads(f"{attention}.v_proj", f"{target}/value", kv_heads, head_dim, hidden,
                    clipped),
            *_heads(f"{attention}.o_proj", f"{target}/attention_output", heads, head_dim,
                    hidden, clipped, output=True),
            *_linear(f"{source}.mlp.gate_proj", f"{block}/ffw_gating", clipped),
            *_linear(f"{source}.mlp.up_proj", f"{block}/ffw_gating_2", clipped),
            *_linear(f"{source}.mlp.down_proj", f"{block}/ffw_linear", clipped),
        ]
    return out


def audio_rules(audio: dict, where: str = "") -> list:
    """The audio tower's and its projector's rules, their entries named `audio_tower.` and
    `embed_audio.` (unprefixed), for an audio config; targets by object path under
    `where` (`backbone/` in a task model)."""
    layers = config_size(audio, "num_hidden_layers", _MODEL)
    config_size(audio, "hidden_size", _MODEL)
    clipped = bool(audio.get("use_clipped_linears", True))
    tower, encoder = "audio_tower", f"{where}audio_encoder"
    sub, ours = f"{tower}.subsample_conv_projection", f"{encoder}/subsample_conv_projection"
    out = [
        Rule(f"{sub}.input_proj_linear.weight", f"{ours}/input_proj/kernel", Transpose()),
        Rule(f"{tower}.output_proj.weight", f"{encoder}/output_proj/kernel", Transpose()),
        Rule(f"{tower}.output_proj.bias", f"{encoder}/output_proj/bias"),
        Rule("embed_audio.embedding_projection.weight",
             f"{encoder}/audio_output_projection/kernel", Transpose()),
    ]
    for j in (0, 1):
        out += [Rule(f"{sub}.layer{j}.conv.weight", f"{ours}/conv_{j}/conv/kernel",
                     ConvKernel("OIHW", "HWIO")),
                Rule(f"{sub}.layer{j}.norm.weight", f"{ours}/conv_{j}/norm/gamma")]
    for i in range(layers):
        source, block = f"{tower}.layers.{i}", f"{encoder}/conformer_blocks/{i}"
        attention, lconv = f"{source}.self_attn", f"{source}.lconv1d"
        for hf, keras in (("feed_forward1", "ffw_start"), ("feed_forward2", "ffw_end")):
            out += [
                *_linear(f"{source}.{hf}.ffw_layer_1", f"{block}/{keras}/ffw_1", clipped),
                *_linear(f"{source}.{hf}.ffw_layer_2", f"{block}/{keras}/ffw_2", clipped),
                Rule(f"{source}.{hf}.pre_layer_norm.weight", f"{block}/{keras}/pre_norm/scale"),
                Rule(f"{source}.{hf}.post_layer_norm.weight",
                     f"{block}/{keras}/post_norm/scale"),
            ]
        for name in ("q_proj", "k_proj", "v_proj"):
            out += _linear(f"{attention}.{name}", f"{block}/attention/attn/{name}", clipped)
        out += [
            Rule(f"{attention}.per_dim_scale", f"{block}/attention/attn/per_dim_scale"),
            Rule(f"{attention}.relative_k_proj.weight", f"{block}/attention/attn/rpe/pos_proj",
                 Transpose()),
            *_linear(f"{attention}.post", f"{block}/attention/out_proj", clipped),
            Rule(f"{source}.norm_pre_attn.weight", f"{block}/attention/pre_attn_norm/scale"),
            Rule(f"{source}.norm_post_attn.weight", f"{block}/attention/post_norm/scale"),
            Rule(f"{source}.norm_out.weight", f"{block}/norm/scale"),
            *_linear(f"{lconv}.linear_start", f"{block}/lconv/linear_start", clipped),
            *_linear(f"{lconv}.linear_end", f"{block}/lconv/linear_end", clipped),
            # torch's depthwise Conv1d (channels, 1, k) <-> Keras's (k, channels, 1)
            Rule(f"{lconv}.depthwise_conv1d.weight", f"{block}/lconv/depthwise_conv/kernel",
                 Transpose((2, 0, 1))),
            Rule(f"{lconv}.pre_layer_norm.weight", f"{block}/lconv/pre_norm/scale"),
            Rule(f"{lconv}.conv_norm.weight", f"{block}/lconv/conv_norm/scale"),
        ]
    return out


def rules(config: dict) -> RuleSet:
    """The multimodal Gemma 4 rule set for a Hugging Face config (`text_config`,
    `vision_config` and, where present, `audio_config`: their sizes decide the reshapes).

    Example:
      >>> rules = objckpt.rules.huggingface("gemma4", config=hf_config)
      >>> objckpt.restore(keras_hub.models.Gemma4Backbone(...), "gemma4_dir", rules=rules)
    """
    text, vision = _part(config, "text_config"), _part(config, "vision_config")
    audio = _part(config, "audio_config", required=False)
    decoder = decoder_rules(text, _MODEL)
    out = [r.with_source(prefix + "language_model." + r.source[len("model."):])
           for prefix in PREFIXES for r in decoder]
    towers = vision_rules(vision)
    if audio is not None:
        where = "backbone/" if config.get("task") in TASKS else ""
        towers += audio_rules(audio, where)
    out += [r.with_source(prefix + r.source) for prefix in PREFIXES for r in towers]
    return RuleSet(out + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('gemma4')", classes=TASKS)
