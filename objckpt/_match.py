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
3. "structure": when no network variable matched by name at all (the two
   object graphs use different naming schemes), an object-based source's
   entries are matched layer by layer, in depth-first order, by weight role
   (kernel, bias, gamma, moving_mean, ...) and shape, if and only if the two
   sequences of layers line up exactly. This is what carries a Keras 2 / tf_keras checkpoint
   (`layer_with_weights-0/kernel`) into the same architecture in Keras 3
   (`_functional/_operations/1/_kernel`).

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

from objckpt import _compat, _tree, errors

__all__ = ["Match", "Plan", "plan"]

_MAX_LISTED = 20
# Entries tf.train.Checkpoint or Saver add for themselves; never "unexpected".
BOOKKEEPING = frozenset({"save_counter", _compat.OBJECT_GRAPH_KEY})

# Optimizer slot names of every flavour -> one canonical role: "m" is the first
# moment or momentum buffer, "v" the second moment (Adam v, RMSprop rms).
_SLOT_ALIASES = {
    "m": "m", "Adam": "m", "momentum": "m", "Momentum": "m", "RMSProp_1": "m",
    "v": "v", "Adam_1": "v", "rms": "v", "RMSProp": "v", "velocity": "v",
    "vhat": "vhat", "velocity_hat": "vhat", "mg": "mg", "average_gradient": "mg",
    "accumulator": "accumulator", "Adagrad": "accumulator",
}
# A tf_keras (2.11+) / Keras 3 optimizer variable's saved name: `<opt>/<slot>/<variable name>`.
_NAMED_SLOT = re.compile(r"^(?:[^/]+/)?(?P<slot>m|v|vhat|momentum|velocity|velocity_hat|"
                         r"average_gradient|accumulator)/(?P<var>.+?)(?::0)?$")
_TF1_SLOT = re.compile(r"^(?P<var>.+)/(?P<slot>Adam|Adam_1|Momentum|RMSProp|RMSProp_1|Adagrad)$")
_COUNTERS = {"iter": "iterations", "iterations": "iterations", "global_step": "iterations",
             "learning_rate": "learning_rate", "lr": "learning_rate"}


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
    # Returns everything planning reads but `names` (which only places optimizer slots
    # when optimizer_state=True), hashable: two sources with equal structures get the
    # same plan for the same obj unless optimizer state is moved (load_ensemble plans
    # once per structure). Computed on request only. None: unknown.
    structure: Callable | None = None


def _prefix_subtree(keys, at: str) -> dict:
    """Keys under `at` by path prefix; a slot belongs when its variable and optimizer do."""
    head = at.strip("/") + "/"
    view = {}
    for key in keys:
        slot = _tree.split_slot(key)
        if slot is None:
            if key.startswith(head):
                view[key[len(head):]] = key
        else:
            variable, optimizer, name = slot
            if variable.startswith(head) and optimizer.startswith(head):
                view[f"{variable[len(head):]}/{_compat.OPTIMIZER_SLOT}/"
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
            f"missing. Received from TF: {_tree._first_line(err)}. Nothing was changed; "
            "use another checkpoint.") from err


def _object_source(prefix: str, notes) -> Source:
    entries = _tree._read_tree_at(prefix)
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
        {path: e.name for path, e in entries.items() if e.name}, aliases, structure)


def _name_source(prefix: str, notes) -> Source:
    reader = _tree._open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    specs = {name: (tuple(shapes[name]), tf.as_dtype(dtypes[name])) for name in sorted(shapes)}
    return Source(
        f"name-based checkpoint `{prefix}`", "name", specs,
        lambda names: _restore_v2(prefix, list(names), [specs[n][1] for n in names]),
        lambda at: _prefix_subtree(specs, at), _top_names(specs), prefix, tuple(notes),
        structure=lambda: ("name", tuple(specs.items()), tuple(notes)))


def snapshot_source(items: dict, aliases: dict | None = None) -> Source:
    """A Source over an in-memory mapping path -> tensor (a Snapshot).

    aliases: extra key -> key in items (network paths of a trained Keras 3 model).
    """
    aliases = {a: k for a, k in (aliases or {}).items() if k in items and a not in items}
    specs = {path: (tuple(value.shape), value.dtype) for path, value in items.items()}
    for alias, key in aliases.items():
        specs[alias] = specs[key]
    return Source("Snapshot", "snapshot", specs,
                  lambda paths: [items[aliases.get(p, p)] for p in paths],
                  lambda at: _prefix_subtree(specs, at), _top_names(specs), aliases=aliases,
                  structure=lambda: ("snapshot", tuple(specs.items()),
                                     tuple(aliases.items())))


