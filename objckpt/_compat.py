"""The one place that touches TF/Keras private APIs and flavour differences.

Everything else in objckpt talks to TensorFlow through the helpers here, so a
change in TF internals or a new Keras flavour is handled in this file alone.
"""

from __future__ import annotations

import contextlib
import sys

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import graph_view as _graph_view
from tensorflow.python.checkpoint import util as _checkpoint_util
from tensorflow.python.eager import context as _context
from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _ResourceVariable
from tensorflow.python.trackable import base as _trackable_base
from tensorflow.python.trackable import trackable_utils as _trackable_utils

from objckpt import errors

TrackableObjectGraph = trackable_object_graph_pb2.TrackableObjectGraph

# Key under which TF stores the serialized object graph in every object-based
# checkpoint, and the pieces of a checkpoint key.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
ATTRIBUTES = "/.ATTRIBUTES/"
VARIABLE_VALUE = "VARIABLE_VALUE"
OPTIMIZER_SLOT = ".OPTIMIZER_SLOT"


def unescape_local(component: str) -> str:
    """Inverse of TF's `escape_local_name`: ".." -> "." and ".S" -> "/"."""
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
    """Returns the checkpoint key TF uses for the variable at `path`."""
    return path + ATTRIBUTES + VARIABLE_VALUE


def is_trackable(obj) -> bool:
    return isinstance(obj, _trackable_base.Trackable)


def _keras3_variable_type():
    # Keras 3 variables only exist once `keras` was imported by the user, so
    # looking in sys.modules keeps objckpt from importing Keras itself.
    keras = sys.modules.get("keras")
    variable = getattr(keras, "Variable", None)
    if variable is None or not getattr(keras, "__version__", "2").startswith("3"):
        return None
    return variable


def as_variable(trackable):
    """Returns the assignable TF variable behind `trackable`, or None.

    Keras 3 `keras.Variable` objects wrap a `tf.Variable` (or a distributed
    variable under a `tf.distribute` strategy); that inner variable is the one
    to read and assign. Everything that already is a `tf.Variable` (resource,
    distributed, AutoCast) is returned as is.
    """
    if isinstance(trackable, tf.Variable):
        return trackable
    keras_variable = _keras3_variable_type()
    if keras_variable is not None and isinstance(trackable, keras_variable):
        inner = getattr(trackable, "_value", None)
        return inner if inner is not None else None
    return None


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
    objects, _, _, _, names = _checkpoint_util.objects_ids_and_slot_variables_and_paths(
        view
    )
    out = []
    for trackable in objects:
        variable = as_variable(trackable)
        if variable is not None:
            out.append((names[trackable], variable))
    out.extend(_collection_paths([(t, names[t]) for t in objects], out))
    check_complete(obj, out)
    _check_unique(obj, out)
    return out


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


def is_unbuilt(obj) -> bool:
    """True for a Keras model or layer (any flavour) that is not built yet."""
    return getattr(obj, "built", True) is False


def variable_name(variable) -> str:
    """The variable's name without the `:0` suffix (TF1 `Saver` style)."""
    name = getattr(variable, "_shared_name", None) or variable.name
    return name[:-2] if name.endswith(":0") else name


def read_value(variable):
    """Reads a variable's current value on its own device, without copying."""
    return variable.value()


def _variable_list(attr):
    # Keras exposes `variables` as a property; TF1-era optimizers as a method.
    if attr is None:
        return None
    return attr() if callable(attr) else attr


def fingerprint(obj):
    """Returns a cheap identity of obj's variables, or None if there is none.

    Used to decide whether a cached tree of obj is still current: Keras models
    and layers (every flavour) list their variables without walking the object
    graph, and their optimizer lists its own. Objects without such lists get
    None and are walked every time.
    """
    if not hasattr(obj, "built"):
        return None
    try:  # tf_keras raises ValueError for `variables` of an unbuilt model
        variables = list(_variable_list(obj.variables))
        optimizer = getattr(obj, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "variables"):
            variables.extend(_variable_list(optimizer.variables))
    except (AttributeError, TypeError, ValueError):
        return None
    return tuple(id(v) for v in variables)


