"""The TF checkpoint, a registered format like the others: an object-based or TF1
name-based tensor bundle (`prefix.index` + `prefix.data-*`), given as a prefix, its `.index`,
a managed directory (its newest intact checkpoint) or a `gs://` / `s3://` URL.

Its roles (see `registry`):

- `recognise`: a prefix, a directory, a URL, or a path where nothing is (the resolver then
  says what it expected); never a regular file without its `.index` beside it;
- `listing`: its variables from the index and object graph, TF-free (`objckpt inspect`,
  `diff`, `graph`), each tensor's values readable as NumPy (`read`) for `diff`;
- `source_fields`: the fields of a planning `Source` (TF imported for tensors only);
- `verify`: every tensor read once, the object graph checked (`checkpoint_verify`);
- `write`: tensors written under their checkpoint keys (`_files.write_tensors`).

The object graph is read by `_objgraph` alone and checked by `_bundle.graph_problems` (what
`verify` lists, every reader refuses): one reader, one set of checks, one wording. Also here:
a graph's subtrees and network paths (`subtree_paths`, `network_aliases`, `GraphIndex`),
which planning reads through `_planning.tree`.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph
from objckpt._bundle import remote as _remote

__all__ = ["GraphIndex", "Read", "keras3_slot_owners", "listing", "network_aliases",
           "network_paths", "parts_note", "read_at", "recognise", "source_fields",
           "subtree_paths", "subtree_paths_from", "top_level_names", "write"]

OBJECT_GRAPH_KEY = _bundle.OBJECT_GRAPH_KEY


def _tf():
    import tensorflow as tf  # tensors only: listing and verifying stay TF-free

    return tf


def recognise(path: str) -> bool:
    """A TF checkpoint: a prefix (its `.index` beside it, or given), a directory, a URL, or a
    path where nothing is (the checkpoint's resolver then says what it expected)."""
    if path.endswith(".index") or "://" in path or os.path.isdir(path):
        return True
    return os.path.lexists(path + ".index") or not os.path.isfile(path)


# --- reading ---------------------------------------------------------------------------------

class Read(NamedTuple):
    """An object-based checkpoint read from its metadata (`read_at`).

    Attributes:
      index: the validated `_bundle.Index`.
      graph: the object graph (`_objgraph.Graph`), checked against the index.
      graph_bytes: its serialized bytes (TF's proto parses them, for `read_tree`).
      items: {object path: (index entry, checkpoint key, saved name)} of its variables, in
        node order.
      nodes: {object path: the id of the node holding the variable}.
    """

    index: object
    graph: object
    graph_bytes: bytes
    items: dict
    nodes: dict


def name_based(prefix: str, index) -> errors.NotObjectBasedError:
    """The error for a name-based checkpoint where structure is needed."""
    entries = index.entries
    # Weights, not optimizer bookkeeping (`beta1_power`, `global_step`, slots), as examples.
    weights = sorted(k for k in entries if not _TF1_BOOKKEEPING.search(k)) or sorted(entries)
    sample = ", ".join(f"`{_render.safe(k)}`" for k in weights[:3])
    scope = weights[0].split("/", 1)[0] + "/" if weights and "/" in weights[0] else ""
    example = (f"rules=[({'^' + re.escape(scope)!r}, '')] strips the scope "
               f"`{_render.safe(scope)}`" if scope else
               f"rules=[({'^' + re.escape(weights[0] if weights else 'name') + '$'!r}, "
               "'layer/kernel')]")
    return errors.NotObjectBasedError(
        f"Checkpoint `{prefix}` is name-based (written by tf.compat.v1.train.Saver): its "
        f"{len(entries)} entries are keyed by global variable name ({sample}) and it has no "
        "object graph, so it cannot be matched by object structure. Expected: an object-based "
        "checkpoint. Fix: map its names onto your model with objckpt.plan(...) and "
        f"objckpt.migrate(...) using rules, e.g. {_render.safe_text(example)}.",
        source=prefix)


# A TF1 Saver's optimizer bookkeeping: counters and slot variables, not weights.
_TF1_BOOKKEEPING = re.compile(r"(^|/)(beta[12]_power|global_step)$|"
                              r"/(Adam|Adam_1|Momentum|RMSProp|RMSProp_1|Adagrad)$")


def parts_note(entry) -> str:
    """How an index entry is stored when it is stored in slices (a TF1 `PartitionedVariable`
    saved by `tf.compat.v1.train.Saver`, a `ShardedVariable` by `tf.train.Checkpoint`), e.g.
    "saved in 3 parts of rows [0:4) [4:7) [7:10)"; "" for a tensor stored whole. One key is
    one logical tensor either way: every reader reads it whole (or any slice of it)."""
    if not entry.slices:
        return ""
    shape = tuple(entry.shape)
    parts = [tuple((first, dim - first if length < 0 else length)
                   for (first, length), dim in zip(extents, shape))
             for extents in entry.slices]
    count = f"{len(parts)} part{'s' if len(parts) != 1 else ''}"
    axes = [axis for axis in range(len(shape)) if len({p[axis] for p in parts}) > 1]
    if len(axes) > 1 or not shape:
        return f"saved in {count}"
    axis = axes[0] if axes else 0
    word = {0: "rows", 1: "columns"}.get(axis, f"axis {axis}")
    spans = [f"[{p[axis][0]}:{p[axis][0] + p[axis][1]})" for p in sorted(parts)]
    shown = spans if len(spans) <= 8 else spans[:6] + [f"... {len(spans) - 7} more", spans[-1]]
    return f"saved in {count} of {word} {' '.join(shown)}"


def _index(prefix: str, tf_reader: bool):
    """The validated index (`tf_reader`: also opened by TF's reader, which checks its
    blocks' checksums)."""
    if tf_reader:
        return _files.open_checked(prefix)[1]
    try:
        return _bundle.read_index(prefix)
    except FileNotFoundError as err:  # removed since it was resolved
        raise errors.CheckpointNotFoundError(
            f"No checkpoint at prefix `{_render.safe(prefix)}`: `{_render.safe(prefix)}"
            ".index` does not exist. Fix: check the path, or pass the directory to use its "
            "newest checkpoint.", source=prefix) from err


def read_at(prefix: str, *, tf_reader: bool = True, index=None) -> Read:
    """Reads a resolved local prefix's metadata: the index validated (unless given), the
    object graph decoded and checked.

    Raises:
      CheckpointNotFoundError: no `prefix.index`.
      CheckpointCorruptError: the index or the object graph is damaged.
      NotObjectBasedError: a name-based checkpoint.
    """
    index = _index(prefix, tf_reader) if index is None else index
    if OBJECT_GRAPH_KEY not in index.entries:
        raise name_based(prefix, index)
    (data,) = _objgraph.read_strings(index, OBJECT_GRAPH_KEY)
    graph = _objgraph.decode_object_graph(index, data)
    items, nodes = {}, {}
    for node_id, node in enumerate(graph.nodes):
        for attribute in node.attributes:
            if attribute.name == _paths.VARIABLE_VALUE:
                key = attribute.checkpoint_key
                path = _paths.path_of_key(key)
                items[path] = (_objgraph.value_entry(index, node_id, attribute), key,
                               attribute.full_name)
                nodes[path] = node_id
    return Read(index, graph, data, items, nodes)


# --- list: the variables from metadata, TF-free ----------------------------------------------

def listing(path: str) -> dict:
    """The `list` role: a prefix's or directory's variables, TF-free, ordered by the paths
    people recognise (`network_paths`: a walk taking optimizers last, then the nodes it does
    not reach); a name-based checkpoint's by name. `read(key)` gives a tensor's values as
    NumPy (`_Values`)."""
    prefix, notes = _files.resolve_prefix(path, tf_reader=False)
    index = _index(prefix, tf_reader=False)
    if OBJECT_GRAPH_KEY not in index.entries:
        graph = None
        variables = [(name, name, entry.shape, entry.dtype, name, name)
                     for name, entry in index.entries.items()]
    else:
        found = read_at(prefix, index=index)
        graph = found.graph
        shown = network_paths(graph)
        rank = {node: n for n, node in enumerate(
            [*shown, *(n for n in range(len(graph.nodes)) if n not in shown)])}
        variables = []
        for path_ in sorted(found.items, key=lambda p: rank[found.nodes[p]]):
            entry, key, name = found.items[path_]
            variables.append((path_, shown.get(found.nodes[path_], path_), entry.shape,
                              entry.dtype, key, name))
    return {"prefix": prefix, "notes": notes, "index": index, "graph": graph,
            "variables": variables, "read": _Values(prefix, index).read}


class _Values:
    """A tensor's values as NumPy straight from its data shard's byte range (validated by
    the index, its crc32c checked); strings decoded from TF's framing; a partitioned tensor
    (a sharded variable, a TF1 partitioned one) joined from its slices. Only a variant, or
    a partitioned tensor whose slices the index does not list as TF encodes them, is read
    with TF's reader."""

    # NumPy's reading of each stored dtype (little-endian, as TF writes them); bfloat16 is
    # read as its 16 bits and widened to float32, float8 through ml_dtypes.
    NUMPY = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 8: "<c8", 9: "<i8",
             10: "?", 11: "i1", 12: "u1", 13: "<i4", 14: "<u2", 15: "<i2", 16: "<u2",
             17: "<u2", 18: "<c16", 19: "<f2", 22: "<u4", 23: "<u8", 24: "u1", 25: "u1"}
    _FLOAT8 = {24: "float8_e5m2", 25: "float8_e4m3fn"}

    def __init__(self, prefix: str, index):
        self.prefix, self.index, self.reader = prefix, index, None

    def read(self, key: str):
        import numpy as np  # only when values are compared: `inspect` never imports it

        entry = self.index.entries[key]
        if entry.slices and entry.dtype in self.NUMPY \
                and all((key, extents) in self.index.sliced for extents in entry.slices):
            values = self._assembled(key, entry)  # a sharded variable: its slices joined
        elif entry.slices or entry.dtype == 21:  # partitioned otherwise, variant: TF's reader
            return self._with_tf(key)
        elif entry.dtype == 7:  # string
            return np.array(_objgraph.read_strings(self.index, key) or [], dtype=object)
        else:
            values = np.frombuffer(_objgraph.read_bytes(self.index, key),
                                   self.NUMPY[entry.dtype])
        if entry.dtype == 14:  # bfloat16: widened to float32, as TF converts it
            return (values.astype(np.uint32) << 16).view(np.float32)
        if entry.dtype in self._FLOAT8:
            import ml_dtypes

            return values.view(getattr(ml_dtypes, self._FLOAT8[entry.dtype]))
        return values

    def _assembled(self, key: str, entry):
        """A partitioned tensor (one slice per shard of a sharded variable, or of a TF1
        partitioned one) read without TF: each slice's bytes, their crc32c checked, put in
        place in the whole tensor."""
        import numpy as np

        out = np.zeros(entry.shape, self.NUMPY[entry.dtype])
        for extents in entry.slices:
            part = self.index.sliced[(key, extents)]
            at = tuple(slice(0, dim) if length == -1 else slice(start, start + length)
                       for (start, length), dim in zip(extents, entry.shape))
            shape = tuple(s.stop - s.start for s in at)
            path = _bundle.shard_name(self.prefix, part.shard, self.index.num_shards)
            try:
                with _bundle.open_file(path) as f:
                    f.seek(part.offset)
                    data = f.read(part.size)
            except OSError as err:
                raise _bundle.corrupt(path, key, f"a slice cannot be read "
                                                 f"({_render.first_line(err)})") from err
            if len(data) != part.size or len(data) != out[at].nbytes:
                raise _bundle.corrupt(path, key, f"a slice holds {len(data)} bytes where "
                                                 f"its shape {shape} needs {out[at].nbytes}")
            if _objgraph.masked_crc32c(_objgraph.crc32c(data)) != part.crc32c:
                raise _bundle.corrupt(path, key, f"the bytes of its slice {_spans(extents)} do "
                                                 "not match their checksum (crc32c)")
            out[at] = np.frombuffer(data, out.dtype).reshape(shape)
        return out.reshape(-1)

    def _with_tf(self, key: str):
        tf = _tf()
        if self.reader is None:
            self.reader = _files.open_reader(self.prefix)
        try:
            return self.reader.get_tensor(key)
        except (tf.errors.OpError, ValueError) as err:
            raise errors.CheckpointCorruptError(
                f"{_render.first_line(err)}. Expected: a tensor as its index describes. Its "
                "data file is damaged or truncated. Fix: write the checkpoint again, or compare "
                "another one.", source=_remote.shown(self.prefix)) from err


