"""`objckpt.clone`: an independent structural copy of a live obj.

`clone(obj)` returns a new obj with the same object tree (same checkpoint
paths, shapes, dtypes) whose variables are new `tf.Variable`s. It works for
Keras 3, tf_keras and Keras 2 models (Sequential, functional, subclassed,
registered for serialization or not), tf.Module trees, tf.train.Checkpoint
roots and optimizers, because it never goes through Keras' `get_config`,
`__reduce__` or `__deepcopy__`: it copies the Python object graph itself.

How the copy works
------------------
One walk over the object graph, with a memo (id of original -> copy), so
sharing and cycles are kept: a layer (or variable) reachable twice is one
object in the clone, reachable by both paths. Mutable objects are created as
empty shells first and filled from a work queue (no deep recursion, so very
deep functional graphs are fine). Per kind of object:

* `tf.Variable` (resource variables): a new variable on the same device with
  the same name, dtype, shape, trainable flag, synchronization, aggregation
  and constraint; its value is the original's (copy_values=True) or zeros.
  Keras 3 `keras.Variable` and Keras 2 `AutoCastVariable` wrappers are plain
  Python objects holding one and are copied generically around it.
* tf.distribute variables (`MirroredVariable`, `SyncOnReadVariable`: every
  variable made under MirroredStrategy or MultiWorkerMirroredStrategy, metrics
  and tf_keras BatchNorm statistics included): re-created under the original's
  strategy (its `scope()` is entered for them, wherever clone is called from),
  one component on each of the original's devices, same type, synchronization,
  aggregation, trainable flag, dtype, shape and name; each replica gets its own
  original replica's value. The first one met creates every distributed
  variable of the obj's tree first, in TF's object-graph order, so every worker
  of a multi-worker strategy creates the same variables in the same order.
  The strategy itself is shared. Variables TF shards or places otherwise
  (`ShardedVariable`, parameter-server, TPU and packed variables, variables with
  a variable policy) are refused with `DistributedVariableError`.
* immutable values (numbers, strings, EagerTensors, dtypes, shapes, type
  specs, enums), modules, classes, plain functions, graphs, distribution
  strategies, loggers: shared.
* lists, dicts, sets, tuples, namedtuples, deques, numpy arrays: copied.
  TF's tracking wrappers (`ListWrapper`, `_DictWrapper`, `_TupleWrapper`,
  wrapt proxies) are rebuilt around the copied container.
* generic Python objects: `object.__new__`-style shell (the class' own
  `__new__` / `__init__` are NOT run, so Keras' `__new__` side effects and
  `__setattr__` tracking are bypassed) and a copy of `__dict__` and slots.
* functions with a closure, bound methods, `functools.partial`: rebuilt
  around copied cells / `__self__` (Keras 3 stores per-instance closures
  such as the `build` wrapper that close over the layer).
* `tf.function` objects: rebuilt with the same options around the copied
  Python function, so they trace anew against the clone's variables; the
  cached Keras `train_function` / `test_function` / `predict_function` (and
  epoch iterators) are reset to None so Keras makes them again for the clone.
* weak references point at the copy of their referent when the referent is
  part of the clone, else at the original referent; WeakKeyDictionary &co.
  likewise.
* locks get fresh locks, `threading.local` a fresh local with this thread's
  attributes copied.
* dict keys and set items that are a variable's `_unique_id` string or an
  `id()` of a copied object (optimizer slot tables, Keras 3 trackers) are
  remapped to the clone's variable / object.

Impossible things raise `CloneError` (a `TypeError`) naming the attribute
path: open files, sockets, threads, generators, traced `ConcreteFunction`s,
resource tensors that are not variables (lookup tables, iterators); clone
called inside `strategy.run` or inside the scope of a strategy other than the
original's raises it too. The
TF and Keras internals it relies on (variable re-creation, `tf.function` options, the
types it treats specially, Keras' cached functions) come from `_compat`.
"""

from __future__ import annotations

import collections
import enum
import functools
import inspect
import io
import logging
import re
import sys
import threading
import types
import weakref

import numpy as np
import tensorflow as tf

from objckpt import _compat
from objckpt.errors import CloneError, DistributedVariableError, ObjckptError, about_arguments

__all__ = ["clone"]


# TF types the copier treats specially; TF internals are looked up in _compat.
_T = _compat.clone_types()
_BaseResourceVariable = _T.BaseResourceVariable
_UninitializedVariable = _T.UninitializedVariable
_EagerTensor = _T.EagerTensor
_SymbolicTensor = _T.SymbolicTensor
_TypeSpec = _T.TypeSpec
_Dimension = _T.Dimension
_Function = _T.Function
_StrategyBase = _T.StrategyBase
_StrategyExtended = _T.StrategyExtended
_ReplicaContext = _T.ReplicaContext
_EagerContext = _T.EagerContext
_Graph = _T.Graph
_Operation = _T.Operation
_PythonAPIDispatcher = _T.PythonAPIDispatcher
_ConcreteFunctionBase = _T.ConcreteFunctionBase
_AtomicFunction = _T.AtomicFunction

