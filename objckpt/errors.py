"""Exception types raised by objckpt, in families a caller can catch by what went wrong.

(One warning lives here too, outside the families: ``BatchNormStatisticsWarning``,
a ``UserWarning`` that an average carries BatchNorm statistics no recalibration followed.)

Every error names the object path or prefix it is about, what was expected,
what arrived, and how to fix it. Each type also subclasses the builtin that
fits it, so ``except ValueError`` or ``except OSError`` keeps working::

    ObjckptError                          every error objckpt raises on purpose
    |-- SourceError                       the source: what is read from
    |   |-- CheckpointNotFoundError       (FileNotFoundError) nothing at that prefix/directory
    |   |-- CheckpointCorruptError        (OSError) there, but not readable intact
    |   |-- NotObjectBasedError           (ValueError) name-based (TF1 Saver): no object graph
    |   `-- UnsupportedFormatError        (FileNotFoundError, TypeError) a file or argument
    |                                     in no format objckpt reads
    |-- MatchError                        the source and the obj do not fit together
    |   |-- StructureMismatchError        (ValueError) shapes, dtypes, missing, extra
    |   |   `-- AmbiguousMatchError       an entry could be several variables: not guessed
    |   `-- UntrackedVariableError        (ValueError) a variable no attribute path reaches
    |-- TargetError                       the obj: what is restored into or copied
    |   |-- UnbuiltModelError             (ValueError) no variables yet
    |   `-- UnsupportedObjectError        (TypeError) not a trackable objckpt can use
    |       |-- DistributedVariableError  a ShardedVariable or other unsupported placement
    |       `-- CloneError                an object objckpt.clone cannot copy
    |-- DirectoryError                    a directory of checkpoints
    |   |-- DirectoryLockedError          (BlockingIOError) in use: another writer holds it
    |   |-- CheckpointDirectoryError      (FileExistsError) holds checkpoints it won't resume
    |   `-- CheckpointWriteError          (OSError) writing failed; earlier ones are intact
    `-- UsageError                        how objckpt is called, and what it runs with
        |-- InvalidArgumentError          (ValueError) an argument objckpt cannot use
        |-- TemplateError                 (RuntimeError) a user-supplied callable failed
        |-- GraphvizNotFoundError         (FileNotFoundError) Graphviz's `dot` is missing
        |-- MissingDependencyError        (ImportError) an optional client (gcsfs, s3fs)
        `-- IncompatibleTensorFlowError   (ImportError) this TensorFlow lacks what is needed

Usage covers the set-up too (Graphviz, the TensorFlow version): a caller fixes those,
not the checkpoint, the model or the directory.

Every error has the same attributes, where they apply:

- ``problems``: a tuple of lines, one per problem (``()`` when there is no list);
- ``source``: the prefix, directory, file (or a Snapshot's repr) the error is about, or None;
- ``obj``: the object path, or a description of the obj (``Sequential `net```), or None;
- ``fix``: the sentence that says how to fix it. By default it is parsed from the message
  (what follows its last ``Fix:``, None without one); ``fix=`` given explicitly wins.

Older attributes stay as aliases: ``path`` (= ``obj``) on `CloneError` and
`DistributedVariableError`, ``prefix`` (= ``source``) on `CheckpointWriteError`,
``directory`` (= ``source``) on `DirectoryLockedError` and `CheckpointDirectoryError`; and
extras: ``holder``, ``found``, ``object_type``, ``variable_type``.
"""

from __future__ import annotations

import functools
import os

__all__ = [
    "AmbiguousMatchError",
    "BatchNormStatisticsWarning",
    "CheckpointCorruptError",
    "CheckpointDirectoryError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CloneError",
    "DirectoryError",
    "DirectoryLockedError",
    "DistributedVariableError",
    "GraphvizNotFoundError",
    "IncompatibleTensorFlowError",
    "InvalidArgumentError",
    "MatchError",
    "MissingDependencyError",
    "NotObjectBasedError",
    "ObjckptError",
    "SourceError",
    "StructureMismatchError",
    "TargetError",
    "TemplateError",
    "UnbuiltModelError",
    "UnsupportedFormatError",
    "UnsupportedObjectError",
    "UntrackedVariableError",
    "UsageError",
]

_FIX = "Fix:"


def parse_fix(message: str) -> str | None:
    """The fix a message states: what follows its last ``Fix:``, stripped; None without one."""
    at = message.rfind(_FIX)
    if at < 0:
        return None
    return message[at + len(_FIX):].strip() or None


def _alias(attribute: str) -> property:
    """An old attribute name kept as an alias of a common one (`path` of `obj`, `prefix` and
    `directory` of `source`): reads "" when unset, writes through."""

    def get(self) -> str:
        value = getattr(self, attribute)
        return value if value is not None else ""

    def set_(self, value: str) -> None:
        setattr(self, attribute, value)

    return property(get, set_)


