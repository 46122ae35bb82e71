"""Freezer under `model.fit`: frozen variables and their optimizer state stay bit-identical.

Every Keras flavour (tf.Module has no fit): before or after an earlier `fit`, after a
recompile with a new optimizer, eagerly; toggling never retraces; a train step that goes
around the optimizer is refused with the fix, before anything moves.
"""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

import flavours
from flavours import KERAS_FLAVOURS, keras_for

CONV = "conv"  # the nested encoder's Conv2D (variable names conv/kernel, conv/bias)


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 6, 6, 3)).astype("float32"),
            rng.normal(size=(n, 2)).astype("float32"))


def build(keras, cls=None, seed=0):
    """Input -> nested encoder (Conv2D, BatchNorm) -> Dense -> Dense, deterministic init."""
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    images = keras.Input((6, 6, 3))
    encoder = keras.Sequential([keras.layers.Conv2D(4, 3, name="conv", kernel_initializer=init(0)),
                                keras.layers.BatchNormalization(name="bn")], name="encoder")
    x = keras.layers.Flatten()(encoder(images))
    x = keras.layers.Dense(6, activation="relu", name="hidden", kernel_initializer=init(1))(x)
    outputs = keras.layers.Dense(2, name="out", kernel_initializer=init(2))(x)
    return (cls or keras.Model)(images, outputs)


def fit(model, epochs=1, **kwargs):
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, **kwargs)


def snapshot(freezer, optimizer):
    """{path: [variable, *optimizer state]} as numpy copies, for every Freezer variable."""
    state = freezer._state_of(optimizer, list(range(len(freezer.paths))))
    return {p: [np.array(v.numpy()) for v in (freezer._variables[i], *state[i])]
            for i, p in enumerate(freezer.paths)}


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def frozen_paths(freezer, pattern=CONV):
    return [p for p, n in zip(freezer.paths, freezer.names) if pattern in n]


def check_held(before, after, frozen):
    """Frozen: variable and every state variable bit-identical; others: variable moved."""
    assert frozen and set(frozen) < set(before)
    for p in before:
        if p in frozen:
            assert same(before[p], after[p]), p
        else:
            assert not same(before[p][:1], after[p][:1]), p