try:
    import wrapt as _wrapt
    _ObjectProxy = _wrapt.ObjectProxy
except ImportError:  # pragma: no cover
    _wrapt = None
    _ObjectProxy = None

# str(id(obj)), alone or as a prefix ("<id>_ib-0": Keras 3 functional node keys).
_ID_STRING = re.compile(r"(\d{6,})(?:$|[^\d])")
_LockType = type(threading.Lock())
_RLockType = type(threading.RLock())

_ATOMIC_TYPES = frozenset({
    type(None), bool, int, float, complex, str, bytes, range, slice,
    type(Ellipsis), type(NotImplemented), types.CodeType, property,
    types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.ClassMethodDescriptorType,
    type(re.compile("")), types.ModuleType,
})
_SHARED_BASES = tuple(t for t in (
    type, types.ModuleType, enum.Enum, tf.DType, tf.TensorShape, _TypeSpec, _Dimension,
    _Graph, _Operation, _StrategyBase, _StrategyExtended, _ReplicaContext, _EagerContext,
    tf.DeviceSpec, np.dtype, np.generic, inspect.Signature, inspect.Parameter,
    logging.Logger, logging.Handler, logging.Manager, staticmethod, classmethod,
    _PythonAPIDispatcher,
) if t is not None)

_UNCOPYABLE = tuple(t for t in (
    io.IOBase, threading.Thread, types.GeneratorType, types.CoroutineType,
    types.AsyncGeneratorType, types.FrameType, types.TracebackType, memoryview,
    _compat.optional("socket", "socket"), _compat.optional("subprocess", "Popen"),
    _compat.optional("multiprocessing.process", "BaseProcess"), _compat.optional("mmap", "mmap"),
    _compat.optional("sqlite3", "Connection"), _compat.optional("concurrent.futures", "Executor"),
) if t is not None)


def _path_str(path) -> str:
    """Formats an attribute path: nested (parent, kind, key) tuples, cheap to build."""
    steps = []
    while path is not None:
        steps.append(path)
        path = path[0]
    out = ""
    for _, kind, key in reversed(steps):
        if kind == "root":
            out += key
        elif kind == "attr":
            out += "." + key
        elif kind == "item":
            out += f"[{key!r}]"
        else:
            out += f".<{kind}{'' if key is None else ' ' + str(key)}>"
    return out


class _LateRef:
    """Placeholder for a weakref whose referent may be copied later in the walk."""

    __slots__ = ("original",)

    def __init__(self, original):
        self.original = original


@functools.cache
def _solid_base(cls):
    """The first C-implemented class of cls' MRO that creates instances (object, list...)."""
    for klass in cls.__mro__:
        new = klass.__dict__.get("__new__")
        if new is not None and isinstance(new, types.BuiltinFunctionType):
            return klass
    return object


@functools.cache
def _reset_attrs(cls):
    """The cached Keras attributes a clone of a cls instance starts without."""
    return _compat.KERAS_CACHED_ATTRS if hasattr(cls, "make_train_function") else ()


# What remap_key may change, besides _LateRef: ids, unique ids, tuples of them.
_MAYBE_IDS = frozenset({str, int, tuple})


# C bases whose instances clone can create empty and fill (see _Cloner.generic).
_KNOWN_BASES = (object, list, dict, set, collections.deque, collections.OrderedDict,
                collections.defaultdict, int, float, complex, str, bytes, frozenset,
                BaseException)


@functools.cache
def _slot_descriptors(cls):
    """(name, descriptor) for every __slots__ entry of cls and its bases."""
    out = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            mangled = name
            if name.startswith("__") and not name.endswith("__"):
                mangled = f"_{klass.__name__.lstrip('_')}{name}"
            descriptor = klass.__dict__.get(mangled)
            if descriptor is not None and hasattr(descriptor, "__get__"):
                out.append((mangled, descriptor))
    return tuple(out)


def _is_global(fn):
    """True if fn is reachable by its module and qualified name (not per-instance)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None:
        return False
    target = module
    for part in fn.__qualname__.split("."):
        if part == "<locals>":
            return False
        target = getattr(target, part, None)
        if target is None:
            return False
    return target is fn or getattr(target, "__wrapped__", None) is fn


def _proxy_own_dict(proxy):
    """The wrapt proxy's own attribute dict (its `_self_*` attributes)."""
    try:
        own = object.__getattribute__(proxy, "__dict__")
    except (AttributeError, TypeError):
        own = None
    wrapped = proxy.__wrapped__
    wrapped_dict = getattr(wrapped, "__dict__", None) if not isinstance(
        wrapped, (dict, list, tuple)) else None
    if own is not None and own is not wrapped_dict and not isinstance(own, types.MappingProxyType):
        return own
    import gc  # wrapt 1.x: __dict__ forwards to the wrapped object
    for ref in gc.get_referents(proxy):
        if type(ref) is dict and ref is not wrapped and any(
                isinstance(k, str) and k.startswith("_self_") for k in ref):
            return ref
    return {}


