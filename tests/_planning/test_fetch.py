"""The fetch stage: values read, transformed and checked against their variables again
before anything is assigned (corrupt data and a misfitting transform are typed errors)."""

import types

import numpy as np
import pytest
import tensorflow as tf

from objckpt import errors
from objckpt._planning import fetch as _fetch


def _plan(read, matches):
    """A plan of (source key, target path, transform) matches reading `read` {key: value}."""
    return types.SimpleNamespace(
        matches=[types.SimpleNamespace(source=s, target=t, transform=f) for s, t, f in matches],
        fetch=lambda keys: [tf.constant(read[k]) for k in keys],
        label=lambda path: f"`{path}`", source="checkpoint `ck`")


def test_values_are_read_in_match_order_and_transformed():
    variables = {"a": tf.Variable(tf.zeros((2, 3))), "b": tf.Variable(0.0)}
    plan = _plan({"A": np.ones((3, 2), "float32"), "B": np.float32(4.0)},
                 [("B", "b", None), ("A", "a", tf.transpose)])
    b, a = _fetch.fetch_values(plan, variables)
    assert float(b) == 4.0 and a.shape == (2, 3) and np.all(a.numpy() == 1.0)
    (only,) = _fetch.fetch_values(plan, variables, plan.matches[1:])
    assert only.shape == (2, 3)


def test_data_that_disagrees_with_its_metadata_is_corrupt():
    variables = {"a": tf.Variable(tf.zeros((2, 3)))}
    plan = _plan({"A": np.ones((3, 2), "float32")}, [("A", "a", None)])
    with pytest.raises(errors.CheckpointCorruptError) as info:
        _fetch.fetch_values(plan, variables)
    assert "checkpoint `ck`: 1 value(s) read" in str(info.value)
    assert "`a`: `A` read as float32(3, 2) but the obj has float32(2, 3)" in str(info.value)


def test_a_transform_that_misfits_names_the_rule_to_fix():
    variables = {"a": tf.Variable(tf.zeros((2, 3)))}
    plan = _plan({"A": np.ones((2, 3), "float32")}, [("A", "a", lambda v: tf.cast(v, "int32"))])
    with pytest.raises(errors.StructureMismatchError) as info:
        _fetch.fetch_values(plan, variables)
    assert info.value.problems == (
        "`a`: the transform of `A` gave int32(2, 3) but the obj has float32(2, 3)",)
    assert "Fix: make the rule's transform return the variable's shape" in str(info.value)


def test_entries_are_fetched_eagerly_even_while_a_function_is_traced():
    source = types.SimpleNamespace(fetch=lambda keys: [tf.constant(float(len(k))) for k in keys])
    seen = []

    @tf.function
    def step():
        values = _fetch.fetch_entries(source, [("ab", None), ("abc", lambda v: v * 2)])
        seen.append([float(v.numpy()) for v in values])  # eager: numpy() works at trace time
        return tf.constant(0)

    step()
    assert seen == [[2.0, 6.0]]
    assert _fetch.fetch_entries(source, []) == []


def test_no_stream_without_a_local_bundle():
    assert _fetch.streamed(None, _plan({}, []), {}) is None
    remote = types.SimpleNamespace(bundle_keys=lambda keys: keys, prefix="gs://b/ck",
                                   stream=None)
    assert _fetch.streamed(remote, _plan({"A": 1.0}, [("A", "a", None)]), {}) is None
