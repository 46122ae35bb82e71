"""Hugging Face Mistral (`MistralForCausalLM`) <-> keras-hub's `MistralBackbone`.

The decoder is Llama's (`objckpt.rules.hf_llama`, names and layouts as keras-hub's importer
`convert_mistral.py` reads them); Mistral's config may give `head_dim` (else hidden_size /
num_attention_heads), and keras-hub's backbone always has an untied output embedding, so
`lm_head.weight` is always part of the set (keras-hub's own Mistral export leaves it out,
and its importer then fails; objckpt's export writes it). Hub classes and heads as Llama's
(`CLASSES`); keras-hub's `MistralCausalLM` takes `lm_head.weight` only.
"""

from __future__ import annotations

from objckpt.rules.core import RuleSet
from objckpt.rules.hf_llama import decoder_rules, hub_classes

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("mistral",)
CLASSES = hub_classes("Mistral")
TASKS = {"MistralCausalLM": "MistralForCausalLM"}


def rules(config: dict) -> RuleSet:
    """The Mistral rule set for a Hugging Face config (sizes decide the head reshapes)."""
    head_dim = config.get("head_dim")
    return decoder_rules(config, "Mistral", head_dim=head_dim if head_dim else None,
                         lm_head=True, classes=CLASSES, tasks=TASKS)
