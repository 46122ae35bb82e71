"""Rule sets `objckpt.plan` proposes from names and shapes where no rule fits.

A safetensors file with torch names and layouts (`layers.0.weight` as (out, in)) of a small
model: the plan proposes a RuleSet (placeholders for numbered layers, Transpose for torch
Linear weights, Transpose + Reshape for an attention projection), shows it as Python, and the
proposal, applied, restores every variable bit for bit (and exports the same names back). A
restore without rules still fails, changes nothing, and its error points at the proposal.
Nothing is proposed for an unrelated file, nor between equally good candidates.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Rule, Transpose

from flavours import KERAS_FLAVOURS, keras_for
from support import assert_bits, bits, values

safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytest.importorskip("objckpt._formats.safetensors")


def _keras_model(keras):
    inp = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(64, 16, name="embed")(inp)
    x = keras.layers.Dense(32, name="layer_0")(x)
    x = keras.layers.Dense(16, name="layer_1")(x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    return keras.Model(inp, keras.layers.Dense(10, name="head")(x))


def _torch_tensors(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def t(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    return {"embed.weight": t(64, 16), "layers.0.weight": t(32, 16), "layers.0.bias": t(32),
            "layers.1.weight": t(16, 32), "layers.1.bias": t(16), "norm.weight": t(16),
            "norm.bias": t(16), "head.weight": t(10, 16), "head.bias": t(10)}


# torch name -> (Keras variable name, transposed)
_KERAS_NAMES = {
    "embed.weight": ("embed/embeddings", False),
    "layers.0.weight": ("layer_0/kernel", True), "layers.0.bias": ("layer_0/bias", False),
    "layers.1.weight": ("layer_1/kernel", True), "layers.1.bias": ("layer_1/bias", False),
    "norm.weight": ("norm/gamma", False), "norm.bias": ("norm/beta", False),
    "head.weight": ("head/kernel", True), "head.bias": ("head/bias", False)}


def _by_name(model) -> dict:
    return {v.name.removesuffix(":0"): v for v in objckpt.tree(model).values()}


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_torch_named_file_gets_a_proposal_that_restores_exactly(flavour, tmp_path):
    keras = keras_for(flavour)
    model = _keras_model(keras)
    tensors = _torch_tensors()
    path = str(tmp_path / "model.safetensors")
    safetensors_numpy.save_file(tensors, path)

    the_plan = objckpt.plan(model, path)
    assert not the_plan.complete and not the_plan.matches
    if flavour == "keras3":  # numbered layers share one rule
        assert list(the_plan.proposed) == [
            Rule("embed.weight", "embed/embeddings"),
            Rule("head.bias", "head/bias"),
            Rule("head.weight", "head/kernel", Transpose()),
            Rule("layers.{i}.bias", "layer_{i}/bias"),
            Rule("layers.{i}.weight", "layer_{i}/kernel", Transpose()),
            Rule("norm.bias", "norm/beta"),
            Rule("norm.weight", "norm/gamma"),
        ]
    else:  # `layer_{i}/bias` would also name `layer_with_weights-0/bias`: one rule each
        assert sorted(the_plan.proposed, key=lambda rule: rule.source) == [
            Rule(key, name, Transpose() if transposed else None)
            for key, (name, transposed) in sorted(_KERAS_NAMES.items())]
    text = the_plan.describe()
    count = len(the_plan.proposed)
    assert f"proposed rules ({count}; from names and shapes, never applied on their own" in text
    assert "  from objckpt.rules import Rule, RuleSet, Transpose\n  rules = RuleSet([\n" in text
    assert "      Rule('head.weight', 'head/kernel', Transpose(perm=None)),\n" in text

    # Never applied on its own: a restore without rules fails, changes nothing, points at it.
    before = values(model)
    with pytest.raises(errors.StructureMismatchError) as raised:
        objckpt.restore(model, path)
    assert "Fix: objckpt.plan(obj, source).proposed holds a rule set proposed from names " \
           f"and shapes ({count} rules)" in str(raised.value)
    assert_bits(before, values(model))

    report = objckpt.restore(model, path, rules=the_plan.proposed)
    assert len(report.restored) == 9 and not report.missing and not report.unexpected
    weights = _by_name(model)
    for key, (name, transposed) in _KERAS_NAMES.items():
        want = tensors[key].T if transposed else tensors[key]
        assert bits(weights[name].numpy()) == bits(want), key

    # The proposal converts both ways: exported with it, the torch names and bytes come back.
    out = str(tmp_path / "out.safetensors")
    objckpt.export(model, out, rules=the_plan.proposed)
    back = safetensors_numpy.load_file(out)
    assert sorted(back) == sorted(tensors)
    for key, value in tensors.items():
        assert bits(back[key]) == bits(value), key


class _Block(tf.Module):
    def __init__(self, rng, name=None):
        super().__init__(name=name)
        self.kernel = tf.Variable(rng.standard_normal((4, 2, 3)).astype(np.float32))
        self.bias = tf.Variable(rng.standard_normal((6,)).astype(np.float32))


class _Net(tf.Module):
    def __init__(self, seed=1):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.attn_0 = _Block(rng)
        self.attn_1 = _Block(rng)
        self.out = tf.Variable(rng.standard_normal((6, 5)).astype(np.float32))


def test_a_module_gets_transpose_and_reshape_proposed(tmp_path):
    net = _Net()
    rng = np.random.default_rng(7)
    tensors = {f"blocks.{i}.attn.weight": rng.standard_normal((6, 4)).astype(np.float32)
               for i in range(2)}
    tensors.update({f"blocks.{i}.attn.bias": rng.standard_normal((6,)).astype(np.float32)
                    for i in range(2)})
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file(tensors, path)

    the_plan = objckpt.plan(net, path, strict=False)
    # `out` has no counterpart: left as it is, not guessed.
    assert list(the_plan.proposed) == [  # in the source's order
        Rule("blocks.{i}.attn.bias", "attn_{i}/bias"),
        Rule("blocks.{i}.attn.weight", "attn_{i}/kernel",
             Chain(Transpose(), Reshape((4, 6), (4, 2, 3)))),
    ]
    assert "from objckpt.rules import Rule, RuleSet, Chain, Reshape, Transpose" in \
        the_plan.describe()
    out_before = bits(net.out.numpy())
    objckpt.restore(net, path, rules=the_plan.proposed, strict=False)
    for i, block in enumerate((net.attn_0, net.attn_1)):
        want = tensors[f"blocks.{i}.attn.weight"].T.reshape(4, 2, 3)
        assert bits(block.kernel.numpy()) == bits(want)
        assert bits(block.bias.numpy()) == bits(tensors[f"blocks.{i}.attn.bias"])
    assert bits(net.out.numpy()) == out_before


def test_nothing_is_proposed_for_an_unrelated_file(tmp_path):
    net = _Net()
    rng = np.random.default_rng(3)
    tensors = {"encoder.running_stats": rng.standard_normal((7, 3)).astype(np.float32),
               "vocab.table": rng.standard_normal((11,)).astype(np.float32)}
    path = str(tmp_path / "other.safetensors")
    safetensors_numpy.save_file(tensors, path)
    the_plan = objckpt.plan(net, path)
    assert the_plan.proposed is None
    assert "proposed rules" not in the_plan.describe()
    before = values(net)
    with pytest.raises(errors.StructureMismatchError) as raised:
        objckpt.restore(net, path)
    assert ".proposed holds" not in str(raised.value)
    assert_bits(before, values(net))


def test_equal_candidates_are_not_guessed_and_rules_given_propose_nothing(tmp_path):
    net = _Net()
    rng = np.random.default_rng(4)
    # `attn.bias` fits attn_0/bias and attn_1/bias equally: neither is proposed.
    tensors = {"attn.bias": rng.standard_normal((6,)).astype(np.float32),
               "blocks.1.attn.weight": rng.standard_normal((6, 4)).astype(np.float32)}
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file(tensors, path)
    the_plan = objckpt.plan(net, path)
    assert [(r.source, r.target) for r in the_plan.proposed] == [
        ("blocks.1.attn.weight", "attn_1/kernel")]  # one key: a literal rule
    with pytest.warns(UserWarning):  # the rule matches no key
        given = objckpt.plan(net, path, rules=[("^nothing$", "x")])
    assert given.proposed is None


def test_too_many_pairs_of_one_size_propose_nothing(tmp_path, monkeypatch):
    from objckpt._planning import propose

    net = _Net()
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file({"blocks.0.attn.bias": np.zeros(6, np.float32)}, path)
    assert objckpt.plan(net, path).proposed is not None
    monkeypatch.setattr(propose, "_PAIR_LIMIT", 1)  # 1 key x 2 biases of 6 elements
    assert objckpt.plan(net, path).proposed is None
    assert os.path.exists(path)


def test_a_placeholder_rule_that_would_take_an_unpaired_entry_becomes_one_rule_each(tmp_path):
    net = _Net()
    rng = np.random.default_rng(5)
    # blocks.2 has no attn_2 to feed: `blocks.{i}.attn.bias` would rewrite it to a path the
    # obj lacks, so each pair gets its own rule and blocks.2 stays unmatched.
    tensors = {f"blocks.{i}.attn.bias": rng.standard_normal((6,)).astype(np.float32)
               for i in range(3)}
    path = str(tmp_path / "m.safetensors")
    safetensors_numpy.save_file(tensors, path)
    the_plan = objckpt.plan(net, path)
    assert list(the_plan.proposed) == [Rule("blocks.0.attn.bias", "attn_0/bias"),
                                       Rule("blocks.1.attn.bias", "attn_1/bias")]
    report = objckpt.restore(net, path, rules=the_plan.proposed, strict=False)
    assert sorted(report.unexpected) == ["blocks.2.attn.bias"]
    assert bits(net.attn_1.bias.numpy()) == bits(tensors["blocks.1.attn.bias"])


def test_a_llama_folder_without_its_set_gets_what_the_docs_say(tmp_path):
    """docs/huggingface.md: on a Hugging Face Llama folder without its rule set, the proposal
    feeds the embedding, the MLP and the attention projections and
    the final norm as the shipped set does (values compared with a restore through
    `objckpt.rules.huggingface`), and leaves both norms of each layer (input_layernorm: before
    the attention, post_attention_layernorm: after it, which keras-hub calls
    self_attention_layernorm and feedforward_layernorm) and lm_head unpaired:
    `post_attention` is one word, no more the attention's than `input` is, so the evidence
    ties and nothing is guessed."""
    import json

    keras_hub = pytest.importorskip("keras_hub")
    from objckpt.rules import huggingface

    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 4, "tie_word_embeddings": False}

    def backbone(seed):
        model = keras_hub.models.Llama3Backbone(
            vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2,
            hidden_dim=16, intermediate_dim=32, tie_word_embeddings=False)
        rng = np.random.default_rng(seed)
        for variable in model.weights:
            variable.assign(rng.standard_normal(variable.shape).astype(np.float32))
        return model

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    objckpt.export(backbone(0), str(folder), rules=huggingface(str(folder)))
    shipped, proposed_into = backbone(1), backbone(2)
    objckpt.restore(shipped, str(folder), rules=huggingface(str(folder)))
    # With its config.json a keras-hub backbone gets the shipped set without rules: the
    # proposal is for a folder that names no set.
    (folder / "config.json").unlink()

    the_plan = objckpt.plan(proposed_into, str(folder))
    sources = {rule.source for rule in the_plan.proposed}
    assert "model.layers.{i}.self_attn.q_proj.weight" in sources
    assert "model.norm.weight" in sources
    assert not any("layernorm" in s or s == "lm_head.weight" for s in sources)
    report = objckpt.restore(proposed_into, str(folder), rules=the_plan.proposed, strict=False)
    assert len(report.restored) == 16
    want = {v.name.removesuffix(":0"): v for v in objckpt.tree(shipped).values()}
    got = {v.name.removesuffix(":0"): v for v in objckpt.tree(proposed_into).values()}
    fed = objckpt.plan(proposed_into, str(folder), rules=the_plan.proposed, strict=False)
    names = {objckpt.tree(proposed_into)[m.target].name.removesuffix(":0")
             for m in fed.matches}
    assert len(names) == 16
    for name in names:
        assert bits(got[name].numpy()) == bits(want[name].numpy()), name


def test_a_hub_head_is_never_proposed_and_fix_regexes_match_their_keys(tmp_path):
    """A task head of a Hub class (BERT's masked-LM LayerNorm) is never paired with a
    variable of the same shape and words (a pooler's bias), and the example rule of a Fix
    line is Python whose regex matches the key it names (escaped once)."""
    import re

    import tensorflow as tf

    from objckpt import errors

    class Pooler(tf.Module):
        def __init__(self):
            self.pooled_dense = tf.Module()
            self.pooled_dense.bias = tf.Variable(np.zeros(4, np.float32))

    pooler = Pooler()
    path = str(tmp_path / "head.safetensors")
    safetensors_numpy.save_file(
        {"cls.predictions.transform.LayerNorm.bias": np.ones(4, np.float32)}, path)
    assert objckpt.plan(pooler, path).proposed is None
    with pytest.raises(errors.StructureMismatchError) as raised:
        objckpt.restore(pooler, path)
    shown = re.findall(r"rules=\[(\('[^)]*'\))\]", str(raised.value))
    assert shown, str(raised.value)
    import ast

    regex, _ = ast.literal_eval(shown[0])
    assert re.search(regex, "cls.predictions.transform.LayerNorm.bias")


class _Norms(tf.Module):
    """A block's two norms, named as keras-hub's decoders name them."""

    def __init__(self, rng):
        super().__init__()
        for name in ("self_attention_layernorm", "feedforward_layernorm"):
            layer = tf.Module()
            layer.scale = tf.Variable(rng.standard_normal((8,)).astype(np.float32))
            setattr(self, name, layer)


def test_a_word_placed_by_post_or_pre_is_no_evidence_for_the_word_alone(tmp_path):
    """`post_attention_layernorm` (the norm after the attention) shares the word `attention`
    with `self_attention_layernorm` (the norm before it): no evidence, so with
    `input_layernorm` fitting both norms as well, nothing is paired."""
    net = _Norms(np.random.default_rng(0))
    path = str(tmp_path / "norms.safetensors")
    safetensors_numpy.save_file({"input_layernorm.weight": np.ones(8, np.float32),
                                 "post_attention_layernorm.weight": np.ones(8, np.float32)},
                                path)
    assert objckpt.plan(net, path).proposed is None
    # The same names without `post`: the shared word decides, one pair each way.
    safetensors_numpy.save_file({"attention_layernorm.weight": np.ones(8, np.float32)}, path)
    assert [(r.source, r.target) for r in objckpt.plan(net, path).proposed] == [
        ("attention_layernorm.weight", "self_attention_layernorm/scale")]


class _Blocks(tf.Module):
    """Blocks numbered from 1, as keras-hub's ViT names them (`transformer_block_1`)."""

    def __init__(self, rng, count=2):
        super().__init__()
        for i in range(1, count + 1):
            block = tf.Module()
            block.bias = tf.Variable(rng.standard_normal((6,)).astype(np.float32))
            setattr(self, f"block_{i}", block)


def test_numbered_siblings_pair_by_their_place_not_their_number(tmp_path):
    """`layers.0` is the first layer and `block_1` the first block: paired by place, never
    `layers.1` with `block_1` because the numbers are equal."""
    net = _Blocks(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    tensors = {f"layers.{i}.bias": rng.standard_normal((6,)).astype(np.float32)
               for i in range(2)}
    path = str(tmp_path / "blocks.safetensors")
    safetensors_numpy.save_file(tensors, path)
    proposed = objckpt.plan(net, path).proposed
    assert sorted((r.source, r.target) for r in proposed) == [
        ("layers.0.bias", "block_1/bias"), ("layers.1.bias", "block_2/bias")]
    objckpt.restore(net, path, rules=proposed)
    assert bits(net.block_1.bias.numpy()) == bits(tensors["layers.0.bias"])
    assert bits(net.block_2.bias.numpy()) == bits(tensors["layers.1.bias"])
    # Three layers in the file for two blocks: places do not line up, numbers must agree.
    tensors["layers.2.bias"] = rng.standard_normal((6,)).astype(np.float32)
    safetensors_numpy.save_file(tensors, path)
    assert [(r.source, r.target) for r in objckpt.plan(net, path).proposed] == [
        ("layers.1.bias", "block_1/bias"), ("layers.2.bias", "block_2/bias")]


class _Heads(tf.Module):
    def __init__(self, shape):
        super().__init__()
        self.query = tf.Module()
        self.query.kernel = tf.Variable(np.zeros(shape, np.float32))


def test_a_reshape_that_moves_elements_between_axes_is_not_proposed(tmp_path):
    """A (16, 16) entry fits a (4, 16, 4) kernel only by moving elements between axes: not
    proposed from a TF layout; from a torch `Linear` weight (out, in) it is Gemma's
    (heads, in, head_dim) query, out split by head: proposed, and restored as keras-hub's
    importer lays it out."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((16, 16)).astype(np.float32)
    path = str(tmp_path / "q.safetensors")
    safetensors_numpy.save_file({"query.kernel": weight}, path)
    assert objckpt.plan(_Heads((4, 16, 4)), path).proposed is None
    safetensors_numpy.save_file({"query.weight": weight}, path)
    net = _Heads((4, 16, 4))
    proposed = objckpt.plan(net, path).proposed
    assert [(r.source, r.target) for r in proposed] == [("query.weight", "query/kernel")]
    objckpt.restore(net, path, rules=proposed)
    assert bits(net.query.kernel.numpy()) == bits(weight.reshape(4, 4, 16).transpose(0, 2, 1))
    # Split by head the usual way, (in, heads, head_dim): one Transpose and a split axis.
    net = _Heads((16, 4, 4))
    objckpt.restore(net, path, rules=objckpt.plan(net, path).proposed)
    assert bits(net.query.kernel.numpy()) == bits(weight.T.reshape(16, 4, 4))


class _Stack(tf.Module):
    """Two numbered norms and a final one, as a decoder's: `layer_0/norm`, `final_norm`."""

    def __init__(self, rng):
        super().__init__()
        for name in ("layer_0", "layer_1"):
            layer = tf.Module()
            layer.norm = tf.Module()
            layer.norm.gamma = tf.Variable(rng.standard_normal((8,)).astype(np.float32))
            setattr(self, name, layer)
        self.final_norm = tf.Module()
        self.final_norm.gamma = tf.Variable(rng.standard_normal((8,)).astype(np.float32))


def test_one_of_numbered_siblings_is_never_an_unnumbered_names_counterpart(tmp_path):
    """`h.0.ln.weight` is one of two numbered norms: never paired with the one unnumbered
    `final_norm`, however its words agree (a file of a single layer would else get the final
    norm's value); `ln_f.weight`, unnumbered too, is."""
    net = _Stack(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    tensors = {"h.0.ln.weight": rng.standard_normal(8).astype(np.float32),
               "h.1.ln.weight": rng.standard_normal(8).astype(np.float32),
               "ln_f.weight": rng.standard_normal(8).astype(np.float32)}
    path = str(tmp_path / "stack.safetensors")
    safetensors_numpy.save_file(tensors, path)
    assert sorted((r.source, r.target) for r in objckpt.plan(net, path).proposed) == [
        ("h.{i}.ln.weight", "layer_{i}/norm/gamma"), ("ln_f.weight", "final_norm/gamma")]
    del tensors["h.1.ln.weight"], tensors["ln_f.weight"]  # one numbered norm left
    safetensors_numpy.save_file(tensors, path)
    net = _Stack(np.random.default_rng(0))
    net.final_norm.gamma.assign(np.zeros(8, np.float32))
    proposed = objckpt.plan(net, path).proposed
    assert [(r.source, r.target) for r in proposed] == [("h.0.ln.weight", "layer_0/norm/gamma")]


class _Decoder(tf.Module):
    """keras-hub's naming: every layer under `transformer_<...>`."""

    def __init__(self, rng):
        super().__init__()
        for i in range(2):
            layer = tf.Module()
            layer.dense = tf.Module()
            layer.dense.kernel = tf.Variable(rng.standard_normal((4, 6)).astype(np.float32))
            layer.dense.bias = tf.Variable(rng.standard_normal((6,)).astype(np.float32))
            setattr(self, f"transformer_layer_{i}", layer)
        self.transformer_head = tf.Module()
        self.transformer_head.kernel = tf.Variable(rng.standard_normal((4, 6)).astype(np.float32))


def test_a_word_most_names_of_both_sides_have_is_no_evidence(tmp_path):
    """GPT-2's `transformer.` prefix and keras-hub's `transformer_layer_<i>` share the word
    `transformer`, which most names of both sides have: it tells nothing apart, so
    `transformer.extra.weight` is paired with nothing (`transformer_head/kernel` shares no
    other word), while `transformer.head.weight` pairs with it by `head`."""
    net = _Decoder(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    tensors = {f"transformer.h.{i}.dense.{w}": rng.standard_normal(shape).astype(np.float32)
               for i in range(2) for w, shape in (("weight", (6, 4)), ("bias", (6,)))}
    tensors["transformer.extra.weight"] = rng.standard_normal((6, 4)).astype(np.float32)
    path = str(tmp_path / "gpt.safetensors")
    safetensors_numpy.save_file(tensors, path)
    pairs = sorted((r.source, r.target) for r in objckpt.plan(net, path).proposed)
    assert pairs == [("transformer.h.{i}.dense.bias", "transformer_layer_{i}/dense/bias"),
                     ("transformer.h.{i}.dense.weight", "transformer_layer_{i}/dense/kernel")]
    tensors["transformer.head.weight"] = tensors.pop("transformer.extra.weight")
    safetensors_numpy.save_file(tensors, path)
    pairs = sorted((r.source, r.target) for r in objckpt.plan(net, path).proposed)
    assert ("transformer.head.weight", "transformer_head/kernel") in pairs


class _Detector(tf.Module):
    """keras-hub's SAM 3 naming: most layers under `sam3_<part>`, norms numbered `norm_<i>`."""

    def __init__(self, rng):
        super().__init__()
        self.sam3_pixel_decoder = tf.Module()
        for i in range(2):
            norm = tf.Module()
            norm.gamma = tf.Variable(rng.standard_normal(8).astype(np.float32))
            norm.beta = tf.Variable(rng.standard_normal(8).astype(np.float32))
            setattr(self.sam3_pixel_decoder, f"norm_{i}", norm)
        self.sam3_mask_head = tf.Module()
        self.sam3_mask_head.kernel = tf.Variable(rng.standard_normal((8, 8)).astype(np.float32))
        self.sam3_text_encoder = tf.Module()  # no entry feeds these (no shape fits)
        self.sam3_text_encoder.tables = [tf.Variable(np.zeros((5, 7), np.float32))
                                         for _ in range(4)]


def test_a_plural_norms_is_a_norm_and_a_model_names_number_is_no_evidence(tmp_path):
    """`pixel_decoder.norms.{i}` (a torch ModuleList of norms) pairs with keras-hub's
    `sam3_pixel_decoder/norm_{i}`: `norms` is the word `norm`, and the `3` glued to `sam3`,
    which most names of the side start with, is no number of theirs; a tracker's numbered
    layer norm that shares the words `mask` and `norm` is paired with nothing."""
    net = _Detector(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    tensors = {f"pixel_decoder.norms.{i}.{w}": rng.standard_normal(8).astype(np.float32)
               for i in range(2) for w in ("weight", "bias")}
    tensors["mask_head.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
    tensors.update({f"tracker.mask_downsampler.layers.{i}.layer_norm.weight":
                    rng.standard_normal(8).astype(np.float32) for i in range(2)})
    path = str(tmp_path / "sam3.safetensors")
    safetensors_numpy.save_file(tensors, path)
    pairs = sorted((r.source, r.target) for r in objckpt.plan(net, path).proposed)
    assert pairs == [("mask_head.weight", "sam3_mask_head/kernel")] + [
        (f"pixel_decoder.norms.{i}.{w}", f"sam3_pixel_decoder/norm_{i}/{k}")
        for i in range(2) for w, k in (("bias", "beta"), ("weight", "gamma"))]
