"""Restoring a Hugging Face safetensors folder into a keras-hub backbone (issue 31).

The folder is what `objckpt.export` writes for a keras-hub `Llama3Backbone` of a small but wide
config (hidden 1024, 8 heads, 2 layers, vocabulary 32,000, tied embeddings: ~213 MB of
float32 in one `model.safetensors`) with `objckpt.rules.huggingface("llama")`, beside its
`config.json` as transformers writes it. Into a fresh backbone of the same config:

- `objckpt.restore(backbone, folder, rules=huggingface(folder))`: the header checked, the
  plan made and checked, every tensor read through mmap, transformed (torch layouts to Keras
  ones: Transpose, Reshape) and assigned;
- keras-hub's own importer, `keras_hub.models.Backbone.from_preset(folder)` (it builds the
  backbone too: the time of building one alone is shown beside it);
- the limit: `safetensors.numpy.load_file(file)` and `variable.assign` of each tensor, put
  through the same transforms in NumPy, the name -> variable map made beforehand (no plan,
  no checks).

Every operation runs once to warm up, then `repeats` interleaved rounds (the order reversed
every other round); figures are medians in seconds, ratio spans the per-round ratios. Each
restore's values are checked bit for bit against the exported model before anything is
timed.

Run alone: `python benchmarks/bench_safetensors.py [--layers 2] [--repeats 3]`; or
`python benchmarks/run.py --section safetensors`. Needs keras-hub and safetensors (Keras 3
only); without them it says what is missing and measures nothing.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

import objckpt

TARGET_LIMIT = "<= 1.1x"
TARGET_KERAS_HUB = ">= 1x"
HIDDEN, HEADS, INTERMEDIATE, VOCAB = 1024, 8, 2048, 32000


def _config(layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS, "hidden_act": "silu", "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "rope_scaling": None,
        "tie_word_embeddings": True, "torch_dtype": "float32",
    }


def _backbone(keras_hub, layers: int):
    return keras_hub.models.Llama3Backbone(
        vocabulary_size=VOCAB, num_layers=layers, num_query_heads=HEADS,
        num_key_value_heads=HEADS, hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
        tie_word_embeddings=True)


def _values(model) -> list:
    return [np.asarray(v.numpy()) for v in model.weights]


def _same(model, values: list) -> bool:
    return all(np.array_equal(np.asarray(v.numpy()), w) for v, w in zip(model.weights, values))


def _scramble(model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.standard_normal(variable.shape, dtype=np.float32))


def bench_safetensors(repeats: int = 3, layers: int = 2):
    """The result (seconds, ratios) or (None, why it was not measured); its folder removed
    when it returns."""
    try:
        import keras_hub  # noqa: F401
        import safetensors.numpy  # noqa: F401
    except ImportError as err:
        return None, f"needs keras-hub and safetensors (Keras 3): {err}"
    import shutil

    workdir = tempfile.mkdtemp(prefix="objckpt-bench-safetensors-")
    try:
        return _bench_folder(workdir, repeats, layers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _bench_folder(workdir: str, repeats: int, layers: int):
    """`bench_safetensors` in the scratch folder `workdir`."""
    import keras_hub
    import safetensors.numpy as safetensors_numpy

    from objckpt.rules import huggingface

    folder = os.path.join(workdir, "hf")
    os.makedirs(folder)
    config = _config(layers)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    source = _backbone(keras_hub, layers)
    _scramble(source, 0)
    exported = _values(source)
    rules = huggingface(folder)
    objckpt.export(source, folder, rules=rules)
    del source
    gc.collect()
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    nbytes = sum(os.path.getsize(os.path.join(folder, n)) for n in files)
    path = os.path.join(folder, files[0])

    target = _backbone(keras_hub, layers)
    variables = objckpt.tree(target)
    the_plan = objckpt.plan(target, folder, rules=huggingface(folder))
    assert the_plan.complete, the_plan.describe()
    mapping = [(m.source, variables[m.target], m.transform) for m in the_plan.matches]

    def restore():
        objckpt.restore(target, folder, rules=huggingface(folder))

    def limit():
        tensors = safetensors_numpy.load_file(path)
        for name, variable, transform in mapping:
            value = tensors[name]
            variable.assign(transform(value) if transform is not None else value)

    loaded = []

    def from_preset():
        loaded.clear()
        gc.collect()
        loaded.append(keras_hub.models.Backbone.from_preset(folder))

    def build():
        loaded.clear()
        gc.collect()
        loaded.append(_backbone(keras_hub, layers))

    notes = []
    checks = {"objckpt.restore(backbone, folder, rules=huggingface(folder))": restore,
              "safetensors.numpy.load_file + assign (the limit)": limit}
    for name, fn in checks.items():
        _scramble(target, 1)
        fn()
        if not _same(target, exported):
            raise AssertionError(f"{name} did not restore the exported values")
    operations = dict(checks)
    try:
        from_preset()
        if not _same(loaded[0], exported):
            notes.append("keras-hub's from_preset loaded other values than the exported ones")
        operations["keras_hub Backbone.from_preset(folder)"] = from_preset
        operations["Llama3Backbone(...) built alone (part of from_preset)"] = build
    except Exception as err:  # keras-hub's importer: recorded, not raised
        notes.append(f"keras-hub's from_preset(folder) failed: {type(err).__name__}: "
                     f"{str(err).splitlines()[0] if str(err) else ''}")
    loaded.clear()

    times = {name: [] for name in operations}
    names = list(operations)
    for name in names:  # warm up: traced functions, page cache
        operations[name]()
    for round_ in range(repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            gc.collect()
            start = time.perf_counter()
            operations[name]()
            times[name].append(time.perf_counter() - start)
    loaded.clear()
    seconds = {name: statistics.median(t) for name, t in times.items()}
    spread = {name: (min(t), max(t)) for name, t in times.items()}
    ours, the_limit = names[0], names[1]

    def span(base, name):
        per_round = [b / o for b, o in zip(times[base], times[name])]
        return (min(per_round), max(per_round))

    ratio = seconds[ours] / seconds[the_limit]
    rows = [("objckpt.restore time / (load_file + assign)", ratio, TARGET_LIMIT,
             ratio <= 1.1, span(ours, the_limit))]
    preset = "keras_hub Backbone.from_preset(folder)"
    if preset in seconds:
        ratio = seconds[preset] / seconds[ours]
        rows.append(("keras-hub from_preset time / objckpt.restore time", ratio,
                     TARGET_KERAS_HUB, ratio >= 1, span(preset, ours)))
        built = "Llama3Backbone(...) built alone (part of from_preset)"
        per_round = [(p - b) / o for p, b, o in zip(times[preset], times[built], times[ours])]
        rows.append(("keras-hub from_preset less building the backbone / objckpt.restore "
                     "(per round)", statistics.median(per_round), "", None,
                     (min(per_round), max(per_round))))
    params = sum(int(np.prod(v.shape)) for v in target.weights)
    return {"model": f"Llama3Backbone, hidden {HIDDEN}, {layers} layers, vocabulary {VOCAB}, "
                     f"tied: {params / 1e6:.1f}M float32 parameters in {len(variables)} "
                     f"variables; {len(files)} safetensors file of {nbytes / 1e6:.0f} MB",
            "bytes": nbytes, "s": seconds, "spread": spread, "ratios": rows,
            "notes": notes}, None


# --- peak memory at full size: one child process per operation ----------------------------

TARGET_MEMORY = "<= 1x"  # extra memory / (largest tensor + 256 MiB)
TARGET_CHECKPOINT = ">= 1x"  # safetensors throughput / the TF checkpoint's, same tensors
MEMORY_SLACK = 256 << 20
MEMORY_ROUNDS = 3  # runs of each of objckpt's restores per case (the others: one)
_SIZES = {  # name: (hidden, intermediate, heads, layers, dtype, max shard size)
    "single": (2048, 5632, 16, 10, "float32", None),
    "sharded": (2048, 5632, 16, 41, "bfloat16", "1GB"),
}
# case: (the folder's size, the backbone's dtype). A case whose backbone has the folder's
# dtype is also restored from a TF checkpoint of the same tensors (`objckpt.save` of the
# exported backbone); the bfloat16 folder into a float32 backbone is cast as it is read.
CASES = {
    "single": ("single", "float32"),
    "sharded": ("sharded", "bfloat16"),
    "sharded-float32": ("sharded", "float32"),
}
_DIGEST_STRIDE = 97  # every 97th element (and the first and last 4096) of each variable


def _status(field: bytes) -> int:
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


class _Peak:
    """Peak RssAnon of this process beyond its value at entry, sampled every ~1 ms."""

    def __enter__(self):
        import threading

        self.base = self.peak = _status(b"RssAnon:")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.start = time.perf_counter()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _status(b"RssAnon:"))
            time.sleep(0.001)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status(b"RssAnon:"))


def _layers(size: str) -> int:
    """Decoder layers of `size`: OBJCKPT_BENCH_LAYERS where set (smaller runs while
    developing: `--memory-layers`), else the full size's."""
    given = os.environ.get("OBJCKPT_BENCH_LAYERS", "").strip()
    return int(given) if given else _SIZES[size][3]


