"""Rules: ordered `(regex, replacement[, transform])` rewrites of source keys.

Each source key is rewritten by the first rule whose regex matches it (`re.sub(regex,
replacement, key, count=1)`), once: rules never chain, so a later rule never sees what an
earlier one made of a key. A replacement of None drops the entry; keys no rule matches stay
as they are, except that `objckpt.rules.Rule`s sharing a source pattern all apply to a key
the first of them matches (one tensor feeding several variables: a Split's parts, tied
weights). A rule that rewrote no key is reported: "shadowed" when the keys it matches
(as stored, or as an earlier rule rewrote them) were all taken by another rule that matched
first, else "matched no key".
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import warnings
from collections.abc import Callable

from objckpt import errors
from objckpt import rules as _ruleset
from objckpt._base import render as _render
from objckpt._planning import sources as _sources

__all__ = ["ParsedRule", "Rewritten", "Stacked", "parse_rules", "rewrite", "rewrite_all",
           "rewrite_view", "stacked_view", "warn_unused", "why_shadowed"]


@dataclasses.dataclass(frozen=True)
class ParsedRule:
    index: int
    regex: re.Pattern
    replacement: str | None
    transform: Callable | None
    label: str | None = None  # how the user wrote it: an objckpt.rules.Rule's repr
    # The later objckpt.rules.Rules with the same source pattern: a key this rule rewrites
    # feeds their targets too (a Split's parts, or tied weights). Only such rules fan out.
    also: tuple = ()
    # From a RuleSet of alternatives (a shipped Hugging Face set lists every spelling a file
    # may use): matching no key is expected, never reported.
    optional: bool = False
    # From an objckpt.rules.Rule: the Hub classes whose head the entry is (set aside when
    # the obj has no target for it), why a folder may lack it, the model classes that do
    # not use its variable, and the regex of its target (object path) side.
    head: str = ""
    absent: str = ""
    unused_by: tuple = ()
    target: re.Pattern | None = None
    # From an objckpt.rules.Rule whose transform ends with a Stack: the entries that differ
    # only in its `over` placeholder make one variable (`stacked_view`); `part` is what
    # each entry goes through before it is stacked.
    stack: object = None
    part: Callable | None = None
    concat: object = None  # a Concat last: this rule's entries are one part of the variable

    def __str__(self) -> str:
        if self.label is not None:
            return f"rule {self.index} ({self.label})"
        extra = ", transform" if self.transform is not None else ""
        return f"rule {self.index} ({self.regex.pattern!r} -> {self.replacement!r}{extra})"


def parse_rules(rules) -> tuple[ParsedRule, ...]:
    """Validates rules: a sequence of (regex, replacement) or (regex, replacement, transform),
    or of `objckpt.rules.Rule`s (an `objckpt.rules.RuleSet`), each made the anchored regex
    rule of its restore direction."""
    if rules is None:
        return ()
    if isinstance(rules, _ruleset.Rule):
        raise errors.InvalidArgumentError(
            f"rules must be a sequence of rules. Received: rules={rules!r}, a single rule. "
            "Fix: wrap it, e.g. rules=objckpt.rules.RuleSet([rule]).")
    if isinstance(rules, (str, bytes)) or (isinstance(rules, tuple) and len(rules) in (2, 3)
                                           and isinstance(rules[0], str)
                                           and (rules[1] is None or isinstance(rules[1], str))):
        raise errors.InvalidArgumentError(
            f"rules must be a sequence of (regex, replacement) pairs. Received: rules={rules!r}, "
            "a single rule. Fix: wrap it in a list, e.g. rules=[('^model_001/', '')].")
    parsed = []
    for index, rule in enumerate(rules):
        if isinstance(rule, ParsedRule):  # parsed already (restore_on_create plans again later)
            parsed.append(dataclasses.replace(rule, index=index))
            continue
        label, given = None, rule
        if isinstance(rule, _ruleset.Rule):
            label, rule = repr(rule), rule.regex_rule()
        if not isinstance(rule, (tuple, list)) or len(rule) not in (2, 3):
            raise errors.InvalidArgumentError(
                f"rule {index} must be (regex, replacement) or (regex, replacement, transform). "
                f"Received: {rule!r}. Fix: write it as e.g. ('^model_001/', ''), or "
                "('^old/', None) to drop the entries it matches.")
        pattern, replacement = rule[0], rule[1]
        transform = rule[2] if len(rule) == 3 else None
        if replacement is not None and not isinstance(replacement, str):
            raise errors.InvalidArgumentError(
                f"rule {index}: the replacement must be a string or None (drop the entry). "
                f"Received: {replacement!r}. Fix: pass a string, or None to drop the entry.")
        if transform is not None and not callable(transform):
            raise errors.InvalidArgumentError(
                f"rule {index}: the transform must be a callable tensor -> tensor (e.g. "
                f"lambda t: tf.transpose(t)). Received: {transform!r}. Fix: pass a callable, "
                "or write the rule as a (regex, replacement) pair.")
        try:
            regex = re.compile(pattern)
        except (TypeError, re.error) as err:
            raise errors.InvalidArgumentError(
                f"rule {index}: {pattern!r} is not a valid regular expression ({err}). Rules "
                "are (regex, replacement) pairs applied with re.sub(regex, replacement, key, "
                "count=1). Fix: correct the pattern (re.escape(text) matches text "
                "literally).") from err
        extra = {}
        if isinstance(given, _ruleset.Rule):
            extra = dict(head=given.head, absent=given.absent, unused_by=given.unused_by,
                         target=given.target_regex, stack=given.stack, part=given.part,
                         concat=given.concat)
        parsed.append(ParsedRule(index, regex, replacement, transform, label,
                                 optional=bool(getattr(rules, "alternatives", False)),
                                 **extra))
    return _fan_out(parsed, rules)


def _fan_out(parsed: list, given) -> tuple:
    """Gives the first of the objckpt.rules.Rules that share a source pattern the others
    (`ParsedRule.also`): one source tensor feeds each of their targets."""
    items = list(given) if not isinstance(given, (list, tuple)) else given
    groups: dict = {}
    for rule, item in zip(parsed, items):
        if isinstance(item, _ruleset.Rule) and rule.replacement is not None:
            groups.setdefault(item.source, []).append(rule.index)
    for indexes in groups.values():
        if len(indexes) > 1:
            lead = indexes[0]
            parsed[lead] = dataclasses.replace(
                parsed[lead], also=tuple(parsed[i] for i in indexes[1:]))
    return tuple(parsed)


def rewrite_all(key: str, rules: tuple[ParsedRule, ...], stacks=None) -> list:
    """[(rewritten key or None, rule)]: `rewrite`'s one pair, then one per rule that shares
    the firing rule's source pattern (`ParsedRule.also`), in rule order. A key that stands
    for stacked entries (in `stacks`, see `stacked_view`) is its Stack rule's."""
    if stacks and key in stacks:
        return [(stacks[key].target, stacks[key].rule)]
    new, rule = rewrite(key, rules)
    if rule is None or new is None or not rule.also:
        return [(new, rule)]
    return [(new, rule), *((rule.regex.sub(other.replacement, key, count=1), other)
                           for other in rule.also)]


