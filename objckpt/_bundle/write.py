"""Writes a checkpoint in TF's tensor bundle format itself: one data file, one index.

`tf.raw_ops.SaveV2` copies every tensor into an 8 MiB buffer, checksums it and writes the
buffer, on one thread per call. Here the data file's layout is planned first (every entry's
offset follows from the sizes), then several threads each checksum their tensors and
`pwrite` them straight from the tensors' own buffers at their offsets, chunk by chunk (the
checksum brings a chunk into the cache, the write copies it from there): no buffer, one copy
(into the page cache), checksums on every core. The index is the table TF writes
(`tensorflow/core/util/tensor_bundle`): a `BundleHeaderProto` under the empty key and a
`BundleEntryProto` per tensor (dtype, shape, shard 0, offset, size, masked crc32c), keys
sorted, in LevelDB's table format as TF's TableBuilder writes it. Both files are byte for
byte what `SaveV2` writes for the same tensors in the same order (tests/_bundle/test_write.py).
`_fastio.write_bundle` runs it: `plan`, then `write_item` on several threads, then `index`.

A partitioned tensor (a sharded variable: one key, one slice per shard) is written as
TF's `BundleWriter::AddSlice` writes it: an entry of the whole tensor (dtype, shape, its
slices, no data) and one entry per slice under the binary key `slice_key` encodes (an item's
`slices`, when it has them, are written into its entry).

String tensors are written as TF writes them: the varint64 length of each element, a
masked crc32c of the lengths, then the bytes. Tensors of other dtypes (variant, resource)
are not written here: `supported` says whether a list of tensors can be.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from objckpt._bundle import objgraph as _objgraph

__all__ = ["CHUNK_BYTES", "Item", "data_bytes", "index", "plan", "slice_key", "supported",
           "write_item"]

# DataType enums written as their raw little-endian buffers: float, double, int32, uint8,
# int16, int8, complex64, int64, bool, bfloat16, complex128, half, uint16, uint32, uint64.
_RAW = frozenset({1, 2, 3, 4, 5, 6, 8, 9, 10, 14, 18, 19, 17, 22, 23})
_STRING = 7
_MAGIC = 0xDB4775248B80FB57
# Each thread checksums then writes this many bytes at a time (the chunk is still in the
# cache when it is written).
CHUNK_BYTES = 1 << 20


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def supported(tensors: list) -> bool:
    """Whether every tensor has a dtype written here (plain numbers, bool, strings)."""
    return all(t.dtype.as_datatype_enum in _RAW or t.dtype.as_datatype_enum == _STRING
               for t in tensors)


class Item:
    """One entry: its key, tensor, size, offset in the data file and masked checksum (a
    string tensor's is computed as it is encoded, the others' as they are written)."""

    __slots__ = ("crc", "dtype", "encoded", "key", "offset", "shape", "size", "tensor")

    def __init__(self, key: bytes, tensor, crc):
        self.key, self.tensor = key, tensor
        self.dtype = tensor.dtype.as_datatype_enum
        self.shape = [int(d) for d in tensor.shape]
        self.encoded, self.crc, self.offset = None, 0, 0
        if self.dtype == _STRING:
            self.encoded, self.crc = _encode_strings(tensor.numpy(), crc)
            self.size = len(self.encoded)
        else:
            self.size = int(np.prod(self.shape, dtype=np.int64)) * tensor.dtype.size

    def data(self):
        """The bytes to write, as a uint8 array: a CPU tensor's own buffer (shared, no
        copy); a GPU tensor's is copied to the host, one tensor at a time per thread."""
        if self.encoded is not None:
            return np.frombuffer(self.encoded, np.uint8)
        if not self.size:
            return np.empty(0, np.uint8)
        array = np.asarray(self.tensor)
        if array.nbytes != self.size or not array.flags.c_contiguous:
            raise ValueError(f"tensor {self.key!r} gave {array.nbytes} bytes, expected "
                             f"{self.size} in one C-ordered buffer")
        return array.reshape(-1).view(np.uint8)


def _encode_strings(array, crc) -> tuple[bytes, int]:
    """A string tensor's bytes as TF's BundleWriter writes them, and its entry's masked
    crc32c. TF's checksum is not that of the bytes: it covers each length as a little-endian
    uint32 (uint64 from 4 GiB), then the masked checksum of those, then the strings."""
    elements = [bytes(e) for e in np.asarray(array, dtype=object).reshape(-1)]
    lengths, value = bytearray(), 0
    for element in elements:
        _put_varint(lengths, len(element))
        size = len(element)
        value = crc(struct.pack("<I" if size <= 0xFFFFFFFF else "<Q", size), value)
    length_checksum = struct.pack("<I", _objgraph.masked_crc32c(value))
    value = crc(length_checksum, value)
    for element in elements:
        value = crc(element, value)
    return bytes(lengths) + length_checksum + b"".join(elements), _objgraph.masked_crc32c(value)


