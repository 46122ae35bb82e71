"""Rules: ordered `(regex, replacement[, transform])` rewrites of source keys.

Each source key is rewritten by the first rule whose regex matches it (`re.sub(regex,
replacement, key, count=1)`), once: rules do not chain. A replacement of None drops the
entry; keys no rule matches stay as they are.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable

from objckpt import _sources, errors

__all__ = ["Rewritten", "Rule", "parse_rules", "rewrite", "rewrite_view", "warn_unused"]


@dataclasses.dataclass(frozen=True)
class Rule:
    index: int
    regex: re.Pattern
    replacement: str | None
    transform: Callable | None

    def __str__(self) -> str:
        extra = ", transform" if self.transform is not None else ""
        return f"rule {self.index} ({self.regex.pattern!r} -> {self.replacement!r}{extra})"


def parse_rules(rules) -> tuple[Rule, ...]:
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
        parsed.append(Rule(index, regex, replacement, transform))
    return tuple(parsed)


def rewrite(key: str, rules: tuple[Rule, ...]):
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


@dataclasses.dataclass
class Rewritten:
    """A source view rewritten by rules (see `rewrite_view`)."""

    entries: list  # (key, full key, rewritten key, rule or None) for every entry kept
    skipped: list  # "full: why" for every entry left out, in source order
    unused: list  # the rules that matched no key, as text


def rewrite_view(view: dict, rules: tuple[Rule, ...], *, keep=None,
                 note_bookkeeping: bool = True) -> Rewritten:
    """Rewrites every key of a source view ({key within `at`: full key}) by the rules.

    Checkpoint bookkeeping (`save_counter`, the object graph) is left out unless
    `keep(key)` says the obj has a variable of that name; entries a rule drops are left out
    and listed.
    """
    entries, skipped, fired = [], [], set()
    for key, full in view.items():
        if (key in _sources.BOOKKEEPING or full in _sources.BOOKKEEPING) and not (
                keep is not None and keep(key)):
            if note_bookkeeping:
                skipped.append(f"{full}: checkpoint bookkeeping")
            continue
        new, rule = rewrite(key, rules)
        if rule is not None:
            fired.add(rule.index)
        if new is None:
            skipped.append(f"{full}: dropped by {rule}")
            continue
        entries.append((key, full, new, rule))
    return Rewritten(entries, skipped, [str(r) for r in rules if r.index not in fired])


def warn_unused(unused: list, description: str, stacklevel: int) -> None:
    """Warns that rules matched no key (`stacklevel` counted from the caller)."""
    if unused:
        warnings.warn(f"{len(unused)} rule(s) matched no key of {description}: "
                      + "; ".join(unused), stacklevel=stacklevel + 1)
