"""Fuzzing untrusted checkpoints: a codec, mutations, a worker pool, outcomes.

Shared by `tests/integration/test_fuzz.py` (a bounded run in the suite) and
`benchmarks/fuzz_checkpoints.py` (a long run that also scores plain TF).

* **Codec** (`Bundle`): an independent, pure-Python reader and writer of TF's checkpoint
  files; nothing here comes from objckpt. `prefix.index` is a LevelDB-style table (TF's
  tsl/lib/io/table): data blocks of prefix-compressed entries with a restart array, each
  block followed by a 5-byte trailer (compression type byte + masked crc32c of the block and
  that byte); an index block of block handles (varint64 offset, size); a 48-byte footer
  (metaindex and index handles as varints, zero-padded to 40 bytes, then the magic
  0xdb4775248b80fb57 little-endian). Key "" holds a `BundleHeaderProto`; every other key is
  a tensor name whose value is a `BundleEntryProto`. A string tensor's bytes in the data
  shard are varint64 lengths, a masked crc32c of the lengths (each as a little-endian
  uint32), then the strings; its entry's crc32c covers lengths (as uint32), the length
  checksum and the strings. Mutations edit a `Bundle` in structured form and write it back
  as a valid table (block checksums recomputed), recomputing tensor checksums where the
  mutation intends the crafted file to pass them.
* **Mutations** (`MUTATIONS`): named generators with a fixed seed, grouped into classes:
  random damage, crafted index, crafted object graph, files and directories.
* **Worker pool** (`Pool`): `tests/helpers/fuzz_worker.py` imports TF once and serves cases read as
  JSON lines; a crash (signal, abort) or a hang (no answer within the timeout) is recorded
  and the worker replaced by a standby that is already warm.
* **Outcomes** (`classify`): ok, typed, untyped, crash, hang, partial, silent,
  silent_undetectable, deleted_intact.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fuzz_worker.py")

OBJECT_GRAPH_KEY = b"_CHECKPOINTABLE_OBJECT_GRAPH"
MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
STATE_FILE = "checkpoint"
SAFETENSORS_FILE = "model.safetensors"

# Outcome classes.
OK, TYPED, UNTYPED, CRASH, HANG = "ok", "typed", "untyped", "crash", "hang"
PARTIAL, SILENT, UNDETECTABLE, DELETED = ("partial", "silent", "silent_undetectable",
                                          "deleted_intact")
NOT_RUN = "not_run"  # the bounded suite skips a case's other operations after a hang
OUTCOMES = (OK, TYPED, UNTYPED, CRASH, HANG, PARTIAL, SILENT, UNDETECTABLE, DELETED, NOT_RUN)
FAILURES = (CRASH, HANG, UNTYPED, PARTIAL, DELETED)  # never acceptable for objckpt


class CodecError(Exception):
    """The codec cannot parse a file (used as an oracle: the file is not intact)."""


# --- crc32c and varints --------------------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), table-driven; `crc` continues an earlier value."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def mask(crc: int) -> int:
    """LevelDB's masked crc: rotate right by 15 and add a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    return mask(crc32c(data))


def varint(value: int) -> bytes:
    """Unsigned LEB128; negative values as 64-bit two's complement (as protobuf does)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, pos: int, limit: int | None = None) -> tuple[int, int]:
    limit = len(data) if limit is None else limit
    result = shift = 0
    while True:
        if pos >= limit or shift > 63:
            raise CodecError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


# --- the table (prefix.index) -------------------------------------------------------

def encode_block(entries, restart_interval: int = 16) -> bytes:
    """A table block of (key, value) pairs in the order given (no sorting: mutations may
    write unsorted or duplicate keys)."""
    out = bytearray()
    restarts = []
    previous = b""
    for i, (key, value) in enumerate(entries):
        if i % restart_interval == 0:
            restarts.append(len(out))
            shared = 0
        else:
            shared = 0
            while (shared < len(previous) and shared < len(key)
                   and previous[shared] == key[shared]):
                shared += 1
        out += varint(shared) + varint(len(key) - shared) + varint(len(value))
        out += key[shared:] + value
        previous = key
    if not restarts:
        restarts.append(0)
    for r in restarts:
        out += struct.pack("<I", r)
    out += struct.pack("<I", len(restarts))
    return bytes(out)


def block_trailer(contents: bytes, compression: int = 0) -> bytes:
    return bytes([compression]) + struct.pack(
        "<I", masked_crc(contents + bytes([compression])))


def encode_footer(metaindex: tuple[int, int], index: tuple[int, int]) -> bytes:
    handles = varint(metaindex[0]) + varint(metaindex[1]) + varint(index[0]) + varint(index[1])
    return handles.ljust(40, b"\0")[:40] + struct.pack("<Q", MAGIC)


def short_successor(key: bytes) -> bytes:
    """LevelDB's BytewiseComparator::FindShortSuccessor (the last index key)."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def shortest_separator(start: bytes, limit: bytes) -> bytes:
    """LevelDB's FindShortestSeparator: a short key in [start, limit)."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n:
        byte = start[i]
        if byte < 0xFF and byte + 1 < limit[i]:
            return start[:i] + bytes([byte + 1])
    return start


def encode_table(entries, *, block_size: int = 262144, restart_interval: int = 16,
                 footer=None) -> bytes:
    """A complete table as TF's TableBuilder writes it: a data block is cut when its size
    estimate reaches block_size; an empty metaindex block; an index block (one handle per
    data block, keyed by a shortest separator); the footer. Entries are written in the
    order given (no sorting).

    `footer`, when given, is called with (metaindex_handle, index_handle, size so far) and
    returns the 48 footer bytes to write instead (crafted handles).
    """
    out = bytearray()
    groups, block, size = [], [], 0
    for key, value in entries:
        block.append((key, value))
        size += len(key) + len(value) + 3  # ~ the varint header of a short entry
        restarts = (len(block) + restart_interval - 1) // restart_interval
        if size + 4 * restarts + 4 >= block_size:
            groups.append(block)
            block, size = [], 0
    if block or not groups:
        groups.append(block)
    handles = []
    for group in groups:
        contents = encode_block(group, restart_interval)
        handles.append((len(out), len(contents)))
        out += contents + block_trailer(contents)
    index_entries = []
    for i, (group, handle) in enumerate(zip(groups, handles)):
        last = group[-1][0] if group else b""
        if i + 1 < len(groups):
            key = shortest_separator(last, groups[i + 1][0][0])
        else:
            key = short_successor(last)
        index_entries.append((key, varint(handle[0]) + varint(handle[1])))
    meta = encode_block([], 1)
    meta_handle = (len(out), len(meta))
    out += meta + block_trailer(meta)
    index = encode_block(index_entries, 1)
    index_handle = (len(out), len(index))
    out += index + block_trailer(index)
    if footer is None:
        out += encode_footer(meta_handle, index_handle)
    else:
        out += footer(meta_handle, index_handle, len(out))
    return bytes(out)


def decode_block(data: bytes) -> list[tuple[bytes, bytes]]:
    if len(data) < 4:
        raise CodecError("block shorter than its restart count")
    num_restarts = struct.unpack_from("<I", data, len(data) - 4)[0]
    end = len(data) - 4 - 4 * num_restarts
    if num_restarts < 1 or end < 0:
        raise CodecError("bad restart array")
    entries, pos, previous = [], 0, b""
    while pos < end:
        shared, pos = read_varint(data, pos, end)
        unshared, pos = read_varint(data, pos, end)
        length, pos = read_varint(data, pos, end)
        if shared > len(previous) or pos + unshared + length > end:
            raise CodecError("block entry out of bounds")
        key = previous[:shared] + data[pos:pos + unshared]
        pos += unshared
        value = data[pos:pos + length]
        pos += length
        entries.append((key, value))
        previous = key
    return entries


def _read_block(table: bytes, offset: int, size: int) -> bytes:
    if offset < 0 or size < 0 or offset + size + 5 > len(table):
        raise CodecError("block handle beyond the file")
    contents = table[offset:offset + size]
    kind = table[offset + size]
    crc = struct.unpack_from("<I", table, offset + size + 1)[0]
    if kind != 0:
        raise CodecError(f"compressed block (type {kind})")
    if masked_crc(contents + bytes([kind])) != crc:
        raise CodecError("block checksum mismatch")
    return contents


def data_block_handles(table: bytes) -> list[tuple[int, int]]:
    """The (offset, size) of each data block of a table, from its index block."""
    if len(table) < FOOTER_SIZE:
        raise CodecError("shorter than a footer")
    footer = table[-FOOTER_SIZE:]
    if struct.unpack_from("<Q", footer, 40)[0] != MAGIC:
        raise CodecError("bad magic")
    pos = 0
    _meta_offset, pos = read_varint(footer, pos, 40)
    _meta_size, pos = read_varint(footer, pos, 40)
    index_offset, pos = read_varint(footer, pos, 40)
    index_size, pos = read_varint(footer, pos, 40)
    handles = []
    for _, handle in decode_block(_read_block(table, index_offset, index_size)):
        offset, p = read_varint(handle, 0)
        size, _ = read_varint(handle, p)
        handles.append((offset, size))
    return handles


def decode_table(table: bytes) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a table, in file order; CodecError when anything is off."""
    entries = []
    for offset, size in data_block_handles(table):
        entries.extend(decode_block(_read_block(table, offset, size)))
    return entries


# --- protos (TF's own message classes; imported on first use) -------------------------

def _pb():
    from tensorflow.core.protobuf import tensor_bundle_pb2, trackable_object_graph_pb2

    return tensor_bundle_pb2, trackable_object_graph_pb2


def entry_proto(value: bytes = b""):
    message = _pb()[0].BundleEntryProto()
    message.ParseFromString(value)
    return message