# Type -> name of the _Cloner method that copies its instances (classify is pure).
_HANDLER_NAMES: dict[type, str] = {}


def _subclass_of(*kinds):
    """A predicate on a type: a subclass of one of `kinds` (None entries: absent in this TF)."""
    kinds = tuple(k for k in kinds if k is not None)
    return lambda cls: issubclass(cls, kinds)


def _exactly(*kinds):
    """A predicate on a type: one of `kinds` itself (not a subclass)."""
    return lambda cls: cls in kinds


def _fillable(cls) -> bool:
    """Whether clone can create an empty cls instance and fill it (see `copy_generic`)."""
    base = _solid_base(cls)
    return base in _KNOWN_BASES or issubclass(base, BaseException)


# The type dispatch of the copy: (predicate on an object's type, the _Cloner method that
# copies its instances), tried in order, the first that holds wins; none: `copy_unknown`
# (a CloneError naming the path). The order matters where kinds overlap: a distributed
# variable is a resource variable too (parameter-server and TPU types), a namedtuple a
# tuple, a TF tracking wrapper a wrapt proxy, and every class a subclass of object.
_DISPATCH = (
    (_compat.is_distributed_variable, "copy_distributed"),
    (_subclass_of(_BaseResourceVariable), "copy_variable"),
    (_subclass_of(*_UNCOPYABLE), "copy_uncopyable"),
    (_subclass_of(_EagerTensor), "eager_tensor"),
    (_subclass_of(_SymbolicTensor, *_SHARED_BASES), "copy_share"),
    (_subclass_of(_Function), "tf_function"),
    (_subclass_of(_ConcreteFunctionBase, _AtomicFunction), "concrete_function"),
    (_exactly(types.FunctionType), "copy_function"),
    (_exactly(types.MethodType), "copy_method"),
    (_exactly(types.BuiltinMethodType, types.MethodWrapperType), "builtin_method"),
    (_exactly(types.CellType), "copy_cell"),
    (_exactly(functools.partial), "copy_partial"),
    (_subclass_of(weakref.ref, weakref.ProxyType, weakref.CallableProxyType), "copy_weakref"),
    (_subclass_of(weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet),
     "weak_container"),
    (_exactly(_LockType, _RLockType), "copy_lock"),
    (_subclass_of(threading.local), "thread_local"),
    (_exactly(list), "copy_list"),
    (_exactly(dict), "copy_dict"),
    (_exactly(set), "copy_set"),
    (_exactly(frozenset), "copy_frozenset"),
    (_exactly(bytearray), "copy_bytearray"),
    (_exactly(collections.deque), "copy_deque"),
    (_subclass_of(tuple), "copy_tuple"),
    (_subclass_of(np.ndarray), "copy_ndarray"),
    (_subclass_of(_ObjectProxy), "copy_proxy"),
    (_fillable, "copy_generic"),
)