@pytest.mark.parametrize("when", ["after_fit", "before_fit", "run_eagerly"])
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_holds_under_fit(flavour, when):
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                  run_eagerly=when == "run_eagerly")
    if when != "before_fit":
        fit(model)  # traces (or runs) the train step before the Freezer exists
    freezer = objckpt.Freezer(model)
    assert freezer.freeze(CONV) == tuple(frozen_paths(freezer))
    if when == "before_fit":
        start = {p: [v.numpy().copy()] for p, v in zip(freezer.paths, freezer._variables)}
        fit(model, epochs=2)
        after = snapshot(freezer, model.optimizer)
        check_held(start, {p: a[:1] for p, a in after.items()}, frozen_paths(freezer))
        for p in frozen_paths(freezer):  # Adam's m and v never touched: still zero
            assert len(after[p]) == 3 and not any(a.any() for a in after[p][1:])
    else:
        before = snapshot(freezer, model.optimizer)
        assert all(len(s) == 3 and s[1].any() for s in before.values())  # variable, m, v
        fit(model, epochs=2)
        check_held(before, snapshot(freezer, model.optimizer), frozen_paths(freezer))
    if when == "after_fit":
        assert freezer.traces == 1  # one retrace, by freeze
    elif when == "before_fit":  # the first trace builds the optimizer: TF traces again
        assert 1 <= freezer.traces <= 2
    else:
        assert freezer.traces == 0  # eager steps
    assert freezer.hooked_traces == freezer.traces  # per-variable updates skipped


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_holds_under_fit_with_mirrored_strategy(flavour):
    """Two replicas: each replica of a frozen variable and of its Adam state is kept."""
    from objckpt import _compat

    keras = keras_for(flavour)
    strategy = flavours.mirrored()
    with strategy.scope():
        model = build(keras)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit(model)
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)

    def replicas():
        state = freezer._state_of(model.optimizer, list(range(len(freezer.paths))))
        out = {}
        for i, p in enumerate(freezer.paths):
            parts = [_compat.replica_parts(_compat.as_variable(v))
                     for v in (freezer._variables[i], *state[i])]
            assert all(len(r) == 2 for r in parts), p  # mirrored over the two devices
            out[p] = [np.array(r.numpy()) for replica in parts for r in replica]
        return out

    before = replicas()
    fit(model)
    after = replicas()
    check_held(before, after, frozen_paths(freezer))
    for p, values in after.items():  # every variable's two replicas (even, odd) agree
        assert same(values[0::2], values[1::2]), p
    assert freezer.traces == 2  # one trace, per replica


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_toggling_under_fit_never_retraces(flavour):
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit(model)
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    fit(model)
    traces, function = freezer.traces, model.train_function
    assert traces == 1
    conv = frozen_paths(freezer)
    freezer.unfreeze()
    before = snapshot(freezer, model.optimizer)
    fit(model)
    after = snapshot(freezer, model.optimizer)
    assert all(not same(before[p], after[p]) for p in freezer.paths)  # all train again
    out = freezer.set_frozen("^out/|out/")
    assert out and not set(out) & set(conv)
    fit(model)
    check_held(after, snapshot(freezer, model.optimizer), out)
    freezer.freeze()  # everything: nothing moves, Adam's state included
    everything = snapshot(freezer, model.optimizer)
    fit(model)
    assert all(same(everything[p], s) for p, s in snapshot(freezer, model.optimizer).items())
    assert freezer.traces == traces and model.train_function is function  # no retrace


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_follows_a_recompile_with_a_new_optimizer(flavour):
    keras = keras_for(flavour)
    model = build(keras)
    first = keras.optimizers.Adam(0.01)
    model.compile(optimizer=first, loss="mse")
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    fit(model)
    assert "apply_gradients" not in vars(first)  # hooked only while the step was traced
    second = keras.optimizers.SGD(0.05, momentum=0.9)
    model.compile(optimizer=second, loss="mse")
    fit(model)  # builds SGD's momentum: conv's stays zero
    traces = freezer.traces
    before = snapshot(freezer, second)
    assert all(len(s) == 2 for s in before.values())  # variable, momentum
    assert all(not s[1].any() for p, s in before.items() if p in frozen_paths(freezer))
    fit(model)
    check_held(before, snapshot(freezer, second), frozen_paths(freezer))
    assert "apply_gradients" not in vars(second)
    assert freezer.traces == traces  # traced once per compile, not per fit


def loss_scaled_adam(keras):
    """Adam in the flavour's dynamic loss-scale wrapper (what mixed_float16 compiles to);
    Keras 2.12's wraps only its legacy (OptimizerV2) optimizers."""
    keras2 = keras.__name__ == "keras" and keras.__version__.startswith("2.")
    adam = legacy_adam(keras) if keras2 else new_optimizer(keras, "Adam", 0.01)
    return keras.mixed_precision.LossScaleOptimizer(adam)


def legacy_adam(keras):
    """tf_keras / Keras 2 `optimizers.legacy.Adam` (OptimizerV2); Keras 3 has none."""
    if keras.__version__.startswith("3."):
        pytest.skip("Keras 3 has no optimizers.legacy (OptimizerV2)")
    legacy = keras.optimizers.legacy
    return (getattr(legacy, "Adam", None) or legacy.adam.Adam)(0.01)  # Keras 2.12: .adam


def new_optimizer(keras, name, *args, **kwargs):
    """A `keras.optimizers.<name>` of the 2.11+ kind (Keras 2.12 exports the legacy ones)."""
    import importlib

    cls = getattr(keras.optimizers, name, None)
    if cls is None or "legacy" in cls.__module__:
        cls = getattr(importlib.import_module(f"{keras.__name__}.optimizers.{name.lower()}"),
                      name)
    return cls(*args, **kwargs)


def clipped_adam(keras):
    return new_optimizer(keras, "Adam", 0.01, global_clipnorm=0.1)


