"""HDF5 files read as untrusted input: the one safe reading layer (h5py, read-only).

Keras writes weights as HDF5 (Keras 3 `.weights.h5` and the `model.weights.h5` inside a
`.keras` zip; Keras 2 / tf_keras `.h5`). Every such file is untrusted: this module checks a
file's structure and every dataset's metadata before a byte of tensor data is read, and
turns every problem into a `CheckpointCorruptError` naming the file, the entry and what is
wrong. No pickle, no code, nothing evaluated; HDF5 holds no code of its own.

API (the format modules `_kerash5` and the Keras 2 HDF5 reader use only these):

- `looks_like_hdf5(path) -> bool`: a regular file that starts with HDF5's signature
  (reads 8 bytes; h5py is not imported). Openers use it to say "not my format" cheaply.
- `open_file(path, *, shown=None) -> H5File`, `open_bytes(data, shown) -> H5File`: open a
  regular file (checked with `_bundle.regular_file_problem`, at most `MAX_FILE_BYTES`) or
  bytes (a zip member, read bounded by its caller) read-only. `shown` names the file in
  messages (`model.keras:model.weights.h5`). An `H5File` is a context manager.
- `H5File.datasets(under="") -> dict[path, Dataset]`: every dataset below the group `under`
  by its `/`-joined path from the root (`layers/dense/vars/0`), in h5py's order (by name),
  each validated: hard links only (soft and external links refused, as are virtual
  datasets, external raw storage, unknown filters), a numeric dtype TF can hold (float16/32/64,
  int8..64, uint8..64, bool, complex64/128; bfloat16 stored as Keras 3 does: 2-byte opaque
  with attribute `dtype="bfloat16"`), at most `MAX_DIMS` dimensions and `MAX_ELEMENTS`
  elements, and its storage consistent with the file: contiguous data lies within the file,
  chunked (compressed) data expands at most `MAX_EXPANSION` times. The walk is bounded
  (`MAX_DEPTH` levels, `MAX_NODES` links in all), so a hard-link cycle ends.
- `H5File.groups(under="") -> list[str]`: names of the subgroups directly below `under`.
- `H5File.has(path) -> bool`: whether a group or dataset exists at `path` (hard links).
- `H5File.read(path_or_dataset) -> numpy.ndarray`: one dataset's values (native byte order;
  bfloat16 as `ml_dtypes.bfloat16` when available), its metadata checked again first.
- `H5File.attr_strings(path, name) -> list[str] | None` and `attr_text(path, name) -> str |
  None`: a group's (or dataset's) string attribute (Keras 2's `layer_names`,
  `weight_names`, `keras_version`), bounded by `MAX_ATTR_BYTES` and `MAX_ATTR_ITEMS`; None
  when absent; decoded as UTF-8 with replacement (data, to be shown through `_render.safe`).
- `Dataset(path, shape, dtype, nbytes)`: `dtype` is a NumPy name (`float32`) or `bfloat16`.

What is out of reach: libhdf5 parses the superblock and object headers itself, in C; a file
crafted against a libhdf5 parser bug may crash the process before any check here can look.
Checks here (a regular file, the signature, sizes, links, layouts and dtypes before data)
keep every ordinary damage (truncation, wrong shapes or dtypes, bogus sizes) a typed error,
and `objckpt verify` reads every dataset so a file can be checked before it is trusted.
"""

from __future__ import annotations

import io
import os
from typing import NamedTuple

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle

__all__ = ["DATATYPES", "MAX_FILE_BYTES", "SIGNATURE", "Dataset", "H5File", "looks_like_hdf5",
           "open_bytes", "open_file"]

# The dtype names a `Dataset` can have -> TF's DataType enum (as checkpoints store it).
DATATYPES = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6,
             "complex64": 8, "int64": 9, "bool": 10, "bfloat16": 14, "uint16": 17,
             "complex128": 18, "float16": 19, "uint32": 22, "uint64": 23}

SIGNATURE = b"\x89HDF\r\n\x1a\n"
MAX_FILE_BYTES = 1 << 40
MAX_ELEMENTS = 1 << 40
MAX_DIMS = 64
MAX_DEPTH = 32
MAX_NODES = 1 << 20
MAX_EXPANSION = 1000  # chunked (compressed) data: logical bytes per stored byte
_SMALL = 1 << 20  # below this, chunked data may expand freely (fill values, tiny chunks)
MAX_ATTR_BYTES = 1 << 24
MAX_ATTR_ITEMS = 1 << 20

_NUMERIC = {"f": (2, 4, 8), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "c": (8, 16), "b": (1,)}
# Filters libhdf5 has built in (deflate, shuffle, fletcher32, szip, nbit, scaleoffset) and
# lzf, which h5py registers itself; any other would load a plugin.
_FILTERS = frozenset({1, 2, 3, 4, 5, 6, 32000})


