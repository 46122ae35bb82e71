"""The object-path grammar, in one place. Pure Python, no TensorFlow.

An object path joins TF's dependency-edge names with `/`; an edge name containing `/` or `.`
is escaped as TF escapes it in checkpoint keys (`.` -> `..`, `/` -> `.S`). A checkpoint key is
`<path>/.ATTRIBUTES/VARIABLE_VALUE`; an optimizer slot variable's path is
`<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>`.
"""

from __future__ import annotations

import collections

from objckpt import errors

__all__ = ["ATTRIBUTES", "OPTIMIZER_SLOT", "VARIABLE_VALUE", "OptimizerEdges", "checkpoint_key",
           "escape", "graph_paths", "graph_walk", "is_optimizer_node", "path_of_key",
           "prefix_holding", "prefix_subtree", "slot_path", "split_slot", "unescape",
           "walked_paths"]

ATTRIBUTES = "/.ATTRIBUTES/"
VARIABLE_VALUE = "VARIABLE_VALUE"
OPTIMIZER_SLOT = ".OPTIMIZER_SLOT"
_SLOT_MARKER = "/" + OPTIMIZER_SLOT + "/"


def escape(name: str) -> str:
    """An edge name as one path component (TF's `escape_local_name`)."""
    return name.replace(".", "..").replace("/", ".S")


def unescape(component: str) -> str:
    """Inverse of `escape`: `..` -> `.` and `.S` -> `/`."""
    if "." not in component:
        return component
    out, i = [], 0
    while i < len(component):
        if component[i] == "." and i + 1 < len(component):
            out.append("/" if component[i + 1] == "S" else component[i + 1])
            i += 2
        else:
            out.append(component[i])
            i += 1
    return "".join(out)


def checkpoint_key(path: str) -> str:
    """The checkpoint key TF uses for the variable at `path`."""
    return path + ATTRIBUTES + VARIABLE_VALUE


def path_of_key(key: str) -> str:
    """The object path of a checkpoint key (the part before `/.ATTRIBUTES/`)."""
    return key.split(ATTRIBUTES, 1)[0]


def slot_path(variable: str, optimizer: str, slot: str) -> str:
    return f"{variable}{_SLOT_MARKER}{optimizer}/{slot}"


def split_slot(path: str) -> tuple[str, str, str] | None:
    """Splits `<var>/.OPTIMIZER_SLOT/<optimizer>/<slot>` into its three parts, or None."""
    if _SLOT_MARKER not in path:
        return None
    variable, rest = path.split(_SLOT_MARKER, 1)
    optimizer, _, slot = rest.rpartition("/")
    return variable, optimizer, slot


def graph_walk(graph, start: int = 0, *, skip=None, defer=None, slots: bool = False):
    """Breadth-first over a `TrackableObjectGraph` proto's edges from node `start`.

    Yields (parent id, edge name, node id) once for each node reached (not `start`), in TF's
    order: a node reachable by several edges is reached by the first one found.
    `skip(node_id, local_name)` prunes a child edge and what lies only below it;
    `defer(node_id, local_name)` holds a child edge back until nothing else is left to walk
    (held edges are then taken in order, each followed by what lies below it).
    `slots=True` also follows slot-variable edges (named by their slot name). Node ids outside
    the graph are not followed (`objckpt.verify` reports them): a checkpoint is untrusted input.
    """
    count = len(graph.nodes)
    seen, order, held, position = {start}, [start], collections.deque(), 0
    while position < len(order) or held:
        if position == len(order):
            parent, name, node = held.popleft()
            if node not in seen:
                seen.add(node)
                order.append(node)
                yield parent, name, node
            continue
        current = order[position]
        position += 1
        edges = [(c.local_name, c.node_id, True) for c in graph.nodes[current].children]
        if slots:
            edges += [(s.slot_name, s.slot_variable_node_id, False)
                      for s in graph.nodes[current].slot_variables]
        for name, node, child in edges:
            if node in seen or not 0 <= node < count:
                continue
            if child and skip is not None and skip(node, name):
                continue
            if child and defer is not None and defer(node, name):
                held.append((current, name, node))
                continue
            seen.add(node)
            order.append(node)
            yield current, name, node


def graph_paths(graph, start: int = 0, skip=None) -> dict[int, str]:
    """The canonical object paths of a `TrackableObjectGraph` proto's nodes below `start`.

    node id -> path relative to `start`, in breadth-first order (`graph_walk`; `skip` prunes
    as there).
    """
    paths = {start: ""}
    total = 0
    for parent, name, node in graph_walk(graph, start, skip=skip):
        paths[node] = _join(paths[parent], name)
        total = _counted(total, paths[node])
    return paths


