"""State operations under tf.distribute: tree, snapshot, restore, save, restore_on_create,
plan and migrate on models built under a two-replica MirroredStrategy (`flavours.mirrored()`),
across strategies and replica counts, SyncOnRead variables against tf.train.Checkpoint,
a checkpoint TF wrote from a ShardedVariable, and who writes under MultiWorkerMirroredStrategy.

TF's checkpoint conventions are the reference: a checkpoint holds one value per variable (a
MirroredVariable's primary, a SyncOnRead variable's aggregate); a restore writes it to every
replica, a SyncOnRead SUM variable's replicas each getting value / num_replicas. Every check
compares per-replica components (`var.values`) bit for bit with what TF's own
`tf.train.Checkpoint.read` puts there.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors

from flavours import Dense, keras_for, mirrored, session_flavour

ON_READ = tf.VariableSynchronization.ON_READ
SUM, MEAN = tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN
FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA
IMAGES = np.random.default_rng(0).normal(size=(8, 6, 6, 3)).astype("float32")
TARGETS = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")


# --- helpers -------------------------------------------------------------------


def components(variable) -> tuple:
    """The per-replica component variables (one for a plain variable)."""
    return tuple(getattr(variable, "values", (variable,)))


def replicas(obj) -> dict:
    """object path -> tuple of host copies, one per replica."""
    return {path: tuple(np.array(c.numpy()) for c in components(v))
            for path, v in objckpt.tree(obj).items()}


def assert_replicas_equal(expected: dict, got: dict):
    assert list(expected) == list(got)
    for path in expected:
        want, have = expected[path], got[path]
        assert len(want) == len(have), path
        for i, (a, b) in enumerate(zip(want, have)):
            assert a.dtype == b.dtype and a.shape == b.shape, (path, i)
            assert a.tobytes() == b.tobytes(), f"{path} replica {i}: {a} != {b}"


def scramble(obj, seed: int):
    """Gives every replica of every variable its own random value (replicas disagree)."""
    rng = np.random.default_rng(seed)
    for variable in objckpt.tree(obj).values():
        for component in components(variable):
            dtype = component.dtype.base_dtype
            value = (rng.normal(size=component.shape) if dtype.is_floating
                     else rng.integers(0, 50, size=component.shape))
            component.assign(np.asarray(value).astype(dtype.as_numpy_dtype))


def tf_read(obj, prefix: str) -> dict:
    """Per-replica values TF's own restore gives obj (obj is scrambled first)."""
    scramble(obj, 99)
    tf.train.Checkpoint(root=obj).read(prefix).assert_existing_objects_matched()
    return replicas(obj)


def checkpoint_values(prefix: str) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {key.split("/.ATTRIBUTES/")[0]: reader.get_tensor(key)
            for key, _ in tf.train.list_variables(prefix)
            if key.endswith("/.ATTRIBUTES/VARIABLE_VALUE") and not key.startswith("save_counter")}


def sync_on_read(obj) -> dict:
    return {path: v for path, v in objckpt.tree(obj).items()
            if getattr(v, "synchronization", None) == ON_READ}


def replica_step(strategy, fn):
    """Runs fn(replica number 1, 2, ...) in each replica's context."""

    @tf.function
    def step():
        strategy.run(lambda: fn(tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32)))

    step()


# --- the objs: the session's Keras and a plain tf.Module --------------------------


def keras_net(keras):
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.conv = keras.layers.Conv2D(4, 3)
            self.bn = keras.layers.BatchNormalization()
            self.flat = keras.layers.Flatten()
            self.block = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])
            self.seen = keras.metrics.Sum(name="seen")  # SyncOnRead SUM (tf_keras, Keras 2)

        def call(self, x, training=False):
            return self.block(self.flat(self.bn(self.conv(x), training=training)))

    return Net()


class ModuleNet(tf.Module):
    """Dense layers and SyncOnRead variables of every aggregation (float and int)."""

    def __init__(self):
        super().__init__()
        self.hidden = Dense(3, 4)
        self.head = Dense(4, 2)
        self.total = tf.Variable(0.0, synchronization=ON_READ, aggregation=SUM)
        self.count = tf.Variable(0, dtype=tf.int64, synchronization=ON_READ, aggregation=SUM)
        self.stat = tf.Variable(tf.zeros((4,)), synchronization=ON_READ, aggregation=MEAN)
        self.first = tf.Variable(0.0, synchronization=ON_READ, aggregation=FIRST)

    def __call__(self, x):
        return self.head(tf.nn.relu(self.hidden(x)))


