"""Exception types raised by objckpt.

Every error names the object path or prefix it is about, what was expected,
what arrived, and how to fix it. Each type also subclasses the builtin that
fits it, so ``except ValueError`` or ``except OSError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "CheckpointCorruptError",
    "CheckpointDirectoryError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CloneError",
    "DirectoryLockedError",
    "DistributedVariableError",
    "GraphvizNotFoundError",
    "InvalidArgumentError",
    "NotObjectBasedError",
    "ObjckptError",
    "StructureMismatchError",
    "TemplateError",
    "UnbuiltModelError",
    "UnsupportedObjectError",
    "UntrackedVariableError",
]


class ObjckptError(Exception):
    """Base class of every error objckpt raises on purpose."""


class StructureMismatchError(ObjckptError, ValueError):
    """The source and the obj disagree: shapes, dtypes, missing or extra paths.

    Attributes:
        problems: one line per disagreement, in object-path order.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = tuple(problems)


class UnbuiltModelError(ObjckptError, ValueError):
    """The obj has no variables yet (an unbuilt Keras model or empty module)."""


class NotObjectBasedError(ObjckptError, ValueError):
    """The checkpoint is name-based (TF1 ``Saver``) and has no object graph."""


class CheckpointNotFoundError(ObjckptError, FileNotFoundError):
    """No checkpoint exists at the given prefix or directory."""


class CheckpointCorruptError(ObjckptError, OSError):
    """A checkpoint file exists but cannot be read intact."""


class UnsupportedObjectError(ObjckptError, TypeError):
    """The argument is not a trackable obj, Snapshot, prefix or directory."""


class InvalidArgumentError(ObjckptError, ValueError):
    """An argument has a value objckpt cannot use (range, pattern, option)."""


class UntrackedVariableError(ObjckptError, ValueError):
    """An obj owns a variable (Keras: in `obj.variables`) that no attribute path reaches.

    Attributes:
      problems: one line per such variable: its name, shape and owning layer.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = problems


class CloneError(UnsupportedObjectError):
    """An object in obj's graph cannot be copied by `objckpt.clone`.

    Attributes:
      path: attribute path from the root to the object, e.g. `obj.log_file`.
      object_type: the type that could not be copied.
    """

    def __init__(self, message, path="", object_type=None):
        super().__init__(message)
        self.path = path
        self.object_type = object_type


class DistributedVariableError(UnsupportedObjectError):
    """A variable that tf.distribute shards or places in a way objckpt does not support.

    Mirrored and SyncOnRead variables (MirroredStrategy, MultiWorkerMirroredStrategy) are
    supported everywhere; a `ShardedVariable` (ParameterServerStrategy with a partitioner) is
    refused with this error by every operation, naming its object path.

    Attributes:
      path: the object path (or attribute path) of the variable.
      variable_type: the type of the distributed variable, e.g. "ShardedVariable".
    """

    def __init__(self, message, path="", variable_type=""):
        super().__init__(message)
        self.path = path
        self.variable_type = variable_type


class TemplateError(ObjckptError, RuntimeError):
    """A user-supplied template callable (e.g. `objckpt migrate --template`) failed."""


class GraphvizNotFoundError(ObjckptError, FileNotFoundError):
    """Rendering SVG/PNG needs Graphviz's `dot` program, and it is not on PATH."""


class DirectoryLockedError(ObjckptError, BlockingIOError):
    """Another writer (process or callback) holds the lock of a checkpoint directory.

    Attributes:
      directory: the directory of checkpoints.
      holder: who holds it, as its lock file says (e.g. `pid 123 on host`).
    """

    def __init__(self, message: str, directory: str = "", holder: str = ""):
        super().__init__(message)
        self.directory = directory
        self.holder = holder


class CheckpointWriteError(ObjckptError, OSError):
    """Writing a checkpoint failed (disk full, I/O error); earlier checkpoints are intact.

    Attributes:
      prefix: the checkpoint that could not be written.
    """

    def __init__(self, message: str, prefix: str = ""):
        super().__init__(message)
        self.prefix = prefix


class CheckpointDirectoryError(ObjckptError, FileExistsError):
    """A directory holds intact checkpoints that `callbacks.Checkpointing` would not resume
    from, so it refuses to start training fresh there (and to bury them under new ones).

    Attributes:
      directory: the directory of checkpoints.
      found: the intact checkpoints found in it (prefixes).
    """

    def __init__(self, message: str, directory: str = "", found: tuple[str, ...] = ()):
        super().__init__(message)
        self.directory = directory
        self.found = tuple(found)


class IncompatibleTensorFlowError(ObjckptError, ImportError):
    """This TensorFlow lacks a TF/Keras internal objckpt needs (it names the version and the
    missing name); objckpt refuses rather than fall back to something silently wrong."""
