"""Hugging Face MetaCLIP 2 (`MetaClip2Model`, model type `metaclip_2`) <-> keras-hub's
`MetaCLIP2Backbone`.

Names and layouts follow keras-hub's importer (`convert_metaclip_2.py`): two towers, each
projected, and the contrastive head's temperature.

- the vision tower (`vision_config`, `vision_model.`) <-> `vision_encoder`: the patch
  projection a torch `Conv2d` kernel without bias (out, in, h, w) <-> a Keras `Conv2D` kernel
  (h, w, in, out); the class embedding (hidden,) and the position embedding (patches + 1,
  hidden) as they are; `pre_layrnorm` (transformers' spelling) <-> `pre_layer_norm`;
  `post_layernorm` <-> the backbone's `vision_post_layer_norm`;
- the text tower (`text_config`, `text_model.`) <-> `text_encoder`: the token and position
  embeddings as they are, `final_layer_norm` <-> `text_encoder/layer_norm`;
- in each tower's blocks, query/key/value (hidden, hidden) <-> (hidden, heads, head_dim),
  their biases (hidden,) <-> (heads, head_dim), the attention output (hidden, hidden) <->
  (heads, head_dim, hidden); the MLP's `Linear` weights (out, in) <-> Keras kernels (in,
  out); layer norms' `weight`/`bias` <-> `gamma`/`beta`;
- `visual_projection.weight` and `text_projection.weight` (projection, hidden; no bias) <->
  `vision_projection/kernel` and `text_projection/kernel` (hidden, projection); the scalar
  `logit_scale` <-> `metaclip_2_head/logit_scale`.

keras-hub names both towers' blocks alike (`encoder_block_{i}`), so their rules target the
variables by object path: each encoder's functional `operations/<n>` (the vision encoder's
images, embedding and pre-norm come first: block i is operation 3 + i; the text encoder's
token ids and embedding: block i is operation 2 + i).

What keras-hub builds from the config, not the weights: the text tower's pooling (at the
first token 2, keras-hub's fixed EOS id: a config whose `text_config.eos_token_id` says
otherwise pools elsewhere in transformers), the layer norms' epsilon (1e-5, transformers'
default) and the activation (`hidden_act`, which keras-hub's importer passes on).

Hub classes (`CLASSES`): `MetaClip2Model` holds both towers, as keras-hub's backbone does;
keras-hub has no MetaCLIP 2 task model (`TASKS` is empty). The one-tower classes name their
tower and projection as `MetaClip2Model` does (`text_model.`, `text_projection.`;
`vision_model.`, `visual_projection.`), but their folders' config.json says model type
`metaclip_2_text_model` or `metaclip_2_vision_model` and describes half a backbone: no set is
registered for those, and no fixture covers them. `MetaClip2ForImageClassification`'s
`classifier.*` has no keras-hub variable and is set aside. Key forms: transformers 5 saves
`MetaClip2Model` under the names above in either form of `save_pretrained` (its renames drop
the tower's prefix only for the one-tower `MetaClip2VisionModel` and `MetaClip2TextModel`);
export writes them.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, ConvKernel, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import config_part, config_size

__all__ = ["CLASSES", "MODEL_TYPES", "TASKS", "rules"]

MODEL_TYPES = ("metaclip_2",)
# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "MetaClip2Model": ("", ()),
    "MetaClip2TextModel": ("", ()),
    "MetaClip2TextModelWithProjection": ("", ()),
    "MetaClip2VisionModel": ("", ()),
    "MetaClip2VisionModelWithProjection": ("", ()),
    "MetaClip2ForImageClassification": ("", ("classifier.weight", "classifier.bias")),
}
TASKS: dict = {}  # keras-hub has no MetaCLIP 2 task model
_MODEL = "MetaCLIP 2"


def _part(config: dict, key: str) -> dict:
    return config_part(config, key, _MODEL, "{'text_config': {...}, 'vision_config': {...}}")


def _dense(source: str, target: str, bias: bool = True) -> list:
    out = [Rule(f"{source}.weight", f"{target}/kernel", Transpose())]
    return out + [Rule(f"{source}.bias", f"{target}/bias")] if bias else out


def _layer_norm(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


def _blocks(tower: dict, source: str, target: str, first: int) -> list:
    """Each encoder block of a tower (`source`: its prefix, `target`: keras-hub's encoder,
    whose block i is its functional's operation `first` + i) for the tower's config."""
    hidden = config_size(tower, "hidden_size", _MODEL)
    heads = config_size(tower, "num_attention_heads", _MODEL)
    config_size(tower, "intermediate_size", _MODEL)
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {_MODEL} rule set needs hidden_size divisible by num_attention_heads; "
            f"received {hidden} and {heads}. Fix: pass the checkpoint's own config.json.")
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    bias_heads = Reshape((hidden,), (heads, head_dim))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    out = []
    for i in range(config_size(tower, "num_hidden_layers", _MODEL)):
        out += _block(f"{source}.encoder.layers.{i}", f"{target}/operations/{first + i}",
                      into_heads, bias_heads, from_heads)
    return out


def _block(layer: str, block: str, into_heads, bias_heads, from_heads) -> list:
    """One encoder block's rules (`layer`: its entries' prefix, `block`: its object path)."""
    out = []
    for name in ("q", "k", "v"):
        keras = {"q": "query", "k": "key", "v": "value"}[name]
        out += [Rule(f"{layer}.self_attn.{name}_proj.weight",
                     f"{block}/attention/{keras}_dense/kernel", into_heads),
                Rule(f"{layer}.self_attn.{name}_proj.bias",
                     f"{block}/attention/{keras}_dense/bias", bias_heads)]
    return out + [
        Rule(f"{layer}.self_attn.out_proj.weight", f"{block}/attention/output_dense/kernel",
             from_heads),
        Rule(f"{layer}.self_attn.out_proj.bias", f"{block}/attention/output_dense/bias"),
        *_layer_norm(f"{layer}.layer_norm1", f"{block}/layer_norm_1"),
        *_layer_norm(f"{layer}.layer_norm2", f"{block}/layer_norm_2"),
        *_dense(f"{layer}.mlp.fc1", f"{block}/dense_1"),
        *_dense(f"{layer}.mlp.fc2", f"{block}/dense_2"),
    ]


def rules(config: dict) -> RuleSet:
    """The MetaCLIP 2 rule set for a Hugging Face config (`text_config` and `vision_config`:
    their sizes decide the reshapes).

    Example:
      >>> rules = objckpt.rules.huggingface("metaclip_2", config=hf_config)
      >>> objckpt.restore(keras_hub.models.MetaCLIP2Backbone(...), "metaclip_dir", rules=rules)
    """
    text, vision = _part(config, "text_config"), _part(config, "vision_config")
    embedding = "vision_encoder/embedding"
    out = [
        Rule("vision_model.embeddings.patch_embedding.weight",
             f"{embedding}/patch_embedding/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("vision_model.embeddings.position_embedding.weight",
             f"{embedding}/position_embedding/embeddings"),
        Rule("vision_model.embeddings.class_embedding", f"{embedding}/class_embedding"),
        *_layer_norm("vision_model.pre_layrnorm", "vision_encoder/pre_layer_norm"),
        *_blocks(vision, "vision_model", "vision_encoder", 3),
        *_layer_norm("vision_model.post_layernorm", "vision_post_layer_norm"),
        *_dense("visual_projection", "vision_projection", bias=False),
        Rule("text_model.embeddings.token_embedding.weight",
             "text_encoder/embedding/token_embedding/embeddings"),
        Rule("text_model.embeddings.position_embedding.weight",
             "text_encoder/embedding/position_embedding/position_embeddings"),
        *_blocks(text, "text_model", "text_encoder", 2),
        *_layer_norm("text_model.final_layer_norm", "text_encoder/layer_norm"),
        *_dense("text_projection", "text_projection", bias=False),
        Rule("logit_scale", "metaclip_2_head/logit_scale"),
    ]
    heads = [Rule(entry, f"{NOWHERE}/{entry}", head="MetaClip2ForImageClassification")
             for entry in CLASSES["MetaClip2ForImageClassification"][1]]
    return RuleSet(out + heads, alternatives=True, name="huggingface('metaclip_2')",
                   classes=TASKS)
