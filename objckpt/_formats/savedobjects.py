"""`saved_model.pb` decoded without TensorFlow: the variables of its SavedObjectGraph.

A TF2 SavedModel's `saved_model.pb` is a `SavedModel` proto: `meta_graphs` (MetaGraphDef), whose
`object_graph_def` (SavedObjectGraph) lists every saved object in the order of the node ids of
the checkpoint in `variables/variables`; a `variable` object (SavedVariable) says its dtype,
shape, name and whether it is trainable. Only that much is decoded, strictly, with `_bundle`'s
wire decoder over a memory map of the file: `graph_def`, functions, signatures and Keras
metadata are skipped unread, and nothing is loaded, traced or evaluated. The file is untrusted:
it must be a regular file of at most 2 GiB (protobuf's limit); wrong wire types, truncated
fields, a `kind` given twice and names that are not UTF-8 are refused; decoding is linear in
the bytes. Anything wrong is a `CheckpointCorruptError` naming the SavedModel and the problem.
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle

__all__ = ["PB", "SavedVariable", "damaged", "read_saved_objects"]

PB = "saved_model.pb"
_MAX_PB = 1 << 31  # protobuf's own limit for one message


class SavedVariable(NamedTuple):
    """A `variable` node of `saved_model.pb`: DataType enum, shape (None: unknown), name."""

    dtype: int
    shape: tuple | None
    name: str
    trainable: bool


# --- saved_model.pb ----------------------------------------------------------------------

def read_saved_objects(directory: str) -> tuple | None:
    """Decodes `directory/saved_model.pb`.

    Returns:
      (object count, {node id: SavedVariable}) of the first meta graph with an object graph,
      or None for a TF1 SavedModel (no object graph).

    Raises:
      CheckpointCorruptError: the file is not a regular file, is empty or larger than 2 GiB,
        or does not parse.
    """
    path = os.path.join(directory, PB)
    problem = _bundle.regular_file_problem(path, _MAX_PB)
    if problem is not None:
        raise damaged(directory, f"{problem}; not opened")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise damaged(directory, f"`{PB}` is empty")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        raise damaged(directory, f"`{PB}` cannot be read ({_render.first_line(err)})") from err
    try:
        return _parse_saved_model(data)
    except _bundle.WireError as err:
        raise damaged(directory, f"`{PB}` does not parse: {err}") from None
    finally:
        data.close()


def _parse_saved_model(data) -> tuple | None:
    found = None
    for number, wire, value in _bundle.fields(data, 0, len(data)):
        if number == 1:  # saved_model_schema_version
            _bundle.expect_wire(wire, 0, "SavedModel", number)
        elif number == 2:  # meta_graphs: each checked; the first with an object graph is used
            _bundle.expect_wire(wire, 2, "SavedModel", number)
            graph = _parse_meta_graph(data, *value)
            if found is None and graph is not None:
                found = graph
    return found


def _parse_meta_graph(data, start: int, end: int):
    seen: set = set()
    graph = None
    for number, wire, value in _bundle.fields(data, start, end):
        if number == 7:  # object_graph_def; graph_def, signatures, ...: skipped unread
            _bundle.expect_wire(wire, 2, "MetaGraphDef", number)
            _bundle.singular(seen, number, "MetaGraphDef")
            graph = _parse_object_graph(data, *value)
    return graph


def _parse_object_graph(data, start: int, end: int) -> tuple:
    count, variables = 0, {}
    for number, wire, value in _bundle.fields(data, start, end):
        if number == 1:
            _bundle.expect_wire(wire, 2, "SavedObjectGraph", number)
            try:
                variable = _parse_object(data, *value)
            except _bundle.WireError as err:
                raise _bundle.WireError(f"object {count}: {err}") from None
            if variable is not None:
                variables[count] = variable
            count += 1
    return count, variables


def _parse_object(data, start: int, end: int) -> SavedVariable | None:
    variable, kinds = None, set()
    for number, wire, value in _bundle.fields(data, start, end):
        if 4 <= number <= 12 and number != 11:  # the `kind` oneof: one member at most
            _bundle.expect_wire(wire, 2, "SavedObject", number)
            _bundle.singular(kinds, "kind", "SavedObject")
            if number == 7:
                variable = _parse_variable(data, *value)
    return variable


def _parse_variable(data, start: int, end: int) -> SavedVariable:
    dtype, shape, name, trainable, seen = 0, (), "", False, set()
    for number, wire, value in _bundle.fields(data, start, end):
        if number in (1, 3):
            _bundle.expect_wire(wire, 0, "SavedVariable", number)
            _bundle.singular(seen, number, "SavedVariable")
            if number == 1:
                dtype = _bundle.int32(value)
            else:
                trainable = bool(value)
        elif number in (2, 6):
            _bundle.expect_wire(wire, 2, "SavedVariable", number)
            _bundle.singular(seen, number, "SavedVariable")
            if number == 2:
                shape = _parse_shape(data, *value)
            else:
                try:
                    name = bytes(data[value[0]:value[1]]).decode("utf-8")
                except UnicodeDecodeError:
                    raise _bundle.WireError("a variable name is not UTF-8") from None
    return SavedVariable(dtype, shape, name, trainable)


def _parse_shape(data, start: int, end: int) -> tuple | None:
    dims: list = []
    for number, wire, value in _bundle.fields(data, start, end):
        if number == 2:
            _bundle.expect_wire(wire, 2, "TensorShapeProto", number)
            size = -1
            for n, w, v in _bundle.fields(data, *value):
                if n == 1:
                    _bundle.expect_wire(w, 0, "Dim", n)
                    size = v - (1 << 64) if v >= 1 << 63 else v
            dims.append(size)
        elif number == 3:
            _bundle.expect_wire(wire, 0, "TensorShapeProto", number)
            if value:
                return None
    return None if any(d < 0 for d in dims) else tuple(dims)


def damaged(directory: str, problem: str) -> errors.CheckpointCorruptError:
    return errors.CheckpointCorruptError(
        f"SavedModel `{_render.safe(directory)}` cannot be read: {problem}. Nothing was read "
        "into any variable. Fix: export or save the model again, or restore from its "
        "checkpoint.", source=directory)
