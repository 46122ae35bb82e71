"""TF's checkpoint index, read and validated in pure Python before TF's C++ reader sees it.

A checkpoint prefix is `prefix.index` (a LevelDB-style table: prefix-compressed data blocks,
an index block of block handles, a 48-byte footer) plus data shards
`prefix.data-NNNNN-of-MMMMM`. The entry under the empty key is a `BundleHeaderProto`; every
other entry maps a tensor name to a `BundleEntryProto` (dtype, shape, shard, offset, size).

TF's reader trusts these files: a shape with a negative dimension, an entry that does not
parse, or an object graph entry of shape (2^32+1,) abort or crash the process. So every file
is checked here first, TF-free (no `import tensorflow`): the footer and block handles lie in
the file, blocks parse, keys are UTF-8 and strictly increasing, entry protos parse (strictly:
nothing TF's parser would refuse is accepted), dtypes are ones TF saves, shapes are
non-negative with element counts that fit, every entry's bytes lie within its data shard and
match its shape, the object graph entry is a scalar string, and the header declares
little-endian data (objckpt's readers take bytes as TF writes them on every common platform;
TF would byte-swap a big-endian bundle). `graph_problems` does the same for a parsed object
graph (node ids in range, no duplicate child names, checkpoint keys present and unique, slot
references valid, object paths of a bounded total length): `check_graph` raises the first,
as every reader does, and `objckpt.verify` lists them all in the same words.

Anything wrong raises `CheckpointCorruptError` naming the file, the entry and the problem.
Block checksums are not recomputed here: TF verifies them when it reads a block, and a block
that fails raises an error, not a crash.
"""

from __future__ import annotations

import bisect
import itertools
import os
import stat
import struct

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import remote as _remote

__all__ = ["OBJECT_GRAPH_KEY", "Entry", "Index", "WireError", "check_graph", "corrupt",
           "dtype_size", "expect_wire", "fields", "graph_problems", "int32", "open_file",
           "path_chars",
           "read_index", "regular_file_problem", "saved_under", "shard_name", "singular",
           "slice_key", "stat_problem", "varint"]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48
_TRAILER = 5  # compression type byte + masked crc32c
_MAX_DIMS = 254  # TensorShape::MaxDimensions()
_MAX_ELEMENTS = (1 << 62) - 1
_MAX_SHARDS = 1 << 20
_MAX_INDEX_BYTES = 1 << 31

# DataType enum values TF writes into checkpoints -> bytes per element (0: variable length).
_DTYPE_SIZES = {
    1: 4,  # float32
    2: 8,  # float64
    3: 4,  # int32
    4: 1,  # uint8
    5: 2,  # int16
    6: 1,  # int8
    7: 0,  # string
    8: 8,  # complex64
    9: 8,  # int64
    10: 1,  # bool
    11: 1,  # qint8
    12: 1,  # quint8
    13: 4,  # qint32
    14: 2,  # bfloat16
    15: 2,  # qint16
    16: 2,  # quint16
    17: 2,  # uint16
    18: 16,  # complex128
    19: 2,  # float16
    21: 0,  # variant
    22: 4,  # uint32
    23: 8,  # uint64
    24: 1,  # float8_e5m2
    25: 1,  # float8_e4m3fn
}
_STRING = 7
_VARIANT = 21


class _Bad(Exception):
    """A parse problem; turned into CheckpointCorruptError with the file and entry."""


class Entry:
    """One tensor of the index: dtype enum, shape, shard, byte range, slices, and the masked
    crc32c of its bytes (`crc32c`, as TF writes it)."""

    __slots__ = ("crc32c", "dtype", "offset", "shape", "shard", "size", "slices")

    def __init__(self, dtype: int, shape: tuple, shard: int, offset: int, size: int,
                 slices: tuple, crc32c: int = 0):
        self.dtype, self.shape, self.shard = dtype, shape, shard
        self.offset, self.size, self.slices = offset, size, slices
        self.crc32c = crc32c

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    def __repr__(self) -> str:
        return f"Entry(dtype={self.dtype}, shape={self.shape}, shard={self.shard})"


class Index:
    """A validated index: `entries` (name -> Entry, in key order), `num_shards`, `beyond`
    (name -> problem: entries past the end of a truncated data shard), and `sliced`
    ((tensor name, extents) -> Entry: the stored slices of partitioned tensors, each an
    entry of its own under a binary key, the extents as its tensor's `Entry.slices` lists
    them)."""

    __slots__ = ("beyond", "entries", "num_shards", "prefix", "sliced")

    def __init__(self, prefix: str, num_shards: int, entries: dict, beyond: dict,
                 sliced: dict | None = None):
        self.prefix, self.num_shards, self.entries = prefix, num_shards, entries
        self.beyond = beyond
        self.sliced = {} if sliced is None else sliced