class Dataset(NamedTuple):
    """A validated dataset: `/`-joined path from the root, shape, dtype name, bytes."""

    path: str
    shape: tuple
    dtype: str
    nbytes: int


def _corrupt(shown: str, entry: str | None, problem: str) -> errors.CheckpointCorruptError:
    where = f"`{_render.safe(shown)}`"
    if entry:
        where += f" at `{_render.safe(entry)}`"
    return errors.CheckpointCorruptError(
        f"HDF5 file {where} cannot be read safely: {problem}. Nothing was changed. Fix: use an "
        "intact copy of the file (or write it again with the library that made it).", source=shown)


def looks_like_hdf5(path: str) -> bool:
    """Whether `path` is a regular file starting with HDF5's signature (no h5py import)."""
    if _bundle.regular_file_problem(path) is not None:
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SIGNATURE)) == SIGNATURE
    except OSError:
        return False


def open_file(path: str, *, shown: str | None = None) -> H5File:
    """Opens the HDF5 file at `path` read-only after checking it is a regular file of at
    most MAX_FILE_BYTES that starts with HDF5's signature.

    Raises:
      CheckpointCorruptError: not a regular file, too large, no signature, or libhdf5
        refuses it (truncated superblock, damaged headers).
    """
    shown = path if shown is None else shown
    problem = _bundle.regular_file_problem(path, MAX_FILE_BYTES)
    if problem is not None:
        raise _corrupt(shown, None, problem)
    size = os.stat(path).st_size
    with open(path, "rb") as handle:
        if handle.read(len(SIGNATURE)) != SIGNATURE:
            raise _corrupt(shown, None, "it does not start with HDF5's signature")
    return _open(path, shown, size)


