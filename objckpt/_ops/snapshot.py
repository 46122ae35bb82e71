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

__all__ = ["Snapshot", "check_cross_replica", "of_tree", "snapshot"]


class Snapshot(_tree.FrozenMapping):
    """An immutable mapping object path -> tensor: the values of an obj at one time.

    Tensors stay on the variables' devices and share memory with the values
    they were read from; TF copies on the next write to a variable, so later
    training never changes a Snapshot. `numpy()` gives host copies.

    A Snapshot can also be built from any mapping of object path -> array:
    `Snapshot({"hidden/_kernel": np.ones((3, 4))})`.
    """

    __slots__ = ("_keep", "_origin")

    def __init__(self, values: Mapping):
        super().__init__({str(path): tf.convert_to_tensor(value) for path, value in values.items()})
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
        """Returns host (NumPy) copies of every value, keyed by object path."""
        return {path: np.array(value) for path, value in self.as_dict().items()}

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
    must take the snapshot). A `ShardedVariable` raises
    `DistributedVariableError`.

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
    snap = Snapshot._of_tree(variables, variables.fused.read_all())
    if not _tree.is_cached(obj, variables):
        # Nothing else keeps this tree (an obj without a cheap fingerprint, such as a
        # tf.train.Checkpoint): the Snapshot does, for what saving it needs to know.
        snap._keep = variables
    return snap


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


