"""One calling convention across the public API, and the old orders it still accepts.

Everything that reads a source into an obj takes `(obj, source, *, rules=None, at=None,
strict=True, optimizer_state="auto", ...)`; options of classes (callbacks, `Twins`,
`Freezer`, `CheckpointManager`) are keyword-only past their first argument. The orders
objckpt 0.1 also had (`plan(source, obj)`, `migrate(source, obj, prefix)`, options passed
by position) keep working until objckpt 0.2, each call with one `DeprecationWarning` that
shows the new spelling. Pure Python: no TensorFlow import.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings

__all__ = ["REMOVED_IN", "deprecated", "is_live", "is_source_like", "keyword_options",
           "obj_first", "renamed"]

REMOVED_IN = "objckpt 0.2"

# Classes of objckpt that are sources (besides paths): by name, so that this module
# imports none of them (they sit above it).
_SOURCE_CLASSES = {"Snapshot", "Source"}
_LIVE_PACKAGES = ("tensorflow", "keras", "tf_keras", "sonnet")


def is_source_like(value) -> bool:
    """Whether value is what objckpt reads values from: a path (str, bytes, os.PathLike), a
    `Snapshot`, or anything with an `as_source()` method."""
    if isinstance(value, (str, bytes, os.PathLike)):
        return True
    if callable(getattr(type(value), "as_source", None)):
        return True
    return any(cls.__name__ in _SOURCE_CLASSES and cls.__module__.startswith("objckpt.")
               for cls in type(value).__mro__)


def is_live(value) -> bool:
    """Whether value is a live trackable (a Keras model or layer of any flavour, a
    tf.Module, a tf.train.Checkpoint, an optimizer), judged without importing TensorFlow."""
    if value is None or is_source_like(value):
        return False
    return any(cls.__name__ == "Trackable" or cls.__module__.split(".")[0] in _LIVE_PACKAGES
               for cls in type(value).__mro__)


def obj_first(function: str, obj, source, *, old: str = "source, obj",
              new: str = "obj, source", stacklevel: int = 3):
    """(obj, source) of a call of `objckpt.<function>`, the old order detected.

    A call in the old order (`plan(source, obj)`: the first argument a source, the second a
    live trackable) is swapped and warned about once, with a `DeprecationWarning` pointing at
    the caller's line (`stacklevel` counts from here: 3 is the caller of the public function
    that calls this).
    """
    if is_source_like(obj) and is_live(source):
        deprecated(
            f"objckpt.{function}({old}) is the old argument order; call "
            f"objckpt.{function}({new}) (as objckpt.restore). The old order is accepted "
            f"until {REMOVED_IN}.", callers=stacklevel - 2)
        return source, obj
    return obj, source


def deprecated(message: str, *, callers: int = 0) -> None:
    """Warns `DeprecationWarning` at the user's line: the first frame outside this module,
    `callers` frames further out (the objckpt functions between it and the user)."""
    frame, level = inspect.currentframe(), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level + callers)


def keyword_options(old_order: tuple[str, ...], *, name: str | None = None,
                    warn: bool = True):
    """Decorates a function (or `__init__`/`__new__`) whose options are keyword-only now.

    `old_order` names the options in the order objckpt 0.1 took them by position. A call
    that still passes them by position works, with one `DeprecationWarning` that shows the
    keyword spelling; `inspect.signature` shows the keyword-only signature. `warn=False`
    for a `__new__` whose `__init__` warns (one warning a call).
    """

    def decorate(function):
        signature = inspect.signature(function)
        positional = [p for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        count = len(positional)
        shown = name or function.__qualname__.replace(".__init__", "").replace(".__new__", "")
        bound = 1 if positional and positional[0].name in ("self", "cls") else 0

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if len(args) > count:
                extra = args[count:]
                if len(extra) > len(old_order):
                    raise TypeError(
                        f"{shown}() takes {count - bound} positional argument(s), then "
                        f"keyword options; received {len(args) - bound} positional.")
                moved = dict(zip(old_order, extra))
                twice = sorted(set(moved) & set(kwargs))
                if twice:
                    raise TypeError(f"{shown}() got multiple values for {', '.join(twice)}")
                spelled = ", ".join(f"{key}={_short(value)}" for key, value in moved.items())
                if warn:
                    deprecated(
                        f"{shown}(...) takes its options by keyword now: pass {spelled} "
                        f"(options by position are accepted until {REMOVED_IN}).")
                args = args[:count]
                kwargs.update(moved)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def renamed(old: str, new: str, *, name: str, warn: bool = True):
    """Decorates a function whose argument `old` is called `new` now: `old=` still works
    until objckpt 0.2, with one `DeprecationWarning` (none with `warn=False`)."""

    def decorate(function):
        names = list(inspect.signature(function).parameters)
        position = names.index(new)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if old in kwargs:
                if new in kwargs or len(args) > position:
                    raise TypeError(f"{name}() got {new} and {old} (its old name): pass {new}.")
                if warn:
                    deprecated(f"{name}({old}=...) is the old name of the argument; pass "
                               f"{name}({new}) (its first argument, as elsewhere in objckpt). "
                               f"{old}= is accepted until {REMOVED_IN}.")
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
