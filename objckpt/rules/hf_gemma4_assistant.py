"""Hugging Face's Gemma 4 assistant (`Gemma4AssistantForCausalLM`, model type
`gemma4_assistant`: the small draft model of Gemma 4's multi-token prediction) <-> keras-hub's
`Gemma4Backbone` and its task model `Gemma4AssistantCausalLM`.

Names and layouts follow keras-hub's importer `convert_gemma4_assistant.py`: the decoder is
Gemma 4's text decoder (`objckpt.rules.hf_gemma4.decoder_rules`, its `text_config`) under
`model.`, every layer reading the target model's keys and values (no k/v projections or key
norms on either side). The task model's entries: `pre_projection` (hidden, 2 * the target's
hidden) and `post_projection` (the target's hidden, hidden) `Linear` weights, transposed;
where `use_ordered_embeddings` is set, `masked_embedding.centroids` (transposed) and
`masked_embedding.token_ordering` (int64 token ids in the file, a float32 variable in
keras-hub: restore reads it with `cast="lossy"`, exact below 2**24 ids; export writes
float32, which transformers casts back when it loads).

Hub classes (`CLASSES`): `Gemma4AssistantForCausalLM` only. Into a bare `Gemma4Backbone` its
projections and centroids are set aside; `lm_head.weight` (tied to the token embedding) has
no keras-hub variable and is set aside always.
"""

from __future__ import annotations

from objckpt.rules.core import Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma4 import decoder_rules
from objckpt.rules.hf_llama import config_size, head_rules

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("gemma4_assistant",)
_CLASS = "Gemma4AssistantForCausalLM"
_HEADS = ("pre_projection.weight", "post_projection.weight",
          "masked_embedding.centroids.weight", "masked_embedding.token_ordering")
CLASSES = {_CLASS: ("", ("lm_head.weight", *_HEADS))}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma4AssistantCausalLM": _CLASS}
_MODEL = "Gemma 4 assistant"


def rules(config: dict) -> RuleSet:
    """The Gemma 4 assistant rule set for a Hugging Face config (`text_config` and the
    target's `backbone_hidden_size`)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The {_MODEL} rule set needs `text_config` (a dict) from the Hugging Face "
            f"config; received {text!r}. Fix: pass the checkpoint's folder (its config.json),"
            " or config={'text_config': {...}, 'backbone_hidden_size': ...}.")
    config_size(config, "backbone_hidden_size", _MODEL)
    out = decoder_rules(text, _MODEL, all_shared=True)
    heads = [Rule("pre_projection.weight", "pre_projection/kernel", Transpose(), head=_CLASS),
             Rule("post_projection.weight", "post_projection/kernel", Transpose(), head=_CLASS)]
    if config.get("use_ordered_embeddings", False):
        config_size(config, "num_centroids", _MODEL)
        heads += [Rule("masked_embedding.centroids.weight", "centroids/kernel", Transpose(),
                       head=_CLASS),
                  Rule("masked_embedding.token_ordering", "token_ordering", head=_CLASS)]
    return RuleSet(out + heads + head_rules(CLASSES, lm_head=False), alternatives=True,
                   name="huggingface('gemma4_assistant')", classes=TASKS)
