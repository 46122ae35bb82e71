"""Runs `objckpt.snapshot` and restores from it on an in-process ParameterServerStrategy
cluster (2 workers and 2 parameter servers on local ports, this process the coordinator;
`pss_worker.start_cluster`) with a tf_keras (or Keras 2) embedding model whose table and Adam
slots are sharded, and prints the results as one JSON line for
tests/distributed/test_sharded_snapshot.py.

    python tests/helpers/pss_snapshot_worker.py FOLDER (tf_keras | keras2 | keras3)

Each case: snapshot, train one more step, restore the snapshot (into the same model, or a
fresh one of another layout); the oracle is TF's checkpoint of the live objects taken at the
snapshot, read back whole by TF's reader (`pss_worker.state`). `joins`: the devices on which
the restore joined a value's shards into one tensor (none for a sharded target; the target's
own device, a parameter server, for an unsharded one).
"""

from __future__ import annotations

import json
import os
import sys

import pss_worker as base  # the cluster, the model and its ClusterCoordinator loop

tf = base.tf

import objckpt  # noqa: E402
from objckpt._compat import sharded as _sharded  # noqa: E402

EMBED = "model/layer_with_weights-0/embeddings"


def checkpoint(model, opt):
    return tf.train.Checkpoint(model=model, optimizer=opt)


def restored(snap, model, opt, expected) -> dict:
    """Restores `snap` into (model, opt), counting the joins; its result against
    `expected` (TF's reading of the values the snapshot was taken from)."""
    joins = []
    real = _sharded.ShardedValue.join

    def spy(self, device=None):
        joins.append(device)
        return real(self, device)

    _sharded.ShardedValue.join = spy
    try:
        report = objckpt.restore(checkpoint(model, opt), snap)
    finally:
        _sharded.ShardedValue.join = real
    return {"equal": base.same(base.state(model, opt), expected), "joins": joins,
            "restored": len(report.restored), "paths": len(snap),
            "rows": base.shard_rows(model)}


def main(folder: str) -> dict:
    out = {}
    resolver, _servers = base.start_cluster()
    two = base.strategy_of(resolver, 2)
    model, opt = base.build(two, "adam")
    base.train(two, model, opt, 2)
    expected = base.state(model, opt)
    snap = objckpt.snapshot(checkpoint(model, opt))
    held = snap[EMBED]
    out["held"] = {"type": type(held).__name__, "layout": held.layout.describe(),
                   "devices": [s.device for s in held.shards],
                   "shard_devices": [p.device for p in
                                     model.get_layer("embed").embeddings.variables]}
    base.train(two, model, opt, 1, seed=4)  # the snapshot keeps what it was taken with
    out["2to2"] = restored(snap, model, opt, expected)
    base.train(two, model, opt, 1, seed=5)
    out["2to2-again"] = restored(snap, model, opt, expected)  # the tree's second restore
    three = base.strategy_of(resolver, 3)
    model3, opt3 = base.build(three, "adam")
    out["2to3"] = restored(snap, model3, opt3, expected)
    snap3 = objckpt.snapshot(checkpoint(model3, opt3))
    base.train(three, model3, opt3, 1, seed=6)
    one = base.strategy_of(resolver, 1)
    model1, opt1 = base.build(one, "adam")
    out["3to1"] = restored(snap3, model1, opt1, expected)
    plain, plain_opt = base.build(tf.distribute.get_strategy(), "adam")  # no strategy
    plain_expected = base.state(plain, plain_opt)
    fresh2, fresh2_opt = base.build(two, "adam")
    out["plainto2"] = restored(objckpt.snapshot(checkpoint(plain, plain_opt)), fresh2,
                               fresh2_opt, plain_expected)
    # An assignment failing half way (the third variable given its value): every shard on
    # every parameter server, and every other variable, put back.
    base.train(two, model, opt, 1, seed=8)
    before = base.state(model, opt)
    calls = []
    real = _sharded.HeldLoader._one

    def failing(self, variable, rows):
        calls.append(variable.name)
        if len(calls) == 3:
            raise OSError("the parameter server went away")
        return real(self, variable, rows)

    _sharded.HeldLoader._one = failing
    try:
        objckpt.restore(checkpoint(model, opt), snap)
        out["half_way"] = {"raised": ""}
    except OSError as err:
        out["half_way"] = {"raised": str(err), "notes": list(getattr(err, "__notes__", [])),
                           "calls": len(calls),
                           "unchanged": base.same(base.state(model, opt), before)}
    finally:
        _sharded.HeldLoader._one = real
    return out


def keras3_main(resolver) -> dict:
    """Keras 3 builds sharded variables under ParameterServerStrategy but cannot train with
    them: the model's values change by assignment, shard by shard, after the snapshot. The
    oracle reads each weight's shards (`pss_worker.keras3_state`)."""
    out = {}
    for saved, restored in ((2, 2), (2, 3), (3, 1)):
        model = base.build_keras3(base.strategy_of(resolver, saved))
        expected = base.keras3_state(model)
        snap = objckpt.snapshot(model)
        for variable in objckpt.tree(model).values():
            for part in (_sharded.shards(variable) if _sharded.is_sharded(variable)
                         else (variable,)):
                part.assign(part * 2.0 + 1.0)
        target = model if saved == restored else base.build_keras3(
            base.strategy_of(resolver, restored))
        joins = []
        real = _sharded.ShardedValue.join

        def spy(self, device=None, real=real, joins=joins):
            joins.append(device)
            return real(self, device)

        _sharded.ShardedValue.join = spy
        try:
            report = objckpt.restore(target, snap)
        finally:
            _sharded.ShardedValue.join = real
        out[f"keras3-{saved}to{restored}"] = {
            "equal": base.same(base.keras3_state(target), expected), "joins": joins,
            "restored": len(report.restored), "paths": len(snap),
            "held": sum(_sharded.is_sharded_value(v) for v in snap.values())}
    return out


if __name__ == "__main__":
    base.FOLDER = sys.argv[1]
    if base.FLAVOUR == "keras3":
        print("RESULT " + json.dumps(keras3_main(base.start_cluster()[0])), flush=True)
        os._exit(0)
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
    os._exit(0)  # in-process servers never stop: end without waiting on them
