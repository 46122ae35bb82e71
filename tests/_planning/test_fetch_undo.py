"""The streamed routes of restore, restore_on_create and load_ensemble stay all or nothing
after their metadata checks: each variable's old value goes to an undo log before it is
assigned, and a failure after the first assignment (a file cut short while it is read, an I/O
error, a KeyboardInterrupt) gives every variable its old value back, bit for bit, and the
error says that nothing was changed. Real Keras models (Dense + BatchNorm, compiled Adam with
slots) of this session's flavour, the streaming size lowered so that they stream."""

import errno
import os
import threading
import warnings

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import undolog as _undolog
from objckpt._formats import safetensors as _st
from objckpt._planning import fetch as _fetch
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import sources as _sources

from flavours import dense_bn
from support import assert_state_unchanged, owned_state

pytest.importorskip("safetensors")

_UNCHANGED = r"Nothing was changed: the \d+ variable\(s\) objckpt\.restore had assigned were " \
             r"given their old values back\."


@pytest.fixture(autouse=True)
def streamed(monkeypatch):
    """Every restore here takes a streamed route, as a model above the streaming size does."""
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)


@pytest.fixture(params=[1, 4], ids=["one thread", "four threads"])
def threads(request, monkeypatch):
    """The loaders read and assign on one thread, or on four at once."""
    monkeypatch.setattr(_fastio, "threads", lambda *args, **kwargs: request.param)
    return request.param


def _failing_at(monkeypatch, owner, name, k, raised):
    """owner.name raises `raised()` on its k-th call (counted across threads); returns the
    calls counted."""
    real = getattr(owner, name)
    calls = [0]
    lock = threading.Lock()

    def failing(*args, **kwargs):
        with lock:
            calls[0] += 1
            mine = calls[0]
        if mine == k:
            raise raised()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    return calls


@pytest.fixture
def exported(tmp_path):
    """A safetensors file of a trained model's weights and a TF checkpoint of it (with its
    optimizer's slots): every value differs from another seed's model."""
    source = dense_bn(1)
    path = str(tmp_path / "model.safetensors")
    objckpt.export(source, path)
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    return path, prefix, owned_state(source)


def test_restore_from_safetensors_puts_back_after_an_io_error(exported, threads, monkeypatch):
    path, _, _ = exported
    model = dense_bn(2)
    before = owned_state(model)
    calls = _failing_at(monkeypatch, _st._Reader, "tensor", 4,
                        lambda: OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError, match="Input/output error") as info:
        objckpt.restore(model, path)
    assert calls[0] >= 4
    assert any("objckpt.restore: Nothing was changed: the" in note
               for note in getattr(info.value, "__notes__", []))
    assert_state_unchanged(before, model)
    objckpt.restore(model, path)  # then a restore that works restores every weight
    assert owned_state(model) != before


def test_restore_from_a_safetensors_file_cut_short_while_read(exported, monkeypatch):
    """The file truncated after the plan was made and checked: the last tensor's read fails
    after the others were assigned."""
    path, _, _ = exported
    monkeypatch.setattr(_fastio, "threads", lambda *args, **kwargs: 1)
    model = dense_bn(2)
    before = owned_state(model)
    verify = _st._Streamer.verify
    last = []

    def verified_then_cut(self):
        verify(self)
        tensor = max((t for t, _, _, _ in self.entries), key=lambda t: t.begin)
        last.append(tensor.name)
        os.truncate(tensor.file, os.path.getsize(tensor.file) - 2)

    monkeypatch.setattr(_st._Streamer, "verify", verified_then_cut)
    with pytest.raises(errors.CheckpointCorruptError, match=_UNCHANGED) as info:
        objckpt.restore(model, path)
    assert "was cut short while it was read" in str(info.value)
    assert f"`{last[0]}`" in str(info.value)
    assert_state_unchanged(before, model)


def test_keyboard_interrupt_mid_stream_from_a_tf_checkpoint(exported, threads, monkeypatch):
    _, prefix, _ = exported
    model = dense_bn(2)
    before = owned_state(model)
    calls = _failing_at(monkeypatch, _fastio.Loader, "_assign_one", 5, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt) as info:
        objckpt.restore(model, prefix)
    assert calls[0] >= 5
    assert any(note.startswith("objckpt.restore: Nothing was changed: the ")
               for note in getattr(info.value, "__notes__", []))
    assert_state_unchanged(before, model)
    objckpt.restore(model, prefix)
    _, _, want = exported
    assert owned_state(model) == want  # weights, slots and iterations: the source's


def test_memory_error_in_restore_on_create_of_existing_variables(exported, threads,
                                                                 monkeypatch):
    path, _, _ = exported
    model = dense_bn(2)
    before = owned_state(model)
    batches = []
    assign = _fetch.Batch.assign

    def counted(self):
        batches.append((self.operation, len(self.loaders)))
        return assign(self)

    monkeypatch.setattr(_fetch.Batch, "assign", counted)
    _failing_at(monkeypatch, _st._Reader, "tensor", 3, MemoryError)
    with pytest.raises(MemoryError) as info:
        objckpt.restore_on_create(model, path)
    assert batches == [("objckpt.restore_on_create", 1)]
    assert any("objckpt.restore_on_create: Nothing was changed: the " in note
               for note in getattr(info.value, "__notes__", []))
    assert_state_unchanged(before, model)