def header_proto(value: bytes = b""):
    message = _pb()[0].BundleHeaderProto()
    message.ParseFromString(value)
    return message


def graph_proto(value: bytes = b""):
    message = _pb()[1].TrackableObjectGraph()
    message.ParseFromString(value)
    return message


# --- string tensors -----------------------------------------------------------------

def encode_strings(strings: list[bytes]) -> tuple[bytes, int]:
    """(bytes in the data shard, the entry's masked crc32c) of a string tensor."""
    lengths = b"".join(varint(len(s)) for s in strings)
    crc = 0
    for s in strings:
        crc = crc32c(struct.pack("<I", len(s)) if len(s) <= 0xFFFFFFFF
                     else struct.pack("<Q", len(s)), crc)
    length_crc = struct.pack("<I", mask(crc))
    crc = crc32c(length_crc, crc)
    for s in strings:
        crc = crc32c(s, crc)
    return lengths + length_crc + b"".join(strings), mask(crc)


def decode_strings(raw: bytes, count: int) -> list[bytes]:
    pos, lengths = 0, []
    for _ in range(count):
        n, pos = read_varint(raw, pos)
        lengths.append(n)
    if pos + 4 > len(raw):
        raise CodecError("string tensor shorter than its length checksum")
    crc = 0
    for n in lengths:
        crc = crc32c(struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n), crc)
    if struct.unpack_from("<I", raw, pos)[0] != mask(crc):
        raise CodecError("string length checksum mismatch")
    pos += 4
    out = []
    for n in lengths:
        if pos + n > len(raw):
            raise CodecError("string beyond its tensor")
        out.append(raw[pos:pos + n])
        pos += n
    return out


# --- a checkpoint in structured form --------------------------------------------------

def shard_suffix(shard: int, total: int) -> str:
    return f".data-{shard:05d}-of-{total:05d}"


class Bundle:
    """One checkpoint: ordered index entries (raw key and value bytes, header included)
    and its data shards, keyed by file suffix (`.data-00000-of-00001`)."""

    def __init__(self, entries, shards):
        self.entries = [list(e) for e in entries]
        self.shards = dict(shards)

    @classmethod
    def read(cls, prefix: str) -> Bundle:
        with open(prefix + ".index", "rb") as f:
            entries = decode_table(f.read())
        directory, base = os.path.split(prefix)
        shards = {}
        for name in sorted(os.listdir(directory or ".")):
            if name.startswith(base + ".data-") and re.fullmatch(
                    r"\.data-\d{5}-of-\d{5}", name[len(base):]):
                with open(os.path.join(directory, name), "rb") as f:
                    shards[name[len(base):]] = f.read()
        return cls(entries, shards)

    def copy(self) -> Bundle:
        return Bundle(self.entries, self.shards)

    def write(self, prefix: str, **table_options) -> None:
        for name in list(os.listdir(os.path.dirname(prefix) or ".")):
            if name.startswith(os.path.basename(prefix) + ".data-"):
                os.remove(os.path.join(os.path.dirname(prefix), name))
        for suffix, data in self.shards.items():
            with open(prefix + suffix, "wb") as f:
                f.write(data)
        with open(prefix + ".index", "wb") as f:
            f.write(encode_table([tuple(e) for e in self.entries], **table_options))

    # structured access
    def names(self) -> list[bytes]:
        return [k for k, _ in self.entries]

    def tensor_keys(self) -> list[bytes]:
        return [k for k, _ in self.entries if k and k != OBJECT_GRAPH_KEY]

    def _find(self, key: bytes) -> int:
        for i, (k, _) in enumerate(self.entries):
            if k == key:
                return i
        raise KeyError(key)

    def value(self, key: bytes) -> bytes:
        return self.entries[self._find(key)][1]

    def set_value(self, key: bytes, value: bytes) -> None:
        self.entries[self._find(key)][1] = value

    def header(self):
        return header_proto(self.value(b""))

    def set_header(self, header) -> None:
        self.set_value(b"", header.SerializeToString())

    def entry(self, key: bytes):
        return entry_proto(self.value(key))

    def set_entry(self, key: bytes, entry) -> None:
        self.set_value(key, entry.SerializeToString())

    def shard_data(self, shard: int = 0) -> bytes:
        return self.shards[self._shard_name(shard)]

    def _shard_name(self, shard: int) -> str:
        names = sorted(self.shards)
        return names[shard]

    def tensor_bytes(self, key: bytes) -> bytes:
        e = self.entry(key)
        data = self.shard_data(e.shard_id)
        if e.offset + e.size > len(data):
            raise CodecError(f"{key!r}: bytes beyond the shard")
        return data[e.offset:e.offset + e.size]

    def put_tensor(self, key: bytes, raw: bytes, crc: int | None = None) -> None:
        """Appends `raw` to shard 0 and points the entry at it (size, offset, crc)."""
        e = self.entry(key)
        name = self._shard_name(0)
        e.shard_id = 0
        e.offset = len(self.shards[name])
        e.size = len(raw)
        e.crc32c = masked_crc(raw) if crc is None else crc
        self.shards[name] = self.shards[name] + raw
        self.set_entry(key, e)

    def graph_bytes(self) -> bytes:
        return decode_strings(self.tensor_bytes(OBJECT_GRAPH_KEY), 1)[0]

    def graph(self):
        return graph_proto(self.graph_bytes())

    def set_graph(self, graph) -> None:
        raw, crc = encode_strings([graph if isinstance(graph, bytes)
                                   else graph.SerializeToString()])
        self.put_tensor(OBJECT_GRAPH_KEY, raw, crc)


def element_count(entry) -> int:
    n = 1
    for d in entry.shape.dim:
        n *= d.size
    return n


_DTYPE_SIZES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 8: 8, 9: 8, 10: 1, 14: 2, 17: 2,
                18: 16, 19: 2, 22: 4, 23: 8}


def tensor_summary(bundle: Bundle) -> dict:
    """key -> (dtype, shape, sha1 of bytes) for every tensor, checking every entry against
    the oracle's rules (parses, checksum, size consistent with shape, in range); raises
    CodecError otherwise. Two checkpoints with equal summaries hold the same values."""
    out = {}
    keys = bundle.names()
    if b"" not in keys:
        raise CodecError("no header entry")
    if keys != sorted(set(keys)):
        raise CodecError("keys unsorted or duplicated")
    header = bundle.header()
    if header.num_shards != len(bundle.shards):
        raise CodecError("num_shards disagrees with the data files")
    for key in bundle.names():
        if not key:
            continue
        try:
            e = bundle.entry(key)
        except Exception as err:  # protobuf DecodeError
            raise CodecError(f"{key!r}: entry does not parse: {err}") from err
        if e.shard_id >= header.num_shards:  # (slices: TF reads a full slice as whole)
            raise CodecError(f"{key!r}: shard out of range")
        if any(d.size < 0 for d in e.shape.dim):
            raise CodecError(f"{key!r}: negative dim")
        raw = bundle.tensor_bytes(key)
        if e.dtype == 7:
            strings = decode_strings(raw, element_count(e))
            if encode_strings(strings) != (raw, e.crc32c):
                raise CodecError(f"{key!r}: string tensor checksum or layout")
        else:
            if e.dtype not in _DTYPE_SIZES:
                raise CodecError(f"{key!r}: dtype {e.dtype}")
            if element_count(e) * _DTYPE_SIZES[e.dtype] != len(raw):
                raise CodecError(f"{key!r}: size inconsistent with shape")
            if masked_crc(raw) != e.crc32c:
                raise CodecError(f"{key!r}: checksum mismatch")
        out[key] = (e.dtype, tuple(d.size for d in e.shape.dim),
                    hashlib.sha1(raw).hexdigest())
    if OBJECT_GRAPH_KEY in out and out[OBJECT_GRAPH_KEY][:2] != (7, ()):
        raise CodecError("object graph is not a scalar string")
    return out


def equivalent(prefix: str, original: str) -> bool:
    """Whether `prefix` reads as exactly `original`'s tensors, each intact (checksums,
    layout): the oracle for "nothing that matters changed". Never reads special files."""
    for path in (prefix + ".index", prefix + ".data-00000-of-00001"):
        if os.path.islink(path) or not os.path.isfile(path):
            return False
    try:
        return tensor_summary(Bundle.read(prefix)) == tensor_summary(Bundle.read(original))
    except (CodecError, KeyError, OSError, IndexError, struct.error):
        return False
    except Exception as err:  # a protobuf DecodeError of the header
        if type(err).__name__ == "DecodeError":
            return False
        raise


# --- the `checkpoint` state file -------------------------------------------------------

def state_text(names: list[str]) -> bytes:
    """A state file in TF's text format listing `names` (oldest first)."""
    lines = [f'model_checkpoint_path: "{names[-1]}"'] if names else []
    lines += [f'all_model_checkpoint_paths: "{n}"' for n in names]
    return ("\n".join(lines) + "\n").encode()


