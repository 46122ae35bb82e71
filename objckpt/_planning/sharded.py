"""Sharded variables restored from a local TF checkpoint one shard at a time, where they live.

A `ShardedVariable` (ParameterServerStrategy with a partitioner) is one logical variable in
a plan. Restored whole, its value would be assembled on this host (the coordinator): the
whole table in memory. `SlicedLoader` reads each shard's rows of the checkpoint's tensor
with one `RestoreV2` of that slice (TF's reader takes the stored slices that overlap it,
whatever shard count wrote them, and checks their checksums) and assigns them to that shard.
As `tf.train.Checkpoint` does, a shard held by another task (a parameter server) is read by
that task and assigned there: its bytes never cross this host. Shards of the stored dtype
on other tasks are restored in one call those tasks run in parallel (`_restorer`, traced
once per layout), no shard assigned before every slice was read, each variable adopting the
buffer its slice was read into; the others (a lossless cast, done where the shard lives;
a variable of this host's) one at a time, each task's on a thread of its own. Where a task
cannot reach the file (not found there), this host reads the slice and sends it.

All or nothing (`Recorder`, in the fetch stage's undo log, `_fetch.Streamed`): before a
shard is assigned its old value is kept where it lives (a parameter server keeps the value
read just before, which the assignment does not change), a variable of this host's has it
written to the undo log's file; a failure half way puts every shard (and every other
variable) back.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import tensorflow as tf

from objckpt import _compat
from objckpt._bundle import undolog as _undolog

__all__ = ["Job", "Recorder", "SlicedLoader", "jobs", "read_slice"]

HERE = "/cpu:0"


class Job(NamedTuple):
    """One read and one assign: `key` (its `spec`: a slice, "" for the whole tensor) of
    stored dtype `dtype` into `variable` (a shard, or a whole variable), read on `device`
    (the CPU of the task holding `variable`; HERE: this host)."""

    key: str
    spec: str
    dtype: object
    variable: object
    label: str
    device: str = HERE


def jobs(keys, dtypes, targets, labels) -> list[Job]:
    """The reads of a plan's entries: one per shard of a sharded target, one per other."""
    out = []
    for key, dtype, target, label in zip(keys, dtypes, targets, labels):
        if _compat.is_sharded(target):
            for spec, part in zip(_compat.slice_specs(_compat.shard_layout(target)),
                                  _compat.shards(target)):
                out.append((key, spec, dtype, part, f"{label} (rows {_rows(spec)})"))
        else:
            out.append((key, "", dtype, target, label))
    devices = _compat.io_devices([getattr(job[3], "device", "") or "" for job in out])
    return [Job(*job, device) for job, device in zip(out, devices)]


def _rows(spec: str) -> str:
    """The rows of a slice spec ("10 4 6,4:0,4" -> "[6:10)")."""
    first = spec.split(" ")[-1].split(":")[0]
    start, length = (int(n) for n in first.split(","))
    return f"[{start}:{start + length})"


_RESTORERS: dict = {}
_RESTORERS_LOCK = threading.Lock()


def _restorer(kinds: tuple):
    """One function restoring slices into variables other tasks hold, each of `kinds`
    ((dtype, device) of each job, the device its task's CPU), called with (handles,
    prefix, keys, specs). Every task reads its slices in parallel (one call, as
    `tf.train.Checkpoint`'s restore); no variable is assigned before every slice was read
    whole (checksums checked), and a slice read feeds its assignment alone, so the
    variable adopts its buffer (no copy of the shard). Traced once per `kinds` in a
    process (a restore of the same layout again calls it without tracing)."""
    with _RESTORERS_LOCK:
        fn = _RESTORERS.get(kinds)
        if fn is None:
            def restore(handles, prefix, keys, specs):
                values = []
                for key, spec, (dtype, device) in zip(keys, specs, kinds):
                    with tf.device(device):
                        values.append(tf.raw_ops.RestoreV2(
                            prefix=prefix, tensor_names=[key], shape_and_slices=[spec],
                            dtypes=[dtype])[0])
                with tf.control_dependencies(values):  # every slice read: then assigned
                    for handle, value, (_, device) in zip(handles, values, kinds):
                        with tf.device(device):
                            tf.raw_ops.AssignVariableOp(resource=handle, value=value)

            fn = _RESTORERS[kinds] = tf.function(restore, autograph=False)
        return fn


def read_slice(prefix: str, job: Job):
    """The stored values of one job, read on `job.device` (this host's CPU where the task
    holding the variable does not find the file)."""
    for device in dict.fromkeys((job.device, HERE)):
        try:
            with tf.device(device):
                return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[job.key],
                                            shape_and_slices=[job.spec], dtypes=[job.dtype])[0]
        except tf.errors.NotFoundError:
            if device == HERE:
                raise
    raise AssertionError("unreachable")


def _read_there(job: Job):
    """The current value of `job.variable`, read on the task holding it (one remote op: no
    copy, nothing crosses this host; the value shares the variable's buffer until the
    variable is next written)."""
    handle = getattr(job.variable, "handle", None)
    if handle is None:
        with tf.device(job.device):
            return job.variable.read_value()
    with tf.device(job.device):
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=job.variable.dtype.base_dtype)


