"""Keras 2 / tf_keras HDF5 weights and `.h5` full models as sources, read as untrusted input.

`model.save_weights("w.h5")` (Keras 2 of TF 2.12-2.15, tf_keras) writes, at the file's
root, the attribute `layer_names` (the model's top-level layers) and a group per layer whose
attribute `weight_names` lists its weights (`conv/kernel:0`; a nested model's `dense/kernel:0`,
a subclassed model's `my_model/conv/kernel:0`), each a dataset at `<layer>/<weight name>`;
a model's own weights (in no layer) sit in the group `top_level_model_weights`.
`model.save("m.h5")` writes the same under `model_weights/`, its optimizer's variables under
`optimizer_weights/` (attribute `weight_names`: `Adam/m/conv/kernel:0` and `iteration:0`
for the 2.11+ optimizers, `Adam/conv/kernel/m:0` and `Adam/iter:0` for the legacy ones,
`adam/conv_kernel_momentum` when Keras 3 writes this layout), and its config as JSON text
(`model_config`, `training_config`), which is never read: only weights are. A file is this
format by its content (`layer_names`), not its extension; Keras 3's `.weights.h5` (groups
`layers/.../vars`) is not. A layer name with `/` (tf_keras MobileNetV3's `Conv/BatchNorm`) is
groups nested in groups, as h5py writes it (`Conv/BatchNorm/Conv/BatchNorm/gamma:0`).

Keys: `<layer>/<weight name relative to the layer>` without `:0` (`conv/kernel`,
`head/dense/kernel` for the nested model `head`), the path of layer names Keras writes;
`objckpt._planning.targets` finds the same key for an obj's variables (strategy "layer name"),
in every flavour. `names` are the weight names as saved (`dense/kernel`), for the "name" and
"keras name" strategies. Optimizer variables are `optimizer/<name>` (the step counter
`iteration` as `.../iterations`, the name the planner knows), each with the weight it belongs
to (by the weight names, never by position). `h5_layers` lists the file's layers with weights
in order, each with its keys in `weight_names` order: what "topological order" (`_strategies`)
pairs with an obj's `model.layers` as Keras's `load_weights` does.

Everything here is pure Python over `_h5` (h5py), so the command line lists these files
without TensorFlow; `source_fields` (for `_sources`) imports TF only to make tensors.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from objckpt import errors
from objckpt._base import names as _names
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._formats import h5 as _h5

__all__ = ["Entry", "Layout", "check", "dtype_enum", "listing", "read_layout", "recognise",
           "source_fields", "weight_key"]

# The group of a model's own weights (in no layer), which `layer_names` does not list.
TOP_LEVEL = "top_level_model_weights"
# Keras splits an attribute over 64 KiB into `name0`, `name1`, ... (never an empty one):
# read at most this many (64 MiB of names).
MAX_CHUNKS = 1024


# Per-weight state of Keras 2 / tf_keras optimizers by role: 2.11+ names `<opt>/<role>/<w>`,
# the legacy OptimizerV2 `<opt>/<w>/<role>`; Keras 3 `<opt>/<w with / as _>_<role>`.
_ROLES = tuple(sorted(_names.NAMED_ROLES, key=lambda role: (-len(role), role)))
_ROLE_FIRST = re.compile(r"^(?:[^/]+/)?(?P<role>" + "|".join(_ROLES) + r")/(?P<var>.+)$")
_ROLE_LAST = re.compile(r"^[^/]+/(?P<var>.+)/(?P<role>" + "|".join(_ROLES) + r")$")
_KERAS3_ROLES = _names.KERAS3_ROLES
_ROLE_SUFFIX = re.compile(r"^(?:[^/]+/)?(?P<var>[^/]+)_(?P<role>" + "|".join(_KERAS3_ROLES)
                          + r")$")


class Entry(NamedTuple):
    """One weight of the file: its key, saved name (no `:0`), top-level layer ("" for the
    optimizer's) and validated `_h5.Dataset`."""

    key: str
    name: str
    layer: str
    dataset: _h5.Dataset


class Layout(NamedTuple):
    """What a Keras 2 HDF5 file holds, from its metadata only (see the module docstring).

    Attributes:
      path: the file.
      model: True for a full model (`model.save`), False for `save_weights`.
      keras_version: the `keras_version` attribute, or "".
      entries: {key: Entry} in the file's order (layers as `layer_names` lists them).
      layers: the top-level layers with weights, in order.
      owners: {optimizer key: (key of the weight it belongs to, role)}.
    """

    path: str
    model: bool
    keras_version: str
    entries: dict
    layers: tuple
    owners: dict

    @property
    def description(self) -> str:
        what = "model" if self.model else "weights"
        tail = " (weights only; its config is not read)" if self.model else ""
        return f"Keras 2 HDF5 {what} `{self.path}`{tail}"


def weight_key(layer: str, name: str) -> str:
    """The key of a weight saved under top-level layer `layer` with name `name`.

    The name relative to the layer: after the layer's own name where it appears as whole
    edges (`my_model/conv/kernel` under `conv` -> `conv/kernel`; a name with `/`, as tf_keras
    MobileNetV3's `Conv/BatchNorm`: `Conv/BatchNorm/gamma` -> `Conv/BatchNorm/gamma`), else
    all of it under the layer (`dense/kernel` under `head` -> `head/dense/kernel`). `:0` is
    dropped.
    """
    name = name[:-2] if name.endswith(":0") else name
    start = f"/{name}".find(f"/{layer}/")  # whole edges, first place; linear in the lengths
    if start >= 0 and start + len(layer) + 1 < len(name):
        name = name[start + len(layer) + 1:]
    return f"{layer}/{name}"


def dtype_enum(name: str) -> int:
    """TF's DataType enum of a dtype name `_h5` accepts (`float32` -> 1)."""
    return _h5.DATATYPES[name]


def _fail(path: str, entry: str | None, problem: str) -> errors.CheckpointCorruptError:
    where = f"`{_render.safe(path)}`" + (f" at `{_render.safe(entry)}`" if entry else "")
    return errors.CheckpointCorruptError(
        f"Keras 2 HDF5 file {where} is inconsistent: {problem}. Nothing was read into any "
        "variable. Fix: use an intact copy of the file, or save it again with "
        "model.save_weights.", source=path)


def _strings(h5, path: str, name: str) -> list[str] | None:
    """A string list attribute, whole or split into `name0`, `name1`, ... as Keras does."""
    found = h5.attr_strings(path, name)
    if found is not None:
        return found
    out: list[str] = []
    for chunk in range(MAX_CHUNKS + 1):
        part = h5.attr_strings(path, f"{name}{chunk}")
        if part is None:
            return out if chunk else None
        if not part:
            raise _fail(h5.shown, path or "/", f"its attribute `{name}{chunk}` is empty (Keras "
                                               "never writes an empty part)")
        out.extend(part)
        if len(out) > _h5.MAX_ATTR_ITEMS:
            raise _fail(h5.shown, path or "/", f"its attribute `{name}` lists more than "
                                               f"{_h5.MAX_ATTR_ITEMS:,} names")
    raise _fail(h5.shown, path or "/", f"its attribute `{name}` is split into more than "
                                       f"{MAX_CHUNKS:,} parts")


def _root(h5) -> str | None:
    """"" (save_weights), "model_weights" (model.save), or None: not this format."""
    for root in ("", "model_weights"):
        if root and not h5.has(root):
            continue
        if h5.attr_strings(root, "layer_names") is not None or \
                h5.attr_strings(root, "layer_names0") is not None:
            return root
    return None


def read_layout(path: str) -> Layout | None:
    """The weights of a Keras 2 HDF5 file, from its metadata; None if it is not one.

    Raises:
      CheckpointCorruptError: the file is damaged or inconsistent (a layer or weight it
        lists is missing, a dataset's dtype or size is impossible), naming the entry.
    """
    if not _h5.looks_like_hdf5(path):
        return None
    with _h5.open_file(path) as h5:
        root = _root(h5)
        if root is None:
            return None
        version = h5.attr_text(root, "keras_version") or ""
        datasets = h5.datasets(root)
        entries: dict = {}
        layers = []
        base = f"{root}/" if root else ""
        layer_names = _strings(h5, root, "layer_names") or []
        if len(set(layer_names)) != len(layer_names):
            raise _fail(path, root or "/", "`layer_names` lists a layer more than once")
        memo: dict = {}
        if _is_group(h5, root, TOP_LEVEL, memo) and TOP_LEVEL not in layer_names:
            layer_names = [*layer_names, TOP_LEVEL]  # the model's own weights, in no layer
        holding = _holders(datasets, base, layer_names)
        for layer in layer_names:
            if not _is_group(h5, root, layer, memo):
                raise _fail(path, root or "/", f"`layer_names` lists layer "
                                               f"`{_render.safe(layer)}`, but the file has "
                                               "no group of that name")
            weights = _weight_names(h5, base + layer, layer in holding)
            for name in weights:
                dataset = datasets.get(f"{base}{layer}/{name}")
                if dataset is None:
                    raise _fail(path, base + layer,
                                f"`weight_names` lists `{_render.safe(name)}`, but there is "
                                f"no dataset `{_render.safe(layer + '/' + name)}`")
                key = weight_key(layer, name)
                if key in entries:  # `x/kernel` and `x/x/kernel` in one layer: keep both
                    key = f"{layer}/{name[:-2] if name.endswith(':0') else name}"
                if key in entries:
                    raise _fail(path, base + layer, f"`weight_names` lists "
                                                    f"`{_render.safe(name)}` twice")
                entries[key] = Entry(key, _bare(name), layer, dataset)
            if weights:
                layers.append(layer)
        owners: dict = {}
        if root and h5.has("optimizer_weights"):
            owners = _optimizer(h5, path, entries)
    return Layout(path, bool(root), version, entries, tuple(layers), owners)


def _is_group(h5, root: str, layer: str, memo: dict) -> bool:
    """Whether the file has the group of `layer` below `root`. A name with `/` (tf_keras
    MobileNetV3's `Conv/BatchNorm`) is groups nested in groups, as h5py makes them; each
    edge is looked up among its parent's subgroups (never a dataset, never a `.`), each
    group listed once (memo: {group: its subgroups})."""
    at = root
    for edge in layer.split("/"):
        if at not in memo:
            memo[at] = frozenset(h5.groups(at))
        if edge not in memo[at]:
            return False
        at = f"{at}/{edge}" if at else edge
    return True


def _holders(datasets: dict, base: str, layer_names: list) -> set:
    """The layers whose own group holds a dataset: for each dataset, the longest listed
    layer name its path starts with (`Conv/BatchNorm/...` is `Conv/BatchNorm`'s, not
    `Conv`'s), walked edge by edge (linear in the path's length)."""
    names = set(layer_names)
    found = set()
    for path in datasets:
        edges = path[len(base):].split("/")
        for end in range(len(edges) - 1, 0, -1):
            layer = "/".join(edges[:end])
            if layer in names:
                found.add(layer)
                break
    return found


def _weight_names(h5, group: str, held: bool) -> list[str]:
    """A layer group's `weight_names`. Keras writes a layer without weights an empty
    numeric array there, which is no text: such a group must hold no dataset either."""
    try:
        weights = _strings(h5, group, "weight_names")
    except errors.CheckpointCorruptError:
        if held:
            raise
        return []
    if weights is None:
        if held:
            raise _fail(h5.shown, group, "the layer's group has no `weight_names`")
        return []
    return weights


def _bare(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def _optimizer(h5, path: str, entries: dict) -> dict:
    """Adds the optimizer's variables to entries; returns their owners."""
    names = _strings(h5, "optimizer_weights", "weight_names") or []
    datasets = h5.datasets("optimizer_weights")
    weights = [e for e in entries.values()]
    by_name = _unique({e.name: e.key for e in weights}, [e.name for e in weights])
    flat = [e.name.replace("/", "_") for e in weights]
    by_flat = _unique(dict(zip(flat, (e.key for e in weights))), flat)
    owners = {}
    for name in names:
        dataset = datasets.get(f"optimizer_weights/{name}")
        if dataset is None:
            raise _fail(path, "optimizer_weights", f"`weight_names` lists "
                                                   f"`{_render.safe(name)}`, but there is "
                                                   "no dataset of that name")
        bare = _bare(name)
        edges = bare.split("/")
        if edges[-1] == "iteration":
            edges[-1] = "iterations"
        key = "/".join(["optimizer", *edges])
        if key in entries:
            raise _fail(path, "optimizer_weights",
                        f"`weight_names` lists `{_render.safe(name)}` twice")
        entries[key] = Entry(key, bare, "", dataset)
        owner = _owner(bare, by_name, by_flat)
        if owner is not None:
            owners[key] = owner
    return owners


def _unique(index: dict, names: list) -> dict:
    """index without the names listed more than once (they say nothing about an owner)."""
    seen, twice = set(), set()
    for name in names:
        (twice if name in seen else seen).add(name)
    return {name: key for name, key in index.items() if name not in twice}


def _owner(name: str, by_name: dict, by_flat: dict):
    """(key of the weight, role) an optimizer variable's name says it belongs to, or None
    when no form of the name, or more than one weight, fits."""
    found = set()
    for pattern, index in ((_ROLE_FIRST, by_name), (_ROLE_LAST, by_name),
                           (_ROLE_SUFFIX, by_flat)):
        match = pattern.match(name)
        if match is not None and match.group("var") in index:
            found.add((index[match.group("var")], match.group("role")))
    return found.pop() if len(found) == 1 else None


# --- the format's roles in `_formats.FORMATS`: recognise, listing, source_fields, check ---

def recognise(path: str) -> bool:
    """Whether `path` may be a Keras 2 HDF5 file: a regular file with HDF5's signature (its
    layout, read by the other roles, then says)."""
    return _h5.looks_like_hdf5(path)


def source_fields(path: str) -> dict | None:
    """The fields of a `_sources.Source` for a Keras 2 HDF5 file, or None if not one."""
    layout = read_layout(path)
    if layout is None:
        return None
    import tensorflow as tf  # tensors only; the layout is read without TF

    entries = layout.entries
    specs = {key: (e.dataset.shape, tf.as_dtype(e.dataset.dtype)) for key, e in entries.items()}

    def fetch(keys) -> list:
        with _h5.open_file(path) as h5:
            values = [h5.read(entries[key].dataset) for key in keys]
        with tf.device("/cpu:0"):
            return [tf.convert_to_tensor(value, dtype=specs[key][1])
                    for key, value in zip(keys, values)]

    grouped: dict = {}
    for key, entry in entries.items():
        if entry.layer:
            grouped.setdefault(entry.layer, []).append(key)
    notes = ()
    if layout.keras_version.startswith("3"):
        notes = (f"written by Keras {layout.keras_version} in the Keras 2 HDF5 layout",)
    layers = tuple((layer, tuple(keys)) for layer, keys in grouped.items())
    return dict(
        description=layout.description, kind="object", specs=specs, fetch=fetch,
        subtree=lambda at: _paths.prefix_subtree(entries, at),
        top_level_names=list(layout.layers) + (
            ["optimizer"] if any(not e.layer for e in entries.values()) else []),
        prefix=path, notes=notes, names={key: e.name for key, e in entries.items()},
        structure=lambda: ("keras2 h5", tuple(specs.items()),
                           tuple(sorted(layout.owners.items())), notes, layers),
        owners=lambda: dict(layout.owners), h5_layers=layers)


def listing(path: str) -> dict | None:
    """The weights of a Keras 2 HDF5 file for `objckpt._inspect.meta.read` (no TF), or None."""
    layout = read_layout(path)
    if layout is None:
        return None
    entries = layout.entries
    return dict(prefix=path, notes=(), index=None, graph=None, description=layout.description,
                variables=[(key, key, entries[key].dataset.shape,
                            dtype_enum(entries[key].dataset.dtype), entries[key].dataset.path,
                            entries[key].name) for key in _grouped(entries)])


def _grouped(keys) -> list[str]:
    """keys in first-seen order with each group's members together (`a/m/x`, `a/v/x`,
    `a/m/y` -> `a/m/x`, `a/m/y`, `a/v/x`), as a tree shows them."""
    rank: dict = {}
    for key in keys:
        parts = key.split("/")
        for i in range(1, len(parts) + 1):
            rank.setdefault("/".join(parts[:i]), len(rank))
    return sorted(keys, key=lambda key: [rank["/".join(key.split("/")[:i])]
                                         for i in range(1, key.count("/") + 2)])


def check(path: str):
    """Reads every weight of a Keras 2 HDF5 file once, or None if it is not one.

    Returns:
      (datasets read intact, their bytes, [(entry, problem)], notes): the file's layout
      problem alone when its metadata cannot be read.
    """
    try:
        layout = read_layout(path)
    except errors.CheckpointCorruptError as err:
        if not _h5.looks_like_hdf5(path):
            raise
        return 0, 0, [("", str(err).splitlines()[0])], []
    if layout is None:
        return None
    problems, count, nbytes = [], 0, 0
    with _h5.open_file(path) as h5:
        for key, entry in layout.entries.items():
            try:
                h5.read(entry.dataset)
            except errors.CheckpointCorruptError as err:
                problems.append((key, str(err).splitlines()[0]))
                continue
            count += 1
            nbytes += entry.dataset.nbytes
    return count, nbytes, problems, [f"{layout.description}: {len(layout.entries)} weights"]
