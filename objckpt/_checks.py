"""Why a plan cannot be applied: the one error restore, migrate and load_ensemble raise.

`checked_plan` plans and refuses (nothing assigned, nothing written) when anything is
mismatched, ambiguous or, with strict, left over; `refuse` writes the message: every problem,
network first, and the fixes that apply.
"""

from __future__ import annotations

from objckpt import _compat, _render, errors
from objckpt._match import Plan, make_plan
from objckpt._sources import Source
from objckpt._targets import is_optimizer_key

__all__ = ["checked_plan", "describe_obj", "refuse"]


def describe_obj(obj) -> str:
    name = getattr(obj, "name", None)
    return f"{type(obj).__name__}" + (f" `{name}`" if isinstance(name, str) and name else "")


def refuse(obj, variables, source, the_plan: Plan, strict: bool,
            action: str = "restore"):
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
            "use objckpt.restore_on_create(obj, source) to apply values as variables are created.")
    lines = [text(problem) for problem in the_plan.mismatched]
    lines += [f"ambiguous, not guessed: `{safe(what)}` could be any of "
              + ", ".join(f"`{safe(c)}`" for c in candidates)
              for what, candidates in the_plan.ambiguous]
    if strict:  # the network's problems first: optimizer state follows from them
        missing = sorted(the_plan.unmatched_variables,
                         key=lambda p: is_optimizer_key(p))
        extra = sorted(the_plan.unmatched_source, key=lambda p: is_optimizer_key(p))
        lines += [f"`{safe(p)}`: in the obj but missing from the source" for p in missing
                  if not is_optimizer_key(p)]
        lines += [f"`{safe(p)}`: in the source but not in the obj" for p in extra
                  if not is_optimizer_key(p)]
        lines += [f"`{safe(p)}`: in the obj but missing from the source" for p in missing
                  if is_optimizer_key(p)]
        lines += [f"`{safe(p)}`: in the source but not in the obj" for p in extra
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
                        "names such as `" + safe(next(iter(source.specs), "scope/w"))
                        + "`; map them onto the obj with rules, e.g. rules=[('^model_001/', '')], "
                        "and check with objckpt.plan(source, obj)")
    if not lines:
        lines = [f"no entry of the source matches a variable of the obj "
                 f"({len(variables)} variables, {len(source.specs)} source entries)"]
        fixes.append("check that the source was written for this model, or add rules")
    shown = _render.listed(lines)
    raise errors.StructureMismatchError(
        f"Cannot {action} {described} into {describe_obj(obj)}: {len(lines)} problem"
        f"{'s' if len(lines) != 1 else ''}. {nothing}.\n" + "\n".join(shown)
        + "".join(f"\n{text(note)}" for note in the_plan.notes) + "\nFix: " + "; or ".join(fixes)
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