class SlicedLoader:
    """A streamed loader (`verify`, `assign`, `close`) of `jobs` from the local TF checkpoint
    `prefix`: each value read (`read_slice`), converted where the plan admitted a lossless
    cast (`convert(value, variable)`, on the job's device) and given to
    `assign_to(variable, value)`, one at a time. The plan checked every shape and dtype
    from the index before."""

    def __init__(self, prefix: str, job_list: list[Job], assign_to, convert=None):
        self.prefix = prefix
        self.jobs = list(job_list)
        self._assign_to = assign_to
        self._convert = convert

    def verify(self) -> None:
        """Nothing more to check: TF's reader checks each slice's checksum as it reads it."""

    def assign(self) -> None:
        """Every job read and assigned: those other tasks can do alone in one call they
        run (`Recorder.restore_there`, where `assign_to` has it), the others the jobs of
        each task on a thread of their own, in order (tasks work in parallel, as
        `tf.train.Checkpoint`'s restore); after a failure no thread starts another job, and
        the first failure is raised once all ended."""
        there = getattr(self._assign_to, "restore_there", None)
        rest = self.jobs if there is None else there(self.prefix, self.jobs)
        groups: dict = {}
        for job in rest:
            groups.setdefault(job.device, []).append(job)
        if len(groups) <= 1:
            for job in rest:
                self._one(job)
            return
        failed: list = []
        stop = threading.Event()

        def run(group):
            for job in group:
                if stop.is_set():
                    return
                try:
                    self._one(job)
                except BaseException as err:  # noqa: BLE001 (raised below, in this thread)
                    failed.append(err)
                    stop.set()
                    return

        threads = [threading.Thread(target=run, args=(group,), daemon=True,
                                    name="objckpt-shard-read") for group in groups.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]

    def _one(self, job: Job) -> None:
        value = read_slice(self.prefix, job)
        if self._convert is not None:
            with tf.device(job.device):
                value = self._convert(value, job.variable)
        self._assign_to(job.variable, value)
        del value  # one shard at a time on each task

    def close(self) -> None:
        self.jobs = []


class Recorder:
    """The `assign_to` of a `SlicedLoader` under the fetch stage's undo log (`start(log)`):
    each job's old value kept before its variable is assigned, in the log's `keep` (the
    value read on the task holding it, a parameter server: nothing crosses this host) or
    written to the log's file (a variable of this host's)."""

    def __init__(self, job_list: list[Job]):
        self._jobs = {id(job.variable): job for job in job_list}
        self._lock = threading.Lock()
        self.log = None
        self.log_failed = None
        self.writer_error = None
        self.assigned = 0

    def start(self, log) -> None:
        self.log, self.assigned = log, 0

    def restore_there(self, prefix: str, job_list: list) -> list:
        """Reads and assigns the jobs of `job_list` other tasks can do alone (a shard of
        the stored dtype held by another task, a parameter server) in one call those
        tasks run (`_restorer`): no shard assigned before every slice was read; each old
        value kept in the log as `__call__` keeps it. Returns the jobs left to the caller:
        all of them (nothing assigned) where that call cannot be made or a task does not
        find the file."""
        there = [job for job in job_list if job.device != HERE
                 and getattr(job.variable, "handle", None) is not None
                 and job.variable.dtype.base_dtype == job.dtype]
        if not there or not tf.executing_eagerly():
            return list(job_list)
        # Ordered by task and dtype: models of one layout share one traced function.
        there.sort(key=lambda job: (job.device, job.dtype.name))
        olds = []
        if self.log is not None:  # read where each lives: nothing crosses this host
            for job in there:
                olds.append(_read_there(job))
        try:
            _restorer(tuple((job.dtype, job.device) for job in there))(
                [job.variable.handle for job in there], tf.constant(prefix),
                [tf.constant(job.key) for job in there],
                [tf.constant(job.spec) for job in there])
        except tf.errors.NotFoundError:  # a read: every assignment waits on every read
            return list(job_list)
        except BaseException:  # some may be assigned: the log puts each back
            self._keep(there, olds)
            raise
        self._keep(there, olds)
        done = {id(job) for job in there}
        return [job for job in job_list if id(job) not in done]

    def _keep(self, job_list: list, olds: list) -> None:
        with self._lock:
            for job, old in zip(job_list, olds):
                self.log.keep(job.variable, old, job.label)
            self.assigned += len(job_list)

    def __call__(self, variable, value) -> None:
        """(On the loader's threads: one per task, a variable of this host's on one.)"""
        if self.log is not None:
            job = self._jobs[id(variable)]
            if job.device != HERE:
                old = _read_there(job)
                with self._lock:
                    self.log.keep(variable, old, job.label)
            else:
                self.log.record(_undolog.Viewed(variable), job.label)
        variable.assign(value, read_value=False)
        with self._lock:
            self.assigned += 1

    def stop(self) -> None:
        """The loader's threads ended before it raised: nothing to stop."""

    def join(self) -> None:
        """No thread of its own: nothing to wait for."""
