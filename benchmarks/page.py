"""docs/benchmarks.md, written from the results `run.py --json` records (no TensorFlow here).

`python3 benchmarks/run.py --render benchmarks/results.json --markdown docs/benchmarks.md`
writes the page again from the committed results; a run with `--json` and `--markdown`
measures and writes both. Every figure on the page comes from the results file.
"""

from __future__ import annotations

import os

# What each section measures, in words: no figures here, those come from the results.
ABOUT = {
    "foundation": (
        "`snapshot` and `restore` against what users write today: "
        "`set_weights(get_weights())`, a `tf.train.Checkpoint` round trip (in memory via "
        "`ram://` and through a temporary directory), `tf.train.Checkpoint.read` of the same "
        "prefix, and NumPy copying the same bytes (the physical limit). Model (a) is an MLP of "
        "24 `Dense(1024)` layers (48 variables, 25.2M parameters); model (b) has 250 "
        "`Dense(16)` layers (500 small variables), where per-variable overhead dominates."),
    "twins": (
        "`Twins.sync()` (hard copy, fused assigns that alias buffers) and `sync(tau)` (Polyak "
        "update, bandwidth-bound) against `past.set_weights(current.get_weights())`, a "
        "checkpoint round trip, an eager per-variable assign loop and a NumPy blend of the "
        "same bytes; then the cost of a target network inside an Adam training loop."),
    "migrate": (
        "`objckpt.migrate` of a TF1 name-based checkpoint against the hand-written loop "
        "(`tf.train.load_checkpoint`, assign, `tf.train.Checkpoint.write`), each run in its "
        "own subprocess, with the peak memory each adds; and `restore_on_create` against "
        "building the model and then restoring."),
    "ensemble": (
        "An `Ensemble`'s one batched call against calling N models in a loop; "
        "`load_ensemble` against N plain restores; a `Freezer` step against the plain "
        "training step (freezing must not slow the step it runs in)."),
    "completeness": (
        "The cost of covering every variable (including layers Keras 3 keeps in Python "
        "lists, which TF's object graph does not show): a snapshot restored into another "
        "instance, and a keras-hub backbone's coverage."),
    "untrusted": (
        "What validating an untrusted checkpoint costs (the index, every entry, the object "
        "graph, read in pure Python before TF's reader sees the file), and the cost on a "
        "large object graph, which stays linear."),
    "cli": (
        "`objckpt inspect`, `graph` and `diff` answer without importing TensorFlow: each "
        "command's wall time in a fresh process, against `python -c 'import tensorflow'`."),
    "formats": (
        "Restoring from a SavedModel, a Keras 3 `.weights.h5` and a Keras 2 `.h5` against "
        "each format's own loader."),
    "distribute": (
        "`Twins.sync` and `restore(Snapshot)` under a two-replica `MirroredStrategy` "
        "(CPUs split into two logical devices) against one device and "
        "`set_weights(get_weights())`."),
    "checkpointing": (
        "`callbacks.Checkpointing` saves and resumes against `tf.train.CheckpointManager` "
        "and Keras's own callbacks, and the cost of asynchronous saves during `fit`."),
    "io": (
        "Checkpoint I/O: `objckpt.save` and `restore` against `tf.train.Checkpoint` "
        "write/read and plain file I/O of the same bytes (spreads are min and max over "
        "rounds), durable saves, a first restore in a fresh process, peak memory per "
        "operation, and the time a background save blocks."),
    "wide": (
        "Wide object graphs: a checkpoint of a small model under `model/` beside 2,000 to "
        "200,000 scalar variables that are children of the root (what "
        "`tf.train.Checkpoint(model=m, **many)` writes), the model restored alone (`at` found "
        "by itself), planned, and the file read, verified and inspected, against TF's own "
        "`tf.train.Checkpoint(model=m).read`. Cost is linear in graph nodes and entries: the "
        "time per graph node stays flat from the smallest size to the largest."),
    "remote": (
        "Checkpoints in object storage: `objckpt.save` and `objckpt.restore` of a `tf.Module` "
        "of 8 float32 variables to fake-gcs-server (`gs://`, gcsfs) and to moto's S3 server "
        "(`s3://`, s3fs), each server a separate process keeping objects in memory, against "
        "the plain transfer of the same bundle files with the same client library (the limit "
        "here): `fs.put_file` of each file for a save; `fs.get_file` of each object, and "
        "ranged `fs.cat_file` parts written at their offsets by 8 threads, for a restore (the "
        "faster of the two is the baseline). A save includes writing the bundle locally; a "
        "restore includes resolving the checkpoint remotely, checking every checksum and "
        "assigning. `tf.train.Checkpoint.write` is measured where TF's own file system can "
        "reach the emulator; the notes say why it could not. Times in seconds, median of 3 "
        "interleaved rounds after a warm-up; ratio spans are the per-round ratios."),
    "safetensors": (
        "A Hugging Face folder (`config.json` and a ~215 MB `model.safetensors`, written by "
        "`objckpt.export` from a keras-hub `Llama3Backbone` of hidden 1024, vocabulary "
        "32,000, tied embeddings) restored into a fresh backbone of the same config: "
        "`objckpt.restore(backbone, folder, rules=objckpt.rules.huggingface(folder))` (header "
        "checked, plan made and checked, every entry's transformed shape checked from the "
        "header, then each tensor read with pread, transposed and reshaped to Keras layouts "
        "and assigned in turn) against keras-hub's own importer "
        "`Backbone.from_preset(folder)` (which also builds the backbone: building one alone "
        "is shown beside it) and against `safetensors.numpy.load_file` plus `assign` of each "
        "tensor through the same transforms, the name -> variable map made beforehand (the "
        "limit: no plan, no checks). Each restore is checked bit for bit first. Times in "
        "seconds, median of 3 interleaved rounds after a warm-up; ratio spans are the "
        "per-round ratios. Then at full size (a float32 folder of >= 2 GiB in one file, a "
        "bfloat16 folder of >= 4 GiB in 1 GB shards, each into a backbone of its own dtype, "
        "and the bfloat16 folder into a float32 backbone, widened as it is read), one "
        "process per operation: the peak anonymous memory (RssAnon sampled every ~1 ms) "
        "beyond the model and the time of `objckpt.restore` (median of 3 runs), of "
        "`objckpt.restore` of the same backbone from a TF checkpoint of the same tensors "
        "(`objckpt.save` of the exported backbone; median of 3 runs, interleaved with the "
        "other's; compared by bytes per second), of `safe_open` plus `assign` of each "
        "tensor through the same transforms (the limit), and of keras-hub's `from_preset` "
        "(beyond the model it builds; its time includes building it), the page cache warmed "
        "alike before each; every restore's values are checked against the exported ones. "
        "Target: extra memory at most the largest tensor (in the backbone's dtype) + 256 "
        "MiB."),
    "average": (
        "Averaging 8 checkpoints of one model: `objckpt.average(obj, prefixes)` (every source "
        "planned first, then read once, one variable at a time: a window of every source at "
        "a time added in float64, its checksum extended as it is read, each mean assigned "
        "once its checksums matched, the old value kept in an undo log) and the model-free writer "
        "`objckpt.average_checkpoints` (one read, checksums checked as it goes; what "
        "`objckpt average` runs, without TensorFlow) against the way users write it (every "
        "variable of all 8 checkpoints read into NumPy with `tf.train.load_checkpoint`, "
        "`np.mean`, `assign`) and against plain reads of the 8 data files (the limit). Each "
        "operation runs in a fresh child process, interleaved round by round after a warm-up "
        "round that fills the page cache; times in seconds, medians; peak memory is the "
        "largest RssAnon (sampled every ~1 ms from /proc/self/status) above its value before "
        "the operation, the model's own variables included in that baseline, over the "
        "largest tensor's bytes."),
    "sharded": (
        "A sharded embedding table under `ParameterServerStrategy` (a tf_keras `Embedding` of "
        "64 float32 columns built with `FixedShardsPartitioner(2)`: two shards, one on each "
        "of two parameter servers) in `tf.train.Checkpoint(model=model)`: `objckpt.save` "
        "against `ckpt.write` and `objckpt.restore` against `ckpt.read(...).assert_consumed()` "
        "on the same cluster. The worker and the two parameter servers are "
        "`tf.distribute.Server`s in processes of their own, started afresh for each "
        "operation; the coordinator is a fresh child process, so its memory is its own. Each "
        "operation is timed in its child, interleaved round by round after a warm-up round "
        "(a fresh prefix for each save, `os.sync()` before it; both restores read the "
        "warm-up's `objckpt.save`, from the page cache); times in seconds, medians, spans the "
        "per-round ratios. Each restore is checked against the saved table (a digest of every "
        "shard computed on its parameter server). Peak memory: the coordinator's RssAnon "
        "sampled every ~1 ms above its value before the operation; each parameter server's "
        "peak RSS during the operation above its RSS just before it is in the notes (a "
        "lower bound of what the server needed: its allocator reuses the memory it freed "
        "after building its shard). Targets: faster than TF, and the "
        "coordinator's peak at most the largest shard + 64 MiB."),
}

