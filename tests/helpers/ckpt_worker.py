"""A fork server that trains with `callbacks.Checkpointing`, for crash tests.

Started once per flavour (`python ckpt_worker.py FLAVOUR KIND`), it imports
TensorFlow and Keras and then reads one JSON job per line on stdin. For each
job it forks a worker that builds the flavour's model (fixed seeds), fits it
with Checkpointing into `job["dir"]` and writes the final variables to
`job["out"]` (`.npz`, no pickle); the server prints `pid N` when the worker
starts and `exit S` when it ends (S < 0: killed by signal -S). Forking keeps
each of the many kills of a test from paying for a TensorFlow import.

Job keys: dir, out, epochs, save_freq, async (bool), fault ([stage, hit]:
SIGKILL itself at that hit of that stage of a save), sleep (seconds per
batch, to give a signal time to land), max_to_keep, loop (bool: a custom
training loop with `objckpt.CheckpointManager` instead of fit, saving after
every step).
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np
import tensorflow as tf  # imported once, before the fork server forks

import objckpt
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import Checkpointing

import flavours


def build(flavour, kind):
    keras = flavours.keras_for(flavour)
    keras.utils.set_random_seed(0)
    if kind == "subclassed":
        return keras, flavours.build_subclassed(keras, train=False)
    return keras, flavours.build_functional(keras, train=False)


def inputs(model):
    images, tokens, targets = flavours._data()
    return (images if model.name == "net" else [images, tokens]), targets


def kill_at(job):
    """Installs the fault hook that SIGKILLs this worker at job["fault"] (if any)."""
    if job.get("fault"):
        stage, hit = job["fault"]
        seen = [0]

        def hook(name):
            if name == stage:
                seen[0] += 1
                if seen[0] == hit:
                    os.kill(os.getpid(), signal.SIGKILL)

        _checkpointing.fault_hook = hook


def write_result(model, job, **info):
    values = [np.array(v.numpy()) for v in objckpt.tree(model).values()]
    np.savez(job["out"] + ".tmp.npz", *values)
    os.replace(job["out"] + ".tmp.npz", job["out"])
    with open(job["out"] + ".json", "w") as f:
        json.dump(info, f)


def train_loop(flavour, kind, job):
    """A custom loop: batches of 2 in order, one save per step, `epochs` passes."""
    _, model = build(flavour, kind)
    kill_at(job)
    x, y = inputs(model)
    x = x if isinstance(x, list) else [x]
    steps = job["epochs"] * (len(y) // 2)
    with objckpt.CheckpointManager(model, job["dir"], max_to_keep=job.get("max_to_keep", 2),
                                   keep_best=1, monitor="loss", async_save=job.get("async", False),
                                   verbose=0) as manager:
        start = manager.restore_latest() or 0
        for step in range(start, steps):
            i = 2 * (step % (len(y) // 2))
            batch = [part[i:i + 2] for part in x]
            with tf.GradientTape() as tape:
                out = model(batch if len(batch) > 1 else batch[0], training=True)
                loss = tf.reduce_mean(tf.square(out - y[i:i + 2]))
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
            manager.save(step + 1, {"loss": loss})
    write_result(model, job, start=start)


def train(flavour, kind, job):
    if job.get("loop"):
        return train_loop(flavour, kind, job)
    keras, model = build(flavour, kind)
    kill_at(job)
    callbacks = [Checkpointing(job["dir"], save_freq=job.get("save_freq", 1),
                               max_to_keep=job.get("max_to_keep", 2),
                               async_save=job.get("async", False), monitor="loss")]
    if job.get("sleep"):
        import time

        class Slow(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                time.sleep(job["sleep"])

        callbacks.append(Slow())
    x, y = inputs(model)
    model.fit(x, y, epochs=job["epochs"], batch_size=2, shuffle=False, verbose=0,
              callbacks=callbacks)
    write_result(model, job, resumed_from=callbacks[0].resumed_from)


def main():
    flavour, kind = sys.argv[1], sys.argv[2]
    flavours.keras_for(flavour)  # imports Keras; no TF op runs before the fork
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.dup2(2, 1)  # the worker's prints (resume lines) stay off the server's protocol
            code = 0
            try:
                train(flavour, kind, job)
            except BaseException as err:  # reported through the exit status
                print(f"worker error: {type(err).__name__}: {err}", file=sys.stderr)
                code = 3
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"exit {code}", flush=True)


if __name__ == "__main__":
    main()
