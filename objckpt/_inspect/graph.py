"""Pictures of an object dependency graph: DOT text, SVG/PNG through Graphviz.

`graph(source)` draws a checkpoint's object graph (or a live obj's, with the
class of every object): objects as boxes with their layer names, variables as
ellipses with shape and dtype, an edge from each weight to its optimizer slots
dashed and red, extra edges to an object already drawn (shared layers, a Keras
3 optimizer's variable lists) dotted. Drawing a checkpoint needs no
TensorFlow: `_names` reads layer names and slot owners from the saved names.
Large graphs are collapsed below a depth. The DOT text needs nothing extra;
SVG and PNG are rendered by Graphviz's `dot` program when it is installed.

Every string from a checkpoint is data: node ids are ours (`n0`, `n1`, ...)
and names are escaped inside quoted DOT strings, so no name can change the
graph, and Graphviz escapes them again when it writes SVG.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import subprocess

from objckpt import errors
from objckpt._base import names as _names
from objckpt._base import paths as _paths
from objckpt._base import render as _render

__all__ = ["Graph", "graph", "render"]

FORMATS = ("dot", "svg", "png")
_MAX_NODES = 120  # auto-collapse above this many drawn nodes
_INSTALL_HINT = ("Fix: install Graphviz with your system's package manager (Debian/Ubuntu: "
                 "`apt-get install graphviz`; macOS: `brew install graphviz`; conda: `conda "
                 "install graphviz`); `pip install graphviz` installs only Python bindings, "
                 "not the `dot` program. Or write DOT text (format='dot') and render it elsewhere.")
_STYLE = {
    "root": 'shape=box, style="rounded,filled,bold", fillcolor="#cfe2f3"',
    "object": 'shape=box, style="rounded,filled", fillcolor="#eef3f8"',
    "optimizer": 'shape=box, style="rounded,filled", fillcolor="#fde9d9"',
    "variable": 'shape=ellipse, style=filled, fillcolor="#e6f4e6"',
    "slot": 'shape=ellipse, style=filled, fillcolor="#fff2d9"',
    "collapsed": 'shape=folder, style=filled, fillcolor="#e8e8e8"',
}
_EDGE_STYLE = {
    "child": [],
    "alias": ["style=dotted", 'color="#888888"'],
    "slot": ["style=dashed", 'color="#c0392b"', 'fontcolor="#c0392b"'],
}


@dataclasses.dataclass
class _Node:
    id: int
    kind: str  # root, object, optimizer, variable, slot
    path: str
    edge: str  # the name of its canonical edge ("" for the root)
    depth: int
    parent: int | None
    class_name: str = ""
    shape: tuple | None = None
    dtype: str = ""
    nbytes: int = 0
    layout: str = ""  # a partitioned (sharded) variable's: "2 shards of rows [0:5) [5:10)"
    name: str = ""  # the layer's (module's, optimizer's) own name, where known
    links: list = dataclasses.field(default_factory=list)  # slot: [(weight id, role)]


def _escape(text: str) -> str:
    """A string as the inside of a quoted DOT string, shown literally by Graphviz.

    Quotes and backslashes are DOT-escaped (Graphviz shows them as they are); control, line
    separator and bidi characters (what `_render.safe` escapes) are shown as `\\xNN` or
    `\\uNNNN` text.
    """
    out = []
    for char in str(text):
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif _render.safe(char) != char:
            code = ord(char)
            out.append(f"\\\\x{code:02x}" if code < 0x100 else f"\\\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def _lines(lines) -> str:
    """Lines of text as one quoted-DOT label: each escaped, joined by DOT's line break."""
    return "\\n".join(_escape(line) for line in lines)


