"""restore_on_create: values land as variables are created, in every flavour."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import KERAS_FLAVOURS, keras_for


def _dense(keras, name, built=True, seed=0):
    tf.random.set_seed(seed)
    layer = keras.layers.Dense(3, name=name)
    if built:
        layer(tf.ones((1, 2)))
    return layer


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("to_disk", [False, True], ids=["snapshot", "prefix"])
def test_dense_values_present_at_first_call(flavour, to_disk, tmp_path):
    keras = keras_for(flavour)
    saved = _dense(keras, "first", seed=1)
    source = objckpt.snapshot(saved)
    if to_disk:
        source = objckpt.save(saved, str(tmp_path / "dense"))
    fresh = _dense(keras, "second", built=False, seed=2)  # other variable names
    pending = objckpt.restore_on_create(fresh, source)
    assert not pending.done and len(pending.pending) == 2 and pending.applied == ()
    x = tf.constant([[0.5, -2.0]])
    np.testing.assert_array_equal(fresh(x).numpy(), saved(x).numpy())  # at the first call
    assert pending.done and pending.pending == () and len(pending.applied) == 2
    pending.assert_done()
    name = lambda layer: getattr(layer.kernel, "path", layer.kernel.name)  # noqa: E731
    assert name(fresh) != name(saved)
    np.testing.assert_array_equal(fresh.kernel.numpy(), saved.kernel.numpy())


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_partial_source_lists_pending(flavour):
    keras = keras_for(flavour)
    saved = objckpt.snapshot(_dense(keras, "first", seed=1))
    extra = dict(saved.items(), **{"later/w": tf.ones((2,))})
    fresh = _dense(keras, "second", built=False)
    pending = objckpt.restore_on_create(fresh, objckpt.Snapshot(extra))
    fresh(tf.ones((1, 2)))
    assert pending.pending == ("later/w",) and not pending.done
    with pytest.raises(errors.StructureMismatchError,
                       match=r"1 of 3 values have not landed:\n  - `later/w` \(from `later/w`\): "
                             "not created yet"):
        pending.assert_done()


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_shape_mismatch_at_creation_names_the_path(flavour):
    keras = keras_for(flavour)
    saved = _dense(keras, "first", seed=1)  # kernel (2, 3)
    fresh = _dense(keras, "second", built=False, seed=7)
    pending = objckpt.restore_on_create(fresh, objckpt.snapshot(saved))
    with pytest.raises(errors.StructureMismatchError, match=r"kernel` was created as "
                                                            r"float32\(5, 3\).*float32\(2, 3\)"):
        fresh(tf.ones((1, 5)))
    kernel_path = next(p for p in pending.pending if p.endswith("kernel"))
    assert kernel_path in pending.pending
    with pytest.raises(errors.StructureMismatchError, match="float32\\(2, 3\\) in the source"):
        pending.assert_done()


def test_existing_variables_land_all_or_nothing_with_those_the_plan_finds():
    """At the call, a value found by path and one found through the plan (by variable name)
    are read and checked together: the second does not fit, so the first is not assigned."""
    module = tf.Module()
    module.a = tf.Variable(tf.zeros((2,)), name="a")
    module.b = tf.Variable(tf.zeros((3,)), name="weights_b")
    source = objckpt.Snapshot({"a": tf.ones((2,)), "weights_b": tf.ones((4,))})
    with pytest.raises(errors.StructureMismatchError, match="weights_b"):
        objckpt.restore_on_create(module, source)
    assert module.a.numpy().tolist() == [0.0, 0.0] and module.b.numpy().tolist() == [0.0] * 3
    pending = objckpt.restore_on_create(
        module, objckpt.Snapshot({"a": tf.ones((2,)), "weights_b": tf.ones((3,))}))
    assert pending.done and sorted(pending.applied) == ["a", "b"]
    assert module.a.numpy().tolist() == [1.0, 1.0] and module.b.numpy().tolist() == [1.0] * 3


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_fit_on_an_unbuilt_model_trains_from_restored_values(flavour):
    keras = keras_for(flavour)

    def make(seed):
        tf.random.set_seed(seed)
        return keras.Sequential([keras.layers.Dense(4, activation="relu", name="h"),
                                 keras.layers.Dense(1, name="o")])

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")
    trained = make(1)
    trained(x[:1])
    source = objckpt.snapshot(trained)

    reference = make(2)  # built, then restored the ordinary way
    reference(x[:1])
    objckpt.restore(reference, source)
    deferred = make(3)  # unbuilt: values land while fit builds it
    pending = objckpt.restore_on_create(deferred, source)
    for model in (reference, deferred):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    pending.assert_done()
    for a, b in zip(reference.get_weights(), deferred.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(deferred.get_weights()[0], trained.get_weights()[0])  # it trained


class _Lazy(tf.Module):
    def __call__(self, x):
        if not hasattr(self, "w"):
            self.w = tf.Variable(tf.zeros((x.shape[-1], 2)))
            self.inner = tf.Module()
            self.inner.b = tf.Variable(tf.zeros((2,)))
        return x @ self.w + self.inner.b


def test_module_with_lazily_created_variables():
    source = objckpt.Snapshot({"w": np.ones((3, 2), np.float32), "inner/b": [1.0, 2.0]})
    module = _Lazy()
    pending = objckpt.restore_on_create(module, source)
    assert set(pending.pending) == {"w", "inner/b"}
    np.testing.assert_array_equal(module(tf.ones((1, 3))).numpy(), [[4.0, 5.0]])
    pending.assert_done()


def test_existing_variables_now_and_mismatch_changes_nothing():
    module = tf.Module()
    module.w = tf.Variable(tf.zeros((2,)))
    module.v = tf.Variable(tf.zeros((3,)))
    pending = objckpt.restore_on_create(module, objckpt.Snapshot({"w": [1.0, 2.0]}))
    assert pending.done and pending.applied == ("w",)
    np.testing.assert_array_equal(module.w.numpy(), [1.0, 2.0])
    with pytest.raises(errors.StructureMismatchError, match=r"`v` exists as float32\(3,\)"):
        objckpt.restore_on_create(module, objckpt.Snapshot({"w": [5.0, 6.0], "v": [1.0]}))
    np.testing.assert_array_equal(module.w.numpy(), [1.0, 2.0])  # nothing changed


def _tf1_dense(prefix, scope="model_001"):
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope(scope):
            tf.compat.v1.get_variable("dense/kernel", initializer=np.full((2, 3), 0.5, "float32"))
            tf.compat.v1.get_variable("dense/bias", initializer=np.arange(3, dtype="float32"))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(sess, prefix)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_name_based_source_through_rules(flavour, tmp_path):
    keras = keras_for(flavour)
    prefix = _tf1_dense(str(tmp_path / "tf1" / "model.ckpt"))
    fresh = _dense(keras, "renamed", built=False)
    # TF1 `model_001/dense/kernel` -> `kernel` (Keras 3's `_kernel`: underscores optional).
    pending = objckpt.restore_on_create(fresh, prefix, rules=[("^model_001/dense/", "")])
    out = fresh(tf.ones((1, 2))).numpy()
    pending.assert_done()
    np.testing.assert_array_equal(out, [[1.0, 2.0, 3.0]])


def test_two_entries_for_one_path_are_refused():
    with pytest.raises(errors.StructureMismatchError, match="both map to `w`"):
        objckpt.restore_on_create(_Lazy(), objckpt.Snapshot({"a/w": [1.0], "b/w": [2.0]}),
                                  rules=[("^[ab]/", "")])


def test_at_picks_a_subtree(tmp_path):
    keras = keras_for("keras3")
    saved = _dense(keras, "first", seed=1)
    prefix = tf.train.Checkpoint(model=saved).write(str(tmp_path / "ck"))
    fresh = _dense(keras, "second", built=False)
    pending = objckpt.restore_on_create(fresh, prefix, at="model")
    fresh(tf.ones((1, 2)))
    pending.assert_done()
    np.testing.assert_array_equal(fresh.kernel.numpy(), saved.kernel.numpy())
    with pytest.raises(errors.StructureMismatchError, match="no entries under at='nope'"):
        objckpt.restore_on_create(fresh, prefix, at="nope")


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_subclassed_model_values_at_first_call(flavour):
    keras = keras_for(flavour)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.first = keras.layers.Dense(4, activation="relu")
            self.second = keras.layers.Dense(2)

        def call(self, x):
            return self.second(self.first(x))

    x = tf.constant(np.random.default_rng(1).normal(size=(3, 5)), tf.float32)
    trained = Net()
    trained(x)
    fresh = Net()
    pending = objckpt.restore_on_create(fresh, objckpt.snapshot(trained))
    np.testing.assert_array_equal(fresh(x).numpy(), trained(x).numpy())  # the first call
    assert pending.done
    pending.assert_done()


class _LazyTraced(tf.Module):
    @tf.function
    def __call__(self, x):
        if not hasattr(self, "w"):
            self.w = tf.Variable(tf.zeros((3, 2)))
        return x @ self.w


def test_variables_created_inside_a_tf_function_from_a_prefix(tmp_path):
    module = tf.Module()
    module.w = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    lazy = _LazyTraced()
    pending = objckpt.restore_on_create(lazy, prefix)
    np.testing.assert_array_equal(lazy(tf.ones((1, 3))).numpy(), [[6.0, 9.0]])
    pending.assert_done()


def test_existing_variables_with_a_transform_are_all_checked_first():
    module = tf.Module()
    module.a = tf.Variable(tf.zeros((2,)))
    module.b = tf.Variable(tf.zeros((2,)))
    source = objckpt.Snapshot({"a": [1.0, 2.0], "old_b": [1.0, 2.0, 3.0]})
    with pytest.raises(errors.StructureMismatchError, match=r"`b` exists as float32\(2,\)"):
        objckpt.restore_on_create(module, source,
                                  rules=[("^old_b$", "b", lambda t: tf.reshape(t, (3, 1)))])
    np.testing.assert_array_equal(module.a.numpy(), [0.0, 0.0])  # nothing assigned


class _LazyPrivate(tf.Module):
    def __call__(self, x):
        if not hasattr(self, "_w"):
            self._w = tf.Variable(tf.zeros((3, 2)))
        return x @ self._w


def test_leading_underscore_optional_for_lazily_created_variables():
    source = objckpt.Snapshot({"w": np.ones((3, 2), np.float32)})
    module = _LazyPrivate()
    pending = objckpt.restore_on_create(module, source)
    np.testing.assert_array_equal(module(tf.ones((1, 3))).numpy(), [[3.0, 3.0]])  # first call
    pending.assert_done()


def test_unused_rules_warn():
    with pytest.warns(UserWarning, match=r"matched no key of Snapshot: rule 0 \('\^nope/'"):
        objckpt.restore_on_create(_Lazy(), objckpt.Snapshot({"w": np.ones((3, 2))}),
                                  rules=[("^nope/", "")])


def test_cancel_stops_waiting_and_unhooks():
    keras = keras_for("keras3")
    saved = objckpt.snapshot(_dense(keras, "first", seed=1))
    fresh = _dense(keras, "second", built=False, seed=2)
    before = fresh.__dict__.get("build")
    pending = objckpt.restore_on_create(fresh, saved)
    assert fresh.__dict__.get("build") is not before  # hooked
    pending.cancel()
    assert fresh.__dict__.get("build") is before and pending.done
    fresh(tf.ones((1, 2)))
    assert not np.array_equal(fresh.kernel.numpy(), saved[next(iter(saved))].numpy())


# --- streamed: values read one tensor at a time into existing and new variables -------


class _Steps(tf.Module):
    """An int64 step counter and a kernel above `_fastio.MAP_BYTES`; `build()` creates
    them (lazily), as a module's first call would."""

    def build(self, seed=None):
        self.step = tf.Variable(0 if seed is None else 10 + seed, dtype=tf.int64)
        self.inner = tf.Module()
        init = tf.zeros if seed is None else (
            lambda shape: tf.random.stateless_normal(shape, seed=(seed, 1)))
        self.inner.kernel = tf.Variable(init((512, 1024)))
        return self


