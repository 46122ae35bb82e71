"""Agreement across the workers of a `MultiWorkerMirroredStrategy` when an operation fails on
one worker only: two worker processes on localhost (TF_CONFIG with 127.0.0.1 ports, CPU only,
one replica each), one launch per test module.

Run as a script, this file is one worker (`python test_distribute_agree.py --out FILE --dir
DIR`): each scenario below fails on worker 1 only (its own local checkpoint holds a NaN a
rule's transform rejects, has another shape, or is missing) and reports what each worker
raised (and in how many seconds, for a reader of a failure). Every worker must raise (no
worker may go on into a collective the other never joins, which ends in the collective
timeout), the failing one
its own error, the other an objckpt error naming the failing worker's task, error type and
message. A restore traced in a `tf.function` agrees too (it crashed on a symbolic tensor).
After each scenario a restore both workers run successfully is the barrier: it fails or
times out if the workers fell out of step.

Bounded: collectives time out in the workers (COLLECTIVE_TIMEOUT), each worker exits at its
deadline with its stacks dumped, and the test kills both (their process groups) at
LAUNCH_TIMEOUT.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time

WORKERS = 2
COLLECTIVE_TIMEOUT = 30  # seconds a collective waits for the other worker
LAUNCH_TIMEOUT = 150  # seconds for the launch; it takes about 15 s
PORT_TAKEN = "Could not start gRPC server"  # TF's error when its port is in use

# scenario -> what worker 1 (the failing one) raises; worker 0 raises the agreed error.
SCENARIOS = {
    "restore_transform_error": "InvalidArgumentError",  # a TF error from a rule's transform
    "restore_in_tf_function": "StructureMismatchError",  # traced; worker 1's shape is wrong
    "load_ensemble_transform_error": "InvalidArgumentError",
    "load_ensemble_missing": "CheckpointNotFoundError",
    "restore_on_create_missing": "CheckpointNotFoundError",
    "migrate_missing": "CheckpointNotFoundError",
}

# What the agreed error on worker 0 quotes of worker 1's message.
SAID = {
    "restore_transform_error": "nan in checkpoint",
    "restore_in_tf_function": "`w`: shape (3,) in the source but (2,) in the obj",
    "load_ensemble_transform_error": "nan in checkpoint",
    "load_ensemble_missing": "task1/missing",
    "restore_on_create_missing": "task1/missing",
    "migrate_missing": "task1/missing",
}


# --- the worker ---------------------------------------------------------------------------


def _worker(out: str, directory: str) -> None:  # pragma: no cover - runs in a subprocess
    import tensorflow as tf

    import objckpt

    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=COLLECTIVE_TIMEOUT))

    class Net(tf.Module):
        def __init__(self, w):
            super().__init__()
            self.w = tf.Variable(w)
            self.total = tf.Variable(3.0, synchronization=tf.VariableSynchronization.ON_READ,
                                     aggregation=tf.VariableAggregation.SUM)

    # This worker's own local sources: worker 1's hold a NaN, another shape, or nothing.
    mine = os.path.join(directory, f"task{task}")
    good = tf.train.Checkpoint(root=Net([3.0, 4.0])).write(os.path.join(mine, "good"))
    nan = tf.train.Checkpoint(root=Net([3.0, float("nan") if task else 4.0])).write(
        os.path.join(mine, "nan"))
    shaped = objckpt.snapshot(Net([3.0, 4.0, 5.0] if task else [3.0, 4.0]))
    missing = good if task == 0 else os.path.join(mine, "missing")
    check = [("^(w)$", r"\1", lambda t: tf.debugging.check_numerics(t, "nan in checkpoint"))]
    with strategy.scope():
        net = Net([1.0, 2.0])
    start = objckpt.snapshot(net)

    @tf.function(autograph=False)  # AutoGraph would wrap errors in a StagingError
    def restore_traced():
        objckpt.restore(net, shaped)

    def run(name):
        if name == "restore_transform_error":
            objckpt.restore(net, nan, rules=check)
        elif name == "restore_in_tf_function":
            restore_traced()
        elif name == "load_ensemble_transform_error":
            objckpt.load_ensemble(net, [good, nan], rules=check)
        elif name == "load_ensemble_missing":
            objckpt.load_ensemble(net, [good, missing])
        elif name == "restore_on_create_missing":
            with strategy.scope():
                later = tf.Module()
                objckpt.restore_on_create(later, missing)
        elif name == "migrate_missing":
            objckpt.migrate(net, missing, os.path.join(mine, "migrated"))

    with open(out, "w") as results:
        for name in SCENARIOS:
            began = time.monotonic()
            record = {"scenario": name, "task": task, "raised": None}
            try:
                run(name)
            except Exception as err:  # reported, compared by the test
                record.update(raised=type(err).__name__, module=type(err).__module__,
                              message=str(err), problems=list(getattr(err, "problems", [])),
                              source=getattr(err, "source", None),
                              obj=getattr(err, "obj", None), fix=getattr(err, "fix", None))
            record["seconds"] = time.monotonic() - began
            # nothing changed here, and the workers are still in step: a barrier restore
            record["unchanged"] = net.w.numpy().tolist() == [1.0, 2.0]
            objckpt.restore(net, start)
            record["barrier"] = True
            results.write(json.dumps(record) + "\n")
            results.flush()
        # a restore traced in a tf.function that succeeds everywhere lands everywhere
        net.w.assign([7.0, 7.0])

        @tf.function
        def restore_good():
            objckpt.restore(net, good)

        restore_good()
        results.write(json.dumps({"scenario": "__done__", "task": task,
                                  "w": net.w.numpy().tolist(),
                                  "total": float(objckpt.snapshot(net)["total"])}) + "\n")


# --- the test -----------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    from support import kill_group, python_env, start_cluster

    pytestmark = [pytest.mark.multiworker,
                  pytest.mark.filterwarnings("ignore::DeprecationWarning")]

    def _launch(directory):
        env = python_env(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
        outs = [directory / f"worker{i}.jsonl" for i in range(WORKERS)]
        logs = [directory / f"worker{i}.log" for i in range(WORKERS)]
        started = time.monotonic()
        processes = start_cluster(
            [[__file__, "--out", outs[i], "--dir", directory, "--deadline", LAUNCH_TIMEOUT - 20]
             for i in range(WORKERS)], logs, env)
        try:
            while any(p.poll() is None for p in processes):
                if time.monotonic() > started + LAUNCH_TIMEOUT:
                    break
                if any(p.poll() not in (None, 0) for p in processes) and \
                        time.monotonic() > started + LAUNCH_TIMEOUT / 2:
                    break
                time.sleep(0.2)
        finally:
            for p in processes:
                kill_group(p)
        records = [[json.loads(line) for line in out.read_text().splitlines() if line.strip()]
                   if out.exists() else [] for out in outs]
        texts = [log.read_text(errors="replace") if log.exists() else "" for log in logs]
        return records, texts, [p.returncode for p in processes]

    @pytest.fixture(scope="module")
    def launch(tmp_path_factory):
        for attempt in range(2):
            directory = tmp_path_factory.mktemp(f"agree{attempt}")
            records, logs, codes = _launch(directory)
            if not any(PORT_TAKEN in log for log in logs):
                break  # else a port found free was taken before TF bound it: once more
        return records, logs, codes

    def _record(launch, task: int, scenario: str) -> dict:
        records, logs, codes = launch
        for record in records[task]:
            if record["scenario"] == scenario:
                return record
        tail = "\n".join(logs[task].splitlines()[-30:])
        pytest.fail(f"worker {task} did not report {scenario} (exit code {codes[task]}); "
                    f"the end of its log:\n{tail}")

    @pytest.mark.parametrize("scenario", list(SCENARIOS))
    def test_every_worker_raises_when_one_fails(launch, scenario):
        failing, other = _record(launch, 1, scenario), _record(launch, 0, scenario)
        assert failing["raised"] == SCENARIOS[scenario], failing
        # the failing worker raises its own error (a TF error stays TF's)
        assert failing["module"].startswith(
            "tensorflow" if SCENARIOS[scenario] == "InvalidArgumentError" else "objckpt"), failing
        # the other worker raises an objckpt error of the same type where it is one
        agreed = ("ObjckptError" if SCENARIOS[scenario] == "InvalidArgumentError"
                  else SCENARIOS[scenario])
        assert (other["raised"], other["module"]) == (agreed, "objckpt.errors"), other
        message = other["message"]
        # it names the failing worker's task, its error type, its message, and the fix
        assert "on worker worker:1 " in message, message
        assert f"That worker's error: {SCENARIOS[scenario]}: " in message, message
        assert SAID[scenario] in message, message
        assert "Fix: the cause on worker worker:1" in message, message
        # and it carries the failing worker's problems, source, obj and fix
        if failing["module"] == "objckpt.errors":
            assert failing["source"] and failing["fix"], failing
            for name in ("problems", "source", "obj", "fix"):
                assert other[name] == failing[name], (name, other, failing)
        # no worker waited for a collective the other never joined: that ends in TF's
        # collective timeout (DeadlineExceededError), not the agreed errors asserted above,
        # and the barrier after the scenario would fail (no wall-clock assert in tests/)
        assert failing["unchanged"] and other["unchanged"]
        assert failing["barrier"] and other["barrier"]

    def test_restore_traced_in_a_tf_function_lands_on_every_worker(launch):
        done = [_record(launch, task, "__done__") for task in range(WORKERS)]
        assert [d["w"] for d in done] == [[3.0, 4.0]] * WORKERS
        assert [d["total"] for d in done] == [3.0] * WORKERS


if __name__ == "__main__":  # pragma: no cover - one worker of the launch above
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--deadline", type=float, default=LAUNCH_TIMEOUT - 20)
    arguments = parser.parse_args()
    faulthandler.dump_traceback_later(arguments.deadline, exit=True)
    _worker(arguments.out, arguments.dir)
    sys.stdout.flush()
    os._exit(0)  # no teardown of the collective runtime, which can wait on the other worker
