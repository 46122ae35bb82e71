"""Why a plan cannot be applied: the one error restore, migrate and load_ensemble raise.

The check stage of the one restore pipeline (`_pipeline.Pipeline.check` refuses, nothing
assigned, nothing written, when anything is mismatched, ambiguous or, with strict, left
over); `refuse` writes the message: every problem, network first, and the fixes that apply.
`ready_optimizers` is the plan stage's first step: optimizers not built yet, built.
"""

from __future__ import annotations

import collections
import dataclasses
import contextlib
import re

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._planning import tree as _tree
from objckpt._planning.match import (
    Plan,
    make_plan,
    optimizer_mode,
    optimizer_slots_in,
    recorded_owners,
)
from objckpt._planning.propose import propose, proposal_fix
from objckpt._planning.sources import Source
from objckpt._planning.targets import is_default_name, is_optimizer_key

__all__ = ["creation_scope", "describe_obj", "noted", "ready_optimizers", "refuse"]


def describe_obj(obj) -> str:
    name = getattr(obj, "name", None)
    return f"{type(obj).__name__}" + (f" `{name}`" if isinstance(name, str) and name else "")


def refuse(obj, variables, source, the_plan: Plan, strict: bool,
            action: str = "restore", propose: bool = False):
    """Raises the error that says why `the_plan` cannot be applied (restored or migrated)."""
    nothing = "Nothing was restored" if action == "restore" else "Nothing was written"
    # Names come from the source (untrusted): shown through `safe`, messages through `safe_text`.
    safe, text = _render.safe, _render.safe_text
    described = text(source.description)
    if not variables or (the_plan.unmatched_variables and _compat.is_unbuilt(obj)):
        raise errors.UnbuiltModelError(
            f"Cannot {action} {described} into {describe_obj(obj)}: it is not built yet, "
            f"so it has {len(variables)} of the source's {len(source.specs)} variables. "
            f"{nothing}. Fix: build it first (call it on a batch, or model.build(shape)), or "
            "use objckpt.restore_on_create(obj, source) to apply values as variables are created.",
            source=source.prefix, obj=describe_obj(obj))
    lines = [text(problem) for problem in the_plan.mismatched]
    lines += [f"ambiguous, not guessed: `{safe(what)}` could be any of "
              + ", ".join(f"`{safe(c)}`" for c in candidates)
              for what, candidates in the_plan.ambiguous]
    if strict:  # the network's problems first: optimizer state follows from them
        missing, extra = _missing_lines(the_plan), _extra_lines(the_plan, source)
        lines += [line for line, optimizer in missing if not optimizer]
        lines += [line for line, optimizer in extra if not optimizer]
        lines += [line for line, optimizer in missing if optimizer]
        lines += [line for line, optimizer in extra if optimizer]
    fixes = _fixes(the_plan, source, strict, variables)
    if propose and strict and not (the_plan.mismatched or the_plan.ambiguous):
        proposal = proposal_fix(source, variables, the_plan)  # "" when nothing pairs up
        if proposal:
            fixes.insert(0, proposal)
    if not lines:
        lines = [f"no entry of the source matches a variable of the obj "
                 f"({len(variables)} variables, {len(source.specs)} source entries)"]
        fixes.append("check that the source was written for this model, or add rules")
    shown = _render.listed(lines)
    refused = errors.AmbiguousMatchError if the_plan.ambiguous else errors.StructureMismatchError
    raise refused(
        f"Cannot {action} {described} into {describe_obj(obj)}: {len(lines)} problem"
        f"{'s' if len(lines) != 1 else ''}. {nothing}.\n" + "\n".join(shown)
        + "".join(f"\n{text(note)}" for note in the_plan.notes) + "\nFix: " + "; or ".join(fixes)
        + ".", tuple(lines), source=source.prefix, obj=describe_obj(obj))


