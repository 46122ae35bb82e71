"""The one restore pipeline: restore, migrate, load_ensemble and restore_on_create all run
through `_pipeline.Pipeline` (open, plan and check, fetch, one agreement across workers),
and a failure in any stage leaves every variable as it was, for each operation."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._planning import pipeline as _pipeline

from flavours import FLAVOURS, keras_for

OPERATIONS = ("restore", "migrate", "load_ensemble", "restore_on_create")


class _Net(tf.Module):
    def __init__(self, width=4, seed=0):
        super().__init__(name="net")
        self.w = tf.Variable(tf.random.stateless_normal((3, width), seed=(seed, 1)))
        self.b = tf.Variable(tf.random.stateless_normal((width,), seed=(seed, 2)))


def _build(flavour, width=4, seed=0):
    """A built obj of the flavour, its values from `seed`."""
    if flavour == "module":
        return _Net(width, seed)
    keras = keras_for(flavour)
    tf.random.set_seed(seed)
    model = keras.Sequential([keras.layers.Dense(width)])
    model(tf.ones((1, 3)))
    return model


def _values(obj) -> dict:
    return {path: v.numpy().tobytes() for path, v in objckpt.tree(obj).items()}


def _run(operation, obj, source, tmp_path, rules=None):
    """Runs `operation` of obj from source (the migrate prefix under tmp_path); returns what
    it returns."""
    if operation == "restore":
        return objckpt.restore(obj, source, rules=rules)
    if operation == "migrate":
        return objckpt.migrate(obj, source, str(tmp_path / "migrated" / "ckpt"), rules=rules)
    if operation == "load_ensemble":
        return objckpt.load_ensemble(obj, [source, source], rules=rules)
    pending = objckpt.restore_on_create(obj, source, rules=rules)
    pending.assert_done()
    return pending


@pytest.fixture(scope="module", params=FLAVOURS)
def flavour(request):
    if request.param != "module":
        keras_for(request.param)  # skips a flavour this environment lacks
    return request.param


@pytest.fixture(scope="module")
def saved(flavour, tmp_path_factory):
    """A checkpoint of the flavour's obj (seed 1), one whose widths differ, and the values
    of the first."""
    folder = tmp_path_factory.mktemp(f"pipeline-{flavour}")
    source = _build(flavour, seed=1)
    good = objckpt.save(source, str(folder / "good"))
    wide = objckpt.save(_build(flavour, width=5, seed=1), str(folder / "wide"))
    return good, wide, _values(source)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_runs_through_the_one_pipeline(operation, flavour, saved, tmp_path,
                                                       monkeypatch):
    opened, decided, agreed = [], [], []
    real_open, real_decided = _pipeline.Pipeline.open, _pipeline.Pipeline.decided
    real_agree = _pipeline.agree_across_workers

    def open_(self, source=None):
        opened.append(self.operation)
        return real_open(self, source)

    def decided_(self, *args, **kwargs):
        decided.append(self.operation)
        return real_decided(self, *args, **kwargs)

    def agree(variables, failure, operation):
        agreed.append((operation, failure))
        return real_agree(variables, failure, operation)

    monkeypatch.setattr(_pipeline.Pipeline, "open", open_)
    monkeypatch.setattr(_pipeline.Pipeline, "decided", decided_)
    monkeypatch.setattr(_pipeline, "agree_across_workers", agree)
    obj = _build(flavour)
    _run(operation, obj, saved[0], tmp_path)
    name = f"objckpt.{operation}"
    sources = 2 if operation == "load_ensemble" else 1
    assert opened == [name] * sources
    assert decided == [name]  # one decision point: every worker agrees once
    assert agreed == [(name, None)]
    if operation in ("restore", "restore_on_create"):
        assert _values(obj) == saved[2]


def _other_worker_failed(monkeypatch):
    """The all-gather says worker 1 failed (its checks), whatever this worker found."""
    kind = 1 + errors.__all__.index("StructureMismatchError")

    def gather(variables, own_kind, message):
        return [("worker:1", kind, "StructureMismatchError: boom on worker 1")]

    monkeypatch.setattr(_compat, "gather_failures", gather)


def _blows_up(value):
    """A rule's transform that fails only when values are read (not when traced)."""
    return tf.debugging.check_numerics(value * np.inf, "a transform failing at fetch")


# stage -> (source: "good", "wide" or "missing"; rules; the error expected)
STAGES = {
    "open": ("missing", None, errors.CheckpointNotFoundError),
    "check": ("wide", None, errors.StructureMismatchError),
    "fetch": ("good", [(r"^(.*)$", r"\1", _blows_up)], tf.errors.InvalidArgumentError),
    "agree": ("good", None, errors.StructureMismatchError),
}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_failure_in_any_stage_changes_nothing(operation, stage, flavour, saved, tmp_path,
                                                monkeypatch):
    which, rules, expected = STAGES[stage]
    source = {"good": saved[0], "wide": saved[1],
              "missing": str(tmp_path / "no" / "such-ckpt")}[which]
    if stage == "agree":
        _other_worker_failed(monkeypatch)
    obj = _build(flavour)
    before = _values(obj)
    assert before != saved[2]  # a restore that happened would show
    with pytest.raises(expected) as info:
        _run(operation, obj, source, tmp_path, rules=rules)
    assert _values(obj) == before
    assert not os.path.exists(tmp_path / "migrated")  # migrate wrote nothing, no folder
    if stage == "agree":
        assert "failed on worker worker:1" in str(info.value)
        assert f"objckpt.{operation} failed" in str(info.value)
    elif isinstance(info.value, errors.ObjckptError):
        assert info.value.obj is not None and info.value.source is not None


def test_a_snapshot_restore_agrees_once_on_every_path(flavour, monkeypatch):
    """The fast path (a Snapshot of the obj itself) and the cached plan (a Snapshot of
    another instance, the second time) are decision points too: one agreement each."""
    agreed = []
    real_agree = _pipeline.agree_across_workers
    monkeypatch.setattr(_pipeline, "agree_across_workers", lambda variables, failure, op: (
        agreed.append((op, failure)), real_agree(variables, failure, op))[1])
    obj, other = _build(flavour), _build(flavour, seed=1)
    own, theirs = objckpt.snapshot(obj), objckpt.snapshot(other)
    objckpt.restore(obj, own)  # fast
    planned = objckpt.restore(obj, theirs)  # planned, then cached
    assert objckpt.restore(obj, theirs) == planned  # (Keras trees: from the cache)
    assert agreed == [("objckpt.restore", None)] * 3
    assert _values(obj) == _values(other)
