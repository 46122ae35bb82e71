"""Freezer and FreezeSchedule: frozen variables and their optimizer state stay bit-identical."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import KERAS_FLAVOURS, _data, keras_for

OPTIMIZERS = {
    "sgd_momentum": lambda keras: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda keras: keras.optimizers.Adam(0.05),
    "rmsprop": lambda keras: keras.optimizers.RMSprop(0.05, momentum=0.5),
}
# Per-variable optimizer state each optimizer keeps (beyond the step counter).
SLOTS = {"sgd_momentum": 1, "adam": 2, "rmsprop": 2}


def optimizer_values(optimizer) -> list:
    variables = optimizer.variables
    variables = variables() if callable(variables) else variables
    return [np.array(v.numpy()) for v in variables]


def changed(before: list, after: list) -> int:
    assert len(before) == len(after)
    return sum(a.tobytes() != b.tobytes() for a, b in zip(before, after))


@pytest.fixture(params=["inline", "called"])
def layout(request, monkeypatch):
    """Both ways a traced `apply_gradients` arranges its branches.

    inline: a few variables (the tests' models): the plain update inlined in the
    step, and one function call per variable while something is frozen.
    called: many variables: the plain or the frozen update in one function call.
    """
    if request.param == "called":
        monkeypatch.setattr(objckpt._ops.freeze.guard, "FEW", 0)
    return request.param


def lowered_ifs(function, *args) -> list:
    """For each `If` op in the graph of `function(*args)` (not in its branches): lowered?"""
    graph = function.get_concrete_function(*args).graph
    return [op.get_attr("_lower_using_switch_merge") if "_lower_using_switch_merge" in
            op.node_def.attr else True
            for op in graph.get_operations() if op.type in ("If", "StatelessIf")]


class XY(tf.Module):
    def __init__(self):
        super().__init__()
        self.x = tf.Variable(3.0)
        self.y = tf.Variable(-2.0)


@pytest.mark.usefixtures("layout")
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_seed_alternate_freezing_x_and_y_in_one_traced_step(flavour, name):
    """loss = |x - y|, 100 steps, x frozen 5 steps then y 5 steps, alternating."""
    keras = keras_for(flavour)
    model, optimizer = XY(), OPTIMIZERS[name](keras)
    freezer = objckpt.Freezer(model)
    assert freezer.paths == ("x", "y")
    traces = []

    @tf.function
    def step():
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = tf.abs(model.x - model.y)
        grads = tape.gradient(loss, [model.x, model.y])
        freezer.apply_gradients(optimizer, zip(grads, [model.x, model.y]))
        return loss

    moved = {"x": 0, "y": 0}
    for k in range(100):
        frozen, free = ("x", "y") if (k // 5) % 2 == 0 else ("y", "x")
        freezer.set_frozen(f"^{frozen}$")
        assert freezer.frozen == (frozen,)
        frozen_var, free_var = getattr(model, frozen), getattr(model, free)
        before = (frozen_var.numpy(), free_var.numpy(), optimizer_values(optimizer))
        step()
        after = (frozen_var.numpy(), free_var.numpy(), optimizer_values(optimizer))
        assert after[0].tobytes() == before[0].tobytes(), (k, frozen)
        if k > 0:  # the first step builds the optimizer (no state to compare yet)
            # Exactly the free variable's state and the step counter moved.
            assert changed(before[2], after[2]) == SLOTS[name] + 1, k
        moved[free] += after[1].tobytes() != before[1].tobytes()
        if k == 0:
            # tf.function traces a second time when the first trace created variables
            # (here the optimizer's); from then on, no toggle retraces.
            first_traces = len(traces)
    assert moved == {"x": 50, "y": 50}
    assert first_traces <= 2 and len(traces) == first_traces == freezer.traces
    # Keras optimizers: frozen variables' updates are skipped, not undone afterwards.
    assert freezer.hooked_traces == freezer.traces


def net(keras):
    images = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(images)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(6, activation="relu", name="hidden")(x)
    return keras.Model(images, keras.layers.Dense(2, name="out")(x))


def paths_matching(freezer, pattern):
    import re

    return [p for p, n in zip(freezer.paths, freezer.names)
            if re.search(pattern, p) or re.search(pattern, n)]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_custom_loop_freeze_a_layer_then_unfreeze_without_retracing(flavour, layout):
    keras = keras_for(flavour)
    model, optimizer = net(keras), keras.optimizers.Adam(0.01)
    images, _, targets = _data()
    freezer = objckpt.Freezer(model)
    variables = dict(zip(freezer.paths, freezer._variables))
    conv = freezer.freeze("^conv/")  # a layer name: variable names are the same everywhere
    assert len(conv) == 2 and len(freezer.frozen) == 2
    traces = []

    @tf.function
    def step(x, y):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        freezer.apply_gradients(optimizer, zip(grads, model.trainable_variables))

    step(images, targets)
    first_traces = len(traces)
    state = freezer._state_of(optimizer, [freezer.paths.index(p) for p in conv])
    slots = [s for p in conv for s in state[freezer.paths.index(p)]]
    assert len(slots) == 4  # Adam m and v of kernel and bias
    frozen_before = [np.array(v.numpy()) for v in [variables[p] for p in conv] + slots]
    others_before = {p: variables[p].numpy().copy() for p in freezer.paths if p not in conv}
    for _ in range(3):
        step(images, targets)
    frozen_after = [np.array(v.numpy()) for v in [variables[p] for p in conv] + slots]
    assert [a.tobytes() for a in frozen_after] == [b.tobytes() for b in frozen_before]
    assert all(not np.array_equal(others_before[p], variables[p].numpy())
               for p in others_before)
    freezer.unfreeze()
    assert freezer.frozen == ()
    step(images, targets)
    assert all(not np.array_equal(a, v.numpy()) for a, v in
               zip(frozen_before, [variables[p] for p in conv] + slots))
    assert first_traces <= 2 and len(traces) == first_traces
    # The layout: nothing frozen, the plain update is inlined (a lowered conditional)
    # for a few variables; with many, one function call (an If left unlowered).
    assert lowered_ifs(step, images, targets) == [layout == "inline"]


def test_eager_apply_and_unknown_variables_pass_through():
    keras = any_keras()
    model = XY()
    extra = tf.Variable(1.0)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    freezer = objckpt.Freezer(model)
    freezer.freeze("x")
    for _ in range(3):
        freezer.apply_gradients(optimizer, [(tf.constant(1.0), model.x),
                                            (tf.constant(1.0), model.y),
                                            (tf.constant(1.0), extra)])
    assert float(model.x) == 3.0
    assert float(model.y) < -2.0 and float(extra) < 1.0
    assert freezer.traces == 0


def any_keras():
    """The first Keras flavour this environment has."""
    for flavour in KERAS_FLAVOURS:
        try:
            return keras_for(flavour)
        except pytest.skip.Exception:
            continue
    pytest.skip("no Keras flavour installed")


def run_frozen_steps(optimizer, steps=4):
    """Trains XY with x frozen in one traced step; returns the freezer and what moved."""
    model = XY()
    freezer = objckpt.Freezer(model)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.abs(model.x - model.y) + 0.1 * model.y ** 2
        grads = tape.gradient(loss, [model.x, model.y])
        freezer.apply_gradients(optimizer, zip(grads, [model.x, model.y]))

    step()  # builds the optimizer
    freezer.freeze("^x$")
    before = (model.x.numpy(), model.y.numpy(), optimizer_values(optimizer))
    for _ in range(steps):
        step()
    after = (model.x.numpy(), model.y.numpy(), optimizer_values(optimizer))
    assert after[0].tobytes() == before[0].tobytes()  # x: bit-identical
    assert after[1].tobytes() != before[1].tobytes()  # y: trained
    return freezer, changed(before[2], after[2])


def new_optimizer(keras, name, *args, **kwargs):
    """A `keras.optimizers.<name>` of the 2.11+ kind (Keras 2.12 exports the legacy ones)."""
    import importlib

    cls = getattr(keras.optimizers, name, None)
    if cls is None or "legacy" in cls.__module__:
        module = importlib.import_module(f"{keras.__name__}.optimizers.{name.lower()}")
        cls = getattr(module, name)
    assert "legacy" not in cls.__module__
    return cls(*args, **kwargs)


@pytest.mark.usefixtures("layout")
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_weight_decay_skips_frozen_variables(flavour):
    keras = keras_for(flavour)
    optimizer = new_optimizer(keras, "AdamW", 0.05, weight_decay=0.5)
    freezer, moved = run_frozen_steps(optimizer)
    assert moved == 2 + 1  # y's m and v and the step counter; x's state untouched
    assert freezer.hooked_traces == freezer.traces >= 1


@pytest.mark.usefixtures("layout")
@pytest.mark.parametrize("options", [{"global_clipnorm": 1.0}, {"use_ema": True}])
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_optimizers_with_shared_state_restore_frozen_variables(flavour, options):
    keras = keras_for(flavour)
    freezer, moved = run_frozen_steps(new_optimizer(keras, "Adam", 0.05, **options))
    # Cross-variable scaling or state: the update is undone for frozen variables instead.
    assert freezer.hooked_traces == 0 and freezer.traces >= 1
    assert moved >= 2 + 1


@pytest.mark.usefixtures("layout")
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_an_optimizer_bypassing_update_step_falls_back_to_restoring(flavour):
    keras = keras_for(flavour)

    class PlainSGD(keras.optimizers.SGD):
        """Updates variables without update_step (Keras 3 / tf_keras internals)."""

        def _backend_update_step(self, grads, variables, learning_rate):  # Keras 3
            for gradient, variable in zip(grads, variables):
                variable.assign_sub(gradient * learning_rate)

        def _update_step(self, gradient, variable):  # tf_keras, Keras 2
            variable.assign_sub(gradient * self.learning_rate)

    freezer, moved = run_frozen_steps(PlainSGD(0.05))
    assert freezer.traces >= 1 and freezer.hooked_traces == 0
    assert moved == 1  # the step counter only


@pytest.mark.usefixtures("layout")
def test_tf1_optimizer_slots_stay_put_too():
    model = XY()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    freezer = objckpt.Freezer(model)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.abs(model.x - model.y)
        grads = tape.gradient(loss, [model.x, model.y])
        freezer.apply_gradients(optimizer, zip(grads, [model.x, model.y]))

    step()
    freezer.freeze("^y$")
    slots = [optimizer.get_slot(model.y, name) for name in optimizer.get_slot_names()]
    before = [v.numpy() for v in [model.y, *slots]]
    x_before = float(model.x)
    step()
    step()
    assert [v.numpy() for v in [model.y, *slots]] == before
    assert float(model.x) != x_before


def test_bad_patterns_are_refused_with_the_paths():
    keras = any_keras()
    model = net(keras)
    freezer = objckpt.Freezer(model)
    with pytest.raises(errors.InvalidArgumentError, match="freeze\\('encoder'\\): it matches no "
                                                          "trainable variable; object paths "
                                                          "and variable names look like"):
        freezer.freeze("encoder")
    with pytest.raises(errors.InvalidArgumentError, match="regular expressions"):
        freezer.freeze("(")
    with pytest.raises(errors.InvalidArgumentError, match=r"not trainable .*moving_mean"):
        freezer.freeze("moving_mean")
    assert freezer.frozen == ()  # nothing changed by the refused calls
    assert freezer.freeze() == freezer.paths  # no pattern: everything
    with pytest.raises(errors.UnsupportedObjectError):
        objckpt.Freezer(object())
    with pytest.raises(errors.UnbuiltModelError):
        objckpt.Freezer(tf.Module())


def test_matching_previews_and_hook_routes_apply_gradients():
    keras = any_keras()
    model = net(keras)
    model(np.zeros((1, 6, 6, 3), "float32"))
    freezer = objckpt.Freezer(model)
    expected = [p for p in freezer.paths if p in paths_matching(freezer, "conv")]
    assert list(freezer.matching("conv")) == expected and expected  # in tree order
    assert freezer.frozen == ()  # a preview changes nothing
    with pytest.raises(errors.InvalidArgumentError, match="matches no"):
        freezer.matching("encoder")
    optimizer = keras.optimizers.SGD(0.1)
    tree = objckpt.tree(model)
    variables = [tree[p] for p in freezer.paths]  # aligned with freezer.paths
    grads = [tf.ones_like(v) for v in variables]
    freezer.freeze("conv")
    freezer.hook(optimizer)
    before = [v.numpy().copy() for v in variables]
    optimizer.apply_gradients(zip(grads, variables))  # through the Freezer
    moved = [p for p, v, b in zip(freezer.paths, variables, before)
             if v.numpy().tobytes() != b.tobytes()]
    assert sorted(moved) == sorted(set(freezer.paths) - set(expected))
    freezer.unhook(optimizer)
    freezer.unhook(optimizer)  # twice is harmless
    before = [v.numpy().copy() for v in variables]
    optimizer.apply_gradients(zip(grads, variables))  # plain again: every variable moves
    assert all(v.numpy().tobytes() != b.tobytes() for v, b in zip(variables, before))


def fit_model(keras):
    model = net(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.usefixtures("layout")
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_schedule_in_fit(flavour):
    keras = keras_for(flavour)
    model = fit_model(keras)
    images, _, targets = _data()
    images = np.concatenate([images] * 4)
    targets = np.concatenate([targets] * 4)
    model.fit(images, targets, epochs=1, batch_size=8, verbose=0)  # traced before the schedule
    conv = "^conv/"
    schedule = objckpt.callbacks.FreezeSchedule({0: conv, 2: None, 3: [conv, "^hidden/|^out/"]})
    freezer = objckpt.Freezer(model)
    conv_paths = paths_matching(freezer, conv)
    variables = dict(zip(freezer.paths, freezer._variables))
    state = freezer._state_of(model.optimizer, list(range(len(freezer.paths))))
    tracked = {p: [variables[p], *state[freezer.paths.index(p)]] for p in freezer.paths}
    assert all(len(v) == 3 for v in tracked.values())  # variable, m, v
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(({p: [np.array(v.numpy()) for v in vs] for p, vs in tracked.items()},
                         schedule.freezer.traces))

    start = {p: [np.array(v.numpy()) for v in vs] for p, vs in tracked.items()}
    model.fit(images, targets, epochs=5, batch_size=8, verbose=0, callbacks=[schedule, Record()])
    assert [e for e, _ in schedule.history] == [0, 1, 2, 3, 4]
    assert schedule.history[0][1] == tuple(conv_paths) == schedule.history[1][1]
    assert schedule.history[2][1] == ()
    assert len(schedule.history[3][1]) == len(freezer.paths) - 2  # all but batch norm
    same = lambda a, b: all(x.tobytes() == y.tobytes() for x, y in zip(a, b))  # noqa: E731
    for p in conv_paths:  # frozen in epochs 0-1: bit-identical with its Adam state
        assert same(start[p], seen[0][0][p]) and same(start[p], seen[1][0][p])
        assert not same(seen[1][0][p], seen[2][0][p])  # trains in epoch 2
    for p in freezer.paths:
        if p not in conv_paths:
            assert not same(start[p], seen[0][0][p])  # trains while conv is frozen
    for p in schedule.history[3][1]:  # frozen again from epoch 3
        assert same(seen[2][0][p], seen[3][0][p]) and same(seen[2][0][p], seen[4][0][p])
    traces = [t for _, t in seen]
    assert traces[0] >= 1 and traces == [traces[0]] * 5  # toggling never retraced
    assert "apply_gradients" not in vars(model.optimizer)  # unhooked after fit
    assert schedule.freezer.frozen == ()


def test_freeze_schedule_refuses_bad_schedules_before_training():
    keras = any_keras()
    for bad in ({}, {-1: "x"}, {"0": "x"}, {0: [1]}, [0]):
        with pytest.raises(errors.InvalidArgumentError):
            objckpt.callbacks.FreezeSchedule(bad)
    model = fit_model(keras)
    images, _, targets = _data()
    before = [w.numpy().copy() for w in model.weights]
    schedule = objckpt.callbacks.FreezeSchedule({0: None, 2: "encoder"})
    with pytest.raises(errors.InvalidArgumentError, match=r"FreezeSchedule\[2\].*encoder"):
        model.fit(images, targets, epochs=1, verbose=0, callbacks=[schedule])
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))
    uncompiled = net(keras)
    with pytest.raises(errors.InvalidArgumentError, match="compiled model"):
        schedule.set_model(uncompiled)
        schedule.on_train_begin()
