"""Past/current twins: a copy of a network kept one update behind.

`Twins(model)` pairs the model (`current`) with an independent structural
copy (`past`), matched by object path. `sync()` copies current into past (a
hard copy, or a Polyak blend with `tau`) and `swap()` exchanges them, each as
one fused TF call: no NumPy round trip, no files, no retracing.

Under tf.distribute (MirroredStrategy, MultiWorkerMirroredStrategy) current and
past are built under one strategy, and each of their MirroredVariable and
SyncOnRead variables is one plain variable per replica. Every operation works
on each replica's pair on its own device: outside `strategy.run` (a
cross-replica context) one call covers every replica of this worker; inside it,
each replica's function covers its own pair, so the replicas together do it
exactly once. No value crosses devices or workers and nothing is reduced:
after `sync()` every replica of past is bit-identical to the same replica of
current, and a SyncOnRead variable (tf_keras BatchNorm statistics) keeps its
per-replica values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import api as _api
from objckpt._ops import clone as _clone

__all__ = ["Twins"]


def _patterns(value, name: str) -> tuple[re.Pattern, ...]:
    if value is None:
        return ()
    received = value
    if isinstance(value, str):
        value = (value,)
    try:
        return tuple(re.compile(p) for p in value)
    except (TypeError, re.error) as err:
        raise errors.InvalidArgumentError(
            f"{name}= takes regular expressions matched (re.search) against object paths. "
            f"Received: {name}={received!r} ({err}). Fix: pass valid regular expressions, e.g. "
            f"{name}=['^encoder/', 'kernel$'].",
        ) from err


def _network_variables(obj) -> dict:
    """Object path -> variable for obj's own variables: no optimizer state."""
    if not _compat.is_trackable(obj):
        raise errors.UnsupportedObjectError(
            f"Twins needs a trackable model (Keras model of any flavour, tf.Module). "
            f"Received: {type(obj).__name__}. Fix: pass a Keras model or a "
            "tf.Module (and past= one of the same architecture).")
    return dict(_compat.network_variable_paths(obj))


def check_tau(tau) -> None:
    if isinstance(tau, (int, float)) and not 0.0 <= tau <= 1.0:
        raise errors.InvalidArgumentError(
            f"tau is the weight of current in past = tau*current + (1-tau)*past and must lie "
            f"in [0, 1]. Received: tau={tau!r}. Fix: pass tau=1.0 for a hard copy, or e.g. "
            "tau=0.005 for a slowly moving target network.")


