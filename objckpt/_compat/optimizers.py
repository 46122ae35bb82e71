"""Optimizer internals of every flavour: which objects are optimizers, their per-variable
state lists and slots, counters, and building their state ahead of the first step."""

from __future__ import annotations

import contextlib
import re

import tensorflow as tf
from tensorflow.python.checkpoint import graph_view as _graph_view

from objckpt._base import paths as _paths
from objckpt._compat.distribute import autocast_inner, is_distributed_variable
from objckpt._compat.hooks import override_methods
from objckpt._compat.sharded import is_sharded, shards
from objckpt._compat.variables import as_variable

__all__ = ["COUNTERS", "HYPERPARAMETERS", "KERAS3_ROLES", "NAMED_SLOT", "SLOT_ALIASES", "TF1_SLOT",
           "build_optimizer", "existing_slot", "fresh_slot_value", "has_slot_variables",
           "is_optimizer_node",
           "on_slot_created", "optimizer_counters", "optimizer_slot_lists", "optimizer_state",
           "optimizers_of", "slot_owner", "unbuilt_optimizers"]


# Optimizer slot names of every flavour -> one canonical role: "m" is the first
# moment or momentum buffer, "v" the second moment (Adam v, RMSprop rms).
SLOT_ALIASES = {
    "m": "m", "Adam": "m", "adam_m": "m", "momentum": "m", "Momentum": "m",
    "RMSProp_1": "m",
    "v": "v", "Adam_1": "v", "adam_v": "v", "rms": "v", "RMSProp": "v", "velocity": "v",
    "vhat": "vhat", "velocity_hat": "vhat", "mg": "mg", "average_gradient": "mg",
    "accumulator": "accumulator", "Adagrad": "accumulator", "Ftrl": "accumulator",
    "accum": "accumulator", "linear": "linear", "Ftrl_1": "linear",
    "Adadelta": "accum_grad", "accumulated_grad": "accum_grad",
    "Adadelta_1": "accum_delta", "accum_update": "accum_delta",
    "accumulated_delta_var": "accum_delta",
    "gradient_accumulator": "gradient_accumulator", "norm": "norm",
}
# Keras 3 names an optimizer variable `<owner path, / as _>_<role>`, in `_variables`.
KERAS3_ROLES = ("velocity_hat", "average_gradient", "accumulated_delta_var",
                 "accumulated_grad", "gradient_accumulator", "momentum", "velocity",
                 "accumulator", "linear", "norm")
# A tf_keras (2.11+) / Keras 3 optimizer variable's saved name: `<opt>/<slot>/<variable name>`.
NAMED_SLOT = re.compile(r"^(?:[^/]+/)?(?P<slot>m|v|vhat|momentum|velocity|velocity_hat|"
                         r"average_gradient|accumulator|linear|accumulated_grad|"
                         r"accumulated_delta_var)/(?P<var>.+?)(?::0)?$")
# TF1 `tf.compat.v1.train` optimizers' slot names (`<var>/Adam`), and the original BERT's
# AdamWeightDecayOptimizer (`<var>/adam_m`).
TF1_SLOT = re.compile(r"^(?P<var>.+)/(?P<slot>Adam|Adam_1|adam_m|adam_v|Momentum|RMSProp|"
                       r"RMSProp_1|Adagrad|Ftrl|Ftrl_1|Adadelta|Adadelta_1)$")
COUNTERS = {"iter": "iterations", "iterations": "iterations", "global_step": "iterations",
             "learning_rate": "learning_rate", "lr": "learning_rate",
             # Keras 2's OptimizerV2 keeps its hyperparameters as variables too.
             "beta_1": "beta_1", "beta_2": "beta_2", "decay": "decay", "rho": "rho",
             "epsilon": "epsilon", "momentum": "momentum"}


HYPERPARAMETERS = frozenset({"beta_1", "beta_2", "decay", "rho", "epsilon", "momentum"})


