"""Checkpoint I/O benchmarks (issue 20): save, durable save, restore, first restore, peak
memory and async save of large models, against `tf.train.Checkpoint` and plain file I/O.

Run through `python benchmarks/run.py --section io [--repeats N] [--io-sizes 1024,100]`, or
alone: `python benchmarks/bench_io.py [--repeats N] [--io-sizes 1024,100]`.

Models: Keras-free `tf.Module`s whose attribute `v` lists float32 `tf.Variable`s of random
values, one per size in MiB given by --io-sizes: 16 equal variables from 512 MiB up (1024:
16 x 4096x4096, 1 GiB), 25 below (100: 25 x 1024x1024). `tf.train.Checkpoint(v=list)` has
the same checkpoint keys, so each reads what the other writes.

Timings are interleaved round by round (the order reversed every other round), the first
round dropped as a warm-up; each figure is the median over rounds with its min and max, and
each ratio is the median of the per-round ratios (a pair in the same round sees the same
machine state), with their min and max. Writes: every method writes to a fresh path each
round; the previous round's files are deleted and `os.sync()` runs before each timed write,
outside the timed region (otherwise one method pays for the writeback of another's dirty
pages). Plain file I/O is the physical limit: writing the same bytes with one `f.write` per
variable, from a view of its buffer (`np.asarray(v.value())`, no copy), into a new file (no
fsync; also reported: from `np.asarray(v)`, which copies each buffer first), and reading
them back with one `f.read` per tensor (fresh memory) or `readinto` a preallocated buffer.
Reads come from the page cache (all files were just written).

First restore: in a fresh child process (TensorFlow imported, the model created), the time
of the first `objckpt.restore(obj, prefix)` and of the first
`tf.train.Checkpoint(v=list).read(prefix).assert_consumed()`: 3 children each, alternating,
median.

Peak memory: one child per operation. A thread samples the child's RssAnon in
/proc/self/status every ~1 ms during the operation; the figure is the peak above the
RssAnon just before it (the model's own variables are in that baseline), over the model's
bytes. The kernel's own peak-RSS counter (VmHWM in /proc/self/status, reset to the current
RSS just before the operation through /proc/self/clear_refs) is reported too: getrusage's
ru_maxrss is not usable in a child, Linux carries it over from the parent across exec.
Target (issue 20): peak <= the model + the largest tensor + 20% of the model, i.e. added
<= largest tensor + 0.2 x model.

Async save (on the smallest size): a Keras-free training loop, each step two matmuls per
variable and an in-place update of every variable (batch calibrated for a 20-50 ms step),
40 steps per epoch. Timed per round: an epoch without saving; an epoch with one
`objckpt.save(obj, prefix, blocking=False)` before step 10 and its `.result()` awaited
after the last step (counted); a synchronous `objckpt.save(obj, prefix)`. Both saves
durable=False. Time blocked is the time `save(..., blocking=False)` took to return.
At least 7 rounds.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
EPOCH_STEPS = 40
ASYNC_SAVE_AT = 10
FIRST_RESTORE_RUNS = 3


# --- models --------------------------------------------------------------------


def layout(size_mib: float) -> tuple[int, tuple[int, int]]:
    """(count, shape) of the float32 variables of a model of `size_mib` MiB."""
    count = 16 if size_mib >= 512 else 25
    elements = max(1, int(size_mib * MIB) // 4 // count)
    side = math.isqrt(elements)
    if side * side == elements:
        return count, (side, side)
    cols = min(1024, elements)
    return count, (elements // cols, cols)


def build(size_mib: float, fill: str = "random", seed: int = 0):
    """A tf.Module whose `v` lists the variables; random values or zeros."""
    import numpy as np
    import tensorflow as tf

    count, shape = layout(size_mib)
    rng = np.random.default_rng(seed)
    variables = []
    for _ in range(count):
        if fill == "random":
            variables.append(tf.Variable(rng.random(shape, dtype=np.float32)))
        else:
            variables.append(tf.Variable(tf.zeros(shape)))
    obj = tf.Module()
    obj.v = variables
    return obj, variables


def model_bytes(size_mib: float) -> tuple[int, int]:
    """(total bytes, largest tensor's bytes) of the model of `size_mib` MiB."""
    count, shape = layout(size_mib)
    one = shape[0] * shape[1] * 4
    return count * one, one


def describe(size_mib: float) -> str:
    count, shape = layout(size_mib)
    total, _ = model_bytes(size_mib)
    return (f"tf.Module, {count} float32 variables of {shape[0]}x{shape[1]}, "
            f"{total / MIB:.0f} MiB ({total / 1e6:.0f} MB)")


def api() -> dict:
    """Which of issue 20's keyword arguments this objckpt's `save` takes."""
    import objckpt

    params = inspect.signature(objckpt.save).parameters
    return {"durable": "durable" in params, "blocking": "blocking" in params}


def save_kwargs(**kwargs) -> dict:
    have = api()
    return {k: v for k, v in kwargs.items() if have.get(k)}


# --- timing --------------------------------------------------------------------


def interleaved(ops: dict, repeats: int) -> dict:
    """Per-round seconds of each op, rounds interleaved, the first round dropped.

    `ops` maps a name to `fn` or `(setup, fn)`; `setup` runs before each timed call,
    outside the timed region. `fn` may return a dict of extra per-round seconds
    (name -> seconds), kept under those names.
    """
    names = list(ops)
    samples: dict = {name: [] for name in names}
    for round_ in range(repeats + 1):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            op = ops[name]
            setup, fn = op if isinstance(op, tuple) else (None, op)
            if setup is not None:
                setup()
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                extra = fn()
                elapsed = time.perf_counter() - start
            finally:
                gc.enable()
            if round_ == 0:
                continue  # warm-up
            samples[name].append(elapsed)
            for key, seconds in (extra if isinstance(extra, dict) else {}).items():
                samples.setdefault(key, []).append(seconds)
    return samples


def summarize(samples: dict) -> tuple[dict, dict]:
    """(median ms, [min ms, max ms]) per name."""
    import numpy as np

    ms = {name: float(np.median(s)) * 1e3 for name, s in samples.items()}
    spread = {name: [min(s) * 1e3, max(s) * 1e3] for name, s in samples.items()}
    return ms, spread


def ratio_row(samples: dict, what: str, num: str, den: str, target: str = "") -> tuple:
    """(what, median of per-round num/den, target, met, [min, max])."""
    import numpy as np

    from timing import met

    if num not in samples or den not in samples:
        return None
    per_round = np.array(samples[num]) / np.array(samples[den])
    value = float(np.median(per_round))
    return (what, value, target, met(value, target) if target else None,
            [float(per_round.min()), float(per_round.max())])


def _rows(*rows) -> list:
    return [row for row in rows if row is not None]


def print_result(result: dict) -> None:
    unit = "ms" if "ms" in result else "MiB"
    values, spread = result.get("ms") or result["mib"], result.get("spread", {})
    print(f"  {'operation':<66} {'median ' + unit:>11} {'min':>10} {'max':>10}")
    for name, value in values.items():
        lo, hi = spread.get(name, (None, None))
        bounds = f"{lo:>10.1f} {hi:>10.1f}" if lo is not None else ""
        print(f"  {name:<66} {value:>11.1f} {bounds}")
    print(f"  {'ratio':<66} {'value':>8} {'[min .. max]':>17}  {'target':<9} met")
    for what, value, target, ok, *rest in result["ratios"]:
        mark = "" if ok is None else ("yes" if ok else "NO")
        span = f"[{rest[0][0]:.2f} .. {rest[0][1]:.2f}]" if rest and rest[0] else ""
        print(f"  {what:<66} {value:>8.3f} {span:>17}  {target:<9} {mark}")
    for note in result.get("notes", []):
        print(f"  note: {note}")


# --- in-process phases -----------------------------------------------------------


def _remove(directory: str) -> None:
    _track_disk()  # what the run has on disk at its largest: just before a removal
    shutil.rmtree(directory, ignore_errors=True)


def _fresh_dir(directory: str) -> None:
    _remove(directory)
    os.makedirs(directory)
    os.sync()  # the previous write's dirty pages go to disk here, not in the next timing


def plain_write(variables, path: str, copy: bool = False) -> None:
    """The variables' bytes into a new file, one write each: from a view of each variable's
    buffer (`np.asarray(v.value())` shares it), or with `copy` from `np.asarray(v)` (which
    copies the buffer first, ~0.1 s per GiB)."""
    import numpy as np

    with open(path, "wb") as f:
        for v in variables:
            f.write(memoryview(np.asarray(v) if copy else np.asarray(v.value())))


def bench_save(obj, variables, size_mib: float, work: str, repeats: int) -> dict:
    import tensorflow as tf

    import objckpt

    scratch = os.path.join(work, "save")
    counter = itertools.count()
    state = {}

    def setup():
        _fresh_dir(scratch)
        state["path"] = os.path.join(scratch, f"ck{next(counter)}")

    ours = "objckpt.save(obj, prefix, durable=False)"
    durable = "objckpt.save(obj, prefix, durable=True)"
    tf_write = "tf.train.Checkpoint(v=list).write(prefix)"
    plain = "plain file write of the same bytes (no fsync)"
    plain_copy = "plain file write of np.asarray(v) (a copy of each first)"
    ops = {ours: (setup, lambda: objckpt.save(obj, state["path"], **save_kwargs(durable=False)))}
    notes = []
    if api()["durable"]:
        ops[durable] = (setup, lambda: objckpt.save(obj, state["path"], durable=True))
    else:
        notes.append("objckpt.save has no durable= yet: durable mode not measured")
    ops[tf_write] = (setup, lambda: tf.train.Checkpoint(v=variables).write(state["path"]))
    ops[plain] = (setup, lambda: plain_write(variables, state["path"]))
    ops[plain_copy] = (setup, lambda: plain_write(variables, state["path"], copy=True))
    samples = interleaved(ops, repeats)
    _remove(scratch)
    ms, spread = summarize(samples)
    rows = _rows(
        ratio_row(samples, "objckpt.save vs tf.train.Checkpoint.write", tf_write, ours,
                  ">= 2x"),
        ratio_row(samples, "objckpt.save time / plain file write", ours, plain, "<= 1.3x"),
        ratio_row(samples, "objckpt.save time / plain write of np.asarray(v) copies", ours,
                  plain_copy),
        ratio_row(samples, "tf.train.Checkpoint.write time / plain file write", tf_write, plain),
        ratio_row(samples, "durable save time / durable=False (default durable iff <= 1.15x)",
                  durable, ours, "<= 1.15x"))
    return {"model": describe(size_mib), "bytes": model_bytes(size_mib)[0], "ms": ms,
            "spread": spread, "ratios": rows, "notes": notes}


def write_sources(obj, variables, work: str) -> dict:
    """The checkpoints and plain file the restores read: objckpt's, tf's, plain bytes."""
    import tensorflow as tf

    import objckpt

    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    paths = {"ours": objckpt.save(obj, os.path.join(src, "ours", "ck"),
                                  **save_kwargs(durable=False)),
             "tf": tf.train.Checkpoint(v=variables).write(os.path.join(src, "tf", "ck")),
             "plain": os.path.join(src, "plain.bin")}
    plain_write(variables, paths["plain"])
    os.sync()
    return paths


def bench_restore(obj, variables, size_mib: float, paths: dict, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf

    import objckpt

    # The restore must land the saved values.
    expected = [variables[0].numpy(), variables[-1].numpy()]
    for v in (variables[0], variables[-1]):
        v.assign(tf.zeros_like(v))
    objckpt.restore(obj, paths["ours"])
    for v, want in zip((variables[0], variables[-1]), expected):
        np.testing.assert_array_equal(v.numpy(), want)
    del expected

    sizes = [int(np.prod(v.shape)) * v.dtype.size for v in variables]
    total = sum(sizes)
    held = {"view": memoryview(np.zeros(total, np.uint8))}  # touched: reads land in RAM

    def fresh_reads():
        with open(paths["plain"], "rb") as f:
            chunks = [f.read(n) for n in sizes]
        assert sum(map(len, chunks)) == total

    def read_into():
        offset, view = 0, held["view"]
        with open(paths["plain"], "rb", buffering=0) as f:
            for n in sizes:
                got = f.readinto(view[offset:offset + n])
                assert got == n, (got, n)
                offset += n

    from objckpt._bundle import fastio as _fastio

    crc = _fastio.native_crc32c()
    workers = _fastio.threads()

    def checked_floor():
        """What any restore that checks every checksum before it writes a variable must do
        at least: read every byte once to checksum it (TF's crc32c, `workers` threads, each
        through a small buffer it reuses), then once more into memory (readinto, `workers`
        threads)."""
        import concurrent.futures

        step = -(-total // workers)
        spans = [(lo, min(total, lo + step)) for lo in range(0, total, step)]
        fd = os.open(paths["plain"], os.O_RDONLY)

        def check(span):
            buffer = np.empty(1 << 20, np.uint8)
            view, value = memoryview(buffer), 0
            for at in range(span[0], span[1], 1 << 20):
                got = os.preadv(fd, [view[:min(1 << 20, span[1] - at)]], at)
                value = crc.extend(buffer.ctypes.data, got, value)
            return value

        def read(span):
            view = held["view"]
            at = span[0]
            while at < span[1]:
                at += os.preadv(fd, [view[at:span[1]]], at)

        try:
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                list(pool.map(check, spans))
                list(pool.map(read, spans))
        finally:
            os.close(fd)

    ours = "objckpt.restore(obj, prefix)"
    tf_read = "tf.train.Checkpoint(v=list).read(prefix).assert_consumed()"
    ours_tf = "objckpt.restore(obj, tf's prefix)"
    tf_tf = "tf.train.Checkpoint(v=list).read(tf's prefix).assert_consumed()"
    fresh = "plain f.read per tensor into fresh memory"
    into = "plain readinto a preallocated buffer (physical limit)"
    ops = {ours: lambda: objckpt.restore(obj, paths["ours"]),
           tf_read: lambda: tf.train.Checkpoint(v=variables).read(paths["ours"])
           .assert_consumed(),
           ours_tf: lambda: objckpt.restore(obj, paths["tf"]),
           tf_tf: lambda: tf.train.Checkpoint(v=variables).read(paths["tf"]).assert_consumed(),
           fresh: fresh_reads,
           into: read_into}
    floor = f"floor: crc32c of every byte, then readinto ({workers} threads)"
    if crc is not None:
        ops[floor] = checked_floor
    samples = interleaved(ops, repeats)
    held.pop("view").release()
    ms, spread = summarize(samples)
    rows = _rows(
        ratio_row(samples, "objckpt.restore vs tf.train.Checkpoint.read+assert_consumed",
                  tf_read, ours, ">= 1.8x"),
        ratio_row(samples, "objckpt.restore time / plain reads into fresh memory", ours, fresh,
                  "<= 1.3x"),
        ratio_row(samples, "objckpt.restore time / plain readinto (physical limit)", ours, into),
        ratio_row(samples, "objckpt.restore time / floor of a checked restore", ours, floor),
        ratio_row(samples, "tf.train.Checkpoint.read vs the floor of a checked restore",
                  tf_read, floor),
        ratio_row(samples, "tf.train.Checkpoint.read of tf's own write vs objckpt.restore",
                  tf_tf, ours),
        ratio_row(samples, "on tf's prefix: tf.train.Checkpoint.read vs objckpt.restore",
                  tf_tf, ours_tf))
    return {"model": describe(size_mib) + "; objckpt's checkpoint unless marked tf's",
            "bytes": total, "ms": ms, "spread": spread, "ratios": rows}


# --- child processes ---------------------------------------------------------------


def _child_env() -> dict:
    """The environment of child processes: Python's bytecode cached (in the run's work
    folder, not the source tree) even where PYTHONDONTWRITEBYTECODE is set, as for an
    installed package, whose modules pip compiled: a first call then pays for what the
    library does, not for compiling its source."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if _RUN_PEAKS["work"]:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(_RUN_PEAKS["work"], "pycache")
    return env


def _run_child(task: dict) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                           json.dumps(task)],
                          capture_output=True, text=True, timeout=900, check=False,
                          env=_child_env())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench_io child {task} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    got = json.loads(lines[-1])
    _RUN_PEAKS["child"] = max(_RUN_PEAKS["child"], got.get("vmhwm", 0))
    return got


def _status_kb(field: bytes, fd: int) -> int:
    data = os.pread(fd, 8192, 0)
    start = data.index(field) + len(field)
    return int(data[start:data.index(b"kB", start)])


class _Sampler(threading.Thread):
    """Peak RssAnon of this process, sampled every ~1 ms while running."""

    def __init__(self):
        super().__init__(daemon=True)
        self.fd = os.open("/proc/self/status", os.O_RDONLY)
        self.baseline = self.peak = _status_kb(b"RssAnon:", self.fd)
        self.samples = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _status_kb(b"RssAnon:", self.fd))
            self.samples += 1
            time.sleep(0.001)

    def finish(self) -> None:
        self.stop.set()
        self.join()
        self.peak = max(self.peak, _status_kb(b"RssAnon:", self.fd))


def _child(task: dict) -> dict:
    got = _child_op(task)
    with open("/proc/self/status", "rb") as f:  # the child's peak, from its start
        status = f.read()
    at = status.index(b"VmHWM:") + len(b"VmHWM:")
    return {**got, "vmhwm": int(status[at:status.index(b"kB", at)]) * 1024}


def _child_op(task: dict) -> dict:
    import tensorflow as tf

    import objckpt

    obj, variables = build(task["size"], fill="zeros")
    kind = task["kind"]
    if kind == "first_restore":
        start = time.perf_counter()
        if task["lib"] == "objckpt":
            objckpt.restore(obj, task["prefix"])
        else:
            tf.train.Checkpoint(v=variables).read(task["prefix"]).assert_consumed()
        seconds = time.perf_counter() - start
        assert float(tf.reduce_max(variables[-1])) > 0, "nothing restored"
        return {"seconds": seconds}
    ops = {"objckpt.save": lambda: objckpt.save(obj, task["out"], **save_kwargs(durable=False)),
           "objckpt.restore": lambda: objckpt.restore(obj, task["prefix"]),
           "tf.write": lambda: tf.train.Checkpoint(v=variables).write(task["out"]),
           "tf.read": lambda: tf.train.Checkpoint(v=variables).read(task["prefix"])
           .assert_consumed()}
    op = ops[task["op"]]
    # Warm up on a one-variable obj: imports and code paths loaded once per process are not
    # what an operation costs in memory per model byte.
    tiny = tf.Module()
    tiny.v = [tf.Variable(tf.ones((4, 4)))]
    warm = task["out"] + "-warm"
    if task["op"].startswith("objckpt"):
        objckpt.save(tiny, warm, **save_kwargs(durable=False))
    else:
        tf.train.Checkpoint(v=tiny.v).write(warm)
    if task["op"].endswith("restore"):
        objckpt.restore(tiny, warm)
    elif task["op"] == "tf.read":
        tf.train.Checkpoint(v=tiny.v).read(warm).assert_consumed()
    gc.collect()
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:  # Linux >= 4.0: reset VmHWM to the current RSS (building the model peaked higher)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    hwm_before = _status_kb(b"VmHWM:", fd)
    rss_before = _status_kb(b"VmRSS:", fd)
    sys.setswitchinterval(0.0005)  # the sampler gets the GIL while the op runs Python code
    sampler = _Sampler()
    sampler.start()
    start = time.perf_counter()
    op()
    seconds = time.perf_counter() - start
    sampler.finish()
    hwm_after = _status_kb(b"VmHWM:", fd)
    # Where VmHWM could not be reset it may sit above the current RSS: growth over the
    # larger of the two is what the operation added beyond the earlier peak.
    return {"seconds": seconds, "anon_added": (sampler.peak - sampler.baseline) * 1024,
            "hwm_added": max(0, hwm_after - max(hwm_before, rss_before)) * 1024,
            "samples": sampler.samples}


def bench_first_restore(size_mib: float, paths: dict) -> dict:
    import numpy as np

    ours, theirs = ("first objckpt.restore(obj, prefix) in a fresh process",
                    "first tf.train.Checkpoint(v=list).read(prefix).assert_consumed()")
    samples = {ours: [], theirs: []}
    for lib in ("objckpt", "tf"):  # untimed: compiles the bytecode the timed children load
        _run_child({"kind": "first_restore", "lib": lib, "size": size_mib,
                    "prefix": paths["ours"]})
    for run in range(FIRST_RESTORE_RUNS):
        order = [("objckpt", ours), ("tf", theirs)]
        for lib, name in (order if run % 2 == 0 else order[::-1]):
            got = _run_child({"kind": "first_restore", "lib": lib, "size": size_mib,
                              "prefix": paths["ours"]})
            samples[name].append(got["seconds"])
    ms, spread = summarize(samples)
    per_run = np.array(samples[theirs]) / np.array(samples[ours])
    rows = [("first restore: tf.train.Checkpoint.read vs objckpt.restore",
             float(np.median(per_run)), "", None, [float(per_run.min()), float(per_run.max())])]
    return {"model": describe(size_mib) + f"; objckpt's checkpoint, {FIRST_RESTORE_RUNS} "
                                          "child processes each, page cache and bytecode "
                                          "cache warm",
            "ms": ms, "spread": spread, "ratios": rows}


def bench_peak_memory(size_mib: float, paths: dict, work: str) -> dict:
    from timing import met

    total, largest = model_bytes(size_mib)
    limit = 1 + (largest + 0.2 * total) / total
    target = f"<= {math.floor(limit * 100) / 100:.2f}x"
    out = os.path.join(work, "peak")
    values, rows, seconds = {}, [], {}
    for op, label, ours in (("objckpt.save", "objckpt.save", True),
                            ("objckpt.restore", "objckpt.restore", True),
                            ("tf.write", "tf.train.Checkpoint.write", False),
                            ("tf.read", "tf.train.Checkpoint.read", False)):
        _fresh_dir(out)
        got = _run_child({"kind": "peak", "op": op, "size": size_mib, "prefix": paths["ours"],
                          "out": os.path.join(out, "ck")})
        _remove(out)
        values[f"{label}: RssAnon added (1 ms samples)"] = got["anon_added"] / MIB
        values[f"{label}: peak RSS added (VmHWM)"] = got["hwm_added"] / MIB
        seconds[label] = got["seconds"]
        for what, added in (("RssAnon", got["anon_added"]), ("VmHWM", got["hwm_added"])):
            ratio = (total + added) / total
            rows.append((f"{label}: peak / model bytes ({what})", ratio,
                         target if ours else "", met(ratio, target) if ours else None))
    notes = [f"target: model + largest tensor ({largest / MIB:.0f} MiB) + 20% = "
             f"{limit:.3f}x the model's {total / MIB:.0f} MiB",
             "seconds of the measured calls (first call in the child): "
             + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())]
    return {"model": describe(size_mib) + "; one child process per operation",
            "mib": values, "ratios": rows, "notes": notes}


# --- async save ------------------------------------------------------------------------


def bench_async(size_mib: float, work: str, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf

    import objckpt

    obj, variables = build(size_mib, seed=1)
    lr = 1e-3

    def make_step(batch):
        rows = variables[0].shape[0]
        x = tf.constant(np.random.default_rng(2).normal(size=(batch, rows)).astype("float32"))
        scale = lr / batch

        @tf.function
        def step():
            for v in variables:
                h = tf.matmul(x, v)
                v.assign_sub(scale * tf.matmul(x, h, transpose_a=True))

        return step

    batch = 8
    while True:  # calibrate: the first batch whose step takes >= 20 ms
        step = make_step(batch)
        step()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        step_s = float(np.median(times))
        if step_s >= 0.02 or batch >= 4096:
            break
        batch *= 2

    scratch = os.path.join(work, "async")
    counter = itertools.count()
    state = {}

    def setup():
        _fresh_dir(scratch)
        state["path"] = os.path.join(scratch, f"ck{next(counter)}")

    def epoch_plain():
        for _ in range(EPOCH_STEPS):
            step()

    def epoch_async():
        handle, blocked = None, 0.0
        for i in range(EPOCH_STEPS):
            if i == ASYNC_SAVE_AT:
                start = time.perf_counter()
                handle = objckpt.save(obj, state["path"], blocking=False,
                                       **save_kwargs(durable=False))
                blocked = time.perf_counter() - start
            step()
        start = time.perf_counter()
        handle.result()
        return {blocked_name: blocked, wait_name: time.perf_counter() - start}

    plain = f"epoch of {EPOCH_STEPS} steps, no save"
    with_async = f"epoch of {EPOCH_STEPS} steps, async save at step {ASYNC_SAVE_AT}, result() " \
                 "awaited"
    blocked_name = "time blocked in objckpt.save(obj, prefix, blocking=False)"
    wait_name = "time in .result() at the end of the epoch"
    sync = "synchronous objckpt.save(obj, prefix)"
    ops = {plain: (setup, epoch_plain), with_async: (setup, epoch_async),
           sync: (setup, lambda: objckpt.save(obj, state["path"], **save_kwargs(durable=False)))}
    samples = interleaved(ops, max(7, repeats))
    _remove(scratch)
    ms, spread = summarize(samples)
    rows = _rows(
        ratio_row(samples, "time blocked in an async save / synchronous save", blocked_name,
                  sync, "<= 0.05x"),
        ratio_row(samples, "epoch with one async save / epoch without", with_async, plain,
                  "<= 1.05x"))
    return {"model": describe(size_mib) + f"; matmul training step of {step_s * 1e3:.0f} ms "
                                          f"(batch {batch}), {len(samples[plain])} rounds",
            "ms": ms, "spread": spread, "ratios": rows, "batch": batch}


# --- driver -----------------------------------------------------------------------------


def _disk_used(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def _track_disk() -> None:
    if _RUN_PEAKS["work"]:
        _RUN_PEAKS["disk"] = max(_RUN_PEAKS["disk"], _disk_used(_RUN_PEAKS["work"]))


def _phase(result: dict, start: float) -> dict:
    """Notes the phase's wall time and what the run used so far (the budget of a run)."""
    with open("/proc/self/status", "rb") as f:
        status = f.read()
    at = status.index(b"VmHWM:") + len(b"VmHWM:")
    hwm = int(status[at:status.index(b"kB", at)]) * 1024
    _track_disk()
    result.setdefault("notes", []).append(
        f"phase wall time {time.perf_counter() - start:.0f} s; so far: peak RSS "
        f"{hwm / 1e9:.2f} GB here, {_RUN_PEAKS['child'] / 1e9:.2f} GB in a child, "
        f"{_RUN_PEAKS['disk'] / 1e9:.2f} GB of files")
    return result


_RUN_PEAKS = {"child": 0, "disk": 0, "work": None}


def run(sizes, repeats: int, work_root: str | None = None):
    """Yields (title, result) for each size and phase, then the async save's."""
    sizes = sorted({float(s) for s in sizes}, reverse=True)
    work = tempfile.mkdtemp(prefix="objckpt-bench-io-", dir=work_root)
    _RUN_PEAKS.update(child=0, disk=0, work=work)
    try:
        for size in sizes:
            label = f"{size:g} MiB"
            here = os.path.join(work, label.replace(" ", ""))
            start = time.perf_counter()
            obj, variables = build(size)
            result = bench_save(obj, variables, size, here, repeats)
            yield f"save, {label}", _phase(result, start)
            start = time.perf_counter()
            paths = write_sources(obj, variables, here)
            result = bench_restore(obj, variables, size, paths, repeats)
            yield f"restore, {label}", _phase(result, start)
            del obj, variables, result
            gc.collect()
            start = time.perf_counter()
            result = bench_first_restore(size, paths)
            yield f"first restore, {label}", _phase(result, start)
            start = time.perf_counter()
            result = bench_peak_memory(size, paths, here)
            yield f"peak memory, {label}", _phase(result, start)
            _remove(here)
        if api()["blocking"]:
            start = time.perf_counter()
            result = bench_async(sizes[-1], os.path.join(work, "async"), repeats)
            yield f"async save, {sizes[-1]:g} MiB", _phase(result, start)
        else:
            print("\n[io: async save] objckpt.save has no blocking= yet: not measured")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def parse_sizes(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--io-sizes", default="1024,100", help="model sizes in MiB")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    out = []
    for title, result in run(parse_sizes(args.io_sizes), args.repeats):
        out.append({"title": title, **result})
        print(f"\n[io: {title}] {result['model']}", flush=True)
        print_result(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(json.loads(sys.argv[2]))))
    else:
        sys.exit(main())
