"""objckpt.clone over every flavour: structure, independence, sharing, errors."""

import contextlib
import copy
import io
import os
import tempfile
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import clone
from objckpt._ops.clone import pykinds as _clone_pykinds
from objckpt._ops.clone import table as _clone_table
from objckpt._ops.clone import walker as _clone_walker
from objckpt.errors import CloneError

from flavours import CASES, KERAS_FLAVOURS, _data, build, case_id, keras_for, module_step
from support import assert_bits, values


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture
def obj(case):
    """A trained obj of its own, for tests that change it."""
    return build(*case)


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def shared_obj(request):
    """One trained obj per case for the tests that only read it (they clone it, call it in
    inference mode, or write it); each checks or relies on it staying unchanged."""
    return build(*request.param)


# --- helpers ------------------------------------------------------------------


def inputs_of(obj):
    images, tokens, targets = _data(seed=3)
    if isinstance(obj, tf.train.Checkpoint):
        return tf.constant(np.random.default_rng(3).normal(size=(2, 3)).astype("float32")), None
    if obj.name == "net":
        return images, targets
    if obj.name == "functional":
        return [images, tokens], targets
    return images, targets


def outputs(obj, x, training=False):
    if isinstance(obj, tf.train.Checkpoint):
        return np.array(obj.model(x))
    return np.array(obj(x, training=training))


def train_step(obj):
    """One training step through the flavour's own machinery."""
    x, y = inputs_of(obj)
    if isinstance(obj, tf.train.Checkpoint):
        module_step(obj.model, obj.optimizer, x)
    else:
        obj.fit(x, y, epochs=1, batch_size=4, verbose=0, shuffle=False)


def optimizer_variables(obj):
    opt = obj.optimizer
    if isinstance(obj, tf.train.Checkpoint):
        return list(opt.variables())
    variables = opt.variables
    return list(variables() if callable(variables) else variables)


def is_optimizer_path(path):
    return ".OPTIMIZER_SLOT" in path or path.startswith("optimizer/")


def tf_variables(obj):
    return {id(v) for v in objckpt.tree(obj).values()}


def check_same_structure(a, b, same_values=True):
    ta, tb = objckpt.tree(a), objckpt.tree(b)
    assert list(ta) == list(tb)
    assert len(ta) > 0
    for path in ta:
        assert ta[path].shape == tb[path].shape, path
        assert ta[path].dtype == tb[path].dtype, path
        assert ta[path] is not tb[path], path
    assert not tf_variables(a) & tf_variables(b)
    if same_values:
        assert_bits(values(ta), values(tb))


def keras_or_skip(flavour):
    return keras_for(flavour)


# --- every flavour ------------------------------------------------------------


def test_same_tree_values_and_no_shared_variable(shared_obj):
    obj = shared_obj
    c = clone(obj)
    assert type(c) is type(obj) and c is not obj
    check_same_structure(obj, c)


def test_outputs_bit_equal(shared_obj):
    obj = shared_obj
    c = clone(obj)
    x, _ = inputs_of(obj)
    assert outputs(obj, x).tobytes() == outputs(c, x).tobytes()


def test_mutating_clone_leaves_original_and_vice_versa(obj):
    c = clone(obj)
    before = values(objckpt.tree(obj))
    for variable in objckpt.tree(c).values():
        variable.assign(tf.zeros_like(variable) + tf.cast(3, variable.dtype))
    assert_bits(before, values(objckpt.tree(obj)))
    clone_before = values(objckpt.tree(c))
    for variable in objckpt.tree(obj).values():
        variable.assign(tf.zeros_like(variable) + tf.cast(5, variable.dtype))
    assert_bits(clone_before, values(objckpt.tree(c)))


