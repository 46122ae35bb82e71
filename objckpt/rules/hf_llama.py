"""Hugging Face Llama (`LlamaForCausalLM` / `LlamaModel`) <-> keras-hub's `Llama3Backbone`.

Names and layouts follow keras-hub's own importer (`convert_llama3.py`): a torch `Linear`
weight (out, in) is a Keras kernel (in, out); the attention projections are split by head,
q/k/v (heads * head_dim, hidden) <-> (hidden, heads, head_dim) and o (hidden, heads *
head_dim) <-> (heads, head_dim, hidden). Targets are the backbone's variable names
(`transformer_layer_0/self_attention/query/kernel`), which restore matches and export
names. `lm_head.weight` feeds the untied output embedding (`tie_word_embeddings` false,
transformers' default for Llama); with tied embeddings `model.embed_tokens.weight` is both.

Hub classes (`CLASSES`): `LlamaModel` saves the decoder bare (`embed_tokens.weight`), the
task classes under `model.` (`LlamaForQuestionAnswering` under `transformer.`); restore
accepts each, export writes `model.`. keras-hub's `Llama3CausalLM` has no variable beyond its
backbone (its logits are the output embedding), so `lm_head.weight` is the only head it
takes; the classification and question-answering heads (`score.*`, `qa_outputs.*`) have no
keras-hub task model and are set aside, as a tied `lm_head.weight` is.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("llama",)

_SCORE, _TOKENS, _QA = ("score.weight",), ("score.weight", "score.bias"), (
    "qa_outputs.weight", "qa_outputs.bias")


def hub_classes(name: str, *, qa_prefix: str = "model.") -> dict:
    """Hub class -> (its decoder prefix, head entries as transformers names them) of a
    Llama-style architecture `name` (`Llama`, `Mistral`, `Gemma`, `Gemma2`)."""
    return {
        f"{name}Model": ("", ()),
        f"{name}ForCausalLM": ("model.", ("lm_head.weight",)),
        f"{name}ForSequenceClassification": ("model.", _SCORE),
        f"{name}ForTokenClassification": ("model.", _TOKENS),
        f"{name}ForQuestionAnswering": (qa_prefix, _QA),
    }


CLASSES = hub_classes("Llama", qa_prefix="transformer.")
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Llama3CausalLM": "LlamaForCausalLM", "LlamaCausalLM": "LlamaForCausalLM"}


def head_rules(classes: dict, *, lm_head: bool) -> list:
    """Heads without a keras-hub variable, set aside wherever they appear (`lm_head.weight`
    too when `lm_head` is False: tied to the token embedding)."""
    def having(entry):
        return ", ".join(n for n, (_, heads) in classes.items() if entry in heads)

    names = [n for n in [*_TOKENS, *_QA] + ([] if lm_head else ["lm_head.weight"])
             if having(n)]
    return [Rule(n, f"{NOWHERE}/{n}",
                 head=having(n) + (" (tied to the token embedding)" if n == "lm_head.weight"
                                   else "")) for n in names]


def prefixed(rules: list, prefixes) -> list:
    """Each `model.` rule once per prefix (the first is what export writes); others as they
    are."""
    out = []
    for prefix in prefixes:
        out += [r.with_source(prefix + r.source[len("model."):]) for r in rules
                if r.source.startswith("model.")]
    return out + [r for r in rules if not r.source.startswith("model.")]


def config_size(config: dict, key: str, model: str, default=None) -> int:
    """`config[key]` (else `default`), a positive int; InvalidArgumentError naming the
    `model` rule set, the key and the fix otherwise."""
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {model} rule set needs `{key}` (a positive int) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            f"config.json), or config={{'{key}': ..., ...}}.")
    return value


def config_part(config: dict, key: str, model: str, example: str, *, where: str = "",
                default=None) -> dict:
    """`config[key]` (else `default`), a dict (a sub-config such as `vision_config`);
    InvalidArgumentError naming the `model` rule set, the key (under `where`, e.g.
    "encoder.") and the fix: the folder, or `config=` as `example` shows."""
    value = config.get(key, default)
    if not isinstance(value, dict):
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {model} rule set needs `{where}{key}` (a dict) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            f"config.json), or config={example}.")
    return value


def attention_rules(layer: str, attention: str, config: dict, model: str, *,
                    head_dim: int | None = None) -> list:
    """q/k/v/o of Hugging Face's `self_attn` <-> a keras-hub `CachedAttention`-style
    layer whose q/k/v kernels are (hidden, heads, head_dim) and o (heads, head_dim,
    hidden)."""
    hidden = config_size(config, "hidden_size", model)
    heads = config_size(config, "num_attention_heads", model)
    kv_heads = config_size(config, "num_key_value_heads", model, heads)
    head_dim = head_dim or hidden // heads
    source = "model.layers.{i}.self_attn"
    target = f"{layer}/{attention}"

    def into_heads(n):  # (n * head_dim, hidden) -> (hidden, n, head_dim)
        return Chain(Transpose(), Reshape((hidden, n * head_dim), (hidden, n, head_dim)))

    return [
        Rule(f"{source}.q_proj.weight", f"{target}/query/kernel", into_heads(heads)),
        Rule(f"{source}.k_proj.weight", f"{target}/key/kernel", into_heads(kv_heads)),
        Rule(f"{source}.v_proj.weight", f"{target}/value/kernel", into_heads(kv_heads)),
        Rule(f"{source}.o_proj.weight", f"{target}/attention_output/kernel",
             Chain(Transpose(), Reshape((heads * head_dim, hidden), (heads, head_dim, hidden)))),
    ]


def decoder_rules(config: dict, model: str, *, head_dim: int | None = None,
                  lm_head: bool, classes: dict | None = None, tasks=None) -> RuleSet:
    """The Llama-style decoder shared by keras-hub's Llama3 and Mistral backbones."""
    layer = "transformer_layer_{i}"
    out = [Rule("model.embed_tokens.weight", "token_embedding/embeddings")]
    classes = CLASSES if classes is None else classes
    if lm_head:
        lacking = [n for n, (_, heads) in classes.items() if "lm_head.weight" not in heads]
        named = config.get("architectures")
        hub = next((n for n in (named if isinstance(named, list) else ()) if n in lacking), "")
        why = (f"{hub} has no LM head (its folder holds no `lm_head.weight`)" if hub else
               f"the folder holds no `lm_head.weight` ({', '.join(lacking)} have no LM head)")
        out.append(Rule("lm_head.weight", "token_embedding/reverse_embeddings", Transpose(),
                        absent=why))
    out += [
        Rule("model.norm.weight", "sequence_output_layernorm/scale"),
        Rule("model.layers.{i}.input_layernorm.weight",
             f"{layer}/self_attention_layernorm/scale"),
        Rule("model.layers.{i}.post_attention_layernorm.weight",
             f"{layer}/feedforward_layernorm/scale"),
        *attention_rules(layer, "self_attention", config, model, head_dim=head_dim),
        Rule("model.layers.{i}.mlp.gate_proj.weight",
             f"{layer}/feedforward_gate_dense/kernel", Transpose()),
        Rule("model.layers.{i}.mlp.up_proj.weight",
             f"{layer}/feedforward_intermediate_dense/kernel", Transpose()),
        Rule("model.layers.{i}.mlp.down_proj.weight",
             f"{layer}/feedforward_output_dense/kernel", Transpose()),
    ]
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in classes.values())]))
    return RuleSet(prefixed(out, prefixes) + head_rules(classes, lm_head=lm_head),
                   alternatives=True, name=f"huggingface({config.get('model_type', '')!r})",
                   classes=TASKS if tasks is None else tasks)


def rules(config: dict) -> RuleSet:
    """The Llama rule set for a Hugging Face config (sizes decide the head reshapes)."""
    tied = bool(config.get("tie_word_embeddings", False))
    return decoder_rules(config, "Llama", lm_head=not tied)
