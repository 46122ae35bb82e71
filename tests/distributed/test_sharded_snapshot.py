"""`objckpt.snapshot` of sharded variables keeps each shard's value where the shard lives (a
`ShardedValue`: the shards' values and their layout), never the table joined on this host;
restoring such a Snapshot assigns shard by shard (the same layout) or reshards one target
shard's rows at a time (another layout, an unsharded source or target), all or nothing. The
Snapshot still shows the variable whole (one path, its logical shape, dtype and nbytes), and
whatever needs one tensor gets the shards joined.

The sharded variables here live on this process's CPU (tests/distributed/test_sharded.py
makes them); test_sharded_snapshot_cluster runs parameter servers
(tests/helpers/pss_snapshot_worker.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt import errors
from objckpt._compat import sharded as _sharded

import flavours
from tests._formats.test_safetensors_stream import _PeakAnon as _SampledAnon
from tests.distributed.test_sharded import (
    full_value,
    logical,
    shard_bytes,
    sharded_module,
    slices_of,
)

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")

# (layout of the snapshot's model, layout restored into): None is a plain tf.Variable.
CASES = [((10,), (10,)), ((5, 5), (5, 5)), ((5, 5), (3, 3, 4)), ((3, 3, 4), (10,)),
         ((3, 3, 4), None), (None, (5, 5))]


def module_of(rows, value: np.ndarray) -> tf.Module:
    """`sharded_module`, or with rows None a module whose `table` is one plain variable."""
    if rows is not None:
        return sharded_module(rows, value)
    module = tf.Module()
    module.table = tf.Variable(value)
    module.bias = tf.Variable(np.arange(value.shape[1], dtype="float32"))
    return module


def table_of(module) -> np.ndarray:
    """The table's value, read shard by shard without objckpt."""
    table = module.table
    return logical(module) if isinstance(table, sharded_variable.ShardedVariable) \
        else table.numpy()


def train(module, steps: int = 2) -> None:
    """Plain SGD steps on a lookup loss: the gradient of each shard computed by TF, applied
    shard by shard (the table, whatever its layout, and the bias change)."""
    table = module.table
    parts = list(table.variables) if isinstance(table, sharded_variable.ShardedVariable) \
        else [table]
    ids = tf.constant([0, 3, 4, 7, 9, 9])
    for _ in range(steps):
        with tf.GradientTape() as tape:
            rows = tf.nn.embedding_lookup(table, ids)
            loss = tf.reduce_sum((rows + module.bias) ** 2)
        grads = tape.gradient(loss, [*parts, module.bias])
        for variable, grad in zip([*parts, module.bias], grads):
            variable.assign_sub(0.05 * tf.convert_to_tensor(grad))


@pytest.fixture
def joins(monkeypatch):
    """Every `ShardedValue.join` (the shards joined into one tensor, also by
    `tf.convert_to_tensor`): the device asked for."""
    seen = []
    real = _sharded.ShardedValue.join

    def spy(self, device=None):
        seen.append(device)
        return real(self, device)

    monkeypatch.setattr(_sharded.ShardedValue, "join", spy)
    return seen