def test_training_clone_trains_clone_only_with_its_own_optimizer_state(shared_obj):
    obj = shared_obj
    c = clone(obj)
    before = values(objckpt.tree(obj))
    n_opt = len(optimizer_variables(c))
    train_step(c)
    assert_bits(before, values(objckpt.tree(obj)))  # original untouched, slots included
    after = values(objckpt.tree(c))
    changed = [p for p in after if after[p].tobytes() != before[p].tobytes()]
    assert any(is_optimizer_path(p) for p in changed)  # the clone's slots were updated
    assert any(not is_optimizer_path(p) for p in changed)  # and its weights
    # No new slot variables: the cloned optimizer found its (cloned) slots by variable.
    assert len(optimizer_variables(c)) == n_opt
    assert list(objckpt.tree(c)) == list(objckpt.tree(obj))


def test_training_clone_matches_training_original_bitwise(obj):
    """Same state -> the same step on both gives bit-equal results (slots really cloned)."""
    c = clone(obj)
    train_step(c)
    train_step(obj)
    assert_bits(values(objckpt.tree(obj)), values(objckpt.tree(c)))


def test_optimizer_is_cloned_and_points_at_clone_variables(shared_obj):
    obj = shared_obj
    c = clone(obj)
    assert c.optimizer is not obj.optimizer
    clone_ids = tf_variables(c)
    opt_ids = {id(objckpt._compat.as_variable(v)) for v in optimizer_variables(c)}
    assert opt_ids <= clone_ids
    assert not opt_ids & tf_variables(obj)


def test_restore_original_from_trained_clone(obj):
    c = clone(obj)
    train_step(c)
    objckpt.restore(obj, objckpt.snapshot(c))
    assert_bits(values(objckpt.tree(c)), values(objckpt.tree(obj)))
    x, _ = inputs_of(obj)
    assert outputs(obj, x).tobytes() == outputs(c, x).tobytes()


def test_copy_values_false_gives_zeros_of_same_structure(shared_obj):
    obj = shared_obj
    before = values(objckpt.tree(obj))
    c = clone(obj, copy_values=False)
    check_same_structure(obj, c, same_values=False)
    for path, value in values(objckpt.tree(c)).items():
        assert not np.any(value), path
    assert_bits(before, values(objckpt.tree(obj)))
    objckpt.restore(c, objckpt.snapshot(obj))
    x, _ = inputs_of(obj)
    assert outputs(obj, x).tobytes() == outputs(c, x).tobytes()


def test_clone_of_clone(shared_obj):
    obj = shared_obj
    c2 = clone(clone(obj))
    check_same_structure(obj, c2)
    train_step(c2)


def test_checkpoint_write_of_clone_has_original_paths(shared_obj, tmp_path):
    obj = shared_obj
    c = clone(obj)
    prefix = tf.train.Checkpoint(root=c).write(str(tmp_path / "c"))
    ref = tf.train.Checkpoint(root=obj).write(str(tmp_path / "o"))
    assert set(objckpt.read_tree(prefix)) == set(objckpt.read_tree(ref))


# --- sharing, nesting, BatchNorm ------------------------------------------------


def test_shared_layers_stay_shared(shared_obj):
    obj = shared_obj
    c = clone(obj)
    if isinstance(obj, tf.train.Checkpoint):  # the module case
        assert c.model.shared is c.model.layers[0]
        assert c.model.shared is not obj.model.shared
        assert c.model.shared.w is c.model.layers[0].w
        return
    if obj.name == "net":  # subclassed
        assert c.alias is c.hidden and c.hidden is not obj.hidden
        assert c.hidden.kernel is c.alias.kernel
        assert c.block is not obj.block
    else:
        shared = c.get_layer("shared")
        assert shared is not obj.get_layer("shared")
        # the layer is used twice in the graph; both nodes point at the one clone layer
        assert len(shared._inbound_nodes) == len(obj.get_layer("shared")._inbound_nodes) == 2
        head = c.get_layer("head")
        assert head is not obj.get_layer("head")
        assert all(a is not b for a, b in zip(head.layers, obj.get_layer("head").layers))
        clone_vars = {id(v) for v in c.variables}
        assert all(id(v) in clone_vars for v in head.variables)


