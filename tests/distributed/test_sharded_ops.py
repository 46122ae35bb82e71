"""`Freezer`, `load_ensemble` and `objckpt.average` with sharded variables (`ShardedVariable`,
what ParameterServerStrategy with a partitioner makes), each one logical variable.

The first tests make sharded variables directly on this process's CPU (TF has no public maker
outside a cluster), named as a partitioner names them (`table/part_0`, which tf_keras's
optimizers read); the last ones run tests/helpers/pss_ops_worker.py on a real in-process
cluster (2 workers, 2 parameter servers) with a tf_keras (or Keras 2) model trained by a
`ClusterCoordinator` loop or by `model.fit` with Checkpointing, and with Keras 3 models (which build sharded weights there but cannot
train them). The oracles are TF's own restore, TF's reader and NumPy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import flavours
import objckpt
from objckpt import errors
from objckpt._planning import sharded as _sharded

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"
HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")


class Net(tf.Module):
    """`table` (a ShardedVariable of `value` in shards of `rows` rows, or a plain variable
    for `rows=None`) and a plain `bias`; called on row ids, it looks them up."""

    def __init__(self, rows, value: np.ndarray, bias=None, trainable=True):
        super().__init__()
        if rows is None:
            self.table = tf.Variable(value, name="table")
        else:
            assert sum(rows) == value.shape[0]
            parts, start = [], 0
            for i, count in enumerate(rows):
                parts.append(tf.Variable(value[start:start + count], name=f"table/part_{i}",
                                         trainable=trainable if i else True))
                start += count
            self.table = sharded_variable.ShardedVariable(parts, name="table")
        self.bias = tf.Variable(np.arange(value.shape[1], dtype="float32")
                                if bias is None else bias, name="bias")

    @tf.function
    def __call__(self, ids):
        return tf.nn.embedding_lookup(self.table, ids) + self.bias


def full_value(seed: int, rows: int = 10, cols: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, cols)).astype("float32")


def logical(net) -> np.ndarray:
    """The table's value, read shard by shard without objckpt."""
    table = net.table
    parts = table.variables if hasattr(table, "variables") else [table]
    return np.concatenate([part.numpy() for part in parts])


def split(rows: int, shards: int) -> tuple:
    per, extra = divmod(rows, shards)
    return tuple(per + (1 if i < extra else 0) for i in range(shards))


def tf_restored(rows, prefix: str, shape) -> Net:
    """A fresh Net of layout `rows` restored by TF's own `tf.train.Checkpoint.read`."""
    net = Net(rows, np.zeros(shape, "float32"), bias=np.zeros(shape[1], "float32"))
    tf.train.Checkpoint(root=net).read(prefix).assert_consumed()
    return net


# --- Freezer -----------------------------------------------------------------------------

OPTIMIZERS = ["tf_keras", "keras2", "module", "keras3"]


def optimizer_for(flavour: str):
    """An Adam of a flavour that trains sharded variables; Keras 3's cannot."""
    if flavour == "keras3":
        pytest.skip("Keras 3's optimizers cannot train a ShardedVariable (they ask it for its "
                    "`handle`; see docs/distributed.md): nothing to freeze under training")
    if flavour == "module":
        return tf.compat.v1.train.AdamOptimizer(0.1)
    return flavours.keras_for(flavour).optimizers.Adam(0.1)


def optimizer_values(optimizer, shape) -> list[bytes]:
    """The optimizer's variables of `shape` (a variable's slots), as bytes."""
    owned = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
    # tf_keras lists a sharded variable's slots as one ShardedVariable of their shards
    parts = [p for v in owned
             for p in (v.variables if isinstance(v, sharded_variable.ShardedVariable) else [v])]
    return [p.numpy().tobytes() for p in parts if tuple(p.shape) == tuple(shape)]


def shard_bytes(net) -> list[bytes]:
    return [part.numpy().tobytes() for part in net.table.variables]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("flavour", OPTIMIZERS)
