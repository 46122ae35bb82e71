"""objckpt.CheckpointManager: custom-loop saves and exact resume in every flavour, keep-N and
best-K retention, argument and metrics checks, per-checkpoint timestamps in TF's state file,
and a SIGKILL in a custom loop (forked workers of ckpt_worker.py) resuming bit-identical.
"""

import json
import math
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt.callbacks import Checkpointing

from flavours import (
    FLAVOURS,
    KERAS_FLAVOURS,
    _data,
    build_functional,
    build_module,
    keras_for,
    session_flavour,
)
from support import assert_bits, values
from tests._training.test_checkpointing import (  # noqa: F401  (no_fault_hook: an autouse fixture)
    Server,
    final_values,
    native,
    no_fault_hook,
    said,
)

BATCHES = 4  # 8 samples, batches of 2


def make(flavour):
    """A built obj with an optimizer whose slots exist only after the first step: a compiled
    Keras functional model (Adam), or tf.train.Checkpoint(model=ModuleNet, optimizer=Adam)."""
    if flavour == "module":
        return build_module(train=True)  # TF1 Adam: slots made by its one training step
    keras = keras_for(flavour)
    keras.utils.set_random_seed(0)
    return build_functional(keras, train=False)


def train(obj, steps, start=0):
    """`steps` steps of a custom loop (GradientTape, apply_gradients) from step `start`;
    returns the last loss."""
    images, tokens, targets = _data()
    for step in range(start, start + steps):
        i = 2 * (step % BATCHES)
        with tf.GradientTape() as tape:
            if isinstance(obj, tf.train.Checkpoint):
                out, variables, optimizer = (
                    obj.model(images[i:i + 2, 0, 0]), obj.model.trainable_variables,
                    obj.optimizer)
                variables = [v for v in variables if v.dtype.is_floating]
            else:
                out, variables, optimizer = (
                    obj([images[i:i + 2], tokens[i:i + 2]], training=True),
                    obj.trainable_variables, obj.optimizer)
            loss = tf.reduce_mean(tf.square(out - targets[i:i + 2]))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return float(loss)


def printed(capsys) -> list[str]:
    return said(capsys, "CheckpointManager")


# --- save and exact resume, every flavour -------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_save_then_restore_latest_is_bit_identical(tmp_path, flavour, capsys):
    obj = make(flavour)
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=2) as manager:
        assert manager.restore_latest() is None and manager.latest is None  # fresh start
        train(obj, 2)
        first = manager.save(2, {"val_loss": 0.5})
        train(obj, 1, start=2)
        assert manager.save(np.int64(3)) == str(tmp_path / "ckpt-2")
        assert first == str(tmp_path / "ckpt-1")
        saved = values(obj)
        train(obj, 1, start=3)  # not saved: restore_latest must undo it
    assert printed(capsys) == []  # a fresh start says nothing
    fresh = make(flavour)
    with objckpt.CheckpointManager(fresh, tmp_path, max_to_keep=2) as manager:
        assert manager.restore_latest() == 3
        assert [k.number for k in manager.kept] == [1, 2]
        assert manager.latest == str(tmp_path / "ckpt-2")
    # Weights, optimizer slots and its step counter (`iterations`) all came back.
    assert_bits(saved, values(fresh))
    assert sum("optimizer" in p for p in saved) >= 5  # its step counter and slots among them
    assert printed(capsys) == [f"CheckpointManager: resumed from {tmp_path}/ckpt-2 (step 3)."]
    # What it writes is standard: TF's reader and objckpt.restore(at="model") both load it.
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-2")
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-2"))
    assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
    assert math.isnan(reader.get_tensor("monitor_value/.ATTRIBUTES/VARIABLE_VALUE"))
    other = make(flavour)
    if flavour != "module":  # Keras builds optimizer slots lazily: a strict restore needs them
        _compat.build_optimizer(other.optimizer, other.trainable_variables)
    report = objckpt.restore(other, str(tmp_path), at="model")
    assert not report.missing and not report.unexpected
    assert_bits(saved, values(other))


def test_verbose_0_prints_nothing(tmp_path, capsys):
    obj = make("module")
    with objckpt.CheckpointManager(obj, tmp_path, verbose=0) as manager:
        manager.save(7)
        assert manager.restore_latest() == 7
    assert printed(capsys) == []


# --- retention ------------------------------------------------------------------------------


