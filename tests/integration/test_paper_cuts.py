"""Paper cuts, each as a user meets it: a prefix that is a directory, a directory
written by `objckpt.save`, `objckpt inspect ... | head`, the demo run twice, `verify` on a TF1
checkpoint, repeated advice in reports, `dir(objckpt)` and the notebooks' set-up."""

import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import cli, errors
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate
from objckpt._cli import demo as _demo

from flavours import FLAVOURS, KERAS_FLAVOURS, build, keras_for, requires_keras3_session
from support import ROOT, assert_bits, python_env, run_cli, values


def _shift(obj, by: float) -> None:
    for variable in objckpt.tree(obj).values():
        if variable.dtype.is_floating:
            variable.assign(variable + by)


# --- a prefix that is a directory; a directory without a state file --------------------

@pytest.fixture(scope="module", params=FLAVOURS)
def saved_run(request, tmp_path_factory):
    """The quick tour's sequence: `objckpt.save` to <dir>/ckpt, <dir>/ckpt-2 (without
    blocking), <dir>/ckpt-3, each with other values; (obj, dir, {name: values})."""
    obj = build(request.param)
    run = tmp_path_factory.mktemp(f"run-{request.param}")
    saved = {}
    objckpt.save(obj, run / "ckpt")
    saved["ckpt"] = values(obj)
    _shift(obj, 1.0)
    handle = objckpt.save(obj, run / "ckpt-2", blocking=False)
    assert handle.result() == str(run / "ckpt-2")
    saved["ckpt-2"] = values(obj)
    _shift(obj, 1.0)
    objckpt.save(obj, run / "ckpt-3")
    saved["ckpt-3"] = values(obj)
    _shift(obj, 1.0)
    return obj, run, saved


def test_save_refuses_an_existing_directory_and_names_the_fix(saved_run):
    obj, run, _ = saved_run
    before = sorted(os.listdir(run.parent))
    for blocking in (True, False):  # a save without blocking refuses at the call
        with pytest.raises(errors.InvalidArgumentError) as caught:
            objckpt.save(obj, run, blocking=blocking)
        message = str(caught.value)
        assert f"`{run}` is a directory" in message
        assert f"pass a prefix inside it, such as `{run / 'ckpt'}`" in message
        assert caught.value.source == str(run) and caught.value.fix.startswith(
            f"pass a prefix inside it, such as `{run / 'ckpt'}`")
    with pytest.raises(errors.InvalidArgumentError, match="ends in a path separator"):
        objckpt.save(obj, str(run.parent / "new") + os.sep)
    # Nothing beside the directory (no `<dir>.index`), nothing new inside the parent.
    assert sorted(os.listdir(run.parent)) == before
    assert not os.path.exists(str(run) + ".index")
    # The one commit every writer goes through refuses it too (migrate writes through it).
    with pytest.raises(errors.InvalidArgumentError, match="is a directory"):
        _files.commit(str(run / "ckpt-3"), str(run))


def test_restore_of_a_directory_without_state_file_takes_the_newest(saved_run):
    obj, run, saved = saved_run
    assert not os.path.exists(run / "checkpoint")
    report = objckpt.restore(obj, run)
    assert_bits(values(obj), saved["ckpt-3"])
    assert f"`{run / 'ckpt-3'}`" in report.source
    assert any(f"`{run}` has no `checkpoint` state file: used `{run / 'ckpt-3'}`, the newest "
               "intact one of its 3 checkpoint(s) (newest: the highest number)" in note
               for note in report.notes), report.notes
    # Everything that takes a directory resolves it the same way.
    assert dict(objckpt.read_tree(run)) == dict(objckpt.read_tree(run / "ckpt-3"))
    plan = objckpt.plan(obj, run)
    assert "ckpt-3" in plan.source and plan.complete
    verified = objckpt.verify(run)
    assert verified.ok and verified.prefixes == tuple(
        str(run / n) for n in ("ckpt", "ckpt-2", "ckpt-3"))


def test_a_torn_newest_checkpoint_is_skipped_and_named(saved_run, tmp_path):
    obj, run, saved = saved_run
    torn = tmp_path / "run"
    torn.mkdir()
    for name in os.listdir(run):
        with open(run / name, "rb") as f, open(torn / name, "wb") as g:
            g.write(f.read())
    data = torn / "ckpt-3.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a write cut short
    _shift(obj, 5.0)
    report = objckpt.restore(obj, torn)
    assert_bits(values(obj), saved["ckpt-2"])
    assert any(note.startswith(f"skipped `{torn / 'ckpt-3'}`") for note in report.notes)
    checked = objckpt.verify(torn)
    assert not checked.ok and {p.prefix for p in checked.problems} == {str(torn / "ckpt-3")}
    # Nothing intact at all: a typed error listing each checkpoint and why.
    for name in ("ckpt", "ckpt-2"):
        os.remove(torn / f"{name}.data-00000-of-00001")
    before = values(obj)
    with pytest.raises(errors.CheckpointCorruptError, match="has no intact checkpoint") as err:
        objckpt.restore(obj, torn)
    assert all(f"`{torn / n}`" in str(err.value) for n in ("ckpt", "ckpt-2", "ckpt-3"))
    assert err.value.source == str(torn) and "write a new checkpoint" in err.value.fix
    assert_bits(values(obj), before)  # a failed restore changes nothing


