"""Plans and rules: which source entry feeds which variable, in every flavour."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import KERAS_FLAVOURS, keras_for
from support import assert_bits, values


def _renamable(keras, first: str, second: str, seed: int):
    """A subclassed model whose two Dense layers sit under the given attribute names."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            setattr(self, first, keras.layers.Dense(4, activation="relu"))
            setattr(self, second, keras.layers.Dense(2))
            self.norm = keras.layers.BatchNormalization()
            self._names = (first, second)

        def call(self, x, training=False):
            a, b = (getattr(self, n) for n in self._names)
            return b(self.norm(a(x), training=training))

    tf.random.set_seed(seed)
    model = Net()
    model(tf.ones((2, 3)))
    return model


def _outputs(model):
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 3)), tf.float32)
    return model(x, training=False).numpy()


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_renamed_attributes_restore_with_two_rules(flavour, tmp_path):
    keras = keras_for(flavour)
    old = _renamable(keras, "encoder", "head", seed=1)
    new = _renamable(keras, "hidden", "readout", seed=2)
    prefix = objckpt.save(old, str(tmp_path / "old"))
    rules = [("^encoder/", "hidden/"), ("^head/", "readout/")]
    plan = objckpt.plan(new, prefix, rules=rules)
    assert plan.complete, plan.describe()
    assert plan.strategies() == {"rule": 4, "exact": 4}  # two Dense renamed; BatchNorm as is
    assert all(m.rule.startswith("rule ") for m in plan.matches if m.strategy == "rule")
    report = objckpt.restore(new, prefix, rules=rules)
    assert len(report.restored) == 8 and report.plan == plan
    np.testing.assert_array_equal(_outputs(new), _outputs(old))
    table = plan.describe()
    assert "hidden/" in table and "encoder/" in table and "complete: rule 4, exact 4" in table


def test_without_rules_a_rename_is_refused_and_nothing_changes(tmp_path):
    keras = keras_for("keras3")
    old = _renamable(keras, "encoder", "head", seed=1)
    new = _renamable(keras, "hidden", "readout", seed=2)
    before = values(objckpt.tree(new))
    prefix = objckpt.save(old, str(tmp_path / "old"))
    plan = objckpt.plan(new, prefix)
    assert not plan.complete and "hidden/_kernel" in plan.unmatched_variables
    assert "encoder/_kernel" in plan.unmatched_source
    with pytest.raises(errors.StructureMismatchError, match="rules=") as info:
        objckpt.restore(new, prefix)
    # Keras 3 names both kernels of this subclassed model `net_1/kernel`: a name several
    # variables share is not shown.
    assert "  - `hidden/_kernel`: in the obj but missing from the source" in str(info.value)
    assert_bits(before, values(objckpt.tree(new)))


def test_underscore_and_variable_name_strategies():
    keras = keras_for("keras3")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))
    tree = objckpt.tree(model)
    kernel_path = next(p for p in tree if p.endswith("_kernel"))
    bias_path = next(p for p in tree if p.endswith("bias"))
    kernel, bias = np.full((3, 2), 1.5, np.float32), np.array([1.0, -1.0], np.float32)
    # `.../kernel` ~ `.../_kernel`; `dense/bias` is the TF variable name.
    source = objckpt.Snapshot({kernel_path.replace("_kernel", "kernel"): kernel,
                               "dense/bias": bias})
    plan = objckpt.plan(model, source)
    assert {m.target: m.strategy for m in plan.matches} == {kernel_path: "underscore",
                                                            bias_path: "name"}
    objckpt.restore(model, source)
    np.testing.assert_array_equal(tree[kernel_path].numpy(), kernel)
    np.testing.assert_array_equal(tree[bias_path].numpy(), bias)


def test_ambiguous_matches_are_never_guessed():
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    # Both keys reach `w` at the same rank (one exactly, one by a rule).
    source = objckpt.Snapshot({"w": [1.0, 2.0], "old_w": [3.0, 4.0]})
    rules = [("^old_", "")]
    plan = objckpt.plan(module, source, rules=rules)
    assert plan.ambiguous == (("w", ("w", "old_w")),) and not plan.matches
    for strict in (True, False):
        with pytest.raises(errors.StructureMismatchError, match="ambiguous, not guessed: `w`"):
            objckpt.restore(module, source, rules=rules, strict=strict)
    np.testing.assert_array_equal(module.w.numpy(), [0.0, 0.0])


def test_one_key_for_two_variables_is_ambiguous():
    module = tf.Module()
    module.a = tf.Variable(tf.zeros((2,)), name="same")
    module.b = tf.Variable(tf.zeros((2,)), name="same")
    plan = objckpt.plan(module, objckpt.Snapshot({"same": [1.0, 2.0]}))
    assert plan.ambiguous == (("same", ("a", "b")),)
    assert not plan.unmatched_variables  # both listed as ambiguous candidates instead


