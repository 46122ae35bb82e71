"""Hugging Face Qwen2-MoE and Qwen3-MoE (`Qwen2MoeForCausalLM`, `Qwen3MoeModel`, ...) <->
keras-hub's `QwenMoeBackbone` and `Qwen3MoeBackbone`.

Attention, norms and embeddings are Qwen2's and Qwen3's (`objckpt.rules.hf_qwen`, on
Llama's: q/k/v weights (heads * head_dim, hidden) <-> kernels (hidden, heads, head_dim);
Qwen2-MoE's q/k/v biases (heads * head_dim,) <-> (heads, head_dim), Qwen3-MoE's per-head
q/k norms and `head_dim` from the config), as keras-hub's importers `convert_qwen_moe.py` and
`convert_qwen3_moe.py` read them. Each layer's feedforward, `mlp`, is a sparse mixture of
experts where `decoder_sparse_step` and `mlp_only_layers` say so (transformers' and
keras-hub's rule: layer i is one unless i is in `mlp_only_layers`, and (i + 1) is a multiple
of `decoder_sparse_step`), else a dense MLP:

- the router `mlp.gate.weight` (experts, hidden) <-> the block's
  `sparse_feedforward_gate_dense/kernel`, transposed;
- per expert `mlp.experts.{e}.gate_proj|up_proj.weight` (inner, hidden), each transposed and
  joined side by side (`objckpt.rules.Concat`: gate first), the experts stacked
  (`objckpt.rules.Stack`) into `experts/expert_feedforward_gate_dense` (experts, hidden,
  2 * inner); `down_proj` stacked into `expert_feedforward_output_dense` (experts, inner,
  hidden);
- Qwen2-MoE's shared expert, `mlp.shared_expert.gate_proj|up_proj|down_proj.weight` <->
  `shared_expert_dense/feedforward_gate|intermediate|output_dense/kernel`, and its gate
  `mlp.shared_expert_gate.weight` (1, hidden) <-> `shared_expert_gate_dense/kernel`
  (hidden, 1), each transposed;
- a dense layer's `mlp.gate_proj|up_proj|down_proj.weight` <-> its MLP block's
  `feedforward_gate|intermediate|output_dense/kernel`, transposed (keras-hub's own importer
  fails on such layers: it looks for them on the decoder layer).

Key forms (`FORMS`): transformers 5 holds a layer's experts in one tensor per bank,
`mlp.experts.gate_up_proj` (experts, 2 * inner, hidden: gate then up) and `down_proj`
(experts, hidden, inner): keras-hub's banks with their last two axes swapped;
`save_pretrained` writes the original form unless told `save_original_format=False`.
Restore reads either form; export writes the original.

`norm_topk_prob` (whether the top-k router weights are renormalised) is a setting of the
model, not a weight: keras-hub's importer passes it to the backbone (`norm_top_k_prob`).

keras-hub names each layer's block by its class plus a counter of the session
(`qwen_sparse_moe_block_3`, `qwen3_moe_mlp_1`; `objckpt.rules.hf_moe`): the set is made for
the model it restores or exports (the operations do so themselves), reading each layer's
block name from the model.

`lm_head.weight` feeds the untied output embedding (`tie_word_embeddings` false, the
default); tied, the token embedding is both. Hub classes (`CLASSES`) as Llama's,
`Qwen3MoeForQuestionAnswering` under `transformer.`; keras-hub's `QwenMoeCausalLM` and
`Qwen3MoeCausalLM` have no variable beyond their backbone, the classification and
question-answering heads no keras-hub task model: set aside.
"""

from __future__ import annotations

from objckpt import errors
from objckpt.rules.core import Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import hub_classes, prefixed
from objckpt.rules.hf_moe import FORMS as MOE_FORMS
from objckpt.rules.hf_moe import block_names, decoder_base, expert_rules, fused_rules, size
from objckpt.rules.hf_qwen import attention_extra

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("qwen2_moe", "qwen3_moe")
PER_MODEL = True  # targets read from the model: its blocks' automatic names
FORMS = MOE_FORMS
CLASSES = {**hub_classes("Qwen2Moe"), **hub_classes("Qwen3Moe", qa_prefix="transformer.")}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"QwenMoeCausalLM": "Qwen2MoeForCausalLM", "Qwen3MoeCausalLM": "Qwen3MoeForCausalLM"}
# model_type -> (Hub class prefix, keras-hub's MoE block, its dense MLP block)
_KINDS = {"qwen2_moe": ("Qwen2Moe", "qwen_sparse_moe_block", "qwen_moe_mlp"),
          "qwen3_moe": ("Qwen3Moe", "qwen3_sparse_moe_block", "qwen3_moe_mlp")}
_BANKS = ((("gate_proj", "up_proj"), "expert_feedforward_gate_dense"),
          (("down_proj",), "expert_feedforward_output_dense"))
