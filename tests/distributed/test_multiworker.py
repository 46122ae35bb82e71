"""Every capability under `tf.distribute.MultiWorkerMirroredStrategy`: two worker processes.

Each flavour of this session (its Keras, and plain `tf.Module`s) is one launch of two
workers (tests/helpers/mw_capabilities.py) on localhost: TF_CONFIG with 127.0.0.1 ports, CPU only,
one replica per worker. They run every scenario under the strategy in lockstep, then the
same scenarios without a strategy (the single-device reference), and report per scenario.
Here each scenario is one test: both workers succeeded, agree bit for bit with each other
(every variable's value and every replica's component) and with the reference.

Bounded: collectives time out inside the workers, each worker dumps its stacks and exits
at its own deadline, and the launch kills both (their process groups) at LAUNCH_TIMEOUT,
or as soon as one has failed and the other has had GRACE seconds to finish.
"""

from __future__ import annotations

import json
import time

import mw_capabilities
import pytest

from flavours import keras_for, session_flavour
from support import kill_group, python_env, start_cluster

SCENARIOS = mw_capabilities.SCENARIOS
FLAVOURS = (session_flavour(), "module")
WORKERS = 2
LAUNCH_TIMEOUT = 300  # seconds for one launch; a normal one takes well under a minute
GRACE = 90  # seconds the other worker gets once one has exited with an error
COLLECTIVE_TIMEOUT = 60  # seconds a collective waits for the other worker
PORT_TAKEN = "Could not start gRPC server"  # TF's error when its port is in use

pytestmark = [pytest.mark.multiworker,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


class Launch:
    """Two workers of one flavour, run to completion (or killed) and their reports."""

    def __init__(self, flavour: str, directory):
        self.flavour = flavour
        self.directory = directory
        self.records = [[] for _ in range(WORKERS)]
        self.codes: list = [None] * WORKERS
        self.logs = [""] * WORKERS
        self.seconds = 0.0
        self.killed = False
        self._run(directory)
        if any(PORT_TAKEN in log for log in self.logs):
            # a port found free was taken before TF bound it: once more, on other ports
            self._run(directory / "again")

    def _run(self, directory) -> None:
        directory.mkdir(exist_ok=True)
        self.records = [[] for _ in range(WORKERS)]
        outs = [directory / f"worker{i}.jsonl" for i in range(WORKERS)]
        logs = [directory / f"worker{i}.log" for i in range(WORKERS)]
        env = python_env(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
        started = time.monotonic()
        processes = start_cluster(
            [[mw_capabilities.__file__, "--flavour", self.flavour, "--dir", directory,
              "--out", outs[i], "--collective-timeout", COLLECTIVE_TIMEOUT,
              "--deadline", LAUNCH_TIMEOUT - 20] for i in range(WORKERS)], logs, env)
        try:
            deadline = started + LAUNCH_TIMEOUT
            while any(p.poll() is None for p in processes):
                failed = [i for i, p in enumerate(processes) if p.poll() not in (None, 0)]
                if failed and deadline > time.monotonic() + GRACE:
                    deadline = time.monotonic() + GRACE  # the other would wait for it
                if any(not outs[i].exists() for i in failed):
                    break  # one never started (its port, TF): the other has no one to meet
                if time.monotonic() > deadline:
                    self.killed = True
                    break
                time.sleep(0.2)
        finally:
            for p in processes:
                kill_group(p)
            self.seconds = time.monotonic() - started
        for i, p in enumerate(processes):
            self.codes[i] = p.returncode
            if outs[i].exists():
                self.records[i] = [json.loads(line) for line in outs[i].read_text().splitlines()
                                   if line.strip()]
            self.logs[i] = logs[i].read_text(errors="replace") if logs[i].exists() else ""

    def record(self, task: int, scenario: str, mode: str):
        for record in self.records[task]:
            if record.get("scenario") == scenario and record.get("mode") == mode:
                return record
        return None

    def reference(self, scenario: str):
        for task in range(WORKERS):
            record = self.record(task, scenario, "ref")
            if record is not None:
                return record
        return None

    def finished(self, task: int) -> bool:
        return any(r.get("scenario") == "__done__" for r in self.records[task])

    def why_missing(self, task: int) -> str:
        tail = "\n".join(self.logs[task].splitlines()[-40:])
        how = (f"killed after {self.seconds:.0f} s" if self.killed
               else f"exit code {self.codes[task]}")
        return f"worker {task} ({how}); the end of its log:\n{tail}"

    def barrier_errors(self) -> list:
        return [f"worker {task} after {r['after']}: {r['error']}"
                for task in range(WORKERS) for r in self.records[task]
                if r.get("scenario") == "__barrier__"]


_LAUNCHES: dict = {}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """flavour -> its Launch, started on first use and run once per module."""

    def get(flavour: str) -> Launch:
        if flavour != "module":
            keras_for(flavour)  # skips with the reason where this session lacks it
        if flavour not in _LAUNCHES:
            _LAUNCHES[flavour] = Launch(flavour, tmp_path_factory.mktemp(f"mw_{flavour}"))
        return _LAUNCHES[flavour]

    yield get
    _LAUNCHES.clear()


def _differences(label: str, a: dict, b: dict, who: str) -> list:
    out = []
    for path in sorted(set(a) | set(b)):
        if a.get(path) != b.get(path):
            out.append(f"{label}: `{path}` {who}")
    return out


def _compare_states(scenario: str, w0: dict, w1: dict, ref: dict | None) -> list:
    """Every disagreement between worker 0, worker 1, their replicas and the reference."""
    problems = []
    states0, states1 = w0["states"], w1["states"]
    if set(states0) != set(states1):
        problems.append(f"the workers report other states: {sorted(states0)} / "
                        f"{sorted(states1)}")
    for label in sorted(set(states0) & set(states1)):
        s0, s1 = states0[label], states1[label]
        problems += _differences(label, s0["values"], s1["values"],
                                 "differs between worker 0 and worker 1")
        if s0["uniform"]:
            for task, state in ((0, s0), (1, s1)):
                for path, replicas in state["replicas"].items():
                    if any(r != state["values"].get(path) for r in replicas):
                        problems.append(f"{label}: `{path}` a replica on worker {task} differs "
                                        "from the variable's value")
        if ref is not None:
            if label not in ref["states"]:
                problems.append(f"{label}: missing from the single-device reference")
            else:
                problems += _differences(label, s0["values"], ref["states"][label]["values"],
                                         "differs from the single-device reference")
    return problems


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(launches, flavour, scenario):
    launch = launches(flavour)
    records = [launch.record(task, scenario, "dist") for task in range(WORKERS)]
    for task, record in enumerate(records):
        assert record is not None, (f"{scenario} was not reported by "
                                    + launch.why_missing(task))
    errors = [f"worker {task}: {r['error']}" for task, r in enumerate(records) if not r["ok"]]
    barrier = launch.barrier_errors()
    assert not errors, "\n".join(errors) + ("\nbarriers: " + "\n".join(barrier) if barrier
                                            else "")
    ref = None
    if scenario not in mw_capabilities.DIST_ONLY:
        ref = launch.reference(scenario)
        assert ref is not None, "no single-device reference reported: " + "; ".join(
            launch.why_missing(task) for task in range(WORKERS))
        assert ref["ok"], f"the single-device reference failed: {ref['error']}"
    problems = _compare_states(scenario, records[0], records[1], ref)
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:40])
    _check_facts(flavour, scenario, records[0]["facts"], records[1]["facts"],
                 ref["facts"] if ref is not None else None)


