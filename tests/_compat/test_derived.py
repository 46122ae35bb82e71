"""State Keras layers derive from their variables, after every objckpt write (invariant 12).

An adapted `Normalization` computes with `mean`/`variance` tensors cached from its
variables, a lookup in "tf_idf" mode with `idf_weights_const`: after objckpt writes the
variables (restore from a prefix, a Snapshot, Keras's own files, Twins, clone, ensembles,
restore_on_create, migrate), outputs must equal those of the source model and of Keras's
own loader, exactly. LoRA-enabled and int8-quantized Keras 3 layers follow Keras's load:
a weights file holds a LoRA layer's merged kernel, which lands in the kernel, and the
factors become zeros.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import KERAS_FLAVOURS, keras_for

VOCAB = ["a", "b", "c", "d"]


def build(keras, seed: int, *, adapt: bool = True, lookups: bool = True):
    """numbers -> adapted Normalization -> Dense; words -> StringLookup (tf_idf);
    text -> TextVectorization (tf_idf). Each seed adapts to other data and idf weights."""
    if not lookups:
        keras.utils.set_random_seed(seed)
        numbers = keras.Input((3,), name="numbers")
        norm = keras.layers.Normalization(name="norm")
        norm.adapt(np.random.default_rng(seed).normal(3.0 * seed + 1, seed + 1.0, size=(32, 3))
                   .astype("float32"))
        return keras.Model(numbers, keras.layers.Dense(2, name="dense")(norm(numbers)))
    rng = np.random.default_rng(seed)
    numbers = keras.Input((3,), name="numbers")
    words = keras.Input((4,), dtype="string", name="words")
    text = keras.Input((1,), dtype="string", name="text")
    norm = keras.layers.Normalization(name="norm")
    if adapt:
        norm.adapt(rng.normal(3.0 * seed + 1, seed + 1.0, size=(32, 3)).astype("float32"))
    lookup = keras.layers.StringLookup(
        vocabulary=VOCAB, output_mode="tf_idf", name="lookup",
        idf_weights=rng.uniform(0.5, 3.0, len(VOCAB)).astype("float32"))
    vectorize = keras.layers.TextVectorization(
        vocabulary=VOCAB, output_mode="tf_idf", name="vectorize",
        idf_weights=rng.uniform(0.5, 3.0, len(VOCAB)).astype("float32"))
    x = keras.layers.Dense(2, name="dense")(norm(numbers))
    flat = keras.layers.Reshape((len(VOCAB) + 1,))(vectorize(text))
    out = keras.layers.Concatenate()([x, lookup(words), flat])
    return keras.Model([numbers, words, text], out)


def inputs():
    rng = np.random.default_rng(7)
    return [tf.constant(rng.normal(2.0, 3.0, size=(5, 3)).astype("float32")),
            tf.constant([["a", "b", "zz", "d"], ["c", "c", "a", "q"]] * 2 + [["d"] * 4]),
            tf.constant([["a b zz d c"], ["c"], ["b b"], ["q d"], ["a"]])]


def out(model):
    x = inputs() if len(model.inputs) == 3 else inputs()[0]
    return np.asarray(model(x, training=False))


def clones_lookups(flavour) -> bool:
    """Lookups hold a TF lookup table (runtime state), which objckpt.clone refuses in every
    flavour (CloneError naming `lookup_table`): clone and load_ensemble are tested on
    Normalization alone."""
    return False


def diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def keras_file(keras, tmp_path, model):
    """Keras's own weights file for the flavour, and its suffix."""
    name = "w.weights.h5" if keras.__version__.startswith("3") else "w.h5"
    path = str(tmp_path / name)
    model.save_weights(path)
    return path


@pytest.fixture(scope="module", params=KERAS_FLAVOURS)
def flavour(request, tmp_path_factory):
    keras = keras_for(request.param)
    source = build(keras, 0)
    directory = tmp_path_factory.mktemp(f"derived_{request.param}")
    prefix = objckpt.save(source, str(directory / "ckpt"))
    return dict(name=request.param, keras=keras, source=source, prefix=prefix,
                expected=out(source), directory=directory)


def fresh(flavour, seed=1):
    target = build(flavour["keras"], seed)
    assert diff(out(target), flavour["expected"]) > 0.5  # the test can fail
    return target


def test_restore_from_prefix(flavour):
    target = fresh(flavour)
    objckpt.restore(target, flavour["prefix"])
    np.testing.assert_array_equal(out(target), flavour["expected"])


