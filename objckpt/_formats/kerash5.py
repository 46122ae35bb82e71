"""Keras 3 weights files as sources: `.weights.h5` and the weights inside a `.keras` zip.

Keras 3 `model.save_weights("w.weights.h5")` writes HDF5 with each object's own variables
under `<path>/vars/<i>`: `layers/conv2d/vars/0`, nested `layers/functional/layers/dense/vars/1`,
the optimizer's under `optimizer/vars/<i>` (layer paths come from class names, not layer
names: see `_compat.keras_weights_layout`). `model.save("m.keras")` zips that file as
`model.weights.h5` beside `config.json` and `metadata.json`; `save_weights("w.weights.json",
max_shard_size=...)` splits the HDF5 into shard files `w_00000.weights.h5`, ... named by the
JSON's `weight_map` (read as data; names must be plain file names beside it, and no key may
sit in two shards). Keys here are those HDF5 paths; the obj's variables are found under
the same layout (strategy "keras layout" of a plan).

All are untrusted: the HDF5 is read through `_h5` (structure and every dataset's metadata
checked before data); the zip is checked before a byte is inflated: no absolute or `..`
member names, no symbolic links, no encrypted members, sizes and compression ratios
bounded, the weights member read into memory (bounded) and checked against its declared
size (zipfile checks its CRC). `config.json` is never read: no class is loaded, no code
runs. `metadata.json` is read as JSON data (bounded) for the Keras version only.

Entry points, the format's roles in `_formats.FORMATS`: `recognise(path)` (names and a few
bytes), `listing(path)` (TF-free), `source_fields(path)` and `check(path)`. The last three
return None when `path` is no Keras 3 weights file (a Keras 2 HDF5 file included).
"""

from __future__ import annotations

import json
import os
import stat
import zipfile

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._formats import h5 as _h5

__all__ = ["MAX_MEMBER_BYTES", "MAX_RATIO", "WEIGHTS_MEMBER", "check", "listing",
           "recognise", "source_fields"]

WEIGHTS_MEMBER = "model.weights.h5"
MAX_MEMBER_BYTES = 1 << 36  # 64 GiB: the weights member is read into memory
MAX_RATIO = 100  # inflated bytes per compressed byte, above _RATIO_FLOOR
_RATIO_FLOOR = 1 << 24
_MAX_MEMBERS = 100_000
_MAX_METADATA = 1 << 16
_MAX_SHARD_INDEX = 1 << 26
_ZIP_MAGIC = b"PK\x03\x04"


class _Opened:
    """A Keras 3 weights file found at a path: its HDF5 parts (one, or a sharded file's
    shards), how to (re)open each, and what it is called."""

    def __init__(self, path: str, description: str, parts: list, notes=()):
        self.path, self.description, self.notes = path, description, tuple(notes)
        self.parts = parts  # [(path of an HDF5 file, or its bytes with the name shown)]

    def h5(self, part: int = 0) -> _h5.H5File:
        where = self.parts[part]
        if isinstance(where, str):
            return _h5.open_file(where)
        return _h5.open_bytes(where[0], where[1])

    def datasets(self) -> dict:
        """{key: (part, Dataset)} of every part, in Keras's order; a key in two shards is
        an error (Keras would read one of them)."""
        found: dict = {}
        for part in range(len(self.parts)):
            with self.h5(part) as h5:
                for key, dataset in h5.datasets().items():
                    if key in found:
                        raise _refused(self.path, None, f"lists `{_render.safe(key)}` in two "
                                       "shard files")
                    found[key] = (part, dataset)
        return _ordered(found)


def recognise(path: str) -> bool:
    """Whether `path` is a Keras 3 weights file by its first bytes (a zip; HDF5 without
    Keras 2's layout) or by its name (`.weights.h5`, `.keras`, a sharded `.weights.json`;
    `_find` refuses a damaged one). Reads an HDF5 file's root attributes only; never raises."""
    if _bundle.regular_file_problem(path) is not None:
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return False
    if head == _h5.SIGNATURE:
        try:
            with _h5.open_file(path) as h5:
                return not _keras2_layout(h5)
        except errors.ObjckptError:
            return True  # damaged: `_find` says how
    return (head.startswith(_ZIP_MAGIC) or os.path.basename(path).endswith(
        (".weights.h5", ".keras", ".weights.json")))


