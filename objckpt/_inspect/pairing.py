"""Which entries of two checkpoints `diff` compares, and how their values meet.

- Keys: A's keys rewritten by rules (what restore does to a source's keys: the first rule
  whose regex matches rewrites the key once, `re.sub(regex, replacement, key, count=1)`; a
  replacement of None drops it), then matched with B's paths: equal, else equal once
  leading underscores are stripped from each edge (`fc_in/kernel` ~ `fc_in/_kernel`), where
  that names one path of B. Without rules, keys are compared as they are.
- Dtypes: which one holds every value of the other (bfloat16 or float16 in float32, float32
  in float64, integer widening): with a tolerance, such a pair is compared by value after
  the cast, not reported as a dtype difference.

No TensorFlow, no NumPy beyond the cast.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from objckpt import errors

__all__ = ["Pairs", "common", "lossless", "pair", "parse_rules"]

# dtype -> the dtypes that hold each of its values exactly.
_WIDER = {
    "float8_e4m3fn": {"float16", "bfloat16", "float32", "float64"},
    "float8_e5m2": {"float16", "bfloat16", "float32", "float64"},
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
    "int8": {"int16", "int32", "int64"},
    "int16": {"int32", "int64"},
    "int32": {"int64"},
    "uint8": {"uint16", "uint32", "uint64", "int16", "int32", "int64"},
    "uint16": {"uint32", "uint64", "int32", "int64"},
    "uint32": {"uint64", "int64"},
}


def lossless(a: str, b: str) -> bool:
    """Whether one of the dtypes (names) holds every value of the other."""
    return b in _WIDER.get(a, ()) or a in _WIDER.get(b, ())


def common(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x and y in one dtype that holds both exactly (float64 for floats, the wider integer)."""
    floating = x.dtype.kind not in "iu" or y.dtype.kind not in "iu"
    target = np.float64 if floating else np.result_type(x.dtype, y.dtype)
    return np.asarray(x).astype(target), np.asarray(y).astype(target)


class Rule(NamedTuple):
    regex: re.Pattern
    replacement: str | None
    transform: bool  # the rule came with a value transform (not applied by diff)


def parse_rules(rules) -> tuple[Rule, ...]:
    """Validates `rules`: (regex, replacement) pairs, (regex, replacement, transform) triples
    or `objckpt.rules.Rule`s (their restore direction)."""
    if rules is None:
        return ()
    if isinstance(rules, (str, bytes)) or (isinstance(rules, tuple) and len(rules) == 2
                                           and isinstance(rules[0], str)):
        raise errors.InvalidArgumentError(
            f"rules must be a sequence of (regex, replacement) pairs. Received: rules={rules!r}, "
            "a single rule. Fix: wrap it in a list, e.g. rules=[('^model_001/', '')].")
    parsed = []
    for index, rule in enumerate(rules):
        if hasattr(rule, "regex_rule"):  # an objckpt.rules.Rule
            rule = rule.regex_rule()
        if not isinstance(rule, (tuple, list)) or len(rule) not in (2, 3):
            raise errors.InvalidArgumentError(
                f"rule {index} must be (regex, replacement). Received: {rule!r}. Fix: write "
                "it as e.g. ('^model_001/', ''), or ('^old/', None) to leave out what it "
                "matches.")
        pattern, replacement = rule[0], rule[1]
        if replacement is not None and not isinstance(replacement, str):
            raise errors.InvalidArgumentError(
                f"rule {index}: the replacement must be a string or None (leave the entry "
                f"out). Received: {replacement!r}. Fix: pass a string, or None.")
        try:
            regex = re.compile(pattern)
        except (TypeError, re.error) as err:
            raise errors.InvalidArgumentError(
                f"rule {index}: {pattern!r} is not a valid regular expression ({err}). Fix: "
                "correct the pattern (re.escape(text) matches text literally).") from err
        parsed.append(Rule(regex, replacement, len(rule) == 3 and rule[2] is not None))
    return tuple(parsed)


class Pairs(NamedTuple):
    """matched: (A key, B path) in A's order; only_in_a: A keys matching no path of B (or a
    path another A key took first); dropped: A keys a rule left out; rewritten: {A key: key
    after the rules} for every key a rule changed (None: dropped); taken: (A key, B path) of
    A keys whose rewritten key named a path another key took first."""

    matched: list
    only_in_a: list
    dropped: list
    rewritten: dict
    taken: list


def _stripped(path: str) -> str:
    return "/".join(edge.lstrip("_") or edge for edge in path.split("/"))


def pair(a_keys, b_paths, rules: tuple[Rule, ...]) -> Pairs:
    """A's keys (rewritten by `rules`) matched with B's paths (see the module docstring)."""
    b_paths = list(b_paths)
    present = set(b_paths)
    loose: dict = {}
    if rules:
        for path in b_paths:
            loose.setdefault(_stripped(path), []).append(path)
    matched, only_in_a, dropped, rewritten, taken, used = [], [], [], {}, [], set()
    for key in a_keys:
        new = key
        for rule in rules:
            if rule.regex.search(key):
                new = None if rule.replacement is None else \
                    rule.regex.sub(rule.replacement, key, count=1)
                break
        if new != key:
            rewritten[key] = new
        if new is None:
            dropped.append(key)
            continue
        found = new if new in present else None
        if found is None and rules:
            candidates = loose.get(_stripped(new), [])
            found = candidates[0] if len(candidates) == 1 else None
        if found is None:
            only_in_a.append(key)
        elif found in used:
            only_in_a.append(key)
            taken.append((key, found))
        else:
            used.add(found)
            matched.append((key, found))
    return Pairs(matched, only_in_a, dropped, rewritten, taken)