def test_restore_from_snapshots_every_path(flavour):
    keras, expected = flavour["keras"], flavour["expected"]
    target, other = fresh(flavour), build(keras, 2)
    objckpt.restore(target, objckpt.snapshot(flavour["source"]))  # planned
    np.testing.assert_array_equal(out(target), expected)
    objckpt.restore(target, objckpt.snapshot(other))
    np.testing.assert_array_equal(out(target), out(other))
    objckpt.restore(target, objckpt.snapshot(flavour["source"]))  # the cached plan
    np.testing.assert_array_equal(out(target), expected)
    mine = objckpt.snapshot(target)
    objckpt.restore(target, objckpt.snapshot(other))
    objckpt.restore(target, mine)  # taken from this very obj: the fast path
    np.testing.assert_array_equal(out(target), expected)


def test_restore_from_keras_weights_file_equals_keras_load_weights(flavour, tmp_path):
    keras = flavour["keras"]
    path = keras_file(keras, tmp_path, flavour["source"])
    oracle = build(keras, 2)
    oracle.load_weights(path)
    target = fresh(flavour)
    objckpt.restore(target, path)
    np.testing.assert_array_equal(out(target), out(oracle))
    np.testing.assert_array_equal(out(target), flavour["expected"])


def test_restore_from_keras_file(flavour, tmp_path):
    keras = flavour["keras"]
    if not keras.__version__.startswith("3"):
        pytest.skip("`.keras` files are Keras 3's")
    path = str(tmp_path / "m.keras")
    flavour["source"].save(path)
    target = fresh(flavour)
    objckpt.restore(target, path)
    np.testing.assert_array_equal(out(target), flavour["expected"])


def test_twins_sync_swap_and_polyak(flavour, tmp_path):
    keras, expected = flavour["keras"], flavour["expected"]
    current, past = build(keras, 0), fresh(flavour)
    objckpt.restore(current, flavour["prefix"])
    twins = objckpt.Twins(current, past=past)
    twins.sync()
    np.testing.assert_array_equal(out(past), expected)
    other = build(keras, 3)
    objckpt.restore(past, objckpt.snapshot(other))
    before_past = out(past)
    twins.swap()
    np.testing.assert_array_equal(out(current), before_past)
    np.testing.assert_array_equal(out(past), expected)
    twins.sync(tau=0.5)  # past = (current + past) / 2, Normalization statistics too
    oracle = build(keras, 4)
    oracle.load_weights(keras_file(keras, tmp_path, past))  # Keras's own loader
    np.testing.assert_array_equal(out(past), out(oracle))


def test_twins_sync_inside_tf_function_warns_and_names_the_layer(flavour):
    twins = objckpt.Twins(build(flavour["keras"], 0), past=fresh(flavour))

    @tf.function
    def step():
        twins.sync()

    with pytest.warns(RuntimeWarning, match=r"`norm` \(Normalization\).*inside a tf.function"):
        step()
    twins.sync()  # eagerly: refreshed
    np.testing.assert_array_equal(out(twins.past), out(twins.current))


def test_twins_without_such_layers_never_refresh(flavour, monkeypatch):
    keras = flavour["keras"]
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    twins = objckpt.Twins(plain)
    from objckpt._compat import derived

    calls = []
    monkeypatch.setattr(derived, "_run", lambda *a: calls.append(a) or [])
    for _ in range(3):
        twins.sync()
        twins.sync(tau=0.5)
        twins.swap()
    assert calls == []  # the hot path pays nothing
    with_norm = objckpt.Twins(build(keras, 0), past=fresh(flavour))
    with_norm.sync()
    assert len(calls) == 1


def test_twins_find_their_hooks_once_and_refresh_only_what_a_selection_writes(
        flavour, monkeypatch):
    """Which variables each hook's layer owns is worked out when the Twins are made: a sync
    walks nothing and reads no layer's weights, and refreshes only the layers it wrote."""
    from objckpt._compat import derived

    twins = objckpt.Twins(build(flavour["keras"], 0), past=fresh(flavour))
    twins.sync()
    np.testing.assert_array_equal(out(twins.past), out(twins.current))
    walks, reads, runs = [], [], []
    walk, own_ids, run = derived.walk, derived._own_ids, derived._run
    monkeypatch.setattr(derived, "walk", lambda *a, **k: walks.append(a) or walk(*a, **k))
    monkeypatch.setattr(derived, "_own_ids", lambda layer: reads.append(layer) or own_ids(layer))
    monkeypatch.setattr(derived, "_run", lambda hooks, ids: runs.append(
        sorted(h.name for h in hooks)) or run(hooks, ids))
    objckpt.restore(twins.past, objckpt.snapshot(fresh(flavour, 2)))
    walks.clear(), reads.clear(), runs.clear()
    for _ in range(2):
        twins.sync()
        twins.sync(tau=0.5)
        twins.swap()
    assert walks == [] and reads == []  # O(hooks) per write, not O(variables)
    assert len(runs) == 2 * 4 and all(len(r) == len(runs[0]) >= 1 for r in runs)
    assert any("`norm`" in name for name in runs[0])
    runs.clear()
    twins.sync(include=r"(kernel|bias)$")  # the Dense: no layer with derived state
    assert runs == []
    twins.sync(include=r"(^|/)(adapt_)?mean$")  # the Normalization alone (every flavour's path)
    assert runs == [[name for name in runs[0] if "`norm`" in name]]
    assert walks == [] and reads == []
    np.testing.assert_array_equal(out(twins.past), out(twins.current))