class FusedOps:
    """Reads or assigns a fixed list of variables as one TF function call.

    The first call runs eagerly (no tracing cost for one-off use); from the
    second call on, one traced function does all reads or all assigns, which
    costs one dispatch instead of one per variable. `AssignVariableOp` adopts
    the value's buffer when nothing else writes to it, and TF copies on the
    next write to either side, so a fused assign costs no bytes copied.
    """

    def __init__(self, variables):
        self._variables = tuple(variables)
        self._reads = 0
        self._assigns = 0
        self._read_fn = None
        self._assign_fn = None
        self._traceable = all(v.shape.is_fully_defined() for v in self._variables)

    def _eager_loop(self, count: int) -> bool:
        return not tf.executing_eagerly() or not self._traceable or count < 2

    def read_all(self):
        self._reads += 1
        if self._eager_loop(self._reads):
            return [read_value(v) for v in self._variables]
        if self._read_fn is None:
            variables = self._variables
            self._read_fn = fused_call(lambda: read_values(variables), [])
        return self._read_fn()

    def assign_all(self, values):
        self._assigns += 1
        if self._eager_loop(self._assigns):
            for variable, value in zip(self._variables, values):
                variable.assign(value, read_value=False)
            return
        if self._assign_fn is None:
            variables = self._variables

            def assign(*xs):
                for variable, x in zip(variables, xs):
                    variable.assign(x, read_value=False)

            self._assign_fn = fused_call(assign, [tf.TensorSpec(v.shape, v.dtype)
                                                  for v in variables])
        self._assign_fn(*values)


def fused_call(body, specs):
    """Traces `body` once for `specs`; returns a fast callable running it.

    Eagerly, the concrete function is called through `_call_flat`, because
    ConcreteFunction.__call__ re-flattens and validates every argument in
    Python (about 8 us per tensor). Inside a user's `tf.function` the traced
    function is called as a nested function; it is never traced again.
    """
    function = tf.function(body, autograph=False)
    concrete = function.get_concrete_function(*specs)
    captured = concrete.captured_inputs
    call_flat = getattr(concrete, "_call_flat", None)

    def call(*args):
        if tf.executing_eagerly() and call_flat is not None:
            # These functions are flat lists of small independent ops (reads,
            # assigns, elementwise math): TF's single-threaded executor runs
            # them with less scheduling overhead than the default one (2x for
            # 500 variables); each op still uses the intra-op thread pool.
            with _single_threaded_executor():
                return call_flat(list(args), captured)
        return concrete(*args)

    call.function = function  # for tests: function.experimental_get_tracing_count()
    return call


def _single_threaded_executor():
    return _context.function_executor_type("SINGLE_THREADED_EXECUTOR")


# Below this many variable pairs the packed path gains nothing measurable.
_PACK_MIN = 32


def packed_pairs_call(kind: str, current, past):
    """An eager-only callable applying `kind` to variable pairs, or None.

    kinds: "copy" (past = current), "swap", "blend" (called with a float64
    scalar tau < 1: past = tau * current + (1 - tau) * past).

    The pairs' handles are stacked into two resource tensors once, and the
    traced function unstacks them: one function input per side instead of
    one per variable (about 10% less time for 500 pairs, where the TF
    executor's cost per node is all there is). Only for plain resource
    variables on the CPU: a stacked handle hides which variables a call
    touches, so this is never used inside a graph, where TF's automatic
    control dependencies need to see them.
    """
    variables = (*current, *past)
    if len(current) < _PACK_MIN or not all(
            type(v) is _ResourceVariable and _on_cpu(v) for v in variables):
        return None
    count = len(current)
    with tf.init_scope():
        handles = (tf.stack([v.handle for v in current]), tf.stack([v.handle for v in past]))
    dtypes = [v.dtype for v in current]
    spec = tf.TensorSpec([count], tf.resource)

    def read(handle, dtype):
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)

    def body(current_handles, past_handles, *tau):
        pairs = zip(tf.unstack(current_handles, count), tf.unstack(past_handles, count), dtypes)
        if kind == "copy":
            for c, p, dtype in pairs:
                tf.raw_ops.AssignVariableOp(resource=p, value=read(c, dtype))
        elif kind == "swap":
            pairs = list(pairs)
            values = [(read(c, d), read(p, d)) for c, p, d in pairs]
            for (c, p, _), (cv, pv) in zip(pairs, values):
                tf.raw_ops.AssignVariableOp(resource=c, value=pv)
                tf.raw_ops.AssignVariableOp(resource=p, value=cv)
        else:
            coefficients = {}
            for c, p, dtype in pairs:
                value = read(c, dtype)
                if not (dtype.is_floating or dtype.is_complex):
                    tf.raw_ops.AssignVariableOp(resource=p, value=value)
                    continue
                if dtype not in coefficients:
                    coefficients[dtype] = polyak_coefficients(tau[0], dtype)
                polyak_apply(p, dtype, value, coefficients[dtype])

    specs = [spec, spec] + ([tf.TensorSpec((), tf.float64)] if kind == "blend" else [])
    concrete = tf.function(body, autograph=False).get_concrete_function(*specs)
    call_flat = concrete._call_flat

    def call(*tau):
        with _single_threaded_executor():
            call_flat([*handles, *tau], concrete.captured_inputs)

    return call


