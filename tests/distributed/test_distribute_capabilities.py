"""Twins, Freezer and load_ensemble on models built under a two-replica MirroredStrategy
(`flavours.mirrored()`), inside `strategy.run` (traced and eagerly) and outside it.

Every check reads each replica's own variable (`var.values`) bit for bit: after `sync()` each
replica of past equals the same replica of current; `sync(tau)` equals the same blend of the
same values computed by one-device Twins; a Freezer step equals, bit for bit, the optimizer's
plain step under the same strategy given only the unfrozen variables, and a one-device step on
the whole batch up to float summation order (the all-reduce adds two half-batch gradients).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors

from flavours import keras_for, mirrored, session_flavour

ON_READ = tf.VariableSynchronization.ON_READ
IMAGES = np.random.default_rng(0).normal(size=(8, 6, 6, 3)).astype("float32")
TARGETS = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
FLAVOURS = (session_flavour(), "module")


# --- models ------------------------------------------------------------------------


class Dense(tf.Module):
    def __init__(self, n_in, n_out, seed):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_normal((n_in, n_out), seed=(seed, 0)) * 0.1)
        self.b = tf.Variable(tf.zeros((n_out,)))

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


class Net(tf.Module):
    """A tf.Module network with a SyncOnRead counter (SUM) and an integer step."""

    def __init__(self):
        super().__init__()
        self.hidden = Dense(6 * 6 * 3, 3, 1)
        self.head = Dense(3, 2, 2)
        self.calls = tf.Variable(0.0, trainable=False, synchronization=ON_READ,
                                 aggregation=tf.VariableAggregation.SUM)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)

    def __call__(self, x, training=False):
        return self.head(tf.nn.relu(self.hidden(tf.reshape(x, (-1, 6 * 6 * 3)))))


def build(flavour: str, strategy=None, *, dense_only: bool = False, optimizer=None):
    """A model of a flavour with its optimizer's state built (Keras: compiled with a metric
    and fitted for one epoch; module: one step of TF1 Adam), under `strategy` if given."""
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    if flavour == "module":
        with scope:
            net = Net()
            net.optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        _step(net, strategy, lambda grads: net.optimizer.apply_gradients(
            zip(grads, net.trainable_variables)))
        return net
    keras = keras_for(flavour)
    with scope:
        inputs = keras.Input((6, 6, 3))
        if dense_only:
            x = keras.layers.Flatten()(inputs)
        else:
            x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
            x = keras.layers.BatchNormalization(name="bn")(x)
            x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(3, activation="relu", name="hidden")(x)
        model = keras.Model(inputs, keras.layers.Dense(2, name="head")(x))
        model.compile(optimizer=optimizer() if optimizer else keras.optimizers.Adam(0.01),
                      loss="mse", metrics=["mae"])
    model.fit(IMAGES, TARGETS, epochs=1, batch_size=4, verbose=0)
    return model


def optimizer_of(model):
    return model.optimizer


def _loss(model, x, y):
    # The global batch is 8: each replica's sum over its rows / 8, as TF scales it.
    return tf.reduce_sum((model(x, training=False) - y) ** 2) / float(len(IMAGES))


def _step(model, strategy, apply, *, traced: bool = True):
    """One step on IMAGES/TARGETS: per replica half the batch under `strategy` (gradients
    all-reduced by the optimizer), else the whole batch on one device."""

    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            loss = _loss(model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        apply(grads)

    if strategy is None:
        return (tf.function(replica_fn) if traced else replica_fn)(IMAGES, TARGETS)
    x, y = halves(strategy)
    if traced:
        return tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))(x, y)
    return strategy.run(replica_fn, args=(x, y))


def halves(strategy):
    """IMAGES/TARGETS split in two: replica r gets rows 4r..4r+3."""
    def part(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.constant(IMAGES[4 * r:4 * r + 4]), tf.constant(TARGETS[4 * r:4 * r + 4])
    return strategy.experimental_distribute_values_from_function(part)


# --- state helpers -------------------------------------------------------------------


def parts(variable) -> tuple:
    return tuple(getattr(variable, "values", (variable,)))


def per_replica(tree) -> dict:
    """path -> tuple of host copies, one per replica."""
    return {p: tuple(np.array(c.numpy()) for c in parts(v)) for p, v in tree.items()}


def load(tree, state: dict) -> None:
    for path, values in state.items():
        for component, value in zip(parts(tree[path]), values):
            component.assign(value)


def seed(tree, salt: int) -> dict:
    """Gives every variable a value of its own for `salt` (a SyncOnRead variable one per
    replica, as training leaves them); returns the state as `per_replica` does."""
    state = {}
    for path, variable in tree.items():
        rng = np.random.default_rng([salt, sum(map(ord, path))])
        values = []
        for r, _ in enumerate(parts(variable)):
            dtype = variable.dtype.as_numpy_dtype
            if variable.dtype.is_integer:
                value = rng.integers(1, 50, size=variable.shape)
            else:
                value = np.abs(rng.normal(size=variable.shape)) + 0.5
            if variable.synchronization == ON_READ:
                value = value + r
            values.append(np.asarray(value, dtype))
            if variable.synchronization != ON_READ:
                values = values[:1] * len(parts(variable))
                break
        state[path] = tuple(values)
    load(tree, state)
    return state


def assert_bits(want: dict, got: dict, paths=None):
    for path in paths if paths is not None else want:
        assert len(want[path]) == len(got[path]), path
        for r, (a, b) in enumerate(zip(want[path], got[path])):
            assert a.dtype == b.dtype and a.shape == b.shape, (path, r)
            assert a.tobytes() == b.tobytes(), f"`{path}` replica {r}: {b} != {a}"


def replicas_identical(state: dict, paths):
    for path in paths:
        first = state[path][0].tobytes()
        assert all(v.tobytes() == first for v in state[path]), f"`{path}`: replicas differ"


def tf_variable(variable):
    """The tf.Variable behind a Keras 3 variable (itself for others)."""
    return _compat.as_variable(variable)


def net_tree(obj) -> dict:
    """Object path -> variable for the network's own variables (no optimizer state), as
    Twins, Freezer and load_ensemble see them."""
    return dict(_compat.network_variable_paths(obj))


def own_variables(model) -> set:
    """ids of what the model itself lists: Keras `model.variables`, a module's
    `variables` (never the optimizer's state, nor Keras metrics)."""
    return {id(tf_variable(v)) for v in model.variables}


def full_tree(model) -> dict:
    """objckpt.tree(model), plus a TF1 optimizer's non-slot variables (Adam's beta powers) by
    name: TF 2.12 leaves them out of the object graph under a strategy (and its variables()
    lists none there: they were made inside a tf.function)."""
    tree = dict(objckpt.tree(model))
    if isinstance(model.optimizer, tf.compat.v1.train.Optimizer):
        tree.update({f"(by name)/{v.name}": v
                     for v in model.optimizer._non_slot_dict.values()})
    return tree


def equalize(tree) -> dict:
    """Every replica of every variable gets replica 0's value (training leaves BatchNorm
    statistics per replica); returns the state."""
    state = {p: (v[0],) * len(v) for p, v in per_replica(tree).items()}
    load(tree, state)
    return state


class Holder(tf.Module):
    def __init__(self, arrays):
        super().__init__()
        self.v = [tf.Variable(a) for a in arrays]


def one_device_blend(current: list, past: list, tau) -> list:
    """past after objckpt.Twins(...).sync(tau) of plain variables on one device."""
    with tf.device("/cpu:0"):
        c, p = Holder(current), Holder(past)
    objckpt.Twins(c, past=p).sync(tau)
    return [np.array(v.numpy()) for v in p.v]


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strategy():
    return mirrored()


@pytest.fixture(scope="module", params=FLAVOURS)
def pair(request, strategy):
    """(flavour, current, past): two models built by the same code under the strategy."""
    flavour = request.param
    return flavour, build(flavour, strategy), build(flavour, strategy)


@pytest.fixture(scope="module")
def twins(pair):
    _, current, past = pair
    return objckpt.Twins(current, past=past)


def sides(twins):
    pairs = twins.variables()
    return ({p: c for p, (c, _) in pairs.items()}, {p: q for p, (_, q) in pairs.items()})


def seeded(twins, salt):
    current, past = sides(twins)
    return seed(current, salt), seed(past, salt + 1000)


def expected_blend(a: dict, b: dict, tau: float) -> dict:
    """Per replica, the one-device blend of that replica's values (integers copied)."""
    keys = [(path, r) for path in a for r in range(len(a[path]))]
    blended = dict(zip(keys, one_device_blend([a[p][r] for p, r in keys],
                                              [b[p][r] for p, r in keys], tau)))
    return {path: tuple(blended[path, r] for r in range(len(a[path]))) for path in a}


# --- Twins -----------------------------------------------------------------------------


def test_twins_pair_every_replica_of_the_network_and_no_metric(pair, twins):
    flavour, current, _ = pair
    twinned = {id(c) for c, _ in twins.variables().values()}
    assert twinned == own_variables(current)
    kinds = {type(c).__name__ for c, _ in twins.variables().values()}
    assert kinds <= {"MirroredVariable", "SyncOnReadVariable"}, kinds
    for path, (c, q) in twins.variables().items():
        assert type(c) is type(q) and len(parts(c)) == len(parts(q)) == 2, path
        assert [x.device for x in parts(c)] == [x.device for x in parts(q)], path
    if flavour != "keras3":  # a module's counter, tf_keras / Keras 2 BatchNorm statistics
        assert any(c.synchronization == ON_READ for c, _ in twins.variables().values())
    if flavour != "module":  # compiled metrics hold state of their own, never twinned
        metric_ids = {id(tf_variable(v)) for m in current.metrics for v in m.variables}
        assert metric_ids
        assert not metric_ids & twinned
        assert not metric_ids & {id(v) for v in objckpt.tree(current).values()}


def test_sync_copies_each_replica_outside_strategy_run(pair, twins):
    _, current, past = pair
    a, _ = seeded(twins, 1)
    twins.sync()
    c, q = sides(twins)
    assert_bits(a, per_replica(q))
    assert_bits(a, per_replica(c))  # current untouched
    np.testing.assert_array_equal(past(IMAGES).numpy(), current(IMAGES).numpy())
    # independent afterwards, replica by replica
    seed(c, 2)
    assert_bits(a, per_replica(q))


def test_blend_is_the_one_device_blend_per_replica(twins):
    for tau in (0.25, 0.5):
        a, b = seeded(twins, 3)
        twins.sync(tau)
        _, q = sides(twins)
        assert_bits(expected_blend(a, b, tau), per_replica(q))
    blends = [k for k in twins._fns if k[0] == "blend" and len(k) == 2]
    assert len(blends) == 1
    assert twins._fns[blends[0]].function.experimental_get_tracing_count() == 1


def test_blend_is_tau_current_plus_one_minus_tau_past(twins):
    a, b = seeded(twins, 4)
    twins.sync(0.25)
    _, q = sides(twins)
    got = per_replica(q)
    for path in a:
        for r, value in enumerate(got[path]):
            if value.dtype.kind == "f":
                want = np.float32(0.25) * a[path][r] + np.float32(0.75) * b[path][r]
                np.testing.assert_allclose(value, want, rtol=1e-6, err_msg=path)
            else:
                assert np.array_equal(value, a[path][r]), path


def test_swap_exchanges_each_replica(twins):
    a, b = seeded(twins, 5)
    twins.swap()
    c, q = sides(twins)
    assert_bits(b, per_replica(c))
    assert_bits(a, per_replica(q))


def test_inside_strategy_run_traced_once(strategy, twins):
    @tf.function
    def in_run(kind, tau):
        def replica_fn():
            if kind == "swap":
                twins.swap()
            else:
                twins.sync(tau)
        strategy.run(replica_fn)

    for _ in range(2):
        a, _ = seeded(twins, 6)
        in_run("sync", 1.0)
        assert_bits(a, per_replica(sides(twins)[1]))
        a, b = seeded(twins, 7)
        in_run("sync", 0.25)
        assert_bits(expected_blend(a, b, 0.25), per_replica(sides(twins)[1]))
        a, b = seeded(twins, 8)
        in_run("sync", tf.constant(0.5))  # a tensor tau: the blend_or_copy kind
        assert_bits(expected_blend(a, b, 0.5), per_replica(sides(twins)[1]))
        a, b = seeded(twins, 9)
        in_run("swap", None)
        assert_bits(b, per_replica(sides(twins)[0]))
        assert_bits(a, per_replica(sides(twins)[1]))
    assert in_run.experimental_get_tracing_count() == 4  # two float taus, a tensor, swap
    per_replica_fns = {k: f for k, f in twins._fns.items() if len(k) == 3}
    assert {k[2] for k in per_replica_fns} == {0, 1}  # each replica its own pairs
    for key, fn in per_replica_fns.items():
        assert fn.function.experimental_get_tracing_count() == 1, key


def test_inside_strategy_run_eagerly(strategy, twins):
    a, _ = seeded(twins, 10)
    strategy.run(lambda: twins.sync())
    assert_bits(a, per_replica(sides(twins)[1]))
    a, b = seeded(twins, 11)
    strategy.run(lambda: twins.sync(0.25))
    assert_bits(expected_blend(a, b, 0.25), per_replica(sides(twins)[1]))
    a, b = seeded(twins, 12)
    strategy.run(lambda: twins.swap())
    assert_bits(b, per_replica(sides(twins)[0]))
    assert_bits(a, per_replica(sides(twins)[1]))


def test_train_then_sync_in_one_replica_function(strategy, pair, twins):
    """The target-network step: the update, then the copy, in one traced replica function:
    past gets the updated values (TF orders the copy after the update)."""
    _, current, _ = pair
    optimizer = optimizer_of(current)
    seeded(twins, 13)

    def apply(grads):
        optimizer.apply_gradients(zip(grads, current.trainable_variables))
        twins.sync()

    before = per_replica(sides(twins)[0])
    _step(current, strategy, apply)
    after = per_replica(sides(twins)[0])
    moved = [p for p in after if after[p][0].tobytes() != before[p][0].tobytes()]
    assert moved
    assert_bits(after, per_replica(sides(twins)[1]))


def test_include_and_exclude_under_the_strategy(twins):
    first, second = twins.paths[:2]
    a, b = seeded(twins, 14)
    twins.sync(include="^" + re.escape(first) + "$")
    got = per_replica(sides(twins)[1])
    assert_bits(a, got, [first])
    assert_bits(b, got, [p for p in twins.paths if p != first])
    twins.sync(exclude="^" + re.escape(second) + "$")
    got = per_replica(sides(twins)[1])
    assert_bits(a, got, [p for p in twins.paths if p != second])
    assert_bits(b, got, [second])


def test_default_past_is_a_clone_under_the_same_strategy(strategy, pair):
    _, current, _ = pair
    twins = objckpt.Twins(current)
    for path, (c, q) in twins.variables().items():
        assert type(c) is type(q), path
        assert [x.device for x in parts(c)] == [x.device for x in parts(q)], path
    a, b = seeded(twins, 15)
    twins.sync(0.25)
    assert_bits(expected_blend(a, b, 0.25), per_replica(sides(twins)[1]))
    a, _ = seeded(twins, 16)
    strategy.run(lambda: twins.sync())
    assert_bits(a, per_replica(sides(twins)[1]))


def test_past_on_one_device_is_refused_naming_the_path(pair):
    flavour, current, _ = pair
    with pytest.raises(errors.StructureMismatchError) as raised:
        objckpt.Twins(current, past=build(flavour))
    message = str(raised.value)
    assert len(raised.value.problems) == len(net_tree(current))
    assert any(re.search(r"^`[^`]+`: mirrored over 2 replica\(s\) \(.*CPU:0, .*CPU:1\) in "
                         r"current but a \w+ on .*CPU:0 in past$", p)
               for p in raised.value.problems), raised.value.problems
    assert "strategy scope" in message and "past=None" in message


def test_plain_variables_inside_strategy_run_are_refused(strategy):
    twins = objckpt.Twins(Net(), past=Net())  # built outside the strategy's scope
    with pytest.raises(errors.DistributedVariableError,
                       match=r"strategy\.run \(2 replicas\): `[\w/]+` is a plain "
                             r"ResourceVariable.*Fix: .*strategy's scope") as raised:
        strategy.run(lambda: twins.sync(0.5))
    assert raised.value.path in twins.paths
    with pytest.raises(errors.DistributedVariableError, match="is a plain"):
        tf.function(lambda: strategy.run(lambda: twins.swap()))()
    twins.sync(0.5)  # outside strategy.run: one device, fine


class Many(tf.Module):
    """40 small float variables and a SyncOnRead one: Twins' packed eager path."""

    def __init__(self):
        super().__init__()
        self.v = [tf.Variable(tf.zeros((3, 2))) for _ in range(40)]
        self.mean = tf.Variable(tf.zeros((2,)), trainable=False, synchronization=ON_READ,
                                aggregation=tf.VariableAggregation.MEAN)


@pytest.mark.slow
def test_packed_eager_path_per_device_matches_the_traced_one(strategy, monkeypatch):
    packed = []
    original = _compat.packed_pairs_call

    def spy(kind, current, past):
        call = original(kind, current, past)
        if not any(id(v) in watched for v in current):
            return call  # the one-device Twins of expected_blend
        assert call is not None, "the replicas of 41 pairs take the packed path"
        devices = {v.device for v in current}
        return lambda *a: (packed.append((kind, len(current), len(devices))), call(*a))[1]

    monkeypatch.setattr(_compat, "packed_pairs_call", spy)
    with strategy.scope():
        eager = objckpt.Twins(Many(), past=Many())
        traced = objckpt.Twins(Many(), past=Many())
    watched = {id(p) for c, _ in eager.variables().values() for p in parts(c)}
    for step, (kind, tau, in_run) in enumerate([
            ("sync", 0.3, False), ("swap", None, False), ("sync", 1.0, False),
            ("sync", 0.3, True), ("swap", None, True)]):
        for twins in (eager, traced):
            a, b = seeded(twins, 40 + step)

        def operation(twins, kind=kind, tau=tau):
            return twins.swap() if kind == "swap" else twins.sync(tau)

        if in_run:
            strategy.run(lambda: operation(eager))
            tf.function(lambda: strategy.run(lambda: operation(traced)))()
        else:
            operation(eager)
            tf.function(lambda: operation(traced))()
        for side in (0, 1):
            assert_bits(per_replica(sides(traced)[side]), per_replica(sides(eager)[side]))
        if kind == "sync" and tau < 1:
            assert_bits(expected_blend(a, b, tau), per_replica(sides(eager)[1]))
    # outside strategy.run one call for both replicas (two devices), inside one per replica
    assert packed == [("blend", 82, 2), ("swap", 82, 2), ("copy", 82, 2),
                      ("blend", 41, 1), ("blend", 41, 1), ("swap", 41, 1), ("swap", 41, 1)]


# --- Freezer ---------------------------------------------------------------------------


def _frozen_pattern(flavour):
    return "^hidden/" if flavour == "module" else "conv|hidden"


def _apply_plain(model, optimizer, keep):
    """The optimizer's own step for the variables `keep` selects (the reference)."""
    def apply(grads):
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables)
                                   if keep(v)])
    return apply