def build(kind: str, strategy=None, *, train: bool = False, built: bool = True):
    """A fresh obj of `kind` ("keras" for this session's Keras, or "module"), created under
    `strategy` (None: no strategy). Built with its optimizer's slots; `train`: one step
    under the strategy and replica-dependent SyncOnRead updates."""
    scope = strategy.scope() if strategy is not None else _null()
    if kind == "module":
        with scope:
            net = ModuleNet()
            # TF1 momentum (a slot per variable). Not TF1 Adam: TF 2.12 leaves its beta
            # powers out of the object graph under a strategy (tf.train.Checkpoint too).
            optimizer = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
            obj = tf.train.Checkpoint(model=net, optimizer=optimizer)
        _module_step(obj, strategy, apply=train)
        return obj
    keras = keras_for(session_flavour())
    with scope:
        net = keras_net(keras)
        if not built:
            return net
        net(IMAGES[:1])
        net.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
        if train:
            net.fit(IMAGES, TARGETS, epochs=1, batch_size=8, verbose=0)
        else:
            _compat.build_optimizer(net.optimizer, net.trainable_variables)
    if train and strategy is not None:
        replica_step(strategy, lambda r: net.seen.update_state(r * 1.5))
    return net


def _module_step(obj, strategy, apply: bool):
    net, optimizer = obj.model, obj.optimizer

    def step(r):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(net(tf.ones((2, 3)) * r) ** 2)
        variables = net.hidden.trainable_variables + net.head.trainable_variables
        grads = tape.gradient(loss, variables)
        if not apply:
            grads = [tf.zeros_like(g) for g in grads]  # creates the slots, changes nothing
        optimizer.apply_gradients(zip(grads, variables))
        if apply:
            net.total.assign_add(r * 1.5)
            net.count.assign_add(tf.cast(r, tf.int64) * 3)
            net.stat.assign(tf.fill([4], r))
            net.first.assign(r * 7.0)

    if strategy is None:
        tf.function(lambda: step(tf.constant(1.0)))()
    else:
        replica_step(strategy, step)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


KINDS = ["keras", "module"]


@pytest.fixture(scope="module")
def strategy():
    return mirrored(2)


@pytest.fixture(scope="module")
def source(strategy, tmp_path_factory, request):
    """{kind: (trained obj, its Snapshot, prefix TF wrote, prefix objckpt wrote, dir)}."""
    made = {}

    def get(kind):
        if kind not in made:
            folder = tmp_path_factory.mktemp(f"source_{kind}")
            obj = build(kind, strategy, train=True)
            snap = objckpt.snapshot(obj)
            tf_prefix = tf.train.Checkpoint(root=obj).write(str(folder / "tf"))
            ours = objckpt.save(obj, str(folder / "ours"))
            manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=obj),
                                                 str(folder / "managed"), max_to_keep=1)
            manager.save()
            made[kind] = (obj, snap, tf_prefix, ours, str(folder / "managed"))
        return made[kind]

    return get


@pytest.fixture(scope="module")
def target(strategy):
    """{kind: an obj of the same structure built under the 2-replica strategy}."""
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = build(kind, strategy)
        return made[kind]

    return get


@pytest.fixture(scope="module")
def expected(source, target):
    """{kind: per-replica values TF's restore of the source gives the 2-replica target}."""
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = tf_read(target(kind), source(kind)[2])
        return made[kind]

    return get


