"""The `checkpoint` state file (`objckpt._bundle.state`): what it writes TF reads, and its
problems are typed errors."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from objckpt import errors
from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate


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
