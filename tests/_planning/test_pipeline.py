"""The one restore pipeline: restore, plan, the CLI's migrate --dry-run, migrate,
load_ensemble and restore_on_create (variables that exist, and variables created later)
all run through `_pipeline.Pipeline`'s stages (open, plan, check, fetch, agree, assign,
refresh derived state) in the pipeline's order, and a failure in any stage before the
assign leaves every variable as it was, for each operation."""

import argparse
import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._planning import agree as _agree
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


def _other_worker_failed(monkeypatch):
    """The all-gather says worker 1 failed (its checks), whatever this worker found."""
    kind = 1 + _agree._AGREED_ERRORS.index(errors.StructureMismatchError)  # warnings left out

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
    real_agree = _agree.agree_across_workers
    monkeypatch.setattr(_agree, "agree_across_workers", lambda variables, failure, op: (
        agreed.append((op, failure)), real_agree(variables, failure, op))[1])
    obj, other = _build(flavour), _build(flavour, seed=1)
    own, theirs = objckpt.snapshot(obj), objckpt.snapshot(other)
    objckpt.restore(obj, own)  # fast
    planned = objckpt.restore(obj, theirs)  # planned, then cached
    assert objckpt.restore(obj, theirs) == planned  # (Keras trees: from the cache)
    assert agreed == [("objckpt.restore", None)] * 3
    assert _values(obj) == _values(other)


# --- every stage, for every operation -----------------------------------------------------

# operation -> the stages it passes through, in the order it first enters each. migrate
# writes its checkpoint where the others assign (fetching a group at a time, after the
# agreement); restore_on_create reads each value before checking it (a transform's output
# is known once read); for a variable created later, it agrees at the start and runs
# fetch, check, assign and refresh when the variable appears.
EXPECTED = {
    "restore": ("open", "plan", "check", "fetch", "agree", "assign", "refresh"),
    "plan": ("open", "plan", "check"),
    "dry_run": ("open", "plan", "check"),
    "migrate": ("open", "plan", "check", "agree", "fetch"),
    "load_ensemble": ("open", "plan", "check", "fetch", "agree", "assign", "refresh"),
    "restore_on_create": ("open", "plan", "fetch", "check", "agree", "assign", "refresh"),
    "restore_on_create_later": ("open", "plan", "agree", "fetch", "check", "assign",
                                "refresh"),
}
# The stages before anything changes: a failure injected in any of them changes nothing.
BEFORE_ASSIGN = ("open", "plan", "check", "fetch", "agree")


def _unbuilt(flavour):
    if flavour == "module":
        return None
    keras = keras_for(flavour)
    return keras.Sequential([keras.layers.Dense(4)])


def _operate(operation, obj, source, tmp_path):
    """Runs `operation` (of EXPECTED) of obj from source; the values obj ends with."""
    if operation == "restore":
        objckpt.restore(obj, source)
    elif operation == "plan":
        objckpt.plan(obj, source)
    elif operation == "dry_run":
        from objckpt import cli

        args = argparse.Namespace(source=source, template="unused:unused", rules=None,
                                  at=None, optimizer_state="auto", dry_run=True, strict=True,
                                  out=str(tmp_path / "migrated" / "ckpt"))
        real = cli.load_template
        cli.load_template = lambda spec: obj
        try:
            assert cli._migrate(args) == 0
        finally:
            cli.load_template = real
    elif operation == "migrate":
        objckpt.migrate(obj, source, str(tmp_path / "migrated" / "ckpt"))
    elif operation == "load_ensemble":
        objckpt.load_ensemble(obj, [source, source])
    elif operation == "restore_on_create":
        objckpt.restore_on_create(obj, source).assert_done()
    else:  # restore_on_create_later: obj is built after the call
        pending = objckpt.restore_on_create(obj, source)
        assert pending.applied == ()
        obj(tf.ones((1, 3)))
        pending.assert_done()


def _traced(monkeypatch, fail_at=None):
    """Records (operation, stage) as each stage starts; raises at stage `fail_at`."""
    trace = []

    def enter(self, stage):
        trace.append((self.operation, stage))
        if stage == fail_at:
            raise errors.ObjckptError(f"a failure injected at the {stage} stage")

    monkeypatch.setattr(_pipeline.Pipeline, "_enter", enter)
    return trace


