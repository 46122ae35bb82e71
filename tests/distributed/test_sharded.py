"""Sharded variables (`ShardedVariable`, what ParameterServerStrategy with a partitioner makes)
as one logical variable: `tree`, `snapshot`, `save`, `restore`, `plan`, `migrate` and
`restore_on_create` see it whole; checkpoints are laid out as `tf.train.Checkpoint` writes them
(one key, one slice per shard), read both ways, and reshard from N into M shards.

The sharded variables here are made directly on this process's CPU (TF has no public maker
outside a cluster); tests/distributed/test_sharded_cluster.py runs a real one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt import errors
from objckpt._bundle import index as _index

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"


def full_value(seed: int, rows: int = 10, cols: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, cols)).astype("float32")


def sharded_module(rows, value: np.ndarray) -> tf.Module:
    """A module holding `table`, a ShardedVariable of `value` in shards of `rows` rows, and
    a plain `bias`."""
    assert sum(rows) == value.shape[0]
    module = tf.Module()
    parts, start = [], 0
    for count in rows:
        parts.append(tf.Variable(value[start:start + count]))
        start += count
    module.table = sharded_variable.ShardedVariable(parts, name="table")
    module.bias = tf.Variable(np.arange(value.shape[1], dtype="float32"))
    return module


def logical(module) -> np.ndarray:
    """The table's value, read shard by shard without objckpt (the test's own oracle)."""
    return np.concatenate([part.numpy() for part in module.table.variables])


def shard_bytes(module) -> list[bytes]:
    return [part.numpy().tobytes() for part in module.table.variables]


def slices_of(prefix: str) -> tuple:
    """The slices the index lists for the table's key (none: stored whole)."""
    return tuple(sorted(_index.read_index(prefix).entries[KEY].slices))


RESHARD = [((10,), (5, 5)), ((5, 5), (3, 3, 4)), ((3, 3, 4), (10,)), ((2, 3, 3, 2), (6, 4))]


def test_tree_shows_a_sharded_variable_whole_with_its_layout():
    value = full_value(0)
    module = sharded_module((6, 4), value)
    tree = objckpt.tree(module)
    assert set(tree) == {"bias", "table"}
    assert tree["table"] is module.table
    assert tuple(tree["table"].shape) == (10, 4)
    layout = objckpt._compat.shard_layout(tree["table"])
    assert layout.rows == (6, 4) and layout.offsets == (0, 6)
    assert layout.describe() == "2 shards of rows [0:6) [6:10)"
    assert objckpt.tree(tf.train.Checkpoint(model=module)).keys() == {"model/bias",
                                                                      "model/table"}


def test_snapshot_holds_the_logical_value():
    value = full_value(1)
    module = sharded_module((3, 3, 4), value)
    snap = objckpt.snapshot(module)
    assert snap["table"].numpy().tobytes() == value.tobytes()
    module.table.variables[1].assign(tf.zeros((3, 4)))
    assert snap["table"].numpy().tobytes() == value.tobytes()  # later writes leave it


@pytest.mark.parametrize("rows", [(10,), (5, 5), (3, 3, 4)])
def test_save_writes_what_tf_writes(rows, tmp_path):
    value = full_value(2)
    module = sharded_module(rows, value)
    ours = objckpt.save(module, str(tmp_path / "ours"))
    theirs = tf.train.Checkpoint(root=module).write(str(tmp_path / "tf"))
    assert dict(tf.train.list_variables(ours)) == dict(tf.train.list_variables(theirs))
    assert slices_of(ours) == slices_of(theirs)
    assert len(slices_of(ours)) == (len(rows) if len(rows) > 1 else 0)
    assert tf.train.load_checkpoint(ours).get_tensor(KEY).tobytes() == value.tobytes()
    # A Snapshot's save is laid out like its obj's.
    snapped = objckpt.save(objckpt.snapshot(module), str(tmp_path / "snap"))
    assert slices_of(snapped) == slices_of(theirs)
    assert tf.train.load_checkpoint(snapped).get_tensor(KEY).tobytes() == value.tobytes()


