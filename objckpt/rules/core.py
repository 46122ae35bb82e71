"""The rules and transforms themselves (see the package docstring, `objckpt.rules`)."""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable, Sequence

from objckpt import errors

__all__ = ["NOWHERE", "Chain", "Concat", "ConvKernel", "Crop", "Pad", "Reshape", "Rule",
           "RuleSet", "Split", "Stack", "Sum", "Transform", "Transpose", "Unstack", "Zeros",
           "placement_of", "split_of", "stack_of"]

# The target of a head entry that no model has a variable for (a tied decoder, a head
# keras-hub has no layer for): `Rule(entry, f"{NOWHERE}/{entry}", head=...)` sets it aside.
NOWHERE = "(no variable)"

# What one `{name}` placeholder matches: one name segment of a dotted or a `/`-joined name.
SEGMENT = r"[^/.]+"


# --- transforms -------------------------------------------------------------------------------

class Transform:
    """A value transform with an exact inverse: `t(value)`, `t.inverse()`."""

    def __call__(self, value):
        raise NotImplementedError

    def inverse(self) -> Transform:
        raise NotImplementedError

    def output_shape(self, shape: tuple) -> tuple:
        """The shape `self` makes of a value of `shape` (known dimensions), without the
        value: export sizes its files before it transforms a byte."""
        raise NotImplementedError


def _is_numpy(value) -> bool:
    import numpy as np

    return isinstance(value, np.ndarray)


def _static_shape(value) -> tuple | None:
    """The value's shape with None for unknown dimensions, or None for an unknown rank."""
    shape = value.shape
    if getattr(shape, "rank", 0) is None:  # a tf.TensorShape of unknown rank
        return None
    return tuple(None if d is None else int(d) for d in shape)


def _transpose(value, perm):
    if _is_numpy(value):
        import numpy as np

        return np.transpose(value, perm).copy()  # C-contiguous, as TF's
    import tensorflow as tf

    return tf.transpose(value, perm=perm)


def _check_rank(what: Transform, shape: tuple | None, rank: int) -> None:
    if shape is not None and len(shape) != rank:
        raise errors.InvalidArgumentError(
            f"{what!r} permutes {rank} axes but received a value of shape {shape} (rank "
            f"{len(shape)}). Fix: attach this transform only to rules whose entries have "
            f"{rank} axes, or give a permutation of {len(shape)} axes.")


@dataclasses.dataclass(frozen=True)
class Transpose(Transform):
    """Permutes axes: `perm=None` reverses them (2-D: a torch `Linear` weight (out, in) <->
    a Keras kernel (in, out)); else `perm` as in `tf.transpose`. Its inverse permutes back."""

    perm: tuple | None = None

    def __post_init__(self):
        if self.perm is None:
            return
        perm = tuple(self.perm) if isinstance(self.perm, (list, tuple)) else None
        if perm is None or sorted(perm) != list(range(len(perm))) or not all(
                type(p) is int for p in perm):
            raise errors.InvalidArgumentError(
                f"Transpose needs perm=None (reverse the axes) or a permutation of "
                f"0..n-1 as a tuple of ints. Received: perm={self.perm!r}. Fix: pass e.g. "
                "perm=(1, 0) or perm=(2, 3, 1, 0).")
        object.__setattr__(self, "perm", perm)

    def __call__(self, value):
        if self.perm is not None:
            _check_rank(self, _static_shape(value), len(self.perm))
        return _transpose(value, self.perm)

    def output_shape(self, shape: tuple) -> tuple:
        if self.perm is None:
            return tuple(reversed(shape))
        _check_rank(self, tuple(shape), len(self.perm))
        return tuple(shape[axis] for axis in self.perm)

    def inverse(self) -> Transpose:
        if self.perm is None:
            return self
        inverse = [0] * len(self.perm)
        for axis, source in enumerate(self.perm):
            inverse[source] = axis
        return Transpose(tuple(inverse))


@dataclasses.dataclass(frozen=True)
class ConvKernel(Transform):
    """Reorders a kernel's axes from one layout to another by their letters, e.g.
    `ConvKernel("OIHW", "HWIO")` (torch Conv2d -> Keras Conv2D). Its inverse swaps them."""

    source: str
    target: str

    def __post_init__(self):
        ok = (isinstance(self.source, str) and isinstance(self.target, str)
              and len(set(self.source)) == len(self.source) > 0
              and sorted(self.source) == sorted(self.target))
        if not ok:
            raise errors.InvalidArgumentError(
                f"ConvKernel needs two layouts of the same distinct letters, one per axis. "
                f"Received: ConvKernel({self.source!r}, {self.target!r}). Fix: pass e.g. "
                "ConvKernel('OIHW', 'HWIO') or ConvKernel('OIDHW', 'DHWIO').")

    @property
    def perm(self) -> tuple:
        return tuple(self.source.index(letter) for letter in self.target)

    def __call__(self, value):
        _check_rank(self, _static_shape(value), len(self.source))
        return _transpose(value, self.perm)

    def output_shape(self, shape: tuple) -> tuple:
        _check_rank(self, tuple(shape), len(self.source))
        return tuple(shape[axis] for axis in self.perm)

    def inverse(self) -> ConvKernel:
        return ConvKernel(self.target, self.source)


def _shape_tuple(shape, what: str) -> tuple:
    dims = tuple(shape) if isinstance(shape, (list, tuple)) else None
    if dims is None or not all(type(d) is int and d >= -1 for d in dims) or dims.count(-1) > 1:
        raise errors.InvalidArgumentError(
            f"Reshape's {what} must be a tuple of ints >= 0 with at most one -1. Received: "
            f"{shape!r}. Fix: pass e.g. Reshape((768, 768), (768, 12, 64)) or "
            "Reshape((768, 768), (768, 12, -1)).")
    return dims