def test_shared_variable_reachable_twice_is_one_variable():
    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.v = tf.Variable([1.0, 2.0])
            self.alias = self.v
            self.box = {"again": self.v}
            self.seq = [self.v]

    m = M()
    c = clone(m)
    assert c.v is c.alias is c.box["again"] is c.seq[0]
    assert c.v is not m.v
    c.alias.assign([7.0, 8.0])
    assert c.v.numpy().tolist() == [7.0, 8.0] and m.v.numpy().tolist() == [1.0, 2.0]
    assert list(objckpt.tree(c)) == list(objckpt.tree(m))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_batchnorm_training_call_updates_clone_only(flavour):
    obj = build(flavour, "subclassed")
    c = clone(obj)
    x, _ = inputs_of(obj)
    assert outputs(obj, x, training=True).tobytes() == outputs(c, x, training=True).tobytes()
    before = values(objckpt.tree(obj))
    # another training-mode call on the clone moves its moving statistics only
    outputs(c, x * 2, training=True)
    assert_bits(before, values(objckpt.tree(obj)))
    bn_c, bn_o = c.bn, obj.bn
    assert bn_c.moving_mean is not bn_o.moving_mean
    assert np.array(bn_c.moving_mean).tobytes() != np.array(bn_o.moving_mean).tobytes()


# --- Keras specifics --------------------------------------------------------------


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_sequential(flavour):
    keras = keras_or_skip(flavour)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(0.5),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 5)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    model.fit(x, y, verbose=0, batch_size=4)
    model.predict(x, verbose=0)  # traced predict_function must not leak into the clone
    c = clone(model)
    check_same_structure(model, c)
    assert np.array(model(x)).tobytes() == np.array(c(x)).tobytes()
    assert model.predict(x, verbose=0).tobytes() == c.predict(x, verbose=0).tobytes()
    for v in c.trainable_variables:
        v.assign(v * 0.5)
    assert model.predict(x, verbose=0).tobytes() != c.predict(x, verbose=0).tobytes()
    assert np.array(c(x)).tobytes() == c.predict(x, verbose=0).tobytes()
    before = values(objckpt.tree(model))
    c.fit(x, y, verbose=0, batch_size=4)
    assert_bits(before, values(objckpt.tree(model)))
    c.evaluate(x, y, verbose=0)


def test_unregistered_subclass_without_get_config_keras3():
    keras = keras_or_skip("keras3")

    class Plain(keras.Model):  # not registered, no get_config, custom __init__ args
        def __init__(self, width, handle):
            super().__init__()
            self.handle = handle
            self.dense = keras.layers.Dense(width)
            self.extra = {"scale": keras.Variable(2.0, trainable=False)}

        def call(self, x):
            return self.dense(x) * self.extra["scale"]

    model = Plain(3, handle=object())
    x = np.ones((2, 4), "float32")
    model(x)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, np.zeros((2, 3), "float32"), verbose=0)
    with pytest.raises(Exception):  # noqa: B017 - Keras raises TypeError or ValueError
        copy.deepcopy(model)  # what clone exists to replace
    c = clone(model)
    check_same_structure(model, c)
    assert np.array(model(x)).tobytes() == np.array(c(x)).tobytes()
    assert c.handle is not model.handle  # plain Python state is copied too
    c.fit(x, np.zeros((2, 3), "float32"), verbose=0)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_unbuilt_model_clones_unbuilt_and_builds(flavour):
    obj = build(flavour, "subclassed", train=False, call=False)
    c = clone(obj)
    assert c.built is False and obj.built is False
    assert len(objckpt.tree(c)) == 0
    x, y = inputs_of(obj)
    c(x)
    assert c.built and not obj.built
    assert len(c.variables) > 0
    obj(x)  # the original still builds on its own, with its own variables
    assert not {id(v) for v in obj.variables} & {id(v) for v in c.variables}
    assert list(objckpt.tree(obj)) == list(objckpt.tree(c))
    c.compile(optimizer="adam", loss="mse")
    c.fit(x, y, verbose=0, batch_size=4)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_compiled_but_never_trained(flavour):
    obj = build(flavour, "functional", train=False)
    c = clone(obj)
    check_same_structure(obj, c)
    train_step(c)
    train_step(obj)
    assert_bits(values(objckpt.tree(obj)), values(objckpt.tree(c)))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_deep_functional_chain_no_recursion_limit(flavour):
    keras = keras_or_skip(flavour)
    x = inp = keras.Input((4,))
    for _ in range(300):
        x = keras.layers.Dense(4)(x)
    model = keras.Model(inp, x)
    c = clone(model)
    check_same_structure(model, c)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.slow