def _sized_config(size: str) -> dict:
    hidden, intermediate, heads, _, dtype, _ = _SIZES[size]
    layers = _layers(size)
    config = _config(layers)
    config.update(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                  num_key_value_heads=heads, head_dim=hidden // heads, torch_dtype=dtype)
    return config


def _sized_backbone(keras_hub, size: str, dtype: str):
    hidden, intermediate, heads, _, _, _ = _SIZES[size]
    return keras_hub.models.Llama3Backbone(
        vocabulary_size=VOCAB, num_layers=_layers(size), num_query_heads=heads,
        num_key_value_heads=heads, hidden_dim=hidden, intermediate_dim=intermediate,
        tie_word_embeddings=True, dtype=dtype)


def _digest(model, dtype: str | None = None) -> str:
    """A digest of every variable's values (sampled: every `_DIGEST_STRIDE`-th element and
    the first and last 4096), cast to `dtype` first where given; equal digests: the same
    values in the same layouts."""
    import hashlib

    digest = hashlib.sha256()
    for path, variable in objckpt.tree(model).items():
        flat = np.asarray(variable.numpy()).reshape(-1)
        sample = np.concatenate([flat[:4096], flat[::_DIGEST_STRIDE], flat[-4096:]])
        if dtype is not None:
            sample = sample.astype(dtype)
        digest.update(path.encode() + str(sample.dtype).encode() + sample.tobytes())
    return digest.hexdigest()


def _child(operation: str, folder: str, size: str, dtype: str) -> dict:
    """One operation at full size in this (fresh) process: peak RssAnon beyond the model
    (for from_preset, beyond the model it builds) and seconds; for restores, the digest of
    the values they left (`_digest`), measured after the timing."""
    import keras_hub
    from safetensors import safe_open

    from objckpt.rules import huggingface

    if operation == "make":
        return _make_folder(folder, size)
    if operation == "from_preset":
        gc.collect()
        with _Peak() as peak:
            model = keras_hub.models.Backbone.from_preset(folder, dtype=dtype)
        model_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                          for v in model.weights)
        return {"extra": peak.peak - peak.base - model_bytes, "s": peak.seconds,
                "dtype": str(model.weights[0].dtype)}
    target = _sized_backbone(keras_hub, size, dtype)
    if operation == "checkpoint":  # the TF checkpoint beside the folder: same tensors
        prefix = os.path.join(folder, "checkpoint", "ckpt")
        gc.collect()
        with _Peak() as peak:
            objckpt.restore(target, prefix)
        return {"extra": peak.peak - peak.base, "s": peak.seconds, "digest": _digest(target)}
    rules = huggingface(folder)
    if operation == "objckpt":
        gc.collect()
        with _Peak() as peak:
            objckpt.restore(target, folder, rules=rules)
        return {"extra": peak.peak - peak.base, "s": peak.seconds, "digest": _digest(target)}
    else:  # the limit: safe_open + per-tensor assign, the plan's map made beforehand
        variables = objckpt.tree(target)
        the_plan = objckpt.plan(target, folder, rules=rules)
        mapping = [(m.source, variables[m.target], m.transform) for m in the_plan.matches]
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                where = {n: os.path.join(folder, s) for n, s in json.load(f)["weight_map"].items()}
        else:
            where = {n: os.path.join(folder, "model.safetensors") for n, _, _ in mapping}
        import tensorflow as tf

        gc.collect()
        with _Peak() as peak:
            handles = {}
            for name, variable, transform in mapping:
                handle = handles.get(where[name])
                if handle is None:
                    handle = handles[where[name]] = safe_open(where[name], framework="numpy")
                value = tf.constant(handle.get_tensor(name))
                value = transform(value) if transform is not None else value
                if value.dtype != variable.dtype:  # bfloat16 into float32: widened
                    value = tf.cast(value, variable.dtype)
                variable.assign(value, read_value=False)
                del value
            handles.clear()
    return {"extra": peak.peak - peak.base, "s": peak.seconds, "digest": _digest(target)}