def _spans(extents) -> str:
    """A slice's extents as spans: "[5:10) [0:4)" (":" for a whole axis)."""
    return " ".join(":" if length == -1 else f"[{start}:{start + length})"
                    for start, length in extents)


def network_paths(graph) -> dict[int, str]:
    """node id -> the path people recognise, for every node a walk from the root reaches:
    breadth-first with optimizer edges taken last, then slot variables as
    `<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>` of those paths."""
    return _paths.walked_paths(graph, defer=_paths.OptimizerEdges(graph))


# --- open: the fields of a planning Source -----------------------------------------------------

def source_fields(path: str) -> dict:
    """The `open` role: a prefix or directory, object-based or name-based, as the fields
    of a planning `Source` (whose kind is "object" or "name")."""
    prefix, notes = _files.resolve_prefix(path)
    try:
        return _object_fields(prefix, notes)
    except errors.NotObjectBasedError:
        return _name_fields(prefix, notes)


def _object_fields(prefix: str, notes) -> dict:
    tf = _tf()
    found = read_at(prefix)
    entries = {path: ((entry.shape, tf.as_dtype(entry.dtype)), key)
               for path, (entry, key, _) in found.items.items()}
    graph = found.graph
    specs = {path: spec for path, (spec, _) in entries.items()}
    aliases = network_aliases(graph)
    for alias, full in aliases.items():
        specs.setdefault(alias, specs[full])

    def entry(path):
        # A path that is a key of its own is that entry (as in `specs`), even when the graph
        # also reaches another variable by it: metadata and values must never disagree.
        return entries[path] if path in entries else entries[aliases[path]]

    index = GraphIndex(graph)
    top_names = top_level_names(graph)
    views: dict = {}  # node id -> its view: names leading to one node share it

    def subtree(at):
        # As at the root: a variable whose path within `at` runs through an optimizer
        # (a trained Keras 3 model) is also found by its path through the layers.
        node = index.node_at(at)
        if node is None:
            return {}
        if node not in views:
            view = subtree_paths_from(graph, node)
            network = subtree_paths_from(graph, node, skip_optimizers=True)
            for path, full in network.items():
                view.setdefault(path, full)
            views[node] = view
        return dict(views[node])

    def structure():
        # The graph without the variables' saved names (`mlp_3/dense/kernel`), which
        # differ between runs of the same code and only place optimizer slots.
        nodes = tuple(_objgraph.Node(node.children,
                                     tuple(_objgraph.Attribute(a.name, "", a.checkpoint_key)
                                           for a in node.attributes),
                                     node.slot_variables, node.registered)
                      for node in graph.nodes)
        return ("object", nodes, tuple(specs.items()), tuple(notes))

    def fetch(paths):
        return _restore_v2(prefix, [entry(p)[1] for p in paths],
                           [entry(p)[0][1] for p in paths], [entry(p)[0][0] for p in paths])

    return {"description": f"checkpoint `{_remote.shown(prefix)}`", "kind": "object",
            "specs": specs, "fetch": fetch, "subtree": subtree, "top_level_names": top_names,
            "prefix": prefix, "notes": tuple(notes),
            "names": {path: name for path, (_, _, name) in found.items.items() if name},
            "aliases": aliases, "structure": structure,
            "owners": lambda: keras3_slot_owners(graph), "keyed_by_path": True,
            "bundle_keys": lambda paths: [entry(p)[1] for p in paths],
            "holding": lambda wanted: index.holding(top_names, wanted, specs),
            "parts": _parts({path: entry(path) for path in specs}, found.index)}


