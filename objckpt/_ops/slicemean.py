"""Partitioned entries (a sharded variable: one key, one slice per shard) in the model-free
average, without TensorFlow.

A source stores a key whole or in slices (`layout`: each slice's extents and the key it is
read under, a whole entry one slice). The output keeps the first source's layout:

- every source sliced the same way (the same extents, in any order): each slice's mean
  streamed over the sources' matching slices (`meanstream.stream_mean`: memory a window);
- otherwise each output slice is gathered from the overlapping slices of each source
  (`resliced_mean`: memory the output slice in float64 and one source slice at a time).

Both add the sources' weighted values in float64 in source order and round once, as the
whole-tensor mean does: an element's result does not depend on the layouts.
"""

from __future__ import annotations

import numpy as np

from objckpt._ops.meanstream import Workspace, stream_mean

__all__ = ["Layout", "bounds", "missing", "resliced_mean", "same_layout", "streamed_mean",
           "tiles"]


class Layout:
    """How one source stores `key`: `parts`, [(extents, read key)] in its index's order (a
    whole entry: one part of full extents, read under `key`), and `sliced`."""

    __slots__ = ("parts", "shape", "sliced")

    def __init__(self, index, key: str):
        entry = index.entries[key]
        self.shape, self.sliced = tuple(entry.shape), bool(entry.slices)
        self.parts = ([(tuple(extents), (key, tuple(extents))) for extents in entry.slices]
                      if entry.slices else [(tuple((0, -1) for _ in entry.shape), key)])

    def spans(self) -> dict:
        """{concrete bounds ((start, stop) per axis): read key} of every part."""
        return {bounds(extents, self.shape): read for extents, read in self.parts}


def bounds(extents, shape) -> tuple:
    """(start, stop) per axis of a slice's extents (length -1: the whole axis)."""
    return tuple((0, dim) if length == -1 else (start, start + length)
                 for (start, length), dim in zip(extents, shape))


def missing(index, key: str) -> list:
    """The extents the entry of `key` lists whose slice entry the index does not hold."""
    return [extents for extents in index.entries[key].slices
            if (key, tuple(extents)) not in index.sliced]


def tiles(layout: Layout) -> bool:
    """Whether the slices cover the tensor once: disjoint, their sizes adding up to it."""
    spans = list(layout.spans())
    whole = _size(tuple((0, dim) for dim in layout.shape))
    if len(spans) != len(layout.parts) or sum(_size(s) for s in spans) != whole:
        return False
    return not any(all(max(a, c) < min(b, d) for (a, b), (c, d) in zip(x, y))
                   for i, x in enumerate(spans) for y in spans[i + 1:])


def same_layout(layouts: list) -> bool:
    """Whether every source stores the key in the same slices as the first."""
    first = set(layouts[0].spans())
    return all(set(layout.spans()) == first for layout in layouts[1:])


def _size(span) -> int:
    return int(np.prod([stop - start for start, stop in span], dtype=np.int64))


def streamed_mean(files: list, layouts: list, span, shares, dtypes, dtype,
                  workspace: Workspace):
    """The mean of the slice at `span` of sources sliced alike, as bytes of `dtype` (a view
    of the workspace's output buffer), streamed a window at a time."""
    size = _size(span)
    streams = [(shares[k], files[k].stream(layout.spans()[span], dtypes[k], workspace))
               for k, layout in enumerate(layouts) if shares[k]]
    out = workspace.out(size * dtype.itemsize)
    stream_mean(streams, size, out.view(dtype))
    return out


def _read_whole(file, read_key, dtype, shape):
    values = np.empty(int(np.prod(shape, dtype=np.int64)), dtype)
    for start, piece in file.pieces(read_key, dtype):
        values[start:start + piece.size] = piece
    return values.reshape(shape)


def resliced_mean(files: list, layouts: list, span, shares, dtypes, dtype,
                  workspace: Workspace):
    """The mean of the region `span` of sources sliced differently, as bytes of `dtype`:
    each source's slices overlapping it read one at a time (checksums checked) and their
    overlap weighted into a float64 accumulator of the region, rounded once."""
    shape = tuple(stop - start for start, stop in span)
    acc = workspace.acc(_size(span)).reshape(shape)
    first = True
    for k, layout in enumerate(layouts):
        if not shares[k]:
            continue
        weight = np.float64(shares[k])
        for part, read_key in layout.spans().items():
            cut = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(span, part))
            if any(start >= stop for start, stop in cut):
                continue
            values = _read_whole(files[k], read_key, dtypes[k],
                                 tuple(stop - start for start, stop in part))
            src = values[tuple(slice(a - p, b - p) for (a, b), (p, _) in zip(cut, part))]
            dst = acc[tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(cut, span))]
            if first:  # every element gets one value per source (slices tile the tensor)
                np.multiply(src, weight, out=dst, dtype=np.float64)
            else:
                dst += np.multiply(src, weight, dtype=np.float64)
            del values, src
        first = False
    out = workspace.out(_size(span) * dtype.itemsize)
    out.view(dtype)[...] = acc.reshape(-1)
    return out