def test_freezer_holds_a_sharded_variable_whole(flavour, traced):
    net = Net((3, 2), full_value(0, rows=5, cols=2))
    optimizer = optimizer_for(flavour)
    freezer = objckpt.Freezer(net)
    assert freezer.paths == ("bias", "table") or freezer.paths == ("table", "bias")
    assert freezer.names[freezer.paths.index("table")] == "table"

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(net(tf.constant([0, 1, 4])) ** 2)
        variables = net.trainable_variables  # the shards and the bias
        grads = tape.gradient(loss, variables)
        freezer.apply_gradients(optimizer, zip(grads, variables))

    run = tf.function(step) if traced else step
    run()  # every slot made
    traces = freezer.traces
    assert freezer.freeze("^table$") == ("table",)
    shards, bias = shard_bytes(net), net.bias.numpy().tobytes()
    slots = [optimizer_values(optimizer, (3, 2)), optimizer_values(optimizer, (2, 2))]
    assert all(slots), "each shard has its own optimizer state"
    run()
    run()
    assert shard_bytes(net) == shards, "every shard of the frozen table as it was"
    assert [optimizer_values(optimizer, (3, 2)), optimizer_values(optimizer, (2, 2))] == slots
    assert net.bias.numpy().tobytes() != bias, "the bias trained"
    assert freezer.unfreeze() == ()
    run()
    assert all(a != b for a, b in zip(shard_bytes(net), shards)), "both shards train again"
    assert freezer.traces == traces, "toggling never retraced"
    assert traced == (traces > 0)


def test_freezer_takes_a_sharded_variable_by_pattern_object_or_all_its_shards():
    net = Net((3, 3, 4), full_value(1))
    freezer = objckpt.Freezer(net)
    assert freezer.matching("^table$") == ("table",)
    assert freezer.freeze(net.table) == ("table",)
    assert freezer.unfreeze(*net.table.variables) == ()
    assert freezer.freeze(*net.table.variables) == ("table",)
    assert freezer.unfreeze(net.table) == ()
    assert freezer.set_frozen([net.table, "bias"]) in {("table", "bias"), ("bias", "table")}


def test_freezer_refuses_part_of_a_sharded_variable():
    net = Net((3, 3, 4), full_value(2))
    freezer = objckpt.Freezer(net)
    with pytest.raises(errors.DistributedVariableError) as caught:
        freezer.freeze(*net.table.variables[:2])
    message = str(caught.value)
    assert "given 2 of the 3 shards of `table`" in message
    assert "3 shards of rows [0:3) [3:6) [6:10)" in message
    assert "Fix: pass the sharded variable itself" in message
    assert caught.value.path == "table"
    assert freezer.frozen == (), "nothing was frozen"


def test_freezer_refuses_shards_that_disagree_on_trainable():
    net = Net((6, 4), full_value(3), trainable=False)  # shard 1 not trainable, shard 0 is
    with pytest.raises(errors.DistributedVariableError) as caught:
        objckpt.Freezer(net)
    message = str(caught.value)
    assert "`table` (table) is a sharded variable [2 shards of rows [0:6) [6:10)]" in message
    assert "shard 0 trainable, shard 1 not" in message
    assert "Fix:" in message


# --- load_ensemble -------------------------------------------------------------------------

SOURCES = [(None, 0), ((5, 5), 1), ((3, 3, 4), 2)]  # (layout written, seed)


@pytest.mark.parametrize("template", [(4, 6), (10,), None], ids=["2shards", "1shard", "plain"])
def test_load_ensemble_of_sharded_checkpoints_equals_tf_restore(template, tmp_path):
    prefixes = [tf.train.Checkpoint(root=Net(rows, full_value(seed))).write(
        str(tmp_path / f"m{seed}")) for rows, seed in SOURCES]
    net = Net(template, np.zeros((10, 4), "float32"))
    ensemble = objckpt.load_ensemble(net, prefixes)
    assert not logical(net).any(), "the template is left as it was"
    ids = tf.constant([[0, 5], [9, 3]])
    outputs = ensemble(ids).numpy()
    if template is not None:
        assert ensemble.last_mode == "loop" and "sharded variable" in ensemble.fallback_reason
    for k, (member, prefix) in enumerate(zip(ensemble.members, prefixes)):
        oracle = tf_restored(template, prefix, (10, 4))
        assert type(member.table) is type(net.table)
        if template is not None:
            assert [p.shape[0] for p in member.table.variables] == list(template)
        assert logical(member).tobytes() == logical(oracle).tobytes()
        assert member.bias.numpy().tobytes() == oracle.bias.numpy().tobytes()
        np.testing.assert_array_equal(outputs[k], oracle(ids).numpy())


def test_load_ensemble_reads_a_large_sharded_checkpoint_into_whole_variables(tmp_path):
    """Sources above the streaming threshold: each member's variables created from what is
    read (a partitioned entry read whole by TF)."""
    rows = 1_100_000  # 17.6 MB of float32: above _fastio.STREAM_BYTES
    prefixes = [tf.train.Checkpoint(root=Net(split(rows, shards), full_value(s, rows=rows)))
                .write(str(tmp_path / f"big{s}")) for s, shards in ((0, 2), (1, 3))]
    ensemble = objckpt.load_ensemble(Net(None, np.zeros((rows, 4), "float32")), prefixes)
    for member, prefix in zip(ensemble.members, prefixes):
        expected = tf.train.load_checkpoint(prefix).get_tensor(KEY)
        assert member.table.numpy().tobytes() == expected.tobytes()


