"""Restore from a SavedModel directory: objckpt against TF's own loader (issue 21).

A ~100 MB Keras 3 MLP (25M float32 parameters in 3 Dense layers) is exported with
`model.export(dir)`; a second instance of the same architecture then receives its weights:

- `objckpt.restore(model, dir)`: `saved_model.pb` decoded TF-free (functions skipped), the
  checkpoint's index validated, a plan made (by saved Keras names), then one RestoreV2 and
  fused assigns;
- the native path: `tf.saved_model.load(dir)` (the fastest loader TF has for a SavedModel:
  it restores the variables and loads the functions) and `assign` of each loaded variable to
  the model's, in `model.variables` order (the export keeps that order);
- for reference, a hand-written loop over `tf.train.load_checkpoint(dir/variables/variables)`
  keyed `variables/N/...` (it needs the export's layout known in advance).

Target: objckpt <= 1.2x the native path. Interleaved rounds, page cache warm for all.
"""

from __future__ import annotations

import os
import tempfile

import tensorflow as tf

import objckpt

from timing import met, mlp_100mb, time_ops

TARGET = "<= 1.2x"


def bench_savedmodel(keras, repeats: int) -> dict:
    """Times restore from a Keras 3 export; returns the result with its ratio rows."""
    source = mlp_100mb(keras, 1)
    directory = os.path.join(tempfile.mkdtemp(prefix="objckpt-bench-sm-"), "export")
    source.export(directory, verbose=False)
    model = mlp_100mb(keras, 2)
    variables = [getattr(v, "value", v) for v in model.variables]  # the tf.Variables
    nbytes = sum(v.shape.num_elements() * v.dtype.size for v in variables)

    def native():
        loaded = tf.saved_model.load(directory)
        for variable, value in zip(variables, loaded.variables):
            variable.assign(value)

    prefix = os.path.join(directory, "variables", "variables")

    def reader_loop():
        reader = tf.train.load_checkpoint(prefix)
        for i, variable in enumerate(variables):
            variable.assign(reader.get_tensor(f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"))

    report = objckpt.restore(model, directory)
    assert len(report.restored) == len(variables), report
    for mine, theirs in zip(model.variables, source.variables):
        tf.debugging.assert_equal(mine, theirs)
    ms = time_ops({
        "objckpt.restore(model, dir)": lambda: objckpt.restore(model, directory),
        "tf.saved_model.load(dir) + assign": native,
        "tf.train.load_checkpoint loop + assign": reader_loop,
    }, repeats)
    ratio = ms["objckpt.restore(model, dir)"] / ms["tf.saved_model.load(dir) + assign"]
    loop = ms["objckpt.restore(model, dir)"] / ms["tf.train.load_checkpoint loop + assign"]
    return {"model": f"{model.name}: Keras 3 model.export, {len(variables)} variables, "
                     f"{nbytes / 1e6:.0f} MB",
            "bytes": nbytes, "ms": ms,
            "ratios": [("restore(SavedModel dir) / tf.saved_model.load + assign", ratio,
                        TARGET, met(ratio, TARGET)),
                       ("restore(SavedModel dir) / load_checkpoint loop + assign", loop, "",
                        None)]}


if __name__ == "__main__":
    import keras

    result = bench_savedmodel(keras, 7)
    print(result["model"])
    for name, value in result["ms"].items():
        print(f"  {name:<44} {value:>10.1f} ms")
    for what, value, target, ok in result["ratios"]:
        print(f"  {what:<60} {value:6.2f}  {target} {'' if ok is None else ok}")