# --- files -----------------------------------------------------------------------------

def _read_file(path: str, limit: int) -> bytes:
    """All bytes of a regular file (no FIFO, device or socket), at most `limit` of them.

    The size is checked first: nothing is allocated for a file larger than `limit`.
    """
    size = _file_size(path)
    if size > limit:
        raise _Bad(f"it is {size} bytes, larger than {limit}")
    with _open(path) as f:
        data = f.read(size)
    if len(data) != size:
        raise _Bad(f"it changed while it was read ({len(data)} of {size} bytes)")
    return data


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def regular_file_problem(path: str, limit: int | None = None) -> str | None:
    """Why `path` is not a regular file (of at most `limit` bytes) that is safe to open, or
    None. Nothing is opened.

    Every file of a checkpoint directory is untrusted: a FIFO would block `open` forever and
    a device (say a symbolic link to `/dev/zero`) would be read until memory runs out. This
    looks with `os.stat` (which follows symbolic links); call it before anything (TF's C++
    reader included) opens a file of a checkpoint.

    Returns:
      None, or one clause naming the file and what it is, for error messages, e.g.
      "`/run/ckpt-3.index` is a FIFO (named pipe), not a regular file".
    """
    try:
        info = os.stat(path)  # follows symlinks: a link to /dev/zero is a device
    except (FileNotFoundError, NotADirectoryError):
        return f"`{_render.safe(path)}` does not exist"
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        return f"`{_render.safe(path)}` cannot be examined ({_render.first_line(err)})"
    return stat_problem(path, info, limit)


def stat_problem(path: str, info: os.stat_result, limit: int | None) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
        shown = f"`{_render.safe(path)}`"
        if os.path.islink(path):
            shown += f" (a symbolic link to `{_render.safe(os.path.realpath(path))}`)"
        return f"{shown} is {kind}, not a regular file"
    if limit is not None and info.st_size > limit:
        return (f"`{_render.safe(path)}` is {info.st_size:,} bytes, more than the "
                f"{limit:,} such a file can sensibly be")
    return None


def _require_regular(path: str) -> int:
    """The size of a regular file; anything else (FIFO, device, directory) is refused."""
    try:
        info = os.stat(path)  # follows symlinks: a link to /dev/zero is a device
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:
        raise _Bad(f"it cannot be read: {err}") from err
    problem = stat_problem(path, info, None)
    if problem is not None:
        raise _Bad(f"{problem}; refused without opening it")
    return info.st_size


def _file_size(path: str) -> int:
    """The size of a file to read: a regular local file, or an object in remote storage
    (`gs://`, `s3://`: no special files there; `_remote`)."""
    if _remote.is_remote(path):
        return _remote.size(path)
    return _require_regular(path)


def _open(path: str):
    """A binary reader of a file `_file_size` accepted."""
    if _remote.is_remote(path):
        return _remote.open_read(path)
    return open(path, "rb")  # the caller closes it


