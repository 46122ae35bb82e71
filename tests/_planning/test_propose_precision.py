"""How right `objckpt.plan`'s proposals are, on checkpoints whose right mapping is known.

Every shipped Hugging Face rule set, withheld in turn (its folder read without config.json,
its heads unknown), into its keras-hub task model (tf-slim's checkpoints:
test_propose_slim.py): a proposal never feeds a variable a value other than the right
mapping's (precision 1.0), and feeds at least the share docs/huggingface.md states (recall,
from tests/helpers/proposal_figures.py's table there). The sets are found by their modules,
so a set added to objckpt.rules is measured here without editing this file.
"""

from __future__ import annotations

import pytest

pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("keras-hub's models need Keras 3", allow_module_level=True)
pytest.importorskip("safetensors.numpy")

import hf_table  # noqa: E402
import make_slim_fixtures  # noqa: E402
import proposal_figures  # noqa: E402

SETS = list(hf_table.set_modules())
SLIM = list(make_slim_fixtures.CASES)


@pytest.fixture(scope="module")
def documented():
    return proposal_figures.documented()


@pytest.mark.parametrize("model_type", SETS)
def test_a_proposal_for_a_withheld_set_pairs_nothing_wrongly(model_type, documented):
    proposal_figures.check(proposal_figures.hf_figures(model_type), documented)


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
    assert set(documented) <= set(SETS) | set(SLIM)
    assert documented, "docs/huggingface.md quotes no proposal figures"
