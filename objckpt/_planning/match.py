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

Imports flow `_sources`, `_rules`, `_targets`, `_optstate`, `_plans` (`Plan`, `Match`, the
check of a matched pair), `_strategies` (keras name, structure, export order) -> here ->
`_checks` (the error for a plan that cannot be applied) -> `_pipeline` (the stages that apply plans).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._planning.optstate import place_optimizer_state
from objckpt._planning.plans import Match, Plan, check_match, labelled
from objckpt._planning.rules import parse_rules, rewrite_view, warn_unused
from objckpt._planning.sources import Source
from objckpt._planning.stacking import stacked_view
from objckpt._planning.strategies import match_structure
from objckpt._planning.targets import Targets, candidates, index_targets, is_optimizer_key
from objckpt.rules.core import NOWHERE

__all__ = ["Match", "Plan", "check_strict", "optimizer_entries", "optimizer_slots_in", "plan",
           "recorded_owners"]


def make_plan(source: Source, obj, variables, *, rules=(), at=None,
              optimizer_state=None, cast: str = "lossless") -> Plan:
    """Computes the plan for a live tree `variables` of obj (see `plan`); `cast`: the
    casting policy's option ("lossless" or "lossy", `_compat.misfit`)."""
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
    kinds = {kind.__name__ for kind in type(obj).__mro__}
    source, view, stacks = stacked_view(source, view, parsed)  # many entries -> one
    result = _match(source, targets, view, parsed, optimizer_state, cast, kinds, stacks)
    owners = targets.slot_owners()
    return dataclasses.replace(result, at=at, notes=tuple(notes) + result.notes, _source=source,
                               mismatched=labelled(result.mismatched, targets),
                               _labels={p: targets.display(p, owners) for p in targets.paths},
                               _slot_owners=owners,
                               _stacks={g.full: g for g in stacks.values()},
                               _parts=dict(source.parts))


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
        "belongs to when the obj has an optimizer to put it in and skips it otherwise. Fix: "
        "pass one of 'auto', True, False.")


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


# More top-level names than this that may each hold the obj (a crafted file, or a very
# large ensemble) are reported as several without checking each subtree in full.
_MAX_AT_CANDIDATES = 64
_MAX_AT_LISTED = 10  # names listed in the note; the rest are counted


def _auto_at(source, targets, root_view):
    """The view the obj is planned from when no `at` is given: the root's, else the one
    top-level subtree it fits. Linear in the source's nodes and entries: the names whose
    subtree cannot hold the obj's paths are dropped in one pass (`Source.holding`), and only
    the few left are checked in full."""
    if _fits(source, targets, root_view):
        return root_view, None, ""
    names = source.top_level_names
    if source.holding is not None:
        names = source.holding({path: (tuple(variable.shape), variable.dtype.base_dtype)
                                for path, variable in targets.paths.items()})
        if len(names) > _MAX_AT_CANDIDATES:
            return root_view, None, _several(names)
    fits = [(name, source.subtree(name)) for name in names]
    fits = [(name, view) for name, view in fits if view and _fits(source, targets, view)]
    if len(fits) == 1:
        name, view = fits[0]
        return view, name, (f"the obj matched the source's `{name}` subtree, not its root; "
                            f"used at={name!r}")
    if len(fits) > 1:
        return root_view, None, _several([n for n, _ in fits])
    return root_view, None, ""