def rewrite(key: str, rules: tuple[ParsedRule, ...]):
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
                    "references (\\1, \\g<name>) must exist in the regex. Fix: add the group "
                    "to the regex, or remove the reference.") from err
    return key, None


@dataclasses.dataclass
class Rewritten:
    """A source view rewritten by rules (see `rewrite_view`)."""

    entries: list  # (key, full key, rewritten key, rule or None) for every entry kept
    # (`stacked_view`: a key standing for a Stack's entries is one entry here)
    skipped: list  # "full: why" for every entry left out, in source order
    unused: list  # the rules that matched no key, as text
    shadowed: list = dataclasses.field(default_factory=list)  # why each shadowed rule never applied


def rewrite_view(view: dict, rules: tuple[ParsedRule, ...], *, keep=None,
                 note_bookkeeping: bool = True, stacks=None) -> Rewritten:
    """Rewrites every key of a source view ({key within `at`: full key}) by the rules.

    Checkpoint bookkeeping (`save_counter`, the object graph) is left out unless
    `keep(key)` says the obj has a variable of that name; entries a rule drops are left out
    and listed. A rule that rewrote no key is listed as shadowed (see `why_shadowed`) or, when
    it matches no key at all, as unused.
    """
    entries, skipped, fired, taken = [], [], set(), []
    for key, full in view.items():
        if (key in _sources.BOOKKEEPING or full in _sources.BOOKKEEPING) and not (
                keep is not None and keep(key)):
            if note_bookkeeping:
                skipped.append(f"{full}: checkpoint bookkeeping")
            continue
        pairs = rewrite_all(key, rules, stacks)
        new, rule = pairs[0]
        if rule is not None and (rule.stack is not None or rule.concat is not None) and \
                new is not None and not (stacks and key in stacks):  # planned entry by entry
            raise errors.InvalidArgumentError(
                f"{rule} makes one variable of several source entries, which a restore "
                f"that places each entry as its variable is created (restore_on_create) "
                f"cannot do: `{_render.safe(full)}` is one of them. Fix: build the obj "
                "first (call it on a batch), then objckpt.restore(obj, source, rules=...).")
        if rule is not None:
            fired.update(r.index for _, r in pairs)
            if stacks and key in stacks:  # every rule whose entries the key stands for
                fired.update(r.index for r, _ in stacks[key].pieces)
            taken.append((key, new, rule))
        if new is None:
            skipped.append(f"{full}: dropped by {rule}")
            continue
        entries.extend((key, full, n, r) for n, r in pairs)
    unused, shadowed_rules = [], []
    for rule in rules:
        if rule.index not in fired and not rule.optional:
            why = why_shadowed(rule, taken)
            if why:
                shadowed_rules.append(why)
            else:
                unused.append(str(rule))
    return Rewritten(entries, skipped, unused, shadowed_rules)


