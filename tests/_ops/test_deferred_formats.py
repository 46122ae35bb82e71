"""`restore_on_create` from the formats beside TF checkpoints: a SavedModel, a
Keras 3 `.weights.h5`, a Keras `.h5`. Their keys are no object paths, so values reach the
variables through the plan: at once for variables that exist, and at the end of each Keras
build for a model built later, before its first call uses them."""

from __future__ import annotations

import numpy as np
import pytest

import objckpt
from objckpt import errors

from flavours import keras_for

X = np.random.default_rng(0).normal(size=(4, 4)).astype("float32")


def _functional(keras):
    inputs = keras.Input((4,))
    hidden = keras.layers.BatchNormalization(name="bn")(
        keras.layers.Dense(8, name="encoder")(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden), name="mlp")


def _subclassed(keras):
    class Net(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.encoder = keras.layers.Dense(8, name="encoder")
            self.bn = keras.layers.BatchNormalization(name="bn")
            self.head = keras.layers.Dense(2, name="head")

        def call(self, x):
            return self.head(self.bn(self.encoder(x)))

    return Net(name="net")


def _trained(model):
    model.compile("adam", "mse")
    model.fit(X, np.ones((4, 2), "float32"), epochs=1, verbose=0)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A Keras 3 functional model and a subclassed one, each saved in every Keras 3 format."""
    keras = keras_for("keras3")
    out = tmp_path_factory.mktemp("formats")
    made = {}
    for kind, build in (("functional", _functional), ("subclassed", _subclassed)):
        model = _trained(build(keras))
        made[kind] = {"outputs": model(X).numpy(),
                      "weights.h5": str(out / f"{kind}.weights.h5"),
                      ".h5": str(out / f"{kind}.h5"), ".keras": str(out / f"{kind}.keras")}
        model.save_weights(made[kind]["weights.h5"])
        model.save(made[kind][".keras"])
        model.save(made[kind][".h5"])
        if kind == "functional":
            made[kind]["export"] = str(out / f"{kind}-export")
            model.export(made[kind]["export"], verbose=False)
    return made


@pytest.mark.parametrize("fmt", ["weights.h5", ".keras", ".h5", "export"])
def test_existing_variables_get_their_values_at_once(files, fmt):
    keras = keras_for("keras3")
    model = _functional(keras)  # a functional model's variables exist from the start
    pending = objckpt.restore_on_create(model, files["functional"][fmt])
    assert pending.done, pending
    assert len(pending.applied) == len(model.weights) == 8
    np.testing.assert_array_equal(model(X).numpy(), files["functional"]["outputs"])


@pytest.mark.parametrize("fmt", ["weights.h5", ".keras", ".h5"])
def test_values_land_when_an_unbuilt_model_builds_before_its_first_call(files, fmt):
    keras = keras_for("keras3")
    model = _subclassed(keras)
    pending = objckpt.restore_on_create(model, files["subclassed"][fmt])
    assert not model.weights and not pending.done and not pending.applied
    first = model(X).numpy()  # the first call already computes with the restored values
    assert pending.done, pending
    pending.assert_done()
    np.testing.assert_array_equal(first, files["subclassed"]["outputs"])


def test_a_shape_that_does_not_fit_is_refused_and_nothing_changes(files):
    keras = keras_for("keras3")
    inputs = keras.Input((4,))
    hidden = keras.layers.BatchNormalization(name="bn")(
        keras.layers.Dense(9, name="encoder")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden), name="mlp")
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(errors.StructureMismatchError, match="shape"):
        objckpt.restore_on_create(model, files["functional"][".h5"])
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, new.numpy())


def test_a_subclassed_keras3_export_restores_by_its_variables_order(tmp_path):
    """Keras 3 saves a subclassed model's variables under names that drop the inner layers
    (`net/kernel` twice): a `model.export` then restores by the order of its `variables`
    list, all or nothing, and not when one shape differs."""
    keras = keras_for("keras3")
    model = _trained(_subclassed(keras))
    model.export(str(tmp_path / "export"), verbose=False)
    other = _subclassed(keras)
    other(X)
    the_plan = objckpt.plan(other, str(tmp_path / "export"))
    assert the_plan.complete and the_plan.strategies() == {"export order": 8}, \
        the_plan.describe()
    objckpt.restore(other, str(tmp_path / "export"))
    np.testing.assert_array_equal(other(X).numpy(), model(X).numpy())
    later = _subclassed(keras)  # built by its first call, after restore_on_create
    pending = objckpt.restore_on_create(later, str(tmp_path / "export"))
    np.testing.assert_array_equal(later(X).numpy(), model(X).numpy())
    assert pending.done
    # A model whose head is wider is no such list: nothing is matched by order.
    wider = _subclassed(keras)
    wider.head = keras.layers.Dense(3, name="head")
    wider(X)
    the_plan = objckpt.plan(wider, str(tmp_path / "export"))
    assert "export order" not in the_plan.strategies() and not the_plan.complete


def test_an_ensemble_of_members_from_different_formats(files):
    """load_ensemble takes its N sources in any format: here the same trained functional
    model from a `.weights.h5`, a Keras `.h5` and a `model.export`, and one trained anew."""
    keras = keras_for("keras3")
    other = _trained(_functional(keras))
    template = _functional(keras)
    saved = files["functional"]
    ensemble = objckpt.load_ensemble(template, [saved["weights.h5"], saved[".h5"],
                                                saved["export"], objckpt.snapshot(other)])
    outputs = np.stack([m(X).numpy() for m in ensemble.members])
    for i in range(3):
        np.testing.assert_array_equal(outputs[i], saved["outputs"])
    np.testing.assert_array_equal(outputs[3], other(X).numpy())