ORDER = ["foundation", "twins", "migrate", "ensemble", "completeness", "untrusted", "cli",
         "formats", "distribute", "checkpointing", "io", "wide", "remote", "safetensors",
         "average", "sharded"]


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _number(value) -> str:
    if value is None:
        return ""
    value = float(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.4g}"
    return f"{value:.3g}"


def _table(result: dict) -> list[str]:
    """The operations' medians (with min and max where recorded), then the ratios."""
    lines = []
    unit = "ms" if "ms" in result else "s" if "s" in result else "MiB"
    values = result.get("ms") or result.get("s") or result.get("mib") or {}
    spread = result.get("spread", {})
    if values:
        with_spread = any(name in spread for name in values)
        head = f"| operation | median {unit} |" + (" min | max |" if with_spread else "")
        lines += [head, "|---|---:|" + ("---:|---:|" if with_spread else "")]
        for name, value in values.items():
            row = f"| {_cell(name)} | {_number(value)} |"
            if with_spread:
                lo, hi = spread.get(name, (None, None))
                row += f" {_number(lo)} | {_number(hi)} |"
            lines.append(row)
        lines.append("")
    rows = result.get("ratios") or []
    if rows:
        with_span = any(len(r) > 4 and r[4] for r in rows)
        lines += ["| ratio | value |" + (" min .. max |" if with_span else "")
                  + " target | met |",
                  "|---|---:|" + ("---|" if with_span else "") + "---|---|"]
        for what, value, target, ok, *rest in rows:
            mark = "" if ok is None else ("yes" if ok else "**no**")
            row = f"| {_cell(what)} | {_number(value)} |"
            if with_span:
                span = rest[0] if rest and rest[0] else None
                row += f" {_number(span[0])} .. {_number(span[1])} |" if span else " |"
            lines.append(row + f" {_cell(target or '')} | {mark} |")
        lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {_cell(note)}")
    if result.get("notes"):
        lines.append("")
    return lines


