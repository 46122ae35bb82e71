"""Hugging Face Mixtral (`MixtralForCausalLM`, `MixtralModel`, ...) <-> keras-hub's
`MixtralBackbone`.

Attention, norms and embeddings are Llama's (`objckpt.rules.hf_llama`: q/k/v weights (heads
* head_dim, hidden) <-> kernels (hidden, heads, head_dim), o (hidden, heads * head_dim) <->
(heads, head_dim, hidden)), as keras-hub's importer `convert_mixtral.py` reads them; each
layer's feedforward is a sparse mixture of experts, `block_sparse_moe`:

- its router `block_sparse_moe.gate.weight` (experts, hidden) <-> the block's
  `sparse_feedforward_gate_dense/kernel` (hidden, experts), transposed;
- one entry per expert and weight, `block_sparse_moe.experts.{e}.w1|w3|w2.weight`, each
  transposed and the experts stacked (`objckpt.rules.Stack`) into the block's three banks
  `experts/expert_feedforward_gate_dense` (w1: experts, hidden, inner),
  `expert_feedforward_intermediate_dense` (w3) and `expert_feedforward_output_dense` (w2:
  experts, inner, hidden); export writes each expert's entry back.

Key forms (`FORMS`): transformers 5 holds a layer's experts in one tensor per bank and calls
the block `mlp` (`mlp.gate.weight`, `mlp.experts.gate_up_proj` (experts, 2 * inner, hidden:
w1 then w3), `mlp.experts.down_proj` (experts, hidden, inner)); `save_pretrained` writes the
original form unless told `save_original_format=False`. Restore reads either form (each bank
its half, its last two axes swapped); export writes the original.

keras-hub names each layer's block `mixtral_sparse_moe_block` plus a counter of the session
(`objckpt.rules.hf_moe`): the set is made for the model it restores or exports (the
operations do so themselves), reading each layer's block name from the model.

`lm_head.weight` feeds the untied output embedding (keras-hub's Mixtral always has one);
`MixtralModel` holds none. Hub classes (`CLASSES`) as Llama's, every one under `model.`;
keras-hub's `MixtralCausalLM` has no variable beyond its backbone, the classification and
question-answering heads no keras-hub task model: set aside.
"""

from __future__ import annotations

from objckpt.rules.core import Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import hub_classes, prefixed
from objckpt.rules.hf_moe import FORMS as MOE_FORMS
from objckpt.rules.hf_moe import block_names, decoder_base, expert_rules, fused_rules, size

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("mixtral",)
CLASSES = hub_classes("Mixtral")
TASKS = {"MixtralCausalLM": "MixtralForCausalLM"}
PER_MODEL = True  # targets read from the model: its blocks' automatic names
FORMS = MOE_FORMS
BLOCK = "mixtral_sparse_moe_block"
_BANKS = ((("w1",), "expert_feedforward_gate_dense"),
          (("w3",), "expert_feedforward_intermediate_dense"),
          (("w2",), "expert_feedforward_output_dense"))
_FUSED = [("gate_up_proj", ["expert_feedforward_gate_dense",
                            "expert_feedforward_intermediate_dense"]),
          ("down_proj", ["expert_feedforward_output_dense"])]


def rules(config: dict, model=None) -> RuleSet:
    """The Mixtral rule set for a Hugging Face config (sizes decide the head reshapes, the
    number of layers and of experts), its targets named as `model`'s layers are (else as
    the first model of a fresh session names them)."""
    layers = size(config, "num_hidden_layers", "Mixtral")
    experts = size(config, "num_local_experts", "Mixtral")
    head_dim = config.get("head_dim")
    base = decoder_base(config, "Mixtral", classes=CLASSES, tasks=TASKS, lm_head=True,
                        head_dim=head_dim if head_dim else None)
    blocks = block_names([BLOCK] * layers, model, what="Mixtral")
    moe, fused = [], []  # the original form (export writes it), transformers 5's
    for i, block in enumerate(blocks):
        source, target = f"model.layers.{i}.block_sparse_moe", f"transformer_layer_{i}/{block}"
        moe.append(Rule(f"{source}.gate.weight",
                        f"{target}/sparse_feedforward_gate_dense/kernel", Transpose()))
        moe += expert_rules(f"{source}.experts.{{e}}", f"{target}/experts", _BANKS, experts)
        fused.append(Rule(f"model.layers.{i}.mlp.gate.weight",
                          f"{target}/sparse_feedforward_gate_dense/kernel", Transpose()))
        fused += fused_rules(f"model.layers.{i}.mlp.experts", f"{target}/experts", _FUSED)
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in CLASSES.values())]))
    return RuleSet(base + prefixed(moe, prefixes) + prefixed(fused, prefixes), alternatives=True,
                   name="huggingface('mixtral')", classes=TASKS)