@pytest.mark.parametrize("saved, restored", RESHARD)
def test_tf_reads_objckpt_into_any_shard_count(saved, restored, tmp_path):
    value = full_value(3)
    prefix = objckpt.save(sharded_module(saved, value), str(tmp_path / "ck"))
    target = sharded_module(restored, np.zeros_like(value))
    tf.train.Checkpoint(root=target).read(prefix).assert_consumed()
    assert logical(target).tobytes() == value.tobytes()
    assert [p.shape[0] for p in target.table.variables] == list(restored)


@pytest.mark.parametrize("saved, restored", RESHARD)
def test_objckpt_reads_tf_into_any_shard_count(saved, restored, tmp_path):
    value = full_value(4)
    prefix = tf.train.Checkpoint(root=sharded_module(saved, value)).write(str(tmp_path / "ck"))
    target = sharded_module(restored, np.zeros_like(value))
    report = objckpt.restore(target, prefix)
    assert sorted(report.restored) == ["bias", "table"]
    assert logical(target).tobytes() == value.tobytes()
    # ...and from a Snapshot of the other layout, and back from objckpt's own save.
    again = sharded_module(restored, np.ones_like(value))
    objckpt.restore(again, objckpt.snapshot(sharded_module(saved, value)))
    assert logical(again).tobytes() == value.tobytes()
    back = sharded_module(saved, np.zeros_like(value))
    objckpt.restore(back, objckpt.save(target, str(tmp_path / "back")))
    assert logical(back).tobytes() == value.tobytes()


def test_sharded_and_unsharded_move_both_ways(tmp_path):
    """A sharded table restores into a plain variable (serving on one machine) and back."""
    value = full_value(5)
    plain = tf.Module()
    plain.table = tf.Variable(tf.zeros((10, 4)))
    plain.bias = tf.Variable(tf.zeros((4,)))
    objckpt.restore(plain, objckpt.save(sharded_module((4, 6), value), str(tmp_path / "a")))
    assert plain.table.numpy().tobytes() == value.tobytes()
    target = sharded_module((7, 3), np.zeros_like(value))
    objckpt.restore(target, objckpt.save(plain, str(tmp_path / "b")))
    assert logical(target).tobytes() == value.tobytes()


def test_a_failed_restore_changes_no_shard(tmp_path):
    value = full_value(6)
    source = tf.Module()
    source.table = tf.Variable(value)
    source.bias = tf.Variable(tf.zeros((5,)))  # the model's bias has 4
    prefix = objckpt.save(source, str(tmp_path / "bad"))
    target = sharded_module((3, 3, 4), full_value(7))
    before = shard_bytes(target)
    bias_before = target.bias.numpy().tobytes()
    with pytest.raises(errors.StructureMismatchError, match="bias") as caught:
        objckpt.restore(target, prefix)
    assert "(5,)" in str(caught.value) and "(4,)" in str(caught.value)
    assert shard_bytes(target) == before
    assert target.bias.numpy().tobytes() == bias_before


def test_a_table_of_another_shape_is_a_typed_error_naming_it(tmp_path):
    prefix = objckpt.save(sharded_module((5, 5), full_value(8)), str(tmp_path / "ck"))
    target = sharded_module((4, 4), full_value(9, rows=8))
    before = shard_bytes(target)
    with pytest.raises(errors.StructureMismatchError, match="table") as caught:
        objckpt.restore(target, prefix)
    message = str(caught.value)
    assert "(10, 4)" in message and "(8, 4)" in message
    assert shard_bytes(target) == before


def test_plan_shows_the_layout_beside_the_variable(tmp_path):
    prefix = objckpt.save(sharded_module((5, 5), full_value(10)), str(tmp_path / "ck"))
    the_plan = objckpt.plan(sharded_module((2, 3, 5), full_value(11)), prefix)
    assert the_plan.complete
    row = next(line for line in the_plan.describe().splitlines()
               if line.strip().startswith("table"))
    assert "3 shards of rows [0:2) [2:5) [5:10)" in row


