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

import os
from typing import NamedTuple

from objckpt import _bundle, _paths, _render, errors

__all__ = ["Attribute", "Graph", "Node", "Reference", "SlotReference", "crc32c",
           "masked_crc32c", "name_graph", "read_object_graph"]

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


def crc32c(data, crc: int = 0) -> int:
    """The crc32c of `data`, extending `crc` (about 15 MB/s: object graphs are small)."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


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
                ".index` does not exist. Check the path, or pass the directory to use its "
                "newest checkpoint.") from err
    entry = index.entries.get(_KEY)
    if entry is None:
        return None
    data = _entry_bytes(index, entry)
    try:
        graph = _parse_graph(data, *_string_range(data, entry.crc32c))
    except _bundle.WireError as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(index.prefix)}` has a damaged object graph (`{_KEY}`): "
            f"{err}. Nothing was read into any variable. Restore from another checkpoint, or "
            "write this one again.") from None
    if check:
        _bundle.check_graph(graph, index.entries, index.prefix)
    return graph


def _entry_bytes(index, entry) -> bytes:
    """The bytes of one entry from its data shard (its range was checked by read_index)."""
    path = _bundle.shard_name(index.prefix, entry.shard, index.num_shards)
    try:
        with _bundle.open_file(path) as f:
            f.seek(entry.offset)
            data = f.read(entry.size)
    except OSError as err:
        raise _bundle.corrupt(path, _KEY, f"it cannot be read ({_render.first_line(err)})") \
            from err
    if len(data) != entry.size:
        raise _bundle.corrupt(path, _KEY, f"{len(data)} of its {entry.size} bytes could be "
                              "read (the file is shorter than its index says)")
    return data


def _string_range(data: bytes, crc: int) -> tuple[int, int]:
    """(start, end) of the one element of a scalar string tensor's bytes, after checking
    its framing (varint64 length, masked crc32c of the length, the bytes) and checksums."""
    end = len(data)
    length, pos = _bundle.varint(data, 0, end)
    width = 4 if length <= 0xFFFFFFFF else 8  # TF checksums a length as uint32 when it fits
    length_crc = crc32c(length.to_bytes(width, "little"))
    if pos + 4 > end or int.from_bytes(data[pos:pos + 4], "little") != masked_crc32c(
            length_crc):
        raise _bundle.WireError("the checksum of its string length does not match")
    if pos + 4 + length != end:
        raise _bundle.WireError(f"its string of {length} bytes does not fill the entry's "
                                f"{end} bytes")
    if masked_crc32c(crc32c(data[pos:], length_crc)) != crc:
        raise _bundle.WireError("its bytes do not match their checksum (crc32c)")
    return pos + 4, end


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
    return Node(tuple(children), tuple(attributes), tuple(slots))


def _record(data: bytes, span: tuple, what: str, wires: tuple) -> list:
    """The fields 1..len(wires) of a small message: int32 (wire 0) or UTF-8 (wire 2), the
    proto3 default (0, "") when absent; each at most once; unknown fields skipped."""
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
    node_of: dict = {(): 0}
    for name in names:
        parts = tuple(name.split("/"))
        for depth in range(1, len(parts) + 1):
            if parts[:depth] not in node_of:
                node_of[parts[:depth]] = len(children)
                children[node_of[parts[:depth - 1]]].append(
                    Reference(len(children), parts[depth - 1]))
                children.append([])
                attributes.append([])
        path = "/".join(map(_paths.escape, parts))
        attributes[node_of[parts]].append(
            Attribute(_paths.VARIABLE_VALUE, name, _paths.checkpoint_key(path)))
    return Graph(tuple(Node(tuple(c), tuple(a)) for c, a in zip(children, attributes)))
