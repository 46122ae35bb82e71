"""TF1 partitioned variables (`tf.compat.v1.get_variable(..., partitioner=...)`) as sources.

`tf.compat.v1.train.Saver` writes a partitioned variable as ONE key whose index entry lists one
slice per part (the parts' bytes under binary slice keys). The checkpoints here are written by
TF itself in a `tf.compat.v1` Graph and Session, as TF1 code wrote them: an embedding table in 3
parts of rows (`fixed_size_partitioner`), a kernel in 2 parts of columns (`axis=1`), a table
split by `min_max_variable_partitioner`, and their Adam slots (partitioned like their
variables). objckpt reads each whole through `plan`, `restore`, `restore_on_create` and
`migrate` (and `load_ensemble`), into plain variables in every flavour and into
`ShardedVariable`s of any shard count.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt import errors
from objckpt._bundle import index as _index

from flavours import KERAS_FLAVOURS, keras_for
from support import build_optimizer

RULES = [("^model/", "")]
IDS = np.array([[1, 7], [3, 9], [0, 5]], dtype="int32")


def _values(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "emb/embeddings": rng.normal(size=(10, 4)).astype("float32"),
        "proj/kernel": rng.normal(size=(4, 6)).astype("float32"),
        "proj/bias": rng.normal(size=(6,)).astype("float32"),
        "big": rng.normal(size=(16, 4)).astype("float32"),
    }


def write_tf1(prefix: str, *, seed: int = 0) -> dict:
    """Trains the TF1 net one Adam step in graph mode and saves it with the Saver.

    Returns {"prefix", "values": {name: the variable's whole value after the step, read in the
    session}, "slots": {slot key: its whole value}, "y": the net's output on IDS}."""
    init = _values(seed)
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model"):
            emb = tf.compat.v1.get_variable(
                "emb/embeddings", initializer=tf.constant(init["emb/embeddings"]),
                partitioner=tf.compat.v1.fixed_size_partitioner(3))
            kernel = tf.compat.v1.get_variable(
                "proj/kernel", initializer=tf.constant(init["proj/kernel"]),
                partitioner=tf.compat.v1.fixed_size_partitioner(2, axis=1))
            bias = tf.compat.v1.get_variable("proj/bias",
                                             initializer=tf.constant(init["proj/bias"]))
            big = tf.compat.v1.get_variable(
                "big", initializer=tf.constant(init["big"]),
                partitioner=tf.compat.v1.min_max_variable_partitioner(max_partitions=4,
                                                                      min_slice_size=64))
        assert type(emb).__name__ == "PartitionedVariable"
        assert [len(list(v)) for v in (emb, kernel, big)] == [3, 2, 4]

        def net():
            pooled = tf.reduce_mean(tf.nn.embedding_lookup(emb, IDS), axis=1)
            return tf.matmul(pooled, kernel.as_tensor()) + bias

        loss = tf.reduce_sum(tf.square(net())) + tf.reduce_sum(big.as_tensor())
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
        y = net()
        named = {"emb/embeddings": emb, "proj/kernel": kernel, "proj/bias": bias, "big": big}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train)
            values = {name: session.run(v.as_tensor() if hasattr(v, "as_tensor") else v)
                      for name, v in named.items()}
            y_value = session.run(y)
            prefix = tf.compat.v1.train.Saver().save(session, prefix, write_meta_graph=False)
    reader = tf.train.load_checkpoint(prefix)
    slots = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
             if k.endswith(("/Adam", "/Adam_1"))}
    return {"prefix": prefix, "values": values, "slots": slots, "y": y_value}


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return write_tf1(str(tmp_path_factory.mktemp("partitioned") / "model.ckpt"))


def test_the_saver_writes_one_key_with_one_slice_per_part(tf1):
    entries = _index.read_index(tf1["prefix"]).entries
    # rows [0:4) [4:7) [7:10); columns [0:3) [3:6); min_max: 4 parts of 4 rows (64 bytes each)
    assert [s[0] for s in entries["model/emb/embeddings"].slices] == [(0, 4), (4, 3), (7, 3)]
    assert [s[1] for s in entries["model/proj/kernel"].slices] == [(0, 3), (3, 3)]
    assert [s[0] for s in entries["model/big"].slices] == [(0, 4), (4, 4), (8, 4), (12, 4)]
    assert [s[0] for s in entries["model/emb/embeddings/Adam"].slices] == [(0, 4), (4, 3),
                                                                            (7, 3)]
    assert not entries["model/proj/bias"].slices