# --- tree, snapshot, save --------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_tree_holds_distributed_variables_with_every_replica(kind, source, strategy):
    obj, _, tf_prefix, _, _ = source(kind)
    tree = objckpt.tree(obj)
    assert set(tree) == set(checkpoint_values(tf_prefix))  # TF's own key set
    kinds = {type(v).__name__ for v in tree.values()}
    assert kinds <= {"MirroredVariable", "SyncOnReadVariable"}, kinds
    assert all(len(components(v)) == 2 for v in tree.values())
    devices = {c.device for v in tree.values() for c in components(v)}
    assert {d.rsplit(":", 1)[-1] for d in devices} == {"0", "1"}
    if kind == "module" or session_flavour() != "keras3":
        # tf_keras and Keras 2 BatchNorm statistics (MEAN) and metrics (SUM) are SyncOnRead;
        # after the replica steps their replicas disagree.
        on_read = sync_on_read(obj)
        assert on_read and {v.aggregation for v in on_read.values()} >= {SUM}
        assert any(not np.array_equal(*[c.numpy() for c in components(v)])
                   for v in on_read.values())


@pytest.mark.parametrize("kind", KINDS)
def test_snapshot_and_save_hold_what_tf_checkpoint_writes(kind, source):
    """The aggregate of a SyncOnRead variable, a MirroredVariable's value: bit for bit."""
    obj, snap, tf_prefix, ours, _ = source(kind)
    written = checkpoint_values(tf_prefix)
    assert set(snap) == set(written)
    for path, value in snap.items():
        assert np.array(value).tobytes() == written[path].tobytes(), path
    for path, value in checkpoint_values(ours).items():
        assert value.tobytes() == written[path].tobytes(), path
    for path, variable in sync_on_read(obj).items():  # the aggregate, not replica 0
        parts = [c.numpy() for c in components(variable)]
        want = {SUM: parts[0] + parts[1], MEAN: (parts[0] + parts[1]) / 2, FIRST: parts[0]}
        np.testing.assert_allclose(written[path], want[variable.aggregation], rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_plain_tf_reads_what_objckpt_saved_under_the_strategy(kind, source, target, expected,
                                                              tmp_path):
    _, snap, _, ours, _ = source(kind)
    fresh = target(kind)
    assert_replicas_equal(expected(kind), tf_read(fresh, ours))
    # Saving the Snapshot writes the same checkpoint.
    again = objckpt.save(snap, str(tmp_path / "from_snapshot"))
    for path, value in checkpoint_values(again).items():
        assert value.tobytes() == np.array(snap[path]).tobytes(), path


# --- restore -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["snapshot", "prefix", "tf_prefix", "directory"])
def test_restore_puts_every_replica_where_tf_restore_does(kind, form, source, target,
                                                         expected):
    _, snap, tf_prefix, ours, directory = source(kind)
    the_source = {"snapshot": snap, "prefix": ours, "tf_prefix": tf_prefix,
                  "directory": directory}[form]
    fresh = target(kind)
    want = expected(kind)
    for seed in (1, 2, 3):  # eager, then fused
        scramble(fresh, seed)
        report = objckpt.restore(fresh, the_source)
        assert len(report.restored) == len(want) and not report.missing
        assert_replicas_equal(want, replicas(fresh))
    for path, variable in sync_on_read(fresh).items():  # TF's convention, spelled out
        saved = np.array(snap[path])
        parts = [c.numpy() for c in components(variable)]
        if variable.aggregation == SUM:
            share = (saved / 2).astype(saved.dtype)  # integers truncate, as TF's cast does
            assert all(p.tobytes() == share.tobytes() for p in parts), path
        else:
            assert all(p.tobytes() == saved.tobytes() for p in parts), path


@pytest.mark.parametrize("kind", KINDS)
def test_restore_into_the_obj_snapshotted_fixes_every_replica(kind, strategy):
    obj = build(kind, strategy, train=True)
    snap = objckpt.snapshot(obj)
    before = replicas(obj)
    for seed in (4, 5, 6):  # the fast path: eager, then one fused call
        scramble(obj, seed)
        objckpt.restore(obj, snap)
        after = replicas(obj)
        for path, parts in after.items():
            variable = objckpt.tree(obj)[path]
            if getattr(variable, "synchronization", None) == ON_READ:
                continue  # each replica holds its share of the aggregate (checked above)
            assert all(p.tobytes() == parts[0].tobytes() for p in parts), path
            assert parts[0].tobytes() == before[path][0].tobytes(), path
    # The aggregate of every SyncOnRead variable is the one snapshotted (an odd integer
    # SUM loses its remainder: TF casts value / replicas).
    for path, variable in sync_on_read(obj).items():
        saved = np.array(snap[path])
        if variable.dtype.is_integer and variable.aggregation == SUM:
            saved = saved // 2 * 2
        assert np.array(variable.value()).tobytes() == saved.tobytes(), path


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["snapshot", "prefix"])
def test_failed_restore_leaves_every_replica_bit_identical(kind, form, source, target,
                                                          tmp_path):
    _, snap, _, _, _ = source(kind)
    fresh = target(kind)
    scramble(fresh, 7)  # every replica different
    before = replicas(fresh)
    values = dict(snap.items())
    # The last variable (an optimizer slot, a SyncOnRead variable) gets the wrong shape; not
    # a Keras 3 weight listed by its optimizer (errors name those by their layers' path).
    victim = [path for path in values if "_trainable_variables" not in path][-1]
    bad_shape = (*values[victim].shape, 2)
    values[victim] = tf.zeros(bad_shape, values[victim].dtype)
    bad = objckpt.Snapshot(values)
    if form == "prefix":
        bad = objckpt.save(bad, str(tmp_path / "bad"))
    with pytest.raises(errors.StructureMismatchError,
                       match=f"(?s)`{re.escape(victim)}`.*: shape {re.escape(str(bad_shape))}"):
        objckpt.restore(fresh, bad)
    assert_replicas_equal(before, replicas(fresh))


