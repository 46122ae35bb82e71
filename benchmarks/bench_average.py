"""Averaging checkpoints: `objckpt.average` and the model-free writer against what users write.

Run through `python benchmarks/run.py --section average [--average-size-mib 512]`, or alone:
`python benchmarks/bench_average.py [--size-mib 512] [--rounds 3]`.

Sources: 8 object-based checkpoints (written by `objckpt.save`) of one Keras-free `tf.Module`
whose attribute `v` lists 8 float32 variables of equal size (512 MiB: 8 x 4096x4096, 64 MiB
each), each checkpoint with other random values.

Operations, each in a fresh child process (TensorFlow imported and, where there is one, the
model created before the clock starts), interleaved round by round (the order reversed every
other round), the first round a warm-up that also fills the page cache; each figure is the
median over the other rounds:

- `objckpt.average(obj, 8 prefixes)`: plans every source, then reads every byte once, one
  variable at a time, a window of every source at a time (checksums extended as read, the
  next window read ahead by a thread) added in float64, each variable's old value written
  to the undo log (an anonymous temporary file) before its mean is assigned;
- `objckpt.average_checkpoints(8 prefixes, out)`: the model-free writer (what `objckpt
  average` runs), without TensorFlow; writes the averaged checkpoint;
- the way users write it: `tf.train.load_checkpoint(prefix).get_tensor(name)` of every
  variable of all 8 checkpoints into NumPy, then `np.mean` over the 8 of each variable and
  `assign` into obj;
- the limit: plain reads of the 8 data files (`readinto` one preallocated buffer).

Peak memory: a thread samples the child's RssAnon in /proc/self/status every ~1 ms during
the operation (`bench_io`'s sampler); the figure is the peak above the RssAnon just before it
(the model's own variables are in that baseline), over the largest tensor's bytes.
Targets: time <= 1.25x the plain read; memory beyond the model <= 4x the largest tensor.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from timing import print_result

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
COUNT = 8  # checkpoints
VARIABLES = 8  # per checkpoint
TIME_TARGET = 1.25
MEMORY_TARGET = 4.0

OPS = {
    "average": "objckpt.average(obj, 8 prefixes)",
    "writer": "objckpt.average_checkpoints(8 prefixes, out), no model, no TF",
    "numpy": "load_checkpoint + get_tensor of all 8 into NumPy, np.mean, assign",
    "plain": "plain read of the 8 data files (the limit)",
}


def shape_of(size_mib: float) -> tuple[int, int]:
    elements = max(1, int(size_mib * MIB) // 4 // VARIABLES)
    columns = 4096 if elements >= 4096 else elements
    return elements // columns, columns


def build(size_mib: float, seed: int | None = None):
    import numpy as np
    import tensorflow as tf

    shape = shape_of(size_mib)
    module = tf.Module()
    if seed is None:
        module.v = [tf.Variable(tf.zeros(shape)) for _ in range(VARIABLES)]
    else:
        rng = np.random.default_rng(seed)
        module.v = [tf.Variable(rng.standard_normal(shape, dtype=np.float32))
                    for _ in range(VARIABLES)]
    return module


def write_sources(size_mib: float, work: str) -> list[str]:
    import objckpt

    prefixes = []
    for k in range(COUNT):
        module = build(size_mib, seed=k)
        prefixes.append(objckpt.save(module, os.path.join(work, f"ckpt-{k}")))
        del module
        gc.collect()
    return prefixes


# --- children ---------------------------------------------------------------------------

def _child(task: dict) -> dict:
    from bench_io import _Sampler, _status_kb

    op, prefixes, size = task["op"], task["prefixes"], task["size"]
    obj = None
    if op in ("average", "numpy"):
        import tensorflow as tf  # noqa: F401 (imported before the clock, as by users)

        import objckpt

        obj = build(size)
        # warm up the code paths on a small module (imports, first calls)
        tiny, tiny_prefix = build(1 / 64), task["tiny"]
        from objckpt._ops import average as _average

        held, _average.HELD_BYTES = _average.HELD_BYTES, 0  # the streamed path, as timed
        objckpt.average(tiny, [tiny_prefix, tiny_prefix])
        _average.HELD_BYTES = held
    elif op == "writer":
        from objckpt._ops import averaging as _averaging

        warm = os.path.join(task["out"] + "-warm", "ckpt")
        _averaging.average_checkpoints([task["tiny"]] * 2, warm)  # code paths loaded once

    gc.collect()

    def run_average():
        import objckpt

        objckpt.average(obj, prefixes)

    def run_writer():
        _averaging.average_checkpoints(prefixes, task["out"])

    def run_numpy():
        import numpy as np
        import tensorflow as tf

        loaded = []
        for prefix in prefixes:
            reader = tf.train.load_checkpoint(prefix)
            names = [n for n, _ in tf.train.list_variables(prefix)
                     if n.startswith("v/") and n.endswith("VARIABLE_VALUE")]
            loaded.append({n: reader.get_tensor(n) for n in names})
        for i, variable in enumerate(obj.v):
            name = f"v/{i}/.ATTRIBUTES/VARIABLE_VALUE"
            variable.assign(np.mean([d[name] for d in loaded], axis=0))

    def run_plain():
        size_bytes = max(os.path.getsize(p + ".data-00000-of-00001") for p in prefixes)
        buffer = bytearray(size_bytes)
        view = memoryview(buffer)
        for prefix in prefixes:
            with open(prefix + ".data-00000-of-00001", "rb", buffering=0) as f:
                got = 0
                while got < size_bytes:
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n

    fd = os.open("/proc/self/status", os.O_RDONLY)
    sys.setswitchinterval(0.0005)
    sampler = _Sampler()
    sampler.start()
    start = time.perf_counter()
    {"average": run_average, "writer": run_writer, "numpy": run_numpy, "plain": run_plain}[op]()
    seconds = time.perf_counter() - start
    sampler.finish()
    got = {"seconds": seconds, "anon_added": (sampler.peak - sampler.baseline) * 1024,
           "samples": sampler.samples, "rss": _status_kb(b"VmRSS:", fd) * 1024}
    if task.get("check") and op in ("average", "writer"):
        got["max_ulps"] = _check(task, obj)
    return got


def _check(task: dict, obj) -> int:
    """The largest distance in float32 units in the last place of the first variable from
    the float64 NumPy mean (untimed)."""
    import numpy as np
    import tensorflow as tf

    name = "v/0/.ATTRIBUTES/VARIABLE_VALUE"
    total = None
    for prefix in task["prefixes"]:
        value = tf.train.load_checkpoint(prefix).get_tensor(name).astype(np.float64)
        total = value if total is None else total + value
    want = (total / len(task["prefixes"])).astype(np.float32)
    have = (obj.v[0].numpy() if obj is not None
            else tf.train.load_checkpoint(task["out"]).get_tensor(name))
    return int(np.max(np.abs(have.view(np.int32).astype(np.int64)
                             - want.view(np.int32).astype(np.int64))))


def _run_child(task: dict) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                           json.dumps(task)], capture_output=True, text=True, timeout=1800,
                          check=False, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench_average child {task['op']} failed (exit "
                           f"{proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# --- the benchmark ----------------------------------------------------------------------

def bench_average(size_mib: float, rounds: int = 3) -> dict:
    import numpy as np

    work = tempfile.mkdtemp(prefix="objckpt-bench-average-")
    try:
        start = time.perf_counter()
        prefixes = write_sources(size_mib, work)
        written = time.perf_counter() - start
        import objckpt

        tiny = objckpt.save(build(1 / 64, seed=0), os.path.join(work, "tiny", "ckpt"))
        largest = shape_of(size_mib)[0] * shape_of(size_mib)[1] * 4
        samples = {name: [] for name in OPS}
        memory = {name: [] for name in OPS}
        ulps = []
        order = list(OPS)
        for r in range(rounds + 1):  # round 0: warm-up (page cache, bytecode)
            for op in (order if r % 2 == 0 else order[::-1]):
                out = os.path.join(work, f"out-{op}-{r}", "ckpt")
                got = _run_child({"op": op, "prefixes": prefixes, "size": size_mib,
                                  "out": out, "check": r == 1, "tiny": tiny})
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)
                if "max_ulps" in got:
                    ulps.append(got["max_ulps"])
                if r:
                    samples[op].append(got["seconds"])
                    memory[op].append(got["anon_added"])
        seconds = {OPS[k]: float(np.median(v)) for k, v in samples.items()}
        spread = {OPS[k]: [min(v), max(v)] for k, v in samples.items()}
        limit = np.array(samples["plain"])
        rows = []
        for key, target in (("average", f"<= {TIME_TARGET}x"), ("writer", "")):
            per_round = np.array(samples[key]) / limit
            ratio = float(np.median(per_round))
            rows.append((f"{OPS[key].split(',')[0].split('(')[0]} time / plain read of the "
                         "8 files", ratio, target,
                         (ratio <= TIME_TARGET) if target else None,
                         [float(per_round.min()), float(per_round.max())]))
        per_round = np.array(samples["numpy"]) / np.array(samples["average"])
        rows.append(("objckpt.average vs NumPy read-all-then-average (speed-up)",
                     float(np.median(per_round)), "", None,
                     [float(per_round.min()), float(per_round.max())]))
        for key, target in (("average", f"<= {MEMORY_TARGET:g}x"),
                            ("writer", f"<= {MEMORY_TARGET:g}x"), ("numpy", "")):
            peak = max(memory[key]) / largest
            rows.append((f"{OPS[key].split(',')[0].split('(')[0].strip()}: peak RssAnon "
                         "added / largest tensor", peak, target,
                         (peak <= MEMORY_TARGET) if target else None,
                         [min(memory[key]) / largest, peak]))
        notes = [f"largest tensor {largest / MIB:.0f} MiB; model {VARIABLES * largest / MIB:.0f}"
                 f" MiB; {COUNT} checkpoints of it ({COUNT * VARIABLES * largest / 2**30:.2f} "
                 f"GiB) written in {written:.0f} s",
                 *[f"{OPS[k]}: peak RssAnon added {max(v) / MIB:.0f} MiB (max over rounds)"
                   for k, v in memory.items()],
                 f"values checked in round 1: the first variable within {max(ulps)} float32 "
                 "ulp(s) of the float64 NumPy mean (objckpt.average and the writer)"]
        shape = shape_of(size_mib)
        return {"model": f"{COUNT} checkpoints of a tf.Module of {VARIABLES} float32 "
                         f"{shape[0]}x{shape[1]} variables, {VARIABLES * largest / MIB:.0f} "
                         f"MiB each; {rounds} rounds after a warm-up, one child process per "
                         "operation",
                "s": seconds, "spread": spread, "ratios": rows, "notes": notes,
                "size_mib": size_mib}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=float, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_result(bench_average(args.size_mib, args.rounds))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(json.loads(sys.argv[2]))))
    else:
        sys.exit(main())