def _loader_calls(monkeypatch) -> dict:
    """Counts the TF checkpoint loader's verify and assign calls."""
    from objckpt._bundle import fastio as _fastio

    calls = {"verify": 0, "assign": 0}
    for name in calls:
        original = getattr(_fastio.Loader, name)

        def counted(self, _original=original, _name=name):
            calls[_name] += 1
            return _original(self)

        monkeypatch.setattr(_fastio.Loader, name, counted)
    return calls


@pytest.mark.parametrize("when", ["existing", "created later"])
def test_a_tf_checkpoint_streams_into_variables(when, tmp_path, monkeypatch):
    """Above the streaming size a TF checkpoint is read one tensor at a time (checksums
    first) into the variables that exist and into those created later (each batch as it is
    created), bit-equal to the saved values, int64 step included."""
    from objckpt._bundle import fastio as _fastio

    saved = _Steps().build(seed=4)
    prefix = objckpt.save(saved, str(tmp_path / "ckpt"))
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    calls = _loader_calls(monkeypatch)
    module = _Steps().build() if when == "existing" else _Steps()
    pending = objckpt.restore_on_create(module, prefix)
    if when == "created later":
        assert calls == {"verify": 0, "assign": 0} and len(pending.pending) == 2
        module.build()
    pending.assert_done()
    assert calls["verify"] == calls["assign"] >= 1
    assert int(module.step) == 14
    assert module.inner.kernel.numpy().tobytes() == saved.inner.kernel.numpy().tobytes()