@pytest.mark.parametrize("kind", KINDS)
def test_restore_and_snapshot_inside_a_tf_function(kind, source, target, expected):
    """In a tf.function (cross-replica context), as eagerly: every replica as TF puts it."""
    _, snap, _, _, _ = source(kind)
    fresh = target(kind)
    scramble(fresh, 13)
    tf.function(lambda: objckpt.restore(fresh, snap) and None)()
    assert_replicas_equal(expected(kind), replicas(fresh))
    taken = tf.function(lambda: objckpt.snapshot(fresh).as_dict())()
    again = objckpt.snapshot(fresh)
    assert set(taken) == set(again)
    for path, value in taken.items():
        assert np.array(value).tobytes() == np.array(again[path]).tobytes(), path


@pytest.mark.parametrize("operation", ["snapshot", "restore", "save"])
def test_inside_strategy_run_is_refused(operation, source, strategy, tmp_path):
    """In a replica context a SyncOnRead variable shows only its own replica's component:
    reading or assigning there would be wrong without an error."""
    obj, snap, _, _, _ = source("module")
    before = replicas(obj)
    call = {"snapshot": lambda: objckpt.snapshot(obj),
            "restore": lambda: objckpt.restore(obj, snap),
            "save": lambda: objckpt.save(obj, str(tmp_path / "ck"))}[operation]
    with pytest.raises(errors.DistributedVariableError,
                       match=rf"objckpt.{operation} was called inside `strategy.run`.*Fix: "
                             rf"call objckpt.{operation} outside strategy.run") as caught:
        strategy.run(call)
    assert caught.value.path == "model/total"
    assert caught.value.variable_type == "SyncOnReadVariable"
    # In a tf.function AutoGraph re-raises it (as a StagingError naming it).
    with pytest.raises(Exception, match=rf"objckpt.{operation} was called inside"):
        tf.function(lambda: strategy.run(call) and None)()
    assert_replicas_equal(before, replicas(obj))
    assert os.listdir(tmp_path) == []


# --- deferred, plan, migrate ------------------------------------------------------


def test_restore_on_create_lands_on_every_replica(source, strategy, expected):
    kind = "keras"
    _, snap, _, ours, _ = source(kind)
    keras = keras_for(session_flavour())
    for the_source in (ours, snap):
        with strategy.scope():
            net = build(kind, strategy, built=False)
        pending = objckpt.restore_on_create(net, the_source)
        assert not pending.done
        with strategy.scope():
            net(IMAGES[:1])  # values land as the layers build, before this first call
        at_first_call = {id(v): tuple(np.array(c.numpy()) for c in components(v))
                         for v in objckpt.tree(net).values()}
        with strategy.scope():
            net.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
            _compat.build_optimizer(net.optimizer, net.trainable_variables)
        want = expected(kind)
        tree = objckpt.tree(net)  # Keras 3: the final paths run through the optimizer
        built = {path: at_first_call[id(v)] for path, v in tree.items()
                 if id(v) in at_first_call}
        assert_replicas_equal({p: want[p] for p in built}, built)
        got = replicas(net)
        pending.assert_done()  # Keras 2's OptimizerV2 slots included: they land when created
        assert_replicas_equal({p: want[p] for p in got}, got)
        assert len(got) >= len(built) > 0


