"""The low layers on their own: path grammar, text rendering, checkpoint files."""

from __future__ import annotations

import os
import types

import pytest
import tensorflow as tf

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate


@pytest.mark.parametrize("name", ["kernel", "a.b", "a/b", "..S", "./.", ".", "S", ""])
def test_escape_round_trips_and_matches_tf(name):
    from tensorflow.python.trackable import trackable_utils  # the oracle: TF's own escaping

    assert _paths.escape(name) == trackable_utils.escape_local_name(name)
    assert _paths.unescape(_paths.escape(name)) == name


def test_slot_paths_split_and_join():
    path = _paths.slot_path("dense/kernel", "optimizer", "m")
    assert path == "dense/kernel/.OPTIMIZER_SLOT/optimizer/m"
    assert _paths.split_slot(path) == ("dense/kernel", "optimizer", "m")
    assert _paths.split_slot("dense/kernel") is None
    assert _paths.path_of_key(_paths.checkpoint_key("a/b")) == "a/b"


def _proto(edges: dict[int, list[tuple[str, int]]], count: int):
    nodes = [types.SimpleNamespace(children=[types.SimpleNamespace(local_name=n, node_id=i)
                                             for n, i in edges.get(k, [])])
             for k in range(count)]
    return types.SimpleNamespace(nodes=nodes)


def test_graph_paths_are_breadth_first_shortest_and_escaped():
    # 0 -> a(1) -> deep(3) -> x(4); 0 -> b.c(2) -> x(4) again: x's first path is via b.c
    proto = _proto({0: [("a", 1), ("b.c", 2)], 1: [("deep", 3)], 2: [("x", 4)],
                    3: [("x", 4)]}, 5)
    assert _paths.graph_paths(proto) == {0: "", 1: "a", 2: "b..c", 3: "a/deep",
                                         4: "b..c/x"}
    assert _paths.graph_paths(proto, 1) == {1: "", 3: "deep", 4: "deep/x"}
    pruned = _paths.graph_paths(proto, skip=lambda node, name: name == "b.c")
    assert pruned == {0: "", 1: "a", 3: "a/deep", 4: "a/deep/x"}



def test_graph_walk_defers_follows_slots_and_ignores_ids_outside_the_graph():
    # 0 -> opt(1) -> vars(3) -> w(4); 0 -> layer(2) -> w(4): deferring `opt` gives w its
    # path through the layer, as `objckpt.graph` draws a trained Keras 3 model.
    proto = _proto({0: [("opt", 1), ("layer", 2), ("bad", 99), ("neg", -1)],
                    1: [("vars", 3)], 2: [("w", 4)], 3: [("w", 4)]}, 6)
    for node in proto.nodes:
        node.slot_variables = []
    proto.nodes[1].slot_variables = [types.SimpleNamespace(slot_name="m",
                                                           slot_variable_node_id=5)]
    plain = list(_paths.graph_walk(proto))
    assert plain == [(0, "opt", 1), (0, "layer", 2), (1, "vars", 3), (2, "w", 4)]
    deferred = list(_paths.graph_walk(proto, defer=lambda node, name: name == "opt"))
    assert deferred == [(0, "layer", 2), (2, "w", 4), (0, "opt", 1), (1, "vars", 3)]
    with_slots = list(_paths.graph_walk(proto, slots=True))
    assert with_slots == [*plain[:3], (1, "m", 5), (2, "w", 4)]


def test_rendering():
    assert [_render.size(n) for n in (0, 999, 1000, 1_500_000, 3e12)] == [
        "0 B", "999 B", "1.0 KB", "1.5 MB", "3000.0 GB"]
    assert [_render.shape(s) for s in ((), (3,), (2, 3))] == ["()", "(3,)", "(2, 3)"]
    assert _render.count(1, "variable") == "1 variable"
    assert _render.count(1234, "variable") == "1,234 variables"
    assert _render.elements((2, 3, 4)) == 24 and _render.elements(()) == 1
    assert _render.mb(12_345_678) == "12.3 MB"
    assert _render.listed(["a", "b", "c"], limit=2) == ["  - a", "  - b", "  - ... and 1 more"]
    assert _render.first_line(ValueError("first\nsecond")) == "first"
    assert _render.first_line(ValueError("")) == "ValueError"


