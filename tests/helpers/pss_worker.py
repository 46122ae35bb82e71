"""Runs ParameterServerStrategy scenarios on an in-process cluster (2 workers and 2 parameter
servers on local ports, this process the chief/coordinator) and prints their results as one
JSON line: tests/distributed/test_sharded_cluster.py runs it in a fresh process, since
connecting to a cluster changes this process's eager context for good.

    python tests/helpers/pss_worker.py FOLDER [tf_keras | keras2 | keras3]
    python tests/helpers/pss_worker.py FOLDER (tf_keras | keras2) (fit-kill | fit-resume) WORKERS

tf_keras (TF 2.16+) or Keras 2 (`keras` 2.x, bundled with TF 2.12-2.15): trained and resumed;
Keras 3: its models' state saved and resharded (`keras3_main`). `fit-kill` and `fit-resume`:
`model.fit` with objckpt's Checkpointing on a cluster of WORKERS workers (`fit_kill`,
`fit_resume`): a run killed by SIGKILL mid-epoch, then resumed in a fresh process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

FLAVOUR = sys.argv[2] if len(sys.argv) > 2 else "tf_keras"
if FLAVOUR == "tf_keras":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import importlib  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = importlib.import_module("tf_keras" if FLAVOUR == "tf_keras" else "keras")

import objckpt  # noqa: E402
from objckpt import _compat, errors  # noqa: E402
from objckpt._bundle import index as _index  # noqa: E402
from objckpt._training import checkpointing as _checkpointing  # noqa: E402

ROWS, DIM = 12, 4
CASES = [(2, 2), (1, 2), (2, 3), (3, 1), (4, 2)]  # (shards saved, shards restored)


def _ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def start_cluster(workers: int = 2, ps: int = 2):
    """Servers for the workers and parameter servers in this process; the resolver of the
    chief (this process, the coordinator).

    Each server gets workers + 1 inter-op threads, as TF's own in-process clusters do
    (`multi_worker_test_base.create_in_process_cluster`): with fewer (a 2-core machine's
    default), steps running on two workers at once (`model.fit`) wait on each other forever.
    """
    ports = _ports(workers + ps + 1)
    spec = tf.train.ClusterSpec({
        "worker": [f"localhost:{p}" for p in ports[:workers]],
        "ps": [f"localhost:{p}" for p in ports[workers:workers + ps]],
        "chief": [f"localhost:{ports[-1]}"]})
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc",
                                    config=config)
               for job, count in (("worker", workers), ("ps", ps)) for i in range(count)]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="chief", task_id=0, rpc_layer="grpc")
    return resolver, servers


def strategy_of(resolver, shards: int):
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(
            shards))


def build(strategy, optimizer: str):
    """An embedding model and its optimizer, built (slots made) under `strategy`."""
    with strategy.scope():
        model = keras.Sequential([keras.layers.Embedding(ROWS, DIM, name="embed"),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(1, name="head")])
        model.build((None, 3))
        opt = (keras.optimizers.Adam(0.05) if optimizer == "adam"
               else keras.optimizers.Adagrad(0.1))
        if hasattr(opt, "build"):
            opt.build(model.trainable_variables)
        else:  # Keras 2.12's under this strategy: an OptimizerV2, whose slots come at once
            opt._create_all_weights(model.trainable_variables)
    return model, opt


def train(strategy, model, opt, steps: int, seed: int = 0):
    """`steps` steps of a ClusterCoordinator custom loop on fixed batches."""
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(seed)
    batches = [(rng.integers(0, ROWS, (8, 3)).astype("int64"),
                rng.normal(size=(8, 1)).astype("float32")) for _ in range(steps)]

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica, args=(x, y))

    for x, y in batches:  # one at a time: each step sees the previous one's values
        coordinator.schedule(step, args=(tf.constant(x), tf.constant(y)))
        coordinator.join()


def state(model, opt) -> dict:
    """Every value, keyed by its tf.train.Checkpoint key, read shard by shard (the oracle:
    TF's own checkpoint of the live objects, read back whole)."""
    objects = {"model": model} if opt is None else {"model": model, "optimizer": opt}
    prefix = tf.train.Checkpoint(**objects).write(
        os.path.join(FOLDER, f"oracle-{len(os.listdir(FOLDER))}"))
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def weights(model) -> dict:
    """Each of the model's weights by its place, read shard by shard (not by objckpt)."""
    out = {}
    for place, layer in enumerate(model.layers):
        for name in ("embeddings", "kernel", "bias"):
            variable = getattr(layer, name, None)
            if variable is not None:
                parts = variable.variables if _compat.is_sharded(variable) else [variable]
                out[f"{place}/{name}"] = np.concatenate([p.numpy() for p in parts])
    return out


def shard_rows(model) -> list:
    """The embedding table's rows per shard (one shard: an unsharded variable)."""
    table = model.get_layer("embed").embeddings
    parts = table.variables if _compat.is_sharded(table) else [table]
    return [int(p.shape[0]) for p in parts]


def keras3_main(folder: str, resolver) -> dict:
    """Keras 3 (3.15 when this was written) builds sharded variables under
    ParameterServerStrategy but cannot train with them (its optimizers and layers ask a
    ShardedVariable for its `handle`), and `tf.train.Checkpoint` cannot save such a model
    (its saver asks the ShardedVariable for its `device`): objckpt saves and reshards its
    state, and TF reads what objckpt wrote. The oracle reads each weight's shards."""
    out = {}
    for saved, restored in CASES:
        model = build_keras3(strategy_of(resolver, saved))
        expected = keras3_state(model)
        ours = objckpt.save(model, os.path.join(folder, f"k3-{saved}to{restored}"))
        target_strategy = strategy_of(resolver, restored)
        fresh = build_keras3(target_strategy)
        report = objckpt.restore(fresh, ours)
        tf_fresh = build_keras3(target_strategy)
        try:
            tf.train.Checkpoint(root=tf_fresh).read(ours).assert_consumed()
            tf_reads = same(keras3_state(tf_fresh), expected)
        except Exception as err:  # noqa: BLE001 - reported, the test decides
            tf_reads = f"{type(err).__name__}: {err}"[:300]
        out[f"keras3-{saved}to{restored}"] = {
            "restored": len(report.restored),
            "sharded": sum(_compat.is_sharded(v) for v in objckpt.tree(fresh).values()),
            "objckpt_restore_equal": same(keras3_state(fresh), expected),
            "tf_reads_objckpt_equal": tf_reads,
        }
    return out


def keras3_state(model) -> dict:
    """Each weight's value by its place in `model.weights`, read shard by shard."""
    out = {}
    for place, weight in enumerate(model.weights):
        inner = weight.value if hasattr(weight, "value") else weight
        inner = getattr(weight, "_value", inner)
        parts = inner.variables if _compat.is_sharded(inner) else [inner]
        out[str(place)] = np.concatenate([np.asarray(p.numpy()) for p in parts])
    return out


def build_keras3(strategy):
    with strategy.scope():
        return keras.Sequential([keras.Input((3,), dtype="int32"),
                                 keras.layers.Embedding(ROWS, DIM, name="embed"),
                                 keras.layers.Dense(1, name="head")])


def main(folder: str) -> dict:
    out = {}
    resolver, servers = start_cluster()
    if FLAVOUR == "keras3":
        return keras3_main(folder, resolver)
    for optimizer in ("adam", "adagrad"):
        for saved, restored in CASES:
            name = f"{optimizer}-{saved}to{restored}"
            source_strategy = strategy_of(resolver, saved)
            model, opt = build(source_strategy, optimizer)
            train(source_strategy, model, opt, 3)
            expected = state(model, opt)
            ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
            ours = objckpt.save(ckpt, os.path.join(folder, name))
            theirs = ckpt.write(os.path.join(folder, name + "-tf"))
            key = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
            layout_equal = (_index.read_index(ours).entries[key].slices
                            == _index.read_index(theirs).entries[key].slices)
            target_strategy = strategy_of(resolver, restored)
            fresh, fresh_opt = build(target_strategy, optimizer)
            report = objckpt.restore(tf.train.Checkpoint(model=fresh, optimizer=fresh_opt), ours)
            got = state(fresh, fresh_opt)
            tf_fresh, tf_opt = build(target_strategy, optimizer)
            tf.train.Checkpoint(model=tf_fresh, optimizer=tf_opt).read(ours).expect_partial()
            tf_own, tf_own_opt = build(target_strategy, optimizer)  # TF reading its own
            tf.train.Checkpoint(model=tf_own, optimizer=tf_own_opt).read(theirs).expect_partial()
            from_tf, from_tf_opt = build(target_strategy, optimizer)
            objckpt.restore(tf.train.Checkpoint(model=from_tf, optimizer=from_tf_opt), theirs)
            tf_reads_ours = same(state(tf_fresh, tf_opt), expected)
            tf_reads_own = same(state(tf_own, tf_own_opt), expected)
            # Training continues exactly: one more step on the source, on what objckpt
            # restored and on what TF restored (another layout may round differently).
            train(source_strategy, model, opt, 1, seed=7)
            train(target_strategy, fresh, fresh_opt, 1, seed=7)
            train(target_strategy, tf_fresh, tf_opt, 1, seed=7)
            out[name] = {
                "restored": len(report.restored),
                "rows": [shard_rows(model), shard_rows(fresh)],
                "slots_sharded": sum(
                    _compat.is_sharded(v) for path, v in objckpt.tree(
                        tf.train.Checkpoint(model=fresh, optimizer=fresh_opt)).items()
                    if path.startswith("optimizer/") or ".OPTIMIZER_SLOT" in path),
                "objckpt_restore_equal": same(got, expected),
                "tf_reads_objckpt_equal": tf_reads_ours,
                "tf_reads_tf_equal": tf_reads_own,
                "objckpt_reads_tf_equal": same(state(from_tf, from_tf_opt), expected),
                "layout_equal_to_tf": bool(layout_equal),
                "resume_equal": same(state(fresh, fresh_opt), state(model, opt)),
                "resume_equal_to_tf": same(state(fresh, fresh_opt), state(tf_fresh, tf_opt)),
            }
    # A failure on one shard changes nothing: a checkpoint whose head kernel has another
    # shape (the embedding entries read first are fine).
    strategy = strategy_of(resolver, 2)
    model, opt = build(strategy, "adam")
    train(strategy, model, opt, 2)
    before = state(model, opt)
    other = tf.Module()
    other.model = tf.Module()
    bad = dict(before)
    with tf.device("/cpu:0"):
        for key, value in bad.items():
            if "head/kernel" in key or "layer_with_weights-1/kernel" in key:
                bad[key] = np.zeros((DIM + 1, 1), value.dtype)
    snapshot = objckpt.Snapshot({k.split("/.ATTRIBUTES/")[0]: v for k, v in bad.items()})
    try:
        objckpt.restore(tf.train.Checkpoint(model=model, optimizer=opt), snapshot)
        out["failure"] = {"raised": ""}
    except errors.ObjckptError as err:
        out["failure"] = {"raised": type(err).__name__, "message": str(err)[:400],
                          "unchanged": same(state(model, opt), before)}
    # CheckpointManager: saved at step 2 of a run that goes on; a fresh process's model (in 3
    # shards) resumes from it, and the next step equals the run's.
    directory = os.path.join(folder, "managed")
    run_model, run_opt = build(strategy, "adam")
    train(strategy, run_model, run_opt, 2)
    with objckpt.CheckpointManager(tf.train.Checkpoint(model=run_model, optimizer=run_opt),
                                   directory, max_to_keep=2) as manager:
        manager.save(2)
    train(strategy, run_model, run_opt, 1, seed=5)
    resumed_strategy = strategy_of(resolver, 3)
    resumed, resumed_opt = build(resumed_strategy, "adam")
    with objckpt.CheckpointManager(tf.train.Checkpoint(model=resumed, optimizer=resumed_opt),
                                   directory, max_to_keep=2) as manager:
        step = manager.restore_latest()
    train(resumed_strategy, resumed, resumed_opt, 1, seed=5)
    out["manager"] = {"step": step, "rows": shard_rows(resumed),
                      "resume_equal": same(state(resumed, resumed_opt),
                                           state(run_model, run_opt))}
    # Twins of a model on the parameter servers: the past copy shard by shard on the same
    # devices; a Polyak blend and a hard copy against NumPy.
    twins = objckpt.Twins(model)
    start = weights(twins.past)
    train(strategy, model, opt, 1, seed=9)
    current = weights(model)
    twins.sync(tau=0.5)
    blended = weights(twins.past)
    twins.sync()
    out["twins"] = {
        "devices_equal": [p.device for p in twins.past.get_layer("embed").embeddings.variables]
        == [p.device for p in model.get_layer("embed").embeddings.variables],
        "blend_close": all(np.allclose(blended[k], start[k] + 0.5 * (current[k] - start[k]),
                                       rtol=1e-6, atol=1e-7) for k in current),
        "copy_equal": same(weights(twins.past), current),
    }
    # A failure half way: the parameter servers' shards read and assigned (in one call they
    # run), then the call fails: every shard put back from the undo log.
    good = objckpt.save(tf.train.Checkpoint(model=model, optimizer=opt),
                        os.path.join(folder, "good"))
    train(strategy, model, opt, 1, seed=3)
    before = state(model, opt)
    from objckpt._planning import sharded as _sharded

    real, calls = _sharded._restorer, []

    def failing(kinds):
        restore = real(kinds)

        def run(*args):
            calls.append(len(kinds))
            restore(*args)
            raise OSError("the parameter server went away")

        return run

    _sharded._restorer = failing
    try:
        objckpt.restore(tf.train.Checkpoint(model=model, optimizer=opt), good)
        out["half_way"] = {"raised": ""}
    except OSError as err:
        out["half_way"] = {"raised": str(err), "notes": list(getattr(err, "__notes__", [])),
                           "assigned": sum(calls), "unchanged": same(state(model, opt), before)}
    finally:
        _sharded._restorer = real
    return out


# --- model.fit with Checkpointing -------------------------------------------------------

STEPS, EPOCHS = 4, 4  # steps per epoch, epochs of each fit
KILL_AT = (2, 1)  # (epoch, batch) after which the killed run dies: mid-epoch, epochs 0-1 saved


class Steps(keras.callbacks.Callback):
    """The test's own batch hook (tf_keras allows those taking logs as they come,
    `_supports_tf_logs`, under ParameterServerStrategy): with `serial`, joins the coordinator
    after each step, so that steps on two workers run one at a time and the uninterrupted run
    is reproducible; with `kill`, SIGKILLs this process (cluster included) after that
    (epoch, batch) is scheduled."""

    def __init__(self, serial: bool, kill=None):
        super().__init__()
        self._supports_tf_logs = True
        self.serial, self.kill, self.epoch = serial, kill, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.serial:
            self.model._cluster_coordinator.join()
        if self.kill == (self.epoch, batch):
            os.kill(os.getpid(), signal.SIGKILL)


class Probe(keras.callbacks.Callback):
    """Compares, once every callback before it has begun (Checkpointing has resumed), the
    model's values (its optimizer's included) with the `model/` entries of a checkpoint."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix, self.equal = prefix, None

    def on_train_begin(self, logs=None):
        saved = {k: v for k, v in read_checkpoint(self.prefix).items()
                 if k.startswith("model/")}
        self.equal = same(state(self.model, None), saved)


def fit_data(workers: int):
    """One pass over the data, the same every epoch: 4 batches with one worker; with two, one
    batch (which worker draws step k is a race, each reading its own copy of the data)."""
    rng = np.random.default_rng(11)
    rows = 8 * (STEPS if workers == 1 else 1)
    return (rng.integers(0, ROWS, (rows, 3)).astype("int64"),
            rng.normal(size=(rows, 1)).astype("float32"))


def fit_model(strategy):
    """The embedding model (table in 2 shards), seeded, compiled with an unbuilt Adam."""
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Embedding(ROWS, DIM, name="embed", embeddings_initializer=(
                keras.initializers.RandomUniform(-1.0, 1.0, seed=1))),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1, name="head",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=2))])
        model.build((None, 3))
        model.compile(keras.optimizers.Adam(0.05), loss="mse")
    return model


def fit(model, data, callbacks, **kwargs):
    """`model.fit` as under ParameterServerStrategy it runs: a DatasetCreator repeating one
    pass, steps_per_epoch set."""
    x, y = data

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

    kwargs = {"epochs": EPOCHS, "steps_per_epoch": STEPS, **kwargs}
    utils = tf.keras.utils if FLAVOUR == "keras2" else keras.utils  # Keras 2: tf.keras only
    return model.fit(utils.experimental.DatasetCreator(dataset_fn),
                     callbacks=callbacks, verbose=0, **kwargs)


def fit_kill(folder: str, workers: int) -> dict:
    """A fit saving every epoch, killed by SIGKILL in the middle of epoch 2 (0-based)."""
    resolver, servers = start_cluster(workers)
    model = fit_model(strategy_of(resolver, 2))
    fit(model, fit_data(workers), [
        objckpt.callbacks.Checkpointing(os.path.join(folder, "killed"), verbose=0),
        Steps(workers > 1, kill=KILL_AT)])
    return {"killed": False}


def read_checkpoint(prefix: str) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def sliced(prefix: str) -> dict:
    """The slices the index at `prefix` lists, by key, for each key stored in slices."""
    return {key: entry.slices for key, entry in _index.read_index(prefix).entries.items()
            if entry.slices}


def fit_resume(folder: str, workers: int) -> dict:
    """The uninterrupted run, then the killed one resumed in this fresh process, then what
    Checkpointing refuses under ParameterServerStrategy."""
    resolver, servers = start_cluster(workers)
    strategy = strategy_of(resolver, 2)
    data, out = fit_data(workers), {}
    whole, killed = os.path.join(folder, "whole"), os.path.join(folder, "killed")
    model = fit_model(strategy)
    callback = objckpt.callbacks.Checkpointing(whole, verbose=0)
    history = fit(model, data, [callback, Steps(workers > 1)])
    expected = state(model, model.optimizer)
    out["whole"] = {"epochs": history.epoch, "saved": [os.path.basename(p) for p in callback.saved],
                    "iterations": int(model.optimizer.iterations.numpy())}
    before_kill = sorted(os.listdir(killed))
    resumed = fit_model(strategy)
    callback = objckpt.callbacks.Checkpointing(killed, verbose=0)
    probe = Probe(os.path.join(killed, "ckpt-2"))
    history = fit(resumed, data, [callback, probe, Steps(workers > 1)])
    tree = objckpt.tree(tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer))
    # What Checkpointing wrote lists each sharded variable's slices as TF's own write does.
    theirs = sliced(tf.train.Checkpoint(model=resumed).write(os.path.join(folder, "tf-write")))
    ours = sliced(os.path.join(killed, "ckpt-4"))
    out["resumed"] = {
        "sliced_keys": len(ours), "layout_equal_to_tf": ours == theirs,
        "files_at_kill": [f for f in before_kill if f.endswith(".index")],
        "resumed_from": os.path.basename(callback.resumed_from or ""),
        "epochs": history.epoch, "saved": [os.path.basename(p) for p in callback.saved],
        "restored_equal": probe.equal,
        "iterations": int(resumed.optimizer.iterations.numpy()),
        "sharded": sorted(path for path, v in tree.items() if _compat.is_sharded(v)),
        "equal": same(state(resumed, resumed.optimizer), expected),
        "last_saved_equal": same(read_checkpoint(os.path.join(whole, "ckpt-4")),
                                 read_checkpoint(os.path.join(killed, "ckpt-4"))),
        "before_kill_equal": same(read_checkpoint(os.path.join(whole, "ckpt-2")),
                                  read_checkpoint(os.path.join(killed, "ckpt-2"))),
        "counters": {name: int(value) for name, value in read_checkpoint(
            os.path.join(killed, "ckpt-4")).items() if name.split("/")[0] in
            ("epoch", "step", "batch")},
    }
    if workers > 1:
        out["async"] = fit_async(folder, strategy, data)
    out.update(fit_refusals(folder, strategy, data))
    return out


def fit_async(folder: str, strategy, data) -> dict:
    """Steps on both workers at once, as fit runs them (not reproducible from run to run):
    each checkpoint holds whole epochs, and a fresh model resumes from the last one exactly."""
    run = os.path.join(folder, "async")
    fit(fit_model(strategy), data, [objckpt.callbacks.Checkpointing(run, verbose=0)], epochs=2)
    model = fit_model(strategy)
    callback = objckpt.callbacks.Checkpointing(run, verbose=0)
    probe = Probe(os.path.join(run, "ckpt-2"))
    history = fit(model, data, [callback, probe])
    return {"resumed_from": os.path.basename(callback.resumed_from or ""),
            "epochs": history.epoch, "restored_equal": probe.equal,
            "iterations": int(model.optimizer.iterations.numpy()),
            "counters": {name: int(value) for name, value in read_checkpoint(
                os.path.join(run, "ckpt-4")).items() if name.split("/")[0] in
                ("epoch", "step", "batch")}}


def fit_refusals(folder: str, strategy, data) -> dict:
    """save_freq in batches; a fit without steps_per_epoch; a checkpoint saved mid-epoch."""
    out = {}

    def attempt(name, model, call):
        before = state(model, None)
        try:
            call()
            out[name] = {"raised": ""}
        except errors.ObjckptError as err:
            out[name] = {"raised": type(err).__name__, "message": str(err),
                         "unchanged": same(state(model, None), before)}

    model = fit_model(strategy)
    batches = os.path.join(folder, "batches")
    attempt("save_freq", model, lambda: fit(model, data, [
        objckpt.callbacks.Checkpointing(batches, save_freq=2)]))
    out["save_freq"]["created"] = os.path.exists(batches)
    finite = tf.data.Dataset.from_tensor_slices(data).batch(8)
    attempt("no_steps", model, lambda: model.fit(
        finite, epochs=1, verbose=0,
        callbacks=[objckpt.callbacks.Checkpointing(os.path.join(folder, "nosteps"))]))
    # A checkpoint saved at batch 2 of epoch 1 (as save_freq=2 without the strategy saves)
    mid = os.path.join(folder, "mid")
    other = fit_model(strategy)
    with strategy.scope():  # slots made, as a trained model's checkpoint holds them
        if hasattr(other.optimizer, "build"):
            other.optimizer.build(other.trainable_variables)
        else:  # Keras 2.12's OptimizerV2
            other.optimizer._create_all_weights(other.trainable_variables)
    directory = _checkpointing.CheckpointDirectory(mid, other)
    directory.open()
    for name, number in (("epoch", 1), ("step", 6), ("batch", 2)):
        directory.counters[name].assign(number)
    directory.save()
    directory.close()
    attempt("mid_epoch", model, lambda: fit(model, data, [
        objckpt.callbacks.Checkpointing(mid, verbose=0)]))
    # Saved after the last batch of epoch 1 (batch == STEPS): that epoch is done, fit goes
    # on with epoch 2.
    last = os.path.join(folder, "last")
    directory = _checkpointing.CheckpointDirectory(last, other)
    directory.open()
    for name, number in (("epoch", 1), ("step", 8), ("batch", STEPS)):
        directory.counters[name].assign(number)
    directory.save()
    directory.close()
    callback = objckpt.callbacks.Checkpointing(last, verbose=0)
    history = fit(fit_model(strategy), data, [callback])
    out["last_batch"] = {"epochs": history.epoch, "counters": {
        name: int(value) for name, value in read_checkpoint(callback.saved[-1]).items()
        if name.split("/")[0] in ("epoch", "step", "batch")}}
    return out


if __name__ == "__main__":
    FOLDER = sys.argv[1]
    if len(sys.argv) > 3:
        scenario = {"fit-kill": fit_kill, "fit-resume": fit_resume}[sys.argv[3]]
        print("RESULT " + json.dumps(scenario(FOLDER, int(sys.argv[4]))), flush=True)
        os._exit(0)
    print("RESULT " + json.dumps(main(FOLDER)), flush=True)
    os._exit(0)  # in-process servers never stop: end without waiting on them
