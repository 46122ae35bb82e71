"""Plans: which source entry feeds which variable, and why.

Every entry point that takes a source (`restore`, `restore_on_create`,
`migrate`, `plan`) opens it here and matches its keys to the obj's variables
with one algorithm, so a plan shown by `objckpt.plan` is exactly what a
restore will do. Strategies, in order:

1. rules: ordered `(regex, replacement[, transform])` rewrites of source keys;
   the first rule that matches a key rewrites it once; a None replacement
   drops the entry. Keys no rule matches stay as they are.
2. a (rewritten) key matches a variable whose object path equals it
   ("exact", or "rule" when a rule rewrote it), else whose object path equals
   it with leading underscores stripped from every edge ("underscore":
   `hidden/_kernel` ~ `hidden/kernel`), else whose variable name equals it
   ("name": TF1 names such as `dense/kernel`; a Keras model's own name may
   be left off, as in `conv/kernel` for `tf1_rewrite/conv/kernel`).
3. "keras name", then "structure": when no network variable matched by path
   at all (the two object graphs use different naming schemes), an
   object-based source's leftover entries are matched by the Keras/TF name
   each was saved under (`Conv1/kernel`) if every one pairs up one to one;
   else layer by layer, in depth-first order, by weight role (kernel, bias,
   gamma, moving_mean, ...) and shape, if and only if the two sequences of
   layers line up exactly. Both read keys as the rules rewrote them, and
   roles through `_roles.ROLE_ALIASES` (Keras 2 / tf_keras -> Keras 3 renames,
   per layer class). This is what carries a Keras 2 / tf_keras checkpoint
   (`layer_with_weights-0/kernel`) into the same architecture in Keras 3
   (`_functional/_operations/1/_kernel`).
4. optimizer state (see `_place_optimizer_state`): by the variable each entry
   belongs to, never by position between different layouts.

A candidate is never guessed between equals: two sources for one variable, or
two variables for one source, are reported as ambiguous.

This module sits between `_tree` and `_snapshot`: `restore` applies plans.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable, Sequence

import tensorflow as tf

from objckpt import _compat, _files, _paths, _render, _tree, errors
from objckpt._roles import ROLE_ALIASES as _ROLE_ALIASES

__all__ = ["Match", "Plan", "plan"]

_MAX_LISTED = 20
# Entries tf.train.Checkpoint or Saver add for themselves; never "unexpected".
BOOKKEEPING = frozenset({"save_counter", _compat.OBJECT_GRAPH_KEY})

# Optimizer slot names of every flavour -> one canonical role: "m" is the first
# moment or momentum buffer, "v" the second moment (Adam v, RMSprop rms).
_SLOT_ALIASES = {
    "m": "m", "Adam": "m", "adam_m": "m", "momentum": "m", "Momentum": "m",
    "RMSProp_1": "m",
    "v": "v", "Adam_1": "v", "adam_v": "v", "rms": "v", "RMSProp": "v", "velocity": "v",
    "vhat": "vhat", "velocity_hat": "vhat", "mg": "mg", "average_gradient": "mg",
    "accumulator": "accumulator", "Adagrad": "accumulator", "Ftrl": "accumulator",
    "accum": "accumulator", "linear": "linear", "Ftrl_1": "linear",
    "Adadelta": "accum_grad", "accumulated_grad": "accum_grad",
    "Adadelta_1": "accum_delta", "accum_update": "accum_delta",
    "accumulated_delta_var": "accum_delta",
    "gradient_accumulator": "gradient_accumulator", "norm": "norm",
}
# Keras 3 names an optimizer variable `<owner path, / as _>_<role>`, in `_variables`.
_KERAS3_ROLES = ("velocity_hat", "average_gradient", "accumulated_delta_var",
                 "accumulated_grad", "gradient_accumulator", "momentum", "velocity",
                 "accumulator", "linear", "norm")
# A tf_keras (2.11+) / Keras 3 optimizer variable's saved name: `<opt>/<slot>/<variable name>`.
_NAMED_SLOT = re.compile(r"^(?:[^/]+/)?(?P<slot>m|v|vhat|momentum|velocity|velocity_hat|"
                         r"average_gradient|accumulator|linear|accumulated_grad|"
                         r"accumulated_delta_var)/(?P<var>.+?)(?::0)?$")
# TF1 `tf.compat.v1.train` optimizers' slot names (`<var>/Adam`), and the original BERT's
# AdamWeightDecayOptimizer (`<var>/adam_m`).
_TF1_SLOT = re.compile(r"^(?P<var>.+)/(?P<slot>Adam|Adam_1|adam_m|adam_v|Momentum|RMSProp|"
                       r"RMSProp_1|Adagrad|Ftrl|Ftrl_1|Adadelta|Adadelta_1)$")
_COUNTERS = {"iter": "iterations", "iterations": "iterations", "global_step": "iterations",
             "learning_rate": "learning_rate", "lr": "learning_rate",
             # Keras 2's OptimizerV2 keeps its hyperparameters as variables too.
             "beta_1": "beta_1", "beta_2": "beta_2", "decay": "decay", "rho": "rho",
             "epsilon": "epsilon", "momentum": "momentum"}


# --- sources -------------------------------------------------------------------


@dataclasses.dataclass
class Source:
    """A source opened for matching: keys with shapes and dtypes, and a reader.

    kind is "object" (an object-based checkpoint), "name" (a TF1 name-based
    checkpoint) or "snapshot". `fetch(keys)` returns the tensors of those keys.
    """

    description: str
    kind: str
    specs: dict  # key -> (shape tuple, tf.DType)
    fetch: Callable
    subtree: Callable  # at -> {key within at: key}
    top_level_names: list
    prefix: str | None = None
    notes: tuple[str, ...] = ()
    names: dict = dataclasses.field(default_factory=dict)  # key -> variable name when saved
    # Extra keys for the same tensors: a variable's path through the network when its
    # canonical path runs through an optimizer (a trained Keras 3 model).
    aliases: dict = dataclasses.field(default_factory=dict)
    # Returns everything planning reads but `names`, hashable: two sources with equal
    # structures get the same plan for the same obj unless their saved names decide it
    # (optimizer state that moves, the "keras name" strategy); load_ensemble plans once
    # per structure only with optimizer_state=False and a path match. Computed on
    # request only. None: unknown.
    structure: Callable | None = None
    # Returns {key: (key of the variable it belongs to, slot role)} for the optimizer
    # entries whose owner the source itself records (slot tables, saved names, Keras 3
    # variable lists), so optimizer state moves by owner, never by position.
    owners: Callable = lambda: {}


def _prefix_subtree(keys, at: str) -> dict:
    """Keys under `at` by path prefix; a slot belongs when its variable and optimizer do."""
    head = at.strip("/") + "/"
    view = {}
    for key in keys:
        slot = _paths.split_slot(key)
        if slot is None:
            if key.startswith(head):
                view[key[len(head):]] = key
        else:
            variable, optimizer, name = slot
            if variable.startswith(head) and optimizer.startswith(head):
                view[f"{variable[len(head):]}/{_paths.OPTIMIZER_SLOT}/"
                     f"{optimizer[len(head):]}/{name}"] = key
    return view


def _top_names(keys) -> list[str]:
    return list(dict.fromkeys(k.split("/", 1)[0] for k in keys if "/" in k))


def _restore_v2(prefix: str, keys: list[str], dtypes: list) -> list:
    if not keys:
        return []
    try:
        with tf.device("/cpu:0"):
            return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=keys,
                                        shape_and_slices=[""] * len(keys), dtypes=dtypes)
    except tf.errors.OpError as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{prefix}` could not be read: its data is damaged, truncated or "
            f"missing. Received from TF: {_render.first_line(err)}. Nothing was changed; "
            "use another checkpoint.") from err


def _object_source(prefix: str, notes) -> Source:
    entries = _tree.read_tree_at(prefix)
    specs = {path: (entry.shape, entry.dtype) for path, entry in entries.items()}
    aliases = _tree.network_aliases(entries.object_graph)
    for alias, full in aliases.items():
        specs.setdefault(alias, specs[full])

    def entry(path):
        return entries[aliases.get(path, path)]

    def subtree(at):
        # As at the root: a variable whose path within `at` runs through an optimizer
        # (a trained Keras 3 model) is also found by its path through the layers.
        view = _tree.subtree_paths(entries.object_graph, at)
        network = _tree.subtree_paths(entries.object_graph, at, skip_optimizers=True)
        for path, full in network.items():
            view.setdefault(path, full)
        return view

    def structure():
        # The graph without the variables' saved names (`mlp_3/dense/kernel`), which
        # differ between runs of the same code and only place optimizer slots.
        graph = type(entries.object_graph)()
        graph.CopyFrom(entries.object_graph)
        for node in graph.nodes:
            for attribute in node.attributes:
                attribute.full_name = ""
        return ("object", graph.SerializeToString(deterministic=True),
                tuple(specs.items()), tuple(notes))

    return Source(
        f"checkpoint `{prefix}`", "object", specs,
        lambda paths: _restore_v2(prefix, [entry(p).key for p in paths],
                                  [entry(p).dtype for p in paths]),
        subtree,
        _tree.top_level_names(entries.object_graph), prefix, tuple(notes),
        {path: e.name for path, e in entries.items() if e.name}, aliases, structure,
        lambda: keras3_slot_owners(entries.object_graph))


def keras3_slot_owners(graph) -> dict:
    """{slot path: (owner path, role)} for Keras 3 optimizers in a graph proto.

    A Keras 3 optimizer keeps its per-variable state in `_variables`, named
    `<owner path, / as _>_<role>`, one per role in the order of
    `_trainable_variables` (whose edges lead to the variables trained). The
    k-th variable of a role belongs to the k-th trained variable; a role
    whose count differs from the trained count is left without owners.
    """
    key_of, name_of = {}, {}
    for node_id, node in enumerate(graph.nodes):
        for attribute in node.attributes:
            if attribute.name == _paths.VARIABLE_VALUE:
                key_of[node_id] = attribute.checkpoint_key.split(_paths.ATTRIBUTES, 1)[0]
                name_of[node_id] = attribute.full_name
    out: dict = {}
    for node in graph.nodes:
        kids = {child.local_name: child.node_id for child in node.children}
        if "_variables" not in kids or "_trainable_variables" not in kids:
            continue
        state, trained = (_list_nodes(graph, kids[name])
                          for name in ("_variables", "_trainable_variables"))
        by_role: dict = {}
        for node_id in state:
            name = name_of.get(node_id, "").split(":", 1)[0]
            role = next((r for r in _KERAS3_ROLES if name.endswith("_" + r)), None)
            if role is not None and node_id in key_of:
                by_role.setdefault(role, []).append(key_of[node_id])
        for role, keys in by_role.items():
            if len(keys) == len(trained) and all(t in key_of for t in trained):
                for key, owner in zip(keys, trained):
                    out[key] = (key_of[owner], role)
    return out


def _list_nodes(graph, node_id: int) -> list[int]:
    """Node ids of a list node's children, by index (`0`, `1`, ...)."""
    children = [(c.local_name, c.node_id) for c in graph.nodes[node_id].children]
    if not all(name.isdigit() for name, _ in children):
        return []
    return [node for _, node in sorted(children, key=lambda item: int(item[0]))]


