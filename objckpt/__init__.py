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
    "SaveHandle",
    "Snapshot",
    "Twins",
    "VariableTree",
    "VerifyReport",
    "callbacks",
    "clone",
    "diff",
    "errors",
    "graph",
    "load_ensemble",
    "migrate",
    "plan",
    "read_tree",
    "restore",
    "restore_on_create",
    "save",
    "snapshot",
    "tree",
    "verify",
]

# name -> private module that defines it; loaded (with TensorFlow) on first use.
_LAZY = {
    "CheckpointManager": "_manager",
    "CheckpointTree": "_tree",
    "Entry": "_tree",
    "VariableTree": "_tree",
    "read_tree": "_tree",
    "tree": "_tree",
    "RestoreReport": "_snapshot",
    "SaveHandle": "_snapshot",
    "Snapshot": "_snapshot",
    "restore": "_snapshot",
    "save": "_snapshot",
    "snapshot": "_snapshot",
    "Twins": "_twins",
    "clone": "_clone",
    "Match": "_match",
    "Plan": "_match",
    "plan": "_match",
    "PendingRestore": "_deferred",
    "restore_on_create": "_deferred",
    "migrate": "_migrate",
    "Ensemble": "_ensemble",
    "load_ensemble": "_ensemble",
    "Freezer": "_freeze",
    "Diff": "_diff",
    "diff": "_diff",
    "Graph": "_graph",
    "graph": "_graph",
    "VerifyReport": "_verify",
    "verify": "_verify",
}

if TYPE_CHECKING:
    from objckpt import callbacks as callbacks
    from objckpt._clone import clone as clone
    from objckpt._deferred import PendingRestore as PendingRestore
    from objckpt._deferred import restore_on_create as restore_on_create
    from objckpt._diff import Diff as Diff
    from objckpt._diff import diff as diff
    from objckpt._ensemble import Ensemble as Ensemble
    from objckpt._ensemble import load_ensemble as load_ensemble
    from objckpt._freeze import Freezer as Freezer
    from objckpt._graph import Graph as Graph
    from objckpt._graph import graph as graph
    from objckpt._manager import CheckpointManager as CheckpointManager
    from objckpt._match import Match as Match
    from objckpt._match import Plan as Plan
    from objckpt._match import plan as plan
    from objckpt._migrate import migrate as migrate
    from objckpt._snapshot import RestoreReport as RestoreReport
    from objckpt._snapshot import Snapshot as Snapshot
    from objckpt._snapshot import restore as restore
    from objckpt._snapshot import save as save
    from objckpt._snapshot import snapshot as snapshot
    from objckpt._tree import CheckpointTree as CheckpointTree
    from objckpt._tree import Entry as Entry
    from objckpt._tree import VariableTree as VariableTree
    from objckpt._tree import read_tree as read_tree
    from objckpt._tree import tree as tree
    from objckpt._twins import Twins as Twins
    from objckpt._verify import VerifyReport as VerifyReport
    from objckpt._verify import verify as verify


def __getattr__(name: str):
    if name == "callbacks":  # a public module: loaded on first use, like the rest
        value = importlib.import_module("objckpt.callbacks")
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
