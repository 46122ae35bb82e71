"""Plans and their matches: what `objckpt.plan` returns, and how a matched pair is checked.

`Match` is one variable fed by one source entry, `Plan` the whole answer (with `describe()`,
and the names people know for each variable: `label`, `display`, `slot_of`). `check_match`
checks a pair's shape and dtype (after a rule's transform, traced, not run) and `labelled`
words the problems for messages: each variable by the path people know and its Keras/TF
name, one line per network variable with its optimizer slots summarised on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._planning import stacking as _stacking
from objckpt._planning.sources import Source
from objckpt._planning.targets import Targets, label
from objckpt.rules import core as _core

__all__ = ["Match", "Plan", "check_match", "labelled"]


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
        dtype checked in that order), "slot" (optimizer state, by the
        variable it belongs to) or "part" (one part of a TF1 partitioned
        variable that TF tracks part by part, `tf.compat.v1.make_template`'s:
        its slice of the one key a Saver wrote for the whole).
      rule: the rule that rewrote the key, described (`rule 0 ('^model_001/'
        -> '')`), or "".
      cast: the dtype cast the value gets on its way into the variable, as the casting
        policy allows it ("bfloat16 -> float32"), or "" (the same dtype).
    """

    target: str
    source: str
    strategy: str
    rule: str = ""
    transform: Callable | None = dataclasses.field(default=None, repr=False, compare=False)
    cast: str = ""


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
      proposed: where no rule fits (`objckpt.plan` without rules, entries and variables
        left over), an `objckpt.rules.RuleSet` proposed from names and shapes, shown as
        Python by `describe()`: a suggestion to review, never applied on its own; else None.
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
    # (path, role) of the obj's optimizer slots that start as a fresh optimizer's: their
    # variable is restored, but the source's optimizer held no state for it.
    fresh: tuple[tuple[str, str], ...] = ()
    proposed: object = None  # objckpt.rules.RuleSet | None
    _source: Source | None = dataclasses.field(default=None, repr=False, compare=False)
    # object path -> (path people know, note), unescaped (see `Targets.display`)
    _labels: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # {optimizer slot path: (path of its variable, role)} in the obj
    _slot_owners: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # {unmatched source key: the key a rule rewrote it to}, for keys a rule changed
    _rewritten: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # {source key: _stacking.Stacked} of the keys that stand for entries a Stack rule
    # stacks into one variable
    _stacks: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # {source key: how it is stored} of the keys stored in slices (`Source.parts`)
    _parts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def opened(self, src):
        """The source `src` as this plan reads it: where its rules stack entries into one
        variable, a view of `src` that has the stacked keys (`_stacking.restacked`); else
        `src` itself."""
        if not self._stacks or src is None or all(k in src.specs for k in self._stacks):
            return src  # none, or a view that has them already
        return _stacking.restacked(src, self._stacks)

    def rewritten_key(self, key: str) -> str | None:
        """The key a rule rewrote the unmatched source entry `key` to; None when no rule
        changed it."""
        return self._rewritten.get(key)

    def source_label(self, key: str) -> str:
        """An unmatched source key as messages show it, with what the rules made of it:
        `legacy/w` -> `fc/w` (the rewritten key is what matched nothing)."""
        new = self._rewritten.get(key)
        return f"`{_render.safe(key)}`" + (f" -> `{_render.safe(new)}`" if new else "")

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

    @property
    def casts(self) -> dict[str, str]:
        """{object path: "bfloat16 -> float32"} of the matches whose values are cast."""
        return {m.target: m.cast for m in self.matches if m.cast}

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
            parts = f"  [{text(self._parts[m.source])}]" if m.source in self._parts else ""
            lines.append(f"  {target.ljust(width)}  {m.strategy.ljust(kind)}  "
                         f"{safe(m.source)}{parts}{rule}")
        sections = [
            ("variables with no source", [self._row(p) for p in self.unmatched_variables]),
            ("source entries matching nothing",
             [safe(k) + (f" -> {safe(self._rewritten[k])}" if k in self._rewritten else "")
              for k in self.unmatched_source]),
            ("ambiguous (not guessed)",
             [f"{safe(what)}: {' | '.join(map(safe, c))}" for what, c in self.ambiguous]),
            ("dtype casts", [f"{self._row(m.target)}: {m.cast}" for m in self.matches
                             if m.cast]),
            ("shape or dtype mismatches", [text(m) for m in self.mismatched]),
            ("skipped", [text(s) for s in _render.grouped(self.skipped)]),
            ("rules that matched nothing", [text(r) for r in self.unused_rules]),
            ("rules shadowed by another rule", [text(r) for r in self.shadowed_rules]),
        ]
        counted = {"skipped": len(self.skipped)}  # its lines group entries by reason
        for title, items in sections:
            if items:
                lines.append(f"{title} ({counted.get(title, len(items))}):")
                lines.extend(f"  - {item}" for item in items)
        lines.extend(text(note) for note in self.notes)
        if self.proposed is not None:
            lines.append(f"proposed rules ({len(self.proposed)}; from names and shapes, never "
                         "applied on their own: review them, then pass rules=plan.proposed):")
            lines.extend("  " + line for line in _proposal_lines(self.proposed))
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
                "Fix: make a new one with objckpt.plan(obj, source).")
        return self.opened(self._source).fetch(keys)

    def detached(self) -> Plan:
        """This plan without its source (it keeps no source tensors alive)."""
        return dataclasses.replace(self, _source=None)