class Net(tf.Module):
    """The TF1 net in TF2: each variable plain, or (`rows` given) a ShardedVariable of shards
    of those many rows."""

    def __init__(self, emb_rows=None, kernel_rows=None, big_rows=None):
        super().__init__()
        self.emb = _variable((10, 4), emb_rows)
        self.kernel = _variable((4, 6), kernel_rows)
        self.bias = tf.Variable(tf.zeros((6,)))
        self.big = _variable((16, 4), big_rows)

    def __call__(self, ids):
        pooled = tf.reduce_mean(tf.nn.embedding_lookup(self.emb, ids), axis=1)
        return tf.matmul(pooled, tf.convert_to_tensor(self.kernel)) + self.bias


def _variable(shape, rows):
    if rows is None:
        return tf.Variable(tf.zeros(shape))
    assert sum(rows) == shape[0]
    return sharded_variable.ShardedVariable(
        [tf.Variable(tf.zeros((r, *shape[1:]))) for r in rows])


MODULE_RULES = [("^model/emb/embeddings", "emb"), ("^model/proj/", ""), ("^model/", "")]


def whole(variable) -> np.ndarray:
    """A variable's value, a sharded one's shards joined (the test's own reading)."""
    if isinstance(variable, sharded_variable.ShardedVariable):
        return np.concatenate([part.numpy() for part in variable.variables])
    return variable.numpy()


def assert_net_holds(net, tf1) -> None:
    expected = tf1["values"]
    for attr, name in (("emb", "emb/embeddings"), ("kernel", "proj/kernel"),
                       ("bias", "proj/bias"), ("big", "big")):
        assert whole(getattr(net, attr)).tobytes() == expected[name].tobytes(), attr
    np.testing.assert_allclose(net(IDS).numpy(), tf1["y"], atol=1e-6, rtol=0)


LAYOUTS = [
    pytest.param(None, None, None, id="plain"),
    pytest.param((10,), (4,), (16,), id="1-shard"),
    pytest.param((5, 5), (2, 2), (8, 8), id="2-shards"),
    pytest.param((3, 3, 4), (1, 1, 2), (6, 5, 5), id="3-shards"),
    pytest.param((4, 3, 3), None, (2, 6, 4, 4), id="as-saved-and-4-shards"),
]


@pytest.mark.parametrize("emb_rows, kernel_rows, big_rows", LAYOUTS)
def test_restore_reads_each_partitioned_variable_whole(tf1, emb_rows, kernel_rows, big_rows):
    net = Net(emb_rows, kernel_rows, big_rows)
    report = objckpt.restore(net, tf1["prefix"], rules=MODULE_RULES, optimizer_state=False)
    assert sorted(report.restored) == ["bias", "big", "emb", "kernel"]
    assert_net_holds(net, tf1)


@pytest.mark.parametrize("emb_rows, kernel_rows, big_rows", LAYOUTS[:4])
def test_plan_shows_the_stored_parts_and_the_target_layout(tf1, emb_rows, kernel_rows,
                                                          big_rows):
    net = Net(emb_rows, kernel_rows, big_rows)
    plan = objckpt.plan(net, tf1["prefix"], rules=MODULE_RULES, optimizer_state=False)
    sources = {m.target: m.source for m in plan.matches}
    assert sources == {"emb": "model/emb/embeddings", "kernel": "model/proj/kernel",
                       "bias": "model/proj/bias", "big": "model/big"}
    text = plan.describe()
    assert "model/emb/embeddings  [saved in 3 parts of rows [0:4) [4:7) [7:10)]" in text
    assert "model/proj/kernel  [saved in 2 parts of columns [0:3) [3:6)]" in text
    assert "model/big  [saved in 4 parts of rows [0:4) [4:8) [8:12) [12:16)]" in text
    assert "model/proj/bias  [saved" not in text
    if emb_rows == (3, 3, 4):
        assert "emb  [3 shards of rows [0:3) [3:6) [6:10)]" in text


