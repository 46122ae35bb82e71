"""objckpt benchmarks: ratios against the baselines users have today, in one run.

Usage:
  python benchmarks/run.py [--json results.json] [--markdown docs/benchmarks.md]
                           [--note TEXT] [--repeats N] [--only a|b]
                           [--section all|foundation|twins|migrate|ensemble|checkpointing|
                                      completeness|untrusted|cli|formats|distribute|io|
                                      wide|remote|safetensors|average|sharded] ...
                           [--steps N] [--batch N] [--migrate-tensors N] [--io-sizes MiB,MiB]
                           [--wide-sizes N,N,N] [--remote-size-mib MiB]
                           [--average-size-mib MiB] [--sharded-mib MiB] [--merge]
  python benchmarks/run.py --render results.json --markdown docs/benchmarks.md

Models:
  (a) a Keras MLP of ~25M parameters in ~50 variables;
  (b) a Keras model of ~500 small variables.

Every operation and its baselines are timed in the same process, interleaved
round by round, and each figure is the median over rounds (as timeit does, a
sample of a fast operation runs it several times back to back, with the
garbage collector off; see timing.py). Ratios (baseline
time / objckpt time) are what to compare across machines; absolute times
depend on the machine. The physical limit is NumPy copying the same bytes.

`--markdown PAGE` writes the figures of this run as a Markdown page (docs/benchmarks.md is
one, generated from benchmarks/results.json); `--render RESULTS.json` writes the page from
an earlier run's `--json` results without running anything. `--merge` (with `--json`) keeps
the sections of the existing results file that this run did not run, and records this run's
command beside them (the page says which sections came from which run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import tensorflow as tf

import objckpt

from timing import time_ops


def _keras():
    import keras  # Keras 3 on TF >= 2.16, Keras 2 on TF 2.12-2.15

    return keras


def build_mlp(keras):
    """(a): 24 Dense(1024) layers: 48 variables, 25.2M parameters."""
    inputs = keras.Input((1024,))
    x = inputs
    for _ in range(24):
        x = keras.layers.Dense(1024)(x)
    return keras.Model(inputs, x, name="mlp_25m")


def build_many(keras):
    """(b): 250 Dense(16) layers: 500 small variables."""
    inputs = keras.Input((16,))
    x = inputs
    for _ in range(250):
        x = keras.layers.Dense(16)(x)
    return keras.Model(inputs, x, name="many_500")


def bench_model(model, repeats: int) -> dict:
    """Times objckpt's operations and the baselines on one model."""
    workdir = tempfile.mkdtemp(prefix="objckpt-bench-")
    paths = objckpt.tree(model)
    nbytes = sum(v.shape.num_elements() * v.dtype.size for v in paths.values())
    params = sum(v.shape.num_elements() for v in paths.values())
    prefix = objckpt.save(model, os.path.join(workdir, "ck"))
    snap = objckpt.snapshot(model)
    host = [np.array(v) for v in snap.values()]
    host_out = [np.empty_like(a) for a in host]
    weights = model.get_weights()

    counter = iter(range(10**9))

    def ram_round_trip():
        # A fresh name each time: TF's ram:// file system does not truncate a
        # file it overwrites, so reusing one name reads back stale bytes.
        checkpoint = tf.train.Checkpoint(root=model)
        path = checkpoint.write(f"ram://objckpt-bench/{model.name}/ck{next(counter)}")
        checkpoint.read(path).assert_consumed()
        for name in tf.io.gfile.glob(path + "*"):
            tf.io.gfile.remove(name)

    def dir_round_trip():
        checkpoint = tf.train.Checkpoint(root=model)
        path = checkpoint.write(os.path.join(workdir, "tfck"))
        checkpoint.read(path).assert_consumed()

    def numpy_copy():
        for src, dst in zip(host, host_out):
            np.copyto(dst, src)

    operations = {
        "snapshot": lambda: objckpt.snapshot(model),
        "restore(Snapshot)": lambda: objckpt.restore(model, snap),
        "restore(prefix)": lambda: objckpt.restore(model, prefix),
        "set_weights(get_weights())": lambda: model.set_weights(model.get_weights()),
        "set_weights(saved list)": lambda: model.set_weights(weights),
        "tf.train.Checkpoint ram:// write+read": ram_round_trip,
        "tf.train.Checkpoint tempdir write+read": dir_round_trip,
        "tf.train.Checkpoint.read(prefix)+assert_consumed":
            lambda: tf.train.Checkpoint(root=model).read(prefix).assert_consumed(),
        "NumPy copy of the same bytes": numpy_copy,
    }
    ms = time_ops(operations, repeats)
    return {"model": model.name, "variables": len(paths), "parameters": params,
            "bytes": nbytes, "ms": ms}