# --- average -------------------------------------------------------------------------------

def weighted_mean(prefixes, weights) -> np.ndarray:
    """The reference: TF-read values, weighted and summed in float64, rounded once."""
    values = [tf.train.load_checkpoint(p).get_tensor(KEY).astype("float64") for p in prefixes]
    total = np.float64(weights[0]) * values[0]
    for weight, value in zip(weights[1:], values[1:]):
        total = total + np.float64(weight) * value
    return total.astype("float32")


@pytest.mark.parametrize("rows", [10, 1_100_000], ids=["held", "streamed"])
@pytest.mark.parametrize("target", [(2,), (3,), None], ids=["2shards", "3shards", "plain"])
def test_average_of_sharded_checkpoints_equals_the_numpy_mean(rows, target, tmp_path,
                                                               monkeypatch):
    """Written with 1, 2 and 3 shards (by objckpt and by TF), averaged into a sharded or a
    whole table. Large models (the streamed route) get a sharded table's mean one shard at a
    time, each source's rows of it read by TF."""
    writers = [lambda net, p: objckpt.save(net, p),
               lambda net, p: tf.train.Checkpoint(root=net).write(p)]
    prefixes = [writers[s % 2](Net(split(rows, s + 1), full_value(s, rows=rows)),
                               str(tmp_path / f"s{s}")) for s in range(3)]
    layout = None if target is None else split(rows, target[0])
    net = Net(layout, np.zeros((rows, 4), "float32"))
    reads = []
    real = _sharded.read_slice
    monkeypatch.setattr(_sharded, "read_slice",
                        lambda prefix, job: reads.append(job.spec) or real(prefix, job))
    report = objckpt.average(net, prefixes, weights=[1, 2, 1])
    assert sorted(report.averaged) == ["bias", "table"]
    expected = weighted_mean(prefixes, [0.25, 0.5, 0.25])
    got = logical(net)
    np.testing.assert_array_max_ulp(got, expected, maxulp=1)
    assert np.mean(got == expected) > 0.99
    if rows > 10 and target is not None:
        assert len(reads) == 3 * target[0], "each shard's rows from each source"
    else:
        assert not reads


def test_average_failing_half_way_puts_every_shard_back(tmp_path, monkeypatch):
    rows = 1_100_000
    prefixes = [objckpt.save(Net(split(rows, 2), full_value(s, rows=rows)),
                             str(tmp_path / f"s{s}")) for s in range(2)]
    net = Net(split(rows, 3), full_value(7, rows=rows))
    before, bias = shard_bytes(net), net.bias.numpy().tobytes()
    real, reads = _sharded.read_slice, []

    def failing(prefix, job):
        reads.append(job.spec)
        if len(reads) == 5:  # the third shard's first source: two shards assigned
            raise OSError("the disk went away")
        return real(prefix, job)

    monkeypatch.setattr(_sharded, "read_slice", failing)
    with pytest.raises(OSError, match="the disk went away") as caught:
        objckpt.average(net, prefixes)
    assert len(reads) == 5
    assert shard_bytes(net) == before, "every shard as it was"
    assert net.bias.numpy().tobytes() == bias
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "Nothing was changed" in notes


# --- a real cluster ------------------------------------------------------------------------

def _trained_flavour() -> str:
    """Keras 2 where `keras` is 2.x (TF 2.12-2.15), else tf_keras (Keras 3 cannot train with
    sharded variables)."""
    if flavours.session_flavour() == "keras2":
        return "keras2"
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed: Keras 3 cannot train with sharded variables")
    return "tf_keras"


def _on_cluster(tmp_path_factory, flavour: str, *scenario: str) -> dict:
    folder = tmp_path_factory.mktemp("pssops")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0")
    root = os.path.dirname(os.path.dirname(HELPERS))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, HELPERS, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, os.path.join(HELPERS, "pss_ops_worker.py"), str(folder), flavour, *scenario],
        capture_output=True, text=True, timeout=600, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return _on_cluster(tmp_path_factory, _trained_flavour())


