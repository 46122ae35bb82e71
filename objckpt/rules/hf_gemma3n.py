"""Hugging Face Gemma 3n's text decoder (`Gemma3nForCausalLM`, `Gemma3nTextModel`, model type
`gemma3n_text`) <-> keras-hub's `Gemma3nBackbone` without vision or audio encoders.

Names and layouts follow keras-hub's importer `convert_gemma3n.py` (`_port_language_model`,
which reads the decoder under `model.language_model.` of the multimodal checkpoints; the
text-only classes save it under `model.`, `Gemma3nTextModel` bare): every `Linear` weight
(out, in) is a Keras kernel (in, out), the attention's q/k/v/o included (keras-hub's Gemma 3n
attention keeps them as plain dense kernels, not split by head); embeddings and RMS norm
scales as they are. Besides Gemma 3's layer (q/k norms, the four norms around attention and
feed-forward), each layer has

- AltUp (`altup.`): `prediction_coefs`, `correction_coefs` and `modality_router` weights
  transposed, `router_norm` and, where `altup_correct_scale` (transformers' default),
  `correct_output_scale` as they are;
- Laurel (`laurel.`): `linear_left` and `linear_right` transposed, `post_laurel_norm`;
- the per-layer inputs: `per_layer_input_gate` and `per_layer_projection` transposed,
  `post_per_layer_input_norm`;

and the model has the per-layer embedding (`embed_tokens_per_layer`), its projection
(`per_layer_model_projection`, transposed) and norm, and `altup_num_inputs - 1` AltUp
projections into the extra streams and back (`altup_projections.{j}`,
`altup_unembed_projections.{j}`, transposed). The embedding is tied: one tensor,
`model.embed_tokens.weight`, is keras-hub's token embedding and its logits.

The last `num_kv_shared_layers` layers reuse an earlier layer's keys and values: transformers
5 gives them no k/v projections or key norm (and saves none), keras-hub builds them anyway and
never runs them. Their rules read those entries where a folder has them (checkpoints written
by earlier transformers versions); where it has none, restore leaves keras-hub's unused
variables as they are (listed under `skipped`, strict holds) and export writes none.

Targets are the backbone's object paths (`language_model/transformer_layers/{i}/...`), under
`backbone/` in the task model: keras-hub names the layers of its audio encoder by a counter
of the session, so the paths, not the variable names, are what every model shares.

Hub classes (`CLASSES`): `Gemma3nTextModel` saves the decoder bare, `Gemma3nForCausalLM` under
`model.`; `lm_head.weight` (tied) has no keras-hub variable and is set aside;
`Gemma3nCausalLM` has none beyond its backbone.
"""

from __future__ import annotations

from objckpt.rules.core import Rule, RuleSet, Transpose
from objckpt.rules.hf_llama import config_size, head_rules, prefixed

__all__ = ["MODEL_TYPES", "decoder_rules", "rules"]

MODEL_TYPES = ("gemma3n_text",)
CLASSES = {
    "Gemma3nTextModel": ("", ()),
    "Gemma3nForCausalLM": ("model.", ("lm_head.weight",)),
}
# keras-hub task model -> the Hub class of its heads (export's `architectures`).
TASKS = {"Gemma3nCausalLM": "Gemma3nForCausalLM"}
# the keras-hub models that never run a KV-shared layer's own key/value projections
UNUSED_BY = ("Gemma3nBackbone", "Gemma3nCausalLM")
_SHARED = ("a layer that reuses an earlier layer's keys and values (num_kv_shared_layers) has "
           "no k/v projections or key norm in transformers 5's folders")
_MODEL = "Gemma 3n"


def _refuse(key: str, value, why: str):
    from objckpt import errors

    raise errors.InvalidArgumentError(
        f"The {_MODEL} rule set {why}; the Hugging Face config has `{key}` = {value!r}. "
        f"Fix: pass the checkpoint's folder (its config.json), or a config whose `{key}` "
        "is as the message says.")


def _dense(source: str, target: str, **kwargs) -> Rule:
    return Rule(f"{source}.weight", f"{target}/kernel", Transpose(), **kwargs)


def _norm(source: str, target: str, **kwargs) -> Rule:
    return Rule(f"{source}.weight", f"{target}/scale", **kwargs)