class Graph:
    """A drawn object graph (see `objckpt.graph`).

    Attributes:
      dot: the Graphviz DOT text.
      source: what was drawn (a prefix, or a description of a live obj).
      nodes: number of nodes drawn.
      edges: number of edges drawn.
      depth: the depth below which objects were collapsed, or None.
      collapsed: number of objects and variables folded into collapsed nodes.
    """

    def __init__(self, dot: str, source: str, nodes: int, edges: int, depth, collapsed: int):
        self.dot = dot
        self.source = source
        self.nodes = nodes
        self.edges = edges
        self.depth = depth
        self.collapsed = collapsed

    def render(self, format: str = "svg") -> bytes:
        """Returns the picture as bytes: DOT text, or SVG/PNG rendered by Graphviz.

        Raises:
          GraphvizNotFoundError: SVG/PNG asked for and `dot` is not installed.
          InvalidArgumentError: an unknown format.
        """
        return render(self.dot, format)

    def save(self, path, format: str | None = None) -> str:
        """Writes the picture to `path` (format from the extension by default); returns path."""
        path = os.fspath(path)
        if format is None:
            format = os.path.splitext(path)[1].lstrip(".").lower() or "dot"
            if format == "gv":
                format = "dot"
        data = self.render(format)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def _repr_svg_(self):
        if shutil.which("dot") is None:
            return None
        return self.render("svg").decode("utf-8")

    def _repr_mimebundle_(self, include=None, exclude=None):
        svg = self._repr_svg_()
        if svg is not None:
            return {"image/svg+xml": svg}
        return {"text/plain": f"{self!r}\nGraphviz's `dot` is not installed, so here is the DOT "
                              f"text. {_INSTALL_HINT}\n\n{self.dot}"}

    def __repr__(self) -> str:
        folded = f", collapsed below depth {self.depth}" if self.depth is not None else ""
        return f"Graph({self.source!r}: {self.nodes} nodes, {self.edges} edges{folded})"


def render(dot: str, format: str = "svg") -> bytes:
    """Renders DOT text with Graphviz's `dot` program (format 'dot' returns the text)."""
    if format not in FORMATS:
        raise errors.InvalidArgumentError(
            f"Unknown picture format. Expected one of {', '.join(FORMATS)}. Received: "
            f"format={format!r}. Fix: pass one of them.")
    if format == "dot":
        return dot.encode("utf-8")
    program = shutil.which("dot")
    if program is None:
        raise errors.GraphvizNotFoundError(
            f"Rendering {format.upper()} needs Graphviz's `dot` program, and it is not on PATH. "
            + _INSTALL_HINT)
    result = subprocess.run([program, f"-T{format}"], input=dot.encode("utf-8"),
                            capture_output=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"Graphviz `dot -T{format}` failed with exit status "
                           f"{result.returncode}: {result.stderr.decode(errors='replace')[:500]}")
    return result.stdout


