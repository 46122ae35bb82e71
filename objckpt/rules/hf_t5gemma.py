"""Hugging Face T5Gemma (`T5GemmaModel`, `T5GemmaForConditionalGeneration`, ...) <->
keras-hub's `T5GemmaBackbone` (encoder-decoder).

Names and layouts follow keras-hub's importer (`convert_t5gemma.py`): each stack has its
own token embedding (`encoder.embed_tokens`, `decoder.embed_tokens`) and final norm; q/k/v
weights (heads * head_dim, hidden) <-> kernels (hidden, heads, head_dim), o (hidden, heads *
head_dim) <-> (heads, head_dim, hidden), MLP `Linear` weights transposed, the Gemma 2 style
norms before and after self-attention, cross-attention (`cross_attn`, the decoder's) and
the feed-forward block as they are. Sizes come from the config's `encoder` and `decoder`
sub-configs (the cross-attention's keys and values read the encoder's hidden size).

keras-hub gives the two final norms no names of their own (`rms_normalization/scale`,
numbered by how many Keras made before), so those rules target the backbone's attributes
by object path (`encoder_norm/scale`, under `backbone/` in the task model).

Hub classes (`CLASSES`): `T5GemmaModel` saves the model bare, the task classes under
`model.`; restore reads both, export writes `model.`. keras-hub's `T5GemmaSeq2SeqLM` has no
variable beyond its backbone: `T5GemmaForConditionalGeneration`'s `lm_head.out_proj.weight`
(tied to the decoder's token embedding) and the classification heads are set aside; an
untied config is refused (keras-hub's importer reads no output projection).
`T5GemmaEncoderModel` (an encoder alone) has no keras-hub model.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import config_size, prefixed

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("t5gemma",)
_SCORE = ("score.out_proj.weight", "score.out_proj.bias")
CLASSES = {
    "T5GemmaModel": ("", ()),
    "T5GemmaForConditionalGeneration": ("model.", ("lm_head.out_proj.weight",)),
    "T5GemmaForSequenceClassification": ("model.", _SCORE),
    "T5GemmaForTokenClassification": ("model.", _SCORE),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"T5GemmaSeq2SeqLM": "T5GemmaForConditionalGeneration"}


def _stack(config: dict, key: str) -> dict:
    given = config.get(key)
    if not isinstance(given, dict):
        from objckpt import errors

        raise errors.InvalidArgumentError(
            f"The T5Gemma rule set needs `{key}` (the {key}'s config, a dict) from the "
            f"Hugging Face config; received {type(given).__name__}. Fix: pass the "
            f"checkpoint's folder (its config.json), or config={{'{key}': {{...}}, ...}}.")
    return given


def _attention(source: str, target: str, sizes: dict, keys_from: int) -> list:
    """q/k/v/o of one attention; k/v read vectors of size `keys_from`."""
    hidden, heads, kv_heads, head_dim = (sizes[k] for k in (
        "hidden", "heads", "kv_heads", "head_dim"))

    def into_heads(n, width):  # (n * head_dim, width) -> (width, n, head_dim)
        return Chain(Transpose(), Reshape((width, n * head_dim), (width, n, head_dim)))

    return [
        Rule(f"{source}.q_proj.weight", f"{target}/query/kernel", into_heads(heads, hidden)),
        Rule(f"{source}.k_proj.weight", f"{target}/key/kernel", into_heads(kv_heads, keys_from)),
        Rule(f"{source}.v_proj.weight", f"{target}/value/kernel",
             into_heads(kv_heads, keys_from)),
        Rule(f"{source}.o_proj.weight", f"{target}/attention_output/kernel",
             Chain(Transpose(), Reshape((heads * head_dim, hidden),
                                        (heads, head_dim, hidden)))),
    ]


def _sizes(config: dict, key: str) -> dict:
    stack = _stack(config, key)
    model = f"T5Gemma ({key})"

    def size(name, default=None):
        return config_size(stack, name, model, default)

    heads = size("num_attention_heads")
    return {"hidden": size("hidden_size"), "heads": heads,
            "kv_heads": size("num_key_value_heads", heads), "head_dim": size("head_dim")}


def _mlp(source: str, target: str) -> list:
    return [Rule(f"{source}.mlp.{p}_proj.weight", f"{target}/mlp/{p}_proj/kernel", Transpose())
            for p in ("gate", "up", "down")]


def _norms(source: str, target: str, pairs) -> list:
    return [Rule(f"{source}.{hf}.weight", f"{target}/{keras}/scale") for hf, keras in pairs]


def rules(config: dict) -> RuleSet:
    """The T5Gemma rule set for a Hugging Face config (each stack's sizes decide its head
    reshapes; a task model's final norms under `backbone/`)."""
    encoder, decoder = _sizes(config, "encoder"), _sizes(config, "decoder")
    if config.get("tie_word_embeddings", True) is not True:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            "The T5Gemma rule set needs `tie_word_embeddings` true in the Hugging Face "
            f"config; received {config.get('tie_word_embeddings')!r}: keras-hub's importer "
            "reads no output projection (its logits are the decoder's token embedding's). "
            "Fix: convert a tied checkpoint, or write the rules with objckpt.rules.Rule.")
    where = "backbone/" if config.get("task") in TASKS else ""
    enc, dec = "model.encoder.layers.{i}", "model.decoder.layers.{i}"
    ours_e, ours_d = "encoder_layer_{i}", "decoder_layer_{i}"
    out = [
        Rule("model.encoder.embed_tokens.weight", "encoder_token_embedding/embeddings"),
        Rule("model.decoder.embed_tokens.weight", "decoder_token_embedding/embeddings"),
        Rule("model.encoder.norm.weight", f"{where}encoder_norm/scale"),
        Rule("model.decoder.norm.weight", f"{where}decoder_norm/scale"),
        *_attention(f"{enc}.self_attn", f"{ours_e}/self_attention", encoder,
                    encoder["hidden"]),
        *_mlp(enc, ours_e),
        *_norms(enc, ours_e, [(f"{w}_{hf}", f"{w}_{keras}") for w in ("pre", "post")
                              for hf, keras in (("self_attn_layernorm",
                                                 "self_attention_layernorm"),
                                                ("feedforward_layernorm",
                                                 "feedforward_layernorm"))]),
        *_attention(f"{dec}.self_attn", f"{ours_d}/self_attention", decoder,
                    decoder["hidden"]),
        *_attention(f"{dec}.cross_attn", f"{ours_d}/cross_attention", decoder,
                    encoder["hidden"]),
        *_mlp(dec, ours_d),
        *_norms(dec, ours_d, [(f"{w}_{hf}", f"decoder_{w}_{keras}") for w in ("pre", "post")
                              for hf, keras in (("self_attn_layernorm",
                                                 "self_attention_layernorm"),
                                                ("cross_attn_layernorm",
                                                 "cross_attention_layernorm"),
                                                ("feedforward_layernorm",
                                                 "feedforward_layernorm"))]),
    ]
    heads = []
    for entry in dict.fromkeys(e for _, held in CLASSES.values() for e in held):
        holders = ", ".join(n for n, (_, held) in CLASSES.items() if entry in held)
        tied = " (tied to the decoder's token embedding)" if entry.startswith("lm_head") else ""
        heads.append(Rule(entry, f"{NOWHERE}/{entry}", head=holders + tied))
    return RuleSet(prefixed(out, ["model.", ""]) + heads, alternatives=True,
                   name="huggingface('t5gemma')", classes=TASKS)
