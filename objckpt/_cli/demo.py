"""`objckpt demo`: a tour of objckpt on a small Keras 3 model, in a few seconds.

It takes about 5 s on 2 CPU cores (2 s of it importing TensorFlow); `DURATION`
is what `objckpt demo --help` and the demo's first line say.

1. Trains a small regression MLP with `model.fit`, a target network kept by
   `Twins` + `callbacks.TwinSync` (Polyak averaging every batch) and crash-safe
   checkpoints by `callbacks.Checkpointing` (newest 2 + best 1 by val_loss),
   with a progress line.
2. Restores the best checkpoint into the model and checks its val_loss.
3. Writes a TF1 name-based checkpoint with TF1 graph code
   (`tf.compat.v1.get_variable`, a `Session`, `tf.compat.v1.train.Saver`),
   plans and migrates it into a Keras 3 rewrite, and checks the outputs.
4. Prints the object trees, verifies both checkpoints, draws the object graph
   (SVG with Graphviz, DOT text without) and prints timings.

Everything is written under one folder (a new temporary one by default). Run
again with the same `--out`, it starts afresh: the checkpoints of the earlier
run in `run/` are removed first (and it says so), the other files rewritten.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time

from objckpt import errors

__all__ = ["DURATION", "run"]

# How long the demo takes, measured (`objckpt demo` on 2 CPU cores: 4-7 s wall, imports
# included); the CLI's help and the demo's first line say it.
DURATION = "about 5 s"
# What Checkpointing writes in the demo's run folder: an earlier demo run, removed on a new
# one (anything else there is not the demo's to delete).
_RUN_FILES = re.compile(r"checkpoint|\.objckpt\.lock|\.?ckpt-(0|[1-9][0-9]*)"
                        r"(\.tmp-[0-9a-f]{12})?\.(index|data-[0-9]{5}-of-[0-9]{5})"
                        r"|\.checkpoint\.tmp-[0-9a-f]{12}")

_FEATURES, _HIDDEN = 8, 32
_SCOPE = "model_001"
# Each key is rewritten once, by the first rule that matches it; `global_step` is kept, so
# with optimizer_state=True it becomes the Keras optimizer's `iterations`.
_RULES = [(f"^{_SCOPE}/", "")]


class _Clock:
    """Times the demo's steps and prints a heading for each."""

    def __init__(self, out):
        self.out = out
        self.start = time.perf_counter()
        self.steps: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def step(self, title: str):
        self.say(f"\n== {title}")
        began = time.perf_counter()
        yield
        self.steps.append((title, time.perf_counter() - began))

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def table(self) -> str:
        width = max(len(title) for title, _ in self.steps)
        lines = [f"  {title:<{width}}  {seconds:6.2f} s" for title, seconds in self.steps]
        lines.append(f"  {'total (wall, with imports)':<{width}}  "
                     f"{time.perf_counter() - self.start:6.2f} s")
        return "\n".join(lines)


def _data(np):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1280, _FEATURES)).astype("float32")
    w = rng.normal(size=(_FEATURES, 1)).astype("float32")
    y = (np.sin(x @ w) + 0.1 * rng.normal(size=(1280, 1))).astype("float32")
    return (x[:1024], y[:1024]), (x[1024:], y[1024:])


def _keras3():
    try:
        import keras
    except ImportError as err:
        raise errors.InvalidArgumentError(
            "objckpt demo needs Keras 3 (TF >= 2.16 installs it). Received: no `keras` module. "
            "Fix: pip install 'tensorflow>=2.16'.") from err
    if not keras.__version__.startswith("3") or os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        raise errors.InvalidArgumentError(
            "objckpt demo trains and migrates into a Keras 3 model. Received: keras "
            f"{keras.__version__}, TF_USE_LEGACY_KERAS={os.environ.get('TF_USE_LEGACY_KERAS')!r}"
            ". Fix: pip install 'tensorflow>=2.16' and unset TF_USE_LEGACY_KERAS.")
    return keras


def _mlp(keras, names=("hidden", "out")):
    return keras.Sequential([keras.Input((_FEATURES,)),
                             keras.layers.Dense(_HIDDEN, activation="tanh", name=names[0]),
                             keras.layers.Dense(1, name=names[1])], name="mlp")


