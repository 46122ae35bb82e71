"""The `objckpt` command line on checkpoints TF wrote under a partitioner: a sharded variable
(ParameterServerStrategy's `ShardedVariable`: one key, one slice per shard) and a TF1
partitioned variable are shown whole, with their shard layout, by inspect, graph, diff and
verify, and their values are read without TensorFlow."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt import cli
from objckpt._bundle import index as _index
from objckpt._inspect import diff as _diff
from objckpt._inspect import meta as _meta

from support import cli_in_process, run_cli
from tests.distributed.test_sharded import sharded_module

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"


def value(seed: int, rows: int = 10, dtype="float32") -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, 4)).astype(dtype)


def tf1_partitioned(prefix: str) -> str:
    """A TF1 Saver checkpoint of variables made with partitioners (rows, and columns)."""
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("emb", initializer=tf.constant(value(3, rows=7)),
                                  partitioner=tf.compat.v1.fixed_size_partitioner(3))
        tf.compat.v1.get_variable("wide", initializer=tf.constant(value(4, rows=2).T),
                                  partitioner=tf.compat.v1.fixed_size_partitioner(2, axis=1))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, prefix, write_meta_graph=False)


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    """{name: prefix}: the same table written by tf.train.Checkpoint in 2 and 3 shards and
    whole; another value in 2 shards; 70,100 rows in 3 (slice keys of several bytes); a
    bfloat16 table in 2; and a TF1 partitioned checkpoint."""
    folder = tmp_path_factory.mktemp("clisharded")
    table, other = value(0), value(0)
    other[7, 2] += 1.0
    write = {
        "two": ((5, 5), table), "three": ((3, 3, 4), table), "whole": ((10,), table),
        "other": ((5, 5), other), "large": ((40000, 30000, 100), value(1, rows=70100)),
    }
    out = {name: tf.train.Checkpoint(root=sharded_module(rows, v)).write(str(folder / name))
           for name, (rows, v) in write.items()}
    module = tf.Module()
    module.table = sharded_variable.ShardedVariable(
        [tf.Variable(tf.constant(value(2)[:6], tf.bfloat16)),
         tf.Variable(tf.constant(value(2)[6:], tf.bfloat16))], name="table")
    out["bfloat16"] = tf.train.Checkpoint(root=module).write(str(folder / "bf16"))
    out["tf1"] = tf1_partitioned(str(folder / "tf1" / "model"))
    return out


def test_inspect_shows_the_variable_whole_with_its_layout(prefixes, capsys):
    status, out, _ = cli_in_process(capsys, "inspect", prefixes["three"])
    assert status == 0
    row = next(line for line in out.splitlines() if line.startswith("table"))
    assert row.split() == ["table", "[3", "shards", "of", "rows", "[0:3)", "[3:6)", "[6:10)]",
                           "(10,", "4)", "float32", "160", "B"]
    assert "2 variables, 44 parameters" in out  # the table once, not per shard
    status, out, _ = cli_in_process(capsys, "inspect", prefixes["three"], "--format", "json")
    table = next(v for v in json.loads(out)["variables"] if v["path"] == "table")
    assert table["layout"] == "3 shards of rows [0:3) [3:6) [6:10)"
    assert table["shape"] == [10, 4] and table["key"] == KEY and table["nbytes"] == 160
    status, out, _ = cli_in_process(capsys, "inspect", prefixes["whole"], "--format", "json")
    assert all("layout" not in v for v in json.loads(out)["variables"])


def test_layouts_of_tf1_partitioners(prefixes):
    entries = _meta.read(prefixes["tf1"])
    assert entries["emb"].layout == "3 shards of rows [0:3) [3:5) [5:7)"
    assert entries["wide"].layout == "2 slices along axis 1 [0:1) [1:2)"
    assert entries["emb"].shape == (7, 4)


def test_graph_labels_the_variable_with_its_layout(prefixes, capsys):
    status, out, _ = cli_in_process(capsys, "graph", prefixes["two"])
    assert status == 0
    assert 'label="table\\n(10, 4) float32\\n2 shards of rows [0:5) [5:10)"' in out
    assert out == objckpt.graph(prefixes["two"]).dot
    live = objckpt.graph(sharded_module((4, 6), value(0))).dot
    assert "(10, 4) float32\\n2 shards of rows [0:4) [4:10)" in live


@pytest.mark.parametrize("name", ["two", "three", "large", "bfloat16"])
def test_values_read_without_tf_equal_tfs(prefixes, name):
    """The TF-free reader joins the slices (keys decoded from TF's binary encoding)."""
    prefix = prefixes[name]
    index = _index.read_index(prefix)
    assert sorted(e for (k, e) in index.sliced if k == KEY) == \
        sorted(index.entries[KEY].slices)
    ours = _meta.read(prefix).read(KEY)
    theirs = tf.train.load_checkpoint(prefix).get_tensor(KEY)
    if name == "bfloat16":
        theirs = theirs.astype("float32")  # objckpt widens bfloat16 as TF converts it
    assert ours.tobytes() == theirs.reshape(-1).tobytes()


def test_tf1_partitioned_values_read_without_tf_equal_tfs(prefixes):
    reader = tf.train.load_checkpoint(prefixes["tf1"])
    entries = _meta.read(prefixes["tf1"])
    for name in ("emb", "wide"):
        assert entries.read(name).tobytes() == reader.get_tensor(name).reshape(-1).tobytes()


def test_diff_compares_whole_tensors_across_layouts(prefixes, capsys):
    same = _diff.diff(prefixes["two"], prefixes["three"])
    assert same.same and same.equal == 2
    assert "`table` is stored as 2 shards of rows [0:5) [5:10) in A, 3 shards of rows " \
           "[0:3) [3:6) [6:10) in B: compared as one tensor, whole" in same.notes
    whole = _diff.diff(prefixes["two"], prefixes["whole"])
    assert whole.same
    assert any("one whole tensor in B" in note for note in whole.notes)
    status, out, _ = cli_in_process(capsys, "diff", prefixes["other"], prefixes["three"])
    assert status == 1
    assert "~ table: max |a-b| 1 at 1 of 40 values" in out
    assert "2 shards of rows [0:5) [5:10) in A, 3 shards of rows [0:3) [3:6) [6:10) in B" \
           in out


def test_verify_checks_every_slice_and_names_the_variable(prefixes, tmp_path, capsys):
    status, out, _ = cli_in_process(capsys, "verify", prefixes["three"])
    assert status == 0
    assert "`table` (10, 4) is stored as 3 shards of rows [0:3) [3:6) [6:10) (one key, " \
           "one slice per shard): read whole, every slice checked" in out
    assert "OK:" in out.splitlines()[-1] and "2 tensors" in out
    # One byte of the second slice changed: verify names the variable, diff refuses.
    index = _index.read_index(prefixes["three"])
    part = index.sliced[(KEY, index.entries[KEY].slices[1])]
    damaged = str(tmp_path / "damaged")
    for suffix in (".index", *(f".data-{i:05d}-of-{index.num_shards:05d}"
                               for i in range(index.num_shards))):
        with open(prefixes["three"] + suffix, "rb") as f:
            data = bytearray(f.read())
        if suffix.startswith(".data") and int(suffix[6:11]) == part.shard:
            data[part.offset + 3] ^= 0x40
        with open(damaged + suffix, "wb") as f:
            f.write(data)
    status, out, _ = cli_in_process(capsys, "verify", damaged)
    assert status == 1
    assert "problem:" in out and "`table`" in out
    status, _, err = cli_in_process(capsys, "diff", prefixes["three"], damaged)
    assert status == 1
    assert "do not match their checksum" in err and "table" in err


@pytest.mark.subprocess
def test_inspect_graph_and_diff_of_sharded_checkpoints_run_without_tensorflow(prefixes):
    blocked = run_cli("inspect", prefixes["three"], "--format", "json")
    assert blocked.returncode == 0, blocked.stderr
    assert json.loads(blocked.stdout) == cli.inspect_json(_meta.read(prefixes["three"]))
    graph = run_cli("graph", prefixes["tf1"])
    assert graph.returncode == 0, graph.stderr
    assert "3 shards of rows [0:3) [3:5) [5:7)" in graph.stdout
    diff = run_cli("diff", prefixes["other"], prefixes["three"], "--format", "json")
    assert diff.returncode == 1, diff.stderr
    assert json.loads(diff.stdout) == cli.diff_json(
        _diff.diff(prefixes["other"], prefixes["three"]))
    assert [v["path"] for v in json.loads(diff.stdout)["values"]] == ["table"]
    assert os.path.exists(prefixes["three"] + ".index")