def test_a_state_file_stays_authoritative(saved_run, tmp_path):
    obj, run, saved = saved_run
    managed = tmp_path / "managed"
    managed.mkdir()
    for name in os.listdir(run):
        with open(run / name, "rb") as f, open(managed / name, "wb") as g:
            g.write(f.read())
    _ckptstate.write_state(str(managed), ["ckpt", "ckpt-2"], 1700000000.0)  # ckpt-3: unlisted
    report = objckpt.restore(obj, managed)
    assert_bits(values(obj), saved["ckpt-2"])
    assert not any("state file" in note for note in report.notes)


def test_newest_by_number_in_a_series_else_by_index_time(tmp_path):
    def touch(name: str, mtime: float) -> None:
        for suffix in (".index", _files.DATA_SUFFIX):
            (tmp_path / (name + suffix)).write_bytes(b"")
        os.utime(tmp_path / (name + ".index"), (mtime, mtime))

    # One series: by number, whatever the times (a copy resets them).
    for name, mtime in (("ckpt", 300), ("ckpt-2", 100), ("ckpt-10", 200)):
        touch(name, mtime)
    (tmp_path / ".ckpt-11.tmp-0123456789ab.index").write_bytes(b"")  # an unfinished write
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.index"
    elsewhere.write_bytes(b"")
    os.symlink(elsewhere, tmp_path / "ckpt-12.index")  # resolves outside: not this directory's
    found, how = _files.directory_prefixes(str(tmp_path))
    assert [os.path.basename(p) for p in found] == ["ckpt-10", "ckpt-2", "ckpt"]
    assert how == "the highest number"
    # Other names: the index written last first; equal times by name.
    touch("best", 250)
    touch("final", 250)
    found, how = _files.directory_prefixes(str(tmp_path))
    assert [os.path.basename(p) for p in found] == [
        "ckpt", "final", "best", "ckpt-10", "ckpt-2"]
    assert how == "the index file modified last"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(errors.CheckpointNotFoundError, match="holds no checkpoint"):
        _files.resolve_prefix(str(empty))


