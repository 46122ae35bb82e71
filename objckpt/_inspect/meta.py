"""A checkpoint's variables from its metadata alone, without TensorFlow.

`read(source)` resolves a prefix or directory, validates the index (`_bundle`) and decodes
the object graph (`_objgraph`), all in pure Python, and lists every variable with:

- `path`: TF's canonical object path (the part of its checkpoint key before
  `/.ATTRIBUTES/`), what `objckpt.read_tree` and `objckpt.diff` key by;
- `shown`: the path people recognise: the network path, found by a walk that takes
  optimizer edges last, so a trained Keras 3 model's weight canonically at
  `optimizer/_trainable_variables/0` is shown at `_functional/_operations/1/_kernel`;
- `name`: the variable's name when it was saved (`sequential/encoder/kernel`), or "";
- `shape`, `dtype` (a `DType`: `.name`, `.size`, `.enum`, as TF names them), `key`;
- `layout`: how a partitioned tensor is stored ("2 shards of rows [0:5) [5:10)": a sharded
  variable of ParameterServerStrategy, or a TF1 partitioned variable, saved as one key with
  one slice per shard), "" for a tensor stored whole. Everything else shows it whole.

A name-based (TF1 `Saver`) checkpoint lists its tensors by global variable name (`path`,
`shown` and `name` are the name). This is what the command line's `inspect`, `graph` and
`diff` read, so they answer in well under a second: importing TensorFlow takes longer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import remote as _remote
from objckpt._formats import checkpoint as _checkpoint
from objckpt._formats import registry as _formats

__all__ = ["DType", "Metadata", "Variable", "dtype", "layout", "read"]

_DTYPE_NAMES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32",
    14: "bfloat16", 15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128",
    19: "float16", 21: "variant", 22: "uint32", 23: "uint64", 24: "float8_e5m2",
    25: "float8_e4m3fn",
}


class DType(NamedTuple):
    """A stored dtype as TF names it: `name` (`float32`), `size` (bytes per element, 0 for
    strings and variants, as `tf.DType.size`) and the DataType `enum`."""

    enum: int
    name: str
    size: int


def dtype(enum: int) -> DType:
    """The `DType` of a DataType enum the index validator accepted."""
    return DType(enum, _DTYPE_NAMES[enum], _bundle.dtype_size(enum))


def layout(slices, shape) -> str:
    """How a tensor of `shape` stored as `slices` (an index entry's: per slice, one
    `(start, length)` extent per axis, length -1 for the whole axis) is split: "2 shards of
    rows [0:5) [5:10)" (the words of objckpt's plans), "3 slices along axis 1 [0:2) ..."
    (TF1 partitioners may split another axis), "4 slices" (several axes); "" unsliced."""
    if not slices:
        return ""
    shape = tuple(shape)

    def cut(extent, dim) -> bool:
        start, length = extent
        return not (length == -1 or (start == 0 and length == dim))

    axes = sorted({axis for extents in slices for axis, (extent, dim)
                   in enumerate(zip(extents, shape)) if cut(extent, dim)})
    count = len(slices)
    if len(axes) > 1:
        return f"{count} slices"
    axis = axes[0] if axes else 0
    spans = sorted((e[axis][0], e[axis][0] + (shape[axis] if e[axis][1] == -1 else e[axis][1]))
                   for e in slices)
    text = " ".join(f"[{start}:{stop})" for start, stop in spans)
    plural = "s" if count != 1 else ""
    if axis == 0:
        return f"{count} shard{plural} of rows {text}"
    return f"{count} slice{plural} along axis {axis} {text}"


class Variable(NamedTuple):
    """One variable of a checkpoint (see the module docstring)."""

    path: str
    shown: str
    shape: tuple
    dtype: DType
    key: str
    name: str = ""
    layout: str = ""

    @property
    def nbytes(self) -> int:
        return math.ceil(_render.elements(self.shape) * self.dtype.size)


class Metadata(Mapping):
    """Ordered mapping canonical path (or name) -> `Variable`: network paths first, in the
    order of a walk that takes optimizers last, then optimizer-owned variables.

    Attributes:
      prefix: the checkpoint read (a directory resolved to its newest intact checkpoint); a
        URL (`gs://...`) as given, though it was read from a local copy, `local`.
      local: where the checkpoint's files are read (`prefix`, or the local staged copy of
        a remote one, kept while this is).
      notes: why an older checkpoint of a directory was used, or a name skipped.
      index: the validated `_bundle.Index`.
      graph: the decoded object graph (`_objgraph.Graph`), None when name-based.
    """

    __slots__ = ("_items", "description", "graph", "index", "local", "notes", "prefix", "read")

    def __init__(self, items: dict, prefix: str, notes: tuple, index, graph,
                 description: str = "", read=None):
        self._items, self.notes = items, notes
        self.prefix, self.local = _remote.shown(prefix), prefix
        self.index, self.graph = index, graph
        # What the file is when it is no TF checkpoint ("Keras 3 weights file `w.weights.h5`"),
        # from the format's reader; "" for checkpoints.
        self.description = description
        # `read(key)`: a tensor's values as NumPy, for a format that gives them without TF
        # (TF checkpoints, safetensors), so `diff` compares it; None for the others.
        self.read = read

    def __getitem__(self, path: str) -> Variable:
        return self._items[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def name_based(self) -> bool:
        return self.graph is None and not self.description

    @property
    def nbytes(self) -> int:
        return sum(variable.nbytes for variable in self._items.values())

    def __repr__(self) -> str:
        return f"Metadata({self.prefix!r}, {len(self)} variables)"


def read(source: str | os.PathLike) -> Metadata:
    """Reads a source's variables from its metadata, without TF, through the format
    registry (a TF checkpoint's index and object graph, a file's headers).

    Args:
      source: a checkpoint prefix (`prefix.index` may be given too) or a directory of
        managed checkpoints (its newest intact one, checked without TF); local, or a URL
        (`gs://`, `s3://`: the checkpoint is downloaded into a private local copy first);
        or a file or folder of another format (`_formats`).

    Raises:
      CheckpointNotFoundError: nothing at `source`.
      CheckpointCorruptError: the index or the object graph is damaged.
      UnsupportedFormatError: a file in no format objckpt reads (`_formats`).
    """
    found = _formats.dispatch("list", source)
    entries = getattr(found["index"], "entries", None) or {}  # a TF checkpoint's index
    # A format's dtype is TF's DataType enum, or (0, name, bytes per element) for one TF
    # lacks (safetensors' F8_E8M0, 4-bit floats: fractional sizes).
    return Metadata({v[0]: Variable(v[0], v[1], v[2], dtype(v[3]) if isinstance(v[3], int)
                                    else DType(*v[3]), v[4], v[5],
                                    _layout_of(entries.get(v[4]), v[2]))
                     for v in found["variables"]}, found["prefix"], tuple(found["notes"]),
                    found["index"], found["graph"], found.get("description", ""),
                    found.get("read"))


# node id -> the path people recognise (the TF checkpoint format's, `_formats.checkpoint`).
network_paths = _checkpoint.network_paths


def _layout_of(entry, shape) -> str:
    slices = getattr(entry, "slices", None)
    return layout(slices, shape) if slices else ""
