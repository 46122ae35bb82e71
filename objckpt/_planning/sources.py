"""Sources: what values come from, opened for planning without reading tensor data.

A source is a `Snapshot`, an object-based checkpoint prefix or directory, or a TF1 name-based
checkpoint; each is opened into a `Source`: its keys with shapes and dtypes, a reader, the
subtree under an `at`, the names it saved, and the owners of its optimizer entries.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import remote as _remote
from objckpt._formats import registry as _formats
from objckpt._planning import tree as _tree

__all__ = ["BOOKKEEPING", "Source", "keras3_slot_owners", "open_source", "snapshot_source"]

# Entries tf.train.Checkpoint or Saver add for themselves; never "unexpected".
BOOKKEEPING = frozenset({"save_counter", _compat.OBJECT_GRAPH_KEY})


@dataclasses.dataclass
class Source:
    """A source opened for matching: keys with shapes and dtypes, and a reader.

    kind is "object" (an object-based checkpoint), "name" (a TF1 name-based
    checkpoint) or "snapshot". `fetch(keys)` returns the tensors of those keys.
    """

    description: str
    kind: str
    specs: dict  # key -> (shape tuple, tf.DType)
    fetch: Callable
    subtree: Callable  # at -> {key within at: key}
    top_level_names: list
    prefix: str | None = None
    notes: tuple[str, ...] = ()
    names: dict = dataclasses.field(default_factory=dict)  # key -> variable name when saved
    # Extra keys for the same tensors: a variable's path through the network when its
    # canonical path runs through an optimizer (a trained Keras 3 model).
    aliases: dict = dataclasses.field(default_factory=dict)
    # Returns everything planning reads but `names`, hashable: two sources with equal
    # structures get the same plan for the same obj unless their saved names decide it
    # (optimizer state that moves, the "keras name" strategy); load_ensemble plans once
    # per structure only with optimizer_state=False and a path match. Computed on
    # request only. None: unknown.
    structure: Callable | None = None
    # Returns {key: (key of the variable it belongs to, slot role)} for the optimizer
    # entries whose owner the source itself records (slot tables, saved names, Keras 3
    # variable lists), so optimizer state moves by owner, never by position.
    owners: Callable = lambda: {}
    # Whether keys are object paths of the obj that wrote them (TF checkpoints, Snapshots),
    # so `restore_on_create` can wait for each by path; False for the other formats, whose keys
    # reach variables through the plan's strategies (names, layouts, structure).
    keyed_by_path: bool = True
    # TF checkpoints only: the checkpoint keys of a list of source keys, for reading them
    # with `_fastio` (checksums first, then one tensor at a time).
    bundle_keys: Callable | None = None
    # Keras 2 HDF5 files: ((layer, (its keys in `weight_names` order)), ...) for the layers
    # with weights, in the file's order: what "topological order" pairs with the obj's layers.
    h5_layers: tuple = ()
    # `holding(wanted)`: the top-level names whose subtree may hold every path of `wanted`
    # ({path: (shape tuple, dtype)}): a necessary condition, found in one pass over the
    # names (what `_match` tries as `at=` when the obj does not fit the root, so a source
    # of 200,000 top-level names costs linear time). None: every top-level name may.
    holding: Callable | None = None


def _top_names(keys) -> list[str]:
    return list(dict.fromkeys(k.split("/", 1)[0] for k in keys if "/" in k))


def _restore_v2(prefix: str, keys: list[str], dtypes: list, shapes: list | None = None) -> list:
    if not keys:
        return []
    from objckpt._bundle import fastio as _fastio

    try:
        return _fastio.read_tensors(prefix, keys, dtypes, shapes)
    except tf.errors.OpError as err:
        damaged = _first_unreadable(prefix, keys, dtypes)
        where = (f" The first entry that fails is `{_render.safe(damaged)}`." if damaged
                 else "")
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(prefix)}` could not be read: its data is damaged, "
            f"truncated or missing.{where} Received from TF: {_render.first_line(err)}. "
            "Nothing was changed. Fix: use another checkpoint.", source=prefix) from err


def _first_unreadable(prefix: str, keys: list[str], dtypes: list) -> str | None:
    """The first key TF cannot read alone (after a read of them all failed), or None."""
    from objckpt._bundle import fastio as _fastio

    for key, dtype in zip(keys, dtypes):
        try:
            _fastio.read_tensors(prefix, [key], [dtype])
        except tf.errors.OpError:
            return key
    return None


def _object_source(prefix: str, notes) -> Source:
    entries = _tree.read_tree_at(prefix)
    specs = {path: (entry.shape, entry.dtype) for path, entry in entries.items()}
    aliases = _tree.network_aliases(entries.graph)
    for alias, full in aliases.items():
        specs.setdefault(alias, specs[full])

    def entry(path):
        # A path that is a key of its own is that entry (as in `specs`), even when the graph
        # also reaches another variable by it: metadata and values must never disagree.
        return entries[path] if path in entries else entries[aliases[path]]

    index = _tree.GraphIndex(entries.graph)
    top_names = _tree.top_level_names(entries.graph)
    views: dict = {}  # node id -> its view: names leading to one node share it

    def subtree(at):
        # As at the root: a variable whose path within `at` runs through an optimizer
        # (a trained Keras 3 model) is also found by its path through the layers.
        node = index.node_at(at)
        if node is None:
            return {}
        if node not in views:
            view = _tree.subtree_paths_from(entries.graph, node)
            network = _tree.subtree_paths_from(entries.graph, node,
                                               skip_optimizers=True)
            for path, full in network.items():
                view.setdefault(path, full)
            views[node] = view
        return dict(views[node])

    def structure():
        # The graph without the variables' saved names (`mlp_3/dense/kernel`), which
        # differ between runs of the same code and only place optimizer slots.
        graph = tuple(node._replace(attributes=tuple(a._replace(full_name="")
                                                     for a in node.attributes))
                      for node in entries.graph.nodes)
        return ("object", graph, tuple(specs.items()), tuple(notes))

    return Source(
        f"checkpoint `{_remote.shown(prefix)}`", "object", specs,
        lambda paths: _restore_v2(prefix, [entry(p).key for p in paths],
                                  [entry(p).dtype for p in paths],
                                  [entry(p).shape for p in paths]),
        subtree,
        top_names, prefix, tuple(notes),
        {path: e.name for path, e in entries.items() if e.name}, aliases, structure,
        lambda: keras3_slot_owners(entries.graph),
        bundle_keys=lambda paths: [entry(p).key for p in paths],
        holding=lambda wanted: index.holding(top_names, wanted, specs))


def keras3_slot_owners(graph) -> dict:
    """{slot path: (owner path, role)} for Keras 3 optimizers in a graph proto.

    A Keras 3 optimizer keeps its per-variable state in `_variables`, named
    `<owner path, / as _>_<role>`, one per role in the order of
    `_trainable_variables` (whose edges lead to the variables trained). The
    k-th variable of a role belongs to the k-th trained variable; a role
    whose count differs from the trained count is left without owners.
    """
    key_of, name_of = {}, {}
    for node_id, node in enumerate(graph.nodes):
        for attribute in node.attributes:
            if attribute.name == _paths.VARIABLE_VALUE:
                key_of[node_id] = _paths.path_of_key(attribute.checkpoint_key)
                name_of[node_id] = attribute.full_name
    out: dict = {}
    for node in graph.nodes:
        kids = {child.local_name: child.node_id for child in node.children}
        if "_variables" not in kids or "_trainable_variables" not in kids:
            continue
        state, trained = (_list_nodes(graph, kids[name])
                          for name in ("_variables", "_trainable_variables"))
        by_role: dict = {}
        for node_id in state:
            name = name_of.get(node_id, "").split(":", 1)[0]
            role = next((r for r in _compat.KERAS3_ROLES if name.endswith("_" + r)), None)
            if role is not None and node_id in key_of:
                by_role.setdefault(role, []).append(key_of[node_id])
        for role, keys in by_role.items():
            if len(keys) == len(trained) and all(t in key_of for t in trained):
                for key, owner in zip(keys, trained):
                    out[key] = (key_of[owner], role)
    return out


def _list_nodes(graph, node_id: int) -> list[int]:
    """Node ids of a list node's children, by index (`0`, `1`, ...)."""
    children = [(c.local_name, c.node_id) for c in graph.nodes[node_id].children]
    if not all(name.isdigit() for name, _ in children):
        return []
    return [node for _, node in sorted(children, key=lambda item: int(item[0]))]


