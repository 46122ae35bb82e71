"""The fuzz worker: imports TF once, then runs one operation per JSON line on stdin.

    python tests/helpers/fuzz_worker.py --make-bases DIR   # write the base checkpoints, then exit
    python tests/helpers/fuzz_worker.py DIR                # serve jobs on the bases in DIR

Serving, it first prints `{"ready": true, ...}`, then answers each job
(`{"op", "base", "path", "at", "original", "scratch"}`) with one JSON line:
`status` ("ok" or "error"), `typed` (an `objckpt.errors.ObjckptError`; for plain
TF, a `tf.errors.OpError` or ValueError), `error` (type and first line),
`changed` (a variable of the target obj differs from before the operation),
`match` (whose values the target holds afterwards: "original", a checkpoint
number, or what differs), `report_ok` (verify), `seconds`. The protocol goes to
the original stdout; anything printed to stdout while a job runs (TF, the CLI)
goes to stderr. A crash or hang is seen by the parent (`fuzzlib.Worker`).

Targets (one per base kind, built once): a freshly built obj of the base's
structure whose values differ from the base's; before each job its variables
are reset to those values, so a restore is judged by what it changed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep ERROR/FATAL: crash reasons
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the working tree's objckpt
if os.environ.get("FUZZ_OBJCKPT_PATH"):  # another copy of objckpt (e.g. a release)
    sys.path.insert(0, os.environ["FUZZ_OBJCKPT_PATH"])

# A bound on address space, so that a crafted size cannot take the machine's memory
# (an allocation past it fails in the worker instead); 0 means none.
_LIMIT_MB = int(os.environ.get("FUZZ_WORKER_MEMORY_MB", "8192"))
if _LIMIT_MB:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (_LIMIT_MB << 20, _LIMIT_MB << 20))

# The protocol channel is the original stdout; fd 1 goes to stderr from here on.
_PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import objckpt  # noqa: E402
from objckpt import errors  # noqa: E402

import flavours  # noqa: E402
from support import values  # noqa: E402

# --- models --------------------------------------------------------------------------

def keras_module():
    return flavours.keras_for(flavours.session_flavour())


def data(seed: int):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(8, 6, 6, 3)).astype("float32"),
            rng.normal(size=(8, 2)).astype("float32"))


def build_keras(seed: int, *, train: bool = True):
    """Conv2D + BatchNorm + Dense, Adam, one step of training."""
    keras = keras_module()
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3), name="images")
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(3, name="hidden")(x)
    outputs = keras.layers.Dense(2, name="out")(x)
    model = keras.Model(inputs, outputs, name="fuzz")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    if train:
        images, targets = data(seed)
        model.fit(images, targets, epochs=1, batch_size=8, verbose=0)  # one Adam step
    return model


class Dense(tf.Module):
    def __init__(self, n_in, n_out, seed, name=None):
        super().__init__(name=name)
        self.w = tf.Variable(tf.random.stateless_normal((n_in, n_out), seed=(seed, n_out)))
        self.b = tf.Variable(tf.random.stateless_normal((n_out,), seed=(seed, 7)))

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


class Net(tf.Module):
    """Nested modules, a list, a shared submodule, an int64 step."""

    def __init__(self, seed: int):
        super().__init__(name="net")
        self.encoder = Dense(3, 4, seed)
        self.layers = [Dense(4, 4, seed + 1), Dense(4, 2, seed + 2)]
        self.shared = self.layers[0]
        self.step = tf.Variable(seed, dtype=tf.int64)

    def __call__(self, x):
        x = tf.nn.relu(self.encoder(x))
        for layer in self.layers:
            x = layer(x)
        return x


def build_module(seed: int):
    """tf.train.Checkpoint(model=Net, optimizer=TF1 Adam) after one step (slots exist)."""
    net = Net(seed)
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    flavours.module_step(net, optimizer, tf.ones((2, 3)) * (seed + 1))
    return tf.train.Checkpoint(model=net, optimizer=optimizer)


def save_values(path: str, vals: dict) -> None:
    np.savez(path, *vals.values())
    with open(path + ".json", "w") as f:
        json.dump(list(vals), f)


def load_values(path: str) -> dict:
    with open(path + ".json") as f:
        names = json.load(f)
    arrays = np.load(path if path.endswith(".npz") else path + ".npz")
    return {name: arrays[f"arr_{i}"] for i, name in enumerate(names)}


# --- bases ---------------------------------------------------------------------------

def make_bases(directory: str) -> None:
    """The base checkpoints and each one's values by object path (originals/)."""
    originals = os.path.join(directory, "originals")
    os.makedirs(originals, exist_ok=True)
    info = {"flavour": flavours.session_flavour(), "tf": tf.__version__, "bases": {}}

    model = build_keras(0)
    objckpt.save(model, os.path.join(directory, "keras", "ckpt"))
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        os.path.join(directory, "keras_tf", "ckpt"))
    vals = values(model)
    save_values(os.path.join(originals, "keras-0.npz"), vals)
    save_values(os.path.join(originals, "keras_tf-0.npz"), vals)

    module = build_module(0)
    objckpt.save(module, os.path.join(directory, "module", "ckpt"))
    save_values(os.path.join(originals, "module-0.npz"), values(module))
    # The same values as a safetensors file, written by the `safetensors` library
    # under their object paths, as a Hugging Face style weights file is: restored by path.
    import safetensors.numpy

    os.makedirs(os.path.join(directory, "safetensors"))
    safetensors.numpy.save_file(
        values(module),  # host copies, C-contiguous, scalars 0-d
        os.path.join(directory, "safetensors", "model.safetensors"), metadata={"format": "np"})
    save_values(os.path.join(originals, "safetensors-0.npz"), values(module))

    net = Net(20)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=net),
                                         os.path.join(directory, "manager"), max_to_keep=3)
    for n in range(1, 5):
        for v in net.trainable_variables:
            if v.dtype.is_floating:
                v.assign_add(tf.fill(v.shape, 0.125 * n))
        net.step.assign_add(1)
        saved = manager.save()
        number = int(saved.rsplit("-", 1)[1])
        save_values(os.path.join(originals, f"manager-{number}.npz"), values(net))

    fit_model = build_keras(3)
    keras = keras_module()
    Checkpointing = objckpt.callbacks.Checkpointing
    ckpt = Checkpointing(os.path.join(directory, "fit"), max_to_keep=3, save_freq=1,
                         monitor="loss")

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            number = len(ckpt.saved)
            save_values(os.path.join(originals, f"fit-{number}.npz"), values(fit_model))

    images, targets = data(3)
    fit_model.fit(images, targets, epochs=2, batch_size=4, shuffle=False, verbose=0,
                  callbacks=[ckpt, Record()])
    for kind in ("keras", "keras_tf", "module", "manager", "fit", "safetensors"):
        info["bases"][kind] = sorted(
            int(name.split("-")[1].split(".")[0]) for name in os.listdir(originals)
            if name.startswith(kind + "-") and name.endswith(".npz"))
    with open(os.path.join(directory, "bases.json"), "w") as f:
        json.dump(info, f, indent=1)


