"""The one place that touches TensorFlow/Keras private APIs and flavour differences.

Everything else in objckpt talks to TensorFlow through the names re-exported here, so a change
in TF internals or a new Keras flavour is handled in this package alone (`tests/test_layers.py`
enforces it). One module per topic, imports flowing down this list:

- `variables`: variables of every flavour, distributed values, types clone treats specially;
- `optimizers`: optimizer detection, per-variable state lists and slots, counters;
- `graph`: TF's trackable object graph and the Keras 3 collections it misses (one walk);
- `kernels`: fused grouped assigns, packed Polyak updates, cond lowering;
- `functions`: `tf.function` internals (clone re-wraps functions) and GraphDef rewriting;
- `keras`: callback base class, build hooks, optimizer hooks, resuming `model.fit`.

A private TF name that cannot be found raises `errors.IncompatibleTensorFlowError` naming the
TF version, at import or first use; nothing falls back silently.
"""

from objckpt._compat.functions import (  # noqa: F401
    VALUE_SUFFIX,
    Unbatchable,
    function_parts,
    rewrap_function,
    stateless_graph,
)
from objckpt._compat.graph import (  # noqa: F401
    OBJECT_GRAPH_KEY,
    CollectionNode,
    TrackableObjectGraph,
    check_complete,
    children,
    children_with_collections,
    keras_collection_children,
    keras_layers,
    live_object_graph,
    network_variable_paths,
    parse_checkpoint_state,
    rng_state_variables,
    variable_edges,
    variable_holders,
    variable_paths,
)
from objckpt._compat.keras import (  # noqa: F401
    KERAS_CACHED_ATTRS,
    WEIGHT_DECAY_METHOD,
    defer_on_attach,
    keras_callback_base,
    mark_default_hook,
    override_methods,
    restore_methods,
    set_fit_start_epoch,
    skip_fit_batches,
    steps_per_execution,
    unskip_fit_batches,
    weight_decay_method,
)
from objckpt._compat.kernels import (  # noqa: F401
    FusedOps,
    called_cond,
    fused_call,
    packed_pairs_call,
    polyak_apply,
    polyak_coefficients,
    polyak_update,
    read_values,
    switch,
)
from objckpt._compat.optimizers import (  # noqa: F401
    build_optimizer,
    optimizer_counters,
    optimizer_slot_lists,
    optimizer_state,
)
from objckpt._compat.variables import (  # noqa: F401
    as_variable,
    clone_types,
    fingerprint,
    is_trackable,
    is_unbuilt,
    lookup,
    optional,
    read_value,
    recreate_variable,
    unique_id,
    variable_name,
)
