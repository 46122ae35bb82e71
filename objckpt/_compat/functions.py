"""`tf.function` internals: re-wrapping a function around a copied Python function (clone),
and turning a traced call into a GraphDef whose variable reads are inputs (ensembles)."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

__all__ = ["VALUE_SUFFIX", "Unbatchable", "function_parts", "rewrap_function", "stateless_graph"]

# Suffix of the placeholder that replaces each variable read in `stateless_graph`.
VALUE_SUFFIX = "/_objckpt_value"


def function_parts(f):
    """(python_function, tf.function keyword arguments) of a `tf.function` object."""
    kwargs = dict(input_signature=f.input_signature, autograph=f._autograph,
                  jit_compile=f._jit_compile, reduce_retracing=f._reduce_retracing)
    if getattr(f, "_experimental_autograph_options", None) is not None:
        kwargs["experimental_autograph_options"] = f._experimental_autograph_options
    if getattr(f, "_attributes", None):
        kwargs["experimental_attributes"] = dict(f._attributes)
    return f._python_function, kwargs


def rewrap_function(python_function, kwargs: dict):
    """A new `tf.function` of python_function with the options `function_parts` gave."""
    try:
        return tf.function(python_function, **kwargs)
    except TypeError:  # an option this TF version does not take
        basic = ("input_signature", "autograph", "jit_compile")
        return tf.function(python_function, **{k: kwargs[k] for k in basic})


class Unbatchable(Exception):
    """The call cannot be turned into a function of the weights."""


def stateless_graph(member, kwargs: dict, specs, variables: dict):
    """Traces member's call; returns its graph with variable reads made inputs.

    Returns (graph_def, input names, output names, structured outputs, paths
    read in order of the value placeholders, other captures by name).
    """
    def call(*flat):
        inputs = tf.nest.pack_sequence_as(specs, list(flat))
        return member(inputs, **kwargs)

    flat_specs = tf.nest.flatten(specs)
    concrete = tf.function(call, autograph=True).get_concrete_function(*flat_specs)
    graph = concrete.graph
    path_of_handle = {id(v.handle): p for p, v in variables.items()}
    resource_placeholders = {}
    other_captures = {}
    for external, internal in zip(concrete.captured_inputs, graph.internal_captures):
        path = path_of_handle.get(id(external))
        if path is not None:
            resource_placeholders[internal.op.name] = path
        else:
            other_captures[internal.name] = external
    graph_def = graph.as_graph_def()
    rewritten = graph_pb2.GraphDef()
    rewritten.versions.CopyFrom(graph_def.versions)
    rewritten.library.CopyFrom(graph_def.library)
    reads = []
    for node in graph_def.node:
        if node.name in resource_placeholders:
            continue
        sources = [i.lstrip("^").split(":")[0] for i in node.input]
        read = [s for s in sources if s in resource_placeholders]
        if read and node.op != "ReadVariableOp":
            raise Unbatchable(
                f"the call uses variable `{resource_placeholders[read[0]]}` in a {node.op} op, "
                "not only by reading it (e.g. it updates it, or reads it in a nested function)")
        if read:
            value = rewritten.node.add(name=node.name + VALUE_SUFFIX, op="Placeholder")
            value.attr["dtype"].CopyFrom(node.attr["dtype"])
            identity = rewritten.node.add(name=node.name, op="Identity")
            identity.input.append(value.name)
            identity.input.extend(i for i in node.input[1:] if i.startswith("^"))
            identity.attr["T"].CopyFrom(node.attr["dtype"])
            reads.append((value.name + ":0", resource_placeholders[read[0]]))
            continue
        rewritten.node.add().CopyFrom(node)
    inputs = [t.name for t in concrete.inputs[:len(flat_specs)]]
    outputs = [t.name for t in concrete.outputs]
    return rewritten, inputs, outputs, concrete.structured_outputs, reads, other_captures