def open_source(source) -> Source:
    """Opens a Snapshot, prefix or directory; name-based prefixes included."""
    as_source = getattr(source, "_as_source", None)
    if callable(as_source):
        return as_source()
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise errors.UnsupportedObjectError(
            "A source must be an objckpt.Snapshot, a checkpoint prefix or a directory of "
            f"checkpoints. Received: source of type {type(source).__name__}. Fix: pass "
            "objckpt.snapshot(obj) or a path.")
    prefix, notes = _tree.resolve_prefix(source)
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


def _rewrite(key: str, rules: tuple[_Rule, ...]):
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
      strategy: "exact", "rule", "underscore", "name", "structure" or "slot".
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


def _strip(path: str) -> str:
    return "/".join(edge.lstrip("_") or edge for edge in path.split("/"))


def _is_optimizer_key(key: str) -> bool:
    edges = key.split("/")
    return (_compat.OPTIMIZER_SLOT in edges or "optimizer" in edges or "_optimizer" in edges
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
    counters: dict  # "iterations" / "learning_rate" -> tree path
    optimizer_paths: frozenset


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
    optimizer_paths = frozenset(p for p in variables if p not in network)
    slots, counters = {}, {}
    for path in variables:  # slot variables (Keras 2, tf_keras < 2.11 optimizers, TF1)
        parts = _tree.split_slot(path)
        if parts is not None:
            slots[(parts[0], _SLOT_ALIASES.get(parts[2], parts[2]))] = path
    for variable, role, slot_variable in _compat.optimizer_slot_lists(obj, variables.values()):
        if id(variable) in path_of and id(slot_variable) in path_of:
            slots[(path_of[id(variable)], role)] = path_of[id(slot_variable)]
    for name, counter in _compat.optimizer_counters(obj):
        if id(counter) in path_of:
            counters[name] = path_of[id(counter)]
    return _Targets(dict(variables), by_strip, by_name, network, slots, counters,
                    optimizer_paths)


def _candidates(key: str, targets: _Targets, rewritten: bool):
    """Returns (strategy, [target paths]) for one rewritten key, best strategy first."""
    if key in targets.paths:
        return ("rule" if rewritten else "exact"), [key]
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


def _structure(source_left, target_left):
    """Matches leftovers layer by layer. Returns (pairs, ambiguous, note)."""
    src_layers = _layers(source_left)
    tgt_layers = _layers(target_left)
    if len(src_layers) != len(tgt_layers):
        return [], [], (f"structure: not used: the source has {len(src_layers)} unmatched "
                        f"layers with weights, the obj {len(tgt_layers)}")
    pairs, ambiguous = [], []
    for (src_name, src), (tgt_name, tgt) in zip(src_layers, tgt_layers):
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
    rank_of = {"exact": 0, "rule": 0, "underscore": 1, "name": 2}
    for key, full in view.items():
        if (key in BOOKKEEPING or full in BOOKKEEPING) and key not in targets.paths:
            skipped.append(f"{full}: checkpoint bookkeeping")
            continue
        new, rule = _rewrite(key, rules)
        if rule is not None:
            fired.add(rule.index)
        if new is None:
            skipped.append(f"{full}: dropped by {rule}")
            continue
        is_optimizer = optimizer_state is not None and _is_optimizer_key(key)
        if is_optimizer:  # unless it names a network variable (a module's own `global_step`)
            _, found = _candidates(new, targets, new != key)
            is_optimizer = not (found and all(p in targets.network for p in found))
        if is_optimizer and not optimizer_state:
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
    chosen: dict = {}  # target -> (view key, strategy, rule)
    for target, entries in claims.items():
        best = min(rank for rank, *_ in entries)
        top = [e for e in entries if e[0] == best]
        if len(top) > 1:
            ambiguous.append((target, tuple(view[k] for _, k, _, _ in top)))
            ambiguous_targets.add(target)
        else:
            chosen[target] = top[0][1:]
        unmatched.extend(k for rank, k, _, _ in entries if rank != best)
    notes = []
    if source.kind != "name":
        unmatched, note = _match_structure(source, targets, view, unmatched, chosen,
                                           ambiguous, ambiguous_targets)
        if note:
            notes.append(note)
    if optimizer_state and optimizer_left and not targets.optimizer_paths:
        # Asked to move optimizer state, but there is nowhere to move it: not a silent no-op.
        unmatched.extend(key for key, _ in optimizer_left)
        notes.append(f"optimizer_state=True, but the obj has no optimizer variables to move "
                     f"the source's {len(optimizer_left)} optimizer entries into. Fix: compile "
                     "the model and build its optimizer first "
                     "(model.optimizer.build(model.trainable_variables)), or pass "
                     "optimizer_state=False to skip them.")
        optimizer_left = []
    if optimizer_state:
        source_of = {entry[0]: target for target, entry in chosen.items()}
        key_of_name = {source.names.get(full, ""): key for key, full in view.items()}
        by_path = []
        for key, new in optimizer_left:
            target = _optimizer_target(source, view, key, source_of, key_of_name, targets, rules)
            if target is not None and target not in chosen:
                chosen[target] = (key, "slot", None)
            else:
                by_path.append((key, new))
        for key, new in by_path:  # same layout on both sides (e.g. Keras 3 to Keras 3)
            strategy, found = _candidates(new, targets, new != key)
            if len(found) == 1 and found[0] not in chosen and found[0] in targets.optimizer_paths:
                chosen[found[0]] = (key, strategy, None)
            else:
                skipped.append(f"{view[key]}: no optimizer variable of the obj matches it")
    if optimizer_state is not None:
        why = "no source value" if optimizer_state else "optimizer state not moved"
        for path in targets.paths:  # tree order
            if path in targets.optimizer_paths and path not in chosen:
                skipped.append(f"{path}: the obj's optimizer variable, left as is ({why})")
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
    canon = lambda full: source.aliases.get(full, full)  # noqa: E731
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


def _match_structure(source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets):
    """Structure strategy over the leftovers; returns (still unmatched keys, note)."""
    if any(p in chosen or p in ambiguous_targets for p in targets.network):
        # Names line up at least in part: the rest is for rules, never for a guess.
        return unmatched, ""
    left_targets = list(targets.network)
    src_left = [(key, source.specs[view[key]][0], key) for key in unmatched
                if not _is_optimizer_key(key)]
    if not src_left or not left_targets:
        return unmatched, ""
    if len(src_left) != len(left_targets):
        return unmatched, (f"structure: not used: the source has {len(src_left)} network "
                           f"entries, the obj {len(left_targets)} network variables")
    tgt_left = [(targets.network[p], tuple(targets.paths[p].shape), p) for p in left_targets]
    pairs, amb, note = _structure(src_left, tgt_left)
    for key, target in pairs:
        chosen[target] = (key, "structure", None)
    for key, candidates in amb:
        ambiguous.append((view[key], candidates))
        ambiguous_targets.update(candidates)
    used = {k for k, _ in pairs} | {k for k, _ in amb}
    return [k for k in unmatched if k not in used], note


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


def _optimizer_target(source, view, key, source_of, key_of_name, targets: _Targets, rules):
    """The obj's optimizer variable a source optimizer entry belongs in, or None."""
    counter = _COUNTERS.get(key.rsplit("/", 1)[-1].lstrip("_"))
    if counter is not None:
        return targets.counters.get(counter)
    variable_key = slot_name = None
    parts = _tree.split_slot(key)
    if parts is not None:
        variable_key, _, slot_name = parts
    elif (tf1 := _TF1_SLOT.match(key)) is not None:
        variable_key, slot_name = tf1.group("var"), tf1.group("slot")
    elif (named := _NAMED_SLOT.match(source.names.get(view[key], ""))) is not None:
        variable_key, slot_name = key_of_name.get(named.group("var")), named.group("slot")
    if variable_key is None:
        return None
    target = source_of.get(variable_key)
    if target is None:
        rewritten, _ = _rewrite(variable_key, rules)
        if rewritten is not None:
            _, found = _candidates(rewritten, targets, rewritten != variable_key)
            target = found[0] if len(found) == 1 else None
    if target is None:
        return None
    return targets.slots.get((target, _SLOT_ALIASES.get(slot_name, slot_name)))


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
                              f"input: {type(err).__name__}: {_tree._first_line(err)}")


def plan(source, obj, *, rules: Sequence = (), at: str | None = None,
         optimizer_state: bool | None = None) -> Plan:
    """Plans a restore of obj from source without changing anything.

    Args:
      source: a `Snapshot`, an object-based prefix or directory, or a
        name-based (TF1 `Saver`) prefix.
      obj: the trackable that would receive the values; it must be built.
      rules: ordered `(regex, replacement)` or `(regex, replacement,
        transform)` rewrites of source keys (see the module docstring).
      at: plan from this subtree of the source (e.g. "model").
      optimizer_state: None (default): optimizer entries are matched like any
        other. True: optimizer slots (Keras 2/tf_keras `m`, `v`; TF1 `Adam`,
        `Adam_1`) and step counters move into obj's optimizer variables by the
        variable they belong to. False: they are skipped and listed.

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


def listed(items, limit: int = _MAX_LISTED) -> list[str]:
    lines = [f"  - {item}" for item in list(items)[:limit]]
    if len(items) > limit:
        lines.append(f"  - ... and {len(items) - limit} more")
    return lines
