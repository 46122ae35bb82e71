"""`objckpt.migrate` into a target with sharded variables (`ShardedVariable`, what
ParameterServerStrategy with a partitioner makes): the output is laid out as
`tf.train.Checkpoint` writes the same model (the table's key listing one slice per shard, in
TF's order, each shard's rows an entry of their own, the same object graph), TF and objckpt
read it into 1, 2 and 3 shards and a plain variable bit for bit, and each shard's rows are
read from the source alone (a TF1 Saver checkpoint, plain or partitioned, a TF2 checkpoint
of any layout), so no more than a shard's rows are held at once.

The sharded variables here are made on this process's CPU (tests/distributed/test_sharded.py
makes them directly; the Keras models get theirs from a variable creator, as
ParameterServerStrategy's partitioner makes them); tests/distributed/test_sharded_cluster.py
runs parameter servers.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import flavours
import objckpt
from objckpt import errors
from objckpt._bundle import index as _index
from objckpt._bundle import write as _bundlewrite
from objckpt._ops import migrate as _migrate
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import sharded as _sharded
from tests.distributed.test_sharded import full_value, logical, sharded_module

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"
GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
LAYOUTS = [None, (10,), (4, 6), (3, 3, 4)]  # plain, 1, 2 and 3 shards
LAYOUT_IDS = ["plain", "1shard", "2shards", "3shards"]


# --- sources --------------------------------------------------------------------------------

def write_tf1(prefix: str, value: np.ndarray, bias: np.ndarray, parts: int | None,
              axis: int = 0) -> str:
    """A TF1 `Saver` checkpoint of `model/table` (in `parts` parts of rows, or of columns
    for `axis=1`, by `fixed_size_partitioner`; plain for None) and `model/bias`, written by
    TF in a graph and session as TF1 code wrote it."""
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model"):
            table = tf.compat.v1.get_variable(
                "table", initializer=tf.constant(value),
                partitioner=None if parts is None
                else tf.compat.v1.fixed_size_partitioner(parts, axis=axis))
            tf.compat.v1.get_variable("bias", initializer=tf.constant(bias))
        if parts is not None:
            assert type(table).__name__ == "PartitionedVariable"
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, prefix, write_meta_graph=False)


def plain_module(value: np.ndarray, bias: np.ndarray) -> tf.Module:
    module = tf.Module()
    module.table = tf.Variable(value)
    module.bias = tf.Variable(bias)
    return module


def held(value: np.ndarray, bias: np.ndarray, rows) -> tf.Module:
    """A module of layout `rows` (None: plain) holding `value` and `bias`."""
    module = plain_module(value, bias) if rows is None else sharded_module(rows, value)
    module.bias.assign(bias)
    return module


SOURCES = ["tf1-partitioned", "tf1-columns", "tf1-plain", "tf2-sharded", "tf2-plain"]


def source(kind: str, tmp_path, value, bias) -> tuple[str, list]:
    """(prefix, rules) of a checkpoint of `kind` holding table=value and bias."""
    if kind.startswith("tf1"):
        parts = {"tf1-partitioned": 3, "tf1-columns": 2}.get(kind)
        return write_tf1(str(tmp_path / "tf1" / "model.ckpt"), value, bias, parts,
                         axis=int(kind == "tf1-columns")), [("^model/", "")]
    rows = (6, 4) if kind == "tf2-sharded" else None
    prefix = tf.train.Checkpoint(root=held(value, bias, rows)).write(str(tmp_path / "tf2" / "ck"))
    return prefix, None


# --- what is read ---------------------------------------------------------------------------

@pytest.fixture
def reads(monkeypatch):
    """Every shard's rows read from the source, one at a time: (route, key, slice spec,
    shape read). Route "rows": its byte ranges of the stored entries, read in order
    (`_Sliced.read_rows`), for a tensor stored whole or in slices of rows; "slice": TF's
    `RestoreV2` of the shard's slice (`_sharded.read_slice`), for one partitioned by
    columns."""
    got = []
    real_slice, real_rows = _sharded.read_slice, _migrate._Sliced.read_rows

    def read_slice(prefix, job):
        value = real_slice(prefix, job)
        got.append(("slice", job.key, job.spec, tuple(value.shape)))
        return value

    def read_rows(self, prefix, path, write_unit):
        def spy(unit, value):
            got.append(("rows", self.byrows[path][0], self.parts[path][unit[1]].spec,
                        tuple(value.shape)))
            write_unit(unit, value)

        real_rows(self, prefix, path, spy)

    monkeypatch.setattr(_sharded, "read_slice", read_slice)
    monkeypatch.setattr(_migrate._Sliced, "read_rows", read_rows)
    return got


@pytest.fixture
def fetched(monkeypatch):
    """The targets the pipeline's fetch stage reads whole."""
    got = []
    real = _pipeline.Pipeline.fetch

    def spy(self, the_plan, variables, matches=None):
        got.extend(m.target for m in (the_plan.matches if matches is None else matches))
        return real(self, the_plan, variables, matches)

    monkeypatch.setattr(_pipeline.Pipeline, "fetch", spy)
    return got