def parse_state(data: bytes) -> list[str] | None:
    """The names a state file lists (its newest last), or None when it is not clean text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    newest, names = None, []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.fullmatch(r'\s*(model_checkpoint_path|all_model_checkpoint_paths|'
                         r'all_model_checkpoint_timestamps|last_preserved_timestamp)'
                         r'\s*:\s*(".*"|[-+0-9.e]+)\s*', line)
        if m is None:
            return None
        if m.group(1) == "model_checkpoint_path":
            newest = m.group(2).strip('"')
        elif m.group(1) == "all_model_checkpoint_paths":
            names.append(m.group(2).strip('"'))
    if newest is None:
        return None
    return [n for n in names if n != newest] + [newest]


# --- bases -------------------------------------------------------------------------

# kind -> (what it is, "prefix" or "dir", the `at` to restore with)
BASES = {
    "keras": ("Keras conv + BatchNorm + Dense, one Adam step, objckpt.save(model)", "prefix",
              None),
    "keras_tf": ("the same model, tf.train.Checkpoint(model=m, optimizer=opt).write", "prefix",
                 "model"),
    "module": ("tf.train.Checkpoint(model=tf.Module, optimizer=TF1 Adam with slots), "
               "objckpt.save", "prefix", None),
    "manager": ("tf.train.CheckpointManager directory of a tf.Module (max_to_keep=3)", "dir",
                "model"),
    "fit": ("callbacks.Checkpointing directory: 2-epoch fit, save every batch, max_to_keep=3",
            "dir", "model"),
    # safetensors: one file, its tensors named by the module base's object paths
    "safetensors": ("the module base's values written by the safetensors library",
                    "file", None),
}
PREFIX_BASES = [k for k, v in BASES.items() if v[1] == "prefix"]
DIR_BASES = [k for k, v in BASES.items() if v[1] == "dir"]


def base_prefix(bases: str, kind: str) -> str:
    """The prefix of a prefix base, the directory of a directory base, or the file of a
    file base."""
    if BASES[kind][1] == "dir":
        return os.path.join(bases, kind)
    if BASES[kind][1] == "file":
        return os.path.join(bases, kind, SAFETENSORS_FILE)
    return os.path.join(bases, kind, "ckpt")


def checkpoint_numbers(directory: str) -> list[int]:
    out = set()
    for name in os.listdir(directory):
        m = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if m:
            out.add(int(m.group(1)))
    return sorted(out)


# --- mutations ---------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    """One mutated checkpoint, written under `root` (a fresh copy of a base)."""

    mutation: str
    group: str
    base: str
    seed: int
    root: str  # the case's folder
    target: str  # the prefix (prefix bases) or directory (directory bases) operated on
    original: str  # the base's prefix or directory
    undetectable: bool = False
    equivalent: bool | None = None  # prefix: reads as the original (oracle)
    intact_before: tuple = ()  # directories: ckpt numbers reading as the original's
    listed: tuple = ()  # directories: ckpt numbers the (mutated) state file lists
    judge_values: bool = True
    verify_may_pass: bool = False
    note: str = ""


@dataclasses.dataclass
class Mutation:
    name: str
    group: str
    bases: tuple
    apply: object  # callable(ctx) -> optional note
    ops: tuple  # operations that exercise it (the suite picks some of them)
    undetectable: bool = False
    judge_values: bool = True  # False: the mutation changes what the values mean
    verify_may_pass: bool = False  # the files are consistent: verify may call them intact
    seeds: int = 1  # random damage: seeds per base in the bounded test
    bench_only: bool = False
    suite_bases: tuple = ()  # bases of the bounded test (default: see plan_cases)
    regression: str = ""  # the failure it reproduces, measured before the hardening


class Ctx:
    """What a mutation function works on: the case, a seeded rng, helpers."""

    def __init__(self, case: Case, rng: random.Random):
        self.case, self.rng = case, rng

    # prefix bases: the prefix; directory bases: the newest checkpoint in the directory
    @property
    def prefix(self) -> str:
        if os.path.isdir(self.case.target):
            return os.path.join(self.case.target, f"ckpt-{self.newest}")
        return self.case.target

    @property
    def newest(self) -> int:
        return checkpoint_numbers(self.case.target)[-1]

    @property
    def directory(self) -> str:
        return self.case.target

    def bundle(self) -> Bundle:
        return Bundle.read(self.prefix)

    def write(self, bundle: Bundle, **options) -> None:
        bundle.write(self.prefix, **options)

    def variable_keys(self, bundle: Bundle) -> list[bytes]:
        return [k for k in bundle.tensor_keys() if b"/.ATTRIBUTES/VARIABLE_VALUE" in k]

    def numeric_keys(self, bundle: Bundle, min_elements: int = 1) -> list[bytes]:
        out = []
        for k in self.variable_keys(bundle):
            e = bundle.entry(k)
            if e.dtype != 7 and element_count(e) >= min_elements:
                out.append(k)
        return out

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]


MUTATIONS: dict[str, Mutation] = {}

PREFIX_OPS = ("restore", "read_tree", "verify", "plan", "diff", "migrate", "cli_inspect",
              "cli_verify")
DIR_OPS = ("restore_dir", "verify", "read_tree", "cli_inspect", "resume")
FILE_OPS = ("restore", "verify", "plan", "migrate", "cli_inspect", "cli_verify")
TF_OP = "tf_read"  # plain TF, benchmark only


def mutation(name, group, bases, ops, **kw):
    def register(fn):
        MUTATIONS[name] = Mutation(name, group, tuple(bases), fn, tuple(ops), **kw)
        return fn
    return register


# random damage ------------------------------------------------------------------------

def _damage(data: bytes, kind: str, rng: random.Random) -> bytes:
    data = bytearray(data)
    n = len(data)
    if kind == "bitflip":
        for _ in range(rng.choice((1, 1, 2, 8))):
            i = rng.randrange(n)
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[:rng.randrange(n)]
    elif kind == "junk":
        data += bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100, 4096))))
    elif kind == "zero_fill":
        start = rng.randrange(n)
        length = min(n - start, rng.choice((1, 4, 16, 64, 1024)))
        data[start:start + length] = bytes(length)
    return bytes(data)


def _damage_file(path: str, kind: str, rng: random.Random) -> None:
    with open(path, "rb") as f:
        data = f.read()
    for _ in range(100):  # a change that changes nothing is no mutation
        damaged = _damage(data, kind, rng)
        if damaged != data:
            break
    with open(path, "wb") as f:
        f.write(damaged)


for _kind in ("bitflip", "truncate", "junk", "zero_fill"):
    for _file in ("index", "data"):
        def _fn(ctx, _kind=_kind, _file=_file):
            suffix = ".index" if _file == "index" else ".data-00000-of-00001"
            _damage_file(ctx.prefix + suffix, _kind, ctx.rng)
        mutation(f"damage.{_file}.{_kind}", "damage",
                 ("keras", "module", "keras_tf", "manager", "fit"), PREFIX_OPS + DIR_OPS,
                 seeds=1)(_fn)

    def _state_fn(ctx, _kind=_kind):
        _damage_file(os.path.join(ctx.directory, STATE_FILE), _kind, ctx.rng)
    mutation(f"damage.state.{_kind}", "damage", ("manager", "fit"), DIR_OPS, seeds=2)(_state_fn)


# crafted index -------------------------------------------------------------------------

def _edit_entry(edit, *, numeric=True, graph=False):
    """A mutation editing one entry's BundleEntryProto (checksums of the table only)."""
    def fn(ctx):
        b = ctx.bundle()
        key = OBJECT_GRAPH_KEY if graph else ctx.pick(ctx.numeric_keys(b) if numeric
                                                       else ctx.variable_keys(b))
        e = b.entry(key)
        edit(e, b, ctx)
        b.set_entry(key, e)
        ctx.write(b)
        return key.decode()
    return fn


def _set_dims(*dims):
    def edit(e, b, ctx):
        del e.shape.dim[:]
        for d in dims:
            e.shape.dim.add().size = d
    return edit


def _set(field, value):
    def edit(e, b, ctx):
        setattr(e, field, value(e, b) if callable(value) else value)
    return edit


CRAFT_OPS = PREFIX_OPS
_CRAFT_BASES = ("keras", "module", "keras_tf")


@mutation("index.entry_unparseable", "index", _CRAFT_BASES, CRAFT_OPS,
          regression="checkpoint_reader.cc:122 Check failed: entry.ParseFromString")
def _unparseable(ctx):
    b = ctx.bundle()
    key = ctx.pick(ctx.numeric_keys(b))
    b.set_value(key, b"\x12\x50abc")  # field 2 (shape), length 80, 3 bytes follow
    ctx.write(b)
    return key.decode()


mutation("index.dim_negative", "index", _CRAFT_BASES, CRAFT_OPS,
         regression="tensor_shape.cc:416 Check failed: size >= 0")(
    _edit_entry(_set_dims(-1, 4)))
mutation("index.dim_minus_two", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set_dims(-2)))
mutation("index.dims_overflow", "index", _CRAFT_BASES, CRAFT_OPS,
         regression="tensor_shape.cc:424 Check failed: 0 <= new_num_elements")(
    _edit_entry(_set_dims(1 << 40, 1 << 40)))
mutation("index.dims_huge", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set_dims(1 << 31, 1 << 30)))
mutation("index.dims_many", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set_dims(*([1] * 300))))
mutation("index.dtype_1000", "index", _CRAFT_BASES, CRAFT_OPS,
         regression="TypeError: 1000 does not correspond to a valid DataType")(
    _edit_entry(_set("dtype", 1000)))
mutation("index.dtype_0", "index", _CRAFT_BASES, CRAFT_OPS)(_edit_entry(_set("dtype", 0)))
mutation("index.dtype_resource", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("dtype", 20)))
mutation("index.dtype_variant", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("dtype", 21)))
mutation("index.dtype_string", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("dtype", 7)))
mutation("index.offset_beyond_shard", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("offset", lambda e, b: len(b.shard_data(0)) + 16)))
mutation("index.offset_huge", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("offset", 1 << 62)))
mutation("index.size_beyond_shard", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("size", lambda e, b: len(b.shard_data(0)) * 4)))
mutation("index.size_huge", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("size", 1 << 62)))
mutation("index.shard_id_out_of_range", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("shard_id", 5)))
mutation("index.shard_id_negative", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("shard_id", -1)))


def _size_inconsistent(delta):
    def edit(e, b, ctx):
        data = b.shard_data(0)
        e.size = max(0, min(e.size + delta, len(data) - e.offset))
        e.crc32c = masked_crc(data[e.offset:e.offset + e.size])
    return edit