def open_bytes(data: bytes, shown: str) -> H5File:
    """Opens HDF5 bytes (a zip member its caller read, bounded) read-only."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:8]) != SIGNATURE:
        raise _corrupt(shown, None, "it does not start with HDF5's signature")
    return _open(io.BytesIO(data), shown, len(data))


def _open(target, shown: str, size: int) -> H5File:
    import h5py  # only where an HDF5 file is read: `import objckpt` stays cheap

    try:
        handle = h5py.File(target, "r", locking=False) if isinstance(target, str) else \
            h5py.File(target, "r")
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
        raise _corrupt(shown, None, f"libhdf5 refuses it ({_render.first_line(err)}); it "
                                    "is truncated or damaged") from err
    return H5File(handle, shown, size)


class H5File:
    """An open HDF5 file whose metadata is checked before any data is read.

    Attributes:
      shown: the file's name in messages.
      size: its size in bytes.
    """

    def __init__(self, handle, shown: str, size: int):
        self._h5 = handle
        self.shown = shown
        self.size = size

    def __enter__(self) -> H5File:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._h5.close()

    def _fail(self, entry, problem: str) -> errors.CheckpointCorruptError:
        return _corrupt(self.shown, entry, problem)

    def _child(self, group, name: str, path: str):
        """The object of a hard link, or an error naming the link's kind."""
        import h5py

        try:
            link = group.get(name, getlink=True)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"its link cannot be read ({_render.first_line(err)})"
                             ) from err
        if isinstance(link, h5py.ExternalLink):
            raise self._fail(path, "it is an external link to another file; objckpt reads "
                                   "no file but the one given")
        if isinstance(link, h5py.SoftLink):
            raise self._fail(path, "it is a soft link; Keras writes none")
        try:
            return group[name]
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"it cannot be opened ({_render.first_line(err)})") from err

    def _node(self, path: str):
        node = self._h5
        done = []
        for edge in [e for e in path.split("/") if e]:
            if not hasattr(node, "keys"):
                raise self._fail("/".join(done), "it is a dataset, not a group")
            done.append(edge)
            try:  # H5Lexists: the link itself, never followed (an external one opens nothing)
                found = node.id.links.exists(edge.encode())
            except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
                raise self._fail("/".join(done), f"its link cannot be read "
                                 f"({_render.first_line(err)})") from err
            if not found:
                raise self._fail("/".join(done), "there is no such group or dataset")
            node = self._child(node, edge, "/".join(done))
        return node

    def _names(self, group, path: str) -> list[str]:
        try:
            count = len(group)
            if count > MAX_NODES:
                raise self._fail(path, f"its group holds {count:,} links (at most "
                                       f"{MAX_NODES:,} are read)")
            return [str(name) for name in group]
        except errors.ObjckptError:
            raise
        except (OSError, ValueError, RuntimeError, KeyError, TypeError,
                UnicodeDecodeError) as err:
            raise self._fail(path, f"its group cannot be listed ({_render.first_line(err)})"
                             ) from err

    def has(self, path: str) -> bool:
        """Whether a group or dataset exists at `path` (every link on the way a hard one)."""
        try:
            self._node(path)
        except errors.CheckpointCorruptError:
            return False
        return True

    def groups(self, under: str = "") -> list[str]:
        """Names of the subgroups directly below the group `under`."""
        node = self._node(under)
        out = []
        for name in self._names(node, under):
            child = self._child(node, name, f"{under}/{name}".strip("/"))
            if hasattr(child, "keys"):
                out.append(name)
        return out

    def datasets(self, under: str = "") -> dict:
        """Every dataset below the group `under`, validated: {path from root: Dataset}."""
        out: dict = {}
        seen = [0]
        base = under.strip("/")

        def walk(group, path: str, depth: int) -> None:
            if depth > MAX_DEPTH:
                raise self._fail(path, f"groups nest deeper than {MAX_DEPTH} levels")
            for name in self._names(group, path):
                seen[0] += 1
                if seen[0] > MAX_NODES:
                    raise self._fail(path, f"it holds more than {MAX_NODES:,} links")
                child_path = f"{path}/{name}" if path else name
                child = self._child(group, name, child_path)
                if hasattr(child, "keys"):
                    walk(child, child_path, depth + 1)
                else:
                    out[child_path] = self._describe(child, child_path)

        walk(self._node(base), base, 0)
        return out

    def _describe(self, dset, path: str) -> Dataset:
        import h5py

        if not isinstance(dset, h5py.Dataset):
            raise self._fail(path, f"it is a {type(dset).__name__}, not a dataset")
        try:
            dtype = dset.dtype
            shape = dset.shape
            plist = dset.id.get_create_plist()  # one property list, not one per question
            layout = plist.get_layout()
            virtual = layout == h5py.h5d.VIRTUAL
            external = plist.get_external_count()
            filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            storage = dset.id.get_storage_size()
            offset = dset.id.get_offset() if layout == h5py.h5d.CONTIGUOUS else None
            bfloat16 = dtype.kind == "V" and dtype.itemsize == 2 and \
                self._attr_is(dset, "dtype", "bfloat16")
        except errors.ObjckptError:
            raise
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"its header cannot be read ({_render.first_line(err)})"
                             ) from err
        if virtual:
            raise self._fail(path, "it is a virtual dataset (data in other files)")
        if external:
            raise self._fail(path, "its data is stored in external files")
        unknown = sorted(set(filters) - _FILTERS)
        if unknown:
            raise self._fail(path, f"it uses HDF5 filter(s) {unknown}, which would load "
                                   "plugins; only the built-in filters are read")
        if shape is None:
            raise self._fail(path, "it has no dataspace (a null dataset)")
        if len(shape) > MAX_DIMS:
            raise self._fail(path, f"it has {len(shape)} dimensions (at most {MAX_DIMS})")
        if bfloat16:
            name = "bfloat16"
        elif dtype.kind in _NUMERIC and dtype.itemsize in _NUMERIC[dtype.kind] and \
                dtype.fields is None and not dtype.subdtype:
            name = dtype.newbyteorder("=").name
        elif dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
            # How h5py stores TF's own bfloat16 NumPy type (Keras 2 / tf_keras save_weights of
            # a bfloat16 model): opaque bytes with no dtype attribute, so nothing says which
            # 2-byte type they are, and Keras's own loader cannot read them back either.
            where = f"`{_render.safe(self.shown)}` at `{_render.safe(path)}`"
            # CheckpointCorruptError as every unreadable dataset (verify lists it as a
            # problem), with the true reason and its fix
            raise errors.CheckpointCorruptError(
                f"HDF5 file {where} holds dtype `{_render.safe(str(dtype))}`: opaque 2-byte "
                "values with no `dtype` attribute, which is how Keras 2 and tf_keras save "
                "bfloat16 weights. The file may be intact, but it does not record which 2-byte "
                "type these are (Keras's own load_weights refuses it too), so objckpt does not "
                "guess. Nothing was changed. Fix: save the model as a TF checkpoint "
                "(objckpt.save or model.save_weights to a prefix without .h5), or save the "
                "weights of a float32 copy of the model.", source=self.shown)
        else:
            raise self._fail(path, f"its dtype `{_render.safe(str(dtype))}` is not a number "
                                   "type TensorFlow can hold")
        elements = _render.elements(shape)
        if elements > MAX_ELEMENTS:
            raise self._fail(path, f"its shape {_render.shape(shape)} holds {elements:,} "
                                   "elements, more than any model's weight")
        nbytes = elements * dtype.itemsize
        if layout == h5py.h5d.CONTIGUOUS:
            if offset is not None and (offset < 0 or offset + nbytes > self.size):
                raise self._fail(path, f"its {nbytes:,} bytes at offset {offset:,} lie beyond "
                                       f"the end of the file ({self.size:,} bytes); it is "
                                       "truncated")
            if offset is None and nbytes > _SMALL:
                # Never written (no storage allocated): it would read as its fill value, a
                # tiny file claiming any size. Keras writes every weight it declares.
                raise self._fail(path, f"its {nbytes:,} bytes of contiguous data have no "
                                       "place in the file (never written)")
        elif layout == h5py.h5d.CHUNKED:
            if storage > self.size:
                raise self._fail(path, f"its chunks claim {storage:,} bytes, more than the "
                                       f"file's {self.size:,}")
            if nbytes > _SMALL and nbytes > MAX_EXPANSION * storage:
                raise self._fail(path, f"its {storage:,} stored bytes would expand to "
                                       f"{nbytes:,} (more than {MAX_EXPANSION}x)")
        elif layout == h5py.h5d.COMPACT:
            if nbytes > 1 << 16:
                raise self._fail(path, f"its compact data claims {nbytes:,} bytes (at most "
                                       "64 KiB fit in a header)")
        else:
            raise self._fail(path, f"its storage layout {layout} is unknown")
        return Dataset(path, tuple(int(d) for d in shape), name, nbytes)

    def read(self, what) -> object:
        """One dataset's values as a NumPy array, its metadata checked again first.

        Args:
          what: a path from the root or a `Dataset` from `datasets`.
        """
        import numpy as np

        path = what.path if isinstance(what, Dataset) else str(what).strip("/")
        dset = self._node(path)
        spec = self._describe(dset, path)
        if isinstance(what, Dataset) and (spec.shape, spec.dtype) != (what.shape, what.dtype):
            raise self._fail(path, f"it changed while open: {spec.shape} {spec.dtype}, "
                                   f"listed as {what.shape} {what.dtype}")
        stored = dset.dtype
        try:
            if spec.dtype == "bfloat16":
                raw = np.empty(spec.shape, dtype=stored)
                if spec.nbytes:
                    dset.read_direct(raw)
                return _bfloat16(raw.view(np.uint16))
            out = np.empty(spec.shape, dtype=stored.newbyteorder("="))
            if spec.nbytes:
                dset.read_direct(out)
            return out
        except MemoryError as err:
            raise self._fail(path, f"its {spec.nbytes:,} bytes do not fit in memory") from err
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"its data cannot be read ({_render.first_line(err)}); "
                                   "the file is truncated or damaged") from err

    def _attr_is(self, node, name: str, value: str) -> bool:
        found = self._attr(node, name, "")
        return found is not None and len(found) == 1 and found[0] == value

    def _attr(self, node, name: str, path: str) -> list[str] | None:
        import h5py

        try:
            if name not in node.attrs:
                return None
            attr = h5py.h5a.open(node.id, name.encode())
            shape, dtype = attr.shape, attr.dtype
            storage = attr.get_storage_size()
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"its attribute `{_render.safe(name)}` cannot be read "
                                   f"({_render.first_line(err)})") from err
        count = _render.elements(shape or ())
        if count > MAX_ATTR_ITEMS or storage > MAX_ATTR_BYTES:
            raise self._fail(path, f"its attribute `{_render.safe(name)}` claims {count:,} "
                                   f"items in {storage:,} bytes; too large")
        if dtype.kind not in "SUO":
            raise self._fail(path, f"its attribute `{_render.safe(name)}` holds "
                                   f"`{_render.safe(str(dtype))}`, not text")
        try:
            value = node.attrs[name]
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
            raise self._fail(path, f"its attribute `{_render.safe(name)}` cannot be read "
                                   f"({_render.first_line(err)})") from err
        items = value.reshape(-1).tolist() if hasattr(value, "reshape") else [value]
        out, total = [], 0
        for item in items:
            text = item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            total += len(text)
            if total > MAX_ATTR_BYTES:
                raise self._fail(path, f"its attribute `{_render.safe(name)}` holds more "
                                       f"than {MAX_ATTR_BYTES:,} characters")
            out.append(text)
        return out

    def attr_strings(self, path: str, name: str) -> list[str] | None:
        """A string attribute of the group or dataset at `path`, as a list; None if absent."""
        return self._attr(self._node(path), name, path)

    def attr_text(self, path: str, name: str) -> str | None:
        """A scalar (or one-item) string attribute; None if absent or not one item."""
        found = self.attr_strings(path, name)
        return found[0] if found is not None and len(found) == 1 else None


def _bfloat16(bits):
    """uint16 bit patterns as bfloat16 (ml_dtypes, which TF and Keras install)."""
    import ml_dtypes

    return bits.view(ml_dtypes.bfloat16)
