"""Hugging Face Gemma and Gemma 2 (`GemmaForCausalLM`, `Gemma2ForCausalLM`) <-> keras-hub's
`GemmaBackbone`.

Names and layouts follow keras-hub's importer (`convert_gemma.py`): q/k/v weights
(heads * head_dim, hidden) <-> kernels (heads, hidden, head_dim), o (hidden, heads *
head_dim) <-> (heads, head_dim, hidden), MLP `Linear` weights transposed, norms as they
are. The embedding is tied: one tensor, `model.embed_tokens.weight`, is keras-hub's
`ReversibleEmbedding` (no `lm_head.weight`). Gemma 2 adds norms after attention and after
the feed-forward block, and names the pre-feed-forward norm `pre_feedforward_layernorm`
(Gemma's is `post_attention_layernorm`). Targets are the backbone's variable names.

Hub classes (`CLASSES`) as Llama's: `GemmaModel` saves the decoder bare, the task classes
under `model.`; `lm_head.weight` (tied) and the classification heads have no keras-hub
variable and are set aside; `GemmaCausalLM` has none beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import head_rules, hub_classes, prefixed

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("gemma", "gemma2")
CLASSES = {**hub_classes("Gemma"), **hub_classes("Gemma2")}
for _qa in ("GemmaForQuestionAnswering", "Gemma2ForQuestionAnswering"):  # none in transformers
    del CLASSES[_qa]
TASKS = {"GemmaCausalLM": "GemmaForCausalLM"}


def _size(config: dict, key: str, default=None) -> int:
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The Gemma rule set needs `{key}` (a positive int) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            f"config.json), or config={{'{key}': ..., ...}}.")
    return value


def rules(config: dict) -> RuleSet:
    """The Gemma (or Gemma 2, by `model_type`) rule set for a Hugging Face config."""
    hidden = _size(config, "hidden_size")
    heads = _size(config, "num_attention_heads")
    kv_heads = _size(config, "num_key_value_heads", heads)
    head_dim = _size(config, "head_dim", hidden // heads if hidden % heads == 0 else None)
    gemma2 = str(config.get("model_type", "gemma")).lower() == "gemma2"
    layer, source = "decoder_block_{i}", "model.layers.{i}"

    def into_heads(n):  # (n * head_dim, hidden) -> (n, hidden, head_dim)
        return Chain(Reshape((n * head_dim, hidden), (n, head_dim, hidden)),
                     Transpose((0, 2, 1)))

    out = [
        Rule("model.embed_tokens.weight", "token_embedding/embeddings"),
        Rule("model.norm.weight", "final_normalization/scale"),
        Rule(f"{source}.input_layernorm.weight", f"{layer}/pre_attention_norm/scale"),
    ]
    if gemma2:
        out += [
            Rule(f"{source}.post_attention_layernorm.weight",
                 f"{layer}/post_attention_norm/scale"),
            Rule(f"{source}.pre_feedforward_layernorm.weight", f"{layer}/pre_ffw_norm/scale"),
            Rule(f"{source}.post_feedforward_layernorm.weight",
                 f"{layer}/post_ffw_norm/scale"),
        ]
    else:
        out.append(Rule(f"{source}.post_attention_layernorm.weight",
                        f"{layer}/pre_ffw_norm/scale"))
    out += [
        Rule(f"{source}.self_attn.q_proj.weight", f"{layer}/attention/query/kernel",
             into_heads(heads)),
        Rule(f"{source}.self_attn.k_proj.weight", f"{layer}/attention/key/kernel",
             into_heads(kv_heads)),
        Rule(f"{source}.self_attn.v_proj.weight", f"{layer}/attention/value/kernel",
             into_heads(kv_heads)),
        Rule(f"{source}.self_attn.o_proj.weight", f"{layer}/attention/attention_output/kernel",
             Chain(Reshape((hidden, heads * head_dim), (hidden, heads, head_dim)),
                   Transpose((1, 2, 0)))),
        Rule(f"{source}.mlp.gate_proj.weight", f"{layer}/ffw_gating/kernel", Transpose()),
        Rule(f"{source}.mlp.up_proj.weight", f"{layer}/ffw_gating_2/kernel", Transpose()),
        Rule(f"{source}.mlp.down_proj.weight", f"{layer}/ffw_linear/kernel", Transpose()),
    ]
    name = "Gemma2" if gemma2 else "Gemma"
    classes = {k: v for k, v in CLASSES.items() if k.startswith(name) and (
        gemma2 or not k.startswith("Gemma2"))}
    tasks = {k: v.replace("Gemma", name, 1) for k, v in TASKS.items()}
    return RuleSet(prefixed(out, ["model.", ""]) + head_rules(classes, lm_head=False),
                   alternatives=True, name=f"huggingface({'gemma2' if gemma2 else 'gemma'!r})",
                   classes=tasks)
