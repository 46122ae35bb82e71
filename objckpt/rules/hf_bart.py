"""Hugging Face BART (`BartModel`, `BartForConditionalGeneration`, ...) <-> keras-hub's
`BartBackbone` (encoder-decoder).

Names and layouts follow keras-hub's importer (`convert_bart.py`): the token embedding is
the one shared tensor `shared.weight`; each attention's q/k/v weights (heads * head_dim,
hidden) <-> kernels (hidden, heads, head_dim), their biases (heads * head_dim,) <-> (heads,
head_dim), `out_proj` (hidden, heads * head_dim) <-> (heads, head_dim, hidden), `fc1`/`fc2`
transposed, LayerNorms as they are. The decoder's cross-attention is transformers'
`encoder_attn`, keras-hub's `cross_attention`.

Learned positions: transformers' tables have max_position_embeddings + 2 rows and read from
row 2 on (its `BartLearnedPositionalEmbedding` offset); keras-hub's hold rows 2.. only. A
restore takes rows 2..; export writes rows 0 and 1 as zeros, which transformers never reads
(the folder it reads back computes what the original computes; those two rows' bytes are
not the original's).

keras-hub's backbone has one size for both stacks (`num_hidden_layers`, the encoder's heads
and feed-forward size): a config whose decoder differs is refused.

Hub classes (`CLASSES`): `BartModel` saves the model bare, the task classes under `model.`;
restore accepts both, export writes `model.` names (transformers' `BartModel` reads them too).
keras-hub's `BartSeq2SeqLM` has no variable beyond its backbone (its logits are the tied
token embedding's), so `BartForConditionalGeneration`'s `final_logits_bias` (zeros as
transformers makes it) is set aside, as are the tied `lm_head.weight` and per-stack
`embed_tokens.weight` older folders hold, and the classification and question-answering
heads (no keras-hub task model). `BartForCausalLM` (a decoder alone) has no keras-hub model.
"""

from __future__ import annotations

import dataclasses

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transform, Transpose
from objckpt.rules.hf_llama import prefixed

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("bart",)
CLASSES = {
    "BartModel": ("", ()),
    "BartForConditionalGeneration": ("model.", ("final_logits_bias", "lm_head.weight")),
    "BartForSequenceClassification": ("model.", (
        "classification_head.dense.weight", "classification_head.dense.bias",
        "classification_head.out_proj.weight", "classification_head.out_proj.bias")),
    "BartForQuestionAnswering": ("model.", ("qa_outputs.weight", "qa_outputs.bias")),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"BartSeq2SeqLM": "BartForConditionalGeneration"}
_OFFSET = 2  # transformers' position tables start with two rows it never reads


@dataclasses.dataclass(frozen=True)
class SkipRows(Transform):
    """Rows `count`.. of a table (restore); its inverse puts `count` rows of zeros first
    (export): for rows the Hub model never reads."""

    count: int

    def __call__(self, value):
        return value[self.count:]

    def output_shape(self, shape: tuple) -> tuple:
        return (shape[0] - self.count, *shape[1:])

    def inverse(self) -> Transform:
        return _ZeroRows(self.count)


@dataclasses.dataclass(frozen=True)
class _ZeroRows(Transform):
    """`count` rows of zeros, then the table (the export direction of `SkipRows`)."""

    count: int

    def __call__(self, value):
        import numpy as np

        if isinstance(value, np.ndarray):
            zeros = np.zeros((self.count, *value.shape[1:]), value.dtype)
            return np.concatenate([zeros, value])
        import tensorflow as tf

        return tf.concat([tf.zeros((self.count, *value.shape[1:]), value.dtype), value], 0)

    def output_shape(self, shape: tuple) -> tuple:
        return (shape[0] + self.count, *shape[1:])

    def inverse(self) -> Transform:
        return SkipRows(self.count)


