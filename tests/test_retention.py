"""The retention policy of a checkpoint directory, alone: pure, no TensorFlow."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from objckpt._training.retention import Kept, RetentionPolicy


def kept(*metrics):
    """ckpt-1.. with these metrics (None: no metric), oldest first."""
    return [Kept(n, f"/run/ckpt-{n}", math.nan if m is None else m, 1000.0 + n)
            for n, m in enumerate(metrics, 1)]


def test_keeps_the_newest_max_to_keep_by_position_oldest_first():
    policy = RetentionPolicy(max_to_keep=3)
    assert policy.keep(kept(*[None] * 7)) == {5, 6, 7}
    assert policy.keep(kept(None, None)) == {1, 2}
    assert policy.keep([]) == set()
    # "newest" is the end of the list as given (the order the state file lists them)
    checkpoints = kept(None, None, None)
    assert RetentionPolicy(max_to_keep=1).keep(checkpoints[::-1]) == {1}


def test_keeps_the_best_keep_best_beside_the_newest():
    checkpoints = kept(0.5, 0.1, 0.9, 0.3, 0.8, 0.7)
    assert RetentionPolicy(max_to_keep=2, keep_best=2, mode="min").keep(checkpoints) == {
        2, 4, 5, 6}
    assert RetentionPolicy(max_to_keep=2, keep_best=2, mode="max").keep(checkpoints) == {
        3, 5, 6}  # ckpt-5 is both among the best and the newest
    assert RetentionPolicy(max_to_keep=1, keep_best=0).keep(checkpoints) == {6}


def test_best_ranks_by_metric_ties_by_the_older_and_never_a_nan():
    checkpoints = kept(0.2, None, 0.1, 0.2, math.nan, -1.0)
    policy = RetentionPolicy(keep_best=3, mode="min")
    assert [k.number for k in policy.best(checkpoints)] == [6, 3, 1, 4]
    assert [k.number for k in RetentionPolicy(mode="max").best(checkpoints)] == [1, 4, 3, 6]
    assert RetentionPolicy(max_to_keep=1, keep_best=5).keep(kept(None, None, None)) == {3}


def test_split_returns_kept_and_dropped_in_the_given_order():
    checkpoints = kept(0.9, 0.1, 0.5, 0.7, 0.6)
    stay, dropped = RetentionPolicy(max_to_keep=2, keep_best=1).split(checkpoints)
    assert [k.number for k in stay] == [2, 4, 5]
    assert [k.number for k in dropped] == [1, 3]
    assert all(a is b for a, b in zip(stay + dropped, [checkpoints[i] for i in (1, 3, 4, 0, 2)]))


def test_reads_metrics_only_when_ranking_by_them():
    assert not RetentionPolicy(max_to_keep=3).reads_metrics
    assert RetentionPolicy(max_to_keep=3, keep_best=1).reads_metrics
    assert repr(RetentionPolicy(4, 2, "max")) == (
        "RetentionPolicy(max_to_keep=4, keep_best=2, mode='max')")
    assert repr(kept(0.5)[0]) == "Kept(ckpt-1, metric=0.5)"


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["objckpt._training.retention", "objckpt._bundle.state"])
def test_imports_no_tensorflow(module):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import sys; import {module}; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
