"""Sources: what values come from, opened for planning without reading tensor data.

A source is a `Snapshot`, or a path in a registered format (`_formats`: an object-based or
TF1 name-based checkpoint prefix or directory, safetensors, Keras HDF5 and `.keras` files,
SavedModel folders); each is opened into a `Source`: its keys with shapes and dtypes, a
reader, the subtree under an `at`, the names it saved, and the owners of its optimizer
entries. Paths are opened by their format's `open` role, through the registry alone.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._formats import checkpoint as _checkpoint
from objckpt._formats import registry as _formats

__all__ = ["BOOKKEEPING", "Source", "keras3_slot_owners", "open_source", "snapshot_source"]

# Entries tf.train.Checkpoint or Saver add for themselves; never "unexpected".
BOOKKEEPING = frozenset({"save_counter", _compat.OBJECT_GRAPH_KEY})


@dataclasses.dataclass
class Source:
    """A source opened for matching: keys with shapes and dtypes, and a reader.

    kind is "object" (an object-based checkpoint), "name" (a TF1 name-based
    checkpoint) or "snapshot". `fetch(keys)` returns the tensors of those keys.
    """

    description: str
    kind: str
    specs: dict  # key -> (shape tuple, tf.DType)
    fetch: Callable
    subtree: Callable  # at -> {key within at: key}
    top_level_names: list
    prefix: str | None = None
    notes: tuple[str, ...] = ()
    names: dict = dataclasses.field(default_factory=dict)  # key -> variable name when saved
    # Extra keys for the same tensors: a variable's path through the network when its
    # canonical path runs through an optimizer (a trained Keras 3 model).
    aliases: dict = dataclasses.field(default_factory=dict)
    # Returns everything planning reads but `names`, hashable: two sources with equal
    # structures get the same plan for the same obj unless their saved names decide it
    # (optimizer state that moves, the "keras name" strategy); load_ensemble plans once
    # per structure only with optimizer_state=False and a path match. Computed on
    # request only. None: unknown.
    structure: Callable | None = None
    # Returns {key: (key of the variable it belongs to, slot role)} for the optimizer
    # entries whose owner the source itself records (slot tables, saved names, Keras 3
    # variable lists), so optimizer state moves by owner, never by position.
    owners: Callable = lambda: {}
    # Whether keys are object paths of the obj that wrote them (TF checkpoints, Snapshots),
    # so `restore_on_create` can wait for each by path; False for the other formats, whose keys
    # reach variables through the plan's strategies (names, layouts, structure).
    keyed_by_path: bool = True
    # TF checkpoints only: the checkpoint keys of a list of source keys, for reading them
    # with `_fastio` (checksums first, then one tensor at a time).
    bundle_keys: Callable | None = None
    # Formats that read one tensor at a time (safetensors): `stream(pairs, assign_to,
    # convert)` over `(key, variable, label, transform)` gives a loader (`specs`: None when a
    # transform's output is not known from metadata; `verify()`, `assign()`, `close()`).
    stream: Callable | None = None
    # Keras 2 HDF5 files: ((layer, (its keys in `weight_names` order)), ...) for the layers
    # with weights, in the file's order: what "topological order" pairs with the obj's layers.
    h5_layers: tuple = ()
    # `holding(wanted)`: the top-level names whose subtree may hold every path of `wanted`
    # ({path: (shape tuple, dtype)}): a necessary condition, found in one pass over the
    # names (what `_match` tries as `at=` when the obj does not fit the root, so a source
    # of 200,000 top-level names costs linear time). None: every top-level name may.
    holding: Callable | None = None
    # {key: how its tensor is stored} of the keys a TF checkpoint stores in slices (a TF1
    # partitioned variable, a sharded one): "saved in 3 parts of rows [0:4) [4:7) [7:10)",
    # shown beside the key in plans; still one logical tensor, read whole or by slice.
    parts: dict = dataclasses.field(default_factory=dict)


def _top_names(keys) -> list[str]:
    return list(dict.fromkeys(k.split("/", 1)[0] for k in keys if "/" in k))


# The TF checkpoint's reading lives with its format (`_formats.checkpoint`).
keras3_slot_owners = _checkpoint.keras3_slot_owners


def snapshot_source(items: dict, aliases: dict | None = None, owners=None) -> Source:
    """A Source over an in-memory mapping path -> tensor (a Snapshot).

    aliases: extra key -> key in items (network paths of a trained Keras 3 model).
    owners: returns {slot path: (owner path, role)} of the obj it was taken from.
    """
    aliases = {a: k for a, k in (aliases or {}).items() if k in items and a not in items}
    specs = {path: (tuple(value.shape), value.dtype) for path, value in items.items()}
    for alias, key in aliases.items():
        specs[alias] = specs[key]
    top_names = _top_names(specs)
    # a sharded variable's value, held shard by shard: its layout beside it in plans
    parts = {path: f"held in {value.layout.describe()}" for path, value in items.items()
             if _compat.is_sharded_value(value)}
    return Source("Snapshot", "snapshot", specs,
                  lambda paths: [items[aliases.get(p, p)] for p in paths],
                  lambda at: _paths.prefix_subtree(specs, at), top_names, aliases=aliases,
                  structure=lambda: ("snapshot", tuple(specs.items()),
                                     tuple(aliases.items())),
                  owners=owners or (lambda: {}),
                  holding=lambda wanted: _paths.prefix_holding(specs, top_names, wanted),
                  parts=parts)


def open_source(source) -> Source:
    """Opens a Snapshot, prefix or directory; name-based prefixes included; a file or
    folder of another format through its `_formats` entry."""
    as_source = getattr(source, "as_source", None)
    if callable(as_source):
        return as_source()
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise errors.UnsupportedFormatError(
            "A source must be an objckpt.Snapshot, a checkpoint prefix or a directory of "
            f"checkpoints. Received: source of type {type(source).__name__}. Fix: pass "
            "objckpt.snapshot(obj) or a path.")
    found = _formats.dispatch("open", source)
    if isinstance(found, Source):
        return found
    # A format's fields (`_formats`: they know nothing of `Source`). Unless a format says
    # otherwise (the TF checkpoint's are keyed by object path, its subtrees found through its
    # graph), keys reach variables through the plan's strategies, and subtrees are key
    # prefixes (`_paths.prefix_subtree` over the specs' keys), so the names that may hold the
    # obj are found in one pass, as for a Snapshot.
    specs, top = found["specs"], found["top_level_names"]
    return Source(**{"keyed_by_path": False,
                     "holding": lambda wanted: _paths.prefix_holding(specs, top, wanted),
                     **found})
