"""Hugging Face Gemma 4's text decoder (`Gemma4ForCausalLM`, `Gemma4TextModel`, model type
`gemma4_text`) <-> keras-hub's `Gemma4Backbone` (without vision or audio encoders).

Names and layouts follow keras-hub's importer `convert_gemma4.py`: Gemma 3's layer (q/k/v
weights (heads * head_dim, hidden) <-> kernels (heads, hidden, head_dim), o (hidden, heads *
head_dim) <-> (heads, head_dim, hidden), MLP `Linear` weights transposed, the four norms and
the per-head q/k norms as they are), plus each layer's `layer_scalar` ((1,) <-> a scalar) and,
where `hidden_size_per_layer_input` is set, the per-layer inputs: `embed_tokens_per_layer`
(as it is), `per_layer_model_projection` (transposed) and its norm, and in each layer
`per_layer_input_gate` and `per_layer_projection` (transposed, keras-hub's
`per_layer_up_proj`) and `post_per_layer_input_norm`. The embedding is tied: one tensor,
`model.embed_tokens.weight`, is keras-hub's `ReversibleEmbedding`.

Layers differ by `layer_types`: a full-attention layer's heads are `global_head_dim` wide
(transformers' default 512), and where `attention_k_eq_v` is set it has no `v_proj` (the
keys are the values) and `num_global_key_value_heads` key heads; transformers 5 writes both
sizes per layer instead, in `per_layer_config` (`global_sizes` reads either form). The last
`num_kv_shared_layers` layers reuse an earlier layer's keys and values: no k/v projections
or key norm of their own, on either side. The rules are written per layer for these reasons.

With `enable_moe_block` each layer adds a mixture of experts beside its dense block: the
router (`router.scale` as it is, `router.proj` transposed, `router.per_expert_scale`),
three more norms (`post_feedforward_layernorm_1` <-> `post_ffw_norm_dense`,
`pre_feedforward_layernorm_2` <-> `pre_ffw_norm_moe`, `post_feedforward_layernorm_2` <->
`post_ffw_norm_moe_path`) and the expert banks: `experts.gate_up_proj` (experts, 2 *
inner, hidden) cut in two along its second axis, each half transposed to keras-hub's
`gate_proj` and `up_proj` (experts, hidden, inner) (export joins them back), and
`experts.down_proj` (experts, hidden, inner) <-> (experts, inner, hidden).

Hub classes (`CLASSES`): `Gemma4TextModel` saves the decoder bare, `Gemma4ForCausalLM` under
`model.`; `lm_head.weight` (tied) has no keras-hub variable and is set aside;
`Gemma4CausalLM` has none beyond its backbone. `decoder_rules` is the decoder the multimodal
set (`hf_gemma4_towers`) and the assistant's (`hf_gemma4_assistant`) build on.
"""

from __future__ import annotations

from objckpt.rules.core import Chain, Reshape, Rule, RuleSet, Split, Transpose
from objckpt.rules.hf_llama import config_size, head_rules, prefixed

__all__ = ["MODEL_TYPES", "decoder_rules", "global_sizes", "rules"]