def _name_source(prefix: str, notes) -> Source:
    reader = _files.open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    specs = {name: (tuple(shapes[name]), tf.as_dtype(dtypes[name])) for name in sorted(shapes)}
    return Source(
        f"name-based checkpoint `{_remote.shown(prefix)}`", "name", specs,
        lambda names: _restore_v2(prefix, list(names), [specs[n][1] for n in names],
                                  [specs[n][0] for n in names]),
        lambda at: _paths.prefix_subtree(specs, at), _top_names(specs), prefix, tuple(notes),
        structure=lambda: ("name", tuple(specs.items()), tuple(notes)),
        bundle_keys=list)


def snapshot_source(items: dict, aliases: dict | None = None, owners=None) -> Source:
    """A Source over an in-memory mapping path -> tensor (a Snapshot).

    aliases: extra key -> key in items (network paths of a trained Keras 3 model).
    owners: returns {slot path: (owner path, role)} of the obj it was taken from.
    """
    aliases = {a: k for a, k in (aliases or {}).items() if k in items and a not in items}
    specs = {path: (tuple(value.shape), value.dtype) for path, value in items.items()}
    for alias, key in aliases.items():
        specs[alias] = specs[key]
    top_names = _top_names(specs)
    return Source("Snapshot", "snapshot", specs,
                  lambda paths: [items[aliases.get(p, p)] for p in paths],
                  lambda at: _paths.prefix_subtree(specs, at), top_names, aliases=aliases,
                  structure=lambda: ("snapshot", tuple(specs.items()),
                                     tuple(aliases.items())),
                  owners=owners or (lambda: {}),
                  holding=lambda wanted: _paths.prefix_holding(specs, top_names, wanted))


