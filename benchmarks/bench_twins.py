"""Twins benchmarks: sync, Polyak sync, training-loop overhead and memory.

Run through `python benchmarks/run.py` (section "twins").
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

import objckpt

from timing import met, time_ops


def bench_sync(builder, keras, repeats: int) -> dict:
    current = builder(keras)
    twins = objckpt.Twins(current)  # past: objckpt.clone(current)
    past = twins.past
    pairs = list(twins.variables().values())
    tau = 0.01
    host_current = [np.array(c) for c, _ in pairs]
    host_past = [np.array(p) for _, p in pairs]
    scratch = [np.empty_like(a) for a in host_current]
    counter = iter(range(10**9))

    def ram_round_trip():
        path = tf.train.Checkpoint(root=current).write(
            f"ram://objckpt-twins/{current.name}/ck{next(counter)}")
        tf.train.Checkpoint(root=past).read(path).assert_consumed()
        for name in tf.io.gfile.glob(path + "*"):
            tf.io.gfile.remove(name)

    def eager_assign_loop():
        for c, p in pairs:
            p.assign(c, read_value=False)

    def numpy_blend():
        for c, p, s in zip(host_current, host_past, scratch):
            np.multiply(c, tau, out=s)
            np.multiply(p, 1 - tau, out=p)
            np.add(p, s, out=p)

    ms = time_ops({
        "Twins.sync()": twins.sync,
        "Twins.sync(tau=0.01)": lambda: twins.sync(tau),
        "past.set_weights(current.get_weights())": lambda: past.set_weights(current.get_weights()),
        "tf.train.Checkpoint ram:// current -> past": ram_round_trip,
        "eager per-variable assign loop": eager_assign_loop,
        "NumPy in-place blend of the same bytes": numpy_blend,
    }, repeats)
    nbytes = sum(a.nbytes for a in host_current)
    sync = ms["Twins.sync()"]
    rows = [
        ("sync() vs set_weights(get_weights())",
         ms["past.set_weights(current.get_weights())"] / sync, ">= 50x"),
        ("sync() vs ram:// checkpoint round trip",
         ms["tf.train.Checkpoint ram:// current -> past"] / sync, ">= 300x"),
        ("sync() time / eager per-variable assign loop",
         sync / ms["eager per-variable assign loop"], "<= 1.5x"),
        ("sync(tau) time / NumPy in-place blend",
         ms["Twins.sync(tau=0.01)"] / ms["NumPy in-place blend of the same bytes"], "<= 2x"),
    ]
    return {"model": current.name, "variables": len(pairs), "bytes": nbytes, "ms": ms,
            "ratios": [(what, value, target, met(value, target)) for what, value, target in rows]}


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> bool:
    """Returns freed heap to the OS, then restarts the peak-RSS count (Linux only)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def bench_training(builder, keras, steps: int, batch: int, past_factory=None) -> dict:
    """Adam custom loop: step time with and without a sync every step, and peak memory.

    past_factory(model) makes the past copy; by default `objckpt.clone(model)`.
    """
    past_factory = past_factory or objckpt.clone
    model = builder(keras)
    optimizer = keras.optimizers.Adam(1e-4)
    width = model.inputs[0].shape[-1]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, width)).astype("float32"))
    y = tf.constant(rng.normal(size=(batch, model.outputs[0].shape[-1])).astype("float32"))

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    for _ in range(3):
        train_step()
    # Peak memory of the loop without twins, then with them (the past copy and
    # a sync every step): the difference is what Twins adds.
    measured = _reset_peak_rss()
    for _ in range(steps):
        train_step().numpy()
    peak_without = _peak_rss_bytes()
    twins = objckpt.Twins(model, past=past_factory(model))
    twins.sync()
    _reset_peak_rss()
    for _ in range(steps):
        train_step().numpy()
        twins.sync()
    peak_with = _peak_rss_bytes()
    with_sync, without_sync = [], []
    for _ in range(steps):  # interleaved: the same drift hits both
        start = time.perf_counter()
        train_step().numpy()
        without_sync.append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step().numpy()
        twins.sync()
        with_sync.append(time.perf_counter() - start)
    ratio = float(np.median(with_sync) / np.median(without_sync))
    rows = [("Adam step time with sync() every step / without", ratio, "<= 1.02x",
             met(ratio, "<= 1.02x"))]
    if measured:
        added = (peak_with - peak_without) / nbytes
        rows.append(("peak memory added by Twins / variable bytes", added, "<= 1.1x",
                     met(added, "<= 1.1x")))
    return {"model": model.name, "batch": batch, "bytes": nbytes,
            "ms": {"Adam step": float(np.median(without_sync)) * 1e3,
                   "Adam step + sync()": float(np.median(with_sync)) * 1e3},
            "ratios": rows}
