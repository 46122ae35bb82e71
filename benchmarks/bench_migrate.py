"""Migration benchmarks: `migrate` and `restore_on_create` against what users write today.

migrate: a name-based (TF1-style) checkpoint of ~1 GB (16 float32 tensors of
4096x4096 by default) into a `tf.Module` with the same variables under other
names, through one rule. The baseline is the hand-written loop
`tf.train.load_checkpoint` -> `variable.assign(reader.get_tensor(name))` ->
`tf.train.Checkpoint(root=model).write(prefix)`. Each run is its own
subprocess (so its peak RSS is its own), alternating which goes first, with
the page cache's dirty pages flushed before each run; figures are medians of
5. Peak RSS is measured above the process's RSS after importing TensorFlow,
and compared with the largest tensor plus the model's bytes.

restore_on_create: an unbuilt Keras MLP (a) given values with
`restore_on_create` then called once, against the same model built by a call
and then restored with `objckpt.restore`; interleaved, fresh models each time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

import objckpt

from timing import met

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = [("^model_001/", "")]


def _rss_bytes(field: str = "VmRSS") -> int:
    """Current (VmRSS) or peak (VmHWM) resident memory of this process.

    VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so a
    child would report its parent's peak.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class _Big(tf.Module):
    def __init__(self, count: int, side: int):
        super().__init__()
        for i in range(count):
            layer = tf.Module()
            layer.kernel = tf.Variable(tf.zeros((side, side)))
            setattr(self, f"layer_{i:02d}", layer)


def write_source(prefix: str, count: int, side: int) -> None:
    """A name-based checkpoint: SaveV2 of `model_001/layer_NN/kernel`, no object graph."""
    names = [f"model_001/layer_{i:02d}/kernel" for i in range(count)]
    rng = np.random.default_rng(0)
    tensors = [tf.constant(rng.standard_normal((side, side), np.float32)) for _ in names]
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=tensors)


def _child(mode: str, source: str, out: str, count: int, side: int) -> None:
    """One measured run in this (fresh) process; prints a JSON line."""
    tf.constant(1.0) + 1.0  # TF initialised: the RSS baseline
    base = _rss_bytes()
    model = _Big(count, side)
    start = time.perf_counter()
    if mode == "migrate":
        objckpt.migrate(model, source, out, rules=RULES, progress=False)
    else:
        reader = tf.train.load_checkpoint(source)
        for i in range(count):
            getattr(model, f"layer_{i:02d}").kernel.assign(
                reader.get_tensor(f"model_001/layer_{i:02d}/kernel"))
        tf.train.Checkpoint(root=model).write(out)
    seconds = time.perf_counter() - start
    peak = _rss_bytes("VmHWM")
    print(json.dumps({"seconds": seconds, "peak_added": peak - base}))


def bench_migrate(count: int = 16, side: int = 4096, rounds: int = 5) -> dict:
    nbytes = count * side * side * 4
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "tf1", "model.ckpt")
        os.makedirs(os.path.dirname(source))
        write_source(source, count, side)
        runs = {"migrate": [], "hand loop": []}
        for r in range(rounds):
            for mode in (("migrate", "hand") if r % 2 == 0 else ("hand", "migrate")):
                out = os.path.join(tmp, f"{mode}-{r}", "ckpt")
                os.sync()  # the previous run's dirty pages are not this run's cost
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                           PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
                proc = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", mode, source, out,
                     str(count), str(side)], capture_output=True, text=True, env=env, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
                runs["migrate" if mode == "migrate" else "hand loop"].append(
                    json.loads(proc.stdout.strip().splitlines()[-1]))
                for name in os.listdir(os.path.dirname(out)):
                    os.remove(os.path.join(os.path.dirname(out), name))
    seconds = {k: float(np.median([r["seconds"] for r in v])) for k, v in runs.items()}
    peaks = {k: float(np.median([r["peak_added"] for r in v])) for k, v in runs.items()}
    largest = side * side * 4
    return {
        "model": f"{count} x float32 ({side}, {side})",
        "bytes": nbytes,
        "ms": {"objckpt.migrate": seconds["migrate"] * 1e3,
               "load_checkpoint -> assign -> Checkpoint.write": seconds["hand loop"] * 1e3},
        "peak_added_bytes": peaks,
        "ratios": [
            _row("migrate throughput / hand-written load+assign+write loop",
                 seconds["hand loop"] / seconds["migrate"], ">= 0.7x"),
            _row("migrate peak RSS added / (largest tensor + model bytes)",
                 peaks["migrate"] / (largest + nbytes), "<= 1.2x"),
            _row("hand loop peak RSS added / (largest tensor + model bytes)",
                 peaks["hand loop"] / (largest + nbytes)),
        ],
    }


def _row(what, value, target=""):
    return (what, value, target, met(value, target) if target else None)


def bench_restore_on_create(keras, rounds: int = 9) -> dict:
    def make():
        return keras.Sequential([keras.layers.Dense(1024, activation="relu") for _ in range(24)])

    x = tf.ones((8, 1024))
    trained = make()
    trained(x)
    parameters = sum(int(np.prod(v.shape)) for v in trained.weights)
    samples = {"restore_on_create + first call": [], "build (first call) + restore": []}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = objckpt.save(trained, os.path.join(tmp, "ckpt"))
        for _ in range(rounds + 1):
            model = make()
            start = time.perf_counter()
            pending = objckpt.restore_on_create(model, prefix)
            model(x)
            samples["restore_on_create + first call"].append(time.perf_counter() - start)
            assert pending.done
            model = make()
            start = time.perf_counter()
            model(x)
            objckpt.restore(model, prefix)
            samples["build (first call) + restore"].append(time.perf_counter() - start)
    times = {k: float(np.median(v[1:])) * 1e3 for k, v in samples.items()}
    return {
        "model": f"unbuilt MLP, 24 x Dense(1024), {parameters / 1e6:.1f}M parameters",
        "ms": times,
        "ratios": [_row("restore_on_create + first call / build + restore",
                        times["restore_on_create + first call"]
                        / times["build (first call) + restore"], "<= 1.2x")],
    }


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