def specs_of(rows, cols: int = 4) -> list[str]:
    """TF's slice spec of each shard of `rows` rows."""
    starts = np.cumsum((0,) + tuple(rows[:-1]))
    total = sum(rows)
    return [f"{total} {cols} {s},{n}:0,{cols}" for s, n in zip(starts, rows)]


# --- the layout: what TF writes -------------------------------------------------------------

def assert_laid_out_as_tf(ours: str, theirs: str, key: str = KEY, *,
                          whole_graph: bool = True) -> None:
    """The index of `ours` lists what TF's own write `theirs` lists: the sliced key's dtype,
    shape and slices in TF's order, each slice entry's size and checksum (the same bytes),
    every other key; and the same object graph, byte for byte (`whole_graph`), else the same
    variable nodes (objckpt's graph of a Keras model holds the paths to its variables only,
    not the layers without weights TF lists too)."""
    a, b = _index.read_index(ours), _index.read_index(theirs)
    assert a.entries[key].slices == b.entries[key].slices
    assert len(a.entries[key].slices) > 0
    assert sorted(a.entries) == sorted(b.entries)
    for name in b.entries:
        assert (a.entries[name].dtype, a.entries[name].shape, a.entries[name].slices) == \
            (b.entries[name].dtype, b.entries[name].shape, b.entries[name].slices), name
    assert sorted(a.sliced) == sorted(b.sliced)
    for slot, entry in b.sliced.items():
        assert (a.sliced[slot].size, a.sliced[slot].crc32c) == (entry.size, entry.crc32c), slot
    if whole_graph:
        assert object_graph(ours) == object_graph(theirs)
    assert variable_nodes(ours) == variable_nodes(theirs)


def variable_nodes(prefix: str) -> list:
    """The attributes (name, full name, checkpoint key) of the object graph's nodes that
    hold values, sorted."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(GRAPH))
    return sorted((a.name, a.full_name, a.checkpoint_key, len(node.children))
                  for node in graph.nodes for a in node.attributes)


def object_graph(prefix: str) -> bytes:
    """The object graph a checkpoint holds, serialized, less the edge `root` from the root to
    itself that `tf.train.Checkpoint(root=obj)` adds (obj itself has no such child)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(GRAPH))
    children = graph.nodes[0].children
    for k in reversed(range(len(children))):
        if children[k].node_id == 0 and children[k].local_name == "root":
            del children[k]
    return graph.SerializeToString(deterministic=True)


def assert_read_back(out: str, value: np.ndarray, bias: np.ndarray) -> None:
    """TF's `tf.train.Checkpoint.read` and `objckpt.restore` read `out` into plain, 1, 2 and
    3 shards, bit for bit."""
    for rows in LAYOUTS:
        for how in ("tf", "objckpt"):
            fresh = held(np.zeros_like(value), np.zeros_like(bias), rows)
            if how == "tf":
                tf.train.Checkpoint(root=fresh).read(out).assert_consumed()
            else:
                objckpt.restore(fresh, out)
            got = fresh.table.numpy() if rows is None else logical(fresh)
            assert got.tobytes() == value.tobytes(), (rows, how)
            assert fresh.bias.numpy().tobytes() == bias.tobytes(), (rows, how)