def _name_fields(prefix: str, notes) -> dict:
    tf = _tf()
    reader = _files.open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    specs = {name: (tuple(shapes[name]), tf.as_dtype(dtypes[name])) for name in sorted(shapes)}
    top = _top_names(specs)
    return {"description": f"name-based checkpoint `{_remote.shown(prefix)}`", "kind": "name",
            "specs": specs,
            "fetch": lambda names: _restore_v2(prefix, list(names),
                                               [specs[n][1] for n in names],
                                               [specs[n][0] for n in names]),
            "subtree": lambda at: _paths.prefix_subtree(specs, at), "top_level_names": top,
            "prefix": prefix, "notes": tuple(notes),
            "structure": lambda: ("name", tuple(specs.items()), tuple(notes)),
            "keyed_by_path": True, "bundle_keys": list, "holding": None,
            "parts": _parts({name: (None, name) for name in specs}, _index(prefix, False))}


def _parts(entries: dict, index) -> dict[str, str]:
    """{source key: `parts_note`} of the keys whose tensor is stored in slices."""
    out = {}
    for key, (_, stored) in entries.items():
        found = index.entries.get(stored)
        if found is not None and found.slices:
            out[key] = parts_note(found)
    return out


def _top_names(keys) -> list[str]:
    return list(dict.fromkeys(k.split("/", 1)[0] for k in keys if "/" in k))