def _first_seen(trace) -> tuple:
    return tuple(dict.fromkeys(stage for _, stage in trace))


def _obj_for(operation, flavour):
    if operation == "restore_on_create_later":
        return _unbuilt(flavour)
    return _build(flavour)


@pytest.mark.parametrize("operation", EXPECTED)
def test_every_operation_passes_through_every_stage_in_order(operation, flavour, saved,
                                                             tmp_path, monkeypatch):
    obj = _obj_for(operation, flavour)
    if obj is None:
        pytest.skip("a tf.Module creates its variables in __init__")
    trace = _traced(monkeypatch)
    _operate(operation, obj, saved[0], tmp_path)
    assert _first_seen(trace) == EXPECTED[operation], trace
    name = {"dry_run": "objckpt.plan", "restore_on_create_later":
            "objckpt.restore_on_create"}.get(operation, f"objckpt.{operation}")
    assert {op for op, _ in trace} == {name}
    assert [stage for _, stage in trace].count("agree") == (
        0 if operation in ("plan", "dry_run") else 1)  # one decision point
    if operation in ("restore", "restore_on_create", "restore_on_create_later"):
        assert _values(obj) == saved[2]


@pytest.mark.parametrize("operation", EXPECTED)
def test_a_failure_injected_in_each_stage_changes_nothing(operation, flavour, saved,
                                                          tmp_path, monkeypatch):
    stages = BEFORE_ASSIGN
    if operation == "restore_on_create_later":  # the stages of the call itself
        stages = ("open", "plan", "agree")
    for stage in (s for s in stages if s in EXPECTED[operation]):
        obj = _obj_for(operation, flavour)
        if obj is None:
            pytest.skip("a tf.Module creates its variables in __init__")
        before = _values(obj)
        trace = _traced(monkeypatch, fail_at=stage)
        with pytest.raises(errors.ObjckptError, match=f"injected at the {stage} stage"):
            _operate(operation, obj, saved[0], tmp_path)
        stages = [s for _, s in trace]
        # after the failing stage, only the agreement on the failure (every worker raises)
        assert set(stages[stages.index(stage) + 1:]) <= {"agree"}, stages
        assert "assign" not in _first_seen(trace)
        assert not os.path.exists(tmp_path / "migrated")  # migrate wrote nothing
        if operation == "restore_on_create_later":
            continue  # obj had no variables before: none of them got a value (above)
        assert _values(obj) == before, stage


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f != "module"])
def test_plan_shows_the_optimizer_state_restore_moves_into_a_fresh_compiled_model(
        flavour, tmp_path):
    """A model compiled in a new process has no optimizer slots until its first step:
    plan builds the optimizer as restore does, so it lists every entry restore restores."""
    keras = keras_for(flavour)

    def compiled():
        model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])
        model(tf.ones((1, 3)))
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        return model

    trained = compiled()
    trained.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    prefix = objckpt.save(trained, str(tmp_path / "ckpt"))
    fresh = compiled()
    planned = objckpt.plan(fresh, prefix)
    assert any("not built yet" in note for note in planned.notes), planned.notes
    restored = objckpt.restore(compiled(), prefix)
    assert len(planned.matches) == len(restored.restored)
    assert {m.target for m in planned.matches} == set(restored.restored)
    network = len(objckpt._compat.network_variable_paths(trained))
    assert len(planned.matches) >= network + 8  # and Adam's two moments of the four weights


# --- one rule: does this value fit this variable ------------------------------------------


