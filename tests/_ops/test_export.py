"""objckpt.export to safetensors and the invertible rules of objckpt.rules.

The oracle is the `safetensors` library (a test dependency only; objckpt's writer is its
own): every file export writes is read back by `safetensors.numpy.load_file` /
`safe_open`, names, shapes, dtypes and bytes compared with the live variables, and the
bytes of a file compared with the reference writer's for the same tensors. Round trips go
Keras -> safetensors (torch-like names and layouts through a RuleSet of Transpose, Reshape
and ConvKernel) -> a fresh Keras model, bit for bit, in every flavour; the library's arrays
come back through `objckpt.restore` from a Snapshot, and from the file itself where objckpt
reads safetensors.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Rule, RuleSet, Transpose

import flavours
from flavours import CASES, case_id, keras_for
from support import assert_bits, bits

safetensors_numpy = pytest.importorskip("safetensors.numpy")
safetensors = pytest.importorskip("safetensors")

# objckpt reads safetensors once the format is registered (`_formats/safetensors.py`).
READS_SAFETENSORS = importlib.util.find_spec("objckpt._formats.safetensors") is not None


def _load_dir(index_or_file: str) -> dict:
    """Every tensor of an export (one file, or the shards an index lists), by the library."""
    if index_or_file.endswith(".index.json"):
        with open(index_or_file, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        folder = os.path.dirname(index_or_file)
        out = {}
        for name in sorted(set(weight_map.values())):
            out.update(safetensors_numpy.load_file(os.path.join(folder, name)))
        return out
    return safetensors_numpy.load_file(index_or_file)


def _as_source(arrays: dict) -> objckpt.Snapshot:
    return objckpt.Snapshot({name: tf.constant(value) for name, value in arrays.items()})


def _network_values(obj) -> dict:
    """{path: array} of the obj's non-optimizer variables (Keras: `weights`; a module's
    checkpoint: its model's variables), keyed by id for matching."""
    variables = obj.model.variables if isinstance(obj, tf.train.Checkpoint) else obj.weights
    return {id(v): np.array(v.numpy()) for v in variables}


# --- export of every flavour, read by the library ----------------------------------------

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_export_of_every_flavour_is_read_by_the_library(case, tmp_path):
    obj = flavours.build(*case)
    path = objckpt.export(obj, tmp_path / "model.safetensors")
    assert path == str(tmp_path / "model.safetensors")
    arrays = safetensors_numpy.load_file(path)
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "pt"}
    # One tensor per network variable (a shared layer once), no optimizer state.
    expected = _network_values(obj)
    assert len(arrays) == len(expected)
    assert not any("optimizer" in name.split("/") or "OPTIMIZER_SLOT" in name for name in arrays)
    live = objckpt.tree(obj)
    by_bits = sorted(bits(a) for a in expected.values())
    assert sorted(bits(a) for a in arrays.values()) == by_bits
    # Names are object paths: each equals (or is the path through the layers of) a variable.
    fresh = flavours.build(*case, train=False)
    before = {p: np.array(v.numpy()) for p, v in objckpt.tree(fresh).items()}
    report = objckpt.restore(fresh, _as_source(arrays), optimizer_state=False)
    assert len(report.restored) == len(arrays)
    after = {p: np.array(v.numpy()) for p, v in objckpt.tree(fresh).items()}
    changed = [p for p in before if bits(before[p]) != bits(after[p])]
    assert changed, "the restore changed nothing"
    network = _network_values(fresh)
    trained = {bits(a) for a in expected.values()}
    assert all(bits(a) in trained for a in network.values())
    assert len(live) > len(arrays)  # the optimizer's state was left out


@pytest.mark.skipif(not READS_SAFETENSORS, reason="objckpt's safetensors reader has not landed")
@pytest.mark.parametrize("flavour", ["keras3", "tf_keras", "keras2", "module"])
def test_objckpt_restores_what_export_writes(flavour, tmp_path):
    obj = flavours.build(flavour)
    path = objckpt.export(obj, tmp_path / "model.safetensors")
    fresh = flavours.build(flavour, train=False)
    objckpt.restore(fresh, path, optimizer_state=False)
    trained = sorted(bits(a) for a in _network_values(obj).values())
    assert sorted(bits(a) for a in _network_values(fresh).values()) == trained
    sharded = objckpt.export(obj, tmp_path / "shards", max_shard_size=48)
    assert sharded.endswith("model.safetensors.index.json")
    again = flavours.build(flavour, train=False)
    objckpt.restore(again, os.path.dirname(sharded), optimizer_state=False)
    assert sorted(bits(a) for a in _network_values(again).values()) == trained