class ObjckptError(Exception):
    """Base class of every error objckpt raises on purpose.

    Attributes:
      problems: one line per problem, in object-path order; () when there is no list.
      source: the prefix, directory or file (or a Snapshot's repr) the error is about, or None.
      obj: the object path, or a description of the obj, the error is about, or None.
      fix: how to fix it: `fix=` when given, else parsed from the message's last ``Fix:``
        (None without one).
    """

    def __init__(self, *args, problems=(), source=None, obj=None, fix=None):
        super().__init__(*args)
        self.problems = tuple(problems or ())
        self.source = source
        self.obj = obj
        self._fix = fix

    @property
    def fix(self) -> str | None:
        if self._fix is not None:
            return self._fix
        return parse_fix(str(self.args[0])) if self.args else None

    @fix.setter
    def fix(self, value: str | None) -> None:
        self._fix = value


# --- the families ---------------------------------------------------------------------------


class SourceError(ObjckptError):
    """The source cannot be read: not found, corrupt, name-based, or in no format objckpt reads."""


class MatchError(ObjckptError):
    """The source and the obj do not fit together: mismatched, ambiguous or untracked."""


class TargetError(ObjckptError):
    """The obj cannot be used: unbuilt, not trackable, distributed in an unsupported way."""


class DirectoryError(ObjckptError):
    """A directory of checkpoints: locked by another writer, not resumable, or a write failed."""


class UsageError(ObjckptError):
    """How objckpt is called, or what it runs with: an argument, a user callable, Graphviz,
    the TensorFlow version."""


# --- the source -----------------------------------------------------------------------------


class CheckpointNotFoundError(SourceError, FileNotFoundError):
    """No checkpoint exists at the given prefix or directory."""


class CheckpointCorruptError(SourceError, OSError):
    """A checkpoint file exists but cannot be read intact."""


class NotObjectBasedError(SourceError, ValueError):
    """The checkpoint is name-based (TF1 ``Saver``) and has no object graph."""


class UnsupportedFormatError(SourceError, FileNotFoundError, TypeError):
    """The source is in no format objckpt reads: a file that is not a checkpoint prefix nor a
    Keras/HDF5 file, a text-form SavedModel, an argument that is not a Snapshot or a path.

    It keeps the builtins of the errors raised there before (`CheckpointNotFoundError`'s
    FileNotFoundError, `UnsupportedObjectError`'s TypeError).
    """


# --- the match ------------------------------------------------------------------------------


class StructureMismatchError(MatchError, ValueError):
    """The source and the obj disagree: shapes, dtypes, missing or extra paths.

    Attributes:
        problems: one line per disagreement, in object-path order.
    """

    def __init__(self, message: str = "", problems: tuple[str, ...] = (), **about):
        super().__init__(message, problems=problems, **about)


class AmbiguousMatchError(StructureMismatchError):
    """Among the disagreements, a source entry (or a variable) could be any of several: objckpt
    does not guess. Fix it with a rule that names the intended path."""


class UntrackedVariableError(MatchError, ValueError):
    """An obj owns a variable (Keras: in `obj.variables`) that no attribute path reaches.

    Attributes:
      problems: one line per such variable: its name, shape and owning layer.
    """

    def __init__(self, message: str = "", problems: tuple[str, ...] = (), **about):
        super().__init__(message, problems=problems, **about)


# --- the target -----------------------------------------------------------------------------


class UnbuiltModelError(TargetError, ValueError):
    """The obj has no variables yet (an unbuilt Keras model or empty module)."""


class UnsupportedObjectError(TargetError, TypeError):
    """The argument is not a trackable obj objckpt can use."""


class CloneError(UnsupportedObjectError):
    """An object in obj's graph cannot be copied by `objckpt.clone`.

    Attributes:
      path: attribute path from the root to the object, e.g. `obj.log_file` (= `obj`).
      object_type: the type that could not be copied.
    """

    def __init__(self, message: str = "", path: str = "", object_type=None, **about):
        about.setdefault("obj", path or None)
        super().__init__(message, **about)
        self.object_type = object_type

    path = _alias("obj")


class DistributedVariableError(UnsupportedObjectError):
    """A variable that tf.distribute shards or places in a way objckpt does not support.

    Mirrored and SyncOnRead variables (MirroredStrategy, MultiWorkerMirroredStrategy) are
    supported everywhere, and a `ShardedVariable` (ParameterServerStrategy with a partitioner)
    is one logical variable; `clone` refuses TPU and packed variables with this error,
    naming their object path.

    Attributes:
      path: the object path (or attribute path) of the variable (= `obj`).
      variable_type: the type of the distributed variable, e.g. "ShardedVariable".
    """

    def __init__(self, message: str = "", path: str = "", variable_type: str = "", **about):
        about.setdefault("obj", path or None)
        super().__init__(message, **about)
        self.variable_type = variable_type

    path = _alias("obj")


# --- the directory --------------------------------------------------------------------------


class _InDirectory:
    """`directory` as an alias of `source`."""

    directory = _alias("source")


