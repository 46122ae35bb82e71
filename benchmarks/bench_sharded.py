"""A sharded embedding table under ParameterServerStrategy: `objckpt.save` and
`objckpt.restore` against `tf.train.Checkpoint` on the same cluster, time and the
coordinator's peak memory.

Run through `python benchmarks/run.py --section sharded [--sharded-mib 1024]`, or alone:
`python benchmarks/bench_sharded.py [--size-mib 1024] [--rounds 3]`.

The cluster: one worker and two parameter servers, each a `tf.distribute.Server` in its own
process on local ports, started afresh for every operation (a parameter server keeps what a
coordinator made until the coordinator's context expires) and stopped after it; the
coordinator is a fresh child process of its own, so its memory is its own. The table: a
tf_keras `Embedding` of 64 float32 columns (1024 MiB: 4,194,304 rows) built under
`ParameterServerStrategy` with `FixedShardsPartitioner(2)`: a `ShardedVariable` of two
shards, one on each parameter server, initialised there (random values, or zeros for a
restore), inside `tf.train.Checkpoint(model=model)`, the object both libraries save and
restore.

Operations, each timed in its child, interleaved round by round (the order reversed every
other round), the first round a warm-up; each figure is the median over the other rounds:

- `objckpt.save(ckpt, prefix)` against `ckpt.write(prefix)`: a fresh prefix each time, the
  previous round's files deleted and `os.sync()` run before the clock starts;
- `objckpt.restore(ckpt, prefix)` against `ckpt.read(prefix).assert_consumed()`, both from the
  checkpoint the warm-up round's `objckpt.save` wrote (in the page cache after the warm-up).

Each restore is checked: a digest of every shard (the sum of its bytes as integers, computed
on its parameter server) equals the saved table's. Peak memory: a thread samples the
coordinator's RssAnon in /proc/self/status every ~1 ms during the operation (`bench_io`'s
sampler); the figure is the peak above the RssAnon just before it. Each parameter server's
peak RSS during the operation (VmHWM, reset through /proc/PID/clear_refs just before it)
beyond its RSS just before it (its shard is in that baseline) is shown beside it. Targets
(ParameterServerStrategy's issue): faster than TF (TF's time over objckpt's >= 1), and the
coordinator's peak beyond its baseline at most the largest shard plus 64 MiB.

Both libraries run the same kernels on the parameter servers (`SaveV2`, `RestoreV2` of each
shard's slice, the servers in parallel), so at 1 GiB their times differ by each library's own
cost beyond those reads and writes, within the rounds' spread. The same operations on a small
table (`--small-mib`, 4 MiB: rows "small table ...") show that cost.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from timing import print_result

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
DIM = 64
SHARDS = 2
SLACK_MIB = 64
SMALL_MIB = 4  # the small table: each library's own cost shows

OPS = {
    "save": "objckpt.save(ckpt, prefix)",
    "write": "tf.train.Checkpoint(model=model).write(prefix)",
    "restore": "objckpt.restore(ckpt, prefix)",
    "read": "tf.train.Checkpoint(model=model).read(prefix).assert_consumed()",
}


def rows_of(size_mib: float) -> int:
    return max(SHARDS, int(size_mib * MIB) // (DIM * 4))


# --- the cluster -------------------------------------------------------------------


def _ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def _env() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class Cluster:
    """A worker and `SHARDS` parameter servers, each in its own process, on local ports."""

    def __init__(self):
        ports = _ports(2 + SHARDS)
        self.spec = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"],
                     "ps": [f"localhost:{p}" for p in ports[2:]]}
        self.procs = {}
        for job, index in [("worker", 0)] + [("ps", i) for i in range(SHARDS)]:
            self.procs[f"{job}{index}"] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--server",
                 json.dumps(self.spec), job, str(index)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
        for proc in self.procs.values():
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                self.stop()
                raise RuntimeError(f"a server of the benchmark's cluster did not start: {line}")

    @property
    def ps_pids(self) -> list[int]:
        return [self.procs[f"ps{i}"].pid for i in range(SHARDS)]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()


def _server(spec: str, job: str, index: int) -> None:
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(spec)), job_name=job,
                                  task_index=index, protocol="grpc")
    print("READY", flush=True)
    server.join()


# --- the coordinator ----------------------------------------------------------------


def _strategy(spec: dict):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners
        .FixedShardsPartitioner(SHARDS))


def _build(strategy, rows: int, fill: str):
    import tf_keras

    with strategy.scope():
        init = (tf_keras.initializers.RandomUniform(seed=1) if fill == "random"
                else tf_keras.initializers.Zeros())
        model = tf_keras.Sequential([tf_keras.layers.Embedding(rows, DIM, name="table",
                                                               embeddings_initializer=init)])
        model.build((None, 3))
    return model


def _digest(table) -> list[int]:
    """Each shard's bytes summed as int32s into an int64, computed where the shard lives."""
    import tensorflow as tf

    out = []
    for part in table.variables:
        with tf.device(part.device):
            out.append(int(tf.reduce_sum(tf.cast(tf.bitcast(part.read_value(), tf.int32),
                                                 tf.int64))))
    return out