def _name_source(prefix: str, notes) -> Source:
    reader = _files.open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    specs = {name: (tuple(shapes[name]), tf.as_dtype(dtypes[name])) for name in sorted(shapes)}
    return Source(
        f"name-based checkpoint `{prefix}`", "name", specs,
        lambda names: _restore_v2(prefix, list(names), [specs[n][1] for n in names]),
        lambda at: _prefix_subtree(specs, at), _top_names(specs), prefix, tuple(notes),
        structure=lambda: ("name", tuple(specs.items()), tuple(notes)))


def snapshot_source(items: dict, aliases: dict | None = None, owners=None) -> Source:
    """A Source over an in-memory mapping path -> tensor (a Snapshot).

    aliases: extra key -> key in items (network paths of a trained Keras 3 model).
    owners: returns {slot path: (owner path, role)} of the obj it was taken from.
    """
    aliases = {a: k for a, k in (aliases or {}).items() if k in items and a not in items}
    specs = {path: (tuple(value.shape), value.dtype) for path, value in items.items()}
    for alias, key in aliases.items():
        specs[alias] = specs[key]
    return Source("Snapshot", "snapshot", specs,
                  lambda paths: [items[aliases.get(p, p)] for p in paths],
                  lambda at: _prefix_subtree(specs, at), _top_names(specs), aliases=aliases,
                  structure=lambda: ("snapshot", tuple(specs.items()),
                                     tuple(aliases.items())),
                  owners=owners or (lambda: {}))


