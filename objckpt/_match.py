"""Plans: which source entry feeds which variable, and why.

Every entry point that takes a source (`restore`, `migrate`, `load_ensemble`,
`plan`) matches its keys (`_sources`) to the obj's variables (`_targets`) with
one algorithm, so a plan shown by `objckpt.plan` is exactly what a restore will
do. `_match` runs it in phases over one `_Work` record: claim, choose,
structure, optimizer state, leave alone, result. Strategies, in order:

1. rules (`_rules`): ordered `(regex, replacement[, transform])` rewrites of
   source keys; the first rule whose regex matches a key rewrites it
   (`re.sub(regex, replacement, key, count=1)`), once: rules never chain. A
   None replacement drops the entry. Keys no rule matches stay as they are.
   A rule that rewrote no key is listed: shadowed (another rule took every
   key it matches) or matching no key.
2. a (rewritten) key matches a variable whose object path equals it
   ("exact"), else whose object path equals it with leading underscores
   stripped from every edge ("underscore": `hidden/_kernel` ~
   `hidden/kernel`), else whose variable name equals it ("name": TF1 names
   such as `dense/kernel`; a Keras model's own name may be left off, as in
   `conv/kernel` for `tf1_rewrite/conv/kernel`). Every match whose key a rule
   rewrote reports strategy "rule" (with the rule), whatever matched after
   the rewrite (path, underscores, name, keras name, structure); candidates
   still rank by how they matched, so a rewritten exact path beats a
   rewritten name for one variable. Optimizer state placed by its owner
   reports "slot".
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
4. optimizer state (`_optstate`): by the variable each entry belongs to, never
   by position between different layouts.

A candidate is never guessed between equals: two sources for one variable, or
two variables for one source, are reported as ambiguous.

Imports flow `_sources`, `_rules`, `_targets`, `_optstate` -> here -> `_checks`
(the error for a plan that cannot be applied) -> `_snapshot` (which applies plans).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import tensorflow as tf

from objckpt import _compat, _render, _tree, errors
from objckpt._optstate import place_optimizer_state
from objckpt._roles import ROLE_ALIASES as _ROLE_ALIASES
from objckpt._rules import parse_rules, rewrite_view, warn_unused
from objckpt._sources import Source, open_source
from objckpt._targets import Targets, candidates, index_targets, is_optimizer_key, label

__all__ = ["Match", "Plan", "plan"]


# --- plans ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Match:
    """One variable fed by one source entry.

    Attributes:
      target: the variable's object path in the obj.
      source: the source key (object path or TF1 name) as stored.
      strategy: how the variable was found: "rule" when a rule rewrote the
        source key (whatever then matched: path, underscores, name, keras
        name or structure), else "exact" (object path), "underscore" (path
        with leading underscores stripped), "name" (variable name), "keras
        name" (the Keras name it was saved under), "keras layout" (where
        Keras 3's `save_weights` puts the variable: `layers/dense/vars/0` of
        a `.weights.h5` or `.keras` file), "layer name" (the layer and weight
        names Keras's HDF5 `save_weights("w.h5")` gives the variable:
        `head/dense/kernel` of a Keras 2 `.h5` file), "structure" (layer by
        layer, by role and shape), "export order" (a Keras `model.export`'s
        flat `variables/<i>` list whose saved names do not tell variables
        apart, in `model.variables` order, all or nothing, every shape and
        dtype checked in that order) or "slot" (optimizer state, by the
        variable it belongs to).
      rule: the rule that rewrote the key, described (`rule 0 ('^model_001/'
        -> '')`), or "".
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
      shadowed_rules: rules that rewrote no key although their regex matches
        some (as stored, or as another rule rewrote them): every such key was
        taken by another rule that matched first; each says which and how to
        fix it.
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
    shadowed_rules: tuple[str, ...] = ()
    _source: Source | None = dataclasses.field(default=None, repr=False, compare=False)
    # object path -> (path people know, note), unescaped (see `Targets.display`)
    _labels: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # {optimizer slot path: (path of its variable, role)} in the obj
    _slot_owners: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def slot_of(self, target: str) -> tuple[str, str] | None:
        """(object path of the variable, role) when `target` is one of its optimizer slots."""
        return self._slot_owners.get(target)

    def label(self, target: str) -> str:
        """A variable of the obj as messages show it: the path people know in backquotes and
        its Keras/TF name (`hidden/_kernel` [encoder/kernel]), or whose optimizer slot it is
        (`optimizer/_variables/2` [m of `hidden/_kernel`])."""
        return label(*self.display(target))

    def display(self, target: str) -> tuple[str, str]:
        """(path people know, note) of a variable of the obj, unescaped: a network
        variable's path through its layers and its Keras/TF name, or an optimizer slot's
        path and "m of `hidden/_kernel`"; ("path", "") when there is nothing to add."""
        return self._labels.get(target) or (target, "")

    def _row(self, target: str) -> str:
        shown, note = self.display(target)
        return _render.safe(shown) + (f"  [{_render.safe(note)}]" if note else "")

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
        """A readable table: one line per match, then everything left over.

        Names (object paths, source keys) are shown through `_render.safe` and messages
        through `_render.safe_text`: one line each, whatever the source's names hold.
        """
        safe, text = _render.safe, _render.safe_text
        targets = [self._row(m.target) for m in self.matches]
        width = max([len(t) for t in targets] + [len("variable")])
        lines = [f"plan: {text(self.source)}" + (f" (at={self.at!r})" if self.at else "")
                 + f" -> {len(self.matches)} variables"]
        kind = max([10] + [len(m.strategy) for m in self.matches])  # "keras layout": 12
        lines.append(f"  {'variable'.ljust(width)}  {'strategy'.ljust(kind)}  source")
        for m, target in zip(self.matches, targets):
            rule = f"  [{text(m.rule)}]" if m.rule else ""
            lines.append(f"  {target.ljust(width)}  {m.strategy.ljust(kind)}  "
                         f"{safe(m.source)}{rule}")
        sections = [
            ("variables with no source", [self._row(p) for p in self.unmatched_variables]),
            ("source entries matching nothing", [safe(k) for k in self.unmatched_source]),
            ("ambiguous (not guessed)",
             [f"{safe(what)}: {' | '.join(map(safe, c))}" for what, c in self.ambiguous]),
            ("shape or dtype mismatches", [text(m) for m in self.mismatched]),
            ("skipped", [text(s) for s in self.skipped]),
            ("rules that matched nothing", [text(r) for r in self.unused_rules]),
            ("rules shadowed by another rule", [text(r) for r in self.shadowed_rules]),
        ]
        for title, items in sections:
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines.extend(f"  - {item}" for item in items)
        lines.extend(text(note) for note in self.notes)
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
    owners = targets.slot_owners()
    return dataclasses.replace(result, at=at, notes=tuple(notes) + result.notes, _source=source,
                               mismatched=_labelled(result.mismatched, targets),
                               _labels={p: targets.display(p, owners) for p in targets.paths},
                               _slot_owners=owners)


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
        names = ", ".join(f"`{_render.safe(n)}`" for n in source.top_level_names) or "none"
        raise errors.StructureMismatchError(
            f"{_render.safe_text(source.description)} has no entries under at={at!r}. "
            f"Top-level names in the source: {names}. Fix: pass one of them as at=..., or "
            "at=None for the root.")
    return view


