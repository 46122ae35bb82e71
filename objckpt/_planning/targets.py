"""The obj's side of a plan: its variables indexed every way a source key can name them.

A key finds variables by object path (or a Keras 3 variable's path through its layers), by
where Keras 3's `save_weights` puts the variable (`layers/dense/vars/0`), by path with leading
underscores stripped from each edge, by variable name, or by the layer and weight names a
Keras 2 HDF5 file gives it (`head/dense/kernel`); optimizer slots by (owner, role), counters
by name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from objckpt import _compat
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._formats.legacyh5 import weight_key

# TF's name for a variable created without one (`tf.Variable(0.0)`): says nothing.
_DEFAULT_NAME = re.compile(r"Variable(_[0-9]+)?")
# A key of a Keras 3 weights file: `<object path>/vars/<i>` (`layers/dense/vars/0`), or a
# name some layers store under (`layers/string_lookup/vars/idf_weights`).
_LAYOUT_KEY = re.compile(r"(?:^|/)vars/[^/]+$")

__all__ = ["Targets", "candidates", "index_targets", "is_default_name", "is_optimizer_key",
           "label", "strip"]


def strip(path: str) -> str:
    return "/".join(edge.lstrip("_") or edge for edge in path.split("/"))


def is_optimizer_key(key: str) -> bool:
    edges = key.split("/")
    return (_paths.OPTIMIZER_SLOT in edges or "optimizer" in edges or "_optimizer" in edges
            or key in _compat.COUNTERS or key.endswith(("beta1_power", "beta2_power"))
            or bool(_compat.TF1_SLOT.match(key)))


@dataclasses.dataclass
class Targets:
    """The obj's variables indexed every way a key can match them."""

    paths: dict  # object path -> variable
    by_strip: dict
    by_name: dict
    network: dict  # tree path -> network path (no optimizer), for structure
    slots: dict  # (tree path of a variable, slot role) -> tree path of the slot
    counters: dict  # "iterations" / "learning_rate" / ... -> [tree paths] (one per optimizer)
    optimizer_paths: frozenset
    rng: frozenset = frozenset()  # tree paths of random generator state (Keras 3 seeds)
    by_network: dict = dataclasses.field(default_factory=dict)  # network path -> tree path
    # Returns {tree path: class name of the object holding the variable}; walked on request.
    holders: Callable = dict
    names: dict = dataclasses.field(default_factory=dict)  # tree path -> variable name
    # Returns {key of a Keras 3 weights file (`layers/dense/vars/0`): tree path}: where
    # Keras's `save_weights` puts each of the obj's variables; walked on request.
    layout: Callable = dict
    # Returns {key of a Keras 2 HDF5 file (`head/dense/kernel`): [tree paths]}: the layer and
    # weight names Keras's HDF5 `save_weights` writes for each variable; walked on request.
    h5_names: Callable = dict
    # Returns [tree path] of a Keras obj's variables in `obj.variables` order (the order of
    # the `variables` list a Keras 3 `model.export` keeps); [] for other objs.
    order: Callable = list
    # Returns [(layer name, [tree paths])] of a Keras model's layers with weights in
    # `model.layers` order, each in Keras's HDF5 weight order (`_compat.keras_h5_weights`).
    h5_layers: Callable = list
    # Returns {tree path of a LoRA factor: tree path of its layer's kernel} (Keras 3 layers
    # with LoRA enabled; a weights file holds their merged kernel, no factors).
    lora: Callable = dict

    def shown(self, path: str) -> str:
        """The path people know for a tree path: a network variable's path through its
        layers (`_functional/_operations/1/_kernel`), not the optimizer list TF's walk
        reached it by first (`optimizer/_trainable_variables/0`)."""
        return self.network.get(path, path)

    def slot_owners(self) -> dict:
        """{tree path of an optimizer slot: (tree path of its variable, role)}."""
        return {slot: owner for owner, slot in self.slots.items()}

    def display(self, path: str, owners: dict | None = None) -> tuple[str, str]:
        """(path, note) as people know a variable, unescaped: the path of `shown` and its
        Keras/TF name (`hidden/_kernel`, `encoder/kernel`) or, for an optimizer slot, its own
        path and whose slot it is (`optimizer/_variables/2`, "m of `hidden/_kernel`"); the
        note is "" when it would only repeat the path."""
        if owners is None:
            owners = self.slot_owners()
        owner = owners.get(path)
        if owner is not None:
            return path, f"{owner[1]} of `{self.shown(owner[0])}`"
        shown = self.shown(path)
        name = self.names.get(path, "")
        if name == shown or is_default_name(name) or len(self.by_name.get(name, ())) > 1:
            name = ""  # nothing to add, or a name several variables share
        variable = self.paths.get(path)
        if variable is not None and _compat.is_sharded(variable):  # its layout beside it
            name = "; ".join(n for n in (name, _compat.shard_layout(variable).describe()) if n)
        return shown, name

    def label(self, path: str, owners: dict | None = None) -> str:
        """A variable as messages show it, escaped: `hidden/_kernel` [encoder/kernel], or
        `optimizer/_variables/2` [m of `hidden/_kernel`] for an optimizer slot."""
        return label(*self.display(path, owners))


