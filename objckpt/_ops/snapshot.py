"""In-memory snapshots: the values of an obj at one time, without copying a byte."""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._planning import sources as _sources
from objckpt._planning import tree as _tree

__all__ = ["Snapshot", "check_cross_replica", "of_tree", "read_values", "snapshot"]


class Snapshot(_tree.FrozenMapping):
    """An immutable mapping object path -> tensor: the values of an obj at one time.

    Tensors stay on the variables' devices and share memory with the values
    they were read from; TF copies on the next write to a variable, so later
    training never changes a Snapshot. `numpy()` gives host copies.

    A sharded variable (a `ShardedVariable` under ParameterServerStrategy, a TF1
    `PartitionedVariable`) is one entry, under its object path, whose value is a
    `ShardedValue` (`objckpt._compat.sharded`): its shards' values, each left on its
    shard's device (a parameter server), and their layout (`.shards`, `.layout`). It
    has the variable's logical `shape`, `dtype` and `nbytes` (counted once), and
    `tf.convert_to_tensor(value)`, `np.asarray(value)`, `value.numpy()` and any TF op
    given it join the shards into one tensor on this host: the whole variable's memory,
    paid only where one tensor is needed (`numpy()` here, a rule's transform, a plain
    variable restored from it). `restore` and `save` take it shard by shard.

    A Snapshot can also be built from any mapping of object path -> array:
    `Snapshot({"hidden/_kernel": np.ones((3, 4))})` (a `ShardedValue` stays as it is).
    """

    __slots__ = ("_keep", "_origin")

    def __init__(self, values: Mapping):
        super().__init__({str(path): value if _compat.is_sharded_value(value)
                          else tf.convert_to_tensor(value) for path, value in values.items()})
        self._origin = None
        self._keep = None

    @classmethod
    def _of_tree(cls, variables: _tree.VariableTree, values: list) -> Snapshot:
        result = cls.__new__(cls)
        _tree.FrozenMapping.__init__(result, dict(zip(variables, values)))
        result._origin = weakref.ref(variables)
        result._keep = None
        return result

    def origin(self) -> _tree.VariableTree | None:
        """The live tree this snapshot was taken from, while it exists unchanged."""
        return self._origin() if self._origin is not None else None

    def numpy(self) -> dict[str, np.ndarray]:
        """Returns host (NumPy) copies of every value, keyed by object path (a sharded
        variable's shards joined: the whole variable on this host)."""
        return {path: value.numpy() if _compat.is_sharded_value(value) else np.array(value)
                for path, value in self.as_dict().items()}

    @property
    def nbytes(self) -> int:
        return sum(value.shape.num_elements() * value.dtype.size
                   for value in self.as_dict().values())

    def __repr__(self) -> str:
        return f"Snapshot({len(self)} variables, {_render.mb(self.nbytes)})"

    def as_source(self) -> _sources.Source:
        """This snapshot as a plan source (its network paths and slot owners included)."""
        origin = self.origin()
        # Taken from a live obj whose canonical paths run through its optimizer (a
        # trained Keras 3 model): its network paths feed untrained models too.
        if origin is None:
            return _sources.snapshot_source(self.as_dict())
        return _sources.snapshot_source(self.as_dict(), origin.network_aliases(),
                                        origin.slot_owners)