def _proposal_lines(proposed) -> list[str]:
    """A proposed rule set as Python lines a user can paste (names escaped as `repr`)."""
    used: set = set()
    for rule in proposed:
        stack = [rule.transform]
        while stack:
            transform = stack.pop()
            if transform is not None:
                used.add(type(transform).__name__)
                stack.extend(getattr(transform, "transforms", ()))
    lines = ["from objckpt.rules import " + ", ".join(["Rule", "RuleSet", *sorted(used)]),
             "rules = RuleSet(["]
    lines += [f"    {_render.safe_text(repr(rule))}," for rule in proposed]
    return [*lines, "])"]


class _Problem(str):
    """A shape or dtype problem of one match: its text, plus what `_labelled` needs."""

    target: str = ""
    what: str = ""  # "shape (4, 8) in the source but (4, 9) in the obj"
    origin: str = ""  # " (source entry `k`)" or ""
    transformed: bool = False  # the match had a rule's transform
    lossy: bool = False  # a dtype that cast="lossy" would cast


def _problem(target: str, what: str, origin: str, transformed: bool = False) -> _Problem:
    problem = _Problem(f"`{_render.safe(target)}`: {what}{origin}")
    problem.target, problem.what, problem.origin = target, what, origin
    problem.transformed = transformed
    return problem


def check_match(match: Match, source: Source, variable, shown: dict | None = None,
                target_shown: str = "", cast: str = "lossless"):
    """Checks shape and dtype (after the rule's transform) by the one rule
    (`_compat.misfit`, with the casting policy `cast`). Returns (match, problem); a match
    whose value is cast says so (`Match.cast`).

    `shown` maps a source key to the key people know for the same tensor (its path through
    the network, not the optimizer list TF's walk reached it by first), for messages;
    `target_shown` the path people know for the variable: an entry of that same path is not
    named again."""
    shape, dtype = source.specs[match.source]
    key = _render.safe((shown or {}).get(match.source, match.source))  # for messages
    if match.transform is not None:
        shape, dtype, problem = _transformed(match.transform, shape, dtype, match.rule)
        if problem:
            return match, _problem(match.target, problem, f" (from `{key}`)", True)
    origin = ""
    if match.source not in (match.target, target_shown) or match.transform is not None:
        origin = f" (source entry `{key}`{', transformed' if match.transform else ''})"
    wrong = _compat.misfit((shape, dtype), variable, cast)
    if wrong == "shape":
        return match, _problem(match.target, f"shape {tuple(shape)} in the source but "
                               f"{tuple(variable.shape)} in the obj", origin,
                               match.transform is not None)
    if wrong == "dtype":
        lossy = _compat.fits((shape, dtype), variable, "lossy")
        problem = _problem(match.target, f"dtype {dtype.name} in the source but "
                           f"{variable.dtype.base_dtype.name} in the obj"
                           + (" (a lossy cast)" if lossy else ""), origin,
                           match.transform is not None)
        problem.lossy = lossy
        return match, problem
    made = _compat.cast_of((shape, dtype), variable)
    return (dataclasses.replace(match, cast=made) if made else match), ""


def labelled(problems, targets: Targets) -> tuple[str, ...]:
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
        line.lossy = getattr(problem, "lossy", False)
        lines.append(line)
    return tuple(lines)


# What `_traced` found for objckpt's own transforms, by (transform, shape, dtype): a model's
# layers share a few transforms and shapes, and each trace costs milliseconds.
_TRACED: dict = {}
_TRACED_MAX = 4096


def _own(transform) -> bool:
    """Whether `transform` is made only of `objckpt.rules`' transforms (values: equal ones
    give equal results on equal specs)."""
    if type(transform) is _core.Chain:
        return all(_own(t) for t in transform.transforms)
    return type(transform) in (_core.Transpose, _core.Reshape, _core.ConvKernel, _core.Split)


def _transformed(transform, shape, dtype, rule: str):
    """Shape and dtype a rule's transform produces, from metadata (traced, not run)."""
    if not _own(transform):
        shape, dtype, problem = _traced(transform, shape, dtype)
    else:
        key = (transform, tuple(shape), dtype)
        found = _TRACED.get(key)
        if found is None:
            found = _traced(transform, shape, dtype)
            if len(_TRACED) >= _TRACED_MAX:
                _TRACED.clear()
            _TRACED[key] = found
        shape, dtype, problem = found
    return shape, dtype, (f"{rule}: {problem}" if problem else "")


def _traced(transform, shape, dtype):
    """(shape, dtype, problem or "") of `transform` traced on a spec of `shape`, `dtype`."""
    try:
        fn = tf.function(transform, autograph=False)
        out = fn.get_concrete_function(tf.TensorSpec(shape, dtype)).structured_outputs
        out = tf.nest.flatten(out)
        if len(out) != 1:
            return shape, dtype, f"the transform returns {len(out)} tensors, not one"
        return tuple(out[0].shape), out[0].dtype, ""
    except Exception as err:  # the user's callable: any failure is reported, not raised
        return shape, dtype, (f"the transform fails on a {dtype.name}{tuple(shape)} "
                              f"input: {type(err).__name__}: {_render.first_line(err)}")