def test_optimizer_state_is_written_only_when_asked(tmp_path):
    obj = flavours.build("module")
    plain = safetensors_numpy.load_file(objckpt.export(obj, tmp_path / "a.safetensors"))
    full = safetensors_numpy.load_file(
        objckpt.export(obj, tmp_path / "b.safetensors", optimizer_state=True))
    assert len(full) == len(objckpt.tree(obj)) == len(plain) + 14  # 12 slots + 2 powers
    assert "model/encoder/w/.OPTIMIZER_SLOT/optimizer/m" in full
    assert set(plain) < set(full)
    plain_false = safetensors_numpy.load_file(
        objckpt.export(obj, tmp_path / "c.safetensors", optimizer_state=False))
    assert set(plain_false) == set(plain)


# --- the file's bytes ---------------------------------------------------------------------

def _dtype_module():
    """A tf.Module holding one variable of each dtype safetensors and TF share."""
    import ml_dtypes

    module = tf.Module()
    rng = np.random.default_rng(0)
    for name in ("bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32",
                 "uint32", "float32", "float64", "int64", "uint64"):
        values = rng.integers(0, 100, size=(3, 2)) if name != "bool" else rng.random((3, 2)) > .5
        value = tf.cast(tf.constant(values), tf.dtypes.as_dtype(name))
        setattr(module, f"v_{name}", tf.Variable(value))
    for name in ("float8_e4m3fn", "float8_e5m2"):  # TF >= 2.13 has them
        dtype = getattr(ml_dtypes, name)
        try:
            variable = tf.Variable(np.arange(5, dtype=np.float32).astype(dtype))
            variable.read_value()
        except (TypeError, ValueError, tf.errors.OpError):
            continue
        setattr(module, f"v_{name}", variable)
    module.odd = tf.Variable(tf.ones((3,), tf.uint8))  # unaligned before wider ones
    module.scalar = tf.Variable(2.5, dtype=tf.float64)
    module.empty = tf.Variable(tf.zeros((0, 4), tf.float32))
    return module


def test_bytes_equal_the_reference_writer_for_every_dtype(tmp_path):
    module = _dtype_module()
    path = objckpt.export(module, tmp_path / "all.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    live = {p: np.asarray(v.numpy()) for p, v in objckpt.tree(module).items()}
    assert data == safetensors_numpy.save(live, metadata={"format": "pt"})
    with safetensors.safe_open(path, framework="np") as f:  # NumPy has no float8 dtypes
        loaded = {n: f.get_tensor(n) for n in sorted(f.keys()) if "float8" not in n}
    assert_bits({n: live[n] for n in loaded}, loaded, "dtypes")
    assert len(loaded) >= 16
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    assert length % 8 == 0 and data[8:8 + length].decode().endswith(("}", " "))
    assert next(iter(header)) == "__metadata__"
    for name, entry in header.items():
        if name != "__metadata__":
            start, end = entry["data_offsets"]
            assert start % live[name].dtype.itemsize == 0, name  # aligned to its item size
            assert end - start == live[name].nbytes


def test_metadata_is_added_and_may_replace_format(tmp_path):
    obj = flavours.build("module", train=False)
    path = objckpt.export(obj, tmp_path / "m.safetensors", metadata={"step": "7"})
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "pt", "step": "7"}
    path = objckpt.export(obj, tmp_path / "m.safetensors", metadata={"format": "tf"})
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "tf"}


# --- shards as Hugging Face lays them out ---------------------------------------------------

