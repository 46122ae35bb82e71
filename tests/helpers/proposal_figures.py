"""How right `objckpt.plan`'s proposals are: precision and recall, against known mappings.

Two kinds of cases, each a model and a checkpoint whose right mapping is known:

- every shipped Hugging Face rule set (`objckpt.rules.supported()`), withheld in turn: the
  folder that transformers wrote (tests/fixtures/hf/, the first float32 row of hf_cases.CASES
  of that `model_type`, the task model where keras-hub has one) is read without its
  `config.json` (so no set is chosen) and without the set's head entries among those a
  proposal never pairs (the architecture is unknown); the right mapping is the set's own;
- TF1 name-based checkpoints that tf-slim wrote (tests/fixtures/slim/, make_slim_fixtures.py)
  of models whose keras.applications counterpart has the same structure; the right mapping is
  the hand-written one of make_slim_fixtures.py, whose outputs equal tf-slim's.

A pair is a variable the proposal feeds; it is right when the value it feeds is, bit for bit,
the one the right mapping feeds. Precision: right pairs / pairs; recall: right pairs /
variables the right mapping feeds. A proposal of nothing has precision 1.0 (it is silent).

Run as a script (Keras 3 with keras-hub) it prints the table that docs/huggingface.md quotes;
with `--write` it replaces the one there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import hf_cases  # noqa: E402
import hf_table  # noqa: E402
from hf_table import set_modules  # noqa: E402


class Figures(NamedTuple):
    """One case's figures."""

    case: str  # the row's name
    checkpoint: str  # what wrote the checkpoint, and its class
    model: str  # the Keras model's class
    proposed: int  # variables the proposal feeds
    right: int  # of those, fed the value the right mapping feeds
    mapped: int  # variables the right mapping feeds

    @property
    def precision(self) -> float:
        return self.right / self.proposed if self.proposed else 1.0

    @property
    def recall(self) -> float:
        return self.right / self.mapped if self.mapped else 1.0


def hf_rows() -> dict:
    """{model_type: the hf_cases row measured} for the shipped sets with a fixture: a set's
    first row in the original key form with a keras-hub task model, else its first row."""
    rows = {}
    for case in hf_cases.CASES:
        if case.form or not os.path.isdir(case.folder("float32")):
            continue
        model_type = hf_cases.config(case)["model_type"]
        old = rows.get(model_type)
        if old is None or (old.task is None and case.task is not None):
            rows[model_type] = case
    return {t: rows[t] for t in set_modules() if t in rows}


@contextlib.contextmanager
def withheld(module):
    """The proposal as if `module`'s set were not shipped: its Hub classes' head entries are
    no longer among those a proposal never pairs (heads other sets name stay)."""
    from objckpt._planning import propose as _propose

    others = set()
    for other in {id(m): m for m in set_modules().values()}.values():
        if other is not module:
            for value in getattr(other, "CLASSES", {}).values():  # (prefix, heads, ...)
                others.update(value[1])
    every = _propose.head_entries()
    kept = frozenset(h for h in every if h in others)
    saved = _propose.head_entries
    _propose.head_entries = lambda: kept
    try:
        yield
    finally:
        _propose.head_entries = saved


def _bits(variable) -> bytes:
    import numpy as np

    return np.asarray(variable.numpy()).tobytes()


def measure(model, source: str, right_rules, *, name: str, checkpoint: str,
            proposal_source: str | None = None, model_name: str = "") -> Figures:
    """Restores `source` into `model` by `right_rules`, then the proposal of
    `objckpt.plan(model, proposal_source or source)` (no rules) over it: its figures."""
    import objckpt

    shipped = objckpt.restore(model, source, rules=right_rules, strict=False)
    tree = objckpt.tree(model)
    want = {path: _bits(tree[path]) for path in shipped.restored}
    the_plan = objckpt.plan(model, proposal_source or source)
    proposed = right = 0
    if the_plan.proposed is not None:
        fed = objckpt.restore(model, proposal_source or source, rules=the_plan.proposed,
                              strict=False)
        proposed = len(fed.restored)
        right = sum(want.get(path) == _bits(tree[path]) for path in fed.restored)
    return Figures(name, checkpoint, model_name or type(model).__name__, proposed, right,
                   len(want))