def open_source(source) -> Source:
    """Opens a Snapshot, prefix or directory; name-based prefixes included."""
    as_source = getattr(source, "as_source", None)
    if callable(as_source):
        return as_source()
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise errors.UnsupportedObjectError(
            "A source must be an objckpt.Snapshot, a checkpoint prefix or a directory of "
            f"checkpoints. Received: source of type {type(source).__name__}. Fix: pass "
            "objckpt.snapshot(obj) or a path.")
    prefix, notes = _files.resolve_prefix(source)
    try:
        return _object_source(prefix, notes)
    except errors.NotObjectBasedError:
        return _name_source(prefix, notes)


# --- rules ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Rule:
    index: int
    regex: re.Pattern
    replacement: str | None
    transform: Callable | None

    def __str__(self) -> str:
        extra = ", transform" if self.transform is not None else ""
        return f"rule {self.index} ({self.regex.pattern!r} -> {self.replacement!r}{extra})"


def parse_rules(rules) -> tuple[_Rule, ...]:
    """Validates rules: a sequence of (regex, replacement) or (regex, replacement, transform)."""
    if rules is None:
        return ()
    if isinstance(rules, (str, bytes)) or (isinstance(rules, tuple) and len(rules) in (2, 3)
                                           and isinstance(rules[0], str)
                                           and (rules[1] is None or isinstance(rules[1], str))):
        raise errors.InvalidArgumentError(
            f"rules must be a sequence of (regex, replacement) pairs. Received: rules={rules!r}, "
            "a single rule. Fix: wrap it in a list, e.g. rules=[('^model_001/', '')].")
    parsed = []
    for index, rule in enumerate(rules):
        if not isinstance(rule, (tuple, list)) or len(rule) not in (2, 3):
            raise errors.InvalidArgumentError(
                f"rule {index} must be (regex, replacement) or (regex, replacement, transform). "
                f"Received: {rule!r}. Example: ('^model_001/', '') or ('^old/', None) to drop.")
        pattern, replacement = rule[0], rule[1]
        transform = rule[2] if len(rule) == 3 else None
        if replacement is not None and not isinstance(replacement, str):
            raise errors.InvalidArgumentError(
                f"rule {index}: the replacement must be a string or None (drop the entry). "
                f"Received: {replacement!r}.")
        if transform is not None and not callable(transform):
            raise errors.InvalidArgumentError(
                f"rule {index}: the transform must be a callable tensor -> tensor (e.g. "
                f"lambda t: tf.transpose(t)). Received: {transform!r}.")
        try:
            regex = re.compile(pattern)
        except (TypeError, re.error) as err:
            raise errors.InvalidArgumentError(
                f"rule {index}: {pattern!r} is not a valid regular expression ({err}). Rules "
                "are (regex, replacement) pairs applied with re.sub(regex, replacement, key, "
                "count=1).") from err
        parsed.append(_Rule(index, regex, replacement, transform))
    return tuple(parsed)


def rewrite(key: str, rules: tuple[_Rule, ...]):
    """Returns (rewritten key or None when dropped, the rule that fired or None)."""
    for rule in rules:
        if rule.regex.search(key):
            if rule.replacement is None:
                return None, rule
            try:
                return rule.regex.sub(rule.replacement, key, count=1), rule
            except (re.error, IndexError) as err:
                raise errors.InvalidArgumentError(
                    f"{rule}: the replacement cannot be applied to `{key}` ({err}). Group "
                    "references (\\1, \\g<name>) must exist in the regex.") from err
    return key, None