def test_a_damaged_tf_checkpoint_streamed_changes_nothing(tmp_path, monkeypatch):
    """A flipped byte in the kernel: the streamed route's checksums refuse it before
    anything is assigned, naming the entry; the step keeps its value."""
    from objckpt._bundle import fastio as _fastio

    saved = _Steps().build(seed=5)
    prefix = objckpt.save(saved, str(tmp_path / "ckpt"))
    data = f"{prefix}.data-00000-of-00001"
    raw = bytearray(open(data, "rb").read())
    raw[raw.find(saved.inner.kernel.numpy().tobytes()) + 99] ^= 0x10
    with open(data, "wb") as f:
        f.write(raw)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    calls = _loader_calls(monkeypatch)
    module = _Steps().build()
    with pytest.raises(errors.CheckpointCorruptError, match=r"inner/kernel.*checksum"):
        objckpt.restore_on_create(module, prefix)
    assert calls == {"verify": 1, "assign": 0}
    assert int(module.step) == 0 and not module.inner.kernel.numpy().any()


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("kind", ["safetensors", "tf"])
def test_a_keras_model_built_later_streams_each_layer(flavour, kind, tmp_path, monkeypatch):
    """A Keras model built after restore_on_create: the values of the layers, as they
    build, are read one tensor at a time (a safetensors export through the plan, a TF
    checkpoint by path), none fetched whole, and the model ends bit-equal to the one
    saved."""
    from objckpt._bundle import fastio as _fastio
    from objckpt._formats import safetensors as _st

    keras = keras_for(flavour)

    def make(seed):
        tf.random.set_seed(seed)
        return keras.Sequential([keras.layers.Dense(256), keras.layers.Dense(64)])

    saved = make(1)
    saved(tf.ones((1, 128)))
    if kind == "safetensors":
        pytest.importorskip("safetensors")
        source = objckpt.export(saved, str(tmp_path / "model.safetensors"))
    else:
        source = objckpt.save(saved, str(tmp_path / "ckpt"))
    streamed = []
    for cls in (_fastio.Loader, _st._Streamer):
        def counted(self, _original=cls.assign):
            streamed.append(type(self).__name__)
            return _original(self)

        monkeypatch.setattr(cls, "assign", counted)
    from objckpt._planning import pipeline as _pipeline

    whole = []
    fetch_entries = _pipeline.Pipeline.fetch_entries
    monkeypatch.setattr(_pipeline.Pipeline, "fetch_entries",
                        lambda self, src, entries: whole.extend(entries)
                        or fetch_entries(self, src, entries))
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    model = make(2)
    pending = objckpt.restore_on_create(model, source)
    assert not streamed
    model(tf.ones((1, 128)))
    pending.assert_done()
    assert set(streamed) == {"_Streamer" if kind == "safetensors" else "Loader"}
    assert whole == []  # no value fetched whole
    assert [w.tobytes() for w in model.get_weights()] == [
        w.tobytes() for w in saved.get_weights()]