def called_cond(pred, true_fn, false_fn):
    """`tf.cond` (in a graph) whose branches run as function calls.

    TF lowers a `tf.cond` in a `tf.function` to Switch/Merge nodes, and the
    executor then walks every node of the branch not taken as dead: a cost
    per node of the large branch even when it never runs. Marked not to be
    lowered, the `If` op calls only the branch taken.
    """
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    result = tf.cond(pred, true_fn, false_fn)
    for op in graph.get_operations()[before:]:
        if op.type in ("If", "StatelessIf"):
            op._set_attr("_lower_using_switch_merge", _attr_value_pb2.AttrValue(b=False))
    return result


def switch(pred, rare_fn, common_fn) -> None:
    """`tf.cond(pred, rare_fn, common_fn)` in a graph, cheap while `pred` is false.

    The common branch is inlined (TF lowers a `tf.cond` in a `tf.function` to
    Switch/Merge nodes; its ops run like the others, each as soon as its
    inputs are ready). The rare one, however large, is one function call
    (`called_cond`), the lowered conditional's whole other branch: the
    executor walks the branch not taken node by node, so it costs one node
    while it is not taken. Both functions return None.
    """
    tf.cond(pred, lambda: called_cond(pred, rare_fn, lambda: None), common_fn)


def read_values(variables) -> list:
    """Reads many variables, each on its own device, without copying.

    (A single `_ReadVariablesOp` for all of them was measured no faster
    inside a fused function: the executor's cost is per output edge too.)
    """
    return [read_value(v) for v in variables]


def polyak_coefficients(tau, dtype):
    """The constants `polyak_update` needs for one dtype, from a float64 scalar tau < 1."""
    proximal = None
    if dtype in (tf.float32, tf.float64):
        proximal = (tf.cast(-tau / (1.0 - tau), dtype), tf.zeros((), dtype),
                    tf.constant(-1.0, dtype))
    return tf.cast(tau, dtype), proximal


def polyak_update(current_value, past, coefficients) -> None:
    """Emits the Polyak blend `past = tau * current + (1 - tau) * past` in place.

    For a plain float32/float64 resource variable on the CPU it is one
    `ResourceApplyProximalGradientDescent`, which with l1=0 computes
    `var = (var - alpha * delta) / (1 + alpha * l2)`: with delta=current,
    alpha=-tau/(1-tau) and l2=-1 that is the blend for tau < 1, with no read
    of past and no temporary (half the ops and a third less memory traffic).
    Other variables get `past -= tau * (past - current)`, as
    `ResourceApplyGradientDescent` or, for distributed or AutoCast variables,
    their own `assign_sub`.
    """
    tau = coefficients[0]
    if type(past) is _ResourceVariable:
        polyak_apply(past.handle, past.dtype, current_value,
                     coefficients if _on_cpu(past) else (tau, None))
    else:
        past.assign_sub(tau * (read_value(past) - current_value), read_value=False)


