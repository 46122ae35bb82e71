"""The one restore pipeline: every operation that reads a source into variables.

`objckpt.restore`, `objckpt.migrate`, `objckpt.load_ensemble` and
`objckpt.restore_on_create` each run the same stages through a `Pipeline`:

1. open the source (`Pipeline.open`: a prefix, a directory, a Snapshot, any format);
2. plan it onto the obj and check the plan (`Pipeline.plan`: rules, at, strict,
   optimizer_state; an optimizer not built yet is built first, `_checks.ready_optimizers`;
   a plan that cannot be applied raises the one error, `_checks.refuse`);
3. fetch the values and check them against their variables (`Pipeline.fetch`);
4. agree across the workers of a MultiWorkerMirroredStrategy, exactly once per decision
   point (`Pipeline.decided`: the stages above run inside it; a failure on any worker is
   raised on every worker, before anything changes);
5. the operation's own step, after the agreement: assign (restore), write the migrated
   checkpoint (migrate), create the members (load_ensemble), assign what exists and watch
   what is created later (restore_on_create).

Nothing before step 5 assigns a variable or writes a file (building an optimizer that
holds no state yet is the one change, as the next training step would make it anyway), so
a failure in any stage leaves every variable as it was.
"""

from __future__ import annotations

import contextlib
import json

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._bundle import remote as _remote
from objckpt._planning import checks as _checks
from objckpt._planning import match as _match
from objckpt._planning import sources as _sources

__all__ = ["AGREED_BYTES", "Pipeline", "agree_across_workers", "fetch_values"]


class Pipeline:
    """One read of `source` into `obj` by `operation` (e.g. "objckpt.restore"), with the
    calling convention's options (`rules`, `at`, `strict`, `optimizer_state`)."""

    def __init__(self, operation: str, obj, source, *, rules=(), at: str | None = None,
                 strict: bool = True, optimizer_state="auto", action: str = "restore"):
        self.operation = operation
        self.obj = obj
        self.source = source
        self.rules = rules
        self.at = at
        self.strict = strict
        self.optimizer_state = optimizer_state
        self.action = action  # the verb of the refusal: "Cannot restore/migrate ..."

    def __repr__(self) -> str:
        return f"Pipeline({self.operation})"

    def open(self, source=None) -> _sources.Source:
        """Stage 1: the source (this pipeline's, or one member's) opened as a plan source."""
        return _sources.open_source(self.source if source is None else source)

    def plan(self, variables, src: _sources.Source, *, obj=None, rules=None):
        """Stage 2: `(variables, plan)`: obj's optimizers that hold no state yet built when
        the source has state for them (the tree walked again then), and the checked plan;
        a plan that cannot be applied raises `_checks.refuse`'s error."""
        obj = self.obj if obj is None else obj
        rules = self.rules if rules is None else rules
        variables = _checks.ready_optimizers(obj, variables, src, rules=rules, at=self.at,
                                             optimizer_state=self.optimizer_state)
        return variables, _checks.checked_plan(
            obj, variables, src, rules=rules, strict=self.strict, at=self.at,
            optimizer_state=self.optimizer_state, action=self.action)

    def fetch(self, the_plan: _match.Plan, variables, matches=None) -> list:
        """Stage 3: the plan's values, read, transformed and checked (`fetch_values`)."""
        return fetch_values(the_plan, variables, matches)

    def about(self, err):
        """A failure's `source` and `obj`, where unset: this pipeline's."""
        return errors.about(err, source=self.source, obj=self.obj)

    @contextlib.contextmanager
    def decided(self, variables, *, about=None, then=None):
        """Stage 4, around the stages before it: the one agreement of a decision point.

        Runs the block; on any failure `about(err)` (default: `self.about`) names the
        source and obj (a remote source by its URL, not its local staged copy), the
        workers agree on the failure, and `then(err)` (default: `err`) is raised; when the
        block passed, the workers agree that it did (a worker whose
        checks passed raises there when another's failed). `variables` is a callable that
        gives the tree whose strategy decides (called at the agreement); None from it: no
        agreement (a replica context).
        """
        try:
            yield self
        except Exception as err:
            _remote.unstage(err)  # a remote source's staged copy: its URL named instead
            (about or self.about)(err)
            self._agree(variables, err)
            raised = err if then is None else then(err)
            if raised is err:
                raise
            raise raised from err
        self._agree(variables, None)

    def _agree(self, variables, failure) -> None:
        tree = variables()
        if tree is not None:
            agree_across_workers(tree, failure, self.operation)


def fetch_values(the_plan: _match.Plan, variables, matches=None) -> list:
    """Reads the source values of a plan's matches, transforms applied, and checks them.

    A transform's output shape is known from tracing only as far as the
    transform lets TF infer it; every value is checked against its variable
    again here, before anything is assigned or written.
    """
    matches = the_plan.matches if matches is None else matches
    values = the_plan.fetch([m.source for m in matches])
    out, problems, corrupt = [], [], []
    for match, value in zip(matches, values):
        if match.transform is not None:
            value = match.transform(value)
        variable = variables[match.target]
        if (not value.shape.is_fully_defined() and variable.shape.is_fully_defined()
                and value.shape.is_compatible_with(variable.shape)):
            # read in a tf.function being traced: the shape is checked when it runs
            value = tf.ensure_shape(value, variable.shape)
        fits = value.shape == variable.shape or (  # a variable of relaxed shape (tf_keras
            not variable.shape.is_fully_defined()  # lookups' idf_weights): any value it takes
            and variable.shape.is_compatible_with(value.shape))
        if (not fits or value.dtype != variable.dtype.base_dtype):
            got = (f"{value.dtype.name}{tuple(value.shape)} but the obj has "
                   f"{variable.dtype.base_dtype.name}{tuple(variable.shape)}")
            if match.transform is not None:
                problems.append(f"{the_plan.label(match.target)}: the transform of "
                                f"`{_render.safe(match.source)}` gave {got}")
            else:  # the plan checked the metadata: the data disagrees with it
                corrupt.append(f"{the_plan.label(match.target)}: `{_render.safe(match.source)}`"
                               f" read as {got}")
        out.append(value)
    if corrupt:
        raise errors.CheckpointCorruptError(
            f"{the_plan.source}: {len(corrupt)} value(s) read do not have the shape or dtype "
            "its metadata promised (an inconsistent or crafted checkpoint); nothing was "
            "changed or written:\n" + "\n".join(_render.listed(corrupt))
            + "\nFix: restore from another checkpoint, or write this one again.")
    if problems:
        raise errors.StructureMismatchError(
            f"{len(problems)} transformed value(s) from {the_plan.source} do not fit; nothing "
            "was changed or written:\n" + "\n".join(_render.listed(problems))
            + "\nFix: make the rule's transform return the variable's shape and dtype.",
            tuple(problems))
    return out


# The error a restore raises on a worker of a MultiWorkerMirroredStrategy whose own checks
# passed when another worker's failed: the type of that worker's error, any objckpt error
# (its index here, the same on every worker), `ObjckptError` for any other error.
_AGREED_ERRORS = tuple(getattr(errors, name) for name in errors.__all__)
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
