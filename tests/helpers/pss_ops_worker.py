"""Runs `Freezer`, `load_ensemble` and `objckpt.average` on an in-process ParameterServerStrategy
cluster (2 workers and 2 parameter servers on local ports, this process the coordinator;
`pss_worker.start_cluster`) with a tf_keras (or Keras 2) embedding model whose variables are
sharded, and prints the results as one JSON line for tests/distributed/test_sharded_ops.py.

    python tests/helpers/pss_ops_worker.py FOLDER [tf_keras | keras2 | keras3]
    python tests/helpers/pss_ops_worker.py FOLDER (tf_keras | keras2) fit-freezer

Keras 3 cannot train with sharded variables: its run selects, loads and averages them
(`keras3_main`).

The oracles are TF's: `tf.train.Checkpoint` of the live objects read back by TF's reader, TF's
own restore into a fresh model, and NumPy on the values TF reads.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import pss_worker as base  # the cluster, the model and its ClusterCoordinator loop

tf = base.tf

import objckpt  # noqa: E402
from objckpt import _compat, errors  # noqa: E402

EMBED = "model/layer_with_weights-0/embeddings"


def frozen_loop(strategy, model, opt, freezer):
    """`run(steps, seed)`: `base.train`'s loop with the update through
    `freezer.apply_gradients`, one traced step for every run."""
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            freezer.apply_gradients(opt, zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica, args=(x, y))

    def run(steps: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            x = rng.integers(0, base.ROWS, (8, 3)).astype("int64")
            y = rng.normal(size=(8, 1)).astype("float32")
            coordinator.schedule(step, args=(tf.constant(x), tf.constant(y)))
            coordinator.join()

    return run


def by_shape(values: dict, shape: tuple) -> dict:
    """The entries of `values` (checkpoint key -> array) of `shape`: a variable and its
    optimizer slots (the model's three variables have three shapes)."""
    return {k: v for k, v in values.items() if v.shape == shape}


def moved(a: dict, b: dict) -> bool:
    return bool(a) and all(a[k].tobytes() != b[k].tobytes() for k in a)


def freezer_main(resolver) -> dict:
    strategy = base.strategy_of(resolver, 2)
    model, opt = base.build(strategy, "adam")
    base.train(strategy, model, opt, 1)
    freezer = objckpt.Freezer(model)
    out = {"paths": list(freezer.paths), "names": list(freezer.names)}
    out["frozen"] = list(freezer.freeze("embed/embeddings"))
    before = base.state(model, opt)
    train_frozen = frozen_loop(strategy, model, opt, freezer)
    train_frozen(2)
    after = base.state(model, opt)
    held = by_shape(before, (base.ROWS, base.DIM))  # the table, its Adam m and v
    head = by_shape(before, (base.DIM, 1))  # the head's kernel, its m and v
    out["frozen_entries"] = len(held)
    out["frozen_bit_identical"] = base.same(held, {k: after[k] for k in held})
    out["others_trained"] = moved(head, after)
    freezer.unfreeze()
    train_frozen(1, seed=1)
    out["unfrozen_trained"] = moved(held, base.state(model, opt))
    out["traces"] = freezer.traces
    table = model.get_layer("embed").embeddings
    try:
        freezer.freeze(table.variables[0])
        out["one_shard"] = ""
    except errors.ObjckptError as err:
        out["one_shard"] = f"{type(err).__name__}: {err}"
    out["all_shards"] = list(freezer.freeze(*table.variables))
    return out


def ensemble_main(folder: str, resolver) -> dict:
    """Two trained sharded models' checkpoints loaded into a template of another layout and
    into an unsharded one; TF's restore into fresh models of those layouts is the oracle."""
    sources, runs = [], []
    for seed, shards in ((0, 2), (1, 3)):
        strategy = base.strategy_of(resolver, shards)
        model, opt = base.build(strategy, "adam")
        base.train(strategy, model, opt, 2, seed=seed)
        runs.append(base.weights(model))
        sources.append(tf.train.Checkpoint(model=model).write(
            os.path.join(folder, f"member-{seed}")))
    out = {}
    # With optimizer state: members of a compiled template get their Adam slots (sharded
    # like their variables) by owner; the oracle is TF's checkpoint of each source run.
    states, with_slots = [], []
    for seed, shards in ((0, 2), (1, 3)):
        strategy = base.strategy_of(resolver, shards)
        model, opt = base.build(strategy, "adam")
        base.train(strategy, model, opt, 2, seed=seed)
        states.append(base.state(model, opt))
        with_slots.append(objckpt.save(tf.train.Checkpoint(model=model, optimizer=opt),
                                       os.path.join(folder, f"member-opt-{seed}")))
    template, template_opt = base.build(base.strategy_of(resolver, 3), "adam")
    try:
        ensemble = objckpt.load_ensemble(
            tf.train.Checkpoint(model=template, optimizer=template_opt), with_slots)
        out["with_optimizer"] = {
            "equal_to_runs": all(base.same(base.state(m.model, m.optimizer), state)
                                 for m, state in zip(ensemble.members, states)),
            "rows": [base.shard_rows(m.model) for m in ensemble.members],
        }
    except errors.ObjckptError as err:  # reported: the test decides
        out["with_optimizer"] = {"raised": type(err).__name__, "message": str(err)[:1000]}
    x = tf.constant(np.arange(6, dtype="int64").reshape(2, 3) % base.ROWS)
    for name, shards in (("sharded", 3), ("unsharded", 1)):
        strategy = base.strategy_of(resolver, shards)
        template, _ = base.build(strategy, "adam")
        untouched = base.weights(template)
        holder = tf.train.Checkpoint(model=template)
        ensemble = objckpt.load_ensemble(holder, sources)
        members = [member.model for member in ensemble.members]
        oracle = []
        for prefix in sources:
            fresh, _ = base.build(strategy, "adam")
            tf.train.Checkpoint(model=fresh).read(prefix).expect_partial()
            oracle.append(fresh)
        out[name] = {
            "rows": [base.shard_rows(m) for m in members],
            "equal_to_tf_restore": all(base.same(base.weights(m), base.weights(o))
                                       for m, o in zip(members, oracle)),
            "equal_to_runs": all(base.same(base.weights(m), r) for m, r in zip(members, runs)),
            "outputs_equal": all(np.array_equal(m(x).numpy(), o(x).numpy())
                                 for m, o in zip(members, oracle)),
            "template_untouched": base.same(base.weights(template), untouched),
        }
    return out


def average_main(folder: str, resolver) -> dict:
    """Three checkpoints written by sharded models (1, 2 and 3 shards) averaged into a model
    in 2 shards and into an unsharded one; the oracle is NumPy's mean of the values TF reads."""
    prefixes = []
    for seed, shards in ((0, 1), (1, 2), (2, 3)):
        strategy = base.strategy_of(resolver, shards)
        model, opt = base.build(strategy, "adam")
        base.train(strategy, model, opt, 2, seed=seed)
        prefixes.append(objckpt.save(tf.train.Checkpoint(model=model),
                                     os.path.join(folder, f"avg-{seed}")))
    readers = [tf.train.load_checkpoint(p) for p in prefixes]
    keys = [k for k in readers[0].get_variable_to_shape_map()
            if k.startswith("model/") and "OPTIMIZER" not in k]
    expected = {k.split("/.ATTRIBUTES/")[0]: np.mean(
        [r.get_tensor(k).astype("float64") for r in readers], axis=0) for k in keys}
    out = {}
    for name, shards in (("sharded", 2), ("unsharded", 1)):
        strategy = base.strategy_of(resolver, shards)
        target, _ = base.build(strategy, "adam")
        report = objckpt.average(tf.train.Checkpoint(model=target), prefixes)
        got = base.state(target, None)
        got = {k.split("/.ATTRIBUTES/")[0]: v for k, v in got.items()}
        out[name] = {
            "averaged": sorted(report.averaged),
            "rows": base.shard_rows(target),
            "max_error": max(float(np.abs(got[k] - expected[k]).max()) for k in expected),
            "within_one_ulp": all(bool(np.all(
                np.abs(got[k] - expected[k].astype(got[k].dtype))
                <= np.spacing(np.abs(expected[k].astype(got[k].dtype))))) for k in expected),
        }
    return out


def fit_freezer_main(folder: str, resolver) -> dict:
    """A `Freezer` holding the sharded table under tf_keras (or Keras 2) `model.fit` with
    objckpt's `Checkpointing` (the ClusterCoordinator steps of both workers, one at a time):
    the table and its Adam slots stay bit-identical while the head trains, and the
    checkpoints written meanwhile hold the frozen values; after `unfreeze`, fit trains the
    table again."""
    strategy = base.strategy_of(resolver, 2)
    data = base.fit_data(2)
    model = base.fit_model(strategy)
    base.fit(model, data, [base.Steps(True)], epochs=1)  # the Adam slots made and moved
    freezer = objckpt.Freezer(model)
    out = {"frozen": list(freezer.freeze("embed/embeddings"))}
    before = base.state(model, model.optimizer)
    held = by_shape(before, (base.ROWS, base.DIM))  # the table, its Adam m and v
    head = by_shape(before, (base.DIM, 1))  # the head's kernel, its m and v
    callback = objckpt.callbacks.Checkpointing(os.path.join(folder, "frozen"), verbose=0)
    history = base.fit(model, data, [callback, base.Steps(True)], epochs=2)
    after = base.state(model, model.optimizer)
    out["epochs"] = history.epoch
    out["frozen_entries"] = len(held)
    out["frozen_bit_identical"] = base.same(held, {k: after[k] for k in held})
    out["others_trained"] = moved(head, after)
    out["iterations"] = int(model.optimizer.iterations.numpy())
    out["saved"] = [os.path.basename(p) for p in callback.saved]
    # Checkpointing keys the slots under its own holder: compared by shape, as bytes
    saved = by_shape(base.read_checkpoint(callback.saved[-1]), (base.ROWS, base.DIM))
    out["saved_table_entries"] = len(saved)
    out["saved_table_frozen"] = (sorted(v.tobytes() for v in saved.values())
                                 == sorted(v.tobytes() for v in held.values()))
    freezer.unfreeze()
    base.fit(model, data, [base.Steps(True)], epochs=1)
    out["unfrozen_trained"] = moved(held, base.state(model, model.optimizer))
    out["traces"] = freezer.traces
    return out


def logical(variable) -> np.ndarray:
    """A variable's value, read shard by shard (not by objckpt)."""
    parts = variable.variables if _compat.is_sharded(variable) else [variable]
    return np.concatenate([np.asarray(p.numpy()) for p in parts])


def keras3_main(folder: str, resolver) -> dict:
    """Keras 3 builds sharded variables under ParameterServerStrategy but cannot train with
    them: a Freezer still selects a sharded weight whole; checkpoints of Keras 3 models in 1,
    2 and 3 shards (written by objckpt: TF's saver cannot save them) load into an ensemble
    and average into a model of another layout, against TF's reader and NumPy."""
    model = base.build_keras3(base.strategy_of(resolver, 2))
    freezer = objckpt.Freezer(model)
    table = dict(objckpt.tree(model))
    out = {"paths": list(freezer.paths), "names": list(freezer.names),
           "frozen": list(freezer.freeze(model.get_layer("embed"))),
           "sharded": [p for p, v in table.items() if _compat.is_sharded(v)]}
    prefixes = [objckpt.save(base.build_keras3(base.strategy_of(resolver, shards)),
                             os.path.join(folder, f"k3-{shards}"))
                for shards in (1, 2, 3)]
    readers = [tf.train.load_checkpoint(p) for p in prefixes]
    key = "{}/.ATTRIBUTES/VARIABLE_VALUE".format
    ensemble = objckpt.load_ensemble(base.build_keras3(base.strategy_of(resolver, 3)),
                                     prefixes)
    out["ensemble_equal_to_tf_reader"] = all(
        logical(v).tobytes() == reader.get_tensor(key(path)).tobytes()
        for member, reader in zip(ensemble.members, readers)
        for path, v in objckpt.tree(member).items())
    out["ensemble_rows"] = [[int(p.shape[0]) for p in v.variables]
                            for m in ensemble.members for v in objckpt.tree(m).values()
                            if _compat.is_sharded(v)]
    target = base.build_keras3(base.strategy_of(resolver, 2))
    report = objckpt.average(target, prefixes)
    out["averaged"] = sorted(report.averaged)
    out["average_within_one_ulp"] = True
    for path, variable in objckpt.tree(target).items():
        expected = np.mean([r.get_tensor(key(path)).astype("float64") for r in readers],
                           axis=0).astype("float32")
        got = logical(variable)
        out["average_within_one_ulp"] &= bool(np.all(np.abs(got - expected)
                                                     <= np.spacing(np.abs(expected))))
    return out


def main(folder: str) -> dict:
    resolver, _servers = base.start_cluster()
    if base.FLAVOUR == "keras3":
        return {"keras3": keras3_main(folder, resolver)}
    return {"freezer": freezer_main(resolver), "ensemble": ensemble_main(folder, resolver),
            "average": average_main(folder, resolver)}


if __name__ == "__main__":
    base.FOLDER = sys.argv[1]
    if sys.argv[3:] == ["fit-freezer"]:
        print("RESULT " + json.dumps(fit_freezer_main(sys.argv[1], base.start_cluster()[0])),
              flush=True)
        os._exit(0)
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
    os._exit(0)  # in-process servers never stop: end without waiting on them
