"""objckpt.clone under tf.distribute: MirroredStrategy with two replicas (two logical CPUs, see
conftest.py) and one; every flavour (Keras 3, tf_keras, Keras 2, tf.Module).

The copy's variables are re-created under the original's strategy, mirrored like the original
(type, synchronization, aggregation, devices), each replica with its own original replica's
value; the clone trains under the strategy like the original and is independent of it.
A ShardedVariable is cloned shard by shard: tests/distributed/test_sharded.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt.errors import CloneError

from flavours import KERAS_FLAVOURS, keras_for, mirrored, session_flavour

KINDS = ("functional", "subclassed")


# ------------------------------------------------------------------------------ helpers
def _inner(variable):
    """The tf.Variable (distributed or not) behind a Keras 3 `keras.Variable`."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _replicas(variable) -> list[bytes]:
    """Each replica's value, as bytes (one entry for a plain variable)."""
    variable = _inner(variable)
    components = getattr(variable, "values", None) or (variable,)
    return [np.asarray(c.numpy()).tobytes() for c in components]


def _all_variables(obj) -> dict:
    """Every variable of a model: its tree (weights, BatchNorm statistics, optimizer state)
    and its metrics' variables (loss tracker, compiled metrics), by a stable key."""
    out = dict(objckpt.tree(obj).items())
    for i, metric in enumerate(getattr(obj, "metrics", ())):
        for j, variable in enumerate(metric.variables):
            out[f"metrics/{i}/{metric.name}/{j}"] = _inner(variable)
    return out


def _values(obj) -> dict:
    return {path: _replicas(v) for path, v in _all_variables(obj).items()}


def _data(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 6, 6, 3)).astype("float32"),
            rng.normal(size=(n, 2)).astype("float32"))


def _functional(keras):
    images = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(images)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    shared = keras.layers.Dense(5, name="shared")
    x = keras.layers.Add()([shared(keras.layers.Dense(5, name="a")(x)),
                            shared(keras.layers.Dense(5, name="b")(x))])
    head = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)],
                            name="head")
    return keras.Model(images, head(x), name="functional")


def _subclassed(keras):
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.conv = keras.layers.Conv2D(4, 3)
            self.bn = keras.layers.BatchNormalization()
            self.flat = keras.layers.Flatten()
            self.hidden = keras.layers.Dense(6)
            self.alias = self.hidden  # one layer under two names
            self.block = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])

        def call(self, x, training=False):
            x = self.flat(self.bn(self.conv(x), training=training))
            return self.block(self.hidden(x))

    model = Net()
    model(_data()[0])
    return model


@pytest.fixture(scope="module")
def strategy():
    return mirrored(2)


