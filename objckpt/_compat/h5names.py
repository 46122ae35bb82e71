"""The names Keras's HDF5 `save_weights("w.h5")` gives a live obj's weights, every flavour.

Keras 2 and tf_keras write each top-level layer of a model (`model.layers`) as a group named
by the layer, listing its weights by `variable.name` (`dense/kernel:0`); the model's own
weights go to the group `top_level_model_weights`. Keras 3 writes the same layout (its legacy
`.h5` saving) with `variable.path` (`head/dense/kernel`). `objckpt._formats.legacyh5.weight_key`
turns (layer name, weight name) into the key a file's weight has, so the obj's side and the
file's side meet.
"""

from __future__ import annotations

from objckpt._compat.variables import as_variable

__all__ = ["keras_h5_weights"]

TOP_LEVEL = "top_level_model_weights"


def _weight_name(variable) -> str:
    path = getattr(variable, "path", None)  # Keras 3 variables: the path the file stores
    return path if isinstance(path, str) else str(getattr(variable, "name", ""))


def keras_h5_weights(obj, *, grouped: bool = False) -> list:
    """[(top-level layer name, weight name, variable)] as Keras's HDF5 `save_weights` names
    obj's weights (the TF variable behind a Keras 3 one); [] for an obj that is not a Keras
    model (a layer, a `tf.Module`).

    With grouped=True: [(layer name, [variables])] for the layers with weights in
    `model.layers` order, each layer's weights as Keras writes and loads them
    (`trainable_weights + non_trainable_weights`, a variable shared by two layers in both),
    then `top_level_model_weights` (the model's own weights, in no layer) if it has any: the
    sequence Keras's `load_weights` pairs with a file's layers by position.
    """
    layers = getattr(obj, "layers", None)
    weights = getattr(obj, "weights", None)
    if not isinstance(layers, (list, tuple)) or not isinstance(weights, (list, tuple)) or \
            not callable(getattr(obj, "save_weights", None)):
        return []
    if grouped:
        return _grouped(obj, layers)
    out, seen = [], set()
    for layer in layers:
        name = getattr(layer, "name", None)
        for variable in getattr(layer, "weights", None) or ():
            if isinstance(name, str) and id(variable) not in seen:
                seen.add(id(variable))
                out.append((name, _weight_name(variable), _assignable(variable)))
    for variable in weights:  # the model's own weights, in no layer
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append((TOP_LEVEL, _weight_name(variable), _assignable(variable)))
    return out


def _assignable(variable):
    """The TF variable behind a Keras 3 variable (the one an obj's tree holds)."""
    inner = as_variable(variable)
    return variable if inner is None else inner


def _legacy_order(layer) -> list:
    """A layer's weights in the order Keras's HDF5 saving lists them."""
    trainable = getattr(layer, "trainable_weights", None)
    frozen = getattr(layer, "non_trainable_weights", None)
    if isinstance(trainable, (list, tuple)) and isinstance(frozen, (list, tuple)):
        return [_assignable(v) for v in (*trainable, *frozen)]
    return [_assignable(v) for v in getattr(layer, "weights", None) or ()]


def _grouped(obj, layers) -> list:
    out, seen = [], set()
    for layer in layers:
        name = getattr(layer, "name", None)
        variables = _legacy_order(layer)
        seen.update(id(v) for v in variables)
        if variables and isinstance(name, str):
            out.append((name, variables))
    own = [v for v in _legacy_order(obj) if id(v) not in seen]
    if own:
        out.append((TOP_LEVEL, own))
    return out