def _freezer_case(flavour, strategy, optimizer=None, *, in_scope=False):
    """A model under the strategy, its replicas made equal, a Freezer with some frozen
    (made in the strategy's scope: its flags are MirroredVariables); (model, freezer, tree,
    ids of the frozen variables, paths of those and their state)."""
    model = build(flavour, strategy, optimizer=optimizer)
    with strategy.scope() if in_scope else contextlib.nullcontext():
        freezer = objckpt.Freezer(model)
    frozen = freezer.freeze(_frozen_pattern(flavour))
    tree = full_tree(model)
    equalize(tree)
    network = net_tree(model)
    frozen_ids = {id(network[p]) for p in frozen}
    frozen_variables = [network[p] for p in frozen]
    state = _compat.optimizer_state(model.optimizer, frozen_variables)
    held_ids = frozen_ids | {id(s) for v in frozen_variables for s in state[id(v)]}
    held = {p for p, v in tree.items() if id(v) in held_ids}
    assert len(held) >= 3 * len(frozen)  # Adam: each frozen variable, its m and its v
    return model, freezer, tree, frozen_ids, held


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "eager"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_freezer_step_inside_strategy_run(strategy, flavour, traced):
    _check_freezer_step(strategy, flavour, traced)


@pytest.mark.skipif(session_flavour() == "keras3", reason="Keras 3 has no OptimizerV2")
def test_freezer_step_with_a_legacy_optimizer_inside_strategy_run(strategy):
    """tf_keras / Keras 2 `optimizers.legacy.Adam` (OptimizerV2): its per-variable
    `_resource_apply_dense` is skipped for each frozen replica."""
    keras = keras_for(session_flavour())
    legacy = getattr(keras.optimizers.legacy, "Adam", None) or \
        keras.optimizers.legacy.adam.Adam  # Keras 2.12 (its tf.keras has the short name)
    _check_freezer_step(strategy, session_flavour(), True, optimizer=lambda: legacy(0.01))


