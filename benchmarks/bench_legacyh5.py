"""Restore from a Keras 2 / tf_keras `.h5`: objckpt against Keras's own loader (issue 21).

A ~100 MB tf_keras MLP (25M float32 parameters in 3 Dense layers; Keras 2 of TF <= 2.15
where tf_keras is not installed) is saved with `model.save_weights("w.h5")`; a second
instance of the same architecture then receives its weights:

- `objckpt.restore(model, "w.h5")`: the file's `layer_names`/`weight_names` checked against
  its datasets and every dataset's header validated (`_legacyh5` over `_h5`), a plan made
  ("name"), each dataset read once into memory and checked, then fused assigns (all or
  nothing);
- the native path: `model.load_weights("w.h5")` (Keras reads each layer's datasets with h5py
  and assigns them with `batch_set_value`; no plan, no checks before assigning, the same
  flavour only).

Target: objckpt <= 1.2x the native path. Interleaved rounds, page cache warm for all.
"""

from __future__ import annotations

import importlib
import os
import tempfile

from timing import against_load_weights, mlp_100mb

TARGET = "<= 1.2x"


def legacy_keras():
    """tf_keras, else `keras` where it is Keras 2 (TF 2.12-2.15), else None."""
    for name in ("tf_keras", "keras"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if module.__version__.startswith("2"):
            return module
    return None


def bench_legacyh5(repeats: int) -> dict | None:
    """Times restore from a Keras 2 `.h5`; None where no Keras 2 is installed."""
    keras = legacy_keras()
    if keras is None:
        return None
    source = mlp_100mb(keras, 1)
    path = os.path.join(tempfile.mkdtemp(prefix="objckpt-bench-legacyh5-"), "w.h5")
    source.save_weights(path)
    model = mlp_100mb(keras, 2)
    return against_load_weights(source, model, path, "w.h5",
                                f"{keras.__name__} {keras.__version__} save_weights (.h5)",
                                repeats, TARGET)


if __name__ == "__main__":
    result = bench_legacyh5(7)
    if result is None:
        raise SystemExit("no Keras 2 here: pip install tf_keras, or use TF <= 2.15")
    print(result["model"])
    for name, value in result["ms"].items():
        print(f"  {name:<44} {value:>10.1f} ms")
    for what, value, target, ok in result["ratios"]:
        print(f"  {what:<60} {value:6.2f}  {target} {'' if ok is None else ok}")