mutation("index.size_smaller_than_shape", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_size_inconsistent(-4)))
mutation("index.size_larger_than_shape", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_size_inconsistent(+4)))


@mutation("index.shape_mismatch_size_consistent", "index", _CRAFT_BASES, CRAFT_OPS,
          verify_may_pass=True)
def _reshape(ctx):
    """A (n,) entry made (1, n): shape and bytes agree, the obj's variable does not."""
    b = ctx.bundle()
    key = ctx.pick(ctx.numeric_keys(b))
    e = b.entry(key)
    n = element_count(e)
    del e.shape.dim[:]
    e.shape.dim.add().size = 1
    e.shape.dim.add().size = n
    b.set_entry(key, e)
    ctx.write(b)
    return key.decode()


mutation("index.crc_wrong", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("crc32c", lambda e, b: (e.crc32c + 1) & 0xFFFFFFFF)))


@mutation("index.slices", "index", _CRAFT_BASES, CRAFT_OPS)
def _slices(ctx):
    b = ctx.bundle()
    key = ctx.pick(ctx.numeric_keys(b))
    e = b.entry(key)
    s = e.slices.add()
    for _ in e.shape.dim:
        s.extent.add()
    b.set_entry(key, e)
    ctx.write(b)
    return key.decode()


@mutation("index.graph_shape_2e32p1", "index", _CRAFT_BASES, CRAFT_OPS,
          regression="SIGSEGV: object-graph entry of shape (2^32+1,)")
def _graph_shape(ctx):
    b = ctx.bundle()
    e = b.entry(OBJECT_GRAPH_KEY)
    e.shape.dim.add().size = (1 << 32) + 1
    b.set_entry(OBJECT_GRAPH_KEY, e)
    ctx.write(b)


mutation("index.graph_shape_vector", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set_dims(2), graph=True))
mutation("index.graph_dtype_float", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("dtype", 1), graph=True))
mutation("index.graph_dtype_int64", "index", _CRAFT_BASES, CRAFT_OPS)(
    _edit_entry(_set("dtype", 9), graph=True))


# No object graph: a name-based checkpoint, which verify may pass.
@mutation("index.graph_entry_missing", "index", _CRAFT_BASES, CRAFT_OPS, verify_may_pass=True)
def _graph_missing(ctx):
    b = ctx.bundle()
    b.entries = [e for e in b.entries if e[0] != OBJECT_GRAPH_KEY]
    ctx.write(b)


def _footer(make):
    def fn(ctx):
        b = ctx.bundle()
        b.write(ctx.prefix, footer=make)
    return fn


mutation("index.footer_beyond_file", "index", _CRAFT_BASES, CRAFT_OPS,
         regression="IndexError: Read less bytes than requested")(
    _footer(lambda meta, index, size: encode_footer(meta, (size + 100, index[1]))))
mutation("index.footer_size_beyond_file", "index", _CRAFT_BASES, CRAFT_OPS)(
    _footer(lambda meta, index, size: encode_footer(meta, (index[0], index[1] + 1000))))
mutation("index.footer_huge", "index", _CRAFT_BASES, CRAFT_OPS,
         regression="MemoryError: footer sizes of 2^62")(
    _footer(lambda meta, index, size: encode_footer((meta[0], 1 << 62), (index[0], 1 << 62))))
mutation("index.footer_meta_huge", "index", _CRAFT_BASES, CRAFT_OPS)(
    _footer(lambda meta, index, size: encode_footer((1 << 62, 1 << 62), index)))
mutation("index.footer_overlong_varint", "index", _CRAFT_BASES, CRAFT_OPS)(
    _footer(lambda meta, index, size: b"\xff" * 40 + struct.pack("<Q", MAGIC)))


@mutation("index.header_missing", "index", _CRAFT_BASES, CRAFT_OPS)
def _header_missing(ctx):
    b = ctx.bundle()
    b.entries = [e for e in b.entries if e[0] != b""]
    ctx.write(b)


@mutation("index.header_unparseable", "index", _CRAFT_BASES, CRAFT_OPS)
def _header_unparseable(ctx):
    b = ctx.bundle()
    b.set_value(b"", b"\x1a\x40\x08")
    ctx.write(b)


def _header_edit(edit):
    def fn(ctx):
        b = ctx.bundle()
        h = b.header()
        edit(h)
        b.set_header(h)
        ctx.write(b)
    return fn


mutation("index.num_shards_0", "index", _CRAFT_BASES, CRAFT_OPS)(
    _header_edit(lambda h: setattr(h, "num_shards", 0)))
mutation("index.num_shards_huge", "index", _CRAFT_BASES, CRAFT_OPS)(
    _header_edit(lambda h: setattr(h, "num_shards", (1 << 31) - 1)))
mutation("index.num_shards_negative", "index", _CRAFT_BASES, CRAFT_OPS)(
    _header_edit(lambda h: setattr(h, "num_shards", -3)))
mutation("index.version_future", "index", _CRAFT_BASES, CRAFT_OPS)(
    _header_edit(lambda h: setattr(h.version, "min_consumer", 1 << 30)))
# Big-endian data is read byte-swapped: a change of meaning, not damage.
mutation("index.endianness_big", "index", _CRAFT_BASES, CRAFT_OPS, judge_values=False)(
    _header_edit(lambda h: setattr(h, "endianness", 1)))


@mutation("index.keys_unsorted", "index", _CRAFT_BASES, CRAFT_OPS)
def _unsorted(ctx):
    b = ctx.bundle()
    i = ctx.rng.randrange(1, len(b.entries) - 1)
    b.entries[i], b.entries[i + 1] = b.entries[i + 1], b.entries[i]
    ctx.write(b)
    return b.entries[i][0].decode()


@mutation("index.keys_reversed", "index", _CRAFT_BASES, CRAFT_OPS)
def _reversed(ctx):
    b = ctx.bundle()
    b.entries = b.entries[:1] + b.entries[1:][::-1]
    ctx.write(b)


@mutation("index.key_duplicate", "index", _CRAFT_BASES, CRAFT_OPS)
def _duplicate(ctx):
    """The same key twice in a row, the second pointing at another tensor's bytes."""
    b = ctx.bundle()
    keys = ctx.numeric_keys(b)
    key = ctx.pick(keys)
    i = b._find(key)
    other = b.entry(ctx.pick(keys))
    b.entries.insert(i + 1, [key, other.SerializeToString()])
    ctx.write(b)
    return key.decode()


# An extra entry no attribute names: values must restore; verify may pass it.
@mutation("index.key_not_utf8", "index", _CRAFT_BASES, CRAFT_OPS, verify_may_pass=True)
def _not_utf8(ctx):
    b = ctx.bundle()
    key = ctx.pick(ctx.numeric_keys(b))
    b.entries.append([b"\xff\xfe/.ATTRIBUTES/VARIABLE_VALUE", b.value(key)])
    ctx.write(b)


@mutation("index.small_blocks", "index", _CRAFT_BASES, CRAFT_OPS)
def _small_blocks(ctx):
    """Nothing changed but the table's layout (one entry per block): must read as before."""
    ctx.write(ctx.bundle(), block_size=1, restart_interval=1)


def _swap_offsets(same_shape: bool):
    def fn(ctx):
        b = ctx.bundle()
        groups = collections.defaultdict(list)
        for k in ctx.numeric_keys(b, 2):
            e = b.entry(k)
            groups[(e.dtype, tuple(d.size for d in e.shape.dim))].append(k)
        if same_shape:
            pairs = [g for g in groups.values() if len(g) >= 2]
            g = ctx.pick(pairs)
            k1, k2 = ctx.rng.sample(g, 2)
            # unequal values, or the swap changes nothing
            tries = 0
            while b.tensor_bytes(k1) == b.tensor_bytes(k2) and tries < 20:
                g = ctx.pick(pairs)
                k1, k2 = ctx.rng.sample(g, 2)
                tries += 1
        else:
            shapes = list(groups)
            s1, s2 = ctx.rng.sample(shapes, 2)
            k1, k2 = ctx.pick(groups[s1]), ctx.pick(groups[s2])
        e1, e2 = b.entry(k1), b.entry(k2)
        for field in ("shard_id", "offset", "size", "crc32c"):
            v1, v2 = getattr(e1, field), getattr(e2, field)
            setattr(e1, field, v2)
            setattr(e2, field, v1)
        b.set_entry(k1, e1)
        b.set_entry(k2, e2)
        ctx.write(b)
        return f"{k1.decode()} <-> {k2.decode()}"
    return fn


# Undetectable: two same-shape entries pointing at each other's bytes (checksums moved too).
mutation("index.swap_offsets_same_shape", "index", ("keras", "module"), CRAFT_OPS,
         undetectable=True)(_swap_offsets(True))
mutation("index.swap_offsets_diff_shape", "index", _CRAFT_BASES, CRAFT_OPS)(
    _swap_offsets(False))


# crafted object graph ------------------------------------------------------------------

GRAPH_OPS = PREFIX_OPS


def _graph_edit(edit):
    def fn(ctx):
        b = ctx.bundle()
        g = b.graph()
        note = edit(g, ctx)
        b.set_graph(g)
        ctx.write(b)
        return note
    return fn


def _nodes_with_children(g):
    return [i for i, n in enumerate(g.nodes) if n.children]


def _variable_nodes(g):
    return [i for i, n in enumerate(g.nodes)
            if any(a.name == "VARIABLE_VALUE" for a in n.attributes)]


def _child_id(value):
    def edit(g, ctx):
        i = ctx.pick(_nodes_with_children(g))
        child = ctx.pick(list(g.nodes[i].children))
        child.node_id = value(g) if callable(value) else value
        return f"node {i} child {child.local_name!r} -> {child.node_id}"
    return edit