@dataclasses.dataclass(frozen=True)
class Reshape(Transform):
    """Reshapes a value of `from_shape` to `to_shape` (-1: the one dimension inferred), e.g.
    `Reshape((h, h), (h, heads, head_dim))`. A value of another shape is refused (a plan
    reports it before anything is read). Its inverse reshapes back."""

    from_shape: tuple
    to_shape: tuple

    def __post_init__(self):
        object.__setattr__(self, "from_shape", _shape_tuple(self.from_shape, "from_shape"))
        object.__setattr__(self, "to_shape", _shape_tuple(self.to_shape, "to_shape"))

    def _check(self, shape: tuple | None) -> None:
        if shape is not None and (len(shape) != len(self.from_shape) or any(
                want != -1 and got is not None and got != want
                for want, got in zip(self.from_shape, shape))):
            raise errors.InvalidArgumentError(
                f"{self!r} expects a value of shape {self.from_shape} (-1: any) but received "
                f"one of shape {shape}. Fix: attach it to the rule whose entries have that "
                "shape, or correct from_shape.")

    def output_shape(self, shape: tuple) -> tuple:
        shape = tuple(shape)
        self._check(shape)
        size = 1
        for dim in shape:
            size *= dim
        known = 1
        for dim in self.to_shape:
            known *= dim if dim != -1 else 1
        if -1 in self.to_shape:
            if known == 0 or size % known:
                raise errors.InvalidArgumentError(
                    f"{self!r} cannot reshape a value of shape {shape} ({size} elements) to "
                    f"{self.to_shape}. Fix: correct to_shape.")
            return tuple(size // known if dim == -1 else dim for dim in self.to_shape)
        if known != size:
            raise errors.InvalidArgumentError(
                f"{self!r} cannot reshape a value of shape {shape} ({size} elements) to "
                f"{self.to_shape} ({known} elements). Fix: correct the shapes.")
        return self.to_shape

    def __call__(self, value):
        self._check(_static_shape(value))
        if _is_numpy(value):
            return value.reshape(self.to_shape)
        import tensorflow as tf

        return tf.reshape(value, self.to_shape)

    def inverse(self) -> Reshape:
        return Reshape(self.to_shape, self.from_shape)


def _split_arguments(axis, parts, sizes, index) -> tuple:
    """(axis, parts, sizes) validated; InvalidArgumentError naming what is wrong."""
    shown = f"Split(axis={axis!r}, parts={parts!r}, sizes={sizes!r}, index={index!r})"
    if type(axis) is not int:
        raise errors.InvalidArgumentError(
            f"{shown}: axis must be an int (negative counts from the end). Fix: pass e.g. "
            "Split(axis=-1, parts=3, index=0).")
    if (parts is None) == (sizes is None):
        raise errors.InvalidArgumentError(
            f"{shown}: give exactly one of parts (equal parts) and sizes (the size of each "
            "part). Fix: pass e.g. Split(axis=-1, parts=3, index=0) or "
            "Split(axis=0, sizes=(64, 16, 16), index=1).")
    if parts is not None:
        if type(parts) is not int or parts < 1:
            raise errors.InvalidArgumentError(
                f"{shown}: parts must be an int >= 1. Fix: pass the number of equal parts, "
                "e.g. parts=3 for a fused query/key/value.")
        count = parts
    else:
        sizes = tuple(sizes) if isinstance(sizes, (list, tuple)) else None
        if not sizes or not all(type(n) is int and n >= 0 for n in sizes):
            raise errors.InvalidArgumentError(
                f"{shown}: sizes must be a non-empty tuple of ints >= 0. Fix: pass e.g. "
                "sizes=(64, 16, 16).")
        count = len(sizes)
    if type(index) is not int or not 0 <= index < count:
        raise errors.InvalidArgumentError(
            f"{shown}: index must be an int in 0..{count - 1} (the part this rule takes). "
            f"Fix: pass index=0 .. index={count - 1}.")
    return axis, parts, sizes


@dataclasses.dataclass(frozen=True)
class _Cut(Transform):
    """What `Split` and `Concat` share: part `index` of `parts` equal parts, or of parts of
    the given `sizes`, along `axis` (validated when made)."""

    axis: int
    parts: int | None = None
    sizes: tuple | None = None
    index: int = 0

    def __post_init__(self):
        _, _, sizes = _split_arguments(self.axis, self.parts, self.sizes, self.index)
        object.__setattr__(self, "sizes", sizes)

    @property
    def count(self) -> int:
        """How many parts there are."""
        return self.parts if self.parts is not None else len(self.sizes)

    def same_cut(self, other) -> bool:
        """Whether `other` is of this kind and cuts the same way (its index aside)."""
        return isinstance(other, type(self)) and (other.axis, other.parts, other.sizes) == (
            self.axis, self.parts, self.sizes)


@dataclasses.dataclass(frozen=True)
class Split(_Cut):
    """Part `index` of a value cut along `axis` into `parts` equal parts or parts of the
    given `sizes`, e.g. `Split(axis=-1, parts=3, index=1)`: the key of GPT-2's fused
    `c_attn` weight (h, 3h).

    Several `Rule`s with the same source pattern, each with its own `index` (a `Split`
    alone, or first in a `Chain`), feed one source tensor to several variables at restore.
    A Split on its own has no inverse: `objckpt.export` undoes it by putting each variable
    of such a group through the inverse of the rest of its chain and concatenating them
    along `axis`, in index order, under the one source name.
    """

    def _bounds(self, shape: tuple | None) -> tuple:
        """(axis as a non-negative int, start, stop) of part `index` in a value of `shape`."""
        if shape is None:
            raise errors.InvalidArgumentError(
                f"{self!r} needs a value of known rank. Fix: attach it to a rule whose "
                "entries have a known shape.")
        rank = len(shape)
        if not -rank <= self.axis < rank:
            raise errors.InvalidArgumentError(
                f"{self!r} cuts along axis {self.axis}, but received a value of shape "
                f"{tuple(shape)} (rank {rank}). Fix: pass an axis in {-rank}..{rank - 1}.")
        axis = self.axis % rank
        dim = shape[axis]
        if self.parts is not None:
            if dim is not None and dim % self.parts:
                raise errors.InvalidArgumentError(
                    f"{self!r} cuts axis {self.axis} into {self.parts} equal parts, but that "
                    f"axis of shape {tuple(shape)} has {dim}, not a multiple of "
                    f"{self.parts}. Fix: give sizes=... for unequal parts, or attach the "
                    "rule to the entry it was written for.")
            size = None if dim is None else dim // self.parts
            sizes = (size,) * self.parts
        else:
            sizes = self.sizes
            if dim is not None and sum(sizes) != dim:
                raise errors.InvalidArgumentError(
                    f"{self!r} cuts axis {self.axis} into sizes {sizes} ({sum(sizes)} in "
                    f"all), but that axis of shape {tuple(shape)} has {dim}. Fix: give "
                    "sizes that add up to the axis, or attach the rule to the entry it was "
                    "written for.")
        if sizes[0] is None:
            return axis, None, None
        start = sum(sizes[: self.index])
        return axis, start, start + sizes[self.index]

    def __call__(self, value):
        shape = _static_shape(value)
        axis, start, stop = self._bounds(shape)
        if start is None:  # an unknown dimension (traced): cut by the runtime size
            import tensorflow as tf

            dim = tf.shape(value)[axis] // self.parts
            start, stop = dim * self.index, dim * (self.index + 1)
        cut = tuple(slice(start, stop) if a == axis else slice(None)
                    for a in range(len(shape)))
        if _is_numpy(value):
            return value[cut].copy()  # C-contiguous, as TF's
        return value[cut]

    def output_shape(self, shape: tuple) -> tuple:
        shape = tuple(shape)
        axis, start, stop = self._bounds(shape)
        return tuple(stop - start if a == axis else d for a, d in enumerate(shape))

    def inverse(self) -> Transform:
        raise errors.InvalidArgumentError(
            f"{self!r} keeps one part of a tensor, so it has no inverse on its own. Fix: "
            "give every part a Rule with the same source pattern (index=0.."
            f"{self.count - 1}); objckpt.export concatenates those variables back into one "
            "tensor.")


def split_of(transform) -> tuple:
    """(the Split a transform starts with, the rest of it or None), or (None, transform)
    when it starts with none: a `Split`, or a `Chain` whose first transform is one."""
    if isinstance(transform, Split):
        return transform, None
    if isinstance(transform, Chain) and isinstance(transform.transforms[0], Split):
        rest = transform.transforms[1:]
        return transform.transforms[0], (Chain(*rest) if len(rest) > 1 else
                                         rest[0] if rest else None)
    return None, transform


@dataclasses.dataclass(frozen=True)
class Stack(Transform):
    """Many entries -> one variable: the entries a rule's source pattern matches that differ
    only in the placeholder `over` (`e` of `model.layers.{i}.mlp.experts.{e}.w1.weight`),
    stacked along a new `axis` of size `count`, entry `{over}=k` at index k (a mixture of
    experts' per-expert weights -> keras-hub's one expert bank).

    `over` is the one placeholder a rule may have in its source only. A Stack is a rule's
    transform on its own or last in a `Chain`; what comes before it in the chain transforms
    each entry (`Chain(Transpose(), Stack("e", 8))`: each torch weight transposed, then
    stacked). Every part's shape and dtype is checked from metadata before a byte is read,
    and an index missing from 0..count-1 is an error that names its entry. Its inverse at
    export: `Unstack(axis, k)` per index k, each through the inverse of the per-entry
    transform, written under the entry's name.
    """

    over: str
    count: int
    axis: int = 0

    def __post_init__(self):
        shown = f"Stack(over={self.over!r}, count={self.count!r}, axis={self.axis!r})"
        if not isinstance(self.over, str) or not self.over.isidentifier():
            raise errors.InvalidArgumentError(
                f"{shown}: over must name the source placeholder that numbers the entries "
                "(a plain name). Fix: pass e.g. Stack('e', 8) for experts.{e}.")
        if type(self.count) is not int or self.count < 1:
            raise errors.InvalidArgumentError(
                f"{shown}: count must be an int >= 1 (how many entries are stacked). Fix: "
                "pass the number of experts, e.g. Stack('e', 8).")
        if type(self.axis) is not int:
            raise errors.InvalidArgumentError(
                f"{shown}: axis must be an int (negative counts from the end of the "
                "stacked shape). Fix: pass e.g. axis=0.")

    def _axis(self, rank: int) -> int:
        """The new axis as a non-negative int in a stacked value of `rank` + 1 axes."""
        if not -(rank + 1) <= self.axis <= rank:
            raise errors.InvalidArgumentError(
                f"{self!r} stacks along axis {self.axis}, but its parts have {rank} axes "
                f"(the stacked value {rank + 1}). Fix: pass an axis in "
                f"{-(rank + 1)}..{rank}.")
        return self.axis % (rank + 1)

    def __call__(self, values):
        """The parts (a sequence of `count` values, index order) stacked."""
        values = list(values)
        if len(values) != self.count:
            raise errors.InvalidArgumentError(
                f"{self!r} stacks {self.count} parts but received {len(values)}. Fix: give "
                "one value per index.")
        axis = self._axis(len(values[0].shape))
        if all(_is_numpy(v) for v in values):
            import numpy as np

            return np.stack(values, axis=axis)
        import tensorflow as tf

        return tf.stack(values, axis=axis)

    def output_shape(self, shape: tuple) -> tuple:
        """The stacked shape of parts of `shape`."""
        shape = tuple(shape)
        axis = self._axis(len(shape))
        return shape[:axis] + (self.count,) + shape[axis:]

    def part(self, index: int) -> Unstack:
        """The transform that takes part `index` out of a stacked value (export)."""
        return Unstack(self.axis, index)

    def inverse(self) -> Transform:
        raise errors.InvalidArgumentError(
            f"{self!r} makes one variable of {self.count} entries, so its inverse is "
            f"{self.count} transforms, not one. Fix: let objckpt.export write the entries "
            "(RuleSet.export_names gives each its name and its Unstack).")


@dataclasses.dataclass(frozen=True)
class Unstack(Transform):
    """Part `index` of a value along `axis`, that axis removed (`value[index]` for axis 0):
    the export side of a `Stack`."""

    axis: int
    index: int

    def __post_init__(self):
        if type(self.axis) is not int or type(self.index) is not int or self.index < 0:
            raise errors.InvalidArgumentError(
                f"Unstack needs an int axis and an int index >= 0. Received: "
                f"Unstack({self.axis!r}, {self.index!r}). Fix: pass e.g. Unstack(0, 3).")

    def _where(self, shape: tuple | None) -> int:
        if shape is None or not -len(shape) <= self.axis < len(shape) or (
                shape[self.axis] is not None and self.index >= shape[self.axis]):
            raise errors.InvalidArgumentError(
                f"{self!r} takes part {self.index} along axis {self.axis}, but received a "
                f"value of shape {shape}. Fix: attach it to the stacked variable it was "
                "made for.")
        return self.axis % len(shape)

    def __call__(self, value):
        axis = self._where(_static_shape(value))
        cut = tuple(self.index if a == axis else slice(None) for a in range(len(value.shape)))
        if _is_numpy(value):
            return value[cut].copy()  # C-contiguous, as TF's
        return value[cut]

    def output_shape(self, shape: tuple) -> tuple:
        shape = tuple(shape)
        axis = self._where(shape)
        return shape[:axis] + shape[axis + 1:]

    def inverse(self) -> Transform:
        raise errors.InvalidArgumentError(
            f"{self!r} keeps one part of a stacked value, so it has no inverse on its own. "
            "Fix: restore with the rule's Stack, which stacks every part.")


@dataclasses.dataclass(frozen=True)
class Concat(_Cut):
    """Part `index` of a variable made of `parts` equal parts (or parts of the given `sizes`)
    along `axis`: the other way round from `Split`. Several rules with different source
    patterns and one target, each with a Concat (last in its transform) of the same cut and
    its own index, make one variable of their entries (a Keras fused gate/up kernel of two
    torch weights; after a `Stack`, per expert: Qwen MoE's `gate_up` bank). Every part's
    shape is checked from metadata; a part no entry gives is an error naming its rule.
    Its inverse is the Split of the same cut and index (export writes each part)."""

    def split(self) -> Split:
        return Split(self.axis, self.parts, self.sizes, self.index)

    def export_part(self) -> Split:
        """What export puts the variable's value through for this part: its Split."""
        return self.split()

    def output_shape(self, shape: tuple) -> tuple:
        """The whole variable's shape, from part `index`'s `shape`."""
        shape = tuple(shape)
        if not -len(shape) <= self.axis < len(shape):
            raise errors.InvalidArgumentError(
                f"{self!r} joins along axis {self.axis}, but its part has shape {shape}. "
                f"Fix: pass an axis in {-len(shape)}..{len(shape) - 1}.")
        axis = self.axis % len(shape)
        if self.sizes is not None and shape[axis] != self.sizes[self.index]:
            raise errors.InvalidArgumentError(
                f"{self!r}: part {self.index} has {shape[axis]} along axis {self.axis}, not "
                f"{self.sizes[self.index]}. Fix: correct sizes, or attach the rule to the "
                "entries it was written for.")
        whole = shape[axis] * self.parts if self.parts is not None else sum(self.sizes)
        return shape[:axis] + (whole,) + shape[axis + 1:]

    def region(self, shape: tuple) -> tuple:
        """The index (slices) of part `index` in the whole variable of `shape`."""
        axis, start, stop = self.split()._bounds(tuple(shape))
        return (slice(None),) * axis + (slice(start, stop),)

    def __call__(self, value):
        raise errors.InvalidArgumentError(
            f"{self!r} places one part of a variable, made whole by restore from every "
            "rule of its cut; it does not run on one value. Fix: restore with the rules of "
            "all its parts.")

    def inverse(self) -> Split:
        return self.split()


def _crop_arguments(kind: str, axis, before, after) -> None:
    if type(axis) is not int or type(before) is not int or type(after) is not int or \
            before < 0 or after < 0:
        raise errors.InvalidArgumentError(
            f"{kind} needs an int axis and ints before >= 0, after >= 0. Received: "
            f"{kind}(axis={axis!r}, before={before!r}, after={after!r}). Fix: pass e.g. "
            f"{kind}(axis=0, before=2).")


def _crop_axis(what, shape: tuple | None) -> int:
    if shape is None or not -len(shape) <= what.axis < len(shape):
        raise errors.InvalidArgumentError(
            f"{what!r} works along axis {what.axis}, but received a value of shape {shape}. "
            "Fix: attach it to a rule whose entries have that axis.")
    return what.axis % len(shape)


@dataclasses.dataclass(frozen=True)
class Crop(Transform):
    """Drops the first `before` and the last `after` slices along `axis`, e.g.
    `Crop(axis=0, before=2)`: RoBERTa's position rows without its two reserved ones. Its
    inverse is the `Pad` that puts zeros back in their place (export)."""

    axis: int
    before: int = 0
    after: int = 0

    def __post_init__(self):
        _crop_arguments("Crop", self.axis, self.before, self.after)

    def _bounds(self, shape: tuple | None) -> tuple:
        axis = _crop_axis(self, shape)
        dim = shape[axis]
        if dim is not None and dim < self.before + self.after:
            raise errors.InvalidArgumentError(
                f"{self!r} drops {self.before + self.after} slices along axis {self.axis}, "
                f"but the value of shape {tuple(shape)} has {dim}. Fix: attach it to the "
                "entries it was written for, or correct before/after.")
        return axis, dim

    def __call__(self, value):
        shape = _static_shape(value)
        axis, dim = self._bounds(shape)
        stop = None if self.after == 0 else -self.after
        cut = tuple(slice(self.before, stop) if a == axis else slice(None)
                    for a in range(len(shape)))
        if _is_numpy(value):
            return value[cut].copy()  # C-contiguous, as TF's
        return value[cut]

    def output_shape(self, shape: tuple) -> tuple:
        shape = tuple(shape)
        axis, dim = self._bounds(shape)
        return tuple(dim - self.before - self.after if a == axis else d
                     for a, d in enumerate(shape))

    def inverse(self) -> Pad:
        return Pad(self.axis, self.before, self.after)


@dataclasses.dataclass(frozen=True)
class Pad(Transform):
    """Adds `before` leading and `after` trailing slices of zeros along `axis`. Its inverse
    is the `Crop` that drops them."""

    axis: int
    before: int = 0
    after: int = 0

    def __post_init__(self):
        _crop_arguments("Pad", self.axis, self.before, self.after)

    def __call__(self, value):
        axis = _crop_axis(self, _static_shape(value))
        widths = [(self.before, self.after) if a == axis else (0, 0)
                  for a in range(len(value.shape))]
        if _is_numpy(value):
            import numpy as np

            return np.pad(value, widths)
        import tensorflow as tf

        return tf.pad(value, widths)

    def output_shape(self, shape: tuple) -> tuple:
        shape = tuple(shape)
        axis = _crop_axis(self, shape)
        return tuple(d + self.before + self.after if a == axis else d
                     for a, d in enumerate(shape))

    def inverse(self) -> Crop:
        return Crop(self.axis, self.before, self.after)


@dataclasses.dataclass(frozen=True)
class Sum(Transform):
    """Term `index` of a variable that is the sum of `parts` terms: several rules with
    different source patterns and one target, each ending with a Sum of the same `parts`
    and its own index, make one variable of their entries added (RoBERTa's position rows
    plus its one token-type row, which keras-hub's backbone has no layer for: one folded
    embedding).

    Term 0 has the variable's shape; any other has it too, save size 1 on its
    `broadcast` axes, along which it is added to every slice (`Sum(2, 1, broadcast=(0,))`:
    one row added to every row). Every term's shape and dtype is checked from metadata
    before a byte is read; a term no entry gives is an error naming its rule. The terms are
    added in index order, in the entries' dtype.

    A sum has no unique inverse; export writes the variable's value as term 0 (through the
    inverse of what comes before its Sum) and every other term as zeros (the variable's
    shape with 1 on its broadcast axes), so a restore of the export gives the variable
    back bit for bit (x + 0 == x) and a reader that adds the terms, as transformers does,
    computes what the model computes.
    """

    parts: int
    index: int = 0
    broadcast: tuple = ()

    def __post_init__(self):
        shown = f"Sum(parts={self.parts!r}, index={self.index!r}, broadcast={self.broadcast!r})"
        if type(self.parts) is not int or self.parts < 2:
            raise errors.InvalidArgumentError(
                f"{shown}: parts must be an int >= 2 (how many terms are added). Fix: pass "
                "e.g. Sum(2, 0) and Sum(2, 1) on the rules of the two entries.")
        if type(self.index) is not int or not 0 <= self.index < self.parts:
            raise errors.InvalidArgumentError(
                f"{shown}: index must be an int in 0..{self.parts - 1} (the term this rule "
                f"gives). Fix: pass index=0 .. index={self.parts - 1}.")
        axes = tuple(self.broadcast) if isinstance(self.broadcast, (list, tuple)) else None
        if axes is None or not all(type(a) is int for a in axes) or len(set(axes)) != len(
                axes):
            raise errors.InvalidArgumentError(
                f"{shown}: broadcast must be a tuple of distinct int axes. Fix: pass e.g. "
                "broadcast=(0,) for one row added to every row.")
        if axes and self.index == 0:
            raise errors.InvalidArgumentError(
                f"{shown}: term 0 has the variable's shape (export writes the value there), "
                "so it broadcasts along no axis. Fix: give the broadcast term another index.")
        object.__setattr__(self, "broadcast", axes)

    @property
    def count(self) -> int:
        """How many terms make the variable."""
        return self.parts

    def same_cut(self, other) -> bool:
        """Whether `other` is a term of a sum of as many terms (its index aside)."""
        return isinstance(other, Sum) and other.parts == self.parts

    def term_shape(self, shape: tuple) -> tuple:
        """This term's shape in a variable of `shape`: it, with 1 on the broadcast axes."""
        shape = tuple(shape)
        for axis in self.broadcast:
            if not -len(shape) <= axis < len(shape):
                raise errors.InvalidArgumentError(
                    f"{self!r} broadcasts along axis {axis}, but the variable has shape "
                    f"{shape}. Fix: pass axes in {-len(shape)}..{len(shape) - 1}.")
        axes = {axis % len(shape) for axis in self.broadcast}
        return tuple(1 if a in axes else d for a, d in enumerate(shape))

    def output_shape(self, shape: tuple) -> tuple:
        """The variable's shape, from term 0's (another term's does not give it)."""
        if self.index:
            raise errors.InvalidArgumentError(
                f"{self!r} is a term that may broadcast; the variable's shape is term 0's. "
                "Fix: read the shape from the rule with index 0.")
        return tuple(shape)

    def export_part(self):
        """What export puts the variable's value through for this term: nothing for term
        0, `Zeros` of the term's shape for the others."""
        return None if self.index == 0 else Zeros(self.broadcast)

    def __call__(self, value):
        raise errors.InvalidArgumentError(
            f"{self!r} is one term of a variable, made whole by restore from every rule of "
            "its sum; it does not run on one value. Fix: restore with the rules of all its "
            "terms.")

    def inverse(self) -> Transform:
        raise errors.InvalidArgumentError(
            f"{self!r} is one term of a sum, which has no unique inverse. Fix: let "
            "objckpt.export write the terms (RuleSet.export_names gives each its name and "
            "transform: the value as term 0, zeros as the others).")


@dataclasses.dataclass(frozen=True)
class Zeros(Transform):
    """Zeros of the value's dtype and shape, save size 1 on `axes`: what export writes for
    a `Sum`'s terms other than term 0."""

    axes: tuple = ()

    def output_shape(self, shape: tuple) -> tuple:
        return Sum(2, 1, self.axes).term_shape(shape) if self.axes else tuple(shape)

    def __call__(self, value):
        shape = self.output_shape(tuple(int(d) for d in value.shape))
        if _is_numpy(value):
            import numpy as np

            return np.zeros(shape, value.dtype)
        import tensorflow as tf

        return tf.zeros(shape, value.dtype)

    def inverse(self) -> Transform:
        raise errors.InvalidArgumentError(
            f"{self!r} writes zeros for a term of a Sum; it has no inverse. Fix: restore "
            "with the Sum's rules, which add the terms.")


def placement_of(transform) -> tuple:
    """(Concat or Sum or None, Stack or None, what each entry goes through first or None) of
    a transform: a Concat (or Sum) last, a Stack last (or before it), the rest first."""
    concat = None
    if isinstance(transform, (Concat, Sum)):
        return transform, None, None
    if isinstance(transform, Chain) and isinstance(transform.transforms[-1], (Concat, Sum)):
        concat, rest = transform.transforms[-1], transform.transforms[:-1]
        transform = Chain(*rest) if len(rest) > 1 else rest[0]
    stack, part = stack_of(transform)
    return concat, stack, part


def stack_of(transform) -> tuple:
    """(the Stack a transform ends with, what each part goes through before it or None),
    or (None, transform) when it ends with none: a `Stack`, or a `Chain` whose last
    transform is one."""
    if isinstance(transform, Stack):
        return transform, None
    if isinstance(transform, Chain) and isinstance(transform.transforms[-1], Stack):
        rest = transform.transforms[:-1]
        return transform.transforms[-1], (Chain(*rest) if len(rest) > 1 else
                                          rest[0] if rest else None)
    return None, transform


class Chain(Transform):
    """Applies transforms in order (`Chain(a, b)(x) == b(a(x))`); its inverse applies their
    inverses in the reverse order."""

    def __init__(self, *transforms):
        if not transforms or not all(callable(t) for t in transforms):
            raise errors.InvalidArgumentError(
                f"Chain needs one or more transforms (callables tensor -> tensor). Received: "
                f"{transforms!r}. Fix: pass e.g. Chain(Transpose(), Reshape((4, 6), (4, 2, 3))).")
        self.transforms = tuple(transforms)

    def __call__(self, value):
        for transform in self.transforms:
            value = transform(value)
        return value

    def inverse(self) -> Chain:
        return Chain(*(inverse_of(t, "Chain") for t in reversed(self.transforms)))

    def output_shape(self, shape: tuple) -> tuple:
        for transform in self.transforms:
            shape = transform.output_shape(shape)  # AttributeError: not one of ours
        return tuple(shape)

    def __eq__(self, other):
        return isinstance(other, Chain) and other.transforms == self.transforms

    def __hash__(self):
        return hash(self.transforms)

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.transforms))})"