def test_state_file_written_here_is_read_by_tf_and_by_us(tmp_path):
    for number in (1, 2, 3):
        (tmp_path / f"ckpt-{number}.index").write_bytes(b"")
    _ckptstate.write_state(str(tmp_path), ["ckpt-1", "ckpt-2", "ckpt-3"], 1700000000.5)
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert os.path.basename(state.model_checkpoint_path) == "ckpt-3"
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-1", "ckpt-2", "ckpt-3"]
    assert _ckptstate.read_state(str(tmp_path)).names == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert _files.state_candidates(str(tmp_path)) == [
        str(tmp_path / name) for name in ("ckpt-3", "ckpt-2", "ckpt-1")]
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []  # no debris


def test_state_file_problems_are_typed(tmp_path):
    with pytest.raises(errors.CheckpointNotFoundError, match="holds no managed checkpoints"):
        _ckptstate.read_state(str(tmp_path))
    (tmp_path / "checkpoint").write_text("model_checkpoint_path: ")
    with pytest.raises(errors.CheckpointCorruptError, match="cannot be parsed"):
        _ckptstate.read_state(str(tmp_path))
    (tmp_path / "checkpoint").write_text("")
    with pytest.raises(errors.CheckpointCorruptError, match="names no checkpoint"):
        _ckptstate.read_state(str(tmp_path))


def test_write_tensors_commits_atomically_and_calls_each_stage(tmp_path):
    prefix = str(tmp_path / "sub" / "ck")
    stages = []
    _files.write_tensors(prefix, ["a", "b"], [tf.constant([1.0, 2.0]), tf.constant(3)],
                         stage=stages.append)
    assert stages == ["write", "data", "index"]
    assert sorted(os.listdir(tmp_path / "sub")) == ["ck.data-00000-of-00001", "ck.index"]
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_tensor("a").tolist() == [1.0, 2.0] and int(reader.get_tensor("b")) == 3
    assert _files.check_intact(prefix) is None

    def crash(name):
        if name == "data":
            raise KeyboardInterrupt("killed before the commit")

    with pytest.raises(KeyboardInterrupt):
        _files.write_tensors(prefix, ["a"], [tf.constant([9.0])], stage=crash)
    # the old checkpoint is intact and nothing else is left behind
    assert sorted(os.listdir(tmp_path / "sub")) == ["ck.data-00000-of-00001", "ck.index"]
    assert tf.train.load_checkpoint(prefix).get_tensor("a").tolist() == [1.0, 2.0]


def test_data_shards_are_tf_names_only_and_complete_for_one_count(tmp_path):
    prefix = str(tmp_path / "ck")
    _files.write_tensors(prefix, ["a"], [tf.constant([1.0])])
    data = (tmp_path / "ck.data-00000-of-00001").read_bytes()
    # Stray files are not shards: they neither complete nor spoil a checkpoint.
    for stray in ["ck.data-00000-of-00001.bak", "ck.data-00000-of-00001.tempstate8234723",
                  "ck.data-00000-of-00001\n", "ck.data-0000\u0661-of-00001",
                  "ck.data-000000-of-00001", "ck.data-00001-of-00002.old", "ck.data-"]:
        (tmp_path / stray).write_bytes(data)
    assert [(os.path.basename(p), i, n) for p, i, n in _files.data_shards(prefix)] == [
        ("ck.data-00000-of-00001", 0, 1)]
    assert _files.data_files_problem(prefix) is None and _files.check_intact(prefix) is None
    # A leftover shard of another count does not spoil the complete set (the index says
    # which count it uses: its validation checks that set).
    (tmp_path / "ck.data-00001-of-00002").write_bytes(data)
    assert _files.data_files_problem(prefix) is None and _files.check_intact(prefix) is None
    os.remove(tmp_path / "ck.data-00000-of-00001")
    assert _files.data_files_problem(prefix) == (
        f"it has 1 of 2 data shards (`{prefix}.data-00000-of-00002` is missing)")
    os.mkfifo(tmp_path / "ck.data-00000-of-00002")
    assert _files.data_files_problem(prefix) == (
        f"`{prefix}.data-00000-of-00002` is a FIFO (named pipe), not a regular file")
    os.remove(tmp_path / "ck.data-00001-of-00002")
    assert _files.data_files_problem(prefix).endswith("ck.data-00001-of-00002` is missing)")
    for name in os.listdir(tmp_path):
        if name.startswith("ck.data-"):
            os.remove(tmp_path / name)
    assert _files.data_files_problem(prefix) == (
        f"its data file `{prefix}.data-00000-of-00001` is missing")


