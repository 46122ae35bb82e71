"""The copiers of Python's kinds: callables (functions with closures, methods, partials),
weak references, containers, locks and plain objects (see the package's docstring).

Each is `copier(walker, x, path)`, listed in `table.COPIERS`.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import types
import weakref

import numpy as np

from objckpt import _compat
from objckpt._ops.clone.walker import LateRef

__all__ = ["LOCK_TYPES", "builtin_method", "copy_bytearray", "copy_cell", "copy_deque",
           "copy_dict", "copy_frozenset", "copy_function", "copy_generic", "copy_list",
           "copy_lock", "copy_method", "copy_ndarray", "copy_partial", "copy_proxy", "copy_set",
           "copy_share", "copy_tuple", "copy_uncopyable", "copy_unknown", "copy_weakref",
           "fill_cell", "fill_generic", "fill_proxy", "fillable", "is_global", "proxy_own_dict",
           "slot_descriptors", "solid_base", "thread_local", "weak_container"]

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_RLockType = LOCK_TYPES[1]


@functools.cache
def solid_base(cls):
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


# C bases whose instances clone can create empty and fill (see copy_generic).
_KNOWN_BASES = (object, list, dict, set, collections.deque, collections.OrderedDict,
                collections.defaultdict, int, float, complex, str, bytes, frozenset,
                BaseException)


@functools.cache
def slot_descriptors(cls):
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


def is_global(fn):
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


def proxy_own_dict(proxy):
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


def fillable(cls) -> bool:
    """Whether clone can create an empty cls instance and fill it (see `copy_generic`)."""
    base = solid_base(cls)
    return base in _KNOWN_BASES or issubclass(base, BaseException)


def copy_share(walker, x, path):
    """Shared by the clone: program, types and immutable values."""
    return x


def copy_bytearray(walker, x, path):
    """A new bytearray of the same bytes."""
    return walker.remember(x, bytearray(x))


def copy_uncopyable(walker, x, path):
    """Refused: a live operating-system or interpreter resource."""
    walker.fail(x, path, "it holds a live operating-system or interpreter resource "
                "(file, socket, thread, process, generator) that cannot be duplicated")


def copy_unknown(walker, x, path):
    """Refused: a C-implemented object the table has no copier for."""
    walker.fail(x, path, "it is a C-implemented object of unknown semantics (no __dict__ "
                "or __slots__ to copy, not a known immutable value)")


def copy_function(walker, fn, path):
    """A function with a closure, rebuilt around copied cells (module-level: shared)."""
    if fn.__closure__ is None or is_global(fn):
        # Module-level functions (decorated ones included) are program, not state.
        return walker.remember(fn, fn)
    cells = None
    if fn.__closure__ is not None:
        cells = tuple(walker.copy(c, (path, "closure", name))
                      for c, name in zip(fn.__closure__, fn.__code__.co_freevars))
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                             cells)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = fn.__annotations__
    walker.remember(fn, new)
    if fn.__dict__:
        walker.queue.append((walker.fill_dict_attrs, (fn.__dict__, new.__dict__, path)))
    return new


def copy_cell(walker, c, path):
    """A closure cell, filled later."""
    new = walker.remember(c, types.CellType())
    walker.queue.append((fill_cell, (walker, c, new, path)))
    return new


def fill_cell(walker, c, new, path):
    """Fills a copied cell with the copy of the original's contents."""
    try:
        contents = c.cell_contents
    except ValueError:  # empty cell
        return
    value = walker.copy(contents, path)
    new.cell_contents = walker.value(value, lambda r: setattr(new, "cell_contents", r))


def copy_method(walker, m, path):
    """A bound method of the copied object and function."""
    func = walker.copy(m.__func__, (path, "attr", "__func__"))
    owner = walker.copy(m.__self__, (path, "attr", "__self__"))
    if func is m.__func__ and owner is m.__self__:
        return walker.remember(m, m)
    return walker.remember(m, types.MethodType(func, owner))


def builtin_method(walker, m, path):
    """A builtin method bound to the copied object."""
    owner = getattr(m, "__self__", None)
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return m
    new_owner = walker.copy(owner, (path, "attr", "__self__"))
    if new_owner is owner:
        return m
    return walker.remember(m, getattr(new_owner, m.__name__))


def copy_partial(walker, p, path):
    """A functools.partial of copied function and arguments."""
    func = walker.copy(p.func, (path, "attr", "func"))
    args = tuple(walker.copy(a, (path, "item", i)) for i, a in enumerate(p.args))
    kwargs = {k: walker.copy(v, (path, "item", k)) for k, v in p.keywords.items()}
    new = walker.remember(p, functools.partial(func, *args, **kwargs))
    if p.__dict__:
        walker.queue.append((walker.fill_dict_attrs, (p.__dict__, new.__dict__, path)))
    return new


def copy_weakref(walker, ref, path):
    """A weak reference, decided once the walk knows what is copied."""
    return LateRef(ref)  # decided once the walk knows what is copied


def weak_container(walker, x, path):
    """A WeakSet or weak dictionary, filled after the walk."""
    new = walker.remember(x, type(x)())
    if isinstance(x, weakref.WeakSet):
        walker.inserts.append(("weakset", new, list(x), path))
    elif isinstance(x, weakref.WeakKeyDictionary):
        items = [(k, walker.copy(v, (path, "item", str(k)))) for k, v in x.items()]
        walker.inserts.append(("weakkey", new, items, path))
    else:
        items = [(walker.copy(k, (path, "item", k)), v) for k, v in x.items()]
        walker.inserts.append(("weakvalue", new, items, path))
    return new


def copy_list(walker, x, path):
    """A list, filled later."""
    new = walker.remember(x, [])
    walker.queue.append((walker.fill_list, (x, new, path, list.extend)))
    return new