# (optimizer, hooked: frozen updates skipped rather than undone, compile's jit_compile)
OPTIMIZER_KINDS = {
    "adamw_weight_decay": (lambda k: new_optimizer(k, "AdamW", 0.01, weight_decay=0.5), True,
                           False),
    "global_clipnorm": (clipped_adam, False, False),
    "loss_scale": (loss_scaled_adam, False, False),
    "legacy_adam": (legacy_adam, True, False),
    "adam_xla": (lambda k: k.optimizers.Adam(0.01), True, True),
    "global_clipnorm_xla": (clipped_adam, False, True),  # XLA: both branches' shapes equal
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZER_KINDS))
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.slow
def test_optimizer_kinds_hold_under_fit(flavour, kind):
    keras = keras_for(flavour)
    make, hooked, jit = OPTIMIZER_KINDS[kind]
    optimizer = make(keras)
    model = build(keras)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    fit(model)
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    before = snapshot(freezer, model.optimizer)
    assert all(len(s) >= 3 for s in before.values())  # variable, m, v (and more)
    fit(model)
    check_held(before, snapshot(freezer, model.optimizer), frozen_paths(freezer))
    assert freezer.traces == 1 and freezer.hooked_traces == (1 if hooked else 0)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_frozen_under_fit_equals_untrainable_from_the_start(flavour):
    """Oracle: the same run with the conv layer `trainable=False` before compile."""
    keras = keras_for(flavour)
    frozen_model, oracle = build(keras), build(keras)
    oracle.set_weights(frozen_model.get_weights())
    oracle.get_layer("encoder").get_layer("conv").trainable = False
    for model in (frozen_model, oracle):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    freezer = objckpt.Freezer(frozen_model)
    freezer.freeze(CONV)
    start = [w.copy() for w in frozen_model.get_weights()]
    fit(frozen_model, epochs=2)
    fit(oracle, epochs=2)
    ours, theirs = frozen_model.get_weights(), oracle.get_weights()
    assert same(ours[:2], start[:2]) and same(theirs[:2], start[:2])  # conv kernel, bias
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ours, theirs))
    assert diff == 0.0, f"max |diff| {diff}"  # every other weight, BatchNorm's included
    assert not same(ours[2:], start[2:])


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_hook_after_a_fit_holds_under_the_next_fit(flavour):
    """The report: `freezer.hook(model.optimizer)` after a first fit was silently ignored."""
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit(model)
    freezer = objckpt.Freezer(model)
    freezer.hook(model.optimizer)
    freezer.hook(model.optimizer)  # twice changes nothing
    fit(model)  # traced here with the hook in place, nothing frozen
    function, traces = model.train_function, freezer.traces
    assert traces == 1
    freezer.freeze(CONV)
    before = snapshot(freezer, model.optimizer)
    fit(model)
    check_held(before, snapshot(freezer, model.optimizer), frozen_paths(freezer))
    assert model.train_function is function and freezer.traces == traces


def custom_models(keras):
    """Models whose own train_step updates variables: by hand, or via freezer.apply_gradients."""

    def step(model, data, update):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        variables = model.trainable_variables
        update(model, tape.gradient(loss, variables), variables)
        return {"loss": loss}

    class ByHand(keras.Model):
        def train_step(self, data):
            def update(model, grads, variables):
                for gradient, variable in zip(grads, variables):
                    variable.assign_sub(0.01 * gradient)
            return step(self, data, update)

    class ThroughFreezer(keras.Model):
        freezer = None

        def train_step(self, data):
            def update(model, grads, variables):
                model.freezer.apply_gradients(model.optimizer, zip(grads, variables))
            return step(self, data, update)

    return ByHand, ThroughFreezer


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_train_step_around_the_optimizer_is_refused_with_the_fix(flavour):
    keras = keras_for(flavour)
    by_hand, through_freezer = custom_models(keras)
    model = build(keras, by_hand)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    start = [w.copy() for w in model.get_weights()]
    fix = r"Fix: update them in train_step with freezer\.apply_gradients\(self\.optimizer, "
    with pytest.raises(errors.UnsupportedObjectError, match="ByHand.train_step passed none.*"
                       + fix):
        fit(model)
    assert same(model.get_weights(), start)  # refused while tracing: nothing moved
    freezer.unfreeze()
    with pytest.raises(errors.UnsupportedObjectError, match=fix):
        freezer.freeze(CONV)  # never silently ignored afterwards either
    assert freezer.frozen == ()
    fit(model)  # nothing frozen: it trains as before
    assert not same(model.get_weights()[:2], start[:2])

    model = build(keras, by_hand)  # attached before anything is frozen: fit trains, and
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    freezer = objckpt.Freezer(model)
    freezer.attach()
    fit(model)
    with pytest.raises(errors.UnsupportedObjectError, match=fix):
        freezer.freeze(CONV)  # the first freeze is refused
    assert freezer.frozen == ()

    model = build(keras, through_freezer)  # the fix
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.freezer = freezer = objckpt.Freezer(model)
    fit(model)
    freezer.freeze(CONV)
    before = snapshot(freezer, model.optimizer)
    fit(model)
    check_held(before, snapshot(freezer, model.optimizer), frozen_paths(freezer))