@pytest.mark.parametrize("emb_rows, kernel_rows, big_rows", LAYOUTS[:4])
def test_migrate_writes_what_tf_reads_into_any_layout(tf1, tmp_path, emb_rows, kernel_rows,
                                                      big_rows):
    template = Net(emb_rows, kernel_rows, big_rows)
    out = objckpt.migrate(template, tf1["prefix"], str(tmp_path / "out" / "ckpt"),
                          rules=MODULE_RULES, optimizer_state=False)
    assert all(np.count_nonzero(whole(v)) == 0 for v in (template.emb, template.big))
    reader = tf.train.load_checkpoint(out)
    assert reader.get_tensor("emb/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == \
        tf1["values"]["emb/embeddings"].tobytes()
    # TF reads the migrated checkpoint into the net, plain and resharded
    for layout in ((None, None, None), ((6, 4), (3, 1), (4, 12))):
        fresh = Net(*layout)
        tf.train.Checkpoint(root=fresh).read(out).assert_existing_objects_matched()
        assert_net_holds(fresh, tf1)
        fresh = Net(*layout)
        objckpt.restore(fresh, out)
        assert_net_holds(fresh, tf1)


def test_restore_on_create_lands_whole_values_in_shards(tf1):
    net = tf.Module()
    pending = objckpt.restore_on_create(net, tf1["prefix"], rules=MODULE_RULES)
    net.bias = tf.Variable(tf.zeros((6,)))
    net.emb = _variable((10, 4), (6, 4))
    net.kernel = _variable((4, 6), None)
    assert set(pending.pending) == {"big"}
    net.big = _variable((16, 4), (3, 13))
    pending.assert_done()
    for attr, name in (("emb", "emb/embeddings"), ("kernel", "proj/kernel"), ("big", "big")):
        assert whole(getattr(net, attr)).tobytes() == tf1["values"][name].tobytes()


def test_a_wrong_shape_changes_nothing_and_names_both(tf1):
    net = Net((5, 5), None, (8, 8))
    net.kernel = tf.Variable(tf.ones((6, 4)))  # transposed
    before = [whole(v).tobytes() for v in (net.emb, net.kernel, net.bias, net.big)]
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(net, tf1["prefix"], rules=MODULE_RULES, optimizer_state=False)
    message = str(caught.value)
    assert "kernel" in message and "(4, 6)" in message and "(6, 4)" in message
    assert [whole(v).tobytes() for v in (net.emb, net.kernel, net.bias, net.big)] == before


# ---------------------------------------------------------------------------------------------
# Keras models: the embedding table and the kernel from their parts, Adam slots moved too.


def keras_net(keras):
    model = keras.Sequential([
        keras.Input((2,), dtype="int32"),
        keras.layers.Embedding(10, 4, name="emb"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(6, name="proj"),
    ], name="net")
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    return model


KERAS_RULES = [("^model/big", None), ("^model/", "")]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_keras_model_restored_with_its_adam_slots(flavour, tf1):
    keras = keras_for(flavour)
    model = keras_net(keras)
    build_optimizer(model)
    report = objckpt.restore(model, tf1["prefix"], rules=KERAS_RULES, optimizer_state=True)
    np.testing.assert_allclose(model(IDS, training=False).numpy(), tf1["y"], atol=1e-6, rtol=0)
    layer = model.get_layer("emb")
    assert layer.embeddings.numpy().tobytes() == tf1["values"]["emb/embeddings"].tobytes()
    slots = {m.source: m.target for m in report.plan.matches if m.strategy == "slot"}
    expected = {f"model/{name}/{slot}" for name in ("emb/embeddings", "proj/kernel", "proj/bias")
                for slot in ("Adam", "Adam_1")}
    assert expected <= set(slots), report.plan.describe()
    tree = objckpt.tree(model)
    for source in expected:
        assert tree[slots[source]].numpy().tobytes() == tf1["slots"][source].tobytes(), source
    assert int(model.optimizer.iterations.numpy()) == 1


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_keras_model_migrated_and_restored_on_create(flavour, tf1, tmp_path):
    keras = keras_for(flavour)
    out = objckpt.migrate(keras_net(keras), tf1["prefix"], str(tmp_path / "ckpt"),
                          rules=KERAS_RULES, optimizer_state=False)
    fresh = keras_net(keras)
    tf.train.Checkpoint(root=fresh).read(out).assert_existing_objects_matched()
    np.testing.assert_allclose(fresh(IDS, training=False).numpy(), tf1["y"], atol=1e-6, rtol=0)
    later = keras_net(keras)
    pending = objckpt.restore_on_create(later, tf1["prefix"], rules=KERAS_RULES,
                                        optimizer_state=False)
    pending.assert_done()
    assert later.get_layer("proj").kernel.numpy().tobytes() == \
        tf1["values"]["proj/kernel"].tobytes()


def test_an_ensemble_of_two_tf1_checkpoints_in_shards(tf1, tmp_path):
    second = write_tf1(str(tmp_path / "model.ckpt"), seed=1)
    ensemble = objckpt.load_ensemble(Net((5, 5), None, (4, 12)),
                                     [tf1["prefix"], second["prefix"]], rules=MODULE_RULES)
    for member, written in zip(ensemble.members, (tf1, second)):
        assert_net_holds(member, written)