# Called inside a user's tf.function: run as Python, never converted by AutoGraph (its
# errors stay objckpt's own, and nothing is converted on every trace).
@tf.autograph.experimental.do_not_convert
@errors.about_arguments(obj="obj")
def snapshot(obj) -> Snapshot:
    """Takes an immutable in-memory Snapshot of every variable of obj.

    No bytes are copied and nothing goes through NumPy: each value shares the
    variable's current buffer until the variable is next written.

    Under `tf.distribute` (MirroredStrategy, MultiWorkerMirroredStrategy) each
    value is the one `tf.train.Checkpoint` saves: a `MirroredVariable`'s
    (replica 0's component; its replicas hold the same value), and a
    SyncOnRead variable's aggregate across all replicas: the sum for
    aggregation SUM (metric totals and counts), the mean for MEAN (tf_keras
    and Keras 2 BatchNormalization statistics), replica 0's component for
    ONLY_FIRST_REPLICA. Reading a SUM or MEAN one is a reduction across the
    replicas (a collective under MultiWorkerMirroredStrategy: every worker
    must take the snapshot).

    A `ShardedVariable` (ParameterServerStrategy with a partitioner) is one
    entry holding a `ShardedValue`: each shard read where it lives, without a
    copy, nothing of it brought to this host (the coordinator). Inside a
    `tf.function` being traced, its value is the shards joined, one tensor.

    Args:
      obj: any trackable (Keras model or layer of any flavour, `tf.Module`,
        `tf.train.Checkpoint`, optimizer).

    Returns:
      A `Snapshot` with the keys of `objckpt.tree(obj)`.

    Example:
      >>> best = objckpt.snapshot(model)
      >>> ...  # train on
      >>> objckpt.restore(model, best)
    """
    variables = _tree.tree(obj)
    check_cross_replica(variables, "snapshot")
    snap = Snapshot._of_tree(variables, read_values(variables))
    if not _tree.is_cached(obj, variables):
        # Nothing else keeps this tree (an obj without a cheap fingerprint, such as a
        # tf.train.Checkpoint): the Snapshot does, for what saving it needs to know.
        snap._keep = variables
    return snap


# id(tree) -> (weak reference to it, FusedOps of its variables but the sharded ones), for
# `read_values` (a tree is immutable; its entry goes with it).
_UNSHARDED: dict = {}


def read_values(variables: _tree.VariableTree) -> list:
    """Every variable's value, as a Snapshot holds it: read together (one fused call), a
    sharded variable's as a `ShardedValue` (each shard read where it lives; eagerly: in a
    `tf.function` being traced, the shards joined)."""
    if not tf.executing_eagerly() or not any(_compat.is_sharded(v) for v in variables.values()):
        return variables.fused.read_all()
    ref, fused = _UNSHARDED.get(id(variables), (None, None))
    if ref is None or ref() is not variables:  # () when every variable is sharded
        unsharded = [v for v in variables.values() if not _compat.is_sharded(v)]
        fused = _compat.FusedOps(unsharded) if unsharded else ()
        key = id(variables)
        _UNSHARDED[key] = (weakref.ref(variables, lambda _: _UNSHARDED.pop(key, None)), fused)
    plain = iter(fused.read_all() if fused else ())
    return [_compat.read_shards(v) if _compat.is_sharded(v) else next(plain)
            for v in variables.values()]


def of_tree(variables: _tree.VariableTree, values: list) -> Snapshot:
    """A Snapshot of `values`, read from the live tree `variables` (its origin)."""
    return Snapshot._of_tree(variables, values)


def check_cross_replica(variables, operation: str) -> None:
    """Refuses to read or assign distributed variables inside `strategy.run`.

    In a replica context a SyncOnRead variable reads as its own replica's component (not
    the aggregate TF saves) and assigns to that component only, and a MirroredVariable
    cannot be assigned without an aggregation: values would be wrong without an error.
    """
    running = _compat.replica_context_strategy()
    if running is None:
        return
    for path, variable in variables.items():
        if isinstance(variable, tf.distribute.DistributedValues):
            kind = type(variable).__name__
            raise errors.DistributedVariableError(
                f"objckpt.{operation} was called inside `strategy.run` of a "
                f"{type(running).__name__} (a replica context), where `{_render.safe(path)}` "
                f"({kind}) and every other distributed variable show only this replica's "
                "component. Expected: a cross-replica context. Fix: call "
                f"objckpt.{operation} outside strategy.run (inside or outside "
                "`strategy.scope()`), e.g. between training steps; to copy weights inside a "
                "step use objckpt.Twins.", path=path, variable_type=kind)