# --- plans ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Match:
    """One variable fed by one source entry.

    Attributes:
      target: the variable's object path in the obj.
      source: the source key (object path or TF1 name) as stored.
      strategy: "exact", "rule", "underscore", "name", "keras name", "structure"
        or "slot".
      rule: the rule that rewrote the key, described, or "".
    """

    target: str
    source: str
    strategy: str
    rule: str = ""
    transform: Callable | None = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which source entry feeds which variable of an obj, and what is left over.

    Attributes:
      source: the source, described.
      matches: one `Match` per variable that gets a value, in tree order.
      unmatched_variables: object paths of the obj no source entry feeds.
      unmatched_source: source keys that feed no variable.
      ambiguous: (what, candidates) pairs that were not guessed: a variable
        with several equally good source entries, or the reverse.
      mismatched: shape or dtype problems of matched pairs (never tolerated).
      skipped: source keys dropped on purpose (rules with None, bookkeeping,
        optimizer state not moved), with why.
      unused_rules: rules that matched no source key.
      at: the source subtree used, or None for its root.
      notes: anything else worth knowing.
    """

    source: str
    matches: tuple[Match, ...]
    unmatched_variables: tuple[str, ...] = ()
    unmatched_source: tuple[str, ...] = ()
    ambiguous: tuple[tuple[str, tuple[str, ...]], ...] = ()
    mismatched: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    unused_rules: tuple[str, ...] = ()
    at: str | None = None
    notes: tuple[str, ...] = ()
    _source: Source | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def complete(self) -> bool:
        """Every variable fed, every entry used, nothing ambiguous or mismatched."""
        return not (self.unmatched_variables or self.unmatched_source or self.ambiguous
                    or self.mismatched)

    def strategies(self) -> dict[str, int]:
        """How many matches each strategy made."""
        counts: dict[str, int] = {}
        for match in self.matches:
            counts[match.strategy] = counts.get(match.strategy, 0) + 1
        return counts

    def describe(self) -> str:
        """A readable table: one line per match, then everything left over."""
        width = max([len(m.target) for m in self.matches] + [len("variable")])
        lines = [f"plan: {self.source}" + (f" (at={self.at!r})" if self.at else "")
                 + f" -> {len(self.matches)} variables"]
        lines.append(f"  {'variable'.ljust(width)}  {'strategy':10}  source")
        for m in self.matches:
            rule = f"  [{m.rule}]" if m.rule else ""
            lines.append(f"  {m.target.ljust(width)}  {m.strategy:10}  {m.source}{rule}")
        sections = [
            ("variables with no source", self.unmatched_variables),
            ("source entries matching nothing", self.unmatched_source),
            ("ambiguous (not guessed)",
             [f"{what}: {' | '.join(c)}" for what, c in self.ambiguous]),
            ("shape or dtype mismatches", self.mismatched),
            ("skipped", self.skipped),
            ("rules that matched nothing", self.unused_rules),
        ]
        for title, items in sections:
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines.extend(f"  - {item}" for item in items)
        lines.extend(self.notes)
        counts = ", ".join(f"{k} {v}" for k, v in self.strategies().items())
        lines.append(("complete" if self.complete else "INCOMPLETE")
                     + (f": {counts}" if counts else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def fetch(self, keys) -> list:
        """The source values of these source keys (the plan must still hold its source)."""
        if self._source is None:
            raise errors.InvalidArgumentError(
                f"This plan of {self.source} no longer holds its source (a cached plan); "
                "make a new one with objckpt.plan(source, obj).")
        return self._source.fetch(keys)

    def detached(self) -> Plan:
        """This plan without its source (it keeps no source tensors alive)."""
        return dataclasses.replace(self, _source=None)


def _strip(path: str) -> str:
    return "/".join(edge.lstrip("_") or edge for edge in path.split("/"))


def is_optimizer_key(key: str) -> bool:
    edges = key.split("/")
    return (_paths.OPTIMIZER_SLOT in edges or "optimizer" in edges or "_optimizer" in edges
            or key in _COUNTERS or key.endswith(("beta1_power", "beta2_power"))
            or bool(_TF1_SLOT.match(key)))


@dataclasses.dataclass
class _Targets:
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


def index_targets(obj, variables) -> _Targets:
    by_strip: dict = {}
    by_name: dict = {}
    root = getattr(obj, "name", None)
    root = f"{root}/" if isinstance(root, str) and root else None
    for path, variable in variables.items():
        by_strip.setdefault(_strip(path), []).append(path)
        name = _compat.variable_name(variable)
        names = [name]
        if root and name.startswith(root):  # names relative to obj, as paths are
            names.append(name[len(root):])
        for each in names:
            if path not in by_name.get(each, ()):
                by_name.setdefault(each, []).append(path)
    path_of = {id(v): p for p, v in variables.items()}
    network = {path_of[id(v)]: net_path for net_path, v in _compat.network_variable_paths(obj)
               if id(v) in path_of}
    by_network = {}
    for path, net_path in network.items():
        if net_path != path:  # a trained Keras 3 model: the canonical path runs elsewhere
            by_network[net_path] = path
            if path not in by_strip.get(_strip(net_path), ()):
                by_strip.setdefault(_strip(net_path), []).append(path)
    optimizer_paths = frozenset(p for p in variables if p not in network)
    slots, counters = {}, {}
    for path in variables:  # slot variables (Keras 2, tf_keras < 2.11 optimizers, TF1)
        parts = _paths.split_slot(path)
        if parts is not None:
            slots[(parts[0], _SLOT_ALIASES.get(parts[2], parts[2]))] = path
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

    return _Targets(dict(variables), by_strip, by_name, network, slots, counters,
                    optimizer_paths, frozenset(p for p, v in variables.items() if id(v) in rng),
                    by_network, holders)


def _candidates(key: str, targets: _Targets, rewritten: bool):
    """Returns (strategy, [target paths]) for one rewritten key, best strategy first."""
    if key in targets.paths:
        return ("rule" if rewritten else "exact"), [key]
    if key in targets.by_network:  # the variable's path through the layers
        return ("rule" if rewritten else "exact"), [targets.by_network[key]]
    found = targets.by_strip.get(_strip(key))
    if found:
        return "underscore", found
    found = targets.by_name.get(key[:-2] if key.endswith(":0") else key)
    if found:
        return "name", found
    return None, []


def _dfs_keys(paths: list[str]) -> dict:
    """Depth-first sort keys of paths listed breadth-first (TF's order)."""
    rank: dict = {}
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            rank.setdefault("/".join(parts[:i]), len(rank))
    return {p: tuple(rank["/".join(p.split("/")[:i])] for i in range(1, p.count("/") + 2))
            for p in paths}


def _layers(paths_and_specs) -> list[tuple[str, list]]:
    """Groups (path, shape, id) by parent path, in depth-first order."""
    paths = [p for p, _, _ in paths_and_specs]
    order = _dfs_keys(paths)
    groups: dict = {}
    for path, shape, ident in sorted(paths_and_specs, key=lambda item: order[item[0]]):
        parent, _, leaf = path.rpartition("/")
        groups.setdefault(parent, []).append((leaf.lstrip("_") or leaf, tuple(shape), ident))
    return list(groups.items())


def _structure(source_left, target_left, aliases_of=lambda path: {}):
    """Matches leftovers layer by layer. Returns (pairs, ambiguous, note).

    aliases_of(target path) gives the role renames of the layer holding that
    variable ({old role: new role}); source roles are read through them.
    """
    src_layers = _layers(source_left)
    tgt_layers = _layers(target_left)
    if len(src_layers) != len(tgt_layers):
        return [], [], (f"structure: not used: the source has {len(src_layers)} unmatched "
                        f"layers with weights, the obj {len(tgt_layers)}")
    pairs, ambiguous = [], []
    for (src_name, src), (tgt_name, tgt) in zip(src_layers, tgt_layers):
        renames = aliases_of(tgt[0][2]) if tgt else {}
        src = [(renames.get(r, r), s, i) for r, s, i in src]
        if sorted((r, s) for r, s, _ in src) != sorted((r, s) for r, s, _ in tgt):
            describe = lambda ws: ", ".join(f"{r}{s}" for r, s, _ in ws)  # noqa: E731
            return [], [], (f"structure: not used: layer `{src_name or '(root)'}` of the source "
                            f"({describe(src)}) does not line up with `{tgt_name or '(root)'}` "
                            f"of the obj ({describe(tgt)})")
        for role, shape, src_ident in src:
            same = [t for r, s, t in tgt if r == role and s == shape]
            if len(same) == 1:
                pairs.append((src_ident, same[0]))
            else:
                ambiguous.append((src_ident, tuple(same)))
    return pairs, ambiguous, ""


def make_plan(source: Source, obj, variables, *, rules=(), at=None,
              optimizer_state=None) -> Plan:
    """Computes the plan for a live tree `variables` of obj (see `plan`)."""
    parsed = parse_rules(rules)
    optimizer_state = optimizer_mode(optimizer_state)
    targets = index_targets(obj, variables)
    notes = list(source.notes)
    view = view_at(source, at)
    if at is not None:
        at = at.strip("/")
    else:
        if not parsed and source.kind != "name":
            view, at, note = _auto_at(source, targets, view)
            if note:
                notes.append(note)
    result = _match(source, targets, view, parsed, optimizer_state)
    return dataclasses.replace(result, at=at, notes=tuple(notes) + result.notes, _source=source)


def optimizer_mode(optimizer_state):
    """Validates `optimizer_state`: "auto" (None means the same), True or False."""
    if optimizer_state is None or (isinstance(optimizer_state, str)
                                   and optimizer_state == "auto"):
        return "auto"
    if optimizer_state is True or optimizer_state is False:
        return optimizer_state
    raise errors.InvalidArgumentError(
        f"optimizer_state must be 'auto', True or False. Received: "
        f"optimizer_state={optimizer_state!r}. 'auto' moves optimizer state by the variable it "
        "belongs to when the obj has an optimizer to put it in and skips it otherwise.")


def view_at(source: Source, at: str | None) -> dict:
    """{key within `at`: source key}: the whole source when at is None."""
    if at is None:
        return {key: key for key in source.specs}
    view = source.subtree(at)
    if not view:
        names = ", ".join(f"`{n}`" for n in source.top_level_names) or "none"
        raise errors.StructureMismatchError(
            f"{source.description} has no entries under at={at!r}. Top-level names in the "
            f"source: {names}. Fix: pass one of them as at=..., or at=None for the root.")
    return view


def _fits(source: Source, targets: _Targets, view: dict) -> bool:
    for path, variable in targets.paths.items():
        key = view.get(path)
        if key is None:
            return False
        shape, dtype = source.specs[key]
        if tuple(variable.shape) != tuple(shape) or variable.dtype.base_dtype != dtype:
            return False
    return True


def _auto_at(source, targets, root_view):
    if _fits(source, targets, root_view):
        return root_view, None, ""
    fits = [(name, source.subtree(name)) for name in source.top_level_names]
    fits = [(name, view) for name, view in fits if view and _fits(source, targets, view)]
    if len(fits) == 1:
        name, view = fits[0]
        return view, name, (f"the obj matched the source's `{name}` subtree, not its root; "
                            f"used at={name!r}")
    if len(fits) > 1:
        names = ", ".join(repr(n) for n, _ in fits)
        return root_view, None, (f"several source subtrees match the obj ({names}); pass "
                                 "at=... to pick one")
    return root_view, None, ""


def _match(source: Source, targets: _Targets, view: dict, rules, optimizer_state) -> Plan:
    skipped, skipped_targets, fired = [], set(), set()
    claims: dict = {}  # target -> [(rank, view key, strategy, rule)]
    unmatched, ambiguous, ambiguous_targets, optimizer_left = [], [], set(), []
    rewritten: dict = {}  # unmatched view key -> (rewritten key, rule)
    rank_of = {"exact": 0, "rule": 0, "underscore": 1, "name": 2}
    canon = lambda full: source.aliases.get(full, full)  # noqa: E731
    # A network variable a Keras 3 optimizer lists (`optimizer/_trainable_variables/N`) is
    # the same tensor as its layer path: that edge is no optimizer state of its own.
    network_tensors = {canon(full) for key, full in view.items() if not is_optimizer_key(key)}
    for key, full in view.items():
        if (key in BOOKKEEPING or full in BOOKKEEPING) and key not in targets.paths:
            skipped.append(f"{full}: checkpoint bookkeeping")
            continue
        new, rule = rewrite(key, rules)
        if rule is not None:
            fired.add(rule.index)
        if new is None:
            skipped.append(f"{full}: dropped by {rule}")
            continue
        is_optimizer = is_optimizer_key(key)
        if is_optimizer:  # unless it names a network variable (a module's own `global_step`)
            _, found = _candidates(new, targets, new != key)
            is_optimizer = not (found and all(p in targets.network for p in found))
        if is_optimizer and canon(full) in network_tensors:
            continue
        if is_optimizer and optimizer_state is False:
            skipped.append(f"{full}: optimizer state (pass optimizer_state=True to move it)")
            continue
        if is_optimizer:  # placed by the variable it belongs to, below; by path only after
            optimizer_left.append((key, new))
            continue
        strategy, found = _candidates(new, targets, new != key)
        if len(found) > 1:
            ambiguous.append((full, tuple(found)))
            ambiguous_targets.update(found)
        elif found:
            claims.setdefault(found[0], []).append((rank_of[strategy], key, strategy, rule))
        else:
            unmatched.append(key)
            rewritten[key] = (new, rule)
    chosen: dict = {}  # target -> (view key, strategy, rule)
    for target, entries in claims.items():
        best = min(rank for rank, *_ in entries)
        top = [e for e in entries if e[0] == best]
        if len({canon(view[k]) for _, k, _, _ in top}) == 1:  # one tensor, several keys
            top = [next((e for e in top if e[1] == target), top[0])]
        if len(top) > 1:
            ambiguous.append((target, tuple(view[k] for _, k, _, _ in top)))
            ambiguous_targets.add(target)
        else:
            chosen[target] = top[0][1:]
        unmatched.extend(k for rank, k, _, _ in entries if rank != best)
    notes = []
    if source.kind != "name":
        unmatched, note = _match_structure(source, targets, view, unmatched, chosen,
                                           ambiguous, ambiguous_targets, rewritten)
        if note:
            notes.append(note)
    if optimizer_left and (optimizer_state == "auto" and not targets.optimizer_paths):
        # The obj has no optimizer to put optimizer state in: a weights-only restore, as
        # model.load_weights does. Listed, never silent.
        for key, _ in optimizer_left:
            skipped.append(f"{view[key]}: optimizer state; the obj has no optimizer to put it "
                           "in (compile the model and build its optimizer to move it)")
        optimizer_left = []
    if optimizer_state is True and optimizer_left and not targets.optimizer_paths:
        # Asked to move optimizer state, but there is nowhere to move it: not a silent no-op.
        unmatched.extend(key for key, _ in optimizer_left)
        notes.append(f"optimizer_state=True, but the obj has no optimizer variables to move "
                     f"the source's {len(optimizer_left)} optimizer entries into. Fix: compile "
                     "the model and build its optimizer first "
                     "(model.optimizer.build(model.trainable_variables)), or pass "
                     "optimizer_state=False to skip them.")
        optimizer_left = []
    moved = bool(optimizer_left)
    if optimizer_left:
        _place_optimizer_state(source, targets, view, rules, optimizer_left, chosen,
                               unmatched, skipped, notes)
    # When state moves, a slot of a restored variable that gets no value is missing (a
    # strict restore refuses it); counters and the slots of variables not restored stay.
    owner_of_slot = {slot: owner for (owner, _), slot in targets.slots.items()}
    why = "no source value" if optimizer_state is not False else "optimizer state not moved"
    for path in targets.paths:  # tree order
        if path in chosen:
            continue
        if path in targets.optimizer_paths:
            if moved and owner_of_slot.get(path) in chosen:
                continue  # listed as missing below
            skipped.append(f"{path}: the obj's optimizer variable, left as is ({why})")
            skipped_targets.add(path)
        elif path in targets.rng:
            skipped.append(f"{path}: random generator state (Keras SeedGenerator), left as "
                           "is (no source value)")
            skipped_targets.add(path)
    matches, mismatched = [], []
    for target in targets.paths:
        if target not in chosen:
            continue
        key, strategy, rule = chosen[target]
        match, problem = _checked(Match(target, view[key], strategy, str(rule) if rule else "",
                                        rule.transform if rule is not None else None),
                                  source, targets.paths[target])
        if problem:
            mismatched.append(problem)
        else:
            matches.append(match)
    used = {canon(view[entry[0]]) for entry in chosen.values()}
    seen_unmatched, kept = set(), []
    for key in unmatched:  # one tensor listed once, and not at all when fed under another key
        c = canon(view[key])
        if c not in used and c not in seen_unmatched:
            seen_unmatched.add(c)
            kept.append(key)
    unmatched = kept
    unmatched_variables = tuple(p for p in targets.paths if p not in chosen
                                and p not in ambiguous_targets and p not in skipped_targets)
    unused = tuple(str(r) for r in rules if r.index not in fired)
    if unused:
        warnings.warn(f"{len(unused)} rule(s) matched no key of {source.description}: "
                      + "; ".join(unused), stacklevel=4)
    return Plan(source.description, tuple(matches), unmatched_variables,
                tuple(view[k] for k in unmatched), tuple(ambiguous), tuple(mismatched),
                tuple(skipped), unused, notes=tuple(notes))


def _place_optimizer_state(source, targets, view, rules, optimizer_left, chosen, unmatched,
                           skipped, notes) -> None:
    """Places optimizer entries by the variable they belong to; by path only when safe.

    An entry whose owner the source records goes to the obj's slot of the same role
    on the variable that owner feeds; if that owner feeds nothing, it is skipped and
    listed. An entry with no recorded owner (an iteration counter aside) moves by its
    path only when both sides lay out the network identically (every network
    variable matched by its exact path, nothing left over), where positions agree;
    otherwise it is unmatched, never guessed.
    """
    canon = lambda full: source.aliases.get(full, full)  # noqa: E731
    fed = {canon(view[entry[0]]): target for target, entry in chosen.items()}
    view_of = {canon(full): key for key, full in view.items()}
    key_of_name = {}
    for key, full in view.items():
        name = source.names.get(full, "")
        if name:
            key_of_name[name] = None if name in key_of_name else key
    owners = source.owners()
    network_exact = all(t in chosen and chosen[t][1] == "exact" for t in targets.network
                        if t not in targets.rng) \
        and not any(not is_optimizer_key(k) for k in unmatched)
    if network_exact and _same_optimizer_layout(source, targets, view, optimizer_left, chosen):
        # The same network and the same optimizer layout on both sides (a model restored
        # from its own checkpoint): every entry has its twin at the same path.
        for key, new in optimizer_left:
            chosen[_candidates(new, targets, new != key)[1][0]] = (key, "exact", None)
        return
    orphans = 0
    for key, new in optimizer_left:
        full = view[key]
        counter = None
        if _paths.split_slot(key) is None and not _TF1_SLOT.match(key):
            counter = _COUNTERS.get(key.rsplit("/", 1)[-1].lstrip("_"))
        if counter is not None and counter in targets.counters:
            found = [p for p in targets.counters[counter] if p not in chosen]
            if len(found) > 1:  # several optimizers: the one at the same place
                parent = new.rpartition("/")[0]
                found = [p for p in found if p.rpartition("/")[0] == parent]
            if len(found) == 1:
                chosen[found[0]] = (key, "slot", None)
                continue
        if counter in _HYPERPARAMETERS and counter not in targets.counters:
            skipped.append(f"{full}: a hyperparameter of Keras 2's optimizer; the obj's "
                           "optimizer keeps none of that name")
            continue
        owner, role = owners.get(canon(full), (None, None))
        owner = view_of.get(canon(owner)) if owner is not None else None
        if owner is None:
            owner, role = _owner_by_name(source, view, key, key_of_name)
        if owner is not None:
            target = fed.get(canon(view.get(owner, owner)))
            if target is None:
                rewritten, _ = rewrite(owner, rules)
                if rewritten is not None:
                    _, found = _candidates(rewritten, targets, rewritten != owner)
                    target = found[0] if len(found) == 1 else None
            if target is None:
                skipped.append(f"{full}: optimizer state of `{owner}`, which feeds no variable "
                               "of the obj")
                orphans += 1
                continue
            slot = targets.slots.get((target, _SLOT_ALIASES.get(role, role)))
            if slot is not None and slot not in chosen:
                chosen[slot] = (key, "slot", None)
            else:
                unmatched.append(key)
            continue
        strategy, found = _candidates(new, targets, new != key)
        if (network_exact and len(found) == 1 and found[0] not in chosen
                and found[0] in targets.optimizer_paths):
            chosen[found[0]] = (key, strategy, None)
        elif key.rsplit("/", 1)[-1] in ("beta1_power", "beta2_power") and not found:
            skipped.append(f"{full}: TF1 Adam's running beta power; the obj's optimizer "
                           "computes it from the step count, which moves")
        else:
            unmatched.append(key)
    if orphans:
        notes.append(f"{orphans} optimizer entries of the source belong to variables that feed "
                     "nothing in the obj; they were skipped (listed under skipped)")


_HYPERPARAMETERS = frozenset({"beta_1", "beta_2", "decay", "rho", "epsilon", "momentum"})


def _same_optimizer_layout(source, targets, view, optimizer_left, chosen) -> bool:
    """Whether every optimizer entry has a twin at its own path in the obj (and back),
    with the same shape and, where the source saved names, the same role at the end of
    the name (`adam/dense_kernel_momentum` ~ `adamw/dense_3_kernel_momentum`)."""
    wanted = {p for p in targets.optimizer_paths if p not in chosen}
    found = set()
    for key, new in optimizer_left:
        _, paths = _candidates(new, targets, new != key)
        if len(paths) != 1 or paths[0] not in wanted or paths[0] in found:
            return False
        variable = targets.paths[paths[0]]
        if tuple(variable.shape) != tuple(source.specs[view[key]][0]):
            return False
        name = source.names.get(view[key], "")
        if name and _role_of(name) != _role_of(_compat.variable_name(variable)):
            return False
        found.add(paths[0])
    return found == wanted


def _role_of(name: str) -> str:
    """The role an optimizer variable's name ends in (`..._momentum` -> momentum; the
    owner's part of the name differs between instances: `dense_3_kernel`)."""
    leaf = name.split(":")[0].rsplit("/", 1)[-1]
    known = next((r for r in _KERAS3_ROLES if leaf.endswith("_" + r)), None)
    return known or leaf.rsplit("_", 1)[-1]


def _owner_by_name(source, view, key, key_of_name):
    """(view key of the owner, role) from a TF1 slot name or a saved slot name."""
    parts = _paths.split_slot(key)
    if parts is not None:
        return parts[0], parts[2]
    tf1 = _TF1_SLOT.match(key)
    if tf1 is not None:
        return tf1.group("var"), tf1.group("slot")
    named = _NAMED_SLOT.match(source.names.get(view[key], ""))
    if named is not None and key_of_name.get(named.group("var")):
        return key_of_name[named.group("var")], named.group("slot")
    return None, None


def _match_structure(source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets,
                     rewritten):
    """Saved names, then structure, over the leftovers; returns (still unmatched, note).

    Both run only when no network variable matched by path (the two sides use
    different naming schemes), and each is all or nothing. Keys are taken as
    rules rewrote them, so a rule renaming a leaf takes part.
    """
    if any(p in chosen or p in ambiguous_targets for p in targets.network
           if p not in targets.rng):
        # Names line up at least in part: the rest is for rules, never for a guess.
        return unmatched, ""
    left_targets = [p for p in targets.network if p not in targets.rng]
    src_left = [(rewritten.get(key, (key, None))[0], source.specs[view[key]][0], key)
                for key in unmatched if not is_optimizer_key(key)]
    if not src_left or not left_targets:
        return unmatched, ""
    if len(src_left) != len(left_targets):
        return unmatched, (f"structure: not used: the source has {len(src_left)} network "
                           f"entries, the obj {len(left_targets)} network variables")
    rule_of = {key: rewritten.get(key, (key, None))[1] for _, _, key in src_left}
    pairs = _by_saved_name(source, targets, view, src_left)
    strategy = "keras name"
    amb, note = [], ""
    if pairs is None:
        strategy = "structure"
        holders = targets.holders()
        tgt_left = [(targets.network[p], tuple(targets.paths[p].shape), p) for p in left_targets]
        pairs, amb, note = _structure(src_left, tgt_left,
                                      lambda path: _ROLE_ALIASES.get(holders.get(path), {}))
    for key, target in pairs:
        chosen[target] = (key, strategy, rule_of[key])
    for key, candidates in amb:
        ambiguous.append((view[key], candidates))
        ambiguous_targets.update(candidates)
    used = {k for k, _ in pairs} | {k for k, _ in amb}
    return [k for k in unmatched if k not in used], note


def _by_saved_name(source, targets, view, src_left):
    """Pairs every leftover entry with a network variable by the Keras/TF name it was
    saved under (`Conv1/kernel`, role renames applied), or None unless all pair up
    one to one with equal shapes."""
    if not source.names:
        return None
    holders = None
    index: dict = {}
    for path in targets.network:
        if path in targets.rng:
            continue
        name = _compat.variable_name(targets.paths[path])
        index.setdefault(name, []).append(path)
        head, _, leaf = name.rpartition("/")
        if holders is None:
            holders = targets.holders()
        for old, new in _ROLE_ALIASES.get(holders.get(path), {}).items():
            if leaf.lstrip("_") == new:
                index.setdefault(f"{head}/{old}" if head else old, []).append(path)
    pairs, taken = [], set()
    for _, shape, key in src_left:
        name = source.names.get(view[key], "")
        name = name[:-2] if name.endswith(":0") else name
        found = index.get(name, [])
        if len(found) != 1 or found[0] in taken or \
                tuple(targets.paths[found[0]].shape) != tuple(shape):
            return None
        taken.add(found[0])
        pairs.append((key, found[0]))
    return pairs


def _checked(match: Match, source: Source, variable):
    """Checks shape and dtype (after the rule's transform). Returns (match, problem)."""
    shape, dtype = source.specs[match.source]
    if match.transform is not None:
        shape, dtype, problem = _transformed(match.transform, shape, dtype, match.rule)
        if problem:
            return match, f"`{match.target}` (from `{match.source}`): {problem}"
    origin = ""
    if match.source != match.target or match.transform is not None:
        origin = f" (source entry `{match.source}`{', transformed' if match.transform else ''})"
    if not variable.shape.is_compatible_with(shape):
        return match, (f"`{match.target}`: shape {tuple(shape)} in the source but "
                       f"{tuple(variable.shape)} in the obj{origin}")
    if variable.dtype.base_dtype != dtype:
        return match, (f"`{match.target}`: dtype {dtype.name} in the source but "
                       f"{variable.dtype.base_dtype.name} in the obj{origin}")
    return match, ""


def _transformed(transform, shape, dtype, rule: str):
    """Shape and dtype a rule's transform produces, from metadata (traced, not run)."""
    try:
        fn = tf.function(transform, autograph=False)
        out = fn.get_concrete_function(tf.TensorSpec(shape, dtype)).structured_outputs
        out = tf.nest.flatten(out)
        if len(out) != 1:
            return shape, dtype, f"{rule}: the transform returns {len(out)} tensors, not one"
        return tuple(out[0].shape), out[0].dtype, ""
    except Exception as err:  # the user's callable: any failure is reported, not raised
        return shape, dtype, (f"{rule}: the transform fails on a {dtype.name}{tuple(shape)} "
                              f"input: {type(err).__name__}: {_render.first_line(err)}")


def plan(source, obj, *, rules: Sequence = (), at: str | None = None,
         optimizer_state="auto") -> Plan:
    """Plans a restore of obj from source without changing anything.

    Args:
      source: a `Snapshot`, an object-based prefix or directory, or a
        name-based (TF1 `Saver`) prefix.
      obj: the trackable that would receive the values; it must be built.
      rules: ordered `(regex, replacement)` or `(regex, replacement,
        transform)` rewrites of source keys (see the module docstring).
      at: plan from this subtree of the source (e.g. "model").
      optimizer_state: "auto" (default): like True when obj has optimizer
        slots to put state in, else optimizer entries are skipped and listed.
        True: optimizer slots (Keras 3 `momentum`/`velocity`, Keras 2/tf_keras
        `m`, `v`; TF1 `Adam`/`Adam_1`, `adam_m`/`adam_v`, `Momentum`,
        `RMSProp`, `Adagrad`, `Ftrl`, ...) and step counters (`iterations`,
        `global_step`) move into obj's optimizer variables by the variable
        they belong to, never by position. False: they are skipped and listed.

    Returns:
      A frozen `Plan`; `print(plan.describe())` shows it as a table.

    Example:
      >>> p = objckpt.plan("old/model.ckpt", model, rules=[("^model_001/", "")])
      >>> print(p.describe())
    """
    variables = _tree.tree(obj)
    if not variables:
        raise errors.UnbuiltModelError(
            f"Cannot plan a restore into {type(obj).__name__}: it has no variables yet. Build "
            "it first, or use objckpt.restore_on_create(obj, source) to apply values as "
            "variables are created.")
    return make_plan(open_source(source), obj, variables, rules=rules, at=at,
                     optimizer_state=optimizer_state)


def describe_obj(obj) -> str:
    name = getattr(obj, "name", None)
    return f"{type(obj).__name__}" + (f" `{name}`" if isinstance(name, str) and name else "")


def refuse(obj, variables, source, the_plan: Plan, strict: bool,
            action: str = "restore"):
    """Raises the error that says why `the_plan` cannot be applied (restored or migrated)."""
    nothing = "Nothing was restored" if action == "restore" else "Nothing was written"
    if not variables or (the_plan.unmatched_variables and _compat.is_unbuilt(obj)):
        raise errors.UnbuiltModelError(
            f"Cannot {action} {source.description} into {describe_obj(obj)}: it is not built yet, "
            f"so it has {len(variables)} of the source's {len(source.specs)} variables. "
            f"{nothing}. Fix: build it first (call it on a batch, or model.build(shape)), or "
            "use objckpt.restore_on_create(obj, source) to apply values as variables are created.")
    lines = list(the_plan.mismatched)
    lines += [f"ambiguous, not guessed: `{what}` could be any of "
              + ", ".join(f"`{c}`" for c in candidates) for what, candidates in the_plan.ambiguous]
    if strict:  # the network's problems first: optimizer state follows from them
        missing = sorted(the_plan.unmatched_variables,
                         key=lambda p: is_optimizer_key(p))
        extra = sorted(the_plan.unmatched_source, key=lambda p: is_optimizer_key(p))
        lines += [f"`{p}`: in the obj but missing from the source" for p in missing
                  if not is_optimizer_key(p)]
        lines += [f"`{p}`: in the source but not in the obj" for p in extra
                  if not is_optimizer_key(p)]
        lines += [f"`{p}`: in the obj but missing from the source" for p in missing
                  if is_optimizer_key(p)]
        lines += [f"`{p}`: in the source but not in the obj" for p in extra
                  if is_optimizer_key(p)]
    fixes = []
    if the_plan.mismatched:
        fixes.append("rebuild the obj with the source's shapes and dtypes, or fix the rule's "
                     "transform (strict=False never skips a shape or dtype mismatch)")
    if the_plan.ambiguous:
        fixes.append("add a rule that names the intended source entry exactly")
    if strict and (the_plan.unmatched_variables or the_plan.unmatched_source):
        fixes.append("pass strict=False to restore only what matches")
        fixes.append("add rules=[(regex, replacement), ...] that map source keys onto the obj's "
                     "object paths or variable names (objckpt.plan(source, obj) shows the "
                     "plan)")
        names = ", ".join(repr(n) for n in source.top_level_names)
        if names and the_plan.at is None:
            fixes.append(f"pass at=... if the obj sits under a child of the source's root "
                         f"(top-level names: {names})")
        if any(is_optimizer_key(p) for p in the_plan.unmatched_source) or \
                any("optimizer" in p for p in the_plan.unmatched_variables):
            fixes.append("pass optimizer_state=True to move optimizer state by the variable it "
                         "belongs to, or optimizer_state=False to skip it")
    if source.kind == "name":
        fixes.insert(0, "the source is name-based (TF1 Saver): its keys are global variable "
                        "names such as `" + next(iter(source.specs), "scope/w") + "`; map them "
                        "onto the obj with rules, e.g. rules=[('^model_001/', '')], and check "
                        "with objckpt.plan(source, obj)")
    if not lines:
        lines = [f"no entry of the source matches a variable of the obj "
                 f"({len(variables)} variables, {len(source.specs)} source entries)"]
        fixes.append("check that the source was written for this model, or add rules")
    shown = listed(lines)
    raise errors.StructureMismatchError(
        f"Cannot {action} {source.description} into {describe_obj(obj)}: {len(lines)} problem"
        f"{'s' if len(lines) != 1 else ''}. {nothing}.\n" + "\n".join(shown)
        + "".join(f"\n{note}" for note in the_plan.notes) + "\nFix: " + "; or ".join(fixes)
        + ".", tuple(lines))


def checked_plan(obj, variables, src: Source, *, rules=(), strict: bool = True,
                 at: str | None = None, optimizer_state="auto") -> Plan:
    """The plan restore follows, or the error restore raises for it (nothing assigned)."""
    if not variables:
        refuse(obj, variables, src, Plan(src.description, ()), strict)
    the_plan = make_plan(src, obj, variables, rules=rules, at=at,
                                optimizer_state=optimizer_state)
    if (the_plan.mismatched or the_plan.ambiguous or not the_plan.matches
            or (strict and (the_plan.unmatched_variables or the_plan.unmatched_source))):
        refuse(obj, variables, src, the_plan, strict)
    return the_plan


def listed(items, limit: int = _MAX_LISTED) -> list[str]:
    lines = [f"  - {item}" for item in list(items)[:limit]]
    if len(items) > limit:
        lines.append(f"  - ... and {len(items) - limit} more")
    return lines