mutation("graph.node_id_large", "graph", _CRAFT_BASES, GRAPH_OPS,
         regression="IndexError: list index out of range (node id out of range)")(
    _graph_edit(_child_id(1_000_000)))
mutation("graph.node_id_len", "graph", _CRAFT_BASES, GRAPH_OPS)(
    _graph_edit(_child_id(lambda g: len(g.nodes))))
mutation("graph.node_id_minus_two", "graph", _CRAFT_BASES, GRAPH_OPS,
         regression="node id -2 resolved through Python negative indexing")(
    _graph_edit(_child_id(-2)))
mutation("graph.node_id_minus_one", "graph", _CRAFT_BASES, GRAPH_OPS)(
    _graph_edit(_child_id(-1)))


@mutation("graph.empty", "graph", _CRAFT_BASES, GRAPH_OPS,
          regression="IndexError: list index out of range (empty graph)")
def _empty(ctx):
    b = ctx.bundle()
    b.set_graph(graph_proto())
    ctx.write(b)


@mutation("graph.unparseable", "graph", _CRAFT_BASES, GRAPH_OPS)
def _graph_unparseable(ctx):
    b = ctx.bundle()
    b.set_graph(b"\x0a\x50\x12\x03abc")
    ctx.write(b)


def _string_length(declared):
    """The object graph tensor's declared string length set to `declared(actual)`, its
    length checksum and the entry's checksum recomputed (only the length is wrong)."""
    def fn(ctx):
        b = ctx.bundle()
        data = b.graph_bytes()
        n = declared(len(data))
        size = struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n)
        crc = crc32c(size)
        length_crc = struct.pack("<I", mask(crc))
        crc = crc32c(data, crc32c(length_crc, crc))
        b.put_tensor(OBJECT_GRAPH_KEY, varint(n) + length_crc + data, mask(crc))
        ctx.write(b)
        return f"declared {n} for {len(data)} bytes"
    return fn


mutation("graph.string_length_huge", "graph", _CRAFT_BASES, GRAPH_OPS)(
    _string_length(lambda n: 1 << 40))