def test_sharded_export_is_hugging_face_layout(tmp_path):
    keras = keras_for(flavours.session_flavour())
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="a"),
                              keras.layers.Dense(32, name="b"), keras.layers.Dense(4, name="c")])
    live = {v.path if hasattr(v, "path") else v.name: v.numpy() for v in model.weights}
    folder = tmp_path / "hf"
    index_path = objckpt.export(model, folder, max_shard_size="4KB")
    assert index_path == str(folder / "model.safetensors.index.json")
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    count = len(files)
    assert count >= 2
    assert files == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert sorted(os.listdir(folder)) == sorted([*files, "model.safetensors.index.json"])
    arrays = _load_dir(index_path)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in arrays.values())
    assert set(index["weight_map"]) == set(arrays)
    for name in files:  # each shard holds what the index says, within the size
        held = safetensors_numpy.load_file(folder / name)
        assert {n for n, f in index["weight_map"].items() if f == name} == set(held)
        assert sum(a.nbytes for a in held.values()) <= 4000 or len(held) == 1
    # Hugging Face's split: names in order, a new shard when the next would pass the limit.
    ordered = sorted(arrays)
    shard_of = [files.index(index["weight_map"][n]) for n in ordered]
    assert shard_of == sorted(shard_of)
    assert sorted(bits(a) for a in arrays.values()) == sorted(bits(a) for a in live.values())
    # Everything within the size: one file and no index, as Hugging Face writes; the stale
    # shards and index of the sharded export are gone (loaders would prefer them).
    single = objckpt.export(model, folder, max_shard_size=10**9)
    assert single == str(folder / "model.safetensors")
    assert os.listdir(folder) == ["model.safetensors"]
    # Sharded again: the single file goes (a loader would take it over the index).
    objckpt.export(model, folder, max_shard_size=4000)
    assert "model.safetensors" not in os.listdir(folder)
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # no temporary left