def hf_figures(model_type: str) -> Figures:
    """The figures of the proposal on the shipped set of `model_type`, withheld."""
    import objckpt

    case = hf_rows().get(model_type)
    if case is None:
        raise LookupError(f"no fixture of tests/fixtures/hf/ (hf_cases.CASES) for the shipped "
                          f"set {model_type!r}: the proposal cannot be measured on it")
    folder = case.folder("float32")
    import keras

    # Names as a fresh session gives them: keras-hub numbers some blocks by a counter shared
    # by every model of a session (a mixture of experts' `mixtral_sparse_moe_block_3`), and
    # the proposal reads names, so the figures would depend on what was built before.
    keras.backend.clear_session()
    model = hf_cases.backbone(case)
    if case.task:
        model = hf_cases.task(case, model)
    bare = tempfile.mkdtemp(prefix="objckpt-proposal-")
    try:
        for name in os.listdir(folder):  # no config.json: no set is chosen
            if name.endswith((".safetensors", ".safetensors.index.json")):
                shutil.copy(os.path.join(folder, name), bare)
        with withheld(set_modules()[model_type]):
            return measure(model, folder, objckpt.rules.huggingface(folder),
                           name=model_type, checkpoint=f"transformers {case.cls}",
                           proposal_source=bare)
    finally:
        shutil.rmtree(bare, ignore_errors=True)


def slim_cases() -> list:
    """The names of the tf-slim fixtures (make_slim_fixtures.CASES)."""
    import make_slim_fixtures

    return list(make_slim_fixtures.CASES)


def slim_figures(name: str, keras=None) -> Figures:
    """The figures of the proposal on the tf-slim checkpoint `name` and its Keras model (in
    the flavour `keras`: the `keras` or `tf_keras` module; Keras 3 by default)."""
    import make_slim_fixtures

    model = make_slim_fixtures.keras_model(name, keras)
    case = make_slim_fixtures.CASES[name]
    return measure(model, make_slim_fixtures.prefix(name),
                   make_slim_fixtures.rules(name, keras),
                   name=name, checkpoint=f"tf-slim {case.net} (TF1 Saver)",
                   model_name=f"{case.keras}(alpha={case.alpha})")


def documented(page: str = hf_table.PAGE) -> dict:
    """{case: (precision, recall)} as docs/huggingface.md quotes this script's table."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    if "objckpt.plan's proposals (" not in text:
        return {}
    block = text.split("objckpt.plan's proposals (", 1)[1].split("```", 1)[0]
    found = {}
    for line in block.splitlines()[2:]:
        cells = line.split()
        if len(cells) >= 3 and cells[0] != "all" and re.fullmatch(r"[0-9.]+", cells[-1]):
            found[cells[0]] = (float(cells[-2]), float(cells[-1]))
    return found


def check(figures: Figures, quoted: dict) -> None:
    """AssertionError unless the proposal fed no wrong value (precision 1.0) and fed at least
    the share of the right mapping's variables that `quoted` (`documented()`) states."""
    assert figures.mapped > 0, figures
    assert figures.precision == 1.0, (
        f"{figures.case}: the proposal fed {figures.proposed - figures.right} of "
        f"{figures.proposed} variables a value the right mapping does not: {figures}")
    if figures.case in quoted:  # a set added later is not quoted until regenerated
        assert figures.recall >= quoted[figures.case][1] - 5e-4, (
            f"{figures.case}: recall {figures.recall:.3f}, docs/huggingface.md states "
            f"{quoted[figures.case][1]:.3f} (tests/helpers/proposal_figures.py)")


def table(rows) -> str:
    """The figures as the docs quote them: one line per case, then all together."""
    rows = list(rows)
    widths = [max([len(text) for text in texts] + [len(title)]) for title, texts in (
        ("case", [f.case for f in rows]), ("checkpoint", [f.checkpoint for f in rows]),
        ("model", [f.model for f in rows]))]

    def line(case, checkpoint, model, proposed, right, mapped):
        precision = right / proposed if proposed else 1.0
        recall = right / mapped if mapped else 1.0
        return (f"{case:<{widths[0]}}  {checkpoint:<{widths[1]}}  {model:<{widths[2]}}  "
                f"{proposed:>5}  {right:>5}  {mapped:>6}  {precision:>9.3f}  {recall:>6.3f}")

    lines = [f"{'case':<{widths[0]}}  {'checkpoint':<{widths[1]}}  {'model':<{widths[2]}}  "
             "pairs  right  mapped  precision  recall"]
    lines += [line(f.case, f.checkpoint, f.model, f.proposed, f.right, f.mapped) for f in rows]
    lines.append(line("all", "", "", sum(f.proposed for f in rows),
                      sum(f.right for f in rows), sum(f.mapped for f in rows)))
    return "\n".join(lines)


def report() -> str:
    """The table with its title line, as the docs quote it."""
    import keras
    import keras_hub

    rows = [hf_figures(t) for t in set_modules()] + [slim_figures(n) for n in slim_cases()]
    return (f"objckpt.plan's proposals (keras {keras.__version__}, keras-hub "
            f"{keras_hub.__version__}): tests/helpers/proposal_figures.py\n{table(rows)}\n")


def write(page: str = hf_table.PAGE) -> None:
    """Replaces the figures docs/huggingface.md quotes with this run's."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    start = text.index("objckpt.plan's proposals (")
    end = text.index("```", start)
    with open(page, "w", encoding="utf-8") as f:
        f.write(text[:start] + report() + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(report(), end="")