def test_restore_on_create_module_variables_made_later(source, strategy, expected):
    _, snap, _, ours, _ = source("module")
    want = expected("module")
    for the_source in (ours, snap):
        with strategy.scope():
            net = tf.Module()
        holder = tf.train.Checkpoint(model=net)
        pending = objckpt.restore_on_create(holder, the_source,
                                            rules=[(r"/\.OPTIMIZER_SLOT/", None)])
        with strategy.scope():
            net.total = tf.Variable(0.0, synchronization=ON_READ, aggregation=SUM)
            net.stat = tf.Variable(tf.zeros((4,)), synchronization=ON_READ, aggregation=MEAN)
            net.hidden = Dense(3, 4)
        assert not pending.done  # head, count, first: not created
        got = replicas(holder)
        for path in ("model/total", "model/stat", "model/hidden/w", "model/hidden/b"):
            assert len(got[path]) == 2
            for a, b in zip(got[path], want[path]):
                assert a.tobytes() == b.tobytes(), path
        pending.cancel()


class LazyNet(tf.Module):
    """Creates its variables on its first call: a MirroredVariable, SyncOnRead SUM and MEAN."""

    def __init__(self):
        super().__init__()
        self.built = False

    def __call__(self, x):
        if not self.built:
            self.w = tf.Variable(tf.zeros([2]))
            self.total = tf.Variable(0.0, synchronization=ON_READ, aggregation=SUM)
            self.stat = tf.Variable(tf.zeros([2]), synchronization=ON_READ, aggregation=MEAN)
            self.built = True
        return x * self.w


def create_inside_run(strategy, mode: str, call):
    """Calls `call` (which creates variables) inside strategy.run: eagerly, or traced in a
    tf.function around strategy.run."""
    if mode == "eager":
        strategy.run(call)
    else:
        tf.function(lambda: strategy.run(call))()


@pytest.fixture(scope="module")
def lazy_source(tmp_path_factory):
    """A LazyNet built on one device: (its Snapshot, a prefix tf.train.Checkpoint wrote)."""
    net = LazyNet()
    net(1.0)
    net.w.assign([5.0, 6.0])
    net.total.assign(8.0)
    net.stat.assign([1.0, 3.0])
    folder = tmp_path_factory.mktemp("lazy")
    return objckpt.snapshot(net), tf.train.Checkpoint(root=net).write(str(folder / "ck"))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_restore_on_create_inside_strategy_run_lands_as_tf_restore(mode, strategy,
                                                                  lazy_source):
    """Variables created inside strategy.run (a replica context) get every replica's value
    as TF's own deferred restore gives it: the MirroredVariable's value on both replicas
    (not only the creating one), a SUM variable value / 2 on each (not the value on each,
    which doubles its aggregate)."""
    snap, prefix = lazy_source
    with strategy.scope():
        reference = LazyNet()
    tf.train.Checkpoint(root=reference).read(prefix)
    create_inside_run(strategy, mode, lambda: reference(tf.constant(1.0)))
    want = replicas(reference)
    as_arrays = {path: [a.tolist() for a in values] for path, values in want.items()}
    assert as_arrays == {"w": [[5.0, 6.0], [5.0, 6.0]], "total": [4.0, 4.0],
                         "stat": [[1.0, 3.0], [1.0, 3.0]]}
    for the_source in (prefix, snap):
        with strategy.scope():
            net = LazyNet()
        pending = objckpt.restore_on_create(net, the_source)
        assert not pending.done
        create_inside_run(strategy, mode, lambda net=net: net(tf.constant(1.0)))
        pending.assert_done()
        assert_replicas_equal(want, replicas(net))
        assert float(objckpt.snapshot(net)["total"]) == 8.0  # the aggregate TF saves


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.slow
def test_restore_on_create_keras_dense_built_inside_strategy_run(mode, strategy, tmp_path):
    """A Keras Dense built by its first call inside strategy.run gets the source's kernel
    and bias on every replica, as TF's restore of the same layer built in the scope."""
    keras = keras_for(session_flavour())
    original = keras.layers.Dense(3)
    original.build((None, 4))
    original.kernel.assign(np.arange(12, dtype="float32").reshape(4, 3) / 7)
    original.bias.assign([1.5, -2.0, 0.25])
    snap = objckpt.snapshot(original)
    prefix = tf.train.Checkpoint(root=original).write(str(tmp_path / "ck"))
    with strategy.scope():
        reference = keras.layers.Dense(3)
        reference.build((None, 4))
    tf.train.Checkpoint(root=reference).read(prefix).assert_existing_objects_matched()
    want = replicas(reference)
    kernel = original.kernel.numpy()
    assert [a.tobytes() for a in want[next(p for p in want if "kernel" in p)]] == \
        [kernel.tobytes()] * 2
    for the_source in (prefix, snap):
        with strategy.scope():
            layer = keras.layers.Dense(3)
        pending = objckpt.restore_on_create(layer, the_source)
        create_inside_run(strategy, mode, lambda layer=layer: layer(tf.ones((1, 4))))
        pending.assert_done()
        assert_replicas_equal(want, replicas(layer))