def _missing_lines(the_plan: Plan) -> list[tuple[str, bool]]:
    """(line, is optimizer state) per variable no source entry feeds, as people know it.

    (The optimizer slots of a variable that gets no value keep theirs and are listed as
    skipped by the plan, so a missing layer is one line per weight.)"""
    return [(f"{the_plan.label(path)}: in the obj but missing from the source",
             is_optimizer_key(path)) for path in the_plan.unmatched_variables]


def _extra_lines(the_plan: Plan, source: Source) -> list[tuple[str, bool]]:
    """(line, is optimizer state) per source entry that feeds nothing, with its saved name."""
    lines = []
    shared = collections.Counter(source.names.values())
    for key in the_plan.unmatched_source:
        name = source.names.get(key, "")
        note = f" [{_render.safe(name.removesuffix(':0'))}]" if name and shared[name] == 1 \
            and name.removesuffix(":0") != key and not is_default_name(name) else ""
        lines.append((f"{the_plan.source_label(key)}{note}: in the source but not in the obj",
                      is_optimizer_key(key)))
    return lines


def _fixes(the_plan: Plan, source: Source, strict: bool, variables) -> list[str]:
    """The fixes that apply to this plan's problems, with examples in its own keys."""
    fixes = []
    if any(getattr(p, "lossy", False) for p in the_plan.mismatched):
        fixes.append("pass cast='lossy' to cast the values to the obj's narrower dtypes "
                     "(rounded as tf.cast rounds them)")
    if the_plan.mismatched:
        fixes.append("rebuild the obj with the source's shapes and dtypes (strict=False never "
                     "skips a shape or dtype mismatch)")
        if any(getattr(p, "transformed", False) for p in the_plan.mismatched):
            fixes.append("fix the rule's transform so it returns the obj's shape and dtype")
    if the_plan.ambiguous:
        what, candidates = the_plan.ambiguous[0]
        fixes.append(f"add a rule that names the intended entry exactly, e.g. "
                     f"rules=[{_python(('^' + re.escape(candidates[0]) + '$', what))}]"
                     if candidates else
                     "add a rule that names the intended source entry exactly")
    if not strict or not (the_plan.unmatched_variables or the_plan.unmatched_source):
        return fixes
    network_missing = [p for p in the_plan.unmatched_variables if not is_optimizer_key(p)]
    network_extra = [k for k in the_plan.unmatched_source if not is_optimizer_key(k)]
    if the_plan.matches:
        fixes.append("pass strict=False to restore only what matches")
    at = _at_fix(the_plan, source, network_extra, network_missing)
    if at:
        fixes.append(at)
    example = (_example_rule(network_extra, network_missing, the_plan, source, variables)
               if network_extra and network_missing else "")
    if example and source.kind != "name":
        fixes.append("add rules that map source keys onto the obj's object paths, e.g. "
                     f"rules=[{example}] "
                     "(rules are tried in order; the first that matches a key rewrites it, "
                     "once; objckpt.plan(obj, source, rules=...) shows the result)")
    if any(is_optimizer_key(p) for p in the_plan.unmatched_source) or \
            any(is_optimizer_key(p) for p in the_plan.unmatched_variables):
        fixes.append("pass optimizer_state=False to restore the network without optimizer "
                     "state (the optimizer's entries are then ignored on both sides)")
    if source.kind == "name":  # a network variable's name, not `beta1_power`, as the example
        such = network_extra[0] if network_extra else next(
            (k for k in source.specs if not is_optimizer_key(k)), next(iter(source.specs), ""))
        fixes.insert(0, "the source is name-based (TF1 Saver): its keys are global variable "
                        f"names such as `{_render.safe(such or 'scope/w')}`; map them onto the "
                        "obj's object paths with rules" + (
                            f", e.g. rules=[{example}] (rules are tried in order; the first "
                            "that matches a key rewrites it, once)" if example else "")
                        + ", and check the result with objckpt.plan(obj, source, rules=...)")
    near = _near_miss(the_plan, source, network_extra, network_missing, variables)
    if near:
        fixes.insert(0, near)
    return fixes


