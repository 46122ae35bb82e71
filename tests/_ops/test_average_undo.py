"""objckpt.average on its streamed route (above HELD_BYTES): one pass over the files, each
variable assigned as soon as its mean is computed, and still all or nothing for every source
kind: every variable assigned before a failure gets its old value back from the undo log."""

import errno
import shutil

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import index as _bundle
from objckpt._bundle import undolog as _undolog
from objckpt._ops import average as _average
from objckpt._ops import meanstream as _meanstream
from objckpt._planning import pipeline as _pipeline

from flavours import dense_bn, mirrored, session_flavour
from support import assert_state_unchanged, owned_state


@pytest.fixture(autouse=True)
def streamed(monkeypatch):
    """Every average here takes the streamed route, as a model above HELD_BYTES does."""
    monkeypatch.setattr(_average, "HELD_BYTES", 0)


@pytest.fixture(params=["written at once", "written by a thread"])
def writes(request, monkeypatch):
    """The undo log's two ways of writing: small values at once, large ones (every value
    here, when the threshold is 0) by a background thread while the next is computed."""
    if request.param == "written by a thread":
        monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    return request.param


@pytest.fixture
def sources(tmp_path):
    """Three checkpoints of one Dense + BatchNorm model (compiled Adam, slots), each after
    one more training step: weights, slots and iterations all differ."""
    model = dense_bn(0)
    rng = np.random.default_rng(5)
    prefixes = []
    for k in range(3):
        model.train_on_batch(rng.normal(size=(4, 3)).astype("float32"),
                             rng.normal(size=(4, 2)).astype("float32"))
        prefixes.append(objckpt.save(model, str(tmp_path / f"ckpt-{k}")))
    return prefixes


def _damaged(prefix: str, key: str, out: str) -> str:
    """A copy of the checkpoint with one bit of entry `key`'s data flipped."""
    index = _bundle.read_index(prefix)
    entry = index.entries[key]
    shutil.copyfile(prefix + ".index", out + ".index")
    for shard in range(index.num_shards):
        name = _bundle.shard_name(prefix, shard, index.num_shards)
        copy = _bundle.shard_name(out, shard, index.num_shards)
        shutil.copyfile(name, copy)
        if shard == entry.shard:
            with open(copy, "r+b") as f:
                f.seek(entry.offset + entry.size - 1)
                byte = f.read(1)[0]
                f.seek(entry.offset + entry.size - 1)
                f.write(bytes([byte ^ 0x01]))
    return out


@pytest.fixture
def undone(monkeypatch):
    """The number of values each undo put back (proves the failure came after some were
    assigned): one per variable, one per replica of a distributed one."""
    counts = []
    real = _undolog.UndoLog.undo

    def spy(self):
        counts.append(len(self))
        return real(self)

    monkeypatch.setattr(_undolog.UndoLog, "undo", spy)
    return counts


def _reference(prefixes) -> tuple:
    """A clean average of the sources into a fresh model: (report, state)."""
    model = dense_bn(1)
    report = objckpt.average(model, prefixes)
    return report, owned_state(model)


@pytest.mark.parametrize("which", ["averaged", "taken"])
def test_a_checksum_failing_in_the_last_variable_of_the_last_source_changes_nothing(
        sources, tmp_path, undone, which, writes):
    report, _ = _reference(sources)
    # the optimizer's step counter, as each Keras names it (Keras 2: optimizer/iter)
    assert any(p.rsplit("/", 1)[-1].lstrip("_") in ("iterations", "iter")
               for p in report.taken)
    path = report.averaged[-1] if which == "averaged" else report.taken[-1]
    key = objckpt.read_tree(sources[2])[path].key
    bad = _damaged(sources[2], key, str(tmp_path / "damaged"))
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.average(target, [sources[0], sources[1], bad])
    message = str(info.value)
    assert "damaged" in message and key in message
    assert "Nothing was changed" in message
    # every variable before the failing one had been assigned, and was put back
    assigned = (len(report.averaged) - 1 if which == "averaged"
                else len(report.averaged) + len(report.taken) - 1)
    assert undone == [assigned]
    assert_state_unchanged(before, target)
    if which == "averaged":  # read by the averaging pass itself, which names the source
        assert "Source 2 of 3" in message


def test_the_single_pass_equals_the_held_route_bit_for_bit(sources, monkeypatch):
    _, streamed = _reference(sources)
    monkeypatch.setattr(_average, "HELD_BYTES", 1 << 40)
    _, held = _reference(sources)
    assert streamed == held