def copy_deque(walker, x, path):
    """A deque of the same maxlen, filled later."""
    new = walker.remember(x, collections.deque(maxlen=x.maxlen))
    walker.queue.append((walker.fill_list, (x, new, path, collections.deque.extend,
                                            collections.deque.__setitem__)))
    return new


def copy_dict(walker, x, path):
    """A dict, filled after the walk (its keys may be remapped ids)."""
    new = walker.remember(x, {})
    walker.queue.append((walker.fill_mapping, (x, new, path, dict.__setitem__, dict.items)))
    return new


def copy_set(walker, x, path):
    """A set, filled after the walk."""
    new = walker.remember(x, set())
    walker.queue.append((walker.fill_set, (x, new, path, set.add)))
    return new


def copy_frozenset(walker, x, path):
    """A frozenset of the copied items (itself when nothing changed)."""
    items = [walker.copy(item, (path, "item", None)) for item in x]
    if all(a is b for a, b in zip(items, x)):
        return walker.remember(x, x)
    # Items may be unfilled shells; hashing by identity is safe, by value is not.
    return walker.remember(x, frozenset(walker.resolve_now(i) for i in items))


def copy_tuple(walker, x, path):
    """A tuple (or namedtuple) of the copied items (itself when nothing changed)."""
    items = [walker.resolve_now(walker.copy(item, (path, "item", i)))
             for i, item in enumerate(tuple.__iter__(x))]
    if id(x) in walker.memo:  # reached itself through a cycle
        return walker.memo[id(x)]
    cls = type(x)
    has_dict = cls is not tuple and hasattr(x, "__dict__")
    if all(a is b for a, b in zip(items, x)) and not has_dict:
        return walker.remember(x, x)
    new = tuple.__new__(cls, items)
    walker.remember(x, new)
    if has_dict and x.__dict__:
        walker.queue.append((walker.fill_dict_attrs, (x.__dict__, new.__dict__, path)))
    return new


def copy_ndarray(walker, x, path):
    """A NumPy array copy (object arrays item by item)."""
    if x.dtype == object:
        new = np.empty_like(x)
        walker.remember(x, new)
        for index, item in np.ndenumerate(x):
            new[index] = walker.resolve_now(walker.copy(item, (path, "item", index)))
        return new
    return walker.remember(x, x.copy())


def copy_lock(walker, x, path):
    """A fresh lock of the same kind."""
    return walker.remember(x, type(x)() if type(x) is _RLockType else threading.Lock())


def thread_local(walker, x, path):
    """A fresh threading.local with this thread's attributes copied."""
    new = walker.remember(x, type(x).__new__(type(x)))
    walker.queue.append((walker.fill_dict_attrs, (x.__dict__, new.__dict__, path)))
    return new


def copy_proxy(walker, x, path):
    """A wrapt proxy (TF's tracking wrappers) around the copied object."""
    cls = type(x)
    wrapped = walker.copy(x.__wrapped__, (path, "attr", "__wrapped__"))
    new = solid_base(cls).__new__(cls)
    solid_base(cls).__init__(new, wrapped)
    walker.remember(x, new)
    walker.queue.append((fill_proxy, (walker, x, new, path)))
    return new


def fill_proxy(walker, x, new, path):
    """Copies the proxy's own `_self_*` attributes."""
    setattr_ = solid_base(type(x)).__setattr__  # wrapt's: `_self_*` stay on the proxy
    for key, value in list(proxy_own_dict(x).items()):
        if not key.startswith("_self_"):
            continue  # e.g. __doc__; anything else lives on the wrapped object
        copied = walker.copy(value, (path, "attr", key))
        setattr_(new, key, copied)
        walker.value(copied, lambda r, k=key: setattr_(new, k, r))


def copy_generic(walker, x, path):
    """A plain object: an empty shell of its class (no __new__/__init__ run), filled later."""
    cls = type(x)
    base = solid_base(cls)
    try:
        if base in (int, float, complex, str, bytes, frozenset):
            new = base.__new__(cls, base(x))
        elif issubclass(base, BaseException):
            new = base.__new__(cls, *x.args)
        else:
            new = base.__new__(cls)
    except TypeError as err:
        walker.fail(x, path, f"its C base {base.__qualname__} cannot be created empty ({err})")
    walker.remember(x, new)
    walker.queue.append((fill_generic, (walker, x, new, path, base)))
    return new


def fill_generic(walker, x, new, path, base):
    """Fills a shell: its __dict__, slots and its C base's items."""
    try:
        own = object.__getattribute__(x, "__dict__")
    except AttributeError:
        own = None
    if own:
        new_dict = object.__getattribute__(new, "__dict__")
        reset = _reset_attrs(type(x))
        walker.fill_dict_attrs(own, new_dict, path, reset)
    for name, descriptor in slot_descriptors(type(x)):
        try:
            value = descriptor.__get__(x, type(x))
        except AttributeError:
            continue
        copied = walker.copy(value, (path, "attr", name))
        descriptor.__set__(new, copied)
        walker.value(copied, lambda r, d=descriptor: d.__set__(new, r))
    if base is object:
        return
    if issubclass(base, dict):
        walker.fill_mapping(x, new, path, base.__setitem__, dict.items)
        if isinstance(x, collections.defaultdict):
            new.default_factory = walker.copy(x.default_factory, path)
    elif issubclass(base, list):
        walker.fill_list(x, new, path, list.extend)
    elif issubclass(base, set):
        walker.fill_set(x, new, path, set.add)
    elif issubclass(base, collections.deque):
        walker.fill_list(x, new, path, collections.deque.extend, collections.deque.__setitem__)
