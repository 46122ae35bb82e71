"""Untrusted checkpoint directories: every file is untrusted input, and no intact
checkpoint is ever deleted unless provably superseded (DESIGN.md, invariants 2 and 10).

Regression tests for what fuzzing found: stray files taken for data shards, state files that
name deleted checkpoints or other directories' checkpoints, read-only directories, and special
files (FIFOs, a link to `/dev/zero`) where a state file or an index should be. Every test that
touches a FIFO or a device runs the operation in a child process with a time and memory limit,
so a regression fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import Checkpointing

from flavours import _data, build_functional, keras_for, session_flavour
from support import ROOT, assert_bits, values

# --- helpers ---------------------------------------------------------------------------


def make():
    keras = keras_for(session_flavour())
    keras.utils.set_random_seed(0)
    return keras, build_functional(keras, train=False)


def fit(model, callbacks, epochs=3):
    images, tokens, targets = _data()
    x = images if model.name == "net" else [images, tokens]
    model.fit(x, targets, epochs=epochs, batch_size=2, shuffle=False, verbose=0,
              callbacks=callbacks)


def files(directory) -> dict:
    """name -> bytes of every regular file (the lock file aside)."""
    return {n: (directory / n).read_bytes() for n in sorted(os.listdir(directory))
            if n != ".objckpt.lock" and (directory / n).is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A directory of ckpt-1..3 written by Checkpointing (at steps 4, 8, 12), its files, and
    the model's values at the end (= ckpt-3)."""
    directory = tmp_path_factory.mktemp("trained")
    _, model = make()
    fit(model, [Checkpointing(directory, max_to_keep=3, save_freq=4)])
    return directory, files(directory), values(model)


@pytest.fixture
def three(tmp_path, trained):
    """A fresh copy of `trained`'s directory: (directory, its files, values at ckpt-3)."""
    _, content, final = trained
    directory = tmp_path / "run"
    directory.mkdir()
    for name, data in content.items():
        (directory / name).write_bytes(data)
    return directory, content, final


def begin(directory, **kwargs):
    """A Checkpointing callback on a fresh model, after on_train_begin (resumed or not)."""
    _, model = make()
    callback = Checkpointing(directory, max_to_keep=3, save_freq=4, **kwargs)
    callback.model = model
    callback.on_train_begin()
    return callback, model


def layout_of(model):
    """A root with the layout Checkpointing writes: model, counters, monitored value."""
    return tf.train.Checkpoint(model=model, **{n: tf.Variable(0, dtype=tf.int64)
                                               for n in _checkpointing.COUNTERS},
                               monitor_value=tf.Variable(0.0, dtype=tf.float64))


def copy_checkpoint(src_prefix, dst_prefix):
    for suffix in (".index", _files.DATA_SUFFIX):
        shutil.copyfile(str(src_prefix) + suffix, str(dst_prefix) + suffix)


def write_state(directory, names):
    """A TF `checkpoint` state file naming `names` (oldest first), exactly as given."""
    text = [f'model_checkpoint_path: "{names[-1]}"']
    text += [f'all_model_checkpoint_paths: "{n}"' for n in names]
    (directory / "checkpoint").write_text("\n".join(text) + "\n")


# --- stray files, wrong state files: never delete an intact checkpoint --------------------


@pytest.mark.parametrize("stray", [".bak", ".tempstate8234723"])
def test_stray_file_beside_the_newest_checkpoint_is_not_a_shard(three, stray):
    """(a) `ckpt-3.data-00000-of-00001.bak` made ckpt-3 look incomplete: it resumed from
    ckpt-2 and deleted ckpt-3 with its stray file."""
    directory, content, final = three
    name = "ckpt-3" + _files.DATA_SUFFIX + stray
    (directory / name).write_bytes(content["ckpt-3" + _files.DATA_SUFFIX])
    assert _files.data_files_problem(str(directory / "ckpt-3")) is None
    callback, model = begin(directory)
    try:
        assert callback.resumed_from == str(directory / "ckpt-3")
        assert callback.manager.notes == []  # nothing to warn about
        assert_bits(final, values(model))
        assert files(directory) == {**content, name: content["ckpt-3" + _files.DATA_SUFFIX]}
        # Retention drops ckpt-3 by its exact file names: the stray file stays.
        for _ in range(3):
            callback.manager.save()
    finally:
        callback.on_train_end()
    assert [k.number for k in callback.manager.kept] == [4, 5, 6]
    assert not os.path.exists(directory / "ckpt-3.index")
    assert not os.path.exists(directory / ("ckpt-3" + _files.DATA_SUFFIX))
    assert (directory / name).read_bytes() == content["ckpt-3" + _files.DATA_SUFFIX]


