"""Hugging Face T5Gemma 2 (`T5Gemma2Model`, `T5Gemma2ForConditionalGeneration`, ...) <->
keras-hub's `T5Gemma2Backbone` (encoder-decoder, with the SigLIP vision tower where the
encoder's config has a `vision_config`).

Names and layouts follow keras-hub's importer (`convert_t5gemma2.py`): one token embedding
(`encoder.embed_tokens.weight`) feeds both keras-hub's `encoder_token_embedding` and
`decoder_token_embedding` (transformers ties the decoder's to it and writes it once; export
writes it once and refuses a model whose two differ), and the end-of-image vector
(`encoder.embed_tokens.eoi_embedding`) feeds both `encoder_eoi_embedding` and
`decoder_eoi_embedding` the same way. q/k/v weights (heads * head_dim, hidden) <-> kernels
(hidden, heads, head_dim), o (hidden, heads * head_dim) <-> (heads, head_dim, hidden), MLP
`Linear` weights transposed, the Gemma 3 query/key norms and the norms before and after
attention and feed-forward as they are. The decoder's one attention (`self_attn`, self and
cross merged) is keras-hub's `merged_attention`. The vision tower and the multimodal
projector are Gemma 3's (objckpt.rules.hf_gemma3_vision), under `encoder.`.

keras-hub gives the two final norms no names of their own (`rms_normalization/scale`), so
those rules target the backbone's attributes by object path (`encoder_norm/scale`, under
`backbone/` in the task model).

Key forms: keras-hub's importer reads the vision tower as `encoder.vision_tower.
vision_model.` (the Hub's folders' names); transformers 5's `save_pretrained` writes
`encoder.vision_tower.` (no `vision_model.`). Restore reads either; export writes the first,
which transformers loads too.

Hub classes (`CLASSES`): `T5Gemma2Model` saves the model bare, the task classes under
`model.`; restore reads both, export writes `model.`. keras-hub's `T5Gemma2Seq2SeqLM` has no
variable beyond its backbone: the tied `lm_head.out_proj.weight` and the classification
heads are set aside, as are the decoder's `embed_tokens` entries where a folder holds them
(transformers ties them to the encoder's, which are read) and SigLIP's pooling head; an untied config is refused (keras-hub's importer reads no output
projection).
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_gemma3_vision import OUTPUT, siglip_head, vision_rules
from objckpt.rules.hf_llama import config_part, config_size, prefixed

__all__ = ["MODEL_TYPES", "rules"]

MODEL_TYPES = ("t5gemma2",)
_SCORE = ("score.out_proj.weight", "score.out_proj.bias")
CLASSES = {
    "T5Gemma2Model": ("", ()),
    "T5Gemma2ForConditionalGeneration": ("model.", ("lm_head.out_proj.weight",)),
    "T5Gemma2ForSequenceClassification": ("model.", _SCORE),
    "T5Gemma2ForTokenClassification": ("model.", _SCORE),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"T5Gemma2Seq2SeqLM": "T5Gemma2ForConditionalGeneration"}
# The vision tower's prefixes under `encoder.`, the first what export writes.
_TOWER = ("encoder.vision_tower.vision_model.", "encoder.vision_tower.")
_MODEL = "T5Gemma 2"


def _part(config: dict, key: str, where: str) -> dict:
    return config_part(config, key, _MODEL, "{'encoder': {'text_config': {...}, "
                       "'vision_config': {...}}, 'decoder': {...}}", where=where)


def _sizes(stack: dict, key: str) -> dict:
    model = f"{_MODEL} ({key})"

    def size(name, default=None):
        return config_size(stack, name, model, default)

    heads = size("num_attention_heads")
    return {"hidden": size("hidden_size"), "heads": heads,
            "kv_heads": size("num_key_value_heads", heads), "head_dim": size("head_dim")}


def _attention(source: str, target: str, sizes: dict) -> list:
    hidden, heads, kv_heads, head_dim = (sizes[k] for k in (
        "hidden", "heads", "kv_heads", "head_dim"))

    def into_heads(n):  # (n * head_dim, hidden) -> (hidden, n, head_dim)
        return Chain(Transpose(), Reshape((hidden, n * head_dim), (hidden, n, head_dim)))

    return [
        Rule(f"{source}.q_proj.weight", f"{target}/query/kernel", into_heads(heads)),
        Rule(f"{source}.k_proj.weight", f"{target}/key/kernel", into_heads(kv_heads)),
        Rule(f"{source}.v_proj.weight", f"{target}/value/kernel", into_heads(kv_heads)),
        Rule(f"{source}.o_proj.weight", f"{target}/attention_output/kernel",
             Chain(Transpose(), Reshape((heads * head_dim, hidden),
                                        (heads, head_dim, hidden)))),
        Rule(f"{source}.q_norm.weight", f"{target}/query_norm/scale"),
        Rule(f"{source}.k_norm.weight", f"{target}/key_norm/scale"),
    ]


def _layer(source: str, target: str, attention: str, norm: str, sizes: dict) -> list:
    """One encoder or decoder layer: attention, MLP and the four norms."""
    out = _attention(f"{source}.self_attn", f"{target}/{attention}", sizes)
    out += [Rule(f"{source}.mlp.{p}_proj.weight", f"{target}/mlp/{p}_proj/kernel", Transpose())
            for p in ("gate", "up", "down")]
    out += [Rule(f"{source}.{w}_{hf}.weight", f"{target}/{norm}{w}_{keras}/scale")
            for w in ("pre", "post") for hf, keras in (
                ("self_attn_layernorm", "self_attention_layernorm"),
                ("feedforward_layernorm", "feedforward_layernorm"))]
    return out


def rules(config: dict) -> RuleSet:
    """The T5Gemma 2 rule set for a Hugging Face config (each stack's sizes decide its head
    reshapes; the encoder's `vision_config`, where given, adds the vision tower; a task
    model's final norms under `backbone/`).

    Example:
      >>> rules = objckpt.rules.huggingface("t5gemma2", config=hf_config)
      >>> objckpt.restore(keras_hub.models.T5Gemma2Backbone(...), "t5gemma2_dir", rules=rules)
    """
    encoder_config = _part(config, "encoder", "")
    text = _part(encoder_config, "text_config", "encoder.")
    encoder, decoder = _sizes(text, "encoder"), _sizes(_part(config, "decoder", ""), "decoder")
    if text.get("tie_word_embeddings", True) is not True:
        from objckpt import errors

        raise errors.InvalidArgumentError(
            "The T5Gemma 2 rule set needs `encoder.text_config.tie_word_embeddings` true in "
            f"the Hugging Face config; received {text.get('tie_word_embeddings')!r}: "
            "keras-hub's importer reads no output projection (its logits are the token "
            "embedding's). Fix: convert a tied checkpoint, or write the rules with "
            "objckpt.rules.Rule.")
    where = "backbone/" if config.get("task") in TASKS else ""
    out = [
        Rule("encoder.embed_tokens.weight", "encoder_token_embedding/embeddings"),
        Rule("encoder.embed_tokens.weight", "decoder_token_embedding/embeddings"),
        Rule("encoder.norm.weight", f"{where}encoder_norm/scale"),
        Rule("decoder.norm.weight", f"{where}decoder_norm/scale"),
        *_layer("encoder.layers.{i}", "encoder_layer_{i}", "self_attention", "", encoder),
        *_layer("decoder.layers.{i}", "decoder_layer_{i}", "merged_attention", "decoder_",
                decoder),
    ]
    tied = {"decoder.embed_tokens.weight": "the encoder's token embedding"}
    vision = encoder_config.get("vision_config")
    if vision is not None:
        vision = _part(encoder_config, "vision_config", "encoder.")
        out += [Rule("encoder.embed_tokens.eoi_embedding", "encoder_eoi_embedding"),
                Rule("encoder.embed_tokens.eoi_embedding", "decoder_eoi_embedding"),
                Rule("encoder.multi_modal_projector.mm_soft_emb_norm.weight",
                     f"{OUTPUT}/vision_soft_embedding_norm/scale"),
                Rule("encoder.multi_modal_projector.mm_input_projection_weight",
                     f"{OUTPUT}/vision_input_projection/kernel")]
        out += [r.with_source(prefix + r.source) for prefix in _TOWER
                for r in vision_rules(vision, _MODEL)]
        tied["decoder.embed_tokens.eoi_embedding"] = "the encoder's end-of-image vector"
    classes = ", ".join(CLASSES)
    aside = [Rule(entry, f"{NOWHERE}/{entry}", head=f"{classes} (tied to {what}, which is read)")
             for entry, what in tied.items()]
    if vision is not None:
        # SigLIP's pooling head in both spellings of the tower (Gemma 3's, under `encoder.`)
        aside += [r.with_source("encoder." + r.source) for r in siglip_head(classes)
                  if r.source.startswith("vision_tower.")]
    heads = []
    for entry in dict.fromkeys(e for _, held in CLASSES.values() for e in held):
        holders = ", ".join(n for n, (_, held) in CLASSES.items() if entry in held)
        note = " (tied to the token embedding)" if entry.startswith("lm_head") else ""
        heads.append(Rule(entry, f"{NOWHERE}/{entry}", head=holders + note))
    model = [r.with_source("model." + r.source) for r in out + aside]
    return RuleSet(prefixed(model, ["model.", ""]) + heads, alternatives=True,
                   name="huggingface('t5gemma2')", classes=TASKS)
