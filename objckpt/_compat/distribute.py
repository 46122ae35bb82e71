"""tf.distribute variables: which distributed variables objckpt can re-create, re-creating one
under its own strategy (mirrored like the original), and its per-replica components."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from objckpt._compat.variables import lookup

__all__ = [
    "autocast_inner",
    "distributed_refusal",
    "gather_failures",
    "is_distributed_variable",
    "recreate_distributed",
    "replica_components",
    "replica_context_strategy",
    "restore_components",
    "variables_strategy",
    "writes_checkpoints",
]

_DISTRIBUTED = None


def _types():
    """(DistributedVariable, the types clone re-creates, the types it refuses), looked up once.

    MirroredVariable and SyncOnReadVariable (MirroredStrategy, MultiWorkerMirroredStrategy) are
    re-created exactly; everything else tf.distribute makes (sharded, TPU, packed, parameter
    server variables, DistributedVariable with a variable policy) is refused.
    """
    global _DISTRIBUTED
    if _DISTRIBUTED is None:
        values = "tensorflow.python.distribute.values"
        ps_values = "tensorflow.python.distribute.ps_values"
        refused = (
            lookup("tensorflow.python.distribute.sharded_variable", "ShardedVariableMixin"),
            lookup(ps_values, "AggregatingVariable"),
            lookup(ps_values, "CachingVariable"),
            lookup(ps_values, "PerWorkerVariable", since=(2, 16)),
            lookup("tensorflow.python.distribute.packed_distributed_variable",
                   "PackedDistributedVariable"),
            lookup("tensorflow.python.distribute.tpu_values", "TPUVariableMixin"),
            lookup("tensorflow.python.distribute.tpu_replicated_variable",
                   "TPUReplicatedVariable"),
        )
        _DISTRIBUTED = (
            lookup(values, "DistributedVariable"),
            (lookup(values, "MirroredVariable"), lookup(values, "SyncOnReadVariable")),
            tuple(t for t in refused if t is not None),
        )
    return _DISTRIBUTED


def _is_autocast(cls) -> bool:
    # Keras 2 / tf_keras mixed precision: under a strategy, the AutoCastVariable wrapping a
    # distributed variable is of a class made on the fly that also subclasses its class.
    return any(k.__name__ == "AutoCastVariable" and "autocast_variable" in k.__module__
               for k in cls.__mro__)


def autocast_inner(variable):
    """The variable a Keras 2 / tf_keras `AutoCastVariable` wraps, or None for other values."""
    return variable.__dict__.get("_variable") if _is_autocast(type(variable)) else None


def is_distributed_variable(cls) -> bool:
    """True for a type of variable tf.distribute creates (mirrored, sync-on-read, sharded,
    TPU, parameter server); False for plain variables, non-variable DistributedValues and
    the Keras `AutoCastVariable` wrappers around distributed variables (plain objects)."""
    distributed, _, refused = _types()
    return (issubclass(cls, distributed) or issubclass(cls, refused)) and not _is_autocast(cls)


def distributed_refusal(variable) -> str | None:
    """None if `recreate_distributed` can re-create `variable` faithfully, else why not."""
    _, supported, _ = _types()
    kind = type(variable).__name__
    if type(variable) not in supported:
        if "Sharded" in kind:
            return (f"it is a {kind}: a variable tf.distribute splits into shards "
                    "(ParameterServerStrategy with a variable partitioner)")
        if "TPU" in kind:
            return f"it is a {kind}, a variable of a TPU strategy"
        return f"it is a {kind}, a tf.distribute variable with no per-replica mirror of its own"
    if getattr(variable, "_policy", None) is not None:
        return (f"it is a {kind} with a tf.distribute variable policy "
                f"({type(variable._policy).__name__})")
    if getattr(variable, "_packed_var", None) is not None:
        return f"it is a {kind} packed for a TPU-style strategy"
    return None


def replica_components(variable) -> tuple:
    """The per-replica component variables of a distributed variable, in replica order (on
    this worker)."""
    return tuple(variable.values)


def replica_context_strategy():
    """The strategy whose `strategy.run` replica function is running now, or None in a
    cross-replica context (or with no strategy)."""
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        return tf.distribute.get_strategy()
    return None


def _creation_scope(strategy, like):
    """`strategy.scope()` (unless it is the current strategy already) and colocation with
    `like`, so the new variable has one component on each of `like`'s devices."""
    stack = contextlib.ExitStack()
    if not (tf.distribute.has_strategy() and tf.distribute.get_strategy() is strategy):
        stack.enter_context(strategy.scope())
    stack.enter_context(strategy.extended.colocate_vars_with(like))
    return stack


def recreate_distributed(like, value, name: str):
    """A new distributed variable like `like` (MirroredVariable or SyncOnReadVariable): created
    under like's own strategy, with one component on each of like's devices, the same
    synchronization, aggregation, trainable flag, dtype, shape and name. Every component starts
    at `value` (a tensor or a callable; under MultiWorkerMirroredStrategy the chief's value is
    broadcast, as for every variable TF creates there).

    Raises ValueError when TF made something else (another type or other devices).
    """
    strategy = like.distribute_strategy
    with _creation_scope(strategy, like):
        new = tf.Variable(
            value, trainable=like.trainable, name=name, dtype=like.dtype, shape=like.shape,
            synchronization=like.synchronization, aggregation=like.aggregation)
    if type(new) is not type(like):
        raise ValueError(f"TF made a {type(new).__name__} under {type(strategy).__name__}, "
                         f"not a {type(like).__name__}")
    old_devices = [c.device for c in like.values]
    new_devices = [c.device for c in new.values]
    if old_devices != new_devices:
        raise ValueError(f"TF placed its replicas on {new_devices}, not on {old_devices}")
    return new