def _check_freezer_step(strategy, flavour, traced, optimizer=None):
    model, freezer, tree, frozen_ids, held = _freezer_case(flavour, strategy, optimizer)
    optimizer = model.optimizer
    start = per_replica(tree)
    # The Freezer's step, then the optimizer's own step from the same state given only the
    # variables not frozen (the frozen ones and their state are then never touched).
    _step(model, strategy, lambda g: freezer.apply_gradients(
        optimizer, zip(g, model.trainable_variables)), traced=traced)
    got = per_replica(tree)
    load(tree, start)
    _step(model, strategy, _apply_plain(
        model, optimizer, lambda v: id(tf_variable(v)) not in frozen_ids), traced=traced)
    reference = per_replica(tree)

    assert_bits(start, got, sorted(held))  # frozen variables and their state kept
    assert_bits(reference, got)  # everything else: the optimizer's own step, bit for bit
    trained = [p for p in freezer.paths if p not in freezer.frozen]
    assert all(got[p][0].tobytes() != start[p][0].tobytes() for p in trained), trained
    mirrored_paths = [p for p, v in tree.items() if v.synchronization != ON_READ]
    replicas_identical(got, mirrored_paths)
    if traced:
        assert freezer.traces == 2  # once per replica
        assert freezer.hooked_traces == (freezer.traces if flavour != "module" else 0)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_freezer_matches_one_device_and_toggles_without_retracing(strategy, flavour):
    model, freezer, tree, frozen_ids, held = _freezer_case(flavour, strategy, in_scope=True)
    assert type(freezer._mask).__name__ == "MirroredVariable"
    start = per_replica(tree)
    optimizer = model.optimizer
    x, y = halves(strategy)

    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            loss = _loss(model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        freezer.apply_gradients(optimizer, zip(grads, model.trainable_variables))

    step = tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))
    step(x, y)
    got = per_replica(tree)

    # the same step on one device, the whole batch, from the same values
    single = build(flavour)
    single_tree = full_tree(single)
    # (TF 2.12 leaves TF1 Adam's beta powers out of the object graph under a strategy;
    # both are 0.9 ** steps here)
    assert set(tree) <= set(single_tree)
    load(single_tree, {p: v[:1] for p, v in start.items()})
    single_freezer = objckpt.Freezer(single)
    single_freezer.freeze(_frozen_pattern(flavour))
    _step(single, None, lambda g: single_freezer.apply_gradients(
        single.optimizer, zip(g, single.trainable_variables)))
    want = per_replica(single_tree)
    for path in tree:
        for r in range(len(got[path])):
            np.testing.assert_allclose(got[path][r], want[path][0], rtol=2e-5, atol=1e-6,
                                       err_msg=f"{path} replica {r}")
    assert_bits(start, got, sorted(held))
    frozen_paths = [p for p, v in tree.items() if id(v) in frozen_ids]

    traces = freezer.traces
    freezer.unfreeze()
    step(x, y)
    again = per_replica(tree)
    assert all(again[p][0].tobytes() != got[p][0].tobytes() for p in frozen_paths)
    replicas_identical(again, [p for p, v in tree.items() if v.synchronization != ON_READ])
    assert freezer.traces == traces
    assert step.experimental_get_tracing_count() == 1


