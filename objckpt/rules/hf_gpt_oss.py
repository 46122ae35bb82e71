"""Hugging Face GPT-OSS (`GptOssForCausalLM`, `GptOssModel`, ...) <-> keras-hub's
`GptOssBackbone`, for folders of unquantized weights (what transformers' `save_pretrained`
writes: `mlp.experts.gate_up_proj`, ...).

Names and layouts as keras-hub's importer `convert_gpt_oss.py` places them: q/k/v weights
(heads * head_dim, hidden) <-> kernels (hidden, heads, head_dim) and their biases (heads *
head_dim,) <-> (heads, head_dim); o (hidden, heads * head_dim) <-> (heads, head_dim, hidden),
its bias as it is; each head's attention sink `self_attn.sinks` (heads,); the router
`mlp.router.weight` (experts, hidden) transposed, its bias as it is. The experts are one
tensor per layer on both sides, in the same layout: `mlp.experts.gate_up_proj` (experts,
hidden, 2 * inner, gate and up interleaved), `gate_up_proj_bias`, `down_proj` (experts,
inner, hidden), `down_proj_bias`. keras-hub names the layers of GPT-OSS's blocks itself
(`transformer_layer_0/sparse_moe_block/...`), so the set needs no model.

The Hub's own GPT-OSS checkpoints hold the experts quantized (MXFP4: `gate_up_proj_blocks`
and `gate_up_proj_scales`, which keras-hub's importer dequantizes); this set reads and writes
unquantized folders only, and keras-hub's importer reads quantized ones only.

`lm_head.weight` feeds the untied output embedding (`tie_word_embeddings` false, the
default). Hub classes (`CLASSES`): `GptOssModel` saves the decoder bare, the task classes
under `model.`; keras-hub's `GptOssCausalLM` has no variable beyond its backbone, the
classification heads no keras-hub task model: set aside.
"""

from __future__ import annotations

from objckpt.rules.core import Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import attention_rules, head_rules, prefixed
from objckpt.rules.hf_moe import size

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("gpt_oss",)
_SCORE, _TOKENS = ("score.weight",), ("score.weight", "score.bias")
CLASSES = {"GptOssModel": ("", ()), "GptOssForCausalLM": ("model.", ("lm_head.weight",)),
           "GptOssForSequenceClassification": ("model.", _SCORE),
           "GptOssForTokenClassification": ("model.", _TOKENS)}
TASKS = {"GptOssCausalLM": "GptOssForCausalLM"}


def rules(config: dict) -> RuleSet:
    """The GPT-OSS rule set for a Hugging Face config (sizes decide the head reshapes)."""
    hidden = size(config, "hidden_size", "GPT-OSS")
    heads = size(config, "num_attention_heads", "GPT-OSS")
    kv_heads = size(config, "num_key_value_heads", "GPT-OSS", heads)
    head_dim = size(config, "head_dim", "GPT-OSS", hidden // heads)
    tied = bool(config.get("tie_word_embeddings", False))
    layer, source = "transformer_layer_{i}", "model.layers.{i}"
    attention = f"{layer}/self_attention"
    out = [Rule("model.embed_tokens.weight", "token_embedding/embeddings")]
    if not tied:
        out.append(Rule("lm_head.weight", "token_embedding/reverse_embeddings", Transpose(),
                        absent="GptOssModel has no LM head (its folder holds no "
                               "`lm_head.weight`)"))
    out += [
        Rule("model.norm.weight", "sequence_output_layernorm/scale"),
        Rule(f"{source}.input_layernorm.weight", f"{layer}/input_layernorm/scale"),
        Rule(f"{source}.post_attention_layernorm.weight",
             f"{layer}/post_attention_layernorm/scale"),
        *attention_rules(layer, "self_attention", config, "GPT-OSS", head_dim=head_dim),
        *[Rule(f"{source}.self_attn.{hf}_proj.bias", f"{attention}/{keras}/bias",
               Reshape((n * head_dim,), (n, head_dim)))
          for hf, keras, n in (("q", "query", heads), ("k", "key", kv_heads),
                               ("v", "value", kv_heads))],
        Rule(f"{source}.self_attn.o_proj.bias", f"{attention}/attention_output/bias"),
        Rule(f"{source}.self_attn.sinks", f"{attention}/sinks"),
        Rule(f"{source}.mlp.router.weight",
             f"{layer}/sparse_moe_block/router/router_dense/kernel", Transpose()),
        Rule(f"{source}.mlp.router.bias", f"{layer}/sparse_moe_block/router/router_dense/bias"),
        *[Rule(f"{source}.mlp.experts.{name}", f"{layer}/sparse_moe_block/experts/{name}")
          for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")],
    ]
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in CLASSES.values())]))
    return RuleSet(prefixed(out, prefixes) + head_rules(CLASSES, lm_head=not tied),
                   alternatives=True, name="huggingface('gpt_oss')", classes=TASKS)
