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

peak_memory: the peak anonymous memory (RssAnon sampled every ms) each restore
path holds beyond the live model(s): restore, restore_on_create (variables that
exist, and, from a TF checkpoint, variables created later), load_ensemble (two
members), migrate and export, from a sharded safetensors folder and a TF
checkpoint of the same tensors (512 MiB with a 64 MiB largest tensor by default),
one fresh child process each. `python benchmarks/bench_migrate.py --peak-table
[TOTAL_MIB LARGEST_MIB [DIR [OPERATIONS]]]` prints the table.
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


# --- peak anonymous memory of every restore path, one child process each -----------------

# The operations `peak_memory` measures, and the sources it writes for them.
PEAK_OPERATIONS = ("restore", "restore_on_create", "restore_on_create_deferred",
                   "load_ensemble", "migrate", "export")
PEAK_SOURCES = ("safetensors", "tf")
ENSEMBLE_MEMBERS = 2


def _anon() -> int:
    """RssAnon of this process (bytes): its anonymous memory, not the files it maps."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """Peak RssAnon of this process beyond its value at entry, sampled every ~1 ms (as
    bench_safetensors's `_Peak`); `.extra` (bytes) and `.seconds` once it exits."""

    def __enter__(self):
        import threading

        self.base = self.peak = _anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.start = time.perf_counter()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _anon())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _anon())
        self.extra = self.peak - self.base


def _layout(total_mib: int, largest_mib: int) -> dict:
    """{object path: shape} of float32 tensors: one of `largest_mib`, the rest in tensors of
    a quarter of it (each with a bias) up to about `total_mib` in all, and an int64 step."""
    side = int((largest_mib << 20) // 4) ** 0.5
    side = int(side)
    layout = {"big/kernel": (side, side), "step": ()}
    rest, small = (total_mib - largest_mib) << 20, (side // 2, side // 2)
    for i in range(max(0, rest // (small[0] * small[1] * 4))):
        layout[f"layer_{i:02d}/kernel"] = small
        layout[f"layer_{i:02d}/bias"] = (small[1],)
    return layout


def _module_of(layout: dict) -> tf.Module:
    """A tf.Module holding zeros of `layout` (nested modules by path)."""
    root = tf.Module()
    for path, shape in layout.items():
        *owners, name = path.split("/")
        node = root
        for owner in owners:
            if not hasattr(node, owner):
                setattr(node, owner, tf.Module())
            node = getattr(node, owner)
        dtype = tf.int64 if path == "step" else tf.float32
        setattr(node, name, tf.Variable(tf.zeros(shape, dtype)))
    return root


def write_peak_sources(directory: str, total_mib: int = 512, largest_mib: int = 64,
                       members: int = ENSEMBLE_MEMBERS) -> dict:
    """Writes, under `directory`, `members` safetensors folders (sharded: about 200 MB per
    shard, with the index Hugging Face writes) and `members` TF checkpoints of one random
    layout (`_layout`); returns {"safetensors": [folders], "tf": [prefixes], "layout": ...}."""
    from safetensors.numpy import save_file

    layout = _layout(total_mib, largest_mib)
    out = {"safetensors": [], "tf": [], "layout": {p: list(s) for p, s in layout.items()}}
    for k in range(members):
        rng = np.random.default_rng(k)
        values = {p: (np.array(7 + k, np.int64) if p == "step"
                      else rng.standard_normal(s, dtype=np.float32))
                  for p, s in layout.items()}
        folder = os.path.join(directory, f"st{k}")
        os.makedirs(folder, exist_ok=True)
        shards, shard, size = [], {}, 0
        for path, value in values.items():
            if shard and size + value.nbytes > 200 << 20:
                shards.append(shard)
                shard, size = {}, 0
            shard[path] = value
            size += value.nbytes
        shards.append(shard)
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(folder, name), metadata={"format": "pt"})
            weight_map.update({path: name for path in shard})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(v.nbytes for v in values.values())},
                       "weight_map": weight_map}, f)
        module = _module_of(layout)
        for path, variable in objckpt.tree(module).items():
            variable.assign(values[path])
        out["tf"].append(objckpt.save(module, os.path.join(directory, f"tf{k}", "ckpt")))
        out["safetensors"].append(folder)
        del module, values
    return out


