"""A checkpoint's object graph, read and validated in pure Python (no TensorFlow).

`read_object_graph(prefix_or_index)` reads the `_CHECKPOINTABLE_OBJECT_GRAPH` entry of an
object-based checkpoint straight from its data shard and decodes the `TrackableObjectGraph`
protobuf it holds, or returns None for a name-based (TF1 `Saver`) checkpoint, which has none.
The result has the shape of TF's proto for the fields objckpt uses, as frozen tuples:

    graph.nodes[i].children[j].node_id, .local_name
    graph.nodes[i].attributes[k].name, .full_name, .checkpoint_key
    graph.nodes[i].slot_variables[s].original_variable_node_id, .slot_name,
                                     .slot_variable_node_id

so `_paths.graph_walk`, `_bundle.check_graph` and the drawing code take either. `name_graph`
builds the same shape for a name-based checkpoint, its names split at `/`.

The bytes are untrusted. TF stores a string tensor as the varint64 length of each element, a
masked crc32c of those lengths, then the bytes; the entry's own masked crc32c covers it all.
Both checksums are verified and the framing must fill the entry's byte range exactly. The
protobuf is decoded strictly with `_bundle`'s wire decoder: wrong wire types, a field given
twice, truncated fields and names that are not UTF-8 are refused (TF's parser refuses the last
two too); unknown fields are skipped, as protobuf does. Anything wrong is a
`CheckpointCorruptError` naming the prefix and the problem; decoding is linear in the bytes.
Node ids are checked by `_bundle.check_graph`, as for TF's parsed proto.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import NamedTuple

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle

__all__ = ["Attribute", "Graph", "Node", "Reference", "SlotReference", "crc32c",
           "decode_object_graph", "masked_crc32c", "name_graph", "read_bytes",
           "read_object_graph", "read_strings", "value_entry"]

_KEY = _bundle.OBJECT_GRAPH_KEY


class Reference(NamedTuple):
    """`TrackableObject.ObjectReference`: a child edge."""

    node_id: int
    local_name: str


class Attribute(NamedTuple):
    """`TrackableObject.SerializedTensor`: a saved tensor of a node."""

    name: str
    full_name: str
    checkpoint_key: str


class SlotReference(NamedTuple):
    """`TrackableObject.SlotVariableReference`: an optimizer slot of a variable."""

    original_variable_node_id: int
    slot_name: str
    slot_variable_node_id: int


class Node(NamedTuple):
    """`TrackableObjectGraph.TrackableObject` (the fields objckpt reads)."""

    children: tuple = ()
    attributes: tuple = ()
    slot_variables: tuple = ()
    # Whether a `registered_saver` writes this object's tensors (under keys of its own).
    registered: bool = False


class Graph(NamedTuple):
    """`TrackableObjectGraph`: `nodes[0]` is the root."""

    nodes: tuple


# --- crc32c (Castagnoli), as TF checksums its data --------------------------------------

def _table() -> tuple:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _table()


_SHIFTS: dict = {}  # width -> (4, 256) NumPy table moving a crc32c past `width` zero bytes


def crc32c(data, crc: int = 0) -> int:
    """The crc32c of `data`, extending `crc`.

    Data under 1 KiB is checksummed byte by byte (about 15 MB/s), and so is data under 1 MB
    while NumPy is not imported yet (importing it would take longer: `inspect` of an object
    graph needs no NumPy). Larger data (a tensor) is cut into up to 8,192 lanes stepped
    together with NumPy, whose checksums are then combined pairwise, vectorized, as zlib's
    `crc32_combine` combines two (a table per width moves a checksum past that many zero
    bytes); the rest is checksummed the same way.
    """
    size = len(data)
    if size < 1024 or (size < 1 << 20 and "numpy" not in sys.modules):
        return _crc32c_bytes(data, crc)
    import numpy as np

    lanes = 1 << min(13, (size // 8).bit_length() - 1)
    width = size // lanes
    body = np.frombuffer(data, np.uint8, lanes * width).reshape(lanes, width).T.copy()
    table = np.array(_TABLE, np.uint32)
    state = np.full(lanes, 0xFFFFFFFF, np.uint32)
    for column in body:
        state = table[(state ^ column) & 0xFF] ^ (state >> 8)
    state ^= 0xFFFFFFFF
    step = width
    while len(state) > 1:
        shift, left = _shift_table(step, np), state[0::2]
        state = (shift[0][left & 0xFF] ^ shift[1][(left >> 8) & 0xFF]
                 ^ shift[2][(left >> 16) & 0xFF] ^ shift[3][left >> 24] ^ state[1::2])
        step *= 2
    if crc:
        crc = _gf2_times(_zeros_operator(lanes * width), crc)
    return crc32c(memoryview(data)[lanes * width:], crc ^ int(state[0]))


def _shift_table(width: int, np):
    table = _SHIFTS.get(width)
    if table is None:
        operator = _zeros_operator(width)
        table = np.zeros((4, 256), np.uint32)
        for k in range(4):
            row = [0] * 256
            for byte in range(1, 256):
                low = byte & -byte
                row[byte] = row[byte ^ low] ^ operator[8 * k + low.bit_length() - 1]
            table[k] = row
        if len(_SHIFTS) < 4096:
            _SHIFTS[width] = table
    return table


def _crc32c_bytes(data, crc: int) -> int:
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _gf2_times(matrix: list, vector: int) -> int:
    out, row = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[row]
        vector >>= 1
        row += 1
    return out


def _zeros_operator(length: int) -> list:
    """The GF(2) matrix that moves a crc32c past `length` zero bytes (zlib's
    `crc32_combine`): crc(a + b) = operator(len(b)) x crc(a) ^ crc(b)."""
    op = [0x82F63B78] + [1 << i for i in range(31)]  # one zero bit
    for _ in range(3):  # 2, 4, 8 bits: one byte
        op = [_gf2_times(op, row) for row in op]
    result = [1 << i for i in range(32)]
    while length:
        if length & 1:
            result = [_gf2_times(op, row) for row in result]
        length >>= 1
        if length:
            op = [_gf2_times(op, row) for row in op]
    return result


def masked_crc32c(crc: int) -> int:
    """TF's (and LevelDB's) masked form of a crc32c, as stored in files."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- reading -----------------------------------------------------------------------------