def _fits(source: Source, targets: Targets, view: dict) -> bool:
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


# Strategies of one key, best first: a target claimed by several keys takes the best rank.
_RANK = {"exact": 0, "rule": 0, "keras layout": 0, "underscore": 1, "name": 2,
         "layer name": 3}


@dataclasses.dataclass
class _Work:
    """What planning has decided so far; each phase below reads and extends it."""

    source: Source
    targets: Targets
    view: dict  # key within `at` -> full source key
    rules: tuple
    optimizer_state: object  # "auto", True or False
    skipped: list = dataclasses.field(default_factory=list)
    skipped_targets: set = dataclasses.field(default_factory=set)
    unused_rules: list = dataclasses.field(default_factory=list)  # rules that matched nothing
    shadowed_rules: list = dataclasses.field(default_factory=list)  # rules others shadowed
    claims: dict = dataclasses.field(default_factory=dict)  # target -> [(rank, key, how, rule)]
    chosen: dict = dataclasses.field(default_factory=dict)  # target -> (key, strategy, rule)
    unmatched: list = dataclasses.field(default_factory=list)  # view keys
    rewritten: dict = dataclasses.field(default_factory=dict)  # unmatched key -> (new, rule)
    ambiguous: list = dataclasses.field(default_factory=list)
    ambiguous_targets: set = dataclasses.field(default_factory=set)
    optimizer_left: list = dataclasses.field(default_factory=list)  # (key, rewritten key)
    notes: list = dataclasses.field(default_factory=list)
    moved: bool = False  # optimizer state is being placed

    def canon(self, full: str) -> str:
        """The key a tensor is stored under (a network alias names the same tensor)."""
        return self.source.aliases.get(full, full)


