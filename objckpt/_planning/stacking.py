"""Many entries into one variable: the entries of `Stack` and `Concat` rules, made one.

A rule whose transform ends with `objckpt.rules.Stack(over, count, axis)` (a mixture of
experts: `model.layers.{i}.mlp.experts.{e}.w1.weight` -> one expert bank per layer) takes
every source key it is the first rule to match; the keys that differ only in the `over`
placeholder make one group, shown and planned as one entry whose key has the indexes in
braces (`model.layers.0.mlp.experts.{0..7}.w1.weight`), of the stacked shape. So the plan
has one match per variable, the group's entries are all used, and a group that cannot be
assembled (an index missing or out of range, parts of different shapes or dtypes, a
per-entry transform whose output is unknown from metadata) is a mismatch of its variable,
naming the entry: a restore refuses it before reading a byte. Rules of one target whose
transforms end with `objckpt.rules.Concat` (each its part, after a Stack or not) make one
group likewise, its key their keys joined by ` + `; a part no entry gives names its rule.
Rules of one target ending with `objckpt.rules.Sum` (each a term) make one group the same
way: term 0 gives the shape, each other term is checked to have it (size 1 on its broadcast
axes) and is added in; 16-bit float terms are added in float32 (`_summed_dtype`).

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
from objckpt.rules import core as _rules_core

__all__ = ["Stacked", "restacked", "stacked_view"]


@dataclasses.dataclass(frozen=True)
class Stacked:
    """One group of entries that rules make one variable of.

    Attributes:
      key: the group's key within `at` (each rule's entries' key with the indexes in
        braces, ` + ` between a Concat's parts).
      full: the same as a source key.
      rule: the (first) rule.
      target: the key the rules rewrite every entry to (the variable's object path).
      parts: every entry's source key ("" where one is missing), in assembly order.
      shape: the variable's shape (after each entry's transform).
      dtype: the entries' dtype.
      problem: why the group cannot be assembled, or "".
      pieces: (rule, its entries' source keys in Stack order) per rule, in Concat order.
    """

    key: str
    full: str
    rule: ParsedRule
    target: str
    parts: tuple
    shape: tuple
    dtype: object
    problem: str = ""
    pieces: tuple = ()


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


def _places(rule) -> bool:
    return rule is not None and (rule.stack is not None or rule.concat is not None)


def stacked_view(source: Source, view: dict, rules) -> tuple:
    """(source, view, {group key: Stacked}): the source and the view (key within `at` ->
    full key) as planning sees them when rules stack or join entries, else as given."""
    if not any(_places(rule) for rule in rules):
        return source, view, {}
    found: dict = {}  # group id -> {rule index: {index text: (key, full, span)}}
    out: dict = {}
    for key, full in view.items():
        new, rule = rewrite(key, rules)
        if new is None or not _places(rule):
            out[key] = full
            continue
        gid = ("join", new) if rule.concat is not None else ("stack", rule.index, new)
        members = found.setdefault(gid, {}).setdefault(rule.index, {})
        if rule.stack is not None:
            match = rule.regex.search(key)
            members.setdefault(match.group(rule.stack.over),
                               (key, full, match.span(rule.stack.over)))
        else:
            members.setdefault("", (key, full, None))
        out.setdefault(gid, None)  # the group's place among the keys
    groups, by_gid = {}, {}
    for gid, pieces in found.items():
        stacked = _group(source, rules, gid[-1], pieces)
        alone = stacked.parts == (stacked.full,)  # one entry of a Concat or Sum: itself
        if (stacked.full in source.specs and not alone) or stacked.key in groups or (
                stacked.key in out and not alone):
            raise errors.InvalidArgumentError(
                f"{stacked.rule}: the key `{_render.safe(stacked.full)}` that stands for its "
                "entries made one is also a key of the source. Fix: rename the entry, or "
                "drop it with a rule (regex, None).")
        groups[stacked.key] = by_gid[gid] = stacked
    view = {(by_gid[k].key if isinstance(k, tuple) else k):
            (by_gid[k].full if isinstance(k, tuple) else full) for k, full in out.items()}
    return restacked(source, {g.full: g for g in groups.values()}), view, groups


def _piece(source: Source, rule: ParsedRule, members: dict) -> tuple:
    """(entries' full keys in Stack order, key, full key, problems, shape after the rule's
    per-entry transform and Stack, dtype) of one rule's entries in a group."""
    problems = []
    first_key, first_full, span = next(iter(members.values()))
    shift = len(first_full) - len(first_key)
    if rule.stack is None:
        parts, key, full = (first_full,), first_key, first_full
    else:
        stack, count = rule.stack, rule.stack.count
        key = _braced(first_key, span, count)
        full = first_full[:shift] + key if first_full.endswith(first_key) else key
        parts = [""] * count
        for text, (_, entry_full, _) in members.items():
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
    shape, dtype = source.specs[present[0]]
    for part in present[1:]:
        if source.specs[part] != (shape, dtype):
            other_shape, other_dtype = source.specs[part]
            problems.append(
                f"entry `{_render.safe(part)}` is {other_dtype.name}{tuple(other_shape)} but "
                f"`{_render.safe(present[0])}` is {dtype.name}{tuple(shape)}: the stacked "
                "entries must share one shape and dtype")
            break
    out_shape = tuple(shape)
    try:
        if rule.part is not None:
            output_shape = getattr(rule.part, "output_shape", None)
            if not callable(output_shape):
                raise errors.InvalidArgumentError(
                    f"the transform before its Stack or Concat, {rule.part!r}, has no "
                    "output_shape (the variable's shape must be known from metadata). Fix: "
                    "use objckpt.rules' Transpose, ConvKernel, Reshape or Chain")
            out_shape = tuple(output_shape(out_shape))
        if rule.stack is not None:
            out_shape = rule.stack.output_shape(out_shape)
    except (errors.ObjckptError, NotImplementedError) as err:
        problems.append(_render.first_line(err))
        out_shape = None
    return tuple(parts), key, full, problems, out_shape, dtype


def _group(source: Source, rules, target: str, pieces: dict) -> Stacked:
    """The group of entries one variable is made of, checked from metadata."""
    lead = rules[min(pieces)]
    built = [(rules[i], *_piece(source, rules[i], members)) for i, members in pieces.items()]
    problems = [p for *_, piece_problems, _, _ in built for p in piece_problems]
    shape = None
    if lead.concat is not None:
        built.sort(key=lambda b: b[0].concat.index)
        shape, problems = _joined(rules, target, built, problems)
    elif built[0][-2] is not None:
        shape = built[0][-2]
    dtype = built[0][-1]
    for rule, parts, *_ in built[1:]:
        if source.specs[next(p for p in parts if p)][1] != dtype:
            problems.append(f"the entries of {rule} are not {dtype.name}, as those of "
                            f"{built[0][0]} are")
    dtype = _summed_dtype(lead, dtype)
    key = " + ".join(b[2] for b in built)
    full = " + ".join(b[3] for b in built)
    problem = ""
    if problems:
        problem = (f"made of the entries `{_render.safe(full)}` by "
                   f"{' and '.join(str(b[0]) for b in built)}, but " + "; ".join(problems))
    if shape is None:
        first = source.specs[next(p for p in built[0][1] if p)][0]
        shape = (len(built[0][1]), *first)
    return Stacked(key, full, lead, target, tuple(p for b in built for p in b[1]),
                   tuple(shape), dtype, problem, tuple((b[0], b[1]) for b in built))


def _joined(rules, target: str, built: list, problems: list) -> tuple:
    """(the joined shape or None, problems) of a Concat (or Sum) group's pieces."""
    problems = list(problems)
    cut = built[0][0].concat
    indexes = [b[0].concat.index for b in built]
    for rule, *_ in built:
        if not rule.concat.same_cut(cut):
            problems.append(f"{rule} and {built[0][0]} cut `{_render.safe(target)}` "
                            "differently (each Concat needs the same axis and parts, each "
                            "Sum the same parts)")
            return None, problems
    for index in sorted(set(indexes)):
        if indexes.count(index) > 1:
            problems.append(f"{indexes.count(index)} rules give part {index}")
    for index in range(cut.count):
        if index not in indexes:
            named = [str(r) for r in rules if r.concat is not None and r.concat.index == index
                     and r.target is not None and r.target.match(target)]
            problems.append(f"no entry gives part {index} of {cut.count}"
                            + (f" (the source lacks what {' or '.join(named)} reads)"
                               if named else ""))
    if problems or any(b[-2] is None for b in built):
        return None, problems
    if isinstance(cut, _rules_core.Sum):
        return _summed(built, problems)
    whole = None
    for rule, *_, shape, _ in built:
        try:
            made = rule.concat.output_shape(shape)
        except errors.ObjckptError as err:
            problems.append(_render.first_line(err))
            return None, problems
        if whole is not None and made != whole:
            problems.append(f"the entries of {rule} give part shape {shape}, which does not "
                            f"join the others' into {whole}")
            return None, problems
        whole = made
    return whole, problems


def _summed(built: list, problems: list) -> tuple:
    """(term 0's shape or None, problems) of a Sum group's pieces (index order): every
    other term must have that shape, save size 1 on its broadcast axes."""
    whole = built[0][-2]
    for rule, parts, *_, shape, _ in built[1:]:
        try:
            want = rule.concat.term_shape(whole)
        except errors.ObjckptError as err:
            problems.append(_render.first_line(err))
            return None, problems
        if tuple(shape) != want:
            entry = _render.safe(next(p for p in parts if p))
            problems.append(f"term {rule.concat.index} `{entry}` has shape {tuple(shape)} "
                            f"(after {rule}), but term 0 has {whole}, so the term must have "
                            f"{want}")
            return None, problems
    return whole, problems


def _summed_dtype(lead: ParsedRule, dtype):
    """The dtype of a group: its entries', but float32 for a Sum of 16-bit float terms
    (bfloat16, float16): their sum is what a float32 model computes from the widened terms
    (as transformers does in float32), which 16 bits would round once more; a 16-bit
    variable takes it by a lossy cast, which the caller asks for (`cast="lossy"`)."""
    import tensorflow as tf

    if isinstance(lead.concat, _rules_core.Sum) and dtype in (tf.bfloat16, tf.float16):
        return tf.float32
    return dtype


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


def _assembled(source: Source, group: Stacked):
    """The group's value: a buffer of its shape, each entry read, transformed and copied into
    its place (its Concat's region, its Stack's index), one at a time."""
    import numpy as np
    import tensorflow as tf

    if group.problem:  # the check stage refuses such a plan: never read
        raise errors.StructureMismatchError(
            f"{group.problem}. Nothing was changed. Fix: give the source every entry the "
            "Stack or Concat rule reads, each of one shape and dtype, or change the rule.")
    made, buffer = _empty(group.shape, group.dtype)
    for rule, parts in group.pieces:
        term = rule.concat if isinstance(rule.concat, _rules_core.Sum) else None
        region = buffer if rule.concat is None or term is not None else buffer[
            rule.concat.region(group.shape)]
        for index, part in enumerate(parts):
            slot = region
            if rule.stack is not None:
                slot = region[(slice(None),) * (rule.stack.axis % region.ndim) + (index,)]
            (value,) = source.fetch([part])
            if rule.part is not None:
                value = rule.part(value)
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            want = slot.shape if term is None else term.term_shape(slot.shape)
            promised = np.dtype(source.specs[part][1].as_numpy_dtype)
            if term is not None and value.dtype == promised != buffer.dtype:
                value = value.astype(buffer.dtype)  # a 16-bit float term, widened exactly
            if value.shape != want or value.dtype != buffer.dtype:
                raise errors.CheckpointCorruptError(
                    f"{source.description}: entry `{_render.safe(part)}` read as "
                    f"{value.dtype.name}{tuple(value.shape)}, but its metadata promised "
                    f"{buffer.dtype.name}{want} (after {rule}); nothing was changed. "
                    "Fix: restore from another checkpoint, or write this one again.",
                    source=source.description)
            if term is not None and term.index:  # a Sum's later term: added in
                slot += value
            else:
                slot[...] = value
            del value, slot
        del region
    if made is None:  # a dtype TF's Empty kernel or DLPack lacks (bfloat16): one copy more
        return tf.convert_to_tensor(buffer)
    del buffer
    return made


def _empty(shape: tuple, dtype) -> tuple:
    """(a new tensor TF allocated, a writable NumPy view of its buffer), so the assembled
    value is not copied again; (None, a NumPy array) where TF cannot give one."""
    import numpy as np

    from objckpt._bundle import fastio as _fastio

    numpy_dtype = np.dtype(dtype.as_numpy_dtype)
    if dtype.name in _DIRECT and all(d > 0 for d in shape):
        made, raw = _fastio.empty_tensor(dtype, shape)
        return made, np.frombuffer(raw, numpy_dtype).reshape(shape)
    return None, np.empty(shape, numpy_dtype)


# The dtypes TF's CPU `Empty` kernel takes in every supported TF and DLPack carries
# (`_fastio.empty_tensor`).
_DIRECT = frozenset({"float32", "float64", "int32", "uint8", "int64", "float16"})


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
                "nothing was changed:\n" + "\n".join(_render.listed(wrong))
                + "\nFix: give the source every entry the Stack or Concat rule reads, each of "
                "the shape and dtype the variable needs, or change the rule.", tuple(wrong))

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

