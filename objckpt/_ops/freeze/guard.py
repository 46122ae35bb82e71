"""An optimizer's update that leaves frozen variables and their optimizer state alone.

`GuardedApply.apply` runs an optimizer's `apply_gradients` (or Keras 3's `apply`) so that
every variable frozen in a `FrozenMask` keeps its exact value and state, reading the mask when
the step runs (toggling never retraces). How (the `objckpt._ops.freeze` docstring has the
why): eagerly, a frozen variable and its state are read before the update and written back
after it; traced, the update runs in one of two branches on "is anything frozen", and in the
frozen one either each variable's per-variable update is skipped (`skip.SkipFrozenUpdates`)
or, where an optimizer's state or scaling spans variables, each frozen variable and its
state are read before and written back after (`_read_back`, the one guarded loop); inside
`strategy.run` without that branch (an all-reduce cannot sit in a conditional).
"""

from __future__ import annotations

import threading

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._ops.freeze.skip import LazyFlags, NotCovered, SkipFrozenUpdates

__all__ = ["FEW", "GuardedApply"]

# Up to this many variables, a traced apply inlines the plain update and, while something
# is frozen, calls one small function per variable (about 10 us each); above, one function
# call for all of them costs less than a Switch node per input. That call cannot start
# before every gradient is ready: measured on Adam steps, it added 12% to a 0.5 ms step of
# 6 variables and 9% to a 0.65 s step of 48, where the inlined update added 4% and 1%;
# with 500 small variables it was the faster one. (Tests lower it to try both layouts.)
FEW = 64


def _not_read(variables, xla: bool) -> list:
    """What the branch of a variable not frozen gives for the values the frozen branch reads:
    empty tensors; under XLA, which needs both branches' shapes equal, the values (a read is
    no copy there)."""
    if xla:
        return [_compat.read_value(v) for v in variables]
    return [tf.zeros([0], v.dtype) for v in variables]


def _on_replica(variable, replica):
    """The variable itself, or inside `strategy.run` its replica's own variable (read and
    assigned there without TF's cross-replica aggregation)."""
    if replica is None:
        return variable
    parts = _compat.replica_parts(_compat.as_variable(variable))
    return variable if parts is None else parts[replica]


def _restore(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value, read_value=False)
    return tf.no_op()


