"""The assign stage: checked values into variables, eagerly even while a function is traced,
each replica of a distributed variable."""

import numpy as np
import tensorflow as tf

from objckpt._planning import assign as _assign


def test_pairs_are_assigned_in_place():
    a, b = tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64)
    _assign.assign_pairs([(a, tf.constant([5.0, 6.0])), (b, tf.constant(7, tf.int64))])
    assert a.numpy().tolist() == [5.0, 6.0] and int(b.numpy()) == 7


def test_pairs_assigned_while_a_function_is_traced_land_at_once():
    v, value = tf.Variable(0.0), tf.constant(4.0)  # (values are fetched eagerly)

    @tf.function
    def step():
        _assign.assign_pairs([(v, value)])
        return tf.constant(0)

    step.get_concrete_function()  # traced, not run
    assert float(v.numpy()) == 4.0


def test_every_replica_of_a_mirrored_variable_gets_the_value():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        v = tf.Variable(tf.zeros((2,)))
    _assign.assign_pairs([(v, tf.constant([1.0, 2.0]))])
    for component in v.values:
        assert np.array_equal(component.numpy(), [1.0, 2.0])


def test_a_plan_without_fresh_slots_changes_nothing():
    v = tf.Variable([1.0])
    _assign.start_fresh(None, {"v": v}, None)
    assert v.numpy().tolist() == [1.0]