_FUSED = [("gate_up_proj", ["expert_feedforward_gate_dense"]),
          ("down_proj", ["expert_feedforward_output_dense"])]
_DENSE = (("gate_proj", "feedforward_gate_dense"), ("up_proj", "feedforward_intermediate_dense"),
          ("down_proj", "feedforward_output_dense"))


def sparse_layers(config: dict, name: str) -> list:
    """Whether each decoder layer is a mixture of experts (else a dense MLP), as
    transformers and keras-hub decide it."""
    layers = size(config, "num_hidden_layers", name)
    experts = size(config, _experts_key(config), name, minimum=0)
    step = size(config, "decoder_sparse_step", name, 1)
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(i) is int for i in dense):
        raise errors.InvalidArgumentError(
            f"The {name} rule set needs `mlp_only_layers` (a list of layer indices) from the "
            f"Hugging Face config; received {dense!r}. Fix: pass the checkpoint's folder (its "
            "config.json), or config={'mlp_only_layers': [...], ...}.")
    return [i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers)]


def _experts_key(config: dict) -> str:
    """The config's name for the number of experts: `num_experts`, or `num_local_experts`
    (transformers 5 writes Qwen3-MoE's under that name; keras-hub 0.32's importer reads only
    the first)."""
    return "num_experts" if "num_experts" in config or "num_local_experts" not in config \
        else "num_local_experts"


def _layer(i: int, block: str, sparse: bool, qwen2: bool, experts: int) -> list:
    """Layer i's feedforward rules: its experts (and Qwen2-MoE's shared expert) or its
    dense MLP."""
    source, target = f"model.layers.{i}.mlp", f"transformer_layer_{i}/{block}"
    if not sparse:
        return [Rule(f"{source}.{hf}.weight", f"{target}/{keras}/kernel", Transpose())
                for hf, keras in _DENSE]
    out = [Rule(f"{source}.gate.weight", f"{target}/sparse_feedforward_gate_dense/kernel",
                Transpose()),
           *expert_rules(f"{source}.experts.{{e}}", f"{target}/experts", _BANKS, experts)]
    if qwen2:
        out += [Rule(f"{source}.shared_expert.{hf}.weight",
                     f"{target}/shared_expert_dense/{keras}/kernel", Transpose())
                for hf, keras in _DENSE]
        out.append(Rule(f"{source}.shared_expert_gate.weight",
                        f"{target}/shared_expert_gate_dense/kernel", Transpose()))
    return out


def rules(config: dict, model=None) -> RuleSet:
    """The Qwen2-MoE or Qwen3-MoE (by `model_type`) rule set for a Hugging Face config
    (sizes decide the head reshapes, which layers hold experts and how many), its targets
    named as `model`'s layers are (else as the first model of a fresh session names them)."""
    model_type = str(config.get("model_type", "qwen2_moe")).lower()
    model_type = model_type if model_type in _KINDS else "qwen2_moe"
    name, moe_block, mlp_block = _KINDS[model_type]
    qwen3 = model_type == "qwen3_moe"
    classes = {k: v for k, v in CLASSES.items() if k.startswith(name)}
    tasks = {k: v for k, v in TASKS.items() if v.startswith(name)}
    given = config.get("head_dim")
    if qwen3 and given is not None and (type(given) is not int or given <= 0):
        raise errors.InvalidArgumentError(
            f"The {name} rule set needs `head_dim` (a positive int) from the Hugging Face "
            f"config where it has one; received {given!r}. Fix: pass the checkpoint's folder "
            "(its config.json), or config={'head_dim': ..., ...}.")
    head_dim = given if qwen3 and given else None  # keras-hub's Qwen2-MoE: hidden / heads
    sparse = sparse_layers(config, name)
    experts = config[_experts_key(config)]
    base = decoder_base(config, name, classes=classes, tasks=tasks, head_dim=head_dim,
                        lm_head=not config.get("tie_word_embeddings", False))
    # decoder_base checked the sizes (positive ints): the reshapes below can use them
    head_dim = head_dim or config["hidden_size"] // config["num_attention_heads"]
    blocks = block_names([moe_block if s else mlp_block for s in sparse], model, what=name)
    ours, fused = attention_extra(config, qwen3, head_dim), []
    for i, (block, is_sparse) in enumerate(zip(blocks, sparse)):
        ours += _layer(i, block, is_sparse, not qwen3, experts)
        if is_sparse:  # transformers 5's form after the original (export writes that)
            fused += fused_rules(f"model.layers.{i}.mlp.experts",
                                 f"transformer_layer_{i}/{block}/experts", _FUSED)
    prefixes = list(dict.fromkeys(["model.", *(p for p, _ in classes.values())]))
    return RuleSet(base + prefixed(ours + fused, prefixes), alternatives=True,
                   name=f"huggingface({model_type!r})", classes=tasks)