def _match(source: Source, targets: Targets, view: dict, rules, optimizer_state) -> Plan:
    work = _Work(source, targets, view, rules, optimizer_state)
    _claim(work)  # exact, rules, underscores, names; optimizer entries set aside
    _choose(work)  # one key per target, or ambiguous
    if source.kind != "name":  # saved names, then structure, over what is left
        work.unmatched, note = _match_structure(
            source, targets, view, work.unmatched, work.chosen, work.ambiguous,
            work.ambiguous_targets, work.rewritten)
        if note:
            work.notes.append(note)
    _optimizer(work)  # optimizer state by owner (invariant 9)
    _leave_alone(work)  # the obj's optimizer and RNG variables no source value feeds
    return _result(work)


def _claim(work: _Work) -> None:
    """Every source key, rewritten by the rules, claims the targets it names."""
    targets, view = work.targets, work.view
    # A network variable a Keras 3 optimizer lists (`optimizer/_trainable_variables/N`) is
    # the same tensor as its layer path: that edge is no optimizer state of its own.
    network_tensors = {work.canon(full) for key, full in view.items()
                       if not is_optimizer_key(key)}
    rewritten = rewrite_view(view, work.rules, keep=lambda key: key in targets.paths)
    work.skipped.extend(rewritten.skipped)
    work.unused_rules = rewritten.unused
    work.shadowed_rules = rewritten.shadowed
    for key, full, new, rule in rewritten.entries:
        is_optimizer = is_optimizer_key(key)
        if is_optimizer:  # unless it names a network variable (a module's own `global_step`)
            _, found = candidates(new, targets, new != key)
            is_optimizer = not (found and all(p in targets.network for p in found))
        if is_optimizer and work.canon(full) in network_tensors:
            continue
        if is_optimizer and work.optimizer_state is False:
            work.skipped.append(
                f"{full}: optimizer state (pass optimizer_state=True to move it)")
            continue
        if is_optimizer:  # placed by the variable it belongs to, below; by path only after
            work.optimizer_left.append((key, new))
            continue
        strategy, found = candidates(new, targets, new != key)
        if len(found) > 1:
            work.ambiguous.append((full, tuple(found)))
            work.ambiguous_targets.update(found)
        elif found:  # ranked by how it matched; reported as "rule" when a rule rewrote it
            work.claims.setdefault(found[0], []).append(
                (_RANK[strategy], key, "rule" if rule is not None else strategy, rule))
        else:
            work.unmatched.append(key)
            work.rewritten[key] = (new, rule)


def _choose(work: _Work) -> None:
    """Each claimed target takes its best-ranked key; equals are ambiguous, never guessed."""
    view = work.view
    for target, entries in work.claims.items():
        best = min(rank for rank, *_ in entries)
        top = [e for e in entries if e[0] == best]
        if len({work.canon(view[k]) for _, k, _, _ in top}) == 1:  # one tensor, several keys
            top = [next((e for e in top if e[1] == target), top[0])]
        if len(top) > 1:
            work.ambiguous.append((target, tuple(view[k] for _, k, _, _ in top)))
            work.ambiguous_targets.add(target)
        else:
            work.chosen[target] = top[0][1:]
        work.unmatched.extend(k for rank, k, _, _ in entries if rank != best)


def _optimizer(work: _Work) -> None:
    """Optimizer entries set aside by `_claim`: moved by owner, skipped or unmatched."""
    left, targets, view = work.optimizer_left, work.targets, work.view
    if left and (work.optimizer_state == "auto" and not targets.optimizer_paths):
        # The obj has no optimizer to put optimizer state in: a weights-only restore, as
        # model.load_weights does. Listed, never silent.
        for key, _ in left:
            work.skipped.append(
                f"{view[key]}: optimizer state; the obj has no optimizer to put it in "
                "(compile the model and build its optimizer to move it)")
        left = []
    if work.optimizer_state is True and left and not targets.optimizer_paths:
        # Asked to move optimizer state, but there is nowhere to move it: not a silent no-op.
        work.unmatched.extend(key for key, _ in left)
        work.notes.append(
            f"optimizer_state=True, but the obj has no optimizer variables to move the "
            f"source's {len(left)} optimizer entries into. Fix: compile the model and build "
            "its optimizer first (model.optimizer.build(model.trainable_variables)), or pass "
            "optimizer_state=False to skip them.")
        left = []
    work.moved = bool(left)
    if left:
        place_optimizer_state(work.source, targets, view, work.rules, left, work.chosen,
                              work.unmatched, work.skipped, work.notes)