def test_500_variables_clone(flavour):
    keras = keras_or_skip(flavour)
    x = inp = keras.Input((8,))
    for _ in range(250):
        x = keras.layers.Dense(8)(x)
    model = keras.Model(inp, x)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    # One eager Adam step creates the optimizer state (slots, iterations) that `fit` would,
    # without tracing a 250-layer train function (that took ~100 s on CI's 2 cores).
    data = tf.ones((4, 8))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(data, training=True) - data) ** 2)
    model.optimizer.apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    c = clone(model)  # its speed is measured in benchmarks/ (no wall-clock asserts here)
    assert len(objckpt.tree(model)) >= 3 * 500  # weights and two Adam moments each
    check_same_structure(model, c)


# --- tf.Module / tf.function ---------------------------------------------------------


def test_module_with_tf_function_method_and_instance_function():
    class Scaler(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(2.0)
            self.bound = tf.function(self.scale)  # instance attribute wrapping a bound method
            self.lam = tf.function(lambda x: x * self.w)  # closure over self

        @tf.function
        def __call__(self, x):
            return x * self.w

        def scale(self, x):
            return x * self.w

    m = Scaler()
    x = tf.constant(3.0)
    assert float(m(x)) == float(m.bound(x)) == float(m.lam(x)) == 6.0  # traced on original
    c = clone(m)
    c.w.assign(10.0)
    assert float(c(x)) == float(c.bound(x)) == float(c.lam(x)) == 30.0
    assert float(m(x)) == float(m.bound(x)) == float(m.lam(x)) == 6.0


def test_checkpoint_root():
    obj = build("module", train=True)
    c = clone(obj)
    assert isinstance(c, tf.train.Checkpoint)
    check_same_structure(obj, c)
    with tempfile.TemporaryDirectory() as tmp:
        path = c.save(os.path.join(tmp, "ckpt"))
        fresh = build("module", train=True)
        fresh.restore(path).assert_existing_objects_matched()
        assert_bits(values(objckpt.tree(c)), values(objckpt.tree(fresh)))


# --- errors -------------------------------------------------------------------------


def test_open_file_raises_with_path_and_twins_hint(tmp_path):
    m = tf.Module()
    m.v = tf.Variable(1.0)
    m.config = {"log": open(tmp_path / "log.txt", "w")}  # noqa: SIM115
    with pytest.raises(CloneError) as info:
        clone(m)
    message = str(info.value)
    assert "config" in message and "'log'" in message and "Twins" in message
    assert isinstance(info.value, TypeError)
    m.config["log"].close()


def test_thread_raises():
    m = tf.Module()
    m.worker = threading.Thread(target=lambda: None)
    with pytest.raises(CloneError, match="worker"):
        clone(m)


def test_lookup_table_raises():
    m = tf.Module()
    m.table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant([1, 2]), tf.constant([3, 4])), -1)
    with pytest.raises(CloneError, match="table"):
        clone(m)


