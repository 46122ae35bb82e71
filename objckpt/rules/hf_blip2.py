"""Hugging Face BLIP-2 (`Blip2ForConditionalGeneration`, `Blip2Model`, model type `blip-2`)
<-> keras-hub's `BLIP2Backbone`, with an OPT or a Flan-T5 language model.

Names and layouts follow keras-hub's importer (`convert_blip2.py`). The vision tower, the
Q-Former and the language projection are every BLIP-2's (`objckpt.rules.hf_blip2_towers`);
the language model (`text_config`, `language_model.`) is one of:

- OPT (`text_config.model_type` "opt") <-> keras-hub's `BLIP2CustomOPT`: the token and
  position embeddings as they are (transformers' position table has its two offset rows, as
  keras-hub's), each layer's q/k/v weights (hidden, hidden) <-> kernels (hidden, heads,
  head_dim), their biases <-> (heads, head_dim), `out_proj` <-> (heads, head_dim, hidden),
  `fc1`/`fc2` transposed, `self_attn_layer_norm` and `final_layer_norm` <-> the layer's
  self-attention and feed-forward norms, the decoder's `final_layer_norm` <-> `layer_norm`.
  keras-hub builds OPT's pre-norm layers with biases only: a config with
  `do_layer_norm_before` false, `enable_bias` false, a `word_embed_proj_dim` other than the
  hidden size or no final norm is refused;
- Flan-T5 (`text_config.model_type` "t5") <-> keras-hub's `BLIP2FlanT5` (a `T5Backbone`):
  `shared.weight` <-> the token embedding, each attention's q/k/v/o weights transposed,
  layer 0's relative position bias (buckets, heads) as it is, the gated feed-forward's
  `wi_0`/`wi_1`/`wo` <-> `input_projector`/`gate_projector`/`output_projector`, the RMS norms'
  `weight`s as they are. keras-hub's T5 has one depth for both stacks, gated GELU, 32
  position buckets up to distance 128: a config that says otherwise is refused.

keras-hub builds each language model as a functional model that calls its layers as
operations, so the rules name the layers' variables by object path (OPT's token embedding,
which `BLIP2CausalLM` reaches through its own operations first, by its variable's name
`embeddings_layer/token_embedding/embeddings`): OPT's layer i is
`language_model` operation 12 + i; T5's token embedding is operation 5, its encoder's layer i
operation 13 + i and final norm 14 + layers, its decoder's layer i 18 + layers + i and final
norm 18 + 2 * layers (under `backbone/` in a task model). The integration tests pin these
against keras-hub's own models.

Hub classes (`CLASSES`): `Blip2Model` and `Blip2ForConditionalGeneration` hold the same
entries (transformers 5 gives both the language model with its head), saved bare. OPT's
`language_model.lm_head.weight` is tied to the token embedding (transformers writes none; set
aside where a folder has one; an untied OPT config is refused); keras-hub's `BLIP2CausalLM`
has no variable beyond its backbone. keras-hub's `BLIP2Seq2SeqLM` has an `lm_head` (a `Dense`
of its own, its kernel the transposed weight), fed by what transformers 5 reads:

- a text config with `tie_word_embeddings` false (the Hub's Flan-T5 folders, written by
  transformers 4, which hold `language_model.lm_head.weight`): that entry (a head: set aside
  in a backbone). transformers 5 forces `tie_word_embeddings` true in a T5 config it loads,
  but keeps a folder's `lm_head.weight` where it differs from `shared.weight`;
- any other (what transformers 5 writes: it ties T5's `lm_head` to `shared.weight` always,
  saves no `lm_head.weight`, and records `tie_word_embeddings: true`): `shared.weight`
  restores both the token embedding and the head, and export writes it once, after
  checking that both agree.

Older transformers' tied copies of `shared.weight` (`encoder.embed_tokens`,
`decoder.embed_tokens`) are set aside. transformers 5 scales a T5's decoder output by
d_model ** -0.5 before its head where the config says `scale_decoder_outputs` (original T5,
not Flan-T5); keras-hub never does, so such a model's logits differ (the backbone's outputs do
not). keras-hub's own importer reads `language_model.lm_head.weight` for Flan-T5, which
transformers 5's folders lack. The retrieval and one-tower classes (`Blip2ForImageTextRetrieval`,
`Blip2VisionModelWithProjection`, `Blip2TextModelWithProjection`, `Blip2VisionModel`,
`Blip2QFormerModel`) have no language model and no keras-hub model.
"""

from __future__ import annotations

from objckpt.rules.core import NOWHERE, Chain, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.hf_blip2_towers import (MODEL, dense, heads, part, projection_rules,
                                           qformer_rules, size, vision_rules)
from objckpt.rules.hf_vit import layer_norm

__all__ = ["CLASSES", "MODEL_TYPES", "TASKS", "rules"]

