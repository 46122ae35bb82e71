"""One worker of a two-process `MultiWorkerMirroredStrategy` run over objckpt's capabilities.

tests/distributed/test_multiworker.py starts two of these on localhost (TF_CONFIG with 127.0.0.1
ports, CPU only, one replica per worker) and reads what they report:

    python mw_capabilities.py --flavour FLAVOUR --dir SHARED_DIR --out RESULTS.jsonl

FLAVOUR is keras3, tf_keras, keras2 (a compiled functional model: Conv2D, BatchNormalization,
Embedding, a shared Dense, a nested Sequential, Adam with slots, a metric) or module (plain
`tf.Module`s with a TF1 Adam, TF1 momentum on TF 2.12, in a `tf.train.Checkpoint`).

Phase 1 runs every scenario of SCENARIOS under the strategy, in the same order on both
workers, with a barrier (a collective that also checks both are at the same scenario)
after each. Phase 2 runs the same scenarios again without any strategy, in this process
(the single-device computation of the same thing), each on one of the two workers: the
test asserts that both workers agree bit for bit with each other and with it.

Every variable (optimizer state included) holds a value chosen from its object path and a
salt (multiples of 1/32); a training step applies fixed gradients, split 1/4 + 3/4 over the
two replicas (summed by the optimizer's all-reduce, exactly) and whole on one device, so
the same arithmetic runs in both and TF gives the same bits (a Polyak blend too: Twins
blends each replica with the kernel it uses on one device).

Each scenario appends one JSON line to RESULTS: {"scenario", "mode" ("dist" or "ref"),
"task", "ok", "error", "states": {label: {"values": {path: digest}, "replicas": {path:
[digest per local replica]}, "uniform": bool}}, "facts": {...}, "seconds"}. A scenario
raises AssertionError for what one worker can check alone (a frozen variable moved, a
failed restore changed something); the test compares what needs both workers. Collectives
time out (--collective-timeout), the process dumps its stacks and exits after --deadline
seconds, and the test kills both workers at its own deadline: nothing hangs.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import functools
import hashlib
import importlib
import json
import os
import shutil
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# In the order they run; test_multiworker.py parametrizes over these names.
SCENARIOS = (
    "tree",
    "snapshot",
    "restore_snapshot",
    "save",
    "restore_prefix",
    "restore_fails",
    "clone",
    "twins",
    "twins_in_run",
    "freezer",
    "load_ensemble",
    "restore_on_create",
    "plan_migrate",
    "restore_fails_on_one_worker",
    "load_ensemble_fails_on_one_worker",  # last: without agreement it ends in a timeout
)
# Only meaningful with two workers: no single-device reference.
DIST_ONLY = frozenset({"restore_fails_on_one_worker", "load_ensemble_fails_on_one_worker"})

tf = None  # tensorflow, imported in main() after the strategy's cluster is configured
objckpt = None
errors = None


# --- values and digests ------------------------------------------------------------------


def digest(array) -> str:
    array = np.asarray(array)
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:20]


def value_for(path: str, salt: int, shape, dtype):
    """The value a variable at `path` gets for `salt`: multiples of 1/32 in [1/32, 2] for
    float arrays, of 1/64 in [1/64, 1/2] for float scalars (learning rates, Adam's beta
    powers: every piece of state is set, so no history leaks into a scenario), 1..9 for
    integers; None for other dtypes (left alone)."""
    rng = np.random.default_rng(int(hashlib.sha256(f"{salt}:{path}".encode()).hexdigest()[:12],
                                    16))
    shape, dtype = tuple(shape), tf.as_dtype(dtype)
    if dtype.is_floating:
        if not shape:
            return np.asarray(rng.integers(1, 33) / 64, dtype.as_numpy_dtype)
        return (rng.integers(1, 65, size=shape) / 32).astype(dtype.as_numpy_dtype)
    if dtype.is_integer:
        return rng.integers(1, 10, size=shape).astype(dtype.as_numpy_dtype)
    return None


def is_distributed(variable) -> bool:
    return isinstance(variable, tf.distribute.DistributedValues)


def is_on_read(variable) -> bool:
    return (is_distributed(variable)
            and variable.synchronization == tf.VariableSynchronization.ON_READ)


def components(variable) -> tuple:
    return tuple(variable.values) if is_distributed(variable) else (variable,)


def kind(variable) -> str:
    return (f"{type(variable).__name__}/{variable.synchronization.name}/"
            f"{variable.aggregation.name}")


def state_of(variables, *, uniform: bool = True) -> dict:
    """Digests of each variable's value (a SyncOnRead one's aggregate, a collective under
    the strategy: every worker calls this in the same order) and of each local replica's
    component. `uniform`: every component must equal the value (the test checks it, across
    both workers); not so for SyncOnRead variables whose replicas were made to differ, nor
    for SUM ones (each replica holds its share)."""
    values, replicas = {}, {}
    for path, variable in variables.items():
        values[path] = digest(variable.read_value().numpy())
        if not (is_on_read(variable) and variable.aggregation == tf.VariableAggregation.SUM):
            replicas[path] = [digest(c.numpy()) for c in components(variable)]
    return {"values": values, "replicas": replicas, "uniform": uniform}


def seed(obj, salt: int) -> None:
    """Gives every variable of obj's tree its value for `salt` (in cross-replica context: a
    mirrored variable's every replica, a MEAN SyncOnRead variable's every replica)."""
    for path, variable in objckpt.tree(obj).items():
        value = value_for(path, salt, variable.shape, variable.dtype)
        if value is not None:
            variable.assign(value)


def changed(before: dict, after: dict) -> list:
    """Paths whose value or replica digests differ between two `state_of`s."""
    return sorted(p for p in before["values"]
                  if before["values"][p] != after["values"].get(p)
                  or before["replicas"].get(p) != after["replicas"].get(p))


def expect_raise(error_type, fn, what: str):
    try:
        fn()
    except error_type as err:
        return err
    raise AssertionError(f"{what}: expected {error_type.__name__}, nothing was raised")


# --- models per flavour --------------------------------------------------------------


class Kit:
    """Builds the flavour's objs and runs its training step, under a context's strategy."""

    def __init__(self, flavour: str):
        self.flavour = flavour
        self.keras = None
        if flavour != "module":
            self.keras = importlib.import_module("tf_keras" if flavour == "tf_keras" else "keras")
            major = self.keras.__version__.split(".")[0]
            wanted = {"keras3": "3", "keras2": "2", "tf_keras": "2"}[flavour]
            if major != wanted:
                raise SystemExit(f"flavour {flavour} needs Keras {wanted}, found "
                                 f"{self.keras.__version__}")
        rng = np.random.default_rng(7)
        self.images = (rng.integers(-32, 33, size=(8, 6, 6, 3)) / 32).astype("float32")
        self.tokens = rng.integers(0, 10, size=(8, 4)).astype("int32")
        self.x = (rng.integers(-32, 33, size=(8, 3)) / 32).astype("float32")
        # paths that are MEAN SyncOnRead variables under the strategy (tf_keras and Keras 2
        # BatchNormalization statistics), found by the first obj built under it
        self.on_read_mean = None

    # objs: `obj` is what is checkpointed (a compiled Keras model, whose optimizer is in
    # its tree; a tf.train.Checkpoint(model=..., optimizer=...) for modules)

    def build(self, lazy: bool = False):
        """A new obj of the flavour in the current scope; `lazy`: not built yet (its
        variables are created by `call_lazy`)."""
        if self.keras is None:
            import flavours  # after TF: flavours imports tensorflow

            net = lazy_net_class()() if lazy else flavours.ModuleNet()
            if tuple(int(n) for n in tf.__version__.split(".")[:2]) < (2, 16):
                # TF 2.12 leaves TF1 Adam's beta powers out of the object graph under a
                # strategy (tf.train.Checkpoint writes none): TF1 momentum, a slot per variable
                optimizer = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
            else:
                optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
            return tf.train.Checkpoint(model=net, optimizer=optimizer)
        keras, layers = self.keras, self.keras.layers
        if lazy:
            model = keras.Sequential([layers.Dense(4, name="l1"), layers.BatchNormalization(
                name="lbn"), layers.Dense(2, name="l2")], name="lazy")
        else:
            images = keras.Input((6, 6, 3), name="images")
            tokens = keras.Input((4,), dtype="int32", name="tokens")
            x = layers.Conv2D(4, 3, name="conv")(images)
            x = layers.BatchNormalization(name="bn")(x)
            x = layers.Flatten(name="flat")(x)
            e = layers.Flatten(name="flat_e")(layers.Embedding(10, 3, name="embed")(tokens))
            shared = layers.Dense(5, name="shared")
            x = layers.Add(name="add")([shared(layers.Dense(6, name="proj_x")(x)),
                                        shared(layers.Dense(6, name="proj_e")(e))])
            head = keras.Sequential([layers.Dense(4, activation="relu", name="h1"),
                                     layers.Dense(2, name="h2")], name="head")
            model = keras.Model([images, tokens], head(x), name="net")
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
        return model

    def network(self, obj):
        return obj.model if isinstance(obj, tf.train.Checkpoint) else obj

    def optimizer(self, obj):
        return obj.optimizer

    def trainable(self, obj) -> list:
        return [v for v in self.network(obj).trainable_variables
                if tf.as_dtype(v.dtype).is_floating]

    def trainable_paths(self, obj) -> list:
        """The paths in obj's tree of the variables the training step updates."""
        ids = {id(v if isinstance(v, tf.Variable) else v.value) for v in self.trainable(obj)}
        return [p for p, v in objckpt.tree(obj).items() if id(v) in ids]

    def inputs(self, obj, lazy: bool = False):
        if self.keras is None or lazy:
            return self.x
        return [self.images, self.tokens]

    def forward(self, network, x):
        if self.keras is None:
            return network(x)
        return network(x, training=False)

    def plain_reader(self, obj):
        """The tf.train.Checkpoint that reads a prefix saved with obj as its root."""
        return obj if isinstance(obj, tf.train.Checkpoint) else tf.train.Checkpoint(root=obj)

    def freeze_pattern(self) -> str:
        return "encoder" if self.keras is None else "conv"