def _peak_child(operation: str, kind: str, spec_path: str, out: str) -> None:
    """One measured operation in this (fresh) process: prints a JSON line with the peak
    RssAnon beyond the live model(s) and the seconds it took."""
    import gc

    with open(spec_path) as f:
        spec = json.load(f)
    layout = {p: tuple(s) for p, s in spec["layout"].items()}
    sources = spec[kind]
    model_bytes = sum(int(np.prod(s, dtype=np.int64)) * (8 if p == "step" else 4)
                      for p, s in layout.items())
    tf.constant(1.0) + 1.0  # TF initialised
    made = 0  # bytes of variables the operation creates (members, a deferred model)
    if operation == "restore_on_create_deferred":
        target = tf.Module()  # built later, inside the measurement
        made = model_bytes
    else:
        target = _module_of(layout)
    if operation == "load_ensemble":
        made = len(sources) * model_bytes
    gc.collect()
    held = []
    with PeakAnon() as peak:
        if operation == "restore":
            objckpt.restore(target, sources[0])
        elif operation in ("restore_on_create", "restore_on_create_deferred"):
            pending = objckpt.restore_on_create(target, sources[0])
            if operation == "restore_on_create_deferred":
                built = _module_of(layout)
                for name, child in vars(built).items():
                    if not name.startswith("_"):
                        setattr(target, name, child)
                del built
            pending.assert_done()
        elif operation == "load_ensemble":
            held.append(objckpt.load_ensemble(target, sources))  # alive until the end
        elif operation == "migrate":
            objckpt.migrate(target, sources[0], os.path.join(out, "ckpt"), progress=False)
        elif operation == "export":
            objckpt.restore(target, sources[0])
            gc.collect()
            peak.base = peak.peak = _anon()  # the export alone
            objckpt.export(target, os.path.join(out, "exported"))
        else:
            raise ValueError(operation)
    largest = max(int(np.prod(s, dtype=np.int64)) * 4 for s in layout.values())
    print(json.dumps({"operation": operation, "source": kind, "seconds": peak.seconds,
                      "extra": peak.extra - made, "largest": largest, "model": model_bytes}))


def peak_memory(operations=PEAK_OPERATIONS, kinds=PEAK_SOURCES, *, total_mib: int = 512,
                largest_mib: int = 64, directory: str | None = None) -> list[dict]:
    """Peak anonymous memory (sampled RssAnon) each restore path holds beyond the live
    model(s), one fresh child process per (operation, source kind): rows of
    `{"operation", "source", "seconds", "extra", "largest", "model"}` (bytes), for sources of
    about `total_mib` MiB whose largest tensor is `largest_mib` MiB (a sharded safetensors
    folder and a TF checkpoint of the same tensors). `load_ensemble` loads
    `ENSEMBLE_MEMBERS` members (their variables are not counted as extra); the deferred
    `restore_on_create` builds its model inside the measurement (not counted either);
    `export` (from a safetensors-restored model only) writes a safetensors file.
    `directory` keeps the sources between calls (written once)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = directory or tmp
        spec_path = os.path.join(directory, f"peak-{total_mib}-{largest_mib}.json")
        if not os.path.exists(spec_path):
            spec = write_peak_sources(directory, total_mib, largest_mib)
            with open(spec_path, "w") as f:
                json.dump(spec, f)
        rows = []
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
        for operation in operations:
            for kind in kinds:
                if ((operation == "export" and kind != "safetensors")
                        or (operation == "restore_on_create_deferred" and kind != "tf")):
                    continue  # a tf.Module built later takes values keyed by path only
                out = tempfile.mkdtemp(dir=tmp)
                proc = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--peak", operation, kind,
                     spec_path, out], capture_output=True, text=True, env=env, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{operation} from {kind} failed:\n"
                                       f"{proc.stderr[-3000:]}")
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        return rows


def _peak_table(rows: list[dict]) -> str:
    lines = [f"{'operation':28} {'source':12} {'extra MiB':>10} {'/ largest':>9} {'s':>6}"]
    for row in rows:
        lines.append(f"{row['operation']:28} {row['source']:12} {row['extra'] / 2**20:10.0f} "
                     f"{row['extra'] / row['largest']:9.2f} {row['seconds']:6.2f}")
    return "\n".join(lines)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
elif __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--peak":
    _peak_child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
elif __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--peak-table":
    # python benchmarks/bench_migrate.py --peak-table [TOTAL_MIB LARGEST_MIB [DIR [OPS]]]
    args = sys.argv[2:]
    print(_peak_table(peak_memory(
        tuple(args[3].split(",")) if len(args) > 3 else PEAK_OPERATIONS,
        total_mib=int(args[0]) if args else 512, largest_mib=int(args[1]) if args else 64,
        directory=args[2] if len(args) > 2 else None)))