@pytest.fixture(scope="module", params=[(f, k) for f in KERAS_FLAVOURS for k in KINDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request, strategy):
    """(keras, model): compiled with Adam and a metric under a 2-replica MirroredStrategy,
    trained one step (one global batch of 8, 4 per replica)."""
    flavour, kind = request.param
    if flavour != session_flavour():
        pytest.skip(f"{flavour} runs in its own nox session (this one is {session_flavour()})")
    keras = keras_for(flavour)
    with strategy.scope():
        model = _functional(keras) if kind == "functional" else _subclassed(keras)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    images, targets = _data()
    model.fit(images, targets, epochs=1, batch_size=8, shuffle=False, verbose=0)
    return keras, model


def _fit_step(model, seed):
    images, targets = _data(seed=seed)
    model.fit(images, targets, epochs=1, batch_size=8, shuffle=False, verbose=0)


# ------------------------------------------------------------------ Keras, 2 replicas
def test_clone_is_mirrored_like_the_original(trained, strategy):
    keras, model = trained
    copy = objckpt.clone(model)
    originals, copies = _all_variables(model), _all_variables(copy)
    assert list(originals) == list(copies)
    kinds = set()
    for path, a in originals.items():
        b = copies[path]
        kinds.add(type(a).__name__)
        assert b is not a, path
        assert type(b) is type(a), path
        assert b.distribute_strategy is strategy, path
        assert (b.synchronization, b.aggregation, b.trainable) == (
            a.synchronization, a.aggregation, a.trainable), path
        assert (b.dtype, b.shape, b.name) == (a.dtype, a.shape, a.name), path
        assert [c.device for c in b.values] == [c.device for c in a.values], path
        assert not set(map(id, b.values)) & set(map(id, a.values)), path
        assert _replicas(b) == _replicas(a), f"{path}: a replica differs from the original's"
    # Weights and optimizer state are MirroredVariables; metrics SyncOnRead (and tf_keras'
    # BatchNorm statistics).
    assert kinds == {"MirroredVariable", "SyncOnReadVariable"}
    syncs = {path: v.synchronization for path, v in copies.items()}
    assert all(syncs[p] == tf.VariableSynchronization.ON_READ for p in syncs if
               p.startswith("metrics/"))
    # The metric totals differ per replica: each replica was copied, not an aggregate.
    assert any(len(set(_replicas(v))) > 1 for p, v in originals.items()
               if p.startswith("metrics/"))
    assert copy.distribute_strategy is model.distribute_strategy is strategy
    assert copy.optimizer is not model.optimizer
    if keras.__version__.startswith("3"):  # keras.Variable wrappers around the copies
        assert all(isinstance(v, keras.Variable) and v is not w
                   for v, w in zip(copy.variables, model.variables))
        assert [type(_inner(v)) for v in copy.variables] == [
            type(_inner(v)) for v in model.variables]


def test_clone_runs_and_trains_under_the_strategy(trained, strategy):
    _, model = trained
    copy = objckpt.clone(model)
    images = tf.constant(_data(4, seed=3)[0])

    def forward(m):
        out = strategy.run(lambda x: m(x, training=False), args=(images,))
        return [t.numpy().tobytes() for t in strategy.experimental_local_results(out)]

    outputs = forward(copy)
    assert len(outputs) == 2 and outputs == forward(model)
    before = _values(copy)
    _fit_step(model, seed=1)
    _fit_step(copy, seed=1)
    after, expected = _values(copy), _values(model)
    assert after == expected, [p for p in after if after[p] != expected[p]]
    changed = [p for p in after if after[p] != before[p]]
    assert any("kernel" in p for p in changed), "the clone did not train"
    # Weights and optimizer state stay identical across replicas (whatever Keras does with
    # BatchNorm statistics, the clone does exactly as the original).
    for path, variable in _all_variables(copy).items():
        if variable.synchronization != tf.VariableSynchronization.ON_READ and (
                variable.trainable or "optimizer" in path or "iteration" in path):
            assert len(set(_replicas(variable))) == 1, f"{path}: replicas diverged"


def test_clone_is_independent(trained, strategy):
    _, model = trained
    copy = objckpt.clone(model)
    original_before, copy_before = _values(model), _values(copy)
    for variable in copy.trainable_variables:
        _inner(variable).assign_add(tf.ones_like(_inner(variable)))
    assert _values(model) == original_before
    _fit_step(model, seed=2)  # the original trains; the clone does not move
    copy_now = _values(copy)
    changed = {p for p in copy_before if copy_now[p] != copy_before[p]}
    trainable = {p for p, v in _all_variables(copy).items() if v.trainable}
    assert changed == trainable


def test_copy_values_false_gives_zeros_on_every_replica(trained, strategy):
    _, model = trained
    copy = objckpt.clone(model, copy_values=False)
    originals, copies = _all_variables(model), _all_variables(copy)
    assert list(originals) == list(copies)
    for path, a in originals.items():
        b = copies[path]
        assert type(b) is type(a) and b.synchronization == a.synchronization, path
        for component in b.values:
            assert not np.any(component.numpy()), path


def test_clone_inside_the_scope_and_tree_order(trained, strategy):
    """Called inside `strategy.scope()` too; the distributed variables of the tree are
    created first and in the tree's order (multi-worker strategies pair creations by order)."""
    _, model = trained
    created = []

    def record(next_creator, **kwargs):
        name = kwargs.get("name") or ""
        if "/replica_" not in name:
            created.append(name)
        return next_creator(**kwargs)

    with tf.variable_creator_scope(record), strategy.scope():
        copy = objckpt.clone(model)
    tree = objckpt.tree(model)
    expected = [v.name.split(":")[0] for v in tree.values()]
    assert created[:len(expected)] == expected
    # Then the ones only the walk reaches: metrics, tf_keras' train/test/predict counters.
    assert len(created) >= len(_all_variables(model))
    assert _values(copy) == _values(model)


def test_mixed_precision_wrappers(strategy):
    """Keras 2 / tf_keras wrap each distributed variable in an AutoCastVariable (of a class
    that also subclasses MirroredVariable), Keras 3 in a keras.Variable that autocasts."""
    keras = keras_for(session_flavour())
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                      keras.layers.Dense(2, dtype="float32")])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    x, y = _data()[0].reshape(8, -1)[:, :3], _data()[1]
    model.fit(x, y, batch_size=8, verbose=0)
    copy = objckpt.clone(model)
    kernel, copied = model.layers[0].kernel, copy.layers[0].kernel
    assert type(copied) is type(kernel) and copied is not kernel
    assert type(_inner(getattr(copied, "_variable", copied))).__name__ == "MirroredVariable"
    assert _values(copy) == _values(model)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    copy.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert _values(copy) == _values(model)


