"""`inspect`, `graph` and `diff` without TensorFlow: the pure-Python object graph reader
(`_objgraph`), checkpoint metadata (`_meta`), and the command line run with TF blocked."""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, cli, errors
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph
from objckpt._cli import terminal as _terminal
from objckpt._inspect import diff as _diff
from objckpt._inspect import meta as _meta

from flavours import build, keras_for, session_flavour
from support import cli_in_process, run_cli

_run = run_cli  # the command line with TensorFlow blocked (blocked=False: importable)


_in_process = cli_in_process


def _sharded(directory) -> str:
    """An object-based checkpoint whose tensors lie in two data shards (MergeV2Checkpoints)."""
    module = tf.Module()
    module.a = tf.Variable([1.0, 2.0])
    module.b = tf.Variable(tf.ones((2, 3), tf.float16))
    whole = tf.train.Checkpoint(root=module).write(str(directory / "whole"))
    reader = tf.train.load_checkpoint(whole)
    keys = sorted(reader.get_variable_to_shape_map())
    parts = []
    for i, chunk in enumerate((keys[:1], keys[1:])):
        parts.append(str(directory / f"part{i}"))
        tf.raw_ops.SaveV2(prefix=parts[-1], tensor_names=chunk, shape_and_slices=[""] * len(chunk),
                          tensors=[tf.constant(reader.get_tensor(k)) for k in chunk])
    merged = str(directory / "sharded")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=merged)
    return merged


