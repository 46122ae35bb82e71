"""Variables of every flavour: Keras 3 wrappers, resource variables, distributed values,
and the TF types clone treats specially (looked up loudly)."""

from __future__ import annotations

import sys

import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _ResourceVariable
from tensorflow.python.trackable import base as _trackable_base

from objckpt import errors

__all__ = [
    "CONSTRAINT_ATTR",
    "as_variable",
    "clone_types",
    "fingerprint",
    "is_trackable",
    "is_unbuilt",
    "keras_variables",
    "lookup",
    "optional",
    "plain_cpu_variable",
    "read_value",
    "recreate_variable",
    "unique_id",
    "variable_name",
]


def is_trackable(obj) -> bool:
    return isinstance(obj, _trackable_base.Trackable)


def _keras3_variable_type():
    # Keras 3 variables only exist once `keras` was imported by the user, so
    # looking in sys.modules keeps objckpt from importing Keras itself.
    keras = sys.modules.get("keras")
    variable = getattr(keras, "Variable", None)
    if variable is None or not getattr(keras, "__version__", "2").startswith("3"):
        return None
    return variable


def as_variable(trackable):
    """Returns the assignable TF variable behind `trackable`, or None.

    Keras 3 `keras.Variable` objects wrap a `tf.Variable` (or a distributed
    variable under a `tf.distribute` strategy); that inner variable is the one
    to read and assign. Everything that already is a `tf.Variable` (resource,
    distributed, AutoCast) is returned as is.
    """
    if isinstance(trackable, tf.Variable):
        return trackable
    keras_variable = _keras3_variable_type()
    if keras_variable is not None and isinstance(trackable, keras_variable):
        inner = getattr(trackable, "_value", None)
        return inner if inner is not None else None
    return None


def is_unbuilt(obj) -> bool:
    """True for a Keras model or layer (any flavour) that is not built yet."""
    return getattr(obj, "built", True) is False


def variable_name(variable) -> str:
    """The variable's name without the `:0` suffix (TF1 `Saver` style)."""
    name = getattr(variable, "_shared_name", None) or variable.name
    return name[:-2] if name.endswith(":0") else name


def read_value(variable):
    """Reads a variable's current value on its own device, without copying (a sharded
    variable's: its shards read and joined)."""
    if not hasattr(variable, "value"):
        from objckpt._compat.sharded import is_sharded, read_sharded

        if is_sharded(variable):
            return read_sharded(variable)
    return variable.value()


def _variable_list(attr):
    # Keras exposes `variables` as a property; TF1-era optimizers as a method.
    if attr is None:
        return None
    return attr() if callable(attr) else attr


def keras_variables(obj) -> list:
    """The variables of a Keras model or layer (any flavour) in `obj.variables` order, as
    `tf.Variable`s; [] for other objs or an unbuilt model."""
    if not hasattr(obj, "built"):
        return []
    try:  # tf_keras raises ValueError for `variables` of an unbuilt model
        listed = list(_variable_list(obj.variables))
    except (AttributeError, TypeError, ValueError):
        return []
    return [v for v in (as_variable(value) for value in listed) if v is not None]


def fingerprint(obj):
    """Returns a cheap identity of obj's variables, or None if there is none.

    Used to decide whether a cached tree of obj is still current: Keras models
    and layers (every flavour) list their variables without walking the object
    graph, and their optimizer lists its own. Objects without such lists get
    None and are walked every time.
    """
    if not hasattr(obj, "built"):
        return None
    try:  # tf_keras raises ValueError for `variables` of an unbuilt model
        variables = list(_variable_list(obj.variables))
        optimizer = getattr(obj, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "variables"):
            variables.extend(_variable_list(optimizer.variables))
    except (AttributeError, TypeError, ValueError):
        return None
    return tuple(id(v) for v in variables)


def plain_cpu_variable(variable) -> bool:
    """Whether variable is one plain resource variable on a CPU: no distributed value, no
    wrapper (AutoCast), so kernels may write its buffer in place through its handle."""
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    if not isinstance(variable, BaseResourceVariable) or type(variable).__name__ in (
            "MirroredVariable", "SyncOnReadVariable", "AutoCastVariable"):
        return False
    try:
        return _on_cpu(variable)
    except AttributeError:  # no handle
        return False


