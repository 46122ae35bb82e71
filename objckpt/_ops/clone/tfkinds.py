"""The copiers of TensorFlow's kinds: variables (re-created, distributed ones under their own
strategy), tensors, `tf.function`s and traced functions (see the package's docstring).

Each is `copier(walker, x, path)`, listed in `table.COPIERS`.
"""

from __future__ import annotations

import re

import tensorflow as tf

from objckpt import _compat
from objckpt._ops.clone.walker import path_str
from objckpt.errors import DistributedVariableError, ObjckptError

__all__ = ["concrete_function", "copy_caching", "copy_distributed", "copy_sharded",
           "copy_variable",
           "create_distributed",
           "create_tree_distributed", "eager_tensor", "fill_variable", "tf_function"]

_UninitializedVariable = _compat.clone_types().UninitializedVariable


def copy_distributed(walker, v, path):
    """A MirroredVariable / SyncOnReadVariable re-created under v's own strategy.

    The first one met creates every distributed variable of the obj's tree first, in
    TF's object-graph order: every worker of a multi-worker strategy creates the same
    variables in the same order (TF pairs each new variable's initial-value broadcast
    across workers by creation order), whatever order this walk meets them in.
    """
    reason = _compat.distributed_refusal(v)
    if reason is not None:
        kind, where = type(v).__name__, path_str(path)
        raise DistributedVariableError(
            f"objckpt.clone cannot copy the {kind} at `{where}`: {reason}. clone "
            "re-creates MirroredVariable and SyncOnReadVariable (MirroredStrategy, "
            "MultiWorkerMirroredStrategy) under their own strategy; it cannot re-create "
            f"a {kind} faithfully. Fix: build the model under MirroredStrategy or "
            "MultiWorkerMirroredStrategy (or ParameterServerStrategy without a "
            "variable_partitioner), or build a fresh obj instead of cloning, e.g. "
            "objckpt.Twins(model, past=factory()) where factory() returns a new, "
            "identically built model.", where, kind)
    strategy = v.distribute_strategy
    running = _compat.replica_context_strategy()
    if running is not None:
        walker.fail(v, path, "clone was called inside `strategy.run` (a replica context), "
                    "where no variable can be created; call objckpt.clone outside "
                    "strategy.run (inside or outside `strategy.scope()`)")
    if tf.distribute.has_strategy() and tf.distribute.get_strategy() is not strategy:
        walker.fail(v, path, f"it belongs to a {type(strategy).__name__}, but clone was "
                    f"called inside the scope of another strategy "
                    f"({type(tf.distribute.get_strategy()).__name__}); the copy is created "
                    "under the original's strategy, so call objckpt.clone outside that "
                    "scope (or inside the original's `strategy.scope()`)")
    if not walker.distributed_ready:
        walker.distributed_ready = True
        create_tree_distributed(walker)
        if id(v) in walker.memo:
            return walker.memo[id(v)]
    return create_distributed(walker, v, path)


def create_tree_distributed(walker):
    """Creates the copies of the obj tree's distributed variables in the tree's order."""
    if not _compat.is_trackable(walker.root_obj):
        return
    try:
        found = _compat.variable_paths(walker.root_obj)
    except (ObjckptError, TypeError, ValueError, AttributeError):
        return  # the walk meets them in its own (deterministic) order, or refuses them
    for object_path, variable in found:
        variable = _compat.autocast_inner(variable) or variable
        if (id(variable) not in walker.memo
                and _compat.is_distributed_variable(type(variable))
                and _compat.distributed_refusal(variable) is None):
            create_distributed(walker, variable, (walker.root, "object path", object_path))


def create_distributed(walker, v, path):
    """One distributed variable re-created under its strategy, each replica valued."""
    originals = _compat.replica_components(v)
    given = walker.values.pop(id(v), None)  # checked against v by the caller
    if given is not None:
        value = given
    elif walker.copy_values:
        value = originals[0].value()
    else:
        value = _zeros(originals[0])
    try:
        new = _compat.recreate_distributed(v, value, re.sub(r":\d+$", "", v.name))
        copies = _compat.replica_components(new)
        if given is None and walker.copy_values:
            # Each replica gets its own original's value (SyncOnRead replicas differ;
            # under multi-worker, the initial value came from the chief).
            for original, copy in zip(originals, copies):
                copy.assign(original.value())
    except (tf.errors.OpError, ValueError, TypeError, RuntimeError) as err:
        kind, where = type(v).__name__, path_str(path)
        raise DistributedVariableError(
            f"objckpt.clone could not re-create the {kind} at `{where}` under its "
            f"{type(v.distribute_strategy).__name__} as a {kind} on the same devices: "
            f"{err}. Fix: build a fresh obj under the strategy instead of cloning, e.g. "
            "objckpt.Twins(model, past=factory()) where factory() returns a new, "
            "identically built model.", where, kind) from err
    walker.remember(v, new)
    walker.uids[_compat.unique_id(v)] = _compat.unique_id(new)
    for i, (original, copy) in enumerate(zip(originals, copies)):
        walker.remember(original, copy)
        walker.uids[_compat.unique_id(original)] = _compat.unique_id(copy)
        walker.queue.append((fill_variable, (walker, original, copy, (path, "replica", i))))
    walker.queue.append((fill_variable, (walker, v, new, path)))
    return new


