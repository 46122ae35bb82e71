"""Restore from a Keras 3 `.weights.h5`: objckpt against Keras's own loader (issue 21).

A ~100 MB Keras 3 MLP (25M float32 parameters in 3 Dense layers) is saved with
`model.save_weights("w.weights.h5")`; a second instance of the same architecture then
receives its weights:

- `objckpt.restore(model, "w.weights.h5")`: the file's structure and every dataset's header
  validated (`_h5`), the obj's Keras 3 layout computed, a plan made ("keras layout"), each
  dataset read once into memory and checked, then fused assigns (all or nothing);
- the native path: `model.load_weights("w.weights.h5")` (Keras reads each dataset with
  h5py and assigns it; no plan, no checks before assigning, the same flavour only).

The same again for ResNet50 (320 variables, ~100 MB): many layers to lay out and plan.

Target: objckpt <= 1.2x the native path. Interleaved rounds, page cache warm for all.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

import objckpt

from timing import met, time_ops

TARGET = "<= 1.2x"


def _mlp(keras, seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((1024,))
    x = keras.layers.Dense(4096, activation="relu", name="up")(inputs)
    x = keras.layers.Dense(4096, activation="relu", name="mid")(x)
    outputs = keras.layers.Dense(1024, name="down")(x)
    return keras.Model(inputs, outputs, name="mlp_100mb")


def bench_h5(keras, repeats: int, *, many: bool = False) -> dict:
    """Times restore from a Keras 3 `.weights.h5`; returns the result with its ratio rows.

    many: ResNet50 (random weights, 320 variables, ~100 MB) instead of the 3-layer MLP: the
    cost of laying out a model of many layers (Keras's own saving walk) shows there.
    """
    build = (lambda seed: keras.applications.ResNet50(weights=None)) if many else \
        (lambda seed: _mlp(keras, seed))
    source = build(1)
    path = os.path.join(tempfile.mkdtemp(prefix="objckpt-bench-h5-"), "w.weights.h5")
    source.save_weights(path)
    model = build(2)
    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.variables)

    report = objckpt.restore(model, path)
    assert len(report.restored) == len(model.variables), report
    for mine, theirs in zip(model.variables, source.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    ms = time_ops({
        "objckpt.restore(model, w.weights.h5)": lambda: objckpt.restore(model, path),
        "model.load_weights(w.weights.h5)": lambda: model.load_weights(path),
    }, repeats)
    ratio = ms["objckpt.restore(model, w.weights.h5)"] / ms["model.load_weights(w.weights.h5)"]
    return {"model": f"{model.name}: Keras 3 save_weights, {len(model.variables)} variables, "
                     f"{nbytes / 1e6:.0f} MB",
            "bytes": nbytes, "ms": ms,
            "ratios": [("restore(.weights.h5) / model.load_weights", ratio, TARGET,
                        met(ratio, TARGET))]}


if __name__ == "__main__":
    import keras

    for many in (False, True):
        result = bench_h5(keras, 7, many=many)
        print(result["model"])
        for name, value in result["ms"].items():
            print(f"  {name:<44} {value:>10.1f} ms")
        for what, value, target, ok in result["ratios"]:
            print(f"  {what:<60} {value:6.2f}  {target} {'' if ok is None else ok}")