def _make_folder(workdir: str, size: str) -> dict:
    """What `objckpt.export` writes for a freshly initialised backbone of `size` (its
    safetensors folder, their bytes, the largest tensor's bytes) and, in the folder's
    `checkpoint/`, `objckpt.save` of the same backbone (a TF checkpoint of the same
    tensors; its data bytes); the digests of its values as they are and as float32."""
    import keras_hub

    _, _, _, _, dtype, shard = _SIZES[size]
    folder = os.path.join(workdir, size)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(_sized_config(size), f)
    from objckpt.rules import huggingface

    source = _sized_backbone(keras_hub, size, dtype)
    objckpt.export(source, folder, rules=huggingface(folder), max_shard_size=shard)
    objckpt.save(source, os.path.join(folder, "checkpoint", "ckpt"))
    largest = max(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in source.weights)
    digests = {dtype: _digest(source), "float32": _digest(source, "float32")}
    del source
    gc.collect()
    nbytes = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
                 if n.endswith(".safetensors"))
    data = os.path.join(folder, "checkpoint")
    checkpoint_bytes = sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)
                           if ".data-" in n)
    return {"folder": folder, "bytes": nbytes, "largest": largest, "digests": digests,
            "checkpoint_bytes": checkpoint_bytes}


def _run_child(operation: str, folder: str, size: str, dtype: str):
    """`_child`'s result from a fresh process, or the last line of its error."""
    import subprocess

    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", operation, "--folder", folder,
         "--size", size, "--dtype", dtype], capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode or not lines:
        return (run.stderr.strip().splitlines() or ["?"])[-1][:200]
    return json.loads(lines[-1])