def test_keras3_custom_train_step_calling_optimizer_apply_holds():
    """Keras 3's guide updates with `self.optimizer.apply(grads, variables)`: hooked too."""
    keras = keras_for("keras3")

    class Guide(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
            variables = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            return {"loss": loss}

    model = build(keras, Guide)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit(model)
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    before = snapshot(freezer, model.optimizer)
    fit(model)
    check_held(before, snapshot(freezer, model.optimizer), frozen_paths(freezer))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_detach_lets_fit_train_everything_again(flavour):
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    freezer = objckpt.Freezer(model)
    freezer.freeze(CONV)
    fit(model)
    held = snapshot(freezer, model.optimizer)
    fit(model)
    assert all(same(held[p], s) for p, s in snapshot(freezer, model.optimizer).items()
               if p in freezer.frozen)
    freezer.detach()
    assert "train_step" not in vars(model) and freezer.frozen  # still frozen, not attached
    fit(model)
    after = snapshot(freezer, model.optimizer)
    assert all(not same(held[p][:1], after[p][:1]) for p in freezer.paths)


def test_attach_needs_fit_and_a_module_still_freezes():
    class XY(tf.Module):
        def __init__(self):
            super().__init__()
            self.x, self.y = tf.Variable(1.0), tf.Variable(2.0)

    freezer = objckpt.Freezer(XY())
    assert freezer.freeze("x") == ("x",)  # a custom loop's freezer.apply_gradients honours it
    with pytest.raises(errors.InvalidArgumentError, match=r"has no fit.*freezer\.apply_gradients"):
        freezer.attach()


def moved(before, after) -> set:
    """The paths whose variable changed."""
    return {p for p in before if not same(before[p][:1], after[p][:1])}


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_freezer_made_again_replaces_the_earlier_one(flavour):
    """A notebook cell run again: `f = Freezer(m); f.freeze(...)` twice, then `f.unfreeze()`.
    The first Freezer, unreachable now, must not keep the encoder frozen under fit."""
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit(model)
    first = objckpt.Freezer(model)
    first.freeze(CONV)
    f = objckpt.Freezer(model)  # the cell, run again
    f.freeze(CONV)
    hold = vars(model)["train_step"]
    assert hold.objckpt_hold.freezer is f  # one wrapper, the newest Freezer's; no nesting
    assert not first._fit.attached and first.frozen  # displaced: frozen, but not under fit
    before = snapshot(f, model.optimizer)
    fit(model)
    check_held(before, snapshot(f, model.optimizer), frozen_paths(f))
    f.unfreeze()
    before = snapshot(f, model.optimizer)
    fit(model)
    assert moved(before, snapshot(f, model.optimizer)) == set(f.paths)  # the encoder trains
    f.detach()
    assert "train_step" not in vars(model)  # nothing of either Freezer left


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_the_most_recent_freezer_to_freeze_holds_under_fit(flavour):
    """Two Freezers in sequence: each freeze takes the model over; the displaced one's
    frozen set no longer applies under fit, and only one wraps train_step at any time."""
    keras = keras_for(flavour)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    a, b = objckpt.Freezer(model), objckpt.Freezer(model)
    a.freeze(CONV)
    b.freeze("hidden")
    before = snapshot(b, model.optimizer)
    fit(model)
    assert moved(before, snapshot(b, model.optimizer)) == \
        set(b.paths) - set(frozen_paths(b, "hidden"))  # b's set only: conv trains
    a.freeze(CONV)  # a takes over again: its set holds, b's does not
    assert vars(model)["train_step"].objckpt_hold.freezer is a and not b._fit.attached
    before = snapshot(a, model.optimizer)
    fit(model)
    check_held(before, snapshot(a, model.optimizer), frozen_paths(a))
    a.unfreeze()  # nothing frozen by the Freezer that holds; b's set stays displaced
    before = snapshot(a, model.optimizer)
    fit(model)
    assert moved(before, snapshot(a, model.optimizer)) == set(a.paths)
    b.detach()  # displaced: nothing to undo, a's wrapper stays
    assert vars(model)["train_step"].objckpt_hold.freezer is a