class Twins:
    """A model (`current`) and an independent copy of it kept behind (`past`).

    Args:
      obj: the model being trained: a Keras model of any flavour or a
        `tf.Module`. Its own variables (trainable and not, e.g. BatchNorm
        moving statistics) are twinned; optimizer state is not. (`model=` is its
        old name, accepted until objckpt 0.2 with a `DeprecationWarning`.)
      past: keyword-only: an obj with the same structure to use as the past copy,
        e.g. `factory()` where the code that built `obj` is at hand. When None, a
        structural clone of `obj` is made with `objckpt.clone`.

    Raises:
      StructureMismatchError: `past` differs from `model` (paths, shapes,
        dtypes) or shares variables with it.

    Attributes:
      current: the model passed in, the very object (not a copy): keep training it.
      past: the copy kept behind: `past` when given, else the clone made of
        `model`. Call it like the model (`twins.past(x)`). `sync()` and
        `swap()` change the values of their variables, never which objects
        `current` and `past` are.
      paths: the object paths twinned, in tree order.

    Example:
      >>> twins = objckpt.Twins(model)
      >>> for x, y in data:
      ...     old, new = twins.past(x), twins.current(x)
      ...     train_step(x, y)
      ...     twins.sync()           # or twins.sync(tau=0.005): Polyak update
    """

    @_api.renamed("model", "obj", name="objckpt.Twins")
    @errors.about_arguments(obj="obj")
    def __init__(self, obj, *, past=None):
        """Pairs `obj` with `past`, or with a structural clone of it.

        The past copy starts with the values `past` has (a clone starts equal to
        `obj`); call `sync()` to make it equal when you pass your own.

        Args:
          obj: the model being trained (a built Keras model of any flavour, or a
            `tf.Module`); becomes `current`.
          past: an obj of the same structure with its own variables, or None to
            clone `model` (`objckpt.clone(model)`, values copied).

        Raises:
          UnbuiltModelError: `model` has no variables yet (build it first).
          UnsupportedObjectError: `model` or `past` is not trackable.
          StructureMismatchError: `past` differs from `model` in object paths,
            shapes or dtypes, or shares a variable with it (every problem listed).
          CloneError: with past=None, something in `model` cannot be cloned
            (the message names its attribute path); pass `past` built by your
            own code instead.
        """
        model = obj
        if past is None:
            past = _clone.clone(model)
        self.current = model
        self.past = past
        current_vars = _network_variables(model)
        past_vars = _network_variables(past)
        _check_same_structure(model, current_vars, past_vars)
        self._paths = tuple(current_vars)
        self._current = tuple(current_vars.values())
        self._past = tuple(past_vars[p] for p in self._paths)
        # Per pair: (current's replicas, past's replicas), or None for plain variables.
        self._replicas = tuple(_replica_pairs(self._current, self._past))
        self._fns: dict = {}
        self._selections: dict = {}
        # Layers computing from tensors cached from their variables (an adapted
        # Normalization): refreshed after each write, as Keras's loaders do. Most models
        # have none, and then a write pays one truth test. Each one's variables (positions
        # in the pairs) are found here, once: a write then costs a lookup per selection.
        # LoRA factors move with their kernels here: never zeroed.
        self._derived = tuple(
            _compat.owned_positions(
                [h for h in _compat.derived_hooks(side) if h.action != "lora"], variables)
            for side, variables in ((model, self._current), (past, self._past)))
        self._refreshes: dict = {}  # (side, id(chosen)) -> (chosen, the hooks it refreshes)

    @property
    def paths(self) -> tuple[str, ...]:
        """The object paths twinned (the network's, optimizers left out), in tree order."""
        return self._paths

    def variables(self) -> dict[str, tuple]:
        """Object path -> (current variable, past variable) for every twinned pair."""
        return {p: (c, q) for p, c, q in zip(self._paths, self._current, self._past)}

    def __repr__(self) -> str:
        return f"Twins({len(self._paths)} variables, current={type(self.current).__name__})"

    def _select(self, include, exclude) -> tuple[int, ...]:
        try:  # patterns as given are the cache key: sync() stays cheap per call
            key = (include if include is None or isinstance(include, str) else tuple(include),
                   exclude if exclude is None or isinstance(exclude, str) else tuple(exclude))
            hash(key)
        except TypeError:
            key = None
        chosen = self._selections.get(key) if key is not None else None
        if chosen is None:
            chosen = self._compute_selection(include, exclude)
            if key is not None:
                self._selections[key] = chosen
        return chosen

    def _compute_selection(self, include, exclude) -> tuple[int, ...]:
        inc, exc = _patterns(include, "include"), _patterns(exclude, "exclude")
        chosen = tuple(i for i, p in enumerate(self._paths)
                       if (not inc or any(r.search(p) for r in inc))
                       and not any(r.search(p) for r in exc))
        if not chosen:
            raise errors.InvalidArgumentError(
                f"include={include!r} and exclude={exclude!r} select no variable of the "
                f"{len(self._paths)} twinned (e.g. {', '.join(self._paths[:3])}). Patterns are "
                "regular expressions searched in object paths. Fix: pass patterns that "
                "match some of twins.paths, or leave include= out.")
        return chosen

    def _fn(self, kind: str, chosen: tuple[int, ...]):
        """The fused call of `kind` for the chosen pairs, in this context: every replica's
        variables (cross-replica context, or no strategy) or one replica's (inside
        `strategy.run`)."""
        replica = _compat.replica_index()
        key = (kind, chosen) if replica is None else (kind, chosen, replica)
        fn = self._fns.get(key)
        if fn is None:
            current, past = self._variables_for(chosen, replica)
            fn = self._fns[key] = _build(kind, current, past)
        return fn

    def _variables_for(self, chosen: tuple[int, ...], replica: int | None):
        """(current, past) lists of the plain variables the operation touches."""
        current, past = [], []
        for i in chosen:
            replicas = self._replicas[i]
            if replicas is None:
                if replica is not None and _compat.local_replica_count() > 1:
                    _refuse_plain_in_replica_context(self._paths[i], self._current[i])
                current.append(self._current[i])
                past.append(self._past[i])
            elif replica is None:
                current.extend(replicas[0])
                past.extend(replicas[1])
            else:
                current.append(replicas[0][replica])
                past.append(replicas[1][replica])
        return current, past

    @tf.autograph.experimental.do_not_convert
    def sync(self, tau=1.0, *, include: str | Sequence[str] | None = None,
             exclude: str | Sequence[str] | None = None) -> None:
        """Copies current into past: a hard copy, or a Polyak update with `tau`.

        With tau=1.0 every selected variable of past takes current's value (no
        bytes are copied until one of them is written again). With tau < 1,
        float variables get `past = tau * current + (1 - tau) * past`, computed
        in place by one fused kernel per variable; other variables (integer
        counters) are copied. Works eagerly and inside a `tf.function`;
        changing tau never retraces (inside a `tf.function` a tensor tau of 1
        gives the exact copy too).

        Under tf.distribute (current and past built in one strategy's scope) it
        works outside `strategy.run` (every replica of this worker in one call)
        and inside it (each replica's function does its own replica): each
        replica of past gets the same replica of current, exactly, and the
        blend is the one computed on one device, per replica.

        Keras layers that compute from tensors cached from their variables (an
        adapted `Normalization`'s mean and variance, a "tf_idf" lookup's weights) are
        refreshed after the write, as Keras's own loaders refresh them, so past's
        outputs are those of its new values; models without such layers pay nothing.
        Inside a `tf.function` being traced the new values exist only once the
        function runs, so these layers cannot be refreshed there: a RuntimeWarning
        names them; sync eagerly (or call their `finalize_state()` afterwards).

        Args:
          tau: weight of current, in [0, 1]; a Python number or a scalar tensor.
          include: regular expressions; only object paths matching one are synced.
          exclude: regular expressions; object paths matching one are skipped.

        Raises:
          DistributedVariableError: inside `strategy.run` with several replicas,
            for a variable not created in the strategy's scope (every replica
            would update it).
        """
        if not isinstance(tau, (int, float)) and tf.executing_eagerly():
            tau = float(tau)  # an eager scalar tensor: its value picks copy or blend
        check_tau(tau)
        chosen = self._select(include, exclude)
        if isinstance(tau, (int, float)):
            if tau == 1.0:
                self._fn("copy", chosen)()
            else:
                self._fn("blend", chosen)(tf.constant(tau, tf.float64))
        else:
            self._fn("blend_or_copy", chosen)(tf.cast(tau, tf.float64))
        if self._derived[1]:
            self._refresh(1, chosen)

    @tf.autograph.experimental.do_not_convert
    def swap(self, *, include: str | Sequence[str] | None = None,
             exclude: str | Sequence[str] | None = None) -> None:
        """Exchanges the values of current and past; optimizer state is untouched.

        State Keras layers derive from their variables is refreshed on both sides, as
        after `sync()`.
        """
        chosen = self._select(include, exclude)
        self._fn("swap", chosen)()
        if self._derived[0] or self._derived[1]:
            self._refresh(0, chosen)
            self._refresh(1, chosen)

    def _refresh(self, side: int, chosen: tuple[int, ...]) -> None:
        """Refreshes state derived from the chosen variables of one side (0: current, 1:
        past): eagerly, after the write; inside a tf.function being traced it warns
        (`_compat.refresh_hooks`). Which hooks own a chosen variable is worked out once per
        selection: a write costs O(hooks), never a pass over the variables."""
        key = (side, id(chosen))  # `_select` keeps each selection's tuple: one per patterns
        entry = self._refreshes.get(key)
        if entry is None or entry[0] is not chosen:
            if len(self._refreshes) > 64:  # selections not kept by `_select` (unhashable)
                self._refreshes.clear()
            picked = None if len(chosen) == len(self._paths) else frozenset(chosen)
            entry = self._refreshes[key] = (chosen, tuple(
                hook for hook, positions in self._derived[side]
                if picked is None or not positions.isdisjoint(picked)))
        if entry[1]:
            _compat.refresh_hooks(entry[1])