def _keras2_layout(h5) -> bool:
    """Whether an HDF5 file is in Keras 2 / tf_keras's layout: `model_weights/<layer>/...`
    or the root attribute `layer_names` (which Keras splits when long: `layer_names0`, ...)."""
    return h5.has("model_weights") or any(
        h5.attr_strings("", name) is not None for name in ("layer_names", "layer_names0"))


def _find(path: str) -> _Opened | None:
    """The Keras 3 weights file at `path`, or None when `path` is in another format."""
    if _bundle.regular_file_problem(path) is not None:
        return None  # a directory or a prefix: TF checkpoints, SavedModels
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    if head.startswith(_ZIP_MAGIC):
        if not path.endswith(".keras") and not _has_member(path, WEIGHTS_MEMBER):
            return None
        data, notes = _zip_weights(path)
        return _Opened(path, f"Keras 3 model file `{path}` (its {WEIGHTS_MEMBER}; "
                             "config.json not loaded)",
                       [(data, f"{path}:{WEIGHTS_MEMBER}")], notes)
    if path.endswith(".weights.json"):
        shards = _shards(path)
        return _Opened(path, f"Keras 3 sharded weights `{path}` ({len(shards)} shard "
                             f"file{'s' * (len(shards) != 1)})", shards)
    if head != _h5.SIGNATURE:
        if os.path.basename(path).endswith((".weights.h5", ".keras")):
            raise _refused(path, None, "starts with neither HDF5's signature nor a zip's; "
                                        "it is damaged or no Keras file")
        return None
    with _h5.open_file(path) as h5:
        if _keras2_layout(h5):
            return None  # Keras 2 / tf_keras HDF5: model_weights/<layer>/<layer>/kernel:0
    return _Opened(path, f"Keras 3 weights file `{path}`", [path])


def _shards(path: str) -> list[str]:
    """The shard files a sharded `.weights.json` names (`save_weights(..., max_shard_size=)`):
    plain file names beside it, checked before any is opened."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(_MAX_SHARD_INDEX + 1)
        if len(text) > _MAX_SHARD_INDEX:
            raise _refused(path, None, f"is larger than {_MAX_SHARD_INDEX:,} bytes")
        index = json.loads(text)
    except (OSError, ValueError, RecursionError) as err:
        raise _refused(path, None, f"is no JSON shard index ({_render.first_line(err)})"
                       ) from err
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise _refused(path, None, "has no `weight_map` object")
    names: dict = {}
    for value in weight_map.values():
        for name in value if isinstance(value, list) else [value]:
            if not isinstance(name, str) or not name.endswith(".h5") or name != \
                    os.path.basename(name) or "\\" in name or "\0" in name or \
                    name.startswith("."):
                raise _refused(path, None, f"names the shard `{_render.safe(str(name))}`; "
                                           "expected a file name beside it (`*.h5`)")
            names.setdefault(name, None)
    if not names or len(names) > _MAX_MEMBERS:
        raise _refused(path, None, f"names {len(names):,} shard files")
    return [os.path.join(os.path.dirname(path), name) for name in names]


def _has_member(path: str, name: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return name in archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _zip_problem(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    if ".." in parts:
        return "climbs out of the archive (`..`)"
    if "\0" in name:
        return "holds a NUL character"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "is a symbolic link"
    if info.flag_bits & 0x1:
        return "is encrypted"
    if info.file_size > MAX_MEMBER_BYTES:
        return f"claims {info.file_size:,} bytes (at most {MAX_MEMBER_BYTES:,} are read)"
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > _RATIO_FLOOR and \
            info.file_size > MAX_RATIO * max(info.compress_size, 1):
        return (f"inflates {info.compress_size:,} bytes to {info.file_size:,} (more than "
                f"{MAX_RATIO}x: a zip bomb)")
    return None


def _refused(path: str, member: str | None, problem: str) -> errors.CheckpointCorruptError:
    where = f"`{_render.safe(path)}`" + (f": member `{_render.safe(member)}`" if member else "")
    return errors.CheckpointCorruptError(
        f"Keras file {where} {problem}. objckpt reads no such file; nothing was changed. "
        "Fix: use a `.keras` file written by Keras's `model.save`, or its weights saved with "
        "`model.save_weights(\"w.weights.h5\")`.", source=path)


def _zip_weights(path: str) -> tuple[bytes, tuple]:
    """The bytes of the weights member of a `.keras` zip, every member checked first."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise _refused(path, None, f"is not a readable zip archive ({_render.first_line(err)})"
                        ) from err
    with archive:
        infos = archive.infolist()
        if len(infos) > _MAX_MEMBERS:
            raise _refused(path, None, f"holds {len(infos):,} members")
        for info in infos:
            problem = _zip_problem(info)
            if problem is not None:
                raise _refused(path, info.filename, problem)
        found = [info for info in infos if info.filename == WEIGHTS_MEMBER]
        if len(found) != 1:
            other = any(i.filename == "model.weights.npz" for i in infos)
            raise _refused(path, None, "holds its weights as `model.weights.npz`, which "
                            "objckpt does not read" if other else
                            f"holds {len(found)} members named `{WEIGHTS_MEMBER}` (expected 1)")
        notes = _keras_version(archive, infos)
        info = found[0]
        try:
            with archive.open(info) as member:
                data = member.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError,
                NotImplementedError) as err:
            raise _refused(path, info.filename, f"cannot be read ({_render.first_line(err)})"
                            ) from err
        if len(data) != info.file_size:
            raise _refused(path, info.filename, f"holds {len(data):,} bytes, not the "
                            f"{info.file_size:,} its header declares")
    return data, notes


