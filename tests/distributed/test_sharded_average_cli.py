"""The model-free `objckpt average` (TF-free) on checkpoints TF wrote with sharded variables
(one key, one slice per shard): sources sliced alike are averaged slice by slice into the
same slices; sources sliced otherwise (or whole) into the first source's layout. TF reads
the result (into its own layout and another); the oracle is NumPy on the values TF reads."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

from objckpt import errors
from objckpt._bundle import index as _index
from objckpt._bundle import write as _write
from objckpt._ops import averaging, meanstream

from support import cli_in_process, run_cli

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"
STEPS = "steps/.ATTRIBUTES/VARIABLE_VALUE"


def sharded(rows, value: np.ndarray):
    """A ShardedVariable of `value` in shards of `rows` rows; rows=None: a plain variable."""
    if rows is None:
        return tf.Variable(value)
    parts, start = [], 0
    for count in rows:
        parts.append(tf.Variable(value[start:start + count]))
        start += count
    return sharded_variable.ShardedVariable(parts)


def module(rows, seed: int, steps_rows=(2, 2), dtype="float32") -> tf.Module:
    """`table` (float, 10x4) in shards of `rows`, a plain `bias`, and `steps` (int64, in
    shards of `steps_rows`): not a weight, taken from one source."""
    rng = np.random.default_rng(seed)
    out = tf.Module()
    out.table = sharded(rows, tf.constant(rng.normal(size=(10, 4)).astype("float32"),
                                          dtype).numpy())
    out.bias = tf.Variable(rng.normal(size=4).astype("float32"))
    out.steps = sharded(steps_rows, np.arange(4, dtype="int64") + 10 * seed)
    return out


def write(folder, name: str, *args, **kwargs) -> str:
    return tf.train.Checkpoint(root=module(*args, **kwargs)).write(str(folder / name))


def tf_values(prefix: str) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def weighted(prefixes, key: str, dtype="float32") -> np.ndarray:
    """The writer's arithmetic, from the values TF reads: each source times its weight in
    float64, added in source order, rounded once."""
    weight = np.float64(1 / len(prefixes))
    total = None
    for prefix in prefixes:
        part = tf_values(prefix)[key].astype("float64") * weight
        total = part if total is None else total + part
    return total.astype(dtype)


def read_into(rows, prefix: str) -> tf.Module:
    """A fresh module of `rows` restored by TF's own `tf.train.Checkpoint.read`."""
    fresh = tf.Module()
    fresh.table = sharded(rows, np.zeros((10, 4), "float32"))
    fresh.bias = tf.Variable(np.zeros(4, "float32"))
    fresh.steps = sharded((2, 2), np.zeros(4, "int64"))
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    return fresh


def whole(variable) -> np.ndarray:
    parts = variable.variables if hasattr(variable, "variables") else [variable]
    return np.concatenate([p.numpy() for p in parts])


def test_slice_keys_encode_as_tf_decodes_them():
    """The writer's slice keys decode (TF's OrderedCode) to the name and extents given:
    names with 0x00 and 0xff bytes, starts and lengths of 1 to 9 bytes, whole axes."""
    name = "a\x00b\xffc/.ATTRIBUTES/VARIABLE_VALUE"
    for value in (0, 1, 63, 64, 127, 128, 8191, 8192, 1 << 20, 1 << 40, (1 << 62) - 1):
        extents = ((value, 5), (0, -1), (value, value + 1))
        assert _index.slice_key(_write.slice_key(name, extents)) == (name, extents)
    assert _write.slice_key("t", ((5, 5), (0, 4))) == b"\x00t\x00\x01\x01\x02\x85\x85\x80\x84"


