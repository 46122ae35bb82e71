"""tf.distribute benchmarks: Twins.sync and restore(Snapshot) under a two-replica
MirroredStrategy against the same operations on one device (issue 18).

Run through `python benchmarks/run.py --section distribute`. The strategy needs two
devices; on a CPU machine the CPU is split into two logical devices, which TF allows only
before it initializes its devices, so the measurement runs in a fresh child process (this
file with the hidden flag --child) and the parent prints what the child measured.

Both models are model (a) of run.py (24 Dense(1024) layers, 25.2M parameters), built once
without a strategy and once under `MirroredStrategy(["/cpu:0", "/cpu:1"])`; every
operation of both is timed in the same child, interleaved round by round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from timing import met


def bench_distribute(repeats: int) -> dict:
    """Runs the measurement in a child process and returns its result."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(repeats)],
                          capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the distribute benchmark's child failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _child(repeats: int) -> dict:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from run import build_mlp

    import objckpt

    from timing import time_ops

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    single = build_mlp(keras)
    with strategy.scope():
        mirrored = build_mlp(keras)
    replicas = strategy.num_replicas_in_sync
    twins_single = objckpt.Twins(single)
    twins_mirrored = objckpt.Twins(mirrored)
    past = twins_mirrored.past
    snap_single, snap_mirrored = objckpt.snapshot(single), objckpt.snapshot(mirrored)

    @tf.function
    def sync_in_replicas():
        strategy.run(twins_mirrored.sync)

    @tf.function
    def polyak_in_replicas():
        strategy.run(lambda: twins_mirrored.sync(0.01))

    ops = {
        "one device: Twins.sync()": twins_single.sync,
        "2 replicas: Twins.sync()": twins_mirrored.sync,
        "2 replicas: Twins.sync() inside strategy.run": sync_in_replicas,
        "one device: Twins.sync(tau=0.01)": lambda: twins_single.sync(0.01),
        "2 replicas: Twins.sync(tau=0.01)": lambda: twins_mirrored.sync(0.01),
        "2 replicas: Twins.sync(tau=0.01) inside strategy.run": polyak_in_replicas,
        "2 replicas: past.set_weights(current.get_weights())":
            lambda: past.set_weights(mirrored.get_weights()),
        "one device: restore(Snapshot)": lambda: objckpt.restore(single, snap_single),
        "2 replicas: restore(Snapshot)": lambda: objckpt.restore(mirrored, snap_mirrored),
    }
    ms = time_ops(ops, repeats)
    sync2, restore2 = ms["2 replicas: Twins.sync()"], ms["2 replicas: restore(Snapshot)"]
    rows = [
        ("2-replica Twins.sync() time / one-device Twins.sync()",
         sync2 / ms["one device: Twins.sync()"], "<= 2.5x"),
        ("2-replica sync() in strategy.run time / one-device Twins.sync()",
         ms["2 replicas: Twins.sync() inside strategy.run"] / ms["one device: Twins.sync()"],
         None),
        ("2-replica Twins.sync() vs 2-replica set_weights(get_weights())",
         ms["2 replicas: past.set_weights(current.get_weights())"] / sync2, ">= 30x"),
        ("2-replica sync(tau) time / one-device sync(tau)",
         ms["2 replicas: Twins.sync(tau=0.01)"] / ms["one device: Twins.sync(tau=0.01)"], None),
        ("2-replica restore(Snapshot) time / one-device restore(Snapshot)",
         restore2 / ms["one device: restore(Snapshot)"], "<= 2.5x"),
    ]
    nbytes = sum(v.shape.num_elements() * v.dtype.size for v in objckpt.tree(single).values())
    return {"model": f"{single.name}, {nbytes / 1e6:.1f} MB, {replicas} replicas on "
                     f"{os.cpu_count()} CPUs", "ms": ms,
            "ratios": [(what, value, target or "", None if target is None else met(value, target))
                       for what, value, target in rows]}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(_child(int(sys.argv[2]))))
