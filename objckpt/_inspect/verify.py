"""Checking a source on disk without loading a model.

`verify(source)` asks the source's format (`_formats`) to check it. A TF checkpoint
(`_formats.checkpoint_verify`) has every tensor read once (TF checks each one's CRC32C as
it reads it), one tensor at a time, and its object graph checked against the index by the
checks every reader makes, each problem listed in the words a restore refusing it uses:
every node an edge or slot reference names exists, every tensor the graph lists is in the
index, and, asked by `verify` alone, every tensor in the index belongs to the graph and
every object is reachable from the root. A directory means every checkpoint its TF
`checkpoint` state file names, or, without a state file, every checkpoint in it. Nothing
is restored and no model is built. A URL (`gs://`, `s3://`) is listed remotely and each
checkpoint downloaded into a private local copy, checked as on disk.
"""

from __future__ import annotations

import dataclasses
import os

from objckpt import errors
from objckpt._base import render as _render
from objckpt._formats import checkpoint_verify as _checkpoint_verify
from objckpt._formats import registry as _formats
from objckpt._inspect import meta as _meta

__all__ = ["Problem", "VerifyReport", "tensor_problems", "verify"]


# What `verify` says of a tensor that cannot be read, before the reader's own words.
_TENSOR = _checkpoint_verify.TENSOR


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint.

    Attributes:
      prefix: the checkpoint prefix (or the state file) it is about.
      where: the object path, checkpoint key or file concerned ("" for the
        whole checkpoint).
      message: what is wrong, in one line.
    """

    prefix: str
    where: str
    message: str

    @property
    def reason(self) -> str:
        """What is wrong in the words a restore refusing the checkpoint uses (its error
        message holds them): the message without the lead `verify` gives a tensor's."""
        return self.message[len(_TENSOR):] if self.message.startswith(_TENSOR) else self.message

    def __str__(self) -> str:
        # One line whatever the checkpoint's names hold: names through `safe`, the message
        # (which may quote names) through `safe_text`.
        where = f"`{_render.safe(self.where)}`: " if self.where else ""
        return f"{_render.safe(self.prefix)}: {where}{_render.safe_text(self.message)}"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What `objckpt.verify` found (see there).

    Attributes:
      source: the prefix or directory given.
      prefixes: the checkpoints checked.
      tensors: how many tensors were read and passed their checksum.
      nbytes: the bytes of those tensors.
      problems: every problem found, in file order; empty when intact.
      notes: remarks that are not problems (e.g. a name-based checkpoint has
        no object graph to check).
    """

    source: str
    prefixes: tuple[str, ...]
    tensors: int
    nbytes: int
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()
    # What an intact report says was checked: TF checkpoints have checksums and a graph;
    # HDF5 files have neither (every dataset read, its shape and dtype as declared).
    checked: str = "passed their checksums; object graph consistent"

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """One line per problem, then a summary line."""
        lines = [f"problem: {p}" for p in self.problems]
        lines += [f"note: {_render.safe_text(note)}" for note in self.notes]
        checked = _render.safe(", ".join(self.prefixes) or self.source)
        mb = _render.mb(self.nbytes)
        if self.ok:
            lines.append(f"OK: {checked}: {self.tensors:,} tensors ({mb}) {self.checked}")
        else:
            lines.append(f"FAILED: {checked}: {len(self.problems)} problem"
                         f"{'s' * (len(self.problems) != 1)}; {self.tensors:,} tensors "
                         f"({mb}) read intact. Fix: restore from an intact copy or an "
                         "older checkpoint, or write this one again.")
        return "\n".join(lines)


# Shared with `migrate`'s read-back check (`_formats.checkpoint_verify`).
tensor_problems = _checkpoint_verify.tensor_problems


@errors.about_arguments(source="source")
def verify(source) -> VerifyReport:
    """Checks every tensor's checksum and the object graph of a checkpoint on disk.

    Args:
      source: a checkpoint prefix (object-based or name-based) or a directory
        of managed checkpoints (every checkpoint its state file names is
        checked, and the state file itself; without a state file, every
        checkpoint in it, as `objckpt.save` writes them), or a SavedModel directory (its
        `saved_model.pb` against its checkpoint `variables/variables`, then
        that checkpoint), or a file of another format: Keras HDF5 files and
        safetensors files (a `.safetensors`, a `model.safetensors.index.json` and
        its shards, or a folder holding either) have no checksums: their headers
        are checked and every tensor read once (`VerifyReport.checked` says so).

    Returns:
      A `VerifyReport`; `.ok` is True when nothing is wrong, `.problems` lists
      each problem with the object path or key it concerns.

    Raises:
      CheckpointNotFoundError: nothing at `source` (no `prefix.index`, or a
        directory without a state file and without checkpoints).

    Example:
      >>> report = objckpt.verify("/tmp/run")
      >>> report.ok, [str(p) for p in report.problems]
    """
    source = os.fspath(source)
    found = _formats.dispatch("verify", source)
    notes = [*found.notes, *_layout_notes(found.prefixes)]
    return VerifyReport(source, tuple(found.prefixes) or (source,), found.tensors,
                        found.nbytes, tuple(Problem(*problem) for problem in found.problems),
                        tuple(notes), found.checked)


def _layout_notes(prefixes) -> list[str]:
    """A note for each partitioned tensor (a sharded variable: one key, one slice per
    shard) of the local TF checkpoints checked: read whole, every slice's checksum checked."""
    notes = []
    for prefix in prefixes:
        if "://" in prefix or not os.path.isfile(prefix + ".index"):
            continue
        try:
            listed = _meta.read(prefix)
        except errors.ObjckptError:  # damaged: its problems are listed already
            continue
        notes.extend(
            f"{prefix}: `{v.shown}` {_render.shape(v.shape)} is stored as {v.layout} (one key, "
            "one slice per shard): read whole, every slice checked"
            for v in listed.values() if v.layout)
    return notes