class _Cloner:
    def __init__(self, copy_values: bool, root_name: str, values: dict | None = None):
        self.copy_values = copy_values
        self.root_obj = None
        self.distributed_ready = False  # distributed variables of the tree created in order
        self.values = values or {}  # id(original variable) -> initial value of its copy
        self.root = (None, "root", root_name)
        self.memo: dict[int, object] = {}
        self.keep: list = []  # originals kept alive so their ids stay unique
        self.queue: collections.deque = collections.deque()
        self.inserts: list = []  # (kind, container, items) done after the walk
        self.late_refs: list = []  # (setter, _LateRef)
        self.uids: dict[str, str] = {}  # variable _unique_id: original -> clone
        self.id_lists: list = []  # lists holding strings / tuples that may be ids
        self.id_attrs: list = []  # (attribute dict, key) whose value may be an id
        self.handlers: dict[type, object] = {}

    # ---------------------------------------------------------------- driver
    def run(self, obj):
        self.root_obj = obj
        result = self.copy(obj, self.root)
        while self.queue:
            while self.queue:
                fill, args = self.queue.popleft()
                fill(*args)
        for setter, late in self.late_refs:
            setter(self.resolve_ref(late.original))
        for new_dict, key in self.id_attrs:
            new_dict[key] = self.remap_key(new_dict[key])
        for new_list, setitem in self.id_lists:
            for i, item in enumerate(new_list):
                remapped = self.remap_key(item)
                if remapped is not item:
                    setitem(new_list, i, remapped)
        for kind, container, items, path in self.inserts:
            self.insert(kind, container, items, path)
        return result

    def fail(self, x, path, why):
        kind, where = type(x), _path_str(path)
        raise CloneError(
            f"objckpt.clone cannot copy the {kind.__module__}.{kind.__qualname__} at "
            f"`{where}`: {why}. Expected only variables, layers, modules and plain Python "
            "state. Fix: remove or reset that attribute before cloning, or build a fresh "
            "obj instead, e.g. objckpt.Twins(model, past=factory()) where factory() returns "
            "a new, identically built model.", where, kind)

    # ------------------------------------------------------------ dispatch
    def copy(self, x, path):
        cls = type(x)
        if cls in _ATOMIC_TYPES:
            return x
        try:
            return self.memo[id(x)]
        except KeyError:
            pass
        handler = self.handlers.get(cls) or self.handler(cls)
        return handler(x, path)

    def handler(self, cls):
        name = _HANDLER_NAMES.get(cls)
        if name is None:
            name = _HANDLER_NAMES[cls] = self.classify(cls).__name__
        handler = self.handlers[cls] = getattr(self, name)
        return handler

    def remember(self, x, new):
        self.memo[id(x)] = new
        self.keep.append(x)
        return new

    def classify(self, cls):
        """The method that copies instances of `cls`: the first entry of `_DISPATCH` whose
        predicate holds, else `copy_unknown`."""
        for applies, name in _DISPATCH:
            if applies(cls):
                return getattr(self, name)
        return self.copy_unknown

    # ------------------------------------------------------------- leaves
    def copy_share(self, x, path):
        return x

    def copy_bytearray(self, x, path):
        return self.remember(x, bytearray(x))

    def copy_uncopyable(self, x, path):
        self.fail(x, path, "it holds a live operating-system or interpreter resource "
                  "(file, socket, thread, process, generator) that cannot be duplicated")

    def copy_unknown(self, x, path):
        self.fail(x, path, "it is a C-implemented object of unknown semantics (no __dict__ "
                  "or __slots__ to copy, not a known immutable value)")

    # -------------------------------------------------- distributed variables
    def copy_distributed(self, v, path):
        """A MirroredVariable / SyncOnReadVariable re-created under v's own strategy.

        The first one met creates every distributed variable of the obj's tree first, in
        TF's object-graph order: every worker of a multi-worker strategy creates the same
        variables in the same order (TF pairs each new variable's initial-value broadcast
        across workers by creation order), whatever order this walk meets them in.
        """
        reason = _compat.distributed_refusal(v)
        if reason is not None:
            kind, where = type(v).__name__, _path_str(path)
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
            self.fail(v, path, "clone was called inside `strategy.run` (a replica context), "
                      "where no variable can be created; call objckpt.clone outside "
                      "strategy.run (inside or outside `strategy.scope()`)")
        if tf.distribute.has_strategy() and tf.distribute.get_strategy() is not strategy:
            self.fail(v, path, f"it belongs to a {type(strategy).__name__}, but clone was "
                      f"called inside the scope of another strategy "
                      f"({type(tf.distribute.get_strategy()).__name__}); the copy is created "
                      "under the original's strategy, so call objckpt.clone outside that "
                      "scope (or inside the original's `strategy.scope()`)")
        if not self.distributed_ready:
            self.distributed_ready = True
            self.create_tree_distributed()
            if id(v) in self.memo:
                return self.memo[id(v)]
        return self.create_distributed(v, path)

    def create_tree_distributed(self):
        """Creates the copies of the obj tree's distributed variables in the tree's order."""
        if not _compat.is_trackable(self.root_obj):
            return
        try:
            found = _compat.variable_paths(self.root_obj)
        except (ObjckptError, TypeError, ValueError, AttributeError):
            return  # the walk meets them in its own (deterministic) order, or refuses them
        for object_path, variable in found:
            variable = _compat.autocast_inner(variable) or variable
            if (id(variable) not in self.memo
                    and _compat.is_distributed_variable(type(variable))
                    and _compat.distributed_refusal(variable) is None):
                self.create_distributed(variable, (self.root, "object path", object_path))

    def create_distributed(self, v, path):
        originals = _compat.replica_components(v)
        given = self.values.pop(id(v), None)  # checked against v by the caller
        if given is not None:
            value = given
        elif self.copy_values:
            value = originals[0].value()
        else:
            value = self._zeros(originals[0])
        try:
            new = _compat.recreate_distributed(v, value, re.sub(r":\d+$", "", v.name))
            copies = _compat.replica_components(new)
            if given is None and self.copy_values:
                # Each replica gets its own original's value (SyncOnRead replicas differ;
                # under multi-worker, the initial value came from the chief).
                for original, copy in zip(originals, copies):
                    copy.assign(original.value())
        except (tf.errors.OpError, ValueError, TypeError, RuntimeError) as err:
            kind, where = type(v).__name__, _path_str(path)
            raise DistributedVariableError(
                f"objckpt.clone could not re-create the {kind} at `{where}` under its "
                f"{type(v.distribute_strategy).__name__} as a {kind} on the same devices: "
                f"{err}. Fix: build a fresh obj under the strategy instead of cloning, e.g. "
                "objckpt.Twins(model, past=factory()) where factory() returns a new, "
                "identically built model.", where, kind) from err
        self.remember(v, new)
        self.uids[_compat.unique_id(v)] = _compat.unique_id(new)
        for i, (original, copy) in enumerate(zip(originals, copies)):
            self.remember(original, copy)
            self.uids[_compat.unique_id(original)] = _compat.unique_id(copy)
            self.queue.append((self.fill_variable, (original, copy, (path, "replica", i))))
        self.queue.append((self.fill_variable, (v, new, path)))
        return new

    def concrete_function(self, x, path):
        self.fail(x, path, "it is a traced ConcreteFunction, which captured the original's "
                  "variables and cannot be re-pointed at the clone")

    def eager_tensor(self, x, path):
        if x.dtype in (tf.resource, tf.variant):
            self.fail(x, path, f"it is a {x.dtype.name} tensor: a handle to TF runtime state "
                      "(lookup table, iterator, queue...) that would be shared, not copied")
        return x

    def copy_variable(self, v, path):
        if (_UninitializedVariable is not None and isinstance(v, _UninitializedVariable)
                and not bool(v.is_initialized())):
            self.fail(v, path, "it is an uninitialized variable (restore-on-create placeholder)")
        name = v.name
        name = re.sub(r":\d+$", "", name)
        try:
            with tf.device(v.device):
                # A value given by the caller was checked against v (load_ensemble's plan).
                value = self.values.pop(id(v), None)
                if value is None:
                    value = self._initial_value(v)
                new = _compat.recreate_variable(v, value, name)
        except (tf.errors.OpError, ValueError, TypeError) as err:
            self.fail(v, path, f"re-creating the variable failed: {err}")
        self.remember(v, new)
        self.uids[_compat.unique_id(v)] = _compat.unique_id(new)
        self.queue.append((self.fill_variable, (v, new, path)))
        return new

    def _initial_value(self, v):
        if self.copy_values:
            return v.value()
        return self._zeros(v)

    @staticmethod
    def _zeros(v):
        if v.shape.is_fully_defined():
            return tf.zeros(v.shape, v.dtype)
        return tf.zeros(tf.shape(v.value()), v.dtype)

    def fill_variable(self, v, new, path):
        own = v.__dict__
        fresh = new.__dict__
        key = _compat.CONSTRAINT_ATTR  # re-created variables have none: copy the original's
        if own.get(key) is not None:
            fresh[key] = self.copy(own[key], (path, "attr", key))
        for key, value in own.items():  # attributes added by Keras or the user
            if key not in fresh:
                fresh[key] = self.value(self.copy(value, (path, "attr", key)),
                                        lambda r, key=key: fresh.__setitem__(key, r))

    def tf_function(self, f, path):
        python_function, kwargs = _compat.function_parts(f)
        copied = self.copy(python_function, (path, "attr", "_python_function"))
        if copied is python_function:
            return self.remember(f, f)  # stateless: tracing depends on arguments only
        return self.remember(f, _compat.rewrap_function(copied, kwargs))

    # ----------------------------------------------------------- callables
    def copy_function(self, fn, path):
        if fn.__closure__ is None or _is_global(fn):
            # Module-level functions (decorated ones included) are program, not state.
            return self.remember(fn, fn)
        cells = None
        if fn.__closure__ is not None:
            cells = tuple(self.copy(c, (path, "closure", name))
                          for c, name in zip(fn.__closure__, fn.__code__.co_freevars))
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                                 cells)
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        new.__module__ = fn.__module__
        new.__doc__ = fn.__doc__
        new.__annotations__ = fn.__annotations__
        self.remember(fn, new)
        if fn.__dict__:
            self.queue.append((self.fill_dict_attrs, (fn.__dict__, new.__dict__, path)))
        return new

    def copy_cell(self, c, path):
        new = self.remember(c, types.CellType())
        self.queue.append((self.fill_cell, (c, new, path)))
        return new

    def fill_cell(self, c, new, path):
        try:
            contents = c.cell_contents
        except ValueError:  # empty cell
            return
        value = self.copy(contents, path)
        new.cell_contents = self.value(value, lambda r: setattr(new, "cell_contents", r))

    def copy_method(self, m, path):
        func = self.copy(m.__func__, (path, "attr", "__func__"))
        owner = self.copy(m.__self__, (path, "attr", "__self__"))
        if func is m.__func__ and owner is m.__self__:
            return self.remember(m, m)
        return self.remember(m, types.MethodType(func, owner))

    def builtin_method(self, m, path):
        owner = getattr(m, "__self__", None)
        if owner is None or isinstance(owner, (types.ModuleType, type)):
            return m
        new_owner = self.copy(owner, (path, "attr", "__self__"))
        if new_owner is owner:
            return m
        return self.remember(m, getattr(new_owner, m.__name__))

    def copy_partial(self, p, path):
        func = self.copy(p.func, (path, "attr", "func"))
        args = tuple(self.copy(a, (path, "item", i)) for i, a in enumerate(p.args))
        kwargs = {k: self.copy(v, (path, "item", k)) for k, v in p.keywords.items()}
        new = self.remember(p, functools.partial(func, *args, **kwargs))
        if p.__dict__:
            self.queue.append((self.fill_dict_attrs, (p.__dict__, new.__dict__, path)))
        return new

    # ------------------------------------------------------------- weakrefs
    def resolve_ref(self, ref):
        """A weakref (or proxy) to the copy of ref's referent, or ref itself."""
        if isinstance(ref, (weakref.ProxyType, weakref.CallableProxyType)):
            return ref  # proxies cannot reveal their referent; keep
        target = ref()
        if target is None:
            return ref
        new_target = self.memo.get(id(target))
        if new_target is None or new_target is target:
            return ref
        callback = ref.__callback__
        if callback is not None:
            callback = self.memo.get(id(callback), callback)
        if type(ref) is weakref.ref:
            return weakref.ref(new_target, callback) if callback else weakref.ref(new_target)
        if isinstance(ref, weakref.WeakMethod):
            return weakref.WeakMethod(new_target, callback)
        try:
            return type(ref)(new_target, callback)
        except TypeError:
            return weakref.ref(new_target, callback) if callback else weakref.ref(new_target)

    def copy_weakref(self, ref, path):
        return _LateRef(ref)  # decided once the walk knows what is copied

    def value(self, new, setter):
        """Registers a late weakref placeholder for resolution; returns new."""
        if type(new) is _LateRef:
            self.late_refs.append((setter, new))
        return new

    def weak_container(self, x, path):
        new = self.remember(x, type(x)())
        if isinstance(x, weakref.WeakSet):
            self.inserts.append(("weakset", new, list(x), path))
        elif isinstance(x, weakref.WeakKeyDictionary):
            items = [(k, self.copy(v, (path, "item", str(k)))) for k, v in x.items()]
            self.inserts.append(("weakkey", new, items, path))
        else:
            items = [(self.copy(k, (path, "item", k)), v) for k, v in x.items()]
            self.inserts.append(("weakvalue", new, items, path))
        return new

    # ---------------------------------------------------------- containers
    def copy_list(self, x, path):
        new = self.remember(x, [])
        self.queue.append((self.fill_list, (x, new, path, list.extend)))
        return new

    def fill_list(self, x, new, path, extend, setitem=list.__setitem__):
        items = [self.copy(item, (path, "item", i)) for i, item in enumerate(list.__iter__(x))]
        extend(new, items)
        maybe_ids = False
        for i, item in enumerate(items):
            kind = type(item)
            if kind is _LateRef:
                self.late_refs.append((lambda r, i=i, s=setitem: s(new, i, r), item))
            elif kind is str or kind is tuple or kind is int:
                maybe_ids = True
        if maybe_ids:
            self.id_lists.append((new, setitem))

    def copy_deque(self, x, path):
        new = self.remember(x, collections.deque(maxlen=x.maxlen))
        self.queue.append((self.fill_list, (x, new, path, collections.deque.extend,
                                              collections.deque.__setitem__)))
        return new

    def copy_dict(self, x, path):
        new = self.remember(x, {})
        self.queue.append((self.fill_mapping, (x, new, path, dict.__setitem__, dict.items)))
        return new

    def fill_mapping(self, x, new, path, setitem, items_of):
        copy, atomic = self.copy, _ATOMIC_TYPES
        items = [(k if type(k) in atomic else copy(k, (path, "key", None)),
                  v if type(v) in atomic else copy(v, (path, "item", k)))
                 for k, v in items_of(x)]
        self.inserts.append(("map", new, (items, setitem), path))

    def copy_set(self, x, path):
        new = self.remember(x, set())
        self.queue.append((self.fill_set, (x, new, path, set.add)))
        return new

    def fill_set(self, x, new, path, add):
        items = [self.copy(item, (path, "item", None)) for item in set.__iter__(x)]
        self.inserts.append(("set", new, (items, add), path))

    def copy_frozenset(self, x, path):
        items = [self.copy(item, (path, "item", None)) for item in x]
        if all(a is b for a, b in zip(items, x)):
            return self.remember(x, x)
        # Items may be unfilled shells; hashing by identity is safe, by value is not.
        return self.remember(x, frozenset(self.resolve_now(i) for i in items))

    def resolve_now(self, item):
        return self.resolve_ref(item.original) if type(item) is _LateRef else item

    def copy_tuple(self, x, path):
        items = [self.resolve_now(self.copy(item, (path, "item", i)))
                 for i, item in enumerate(tuple.__iter__(x))]
        if id(x) in self.memo:  # reached itself through a cycle
            return self.memo[id(x)]
        cls = type(x)
        has_dict = cls is not tuple and hasattr(x, "__dict__")
        if all(a is b for a, b in zip(items, x)) and not has_dict:
            return self.remember(x, x)
        new = tuple.__new__(cls, items)
        self.remember(x, new)
        if has_dict and x.__dict__:
            self.queue.append((self.fill_dict_attrs, (x.__dict__, new.__dict__, path)))
        return new

    def copy_ndarray(self, x, path):
        if x.dtype == object:
            new = np.empty_like(x)
            self.remember(x, new)
            for index, item in np.ndenumerate(x):
                new[index] = self.resolve_now(self.copy(item, (path, "item", index)))
            return new
        return self.remember(x, x.copy())

    def copy_lock(self, x, path):
        return self.remember(x, type(x)() if type(x) is _RLockType else threading.Lock())

    def thread_local(self, x, path):
        new = self.remember(x, type(x).__new__(type(x)))
        self.queue.append((self.fill_dict_attrs, (x.__dict__, new.__dict__, path)))
        return new

    def copy_proxy(self, x, path):
        cls = type(x)
        wrapped = self.copy(x.__wrapped__, (path, "attr", "__wrapped__"))
        new = _solid_base(cls).__new__(cls)
        _solid_base(cls).__init__(new, wrapped)
        self.remember(x, new)
        self.queue.append((self.fill_proxy, (x, new, path)))
        return new

    def fill_proxy(self, x, new, path):
        setattr_ = _solid_base(type(x)).__setattr__  # wrapt's: `_self_*` stay on the proxy
        for key, value in list(_proxy_own_dict(x).items()):
            if not key.startswith("_self_"):
                continue  # e.g. __doc__; anything else lives on the wrapped object
            copied = self.copy(value, (path, "attr", key))
            setattr_(new, key, copied)
            self.value(copied, lambda r, k=key: setattr_(new, k, r))

    # -------------------------------------------------------------- objects
    def copy_generic(self, x, path):
        cls = type(x)
        base = _solid_base(cls)
        try:
            if base in (int, float, complex, str, bytes, frozenset):
                new = base.__new__(cls, base(x))
            elif issubclass(base, BaseException):
                new = base.__new__(cls, *x.args)
            else:
                new = base.__new__(cls)
        except TypeError as err:
            self.fail(x, path, f"its C base {base.__qualname__} cannot be created empty ({err})")
        self.remember(x, new)
        self.queue.append((self.fill_generic, (x, new, path, base)))
        return new

    def fill_generic(self, x, new, path, base):
        try:
            own = object.__getattribute__(x, "__dict__")
        except AttributeError:
            own = None
        if own:
            new_dict = object.__getattribute__(new, "__dict__")
            reset = _reset_attrs(type(x))
            self.fill_dict_attrs(own, new_dict, path, reset)
        for name, descriptor in _slot_descriptors(type(x)):
            try:
                value = descriptor.__get__(x, type(x))
            except AttributeError:
                continue
            copied = self.copy(value, (path, "attr", name))
            descriptor.__set__(new, copied)
            self.value(copied, lambda r, d=descriptor: d.__set__(new, r))
        if base is object:
            return
        if issubclass(base, dict):
            self.fill_mapping(x, new, path, base.__setitem__, dict.items)
            if isinstance(x, collections.defaultdict):
                new.default_factory = self.copy(x.default_factory, path)
        elif issubclass(base, list):
            self.fill_list(x, new, path, list.extend)
        elif issubclass(base, set):
            self.fill_set(x, new, path, set.add)
        elif issubclass(base, collections.deque):
            self.fill_list(x, new, path, collections.deque.extend, collections.deque.__setitem__)

    def fill_dict_attrs(self, own, new_dict, path, reset=()):
        memo, handlers, atomic, id_attrs = self.memo, self.handlers, _ATOMIC_TYPES, self.id_attrs
        items = list(own.items())
        new_dict.update(items)  # immutable values stay as they are; the rest is replaced
        for key, value in items:
            if reset and key in reset:
                new_dict[key] = None
                continue
            kind = type(value)
            if kind in atomic:
                if kind is str:
                    if len(value) >= 6 and value[0].isdigit():
                        id_attrs.append((new_dict, key))  # may be an id: remapped at the end
                elif kind is int and value > 1 << 32:
                    id_attrs.append((new_dict, key))
                continue
            copied = memo.get(id(value))
            if copied is None:
                copied = (handlers.get(kind) or self.handler(kind))(value, (path, "attr", key))
            new_dict[key] = copied
            if type(copied) is _LateRef:
                self.late_refs.append((lambda r, k=key: new_dict.__setitem__(k, r), copied))

    # ------------------------------------------------------------- inserts
    def remap_key(self, key):
        """Ids of originals become the clone's, wherever they were stored as keys.

        Optimizers key slot tables by the variable's `_unique_id` string (TF1,
        tf_keras, Keras 3 on TF) or `id()` (Keras 3 base); Keras 3 trackers
        keep sets of `id()`s; tf_keras functional graphs key tensors by
        `str(id(tensor))`, Keras 3 functional nodes by `f"{id(op)}_ib-{i}"`.
        Each is mapped to the clone's object. An int or digit string is only
        remapped when it equals the id of an object that was copied.
        """
        kind = type(key)
        if kind is str:
            new = self.uids.get(key)
            if new is not None:
                return new
            if len(key) >= 6 and key[0].isdigit():
                match = _ID_STRING.match(key)  # "<id>" or "<id>_suffix"
                if match:
                    copied = self.memo.get(int(match.group(1)))
                    if copied is not None:
                        return str(id(copied)) + key[match.end(1):]
            return key
        if kind is int and key > 1 << 32:  # never a count or size; only addresses
            new = self.memo.get(key)
            return key if new is None else id(new)
        if kind is _LateRef:
            return self.resolve_ref(key.original)
        if kind is tuple and key:
            items = tuple(self.remap_key(k) for k in key)
            return key if all(a is b for a, b in zip(items, key)) else items
        return key

    def insert(self, kind, container, payload, path):
        if kind == "map":
            items, setitem = payload
            remap = self.remap_key
            for key, value in items:
                if type(key) in _MAYBE_IDS or type(key) is _LateRef:
                    key = remap(key)
                kind = type(value)
                if kind is _LateRef:
                    value = self.resolve_ref(value.original)
                elif kind in _MAYBE_IDS:
                    value = remap(value)
                setitem(container, key, value)
        elif kind == "set":
            items, add = payload
            for item in items:
                add(container, self.remap_key(item))
        elif kind == "weakkey":
            for key, value in payload:
                container[self.memo.get(id(key), key)] = self.resolve_now(value)
        elif kind == "weakvalue":
            for key, value in payload:
                container[key] = self.memo.get(id(value), value)
        elif kind == "weakset":
            for item in payload:
                container.add(self.memo.get(id(item), item))


