"""What the mixture-of-experts decoders' sets share: each layer's feedforward block by the
name the model gave it, and the rules of its expert bank.

keras-hub names a decoder layer's feedforward block by Keras's automatic names, one counter
per class for the whole session (`mixtral_sparse_moe_block`, `mixtral_sparse_moe_block_1`,
..., and for the next model built `mixtral_sparse_moe_block_2`, ...), so the variable paths
of layer i's experts (`transformer_layer_0/mixtral_sparse_moe_block_2/experts/...`) are not
fixed by the architecture. The layer's own name is (`transformer_layer_{i}`, given by the
backbone), and so is the block's class prefix: `block_names` reads, for each layer, the one
segment below `transformer_layer_{i}/` that is that prefix with or without a `_N` counter,
from the model's variables. Without a model (a set made by name), each block gets the name
the first model built in a fresh session gives it; the operations that take a model (restore,
plan, export, ...) make the set again for theirs (`RuleSet.for_model`).
"""

from __future__ import annotations

import re

from objckpt import errors
from objckpt.rules.core import Chain, Concat, Rule, Split, Stack, Transpose

__all__ = ["FORMS", "block_names", "decoder_base", "expert_rules", "fused_rules",
           "variable_paths"]

# The key forms of a mixture of experts' folder: name -> (a regex that finds an expert key of
# that form, how a folder comes to hold it); the first is what export writes.
FORMS = {
    "original": (r"^(model\.|transformer\.)?layers\.\d+\.(block_sparse_moe|mlp)\.experts\.\d+\.",
                 "one entry per expert, what save_pretrained writes by default, read by every "
                 "transformers version"),
    "transformers 5": (r"^(model\.|transformer\.)?layers\.\d+\.mlp\.experts\."
                       r"(gate_up_proj|down_proj)$",
                       "each layer's experts in one tensor per bank, transformers 5's own "
                       "layout, written by save_pretrained(save_original_format=False)"),
}

_LAYER = re.compile(r"(?:^|/)transformer_layer_(\d+)/([^/]+)/")


def variable_paths(model) -> list:
    """The paths of a model's variables as Keras names them (`variable.path`, else TF's
    name without `:0`); nothing for an obj without `weights` or `variables`."""
    found = getattr(model, "weights", None)
    if found is None:
        found = getattr(model, "variables", None) or ()
    out = []
    for variable in found:
        path = getattr(variable, "path", None)
        if not isinstance(path, str):
            path = str(getattr(variable, "name", "")).split(":")[0]
        out.append(path)
    return out


def default_names(prefixes: list) -> list:
    """Each layer's block name as the first model of a fresh session has it: the k-th block
    of a prefix (layer order) is `prefix` for k = 0, else `prefix_k`."""
    seen: dict = {}
    out = []
    for prefix in prefixes:
        k = seen.get(prefix, 0)
        seen[prefix] = k + 1
        out.append(prefix if k == 0 else f"{prefix}_{k}")
    return out


def block_names(prefixes: list, model=None, *, what: str = "") -> list:
    """The name of each decoder layer's feedforward block (`prefixes[i]`: the class prefix
    of layer i's block, `mixtral_sparse_moe_block`), read from `model`'s variables where it
    has that layer's block, else the fresh-session name (`default_names`).

    Raises:
      InvalidArgumentError: a layer of the model holds two blocks of its prefix (the set
        would have to guess which is the feedforward block).
    """
    names = default_names(prefixes)
    if model is None:
        return names
    seen: dict = {}  # layer -> {block names of its prefix}
    for path in variable_paths(model):
        for found in _LAYER.finditer(path):
            layer, block = int(found.group(1)), found.group(2)
            if layer < len(prefixes) and re.fullmatch(
                    re.escape(prefixes[layer]) + r"(?:_\d+)?", block):
                seen.setdefault(layer, set()).add(block)
    for layer, blocks in sorted(seen.items()):
        if len(blocks) > 1:
            shown = ", ".join(f"`transformer_layer_{layer}/{b}`" for b in sorted(blocks))
            raise errors.InvalidArgumentError(
                f"The {what or 'mixture-of-experts'} rule set reads each decoder layer's "
                f"feedforward block from the model; layer {layer} holds {len(blocks)}: "
                f"{shown}. Expected one (keras-hub builds one per layer). Fix: pass the "
                "keras-hub backbone or task model the checkpoint is for, or write the rules "
                "of that layer with objckpt.rules.Rule.")
        names[layer] = next(iter(blocks))
    return names