def test_freezer_with_weight_decay_restores_each_replica(strategy):
    """AdamW applies its decay in a merge_call of its own: the Freezer reads and writes back
    each frozen variable's replica (no hook) inside strategy.run."""
    flavour = session_flavour()
    keras = keras_for(flavour)
    adamw = getattr(keras.optimizers, "AdamW", None) or \
        keras.optimizers.adamw.AdamW  # Keras 2.12
    model, freezer, tree, _, held = _freezer_case(
        flavour, strategy, optimizer=lambda: adamw(0.01, weight_decay=0.1))
    start = per_replica(tree)
    _step(model, strategy, lambda g: freezer.apply_gradients(
        model.optimizer, zip(g, model.trainable_variables)))
    got = per_replica(tree)
    assert_bits(start, got, sorted(held))
    assert freezer.traces == 2 and freezer.hooked_traces == 0
    trained = [p for p in freezer.paths if p not in freezer.frozen]
    assert all(got[p][0].tobytes() != start[p][0].tobytes() for p in trained)
    replicas_identical(got, [p for p, v in tree.items() if v.synchronization != ON_READ])


def test_freezer_in_the_cross_replica_context_is_refused(strategy):
    flavour = session_flavour()
    model, freezer, tree, frozen_ids, held = _freezer_case(flavour, strategy)
    before = per_replica(tree)
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    with strategy.scope(), pytest.raises(
            errors.DistributedVariableError,
            match=r"cross-replica context of MirroredStrategy .* for `[^`]+` \(conv/kernel\), "
                  r"a MirroredVariable: .*Fix: call it in the function you pass to "
                  r"strategy\.run") as raised:
        freezer.apply_gradients(model.optimizer, zip(grads, model.trainable_variables))
    assert raised.value.path in freezer.paths
    assert_bits(before, per_replica(tree))
    # Outside the strategy's scope the optimizer does what it does there (Keras 3 and
    # tf_keras update every replica, Keras 2.12 the first one): the Freezer the same, bar
    # the frozen variables.
    freezer.apply_gradients(model.optimizer, zip(grads, model.trainable_variables))
    after = per_replica(tree)
    load(tree, before)
    model.optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables)
                                     if id(tf_variable(v)) not in frozen_ids])
    assert_bits(per_replica(tree), after)
    assert_bits(before, after, sorted(held))
    trained = [p for p in freezer.paths if p not in freezer.frozen]
    assert trained and all(after[p][0].tobytes() != before[p][0].tobytes() for p in trained)