@functools.cache
def lazy_net_class():
    """A tf.Module whose variables are made on its first call (defined once TF is here)."""

    class Lazy(tf.Module):
        """A dense layer whose variables are made on its first call (as Sonnet's are)."""

        def __init__(self, n_out, name=None):
            super().__init__(name=name)
            self.n_out = n_out
            self.w = None
            self.b = None

        def __call__(self, x):
            if self.w is None:
                n_in = int(x.shape[-1])
                self.w = tf.Variable(tf.zeros((n_in, self.n_out)), name="w")
                self.b = tf.Variable(tf.zeros((self.n_out,)), name="b")
            return tf.matmul(x, self.w) + self.b

    class Net(tf.Module):
        def __init__(self):
            super().__init__(name="lazy_net")
            self.first = Lazy(4)
            self.second = Lazy(2)
            self.step = tf.Variable(0, dtype=tf.int64)

        def __call__(self, x):
            return self.second(tf.nn.relu(self.first(x)))

    return Net


# --- contexts: under the strategy, or the single-device reference ----------------------


class Ctx:
    def __init__(self, kit: Kit, strategy, distributed: bool, root: str, task: int):
        self.kit = kit
        self.strategy = strategy
        self.distributed = distributed
        self.root = root
        self.task = task
        self.is_chief = (not distributed) or strategy.extended.should_checkpoint
        self._main = None
        self._steps = {}
        self.tag = 0

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def dir(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    def barrier(self) -> None:
        """All workers meet here; fails if they are not at the same scenario."""
        if not self.distributed:
            return
        self.tag += 1
        tag = float(self.tag)
        per_replica = self.strategy.run(lambda: tf.constant([tag, tag * tag], tf.float64))
        total, squares = self.strategy.reduce("SUM", per_replica, axis=None).numpy()
        n = self.replicas
        if total != n * tag or squares != n * tag * tag:  # every worker at this barrier
            raise AssertionError(f"workers out of step: at barrier {tag:g} the others were at "
                                 f"barriers averaging {total / n:g}")

    def plain(self) -> Ctx:
        """A context without a strategy in this process (for objs on one device)."""
        return Ctx(self.kit, tf.distribute.get_strategy(), False, self.root, self.task)

    def build(self, salt: int | None = None, *, lazy: bool = False):
        """A new obj under this context's strategy: built, its optimizer's slots made by a
        zero-gradient step, and (with a salt) seeded."""
        with self.strategy.scope():
            obj = self.kit.build(lazy=lazy)
        if not lazy:
            self.warm(obj)
            if salt is not None:
                seed(obj, salt)
        return obj

    def main(self, salt: int):
        """The context's reusable obj (its step traced once), seeded with `salt`."""
        if self._main is None:
            self._main = self.build()
            if self.distributed and self.kit.on_read_mean is None:
                self.kit.on_read_mean = frozenset(
                    p for p, v in objckpt.tree(self._main).items()
                    if is_on_read(v) and v.aggregation == tf.VariableAggregation.MEAN)
        seed(self._main, salt)
        return self._main

    def warm(self, obj) -> None:
        optimizer = self.kit.optimizer(obj)
        if self.kit.flavour == "keras3":  # Keras 3 builds its optimizer outside tf.function
            with self.strategy.scope():
                optimizer.build(self.kit.trainable(obj))
        self.step(obj, scale=0.0)

    def step(self, obj, *, scale: float = 1.0, apply=None, after=None) -> None:
        """One training step inside `strategy.run`: fixed gradients (times `scale`), split
        1/4 + 3/4 over two replicas, whole on one; `apply(optimizer, grads_and_vars)`
        applies them (the optimizer's apply_gradients by default); `after()` runs in the
        same replica function after the update."""
        key = (id(obj), apply, after)
        fn = self._steps.get(key)
        if fn is None:
            fn = self._steps[key] = (obj, self._make_step(obj, apply, after))
        fn[1](tf.constant(scale, tf.float32))

    def _make_step(self, obj, apply, after):
        variables = self.kit.trainable(obj)
        optimizer = self.kit.optimizer(obj)
        grads = [value_for(f"grad/{i}", 99, v.shape, v.dtype) for i, v in enumerate(variables)]
        shares = [1.0] if self.replicas == 1 else [0.25, 0.75]
        assert len(shares) == self.replicas, f"{self.replicas} replicas"
        apply = apply or (lambda opt, pairs: opt.apply_gradients(pairs))

        @tf.function
        def step(scale):
            def replica_fn():
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                share = tf.gather(tf.constant(shares), replica) * scale
                apply(optimizer, [(tf.constant(g) * share, v) for g, v in zip(grads, variables)])
                if after is not None:
                    after()
            self.strategy.run(replica_fn)

        return step

    def diverge(self, obj) -> None:
        """Makes the replicas of MEAN SyncOnRead variables (tf_keras and Keras 2
        BatchNormalization statistics) differ: replica r adds r; their mean is +0.5.
        The reference adds 0.5: the same aggregate, the value saved and snapshotted."""
        if not self.distributed:
            if self.kit.on_read_mean is None:
                raise AssertionError("the run under the strategy did not get as far as "
                                     "building its obj: which variables are SyncOnRead?")
            for path, v in objckpt.tree(obj).items():
                if path in self.kit.on_read_mean:
                    v.assign(v + 0.5)
            return
        targets = [v for v in objckpt.tree(obj).values()
                   if is_on_read(v) and v.aggregation == tf.VariableAggregation.MEAN]
        if not targets:
            return

        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for v in targets:
                v.assign(v + tf.cast(replica, v.dtype))

        self.strategy.run(tf.function(replica_fn))


# --- scenarios -----------------------------------------------------------------------
# Each takes a Ctx and returns (states, facts). It asserts what one worker can check.


def sc_tree(ctx):
    obj = ctx.main(1)
    tree = objckpt.tree(obj)
    kinds = {p: kind(v) for p, v in tree.items()}
    if ctx.distributed:
        plain = [p for p, v in tree.items() if not is_distributed(v)]
        assert not plain, f"not distributed under the strategy: {plain}"
        for path, variable in tree.items():
            devices = [c.device for c in components(variable)]
            assert len(devices) == 1 and f"task:{ctx.task}" in devices[0], (path, devices)
    else:
        kinds = {}
    # the tree's key set is the one tf.train.Checkpoint writes (save_counter aside)
    prefix = os.path.join(ctx.dir("tree"), "plain")
    if ctx.is_chief:  # by plain TF, from an obj on one device, by one process
        ctx.kit.plain_reader(ctx.plain().build()).write(prefix)
    ctx.barrier()
    written = sorted(name.split("/.ATTRIBUTES/")[0] for name, _ in tf.train.list_variables(prefix)
                     if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
                     and not name.startswith("save_counter/"))
    assert written == sorted(tree), (
        f"tree keys {sorted(set(tree) ^ set(written))} differ from tf.train.Checkpoint's")
    return {"seeded": state_of(tree)}, {"paths": list(tree), "kinds": kinds,
                                        "checkpoint_paths": written}


def sc_snapshot(ctx):
    obj = ctx.main(2)
    ctx.diverge(obj)
    snap = objckpt.snapshot(obj)
    taken = {p: digest(np.asarray(t)) for p, t in snap.items()}
    assert list(snap) == list(objckpt.tree(obj)), "snapshot keys differ from the tree's"
    ctx.step(obj)
    after = {p: digest(np.asarray(t)) for p, t in snap.items()}
    moved = [p for p in taken if taken[p] != after[p]]
    assert not moved, f"the snapshot changed when the model trained on: {moved}"
    trained = state_of(objckpt.tree(obj), uniform=False)  # SyncOnRead replicas still differ
    assert trained["values"] != taken, "the training step changed nothing"
    return {"snapshot": {"values": taken, "replicas": {}, "uniform": True},
            "trained": trained}, {"keys": list(snap)}


def sc_restore_snapshot(ctx):
    obj = ctx.main(3)
    ctx.diverge(obj)
    snap = objckpt.snapshot(obj)
    taken = {p: digest(np.asarray(t)) for p, t in snap.items()}
    ctx.step(obj)
    seed(obj, 4)
    report = objckpt.restore(obj, snap)
    restored = state_of(objckpt.tree(obj))
    assert restored["values"] == taken, "restore(Snapshot) did not give the snapshot's values"
    assert set(report.restored) == set(taken), "report.restored is not every path"
    # into another obj of the same structure (a planned restore), and from host copies
    other = ctx.build(5)
    objckpt.restore(other, snap)
    into_other = state_of(objckpt.tree(other))
    seed(other, 6)
    objckpt.restore(other, objckpt.Snapshot(snap.numpy()))
    from_numpy = state_of(objckpt.tree(other))
    # a restore trains on: the same step from the same state on both sides
    ctx.step(obj)
    return {"restored": restored, "into_other": into_other, "from_numpy": from_numpy,
            "trained_after": state_of(objckpt.tree(obj))}, {}


def _listing(directory: str) -> list:
    return sorted(os.listdir(directory))


def sc_save(ctx):
    obj = ctx.main(7)
    ctx.diverge(obj)
    expected = {p: digest(np.asarray(t)) for p, t in objckpt.snapshot(obj).items()}
    directory = ctx.dir("save")
    prefix = os.path.join(directory, "ckpt")
    returned = objckpt.save(obj, prefix)
    assert os.fspath(returned) == prefix, f"save returned {returned!r}, not {prefix!r}"
    snap_dir = ctx.dir("save_snapshot")
    objckpt.save(objckpt.snapshot(obj), os.path.join(snap_dir, "ckpt"))
    # who writes: each worker names its own prefix; only the chief's may appear. An obj, a
    # Snapshot of it, and a Snapshot of arrays saved in the strategy's scope (it has no
    # variables to say which strategy it belongs to).
    who = ctx.dir("save_who")
    objckpt.save(obj, os.path.join(who, f"obj_task{ctx.task}"))
    objckpt.save(objckpt.snapshot(obj), os.path.join(who, f"snapshot_task{ctx.task}"))
    with ctx.strategy.scope():
        objckpt.save(objckpt.Snapshot(objckpt.snapshot(obj).numpy()),
                     os.path.join(who, f"arrays_task{ctx.task}"))
    ctx.barrier()  # the chief has written them all
    listing, snap_listing, who_listing = _listing(directory), _listing(snap_dir), _listing(who)
    states = {}
    for label, where in (("plain_tf_read", prefix),
                         ("plain_tf_read_of_snapshot", os.path.join(snap_dir, "ckpt"))):
        # a plain tf.train.Checkpoint reads it, into an obj on one device...
        plain = ctx.plain().build(8)
        ctx.kit.plain_reader(plain).read(where).assert_existing_objects_matched()
        states[label] = state_of(objckpt.tree(plain))
        assert states[label]["values"] == expected, f"{label}: values differ from the saved obj"
    # ...and into one under the strategy, every replica
    other = ctx.build(9)
    ctx.kit.plain_reader(other).read(prefix).assert_existing_objects_matched()
    states["plain_tf_read_under_strategy"] = state_of(objckpt.tree(other))
    assert states["plain_tf_read_under_strategy"]["values"] == expected
    ctx.barrier()  # nobody reads any more: the next scenario may write
    return states, {"listing": listing, "snapshot_listing": snap_listing,
                    "who_listing": who_listing}


def sc_restore_prefix(ctx):
    directory = ctx.dir("restore_prefix")
    prefix = os.path.join(directory, "plain")
    source = ctx.plain().build(10)
    if ctx.is_chief:  # written by plain TF, by one process
        ctx.kit.plain_reader(source).write(prefix)
    expected = state_of(objckpt.tree(source))["values"]
    ctx.barrier()
    obj = ctx.main(11)
    report = objckpt.restore(obj, prefix)
    restored = state_of(objckpt.tree(obj))
    assert restored["values"] == expected, "restore(prefix) did not give the prefix's values"
    assert not report.missing and not report.unexpected, str(report)
    # the directory, through TF's checkpoint state file
    if ctx.is_chief:
        tf.train.CheckpointManager(ctx.kit.plain_reader(source), os.path.join(directory, "dir"),
                                   max_to_keep=1).save()
    ctx.barrier()
    seed(obj, 12)
    objckpt.restore(obj, os.path.join(directory, "dir"))
    from_directory = state_of(objckpt.tree(obj))
    assert from_directory["values"] == expected, "restore(directory) did not give its values"
    ctx.step(obj)
    ctx.barrier()
    return {"restored": restored, "from_directory": from_directory,
            "trained_after": state_of(objckpt.tree(obj))}, {}


def _mapping(obj, salt: int, *, bad: bool) -> dict:
    """Values for every path of obj's tree (salt); `bad`: the last float array's value has
    one element too many."""
    tree = objckpt.tree(obj)
    values = {}
    for path, variable in tree.items():
        value = value_for(path, salt, variable.shape, variable.dtype)
        values[path] = value if value is not None else variable.read_value().numpy()
    if bad:
        victim = [p for p, v in tree.items() if v.dtype.is_floating and v.shape.rank][-1]
        values[victim] = np.concatenate([values[victim].ravel(), values[victim].ravel()[:1]])
    return values


def sc_restore_fails(ctx):
    obj = ctx.main(13)
    ctx.diverge(obj)
    before = state_of(objckpt.tree(obj), uniform=False)
    raised = {}
    # a Snapshot with one value of the wrong shape
    bad = objckpt.Snapshot(_mapping(obj, 14, bad=True))
    err = expect_raise(errors.StructureMismatchError, lambda: objckpt.restore(obj, bad),
                       "restore(Snapshot with a wrong shape)")
    raised["snapshot"] = type(err).__name__
    # the same as a prefix, written by the chief
    directory = ctx.dir("restore_fails")
    prefix = os.path.join(directory, "bad")
    with ctx.strategy.scope():  # a Snapshot of arrays: the chief writes it
        objckpt.save(bad, prefix)
    good = os.path.join(directory, "good")
    source = ctx.plain().build(15)
    if ctx.is_chief:
        # a checkpoint whose data file ends early: its metadata is fine
        ctx.kit.plain_reader(source).write(good)
        truncated = os.path.join(directory, "truncated")
        for suffix in (".index", ".data-00000-of-00001"):
            shutil.copyfile(good + suffix, truncated + suffix)
        with open(truncated + ".data-00000-of-00001", "r+b") as f:
            f.truncate(os.path.getsize(truncated + ".data-00000-of-00001") // 2)
    ctx.barrier()
    err = expect_raise(errors.StructureMismatchError, lambda: objckpt.restore(obj, prefix),
                       "restore(prefix with a wrong shape)")
    raised["prefix"] = type(err).__name__
    err = expect_raise(errors.ObjckptError,
                       lambda: objckpt.restore(obj, os.path.join(directory, "truncated")),
                       "restore(prefix with a truncated data file)")
    raised["truncated"] = type(err).__name__
    err = expect_raise(errors.ObjckptError,
                       lambda: objckpt.restore(obj, os.path.join(directory, "missing")),
                       "restore(missing prefix)")
    raised["missing"] = type(err).__name__
    after = state_of(objckpt.tree(obj), uniform=False)
    moved = changed(before, after)
    assert not moved, f"a failed restore changed {moved}"
    ctx.barrier()
    return {"unchanged": after}, {"raised": raised}


def _walk_variables(obj, limit: int = 50000) -> list:
    """Every distributed variable reachable from obj's attributes (compiled metrics'
    SyncOnRead variables included): what a clone must re-create under the strategy."""
    seen, found, queue = set(), [], [obj]
    while queue and len(seen) < limit:
        node = queue.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, tf.Variable):
            if is_distributed(node):
                found.append(node)
            continue
        if node is None or isinstance(node, (str, bytes, int, float, type, np.ndarray)):
            continue
        module = type(node).__module__
        if module.startswith(("tensorflow.python.distribute", "tensorflow.python.eager",
                              "tensorflow.python.framework")):
            continue  # strategies (shared with the original), functions, graphs
        if isinstance(node, dict):
            queue.extend(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            queue.extend(node)
        else:
            attributes = getattr(node, "__dict__", None)
            if isinstance(attributes, dict):
                queue.extend(attributes.values())
    return found


def sc_clone(ctx):
    obj = ctx.main(16)
    ctx.step(obj)
    copy = objckpt.clone(obj)
    original_tree, copy_tree = objckpt.tree(obj), objckpt.tree(copy)
    assert list(copy_tree) == list(original_tree), "clone's tree has other paths"
    problems = []
    for path, variable in original_tree.items():
        c = copy_tree[path]
        if c is variable or any(a is b for a in components(c) for b in components(variable)):
            problems.append(f"{path}: shares a variable with the original")
        if is_distributed(variable) and kind(c) != kind(variable):
            problems.append(f"{path}: {kind(c)} in the clone, {kind(variable)} in the original")
        if is_distributed(c) != is_distributed(variable):
            problems.append(f"{path}: {type(c).__name__} in the clone, "
                            f"{type(variable).__name__} in the original")
        if [x.device for x in components(c)] != [x.device for x in components(variable)]:
            problems.append(f"{path}: replicas on {[x.device for x in components(c)]}")
    # every distributed variable reachable from the objs (compiled metrics hold SyncOnRead
    # ones): as many of each kind in the clone, none of them shared
    walked_original, walked_copy = _walk_variables(obj), _walk_variables(copy)
    kinds_original = collections.Counter(map(kind, walked_original))
    kinds_copy = collections.Counter(map(kind, walked_copy))
    if kinds_copy != kinds_original:
        problems.append(f"distributed variables reachable from the original: "
                        f"{dict(kinds_original)}; from the clone: {dict(kinds_copy)}")
    shared = {id(v) for v in walked_original} & {id(v) for v in walked_copy}
    if shared:
        problems.append(f"{len(shared)} distributed variables shared with the original")
    assert not problems, "clone:\n" + "\n".join(problems[:30])
    states = {"copied": state_of(copy_tree)}
    assert states["copied"]["values"] == state_of(original_tree)["values"]
    x = ctx.kit.inputs(obj)
    states["outputs"] = _outputs(ctx.kit.forward(ctx.kit.network(copy), x))
    ctx.step(obj)  # the original trains: the clone stays
    assert state_of(copy_tree)["values"] == states["copied"]["values"], "the clone moved"
    ctx.step(copy)  # the clone trains under the strategy, from the same state: the same result
    states["clone_trained"] = state_of(copy_tree)
    states["original_trained"] = state_of(original_tree)
    assert states["clone_trained"]["values"] == states["original_trained"]["values"], (
        "the clone trained from the same state differs from the original")
    on_read = sorted(kind(v) for v in walked_copy if is_on_read(v))
    return states, {"walked_on_read": on_read}


def _outputs(tensor) -> dict:
    return {"values": {"outputs": digest(np.asarray(tensor))}, "replicas": {}, "uniform": True}


def _pairs_state(twins, side: int) -> dict:
    return state_of({p: pair[side] for p, pair in twins.variables().items()})


def _seed_twins(obj, twins, salt: int) -> None:
    """Current (and its optimizer) and past get values of their own for `salt`: each
    operation starts from a known state, whatever the one before gave."""
    seed(obj, salt)
    for path, (_, past) in twins.variables().items():
        value = value_for(f"past/{path}", salt, past.shape, past.dtype)
        if value is not None:
            past.assign(value)


def _check_swapped(twins, before_current: dict, before_past: dict, states: dict, where: str):
    states[f"swap_current{where}"] = _pairs_state(twins, 0)
    states[f"swap_past{where}"] = _pairs_state(twins, 1)
    assert states[f"swap_current{where}"]["values"] == before_past["values"], (
        "swap(): current is not what past was")
    assert states[f"swap_past{where}"]["values"] == before_current["values"], (
        "swap(): past is not what current was")


def _twins_of(ctx, salt: int):
    obj = ctx.main(salt)
    twins = objckpt.Twins(ctx.kit.network(obj))
    kinds = {p: (kind(c), kind(q)) for p, (c, q) in twins.variables().items()}
    mismatched = [p for p, (a, b) in kinds.items() if a != b]
    assert not mismatched, f"past is not distributed like current: {mismatched}"
    return obj, twins


def sc_twins(ctx):
    """Twins sync / sync(tau) / swap outside strategy.run (eagerly and in a tf.function)."""
    obj, twins = _twins_of(ctx, 17)
    states = {}
    _seed_twins(obj, twins, 30)
    ctx.step(obj)
    twins.sync()
    states["sync_past"] = _pairs_state(twins, 1)
    assert states["sync_past"]["values"] == _pairs_state(twins, 0)["values"], "sync() != current"
    states["past_outputs"] = _outputs(ctx.kit.forward(twins.past, ctx.kit.inputs(obj)))
    _seed_twins(obj, twins, 31)
    twins.sync(0.25)
    states["polyak_past"] = _pairs_state(twins, 1)
    _seed_twins(obj, twins, 32)
    before = _pairs_state(twins, 0), _pairs_state(twins, 1)
    twins.swap()
    _check_swapped(twins, *before, states, "")
    _seed_twins(obj, twins, 33)
    tf.function(lambda: twins.sync(0.5))()
    states["polyak_in_function"] = _pairs_state(twins, 1)
    _seed_twins(obj, twins, 34)
    before = _pairs_state(twins, 0), _pairs_state(twins, 1)
    tf.function(lambda: twins.swap())()
    _check_swapped(twins, *before, states, "_in_function")
    tf.function(lambda: twins.sync(tf.constant(1.0)))()
    states["tensor_tau_one"] = _pairs_state(twins, 1)
    assert states["tensor_tau_one"]["values"] == _pairs_state(twins, 0)["values"], (
        "sync(tensor 1.0) != current")
    return states, {}


def sc_twins_in_run(ctx):
    """Twins sync / sync(tau) / swap inside strategy.run, alone and after the update."""
    obj, twins = _twins_of(ctx, 18)
    strategy = ctx.strategy
    states = {}

    @tf.function
    def in_run(kind_, tau):
        def replica_fn():
            if kind_ == "swap":
                twins.swap()
            else:
                twins.sync(tau)
        strategy.run(replica_fn)

    _seed_twins(obj, twins, 35)
    in_run("sync", 1.0)
    states["sync_past"] = _pairs_state(twins, 1)
    assert states["sync_past"]["values"] == _pairs_state(twins, 0)["values"], "sync() != current"
    _seed_twins(obj, twins, 36)
    in_run("sync", 0.25)
    states["polyak_past"] = _pairs_state(twins, 1)
    _seed_twins(obj, twins, 37)
    before = _pairs_state(twins, 0), _pairs_state(twins, 1)
    in_run("swap", None)
    _check_swapped(twins, *before, states, "")
    # the RL step: update, then copy / blend into the target, in one replica function
    _seed_twins(obj, twins, 38)
    ctx.step(obj, after=lambda: twins.sync())
    states["train_then_sync_current"] = _pairs_state(twins, 0)
    states["train_then_sync_past"] = _pairs_state(twins, 1)
    assert states["train_then_sync_past"]["values"] == states["train_then_sync_current"][
        "values"], "sync() after the update in one replica function != the updated current"
    _seed_twins(obj, twins, 39)
    ctx.step(obj, after=lambda: twins.sync(0.5))
    states["train_then_polyak_current"] = _pairs_state(twins, 0)
    states["train_then_polyak_past"] = _pairs_state(twins, 1)
    return states, {}


def sc_freezer(ctx):
    obj = ctx.main(19)
    model = ctx.kit.network(obj)
    freezer = objckpt.Freezer(model)
    frozen = freezer.freeze(ctx.kit.freeze_pattern())
    assert frozen, "nothing frozen"
    apply = freezer.apply_gradients
    tree = objckpt.tree(obj)
    frozen_ids = {id(objckpt.tree(model)[p]) for p in frozen}
    frozen_variables = [p for p, v in tree.items() if id(v) in frozen_ids]
    assert len(frozen_variables) == len(frozen), (frozen, frozen_variables)
    # with their optimizer state, where a path says whose it is
    frozen_tree = [p for p in tree if any(p == f or p.startswith(f + "/.OPTIMIZER_SLOT/")
                                          for f in frozen_variables)]
    before = state_of(tree)
    ctx.step(obj, apply=apply)
    first = state_of(tree)
    moved = [p for p in frozen_tree if first["values"][p] != before["values"][p]]
    assert not moved, f"frozen variables (or their optimizer state) moved: {moved}"
    trained = [p for p in ctx.kit.trainable_paths(obj) if p not in frozen_tree]
    still = [p for p in trained if first["values"][p] == before["values"][p]]
    assert not still, f"unfrozen variables did not train: {still}"
    traces = freezer.traces
    freezer.unfreeze(ctx.kit.freeze_pattern())
    ctx.step(obj, apply=apply)
    second = state_of(tree)
    unmoved = [p for p in frozen_variables if second["values"][p] == first["values"][p]]
    assert not unmoved, f"unfrozen variables did not train: {unmoved}"
    assert freezer.traces == traces, f"unfreeze retraced ({traces} -> {freezer.traces})"
    return {"frozen_step": first, "unfrozen_step": second}, {"frozen": list(frozen),
                                                            "traces": freezer.traces}


def sc_load_ensemble(ctx):
    obj = ctx.main(20)
    network = ctx.kit.network(obj)
    directory = ctx.dir("load_ensemble")
    prefixes, expected = [], []
    for salt in (21, 22):  # two sources: the network saved with two sets of values
        seed(obj, salt)
        expected.append(state_of(objckpt.tree(network))["values"])
        prefixes.append(objckpt.save(network, os.path.join(directory, f"member{salt}")))
    ctx.barrier()
    template = ctx.kit.network(ctx.build(23))
    template_values = state_of(objckpt.tree(template))["values"]
    ensemble = objckpt.load_ensemble(template, prefixes)
    states = {}
    template_tree = objckpt.tree(template)
    for i, member in enumerate(ensemble.members):
        member_tree = objckpt.tree(member)
        # the network's variables: optimizer state (in a Keras model's tree) is not loaded
        states[f"member{i}"] = state_of({p: v for p, v in member_tree.items()
                                         if not _is_optimizer_path(p)})
        got = states[f"member{i}"]["values"]
        wrong = [p for p in got if got[p] != expected[i][p]]
        assert not wrong, f"member {i} differs from its source at {wrong}"
        wrong = [p for p in member_tree if is_distributed(template_tree[p])
                 and kind(member_tree[p]) != kind(template_tree[p])]
        assert not wrong, f"member {i} is not distributed like the template: {wrong}"
    assert state_of(template_tree)["values"] == template_values, "the template changed"
    states["outputs"] = _outputs(ensemble(ctx.kit.inputs(obj)))
    states["mean"] = _outputs(ensemble.mean(ctx.kit.inputs(obj)))
    ctx.barrier()
    return states, {"members": len(ensemble.members)}


def _is_optimizer_path(path: str) -> bool:
    return path.startswith("optimizer/") or "/.OPTIMIZER_SLOT/" in path


def sc_restore_on_create(ctx):
    directory = ctx.dir("restore_on_create")
    source = ctx.build(lazy=True)
    _call_lazy(ctx, source)
    ctx.warm(source)
    seed(source, 24)
    expected = state_of(objckpt.tree(source))["values"]
    prefix = objckpt.save(source, os.path.join(directory, "ckpt"))
    ctx.barrier()
    obj = ctx.build(lazy=True)
    pending = objckpt.restore_on_create(obj, prefix)
    assert not pending.done, "nothing to wait for in an unbuilt obj"
    _call_lazy(ctx, obj)  # the network's variables are made, under the strategy
    built = state_of({p: v for p, v in objckpt.tree(obj).items()})
    network_paths = [p for p in built["values"] if p in expected]
    wrong = [p for p in network_paths if built["values"][p] != expected[p]]
    assert not wrong, f"created variables did not get their values: {wrong}"
    ctx.warm(obj)  # the optimizer's slots are made (and restored) by its first step
    pending.assert_done()
    tree = objckpt.tree(obj)
    assert list(tree) == list(expected), "the restored obj has other paths"
    if ctx.distributed:
        plain = [p for p, v in tree.items() if not is_distributed(v)]
        assert not plain, f"not distributed: {plain}"
    after_warm = state_of(tree)
    ctx.step(obj)
    return {"built": built, "after_first_step": after_warm,
            "trained": state_of(tree)}, {}


def _call_lazy(ctx, obj):
    with ctx.strategy.scope():
        ctx.kit.forward(ctx.kit.network(obj), ctx.kit.x)


def sc_plan_migrate(ctx):
    directory = ctx.dir("plan_migrate")
    source_prefix = os.path.join(directory, "old")
    source = ctx.plain().build(25)
    if ctx.is_chief:  # another root: tf.train.Checkpoint(old=obj)
        tf.train.Checkpoint(old=source).write(source_prefix)
    expected = state_of(objckpt.tree(source))["values"]
    ctx.barrier()
    obj = ctx.main(26)
    before = state_of(objckpt.tree(obj))
    the_plan = objckpt.plan(obj, source_prefix, at="old")
    assert not the_plan.unmatched_variables and not the_plan.unmatched_source, (
        the_plan.describe())
    out = objckpt.migrate(obj, source_prefix, os.path.join(directory, "new"), at="old",
                          optimizer_state=True)
    assert state_of(objckpt.tree(obj)) == before, "migrate changed obj"
    # who writes: each worker names its own prefix; the chief's alone may appear, as for save
    who = ctx.dir("migrate_who")
    objckpt.migrate(obj, source_prefix, os.path.join(who, f"task{ctx.task}"), at="old",
                    optimizer_state=True)
    ctx.barrier()
    listing, who_listing = _listing(directory), _listing(who)
    objckpt.restore(obj, out)
    restored = state_of(objckpt.tree(obj))
    assert restored["values"] == expected, "restore(migrated) differs from the source"
    ctx.barrier()
    return {"restored": restored}, {"matches": len(the_plan.matches), "listing": listing,
                                    "who_listing": who_listing}


def sc_restore_fails_on_one_worker(ctx):
    """Worker 1's source is bad, worker 0's good: no worker may change anything."""
    obj = ctx.main(27)
    before = state_of(objckpt.tree(obj))
    good = objckpt.Snapshot(_mapping(obj, 28, bad=False))
    directory = ctx.dir("restore_fails_on_one_worker")
    with ctx.strategy.scope():  # a Snapshot of arrays: the chief writes it
        prefix = objckpt.save(good, os.path.join(directory, "good"))
    ctx.barrier()
    sources = {  # what worker 0 restores from, and worker 1
        "wrong shape": (good, objckpt.Snapshot(_mapping(obj, 28, bad=True))),
        "missing prefix": (prefix, os.path.join(directory, "missing")),
    }
    raised = {}
    for case, per_worker in sources.items():
        try:
            objckpt.restore(obj, per_worker[ctx.task])
            raised[case] = None
        except errors.ObjckptError as err:
            raised[case] = type(err).__name__
        after = state_of(objckpt.tree(obj))
        moved = changed(before, after)
        assert not moved, (f"{case}: worker {ctx.task} changed {len(moved)} variables although "
                           f"the restore failed on worker 1 (e.g. {moved[:3]})")
        assert raised[case], (f"{case}: worker {ctx.task}'s restore returned although worker "
                              "1's failed")
    ctx.barrier()
    return {"unchanged": after}, {"raised": raised}


def sc_load_ensemble_fails_on_one_worker(ctx):
    """Worker 1 lacks one member's source: every worker raises its error, none creates a
    member (creating variables under the strategy is a collective: a worker that went on
    alone would wait for the other)."""
    obj = ctx.main(29)
    network = ctx.kit.network(obj)
    directory = ctx.dir("load_ensemble_fails_on_one_worker")
    good = objckpt.save(network, os.path.join(directory, "good"))
    ctx.barrier()
    sources = [good, good if ctx.task == 0 else os.path.join(directory, "missing")]
    started = time.monotonic()
    try:
        objckpt.load_ensemble(network, sources)
        raised = None
    except errors.ObjckptError as err:
        raised = type(err).__name__
    seconds = time.monotonic() - started
    assert raised, f"worker {ctx.task}: load_ensemble returned although worker 1's failed"
    ctx.barrier()
    return {}, {"raised": raised, "quick": seconds < 10}


SCENARIO_FUNCTIONS = {name: globals()[f"sc_{name}"] for name in SCENARIOS}


# --- the worker ----------------------------------------------------------------------


def main(argv=None) -> None:
    global tf, objckpt, errors
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavour", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    parser.add_argument("--deadline", type=float, default=240.0)
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    started = time.monotonic()

    import tensorflow

    tf = tensorflow
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=args.collective_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    task = strategy.cluster_resolver.task_id
    import objckpt as objckpt_module
    from objckpt import errors as errors_module

    objckpt, errors = objckpt_module, errors_module

    def report(record):
        with open(args.out, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    kit = Kit(args.flavour)
    report({"scenario": "__start__", "task": task, "seconds": time.monotonic() - started,
            "replicas": strategy.num_replicas_in_sync, "tf": tf.__version__})
    names = [n for n in SCENARIOS if not args.only or n in args.only.split(",")]
    dist = Ctx(kit, strategy, True, os.path.join(args.dir, "dist"), task)
    for name in names:
        report(run_one(dist, name))
        try:
            dist.barrier()
        except Exception as err:  # reported; the next scenarios will say more
            report({"scenario": "__barrier__", "after": name, "task": task,
                    "error": f"{type(err).__name__}: {err}"})
    # the single-device reference, each scenario on one worker, no collectives
    ref = Ctx(kit, tf.distribute.get_strategy(), False, os.path.join(args.dir, f"ref{task}"),
              task)
    for i, name in enumerate(names):
        if i % 2 == task and name not in DIST_ONLY:
            report(run_one(ref, name))
    report({"scenario": "__done__", "task": task, "seconds": time.monotonic() - started})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no wait for the collective runtime's threads


def run_one(ctx: Ctx, name: str) -> dict:
    record = {"scenario": name, "mode": "dist" if ctx.distributed else "ref", "task": ctx.task,
              "ok": False, "error": None, "states": {}, "facts": {}}
    started = time.monotonic()
    try:
        states, facts = SCENARIO_FUNCTIONS[name](ctx)
        record.update(ok=True, states=states, facts=facts)
    except Exception as err:  # reported, not raised
        record["error"] = (f"{type(err).__name__}: {err}\n"
                           + "".join(traceback.format_exception(err)[-8:]))
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


if __name__ == "__main__":
    main()