def plan(keys: list, tensors: list, crc) -> list[Item]:
    """The entries of a data file holding `tensors` under `keys`, in the order given (as
    SaveV2 writes them), each with its offset; string tensors encoded and checksummed.
    `crc(buffer, crc=0)` is TF's crc32c (`_fastio.native_crc32c()`)."""
    items = [Item(key.encode("utf-8") if isinstance(key, str) else bytes(key), tensor, crc)
             for key, tensor in zip(keys, tensors)]
    offset = 0
    for item in items:
        item.offset = offset
        offset += item.size
    return items


def data_bytes(items: list) -> int:
    """The size of the data file of `items`."""
    return sum(item.size for item in items)


def write_item(fd: int, item: Item, crc) -> None:
    """Checksums `item` and writes it at its offset of the open data file `fd`, chunk by
    chunk; sets its masked crc32c (a string tensor's is already set)."""
    data = item.data()
    view, address, value = memoryview(data), data.ctypes.data, 0
    try:
        for start in range(0, item.size, CHUNK_BYTES):
            stop = min(item.size, start + CHUNK_BYTES)
            if item.encoded is None:
                value = crc.extend(address + start, stop - start, value)
            _pwrite_all(fd, view[start:stop], item.offset + start)
    finally:
        view.release()
    if item.encoded is None:
        item.crc = _objgraph.masked_crc32c(value)


def _pwrite_all(fd: int, view, offset: int) -> None:
    while len(view):
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(f"pwrite wrote {done} bytes")
        view, offset = view[done:], offset + done


# --- the index table ------------------------------------------------------------------

def _field_varint(out: bytearray, number: int, value: int) -> None:
    """A varint field, left out when 0 (proto3, as TF serializes it)."""
    if value:
        _put_varint(out, number << 3)
        _put_varint(out, value & 0xFFFFFFFFFFFFFFFF)


def _field_bytes(out: bytearray, number: int, value: bytes) -> None:
    _put_varint(out, (number << 3) | 2)
    _put_varint(out, len(value))
    out += value


def _header() -> bytes:
    """TF's `BundleHeaderProto(num_shards=1, version=VersionDef(producer=1))`, serialized
    as protobuf does (deterministic), without importing TF's protos."""
    out, version = bytearray(), bytearray()
    _field_varint(out, 1, 1)  # num_shards
    _field_varint(version, 1, 1)  # producer
    _field_bytes(out, 3, bytes(version))
    return bytes(out)


def _entry(item: Item) -> bytes:
    """The item's `BundleEntryProto` (dtype, shape, shard 0, offset, size, masked crc32c),
    serialized as protobuf does (deterministic; fields equal to 0 left out, the shape always
    written, as TF's writer sets it), without importing TF's protos."""
    out, shape = bytearray(), bytearray()
    _field_varint(out, 1, item.dtype)
    for size in item.shape:
        dim = bytearray()
        _field_varint(dim, 1, size)
        _field_bytes(shape, 2, bytes(dim))
    _field_bytes(out, 2, bytes(shape))
    _field_varint(out, 4, item.offset)
    _field_varint(out, 5, item.size)
    if item.crc:
        _put_varint(out, (6 << 3) | 5)  # fixed32
        out += struct.pack("<I", item.crc)
    for extents in getattr(item, "slices", None) or ():
        # TensorSliceProto: an Extent per axis, empty for a whole axis (TensorSlice::AsProto)
        proto = bytearray()
        for start, length in extents:
            extent = bytearray()
            if length != -1:
                _field_varint(extent, 1, start)
                _put_varint(extent, 2 << 3)  # length, in a oneof: written even when 0
                _put_varint(extent, length)
            _field_bytes(proto, 1, bytes(extent))
        _field_bytes(out, 7, bytes(proto))
    return bytes(out)


# OrderedCode's header bits of a signed number by its encoded length (ordered_code.cc).
_SIGNED_HEADER = ((0, 0), (0x80, 0), (0xc0, 0), (0xe0, 0), (0xf0, 0), (0xf8, 0), (0xfc, 0),
                  (0xfe, 0), (0xff, 0), (0xff, 0x80), (0xff, 0xc0))


