"""Fused kernels: grouped assigns in one traced call, packed Polyak updates, cond lowering,
and the per-replica variables fused calls work on under tf.distribute."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.python.eager import context as _context
from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _ResourceVariable

from objckpt._compat.distribute import autocast_inner
from objckpt._compat.partitioned import assign_whole
from objckpt._compat.variables import _on_cpu, lookup, read_value

__all__ = ["FusedOps", "called_cond", "fused_call", "local_replica_count", "packed_pairs_call",
           "polyak_apply", "polyak_coefficients", "polyak_update", "read_values",
           "replica_index", "replica_parts", "switch"]


# --- tf.distribute: fused calls work on each replica's own variable --------------------
#
# A MirroredVariable is one plain resource variable per replica (each on its device), kept
# equal by TF; a SyncOnReadVariable's replicas hold values of their own. An exact copy,
# swap or Polyak blend of two such variables is the same operation on each pair of
# replicas: no collective, no cross-device copy, and in a replica context (inside
# `strategy.run`) each replica touches its own pair, where TF refuses `assign` on a
# MirroredVariable (and would reduce a SyncOnRead read across replicas).

_REPLICATED = None


def _replicated_types():
    global _REPLICATED
    if _REPLICATED is None:
        values = "tensorflow.python.distribute.values"
        _REPLICATED = (lookup(values, "MirroredVariable"), lookup(values, "SyncOnReadVariable"))
    return _REPLICATED


def replica_parts(variable):
    """The per-replica variables of a MirroredVariable or SyncOnReadVariable (a Keras
    `AutoCastVariable` around one is looked through), in replica order on this worker; None
    for any other variable (plain, or a distributed kind with no per-replica variables)."""
    inner = autocast_inner(variable)
    if inner is not None:
        variable = inner
    if not isinstance(variable, _replicated_types()):
        return None
    if getattr(variable, "_packed_var", None) is not None:
        return None  # TPU-style packed variables: one handle for all replicas
    return tuple(variable.values)


_REPLICA_ID = None


def replica_index():
    """The replica (on this worker) whose `strategy.run` function is running, as an index
    into `replica_parts`; None in a cross-replica context and outside any strategy."""
    global _REPLICA_ID
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    if _REPLICA_ID is None:
        _REPLICA_ID = lookup("tensorflow.python.distribute.values_util",
                             "get_current_replica_id_as_int")
    return _REPLICA_ID()


def local_replica_count() -> int:
    """How many replicas of the current strategy run in this process (1 outside any)."""
    return len(tf.distribute.get_strategy().extended.worker_devices)


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
                assign_whole(variable, value)
            return
        if self._assign_fn is None:
            variables = self._variables

            def assign(*xs):
                for variable, x in zip(variables, xs):
                    assign_whole(variable, x)

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

    The pairs' handles are stacked into two resource tensors once per device,
    and the traced function unstacks them: one function input per side and
    device instead of one per variable (about 10% less time for 500 pairs,
    where the TF executor's cost per node is all there is). Only for plain
    resource variables on CPUs, each pair on one device (the replicas of
    distributed variables are such pairs): a stacked handle hides which
    variables a call touches, so this is never used inside a graph, where
    TF's automatic control dependencies need to see them.
    """
    variables = (*current, *past)
    if len(current) < _PACK_MIN or not all(
            type(v) is _ResourceVariable and _on_cpu(v) for v in variables):
        return None
    groups: dict = {}  # device -> [(current, past, dtype)]
    for c, p in zip(current, past):
        if c.handle.device != p.handle.device:
            return None
        groups.setdefault(c.handle.device, []).append((c, p, c.dtype))
    handles = []
    with tf.init_scope():
        for device, pairs in groups.items():
            with tf.device(device):
                handles.append(tf.stack([c.handle for c, _, _ in pairs]))
                handles.append(tf.stack([p.handle for _, p, _ in pairs]))
    layout = [(device, [d for _, _, d in pairs]) for device, pairs in groups.items()]
    specs = [tf.TensorSpec([len(dtypes)], tf.resource)
             for _, dtypes in layout for _ in range(2)]

    def read(handle, dtype):
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)

    handle_count = len(specs)

    def body(*args):
        tau = args[handle_count:]
        for group, (device, dtypes) in enumerate(layout):
            with tf.device(device):
                pairs = zip(tf.unstack(args[2 * group], len(dtypes)),
                            tf.unstack(args[2 * group + 1], len(dtypes)), dtypes)
                _packed_body(kind, pairs, tau, read)

    if kind == "blend":
        specs.append(tf.TensorSpec((), tf.float64))
    concrete = tf.function(body, autograph=False).get_concrete_function(*specs)
    call_flat = concrete._call_flat

    def call(*tau):
        with _single_threaded_executor():
            call_flat([*handles, *tau], concrete.captured_inputs)

    return call


def _packed_body(kind, pairs, tau, read) -> None:
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