def test_a_tensor_larger_than_the_shard_size_gets_its_own_shard(tmp_path):
    module = tf.Module()
    module.a = tf.Variable(tf.ones((4,)))
    module.big = tf.Variable(tf.ones((100,)))
    module.c = tf.Variable(tf.ones((4,)))
    index_path = objckpt.export(module, tmp_path / "w.safetensors", max_shard_size=64)
    assert os.path.basename(index_path) == "w.safetensors.index.json"
    with open(index_path, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    assert weight_map == {"a": "w-00001-of-00003.safetensors",
                          "big": "w-00002-of-00003.safetensors",
                          "c": "w-00003-of-00003.safetensors"}


# --- rule sets: torch-like names and layouts, both ways ------------------------------------

H, HEADS, HEAD_DIM = 8, 2, 4


def _torch_like(keras):
    """Conv2D + BatchNorm + an attention-like projection (EinsumDense (h, heads, head_dim))
    + a Dense head, named as a Hugging Face model would name their layers."""
    images = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(H, 3, name="stem")(images)
    x = keras.layers.BatchNormalization(name="stem_norm")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.EinsumDense("ab,bcd->acd", output_shape=(HEADS, HEAD_DIM), bias_axes="cd",
                                 name="query")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(3, name="classifier")(x)
    model = keras.Model(images, x)
    for seed, variable in enumerate(model.weights):  # not the initializers' zeros and ones
        variable.assign(np.random.default_rng(seed).normal(size=variable.shape).astype("float32"))
    return model


TORCH_RULES = RuleSet([
    Rule("embeddings.conv.weight", "stem/kernel", ConvKernel("OIHW", "HWIO")),
    Rule("embeddings.conv.bias", "stem/bias"),
    Rule("embeddings.norm.weight", "stem_norm/gamma"),
    Rule("embeddings.norm.bias", "stem_norm/beta"),
    Rule("embeddings.norm.running_{stat}", "stem_norm/moving_{stat}"),
    Rule("attention.query.weight", "query/kernel",
         Chain(Transpose(), Reshape((H, H), (H, HEADS, HEAD_DIM)))),
    Rule("attention.query.bias", "query/bias", Reshape((H,), (HEADS, -1))),
    Rule("classifier.{p}", "classifier/{p}", None),
])
# the classifier's kernel needs a transpose: a more specific rule first
TORCH_RULES = RuleSet([Rule("classifier.weight", "classifier/kernel", Transpose()),
                       *TORCH_RULES])


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras", "keras2"])
def test_rule_set_round_trip_keras_torch_layout_keras_is_exact(flavour, tmp_path):
    keras = keras_for(flavour)
    model = _torch_like(keras)
    path = objckpt.export(model, tmp_path / "model.safetensors", rules=TORCH_RULES)
    arrays = safetensors_numpy.load_file(path)
    assert set(arrays) == {"embeddings.conv.weight", "embeddings.conv.bias",
                           "embeddings.norm.weight", "embeddings.norm.bias",
                           "embeddings.norm.running_mean", "embeddings.norm.running_variance",
                           "attention.query.weight", "attention.query.bias",
                           "classifier.weight", "classifier.bias"}
    stem, query, head = (model.get_layer(name).kernel.numpy()
                         for name in ("stem", "query", "classifier"))
    np.testing.assert_array_equal(arrays["embeddings.conv.weight"], stem.transpose(3, 2, 0, 1))
    assert arrays["embeddings.conv.weight"].shape == (H, 3, 3, 3)
    np.testing.assert_array_equal(arrays["attention.query.weight"], query.reshape(H, H).T)
    assert arrays["attention.query.bias"].shape == (H,)
    np.testing.assert_array_equal(arrays["classifier.weight"], head.T)
    # ... and back into a fresh model, bit for bit; its outputs equal the original's.
    fresh = _torch_like(keras)
    report = objckpt.restore(fresh, _as_source(arrays), rules=TORCH_RULES)
    assert len(report.restored) == len(arrays) == len(model.weights)
    assert_bits({i: v.numpy() for i, v in enumerate(model.weights)},
                {i: v.numpy() for i, v in enumerate(fresh.weights)}, "round trip")
    images = np.random.default_rng(1).normal(size=(2, 6, 6, 3)).astype("float32")
    np.testing.assert_array_equal(model(images).numpy(), fresh(images).numpy())
    if READS_SAFETENSORS:  # the file itself as the source
        again = _torch_like(keras)
        objckpt.restore(again, path, rules=TORCH_RULES)
        assert_bits({i: v.numpy() for i, v in enumerate(model.weights)},
                    {i: v.numpy() for i, v in enumerate(again.weights)}, "from the file")


def test_rule_set_plans_and_migrates_and_names_its_rules(tmp_path):
    keras = keras_for(flavours.session_flavour())
    model = _torch_like(keras)
    arrays = safetensors_numpy.load_file(
        objckpt.export(model, tmp_path / "m.safetensors", rules=TORCH_RULES))
    fresh = _torch_like(keras)
    the_plan = objckpt.plan(fresh, _as_source(arrays), rules=TORCH_RULES)
    assert len(the_plan.matches) == len(arrays)
    assert not the_plan.unmatched_source and not the_plan.unmatched_variables
    assert {m.source for m in the_plan.matches} == set(arrays)
    assert "Rule('classifier.weight', 'classifier/kernel', Transpose(perm=None))" in \
        the_plan.describe()
    prefix = objckpt.migrate(fresh, _as_source(arrays), str(tmp_path / "ckpt"),
                             rules=TORCH_RULES)
    objckpt.restore(fresh, prefix)
    assert_bits({i: v.numpy() for i, v in enumerate(model.weights)},
                {i: v.numpy() for i, v in enumerate(fresh.weights)}, "migrated")
    # A rule that matches nothing is reported as the user wrote it.
    extra = RuleSet([*TORCH_RULES, Rule("pooler.{p}", "pooler/{p}")])
    with pytest.warns(UserWarning, match=r"Rule\('pooler\.\{p\}', 'pooler/\{p\}'\)"):
        objckpt.restore(fresh, _as_source(arrays), rules=extra)


def test_rule_set_strict_and_kept_paths(tmp_path):
    module = tf.Module()
    module.layers = [tf.Module(), tf.Module()]
    for i, layer in enumerate(module.layers):
        layer.w = tf.Variable(tf.fill((2, 3), float(i)))
    module.extra = tf.Variable([1.0, 2.0])
    rules = RuleSet([Rule("model.layers.{i}.weight", "layers/{i}/w", Transpose())])
    with pytest.raises(errors.StructureMismatchError, match=r"1 variable\(s\).*`extra`") as err:
        objckpt.export(module, tmp_path / "s.safetensors", rules=rules)
    assert "Fix:" in str(err.value) and err.value.problems == ("extra: matches no rule",)
    assert not os.path.exists(tmp_path / "s.safetensors")
    arrays = safetensors_numpy.load_file(
        objckpt.export(module, tmp_path / "s.safetensors", rules=rules, strict=False))
    assert sorted(arrays) == ["extra", "model.layers.0.weight", "model.layers.1.weight"]
    assert arrays["model.layers.1.weight"].shape == (3, 2)


# --- transforms -------------------------------------------------------------------------------

def _bf16(shape):
    # TF's own bfloat16 NumPy type (TF 2.12's is not the ml_dtypes one of today's NumPy)
    return np.random.default_rng(0).normal(size=shape).astype(tf.bfloat16.as_numpy_dtype)


TRANSFORMS = [
    (Transpose(), (5, 3)),
    (Transpose((2, 0, 1)), (2, 3, 4)),
    (ConvKernel("OIHW", "HWIO"), (4, 3, 2, 5)),
    (ConvKernel("HWIO", "OIHW"), (2, 5, 3, 4)),
    (ConvKernel("OIDHW", "DHWIO"), (2, 3, 4, 5, 6)),
    (Reshape((8, 8), (8, 2, 4)), (8, 8)),
    (Reshape((-1, 12), (6, 2, -1)), (4, 12)),
    (Chain(Transpose(), Reshape((6, 4), (6, 2, 2))), (4, 6)),
    (Chain(ConvKernel("OIHW", "HWIO"), Transpose((0, 1, 3, 2))), (4, 3, 2, 2)),
]


@pytest.mark.parametrize("transform, shape", TRANSFORMS, ids=repr)
def test_each_transform_inverts_exactly(transform, shape):
    for value in (np.random.default_rng(1).normal(size=shape).astype("float32"),
                  _bf16(shape), np.arange(np.prod(shape), dtype=np.int64).reshape(shape)):
        out = transform(tf.constant(value))
        back = transform.inverse()(out)
        assert bits(back.numpy()) == bits(value)
        assert bits(transform.inverse()(transform(value))) == bits(value)  # NumPy too
        np.testing.assert_array_equal(np.asarray(transform(value)), out.numpy())
    assert transform.output_shape(shape) == tuple(out.shape)  # export sizes files by it
    assert transform.inverse().output_shape(tuple(out.shape)) == shape
    # traced as the plan traces it: the output shape is known from the input spec
    traced = tf.function(transform, autograph=False).get_concrete_function(
        tf.TensorSpec(shape, tf.float32))
    assert tuple(traced.structured_outputs.shape) == out.shape


def test_transforms_compute_what_torch_and_keras_layouts_need():
    kernel = np.arange(3 * 3 * 2 * 4, dtype=np.float32).reshape(3, 3, 2, 4)  # HWIO
    oihw = ConvKernel("HWIO", "OIHW")(kernel)
    assert oihw.shape == (4, 2, 3, 3) and oihw[1, 0, 2, 1] == kernel[2, 1, 0, 1]
    assert ConvKernel("OIHW", "HWIO").perm == (2, 3, 1, 0)
    assert ConvKernel("OIHW", "HWIO").inverse() == ConvKernel("HWIO", "OIHW")
    assert Transpose((2, 0, 1)).inverse() == Transpose((1, 2, 0))
    assert Transpose().inverse() == Transpose()
    assert Reshape((4, -1), (2, 2, 3)).inverse() == Reshape((2, 2, 3), (4, -1))
    chain = Chain(Transpose(), Reshape((6, 4), (6, 2, 2)))
    assert chain.inverse() == Chain(Reshape((6, 2, 2), (6, 4)), Transpose())
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)  # torch Linear (out, in)
    np.testing.assert_array_equal(Transpose()(tf.constant(weight)).numpy(), weight.T)