# --- load_ensemble ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=FLAVOURS)
def ensemble_case(request, strategy, tmp_path_factory):
    flavour = request.param
    template = build(flavour, strategy)
    net = net_tree(template)
    sources, states = [], []
    for salt in (21, 22):
        states.append(seed(net, salt))
        sources.append(objckpt.snapshot(template))
    prefix = str(tmp_path_factory.mktemp("ensemble") / "member")
    states.append(seed(net, 23))
    sources.append(objckpt.save(template, prefix))
    seed(net, 24)  # the template's own values are not used
    return flavour, template, net, sources, states


def _read(variable):
    return np.array(variable.numpy())


def test_load_ensemble_members_mirror_the_template(ensemble_case):
    _, template, net, sources, states = ensemble_case
    template_state = per_replica(net)
    ensemble = objckpt.load_ensemble(template, sources)
    assert len(ensemble.members) == 3
    for k, member in enumerate(ensemble.members):
        member_tree = net_tree(member)
        for path, variable in net.items():
            copy = member_tree[path]
            assert type(copy) is type(variable), path
            assert [c.device for c in parts(copy)] == [c.device for c in parts(variable)]
            assert copy.synchronization == variable.synchronization, path
            assert copy.aggregation == variable.aggregation, path
            if variable.synchronization == ON_READ:
                # TF's convention: a checkpoint holds the aggregate, restored so that
                # reading the variable gives it back.
                want = np.asarray(states[k][path]).sum(0) if variable.aggregation == \
                    tf.VariableAggregation.SUM else np.asarray(states[k][path]).mean(0)
                np.testing.assert_allclose(_read(copy), want, rtol=1e-6, err_msg=path)
            else:
                assert_bits({path: states[k][path]}, {path: per_replica({path: copy})[path]})
    assert_bits(template_state, per_replica(net))  # the template is left alone
    outputs = ensemble(IMAGES).numpy()
    assert outputs.shape == (3, 8, 2)
    for k, member in enumerate(ensemble.members):
        np.testing.assert_allclose(outputs[k], member(IMAGES).numpy(), rtol=1e-5,
                                   atol=1e-6)
    assert not np.allclose(outputs[0], outputs[1])


