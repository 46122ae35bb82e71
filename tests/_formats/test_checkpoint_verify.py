"""The TF checkpoint's verify role: every tensor read against its checksum and the object
graph checked, each problem named with its prefix; a directory checks what its state file
names."""

import os

import numpy as np
import tensorflow as tf

import objckpt
from objckpt._formats import checkpoint_verify as _verify


def _module(scale):
    module = tf.Module()
    module.w = tf.Variable(np.full((64,), scale, "float32"))
    module.b = tf.Variable(np.float32(scale))
    return module


def test_an_intact_prefix_counts_its_tensors_and_bytes(tmp_path):
    prefix = objckpt.save(_module(1.0), str(tmp_path / "ck"))
    checked = _verify.verify(prefix)
    assert checked.problems == () and checked.prefixes == (prefix,)
    assert checked.tensors >= 2 and checked.nbytes >= 65 * 4
    assert checked.checked == "passed their checksums; object graph consistent"


def test_a_flipped_byte_is_a_problem_of_its_prefix(tmp_path):
    prefix = objckpt.save(_module(1.0), str(tmp_path / "ck"))
    data = prefix + ".data-00000-of-00001"
    raw = bytearray(open(data, "rb").read())
    at = raw.find(np.float32(1.0).tobytes() * 8)
    raw[at] ^= 0xFF
    with open(data, "wb") as f:
        f.write(bytes(raw))
    checked = _verify.verify(prefix)
    assert checked.problems and all(p[0] == prefix for p in checked.problems)
    assert [p[1] for p in checked.problems] == ["w"], checked.problems


def test_a_directory_checks_every_checkpoint_its_state_file_names(tmp_path):
    module = _module(2.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=module), str(tmp_path), 3)
    first, second = manager.save(), manager.save()
    checked = _verify.verify(str(tmp_path))
    assert checked.prefixes == (first, second) and checked.problems == ()
    os.remove(second + ".index")
    missing = _verify.verify(str(tmp_path))
    assert any(second in " ".join(map(str, p)) for p in missing.problems), missing.problems
