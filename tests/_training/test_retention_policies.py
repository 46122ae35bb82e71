"""Retention policies of managed directories, through `CheckpointManager` and
`callbacks.Checkpointing`: keep every N steps, every N hours (TF's semantics), a predicate,
the minimum intervals between saves, keep-all; a simulated day on a fake clock, restarts
that change nothing, `model.fit` in each Keras flavour, and the argument checks.

`simulated_day` takes the directory as an argument, so the same day runs against object
stores (gs://, s3://) where their emulators run.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import state as _ckptstate
from objckpt._training import checkpointing as _checkpointing
from objckpt._training import retention as _retention
from objckpt.callbacks import Checkpointing

from flavours import KERAS_FLAVOURS, build_module, keras_for, module_step

DAY_START = 1_600_000_000.0  # a fake clock in the past (the state file's times are checked
# against the real clock: a time in the future is implausible)
DAY_POLICY = dict(max_to_keep=3, keep_every_n_hours=6, keep_every_n_steps=2400,
                  keep=lambda kept: kept.step == 5000)
# 144 saves, ckpt-i at step 50 * i, DAY_START + 600 * i: 6 h preserves ckpt-36, 72 and 108 as
# they leave the newest 3 (ckpt-144 is still among them); steps 2400, 4800, 7200 are ckpt-48,
# 96, 144; the predicate keeps ckpt-100 (step 5000); the newest 3 are ckpt-142..144.
DAY_KEPT = [36, 48, 72, 96, 100, 108, 142, 143, 144]


class FakeClock:
    """`retention.now`, set by hand."""

    def __init__(self, t=DAY_START):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(_retention, "now", fake)
    return fake


class Tiny(tf.Module):
    def __init__(self):
        super().__init__(name="tiny")
        self.w = tf.Variable(np.zeros(3, np.float32))


def simulated_day(directory: str, clock: FakeClock, restarts=()) -> list[int]:
    """A day of training on `clock`: a save every 10 minutes for 24 h (144 saves, ckpt-i at
    step 50 * i) through a CheckpointManager with DAY_POLICY in `directory` (a local path or
    a URL); after each save numbered in `restarts` the manager is closed and a new one opened
    (a restart, resuming with `restore_latest`). Returns the numbers kept at the end."""
    obj = Tiny()
    clock.t = DAY_START  # the directory is first opened at the start of the day

    def open_manager():
        return objckpt.CheckpointManager(obj, directory, verbose=0, **DAY_POLICY)

    manager = open_manager()
    try:
        for i in range(1, 145):
            clock.t = DAY_START + 600.0 * i
            obj.w.assign(np.full(3, i, np.float32))
            assert manager.save(50 * i).endswith(f"ckpt-{i}")
            if i in restarts:
                manager.close()
                obj.w.assign(np.zeros(3, np.float32))
                manager = open_manager()
                assert manager.restore_latest() == 50 * i
                assert obj.w.numpy().tolist() == [i] * 3
        assert [k.step for k in manager.kept] == [50 * n for n in DAY_KEPT]
        return [k.number for k in manager.kept]
    finally:
        manager.close()


def on_disk(directory) -> list[int]:
    return sorted(int(name[len("ckpt-"):-len(".index")]) for name in os.listdir(directory)
                  if name.startswith("ckpt-") and name.endswith(".index"))


@pytest.mark.parametrize("restarts", [(), (74, 110)], ids=["uninterrupted", "two-restarts"])
def test_a_simulated_day_keeps_exactly_the_rules_checkpoints(clock, tmp_path, restarts):
    # Restarting after ckpt-74 (ckpt-72 has not left the newest 3 yet, last preserved is
    # ckpt-36) and after ckpt-110 (ckpt-108 just preserved) changes nothing.
    assert simulated_day(str(tmp_path), clock, restarts) == DAY_KEPT
    assert on_disk(tmp_path) == DAY_KEPT
    state = _ckptstate.read_state(str(tmp_path))
    assert state.names == [f"ckpt-{n}" for n in DAY_KEPT]
    assert state.preserved == DAY_START + 600.0 * 108  # TF's last_preserved_timestamp
    assert [state.timestamps[f"ckpt-{n}"] for n in DAY_KEPT] == [
        DAY_START + 600.0 * n for n in DAY_KEPT]
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-144")


def test_without_the_hours_rule_the_day_keeps_less(clock, tmp_path, monkeypatch):
    monkeypatch.setitem(DAY_POLICY, "keep_every_n_hours", None)
    with pytest.raises(AssertionError):  # the steps assert in simulated_day: no 36/72/108
        simulated_day(str(tmp_path), clock)
    assert on_disk(tmp_path) == [48, 96, 100, 142, 143, 144]


def test_module_checkpoint_interval_and_keep_every_n_steps_survive_a_restart(tmp_path):
    obj = build_module(train=False)  # tf.train.Checkpoint(model=ModuleNet, optimizer=Adam)
    policy = dict(max_to_keep=1, checkpoint_interval=4, keep_every_n_steps=8, verbose=0)
    saved = {}
    manager = objckpt.CheckpointManager(obj, tmp_path, **policy)
    for step in range(21):  # a save asked for at every step
        if step == 11:  # a restart: the last save (step 8) is read back from ckpt-3
            manager.close()
            manager = objckpt.CheckpointManager(obj, tmp_path, **policy)
            assert manager.restore_latest() == 8
            assert [(k.number, k.step) for k in manager.kept] == [(1, 0), (3, 8)]
        if step:
            module_step(obj.model, obj.optimizer)
        prefix = manager.save(step)
        if prefix is not None:
            saved[step] = os.path.basename(prefix)
    assert manager.skipped == 7  # steps 11 (8 read back + 4 is 12), 13-15, 17-19 here
    manager.close()
    assert saved == {0: "ckpt-1", 4: "ckpt-2", 8: "ckpt-3", 12: "ckpt-4", 16: "ckpt-5",
                     20: "ckpt-6"}
    assert on_disk(tmp_path) == [1, 3, 5, 6]  # steps 0, 8, 16 and the newest


def test_min_interval_seconds_by_the_clock_also_after_a_restart(clock, tmp_path):
    obj = Tiny()
    written = []
    manager = objckpt.CheckpointManager(obj, tmp_path, min_interval_seconds=60, verbose=0,
                                        max_to_keep=None)
    for i in range(12):  # a save asked for every 25 s
        clock.t = DAY_START + 25.0 * i
        if i == 5:  # a restart: 60 s count from ckpt-2's timestamp (75 s), as the state file says
            manager.close()
            manager = objckpt.CheckpointManager(obj, tmp_path, min_interval_seconds=60,
                                                verbose=0, max_to_keep=None)
        if manager.save(i) is not None:
            written.append(25 * i)
    manager.close()
    assert written == [0, 75, 150, 225]
    assert on_disk(tmp_path) == [1, 2, 3, 4]  # max_to_keep=None: all kept


def test_a_raising_keep_predicate_writes_and_deletes_nothing(tmp_path):
    obj = Tiny()
    with objckpt.CheckpointManager(obj, tmp_path, max_to_keep=1, verbose=0,
                                   keep=lambda kept: kept.step // 0 == 1) as manager:
        with pytest.raises(errors.InvalidArgumentError) as info:
            manager.save(7)
        assert manager.kept == []
    assert str(info.value).startswith(
        f"The keep= predicate raised ZeroDivisionError (integer division or modulo by zero) "
        f"for checkpoint `{tmp_path / 'ckpt-1'}` (Kept(ckpt-1, metric=nan, step=7), ")
    assert on_disk(tmp_path) == []


# --- Checkpointing under model.fit ------------------------------------------------------------


def small_model(keras):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    x = keras.layers.BatchNormalization()(keras.layers.Dense(4)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_fit_checkpoint_interval_and_keep_every_n_steps_across_a_restart(flavour, tmp_path):
    keras = keras_for(flavour)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")

    def fit(epochs):
        model = small_model(keras)
        callback = Checkpointing(tmp_path, save_freq=1, max_to_keep=2, keep_every_n_steps=3,
                                 checkpoint_interval=5, verbose=0)
        model.fit(x, y, epochs=epochs, batch_size=2, shuffle=False, verbose=0,
                  callbacks=[callback])  # 8 steps an epoch, a save asked for at every step
        return callback

    first = fit(3)  # steps 1-24: saved at 1, 6, 11, 16, 21
    assert [os.path.basename(p) for p in first.saved] == [f"ckpt-{n}" for n in range(1, 6)]
    assert first.manager.skipped == 19
    assert [(k.number, k.step) for k in first.manager.kept] == [(2, 6), (4, 16), (5, 21)]
    second = fit(4)  # resumes after step 24; step 21 read back: saved at 26, 31 (not 25)
    assert second.resumed_from == str(tmp_path / "ckpt-5")
    assert [os.path.basename(p) for p in second.saved] == ["ckpt-6", "ckpt-7"]
    assert [(k.number, k.step) for k in second.manager.kept] == [
        (2, 6), (5, 21), (6, 26), (7, 31)]
    assert on_disk(tmp_path) == [2, 5, 6, 7]


# --- argument checks --------------------------------------------------------------------------

BAD = [
    (dict(max_to_keep=0), "max_to_keep must be an int >= 1 (the newest checkpoints to keep; "
                          "None: all). Received: max_to_keep=0. Fix: pass a whole number >= 1."),
    (dict(keep_every_n_steps=0), "keep_every_n_steps must be an int >= 1 (keep forever each "
                                 "checkpoint whose step is a multiple of it; None: off). "
                                 "Received: keep_every_n_steps=0."),
    (dict(keep_every_n_steps=2.0), "Received: keep_every_n_steps=2.0. Fix: pass a whole "
                                   "number >= 1."),
    (dict(checkpoint_interval=True), "checkpoint_interval must be an int >= 1 (skip a save "
                                     "less than this many steps after the last one; None: "
                                     "off). Received: checkpoint_interval=True."),
    (dict(keep_every_n_hours=0), "keep_every_n_hours must be None or a number > 0 (preserve "
                                 "a checkpoint leaving the newest max_to_keep every this many "
                                 "hours). Received: keep_every_n_hours=0. Fix: pass a finite "
                                 "number > 0, e.g. keep_every_n_hours=6, or None to turn it "
                                 "off."),
    (dict(keep_every_n_hours=math.inf), "Received: keep_every_n_hours=inf."),
    (dict(keep_every_n_hours="6"), "Received: keep_every_n_hours='6'."),
    (dict(min_interval_seconds=-1.5), "min_interval_seconds must be None or a number > 0 "
                                      "(skip a save less than this many seconds after the "
                                      "last one). Received: min_interval_seconds=-1.5."),
    (dict(keep=True), "keep must be None or a callable (Kept) -> bool that returns True for "
                      "each checkpoint to keep forever. Received: keep=True. Fix: pass a "
                      "function, e.g. keep=lambda kept: kept.step % 10_000 == 0."),
]


@pytest.mark.parametrize("make", ["Checkpointing", "CheckpointManager"])
@pytest.mark.parametrize("kwargs,message", BAD, ids=[next(iter(k)) + str(i)
                                                     for i, (k, _) in enumerate(BAD)])
def test_each_rule_argument_is_checked_by_both(make, kwargs, message, tmp_path):
    directory = tmp_path / "never"
    with pytest.raises(errors.InvalidArgumentError) as info:
        if make == "Checkpointing":
            Checkpointing(directory, **kwargs)
        else:
            objckpt.CheckpointManager(Tiny(), directory, **kwargs)
    assert message in str(info.value)
    assert not directory.exists()


@pytest.mark.parametrize("kwargs,message", BAD, ids=[next(iter(k)) + str(i)
                                                     for i, (k, _) in enumerate(BAD)])
def test_the_policy_checks_each_field_itself_with_the_same_message(kwargs, message):
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.RetentionPolicy(**kwargs)
    assert message in str(info.value)


def test_a_policy_is_a_frozen_keyword_only_value_equal_to_its_keywords(tmp_path):
    import dataclasses

    policy = objckpt.RetentionPolicy(max_to_keep=3, keep_best=1, mode="max",
                                     keep_every_n_steps=10)
    assert objckpt.RetentionPolicy is _retention.RetentionPolicy
    assert "RetentionPolicy" in objckpt.__all__
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_to_keep = 4
    with pytest.raises(TypeError):
        objckpt.RetentionPolicy(3)  # keyword-only
    assert dataclasses.replace(policy, max_to_keep=None).max_to_keep is None
    with pytest.raises(errors.InvalidArgumentError, match="Received: max_to_keep=0"):
        dataclasses.replace(policy, max_to_keep=0)  # checked again
    assert objckpt.RetentionPolicy() == objckpt.RetentionPolicy(max_to_keep=5, keep_best=0)
    # The keywords are shortcuts that build the same policy; none given: the defaults.
    by_keywords = Checkpointing(tmp_path, max_to_keep=3, keep_best=1, mode="max",
                                keep_every_n_steps=10)
    by_policy = Checkpointing(tmp_path, retention=policy)
    assert by_keywords.retention == by_policy.retention == policy
    assert (by_policy.max_to_keep, by_policy.keep_best, by_policy.mode) == (3, 1, "max")
    assert by_policy.rules["keep_every_n_steps"] == 10
    assert Checkpointing(tmp_path).retention == objckpt.RetentionPolicy()
    with objckpt.CheckpointManager(Tiny(), tmp_path / "run", retention=policy,
                                   verbose=0) as manager:
        assert manager.retention is policy
        assert manager._directory.retention is policy


@pytest.mark.parametrize("make", ["Checkpointing", "CheckpointManager"])
def test_a_policy_and_a_keyword_together_are_refused_naming_both(make, tmp_path):
    directory = tmp_path / "never"
    policy = objckpt.RetentionPolicy(max_to_keep=3)
    for kwargs, message in [
            (dict(retention=policy, max_to_keep=3),
             f"{make} takes the retention rules once: as retention= or as keywords, not both. "
             "Received: retention=RetentionPolicy(max_to_keep=3, keep_best=0, mode='min') "
             "and max_to_keep=3. Fix: put max_to_keep in the RetentionPolicy"),
            (dict(retention=policy, keep=None, mode="min"), "and mode='min', keep=None."),
            (dict(retention={"max_to_keep": 3}),
             f"{make}: retention must be an objckpt.RetentionPolicy. Received: "
             "retention={'max_to_keep': 3}. Fix: pass retention=objckpt.RetentionPolicy(")]:
        with pytest.raises(errors.InvalidArgumentError) as info:
            if make == "Checkpointing":
                Checkpointing(directory, **kwargs)
            else:
                objckpt.CheckpointManager(Tiny(), directory, **kwargs)
        assert message in str(info.value)
    assert not directory.exists()


# --- several workers: the rules on time use the chief's clock (the agreements played here) ----


class Scripted(_checkpointing.Cluster):
    """A two-worker Cluster whose other worker is played by `replies` (rows, in order);
    what this worker sends is kept in `sent`."""

    def __init__(self, chief: bool, *replies):
        super().__init__(None, chief, 0 if chief else 1, 2, f"worker {0 if chief else 1}", 0)
        self.replies, self.sent = list(replies), []

    def gather(self, row):
        self.sent.append([float(x) for x in row])
        rows = [None, None]
        rows[self.index], rows[1 - self.index] = self.sent[-1], list(self.replies.pop(0))
        return rows


def opened(path, cluster, **kwargs):
    obj = Tiny()
    directory = _checkpointing.CheckpointDirectory(
        path, obj, retention=_retention.RetentionPolicy(**kwargs))
    original = _checkpointing.Cluster.of
    _checkpointing.Cluster.of = staticmethod(lambda variables: cluster)
    try:
        directory.open()
    finally:
        _checkpointing.Cluster.of = original
    return directory


def test_a_follower_takes_the_chiefs_time_and_its_decision_to_skip(clock, tmp_path):
    clock.t = DAY_START + 5.0  # this worker's clock; the chief's differs
    follower = Scripted(False, [0, 0, 1], [0])  # the chief: fresh, next is ckpt-1; no failure
    directory = opened(tmp_path, follower, keep_every_n_hours=1, min_interval_seconds=60)
    follower.replies += [[0, DAY_START + 100.0], [0]]  # the chief saves at its 100 s; all ok
    assert directory.save() == str(tmp_path / "ckpt-1")
    assert follower.sent[-2:] == [[0.0, 0.0], [0.0]]
    assert [(k.number, k.timestamp) for k in directory.kept] == [(1, DAY_START + 100.0)]
    follower.replies.append([1, DAY_START + 130.0])  # the chief skips (too soon by its clock)
    clock.t = DAY_START + 500.0  # not too soon by this worker's: the chief decides
    assert directory.save() is None and directory.skipped == 1
    assert len(follower.replies) == 0 and os.listdir(tmp_path) == []  # no failure round
    directory.close()

    chief = Scripted(True, [0, 0, 0], [0])
    directory = opened(tmp_path / "chief", chief, min_interval_seconds=60)
    chief.replies += [[0, 0], [0]]
    clock.t = DAY_START + 1000.0
    assert directory.save() == str(tmp_path / "chief" / "ckpt-1")
    assert chief.sent[-2:] == [[0.0, DAY_START + 1000.0], [0.0]]
    chief.replies.append([0, 0])
    clock.t = DAY_START + 1030.0
    assert directory.save() is None  # too soon: it says so, and no one writes
    assert chief.sent[-1] == [1.0, DAY_START + 1030.0]
    directory.close()