@pytest.mark.parametrize("make, match", [
    (lambda: Transpose((0, 0)), "permutation"),
    (lambda: Transpose([1, 0.0]), "permutation"),
    (lambda: ConvKernel("OIHW", "HWI"), "same distinct letters"),
    (lambda: ConvKernel("OOHW", "HWOO"), "same distinct letters"),
    (lambda: Reshape((-1, -1), (4,)), "at most one -1"),
    (lambda: Reshape((4,), "4"), "tuple of ints"),
    (lambda: Chain(), "one or more"),
    (lambda: Chain(Transpose(), 3), "one or more"),
])
def test_bad_transforms_are_refused(make, match):
    with pytest.raises(errors.InvalidArgumentError, match=match) as err:
        make()
    assert "Fix:" in str(err.value)


def test_a_transform_refuses_a_value_of_another_shape():
    with pytest.raises(errors.InvalidArgumentError, match=r"expects a value of shape \(8, 8\)"):
        Reshape((8, 8), (8, 2, 4))(tf.zeros((8, 4)))
    with pytest.raises(errors.InvalidArgumentError, match="permutes 4 axes"):
        ConvKernel("OIHW", "HWIO")(np.zeros((3, 3)))


# --- rules ------------------------------------------------------------------------------------

def test_rule_placeholders_match_one_segment_both_ways():
    rule = Rule("model.layers.{i}.mlp.up_proj.weight", "layers/{i}/up/kernel", Transpose())
    regex, replacement, transform = rule.regex_rule()
    assert transform == Transpose()
    import re

    assert re.sub(regex, replacement, "model.layers.12.mlp.up_proj.weight") == \
        "layers/12/up/kernel"
    assert re.search(regex, "model.layers.1.2.mlp.up_proj.weight") is None  # one segment
    assert re.search(regex, "x.model.layers.1.mlp.up_proj.weight") is None  # anchored
    assert rule.source_name("layers/3/up/kernel") == "model.layers.3.mlp.up_proj.weight"
    assert rule.source_name("layers/3/x/up/kernel") is None
    twice = Rule("h.{i}.to.{i}", "a/{i}")
    assert twice.source_name("a/5") == "h.5.to.5"
    assert re.search(twice.regex_rule()[0], "h.5.to.6") is None
    braces = Rule(r"w\{{x}}.{n}", "b/{n}")  # literal braces and a backslash
    assert braces.source_name("b/1") == r"w\{x}.1"
    assert re.sub(*braces.regex_rule()[:2], r"w\{x}.1") == "b/1"
    backslash = Rule("a.{n}", r"x\y/{n}")
    assert re.sub(*backslash.regex_rule()[:2], "a.1") == r"x\y/1"
    rules = RuleSet([rule, Rule("emb.{n}", "emb/{n}")])
    assert rules.export_name("emb/_kernel") == ("emb.kernel", None, rules[1])  # underscores
    assert rules.export_name("x/kernel", "emb/kernel")[0] == "emb.kernel"  # a variable name
    assert rules.export_name("nothing") is None
    assert len(rules) == 2 and list(rules) == [rule, rules[1]]