def polyak_apply(handle, dtype, current_value, coefficients) -> None:
    """`polyak_update` of a plain resource variable given by its handle.

    The proximal form (coefficients from `polyak_coefficients`) only on the CPU.
    """
    tau, proximal = coefficients
    if proximal is not None:
        alpha, l1, l2 = proximal
        tf.raw_ops.ResourceApplyProximalGradientDescent(
            var=handle, alpha=alpha, l1=l1, l2=l2, delta=current_value)
    else:
        delta = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype) - current_value
        tf.raw_ops.ResourceApplyGradientDescent(var=handle, alpha=tau, delta=delta)


def _on_cpu(variable) -> bool:
    device = variable.handle.device
    return not device or tf.DeviceSpec.from_string(device).device_type == "CPU"


def keras_callback_base(model):
    """The `Callback` base class of the Keras flavour `model` belongs to."""
    import importlib

    for cls in type(model).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root in ("keras", "tf_keras"):
            return importlib.import_module(root).callbacks.Callback
    return None


def network_variable_paths(obj) -> list[tuple[str, object]]:
    """Like `variable_paths`, but never walks into an optimizer.

    A breadth-first walk in TF's order that skips every child with an
    `apply_gradients` method (TF1, Keras 2, tf_keras and Keras 3 optimizers):
    the paths are those of the network alone, the same whether or not a model
    is compiled (TF's canonical path of a variable can otherwise run through
    the optimizer's list of the variables it trains). Keras 3 collections
    follow as in `variable_paths`.
    """
    view = _graph_view.ObjectGraphView(obj)
    seen = {id(obj)}
    queue = [(obj, "")]
    out = []
    for node, path in queue:  # grows while iterating: a breadth-first walk
        for name, child in view.children(node).items():
            if id(child) in seen or _is_optimizer(child):
                continue
            seen.add(id(child))
            local = _trackable_utils.escape_local_name(name)
            child_path = f"{path}/{local}" if path else local
            variable = as_variable(child)
            if variable is not None:
                out.append((child_path, variable))
            queue.append((child, child_path))
    out.extend(_collection_paths(queue, out, skip_optimizers=True))
    check_complete(obj, out, optimizer=False)
    return out


def variable_edges(obj) -> list[tuple[str, object]]:
    """(path, variable) for every edge of TF's object graph that ends at a variable.

    Objects are walked once (breadth-first, TF's canonical paths); a variable
    with edges from several objects (a Keras 3 optimizer's `_trainable_variables`
    and its layer) is listed once per edge.
    """
    view = _graph_view.ObjectGraphView(obj)
    seen = {id(obj)}
    queue = [(obj, "")]
    out = []
    for node, path in queue:  # grows while iterating: a breadth-first walk
        for name, child in view.children(node).items():
            local = _trackable_utils.escape_local_name(name)
            child_path = f"{path}/{local}" if path else local
            variable = as_variable(child)
            if variable is not None:
                out.append((child_path, variable))
            elif id(child) not in seen:
                seen.add(id(child))
                queue.append((child, child_path))
    return out


def variable_holders(obj) -> dict:
    """id(variable) -> class name of the object holding it directly (optimizers skipped)."""
    out: dict = {}
    seen = {id(obj)}
    queue = [obj]
    for node in queue:  # grows while iterating: a breadth-first walk
        found = list(children(node).values())
        found += [child for _, child in keras_collection_children(node)]
        for child in found:
            variable = as_variable(child)
            if variable is not None:
                out.setdefault(id(variable), type(node).__name__)
            elif id(child) not in seen and not _is_optimizer(child):
                seen.add(id(child))
                queue.append(child)
    return out


def _is_optimizer(node) -> bool:
    return callable(getattr(node, "apply_gradients", None))


# --- Keras 3 collections TF's object graph does not see ---------------------------

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


def _keras3_variable(value) -> bool:
    variable = _keras3_variable_type()
    return variable is not None and isinstance(value, variable)


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
    have = {id(variable) for _, variable in found}
    missing = []
    for owner in _keras_roots(obj):
        if is_unbuilt(owner):  # its layers may exist before it does: unbuilt, not untracked
            continue
        for value in _owned_variables(owner, optimizer):
            variable = as_variable(value)
            if variable is not None and id(variable) not in have:
                missing.append((owner, value))
                have.add(id(variable))
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


