"""One worker of a two-worker MultiWorkerMirroredStrategy run, for
tests/distributed/test_distribute_fit.py.

`python mw_fit_worker.py JOB TASK`: JOB is a JSON file, TASK this worker's index (0 is the
chief). The job says: ports (one per worker, 127.0.0.1), flavour ("keras3", "tf_keras",
"keras2"), dir (the Checkpointing directory), out (a folder for this worker's results:
`task-TASK.json` and `task-TASK.npz`), epochs, save_freq, sleep (seconds per batch, so a
test can kill the run mid-training), fit (bool: model.fit with Checkpointing, BestSnapshot,
TwinSync and FreezeSchedule), loop (a directory: a custom loop with CheckpointManager
there, after fit), loop_steps.

Only CPU; no GPU is looked for. Values are written with np.savez (no pickle): key
"STAGE|PATH" (PATH with "/" as "|") holds a variable's value read in cross-replica context
(a SyncOnRead variable's: reduced over both workers), "STAGE|PATH|local" this worker's
replica of it.
"""

import json
import os
import sys
import time
import traceback

with open(sys.argv[1]) as job_file:
    job = json.load(job_file)
TASK = int(sys.argv[2])
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{port}" for port in job["ports"]]},
    "task": {"type": "worker", "index": TASK}})
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if job["flavour"] == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import objckpt  # noqa: E402
from objckpt import callbacks  # noqa: E402

if job["flavour"] == "tf_keras":
    import tf_keras as keras
else:
    import keras
if job["flavour"] == "keras3":
    keras.config.disable_traceback_filtering()  # the frames that say where fit fails

RESULT: dict = {"task": TASK, "pid": os.getpid(), "flavour": job["flavour"]}
ARRAYS: dict = {}


def on_read(obj) -> list:
    """Object paths of obj's SyncOnRead variables (one value per replica by design)."""
    return sorted(path for path, variable in objckpt.tree(obj).items()
                  if variable.synchronization == tf.VariableSynchronization.ON_READ)


def record(stage: str, obj) -> None:
    for path, variable in objckpt.tree(obj).items():
        key = f"{stage}|{path.replace('/', '|')}"
        ARRAYS[key] = np.array(variable.numpy())
        if isinstance(variable, tf.distribute.DistributedValues):
            ARRAYS[key + "|local"] = np.array(variable.values[0].numpy())


def write_results() -> None:
    out = job["out"]
    np.savez(os.path.join(out, f"task-{TASK}.tmp.npz"), **ARRAYS)
    os.replace(os.path.join(out, f"task-{TASK}.tmp.npz"), os.path.join(out, f"task-{TASK}.npz"))
    with open(os.path.join(out, f"task-{TASK}.json"), "w") as f:
        json.dump(RESULT, f)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 4)).astype("float32")
Y = RNG.normal(size=(64, 2)).astype("float32")
BATCH = 16  # global: 8 per worker


class Net(keras.Model):
    """encoder (Dense) -> bn (BatchNormalization) -> head (Dense)."""

    def __init__(self):
        super().__init__(name="net")
        self.encoder = keras.layers.Dense(8, activation="relu")
        self.bn = keras.layers.BatchNormalization()
        self.head = keras.layers.Dense(2)

    def call(self, x, training=False):
        return self.head(self.bn(self.encoder(x), training=training))