def _keras_version(archive, infos) -> tuple:
    """A note naming the Keras version from `metadata.json` (plain JSON data), if any."""
    meta = [i for i in infos if i.filename == "metadata.json" and i.file_size <= _MAX_METADATA]
    if len(meta) != 1:
        return ()
    try:
        found = json.loads(archive.read(meta[0]))
    except (ValueError, OSError, zipfile.BadZipFile, RuntimeError, RecursionError):
        return ()
    version = found.get("keras_version") if isinstance(found, dict) else None
    return (f"written by Keras {_render.safe(version[:40])}",) if isinstance(version, str) \
        else ()


def source_fields(path: str) -> dict | None:
    """A Keras 3 `.weights.h5` or `.keras` as the fields of a `_sources.Source`.

    Returns None when `path` is not such a file.

    Raises:
      CheckpointCorruptError: the file is damaged or hostile (names the member or dataset).
    """
    opened = _find(path)
    if opened is None:
        return None
    import tensorflow as tf  # only here: the sources' specs and values are TF's

    located = opened.datasets()
    every = {key: dataset for key, (_, dataset) in located.items()}
    # One entry per variable: a wrapper optimizer's key, read from its inner copy.
    read_as = {outer: inner for inner, outer in inner_optimizer_copies(every).items()}
    read_as.update(_compat.delegated_copies(every))  # TextVectorization's lookup's, too
    copies = set(read_as.values())
    datasets = {key: dataset for key, dataset in every.items() if key not in copies}
    specs = {key: (d.shape, tf.as_dtype(d.dtype)) for key, d in datasets.items()}

    def fetch(keys) -> list:
        values: dict = {}
        wanted = {key: read_as.get(key, key) for key in keys}
        for part in sorted({located[read][0] for read in wanted.values()}):
            with opened.h5(part) as h5:
                for key, read in wanted.items():
                    if located[read][0] == part and key not in values:
                        values[key] = _tensor(tf, h5.read(every[read]), every[read].dtype)
        return [values[key] for key in keys]

    top = list(dict.fromkeys(key.split("/", 1)[0] for key in datasets))
    return {"description": opened.description, "kind": "object", "specs": specs,
            "fetch": fetch, "subtree": lambda at: _paths.prefix_subtree(datasets, at),
            "top_level_names": top, "prefix": path,
            "notes": tuple(opened.notes) + ((
                f"{len(read_as)} optimizer variables are saved twice (a LossScaleOptimizer's "
                "list and its inner optimizer's); each is one entry, read from the inner "
                "copy, which Keras's loader assigns last",) if read_as else ()),
            "structure": lambda: ("keras3 weights", tuple(
                (key, d.shape, d.dtype) for key, d in datasets.items()))}


