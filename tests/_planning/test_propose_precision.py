"""How right `objckpt.plan`'s proposals are, on checkpoints whose right mapping is known.

Every shipped Hugging Face rule set, withheld in turn (its folder read without config.json,
its heads unknown), and every tf-slim checkpoint of tests/fixtures/slim/ against its
keras.applications model: a proposal never feeds a variable a value other than the right
mapping's (precision 1.0), and feeds at least the share docs/huggingface.md states (recall,
from tests/helpers/proposal_figures.py's table there). The sets are found by their modules,
so a set added to objckpt.rules is measured here without editing this file.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import objckpt

pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("keras-hub's models need Keras 3", allow_module_level=True)
pytest.importorskip("safetensors.numpy")

import hf_table  # noqa: E402
import make_slim_fixtures  # noqa: E402
import proposal_figures  # noqa: E402

from support import ROOT  # noqa: E402

SETS = list(hf_table.set_modules())
SLIM = list(make_slim_fixtures.CASES)


def _documented() -> dict:
    """{case: (precision, recall)} as docs/huggingface.md quotes the figures."""
    with open(os.path.join(ROOT, "docs", "huggingface.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("objckpt.plan's proposals (", 1)[1].split("```", 1)[0]
    found = {}
    for line in block.splitlines()[2:]:
        cells = line.split()
        if len(cells) >= 3 and re.fullmatch(r"[0-9.]+", cells[-1]):
            found[cells[0]] = (float(cells[-2]), float(cells[-1]))
    return found


@pytest.fixture(scope="module")
def documented():
    return _documented()


def _check(figures, documented):
    assert figures.mapped > 0, figures
    assert figures.precision == 1.0, (
        f"{figures.case}: the proposal fed {figures.proposed - figures.right} of "
        f"{figures.proposed} variables a value the right mapping does not: {figures}")
    if figures.case in documented:  # a set added later is not quoted until regenerated
        assert figures.recall >= documented[figures.case][1] - 5e-4, (
            f"{figures.case}: recall {figures.recall:.3f}, docs/huggingface.md states "
            f"{documented[figures.case][1]:.3f} (tests/helpers/proposal_figures.py)")


@pytest.mark.parametrize("model_type", SETS)
def test_a_proposal_for_a_withheld_set_pairs_nothing_wrongly(model_type, documented):
    _check(proposal_figures.hf_figures(model_type), documented)


@pytest.mark.parametrize("name", SLIM)
def test_a_proposal_for_a_tf_slim_checkpoint_pairs_nothing_wrongly(name, documented):
    _check(proposal_figures.slim_figures(name), documented)


@pytest.mark.parametrize("name", SLIM)
def test_the_tf_slim_mapping_gives_tf_slim_outputs(name):
    """The mapping the figures count as right is right: through it the keras.applications
    model restores every variable from tf-slim's checkpoint and computes tf-slim's logits."""
    model = make_slim_fixtures.keras_model(name)
    report = objckpt.restore(model, make_slim_fixtures.prefix(name),
                             rules=make_slim_fixtures.rules(name))
    import tensorflow as tf

    entries = tf.train.list_variables(make_slim_fixtures.prefix(name))
    assert not report.missing and not report.unexpected  # every weight, every entry
    assert len(report.restored) == len(entries) > 100
    oracle = make_slim_fixtures.oracle(name)
    np.testing.assert_allclose(np.asarray(model(oracle["input"])), oracle["logits"],
                               rtol=1e-4, atol=1e-4)


def test_a_withheld_set_leaves_its_own_heads_unknown():
    """Withheld, BERT's masked-LM head entries are no longer set aside from proposals (the
    architecture is unknown); heads other sets name too (`classifier.weight`) still are."""
    from objckpt._planning import propose

    bert = hf_table.set_modules()["bert"]
    every = propose.head_entries()
    assert {"cls.predictions.bias", "classifier.weight"} <= every
    with proposal_figures.withheld(bert):
        heads = propose.head_entries()
        assert "cls.predictions.bias" not in heads and "classifier.weight" in heads
    assert propose.head_entries() == every


def test_every_documented_case_is_measured(documented):
    """The docs quote no case that is no longer measured."""
    assert set(documented) - {"all"} <= set(SETS) | set(SLIM)
    assert documented, "docs/huggingface.md quotes no proposal figures"