def _signed_increasing(value: int) -> bytes:
    """OrderedCode's `WriteSignedNumIncreasing`."""
    x = ~value if value < 0 else value
    if x < 64:
        return bytes([(0x80 ^ value) & 0xFF])
    length = x.bit_length() // 7 + 1  # 7 bits of value per byte, less the sign
    out = bytearray(value.to_bytes(10, "big", signed=True)[10 - length:])
    out[0] ^= _SIGNED_HEADER[length][0]
    out[1] ^= _SIGNED_HEADER[length][1]
    return bytes(out)


def slice_key(name: str, extents) -> bytes:
    """The binary key of a slice of tensor `name` (`extents`: (start, length) per axis,
    length -1 for the whole axis), as TF's `checkpoint::EncodeTensorNameSlice` makes it
    (OrderedCode: the number 0, the name, the rank, then each axis' start and length);
    `index.slice_key` decodes it."""
    out = bytearray(b"\x00")  # WriteNumIncreasing(0)
    for byte in name.encode("utf-8"):  # WriteString: 0x00 and 0xff escaped, 0x00 0x01 ends
        out += b"\x00\xff" if byte == 0 else b"\xff\x00" if byte == 0xFF else bytes([byte])
    out += b"\x00\x01"
    rank = len(extents).to_bytes((len(extents).bit_length() + 7) // 8, "big")
    out += bytes([len(rank)]) + rank  # WriteNumIncreasing(rank)
    for start, length in extents:
        out += _signed_increasing(0 if length == -1 else start)
        out += _signed_increasing(length)
    return bytes(out)


# TF's table options (tensorflow/tsl/lib/io/table_options.h): 256 KiB blocks, a restart
# point every 16 keys in data blocks, every key in the index block (LevelDB's TableBuilder).
_BLOCK_SIZE = 256 << 10
_RESTART_INTERVAL = 16


class _Block:
    """LevelDB's BlockBuilder: keys share their prefix with the previous key, except at
    restart points."""

    def __init__(self, restart_interval: int):
        self.interval, self.out, self.restarts = restart_interval, bytearray(), [0]
        self.count, self.last = 0, b""

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.count < self.interval:
            limit = min(len(self.last), len(key))
            while shared < limit and self.last[shared] == key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.out))
            self.count = 0
        _put_varint(self.out, shared)
        _put_varint(self.out, len(key) - shared)
        _put_varint(self.out, len(value))
        self.out += key[shared:]
        self.out += value
        self.last, self.count = key, self.count + 1

    def size(self) -> int:
        return len(self.out) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.out + struct.pack(f"<{len(self.restarts)}I", *self.restarts)
                     + struct.pack("<I", len(self.restarts)))


def _separator(start: bytes, limit: bytes) -> bytes:
    """LevelDB's FindShortestSeparator: a short key in [start, limit)."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def _successor(key: bytes) -> bytes:
    """LevelDB's FindShortSuccessor (the last index key)."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def index(items: list, crc) -> bytes:
    """The index table of `items` (written), byte for byte as TF's BundleWriter writes it:
    the header under the empty key and the entries, keys sorted, in data blocks of about
    256 KiB; an empty metaindex block; the index block; the footer."""
    pairs = sorted([(b"", _header())] + [(item.key, _entry(item)) for item in items])
    for (a, _), (b, _) in zip(pairs, pairs[1:]):
        if a == b:
            raise ValueError(f"duplicate checkpoint key {a!r}")
    table = bytearray()

    def add(block: bytes) -> bytes:
        handle = bytearray()
        _put_varint(handle, len(table))
        _put_varint(handle, len(block))
        table.extend(block)
        table.append(0)  # no compression
        table.extend(struct.pack("<I", _objgraph.masked_crc32c(crc(block + b"\x00"))))
        return bytes(handle)

    index_block, data, pending = _Block(1), _Block(_RESTART_INTERVAL), None
    for key, value in pairs:
        if pending is not None:
            index_block.add(_separator(pending[0], key), pending[1])
            pending = None
        data.add(key, value)
        if data.size() >= _BLOCK_SIZE:
            pending = (key, add(data.finish()))
            data = _Block(_RESTART_INTERVAL)
    if data.count or data.out:
        pending = (data.last, add(data.finish()))
    if pending is not None:
        index_block.add(_successor(pending[0]), pending[1])
    footer = bytearray(add(_Block(1).finish()))  # the metaindex block: empty
    footer += add(index_block.finish())
    footer += b"\x00" * (40 - len(footer))
    footer += struct.pack("<Q", _MAGIC)
    table += footer
    return bytes(table)
