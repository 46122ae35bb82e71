"""Per-path differences between two checkpoints.

`diff(a, b)` compares two checkpoints entry by entry: object-based ones by
object path, name-based (TF1 `Saver`) ones by global variable name, a safetensors
file by its tensor names (an obj's object paths when it was written by them). Shapes
and dtypes are compared from metadata first; values are then read one pair of
tensors at a time and compared with NumPy in bounded chunks, so memory stays
near the largest tensor, never the whole checkpoints.

No TensorFlow: each side is read through the format registry (`_meta`), values by
its format's `read` role: a TF checkpoint's tensor straight from its data shard's
byte range (validated against the index, its crc32c checked) into NumPy, string
tensors decoded from TF's framing (only a partitioned variable of a TF1 checkpoint
or a variant tensor is read with TF's reader, which is imported then), a
safetensors tensor from the file's memory map.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple

import numpy as np

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._inspect import meta as _meta
from objckpt._inspect import pairing as _pairing

__all__ = ["Diff", "ShapeDiff", "ValueDiff", "diff"]

# Entries a checkpoint writes for itself: never compared.
_BOOKKEEPING = frozenset({
    "save_counter", _paths.checkpoint_key("save_counter"), _bundle.OBJECT_GRAPH_KEY})
# Elements compared per NumPy step: bounds the temporaries (float64 copies, masks).
_CHUNK = 1 << 20


class ShapeDiff(NamedTuple):
    """A path whose shape or dtype differs: `(path, a, b)`, e.g. `float32 (3, 4)`."""

    path: str
    a: str
    b: str


class ValueDiff(NamedTuple):
    """A path whose values differ: `(path, max_abs_diff, differing, size)`.

    `max_abs_diff` is the largest |a - b| over the differing values (NaN
    against a number is left out unless nothing else differs; then it is
    NaN), or None for strings, which are compared for equality only.
    """

    path: str
    max_abs_diff: float | None
    differing: int
    size: int


@dataclasses.dataclass(frozen=True)
class Diff:
    """What differs between two checkpoints (see `diff`).

    Attributes:
      a, b: the checkpoint prefixes compared (a directory resolved to its
        newest intact checkpoint).
      only_in_a, only_in_b: paths (or names) present on one side only.
      shape_or_dtype: `ShapeDiff(path, a_desc, b_desc)` per path present on
        both sides whose stored shape or dtype differs; values not compared.
      values: `ValueDiff(path, max_abs_diff, differing, size)` per path whose
        values differ.
      equal: the number of paths on both sides with equal values.
      notes: remarks that do not change the result: a name-based side, an
        older checkpoint used because the newest is damaged, a likely nesting
        difference between the two roots.
      rtol, atol: the tolerances used; both 0 means bit-exact.
      names: path -> (network path, saved variable name) for the paths above
        (A's where both have one): how `objckpt diff` shows them, e.g.
        `optimizer/_trainable_variables/0` -> (`_functional/_operations/1/_kernel`,
        `sequential/encoder/kernel`) for a trained Keras 3 model.
      cast: `ShapeDiff(path, a_desc, b_desc)` per path whose dtypes differ by a
        lossless cast (bfloat16 and float32, say), compared by value after the cast
        because a tolerance was given (without one they are `shape_or_dtype`).
      rewritten: with rules, {A key: the key the rules made of it (None: left out)} for
        each key a rule changed.
      paired: with rules, {B path: A key} for the paths above compared with an A key
        of another name (the paths shown are B's).
    """

    a: str
    b: str
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    shape_or_dtype: tuple[ShapeDiff, ...] = ()
    values: tuple[ValueDiff, ...] = ()
    equal: int = 0
    notes: tuple[str, ...] = ()
    rtol: float = 0.0
    atol: float = 0.0
    names: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    cast: tuple[ShapeDiff, ...] = ()
    rewritten: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    paired: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def same(self) -> bool:
        """True when both sides have the same paths (A's as the rules rewrote them), shapes,
        dtypes (but for lossless casts, with a tolerance) and values."""
        return not (self.only_in_a or self.only_in_b or self.shape_or_dtype or self.values)

    @property
    def differ(self) -> int:
        """The number of paths that differ in any way (present on one side included)."""
        return (len(self.only_in_a) + len(self.only_in_b) + len(self.shape_or_dtype)
                + len(self.values))


@dataclasses.dataclass
class _Side:
    label: str  # "A" or "B"
    meta: _meta.Metadata
    entries: dict  # path or name -> (shape, _meta.DType, checkpoint key)

    @property
    def prefix(self) -> str:
        return self.meta.prefix

    @property
    def name_based(self) -> bool:
        return self.meta.name_based


def _open(source, label: str, notes: list) -> _Side:
    if not isinstance(source, (str, os.PathLike)):  # a Snapshot, a live obj
        raise errors.UnsupportedFormatError(
            f"diff compares checkpoints on disk; {label} is a {type(source).__name__}. "
            "Expected: a checkpoint prefix, a directory or a file. Fix: write it first "
            "(objckpt.save(snapshot_or_obj, prefix)) and diff that prefix.")
    meta = _meta.read(source)  # any format, through the registry
    if meta.read is None:  # a format whose values are not read without TF (HDF5)
        raise errors.UnsupportedFormatError(
            f"diff compares TF checkpoints; {label} is {_render.safe_text(meta.description)}. "
            "(safetensors files are compared too.) Fix: write it as a checkpoint first "
            "(objckpt.migrate(model, source, prefix), or objckpt migrate SOURCE OUT "
            "--template MODULE:CALLABLE) and diff that.")
    notes.extend(f"{label}: {note}" for note in meta.notes)
    entries = {path: (v.shape, v.dtype, v.key) for path, v in meta.items()
               if path not in _BOOKKEEPING}
    if meta.name_based:
        entries = dict(sorted(entries.items()))
    return _Side(label, meta, entries)


def _tolerance(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise errors.InvalidArgumentError(
            f"objckpt.diff: {name}= must be a finite number >= 0. Received: {name}={value!r}. "
            f"Fix: pass e.g. {name}=1e-6, or 0 (the default) for bit-exact comparison.")
    return number


def _describe(shape, dtype) -> str:
    return f"{dtype.name} {_render.shape(shape)}"


_FLOATS = frozenset({"float16", "float32", "float64", "bfloat16", "float8_e5m2",
                     "float8_e4m3fn"})
_INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                       "uint64"})


def _read(side: _Side, path: str, key: str):
    """The values of one tensor as a flat-able NumPy array (objects for strings), read by
    its format's `read` (bfloat16 widened to float32)."""
    try:
        return side.meta.read(key)
    except errors.CheckpointCorruptError as err:
        safe = _render.safe
        raise errors.CheckpointCorruptError(
            f"Checkpoint {side.label} `{safe(side.prefix)}`: the value of `{safe(path)}` (key "
            f"`{safe(key)}`) cannot be read: {err}\nFix: compare against another copy of the "
            "checkpoint, or write it again.", source=side.prefix) from err


def _bits_differ(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    size = x.dtype.itemsize
    if size in (1, 2, 4, 8):
        return x.view(f"u{size}") != y.view(f"u{size}")
    return (x.view(np.uint8).reshape(-1, size) != y.view(np.uint8).reshape(-1, size)).any(axis=1)


def _compare(x, y, dtype: _meta.DType, rtol: float, atol: float) -> tuple[float | None, int]:
    """Returns (max |x - y| over differing values, number of differing values)."""
    if dtype.name == "string":  # data, compared for equality only (invariant 2)
        x = np.asarray(x, dtype=object).reshape(-1)
        y = np.asarray(y, dtype=object).reshape(-1)
        return None, int(np.count_nonzero(x != y))
    x = np.ascontiguousarray(x).reshape(-1)
    y = np.ascontiguousarray(y).reshape(-1)
    exact = rtol == 0 and atol == 0
    complex_ = dtype.name.startswith("complex")
    inexact = dtype.name in _FLOATS or complex_
    numeric = inexact or dtype.name in _INTEGERS
    wide = np.complex128 if complex_ else np.float64
    count, largest, nan_only = 0, -math.inf, False
    for start in range(0, x.size, _CHUNK):
        xs, ys = x[start:start + _CHUNK], y[start:start + _CHUNK]
        if not numeric:  # bool, quantized: equal or not
            differ = _bits_differ(xs, ys) if dtype.name != "bool" else xs != ys
        else:
            differ = _bits_differ(xs, ys)
            if not differ.any():
                continue
            xw, yw = xs.astype(wide), ys.astype(wide)
            if inexact:  # NaNs at the same positions are equal
                differ &= ~(np.isnan(xw) & np.isnan(yw))
            if not exact:
                differ &= ~np.isclose(xw, yw, rtol=rtol, atol=atol, equal_nan=True)
        n = int(np.count_nonzero(differ))
        if not n:
            continue
        count += n
        if numeric:
            gaps = np.abs(xw[differ] - yw[differ])
            finite = gaps[~np.isnan(gaps)]
            if finite.size:
                largest = max(largest, float(finite.max()))
            else:
                nan_only = True
        else:
            largest = max(largest, 1.0)
    if not count:
        return 0.0, 0
    if largest == -math.inf and nan_only:
        largest = math.nan
    return largest, count


def _nesting_hint(a: _Side, b: _Side) -> str | None:
    """Says when one side's paths are the other's under one top-level name."""
    for outer, inner in ((a, b), (b, a)):
        tops = dict.fromkeys(path.split("/", 1)[0] for path in outer.entries if "/" in path)
        for top in tops:
            nested = {path[len(top) + 1:] for path in outer.entries
                      if path.startswith(top + "/")}
            if nested & inner.entries.keys():
                return (
                    f"no object path is in both, but {inner.label}'s paths appear in "
                    f"{outer.label} under `{_render.safe(top)}/`: {outer.label} was likely "
                    f"written by tf.train.Checkpoint({_render.safe(top)}=obj) and {inner.label} "
                    "with obj as root (objckpt.save). Save both the same way to compare them "
                    "path by path.")
    return None


def diff(a: str | os.PathLike, b: str | os.PathLike, *, rtol: float = 0.0,
         atol: float = 0.0, rules=None) -> Diff:
    """Compares two checkpoints path by path: presence, shape, dtype, values.

    Object-based checkpoints are compared by object path; name-based (TF1
    `Saver`) ones by global variable name. When one is object-based and the
    other name-based, keys are compared as they are and a note says they
    rarely line up. `save_counter` and the object graph are ignored.

    Values are read one pair of tensors at a time. With `rtol = atol = 0`
    they must be bit-identical, except that NaNs at the same positions count
    as equal; otherwise a value differs when `|a - b| > atol + rtol * |b|`
    (NumPy's `isclose`, B the reference). Integers and floats of any width
    (float16, bfloat16 included) are compared numerically, booleans and
    strings for equality only. With a tolerance, two tensors whose dtypes
    differ by a lossless cast (bfloat16 or float16 and float32, float32 and
    float64, integer widening) are compared by value after it (listed in
    `Diff.cast`); without one, that is a dtype difference.

    With `rules`, A's keys are rewritten as restore rewrites a source's keys
    (the first rule whose regex matches, once; None leaves the entry out), then
    compared with B's paths: equal, or equal with leading underscores stripped
    from each edge. A TF1 checkpoint and its migrated form, or a Hugging Face
    folder and an export without rules, compare path by path that way. Rule
    transforms are not applied: a layout that differs shows as a shape.

    TensorFlow is not imported: tensors are read straight from the data
    shards' byte ranges the index validated (each crc32c checked) into NumPy,
    strings decoded from TF's framing. Only a partitioned variable of a TF1
    checkpoint and a variant tensor are read with TF's reader.

    Args:
      a, b: checkpoint prefixes (`prefix.index` may be given too) or
        directories of managed checkpoints (the newest intact one is used).
      rtol: relative tolerance, >= 0.
      atol: absolute tolerance, >= 0.
      rules: None, or (regex, replacement) pairs (`objckpt.rules.Rule`s too)
        rewriting A's keys.

    Returns:
      A `Diff`; `Diff.same` is True when nothing differs.

    Raises:
      CheckpointNotFoundError: nothing at `a` or `b`.
      CheckpointCorruptError: an index, object graph or tensor cannot be read.
      InvalidArgumentError: a negative or non-finite tolerance.

    Example:
      >>> d = objckpt._inspect.diff.diff("run1/ckpt-5", "run2", atol=1e-6)
      >>> d.same, [v.path for v in d.values]
      (False, ['model/encoder/w'])
    """
    rtol, atol = _tolerance(rtol, "rtol"), _tolerance(atol, "atol")
    parsed = _pairing.parse_rules(rules)
    notes: list[str] = []
    side_a = _open(a, "A", notes)
    side_b = _open(b, "B", notes)
    if side_a.name_based != side_b.name_based:
        named, other = (side_a, side_b) if side_a.name_based else (side_b, side_a)
        notes.append(
            f"{named.label} (`{_render.safe(named.prefix)}`) is name-based (TF1 Saver) and "
            f"{other.label} is object-based: keys are compared as they are (global variable "
            "names against object paths), so they rarely line up. To compare by structure, "
            "pass rules that rewrite A's keys into B's (rules=[...]), or migrate the "
            "name-based one onto your model first (objckpt.migrate with rules) and diff the "
            "result.")
    elif side_a.name_based:
        notes.append("A and B are name-based (TF1 Saver): compared by global variable name.")
    pairs = _pairing.pair(side_a.entries, side_b.entries, parsed)
    notes.extend(_rule_notes(pairs, parsed))
    shape_or_dtype, values, equal, cast, paired = [], [], 0, [], {}
    tolerant = rtol > 0 or atol > 0
    for key_a, path in pairs.matched:
        shape, dtype, key = side_a.entries[key_a]
        other = side_b.entries[path]
        if key_a != path:
            paired[path] = key_a
        x = y = None
        if (shape, dtype) != other[:2]:
            if not (tolerant and shape == other[0]
                    and _pairing.lossless(dtype.name, other[1].name)):
                shape_or_dtype.append(
                    ShapeDiff(path, _describe(shape, dtype), _describe(*other[:2])))
                continue
            cast.append(ShapeDiff(path, _describe(shape, dtype), _describe(*other[:2])))
            x, y = _pairing.common(_read(side_a, key_a, key), _read(side_b, path, other[2]))
        largest, count = _compare(
            _read(side_a, key_a, key) if x is None else x,
            _read(side_b, path, other[2]) if y is None else y, dtype, rtol, atol)
        if count:
            size = math.prod(shape)
            values.append(ValueDiff(path, largest, count, size))
        else:
            equal += 1
    notes.extend(_layout_notes(pairs.matched, side_a, side_b))
    if cast:
        kinds = sorted({f"{d.a.split()[0]} in A, {d.b.split()[0]} in B" for d in cast})
        notes.append(f"{len(cast):,} path(s) differ in dtype by a lossless cast ("
                     f"{'; '.join(kinds)}): their values were compared after it, as a "
                     "tolerance was given.")
    only_in_a = pairs.only_in_a
    matched_b = {path for _, path in pairs.matched}
    only_in_b = [path for path in side_b.entries if path not in matched_b]
    compared = len(pairs.matched)
    if (not compared and side_a.entries and side_b.entries
            and not (side_a.name_based or side_b.name_based)):
        hint = _nesting_hint(side_a, side_b)
        if hint:
            notes.append(hint)
    shown = [*only_in_a, *only_in_b, *(d.path for d in shape_or_dtype),
             *(d.path for d in values)]
    listed = {*shown, *(d.path for d in cast)}
    return Diff(side_a.prefix, side_b.prefix, tuple(only_in_a), tuple(only_in_b),
                tuple(shape_or_dtype), tuple(values), equal, tuple(notes), rtol, atol,
                _names(shown, side_a, side_b), tuple(cast), pairs.rewritten,
                {p: k for p, k in paired.items() if p in listed})


def _layout_notes(matched, side_a: _Side, side_b: _Side) -> list[str]:
    """A note for each compared path stored partitioned on either side (a sharded variable:
    one key, one slice per shard): its layout on each side; it is compared whole."""
    notes = []
    for key_a, path in matched:
        a = getattr(side_a.meta.get(key_a), "layout", "")
        b = getattr(side_b.meta.get(path), "layout", "")
        if a or b:
            where = (f"{a} in A and B" if a == b else
                     f"{a or 'one whole tensor'} in A, {b or 'one whole tensor'} in B")
            notes.append(f"`{_render.safe(path)}` is stored as {where}: compared as one "
                         "tensor, whole")
    return notes


def _rule_notes(pairs: _pairing.Pairs, rules) -> list[str]:
    """What the rules did that the lines do not show."""
    notes = []
    if pairs.dropped:
        notes.append(f"rules left out {len(pairs.dropped):,} of A's entries (replacement None)")
    for key, path in pairs.taken[:3]:
        notes.append(f"A's `{_render.safe(key)}` became `{_render.safe(path)}`, which another "
                     "key of A matched first: listed as only in A")
    if any(rule.transform for rule in rules):
        notes.append("rule transforms are not applied by diff: a layout the transform changes "
                     "shows as a shape difference")
    return notes


def _names(paths, *sides: _Side) -> dict:
    """path -> (network path, saved name) where either says more than the path."""
    out = {}
    for path in paths:
        variable = next((s.meta[path] for s in sides if path in s.meta), None)
        if variable is not None and (variable.shown != path
                                     or variable.name not in ("", path)):
            out[path] = (variable.shown, variable.name)
    return out
