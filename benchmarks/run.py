"""objckpt benchmarks: ratios against the baselines users have today, in one run.

Usage:
  python benchmarks/run.py [--json results.json] [--repeats N] [--only a|b]
                           [--section all|foundation|twins|migrate|ensemble|checkpointing|
                                      completeness|untrusted|cli|formats|distribute|io]
                           [--steps N] [--batch N] [--migrate-tensors N] [--io-sizes MiB,MiB]

Models:
  (a) a Keras MLP of ~25M parameters in ~50 variables;
  (b) a Keras model of ~500 small variables.

Every operation and its baselines are timed in the same process, interleaved
round by round, and each figure is the median over rounds (as timeit does, a
sample of a fast operation runs it several times back to back, with the
garbage collector off; see timing.py). Ratios (baseline
time / objckpt time) are what to compare across machines; absolute times
depend on the machine. The physical limit is NumPy copying the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

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


def main(argv=None) -> int:
    import bench_twins

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", choices=["a", "b"], help="one model only")
    parser.add_argument("--section",
                        choices=["all", "foundation", "twins", "migrate", "ensemble",
                                 "checkpointing", "completeness", "untrusted", "cli",
                                 "formats", "distribute", "io"],
                        default="all")
    parser.add_argument("--migrate-tensors", type=int, default=16,
                        help="float32 4096x4096 tensors in the migrate source (16: ~1.07 GB)")
    parser.add_argument("--io-sizes", default="1024,100",
                        help="section io: model sizes in MiB (1024: 16 x 4096x4096 float32)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per variant")
    parser.add_argument("--batch", type=int, default=512, help="batch of the training loop")
    args = parser.parse_args(argv)
    keras = _keras()
    print(f"TF {tf.__version__}, Keras {keras.__version__}, NumPy {np.__version__}, "
          f"{os.cpu_count()} CPUs; median of {args.repeats} interleaved rounds")
    builders = {"a": build_mlp, "b": build_many}
    out = {"tensorflow": tf.__version__, "keras": keras.__version__}
    for key, builder in builders.items():
        if args.only and key != args.only:
            continue
        if args.section in ("all", "foundation"):
            result = bench_model(builder(keras), args.repeats)
            result["ratios"] = ratios(result)
            out.setdefault("foundation", []).append(result)
            print(f"\n[foundation] ({key}) {result['model']}: {result['variables']} variables, "
                  f"{result['parameters'] / 1e6:.1f}M parameters, {result['bytes'] / 1e6:.1f} MB")
            _print_result(key, result)
        if args.section in ("all", "twins"):
            result = bench_twins.bench_sync(builder, keras, args.repeats)
            out.setdefault("twins", []).append(result)
            print(f"\n[twins] ({key}) {result['model']}: {result['variables']} variables, "
                  f"{result['bytes'] / 1e6:.1f} MB")
            _print_result(key, result)
    if args.section in ("all", "twins") and args.only != "b":
        result = bench_twins.bench_training(build_mlp, keras, args.steps, args.batch)
        out.setdefault("twins_training", []).append(result)
        print(f"\n[twins] (a) {result['model']} in an Adam custom loop, batch {result['batch']}")
        _print_result("a", result)
    if args.section in ("all", "migrate"):
        import bench_migrate

        result = bench_migrate.bench_migrate(count=args.migrate_tensors)
        out["migrate"] = result
        print(f"\n[migrate] name-based checkpoint, {result['model']}, "
              f"{result['bytes'] / 1e9:.2f} GB; one subprocess per run, medians of 5")
        _print_result("", result)
        result = bench_migrate.bench_restore_on_create(keras)
        out["restore_on_create"] = result
        print(f"\n[restore_on_create] {result['model']}")
        _print_result("", result)
    if args.section in ("all", "ensemble"):
        import bench_ensemble

        for title, result in (("ensemble", bench_ensemble.bench_ensemble(keras, args.repeats)),
                              ("load_ensemble", bench_ensemble.bench_load(keras, args.repeats))):
            out[title] = result
            print(f"\n[{title}] {result['model']}")
            _print_result("", result)
        freezer_models = {"s": (lambda k: bench_ensemble.small_mlp(k, 0), "small MLP", 64),
                          "a": (build_mlp, "mlp_25m", args.batch),
                          "b": (build_many, "many_500", args.batch)}
        for key, (builder, name, batch) in freezer_models.items():
            if args.only and key in ("a", "b") and key != args.only:
                continue
            result = bench_ensemble.bench_freezer(name, builder(keras), keras, batch,
                                                  args.repeats)
            out.setdefault("freezer", []).append(result)
            print(f"\n[freezer] ({key}) {result['model']}, Adam step in a tf.function")
            _print_result(key, result)
    if args.section in ("all", "completeness") and args.only != "b":
        import bench_completeness

        result = bench_completeness.bench_snapshot_into_twin(build_mlp, keras, args.repeats)
        out["snapshot_into_twin"] = result
        print(f"\n[completeness] (a) snapshot of one instance into another: {result['model']}")
        _print_result("a", result)
        result = bench_completeness.bench_vit_coverage(keras, args.repeats)
        if result is None:
            print("\n[completeness] keras-hub is not installed: ViT coverage not measured")
        else:
            out["vit_coverage"] = result
            print(f"\n[completeness] {result['model']}")
            _print_result("", result)
    if args.section in ("all", "untrusted") and args.only != "b":
        import bench_untrusted

        for title, result in (
                ("validation, 1,000 variables", bench_untrusted.bench_validation(keras,
                                                                                 args.repeats)),
                ("large object graph", bench_untrusted.bench_large_graph(
                    keras, max(3, args.repeats // 3)))):
            out.setdefault("untrusted", []).append(result)
            print(f"\n[untrusted: {title}] {result['model']}")
            _print_result("", result)
    if args.section in ("all", "cli") and args.only != "b":
        import bench_cli

        result = bench_cli.bench_cli(keras, max(3, args.repeats // 3))
        out["cli"] = result
        print(f"\n[cli] {result['model']}")
        _print_result("", result)
    if args.section in ("all", "formats") and args.only != "b":  # issue 21: other formats
        import bench_savedmodel

        if keras.__version__.startswith("3"):
            result = bench_savedmodel.bench_savedmodel(keras, max(5, args.repeats // 2))
            out.setdefault("formats", []).append(result)
            print(f"\n[formats: SavedModel] {result['model']}")
            _print_result("", result)
            import bench_h5

            for many in (False, True):
                result = bench_h5.bench_h5(keras, max(5, args.repeats // 2), many=many)
                out.setdefault("formats", []).append(result)
                print(f"\n[formats: Keras 3 .weights.h5] {result['model']}")
                _print_result("", result)
        import bench_legacyh5

        result = bench_legacyh5.bench_legacyh5(max(5, args.repeats // 2))
        if result is not None:  # needs tf_keras, or TF <= 2.15's Keras 2
            out.setdefault("formats", []).append(result)
            print(f"\n[formats: Keras 2 .h5] {result['model']}")
            _print_result("", result)
    if args.section in ("all", "distribute") and args.only != "b":  # issue 18
        import bench_distribute

        result = bench_distribute.bench_distribute(args.repeats)
        out["distribute"] = result
        print(f"\n[distribute] (a) MirroredStrategy: {result['model']}")
        _print_result("a", result)
    if args.section in ("all", "checkpointing") and args.only != "b":
        import bench_checkpointing

        results = bench_checkpointing.run(keras, build_mlp, args.repeats)
        for title, result in results.items():
            out.setdefault("checkpointing", []).append(result)
            print(f"\n[checkpointing: {title}] (a) {result['description']}")
            _print_result("a", result)
    if args.section in ("all", "io"):  # issue 20: checkpoint I/O
        import bench_io

        for title, result in bench_io.run(bench_io.parse_sizes(args.io_sizes), args.repeats):
            out.setdefault("io", []).append({"title": title, **result})
            print(f"\n[io: {title}] {result['model']}", flush=True)
            bench_io.print_result(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