def _several(names) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_AT_LISTED])
    if len(names) > _MAX_AT_LISTED:
        shown += f" and {len(names) - _MAX_AT_LISTED:,} more"
    return f"several source subtrees match the obj ({shown}); pass at=... to pick one"


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
    fresh: list = dataclasses.field(default_factory=list)  # (slot path, role): start fresh
    cast: str = "lossless"  # the casting policy's option
    moved: bool = False  # optimizer state is being placed
    # Keys that rules sharing a source pattern fan out to several targets (`Rule.also`):
    # key -> [(rewritten key, rule)]; a fanned-out key a target misses stays unmatched.
    fanned: dict = dataclasses.field(default_factory=dict)
    forced: set = dataclasses.field(default_factory=set)  # unmatched although it feeds some
    kinds: set = dataclasses.field(default_factory=set)  # the obj's class names (its MRO)
    # Keys that stand for the entries a Stack rule makes one variable of (`_stacking`).
    stacks: dict = dataclasses.field(default_factory=dict)
    # target -> the transform taking its slice of a partitioned key (`_parts`)
    slices: dict = dataclasses.field(default_factory=dict)

    def canon(self, full: str) -> str:
        """The key a tensor is stored under (a network alias names the same tensor)."""
        return self.source.aliases.get(full, full)


def _match(source: Source, targets: Targets, view: dict, rules, optimizer_state,
           cast: str = "lossless", kinds=(), stacks=None) -> Plan:
    work = _Work(source, targets, view, rules, optimizer_state, cast=cast, kinds=set(kinds),
                 stacks=dict(stacks or {}))
    _claim(work)  # exact, rules, underscores, names; optimizer entries set aside
    _choose(work)  # one key per target, or ambiguous
    _parts(work)  # parts tracked one by one (make_template's), each its slice of one key
    if source.kind != "name":  # saved names, then structure, over what is left
        work.unmatched, note = match_structure(
            source, targets, view, work.unmatched, work.chosen, work.ambiguous,
            work.ambiguous_targets, work.rewritten)
        if note:
            work.notes.append(note)
    _optimizer(work)  # optimizer state by owner (invariant 9)
    _leave_alone(work)  # the obj's optimizer and RNG variables no source value feeds
    _absent(work)  # variables the source's class lacks (a pooler), with the reason
    return _result(work)


def _claim(work: _Work) -> None:
    """Every source key, rewritten by the rules, claims the targets it names."""
    targets, view = work.targets, work.view
    # A network variable a Keras 3 optimizer lists (`optimizer/_trainable_variables/N`) is
    # the same tensor as its layer path: that edge is no optimizer state of its own.
    network_tensors = {work.canon(full) for key, full in view.items()
                       if not is_optimizer_key(key)}
    rewritten = rewrite_view(view, work.rules, keep=lambda key: key in targets.paths,
                             stacks=work.stacks)
    fanning = {r.index for lead in work.rules for r in lead.also}  # later rules of a group
    work.skipped.extend(rewritten.skipped)
    work.unused_rules = rewritten.unused
    work.shadowed_rules = rewritten.shadowed
    for key, full, new, rule in rewritten.entries:
        is_optimizer = is_optimizer_key(key)
        if is_optimizer and work.canon(full) in network_tensors:
            # An optimizer's edge to a network variable the source also reaches through the
            # layers: that key places it. By the list's position it would name another
            # variable wherever the optimizers were built on different variables.
            continue
        if is_optimizer:  # unless it names a network variable (a module's own `global_step`)
            _, found = candidates(new, targets, new != key)
            is_optimizer = not (found and all(p in targets.network for p in found))
        if is_optimizer and work.optimizer_state is False:
            work.skipped.append(f"{full}: optimizer state, not moved (optimizer_state=False)")
            continue
        if is_optimizer:  # placed by the variable it belongs to, below; by path only after
            work.optimizer_left.append((key, new))
            continue
        if rule is not None and (rule.also or rule.index in fanning):
            work.fanned.setdefault(key, []).append((new, rule))
        strategy, found = candidates(new, targets, new != key)
        if len(found) > 1:
            work.ambiguous.append((full, tuple(found)))
            work.ambiguous_targets.update(found)
        elif found:  # ranked by how it matched; reported as "rule" when a rule rewrote it
            work.claims.setdefault(found[0], []).append(
                (_RANK[strategy], key, "rule" if rule is not None else strategy, rule))
        elif rule is not None and rule.head:  # a task head the obj has no layer for
            where = ("no keras-hub model has a variable for it" if new.startswith(NOWHERE)
                     else f"the obj has no `{_render.safe(new)}`")
            work.skipped.append(f"{full}: head of {rule.head}, set aside ({where})")
        else:
            work.unmatched.append(key)
            work.rewritten[key] = (new, rule)