class Tiny(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable([1.0, 2.0])


LOSSES = [5.0, 1.0, 4.0, 0.5, 3.0, 2.0]  # best two (min): steps 4 and 2


@pytest.mark.parametrize("mode", ["min", "max"])
def test_keeps_the_newest_and_the_best_and_reads_the_best_back(tmp_path, mode):
    obj = Tiny()
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=2, keep_best=2,
                                   monitor="loss", mode=mode, verbose=0) as manager:
        for step, loss in enumerate(LOSSES, 1):
            obj.w.assign([loss, float(step)])
            manager.save(step, {"loss": loss, "accuracy": 0.9})
        best = [4, 2] if mode == "min" else [1, 3]  # best first
        assert [k.number for k in manager.kept] == sorted({5, 6, *best})
        ranked = sorted(manager.kept, key=lambda k: (k.metric if mode == "min" else -k.metric))
        assert [k.number for k in manager.best()] == [k.number for k in ranked]
        assert [k.metric for k in manager.best()][:2] == sorted(
            LOSSES, reverse=mode == "max")[:2]
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".index"))
    assert names == sorted(f"ckpt-{n}.index" for n in {5, 6, *best})
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        f"ckpt-{n}" for n in sorted({5, 6, *best})]
    # A restart reads each kept checkpoint's metric back: the best ones survive new saves.
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=2, keep_best=2,
                                   monitor="loss", mode=mode, verbose=0) as manager:
        assert manager.best()[0].metric == (0.5 if mode == "min" else 5.0)
        for step in (7, 8):
            manager.save(step, {"loss": 2.5})
        assert [k.number for k in manager.kept] == sorted({7, 8, *best})
        assert manager.best()[0].prefix == str(tmp_path / f"ckpt-{best[0]}")


# --- argument checks ------------------------------------------------------------------------


def test_arguments_step_and_metrics_are_validated(tmp_path):
    obj = Tiny()
    for kwargs, message in [
        (dict(directory=3), "CheckpointManager needs a directory: a local path or a URL"),
        (dict(max_to_keep=0), "max_to_keep must be an int >= 1 (the newest checkpoints to "
                              "keep; None: all). Received: max_to_keep=0."),
        (dict(keep_best=-1), "keep_best must be an int >= 0"),
        (dict(mode="avg"), "mode must be one of 'min', 'max'. Received: mode='avg'."),
        (dict(on_error="ignore"), "on_error must be one of 'raise', 'warn'."),
        (dict(monitor=""), "monitor must be a logs key such as 'val_loss'."),
        (dict(async_save="yes"), "async_save must be True or False."),
        (dict(verbose=2), "verbose must be one of 0, 1. Received: verbose=2."),
    ]:
        directory = kwargs.pop("directory", tmp_path / "never")
        with pytest.raises(errors.InvalidArgumentError) as info:
            objckpt.CheckpointManager(obj, directory, **kwargs)
        assert message in str(info.value)
    assert not os.path.exists(tmp_path / "never")
    with objckpt.CheckpointManager(obj, tmp_path, keep_best=1, monitor="val_loss") as manager:
        for step, metrics, message in [
            (True, None, "step must be an int >= 0 (the training step). Received: step=True."),
            (-1, None, "step must be an int >= 0 (the training step). Received: step=-1."),
            ("3", None, "Received: step='3'."),
            (1.5, None, "Received: step=1.5."),
            (1, [("val_loss", 1.0)], "metrics must be a dict of name -> number, e.g. "
                                     "{'val_loss': 0.25}. Received: a list. Nothing was saved."),
            (1, None, "save() needs metrics['val_loss']: keep_best=1 ranks checkpoints by "
                      "it. Received: metrics=None. Nothing was saved. Fix: pass "
                      "metrics={'val_loss': value}, or give the manager monitor= one of the "
                      "keys you pass."),
            (1, {"loss": 1.0, "acc": 2}, "Received: metrics keys ['acc', 'loss']."),
            (1, {"val_loss": np.array([1.0, 2.0])}, "metrics['val_loss'] must be one real "
                                                    "number (a float, or a scalar tensor or "
                                                    "array). Received: array([1., 2.])."),
            (1, {"val_loss": "low"}, "Received: 'low'. Nothing was saved."),
            (1, {"val_loss": True}, "Received: True. Nothing was saved."),
        ]:
            with pytest.raises(errors.InvalidArgumentError) as info:
                manager.save(step, metrics)
            assert message in str(info.value), str(info.value)
        assert not [n for n in os.listdir(tmp_path) if n.startswith("ckpt-")]
        # Scalar tensors and NumPy numbers are numbers; NaN is kept but never best.
        manager.save(tf.constant(1, tf.int64), {"val_loss": tf.constant(0.25)})
        manager.save(2, {"val_loss": np.float32("nan")})
        assert [k.metric for k in manager.best()] == [0.25]
    with pytest.raises(errors.DirectoryLockedError, match="it was closed"):
        manager.save(3, {"val_loss": 1.0})


# --- timestamps in the state file -----------------------------------------------------------


def state(directory):
    state = tf.train.get_checkpoint_state(str(directory))  # TF's own reader
    return ([os.path.basename(p) for p in state.all_model_checkpoint_paths],
            list(state.all_model_checkpoint_timestamps), state.last_preserved_timestamp)


def test_each_checkpoint_keeps_its_own_timestamp(tmp_path):
    obj, before = Tiny(), time.time()
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=3, verbose=0) as manager:
        stamps = {}
        for step in range(1, 5):
            manager.save(step)
            names, times, preserved = state(tmp_path)
            stamps.update(zip(names, times))
            assert all(stamps[n] == t for n, t in zip(names, times))  # earlier ones unchanged
            time.sleep(0.002)
        assert [k.timestamp for k in manager.kept] == times
    assert names == ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert before <= preserved <= times[0] < times[1] < times[2] <= time.time()
    # A restart reads them back; a retention deletion and a new save keep the others' times.
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=3, verbose=0) as manager:
        assert [k.timestamp for k in manager.kept] == times
        manager.save(5)
    names2, times2, preserved2 = state(tmp_path)
    assert names2 == ["ckpt-3", "ckpt-4", "ckpt-5"]
    assert times2[:2] == times[1:] and times2[2] > times[2] and preserved2 == preserved