def test_state_file_naming_only_a_deleted_checkpoint_falls_back_to_the_intact_ones(three):
    """(b) The state file named only a missing ckpt-5: "training starts fresh" and ckpt-1..3
    were deleted."""
    directory, content, final = three
    write_state(directory, ["ckpt-5"])
    with pytest.warns(RuntimeWarning, match="names no intact checkpoint.*ckpt-3"):
        callback, model = begin(directory)
    try:
        assert callback.resumed_from == str(directory / "ckpt-3")
        assert_bits(final, values(model))
        on_disk = files(directory)
        assert {n: on_disk[n] for n in content if n != "checkpoint"} == {
            n: content[n] for n in content if n != "checkpoint"}
        state = tf.train.get_checkpoint_state(str(directory))  # rewritten: lists what is here
        assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
            "ckpt-1", "ckpt-2", "ckpt-3"]
    finally:
        callback.on_train_end()


@pytest.mark.parametrize("form", ["absolute", "relative", "link"])
def test_checkpointing_never_follows_a_state_file_into_another_directory(three, tmp_path, form):
    """(c) `model_checkpoint_path: "/elsewhere/ckpt-5"` was taken for this directory's ckpt-5
    (missing): training started fresh and ckpt-1..3 were deleted."""
    directory, content, final = three
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy_checkpoint(directory / "ckpt-1", elsewhere / "ckpt-5")
    theirs = files(elsewhere)
    if form == "link":
        os.symlink(elsewhere, directory / "link")
    name = {"absolute": str(elsewhere / "ckpt-5"), "relative": "../elsewhere/ckpt-5",
            "link": "link/ckpt-5"}[form]
    write_state(directory, ["ckpt-2", name])
    with pytest.warns(RuntimeWarning, match="not a `ckpt-N` checkpoint of"):
        callback, model = begin(directory)
    try:
        assert callback.resumed_from == str(directory / "ckpt-3")  # what is on disk here
        assert_bits(final, values(model))
        on_disk = files(directory)
        assert all(on_disk[n] == content[n] for n in content if n != "checkpoint")
        assert files(elsewhere) == theirs  # never used, never deleted
    finally:
        callback.on_train_end()


def test_unlisted_intact_checkpoints_newer_are_kept_older_are_superseded(three):
    """A crash between the index rename and the state file leaves an intact, unlisted, newer
    ckpt-N: it is left in place (not used, not deleted) until a newer one is committed; an
    unlisted older one is superseded by the newest listed and removed."""
    directory, _, final = three
    copy_checkpoint(directory / "ckpt-3", directory / "ckpt-4")
    write_state(directory, ["ckpt-2", "ckpt-3"])  # ckpt-1: dropped before a crash
    with pytest.warns(RuntimeWarning, match="ckpt-4` is intact but not listed"):
        callback, model = begin(directory)
    try:
        assert callback.resumed_from == str(directory / "ckpt-3")
        assert_bits(final, values(model))
        assert not os.path.exists(directory / "ckpt-1.index")  # superseded by ckpt-3
        assert os.path.exists(directory / "ckpt-4.index")
        assert _files.check_intact(str(directory / "ckpt-4")) is None
        assert callback.manager.save().endswith("ckpt-5")  # numbered past it
    finally:
        callback.on_train_end()
    callback, _ = begin(directory)  # ckpt-5 is committed: ckpt-4 is superseded now
    try:
        assert callback.resumed_from == str(directory / "ckpt-5")
        assert not os.path.exists(directory / "ckpt-4.index")
        assert [k.number for k in callback.manager.kept] == [2, 3, 5]
    finally:
        callback.on_train_end()


