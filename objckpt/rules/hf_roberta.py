"""Hugging Face RoBERTa and XLM-RoBERTa (`RobertaModel`, `XLMRobertaFor...`) <-> keras-hub's
`RobertaBackbone` and `XLMRobertaBackbone`.

Names and layouts follow keras-hub's importers (`convert_roberta.py`,
`convert_xlm_roberta.py`): a torch `Linear` weight (out, in) is a Keras kernel (in, out); the
attention projections are split by head, query/key/value (hidden, hidden) <-> (hidden, heads,
head_dim), their biases (hidden,) <-> (heads, head_dim), and the attention output (hidden,
hidden) <-> (heads, head_dim, hidden). Targets are the backbone's variable names
(`transformer_layer_0/self_attention_layer/query/kernel`), which restore matches and export
names.

The embeddings are folded. transformers adds a token-type row to every token (RoBERTa's one
row: `token_type_ids` are zeros unless given) and numbers positions from `pad_token_id + 1`
(rows 0 and 1 are reserved: row 1 is the padding position, row 0 never used); keras-hub's
backbone has no token-type embedding and starts its positions at row 0. So keras-hub's
position rows are `position_embeddings[2:] + token_type_embeddings[0]` (a `Sum` of the two
entries, `Crop` dropping the reserved rows; with more token types, row 0 is taken): outputs
equal transformers' for a nonzero token-type row, as keras-hub's XLM-RoBERTa importer folds
it and its RoBERTa importer (which drops the row) does not. In 16-bit files the two are added
in float32 (what transformers computes in float32), so a 16-bit model takes the sum by a
lossy cast (`cast="lossy"`). Export writes the rows back with the reserved rows as zeros (row
1: what transformers' own initialisation gives the padding row, which training never moves;
row 0: read by no input) and the token-type row(s) as zeros: transformers reads the export
with nothing missing and the same outputs for any input without padding, and restoring the
export gives the model back bit for bit.

Restore accepts the names with or without the `roberta.` prefix (the base classes save them
bare, the task classes under `roberta.`, XLM-RoBERTa's too) and LayerNorm parameters as
`weight`/`bias` or as the older `gamma`/`beta`; export writes a backbone's bare and a task
model's under `roberta.`, as its Hub class does.

Heads (`CLASSES`): into keras-hub's `RobertaMaskedLM` (`XLMRobertaMaskedLM`) the masked-LM head
(`lm_head.dense`, `lm_head.layer_norm`, `lm_head.bias`; the decoder weight is the word
embedding, tied, its bias `lm_head.bias`, and transformers writes neither) and into
`RobertaTextClassifier` the classification head (`classifier.dense` -> `pooled_dense`,
`classifier.out_proj` -> `logits`) are restored; into the backbone they are set aside, as the
pooler (keras-hub's backbone has none), the causal-LM head's copy of the MLM head, the
token-classification, multiple-choice and question-answering heads always are.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Crop, Rule, RuleSet, Sum, Transpose
from objckpt.rules.hf_bert import encoder_layer, layer_norms

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("roberta", "xlm-roberta")
PREFIXES = ("", "roberta.")  # the first is what a backbone's export writes
_NAMES = {"roberta": ("Roberta", "RoBERTa"), "xlm-roberta": ("XLMRoberta", "XLM-RoBERTa")}

_LM = ("lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
       "lm_head.layer_norm.bias", "lm_head.bias", "lm_head.decoder.weight",
       "lm_head.decoder.bias")
_CLASSIFIER = ("classifier.dense.weight", "classifier.dense.bias",
               "classifier.out_proj.weight", "classifier.out_proj.bias")
_LINEAR = ("classifier.weight", "classifier.bias")
_QA = ("qa_outputs.weight", "qa_outputs.bias")
_POOLER = ("pooler.dense.weight", "pooler.dense.bias")


def _classes(stem: str) -> dict:
    """Hub class -> (its backbone prefix, head entries as transformers names them)."""
    return {
        f"{stem}Model": ("", _POOLER),
        f"{stem}ForMaskedLM": ("roberta.", _LM),
        f"{stem}ForCausalLM": ("roberta.", _LM),
        f"{stem}ForSequenceClassification": ("roberta.", _CLASSIFIER),
        f"{stem}ForMultipleChoice": ("roberta.", _LINEAR + tuple(
            "roberta." + name for name in _POOLER)),
        f"{stem}ForTokenClassification": ("roberta.", _LINEAR),
        f"{stem}ForQuestionAnswering": ("roberta.", _QA),
    }


def _tasks(stem: str) -> dict:
    """keras-hub model class -> the Hub class its heads are (export's `architectures`)."""
    return {f"{stem}Backbone": f"{stem}Model", f"{stem}MaskedLM": f"{stem}ForMaskedLM",
            f"{stem}TextClassifier": f"{stem}ForSequenceClassification"}


CLASSES = {**_classes("Roberta"), **_classes("XLMRoberta")}
TASKS = {**_tasks("Roberta"), **_tasks("XLMRoberta")}


def _error(shown: str, text: str, fix: str):
    """The error for a config the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"The {shown} rule set {text} Fix: {fix}")


def _size(config: dict, key: str, shown: str, default=None) -> int:
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        raise _error(shown, f"needs `{key}` (a positive int) from the Hugging Face config; "
                     f"received {value!r}.", "pass the checkpoint's folder (its "
                     "config.json), or config={'hidden_size': ..., 'num_attention_heads': "
                     "...}.")
    return value


def _embeddings(config: dict, shown: str) -> list:
    """Word embeddings, and the position rows folded with token type 0 (a `Sum`)."""
    pad = config.get("pad_token_id", 1)
    if pad != 1:
        raise _error(shown, f"needs `pad_token_id` 1 (positions start at row "
                     f"pad_token_id + 1 = 2, the offset keras-hub's backbone assumes); "
                     f"received {pad!r}.", "pass the checkpoint's own config.json; a "
                     "checkpoint with another padding id does not fit keras-hub's backbone.")
    types = _size(config, "type_vocab_size", shown, 1)
    first_type = Sum(2, 1, broadcast=(0,))
    if types > 1:  # token type 0 is what a model without token types computes with
        first_type = Chain(Crop(axis=0, after=types - 1), first_type)
    position = "embeddings/position_embedding/embeddings"
    return [
        Rule("embeddings.word_embeddings.weight", "embeddings/token_embedding/embeddings"),
        Rule("embeddings.position_embeddings.weight", position,
             Chain(Crop(axis=0, before=pad + 1), Sum(2, 0))),
        Rule("embeddings.token_type_embeddings.weight", position, first_type),
        *layer_norms("embeddings.LayerNorm", "embeddings_layer_norm"),
    ]


def _bare(config: dict, shown: str) -> list:
    hidden = _size(config, "hidden_size", shown)
    heads = _size(config, "num_attention_heads", shown)
    if hidden % heads:
        raise _error(shown, f"needs hidden_size divisible by num_attention_heads; received "
                     f"{hidden} and {heads}.", "pass the checkpoint's own config.json.")
    return _embeddings(config, shown) + encoder_layer(hidden, heads)


def _heads(classes: dict) -> list:
    """The head entries: restored into the task model that has them, else set aside."""
    def head(source, target, transform=None):
        having = ", ".join(n for n, (_, entries) in classes.items() if source in entries)
        tied = {"lm_head.decoder.weight": " (tied to the word embedding)",
                "lm_head.decoder.bias": " (the same tensor as lm_head.bias)"}.get(source, "")
        return Rule(source, target, transform, head=having + tied)

    mlm = "mlm_head"
    return [
        head("lm_head.dense.weight", f"{mlm}/intermediate_dense/kernel", Transpose()),
        head("lm_head.dense.bias", f"{mlm}/intermediate_dense/bias"),
        head("lm_head.layer_norm.weight", f"{mlm}/intermediate_layer_norm/gamma"),
        head("lm_head.layer_norm.bias", f"{mlm}/intermediate_layer_norm/beta"),
        head("lm_head.bias", f"{mlm}/output_bias"),
        head("classifier.dense.weight", "pooled_dense/kernel", Transpose()),
        head("classifier.dense.bias", "pooled_dense/bias"),
        head("classifier.out_proj.weight", "logits/kernel", Transpose()),
        head("classifier.out_proj.bias", "logits/bias"),
        # no keras-hub variable: the decoder is the word embedding (tied) and its bias
        # lm_head.bias; keras-hub's backbone has no pooler, and no task model for the
        # token-classification, multiple-choice or question-answering heads
        *(head(name, f"{NOWHERE}/{name}")
          for name in ("lm_head.decoder.weight", "lm_head.decoder.bias", *_LINEAR, *_QA,
                       *_POOLER, *("roberta." + n for n in _POOLER))),
    ]


def rules(config: dict) -> RuleSet:
    """The RoBERTa (or XLM-RoBERTa: `model_type` says) rule set for a Hugging Face config
    (`hidden_size`, `num_attention_heads`, `type_vocab_size`, `pad_token_id`).

    Example:
      >>> rules = objckpt.rules.huggingface("roberta", config=hf_config)
      >>> objckpt.restore(keras_hub.models.RobertaBackbone(...), "roberta_dir", rules=rules)
    """
    model_type = str(config.get("model_type", "roberta")).lower()
    stem, shown = _NAMES.get(model_type, _NAMES["roberta"])
    classes, tasks = _classes(stem), _tasks(stem)
    hub = tasks.get(config.get("task", ""), "")
    first = classes[hub][0] if hub else PREFIXES[0]
    prefixes = (first, *(p for p in PREFIXES if p != first))
    bare = _bare(config, shown)
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(classes), alternatives=True,
                   name=f"huggingface({model_type!r})", classes=tasks)