# --- targets -------------------------------------------------------------------------

class Target:
    """A built obj whose variables are reset before each job."""

    def __init__(self, obj, model=None):
        self.obj = obj
        self.model = model  # the Keras model (resume), when obj is one
        self.tree = objckpt.tree(obj)
        self.variables = list(self.tree.values())
        self.fresh = [np.array(v.numpy()) for v in self.variables]

    def reset(self) -> None:
        for v, value in zip(self.variables, self.fresh):
            v.assign(value)

    def bits(self) -> list[bytes]:
        return [np.array(v.numpy()).tobytes() for v in self.variables]

    def changed(self) -> bool:
        return self.bits() != [value.tobytes() for value in self.fresh]

    def compare(self, expected: dict) -> list[str]:
        """Paths whose value differs from `expected` (bitwise; missing counts)."""
        out = []
        for path, v in self.tree.items():
            want = expected.get(path)
            got = np.array(v.numpy())
            if want is None or want.dtype != got.dtype or want.shape != got.shape \
                    or want.tobytes() != got.tobytes():
                out.append(path)
        return out


class Server:
    def __init__(self, bases: str):
        self.bases = bases
        with open(os.path.join(bases, "bases.json")) as f:
            self.info = json.load(f)
        self.originals = {}
        for kind, numbers in self.info["bases"].items():
            self.originals[kind] = {
                n: load_values(os.path.join(bases, "originals", f"{kind}-{n}.npz"))
                for n in numbers}
        self.keras = keras_module()
        model = build_keras(1)
        keras_target = Target(model, model)
        module = build_module(1)
        for v in objckpt.tree(module).values():  # values unlike the base's
            v.assign(v + tf.cast(3, v.dtype))
        net = Net(5)
        self.targets = {"keras": keras_target, "keras_tf": keras_target, "fit": keras_target,
                        "module": Target(module), "manager": Target(net)}
        self.targets["safetensors"] = self.targets["module"]
        self.images, self.targets_data = data(3)

    # -- helpers
    def _match(self, target: Target, base: str, prefix_base: bool):
        originals = self.originals[base]
        if prefix_base:
            differ = target.compare(originals[0])
            if not differ:
                return "original", ""
            return "differs", f"{len(differ)} differ: {', '.join(differ[:3])}"
        for number in sorted(originals, reverse=True):
            if not target.compare(originals[number]):
                return number, ""
        return None, "values of no checkpoint of the directory"

    # -- operations
    def run(self, job: dict) -> dict:
        op = job["op"]
        base = job["base"]
        target = self.targets[base]
        prefix_base = base in ("keras", "keras_tf", "module", "safetensors")
        out = {"status": "ok"}
        target.reset()
        started = time.monotonic()
        try:
            getattr(self, "op_" + op)(job, target, out, prefix_base)
        except BaseException as err:  # the point is to classify everything
            if isinstance(err, KeyboardInterrupt):
                raise
            out["status"] = "error"
            if op == "tf_read":
                out["typed"] = isinstance(err, (tf.errors.OpError, ValueError))
            else:
                out["typed"] = isinstance(err, errors.ObjckptError)
            text = str(err).strip().splitlines()
            out["error"] = f"{type(err).__module__}.{type(err).__name__}: " + (
                text[0][:300] if text else "")
            out["mro"] = [cls.__name__ for cls in type(err).__mro__]
            out["changed"] = target.changed()
        out["seconds"] = round(time.monotonic() - started, 3)
        return out

    def _restore_result(self, target, base, out, prefix_base):
        out["changed"] = target.changed()
        out["match"], out["differ"] = self._match(target, base, prefix_base)

    def op_restore(self, job, target, out, prefix_base):
        objckpt.restore(target.obj, job["path"], at=job["at"])
        self._restore_result(target, job["base"], out, prefix_base)

    op_restore_dir = op_restore

    def op_read_tree(self, job, target, out, prefix_base):
        tree = objckpt.read_tree(job["path"])
        out["entries"] = len([repr(e) for e in tree.values()])

    def op_verify(self, job, target, out, prefix_base):
        report = objckpt.verify(job["path"])
        report.describe()
        out["report_ok"] = bool(report.ok)

    def op_plan(self, job, target, out, prefix_base):
        objckpt.plan(target.obj, job["path"], at=job["at"]).describe()

    def op_diff(self, job, target, out, prefix_base):
        result = objckpt.diff(job["path"], job["original"])
        out["same"] = bool(result.same)

    def op_migrate(self, job, target, out, prefix_base):
        prefix = os.path.join(job["scratch"], "migrated", "ckpt")
        objckpt.migrate(target.obj, job["path"], prefix, at=job["at"], optimizer_state=True)
        if target.changed():
            raise AssertionError("migrate changed the obj it was given the layout of")
        objckpt.restore(target.obj, prefix)
        self._restore_result(target, job["base"], out, prefix_base)
        out["changed"] = False

    def _cli(self, *argv) -> tuple[int, str, str]:
        from absl import app

        from objckpt import cli

        stdout, stderr = io.StringIO(), io.StringIO()
        old = sys.argv
        sys.argv = ["objckpt", *argv]
        code = 0
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    app.run(cli.main, flags_parser=cli._parse)
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else 1
        finally:
            sys.argv = old
        return code, stdout.getvalue(), stderr.getvalue()

    def _cli_typed(self, command, code, err, out):
        if code == 0:
            return
        if code == 1 and err.startswith(f"objckpt {command}:"):
            out["status"], out["typed"] = "error", True
            out["error"] = "cli exit 1: " + err.strip().splitlines()[0][:300]
            return
        out["status"], out["typed"] = "error", False
        out["error"] = f"cli exit {code}: " + (err.strip().splitlines() or [""])[-1][:300]

    def op_cli_inspect(self, job, target, out, prefix_base):
        code, _stdout, err = self._cli("inspect", job["path"])
        self._cli_typed("inspect", code, err, out)

    def op_cli_verify(self, job, target, out, prefix_base):
        code, _stdout, err = self._cli("verify", job["path"])
        if code == 1 and not err.startswith("objckpt verify:"):
            out["report_ok"] = False  # problems listed on stdout
            return
        self._cli_typed("verify", code, err, out)
        out["report_ok"] = code == 0

    def op_resume(self, job, target, out, prefix_base):
        ckpt = objckpt.callbacks.Checkpointing(job["path"], max_to_keep=3, save_freq=1,
                                               monitor="loss")
        try:
            target.model.fit(self.images, self.targets_data, epochs=2, batch_size=4,
                             shuffle=False, verbose=0, callbacks=[ckpt])
        finally:
            out["resumed_from"] = ckpt.resumed_from
        name = os.path.basename(ckpt.resumed_from or "")
        out["match"] = int(name.split("-")[1]) if name.startswith("ckpt-") else None

    def op_tf_read(self, job, target, out, prefix_base):
        base, path = job["base"], job["path"]
        if not prefix_base:
            path = tf.train.latest_checkpoint(path)
            if path is None:
                raise ValueError("tf.train.latest_checkpoint found no checkpoint")
        if base == "keras":
            root = tf.train.Checkpoint(root=target.obj)
        elif base == "module":
            root = target.obj
        elif base in ("keras_tf",):
            root = tf.train.Checkpoint(model=target.obj, optimizer=target.obj.optimizer)
        else:
            root = tf.train.Checkpoint(model=target.obj)
        root.read(path).expect_partial()
        self._restore_result(target, base, out, prefix_base)


def serve(bases: str) -> None:
    server = Server(bases)
    _PROTOCOL.write(json.dumps({"ready": True, "pid": os.getpid(),
                                "flavour": server.info["flavour"]}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        result = server.run(job)
        _PROTOCOL.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--make-bases":
        make_bases(sys.argv[2])
    else:
        serve(sys.argv[1])