def test_migrate_writes_a_checkpoint_tf_restores_into_shards(tmp_path):
    value = full_value(12)
    plain = tf.Module()
    plain.table = tf.Variable(value)
    plain.bias = tf.Variable(tf.ones((4,)))
    source = objckpt.save(plain, str(tmp_path / "plain"))
    target = sharded_module((5, 5), np.zeros_like(value))
    out = objckpt.migrate(target, source, str(tmp_path / "mig"))
    fresh = sharded_module((1, 9), np.zeros_like(value))
    tf.train.Checkpoint(root=fresh).read(out).assert_consumed()
    assert logical(fresh).tobytes() == value.tobytes()
    assert logical(target).tobytes() == np.zeros_like(value).tobytes()  # migrate assigns nothing


def test_restore_on_create_lands_in_shards_now_and_later(tmp_path):
    value = full_value(13)
    prefix = objckpt.save(sharded_module((5, 5), value), str(tmp_path / "ck"))
    existing = sharded_module((3, 7), np.zeros_like(value))
    pending = objckpt.restore_on_create(existing, prefix)
    assert pending.done and logical(existing).tobytes() == value.tobytes()
    later = tf.Module()
    pending = objckpt.restore_on_create(later, prefix)
    later.bias = tf.Variable(tf.zeros((4,)))
    assert pending.pending == ("table",)
    later.table = sharded_variable.ShardedVariable(
        [tf.Variable(tf.zeros((4, 4))), tf.Variable(tf.zeros((6, 4)))])
    pending.assert_done()
    assert logical(later).tobytes() == value.tobytes()


def test_a_background_save_takes_the_shards_at_the_call(tmp_path):
    value = full_value(14)
    module = sharded_module((5, 5), value)
    bias = module.bias.numpy()
    handle = objckpt.save(module, str(tmp_path / "bg"), blocking=False)
    module.table.variables[0].assign(tf.zeros((5, 4)))
    module.bias.assign(tf.zeros((4,)))
    prefix = handle.result()
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_tensor(KEY).tobytes() == value.tobytes()
    assert reader.get_tensor("bias/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == bias.tobytes()
    assert os.path.exists(prefix + ".index")


def test_clone_copies_shard_by_shard():
    value = full_value(15)
    module = sharded_module((3, 3, 4), value)
    copy = objckpt.clone(module)
    assert type(copy.table) is type(module.table)
    assert [p.shape[0] for p in copy.table.variables] == [3, 3, 4]
    assert [p.device for p in copy.table.variables] == [p.device for p in module.table.variables]
    assert logical(copy).tobytes() == value.tobytes()
    assert not {id(p) for p in copy.table.variables} & {id(p) for p in module.table.variables}
    module.table.variables[0].assign(tf.zeros((3, 4)))
    assert logical(copy).tobytes() == value.tobytes()  # independent
    empty = objckpt.clone(module, copy_values=False)
    assert not logical(empty).any()


def test_twins_copy_blend_and_swap_shard_by_shard():
    current = sharded_module((5, 5), full_value(16))
    twins = objckpt.Twins(current)
    old = logical(twins.past)
    new = full_value(17)
    for part, start in zip(current.table.variables, (0, 5)):
        part.assign(new[start:start + 5])
    twins.sync(tau=0.25)
    tau = np.float32(0.25)
    expected = old + tau * (new - old)  # the Polyak update's NumPy reference
    np.testing.assert_allclose(logical(twins.past), expected, rtol=1e-6, atol=1e-6)
    twins.sync()
    assert logical(twins.past).tobytes() == new.tobytes()
    other = full_value(18)
    for part, start in zip(current.table.variables, (0, 5)):
        part.assign(other[start:start + 5])
    twins.swap()
    assert logical(twins.current).tobytes() == new.tobytes()
    assert logical(twins.past).tobytes() == other.tobytes()


def test_twins_of_other_layouts_name_both():
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.Twins(sharded_module((5, 5), full_value(19)),
                      past=sharded_module((2, 8), full_value(20)))
    message = str(caught.value)
    assert "`table`: 2 shards of rows [0:5) [5:10) in current but " \
           "2 shards of rows [0:2) [2:10) in past" in message