@pytest.mark.parametrize("kind", KINDS)
def test_plan_and_migrate_into_a_model_built_under_the_strategy(kind, source, target,
                                                                expected, tmp_path):
    _, _, tf_prefix, _, _ = source(kind)
    fresh = target(kind)
    plan = objckpt.plan(fresh, tf_prefix)
    assert not plan.unmatched_variables and not plan.unmatched_source
    assert len(plan.matches) == len(objckpt.tree(fresh))
    migrated = objckpt.migrate(fresh, tf_prefix, str(tmp_path / "migrated"),
                               optimizer_state=True)
    assert migrated == str(tmp_path / "migrated")
    assert_replicas_equal(expected(kind), tf_read(fresh, migrated))
    scramble(fresh, 8)
    objckpt.restore(fresh, migrated)
    assert_replicas_equal(expected(kind), replicas(fresh))


# --- across strategies and replica counts ----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_two_replicas_to_one_device_and_back(kind, source, target, expected, tmp_path):
    _, snap, tf_prefix, ours, _ = source(kind)
    single = build(kind, None)
    assert not any(isinstance(v, tf.distribute.DistributedValues)
                   for v in objckpt.tree(single).values())
    # Two replicas -> no strategy: each variable gets the saved (aggregate) value, as TF's.
    want = tf_read(single, tf_prefix)
    for the_source in (snap, ours):
        scramble(single, 9)
        objckpt.restore(single, the_source)
        assert_replicas_equal(want, replicas(single))
        for path, (value,) in replicas(single).items():
            assert value.tobytes() == np.array(snap[path]).tobytes(), path
    # No strategy -> two replicas: per replica as TF's restore does it.
    one_snap = objckpt.snapshot(single)
    one_prefix = objckpt.save(single, str(tmp_path / "single"))
    fresh = target(kind)
    want = tf_read(fresh, one_prefix)
    assert_replicas_equal(want, expected(kind))  # the same values came back
    for the_source in (one_snap, one_prefix):
        scramble(fresh, 10)
        objckpt.restore(fresh, the_source)
        assert_replicas_equal(want, replicas(fresh))


@pytest.mark.parametrize("kind", KINDS)
def test_two_replicas_to_a_one_device_mirrored_strategy(kind, source, target, tmp_path):
    _, snap, tf_prefix, ours, _ = source(kind)
    one = build(kind, mirrored(1))
    tree = objckpt.tree(one)
    assert all(len(components(v)) == 1 for v in tree.values())
    assert any(isinstance(v, tf.distribute.DistributedValues) for v in tree.values())
    want = tf_read(one, tf_prefix)
    for the_source in (snap, ours):
        scramble(one, 11)
        objckpt.restore(one, the_source)
        assert_replicas_equal(want, replicas(one))
        for path, (value,) in replicas(one).items():  # SUM / 1: the saved value itself
            assert value.tobytes() == np.array(snap[path]).tobytes(), path
    # And back into two replicas, from what was written or taken under one.
    written = objckpt.save(one, str(tmp_path / "one"))
    assert set(checkpoint_values(written)) == set(checkpoint_values(tf_prefix))
    fresh = target(kind)
    want = tf_read(fresh, written)
    for the_source in (written, objckpt.snapshot(one)):
        scramble(fresh, 14)
        objckpt.restore(fresh, the_source)
        assert_replicas_equal(want, replicas(fresh))