def test_one_batch_of_values_read_whole_and_two_loaders_is_undone_as_one(exported,
                                                                         monkeypatch):
    """restore_on_create's batch (`Pipeline.assign_batch`): values read whole, then two
    streamed loaders; the second fails half way: the values read whole and the first
    loader's are put back too."""
    path, _, _ = exported
    monkeypatch.setattr(_fastio, "threads", lambda *args, **kwargs: 1)
    model = dense_bn(2)
    before = owned_state(model)
    src = _sources.open_source(path)
    tree = objckpt.tree(model)
    target = {m.source: tree[m.target] for m in objckpt.plan(model, path).matches}
    keys = list(target)
    assert len(keys) >= 5
    whole_key, first, second = keys[0], keys[1:3], keys[3:]
    whole = [(target[whole_key], src.fetch([whole_key])[0])]
    pipe = _pipeline.Pipeline("objckpt.restore_on_create", model, path)
    loaders = [pipe.fetch_streamed_pairs(src, [(key, target[key], key) for key in group])
               for group in (first, second)]
    assert all(isinstance(loader, _fetch.Streamed) for loader in loaders)
    reads = _failing_at(monkeypatch, _st._Reader, "tensor", len(first) + 2,
                        lambda: OSError(errno.EIO, "Input/output error"))
    try:
        with pytest.raises(OSError, match="Input/output error") as info:
            pipe.assign_batch(whole, loaders)
    finally:
        for loader in loaders:
            loader.close()
    assert reads[0] == len(first) + 2
    assert (f"objckpt.restore_on_create: Nothing was changed: the {len(first) + 2} "
            "variable(s) objckpt.restore_on_create had assigned were given their old values "
            "back.") in info.value.__notes__
    assert_state_unchanged(before, model)


def test_load_ensemble_members_put_back_and_the_template_untouched(exported, monkeypatch):
    _, prefix, _ = exported
    template = dense_bn(2)
    before = owned_state(template)
    undone = []
    real = _undolog.UndoLog.undo

    def spy(self):
        undone.append(len(self))
        return real(self)

    monkeypatch.setattr(_undolog.UndoLog, "undo", spy)
    _failing_at(monkeypatch, _fastio.Loader, "_assign_one", 4,
                lambda: OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError, match="Input/output error"):
        objckpt.load_ensemble(template, [prefix, prefix])
    assert undone and undone[0] >= 3  # the member being loaded got its values back
    assert_state_unchanged(before, template)


def test_without_a_temporary_file_restores_as_before_with_a_warning(exported, monkeypatch):
    path, _, want = exported

    def no_file(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(_undolog.tempfile, "TemporaryFile", no_file)
    model = dense_bn(2)
    with pytest.warns(RuntimeWarning, match="no undo log could be written .*Read-only"):
        objckpt.restore(model, path)
    got = {v.name: v.numpy().tobytes() for v in model.weights}
    assert got == {name: value for name, _, _, value in want if name in got}


def test_a_log_that_fills_the_disk_is_undone_and_the_restore_done_without_it(
        exported, threads, monkeypatch):
    """The undo log's write fails half way (no space left): what it logged is put back,
    then every value is assigned without a log, with a warning, as before."""
    _, prefix, want = exported
    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)  # every value: the direct-I/O file
    written = [0]
    real = _undolog._write_all

    def full(fd, view, offset):
        written[0] += 1
        if written[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, view, offset)

    monkeypatch.setattr(_undolog, "_write_all", full)
    undone = []
    undo = _undolog.UndoLog.undo

    def spy(self):
        undone.append(len(self))
        return undo(self)

    monkeypatch.setattr(_undolog.UndoLog, "undo", spy)
    model = dense_bn(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objckpt.restore(model, prefix)
    assert [str(w.message) for w in caught if "undo log" in str(w.message)] == [
        "objckpt.restore: no undo log could be written ([Errno 28] No space left on "
        "device): the values were assigned one at a time without "
        "one, every checksum checked first; a value failing to read half way would have left "
        "the variables before it restored. Fix: give the temporary directory (TMPDIR) room "
        "for one copy of the variables restored."]
    assert undone == [2]  # the two values logged before the write that failed
    assert owned_state(model) == want


def test_the_log_holds_no_old_value_in_memory(monkeypatch):
    """background=False: a large value is on disk when `record` returns (none held)."""
    class Variable:
        def __init__(self, value):
            self.value = value

        def numpy(self):
            return self.value

        def assign(self, value, read_value=False):
            self.value = value

    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    log = _undolog.UndoLog(background=False)
    try:
        variables = [Variable(np.arange(k * 1000, dtype=np.float32)) for k in (1, 3, 2)]
        old = [v.value.copy() for v in variables]
        for v in variables:
            log.record(v)
            assert log._pending is None and all(entry[6] is None for entry in log._entries)
            v.assign(np.zeros_like(v.value))
        assert log.undo() == []
    finally:
        log.close()
    assert all(np.array_equal(v.value, o) for v, o in zip(variables, old))


def test_the_old_value_is_logged_from_the_variables_own_buffer(exported, monkeypatch):
    """No copy of an old value is made to log it: what the log reads is a view of the
    variable's buffer (`variable.numpy()` copies)."""
    _, prefix, _ = exported
    shared = []
    record = _undolog.UndoLog.record

    def spy(self, variable, name=""):
        value = variable.numpy()
        own = np.asarray(variable.variable.read_value())
        shared.append(value.size == 0 or value.ctypes.data == own.ctypes.data)
        return record(self, variable, name)

    monkeypatch.setattr(_undolog.UndoLog, "record", spy)
    objckpt.restore(dense_bn(2), prefix)
    assert shared and all(shared)