def test_sources_sliced_alike_are_averaged_into_the_same_slices(tmp_path, capsys):
    """Two sources (weights 1/2: the mean is exact, NumPy's to the bit): every entry of the
    output, slices included, is the one TF writes for a module holding NumPy's mean."""
    sources = [write(tmp_path, f"s{seed}", (5, 5), seed) for seed in (0, 1)]
    out = tmp_path / "avg"
    status, text, err = cli_in_process(capsys, "average", out, *sources)
    assert status == 0, err
    assert "averaged 2 variables" in text
    values = [tf_values(p) for p in sources]
    mean = tf.Module()
    mean.table = sharded((5, 5), np.mean([v[KEY] for v in values], axis=0))
    mean.bias = tf.Variable(np.mean([v["bias/.ATTRIBUTES/VARIABLE_VALUE"] for v in values],
                                    axis=0))
    mean.steps = sharded((2, 2), values[-1][STEPS])  # taken from the last source
    theirs = _index.read_index(tf.train.Checkpoint(root=mean).write(str(tmp_path / "tf")))
    ours = _index.read_index(str(out))
    assert ours.entries[KEY].slices == (((0, 5), (0, 4)), ((5, 5), (0, 4)))
    for key in (KEY, STEPS, "bias/.ATTRIBUTES/VARIABLE_VALUE"):
        a, b = ours.entries[key], theirs.entries[key]
        assert (a.dtype, a.shape, a.slices, a.crc32c) == (b.dtype, b.shape, b.slices,
                                                          b.crc32c), key
    assert ours.sliced.keys() == theirs.sliced.keys()
    for key, entry in theirs.sliced.items():  # each slice's bytes, by their checksum
        assert (ours.sliced[key].shape, ours.sliced[key].crc32c) == (entry.shape,
                                                                      entry.crc32c)
    fresh = read_into((5, 5), str(out))
    assert whole(fresh.table).tobytes() == np.mean([v[KEY] for v in values], axis=0).tobytes()
    assert whole(fresh.steps).tobytes() == values[-1][STEPS].tobytes()


@pytest.mark.parametrize("layouts", [((3, 3, 4), (5, 5), None), (None, (5, 5), (3, 3, 4)),
                                     ((5, 5), (5, 5), (2, 8))],
                         ids=["sliced-first", "whole-first", "one-differs"])
def test_sources_sliced_otherwise_are_averaged_into_the_first_layout(tmp_path, layouts):
    sources = [write(tmp_path, f"s{k}", rows, seed=k, steps_rows=(1, 3) if k == 2 else (2, 2))
               for k, rows in enumerate(layouts)]
    out = str(tmp_path / "avg")
    done = averaging.average_checkpoints(sources, out)
    assert sorted(done["averaged"]) == ["bias", "table"] and done["taken"] == ("steps",)
    entry = _index.read_index(out).entries[KEY]
    first = layouts[0]
    if first is None:
        assert entry.slices == ()
    else:
        starts = np.cumsum((0,) + first[:-1])
        assert entry.slices == tuple(((int(s), r), (0, 4)) for s, r in zip(starts, first))
    # the steps taken from the last source keep its slices
    assert _index.read_index(out).entries[STEPS].slices == (((0, 1),), ((1, 3),))
    got = tf_values(out)
    expected = weighted(sources, KEY)
    assert got[KEY].tobytes() == expected.tobytes(), "sum of weighted values, rounded once"
    numpy_mean = np.mean([tf_values(p)[KEY].astype("float64") for p in sources],
                         axis=0).astype("float32")
    assert np.all(np.abs(got[KEY] - numpy_mean) <= np.spacing(np.abs(numpy_mean)))
    assert got[STEPS].tobytes() == tf_values(sources[-1])[STEPS].tobytes()
    for rows in ((4, 6), None):  # TF reads it into another layout too
        fresh = read_into(rows, out)
        assert whole(fresh.table).tobytes() == expected.tobytes()