@about_arguments(obj="obj")
def clone(obj, *, copy_values: bool = True):
    """Returns an independent copy of obj: same object tree, new variables.

    The clone has the same object paths (`objckpt.tree(clone)` keys), shapes and
    dtypes as obj; no variable is shared, and a variable or layer reachable by
    two paths in obj is one object reachable by both paths in the clone.
    Keras models of every flavour are copied without `get_config`, so
    subclassed models need neither registration nor `get_config`; an unbuilt
    model clones unbuilt. An attached optimizer is cloned with the model and its
    slot variables point at the clone's variables; compiled train / predict
    functions are not copied but re-traced for the clone on first use.

    Under tf.distribute (MirroredStrategy, MultiWorkerMirroredStrategy) the
    clone's variables are created under the original's strategy, mirrored like
    the original (MirroredVariable or SyncOnReadVariable, same synchronization
    and aggregation, one component per replica on the same devices), whether
    clone is called inside or outside `strategy.scope()`; each replica starts
    with the value of the same replica of the original. Call it outside
    `strategy.run`, and on every worker of a multi-worker strategy.

    Args:
      obj: a Keras model or layer (any flavour), a tf.Module, a
        tf.train.Checkpoint, an optimizer, or any Python object holding them.
      copy_values: True: every variable starts with the original's value (every
        replica of a distributed variable with its own replica's), so the clone
        computes bit-identical outputs. False: every variable is a new variable
        of the same shape and dtype filled with zeros, on every replica
        (initializers are not re-run); restore values into it with objckpt.restore.

    Returns:
      The clone, of obj's type.

    Raises:
      CloneError (a TypeError): something in obj cannot be duplicated (open
        file, thread, traced ConcreteFunction, lookup table), or clone was
        called inside `strategy.run` or another strategy's scope; the message
        names its attribute path.
      DistributedVariableError (a TypeError): a tf.distribute variable clone
        cannot re-create faithfully (`ShardedVariable` from a variable
        partitioner, parameter-server, TPU or packed variables); the message
        names its attribute path and type.
    """
    result = clone_with_values(obj, copy_values=copy_values)[0]
    # Tensors a layer caches from its variables (an adapted Normalization's mean) were copied
    # as they are: computed again from the clone's own variables, as Keras's loaders do.
    _compat.refresh_derived_state(result)
    return result


def clone_with_values(obj, values: dict | None = None, *, copy_values: bool = False):
    """`clone`, where a variable whose id is in `values` starts with that value.

    Returns (the clone, a dict mapping id(original object) to its copy, for
    every object copied). The values must fit their variables (shape, dtype).
    """
    if not tf.executing_eagerly():
        raise CloneError("objckpt.clone needs eager execution; it was called inside a "
                         "tf.function or TF1 graph. Fix: call it eagerly, outside the "
                         "tf.function.")
    name = getattr(obj, "name", None)
    root = type(obj).__name__ if not isinstance(name, str) else f"{type(obj).__name__}({name!r})"
    cloner = _Cloner(copy_values, root, values)
    return cloner.run(obj), cloner.memo