def test_layers_with_hooks_are_found_once_per_tree(flavour, monkeypatch):
    from objckpt._compat import derived

    found = []
    original = derived._find_hooks
    monkeypatch.setattr(derived, "_find_hooks", lambda obj: found.append(obj) or original(obj))
    keras = flavour["keras"]
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    snapshot = objckpt.snapshot(keras.models.clone_model(plain))
    target = fresh(flavour)
    for _ in range(3):
        objckpt.restore(plain, snapshot)  # planned, then the cached plan
        objckpt.restore(plain, objckpt.snapshot(plain))  # the fast path
        objckpt.restore(target, flavour["prefix"])
    assert found == [plain, target]  # one walk each, then a lookup per restore
    np.testing.assert_array_equal(out(target), flavour["expected"])


def test_clone(flavour):
    lookups = clones_lookups(flavour)
    source = build(flavour["keras"], 0, lookups=lookups)
    prefix = objckpt.save(source, str(flavour["directory"] / f"clone_{lookups}"))
    other = build(flavour["keras"], 2, lookups=lookups)
    for copy in (True, False):
        twin = objckpt.clone(source, copy_values=copy)
        if copy:
            np.testing.assert_array_equal(out(twin), out(source))
        else:  # zeros everywhere, Normalization's statistics too: computed from them
            assert not np.any(np.asarray(twin.get_layer("norm").mean))
        objckpt.restore(twin, objckpt.snapshot(other))
        np.testing.assert_array_equal(out(twin), out(other))
        objckpt.restore(twin, prefix)
        np.testing.assert_array_equal(out(twin), out(source))


def test_load_ensemble_members_each_their_own(flavour):
    keras, lookups = flavour["keras"], clones_lookups(flavour)
    models = [build(keras, seed, lookups=lookups) for seed in (0, 2)]
    prefixes = [objckpt.save(m, str(flavour["directory"] / f"member{k}_{lookups}"))
                for k, m in enumerate(models)]
    template = build(keras, 5, lookups=lookups)
    ensemble = objckpt.load_ensemble(template, prefixes)
    x = inputs() if lookups else inputs()[0]
    stacked = np.asarray(ensemble(x, training=False))
    np.testing.assert_array_equal(stacked[0], out(models[0]))
    np.testing.assert_array_equal(stacked[1], out(models[1]))
    assert ensemble.last_mode == "loop"  # a batched graph would share cached constants
    assert "norm" in ensemble.fallback_reason


def test_discretization_bin_boundaries(flavour):
    keras = flavour["keras"]
    if keras.__version__.startswith("3"):
        pytest.skip("Keras 3 Discretization keeps its bin boundaries in its config, not in "
                    "variables: nothing to refresh")

    def build_bins(low):
        numbers = keras.Input((1,))
        bins = keras.layers.Discretization(num_bins=4, epsilon=0.01, name="bins")
        bins.adapt(np.arange(low, low + 40.0).reshape(-1, 1))
        return keras.Model(numbers, bins(numbers))

    x = tf.constant(np.linspace(-5.0, 150.0, 12).reshape(-1, 1).astype("float32"))
    source, target, past = build_bins(0), build_bins(100), build_bins(50)
    assert diff(target(x), source(x)) > 0
    objckpt.restore(target, objckpt.save(source, str(flavour["directory"] / "bins")))
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(source(x)))
    objckpt.Twins(source, past=past).sync()
    np.testing.assert_array_equal(np.asarray(past(x)), np.asarray(source(x)))


def test_restore_inside_tf_function_warns(flavour):
    target = fresh(flavour)
    snapshot = objckpt.snapshot(flavour["source"])

    @tf.function
    def load():
        objckpt.restore(target, snapshot)

    with pytest.warns(RuntimeWarning, match=r"`norm` \(Normalization\)"):
        load()
    objckpt.restore(target, snapshot)  # eagerly: refreshed
    np.testing.assert_array_equal(out(target), flavour["expected"])