def copy_sharded(walker, v, path):
    """A sharded variable re-created shard by shard (`copy_variable`: each on its original's
    device, valued or zeros, outside any strategy's variable creator): the same layout."""
    parts = [(copy_caching if _compat.is_caching_type(type(part)) else copy_variable)(
        walker, part, (path, "shard", i)) for i, part in enumerate(_compat.shards(v))]
    new = walker.remember(v, _compat.new_sharded(v, parts))
    walker.uids[_compat.unique_id(v)] = _compat.unique_id(new)
    return new


# A CachingVariable's own attributes: the variable it wraps and its cache, not attributes
# Keras or the user added (which `fill_variable` copies onto the copy).
_CACHING_OWN = frozenset({"_v", "_cache", "_current_new_cache_scope_count"})


def copy_caching(walker, v, path):
    """ParameterServerStrategy's `CachingVariable` (a variable on a parameter server whose
    reads workers may cache): a plain variable on the same device (`copy_variable`). The
    variable it wraps (`_v`, of the same `_unique_id`) is the same variable: it maps to the
    same copy, so slot tables keyed by that id (Keras 2's OptimizerV2) find the copy."""
    new = copy_variable(walker, v, path, skip=_CACHING_OWN)
    inner = v.__dict__.get("_v")
    if inner is not None and walker.memo.get(id(inner)) is None:
        walker.remember(inner, new)
    return new


def concrete_function(walker, x, path):
    """Refused: a traced ConcreteFunction captured the original's variables."""
    walker.fail(x, path, "it is a traced ConcreteFunction, which captured the original's "
                "variables and cannot be re-pointed at the clone")


def eager_tensor(walker, x, path):
    """An EagerTensor, shared (immutable); resource and variant handles refused."""
    if x.dtype in (tf.resource, tf.variant):
        walker.fail(x, path, f"it is a {x.dtype.name} tensor: a handle to TF runtime state "
                    "(lookup table, iterator, queue...) that would be shared, not copied")
    return x


def copy_variable(walker, v, path, skip=frozenset()):
    """A resource variable re-created on the same device, valued or zeros (`skip`: the
    original's attributes not copied onto it)."""
    if (_UninitializedVariable is not None and isinstance(v, _UninitializedVariable)
            and not bool(v.is_initialized())):
        walker.fail(v, path, "it is an uninitialized variable (restore-on-create placeholder)")
    name = v.name
    name = re.sub(r":\d+$", "", name)
    try:
        with tf.device(v.device):
            # A value given by the caller was checked against v (load_ensemble's plan).
            value = walker.values.pop(id(v), None)
            if value is None:
                value = _initial_value(walker, v)
            new = _compat.recreate_variable(v, value, name)
    except (tf.errors.OpError, ValueError, TypeError) as err:
        walker.fail(v, path, f"re-creating the variable failed: {err}")
    walker.remember(v, new)
    walker.uids[_compat.unique_id(v)] = _compat.unique_id(new)
    walker.queue.append((fill_variable, (walker, v, new, path, skip)))
    return new


def _initial_value(walker, v):
    """The copy's initial value: the original's, or zeros."""
    if walker.copy_values:
        return v.value()
    return _zeros(v)


def _zeros(v):
    """Zeros of the variable's shape and dtype."""
    if v.shape.is_fully_defined():
        return tf.zeros(v.shape, v.dtype)
    return tf.zeros(tf.shape(v.value()), v.dtype)


def fill_variable(walker, v, new, path, skip=frozenset()):
    """Copies the attributes Keras or the user added to a variable (not those in `skip`)."""
    own = v.__dict__
    fresh = new.__dict__
    key = _compat.CONSTRAINT_ATTR  # re-created variables have none: copy the original's
    if own.get(key) is not None:
        fresh[key] = walker.copy(own[key], (path, "attr", key))
    for key, value in own.items():  # attributes added by Keras or the user
        if key not in fresh and key not in skip:
            fresh[key] = walker.value(walker.copy(value, (path, "attr", key)),
                                      lambda r, key=key: fresh.__setitem__(key, r))


def tf_function(walker, f, path):
    """A tf.function rebuilt around the copied Python function (traced anew)."""
    python_function, kwargs = _compat.function_parts(f)
    copied = walker.copy(python_function, (path, "attr", "_python_function"))
    if copied is python_function:
        return walker.remember(f, f)  # stateless: tracing depends on arguments only
    return walker.remember(f, _compat.rewrap_function(copied, kwargs))
