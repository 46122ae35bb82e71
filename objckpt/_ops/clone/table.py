"""The table of copiers by type: which function copies the instances of each kind of object.

`CopierTable` is the registry (as flax's `register_serialization_state`): entries of
(predicate on a type, copier) tried in order, the first whose predicate holds wins, and a
type's answer is kept. `COPIERS` is the one `clone` uses. The order matters where kinds
overlap: a distributed variable is a resource variable too (parameter-server and TPU
types), a namedtuple a tuple, a TF tracking wrapper a wrapt proxy, and every class a
subclass of object.
"""

from __future__ import annotations

import collections
import enum
import functools
import inspect
import io
import logging
import threading
import types
import weakref
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from objckpt import _compat
from objckpt._ops.clone import pykinds as _py
from objckpt._ops.clone import tfkinds as _tf

__all__ = ["COPIERS", "CopierTable", "exactly", "subclass_of"]

_T = _compat.clone_types()  # TF types treated specially; TF internals are _compat's

try:
    import wrapt as _wrapt
    _ObjectProxy = _wrapt.ObjectProxy
except ImportError:  # pragma: no cover
    _ObjectProxy = None

# Shared by the clone, never copied: program, types, immutable TF and NumPy values,
# strategies and graphs, loggers.
_SHARED_BASES = tuple(t for t in (
    type, types.ModuleType, enum.Enum, tf.DType, tf.TensorShape, _T.TypeSpec, _T.Dimension,
    _T.Graph, _T.Operation, _T.StrategyBase, _T.StrategyExtended, _T.ReplicaContext,
    _T.EagerContext, tf.DeviceSpec, np.dtype, np.generic, inspect.Signature,
    inspect.Parameter, logging.Logger, logging.Handler, logging.Manager, staticmethod,
    classmethod, _T.PythonAPIDispatcher,
) if t is not None)

# Live operating-system or interpreter resources: a CloneError naming their path.
_UNCOPYABLE = tuple(t for t in (
    io.IOBase, threading.Thread, types.GeneratorType, types.CoroutineType,
    types.AsyncGeneratorType, types.FrameType, types.TracebackType, memoryview,
    _compat.optional("socket", "socket"), _compat.optional("subprocess", "Popen"),
    _compat.optional("multiprocessing.process", "BaseProcess"), _compat.optional("mmap", "mmap"),
    _compat.optional("sqlite3", "Connection"), _compat.optional("concurrent.futures", "Executor"),
) if t is not None)


def subclass_of(*kinds):
    """A predicate on a type: a subclass of one of `kinds` (None entries: absent in this TF)."""
    kinds = tuple(k for k in kinds if k is not None)
    return lambda cls: issubclass(cls, kinds)


def exactly(*kinds):
    """A predicate on a type: one of `kinds` itself (not a subclass)."""
    return lambda cls: cls in kinds


class CopierTable:
    """Copiers by type: (predicate on a type, copier) entries, tried in order.

    A copier is `copier(walker, x, path) -> the copy of x` (see `walker.Walker`).

    Args:
      entries: (predicate, copier) pairs, in the order they are tried.
      fallback: the copier of a type no predicate holds for.
    """

    def __init__(self, entries, fallback: Callable):
        self.entries = list(entries)
        self.fallback = fallback
        self._found: dict[type, Callable] = {}

    def register(self, applies: Callable[[type], bool], copier: Callable, *,
                 first: bool = False) -> None:
        """Adds an entry: tried last (or, with `first`, before every other one)."""
        if first:
            self.entries.insert(0, (applies, copier))
        else:
            self.entries.append((applies, copier))
        self._found.clear()

    def copier_for(self, cls: type) -> Callable:
        """The copier of `cls`'s instances: the first entry whose predicate holds, else the
        fallback."""
        copier = self._found.get(cls)
        if copier is None:
            copier = next((c for applies, c in self.entries if applies(cls)), self.fallback)
            self._found[cls] = copier
        return copier

    def copiers(self) -> list[Callable]:
        """Every copier of the table, in order (the fallback not included)."""
        return [copier for _, copier in self.entries]


# The table `clone` uses; its fallback: a C-implemented object of unknown semantics (a
# CloneError naming its path).
COPIERS = CopierTable([
    (_compat.is_sharded_type, _tf.copy_sharded),
    (_compat.is_caching_type, _tf.copy_caching),
    (_compat.is_distributed_variable, _tf.copy_distributed),
    (subclass_of(_T.BaseResourceVariable), _tf.copy_variable),
    (subclass_of(*_UNCOPYABLE), _py.copy_uncopyable),
    (subclass_of(_T.EagerTensor), _tf.eager_tensor),
    (subclass_of(_T.SymbolicTensor, *_SHARED_BASES), _py.copy_share),
    (subclass_of(_T.Function), _tf.tf_function),
    (subclass_of(_T.ConcreteFunctionBase, _T.AtomicFunction), _tf.concrete_function),
    (exactly(types.FunctionType), _py.copy_function),
    (exactly(types.MethodType), _py.copy_method),
    (exactly(types.BuiltinMethodType, types.MethodWrapperType), _py.builtin_method),
    (exactly(types.CellType), _py.copy_cell),
    (exactly(functools.partial), _py.copy_partial),
    (subclass_of(weakref.ref, weakref.ProxyType, weakref.CallableProxyType), _py.copy_weakref),
    (subclass_of(weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet),
     _py.weak_container),
    (exactly(*_py.LOCK_TYPES), _py.copy_lock),
    (subclass_of(threading.local), _py.thread_local),
    (exactly(list), _py.copy_list),
    (exactly(dict), _py.copy_dict),
    (exactly(set), _py.copy_set),
    (exactly(frozenset), _py.copy_frozenset),
    (exactly(bytearray), _py.copy_bytearray),
    (exactly(collections.deque), _py.copy_deque),
    (subclass_of(tuple), _py.copy_tuple),
    (subclass_of(np.ndarray), _py.copy_ndarray),
    (subclass_of(_ObjectProxy), _py.copy_proxy),
    (_py.fillable, _py.copy_generic),
], fallback=_py.copy_unknown)