class GuardedApply:
    """Applies gradients through an optimizer, leaving a mask's frozen variables alone.

    Attributes:
      mask: the `FrozenMask`.
      traces: how many times `apply` was traced into a `tf.function`.
      hooked_traces: how many of those skip frozen variables' per-variable updates
        (Keras optimizers) rather than restoring them afterwards.
    """

    def __init__(self, mask):
        self.mask = mask
        self.traces = 0
        self.hooked_traces = 0
        self.state: dict = {}  # id(optimizer) -> mask index -> optimizer state variables
        self.replica_hooks: dict = {}  # id(optimizer) -> [hook, users, graph] in strategy.run
        self.replica_lock = threading.Lock()
        self.local = threading.local()  # per thread: inside `apply`; steps routed through it

    def routed(self) -> int:
        """How many applies with some of the mask's variables this thread has made (a
        check of `model.fit`'s train step: did it go through here?)."""
        return getattr(self.local, "routed", 0)

    def state_of(self, optimizer, indices: list[int], trained=None) -> dict:
        """Mask index -> the optimizer's state variables for it (built if needed).

        trained: the variables as the caller passes them to the optimizer (Keras
        3 optimizers know them by those objects), to build it with.
        """
        units = self.mask.units  # a sharded variable's shards: optimizers update each
        known = self.state.get(id(optimizer), {})
        missing = list(dict.fromkeys(i for i in indices if i not in known))
        if missing:
            wanted = [u for i in missing for u in units(i)]
            _compat.build_optimizer(optimizer, trained if trained is not None else wanted)
            state = _compat.optimizer_state(optimizer, wanted)
            for i in missing:
                known[i] = tuple(s for u in units(i) for s in state[id(u)])
            if any(known.values()):  # an optimizer without state may still be building
                self.state[id(optimizer)] = known
        return known

    def apply(self, optimizer, apply, grads_and_vars, *args, **kwargs):
        """`apply(pairs, *args, **kwargs)` (the optimizer's own method), guarded.

        Returns what `apply` returns eagerly and inside `strategy.run`; elsewhere inside a
        `tf.function`, the optimizer's `iterations`.
        """
        if getattr(self.local, "active", False):
            # Called again from within: `freezer.apply_gradients(opt)` of a hooked `opt`,
            # or a hooked Keras 3 `apply_gradients` calling its hooked `apply`.
            return apply(list(grads_and_vars), *args, **kwargs)
        self.local.active = True
        try:
            return self._apply(optimizer, apply, grads_and_vars, *args, **kwargs)
        finally:
            self.local.active = False

    def _apply(self, optimizer, apply, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        guarded = []  # (position in pairs, mask index)
        for position, (gradient, variable) in enumerate(pairs):
            index = self.mask.index_of(variable)
            if index is not None and gradient is not None:
                guarded.append((position, index))
        if not guarded:
            return apply(pairs, *args, **kwargs)
        self.local.routed = self.routed() + 1  # checked by fit.FitHold
        replica = _compat.replica_index()
        if replica is None:
            self._check_not_cross_replica(guarded)
        state = self.state_of(optimizer, [i for _, i in guarded],
                              [variable for _, variable in pairs])
        if tf.executing_eagerly():
            return self._apply_eagerly(apply, pairs, guarded, state, args, kwargs, replica)
        self.traces += 1
        if replica is not None:
            return self._apply_in_replica(optimizer, apply, pairs, guarded, state, args, kwargs,
                                          replica)

        def plain():
            apply(list(pairs), *args, **kwargs)

        def hooked_apply(cond):
            # Keras optimizers (Keras 3, tf_keras, Keras 2) update each variable in one
            # method call: skipping that call for frozen variables leaves them and their
            # state untouched at the cost of one conditional per variable.
            flags = self.mask.flags()
            with SkipFrozenUpdates(self.mask, optimizer, lambda i, _: flags[i], methods,
                                   cond) as hook:
                apply(list(pairs), *args, **kwargs)
            missing = {i for _, i in guarded} - hook.seen
            if missing:  # an optimizer that updates some variable another way
                raise NotCovered(sorted(missing))
            self.hooked_traces += 1

        def read_back_apply():
            self._read_back(apply, pairs, guarded, state, args, kwargs)

        # Nothing frozen (the common case): the optimizer's plain update. With a few
        # variables it is inlined in the step (a lowered conditional: one Switch node per
        # input), so TF still overlaps each variable's update with the gradients computed
        # after it, and while something is frozen each variable's update is one small
        # function call. With many, a Switch per input costs more than one function call
        # for all of them (the plain or the frozen update), which is used instead.
        # (Any of the mask's variables: one frozen but not passed here only costs the
        # frozen branch, where each passed variable is updated as its own flag says.)
        any_frozen = self.mask.any.read_value()
        few = len(guarded) <= FEW
        methods = SkipFrozenUpdates.methods(optimizer, [pairs[p][1] for p, _ in guarded])
        if methods:
            try:
                if few:
                    tf.cond(any_frozen, lambda: hooked_apply(_compat.called_cond), plain)
                else:
                    _compat.called_cond(any_frozen, lambda: hooked_apply(tf.cond), plain)
                return getattr(optimizer, "iterations", None)
            except NotCovered:
                pass  # nothing was added to this graph: the branches are built first
        (_compat.switch if few else _compat.called_cond)(any_frozen, read_back_apply, plain)
        return getattr(optimizer, "iterations", None)

    def _read_back(self, apply, pairs, guarded, state, args, kwargs, replica=None):
        """Traced: each frozen variable and its optimizer state read before `apply` and
        written back after it, its gradient zeroed (so global-norm clipping ignores it);
        inside `strategy.run` (`replica`), each replica's own copy. Returns what `apply`
        returns."""
        xla = _compat.in_xla_context()
        flags = self.mask.flags()
        guarded_pairs = list(pairs)
        backups = []
        read = set()  # a sharded variable's shards come as several pairs: read it once
        for position, index in guarded:
            gradient, variable = guarded_pairs[position]
            tensors = () if index in read else self._held(index, state, replica)
            read.add(index)
            frozen = flags[index]
            if isinstance(gradient, tf.IndexedSlices) or replica is not None:
                values = tf.cond(frozen, lambda t=tensors: [_compat.read_value(v) for v in t],
                                 lambda t=tensors: _not_read(t, xla)) if tensors else []
                if not isinstance(gradient, tf.IndexedSlices):  # in a replica: not in a cond
                    guarded_pairs[position] = (
                        tf.where(frozen, tf.zeros_like(gradient), gradient), variable)
            else:
                values, zeroed = tf.cond(
                    frozen,
                    lambda t=tensors, g=gradient: ([_compat.read_value(v) for v in t],
                                                   tf.zeros_like(g)),
                    lambda t=tensors, g=gradient: (_not_read(t, xla), g))
                guarded_pairs[position] = (zeroed, variable)
            if tensors:
                backups.append((frozen, tensors, values))
        # No explicit control edges (they would cost O(variables x update ops)): TF's
        # automatic control dependencies order ops by the variables they touch, so each
        # variable's read comes before its update and its restore after it.
        result = apply(guarded_pairs, *args, **kwargs)
        for frozen, tensors, values in backups:
            tf.cond(frozen, lambda t=tensors, x=values: _restore(t, x), tf.no_op)
        return result

    def _check_not_cross_replica(self, guarded) -> None:
        """Refuses the cross-replica context of a strategy (in its scope, outside
        `strategy.run`), where optimizers cannot apply gradients to its variables."""
        if not (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context()):
            return
        mask = self.mask
        for _, index in guarded:
            variable = mask.variables[index]
            if _compat.replica_parts(variable) is not None:
                strategy = type(tf.distribute.get_strategy()).__name__
                raise errors.DistributedVariableError(
                    f"Freezer.apply_gradients was called in the cross-replica context of "
                    f"{strategy} (inside strategy.scope(), outside strategy.run) for "
                    f"`{mask.paths[index]}` ({mask.names[index]}), a "
                    f"{type(variable).__name__}: optimizers apply gradients to a strategy's "
                    "variables in a replica context, where they all-reduce the gradients. "
                    "Fix: call it in the function you pass to strategy.run, e.g. "
                    "strategy.run(step, args=(x,)) with freezer.apply_gradients(optimizer, "
                    "zip(grads, variables)) in step.",
                    path=mask.paths[index], variable_type=type(variable).__name__)

    def _apply_in_replica(self, optimizer, apply, pairs, guarded, state, args, kwargs,
                          replica: int):
        """Traced inside `strategy.run`: the optimizer's call is not put in a conditional
        (its all-reduce and `merge_call` cannot be); each variable's update is guarded."""
        variables = [pairs[p][1] for p, _ in guarded]
        methods = () if getattr(optimizer, "weight_decay", None) else \
            SkipFrozenUpdates.methods(optimizer, variables)
        if not methods:
            return self._read_back(apply, pairs, guarded, state, args, kwargs, replica)
        with self._shared_replica_hook(optimizer, methods) as hook:
            result = apply(list(pairs), *args, **kwargs)
        missing = {i for _, i in guarded} - hook.seen
        if missing:
            paths = ", ".join(f"`{self.mask.paths[i]}`" for i in sorted(missing)[:5])
            raise errors.UnsupportedObjectError(
                f"Freezer.apply_gradients inside strategy.run: {type(optimizer).__name__} "
                f"updated {paths} without its per-variable update method, so frozen "
                "variables may have moved in this traced step. Fix: call "
                "freezer.apply_gradients outside a tf.function (eagerly) with this "
                "optimizer, or use a Keras optimizer without EMA, gradient accumulation "
                "or global clipping.")
        self.hooked_traces += 1
        return result

    def _shared_replica_hook(self, optimizer, methods):
        """One `SkipFrozenUpdates` for the calls of every replica of one traced step.

        MirroredStrategy traces each replica's function in a thread of its own, one at a
        time, into one graph, and runs the optimizer's update for all of them once, after
        the last one called it: the hooks stay installed from the first replica's call to
        the last one's return. The frozen flags are read where each update runs. Hooks
        left by a trace that failed half-way (a replica that never returned) belong to
        another graph and are replaced.
        """
        guard = self

        class Shared:
            def __enter__(self):
                graph = tf.compat.v1.get_default_graph()
                with guard.replica_lock:
                    entry = guard.replica_hooks.get(id(optimizer))
                    if entry is not None and entry[2] is not graph:
                        del guard.replica_hooks[id(optimizer)]
                        entry[0].__exit__(None, None, None)
                        entry = None
                    if entry is None:
                        hook = SkipFrozenUpdates(guard.mask, optimizer, LazyFlags(guard.mask),
                                                 methods, tf.cond)
                        hook.__enter__()
                        entry = guard.replica_hooks[id(optimizer)] = [hook, 0, graph]
                    entry[1] += 1
                    self.entry = entry
                    return entry[0]

            def __exit__(self, *exc):
                with guard.replica_lock:
                    entry = self.entry
                    entry[1] -= 1
                    if entry[1] == 0 and guard.replica_hooks.get(id(optimizer)) is entry:
                        del guard.replica_hooks[id(optimizer)]
                        entry[0].__exit__(*exc)
                return False

        return Shared()

    def _held(self, index, state, replica) -> tuple:
        """What a frozen variable keeps: the variable (a sharded one's shards, each read and
        written where it lives) and its optimizer state, or their replica's own copies."""
        return tuple(_on_replica(v, replica) for v in (*self.mask.units(index), *state[index]))

    def _apply_eagerly(self, apply, pairs, guarded, state, args, kwargs, replica=None):
        frozen = [(position, index) for position, index in guarded if self.mask.frozen[index]]
        backups, read = [], set()
        for position, index in frozen:
            if index not in read:  # once for all of a sharded variable's shards
                read.add(index)
                tensors = self._held(index, state, replica)
                backups.append((tensors, [_compat.read_value(v) for v in tensors]))
            gradient, variable = pairs[position]
            if not isinstance(gradient, tf.IndexedSlices):
                pairs[position] = (tf.zeros_like(gradient), variable)
        result = apply(pairs, *args, **kwargs)
        for tensors, values in backups:
            _restore(tensors, values)
        return result
