"""Keras 3's weights-file layout of a live obj: where `save_weights` would put each variable.

Keras 3 `model.save_weights("w.weights.h5")` (and the `model.weights.h5` of a `.keras` zip)
stores each object's own variables under `<path>/vars/<i>`, the path built by
`saving_lib._save_state`: a Functional or Sequential model's `layers` first, then its
attributes sorted by name (private ones last); a list's items are named by their class
(`to_snake_case`, `dense`, `dense_1`, ...), never by layer name; an object reached twice is
stored once, where first reached. A model's optimizer's variables sit at
`optimizer/vars/<i>` (an optimizer of another class that saves its own way is left out).

For a Keras 3 obj this runs Keras's own walk with a store that records what it is given.
For tf_keras and Keras 2 models it computes the same layout from the layers (Sequential and
Functional `layers`, then public layer attributes and lists of layers), each layer's own
weights trainable first, so a Keras 3 file lines up with the same architecture built in
another flavour; their optimizers lay out differently and are left out.
"""

from __future__ import annotations

import re
import sys

from objckpt import errors
from objckpt._compat.derived import saving_as_loaded
from objckpt._compat.variables import _keras3_variable_type, as_variable

__all__ = ["keras_weights_layout"]


def keras_weights_layout(obj) -> list[tuple[str, object]]:
    """[(key in a Keras 3 weights file, variable)] for obj, in Keras's saving order.

    Returns [] for objs that are not Keras models or layers (a `tf.Module`). A value a layer
    saves that is no variable of its own (a computed array) is listed with None.
    """
    if _keras3_variable_type() is not None:
        saving_lib, saveable, base_optimizer = _keras3_saving()
        if isinstance(obj, saveable):
            return _keras3_layout(obj, saving_lib, base_optimizer)
    if _legacy_layer(obj):
        out: list = []
        _legacy_walk(obj, "", out, set())
        return out
    return []


def _keras3_saving():
    """Keras 3's saving module, `KerasSaveable` and `BaseOptimizer`; a Keras 3 without them
    fails loudly (its `.weights.h5` layout could not be computed the way it writes it)."""
    try:
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from keras.src.saving import saving_lib
        from keras.src.saving.keras_saveable import KerasSaveable

        for name in ("_save_state", "H5IOStore"):
            getattr(saving_lib, name)
    except (ImportError, AttributeError) as err:
        version = getattr(sys.modules.get("keras"), "__version__", "?")
        raise errors.IncompatibleTensorFlowError(
            f"objckpt lays out Keras 3 weights files with Keras's own saving walk, which Keras "
            f"{version} does not have ({err}). Fix: install a Keras 3 objckpt supports "
            "(3.0 or newer with keras.src.saving), or restore from a TF checkpoint written "
            "with objckpt.save.") from err
    return saving_lib, KerasSaveable, BaseOptimizer


def _keras3_layout(obj, saving_lib, BaseOptimizer) -> list:
    class Recorder(saving_lib.H5IOStore):
        """Takes what `save_own_variables` stores, writes nothing."""

        def __init__(self):  # no file: H5IOStore's own __init__ would open one
            self.found: list = []
            self.at = ""

        def make(self, path, metadata=None):
            self.at = path
            return self

        def __setitem__(self, key, value):
            head = f"{self.at}/vars" if self.at else "vars"
            self.found.append((f"{head}/{key}", as_variable(value)))

        def __bool__(self):
            return True

        def close(self):
            pass

    # An optimizer saves copies of its variables (`variable.numpy()`): a read of every
    # slot, and no variable to find. The model's optimizer is laid out here instead, as its
    # `save_own_variables` does when it is the base one: `optimizer/vars/<i>`, its
    # `variables` in order; Keras's walk is told it was visited.
    optimizer, skip, extra = getattr(obj, "optimizer", None), set(), []
    if isinstance(optimizer, BaseOptimizer):
        skip.add(id(optimizer))
        if type(optimizer).save_own_variables is BaseOptimizer.save_own_variables:
            extra = [(f"optimizer/vars/{i}", as_variable(v))
                     for i, v in enumerate(optimizer.variables)]
    recorder = Recorder()
    with saving_as_loaded(obj):  # slots of computed values: the variables they load into
        saving_lib._save_state(obj, recorder, None, "", skip)
    return recorder.found + extra


def _legacy_layer(obj) -> bool:
    return any(c.__name__ == "Layer" and c.__module__.split(".")[0] in ("tf_keras", "keras")
               for c in type(obj).__mro__) and hasattr(obj, "_trainable_weights")


def _snake(name: str) -> str:  # keras.src.utils.naming.to_snake_case
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _legacy_walk(layer, path: str, out: list, seen: set) -> None:
    if id(layer) in seen:
        return
    seen.add(id(layer))
    own = list(layer._trainable_weights) + list(layer._non_trainable_weights)
    head = f"{path}/vars" if path else "vars"
    out.extend((f"{head}/{i}", as_variable(v)) for i, v in enumerate(own))
    graph_network = getattr(layer, "_is_graph_network", False) or \
        type(layer).__name__ == "Sequential"
    children = [("layers", list(layer.layers))] if graph_network else [
        (name, value) for name, value in sorted(vars(layer).items())
        if not name.startswith("_") and (_legacy_layer(value) or
                                         isinstance(value, (list, tuple, dict)))]
    for name, value in children:
        inner = f"{path}/{name}" if path else name
        if _legacy_layer(value):
            _legacy_walk(value, inner, out, seen)
        else:
            _legacy_container(value, inner, out, seen, set())


def _legacy_container(container, path: str, out: list, seen: set, containers: set) -> None:
    if id(container) in containers:
        return
    containers.add(id(container))
    used: dict = {}
    items = list(container.values()) if isinstance(container, dict) else list(container)
    for item in items:
        if _legacy_layer(item):
            name = _unique(_snake(type(item).__name__), used)
            _legacy_walk(item, f"{path}/{name}", out, seen)
        elif isinstance(item, (list, tuple, dict)):
            _legacy_container(item, f"{path}/{_unique('container', used)}", out, seen,
                              containers)


def _unique(name: str, used: dict) -> str:  # saving_lib._get_unique_name
    if name in used:
        used[name] += 1
        return f"{name}_{used[name]}"
    used[name] = 0
    return name