def build_sequential(keras, seed=None):
    layers = [keras.layers.Normalization(name="norm"), keras.layers.Dense(2, name="dense")]
    model = keras.Sequential(layers)
    if seed is not None:
        layers[0].adapt(np.random.default_rng(seed).normal(4.0, 2.0, (16, 3)).astype("float32"))
        model(np.zeros((1, 3), "float32"))
    return model


def test_restore_on_create(flavour):
    keras = flavour["keras"]
    source = build_sequential(keras, 0)
    prefix = objckpt.save(source, str(flavour["directory"] / "sequential"))
    x = inputs()[0]
    target = build_sequential(keras)  # unbuilt: values land as its variables appear
    pending = objckpt.restore_on_create(target, prefix)
    result = np.asarray(target(x))
    pending.assert_done()
    np.testing.assert_array_equal(result, np.asarray(source(x)))


def lazy_model(keras):
    """A subclassed model whose Dense exists (built) from the start and whose
    Normalization is created in its build(), after the Dense's values landed."""

    class Lazy(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2, name="dense")
            self.dense.build((None, 3))

        def build(self, input_shape):
            norm = keras.layers.Normalization(name="norm")
            norm.build(input_shape)  # its values land when it is attached, after its build
            self.norm = norm
            super().build(input_shape)

        def call(self, x):
            return self.dense(self.norm(x))

    return Lazy()


def test_restore_on_create_refreshes_a_layer_created_in_build(flavour, monkeypatch):
    from objckpt._compat import derived

    keras = flavour["keras"]
    x = inputs()[0]
    source = lazy_model(keras)
    source(x)
    source.norm.adapt(np.random.default_rng(5).normal(4.0, 3.0, size=(32, 3)).astype("float32"))
    expected = np.asarray(source(x))
    prefix = objckpt.save(source, str(flavour["directory"] / "lazy"))
    target = lazy_model(keras)
    pending = objckpt.restore_on_create(target, prefix)
    assert pending.applied  # the Dense's values landed before the Normalization exists
    walks = []
    walk = derived.walk
    monkeypatch.setattr(derived, "walk", lambda *a, **k: walks.append(a) or walk(*a, **k))
    got = np.asarray(target(x))
    pending.assert_done()
    assert diff(got, expected) == 0  # the Normalization created in build() was refreshed
    assert walks == []  # found from the layers built, without walking the model again


@pytest.mark.parametrize("lookups", [False, True])
def test_migrate_then_restore(flavour, lookups):
    # tf_keras and Keras 2 lookups' idf_weights have the relaxed shape (None,): written in
    # the source value's shape.
    source = build(flavour["keras"], 0, lookups=lookups)
    prefix = objckpt.save(source, str(flavour["directory"] / f"to_migrate_{lookups}"))
    target = build(flavour["keras"], 1, lookups=lookups)
    assert diff(out(target), out(source)) > 0.5
    migrated = objckpt.migrate(target, prefix,
                               str(flavour["directory"] / f"migrated_{lookups}" / "ckpt"))
    objckpt.restore(target, migrated)
    np.testing.assert_array_equal(out(target), out(source))


# --- Keras 3: LoRA and quantized layers follow Keras's own load ------------------------


@pytest.fixture(scope="module")
def keras3():
    return keras_for("keras3")


