"""Twins benchmarks: sync, Polyak sync, training-loop overhead and memory.

Run through `python benchmarks/run.py` (section "twins").

Peak memory added by Twins is measured in fresh child processes (this file
run with the hidden flag --memory-child), one configuration per process,
with glibc's malloc thresholds fixed so that RSS follows live memory; see
`bench_training`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
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


def _rss_bytes(field: str = "VmRSS") -> int:
    """Current (VmRSS) or peak (VmHWM) resident memory of this process (Linux only).

    VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec (a
    child would report its parent's peak) and clear_refs does not reset it.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    """Returns freed heap to the OS, then restarts the peak-RSS count at the current RSS.

    False where /proc/self/clear_refs is not writable (not Linux, or a kernel
    or sandbox that refuses it): VmHWM then still counts from process start.
    """
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def _training_setup(builder, keras, batch: int):
    """(model, Adam(1e-4) tf.function train step, variable bytes): parent and children alike."""
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
    return model, train_step, nbytes


# Fixed glibc malloc thresholds for the memory children. By default glibc
# raises its mmap threshold (up to 32 MiB) each time a freed block was an
# mmap, after which blocks of that size come from the heap and can stay
# resident when freed: RSS then depends on what the process did before, not
# only on what is live. With both thresholds fixed at 128 KiB every large
# buffer (variables, Adam slots, activations, gradients) is its own mmap,
# returned to the OS when freed, and the heap top is trimmed past 128 KiB, so
# RSS follows live memory.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
_HERE = os.path.dirname(os.path.abspath(__file__))


def _spec(fn) -> str:
    """'module:qualname' of a module-level function, for a child process to import."""
    module = fn.__module__
    if module == "__main__":  # e.g. run.py's build_mlp when run.py is the script
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise ValueError(f"{fn.__qualname__} is defined in an interactive __main__; "
                             "give bench_training a function of an importable module.")
        module = os.path.splitext(os.path.basename(main_file))[0]
    if "<" in fn.__qualname__:
        raise ValueError(f"{fn.__qualname__} is not a module-level function: bench_training "
                         "passes the builder and past_factory to child processes by name.")
    return f"{module}:{fn.__qualname__}"


def _resolve(spec: str):
    module, _, qualname = spec.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _memory_child(builder: str, keras_module: str, steps: int, batch: int,
                  past_factory: str) -> None:
    """One memory run in this fresh process; prints one JSON line.

    past_factory is "" for the run without Twins. Both runs are the same up to
    the baseline (3 warm-up steps done, no Twins yet), so the past copy, the
    first sync and everything the synced loop keeps on top count as what Twins
    adds.
    """
    keras = importlib.import_module(keras_module)
    model, train_step, nbytes = _training_setup(_resolve(builder), keras, batch)
    for _ in range(3):
        train_step().numpy()
    reset = _reset_peak_rss()
    baseline = _rss_bytes()
    twins = None
    if past_factory:
        twins = objckpt.Twins(model, past=_resolve(past_factory)(model))
        twins.sync()
    for _ in range(steps):
        train_step().numpy()
        if twins is not None:
            twins.sync()
    print(json.dumps({"peak": _rss_bytes("VmHWM"), "baseline": baseline, "reset": reset,
                      "rss_end": _rss_bytes(), "bytes": nbytes}))


def _memory_runs(builder, keras, steps: int, batch: int, past_factory, rounds: int) -> dict:
    """Runs the children, alternating which goes first; {"with": [...], "without": [...]}."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **_MALLOC_ENV)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(_HERE), _HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    args = [_spec(builder), keras.__name__, str(steps), str(batch)]
    runs = {"with": [], "without": []}
    for r in range(rounds):
        for mode in (("without", "with") if r % 2 == 0 else ("with", "without")):
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--memory-child", *args,
                 _spec(past_factory) if mode == "with" else ""],
                capture_output=True, text=True, env=env, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"memory run {mode} Twins failed:\n{proc.stderr[-3000:]}")
            runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def bench_training(builder, keras, steps: int, batch: int, past_factory=None,
                   memory_rounds: int = 3, memory_steps: int | None = None) -> dict:
    """Adam custom loop: step time with and without a sync every step, and peak memory.

    Step time is measured in this process: `steps` steps without and with a
    `Twins.sync()` after each, interleaved, medians compared.

    Peak memory is measured in fresh child processes, never in this one: a
    long-running process's RSS depends on its history (glibc's dynamic mmap
    threshold keeps freed buffers resident, earlier benchmarks leave heap
    behind). Each child runs one configuration, without Twins or with them,
    under fixed glibc thresholds (MALLOC_MMAP_THRESHOLD_ and
    MALLOC_TRIM_THRESHOLD_ at 128 KiB: freed large buffers go back to the OS,
    RSS follows live memory). It builds the model with `builder` (passed by
    name), Adam(1e-4) and the same train step, runs 3 warm-up steps, then
    takes its RSS as the baseline and resets the peak (VmHWM, through
    /proc/self/clear_refs) at that point, before any Twins exist; the child
    with Twins then makes them (`past_factory(model)`) and syncs once; both
    run `memory_steps` steps (with Twins, a sync after each) and report their
    peak. The figure is (median peak above baseline with Twins - the same
    without) / variable bytes, over `memory_rounds` children of each kind,
    alternating which goes first. Where clear_refs is not writable, the peaks
    are whole-process VmHWM (both children are the same up to the baseline,
    so their difference is still what Twins adds, unless the peak of either
    falls before it). Expected: ~1.0x, as a sync shares buffers and the
    optimizer's copy-on-write of current afterwards leaves one copy held by
    past.

    builder and past_factory must be module-level functions (the children
    import them by name); past_factory(model) makes the past copy, by default
    `objckpt.clone(model)`. memory_steps defaults to min(steps, 4): the peak
    is reached within the first steps after Twins exist.
    """
    past_factory = past_factory or objckpt.clone
    memory_steps = min(steps, 4) if memory_steps is None else memory_steps
    model, train_step, nbytes = _training_setup(builder, keras, batch)
    for _ in range(3):
        train_step().numpy()
    twins = objckpt.Twins(model, past=past_factory(model))
    twins.sync()  # traces sync's function outside the timed loop
    train_step().numpy()
    twins.sync()
    with_sync, without_sync = [], []
    for _ in range(steps):  # interleaved: the same drift hits both
        start = time.perf_counter()
        train_step().numpy()
        without_sync.append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step().numpy()
        twins.sync()
        with_sync.append(time.perf_counter() - start)
    name = model.name
    del twins, model, train_step  # this process's memory is not measured; free it anyway
    ratio = float(np.median(with_sync) / np.median(without_sync))
    rows = [("Adam step time with sync() every step / without", ratio, "<= 1.02x",
             met(ratio, "<= 1.02x"))]
    result = {"model": name, "batch": batch, "bytes": nbytes,
              "ms": {"Adam step": float(np.median(without_sync)) * 1e3,
                     "Adam step + sync()": float(np.median(with_sync)) * 1e3}}
    if memory_rounds > 0:
        runs = _memory_runs(builder, keras, memory_steps, batch, past_factory, memory_rounds)
        reset = all(run["reset"] for mode in runs.values() for run in mode)
        peaks = {mode: float(np.median([run["peak"] - (run["baseline"] if reset else 0)
                                        for run in mode_runs]))
                 for mode, mode_runs in runs.items()}
        added = (peaks["with"] - peaks["without"]) / nbytes
        rows.append(("peak memory added by Twins / variable bytes", added, "<= 1.1x",
                     met(added, "<= 1.1x")))
        result["memory"] = {
            "method": ("peak RSS above the RSS after warm-up (VmHWM reset by clear_refs)"
                       if reset else "whole-process peak RSS (clear_refs not writable)"),
            "median_peak_bytes": peaks, "runs": runs, "steps": memory_steps}
    result["ratios"] = rows
    return result


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--memory-child":
    _memory_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
