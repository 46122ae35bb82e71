"""Rules do what they say: first match wins, once; shadowed rules are named as such.

Each source key is rewritten by the first rule whose regex matches it, once (rules never
chain). A rule that rewrote no key is reported as shadowed (naming the rule that took its
keys, and how many) when its regex matches some, else as matching no key; both warn and
are listed in the `Plan`. Every match whose key a rule rewrote says strategy "rule".
"""

import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import FLAVOURS, KERAS_FLAVOURS, keras_for
from legacy import cached_tf1_checkpoint, tf1_rewrite, tf1_rewrite_module
from support import build_optimizer

TAKE_SCOPE = "rule 0 ('^model_001/' -> '')"
NOT_AGAIN = ("Rules do not chain: each source key is rewritten once, by the first rule whose "
             "regex matches it.")
CHAINED_FIX = ("Fix: write one rule whose regex matches the original key and does the whole "
               "rewrite (a combined regex), or several rules that each match the full "
               "original key.")


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return cached_tf1_checkpoint(tmp_path_factory)


def _module(**paths):
    """A tf.Module with one variable per keyword: `a__b=value` is object path `a/b`."""
    root = tf.Module()
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node = root
        for parent in parents:
            if not hasattr(node, parent):
                setattr(node, parent, tf.Module())
            node = getattr(node, parent)
        setattr(node, leaf, tf.Variable(value))
    return root


