"""In-memory snapshots, saving, and all-or-nothing restore by object path."""

from __future__ import annotations

import dataclasses
import os
import uuid
import weakref
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from objckpt import _compat, _tree, errors

__all__ = ["RestoreReport", "Snapshot", "restore", "save", "snapshot"]

_MAX_LISTED = 20
# Entries that tf.train.Checkpoint adds for itself; never "unexpected".
_BOOKKEEPING = frozenset({"save_counter"})


class Snapshot(_tree._FrozenMapping):
    """An immutable mapping object path -> tensor: the values of an obj at one time.

    Tensors stay on the variables' devices and share memory with the values
    they were read from; TF copies on the next write to a variable, so later
    training never changes a Snapshot. `numpy()` gives host copies.

    A Snapshot can also be built from any mapping of object path -> array:
    `Snapshot({"hidden/_kernel": np.ones((3, 4))})`.
    """

    __slots__ = ("_origin",)

    def __init__(self, values: Mapping):
        super().__init__({str(path): tf.convert_to_tensor(value) for path, value in values.items()})
        self._origin = None

    @classmethod
    def _of_tree(cls, variables: _tree.VariableTree, values: list) -> Snapshot:
        result = cls.__new__(cls)
        _tree._FrozenMapping.__init__(result, dict(zip(variables, values)))
        result._origin = weakref.ref(variables)
        return result

    def origin(self) -> _tree.VariableTree | None:
        """The live tree this snapshot was taken from, while it exists unchanged."""
        return self._origin() if self._origin is not None else None

    def numpy(self) -> dict[str, np.ndarray]:
        """Returns host (NumPy) copies of every value, keyed by object path."""
        return {path: np.array(value) for path, value in self._items.items()}

    @property
    def nbytes(self) -> int:
        return sum(value.shape.num_elements() * value.dtype.size for value in self._items.values())

    def __repr__(self) -> str:
        return f"Snapshot({len(self)} variables, {self.nbytes / 1e6:.1f} MB)"


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What a restore did.

    Attributes:
      restored: object paths (of the obj) that received a value.
      missing: object paths of the obj that the source has no value for.
      unexpected: source paths (after `at`) that match no variable of the obj.
      source: the source, described (prefix, or "Snapshot").
      at: the source subtree that was used, or None for its root.
      notes: anything worth knowing: an `at` picked automatically, an older
        checkpoint used because the newest is damaged.
    """

    restored: tuple[str, ...]
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    source: str = ""
    at: str | None = None
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"restored {len(self.restored)} variables from {self.source}"
                 + (f" (at={self.at!r})" if self.at else "")]
        if self.missing:
            lines.append(f"missing from the source ({len(self.missing)}): "
                         + ", ".join(self.missing))
        if self.unexpected:
            lines.append(f"not in the obj ({len(self.unexpected)}): " + ", ".join(self.unexpected))
        lines.extend(self.notes)
        return "\n".join(lines)


def snapshot(obj) -> Snapshot:
    """Takes an immutable in-memory Snapshot of every variable of obj.

    No bytes are copied and nothing goes through NumPy: each value shares the
    variable's current buffer until the variable is next written.

    Args:
      obj: any trackable (Keras model or layer of any flavour, `tf.Module`,
        `tf.train.Checkpoint`, optimizer).

    Returns:
      A `Snapshot` with the keys of `objckpt.tree(obj)`.

    Example:
      >>> best = objckpt.snapshot(model)
      >>> ...  # train on
      >>> objckpt.restore(model, best)
    """
    variables = _tree.tree(obj)
    return Snapshot._of_tree(variables, variables.fused.read_all())


# --- sources -------------------------------------------------------------------


@dataclasses.dataclass
class _Source:
    description: str
    specs: dict  # full object path -> (shape tuple, tf.DType)
    fetch: object  # callable(list of full paths) -> list of tensors
    subtree: object  # callable(at) -> {path within at: full path}
    top_level_names: list
    notes: tuple[str, ...] = ()


def _snapshot_source(snap: Snapshot) -> _Source:
    specs = {path: (tuple(value.shape), value.dtype) for path, value in snap.items()}
    return _Source("Snapshot", specs, lambda paths: [snap[p] for p in paths],
                   lambda at: _subtree(specs, at), _top_level_names(specs))


def _prefix_source(source) -> _Source:
    prefix, notes = _tree.resolve_prefix(source)
    entries = _tree._read_tree_at(prefix)
    specs = {path: (entry.shape, entry.dtype) for path, entry in entries.items()}

    def fetch(paths):
        keys = [entries[p].key for p in paths]
        try:
            with tf.device("/cpu:0"):
                return tf.raw_ops.RestoreV2(
                    prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                    dtypes=[entries[p].dtype for p in paths])
        except tf.errors.OpError as err:
            raise errors.CheckpointCorruptError(
                f"Checkpoint `{prefix}` could not be read: its data is damaged, truncated or "
                f"missing. Received from TF: {_tree._first_line(err)}. Nothing was restored; "
                "restore from another checkpoint.") from err

    return _Source(f"checkpoint `{prefix}`", specs, fetch,
                   lambda at: _tree.subtree_paths(entries.object_graph, at),
                   _tree.top_level_names(entries.object_graph), notes)


def _open_source(source) -> _Source:
    if isinstance(source, Snapshot):
        return _snapshot_source(source)
    if isinstance(source, (str, os.PathLike)):
        return _prefix_source(source)
    raise errors.UnsupportedObjectError(
        "A source must be an objckpt.Snapshot, a checkpoint prefix or a directory of "
        f"checkpoints. Received: source of type {type(source).__name__}. Fix: pass "
        "objckpt.snapshot(obj) or a path.")


# --- matching ------------------------------------------------------------------


def _subtree(paths, at: str) -> dict:
    """Maps path-within-`at` -> source path for every source path under `at`.

    Used for Snapshots, which keep paths but not the object graph: a variable
    belongs to the subtree when its path starts with `at`. A slot variable
    belongs to it only when both the variable it slots for and its optimizer do.
    """
    head = at.strip("/") + "/"
    view = {}
    for path in paths:
        slot = _tree.split_slot(path)
        if slot is None:
            if path.startswith(head):
                view[path[len(head):]] = path
        else:
            variable, optimizer, name = slot
            if variable.startswith(head) and optimizer.startswith(head):
                inner = (f"{variable[len(head):]}/{_compat.OPTIMIZER_SLOT}/"
                         f"{optimizer[len(head):]}/{name}")
                view[inner] = path
    return view


def _problems(variables, specs, view):
    """Returns (matched, missing, unexpected, mismatched lines)."""
    matched, missing, mismatched = [], [], []
    for path, variable in variables.items():
        source_path = view.get(path)
        if source_path is None:
            missing.append(path)
            continue
        shape, dtype = specs[source_path]
        if not variable.shape.is_compatible_with(shape):
            mismatched.append(f"`{path}`: shape {tuple(shape)} in the source but "
                              f"{tuple(variable.shape)} in the obj")
        elif variable.dtype.base_dtype != dtype:
            mismatched.append(f"`{path}`: dtype {dtype.name} in the source but "
                              f"{variable.dtype.base_dtype.name} in the obj")
        else:
            matched.append(path)
    unexpected = [path for path in view if path not in variables and path not in _BOOKKEEPING]
    return matched, missing, unexpected, mismatched


def _top_level_names(paths) -> list[str]:
    return list(dict.fromkeys(p.split("/", 1)[0] for p in paths if "/" in p))


def _choose_view(variables, source: _Source, at):
    """Picks the source subtree to restore from. Returns (view, at, notes)."""
    if at is not None:
        view = source.subtree(at)
        if not view:
            names = ", ".join(f"`{n}`" for n in source.top_level_names) or "none"
            raise errors.StructureMismatchError(
                f"{source.description} has no entries under at={at!r}. Top-level names in the "
                f"source: {names}. Fix: pass one of them as at=..., or at=None for the root.")
        return view, at.strip("/"), ()
    root = {path: path for path in source.specs}
    _, missing, _, mismatched = _problems(variables, source.specs, root)
    if not missing and not mismatched:
        return root, None, ()
    fits = []
    for name in source.top_level_names:
        view = source.subtree(name)
        _, sub_missing, _, sub_mismatched = _problems(variables, source.specs, view)
        if not sub_missing and not sub_mismatched:
            fits.append((name, view))
    if len(fits) == 1:
        name, view = fits[0]
        return view, name, (f"the obj matched the source's `{name}` subtree, not its root; "
                            f"used at={name!r}",)
    if len(fits) > 1:
        names = ", ".join(repr(n) for n, _ in fits)
        return root, None, (f"several source subtrees match the obj ({names}); pass at=... "
                            "to pick one",)
    return root, None, ()


def _listed(kind: str, items: list[str]) -> list[str]:
    lines = [f"  - {item}{kind}" for item in items[:_MAX_LISTED]]
    if len(items) > _MAX_LISTED:
        lines.append(f"  - ... and {len(items) - _MAX_LISTED} more")
    return lines


def _describe(obj) -> str:
    name = getattr(obj, "name", None)
    return f"{type(obj).__name__}" + (f" `{name}`" if isinstance(name, str) and name else "")


def _raise_mismatch(obj, variables, source, missing, unexpected, mismatched, notes, strict):
    if not variables or (missing and _compat.is_unbuilt(obj)):
        raise errors.UnbuiltModelError(
            f"Cannot restore {source.description} into {_describe(obj)}: it is not built yet, "
            f"so it has {len(variables)} of the source's {len(source.specs)} variables. Nothing "
            "was restored. Fix: build it first (call it on a batch, or model.build(shape)), or "
            "use objckpt.restore_on_create(obj, source) to apply values as variables are created.")
    lines = _listed("", mismatched)
    if strict:
        lines += _listed(": in the obj but missing from the source", [f"`{p}`" for p in missing])
        lines += _listed(": in the source but not in the obj", [f"`{p}`" for p in unexpected])
    fixes = []
    if mismatched:
        fixes.append("rebuild the obj with the source's shapes and dtypes (strict=False never "
                     "skips a shape or dtype mismatch)")
    if strict and (missing or unexpected):
        names = ", ".join(repr(n) for n in source.top_level_names)
        fixes.append("pass strict=False to restore only what matches")
        if names:
            fixes.append(f"pass at=... if the obj sits under a child of the source's root "
                         f"(top-level names: {names})")
    problems = tuple(lines)
    raise errors.StructureMismatchError(
        f"Cannot restore {source.description} into {_describe(obj)}: {len(lines)} problem"
        f"{'s' if len(lines) != 1 else ''}. Nothing was restored.\n" + "\n".join(lines)
        + "".join(f"\n{note}" for note in notes) + "\nFix: " + "; or ".join(fixes) + ".",
        problems)


def restore(obj, source, *, strict: bool = True, at: str | None = None) -> RestoreReport:
    """Restores obj's variables from a source by object path, all or nothing.

    Every shape, dtype, missing and unexpected entry is checked from metadata
    before a single variable is assigned, and every value is read before the
    first assignment: when anything is wrong, an error is raised and every
    variable keeps its exact previous value.

    Args:
      obj: the trackable to restore into; it must be built.
      source: a `Snapshot`, a checkpoint prefix, or a directory (its newest
        intact checkpoint; older ones are used when the newest is damaged).
      strict: if True (default), entries missing from the source or extra in it
        are errors. If False they are skipped and listed in the report. A shape
        or dtype mismatch is an error either way.
      at: restore from this subtree of the source, e.g. at="model" for a
        checkpoint written by `tf.train.Checkpoint(model=m, optimizer=o)`.
        When None and the source's root does not match obj but exactly one
        child subtree does, that subtree is used and the report says so.

    Returns:
      A frozen `RestoreReport`.

    Raises:
      StructureMismatchError: shapes, dtypes, missing or unexpected entries.
      UnbuiltModelError: obj has no variables yet.
      CheckpointNotFoundError, CheckpointCorruptError, NotObjectBasedError:
        the source cannot be used.

    Example:
      >>> objckpt.restore(model, "/tmp/run/ckpt-3", at="model")
    """
    variables = _tree.tree(obj)
    if isinstance(source, Snapshot) and at is None and source.origin() is variables:
        # Taken from this very obj, and its structure is unchanged: the paths,
        # shapes and dtypes are the ones just read, so there is nothing to check.
        variables.fused.assign_all(source._items.values())
        return RestoreReport(tuple(variables), source="Snapshot")
    src = _open_source(source)
    view, chosen_at, notes = _choose_view(variables, src, at)
    matched, missing, unexpected, mismatched = _problems(variables, src.specs, view)
    if mismatched or (strict and (missing or unexpected)) or not matched:
        _raise_mismatch(obj, variables, src, missing, unexpected, mismatched, notes, strict)
    values = src.fetch([view[p] for p in matched])
    if len(matched) == len(variables):
        variables.fused.assign_all(values)
    else:
        for path, value in zip(matched, values):
            variables[path].assign(value, read_value=False)
    return RestoreReport(tuple(matched), tuple(missing), tuple(unexpected), src.description,
                         chosen_at, src.notes + notes)


# --- saving --------------------------------------------------------------------


def save(obj_or_snapshot, prefix: str | os.PathLike) -> str:
    """Writes a standard TF object-based checkpoint with obj as its root.

    `tf.train.Checkpoint(root=same_structure).read(prefix)` loads it, and so
    does `objckpt.restore`. Saving a Snapshot gives the same layout as saving
    the obj it was taken from. The write is atomic: files are written under a
    temporary name and renamed, the index last, so a crash never leaves a
    half-written checkpoint under `prefix`: an existing checkpoint there stays
    readable while the new one is written; a crash during the final renames
    leaves the old one, none, or the new one, never a mix.

    Args:
      obj_or_snapshot: a trackable obj or a `Snapshot`.
      prefix: where to write (`prefix.index`, `prefix.data-00000-of-00001`).

    Returns:
      The prefix written.

    Raises:
      UnbuiltModelError: there is nothing to save.
    """
    snap = obj_or_snapshot if isinstance(obj_or_snapshot, Snapshot) else snapshot(obj_or_snapshot)
    prefix = os.fspath(prefix)
    if not snap:
        raise errors.UnbuiltModelError(
            f"Nothing to save to `{prefix}`: {_describe(obj_or_snapshot)} has no variables. "
            "Build the model (call it on a batch) before saving it.")
    origin = snap.origin()
    names = ([_compat.variable_name(v) for v in origin.values()] if origin is not None
             else [""] * len(snap))
    graph = _tree.build_object_graph(list(snap), names)
    keys = [_compat.checkpoint_key(path) for path in snap] + [_compat.OBJECT_GRAPH_KEY]
    directory = os.path.dirname(prefix)
    if directory:
        tf.io.gfile.makedirs(directory)
    temp = os.path.join(directory, f".{os.path.basename(prefix)}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(
                prefix=temp, tensor_names=keys, shape_and_slices=[""] * len(keys),
                tensors=[*snap._items.values(), tf.constant(graph.SerializeToString())])
        _commit(temp, prefix)
    finally:
        for leftover in tf.io.gfile.glob(temp + "*"):
            tf.io.gfile.remove(leftover)
    return prefix


_DATA_SUFFIX = ".data-00000-of-00001"


def _commit(temp: str, prefix: str) -> None:
    # The index is what makes a prefix a checkpoint. Remove the old one first,
    # so an old index never describes new data; then move the data, then the
    # index. A crash at any point leaves either the old checkpoint, no
    # checkpoint, or the new one under `prefix`, never a mix.
    if tf.io.gfile.exists(prefix + ".index"):
        tf.io.gfile.remove(prefix + ".index")
    _rename(temp + _DATA_SUFFIX, prefix + _DATA_SUFFIX)
    for stale in tf.io.gfile.glob(prefix + ".data-*"):
        if not stale.endswith(_DATA_SUFFIX):
            tf.io.gfile.remove(stale)
    _rename(temp + ".index", prefix + ".index")


def _rename(src: str, dst: str) -> None:
    tf.io.gfile.rename(src, dst, overwrite=True)
