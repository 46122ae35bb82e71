"""SavedModel directories as sources, read without loading or executing anything.

A TF2 SavedModel (`tf.saved_model.save`, Keras 3 `model.export`, tf_keras and Keras 2
`model.save(dir)`) keeps its variables in an object-based checkpoint, `dir/variables/variables`,
and in `dir/saved_model.pb` a `SavedObjectGraph` whose node i is node i of that checkpoint's
object graph: its `variable` nodes (`SavedVariable`) say each variable's dtype, shape and name.
`_savedobjects` decodes only that much, TF-free; nothing is loaded, traced or evaluated (never
`tf.saved_model.load`). The checkpoint is validated by `_bundle` and `_objgraph` and must agree
with `saved_model.pb`; TensorFlow is imported only to read tensor values (RestoreV2), as for
checkpoints.

Every variable is keyed by the path people know: a walk from the root that takes the lists a
SavedModel adds for serving (`variables`, `trainable_variables`, `keras_api`, ...) and
optimizers last, so a tf_keras model's nested weight is `layer_with_weights-2/
layer_with_weights-0/kernel` as in the model's own checkpoint, not TF's canonical
`variables/6` (which `inspect` and `diff` key by, as for checkpoints). Left out, with a
note: the Keras 3 export's second copy of its weights (`_all_variables`, the backend
variables of `variables`) and Keras metrics reachable only through `keras_api`.
"""

from __future__ import annotations

import collections
import os
from typing import NamedTuple

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph
from objckpt._formats import savedobjects as _savedobjects
from objckpt._formats.savedobjects import PB, damaged

__all__ = ["PB", "Variables", "check", "find", "listing", "problems", "read_variables",
           "recognise", "source_fields"]

# Edges a SavedModel adds beside a model's own: walked last, so a weight keeps its model path
# (`_layers`: a Keras 3 Sequential's layers, which its checkpoint reaches through `_functional`).
_SERVING_EDGES = frozenset({
    "variables", "trainable_variables", "non_trainable_variables", "keras_api",
    "_all_variables", "regularization_losses", "signatures", "weights", "trainable_weights",
    "non_trainable_weights", "_default_save_signature", "_layers"})


class Variables(NamedTuple):
    """A SavedModel's variables, checked against its checkpoint.

    Attributes:
      directory: the SavedModel directory; prefix: its `variables/variables`.
      entries: ordered (key, canonical path, checkpoint key, shape, DataType enum, name),
        key being the path people know (see the module docstring).
      notes: what was left out, and why.
      index: the validated `_bundle.Index`; graph: the checkpoint's object graph.
      optimizer: whether the SavedModel holds optimizer state.
    """

    directory: str
    prefix: str
    entries: tuple
    notes: tuple
    index: object
    graph: object
    optimizer: bool


def find(path: str) -> str | None:
    """The SavedModel directory `path` names (the directory, its `saved_model.pb`, or its
    `variables/variables` prefix), or None."""
    path = os.fspath(path)
    if "://" in path:
        return None
    if os.path.basename(path) == PB and os.path.isfile(path):
        return os.path.dirname(path) or "."
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, PB)):
            return path
        if os.path.exists(os.path.join(path, "saved_model.pbtxt")):
            raise errors.UnsupportedFormatError(
                f"SavedModel `{_render.safe(path)}` is in text form (`saved_model.pbtxt`), "
                f"which objckpt does not read. Expected `{PB}`. Fix: pass its checkpoint "
                f"`{_render.safe(os.path.join(path, 'variables', 'variables'))}` instead.",
                source=path)
        return None
    bare = path[:-len(".index")] if path.endswith(".index") else path
    head, leaf = os.path.split(bare)
    if leaf == "variables" and os.path.basename(head) == "variables":
        directory = os.path.dirname(head) or "."
        if os.path.isfile(os.path.join(directory, PB)):
            return directory
    return None


# --- the variables, checked against the checkpoint ----------------------------------------

def read_variables(directory: str) -> Variables:
    """Reads a SavedModel's variables from `saved_model.pb` and its checkpoint, TF-free.

    Raises:
      CheckpointCorruptError: `saved_model.pb` or the checkpoint is damaged, they disagree,
        or the checkpoint is missing while `saved_model.pb` lists variables.
      NotObjectBasedError: a TF1 SavedModel (no object graph).
    """
    found = _savedobjects.read_saved_objects(directory)
    prefix = os.path.join(directory, "variables", "variables")
    shown_dir = _render.safe(directory)
    if found is None:
        raise errors.NotObjectBasedError(
            f"SavedModel `{shown_dir}` has no object graph: it was written by TF1's "
            "SavedModelBuilder, so its variables are keyed by global name only. Fix: pass its "
            f"name-based checkpoint `{_render.safe(prefix)}` with rules, e.g. "
            "rules=[('^dense/', 'hidden/')].", source=directory)
    count, saved = found
    if not os.path.exists(prefix + ".index"):
        if not saved:
            return Variables(directory, prefix, (), (), None, None, False)
        raise damaged(directory, f"`{PB}` lists {len(saved)} variables but their checkpoint "
                       f"`{_render.safe(prefix)}.index` is missing")
    index = _bundle.read_index(prefix)  # CheckpointCorruptError names the file and entry
    graph = _objgraph.read_object_graph(index)
    for problem in _disagreements(count, saved, index, graph):
        raise damaged(directory, problem)
    return _entries(directory, prefix, saved, index, graph)