def test_mixed_float_dtypes_and_weights_across_layouts(tmp_path):
    """A bfloat16 source in 3 shards and a float32 one whole, weights 3:1, into bfloat16."""
    sources = [write(tmp_path, "b", (3, 3, 4), 0, dtype="bfloat16"),
               write(tmp_path, "f", None, 1)]
    out = str(tmp_path / "avg")
    averaging.average_checkpoints(sources, out, weights=[3, 1])
    values = [tf_values(p)[KEY].astype("float64") for p in sources]
    expected = tf.constant(values[0] * 0.75 + values[1] * 0.25, tf.float64)
    got = tf_values(out)[KEY]
    assert got.dtype == tf.bfloat16.as_numpy_dtype
    assert np.array_equal(np.asarray(got, "float32"),
                          np.asarray(np.asarray(expected).astype(got.dtype), "float32"))
    assert len(_index.read_index(out).entries[KEY].slices) == 3


def test_memory_is_bounded_by_a_slice(tmp_path, monkeypatch):
    """70,100 rows in 3 slices: the output buffer and the float64 accumulator never hold
    more than the largest slice, sliced alike or otherwise."""
    rows = (40000, 30000, 100)
    big = np.random.default_rng(0).normal(size=(70100, 4)).astype("float32")
    holders = []
    for k, layout in enumerate((rows, rows, (35050, 35050))):
        holder = tf.Module()
        holder.table = sharded(layout, big + k)
        holders.append(tf.train.Checkpoint(root=holder).write(str(tmp_path / f"b{k}")))
    asked = {"out": [], "acc": []}
    real_out, real_acc = meanstream.Workspace.out, meanstream.Workspace.acc
    monkeypatch.setattr(meanstream.Workspace, "out", lambda self, n: (
        asked["out"].append(n), real_out(self, n))[1])
    monkeypatch.setattr(meanstream.Workspace, "acc", lambda self, n: (
        asked["acc"].append(n), real_acc(self, n))[1])
    largest = 40000 * 4
    averaging.average_checkpoints(holders[:2], str(tmp_path / "alike"))
    assert max(asked["out"]) == largest * 4 and not asked["acc"]
    asked["out"].clear()
    averaging.average_checkpoints(holders, str(tmp_path / "other"))
    assert max(asked["out"]) == largest * 4 and max(asked["acc"]) == largest
    expected = weighted(holders, KEY)
    assert tf_values(str(tmp_path / "other"))[KEY].tobytes() == expected.tobytes()


def test_a_damaged_slice_is_named_and_nothing_is_written(tmp_path):
    sources = [write(tmp_path, f"s{seed}", (5, 5), seed) for seed in (0, 1)]
    index = _index.read_index(sources[1])
    part = index.sliced[(KEY, index.entries[KEY].slices[1])]
    path = f"{sources[1]}.data-{part.shard:05d}-of-{index.num_shards:05d}"
    with open(path, "r+b") as f:
        f.seek(part.offset + 3)
        byte = f.read(1)
        f.seek(part.offset + 3)
        f.write(bytes([byte[0] ^ 0x40]))
    out = tmp_path / "out" / "avg"
    with pytest.raises(errors.CheckpointCorruptError) as err:
        averaging.average_checkpoints(sources, str(out))
    assert "source 1" in str(err.value) and "table/.ATTRIBUTES/VARIABLE_VALUE (slice" \
        in str(err.value)
    assert "checksum" in str(err.value)
    assert not os.path.exists(str(out) + ".index")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.subprocess
def test_the_command_averages_shards_without_tensorflow(tmp_path):
    """`objckpt average` in a process where TensorFlow cannot be imported: 3 and 2 shards
    into the first's 3 slices, the values the writer's arithmetic gives."""
    sources = [write(tmp_path, "a", (3, 3, 4), 0), write(tmp_path, "b", (5, 5), 1)]
    out = tmp_path / "avg"
    done = run_cli("average", out, *sources)
    assert done.returncode == 0, done.stderr
    assert "averaged 2 variables over 2 checkpoints" in done.stdout
    assert len(_index.read_index(str(out)).entries[KEY].slices) == 3
    assert tf_values(str(out))[KEY].tobytes() == weighted(sources, KEY).tobytes()