def _absent(work: _Work) -> None:
    """Variables a rule feeds that the source lacks for a known reason (a class without a
    pooler): named with it; where the obj's class does not use them, left as is."""
    named = [r for r in work.rules if r.absent and r.target is not None]
    if not named:
        return
    for path, variable in work.targets.paths.items():
        if path in work.chosen or path in work.ambiguous_targets:
            continue
        forms = ("/".join(e.lstrip("_") or e for e in path.split("/")), path,
                 str(getattr(variable, "name", "")).split(":")[0])
        rule = next((r for r in named if any(r.target.match(f) for f in forms)), None)
        if rule is None:
            continue
        shown = work.targets.label(path)
        if work.kinds & set(rule.unused_by):
            work.skipped.append(f"{shown}: {rule.absent}; unused by "
                                f"{sorted(work.kinds & set(rule.unused_by))[0]}, left as is")
            work.skipped_targets.add(path)
        else:
            work.notes.append(f"{shown} gets no value: {rule.absent}. Fix: strict=False "
                              "leaves it at its initial value (listed as missing)")


_FANNED_LISTED = 4  # source entries named in the note of those that feed several variables


def _fan_out_note(work: _Work) -> None:
    """Notes the source keys that feed several variables (each target is a row of the plan,
    with its rule); a part that matches no variable is named with its rule and keeps the key
    unmatched (a strict restore refuses it)."""
    fed = []
    taken = {(k, r.index): t for t, (k, _, r) in work.chosen.items()
             if r is not None and k in work.fanned}
    for key, pairs in work.fanned.items():
        shown, targets = _render.safe(work.view[key]), []
        for new, rule in pairs:
            target = taken.get((key, rule.index))
            if target is None:
                work.forced.add(key)
                work.notes.append(
                    f"source entry `{shown}` feeds several variables by rules that share its "
                    f"source pattern, but its part for `{_render.safe(new)}` ({rule}) matches "
                    "no variable of the obj")
            else:
                targets.append(work.targets.label(target))
        fed.append(f"`{shown}` -> {', '.join(targets) or 'none'}")
    if fed:
        more = len(fed) - _FANNED_LISTED
        work.notes.append(
            f"{len(fed):,} source {'entry feeds' if len(fed) == 1 else 'entries feed'} "
            "several variables each, by rules "
            f"that share a source pattern (a Split's parts, or tied weights): "
            f"{'; '.join(fed[:_FANNED_LISTED])}" + (f"; and {more} more" if more > 0 else ""))


def _stack_note(work: _Work) -> None:
    """Notes the entries made into one variable each (Stack and Concat rules'), and the
    groups that cannot be assembled although no variable took them."""
    fed = {entry[0]: target for target, entry in work.chosen.items()}
    made = [f"`{_render.safe(g.full)}` -> {work.targets.label(fed[key])}"
            for key, g in work.stacks.items() if key in fed]
    if made:
        parts = sum(len(g.parts) for key, g in work.stacks.items() if key in fed)
        more = len(made) - _FANNED_LISTED
        work.notes.append(
            f"{parts:,} source entries made into {len(made):,} variable(s) by Stack or "
            "Concat rules (a braced key stands for its entries, ` + ` joins parts): "
            f"{'; '.join(made[:_FANNED_LISTED])}"
            + (f"; and {more} more" if more > 0 else ""))
    work.notes.extend(g.problem for key, g in work.stacks.items()
                      if g.problem and key not in fed)


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