def _keras_roots(obj) -> list:
    if _has_keras_variables(obj):
        return [obj]
    roots = []
    with contextlib.suppress(Exception):
        roots = [c for c in _graph_view.ObjectGraphView(obj).children(obj).values()
                 if _has_keras_variables(c)]
    return roots


def _has_keras_variables(node) -> bool:
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


def _optimizers(obj) -> list:
    """obj itself, its `optimizer`, and its direct children that are optimizers."""
    found = []
    candidates = [obj, getattr(obj, "optimizer", None)]
    # An object TF cannot list the children of: just obj and its .optimizer.
    with contextlib.suppress(Exception):
        for child in _graph_view.ObjectGraphView(obj).children(obj).values():
            # tf.train.Checkpoint(model=m): m's optimizer too
            candidates.extend((child, getattr(child, "optimizer", None)))
    for candidate in list(candidates):  # what a wrapper (LossScaleOptimizer) wraps
        inner = getattr(candidate, "inner_optimizer", None)
        if inner is not None:
            candidates.append(inner)
    for candidate in candidates:
        if callable(getattr(candidate, "apply_gradients", None)) and \
                all(candidate is not f for f in found):
            found.append(candidate)
    return found


# Lists a Keras 3 / tf_keras (2.11+) optimizer keeps per trained variable, by
# role: "m" first moment or momentum buffer, "v" second moment.
_SLOT_LISTS = (("_momentums", "m"), ("momentums", "m"), ("_velocities", "v"),
               ("_velocity_hats", "vhat"), ("_average_gradients", "mg"),
               ("_accumulators", "accumulator"), ("_linears", "linear"),
               ("_accumulated_gradients", "gradient_accumulator"), ("_m", "m"), ("_u", "norm"),
               ("_accumulated_grads", "accum_grad"),
               ("_accumulated_delta_vars", "accum_delta"))


def optimizer_slot_lists(obj, candidates=()):
    """Yields (model variable, role, optimizer variable) for list-based optimizers.

    Keras 3 and tf_keras 2.11+ optimizers keep their per-variable state in
    lists aligned with the variables they train (not as TF slot variables);
    this pairs them up. `candidates` are obj's variables, for optimizers that
    index by variable key (tf_keras) rather than keep the list (Keras 3).
    Optimizers with TF slot variables yield nothing (their slots already
    appear as `.OPTIMIZER_SLOT` paths).
    """
    for optimizer in _optimizers(obj):
        trained = getattr(optimizer, "_trainable_variables", None)
        index_dict = getattr(optimizer, "_index_dict", None)
        var_key = getattr(optimizer, "_var_key", None)
        if trained:
            pairs = [(i, as_variable(v)) for i, v in enumerate(trained)]
        elif isinstance(index_dict, dict) and callable(var_key):
            pairs = []
            for variable in candidates:
                with contextlib.suppress(Exception):
                    key = var_key(variable)
                    if key in index_dict:
                        pairs.append((index_dict[key], variable))
        else:
            continue
        for attribute, role in _SLOT_LISTS:
            values = getattr(optimizer, attribute, None)
            if not isinstance(values, (list, tuple)) or not values:
                continue
            for index, variable in pairs:
                slot = as_variable(values[index]) if index < len(values) else None
                if variable is not None and slot is not None:
                    yield variable, role, slot


def optimizer_counters(obj):
    """Yields ("iterations" | "learning_rate", variable) of obj's optimizers."""
    for optimizer in _optimizers(obj):
        for name, attributes in (("iterations", ("_iterations", "iterations")),
                                 ("learning_rate", ("_learning_rate",))):
            for attribute in attributes:
                try:
                    value = as_variable(getattr(optimizer, attribute, None))
                except Exception:  # a property that fails before the optimizer is built
                    value = None
                if value is not None:
                    yield name, value
                    break
        hyper = getattr(optimizer, "_hyper", None)  # Keras 2 / tf_keras OptimizerV2
        if isinstance(hyper, dict):
            for name, value in hyper.items():
                if as_variable(value) is not None:
                    yield name, as_variable(value)


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