def _read_through(folder: str) -> None:
    """Reads every file directly in `folder` once (into the page cache)."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def bench_memory(cases=tuple(CASES), rounds: int = MEMORY_ROUNDS) -> list:
    """[(title, result)]: for each case, peak extra memory and time of objckpt.restore,
    safe_open + assign (the limit), keras-hub's from_preset and, where the backbone has the
    folder's dtype, objckpt.restore from a TF checkpoint of the same tensors, each in its
    own process, the page cache warmed alike (every file it reads read once just before);
    objckpt's restores `rounds` times each, interleaved (medians). Each restore's values
    are checked (`_digest`) against the exported backbone's."""
    try:
        import keras_hub  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as err:
        return [("skipped", f"needs keras-hub and safetensors (Keras 3): {err}")]
    import shutil

    out, made, workdirs = [], {}, []
    try:
        for case in cases:
            size, dtype = CASES[case]
            if size not in made:
                workdir = tempfile.mkdtemp(prefix="objckpt-bench-safetensors-mem-")
                workdirs.append(workdir)
                # its model freed with its process
                made[size] = _run_child("make", workdir, size, _SIZES[size][4])
            if isinstance(made[size], str):
                out.append((case, f"the {size} folder could not be written: {made[size]}"))
                continue
            out.append(_memory_case(case, made[size], rounds))
    finally:
        for workdir in workdirs:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


