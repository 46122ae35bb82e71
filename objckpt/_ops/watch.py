"""Watching obj for variables that do not exist yet: a deferred restore's "not yet created"
state.

`CreationWatch` holds, for every entry of a `restore_on_create` whose variable does not
exist yet, how far along its object path obj already reaches, and hooks obj there: TF calls
the hook when the next object on the path is attached (the moment `self.kernel = ...` runs
inside a layer's `build`, before `call`); Keras layers of every flavour also look after
each `build`; an optimizer's slot creation is watched for its slots. When a variable
appears, its entry goes through the pipeline's fetch, check, assign and refresh stages
(`PendingRestore._apply_all`), as the variables that existed at the start did.
"""

from __future__ import annotations

import functools

from objckpt import _compat
from objckpt._base import paths as _paths

__all__ = ["CreationWatch", "child_of", "edge_name", "walk"]


class CreationWatch:
    """The hooks of a `PendingRestore` (its subclass) on obj, and how far each waiting
    entry got along its path. The subclass provides `_entries`, `_failed`, `done`,
    `_source`, `_obj` and `_apply_all`."""

    def poll(self, scope=None, edge=None) -> None:
        """Assigns every pending value whose variable now exists; hooks the rest.

        Each entry remembers how far along its path it got (the object it
        waits at), so a poll costs one child lookup per entry it looks at.
        With `scope` (ids of a layer being built and its sublayers, or of the
        object something was just attached to), entries waiting at an unbuilt
        Keras layer outside it are skipped: nothing appears under an unbuilt
        layer before its own build, whose wrapper looks then. Entries waiting
        at built objects are always looked at (a layer built inside a built
        tf_keras model adds `layer_with_weights-N` edges to the model).
        """
        ready, cache = [], {}
        for path, entry in list(self._entries.items()):
            if path in self._failed:  # raised once at creation; listed by assert_done
                continue
            slot = _paths.split_slot(path)
            if slot is not None:  # lands when its optimizer creates the slot (_slot_created)
                if path not in self._slot_waiting:
                    variable = self._watch_slot(path, slot, cache)
                    if variable is not None:
                        ready.append((entry, variable))
                continue
            node, depth = self._progress.get(path, (self._obj, 0))
            if _compat.as_variable(node) is not None and depth < len(path.split("/")):
                continue  # a path through a variable (a slot's): nothing attaches under it
            if scope is not None and id(node) not in scope and _compat.is_unbuilt(node):
                continue  # nothing appears under an unbuilt layer before its own build
            if edge is not None and (id(node) not in scope or edge_name(path, depth) != edge):
                continue  # something else was attached: this entry waits on
            node, depth, missing = walk(node, depth, path, self._attached, cache)
            self._progress[path] = (node, depth)
            variable = _compat.as_variable(node) if not missing else None
            if variable is not None:
                ready.append((entry, variable))
            elif missing:
                self._hook(node, missing[0])
            elif _compat.is_sharded(node):
                self._failed[path] = f"it was created as a {type(node).__name__}"
                _compat.check_not_sharded(node, path)
        self._apply_all([(entry, variable, None) for entry, variable in ready])
        if self.done:
            self._unwrap()
    def _note_layers(self, node) -> None:
        """node (built or attached just now) and its sublayers may be new to obj."""
        self._new_layers.extend(_compat.keras_layers(node))
    def _hook(self, node, edge: str) -> None:
        if not self._source.keyed_by_path:
            return  # its keys are no paths to wait on: Keras builds are watched instead
        if _compat.as_variable(node) is not None:
            # Nothing is attached under a variable (a slot's path runs through one); and a
            # SyncOnRead variable answers attribute probes with a cross-replica reduction.
            return
        key = (id(node), edge)
        if key in self._hooked:
            return
        self._hooked.add(key)
        name = _paths.unescape(edge)

        def attached(child):  # TF attaches `child` as node.<name>: look again from it
            self._hooked.discard(key)
            self._note_layers(child)
            self._attached[key] = child
            try:
                self.poll(scope={id(node)}, edge=name.lstrip("_") or name)
            finally:
                self._attached.pop(key, None)

        # The edge as written, and with a leading underscore added or removed
        # (`w` in the source reaches `self._w`).
        for variant in dict.fromkeys((name, "_" + name, name.lstrip("_") or name)):
            _compat.defer_on_attach(node, variant, attached)
        if id(node) not in self._layers_seen:
            self._layers_seen.add(id(node))
            for layer in _compat.keras_layers(node):
                self._wrap_build(layer)
    def _wrap_build(self, layer) -> None:
        if id(layer) in self._wrapped_ids:
            return
        self._wrapped_ids.add(id(layer))
        original = layer.build  # Keras 3 keeps its own build wrapper in the instance dict
        pending = self

        @functools.wraps(original)  # Keras 3 reads build's signature to pass shapes
        def build(*args, **kwargs):
            result = original(*args, **kwargs)
            if not pending.done:
                layers = _compat.keras_layers(layer)
                pending._new_layers.extend(layers)  # a build may create layers: see _note_layers
                pending.poll(scope={id(each) for each in layers})
            if not pending.done and not pending._source.keyed_by_path:
                pending._apply_all(pending.planned())
            return result

        self._wrapped.append((layer, _compat.override_methods(layer, {"build": build})))
    def _lands_later(self, path: str) -> bool:
        """Whether an entry the plan leaves out still lands by its path: state of an optimizer
        of obj that creates it lazily (Keras 2 / tf_keras legacy, TF1): a slot (when the
        optimizer creates it) or a variable attached to the optimizer by name (`iter`,
        `beta1_power`: TF's attach hook)."""
        if not self._source.keyed_by_path:
            return False
        slot = _paths.split_slot(path)
        owner = slot[1] if slot is not None else path.rpartition("/")[0]
        node, _, missing = walk(self._obj, 0, owner)
        return bool(owner) and not missing and _compat.has_slot_variables(node)
    def _watch_slot(self, path: str, slot: tuple, cache):
        """An optimizer slot's entry (`<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>`; Keras 2
        / tf_keras legacy optimizers, TF1 optimizers): nothing is attached under a variable,
        so the optimizer is watched: its slot creation calls `_slot_created`, which lands the
        value before the slot's first use, as TF's own deferred slot restore does. Returns
        the slot variable when it exists already."""
        variable_path, optimizer_path, name = slot
        optimizer, _, missing = walk(self._obj, 0, optimizer_path, self._attached, cache)
        if missing:
            self._hook(optimizer, missing[0])  # the optimizer is attached later (compile)
            return None
        if id(optimizer) not in self._slot_hooked:
            undo = _compat.on_slot_created(
                optimizer, functools.partial(self._slot_created, optimizer))
            if not undo:
                self._failed[path] = (
                    f"`{optimizer_path}` is a {type(optimizer).__name__}, which keeps no slot "
                    "variables (fix: map the entry to its optimizer state with rules=[...])")
                return None
            self._slot_hooked.add(id(optimizer))
            self._wrapped.extend(undo)
        self._slot_waiting.add(path)
        self._slot_index.clear()  # rebuilt on the next slot creation
        variable, _, missing = walk(self._obj, 0, variable_path, self._attached, cache)
        if missing or _compat.as_variable(variable) is None:
            return None
        existing = _compat.existing_slot(optimizer, variable, _paths.unescape(name))
        if existing is not None:
            self._slot_waiting.discard(path)
        return existing
    def _slot_created(self, optimizer, slot_name, variable, slot_variable) -> None:
        """`optimizer` just created `slot_variable` (its slot `slot_name` of `variable`):
        the waiting entry for it lands now, eagerly, before the slot's first use."""
        owner = _compat.slot_owner(variable)
        key = (id(optimizer), slot_name, id(owner))
        if key not in self._slot_index:  # variables created since: index the waiting again
            self._slot_index.clear()
            cache: dict = {}
            for path in self._slot_waiting:
                if path not in self._entries or path in self._failed:
                    continue
                variable_path, optimizer_path, name = _paths.split_slot(path)
                node, _, missing = walk(self._obj, 0, optimizer_path, None, cache)
                held, _, missing_variable = walk(self._obj, 0, variable_path, None, cache)
                if missing or missing_variable or _compat.as_variable(held) is None:
                    continue
                self._slot_index[(id(node), _paths.unescape(name),
                                  id(_compat.slot_owner(held)))] = path
        path = self._slot_index.pop(key, None)
        if path is None or path not in self._entries:
            return
        self._slot_waiting.discard(path)
        self._apply_all([(self._entries[path], slot_variable, None)])
        if self.done:
            self._unwrap()
    def _unwrap(self) -> None:
        self._slot_hooked = set()
        for layer, undo in self._wrapped:
            _compat.restore_methods(layer, undo)  # one wrapped on top of ours stays
        self._wrapped = []
        self._wrapped_ids = set()