@pytest.mark.parametrize("make, match", [
    (lambda: Rule("a.{i}", "a/b"), r"\{i\} appear in the source only"),
    (lambda: Rule("a.b", "a/{j}"), r"\{j\} appear in the target only"),
    (lambda: Rule("a.{i:d}", "a/{i}"), "placeholders are plain names"),
    (lambda: Rule("a.{0}", "a/{0}"), "placeholders are plain names"),
    (lambda: Rule("a.{i", "a/{i}"), "not a valid pattern"),
    (lambda: Rule("", "a"), "non-empty string"),
    (lambda: Rule("a", "b", "transpose"), "callable"),
    (lambda: RuleSet([("^a$", "b")]), "must be an objckpt.rules.Rule"),
])
def test_bad_rules_are_refused(make, match):
    with pytest.raises(errors.InvalidArgumentError, match=match) as err:
        make()
    assert "Fix:" in str(err.value)


def test_a_single_rule_is_refused_where_rules_are_expected():
    module = flavours.Dense(2, 2)
    with pytest.raises(errors.InvalidArgumentError, match="a single rule") as err:
        objckpt.restore(module, objckpt.snapshot(module), rules=Rule("w", "w"))
    assert "RuleSet([rule])" in str(err.value)


# --- export's errors --------------------------------------------------------------------------

def _two_dense():
    module = tf.Module()
    module.a = flavours.Dense(2, 3)
    module.b = flavours.Dense(2, 3)
    return module


def test_export_errors_are_typed_and_write_nothing(tmp_path):
    module = _two_dense()
    target = tmp_path / "m.safetensors"
    objckpt.export(module, target)
    with open(target, "rb") as f:
        before = f.read()

    def refused(error, match, **kwargs):
        with pytest.raises(error, match=match) as err:
            objckpt.export(module, kwargs.pop("path", target), **kwargs)
        assert "Fix:" in str(err.value), str(err.value)
        with open(target, "rb") as f:
            assert f.read() == before  # the earlier export is untouched
        assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "plain.txt"]
        return err.value

    (tmp_path / "plain.txt").write_text("x")
    err = refused(errors.CheckpointWriteError, "Cannot write",
                  path=tmp_path / "plain.txt" / "m.safetensors")
    assert isinstance(err, OSError) and "plain.txt" in str(err)
    err = refused(errors.InvalidArgumentError, "Two variables would be written as `b/w`",
                  rules=RuleSet([Rule("b/w", "a/w")]), strict=False)
    assert "`a/w` (by Rule('b/w', 'a/w')) and `b/w` (its own path)" in str(err)
    refused(errors.InvalidArgumentError, "convert both ways", rules=[("^a/", "x/")])
    refused(errors.InvalidArgumentError, "has no inverse",
            rules=RuleSet([Rule("{m}.w", "{m}/w", tf.transpose), Rule("{m}.b", "{m}/b")]))
    refused(errors.InvalidArgumentError, "inverse transform fails",
            rules=RuleSet([Rule("{m}.w", "{m}/w", Reshape((4, 4), (16,))),
                           Rule("{m}.b", "{m}/b")]))
    refused(errors.InvalidArgumentError, "is a URL", path="gs://bucket/m.safetensors")
    refused(errors.InvalidArgumentError, "index of a sharded export",
            path=tmp_path / "model.safetensors.index.json")
    refused(errors.InvalidArgumentError, "max_shard_size", max_shard_size="5 parsecs")
    refused(errors.InvalidArgumentError, "max_shard_size", max_shard_size=0)
    refused(errors.InvalidArgumentError, "metadata must be a dict", metadata={"step": 7})
    refused(errors.InvalidArgumentError, "optimizer_state", optimizer_state="yes")
    refused(errors.InvalidArgumentError, "reserves",
            rules=RuleSet([Rule("__metadata__", "a/w")]), strict=False)


