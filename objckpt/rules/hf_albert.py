"""Hugging Face ALBERT (`AlbertModel`, `AlbertFor...`) <-> keras-hub's `AlbertBackbone`.

Names and layouts follow keras-hub's importer (`convert_albert.py`): a torch `Linear` weight
(out, in) is a Keras kernel (in, out); the attention projections are split by head,
query/key/value (hidden, hidden) <-> (hidden, heads, head_dim), their biases (hidden,) <->
(heads, head_dim), and the attention output `attention.dense` (hidden, hidden) <-> (heads,
head_dim, hidden). ALBERT shares its layers: `num_hidden_groups` groups of `inner_group_num`
layers each (`encoder.albert_layer_groups.{g}.albert_layers.{j}`), which keras-hub holds as
`group_{g}_inner_layer_{j}` and runs `num_hidden_layers` times; the embeddings (of
`embedding_size`) are projected to the hidden size by `encoder.embedding_hidden_mapping_in`
(keras-hub's `embedding_projection`). Token types are keras-hub's segment embedding. Targets
are the backbone's variable names, which restore matches and export names.

Restore accepts the names with or without the `albert.` prefix (`AlbertModel` saves them
bare, the task classes under `albert.`) and LayerNorm parameters as `weight`/`bias` or as the
older `gamma`/`beta`; export writes a backbone's bare and a task model's under `albert.`, as
its Hub class does.

Heads (`CLASSES`): into keras-hub's `AlbertMaskedLM` the masked-LM head (`predictions.dense`,
`predictions.LayerNorm`, `predictions.bias`; the decoder weight is the word embedding, tied,
its bias `predictions.bias`, and transformers writes neither) and into `AlbertTextClassifier`
the classifier (`classifier.*`, on the pooled output) are restored; into the backbone they are
set aside, as the sentence-order, token-classification, multiple-choice and
question-answering heads always are. A class without a pooler (`AlbertForMaskedLM`, ...)
leaves `pooled_dense` without a value: named with that reason; `AlbertMaskedLM` does not use
it, so there it is listed and left as is.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_bert import layer_norms

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("albert",)
PREFIXES = ("", "albert.")  # the first is what a backbone's export writes

_MLM = ("predictions.dense.weight", "predictions.dense.bias", "predictions.LayerNorm.weight",
        "predictions.LayerNorm.bias", "predictions.bias", "predictions.decoder.weight",
        "predictions.decoder.bias")
_SOP = ("sop_classifier.classifier.weight", "sop_classifier.classifier.bias")
_CLASSIFIER = ("classifier.weight", "classifier.bias")
_QA = ("qa_outputs.weight", "qa_outputs.bias")

# Hub class -> (its backbone prefix, head entries as transformers names them, whether it
# has the pooler).
CLASSES = {
    "AlbertModel": ("", (), True),
    "AlbertForPreTraining": ("albert.", _MLM + _SOP, True),
    "AlbertForMaskedLM": ("albert.", _MLM, False),
    "AlbertForSequenceClassification": ("albert.", _CLASSIFIER, True),
    "AlbertForMultipleChoice": ("albert.", _CLASSIFIER, True),
    "AlbertForTokenClassification": ("albert.", _CLASSIFIER, False),
    "AlbertForQuestionAnswering": ("albert.", _QA, False),
}
# keras-hub model class -> the Hub class its heads are (export's `architectures`).
TASKS = {"AlbertBackbone": "AlbertModel", "AlbertMaskedLM": "AlbertForMaskedLM",
         "AlbertTextClassifier": "AlbertForSequenceClassification"}
# keras-hub task models that do not use the pooler: a folder without one is complete.
_NO_POOLER_USED = ("AlbertMaskedLM",)


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The ALBERT rule set needs `{key}` (a positive int) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            "config.json), or config={'hidden_size': ..., 'num_attention_heads': ...}.")
    return value


def _bare(config: dict) -> list:
    hidden = _size(config, "hidden_size")
    heads = _size(config, "num_attention_heads")
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The ALBERT rule set needs hidden_size divisible by num_attention_heads; "
            f"received {hidden} and {heads}. Fix: pass the checkpoint's own config.json.")
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    bias_heads = Reshape((hidden,), (heads, head_dim))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    source = "encoder.albert_layer_groups.{g}.albert_layers.{j}"
    target = "group_{g}_inner_layer_{j}"
    attention = f"{target}/self_attention_layer"
    out = [
        Rule("embeddings.word_embeddings.weight", "token_embedding/embeddings"),
        Rule("embeddings.position_embeddings.weight", "position_embedding/embeddings"),
        Rule("embeddings.token_type_embeddings.weight", "segment_embedding/embeddings"),
        *layer_norms("embeddings.LayerNorm", "embeddings_layer_norm"),
        Rule("encoder.embedding_hidden_mapping_in.weight", "embedding_projection/kernel",
             Transpose()),
        Rule("encoder.embedding_hidden_mapping_in.bias", "embedding_projection/bias"),
    ]
    for name in ("query", "key", "value"):
        out += [Rule(f"{source}.attention.{name}.weight", f"{attention}/{name}/kernel",
                     into_heads),
                Rule(f"{source}.attention.{name}.bias", f"{attention}/{name}/bias",
                     bias_heads)]
    out += [
        Rule(f"{source}.attention.dense.weight", f"{attention}/attention_output/kernel",
             from_heads),
        Rule(f"{source}.attention.dense.bias", f"{attention}/attention_output/bias"),
        *layer_norms(f"{source}.attention.LayerNorm", f"{target}/self_attention_layer_norm"),
        Rule(f"{source}.ffn.weight", f"{target}/feedforward_intermediate_dense/kernel",
             Transpose()),
        Rule(f"{source}.ffn.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.ffn_output.weight", f"{target}/feedforward_output_dense/kernel",
             Transpose()),
        Rule(f"{source}.ffn_output.bias", f"{target}/feedforward_output_dense/bias"),
        *layer_norms(f"{source}.full_layer_layer_norm", f"{target}/feedforward_layer_norm"),
    ]
    return out


def _classes_having(entry: str) -> str:
    return ", ".join(name for name, (_, heads, _) in CLASSES.items() if entry in heads)


def _heads() -> list:
    """The head entries: restored into the task model that has them, else set aside."""
    def head(source, target, transform=None):
        tied = {"predictions.decoder.weight": " (tied to the word embedding)",
                "predictions.decoder.bias": " (the same tensor as predictions.bias)"}
        return Rule(source, target, transform,
                    head=_classes_having(source) + tied.get(source, ""))

    mlm = "mlm_head"
    return [
        head("predictions.dense.weight", f"{mlm}/intermediate_dense/kernel", Transpose()),
        head("predictions.dense.bias", f"{mlm}/intermediate_dense/bias"),
        head("predictions.LayerNorm.weight", f"{mlm}/intermediate_layer_norm/gamma"),
        head("predictions.LayerNorm.bias", f"{mlm}/intermediate_layer_norm/beta"),
        head("predictions.bias", f"{mlm}/output_bias"),
        head("classifier.weight", "logits/kernel", Transpose()),
        head("classifier.bias", "logits/bias"),
        # no keras-hub variable: the decoder is the word embedding (tied), its bias
        # predictions.bias; keras-hub has no sentence-order or question-answering head
        *(head(name, f"{NOWHERE}/{name}")
          for name in ("predictions.decoder.weight", "predictions.decoder.bias", *_SOP,
                       *_QA)),
    ]


def _pooler(architecture: str) -> list:
    lacking = [name for name, (_, _, pooler) in CLASSES.items() if not pooler]
    if architecture in lacking:
        why = f"{architecture} has no pooler (its folder holds no `pooler.*`)"
    else:
        why = f"the folder holds no `pooler.*` ({', '.join(lacking)} have no pooler)"
    return [Rule(name, target, transform, absent=why, unused_by=_NO_POOLER_USED)
            for name, target, transform in (
                ("pooler.weight", "pooled_dense/kernel", Transpose()),
                ("pooler.bias", "pooled_dense/bias", None))]


def _folder_class(config: dict) -> str:
    named = config.get("architectures")
    return next((n for n in (named if isinstance(named, list) else ()) if n in CLASSES), "")


def rules(config: dict) -> RuleSet:
    """The ALBERT rule set for a Hugging Face config (`hidden_size`,
    `num_attention_heads`).

    Example:
      >>> rules = objckpt.rules.huggingface("albert", config=hf_config)
      >>> objckpt.restore(keras_hub.models.AlbertBackbone(...), "albert_dir", rules=rules)
    """
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else PREFIXES[0]
    bare = _bare(config) + _pooler(_folder_class(config))
    prefixes = (first, *(p for p in PREFIXES if p != first))
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(), alternatives=True,
                   name="huggingface('albert')", classes=TASKS)