def test_ensemble_inside_strategy_run(strategy, ensemble_case):
    _, template, _, sources, _ = ensemble_case
    ensemble = objckpt.load_ensemble(template, sources[:2])
    x, _ = halves(strategy)
    want = ensemble(IMAGES).numpy()
    for run in (strategy.run, lambda f, args: tf.function(
            lambda a: strategy.run(f, args=(a,)))(*args)):
        got = run(lambda a: ensemble(a), args=(x,))
        for r, value in enumerate(strategy.experimental_local_results(got)):
            np.testing.assert_allclose(value.numpy(), want[:, 4 * r:4 * r + 4], rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.slow
def test_batched_ensemble_under_the_strategy(strategy):
    flavour = session_flavour()
    template = build(flavour, strategy, dense_only=True)
    net = net_tree(template)
    sources = []
    for salt in (31, 32):
        seed(net, salt)
        sources.append(objckpt.snapshot(template))
    ensemble = objckpt.load_ensemble(template, sources)
    outputs = ensemble(IMAGES, mode="batched").numpy()
    assert ensemble.last_mode == "batched"
    for k, member in enumerate(ensemble.members):
        np.testing.assert_allclose(outputs[k], member(IMAGES).numpy(), rtol=1e-5,
                                   atol=1e-6)
    x, _ = halves(strategy)
    got = tf.function(lambda a: strategy.run(
        lambda b: ensemble(b, mode="batched"), args=(a,)))(x)
    for r, value in enumerate(strategy.experimental_local_results(got)):
        np.testing.assert_allclose(value.numpy(), outputs[:, 4 * r:4 * r + 4], rtol=1e-5,
                                   atol=1e-6)