def test_fresh_start_beside_intact_checkpoints_of_other_names_is_refused(tmp_path):
    directory = tmp_path / "run"
    _, model = make()
    ours = objckpt.save(model, str(directory / "model.ckpt-100"))
    write_state(directory, ["model.ckpt-100"])  # as tf.train.CheckpointManager names them
    before = files(directory)
    warned = pytest.warns(RuntimeWarning, match="not a `ckpt-N` checkpoint")
    with pytest.raises(errors.CheckpointDirectoryError) as info, warned:
        begin(directory)
    err = info.value
    assert isinstance(err, errors.ObjckptError) and isinstance(err, FileExistsError)
    assert err.found == (ours,) and err.directory == str(directory)
    message = str(err)
    assert ours in message and "refusing to start training fresh" in message
    assert "another directory" in message and "objckpt.restore(model, prefix)" in message
    assert files(directory) == before  # nothing changed, the state file included
    # The lock was released: once they are moved away, a fresh start is fine.
    for name in before:
        os.remove(directory / name)
    callback, _ = begin(directory)
    try:
        assert callback.resumed_from is None
    finally:
        callback.on_train_end()


def test_state_file_names_are_ckpt_n_of_this_directory_only(tmp_path):
    manager = _checkpointing.CheckpointDirectory(tmp_path, tf.Module())
    here = str(tmp_path)
    assert manager.commits.number("ckpt-3") == 3
    assert manager.commits.number(os.path.join(here, "ckpt-3")) == 3  # TF1 Saver: absolute
    assert manager.commits.number(os.path.join(here, "sub", "..", "ckpt-3")) == 3
    for name in ["/elsewhere/ckpt-5", "../x/ckpt-5", "./ckpt-5", "sub/ckpt-5", "ckpt-05",
                 "ckpt-\u0663", "ckpt-3\n", "ckpt-3\x00", "ckpt", "model.ckpt-3", "ckpt--3",
                 "ckpt-3.index"]:
        assert manager.commits.number(name) is None, name


# --- read-only directories ------------------------------------------------------------


@pytest.fixture
def read_only(monkeypatch):
    """Makes a directory read-only (chmod 0o555); where that does not bind (root), simulates
    it: opening a file in it for writing fails with EACCES, as it would."""
    made = []

    def make_read_only(directory):
        with contextlib.suppress(FileNotFoundError):
            os.remove(directory / ".objckpt.lock")
        os.chmod(directory, 0o555)
        made.append(directory)
        if os.access(directory, os.W_OK):  # root ignores permissions
            real_open = os.open

            def denied(path, flags, *args, **kwargs):
                writes = flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR)
                if writes and os.path.dirname(os.path.abspath(path)) == str(directory):
                    raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
                return real_open(path, flags, *args, **kwargs)

            monkeypatch.setattr(os, "open", denied)

    yield make_read_only
    for directory in made:
        os.chmod(directory, 0o755)


def test_read_only_directory_is_a_typed_write_error(three, read_only):
    directory, content, _ = three
    read_only(directory)
    _, model = make()
    with pytest.raises(errors.CheckpointWriteError) as info:
        fit(model, [Checkpointing(directory, max_to_keep=3, save_freq=4)], epochs=4)
    message = str(info.value)
    assert isinstance(info.value, OSError)
    assert str(directory) in message and "Permission denied" in message
    assert "chmod" in message and "on_error='warn'" in message
    assert files(directory) == content


def test_read_only_directory_with_on_error_warn_resumes_and_trains_without_saving(
        three, read_only):
    directory, content, final = three
    read_only(directory)
    _, model = make()
    callback = Checkpointing(directory, max_to_keep=3, save_freq=4, on_error="warn")
    with pytest.warns(RuntimeWarning, match="Permission denied.*without saving"):
        fit(model, [callback], epochs=4)
    assert callback.resumed_from == str(directory / "ckpt-3")
    assert callback.saved == [] and callback.manager.failures == 1  # the save at step 16
    assert files(directory) == content
    trained = values(model)
    assert any(trained[p].tobytes() != final[p].tobytes() for p in final)  # epoch 4 ran


# --- special files: refused, never opened -----------------------------------------------
# A regression would block on a FIFO (TF's C++ reader holds the GIL while it opens the index,
# so no thread of the test could step in) or read /dev/zero until memory ran out: each runs
# in a child process with a time and a memory limit.

