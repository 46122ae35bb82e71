"""The pure-Python index validator (`objckpt._bundle.index`): what it accepts equals what TF wrote,
and every crafted file that crashes TF's C++ reader is refused with a typed error first.

Crafted files are written by the independent codec in `tests/helpers/fuzzlib.py` (block checksums
recomputed, so only structure can tell). Each refusal would otherwise abort or crash this
process inside TF (`checkpoint_reader.cc: Check failed: entry.ParseFromString`,
`tensor_shape.cc: size >= 0`, a segfault on a string entry of 2^32+1 elements): a test that
fails here kills the worker, which pytest reports as a failure too.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import index as _bundle

import fuzzlib

GRAPH = fuzzlib.OBJECT_GRAPH_KEY


class Net(tf.Module):
    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
        self.bias = tf.Variable(np.ones(4, np.float32))
        self.steps = tf.Variable(7, dtype=tf.int64)
        self.flags = tf.Variable([True, False])
        self.half = tf.Variable(np.ones((2, 2), np.float16))
        self.label = tf.Variable(b"a label")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return objckpt.save(Net(), str(tmp_path_factory.mktemp("bundle") / "ck"))


def _tf_maps(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return ({k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()},
            {k: v.as_datatype_enum for k, v in reader.get_variable_to_dtype_map().items()})


def _ours(prefix):
    index = _bundle.read_index(prefix)
    return ({k: e.shape for k, e in index.entries.items()},
            {k: e.dtype for k, e in index.entries.items()}), index


def test_index_of_real_checkpoints_matches_tfs_reader(good, tmp_path):
    # A tf.Module with float16, bool, int64 and string variables.
    ours, index = _ours(good)
    assert ours == _tf_maps(good) and index.num_shards == 1
    # Many entries over several data blocks (TF starts a block every 4 KiB or so).
    many = tf.Module()
    many.values = [tf.Variable(tf.fill([i % 7 + 1], float(i))) for i in range(700)]
    prefix = tf.train.Checkpoint(root=many).write(str(tmp_path / "many"))
    ours, index = _ours(prefix)
    assert ours == _tf_maps(prefix) and len(index.entries) == 701
    # Two data shards, as MergeV2Checkpoints writes them.
    parts = []
    for i in range(2):
        part = str(tmp_path / f"part{i}")
        tf.raw_ops.SaveV2(prefix=part, tensor_names=[f"t{i}"], shape_and_slices=[""],
                          tensors=[tf.constant([i, i + 1], tf.int32)])
        parts.append(part)
    merged = str(tmp_path / "merged")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=merged)
    ours, index = _ours(merged)
    assert ours == _tf_maps(merged) and index.num_shards == 2
    assert {e.shard for e in index.entries.values()} == {0, 1}
    # A TF1 partitioned variable: its slices are stored under binary keys.
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("emb", shape=[10, 4],
                                  partitioner=tf.compat.v1.fixed_size_partitioner(3))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            partitioned = saver.save(session, str(tmp_path / "tf1" / "model.ckpt"))
    ours, index = _ours(partitioned)
    assert ours == _tf_maps(partitioned)
    assert [first for first, _ in (s[0] for s in index.entries["emb"].slices)] == [0, 4, 7]
    assert objckpt.verify(partitioned).ok


def _craft(good, tmp_path, edit, name="crafted"):
    bundle = fuzzlib.Bundle.read(good)
    edit(bundle)
    prefix = str(tmp_path / name)
    bundle.write(prefix)
    return prefix


def _entry_edit(key, **fields):
    def edit(bundle):
        entry = bundle.entry(key)
        for field, value in fields.items():
            if field == "dims":
                del entry.shape.dim[:]
                for size in value:
                    entry.shape.dim.add().size = size
            else:
                setattr(entry, field, value)
        bundle.set_entry(key, entry)
    return edit


def _huge_string() -> bytes:
    """A scalar string's bytes claiming 2^40 bytes, with the lengths' checksum recomputed."""
    length = 1 << 40
    crc = fuzzlib.mask(fuzzlib.crc32c(struct.pack("<Q", length)))
    return fuzzlib.varint(length) + struct.pack("<I", crc) + b"a label"


KERNEL = b"kernel/.ATTRIBUTES/VARIABLE_VALUE"
LABEL = b"label/.ATTRIBUTES/VARIABLE_VALUE"

# (id, edit of the good bundle, words the error must hold). Each would abort or crash TF's
# reader (or give an untyped Python error) without the validation.
CRAFTED = [
    ("negative-dim", _entry_edit(KERNEL, dims=[-1, 4]), "has size -1 (< 0)"),
    ("overflowing-dims", _entry_edit(KERNEL, dims=[1 << 40, 1 << 40]), "more than 2^62"),
    ("dtype-1000", _entry_edit(KERNEL, dtype=1000), "dtype is 1000"),
    ("dtype-resource", _entry_edit(KERNEL, dtype=20), "dtype is 20"),
    ("offset-beyond-shard", _entry_edit(KERNEL, offset=1 << 40), "beyond the end of data shard"),
    ("shard-out-of-range", _entry_edit(KERNEL, shard_id=5), "its shard is 5"),
    ("size-mismatch", _entry_edit(KERNEL, size=40), "needs 48"),
    ("graph-2^32+1-strings", _entry_edit(GRAPH, dims=[(1 << 32) + 1]), "_CHECKPOINTABLE"),
    ("graph-not-a-string", _entry_edit(GRAPH, dtype=1, size=4), "must be a scalar string"),
    ("string-too-many-elements", _entry_edit(LABEL, dims=[1 << 20]), "variable-length"),
    # A length of 2^40 whose length checksum is right: plain TF segfaults reading it.
    ("string-length-2^40", lambda b: b.put_tensor(LABEL, _huge_string()),
     "declare 1099511627776 bytes"),
    ("entry-unparseable", lambda b: b.set_value(KERNEL, b"\x0a\xff\xff\xff"), "entry"),
    ("entry-group-wire-type", lambda b: b.set_value(KERNEL, b"\x0b\x0c"), "wire type 3"),
    ("dim-name-not-utf8", lambda b: b.set_value(KERNEL, b"\x12\x06\x12\x04\x12\x02\xff\xfe"),
     "not UTF-8"),
    ("header-missing", lambda b: b.entries.pop(0), "no header entry"),
    ("header-zero-shards", lambda b: b.set_value(b"", b"\x08\x00"), "says 0 data shards"),
    ("header-without-shards", lambda b: b.set_value(b"", b""), "says 0 data shards"),
    ("header-huge-shards", lambda b: b.set_value(b"", b"\x08\xff\xff\xff\xff\x07"),
     "data shards (1 to"),
    ("keys-unsorted", lambda b: b.entries.insert(2, b.entries.pop(1)), "strictly increasing"),
    ("key-not-utf8", lambda b: b.entries.append([b"\xff\xfe", b.value(KERNEL)]), "not UTF-8"),
    # a scalar listed as stored in one slice (no extent: it has no axis to split)
    ("scalar-in-slices", lambda b: _sliced(b, b"steps/.ATTRIBUTES/VARIABLE_VALUE"),
     "a scalar listed as stored in slices"),
]


def _sliced(bundle, key):
    entry = bundle.entry(key)
    entry.slices.add()
    bundle.set_entry(key, entry)


@pytest.mark.parametrize("edit,words", [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
def test_crafted_index_entries_are_refused_before_tf_reads_them(good, tmp_path, edit, words):
    prefix = _craft(good, tmp_path, edit)
    target = Net()
    before = [v.numpy() for v in target.variables]
    for call in (lambda: objckpt.read_tree(prefix), lambda: objckpt.restore(target, prefix)):
        with pytest.raises(errors.CheckpointCorruptError) as caught:
            call()
        message = str(caught.value)
        assert words in message and prefix in message and "Nothing was read" in message
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))
    report = objckpt.verify(prefix)
    assert not report.ok and words in report.problems[0].message


def _footer(bundle_prefix, mutate):
    with open(bundle_prefix + ".index", "rb") as f:
        data = bytearray(f.read())
    mutate(data)
    with open(bundle_prefix + ".index", "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("mutate,words", [
    (lambda d: d.__setitem__(slice(-8, None), b"\0" * 8), "magic number"),
    # The index handle: offset 2^62 (a MemoryError in TF's Python wrapper before).
    (lambda d: d.__setitem__(slice(-48, -8), (fuzzlib.varint(0) + fuzzlib.varint(0)
                                              + fuzzlib.varint(1 << 62)
                                              + fuzzlib.varint(16)).ljust(40, b"\0")),
     "beyond the table"),
    (lambda d: d.__delitem__(slice(0, len(d) - 20)), "shorter than a table footer"),
], ids=["magic", "huge-handle", "truncated"])
def test_damaged_footer_is_refused(good, tmp_path, mutate, words):
    prefix = _craft(good, tmp_path, lambda b: None)
    _footer(prefix, mutate)
    with pytest.raises(errors.CheckpointCorruptError, match=words):
        objckpt.read_tree(prefix)


def _graph_edit(change):
    def edit(bundle):
        graph = bundle.graph()
        change(graph)
        bundle.set_graph(graph)
    return edit


def _child(graph, node_id=0, index=0):
    return graph.nodes[node_id].children[index]


def _second_child_edge(graph):
    extra = graph.nodes[0].children.add()
    extra.local_name = _child(graph).local_name
    extra.node_id = _child(graph, index=1).node_id


def _shared_key(graph):
    with_values = [n for n in graph.nodes if n.attributes]
    with_values[1].attributes[0].checkpoint_key = with_values[0].attributes[0].checkpoint_key


GRAPHS = [
    ("child-id-out-of-range", _graph_edit(lambda g: setattr(_child(g), "node_id", 99)),
     "outside 0.."),
    ("negative-child-id", _graph_edit(lambda g: setattr(_child(g), "node_id", -2)),
     "node -2, outside 0.."),
    ("empty-graph", _graph_edit(lambda g: g.ClearField("nodes")), "has no nodes"),
    ("dropped-node", _graph_edit(lambda g: g.nodes.pop()), "outside 0.."),
    ("duplicate-child-name", _graph_edit(_second_child_edge), "two children named"),
    ("shared-checkpoint-key", _graph_edit(_shared_key), "another node of the graph"),
    ("key-missing-from-index",
     _graph_edit(lambda g: setattr(next(n for n in g.nodes if n.attributes).attributes[0],
                                   "checkpoint_key", "ghost/.ATTRIBUTES/VARIABLE_VALUE")),
     "the index has no such tensor"),
]


@pytest.mark.parametrize("edit,words", [c[1:] for c in GRAPHS], ids=[c[0] for c in GRAPHS])
def test_inconsistent_object_graphs_are_refused_before_any_assignment(good, tmp_path, edit,
                                                                      words):
    prefix = _craft(good, tmp_path, edit)
    target = Net()
    before = [v.numpy() for v in target.variables]
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.restore(target, prefix)
    assert words in str(caught.value) and "nothing was read" in str(caught.value).lower()
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))
    assert not objckpt.verify(prefix).ok


def test_special_files_are_refused_without_opening_them(good, tmp_path):
    # A FIFO as the index is tested in a child process with a time limit
    # (tests/integration/test_untrusted_dirs.py): opened by mistake, it blocks forever. A data
    # shard that is a link to a device is read by nothing either.
    device = str(tmp_path / "device")
    os.link(good + ".index", device + ".index")
    os.symlink("/dev/zero", device + ".data-00000-of-00001")
    target = Net()
    before = [v.numpy() for v in target.variables]
    with pytest.raises(errors.CheckpointCorruptError, match="character device, not a regular"):
        objckpt.restore(target, device)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))


def test_a_missing_shard_is_named(good, tmp_path):
    prefix = _craft(good, tmp_path, lambda b: b.set_value(b"", b"\x08\x02"))  # 2 shards
    with pytest.raises(errors.CheckpointCorruptError, match="data shard 0 of 2 is missing"):
        objckpt.read_tree(prefix)


def test_saveables_of_several_tensors_and_variant_tensors(tmp_path):
    # A tf.data iterator is saved as `it/.ATTRIBUTES/ITERATOR_STATE` (its attribute's key plus
    # a suffix), a variant tensor framed per element: length, bytes, checksum.
    iterator = iter(tf.data.Dataset.range(10).shuffle(5, seed=1))
    next(iterator)
    weight = tf.Variable([1.5, 2.5])
    prefix = tf.train.Checkpoint(it=iterator, w=weight).write(str(tmp_path / "it"))
    assert sorted(objckpt.read_tree(prefix)) == ["w"]
    report = objckpt.verify(prefix)
    assert report.ok and report.tensors == 2, report.describe()
    target = tf.Variable([0.0, 0.0])
    objckpt.restore(tf.train.Checkpoint(w=target), prefix, strict=False)
    assert target.numpy().tolist() == [1.5, 2.5]
    # An element claiming more bytes than the entry holds.
    key = b"it/.ATTRIBUTES/ITERATOR_STATE"

    def inflate(bundle):
        raw = bytearray(bundle.tensor_bytes(key))
        raw[:2] = fuzzlib.varint(1 << 13)  # the first element's length (2 varint bytes)
        bundle.put_tensor(key, bytes(raw), crc=bundle.entry(key).crc32c)
    crafted = _craft(prefix, tmp_path, inflate)
    with pytest.raises(errors.CheckpointCorruptError, match="element 0 declares 8192 bytes"):
        objckpt.read_tree(crafted)


def test_values_read_that_disagree_with_the_metadata_change_nothing(good, monkeypatch):
    """Invariant 1: every value is checked under the path it will be assigned to, after it is
    read and before any assignment, even when the metadata the plan checked said otherwise."""
    from objckpt._formats import checkpoint as _checkpoint
    from objckpt._planning import fetch as _fetch

    real = _checkpoint._restore_v2

    def lying(prefix, keys, dtypes, shapes=None):
        values = list(real(prefix, keys, dtypes, shapes))
        values[-1] = tf.zeros([9], values[-1].dtype)  # the last one read: after the others
        return values

    monkeypatch.setattr(_checkpoint, "_restore_v2", lying)
    # The path that reads every value before assigning (a restore in place from files
    # checks the index entries against the variables instead: tests/_bundle/test_fastio_parallel.py).
    monkeypatch.setattr(_fetch, "streamed", lambda *args: None)
    target = Net()
    before = [v.numpy() for v in target.variables]
    with pytest.raises(errors.CheckpointCorruptError, match=r"read as \w+\(9,\) but the obj"):
        objckpt.restore(target, good)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))