def _tf1(directory) -> str:
    """A name-based (TF1 Saver) checkpoint with a partitioned variable."""
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("model/w", initializer=tf.constant([[1.0, 2.0]]))
        tf.compat.v1.get_variable("emb", shape=[5, 2],
                                  partitioner=tf.compat.v1.fixed_size_partitioner(2))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, str(directory / "tf1" / "model"),
                                                   write_meta_graph=False)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{kind: prefix}: the session's Keras flavour (trained, with an optimizer), a
    tf.Module of every value kind, a TF1 Saver checkpoint, a two-shard checkpoint, and a
    directory of managed checkpoints."""
    directory = tmp_path_factory.mktemp("fastcli")
    flavour = session_flavour()
    out = {flavour: objckpt.save(build(flavour), str(directory / flavour))}
    module = tf.Module()
    module.f32 = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    module.bf16 = tf.Variable(tf.constant([1.5, -2.0], tf.bfloat16))
    module.text = tf.Variable([b"a\x00b", b"", "é".encode()])
    module.flags = tf.Variable([True, False])
    module.counts = tf.Variable(np.array([-3, 2**40], np.int64))
    out["module"] = tf.train.Checkpoint(root=module).write(str(directory / "module"))
    out["tf1"] = _tf1(directory)
    out["sharded"] = _sharded(directory)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=build("module")),
                                         str(directory / "managed"), 2)
    manager.save()
    out["directory"] = str(directory / "managed")
    out["newest"] = manager.save()
    return out


def _proto_tuples(graph):
    return [(tuple((c.node_id, c.local_name) for c in node.children),
             tuple((a.name, a.full_name, a.checkpoint_key) for a in node.attributes),
             tuple((s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
                   for s in node.slot_variables)) for node in graph.nodes]


@pytest.mark.parametrize("kind", ["flavour", "module", "tf1", "sharded", "newest"])
def test_the_object_graph_and_variables_equal_tfs(checkpoints, kind):
    prefix = checkpoints[session_flavour() if kind == "flavour" else kind]
    graph = _objgraph.read_object_graph(prefix)
    meta = _meta.read(prefix)
    if kind == "tf1":
        assert graph is None and meta.name_based
        shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
        assert {n: list(v.shape) for n, v in meta.items()} == shapes
        assert meta["emb"].shape == (5, 2) and meta["emb"].dtype.name == "float32"
        return
    proto = _compat.TrackableObjectGraph()
    proto.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(_bundle.OBJECT_GRAPH_KEY))
    assert _proto_tuples(graph) == _proto_tuples(proto)
    tree = objckpt.read_tree(prefix)
    assert sorted(meta) == sorted(tree)
    for path, entry in tree.items():
        ours = meta[path]
        assert (ours.shape, ours.dtype.name, ours.dtype.size, ours.key, ours.name) == (
            entry.shape, entry.dtype.name, entry.dtype.size, entry.key, entry.name), path
    if kind == "sharded":
        assert meta.index.num_shards == 2
        assert {e.shard for e in meta.index.entries.values()} == {0, 1}


def test_a_trained_keras3_model_is_shown_by_network_path_and_saved_name(tmp_path, capsys):
    keras = keras_for("keras3")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="encoder"),
                              keras.layers.Dense(2, name="head")], name="net")
    model.compile(keras.optimizers.Adam(name="adam"), "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0)
    a = objckpt.save(model, str(tmp_path / "a"))
    kernel = model.get_layer("encoder").kernel
    kernel.assign(kernel + 0.5)
    b = objckpt.save(model, str(tmp_path / "b"))
    meta = _meta.read(a)
    weight = meta["optimizer/_trainable_variables/0"]  # TF's canonical (breadth-first) path
    assert (weight.shown, weight.name) == ("_functional/_operations/1/_kernel",
                                           "net/encoder/kernel")
    _, out, _ = _in_process(capsys, "inspect", a)
    assert out.index("_functional/") < out.index("optimizer/")
    assert re.search(r"\n      _kernel  \[net/encoder/kernel\] +\(4, 8\) +float32", out)
    assert "_trainable_variables" not in out
    assert re.search(r"\n  _variables/ +8 variables", out)
    assert re.search(r"\n    2  \[adam(_[0-9]+)?/net_encoder_kernel_momentum\] +\(4, 8\)", out)
    doc = json.loads(_in_process(capsys, "inspect", a, "--format", "json")[1])
    first = doc["variables"][0]
    assert first["path"] == "optimizer/_trainable_variables/0"
    assert first["network_path"] == "_functional/_operations/1/_kernel"
    assert first["name"] == "net/encoder/kernel"
    status, out, _ = _in_process(capsys, "diff", a, b)
    assert status == 1
    assert ("~ _functional/_operations/1/_kernel  [net/encoder/kernel]: max |a-b| 0.5 "
            "at 32 of 32 values") in out
    result = _diff.diff(a, b)
    assert [v.path for v in result.values] == ["optimizer/_trainable_variables/0"]


@pytest.mark.subprocess
def test_inspect_graph_and_diff_run_without_tensorflow(checkpoints, capsys):
    flavour = checkpoints[session_flavour()]
    for source in (flavour, checkpoints["directory"], checkpoints["tf1"],
                   checkpoints["sharded"]):
        blocked = _run("inspect", source, "--format", "json")
        assert blocked.returncode == 0, blocked.stderr
        assert json.loads(blocked.stdout) == json.loads(
            _in_process(capsys, "inspect", source, "--format", "json")[1])
    tree = objckpt.read_tree(flavour)
    doc = json.loads(_run("inspect", flavour, "--format", "json").stdout)
    assert {v["path"]: (v["shape"], v["dtype"], v["key"], v["name"]) for v in doc["variables"]} \
        == {p: (list(e.shape), e.dtype.name, e.key, e.name) for p, e in tree.items()}
    text = _run("inspect", checkpoints["directory"])
    assert text.stdout == _in_process(capsys, "inspect", checkpoints["directory"])[1]
    assert text.stdout.startswith(f"checkpoint {checkpoints['newest']}: ")
    dot = _run("graph", checkpoints["tf1"])
    assert dot.returncode == 0, dot.stderr
    assert dot.stdout == objckpt.graph(checkpoints["tf1"]).dot
    assert "name-based (TF1 Saver) checkpoint" in dot.stdout and 'label="emb' in dot.stdout
    diff = _run("diff", checkpoints["module"], checkpoints["sharded"], "--format", "json")
    assert diff.returncode == 1, diff.stderr
    assert json.loads(diff.stdout) == cli.diff_json(
        _diff.diff(checkpoints["module"], checkpoints["sharded"]))
    assert json.loads(diff.stdout)["only_in_b"] == ["a", "b"]


def test_diff_reads_every_value_kind_from_the_bytes(checkpoints, tmp_path):
    module = tf.Module()
    module.f32 = tf.Variable(np.array([[0, 1, 2], [3, 4, 5.5]], np.float32))
    module.bf16 = tf.Variable(tf.constant([1.5, -4.0], tf.bfloat16))
    module.text = tf.Variable([b"a\x00b", b"x", "é".encode()])
    module.flags = tf.Variable([True, True])
    module.counts = tf.Variable(np.array([-3, 2**40 + 7], np.int64))
    other = tf.train.Checkpoint(root=module).write(str(tmp_path / "other"))
    values = {v.path: v for v in _diff.diff(checkpoints["module"], other).values}
    assert values == {"f32": ("f32", 0.5, 1, 6), "bf16": ("bf16", 2.0, 1, 2),
                      "text": ("text", None, 1, 3), "flags": ("flags", 1.0, 1, 2),
                      "counts": ("counts", 7.0, 1, 2)}
    tf1 = _diff.diff(checkpoints["tf1"], checkpoints["tf1"])  # a partitioned variable: TF
    assert tf1.same and tf1.equal == 2


def _with_graph(tmp_path, name: str, graph: bytes) -> str:
    """A checkpoint whose object graph entry holds `graph` (framed and checksummed by TF)."""
    prefix = str(tmp_path / name)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=[_bundle.OBJECT_GRAPH_KEY, "v"],
                      shape_and_slices=["", ""], tensors=[tf.constant(graph), tf.constant(1.0)])
    return prefix


def _message(*fields) -> bytes:
    """Protobuf bytes of (field number, wire type, value) triples."""
    out = b""
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(value)
        else:
            out += _varint(len(value)) + value
    return out


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


_CHILD = _message((1, 0, 1), (2, 2, b"v"))
_VALUE = _message((1, 2, b"VARIABLE_VALUE"), (3, 2, b"v"))
_MALFORMED = {
    "truncated": (_message((1, 2, _message((1, 2, _CHILD))))[:-2],
                  "runs past the end"),
    "wire type": (_message((1, 0, 5)), "TrackableObjectGraph field 1 has wire type 0, "
                  "expected 2"),
    "not utf-8": (_message((1, 2, _message((1, 2, _message((1, 0, 1), (2, 2, b"\xff")))))),
                  "node 0: ObjectReference field 2 is not UTF-8"),
    "given twice": (_message((1, 2, _message((1, 2, _message((1, 0, 1), (1, 0, 1)))))),
                    "node 0: ObjectReference field 1 appears twice"),
    "group": (b"\x0b", "wire type 3"),
    "long varint": (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    "child out of range": (_message((1, 2, _message((1, 2, _CHILD))), (1, 2, _message(
        (1, 2, _message((1, 0, 7), (2, 2, b"w")))))), "-> node 7, outside 0..1"),
    "negative child": (_message((1, 2, _message((1, 2, _message((1, 0, -1), (2, 2, b"v")))))),
                       "-> node -1, outside 0..0"),
    "no nodes": (b"", "the object graph has no nodes"),
    "missing key": (_message((1, 2, _message((2, 2, _message((1, 2, b"VARIABLE_VALUE"),
                                                             (3, 2, b"w")))))),
                    "the object graph lists key `w` (node 0) but the index has no such tensor"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_a_malformed_object_graph_is_refused(tmp_path, case):
    data, problem = _MALFORMED[case]
    prefix = _with_graph(tmp_path, "bad", data)
    with pytest.raises(errors.CheckpointCorruptError, match=re.escape(problem)) as info:
        _objgraph.read_object_graph(prefix)
    assert f"Checkpoint `{prefix}`" in str(info.value)


def test_a_wellformed_crafted_graph_is_read(tmp_path):
    good = _message((1, 2, _message((1, 2, _CHILD), (99, 0, 3))), (1, 2, _message((2, 2, _VALUE))))
    graph = _objgraph.read_object_graph(_with_graph(tmp_path, "good", good))
    assert graph.nodes[0].children == (_objgraph.Reference(1, "v"),)  # field 99 skipped
    assert graph.nodes[1].attributes == (_objgraph.Attribute("VARIABLE_VALUE", "", "v"),)


def test_damaged_string_framing_and_checksums_are_refused(tmp_path):
    prefix = _with_graph(tmp_path, "framed", _message((1, 2, b"")))
    entry = _bundle.read_index(prefix).entries[_bundle.OBJECT_GRAPH_KEY]
    shard = prefix + ".data-00000-of-00001"
    with open(shard, "rb") as f:
        original = f.read()
    for at, problem in ((entry.offset + 1, "the checksum of its string lengths does not match"),
                        (entry.offset + entry.size - 1, "do not match their checksum (crc32c)")):
        damaged = bytearray(original)
        damaged[at] ^= 0x40
        with open(shard, "wb") as f:
            f.write(damaged)
        with pytest.raises(errors.CheckpointCorruptError, match=re.escape(problem)):
            _objgraph.read_object_graph(prefix)


def test_crc32c_of_large_data_equals_byte_by_byte():
    data = np.random.default_rng(0).bytes(8192 * 70 + 13)
    assert _objgraph.crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert _objgraph.crc32c(data) == _objgraph.crc32c(data[5:], _objgraph.crc32c(data[:5]))
    small = 0
    for start in range(0, len(data), 1000):  # below the lanes' threshold: byte by byte
        small = _objgraph.crc32c(data[start:start + 1000], small)
    assert _objgraph.crc32c(data) == small


@pytest.mark.subprocess
def test_tf_start_up_noise_is_filtered_and_errors_still_show(capfd, checkpoints):
    with _terminal.quiet_tf():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                    b"written to STDERR\nE0000 00:00 cuda_platform.cc:52] failed call to cuInit: "
                    b"INTERNAL\nE0000 a real problem\n")
    assert capfd.readouterr().err == "E0000 a real problem\n"
    result = _run("verify", checkpoints["module"], blocked=False)
    assert result.returncode == 0, result.stderr
    for noise in ("cuInit", "absl::InitializeLog", "oneDNN custom operations", "cudart_stub"):
        assert noise not in result.stderr
    assert result.stdout.startswith(f"OK: {checkpoints['module']}")


def test_errors_and_advice_speak_the_command_lines_words(checkpoints, capsys, monkeypatch,
                                                          tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` program
    status, _, err = _in_process(capsys, "graph", checkpoints["module"], "--out",
                                 tmp_path / "g.svg")
    assert status == 1
    assert "objckpt graph: Rendering SVG needs Graphviz's `dot` program" in err
    assert "(--format dot)" in err and "format='dot'" not in err
    _, dot, _ = _in_process(capsys, "graph", checkpoints[session_flavour()], "--depth", "1")
    assert "collapsed below depth 1 (--depth N to change)" in dot and "depth=N" not in dot
    advice = ("pass optimizer_state=True, at=\"model\" or rules=[('^model_001/', ''), "
              "('^global_step$', None)].")
    assert _terminal.cli_words(advice) == (
        'pass --optimizer-state true, --at model or --rules FILE holding [["^model_001/", ""], '
        '["^global_step$", null]].')


def test_inspect_says_when_a_directory_falls_back_to_an_older_checkpoint(tmp_path, capsys):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=build("module")),
                                         str(tmp_path), 2)
    older, newest = manager.save(), manager.save()
    os.remove(newest + ".data-00000-of-00001")
    status, out, err = _in_process(capsys, "inspect", tmp_path)
    assert status == 0 and out.startswith(f"checkpoint {older}: ")
    assert err.startswith(f"objckpt inspect: note: skipped `{newest}`: its data file")


def test_a_name_chained_thousands_of_edges_deep_is_refused_in_linear_time():
    """A name-based key of 50,000 `/`-separated edges: its graph is built in time linear in
    the name, and spelling every node's path (which repeats its parent's) stops with a typed
    error instead of gigabytes of text."""
    from objckpt._base import paths as _paths
    from objckpt._bundle import objgraph as _objgraph

    graph = _objgraph.name_graph(["a/" * 50_000 + "x", "b"])
    assert len(graph.nodes) == 50_003
    with pytest.raises(errors.CheckpointCorruptError, match="paths add up to more than"):
        _paths.walked_paths(graph)
    with pytest.raises(errors.CheckpointCorruptError, match="paths add up to more than"):
        _paths.graph_paths(graph)
    shallow = _paths.walked_paths(_objgraph.name_graph(["a/b/c", "a/d"]))
    assert sorted(shallow.values()) == ["", "a", "a/b", "a/b/c", "a/d"]