def child_of(node, edge: str, attached=None, cache=None):
    """The child of node at an (escaped) edge; leading underscores optional."""
    if attached and (id(node), edge) in attached:
        return attached[(id(node), edge)]
    index = cache.get(id(node)) if cache is not None else None
    if index is None:
        children = _compat.children_with_collections(node)
        stripped: dict = {}
        for child_name, child in children.items():
            stripped.setdefault(child_name.lstrip("_") or child_name, []).append(child)
        index = (children, stripped)
        if cache is not None:
            cache[id(node)] = index
    children, stripped = index
    name = _paths.unescape(edge)
    if name in children:
        return children[name]
    found = stripped.get(name.lstrip("_") or name, ())
    return found[0] if len(found) == 1 else None


def edge_name(path: str, depth: int) -> str:
    edges = path.split("/")
    name = _paths.unescape(edges[depth]) if depth < len(edges) else ""
    return name.lstrip("_") or name


def walk(node, depth: int, path: str, attached=None, cache=None):
    """Follows path's edges from `depth` on, starting at node.

    Returns (deepest object reached, its depth, edges still missing).
    """
    edges = path.split("/")
    for i in range(depth, len(edges)):
        child = child_of(node, edges[i], attached, cache)
        if child is None:
            return node, i, edges[i:]
        node = child
    return node, len(edges), []
