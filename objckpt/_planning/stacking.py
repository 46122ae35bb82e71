"""Many entries into one variable: the entries a rule with a `Stack` takes, made one.

A rule whose transform ends with `objckpt.rules.Stack(over, count, axis)` (a mixture of
experts: `model.layers.{i}.mlp.experts.{e}.w1.weight` -> one expert bank per layer) takes
every source key it is the first rule to match; the keys that differ only in the `over`
placeholder make one group, shown and planned as one entry whose key has the indexes in
braces (`model.layers.0.mlp.experts.{0..7}.w1.weight`), of the stacked shape. So the plan
has one match per variable, the group's entries are all used, and a group that cannot be
assembled (an index missing or out of range, parts of different shapes or dtypes, a
per-entry transform whose output is unknown from metadata) is a mismatch of its variable,
naming the entry: a restore refuses it before reading a byte.

`stacked_view` gives the source as planning sees it: its own entries but the grouped
ones, plus one per group, whose value is assembled when read (a buffer of the stacked
shape, each part read, transformed and copied in, one at a time: the stacked tensor and
one part beyond the model), streamed likewise where the source streams.
"""

from __future__ import annotations

import collections
import dataclasses

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._planning.rules import ParsedRule, rewrite
from objckpt._planning.sources import Source

__all__ = ["Stacked", "restacked", "stacked_view"]


@dataclasses.dataclass(frozen=True)
class Stacked:
    """One group of entries a Stack rule makes one variable of.

    Attributes:
      key: the group's key within `at` (the entries' key with the indexes in braces).
      full: the same as a source key.
      rule: the Stack rule.
      target: the key the rule rewrites every entry to (the variable's object path).
      parts: the entries' source keys, in index order ("" where one is missing).
      shape: the stacked shape (after each part's transform).
      dtype: the parts' dtype.
      problem: why the group cannot be assembled, or "".
    """

    key: str
    full: str
    rule: ParsedRule
    target: str
    parts: tuple
    shape: tuple
    dtype: object
    problem: str = ""


def _braced(key: str, span: tuple, count: int) -> str:
    start, stop = span
    return f"{key[:start]}{{0..{count - 1}}}{key[stop:]}"


def _index(text: str, count: int) -> int | None:
    """The index an entry's placeholder value gives: a decimal int in 0..count-1 written
    without leading zeros, else None."""
    if not text.isdigit() or not text.isascii() or str(int(text)) != text:
        return None
    value = int(text)
    return value if value < count else None


def stacked_view(source: Source, view: dict, rules) -> tuple:
    """(source, view, {group key: Stacked}): the source and the view (key within `at` ->
    full key) as planning sees them when rules stack entries, else as given."""
    if not any(rule.stack is not None for rule in rules):
        return source, view, {}
    found: dict = {}  # (rule index, target) -> {index text: (key, full, span)}
    out: dict = {}
    for key, full in view.items():
        new, rule = rewrite(key, rules)
        if rule is None or rule.stack is None or new is None:
            out[key] = full
            continue
        match = rule.regex.search(key)
        group = found.setdefault((rule.index, new), {})
        group.setdefault(match.group(rule.stack.over), (key, full, match.span(rule.stack.over)))
        if (rule.index, new) not in out:  # the group's place among the keys
            out[(rule.index, new)] = None
    groups, specs = {}, source.specs
    for (index, target), members in found.items():
        stacked = _group(source, rules[index], target, members)
        if stacked.full in specs or stacked.key in out:
            raise errors.InvalidArgumentError(
                f"{rules[index]}: the key `{_render.safe(stacked.full)}` that stands for its "
                "stacked entries is also a key of the source. Fix: rename the entry, or drop "
                "it with a rule (regex, None).")
        groups[stacked.key] = stacked
    view = {}
    for key, full in out.items():
        if isinstance(key, tuple):
            target = key[1]
            stacked = next(g for g in groups.values()
                           if g.rule.index == key[0] and g.target == target)
            view[stacked.key] = stacked.full
        else:
            view[key] = full
    return restacked(source, {g.full: g for g in groups.values()}), view, groups


def restacked(source: Source, groups: dict) -> Source:
    """`source` as a plan with these groups ({full key: Stacked}) reads it: its entries,
    plus each group's key, read (`fetch`) or streamed (`stream`) as the stacked value; a
    TF checkpoint's tensors are then fetched, not read by `bundle_keys`."""
    if not groups:
        return source
    # The source's own specs are not copied (a plan's `fetch` may view its source again).
    specs = collections.ChainMap({full: (g.shape, g.dtype) for full, g in groups.items()},
                                 source.specs)
    stream = None if source.stream is None else _streamer(source, groups)
    return dataclasses.replace(source, specs=specs, fetch=_fetcher(source, groups),
                               stream=stream, bundle_keys=None, structure=None)


