"""Greedy model soups: averages of fine-tuned models, kept only while a score holds.

`greedy_soup` scores each candidate alone, sorts them by score, then tries them in that
order: a candidate joins the soup (a uniform average of the kept ones, by `objckpt.average`:
matched like `restore`, streamed) when the soup's score with it does not drop. The best
soup is left in the model and the trace of every try is reported.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

from objckpt import errors
from objckpt._ops import average as _average
from objckpt._ops import batchnorm as _batchnorm
from objckpt._ops import restore as _restore
from objckpt._ops import snapshot as _snapshot

__all__ = ["SoupReport", "SoupStep", "greedy_soup"]


class SoupStep(NamedTuple):
    """One candidate tried.

    Attributes:
      index: its position in `sources`.
      source: the source, as given.
      own_score: the score of the candidate alone.
      soup_score: the score of the soup with it (the candidate tried first: its own score).
      kept: whether it joined the soup.
    """

    index: int
    source: object
    own_score: float
    soup_score: float
    kept: bool


class SoupReport(NamedTuple):
    """What `greedy_soup` did.

    Attributes:
      kept: the sources in the soup, in the order they joined it.
      score: the soup's score (that of the model as left), never below the best candidate's.
      trace: a `SoupStep` per candidate, in the order tried (best own score first).
      scores: each candidate's own score, in the order of `sources`.
    """

    kept: tuple
    score: float
    trace: tuple
    scores: tuple

    def describe(self) -> str:
        """The trace as a table: candidate, own score, soup score with it, kept or not."""
        rows = ["  #  own score  soup score  kept  source"]
        for step in self.trace:
            rows.append(f"{step.index:>3}  {step.own_score:>9.6g}  {step.soup_score:>10.6g}  "
                        f"{'yes' if step.kept else 'no':>4}  {_label(step.source)}")
        rows.append(f"soup of {len(self.kept)} of {len(self.trace)}: score {self.score:.6g}")
        return "\n".join(rows)


def _label(source) -> str:
    return source if isinstance(source, str) else repr(source)[:80]


def _score(score, model, what: str) -> float:
    value = score(model)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            f"greedy_soup: score must return a number (higher is better); for {what} it "
            f"returned {value!r} ({type(value).__name__}). Fix: return e.g. the accuracy "
            "as a float.") from None
    return value


def _key(value: float) -> float:
    """The sort key of a score: NaN ranks below every number."""
    return -math.inf if math.isnan(value) else value


def _better(value: float, best: float) -> bool:
    return _key(value) > _key(best)


def _better_or_equal(value: float, best: float) -> bool:
    return not math.isnan(value) and _key(value) >= _key(best)


@errors.about_arguments(obj="obj")
def greedy_soup(obj, sources, score, *, rules=None, at: str | None = None, strict: bool = True,
                optimizer_state="auto", recalibrate=None,
                recalibrate_steps: int | None = None) -> SoupReport:
    """Cooks a greedy soup of `sources` in obj, by `score`; returns the trace.

    Each candidate is loaded alone (`objckpt.average` of one source) and scored; then, in
    order of their own score (best first; ties keep the order of `sources`), each is tried:
    the uniform average of the soup so far plus it is written into obj and scored, and the
    candidate stays when that score is at least the soup's score so far (a NaN score never
    does). The first tried is the best candidate alone, so the soup never scores below its
    best single member. At the end obj holds the best soup (the one whose score is
    `report.score`).

    Averaging models with BatchNorm layers averages their moving statistics too, which do
    not fit the averaged weights: pass `recalibrate=` data, and every soup (and candidate)
    is recalibrated (`objckpt.recalibrate_batchnorm`) before it is scored; without, a model
    with BatchNorm layers gets one `errors.BatchNormStatisticsWarning`.

    Args:
      obj: the built model to cook in (any flavour); its values are replaced.
      sources: the candidates: a list of sources `objckpt.average` reads (prefixes,
        directories, Snapshots, `.keras`/`.weights.h5` files, safetensors, URLs).
      score: a callable taking obj and returning a number, higher is better (e.g. accuracy
        on held-out data).
      rules, at, strict, optimizer_state: as `objckpt.average` (and `restore`).
      recalibrate: data to recompute BatchNorm statistics from before each score (what
        `objckpt.recalibrate_batchnorm` takes), or None.
      recalibrate_steps: batches of `recalibrate` to use (None: all).

    Returns:
      A `SoupReport`: kept, score, trace (a `SoupStep` per candidate), scores.

    Raises:
      InvalidArgumentError: `sources` is empty or not a list, `score` is not callable or
        returns something other than a number.
      as `objckpt.average`: a source does not fit obj.
      Whatever is raised (the scorer's errors too), obj is left with the values it had.

    Example:
      >>> report = objckpt.greedy_soup(model, ["ft/a", "ft/b", "ft/c"],
      ...                              lambda m: m.evaluate(vx, vy, verbose=0)[1])
      >>> print(report.describe())
    """
    if isinstance(sources, (str, bytes)) or not hasattr(sources, "__len__") or not sources:
        raise errors.InvalidArgumentError(
            "greedy_soup: sources must be a non-empty list of candidates (prefixes, "
            f"directories, Snapshots, files). Received: {sources!r:.200}. Fix: pass e.g. "
            "['ft/a', 'ft/b'].")
    if not callable(score):
        raise errors.InvalidArgumentError(
            f"greedy_soup: score must be a callable taking the model and returning a number "
            f"(higher is better). Received: {type(score).__name__}. Fix: pass e.g. "
            "lambda model: model.evaluate(vx, vy, verbose=0)[1].")
    sources = list(sources)
    options = dict(rules=rules, at=at, strict=strict, optimizer_state=optimizer_state)
    warned = [False]

    def cook(members, what: str) -> float:
        with warnings.catch_warnings():  # the soup warns once itself, below
            warnings.simplefilter("ignore", errors.BatchNormStatisticsWarning)
            _average.average(obj, members, **options)
        if recalibrate is not None:
            _batchnorm.recalibrate_batchnorm(obj, recalibrate, steps=recalibrate_steps)
        elif len(members) > 1 and not warned[0]:
            warned[0] = True
            _batchnorm.warn_averaged_statistics(
                obj, "greedy_soup: the soup", "pass greedy_soup(..., recalibrate=train_data) "
                "so that each soup is recalibrated before it is scored", stacklevel=5)
        return _score(score, obj, what)

    original = _snapshot.snapshot(obj)
    try:
        return _cook_all(obj, sources, cook)
    except BaseException:
        _restore.restore(obj, original)  # a source that does not fit, a scorer that raised
        raise


def _cook_all(obj, sources, cook) -> SoupReport:
    """greedy_soup's loop: every candidate scored alone, then tried in order."""
    own, best_values = [], None  # best_values: the best soup so far (a Snapshot)
    for i, source in enumerate(sources):
        own.append(cook([source], f"candidate {i}"))
        if i == 0 or _better(own[i], max(own[:i], key=_key)):
            best_values = _snapshot.snapshot(obj) if len(sources) > 1 else None
    order = sorted(range(len(sources)), key=lambda i: (-_key(own[i]), i))
    first = order[0]
    kept, best = [first], own[first]
    trace = [SoupStep(first, sources[first], own[first], own[first], True)]
    holds_best = first == len(sources) - 1
    for i in order[1:]:
        value = cook([sources[k] for k in (*kept, i)], f"the soup with candidate {i}")
        holds_best = _better_or_equal(value, best)
        trace.append(SoupStep(i, sources[i], own[i], value, holds_best))
        if holds_best:
            kept.append(i)
            best = value
            best_values = _snapshot.snapshot(obj)  # no bytes copied: the values are kept
    if not holds_best:
        _restore.restore(obj, best_values)
    return SoupReport(tuple(sources[i] for i in kept), best, tuple(trace), tuple(own))