def test_a_dtype_safetensors_lacks_is_named(tmp_path):
    module = tf.Module()
    module.ok = tf.Variable([1.0])
    module.text = tf.Variable(["a", "b"])
    with pytest.raises(errors.UnsupportedObjectError, match=r"`text` is a string variable") as err:
        objckpt.export(module, tmp_path / "m.safetensors")
    assert err.value.obj == "text" and "Fix:" in str(err.value)
    assert isinstance(err.value, TypeError)
    assert os.listdir(tmp_path) == []
    module = tf.Module()
    module.z = tf.Variable(tf.complex(1.0, 2.0))
    with pytest.raises(errors.UnsupportedObjectError, match="complex64"):
        objckpt.export(module, tmp_path / "m.safetensors")


def test_an_unbuilt_model_has_nothing_to_export(tmp_path):
    with pytest.raises(errors.UnbuiltModelError, match="Nothing to export") as err:
        objckpt.export(tf.Module(), tmp_path)
    assert "Fix:" in str(err.value)


def test_a_folder_gets_model_safetensors(tmp_path):
    module = _two_dense()
    path = objckpt.export(module, tmp_path / "new" / "folder")
    assert path == str(tmp_path / "new" / "folder" / "model.safetensors")
    assert sorted(safetensors_numpy.load_file(path)) == ["a/b", "a/w", "b/b", "b/w"]
    os.makedirs(tmp_path / "x.safetensors")
    with pytest.raises(errors.InvalidArgumentError, match="is a directory") as err:
        objckpt.export(module, tmp_path / "x.safetensors")
    assert "Fix:" in str(err.value)


def test_rule_sets_feed_restore_on_create_and_load_ensemble(tmp_path):
    keras = keras_for(flavours.session_flavour())
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="classifier")])
    rules = RuleSet([Rule("classifier.weight", "classifier/kernel", Transpose()),
                     Rule("classifier.bias", "classifier/bias")])
    path = objckpt.export(model, tmp_path / "m.safetensors", rules=rules)
    arrays = safetensors_numpy.load_file(path)
    source = path if READS_SAFETENSORS else _as_source(arrays)
    expected = {0: model.weights[0].numpy(), 1: model.weights[1].numpy()}
    later = keras.Sequential([keras.layers.Dense(3, name="classifier")])  # no variables yet
    pending = objckpt.restore_on_create(later, source, rules=rules)
    later.build((None, 4))
    pending.assert_done()
    assert_bits(expected, {i: v.numpy() for i, v in enumerate(later.weights)}, "deferred")
    template = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="classifier")])
    ensemble = objckpt.load_ensemble(template, [source, source], rules=rules)
    for member in ensemble.members:
        assert_bits(expected, {i: v.numpy() for i, v in enumerate(member.weights)}, "member")


class _Flip:
    """A user's transform: exact, with an inverse, without output_shape."""

    def __call__(self, value):
        return tf.reverse(value, axis=[0])

    def inverse(self):
        return self


def test_a_users_transform_with_an_inverse_exports(tmp_path):
    module = tf.Module()
    module.w = tf.Variable(tf.reshape(tf.range(6.0), (3, 2)))
    rules = RuleSet([Rule("weight", "w", _Flip())])
    arrays = safetensors_numpy.load_file(
        objckpt.export(module, tmp_path / "m.safetensors", rules=rules))
    np.testing.assert_array_equal(arrays["weight"], module.w.numpy()[::-1])
    fresh = tf.Module()
    fresh.w = tf.Variable(tf.zeros((3, 2)))
    objckpt.restore(fresh, _as_source(arrays), rules=rules)
    assert bits(fresh.w.numpy()) == bits(module.w.numpy())