def _parts(work: _Work) -> None:
    """Variables that are parts of a TF1 partitioned variable TF tracks part by part
    (`tf.compat.v1.make_template`'s: `e.Spart_0`, `e.Spart_1`), fed by the one key a Saver
    wrote for the whole (its name, as stored or as a rule rewrote it): each its slice."""
    if not work.unmatched:
        return
    names = {work.rewritten.get(key, (key, None))[0]: key for key in work.unmatched}
    fed = set()
    for path, variable in work.targets.paths.items():
        part = None if path in work.chosen else _compat.part_of(variable)
        key = None if part is None else names.get(part[0])
        if key is None or tuple(work.source.specs[work.view[key]][0]) != part[1]:
            continue
        rule = work.rewritten.get(key, (key, None))[1]
        work.chosen[path] = (key, "part", rule)
        work.slices[path] = _Slice(part[2], part[3])
        fed.add(key)
    work.unmatched = [key for key in work.unmatched if key not in fed]


class _Slice:
    """The transform taking one part's slice (offsets, shape) of a whole stored tensor."""

    def __init__(self, begin, size):
        self.begin, self.size = list(begin), list(size)

    def __call__(self, value):
        return tf.slice(value, self.begin, self.size)


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
            f"source's {len(left)} optimizer entries into. Fix: compile the model first (a "
            "compiled model's optimizer is built as Keras's first training step builds it), "
            "or pass optimizer_state='auto' or False to skip them.")
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
    fresh = 0
    # Variables the source's optimizer held state for (some slot of theirs got a value): a
    # slot of theirs that got none is missing, not fresh.
    with_state = {owner_of_slot[t] for t in chosen if t in owner_of_slot}
    # Only when every optimizer entry of the source found its place (or was skipped for a
    # reason) does a slot that got nothing mean "no state in the source"; else it is missing.
    placed = not any(is_optimizer_key(key) for key in work.unmatched)
    # ... and only for a variable whose source tensor the source's optimizer records no
    # state for (built on the others), while it placed state by owner for some: state
    # skipped for its layout, or dropped by a rule, leaves the obj's slots as they are.
    recorded = recorded_owners(work.source) if with_state and placed else set()
    lora = targets.lora() if not work.source.keyed_by_path else {}
    for path in targets.paths:  # tree order
        if path in chosen:
            continue
        if path in targets.optimizer_paths:
            shown, note = work.targets.display(path, owners)
            shown += f" [{note}]" if note else ""
            if work.moved and (owner_of_slot.get(path) in with_state or (
                    not placed and owner_of_slot.get(path) in chosen)):
                continue  # listed as missing
            owner = owner_of_slot.get(path)
            if work.moved and with_state and placed and owner in chosen and \
                    work.canon(work.view[chosen[owner][0]]) not in recorded:
                # The source's optimizer held no state for this variable (it was built
                # on the others: a weight that got no gradient): as a fresh optimizer's.
                work.skipped.append(f"{shown}: no state in the source for the variable it "
                                    "belongs to; set to a fresh optimizer's value")
                work.fresh.append((path, owners[path][1]))
                fresh += 1
            else:
                work.skipped.append(f"{shown}: the obj's optimizer variable, left as is "
                                    f"({why})")
            work.skipped_targets.add(path)
        elif lora.get(path) in chosen:  # LoRA factor of a Keras weights file: Keras zeroes it
            work.skipped.append(f"{path}: LoRA factor of a kernel the source holds merged "
                                "(a Keras weights file): set to zeros, as Keras's load does")
            work.skipped_targets.add(path)
        elif path in targets.rng:
            work.skipped.append(f"{path}: random generator state (Keras SeedGenerator), left "
                                "as is (no source value)")
            work.skipped_targets.add(path)
    if fresh:
        work.notes.append(f"{fresh} optimizer variables of restored variables start as a "
                          "fresh optimizer's: the source's optimizer held no state for the "
                          "variables they belong to (built on the others; listed under skipped)")


def recorded_owners(source: Source) -> set:
    """The source tensors its optimizer state records as owners (slot tables, Keras 3 lists,
    saved slot names, TF1 slot names)."""
    canon = lambda key: source.aliases.get(key, key)  # noqa: E731
    found = {canon(owner) for owner, _ in source.owners().values()}
    for key in source.specs:
        parts = _paths.split_slot(key)
        tf1 = _compat.TF1_SLOT.match(key)
        if parts is not None:
            found.add(canon(parts[0]))
        elif tf1 is not None:
            found.add(canon(tf1.group("var")))
    return found


