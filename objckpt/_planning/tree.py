"""Object paths of live objs and of checkpoints on disk.

`tree(obj)` walks a live obj's dependency graph the way `tf.train.Checkpoint`
does; `read_tree(prefix)` reads the same mapping from a checkpoint's object
graph proto and index, without reading tensor data. Both give TF's canonical
object paths in TF's order, so the two can be compared key by key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import weakref
from collections.abc import Iterator, Mapping

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._bundle import files as _files
from objckpt._bundle import remote as _remote
from objckpt._formats import checkpoint as _checkpoint
from objckpt._formats import registry as _formats

__all__ = ["CheckpointTree", "Entry", "VariableTree", "read_tree", "tree"]



class FrozenMapping(Mapping):
    """An ordered, read-only mapping from object path to a value."""

    __slots__ = ("_items",)

    def __init__(self, items: dict):
        self._items = items

    def __getitem__(self, path):
        return self._items[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def as_dict(self) -> dict:
        """The underlying path -> value dict (not a copy: read it, never change it)."""
        return self._items

    def __contains__(self, path) -> bool:
        return path in self._items


class VariableTree(FrozenMapping):
    """Ordered mapping object path -> variable of a live obj (see `tree`)."""

    __slots__ = ("__weakref__", "_fingerprint", "_owner", "_plans", "fused")

    def __init__(self, items: dict, fingerprint=None, owner=None):
        super().__init__(items)
        self.fused = _compat.FusedOps(items.values())
        # Checked restore plans from Snapshots of other trees (see objckpt.restore).
        self._plans: dict = {}
        self._fingerprint = fingerprint
        try:
            self._owner = weakref.ref(owner) if owner is not None else None
        except TypeError:  # not weak-referenceable
            self._owner = None

    @property
    def plans(self) -> dict:
        """Checked restore plans from Snapshots of other trees, kept by `objckpt.restore`."""
        return self._plans

    def network_aliases(self) -> dict[str, str]:
        """Network path -> canonical path, where a variable's canonical path runs
        through an optimizer (a trained Keras 3 model); empty when none does or
        the obj is gone."""
        owner = self._owner() if self._owner is not None else None
        if owner is None:
            return {}
        path_of = {id(v): p for p, v in self._items.items()}
        return {path: path_of[id(v)] for path, v in _compat.network_variable_paths(owner)
                if id(v) in path_of and path_of[id(v)] != path}

    def graph_aliases(self) -> dict[str, str]:
        """Every other path to a variable that a checkpoint's graph should record.

        `network_aliases`, plus each edge TF's object graph has to a variable
        besides its canonical one (a Keras 3 optimizer's `_trainable_variables`
        list), so a checkpoint written from paths holds the edges TF writes.
        """
        owner = self._owner() if self._owner is not None else None
        if owner is None:
            return {}
        path_of = {id(v): p for p, v in self._items.items()}
        aliases = {path: path_of[id(v)] for path, v in _compat.variable_edges(owner)
                   if id(v) in path_of and path_of[id(v)] != path}
        aliases.update(self.network_aliases())
        return aliases

    def slot_owners(self) -> dict[str, tuple[str, str]]:
        """{optimizer variable path: (path of the variable it belongs to, role)}."""
        owner = self._owner() if self._owner is not None else None
        out = {}
        for path in self._items:
            parts = _paths.split_slot(path)
            if parts is not None:
                out[path] = (parts[0], parts[2])
        if owner is None:
            return out
        path_of = {id(v): p for p, v in self._items.items()}
        for variable, role, slot in _compat.optimizer_slot_lists(owner, self._items.values()):
            if id(variable) in path_of and id(slot) in path_of:
                out[path_of[id(slot)]] = (path_of[id(variable)], role)
        return out

    def __repr__(self) -> str:
        head = ", ".join(list(self)[:3]) + (", ..." if len(self) > 3 else "")
        return f"VariableTree({len(self)} variables: {head})"


# obj -> VariableTree, reused while obj's variable fingerprint is unchanged.
_TREE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tree(obj) -> VariableTree:
    """Returns the ordered mapping object path -> variable of a live obj.

    For everything TF's object graph reaches, the key set is the one
    `tf.train.Checkpoint(root=obj)` writes, minus `save_counter`: a variable
    reachable by two paths (a shared layer) appears once, under TF's canonical
    (breadth-first) path; optimizer slot variables keep TF's
    `<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>` form. What TF's graph
    misses follows: Keras 3 layers held in lists and dicts, under the paths
    tf_keras gives the same code (`blocks/0/dense/_kernel`), and Keras 3
    `SeedGenerator` states (`dropout/seed_generator/state`). Every variable in
    a Keras obj's `variables` (and its optimizer's) is covered. Keras 3
    `keras.Variable`s are resolved to the `tf.Variable` they wrap, so every
    value of the mapping can be read and assigned.

    Args:
      obj: a trackable: Keras model or layer (any flavour), `tf.Module`,
        `tf.train.Checkpoint` or optimizer.

    Returns:
      A read-only `VariableTree` (a `Mapping[str, tf.Variable]`).

    Raises:
      UnsupportedObjectError: obj is not trackable.
      UntrackedVariableError: obj owns a variable no attribute path reaches
        (a layer held in a set); the message names it and its layer.

    Example:
      >>> objckpt.tree(model)["hidden/_kernel"].shape
      TensorShape([3, 4])
    """
    if not _compat.is_trackable(obj):
        raise errors.UnsupportedObjectError(
            f"objckpt.tree needs a trackable obj (a Keras model or layer, a tf.Module, a "
            f"tf.train.Checkpoint). Received: obj of type {type(obj).__name__}. "
            "Fix: wrap plain variables in a tf.Module or tf.train.Checkpoint first.",
            obj=type(obj).__name__)
    fingerprint = _compat.fingerprint(obj)
    if fingerprint is not None:
        try:
            cached = _TREE_CACHE.get(obj)
        except TypeError:  # not weak-referenceable
            cached = None
        if cached is not None and cached._fingerprint == fingerprint:
            return cached
    result = VariableTree(dict(_compat.variable_paths(obj)), fingerprint, obj)
    # A Keras 3 model in the middle of its first build owns variables its graph does not
    # reach yet: such a tree is not kept, or it would outlive the build.
    if fingerprint is not None and len(result) >= len(set(fingerprint)):
        with contextlib.suppress(TypeError):  # not weak-referenceable: no caching
            _TREE_CACHE[obj] = result
    return result


def is_cached(obj, variables) -> bool:
    """Whether `variables` is the tree cached for obj (kept alive while obj is unchanged)."""
    try:
        return _TREE_CACHE.get(obj) is variables
    except TypeError:  # not weak-referenceable
        return False


@dataclasses.dataclass(frozen=True)
class Entry:
    """One variable of a checkpoint, read from metadata only.

    Attributes:
      shape: the stored shape.
      dtype: the stored `tf.DType`.
      key: the checkpoint key (`<object path>/.ATTRIBUTES/VARIABLE_VALUE`).
      name: the variable's name when it was saved (TF1-style full name), or "".
    """

    shape: tuple[int, ...]
    dtype: tf.DType
    key: str
    name: str = ""

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.size


class CheckpointTree(FrozenMapping):
    """Ordered mapping object path -> `Entry` of a checkpoint (see `read_tree`).

    Attributes:
      prefix: the checkpoint prefix it was read from.
      graph: the object graph as `_objgraph` decodes and checks it (the proto's shape, in
        frozen tuples), what objckpt itself reads; None for another format.
      object_graph: the `TrackableObjectGraph` proto stored in the checkpoint (decoded by
        TF's protobuf from the same bytes on first use); None for another format.
    """

    __slots__ = ("_graph_bytes", "_proto", "graph", "prefix")

    def __init__(self, items: dict, prefix: str, graph, graph_bytes: bytes = b""):
        super().__init__(items)
        self.prefix = prefix
        self.graph = graph
        self._graph_bytes, self._proto = graph_bytes, None

    @property
    def object_graph(self):
        if self._proto is None and self.graph is not None:
            proto = _compat.TrackableObjectGraph()
            proto.ParseFromString(self._graph_bytes)
            self._proto = proto
        return self._proto

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self._items.values())

    def __repr__(self) -> str:
        return f"CheckpointTree({self.prefix!r}, {len(self)} variables)"


@errors.about_arguments(source="source")
def read_tree(source: str | os.PathLike) -> CheckpointTree:
    """Reads object path -> (shape, dtype, key) from a source's metadata.

    Only metadata is read (a checkpoint's index and object graph proto, a file's headers);
    no tensor data. Every kind of source `restore` reads is read, through the same format
    registry (`_formats`).

    Args:
      source: a checkpoint prefix (`prefix.index` may be given too) or a
        directory of managed checkpoints (its newest intact one is read); local,
        or a URL (`gs://`, `s3://`: read from a private local copy); or a file or
        folder of another format `restore` reads (safetensors, Keras HDF5 and `.keras`
        files, SavedModel folders), keyed by the keys that file holds.

    Returns:
      A `CheckpointTree`, ordered like `tree(obj)` of the obj that wrote it (another
      format: in the file's order, `object_graph` None).

    Raises:
      CheckpointNotFoundError: nothing at `source`.
      CheckpointCorruptError: the index or object graph cannot be read.
      NotObjectBasedError: a name-based (TF1 `Saver`) checkpoint.
      UnsupportedFormatError: a file in no format objckpt reads.
    """
    if _formats.find(source) is _formats.CHECKPOINT:  # its object graph kept (`graph`)
        try:
            return _checkpoint_tree(os.fspath(source))
        except errors.ObjckptError as err:
            _remote.unstage(err)  # a URL's staged copy: the URL named instead
            raise
    found = _formats.dispatch("open", source)
    names = found.get("names") or {}
    return CheckpointTree({key: Entry(tuple(shape), dtype, key, names.get(key, ""))
                           for key, (shape, dtype) in found["specs"].items()},
                          found.get("prefix") or os.fspath(source), None)


def _checkpoint_tree(source: str) -> CheckpointTree:
    """`read_tree` of a TF checkpoint (a prefix or directory, local or remote)."""
    prefix, _ = _files.resolve_prefix(source)
    found = read_tree_at(prefix)
    found.prefix = _remote.shown(prefix)  # a URL as given, not its local staged copy
    return found


def read_tree_at(prefix: str) -> CheckpointTree:
    """`read_tree` of a resolved local prefix, read by the TF checkpoint format
    (`_formats.checkpoint.read_at`: the index validated and opened by TF's reader, the
    object graph decoded and checked by `_objgraph`, the one reader of object graphs)."""
    found = _checkpoint.read_at(prefix)
    items = {path: Entry(entry.shape, tf.as_dtype(entry.dtype), key, name)
             for path, (entry, key, name) in found.items.items()}
    return CheckpointTree(items, prefix, found.graph, found.graph_bytes)


def build_object_graph(paths: list[str], names: list[str], aliases: dict | None = None):
    """Builds the `TrackableObjectGraph` proto for variables at `paths`.

    Each path becomes a chain of child edges from the root; slot variables
    become slot references on their optimizer node, as TF writes them.
    `tf.train.Checkpoint(root=obj).read(...)` walks these edges, so any obj
    whose tree has these paths restores from the result. `aliases` ({other
    path: path}) adds a second chain of edges to the same variable, as TF
    records for a trained Keras 3 model's weights (reachable through its
    layers and through its optimizer), so an untrained copy restores too.
    """
    graph = _compat.TrackableObjectGraph()
    graph.nodes.add()
    node_of: dict[str, int] = {"": 0}

    def node_for(path: str) -> int:
        if path in node_of:
            return node_of[path]
        parent_path, _, local = path.rpartition("/")
        parent = node_for(parent_path)
        node_id = len(graph.nodes)
        graph.nodes.add()
        graph.nodes[parent].children.add(node_id=node_id, local_name=_paths.unescape(local))
        node_of[path] = node_id
        return node_id

    def add_value(node_id: int, path: str, name: str) -> None:
        graph.nodes[node_id].attributes.add(
            name=_paths.VARIABLE_VALUE, full_name=name,
            checkpoint_key=_paths.checkpoint_key(path))

    slots = []
    for path, name in zip(paths, names):
        parts = _paths.split_slot(path)
        if parts is None:
            add_value(node_for(path), path, name)
        else:
            slots.append((path, name, parts))
    for path, name, (variable, optimizer, slot) in slots:
        optimizer_id = node_for(optimizer)
        slot_id = len(graph.nodes)
        graph.nodes.add()
        add_value(slot_id, path, name)
        graph.nodes[optimizer_id].slot_variables.add(
            original_variable_node_id=node_for(variable), slot_name=slot,
            slot_variable_node_id=slot_id)
    for alias, path in (aliases or {}).items():
        if path in node_of and alias not in node_of:
            parent_path, _, local = alias.rpartition("/")
            graph.nodes[node_for(parent_path)].children.add(node_id=node_of[path],
                                                            local_name=_paths.unescape(local))
            node_of[alias] = node_of[path]
    fields = _compat.TrackableObjectGraph.TrackableObject.DESCRIPTOR.fields_by_name
    if "has_checkpoint_values" in fields:
        for node in graph.nodes:
            node.has_checkpoint_values.value = True
    return graph


# A checkpoint's graph read for planning: its subtrees, network paths and edges by name
# (`_formats.checkpoint`, the TF checkpoint format, which opens it as a source).
network_aliases = _checkpoint.network_aliases
subtree_paths = _checkpoint.subtree_paths
subtree_paths_from = _checkpoint.subtree_paths_from
GraphIndex = _checkpoint.GraphIndex
top_level_names = _checkpoint.top_level_names
