"""The formats objckpt reads and writes, in one registry: each recognised, listed, opened,
verified and written through the same roles.

A `Format` is what one on-disk format provides:

- `recognise(path) -> bool`: whether `path` may be in this format, cheaply (names, a few
  bytes, an HDF5 file's root attributes; no data read); it raises only where `path` is
  surely this format and no format reads it (a SavedModel in text form);
- `list(path)`: its variables from metadata, TF-free (what `objckpt inspect`, `diff` and
  `graph` read through `_meta.read`): a dict `prefix`, `notes`, `index` and `graph` (None
  where the format has none), `description`, `variables`, a list of (path, shown, shape,
  DataType enum, key, name), and `read(key)`, a tensor's values as NumPy (what `diff`
  compares; None where the format gives none without TF);
- `open(path)`: the fields of a planning `_sources.Source` (a dict; TF imported lazily, for
  tensors only);
- `verify(path)`: a `Checked`: every value read once, problems listed;
- `write(path, tensors, **options)`: tensors written in the format (None: not written).

Each role returns None when `path`, which `recognise` let through, turns out not to be the
format's after all (a Keras 2 HDF5 file is an HDF5 file, but no Keras 3 one); the next format
is asked then. `FORMATS` is tried in order; the TF checkpoint (`checkpoint`: an object-based
or TF1 name-based bundle, given as a prefix or a managed directory) comes last and claims
every path that is no regular file. A path no format claims is an `UnsupportedFormatError`
(`unsupported`), its list of the files objckpt reads generated from `FORMATS`; every door
(`read_tree`, `plan`, `restore`, `verify`, `inspect`, `diff`, `graph`) dispatches here, as
tests/_formats/test_registry.py checks. Adding a format is one module and one line in `FORMATS` (or a
`register` call): docs/layout.md shows one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import NamedTuple

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import remote as _remote
from objckpt._formats import checkpoint as _checkpoint
from objckpt._formats import checkpoint_verify as _checkpoint_verify
from objckpt._formats import kerash5 as _kerash5
from objckpt._formats import legacyh5 as _legacyh5
from objckpt._formats import safetensors as _safetensors
from objckpt._formats import safetensors_write as _safetensors_write
from objckpt._formats import savedmodel as _savedmodel

__all__ = ["CHECKPOINT", "FORMATS", "PICKLE", "Checked", "Format", "dispatch", "find", "register",
           "unregister", "unsupported", "writer"]

ROLES = ("list", "open", "verify")


class Checked(NamedTuple):
    """What a format's `verify` found.

    Attributes:
      tensors, nbytes: values read intact, and their bytes.
      problems: (file, where, message) per problem.
      notes: remarks that are not problems.
      checked: what an intact report says was checked.
      prefixes: the TF checkpoints checked (a directory's, a SavedModel's
        `variables/variables`); empty for a file checked whole.
    """

    tensors: int
    nbytes: int
    problems: tuple
    notes: tuple
    checked: str = ""
    prefixes: tuple = ()


@dataclasses.dataclass(frozen=True)
class Format:
    """One on-disk format (see the module docstring); a role that is None is not offered."""

    name: str
    what: str  # for people: "Keras 3 weights file"
    files: str  # the files it reads, as the unknown-format message lists them ("": folders)
    recognise: Callable[[str], bool]
    list: Callable | None = None
    open: Callable | None = None
    verify: Callable | None = None
    # `write(path, tensors, **options) -> str`: {name: tensor to write} written in this
    # format (`safetensors_write`); None where objckpt does not write it.
    write: Callable | None = None


# HDF5 keeps no checksums: what an intact report of an HDF5 file says was checked.
_H5_CHECKED = ("read intact with the shapes and dtypes their headers declare (HDF5 keeps no "
               "checksums of weights)")


def _h5_checked(check: Callable) -> Callable:
    """A verify role from a format module's `check` ((count, nbytes, [(where, problem)],
    notes) or None), its problems about the file itself."""
    def verify(path: str) -> Checked | None:
        found = check(path)
        if found is None:
            return None
        count, nbytes, problems, notes = found
        return Checked(count, nbytes, tuple((path, where, what) for where, what in problems),
                       tuple(notes), _H5_CHECKED)
    return verify


def _savedmodel_checked(path: str) -> Checked:
    """A SavedModel's `saved_model.pb` against its checkpoint, then that checkpoint."""
    directory, problems, prefixes = _savedmodel.check(path)
    return Checked(*_checkpoint_verify.check_prefixes(
        prefixes, [(directory, _savedmodel.PB, p) for p in problems]))


