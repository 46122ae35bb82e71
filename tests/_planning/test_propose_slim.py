"""`objckpt.plan`'s proposals for TF1 name-based checkpoints that tf-slim wrote.

tests/fixtures/slim/ holds MobileNet v1 and v2 built from tf-slim's layers as TensorFlow's
model garden defines them (tests/helpers/make_slim_fixtures.py writes them, with tf-slim's
logits on a fixed input). Their keras.applications counterparts, in every Keras flavour,
restore them through the mapping written in make_slim_fixtures.py and compute tf-slim's
logits: that mapping is right. A proposal made without it never feeds a variable another
value (precision 1.0) and, in Keras 3, feeds at least the share docs/huggingface.md states.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import objckpt

import make_slim_fixtures
import proposal_figures
from flavours import KERAS_FLAVOURS, keras_for

CASES = list(make_slim_fixtures.CASES)


@pytest.fixture(scope="module")
def documented():
    return proposal_figures.documented()


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_the_mapping_gives_tf_slims_logits(flavour, name):
    keras = keras_for(flavour)
    model = make_slim_fixtures.keras_model(name, keras)
    prefix = make_slim_fixtures.prefix(name)
    report = objckpt.restore(model, prefix, rules=make_slim_fixtures.rules(name, keras))
    assert not report.missing and not report.unexpected  # every weight, every entry
    assert len(report.restored) == len(tf.train.list_variables(prefix)) > 100
    oracle = make_slim_fixtures.oracle(name)
    np.testing.assert_allclose(np.asarray(model(oracle["input"])), oracle["logits"],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_proposal_pairs_nothing_wrongly(flavour, name, documented):
    keras = keras_for(flavour)
    figures = proposal_figures.slim_figures(name, keras)
    proposal_figures.check(figures, documented if flavour == "keras3" else {})
    assert figures.recall > 0.5, figures  # the shared words and places pair most of it


def test_every_case_is_quoted_in_the_docs(documented):
    assert set(CASES) <= set(documented)


def test_the_figures_count_a_value_the_mapping_disagrees_with(documented):
    """The measurement can fail: against a mapping that swaps one norm's gamma and beta, the
    proposal's two pairs there (right by their names) count as wrong, and `check` refuses."""
    keras = keras_for("keras3")
    name = "mobilenet_v1_025"
    swapped = [(r"^MobilenetV1/Conv2d_1_pointwise/BatchNorm/gamma$", "conv_pw_1_bn/beta"),
               (r"^MobilenetV1/Conv2d_1_pointwise/BatchNorm/beta$", "conv_pw_1_bn/gamma"),
               *make_slim_fixtures.rules(name, keras)]
    figures = proposal_figures.measure(
        make_slim_fixtures.keras_model(name, keras), make_slim_fixtures.prefix(name), swapped,
        name=name, checkpoint="tf-slim")
    honest = proposal_figures.slim_figures(name, keras)
    assert (figures.proposed, figures.mapped) == (honest.proposed, honest.mapped)
    assert figures.right == honest.right - 2
    with pytest.raises(AssertionError, match="fed 2 of"):
        proposal_figures.check(figures, documented)