def _near_miss(the_plan: Plan, source: Source, extra: list, missing: list,
               variables) -> str:
    """When a rule rewrote a key next to a missing variable of the key's shape
    (`fc_in/weights` beside `fc_in/_kernel`): the rule naming that variable, to put first."""
    def plain(path: str) -> str:
        return "/".join(edge.lstrip("_") or edge for edge in path.split("/"))

    near: dict = {}
    for path in missing:
        if path in variables:
            shown = plain(the_plan.display(path)[0])
            near.setdefault((shown.rpartition("/")[0], tuple(variables[path].shape)), shown)
    for key in extra:
        new, spec = the_plan.rewritten_key(key), source.specs.get(key)
        if new is None or spec is None:
            continue
        target = near.get((plain(new).rpartition("/")[0], tuple(spec[0])))
        if target is not None:
            safe = _render.safe
            return (f"a rule rewrote `{safe(key)}` to `{safe(new)}`, which the obj lacks; "
                    f"`{safe(target)}` beside it has its shape: name it with a rule before "
                    f"yours, e.g. rules=[{_python(('^' + re.escape(key) + '$', target))}] "
                    "followed by your rules")
    return ""


def _at_fix(the_plan: Plan, source: Source, extra: list, missing: list) -> str:
    """`at=...` when the obj's missing paths sit under one top-level name of the source."""
    if the_plan.at is not None or not extra or not missing:
        return ""
    wanted, names, found = set(missing), set(source.top_level_names), set()
    # One pass over the keys (each split at its slashes), not one per top-level name: a
    # source of 200,000 names and entries stays linear.
    for key in extra:
        cut = key.find("/")
        while cut != -1:
            if key[:cut] in names and key[cut + 1:] in wanted:
                found.add(key[:cut])
            cut = key.find("/", cut + 1)
    for name in source.top_level_names if found else ():
        if name in found:
            return (f"pass at={name!r}: the obj's variables sit under the source's "
                    f"`{_render.safe(name)}`")
    return ""


def _example_rule(extra: list, missing: list, the_plan: Plan, source: Source,
                  variables) -> str:
    """A rule, in the user's own keys, mapping a source entry onto a variable it could feed:
    a prefix to strip when a key ends with a variable's path, else one key onto a variable
    of its shape, else the first onto the first."""
    shown = {path: the_plan.display(path)[0] for path in missing}
    # Linear in the keys and paths: each key's suffixes after a slash are looked
    # up, the first (path, shown before path) winning, as a scan of every pair would pick.
    rank: dict = {}
    for i, path in enumerate(missing):
        for j, target in enumerate((shown[path], path)):
            rank.setdefault(target, (i, j))
    for key in extra:
        best = None
        cut = key.find("/")
        while cut != -1:
            found = rank.get(key[cut + 1:])
            if found is not None and (best is None or found < best[0]):
                best = (found, cut)
            cut = key.find("/", cut + 1)
        if best is not None:
            return _python(("^" + re.escape(key[:best[1] + 1]), ""))
    # The first key (in order) with a variable of its shape, and the first such variable.
    first_of_shape: dict = {}
    for path in missing:
        if path in variables:
            first_of_shape.setdefault(tuple(variables[path].shape), path)
    key, path = extra[0], missing[0]
    for candidate in extra:
        spec = source.specs.get(candidate)
        found = first_of_shape.get(tuple(spec[0])) if spec is not None else None
        if found is not None:
            key, path = candidate, found
            break
    return _python(("^" + re.escape(key) + "$", shown[path]))


def _python(rule: tuple) -> str:
    """A rule as Python to paste: `ascii` escapes what a terminal must not see (control and
    non-ASCII characters) once, so the regex pasted is the one shown (a terminal escape of
    the repr would double its backslashes: a regex that matches nothing)."""
    return ascii(rule)


