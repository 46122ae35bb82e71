"""`objckpt.verify` / `objckpt verify`: checksums and object graph consistency."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

import legacy
from flavours import CASES, build, case_id
from support import run_cli

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
MARKER = np.arange(4096, dtype=np.float32) * 0.5 + 0.25  # 16 KB we can find in the data file


def _run(*args):
    return run_cli(*args, blocked=False)


def _module_checkpoint(prefix) -> str:
    module = tf.Module()
    module.block = tf.Module()
    module.block.big = tf.Variable(MARKER)
    module.block.b = tf.Variable(tf.ones((3,), tf.float64))
    module.step = tf.Variable(7, dtype=tf.int64)
    return tf.train.Checkpoint(root=module).write(str(prefix))


def _data_file(prefix) -> str:
    return prefix + ".data-00000-of-00001"


def _flip_byte_in(prefix, needle: bytes):
    path = _data_file(prefix)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    offset = data.find(needle)
    assert offset >= 0
    data[offset + len(needle) // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(data)


def _rewrite(prefix, out, mutate_graph=None, extra=None, drop=()):
    """Copies a checkpoint tensor by tensor, with an edited object graph and/or tensors."""
    reader = tf.train.load_checkpoint(prefix)
    graph = objckpt.read_tree(prefix).object_graph
    if mutate_graph is not None:
        mutate_graph(graph)
    keys, tensors = [GRAPH_KEY], [tf.constant(graph.SerializeToString())]
    for key in sorted(reader.get_variable_to_shape_map()):
        if key != GRAPH_KEY and key not in drop:
            keys.append(key)
            tensors.append(tf.constant(reader.get_tensor(key)))
    for key, value in (extra or {}).items():
        keys.append(key)
        tensors.append(tf.constant(value))
    tf.raw_ops.SaveV2(prefix=str(out), tensor_names=keys, shape_and_slices=[""] * len(keys),
                      tensors=tensors)
    return str(out)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_intact_checkpoints_of_every_flavour_pass(case, tmp_path):
    obj = build(*case)
    prefix = tf.train.Checkpoint(root=obj).write(str(tmp_path / "ck"))
    report = objckpt.verify(prefix)
    keys = [k for k, _ in tf.train.list_variables(prefix) if k != GRAPH_KEY]
    assert report.ok and report.problems == ()
    assert report.prefixes == (prefix,) and report.tensors == len(keys)
    expected = sum(int(np.prod(s)) * tf.as_dtype(d).size for s, d in (
        (tf.train.load_checkpoint(prefix).get_variable_to_shape_map()[k],
         tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()[k]) for k in keys))
    assert report.nbytes == expected
    assert report.describe().startswith(f"OK: {prefix}: {len(keys):,} tensors")


def test_bit_flip_in_a_tensor_names_its_object_path(tmp_path):
    prefix = _module_checkpoint(tmp_path / "ck")
    _flip_byte_in(prefix, MARKER.tobytes()[:4096])
    report = objckpt.verify(prefix)
    assert not report.ok and len(report.problems) == 1
    problem = report.problems[0]
    assert problem.prefix == prefix and problem.where == "block/big"
    assert "checksum" in problem.message.lower()
    assert report.tensors == 2  # block/b and step still intact
    text = report.describe()
    assert f"problem: {prefix}: `block/big`: tensor unreadable or checksum mismatch" in text
    assert text.splitlines()[-1].startswith(f"FAILED: {prefix}: 1 problem;")
    assert "Fix:" in text.splitlines()[-1]


def test_truncated_and_missing_data_files_and_a_damaged_index(tmp_path):
    truncated = _module_checkpoint(tmp_path / "truncated")
    size = os.path.getsize(_data_file(truncated))
    with open(_data_file(truncated), "r+b") as f:
        f.truncate(size // 2)
    report = objckpt.verify(truncated)
    assert not report.ok and report.tensors < 4
    assert any(p.where == "block/big" or p.where == GRAPH_KEY for p in report.problems)

    missing = _module_checkpoint(tmp_path / "missing")
    os.remove(_data_file(missing))
    report = objckpt.verify(missing)
    assert [p.message for p in report.problems] == [
        f"its data file `{_data_file(missing)}` is missing"]
    assert report.tensors == 0

    damaged = _module_checkpoint(tmp_path / "damaged")
    with open(damaged + ".index", "wb") as f:
        f.write(b"not an index" * 20)
    report = objckpt.verify(damaged)
    assert len(report.problems) == 1 and report.problems[0].where == damaged + ".index"
    assert "index file" in report.problems[0].message


def test_object_graph_inconsistencies_are_each_reported(tmp_path):
    good = _module_checkpoint(tmp_path / "good")
    assert objckpt.verify(good).ok

    def dangling_child(graph):
        graph.nodes[0].children.add(node_id=99, local_name="ghost")

    report = objckpt.verify(_rewrite(good, tmp_path / "dangling", dangling_child))
    count = len(objckpt.read_tree(good).object_graph.nodes)
    assert [(p.where, p.message) for p in report.problems] == [
        ("node 0", f"node 0 has child `ghost` -> node 99, outside 0..{count - 1}")]

    def unreachable(graph):
        graph.nodes.add()

    report = objckpt.verify(_rewrite(good, tmp_path / "unreachable", unreachable))
    assert len(report.problems) == 1
    assert "1 object graph node(s) are not reachable from the root" in report.problems[0].message

    key = "block/big/.ATTRIBUTES/VARIABLE_VALUE"
    report = objckpt.verify(_rewrite(good, tmp_path / "lost", drop={key}))
    assert len(report.problems) == 1 and report.problems[0].where == "block/big"
    assert report.problems[0].message.startswith(f"the object graph lists key `{key}` (node ")
    assert report.problems[0].message.endswith(") but the index has no such tensor")
    assert report.tensors == 2

    report = objckpt.verify(_rewrite(good, tmp_path / "orphan", extra={"stray/w": [1.0, 2.0]}))
    assert [(p.where, p.message) for p in report.problems] == [
        ("stray/w", "tensor in the index that no object of the object graph refers to")]
    assert report.tensors == 4  # the stray tensor itself reads fine


def test_directory_checks_every_checkpoint_its_state_file_names(tmp_path):
    module = tf.Module()
    module.w = tf.Variable(MARKER)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=module), str(tmp_path), 3)
    first, second = manager.save(), manager.save()
    report = objckpt.verify(tmp_path)
    assert report.ok and report.prefixes == (first, second) and report.tensors == 4
    _flip_byte_in(first, MARKER.tobytes()[:4096])
    report = objckpt.verify(tmp_path)
    assert [(p.prefix, p.where) for p in report.problems] == [(first, "w")]
    (tmp_path / "checkpoint").write_text("garbage {{{")
    report = objckpt.verify(tmp_path)
    state = str(tmp_path / "checkpoint")
    assert report.problems[0].prefix == state and "cannot be parsed" in report.problems[0].message
    assert [(p.prefix, p.where) for p in report.problems[1:]] == [(first, "w")]
    assert set(report.prefixes) == {first, second}


def test_name_based_checkpoint_checks_tensors_only(tmp_path_factory):
    tf1 = legacy.cached_tf1_checkpoint(tmp_path_factory)
    report = objckpt.verify(tf1["prefix"])
    assert report.ok and report.tensors == len(tf1["names"])
    assert any("name-based (TF1 Saver) checkpoint" in note for note in report.notes)


def test_nothing_there_raises_not_found(tmp_path):
    with pytest.raises(errors.CheckpointNotFoundError, match="No checkpoint at prefix"):
        objckpt.verify(tmp_path / "nothing")
    with pytest.raises(errors.CheckpointNotFoundError, match="holds no checkpoint"):
        objckpt.verify(tmp_path)


@pytest.mark.subprocess
def test_command_line_exit_status_and_report(tmp_path):
    good = _module_checkpoint(tmp_path / "good")
    bad = _module_checkpoint(tmp_path / "bad")
    _flip_byte_in(bad, MARKER.tobytes()[:4096])
    ok = _run("verify", good)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == objckpt.verify(good).describe()
    failed = _run("verify", bad)
    assert failed.returncode == 1
    assert f"problem: {bad}: `block/big`: tensor unreadable or checksum mismatch" in failed.stdout
    missing = _run("verify", str(tmp_path / "nothing"))
    assert missing.returncode == 1
    assert f"objckpt verify: No checkpoint at prefix `{tmp_path / 'nothing'}`" in missing.stderr