def read_object_graph(prefix_or_index, *, check: bool = True) -> Graph | None:
    """Reads and decodes a checkpoint's object graph without TensorFlow.

    Args:
      prefix_or_index: a checkpoint prefix (validated with `_bundle.read_index`), or an
        `_bundle.Index` already read.
      check: also check the graph against the index (`_bundle.check_graph`: node ids in
        range, checkpoint keys present and unique); `verify` passes False to list every
        problem itself.

    Returns:
      The `Graph`, or None for a name-based (TF1 `Saver`) checkpoint.

    Raises:
      CheckpointNotFoundError: no `prefix.index`.
      CheckpointCorruptError: the index, the entry's bytes or the graph are damaged.
    """
    if isinstance(prefix_or_index, _bundle.Index):
        index = prefix_or_index
    else:
        prefix = os.fspath(prefix_or_index)
        try:
            index = _bundle.read_index(prefix)
        except FileNotFoundError as err:
            raise errors.CheckpointNotFoundError(
                f"No checkpoint at prefix `{_render.safe(prefix)}`: `{_render.safe(prefix)}"
                ".index` does not exist. Fix: check the path, or pass the directory to use its "
                "newest checkpoint.", source=prefix) from err
    if _KEY not in index.entries:
        return None
    (data,) = read_strings(index, _KEY)
    return decode_object_graph(index, data, check=check)


def decode_object_graph(index, data: bytes, *, check: bool = True) -> Graph:
    """The `Graph` of the object graph entry's bytes `data` (`read_strings`) of a validated
    `_bundle.Index`, checked as `read_object_graph` checks it.

    Raises:
      CheckpointCorruptError: the bytes do not decode, or (`check`) the graph does not fit
        the index.
    """
    collecting = gc.isenabled()
    gc.disable()  # millions of small tuples, none of them cyclic: no collection pass
    try:  # (each would walk every tuple made so far: twice the decoding time)
        graph = _parse_graph(data, 0, len(data))
    except _bundle.WireError as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(index.prefix)}` has a damaged object graph (`{_KEY}`): "
            f"{err}. Nothing was read into any variable. Fix: restore from another checkpoint, or "
            "write this one again.", source=index.prefix) from None
    finally:
        if collecting:
            gc.enable()
    if check:
        _bundle.check_graph(graph, index.entries, index.prefix)
    return graph


def value_entry(index, node_id: int, attribute):
    """The index entry of a variable's value (a `VARIABLE_VALUE` attribute of node `node_id`
    of a graph `_bundle.check_graph` passed): the one place its absence is worded.

    Raises:
      CheckpointCorruptError: the index holds it only under a longer key (which
        `check_graph` lets through for saveables of several tensors, never for a variable).
    """
    key = attribute.checkpoint_key
    entry = index.entries.get(key)
    if entry is None:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(index.prefix)}`: the object graph lists "
            f"`{_render.safe(_paths.path_of_key(key))}` (key `{_render.safe(key)}`, node "
            f"{node_id}) but the index has no such tensor. The checkpoint is inconsistent: "
            "nothing was read into any variable. Fix: restore from another checkpoint, or write "
            "this one again.", source=index.prefix)
    return entry


