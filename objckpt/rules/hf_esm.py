"""Hugging Face ESM (`EsmModel`, `EsmForMaskedLM`, ...) <-> keras-hub's `ESMBackbone`.

Names and layouts follow keras-hub's importer (`convert_esm.py`): a torch `Linear` weight
(out, in) is a Keras kernel (in, out); ESM's attention projections are plain dense layers in
keras-hub (`q_dense_layer`, ... `o_dense_layer`: (hidden, hidden) kernels, (hidden,)
biases). Every layer normalises before its attention (`attention.LayerNorm` ->
`attention_norm`) and before its feed-forward (`LayerNorm` -> `ffn_norm`); the encoder's
final norm is `encoder.emb_layer_norm_after` -> `output_layer_norm`, an ESM-1b-style
embedding norm (`emb_layer_norm_before`) `embeddings.layer_norm` -> `emb_layer_norm`.

Positions. ESM-2 (`position_embedding_type` "rotary") has no position weights: both sides
compute the rotary frequencies from the head size (transformers' `rope_theta`, keras-hub's
`max_wavelength`: 10000 for every published ESM). transformers nonetheless saves the
frequencies, a buffer: per layer in the published checkpoints
(`encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq`), once under a literal `*`
as transformers 5.24 writes it (`encoder.layer.*.attention.self.rotary_embeddings.inv_freq`).
Restore sets them aside (keras-hub has no variable) and export writes none: transformers
computes them when it loads the export (`missing_keys` names the `rotary_embeddings.inv_freq`
it made). ESM-1 (`"absolute"`) numbers positions from `pad_token_id + 1`, as RoBERTa does,
while keras-hub's backbone reads its rows from `pad_token_id` on: keras-hub's row k is
transformers' row k + 1 (`Crop` of row 0, a zero row `Pad`ded at the end, read by no input
the table fits); export writes row 0 back as zeros (transformers reads it for no input:
padding reads row `pad_token_id`, tokens the rows after it).

Heads (`CLASSES`): into keras-hub's `ESMMaskedPLM` the masked-LM head (`lm_head.dense` ->
`mlm_head/intermediate_dense`, `lm_head.layer_norm` -> `mlm_head/intermediate_layer_norm`,
`lm_head.bias` -> `mlm_head/output_bias`) is restored; keras-hub's head has its own output
kernel, which with tied embeddings (`tie_word_embeddings`, ESM's default: transformers writes
no `lm_head.decoder.weight`) is the word embedding transposed (one entry feeds both; export
writes it once, after checking that both agree), else `lm_head.decoder.weight`. Into
`ESMProteinClassifier` the classification head (`classifier.dense` -> `pooled_dense`,
`classifier.out_proj` -> `logits`: the first token's state, as transformers takes it).
Into the backbone they are set aside, as the pooler, the contact-prediction head
(`contact_head.regression`: keras-hub has none, so export writes none and transformers
initialises it anew) and the token-classification head always are.

transformers scales the embeddings by 0.88 when `token_dropout` is true and no token is the
mask token (ESM-2's configs; keras-hub's backbone never scales): the set maps the weights
the same way for either value; keras-hub's outputs equal transformers' for `token_dropout`
false.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Crop, Pad, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("esm",)
PREFIXES = ("", "esm.")  # the first is what a backbone's export writes

_LM = ("lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
       "lm_head.layer_norm.bias", "lm_head.bias", "lm_head.decoder.weight")
_CLASSIFIER = ("classifier.dense.weight", "classifier.dense.bias",
               "classifier.out_proj.weight", "classifier.out_proj.bias")
_LINEAR = ("classifier.weight", "classifier.bias")
_POOLER = ("pooler.dense.weight", "pooler.dense.bias")
_CONTACT = ("contact_head.regression.weight", "contact_head.regression.bias")

# Hub class -> (its backbone prefix, head entries as transformers names them)
CLASSES = {
    "EsmModel": ("", _POOLER + _CONTACT),
    "EsmForMaskedLM": ("esm.", _LM + tuple("esm." + name for name in _CONTACT)),
    "EsmForSequenceClassification": ("esm.", _CLASSIFIER + tuple(
        "esm." + name for name in _CONTACT)),
    "EsmForTokenClassification": ("esm.", _LINEAR + tuple("esm." + name for name in _CONTACT)),
}
# keras-hub model class -> the Hub class its heads are (export's `architectures`)
TASKS = {"ESMBackbone": "EsmModel", "ESMMaskedPLM": "EsmForMaskedLM",
         "ESMProteinClassifier": "EsmForSequenceClassification"}
_STARRED = "encoder.layer.*.attention.self.rotary_embeddings.inv_freq"
_FREQUENCIES = ("the rotary frequencies (a buffer transformers saves and computes again; "
                "keras-hub's ESMBackbone computes them and has no variable)")


def _error(text: str, fix: str):
    """The error for a config the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"The ESM rule set {text} Fix: {fix}")


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        raise _error(f"needs `{key}` (a positive int) from the Hugging Face config; received "
                     f"{value!r}.", "pass the checkpoint's folder (its config.json), or "
                     "config={'num_hidden_layers': ..., 'position_embedding_type': ...}.")
    return value


def _norm(source: str, target: str) -> list:
    """A LayerNorm's two entries as `weight`/`bias` or `gamma`/`beta`, the first pair what
    export writes: transformers 5 writes ESM's norms named `LayerNorm` as `gamma`/`beta`
    (its "legacy" renaming, reversed on save), the others as `weight`/`bias`."""
    names = [("weight", "gamma"), ("bias", "beta"), ("gamma", "gamma"), ("beta", "beta")]
    if source.endswith("LayerNorm"):
        names = names[2:] + names[:2]
    return [Rule(f"{source}.{name}", f"{target}/{keras}") for name, keras in names]


