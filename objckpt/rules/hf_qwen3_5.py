"""Hugging Face Qwen3.5's text decoder (`Qwen3_5ForCausalLM`, `Qwen3_5TextModel`, ...,
`model_type` "qwen3_5_text") <-> keras-hub's `Qwen3_5Backbone` (built without a vision
encoder).

Names and layouts follow keras-hub's importer (`convert_qwen3_5.py`). The decoder mixes two
kinds of layer (`layer_types`): full attention (`self_attn`) and gated-delta-net linear
attention (`linear_attn`); each layer's entries are of its kind only, so every rule names
the layer by `{i}` and matches the layers that have its entry. Every `Linear` weight (out, in)
is a Keras kernel (in, out). Full attention: `q_proj` (heads * head_dim * 2, hidden: each
head's query then its output gate) <-> (hidden, heads, 2 * head_dim), k/v (kv_heads *
head_dim, hidden) <-> (hidden, kv_heads, head_dim), o (hidden, heads * head_dim) <-> (heads,
head_dim, hidden); per-head q/k norms as they are. Linear attention: the fused
`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` and `out_proj` transposed; the
depthwise `conv1d.weight` (channels, 1, kernel) <-> (channels, kernel); `dt_bias`, `A_log`
and the gated norm's weight as they are. Norms (RMS, as transformers keeps them) as they are.

Hub classes (`CLASSES`): `Qwen3_5TextModel` saves the decoder bare, the task classes under
`model.`; `lm_head.weight` feeds the untied output embedding (`tie_word_embeddings` false;
with tied embeddings `model.embed_tokens.weight` is both and `lm_head.weight` is set aside);
the classification heads have no keras-hub variable and are set aside. Qwen3.5's multimodal
folders (`model_type` "qwen3_5": the decoder under `model.language_model.`, the vision tower
under `model.visual.`) are not covered by this set.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import config_size

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("qwen3_5_text",)
_SHOWN = "Qwen3.5"
_SCORE, _TOKENS = ("score.weight",), ("score.weight", "score.bias")
# Hub class -> (its decoder prefix, head entries as transformers names them)
CLASSES = {
    "Qwen3_5TextModel": ("", ()),
    "Qwen3_5ForCausalLM": ("model.", ("lm_head.weight",)),
    "Qwen3_5TextForSequenceClassification": ("model.", _SCORE),
    "Qwen3_5ForTokenClassification": ("model.", _TOKENS),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`)
TASKS = {"Qwen3_5CausalLM": "Qwen3_5ForCausalLM"}


def _sizes(config: dict, shown: str) -> dict:
    names = ("hidden_size", "num_attention_heads", "head_dim", "linear_num_key_heads",
             "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")
    out = {name: config_size(config, name, shown) for name in names}
    out["kv_heads"] = config_size(config, "num_key_value_heads", shown,
                                  out["num_attention_heads"])
    return out


def decoder_rules(config: dict, shown: str = _SHOWN, *, mlp: bool = True) -> list:
    """The decoder's rules, unprefixed (`embed_tokens.weight`, `layers.{i}....`): both
    kinds of attention, the norms and (`mlp`) the dense MLP; sizes checked (`shown` names
    the set in the error)."""
    s = _sizes(config, shown)
    hidden, heads, head_dim, kv = (s["hidden_size"], s["num_attention_heads"], s["head_dim"],
                                   s["kv_heads"])
    channels = (2 * s["linear_num_key_heads"] * s["linear_key_head_dim"]
                + s["linear_num_value_heads"] * s["linear_value_head_dim"])
    kernel = s["linear_conv_kernel_dim"]

    def into_heads(count, width):
        return Chain(Transpose(), Reshape((hidden, count * width), (hidden, count, width)))

    layer, target = "layers.{i}", "transformer_layer_{i}"
    attention, linear = f"{target}/self_attention", f"{target}/linear_attn"
    out = [
        Rule("embed_tokens.weight", "token_embedding/embeddings"),
        Rule("norm.weight", "sequence_output_layernorm/scale"),
        Rule(f"{layer}.input_layernorm.weight", f"{target}/input_layernorm/scale"),
        Rule(f"{layer}.post_attention_layernorm.weight",
             f"{target}/post_attention_layernorm/scale"),
        # full attention
        Rule(f"{layer}.self_attn.q_proj.weight", f"{attention}/query/kernel",
             into_heads(heads, 2 * head_dim)),
        Rule(f"{layer}.self_attn.k_proj.weight", f"{attention}/key/kernel",
             into_heads(kv, head_dim)),
        Rule(f"{layer}.self_attn.v_proj.weight", f"{attention}/value/kernel",
             into_heads(kv, head_dim)),
        Rule(f"{layer}.self_attn.o_proj.weight", f"{attention}/attention_output/kernel",
             Chain(Transpose(), Reshape((heads * head_dim, hidden), (heads, head_dim, hidden)))),
        Rule(f"{layer}.self_attn.q_norm.weight", f"{attention}/query_norm/scale"),
        Rule(f"{layer}.self_attn.k_norm.weight", f"{attention}/key_norm/scale"),
        # gated-delta-net linear attention
        *(Rule(f"{layer}.linear_attn.{name}.weight", f"{linear}/{name}/kernel", Transpose())
          for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")),
        Rule(f"{layer}.linear_attn.conv1d.weight", f"{linear}/conv1d_kernel",
             Reshape((channels, 1, kernel), (channels, kernel))),
        Rule(f"{layer}.linear_attn.dt_bias", f"{linear}/dt_bias"),
        Rule(f"{layer}.linear_attn.A_log", f"{linear}/A_log"),
        Rule(f"{layer}.linear_attn.norm.weight", f"{linear}/norm/scale"),
    ]
    if mlp:
        out += [Rule(f"{layer}.mlp.{hf}.weight", f"{target}/{keras}/kernel", Transpose())
                for hf, keras in (("gate_proj", "feedforward_gate_dense"),
                                  ("up_proj", "feedforward_intermediate_dense"),
                                  ("down_proj", "feedforward_output_dense"))]
    return out


def head_rules(tied: bool, classes: dict = CLASSES) -> list:
    """The output embedding (untied) and the heads without a keras-hub variable."""
    def having(entry):
        return ", ".join(n for n, (_, heads) in classes.items() if entry in heads)

    out = [] if tied else [Rule("lm_head.weight", "token_embedding/reverse_embeddings",
                                Transpose(), head=having("lm_head.weight"))]
    names = [n for n in _TOKENS if having(n)] + (["lm_head.weight"] if tied else [])
    return out + [Rule(n, f"{NOWHERE}/{n}", head=having(n) + (
        " (tied to the token embedding)" if n == "lm_head.weight" else "")) for n in names]


def rules(config: dict) -> RuleSet:
    """The Qwen3.5 text decoder's rule set for a Hugging Face config (`hidden_size`,
    `num_attention_heads`, `num_key_value_heads`, `head_dim`, the `linear_*` sizes,
    `tie_word_embeddings`).

    Example:
      >>> rules = objckpt.rules.huggingface("qwen3_5_text", config=hf_config)
      >>> objckpt.restore(keras_hub.models.Qwen3_5Backbone(...), "qwen_dir", rules=rules)
    """
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else "model."
    prefixes = list(dict.fromkeys([first, "model.", ""]))
    decoder = decoder_rules(config)
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in decoder] + head_rules(bool(config.get("tie_word_embeddings"))),
                   alternatives=True, name="huggingface('qwen3_5_text')", classes=TASKS)
