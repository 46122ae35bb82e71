"""BLIP-2's vision tower, Q-Former and language projection <-> keras-hub's
`BLIP2VisionEncoder`, `BLIP2QFormer` and the language model's `language_projection`: the
parts every BLIP-2 shares, whichever its language model (`objckpt.rules.hf_blip2`).

Names and layouts follow keras-hub's importer (`convert_blip2.py`):

- the vision tower (`vision_model.`): the patch projection a torch `Conv2d` kernel (out, in,
  h, w) <-> a Keras `Conv2D` kernel (h, w, in, out), the class embedding (1, 1, hidden) as it
  is, the position embedding (1, patches + 1, hidden) <-> (patches + 1, hidden); each block's
  fused `self_attn.qkv` weight (3 * hidden, hidden) split into query, key and value kernels
  (hidden, heads, head_dim) and its bias (3 * hidden,) into (heads, head_dim) biases (export
  concatenates them back), `self_attn.projection` (hidden, hidden) <-> (heads, head_dim,
  hidden), the MLP's `Linear` weights transposed, `layer_norm1`/`layer_norm2` <->
  `layer_norm_1`/`layer_norm_2`, `post_layernorm` <-> the encoder's `layer_norm`;
- the Q-Former (`qformer.`, and the top-level `query_tokens` (1, queries, hidden) as they
  are): each layer's self-attention, and cross-attention on every `cross_attention_frequency`
  -th layer from layer 0 (its keys and values read the vision tower's width), with the
  query/key/value weights (hidden, width) <-> kernels (width, heads, head_dim), their biases
  <-> (heads, head_dim), the output dense (hidden, hidden) <-> (heads, head_dim, hidden), and
  a LayerNorm; `intermediate_query` and `output_query` <-> `intermediate_dense`,
  `output_dense`, `output_layer_norm`;
- `language_projection` (text width, Q-Former width) <-> the language model's
  `language_projection` kernel (Q-Former width, text width).

keras-hub builds each part as a functional model, so the rules target variables by object
path: the vision encoder's embedding is its operation 1, its encoder operation 2; the
Q-Former's layer i is its operation 4 + i (after its inputs, query tokens, norm and dropout).

Sizes: transformers writes each sub-config in full; a config pruned to `model_type` (as the
Hub's BLIP-2 configs are) takes transformers' defaults, as keras-hub's importer does.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, ConvKernel, Reshape, Rule, Split, Transpose
from objckpt.rules.hf_llama import config_part
from objckpt.rules.hf_vit import layer_norm

__all__ = ["MODEL", "attention", "dense", "heads", "part", "projection_rules", "qformer_rules",
           "size", "vision_rules"]

MODEL = "BLIP-2"
VISION, QFORMER = "vision_encoder/operations", "qformer"
_QFORMER_LAYER_0 = 4  # the Q-Former's layer i is its operation 4 + i
# transformers' defaults of the sub-configs the Hub prunes (Blip2VisionConfig,
# Blip2QFormerConfig), which keras-hub's importer takes too
VISION_DEFAULTS = {"hidden_size": 1408, "num_attention_heads": 16, "num_hidden_layers": 39}
QFORMER_DEFAULTS = {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
                    "cross_attention_frequency": 2}


def _invalid(text: str, fix: str):
    """The error for what the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"{text} Fix: {fix}")


def part(config: dict, key: str, default=None) -> dict:
    """The sub-config `config[key]` (a dict; `default` where absent and given)."""
    return config_part(config, key, MODEL, "{'vision_config': {...}, 'qformer_config': "
                       "{...}, 'text_config': {...}, 'num_query_tokens': ...}", default=default)


def size(config: dict, key: str, where: str, default=None) -> int:
    """`config[key]` (else `default`), a positive int; InvalidArgumentError naming the key
    as `where` shows it (`text_config.hidden_size`) otherwise."""
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        raise _invalid(
            f"The {MODEL} rule set needs `{where}{key}` (a positive int) from the Hugging "
            f"Face config; received {value!r}.", "pass the checkpoint's folder (its "
            "config.json).")
    return value


def heads(config: dict, where: str, defaults: dict | None = None, hidden_key="hidden_size",
          heads_key="num_attention_heads") -> tuple:
    """(hidden, heads, head_dim) of a sub-config, the heads dividing the hidden size."""
    defaults = defaults or {}
    hidden = size(config, hidden_key, where, defaults.get(hidden_key))
    count = size(config, heads_key, where, defaults.get(heads_key))
    if hidden % count:
        raise _invalid(
            f"The {MODEL} rule set needs `{where}{hidden_key}` ({hidden}) divisible by "
            f"`{where}{heads_key}` ({count}).", "pass the checkpoint's own config.json.")
    return hidden, count, hidden // count


