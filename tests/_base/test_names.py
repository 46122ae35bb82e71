"""Names people know: errors and plans show each variable by its network path and its
Keras/TF name, one line per network variable (its optimizer slots summarised on it), and
only the fixes that apply, with examples in the user's own keys."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

import flavours
from support import assert_bits, values


def _mlp(keras, width, kind):
    """A compiled MLP trained one step (Adam slots exist): `encoder` and `head` layers."""
    if kind == "sequential":
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, name="encoder"),
                                  keras.layers.Dense(2, name="head")], name="mlp")
    else:
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(width, name="encoder")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden), name="mlp")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), epochs=1, verbose=0)
    return model


def _lines(err) -> list[str]:
    return [line for line in str(err).splitlines() if line.startswith("  - ")]


@pytest.mark.parametrize("flavour", flavours.KERAS_FLAVOURS)
@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_shape_error_one_line_per_network_variable(flavour, kind, tmp_path):
    keras = flavours.keras_for(flavour)
    saved = _mlp(keras, 8, kind)
    prefix = objckpt.save(saved, str(tmp_path / "ckpt"))
    model = _mlp(keras, 9, kind)
    before = values(model)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(model, prefix)
    assert_bits(before, values(model))
    lines = _lines(info.value)
    # encoder kernel, encoder bias and head kernel differ; head bias (2,) fits. One line
    # each: by the network path with the Keras name beside it, the Adam slots summarised.
    assert len(lines) == 3, str(info.value)
    assert "3 problems" in str(info.value)
    the_plan = objckpt.plan(model, prefix)
    tree = objckpt.tree(model)
    for line, layer, weight, shape in zip(
            lines, ("encoder", "encoder", "head"), ("kernel", "bias", "kernel"),
            ["(4, 8) in the source but (4, 9)", "(8,) in the source but (9,)",
             "(8, 2) in the source but (9, 2)"]):
        path = next(p for p, v in tree.items() if the_plan.slot_of(p) is None and
                    f"{layer}/{weight}" in v.name)
        shown, name = the_plan.display(path)
        assert not shown.startswith("optimizer/"), shown  # the network path, not the list
        assert name.endswith(f"{layer}/{weight}"), name
        assert line == (f"  - `{shown}` [{name}]: shape {shape} in the obj (also its "
                        "optimizer slots m, v)")
    message = str(info.value)
    fix = message[message.index("Fix:"):]
    assert "rebuild the obj" in fix
    assert "transform" not in fix  # no rule was passed
    assert "strict=False to restore only" not in fix  # nothing missing or extra


def test_keras3_sequential_names_and_slots(tmp_path):
    keras = flavours.keras_for("keras3")
    saved = _mlp(keras, 8, "sequential")
    prefix = objckpt.save(saved, str(tmp_path / "ckpt"))
    model = _mlp(keras, 9, "sequential")
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(model, prefix)
    assert _lines(info.value) == [
        "  - `_functional/_operations/1/_kernel` [mlp/encoder/kernel]: shape (4, 8) in the "
        "source but (4, 9) in the obj (also its optimizer slots m, v)",
        "  - `_functional/_operations/1/bias` [mlp/encoder/bias]: shape (8,) in the source but "
        "(9,) in the obj (also its optimizer slots m, v)",
        "  - `_functional/_operations/2/_kernel` [mlp/head/kernel]: shape (8, 2) in the source "
        "but (9, 2) in the obj (also its optimizer slots m, v)"]
    # The plan's table shows the same names, and each slot row says whose slot it is.
    text = objckpt.plan(saved, prefix).describe()
    assert "  _functional/_operations/1/_kernel  [mlp/encoder/kernel]" in text
    assert re.search(r"optimizer/_variables/2  \[m of `_functional/_operations/1/_kernel`\]",
                     text), text


@pytest.mark.parametrize("flavour", flavours.KERAS_FLAVOURS)
def test_missing_layer_is_one_line_per_variable_with_its_slots(flavour, tmp_path):
    keras = flavours.keras_for(flavour)
    saved = _mlp(keras, 8, "functional")
    prefix = objckpt.save(saved, str(tmp_path / "ckpt"))
    # The same network with one more layer after the head: its kernel and bias are missing
    # from the source; their Adam slots keep their values (skipped, not missing).
    inputs = keras.Input((4,))
    out = keras.layers.Dense(2, name="head")(keras.layers.Dense(8, name="encoder")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, name="extra")(out), name="mlp")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 3), "float32"), epochs=1, verbose=0)
    before = values(model)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(model, prefix)
    assert_bits(before, values(model))
    lines = _lines(info.value)
    assert len(lines) == 2, str(info.value)
    for line, role in zip(lines, ("kernel", "bias")):
        assert line.endswith(": in the obj but missing from the source"), line
        assert "extra" in line and role in line, line
    assert "optimizer" not in str(info.value).split("Fix:")[0]
    fix = str(info.value)[str(info.value).index("Fix:"):]
    assert "pass strict=False to restore only what matches" in fix
    assert "rebuild" not in fix and "transform" not in fix
    report = objckpt.restore(model, prefix, strict=False)
    assert len(report.missing) == 2
    skipped = [s for s in report.skipped if "left as is" in s]
    assert len(skipped) == 4 and all(re.search(r"\[[mv] of `[^`]*`\]: ", s) for s in skipped), \
        skipped


def _module(names=("dense",), extra=False):
    module = tf.Module()
    for name in names:
        layer = tf.Module()
        layer.kernel = tf.Variable(tf.ones((2, 3)), name=f"{name}/kernel")
        setattr(module, name, layer)
    if extra:
        module.bias = tf.Variable(tf.zeros((3,)), name="bias")
    return module


def test_fix_suggests_at_and_a_rule_in_the_users_keys(tmp_path):
    root = tf.train.Checkpoint(model_001=_module())
    prefix = root.write(str(tmp_path / "ckpt"))
    obj = _module(extra=True)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(obj, prefix)
    message = str(info.value)
    assert "  - `bias`: in the obj but missing from the source" in message
    assert "  - `dense/kernel`: in the obj but missing from the source" in message
    # The source entry's saved name beside its key.
    assert "  - `model_001/dense/kernel` [dense/kernel]: in the source but not in the obj" \
        in message
    fix = message[message.index("Fix:"):]
    assert "pass at='model_001'" in fix
    assert "rules=[('^model_001/', '')]" in fix
    assert "optimizer_state" not in fix  # no optimizer state anywhere
    assert "transform" not in fix
    # A source key that ends with no variable's path: the example maps it whole onto the
    # variable of its shape (not onto `bias`, listed first).
    other = tf.train.Checkpoint(old=_module())
    other_prefix = other.write(str(tmp_path / "other"))
    obj = _module(names=("new",), extra=True)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(obj, other_prefix)
    fix = str(info.value)[str(info.value).index("Fix:"):]
    assert "rules=[('^old/dense/kernel$', 'new/kernel')]" in fix
    assert "pass at=" not in fix


def test_transform_fix_only_when_a_transform_fails(tmp_path):
    module = _module()
    prefix = objckpt.save(module, str(tmp_path / "ckpt"))
    obj = _module()
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(obj, prefix, rules=[("^dense/kernel$", "dense/kernel",
                                             lambda t: tf.reshape(t, (3, 2)))])
    message = str(info.value)
    assert "`dense/kernel` [dense/kernel]" not in message  # the name repeats the path: no note
    assert "  - `dense/kernel`: shape (3, 2) in the source but (2, 3) in the obj (source " \
           "entry `dense/kernel`, transformed)" in message
    assert "fix the rule's transform" in message


def test_plan_label_and_slot_of_for_tf_keras_style_slots(tmp_path):
    keras = flavours.keras_for(flavours.session_flavour()
                               if flavours.session_flavour() != "module" else "keras3")
    model = _mlp(keras, 8, "functional")
    the_plan = objckpt.plan(model, objckpt.snapshot(model))
    slots = {p: the_plan.slot_of(p) for p in objckpt.tree(model) if the_plan.slot_of(p)}
    kernel = next(p for p, v in objckpt.tree(model).items()
                  if "encoder" in v.name and "kernel" in v.name and p not in slots)
    roles = sorted(role for owner, role in slots.values() if owner == kernel)
    assert roles == ["m", "v"], (kernel, slots)
    slot = next(p for p, (owner, role) in slots.items() if owner == kernel and role == "m")
    assert the_plan.label(slot) == f"`{slot}` [m of `{the_plan.display(kernel)[0]}`]"
