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
importer reads either); the set for a task model (`huggingface(..., model=task)`, as restore
and export make it for one) writes them under `bert.`, as that task's Hub class does.

Heads (`CLASSES`: each Hub class and its head entries): into the backbone they are set aside
(listed as the head of their class); into keras-hub's `BertMaskedLM` the masked-LM head
(`cls.predictions.transform.*`, `cls.predictions.bias`) and into `BertTextClassifier` the
classifier (`classifier.*`) are restored. The decoder weight is the word embedding (tied),
the next-sentence and question-answering heads have no keras-hub layer: always set aside.
A class without a pooler (`BertForMaskedLM`, ...) leaves `pooled_dense` without a value:
named with that reason; `BertMaskedLM` does not use it, so there it is listed and left as is.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("bert",)
PREFIXES = ("", "bert.")  # the first is what export writes (a backbone's set)

_MLM = ("cls.predictions.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias", "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias")
_NSP = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")
_CLASSIFIER = ("classifier.weight", "classifier.bias")
_QA = ("qa_outputs.weight", "qa_outputs.bias")
_POOLER = ("pooler.dense.weight", "pooler.dense.bias")

# Hub class -> (its backbone prefix, head entries as transformers names them, whether it
# has the pooler). The decoder weight (tied to the word embeddings) and the decoder bias
# (the same tensor as `cls.predictions.bias`) are left out of files transformers writes.
CLASSES = {
    "BertModel": ("", (), True),
    "BertForPreTraining": ("bert.", _MLM + _NSP, True),
    "BertForMaskedLM": ("bert.", _MLM, False),
    "BertLMHeadModel": ("bert.", _MLM, False),
    "BertForNextSentencePrediction": ("bert.", _NSP, True),
    "BertForSequenceClassification": ("bert.", _CLASSIFIER, True),
    "BertForMultipleChoice": ("bert.", _CLASSIFIER, True),
    "BertForTokenClassification": ("bert.", _CLASSIFIER, False),
    "BertForQuestionAnswering": ("bert.", _QA, False),
}
# keras-hub model class -> the Hub class its heads are (export's `architectures`).
TASKS = {"BertBackbone": "BertModel", "BertMaskedLM": "BertForMaskedLM",
         "BertTextClassifier": "BertForSequenceClassification"}
# keras-hub task models that do not use the pooler: a folder without one is complete.
_NO_POOLER_USED = ("BertMaskedLM",)


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The BERT rule set needs `{key}` (a positive int) from the Hugging Face config; "
            f"received {value!r}. Fix: pass the checkpoint's folder (its config.json), or "
            f"config={{'hidden_size': ..., 'num_attention_heads': ...}}.")
    return value


def layer_norms(source: str, target: str) -> list:
    """LayerNorm `weight`/`bias` (first: what export writes) and `gamma`/`beta`."""
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta"),
            Rule(f"{source}.gamma", f"{target}/gamma"), Rule(f"{source}.beta", f"{target}/beta")]


def encoder_layer(hidden: int, heads: int) -> list:
    """The rules of BERT's encoder layers (`encoder.layer.{i}`, RoBERTa's too) onto
    keras-hub's (`transformer_layer_{i}`): q/k/v weights (hidden, hidden) <-> kernels (hidden,
    heads, head_dim), their biases <-> (heads, head_dim), the attention output (hidden,
    hidden) <-> (heads, head_dim, hidden), the feedforward `Linear` weights transposed, and
    both LayerNorms. `hidden` is a multiple of `heads` (checked by the caller)."""
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    bias_heads = Reshape((hidden,), (heads, head_dim))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    source, target = "encoder.layer.{i}", "transformer_layer_{i}"
    attention = f"{target}/self_attention_layer"
    out = []
    for hf, keras in (("query", "query"), ("key", "key"), ("value", "value")):
        out += [Rule(f"{source}.attention.self.{hf}.weight", f"{attention}/{keras}/kernel",
                     into_heads),
                Rule(f"{source}.attention.self.{hf}.bias", f"{attention}/{keras}/bias",
                     bias_heads)]
    out += [
        Rule(f"{source}.attention.output.dense.weight", f"{attention}/attention_output/kernel",
             from_heads),
        Rule(f"{source}.attention.output.dense.bias", f"{attention}/attention_output/bias"),
        *layer_norms(f"{source}.attention.output.LayerNorm",
                     f"{target}/self_attention_layer_norm"),
        Rule(f"{source}.intermediate.dense.weight",
             f"{target}/feedforward_intermediate_dense/kernel", Transpose()),
        Rule(f"{source}.intermediate.dense.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.output.dense.weight", f"{target}/feedforward_output_dense/kernel",
             Transpose()),
        Rule(f"{source}.output.dense.bias", f"{target}/feedforward_output_dense/bias"),
        *layer_norms(f"{source}.output.LayerNorm", f"{target}/feedforward_layer_norm"),
    ]
    return out