def _sizes(config: dict) -> tuple:
    """(hidden, heads, layers) of a config keras-hub's BartBackbone can hold."""
    from objckpt import errors

    def size(key, *fallbacks):
        for each in (key, *fallbacks):
            if config.get(each) is not None:
                value = config[each]
                break
        else:
            value = None
        if type(value) is not int or value <= 0:
            raise errors.InvalidArgumentError(
                f"The BART rule set needs `{key}` (a positive int) from the Hugging Face "
                f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
                f"config.json), or config={{'{key}': ..., ...}}.")
        return value

    hidden = size("d_model", "hidden_size")
    heads = size("encoder_attention_heads", "num_attention_heads")
    layers = size("encoder_layers", "num_hidden_layers")
    for encoder, decoder in (("encoder_layers", "decoder_layers"),
                             ("encoder_attention_heads", "decoder_attention_heads"),
                             ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config.get(decoder, config.get(encoder)) != config.get(encoder):
            raise errors.InvalidArgumentError(
                f"The BART rule set needs `{decoder}` equal to `{encoder}`; received "
                f"{config.get(decoder)!r} and {config.get(encoder)!r}: keras-hub's "
                "BartBackbone gives its encoder and decoder one size. Fix: convert a "
                "checkpoint whose decoder is the size of its encoder.")
    if hidden % heads:
        raise errors.InvalidArgumentError(
            f"The BART rule set needs `d_model` ({hidden}) divisible by "
            f"`encoder_attention_heads` ({heads}). Fix: pass the checkpoint's config.json.")
    return hidden, heads, layers


def _attention(source: str, target: str, hidden: int, heads: int) -> list:
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    out = [Rule(f"{source}.{hf}_proj.{kind}", f"{target}/{keras}/{name}", transform)
           for hf, keras in (("q", "query"), ("k", "key"), ("v", "value"))
           for kind, name, transform in (
               ("weight", "kernel", into_heads),
               ("bias", "bias", Reshape((hidden,), (heads, head_dim))))]
    return out + [
        Rule(f"{source}.out_proj.weight", f"{target}/attention_output/kernel",
             Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))),
        Rule(f"{source}.out_proj.bias", f"{target}/attention_output/bias"),
    ]


def _norm(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


def _dense(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def _heads() -> list:
    out = []
    for name, (_, heads) in CLASSES.items():
        out += [Rule(entry, f"{NOWHERE}/{entry}", head=name + (
            " (tied to the token embedding)" if entry == "lm_head.weight" else ""))
            for entry in heads]
    return out + [Rule(f"{prefix}{stack}.embed_tokens.weight",
                       f"{NOWHERE}/{prefix}{stack}.embed_tokens.weight",
                       head="BartModel, BartFor* (tied to `shared.weight`)")
                  for prefix in ("model.", "") for stack in ("encoder", "decoder")]


def rules(config: dict) -> RuleSet:
    """The BART rule set for a Hugging Face config (sizes decide the head reshapes)."""
    hidden, heads, _ = _sizes(config)
    encoder, decoder = "model.encoder.layers.{i}", "model.decoder.layers.{i}"
    ours_e, ours_d = "transformer_encoder_layer_{i}", "transformer_decoder_layer_{i}"
    out = [
        Rule("model.shared.weight", "token_embedding/embeddings"),
        Rule("model.encoder.embed_positions.weight", "encoder_position_embedding/embeddings",
             SkipRows(_OFFSET)),
        Rule("model.decoder.embed_positions.weight", "decoder_position_embedding/embeddings",
             SkipRows(_OFFSET)),
        *_norm("model.encoder.layernorm_embedding", "encoder_embeddings_layer_norm"),
        *_norm("model.decoder.layernorm_embedding", "decoder_embeddings_layer_norm"),
        *_attention(f"{encoder}.self_attn", f"{ours_e}/self_attention_layer", hidden, heads),
        *_norm(f"{encoder}.self_attn_layer_norm", f"{ours_e}/self_attention_layer_norm"),
        *_norm(f"{encoder}.final_layer_norm", f"{ours_e}/feedforward_layer_norm"),
        *_dense(f"{encoder}.fc1", f"{ours_e}/feedforward_intermediate_dense"),
        *_dense(f"{encoder}.fc2", f"{ours_e}/feedforward_output_dense"),
        *_attention(f"{decoder}.self_attn", f"{ours_d}/self_attention", hidden, heads),
        *_norm(f"{decoder}.self_attn_layer_norm", f"{ours_d}/self_attention_layer_norm"),
        *_attention(f"{decoder}.encoder_attn", f"{ours_d}/cross_attention", hidden, heads),
        *_norm(f"{decoder}.encoder_attn_layer_norm", f"{ours_d}/cross_attention_layer_norm"),
        *_norm(f"{decoder}.final_layer_norm", f"{ours_d}/feedforward_layer_norm"),
        *_dense(f"{decoder}.fc1", f"{ours_d}/feedforward_intermediate_dense"),
        *_dense(f"{decoder}.fc2", f"{ours_d}/feedforward_output_dense"),
    ]
    return RuleSet(prefixed(out, ["model.", ""]) + _heads(), alternatives=True,
                   name="huggingface('bart')", classes=TASKS)