@pytest.mark.parametrize("garbled", [
    "wrong_length", "nan_and_future", "negative_preserved", "missing_timestamps"])
def test_garbled_timestamps_fall_back_to_the_index_files_time(tmp_path, garbled):
    obj = Tiny()
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=3, verbose=0) as manager:
        for step in range(1, 4):
            manager.save(step)
    names, times, _ = state(tmp_path)
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{n}"' for n in names]
    stamps = {"wrong_length": times[:2], "nan_and_future": [times[0], "nan", 1e300],
              "negative_preserved": times, "missing_timestamps": []}[garbled]
    lines += [f"all_model_checkpoint_timestamps: {t}" for t in stamps]
    lines.append(f"last_preserved_timestamp: {-5 if garbled == 'negative_preserved' else 1e300}")
    (tmp_path / "checkpoint").write_text("\n".join(lines) + "\n")
    mtimes = [os.stat(tmp_path / f"{n}.index").st_mtime for n in names]
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=3, verbose=0) as manager:
        expected = {"wrong_length": mtimes, "nan_and_future": [times[0], *mtimes[1:]],
                    "negative_preserved": times, "missing_timestamps": mtimes}[garbled]
        assert [k.timestamp for k in manager.kept] == expected
        assert manager.restore_latest() == 3
        manager.save(4)
    names2, times2, preserved2 = state(tmp_path)
    assert names2 == ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert times2[:2] == expected[1:] and times2[2] >= max(expected)
    assert all(math.isfinite(t) for t in times2)
    assert 0 < preserved2 <= min(expected)  # an implausible one is replaced, never kept


# --- SIGKILL in a custom loop ---------------------------------------------------------------


LOOP_KILLS = [("write", 2, False), ("index", 3, False), ("state", 2, False),
              ("delete", 1, False), ("data", 2, True)]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.subprocess
def test_sigkill_in_a_custom_loop_then_restart_resumes_bit_identical(tmp_path, flavour):
    native(flavour)
    server = Server(flavour)
    job = dict(loop=True, epochs=3, max_to_keep=2)
    try:
        assert server.run(dir=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **job) == 0
        directory, newest = tmp_path / "run", 0
        for stage, hit, async_save in LOOP_KILLS:
            code = server.run(dir=str(directory), out=str(tmp_path / "run.npz"),
                              fault=[stage, hit], **{**job, "async": async_save})
            assert code == -signal.SIGKILL, (stage, code)
            latest = tf.train.latest_checkpoint(str(directory))
            reader = tf.train.load_checkpoint(latest)
            step = int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
            assert step >= newest + (stage in ("state", "delete")), (stage, step, newest)
            newest = step
        assert server.run(dir=str(directory), out=str(tmp_path / "run.npz"), **job) == 0
    finally:
        server.close()
    with open(tmp_path / "run.npz.json") as f:
        assert json.load(f)["start"] == newest  # resumed from the newest committed step
    for a, b in zip(final_values(tmp_path / "ref.npz"), final_values(tmp_path / "run.npz")):
        assert a.tobytes() == b.tobytes()
    assert not [n for n in os.listdir(directory) if ".tmp-" in n]


# --- layouts it shares ------------------------------------------------------------------------


def test_keras3_model_and_optimizer_side_by_side_as_the_readme_shows(tmp_path):
    keras = keras_for("keras3")

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                  keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
        return tf.train.Checkpoint(model=model, optimizer=optimizer)

    def step(state):
        x = tf.ones((2, 3))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(state.model(x) ** 2)
        variables = state.model.trainable_variables
        state.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    state = build()
    with objckpt.CheckpointManager(state, tmp_path, keep_best=1, verbose=0) as manager:
        for number in range(1, 4):
            manager.save(number, {"val_loss": step(state)})
        saved = values(state)
    fresh = build()
    with objckpt.CheckpointManager(fresh, tmp_path, keep_best=1, verbose=0) as manager:
        assert manager.restore_latest() == 3
    assert_bits(saved, values(fresh))
    assert int(fresh.optimizer.iterations.numpy()) == 3


def test_resumes_a_directory_that_checkpointing_wrote(tmp_path):
    flavour = session_flavour()
    model = make(flavour)
    images, tokens, targets = _data()
    model.fit([images, tokens], targets, epochs=2, batch_size=2, shuffle=False, verbose=0,
              callbacks=[Checkpointing(tmp_path, verbose=0)])
    fresh = make(flavour)
    with objckpt.CheckpointManager(fresh, tmp_path, verbose=0) as manager:
        assert manager.restore_latest() == 8  # 2 epochs of 4 batches
        manager.save(9)
    assert_bits(values(model), values(fresh))
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-3"))
    assert int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")) == 2  # kept as restored
    assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 9