def _is_optimizer(node) -> bool:
    # Never probe a variable: a SyncOnRead one answers an unknown attribute by reducing
    # across replicas (a collective under MultiWorkerMirroredStrategy).
    if isinstance(node, tf.Variable):
        return False
    return callable(getattr(node, "apply_gradients", None))


def _optimizers(obj) -> list:
    """obj itself, its `optimizer`, and its direct children that are optimizers."""
    found = []
    candidates = [obj, getattr(obj, "optimizer", None)]
    # An object TF cannot list the children of: just obj and its .optimizer.
    with contextlib.suppress(Exception):
        for child in _graph_view.ObjectGraphView(obj).children(obj).values():
            if isinstance(child, tf.Variable):
                continue  # never probed (see _is_optimizer)
            # tf.train.Checkpoint(model=m): m's optimizer too
            candidates.extend((child, getattr(child, "optimizer", None)))
    for candidate in list(candidates):  # what a wrapper (LossScaleOptimizer) wraps
        inner = getattr(candidate, "inner_optimizer", None)
        if inner is not None:
            candidates.append(inner)
    for candidate in candidates:
        if callable(getattr(candidate, "apply_gradients", None)) and \
                all(candidate is not f for f in found):
            found.append(candidate)
    return found


def optimizers_of(obj) -> list:
    """obj's optimizers: obj itself, its `optimizer`, its children's (and what they wrap)."""
    return _optimizers(obj)


# Lists a Keras 3 / tf_keras (2.11+) optimizer keeps per trained variable, by
# role: "m" first moment or momentum buffer, "v" second moment.
_SLOT_LISTS = (("_momentums", "m"), ("momentums", "m"), ("_velocities", "v"),
               ("_velocity_hats", "vhat"), ("_average_gradients", "mg"),
               ("_accumulators", "accumulator"), ("_linears", "linear"),
               ("_accumulated_gradients", "gradient_accumulator"), ("_m", "m"), ("_u", "norm"),
               ("_accumulated_grads", "accum_grad"),
               ("_accumulated_delta_vars", "accum_delta"))


def optimizer_slot_lists(obj, candidates=()):
    """Yields (model variable, role, optimizer variable) for list-based optimizers.

    Keras 3 and tf_keras 2.11+ optimizers keep their per-variable state in
    lists aligned with the variables they train (not as TF slot variables);
    this pairs them up. `candidates` are obj's variables, for optimizers that
    index by variable key (tf_keras) rather than keep the list (Keras 3).
    Optimizers with TF slot variables yield nothing (their slots already
    appear as `.OPTIMIZER_SLOT` paths).
    """
    for optimizer in _optimizers(obj):
        trained = getattr(optimizer, "_trainable_variables", None)
        index_dict = getattr(optimizer, "_index_dict", None)
        var_key = getattr(optimizer, "_var_key", None)
        if trained:
            pairs = [(i, _state_variable(v)) for i, v in enumerate(trained)]
        elif isinstance(index_dict, dict) and callable(var_key):
            pairs = []
            for variable in candidates:
                with contextlib.suppress(Exception):
                    # tf_keras keeps the state of a sharded variable shard by shard: its
                    # first shard's index finds the first slot shard (`_state_variable`).
                    key = var_key(shards(variable)[0] if is_sharded(variable) else variable)
                    if key in index_dict:
                        pairs.append((index_dict[key], variable))
        else:
            continue
        for attribute, role in _SLOT_LISTS:
            values = getattr(optimizer, attribute, None)
            if not isinstance(values, (list, tuple)) or not values:
                continue
            for index, variable in pairs:
                slot = _state_variable(values[index]) if index < len(values) else None
                if variable is not None and slot is not None:
                    yield variable, role, slot