def build_lora(keras, seed: int, *, lora: bool = True, quantize: str | None = None):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((3,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(10, 4, name="embed")(tokens))
    x = keras.layers.Dense(6, name="dense")(x)
    x = keras.layers.EinsumDense("ab,bc->ac", output_shape=4, bias_axes="c", name="einsum")(x)
    model = keras.Model(tokens, x)
    if quantize:
        model.quantize(quantize)
    if lora:
        for layer in model.layers[1:]:
            if hasattr(layer, "enable_lora") and layer.name != "flatten":
                layer.enable_lora(2)
    return model


def lora_inputs():
    return np.random.default_rng(1).integers(0, 10, (4, 3)).astype("int32")


def trained(keras, model):
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    model.fit(lora_inputs(), np.ones((4, 4), "float32"), epochs=1, verbose=0)
    return model


def scramble_lora(model, seed=3):
    """Non-zero LoRA factors (b starts at zeros, so a stale `a` would go unnoticed)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if "lora" in v.path:
            v.assign(rng.normal(0, 0.3, v.shape).astype(v.dtype))
    return model


def lora_factors(model):
    return {v.path: np.asarray(v) for v in model.weights if "lora" in v.path}


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.slow
def test_lora_weights_file_equals_keras_load_weights(keras3, tmp_path, quantize):
    keras = keras3
    source = trained(keras, build_lora(keras, 0, quantize=quantize))
    assert any(np.any(f != 0) for f in lora_factors(source).values())
    path = str(tmp_path / "lora.weights.h5")
    source.save_weights(path)  # the merged kernels, no factors
    oracle = build_lora(keras, 1, quantize=quantize)
    oracle.load_weights(path)
    target = scramble_lora(build_lora(keras, 2, quantize=quantize))
    before = diff(target(lora_inputs()), oracle(lora_inputs()))
    report = objckpt.restore(target, path)
    assert before > 0.1
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(oracle(lora_inputs())))
    for (path_, factor), (_, expected) in zip(lora_factors(target).items(),
                                             lora_factors(oracle).items()):
        np.testing.assert_array_equal(factor, expected, err_msg=path_)
        assert not np.any(factor)  # zeros, as Keras's load_own_variables leaves them
    zeroed = [s for s in report.skipped if "LoRA factor" in s]
    assert len(zeroed) == 6  # a and b of embed, dense and einsum
    if quantize is None:  # merged kernels in float: the source's outputs, closely
        np.testing.assert_allclose(np.asarray(target(lora_inputs())),
                                   np.asarray(source(lora_inputs())), atol=1e-5)


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.slow
def test_lora_objckpt_checkpoint_round_trips_factors(keras3, tmp_path, quantize):
    keras = keras3
    source = trained(keras, build_lora(keras, 0, quantize=quantize))
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    target = build_lora(keras, 2, quantize=quantize)
    report = objckpt.restore(target, prefix, optimizer_state=False)
    assert not [s for s in report.skipped if "LoRA" in s]
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(source(lora_inputs())))
    for (p, got), (_, want) in zip(lora_factors(target).items(),
                                   lora_factors(source).items()):
        np.testing.assert_array_equal(got, want, err_msg=p)
    twins = objckpt.Twins(source, past=scramble_lora(target))
    twins.sync()  # factors move with their kernels: never zeroed
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(source(lora_inputs())))
    assert any(np.any(f) for f in lora_factors(target).values())


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
@pytest.mark.slow
def test_quantized_weights_file_equals_keras_load_weights(keras3, tmp_path, mode):
    keras = keras3
    source = trained(keras, build_lora(keras, 0, lora=False))
    source.quantize(mode)
    path = str(tmp_path / "q.weights.h5")
    source.save_weights(path)
    oracle = build_lora(keras, 1, lora=False, quantize=mode)
    oracle.load_weights(path)
    target = build_lora(keras, 2, lora=False, quantize=mode)
    objckpt.restore(target, path)
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(oracle(lora_inputs())))
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(source(lora_inputs())))


def test_keras_hub_gemma_with_lora(keras3, tmp_path):
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")

    def backbone(seed):
        keras3.utils.set_random_seed(seed)
        model = keras_hub.models.GemmaBackbone(
            vocabulary_size=32, num_layers=1, num_query_heads=2, num_key_value_heads=1,
            hidden_dim=16, intermediate_dim=32, head_dim=8)
        model.enable_lora(rank=2)
        return model

    x = {"token_ids": np.array([[1, 5, 7, 2]], "int32"),
         "padding_mask": np.ones((1, 4), "int32")}
    source = scramble_lora(backbone(0), seed=0)
    path = str(tmp_path / "gemma.weights.h5")
    source.save_weights(path)
    oracle, target = backbone(1), scramble_lora(backbone(2))
    oracle.load_weights(path)
    assert diff(target(x), oracle(x)) > 0
    report = objckpt.restore(target, path)
    assert len([s for s in report.skipped if "LoRA factor" in s]) == len(lora_factors(target))
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(oracle(x)))
    prefix = objckpt.save(source, str(tmp_path / "gemma"))
    objckpt.restore(target, prefix)
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(source(x)))


def test_restore_inside_tf_function_lands_lora_zeros(keras3, tmp_path):
    """LoRA factors are variables: zeroed by assignments in the function itself."""
    keras = keras3
    source = trained(keras, build_lora(keras, 0))
    path = str(tmp_path / "lora.weights.h5")
    source.save_weights(path)
    oracle = build_lora(keras, 1)
    oracle.load_weights(path)
    target = scramble_lora(build_lora(keras, 2))

    @tf.function
    def load():
        objckpt.restore(target, path)  # a Keras weights file: merged kernels

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: no cached tensors
        load()
    np.testing.assert_array_equal(np.asarray(target(lora_inputs())),
                                  np.asarray(oracle(lora_inputs())))
