"""Checkpointing benchmarks: sync save, async blocking and epoch time, resume.

Run through `python benchmarks/run.py --section checkpointing`, or alone:
`python benchmarks/bench_checkpointing.py [--repeats N] [--epochs N]`.

Model: the ~100 MB MLP of run.py (24 Dense(1024), 25.2M parameters), trained
with Adam, so each checkpoint holds ~300 MB (weights and two moments).
Baselines: `tf.train.CheckpointManager.save` for saving (same root, same
max_to_keep), `tf.train.Checkpoint.restore` of the same checkpoint for
resuming, and `model.fit` without any callback for the epoch time.

An async save blocks training only for the Snapshot (milliseconds); the
write then runs in a background thread. Its CPU work (TF's per-tensor CRC32C
and the copy into the page cache, plus TF's copy-on-write of the variables
the next step updates) overlaps training only as far as spare CPU cores
allow: on a machine whose cores all train (CPU training on 2 cores), part of
it shows up in the epoch time, so the epoch-time ratio depends on how long
an epoch is next to a save (64 batches of 32 by default, ~10 s on 2 cores).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import tensorflow as tf

from objckpt import _compat
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import Checkpointing

from timing import met, time_ops


def _model(keras, builder):
    model = builder(keras)
    model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
    _compat.build_optimizer(model.optimizer, model.trainable_variables)
    return model


def _fresh(directory: str) -> str:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    return directory


def bench_save_and_resume(keras, builder, repeats: int) -> dict:
    """Sync save vs CheckpointManager.save; resume vs tf.train.Checkpoint.restore."""
    model = _model(keras, builder)
    work = tempfile.mkdtemp(prefix="objckpt-bench-ckpt-")
    ours = _checkpointing.CheckpointDirectory(
        os.path.join(work, "ours"), model, retention=_checkpointing.RetentionPolicy(max_to_keep=2),
        fingerprint=lambda: _compat.fingerprint(model))
    ours.open()
    tf_root = tf.train.Checkpoint(model=model, **ours.counters, monitor_value=ours.metric)
    manager = tf.train.CheckpointManager(tf_root, os.path.join(work, "tf"), max_to_keep=2)
    nbytes = sum(v.shape.num_elements() * v.dtype.size for v in _compat_tree(ours).values())
    save_ms = time_ops({"Checkpointing save (sync)": lambda: ours.save(0.5),
                        "tf.train.CheckpointManager.save": manager.save}, repeats)
    ours.close()
    latest = ours.kept[-1]

    def resume():
        resumed = _checkpointing.CheckpointDirectory(
            ours.directory, model, retention=_checkpointing.RetentionPolicy(max_to_keep=2),
            fingerprint=lambda: _compat.fingerprint(model))
        kept = resumed.open()
        resumed.restore(kept)
        resumed.close()

    def tf_restore():
        tf.train.Checkpoint(model=model, **ours.counters, monitor_value=ours.metric).restore(
            tf.train.latest_checkpoint(ours.directory)).expect_partial()

    resume_ms = time_ops({"Checkpointing resume (open + restore)": resume,
                          "tf.train.Checkpoint.restore(latest)": tf_restore}, repeats)
    assert latest.prefix == tf.train.latest_checkpoint(ours.directory)
    shutil.rmtree(work, ignore_errors=True)
    ms = {**save_ms, **resume_ms}
    rows = []
    for what, ours_name, theirs, target in (
            ("sync save time / CheckpointManager.save", "Checkpointing save (sync)",
             "tf.train.CheckpointManager.save", "<= 1.1x"),
            ("resume time / tf.train.Checkpoint.restore", "Checkpointing resume (open + restore)",
             "tf.train.Checkpoint.restore(latest)", "<= 1.1x")):
        ratio = ms[ours_name] / ms[theirs]
        rows.append((what, ratio, target, met(ratio, target)))
    return {"model": model.name, "bytes": nbytes, "ms": ms, "ratios": rows,
            "description": f"{model.name} + Adam state, {nbytes / 1e6:.0f} MB per checkpoint"}


def _compat_tree(directory):
    return directory._current_layout()[1]


def bench_async(keras, builder, epochs: int, steps: int, batch: int, repeats: int) -> dict:
    """Blocked time per async save vs a sync save; epoch time with async saves vs none.

    Epoch time is the steady state: the time between consecutive epoch ends
    (a save included), measured after the save of the epoch; the first
    epoch of each fit is left out. The whole fit per epoch, the wait for the
    last write at the end of training included, is reported too.
    """
    model = _model(keras, builder)
    width = model.inputs[0].shape[-1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, width)).astype("float32")
    y = rng.normal(size=(steps * batch, model.outputs[0].shape[-1])).astype("float32")
    work = tempfile.mkdtemp(prefix="objckpt-bench-async-")
    blocked = {True: [], False: []}

    class Timed(Checkpointing):
        def _save(self, logs):  # the time the training loop waits for a save
            start = time.perf_counter()
            super()._save(logs)
            blocked[self.async_save].append(time.perf_counter() - start)

    class EpochEnds(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter())

    def fit(callbacks):
        ends = EpochEnds()
        start = time.perf_counter()
        model.fit(x, y, epochs=epochs, batch_size=batch, shuffle=False, verbose=0,
                  callbacks=[*callbacks, ends])  # after the save: its blocking counts
        whole = (time.perf_counter() - start) / epochs
        return list(np.diff(ends.times)), whole

    fit([])  # warm up: trace the train function
    plain, with_async, whole_plain, whole_async = [], [], [], []
    for _ in range(repeats):  # interleaved: the same drift hits both
        epochs_, whole = fit([])
        plain += epochs_
        whole_plain.append(whole)
        epochs_, whole = fit([Timed(_fresh(os.path.join(work, "a")), max_to_keep=2,
                                    async_save=True)])
        with_async += epochs_
        whole_async.append(whole)
        fit([Timed(_fresh(os.path.join(work, "s")), max_to_keep=2)])  # sync, for the ratio
    shutil.rmtree(work, ignore_errors=True)
    ms = {"epoch without saving": float(np.median(plain)) * 1e3,
          "epoch with an async save per epoch": float(np.median(with_async)) * 1e3,
          "whole fit per epoch, without saving": float(np.median(whole_plain)) * 1e3,
          "whole fit per epoch, async (last write awaited)": float(np.median(whole_async)) * 1e3,
          "training blocked per async save": float(np.median(blocked[True])) * 1e3,
          "training blocked per sync save": float(np.median(blocked[False])) * 1e3}
    rows = []
    ratio = ms["training blocked per async save"] / ms["training blocked per sync save"]
    rows.append(("blocked per async save / sync save", ratio, "<= 0.2x", met(ratio, "<= 0.2x")))
    ratio = ms["epoch with an async save per epoch"] / ms["epoch without saving"]
    rows.append(("epoch time with async saves / without saving", ratio, "<= 1.05x",
                 met(ratio, "<= 1.05x")))
    rows.append(("whole fit with async saves / without saving (last write awaited)",
                 ms["whole fit per epoch, async (last write awaited)"]
                 / ms["whole fit per epoch, without saving"], "", None))
    return {"model": model.name, "batch": batch, "steps": steps, "ms": ms, "ratios": rows,
            "description": f"{model.name} + Adam in model.fit, batch {batch}, {steps} batches "
                           f"per epoch, {epochs} epochs, one save per epoch"}


def run(keras, builder, repeats: int, epochs: int = 3, steps: int = 64, batch: int = 32,
        async_repeats: int = 2) -> dict:
    return {"save_resume": bench_save_and_resume(keras, builder, repeats),
            "async": bench_async(keras, builder, epochs, steps, batch, async_repeats)}


def main(argv=None) -> int:
    import argparse

    import run as bench_run

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="batches per epoch")
    parser.add_argument("--async-repeats", type=int, default=2, help="fits per variant")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    keras = bench_run._keras()
    results = run(keras, bench_run.build_mlp, args.repeats, args.epochs, args.steps, args.batch,
                  args.async_repeats)
    for title, result in results.items():
        print(f"\n[checkpointing: {title}] {result['description']}")
        bench_run._print_result("", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