# ------------------------------------------------------------------ tf.Module
class Net(tf.Module):
    def __init__(self):
        super().__init__(name="net")
        mean = tf.VariableAggregation.MEAN
        self.w = tf.Variable(tf.random.stateless_normal((3, 2), seed=(1, 2)), aggregation=mean)
        self.b = tf.Variable(tf.zeros((2,)), aggregation=mean)
        self.layers = [self.w]  # shared: reachable twice
        self.step = tf.Variable(0, dtype=tf.int64,
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                                trainable=False)
        self.seen = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.SUM, trainable=False)

    def loss(self, x):
        return tf.reduce_sum((tf.matmul(x, self.w) + self.b) ** 2)


def _module_step(strategy, net):
    x = tf.reshape(tf.range(12, dtype=tf.float32), (4, 3)) / 10.0

    def replica_fn():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        xs = x + tf.cast(replica, tf.float32)  # each replica sees other data
        with tf.GradientTape() as tape:
            loss = net.loss(xs)
        gw, gb = tape.gradient(loss, [net.w, net.b])
        net.w.assign_sub(0.01 * gw)  # MEAN across replicas: replicas stay identical
        net.b.assign_sub(0.01 * gb)
        net.step.assign_add(1)
        net.seen.assign_add(tf.cast(replica + 1, tf.float32))  # differs per replica

    strategy.run(tf.function(replica_fn))


@pytest.fixture(scope="module", params=[2, 1], ids=["2-replicas", "1-replica"])
def module_net(request):
    strategy = mirrored(request.param)
    with strategy.scope():
        net = Net()
    _module_step(strategy, net)
    return strategy, net


def _module_values(net):
    return {path: _replicas(v) for path, v in objckpt.tree(net).items()}


@pytest.mark.parametrize("inside_scope", [False, True], ids=["outside", "inside-scope"])
def test_module_clone(module_net, inside_scope):
    strategy, net = module_net
    if inside_scope:
        with strategy.scope():
            copy = objckpt.clone(net)
    else:
        copy = objckpt.clone(net)
    originals, copies = objckpt.tree(net), objckpt.tree(copy)
    assert list(originals) == list(copies) == ["w", "b", "step", "seen"]
    for path, a in originals.items():
        b = copies[path]
        assert type(b) is type(a) and b is not a, path
        assert b.distribute_strategy is strategy, path
        assert (b.synchronization, b.aggregation, b.trainable, b.dtype, b.name) == (
            a.synchronization, a.aggregation, a.trainable, a.dtype, a.name), path
        assert _replicas(b) == _replicas(a), path
    assert type(copy.seen).__name__ == "SyncOnReadVariable"
    assert type(copy.w).__name__ == "MirroredVariable"
    assert copy.layers[0] is copy.w
    if strategy.num_replicas_in_sync == 2:  # replicas differ: copied each, not an aggregate
        assert len(set(_replicas(copy.seen))) == 2
    # Same step on both: bit-identical, replicas of the mirrored ones identical.
    _module_step(strategy, net)
    _module_step(strategy, copy)
    assert _module_values(copy) == _module_values(net)
    for name in ("w", "b", "step"):
        assert len(set(_replicas(getattr(copy, name)))) == 1, name
    # Independent.
    before = _module_values(net)
    copy.w.assign(tf.zeros_like(copy.w))
    copy.seen.assign(5.0)
    assert _module_values(net) == before


def test_module_copy_values_false(module_net):
    _, net = module_net
    copy = objckpt.clone(net, copy_values=False)
    for path, variable in objckpt.tree(copy).items():
        assert type(variable) is type(getattr(net, path)), path
        assert all(not np.any(c.numpy()) for c in variable.values), path


def test_clone_inside_strategy_run_is_refused(module_net):
    strategy, net = module_net
    errors = []

    def replica_fn():
        try:
            objckpt.clone(net)
        except CloneError as err:
            errors.append(err)

    strategy.run(replica_fn)
    assert errors and "strategy.run" in str(errors[0])
    assert "Net" in errors[0].path


def test_clone_inside_another_strategys_scope_is_refused(module_net):
    _, net = module_net
    other = tf.distribute.OneDeviceStrategy("/cpu:0")
    with other.scope(), pytest.raises(CloneError, match="scope of another strategy") as caught:
        objckpt.clone(net)
    assert "OneDeviceStrategy" in str(caught.value)