def test_a_snapshot_holds_each_shard_where_it_lives_and_shows_the_variable_whole():
    value = full_value(1)
    module = sharded_module((3, 3, 4), value)
    snap = objckpt.snapshot(module)
    held = snap["table"]
    assert sorted(snap) == ["bias", "table"] and isinstance(held, _sharded.ShardedValue)
    assert len(held.shards) == 3 and held.layout.rows == (3, 3, 4)
    assert held.layout.describe() == "3 shards of rows [0:3) [3:6) [6:10)"
    assert [s.device for s in held.shards] == [p.device for p in module.table.variables]
    # each shard is its variable's buffer, not a copy
    for shard, part in zip(held.shards, module.table.variables):
        assert shard.numpy().tobytes() == part.numpy().tobytes()
        assert (np.asarray(shard).__array_interface__["data"][0]
                == np.asarray(part.read_value()).__array_interface__["data"][0])
    # one logical tensor: shape, dtype, nbytes counted once
    assert held.shape == tf.TensorShape((10, 4)) and held.dtype == tf.float32
    assert held.nbytes == value.nbytes and len(held) == 10 and held.ndim == 2
    assert snap.nbytes == value.nbytes + 4 * 4
    # what needs one tensor gets the shards joined
    assert tf.convert_to_tensor(held).numpy().tobytes() == value.tobytes()
    assert np.asarray(held).tobytes() == value.tobytes()
    assert snap.numpy()["table"].tobytes() == value.tobytes()
    assert (held * 2).numpy().tobytes() == (value * 2).tobytes()
    assert tf.reduce_sum(held).numpy() == np.float32(tf.reduce_sum(value).numpy())
    # a run of rows joins only the shards holding them; exactly one shard is that shard
    assert held[3:6] is held.shards[1]
    assert held[2:7].numpy().tobytes() == value[2:7].tobytes()
    assert held[:, 1:3].numpy().tobytes() == value[:, 1:3].tobytes()
    # later writes leave it
    module.table.variables[1].assign(tf.zeros((3, 4)))
    assert np.asarray(held).tobytes() == value.tobytes()


def test_a_snapshot_taken_without_joining_any_shard(joins):
    snap = objckpt.snapshot(sharded_module((5, 5), full_value(2)))
    assert isinstance(snap["table"], _sharded.ShardedValue)
    again = objckpt.Snapshot(dict(snap))  # a ShardedValue stays as it is
    assert again["table"] is snap["table"]
    assert joins == []


@pytest.mark.parametrize("saved, restored", CASES)
def test_snapshot_train_restore_is_bit_exact_in_any_layout(saved, restored, joins):
    value = full_value(3)
    source = module_of(saved, value)
    train(source)
    table, bias = table_of(source), source.bias.numpy()
    snap = objckpt.snapshot(source)
    train(source)  # the snapshot keeps the values it was taken with
    assert table_of(source).tobytes() != table.tobytes()
    target = source if restored == saved else module_of(restored, full_value(4))
    for _ in range(3):  # the first restore, then the cached plan or the tree's traced route
        report = objckpt.restore(target, snap)
        assert sorted(report.restored) == ["bias", "table"]
        assert table_of(target).tobytes() == table.tobytes()
        assert target.bias.numpy().tobytes() == bias.tobytes()
        train(target)
    if restored is not None:  # never joined on this host for a sharded target
        assert joins == []
        assert [p.shape[0] for p in target.table.variables] == list(restored)
    else:  # a plain variable here: joined once per restore, here
        assert joins == [target.table.device] * 3


def test_a_snapshot_restores_into_the_shards_devices_without_a_copy_on_the_same_layout():
    value = full_value(5)
    module = sharded_module((5, 5), value)
    snap = objckpt.snapshot(module)
    train(module)
    assigned = []
    real = _sharded.HeldLoader._one

    def spy(self, variable, rows):
        assigned.append((variable.name, rows is snap["table"].shards[0]
                         or rows is snap["table"].shards[1], tuple(rows.shape)))
        return real(self, variable, rows)

    _sharded.HeldLoader._one = spy
    try:
        objckpt.restore(module, snap)
    finally:
        _sharded.HeldLoader._one = real
    # each shard given the snapshot's shard itself (no rows assembled), then the bias
    names = [p.name for p in module.table.variables]
    assert assigned[:2] == [(names[0], True, (5, 4)), (names[1], True, (5, 4))]
    assert logical(module).tobytes() == value.tobytes()


def test_resharding_assembles_one_target_shard_at_a_time(monkeypatch):
    value = full_value(6, rows=12)
    snap = objckpt.snapshot(sharded_module((6, 6), value))
    target = sharded_module((4, 4, 4), np.zeros_like(value))
    rows_given = []
    real = _sharded.shard_rows

    def spy(held, start, stop, device=None, axis=0):
        out = real(held, start, stop, device, axis)
        rows_given.append((start, stop, tuple(out.shape)))
        return out

    monkeypatch.setattr(_sharded, "shard_rows", spy)
    objckpt.restore(target, snap)
    assert rows_given == [(0, 4, (4, 4)), (4, 8, (4, 4)), (8, 12, (4, 4))]
    assert logical(target).tobytes() == value.tobytes()