def graph(source, *, depth: int | None = None, max_nodes: int = _MAX_NODES,
          empty: bool = False) -> Graph:
    """Draws the object dependency graph of a checkpoint or a live obj.

    Objects are boxes labelled with their edge name and, in brackets where it
    differs, the layer's own name (`1 [encoder]`, `hidden [dense]`), then their
    class when a live obj is drawn (a checkpoint does not record classes).
    Variables are ellipses with shape and dtype, hanging under their layers;
    optimizers are orange. Optimizer slot variables are yellow, with a dashed
    red edge from the weight they belong to, labelled with their role (`m`,
    `v`, `momentum`, `velocity`, ...): TF's slot table (TF1, Keras 2 legacy
    optimizers) and the lists Keras 3 and tf_keras optimizers keep alike. A
    second edge to an object already drawn (a shared layer, a Keras 3
    optimizer's variable list) is dotted. A name-based (TF1 `Saver`)
    checkpoint has no object graph; its variable names are split at `/`.

    A live obj gives every layer's name and pairs slots with weights by
    identity. A checkpoint gives them through its saved variable names, used
    only where unambiguous: an object is named after the prefix its variables'
    names share (`conv/kernel`, `conv/bias` -> `conv`) when no other object
    has that prefix; a slot is paired by its optimizer's lists (Keras 3) or by
    name (`adam/conv_kernel_momentum`, `Adam/m/conv/kernel`) when exactly one
    weight matches. Keras 3 saves a subclassed model's weights under
    TensorFlow names without their layer (`net/kernel`), so such layers stay
    unnamed in a checkpoint drawing.

    Args:
      source: a checkpoint prefix or directory (its newest intact checkpoint),
        or a live trackable obj (a Keras model, `tf.Module`, ...).
      depth: draw objects down to this many edges from the root; deeper ones
        are folded into one node per subtree that says what it holds. None:
        everything, unless more than `max_nodes` nodes would be drawn; then
        the largest depth that fits.
      max_nodes: the size above which `depth=None` collapses.
      empty: also draw objects with no variable below them (e.g. the empty
        bookkeeping lists of Keras layers); hidden by default.

    Returns:
      A `Graph`: `.dot` (DOT text), `.render('svg'|'png'|'dot')`, `.save(path)`;
      it displays inline in a notebook when Graphviz is installed.

    Raises:
      CheckpointNotFoundError, CheckpointCorruptError: as `objckpt.read_tree`.
      InvalidArgumentError: depth < 1.
      UnsupportedObjectError: source is neither a path nor a trackable.

    Example:
      >>> objckpt.graph("/tmp/run", depth=3).save("graph.svg")
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or depth < 1):
        raise errors.InvalidArgumentError(
            f"depth must be a whole number >= 1 (edges from the root) or None. Received: "
            f"depth={depth!r}. Fix: pass a number such as depth=3, or None for every edge.")
    proto, specs, live, title, note = _load(source)
    nodes = _walk(proto, specs, live)
    if not empty:
        hidden = _hide_empty(nodes)
        if hidden:
            note = (note + "; " if note else "") + (
                f"{hidden} object{'s' * (hidden != 1)} without variables hidden (empty=True "
                "shows them)")
    return _draw(proto, nodes, title, note, depth, max_nodes)


def _hide_empty(nodes: dict) -> int:
    """Drops objects with no variable below them (Keras bookkeeping lists); returns how many."""
    keep = {0}
    for node in nodes.values():
        if node.kind in ("variable", "slot"):
            current = node
            while current is not None and current.id not in keep:
                keep.add(current.id)
                current = nodes[current.parent] if current.parent is not None else None
    hidden = [n for n in nodes if n not in keep]
    for node_id in hidden:
        del nodes[node_id]
    return len(hidden)


def _load(source):
    """(graph proto, {checkpoint key: (shape, dtype name, nbytes, layout)}, classes, title,
    note)."""
    if isinstance(source, (str, os.PathLike)):
        # A checkpoint is read without TF (`_meta`): `objckpt graph` answers in a second.
        from objckpt._bundle import objgraph as _objgraph
        from objckpt._inspect import meta as _meta

        entries = _meta.read(source)
        if entries.graph is None:  # a TF1 checkpoint, or a file without an object graph
            names = sorted(entries)
            proto = _objgraph.name_graph(names)
            specs = {_paths.checkpoint_key("/".join(map(_paths.escape, n.split("/")))):
                     _spec(entries[n]) for n in names}
            note = (f"{entries.description}: weights by key, split at '/'"
                    if entries.description else
                    "name-based (TF1 Saver) checkpoint: variable names split at '/'")
            return proto, specs, None, entries.prefix, note
        specs = {e.key: _spec(e) for e in entries.values()}
        return entries.graph, specs, None, entries.prefix, ""
    from objckpt import _compat
    from objckpt._planning import tree as _tree

    if not _compat.is_trackable(source):
        raise errors.UnsupportedObjectError(
            f"objckpt.graph needs a checkpoint prefix or directory, or a trackable obj (a Keras "
            f"model, a tf.Module). Received: {type(source).__name__}. Fix: pass a prefix, a "
            "directory or a model; for a Snapshot, objckpt.save it first and draw the prefix.")
    proto, classes = _compat.live_object_graph(source)
    variables = _tree.tree(source)
    specs = {}
    for path, variable in variables.items():
        layout = _compat.shard_layout(variable).describe() if _compat.is_sharded(variable) \
            else ""
        specs[_paths.checkpoint_key(path)] = _spec(variable, layout)
    return proto, specs, classes, f"{type(source).__name__} (live obj)", ""


def _spec(variable, layout: str | None = None) -> tuple:
    """(shape, dtype name, nbytes, layout) of a variable: a live one (`tf.DType`; its
    `layout` given) or a checkpoint's (`_meta.Variable`, whose dtype has TF's `.name` and
    `.size`, and which knows its layout)."""
    dims = tuple(int(d) for d in variable.shape)
    count = 1
    for dim in dims:
        count *= dim
    if layout is None:
        layout = getattr(variable, "layout", "")
    return dims, variable.dtype.name, count * variable.dtype.size, layout


def _walk(proto, specs, live) -> dict[int, _Node]:
    """Breadth-first from the root: every reachable node with its canonical path and depth.

    Also marks optimizers and slot variables, names the layers (`live.names` for a live obj,
    else from the saved variable names, `_names.layer_names`) and gives each slot an
    optimizer keeps outside TF's table the weight it belongs to (`_Node.links`: by identity
    for a live obj, by the optimizer's lists and saved names for a checkpoint).
    """
    count = len(proto.nodes)
    nodes = {0: _Node(0, "root", "", "", 0, None)}

    # Each node's own test once, however many edges reach it (a crafted graph).
    optimizer = _paths.OptimizerEdges(proto)

    # Breadth-first, optimizers last: a trained Keras 3 model's weights then hang under
    # their layers, and the optimizer's variable lists point at them with extra edges.
    for current, name, node_id in _paths.graph_walk(proto, defer=optimizer):
        parent = nodes[current]
        local = _paths.escape(name)
        nodes[node_id] = _Node(node_id, "object", f"{parent.path}/{local}" if parent.path
                               else local, name, parent.depth + 1, current)
    slot_ids = set()
    for current in list(nodes):
        for slot in proto.nodes[current].slot_variables:
            sid = slot.slot_variable_node_id
            if sid in nodes or not 0 <= sid < count:
                continue
            slot_ids.add(sid)
            variable = nodes.get(slot.original_variable_node_id)
            path = (f"{variable.path if variable else '?'}/{_paths.OPTIMIZER_SLOT}/"
                    f"{nodes[current].path}/{slot.slot_name}")
            nodes[sid] = _Node(sid, "slot", path, slot.slot_name, nodes[current].depth + 1,
                               current)
    for node in nodes.values():
        for attribute in proto.nodes[node.id].attributes:
            if attribute.name == _paths.VARIABLE_VALUE and attribute.checkpoint_key in specs:
                node.shape, node.dtype, node.nbytes, node.layout = \
                    specs[attribute.checkpoint_key]
                if node.kind != "slot":
                    node.kind = "variable"
        if node.kind == "object" and optimizer(node.id, node.edge):
            node.kind = "optimizer"
    saved = _names.variable_names(proto)
    # A live obj pairs slots by identity; the optimizer's lists and saved names pair the
    # rest (a checkpoint's slots, a Keras 3 EMA list `optimizer_slot_lists` does not know).
    links = [(owner, _names.slot_role(saved, owner, slot, role), slot)
             for owner, role, slot in (live.slots if live is not None else ())]
    paired = {slot for _, _, slot in links}
    network = {0} | {node_id for _, _, node_id in _paths.graph_walk(proto, skip=optimizer)}
    links += [link for link in _names.slot_links(proto, network, saved)
              if link[2] not in paired]
    for owner, role, slot in links:
        if owner in nodes and slot in nodes and nodes[slot].kind == "variable" and \
                nodes[owner].kind == "variable":
            nodes[slot].kind = "slot"
            nodes[slot].links.append((owner, role))
    if live is None:
        parents = {n.id: n.parent for n in nodes.values() if n.kind != "slot"}
        names = _names.layer_names(proto, parents, links, saved)
    else:
        names = {i: name for i, name in enumerate(live.names) if name}
    for node in nodes.values():
        if live is not None and node.id < len(live.classes) and node.kind not in (
                "variable", "slot"):
            node.class_name = live.classes[node.id]
        if node.kind not in ("variable", "slot"):
            node.name = names.get(node.id, "")
    return nodes


def _auto_depth(nodes: dict, max_nodes: int) -> int | None:
    per_depth = collections.Counter(node.depth for node in nodes.values())
    if len(nodes) <= max_nodes:
        return None
    drawn, best = 0, 1
    for level in sorted(per_depth):
        drawn += per_depth[level]
        if drawn > max_nodes:
            break
        best = max(level, 1)
    return best


def _draw(proto, nodes: dict, title: str, note: str, depth, max_nodes) -> Graph:
    applied = depth if depth is not None else _auto_depth(nodes, max_nodes)
    if applied is not None and all(node.depth <= applied for node in nodes.values()):
        applied = None  # nothing to collapse

    def shown(node_id: int) -> int:
        node = nodes[node_id]
        while applied is not None and node.depth > applied:
            node = nodes[node.parent]
        return node.id

    folded: dict[int, list[int]] = collections.defaultdict(list)
    for node in nodes.values():
        rep = shown(node.id)
        if rep != node.id:
            folded[rep].append(node.id)
    lines = ["digraph objckpt {",
             '  graph [rankdir=LR, fontname="Helvetica", fontsize=11, labelloc=t, '
             f'label="{_lines(_caption(title, note, applied))}"];',
             '  node [fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9, color="#555555"];']
    drawn = sorted(n for n in nodes if shown(n) == n)
    for node_id in drawn:
        node = nodes[node_id]
        kind = "collapsed" if folded.get(node_id) else node.kind
        label = _label(node, [nodes[i] for i in folded.get(node_id, ())])
        lines.append(f'  n{node_id} [{_STYLE[kind]}, label="{_lines(label)}"];')
    edges = set()

    def edge(a: int, b: int, kind: str, label: str = "") -> None:
        a, b = shown(a), shown(b)
        if a == b or (a, b) in edges:
            return
        edges.add((a, b))
        attrs = ([f'label="{_escape(label)}"'] if label else []) + _EDGE_STYLE[kind]
        lines.append(f"  n{a} -> n{b}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")

    for node_id in sorted(nodes):
        if node_id in nodes and nodes[node_id].kind != "slot":
            for child in proto.nodes[node_id].children:
                if child.node_id not in nodes:
                    continue
                canonical = nodes[child.node_id].parent == node_id and \
                    nodes[child.node_id].edge == child.local_name
                edge(node_id, child.node_id, "child" if canonical else "alias",
                     "" if canonical else child.local_name)
        for slot in proto.nodes[node_id].slot_variables:
            if slot.slot_variable_node_id in nodes:
                edge(node_id, slot.slot_variable_node_id, "child")
                if slot.original_variable_node_id in nodes:
                    edge(slot.original_variable_node_id, slot.slot_variable_node_id, "slot",
                         slot.slot_name)
        for owner, role in nodes[node_id].links:  # slots kept in an optimizer's lists
            if owner in nodes and shown(node_id) == node_id:
                edge(owner, node_id, "slot", role)
    lines.append("}")
    return Graph("\n".join(lines) + "\n", title, len(drawn), len(edges), applied,
                 sum(len(v) for v in folded.values()))


def _caption(title: str, note: str, applied) -> list[str]:
    parts = [title]
    if note:
        parts.append(note)
    if applied is not None:
        parts.append(f"collapsed below depth {applied} (depth=N to change)")
    return parts


def _label(node: _Node, folded: list) -> list[str]:
    """Edge name (the class or `root` for the root) with the layer name beside it, in
    brackets, where it differs (`1 [encoder]`); then the class, shape and dtype, contents."""
    first = (node.class_name or "root") if node.kind == "root" else node.edge
    lines = [f"{first} [{node.name}]" if node.name and node.name != first else first]
    if node.kind != "root" and node.class_name:
        lines.append(node.class_name)
    if node.kind in ("variable", "slot") and node.shape is not None:
        lines.append(f"{_render.shape(node.shape)} {node.dtype}")
        if node.layout:
            lines.append(node.layout)
    if folded:
        objects = sum(1 for n in folded if n.kind not in ("variable", "slot"))
        variables = [n for n in folded if n.kind in ("variable", "slot")]
        nbytes = sum(n.nbytes for n in variables)
        lines.append(f"+{objects} object{'s' * (objects != 1)}, {len(variables)} "
                     f"variable{'s' * (len(variables) != 1)}, {_render.size(nbytes)}")
    return lines
