"""Benchmarks of "untrusted checkpoints": what validating a checkpoint before TF reads it costs.

- A 1,000-variable checkpoint (500 Dense(64) layers): the validation alone (the index parsed and
  checked in Python, the data shards' sizes, the object graph's ids and names) against
  `objckpt.restore(model, prefix)`, which runs it; and restore against the same call with the
  validation switched off (the index then comes from TF's reader, as before validation existed,
  which costs about as much as the validation saves by standing in for it).
- A checkpoint whose object graph has 200,000 extra nodes (children of the root that hold no
  variable): `objckpt.restore` against TF's own `tf.train.Checkpoint(root=model).read(prefix)`
  with `assert_existing_objects_matched()`, to show the cost stays linear in the graph's size.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import tensorflow as tf

import objckpt
from objckpt import _compat
from objckpt._bundle import index as _bundle

from timing import met, time_ops


def build_dense_stack(keras, layers: int = 500, width: int = 64):
    """`layers` Dense(width) layers: 2 * layers variables."""
    inputs = keras.Input((width,))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Dense(width)(x)
    return keras.Model(inputs, x, name=f"dense_{2 * layers}")


def _unchecked_index(prefix: str, **kwargs) -> _bundle.Index:
    """The index as TF's reader gives it, with no validation (what restore did before)."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    entries = {key: _bundle.Entry(dtypes[key].as_datatype_enum, tuple(shape), 0, 0, 0, ())
               for key, shape in reader.get_variable_to_shape_map().items()}
    return _bundle.Index(prefix, 1, entries, {})


@contextlib.contextmanager
def _validation_off():
    saved = _bundle.read_index, _bundle.check_graph
    _bundle.read_index = _unchecked_index
    _bundle.check_graph = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _bundle.read_index, _bundle.check_graph = saved


def _validate(prefix: str, graph_bytes: bytes) -> None:
    """What restore adds: the index and shards checked, then the object graph's ids and
    names (its checkpoint keys are checked in the loop that reads them anyway)."""
    index = _bundle.read_index(prefix)
    graph = _compat.TrackableObjectGraph()
    graph.ParseFromString(graph_bytes)
    _bundle.check_graph(graph, index.entries, prefix, attributes=False)


def bench_validation(keras, repeats: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="objckpt-bench-untrusted-")
    model = build_dense_stack(keras)
    prefix = objckpt.save(model, os.path.join(workdir, "ck"))
    target = build_dense_stack(keras)
    operations = {"restore(prefix)": lambda: objckpt.restore(target, prefix)}
    ms = time_ops(operations, 1)  # warm: plan cache, traced assign

    def unvalidated():
        with _validation_off():
            objckpt.restore(target, prefix)

    operations["restore(prefix), validation off"] = unvalidated
    graph_bytes = tf.train.load_checkpoint(prefix).get_tensor(_compat.OBJECT_GRAPH_KEY)
    operations["validation alone (index, shards, graph)"] = lambda: _validate(prefix,
                                                                              graph_bytes)
    ms = time_ops(operations, repeats)
    added = ms["restore(prefix)"] / ms["restore(prefix), validation off"] - 1
    alone = ms["validation alone (index, shards, graph)"] / ms["restore(prefix)"]
    rows = [("validation alone / restore(prefix)", alone, "<= 0.1x", met(alone, "<= 0.1")),
            ("restore(prefix) with / without validation, minus 1", added, "", None)]
    return {"model": f"{model.name}, {len(objckpt.tree(model))} variables", "ms": ms,
            "ratios": rows}


def bench_large_graph(keras, repeats: int, extra: int = 200_000) -> dict:
    workdir = tempfile.mkdtemp(prefix="objckpt-bench-graph-")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(), keras.layers.Dense(4)])
    base = objckpt.save(model, os.path.join(workdir, "base"))
    reader = tf.train.load_checkpoint(base)
    keys = [k for k in reader.get_variable_to_shape_map() if k != _compat.OBJECT_GRAPH_KEY]
    graph = _compat.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_compat.OBJECT_GRAPH_KEY))
    first = len(graph.nodes)
    for i in range(extra):
        graph.nodes.add()
        child = graph.nodes[0].children.add()
        child.node_id, child.local_name = first + i, f"extra_{i}"
    prefix = os.path.join(workdir, "large")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=[*keys, _compat.OBJECT_GRAPH_KEY],
                      shape_and_slices=[""] * (len(keys) + 1),
                      tensors=[*(reader.get_tensor(k) for k in keys),
                               tf.constant(graph.SerializeToString())])
    target = keras.models.clone_model(model)

    def tf_read():
        tf.train.Checkpoint(root=target).read(prefix).assert_existing_objects_matched()

    ms = time_ops({"tf.train.Checkpoint.read + assert_existing_objects_matched": tf_read,
                   "objckpt.restore(prefix)": lambda: objckpt.restore(target, prefix)},
                  repeats)
    ratio = ms["objckpt.restore(prefix)"] / \
        ms["tf.train.Checkpoint.read + assert_existing_objects_matched"]
    return {"model": f"object graph of {len(graph.nodes)} nodes ({extra} extra root children)",
            "ms": ms, "ratios": [("objckpt.restore / TF read", ratio, "<= 3x",
                                  met(ratio, "<= 3"))]}