def _check_facts(flavour: str, scenario: str, facts0: dict, facts1: dict, ref: dict | None) -> None:
    assert facts0 == facts1, f"the workers report different facts: {facts0} / {facts1}"
    if scenario == "tree":
        assert facts0["paths"] == ref["paths"], "the tree under the strategy has other paths"
        assert facts0["checkpoint_paths"] == ref["checkpoint_paths"]
    if scenario == "save":
        # only the chief wrote; the other worker left nothing beside it
        assert facts0["listing"] == ["ckpt.data-00000-of-00001", "ckpt.index"], facts0
        assert facts0["snapshot_listing"] == ["ckpt.data-00000-of-00001", "ckpt.index"], facts0
        # each worker named its own prefix: the chief's alone were written
        assert facts0["who_listing"] == [f"{what}_task0.{suffix}" for what in (
            "arrays", "obj", "snapshot") for suffix in ("data-00000-of-00001", "index")], facts0
    if scenario == "plan_migrate":
        assert facts0["listing"] == ref["listing"], "migrate left other files than on one device"
        assert facts0["who_listing"] == ["task0.data-00000-of-00001", "task0.index"], (
            "each worker named its own prefix: only the chief's may be written, as for save; "
            f"found {facts0['who_listing']}")
        assert facts0["matches"] == ref["matches"]
    if scenario == "clone" and flavour != "module":
        assert ref["walked_on_read"] == [] and facts0["walked_on_read"], (
            "the clone holds no SyncOnRead variable (compiled metrics have them)")
    if scenario in ("restore_fails", "freezer", "load_ensemble"):
        assert facts0 == ref, f"under the strategy: {facts0}; on one device: {ref}"
    if scenario == "restore_fails_on_one_worker":
        # every worker raises worker 1's error type: they handle the failure alike
        assert facts0["raised"] == {"wrong shape": "StructureMismatchError",
                                    "missing prefix": "CheckpointNotFoundError"}, facts0
    if scenario == "load_ensemble_fails_on_one_worker":
        assert facts0 == {"raised": "CheckpointNotFoundError", "quick": True}, facts0


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_workers_finish_in_time(launches, flavour):
    launch = launches(flavour)
    for task in range(WORKERS):
        assert launch.finished(task) and launch.codes[task] == 0, launch.why_missing(task)
    assert not launch.barrier_errors(), launch.barrier_errors()