def _state_variable(value):
    """`as_variable(value)`, or a sharded slot whole (sharded like its variable): given as
    itself, or by one of its shards (tf_keras lists slot shards; the `ShardedVariable` its
    checkpoint saves holds them)."""
    if is_sharded(value):
        return value
    container = getattr(value, "__dict__", {}).get("_sharded_container")
    whole = container() if callable(container) else None
    return whole if whole is not None and is_sharded(whole) else as_variable(value)


def optimizer_counters(obj):
    """Yields ("iterations" | "learning_rate", variable) of obj's optimizers."""
    for optimizer in _optimizers(obj):
        for name, attributes in (("iterations", ("_iterations", "iterations")),
                                 ("learning_rate", ("_learning_rate",))):
            for attribute in attributes:
                try:
                    value = as_variable(getattr(optimizer, attribute, None))
                except Exception:  # a property that fails before the optimizer is built
                    value = None
                if value is not None:
                    yield name, value
                    break
        hyper = getattr(optimizer, "_hyper", None)  # Keras 2 / tf_keras OptimizerV2
        if isinstance(hyper, dict):
            for name, value in hyper.items():
                if as_variable(value) is not None:
                    yield name, as_variable(value)


# --- per-variable optimizer state (Freezer) --------------------------------------

# Lists on Keras optimizers that hold variables but are not per-variable state.
_NOT_STATE_LISTS = frozenset({"_variables", "_trainable_variables", "variables",
                              "_all_variables", "_non_trainable_variables"})


def _inner_optimizers(optimizer) -> list:
    """The optimizer and those it wraps (a LossScaleOptimizer's inner optimizer)."""
    found, node = [], optimizer
    while node is not None and all(node is not f for f in found):
        found.append(node)
        node = getattr(node, "inner_optimizer", None)
    return found


def build_optimizer(optimizer, variables) -> None:
    """Creates an optimizer's per-variable state for `variables` if it has none yet.

    Keras optimizers build lazily on their first `apply_gradients`; the Freezer
    needs the state to exist before then, so it builds them the same way (in
    the init scope, so this works while a `tf.function` is being traced).
    """
    for inner in reversed(_inner_optimizers(optimizer)):
        with tf.init_scope():
            if isinstance(getattr(inner, "built", None), bool):  # Keras 3
                if not inner.built:
                    inner.build(list(variables))
                    inner.built = True
            elif callable(getattr(inner, "_create_all_weights", None)):
                inner._create_all_weights(list(variables))  # legacy OptimizerV2 (Keras 2)
            elif callable(getattr(inner, "_create_slots", None)) and \
                    callable(getattr(inner, "get_slot_names", None)):
                inner._create_slots(list(variables))  # TF1 tf.compat.v1.train optimizers
            elif callable(getattr(inner, "_var_key", None)) and \
                    callable(getattr(inner, "build", None)) and not getattr(inner, "_built", False):
                inner.build(list(variables))  # tf_keras and Keras 2 (2.11+ optimizers)


def _is_unbuilt(optimizer) -> bool:
    """Whether an optimizer holds no per-variable state yet (Keras creates it on the first
    training step): Keras 3 (`built`), tf_keras and Keras 2's 2.11+ optimizers (`_built`),
    legacy `OptimizerV2` and TF1 optimizers (no slot variables yet)."""
    built = getattr(optimizer, "built", None)
    if isinstance(built, bool) and callable(getattr(optimizer, "stateless_apply", None)):
        return not built  # Keras 3 (its optimizers have a `_var_key` too)
    if callable(getattr(optimizer, "_var_key", None)) and \
            callable(getattr(optimizer, "build", None)) and \
            not callable(getattr(optimizer, "_create_all_weights", None)):
        return not getattr(optimizer, "_built", False)  # tf_keras, Keras 2 (2.11+)
    slots = getattr(optimizer, "_slots", None)
    if isinstance(slots, dict) and (callable(getattr(optimizer, "_create_all_weights", None))
                                    or callable(getattr(optimizer, "_create_slots", None))):
        return not any(slots.values())  # legacy OptimizerV2, TF1 (no slot created yet)
    return False


