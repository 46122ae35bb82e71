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

from timing import against_load_weights, mlp_100mb

TARGET = "<= 1.2x"


def bench_h5(keras, repeats: int, *, many: bool = False) -> dict:
    """Times restore from a Keras 3 `.weights.h5`; returns the result with its ratio rows.

    many: ResNet50 (random weights, 320 variables, ~100 MB) instead of the 3-layer MLP: the
    cost of laying out a model of many layers (Keras's own saving walk) shows there.
    """
    build = (lambda seed: keras.applications.ResNet50(weights=None)) if many else \
        (lambda seed: mlp_100mb(keras, seed))
    source = build(1)
    path = os.path.join(tempfile.mkdtemp(prefix="objckpt-bench-h5-"), "w.weights.h5")
    source.save_weights(path)
    model = build(2)
    return against_load_weights(source, model, path, "w.weights.h5", "Keras 3 save_weights",
                                repeats, TARGET)


if __name__ == "__main__":
    import keras

    for many in (False, True):
        result = bench_h5(keras, 7, many=many)
        print(result["model"])
        for name, value in result["ms"].items():
            print(f"  {name:<44} {value:>10.1f} ms")
        for what, value, target, ok in result["ratios"]:
            print(f"  {what:<60} {value:6.2f}  {target} {'' if ok is None else ok}")
