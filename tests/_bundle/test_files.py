"""Checkpoint files (`objckpt._bundle.files`): the atomic write-and-commit, data shards by
TF's names only, regular files checked without opening them, and the prefixes a state file
may name."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate


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