def _restore_v2(prefix: str, keys: list[str], dtypes: list, shapes: list | None = None) -> list:
    if not keys:
        return []
    from objckpt._bundle import fastio as _fastio

    try:
        return _fastio.read_tensors(prefix, keys, dtypes, shapes)
    except _tf().errors.OpError as err:
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
        except _tf().errors.OpError:
            return key
    return None


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
    from objckpt._compat import optimizers as _optimizers  # opened as a source: TF loaded

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
            role = next((r for r in _optimizers.KERAS3_ROLES if name.endswith("_" + r)), None)
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


# --- a graph's subtrees -------------------------------------------------------------------

def network_aliases(graph) -> dict[str, str]:
    """{network path: canonical path} for variables whose canonical path runs elsewhere.

    A Keras 3 model that was trained has its weights' canonical paths under
    `optimizer/_trainable_variables/N`; their paths through the layers (what
    an untrained copy of the model has) are found by a walk that skips
    optimizer nodes.
    """
    return {path: full for path, full in subtree_paths(graph, "", skip_optimizers=True).items()
            if path != full}


def subtree_paths(graph, at: str, skip_optimizers: bool = False, index=None) -> dict[str, str]:
    """Maps object path within the `at` subtree -> full object path, from a graph proto.

    Paths are what `tree(child)` would give for the live child at `at`: a
    breadth-first walk from that node, so a variable whose canonical path
    goes through a sibling (e.g. a Keras 3 optimizer's `_trainable_variables`)
    is still found under the subtree. Slot variables belong to the subtree
    when both their variable and their optimizer do. `index`: a `GraphIndex`
    of the same graph, shared by many calls (each then finds `at` in time linear
    in its depth, not in the width of the nodes on the way).
    """
    node_id = (index or GraphIndex(graph)).node_at(at)
    if node_id is None:
        return {}
    return subtree_paths_from(graph, node_id, skip_optimizers)


