"""Ensemble and Freezer benchmarks against what users write today.

ensemble: 8 small Keras MLPs (32 -> 64 -> 64 -> 10, ReLU), batch 64.
`ensemble(x)` (batched over stacked weights) against the members called one
after the other in a Python loop (eager Keras calls, what users write), the
same loop over members each wrapped in its own `tf.function`, and
objckpt's own fallback (all members in one traced function).

load_ensemble: the same 8 MLPs saved as 8 object-based prefixes, loaded by
`load_ensemble(template, prefixes)` (clones + restores) against 8 plain
`tf.train.Checkpoint(root=m).read(prefix).assert_consumed()` into 8 models
built beforehand (model building not timed).

freezer: one Adam training step in a `tf.function`, `optimizer.apply_gradients`
against `Freezer.apply_gradients` with nothing frozen and with half the
variables frozen, on (s) the small MLP at batch 64, (a) the ~25M-parameter
MLP and (b) the ~500-variable model of the foundation benchmarks. Its ratios
are medians of the ratios within each round (see `timing.paired_ratio`), over
at least 101 rounds where a step takes less than 0.1 s.
"""

from __future__ import annotations

import os
import re
import tempfile
import time

import numpy as np
import tensorflow as tf

import objckpt

from timing import met, paired_ratio, time_ops

MEMBERS = 8


def small_mlp(keras, seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)], name=f"mlp_{seed}")


def bench_ensemble(keras, repeats: int) -> dict:
    members = [small_mlp(keras, seed) for seed in range(MEMBERS)]
    ensemble = objckpt.load_ensemble(small_mlp(keras, 99), [objckpt.snapshot(m) for m in members])
    x = tf.random.stateless_normal((64, 32), seed=(1, 2))
    traced = [tf.function(lambda t, m=m: m(t, training=False)) for m in members]
    batched = ensemble(x, mode="batched").numpy()
    assert ensemble.last_mode == "batched"
    np.testing.assert_allclose(batched, np.stack([m(x, training=False) for m in members]),
                               rtol=1e-5, atol=1e-5)
    ms = time_ops({
        "ensemble(x), batched": lambda: ensemble(x, mode="batched"),
        "ensemble(x), mode='loop' (one traced function)": lambda: ensemble(x, mode="loop"),
        "Python loop of eager member calls + stack": lambda: tf.stack(
            [m(x, training=False) for m in members]),
        "Python loop of tf.function members + stack": lambda: tf.stack([f(x) for f in traced]),
    }, repeats)
    b = ms["ensemble(x), batched"]
    ratio = ms["Python loop of eager member calls + stack"] / b
    rows = [
        ("batched vs Python loop of eager member calls", ratio, ">= 3x", met(ratio, ">= 3x")),
        ("batched vs Python loop of tf.function members",
         ms["Python loop of tf.function members + stack"] / b, "", None),
        ("batched vs all members in one traced function (mode='loop')",
         ms["ensemble(x), mode='loop' (one traced function)"] / b, "", None),
    ]
    return {"model": f"{MEMBERS} x MLP 32-64-64-10, batch 64", "ms": ms, "ratios": rows}


def bench_load(keras, repeats: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="objckpt-bench-ensemble-")
    members = [small_mlp(keras, seed) for seed in range(MEMBERS)]
    prefixes = [objckpt.save(m, os.path.join(workdir, f"m{k}", "ckpt"))
                for k, m in enumerate(members)]
    template = small_mlp(keras, 99)
    prebuilt = [small_mlp(keras, 100 + k) for k in range(MEMBERS)]

    def plain():
        for model, prefix in zip(prebuilt, prefixes):
            tf.train.Checkpoint(root=model).read(prefix).assert_consumed()

    def objckpt_restores():
        for model, prefix in zip(prebuilt, prefixes):
            objckpt.restore(model, prefix)

    ms = time_ops({
        f"load_ensemble(template, {MEMBERS} prefixes)":
            lambda: objckpt.load_ensemble(template, prefixes),
        f"{MEMBERS} x tf.train.Checkpoint.read+assert_consumed (prebuilt)": plain,
        f"{MEMBERS} x objckpt.restore (prebuilt)": objckpt_restores,
    }, repeats)
    ratio = (ms[f"load_ensemble(template, {MEMBERS} prefixes)"]
             / ms[f"{MEMBERS} x tf.train.Checkpoint.read+assert_consumed (prebuilt)"])
    rows = [(f"load_ensemble time / {MEMBERS} plain restores into prebuilt models", ratio,
             "<= 1.2x", met(ratio, "<= 1.2x"))]
    return {"model": f"{MEMBERS} x MLP 32-64-64-10 prefixes", "ms": ms, "ratios": rows}


def bench_freezer(name: str, model, keras, batch: int, repeats: int) -> dict:
    optimizer = keras.optimizers.Adam(1e-4)
    variables = model.trainable_variables
    width = model.inputs[0].shape[-1]
    x = tf.random.stateless_normal((batch, width), seed=(3, 4))
    y = tf.random.stateless_normal((batch, model.outputs[0].shape[-1]), seed=(5, 6))

    def make(freezer):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, variables)
            if freezer is not None:
                freezer.apply_gradients(optimizer, zip(grads, variables))
            else:
                optimizer.apply_gradients(zip(grads, variables))
            return loss

        return step

    # Two Freezers on the same model, each with its own traced step: one with nothing
    # frozen, one with the first half of the variables frozen (set once, not per step).
    none, half = objckpt.Freezer(model), objckpt.Freezer(model)
    count = len(half.paths) // 2
    half.set_frozen(["^(" + "|".join(re.escape(p) for p in half.paths[:count]) + ")$"])
    assert len(half.frozen) == count
    steps = {"step, optimizer.apply_gradients": make(None),
             "step, freezer.apply_gradients, nothing frozen": make(none),
             f"step, freezer.apply_gradients, {count} of {len(half.paths)} frozen": make(half)}
    samples: dict = {}
    # Steps of a few ms: more rounds cost little and steady the per-round ratios.
    for _ in range(2):  # the first calls trace
        steps["step, optimizer.apply_gradients"]()
    start = time.perf_counter()
    steps["step, optimizer.apply_gradients"]()
    fast = time.perf_counter() - start < 0.1
    ms = time_ops(steps, max(repeats, 101) if fast else repeats, samples)
    # Medians of per-round ratios: the targets are a few percent, about the drift of
    # this machine between rounds.
    base = "step, optimizer.apply_gradients"
    nothing = paired_ratio(samples, "step, freezer.apply_gradients, nothing frozen", base)
    halved = paired_ratio(
        samples, f"step, freezer.apply_gradients, {count} of {len(half.paths)} frozen", base)
    rows = [("step time with Freezer (nothing frozen) / without", nothing, "<= 1.05x",
             met(nothing, "<= 1.05x")),
            ("step time with Freezer (half frozen) / without", halved, "<= 1.05x",
             met(halved, "<= 1.05x"))]
    return {"model": f"{name}, {len(none.paths)} variables, batch {batch}", "ms": ms,
            "ratios": rows}