def _disagreements(count: int, saved: dict, index, graph):
    """What differs between `saved_model.pb` and its checkpoint, one line each."""
    if graph is None:
        yield "its checkpoint `variables/variables` has no object graph"
        return
    if len(graph.nodes) != count:
        yield (f"`{PB}` has {count} objects but its checkpoint's object graph "
               f"{len(graph.nodes)}")
        return
    for node_id, variable in saved.items():
        attribute = next((a for a in graph.nodes[node_id].attributes
                          if a.name == _paths.VARIABLE_VALUE), None)
        entry = None if attribute is None else index.entries.get(attribute.checkpoint_key)
        if entry is None:
            yield (f"variable `{_render.safe(variable.name)}` (object {node_id}) has no value "
                   "in the checkpoint")
        elif entry.dtype != variable.dtype or (variable.shape is not None
                                               and entry.shape != variable.shape):
            yield (f"variable `{_render.safe(variable.name)}` (object {node_id}) is declared "
                   f"{variable.shape} of DataType {variable.dtype} but its checkpoint holds "
                   f"{entry.shape} of DataType {entry.dtype}")


def problems(directory: str) -> list[str]:
    """Every problem of a SavedModel beyond its checkpoint's own (which `verify` checks):
    `saved_model.pb` damaged, the checkpoint missing, or the two disagreeing."""
    try:
        found = _savedobjects.read_saved_objects(directory)
    except errors.CheckpointCorruptError as err:
        return [str(err).split(". Nothing was read")[0]]
    if found is None:
        return ["no object graph (a TF1 SavedModel): its variables are checked by name only"]
    count, saved = found
    prefix = os.path.join(directory, "variables", "variables")
    if not os.path.exists(prefix + ".index"):
        return [f"`{PB}` lists {len(saved)} variables but `variables/variables.index` is "
                "missing"] if saved else []
    try:
        index = _bundle.read_index(prefix)
        graph = _objgraph.read_object_graph(index, check=False)
    except errors.ObjckptError:
        return []  # the checkpoint's own problems: verify lists them
    return list(_disagreements(count, saved, index, graph))


def _walk(graph) -> dict:
    """node id -> path people know: serving lists and optimizers walked last; slots too.
    Each node's optimizer test runs once (`_paths.OptimizerEdges`), however many edges
    reach it."""
    optimizer = _paths.OptimizerEdges(graph)

    def last(node_id, name):
        return name in _SERVING_EDGES or optimizer(node_id, name)

    return _paths.walked_paths(graph, defer=last)


def _has_optimizer(graph, shown) -> bool:
    """Whether an edge from a shown node leads to an optimizer; each node tested once
    (`_paths.OptimizerEdges`), however many edges reach it."""
    is_optimizer = _paths.OptimizerEdges(graph)
    return any(is_optimizer(c.node_id, c.local_name)
               for node_id in shown for c in graph.nodes[node_id].children)


def _entries(directory, prefix, saved, index, graph) -> Variables:
    shown = _walk(graph)
    without_metrics = _paths.graph_paths(
        graph, skip=lambda node_id, name: name == "keras_api")
    rows, metrics, copies = [], [], []
    root = {c.local_name: c.node_id for c in graph.nodes[0].children}
    duplicates = _export_copies(graph, root, saved)
    for node_id, path in shown.items():
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name != _paths.VARIABLE_VALUE:
                continue
            key = attribute.checkpoint_key
            entry = index.entries.get(key)
            if entry is None:  # check_graph found it saved under a longer key only
                raise damaged(directory, f"its checkpoint lists `{_render.safe(path)}` (object "
                              f"{node_id}) but holds no tensor `{_render.safe(key)}`")
            name = saved[node_id].name if node_id in saved else attribute.full_name
            name = name[:-2] if name.endswith(":0") else name
            if node_id in duplicates:
                copies.append(path)
            elif node_id not in without_metrics and _paths.split_slot(path) is None:
                metrics.append(name or path)
            else:
                rows.append((path, _paths.path_of_key(key), key, entry.shape, entry.dtype,
                             name))
    notes = []
    if copies:
        notes.append(f"SavedModel `{_render.safe(directory)}`: {len(copies)} entries under "
                     "`_all_variables` are the export's second copy of those under "
                     "`variables` (the backend variables its functions use): not read")
    if metrics:
        notes.append(f"SavedModel `{_render.safe(directory)}`: {len(metrics)} Keras metric "
                     "variables reachable only through `keras_api` ("
                     + ", ".join(f"`{_render.safe(m)}`" for m in metrics[:4])
                     + ", ..." * (len(metrics) > 4) + ") are not model weights: not read")
    optimizer = _has_optimizer(graph, shown)
    return Variables(directory, prefix, tuple(rows), tuple(notes), index, graph, optimizer)