def is_default_name(name: str) -> bool:
    """Whether a variable name is TF's default (`Variable`, `Variable_3`): it tells nothing."""
    return bool(_DEFAULT_NAME.fullmatch(name))


def label(shown: str, note: str) -> str:
    """`shown` [note], escaped for a terminal; just `shown` without a note."""
    return f"`{_render.safe(shown)}`" + (f" [{_render.safe(note)}]" if note else "")

def index_targets(obj, variables) -> Targets:
    by_strip: dict = {}
    by_name: dict = {}
    names: dict = {}
    root = getattr(obj, "name", None)
    root = f"{root}/" if isinstance(root, str) and root else None
    for path, variable in variables.items():
        by_strip.setdefault(strip(path), []).append(path)
        name = _compat.variable_name(variable)
        names[path] = name
        forms = [name]
        if root and name.startswith(root):  # names relative to obj, as paths are
            forms.append(name[len(root):])
        for each in forms:
            if path not in by_name.get(each, ()):
                by_name.setdefault(each, []).append(path)
    path_of = {id(v): p for p, v in variables.items()}
    network = {path_of[id(v)]: net_path for net_path, v in _compat.network_variable_paths(obj)
               if id(v) in path_of}
    by_network = {}
    for path, net_path in network.items():
        if net_path != path:  # a trained Keras 3 model: the canonical path runs elsewhere
            by_network[net_path] = path
            if path not in by_strip.get(strip(net_path), ()):
                by_strip.setdefault(strip(net_path), []).append(path)
    optimizer_paths = frozenset(p for p in variables if p not in network)
    slots, counters = {}, {}
    for path in variables:  # slot variables (Keras 2, tf_keras < 2.11 optimizers, TF1)
        parts = _paths.split_slot(path)
        if parts is not None:
            slots[(parts[0], _compat.SLOT_ALIASES.get(parts[2], parts[2]))] = path
    for variable, role, slot_variable in _compat.optimizer_slot_lists(obj, variables.values()):
        if id(variable) in path_of and id(slot_variable) in path_of:
            slots[(path_of[id(variable)], role)] = path_of[id(slot_variable)]
    for name, counter in _compat.optimizer_counters(obj):
        if id(counter) in path_of and path_of[id(counter)] not in counters.get(name, ()):
            counters.setdefault(name, []).append(path_of[id(counter)])
    rng = {id(v) for v in _compat.rng_state_variables(obj)}

    memo: list = []

    def holders():
        if not memo:
            classes = _compat.variable_holders(obj)
            memo.append({p: classes.get(id(v)) for p, v in variables.items()})
        return memo[0]

    laid_out: list = []

    def layout():
        if not laid_out:
            laid_out.append({key: path_of[id(v)] for key, v in _compat.keras_weights_layout(obj)
                             if v is not None and id(v) in path_of})
        return laid_out[0]

    named: list = []

    def h5_names():
        if not named:
            index: dict = {}
            for layer, name, v in _compat.keras_h5_weights(obj):
                if id(v) in path_of:
                    index.setdefault(weight_key(layer, name), []).append(path_of[id(v)])
            named.append(index)
        return named[0]

    def order():
        return [path_of[id(v)] for v in _compat.keras_variables(obj) if id(v) in path_of]

    factored: list = []

    def lora():
        if not factored:
            factors = [_compat.lora_factors(h.layer()) for h in _compat.derived_hooks(obj)]
            factored.append({path_of[id(f)]: path_of[id(k)]
                             for k, *pair in filter(None, factors)
                             for f in pair if id(f) in path_of and id(k) in path_of})
        return factored[0]

    return Targets(dict(variables), by_strip, by_name, network, slots, counters,
                    optimizer_paths, frozenset(p for p, v in variables.items() if id(v) in rng),
                    by_network, holders, names, layout, h5_names, order,
                    lambda: [(layer, [path_of.get(id(v)) for v in layer_variables])
                             for layer, layer_variables in _compat.keras_h5_weights(
                                 obj, grouped=True)], lora=lora)


def candidates(key: str, targets: Targets, rewritten: bool):
    """Returns (strategy, [target paths]) for one rewritten key, best strategy first."""
    if key in targets.paths:
        return ("rule" if rewritten else "exact"), [key]
    if key in targets.by_network:  # the variable's path through the layers
        return ("rule" if rewritten else "exact"), [targets.by_network[key]]
    if _LAYOUT_KEY.search(key) and key in targets.layout():  # a Keras 3 weights file's key
        return ("rule" if rewritten else "keras layout"), [targets.layout()[key]]
    found = targets.by_strip.get(strip(key))
    if found:
        return "underscore", found
    found = targets.by_name.get(key[:-2] if key.endswith(":0") else key)
    if found:
        return "name", found
    found = targets.h5_names().get(key)  # a Keras 2 HDF5 file's key: layer and weight names
    if found:
        return "layer name", found
    return None, []
