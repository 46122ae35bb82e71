"""The cloner's type dispatch is a table of copiers by type: every handled kind has an
entry, order decides overlaps, an entry registered first takes precedence, and an unknown
kind is a CloneError naming its path."""

from __future__ import annotations

import collections
import functools
import io
import itertools
import threading
import types
import weakref

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._ops.clone import table as _table
from objckpt._ops.clone import walker as _walker

Point = collections.namedtuple("Point", "x y")


class Plain:
    def method(self):
        return self


class MyList(list):
    pass


def _closure():
    captured = [1]

    def inner():
        return captured

    return inner


def _examples() -> dict[str, list]:
    """handler name -> instances of the kinds it copies (at least one per table entry)."""
    holder = Plain()
    examples = {
        "copy_variable": [tf.Variable(1.0)],
        "copy_uncopyable": [io.BytesIO(), threading.Thread(target=print), (i for i in ())],
        "eager_tensor": [tf.constant([1.0])],
        "copy_share": [tf.float32, tf.TensorShape([2]), tf.TensorSpec([1]), np.float32(1),
                       tf.distribute.get_strategy(), Plain],
        "tf_function": [tf.function(lambda x: x)],
        "concrete_function": [tf.function(lambda: tf.constant(1.0)).get_concrete_function()],
        "copy_function": [_closure()],
        "copy_method": [holder.method],
        "builtin_method": [[].append],
        "copy_cell": [types.CellType(1)],
        "copy_partial": [functools.partial(print, 1)],
        "copy_weakref": [weakref.ref(holder), weakref.proxy(holder)],
        "weak_container": [weakref.WeakSet(), weakref.WeakKeyDictionary(),
                           weakref.WeakValueDictionary()],
        "copy_lock": [threading.Lock(), threading.RLock()],
        "thread_local": [threading.local()],
        "copy_list": [[1]],
        "copy_dict": [{"a": 1}],
        "copy_set": [{1}],
        "copy_frozenset": [frozenset({1})],
        "copy_bytearray": [bytearray(b"x")],
        "copy_deque": [collections.deque([1])],
        "copy_tuple": [(1, 2), Point(1, 2)],
        "copy_ndarray": [np.zeros(2)],
        "copy_generic": [holder, MyList([1]), collections.OrderedDict(), ValueError("x")],
        "copy_unknown": [itertools.count(), itertools.repeat(1)],
    }
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        examples["copy_distributed"] = [tf.Variable(1.0)]
    from tensorflow.python.distribute import ps_values, sharded_variable  # no public makers

    examples["copy_sharded"] = [sharded_variable.ShardedVariable(
        [tf.Variable([[1.0]]), tf.Variable([[2.0]])])]
    examples["copy_caching"] = [ps_values.CachingVariable(tf.Variable(1.0))]
    wrapt = pytest.importorskip("wrapt")
    examples["copy_proxy"] = [wrapt.ObjectProxy([1])]
    return examples


@pytest.fixture(scope="module")
def examples():
    return _examples()


def test_every_table_entry_names_a_copier_and_has_an_example(examples):
    copiers = _table.COPIERS.copiers()
    names = [copier.__name__ for copier in copiers]
    assert len(names) == len(set(names))  # one entry per copier
    assert all(callable(copier) for copier in copiers)
    assert _table.COPIERS.fallback.__name__ == "copy_unknown"
    assert set(examples) == {*names, "copy_unknown"}  # the fallback is not in the table


def test_each_kind_is_dispatched_to_its_handler(examples):
    got = {name: [_table.COPIERS.copier_for(type(x)).__name__ for x in xs]
           for name, xs in examples.items()}
    assert got == {name: [name] * len(xs) for name, xs in examples.items()}


def test_clone_copies_through_the_table():
    obj = tf.Module()
    obj.v = tf.Variable([1.0, 2.0])
    obj.items = [obj.v, Point([1], {"k": obj.v})]
    obj.lock = threading.Lock()
    copy = objckpt.clone(obj)
    assert copy.v is not obj.v and copy.v.numpy().tolist() == [1.0, 2.0]
    assert copy.items[0] is copy.v and isinstance(copy.items[1], Point)
    assert copy.items[1].y["k"] is copy.v and copy.items[1].x is not obj.items[1].x
    assert type(copy.lock) is type(obj.lock) and copy.lock is not obj.lock


def test_an_unknown_kind_raises_clone_error_naming_its_path():
    obj = tf.Module()
    obj.v = tf.Variable(1.0)
    obj.state = {"counter": itertools.count()}
    with pytest.raises(errors.CloneError, match="C-implemented object of unknown semantics"
                       ) as info:
        objckpt.clone(obj)
    assert "counter" in info.value.path and "state" in info.value.path
    assert info.value.object_type is itertools.count
    assert "Fix:" in str(info.value)


def test_an_uncopyable_kind_raises_clone_error_naming_its_path():
    obj = tf.Module()
    obj.v = tf.Variable(1.0)
    obj.log = io.StringIO()
    with pytest.raises(errors.CloneError, match="live operating-system or interpreter "
                       "resource") as info:
        objckpt.clone(obj)
    assert info.value.path.endswith("log") and info.value.object_type is io.StringIO


def test_a_copier_registered_first_takes_a_type_over_and_the_walk_uses_it():
    class Counter:  # a plain object: copied generically by the shipped table
        def __init__(self, n):
            self.n = n

    calls = []

    def copy_counter(walker, x, path):
        calls.append(_walker.path_str(path))
        return walker.remember(x, Counter(x.n + 100))

    table = _table.CopierTable(_table.COPIERS.entries, fallback=_table.COPIERS.fallback)
    assert table.copier_for(Counter).__name__ == "copy_generic"
    table.register(_table.exactly(Counter), copy_counter, first=True)
    assert table.copier_for(Counter) is copy_counter  # the answer kept before is dropped
    assert _table.COPIERS.copier_for(Counter).__name__ == "copy_generic"  # a copy's entries
    counter = Counter(1)
    obj = {"a": counter, "b": [counter], "v": tf.Variable(2.0)}
    walker = _walker.Walker(True, "obj", table=table)
    copy = walker.run(obj)
    assert copy["a"].n == 101 and copy["b"][0] is copy["a"]  # shared once, copied once
    assert calls == ["obj['a']"] and copy["v"] is not obj["v"]
    assert float(copy["v"].numpy()) == 2.0