def test_regular_file_problem_names_what_is_there_without_opening_it(tmp_path):
    (tmp_path / "file").write_bytes(b"12345")
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/null", tmp_path / "null")
    problem = _files.regular_file_problem
    assert problem(str(tmp_path / "file")) is None
    assert problem(str(tmp_path / "file"), limit=4) == (
        f"`{tmp_path / 'file'}` is 5 bytes, more than the 4 such a file can sensibly be")
    assert problem(str(tmp_path / "fifo")) == (
        f"`{tmp_path / 'fifo'}` is a FIFO (named pipe), not a regular file")
    assert problem(str(tmp_path / "null")) == (
        f"`{tmp_path / 'null'}` (a symbolic link to `/dev/null`) is a character device, not a "
        "regular file")
    assert problem(str(tmp_path)) == f"`{tmp_path}` is a directory, not a regular file"
    assert problem(str(tmp_path / "none")) == f"`{tmp_path / 'none'}` does not exist"
    assert problem(str(tmp_path / "a\x1b[2Jb")) == f"`{tmp_path}/a\\x1b[2Jb` does not exist"


def test_commit_in_a_directory_with_glob_characters_leaves_stray_files(tmp_path):
    # Files are listed, not globbed: the data used to stay under its temporary name here.
    # (TF's own reader globs the prefix, so it cannot read a checkpoint under such a path.)
    reference = str(tmp_path / "plain" / "ck")
    _files.write_tensors(reference, ["a"], [tf.constant([2.0])])
    directory = tmp_path / "run[1]*"
    prefix = str(directory / "ck")
    _files.write_tensors(prefix, ["a"], [tf.constant([1.0])])
    (directory / "ck.data-00000-of-00001.bak").write_bytes(b"keep me")
    _files.write_tensors(prefix, ["a"], [tf.constant([2.0])])  # over the old one
    assert sorted(os.listdir(directory)) == [
        "ck.data-00000-of-00001", "ck.data-00000-of-00001.bak", "ck.index"]
    for suffix in (".index", _files.DATA_SUFFIX):
        with open(prefix + suffix, "rb") as ours, open(reference + suffix, "rb") as plain:
            assert ours.read() == plain.read()
    assert (directory / "ck.data-00000-of-00001.bak").read_bytes() == b"keep me"


def test_state_prefixes_stay_inside_the_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    os.symlink("/tmp", tmp_path / "out")
    _ckptstate.write_state(str(tmp_path), ["/elsewhere/ckpt-1", "../x/ckpt-2", "out/ckpt-3",
                                       "sub/ckpt-4", str(tmp_path / "ckpt-5"), "ckpt-6"], 1.0)
    prefixes, notes = _files.state_prefixes(str(tmp_path))
    assert prefixes == [str(tmp_path / "ckpt-6"), str(tmp_path / "ckpt-5"),
                        str(tmp_path / "sub" / "ckpt-4")]
    assert [n.split("`")[1] for n in notes] == ["out/ckpt-3", "../x/ckpt-2", "/elsewhere/ckpt-1"]
    assert all("outside the directory" in n and "explicitly" in n for n in notes)
    assert _files.state_candidates(str(tmp_path)) == prefixes
