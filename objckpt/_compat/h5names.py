"""The names Keras's HDF5 `save_weights("w.h5")` gives a live obj's weights, every flavour.

Keras 2 and tf_keras write each top-level layer of a model (`model.layers`) as a group named
by the layer, listing its weights by `variable.name` (`dense/kernel:0`); the model's own
weights go to the group `top_level_model_weights`. Keras 3 writes the same layout (its legacy
`.h5` saving) with `variable.path` (`head/dense/kernel`). `objckpt._legacyh5.weight_key`
turns (layer name, weight name) into the key a file's weight has, so the obj's side and the
file's side meet.
"""

from __future__ import annotations

__all__ = ["keras_h5_weights"]

TOP_LEVEL = "top_level_model_weights"


def _weight_name(variable) -> str:
    path = getattr(variable, "path", None)  # Keras 3 variables: the path the file stores
    return path if isinstance(path, str) else str(getattr(variable, "name", ""))


def keras_h5_weights(obj) -> list[tuple[str, str, object]]:
    """[(top-level layer name, weight name, variable)] as Keras's HDF5 `save_weights` names
    obj's weights; [] for an obj that is not a Keras model (a layer, a `tf.Module`)."""
    layers = getattr(obj, "layers", None)
    weights = getattr(obj, "weights", None)
    if not isinstance(layers, (list, tuple)) or not isinstance(weights, (list, tuple)) or \
            not callable(getattr(obj, "save_weights", None)):
        return []
    out, seen = [], set()
    for layer in layers:
        name = getattr(layer, "name", None)
        for variable in getattr(layer, "weights", None) or ():
            if isinstance(name, str) and id(variable) not in seen:
                seen.add(id(variable))
                out.append((name, _weight_name(variable), variable))
    for variable in weights:  # the model's own weights, in no layer
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append((TOP_LEVEL, _weight_name(variable), variable))
    return out