def _progress(keras, clock, epochs):
    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if not clock.out.isatty():
                return  # one line per epoch when not on a terminal
            steps = self.params.get("steps") or "?"
            clock.out.write(f"\r  epoch {self.epoch + 1}/{epochs}  batch {batch + 1}/{steps}  "
                            f"loss {float((logs or {}).get('loss', float('nan'))):.4f}")
            clock.out.flush()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            clock.out.write(f"\r  epoch {epoch + 1}/{epochs}  loss {logs.get('loss', 0):.4f}  "
                            f"val_loss {logs.get('val_loss', 0):.4f}          \n")
            clock.out.flush()

    return Progress()


def _tf1_checkpoint(tf, np, directory, train, steps=30):
    """Trains the MLP in TF1 graph code and saves it with a `Saver`; returns (prefix, y)."""
    x_train, y_train = train
    rng = np.random.default_rng(1)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, _FEATURES), name="x")
        target = tf.compat.v1.placeholder(tf.float32, (None, 1), name="target")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        shapes = {"dense1/kernel": (_FEATURES, _HIDDEN), "dense1/bias": (_HIDDEN,),
                  "dense2/kernel": (_HIDDEN, 1), "dense2/bias": (1,)}
        v = {}
        with tf.compat.v1.variable_scope(_SCOPE):
            for name, shape in shapes.items():
                layer, attr = name.split("/")
                with tf.compat.v1.variable_scope(layer):
                    init = (0.3 * rng.normal(size=shape)).astype("float32")
                    v[name] = tf.compat.v1.get_variable(attr, initializer=tf.constant(init))
        hidden = tf.tanh(tf.matmul(x, v["dense1/kernel"]) + v["dense1/bias"])
        y = tf.matmul(hidden, v["dense2/kernel"]) + v["dense2/bias"]
        loss = tf.reduce_mean(tf.square(y - target))
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                batch = slice(32 * step % 1024, 32 * step % 1024 + 32)
                sess.run(train_op, {x: x_train[batch], target: y_train[batch]})
            outputs = sess.run(y, {x: x_train[:64]})
            prefix = saver.save(sess, os.path.join(directory, "model.ckpt"))
    return prefix, outputs


def _start_afresh(run_dir: str) -> int:
    """Removes the checkpoints an earlier demo run left in `run_dir`; returns how many files.

    Raises:
      InvalidArgumentError: `run_dir` holds files the demo does not write.
    """
    try:
        names = sorted(os.listdir(run_dir))
    except FileNotFoundError:
        return 0
    foreign = [n for n in names if not _RUN_FILES.fullmatch(n)]
    if foreign:
        raise errors.InvalidArgumentError(
            f"`{run_dir}` holds files the demo did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); the demo trains afresh there and would "
            "remove its own earlier checkpoints only. Fix: pass another --out folder.",
            source=run_dir)
    for name in names:
        os.remove(os.path.join(run_dir, name))
    return len(names)


