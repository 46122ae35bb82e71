"""The agree stage: what a failing worker sends of its error, and the error every other
worker raises from it (the failing worker's type, problems, source and fix); no collective
in a single process."""

import pytest
import tensorflow as tf

from objckpt import errors
from objckpt._planning import agree as _agree


class _Workers:
    """Two workers of a multi-worker strategy, simulated: what worker 1 sends is what worker
    0 receives from `_compat.gather_failures`."""

    def __init__(self, monkeypatch):
        self.sent = []
        monkeypatch.setattr(_agree._compat, "gather_failures", self.gather)

    def gather(self, variables, kind, message):
        if kind:
            self.sent.append(("worker 1", kind, message))
        return list(self.sent)


def _variables():
    return {"w": tf.Variable([1.0, 2.0])}


def test_a_single_process_agrees_without_raising():
    variables = _variables()
    assert _agree.agree_across_workers(variables, None) is None
    # its own failure is raised by its caller, not here
    assert _agree.agree_across_workers(variables, errors.ObjckptError("mine")) is None


def test_the_others_raise_the_failing_workers_error_with_its_fields(monkeypatch):
    _Workers(monkeypatch)
    failure = errors.StructureMismatchError(
        "3 variables do not fit", ("`dense/kernel`: (3, 4) but the obj has (4, 3)",),
        source="checkpoint `gs://b/ck`", obj="Sequential", fix="pass rules=...")
    _agree.agree_across_workers(_variables(), failure)  # worker 1: sends, raises nothing
    with pytest.raises(errors.StructureMismatchError) as info:
        _agree.agree_across_workers(_variables(), None, "objckpt.migrate")  # worker 0
    err = info.value
    assert "objckpt.migrate failed on worker worker 1 of this MultiWorkerMirroredStrategy" \
        in str(err)
    assert "StructureMismatchError: 3 variables do not fit" in str(err)
    assert err.problems == ("`dense/kernel`: (3, 4) but the obj has (4, 3)",)
    assert (err.source, err.obj, err.fix) == ("checkpoint `gs://b/ck`", "Sequential",
                                              "pass rules=...")


def test_an_error_of_another_kind_arrives_as_objckpt_error(monkeypatch):
    workers = _Workers(monkeypatch)
    _agree.agree_across_workers(_variables(), OSError("disk\nfull"))
    with pytest.raises(errors.ObjckptError, match="OSError: disk full") as info:
        _agree.agree_across_workers(_variables(), None)
    assert type(info.value) is errors.ObjckptError and workers.sent[0][1] > 0


def test_what_a_worker_sends_is_bounded(monkeypatch):
    workers = _Workers(monkeypatch)
    failure = errors.StructureMismatchError("x" * 10_000, tuple("p" * 1000 for _ in range(500)),
                                            source="s" * 5000)
    _agree.agree_across_workers(_variables(), failure)
    assert len(workers.sent[0][2]) <= _agree.AGREED_BYTES
    with pytest.raises(errors.StructureMismatchError) as info:
        _agree.agree_across_workers(_variables(), None)
    assert 0 < len(info.value.problems) < 500
    assert info.value.source.startswith("sss") and len(info.value.source) < 5000