def ratios(result: dict) -> list[tuple[str, float, str, bool | None]]:
    """(what, ratio, target, met) rows for one model's timings."""
    ms = result["ms"]
    rows = []

    def row(what, ratio, target=None, ok=None):
        rows.append((what, ratio, target or "", ok))

    restore_snap = ms["restore(Snapshot)"]
    ratio = ms["set_weights(get_weights())"] / restore_snap
    row("restore(Snapshot) vs set_weights(get_weights())", ratio, ">= 30x", ratio >= 30)
    ratio = ms["tf.train.Checkpoint ram:// write+read"] / restore_snap
    is_a = result["parameters"] > 1e7
    row("restore(Snapshot) vs ram:// checkpoint round trip", ratio,
        ">= 100x" if is_a else None, (ratio >= 100) if is_a else None)
    row("restore(Snapshot) vs tempdir checkpoint round trip",
        ms["tf.train.Checkpoint tempdir write+read"] / restore_snap)
    row("restore(Snapshot) vs NumPy copy of the bytes", ms["NumPy copy of the same bytes"]
        / restore_snap)
    row("snapshot vs NumPy copy of the bytes", ms["NumPy copy of the same bytes"]
        / ms["snapshot"])
    ratio = ms["restore(prefix)"] / ms["tf.train.Checkpoint.read(prefix)+assert_consumed"]
    row("restore(prefix) time / tf.train.Checkpoint.read+assert_consumed", ratio, "<= 1.15x",
        ratio <= 1.15)
    if is_a:
        row("snapshot time in ms", ms["snapshot"], "<= 5 ms", ms["snapshot"] <= 5)
    return rows


def _print_result(key, result):
    print(f"  {'operation':<52} {'median ms':>10}")
    for name, value in result["ms"].items():
        print(f"  {name:<52} {value:>10.3f}")
    print(f"  {'ratio':<68} {'value':>9}  {'target':<9} met")
    for what, value, target, ok in result["ratios"]:
        mark = "" if ok is None else ("yes" if ok else "NO")
        print(f"  {what:<68} {value:>9.2f}  {target:<9} {mark}")


