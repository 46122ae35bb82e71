"""callbacks.SWA and callbacks.EMA: the averages they keep, and their exact resume.

The averages are checked against NumPy (the mean of the weight sets a recorder saw, the EMA
recurrence), the resume against an uninterrupted run, bit for bit: in process (fit
interrupted by a raising callback) and in a killed process (tests/helpers/averaging_worker.py
SIGKILLs itself mid-run), with the averaging callback before and after Checkpointing.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt.callbacks import EMA, SWA, Checkpointing

from flavours import KERAS_FLAVOURS, _data, build_functional, keras_for, session_flavour
import support
from support import assert_bits, python_env

EPOCHS, BATCHES = 4, 4  # 8 examples in batches of 2


def make(flavour):
    keras = keras_for(flavour)
    keras.utils.set_random_seed(0)
    return keras, build_functional(keras, train=False)


def fit(model, callbacks, epochs=EPOCHS):
    images, tokens, targets = _data()
    model.fit([images, tokens], targets, epochs=epochs, batch_size=2, shuffle=False, verbose=0,
              callbacks=callbacks)


def network(model) -> dict:
    """The network's variables (no optimizer state) by object path, as arrays."""
    return {p: np.array(v.numpy()) for p, v in _compat.network_variable_paths(model)}


def averaged(callback) -> dict:
    return {p: np.array(past.numpy()) for p, (_, past) in callback.twins.variables().items()}


def recorder(keras, on):
    """A callback that records the network's weights after every batch or epoch, with the
    epoch and the optimizer step."""

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen, self.epoch = [], 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if on == "batch":
                self.seen.append((self.epoch, int(self.model.optimizer.iterations.numpy()),
                                  network(self.model)))

        def on_epoch_end(self, epoch, logs=None):
            if on == "epoch":
                self.seen.append((epoch, None, network(self.model)))

    return Record()


def interrupter(keras, after):
    class Interrupt(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Interrupt.seen += 1
            if Interrupt.seen == after:
                raise RuntimeError("interrupted on purpose")

    return Interrupt()


def is_float(array) -> bool:
    return np.issubdtype(array.dtype, np.floating)


# --- the averages -------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_swa_by_epoch_is_the_mean_of_the_weights_after_each_epoch_from_start(flavour):
    keras, model = make(flavour)
    swa, record = SWA(start_epoch=1), recorder(keras, "epoch")
    with pytest.warns(errors.BatchNormStatisticsWarning, match="recalibrate_batchnorm"):
        fit(model, [swa, record])
    members = [weights for epoch, _, weights in record.seen if epoch >= 1]
    assert swa.count == len(members) == EPOCHS - 1
    got = averaged(swa)
    for path, value in got.items():
        stack = np.stack([m[path] for m in members]).astype(np.float64)
        if is_float(value):
            np.testing.assert_allclose(value, stack.mean(0), rtol=2e-6, atol=1e-7, err_msg=path)
        else:  # integers are copied from the newest weights, not averaged
            assert value.tobytes() == members[-1][path].tobytes(), path


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_swa_every_k_steps_from_start_epoch(flavour):
    keras, model = make(flavour)
    swa, record = SWA(start_epoch=1, every=3), recorder(keras, "batch")
    with pytest.warns(errors.BatchNormStatisticsWarning):
        fit(model, [swa, record])
    members = [w for epoch, step, w in record.seen if epoch >= 1 and step % 3 == 0]
    assert [s for e, s, _ in record.seen if e >= 1 and s % 3 == 0] == [6, 9, 12, 15]
    assert swa.count == 4
    for path, value in averaged(swa).items():
        if is_float(value):
            mean = np.stack([m[path] for m in members]).astype(np.float64).mean(0)
            np.testing.assert_allclose(value, mean, rtol=2e-6, atol=1e-7, err_msg=path)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_ema_follows_the_recurrence_from_the_initial_weights(flavour):
    keras, model = make(flavour)
    initial = network(model)
    ema, record = EMA(decay=0.75), recorder(keras, "batch")
    fit(model, [ema, record], epochs=2)
    assert ema.count == 2 * BATCHES
    expected = {p: v.astype(np.float64) for p, v in initial.items()}
    for _, _, weights in record.seen:
        for p, v in weights.items():
            expected[p] = 0.75 * expected[p] + 0.25 * v if is_float(v) else v
    for path, value in averaged(ema).items():
        np.testing.assert_allclose(value, expected[path], rtol=1e-5, atol=1e-6, err_msg=path)
    assert ema.averaged_model is ema.twins.past


def test_ema_of_given_twins_and_swap():
    _, model = make(session_flavour())
    twins = objckpt.Twins(model)
    ema = EMA(decay=0.5, twins=twins)
    fit(model, [ema], epochs=1)
    before = averaged(ema)
    twins.swap()
    assert_bits(before, network(model), "the average swapped into the model")


# --- exact resume, in process -------------------------------------------------------------

AVERAGES = {
    "swa_epoch": (lambda: SWA(start_epoch=1), "epoch", 10),
    "swa_steps": (lambda: SWA(start_epoch=1, every=3), 3, 11),
    "ema": (lambda: EMA(decay=0.8), 3, 11),
}


@pytest.mark.parametrize("order", ["first", "last"])
@pytest.mark.parametrize("average", sorted(AVERAGES))
@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
@pytest.mark.filterwarnings("ignore::objckpt.errors.BatchNormStatisticsWarning")
def test_interrupted_fit_resumes_the_average_bit_identical(tmp_path, flavour, average, order):
    factory, save_freq, interrupt_at = AVERAGES[average]
    _, model = make(flavour)
    reference = factory()
    fit(model, [reference])
    expected, expected_model = averaged(reference), network(model)

    def callbacks(callback, *more):
        ckpt = Checkpointing(tmp_path, save_freq=save_freq, max_to_keep=2, verbose=0)
        return [callback, ckpt, *more] if order == "first" else [ckpt, callback, *more]

    keras, model = make(flavour)
    first = factory()
    with pytest.raises(RuntimeError, match="interrupted on purpose"):
        fit(model, callbacks(first, interrupter(keras, interrupt_at)))
    assert 0 < first.count < reference.count
    _, model = make(flavour)  # a fresh process would build it the same way
    second = factory()
    fit(model, callbacks(second))
    assert second.count == reference.count
    assert_bits(expected, averaged(second), f"{average} after resume")
    assert_bits(expected_model, network(model), "the model after resume")
    if average == "ema":
        return  # its last update (step 16) comes after the last save (step 15)
    # The newest checkpoint holds the final average under the callback's name, by the
    # model's own object paths.
    fresh = make(flavour)[1]
    objckpt.restore(fresh, str(tmp_path), at=f"{second.name}/model", optimizer_state=False)
    assert_bits(expected, network(fresh), "the average restored from the directory")


# --- exact resume, after a SIGKILL ----------------------------------------------------------


def run_worker(flavour, average, order, directory, out, kill_at=None):
    env = python_env()
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    command = [sys.executable, os.path.join(support.HELPERS, "averaging_worker.py"), flavour, average, order,
               str(directory), str(out)] + ([str(kill_at)] if kill_at else [])
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("average,order", [("swa_epoch", "last"), ("swa_steps", "first"),
                                           ("ema", "last")])
@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_killed_run_resumes_the_average_bit_identical(tmp_path, flavour, average, order):
    keras_for(flavour)
    done = run_worker(flavour, average, order, tmp_path / "ref", tmp_path / "ref.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    killed = run_worker(flavour, average, order, tmp_path / "run", tmp_path / "run.npz",
                        kill_at=10)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not os.path.exists(tmp_path / "run.npz")
    assert tf.train.latest_checkpoint(str(tmp_path / "run")) is not None
    resumed = run_worker(flavour, average, order, tmp_path / "run", tmp_path / "run.npz")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with np.load(tmp_path / "ref.npz") as a, np.load(tmp_path / "run.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert int(a["count"]) == int(b["count"]) > 0
        changed = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
        assert not changed, changed


# --- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("make_callback,words", [
    (lambda: SWA(every=0), "every must be an int >= 1"),
    (lambda: SWA(start_epoch=-1), "start_epoch must be an int >= 0"),
    (lambda: SWA(name="model"), "name must be an identifier other than"),
    (lambda: EMA(decay=1.0), r"must lie in \[0, 1\)"),
    (lambda: EMA(decay="0.9"), r"must lie in \[0, 1\)"),
    (lambda: EMA(twins="past"), "twins must be an objckpt.Twins"),
    (lambda: SWA(recalibrate_steps=0), "recalibrate_steps must be an int >= 1"),
])
def test_bad_arguments_are_refused(make_callback, words):
    with pytest.raises(errors.InvalidArgumentError, match=words):
        make_callback()