def _result(work: _Work) -> Plan:
    """Checks every chosen pair's shape and dtype and lists what is left over."""
    source, targets, view, chosen = work.source, work.targets, work.view, work.chosen
    matches, mismatched = [], []
    # A network variable's key as people know it: its path through the layers, where the
    # source's canonical key runs through an optimizer's list of the variables it trains.
    shown = {canon: alias for alias, canon in source.aliases.items()
             if is_optimizer_key(canon) and not is_optimizer_key(alias)}
    for target in targets.paths:
        if target not in chosen:
            continue
        key, strategy, rule = chosen[target]
        if key in work.stacks and work.stacks[key].problem:  # cannot be assembled
            mismatched.append(f"{targets.label(target)}: {work.stacks[key].problem}")
            continue
        transform = None if rule is None or key in work.stacks else rule.transform
        transform = work.slices.get(target, transform)
        match, problem = check_match(Match(target, view[key], strategy, str(rule) if rule else "",
                                        transform),
                                  source, targets.paths[target], shown,
                                  targets.shown(target), work.cast)
        if problem:
            mismatched.append(problem)
        else:
            matches.append(match)
    _fan_out_note(work)
    _stack_note(work)
    used = {work.canon(view[entry[0]]) for entry in chosen.values()}
    seen, unmatched = set(), []
    for key in [*work.unmatched, *sorted(work.forced)]:  # one tensor listed once; not at all
        tensor = work.canon(view[key])  # when fed under another key (unless a part missed)
        if (tensor not in used or key in work.forced) and tensor not in seen:
            seen.add(tensor)
            unmatched.append(key)
    unmatched_variables = tuple(p for p in targets.paths if p not in chosen
                                and p not in work.ambiguous_targets
                                and p not in work.skipped_targets)
    unused = tuple(work.unused_rules)
    warn_unused(work.unused_rules, source.description, stacklevel=5,
                shadowed=work.shadowed_rules)
    rewritten = {view[k]: work.rewritten[k][0] for k in unmatched if k in work.rewritten
                 and work.rewritten[k][1] is not None and work.rewritten[k][0] != k}
    return Plan(source.description, tuple(matches), unmatched_variables,
                tuple(view[k] for k in unmatched), tuple(work.ambiguous), tuple(mismatched),
                tuple(work.skipped), unused, notes=tuple(work.notes),
                shadowed_rules=tuple(work.shadowed_rules), fresh=tuple(work.fresh),
                _rewritten=rewritten)


def check_strict(strict) -> bool:
    """Validates `strict` (True or False), as every reading function takes it."""
    if strict is True or strict is False:
        return strict
    if type(strict).__name__ == "bool_":  # numpy's bool
        return bool(strict)
    raise errors.InvalidArgumentError(
        f"strict must be True or False. Received: strict={strict!r}. True: variables "
        "without a value and source entries without a variable are errors; False: they are "
        "skipped and listed. Fix: pass strict=True or strict=False.")


def optimizer_entries(source: Source, keys) -> set:
    """The keys (of `keys`) that are optimizer state: optimizer keys (`is_optimizer_key`)
    that are no edge to a network variable the source also reaches through the layers (a
    Keras 3 optimizer's `_trainable_variables` list)."""
    canon = source.aliases.get
    network = {canon(k, k) for k in (*source.specs, *source.aliases) if not is_optimizer_key(k)}
    return {key for key in keys if is_optimizer_key(key) and canon(key, key) not in network}


def optimizer_slots_in(source: Source) -> bool:
    """Whether the source holds per-variable optimizer state (slots, moments), not only step
    counters or the network variables a Keras 3 optimizer lists."""
    return any(key.rsplit("/", 1)[-1].lstrip("_") not in _compat.COUNTERS
               and not key.endswith(("beta1_power", "beta2_power"))
               for key in optimizer_entries(source, source.specs))
