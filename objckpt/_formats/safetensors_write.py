"""safetensors written: the format's write role (`objckpt.export` gives it the tensors).

The file holds the bytes the reference writer (the `safetensors` library) writes for the
same tensors: an 8-byte little-endian header length, a compact JSON header (`__metadata__`
first, then one entry per tensor: dtype, shape, data_offsets), padded with spaces to a
multiple of 8 bytes, then the tensors' little-endian bytes back to back, in the reference's
order (by dtype, widest first, then by name) so that every tensor starts aligned to its
item size. Sharded output follows Hugging Face:
`model-00001-of-0000N.safetensors` and `model.safetensors.index.json`
(`metadata.total_size`, `weight_map`). Files are written under temporary names and
renamed, the index last.

A tensor to write is anything with `dtype` (TF's dtype name), `shape`, `nbytes` and
`array(shown)` (its little-endian C-contiguous NumPy value, made when it is written, so
peak memory stays near the largest tensor). No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import re
import uuid

import numpy as np

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import remote as _remote

__all__ = ["DTYPES", "INDEX_SUFFIX", "ITEMSIZE", "RANK", "SUFFIX", "header_metadata",
           "layout", "shard_size", "write"]

SUFFIX = ".safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
# TF dtype name -> safetensors dtype; float8 needs TF >= 2.13 (ml_dtypes).
DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "float64": "F64", "int64": "I64", "uint64": "U64", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
# The reference writer's dtype order (its enum's; the data is laid out in descending order,
# so every tensor starts aligned to its item size).
RANK = {name: rank for rank, name in enumerate(
    ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
     "F32", "F64", "I64", "U64"])}
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
            "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def shard_size(value, path: str) -> int | None:
    """max_shard_size in bytes: an int, or a string such as "5GB" (10**9) or "2GiB"."""
    if value is None:
        return None
    size = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        found = re.fullmatch(r"\s*(\d+)\s*([KMGT]I?B|B)?\s*", value.upper())
        if found:
            size = int(found.group(1)) * _UNITS[found.group(2) or ""]
    if size is None or size <= 0:
        raise errors.InvalidArgumentError(
            f"max_shard_size must be a positive number of bytes or a size such as "
            f"'5GB' or '2GiB'. Received: max_shard_size={value!r}. Fix: pass e.g. "
            "max_shard_size='5GB' (Hugging Face's default), or None for one file.", source=path)
    return size


def header_metadata(metadata, path: str) -> dict:
    """The header's `__metadata__`: {"format": "pt"} (what Hugging Face loaders require),
    then the user's str -> str pairs (which may replace "format")."""
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise errors.InvalidArgumentError(
            f"metadata must be a dict of str -> str (safetensors' __metadata__). "
            f"Received: metadata={metadata!r}. Fix: convert the values to strings, "
            "e.g. metadata={'step': str(step)}.", source=path)
    return {"format": "pt", **(metadata or {})}


def layout(path: str) -> tuple[str, str]:
    """(directory, stem): `d/name.safetensors` -> (d, name); a folder -> (folder, "model")."""
    shown = _render.safe(path)
    if _remote.is_remote(path):
        raise errors.InvalidArgumentError(
            f"objckpt.export writes local files; `{shown}` is a URL. Fix: export to "
            "a local folder, then upload it (e.g. with huggingface_hub or gsutil).", source=path)
    if path.endswith(INDEX_SUFFIX):
        raise errors.InvalidArgumentError(
            f"`{shown}` names the index of a sharded export; export writes it "
            "itself. Fix: pass the folder (or `<folder>/model.safetensors`) with "
            "max_shard_size=...", source=path)
    if path.endswith(SUFFIX):
        if os.path.isdir(path):
            raise errors.InvalidArgumentError(
                f"`{shown}` is a directory, not a file. Fix: pass a file name such "
                f"as `{_render.safe(os.path.join(path, 'model.safetensors'))}`.", source=path)
        directory, name = os.path.split(path)
        return directory, name[: -len(SUFFIX)]
    return path, "model"