def inverse_of(transform, where: str):
    """The inverse of a transform (None for None); InvalidArgumentError when it has none."""
    if transform is None:
        return None
    inverse = getattr(transform, "inverse", None)
    if not callable(inverse):
        raise errors.InvalidArgumentError(
            f"{where}: the transform {transform!r} has no inverse(), so it converts one way "
            "only (restore), not back (export). Fix: use objckpt.rules' Transpose, "
            "ConvKernel, Reshape or Chain, or give an object with __call__ and inverse().")
    return inverse()


# --- rules ------------------------------------------------------------------------------------

def _fields(pattern, side: str, rule: str) -> list:
    """[(literal, placeholder or None)] of a pattern with `{name}` placeholders."""
    if not isinstance(pattern, str) or not pattern:
        raise errors.InvalidArgumentError(
            f"{rule}: the {side} must be a non-empty string. Received: {pattern!r}. Fix: pass "
            "a name with {placeholders}, e.g. 'model.layers.{i}.mlp.up_proj.weight'.")
    try:
        parsed = list(string.Formatter().parse(pattern))
    except ValueError as err:
        raise errors.InvalidArgumentError(
            f"{rule}: the {side} {pattern!r} is not a valid pattern ({err}). Fix: write "
            "placeholders as {name} and literal braces as {{ and }}.") from err
    out = []
    for literal, field, spec, conversion in parsed:
        if field is not None and (not field.isidentifier() or spec or conversion):
            raise errors.InvalidArgumentError(
                f"{rule}: the {side} {pattern!r} has the placeholder {{{field}"
                f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}; "
                "placeholders are plain names. Fix: write e.g. {i} or {layer}.")
        out.append((literal, field))
    return out