def _proc_status(pid: int, field: bytes) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        status = f.read()
    at = status.index(field) + len(field)
    return int(status[at:status.index(b"kB", at)]) * 1024


def _reset_peaks(pids: list[int]) -> list[int]:
    """Resets each process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0:
    /proc/PID/clear_refs); returns the current RSS of each."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    return [_proc_status(pid, b"VmRSS:") for pid in pids]


def _child(task: dict) -> dict:
    import tensorflow as tf

    import objckpt
    from bench_io import _Sampler, _status_kb

    strategy = _strategy(task["spec"])
    model = _build(strategy, task["rows"], "zeros" if task["op"] in ("restore", "read")
                   else "random")
    table = model.get_layer("table").embeddings
    ckpt = tf.train.Checkpoint(model=model)
    ops = {"save": lambda: objckpt.save(ckpt, task["prefix"]),
           "write": lambda: ckpt.write(task["prefix"]),
           "restore": lambda: objckpt.restore(ckpt, task["prefix"]),
           "read": lambda: ckpt.read(task["prefix"]).assert_consumed()}
    # Warm up on a small table of the same kind: code paths loaded once per process are not
    # what an operation costs per byte.
    tiny = tf.train.Checkpoint(model=_build(strategy, 64, "random"))
    warm = task["prefix"] + "-warm"
    if task["op"] in ("save", "restore"):
        objckpt.save(tiny, warm)
        objckpt.restore(tiny, warm)
    else:
        tiny.write(warm)
        tiny.read(warm).assert_consumed()
    digest = _digest(table)
    gc.collect()
    if task["op"] in ("save", "write"):
        os.sync()
    fd = os.open("/proc/self/status", os.O_RDONLY)
    rss_before = _status_kb(b"RssAnon:", fd)
    ps_before = _reset_peaks(task["ps"])
    sys.setswitchinterval(0.0005)
    sampler = _Sampler()
    sampler.start()
    start = time.perf_counter()
    ops[task["op"]]()
    seconds = time.perf_counter() - start
    sampler.finish()
    ps_peaks = [_proc_status(pid, b"VmHWM:") - before
                for pid, before in zip(task["ps"], ps_before)]
    after = _digest(table)
    return {"seconds": seconds, "anon_added": (sampler.peak - sampler.baseline) * 1024,
            "rss_before": rss_before * 1024, "samples": sampler.samples,
            "ps_peaks": ps_peaks,
            "digest": after, "unchanged": after == digest,
            "shards": [int(p.shape[0]) for p in table.variables],
            "devices": [p.device for p in table.variables]}


def _run_op(task: dict) -> dict:
    cluster = Cluster()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                               json.dumps({**task, "spec": cluster.spec,
                                           "ps": cluster.ps_pids})],
                              capture_output=True, text=True, timeout=900, check=False,
                              env=_env())
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"bench_sharded child {task['op']} failed (exit "
                               f"{proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        return json.loads(lines[-1])
    finally:
        cluster.stop()


# --- the benchmark -------------------------------------------------------------------


def _measure(rows: int, rounds: int, work: str) -> tuple[dict, list]:
    """Every operation on a table of `rows`, `rounds` rounds after a warm-up round (the
    order reversed every other round): the samples of each (seconds, coordinator RssAnon
    added, a parameter server's peak added), the notes, and the saved table's shards and
    their devices (in the notes). Each restore's digest is checked against the saved table's."""
    from objckpt._bundle import index as _index

    source = os.path.join(work, "source", "ckpt")
    samples = {op: {"seconds": [], "anon": [], "ps": []} for op in OPS}
    notes = []
    written = None
    for round_ in range(rounds + 1):
        order = list(OPS) if round_ % 2 == 0 else list(OPS)[::-1]
        if round_ == 0:  # warm-up: the source (objckpt's save) first, then every op
            order = ["save"] + [op for op in OPS if op != "save"]
        for op in order:
            if op in ("save", "write"):
                folder = os.path.join(work, f"{op}")
                shutil.rmtree(folder, ignore_errors=True)
                prefix = (source if round_ == 0 and op == "save"
                          else os.path.join(folder, f"r{round_}", "ckpt"))
            else:
                prefix = source
            got = _run_op({"op": op, "rows": rows, "prefix": prefix})
            if op in ("save", "write") and written is None:
                written = got["digest"]
            if op in ("restore", "read") and got["digest"] != written:
                raise RuntimeError(f"{OPS[op]} did not restore the saved table: digest "
                                   f"{got['digest']} != {written}")
            if op in ("save", "write") and not got["unchanged"]:
                raise RuntimeError(f"{OPS[op]} changed the table it saved")
            if round_ == 0:
                if op == "save":
                    notes.append(f"shards: rows {got['shards']} on {got['devices']}")
                continue
            samples[op]["seconds"].append(got["seconds"])
            samples[op]["anon"].append(got["anon_added"])
            samples[op]["ps"].append(max(got["ps_peaks"]))
            print(f"  round {round_}: {OPS[op]}: {got['seconds'] * 1e3:.1f} ms, coordinator "
                  f"+{got['anon_added'] / MIB:.0f} MiB, a parameter server's peak "
                  f"+{max(got['ps_peaks']) / MIB:.0f} MiB", flush=True)
    ours = _index.read_index(source).entries
    theirs = _index.read_index(os.path.join(work, "write", f"r{rounds}", "ckpt")).entries
    key = [k for k in ours if "embeddings" in k][0]
    notes.append("objckpt's index lists the table's slices as TF's: "
                 f"{ours[key].slices == theirs[key].slices}")
    return samples, notes


def _ratios(samples: dict, what: str = "") -> list:
    """TF's time over objckpt's, the median of the per-round ratios, for save and restore."""
    import numpy as np

    from timing import met

    out = []
    for ours, theirs, op in (("save", "write", "save"), ("restore", "read", "restore")):
        per = np.array(samples[theirs]["seconds"]) / np.array(samples[ours]["seconds"])
        value = float(np.median(per))
        out.append((f"{what}{op}: tf.train.Checkpoint time / objckpt time", value, ">= 1x",
                    met(value, ">= 1x"), [float(per.min()), float(per.max())]))
    return out


def bench_sharded(size_mib: float = 1024, rounds: int = 3, small_mib: float = SMALL_MIB) -> dict:
    """The table of `size_mib` (the figures: time, ratios, memory), then one of `small_mib`
    (0: none), whose times are mostly each library's own cost beyond the servers' reads and
    writes (rows of its own, "small table: ...")."""
    import numpy as np

    from timing import met

    rows = rows_of(size_mib)
    nbytes = rows * DIM * 4
    largest = -(-rows // SHARDS) * DIM * 4
    work = tempfile.mkdtemp(prefix="objckpt-bench-sharded-")
    try:
        samples, notes = _measure(rows, rounds, os.path.join(work, "large"))
        small = None
        if small_mib:
            print(f"  a table of {small_mib:g} MiB:", flush=True)
            small, _ = _measure(rows_of(small_mib), rounds, os.path.join(work, "small"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = {OPS[op]: float(np.median(v["seconds"])) for op, v in samples.items()}
    spread = {OPS[op]: [float(min(v["seconds"])), float(max(v["seconds"]))]
              for op, v in samples.items()}
    ratios = _ratios(samples)
    limit = (largest + SLACK_MIB * MIB) / MIB
    for op in OPS:
        peak = float(np.max(samples[op]["anon"])) / MIB
        target = f"<= {limit:.0f} MiB" if op in ("save", "restore") else ""
        ratios.append((f"{OPS[op]}: coordinator peak RssAnon added, MiB (max over rounds)",
                       peak, target, met(peak, target) if target else None))
    if small is not None:
        what = f"small table ({small_mib:g} MiB): "
        ratios += _ratios(small, what)
        for op in OPS:
            ms = float(np.median(small[op]["seconds"])) * 1e3
            ratios.append((f"{what}{OPS[op]}, ms", ms, "", None))
    for op in OPS:
        notes.append(f"{OPS[op]}: a parameter server's peak RSS added (max over rounds) "
                     f"{float(np.max(samples[op]['ps'])) / MIB:.0f} MiB")
    return {"model": f"tf_keras Embedding({rows:,}, {DIM}) float32 in {SHARDS} shards of "
                     f"{largest / MIB:.0f} MiB on {SHARDS} parameter servers "
                     f"({nbytes / MIB:.0f} MiB); coordinator, worker and parameter servers "
                     f"each a process; median of {rounds} rounds after a warm-up",
            "bytes": nbytes, "s": s, "spread": spread, "ratios": ratios, "notes": notes}


def available() -> str | None:
    """Why the benchmark cannot run here (None: it can)."""
    import importlib.util

    if importlib.util.find_spec("tf_keras") is None:
        return "tf_keras is not installed (the table is a tf_keras Embedding)"
    return None


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=float, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small-mib", type=float, default=SMALL_MIB)
    args = parser.parse_args()
    print_result(bench_sharded(args.size_mib, args.rounds, args.small_mib))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        _server(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        print(json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
        os._exit(0)  # the cluster's channels never close: end without waiting on them
    else:
        sys.exit(main())
