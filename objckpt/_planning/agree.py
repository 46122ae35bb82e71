"""The agree stage of the one restore pipeline: a read lands on every worker or on none.

Under a MultiWorkerMirroredStrategy each worker calls `agree_across_workers` once per
decision point, before anything is assigned, created or written, with its own failure (None
when its stages passed); one small all-gather tells every worker which failed, with what.
"""

from __future__ import annotations

import json

from objckpt import _compat, errors
from objckpt._base import render as _render

__all__ = ["AGREED_BYTES", "agree_across_workers"]


# The error a restore raises on a worker of a MultiWorkerMirroredStrategy whose own checks
# passed when another worker's failed: the type of that worker's error, any objckpt error
# (its index here, the same on every worker), `ObjckptError` for any other error.
_AGREED_ERRORS = tuple(getattr(errors, name) for name in errors.__all__
                       if not issubclass(getattr(errors, name), Warning))
# What a failing worker sends of its error (JSON, ASCII): at most this many bytes, within
# `_compat.gather_failures`'s row; each text field and problem line is cut to its own bound.
AGREED_BYTES = 8000
_AGREED_MESSAGE = 1500  # bytes of the message
_AGREED_FIELD = 400  # bytes of the source, obj, fix, an extra
_AGREED_PROBLEM = 240  # bytes of one problem line
_AGREED_PROBLEMS = 40  # problem lines at most (then "... N more")
_AGREED_EXTRAS = ("holder", "variable_type", "found")  # old attributes some errors have


def _agreed_kind(failure) -> int:
    """1 + the index in `_AGREED_ERRORS` of `failure`'s type (its nearest listed base)."""
    for cls in type(failure).__mro__:
        if cls in _AGREED_ERRORS:
            return 1 + _AGREED_ERRORS.index(cls)
    return 1 + _AGREED_ERRORS.index(errors.ObjckptError)


def _cut(text, limit: int = _AGREED_FIELD):
    """`text` cut to at most `limit` bytes as JSON writes it (escaped non-ASCII included)."""
    if text is None:
        return None
    text, keep = str(text), limit
    while len(json.dumps(text[:keep])) - 2 > limit - 3:
        keep = keep * 3 // 4
    return text if keep >= len(text) else text[:keep] + "..."


def _failure_record(failure) -> str:
    """What a failing worker sends of its error: type and message (one line), and for an
    objckpt error its problems, source, obj, fix and extras, as JSON of at most
    `AGREED_BYTES` (problem lines dropped from the end first, then the message cut)."""
    text = (str(failure.args[0]) if isinstance(failure, errors.ObjckptError)
            and failure.args else str(failure))  # a TF error's args[0] is its node
    record = {"message": _cut(f"{type(failure).__name__}: {' '.join(text.split())}",
                              _AGREED_MESSAGE)}
    problems = []
    if isinstance(failure, errors.ObjckptError):
        problems = [_cut(p, _AGREED_PROBLEM) for p in failure.problems]
        if len(problems) > _AGREED_PROBLEMS:
            problems[_AGREED_PROBLEMS - 1:] = [
                f"... {len(problems) - _AGREED_PROBLEMS + 1} more"]
        record.update(source=_cut(failure.source), obj=_cut(failure.obj),
                      fix=_cut(failure.fix))
        extras = {}
        for name in _AGREED_EXTRAS:
            value = getattr(failure, name, None)
            if isinstance(value, str) and value:
                extras[name] = _cut(value)
            elif isinstance(value, tuple) and value:
                extras[name] = [_cut(v, _AGREED_PROBLEM) for v in value[:_AGREED_PROBLEMS]]
        if extras:
            record["extras"] = extras
    while True:
        record["problems"] = problems
        encoded = json.dumps(record, separators=(",", ":"))  # ASCII: one byte a character
        if len(encoded) <= AGREED_BYTES:
            return encoded
        if problems:
            problems = problems[:-1]
        elif "extras" in record:
            del record["extras"]
        else:  # (escaped non-ASCII text takes up to 6 bytes a character)
            for name in ("message", "source", "obj", "fix"):
                if record.get(name) is not None:
                    record[name] = _cut(record[name], max(len(record[name]) // 2, 20))


def _agreed_fields(text: str) -> dict:
    """The fields `_failure_record` sent, rendered safely (they come from another process);
    a plain message for anything else."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("message"), str):
            raise ValueError(text)
    except ValueError:
        return {"message": _render.safe_text(text), "problems": ()}

    def shown(value):
        return _render.safe_text(value) if isinstance(value, str) else None

    extras = record.get("extras") if isinstance(record.get("extras"), dict) else {}
    return {
        "message": _render.safe_text(record["message"]),
        "problems": tuple(_render.safe_text(p) for p in record.get("problems") or ()
                          if isinstance(p, str)),
        "source": shown(record.get("source")), "obj": shown(record.get("obj")),
        "fix": shown(record.get("fix")),
        "extras": {name: (shown(value) if isinstance(value, str) else
                          tuple(_render.safe_text(v) for v in value if isinstance(v, str)))
                   for name, value in extras.items()
                   if name in _AGREED_EXTRAS and isinstance(value, (str, list))},
    }


def agree_across_workers(variables, failure, operation: str = "objckpt.restore") -> None:
    """A restore (or `operation`) lands on every worker of a MultiWorkerMirroredStrategy or
    on none: each worker calls this once, before assigning or creating anything, with its
    own failure (None: its checks passed). One small all-gather tells every worker which
    failed, with what; a worker that passed raises then, naming the failing worker's task,
    error type and message. No collective under any other strategy.

    The error raised there has the failing worker's objckpt type (`ObjckptError` for any
    other error) and carries its `problems`, `source`, `obj` and `fix` (and `holder`,
    `variable_type`, `found` where it had them), each bounded in size and rendered safely;
    its message ends with the fix on this worker.

    Inside a `tf.function` it runs eagerly at trace time: every worker traces the same
    function, so the collectives match.
    """
    kind = 0
    message = ""
    if failure is not None:
        kind = _agreed_kind(failure)
        message = _failure_record(failure)
    failures = _compat.gather_failures(variables.values(), kind, message)
    if failure is not None or not failures:
        return
    task, found_kind, text = failures[0]
    raised = (_AGREED_ERRORS[found_kind - 1] if 0 < found_kind <= len(_AGREED_ERRORS)
              else errors.ObjckptError)
    fields = _agreed_fields(text)
    others = (f" (and {len(failures) - 1} other worker(s): "
              + ", ".join(t for t, _, _ in failures[1:]) + ")" if len(failures) > 1 else "")
    err = raised(
        f"{operation} failed on worker {task}{others} of this MultiWorkerMirroredStrategy, "
        f"so it did nothing on this worker either: it succeeds on every worker or on none, "
        f"and every variable here keeps its value. That worker's error: "
        f"{fields['message']}. Fix: the cause on worker {task} (its error, raised "
        "there, says which path and what was expected); every worker must be able to read "
        "the same source (put checkpoints on storage the workers share) and run the same "
        "rules.", problems=fields["problems"], source=fields.get("source"),
        obj=fields.get("obj"), fix=fields.get("fix"))
    for name, value in fields.get("extras", {}).items():
        setattr(err, name, value)
    raise err
