"""Optimizer state by the variable it belongs to (`_planning.optstate`): a Keras 3 model with
LoRA enabled resumes from its own weights file as Keras's loader resumes it (every optimizer
variable moved by its place, the merged kernel and zeroed factors as Keras leaves them), and
from a TF checkpoint exactly as the uninterrupted run goes on."""

from __future__ import annotations

import numpy as np
import pytest

import objckpt

from flavours import keras_for

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(8, 4)).astype("float32")
_Y = _RNG.normal(size=(8, 2)).astype("float32")


def _lora_model(keras):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, name="a"),
                              keras.layers.Dense(2, name="b")])
    for layer in model.layers:
        layer.enable_lora(2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _trained(keras):
    model = _lora_model(keras)
    for _ in range(2):  # LoRA factors and every Adam moment off their initial values
        model.train_on_batch(_X, _Y)
    return model


def _state(model) -> list[bytes]:
    return [np.asarray(v.numpy()).tobytes()
            for v in [*model.variables, *model.optimizer.variables]]


def _keras3():
    keras = keras_for("keras3")
    if not hasattr(keras.layers.Dense(1), "enable_lora"):
        pytest.skip("this Keras has no LoRA")
    return keras


@pytest.mark.parametrize("name", ["w.weights.h5", "m.keras"])
def test_lora_resumes_from_a_keras_file_as_keras_load_weights_resumes(name, tmp_path):
    keras = _keras3()
    trained = _trained(keras)
    path = str(tmp_path / name)
    trained.save_weights(path) if name.endswith(".weights.h5") else trained.save(path)
    ours, theirs = _lora_model(keras), _lora_model(keras)
    report = objckpt.restore(ours, path)
    assert not report.missing and not report.unexpected
    slots = [p for p in report.restored if p.startswith("optimizer/_variables/")
             or p in ("optimizer/_iterations", "optimizer/_learning_rate")]
    assert len(slots) == len(trained.optimizer.variables) == 14  # every Adam variable
    theirs.optimizer.build(theirs.trainable_variables)
    theirs.load_weights(path)  # Keras's own loader: the oracle
    assert _state(ours) == _state(theirs)
    assert int(ours.optimizer.iterations.numpy()) == 2
    ours.train_on_batch(_X, _Y)
    theirs.train_on_batch(_X, _Y)
    assert _state(ours) == _state(theirs)  # the next step, bit for bit


def test_lora_resumes_from_a_checkpoint_as_the_uninterrupted_run(tmp_path):
    keras = _keras3()
    trained = _trained(keras)
    prefix = objckpt.save(trained, str(tmp_path / "ckpt"))
    resumed = _lora_model(keras)
    objckpt.restore(resumed, prefix)
    assert _state(resumed) == _state(trained)
    trained.train_on_batch(_X, _Y)
    resumed.train_on_batch(_X, _Y)
    assert _state(resumed) == _state(trained)


def test_without_lora_in_the_obj_the_file_optimizer_state_is_still_skipped(tmp_path):
    keras = _keras3()
    path = str(tmp_path / "w.weights.h5")
    _trained(keras).save_weights(path)
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, name="a"),
                              keras.layers.Dense(2, name="b")])
    plain.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    planned = objckpt.plan(plain, path)
    # the obj's Adam trains kernels, the file's LoRA factors: another layout, never guessed
    assert not any(m.target.startswith("optimizer/_variables") for m in planned.matches)
    assert any("another layout" in note for note in planned.notes)
