"""Hugging Face Gemma 3's text decoder (`Gemma3ForCausalLM`, `Gemma3TextModel`, model type
`gemma3_text`) <-> keras-hub's `Gemma3Backbone` (without a vision encoder).

The decoder is Gemma 2's (`objckpt.rules.hf_gemma`: q/k/v weights (heads * head_dim,
hidden) <-> kernels (heads, hidden, head_dim), o (hidden, heads * head_dim) <-> (heads,
head_dim, hidden), MLP `Linear` weights transposed, the norms before and after attention
and the feed-forward block as they are), as keras-hub's importer `convert_gemma3.py` reads
it, plus an RMS norm over each head's queries and keys (`q_norm`, `k_norm`: (head_dim,),
keras-hub's `attention/query_norm` and `attention/key_norm`). The embedding is tied: one
tensor, `model.embed_tokens.weight`, is keras-hub's `ReversibleEmbedding`.

What keras-hub builds from the config, not the weights (the same tensors, other outputs where
a config asks otherwise): every sixth layer global (RoPE base 1e6), the others sliding (RoPE
base 10000): transformers' default `layer_types` and `rope_parameters`; queries scaled by
head_dim ** -0.5 when `query_pre_attn_scalar` equals `head_dim`, else by hidden_size /
num_attention_heads.

Hub classes (`CLASSES`): `Gemma3TextModel` saves the decoder bare, `Gemma3ForCausalLM` and
`Gemma3TextForSequenceClassification` under `model.`; `lm_head.weight` (tied) and the
classification head have no keras-hub variable and are set aside; `Gemma3CausalLM` has none
beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules import hf_gemma
from objckpt.rules.core import Rule, RuleSet
from objckpt.rules.hf_llama import config_size, head_rules, prefixed

__all__ = ["MODEL_TYPES", "decoder_rules", "rules"]

MODEL_TYPES = ("gemma3_text",)
CLASSES = {
    "Gemma3TextModel": ("", ()),
    "Gemma3ForCausalLM": ("model.", ("lm_head.weight",)),
    "Gemma3TextForSequenceClassification": ("model.", ("score.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma3CausalLM": "Gemma3ForCausalLM"}


def rules(config: dict) -> RuleSet:
    """The Gemma 3 text-decoder rule set for a Hugging Face config (sizes decide the head
    reshapes)."""
    decoder = decoder_rules(config, "Gemma 3")
    return RuleSet(prefixed(decoder, ["model.", ""]) + head_rules(CLASSES, lm_head=False),
                   alternatives=True, name="huggingface('gemma3_text')", classes=TASKS)


def decoder_rules(config: dict, model: str) -> list:
    """The text decoder's rules, its entries named `model.` (the embedding, each layer,
    the final norm), for a text config; InvalidArgumentError naming `model` for a size that
    is missing or not a positive int."""
    for key in ("hidden_size", "num_attention_heads", "head_dim"):
        config_size(config, key, model)  # keras-hub reads head_dim from the config: no default
    config_size(config, "num_key_value_heads", model, config["num_attention_heads"])
    # Gemma 2's layer (its post-attention and pre/post feed-forward norms), `model.` names
    decoder = [r for r in hf_gemma.rules({**config, "model_type": "gemma2"})
               if r.source.startswith("model.")]
    source, target = "model.layers.{i}.self_attn", "decoder_block_{i}/attention"
    return decoder + [Rule(f"{source}.q_norm.weight", f"{target}/query_norm/scale"),
                      Rule(f"{source}.k_norm.weight", f"{target}/key_norm/scale")]
