"""Hugging Face Qwen3.5-MoE's text decoder (`Qwen3_5MoeForCausalLM`, `Qwen3_5MoeTextModel`,
`model_type` "qwen3_5_moe_text") <-> keras-hub's `Qwen3_5MoeBackbone` (built without a
vision encoder).

Attention (full and gated-delta-net), norms and embeddings are Qwen3.5's
(`objckpt.rules.hf_qwen3_5`). Every layer's feedforward is a sparse mixture of experts with a
shared expert, keras-hub's `transformer_layer_{i}/sparse_moe_block` (a fixed name), as
keras-hub's importer (`convert_qwen3_5_moe.py`) reads it:

- the router `mlp.gate.weight` (experts, hidden) <-> `router_gate/kernel`, transposed;
- per expert `mlp.experts.{e}.gate_proj|up_proj.weight` (inner, hidden), each transposed
  and joined side by side (gate first), the experts stacked, into
  `experts/expert_feedforward_gate_dense` (experts, hidden, 2 * inner); `down_proj` stacked
  into `expert_feedforward_output_dense` (experts, inner, hidden);
- the shared expert `mlp.shared_expert.gate_proj|up_proj|down_proj.weight` <->
  `shared_expert/feedforward_gate|intermediate|output_dense/kernel`, and its gate
  `mlp.shared_expert_gate.weight` (1, hidden) <-> `shared_expert_gate/kernel` (hidden, 1),
  each transposed.

Key forms (`FORMS`, `objckpt.rules.hf_moe`): transformers 5 may hold a layer's experts in one
tensor per bank (`mlp.experts.gate_up_proj` (experts, 2 * inner, hidden), `down_proj`
(experts, hidden, inner)), written by `save_pretrained(save_original_format=False)`; restore
reads either form, export writes the original (one entry per expert, what `save_pretrained`
writes by default).

Hub classes (`CLASSES`): `Qwen3_5MoeTextModel` saves the decoder bare, `Qwen3_5MoeForCausalLM`
under `model.`; `lm_head.weight` feeds the untied output embedding (tied: set aside, the token
embedding is both). Qwen3.5-MoE's multimodal folders (`model_type` "qwen3_5_moe") are not
covered by this set.
"""

from __future__ import annotations

from objckpt.rules.core import Rule, RuleSet, Transpose
from objckpt.rules.hf_moe import FORMS as MOE_FORMS
from objckpt.rules.hf_moe import expert_rules, fused_rules, size
from objckpt.rules.hf_qwen3_5 import decoder_rules as qwen3_5_rules
from objckpt.rules.hf_qwen3_5 import head_rules

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("qwen3_5_moe_text",)
FORMS = MOE_FORMS
_SHOWN = "Qwen3.5-MoE"
# Hub class -> (its decoder prefix, head entries as transformers names them)
CLASSES = {"Qwen3_5MoeTextModel": ("", ()),
           "Qwen3_5MoeForCausalLM": ("model.", ("lm_head.weight",))}
# keras-hub task model -> the Hub class of its heads (export's `architectures`)
TASKS = {"Qwen3_5MoeCausalLM": "Qwen3_5MoeForCausalLM"}
_BANKS = ((("gate_proj", "up_proj"), "expert_feedforward_gate_dense"),
          (("down_proj",), "expert_feedforward_output_dense"))
_FUSED = [("gate_up_proj", ["expert_feedforward_gate_dense"]),
          ("down_proj", ["expert_feedforward_output_dense"])]
_SHARED = (("gate_proj", "feedforward_gate_dense"), ("up_proj", "feedforward_intermediate_dense"),
           ("down_proj", "feedforward_output_dense"))


def _experts(config: dict) -> list:
    """Every layer's mixture of experts (the original form, then transformers 5's)."""
    experts = size(config, "num_experts", _SHOWN)
    source, target = "layers.{i}.mlp", "transformer_layer_{i}/sparse_moe_block"
    return [
        Rule(f"{source}.gate.weight", f"{target}/router_gate/kernel", Transpose()),
        *expert_rules(f"{source}.experts.{{e}}", f"{target}/experts", _BANKS, experts),
        *(Rule(f"{source}.shared_expert.{hf}.weight", f"{target}/shared_expert/{keras}/kernel",
               Transpose()) for hf, keras in _SHARED),
        Rule(f"{source}.shared_expert_gate.weight", f"{target}/shared_expert_gate/kernel",
             Transpose()),
        *fused_rules(f"{source}.experts", f"{target}/experts", _FUSED),
    ]


def decoder_rules(config: dict) -> list:
    """The decoder's rules, unprefixed (`embed_tokens.weight`, `layers.{i}....`): Qwen3.5's
    attention and norms, the experts in both key forms."""
    return qwen3_5_rules(config, _SHOWN, mlp=False) + _experts(config)


def rules(config: dict) -> RuleSet:
    """The Qwen3.5-MoE text decoder's rule set for a Hugging Face config (Qwen3.5's sizes,
    `num_experts`, `tie_word_embeddings`).

    Example:
      >>> rules = objckpt.rules.huggingface("qwen3_5_moe_text", config=hf_config)
      >>> objckpt.restore(keras_hub.models.Qwen3_5MoeBackbone(...), "dir", rules=rules)
    """
    hub = TASKS.get(config.get("task", ""), "")
    first = CLASSES[hub][0] if hub else "model."
    prefixes = list(dict.fromkeys([first, "model.", ""]))
    decoder = decoder_rules(config)
    return RuleSet([rule.with_source(prefix + rule.source) for prefix in prefixes
                    for rule in decoder]
                   + head_rules(bool(config.get("tie_word_embeddings")), CLASSES),
                   alternatives=True, name="huggingface('qwen3_5_moe_text')", classes=TASKS)