def _regex(fields: list) -> re.Pattern:
    parts, seen = ["^"], set()
    for literal, field in fields:
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(f"(?P={field})" if field in seen else f"(?P<{field}>{SEGMENT})")
            seen.add(field)
    return re.compile("".join(parts) + "$")


def _replacement(fields: list) -> str:
    """A `re.sub` replacement: literal text (backslashes escaped) and `\\g<name>` groups."""
    return "".join(literal.replace("\\", "\\\\") + (f"\\g<{field}>" if field else "")
                   for literal, field in fields)


def _names(fields: list) -> set:
    return {field for _, field in fields if field is not None}


class Rule:
    """One entry of a `RuleSet`: `source` (the name in the file) <-> `target` (the object
    path), with `{name}` placeholders (one name segment each, the same names on both sides)
    and an optional value transform applied at restore (its `inverse()` at export).

    head: the entry is a task head (`"BertForMaskedLM"`, the classes whose files hold it): a
    restore into an obj without the target sets the entry aside, listed in the report's
    `skipped` as that head, instead of reporting it as unexpected; an obj that has the
    target (the keras-hub task model) restores it. absent: why a folder may lack the entry
    (`"BertForMaskedLM has no pooler"`): a variable it feeds that gets no value is named
    with this reason in the plan's notes and in a strict restore's error; unused_by: the
    model classes (by name) whose outputs do not use that variable: there it is listed
    under `skipped` with the reason and left as is, and strict=True holds.
    """

    def __init__(self, source: str, target: str, transform: Callable | None = None, *,
                 head: str = "", absent: str = "", unused_by: tuple = ()):
        shown = f"Rule({source!r}, {target!r})"
        self.source, self.target, self.transform = source, target, transform
        self.head, self.absent = str(head or ""), str(absent or "")
        self.unused_by = tuple(unused_by)
        self._source_fields = _fields(source, "source", shown)
        self._target_fields = _fields(target, "target", shown)
        only_source = _names(self._source_fields) - _names(self._target_fields)
        only_target = _names(self._target_fields) - _names(self._source_fields)
        # many entries -> one variable: a Concat of parts, a Sum of terms, a Stack of
        # entries, or a Stack's made a part
        self.concat, self.stack, self.part = placement_of(transform)
        if self.stack is not None and isinstance(self.concat, Sum):
            raise errors.InvalidArgumentError(
                f"{shown}: a Sum's term is one entry, not a Stack of entries. Fix: give each "
                "term its own rule (a Stack may be a Concat's part, not a Sum's term).")
        if self.stack is not None:
            over = self.stack.over
            if over not in _names(self._source_fields) or over in _names(
                    self._target_fields):
                raise errors.InvalidArgumentError(
                    f"{shown}: its {self.stack!r} stacks the entries that differ in "
                    f"{{{over}}}, so {{{over}}} must appear in the source and not in the "
                    f"target. Fix: write the source as e.g. 'experts.{{{over}}}.w1.weight' "
                    f"and leave {{{over}}} out of the target.")
            only_source -= {over}
        if only_source or only_target:
            side, names = ("source", only_source) if only_source else ("target", only_target)
            listed = ", ".join("{" + n + "}" for n in sorted(names))
            raise errors.InvalidArgumentError(
                f"{shown}: the placeholder(s) {listed} appear in the {side} only, so the "
                "other side could not be filled in. Fix: use the same placeholders on both "
                "sides.")
        if transform is not None and not callable(transform):
            raise errors.InvalidArgumentError(
                f"{shown}: the transform must be a callable tensor -> tensor (e.g. "
                f"objckpt.rules.Transpose()). Received: {transform!r}. Fix: pass a transform "
                "or None.")
        self.source_regex = _regex(self._source_fields)
        self.target_regex = _regex(self._target_fields)

    def regex_rule(self) -> tuple:
        """The restore direction as today's `(regex, replacement, transform)` rule."""
        return (self.source_regex.pattern, _replacement(self._target_fields), self.transform)

    def __iter__(self):
        """Unpacks as `regex_rule()`: code that takes `(regex, replacement, transform)` rules
        takes a Rule as the rule of its restore direction."""
        return iter(self.regex_rule())

    def source_name(self, path: str, **more) -> str | None:
        """The source name of an object path the target matches, else None; `more` fills
        the placeholders the target lacks (a Stack's `over`: `source_name(p, e="3")`)."""
        found = self.target_regex.match(path)
        if found is None:
            return None
        groups = {**found.groupdict(), **more}  # a Stack's `over` not given: kept braced
        return "".join(literal + (groups.get(field, f"{{{field}}}") if field else "")
                       for literal, field in self._source_fields)

    def _placed(self, inverse):
        """An entry's export transform: its Concat's Split (a Sum's term: nothing for term
        0, zeros for the others) first, then `inverse`."""
        placed = None if self.concat is None else self.concat.export_part()
        if placed is None:
            return inverse
        return placed if inverse is None else Chain(placed, inverse)

    def source_names(self, path: str, where: str = "") -> list | None:
        """[(source name, inverse transform)] an object path the target matches is written
        as (None: no match): one, or a Stack's `count` entries, each with its `Unstack`
        and the inverse of the per-entry transform."""
        if self.stack is None:
            name = self.source_name(path)
            if name is None:
                return None
            if self.concat is not None:  # its part of the variable, split off
                return [(name, self._placed(inverse_of(self.part, where or repr(self))))]
            _, rest = split_of(self.transform)  # a Split's part: export concatenates
            return [(name, inverse_of(rest, where or repr(self)))]
        if self.target_regex.match(path) is None:
            return None
        back = inverse_of(self.part, where or repr(self))
        return [(self.source_name(path, **{self.stack.over: str(k)}),
                 self._placed(Chain(self.stack.part(k), back) if back is not None
                              else self.stack.part(k)))
                for k in range(self.stack.count)]

    def __repr__(self) -> str:
        extra = f", {self.transform!r}" if self.transform is not None else ""
        extra += f", head={self.head!r}" if self.head else ""
        return f"Rule({self.source!r}, {self.target!r}{extra})"

    def with_source(self, source: str) -> Rule:
        """The same rule for another source name (a model prefix added)."""
        return Rule(source, self.target, self.transform, head=self.head, absent=self.absent,
                    unused_by=self.unused_by)

    def __eq__(self, other):
        return isinstance(other, Rule) and (other.source, other.target, other.transform) == (
            self.source, self.target, self.transform)

    def __hash__(self):
        return hash((self.source, self.target))