mutation("graph.string_length_short", "graph", _CRAFT_BASES, GRAPH_OPS)(
    _string_length(lambda n: n // 2))


@mutation("graph.drop_node", "graph", _CRAFT_BASES, GRAPH_OPS,
          regression="IndexError: list index out of range (a dropped node)")
def _drop_node(ctx):
    b = ctx.bundle()
    g = b.graph()
    i = ctx.rng.randrange(1, len(g.nodes))
    del g.nodes[i]
    b.set_graph(g)
    ctx.write(b)
    return f"node {i}"


@mutation("graph.duplicate_child_name", "graph", _CRAFT_BASES, GRAPH_OPS,
          regression="partial restore: a second child edge with its first child's name")
def _dup_child(ctx):
    """A node with >= 2 children gets a second edge named like its first child, pointing
    at its second child."""
    b = ctx.bundle()
    g = b.graph()
    candidates = [i for i, n in enumerate(g.nodes) if len(n.children) >= 2]
    i = ctx.pick(candidates)
    node = g.nodes[i]
    first, second = node.children[0], node.children[1]
    extra = node.children.add()
    extra.node_id = second.node_id
    extra.local_name = first.local_name
    b.set_graph(g)
    ctx.write(b)
    return f"node {i}: second {first.local_name!r} -> {second.node_id}"


@mutation("graph.duplicate_child_same_target", "graph", _CRAFT_BASES, GRAPH_OPS,
          verify_may_pass=True)
def _dup_child_same(ctx):
    b = ctx.bundle()
    g = b.graph()
    i = ctx.pick(_nodes_with_children(g))
    first = g.nodes[i].children[0]
    extra = g.nodes[i].children.add()
    extra.CopyFrom(first)
    b.set_graph(g)
    ctx.write(b)


def _attribute_pairs(g, b, same_shape):
    out = []
    attrs = [(i, a) for i, n in enumerate(g.nodes) for a in n.attributes
             if a.name == "VARIABLE_VALUE" and a.checkpoint_key.encode() in b.names()]
    meta = {}
    for i, a in attrs:
        e = b.entry(a.checkpoint_key.encode())
        meta[(i, a.checkpoint_key)] = (e.dtype, tuple(d.size for d in e.shape.dim),
                                       b.tensor_bytes(a.checkpoint_key.encode()))
    for x in range(len(attrs)):
        for y in range(x + 1, len(attrs)):
            mx = meta[(attrs[x][0], attrs[x][1].checkpoint_key)]
            my = meta[(attrs[y][0], attrs[y][1].checkpoint_key)]
            if same_shape and mx[:2] == my[:2] and mx[2] != my[2]:
                out.append((attrs[x][1], attrs[y][1]))
            if not same_shape and mx[:2] != my[:2]:
                out.append((attrs[x][1], attrs[y][1]))
    return out


def _swap_keys(same_shape):
    def fn(ctx):
        b = ctx.bundle()
        g = b.graph()
        a1, a2 = ctx.pick(_attribute_pairs(g, b, same_shape))
        a1.checkpoint_key, a2.checkpoint_key = a2.checkpoint_key, a1.checkpoint_key
        b.set_graph(g)
        ctx.write(b)
        return f"{a1.checkpoint_key} <-> {a2.checkpoint_key}"
    return fn


# Without a model, verify cannot see shapes disagree; restore must refuse all of it.
mutation("graph.swap_keys_diff_shape", "graph", _CRAFT_BASES, GRAPH_OPS, verify_may_pass=True,
         regression="partial restore: checkpoint keys of two attributes swapped")(
    _swap_keys(False))
# Same shapes: the keys no longer name their node's path, which a reader can check.
mutation("graph.swap_keys_same_shape", "graph", ("keras", "module"), GRAPH_OPS,
         verify_may_pass=True)(
    _swap_keys(True))


@mutation("graph.attribute_key_missing", "graph", _CRAFT_BASES, GRAPH_OPS)
def _key_missing(ctx):
    b = ctx.bundle()
    g = b.graph()
    i = ctx.pick(_variable_nodes(g))
    attr = next(a for a in g.nodes[i].attributes if a.name == "VARIABLE_VALUE")
    attr.checkpoint_key = attr.checkpoint_key.replace("/.ATTRIBUTES/", "/missing/.ATTRIBUTES/")
    b.set_graph(g)
    ctx.write(b)
    return attr.checkpoint_key


@mutation("graph.attribute_two_nodes_one_key", "graph", _CRAFT_BASES, GRAPH_OPS)
def _key_shared(ctx):
    b = ctx.bundle()
    g = b.graph()
    attrs = [a for n in g.nodes for a in n.attributes if a.name == "VARIABLE_VALUE"]
    a1, a2 = ctx.rng.sample(attrs, 2)
    a2.checkpoint_key = a1.checkpoint_key
    b.set_graph(g)
    ctx.write(b)
    return a1.checkpoint_key


def _slot_edit(field, value):
    def edit(g, ctx):
        slots = [(i, s) for i, n in enumerate(g.nodes) for s in n.slot_variables]
        if not slots:
            raise NotApplicable("no slot variables in this base")
        i, s = ctx.pick(slots)
        setattr(s, field, value)
        return f"node {i} slot {s.slot_name} {field}={value}"
    return edit


class NotApplicable(Exception):
    """A mutation that does not apply to this base (e.g. no slot variables)."""


mutation("graph.slot_original_out_of_range", "graph", ("module",), GRAPH_OPS)(
    _graph_edit(_slot_edit("original_variable_node_id", 1_000_000)))
mutation("graph.slot_variable_out_of_range", "graph", ("module",), GRAPH_OPS)(
    _graph_edit(_slot_edit("slot_variable_node_id", 1_000_000)))
mutation("graph.slot_variable_negative", "graph", ("module",), GRAPH_OPS)(
    _graph_edit(_slot_edit("slot_variable_node_id", -2)))
# A slot whose variable is the root object: odd, but TF and objckpt restore the rest.
mutation("graph.slot_original_is_root", "graph", ("module",), GRAPH_OPS,
         verify_may_pass=True)(
    _graph_edit(_slot_edit("original_variable_node_id", 0)))


def _cycle(g, ctx):
    """A deep node gets a child edge back to the root (and the root one to itself)."""
    i = ctx.pick(_nodes_with_children(g)[1:] or [0])
    back = g.nodes[i].children.add()
    back.node_id, back.local_name = 0, "back_to_root"
    me = g.nodes[0].children.add()
    me.node_id, me.local_name = 0, "self"
    return f"node {i} -> 0"


# Cycles, many children, deep chains: valid graphs (TF's reader handles them).
mutation("graph.cycle", "graph", _CRAFT_BASES, GRAPH_OPS, verify_may_pass=True)(
    _graph_edit(_cycle))


def _extra_children(count):
    def edit(g, ctx):
        first = len(g.nodes)
        for _ in range(count):
            g.nodes.add()
        root = g.nodes[0]
        for n in range(count):
            c = root.children.add()
            c.node_id, c.local_name = first + n, f"extra_{n}"
        return f"{count} extra root children"
    return edit


def _extra_aliases(count):
    def edit(g, ctx):
        targets = [c.node_id for c in g.nodes[0].children]
        root = g.nodes[0]
        for n in range(count):
            c = root.children.add()
            c.node_id, c.local_name = targets[n % len(targets)], f"alias_{n}"
        return f"{count} extra root children aliasing its children"
    return edit


mutation("graph.root_aliases_10k", "graph", ("keras", "module"),
         ("restore", "read_tree", "verify", "plan", "cli_inspect"), verify_may_pass=True)(
    _graph_edit(_extra_aliases(10_000)))
mutation("graph.root_children_10k", "graph", ("keras", "module"),
         ("restore", "read_tree", "verify", "plan", "cli_inspect"), verify_may_pass=True,
         regression="10,000 extra root children: 24 s to restore (TF 0.1 s)")(
    _graph_edit(_extra_children(10_000)))
mutation("graph.root_children_200k", "graph", ("keras",),
         ("restore", "read_tree", "verify", "cli_inspect"), bench_only=True,
         verify_may_pass=True)(
    _graph_edit(_extra_children(200_000)))


@mutation("graph.deep_chain", "graph", ("keras",), ("restore", "read_tree", "verify",
                                                     "cli_inspect"), verify_may_pass=True)
def _deep_chain(ctx):
    """A chain of 5,000 nested nodes under the root (recursion depth)."""
    b = ctx.bundle()
    g = b.graph()
    parent = 0
    for _ in range(5000):
        g.nodes.add()
        c = g.nodes[parent].children.add()
        c.node_id, c.local_name = len(g.nodes) - 1, "d"
        parent = len(g.nodes) - 1
    b.set_graph(g)
    ctx.write(b)


# files and directories ------------------------------------------------------------------

def _replace_with_fifo(path):
    if os.path.lexists(path):
        os.remove(path)
    os.mkfifo(path)


@mutation("files.state_fifo", "files", ("manager", "fit"),
          ("restore_dir", "verify", "cli_inspect", "resume"),
          regression="hang: a FIFO as the checkpoint state file")
def _state_fifo(ctx):
    _replace_with_fifo(os.path.join(ctx.directory, STATE_FILE))


@mutation("files.index_fifo", "files", ("keras", "fit"),
          ("restore", "restore_dir", "read_tree", "verify", "cli_inspect", "resume"),
          regression="hang: a FIFO as the index")
def _index_fifo(ctx):
    _replace_with_fifo(ctx.prefix + ".index")


@mutation("files.data_fifo", "files", ("keras", "fit"),
          ("restore", "restore_dir", "verify", "resume"))
def _data_fifo(ctx):
    _replace_with_fifo(ctx.prefix + ".data-00000-of-00001")


@mutation("files.state_devzero", "files", ("manager", "fit"),
          ("restore_dir", "verify", "cli_inspect", "resume"),
          regression="hang: the state file a symlink to /dev/zero")
def _state_devzero(ctx):
    path = os.path.join(ctx.directory, STATE_FILE)
    os.remove(path)
    os.symlink("/dev/zero", path)


@mutation("files.index_devzero", "files", ("keras", "fit"),
          ("restore", "restore_dir", "read_tree", "verify"))
def _index_devzero(ctx):
    path = ctx.prefix + ".index"
    os.remove(path)
    os.symlink("/dev/zero", path)


@mutation("files.state_outside", "files", ("manager", "fit"),
          ("restore_dir", "verify", "cli_inspect", "resume"))
def _state_outside(ctx):
    """The state file names a checkpoint outside the directory (an older copy)."""
    outside, oldest = _copy_oldest_outside(ctx)
    with open(os.path.join(ctx.directory, STATE_FILE), "wb") as f:
        f.write(state_text([os.path.join(outside, f"ckpt-{oldest}")]))


def _copy_oldest_outside(ctx) -> tuple[str, int]:
    """Copies the directory's oldest checkpoint to `<case root>/outside`; (that folder, N)."""
    outside = os.path.join(ctx.case.root, "outside")
    os.makedirs(outside, exist_ok=True)
    oldest = checkpoint_numbers(ctx.directory)[0]
    for name in os.listdir(ctx.directory):
        if name.startswith(f"ckpt-{oldest}."):
            shutil.copy(os.path.join(ctx.directory, name), outside)
    return outside, oldest


@mutation("files.state_outside_relative", "files", ("manager", "fit"),
          ("restore_dir", "verify", "resume"))
def _state_outside_rel(ctx):
    _, oldest = _copy_oldest_outside(ctx)
    with open(os.path.join(ctx.directory, STATE_FILE), "wb") as f:
        f.write(state_text([f"../outside/ckpt-{oldest}"]))


@mutation("files.stray_bak", "files", ("fit", "manager"), ("restore_dir", "verify", "resume"))
def _stray_bak(ctx):
    src = ctx.prefix + ".data-00000-of-00001"
    shutil.copy(src, src + ".bak")


@mutation("files.stray_tempstate", "files", ("fit", "manager"),
          ("restore_dir", "verify", "resume"))
def _stray_tempstate(ctx):
    src = ctx.prefix + ".data-00000-of-00001"
    shutil.copy(src, src + ".tempstate123")


@mutation("files.state_only_deleted", "files", ("fit", "manager"),
          ("restore_dir", "verify", "resume"))
def _only_deleted(ctx):
    """The newest checkpoint deleted; the state file lists only it; older ones intact."""
    newest = ctx.newest
    for name in os.listdir(ctx.directory):
        if name.startswith(f"ckpt-{newest}."):
            os.remove(os.path.join(ctx.directory, name))
    with open(os.path.join(ctx.directory, STATE_FILE), "wb") as f:
        f.write(state_text([f"ckpt-{newest}"]))


@mutation("files.state_missing", "files", ("fit", "manager"), ("restore_dir", "resume"))
def _state_missing(ctx):
    os.remove(os.path.join(ctx.directory, STATE_FILE))


@mutation("files.newest_index_missing", "files", ("fit", "manager"),
          ("restore_dir", "verify", "resume"))
def _newest_index_missing(ctx):
    os.remove(ctx.prefix + ".index")


@mutation("files.state_names_directory", "files", ("fit",), ("restore_dir", "resume"))
def _state_dir(ctx):
    os.makedirs(os.path.join(ctx.directory, "ckpt-99.index"))
    with open(os.path.join(ctx.directory, STATE_FILE), "wb") as f:
        f.write(state_text([f"ckpt-{ctx.newest}", "ckpt-99"]))


# --- safetensors ---------------------------------------------------------------------------
# A safetensors file: 8 bytes (header length N, little-endian), N bytes of JSON, the data.
# The oracle is the `safetensors` library itself (the reference implementation): a case is
# equivalent when it reads the file to the original's tensors, bit for bit. The format has no
# checksums: damage to the data and swapped same-size offsets are undetectable.

def safetensors_equivalent(path: str, original: str) -> bool:
    """Whether the reference implementation reads `path` as exactly `original`'s tensors."""
    if os.path.islink(path) or not os.path.isfile(path):
        return False  # never opened: a FIFO would block
    from safetensors.numpy import load

    with open(path, "rb") as f, open(original, "rb") as g:
        raw, reference = f.read(), load(g.read())
    try:
        found = load(raw)
    except Exception:  # the reference implementation refuses it
        return False
    return found.keys() == reference.keys() and all(
        found[k].dtype == reference[k].dtype and found[k].shape == reference[k].shape
        and found[k].tobytes() == reference[k].tobytes() for k in found)


def _st_parts(ctx) -> tuple[dict, bytes]:
    """(the header as an ordered dict, the data buffer) of the case's file."""
    with open(ctx.case.target, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _st_write(ctx, header, data: bytes, *, length: int | None = None) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(ctx.case.target, "wb") as f:
        f.write(struct.pack("<Q", len(text) if length is None else length) + text + data)


def _st_entries(header: dict) -> list[str]:
    return [k for k in header if k != "__metadata__"]


def _st_edit(name, **kw):
    """A crafted header: `edit(ctx, header, data)` changes them before they are written."""
    def wrap(fn):
        def apply(ctx):
            header, data = _st_parts(ctx)
            note = fn(ctx, header, data)
            if note is not None and not isinstance(note, str):
                header, data, note = note
            if header is not None:
                _st_write(ctx, header, data)
            return note
        mutation(name, "safetensors", ("safetensors",), FILE_OPS, **kw)(apply)
        return fn
    return wrap


@mutation("safetensors.header_bytes", "safetensors", ("safetensors",), FILE_OPS, seeds=6)
def _st_header_bytes(ctx):
    """1-4 random bytes of the length and header overwritten."""
    with open(ctx.case.target, "r+b") as f:
        raw = bytearray(f.read())
        end = 8 + struct.unpack("<Q", raw[:8])[0]
        spots = [ctx.rng.randrange(end) for _ in range(ctx.rng.randint(1, 4))]
        for spot in spots:
            raw[spot] = ctx.rng.randrange(256)
        f.seek(0)
        f.write(raw)
    return f"bytes {spots} of the header"


@mutation("safetensors.data_bytes", "safetensors", ("safetensors",), FILE_OPS, seeds=2,
          undetectable=True, verify_may_pass=True)
def _st_data_bytes(ctx):
    """Data bytes flipped: no checksum can tell (safetensors keeps none)."""
    with open(ctx.case.target, "r+b") as f:
        raw = bytearray(f.read())
        start = 8 + struct.unpack("<Q", raw[:8])[0]
        spot = ctx.rng.randrange(start, len(raw))
        raw[spot] ^= 0xFF
        f.seek(0)
        f.write(raw)
    return f"byte {spot}"


@mutation("safetensors.truncated", "safetensors", ("safetensors",), FILE_OPS, seeds=3)
def _st_truncated(ctx):
    size = os.path.getsize(ctx.case.target)
    keep = ctx.rng.randrange(size)
    os.truncate(ctx.case.target, keep)
    return f"{keep} of {size} bytes kept"


@mutation("safetensors.length_huge", "safetensors", ("safetensors",), FILE_OPS)
def _st_length_huge(ctx):
    header, data = _st_parts(ctx)
    _st_write(ctx, header, data, length=2 ** 63 + 5)


@mutation("safetensors.length_past_end", "safetensors", ("safetensors",), FILE_OPS)
def _st_length_past_end(ctx):
    header, data = _st_parts(ctx)
    _st_write(ctx, header, data, length=os.path.getsize(ctx.case.target))


@mutation("safetensors.length_zero", "safetensors", ("safetensors",), FILE_OPS)
def _st_length_zero(ctx):
    header, data = _st_parts(ctx)
    _st_write(ctx, header, data, length=0)


@_st_edit("safetensors.overlap")
def _st_overlap(ctx, header, data):
    """The second entry's data starts where the first's does (same size kept)."""
    names = sorted(_st_entries(header), key=lambda n: header[n]["data_offsets"][0])
    first, second = names[0], names[1]
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    begin = header[first]["data_offsets"][0]
    header[second]["data_offsets"] = [begin, begin + size]


@_st_edit("safetensors.past_end")
def _st_past_end(ctx, header, data):
    last = max(_st_entries(header), key=lambda n: header[n]["data_offsets"][1])
    header[last]["data_offsets"][1] += 4


@_st_edit("safetensors.terabyte")
def _st_terabyte(ctx, header, data):
    """An entry claims 1 TB: a shape of 2^38 float32 and offsets to match."""
    name = _st_entries(header)[0]
    header[name].update(shape=[1 << 19, 1 << 19], dtype="F32",
                        data_offsets=[0, 1 << 40])


@_st_edit("safetensors.shape_overflow")
def _st_shape_overflow(ctx, header, data):
    """Dimensions whose product overflows 64 bits, offsets unchanged."""
    header[_st_entries(header)[0]]["shape"] = [1 << 40, 1 << 40, 1 << 40]


@_st_edit("safetensors.non_utf8")
def _st_non_utf8(ctx, header, data):
    text = json.dumps(header).encode()
    name = _st_entries(header)[0].encode()
    return text.replace(name, b"\xff\xfe" + name[2:], 1), data, "a name's first bytes 0xff 0xfe"


@_st_edit("safetensors.not_object")
def _st_not_object(ctx, header, data):
    return json.dumps(list(header.items())).encode(), data, "the header a JSON array"


@_st_edit("safetensors.duplicate_name")
def _st_duplicate_name(ctx, header, data):
    """Two entries of one name (the second one's JSON key renamed to the first's)."""
    names = _st_entries(header)
    text = json.dumps(header).encode()
    return (text.replace(json.dumps(names[1]).encode(), json.dumps(names[0]).encode(), 1),
            data, f"`{names[1]}` renamed `{names[0]}`")


@_st_edit("safetensors.bad_dtype")
def _st_bad_dtype(ctx, header, data):
    header[_st_entries(header)[0]]["dtype"] = ctx.pick(["F31", "", "f32", "F8", "Q4"])


@_st_edit("safetensors.negative_dim")
def _st_negative_dim(ctx, header, data):
    name = next(n for n in _st_entries(header) if header[n]["shape"])
    header[name]["shape"][0] = -header[name]["shape"][0]


@_st_edit("safetensors.float_dim")
def _st_float_dim(ctx, header, data):
    name = next(n for n in _st_entries(header) if header[n]["shape"])
    header[name]["shape"][0] = float(header[name]["shape"][0])


@_st_edit("safetensors.shape_size_mismatch")
def _st_shape_size(ctx, header, data):
    name = next(n for n in _st_entries(header) if header[n]["shape"])
    header[name]["shape"][0] += 1


@_st_edit("safetensors.trailing_bytes")
def _st_trailing(ctx, header, data):
    return header, data + b"\0" * 16, "16 bytes after the last tensor"


@_st_edit("safetensors.deep_json")
def _st_deep_json(ctx, header, data):
    return (b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", data,
            "200,000 nested arrays")


@_st_edit("safetensors.swap_same_size", undetectable=True, verify_may_pass=True)
def _st_swap(ctx, header, data):
    """Two entries of one dtype and size trade offsets: consistent, and no checksum can tell."""
    by_size: dict = {}
    for name in _st_entries(header):
        begin, end = header[name]["data_offsets"]
        by_size.setdefault((header[name]["dtype"], end - begin), []).append(name)
    pairs = [names for names in by_size.values() if len(names) > 1]
    if not pairs:
        raise NotApplicable("no two entries of one dtype and size")
    a, b = pairs[0][:2]
    header[a]["data_offsets"], header[b]["data_offsets"] = (header[b]["data_offsets"],
                                                            header[a]["data_offsets"])
    return f"`{a}` and `{b}` swapped"


@mutation("safetensors.fifo", "safetensors", ("safetensors",), FILE_OPS)
def _st_fifo(ctx):
    _replace_with_fifo(ctx.case.target)


@mutation("safetensors.devzero", "safetensors", ("safetensors",), FILE_OPS)
def _st_devzero(ctx):
    os.remove(ctx.case.target)
    os.symlink("/dev/zero", ctx.case.target)


# --- building cases ---------------------------------------------------------------------

def _copy_base(src: str, dst: str) -> None:
    if os.path.isdir(src):
        shutil.copytree(src, dst)
    else:
        os.makedirs(dst)
        for name in os.listdir(os.path.dirname(src)):
            shutil.copy(os.path.join(os.path.dirname(src), name), dst)


def make_case(mutation_name: str, base: str, seed: int, bases: str, root: str) -> Case:
    """Copies the base under `root` and applies the mutation with its seed."""
    m = MUTATIONS[mutation_name]
    original = base_prefix(bases, base)
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    if BASES[base][1] == "dir":
        target = os.path.join(root, base)
        _copy_base(original, target)
    else:
        _copy_base(original, os.path.join(root, base))
        target = os.path.join(root, base, os.path.basename(original))
    case = Case(m.name, m.group, base, seed, root, target, original,
                undetectable=m.undetectable, judge_values=m.judge_values,
                verify_may_pass=m.verify_may_pass)
    rng = random.Random(f"{m.name}/{base}/{seed}")
    case.note = m.apply(Ctx(case, rng)) or ""
    if BASES[base][1] == "file":
        case.equivalent = safetensors_equivalent(target, original)
    elif BASES[base][1] == "prefix":
        case.equivalent = equivalent(target, original)
    else:
        case.intact_before = tuple(sorted(intact_numbers(target, original)))
        case.listed = tuple(_listed(target))
        case.equivalent = (set(case.intact_before) == set(checkpoint_numbers(original))
                           and _state_equivalent(target, original))
    return case


def intact_numbers(directory: str, original: str) -> set:
    """Numbers of the checkpoints in `directory` that read exactly as the same-numbered
    ones of the original directory (regular files, checksums right: `equivalent`)."""
    if not os.path.isdir(directory):
        return set()
    return {n for n in checkpoint_numbers(original)
            if equivalent(os.path.join(directory, f"ckpt-{n}"),
                          os.path.join(original, f"ckpt-{n}"))}


def _listed(directory: str) -> list[int]:
    """Checkpoint numbers a directory's state file lists (by base name), oldest first;
    empty when it is not a clean regular file."""
    path = os.path.join(directory, STATE_FILE)
    if os.path.islink(path) or not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        names = parse_state(f.read()) or []
    out = []
    for name in names:
        m = re.fullmatch(r"ckpt-(\d+)", os.path.basename(name))
        if m:
            out.append(int(m.group(1)))
    return out


def _state_equivalent(directory: str, original: str) -> bool:
    path = os.path.join(directory, STATE_FILE)
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as f, open(os.path.join(original, STATE_FILE), "rb") as g:
        a, b = parse_state(f.read()), parse_state(g.read())
    return a is not None and a == b


# --- outcomes ---------------------------------------------------------------------------

def deleted_intact(case: Case) -> list[int]:
    """Checkpoints intact before an operation and gone after it, unless a newer checkpoint
    that was intact before survives (retention may drop a superseded one)."""
    if not case.intact_before or not os.path.isdir(case.target):
        return []
    now = intact_numbers(case.target, case.original)
    gone = [n for n in case.intact_before if n not in now]
    return [n for n in gone if not any(m > n and m in now for m in case.intact_before)]


def classify(case: Case, op: str, result: dict) -> tuple[str, str]:
    """(outcome class, detail) of one operation's result on one case."""
    status = result.get("status")
    if status in (CRASH, HANG):
        return status, result.get("detail", "")
    detail = result.get("error", "")
    changed = result.get("changed", False)
    if op == "resume":
        gone = deleted_intact(case)
        if gone:
            return DELETED, (f"deleted intact {', '.join(f'ckpt-{n}' for n in gone)} "
                             f"({detail or 'no error'})")
    if status == "error":
        if changed:
            return PARTIAL, detail
        return (TYPED if result.get("typed") else UNTYPED), detail
    # no error: judge what came back
    silent = UNDETECTABLE if case.undetectable else SILENT
    if not case.judge_values:
        return OK, ""
    prefix_base = BASES[case.base][1] == "prefix"
    if op in ("restore", "migrate") or (op == TF_OP and prefix_base):
        if result.get("match") == "original":
            return OK, ""
        return silent, f"{op} succeeded with values that differ ({result.get('differ', '')})"
    if op in ("restore_dir", "resume", TF_OP):
        got = result.get("match")  # the ckpt the values (resume: the restore) came from
        intact = case.intact_before
        newest = max(intact) if intact else None
        if got == newest:
            return OK, ""
        # following the state file: a newer intact checkpoint it does not list is not
        # committed; a listed one that is damaged or missing is skipped
        if isinstance(got, int) and got in intact and not any(
                n > got and n in case.listed for n in intact):
            return OK, f"ckpt-{got}"
        return SILENT, (f"{op} took ckpt-{got} but ckpt-{newest} is the newest intact "
                        f"checkpoint the state file lists" if got is not None else
                        f"{op} took no checkpoint but ckpt-{newest} is intact")
    if op in ("verify", "cli_verify"):
        if (result.get("report_ok") and not case.verify_may_pass
                and not _verify_may_pass(case)):
            return silent, "verify reported intact; the oracle says the files are not"
        return OK, ""
    return OK, ""


def _verify_may_pass(case: Case) -> bool:
    """Whether an intact verdict is right: a prefix equivalent to its original; a directory
    whose state file parses and lists only intact checkpoints (stray files are no problem
    of the checkpoints themselves)."""
    if BASES[case.base][1] != "dir":
        return bool(case.equivalent)
    return bool(case.listed) and all(n in case.intact_before for n in case.listed)


# --- the worker pool --------------------------------------------------------------------

class Worker:
    """One `fuzz_worker.py` process: TF imported, targets built, ready for jobs."""

    def __init__(self, bases: str, log_dir: str, env=None):
        self.bases = bases
        fd, self.log = tempfile.mkstemp(prefix="fuzz-worker-", suffix=".log", dir=log_dir)
        self.log_file = os.fdopen(fd, "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, bases], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log_file, env=env, start_new_session=True)
        self._buffer = b""
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        line = self._readline(timeout)
        if line is None or not line.startswith(b"{"):
            self.kill()
            raise RuntimeError(f"fuzz worker failed to start: {self.tail()}")
        info = json.loads(line)
        if not info.get("ready"):
            raise RuntimeError(f"fuzz worker failed to start: {info}")
        self.ready = True

    def _readline(self, timeout: float):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def log_position(self) -> int:
        self.log_file.flush()
        return os.path.getsize(self.log)

    def tail(self, since: int = 0, limit: int = 4000) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(since)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-limit:]

    def run(self, job: dict, timeout: float) -> dict:
        start = self.log_position()
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        line = self._readline(timeout)
        if line is None:
            self.kill()
            return {"status": HANG, "detail": f"no answer within {timeout:.0f} s",
                    "log": self.tail(start)}
        if not line:
            code = self.proc.wait()
            text = self.tail(start)
            return {"status": CRASH, "detail": crash_detail(code, text), "log": text}
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        self.kill()
        self.log_file.close()
        with contextlib.suppress(OSError):
            os.remove(self.log)


def crash_detail(code: int, log: str) -> str:
    """The signal, and the TF check that failed or the last line of the log."""
    what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    lines = [line for line in log.splitlines() if line.strip()]
    check = [line for line in lines if "Check failed" in line
             or "Fatal Python error" in line or "Segmentation fault" in line]
    reason = (check or lines or [""])[-1].strip()
    reason = re.sub(r"^\S+ \S+ +\d+ ", "", reason)  # glog's date and thread id
    return f"{what}: {reason[:300]}"


class Pool:
    """Serves jobs with one worker at a time, a warm standby replacing one that crashed or
    hung (restart cost off the critical path)."""

    def __init__(self, bases: str, *, timeout: float = 20.0, startup_timeout: float = 300.0,
                 standby: bool = True, env=None):
        self.bases, self.timeout, self.startup = bases, timeout, startup_timeout
        self.standby_enabled, self.env = standby, env
        self.log_dir = tempfile.mkdtemp(prefix="fuzz-logs-")
        self.worker = Worker(bases, self.log_dir, env)
        self.worker.wait_ready(startup_timeout)
        self.spare = None
        self.restarts = 0

    def _fresh(self) -> Worker:
        if self.spare is not None:
            worker, self.spare = self.spare, None
        else:
            worker = Worker(self.bases, self.log_dir, self.env)
        worker.wait_ready(self.startup)
        return worker

    def run(self, job: dict, timeout: float | None = None) -> dict:
        if self.worker is None:
            self.worker = self._fresh()
        result = self.worker.run(job, timeout or self.timeout)
        if result.get("status") in (CRASH, HANG):
            self.worker.close()
            self.worker = None
            self.restarts += 1
            if self.standby_enabled and self.spare is None:
                self.spare = Worker(self.bases, self.log_dir, self.env)
        return result

    def close(self) -> None:
        for w in (self.worker, self.spare):
            if w is not None:
                w.close()
        shutil.rmtree(self.log_dir, ignore_errors=True)


def make_bases(directory: str, timeout: float = 600.0, env=None) -> dict:
    """Writes the base checkpoints and their original values (a worker subprocess)."""
    os.makedirs(directory, exist_ok=True)
    proc = subprocess.run([sys.executable, WORKER, "--make-bases", directory],
                          capture_output=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError("building the fuzz base checkpoints failed:\n"
                           + proc.stderr.decode("utf-8", "replace")[-4000:])
    with open(os.path.join(directory, "bases.json")) as f:
        return json.load(f)


def job_for(case: Case, op: str, scratch: str) -> dict:
    at = BASES[case.base][2]
    return {"op": op, "base": case.base, "path": case.target, "at": at,
            "original": case.original, "scratch": scratch}


def run_case(pool: Pool, case: Case, op: str, scratch: str,
             timeout: float | None = None) -> tuple[str, str, dict]:
    """Runs one operation on one case; (outcome, detail, raw result)."""
    os.makedirs(scratch, exist_ok=True)
    started = time.monotonic()
    result = pool.run(job_for(case, op, scratch), timeout)
    result.setdefault("seconds", time.monotonic() - started)
    outcome, detail = classify(case, op, result)
    return outcome, detail, result


SUITE_OPS = 4  # operations per mutated case in the bounded suite
_ALWAYS = ("restore", "restore_dir", "verify", "resume")


def plan_cases(*, seed: int = 0, count: int | None = None, bench: bool = False,
               include_tf: bool = False, groups=None) -> list[tuple[str, str, int, str]]:
    """(mutation, base, seed, op) tuples.

    The bounded suite (`bench=False`): each mutation on its `suite_bases` (default: one
    base, in rotation; random damage and object graphs: every base, damage with `seeds`
    seeds), with restore and verify
    and a rotating choice of the other operations, `SUITE_OPS` in all. The benchmark
    (`bench=True`): every mutation on every base with every operation (plus plain TF with
    `include_tf`), crafted cases once, then random damage with further seeds until
    `count` cases.
    """
    out = []
    names = [n for n, m in MUTATIONS.items()
             if (bench or not m.bench_only) and (groups is None or m.group in groups)]
    rotation = 0
    for name in names:
        m = MUTATIONS[name]
        if bench:
            bases = m.bases
        elif m.suite_bases:
            bases = m.suite_bases
        elif m.group in ("damage", "graph"):
            bases = m.bases
        else:
            bases = (m.bases[rotation % len(m.bases)],)
        for base in bases:
            for s in range(m.seeds if (m.group in ("damage", "safetensors") and not bench)
                           else 1):
                ops = list(_ops_for(m, base))
                if not bench and len(ops) > SUITE_OPS:
                    fixed = [o for o in ops if o in _ALWAYS]
                    rest = [o for o in ops if o not in _ALWAYS]
                    picked = [rest[(rotation + j) % len(rest)]
                              for j in range(max(0, SUITE_OPS - len(fixed)))]
                    ops = fixed + picked
                rotation += 1
                ops += [TF_OP] if include_tf else []
                out.extend((name, base, seed + s, op) for op in ops)
    if not bench or count is None:
        return out
    damage = [(n, b) for n in names if MUTATIONS[n].group == "damage"
              for b in MUTATIONS[n].bases]
    s = seed + 1
    while sum(op != TF_OP for *_, op in out) < count and damage:
        for name, base in damage:
            ops = list(_ops_for(MUTATIONS[name], base)) + ([TF_OP] if include_tf else [])
            out.extend((name, base, s, op) for op in ops)
        s += 1
    return out


def _ops_for(m: Mutation, base: str) -> tuple:
    allowed = {"prefix": PREFIX_OPS, "dir": DIR_OPS, "file": FILE_OPS}[BASES[base][1]]
    ops = [o for o in m.ops if o in allowed and not (o == "resume" and base != "fit")]
    return tuple(ops) or (("restore_dir",) if BASES[base][1] == "dir" else ("restore",))


@dataclasses.dataclass
class Row:
    mutation: str
    base: str
    seed: int
    op: str
    outcome: str
    detail: str
    seconds: float
    note: str = ""

    @property
    def group(self) -> str:
        return MUTATIONS[self.mutation].group

    def repro(self) -> str:
        """How to run this one case again."""
        return (f"{self.mutation} base={self.base} seed={self.seed} op={self.op}: "
                f"{self.outcome}: {self.detail}")


def run_plan(pool: Pool, plan, bases: str, workdir: str, *, progress=None,
             skip_after_hang: bool = False, keep: bool = False) -> list[Row]:
    """Runs (mutation, base, seed, op) tuples; each op gets a freshly mutated copy.

    With `skip_after_hang`, once an operation on a mutated case hangs, its other operations
    are recorded as `not_run` instead of each costing the timeout (the bounded suite). With
    `keep`, each case's files stay in `workdir/case-N` (to reproduce a failure by hand)."""
    rows = []
    hung = set()
    for i, (name, base, seed, op) in enumerate(plan):
        root = os.path.join(workdir, f"case-{i}" if keep else "case")
        if (name, base, seed) in hung:
            rows.append(Row(name, base, seed, op, NOT_RUN,
                            "skipped: an earlier operation on this case hung", 0.0))
            continue
        try:
            case = make_case(name, base, seed, bases, root)
        except NotApplicable:
            continue
        except Exception as err:
            raise RuntimeError(f"the fuzz harness failed to build {name} on base {base} "
                               f"(seed {seed}): {type(err).__name__}: {err}") from err
        outcome, detail, result = run_case(pool, case, op, os.path.join(workdir, "scratch"))
        if outcome == HANG and skip_after_hang:
            hung.add((name, base, seed))
        row = Row(name, base, seed, op, outcome, detail, float(result.get("seconds", 0)),
                  case.note)
        rows.append(row)
        if progress is not None:
            progress(i, len(plan), row)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(os.path.join(workdir, "scratch"), ignore_errors=True)
    return rows