# All the paths of one graph together, in characters: a graph of a few MB whose nodes form a
# long chain would otherwise spell gigabytes of paths (each node's path repeats its parent's).
MAX_PATH_CHARS = 1 << 28


def _join(parent: str, name: str) -> str:
    local = escape(name)
    return f"{parent}/{local}" if parent else local


def _counted(total: int, path: str) -> int:
    total += len(path)
    if total > MAX_PATH_CHARS:
        raise errors.CheckpointCorruptError(
            f"The object graph's paths add up to more than {MAX_PATH_CHARS:,} characters "
            "(nodes chained thousands of edges deep): no model is built that way, so the "
            "checkpoint is crafted or damaged. Nothing was read into any variable. Fix: use "
            "another checkpoint.")
    return total


def is_optimizer_node(graph, node_id: int, local_name: str) -> bool:
    """Whether a node of an object graph is an optimizer, in every flavour.

    Its edge name (`optimizer`, `_optimizer`), TF slot variables (TF1, Keras 2 legacy
    optimizers) or a step counter child (`_iterations`: Keras 3, tf_keras; `iter`: Keras 2
    OptimizerV2) tell. Works on TF's `TrackableObjectGraph` proto and on its pure-Python
    duck type alike.
    """
    return local_name in ("optimizer", "_optimizer") or _optimizer_node(graph.nodes[node_id])


def _optimizer_node(node) -> bool:
    return len(node.slot_variables) > 0 or any(
        child.local_name in ("_iterations", "iter") for child in node.children)


class OptimizerEdges:
    """`is_optimizer_node` of one graph as a `skip`/`defer` of `graph_walk`, each node's own
    test (its slots and children) done once: a node of many children reached by many edges
    (a crafted graph) then costs its children once, not once per edge."""

    __slots__ = ("_graph", "_known")

    def __init__(self, graph):
        self._graph = graph
        self._known: dict[int, bool] = {}

    def __call__(self, node_id: int, local_name: str) -> bool:
        if local_name in ("optimizer", "_optimizer"):
            return True
        found = self._known.get(node_id)
        if found is None:
            found = self._known[node_id] = _optimizer_node(self._graph.nodes[node_id])
        return found


def walked_paths(graph, defer=None) -> dict[int, str]:
    """node id -> path for every node a walk from the root reaches: breadth-first, the edges
    `defer(node_id, name)` names taken last (optimizers, a SavedModel's serving lists), so a
    weight gets the path through its layers; then slot variables as
    `<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>` of those paths."""
    paths = {0: ""}
    total = 0
    for parent, name, node in graph_walk(graph, defer=defer):
        paths[node] = _join(paths[parent], name)
        total = _counted(total, paths[node])
    for node_id in list(paths):
        for slot in graph.nodes[node_id].slot_variables:
            variable = paths.get(slot.original_variable_node_id)
            if variable is not None and slot.slot_variable_node_id not in paths:
                paths[slot.slot_variable_node_id] = slot_path(variable, paths[node_id],
                                                              slot.slot_name)
    return paths


def prefix_subtree(keys, at: str) -> dict:
    """{key within `at`: key} for the keys under `at` by path prefix; a slot belongs when its
    variable and its optimizer both do."""
    head = at.strip("/") + "/"
    view = {}
    for key in keys:
        slot = split_slot(key)
        if slot is None:
            if key.startswith(head):
                view[key[len(head):]] = key
        elif slot[0].startswith(head) and slot[1].startswith(head):
            view[slot_path(slot[0][len(head):], slot[1][len(head):], slot[2])] = key
    return view


def prefix_holding(specs: dict, names, wanted: dict) -> list[str]:
    """The top-level `names` whose `prefix_subtree` holds every non-slot path of `wanted`
    ({path: (shape tuple, dtype)}) with that shape and dtype (specs: {key: (shape, dtype)}).
    A name is dropped at its first path that fails, so a name holding none costs O(1)."""
    plain = [(path, spec) for path, spec in wanted.items() if split_slot(path) is None]
    out = []
    for name in names:
        head = name + "/"
        for path, spec in plain:
            have = specs.get(head + path)
            if have is None or (tuple(have[0]), have[1]) != spec:
                break
        else:
            out.append(name)
    return out