def inner_optimizer_copies(datasets: dict) -> dict:
    """{key of an inner optimizer's variable: key of the same variable in its wrapper's list}.

    A Keras 3 `LossScaleOptimizer` saves its `variables` (its own, then its inner
    optimizer's) as `optimizer/vars/<i>`, and Keras's walk then saves the inner optimizer
    again as `optimizer/inner_optimizer/vars/<j>`: two copies of each inner variable, written
    at once. A source shows each variable once, by the wrapper's key (the one the obj's
    layout has), and reads it from the inner copy: the value Keras's loader assigns last.
    Only where the inner list is exactly the tail of the wrapper's, shape for shape and
    dtype for dtype; else the inner entries stay entries of their own (and match nothing).
    """
    lists: dict = {}
    for key in datasets:
        head, _, index = key.rpartition("/vars/")
        if head and index.isdigit() and (head == "optimizer" or head.startswith("optimizer/")):
            lists.setdefault(head, {})[int(index)] = key
    out: dict = {}
    for head, inner in lists.items():
        if not head.endswith("/inner_optimizer") or head.rpartition("/")[0] not in lists:
            continue
        outer = lists[head.rpartition("/")[0]]
        n, m = len(inner), len(outer)
        if sorted(inner) != list(range(n)) or sorted(outer) != list(range(m)) or n > m:
            continue
        pairs = [(inner[j], outer[m - n + j]) for j in range(n)]
        if all((datasets[a].shape, datasets[a].dtype) == (datasets[b].shape, datasets[b].dtype)
               for a, b in pairs):
            out.update(pairs)
    return out


def _ordered(datasets: dict) -> dict:
    """Datasets in Keras's order: `vars/2` before `vars/10` (HDF5 lists them by text)."""
    def key(path: str):
        return [(0, int(edge), "") if edge.isdigit() else (1, 0, edge)
                for edge in path.split("/")]
    return {path: datasets[path] for path in sorted(datasets, key=key)}


def _tensor(tf, value, dtype: str):
    # bfloat16 arrives as ml_dtypes' type: viewed as the one this TF takes (TF 2.12's own)
    return tf.constant(_compat.tf_array(value) if dtype == "bfloat16" else value)


def listing(path: str) -> dict | None:
    """The file's datasets as variables for `_meta.read` (TF-free), or None.

    Each variable is (path, shown, shape, DataType enum, key, name): the HDF5 path is the
    path, the shown path and the key; Keras 3 files save no variable names.
    """
    opened = _find(path)
    if opened is None:
        return None
    datasets = {key: dataset for key, (_, dataset) in opened.datasets().items()}
    return {"prefix": path, "notes": tuple(opened.notes), "index": None, "graph": None,
            "description": opened.description,
            "variables": [(key, key, d.shape, _h5.DATATYPES[d.dtype], key, "")
                          for key, d in datasets.items()]}


def check(path: str) -> tuple | None:
    """Reads every dataset once (for `objckpt.verify`).

    Returns None when `path` is not a Keras 3 weights file, else (datasets read, bytes read,
    [(entry, problem)], notes); a file that cannot be opened at all is one problem.
    """
    try:
        opened = _find(path)
    except errors.CheckpointCorruptError as err:
        if not os.path.basename(path).endswith((".keras", ".weights.h5", ".weights.json")):
            return None  # maybe another format's damaged file: its checker says
        return 0, 0, [("", _render.first_line(err))], ()
    if opened is None:
        return None
    count, nbytes, problems = 0, 0, []
    for part in range(len(opened.parts)):
        try:
            with opened.h5(part) as h5:
                for key, dataset in h5.datasets().items():
                    try:
                        h5.read(dataset)
                    except errors.CheckpointCorruptError as err:
                        problems.append((key, _render.first_line(err)))
                        continue
                    count += 1
                    nbytes += dataset.nbytes
        except errors.CheckpointCorruptError as err:
            problems.append(("", _render.first_line(err)))
    return count, nbytes, problems, (f"{opened.description}", *opened.notes)