def _leave_alone(work: _Work) -> None:
    """Lists the obj's optimizer and RNG variables that keep their values. When state
    moves, a slot of a restored variable that gets no value is missing instead (a strict
    restore refuses it); counters and the slots of variables not restored stay."""
    targets, chosen = work.targets, work.chosen
    owner_of_slot = {slot: owner for (owner, _), slot in targets.slots.items()}
    owners = targets.slot_owners()
    why = "no source value" if work.optimizer_state is not False else \
        "optimizer state not moved"
    for path in targets.paths:  # tree order
        if path in chosen:
            continue
        if path in targets.optimizer_paths:
            if work.moved and owner_of_slot.get(path) in chosen:
                continue  # listed as missing
            shown, note = work.targets.display(path, owners)
            work.skipped.append(f"{shown}" + (f" [{note}]" if note else "")
                                + f": the obj's optimizer variable, left as is ({why})")
            work.skipped_targets.add(path)
        elif path in targets.rng:
            work.skipped.append(f"{path}: random generator state (Keras SeedGenerator), left "
                                "as is (no source value)")
            work.skipped_targets.add(path)


def _result(work: _Work) -> Plan:
    """Checks every chosen pair's shape and dtype and lists what is left over."""
    source, targets, view, chosen = work.source, work.targets, work.view, work.chosen
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
    used = {work.canon(view[entry[0]]) for entry in chosen.values()}
    seen, unmatched = set(), []
    for key in work.unmatched:  # one tensor listed once; not at all when fed under another key
        tensor = work.canon(view[key])
        if tensor not in used and tensor not in seen:
            seen.add(tensor)
            unmatched.append(key)
    unmatched_variables = tuple(p for p in targets.paths if p not in chosen
                                and p not in work.ambiguous_targets
                                and p not in work.skipped_targets)
    unused = tuple(work.unused_rules)
    warn_unused(work.unused_rules, source.description, stacklevel=5,
                shadowed=work.shadowed_rules)
    return Plan(source.description, tuple(matches), unmatched_variables,
                tuple(view[k] for k in unmatched), tuple(work.ambiguous), tuple(mismatched),
                tuple(work.skipped), unused, notes=tuple(work.notes),
                shadowed_rules=tuple(work.shadowed_rules))


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
    if not pairs and not amb:
        ordered = _by_export_order(source, targets, view, src_left, left_targets)
        if ordered:
            strategy, pairs, note = "export order", ordered, (
                "export order: the source's entries are a Keras `model.export` list "
                "(`variables/0`, `variables/1`, ...) whose saved names do not tell the "
                "variables apart; each was matched to the obj's variable at the same place in "
                "`model.variables`, every shape and dtype checked in that order")
    for key, target in pairs:  # "rule" when a rule rewrote the key (a renamed role)
        chosen[target] = (key, strategy if rule_of[key] is None else "rule", rule_of[key])
    for key, found in amb:
        ambiguous.append((view[key], found))
        ambiguous_targets.update(found)
    used = {k for k, _ in pairs} | {k for k, _ in amb}
    return [k for k in unmatched if k not in used], note


_EXPORT_KEY = re.compile(r"variables/(0|[1-9][0-9]{0,8})")


def _by_export_order(source, targets, view, src_left, left_targets):
    """Pairs a Keras export's flat `variables/<i>` list with the obj's `model.variables`
    in order, or None: only when every leftover key is such an entry, the indexes are
    0..n-1, n is the number of the obj's network variables, and every shape and dtype
    agrees in that order (the list is the exporting model's own `variables`)."""
    index = {}
    for _, _, key in src_left:
        found = _EXPORT_KEY.fullmatch(view[key])
        if found is None:
            return None
        index[int(found.group(1))] = key
    order = [p for p in targets.order() if p in set(left_targets)]
    if sorted(index) != list(range(len(order))) or len(order) != len(left_targets):
        return None
    pairs = []
    for i, path in enumerate(order):
        shape, dtype = source.specs[view[index[i]]]
        variable = targets.paths[path]
        if tuple(variable.shape) != tuple(shape) or variable.dtype.base_dtype != dtype:
            return None
        pairs.append((index[i], path))
    return pairs


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