def test_distributed_variables_are_recreated_under_their_strategy():
    # One-device MirroredStrategy; two replicas, Keras and refusals: test_clone_distribute.py.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        m = tf.Module()
        m.v = tf.Variable(1.5)
    c = clone(m)
    assert type(c.v) is type(m.v) and c.v is not m.v
    assert c.v.distribute_strategy is strategy
    c.v.assign(2.0)
    assert float(m.v.numpy()) == 1.5 and float(c.v.numpy()) == 2.0


def test_locks_and_thread_local_are_fresh():
    m = tf.Module()
    m.v = tf.Variable(1.0)
    m.lock = threading.Lock()
    m.local = threading.local()
    m.local.x = 3
    m.lock.acquire()
    c = clone(m)
    assert c.lock is not m.lock and not c.lock.locked()
    assert c.local is not m.local and c.local.x == 3
    m.lock.release()


def test_plain_stringio_is_refused_not_shared():
    m = tf.Module()
    m.buf = io.StringIO("x")
    with pytest.raises(CloneError, match="buf"):
        clone(m)


# --- no mutable Python state shared at all ---------------------------------------------


_LEAF_HANDLERS = {"copy_share", "eager_tensor", "copy_uncopyable", "copy_unknown",
                  "copy_distributed", "concrete_function"}


def mutable_state(root):
    """id -> path of every mutable object reachable from root through instance state.

    Walks with the same rules as clone: shared-by-design kinds (modules, classes,
    module-level functions, strategies, graphs, dtypes, EagerTensors) are leaves;
    immutable tuples are traversed but not recorded.
    """
    cloner = _clone_walker.Walker(True, "root", table=_clone_table.COPIERS)
    seen, found = set(), {}
    stack = [(root, "root")]
    while stack:
        x, path = stack.pop()
        cls = type(x)
        if cls in _clone_walker.ATOMIC_TYPES or id(x) in seen:
            continue
        seen.add(id(x))
        handler = cloner.handlers.get(cls) or cloner.classify(cls)
        cloner.handlers[cls] = handler
        name = handler.__name__
        if name in _LEAF_HANDLERS or name == "<lambda>":
            continue
        if name == "copy_function":
            if x.__closure__ is None or _clone_pykinds.is_global(x):
                continue
            found[id(x)] = path
            for cell, var in zip(x.__closure__, x.__code__.co_freevars):
                with contextlib.suppress(ValueError):
                    stack.append((cell.cell_contents, f"{path}.<{var}>"))
            continue
        if name == "copy_weakref":
            continue
        if name not in ("copy_tuple", "copy_frozenset", "copy_method", "builtin_method",
                        "copy_partial", "tf_function"):
            found[id(x)] = path
        if name == "copy_variable":
            continue
        if name in ("copy_tuple", "copy_frozenset", "copy_list", "copy_set", "copy_deque"):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(x))
        elif name == "weak_container":  # weakly held objects are referenced, not owned
            if isinstance(x, weakref.WeakKeyDictionary):
                stack.extend((v, f"{path}[{k!r}]") for k, v in list(x.items()))
            elif isinstance(x, weakref.WeakValueDictionary):
                stack.extend((k, f"{path}.<key>") for k in list(x.keys()))
        elif name == "copy_dict":
            for k, v in list(x.items()):
                stack.append((k, f"{path}.<key>"))
                stack.append((v, f"{path}[{k!r}]"))
        elif name == "copy_method":
            stack.append((x.__self__, f"{path}.__self__"))
            stack.append((x.__func__, f"{path}.__func__"))
        elif name == "builtin_method":
            stack.append((getattr(x, "__self__", None), f"{path}.__self__"))
        elif name == "tf_function":
            stack.append((x._python_function, f"{path}._python_function"))
        elif name == "copy_proxy":
            stack.append((x.__wrapped__, f"{path}.__wrapped__"))
            for k, v in _clone_pykinds.proxy_own_dict(x).items():
                stack.append((v, f"{path}.{k}"))
        elif name == "copy_ndarray":
            pass
        else:
            own = getattr(x, "__dict__", None) if name != "thread_local" else x.__dict__
            if isinstance(own, dict):
                for k, v in own.items():
                    stack.append((v, f"{path}.{k}"))
            for slot, descriptor in _clone_pykinds.slot_descriptors(cls):
                with contextlib.suppress(AttributeError):
                    stack.append((descriptor.__get__(x, cls), f"{path}.{slot}"))
            if isinstance(x, (list, set)):
                stack.extend((v, f"{path}[{i}]") for i, v in enumerate(list(x)))
            if isinstance(x, dict):
                for k, v in list(dict.items(x)):
                    stack.append((k, f"{path}.<key>"))
                    stack.append((v, f"{path}[{k!r}]"))
    return found


