"""Benchmark of the command line: `objckpt inspect`, `graph` and `diff` as fresh processes.

A user runs `objckpt inspect ckpt` in a shell: what counts is the wall time of a new Python
process, start-up included. These commands read checkpoints without importing TensorFlow;
the baseline is `python -c "import tensorflow"`, the least any TF-based tool pays before it
reads a byte. Targets (issue 19): inspect of a 1,000-variable checkpoint in <= 1.5 s, and
<= 0.1x the time of importing TensorFlow on the same machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import objckpt

from bench_untrusted import build_dense_stack
from timing import met

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wall(argv: list[str]) -> float:
    """Seconds of one fresh process, from start to exit (its output discarded)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, check=False)
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1):  # diff exits 1 when the checkpoints differ
        raise RuntimeError(f"{argv} failed: {result.stderr.decode(errors='replace')[-500:]}")
    return seconds


def bench_cli(keras, repeats: int = 5) -> dict:
    """Median wall seconds (as ms) of each command and of `import tensorflow`, interleaved."""
    workdir = tempfile.mkdtemp(prefix="objckpt-bench-cli-")
    model = build_dense_stack(keras)
    a = objckpt.save(model, os.path.join(workdir, "a"))
    kernel = model.layers[1].kernel
    kernel.assign(np.asarray(kernel) + 1.0)
    b = objckpt.save(model, os.path.join(workdir, "b"))
    commands = {
        "objckpt inspect": ["-m", "objckpt", "inspect", a],
        "objckpt inspect --format json": ["-m", "objckpt", "inspect", a, "--format", "json"],
        "objckpt graph (DOT)": ["-m", "objckpt", "graph", a],
        "objckpt diff": ["-m", "objckpt", "diff", a, b],
        "python -c 'import tensorflow'": ["-c", "import tensorflow"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    _wall(commands["objckpt inspect"])  # warm the page cache and bytecode caches
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            times[name].append(_wall(commands[name]))
    ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
    tf_ms = ms["python -c 'import tensorflow'"]
    rows = []
    for name in names[:-1]:
        seconds = ms[name] / 1000
        rows.append((f"{name}: wall seconds", seconds, "<= 1.5 s", met(seconds, "<= 1.5")))
        rows.append((f"{name} / import tensorflow", ms[name] / tf_ms, "<= 0.1x",
                     met(ms[name] / tf_ms, "<= 0.1")))
    return {"model": f"{model.name}: {len(objckpt.tree(model))} variables, fresh processes, "
                     f"median of {repeats}", "ms": ms, "ratios": rows}