def test_misfit_is_the_one_rule_of_shape_and_dtype():
    from objckpt._compat import fit

    variable = tf.Variable(tf.zeros((3, 4)))
    assert fit.misfit(tf.ones((3, 4)), variable) == ""
    assert fit.misfit(tf.ones((3, 5)), variable) == "shape"
    assert fit.misfit(tf.ones((4, 3)), variable) == "shape"  # never reshaped
    assert fit.misfit(tf.ones((3, 4), tf.float64), variable) == "dtype"
    assert fit.misfit(((3, 4), tf.float16), variable) == ""  # widened, from metadata
    assert fit.misfit(((3, 4), tf.int32), variable) == "dtype"  # int -> float: lossy
    assert fit.misfit(((None, 4), tf.float32), variable) == ""  # traced, checked when read
    relaxed = tf.Variable(tf.zeros((2,)), shape=tf.TensorShape([None]))
    assert fit.misfit(tf.ones((7,)), relaxed) == ""
    assert fit.fits(tf.ones((3, 4)), variable) and not fit.fits(tf.ones((3,)), variable)
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = tf.Variable(tf.zeros((3, 4)))
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    assert fit.misfit(tf.ones((3, 4)), mirrored) == ""
    assert fit.misfit(tf.ones((3, 4), tf.int32), mirrored) == "dtype"


def test_every_check_of_a_value_against_a_variable_follows_the_one_rule(tmp_path,
                                                                       monkeypatch):
    """plan's check (metadata), restore's fetch, restore_on_create's check of an existing
    variable and twins' structure check all ask `_compat.fit`: changing its dtype policy
    (here: float64 accepted into float32) changes what each of them reports."""
    from objckpt._compat import fit
    from objckpt._ops import twins as _twins

    wide = _Net()
    wide.w = tf.Variable(tf.ones((3, 4), tf.float64))
    prefix = objckpt.save(wide, str(tmp_path / "wide"))
    past = _Net()
    past.w = tf.Variable(tf.ones((3, 4), tf.float64))

    def refused():
        found = []
        found.append(bool(objckpt.plan(_Net(), prefix).mismatched))
        for read in (lambda obj: objckpt.restore(obj, prefix),
                     lambda obj: objckpt.restore_on_create(obj, prefix)):
            try:
                read(_Net())
            except errors.StructureMismatchError:
                found.append(True)
            except (TypeError, ValueError, tf.errors.OpError):  # TF itself refused to assign
                found.append(False)
            else:
                found.append(False)
        try:
            _twins._check_same_structure(_Net(), objckpt.tree(_Net()), objckpt.tree(past))
            found.append(False)
        except errors.StructureMismatchError:
            found.append(True)
        return found

    assert refused() == [True, True, True, True]
    monkeypatch.setattr(fit, "_dtype_fits", lambda dtype, wanted, cast="lossless": True)
    assert refused() == [False, False, False, False]


# route -> stages of objckpt.restore on it: a Snapshot of the obj itself and one of a tree
# planned into it before have nothing to open, plan or check (their tensors are in memory,
# their plan known); a large local checkpoint is streamed (its checksums checked at fetch).
ROUTES = {
    "fast": ("fetch", "agree", "assign", "refresh"),
    "cached": ("fetch", "agree", "assign", "refresh"),
    "streamed": ("open", "plan", "check", "fetch", "agree", "assign", "refresh"),
    "fetched": ("open", "plan", "check", "fetch", "agree", "assign", "refresh"),
}


def test_every_route_of_restore_passes_its_stages_in_order(flavour, saved, monkeypatch):
    from objckpt._bundle import fastio as _fastio

    routes = []
    real = _pipeline.Pipeline.restore

    def restore(self, variables):
        done = real(self, variables)
        routes.append(done.route)
        return done

    monkeypatch.setattr(_pipeline.Pipeline, "restore", restore)
    obj, other = _build(flavour), _build(flavour, seed=1)
    seen = {}
    for route, source in (("fetched", saved[0]), ("fast", lambda: objckpt.snapshot(obj)),
                          ("planned", lambda: objckpt.snapshot(other)),
                          ("cached", lambda: objckpt.snapshot(other)),
                          ("streamed", saved[0])):
        if route == "streamed":
            monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
        source = source() if callable(source) else source
        trace = _traced(monkeypatch)
        objckpt.restore(obj, source)
        seen[routes[-1] if route != "planned" else "planned"] = tuple(s for _, s in trace)
    if flavour == "module":  # a tf.Module's tree is walked anew each time: no Snapshot route
        assert routes == ["fetched", "fetched", "fetched", "fetched", "streamed"]
    else:
        assert routes == ["fetched", "fast", "fetched", "cached", "streamed"]
    for route, stages in ROUTES.items():
        if route in routes:
            assert seen[route] == stages, (route, seen[route])
    assert _values(obj) == saved[2]