MODEL_TYPES = ("blip-2",)
_LM_HEAD = "language_model.lm_head.weight"
# Hub class -> (its prefix, head entries as transformers names them).
CLASSES = {
    "Blip2Model": ("", (_LM_HEAD,)),
    "Blip2ForConditionalGeneration": ("", (_LM_HEAD,)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"BLIP2CausalLM": "Blip2ForConditionalGeneration",
         "BLIP2Seq2SeqLM": "Blip2ForConditionalGeneration"}
_OPT_LAYER_0 = 12  # OPT's layer i is the language model's operation 12 + i
_T5_EMBEDDING, _T5_ENCODER_0, _T5_DECODER_0 = 5, 13, 18  # T5's operations (see above)
_T5_BUCKETS, _T5_DISTANCE = 32, 128  # keras-hub's fixed relative position buckets


def _invalid(text: str, fix: str):
    """The error for what the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"{text} Fix: {fix}")


def _refuse(key: str, value, expected: str, why: str):
    raise _invalid(
        f"The {MODEL} rule set needs `text_config.{key}` {expected}; received {value!r}: "
        f"{why}.", "convert a checkpoint keras-hub's BLIP-2 can hold, or write the rules "
        "with objckpt.rules.Rule for a model built to match.")


def _opt(text: dict, where: str) -> list:
    hidden, count, head_dim = heads(text, "text_config.")
    layers = size(text, "num_hidden_layers", "text_config.")
    for key, expected, default in (("do_layer_norm_before", True, True),
                                   ("enable_bias", True, True),
                                   ("layer_norm_elementwise_affine", True, True),
                                   ("_remove_final_layer_norm", False, False)):
        if text.get(key, default) is not expected:
            _refuse(key, text.get(key), f"{expected}",
                    "keras-hub's BLIP2CustomOPT builds pre-norm layers with biases and "
                    "affine norms, and a final norm")
    if text.get("tie_word_embeddings", True) is not True:
        _refuse("tie_word_embeddings", text.get("tie_word_embeddings"), "True",
                "keras-hub's BLIP2CustomOPT computes its logits with the token embedding")
    if text.get("word_embed_proj_dim", hidden) != hidden:
        _refuse("word_embed_proj_dim", text.get("word_embed_proj_dim"),
                f"equal to `hidden_size` ({hidden})",
                "keras-hub's BLIP2CustomOPT has no project_in/project_out")
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, count, head_dim)))
    decoder, lm = "language_model.model.decoder", f"{where}language_model"
    # by its variable's name: a task model reaches it through its own operations first
    out = [Rule(f"{decoder}.embed_tokens.weight", "embeddings_layer/token_embedding/embeddings"),
           Rule(f"{decoder}.embed_positions.weight",
                f"{lm}/embeddings_layer/position_embedding/embeddings"),
           *layer_norm(f"{decoder}.final_layer_norm", f"{lm}/layer_norm")]
    for i in range(layers):
        source, target = f"{decoder}.layers.{i}", f"{lm}/operations/{_OPT_LAYER_0 + i}"
        attention = f"{target}/self_attention_layer"
        for hf, keras in (("q", "query"), ("k", "key"), ("v", "value")):
            out += [Rule(f"{source}.self_attn.{hf}_proj.weight",
                         f"{attention}/{keras}_dense/kernel", into_heads),
                    Rule(f"{source}.self_attn.{hf}_proj.bias",
                         f"{attention}/{keras}_dense/bias", Reshape((hidden,),
                                                                    (count, head_dim)))]
        out += [Rule(f"{source}.self_attn.out_proj.weight", f"{attention}/output_dense/kernel",
                     Chain(Transpose(), Reshape((hidden, hidden), (count, head_dim, hidden)))),
                Rule(f"{source}.self_attn.out_proj.bias", f"{attention}/output_dense/bias"),
                *layer_norm(f"{source}.self_attn_layer_norm",
                            f"{target}/self_attention_layer_norm"),
                *layer_norm(f"{source}.final_layer_norm", f"{target}/feedforward_layer_norm"),
                *dense(f"{source}.fc1", f"{target}/feedforward_intermediate_dense"),
                *dense(f"{source}.fc2", f"{target}/feedforward_output_dense")]
    tied = [Rule(_LM_HEAD, f"{NOWHERE}/{_LM_HEAD}",
                 head=", ".join(CLASSES) + " (tied to the token embedding)")]
    return out + tied


def _t5_sizes(text: dict) -> int:
    """T5's depth, after checking what keras-hub's T5Backbone can hold."""
    for key in ("d_model", "d_kv", "d_ff", "num_heads", "vocab_size"):
        size(text, key, "text_config.")
    layers = size(text, "num_layers", "text_config.")
    if text.get("num_decoder_layers", layers) != layers:
        _refuse("num_decoder_layers", text.get("num_decoder_layers"),
                f"equal to `num_layers` ({layers})",
                "keras-hub's T5Backbone gives its encoder and decoder one depth")
    if text.get("feed_forward_proj", "gated-gelu") != "gated-gelu":
        _refuse("feed_forward_proj", text.get("feed_forward_proj"), "'gated-gelu'",
                "keras-hub's BLIP2FlanT5 builds Flan-T5's gated GELU feed-forward")
    for key, expected in (("relative_attention_num_buckets", _T5_BUCKETS),
                          ("relative_attention_max_distance", _T5_DISTANCE)):
        if text.get(key, expected) != expected:
            _refuse(key, text.get(key), f"{expected}",
                    "keras-hub's T5 attention has 32 buckets up to distance 128, fixed")
    return layers


def _t5_attention(source: str, target: str, relative: bool) -> list:
    out = [Rule(f"{source}.{hf}.weight", f"{target}/{keras}_projector/kernel", Transpose())
           for hf, keras in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "output"))]
    if relative:
        out.append(Rule(f"{source}.relative_attention_bias.weight",
                        f"{target}/relative_attention_bias"))
    return out


def _t5_ffn(source: str, target: str) -> list:
    return [Rule(f"{source}.DenseReluDense.{hf}.weight", f"{target}/{keras}/kernel", Transpose())
            for hf, keras in (("wi_0", "input_projector"), ("wi_1", "gate_projector"),
                              ("wo", "output_projector"))] + [
        Rule(f"{source}.layer_norm.weight", f"{target}/layer_norm/weight")]


def _t5(text: dict, where: str, task: bool) -> list:
    layers = _t5_sizes(text)
    lm, ops = "language_model", f"{where}language_model/operations"
    out = [Rule(f"{lm}.shared.weight", f"{ops}/{_T5_EMBEDDING}/embeddings")]
    untied = text.get("tie_word_embeddings") is False
    if untied:  # the Hub's Flan-T5 folders (written by transformers 4): their own lm_head
        out.append(Rule(_LM_HEAD, "lm_head/kernel", Transpose(), head=", ".join(CLASSES)))
    elif task:  # keras-hub's own lm_head: transformers 5 ties it to `shared`
        out.append(Rule(f"{lm}.shared.weight", "lm_head/kernel", Transpose()))
    for i in range(layers):
        source, target = f"{lm}.encoder.block.{i}.layer", f"{ops}/{_T5_ENCODER_0 + i}"
        out += [*_t5_attention(f"{source}.0.SelfAttention", f"{target}/self_attention", i == 0),
                Rule(f"{source}.0.layer_norm.weight", f"{target}/self_attention_layer_norm/weight"),
                *_t5_ffn(f"{source}.1", target)]
    out.append(Rule(f"{lm}.encoder.final_layer_norm.weight",
                    f"{ops}/{_T5_ENCODER_0 + layers + 1}/weight"))
    for i in range(layers):
        source = f"{lm}.decoder.block.{i}.layer"
        target = f"{ops}/{_T5_DECODER_0 + layers + i}"
        out += [*_t5_attention(f"{source}.0.SelfAttention", f"{target}/self_attention", i == 0),
                Rule(f"{source}.0.layer_norm.weight", f"{target}/self_attention_layer_norm/weight"),
                *_t5_attention(f"{source}.1.EncDecAttention", f"{target}/cross_attention", False),
                Rule(f"{source}.1.layer_norm.weight",
                     f"{target}/cross_attention_layer_norm/weight"),
                *_t5_ffn(f"{source}.2", target)]
    out.append(Rule(f"{lm}.decoder.final_layer_norm.weight",
                    f"{ops}/{_T5_DECODER_0 + 2 * layers}/weight"))
    tied = [f"{lm}.{stack}.embed_tokens.weight" for stack in ("encoder", "decoder")]
    return out + [Rule(entry, f"{NOWHERE}/{entry}", head=", ".join(CLASSES) + (
        " (tied to `language_model.shared.weight`)")) for entry in tied]


def rules(config: dict) -> RuleSet:
    """The BLIP-2 rule set for a Hugging Face config (`vision_config`, `qformer_config`,
    `text_config`, `num_query_tokens`: their sizes decide the reshapes and the layers; the
    text config's `model_type`, OPT or T5, the language model's rules).

    Example:
      >>> rules = objckpt.rules.huggingface("blip-2", config=hf_config)
      >>> objckpt.restore(keras_hub.models.BLIP2Backbone(...), "blip2_dir", rules=rules)
    """
    text = part(config, "text_config")
    size(config, "num_query_tokens", "")
    task = config.get("task", "")
    where = "backbone/" if task in TASKS else ""
    kind = str(text.get("model_type", "")).lower()
    if kind == "opt":
        language = _opt(text, where)
    elif kind == "t5":
        language = _t5(text, where, task == "BLIP2Seq2SeqLM")
    else:
        raise _invalid(
            f"The {MODEL} rule set reads an OPT or a Flan-T5 language model "
            f"(`text_config.model_type` 'opt' or 't5'); received {kind!r}: keras-hub's importer "
            "(convert_blip2.py) builds no other.", "convert a BLIP-2 of OPT or Flan-T5, or "
            "write the rules with objckpt.rules.Rule.")
    towers = [Rule(r.source, where + r.target, r.transform)
              for r in vision_rules(config) + qformer_rules(config) + projection_rules()]
    return RuleSet(towers + language, alternatives=True, name="huggingface('blip-2')",
                   classes=TASKS)
