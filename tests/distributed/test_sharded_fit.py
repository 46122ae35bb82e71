"""`model.fit` with objckpt's `Checkpointing` under ParameterServerStrategy, on a real
in-process cluster (2 parameter servers; 1 or 2 workers on local ports), in tf_keras (or
Keras 2 where `keras` is 2.x): an embedding model whose table and head kernel are sharded
(a variable partitioner), trained with Adam (its slots sharded like their variables).

A run saving every epoch is killed by SIGKILL in the middle of epoch 2 (its process, the
cluster's servers included); a fresh process resumes it from the last epoch saved and ends
bit for bit where the uninterrupted run ends. With two workers the test's own batch hook
runs the steps one at a time (which worker takes a step is a race, and each worker reads
its own copy of the data: the uninterrupted run is reproducible only then); steps on both
workers at once, as fit runs them, are checked for what does not depend on their order.

Under ParameterServerStrategy fit calls no batch-level callback: Checkpointing saves at the
end of each epoch there, and refuses what needs batches with a typed error.

Each scenario runs in fresh processes (tests/helpers/pss_worker.py): connecting to a
cluster changes a process's eager context for good, and a kill takes the cluster with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

import flavours

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

COUNTERS = {"epoch": 4, "step": 16, "batch": 0}  # 4 epochs of 4 steps


def _trained_flavour() -> str:
    """Keras 2 where `keras` is 2.x (TF 2.12-2.15), else tf_keras (Keras 3 cannot train
    with sharded variables)."""
    if flavours.session_flavour() == "keras2":
        return "keras2"
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed: Keras 3 cannot train with sharded variables")
    return "tf_keras"


def _run(folder, flavour: str, scenario: str, workers: int):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0")
    root = os.path.dirname(os.path.dirname(HELPERS))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, os.path.join(HELPERS, "pss_worker.py"), str(folder), flavour,
         scenario, str(workers)],
        capture_output=True, text=True, timeout=600, env=env, check=False)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def results(request, tmp_path_factory):
    flavour = _trained_flavour()
    folder = tmp_path_factory.mktemp(f"pssfit{request.param}")
    killed = _run(folder, flavour, "fit-kill", request.param)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    done = _run(folder, flavour, "fit-resume", request.param)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    out["workers"] = request.param
    return out


def _counters(saved: dict) -> dict:
    return {key.split("/")[0]: value for key, value in saved.items()}


def test_the_uninterrupted_run_saves_every_epoch(results):
    whole = results["whole"]
    assert whole["epochs"] == [0, 1, 2, 3]
    assert whole["saved"] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    assert whole["iterations"] == 16


def test_kill_and_resume_equals_the_uninterrupted_run(results):
    """Killed in epoch 2 with epochs 0 and 1 saved; resumed at epoch 2 (initial epoch,
    optimizer iterations, every shard of the table and of its Adam slots) and bit-equal to
    the run never interrupted, in the live model and in the last checkpoint."""
    resumed = results["resumed"]
    assert resumed["files_at_kill"] == ["ckpt-1.index", "ckpt-2.index"]
    assert resumed["before_kill_equal"], "the two runs agree up to the kill"
    assert resumed["resumed_from"] == "ckpt-2"
    assert resumed["restored_equal"], "at the start of fit the model holds ckpt-2's values"
    assert resumed["epochs"] == [2, 3], "fit goes on with epoch 2, not from 0"
    assert resumed["saved"] == ["ckpt-3", "ckpt-4"]
    assert resumed["iterations"] == 16
    assert resumed["equal"], "every value equals the uninterrupted run's, bit for bit"
    assert resumed["last_saved_equal"], "the last checkpoints are equal, counters included"
    assert _counters(resumed["counters"]) == COUNTERS


def test_the_table_and_its_adam_slots_stay_sharded(results):
    sharded = results["resumed"]["sharded"]
    assert len(sharded) == 6  # the table and the head kernel, and their m and v
    assert "model/layer_with_weights-0/embeddings" in sharded
    assert "model/layer_with_weights-1/kernel" in sharded
    # Checkpointing wrote them as TF writes them: one slice per shard, the same slices
    resumed = results["resumed"]
    assert resumed["sliced_keys"] == 6
    assert resumed["layout_equal_to_tf"], "the index lists the slices as TF's write does"


def test_steps_on_both_workers_at_once_resume_at_the_epoch(results):
    if results["workers"] == 1:
        pytest.skip("one worker runs one step at a time")
    run = results["async"]
    assert run["resumed_from"] == "ckpt-2"
    assert run["restored_equal"], "every shard as saved when fit resumes"
    assert run["epochs"] == [2, 3]
    assert run["iterations"] == 16
    assert _counters(run["counters"]) == COUNTERS


def test_save_freq_in_batches_is_refused_before_anything_is_opened(results):
    refused = results["save_freq"]
    assert refused["raised"] == "InvalidArgumentError"
    assert "Checkpointing(save_freq=2) cannot save every 2 batches under " \
        "ParameterServerStrategy" in refused["message"]
    assert "calls no batch-level callback" in refused["message"]
    assert "Fix: save_freq='epoch', with fit(steps_per_epoch=N)" in refused["message"]
    assert refused["unchanged"] and not refused["created"]


def test_a_fit_without_steps_per_epoch_is_refused(results):
    refused = results["no_steps"]
    assert refused["raised"] == "InvalidArgumentError"
    assert "this fit's epochs never end (steps per epoch: None" in refused["message"]
    assert "Fix: pass fit(steps_per_epoch=N)" in refused["message"]
    assert refused["unchanged"]


def test_a_checkpoint_saved_mid_epoch_is_refused_and_nothing_restored(results):
    refused = results["mid_epoch"]
    assert refused["raised"] == "InvalidArgumentError"
    assert "mid/ckpt-1 under ParameterServerStrategy: it was saved in epoch 2 after " \
        "batch 2" in refused["message"]
    assert "Nothing was restored." in refused["message"]
    assert refused["unchanged"]


def test_a_checkpoint_saved_after_an_epochs_last_batch_resumes_at_the_next(results):
    last = results["last_batch"]
    assert last["epochs"] == [2, 3]
    assert _counters(last["counters"]) == COUNTERS