# --- who writes checkpoints ----------------------------------------------------------

def variables_strategy(variables):
    """The `tf.distribute.Strategy` of the first distributed variable of `variables`, else
    the strategy in scope (the default strategy outside any scope)."""
    for variable in variables:
        if isinstance(variable, tf.distribute.DistributedValues):
            strategy = getattr(variable, "distribute_strategy", None)
            if strategy is not None:
                return strategy
    return tf.distribute.get_strategy()


def writes_checkpoints(variables) -> bool:
    """Whether this process writes checkpoints of `variables`.

    TF's `strategy.extended.should_checkpoint` for their strategy: False only on a worker of
    a multi-worker strategy (`MultiWorkerMirroredStrategy`) that is not its chief
    (`multi_worker_util.is_chief`: task 0 of "chief", or of "worker" when the cluster has no
    chief). No strategy, MirroredStrategy and OneDeviceStrategy write.
    """
    return bool(variables_strategy(variables).extended.should_checkpoint)


def restore_components(variable, value) -> bool:
    """Lands a checkpoint value in every replica of a MirroredVariable or SyncOnReadVariable
    as `tf.train.Checkpoint` restores one (TF's `values_util.get_on_write_restore_ops` and
    `get_on_read_restore_ops`): each per-replica component is assigned directly, eagerly,
    on its own device; a SyncOnRead SUM variable's components get `value /
    num_replicas_in_sync` cast to its dtype, so its aggregate is the value. Right from any
    context, a replica context (inside `strategy.run`, eager or traced) included, where the
    distributed variable's own `assign` writes one replica (or every replica in full).

    Returns False (nothing done) for any other variable: plain ones are assigned as usual.
    """
    inner = autocast_inner(variable)
    if inner is not None:
        variable = inner
    _, supported, _ = _types()
    if type(variable) not in supported or getattr(variable, "_packed_var", None) is not None:
        return False
    with tf.init_scope():
        tensor = tf.convert_to_tensor(value)
        if (variable.synchronization == tf.VariableSynchronization.ON_READ
                and variable.aggregation == tf.VariableAggregation.SUM):
            replicas = variable.distribute_strategy.num_replicas_in_sync
            tensor = tf.cast(tensor / replicas, variable.dtype)
        for component in variable.values:
            with tf.device(component.device):
                component.assign(tensor, read_value=False)
    return True


# --- agreement across the workers of a MultiWorkerMirroredStrategy ----------------------

# One row per replica: [failed, kind, task index, message length, message bytes...]; the
# message carries the error's attributes too (`_agree.agree_across_workers`).
_ROW = 4 + 8192


def _gather_fn(strategy):
    """A tf.function gathering one row per replica across every worker (cached per
    strategy: TF logs a warning for each eager collective of CollectiveAllReduceStrategy)."""
    cached = strategy.__dict__.get("_objckpt_gather")
    if cached is not None:
        return cached

    @tf.function(autograph=False)
    def gather(row):
        return strategy.gather(strategy.run(lambda: tf.identity(row)[tf.newaxis]), axis=0)

    strategy.__dict__["_objckpt_gather"] = gather  # lives and dies with the strategy
    return gather


def _task_label(strategy) -> str:
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    task_id = getattr(resolver, "task_id", None)
    return f"{task_type or 'worker'}:{task_id if task_id is not None else 0}"


def gather_failures(variables, kind: int, message: str) -> list[tuple[str, int, str]] | None:
    """What every worker of the variables' `MultiWorkerMirroredStrategy` reports: a list of
    (task, kind, message) for each worker that failed (kind > 0; a worker that passed calls
    this with kind 0), by one small all-gather. Every worker must call it at the same
    point, as it calls the operation it belongs to. Run eagerly even while a tf.function is
    traced (every worker traces the same function, so the collectives match). None (no
    collective) for any other strategy, where there is one process to agree with.
    """
    strategy = variables_strategy(variables)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    label = _task_label(strategy)
    text = f"{label}\n{message}".encode("utf-8", "replace")[:_ROW - 4] if kind else b""
    row = [float(bool(kind)), float(kind), 0.0, float(len(text))] + [float(b) for b in text]
    row += [0.0] * (_ROW - len(row))
    with tf.init_scope():
        rows = _gather_fn(strategy)(tf.constant(row, tf.float32)).numpy().tolist()
    failures, seen = [], set()
    for got in rows:
        if not got[0]:
            continue
        raw = bytes(round(b) for b in got[4:4 + round(got[3])])
        task, _, text = raw.decode("utf-8", "replace").partition("\n")
        if task not in seen:  # one row per replica: the worker's replicas repeat it
            seen.add(task)
            failures.append((task, round(got[1]), text))
    return failures
