"""KeptCheckpoints: the checkpoints a directory keeps by its policy, save after save, the
decision undone when a commit fails, and the clock of its saves."""

import math
import types

import pytest

from objckpt._training import retention
from objckpt._training.kept import KeptCheckpoints
from objckpt._training.retention import Kept, RetentionPolicy


def _kept(policy, found=(), preserved=math.nan):
    kept = KeptCheckpoints(policy, types.SimpleNamespace(preserved=preserved))
    kept.resumed(list(found))
    return kept


def test_decide_keeps_the_newest_and_undo_takes_the_decision_back():
    kept = _kept(RetentionPolicy(max_to_keep=2))
    assert kept.latest_name() == "no checkpoint"
    for number in (1, 2):
        kept.decide(Kept(number, f"d/ckpt-{number}", math.nan, float(number)))
    stays, dropped, undo = kept.decide(Kept(3, "d/ckpt-3", math.nan, 3.0))
    assert [k.number for k in stays] == [2, 3] and [k.number for k in dropped] == [1]
    assert [k.number for k in kept.kept] == [2, 3] and kept.latest_name() == "`d/ckpt-3`"
    undo()
    assert [k.number for k in kept.kept] == [1, 2] and kept.latest_name() == "`d/ckpt-2`"


def test_keep_best_ranks_by_metric_and_skips_checkpoints_without_one():
    kept = _kept(RetentionPolicy(max_to_keep=1, keep_best=2, mode="max"))
    for number, metric in ((1, 0.5), (2, math.nan), (3, 0.9), (4, 0.1)):
        kept.decide(Kept(number, f"d/ckpt-{number}", metric, float(number)))
    assert [k.number for k in kept.best()] == [3, 1, 4]  # ckpt-2 has no metric
    assert [k.number for k in kept.kept] == [1, 3, 4]


def test_resumed_takes_up_the_newest_and_its_clock(monkeypatch):
    monkeypatch.setattr(retention, "now", lambda: 100.0)
    found = [Kept(1, "d/ckpt-1", math.nan, 40.0), Kept(2, "d/ckpt-2", math.nan, 50.0)]
    kept = _kept(RetentionPolicy(min_interval_seconds=30.0), found, preserved=math.nan)
    assert kept.last is found[-1] and kept.clock == 50.0
    assert kept.commits.preserved == 100.0  # NaN: the time of opening, as TF
    monkeypatch.setattr(retention, "now", lambda: 70.0)
    stamp, why = kept.when(step=9, force=False)
    assert stamp == 70.0 and "min_interval_seconds=30.0" in why and "`d/ckpt-2`" in why
    assert kept.when(step=9, force=True) == (70.0, None)
    monkeypatch.setattr(retention, "now", lambda: 10.0)  # the clock went back
    assert kept.when(step=9, force=True)[0] == 50.0


@pytest.mark.parametrize("preserved", [math.nan, 1e12])
def test_a_preserved_time_missing_or_in_the_future_is_now(monkeypatch, preserved):
    monkeypatch.setattr(retention, "now", lambda: 100.0)
    kept = _kept(RetentionPolicy(), [Kept(1, "d/ckpt-1", math.nan, 40.0)], preserved)
    assert kept.commits.preserved == 100.0