def _machine(keras) -> dict:
    """What the figures came from: versions, CPUs, memory, GPUs TF sees."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "system": platform.system(),
            "cpu": cpu, "cpus": os.cpu_count(), "memory_bytes": memory,
            "gpus": len(tf.config.list_physical_devices("GPU"))}


def _write_json(path: str, out: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument("--markdown", help="also write the results as a Markdown page "
                        "(docs/benchmarks.md)")
    parser.add_argument("--render", metavar="RESULTS_JSON",
                        help="run nothing: write the --markdown page (or print it) from the "
                        "results an earlier --json run wrote")
    parser.add_argument("--note", help="a line about the machine the page shows "
                        "(recorded in the results), e.g. that it was shared")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", choices=["a", "b"], help="one model only")
    parser.add_argument("--section", action="append",
                        choices=["all", "foundation", "twins", "migrate", "ensemble",
                                 "checkpointing", "completeness", "untrusted", "cli",
                                 "formats", "distribute", "io", "wide", "remote",
                                 "safetensors", "average", "sharded"],
                        help="run this section (repeatable; default all)")
    parser.add_argument("--migrate-tensors", type=int, default=16,
                        help="float32 4096x4096 tensors in the migrate source (16: ~1.07 GB)")
    parser.add_argument("--io-sizes", default="1024,100",
                        help="section io: model sizes in MiB (1024: 16 x 4096x4096 float32)")
    parser.add_argument("--wide-sizes", default="2000,20000,200000",
                        help="section wide: root children of the wide checkpoints")
    parser.add_argument("--remote-size-mib", "--size-mib", type=int, default=512,
                        help="section remote: the model's size in MiB (16 for a smoke run)")
    parser.add_argument("--safetensors-layers", type=int, default=2,
                        help="section safetensors: decoder layers of the Llama backbone "
                        "(2: a ~215 MB file)")
    parser.add_argument("--average-size-mib", type=float, default=512,
                        help="section average: the size of each of the 8 checkpoints in MiB "
                        "(16 for a smoke run)")
    parser.add_argument("--sharded-mib", type=float, default=1024,
                        help="section sharded: the embedding table's size in MiB, in 2 shards "
                        "on 2 parameter servers (16 for a smoke run)")
    parser.add_argument("--merge", action="store_true",
                        help="with --json: keep the existing file's sections this run did "
                        "not run (and its command), adding this run's")
    parser.add_argument("--steps", type=int, default=12, help="training steps per variant")
    parser.add_argument("--batch", type=int, default=512, help="batch of the training loop")
    args = parser.parse_args(argv)
    import page

    if args.render:
        with open(args.render) as f:
            out = json.load(f)
        text = page.render(out, results_path=args.render)
        if args.markdown:
            page.write(args.markdown, text)
        else:
            sys.stdout.write(text)
        return 0
    # The benchmarks' scratch folders (theirs and their child processes') go into one folder,
    # removed when the run ends, however it ends.
    scratch = tempfile.mkdtemp(prefix="objckpt-bench-run-")
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = scratch, scratch
    earlier = None
    if args.merge and args.json and os.path.exists(args.json):
        with open(args.json) as f:  # read before the run writes the file after each result
            earlier = json.load(f)
    try:
        out = run(args, argv if argv is not None else sys.argv[1:], earlier)
    finally:
        tempfile.tempdir = saved[0]
        if saved[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[1]
        shutil.rmtree(scratch, ignore_errors=True)
    if earlier is not None:
        out = merge(earlier, out)
    if args.json:
        _write_json(args.json, out)
    if args.markdown:
        page.write(args.markdown, page.render(out, results_path=args.json))
    return 0


def merge(old: dict, out: dict) -> dict:
    """The earlier results `old` with the sections `out` ran replaced by `out`'s; the earlier
    run's command, settings and machine stay, and this run's are recorded under `merged`."""
    ran = {s["section"] for s in out["sections"]}
    keys = {key for key in out if key not in (
        "tensorflow", "keras", "machine", "command", "note", "settings", "sections",
        "seconds", "merged", "skipped")}
    merged = {key: value for key, value in old.items() if key not in keys}
    merged["sections"] = [s for s in old.get("sections", []) if s["section"] not in ran]
    merged["sections"] += out["sections"]
    merged["seconds"] = {**old.get("seconds", {}), **out["seconds"]}
    for key in keys:
        merged[key] = out[key]
    asked = set(out["settings"].get("section") or ["all"])
    merged["skipped"] = [r for r in old.get("skipped", []) if r.split(":", 1)[0] not in asked]
    merged["skipped"] += out.get("skipped", [])
    if not merged["skipped"]:
        del merged["skipped"]
    merged["merged"] = [m for m in old.get("merged", []) if not set(m["sections"]) <= ran]
    if ran:
        merged["merged"].append({"sections": sorted(ran), "command": out["command"],
                                 "note": out["note"], "settings": out["settings"],
                                 "machine": out["machine"]})
    return merged


def run(args, argv, earlier: dict | None = None) -> dict:
    """Runs the sections `args` asks for, printing each; returns the results (what --json
    writes): per section, and in `sections` in the order they ran. `earlier` (--merge): the
    results file's former content, merged into what is written after each result."""
    import bench_twins

    keras = _keras()
    sections_asked = set(args.section or ["all"])

    def wanted(name):
        return "all" in sections_asked or name in sections_asked

    print(f"TF {tf.__version__}, Keras {keras.__version__}, NumPy {np.__version__}, "
          f"{os.cpu_count()} CPUs; median of {args.repeats} interleaved rounds")
    builders = {"a": build_mlp, "b": build_many}
    out = {"tensorflow": tf.__version__, "keras": keras.__version__,
           "machine": _machine(keras),
           "command": "python3 benchmarks/run.py " + " ".join(shlex.quote(a) for a in argv),
           "note": args.note,
           "settings": {k: v for k, v in vars(args).items()
                        if k not in ("json", "markdown", "render", "note")},
           "sections": [], "seconds": {}}
    last = [time.perf_counter()]

    def show(section, title, result, key, many=True, printer=None):
        """Prints one result under its title and records it."""
        now = time.perf_counter()
        seconds = out["seconds"]
        seconds[section] = round(seconds.get(section, 0.0) + now - last[0], 1)
        last[0] = now
        if many:
            out.setdefault(key, []).append(result)
        else:
            out[key] = result
        out["sections"].append({"section": section, "title": title, "result": result})
        print(f"\n{title}", flush=True)
        (printer or (lambda r: _print_result("", r)))(result)
        if args.json:  # after each result: an interrupted run keeps what it measured
            _write_json(args.json, out if earlier is None else merge(earlier, out))

    for key, builder in builders.items():
        if args.only and key != args.only:
            continue
        if wanted("foundation"):
            result = bench_model(builder(keras), args.repeats)
            result["ratios"] = ratios(result)
            show("foundation", f"[foundation] ({key}) {result['model']}: "
                 f"{result['variables']} variables, {result['parameters'] / 1e6:.1f}M "
                 f"parameters, {result['bytes'] / 1e6:.1f} MB", result, "foundation")
        if wanted("twins"):
            result = bench_twins.bench_sync(builder, keras, args.repeats)
            show("twins", f"[twins] ({key}) {result['model']}: {result['variables']} "
                 f"variables, {result['bytes'] / 1e6:.1f} MB", result, "twins")
    if wanted("twins") and args.only != "b":
        result = bench_twins.bench_training(build_mlp, keras, args.steps, args.batch)
        show("twins", f"[twins] (a) {result['model']} in an Adam custom loop, batch "
             f"{result['batch']}", result, "twins_training")
    if wanted("migrate"):
        import bench_migrate

        result = bench_migrate.bench_migrate(count=args.migrate_tensors)
        show("migrate", f"[migrate] name-based checkpoint, {result['model']}, "
             f"{result['bytes'] / 1e9:.2f} GB; one subprocess per run, medians of 5",
             result, "migrate", many=False)
        result = bench_migrate.bench_restore_on_create(keras)
        show("migrate", f"[restore_on_create] {result['model']}", result,
             "restore_on_create", many=False)
    if wanted("ensemble"):
        import bench_ensemble

        for title, result in (("ensemble", bench_ensemble.bench_ensemble(keras, args.repeats)),
                              ("load_ensemble", bench_ensemble.bench_load(keras, args.repeats))):
            show("ensemble", f"[{title}] {result['model']}", result, title, many=False)
        freezer_models = {"s": (lambda k: bench_ensemble.small_mlp(k, 0), "small MLP", 64),
                          "a": (build_mlp, "mlp_25m", args.batch),
                          "b": (build_many, "many_500", args.batch)}
        for key, (builder, name, batch) in freezer_models.items():
            if args.only and key in ("a", "b") and key != args.only:
                continue
            result = bench_ensemble.bench_freezer(name, builder(keras), keras, batch,
                                                  args.repeats)
            show("ensemble", f"[freezer] ({key}) {result['model']}, Adam step in a "
                 "tf.function", result, "freezer")
    if wanted("completeness") and args.only != "b":
        import bench_completeness

        result = bench_completeness.bench_snapshot_into_twin(build_mlp, keras, args.repeats)
        show("completeness", f"[completeness] (a) snapshot of one instance into another: "
             f"{result['model']}", result, "snapshot_into_twin", many=False)
        result = bench_completeness.bench_vit_coverage(keras, args.repeats)
        if result is None:
            print("\n[completeness] keras-hub is not installed: ViT coverage not measured")
        else:
            show("completeness", f"[completeness] {result['model']}", result,
                 "vit_coverage", many=False)
    if wanted("untrusted") and args.only != "b":
        import bench_untrusted

        for title, result in (
                ("validation, 1,000 variables", bench_untrusted.bench_validation(keras,
                                                                                 args.repeats)),
                ("large object graph", bench_untrusted.bench_large_graph(
                    keras, max(3, args.repeats // 3)))):
            show("untrusted", f"[untrusted: {title}] {result['model']}", result, "untrusted")
    if wanted("cli") and args.only != "b":
        import bench_cli

        result = bench_cli.bench_cli(keras, max(3, args.repeats // 3))
        show("cli", f"[cli] {result['model']}", result, "cli", many=False)
    if wanted("formats") and args.only != "b":
        import bench_savedmodel

        if keras.__version__.startswith("3"):
            result = bench_savedmodel.bench_savedmodel(keras, max(5, args.repeats // 2))
            show("formats", f"[formats: SavedModel] {result['model']}", result, "formats")
            import bench_h5

            for many in (False, True):
                result = bench_h5.bench_h5(keras, max(5, args.repeats // 2), many=many)
                show("formats", f"[formats: Keras 3 .weights.h5] {result['model']}", result,
                     "formats")
        import bench_legacyh5

        result = bench_legacyh5.bench_legacyh5(max(5, args.repeats // 2))
        if result is not None:  # needs tf_keras, or TF <= 2.15's Keras 2
            show("formats", f"[formats: Keras 2 .h5] {result['model']}", result, "formats")
    if wanted("distribute") and args.only != "b":
        import bench_distribute

        result = bench_distribute.bench_distribute(args.repeats)
        show("distribute", f"[distribute] (a) MirroredStrategy: {result['model']}", result,
             "distribute", many=False)
    if wanted("checkpointing") and args.only != "b":
        import bench_checkpointing

        results = bench_checkpointing.run(keras, build_mlp, args.repeats)
        for title, result in results.items():
            show("checkpointing", f"[checkpointing: {title}] (a) {result['description']}",
                 result, "checkpointing")
    if wanted("io"):
        import bench_io

        for title, result in bench_io.run(bench_io.parse_sizes(args.io_sizes), args.repeats):
            result = {"title": title, **result}
            show("io", f"[io: {title}] {result['model']}", result, "io",
                 printer=bench_io.print_result)
    if wanted("wide") and args.only != "b":
        import bench_wide

        for title, result in bench_wide.bench_wide(bench_wide.parse_sizes(args.wide_sizes),
                                                   max(1, args.repeats // 5)):
            show("wide", f"[wide: {title}] {result['model']}", result, "wide",
                 printer=bench_wide.print_result)
    if wanted("remote") and args.only != "b":
        import bench_remote

        results, skipped = bench_remote.run(args.remote_size_mib, max(1, min(args.repeats, 3)))
        for title, result in results:
            show("remote", f"[remote: {title}] {result['model']}", result, "remote",
                 printer=bench_remote.print_result)
        for reason in skipped:
            print(f"\n[remote] skipped: {reason}")
            out.setdefault("skipped", []).append(f"remote: {reason}")
    if wanted("safetensors") and args.only != "b":
        import bench_safetensors

        result, skipped = bench_safetensors.bench_safetensors(max(1, min(args.repeats, 3)),
                                                              args.safetensors_layers)
        if result is None:
            print(f"\n[safetensors] skipped: {skipped}")
            out.setdefault("skipped", []).append(f"safetensors: {skipped}")
        else:
            show("safetensors", "[safetensors: a Hugging Face folder into a keras-hub "
                 f"backbone] {result['model']}", result, "safetensors",
                 printer=bench_safetensors.print_result)
        for title, result in bench_safetensors.bench_memory():
            if isinstance(result, str):
                print(f"\n[safetensors] skipped: {result}")
                out.setdefault("skipped", []).append(f"safetensors: {result}")
                continue
            show("safetensors", f"[safetensors: {title}] {result['model']}", result,
                 "safetensors", printer=bench_safetensors.print_result)
    if wanted("average") and args.only != "b":
        import bench_average

        result = bench_average.bench_average(args.average_size_mib,
                                             max(1, min(args.repeats, 3)))
        show("average", f"[average] {result['model']}", result, "average", many=False,
             printer=bench_average.print_result)
    if wanted("sharded") and args.only != "b":
        import bench_sharded

        skipped = bench_sharded.available()
        if skipped is not None:
            print(f"\n[sharded] skipped: {skipped}")
            out.setdefault("skipped", []).append(f"sharded: {skipped}")
        else:
            result = bench_sharded.bench_sharded(args.sharded_mib, max(1, min(args.repeats, 9)))
            show("sharded", f"[sharded] {result['model']}", result, "sharded", many=False,
                 printer=bench_sharded.print_result)
    return out


if __name__ == "__main__":
    sys.exit(main())