class _OnAttach:
    """Duck-types TF's CheckpointPosition in `_deferred_dependencies`.

    TF calls `restore(trackable)` when a child is attached under the awaited
    name (`Trackable._handle_deferred_dependencies`); Keras 2's `add_weight`
    asks `is_simple_variable()` first and, on False, creates the variable
    normally and then attaches it.
    """

    class _Checkpoint:
        restore_uid = -1

    checkpoint = _Checkpoint()

    def __init__(self, callback):
        self._callback = callback

    def is_simple_variable(self) -> bool:
        return False

    def restore(self, trackable, *args, **kwargs):
        self._callback(trackable)
        return []


def defer_on_attach(node, name: str, callback) -> bool:
    """Calls `callback(child)` when a child named `name` is attached to node."""
    initialize = getattr(node, "_maybe_initialize_trackable", None)
    if initialize is None:
        return False
    initialize()
    deferred = getattr(node, "_deferred_dependencies", None)
    if not isinstance(deferred, dict):
        return False
    deferred.setdefault(name, []).append(_OnAttach(callback))
    return True


def keras_layers(node) -> list:
    """node and every layer inside it, for a Keras layer or model of any flavour."""
    if not (hasattr(node, "built") and callable(getattr(node, "build", None))):
        return []
    flatten = getattr(node, "_flatten_layers", None)
    try:
        return list(flatten(include_self=True, recursive=True)) if flatten else [node]
    except Exception:  # a layer that cannot list its sublayers yet
        return [node]


def parse_checkpoint_state(data: bytes):
    """Parses the text of a TF `checkpoint` state file into its proto."""
    from google.protobuf import text_format
    from tensorflow.python.training import checkpoint_state_pb2

    state = checkpoint_state_pb2.CheckpointState()
    text_format.Merge(data.decode("utf-8"), state)
    return state


def optional(path, name):
    """Returns `name` from module `path`, or None where this version lacks it."""
    import importlib

    try:
        return getattr(importlib.import_module(path), name)
    except (ImportError, AttributeError):
        return None


def clone_types():
    """TF types `objckpt.clone` copies specially, looked up where each TF keeps them.

    Any of them may be None in a TF version that lacks it.
    """
    import types as _types

    ns = _types.SimpleNamespace()
    ns.BaseResourceVariable = optional(
        "tensorflow.python.ops.resource_variable_ops", "BaseResourceVariable")
    ns.ResourceVariable = optional(
        "tensorflow.python.ops.resource_variable_ops", "ResourceVariable") or tf.Variable
    ns.UninitializedVariable = optional(
        "tensorflow.python.ops.resource_variable_ops", "UninitializedVariable")
    ns.DistributedValues = optional("tensorflow.python.distribute.values", "DistributedValues")
    ns.EagerTensor = type(tf.constant(0))
    ns.SymbolicTensor = optional("tensorflow.python.framework.ops", "SymbolicTensor") or tf.Tensor
    ns.TypeSpec = tf.TypeSpec
    ns.Dimension = optional("tensorflow.python.framework.tensor_shape", "Dimension")
    ns.Function = type(tf.function(lambda: None))
    ns.StrategyBase = optional("tensorflow.python.distribute.distribute_lib", "StrategyBase")
    ns.StrategyExtended = optional("tensorflow.python.distribute.distribute_lib",
                                "StrategyExtendedV1")
    ns.ReplicaContext = optional("tensorflow.python.distribute.distribute_lib", "ReplicaContext")
    ns.EagerContext = optional("tensorflow.python.eager.context", "Context")
    ns.Graph = tf.Graph
    ns.Operation = tf.Operation
    ns.PythonAPIDispatcher = optional("tensorflow.python.framework._pywrap_python_api_dispatcher",
        "PythonAPIDispatcher")
    ns.ConcreteFunctionBase = optional("tensorflow.python.types.core", "ConcreteFunction")
    ns.AtomicFunction = optional("tensorflow.python.eager.polymorphic_function.atomic_function",
        "AtomicFunction")
    return ns


# --- per-variable optimizer state (Freezer) --------------------------------------

# Lists on Keras optimizers that hold variables but are not per-variable state.
_NOT_STATE_LISTS = frozenset({"_variables", "_trainable_variables", "variables",
                              "_all_variables", "_non_trainable_variables"})


