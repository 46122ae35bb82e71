"""The one place that touches TensorFlow/Keras private APIs and flavour differences.

Everything else in objckpt talks to TensorFlow through the names re-exported here, so a change
in TF internals or a new Keras flavour is handled in this package alone (`lint-imports`,
`tests/test_architecture.py` enforce it). One module per topic, imports flowing down this list:

- `variables`: variables of every flavour, distributed values, types clone treats specially;
- `distribute`: tf.distribute variables: which clone re-creates, under their own strategy;
  which process writes checkpoints;
- `optimizers`: optimizer detection, per-variable state lists and slots, counters;
- `graph`: TF's trackable object graph and the Keras 3 collections it misses (one walk);
- `kernels`: fused grouped assigns, packed Polyak updates, cond lowering;
- `functions`: `tf.function` internals (clone re-wraps functions) and GraphDef rewriting;
- `keras`: the callback base class and resuming `model.fit`;
- `layout`: Keras 3's weights-file layout of a live obj (`layers/dense/vars/0`);
- `h5names`: the layer and weight names Keras's HDF5 `save_weights` gives a live obj;
- `derived`: state Keras layers derive from variables, refreshed after objckpt writes;
- `freezing`: whether the graph a Freezer is traced into is XLA-compiled; sharded variables
  frozen whole (their shards' aliases, where the frozen set lives);
- `fit`: whether a value fits a variable (shape, dtype): the one rule of every check;
- `dtypes`: ml_dtypes' bfloat16 and float8 arrays as this TF's NumPy types (TF 2.12's own);
- `sharded`: sharded variables (ParameterServerStrategy) as one logical variable: shards,
  layout, the logical value read and assigned a shard at a time, the slices TF saves;
- `partitioned`: TF1 partitioned variables (`tf.compat.v1.get_variable(partitioner=...)`),
  which `sharded` treats like sharded ones, and the attributes that hold them;
- `hooks`: TF-free Keras conventions (method overrides, default-hook marks).

Names load on first use: `_compat.mark_default_hook` imports only the TF-free `hooks`
module. A private TF name that cannot be found raises `errors.IncompatibleTensorFlowError`
naming the TF version, at import or first use; nothing falls back silently.
"""

from __future__ import annotations

import importlib

# Where each name lives (tests/test_architecture.py checks this against each module's __all__).
# Names load on first use, so importing one TF-free helper does not import TensorFlow.
_WHERE = {
    "variables": ("CONSTRAINT_ATTR", "as_variable", "clone_types", "fingerprint",
        "is_trackable", "is_unbuilt", "keras_variables", "lookup", "optional", "plain_cpu_variable",
        "read_value",
        "recreate_variable", "unique_id", "variable_name"),
    "distribute": ("autocast_inner", "distributed_refusal",
        "is_distributed_variable", "recreate_distributed", "replica_components",
        "replica_context_strategy", "restore_components", "gather_failures",
        "variables_strategy",
        "writes_checkpoints"),
    "optimizers": ("COUNTERS", "HYPERPARAMETERS", "KERAS3_ROLES", "NAMED_SLOT",
        "SLOT_ALIASES", "TF1_SLOT", "build_optimizer", "existing_slot", "fresh_slot_value",
        "has_slot_variables",
        "is_optimizer_node", "on_slot_created", "optimizer_counters", "optimizer_slot_lists",
        "optimizer_state", "optimizers_of", "slot_owner", "unbuilt_optimizers"),
    "graph": ("CollectionNode", "OBJECT_GRAPH_KEY", "TrackableObjectGraph",
        "check_complete", "children", "children_with_collections",
        "keras_collection_children", "keras_layers", "live_object_graph",
        "network_variable_paths", "random_state_variables", "rng_state_variables",
        "variable_edges", "variable_holders", "variable_paths", "walk"),
    "kernels": ("FusedOps", "called_cond", "fused_call", "local_replica_count",
        "packed_pairs_call", "polyak_apply", "polyak_coefficients", "polyak_update",
        "read_values", "replica_index", "replica_parts", "switch"),
    "functions": ("Unbatchable", "VALUE_SUFFIX", "function_parts", "rewrap_function",
        "stateless_graph"),
    "keras": ("defer_on_attach", "keras_callback_base", "set_fit_start_epoch",
        "skip_fit_batches", "steps_per_execution", "unskip_fit_batches"),
    "layout": ("keras_weights_layout",),
    "h5names": ("keras_h5_weights",),
    "derived": ("delegated_copies", "derived_hooks", "layer_hooks", "lora_factors",
        "owned_positions", "refresh_derived_state", "refresh_hooks", "saving_as_loaded"),
    "freezing": ("in_xla_context", "mask_device", "part_aliases", "shard_aliases",
        "sharded_trainable"),
    "fit": ("CASTS", "cast_of", "cast_value", "check_cast", "fits", "lossless", "misfit"),
    "dtypes": ("numpy_dtype", "tf_array", "tf_dtype"),
    "partitioned": ("assign_whole", "is_partitioned", "part_of", "partition_axis",
        "partitioned_children", "parts"),
    "sharded": ("HeldLoader", "Layout", "ShardedValue", "assign_sharded", "io_device",
        "io_devices", "is_caching_type", "is_sharded", "is_sharded_type", "is_sharded_value",
        "new_sharded", "read_sharded", "read_shards", "save_order", "shard_layout",
        "shard_rows", "shard_slices", "shards", "slice_specs", "sliced_entries"),
    "hooks": ("KERAS_CACHED_ATTRS", "WEIGHT_DECAY_METHOD", "mark_default_hook",
        "override_methods", "past_autograph", "restore_methods", "weight_decay_method"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'objckpt._compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"objckpt._compat.{module}"), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))