def dense(source: str, target: str) -> list:
    """A torch `Linear` (weight (out, in), bias) <-> a Keras `Dense` (kernel (in, out))."""
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def attention(source: str, names: tuple, target: str, hidden: int, count: int,
              width: int | None = None) -> list:
    """q/k/v (`names`, each (hidden, width) with a bias) and the output (`source`'s `output`
    (hidden, hidden)) <-> a Keras `MultiHeadAttention` at `target`; keys and values read
    vectors of `width` (the queries' `hidden`)."""
    head_dim = hidden // count
    width = width or hidden
    out = []
    for name, keras in zip(names[:3], ("query", "key", "value")):
        wide = hidden if keras == "query" else width
        out += [Rule(f"{source}{name}.weight", f"{target}/{keras}_dense/kernel",
                     Chain(Transpose(), Reshape((wide, hidden), (wide, count, head_dim)))),
                Rule(f"{source}{name}.bias", f"{target}/{keras}_dense/bias",
                     Reshape((hidden,), (count, head_dim)))]
    return out + [
        Rule(f"{source}{names[3]}.weight", f"{target}/output_dense/kernel",
             Chain(Transpose(), Reshape((hidden, hidden), (count, head_dim, hidden)))),
        Rule(f"{source}{names[3]}.bias", f"{target}/output_dense/bias"),
    ]


def vision_rules(config: dict) -> list:
    """`vision_model.*` <-> keras-hub's `vision_encoder` (its `{i}`-th block per layer)."""
    vision = part(config, "vision_config", {})
    hidden, count, head_dim = heads(vision, "vision_config.", VISION_DEFAULTS)
    embedding, encoder = f"{VISION}/1", f"{VISION}/2"
    source, block = "vision_model.encoder.layers.{i}", f"{encoder}/encoder_layers/{{i}}"
    out = [
        Rule("vision_model.embeddings.class_embedding", f"{embedding}/class_token"),
        Rule("vision_model.embeddings.patch_embedding.weight",
             f"{embedding}/patch_embedding/kernel", ConvKernel("OIHW", "HWIO")),
        Rule("vision_model.embeddings.patch_embedding.bias", f"{embedding}/patch_embedding/bias"),
        Rule("vision_model.embeddings.position_embedding",
             f"{embedding}/position_embedding/embeddings", Reshape((1, -1, hidden), (-1, hidden))),
        *layer_norm(f"{source}.layer_norm1", f"{block}/layer_norm_1"),
        *layer_norm(f"{source}.layer_norm2", f"{block}/layer_norm_2"),
    ]
    for index, name in enumerate(("query", "key", "value")):
        out += [Rule(f"{source}.self_attn.qkv.weight", f"{block}/mha/{name}_dense/kernel",
                     Chain(Split(0, parts=3, index=index), Transpose(),
                           Reshape((hidden, hidden), (hidden, count, head_dim)))),
                Rule(f"{source}.self_attn.qkv.bias", f"{block}/mha/{name}_dense/bias",
                     Chain(Split(0, parts=3, index=index),
                           Reshape((hidden,), (count, head_dim))))]
    out += [
        Rule(f"{source}.self_attn.projection.weight", f"{block}/mha/output_dense/kernel",
             Chain(Transpose(), Reshape((hidden, hidden), (count, head_dim, hidden)))),
        Rule(f"{source}.self_attn.projection.bias", f"{block}/mha/output_dense/bias"),
        *dense(f"{source}.mlp.fc1", f"{block}/mlp/dense_1"),
        *dense(f"{source}.mlp.fc2", f"{block}/mlp/dense_2"),
        *layer_norm("vision_model.post_layernorm", f"{encoder}/layer_norm"),
    ]
    return out


def qformer_rules(config: dict) -> list:
    """`query_tokens` and `qformer.*` <-> keras-hub's `qformer` (layer by layer: its layers
    are functional operations numbered from 4)."""
    qformer = part(config, "qformer_config", {})
    vision = part(config, "vision_config", {})
    hidden, count, _ = heads(qformer, "qformer_config.", QFORMER_DEFAULTS)
    width = size(vision, "hidden_size", "vision_config.", VISION_DEFAULTS["hidden_size"])
    layers = size(qformer, "num_hidden_layers", "qformer_config.",
                  QFORMER_DEFAULTS["num_hidden_layers"])
    every = size(qformer, "cross_attention_frequency", "qformer_config.",
                 QFORMER_DEFAULTS["cross_attention_frequency"])
    names = ("attention.query", "attention.key", "attention.value", "output.dense")
    out = [Rule("query_tokens", f"{QFORMER}/query_tokens_layer/query_tokens"),
           *layer_norm("qformer.layernorm", f"{QFORMER}/layer_norm")]
    for i in range(layers):
        source = f"qformer.encoder.layer.{i}."
        target = f"{QFORMER}/operations/{_QFORMER_LAYER_0 + i}"
        out += attention(f"{source}attention.", names, f"{target}/self_attention/attention",
                         hidden, count)
        out += layer_norm(f"{source}attention.output.LayerNorm",
                          f"{target}/self_attention/layer_norm")
        if i % every == 0:
            out += attention(f"{source}crossattention.", names,
                             f"{target}/cross_attention/attention", hidden, count, width)
            out += layer_norm(f"{source}crossattention.output.LayerNorm",
                              f"{target}/cross_attention/layer_norm")
        out += [*dense(f"{source}intermediate_query.dense", f"{target}/intermediate_dense"),
                *dense(f"{source}output_query.dense", f"{target}/output_dense"),
                *layer_norm(f"{source}output_query.LayerNorm", f"{target}/output_layer_norm")]
    return out


def projection_rules() -> list:
    """`language_projection` <-> the language model's `language_projection`."""
    return dense("language_projection", "language_model/language_projection")