def subtree_paths_from(graph, node_id: int, skip_optimizers: bool = False) -> dict[str, str]:
    """`subtree_paths` of the subtree rooted at node `node_id`: linear in its size."""
    skip = _paths.OptimizerEdges(graph) if skip_optimizers else None
    paths = _paths.graph_paths(graph, node_id, skip)
    order = list(paths)
    result = {}

    def add(node, path):
        for attribute in graph.nodes[node].attributes:
            if attribute.name == _paths.VARIABLE_VALUE:
                result[path] = _paths.path_of_key(attribute.checkpoint_key)

    for current in order:
        add(current, paths[current])
    for current in order:
        for slot in graph.nodes[current].slot_variables:
            if slot.original_variable_node_id in paths:
                add(slot.slot_variable_node_id,
                    f"{paths[slot.original_variable_node_id]}/{_paths.OPTIMIZER_SLOT}/"
                    f"{paths[current]}/{slot.slot_name}")
    return result


_NO_CHILDREN: dict = {}  # shared by every leaf of a GraphIndex (never written)


class GraphIndex:
    """A graph proto's child edges by name, node by node, each node's built on first use.

    A lookup of one edge is then O(1) however many children the node has (a root with
    200,000 children, as a crafted or very wide checkpoint has): finding many subtrees
    costs the sum of their depths, not depth times width.
    """

    __slots__ = ("_children", "graph")

    def __init__(self, graph):
        self.graph = graph
        self._children: dict[int, dict[str, int]] = {}

    def children(self, node_id: int) -> dict[str, int]:
        """{edge name (unescaped): child node id} of one node; the first edge of a name."""
        found = self._children.get(node_id)
        if found is None:
            children = self.graph.nodes[node_id].children
            if not children:
                return _NO_CHILDREN
            found = {}
            for child in children:
                found.setdefault(child.local_name, child.node_id)
            self._children[node_id] = found
        return found

    def node_at(self, at: str) -> int | None:
        """The node an object path (`/`-joined escaped edge names) leads to, or None."""
        node_id = 0
        for component in filter(None, at.split("/")):
            node_id = self.children(node_id).get(_paths.unescape(component))
            if node_id is None:
                return None
        return node_id

    def value_path(self, node_id: int) -> str | None:
        """The path of the checkpoint key a node's value is stored under (its last
        VARIABLE_VALUE attribute, as `subtree_paths` takes it), or None."""
        found = None
        for attribute in self.graph.nodes[node_id].attributes:
            if attribute.name == _paths.VARIABLE_VALUE:
                found = _paths.path_of_key(attribute.checkpoint_key)
        return found

    def holding(self, names, wanted: dict, specs: dict) -> list[str]:
        """The top-level `names` whose subtree may hold every path of `wanted`.

        wanted: {object path: (shape tuple, dtype)}; specs: {full path: (shape, dtype)}.
        A necessary condition of `subtree_paths(graph, name)` holding each path with that
        shape and dtype (its paths are edges from the subtree's node; child names are
        unique, `_bundle.check_graph`): each path's edges lead from the name's node to a
        node whose value has that shape and dtype. Slot paths are not checked. Each pair
        (wanted prefix, node) is checked once, so the cost is linear in the graph's nodes
        and edges whatever nodes the names share.
        """
        leaf = object()
        trie: dict = {}
        for path, spec in wanted.items():
            if _paths.split_slot(path) is not None:
                continue
            node = trie
            for component in path.split("/"):
                node = node.setdefault(_paths.unescape(component), {})
            node[leaf] = spec
        memo: dict = {}

        def holds(branch: dict, node_id: int) -> bool:
            key = (id(branch), node_id)
            found = memo.get(key)
            if found is None:
                found = True
                spec = branch.get(leaf)
                if spec is not None:
                    full = self.value_path(node_id)
                    have = specs.get(full) if full is not None else None
                    found = have is not None and (tuple(have[0]), have[1]) == spec
                if found:
                    kids = self.children(node_id)
                    for name, below in branch.items():
                        if name is leaf:
                            continue
                        child = kids.get(name)
                        if child is None or not holds(below, child):
                            found = False
                            break
                memo[key] = found
            return found

        top = self.children(0)
        return [name for name in names
                if (node := top.get(_paths.unescape(name))) is not None and holds(trie, node)]


def top_level_names(graph) -> list[str]:
    """The escaped names of the root's children in a graph proto."""
    return [_paths.escape(child.local_name) for child in graph.nodes[0].children]


# --- write ----------------------------------------------------------------------------------

def write(path: str, tensors: dict) -> str:
    """The `write` role: {checkpoint key: tensor} written as the prefix `path` (TF's bundle
    format; an object-based checkpoint when the tensors hold its object graph under
    `_CHECKPOINTABLE_OBJECT_GRAPH`, as `objckpt.save` and `migrate` write them)."""
    _files.write_tensors(path, list(tensors), list(tensors.values()))
    return path