def _inner_optimizers(optimizer) -> list:
    """The optimizer and those it wraps (a LossScaleOptimizer's inner optimizer)."""
    found, node = [], optimizer
    while node is not None and all(node is not f for f in found):
        found.append(node)
        node = getattr(node, "inner_optimizer", None)
    return found


def build_optimizer(optimizer, variables) -> None:
    """Creates an optimizer's per-variable state for `variables` if it has none yet.

    Keras optimizers build lazily on their first `apply_gradients`; the Freezer
    needs the state to exist before then, so it builds them the same way (in
    the init scope, so this works while a `tf.function` is being traced).
    """
    for inner in reversed(_inner_optimizers(optimizer)):
        with tf.init_scope():
            if isinstance(getattr(inner, "built", None), bool):  # Keras 3
                if not inner.built:
                    inner.build(list(variables))
                    inner.built = True
            elif callable(getattr(inner, "_create_all_weights", None)):
                inner._create_all_weights(list(variables))  # legacy OptimizerV2 (Keras 2)
            elif callable(getattr(inner, "_create_slots", None)) and \
                    callable(getattr(inner, "get_slot_names", None)):
                inner._create_slots(list(variables))  # TF1 tf.compat.v1.train optimizers
            elif callable(getattr(inner, "_var_key", None)) and \
                    callable(getattr(inner, "build", None)) and not getattr(inner, "_built", False):
                inner.build(list(variables))  # tf_keras and Keras 2 (2.11+ optimizers)


def optimizer_state(optimizer, variables) -> dict:
    """id(variable) -> the optimizer variables that hold state for it.

    Keras 3, tf_keras and Keras 2 (2.11+) optimizers keep their state in
    lists aligned with the variables they train (momentums, velocities, EMA
    copies, gradient accumulators, ...); every such list is found, not only
    known names. Legacy OptimizerV2 and TF1 optimizers keep TF slot variables.
    """
    state: dict = {id(v): [] for v in variables}
    for inner in _inner_optimizers(optimizer):
        indexed = _variable_index(inner, variables)
        if indexed is not None:
            index_of, count = indexed
            for name, value in vars(inner).items():
                if name in _NOT_STATE_LISTS or not isinstance(value, (list, tuple)) \
                        or len(value) != count or not value:
                    continue
                slots = [as_variable(v) if v is not None else None for v in value]
                if any(s is None and v is not None for s, v in zip(slots, value)) or \
                        all(s is None for s in slots):
                    continue
                for index, variable_id in index_of.items():
                    slot = slots[index]
                    if slot is not None and id(slot) != variable_id:
                        state[variable_id].append(slot)
            continue
        names = getattr(inner, "get_slot_names", None)
        if not callable(names):
            continue
        for variable in variables:
            for slot_name in names():
                with contextlib.suppress(KeyError, ValueError, AttributeError):
                    slot = inner.get_slot(variable, slot_name)
                    if as_variable(slot) is not None:
                        state[id(variable)].append(as_variable(slot))
    return state


def _variable_index(optimizer, variables):
    """({index in the state lists: id(variable)}, list length), or None (slot-based)."""
    trained = getattr(optimizer, "_trainable_variables", None)
    if isinstance(trained, (list, tuple)) and trained:  # Keras 3
        wanted = {id(v) for v in variables}
        return {i: id(as_variable(t)) for i, t in enumerate(trained)
                if as_variable(t) is not None and id(as_variable(t)) in wanted}, len(trained)
    index_dict = getattr(optimizer, "_index_dict", None)
    var_key = getattr(optimizer, "_var_key", None)
    if isinstance(index_dict, dict) and index_dict and callable(var_key):  # tf_keras, Keras 2
        out = {}
        for variable in variables:
            with contextlib.suppress(Exception):
                key = var_key(variable)
                if key in index_dict:
                    out[index_dict[key]] = id(variable)
        return out, len(index_dict)
    return None