def why_shadowed(rule: ParsedRule, taken) -> str:
    """Why a rule that rewrote no key never applied, or "" when it matches no key at all.

    `taken` holds (key, rewritten key or None, rule that fired) for every key a rule
    rewrote. The rule is shadowed when its regex matches such keys: as stored (a rule
    before it matched them first), or as rewritten (the rule was written to chain).
    """
    takers: dict = {}  # index of the rule that took the keys -> [that rule, count]
    direct, chained = set(), None  # indexes of the rules that took keys it matches as stored
    for key, new, taker in taken:
        if rule.regex.search(key):
            direct.add(taker.index)
        elif new is not None and rule.regex.search(new):
            chained = chained or (key, new)
        else:
            continue
        takers.setdefault(taker.index, [taker, 0])[1] += 1
    if not takers:
        return ""
    count = sum(n for _, n in takers.values())
    by = " and ".join(f"{taker} ({n} of them)" if len(takers) > 1 else str(taker)
                      for taker, n in sorted(takers.values(), key=lambda t: t[0].index))
    keys = "the key it matches was" if count == 1 else f"the {count} keys it matches were all"
    text = f"{rule} is shadowed: {keys} taken by {by}, which matched first"
    if chained is not None:
        key, new = chained
        them = "it" if count == 1 else "them"
        text += (f"; it matches {them} only as rewritten (`{_render.safe(key)}` became "
                 f"`{_render.safe(new)}`, which no rule rewrites again)")
    fixes = []
    if direct:
        first = min(direct)
        fixes.append(f"put rule {rule.index} before rule {first} (the more specific rule "
                     f"first), or narrow the regex of rule {first}")
    if chained is not None:
        fixes.append("write one rule whose regex matches the original key and does the "
                     "whole rewrite (a combined regex), or several rules that each match "
                     "the full original key")
    return (text + ". Rules do not chain: each source key is rewritten once, by the first "
            "rule whose regex matches it. Fix: " + "; or ".join(fixes) + ".")


def warn_unused(unused: list, description: str, stacklevel: int = 1, shadowed=()) -> None:
    """Warns about rules that rewrote no key: those matching none, then shadowed ones.

    The warning points at the user's line that called objckpt (the first frame outside the
    package), whichever public function it went through; `stacklevel` is a floor.
    """
    stacklevel = max(stacklevel + 1, _outside_package())
    if unused:
        warnings.warn(f"{len(unused)} rule(s) matched no key of {description}: "
                      + "; ".join(unused), stacklevel=stacklevel)
    if shadowed:
        warnings.warn(f"{len(shadowed)} rule(s) never applied to {description}: "
                      + " ".join(shadowed), stacklevel=stacklevel)


def _outside_package() -> int:
    """The stacklevel, for a `warnings.warn` made by `warn_unused`, of the nearest frame
    outside the objckpt package and the AutoGraph wrapper TF puts around objckpt's
    `do_not_convert` functions (snapshot, restore, save)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # objckpt/
    frame, level = inspect.currentframe().f_back.f_back, 2  # the caller of warn_unused
    while frame is not None and _wrapping(os.path.abspath(frame.f_code.co_filename), package):
        frame, level = frame.f_back, level + 1
    return level


def _wrapping(filename: str, package: str) -> bool:
    return filename.startswith(package) or (
        os.sep + os.path.join("tensorflow", "python", "autograph") + os.sep in filename)