def test_no_mutable_object_shared_with_original(obj):
    x, _ = inputs_of(obj)
    outputs(obj, x)  # caches built by a call on the original must not leak either
    c = clone(obj)
    train_step(c)
    original, copied = mutable_state(obj), mutable_state(c)
    assert len(copied) > 20
    shared = sorted(copied[i] for i in set(original) & set(copied))
    assert not shared, shared[:20]


def test_mutable_state_detector_detects_a_leak():
    obj = build("module")
    c = clone(obj)
    assert not set(mutable_state(obj)) & set(mutable_state(c))
    c.model.layers[1].__dict__["leak"] = obj.model.encoder.__dict__["w"]
    shared = set(mutable_state(obj)) & set(mutable_state(c))
    assert id(obj.model.encoder.w) in shared


# --- more Keras variants -----------------------------------------------------------


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("legacy_optimizer", [False, True], ids=["optimizer", "legacy_opt"])
def test_metrics_and_optimizer_variants(flavour, legacy_optimizer):
    keras = keras_or_skip(flavour)
    if legacy_optimizer:
        legacy = getattr(keras.optimizers, "legacy", None)
        if legacy is None or flavour == "keras3":
            pytest.skip("no legacy (OptimizerV2) optimizers in this Keras")
        adam = getattr(legacy, "Adam", None) or legacy.adam.Adam  # Keras 2.12: lazy module
        optimizer = adam(0.01)
    else:
        optimizer = keras.optimizers.Adam(0.01)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(8, 5)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    model.fit(x, y, verbose=0, batch_size=4, shuffle=False)
    c = clone(model)
    check_same_structure(model, c)
    n_opt = len(optimizer_variables(c))
    c.fit(x, y, verbose=0, batch_size=4, shuffle=False)
    model.fit(x, y, verbose=0, batch_size=4, shuffle=False)
    assert len(optimizer_variables(c)) == n_opt
    assert_bits(values(objckpt.tree(model)), values(objckpt.tree(c)))
    assert model.evaluate(x, y, verbose=0) == c.evaluate(x, y, verbose=0)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_mixed_precision(flavour):
    keras = keras_or_skip(flavour)
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3),
                                  keras.layers.Dense(2, dtype="float32")])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        x = np.random.default_rng(0).normal(size=(8, 5)).astype("float32")
        y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
        model.fit(x, y, verbose=0, batch_size=4, shuffle=False)
        c = clone(model)
        check_same_structure(model, c)
        assert np.array(model(x)).tobytes() == np.array(c(x)).tobytes()
        c.fit(x, y, verbose=0, batch_size=4, shuffle=False)
        model.fit(x, y, verbose=0, batch_size=4, shuffle=False)
        assert_bits(values(objckpt.tree(model)), values(objckpt.tree(c)))
    finally:
        keras.mixed_precision.set_global_policy(policy)