def test_steps_need_a_compiled_optimizer():
    keras = keras_for("tf_keras")
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    swa = SWA(every=2)
    swa.set_model(model)
    with pytest.raises(errors.InvalidArgumentError, match="no compiled optimizer"):
        swa.on_train_begin()


# --- a run's callbacks changed between two fits -------------------------------------------


@pytest.mark.filterwarnings("ignore::objckpt.errors.BatchNormStatisticsWarning")
def test_a_callback_added_or_removed_since_the_checkpoint(tmp_path):
    flavour = session_flavour()
    _, model = make(flavour)
    fit(model, [Checkpointing(tmp_path / "plain", verbose=0)], epochs=1)
    _, model = make(flavour)
    swa, steps = SWA(), SWA(every=3, name="steps")
    with pytest.warns(RuntimeWarning, match="holds no state of") as seen:
        fit(model, [Checkpointing(tmp_path / "plain", verbose=0), swa, steps], epochs=2)
    said = [str(w.message) for w in seen if "holds no state of" in str(w.message)]
    assert sorted(line.split("`")[1] for line in said) == ["steps", "swa"]
    assert all("(a callback added since it was written): it starts afresh" in line
               for line in said)
    assert swa.count == 1  # the epoch trained after the resume
    assert steps.count == 1  # steps 5 to 8: a multiple of 3 once (step 6)
    assert_bits(network(model), averaged(swa), "an average of one epoch: its weights")

    _, model = make(flavour)
    fit(model, [Checkpointing(tmp_path / "swa", verbose=0), SWA()], epochs=1)
    _, model = make(flavour)
    resumed = Checkpointing(tmp_path / "swa", verbose=0)
    with pytest.warns(RuntimeWarning, match="holds the state of `swa` and no callback"):
        fit(model, [resumed], epochs=2)
    assert resumed.resumed_from.endswith("ckpt-1")