def test_reshape_output_shape_checks_the_element_count():
    assert Reshape((-1,), (2, -1)).output_shape((6,)) == (2, 3)
    with pytest.raises(errors.InvalidArgumentError, match="cannot reshape"):
        Reshape((-1,), (4, -1)).output_shape((6,))
    with pytest.raises(errors.InvalidArgumentError, match=r"\(8 elements\)"):
        Reshape((-1,), (2, 4)).output_shape((6,))


def test_keras_hubs_loader_reads_a_sharded_export(tmp_path):
    """keras-hub's own reader of Hugging Face folders (its `from_preset` importers use it)
    finds every tensor of a sharded export through the index."""
    pytest.importorskip("keras_hub")
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    keras = keras_for("keras3")
    model = _torch_like(keras)
    index = objckpt.export(model, tmp_path / "hf", rules=TORCH_RULES, max_shard_size=300)
    with open(index, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    assert len(set(weight_map.values())) >= 3
    expected = _load_dir(index)
    with SafetensorLoader(str(tmp_path / "hf")) as loader:
        for name in weight_map:
            assert bits(loader.get_tensor(name)) == bits(expected[name])
        fresh = _torch_like(keras)
        loader.port_weight(fresh.get_layer("classifier").kernel, "classifier.weight",
                           hook_fn=lambda tensor, shape: np.transpose(tensor))
    np.testing.assert_array_equal(fresh.get_layer("classifier").kernel.numpy(),
                                  model.get_layer("classifier").kernel.numpy())


# --- the dtype written -----------------------------------------------------------------


def _mixed():
    module = tf.Module()
    rng = np.random.default_rng(3)
    module.w = tf.Variable(rng.normal(size=(4, 3)).astype("float32"))
    module.h = tf.Variable(rng.normal(size=(3,)).astype("float16"))
    module.steps = tf.Variable(np.arange(3, dtype="int32"))
    return module


def test_export_writes_each_variable_in_its_dtype_by_default(tmp_path):
    module = _mixed()
    path = objckpt.export(module, str(tmp_path / "m.safetensors"))
    with safetensors.safe_open(path, "np") as f:
        assert {k: f.get_tensor(k).dtype.name for k in f.keys()} == {
            "w": "float32", "h": "float16", "steps": "int32"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", tf.bfloat16])
def test_export_dtype_casts_floats_as_tf_cast_does_and_sets_the_config_dtype(tmp_path, dtype):
    import ml_dtypes

    name = getattr(dtype, "name", dtype)
    module = _mixed()
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
         "hidden_size": 3}))
    path = objckpt.export(module, str(folder), dtype=dtype)
    wanted = ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)
    with safetensors.safe_open(path, "np") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert got["w"].dtype == wanted and got["h"].dtype == wanted
    assert got["steps"].dtype == np.int32  # integers keep their dtype
    for key in ("w", "h"):  # NumPy's cast (round to nearest even), byte for byte
        want = getattr(module, key).numpy().astype(wanted)
        assert got[key].tobytes() == want.tobytes()
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == name and config["hidden_size"] == 3
    assert config["architectures"] == ["LlamaForCausalLM"]
    # back into the model: float32 widens by default; bfloat16 -> float16 is lossy
    back = _mixed()
    if name == "bfloat16":
        with pytest.raises(errors.StructureMismatchError, match="pass cast='lossy'"):
            objckpt.restore(back, str(folder))
        report = objckpt.restore(back, str(folder), cast="lossy")
        assert report.cast == {"w": "bfloat16 -> float32", "h": "bfloat16 -> float16"}
    else:
        report = objckpt.restore(back, str(folder))
        assert report.cast == {"w": "float16 -> float32"}
    np.testing.assert_array_equal(back.w.numpy(), got["w"].astype(np.float32))


def test_export_dtype_updates_the_dtype_key_transformers_writes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma", "dtype": "float32"}))
    objckpt.export(_mixed(), str(tmp_path), dtype="bfloat16")
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "model_type": "gemma", "dtype": "bfloat16"}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"name": "not a Hub config"}')
    objckpt.export(_mixed(), str(tmp_path / "other"), dtype="bfloat16")
    assert (tmp_path / "other" / "config.json").read_text() == '{"name": "not a Hub config"}'


@pytest.mark.parametrize("dtype", ["int8", "bool", "float128", 3])
def test_export_refuses_a_dtype_that_is_no_float_safetensors_holds(tmp_path, dtype):
    with pytest.raises(errors.InvalidArgumentError, match="dtype must be None or a floating"):
        objckpt.export(_mixed(), str(tmp_path), dtype=dtype)
    assert not list(tmp_path.iterdir())