_NAMES = {"objckpt": "objckpt.restore(backbone, folder, rules=huggingface(folder))",
          "checkpoint": "objckpt.restore(backbone, prefix): a TF checkpoint of the same tensors",
          "limit": "safe_open + per-tensor assign (the limit)",
          "from_preset": "keras_hub Backbone.from_preset(folder, dtype=...)"}


def _memory_case(case: str, made: dict, rounds: int) -> tuple:
    """(title, result) of one case of `bench_memory`, its folder made already; objckpt's
    restores run `rounds` times each (interleaved), the others once."""
    size, dtype = CASES[case]
    folder_dtype = _SIZES[size][4]
    folder, nbytes, largest = made["folder"], made["bytes"], made["largest"]
    operations = ["objckpt", "limit", "from_preset"]
    if dtype == folder_dtype:
        operations.insert(1, "checkpoint")
    # objckpt's two restores again, interleaved (the order reversed every other round)
    again = [op for op in operations if op in ("objckpt", "checkpoint")]
    order = list(operations)
    for round_ in range(1, rounds):
        order += again[::-1] if round_ % 2 else again
    runs, notes = {}, []
    for operation in order:
        # every operation reads from the page cache, warmed alike
        _read_through(os.path.join(folder, "checkpoint") if operation == "checkpoint"
                      else folder)
        found = _run_child(operation, folder, size, dtype)
        if isinstance(found, str):
            notes.append(f"{_NAMES[operation]} failed: {found}")
            continue
        expected = made["digests"][dtype if dtype == folder_dtype else "float32"]
        if "digest" in found and found["digest"] != expected:
            raise AssertionError(f"{case}: {_NAMES[operation]} did not restore the exported "
                                 "values")
        runs.setdefault(operation, []).append(found)
    # per operation: the median time, its spread, the largest extra memory of its runs
    got = {op: {**found[0], "s": statistics.median(r["s"] for r in found),
                "spread": (min(r["s"] for r in found), max(r["s"] for r in found)),
                "extra": max(r["extra"] for r in found), "runs": len(found)}
           for op, found in runs.items()}
    itemsize = 4 if dtype == "float32" else 2
    largest_after = largest * itemsize // (4 if folder_dtype == "float32" else 2)
    bound = largest_after + MEMORY_SLACK
    read = {"objckpt": nbytes, "limit": nbytes, "from_preset": nbytes,
            "checkpoint": made["checkpoint_bytes"]}
    for k, v in got.items():
        runs_of = (f", median of {v['runs']} runs, each in a fresh process"
                   if v["runs"] > 1 else "")
        notes.append(f"{_NAMES[k]}: {v['s']:.2f} s ({read[k] / v['s'] / 2**30:.2f} GiB/s of "
                     f"its files{runs_of}), peak extra anonymous memory "
                     f"{v['extra'] / 2**20:,.0f} MiB"
                     + (" (the largest of its runs)" if v["runs"] > 1 else "")
                     + (f" (it built a {v['dtype']} backbone)" if "dtype" in v else ""))
    rows = []
    if "objckpt" in got:
        ratio = got["objckpt"]["extra"] / bound
        rows.append(("objckpt.restore extra memory / (largest tensor in the backbone's dtype "
                     "+ 256 MiB)", ratio, TARGET_MEMORY, ratio <= 1, (ratio, ratio)))
    if "objckpt" in got and "checkpoint" in got:
        ratio = ((nbytes / got["objckpt"]["s"])
                 / (made["checkpoint_bytes"] / got["checkpoint"]["s"]))
        per_round = [(nbytes / a["s"]) / (made["checkpoint_bytes"] / b["s"])
                     for a, b in zip(runs["objckpt"], runs["checkpoint"])]
        rows.append(("objckpt.restore throughput (bytes/s): safetensors folder / TF checkpoint "
                     "of the same tensors", ratio, TARGET_CHECKPOINT, ratio >= 1,
                     (min(per_round), max(per_round))))
    if "objckpt" in got and "limit" in got:
        ratio = got["objckpt"]["s"] / got["limit"]["s"]
        rows.append(("objckpt.restore time / (safe_open + assign)", ratio,
                     TARGET_LIMIT, ratio <= 1.1, (ratio, ratio)))
    if "objckpt" in got and "from_preset" in got:
        ratio = got["from_preset"]["s"] / got["objckpt"]["s"]
        rows.append(("keras-hub from_preset time (builds the backbone too) / "
                     "objckpt.restore time", ratio, TARGET_KERAS_HUB, ratio >= 1,
                     (ratio, ratio)))
    if dtype != folder_dtype:
        notes.append(f"no TF-checkpoint row: its tensors are {folder_dtype}, and a "
                     f"{folder_dtype} TF checkpoint restored into a {dtype} backbone is read "
                     "whole before it is cast (objckpt streams a TF checkpoint only without "
                     "casts)")
    hidden, _, _, _, _, _ = _SIZES[size]
    files = sum(n.endswith(".safetensors") for n in os.listdir(folder))
    model = (f"Llama3Backbone, hidden {hidden}, {_layers(size)} layers, vocabulary {VOCAB}, "
             f"tied, {folder_dtype} into a {dtype} backbone: {nbytes / 2**30:.2f} GiB in "
             f"{files} safetensors file{'s' * (files != 1)}, largest tensor "
             f"{largest / 2**20:,.0f} MiB ({largest_after / 2**20:,.0f} MiB in the backbone)")
    seconds = {_NAMES[k]: v["s"] for k, v in got.items()}
    spread = {_NAMES[k]: v["spread"] for k, v in got.items()}
    title = (f"{case} folder at full size, peak memory (one process each)"
             if not os.environ.get("OBJCKPT_BENCH_LAYERS") else
             f"{case} folder, {_layers(size)} layers, peak memory (one process each)")
    return (title, {"model": model, "bytes": nbytes, "largest": largest,
                    "checkpoint_bytes": made["checkpoint_bytes"], "s": seconds,
                    "spread": spread,
                    "extra_bytes": {_NAMES[k]: v["extra"] for k, v in got.items()},
                    "ratios": rows, "notes": notes})