def read_bytes(index, key: str, *, verify: bool = True) -> bytes:
    """The stored bytes of entry `key` of a validated `_bundle.Index` (not a sliced one),
    their crc32c checked against the index's unless `verify=False` (string tensors: their
    checksum covers decoded lengths; `read_strings` checks it).

    Raises:
      CheckpointCorruptError: the data shard is shorter than the index says, or the bytes
        do not match their checksum (names the prefix, the data file and the entry).
    """
    entry = index.entries[key]
    path = _bundle.shard_name(index.prefix, entry.shard, index.num_shards)
    try:
        with _bundle.open_file(path) as f:
            f.seek(entry.offset)
            data = f.read(entry.size)
    except OSError as err:
        raise _bundle.corrupt(path, key, f"it cannot be read ({_render.first_line(err)})") \
            from err
    if len(data) != entry.size:
        raise _bundle.corrupt(path, key, f"{len(data)} of its {entry.size} bytes could be "
                              "read (the file is shorter than its index says)")
    if verify and masked_crc32c(crc32c(data)) != entry.crc32c:
        raise _bundle.corrupt(path, key, "its bytes do not match their checksum (crc32c)")
    return data


def read_strings(index, key: str) -> list[bytes]:
    """The elements of string tensor `key`, in order, after checking TF's framing (a
    varint64 length per element, a masked crc32c of the lengths, the bytes, filling the
    entry exactly) and both checksums.

    Raises:
      CheckpointCorruptError: as `read_bytes`, or the framing is wrong.
    """
    entry = index.entries[key]
    data = read_bytes(index, key, verify=False)
    try:
        return _strings(data, entry.elements, entry.crc32c)
    except _bundle.WireError as err:
        path = _bundle.shard_name(index.prefix, entry.shard, index.num_shards)
        raise _bundle.corrupt(path, key, str(err)) from None


def _strings(data: bytes, elements: int, crc: int) -> list[bytes]:
    end, pos, lengths, length_crc = len(data), 0, [], 0
    for _ in range(elements):
        length, pos = _bundle.varint(data, pos, end)
        lengths.append(length)
        # TF checksums each length as a little-endian uint32 when it fits, else uint64.
        length_crc = crc32c(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, "little"),
                            length_crc)
    if pos + 4 > end or int.from_bytes(data[pos:pos + 4], "little") != masked_crc32c(
            length_crc):
        raise _bundle.WireError("the checksum of its string lengths does not match")
    if pos + 4 + sum(lengths) != end:
        raise _bundle.WireError(f"its strings declare {sum(lengths)} bytes, which do not fill "
                                f"the entry's {end} bytes")
    if masked_crc32c(crc32c(data[pos:], length_crc)) != crc:
        raise _bundle.WireError("its bytes do not match their checksum (crc32c)")
    out, pos = [], pos + 4
    for length in lengths:
        out.append(data[pos:pos + length])
        pos += length
    return out


def _text(data: bytes, span: tuple, what: str) -> str:
    try:
        return data[span[0]:span[1]].decode("utf-8")
    except UnicodeDecodeError:
        raise _bundle.WireError(f"{what} is not UTF-8") from None


def _parse_graph(data: bytes, start: int, end: int) -> Graph:
    nodes = []
    for number, wire, value in _bundle.fields(data, start, end):
        if number == 1:
            _bundle.expect_wire(wire, 2, "TrackableObjectGraph", number)
            try:
                nodes.append(_parse_node(data, *value))
            except _bundle.WireError as err:
                raise _bundle.WireError(f"node {len(nodes)}: {err}") from None
    return Graph(tuple(nodes))


