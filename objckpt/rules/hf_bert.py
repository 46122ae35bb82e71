"""Hugging Face BERT (`BertModel`, `BertFor...`) <-> keras-hub's `BertBackbone`.

Names and layouts follow keras-hub's own importer (`convert_bert.py`): a torch `Linear`
weight (out, in) is a Keras kernel (in, out); the attention projections are split by head,
query/key/value (hidden, hidden) <-> (hidden, heads, head_dim), their biases (hidden,) <->
(heads, head_dim), and the attention output (hidden, hidden) <-> (heads, head_dim, hidden).
Targets are the backbone's variable names (`transformer_layer_0/self_attention_layer/query/
kernel`), which restore matches and export names.

Restore accepts the names with or without the `bert.` prefix (`BertModel` saves them bare,
the task models under `bert.`) and LayerNorm parameters as `weight`/`bias` or as the older
`gamma`/`beta`; export writes them bare, as `BertModel.save_pretrained` does (keras-hub's
importer reads either). Task heads (`cls.*`, `classifier.*`) have no backbone variable.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, Reshape, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("bert",)
PREFIXES = ("", "bert.")  # the first is what export writes


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The BERT rule set needs `{key}` (a positive int) from the Hugging Face config; "
            f"received {value!r}. Fix: pass the checkpoint's folder (its config.json), or "
            f"config={{'hidden_size': ..., 'num_attention_heads': ...}}.")
    return value


def _layer_norms(source: str, target: str) -> list:
    """LayerNorm `weight`/`bias` (first: what export writes) and `gamma`/`beta`."""
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta"),
            Rule(f"{source}.gamma", f"{target}/gamma"), Rule(f"{source}.beta", f"{target}/beta")]


def _bare(config: dict) -> list:
    hidden = _size(config, "hidden_size")
    heads = _size(config, "num_attention_heads")
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The BERT rule set needs hidden_size divisible by num_attention_heads; received "
            f"{hidden} and {heads}. Fix: pass the checkpoint's own config.json.")
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    bias_heads = Reshape((hidden,), (heads, head_dim))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    source, target = "encoder.layer.{i}", "transformer_layer_{i}"
    attention = f"{target}/self_attention_layer"
    out = [
        Rule("embeddings.word_embeddings.weight", "token_embedding/embeddings"),
        Rule("embeddings.position_embeddings.weight", "position_embedding/embeddings"),
        Rule("embeddings.token_type_embeddings.weight", "segment_embedding/embeddings"),
        *_layer_norms("embeddings.LayerNorm", "embeddings_layer_norm"),
    ]
    for hf, keras in (("query", "query"), ("key", "key"), ("value", "value")):
        out += [Rule(f"{source}.attention.self.{hf}.weight", f"{attention}/{keras}/kernel",
                     into_heads),
                Rule(f"{source}.attention.self.{hf}.bias", f"{attention}/{keras}/bias",
                     bias_heads)]
    out += [
        Rule(f"{source}.attention.output.dense.weight", f"{attention}/attention_output/kernel",
             from_heads),
        Rule(f"{source}.attention.output.dense.bias", f"{attention}/attention_output/bias"),
        *_layer_norms(f"{source}.attention.output.LayerNorm",
                      f"{target}/self_attention_layer_norm"),
        Rule(f"{source}.intermediate.dense.weight",
             f"{target}/feedforward_intermediate_dense/kernel", Transpose()),
        Rule(f"{source}.intermediate.dense.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.output.dense.weight", f"{target}/feedforward_output_dense/kernel",
             Transpose()),
        Rule(f"{source}.output.dense.bias", f"{target}/feedforward_output_dense/bias"),
        *_layer_norms(f"{source}.output.LayerNorm", f"{target}/feedforward_layer_norm"),
        Rule("pooler.dense.weight", "pooled_dense/kernel", Transpose()),
        Rule("pooler.dense.bias", "pooled_dense/bias"),
    ]
    return out


def rules(config: dict) -> RuleSet:
    """The BERT rule set for a Hugging Face config (`hidden_size`, `num_attention_heads`).

    Example:
      >>> rules = objckpt.rules.huggingface("bert", config=hf_config)
      >>> objckpt.restore(keras_hub.models.BertBackbone(...), "bert_dir", rules=rules)
    """
    bare = _bare(config)
    return RuleSet([Rule(prefix + rule.source, rule.target, rule.transform)
                    for prefix in PREFIXES for rule in bare], alternatives=True)