def test_sync_on_read_round_trip_agrees_with_tf_checkpoint(strategy, tmp_path):
    """objckpt save -> restore and tf.train.Checkpoint write -> read give every replica the
    same bits, for SUM (float and int), MEAN and ONLY_FIRST_REPLICA variables."""
    obj = build("module", strategy, train=True)
    net = obj.model
    parts = {name: [c.numpy() for c in components(getattr(net, name))]
             for name in ("total", "count", "stat", "first")}
    assert parts["total"][0] != parts["total"][1]
    tf_prefix = tf.train.Checkpoint(root=obj).write(str(tmp_path / "tf"))
    ours = objckpt.save(obj, str(tmp_path / "ours"))
    with_tf = tf_read(obj, tf_prefix)
    scramble(obj, 12)
    objckpt.restore(obj, ours)
    assert_replicas_equal(with_tf, replicas(obj))
    assert with_tf["model/total"][0] == (parts["total"][0] + parts["total"][1]) / 2
    # int64 SUM 3 + 6 = 9 restores as 4 per replica: TF's cast of 9 / 2 (the sum is not kept).
    assert [int(x) for x in with_tf["model/count"]] == [4, 4]
    assert all(float(x) == parts["first"][0] for x in with_tf["model/first"])


# --- ShardedVariable: a checkpoint TF wrote from one ----------------------------------
# (sharded variables in live objs: tests/distributed/test_sharded.py)


def sharded_module():
    from tensorflow.python.distribute import sharded_variable  # test only: no public maker

    module = tf.Module()
    module.table = sharded_variable.ShardedVariable(
        [tf.Variable(tf.ones((2, 3))), tf.Variable(tf.fill((3, 3), 2.0))])
    module.bias = tf.Variable(tf.ones((3,)))
    return module


def plain_module():
    module = tf.Module()
    module.table = tf.Variable(tf.zeros((5, 3)))
    module.bias = tf.Variable(tf.zeros((3,)))
    return module


def test_checkpoint_tf_wrote_from_a_sharded_variable_reads_as_one_tensor(tmp_path):
    """Supported: TF saves a ShardedVariable as slices of one tensor under one key."""
    module = sharded_module()
    prefix = tf.train.Checkpoint(root=module).write(str(tmp_path / "sharded"))
    tree = objckpt.read_tree(prefix)
    assert tree["table"].shape == (5, 3) and tree["bias"].shape == (3,)
    whole = np.concatenate([np.ones((2, 3)), np.full((3, 3), 2.0)]).astype("float32")
    plain = plain_module()
    report = objckpt.restore(plain, prefix)
    assert sorted(report.restored) == ["bias", "table"]
    assert plain.table.numpy().tobytes() == whole.tobytes()
    later = tf.Module()
    pending = objckpt.restore_on_create(later, prefix)
    later.table = tf.Variable(tf.zeros((5, 3)))
    later.bias = tf.Variable(tf.zeros((3,)))
    pending.assert_done()
    assert later.table.numpy().tobytes() == whole.tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_only_reading_values_reduces_across_replicas(kind, source, target, strategy,
                                                     monkeypatch, tmp_path):
    """A SyncOnRead variable answers any attribute it lacks with a reduction across replicas
    (a collective under MultiWorkerMirroredStrategy, which every worker must join). objckpt
    reduces only where it reads values, so workers running the same code stay in step."""
    obj, snap, _, ours, _ = source(kind)
    fresh = target(kind)
    if kind == "module":  # TF's own walk of a TF1 optimizer probes every variable
        obj, fresh = obj.model, fresh.model
        snap = objckpt.snapshot(obj)
    reduced = []
    real_reduce = strategy.reduce
    monkeypatch.setattr(strategy, "reduce",
                        lambda *a, **k: reduced.append(a) or real_reduce(*a, **k))
    objckpt.tree(obj)
    objckpt.restore(fresh, snap)
    objckpt.restore(fresh, objckpt.save(snap, str(tmp_path / "s")))
    objckpt.plan(fresh, ours, at="model" if kind == "module" else None)
    objckpt.migrate(fresh, snap, str(tmp_path / "m"))
    objckpt.restore_on_create(fresh, snap).assert_done()
    assert reduced == []
    pending = objckpt.restore_on_create(tf.Module(), snap)
    pending.cancel()
    assert reduced == []


