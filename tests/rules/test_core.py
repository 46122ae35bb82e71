"""Split/fuse and tied weights as rules: layout transforms in the two-way rules.

Several `objckpt.rules.Rule`s with the same source pattern feed one source tensor to several
variables: each with a `Split(axis, parts=..., index=k)` takes its part (GPT-2's fused
`c_attn` (h, 3h) -> query, key, value kernels), and without one the weights are tied (one
embedding -> the embedding table and the output kernel, transposed). `objckpt.export` goes
back: the parts are concatenated in index order, tied variables written once after a check
that they agree. The oracle is the `safetensors` library: the file a restore reads is its
writer's, and an export of the restored model is byte-for-byte that file.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Reshape, Rule, RuleSet, Split, Transpose

import flavours
from flavours import keras_for

safetensors_numpy = pytest.importorskip("safetensors.numpy")

READS_SAFETENSORS = importlib.util.find_spec("objckpt._formats.safetensors") is not None

H, VOCAB, HEADS = 4, 6, 2

GPT2_LIKE = RuleSet([
    *(Rule("h.attn.c_attn.weight", f"{name}/kernel", Split(-1, parts=3, index=i))
      for i, name in enumerate(("query", "key", "value"))),
    *(Rule("h.attn.c_attn.bias", f"{name}/bias", Split(0, parts=3, index=i))
      for i, name in enumerate(("query", "key", "value"))),
    Rule("wte.weight", "emb/embeddings"),
    Rule("wte.weight", "lm_head/kernel", Transpose()),
])


def _arrays(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"h.attn.c_attn.weight": rng.standard_normal((H, 3 * H)).astype(np.float32),
            "h.attn.c_attn.bias": rng.standard_normal((3 * H,)).astype(np.float32),
            "wte.weight": rng.standard_normal((VOCAB, H)).astype(np.float32)}


class _Linear(tf.Module):
    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.kernel = tf.Variable(tf.zeros((n_in, n_out)), name="kernel")
        if bias:
            self.bias = tf.Variable(tf.zeros((n_out,)), name="bias")


class _Embedding(tf.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = tf.Variable(tf.zeros((VOCAB, H)), name="embeddings")


class _Net(tf.Module):
    def __init__(self):
        super().__init__()
        self.emb = _Embedding()
        self.query, self.key, self.value = (_Linear(H, H) for _ in range(3))
        self.lm_head = _Linear(H, VOCAB, bias=False)


def _model(flavour: str):
    """Tokens -> embedding -> query + key + value -> logits (a tied output kernel)."""
    if flavour == "module":
        return _Net()
    keras = keras_for(flavour)
    tokens = keras.Input((3,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, H, name="emb")(tokens)
    x = keras.layers.Add()([keras.layers.Dense(H, name=n)(x) for n in ("query", "key", "value")])
    return keras.Model(tokens, keras.layers.Dense(VOCAB, use_bias=False, name="lm_head")(x))


def _variables(obj, flavour: str) -> dict:
    """{"query/kernel": array, ...} of the model above."""
    if flavour == "module":
        return {path: v.numpy() for path, v in objckpt.tree(obj).items()}
    return {f"{layer.name}/{w.name.split('/')[-1].split(':')[0]}": w.numpy()
            for layer in obj.layers for w in layer.weights}


def _write(arrays: dict, path) -> str:
    safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    return str(path)


def _source(arrays: dict, path):
    """The safetensors file where objckpt reads it, else the same tensors as a Snapshot."""
    written = _write(arrays, path)
    if READS_SAFETENSORS:
        return written
    return objckpt.Snapshot({k: tf.constant(v) for k, v in arrays.items()})


# --- restore: one tensor, several variables ------------------------------------------------

@pytest.mark.parametrize("flavour", flavours.FLAVOURS)
def test_fused_qkv_and_a_tied_embedding_restore_exactly(flavour, tmp_path):
    model, arrays = _model(flavour), _arrays()
    source = _source(arrays, tmp_path / "gpt2.safetensors")
    the_plan = objckpt.plan(model, source, rules=GPT2_LIKE)
    assert not the_plan.unmatched_source and not the_plan.unmatched_variables
    # Every target listed with its source: three from the fused weight, two from wte.
    by_source = {}
    for match in the_plan.matches:
        by_source.setdefault(match.source, []).append(match.rule)
    assert sorted(len(v) for v in by_source.values()) == [2, 3, 3]
    assert [("index=" in r) for r in by_source["h.attn.c_attn.weight"]] == [True] * 3
    shown = the_plan.describe()
    assert ("3 source entries feed several variables each, by rules that share a source "
            "pattern (a Split's parts, or tied weights): ") in shown
    for fed in (r"`h\.attn\.c_attn\.weight` -> [^;]*query/kernel[^;]*key/kernel[^;]*"
                r"value/kernel",
                r"`h\.attn\.c_attn\.bias` -> [^;]*query/bias[^;]*key/bias[^;]*value/bias",
                r"`wte\.weight` -> [^;]*emb/embeddings[^;]*lm_head/kernel"):
        assert re.search(fed, shown), (fed, shown)
    report = objckpt.restore(model, source, rules=GPT2_LIKE)
    assert len(report.restored) == 8
    got = _variables(model, flavour)
    weight, bias, wte = (arrays[k] for k in ("h.attn.c_attn.weight", "h.attn.c_attn.bias",
                                             "wte.weight"))
    for i, name in enumerate(("query", "key", "value")):
        np.testing.assert_array_equal(got[f"{name}/kernel"], weight[:, i * H:(i + 1) * H])
        np.testing.assert_array_equal(got[f"{name}/bias"], bias[i * H:(i + 1) * H])
    np.testing.assert_array_equal(got["emb/embeddings"], wte)
    np.testing.assert_array_equal(got["lm_head/kernel"], wte.T)


@pytest.mark.parametrize("flavour", flavours.FLAVOURS)
def test_export_fuses_the_parts_and_writes_tied_weights_once(flavour, tmp_path):
    model, arrays = _model(flavour), _arrays(1)
    original = _write(arrays, tmp_path / "original.safetensors")
    objckpt.restore(model, _source(arrays, tmp_path / "source.safetensors"), rules=GPT2_LIKE)
    path = objckpt.export(model, tmp_path / "out" / "model.safetensors", rules=GPT2_LIKE)
    written = safetensors_numpy.load_file(path)
    assert set(written) == set(arrays)
    with open(path, "rb") as a, open(original, "rb") as b:
        assert a.read() == b.read()  # the reference writer's bytes for the same tensors


def test_split_with_sizes_and_a_chain_round_trips(tmp_path):
    """Unequal parts (a grouped-query fused projection) and a Split followed by a Transpose
    and a Reshape, both ways."""
    rng = np.random.default_rng(2)
    fused = rng.standard_normal((8, H)).astype(np.float32)  # torch (out, in): q 4, k 2, v 2
    net = tf.Module()
    net.q = tf.Variable(tf.zeros((H, HEADS, 2)))
    net.k = tf.Variable(tf.zeros((H, 2)))
    net.v = tf.Variable(tf.zeros((H, 2)))
    rules = RuleSet([
        Rule("qkv.weight", "q", Chain(Split(0, sizes=(4, 2, 2), index=0), Transpose(),
                                      Reshape((H, 4), (H, HEADS, 2)))),
        Rule("qkv.weight", "k", Chain(Split(0, sizes=(4, 2, 2), index=1), Transpose())),
        Rule("qkv.weight", "v", Chain(Split(0, sizes=(4, 2, 2), index=2), Transpose())),
    ])
    objckpt.restore(net, objckpt.Snapshot({"qkv.weight": tf.constant(fused)}), rules=rules)
    np.testing.assert_array_equal(net.q.numpy(), fused[:4].T.reshape(H, HEADS, 2))
    np.testing.assert_array_equal(net.k.numpy(), fused[4:6].T)
    np.testing.assert_array_equal(net.v.numpy(), fused[6:].T)
    path = objckpt.export(net, tmp_path / "m.safetensors", rules=rules)
    back = safetensors_numpy.load_file(path)["qkv.weight"]
    assert back.tobytes() == fused.tobytes() and back.shape == fused.shape


# --- the Split transform ---------------------------------------------------------------------

def test_split_takes_its_part_of_numpy_and_tf_values():
    value = np.arange(24, dtype=np.float32).reshape(2, 12)
    for index in range(3):
        split = Split(-1, parts=3, index=index)
        want = value[:, 4 * index:4 * index + 4]
        np.testing.assert_array_equal(split(value), want)
        np.testing.assert_array_equal(split(tf.constant(value)).numpy(), want)
        assert split.output_shape((2, 12)) == (2, 4)
    uneven = Split(1, sizes=(6, 3, 3), index=1)
    np.testing.assert_array_equal(uneven(value), value[:, 6:9])
    assert uneven.output_shape((2, 12)) == (2, 3) and uneven.count == 3
    assert Split(0, parts=2, index=1)(value).flags.c_contiguous
    assert Split(0, parts=2).same_cut(Split(0, parts=2, index=1))
    assert not Split(0, parts=2).same_cut(Split(1, parts=2))


@pytest.mark.parametrize("make, match", [
    (lambda: Split(0), "exactly one of parts"),
    (lambda: Split(0, parts=3, sizes=(1, 2)), "exactly one of parts"),
    (lambda: Split(0, parts=0), "parts must be an int >= 1"),
    (lambda: Split(0, sizes=()), "sizes must be a non-empty tuple"),
    (lambda: Split(0, parts=3, index=3), r"index must be an int in 0\.\.2"),
    (lambda: Split("0", parts=3), "axis must be an int"),
    (lambda: Split(0, parts=5).output_shape((12,)), "not a multiple of 5"),
    (lambda: Split(0, sizes=(4, 4)).output_shape((12,)), r"\(8 in all\).*has 12"),
    (lambda: Split(2, parts=2).output_shape((4, 4)), "rank 2"),
    (lambda: Split(0, parts=2).inverse(), "no inverse on its own"),
])
def test_bad_splits_are_refused(make, match):
    with pytest.raises(errors.InvalidArgumentError, match=match) as info:
        make()
    assert "Fix:" in str(info.value)


# --- restore errors: all or nothing ------------------------------------------------------------

def test_a_part_no_variable_takes_is_refused_and_changes_nothing():
    net = _Net()
    rules = RuleSet([*GPT2_LIKE, Rule("h.attn.c_attn.weight", "gate/kernel",
                                      Split(-1, parts=3, index=0))])
    source = objckpt.Snapshot({k: tf.constant(v) for k, v in _arrays().items()})
    the_plan = objckpt.plan(net, source, rules=rules)
    assert the_plan.unmatched_source == ("h.attn.c_attn.weight",)
    assert "its part for `gate/kernel` (rule 8 (Rule('h.attn.c_attn.weight', 'gate/kernel'," \
        " Split(axis=-1, parts=3, sizes=None, index=0)))) matches no variable" in \
        the_plan.describe()
    before = {p: v.numpy().tobytes() for p, v in objckpt.tree(net).items()}
    with pytest.raises(errors.StructureMismatchError, match=r"h\.attn\.c_attn\.weight"):
        objckpt.restore(net, source, rules=rules)
    assert {p: v.numpy().tobytes() for p, v in objckpt.tree(net).items()} == before


def test_a_split_that_does_not_fit_the_tensor_is_a_typed_error():
    net = _Net()
    arrays = _arrays()
    arrays["h.attn.c_attn.weight"] = np.ones((H, 3 * H + 1), np.float32)
    source = objckpt.Snapshot({k: tf.constant(v) for k, v in arrays.items()})
    before = {p: v.numpy().tobytes() for p, v in objckpt.tree(net).items()}
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(net, source, rules=GPT2_LIKE)
    text = str(info.value)
    assert "`query/kernel`" in text and "`value/kernel`" in text
    assert "axis of shape (4, 13) has 13, not a multiple of 3" in text and "Fix:" in text
    assert {p: v.numpy().tobytes() for p, v in objckpt.tree(net).items()} == before


def test_regex_rules_and_rules_of_other_sources_do_not_fan_out():
    """Only objckpt.rules.Rules with one source pattern fan out: two regex rules of one
    pattern, or Rules whose patterns differ, keep first-match-wins."""
    net = tf.Module()
    net.a = tf.Variable(tf.zeros((2,)))
    net.b = tf.Variable(tf.zeros((2,)))
    source = objckpt.Snapshot({"x": tf.constant([1.0, 2.0])})
    with pytest.warns(UserWarning, match="shadowed"):
        the_plan = objckpt.plan(net, source, rules=[("^x$", "a"), ("^x$", "b")])
    assert [(m.target, m.source) for m in the_plan.matches] == [("a", "x")]
    with pytest.warns(UserWarning, match="shadowed"):
        the_plan = objckpt.plan(net, source, rules=RuleSet([Rule("x", "a"),
                                                             Rule("{n}", "b_{n}")]))
    assert [(m.target, m.source) for m in the_plan.matches] == [("a", "x")]
    the_plan = objckpt.plan(net, source, rules=RuleSet([Rule("x", "a"), Rule("x", "b")]))
    assert [(m.target, m.source) for m in the_plan.matches] == [("a", "x"), ("b", "x")]


# --- export errors: typed, nothing written -------------------------------------------------------

def _restored_net() -> _Net:
    net = _Net()
    objckpt.restore(net, objckpt.Snapshot({k: tf.constant(v) for k, v in _arrays().items()}),
                    rules=GPT2_LIKE)
    return net


@pytest.mark.parametrize("rules, match", [
    (RuleSet([r for r in GPT2_LIKE if "value" not in r.target]),
     r"no variable gives part\(s\) \[2\] of 3"),
    (RuleSet([*GPT2_LIKE[:2], Rule("h.attn.c_attn.weight", "value/kernel",
                                   Split(-1, parts=3, index=1)), *GPT2_LIKE[3:]]),
     r"no variable gives part\(s\) \[2\].*part 1 comes from 2 variables"),
    (RuleSet([*GPT2_LIKE[:2], Rule("h.attn.c_attn.weight", "value/kernel"),
              *GPT2_LIKE[3:]]), "do not cut it the same way"),
    (RuleSet([*GPT2_LIKE[:2], Rule("h.attn.c_attn.weight", "value/kernel",
                                   Split(0, parts=3, index=2)), *GPT2_LIKE[3:]]),
     "do not cut it the same way"),
])
def test_export_refuses_missing_extra_or_mixed_parts(rules, match, tmp_path):
    net = _restored_net()
    with pytest.raises(errors.InvalidArgumentError, match=match) as info:
        objckpt.export(net, tmp_path / "out" / "m.safetensors", rules=rules, strict=False)
    assert "Fix:" in str(info.value) and "h.attn.c_attn.weight" in str(info.value)
    assert not os.path.exists(tmp_path / "out" / "m.safetensors")


def test_export_refuses_tied_weights_that_differ(tmp_path):
    net = _restored_net()
    net.lm_head.kernel.assign_add(tf.eye(H, VOCAB))  # 4 values no longer the embedding's
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.export(net, tmp_path / "m.safetensors", rules=GPT2_LIKE)
    text = str(info.value)
    assert "`emb/embeddings`" in text and "`lm_head/kernel`" in text and "tied" in text
    assert f"4 of {H * VOCAB} value(s) differ" in text and "Fix:" in text
    assert not os.path.exists(tmp_path / "m.safetensors")


@pytest.mark.parametrize("flavour", flavours.KERAS_FLAVOURS)
def test_restore_on_create_and_migrate_fan_out_too(flavour, tmp_path):
    keras = keras_for(flavour)
    arrays = _arrays(3)
    source = objckpt.Snapshot({k: tf.constant(v) for k, v in arrays.items()})

    class Lazy(keras.Model):  # variables created at its first call
        def __init__(self):
            super().__init__()
            self.emb = keras.layers.Embedding(VOCAB, H, name="emb")
            self.query, self.key, self.value = (keras.layers.Dense(H, name=n)
                                                for n in ("query", "key", "value"))
            self.lm_head = keras.layers.Dense(VOCAB, use_bias=False, name="lm_head")

        def call(self, tokens):
            x = self.emb(tokens)
            return self.lm_head(self.query(x) + self.key(x) + self.value(x))

    model = Lazy()
    pending = objckpt.restore_on_create(model, source, rules=GPT2_LIKE)
    model(np.zeros((1, 3), "int32"))
    pending.assert_done()
    weight = arrays["h.attn.c_attn.weight"]
    np.testing.assert_array_equal(model.value.kernel.numpy(), weight[:, 2 * H:])
    np.testing.assert_array_equal(model.key.bias.numpy(), arrays["h.attn.c_attn.bias"][H:2 * H])
    np.testing.assert_array_equal(model.lm_head.kernel.numpy(), arrays["wte.weight"].T)
    # migrate writes each variable its part; a plain restore of that checkpoint is exact.
    fresh = _model(flavour)
    prefix = objckpt.migrate(fresh, source, str(tmp_path / "ckpt"), rules=GPT2_LIKE)
    objckpt.restore(fresh, prefix)
    got = _variables(fresh, flavour)
    np.testing.assert_array_equal(got["query/kernel"], weight[:, :H])
    np.testing.assert_array_equal(got["lm_head/kernel"], arrays["wte.weight"].T)
    np.testing.assert_array_equal(got["emb/embeddings"], arrays["wte.weight"])


def test_a_rule_set_of_alternatives_never_reports_the_spellings_a_file_lacks(recwarn):
    from objckpt._planning import rules as _planning_rules

    rules = [objckpt.rules.Rule("bert.{n}.weight", "{n}/kernel"),
             objckpt.rules.Rule("{n}.weight", "{n}/kernel")]
    view = {"dense.weight": "dense.weight"}
    loud = _planning_rules.rewrite_view(view, _planning_rules.parse_rules(
        objckpt.rules.RuleSet(rules)))
    quiet = _planning_rules.rewrite_view(view, _planning_rules.parse_rules(
        objckpt.rules.RuleSet(rules, alternatives=True)))
    assert [e[2] for e in loud.entries] == [e[2] for e in quiet.entries] == ["dense/kernel"]
    assert len(loud.unused) == 1 and "bert.{n}.weight" in loud.unused[0]
    assert quiet.unused == []
