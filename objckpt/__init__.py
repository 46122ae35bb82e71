"""objckpt: TF2 object-based checkpoint utilities for eager models.

Snapshot, restore, save and inspect TensorFlow/Keras model state by object
structure (the named attribute edges from a root obj to each variable), in
every flavour: Keras 3, tf_keras, Keras 2 and plain `tf.Module`.

`import objckpt` is cheap: TensorFlow is imported on first use of a name
that needs it, never at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from objckpt import errors as errors

__version__ = "0.1.0"

__all__ = [
    "AverageReport",
    "CheckpointManager",
    "CheckpointTree",
    "Diff",
    "Ensemble",
    "Entry",
    "Freezer",
    "Graph",
    "Match",
    "PendingRestore",
    "Plan",
    "RestoreReport",
    "RetentionPolicy",
    "SaveHandle",
    "Snapshot",
    "SoupReport",
    "Twins",
    "VariableTree",
    "VerifyReport",
    "callbacks",
    "clone",
    "diff",
    "average",
    "average_checkpoints",
    "errors",
    "export",
    "graph",
    "greedy_soup",
    "load_ensemble",
    "migrate",
    "plan",
    "read_tree",
    "recalibrate_batchnorm",
    "restore",
    "restore_on_create",
    "rules",
    "save",
    "snapshot",
    "tree",
    "verify",
]

# name -> private module that defines it; loaded (with TensorFlow) on first use.
_LAZY = {
    "CheckpointManager": "_training.manager",
    "RetentionPolicy": "_training.retention",
    "CheckpointTree": "_planning.tree",
    "Entry": "_planning.tree",
    "VariableTree": "_planning.tree",
    "read_tree": "_planning.tree",
    "tree": "_planning.tree",
    "RestoreReport": "_ops.restore",
    "SaveHandle": "_ops.save",
    "Snapshot": "_ops.snapshot",
    "restore": "_ops.restore",
    "save": "_ops.save",
    "snapshot": "_ops.snapshot",
    "Twins": "_ops.twins",
    "clone": "_ops.clone",
    "Match": "_planning.match",
    "Plan": "_planning.match",
    "plan": "_ops.restore",
    "PendingRestore": "_ops.deferred",
    "restore_on_create": "_ops.deferred",
    "migrate": "_ops.migrate",
    "export": "_ops.export",
    "AverageReport": "_ops.average",
    "average": "_ops.average",
    "average_checkpoints": "_ops.averaging",
    "Ensemble": "_ops.ensemble",
    "load_ensemble": "_ops.ensemble",
    "Freezer": "_ops.freeze",
    "SoupReport": "_ops.soup",
    "greedy_soup": "_ops.soup",
    "recalibrate_batchnorm": "_ops.batchnorm",
    "Diff": "_inspect.diff",
    "diff": "_inspect.diff",
    "Graph": "_inspect.graph",
    "graph": "_inspect.graph",
    "VerifyReport": "_inspect.verify",
    "verify": "_inspect.verify",
}

if TYPE_CHECKING:
    from objckpt import callbacks as callbacks
    from objckpt import rules as rules
    from objckpt._inspect.diff import Diff as Diff
    from objckpt._inspect.diff import diff as diff
    from objckpt._inspect.graph import Graph as Graph
    from objckpt._inspect.graph import graph as graph
    from objckpt._inspect.verify import VerifyReport as VerifyReport
    from objckpt._inspect.verify import verify as verify
    from objckpt._ops.average import AverageReport as AverageReport
    from objckpt._ops.average import average as average
    from objckpt._ops.averaging import average_checkpoints as average_checkpoints
    from objckpt._ops.clone import clone as clone
    from objckpt._ops.deferred import PendingRestore as PendingRestore
    from objckpt._ops.deferred import restore_on_create as restore_on_create
    from objckpt._ops.ensemble import Ensemble as Ensemble
    from objckpt._ops.ensemble import load_ensemble as load_ensemble
    from objckpt._ops.export import export as export
    from objckpt._ops.batchnorm import recalibrate_batchnorm as recalibrate_batchnorm
    from objckpt._ops.freeze import Freezer as Freezer
    from objckpt._ops.migrate import migrate as migrate
    from objckpt._ops.restore import RestoreReport as RestoreReport
    from objckpt._ops.restore import plan as plan
    from objckpt._ops.restore import restore as restore
    from objckpt._ops.save import save as save
    from objckpt._ops.snapshot import Snapshot as Snapshot
    from objckpt._ops.snapshot import snapshot as snapshot
    from objckpt._ops.soup import SoupReport as SoupReport
    from objckpt._ops.soup import greedy_soup as greedy_soup
    from objckpt._ops.twins import Twins as Twins
    from objckpt._planning.match import Match as Match
    from objckpt._planning.match import Plan as Plan
    from objckpt._planning.tree import CheckpointTree as CheckpointTree
    from objckpt._planning.tree import Entry as Entry
    from objckpt._planning.tree import VariableTree as VariableTree
    from objckpt._planning.tree import read_tree as read_tree
    from objckpt._planning.tree import tree as tree
    from objckpt._training.manager import CheckpointManager as CheckpointManager
    from objckpt._training.retention import RetentionPolicy as RetentionPolicy


def __getattr__(name: str):
    if name in ("callbacks", "rules"):  # public modules: loaded on first use, like the rest
        value = importlib.import_module(f"objckpt.{name}")
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'objckpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"objckpt.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    # The public names and the module's dunders; not its imports (`importlib`,
    # `TYPE_CHECKING`, `annotations`) nor private tables.
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})