def test_module_with_tuple_dict_list_wrappers():
    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.pair = (tf.Variable(1.0), tf.Variable([2.0, 3.0]))
            self.table = {"a": tf.Variable(4.0),
                          "nested": [tf.Variable(5.0), {"b": tf.Variable(6.0)}]}
            self.items = [tf.Module(), tf.Variable(7.0)]
            self.items[0].v = tf.Variable(8.0)

    m = M()
    c = clone(m)
    check_same_structure(m, c)
    assert type(c.pair) is type(m.pair) and type(c.table) is type(m.table)
    c.table["nested"][1]["b"].assign(60.0)
    assert float(m.table["nested"][1]["b"]) == 6.0
    c.table["new"] = tf.Variable(9.0)  # the clone's wrappers still track new values
    assert "table/new" in objckpt.tree(c) and "table/new" not in objckpt.tree(m)


def test_optimizer_alone_clones_the_variables_it_references():
    keras = keras_or_skip("keras3")
    model = build("keras3", "subclassed")
    opt = clone(model.optimizer)
    model_ids = {id(v) for v in objckpt.tree(model).values()}
    assert not {id(v) for v in objckpt.tree(opt).values()} & model_ids
    del keras


def test_clone_survives_original_being_deleted(case):
    import gc
    obj = build(*case)
    x, _ = inputs_of(obj)
    expected = outputs(obj, x)
    c = clone(obj)
    del obj
    gc.collect()
    assert outputs(c, x).tobytes() == expected.tobytes()
    train_step(c)
    gc.collect()
    train_step(c)


def test_keras3_trackers_point_at_clone_objects():
    keras_or_skip("keras3")
    model = build("keras3", "subclassed")
    c = clone(model)
    for layer in [c, *list(c._flatten_layers())]:
        tracker = getattr(layer, "_tracker", None)
        if tracker is None:
            continue
        for store, ids in tracker.stored_ids.items():
            _, target = tracker.config[store]
            assert ids == {id(t) for t in target}, (layer.name, store)
    c.hidden = c.hidden  # re-assigning an already tracked layer does not duplicate it
    assert sum(layer is c.hidden for layer in c._layers) == 1


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_functional_clone_config_and_weights_file_round_trip(flavour, tmp_path):
    keras = keras_or_skip(flavour)
    obj = build(flavour, "functional")
    c = clone(obj)
    assert c.get_config() == obj.get_config()
    for v in c.trainable_variables:
        v.assign(v + 1.0)
    suffix = ".weights.h5" if flavour == "keras3" else ".h5"
    c.save_weights(str(tmp_path / f"w{suffix}"))
    obj.load_weights(str(tmp_path / f"w{suffix}"))
    for a, b in zip(obj.weights, c.weights):
        assert np.array(a).tobytes() == np.array(b).tobytes()
    if flavour == "keras3":
        c.save(str(tmp_path / "m.keras"))
        loaded = keras.models.load_model(str(tmp_path / "m.keras"))
        x, _ = inputs_of(obj)
        assert np.array(loaded(x)).tobytes() == np.array(c(x)).tobytes()


def test_ids_stored_as_strings_and_ints_follow_the_copy():
    class Registry(tf.Module):
        def __init__(self):
            super().__init__()
            self.v = tf.Variable(1.0)
            self.layer = tf.Module()
            self.by_id = {id(self.layer): "layer", str(id(self.layer)): "layer"}
            self.ids = [str(id(self.layer)), (str(id(self.layer)), 0)]
            self.key = f"{id(self.layer)}_ib-0"
            self.count = 123456789  # an ordinary int is left alone
            self.uid_table = {self.v._unique_id: "slot"}

    r = Registry()
    c = clone(r)
    lid = id(c.layer)
    assert c.by_id == {lid: "layer", str(lid): "layer"}
    assert c.ids == [str(lid), (str(lid), 0)]
    assert c.key == f"{lid}_ib-0" and c.count == 123456789
    assert c.uid_table == {c.v._unique_id: "slot"}
    assert r.by_id == {id(r.layer): "layer", str(id(r.layer)): "layer"}