class _Problem(str):
    """A shape or dtype problem of one match: its text, plus what `_labelled` needs."""

    target: str = ""
    what: str = ""  # "shape (4, 8) in the source but (4, 9) in the obj"
    origin: str = ""  # " (source entry `k`)" or ""
    transformed: bool = False  # the match had a rule's transform


def _problem(target: str, what: str, origin: str, transformed: bool = False) -> _Problem:
    problem = _Problem(f"`{_render.safe(target)}`: {what}{origin}")
    problem.target, problem.what, problem.origin = target, what, origin
    problem.transformed = transformed
    return problem


def _checked(match: Match, source: Source, variable):
    """Checks shape and dtype (after the rule's transform). Returns (match, problem)."""
    shape, dtype = source.specs[match.source]
    key = _render.safe(match.source)  # for messages
    if match.transform is not None:
        shape, dtype, problem = _transformed(match.transform, shape, dtype, match.rule)
        if problem:
            return match, _problem(match.target, problem, f" (from `{key}`)", True)
    origin = ""
    if match.source != match.target or match.transform is not None:
        origin = f" (source entry `{key}`{', transformed' if match.transform else ''})"
    if not variable.shape.is_compatible_with(shape):
        return match, _problem(match.target, f"shape {tuple(shape)} in the source but "
                               f"{tuple(variable.shape)} in the obj", origin,
                               match.transform is not None)
    if variable.dtype.base_dtype != dtype:
        return match, _problem(match.target, f"dtype {dtype.name} in the source but "
                               f"{variable.dtype.base_dtype.name} in the obj", origin,
                               match.transform is not None)
    return match, ""


def _labelled(problems, targets: Targets) -> tuple[str, ...]:
    """Problems as messages show them: each variable by the path people know and its
    Keras/TF name, one line per network variable; an optimizer slot with the same problem
    as its variable is summarised on the variable's line, not repeated."""
    owners = targets.slot_owners()
    by_target = {getattr(p, "target", ""): p for p in problems}
    folded: dict = {}  # owner tree path -> [roles]
    for problem in problems:
        owner = owners.get(getattr(problem, "target", ""))
        if owner is not None and owner[0] in by_target and \
                by_target[owner[0]].what == problem.what:
            folded.setdefault(owner[0], []).append(owner[1])
    lines = []
    for problem in problems:
        target = getattr(problem, "target", "")
        if not target:  # not ours: kept as it is
            lines.append(problem)
            continue
        owner = owners.get(target)
        if owner is not None and target not in folded and owner[0] in folded and \
                owner[1] in folded[owner[0]]:
            continue
        roles = folded.get(target)
        slots = (f" (also its optimizer slots {', '.join(map(_render.safe, roles))})"
                 if roles else "")
        line = _Problem(f"{targets.label(target, owners)}: {problem.what}{slots}{problem.origin}")
        line.target, line.what, line.origin = target, problem.what, problem.origin
        line.transformed = problem.transformed
        lines.append(line)
    return tuple(lines)


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
        transform)` rewrites of source keys. Each source key is rewritten by
        the FIRST rule whose regex matches it, `re.sub(regex, replacement,
        key, count=1)`, once: rules never chain, so a later rule never sees
        what an earlier one made of a key. A replacement of None drops the
        entry; keys no rule matches stay as they are. The rewritten key then
        matches a variable by object path, by object path with leading
        underscores stripped (`hidden/kernel` ~ `hidden/_kernel`), or by
        variable name; such rows say strategy "rule". To chain, write one
        rule whose regex does the whole rewrite (`("^model_001/dense/",
        "hidden/")`, not `("^model_001/", "")` then `("^dense/", "hidden/")`),
        or several rules that each match the full original key. A rule that
        rewrote no key warns and is listed: in `shadowed_rules` when other
        rules took every key it matches (naming them), else in
        `unused_rules`. A transform (tensor -> tensor, e.g. `tf.transpose`)
        changes the values of the entries its rule rewrote.
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