def live_object_graph(obj):
    """Returns (TrackableObjectGraph proto, class name per node id) of a live obj.

    The proto is the one `tf.train.Checkpoint(root=obj)` would write, plus
    nodes for what TF's graph misses (Keras 3 lists and dicts of layers,
    `SeedGenerator` states, under the paths `variable_paths` gives them); the
    class names are known only for a live obj (a checkpoint does not store
    them). Slot variable nodes come after the objects, as TF numbers them.
    """
    view = _graph_view.ObjectGraphView(obj)
    _, proto, _ = view.serialize_object_graph()
    objects, _ = view.breadth_first_traversal()
    classes = [type(trackable).__name__ for trackable in objects]
    classes += ["?"] * (len(proto.nodes) - len(classes))
    objects_, _, _, _, names = _checkpoint_util.objects_ids_and_slot_variables_and_paths(view)
    reached = [(t, names[t]) for t in objects_]
    found = [(names[t], as_variable(t)) for t in objects_ if as_variable(t) is not None]
    extra = _collection_paths(reached, found)
    if not extra:
        return proto, classes
    node_of, path_of = {"": 0}, {0: ""}
    order = [0]
    for current in order:  # the proto's canonical paths, breadth-first
        for child in proto.nodes[current].children:
            if child.node_id in path_of:
                continue
            local = _trackable_utils.escape_local_name(child.local_name)
            path = f"{path_of[current]}/{local}" if path_of[current] else local
            node_of[path], path_of[child.node_id] = child.node_id, path
            order.append(child.node_id)
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
            local = unescape_local(edge)
            node = children_of(node).get(local) if node is not None else None
            if here in node_of:
                continue
            node_id = len(proto.nodes)
            proto.nodes.add()
            parent = node_of["/".join(walked[:-1])]
            proto.nodes[parent].children.add(node_id=node_id, local_name=local)
            node_of[here] = node_id
            classes.append("list or dict" if isinstance(node, CollectionNode)
                           else type(node).__name__)
            if here == path:
                proto.nodes[node_id].attributes.add(
                    name=VARIABLE_VALUE, full_name=variable_name(as_variable(node)),
                    checkpoint_key=checkpoint_key(path))
    return proto, classes


# --- resuming model.fit (callbacks.Checkpointing) ---------------------------------


class _StartEpoch:
    """tf_keras / Keras 2 `model._training_state`: fit asks it where to start."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return max(self.epoch, initial_epoch), 0


def set_fit_start_epoch(model, epoch) -> None:
    """Makes the `fit` now in `on_train_begin` start at `epoch`; None undoes it.

    Keras 3 reads `model._initial_epoch` after `on_train_begin`; tf_keras and
    Keras 2 ask `model._training_state` (the hook of their BackupAndRestore).
    """
    if "_training_state" in vars(model):  # tf_keras, Keras 2
        model._training_state = None if epoch is None else _StartEpoch(int(epoch))
    else:  # Keras 3
        model._initial_epoch = None if epoch is None else int(epoch)


def steps_per_execution(model) -> int:
    value = getattr(model, "_steps_per_execution", None)  # tf_keras, Keras 2: a variable
    if value is not None and hasattr(value, "numpy"):
        return int(value.numpy())
    return int(getattr(model, "steps_per_execution", 1) or 1)


def skip_fit_batches(model, calls: int) -> None:
    """Makes the next `calls` calls of `model.train_function` consume data, not train.

    Resuming mid-epoch: fit starts the epoch from its first batch, so the
    batches the checkpoint already trained on are drawn and dropped. Keras 3
    hands the train function the batches it drew; tf_keras and Keras 2 hand it
    the iterator to draw them from. Each skipped call returns empty logs.
    """
    original = model.train_function
    remaining = [int(calls)]
    spe = steps_per_execution(model)

    def train_function(iterator):
        if remaining[0] <= 0:
            model.train_function = original
            return original(iterator)
        remaining[0] -= 1
        if not isinstance(iterator, (list, tuple)):
            for _ in range(spe):
                next(iterator)
        if remaining[0] <= 0:
            model.train_function = original
        return {}

    if calls > 0:
        train_function.objckpt_original = original
        model.train_function = train_function


def unskip_fit_batches(model) -> None:
    """Removes a `skip_fit_batches` wrapper still in place (a fit that raised early)."""
    original = getattr(getattr(model, "train_function", None), "objckpt_original", None)
    if original is not None:
        model.train_function = original