@pytest.fixture(scope="module")
def keras3_cluster(tmp_path_factory):
    if flavours.session_flavour() != "keras3":
        pytest.skip("Keras 3 is not this session's Keras")
    return _on_cluster(tmp_path_factory, "keras3")["keras3"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_freezer_on_the_parameter_servers(cluster):
    got = cluster["freezer"]
    assert got["names"] == ["embed/embeddings", "head/kernel", "head/bias"]
    assert got["frozen"] == ["layer_with_weights-0/embeddings"]
    assert got["frozen_entries"] == 3, "the table and its Adam m and v"
    assert got["frozen_bit_identical"], "the sharded table and its slots, every shard"
    assert got["others_trained"], "the head and its slots trained"
    assert got["unfrozen_trained"], "the table trains again once unfrozen"
    assert got["traces"] == 1, "one trace of the step: toggling never retraced"
    assert got["one_shard"].startswith("DistributedVariableError: freeze() was given 1 of "
                                       "the 2 shards of `layer_with_weights-0/embeddings`")
    assert got["all_shards"] == ["layer_with_weights-0/embeddings"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_freezer_under_fit_on_the_parameter_servers(tmp_path_factory):
    """tf_keras (Keras 2) `model.fit` with Checkpointing on the cluster, both workers: the
    frozen sharded table and its Adam slots stay bit-identical (in the checkpoints too)
    while the head trains; unfrozen, the next fit trains the table, with no new trace."""
    got = _on_cluster(tmp_path_factory, _trained_flavour(), "fit-freezer")
    assert got["frozen"] == ["layer_with_weights-0/embeddings"]
    assert got["epochs"] == [0, 1] and got["iterations"] == 3 * 4
    assert got["frozen_entries"] == 3, "the table and its Adam m and v"
    assert got["frozen_bit_identical"], "the sharded table and its slots, every shard"
    assert got["others_trained"], "the head and its slots trained"
    assert got["saved"] == ["ckpt-1", "ckpt-2"]
    assert got["saved_table_entries"] == 3
    assert got["saved_table_frozen"], "each checkpoint holds the frozen table and slots"
    assert got["unfrozen_trained"], "the table trains again once unfrozen"
    assert got["traces"] == 1, "the train step traced once: unfreezing never retraced"


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("template", ["sharded", "unsharded"])
def test_load_ensemble_on_the_parameter_servers(cluster, template):
    got = cluster["ensemble"][template]
    assert got["rows"] == ([[4, 4, 4]] * 2 if template == "sharded" else [[12]] * 2)
    assert got["equal_to_tf_restore"], "each member as TF's restore of its source"
    assert got["equal_to_runs"], "each member holds its run's weights"
    assert got["outputs_equal"]
    assert got["template_untouched"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_load_ensemble_with_sharded_optimizer_slots(cluster):
    """A compiled template (3 shards): each member's Adam slots, sharded like its variables,
    restored by owner from checkpoints written in 2 and 3 shards."""
    got = cluster["ensemble"]["with_optimizer"]
    assert "raised" not in got, got.get("message")
    assert got["rows"] == [[4, 4, 4], [4, 4, 4]]
    assert got["equal_to_runs"], "every value, slots and counters, as the source run's"


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("target", ["sharded", "unsharded"])
def test_average_on_the_parameter_servers(cluster, target):
    got = cluster["average"][target]
    assert got["averaged"] == ["model/layer_with_weights-0/embeddings",
                               "model/layer_with_weights-1/bias",
                               "model/layer_with_weights-1/kernel"]
    assert got["rows"] == ([6, 6] if target == "sharded" else [12])
    assert got["max_error"] < 1e-6
    assert got["within_one_ulp"], "the NumPy mean of TF-read values, rounded once"


@pytest.mark.subprocess
@pytest.mark.slow
def test_keras3_sharded_weights_frozen_loaded_and_averaged(keras3_cluster):
    """Keras 3 builds sharded weights under ParameterServerStrategy (it cannot train them):
    a Freezer selects one whole by its layer; checkpoints of 1, 2 and 3 shards load into an
    ensemble of 3-shard members and average into a 2-shard model."""
    got = keras3_cluster
    assert got["sharded"] == ["_functional/_operations/1/_embeddings",
                              "_functional/_operations/2/_kernel"]
    assert got["names"] == ["sequential/embed/embeddings", "sequential/head/kernel",
                            "sequential/head/bias"]
    assert got["frozen"] == ["_functional/_operations/1/_embeddings"]
    assert got["ensemble_equal_to_tf_reader"]
    assert got["ensemble_rows"] == [[4, 4, 4], [2, 1, 1]] * 3
    assert got["averaged"] == sorted(got["paths"])
    assert got["average_within_one_ulp"], "the NumPy mean of TF-read values, rounded once"