@pytest.mark.subprocess
def test_cli_inspect_and_verify_take_the_directory(saved_run, request):
    if request.node.callspec.params["saved_run"] != "module":
        pytest.skip("the command line reads files only: one flavour's are enough")
    _, run, _ = saved_run
    inspect = run_cli("inspect", run, blocked=False, timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    assert inspect.stdout.startswith(f"checkpoint {run / 'ckpt-3'}:")
    verify = run_cli("verify", run, blocked=False, timeout=120)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.splitlines()[-1].startswith(
        f"OK: {run / 'ckpt'}, {run / 'ckpt-2'}, {run / 'ckpt-3'}:")


# --- `objckpt inspect ... | head` -------------------------------------------------------

@pytest.mark.subprocess
def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path):
    module = tf.Module()
    module.v = [tf.Variable(tf.zeros([2]), name=f"v{i}") for i in range(2000)]
    prefix = objckpt.save(module, tmp_path / "ckpt")
    for args in ((), ("--format", "json")):
        with subprocess.Popen([sys.executable, "-m", "objckpt", "inspect", prefix, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=python_env()) as p:
            first = p.stdout.readline()  # what `head -1` reads, then it goes away
            p.stdout.close()
            err = p.stderr.read().decode()
            code = p.wait(timeout=120)
        assert first.startswith(b"checkpoint " if not args else b"{")
        # The listing (> 100 KB) outgrows the pipe, so the writer meets the closed end.
        assert code == cli.CLOSED_PIPE_EXIT == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


# --- the demo ----------------------------------------------------------------------------

@requires_keras3_session
def test_demo_runs_twice_into_one_folder(tmp_path):
    # In this process (tests/_cli/test_demo.py runs it as a command): the second run used to end
    # in KeyError: 'val_loss' (its Checkpointing resumed a finished run: nothing trained).
    out = tmp_path / "demo"
    texts = []
    for _ in range(2):
        stream = io.StringIO()
        assert _demo.run(out=str(out), epochs=1, stream=stream) == 0, stream.getvalue()
        texts.append(stream.getvalue())
    for number, text in enumerate(texts):
        lines = text.splitlines()
        assert lines[0] == f"objckpt demo ({_demo.DURATION}): writing under {out}"
        assert ("held an earlier demo run" in text) == (number == 1)
        assert re.search(r"^\r?  epoch 1/1  loss [\d.]+  val_loss [\d.]+", text, re.M)
        assert lines[-1] == f"All checks passed. Files are under {out}"
    assert f"{out / 'run'} held an earlier demo run: removed its" in texts[1]
    assert "this run trains afresh" in texts[1]
    assert objckpt.verify(out / "run").ok


@pytest.mark.subprocess
def test_demo_removes_only_its_own_files_and_states_its_time(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint", ".objckpt.lock", "ckpt-3.index", "ckpt-3.data-00000-of-00001"):
        (run / name).write_bytes(b"")
    assert _demo._start_afresh(str(run)) == 4 and os.listdir(run) == []
    (run / "ckpt-1.index").write_bytes(b"")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(errors.InvalidArgumentError, match=r"notes\.txt.*another --out"):
        _demo._start_afresh(str(run))
    assert sorted(os.listdir(run)) == ["ckpt-1.index", "notes.txt"]  # nothing removed
    helped = run_cli("--help", blocked=False, timeout=120)
    assert f"({_demo.DURATION})" in helped.stdout and "one-minute" not in helped.stdout


# --- verify on a TF1 checkpoint ---------------------------------------------------------

def test_verify_a_tf1_checkpoint_claims_no_object_graph(tmp_path):
    with tf.Graph().as_default():  # a TF1 Saver: a name-based checkpoint
        v = tf.compat.v1.get_variable("dense/kernel", initializer=tf.ones([2, 3]))
        with tf.compat.v1.Session() as session:
            session.run(v.initializer)
            tf1 = tf.compat.v1.train.Saver([v]).save(session, str(tmp_path / "tf1" / "model"))
    report = objckpt.verify(tf1)
    text = report.describe()
    assert report.ok and "no object graph to check" in text
    assert "object graph consistent" not in text
    assert text.splitlines()[-1].endswith("passed their checksums (name-based: no object graph)")
    module = tf.Module()
    module.w = tf.Variable(tf.ones([3]))
    prefix = objckpt.save(module, tmp_path / "ckpt")
    assert objckpt.verify(prefix).describe().endswith("passed their checksums; object graph "
                                                      "consistent")


# --- repeated advice --------------------------------------------------------------------

def test_grouped_gives_each_reason_once():
    items = [f"optimizer/_variables/{i}: no optimizer to put it in" for i in range(8)]
    items.insert(3, "seed/state: random generator state, left as is")
    assert _render.grouped(items) == [
        "no optimizer to put it in (8): optimizer/_variables/0, optimizer/_variables/1, "
        "optimizer/_variables/2, optimizer/_variables/3, optimizer/_variables/4 and 3 more",
        "seed/state: random generator state, left as is"]
    assert _render.grouped(["no colon here", "a: b"]) == ["no colon here", "a: b"]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_report_gives_the_compile_advice_once(flavour, tmp_path):
    keras = keras_for(flavour)

    def mlp():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                 keras.layers.Dense(1)])

    trained = mlp()
    trained.compile(keras.optimizers.Adam(0.01), "mse")
    trained.fit(np.ones((8, 4), "float32"), np.ones((8, 1), "float32"), verbose=0)
    prefix = objckpt.save(trained, tmp_path / "ckpt")
    fresh = mlp()
    report = objckpt.restore(fresh, prefix)  # an uncompiled model: optimizer state skipped
    assert len(report.skipped) >= 5
    advice = "compile the model and build its optimizer"
    for text in (str(report), objckpt.plan(fresh, prefix).describe()):
        assert text.count(advice) == 1, text
        assert f"skipped ({len(report.skipped)}):" in text
        assert f"({len(report.skipped)}): " in text.split(advice, 1)[1]


# --- dir(objckpt) -----------------------------------------------------------------------

def test_dir_shows_the_public_names_only():
    names = dir(objckpt)
    assert set(objckpt.__all__) <= set(names)
    assert {n for n in names if not n.startswith("__")} == set(objckpt.__all__)
    assert "__version__" in names
    for private in ("TYPE_CHECKING", "annotations", "importlib", "_LAZY"):
        assert private not in names


# --- the notebooks' set-up --------------------------------------------------------------

def test_notebooks_install_from_the_url_pyproject_declares():
    nbformat = pytest.importorskip("nbformat")
    del nbformat
    sys.path.insert(0, os.path.join(ROOT, "colab"))
    try:
        import make_notebooks
    finally:
        sys.path.remove(os.path.join(ROOT, "colab"))
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        urls = tomllib.load(f)["project"]["urls"]
    assert urls["Repository"] == f"https://github.com/{make_notebooks.REPO}"
    assert f"git+{urls['Repository']}\"" in make_notebooks.INSTALL
    for name, cells in make_notebooks.NOTEBOOKS.items():
        nb = make_notebooks.notebook(name, cells)
        code = ["".join(c.source) for c in nb.cells if c.cell_type == "code"]
        assert f"https://colab.research.google.com/github/{make_notebooks.REPO}/" in \
            nb.cells[0].source
        imports = next(c for c in code if "import tensorflow" in c)
        # TF's log level is set before TF is imported; the last cell removes the work folder.
        assert imports.index("TF_CPP_MIN_LOG_LEVEL") < imports.index("import tensorflow")
        assert "shutil.rmtree(work)" in code[-1], name