def build():
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = Net()
        model(X[:2])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class Recorder(keras.callbacks.Callback):
    """Records values at the start (after Checkpointing resumed), at each epoch's end and
    at the end of training (before BestSnapshot restores), and sleeps after each batch."""

    def __init__(self, twins, checkpointing):
        super().__init__()
        self.twins, self.checkpointing = twins, checkpointing

    def on_train_begin(self, logs=None):
        fit = self.checkpointing._fit
        RESULT["resumed_from"] = self.checkpointing.resumed_from
        RESULT["begin_counters"] = [fit.epoch, fit.step, fit.batch]
        record("begin", self.model)
        RESULT["epochs_seen"] = []
        print(f"task {TASK}: training", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if job.get("sleep"):
            time.sleep(job["sleep"])

    def on_epoch_end(self, epoch, logs=None):
        RESULT["epochs_seen"].append(epoch)
        record(f"epoch{epoch}", self.model)
        record(f"past{epoch}", self.twins.past)

    def on_train_end(self, logs=None):
        record("trained", self.model)


def fit() -> None:
    model = build()
    with strategy.scope():
        twins = objckpt.Twins(model)
    ckpt = callbacks.Checkpointing(job["dir"], save_freq=job.get("save_freq", "epoch"),
                                   max_to_keep=2, keep_best=1, monitor="loss", verbose=0)
    best = callbacks.BestSnapshot("loss")
    sync = callbacks.TwinSync(twins, every=1, on="epoch")
    freeze = callbacks.FreezeSchedule({0: None, 2: "^encoder/"})
    recorder = Recorder(twins, ckpt)
    try:
        model.fit(X, Y, batch_size=BATCH, epochs=job["epochs"], shuffle=False, verbose=0,
                  callbacks=[ckpt, freeze, sync, recorder, best])
    except ValueError as err:
        # Keras 3's TF trainer cannot fit under MultiWorkerMirroredStrategy (before any
        # callback runs): _maybe_symbolic_build reduces the first batch, a tuple of
        # PerReplica, with strategy.reduce, which takes one value only there.
        where = [frame.name for frame in traceback.extract_tb(err.__traceback__)]
        if "PerReplica" not in str(err) or "_maybe_symbolic_build" not in where:
            raise
        RESULT["fit_unsupported"] = (f"keras {keras.__version__}, TF {tf.__version__}: "
                                     f"{type(err).__name__} in _maybe_symbolic_build: "
                                     f"{str(err).splitlines()[0]}")
        return
    RESULT.update(
        saved=ckpt.saved, kept=[k.prefix for k in ckpt.manager.kept],
        best_kept=[k.prefix for k in ckpt.manager.best()], chief=ckpt.manager.cluster.chief,
        best_epoch=best.best_epoch, best=best.best, syncs=sync.syncs,
        freeze_history=[[e, list(frozen)] for e, frozen in freeze.history],
        past_types=sorted({type(v).__name__ for v in objckpt.tree(twins.past).values()}),
        on_read=on_read(model),
        model_types=sorted({type(v).__name__ for v in objckpt.tree(model).values()}))
    record("final", model)


def loop() -> None:
    """A custom training loop under the strategy, saving with CheckpointManager each step."""
    model = build()
    optimizer = model.optimizer
    if hasattr(optimizer, "build"):  # Keras 2's (legacy) Adam makes its slots when it applies
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batches = strategy.experimental_distribute_dataset(dataset.with_options(options))

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1),
                    global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    steps = job["loop_steps"]
    with objckpt.CheckpointManager(model, job["loop"], max_to_keep=2, keep_best=1,
                                   monitor="loss", verbose=0) as manager:
        start = manager.restore_latest() or 0
        RESULT["loop_start"] = start
        RESULT["loop_chief"] = manager._directory.cluster.chief
        record("loop_begin", model)
        step, saved = 0, []
        while step < steps:
            for x, y in batches:
                if step >= steps:
                    break
                if step >= start:  # batches before start were trained on by the checkpoint
                    loss = train_step(x, y)
                    saved.append(manager.save(step + 1, {"loss": float(loss)}))
                    if job.get("sleep"):
                        time.sleep(job["sleep"])
                step += 1
        RESULT.update(loop_saved=saved, loop_kept=[k.prefix for k in manager.kept],
                      loop_latest=manager.latest, on_read=on_read(model))
    record("loop_final", model)


if __name__ == "__main__":
    if job.get("fit"):
        fit()
    if job.get("loop"):
        loop()
    write_results()
    print(f"task {TASK}: done", flush=True)
