"""The workers of a multi-worker strategy, as a checkpoint directory sees them: who is the
chief, and the small collectives by which they agree (see `checkpointing`'s docstring).

A `Cluster` gathers one row of numbers from every worker (one all-reduce), so that the
chief's choices (which checkpoint to resume from, whether a save is skipped) reach every
worker, and every worker learns whether another failed (an error code) and raises together
with it instead of waiting forever.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors

__all__ = ["Cluster", "error_code"]

# The errors one worker learns another raised (by code; 0: none), and the type it raises then.
_CODES = (None, errors.DirectoryLockedError, errors.CheckpointWriteError,
          errors.CheckpointDirectoryError, errors.StructureMismatchError,
          errors.CheckpointCorruptError, errors.UnbuiltModelError)
_OTHER = len(_CODES)  # any other exception


def error_code(err: BaseException | None) -> int:
    """The code `Cluster.gather` carries for `err` (0 for None)."""
    if err is None:
        return 0
    for code, kind in enumerate(_CODES[1:], 1):
        if isinstance(err, kind):
            return code
    return _OTHER


class Cluster:
    """This process among the workers of a multi-worker strategy, and their agreements.

    Built by `Cluster.of(variables)`: None unless the variables' strategy runs on more than
    one worker (`MultiWorkerMirroredStrategy` with a cluster in TF_CONFIG). Every worker
    must call `gather` at the same points in the same order (it is a collective).

    Attributes:
      strategy: the strategy.
      chief: whether this worker writes checkpoints (TF's `should_checkpoint`).
      index: this worker's position among `workers` (the chief's task first).
      workers: how many workers train.
      name: this worker's task, e.g. "worker 1".
      chief_index: the chief's position.
    """

    def __init__(self, strategy, chief: bool, index: int, workers: int, name: str,
                 chief_index: int):
        self.strategy, self.chief, self.index, self.workers = strategy, chief, index, workers
        self.name, self.chief_index = name, chief_index

    @classmethod
    def of(cls, variables) -> Cluster | None:
        """The cluster the strategy of `variables` (else the strategy in scope) trains on,
        or None when it is a single process (no strategy, MirroredStrategy, one worker)."""
        variables = list(variables)
        strategy = _compat.variables_strategy(variables)
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            return None  # its one coordinator reads and writes every variable, alone
        resolver = getattr(strategy, "cluster_resolver", None)
        if resolver is None:
            return None
        spec = resolver.cluster_spec().as_dict()
        chiefs, workers = len(spec.get("chief", ())), len(spec.get("worker", ()))
        if chiefs + workers <= 1 or resolver.task_type not in ("chief", "worker"):
            return None
        task_id = int(resolver.task_id or 0)
        index = task_id if resolver.task_type == "chief" else chiefs + task_id
        return cls(strategy, _compat.writes_checkpoints(variables), index, chiefs + workers,
                   f"{resolver.task_type} {task_id}", 0)

    def gather(self, row) -> list[list[float]]:
        """Every worker's `row` (numbers, the same length on every worker), in worker order.

        One all-reduce of a small float64 matrix in which each worker fills its own row (a
        sum with zeros is exact: integers below 2**53 and every float come back unchanged).
        """
        matrix = np.zeros((self.workers, len(row)), np.float64)
        matrix[self.index] = row
        calls = [0]

        def value(context):  # this worker's first replica contributes, the others add zeros
            calls[0] += 1
            return tf.constant(matrix if calls[0] == 1 else np.zeros_like(matrix))

        strategy = self.strategy
        total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                                strategy.experimental_distribute_values_from_function(value),
                                axis=None)
        return np.asarray(total).tolist()

    def chief_row(self, row) -> list[float]:
        """The chief's `row`, on every worker (`row` is ignored elsewhere)."""
        return self.gather(row if self.chief else [0] * len(row))[self.chief_index]

    def failed(self, err: BaseException | None) -> dict[int, int]:
        """{worker index: error code} of the workers that failed (this one too, when `err`)."""
        codes = self.gather([error_code(err)])
        return {i: int(row[0]) for i, row in enumerate(codes) if row[0]}

    def raise_for(self, failed: dict[int, int], err: BaseException | None, what: str,
                  directory: str, prefix: str = "") -> None:
        """Raises `err` when this worker failed, else (when another did) an error of the type
        the first failed worker raised, saying which worker failed `what`."""
        if err is not None:
            raise err
        if not failed:
            return
        index, code = min(failed.items())
        known = code < len(_CODES)
        kind = _CODES[code] if known else errors.CheckpointDirectoryError
        who = "the chief" if index == self.chief_index else "another worker"
        message = (
            f"Checkpoint directory `{directory}`: {who} (worker #{index} of {self.workers}) "
            f"failed {what} with {kind.__name__ if known else 'an unexpected error'} (its log "
            f"has the details), so this worker ({self.name}) stops too instead of waiting for "
            "it. Fix: see that worker's error; every worker of a MultiWorkerMirroredStrategy "
            "must see the same checkpoint directory (one file system all of them mount).")
        if kind in (errors.DirectoryLockedError, errors.CheckpointDirectoryError):
            raise kind(message, directory=directory)
        if kind is errors.CheckpointWriteError:
            raise kind(message, prefix)
        if kind is errors.StructureMismatchError:
            raise kind(message, ())
        raise kind(message)

