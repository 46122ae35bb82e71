"""The undo log (`_bundle.undolog`): old values written to an anonymous temporary file (at once,
or by a background thread) and put back bit for bit, whatever their dtype and shape."""

import errno

import numpy as np
import pytest
import tensorflow as tf

from objckpt._bundle import undolog as _undolog


@pytest.fixture(params=["written at once", "by a thread, direct",
                        "by a thread, through the page cache", "large ones at once, direct"])
def writes(request, monkeypatch):
    """Small values written at once; large ones (every value, with a threshold of 0) by a
    background thread, with direct I/O where the file system has it (tmp_path's, here), or
    through the page cache where it has none, or (background=False, as restore writes
    them) before `record` returns."""
    if request.param != "written at once":
        monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    if request.param.endswith("page cache"):
        monkeypatch.setattr(_undolog, "_set_direct", lambda fd, on: False)
    if request.param.startswith("large ones at once"):
        made = _undolog.UndoLog

        def at_once(*args, **kwargs):
            return made(*args, background=False, **kwargs)

        monkeypatch.setattr(_undolog, "UndoLog", at_once)
    return request.param


def test_undo_log_gives_back_every_dtype_and_shape_bit_for_bit(writes):
    values = [np.array([1.5, -0.0, np.inf], np.float16),
              tf.constant([1.0, -2.5], tf.bfloat16),
              np.frombuffer(np.array([0x7FC00001, 0x80000000], np.uint32).tobytes(),
                            np.float32),  # a NaN payload and -0.0
              np.array(7, np.int64), np.array([True, False]), np.array([b"a", b"bc"]),
              # more than the 8 MiB staging buffer of direct writes, not a whole block
              np.random.default_rng(0).normal(size=(2_100_001,)).astype(np.float32),
              np.array([3.0, 4.0])]  # after it: its offset aligned
    variables = [tf.Variable(v) for v in values]
    relaxed = tf.Variable(np.arange(6, dtype=np.float32), shape=tf.TensorShape(None))
    variables.append(relaxed)
    before = [_bits(v) for v in variables]
    log = _undolog.UndoLog()
    for k, variable in enumerate(variables):
        log.record(variable, f"v{k}")
        new = (tf.zeros((2, 2)) if variable is relaxed
               else tf.zeros_like(variable) if variable.dtype != tf.string
               else tf.constant([b"x", b"y"]))
        variable.assign(new, read_value=False)
    assert len(log) == len(variables) and log.nbytes > 0
    assert relaxed.numpy().shape == (2, 2)
    assert log.undo() == []
    log.close()
    assert [_bits(v) for v in variables] == before
    assert relaxed.numpy().shape == (6,)
    assert [v.dtype for v in variables][:2] == [tf.float16, tf.bfloat16]


def _bits(variable):
    value = np.array(variable.numpy())
    return (value.dtype, value.shape,
            value.tolist() if value.dtype.hasobject else value.tobytes())


def test_a_write_failing_in_the_background_is_undone_from_memory(monkeypatch):
    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    calls = []
    real = _undolog._write_all

    def failing(fd, view, offset):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(fd, view, offset)

    monkeypatch.setattr(_undolog, "_write_all", failing)
    variables = [tf.Variable(np.full((3,), k, np.float32)) for k in range(3)]
    log = _undolog.UndoLog()
    for variable in variables[:2]:
        log.record(variable)
        variable.assign(tf.fill((3,), -1.0), read_value=False)
    with pytest.raises(_undolog.LogFailed, match="No space") as info:
        log.record(variables[2])  # the second write failed: found before the third assign
    assert isinstance(info.value.__cause__, OSError)
    assert log.undo() == []
    log.close()
    assert [v.numpy().tolist() for v in variables] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]


def test_a_write_failing_at_once_is_raised_by_its_record_and_the_variable_not_logged(
        monkeypatch):
    """background=False (restore): the write of a large value fails in `record` itself,
    before the caller assigns it; what was logged before is undone, the next value goes
    where the failed one would have."""
    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    calls = []
    real = _undolog._write_all

    def failing(fd, view, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(fd, view, offset)

    monkeypatch.setattr(_undolog, "_write_all", failing)
    variables = [tf.Variable(np.full((3,), k, np.float32)) for k in range(3)]
    log = _undolog.UndoLog(background=False)
    log.record(variables[0])
    assert log._entries[0][6] is None  # on disk when record returned: nothing held
    variables[0].assign(tf.fill((3,), -1.0), read_value=False)
    with pytest.raises(_undolog.LogFailed, match="No space") as info:
        log.record(variables[1])
    assert isinstance(info.value.__cause__, OSError)
    assert len(log) == 1
    log.record(variables[2])
    assert calls[2] == calls[1]  # written where the failed one was
    variables[2].assign(tf.fill((3,), -1.0), read_value=False)
    assert log.undo() == []
    log.close()
    assert [v.numpy().tolist() for v in variables] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_narrow_float_is_written_as_bytes_not_held(dtype, monkeypatch):
    """bfloat16 (ml_dtypes' type, of NumPy kind "V") is logged like any number: written to
    the file, no copy kept in memory (a copy of every old value held a whole bfloat16 model
    in memory); and put back bit for bit."""
    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    variable = tf.Variable(tf.cast(tf.range(-3.0, 5.0) / 3, dtype))
    before = _bits(variable)
    log = _undolog.UndoLog(background=False)
    log.record(variable)
    assert log._entries[0][6] is None and log.nbytes > 0
    variable.assign(tf.zeros_like(variable), read_value=False)
    assert log.undo() == []
    log.close()
    assert _bits(variable) == before


def test_closing_stops_the_write_in_flight_at_its_next_piece(monkeypatch):
    """After a success the log is not read again: `close` stops a large value's direct write
    at its next staged piece instead of waiting for the rest."""
    import time

    monkeypatch.setattr(_undolog, "ASYNC_BYTES", 0)
    monkeypatch.setattr(_undolog, "_STAGE", 4096)
    pieces = []
    real = _undolog._write_all

    def slow(fd, view, offset):
        pieces.append(offset)
        if len(pieces) == 1:  # the first piece waits until close was called
            deadline = time.monotonic() + 10
            while not log._closing and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(fd, view, offset)

    monkeypatch.setattr(_undolog, "_write_all", slow)
    log = _undolog.UndoLog()
    if not log._direct:
        log.close()
        pytest.skip("no direct I/O on this temporary directory (written in one call)")
    variable = tf.Variable(np.arange(16 * 1024, dtype=np.float32))  # 64 KiB: 16 pieces
    log.record(variable)
    log.close()
    assert pieces == [0]  # the other 15 pieces never written
    assert len(log) == 0