# safetensors keeps no checksums either.
_SAFETENSORS_CHECKED = ("read whole; header checked (dtypes, shapes, offsets tiling the data "
                        "buffer) before any data (safetensors keeps no checksums)")


def _safetensors_checked(path: str) -> Checked | None:
    found = _safetensors.check(path)
    if found is None:
        return None
    count, nbytes, problems, notes = found
    return Checked(count, nbytes, tuple(problems), tuple(notes), _SAFETENSORS_CHECKED)


def _checkpoint_checked(path: str) -> Checked:
    return Checked(*_checkpoint_verify.verify(path))


# PyTorch's pickled weights: refused, never unpickled (unpickling runs the file's code).
_PICKLED = (".pt", ".pth", ".bin.index.json")
# What a `.bin` of torch's starts with: a pickle (protocol 2-5) or torch's zip archive.
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def _is_pickled(path: str, name: str) -> bool:
    """Whether the file `path` (named `name`) is torch's pickled weights: by its name, or a
    `.bin` by its first bytes (never unpickled)."""
    if name.endswith(_PICKLED) or (name.startswith("pytorch_model") and name.endswith(".bin")):
        return True
    if not name.endswith(".bin") or _files.regular_file_problem(path) is not None:
        return False
    with open(path, "rb") as handle:
        return handle.read(4).startswith(_PICKLE_MAGIC)


def _pickled(path: str) -> str | None:
    """The PyTorch pickle `path` is or holds (a file, or a folder holding one and no
    safetensors, which the safetensors format takes first), or None."""
    if "://" in path:
        return None
    try:
        if os.path.isfile(path):
            return path if _is_pickled(path, os.path.basename(path)) else None
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "checkpoint")):
            names = sorted(os.listdir(path))
            if any(name.endswith(".index") for name in names):
                return None  # a TF checkpoint's folder
            return next((os.path.join(path, name) for name in names
                         if _is_pickled(os.path.join(path, name), name)), None)
    except OSError:
        return None
    return None


def _refuse_pickle(path: str):
    """The error for PyTorch pickled weights: why they are never unpickled, and how to
    convert them to safetensors."""
    found = _pickled(path) or path
    shown = _render.safe(found)
    name = os.path.basename(found)
    raise errors.UnsupportedFormatError(
        f"`{shown}` is PyTorch pickled weights ({name}): objckpt never unpickles a file, as "
        "loading a pickle can run any code it holds. Fix: convert it to safetensors once, "
        "where you trust it, e.g. `python -c \"import torch, safetensors.torch as st; "
        f"st.save_file(torch.load('{name}', weights_only=True), 'model.safetensors')\"` "
        "(sharded `.bin` files: each shard, then write `model.safetensors.index.json`), or "
        "with transformers `AutoModel.from_pretrained(folder).save_pretrained(out, "
        "safe_serialization=True)`; then pass the safetensors file or folder.", source=path)


PICKLE = Format("pytorch-pickle", "PyTorch pickled weights (refused, never unpickled)", "",
                lambda path: _pickled(path) is not None, _refuse_pickle, _refuse_pickle,
                _refuse_pickle)

CHECKPOINT = Format("tf-checkpoint", "TF checkpoint (object-based or TF1 name-based; a prefix "
                    "or a managed directory)", "", _checkpoint.recognise, _checkpoint.listing,
                    _checkpoint.source_fields, _checkpoint_checked, _checkpoint.write)

