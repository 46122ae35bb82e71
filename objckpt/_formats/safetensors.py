"""safetensors files as sources, read as untrusted input without TensorFlow.

A safetensors file is 8 bytes (N, little-endian unsigned), N bytes of UTF-8 JSON, then the
data buffer: the JSON object maps each tensor name to `{"dtype", "shape", "data_offsets":
[begin, end]}` (offsets into the buffer) and may hold `"__metadata__"`, a string-to-string
object. Values are raw little-endian bytes, C order. Hugging Face shares weights as one
`model.safetensors`, or as shards named by `model.safetensors.index.json` (its `weight_map`:
tensor name -> shard file); a folder holding either is read as that file.

The header is checked whole before a byte of data is read (`read_header`), as the reference
implementation checks it: N at most `MAX_HEADER` (100 MB) and within the file; the JSON valid
UTF-8, an object, no name twice (at any depth), `__metadata__` strings only; each entry's
dtype one of `DTYPES`, its shape a list of at most `MAX_RANK` non-negative integers, its
`data_offsets` two integers within the buffer spanning exactly elements x itemsize bytes;
the entries, sorted by offset, tile the buffer: no overlap, no gap, no trailing byte (as
the reference implementation requires). Keys beside `dtype`, `shape` and `data_offsets` in
an entry are ignored. A shard index is JSON (bounded, no name twice) whose shard names are
plain file names beside it; every tensor sits in the shard the index names, and no tensor
is in two shards. A problem is a `CheckpointCorruptError` naming the file, the entry and
what is wrong.

A source reads values with `pread` straight into a new TF tensor (`_Reader`: the one copy a
restore needs, large sequential reads, no file held mapped); bfloat16 is bit-cast and
float8 viewed as TF's type (`_compat.numpy_dtype`), so every bit (NaN payloads included)
arrives as written. A restore streams
(`stream`, `_Streamer`): every planned entry's shape and dtype after its transform is checked
from the header before anything is read (a transform's output shape from its `output_shape`
or traced on a `tf.TensorSpec`), then each tensor is read, transformed, converted and
assigned in turn, several at once within a budget, so a restore holds about the largest
tensor beyond the model. `read_array` (TF-free: `diff`, tests) maps the file. The file's
size is checked again when it is opened or mapped: a file changed since its header was read
is refused.
safetensors keeps no checksums: `check` (for `verify`) reads every tensor's bytes once and
says what was checked. Dtypes TF has no type for (`F8_E8M0`, the `FNUZ` float8s, the 4- and
6-bit floats) are listed and verified, never offered to a restore (a note says so).

Entry points, the format's roles in `_formats.FORMATS`: `recognise(path)`, `listing(path)`
(TF-free), `source_fields(path)` and `check(path)`; the last three return None when `path` is
no safetensors file.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from typing import NamedTuple

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle

__all__ = ["DTYPES", "INDEX_NAME", "MAX_HEADER", "MAX_RANK", "SINGLE_NAME", "Header", "Model",
           "Tensor", "check", "listing", "read_array", "read_header", "read_model", "recognise",
           "source_fields"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100_000_000  # the reference implementation's bound on N
MAX_RANK = 64
_MAX_INDEX = 1 << 26  # bytes of a shard index
_MAX_SHARDS = 100_000
_MAX_NOTES = 20  # `__metadata__` items shown as notes
_CHUNK = 1 << 24  # bytes per read when verifying

# safetensors dtype -> (bits per element, NumPy / ml_dtypes name ("" when neither reads it
# per element), TF's dtype name ("" when TF has none), TF's DataType enum (0: none)).
DTYPES = {
    "BOOL": (8, "bool", "bool", 10),
    "U8": (8, "uint8", "uint8", 4),
    "I8": (8, "int8", "int8", 6),
    "I16": (16, "<i2", "int16", 5),
    "U16": (16, "<u2", "uint16", 17),
    "I32": (32, "<i4", "int32", 3),
    "U32": (32, "<u4", "uint32", 22),
    "I64": (64, "<i8", "int64", 9),
    "U64": (64, "<u8", "uint64", 23),
    "F16": (16, "<f2", "float16", 19),
    "BF16": (16, "bfloat16", "bfloat16", 14),
    "F32": (32, "<f4", "float32", 1),
    "F64": (64, "<f8", "float64", 2),
    "C64": (64, "<c8", "complex64", 8),
    "F8_E4M3": (8, "float8_e4m3fn", "float8_e4m3fn", 25),
    "F8_E5M2": (8, "float8_e5m2", "float8_e5m2", 24),
    "F8_E8M0": (8, "float8_e8m0fnu", "", 0),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz", "", 0),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz", "", 0),
    "F6_E2M3": (6, "", "", 0),
    "F6_E3M2": (6, "", "", 0),
    "F4": (4, "", "", 0),
}
# Read through ml_dtypes (installed with TF); the others are NumPy's own.
_ML_DTYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
                        "float8_e4m3fnuz", "float8_e5m2fnuz"})
# Bit-cast from unsigned integers of the same width into TF: exact whatever TF's NumPy types.
_BITCAST = {"bfloat16": "<u2", "float8_e4m3fn": "u1", "float8_e5m2": "u1"}


class Tensor(NamedTuple):
    """One tensor of a file: its name, safetensors dtype, shape, and its bytes' place in the
    file (`begin`, `end`: absolute offsets, the header's plus 8 + N)."""

    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int
    file: str

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class Header(NamedTuple):
    """A file's validated header: `tensors` {name: Tensor} in the header's order, its
    `metadata` {str: str}, and the file's size when it was read."""

    path: str
    size: int
    tensors: dict
    metadata: dict


class Model(NamedTuple):
    """What a path names: one file or an index's shards (`headers`, in the index's order),
    every tensor by name (`tensors`), and how to describe it."""

    path: str
    description: str
    headers: tuple
    tensors: dict
    notes: tuple


def _refused(path: str, entry: str | None, problem: str) -> errors.CheckpointCorruptError:
    where = f"`{_render.safe(path)}`" + (f": entry `{_render.safe(entry)}`" if entry is not None
                                         else "")
    return errors.CheckpointCorruptError(
        f"safetensors file {where} {problem}. objckpt reads no such file; nothing was read "
        "into any variable. Fix: use a file written by the `safetensors` library or Hugging "
        "Face tooling (download or write it again).", source=path)


def _unique_keys(pairs):
    """`object_pairs_hook` of `json.loads`: an object with a name twice is refused."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


class _Duplicate(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _json(path: str, text: bytes, what: str):
    """JSON `text` decoded strictly: UTF-8, no name twice, no NaN/Infinity."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _refused(path, None, f"has a {what} that is not valid UTF-8 (byte "
                                   f"{err.start:,}: {_render.first_line(err)})") from err
    try:
        return json.loads(decoded, object_pairs_hook=_unique_keys,
                          parse_constant=_no_constant)
    except _Duplicate as err:
        raise _refused(path, err.key, f"is named twice in its {what} (JSON objects name each "
                                      "member once)") from err
    except (ValueError, RecursionError) as err:
        raise _refused(path, None, f"has a {what} that is not valid JSON "
                                   f"({_render.first_line(err)})") from err


def _no_constant(name: str):
    raise ValueError(f"`{name}` is no JSON value")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: str) -> Header:
    """The validated header of the safetensors file `path` (see the module docstring); no
    tensor byte is read.

    Raises:
      CheckpointCorruptError: a problem of the file (names the file and the entry).
    """
    problem = _bundle.regular_file_problem(path)
    if problem is not None:
        raise _refused(path, None, f"cannot be read: {problem}")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise _refused(path, None, f"holds {len(head)} bytes; a safetensors file "
                                           "starts with 8 bytes giving its header's length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER:
                raise _refused(path, None, f"claims a header of {length:,} bytes; at most "
                                           f"{MAX_HEADER:,} are read (the reference "
                                           "implementation's bound)")
            if 8 + length > size:
                raise _refused(path, None, f"claims a header of {length:,} bytes, past the "
                                           f"file's end ({size:,} bytes)")
            text = handle.read(length)
    except OSError as err:
        if isinstance(err, errors.ObjckptError):
            raise
        raise _refused(path, None, f"cannot be read ({_render.first_line(err)})") from err
    if len(text) != length:
        raise _refused(path, None, "changed while its header was read")
    if not text.startswith(b"{"):
        raise _refused(path, None, "has a header that does not start with `{` (a JSON object)")
    found = _json(path, text, "header")
    if not isinstance(found, dict):
        raise _refused(path, None, f"has a header that is JSON {type(found).__name__}, not "
                                   "an object")
    start = 8 + length
    buffer = size - start
    metadata = found.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise _refused(path, "__metadata__", "is not an object of strings")
    tensors = {}
    for name, info in found.items():
        tensors[name] = _tensor(path, name, info, start, buffer)
    _tiled(path, tensors, start, buffer)
    return Header(path, size, tensors, metadata)


def _tensor(path: str, name: str, info, start: int, buffer: int) -> Tensor:
    """One header entry, checked on its own."""
    if not isinstance(info, dict):
        raise _refused(path, name, f"is JSON {type(info).__name__}, not an object with "
                                   "`dtype`, `shape` and `data_offsets`")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise _refused(path, name, f"lacks `{'`, `'.join(missing)}`")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _refused(path, name, f"has the dtype `{_render.safe(str(dtype)[:40])}`; "
                                   f"expected one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            _int(d) and d >= 0 for d in shape):
        shown = _render.safe(json.dumps(shape)[:80])
        raise _refused(path, name, f"has the shape {shown}; expected a list of at most "
                                   f"{MAX_RANK} non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(
            _int(o) for o in offsets):
        shown = _render.safe(json.dumps(offsets)[:80])
        raise _refused(path, name, f"has the data_offsets {shown}; expected [begin, end], "
                                   "two integers")
    begin, end = offsets
    if not 0 <= begin <= end <= buffer:
        raise _refused(path, name, f"has the data_offsets [{begin:,}, {end:,}], outside the "
                                   f"data buffer of {buffer:,} bytes (begin <= end expected)")
    bits = DTYPES[dtype][0]
    limit = buffer * 8 // bits  # more elements than that cannot fit: stop multiplying
    elements = 1
    for dim in shape:
        elements *= dim
        if elements > limit:
            elements = -1
            break
    what = f"is {dtype} of shape {_render.shape(tuple(shape))}"
    if elements < 0:
        raise _refused(path, name, f"{what}: more elements than the data buffer's {buffer:,} "
                                   "bytes hold")
    if elements * bits != (end - begin) * 8:
        claimed = (f"{elements * bits // 8:,}" if elements * bits % 8 == 0 else
                   f"{elements * bits / 8:,}")
        raise _refused(path, name, f"{what}: {claimed} bytes, but its data_offsets span "
                                   f"{end - begin:,} bytes")
    return Tensor(name, dtype, tuple(shape), start + begin, start + end, path)


def _tiled(path: str, tensors: dict, start: int, buffer: int) -> None:
    """The entries, sorted by offset, cover the buffer exactly: no overlap, gap or tail."""
    at, previous = 0, None
    for tensor in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        begin = tensor.begin - start
        if begin < at:
            raise _refused(path, tensor.name, f"overlaps `{_render.safe(previous)}`: its data "
                                              f"starts at byte {begin:,}, before byte {at:,} "
                                              "where the other's ends")
        if begin > at:
            raise _refused(path, tensor.name, f"starts at byte {begin:,} of the data buffer, "
                                              f"leaving bytes {at:,}..{begin:,} to no tensor "
                                              "(the format has no gaps)")
        at, previous = tensor.end - start, tensor.name
    if at != buffer:
        raise _refused(path, None, f"has {buffer - at:,} bytes after its last tensor's data "
                                   f"(the buffer holds {buffer:,} bytes; its tensors cover "
                                   f"{at:,})")


def _index(path: str) -> tuple[list[str], dict, dict]:
    """(shard paths in first-named order, {name: shard path}, metadata) of a shard index."""
    problem = _bundle.regular_file_problem(path, _MAX_INDEX)
    if problem is not None:
        raise _refused(path, None, f"cannot be read: {problem}")
    try:
        with open(path, "rb") as handle:
            text = handle.read(_MAX_INDEX + 1)
    except OSError as err:
        raise _refused(path, None, f"cannot be read ({_render.first_line(err)})") from err
    if len(text) > _MAX_INDEX:
        raise _refused(path, None, f"is larger than {_MAX_INDEX:,} bytes")
    found = _json(path, text, "shard index")
    weight_map = found.get("weight_map") if isinstance(found, dict) else None
    if not isinstance(weight_map, dict):
        raise _refused(path, None, "has no `weight_map` object (tensor name -> shard file)")
    metadata = found.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    folder = os.path.dirname(path)
    shards: dict = {}
    where: dict = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or \
                shard != os.path.basename(shard) or "\\" in shard or "\0" in shard or \
                shard.startswith("."):
            raise _refused(path, name, f"names the shard `{_render.safe(str(shard)[:200])}`; "
                                       "expected a file name beside the index (`*.safetensors`)")
        full = shards.setdefault(shard, os.path.join(folder, shard))
        where[name] = full
    if not shards or len(shards) > _MAX_SHARDS:
        raise _refused(path, None, f"names {len(shards):,} shard files")
    return list(shards.values()), where, metadata


# `__metadata__` items every writer puts there (`format`: the framework whose names the
# file uses): no news to the user, not shown as notes.
_ROUTINE = {("format", value) for value in ("pt", "tf", "flax", "np", "mlx", "jax")}


def _metadata_notes(metadata: dict, what: str) -> tuple:
    metadata = {k: v for k, v in metadata.items() if (k, v) not in _ROUTINE}
    notes = [f"{what} `{_render.safe(str(k)[:80])}` = `{_render.safe(str(v)[:200])}`"
             for k, v in list(metadata.items())[:_MAX_NOTES]]
    if len(metadata) > _MAX_NOTES:
        notes.append(f"{what}: {len(metadata) - _MAX_NOTES:,} more items not shown")
    return tuple(notes)


def _named(path: str) -> str | None:
    """The file to read for `path` (a file, an index, or a folder holding either), or None
    when `path` is no safetensors file."""
    if "://" in path:
        return None
    if os.path.isdir(path):
        for name in (INDEX_NAME, SINGLE_NAME):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        return None
    if path.endswith((".safetensors", ".safetensors.index.json")) and os.path.lexists(path):
        return path  # a FIFO or device by this name too: `read_header` says what it is
    if _bundle.regular_file_problem(path) is not None:
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    if len(head) == 9 and head[8:9] == b"{":
        (length,) = struct.unpack("<Q", head[:8])
        if length <= min(MAX_HEADER, size - 8):
            return path
    return None


def recognise(path: str) -> bool:
    """Whether `path` is a safetensors file, shard index or a folder holding one (names, or
    8 bytes of a plausible header length then `{`); never raises."""
    try:
        return _named(path) is not None
    except (OSError, ValueError):
        return False


def read_model(path: str) -> Model | None:
    """The safetensors model at `path` (a file, an index, or a folder holding either), every
    header checked; None when `path` is none.

    Raises:
      CheckpointCorruptError: a header, the index, or their agreement is wrong.
    """
    named = _named(os.fspath(path))
    if named is None:
        return None
    if named.endswith(".index.json"):
        shards, where, metadata = _index(named)
        headers = []
        tensors: dict = {}
        for shard in shards:
            header = read_header(shard)
            headers.append(header)
            for name, tensor in header.tensors.items():
                if name in tensors:
                    raise _refused(named, name, f"is in two shards: `{_render.safe(shard)}` "
                                                f"and `{_render.safe(tensors[name].file)}`")
                if where.get(name) != shard:
                    raise _refused(named, name, f"is in the shard `{_render.safe(shard)}`, "
                                                "but the index does not map it there")
                tensors[name] = tensor
        for name, shard in where.items():
            if name not in tensors:
                raise _refused(named, name, f"is mapped to the shard `{_render.safe(shard)}`, "
                                            "which does not hold it")
        tensors = {name: tensors[name] for name in where}  # the index's order
        return Model(named, f"safetensors index `{named}` ({len(shards)} shard "
                            f"file{'s' * (len(shards) != 1)})", tuple(headers), tensors,
                     _metadata_notes(metadata, "index metadata"))
    header = read_header(named)
    return Model(named, f"safetensors file `{named}`", (header,), dict(header.tensors),
                 _metadata_notes(header.metadata, "metadata"))


def _numpy(dtype: str):
    """The NumPy dtype of a safetensors dtype that NumPy (or ml_dtypes) reads per element,
    or None (the 4- and 6-bit floats; an ml_dtypes too old to know it)."""
    import numpy as np

    name = DTYPES[dtype][1]
    if name in _ML_DTYPES:
        import ml_dtypes

        found = getattr(ml_dtypes, name, None)
        return None if found is None else np.dtype(found)
    return np.dtype(name) if name else None


def read_array(model: Model, name: str):
    """One tensor's values as a read-only NumPy array over the file's memory map (no copy):
    of its dtype's NumPy or ml_dtypes type in its shape, or its raw bytes (uint8, flat) where
    neither has the type. TF-free.

    Raises:
      CheckpointCorruptError: the file changed since its header was read.
    """
    tensor = model.tensors[name]
    as_dtype = _numpy(tensor.dtype)
    with _Mapped(model) as mapped:
        if as_dtype is None:
            return mapped.view(tensor, "u1", flat=True)
        if tensor.dtype == "BOOL":  # any byte but 0 is True, as `source_fields` reads it
            return mapped.view(tensor, "u1") != 0
        return mapped.view(tensor, as_dtype)


class _Mapped:
    """The files of a model mapped for reading (each once, its size checked against the one
    its header was read at); closed on exit."""

    def __init__(self, model: Model):
        self.sizes = {h.path: h.size for h in model.headers}
        self.maps: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.maps.clear()  # views that outlive this keep their map alive (NumPy holds it)

    def view(self, tensor: Tensor, as_dtype, *, flat: bool = False):
        """A read-only NumPy view of `tensor`'s bytes as `as_dtype`, in its shape (`flat`:
        one dimension)."""
        import numpy as np

        shape = (tensor.nbytes // np.dtype(as_dtype).itemsize,) if flat else tensor.shape
        if tensor.nbytes == 0:
            return np.zeros(shape, as_dtype)
        buffer = self.maps.get(tensor.file)
        if buffer is None:
            buffer = self.maps[tensor.file] = self._map(tensor.file)
        count = tensor.nbytes // np.dtype(as_dtype).itemsize
        return np.frombuffer(buffer, as_dtype, count, tensor.begin).reshape(shape)

    def _map(self, path: str):
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size != self.sizes[path]:
                    raise _refused(path, None, f"changed since its header was read ({size:,} "
                                               f"bytes, {self.sizes[path]:,} before)")
                return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as err:
            if isinstance(err, errors.ObjckptError):
                raise
            raise _refused(path, None, f"cannot be read ({_render.first_line(err)})") from err


class _Reader:
    """The files of a model open for reading (each once, its size checked against the one
    its header was read at): `tensor(t)` reads one tensor with `pread` into a new TF tensor
    (one copy, from the page cache into TF's buffer; no file held mapped). Closed on exit."""

    def __init__(self, model: Model):
        self.sizes = {h.path: h.size for h in model.headers}
        self.fds: dict = {}
        self._lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        with self._lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()

    def fd(self, path: str) -> int:
        with self._lock:
            found = self.fds.get(path)
            if found is not None:
                return found
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as err:
                raise _refused(path, None, f"cannot be read ({_render.first_line(err)})") \
                    from err
            size = os.fstat(fd).st_size
            if size != self.sizes[path]:
                os.close(fd)
                raise _refused(path, None, f"changed since its header was read ({size:,} "
                                           f"bytes, {self.sizes[path]:,} before)")
            self.fds[path] = fd
            return fd

    def tensor(self, tensor: Tensor):
        """`tensor`'s values as a new CPU TF tensor of its dtype and shape, every bit as
        written (bfloat16 and float8 bit-cast; a BOOL byte other than 0 read as True)."""
        import numpy as np
        import tensorflow as tf

        dtype = tf.as_dtype(DTYPES[tensor.dtype][2])
        fd = self.fd(tensor.file)
        with tf.device("/cpu:0"):
            if tensor.nbytes == 0:  # float8 has no zeros kernel: from NumPy
                return tf.constant(np.zeros(tensor.shape, dtype.as_numpy_dtype))
            if tensor.dtype == "BOOL":
                data = os.pread(fd, tensor.nbytes, tensor.begin)
                self._whole(tensor, len(data))
                return tf.constant(np.frombuffer(data, np.uint8).reshape(tensor.shape) != 0)
            from objckpt._bundle import fastio as _fastio

            if tensor.dtype in _DIRECT:  # read in its own dtype and shape
                value = _fastio.read_direct(fd, tensor.begin, tensor.nbytes, dtype,
                                            tensor.shape)
                self._whole(tensor, 0 if value is None else tensor.nbytes)
                return value
            raw = _fastio.read_direct(fd, tensor.begin, tensor.nbytes, tf.uint8,
                                      (tensor.nbytes,))
            self._whole(tensor, 0 if raw is None else tensor.nbytes)
            if tensor.dtype in _FLOAT8:  # TF's Bitcast has no float8: NumPy's view, one copy
                from objckpt import _compat

                return tf.constant(raw.numpy().view(_compat.numpy_dtype(dtype))
                                   .reshape(tensor.shape))
            width = DTYPES[tensor.dtype][0] // 8
            if width > 1:  # Bitcast and Reshape share the buffer: no copy
                raw = tf.reshape(raw, (tensor.elements, width))
            if dtype != tf.uint8:
                raw = tf.bitcast(raw, dtype)
            return tf.reshape(raw, tensor.shape)

    @staticmethod
    def _whole(tensor: Tensor, got: int) -> None:
        if got != tensor.nbytes:
            raise _refused(tensor.file, tensor.name, f"was cut short while it was read "
                                                     f"({got:,} of {tensor.nbytes:,} bytes)")


def _output_spec(tensor: Tensor, transform):
    """(shape, TF dtype, apply) of `tensor` after `transform` (None: none), known from
    metadata alone: a `rules` Transform's `output_shape`, else the transform traced on a
    `tf.TensorSpec` (then `apply` runs that traced function, so the value has the traced
    shape); None where neither gives a fully known shape (the caller reads values whole)."""
    import tensorflow as tf

    dtype = tf.as_dtype(DTYPES[tensor.dtype][2])
    if transform is None:
        return tensor.shape, dtype, None
    output_shape = getattr(transform, "output_shape", None)
    if callable(output_shape):
        try:
            return tuple(output_shape(tensor.shape)), dtype, transform
        except Exception:  # noqa: BLE001 - not one of ours, or a shape it refuses: trace it
            pass
    try:
        traced = tf.function(transform, autograph=False).get_concrete_function(
            tf.TensorSpec(tensor.shape, dtype))
    except Exception:  # noqa: BLE001 - a transform that needs values (NumPy): read whole
        return None
    out = traced.structured_outputs
    if not isinstance(out, tf.Tensor) or not out.shape.is_fully_defined():
        return None
    return tuple(out.shape.as_list()), out.dtype, traced


# Bytes of new tensors in flight at once while streaming: what the largest entry holds
# while it is read, transformed and cast (`_held`), or this many where that is less
# (several small tensors read in parallel).
STREAM_SLACK = 64 << 20


def _held(tensor: Tensor, variable, spec) -> int:
    """Bytes of new tensors one entry holds at most while it is streamed: its bytes as read,
    its transform's output beside them, and the cast of that output to the variable's dtype
    (each only where there is one)."""
    shape, dtype, apply = spec
    elements = 1
    for dim in shape:
        elements *= int(dim)
    held = tensor.nbytes
    if apply is not None:
        held += elements * dtype.size
    wanted = variable.dtype.base_dtype
    if wanted != dtype:
        held += elements * wanted.size
    return held
# Read straight into a tensor of their own dtype (NumPy reads them through DLPack); the
# others into bytes, bit-cast.
_DIRECT = frozenset({"F32", "F64", "I32", "U8", "I64", "F16"})
# Read as bytes and viewed by NumPy as TF's type: TF's Bitcast has no float8 kernel.
_FLOAT8 = frozenset({"F8_E4M3", "F8_E5M2"})


class _Streamer:
    """Restores `(tensor, variable, label, transform)` entries one tensor at a time, all or
    nothing: `verify()` checks every entry's shape and dtype after its transform from
    metadata (the header was validated when the model was read; safetensors has no
    checksums) and that no file changed, assigning nothing; `assign()` then reads each
    tensor (`_Reader.tensor`), transforms it, passes it through `convert(value, variable)`
    (the one place a value is converted just before assignment) and assigns it with
    `assign_to(variable, value)`, on several threads, new tensors in flight bounded by what
    the largest entry holds as it is read, transformed and cast (`_held`; or
    `STREAM_SLACK` bytes, where that is more). `specs` is None when
    some transform's output is not known from metadata (then the caller reads values
    whole)."""

    def __init__(self, model: Model, entries: list, assign_to, convert=None):
        from objckpt._bundle import fastio as _fastio

        self.model, self.entries = model, entries
        self._assign_to = assign_to
        self._convert = convert if convert is not None else (lambda value, variable: value)
        self._fastio = _fastio
        self.reader = _Reader(model)
        found = [_output_spec(t, transform) for t, _, _, transform in entries]
        self.specs = None if any(f is None for f in found) else found
        self._sizes = [t.nbytes for t, _, _, _ in entries]
        self._held = (self._sizes if self.specs is None else
                      [_held(t, v, spec) for (t, v, _, _), spec in zip(entries, self.specs)])
        limit = max(max(self._held, default=0), STREAM_SLACK)
        self._gate = _fastio.Budget(limit)

    def close(self) -> None:
        self.reader.close()

    def verify(self) -> None:
        """Every entry's output shape and dtype checked against its variable, and every
        file opened and its size checked; nothing read, nothing assigned.

        Raises:
          StructureMismatchError: a transform's output does not fit its variable.
          CheckpointCorruptError: an entry disagrees with the plan, or a file changed.
        """
        from objckpt import _compat

        problems, corrupt = [], []
        for (tensor, variable, label, transform), spec in zip(self.entries, self.specs):
            if not _compat.misfit(spec[:2], variable):
                continue
            got = (f"{spec[1].name}{tuple(spec[0])} but the obj has "
                   f"{variable.dtype.base_dtype.name}{tuple(variable.shape)}")
            name = _render.safe(tensor.name)
            if transform is not None:
                problems.append(f"{label}: the transform of `{name}` gives {got}")
            else:
                corrupt.append(f"{label}: `{name}` is {got}")
        if corrupt:
            raise errors.CheckpointCorruptError(
                f"{self.model.description}: {len(corrupt)} entry(ies) do not have the shape "
                "or dtype the plan was made for; nothing was changed:\n"
                + "\n".join(_render.listed(corrupt))
                + "\nFix: restore from another file, or write this one again.",
                source=self.model.path)
        if problems:
            raise errors.StructureMismatchError(
                f"{len(problems)} transformed value(s) from {self.model.description} do not "
                "fit; nothing was changed or written:\n" + "\n".join(_render.listed(problems))
                + "\nFix: make the rule's transform return the variable's shape and dtype.",
                tuple(problems))
        for header in self.model.headers:
            self.reader.fd(header.path)

    def _assign_one(self, index: int) -> None:
        tensor, variable, _, _ = self.entries[index]
        apply = self.specs[index][2]
        with self._gate.hold(self._held[index]):
            value = self.reader.tensor(tensor)
            if apply is not None:
                value = apply(value)
            value = self._convert(value, variable)
            self._assign_to(variable, value)
            del value

    def assign(self) -> None:
        """Reads, transforms and assigns every entry (after `verify`)."""
        workers = self._fastio.threads()
        groups = self._fastio.thread_groups(self._sizes, workers)
        self._fastio.run_all(lambda group: [self._assign_one(i) for i in group], groups,
                             workers)


def source_fields(path: str) -> dict | None:
    """A safetensors file, index or folder as the fields of a `_sources.Source`, or None.

    Keys are the tensor names as saved (`model.layers.0.self_attn.q_proj.weight`, or an
    obj's own object paths such as `dense/kernel`). Tensors of a dtype TF has no type for
    are not offered (a note names them).

    Raises:
      CheckpointCorruptError: the header or index is damaged or hostile.
    """
    model = read_model(path)
    if model is None:
        return None
    import tensorflow as tf  # only here: the sources' specs and values are TF's

    usable = {name: t for name, t in model.tensors.items() if _in_tf(DTYPES[t.dtype][2])}
    specs = {name: (t.shape, tf.as_dtype(DTYPES[t.dtype][2])) for name, t in usable.items()}
    left = [name for name in model.tensors if name not in usable]
    notes = model.notes
    if left:
        kinds = sorted({model.tensors[name].dtype for name in left})
        notes += (f"{len(left):,} tensors of dtype {', '.join(kinds)} are not offered to a "
                  f"restore (TF has no such dtype), e.g. `{_render.safe(left[0])}`",)

    def fetch(keys) -> list:
        with _Reader(model) as reader:
            return [reader.tensor(usable[key]) for key in keys]

    def stream(pairs, assign_to, convert=None):
        return _Streamer(model, [(usable[key], *rest) for key, *rest in pairs], assign_to,
                         convert)

    top = list(dict.fromkeys(k.split("/", 1)[0] for k in specs if "/" in k))
    return {"description": model.description, "kind": "object", "specs": specs,
            "fetch": fetch, "stream": stream,
            "subtree": lambda at: _paths.prefix_subtree(specs, at),
            "top_level_names": top, "prefix": model.path, "notes": notes,
            "structure": lambda: ("safetensors", tuple(
                (name, t.shape, t.dtype) for name, t in model.tensors.items()))}


def _in_tf(name: str) -> bool:
    """Whether this TF has the dtype `name` ("" never): float8_e4m3fn and float8_e5m2 from
    TF 2.12 on, through `tf.as_dtype` (no `tf.float8_*` attribute names them)."""
    import tensorflow as tf

    try:
        return bool(name) and tf.as_dtype(name).name == name
    except TypeError:
        return False


def _compared(model: Model, name: str):
    """`read_array`, a bfloat16 tensor widened to float32 (as a TF checkpoint's is read), so
    `diff` compares both alike."""
    values = read_array(model, name)
    if model.tensors[name].dtype == "BF16":
        import numpy as np

        return (values.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return values


def listing(path: str) -> dict | None:
    """The file's tensors as variables for `_meta.read` (TF-free), or None.

    Each variable is (name, name, shape, dtype, name, ""): the dtype a TF DataType enum, or
    for a dtype TF lacks a (0, ml_dtypes name, bytes per element) triple. `read(name)` gives
    a tensor's values (`read_array`), for `diff`.
    """
    model = read_model(path)
    if model is None:
        return None
    return {"prefix": model.path, "notes": model.notes, "index": None, "graph": None,
            "description": model.description, "read": lambda name: _compared(model, name),
            "variables": [(name, name, t.shape, _listed_dtype(t.dtype), name, "")
                          for name, t in model.tensors.items()]}


def _listed_dtype(dtype: str):
    bits, numpy_name, _, enum = DTYPES[dtype]
    if enum:
        return enum
    return (0, numpy_name or dtype.lower(), bits / 8)


def check(path: str) -> tuple | None:
    """Reads every tensor's bytes once (for `objckpt.verify`).

    Returns None when `path` is no safetensors file, else (tensors read, bytes read,
    [(file, entry, problem)], notes); a header that cannot be read is one problem.
    """
    try:
        model = read_model(path)
    except errors.CheckpointCorruptError as err:
        return 0, 0, [(path, "", _render.first_line(err))], ()
    if model is None:
        return None
    count, nbytes, problems = 0, 0, []
    for header in model.headers:
        tensors = sorted(header.tensors.values(), key=lambda t: t.begin)
        try:
            with open(header.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size != header.size:
                    problems.append((header.path, "", "changed since its header was read"))
                    continue
                for tensor in tensors:
                    handle.seek(tensor.begin)
                    left = tensor.nbytes
                    while left:
                        got = len(handle.read(min(left, _CHUNK)))
                        if not got:
                            break
                        left -= got
                    if left:
                        problems.append((header.path, tensor.name, f"ends {left:,} bytes "
                                         "before the end of its data"))
                        continue
                    count += 1
                    nbytes += tensor.nbytes
        except OSError as err:
            problems.append((header.path, "", f"cannot be read ({_render.first_line(err)})"))
    return count, nbytes, problems, (model.description, *model.notes)