def _check_same_structure(model, current_vars: dict, past_vars: dict) -> None:
    problems = []
    for path in current_vars.keys() | past_vars.keys():
        a, b = current_vars.get(path), past_vars.get(path)
        if a is None or b is None:
            where = "current" if b is None else "past"
            problems.append(f"`{path}`: only in {where}")
        elif a is b:
            problems.append(f"`{path}`: the same variable in current and past")
        elif _compat.misfit(b, a) or _compat.misfit(a, b):  # the same shape and dtype
            problems.append(f"`{path}`: {a.dtype.name}{tuple(a.shape)} in current but "
                            f"{b.dtype.name}{tuple(b.shape)} in past")
        else:
            problem = _placement_problem(a, b)
            if problem:
                problems.append(f"`{path}`: {problem}")
    if not current_vars:
        raise errors.UnbuiltModelError(
            f"{type(model).__name__} has no variables yet, so there is nothing to twin. "
            "Fix: build it first (call it on a batch, or model.build(shape)), then create the "
            "Twins.")
    if problems:
        problems.sort()
        raise errors.StructureMismatchError(
            f"past must have the same object tree as current, with its own variables: "
            f"{len(problems)} problem{'s' if len(problems) != 1 else ''}.\n  - "
            + "\n  - ".join(problems[:20])
            + "\nFix: build past with the same code as current (Twins(model, past=factory())), "
            "under the same tf.distribute strategy scope as current, or leave past=None to "
            "clone the model.", tuple(problems))