def _plan(source, obj, rules, **kwargs):
    """The plan and the texts of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = objckpt.plan(obj, source, rules=rules, **kwargs)
    return plan, [str(w.message) for w in caught]


def test_first_matching_rule_rewrites_each_key_once():
    module = _module(hidden__kernel=tf.zeros((2,)), other__kernel=tf.zeros((3,)))
    source = objckpt.Snapshot({"model_001/dense/kernel": [1.0, 2.0],
                               "model_001/other/kernel": [3.0, 4.0, 5.0]})
    rules = [("^model_001/dense/", "hidden/"), ("^model_001/", ""), ("^other/", "gone/")]
    plan, warned = _plan(source, module, rules)
    # Rule 1 also matches `model_001/dense/kernel`, but rule 0 came first; rule 2 matches
    # `other/kernel`, what rule 1 made of a key, but a rewritten key is not rewritten again.
    assert plan.complete, plan.describe()
    assert {(m.source, m.target, m.strategy, m.rule) for m in plan.matches} == {
        ("model_001/dense/kernel", "hidden/kernel", "rule",
         "rule 0 ('^model_001/dense/' -> 'hidden/')"),
        ("model_001/other/kernel", "other/kernel", "rule", "rule 1 ('^model_001/' -> '')")}
    shadowed = (
        "rule 2 ('^other/' -> 'gone/') is shadowed: the key it matches was taken by rule 1 "
        "('^model_001/' -> ''), which matched first; it matches it only as rewritten "
        "(`model_001/other/kernel` became `other/kernel`, which no rule rewrites again). "
        f"{NOT_AGAIN} {CHAINED_FIX}")
    assert plan.shadowed_rules == (shadowed,) and plan.unused_rules == ()
    assert warned == [f"1 rule(s) never applied to Snapshot: {shadowed}"]
    with pytest.warns(UserWarning) as caught:  # restore warns the same
        objckpt.restore(module, source, rules=rules)
    assert [str(w.message) for w in caught] == warned
    np.testing.assert_array_equal(module.hidden.kernel.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(module.other.kernel.numpy(), [3.0, 4.0, 5.0])


def test_a_later_more_specific_rule_is_shadowed_by_an_earlier_one():
    module = _module(a=tf.zeros((1,)), b=tf.zeros((1,)), dense__w=tf.zeros((1,)))
    source = objckpt.Snapshot({"model_001/a": [1.0], "model_001/b": [2.0],
                               "model_001/dense/w": [3.0], "extra": [4.0]})
    rules = [("^model_001/", ""), ("^extra$", None), ("^model_001/dense/", "head/"),
             ("^model_001/[ab]$", "x"), ("^nowhere/", "")]
    plan, warned = _plan(source, module, rules)
    assert plan.complete and plan.skipped == ("extra: dropped by rule 1 ('^extra$' -> None)",)
    assert plan.shadowed_rules == (
        "rule 2 ('^model_001/dense/' -> 'head/') is shadowed: the key it matches was taken by "
        f"{TAKE_SCOPE}, which matched first. {NOT_AGAIN} Fix: put rule 2 before rule 0 (the "
        "more specific rule first), or narrow the regex of rule 0.",
        "rule 3 ('^model_001/[ab]$' -> 'x') is shadowed: the 2 keys it matches were all taken "
        f"by {TAKE_SCOPE}, which matched first. {NOT_AGAIN} Fix: put rule 3 before rule 0 (the "
        "more specific rule first), or narrow the regex of rule 0.")
    # A rule that matches nothing, as stored or as rewritten, still says so.
    assert plan.unused_rules == ("rule 4 ('^nowhere/' -> '')",)
    assert warned == ["1 rule(s) matched no key of Snapshot: rule 4 ('^nowhere/' -> '')",
                      "2 rule(s) never applied to Snapshot: " + " ".join(plan.shadowed_rules)]
    table = plan.describe()
    assert "rules that matched nothing (1):\n  - rule 4 ('^nowhere/' -> '')" in table
    assert ("rules shadowed by another rule (2):\n  - rule 2 ('^model_001/dense/' -> "
            "'head/') is shadowed: the key it matches was taken by rule 0") in table


def test_shadowing_by_several_rules_counts_each():
    module = _module(p=tf.zeros((1,)), q=tf.zeros((1,)), r=tf.zeros((1,)))
    source = objckpt.Snapshot({"old/p": [1.0], "old/q": [2.0], "new/r": [3.0]})
    rules = [("^old/", ""), ("^new/", ""), ("/[pqr]$", "/s")]
    plan, _ = _plan(source, module, rules)
    assert plan.complete and plan.shadowed_rules == (
        "rule 2 ('/[pqr]$' -> '/s') is shadowed: the 3 keys it matches were all taken by "
        "rule 0 ('^old/' -> '') (2 of them) and rule 1 ('^new/' -> '') (1 of them), which "
        f"matched first. {NOT_AGAIN} Fix: put rule 2 before rule 0 (the more specific rule "
        "first), or narrow the regex of rule 0.",)


def test_a_rewritten_key_ranks_by_how_it_matched_and_says_rule():
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)), name="b")  # object path `w`, variable name `b`
    module.hidden = tf.Module()
    module.hidden._kernel = tf.Variable(tf.zeros((3,)))
    source = objckpt.Snapshot({"old/w": [1.0, 2.0], "old/b": [3.0, 4.0],
                               "old/kernel": [5.0, 6.0, 7.0]})
    rules = [("^old/kernel$", "hidden/kernel"), ("^old/", "")]
    plan, warned = _plan(source, module, rules)
    # `w` by its path beats `b` by the variable name: both rewritten, both "rule" now.
    assert {(m.target, m.source, m.strategy) for m in plan.matches} == {
        ("w", "old/w", "rule"), ("hidden/_kernel", "old/kernel", "rule")}
    assert plan.unmatched_source == ("old/b",) and warned == []
    assert plan.strategies() == {"rule": 2}  # `hidden/kernel` ~ `hidden/_kernel`: a rule row


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_chained_rules_on_a_tf1_checkpoint(flavour, tf1):
    model = tf1_rewrite_module() if flavour == "module" else tf1_rewrite(keras_for(flavour))
    rules = [("^model_001/", ""), ("^dense/", "hidden/")]  # written as if rules chained
    plan, warned = _plan(tf1["prefix"], model, rules, optimizer_state=False)
    shadowed = (
        "rule 1 ('^dense/' -> 'hidden/') is shadowed: the 6 keys it matches were all taken "
        f"by {TAKE_SCOPE}, which matched first; it matches them only as rewritten "
        "(`model_001/dense/bias` became `dense/bias`, which no rule rewrites again). "
        f"{NOT_AGAIN} {CHAINED_FIX}")
    assert plan.shadowed_rules == (shadowed,) and plan.unused_rules == ()
    assert warned == [f"1 rule(s) never applied to name-based checkpoint `{tf1['prefix']}`: "
                      f"{shadowed}"]
    # Every weight came through rule 0: by object path (tf.Module) or by the Keras/TF
    # variable name (Keras), the plan says "rule", with the rule.
    assert plan.complete and plan.strategies() == {"rule": 8}, plan.describe()
    assert {m.rule for m in plan.matches} == {TAKE_SCOPE}
    table = plan.describe()
    for match in plan.matches:
        assert re.search(rf"\brule +{re.escape(match.source)}  \[{re.escape(TAKE_SCOPE)}\]",
                         table), table
    assert "rules shadowed by another rule (1):" in table


def test_restore_on_create_reports_shadowed_and_unused_rules():
    module = _module(w=tf.zeros((1,)))
    source = objckpt.Snapshot({"model_001/w": [1.0]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pending = objckpt.restore_on_create(
            module, source, rules=[("^model_001/", ""), ("^w$", "v"), ("^nope/", "")])
    assert pending.done and module.w.numpy().tolist() == [1.0]
    assert [str(w.message) for w in caught] == [
        "1 rule(s) matched no key of Snapshot: rule 2 ('^nope/' -> '')",
        "1 rule(s) never applied to Snapshot: rule 1 ('^w$' -> 'v') is shadowed: the key it "
        f"matches was taken by {TAKE_SCOPE}, which matched first; it matches it only as "
        "rewritten (`model_001/w` became `w`, which no rule rewrites again). "
        f"{NOT_AGAIN} {CHAINED_FIX}"]


def _compiled(keras):
    model = tf1_rewrite(keras)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    build_optimizer(model)
    return model


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_migrated_tf1_global_step_becomes_iterations(flavour, tf1, tmp_path):
    keras = keras_for(flavour)
    step = int(tf.train.load_checkpoint(tf1["prefix"]).get_tensor("global_step"))
    assert step > 0
    plan, warned = _plan(tf1["prefix"], _compiled(keras), [("^model_001/", "")],
                         optimizer_state=True)
    assert warned == [] and plan.complete, plan.describe()
    assert plan.strategies() == {"rule": 8, "slot": 2 * 6 + 1}  # Adam m, v of 6; the step
    counter = next(m for m in plan.matches if m.source == "global_step")
    assert counter.strategy == "slot" and counter.rule == ""
    prefix = objckpt.migrate(_compiled(keras), tf1["prefix"], str(tmp_path / "ckpt"),
                             rules=[("^model_001/", "")], optimizer_state=True)
    fresh = _compiled(keras)
    objckpt.restore(fresh, prefix)
    assert int(fresh.optimizer.iterations.numpy()) == step


def test_rule_warnings_point_at_the_callers_line(tmp_path):
    """Whichever public function a rule set goes through, its warning names the user's own
    file, not objckpt's."""
    module = tf.Module()
    module.w = tf.Variable(1.0)
    snap = objckpt.snapshot(module)
    prefix = objckpt.save(module, str(tmp_path / "ckpt"))
    calls = {
        "plan": lambda rules: objckpt.plan(module, snap, rules=rules),
        "restore": lambda rules: objckpt.restore(module, prefix, rules=rules),
        "migrate": lambda rules: objckpt.migrate(module, prefix, str(tmp_path / "out"),
                                                 rules=rules),
        "restore_on_create": lambda rules: objckpt.restore_on_create(tf.Module(), prefix,
                                                                     rules=rules),
    }
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call([(f"^no_{name}$", "x")])
        shown = [w for w in caught if "matched no key" in str(w.message)]
        assert len(shown) == 1, (name, [str(w.message) for w in caught])
        assert shown[0].filename == __file__, (name, shown[0].filename)
