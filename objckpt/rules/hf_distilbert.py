"""Hugging Face DistilBERT (`DistilBertModel`, `DistilBertFor...`) <-> keras-hub's
`DistilBertBackbone`.

Names and layouts follow keras-hub's own importer (`convert_distilbert.py`): a torch `Linear`
weight (out, in) is a Keras kernel (in, out); q/k/v (`q_lin`, `k_lin`, `v_lin`: (hidden,
hidden)) <-> (hidden, heads, head_dim), their biases (hidden,) <-> (heads, head_dim), and
`out_lin` (hidden, hidden) <-> (heads, head_dim, hidden). Targets are the backbone's variable
names (`transformer_layer_0/self_attention_layer/query/kernel`), which restore matches and
export names.

Restore accepts the names with or without the `distilbert.` prefix (`DistilBertModel` saves
them bare, the task classes under `distilbert.`) and LayerNorm parameters as `weight`/`bias`
or as the older `gamma`/`beta`; export writes a backbone's bare and a task model's under
`distilbert.`, as its Hub class does.

Heads (`CLASSES`): into keras-hub's `DistilBertMaskedLM` the masked-LM head (`vocab_transform`,
`vocab_layer_norm`, `vocab_projector.bias`; the projector's weight is the word embedding,
tied, and transformers writes none) and into `DistilBertTextClassifier` the classifier
(`pre_classifier`, `classifier`) are restored; into the backbone they are set aside, as the
token-classification, multiple-choice and question-answering heads always are (keras-hub has
no task model for them).
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("distilbert",)
PREFIXES = ("", "distilbert.")  # the first is what a backbone's export writes

_MLM = ("vocab_transform.weight", "vocab_transform.bias", "vocab_layer_norm.weight",
        "vocab_layer_norm.bias", "vocab_projector.bias", "vocab_projector.weight")
_CLASSIFIER = ("pre_classifier.weight", "pre_classifier.bias", "classifier.weight",
               "classifier.bias")
_QA = ("qa_outputs.weight", "qa_outputs.bias")

# Hub class -> (its backbone prefix, head entries as transformers names them).
CLASSES = {
    "DistilBertModel": ("", ()),
    "DistilBertForMaskedLM": ("distilbert.", _MLM),
    "DistilBertForSequenceClassification": ("distilbert.", _CLASSIFIER),
    "DistilBertForMultipleChoice": ("distilbert.", _CLASSIFIER),
    "DistilBertForTokenClassification": ("distilbert.", _CLASSIFIER[2:]),
    "DistilBertForQuestionAnswering": ("distilbert.", _QA),
}
# keras-hub model class -> the Hub class its heads are (export's `architectures`).
TASKS = {"DistilBertBackbone": "DistilBertModel", "DistilBertMaskedLM": "DistilBertForMaskedLM",
         "DistilBertTextClassifier": "DistilBertForSequenceClassification"}


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The DistilBERT rule set needs `{key}` (a positive int) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            "config.json), or config={'dim': ..., 'n_heads': ...}.")
    return value


def _norm(source: str, target: str) -> list:
    """LayerNorm `weight`/`bias` (first: what export writes) and `gamma`/`beta`."""
    return [Rule(f"{source}.{w}", f"{target}/{k}")
            for w, k in (("weight", "gamma"), ("bias", "beta"), ("gamma", "gamma"),
                         ("beta", "beta"))]


def _bare(config: dict) -> list:
    hidden, heads = _size(config, "dim"), _size(config, "n_heads")
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The DistilBERT rule set needs `dim` divisible by `n_heads`; received {hidden} "
            f"and {heads}. Fix: pass the checkpoint's own config.json.")
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    source, target = "transformer.layer.{i}", "transformer_layer_{i}"
    attention = f"{target}/self_attention_layer"
    embedding = "token_and_position_embedding"
    out = [
        Rule("embeddings.word_embeddings.weight", f"{embedding}/token_embedding/embeddings"),
        Rule("embeddings.position_embeddings.weight",
             f"{embedding}/position_embedding/embeddings"),
        *_norm("embeddings.LayerNorm", "embeddings_layer_norm"),
    ]
    for hf, keras in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
        out += [Rule(f"{source}.attention.{hf}.weight", f"{attention}/{keras}/kernel",
                     into_heads),
                Rule(f"{source}.attention.{hf}.bias", f"{attention}/{keras}/bias",
                     Reshape((hidden,), (heads, head_dim)))]
    out += [
        Rule(f"{source}.attention.out_lin.weight", f"{attention}/attention_output/kernel",
             from_heads),
        Rule(f"{source}.attention.out_lin.bias", f"{attention}/attention_output/bias"),
        *_norm(f"{source}.sa_layer_norm", f"{target}/self_attention_layer_norm"),
        Rule(f"{source}.ffn.lin1.weight", f"{target}/feedforward_intermediate_dense/kernel",
             Transpose()),
        Rule(f"{source}.ffn.lin1.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.ffn.lin2.weight", f"{target}/feedforward_output_dense/kernel",
             Transpose()),
        Rule(f"{source}.ffn.lin2.bias", f"{target}/feedforward_output_dense/bias"),
        *_norm(f"{source}.output_layer_norm", f"{target}/feedforward_layer_norm"),
    ]
    return out


def _heads() -> list:
    """The head entries: restored into the task model that has them, else set aside."""
    def head(source, target, transform=None):
        having = ", ".join(n for n, (_, heads) in CLASSES.items() if source in heads)
        tied = " (tied to the word embedding)" if source == "vocab_projector.weight" else ""
        return Rule(source, target, transform, head=having + tied)

    mlm = "mlm_head"
    return [
        head("vocab_transform.weight", f"{mlm}/intermediate_dense/kernel", Transpose()),
        head("vocab_transform.bias", f"{mlm}/intermediate_dense/bias"),
        head("vocab_layer_norm.weight", f"{mlm}/intermediate_layer_norm/gamma"),
        head("vocab_layer_norm.bias", f"{mlm}/intermediate_layer_norm/beta"),
        head("vocab_projector.bias", f"{mlm}/output_bias"),
        head("pre_classifier.weight", "pooled_dense/kernel", Transpose()),
        head("pre_classifier.bias", "pooled_dense/bias"),
        head("classifier.weight", "logits/kernel", Transpose()),
        head("classifier.bias", "logits/bias"),
        # no keras-hub variable: the projector's weight is the word embedding (tied),
        # keras-hub has no question-answering head
        *(head(name, f"{NOWHERE}/{name}") for name in ("vocab_projector.weight", *_QA)),
    ]


def rules(config: dict) -> RuleSet:
    """The DistilBERT rule set for a Hugging Face config (`dim`, `n_heads`)."""
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else PREFIXES[0]
    prefixes = (first, *(p for p in PREFIXES if p != first))
    bare = _bare(config)
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(), alternatives=True,
                   name="huggingface('distilbert')", classes=TASKS)