class DirectoryLockedError(_InDirectory, DirectoryError, BlockingIOError):
    """The directory is in use: another writer (process or callback) holds the lock of a
    checkpoint directory.

    Attributes:
      directory: the directory of checkpoints (= `source`).
      holder: who holds it, as its lock file says (e.g. `pid 123 on host`).
    """

    def __init__(self, message: str = "", directory: str = "", holder: str = "", **about):
        about.setdefault("source", directory or None)
        super().__init__(message, **about)
        self.holder = holder


class CheckpointWriteError(DirectoryError, OSError):
    """Writing a checkpoint failed (disk full, I/O error); earlier checkpoints are intact.

    Attributes:
      prefix: the checkpoint that could not be written (= `source`).
    """

    def __init__(self, message: str = "", prefix: str = "", **about):
        about.setdefault("source", prefix or None)
        super().__init__(message, **about)

    prefix = _alias("source")


class CheckpointDirectoryError(_InDirectory, DirectoryError, FileExistsError):
    """A directory holds intact checkpoints that `callbacks.Checkpointing` would not resume
    from, so it refuses to start training fresh there (and to bury them under new ones).

    Attributes:
      directory: the directory of checkpoints (= `source`).
      found: the intact checkpoints found in it (prefixes).
    """

    def __init__(self, message: str = "", directory: str = "", found: tuple[str, ...] = (),
                 **about):
        about.setdefault("source", directory or None)
        super().__init__(message, **about)
        self.found = tuple(found)


# --- usage ----------------------------------------------------------------------------------


class InvalidArgumentError(UsageError, ValueError):
    """An argument has a value objckpt cannot use (range, pattern, option)."""


class TemplateError(UsageError, RuntimeError):
    """A user-supplied template callable (e.g. `objckpt migrate --template`) failed."""


class GraphvizNotFoundError(UsageError, FileNotFoundError):
    """Rendering SVG/PNG needs Graphviz's `dot` program, and it is not on PATH."""


class MissingDependencyError(UsageError, ImportError):
    """A path needs an optional package that is not installed: the storage client of a
    remote URL (`python3 -m pip install ".[gcs]"` from a checkout for gs://, `".[s3]"` for
    s3://)."""


class IncompatibleTensorFlowError(UsageError, ImportError):
    """This TensorFlow lacks a TF/Keras internal objckpt needs (it names the version and the
    missing name); objckpt refuses rather than fall back to something silently wrong."""


class BatchNormStatisticsWarning(UserWarning):
    """A model averaged from others (SWA, a soup, `objckpt.average`) holds the mean of their
    BatchNorm moving statistics, which are not the statistics of the averaged weights; a
    warning, not an error: `objckpt.recalibrate_batchnorm(model, data)` recomputes them."""


# --- filling `source` and `obj` at the public entry points ---------------------------------

_SHOWN = 500  # characters of a description kept in `source` / `obj`


def describe_source(source) -> str | None:
    """`source` as errors show it: a path as is, a Snapshot (or other object) by its repr,
    a list by its items, joined; None for None or an empty list."""
    if source is None or isinstance(source, str):
        return source
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if isinstance(source, (list, tuple)):  # load_ensemble's sources
        return ", ".join(str(describe_source(s)) for s in source)[:_SHOWN] or None
    return repr(source)[:_SHOWN]  # a Snapshot: Snapshot(12 variables, 0.1 MB)


def describe_obj(obj) -> str | None:
    """`obj` as errors show it: an object path as is, an object by its type and name
    (``Sequential `net```)."""
    if obj is None or isinstance(obj, str):
        return obj
    name = getattr(obj, "name", None)
    return type(obj).__name__ + (f" `{name[:_SHOWN]}`" if isinstance(name, str) and name else "")


def about(err: BaseException, source=None, obj=None) -> BaseException:
    """Sets `err.source` and `err.obj` where they are unset (None) and `err` is an objckpt
    error: `source` a prefix, directory, path-like, Snapshot (its repr) or list of them; `obj`
    an object path or the obj (its type and name). Cheap, and called only on failure, by each
    public entry point (`except ObjckptError as err: about(err, source, obj); raise`).
    Returns `err`."""
    if isinstance(err, ObjckptError):
        if err.source is None and source is not None:
            err.source = describe_source(source)
        if err.obj is None and obj is not None:
            err.obj = describe_obj(obj)
    return err


def about_arguments(source: str | None = None, obj: str | None = None):
    """Decorates a public entry point: its objckpt errors get `source` and `obj` (where
    unset, as `about` sets them) from its arguments of those names. The arguments are
    bound only when an error is raised."""

    def decorate(function):
        @functools.wraps(function)
        def entry_point(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except ObjckptError as err:
                import inspect

                try:
                    given = inspect.signature(function).bind_partial(*args, **kwargs).arguments
                except TypeError:  # arguments the function took otherwise (**kwargs)
                    given = {}
                about(err, source=given.get(source) if source else None,
                      obj=given.get(obj) if obj else None)
                raise

        return entry_point

    return decorate