MODEL_TYPES = ("gemma4_text",)
CLASSES = {
    "Gemma4TextModel": ("", ()),
    "Gemma4ForCausalLM": ("model.", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma4CausalLM": "Gemma4ForCausalLM"}
_MODEL = "Gemma 4"
_LAYER_TYPES = ("sliding_attention", "full_attention")


def _refuse(key: str, value, why: str):
    from objckpt import errors

    raise errors.InvalidArgumentError(
        f"The {_MODEL} rule set {why}; the Hugging Face config has `{key}` = {value!r}. "
        f"Fix: pass the checkpoint's folder (its config.json), or a config whose `{key}` "
        f"is as the message says.")


def _layer_types(config: dict, layers: int) -> list:
    """Each layer's type as transformers builds it: `layer_types` (by default every sixth
    layer full attention), the last layer full attention whatever the config says."""
    types = config.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention"
                 for i in range(layers)]
    if (not isinstance(types, (list, tuple)) or len(types) != layers
            or any(t not in _LAYER_TYPES for t in types)):
        _refuse("layer_types", types, f"needs {layers} layer types (num_hidden_layers), each "
                f"one of {list(_LAYER_TYPES)}")
    return [*types[:-1], "full_attention"]


def rules(config: dict) -> RuleSet:
    """The Gemma 4 text-decoder rule set for a Hugging Face config (sizes and layer types
    decide each layer's reshapes)."""
    out = decoder_rules(config, _MODEL)
    return RuleSet(prefixed(out, ["model.", ""]) + head_rules(CLASSES, lm_head=False),
                   alternatives=True, name="huggingface('gemma4_text')", classes=TASKS)


def decoder_rules(config: dict, model: str, *, all_shared: bool = False) -> list:
    """The text decoder's rules for a text config, their entries named `model.` (as
    `Gemma4ForCausalLM` names them); `model` names the rule set in errors. `all_shared`:
    every layer reads another model's keys and values (Gemma 4's assistant), none has
    k/v projections or a key norm."""
    hidden = config_size(config, "hidden_size", model)
    heads = config_size(config, "num_attention_heads", model)
    kv_heads = config_size(config, "num_key_value_heads", model, heads)
    head_dim = config_size(config, "head_dim", model)
    layers = config_size(config, "num_hidden_layers", model)
    k_eq_v = bool(config.get("attention_k_eq_v", False))
    moe = bool(config.get("enable_moe_block", False))
    if moe:
        config_size(config, "num_experts", model)
        config_size(config, "moe_intermediate_size", model)
    shared = layers if all_shared else config.get("num_kv_shared_layers") or 0
    if not all_shared and (type(shared) is not int or not 0 <= shared < layers):
        _refuse("num_kv_shared_layers", shared,
                f"needs a number of shared layers from 0 to {layers - 1} (num_hidden_layers - 1)")
    per_layer = config.get("hidden_size_per_layer_input") or 0
    if per_layer:
        per_layer = config_size(config, "hidden_size_per_layer_input", model)

    out = [Rule("model.embed_tokens.weight", "token_embedding/embeddings"),
           Rule("model.norm.weight", "final_normalization/scale")]
    if per_layer:
        out += [
            Rule("model.embed_tokens_per_layer.weight", "per_layer_token_embedding/embeddings"),
            Rule("model.per_layer_model_projection.weight", "per_layer_model_projection/kernel",
                 Transpose()),
            Rule("model.per_layer_projection_norm.weight", "per_layer_projection_norm/scale"),
        ]
    for i, kind in enumerate(_layer_types(config, layers)):
        full = kind == "full_attention"
        layer_dim, layer_kv = global_sizes(config, i) if full else (head_dim, kv_heads)
        own_kv = i < layers - shared
        out += _layer_rules(i, hidden, heads, layer_kv, layer_dim, keys=own_kv,
                            values=own_kv and not (full and k_eq_v),
                            per_layer=bool(per_layer))
        if moe:
            out += _expert_rules(i)
    return out


def global_sizes(config: dict, i: int) -> tuple:
    """(head_dim, key heads) of full-attention layer `i`: transformers 5 writes them in
    `per_layer_config` (by layer index), the published configs as `global_head_dim` (512
    when absent) and, where `attention_k_eq_v` is set, `num_global_key_value_heads`."""
    kv_heads = config_size(config, "num_key_value_heads", _MODEL,
                           config.get("num_attention_heads"))
    per_layer = config.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, dict):
            _refuse("per_layer_config", per_layer, "needs a dict of layer index -> sizes")
        own = per_layer.get(str(i), per_layer.get(i, {}))
        if not isinstance(own, dict):
            _refuse("per_layer_config", per_layer, f"needs layer {i}'s sizes as a dict")
        sizes = {**config, **own}
        return (config_size(sizes, "head_dim", _MODEL),
                config_size(sizes, "num_key_value_heads", _MODEL))
    head_dim = config_size(config, "global_head_dim", _MODEL, 512)
    if config.get("attention_k_eq_v", False):
        kv_heads = config_size(config, "num_global_key_value_heads", _MODEL, kv_heads)
    return head_dim, kv_heads