@pytest.mark.parametrize("kind", ["safetensors", "weights.h5"])
def test_another_format_failing_to_read_half_way_changes_nothing(sources, tmp_path,
                                                                 monkeypatch, undone, kind):
    report, _ = _reference(sources)
    member = dense_bn(0)
    objckpt.restore(member, sources[1])
    if kind == "safetensors":
        other = objckpt.export(member, str(tmp_path / "member.safetensors"))
    else:
        # Keras 2's own weights file is its HDF5 layout (`.h5`); Keras 3 / tf_keras: .weights.h5
        name = "member.h5" if session_flavour() == "keras2" else "member.weights.h5"
        other = str(tmp_path / name)
        member.save_weights(other)
    mixed = [sources[0], other, sources[2]]
    # a weights file holds no optimizer state here (tf_keras writes it apart from its slots)
    options = {} if kind == "safetensors" else {"optimizer_state": False, "strict": False}
    # the same mean as the checkpoint it was written from, read whole through the fetch stage
    model = dense_bn(1)
    objckpt.average(model, mixed, **options)
    clean = dense_bn(1)
    objckpt.average(clean, sources, **options)
    assert owned_state(model) == owned_state(clean)
    calls = []
    real = _pipeline.Pipeline.fetch

    def failing(self, the_plan, variables, matches=None):
        calls.append(1)
        if len(calls) == len(report.averaged):  # the last weight of the file
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(self, the_plan, variables, matches)

    monkeypatch.setattr(_pipeline.Pipeline, "fetch", failing)
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(OSError, match="injected") as info:
        objckpt.average(target, mixed, **options)
    assert undone == [len(report.averaged) - 1]
    if hasattr(info.value, "add_note"):  # Python 3.11: the note says so
        assert any("Nothing was changed" in note for note in info.value.__notes__)
    assert_state_unchanged(before, target)


def test_an_interrupt_half_way_changes_nothing(sources, monkeypatch, undone, writes):
    report, _ = _reference(sources)
    calls = []
    real = _meanstream.Stream.read_into

    def interrupted(self, view):
        calls.append(1)
        if len(calls) == 3 * 4 + 1:  # every small variable is one window of each source
            raise KeyboardInterrupt
        return real(self, view)

    monkeypatch.setattr(_meanstream.Stream, "read_into", interrupted)
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(KeyboardInterrupt):
        objckpt.average(target, sources)
    assert undone == [4] and len(report.averaged) > 4
    assert_state_unchanged(before, target)


def test_without_an_undo_log_checksums_are_checked_first(sources, tmp_path, monkeypatch):
    _, want = _reference(sources)

    def no_file(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system (injected)")

    monkeypatch.setattr(_undolog.tempfile, "TemporaryFile", no_file)
    model = dense_bn(1)
    report = objckpt.average(model, sources)
    assert owned_state(model) == want
    assert any("No undo log" in note and "Read-only" in note for note in report.notes)
    report_text = str(report)
    assert "checked in a pass of their own" in report_text
    # still all or nothing for TF checkpoints: checked before the first assignment
    path = report.averaged[-1]
    bad = _damaged(sources[2], objckpt.read_tree(sources[2])[path].key,
                   str(tmp_path / "damaged"))
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(errors.CheckpointCorruptError, match="Source 2 of 3"):
        objckpt.average(target, [sources[0], sources[1], bad])
    assert_state_unchanged(before, target)


def test_an_undo_log_that_fills_the_disk_half_way_falls_back(sources, monkeypatch, undone,
                                                             writes):
    _, want = _reference(sources)
    calls = []
    real = _undolog._write_all

    def full(fd, view, offset):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(fd, view, offset)

    monkeypatch.setattr(_undolog, "_write_all", full)
    model = dense_bn(1)
    report = objckpt.average(model, sources)
    # Written at once: the third variable's write fails before it is assigned. By a thread:
    # found before the fourth is assigned; the third's old value comes back from memory.
    # (a thread's failure is seen when the next value is recorded, or by then already: 3
    # variables put back, or 2 when the third had not been assigned yet)
    assert undone == [2] if writes == "written at once" else undone in ([2], [3])
    assert owned_state(model) == want  # then averaged again, every checksum checked first
    assert any("No undo log" in note and "No space" in note for note in report.notes)


def test_distributed_variables_are_put_back_on_every_replica(sources, tmp_path, undone):
    report, _ = _reference(sources)
    path = report.averaged[-1]
    bad = _damaged(sources[2], objckpt.read_tree(sources[2])[path].key,
                   str(tmp_path / "damaged"))
    with mirrored(2).scope():
        target = dense_bn(1)
    weights = [objckpt.tree(target)[p] for p in report.averaged]
    assert all(len(v.values) == 2 for v in weights)  # (tf variables: distributed ones)
    before = owned_state(target), _replicas(weights)
    with pytest.raises(errors.CheckpointCorruptError, match="Source 2 of 3"):
        objckpt.average(target, [sources[0], sources[1], bad])
    assert undone == [2 * (len(report.averaged) - 1)]  # each replica logged
    assert_state_unchanged(before[0], target)
    assert _replicas(weights) == before[1]
    objckpt.average(target, sources)  # and averaged into every replica
    assert all(first == second for first, second in _replicas(weights))
    averaged = dense_bn(1)
    objckpt.average(averaged, sources)
    assert [part for part, _ in _replicas(weights)] == [
        np.array(objckpt.tree(averaged)[p].numpy()).tobytes() for p in report.averaged]


def _replicas(variables) -> list:
    return [tuple(np.array(part.numpy()).tobytes() for part in v.values) for v in variables]


# --- reading ahead: a large tensor's windows read by a background thread ---------------------

@pytest.fixture
def read_ahead(monkeypatch):
    """Windows of 4 elements: every tensor of 8 elements or more is read ahead by the
    background thread, as a large one is; returns the number of times it ran."""
    monkeypatch.setattr(_meanstream, "WINDOW", 4)
    runs = []
    real = _meanstream._read_ahead

    def spy(*args):
        runs.append(1)
        return real(*args)

    monkeypatch.setattr(_meanstream, "_read_ahead", spy)
    return runs


def _readers() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "objckpt-average-reader"]


