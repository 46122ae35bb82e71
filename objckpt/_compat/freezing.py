"""What `Freezer` needs to know about the graph it is traced into.

XLA (a `tf.function(jit_compile=True)`, Keras' `compile(jit_compile=True)`) compiles a
conditional only when both branches return tensors of the same shapes.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import control_flow_util as _control_flow_util

__all__ = ["in_xla_context"]


def in_xla_context() -> bool:
    """Whether the graph being built (or one it is nested in) will be compiled by XLA."""
    if tf.executing_eagerly():
        return False
    return bool(_control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