def _group(source: Source, rule: ParsedRule, target: str, members: dict) -> Stacked:
    """The group of one Stack rule and target, checked from metadata."""
    stack, count = rule.stack, rule.stack.count
    first_key, first_full, span = next(iter(members.values()))
    key = _braced(first_key, span, count)
    shift = len(first_full) - len(first_key)
    full = (first_full[:shift] + key if first_full.endswith(first_key) else key)
    parts, problems = [""] * count, []
    for text, (entry, entry_full, _) in members.items():
        index = _index(text, count)
        if index is None:
            problems.append(f"entry `{_render.safe(entry_full)}` has {{{stack.over}}} = "
                            f"`{_render.safe(text)}`, not an index in 0..{count - 1}")
        else:
            parts[index] = entry_full
    missing = [k for k, part in enumerate(parts) if not part]
    if missing:
        start, stop = span
        names = [f"`{_render.safe(first_full[:shift + start] + str(k) + first_key[stop:])}`"
                 for k in missing]
        problems.append(f"the source lacks {len(missing)} of its {count} entries: "
                        + ", ".join(names[:8]) + (", ..." if len(names) > 8 else ""))
    present = [p for p in parts if p]
    shape, dtype = source.specs[present[0]] if present else ((), None)
    for part in present[1:]:
        if source.specs[part] != (shape, dtype):
            other_shape, other_dtype = source.specs[part]
            problems.append(
                f"entry `{_render.safe(part)}` is {other_dtype.name}{tuple(other_shape)} but "
                f"`{_render.safe(present[0])}` is {dtype.name}{tuple(shape)}: the stacked "
                "entries must share one shape and dtype")
            break
    stacked_shape = tuple(shape)
    try:
        if rule.part is not None:
            output_shape = getattr(rule.part, "output_shape", None)
            if not callable(output_shape):
                raise errors.InvalidArgumentError(
                    f"the transform before its Stack, {rule.part!r}, has no output_shape "
                    "(the stacked shape must be known from metadata). Fix: use "
                    "objckpt.rules' Transpose, ConvKernel, Reshape or Chain")
            stacked_shape = tuple(output_shape(stacked_shape))
        stacked_shape = stack.output_shape(stacked_shape)
    except (errors.ObjckptError, NotImplementedError) as err:
        problems.append(_render.first_line(err))
        stacked_shape = (count, *shape)
    problem = ""
    if problems:
        problem = (f"stacked from the {count} entries `{_render.safe(full)}` by {rule}, but "
                   + "; ".join(problems))
    return Stacked(key, full, rule, target, tuple(parts), stacked_shape, dtype, problem)


def _assembled(source: Source, group: Stacked):
    """The group's stacked value: a buffer of its shape, each part read, transformed and
    copied in, one at a time."""
    import numpy as np
    import tensorflow as tf

    if group.problem:  # the check stage refuses such a plan: never read
        raise errors.StructureMismatchError(group.problem)
    buffer = np.empty(group.shape, group.dtype.as_numpy_dtype)
    axis = group.rule.stack.axis % len(group.shape)
    want = group.shape[:axis] + group.shape[axis + 1:]
    for index, part in enumerate(group.parts):
        (value,) = source.fetch([part])
        if group.rule.part is not None:
            value = group.rule.part(value)
        value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if tuple(value.shape) != want or value.dtype != buffer.dtype:
            raise errors.CheckpointCorruptError(
                f"{source.description}: entry `{_render.safe(part)}` read as "
                f"{value.dtype.name}{tuple(value.shape)}, but its metadata promised "
                f"{buffer.dtype.name}{want} (after {group.rule}); nothing was changed. Fix: "
                "restore from another checkpoint, or write this one again.",
                source=source.description)
        buffer[(slice(None),) * axis + (index,)] = value
        del value
    return tf.convert_to_tensor(buffer)


def _fetcher(source: Source, groups: dict):
    """The source's `fetch`, with each group's key read as its stacked value."""
    def fetch(keys) -> list:
        keys = list(keys)
        plain = list(dict.fromkeys(k for k in keys if k not in groups))
        read = dict(zip(plain, source.fetch(plain))) if plain else {}
        return [read[k] if k not in groups else _assembled(source, groups[k]) for k in keys]
    return fetch


def _streamer(source: Source, groups: dict):
    """The source's `stream`, with each group assembled and assigned one at a time."""
    def stream(pairs, assign_to, convert=None):
        plain = [p for p in pairs if p[0] not in groups]
        loaders = [source.stream(plain, assign_to, convert)] if plain else []
        stacked = [p for p in pairs if p[0] in groups]
        if stacked:
            loaders.append(_StackLoader(source, [(groups[k], *rest) for k, *rest in stacked],
                                        assign_to, convert))
        return _Loaders(loaders)
    return stream


class _StackLoader:
    """Assigns stacked groups one at a time (`_fetch.streamed`'s loader protocol: `specs`,
    `verify()`, `assign()`, `close()`)."""

    def __init__(self, source: Source, entries: list, assign_to, convert=None):
        self.source, self.entries, self._assign_to = source, entries, assign_to
        self._convert = convert if convert is not None else (lambda value, variable: value)
        known = all(transform is None for *_, transform in entries)
        self.specs = [(g.shape, g.dtype, None) for g, *_ in entries] if known else None

    def verify(self) -> None:
        wrong = [f"{label}: stacked `{_render.safe(g.full)}` is "
                 f"{g.dtype.name}{tuple(g.shape)}" for g, variable, label, _ in self.entries
                 if g.problem or _compat.misfit((g.shape, g.dtype), variable)]
        if wrong:
            raise errors.StructureMismatchError(
                f"{len(wrong)} stacked value(s) from {self.source.description} do not fit; "
                "nothing was changed:\n" + "\n".join(_render.listed(wrong)), tuple(wrong))

    def assign(self) -> None:
        for group, variable, _, _ in self.entries:
            value = self._convert(_assembled(self.source, group), variable)
            self._assign_to(variable, value)
            del value

    def close(self) -> None:
        pass


class _Loaders:
    """Several loaders as one: checked all before any assigns."""

    def __init__(self, loaders: list):
        self.loaders = loaders
        specs = [loader.specs for loader in loaders]
        self.specs = None if any(s is None for s in specs) else [x for s in specs for x in s]

    def verify(self) -> None:
        for loader in self.loaders:
            loader.verify()

    def assign(self) -> None:
        for loader in self.loaders:
            loader.assign()

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()