def open_source(source) -> Source:
    """Opens a Snapshot, prefix or directory; name-based prefixes included; a file or
    folder of another format through its `_formats` entry."""
    as_source = getattr(source, "as_source", None)
    if callable(as_source):
        return as_source()
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise errors.UnsupportedFormatError(
            "A source must be an objckpt.Snapshot, a checkpoint prefix or a directory of "
            f"checkpoints. Received: source of type {type(source).__name__}. Fix: pass "
            "objckpt.snapshot(obj) or a path.")
    found = _formats.dispatch("open", source, _checkpoint_source)
    if isinstance(found, Source):
        return found
    # Another format's fields (`_formats`: they know nothing of `Source`). Their subtrees
    # are key prefixes (`_paths.prefix_subtree` over their specs' keys), so the names that
    # may hold the obj are found in one pass, as for a Snapshot.
    specs, top = found["specs"], found["top_level_names"]
    return Source(**{"keyed_by_path": False,
                     "holding": lambda wanted: _paths.prefix_holding(specs, top, wanted),
                     **found})


def _checkpoint_source(path: str) -> Source:
    """The TF checkpoint format's `open` role (see `_formats`): a prefix or directory,
    object-based or name-based."""
    prefix, notes = _files.resolve_prefix(path)
    try:
        return _object_source(prefix, notes)
    except errors.NotObjectBasedError:
        return _name_source(prefix, notes)
