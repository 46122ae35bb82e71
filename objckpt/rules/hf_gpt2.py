"""Hugging Face GPT-2 (`GPT2Model`, `GPT2LMHeadModel`) <-> keras-hub's `GPT2Backbone`.

Names and layouts follow keras-hub's own importer (`convert_gpt2.py`). GPT-2's layers are
`Conv1D`s whose weights are already (in, out), as a Keras kernel, so nothing is transposed.
The fused `attn.c_attn` weight (hidden, 3 * hidden) and bias (3 * hidden,) are cut into three
along their last axis (`Split(-1, parts=3, index=k)`: query, key, value), each reshaped by
head, (hidden, hidden) -> (hidden, heads, head_dim) and (hidden,) -> (heads, head_dim); export
concatenates the three back into one tensor. The attention output `attn.c_proj` (hidden,
hidden) is (heads, head_dim, hidden). Targets are the backbone's variable names
(`transformer_layer_0/self_attention/query/kernel`), which restore matches and export names.

Restore accepts the names with or without the `transformer.` prefix (`GPT2LMHeadModel`
saves them under it, `GPT2Model` bare); export writes them bare (keras-hub's importer reads
either). `lm_head.weight` has no rule: it is the token embedding (tied), which a
`GPT2LMHeadModel`'s safetensors file holds once, as `transformer.wte.weight`; the attention
masks (`attn.bias`, `attn.masked_bias`) some older files hold are buffers, not weights.

Hub classes (`CLASSES`): keras-hub's `GPT2CausalLM` has no variable beyond its backbone (its
logits are the tied token embedding), so a `GPT2LMHeadModel` folder restores into it as into
the backbone; a `lm_head.weight` that a file holds anyway, and the heads of the other
classes (`score.*`, `classifier.*`, `qa_outputs.*`, `multiple_choice_head.*`), have no
keras-hub variable and are set aside. Export of a `GPT2CausalLM` writes `transformer.`
names, as `GPT2LMHeadModel` saves them.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Split

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("gpt2",)
PREFIXES = ("", "transformer.")  # the first is what export writes (a backbone's set)

# Hub class -> (its prefix, head entries as transformers names them; `lm_head.weight` is tied
# and left out of the files transformers writes).
CLASSES = {
    "GPT2Model": ("", ()),
    "GPT2LMHeadModel": ("transformer.", ("lm_head.weight",)),
    "GPT2DoubleHeadsModel": ("transformer.", (
        "lm_head.weight", "multiple_choice_head.summary.weight",
        "multiple_choice_head.summary.bias")),
    "GPT2ForSequenceClassification": ("transformer.", ("score.weight",)),
    "GPT2ForTokenClassification": ("transformer.", ("classifier.weight", "classifier.bias")),
    "GPT2ForQuestionAnswering": ("transformer.", ("qa_outputs.weight", "qa_outputs.bias")),
}
TASKS = {"GPT2CausalLM": "GPT2LMHeadModel"}


def _heads() -> list:
    entries = dict.fromkeys(e for _, heads in CLASSES.values() for e in heads)
    out = []
    for entry in entries:
        having = ", ".join(n for n, (_, heads) in CLASSES.items() if entry in heads)
        tied = " (tied to the token embedding)" if entry == "lm_head.weight" else ""
        out.append(Rule(entry, f"{NOWHERE}/{entry}",
                        head=having + tied))
    return out


def _size(config: dict, key: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The GPT-2 rule set needs `{key}` (a positive int) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            "config.json), or config={'n_embd': ..., 'n_head': ...}.")
    return value


def _bare(config: dict) -> list:
    hidden = _size(config, "n_embd")
    heads = _size(config, "n_head")
    if hidden % heads:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The GPT-2 rule set needs n_embd divisible by n_head; received {hidden} and "
            f"{heads}. Fix: pass the checkpoint's own config.json.")
    head_dim = hidden // heads
    source, target = "h.{i}", "transformer_layer_{i}"
    attention = f"{target}/self_attention"
    out = [
        Rule("wte.weight", "token_embedding/embeddings"),
        Rule("wpe.weight", "position_embedding/embeddings"),
        Rule(f"{source}.ln_1.weight", f"{target}/self_attention_layer_norm/gamma"),
        Rule(f"{source}.ln_1.bias", f"{target}/self_attention_layer_norm/beta"),
    ]
    for index, name in enumerate(("query", "key", "value")):
        out += [
            Rule(f"{source}.attn.c_attn.weight", f"{attention}/{name}/kernel",
                 Chain(Split(-1, parts=3, index=index),
                       Reshape((hidden, hidden), (hidden, heads, head_dim)))),
            Rule(f"{source}.attn.c_attn.bias", f"{attention}/{name}/bias",
                 Chain(Split(-1, parts=3, index=index), Reshape((hidden,), (heads, head_dim)))),
        ]
    out += [
        Rule(f"{source}.attn.c_proj.weight", f"{attention}/attention_output/kernel",
             Reshape((hidden, hidden), (heads, head_dim, hidden))),
        Rule(f"{source}.attn.c_proj.bias", f"{attention}/attention_output/bias"),
        Rule(f"{source}.ln_2.weight", f"{target}/feedforward_layer_norm/gamma"),
        Rule(f"{source}.ln_2.bias", f"{target}/feedforward_layer_norm/beta"),
        Rule(f"{source}.mlp.c_fc.weight", f"{target}/feedforward_intermediate_dense/kernel"),
        Rule(f"{source}.mlp.c_fc.bias", f"{target}/feedforward_intermediate_dense/bias"),
        Rule(f"{source}.mlp.c_proj.weight", f"{target}/feedforward_output_dense/kernel"),
        Rule(f"{source}.mlp.c_proj.bias", f"{target}/feedforward_output_dense/bias"),
        Rule("ln_f.weight", "layer_norm/gamma"),
        Rule("ln_f.bias", "layer_norm/beta"),
    ]
    return out


def rules(config: dict) -> RuleSet:
    """The GPT-2 rule set for a Hugging Face config (`n_embd`, `n_head`).

    Example:
      >>> rules = objckpt.rules.huggingface("gpt2", config=hf_config)
      >>> objckpt.restore(keras_hub.models.GPT2Backbone(...), "gpt2_dir", rules=rules)
    """
    bare = _bare(config)
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else PREFIXES[0]
    prefixes = (first, *(p for p in PREFIXES if p != first))
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in bare] + _heads(), alternatives=True,
                   name="huggingface('gpt2')", classes=TASKS)