def _bare(config: dict) -> list:
    hidden = _size(config, "hidden_size")
    heads = _size(config, "num_attention_heads")
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The BERT rule set needs hidden_size divisible by num_attention_heads; received "
            f"{hidden} and {heads}. Fix: pass the checkpoint's own config.json.")
    return [
        Rule("embeddings.word_embeddings.weight", "token_embedding/embeddings"),
        Rule("embeddings.position_embeddings.weight", "position_embedding/embeddings"),
        Rule("embeddings.token_type_embeddings.weight", "segment_embedding/embeddings"),
        *layer_norms("embeddings.LayerNorm", "embeddings_layer_norm"),
        *encoder_layer(hidden, heads),
    ]


def _classes_having(entry: str) -> str:
    return ", ".join(name for name, (_, heads, _) in CLASSES.items() if entry in heads)


def _heads() -> list:
    """The head entries: restored into the task model that has them, else set aside."""
    def head(source, target, transform=None):
        return Rule(source, target, transform, head=_classes_having(source))

    mlm = "masked_lm_head"
    out = [
        head("cls.predictions.transform.dense.weight", f"{mlm}/intermediate_dense/kernel",
             Transpose()),
        head("cls.predictions.transform.dense.bias", f"{mlm}/intermediate_dense/bias"),
        head("cls.predictions.transform.LayerNorm.weight",
             f"{mlm}/intermediate_layer_norm/gamma"),
        head("cls.predictions.transform.LayerNorm.bias", f"{mlm}/intermediate_layer_norm/beta"),
        head("cls.predictions.bias", f"{mlm}/bias"),
        head("classifier.weight", "output_dense/kernel", Transpose()),
        head("classifier.bias", "output_dense/bias"),
    ]
    # No keras-hub variable: the decoder is the word embedding (tied), its bias the same
    # tensor as `cls.predictions.bias`; keras-hub has no next-sentence or QA head.
    out += [head(name, f"{NOWHERE}/{name}")
            for name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                         *_NSP, *_QA)]
    return out


def _pooler(architecture: str) -> list:
    lacking = [name for name, (_, _, pooler) in CLASSES.items() if not pooler]
    if architecture in lacking:
        why = f"{architecture} has no pooler (its folder holds no `pooler.dense.*`)"
    else:
        why = (f"the folder holds no `pooler.dense.*` ({', '.join(lacking)} have no "
               "pooler)")
    return [Rule(name, target, transform, absent=why, unused_by=_NO_POOLER_USED)
            for name, target, transform in (
                ("pooler.dense.weight", "pooled_dense/kernel", Transpose()),
                ("pooler.dense.bias", "pooled_dense/bias", None))]


def folder_class(config: dict, classes) -> str:
    """The first of the config's `architectures` in `classes`, else ''."""
    named = config.get("architectures")
    for name in named if isinstance(named, list) else ():
        if name in classes:
            return name
    return ""


def rules(config: dict) -> RuleSet:
    """The BERT rule set for a Hugging Face config (`hidden_size`, `num_attention_heads`).

    Example:
      >>> rules = objckpt.rules.huggingface("bert", config=hf_config)
      >>> objckpt.restore(keras_hub.models.BertBackbone(...), "bert_dir", rules=rules)
    """
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else PREFIXES[0]
    bare = _bare(config) + _pooler(folder_class(config, CLASSES))
    prefixes = (first, *(p for p in PREFIXES if p != first))
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(), alternatives=True,
                   name="huggingface('bert')", classes=TASKS)