@pytest.mark.parametrize("rows", [(4, 6), (3, 3, 4)], ids=["2shards", "3shards"])
@pytest.mark.parametrize("kind", SOURCES)
def test_migrate_writes_what_tf_writes_reading_a_shard_at_a_time(kind, rows, tmp_path, reads,
                                                                 fetched):
    value, bias = full_value(30), np.arange(4, dtype="float32") - 1.5
    prefix, rules = source(kind, tmp_path, value, bias)
    target = sharded_module(rows, np.zeros_like(value))
    out = objckpt.migrate(target, prefix, str(tmp_path / "out" / "ck"), rules=rules)
    assert logical(target).tobytes() == np.zeros_like(value).tobytes()  # migrate assigns nothing
    theirs = tf.train.Checkpoint(root=held(value, bias, rows)).write(str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert [s for s, _ in _index.read_index(out).entries[KEY].slices] == \
        [(int(s), n) for s, n in zip(np.cumsum((0,) + rows[:-1]), rows)]
    # each shard's rows read alone from the source, whatever layout wrote it (byte ranges
    # of the stored entries, TF's read of the shard's slice from one split by columns);
    # the table never fetched whole
    key = "model/table" if kind.startswith("tf1") else KEY
    route = "slice" if kind == "tf1-columns" else "rows"
    assert sorted(reads) == sorted((route, key, spec, (n, 4))
                                   for spec, n in zip(specs_of(rows), rows))
    assert "table" not in fetched and "bias" in fetched
    assert_read_back(out, value, bias)


def test_an_unsharded_target_is_written_whole_as_before(tmp_path, reads):
    value, bias = full_value(31), np.ones(4, "float32")
    prefix, rules = source("tf1-partitioned", tmp_path, value, bias)
    out = objckpt.migrate(plain_module(np.zeros_like(value), np.zeros(4, "float32")), prefix,
                          str(tmp_path / "out"), rules=rules)
    entry = _index.read_index(out).entries[KEY]
    assert entry.slices == () and entry.shape == (10, 4)
    assert reads == []
    assert_read_back(out, value, bias)


# --- routes that fetch the value whole ------------------------------------------------------

def test_a_rule_transform_fetches_the_value_whole_then_writes_each_shard(tmp_path, reads,
                                                                         fetched):
    value, bias = full_value(32), np.zeros(4, "float32")
    prefix, _ = source("tf1-partitioned", tmp_path, value, bias)
    rules = [("^model/table$", "table", lambda t: t * 2.0), ("^model/", "")]
    target = sharded_module((3, 3, 4), np.zeros_like(value))
    out = objckpt.migrate(target, prefix, str(tmp_path / "out"), rules=rules)
    assert reads == [] and "table" in fetched  # the transform needs the whole value
    doubled = value * np.float32(2.0)
    theirs = tf.train.Checkpoint(root=held(doubled, bias, (3, 3, 4))).write(
        str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert_read_back(out, doubled, bias)


def test_a_lossless_cast_is_read_shard_by_shard_in_the_stored_dtype(tmp_path, reads, fetched):
    """A bfloat16 table migrated into float32 shards: each shard's rows read in bfloat16 and
    widened (NumPy's widening is the oracle)."""
    value = full_value(33)
    narrow = tf.Module()
    narrow.table = tf.Variable(tf.constant(value, tf.bfloat16))
    narrow.bias = tf.Variable(tf.zeros((4,)))
    prefix = objckpt.save(narrow, str(tmp_path / "bf16"))
    widened = narrow.table.numpy().astype("float32")
    target = sharded_module((5, 5), np.zeros_like(value))
    out = objckpt.migrate(target, prefix, str(tmp_path / "out"))
    assert sorted(reads) == [("rows", KEY, spec, (5, 4)) for spec in specs_of((5, 5))]
    assert "table" not in fetched
    theirs = tf.train.Checkpoint(root=held(widened, np.zeros(4, "float32"), (5, 5))).write(
        str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert_read_back(out, widened, np.zeros(4, "float32"))


def test_a_variable_without_a_source_value_writes_its_own_shards(tmp_path):
    bias = np.full(4, 3.0, "float32")
    source_module = tf.Module()
    source_module.bias = tf.Variable(bias)
    prefix = objckpt.save(source_module, str(tmp_path / "bias_only"))
    own = full_value(35)
    target = sharded_module((3, 3, 4), own)
    out = objckpt.migrate(target, prefix, str(tmp_path / "out"), strict=False)
    theirs = tf.train.Checkpoint(root=held(own, bias, (3, 3, 4))).write(
        str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert_read_back(out, own, bias)


def test_a_snapshot_source_is_written_in_slices(tmp_path):
    value, bias = full_value(36), np.ones(4, "float32")
    snap = objckpt.snapshot(held(value, bias, (6, 4)))
    out = objckpt.migrate(sharded_module((3, 3, 4), np.zeros_like(value)), snap,
                          str(tmp_path / "out"))
    theirs = tf.train.Checkpoint(root=held(value, bias, (3, 3, 4))).write(
        str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert_read_back(out, value, bias)


@pytest.mark.parametrize("kind", ["tf1-partitioned", "tf1-columns", "tf2-plain"])
def test_the_saveV2_route_writes_the_same_slices(kind, tmp_path, monkeypatch, reads):
    """Where objckpt's bundle writer cannot write (no native crc32c), SaveV2 parts merged by
    TF in TF's order: the same index, each shard still read alone."""
    from objckpt._bundle import fastio as _fastio

    value, bias = full_value(37), np.ones(4, "float32")
    prefix, rules = source(kind, tmp_path, value, bias)
    monkeypatch.setattr(_fastio, "native_crc32c", lambda: None)
    out = objckpt.migrate(sharded_module((3, 3, 4), np.zeros_like(value)), prefix,
                          str(tmp_path / "out"), rules=rules)
    monkeypatch.undo()
    assert sorted(spec for _, _, spec, _ in reads) == sorted(specs_of((3, 3, 4)))
    theirs = tf.train.Checkpoint(root=held(value, bias, (3, 3, 4))).write(
        str(tmp_path / "tf" / "ck"))
    assert_laid_out_as_tf(out, theirs)
    assert_read_back(out, value, bias)


# --- memory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("parts, axis", [(4, 0), (None, 0), (2, 1)],
                         ids=["rows", "whole", "columns"])
def test_no_more_than_one_shards_rows_are_held_at_once(tmp_path, monkeypatch, parts, axis):
    """With the slack of small reads taken away (`_STREAM_SLACK` 0), the bytes read from the
    source and not yet written never exceed the largest shard's, on every thread the
    migration runs: a TF1 table (in 4 parts of rows, whole, in 2 parts of columns) into 3
    shards of 1,000 rows. The rows come straight into a shard's buffer
    (`_migrate._empty`), or from TF's read of its slice (`_sharded.read_slice`: columns)."""
    value = np.random.default_rng(38).normal(size=(3000, 64)).astype("float32")
    bias = np.zeros(64, "float32")
    prefix = write_tf1(str(tmp_path / "tf1" / "m"), value, bias, parts, axis)
    monkeypatch.setattr(_migrate, "_STREAM_SLACK", 0)
    lock, state = threading.Lock(), {"now": 0, "peak": 0, "reads": []}
    read, empty, write_item = _sharded.read_slice, _migrate._empty, _bundlewrite.write_item

    def held(nbytes: int, shape) -> None:
        with lock:
            state["now"] += nbytes
            state["peak"] = max(state["peak"], state["now"])
            state["reads"].append(tuple(shape))

    def reading(prefix, job):
        got = read(prefix, job)
        held(got.numpy().nbytes, got.shape)
        return got

    def allocating(dtype, shape):
        got = empty(dtype, shape)
        held(len(got[1]), shape)
        return got

    def writing(fd, item, crc):
        write_item(fd, item, crc)
        if item.key.startswith(b"\x00"):  # a slice's binary key: its rows written
            with lock:
                state["now"] -= item.size

    monkeypatch.setattr(_sharded, "read_slice", reading)
    monkeypatch.setattr(_migrate, "_empty", allocating)
    monkeypatch.setattr(_bundlewrite, "write_item", writing)
    target = sharded_module((1000, 1000, 1000), np.zeros_like(value))
    target.bias = tf.Variable(tf.zeros((64,)))
    out = objckpt.migrate(target, prefix, str(tmp_path / "out"), rules=[("^model/", "")])
    monkeypatch.undo()
    shard = 1000 * 64 * 4
    assert state["reads"] == [(1000, 64)] * 3
    assert state["now"] == 0 and 0 < state["peak"] <= shard
    assert tf.train.load_checkpoint(out).get_tensor(KEY).tobytes() == value.tobytes()


# --- errors ---------------------------------------------------------------------------------

def test_a_damaged_slice_is_a_typed_error_and_nothing_is_written(tmp_path, monkeypatch):
    """TF's read of a shard's slice (a table partitioned by columns) failing half way: a
    `CheckpointCorruptError` naming the entry, the slice and TF's words; nothing written."""
    value, bias = full_value(39), np.zeros(4, "float32")
    prefix, rules = source("tf1-columns", tmp_path, value, bias)
    real, calls = _sharded.read_slice, []

    def failing(prefix, job):
        calls.append(job.spec)
        if len(calls) == 2:
            raise tf.errors.DataLossError(None, None, "Checksum does not match")
        return real(prefix, job)

    monkeypatch.setattr(_sharded, "read_slice", failing)
    destination = tmp_path / "out"
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.migrate(sharded_module((3, 3, 4), np.zeros_like(value)), prefix,
                        str(destination / "ck"), rules=rules)
    message = str(caught.value)
    assert "`model/table`" in message and "'10 4 3,3:0,4'" in message
    assert "Checksum does not match" in message and "Nothing was written" in message
    assert not destination.exists()


def test_a_damaged_whole_table_is_a_typed_error_and_nothing_is_written(tmp_path):
    """A table stored whole is read shard by shard and its checksum checked after its last
    byte: a flipped byte in its last shard's rows raises, typed, and nothing is written
    (the shards already written were in the migration's own temporary files)."""
    value, bias = full_value(44, rows=3000, cols=8), np.zeros(8, "float32")
    prefix = tf.train.Checkpoint(root=plain_module(value, bias)).write(str(tmp_path / "src"))
    data = prefix + ".data-00000-of-00001"
    raw = bytearray(open(data, "rb").read())
    at = raw.find(value.tobytes())
    assert at >= 0
    raw[at + value.nbytes - 10] ^= 0x55
    with open(data, "wb") as f:
        f.write(raw)
    destination = tmp_path / "out"
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.migrate(sharded_module((1000, 1000, 1000), np.zeros_like(value)), prefix,
                        str(destination / "ck"))
    message = str(caught.value)
    assert KEY in message and "checksum" in message
    assert not destination.exists()


def test_a_table_of_another_shape_is_refused_as_before(tmp_path, reads):
    value, bias = full_value(40), np.zeros(4, "float32")
    prefix, rules = source("tf1-partitioned", tmp_path, value, bias)
    with pytest.raises(errors.StructureMismatchError, match="table") as caught:
        objckpt.migrate(sharded_module((4, 4), full_value(41, rows=8)), prefix,
                        str(tmp_path / "out" / "ck"), rules=rules)
    assert "(10, 4)" in str(caught.value) and "(8, 4)" in str(caught.value)
    assert reads == [] and not (tmp_path / "out").exists()


# --- Keras models whose embedding table is sharded ------------------------------------------

def sharding_creator(rows):
    """A variable creator making a layer's `embeddings` a ShardedVariable of shards of `rows`
    rows (`embeddings/part_0`, ...), as ParameterServerStrategy's partitioner makes it."""
    def creator(next_creator, **kwargs):
        name = str(kwargs.get("name") or "")
        if rows is None or "embeddings" not in name:
            return next_creator(**kwargs)
        initial = kwargs["initial_value"]
        initial = tf.convert_to_tensor(initial() if callable(initial) else initial)
        parts, start = [], 0
        for i, count in enumerate(rows):
            options = dict(kwargs, initial_value=initial[start:start + count],
                           name=f"{name}/part_{i}")
            options.pop("shape", None)
            parts.append(next_creator(**options))
            start += count
        return sharded_variable.ShardedVariable(parts, name=name)
    return creator


def keras_net(keras, rows):
    with tf.variable_creator_scope(sharding_creator(rows)):
        model = keras.Sequential([keras.Input((2,), dtype="int32"),
                                  keras.layers.Embedding(10, 4, name="emb"),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(3, name="proj")], name="net")
    table = objckpt.tree(model)[_table_path(model)]
    assert isinstance(table, sharded_variable.ShardedVariable) == (rows is not None)
    return model


def _table_path(model) -> str:
    return next(p for p in objckpt.tree(model) if p.endswith("embeddings"))


def keras_table(model) -> np.ndarray:
    variable = objckpt.tree(model)[_table_path(model)]
    if isinstance(variable, sharded_variable.ShardedVariable):
        return np.concatenate([part.numpy() for part in variable.variables])
    return variable.numpy()


@pytest.mark.parametrize("rows", [(4, 6), (3, 3, 4)], ids=["2shards", "3shards"])
@pytest.mark.parametrize("flavour", flavours.KERAS_FLAVOURS)
def test_a_keras_model_with_a_sharded_table_is_migrated_as_tf_writes_it(flavour, rows,
                                                                        tmp_path, reads):
    keras = flavours.keras_for(flavour)
    trained = keras_net(keras, None)
    for variable in objckpt.tree(trained).values():
        variable.assign(np.random.default_rng(42).normal(size=variable.shape).astype("float32"))
    prefix = objckpt.save(trained, str(tmp_path / "plain" / "ck"))  # a TF2 checkpoint
    target = keras_net(keras, rows)
    out = objckpt.migrate(target, prefix, str(tmp_path / "out" / "ck"))
    key = f"{_table_path(target)}/.ATTRIBUTES/VARIABLE_VALUE"
    assert sorted(reads) == sorted(("rows", key, spec, (n, 4))
                                   for spec, n in zip(specs_of(rows), rows))
    like = keras_net(keras, rows)
    objckpt.restore(like, prefix)
    ids = np.array([[1, 7], [3, 9]], "int32")
    np.testing.assert_array_equal(like(ids).numpy(), trained(ids).numpy())
    if flavour == "keras3":  # TF's saver cannot save Keras 3's sharded weights (no `device`)
        theirs = objckpt.save(like, str(tmp_path / "theirs" / "ck"))
    else:
        theirs = tf.train.Checkpoint(root=like).write(str(tmp_path / "theirs" / "ck"))
    assert_laid_out_as_tf(out, theirs, key, whole_graph=False)
    for layout in (None, (10,), (4, 6), (3, 3, 4)):
        # TF's reader cannot restore Keras 3's sharded weights either (it asks them for a
        # `device`): TF reads Keras 3 models into an unsharded one (docs/distributed.md)
        tf_reads = flavour != "keras3" or layout is None
        for how in ("tf", "objckpt") if tf_reads else ("objckpt",):
            fresh = keras_net(keras, layout)
            if how == "tf":
                tf.train.Checkpoint(root=fresh).read(out).assert_existing_objects_matched()
            else:
                objckpt.restore(fresh, out)
            assert keras_table(fresh).tobytes() == keras_table(trained).tobytes(), (layout, how)
            np.testing.assert_array_equal(fresh(ids).numpy(), trained(ids).numpy())


def test_the_migrated_files_are_a_checkpoint_objckpt_verifies(tmp_path):
    value, bias = full_value(43), np.zeros(4, "float32")
    prefix, rules = source("tf2-sharded", tmp_path, value, bias)
    out = objckpt.migrate(sharded_module((3, 3, 4), np.zeros_like(value)), prefix,
                          str(tmp_path / "out" / "ck"), rules=rules)
    assert sorted(os.listdir(tmp_path / "out")) == ["ck.data-00000-of-00001", "ck.index"]
    report = objckpt.verify(out)
    assert report.ok, report


# --- on a ParameterServerStrategy cluster -----------------------------------------------------

CLUSTER_SCRIPT = r'''
import json, os, sys
folder, flavour = sys.argv[1], sys.argv[2]
sys.argv = [sys.argv[0], folder, flavour]  # what pss_worker reads at import
import pss_worker as w
import numpy as np
import tensorflow as tf
import objckpt
from objckpt._bundle import index as _index

resolver, servers = w.start_cluster()
w.FOLDER = folder
source_strategy = w.strategy_of(resolver, 2)
model, opt = w.build(source_strategy, "adam")
w.train(source_strategy, model, opt, 3)
expected = w.state(model, opt)
prefix = tf.train.Checkpoint(model=model, optimizer=opt).write(os.path.join(folder, "src"))
out = {}
for shards in (3, 1):
    strategy = w.strategy_of(resolver, shards)
    target, target_opt = w.build(strategy, "adam")
    before = w.state(target, target_opt)
    migrated = objckpt.migrate(tf.train.Checkpoint(model=target, optimizer=target_opt), prefix,
                               os.path.join(folder, f"mig{shards}"))
    unchanged = w.same(w.state(target, target_opt), before)  # migrate assigns nothing
    # TF's own write of the same model (its shards where they are) once it holds the values
    # (Keras 2's slots of sharded variables do not count as consumed: values compared)
    tf.train.Checkpoint(model=target, optimizer=target_opt).read(migrated).expect_partial()
    target_equal = w.same(w.state(target, target_opt), expected)
    theirs = tf.train.Checkpoint(model=target, optimizer=target_opt).write(
        os.path.join(folder, f"tf{shards}"))
    a, b = _index.read_index(migrated), _index.read_index(theirs)
    read = {}
    for rows in (1, 2, 3):
        s = w.strategy_of(resolver, rows)
        fresh, fresh_opt = w.build(s, "adam")
        tf.train.Checkpoint(model=fresh, optimizer=fresh_opt).read(migrated).expect_partial()
        by_tf = w.same(w.state(fresh, fresh_opt), expected)
        fresh, fresh_opt = w.build(s, "adam")
        objckpt.restore(tf.train.Checkpoint(model=fresh, optimizer=fresh_opt), migrated)
        read[rows] = [by_tf, w.same(w.state(fresh, fresh_opt), expected)]
    out[shards] = {
        "rows": w.shard_rows(target),
        "devices": sorted({p.device for p in target.get_layer("embed").embeddings.variables}
                          if shards > 1 else []),
        "sliced": sorted(k for k, e in b.entries.items() if e.slices),
        "table_starts": [e[0][0] for e in a.entries[
            "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"].slices],
        "entries_equal": sorted(a.entries) == sorted(b.entries) and all(
            (a.entries[k].dtype, a.entries[k].shape, a.entries[k].slices)
            == (e.dtype, e.shape, e.slices) for k, e in b.entries.items()),
        "slices_equal": sorted(a.sliced) == sorted(b.sliced) and all(
            (a.sliced[k].size, a.sliced[k].crc32c) == (e.size, e.crc32c)
            for k, e in b.sliced.items()),
        "target_unchanged": unchanged,
        "tf_write_holds_the_values": target_equal,
        "read": read,
    }
print("RESULT " + json.dumps(out), flush=True)
'''


@pytest.mark.subprocess
@pytest.mark.slow
def test_migrate_into_a_model_on_parameter_servers_is_what_tf_writes(tmp_path):
    """A tf_keras (Keras 2 on TF <= 2.15) embedding model trained with Adam in 2 shards on
    a cluster of 2 parameter servers, migrated into the model (and its sharded Adam slots)
    built in 3 shards there, and in 1: the index is TF's write of the same model (every
    key's slices in TF's order over the servers, the same bytes), TF and objckpt read it
    into 1, 2 and 3 shards bit for bit."""
    import json
    import subprocess
    import sys

    if flavours.session_flavour() == "keras2":
        flavour = "keras2"
    elif importlib_util_find("tf_keras"):
        flavour = "tf_keras"
    else:
        pytest.skip("tf_keras is not installed: Keras 3 cannot train with sharded variables")
    helpers = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "helpers")
    root = os.path.dirname(os.path.dirname(helpers))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0",
               PYTHONPATH=os.pathsep.join(p for p in (helpers, root,
                                                      os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, str(tmp_path), flavour],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["3"]["rows"] == [4, 4, 4] and got["1"]["rows"] == [12]
    assert len(got["3"]["devices"]) == 2  # the shards live on both parameter servers
    # TF lists the slices grouped by parameter server, not in row order (by the order the
    # servers first appear from TF 2.16, by device name before): `entries_equal` below holds
    # objckpt's list to TF's write of the same model, order included
    assert sorted(got["3"]["table_starts"]) == [0, 4, 8]
    # the table and the head's kernel (rows split too) and their Adam slots are stored in
    # slices, as TF stores them
    sliced = got["3"]["sliced"]
    assert len(sliced) == 6 and got["1"]["sliced"] == []
    assert {"model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE",
            "model/layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE"} < set(sliced)
    for shards in ("3", "1"):
        assert got[shards]["entries_equal"] and got[shards]["slices_equal"], shards
        assert got[shards]["target_unchanged"], shards
        assert got[shards]["tf_write_holds_the_values"], shards
        assert got[shards]["read"] == {"1": [True, True], "2": [True, True],
                                       "3": [True, True]}, shards


def importlib_util_find(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