def print_result(result: dict, title: str | None = None) -> None:
    if title is not None:
        print(f"\n[safetensors: {title}] {result['model']}")
    for name, value in result.get("s", {}).items():
        lo, hi = result.get("spread", {}).get(name, (value, value))
        print(f"  {name:58s} {value:8.3f} s  ({lo:.3f} .. {hi:.3f})")
    for what, value, target, ok, *_ in result.get("ratios", []):
        mark = "" if ok is None else ("  met" if ok else "  NOT MET")
        print(f"  {what:70s} {value:6.2f}x {target or ''}{mark}")
    for note in result.get("notes", []):
        print(f"  - {note}")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true",
                        help="also the full-size peak-memory runs (>= 2 GiB, >= 4 GiB)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"with --memory: the cases to run ({', '.join(CASES)})")
    parser.add_argument("--memory-rounds", type=int, default=MEMORY_ROUNDS,
                        help="with --memory: runs of each objckpt restore (medians)")
    parser.add_argument("--memory-layers", type=int,
                        help="with --memory: decoder layers of every folder instead of the "
                        "full sizes' (smaller runs while developing)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.folder, args.size, args.dtype)), flush=True)
        return 0
    if args.memory_layers:
        os.environ["OBJCKPT_BENCH_LAYERS"] = str(args.memory_layers)  # the children read it
    if args.memory:
        for title, result in bench_memory(tuple(args.cases.split(",")), args.memory_rounds):
            if isinstance(result, str):
                print(f"skipped: {result}")
            else:
                print_result(result, title)
    result, skipped = bench_safetensors(args.repeats, args.layers)
    if result is None:
        print(f"skipped: {skipped}")
        return 0
    print_result(result, "Hugging Face folder into a keras-hub backbone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