def test_read_ahead_gives_the_same_bits_and_checks_every_source(sources, tmp_path, undone,
                                                                 read_ahead):
    report, streamed = _reference(sources)
    _meanstream.WINDOW = 1 << 16
    held = dense_bn(1)
    _average.HELD_BYTES = 1 << 40
    try:
        objckpt.average(held, sources)
    finally:
        _average.HELD_BYTES = 0
    assert owned_state(held) == streamed
    sizes = [objckpt.tree(held)[p].shape.num_elements() for p in report.averaged]
    assert len(read_ahead) == sum(size >= 2 * 4 for size in sizes) == 2  # the two kernels
    _meanstream.WINDOW = 4
    # the first kernel (12 elements: 3 windows) damaged in its last window, last source
    path = report.averaged[sizes.index(12)]
    bad = _damaged(sources[2], objckpt.read_tree(sources[2])[path].key,
                   str(tmp_path / "damaged"))
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(errors.CheckpointCorruptError, match="Source 2 of 3.*checksum"):
        objckpt.average(target, [sources[0], sources[1], bad])
    assert undone == [sizes.index(12)]
    assert_state_unchanged(before, target)
    assert not _readers()


def test_a_read_error_in_the_reading_thread_reaches_the_caller(sources, monkeypatch, undone,
                                                                read_ahead):
    report, _ = _reference(sources)
    real = _meanstream.Stream.read_into

    def failing(self, view):
        # the second window of the second kernel (4 x 2 float32: 32 bytes, read ahead)
        if self.entry.size == 32 and self.pos:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(self, view)

    monkeypatch.setattr(_meanstream.Stream, "read_into", failing)
    target = dense_bn(1)
    before = owned_state(target)
    with pytest.raises(OSError, match="injected"):
        objckpt.average(target, sources)
    sizes = [objckpt.tree(target)[p].shape.num_elements() for p in report.averaged]
    assert sizes.count(8) == 1 and undone == [sizes.index(8)]  # those before it put back
    assert undone[0] > 0
    assert_state_unchanged(before, target)
    assert not _readers()


def test_the_writer_reads_ahead_to_the_same_bytes(sources, tmp_path, read_ahead):
    _meanstream.WINDOW = 1 << 16
    whole = objckpt.average_checkpoints(sources, str(tmp_path / "whole"))["prefix"]
    _meanstream.WINDOW = 4
    ahead = objckpt.average_checkpoints(sources, str(tmp_path / "ahead"))["prefix"]
    assert read_ahead
    for suffix in (".index", ".data-00000-of-00001"):
        with open(whole + suffix, "rb") as a, open(ahead + suffix, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("window", [1 << 16, 4])
def test_equal_power_of_two_weights_weighted_once_give_the_same_bits(sources, monkeypatch,
                                                                     window):
    monkeypatch.setattr(_meanstream, "WINDOW", window)
    for chosen in ([sources[0], sources[2]], [*sources, sources[0]],
                   [sources[0], sources[1]] * 4):  # weights 1/2, 1/4, 1/8
        _, streamed = _reference(chosen)
        monkeypatch.setattr(_average, "HELD_BYTES", 1 << 40)
        _, held = _reference(chosen)
        monkeypatch.setattr(_average, "HELD_BYTES", 0)
        assert streamed == held
        # and as the float64 reference: each weight applied to each value, summed in order
        model = dense_bn(1)
        report = objckpt.average(model, chosen)
        for path in report.averaged:
            stored = [tf.train.load_checkpoint(p).get_tensor(
                objckpt.read_tree(p)[path].key).astype(np.float64) for p in chosen]
            total = stored[0] * (1 / len(chosen))
            for value in stored[1:]:
                total = total + value * (1 / len(chosen))
            assert np.array_equal(np.array(objckpt.tree(model)[path].numpy()),
                                  total.astype(np.float32)), path


def test_a_success_closes_its_undo_log(sources, monkeypatch, writes):
    """Once every mean is assigned the log is dropped (its files deleted, a write in flight
    stopped), not left to the garbage collector with a thread still writing."""
    import threading

    closed, real = [], _undolog.UndoLog.close

    def spy(self):
        closed.append(len(self))
        return real(self)

    report, want = _reference(sources)
    monkeypatch.setattr(_undolog.UndoLog, "close", spy)
    target = dense_bn(1)
    objckpt.average(target, sources)
    assert owned_state(target) == want
    assert len(closed) == 1  # every assigned variable logged, then the log closed
    assert closed[0] >= len(report.averaged) + len(report.taken)
    assert not [t for t in threading.enumerate() if t.name == "objckpt-undo-log"]
