"""The object-path grammar, in one place. Pure Python, no TensorFlow.

An object path joins TF's dependency-edge names with `/`; an edge name containing `/` or `.`
is escaped as TF escapes it in checkpoint keys (`.` -> `..`, `/` -> `.S`). A checkpoint key is
`<path>/.ATTRIBUTES/VARIABLE_VALUE`; an optimizer slot variable's path is
`<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>`.
"""

from __future__ import annotations

__all__ = ["ATTRIBUTES", "OPTIMIZER_SLOT", "VARIABLE_VALUE", "checkpoint_key", "escape",
           "graph_paths", "path_of_key", "slot_path", "split_slot", "unescape"]

ATTRIBUTES = "/.ATTRIBUTES/"
VARIABLE_VALUE = "VARIABLE_VALUE"
OPTIMIZER_SLOT = ".OPTIMIZER_SLOT"
_SLOT_MARKER = "/" + OPTIMIZER_SLOT + "/"


def escape(name: str) -> str:
    """An edge name as one path component (TF's `escape_local_name`)."""
    return name.replace(".", "..").replace("/", ".S")


def unescape(component: str) -> str:
    """Inverse of `escape`: `..` -> `.` and `.S` -> `/`."""
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


def graph_paths(graph, start: int = 0, skip=None) -> dict[int, str]:
    """The canonical object paths of a `TrackableObjectGraph` proto's nodes below `start`.

    node id -> path relative to `start`, in breadth-first order (TF's: a node reachable by
    several paths gets the first one found). `skip(node_id, local_name)` prunes a child edge
    and what lies only below it.
    """
    paths = {start: ""}
    order = [start]
    for current in order:  # grows while iterating: a breadth-first walk
        for child in graph.nodes[current].children:
            if child.node_id in paths or (skip is not None
                                          and skip(child.node_id, child.local_name)):
                continue
            local = escape(child.local_name)
            paths[child.node_id] = f"{paths[current]}/{local}" if paths[current] else local
            order.append(child.node_id)
    return paths
