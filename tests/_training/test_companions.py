"""The registry of state callbacks keep beside a model: names checked, one entry per name,
entries gone with their model, and a checkpoint's companions reconciled with the fit's."""

import gc
import weakref

import pytest

from objckpt import errors
from objckpt._training import companions


class _Model:
    """Anything weakly referenceable stands for a model here."""


class _State(companions.Companion):
    def __init__(self, value):
        self.value, self.saves = value, []

    def state(self):
        return self.value

    def before_save(self, epoch_end):
        self.saves.append(epoch_end)


def test_registered_state_is_saved_with_its_model_in_name_order():
    model, other = _Model(), _Model()
    swa, ema = _State("swa-state"), _State("ema-state")
    companions.register(model, "swa", swa)
    companions.register(model, "ema", ema)
    assert list(companions.saved_with(model).items()) == [("ema", "ema-state"),
                                                          ("swa", "swa-state")]
    assert companions.saved_with(other) == {}
    companions.before_save(model, epoch_end=True)
    assert swa.saves == [True] and ema.saves == [True]


def test_a_newer_companion_replaces_one_of_the_same_name_and_unregister_keeps_the_newer():
    model = _Model()
    old, new = _State(1), _State(2)
    companions.register(model, "swa", old)
    companions.register(model, "swa", new)
    assert companions.saved_with(model) == {"swa": 2}
    companions.unregister(model, "swa", old)  # no longer the one registered: nothing happens
    assert companions.saved_with(model) == {"swa": 2}
    companions.unregister(model, "swa", new)
    assert companions.saved_with(model) == {}


def test_entries_go_with_their_model():
    model, state = _Model(), _State(1)
    companions.register(model, "swa", state)
    alive = weakref.ref(model)
    assert any(state in entries.values() for entries in companions._REGISTERED.values())
    del model
    gc.collect()
    assert alive() is None  # the registry kept no strong reference to the model
    assert not any(state in entries.values() for entries in companions._REGISTERED.values())


@pytest.mark.parametrize("name", ["model", "epoch", "monitor_value", "two words", "", 3, None])
def test_names_that_cannot_name_state_are_refused(name):
    with pytest.raises(errors.InvalidArgumentError, match=r"Received: name=") as info:
        companions.register(_Model(), name, _State(0))
    assert "name='swa'" in str(info.value)


def test_reconcile_names_what_the_checkpoint_lacks_and_what_nothing_keeps():
    paths = ["model/dense/kernel", "epoch", "swa/model/dense/kernel", "swa/count", "swa/seen",
             "old/seen", "model/seen"]
    missing, unused = companions.reconcile(paths, {"swa": object(), "ema": object()})
    assert missing == ["ema"]
    assert unused == ["old"]  # `model` is Checkpointing's own, never a companion
    assert companions.reconcile(paths, {"swa": 1, "old": 2}) == ([], [])