def _positions(config: dict) -> list:
    kind = config.get("position_embedding_type", "absolute")
    if kind == "rotary":
        # per layer (older transformers), once under a literal `*` (transformers 5's
        # save_pretrained maps its one buffer back so), or once (its own form)
        return [Rule(source, f"{NOWHERE}/{target}", head=_FREQUENCIES) for source, target in (
            ("encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq",
             "rotary_embeddings_{i}"),
            (_STARRED, "rotary_embeddings_starred"),
            ("rotary_embeddings.inv_freq", "rotary_embeddings"))]
    if kind != "absolute":
        raise _error(f"needs `position_embedding_type` 'rotary' or 'absolute' (what "
                     f"keras-hub's ESMBackbone builds); received {kind!r}.",
                     "pass the checkpoint's own config.json.")
    pad = config.get("pad_token_id")
    if type(pad) is not int or pad < 0:
        raise _error(f"needs `pad_token_id` (an int >= 0: absolute positions start at "
                     f"pad_token_id + 1) from the Hugging Face config; received {pad!r}.",
                     "pass the checkpoint's own config.json.")
    _size(config, "max_position_embeddings")
    # keras-hub reads rows pad.., transformers pad + 1..: keras-hub's row k is its k + 1
    return [Rule("embeddings.position_embeddings.weight",
                 "position_embedding/embeddings",
                 Chain(Crop(axis=0, before=1), Pad(axis=0, after=1)))]


def _bare(config: dict) -> list:
    _size(config, "hidden_size")
    _size(config, "num_attention_heads")
    source, target = "encoder.layer.{i}", "transformer_layer_{i}"
    attention = f"{target}/attention_layer"
    out = [Rule("embeddings.word_embeddings.weight", "token_embedding/embeddings"),
           *_positions(config),
           *_norm("embeddings.layer_norm", "emb_layer_norm"),
           *_norm("encoder.emb_layer_norm_after", "output_layer_norm")]
    for name, keras in (("self.query", "q"), ("self.key", "k"), ("self.value", "v"),
                        ("output.dense", "o")):
        out += [Rule(f"{source}.attention.{name}.weight", f"{attention}/{keras}_dense_layer/kernel",
                     Transpose()),
                Rule(f"{source}.attention.{name}.bias", f"{attention}/{keras}_dense_layer/bias")]
    out += [
        *_norm(f"{source}.attention.LayerNorm", f"{target}/attention_norm"),
        Rule(f"{source}.intermediate.dense.weight",
             f"{target}/feedforward_intermediate_dense/kernel", Transpose()),
        Rule(f"{source}.intermediate.dense.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.output.dense.weight", f"{target}/feedforward_output_dense/kernel",
             Transpose()),
        Rule(f"{source}.output.dense.bias", f"{target}/feedforward_output_dense/bias"),
        *_norm(f"{source}.LayerNorm", f"{target}/ffn_norm"),
    ]
    return out


def _head(source, target, transform=None, tied=""):
    having = ", ".join(n for n, (_, entries) in CLASSES.items() if source in entries)
    return Rule(source, target, transform, head=having + tied)


def _heads(tied: bool, prefixes: tuple) -> list:
    mlm = "mlm_head"
    out = [
        _head("lm_head.dense.weight", f"{mlm}/intermediate_dense/kernel", Transpose()),
        _head("lm_head.dense.bias", f"{mlm}/intermediate_dense/bias"),
        _head("lm_head.layer_norm.weight", f"{mlm}/intermediate_layer_norm/gamma"),
        _head("lm_head.layer_norm.bias", f"{mlm}/intermediate_layer_norm/beta"),
        _head("lm_head.bias", f"{mlm}/output_bias"),
        _head("classifier.dense.weight", "pooled_dense/kernel", Transpose()),
        _head("classifier.dense.bias", "pooled_dense/bias"),
        _head("classifier.out_proj.weight", "logits/kernel", Transpose()),
        _head("classifier.out_proj.bias", "logits/bias"),
    ]
    if tied:
        out += [Rule(prefix + "embeddings.word_embeddings.weight", f"{mlm}/output_kernel",
                     Transpose()) for prefix in prefixes]
    out.append(_head("lm_head.decoder.weight", f"{mlm}/output_kernel", Transpose()))
    # no keras-hub variable: no pooler, contact-prediction or token-classification head
    out += [_head(prefix + name, f"{NOWHERE}/{prefix}{name}")
            for name in (*_POOLER, *_CONTACT, *_LINEAR) for prefix in ("", "esm.")
            if prefix + name in {e for _, entries in CLASSES.values() for e in entries}]
    return out


def rules(config: dict) -> RuleSet:
    """The ESM rule set for a Hugging Face config (`hidden_size`, `num_attention_heads`,
    `position_embedding_type`, `pad_token_id`, `tie_word_embeddings`).

    Example:
      >>> rules = objckpt.rules.huggingface("esm", config=hf_config)
      >>> objckpt.restore(keras_hub.models.ESMBackbone(...), "esm_dir", rules=rules)
    """
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else PREFIXES[0]
    prefixes = (first, *(p for p in PREFIXES if p != first))
    bare = _bare(config)
    # tied: the word embedding feeds ESMMaskedPLM's output kernel too (a model without
    # that head has no such variable for it to feed)
    tied = bool(config.get("tie_word_embeddings", True)) and hub == "EsmForMaskedLM"
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(tied, prefixes), alternatives=True,
                   name="huggingface('esm')", classes=TASKS)