def unbuilt_optimizers(obj) -> list:
    """[(optimizer, model or None)]: obj's optimizers that hold no per-variable state yet,
    each with the Keras model whose `optimizer` it is (Keras's first training step builds it
    on that model's `trainable_variables`), or None for an optimizer no model owns (a
    custom loop's, a TF1 one). An optimizer a LossScaleOptimizer wraps is listed through the
    wrapper only."""
    owners = {}
    candidates = [obj]
    with contextlib.suppress(Exception):
        candidates.extend(child for child in
                          _graph_view.ObjectGraphView(obj).children(obj).values()
                          if not isinstance(child, tf.Variable))
    for candidate in candidates:
        optimizer = getattr(candidate, "optimizer", None)
        if _is_optimizer(optimizer) and \
                isinstance(getattr(candidate, "trainable_variables", None), (list, tuple)):
            owners.setdefault(id(optimizer), candidate)
    found = _optimizers(obj)
    wrapped = {id(getattr(f, "inner_optimizer", None)) for f in found}
    return [(optimizer, owners.get(id(optimizer))) for optimizer in found
            if id(optimizer) not in wrapped and _is_unbuilt(optimizer)]


def fresh_slot_value(obj, role: str, variable):
    """The value a fresh optimizer gives a new slot of `role` (a canonical role of
    `SLOT_ALIASES`) for `variable`: the optimizer's `initial_accumulator_value` for an
    accumulator (Adagrad, Ftrl), zeros for every other role of Keras's and TF's optimizers."""
    if role == "accumulator":
        for optimizer in _optimizers(obj):
            owned = getattr(optimizer, "variables", ())
            owned = owned() if callable(owned) else owned  # TF1 optimizers: a method
            if not any(as_variable(v) is variable for v in owned or ()):
                continue
            for name in ("initial_accumulator_value", "_initial_accumulator_value"):
                initial = getattr(optimizer, name, None)
                if isinstance(initial, (int, float)) and not isinstance(initial, bool):
                    return tf.fill(variable.shape,
                                   tf.cast(initial, variable.dtype.base_dtype))
    return tf.zeros(variable.shape, variable.dtype.base_dtype)


def optimizer_state(optimizer, variables) -> dict:
    """id(variable) -> the optimizer variables that hold state for it.

    Keras 3, tf_keras and Keras 2 (2.11+) optimizers keep their state in
    lists aligned with the variables they train (momentums, velocities, EMA
    copies, gradient accumulators, ...); every such list is found, not only
    known names. Legacy OptimizerV2 and TF1 optimizers keep TF slot variables.
    """
    state: dict = {id(v): [] for v in variables}
    for inner in _inner_optimizers(optimizer):
        indexed = _variable_index(inner, variables)
        if indexed is not None:
            index_of, count = indexed
            for name, value in vars(inner).items():
                if name in _NOT_STATE_LISTS or not isinstance(value, (list, tuple)) \
                        or len(value) != count or not value:
                    continue
                slots = [as_variable(v) if v is not None else None for v in value]
                if any(s is None and v is not None for s, v in zip(slots, value)) or \
                        all(s is None for s in slots):
                    continue
                for index, variable_id in index_of.items():
                    slot = slots[index]
                    if slot is not None and id(slot) != variable_id:
                        state[variable_id].append(slot)
            continue
        names = getattr(inner, "get_slot_names", None)
        if not callable(names):
            continue
        for variable in variables:
            for slot_name in names():
                with contextlib.suppress(KeyError, ValueError, AttributeError):
                    slot = inner.get_slot(variable, slot_name)
                    if as_variable(slot) is not None:
                        state[id(variable)].append(as_variable(slot))
    return state