def run(out: str | None = None, epochs: int = 6, stream=None) -> int:
    """Runs the demo; returns the exit status (0 when every check passed).

    Args:
      out: folder to write into (created); default a new temporary folder.
      epochs: training epochs.
      stream: where to print (default stdout).
    """
    clock = _Clock(stream or sys.stdout)
    out = os.path.abspath(out or tempfile.mkdtemp(prefix="objckpt-demo-"))
    os.makedirs(out, exist_ok=True)
    run_dir = os.path.join(out, "run")
    clock.say(f"objckpt demo ({DURATION}): writing under {out}")
    removed = _start_afresh(run_dir)
    if removed:
        clock.say(f"  {run_dir} held an earlier demo run: removed its {removed} files; this "
                  "run trains afresh")
    with clock.step("import TensorFlow and Keras 3"):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import numpy as np
        import tensorflow as tf

        import objckpt
        from objckpt import callbacks
        from objckpt._base import render as _render
        from objckpt._inspect import meta as _meta

        keras = _keras3()
        clock.say(f"  TF {tf.__version__}, Keras {keras.__version__}, "
                  f"{os.cpu_count()} CPU cores")
    failures = []
    train, val = _data(np)
    with clock.step(f"train {epochs} epochs: Twins + TwinSync(tau=0.1) and Checkpointing"):
        keras.utils.set_random_seed(0)
        model = _mlp(keras)
        model.compile(keras.optimizers.Adam(0.01), "mse")
        twins = objckpt.Twins(model)  # past: the target network
        checkpointing = callbacks.Checkpointing(run_dir, max_to_keep=2, keep_best=1,
                                                monitor="val_loss")
        history = model.fit(*train, validation_data=val, epochs=epochs, batch_size=64,
                            verbose=0, shuffle=False, callbacks=[
                                callbacks.TwinSync(twins, every=1, tau=0.1, on="batch"),
                                checkpointing, _progress(keras, clock, epochs)])
        target_loss = float(np.mean((twins.past(val[0]).numpy() - val[1]) ** 2))
        clock.say(f"  target network (Polyak average of past weights) val_loss "
                  f"{target_loss:.4f}; model {history.history['val_loss'][-1]:.4f}")
        kept = ", ".join(os.path.basename(k.prefix) for k in checkpointing.manager.kept)
        clock.say(f"  checkpoints kept: {kept}")
    with clock.step("restore the best checkpoint (by val_loss)"):
        best = checkpointing.manager.best()[0]
        report = objckpt.restore(model, best.prefix, at="model")
        restored = float(model.evaluate(*val, verbose=0))
        clock.say(f"  {os.path.basename(best.prefix)}: val_loss {best.metric:.4f} when saved, "
                  f"{restored:.4f} after restore ({len(report.restored)} variables)")
        if not abs(restored - best.metric) <= 1e-4 * max(1.0, abs(best.metric)):
            failures.append(f"restored val_loss {restored} != saved {best.metric}")
        clock.say(f"\n{_render.inspect_text(_meta.read(best.prefix))}")
    with clock.step("write a TF1 name-based checkpoint with TF1 graph code (Saver)"):
        tf1_prefix, tf1_outputs = _tf1_checkpoint(tf, np, os.path.join(out, "tf1"), train)
        names = tf.train.list_variables(tf1_prefix)
        clock.say(f"  {tf1_prefix}: {len(names)} variables, e.g. "
                  f"{', '.join(n for n, _ in names[:3])}")
    with clock.step("plan and migrate it into a Keras 3 model"):
        rewrite = _mlp(keras, names=("dense1", "dense2"))
        rewrite.compile(keras.optimizers.Adam(0.01), "mse")
        rewrite.optimizer.build(rewrite.trainable_variables)  # Adam's slots take TF1's
        clock.say(f"  rules: {_RULES}, optimizer_state=True")
        clock.say(objckpt.plan(rewrite, tf1_prefix, rules=_RULES,
                               optimizer_state=True).describe())
        migrated = objckpt.migrate(rewrite, tf1_prefix, os.path.join(out, "migrated", "ckpt"),
                                   rules=_RULES, optimizer_state=True)
        objckpt.restore(rewrite, migrated)
        diff = float(np.max(np.abs(rewrite(train[0][:64]).numpy() - tf1_outputs)))
        clock.say(f"  wrote {migrated}; Keras 3 outputs vs TF1 session outputs: max |diff| "
                  f"{diff:.2e}")
        if not diff <= 1e-5:
            failures.append(f"migrated outputs differ from TF1's by {diff}")
        tf1_step = int(tf.train.load_checkpoint(tf1_prefix).get_tensor("global_step"))
        step = int(rewrite.optimizer.iterations.numpy())
        clock.say(f"  Keras 3 optimizer iterations {step} (TF1 global_step {tf1_step})")
        if step != tf1_step:
            failures.append(f"optimizer iterations {step} != TF1 global_step {tf1_step}")
        clock.say(f"\n{_render.inspect_text(_meta.read(migrated))}")
    with clock.step("verify checksums and object graphs"):
        for source in (run_dir, migrated):
            result = objckpt.verify(source)
            clock.say("  " + result.describe().splitlines()[-1])
            if not result.ok:
                failures.append(f"verify {source}: {result.problems[0]}")
    with clock.step("draw the object graph of the best checkpoint"):
        picture = objckpt.graph(best.prefix)
        try:
            path = picture.save(os.path.join(out, "graph.svg"))
        except errors.GraphvizNotFoundError as err:
            path = picture.save(os.path.join(out, "graph.dot"))
            clock.say(f"  (SVG needs Graphviz: {str(err).split('. ', 1)[1]})")
        clock.say(f"  wrote {path}: {picture.nodes} nodes, {picture.edges} edges")
    clock.say("\n== timings")
    clock.say(clock.table())
    if failures:
        clock.say("\nFAILED: " + "; ".join(failures))
        return 1
    clock.say(f"\nAll checks passed. Files are under {out}")
    return 0