def _placement(variable) -> str:
    replicas = _compat.replica_parts(variable)
    if replicas is None:
        return f"a {type(variable).__name__} on {variable.device or 'the default device'}"
    kind = "mirrored" if variable.synchronization != tf.VariableSynchronization.ON_READ \
        else "sync-on-read"
    return f"{kind} over {len(replicas)} replica(s) ({', '.join(r.device for r in replicas)})"


def _placement_problem(current, past) -> str | None:
    """Why current and past cannot be paired replica by replica (shard by shard), or None."""
    if _compat.is_sharded(current) or _compat.is_sharded(past):
        layouts = [_compat.shard_layout(v).describe() if _compat.is_sharded(v)
                   else "unsharded" for v in (current, past)]
        return None if layouts[0] == layouts[1] else \
            f"{layouts[0]} in current but {layouts[1]} in past"
    a, b = _compat.replica_parts(current), _compat.replica_parts(past)
    if a is None and b is None:
        return None
    if a is None or b is None or len(a) != len(b) or \
            (current.synchronization == tf.VariableSynchronization.ON_READ) != \
            (past.synchronization == tf.VariableSynchronization.ON_READ):
        return f"{_placement(current)} in current but {_placement(past)} in past"
    return None


def _replica_pairs(current, past):
    for c, p in zip(current, past):
        if _compat.is_sharded(c):  # shard by shard, each pair on its own device
            yield _compat.shards(c), _compat.shards(p)
            continue
        a, b = _compat.replica_parts(c), _compat.replica_parts(p)
        yield None if a is None else (a, b)


def _refuse_plain_in_replica_context(path: str, variable) -> None:
    count = _compat.local_replica_count()
    raise errors.DistributedVariableError(
        f"Twins inside strategy.run ({count} replicas): `{path}` is a plain "
        f"{type(variable).__name__} on {variable.device or 'the default device'}, not a "
        "variable of the strategy, so every replica's function would update it (a blend "
        f"applied {count} times, a swap undone). Expected: the variables of current and past "
        "created under `strategy.scope()`. Fix: build both models under the strategy's "
        "scope, or call sync()/swap() outside strategy.run.",
        path=path, variable_type=type(variable).__name__)


def _build(kind: str, current: list, past: list):
    """A callable running one fused TF function over the variable pairs.

    kinds: "copy", "swap", "blend" (a float tau < 1, known in Python) and
    "blend_or_copy" (a tensor tau: the blend when tau < 1, else the copy).
    """
    def copy():
        for p, value in zip(past, _compat.read_values(current)):
            p.assign(value, read_value=False)

    def blend(tau):
        coefficients = {}  # per dtype, not per variable
        for c, p, value in zip(current, past, _compat.read_values(current)):
            if c.dtype.is_floating or c.dtype.is_complex:
                if c.dtype not in coefficients:
                    coefficients[c.dtype] = _compat.polyak_coefficients(tau, c.dtype)
                _compat.polyak_update(value, p, coefficients[c.dtype])
            else:
                p.assign(value, read_value=False)

    if kind == "copy":
        body = copy
    elif kind == "swap":
        def body():
            c_values = _compat.read_values(current)
            p_values = _compat.read_values(past)
            for c, p, cv, pv in zip(current, past, c_values, p_values):
                c.assign(pv, read_value=False)
                p.assign(cv, read_value=False)
    elif kind == "blend":
        body = blend
    else:
        def body(tau):
            tf.cond(tau < 1.0, lambda: blend(tau), copy)
    traced = _compat.fused_call(body, [] if kind in ("copy", "swap")
                                else [tf.TensorSpec((), tf.float64)])
    packed = None
    if kind != "blend_or_copy":
        packed = _compat.packed_pairs_call(kind, current, past)
    if packed is None:
        return traced

    def call(*args):
        # Eagerly, the packed function (one input per side); in a graph, the traced
        # one, whose captured handles let TF order it against the step's updates.
        if tf.executing_eagerly():
            return packed(*args)
        return traced(*args)

    call.function = traced.function
    return call