def _variable_index(optimizer, variables):
    """({index in the state lists: id(variable)}, list length), or None (slot-based)."""
    trained = getattr(optimizer, "_trainable_variables", None)
    if isinstance(trained, (list, tuple)) and trained:  # Keras 3
        wanted = {id(v) for v in variables}
        return {i: id(as_variable(t)) for i, t in enumerate(trained)
                if as_variable(t) is not None and id(as_variable(t)) in wanted}, len(trained)
    index_dict = getattr(optimizer, "_index_dict", None)
    var_key = getattr(optimizer, "_var_key", None)
    if isinstance(index_dict, dict) and index_dict and callable(var_key):  # tf_keras, Keras 2
        out = {}
        for variable in variables:
            with contextlib.suppress(Exception):
                key = var_key(variable)
                if key in index_dict:
                    out[index_dict[key]] = id(variable)
        return out, len(index_dict)
    return None


def is_optimizer_node(graph, node_id: int, local_name: str) -> bool:
    """Whether a node of a checkpoint's object graph is an optimizer (every flavour): its
    edge name, slot variables, or step counter tell. See `_paths.is_optimizer_node` (pure)."""
    return _paths.is_optimizer_node(graph, node_id, local_name)


# --- slot variables created later (restore_on_create) -------------------------------


def slot_owner(variable):
    """The variable a slot belongs to, as one object for every view of it: a Keras 3
    variable's inner one, an AutoCastVariable's wrapped one, a replica's component's
    distributed container. Compare with `is`."""
    variable = as_variable(variable) if as_variable(variable) is not None else variable
    if autocast_inner(variable) is not None:
        variable = autocast_inner(variable)
    if is_distributed_variable(type(variable)):
        return variable  # a distributed variable itself: never probed (SyncOnRead reduces)
    container = getattr(variable, "__dict__", {}).get("_distributed_container")  # a component
    owner = container() if callable(container) else None
    return owner if owner is not None else variable


def on_slot_created(optimizer, callback):
    """Calls `callback(slot_name, variable, slot_variable)` each time `optimizer` creates a
    slot variable, right after creating it (and after TF's own deferred slot restore), before
    its first use: Keras 2 / tf_keras legacy `OptimizerV2` (`add_slot`) and TF1
    `tf.compat.v1.train` optimizers (`_zeros_slot`, `_get_or_make_slot`) both end a slot's
    creation in `_restore_slot_variable`, which is wrapped on this instance.

    A LossScaleOptimizer's slots are created by the optimizer it wraps (which stands for
    it in the object graph): that one is watched too.

    Returns [(object, undo for `restore_methods`)], empty when the optimizer keeps no TF
    slot variables (Keras 3 and 2.11+ optimizers keep per-variable lists).
    """
    if isinstance(optimizer, tf.Variable):
        return []
    undo = []
    for inner in _inner_optimizers(optimizer):
        original = getattr(inner, "_restore_slot_variable", None)
        if callable(original):
            undo.append((inner, override_methods(
                inner, {"_restore_slot_variable": _slot_hook(original, callback)})))
    return undo


def _slot_hook(original, callback):
    def _restore_slot_variable(slot_name, variable, slot_variable):
        result = original(slot_name=slot_name, variable=variable, slot_variable=slot_variable)
        callback(slot_name, variable, slot_variable)
        return result
    return _restore_slot_variable


def has_slot_variables(node) -> bool:
    """Whether node is an optimizer that keeps TF slot variables and creates its state
    lazily (Keras 2 / tf_keras legacy `OptimizerV2`, TF1 optimizers), which
    `on_slot_created` can watch."""
    return _is_optimizer(node) and callable(getattr(node, "_restore_slot_variable", None))


def existing_slot(optimizer, variable, slot_name):
    """The slot variable `optimizer` already holds for `variable`, or None."""
    get_slot = getattr(optimizer, "get_slot", None)
    if not callable(get_slot):
        return None
    try:
        return as_variable(get_slot(variable, slot_name))
    except Exception:  # no such slot yet (KeyError in Keras 2, None in TF1)
        return None