# --- MultiWorkerMirroredStrategy: every worker calls save, the chief writes --------------


def test_who_writes_checkpoints():
    plain = tf.Variable(1.0)
    assert _compat.writes_checkpoints([plain])
    with mirrored(2).scope():
        mirrored_variable = tf.Variable(1.0)
    assert _compat.writes_checkpoints([mirrored_variable])
    workers = tf.distribute.MultiWorkerMirroredStrategy()  # one local worker: the chief
    with workers.scope():
        collective = tf.Variable(1.0)
    assert _compat.variables_strategy([plain, collective]) is workers
    assert _compat.writes_checkpoints([collective])


@pytest.fixture
def worker_module():
    workers = tf.distribute.MultiWorkerMirroredStrategy()
    with workers.scope():
        module = tf.Module()
        module.w = tf.Variable([1.0, 2.0])
        module.total = tf.Variable(3.0, synchronization=ON_READ, aggregation=SUM)
    return workers, module


def test_multi_worker_chief_writes(worker_module, tmp_path):
    _, module = worker_module
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    assert checkpoint_values(prefix) == {"w": pytest.approx([1.0, 2.0]), "total": 3.0}


def test_multi_worker_non_chief_reads_like_the_chief_and_writes_nothing(worker_module,
                                                                        tmp_path, monkeypatch):
    workers, module = worker_module
    # This process plays a worker that is not the chief (multi_worker_util.is_chief False).
    monkeypatch.setattr(type(workers.extended), "should_checkpoint", property(lambda _: False))
    reduced = []
    real_reduce = workers.reduce
    monkeypatch.setattr(workers, "reduce",
                        lambda *a, **k: reduced.append(a) or real_reduce(*a, **k))
    assert not _compat.writes_checkpoints(objckpt.tree(module).values())
    prefix = str(tmp_path / "ck")
    assert objckpt.save(module, prefix) == prefix
    assert len(reduced) == 1  # the SyncOnRead read, a collective every worker joins
    assert objckpt.save(objckpt.snapshot(module), prefix) == prefix
    assert os.listdir(tmp_path) == []
    with pytest.raises(errors.UnbuiltModelError), workers.scope():  # as on the chief
        objckpt.save(tf.Module(), prefix)


def test_multi_worker_restore_inside_a_tf_function(worker_module, monkeypatch):
    """Under MultiWorkerMirroredStrategy (one local worker here) the agreement of a restore
    traced in a tf.function runs eagerly at trace time (it called .numpy() on a symbolic
    tensor), and no collective runs eagerly (TF warns of its overhead each time)."""
    workers, module = worker_module
    snap = objckpt.snapshot(module)
    runs = []
    real_run = workers.run
    monkeypatch.setattr(workers, "run",
                        lambda *a, **k: runs.append(tf.executing_eagerly()) or real_run(*a, **k))

    @tf.function
    def restore():
        objckpt.restore(module, snap)

    module.w.assign([5.0, 6.0])
    restore()
    assert module.w.numpy().tolist() == [1.0, 2.0]
    module.w.assign([5.0, 6.0])
    objckpt.restore(module, snap)  # eagerly: the same agreement, traced once
    assert module.w.numpy().tolist() == [1.0, 2.0]
    assert runs and not any(runs)
    bad = objckpt.Snapshot({"w": tf.zeros([3]), "total": tf.constant(1.0)})

    @tf.function(autograph=False)  # AutoGraph would wrap the error in a StagingError
    def restore_bad():
        objckpt.restore(module, bad)

    with pytest.raises(errors.StructureMismatchError, match="`w`"):
        restore_bad()
    assert module.w.numpy().tolist() == [1.0, 2.0]
