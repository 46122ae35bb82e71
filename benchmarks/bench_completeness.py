"""Benchmarks of "no weight left behind": plan reuse and the cost of covering Keras 3 lists.

- Snapshot of model `a` restored into a second instance `b` of the same architecture
  (the checked plan is cached per pair of trees) against `b.set_weights(a.get_weights())`.
- A keras-hub ViT (blocks held in a Python list, which TF's own walk misses): `tree()` and
  `snapshot()` as every operation calls them (tree cached), with the list coverage against
  the same calls with it switched off. The ViT is trained one step first, so TF's walk
  reaches every trainable weight through the optimizer and both configurations read the
  same variables: the difference is what covering costs. The first (uncached) walk is
  reported too, and how many weights TF's walk alone reaches on the untrained ViT.
"""

from __future__ import annotations

import contextlib

import numpy as np

import objckpt
from objckpt._compat import graph as _compat_graph
from objckpt._planning import tree as _tree

from timing import met, time_ops


def bench_snapshot_into_twin(builder, keras, repeats: int) -> dict:
    a, b = builder(keras), builder(keras)
    snap = objckpt.snapshot(a)
    operations = {
        "restore(b, snapshot(a))": lambda: objckpt.restore(b, snap),
        "restore(a, snapshot(a))": lambda: objckpt.restore(a, snap),
        "b.set_weights(a.get_weights())": lambda: b.set_weights(a.get_weights()),
    }
    ms = time_ops(operations, repeats)
    ratio = ms["b.set_weights(a.get_weights())"] / ms["restore(b, snapshot(a))"]
    rows = [("restore(b, snapshot(a)) vs b.set_weights(a.get_weights())", ratio, ">= 30x",
             met(ratio, ">= 30x")),
            ("restore(b, snapshot(a)) time / restore(a, snapshot(a))",
             ms["restore(b, snapshot(a))"] / ms["restore(a, snapshot(a))"], "", None)]
    return {"model": f"{a.name}, {len(objckpt.tree(a))} variables", "ms": ms, "ratios": rows}


@contextlib.contextmanager
def _coverage_off():
    """objckpt's walk as TF's alone: no Keras 3 collections, no completeness check."""
    graph = _compat_graph  # the walk and the check live there
    saved = graph._collection_paths, graph.check_complete
    graph._collection_paths = lambda *args, **kwargs: []
    graph.check_complete = lambda *args, **kwargs: None
    _tree._TREE_CACHE.clear()
    try:
        yield
    finally:
        graph._collection_paths, graph.check_complete = saved
        _tree._TREE_CACHE.clear()


def vit(keras_hub, keras, train: bool):
    keras.utils.set_random_seed(0)
    model = keras_hub.models.ViTBackbone(
        image_shape=(64, 64, 3), patch_size=8, num_layers=6, num_heads=6, hidden_dim=384,
        mlp_dim=1536)
    if train:
        x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype("float32")
        y = np.asarray(model(x))
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
        model.fit(x, np.zeros_like(y), epochs=1, batch_size=2, verbose=0)
    return model


def bench_vit_coverage(keras, repeats: int) -> dict | None:
    try:
        import keras_hub
    except ImportError:
        return None
    untrained = vit(keras_hub, keras, train=False)
    with _coverage_off():
        tf_reaches = len(objckpt.tree(untrained))
    covered = len(objckpt.tree(untrained))
    model = vit(keras_hub, keras, train=True)

    def uncached_walk():
        _tree._TREE_CACHE.pop(model, None)
        return objckpt.tree(model)

    covered_tree = objckpt.tree(model)
    with _coverage_off():
        tf_tree = objckpt.tree(model)
        without_count = len(tf_tree)
        without_walk = time_ops({"walk": uncached_walk}, repeats)["walk"]
    with_count = len(covered_tree)
    with_walk = time_ops({"walk": uncached_walk}, repeats)["walk"]

    def using(variables, operation):
        # Both trees stay built; each call finds the one under test in the cache, so
        # the two configurations are timed interleaved, round by round.
        def call():
            _tree._TREE_CACHE[model] = variables
            return operation(model)
        return call

    ms_all = time_ops({"tree(), lists covered": using(covered_tree, objckpt.tree),
                       "tree(), TF's walk only": using(tf_tree, objckpt.tree),
                       "snapshot(), lists covered": using(covered_tree, objckpt.snapshot),
                       "snapshot(), TF's walk only": using(tf_tree, objckpt.snapshot)},
                      repeats)
    _tree._TREE_CACHE[model] = covered_tree
    with_ms = {"tree()": ms_all["tree(), lists covered"],
               "snapshot()": ms_all["snapshot(), lists covered"],
               "first tree() (uncached walk)": with_walk}
    without_ms = {"tree()": ms_all["tree(), TF's walk only"],
                  "snapshot()": ms_all["snapshot(), TF's walk only"],
                  "first tree() (uncached walk)": without_walk}
    ms = {f"{name}, lists covered": value for name, value in with_ms.items()}
    ms.update({f"{name}, TF's walk only": value for name, value in without_ms.items()})
    rows = []
    for name in ("tree()", "snapshot()"):
        ratio = with_ms[name] / without_ms[name]
        rows.append((f"{name} time, lists covered / TF's walk only", ratio, "<= 1.05x",
                     met(ratio, "<= 1.05x")))
    rows.append(("first (uncached) walk, lists covered / TF's walk only",
                 with_ms["first tree() (uncached walk)"]
                 / without_ms["first tree() (uncached walk)"], "", None))
    rows.append(("untrained ViT: weights TF's walk reaches", tf_reaches, "", None))
    rows.append(("untrained ViT: weights objckpt.tree reaches", covered, "", None))
    rows.append(("untrained ViT: len(model.weights)", len(untrained.weights), "", None))
    rows.append(("trained ViT: variables in tree, covered / TF walk only",
                 with_count / without_count, "", None))
    return {"model": f"keras-hub ViTBackbone, 6 layers, hidden 384, {len(model.weights)} "
                     "weights, trained one Adam step", "ms": ms, "ratios": rows}
