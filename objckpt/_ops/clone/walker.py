"""The walk of `clone`: one pass over a Python object graph, each object copied by the copier
a `CopierTable` names for its type.

The walker knows nothing of kinds of objects; it owns what every copier shares: the memo
(id of an original -> its copy, so sharing and cycles are kept), the work queue (mutable
objects are created as empty shells first and filled later: no deep recursion), weak
references resolved once the walk knows what was copied, and ids of originals stored as
dict keys or attribute values remapped to the copies' at the end.
"""

from __future__ import annotations

import collections
import re
import types
import weakref

from objckpt.errors import CloneError

__all__ = ["ATOMIC_TYPES", "LateRef", "Walker", "path_str"]

# str(id(obj)), alone or as a prefix ("<id>_ib-0": Keras 3 functional node keys).
_ID_STRING = re.compile(r"(\d{6,})(?:$|[^\d])")

# Immutable values the walk returns as they are, without looking them up.
ATOMIC_TYPES = frozenset({
    type(None), bool, int, float, complex, str, bytes, range, slice,
    type(Ellipsis), type(NotImplemented), types.CodeType, property,
    types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.ClassMethodDescriptorType,
    type(re.compile("")), types.ModuleType,
})

# What remap_key may change, besides LateRef: ids, unique ids, tuples of them.
_MAYBE_IDS = frozenset({str, int, tuple})


def path_str(path) -> str:
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


class LateRef:
    """Placeholder for a weakref whose referent may be copied later in the walk."""

    __slots__ = ("original",)

    def __init__(self, original):
        self.original = original


class Walker:
    """Copies an object graph, each object by the copier its type's table entry names.

    A copier is a function `copier(walker, x, path)` that returns the copy of `x` (an
    attribute path, for messages: nested (parent, kind, key) tuples); it calls
    `walker.remember(x, copy)` before anything that may reach `x` again, `walker.copy` for
    what `x` holds, and puts what can wait on `walker.queue` as (function, arguments).

    Args:
      copy_values: whether copied variables start with the originals' values (else zeros).
      root_name: how messages name the object cloned.
      values: id(original variable) -> the initial value of its copy (taken once).
      table: the `CopierTable` (`copier_for(cls)`).

    Attributes:
      memo: id(original) -> its copy, for every object copied.
      queue: the work still to do, (function, arguments).
      uids: variable unique ids, original -> copy.
    """

    def __init__(self, copy_values: bool, root_name: str, values: dict | None = None, *,
                 table):
        self.copy_values = copy_values
        self.table = table
        self.root_obj = None
        self.distributed_ready = False  # distributed variables of the tree created in order
        self.values = values or {}  # id(original variable) -> initial value of its copy
        self.root = (None, "root", root_name)
        self.memo: dict[int, object] = {}
        self.keep: list = []  # originals kept alive so their ids stay unique
        self.queue: collections.deque = collections.deque()
        self.inserts: list = []  # (kind, container, items) done after the walk
        self.late_refs: list = []  # (setter, LateRef)
        self.uids: dict[str, str] = {}  # variable _unique_id: original -> clone
        self.id_lists: list = []  # lists holding strings / tuples that may be ids
        self.id_attrs: list = []  # (attribute dict, key) whose value may be an id
        self.handlers: dict[type, object] = {}  # type -> its copier, as the table says

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
        kind, where = type(x), path_str(path)
        raise CloneError(
            f"objckpt.clone cannot copy the {kind.__module__}.{kind.__qualname__} at "
            f"`{where}`: {why}. Expected only variables, layers, modules and plain Python "
            "state. Fix: remove or reset that attribute before cloning, or build a fresh "
            "obj instead, e.g. objckpt.Twins(model, past=factory()) where factory() returns "
            "a new, identically built model.", where, kind)

    # ------------------------------------------------------------ dispatch
    def copy(self, x, path):
        """The copy of `x` (`x` itself for immutable values and what is shared)."""
        cls = type(x)
        if cls in ATOMIC_TYPES:
            return x
        try:
            return self.memo[id(x)]
        except KeyError:
            pass
        handler = self.handlers.get(cls) or self.handler(cls)
        return handler(self, x, path)

    def handler(self, cls):
        """The copier of `cls`'s instances (looked up once per type)."""
        handler = self.handlers[cls] = self.table.copier_for(cls)
        return handler

    def classify(self, cls):
        """The copier of `cls`'s instances, as the table says."""
        return self.table.copier_for(cls)

    def remember(self, x, new):
        self.memo[id(x)] = new
        self.keep.append(x)
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

    def value(self, new, setter):
        """Registers a late weakref placeholder for resolution; returns new."""
        if type(new) is LateRef:
            self.late_refs.append((setter, new))
        return new

    def resolve_now(self, item):
        return self.resolve_ref(item.original) if type(item) is LateRef else item

    # ---------------------------------------------------------- containers
    def fill_list(self, x, new, path, extend, setitem=list.__setitem__):
        items = [self.copy(item, (path, "item", i)) for i, item in enumerate(list.__iter__(x))]
        extend(new, items)
        maybe_ids = False
        for i, item in enumerate(items):
            kind = type(item)
            if kind is LateRef:
                self.late_refs.append((lambda r, i=i, s=setitem: s(new, i, r), item))
            elif kind is str or kind is tuple or kind is int:
                maybe_ids = True
        if maybe_ids:
            self.id_lists.append((new, setitem))

    def fill_mapping(self, x, new, path, setitem, items_of):
        copy, atomic = self.copy, ATOMIC_TYPES
        items = [(k if type(k) in atomic else copy(k, (path, "key", None)),
                  v if type(v) in atomic else copy(v, (path, "item", k)))
                 for k, v in items_of(x)]
        self.inserts.append(("map", new, (items, setitem), path))

    def fill_set(self, x, new, path, add):
        items = [self.copy(item, (path, "item", None)) for item in set.__iter__(x)]
        self.inserts.append(("set", new, (items, add), path))

    def fill_dict_attrs(self, own, new_dict, path, reset=()):
        memo, handlers, atomic, id_attrs = self.memo, self.handlers, ATOMIC_TYPES, self.id_attrs
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
                copier = handlers.get(kind) or self.handler(kind)
                copied = copier(self, value, (path, "attr", key))
            new_dict[key] = copied
            if type(copied) is LateRef:
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
        if kind is LateRef:
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
                if type(key) in _MAYBE_IDS or type(key) is LateRef:
                    key = remap(key)
                kind = type(value)
                if kind is LateRef:
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