def _export_copies(graph, root: dict, saved: dict) -> set:
    """Node ids of a Keras 3 export's `_all_variables` when they copy `variables` one to one
    (same names, shapes and dtypes); else none."""
    if "_all_variables" not in root or "variables" not in root:
        return set()

    def listed(node_id):
        kids = [c.node_id for c in graph.nodes[node_id].children]
        return kids if all(k in saved for k in kids) else None

    copies, originals = listed(root["_all_variables"]), listed(root["variables"])
    if not copies or originals is None or set(copies) & set(originals):
        return set()
    # The same multiset of (dtype, shape, name, trainable); a shape may be unknown (None).
    signature = collections.Counter(saved[k] for k in copies)
    return set(copies) if signature == collections.Counter(saved[k] for k in originals) \
        else set()


# --- the format's roles in `_formats.FORMATS`: recognise, listing, source_fields, check ---

def recognise(path: str) -> bool:
    """Whether `path` names a SavedModel (its directory, `saved_model.pb` or checkpoint).

    Raises:
      UnsupportedFormatError: a SavedModel in text form (`saved_model.pbtxt`).
    """
    return find(path) is not None


def _named(path: str):
    """(SavedModel directory, its variables) of what `path` names, or (None, None) when it
    names no SavedModel, or names a TF1 SavedModel's checkpoint (`dir/variables/variables`:
    a name-based checkpoint, read as one)."""
    directory = find(path)
    if directory is None:
        return None, None
    bare = path[:-len(".index")] if path.endswith(".index") else path
    try:
        return directory, read_variables(directory)
    except errors.NotObjectBasedError:
        if os.path.basename(bare) == "variables":
            return None, None
        raise


def source_fields(path: str) -> dict | None:
    """The fields of a `Source` over the SavedModel `path` names, or None when it names none.

    Raises:
      CheckpointCorruptError: as `read_variables`.
      StructureMismatchError: the SavedModel holds no variables.
      NotObjectBasedError: a TF1 SavedModel given as its directory.
    """
    directory, found = _named(path)
    if found is None:
        return None
    if not found.entries:
        raise errors.StructureMismatchError(
            f"SavedModel `{_render.safe(directory)}` holds no variables (only functions, "
            "constants or assets): there is nothing to restore from it. Fix: export the model "
            "after it is built (called once or given an input shape), or pass a checkpoint.")
    import tensorflow as tf

    # Keyed by the paths people know only: TF's canonical path through a serving list
    # (`variables/6`) is no key of its own, so it never stays over as "unexpected".
    specs, keys, names = {}, {}, {}
    for shown, _, key, shape, dtype, name in found.entries:
        specs[shown] = (shape, tf.as_dtype(dtype))
        keys[shown] = key
        names[shown] = name
    notes = list(found.notes)
    if not found.optimizer:
        notes.append(f"SavedModel `{_render.safe(directory)}` holds no optimizer state "
                     "(weights only): an optimizer of the obj keeps its values")
    prefix = found.prefix

    def fetch(paths):
        paths = list(paths)
        if not paths:
            return []
        try:
            with tf.device("/cpu:0"):
                return tf.raw_ops.RestoreV2(
                    prefix=prefix, tensor_names=[keys[p] for p in paths],
                    shape_and_slices=[""] * len(paths), dtypes=[specs[p][1] for p in paths])
        except tf.errors.OpError as err:
            raise damaged(directory, "its checkpoint's data is damaged, truncated or "
                           f"missing (from TF: {_render.first_line(err)})") from err

    return {
        "description": f"SavedModel `{_render.safe(directory)}`",
        "kind": "object", "specs": specs, "fetch": fetch,
        "subtree": lambda at: _paths.prefix_subtree(specs, at),
        "top_level_names": list(dict.fromkeys(k.split("/", 1)[0] for k in specs)),
        "prefix": prefix, "notes": tuple(notes), "names": names,
        "structure": lambda: ("savedmodel", tuple(specs.items()), tuple(notes)),
    }


def listing(path: str) -> dict | None:
    """What `_meta.read` lists of the SavedModel `path` names, or None when it names none:
    its variables as (canonical path, path people know, shape, DataType enum, checkpoint key,
    name), with the checkpoint's prefix, validated index and object graph."""
    directory, found = _named(path)
    if found is None:
        return None
    return {"prefix": found.prefix, "notes": found.notes, "index": found.index,
            "graph": found.graph, "description": f"SavedModel `{_render.safe(directory)}`",
            "variables": [(canonical, shown, shape, dtype, key, name)
                          for shown, canonical, key, shape, dtype, name in found.entries]}


def check(path: str) -> tuple:
    """(the SavedModel directory `path` names, the problems of its `saved_model.pb` against
    its checkpoint (`problems`), the checkpoint to verify next (none when missing))."""
    directory = find(path)
    prefix = os.path.join(directory, "variables", "variables")
    return (directory, problems(directory),
            [prefix] if os.path.exists(prefix + ".index") else [])