def test_drop_rule_skips_and_unused_rule_warns():
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    source = objckpt.Snapshot({"w": [1.0, 2.0], "extra": [5.0]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = objckpt.plan(module, source, rules=[("^extra$", None), ("^nothing/", "x/")])
    assert plan.complete and plan.skipped == ("extra: dropped by rule 0 ('^extra$' -> None)",)
    assert plan.unused_rules == ("rule 1 ('^nothing/' -> 'x/')",)
    assert any("matched no key" in str(w.message) and "^nothing/" in str(w.message)
               for w in caught)
    objckpt.restore(module, source, rules=[("^extra$", None)])
    np.testing.assert_array_equal(module.w.numpy(), [1.0, 2.0])


@pytest.mark.parametrize(("rules", "message"), [
    ([("[unclosed", "")], r"rule 0: '\[unclosed' is not a valid regular expression"),
    (("^a/", ""), "a single rule. Fix: wrap it in a list"),
    ([("^a/",)], r"rule 0 must be \(regex, replacement\)"),
    ([("^a/", 3)], "rule 0: the replacement must be a string or None"),
    ([("^a/", "", "not callable")], "rule 0: the transform must be a callable"),
])
def test_invalid_rules_are_typed_errors(rules, message):
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    with pytest.raises(errors.InvalidArgumentError, match=message):
        objckpt.restore(module, objckpt.Snapshot({"w": [1.0, 2.0]}), rules=rules)
    np.testing.assert_array_equal(module.w.numpy(), [0.0, 0.0])


def test_bad_group_reference_in_a_replacement():
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    with pytest.raises(errors.InvalidArgumentError, match=r"cannot be applied to `old/w`"):
        objckpt.plan(module, objckpt.Snapshot({"old/w": [1.0, 2.0]}), rules=[("^old/", r"\2")])


def test_transform_attached_to_a_rule():
    module = tf.Module()
    module.kernel = tf.Variable(tf.zeros((2, 3)))
    stored = np.arange(6, dtype=np.float32).reshape(3, 2)  # the old layout, transposed
    source = objckpt.Snapshot({"w": stored})
    plan = objckpt.plan(module, source, rules=[("^w$", "kernel", tf.transpose)])
    assert plan.complete and plan.matches[0].strategy == "rule"
    objckpt.restore(module, source, rules=[("^w$", "kernel", tf.transpose)])
    np.testing.assert_array_equal(module.kernel.numpy(), stored.T)


@pytest.mark.parametrize(("transform", "message"), [
    (lambda t: tf.reshape(t, (6,)), r"`kernel`: shape \(6,\) in the source but \(2, 3\)"),
    (lambda t: t[10, 10, 10], "the transform fails on a float32"),
])
def test_transform_that_does_not_fit_changes_nothing(transform, message):
    module = tf.Module()
    module.kernel = tf.Variable(tf.zeros((2, 3)))
    source = objckpt.Snapshot({"w": np.ones((3, 2), np.float32)})
    for strict in (True, False):
        with pytest.raises(errors.StructureMismatchError, match=message):
            objckpt.restore(module, source, rules=[("^w$", "kernel", transform)], strict=strict)
    np.testing.assert_array_equal(module.kernel.numpy(), np.zeros((2, 3)))


def test_plan_of_an_unbuilt_model_points_to_restore_on_create():
    keras = keras_for("keras3")
    with pytest.raises(errors.UnbuiltModelError, match="restore_on_create"):
        objckpt.plan(keras.layers.Dense(2), objckpt.Snapshot({"w": [1.0]}))


def test_plan_is_frozen_and_changes_nothing(tmp_path):
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    plan = objckpt.plan(module, objckpt.Snapshot({"w": [1.0, 2.0]}))
    with pytest.raises(AttributeError):
        plan.matches = ()
    np.testing.assert_array_equal(module.w.numpy(), [0.0, 0.0])
    assert plan.matches == (objckpt.Match("w", "w", "exact"),)


def test_checkpoint_of_a_trained_keras3_model_into_an_untrained_one(tmp_path):
    keras = keras_for("keras3")

    def make():
        tf.random.set_seed(0)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h"),
                                 keras.layers.Dense(1, name="o")])

    trained = make()
    trained.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    trained.fit(x, x[:, :1], epochs=1, verbose=0)
    prefix = tf.train.Checkpoint(root=trained).write(str(tmp_path / "ck"))
    # TF's canonical path of each trained weight now runs through the optimizer.
    assert any(p.startswith("optimizer/") and "_trainable_variables" in p
               for p in objckpt.read_tree(prefix))
    fresh = make()
    report = objckpt.restore(fresh, prefix, optimizer_state=False)
    assert len(report.restored) == 4 and not report.unexpected, report.plan.describe()
    np.testing.assert_array_equal(fresh(x).numpy(), trained(x).numpy())