def _header(tensors: dict, metadata: dict) -> tuple[bytes, list]:
    """(header bytes, tensors in data order), as the reference writer lays them out: the
    tensors sorted by dtype (`RANK`, widest first) then name, the header listing them in
    that order after `__metadata__`, compact JSON padded with spaces to 8 bytes."""
    order = sorted(tensors, key=lambda n: (-RANK[DTYPES[tensors[n].dtype]], n))
    header, start = {"__metadata__": metadata}, 0
    for name in order:
        tensor = tensors[name]
        header[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [start, start + tensor.nbytes]}
        start += tensor.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return len(text).to_bytes(8, "little") + text, [tensors[n] for n in order]


def _shards(arrays: dict, limit: int | None) -> list[dict]:
    """Hugging Face's split: names in order, a new shard when the next tensor would pass
    the limit (a tensor larger than the limit gets a shard of its own)."""
    shards, size = [{}], 0
    for name in sorted(arrays):
        nbytes = arrays[name].nbytes
        if limit is not None and shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = arrays[name]
        size += nbytes
    return shards


def _temp(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:12]}")


def _write_file(path: str, tensors: dict, metadata: dict, shown: str) -> None:
    """One safetensors file; each tensor transformed, written and let go in turn (peak
    memory near the largest tensor, not the model)."""
    header, ordered = _header(tensors, metadata)
    with open(path, "wb") as f:
        f.write(header)
        for tensor in ordered:
            array = tensor.array(shown)
            if array.size:
                f.write(array.reshape(-1).view(np.uint8))


def _stale_shards(directory: str, stem: str) -> list[str]:
    pattern = re.compile(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if pattern.fullmatch(n)]


def _remove(path: str) -> None:
    if os.path.lexists(path):
        os.remove(path)


def _write(directory: str, stem: str, shards: list[dict], metadata: dict, shown: str) -> str:
    """Writes the files under temporary names, then renames them: the old index is removed
    first (it never describes new shards), stale shards next, the new index last."""
    single = len(shards) == 1
    index_path = os.path.join(directory, stem + INDEX_SUFFIX)
    if single:
        names = [stem + SUFFIX]
    else:
        names = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}{SUFFIX}" for i in range(len(shards))]
    finals = [os.path.join(directory, n) for n in names]
    temps = [_temp(p) for p in finals]
    index_temp = None
    try:
        for temp, arrays in zip(temps, shards):
            _write_file(temp, arrays, metadata, shown)
        if not single:
            weight_map = {name: file for file, arrays in zip(names, shards) for name in arrays}
            index = {"metadata": {"total_size": sum(a.nbytes for s in shards
                                                    for a in s.values())},
                     "weight_map": dict(sorted(weight_map.items()))}
            index_temp = _temp(index_path)
            with open(index_temp, "w", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        _remove(index_path)
        for stale in _stale_shards(directory, stem):
            if stale not in finals:
                _remove(stale)
        if not single:
            _remove(os.path.join(directory, stem + SUFFIX))  # HF loaders would prefer it
        for temp, final in zip(temps, finals):
            os.replace(temp, final)
        if index_temp is not None:
            os.replace(index_temp, index_path)
    finally:
        for temp in [*temps, index_temp]:
            if temp is not None and os.path.lexists(temp):
                os.remove(temp)
    return finals[0] if single else index_path


def write(path: str, tensors: dict, *, max_shard_size=None, metadata=None) -> str:
    """Writes `tensors` ({name: tensor to write}, see the module docstring) as safetensors.

    Args:
      path: `<folder>/<name>.safetensors`, or a folder (`<folder>/model.safetensors`);
        missing folders are created.
      tensors: {name: tensor to write}.
      max_shard_size: None (one file), or bytes / a size such as "5GB" (`shard_size`).
      metadata: str -> str pairs added to the header's `__metadata__` (`header_metadata`).

    Returns:
      The path of the file written, or of the index when sharded.

    Raises:
      InvalidArgumentError: a bad path, shard size or metadata.
      CheckpointWriteError: the files cannot be written; nothing under `path` changed.
    """
    directory, stem = layout(path)
    limit = shard_size(max_shard_size, path)
    header = header_metadata(metadata, path)
    try:
        if directory:
            os.makedirs(directory, exist_ok=True)
        return _write(directory, stem, _shards(tensors, limit), header, path)
    except OSError as err:
        raise errors.CheckpointWriteError(
            f"Cannot write safetensors to `{_render.safe(path)}`: {_render.first_line(err)}. "
            "Expected a writable folder. Files already there were left as they were. Fix: "
            "pass a path in a folder you can write to.", prefix=path, source=path) from err
