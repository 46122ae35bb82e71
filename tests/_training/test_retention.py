"""The retention policy of a checkpoint directory, alone: pure, no TensorFlow."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from objckpt._training.retention import Kept, RetentionPolicy

from support import ROOT


def kept(*metrics):
    """ckpt-1.. with these metrics (None: no metric), oldest first."""
    return [Kept(n, f"/run/ckpt-{n}", math.nan if m is None else m, 1000.0 + n)
            for n, m in enumerate(metrics, 1)]


def test_keeps_the_newest_max_to_keep_by_position_oldest_first():
    policy = RetentionPolicy(max_to_keep=3)
    assert policy.kept_numbers(kept(*[None] * 7)) == {5, 6, 7}
    assert policy.kept_numbers(kept(None, None)) == {1, 2}
    assert policy.kept_numbers([]) == set()
    # "newest" is the end of the list as given (the order the state file lists them)
    checkpoints = kept(None, None, None)
    assert RetentionPolicy(max_to_keep=1).kept_numbers(checkpoints[::-1]) == {1}


def test_keeps_the_best_keep_best_beside_the_newest():
    checkpoints = kept(0.5, 0.1, 0.9, 0.3, 0.8, 0.7)
    assert RetentionPolicy(max_to_keep=2, keep_best=2, mode="min").kept_numbers(checkpoints) == {
        2, 4, 5, 6}
    assert RetentionPolicy(max_to_keep=2, keep_best=2, mode="max").kept_numbers(checkpoints) == {
        3, 5, 6}  # ckpt-5 is both among the best and the newest
    assert RetentionPolicy(max_to_keep=1, keep_best=0).kept_numbers(checkpoints) == {6}


def test_best_ranks_by_metric_ties_by_the_older_and_never_a_nan():
    checkpoints = kept(0.2, None, 0.1, 0.2, math.nan, -1.0)
    policy = RetentionPolicy(keep_best=3, mode="min")
    assert [k.number for k in policy.best(checkpoints)] == [6, 3, 1, 4]
    assert [k.number for k in RetentionPolicy(mode="max").best(checkpoints)] == [1, 4, 3, 6]
    assert RetentionPolicy(max_to_keep=1, keep_best=5).kept_numbers(
        kept(None, None, None)) == {3}


def test_split_returns_kept_and_dropped_in_the_given_order():
    checkpoints = kept(0.9, 0.1, 0.5, 0.7, 0.6)
    stay, dropped = RetentionPolicy(max_to_keep=2, keep_best=1).split(checkpoints)
    assert [k.number for k in stay] == [2, 4, 5]
    assert [k.number for k in dropped] == [1, 3]
    assert all(a is b for a, b in zip(stay + dropped, [checkpoints[i] for i in (1, 3, 4, 0, 2)]))


def test_reads_metrics_only_when_ranking_by_them():
    assert not RetentionPolicy(max_to_keep=3).reads_metrics
    assert RetentionPolicy(max_to_keep=3, keep_best=1).reads_metrics
    assert repr(RetentionPolicy(max_to_keep=4, keep_best=2, mode="max")) == (
        "RetentionPolicy(max_to_keep=4, keep_best=2, mode='max')")
    assert repr(kept(0.5)[0]) == "Kept(ckpt-1, metric=0.5)"


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["objckpt._training.retention", "objckpt._bundle.state"])
def test_imports_no_tensorflow(module):
    code = (f"import sys; import {module}; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# --- the rules: every N steps, every N hours, a predicate, intervals ---------------------------

from objckpt import errors  # noqa: E402
from objckpt._training.retention import Decision  # noqa: E402


def saves(count, *, every=600.0, start=1_600_000_000.0, steps=100):
    """ckpt-1..count saved every `every` seconds from `start`, at steps 100, 200, ..."""
    return [Kept(n, f"/run/ckpt-{n}", math.nan, start + every * n, steps * n)
            for n in range(1, count + 1)]


def tf_sweep(checkpoints, max_to_keep, hours, last_preserved):
    """TF CheckpointManager's _sweep, one save at a time (its code, transcribed): the
    checkpoints it keeps on disk (listed or preserved) and its last_preserved_timestamp."""
    maybe_delete, on_disk = [], set()
    for k in checkpoints:
        maybe_delete.append(k)
        on_disk.add(k.number)
        while len(maybe_delete) > max_to_keep:
            old = maybe_delete.pop(0)
            if hours and old.timestamp - hours * 3600.0 >= last_preserved:
                last_preserved = old.timestamp
                continue
            on_disk.discard(old.number)
    return on_disk, last_preserved


def test_keep_every_n_steps_keeps_multiples_of_the_step_forever():
    checkpoints = saves(12)  # steps 100..1200
    policy = RetentionPolicy(max_to_keep=2, keep_every_n_steps=500)
    assert policy.kept_numbers(checkpoints) == {5, 10, 11, 12}
    checkpoints[4].step = None  # unknown step (written by something else): never kept for it
    assert policy.kept_numbers(checkpoints) == {10, 11, 12}
    assert policy.reads_steps and not policy.reads_metrics


def test_max_to_keep_none_keeps_everything():
    assert RetentionPolicy(max_to_keep=None).kept_numbers(saves(7)) == set(range(1, 8))
    assert RetentionPolicy(max_to_keep=None, keep_every_n_hours=0.1).decide(
        saves(7), last_preserved=0.0).preserved == frozenset()  # nothing leaves: TF's no-op


@pytest.mark.parametrize("max_to_keep,hours,every", [(3, 6, 600.0), (1, 1, 700.0),
                                                      (5, 0.5, 650.0), (2, 24, 3600.0)])
def test_keep_every_n_hours_is_tf_checkpoint_manager_s_sweep(max_to_keep, hours, every):
    checkpoints = saves(150, every=every)
    start = checkpoints[0].timestamp - every  # the directory was opened then
    policy = RetentionPolicy(max_to_keep=max_to_keep, keep_every_n_hours=hours)
    last, preserved = start, frozenset()
    for n in range(1, len(checkpoints) + 1):  # one save at a time, as a directory decides
        decision = policy.decide([k for k in checkpoints[:n]
                                  if k.number in preserved or k.number > n - 1 - max_to_keep
                                  or k.number == n], last_preserved=last, preserved=preserved)
        last, preserved = decision.last_preserved, decision.preserved
    expected, tf_last = tf_sweep(checkpoints, max_to_keep, hours, start)
    assert {k.number for k in decision.kept} == expected
    assert last == tf_last
    assert len(preserved) == len(expected) - max_to_keep > 0


def test_keep_every_n_hours_exact_numbers_and_nan_preserves_nothing():
    # a save every 10 minutes from 10 min after opening; 6 h = 36 saves
    checkpoints = saves(80)
    policy = RetentionPolicy(max_to_keep=3, keep_every_n_hours=6)
    opened = checkpoints[0].timestamp - 600.0
    decision = policy.decide(checkpoints, last_preserved=opened)
    assert decision.preserved == {36, 72}
    assert decision.last_preserved == checkpoints[71].timestamp
    assert {k.number for k in decision.kept} == {36, 72, 78, 79, 80}
    assert [k.number for k in decision.dropped] == [n for n in range(1, 78) if n not in (36, 72)]
    # deciding again changes nothing (each checkpoint is judged once: lp only grows)
    assert policy.decide(decision.kept, last_preserved=decision.last_preserved,
                         preserved=decision.preserved) == (
        Decision(decision.kept, [], decision.last_preserved, decision.preserved))
    assert policy.decide(checkpoints).preserved == frozenset()  # NaN: never opened


def test_keep_predicate_is_asked_only_about_checkpoints_no_other_rule_keeps():
    asked = []

    def keep(kept):
        asked.append(kept.number)
        return kept.step in (300, 700)

    policy = RetentionPolicy(max_to_keep=2, keep_every_n_steps=400, keep=keep)
    assert policy.kept_numbers(saves(10)) == {3, 4, 7, 8, 9, 10}
    assert asked == [1, 2, 3, 5, 6, 7]
    assert policy.reads_metrics and policy.reads_steps


def test_a_raising_predicate_is_a_typed_error_naming_the_checkpoint():
    policy = RetentionPolicy(max_to_keep=1, keep=lambda kept: 1 / (kept.number - 2))
    with pytest.raises(errors.InvalidArgumentError) as info:
        policy.kept_numbers(saves(3))
    message = str(info.value)
    assert message.startswith("The keep= predicate raised ZeroDivisionError (division by zero) "
                              "for checkpoint `/run/ckpt-2` (Kept(ckpt-2, metric=nan, "
                              "step=200), timestamp 1600001200.0).")
    assert "Fix: make keep= answer from the Kept alone" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert policy.asks(saves(1)[0]) is True and RetentionPolicy().asks(saves(1)[0]) is False


def test_rules_combine_a_checkpoint_stays_when_any_rule_keeps_it():
    checkpoints = saves(30)
    for k, metric in zip(checkpoints, [5.0, 1.0, 3.0] * 10):
        k.metric = metric + k.number / 1000  # ckpt-2 is the best (1.002)
    policy = RetentionPolicy(max_to_keep=2, keep_best=1, keep_every_n_steps=1000,
                             keep_every_n_hours=1.5, keep=lambda k: k.number == 13)
    decision = policy.decide(checkpoints, last_preserved=checkpoints[0].timestamp - 600)
    assert decision.preserved == {9, 18, 27}  # 90 min = 9 saves after opening, then 9 apart
    assert {k.number for k in decision.kept} == {2, 9, 10, 13, 18, 20, 27, 29, 30}
    alone = [RetentionPolicy(max_to_keep=2).kept_numbers(checkpoints),
             RetentionPolicy(max_to_keep=2, keep_best=1).kept_numbers(checkpoints),
             RetentionPolicy(max_to_keep=2, keep_every_n_steps=1000).kept_numbers(checkpoints),
             RetentionPolicy(max_to_keep=2, keep_every_n_hours=1.5).kept_numbers(
                 checkpoints, last_preserved=checkpoints[0].timestamp - 600),
             RetentionPolicy(max_to_keep=2, keep=lambda k: k.number == 13).kept_numbers(
                 checkpoints)]
    assert set().union(*alone) == {k.number for k in decision.kept}


def test_preserved_after_restart_from_the_last_preserved_timestamp_alone():
    checkpoints = saves(80)
    policy = RetentionPolicy(max_to_keep=3, keep_every_n_hours=6)
    decision = policy.decide(checkpoints, last_preserved=checkpoints[0].timestamp - 600)
    assert policy.preserved_after_restart(decision.kept, decision.last_preserved) == {36, 72}
    # one saved less than 6 h before the last preserved cannot have been preserved
    kept = [checkpoints[n - 1] for n in (36, 50, 72, 78, 79, 80)]
    assert policy.preserved_after_restart(kept, decision.last_preserved) == {36, 72}
    assert RetentionPolicy(max_to_keep=3).preserved_after_restart(kept, 0.0) == frozenset()


def test_too_soon_by_steps_and_by_seconds():
    last = Kept(4, "/run/ckpt-4", math.nan, 1000.0, 400)
    policy = RetentionPolicy(checkpoint_interval=100, min_interval_seconds=60)
    assert policy.too_soon(450, 2000.0, last) == (
        "step 450 is less than checkpoint_interval=100 steps after step 400 of `/run/ckpt-4`")
    assert policy.too_soon(500, 1059.5, last) == (
        "59.500 s since `/run/ckpt-4` is less than min_interval_seconds=60")
    assert policy.too_soon(500, 1060.0, last) is None
    assert policy.too_soon(0, 0.0, None) is None  # nothing saved yet
    last.step = None  # unknown step: only the seconds count
    assert policy.too_soon(401, 1060.0, last) is None
    assert RetentionPolicy().too_soon(401, 1000.0, last) is None
    assert repr(policy) == ("RetentionPolicy(max_to_keep=5, keep_best=0, mode='min', "
                            "checkpoint_interval=100, min_interval_seconds=60)")