def expert_rules(source: str, target: str, banks, experts: int) -> list:
    """One bank of experts per (Hugging Face weight names, keras-hub bank): each expert's
    torch `Linear` weight (out, in) transposed, the experts stacked (`Stack`), several
    weights joined along the last axis (`Concat`) where a bank holds them side by side.

    Args:
      source: the experts' prefix in the file with an `{e}` placeholder
        (`model.layers.0.block_sparse_moe.experts.{e}`).
      target: the bank layer's path (`transformer_layer_0/<block>/experts`).
      banks: [(names, bank variable)]: `(("w1",), "expert_feedforward_gate_dense")`, or
        `(("gate_proj", "up_proj"), "expert_feedforward_gate_dense")` for a fused bank.
      experts: how many experts each bank holds.
    """
    out = []
    for names, bank in banks:
        for index, name in enumerate(names):
            steps = [Transpose(), Stack("e", experts)]
            if len(names) > 1:
                steps.append(Concat(-1, parts=len(names), index=index))
            out.append(Rule(f"{source}.{name}.weight", f"{target}/{bank}", Chain(*steps)))
    return out


def fused_rules(source: str, target: str, banks: list) -> list:
    """transformers 5's form of a layer's experts: one tensor per bank, experts first,
    `gate_up_proj` (experts, 2 * inner, hidden: gate then up along axis 1) and `down_proj`
    (experts, hidden, inner), each a keras-hub bank with its last two axes swapped.

    Args:
      source: the experts' prefix in the file (`model.layers.0.mlp.experts`).
      target: the bank layer's path (`transformer_layer_0/<block>/experts`).
      banks: [(tensor name, [keras-hub bank variables])]: one bank takes the whole tensor,
        two take its halves along axis 1 (Mixtral's gate and intermediate banks).
    """
    out = []
    for name, variables in banks:
        for index, bank in enumerate(variables):
            steps = [Transpose((0, 2, 1))]
            if len(variables) > 1:
                steps.insert(0, Split(1, parts=len(variables), index=index))
            out.append(Rule(f"{source}.{name}", f"{target}/{bank}",
                            Chain(*steps) if len(steps) > 1 else steps[0]))
    return out


def size(config: dict, key: str, model: str, default=None, *, minimum: int = 1) -> int:
    """`config[key]` as an int >= `minimum`, else InvalidArgumentError naming it."""
    value = config.get(key, default)
    if type(value) is not int or value < minimum:
        raise errors.InvalidArgumentError(
            f"The {model} rule set needs `{key}` (an int >= {minimum}) from the Hugging Face "
            f"config; received {value!r}. Fix: pass the checkpoint's folder (its "
            f"config.json), or config={{'{key}': ..., ...}}.")
    return value


_DENSE_MLP = tuple(f"transformer_layer_{{i}}/feedforward_{name}_dense/kernel"
                   for name in ("gate", "intermediate", "output"))


def decoder_base(config: dict, model: str, *, classes: dict, tasks: dict, lm_head: bool,
                 head_dim: int | None = None) -> list:
    """Llama's decoder rules (`hf_llama.decoder_rules`: embeddings, output embedding, norms,
    attention, heads set aside, every Hub class's prefix) without its dense MLP, which the
    mixture-of-experts layers replace."""
    from objckpt.rules.hf_llama import decoder_rules

    base = decoder_rules(config, model, head_dim=head_dim, lm_head=lm_head, classes=classes,
                         tasks=tasks)
    return [rule for rule in base if rule.target not in _DENSE_MLP]