_CHILD = """if True:
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_DATA, (5 << 30, 5 << 30))
    sys.path.insert(0, sys.argv[1])
    import warnings
    warnings.simplefilter("ignore")
    import tensorflow as tf
    import objckpt
    from objckpt import errors
    from objckpt._training import checkpointing as _checkpointing
    from objckpt._bundle import state as _ckptstate
    from objckpt._bundle import files as _files

    directory = sys.argv[2]
    module = tf.Module()
    module.v = tf.Variable([0.0, 0.0])
    out = {}

    def attempt(name, operation):
        try:
            out[name] = operation()
        except Exception as err:
            out[name] = [type(err).__name__, str(err)]

    def resume():
        manager = _checkpointing.CheckpointDirectory(directory, module)
        latest = manager.open()
        try:
            if latest is not None:
                manager.restore(latest)
            return [latest and latest.prefix, module.v.numpy().tolist(), manager.notes]
        finally:
            manager.close()

    def restore(source):
        report = objckpt.restore(module, source, at="model")
        return [report.source, module.v.numpy().tolist(), list(report.notes)]

    exec(sys.argv[3])
    print(json.dumps(out))
"""


def in_child(directory, code: str) -> dict:
    """Runs `code` (with `attempt`, `resume`, `restore`, `out` at hand, see `_CHILD`) in a
    child process limited to 5 GiB of data and 120 s; returns its `out`."""
    done = subprocess.run([sys.executable, "-c", _CHILD, ROOT, str(directory),
                           code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def module_checkpoints(directory) -> dict:
    """ckpt-1..3 of a tf.Module (v = [1, 1], [2, 2], [3, 3]) written by Checkpointing's
    CheckpointDirectory; returns the files."""
    module = tf.Module()
    module.v = tf.Variable([0.0, 0.0])
    manager = _checkpointing.CheckpointDirectory(
        directory, module, retention=_checkpointing.RetentionPolicy(max_to_keep=3))
    manager.open()
    for value in (1.0, 2.0, 3.0):
        module.v.assign([value, value])
        manager.save()
    manager.close()
    return files(directory)


def assert_rewritten(directory, content):
    """The checkpoints are untouched and the state file is a regular one naming them."""
    on_disk = files(directory)
    assert {n: on_disk.get(n) for n in content if n != "checkpoint"} == {
        n: content[n] for n in content if n != "checkpoint"}
    state = tf.train.get_checkpoint_state(str(directory))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-1", "ckpt-2", "ckpt-3"]


@pytest.mark.subprocess
def test_fifo_state_file_is_refused_without_opening_it(tmp_path):
    content = module_checkpoints(tmp_path)
    state = tmp_path / "checkpoint"
    os.remove(state)
    os.mkfifo(state)
    out = in_child(tmp_path, """if True:
        attempt("read_state", lambda: _ckptstate.read_state(directory))
        attempt("restore", lambda: restore(directory))
        attempt("resume", resume)
    """)
    kind, message = out["read_state"]
    assert kind == "CheckpointCorruptError"
    assert f"`{state}` is a FIFO (named pipe), not a regular file" in message
    assert "Expected a regular text file" in message and "delete it" in message
    assert out["restore"][0] == "CheckpointCorruptError" and "FIFO" in out["restore"][1]
    # Checkpointing falls back to the intact checkpoints on disk, with a warning, and
    # replaces the FIFO with a regular state file naming them.
    prefix, value, notes = out["resume"]
    assert prefix == str(tmp_path / "ckpt-3") and value == [3.0, 3.0]
    assert "cannot be read" in notes[0] and "FIFO" in notes[0]
    assert_rewritten(tmp_path, content)


@pytest.mark.subprocess
def test_fifo_index_is_refused_without_opening_it(tmp_path):
    module_checkpoints(tmp_path)
    index = tmp_path / "ckpt-3.index"
    os.remove(index)
    os.mkfifo(index)
    prefix = str(tmp_path / "ckpt-3")
    out = in_child(tmp_path, f"""if True:
        attempt("check_intact", lambda: _files.check_intact({prefix!r}))
        attempt("restore_prefix", lambda: restore({prefix!r}))
        attempt("restore_directory", lambda: restore(directory))
        attempt("resume", resume)
    """)
    assert out["check_intact"] == f"`{index}` is a FIFO (named pipe), not a regular file"
    kind, message = out["restore_prefix"]
    assert kind == "CheckpointCorruptError" and f"`{index}` is a FIFO" in message
    source, value, notes = out["restore_directory"]  # a directory skips it, and says so
    assert source.endswith("ckpt-2`") and value == [2.0, 2.0]
    assert any(f"skipped `{prefix}`" in note and "FIFO" in note for note in notes)
    prefix_used, value, notes = out["resume"]
    assert prefix_used == str(tmp_path / "ckpt-2") and value == [2.0, 2.0]
    assert "not intact" in notes[0] and "FIFO" in notes[0]
    assert not os.path.exists(index)  # not a checkpoint: removed with the rest of ckpt-3


@pytest.mark.subprocess
def test_state_file_linked_to_dev_zero_is_refused_without_reading_it(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    content = module_checkpoints(tmp_path)
    state = tmp_path / "checkpoint"
    os.remove(state)
    os.symlink("/dev/zero", state)
    out = in_child(tmp_path, """if True:
        attempt("read_state", lambda: _ckptstate.read_state(directory))
        attempt("restore", lambda: restore(directory))
        attempt("resume", resume)
    """)
    kind, message = out["read_state"]
    assert kind == "CheckpointCorruptError" and str(state) in message
    assert "(a symbolic link to `/dev/zero`) is a character device" in message
    assert out["restore"][0] == "CheckpointCorruptError"
    prefix, value, notes = out["resume"]
    assert prefix == str(tmp_path / "ckpt-3") and value == [3.0, 3.0]
    assert "character device" in notes[0]
    assert not os.path.islink(state)
    assert_rewritten(tmp_path, content)


def test_oversized_state_file_is_refused(tmp_path):
    (tmp_path / "checkpoint").write_bytes(b"#" * (_ckptstate.STATE_FILE_LIMIT + 1))
    with pytest.raises(errors.CheckpointCorruptError, match="more than the 1,048,576 such a file"):
        _ckptstate.read_state(str(tmp_path))


# --- objckpt.restore(obj, directory) stays inside the directory ----------------------------


def _module(value):
    module = tf.Module()
    module.v = tf.Variable([value, value])
    return module


@pytest.mark.parametrize("form", ["absolute", "relative", "link"])
def test_restore_from_a_directory_never_follows_its_state_file_outside(tmp_path, form):
    directory, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    objckpt.save(_module(1.0), str(directory / "ckpt-1"))
    outside = objckpt.save(_module(5.0), str(elsewhere / "ckpt-5"))
    if form == "link":
        os.symlink(elsewhere, directory / "link")
    name = {"absolute": outside, "relative": "../elsewhere/ckpt-5", "link": "link/ckpt-5"}[form]
    write_state(directory, ["ckpt-1", name])
    target = _module(0.0)
    report = objckpt.restore(target, str(directory))
    assert target.v.numpy().tolist() == [1.0, 1.0]
    assert report.source.endswith("ckpt-1`")
    assert any("outside the directory" in n and "ckpt-5" in n for n in report.notes)
    # verify checks what restore would read, and names the name it did not follow.
    checked = objckpt.verify(str(directory))
    assert checked.prefixes == (str(directory / "ckpt-1"),)
    assert [p.where for p in checked.problems] == [""]
    assert "outside the directory" in checked.problems[0].message
    # Passed explicitly, that prefix is the caller's choice.
    objckpt.restore(target, outside)
    assert target.v.numpy().tolist() == [5.0, 5.0]
    # A state file naming nothing intact inside: the error lists what is here.
    write_state(directory, [name])
    before = target.v.numpy().tolist()
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.restore(target, str(directory))
    message = str(info.value)
    assert "outside the directory" in message and str(directory / "ckpt-1") in message
    assert "as the prefix" in message
    assert target.v.numpy().tolist() == before


def test_restore_from_a_directory_whose_state_file_names_a_deleted_checkpoint(tmp_path):
    objckpt.save(_module(1.0), str(tmp_path / "ckpt-1"))
    objckpt.save(_module(2.0), str(tmp_path / "ckpt-2"))
    write_state(tmp_path, ["ckpt-3"])
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.restore(_module(0.0), str(tmp_path))
    message = str(info.value)
    assert "ckpt-3.index` does not exist" in message
    assert f"`{tmp_path / 'ckpt-1'}`, `{tmp_path / 'ckpt-2'}`" in message
    assert "Fix: pass one of them as the prefix" in message


def test_a_lock_the_file_system_cannot_take_is_not_called_in_use(tmp_path, monkeypatch):
    from objckpt._bundle import lock as _dirlock

    def unsupported(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_dirlock.fcntl, "flock", unsupported)
    with pytest.raises(errors.CheckpointWriteError) as info:
        _dirlock.DirectoryLock(str(tmp_path)).acquire()
    assert "locking its lock file" in str(info.value) and "No locks available" in str(info.value)
    assert "in use" not in str(info.value)