def _expert_rules(i: int) -> list:
    """Layer `i`'s mixture of experts: the router, its norms, the expert banks."""
    source, layer = f"model.layers.{i}", f"decoder_block_{i}"
    bank = f"{layer}/moe_expert_bank"
    return [
        Rule(f"{source}.post_feedforward_layernorm_1.weight", f"{layer}/post_ffw_norm_dense/scale"),
        Rule(f"{source}.pre_feedforward_layernorm_2.weight", f"{layer}/pre_ffw_norm_moe/scale"),
        Rule(f"{source}.post_feedforward_layernorm_2.weight",
             f"{layer}/post_ffw_norm_moe_path/scale"),
        Rule(f"{source}.router.scale", f"{layer}/moe_router/per_dim_scale"),
        Rule(f"{source}.router.proj.weight", f"{layer}/moe_router/proj/kernel", Transpose()),
        Rule(f"{source}.router.per_expert_scale", f"{bank}/per_expert_scale"),
        Rule(f"{source}.experts.gate_up_proj", f"{bank}/gate_proj",
             Chain(Split(axis=1, parts=2, index=0), Transpose((0, 2, 1)))),
        Rule(f"{source}.experts.gate_up_proj", f"{bank}/up_proj",
             Chain(Split(axis=1, parts=2, index=1), Transpose((0, 2, 1)))),
        Rule(f"{source}.experts.down_proj", f"{bank}/down_proj", Transpose((0, 2, 1))),
    ]


def _layer_rules(i: int, hidden: int, heads: int, kv_heads: int, head_dim: int, *,
                 keys: bool, values: bool, per_layer: bool) -> list:
    """Layer `i`'s rules, its entries named `model.layers.{i}.`."""
    source, layer = f"model.layers.{i}", f"decoder_block_{i}"

    def into_heads(n):  # (n * head_dim, hidden) -> (n, hidden, head_dim)
        return Chain(Reshape((n * head_dim, hidden), (n, head_dim, hidden)),
                     Transpose((0, 2, 1)))

    attention, target = f"{source}.self_attn", f"{layer}/attention"
    out = [
        Rule(f"{source}.layer_scalar", f"{layer}/layer_scalar", Reshape((1,), ())),
        Rule(f"{source}.input_layernorm.weight", f"{layer}/pre_attention_norm/scale"),
        Rule(f"{source}.post_attention_layernorm.weight", f"{layer}/post_attention_norm/scale"),
        Rule(f"{source}.pre_feedforward_layernorm.weight", f"{layer}/pre_ffw_norm/scale"),
        Rule(f"{source}.post_feedforward_layernorm.weight", f"{layer}/post_ffw_norm/scale"),
        Rule(f"{attention}.q_proj.weight", f"{target}/query/kernel", into_heads(heads)),
        Rule(f"{attention}.q_norm.weight", f"{target}/query_norm/scale"),
        Rule(f"{attention}.o_proj.weight", f"{target}/attention_output/kernel",
             Chain(Reshape((hidden, heads * head_dim), (hidden, heads, head_dim)),
                   Transpose((1, 2, 0)))),
        Rule(f"{source}.mlp.gate_proj.weight", f"{layer}/ffw_gating/kernel", Transpose()),
        Rule(f"{source}.mlp.up_proj.weight", f"{layer}/ffw_gating_2/kernel", Transpose()),
        Rule(f"{source}.mlp.down_proj.weight", f"{layer}/ffw_linear/kernel", Transpose()),
    ]
    if keys:
        out += [Rule(f"{attention}.k_proj.weight", f"{target}/key/kernel", into_heads(kv_heads)),
                Rule(f"{attention}.k_norm.weight", f"{target}/key_norm/scale")]
    if values:
        out.append(Rule(f"{attention}.v_proj.weight", f"{target}/value/kernel",
                        into_heads(kv_heads)))
    if per_layer:
        out += [
            Rule(f"{source}.per_layer_input_gate.weight", f"{layer}/per_layer_input_gate/kernel",
                 Transpose()),
            Rule(f"{source}.per_layer_projection.weight", f"{layer}/per_layer_up_proj/kernel",
                 Transpose()),
            Rule(f"{source}.post_per_layer_input_norm.weight",
                 f"{layer}/post_per_layer_input_norm/scale"),
        ]
    return out
