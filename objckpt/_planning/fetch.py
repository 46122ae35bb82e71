"""The fetch stage of the one restore pipeline: a plan's values read and checked.

Every value is read (a rule's transform applied) and checked against the variable it will
be assigned to (`_compat.misfit`, the one rule) before anything is assigned or written. A
large local TF checkpoint is not read into memory at all: `streamed` gives a loader that
checks every checksum now and reads each tensor into its variable at the assign stage.
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._planning import match as _match

__all__ = ["converted", "fetch_entries", "fetch_values", "streamed", "streamed_pairs"]


def fetch_values(the_plan: _match.Plan, variables, matches=None,
                 cast: str = "lossless") -> list:
    """Reads the source values of a plan's matches, transforms applied, checks them and
    casts each to its variable's dtype where the casting policy (`cast`) lets it.

    A transform's output shape is known from tracing only as far as the
    transform lets TF infer it; every value is checked against its variable
    again here, before anything is assigned or written.
    """
    matches = the_plan.matches if matches is None else matches
    values = the_plan.fetch([m.source for m in matches])
    out, problems, corrupt = [], [], []
    for match, value in zip(matches, values):
        if match.transform is not None:
            value = match.transform(value)
        variable = variables[match.target]
        if (not value.shape.is_fully_defined() and variable.shape.is_fully_defined()
                and value.shape.is_compatible_with(variable.shape)):
            # read in a tf.function being traced: the shape is checked when it runs
            value = tf.ensure_shape(value, variable.shape)
        if _compat.misfit(value, variable, cast):
            got = (f"{value.dtype.name}{tuple(value.shape)} but the obj has "
                   f"{variable.dtype.base_dtype.name}{tuple(variable.shape)}")
            if match.transform is not None:
                problems.append(f"{the_plan.label(match.target)}: the transform of "
                                f"`{_render.safe(match.source)}` gave {got}")
            else:  # the plan checked the metadata: the data disagrees with it
                corrupt.append(f"{the_plan.label(match.target)}: `{_render.safe(match.source)}`"
                               f" read as {got}")
        else:
            value = _compat.cast_value(value, variable)
        out.append(value)
    if corrupt:
        raise errors.CheckpointCorruptError(
            f"{the_plan.source}: {len(corrupt)} value(s) read do not have the shape or dtype "
            "its metadata promised (an inconsistent or crafted checkpoint); nothing was "
            "changed or written:\n" + "\n".join(_render.listed(corrupt))
            + "\nFix: restore from another checkpoint, or write this one again.")
    if problems:
        raise errors.StructureMismatchError(
            f"{len(problems)} transformed value(s) from {the_plan.source} do not fit; nothing "
            "was changed or written:\n" + "\n".join(_render.listed(problems))
            + "\nFix: make the rule's transform return the variable's shape and dtype.",
            tuple(problems))
    return out


def fetch_entries(src, entries) -> list:
    """The values of `(source key, transform or None)` pairs, read (and transformed)
    eagerly, outside any tf.function being traced (a variable created while one is)."""
    with tf.init_scope():
        values = src.fetch([key for key, _ in entries]) if entries else []
        return [value if transform is None else transform(value)
                for (_, transform), value in zip(entries, values)]


def converted(value, variable):
    """A value just before it is assigned to `variable` on a streamed route: the one place
    a value is converted to its variable, by the casting policy (`_compat.cast_value`: the
    plan admitted only lossless widening here; lossy casts take the fetched route)."""
    return _compat.cast_value(value, variable)


def streamed(src, the_plan: _match.Plan, variables):
    """A `_fastio.Loader` restoring the plan from a local TF checkpoint one tensor at a
    time after checking every checksum, or None (then values are fetched as a whole):
    inside a `tf.function`, with a rule's transform or a dtype cast, for distributed
    variables, and below
    `_fastio.STREAM_BYTES` (where reading everything at once and one fused assign is faster
    and holding a second copy costs little)."""
    def assign_to(variable, value):
        variable.assign(value, read_value=False)

    opened = getattr(the_plan, "opened", None)  # a Plan: entries a Stack makes one, as one
    if src is not None and opened is not None:
        src = opened(src)
    if src is not None and src.stream is not None:
        return _streamed_by_tensor(src, the_plan, variables, assign_to)
    if (src is None or src.bundle_keys is None or not src.prefix or "://" in src.prefix
            or not tf.executing_eagerly() or not the_plan.matches):
        return None
    targets = [variables[m.target] for m in the_plan.matches]
    if any(m.transform is not None or m.cast for m in the_plan.matches) or any(
            _compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
            or _compat.is_distributed_variable(type(v)) for v in targets):
        return None
    from objckpt._bundle import fastio as _fastio

    total = sum(v.shape.num_elements() * v.dtype.size for v in targets)
    if total < _fastio.STREAM_BYTES:
        return None
    keys = src.bundle_keys([m.source for m in the_plan.matches])
    label_of = {key: the_plan.label(m.target) for key, m in zip(keys, the_plan.matches)}
    return _fastio.Loader(
        src.prefix, [(key, v, label_of[key]) for key, v in zip(keys, targets)], assign_to,
        lambda key: f"for {label_of.get(key, key)}")


def _streamed_by_tensor(src, the_plan: _match.Plan, variables, assign_to):
    """The loader of a format that reads one tensor at a time (safetensors: metadata
    checked now, each tensor read, transformed, converted and assigned at the assign stage,
    so no more than the largest tensor and a bounded slack is held beyond the model), or
    None: inside a `tf.function`, for distributed variables or ones of unknown shape, below
    `_fastio.STREAM_BYTES`, or when a rule's transform cannot be traced on its input's
    spec (a transform that needs values: they are fetched whole then)."""
    if not tf.executing_eagerly() or not the_plan.matches:
        return None
    targets = [variables[m.target] for m in the_plan.matches]
    if any(m.cast and not _compat.lossless(src.specs[m.source][1], v.dtype.base_dtype)
           for m, v in zip(the_plan.matches, targets)):  # lossy: fetched whole
        return None
    if any(_compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
           or _compat.is_distributed_variable(type(v)) for v in targets):
        return None
    from objckpt._bundle import fastio as _fastio

    if sum(v.shape.num_elements() * v.dtype.size for v in targets) < _fastio.STREAM_BYTES:
        return None
    loader = src.stream(
        [(m.source, v, the_plan.label(m.target), m.transform)
         for m, v in zip(the_plan.matches, targets)], assign_to, converted)
    if loader.specs is None:
        loader.close()
        return None
    return loader


def streamed_pairs(src, pairs):
    """A loader (not yet checked) restoring `(source key, variable, label)` pairs one tensor
    at a time (`restore_on_create`'s variables, existing or just created) from a format that
    reads so, or from a local TF checkpoint (checksums checked first, as `streamed` reads
    it), or None (then values are fetched whole): inside a `tf.function`, for distributed
    variables or ones of unknown shape, below `_fastio.STREAM_BYTES`, or when any entry's
    shape differs from its variable's or its dtype widens into it only by a lossy cast (a
    TF checkpoint's: by any cast; the fetched route reports those as it always has)."""
    if src is None or not pairs or not tf.executing_eagerly():
        return None
    bundle = (src.stream is None and src.bundle_keys is not None and bool(src.prefix)
              and "://" not in src.prefix)
    if src.stream is None and not bundle:
        return None
    for key, v, _ in pairs:
        shape, dtype = src.specs[key][:2]
        if (_compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
                or _compat.is_distributed_variable(type(v))
                or tuple(shape) != tuple(v.shape)
                or not _compat.lossless(dtype, v.dtype.base_dtype)
                or (bundle and dtype != v.dtype.base_dtype)):
            return None
    from objckpt._bundle import fastio as _fastio

    if sum(v.shape.num_elements() * v.dtype.size for _, v, _ in pairs) < _fastio.STREAM_BYTES:
        return None

    def assign_to(variable, value):
        variable.assign(value, read_value=False)

    if bundle:
        keys = src.bundle_keys([key for key, _, _ in pairs])
        label_of = dict(zip(keys, (label for _, _, label in pairs)))
        return _fastio.Loader(src.prefix, [(key, v, label) for key, (_, v, label)
                                           in zip(keys, pairs)], assign_to,
                              lambda key: f"for {label_of.get(key, key)}")
    loader = src.stream([(key, v, label, None) for key, v, label in pairs], assign_to,
                        converted)
    if loader.specs is None:
        loader.close()
        return None
    return loader