def test_plan_shows_the_held_layout_and_the_target_layout():
    snap = objckpt.snapshot(sharded_module((5, 5), full_value(7)))
    the_plan = objckpt.plan(sharded_module((2, 3, 5), full_value(8)), snap)
    assert the_plan.complete
    row = next(line for line in the_plan.describe().splitlines()
               if line.strip().startswith("table"))
    assert "3 shards of rows [0:2) [2:5) [5:10)" in row
    assert "held in 2 shards of rows [0:5) [5:10)" in row


def test_a_failing_restore_from_a_snapshot_changes_no_shard():
    """A value that does not fit (checked before anything is assigned), and an assignment
    failing half way through the shards (the undo log puts every shard back)."""
    value = full_value(9)
    snap = objckpt.snapshot(sharded_module((5, 5), value))
    target = sharded_module((3, 3, 4), full_value(10))
    before, bias_before = shard_bytes(target), target.bias.numpy().tobytes()
    bad = objckpt.Snapshot({"table": snap["table"], "bias": np.zeros(5, "float32")})
    with pytest.raises(errors.StructureMismatchError, match="bias"):
        objckpt.restore(target, bad)
    assert shard_bytes(target) == before and target.bias.numpy().tobytes() == bias_before
    calls = []
    real = _sharded.HeldLoader._one

    def failing(self, variable, rows):
        calls.append(variable.name)
        if len(calls) == 3:
            raise OSError("the parameter server went away")
        return real(self, variable, rows)

    _sharded.HeldLoader._one = failing
    try:
        with pytest.raises(OSError, match="went away") as caught:
            objckpt.restore(target, snap)
    finally:
        _sharded.HeldLoader._one = real
    assert len(calls) == 3  # two shards were assigned before the third failed
    assert shard_bytes(target) == before and target.bias.numpy().tobytes() == bias_before
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "Nothing was changed: the 2 variable(s)" in notes
    objckpt.restore(target, snap)  # and it restores once nothing fails
    assert logical(target).tobytes() == value.tobytes()


def test_save_of_a_snapshot_writes_each_shard_as_tf_does_with_or_without_its_obj(tmp_path):
    value = full_value(11)
    module = sharded_module((3, 3, 4), value)
    theirs = tf.train.Checkpoint(root=module).write(str(tmp_path / "tf"))
    snap = objckpt.snapshot(module)
    kept = objckpt.save(snap, str(tmp_path / "kept"))
    alone = objckpt.save(objckpt.Snapshot(dict(snap)), str(tmp_path / "alone"))  # no origin
    for prefix in (kept, alone):
        assert slices_of(prefix) == slices_of(theirs)
        target = sharded_module((5, 5), np.zeros_like(value))
        tf.train.Checkpoint(root=target).read(prefix).assert_consumed()
        assert logical(target).tobytes() == value.tobytes()