class RuleSet(Sequence):
    """An ordered sequence of `Rule`s that converts both ways.

    Restore direction (`rules=` of restore, plan, migrate, restore_on_create,
    load_ensemble): a source key is rewritten by the first rule whose source pattern matches
    it, its value transformed. Export direction (`objckpt.export`): an object path is named
    by the first rule whose target pattern matches it as restore would match it (the path, the
    path with leading underscores stripped from each edge: `dense/_kernel` ~ `dense/kernel`,
    or the variable's name: `conv/kernel` in Keras 3), its value put through the transform's
    inverse.

    Several rules with the same source pattern feed one source tensor to several
    variables. With a `Split` first in each transform, each takes its part at restore and
    export concatenates the parts back in index order. Without one the weights are tied:
    the tensor feeds every target (each through its own transform) at restore, and export
    writes it once, after checking that every variable gives the same bytes.
    """

    def __init__(self, rules=(), *, alternatives: bool = False, name: str = "",
                 classes=None, config=None):
        """alternatives: the rules list several spellings of what one file may hold (the
        shipped Hugging Face sets: names with or without a model prefix, `weight` or
        `gamma`); a rule that matches no key is then expected, not reported.
        name: what the set is, as plans and reports name it (`huggingface('bert')`).
        classes: {keras-hub class name: Hugging Face class name} (`BertMaskedLM`:
        `BertForMaskedLM`): the `architectures` export writes for a model of that class.
        config: the Hugging Face config the set was made from (export writes it, with
        `architectures`, into a folder that has no config.json)."""
        self.alternatives = bool(alternatives)
        self.name = str(name or "")
        self.classes = dict(classes or {})
        self.config = dict(config or {})
        self.remake = None  # model -> the same set made for that model (a shipped set)
        # its targets name layers as the model does (a counter in keras-hub's auto names):
        # made again for every model it is used with
        self.per_model = False
        if isinstance(rules, Rule):
            rules = [rules]
        items = list(rules)
        for index, rule in enumerate(items):
            if not isinstance(rule, Rule):
                raise errors.InvalidArgumentError(
                    f"RuleSet item {index} must be an objckpt.rules.Rule. Received: {rule!r}. "
                    "Regex rules convert one way only. Fix: write it as "
                    "Rule('source.{name}.weight', 'target/{name}/kernel'), or pass regex "
                    "rules to restore as a plain list.")
        self._rules = tuple(items)

    def for_model(self, model) -> RuleSet:
        """The set for `model`: a shipped set made again for a task model of a class it
        knows (`classes`: its heads' names, export's `architectures`) or, `per_model`, for
        any model (its targets read from the model's layer names), else itself."""
        if self.remake is None or not self.per_model and not any(
                kind.__name__ in self.classes for kind in type(model).__mro__):
            return self
        return self.remake(model)

    def __getitem__(self, index):
        return self._rules[index]

    def __len__(self) -> int:
        return len(self._rules)

    def regex_rules(self) -> list:
        """The restore direction: `(regex, replacement, transform)` per rule, in order."""
        return [rule.regex_rule() for rule in self._rules]

    def export_name(self, path: str, *aliases: str):
        """(source name, inverse transform, rule) for an object path; None when no rule's
        target matches it. A target matches what restore would match: the object path (or
        an alias: the path through the layers, the variable's name), with leading
        underscores stripped from each edge (tried first) or as it is."""
        found = self.export_names(path, *aliases)
        if found is None:
            return None
        names, rule = found
        if rule.stack is not None:
            raise errors.InvalidArgumentError(
                f"{rule!r} writes `{path}` as {len(names)} entries (its {rule.stack!r}), not "
                "one. Fix: call RuleSet.export_names for the names and transforms of all.")
        return names[0][0], names[0][1], rule

    def export_names(self, path: str, *aliases: str):
        """([(source name, inverse transform)], rule) for an object path, matched as
        `export_name` matches it; a Stack rule's path gives its `count` entries (index
        order), a Concat's every part's (from the rules of its cut), any other one. None
        when no rule's target matches it."""
        forms = []
        for form in (path, *aliases):  # stripped first: a placeholder takes `kernel`, not
            forms += ["/".join(e.lstrip("_") or e for e in form.split("/")), form]  # `_kernel`
        forms = list(dict.fromkeys(f for f in forms if f))
        for index, rule in enumerate(self._rules):
            for form in forms:
                names = rule.source_names(form, f"rule {index} {rule!r}")
                if names is not None:
                    if rule.concat is not None:  # every part, from its rule of the cut
                        names = self._parts(index, rule, form, names)
                    return names, rule
        return None

    def _parts(self, first: int, rule: Rule, form: str, names: list) -> list:
        """The names and transforms of every part of a Concat's variable, in index order:
        the first rule's, then one per later rule of the same cut that matches `form`."""
        parts = {rule.concat.index: names}
        for index, other in enumerate(self._rules[first + 1:], first + 1):
            if other.concat is not None and other.concat.same_cut(rule.concat) and \
                    other.concat.index not in parts:
                found = other.source_names(form, f"rule {index} {other!r}")
                if found is not None:
                    parts[other.concat.index] = found
        missing = [k for k in range(rule.concat.count) if k not in parts]
        if missing:
            raise errors.InvalidArgumentError(
                f"{rule!r} writes `{form}` as part {rule.concat.index} of "
                f"{rule.concat.count}, but no rule of the same cut gives part(s) {missing}. "
                "Fix: give each part 0.."
                f"{rule.concat.count - 1} a rule with the same target and Concat cut.")
        return [name for k in sorted(parts) for name in parts[k]]

    def __repr__(self) -> str:
        return "RuleSet([" + ", ".join(map(repr, self._rules)) + "])"