def noted(pipe, variables, src: Source, the_plan: Plan) -> Plan:
    """The check stage of a dry run (`objckpt.plan`): `the_plan` with what restore would
    do with it noted (an optimizer `pipe`'s plan stage built, entries it would refuse or
    skip), and rules proposed where none fit; nothing raised."""
    notes = list(the_plan.notes)
    if pipe.built:
        notes.append(
            f"the obj's optimizer ({', '.join(pipe.built)}) was not built yet: built now, "
            "as objckpt.restore builds it first (and Keras's first training step would), "
            "so this plan moves the source's optimizer state into it by owner, as "
            "restore does")
    left = len(the_plan.unmatched_variables) + len(the_plan.unmatched_source)
    if left and not (the_plan.ambiguous or the_plan.mismatched):
        what = (f"{_render.count(len(the_plan.unmatched_variables), 'variable')} without "
                f"a value and {len(the_plan.unmatched_source)} source "
                f"{'entry' if len(the_plan.unmatched_source) == 1 else 'entries'} "
                "without a variable")
        notes.append(
            f"strict=True: objckpt.restore would refuse this plan ({what}); strict=False "
            "skips them and lists them in its report" if pipe.strict else
            f"strict=False: objckpt.restore would skip and list {what}")
    the_plan = dataclasses.replace(the_plan, notes=tuple(notes))
    if pipe.rules or not (the_plan.unmatched_source and the_plan.unmatched_variables):
        return the_plan
    try:
        proposed = propose(src, variables, the_plan)
    except errors.ObjckptError:  # the plan stands without a proposal
        return the_plan
    if proposed is None:
        return the_plan
    return dataclasses.replace(the_plan, proposed=proposed)


def ready_optimizers(obj, variables, source: Source, *, rules=(), at=None,
                     optimizer_state="auto", models_only: bool = False):
    """Builds obj's optimizers that hold no state yet, when the source has state for them.

    Keras creates an optimizer's slots on the first training step, so a model compiled in
    a new process has none to restore into. Unless optimizer_state is False, each such
    optimizer is built here as that first step would build it: a Keras model's own
    optimizer on the model's `trainable_variables` (what `fit` and Keras's own loader do),
    any other on the obj's variables whose optimizer state the source holds (what the run
    that wrote it trained). The new variables hold a fresh optimizer's values; the restore
    then moves the source's state into them by owner. Building is the one change a restore
    that fails afterwards keeps, as the next training step would make it anyway.

    `models_only`: build only the optimizers of Keras models (`restore_on_create` leaves
    the others to create their slots when they first apply gradients: it watches them).

    Returns:
      obj's variable tree, walked again when an optimizer was built.
    """
    if optimizer_mode(optimizer_state) is False or not variables:
        return variables
    unbuilt = [(o, m) for o, m in _compat.unbuilt_optimizers(obj)
               if m is not None or not models_only]
    if not unbuilt or not optimizer_slots_in(source):
        return variables
    owned = None
    for optimizer, model in unbuilt:
        if model is not None:
            trained = list(model.trainable_variables)
        else:
            if owned is None:
                owned = _owned_variables(obj, variables, source, rules, at)
            trained = owned
        if not trained:
            continue
        with creation_scope(variables.values()):
            _compat.build_optimizer(optimizer, trained)
    return _tree.tree(obj)


def _owned_variables(obj, variables, source: Source, rules, at) -> list:
    """The obj's trainable variables (in tree order) that the source holds optimizer state
    for: the owners it records, fed through a network-only plan."""
    the_plan = make_plan(source, obj, variables, rules=rules, at=at, optimizer_state=False)
    fed = {source.aliases.get(m.source, m.source): m.target for m in the_plan.matches}
    wanted = {fed[o] for o in recorded_owners(source) if o in fed}
    return [v for p, v in variables.items() if p in wanted and getattr(v, "trainable", True)]


def creation_scope(variables):
    """The scope of the strategy of `variables`, for variables created beside them (none
    without a strategy, or when a strategy's scope is entered already)."""
    if tf.distribute.has_strategy():
        return contextlib.nullcontext()
    strategy = _compat.variables_strategy(variables)
    if strategy is tf.distribute.get_strategy():
        return contextlib.nullcontext()
    return strategy.scope()