def test_every_other_reader_of_a_snapshot_takes_a_sharded_value(tmp_path):
    """restore_on_create, load_ensemble, average and migrate with a Snapshot of a sharded
    table give the values a restore gives; diff and Twins, which do not take Snapshots, say
    so with a typed error."""
    value, other = full_value(12), full_value(13)
    snap = objckpt.snapshot(sharded_module((3, 3, 4), value))
    snap_other = objckpt.snapshot(sharded_module((5, 5), other))
    later = tf.Module()
    pending = objckpt.restore_on_create(later, snap)
    later.bias = tf.Variable(tf.zeros((4,)))
    later.table = sharded_variable.ShardedVariable(
        [tf.Variable(tf.zeros((4, 4))), tf.Variable(tf.zeros((6, 4)))])
    pending.assert_done()
    assert logical(later).tobytes() == value.tobytes()
    (member,) = objckpt.load_ensemble(sharded_module((5, 5), np.zeros_like(value)),
                                      [snap]).members
    assert logical(member).tobytes() == value.tobytes()
    mean = sharded_module((2, 8), np.zeros_like(value))
    objckpt.average(mean, [snap, snap_other])
    expected = ((value.astype("float64") + other.astype("float64")) / 2).astype("float32")
    assert logical(mean).tobytes() == expected.tobytes()
    prefix = objckpt.migrate(sharded_module((5, 5), np.zeros_like(value)), snap,
                             str(tmp_path / "mig"))
    assert tf.train.load_checkpoint(prefix).get_tensor(
        "table/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == value.tobytes()
    with pytest.raises(errors.UnsupportedFormatError, match=r"objckpt\.save"):
        objckpt.diff(snap, prefix)
    with pytest.raises(errors.UnsupportedObjectError, match="Snapshot"):
        objckpt.Twins(sharded_module((3, 3, 4), value), past=snap)


def test_a_lossless_cast_is_done_shard_by_shard_a_transform_takes_the_value_joined(joins):
    value = full_value(16)
    narrow = tf.Module()
    narrow.table = sharded_variable.ShardedVariable(
        [tf.Variable(tf.cast(value[:4], tf.bfloat16)),
         tf.Variable(tf.cast(value[4:], tf.bfloat16))])
    narrow.bias = tf.Variable(np.arange(4, dtype="float32"))
    widened = tf.cast(tf.cast(value, tf.bfloat16), tf.float32).numpy()
    target = sharded_module((3, 3, 4), np.zeros_like(value))
    report = objckpt.restore(target, objckpt.snapshot(narrow))
    assert report.cast == {"table": "bfloat16 -> float32"}
    assert logical(target).tobytes() == widened.tobytes() and joins == []
    doubled = sharded_module((5, 5), np.zeros_like(value))
    objckpt.restore(doubled, objckpt.snapshot(sharded_module((3, 3, 4), value)),
                    rules=[(r"^table$", "table", lambda x: x * 2.0)])
    assert logical(doubled).tobytes() == (value * 2).tobytes()
    assert len(joins) == 1  # a rule's transform needs the value whole: joined for it


def test_a_restore_traced_in_a_tf_function_assigns_shard_by_shard():
    value = full_value(17)
    snap = objckpt.snapshot(sharded_module((3, 3, 4), value))
    target = sharded_module((5, 5), np.zeros_like(value))

    @tf.function
    def restore():
        objckpt.restore(target, snap)

    restore()
    assert logical(target).tobytes() == value.tobytes()


def test_a_snapshot_inside_a_tf_function_holds_the_joined_value():
    value = full_value(14)
    module = sharded_module((5, 5), value)

    @tf.function
    def taken():
        return objckpt.snapshot(module)["table"]

    assert taken().numpy().tobytes() == value.tobytes()


class _PeakAnon(_SampledAnon):
    """Peak RssAnon growth of this process (bytes) while the block runs (sampled as
    tests/_formats/test_safetensors_stream.py does), freed heap given back first: the block
    cannot hide in memory freed before."""

    def __enter__(self):
        _trim()
        return super().__enter__()


MIB = 1 << 20


def _trim() -> None:
    """glibc's malloc_trim(0) where there is one (memory freed but kept by the allocator
    returned to the system)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_figures() -> dict:
    """A 96 MiB table in 4 shards of 24 MiB: this process's RssAnon growth while it is
    snapshot, joined, resharded into 3 shards of 32 MiB after training, and restored into
    its own layout (run in a fresh process: in a long test session TF's allocator keeps
    memory freed earlier, which a later allocation takes without RssAnon growing)."""
    rows, dim = 6 * 65536, 64
    value = np.random.default_rng(15).standard_normal((rows, dim), dtype=np.float32)
    table = value.nbytes
    module = sharded_module((rows // 4,) * 4, value)
    target = sharded_module((rows // 3,) * 3, np.zeros((rows, dim), "float32"))
    del value
    with _PeakAnon() as taking:
        snap = objckpt.snapshot(module)
    with _PeakAnon() as joined:
        whole = tf.convert_to_tensor(snap["table"])
    expected = np.asarray(whole).tobytes()
    del whole
    for part in module.table.variables:  # "training": every shard gets a new buffer
        part.assign(part * 0.5)
    with _PeakAnon() as resharded:
        objckpt.restore(target, snap)
    with _PeakAnon() as same:
        objckpt.restore(module, snap)
    return {"table": table, "taking": taking.growth, "joined": joined.growth,
            "resharded": resharded.growth, "same": same.growth,
            "equal": [logical(module).tobytes() == expected,
                      logical(target).tobytes() == expected]}


@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_memory_on_this_host_stays_bounded_by_a_shard_not_the_table():
    """Joining the table (what holding it whole costs) adds the table; the snapshot adds
    nothing of it; resharding it adds at most one target shard; restoring it into its own
    layout adds nothing of it (the undo log's staging buffer aside)."""
    root = os.path.dirname(os.path.dirname(HELPERS))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, HELPERS, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", "import json; from tests.distributed.test_sharded_snapshot "
         "import memory_figures; print('RESULT ' + json.dumps(memory_figures()))"],
        capture_output=True, text=True, timeout=600, env=env, cwd=root, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    table = got["table"]
    assert got["equal"] == [True, True]
    assert got["joined"] > table / 2, got  # the measure tells a table from a shard
    assert got["taking"] < 8 * MIB, got
    assert got["resharded"] < table // 3 + 12 * MIB < table / 2, got
    assert got["same"] < 16 * MIB, got


# --- a real cluster: parameter servers in-process (a fresh process of its own) ------------


def _cluster(folder, flavour: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0")
    root = os.path.dirname(os.path.dirname(HELPERS))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, os.path.join(HELPERS, "pss_snapshot_worker.py"), str(folder),
         flavour], capture_output=True, text=True, timeout=600, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.subprocess
@pytest.mark.slow
def test_snapshots_of_sharded_variables_on_parameter_servers(tmp_path):
    """tf_keras (Keras 2 on TF 2.12-2.15): a model and its Adam slots trained by a
    ClusterCoordinator loop, snapshot, trained on, restored (same layout twice, 2->3, 3 into
    one shard, a plain model's snapshot into 2); an assignment failing half way."""
    flavour = "keras2" if flavours.session_flavour() == "keras2" else "tf_keras"
    if flavour == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed: Keras 3 cannot train with sharded variables")
    out = _cluster(tmp_path, flavour)
    held = out["held"]
    assert held["type"] == "ShardedValue" and held["layout"] == "2 shards of rows [0:6) [6:12)"
    assert held["devices"] == held["shard_devices"]
    assert all("/job:ps/" in d for d in held["devices"])
    for name in ("2to2", "2to2-again", "2to3", "3to1", "plainto2"):
        case = out[name]
        assert case["equal"], (name, case)
        assert case["restored"] == case["paths"], (name, case)
        # a sharded target: nothing joined; an unsharded one (a partitioner of one shard
        # leaves variables whole on a parameter server): joined there, never here
        assert case["joins"] == [] if name != "3to1" else (
            case["joins"] and all("/job:ps/" in d for d in case["joins"])), (name, case)
    assert out["2to3"]["rows"] == [4, 4, 4] and out["3to1"]["rows"] == [12]
    assert out["plainto2"]["rows"] == [6, 6]
    failure = out["half_way"]
    assert failure["raised"] == "the parameter server went away"
    assert failure["calls"] == 3 and failure["unchanged"]
    assert any("Nothing was changed" in note for note in failure["notes"])


@pytest.mark.subprocess
@pytest.mark.slow
def test_snapshots_of_keras3_sharded_variables_on_parameter_servers(tmp_path):
    """Keras 3 (which cannot train with sharded variables: its values are changed by
    assignment after the snapshot): restored 2->2, 2->3 and 3 into one shard."""
    if flavours.session_flavour() != "keras3":
        pytest.skip("Keras 3 is not this session's Keras")
    out = _cluster(tmp_path, "keras3")
    for name in ("keras3-2to2", "keras3-2to3", "keras3-3to1"):
        case = out[name]
        assert case["equal"] and case["restored"] == case["paths"], (name, case)
        assert case["held"] >= 1, (name, case)  # the table held as a ShardedValue
        assert case["joins"] == [] if name != "keras3-3to1" else (
            case["joins"] and all("/job:ps/" in d for d in case["joins"])), (name, case)