def shard_name(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


# --- protobuf wire format (strict) -------------------------------------------------------

def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise _Bad("a varint runs past the end of its field")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >= 1 << 64:
                raise _Bad("a varint is larger than 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Bad("a varint is longer than 10 bytes")


def _fields(buf, pos: int, end: int):
    """(field number, wire type, value) of one message; value is an int or (start, stop)."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0 or number >= 1 << 29:
            raise _Bad(f"field number {number} is invalid")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise _Bad("a length-delimited field runs past the end of its message")
            value, pos = (pos, pos + length), pos + length
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if width > end - pos:
                raise _Bad("a fixed-width field runs past the end of its message")
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        else:
            raise _Bad(f"wire type {wire} (groups or invalid) in field {number}")
        yield number, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _singular(seen: set, number: int, what: str) -> None:
    if number in seen:
        raise _Bad(f"{what} field {number} appears twice")
    seen.add(number)


def _expect(wire: int, want: int, what: str, number: int) -> None:
    if wire != want:
        raise _Bad(f"{what} field {number} has wire type {wire}, expected {want}")


def _parse_shape(buf, start: int, end: int) -> tuple:
    dims, seen = [], set()
    for number, wire, value in _fields(buf, start, end):
        if number == 2:  # repeated Dim
            _expect(wire, 2, "TensorShapeProto", number)
            size, dim_seen = 0, set()
            for n, w, v in _fields(buf, *value):
                if n == 1:
                    _expect(w, 0, "Dim", n)
                    _singular(dim_seen, n, "Dim")
                    size = _int64(v)
                elif n == 2:
                    _expect(w, 2, "Dim", n)
                    _singular(dim_seen, n, "Dim")
                    try:
                        bytes(buf[v[0]:v[1]]).decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise _Bad("a dimension name is not UTF-8") from err
            if size < 0:
                raise _Bad(f"dimension {len(dims)} has size {size} (< 0)")
            dims.append(size)
        elif number == 3:  # unknown_rank
            _expect(wire, 0, "TensorShapeProto", number)
            _singular(seen, number, "TensorShapeProto")
            if value:
                raise _Bad("its shape has unknown rank")
    return _checked_shape(dims)


def _checked_shape(dims) -> tuple:
    """Dimension sizes (each >= 0 already) as TF's TensorShape accepts them: at most 254
    dimensions and 2^62 elements (TF aborts the process on more)."""
    if len(dims) > _MAX_DIMS:
        raise _Bad(f"its shape has {len(dims)} dimensions (at most {_MAX_DIMS})")
    count = 1
    for dim in dims:
        count *= dim
        if count > _MAX_ELEMENTS:
            raise _Bad(f"its shape {tuple(dims)} has more than 2^62 elements")
    return tuple(dims)


def _parse_slice(buf, start: int, end: int) -> tuple:
    extents = []
    for number, wire, value in _fields(buf, start, end):
        if number != 1:
            continue
        _expect(wire, 2, "TensorSliceProto", number)
        first, length, seen = 0, -1, set()
        for n, w, v in _fields(buf, *value):
            if n in (1, 2):
                _expect(w, 0, "Extent", n)
                _singular(seen, n, "Extent")
                if n == 1:
                    first = _int64(v)
                else:
                    length = _int64(v)
                    if length < 0:
                        raise _Bad(f"a slice has length {length} (< 0)")
        if first < 0:
            raise _Bad(f"a slice starts at {first} (< 0)")
        extents.append((first, length))
    return tuple(extents)


def _parse_entry(buf, start: int, end: int) -> Entry:
    """A BundleEntryProto; the common encoding (one-byte tags of the known fields, dims with
    only a size) is read inline, anything else by the general strict parser."""
    ints: dict = {}  # field number -> raw varint of dtype, shard_id, offset, size
    seen = 0
    shape = ()
    pos = start
    while pos < end:
        tag = buf[pos]
        if tag == 0x35:  # crc32c, fixed32
            if seen & 64 or pos + 5 > end:
                return _parse_entry_general(buf, start, end)
            seen |= 64
            ints[6] = int.from_bytes(buf[pos + 1:pos + 5], "little")
            pos += 5
            continue
        if tag == 0x12:  # shape
            if seen & 4:
                return _parse_entry_general(buf, start, end)
            seen |= 4
            length, pos = _varint(buf, pos + 1, end)
            stop = pos + length
            if stop > end:
                raise _Bad("a length-delimited field runs past the end of its message")
            dims = []
            while pos < stop:
                # A Dim with only its size: 0x12 <len> 0x08 <varint>, len == 1 + varint bytes.
                if buf[pos] != 0x12 or pos + 3 > stop or buf[pos + 2] != 0x08:
                    return _parse_entry_general(buf, start, end)
                dim_stop = pos + 2 + buf[pos + 1]
                if buf[pos + 1] >= 0x80 or dim_stop > stop:
                    return _parse_entry_general(buf, start, end)
                pos += 3
                if pos + 1 == dim_stop and buf[pos] < 0x80:
                    value = buf[pos]
                    pos += 1
                else:
                    value, pos = _varint(buf, pos, dim_stop)
                if pos != dim_stop or value >= 1 << 63:
                    return _parse_entry_general(buf, start, end)
                dims.append(value)
            shape = _checked_shape(dims)
            continue
        number = _VARINT_TAGS.get(tag)
        if number is None or number in ints:
            return _parse_entry_general(buf, start, end)
        pos += 1
        if pos < end and buf[pos] < 0x80:
            ints[number] = buf[pos]
            pos += 1
        else:
            ints[number], pos = _varint(buf, pos, end)
    return _entry(ints, shape, ())


# One-byte tags of BundleEntryProto's varint fields (dtype, shard_id, offset, size) -> field.
_VARINT_TAGS = {0x08: 1, 0x18: 3, 0x20: 4, 0x28: 5}


def _entry(ints: dict, shape: tuple, slices: tuple) -> Entry:
    """An Entry from the raw varints of fields 1, 3, 4, 5 and the fixed32 of field 6
    (proto3: absent is 0)."""
    return Entry(_int32(ints.get(1, 0)), shape, _int32(ints.get(3, 0)),
                 _int64(ints.get(4, 0)), _int64(ints.get(5, 0)), slices, ints.get(6, 0))


def _parse_entry_general(buf, start: int, end: int) -> Entry:
    ints: dict = {}
    shape, slices, seen = (), [], set()
    for number, wire, value in _fields(buf, start, end):
        if number == 7:
            _expect(wire, 2, "BundleEntryProto", number)
            slices.append(_parse_slice(buf, *value))
            continue
        if number == 6:
            _expect(wire, 5, "BundleEntryProto", number)
            _singular(seen, number, "BundleEntryProto")
            ints[number] = value
            continue
        if number == 2:
            _expect(wire, 2, "BundleEntryProto", number)
            _singular(seen, number, "BundleEntryProto")
            shape = _parse_shape(buf, *value)
        elif number in (1, 3, 4, 5):
            _expect(wire, 0, "BundleEntryProto", number)
            _singular(seen, number, "BundleEntryProto")
            ints[number] = value
    return _entry(ints, shape, tuple(slices))


def _parse_header(buf, start: int, end: int) -> int:
    """num_shards of a BundleHeaderProto (which TF also parses as a BundleEntryProto)."""
    num_shards, seen = 0, set()  # proto3: an absent field is 0
    for number, wire, value in _fields(buf, start, end):
        if number not in (1, 2, 3):
            raise _Bad(f"the header has an unknown field {number}")
        _singular(seen, number, "BundleHeaderProto")
        if number == 3:
            _expect(wire, 2, "BundleHeaderProto", number)
            for n, w, _ in _fields(buf, *value):
                if n in (1, 2):
                    _expect(w, 0, "VersionDef", n)
                elif n == 3 and w not in (0, 2):
                    raise _Bad("VersionDef field 3 has an invalid wire type")
            continue
        _expect(wire, 0, "BundleHeaderProto", number)
        if number == 1:
            num_shards = _int32(value)
        elif value > 1:
            raise _Bad(f"the header names endianness {value} (0 or 1 expected)")
        elif value == 1:  # TF would read it byte-swapped; objckpt's readers take bytes as
            # they are (little-endian), so its values would mean something else
            raise _Bad("the header says its data is big-endian; objckpt reads the "
                       "little-endian checkpoints TF writes on every common platform")
    if not 1 <= num_shards <= _MAX_SHARDS:
        raise _Bad(f"the header says {num_shards} data shards (1 to {_MAX_SHARDS} expected)")
    return num_shards


# --- the table ---------------------------------------------------------------------------

def _handle(buf, pos: int, end: int) -> tuple[int, int, int]:
    offset, pos = _varint(buf, pos, end)
    size, pos = _varint(buf, pos, end)
    return offset, size, pos


def _block(buf, offset: int, size: int, limit: int, what: str) -> tuple[int, int, int]:
    """(start, end, restart count) of a block's entries, after checking its handle."""
    if offset + size + _TRAILER > limit:
        raise _Bad(f"the {what} block at {offset} (+{size} bytes) lies beyond the table "
                   f"({limit} bytes)")
    if buf[offset + size] != 0:
        raise _Bad(f"the {what} block at {offset} is compressed (type "
                   f"{buf[offset + size]}); TF writes uncompressed index blocks")
    if size < 4:
        raise _Bad(f"the {what} block at {offset} is {size} bytes (at least 4)")
    (restarts,) = struct.unpack_from("<I", buf, offset + size - 4)
    if restarts < 1 or 4 * (restarts + 1) > size:
        raise _Bad(f"the {what} block at {offset} claims {restarts} restart points")
    return offset, offset + size - 4 * (restarts + 1), restarts


def _block_entries(buf, start: int, end: int, restarts: int, what: str):
    """(key bytes, value start, value end) of each entry in a block, keys rebuilt.

    The restart points (where TF's reader seeks) must be entry starts with no shared key
    prefix, the first at 0, increasing.
    """
    points = struct.unpack_from(f"<{restarts}I", buf, end)
    if points[0] != 0 or any(b <= a for a, b in zip(points, points[1:])):
        raise _Bad(f"the {what} block at {start} has restart points out of order")
    points = set(points)
    key = b""
    pos = start
    while pos < end:
        at = pos - start
        if pos + 3 <= end and buf[pos] < 0x80 and buf[pos + 1] < 0x80 and buf[pos + 2] < 0x80:
            shared, unshared, length = buf[pos], buf[pos + 1], buf[pos + 2]
            pos += 3
        else:
            shared, pos = _varint(buf, pos, end)
            unshared, pos = _varint(buf, pos, end)
            length, pos = _varint(buf, pos, end)
        if shared > len(key) or unshared > end - pos or length > end - pos - unshared:
            raise _Bad(f"an entry of the {what} block at {start} runs past the block")
        if at in points:
            if shared:
                raise _Bad(f"the {what} block at {start} has a restart point ({at}) that "
                           "shares a key prefix")
            points.discard(at)
        key = key[:shared] + bytes(buf[pos:pos + unshared])
        pos += unshared
        yield key, pos, pos + length
        pos += length
    if points - {0}:
        raise _Bad(f"the {what} block at {start} has a restart point that is not the start "
                   "of an entry")


def read_index(prefix: str, *, data: bool = True) -> Index:
    """Reads and validates `prefix.index` and the sizes of its data shards.

    Args:
      prefix: the checkpoint prefix.
      data: also refuse entries whose bytes lie beyond the end of their data shard (a
        truncated shard). TF reports those as an error when the tensor is read, so
        `verify` passes False to name each such tensor (`Index.beyond`) instead.

    Raises:
      CheckpointCorruptError: anything in the index or the shards' sizes is wrong,
        or a file is not a regular file.
      FileNotFoundError: the index does not exist.
    """
    path = prefix + ".index"
    try:
        buf = _read_file(path, _MAX_INDEX_BYTES)
        num_shards, entries, slices, sliced = _parse_table(buf)
    except _Bad as err:
        raise _corrupt(path, None, str(err)) from None
    sizes, beyond = {}, {}
    for key, entry in itertools.chain(entries.items(), slices.items()):
        problem = _entry_problem(key, entry, num_shards)
        if problem is None and entry.size:
            if entry.shard not in sizes:
                sizes[entry.shard] = _shard_size(prefix, entry.shard, num_shards)
            if entry.offset + entry.size > sizes[entry.shard]:
                beyond[key] = (f"its bytes {entry.offset}..{entry.offset + entry.size} lie "
                               f"beyond the end of data shard {entry.shard} "
                               f"({sizes[entry.shard]} bytes)")
                if data:
                    problem = beyond[key]
            elif entry.dtype in (_STRING, _VARIANT) and not entry.slices:
                problem = _framing_problem(prefix, entry, num_shards)
        if problem is not None:
            raise _corrupt(path, key, problem)
    for shard in range(num_shards):
        if shard not in sizes:
            sizes[shard] = _shard_size(prefix, shard, num_shards)
    return Index(prefix, num_shards, entries, beyond, sliced)


def _framing_problem(prefix: str, entry: Entry, num_shards: int) -> str | None:
    """Whether the lengths a string or variant tensor declares add up to its size.

    TF writes a string tensor as the varint64 length of each element, a masked crc32c of
    those lengths (4 bytes), then the bytes; a variant tensor as, per element, a varint64
    length, the serialized element and its masked crc32c. TF's reader allocates each element
    by the length it reads: a crafted length of 2^40 whose checksum is right crashes it
    (a segfault, seen with TF 2.21) before any data checksum can fail. Only the lengths are
    read here.
    """
    elements = entry.elements
    name = shard_name(prefix, entry.shard, num_shards)
    with _open(name) as f:
        f.seek(entry.offset)
        if entry.dtype == _STRING:
            head = f.read(min(entry.size, 10 * elements))
            total, pos = 0, 0
            try:
                for _ in range(elements):
                    length, pos = _varint(head, pos, len(head))
                    total += length
            except _Bad:
                return "its string lengths cannot be read from the data shard"
            if pos + 4 + total == entry.size:
                return None
            return (f"its {elements} string(s) declare {total} bytes in an entry of "
                    f"{entry.size} bytes")
        used = 0
        for element in range(elements):
            head = f.read(10)
            try:
                length, pos = _varint(head, 0, len(head))
            except _Bad:
                return f"the length of its element {element} cannot be read from the data shard"
            used += pos + length + 4
            if used > entry.size:
                return (f"its element {element} declares {length} bytes, beyond the entry's "
                        f"{entry.size} bytes")
            f.seek(entry.offset + used)
        if used != entry.size:
            return f"its {elements} elements take {used} bytes of the entry's {entry.size}"
    return None


def _shard_size(prefix: str, shard: int, num_shards: int) -> int:
    name = shard_name(prefix, shard, num_shards)
    try:
        return _file_size(name)
    except FileNotFoundError:
        raise _corrupt(name, None, f"data shard {shard} of {num_shards} is missing") from None
    except _Bad as err:
        raise _corrupt(name, None, str(err)) from None


def _parse_table(buf) -> tuple[int, dict, dict]:
    """(num_shards, {tensor name: Entry}, {shown binary key: Entry} of the slices of
    partitioned tensors) of an index table's bytes."""
    size = len(buf)
    if size < _FOOTER:
        raise _Bad(f"it is {size} bytes, shorter than a table footer ({_FOOTER} bytes)")
    footer = size - _FOOTER
    (magic,) = struct.unpack_from("<Q", buf, size - 8)
    if magic != _MAGIC:
        raise _Bad(f"its footer has magic number {magic:#x}, expected {_MAGIC:#x} (not a TF "
                   "checkpoint index, or truncated)")
    _, _, pos = _handle(buf, footer, size - 8)  # the metaindex block: TF writes it empty
    index_offset, index_size, _ = _handle(buf, pos, size - 8)
    index = _block(buf, index_offset, index_size, footer, "index")
    entries: dict = {}
    slices: dict = {}
    sliced: dict = {}
    num_shards = last = None
    previous_limit = 0
    for separator, value_start, value_end in _block_entries(buf, *index, "index"):
        offset, block_size, _ = _handle(buf, value_start, value_end)
        if offset < previous_limit:
            raise _Bad(f"the data block at {offset} overlaps the one before it")
        previous_limit = offset + block_size + _TRAILER
        data = _block(buf, offset, block_size, index_offset, "data")
        for key, v_start, v_end in _block_entries(buf, *data, "data"):
            if last is not None and key <= last:
                raise _Bad(f"its keys are not in strictly increasing order ({_show(key)} "
                           f"after {_show(last)})")
            last = key
            if key > separator:
                raise _Bad(f"a data block holds key {_show(key)} beyond its index entry")
            if key == b"":
                num_shards = _parse_header(buf, v_start, v_end)
                continue
            try:
                entry = _parse_entry(buf, v_start, v_end)
            except _Bad as err:
                raise _Bad(f"entry {_show(key)}: {err}") from None
            try:
                entries[key.decode("utf-8")] = entry
            except UnicodeDecodeError:
                if key[:1] != b"\x00":
                    raise _Bad(f"tensor name {_show(key)} is not UTF-8") from None
                # A slice of a partitioned tensor: TF encodes its key in binary.
                slices[_show(key)] = entry
                decoded = slice_key(key)
                if decoded is not None:
                    sliced[decoded] = entry
    if num_shards is None:
        raise _Bad("it has no header entry (the empty key)")
    return num_shards, entries, slices, sliced


# TF's OrderedCode (tensorflow/core/lib/strings/ordered_code.cc): a signed number's header
# bits by encoded length, removed when it is read.
_LENGTH_TO_MASK = (0, 0x80, 0xc000, 0xe00000, 0xf0000000, 0xf800000000, 0xfc0000000000,
                   0xfe000000000000, 0xff00000000000000, 0x8000000000000000, 0)
_M64 = (1 << 64) - 1


def slice_key(key: bytes):
    """(tensor name, extents) of a slice's binary key, as TF's `EncodeTensorNameSlice`
    writes it (OrderedCode: 0, the name, the rank, then each axis' start and length, -1 for
    a whole axis); None for bytes that are not one."""
    try:
        pos = 1 if key[:1] == b"\x00" else None  # WriteNumIncreasing(0)
        if pos is None:
            return None
        name, pos = _ordered_string(key, pos)
        size = key[pos]
        if size > 8:
            return None
        rank = int.from_bytes(key[pos + 1:pos + 1 + size], "big")
        pos += 1 + size
        if 2 * rank > len(key) - pos:  # each extent takes two numbers of a byte or more
            return None
        extents = []
        for _ in range(rank):
            start, pos = _ordered_signed(key, pos)
            length, pos = _ordered_signed(key, pos)
            extents.append((start, length))
        if pos != len(key):
            return None
        return name.decode("utf-8"), tuple(extents)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _ordered_string(key: bytes, pos: int) -> tuple[bytes, int]:
    """OrderedCode's string: 0x00 0xff is a 0 byte, 0xff 0x00 a 0xff byte, 0x00 0x01 ends."""
    out = bytearray()
    while True:
        byte = key[pos]
        if byte == 0x00:
            following = key[pos + 1]
            if following == 0x01:
                return bytes(out), pos + 2
            if following != 0xff:
                raise ValueError("not an escaped string")
            out.append(0)
            pos += 2
        elif byte == 0xff:
            if key[pos + 1] != 0x00:
                raise ValueError("not an escaped string")
            out.append(0xff)
            pos += 2
        else:
            out.append(byte)
            pos += 1


def _ordered_signed(key: bytes, pos: int) -> tuple[int, int]:
    """OrderedCode's signed number (`ReadSignedNumIncreasing`)."""
    xor = 0 if key[pos] & 0x80 else _M64
    first = key[pos] ^ (xor & 0xff)
    if first != 0xff:
        length = 8 - (first ^ 0xff).bit_length()
        if length < 1:
            raise ValueError("no number here")
        value = xor
        for byte in key[pos:pos + length]:
            value = ((value << 8) | byte) & _M64
        if pos + length > len(key):
            raise ValueError("cut short")
    else:
        second = key[pos + 1] ^ (xor & 0xff)
        length = 8
        if second >= 0x80:
            length = 9 if second < 0xc0 else 10
            if length == 10 and not (second == 0xc0 and (key[pos + 2] ^ (xor & 0xff)) < 0x80):
                raise ValueError("too long")
        if pos + length > len(key):
            raise ValueError("cut short")
        value = int.from_bytes(key[pos + length - 8:pos + length], "big")
    value ^= _LENGTH_TO_MASK[length]
    return (value - (1 << 64) if value >= 1 << 63 else value), pos + length


def _show(key: bytes) -> str:
    return _render.safe(key.decode("utf-8", "backslashreplace")[:200])


def _entry_problem(key: str, entry: Entry, num_shards: int) -> str | None:
    """What is wrong with one entry, or None."""
    if entry.dtype not in _DTYPE_SIZES:
        return f"its dtype is {entry.dtype}, not one TF saves in checkpoints"
    if not 0 <= entry.shard < num_shards:
        return f"its shard is {entry.shard}, but the checkpoint has {num_shards} shard(s)"
    if entry.offset < 0 or entry.size < 0:
        return f"its byte range (offset {entry.offset}, size {entry.size}) is negative"
    elements = entry.elements
    if entry.slices:
        if not entry.shape:  # a partitioner splits an axis: a scalar has none
            return "it is a scalar listed as stored in slices"
        for extents in entry.slices:
            if len(extents) != len(entry.shape):
                return (f"a slice has {len(extents)} extents for a tensor of rank "
                        f"{len(entry.shape)}")
            for (first, length), dim in zip(extents, entry.shape):
                if first > dim or (length >= 0 and first + length > dim):
                    return f"a slice ({first}, {length}) lies outside its dimension {dim}"
        if len(set(entry.slices)) != len(entry.slices):
            return "it lists the same slice twice"
    else:
        width = _DTYPE_SIZES[entry.dtype]
        if width and entry.size != elements * width:
            return (f"it holds {entry.size} bytes, but its shape {entry.shape} of dtype "
                    f"{entry.dtype} needs {elements * width}")
        if not width and elements > entry.size:
            return (f"it holds {entry.size} bytes for {elements} variable-length elements "
                    "(at least one byte each)")
    if key == OBJECT_GRAPH_KEY and (entry.dtype != _STRING or entry.shape or entry.slices):
        return (f"the object graph must be a scalar string; it has dtype {entry.dtype} and "
                f"shape {entry.shape}")
    return None


def _corrupt(path: str, key, problem: str) -> errors.CheckpointCorruptError:
    """The error for a damaged file of a checkpoint: names the prefix, the file, the entry."""
    if path.endswith(".index"):
        prefix, kind = path[:-len(".index")], "index file"
        what = "is damaged or not a checkpoint index"
    else:
        prefix, kind, what = path.rsplit(".data-", 1)[0], "data file", "is damaged or missing"
    where = f" (entry `{_render.safe(key)}`)" if key is not None else ""
    return errors.CheckpointCorruptError(
        f"Checkpoint `{_render.safe(prefix)}` cannot be read: its {kind} "
        f"`{_render.safe(path)}`{where} {what}: {problem}. Nothing was read into any variable. "
        "Fix: restore from another checkpoint, or write this one again.", source=prefix)


# --- the object graph ----------------------------------------------------------------------

def check_graph(graph, keys, prefix: str, *, attributes: bool = True) -> None:
    """Raises CheckpointCorruptError on the first of `graph_problems` (what `verify` lists
    as problems, worded alike); `attributes=False` leaves the checkpoint keys to the caller
    (who reads them anyway)."""
    for _, _, problem in graph_problems(graph, keys, attributes=attributes):
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(prefix)}` has an inconsistent object graph: {problem}. "
            "Nothing was read into any variable. Fix: restore from another checkpoint, or write "
            "this one again.", source=prefix)


def saved_under(key: str, keys) -> bool:
    """Whether some tensor of `keys` (in the index's sorted order) is saved under an
    attribute's checkpoint key: exactly (a variable) or with a suffix (a saveable of several
    tensors: a tf.data iterator's `.../ITERATOR` is saved as `.../ITERATOR_STATE`).
    """
    ordered = keys if isinstance(keys, list) else sorted(keys)
    at = bisect.bisect_left(ordered, key)
    return at < len(ordered) and ordered[at].startswith(key)


def graph_problems(graph, keys, *, attributes: bool = True):
    """(kind, where, problem) for what is wrong in a parsed `TrackableObjectGraph` given the
    index's `keys`: the checks every reader of a checkpoint makes (`check_graph` raises the
    first, `objckpt.verify` lists them all), so that what `verify` passes they all read.

    kind is "empty", "child" (id out of range), "duplicate" (two children of one name),
    "key" (a checkpoint key the index lacks), "shared" (a key named by two nodes), "slot" (a
    slot reference out of range) or "paths" (the object paths of all nodes together longer
    than `_paths.MAX_PATH_CHARS`: a chain thousands of edges deep, which every reader that
    names nodes by path refuses); `where` is the node (`node 3`) or, for a key, its object
    path. Node ids are never resolved by Python's negative indexing: -2 is out of range.
    """
    nodes = graph.nodes
    count = len(nodes)
    if not count:
        yield "empty", "", "the object graph has no nodes"
        return
    owner_of_key: dict = {}
    sorted_keys = None
    for node_id, node in enumerate(nodes):
        where = f"node {node_id}"
        children = node.children
        if children:
            names = set()
            for child in children:
                local = child.local_name
                if not 0 <= child.node_id < count:
                    yield "child", where, (f"node {node_id} has child `{_render.safe(local)}` "
                                           f"-> node {child.node_id}, outside 0..{count - 1}")
                if local in names:
                    yield "duplicate", where, (f"node {node_id} has two children named "
                                               f"`{_render.safe(local)}`")
                names.add(local)
        for attribute in (node.attributes if attributes else ()):
            key = attribute.checkpoint_key
            if key != OBJECT_GRAPH_KEY and key not in keys:
                if sorted_keys is None:
                    sorted_keys = sorted(keys)
                present = saved_under(key, sorted_keys)
            else:
                present = key != OBJECT_GRAPH_KEY
            if not present:
                yield "key", _paths.path_of_key(key), (
                    f"the object graph lists key `{_render.safe(key)}` (node {node_id}) but "
                    "the index has no such tensor")
            elif owner_of_key.setdefault(key, node_id) != node_id:
                yield "shared", _paths.path_of_key(key), (
                    f"the object graph lists key `{_render.safe(key)}` (node {node_id}) but "
                    f"another node of the graph (node {owner_of_key[key]}) names the same key")
        for slot in node.slot_variables:
            for ref in (slot.original_variable_node_id, slot.slot_variable_node_id):
                if not 0 <= ref < count:
                    yield "slot", where, (f"node {node_id} has slot "
                                          f"`{_render.safe(slot.slot_name)}` referring to node "
                                          f"{ref}, outside 0..{count - 1}")
    chars = path_chars(graph)
    if chars > _paths.MAX_PATH_CHARS:
        yield "paths", "", (f"its object paths add up to more than {_paths.MAX_PATH_CHARS:,} "
                            "characters (nodes chained thousands of edges deep): no model is "
                            "built that way, so the checkpoint is crafted or damaged")


def path_chars(graph) -> int:
    """The characters of the canonical object paths of all the nodes a walk from the root
    reaches (`_paths.graph_paths`), counted without spelling them (linear in the graph),
    stopping once past `_paths.MAX_PATH_CHARS`; or, where that bound cannot be reached, an
    upper bound of them found without walking."""
    # Without a walk first: no path is longer than every edge name escaped (at most twice
    # its length) and joined, so a graph of everyday size cannot come near the bound.
    edges = [child.local_name for node in graph.nodes for child in node.children]
    longest = 2 * sum(map(len, edges)) + len(edges)
    if longest * len(graph.nodes) <= _paths.MAX_PATH_CHARS:
        return longest * len(graph.nodes)  # an upper bound, below the limit
    lengths, total = {0: 0}, 0
    for parent, name, node in _paths.graph_walk(graph):
        above = lengths[parent]
        lengths[node] = length = above + bool(above) + len(_paths.escape(name))
        total += length
        if total > _paths.MAX_PATH_CHARS:
            break
    return total


# The strict wire decoding and file access above, for the object graph reader
# (`objckpt._bundle.objgraph`): one decoder of TF's protobuf records in the package.
WireError = _Bad  # what the decoders raise; the caller names the file and entry
fields, varint, int32 = _fields, _varint, _int32
expect_wire, singular = _expect, _singular
open_file, corrupt = _open, _corrupt
dtype_size = _DTYPE_SIZES.get  # bytes per element of a DataType enum (0: variable length)