def _parse_node(data: bytes, start: int, end: int) -> Node:
    children, attributes, slots, seen = [], [], [], set()
    for number, wire, value in _bundle.fields(data, start, end):
        if number == 1:
            _bundle.expect_wire(wire, 2, "TrackableObject", number)
            node_id, name = _record(data, value, "ObjectReference", (0, 2))
            children.append(Reference(node_id, name))
        elif number == 2:
            _bundle.expect_wire(wire, 2, "TrackableObject", number)
            attributes.append(Attribute(*_record(data, value, "SerializedTensor", (2, 2, 2))))
        elif number == 3:
            _bundle.expect_wire(wire, 2, "TrackableObject", number)
            slots.append(SlotReference(*_record(data, value, "SlotVariableReference",
                                                (0, 2, 0))))
        elif number in (4, 5):  # registered_saver, has_checkpoint_values: checked, not kept
            _bundle.expect_wire(wire, 2, "TrackableObject", number)
            _bundle.singular(seen, number, "TrackableObject")
            _record(data, value, "RegisteredSaver" if number == 4 else "BoolValue",
                    (2, 2) if number == 4 else (0,))
    return Node(tuple(children), tuple(attributes), tuple(slots), 4 in seen)


def _record(data: bytes, span: tuple, what: str, wires: tuple) -> list:
    """The fields 1..len(wires) of a small message: int32 (wire 0) or UTF-8 (wire 2), the
    proto3 default (0, "") when absent; each at most once; unknown fields skipped.

    The encoding TF writes (one-byte tags of known fields, each once, with their expected
    wire types) is read inline; anything else by the strict general decoder
    (`_record_general`), which words what is wrong: the same values, either way."""
    start, end = span
    values: list = [0 if wire == 0 else "" for wire in wires]
    pos, seen, count = start, 0, len(wires)
    while pos < end:
        tag = data[pos]
        number = tag >> 3
        if tag >= 0x80 or not 0 < number <= count or seen & (1 << number) or (
                tag & 7) != wires[number - 1] or pos + 1 >= end:
            return _record_general(data, span, what, wires)
        seen |= 1 << number
        value = data[pos + 1]
        pos += 2
        if value >= 0x80:  # a varint of several bytes
            shift, value = 7, value & 0x7F
            while True:
                if pos >= end or shift >= 63:
                    return _record_general(data, span, what, wires)
                byte = data[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
        if tag & 7 == 0:
            values[number - 1] = value if value < 1 << 31 else _bundle.int32(value)
            continue
        if value > end - pos:
            return _record_general(data, span, what, wires)
        try:
            values[number - 1] = data[pos:pos + value].decode("utf-8")
        except UnicodeDecodeError:
            return _record_general(data, span, what, wires)
        pos += value
    return values


def _record_general(data: bytes, span: tuple, what: str, wires: tuple) -> list:
    """`_record` by the strict wire decoder (`_bundle.fields`)."""
    values: list = [0 if wire == 0 else "" for wire in wires]
    seen: set = set()
    for number, wire, value in _bundle.fields(data, *span):
        if number > len(wires):
            continue
        _bundle.expect_wire(wire, wires[number - 1], what, number)
        _bundle.singular(seen, number, what)
        values[number - 1] = (_bundle.int32(value) if wire == 0
                              else _text(data, value, f"{what} field {number}"))
    return values


# --- name-based checkpoints --------------------------------------------------------------

def name_graph(names) -> Graph:
    """A `Graph` for a name-based checkpoint: each name split at `/` into a chain of edges
    from the root, its variable under `<escaped path>/.ATTRIBUTES/VARIABLE_VALUE`, its
    attribute's `full_name` the name itself. A name that is also a prefix of another
    (`a` and `a/b`) is one node holding a variable and a child.
    """
    children: list[list] = [[]]
    attributes: list[list] = [[]]
    node_of: dict = {}  # (parent node, edge) -> node: linear in a name's length
    for name in names:
        parts = name.split("/")
        node = 0
        for part in parts:
            child = node_of.get((node, part))
            if child is None:
                child = node_of[(node, part)] = len(children)
                children[node].append(Reference(child, part))
                children.append([])
                attributes.append([])
            node = child
        path = "/".join(map(_paths.escape, parts))
        attributes[node].append(
            Attribute(_paths.VARIABLE_VALUE, name, _paths.checkpoint_key(path)))
    return Graph(tuple(Node(tuple(c), tuple(a)) for c, a in zip(children, attributes)))
