"""Hugging Face SmolLM3 (`SmolLM3ForCausalLM`, `SmolLM3Model`, ...) <-> keras-hub's
`SmolLM3Backbone`.

Names and layouts follow keras-hub's importer (`convert_smollm3.py`): the decoder is Llama's
(the same Hub names), every `Linear` weight (out, in) a Keras kernel (in, out), q/k/v as
they are and o (hidden, heads * head_dim) <-> (heads, head_dim, hidden); norms as they
are. The embedding is tied (SmolLM3's default, the only layout keras-hub builds): one
tensor, `model.embed_tokens.weight`, is keras-hub's `ReversibleEmbedding`.

keras-hub names every layer's output projection `o_proj/kernel` and every layer's RoPE
frequencies `rotary_emb/inv_freq`, one name for all layers, so those rules target the
variables by object path: the backbone's functional `_operations/<n>` (token ids, token
embedding and padding mask come first: decoder layer i is operation 3 + i), under
`backbone/` in the task model. The frequencies are no weight: keras-hub computes them from
the config (`rope_theta`) and transformers saves none, so no folder has them; a restore
leaves them as they are and export writes none.

Hub classes (`CLASSES`) as Llama's: `SmolLM3Model` saves the decoder bare, the task classes
under `model.` (`SmolLM3ForQuestionAnswering` under `transformer.`); `lm_head.weight` (tied)
and the classification and question-answering heads have no keras-hub variable and are set
aside; `SmolLM3CausalLM` has none beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import config_size, head_rules, hub_classes, prefixed

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("smollm3",)
CLASSES = hub_classes("SmolLM3", qa_prefix="transformer.")
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"SmolLM3CausalLM": "SmolLM3ForCausalLM"}
_FIRST_LAYER = 3  # the backbone's operation of decoder layer 0 (see the module docstring)
_NO_FREQUENCIES = ("the folder holds no RoPE frequencies (transformers computes them and "
                   "saves none; keras-hub's SmolLM3Backbone computes them from the config's "
                   "rope_theta)")


def _refuse(config: dict, key: str, found, needed: str, why: str) -> None:
    from objckpt import errors

    raise errors.InvalidArgumentError(
        f"The SmolLM3 rule set needs `{key}` {needed} in the Hugging Face config; received "
        f"{found!r}: {why}. Fix: convert a checkpoint whose config.json has it (keras-hub's "
        "importer reads no other), or write the rules with objckpt.rules.Rule.")


def _check(config: dict) -> tuple:
    """(hidden, heads, head_dim, layers) of a config keras-hub's SmolLM3Backbone can hold."""
    hidden = config_size(config, "hidden_size", "SmolLM3")
    heads = config_size(config, "num_attention_heads", "SmolLM3")
    config_size(config, "num_key_value_heads", "SmolLM3", heads)
    layers = config_size(config, "num_hidden_layers", "SmolLM3")
    if hidden % heads or config.get("head_dim", hidden // heads) != hidden // heads:
        _refuse(config, "head_dim", config.get("head_dim"), "to be hidden_size / "
                "num_attention_heads", "keras-hub's SmolLM3Backbone builds no other")
    if config.get("tie_word_embeddings", True) is not True:
        _refuse(config, "tie_word_embeddings", config.get("tie_word_embeddings"), "true",
                "keras-hub's SmolLM3Backbone has no output embedding of its own")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key, False):
            _refuse(config, key, config.get(key), "false",
                    "keras-hub's importer reads no biases")
    return hidden, heads, hidden // heads, layers


def rules(config: dict) -> RuleSet:
    """The SmolLM3 rule set for a Hugging Face config (sizes decide the head reshapes, the
    number of layers the per-layer rules; a task model's under `backbone/`)."""
    hidden, heads, head_dim, layers = _check(config)
    layer, source = "transformer_layer_{i}", "model.layers.{i}"
    out = [
        Rule("model.embed_tokens.weight", "token_embedding/embeddings"),
        Rule("model.norm.weight", "sequence_output_layernorm/scale"),
        Rule(f"{source}.input_layernorm.weight", f"{layer}/input_layernorm/scale"),
        Rule(f"{source}.post_attention_layernorm.weight",
             f"{layer}/post_attention_layernorm/scale"),
        *(Rule(f"{source}.self_attn.{p}_proj.weight", f"{layer}/self_attn/{p}_proj/kernel",
               Transpose()) for p in "qkv"),
        *(Rule(f"{source}.mlp.{p}_proj.weight", f"{layer}/mlp/{p}_proj/kernel", Transpose())
          for p in ("gate", "up", "down")),
    ]
    where = "backbone/" if config.get("task") in TASKS else ""
    into_heads = Chain(Transpose(), Reshape((heads * head_dim, hidden),
                                            (heads, head_dim, hidden)))
    for i in range(layers):
        operation = f"{where}operations/{_FIRST_LAYER + i}/self_attn"
        out += [Rule(f"model.layers.{i}.self_attn.o_proj.weight",
                     f"{operation}/o_proj/kernel", into_heads),
                Rule(f"model.layers.{i}.self_attn.rotary_emb.inv_freq",
                     f"{operation}/rotary_embedding/inv_freq", absent=_NO_FREQUENCIES,
                     unused_by=("SmolLM3Backbone", "SmolLM3CausalLM"))]
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in CLASSES.values())]))
    return RuleSet(prefixed(out, prefixes) + head_rules(CLASSES, lm_head=False),
                   alternatives=True, name="huggingface('smollm3')", classes=TASKS)