def _on_cpu(variable) -> bool:
    device = variable.handle.device
    return not device or tf.DeviceSpec.from_string(device).device_type == "CPU"


def _keras3_variable(value) -> bool:
    variable = _keras3_variable_type()
    return variable is not None and isinstance(value, variable)


def optional(path, name):
    """Returns `name` from module `path`, or None where it is absent (for names that are
    truly optional, e.g. standard-library types on some platforms; TF internals go through
    `lookup`, which fails loudly)."""
    import importlib

    try:
        return getattr(importlib.import_module(path), name)
    except (ImportError, AttributeError):
        return None


def _tf_version() -> tuple:
    parts = []
    for part in tf.__version__.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def lookup(path: str, name: str, *, since: tuple | None = None):
    """Returns the TF internal `name` from module `path`.

    Raises `errors.IncompatibleTensorFlowError` (naming the TF version) when it is missing from
    a TF that should have it; returns None only for TFs older than `since` (where it did not
    exist yet).
    """
    found = optional(path, name)
    if found is None and (since is None or _tf_version() >= since):
        raise errors.IncompatibleTensorFlowError(
            f"objckpt needs `{path}.{name}`, which TensorFlow {tf.__version__} does not have. "
            "Fix: install a TensorFlow version objckpt supports (2.12 or newer; see README), "
            "or report this TF version to objckpt.")
    return found


def clone_types():
    """TF types `objckpt.clone` copies specially, looked up where each TF keeps them.

    A missing one raises `errors.IncompatibleTensorFlowError`, except the two TF added in
    later versions (`SymbolicTensor`, `AtomicFunction`), which are None before TF 2.16.
    """
    import types as _types

    ns = _types.SimpleNamespace()
    ns.BaseResourceVariable = lookup(
        "tensorflow.python.ops.resource_variable_ops", "BaseResourceVariable")
    ns.ResourceVariable = lookup(
        "tensorflow.python.ops.resource_variable_ops", "ResourceVariable")
    ns.UninitializedVariable = lookup(
        "tensorflow.python.ops.resource_variable_ops", "UninitializedVariable")
    ns.DistributedValues = lookup("tensorflow.python.distribute.values", "DistributedValues")
    ns.EagerTensor = type(tf.constant(0))
    ns.SymbolicTensor = lookup("tensorflow.python.framework.ops", "SymbolicTensor",
                               since=(2, 16)) or tf.Tensor
    ns.TypeSpec = tf.TypeSpec
    ns.Dimension = lookup("tensorflow.python.framework.tensor_shape", "Dimension")
    ns.Function = type(tf.function(lambda: None))
    ns.StrategyBase = lookup("tensorflow.python.distribute.distribute_lib", "StrategyBase")
    ns.StrategyExtended = lookup("tensorflow.python.distribute.distribute_lib",
                                "StrategyExtendedV1")
    ns.ReplicaContext = lookup("tensorflow.python.distribute.distribute_lib", "ReplicaContext")
    ns.EagerContext = lookup("tensorflow.python.eager.context", "Context")
    ns.Graph = tf.Graph
    ns.Operation = tf.Operation
    ns.PythonAPIDispatcher = lookup("tensorflow.python.framework._pywrap_python_api_dispatcher",
        "PythonAPIDispatcher")
    ns.ConcreteFunctionBase = lookup("tensorflow.python.types.core", "ConcreteFunction")
    ns.AtomicFunction = lookup("tensorflow.python.eager.polymorphic_function.atomic_function",
        "AtomicFunction", since=(2, 16))
    return ns


# Where a TF variable keeps its constraint (`tf.Variable(constraint=...)`).
CONSTRAINT_ATTR = "_constraint"


def unique_id(variable) -> str:
    """The string TF optimizers key slot tables by (`Variable._unique_id`; a sharded
    variable's own)."""
    found = as_variable(variable)
    return (variable if found is None else found)._unique_id


def recreate_variable(like, value, name: str):
    """A new resource variable holding `value`, with the kind, trainability, shape, dtype,
    synchronization and aggregation of `like` (created directly: it skips the tf.Variable
    creator stack, about a third of the creation time)."""
    return _ResourceVariable(
        value, trainable=like.trainable, name=name, dtype=like.dtype, shape=like.shape,
        synchronization=like.synchronization, aggregation=like.aggregation)
