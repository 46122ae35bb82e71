"""TF's trackable object graph, and the Keras 3 collections it misses: object paths of live
objs (one walk), completeness checks, children for deferred restore and `objckpt graph`."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import graph_view as _graph_view
from tensorflow.python.checkpoint import util as _checkpoint_util
from tensorflow.python.trackable import trackable_utils as _trackable_utils
from tensorflow.python.util import object_identity as _object_identity

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._compat.partitioned import is_partitioned, partition_axis, partitioned_children
from objckpt._compat.sharded import is_caching_type, is_sharded, shards
from objckpt._compat.optimizers import _is_optimizer, optimizer_slot_lists
from objckpt._compat.variables import (
    _keras3_variable,
    _keras3_variable_type,
    _variable_list,
    as_variable,
    is_trackable,
    is_unbuilt,
    variable_name,
)

__all__ = [
    "OBJECT_GRAPH_KEY",
    "CollectionNode",
    "TrackableObjectGraph",
    "check_complete",
    "children",
    "children_with_collections",
    "keras_collection_children",
    "keras_layers",
    "live_object_graph",
    "network_variable_paths",
    "random_state_variables",
    "rng_state_variables",
    "variable_edges",
    "variable_holders",
    "variable_paths",
    "walk",
]

TrackableObjectGraph = trackable_object_graph_pb2.TrackableObjectGraph

# Key under which TF stores the serialized object graph in every object-based checkpoint.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def objects_and_names(view) -> tuple[list, dict]:
    """(objects, {object: path}) of a graph view, slot variables last: what TF's
    `objects_ids_and_slot_variables_and_paths` returns, without its `dir()` of every
    object (35 us each) where no object can have optimizer slots.

    TF looks for slots on each object with "get_slot_names" in dir(obj) (TF 2.12: or a
    `tf.compat.v1` optimizer, whose class defines it). An object can only pass that test
    if its class defines the method, its own `__dict__` holds it, or its class overrides
    `__dir__` (then dir() itself is asked); only then does TF's own pass run.
    """
    objects, node_paths = view.breadth_first_traversal()
    names = _object_identity.ObjectIdentityDictionary()
    for trackable, path in node_paths.items():
        names[trackable] = _trackable_utils.object_path_to_string(path)
    if any(_may_have_slots(trackable) for trackable in objects):
        node_ids = _object_identity.ObjectIdentityDictionary()
        for node_id, trackable in enumerate(objects):
            node_ids[trackable] = node_id
        _checkpoint_util.serialize_slot_variables(
            trackable_objects=objects, node_ids=node_ids, object_names=names)
    return objects, names


def _may_have_slots(trackable) -> bool:
    cls = type(trackable)
    if hasattr(cls, "get_slot_names"):
        return True
    if cls.__dir__ is not object.__dir__:  # a proxy (_DictWrapper) or custom dir(): ask it
        return "get_slot_names" in dir(trackable)
    try:
        own = object.__getattribute__(trackable, "__dict__")
    except (AttributeError, TypeError):
        return False
    return isinstance(own, dict) and "get_slot_names" in own


def variable_paths(obj) -> list[tuple[str, object]]:
    """Lists (object path, variable) for every variable obj owns.

    The paths and their order are TF's own for everything TF's object graph
    reaches: a breadth-first walk, so a variable reachable by two paths
    appears once, under the shortest (first found) one, and optimizer slot
    variables come in TF's `<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>`
    form. Variables TF's graph misses (Keras 3 layers held in lists and dicts,
    `SeedGenerator` states) follow, under the paths tf_keras gives the same
    code (`blocks/0/dense/...`; see `keras_collection_children`).

    Raises:
      UntrackedVariableError: a variable obj owns (Keras: `obj.variables` and
        its optimizer's) is reachable by no path at all.
    """
    view = _graph_view.ObjectGraphView(obj)
    objects, names = objects_and_names(view)
    out = []
    for trackable in objects:
        variable = as_variable(trackable)
        if variable is not None:
            out.append((names[trackable], variable))
        elif is_sharded(trackable):  # one logical variable: its shards are no nodes of TF's
            out.append((names[trackable], trackable))
    out.extend(_partitioned_paths([(t, names[t]) for t in objects], out))
    out.extend(_collection_paths([(t, names[t]) for t in objects], out))
    check_complete(obj, out)
    _check_unique(obj, out)
    return out


def _partitioned_paths(reached, found) -> list:
    """(path, variable) of the TF1 `PartitionedVariable`s held as attributes of the objects
    TF's walk reached (`reached`: (object, path) in its order), which TF's graph misses:
    each once, one logical variable under the path of its attribute."""
    seen = {id(variable) for _, variable in found}
    out = []
    for node, path in reached:
        if as_variable(node) is not None or is_sharded(node):
            continue
        for name, variable in partitioned_children(node):
            if id(variable) not in seen:
                seen.add(id(variable))
                child = f"{path}/{_paths.escape(name)}" if path else _paths.escape(name)
                partition_axis(variable, child)  # parts along several axes: TF's limit
                out.append((child, variable))
    return out


def _leaf(child):
    """A variable of the object graph: `as_variable`'s, or a sharded variable whole."""
    variable = as_variable(child)
    return child if variable is None and is_sharded(child) else variable


def _check_unique(obj, found) -> None:
    """Two variables under one path (dict keys 1 and "1" in one Keras 3 dict) is an error."""
    paths: dict = {}
    for path, variable in found:
        paths.setdefault(path, []).append(variable)
    clashes = [path for path, variables in paths.items() if len(variables) > 1]
    if clashes:
        raise errors.UntrackedVariableError(
            f"{type(obj).__name__} holds {len(clashes)} pair(s) of variables under one object "
            f"path, so one of each would be left behind: {', '.join(clashes[:5])}. This "
            "happens when one dict of layers has keys that read the same as text (1 and "
            "'1'). Fix: give the dict distinct string keys.", tuple(clashes))


def walk(obj, *, skip_optimizers: bool = False, collections: bool = False,
         visited: list | None = None):
    """The one breadth-first walk of a live obj's object graph, in TF's order.

    Yields (parent, path, child, first) for every edge from an object to a child: `path` is
    the child's object path along that edge, `first` is False for an edge to a child reached
    before. Objects are walked once, from their first (shortest) path; variables are leaves.
    `skip_optimizers` leaves out every child with an `apply_gradients` method (TF1, Keras 2,
    tf_keras and Keras 3 optimizers); `collections` adds the Keras 3 lists and dicts TF's
    graph misses (`keras_collection_children`). `visited`, when given, receives (object,
    path) for obj and every object walked.
    """
    view = _graph_view.ObjectGraphView(obj)
    seen = {id(obj)}
    queue = [(obj, "")]
    for node, path in queue:  # grows while iterating: a breadth-first walk
        edges = [(_paths.escape(name), child) for name, child in view.children(node).items()]
        edges += [(_paths.escape(name), child) for name, child in partitioned_children(node)]
        if collections:
            edges += [("/".join(map(_paths.escape, names)), child)
                      for names, child in keras_collection_children(node)]
        for local, child in edges:
            if skip_optimizers and _is_optimizer(child):
                continue
            child_path = f"{path}/{local}" if path else local
            first = id(child) not in seen
            yield node, child_path, child, first
            if first:
                seen.add(id(child))
                if as_variable(child) is None and not is_partitioned(child):
                    queue.append((child, child_path))
    if visited is not None:
        visited.extend(queue)


def network_variable_paths(obj) -> list[tuple[str, object]]:
    """Like `variable_paths`, but never walks into an optimizer.

    `walk` in TF's order, skipping optimizers: the paths are those of the network alone, the
    same whether or not a model is compiled (TF's canonical path of a variable can otherwise
    run through the optimizer's list of the variables it trains). Keras 3 collections follow
    as in `variable_paths`.
    """
    out, reached = [], []
    for _, path, child, first in walk(obj, skip_optimizers=True, visited=reached):
        variable = _leaf(child) if first else None
        if variable is not None:
            out.append((path, variable))
    out.extend(_collection_paths(reached, out, skip_optimizers=True))
    check_complete(obj, out, optimizer=False)
    return out


def variable_edges(obj) -> list[tuple[str, object]]:
    """(path, variable) for every edge of TF's object graph that ends at a variable.

    Objects are walked once (`walk`: TF's canonical paths); a variable with edges from
    several objects (a Keras 3 optimizer's `_trainable_variables` and its layer) is listed
    once per edge.
    """
    out = []
    for _, path, child, _ in walk(obj):
        variable = _leaf(child)
        if variable is not None:
            out.append((path, variable))
    return out


def variable_holders(obj) -> dict:
    """id(variable) -> class name of the object holding it directly (optimizers skipped)."""
    out: dict = {}
    for parent, _, child, _ in walk(obj, skip_optimizers=True, collections=True):
        variable = _leaf(child)
        if variable is not None:
            out.setdefault(id(variable), type(parent).__name__)
    return out


# Keras 3 bookkeeping attributes: lists of what the layer's own attributes already hold.
_KERAS3_BOOKKEEPING = frozenset({
    "_inbound_nodes", "_outbound_nodes", "_losses", "_loss_ids", "_losses_override",
    "_layers", "_trainable_variables", "_non_trainable_variables", "_metrics",
    "_tracker", "_tracked", "_seed_generators", "call_signature_parameters",
    "_call_context_args", "_build_shapes_dict", "_compile_metrics", "_loss_tracker",
    "_compile_loss", "_metrics_names"})
_KERAS3_TYPES: dict = {}


def _is_keras3_type(cls) -> bool:
    known = _KERAS3_TYPES.get(cls)
    if known is None:  # Keras 2.13-2.15 live in `keras.src` too: the version tells
        known = _keras3_variable_type() is not None and any(
            c.__module__.startswith("keras.src.") for c in cls.__mro__)
        _KERAS3_TYPES[cls] = known
    return known


def keras_collection_children(node) -> list[tuple[tuple[str, ...], object]]:
    """Children of a Keras 3 object that TF's object graph does not list.

    Keras 3 wraps lists and dicts assigned to a layer in its own tracked
    collections (their names in `layer._tracked`), which TF's checkpoint walk
    does not enter (tf_keras wraps them in TF's `ListWrapper`/`_DictWrapper`,
    which it does): every layer, variable or object in them is returned with
    the edge names tf_keras uses, `("blocks", "0")` for `self.blocks[0]`,
    `("heads", "a")` for `self.heads["a"]`. Tuples count too. The state of a
    `SeedGenerator` (not a trackable) comes as `("seed_generator", "state")`,
    named by the attribute holding the generator. Edge names are unescaped.
    Everything else returns [].
    """
    if not _is_keras3_type(type(node)):
        return []
    try:
        attributes = vars(node)
    except TypeError:
        return []
    tracked = attributes.get("_tracked")
    names = list(tracked) if isinstance(tracked, list) else []
    names += [name for name, value in attributes.items()
              if type(value) is tuple or (not isinstance(tracked, list)
                                          and isinstance(value, (list, dict)))]
    out: list = []
    for name in dict.fromkeys(names):
        value = attributes.get(name)
        if name not in _KERAS3_BOOKKEEPING and isinstance(value, (list, tuple, dict)):
            _collect(out, (name,), value, 0)
    seeds = attributes.get("_seed_generators")
    if seeds:
        held_by = {id(value): name for name, value in attributes.items()
                   if name != "_seed_generators"}
        for index, generator in enumerate(seeds):
            state = getattr(generator, "state", None)
            if state is None:
                continue
            name = held_by.get(id(generator))
            edges = (name,) if name else ("_seed_generators", str(index))
            out.append(((*edges, "state"), state))
    return out


def _collect(out: list, edges: tuple, value, depth: int) -> None:
    if depth > 8:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _collect(out, (*edges, str(key)), item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _collect(out, (*edges, str(index)), item, depth + 1)
    elif depth > 0 and (is_trackable(value) or _keras3_variable(value)):
        out.append((edges, value))
    elif depth > 0 and type(value).__name__ == "SeedGenerator":  # in a list of its own
        state = getattr(value, "state", None)
        if state is not None:
            out.append(((*edges, "state"), state))


def _collection_paths(reached, found, skip_optimizers: bool = False) -> list:
    """(path, variable) of variables only reachable through Keras 3 collections.

    reached: (trackable, path) of every object the TF walk found, in its
    order; found: the (path, variable) it found. New objects are walked
    breadth-first, through their TF children and their collections.
    """
    if not any(_is_keras3_type(type(node)) for node, _ in reached):
        return []
    seen = {id(node) for node, _ in reached}
    seen.update(id(variable) for _, variable in found)
    queue = [(node, path, False) for node, path in reached]
    out: list = []

    def visit(child, path):
        if id(child) in seen or (skip_optimizers and _is_optimizer(child)):
            return
        variable = as_variable(child)
        if variable is not None and id(variable) in seen:
            return  # a keras.Variable whose tf.Variable was reached already
        seen.add(id(child))
        if variable is None:
            queue.append((child, path, True))
        else:
            seen.add(id(variable))
            out.append((path, variable))

    for node, path, new in queue:  # grows while iterating: a breadth-first walk
        if new:  # reached only here: its TF children too
            for name, child in children(node).items():
                visit(child, f"{path}/{_trackable_utils.escape_local_name(name)}")
        for edges, child in keras_collection_children(node):
            local = "/".join(_trackable_utils.escape_local_name(e) for e in edges)
            visit(child, f"{path}/{local}" if path else local)
    return out


def check_complete(obj, found, optimizer: bool = True) -> None:
    """Raises UntrackedVariableError if obj owns a variable missing from `found`.

    What a Keras obj owns is `obj.variables` plus its optimizer's variables
    (for a `tf.train.Checkpoint` or other container: those of each Keras
    model among its direct children). Other objs own what TF's graph reaches.
    """
    have = {id(_unwrapped(variable)) for _, variable in found}
    have.update(id(_unwrapped(part)) for _, variable in found if is_sharded(variable)
                for part in shards(variable))  # `variables` lists a sharded one's shards
    missing = []
    for owner in _keras_roots(obj):
        if is_unbuilt(owner):  # its layers may exist before it does: unbuilt, not untracked
            continue
        for value in _owned_variables(owner, optimizer):
            variable = as_variable(value)
            if variable is not None and id(_unwrapped(variable)) not in have:
                missing.append((owner, value))
                have.add(id(_unwrapped(variable)))
    if not missing:
        return
    lines = []
    for owner, value in missing[:10]:
        layer = _owning_layer(owner, value)
        name = getattr(value, "path", None) or variable_name(as_variable(value))
        lines.append(f"  - `{name}` {tuple(value.shape)} of {type(layer).__name__} "
                     f"`{getattr(layer, 'name', '?')}`")
    more = f"\n  - ... and {len(missing) - 10} more" if len(missing) > 10 else ""
    raise errors.UntrackedVariableError(
        f"{type(obj).__name__} owns {len(missing)} variable(s) that no attribute path reaches "
        "(they are in its `variables`, but no attribute path leads to them: a layer held in a "
        "set, which has no stable order, or by an object TF's object graph does not follow), "
        "so no checkpoint could save or restore them and objckpt refuses to leave them "
        "behind:\n" + "\n".join(lines) + more
        + "\nFix: assign the layer or variable to an attribute of a layer or model (directly, "
        "or in a list or dict attribute), e.g. self.blocks = [Block(), Block()].",
        tuple(name for name in lines))


def _unwrapped(variable):
    """The variable a ParameterServerStrategy `CachingVariable` wraps (Keras lists may hold
    other wrappers of it than the object graph does); any other value itself."""
    if is_caching_type(type(variable)):
        return variable.__dict__.get("_v", variable)
    return variable


def rng_state_variables(obj) -> list:
    """The state variables of the Keras 3 `SeedGenerator`s obj's layers use."""
    out = []
    for root in _keras_roots(obj):
        for layer in keras_layers(root):
            for generator in getattr(layer, "_seed_generators", None) or ():
                variable = as_variable(getattr(generator, "state", None))
                if variable is not None:
                    out.append(variable)
    return out


def random_state_variables(obj) -> list:
    """The state variables of every random generator obj reaches: Keras 3 `SeedGenerator`s
    (its layers' and any other) and `tf.random.Generator`s. Random-generator state, not a
    weight (what export leaves out)."""
    out = rng_state_variables(obj)
    for _, _, child, first in walk(obj, skip_optimizers=True, collections=True):
        generator = type(child).__name__ == "SeedGenerator" and \
            type(child).__module__.startswith("keras")
        if first and (generator or isinstance(child, tf.random.Generator)):
            variable = as_variable(getattr(child, "state", None))
            if variable is not None:
                out.append(variable)
    return out


def _keras_roots(obj) -> list:
    if _has_keras_variables(obj):
        return [obj]
    roots = []
    with contextlib.suppress(Exception):
        roots = [c for c in _graph_view.ObjectGraphView(obj).children(obj).values()
                 if _has_keras_variables(c)]
    return roots


def _has_keras_variables(node) -> bool:
    if isinstance(node, tf.Variable):  # not probed: see _is_optimizer
        return False
    return hasattr(node, "built") and not _is_optimizer(node) and \
        hasattr(type(node), "variables")


def _owned_variables(owner, with_optimizer: bool = True) -> list:
    try:  # tf_keras raises ValueError for `variables` of an unbuilt model
        variables = list(_variable_list(owner.variables) or ())
        optimizer = getattr(owner, "optimizer", None) if with_optimizer else None
        if optimizer is not None and hasattr(optimizer, "variables"):
            variables.extend(_variable_list(optimizer.variables) or ())
    except (AttributeError, TypeError, ValueError):
        return []
    return variables


def _owning_layer(root, value):
    """The innermost Keras layer whose own weights hold `value` (or root)."""
    found = root
    for layer in keras_layers(root):
        own = []
        for attribute in ("_trainable_variables", "_non_trainable_variables",
                          "_trainable_weights", "_non_trainable_weights"):
            own.extend(getattr(layer, attribute, None) or ())
        if any(v is value for v in own):
            found = layer
    return found


def children(node) -> dict:
    """The named children of a trackable, as a checkpoint sees them."""
    try:
        return dict(_graph_view.ObjectGraphView(node).children(node))
    except Exception:  # not walkable (yet): no children
        return {}


class CollectionNode:
    """A Keras 3 list or dict attribute seen as a node: its children by index or key."""

    __slots__ = ("items",)

    def __init__(self):
        self.items: dict = {}


def children_with_collections(node) -> dict:
    """`children(node)`, plus Keras 3 collections as `CollectionNode`s (see
    `keras_collection_children`), so paths such as `blocks/0/d/_kernel` can be
    followed edge by edge. Edge names are unescaped."""
    if isinstance(node, CollectionNode):
        return dict(node.items)
    found = children(node)
    for name, child in partitioned_children(node):  # TF's graph misses them
        found.setdefault(name, child)
    for edges, child in keras_collection_children(node):
        parent = found
        for edge in edges[:-1]:
            existing = parent.get(edge)
            if existing is None:
                existing = parent[edge] = CollectionNode()
            if not isinstance(existing, CollectionNode):
                break
            parent = existing.items
        else:
            parent.setdefault(edges[-1], child)
    return found


def keras_layers(node) -> list:
    """node and every layer inside it, for a Keras layer or model of any flavour."""
    if not (hasattr(node, "built") and callable(getattr(node, "build", None))):
        return []
    flatten = getattr(node, "_flatten_layers", None)
    try:
        return list(flatten(include_self=True, recursive=True)) if flatten else [node]
    except Exception:  # a layer that cannot list its sublayers yet
        return [node]


class LiveNodes(NamedTuple):
    """What a live obj tells about the nodes of its object graph (see `live_object_graph`).

    classes: the class name of each node id. names: the name of each node that is a layer,
    module or optimizer (`layer.name`), else None. slots: (weight node id, role, slot node
    id) for each per-weight state variable a Keras 3 or tf_keras (2.11+) optimizer keeps in
    its lists (`optimizer_slot_lists`, paired by identity); TF's own slot variables are in
    the proto's `slot_variables` table instead.
    """

    classes: list
    names: list
    slots: list


def _object_name(trackable):
    """The `name` of a layer, module or optimizer; None for variables and other objects."""
    if as_variable(trackable) is not None:
        return None
    try:
        name = getattr(trackable, "name", None)
        if name is None and _is_optimizer(trackable):  # Keras 2's OptimizerV2 has no `name`
            name = getattr(trackable, "_name", None)
    except Exception:  # a property that fails on a half-built object
        return None
    return name if isinstance(name, str) and name else None


def live_object_graph(obj):
    """Returns (TrackableObjectGraph proto, `LiveNodes`) of a live obj.

    The proto is the one `tf.train.Checkpoint(root=obj)` would write, plus
    nodes for what TF's graph misses (Keras 3 lists and dicts of layers,
    `SeedGenerator` states, under the paths `variable_paths` gives them); the
    class and layer names are known only for a live obj (a checkpoint does not
    store them), and so are the weights a Keras 3 optimizer's list-held slots
    belong to. Slot variable nodes come after the objects, as TF numbers them.
    """
    view = _graph_view.ObjectGraphView(obj)
    _, proto, _ = view.serialize_object_graph()
    objects, _ = view.breadth_first_traversal()
    classes = [type(trackable).__name__ for trackable in objects]
    classes += ["?"] * (len(proto.nodes) - len(classes))
    names = [_object_name(trackable) for trackable in objects]
    names += [None] * (len(proto.nodes) - len(names))
    node_of_variable: dict = {}  # id(tf.Variable) -> its node id (first one)
    for node_id, trackable in enumerate(objects):
        variable = as_variable(trackable)
        if variable is not None:
            node_of_variable.setdefault(id(variable), node_id)
    objects_, paths = objects_and_names(view)
    reached = [(t, paths[t]) for t in objects_]
    found = [(paths[t], as_variable(t)) for t in objects_ if as_variable(t) is not None]
    extra = _collection_paths(reached, found)
    if extra:
        _add_collection_nodes(obj, proto, extra, classes, names, node_of_variable)
    variables = [found_variable for _, found_variable in found]
    variables += [variable for _, variable in extra]
    slots = []
    for variable, role, slot in optimizer_slot_lists(obj, variables):
        owner, held = node_of_variable.get(id(variable)), node_of_variable.get(id(slot))
        if owner is not None and held is not None and owner != held:
            slots.append((owner, role, held))
    return proto, LiveNodes(classes, names, slots)


def _add_collection_nodes(obj, proto, extra, classes, names, node_of_variable) -> None:
    """Adds nodes and edges for the variables only Keras 3 collections reach (`extra`)."""
    path_of = _paths.graph_paths(proto)
    node_of = {path: node_id for node_id, path in path_of.items()}
    known: dict = {}  # id(node) -> its children, each node listed once (large models)

    def children_of(node):
        if id(node) not in known:
            known[id(node)] = (node, children_with_collections(node))
        return known[id(node)][1]

    for path, _ in extra:
        node, walked = obj, []
        for edge in path.split("/"):
            walked.append(edge)
            here = "/".join(walked)
            local = _paths.unescape(edge)
            node = children_of(node).get(local) if node is not None else None
            if here in node_of:
                continue
            node_id = len(proto.nodes)
            proto.nodes.add()
            parent = node_of["/".join(walked[:-1])]
            proto.nodes[parent].children.add(node_id=node_id, local_name=local)
            node_of[here] = node_id
            collection = isinstance(node, CollectionNode)
            classes.append("list or dict" if collection else type(node).__name__)
            names.append(None if collection or node is None else _object_name(node))
            if here == path:
                variable = as_variable(node)
                node_of_variable.setdefault(id(variable), node_id)
                proto.nodes[node_id].attributes.add(
                    name=_paths.VARIABLE_VALUE, full_name=variable_name(variable),
                    checkpoint_key=_paths.checkpoint_key(path))