def _heading(title: str) -> str:
    """`[io: save, 100 MiB] tf.Module, ...` -> `io: save, 100 MiB: tf.Module, ...`."""
    title = title.strip()
    if title.startswith("[") and "] " in title:
        tag, rest = title[1:].split("] ", 1)
        title = f"{tag}: {rest}"
    return _cell(title)


def _targets(sections: list) -> list[str]:
    """How many targets this run met, and the ones it did not."""
    met, missed = 0, []
    for section in sections:
        for what, value, target, ok, *_ in section["result"].get("ratios") or []:
            if ok is None:
                continue
            if ok:
                met += 1
            else:
                missed.append(f"{_heading(section['title']).split(':')[0]}: {_cell(what)} "
                              f"{_number(value)} (target {_cell(target)})")
    if not met and not missed:
        return []
    lines = [f"Targets met in this run: {met} of {met + len(missed)}."
             + (" Not met:" if missed else ""), ""]
    lines += [f"- {line}" for line in missed]
    return lines + ([""] if missed else [])


def render(out: dict, results_path: str | None = None) -> str:
    machine = out.get("machine", {})
    settings = out.get("settings", {})
    command = out.get("command", "python3 benchmarks/run.py")
    results = results_path or "benchmarks/results.json"
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/run.py from benchmarks/results.json: do not edit by "
        "hand. -->",
        f"This page is generated by `benchmarks/run.py` from the results it recorded in "
        f"`{results}`; do not edit it by hand. To measure again and rewrite both:",
        "",
        "```console",
        "$ python3 benchmarks/run.py --json benchmarks/results.json "
        "--markdown docs/benchmarks.md",
        "```",
        "",
        "and to rewrite the page from the committed results alone:",
        "",
        "```console",
        "$ python3 benchmarks/run.py --render benchmarks/results.json "
        "--markdown docs/benchmarks.md",
        "```",
        "",
        "Each operation and its baselines are timed in one process, interleaved round by "
        "round so that drift of the machine hits all alike; each figure is the median over "
        "rounds (a fast operation is run several times per sample, with the garbage "
        "collector off, as `timeit` does). Absolute times depend on the machine; **the "
        "ratios are the point** (\"A vs B\" is B's time over A's, a speed-up; \"A / B\" "
        "is A's time over B's). A target marked **no** was not met in this run.",
        "",
        "## Where these figures come from",
        "",
        f"- command: `{command}`",
        f"- TensorFlow {machine.get('tensorflow', out.get('tensorflow', '?'))}, Keras "
        f"{machine.get('keras', out.get('keras', '?'))}, NumPy {machine.get('numpy', '?')}, "
        f"Python {machine.get('python', '?')} on {machine.get('system', '?')}",
        f"- {machine.get('cpus', '?')} CPUs ({machine.get('cpu', '?')}), "
        + (f"{machine['memory_bytes'] / 2**30:.0f} GiB memory, "
           if machine.get("memory_bytes") else "")
        + f"{machine.get('gpus', 0)} GPUs",
        "- settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()
                                   if v is not None),
    ]
    if out.get("note"):
        lines.append(f"- note: {_cell(out['note'])}")
    for run in out.get("merged", []):
        lines.append(f"- sections {', '.join(run['sections'])} measured by a later run, merged "
                     f"in: `{run['command']}`" + (f" ({_cell(run['note'])})"
                                                  if run.get("note") else ""))
    for reason in out.get("skipped", []):
        lines.append(f"- not measured: {_cell(reason)}")
    seconds = out.get("seconds", {})
    if seconds:
        lines.append("- seconds each section took: " + ", ".join(
            f"{name} {value:g}" for name, value in seconds.items()))
    lines.append("")
    sections = out.get("sections", [])
    present = [name for name in ORDER if any(s["section"] == name for s in sections)]
    if present:
        lines += ["Sections: " + ", ".join(f"[{name}](#{name})" for name in present) + ".", ""]
    lines += _targets(sections)
    for name in present:
        lines += [f"## {name}", ""]
        if name in ABOUT:
            lines += [ABOUT[name], ""]
        for section in sections:
            if section["section"] != name:
                continue
            lines += [f"### {_heading(section['title'])}", ""]
            lines += _table(section["result"])
    return "\n".join(lines).rstrip() + "\n"


def write(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
