"""Stress test: SIGKILL training with Checkpointing thousands of times; count the damage.

Usage:
  python benchmarks/stress_checkpointing.py [--kills 2000] [--flavour keras3]
                                            [--epochs 12] [--seed 0]

A fork server (tests/helpers/ckpt_worker.py: one TensorFlow import) starts training
workers that fit with `objckpt.callbacks.Checkpointing` (a save after every
batch, sync and async alternating) into one directory; each is SIGKILLed at
a random moment after it began training, and the next one resumes. After
every kill the directory must restore (strictly, into the same layout) from
the checkpoint its state file names, and never from an older one than
before. When a worker finishes, its final weights are compared bit for bit
with an uninterrupted run, and a fresh directory starts. Prints
`kills, unrestorable` (and regressions and final mismatches) at the end;
the exit status is 1 if any count but kills is non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import objckpt  # noqa: E402
from objckpt import _compat  # noqa: E402

from tests._training import test_checkpointing as t  # noqa: E402  (the fault tests' helpers)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=2000)
    parser.add_argument("--flavour", default="keras3", choices=["keras3", "tf_keras", "keras2"])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.flavour == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    _, probe = t.make(args.flavour)
    _compat.build_optimizer(probe.optimizer, probe.trainable_variables)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="objckpt-stress-")
    server = t.Server(args.flavour)
    counts = {"kills": 0, "unrestorable": 0, "regressions": 0, "completed runs": 0,
              "final mismatches": 0}
    job = dict(epochs=args.epochs, save_freq=1, max_to_keep=2)
    started = time.time()
    try:
        ref = os.path.join(work, "ref")
        pid = server.start(dir=ref, out=ref + ".npz", **job)
        t.wait_until_training(ref, pid)
        begin = time.time()
        if server.finish() != 0:
            raise SystemExit("the uninterrupted reference run failed")
        span = time.time() - begin
        expected = t.final_values(ref + ".npz")
        run, directory, newest = 0, os.path.join(work, "run0"), None
        out = os.path.join(work, "run.npz")
        while counts["kills"] < args.kills:
            pid = server.start(dir=directory, out=out, **{**job, "async": rng.random() < 0.5})
            t.wait_until_training(directory, pid)
            time.sleep(rng.uniform(0.0, 0.9) * span)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            code = server.finish()
            if code == 0:
                counts["completed runs"] += 1
                got = t.final_values(out)
                if any(a.tobytes() != b.tobytes() for a, b in zip(expected, got)):
                    counts["final mismatches"] += 1
                shutil.rmtree(directory, ignore_errors=True)
                run += 1
                directory, newest = os.path.join(work, f"run{run}"), None
                continue
            counts["kills"] += 1
            number = _check(directory, probe, counts)
            if newest is not None and (number or 0) < newest:
                counts["regressions"] += 1
            newest = number if number is not None else newest
            if counts["kills"] % 100 == 0:
                print(_line(counts, started), flush=True)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print(_line(counts, started))
    return 1 if any(v for k, v in counts.items() if k not in ("kills", "completed runs")) else 0


def _check(directory, probe, counts):
    """The newest checkpoint's number, restored strictly; counts it if it does not restore."""
    if not os.path.exists(os.path.join(directory, "checkpoint")):
        return None
    latest = tf.train.latest_checkpoint(directory)
    try:
        if latest is None:
            raise ValueError("the state file names no existing checkpoint")
        objckpt.restore(t.layout_of(probe), latest)
    except Exception as err:  # counted, and shown
        counts["unrestorable"] += 1
        print(f"unrestorable after kill {counts['kills']}: {err}", flush=True)
        return None
    return int(latest.rsplit("-", 1)[1])


def _line(counts, started) -> str:
    rate = counts["kills"] / max(time.time() - started, 1e-9)
    return (f"kills: {counts['kills']}, unrestorable: {counts['unrestorable']}, "
            f"regressions: {counts['regressions']}, completed runs: {counts['completed runs']}, "
            f"final mismatches: {counts['final mismatches']} ({rate:.2f} kills/s)")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