def decoder_rules(config: dict, where: str = "") -> list:
    """The text decoder's rules, its entries named `model.` (the embeddings, the AltUp
    projections, each layer, the final norm), its targets under `where` (`backbone/` in a
    task model), for a text config; InvalidArgumentError for a size that is missing or out
    of range."""
    for key in ("hidden_size", "num_attention_heads", "head_dim", "laurel_rank",
                "hidden_size_per_layer_input"):
        config_size(config, key, _MODEL)  # keras-hub reads each from the config: no default
    layers = config_size(config, "num_hidden_layers", _MODEL)
    streams = config_size(config, "altup_num_inputs", _MODEL)
    shared = config.get("num_kv_shared_layers", 0)
    if shared is None:
        shared = 0
    if type(shared) is not int or not 0 <= shared < layers:
        _refuse("num_kv_shared_layers", shared,
                f"needs a number of shared layers from 0 to {layers - 1} (num_hidden_layers - 1)")
    correct_scale = config.get("altup_correct_scale", True)
    if not isinstance(correct_scale, bool):
        _refuse("altup_correct_scale", correct_scale, "needs a bool")

    model = f"{where}language_model"
    out = [
        Rule("model.embed_tokens.weight", f"{model}/embed_tokens/embedding/embeddings"),
        Rule("model.embed_tokens_per_layer.weight",
             f"{model}/embed_tokens_per_layer/embedding/embeddings"),
        _dense("model.per_layer_model_projection", f"{model}/per_layer_model_projection"),
        _norm("model.per_layer_projection_norm", f"{model}/per_layer_projection_norm"),
        _norm("model.norm", f"{model}/final_normalization"),
    ]
    for j in range(streams - 1):
        out += [_dense(f"model.altup_projections.{j}", f"{model}/altup_projections/{j}"),
                _dense(f"model.altup_unembed_projections.{j}",
                       f"{model}/altup_unembed_projections/{j}")]
    for i in range(layers):
        out += _layer_rules(i, model, own_kv=i < layers - shared,
                            correct_scale=correct_scale)
    return out


def _layer_rules(i: int, model: str, *, own_kv: bool, correct_scale: bool) -> list:
    """Layer `i`'s rules, its entries named `model.layers.{i}.`."""
    source, layer = f"model.layers.{i}", f"{model}/transformer_layers/{i}"
    attention, target = f"{source}.self_attn", f"{layer}/attention"
    out = [_dense(f"{attention}.{p}_proj", f"{target}/{p}_proj") for p in "qo"]
    out.append(_norm(f"{attention}.q_norm", f"{target}/q_norm"))
    kv = {} if own_kv else {"absent": _SHARED, "unused_by": UNUSED_BY}
    out += [_dense(f"{attention}.{p}_proj", f"{target}/{p}_proj", **kv) for p in "kv"]
    out.append(_norm(f"{attention}.k_norm", f"{target}/k_norm", **kv))
    out += [_dense(f"{source}.mlp.{p}_proj", f"{layer}/mlp/{p}_proj")
            for p in ("gate", "up", "down")]
    out += [_norm(f"{source}.{n}", f"{layer}/{n}")
            for n in ("input_layernorm", "post_attention_layernorm",
                      "pre_feedforward_layernorm", "post_feedforward_layernorm",
                      "post_per_layer_input_norm")]
    out += [_dense(f"{source}.{n}", f"{layer}/{n}")
            for n in ("per_layer_input_gate", "per_layer_projection")]
    altup = f"{source}.altup"
    out += [_dense(f"{altup}.{n}", f"{layer}/altup/{n}")
            for n in ("correction_coefs", "prediction_coefs", "modality_router")]
    out.append(_norm(f"{altup}.router_norm", f"{layer}/altup/router_norm"))
    if correct_scale:
        out.append(Rule(f"{altup}.correct_output_scale", f"{layer}/altup/correct_output_scale"))
    laurel = f"{source}.laurel"
    out += [_dense(f"{laurel}.{n}", f"{layer}/laurel/{n}") for n in ("linear_left", "linear_right")]
    out.append(_norm(f"{laurel}.post_laurel_norm", f"{layer}/laurel/post_laurel_norm"))
    return out


def rules(config: dict) -> RuleSet:
    """The Gemma 3n text-decoder rule set for a Hugging Face config (its sizes decide the
    layers, AltUp streams and shared layers), for a keras-hub backbone or (`config["task"]`
    a task model of `TASKS`) its task model."""
    where = "backbone/" if config.get("task") in TASKS else ""
    return RuleSet(prefixed(decoder_rules(config, where), ["model.", ""])
                   + head_rules(CLASSES, lm_head=False),
                   alternatives=True, name="huggingface('gemma3n_text')", classes=TASKS)
