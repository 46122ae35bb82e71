"""Hugging Face Qwen2 and Qwen3 (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`, ...) <-> keras-hub's
`QwenBackbone` and `Qwen3Backbone`.

The decoder is Llama's (`objckpt.rules.hf_llama`: the same names on both sides, q/k/v
weights (heads * head_dim, hidden) <-> kernels (hidden, heads, head_dim), o (hidden, heads *
head_dim) <-> (heads, head_dim, hidden), MLP `Linear` weights transposed), as keras-hub's
importers `convert_qwen.py` and `convert_qwen3.py` read it, plus what each adds:

- Qwen2: biases on q/k/v, (heads * head_dim,) <-> (heads, head_dim); `head_dim` from the
  config where it has one (transformers' default: hidden_size / num_attention_heads, the
  only one keras-hub's `QwenBackbone` builds);
- Qwen3: `head_dim` from the config (it may differ from hidden_size / num_attention_heads)
  and an RMS norm over each head's queries and keys (`q_norm`, `k_norm`: (head_dim,),
  keras-hub's `query_dense_layernorm` and `key_dense_layernorm`), no biases.

`lm_head.weight` feeds the untied output embedding (`tie_word_embeddings` false: Qwen2's
and Qwen3's default in transformers); tied, transformers writes none and the token
embedding is both. Hub classes (`CLASSES`) as Llama's, the question-answering class under
`transformer.`; keras-hub's `QwenCausalLM` and `Qwen3CausalLM` have no variable beyond their
backbone, the classification and question-answering heads no keras-hub task model: set
aside.
"""

from __future__ import annotations

from objckpt.rules.core import Reshape, Rule, RuleSet
from objckpt.rules.hf_llama import decoder_rules, hub_classes, prefixed

__all__ = ["MODEL_TYPES", "attention_extra", "rules"]

MODEL_TYPES = ("qwen2", "qwen3")
_NAMES = {"qwen2": "Qwen2", "qwen3": "Qwen3"}
CLASSES = {**hub_classes("Qwen2", qa_prefix="transformer."),
           **hub_classes("Qwen3", qa_prefix="transformer.")}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"qwen2": {"QwenCausalLM": "Qwen2ForCausalLM", "Qwen2CausalLM": "Qwen2ForCausalLM"},
         "qwen3": {"Qwen3CausalLM": "Qwen3ForCausalLM"}}


def attention_extra(config: dict, qwen3: bool, head_dim: int) -> list:
    """What Qwen2 (q/k/v biases) or Qwen3 (per-head q/k norms) adds to Llama's attention
    (their mixture-of-experts decoders' too)."""
    source, target = "model.layers.{i}.self_attn", "transformer_layer_{i}/self_attention"
    if qwen3:
        return [Rule(f"{source}.q_norm.weight", f"{target}/query_dense_layernorm/scale"),
                Rule(f"{source}.k_norm.weight", f"{target}/key_dense_layernorm/scale")]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    return [Rule(f"{source}.{hf}_proj.bias", f"{target}/{keras}/bias",
                 Reshape((n * head_dim,), (n, head_dim)))
            for hf, keras, n in (("q", "query", heads), ("k", "key", kv_heads),
                                 ("v", "value", kv_heads))]


def rules(config: dict) -> RuleSet:
    """The Qwen2 or Qwen3 (by `model_type`) rule set for a Hugging Face config (sizes decide
    the head reshapes)."""
    model_type = str(config.get("model_type", "qwen2")).lower()
    qwen3 = model_type == "qwen3"
    name = _NAMES["qwen3" if qwen3 else "qwen2"]
    classes = {k: v for k, v in CLASSES.items() if k.startswith(name)}
    tasks = TASKS["qwen3" if qwen3 else "qwen2"]
    given = config.get("head_dim")  # Qwen2's too where its config.json has one
    if (qwen3 or given is not None) and (type(given) is not int or given <= 0):
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {name} rule set needs `head_dim` (a positive int) from the Hugging Face "
            f"config{'' if qwen3 else ' where it has one'}; received {given!r} (it may "
            "differ from hidden_size / num_attention_heads). Fix: pass the checkpoint's "
            "folder (its config.json), or config={'head_dim': ..., ...}.")
    base = decoder_rules(config, name, head_dim=given or None,
                         lm_head=not config.get("tie_word_embeddings", False),
                         classes=classes, tasks=tasks)
    # decoder_rules checked the sizes (positive ints): the reshapes below can use them
    head_dim = given or config["hidden_size"] // config["num_attention_heads"]
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in classes.values())]))
    return RuleSet([*base, *prefixed(attention_extra(config, qwen3, head_dim), prefixes)],
                   alternatives=True, name=base.name, classes=tasks)