# Tried in order; the TF checkpoint last, as it claims every path that is no regular file.
FORMATS: list[Format] = [
    Format("savedmodel", "SavedModel directory", "", _savedmodel.recognise,
           _savedmodel.listing, _savedmodel.source_fields, _savedmodel_checked),
    Format("keras3", "Keras 3 weights file", "Keras 3 `.weights.h5`, `.keras` and sharded "
           "`.weights.json`", _kerash5.recognise, _kerash5.listing, _kerash5.source_fields,
           _h5_checked(_kerash5.check)),
    Format("keras2-h5", "Keras 2 / tf_keras HDF5 file", "Keras 2 HDF5 `.h5`",
           _legacyh5.recognise, _legacyh5.listing, _legacyh5.source_fields,
           _h5_checked(_legacyh5.check)),
    Format("safetensors", "safetensors file", "safetensors `.safetensors` and "
           "`model.safetensors.index.json`", _safetensors.recognise, _safetensors.listing,
           _safetensors.source_fields, _safetensors_checked, _safetensors_write.write),
    PICKLE,  # after safetensors: a folder holding both is read from its safetensors
    CHECKPOINT,
]


def writer(name: str) -> Callable:
    """The write role of the format named `name` (what `objckpt.export` writes with).

    Raises:
      UnsupportedFormatError: no registered format of that name writes.
    """
    found = next((f.write for f in FORMATS if f.name == name and f.write is not None), None)
    if found is None:
        writable = ", ".join(f.name for f in FORMATS if f.write is not None)
        raise errors.UnsupportedFormatError(
            f"objckpt writes no format named {name!r}. Expected one of: {writable}. Fix: "
            "pick one of those, or register a format with a write role.")
    return found


def register(fmt: Format, *, before: str = CHECKPOINT.name) -> None:
    """Adds a format, tried before the one named `before` (the TF checkpoint by default)."""
    unregister(fmt.name)
    at = next(i for i, known in enumerate(FORMATS) if known.name == before)
    FORMATS.insert(at, fmt)


def unregister(name: str) -> None:
    """Removes the format named `name`, if registered (the TF checkpoint stays)."""
    FORMATS[:] = [f for f in FORMATS if f.name != name or f is CHECKPOINT]


def unsupported(path: str) -> errors.UnsupportedFormatError:
    """The error for a file no format claims: the files objckpt reads listed from the
    registry (in `_files.not_a_prefix`'s words), so a format registered is named."""
    return _files.not_a_prefix(path, ", ".join(f.files for f in FORMATS if f.files))


def _is_object(url: str) -> bool:
    """Whether one object is at `url` (False when the storage cannot tell)."""
    try:
        return _remote.exists(url)
    except OSError:
        return False


def _remote_file(url: str) -> errors.UnsupportedFormatError:
    """The error for a URL naming one object (a file) rather than a checkpoint."""
    shown = _render.safe(url)
    return errors.UnsupportedFormatError(
        f"`{shown}` is one object, not a TF checkpoint: from a URL objckpt reads checkpoint "
        f"prefixes (`{shown}.index` beside `{shown}.data-*`) and directories of them. Files "
        "of the other formats (Keras `.weights.h5`, `.keras`, `.h5`, SavedModel folders) are "
        "read from local paths. Fix: copy it to a local path first (e.g. `gcloud storage cp` "
        "or `aws s3 cp`) and pass that path.", source=url)


def find(path: str | os.PathLike) -> Format:
    """The first format that recognises `path` (a role may still decline it: `dispatch`).

    Raises:
      UnsupportedFormatError: no format recognises it (or a SavedModel in text form).
    """
    path = os.fspath(path)
    for fmt in FORMATS:
        if fmt.recognise(path):
            return fmt
    raise unsupported(path)


def dispatch(role: str, path: str | os.PathLike):
    """`role` ("list", "open" or "verify") of the format of `path`: the first format that
    recognises it and whose role answers (not None); the TF checkpoint's always answers
    (or raises).

    A URL (`gs://`, `s3://`) is read from a local staged copy; its errors name the URL.

    Raises:
      UnsupportedFormatError: no format takes `path`.
    """
    if role not in ROLES:
        raise ValueError(f"unknown format role {role!r}; expected one of {ROLES}")
    path = os.fspath(path)
    for fmt in list(FORMATS):
        action = getattr(fmt, role)
        if action is None or not fmt.recognise(path):
            continue
        try:
            found = action(path)
        except errors.ObjckptError as err:
            if not _remote.is_remote(path):
                raise
            _remote.unstage(err)  # read from a staged copy: the URL named instead
            if isinstance(err, errors.CheckpointNotFoundError) and _is_object(path):
                raise _remote_file(path) from err
            raise
        if found is not None:
            return found
    raise unsupported(path)
