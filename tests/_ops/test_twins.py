"""Twins (past/current) and the TwinSync callback over every flavour."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import CASES, FLAVOURS, KERAS_FLAVOURS, _data, build, case_id, keras_for
from support import assert_bits, perturb, values


def network(obj):
    """The network of a builder's result (module builders return a Checkpoint)."""
    return obj.model if isinstance(obj, tf.train.Checkpoint) else obj


def make_twins(flavour, kind="functional"):
    model = network(build(flavour, kind))
    past = network(build(flavour, kind))  # the same code builds the past copy
    return objckpt.Twins(model, past=past)


def inputs_for(model):
    images, tokens, targets = _data(seed=3)
    if isinstance(model, tf.Module) and not hasattr(model, "built"):
        return tf.ones((2, 3)), None
    return (images if model.name == "net" else [images, tokens]), targets


def outputs(model, x):
    if hasattr(model, "built"):
        return model(x, training=False).numpy()
    return model(x).numpy()


@pytest.fixture(params=CASES, ids=case_id)
def twins(request):
    return make_twins(*request.param)


def pair_trees(twins):
    pairs = twins.variables()
    return ({p: c for p, (c, _) in pairs.items()}, {p: q for p, (_, q) in pairs.items()})


def test_sync_copies_every_network_variable_but_not_optimizer_state(twins):
    current, past = pair_trees(twins)
    assert twins.paths and all("OPTIMIZER_SLOT" not in p and not p.startswith("optimizer/")
                               for p in twins.paths)
    twinned = {id(v) for v in past.values()}
    optimizer_before = {p: v.numpy().copy() for p, v in objckpt.tree(twins.past).items()
                        if id(v) not in twinned}
    assert optimizer_before or not hasattr(twins.past, "optimizer")
    twins.sync()
    for path in twins.paths:
        assert current[path].numpy().tobytes() == past[path].numpy().tobytes(), path
    for path, value in optimizer_before.items():
        assert objckpt.tree(twins.past)[path].numpy().tobytes() == value.tobytes(), path
    if hasattr(twins.current, "built"):
        x, _ = inputs_for(twins.current)
        assert np.array_equal(outputs(twins.current, x), outputs(twins.past, x))
    # Independent afterwards: writing current leaves past as it was, and vice versa.
    kept = {p: past[p].numpy().copy() for p in twins.paths}
    perturb(current[p] for p in twins.paths)
    assert all(past[p].numpy().tobytes() == kept[p].tobytes() for p in twins.paths)
    kept = {p: current[p].numpy().copy() for p in twins.paths}
    perturb(past[p] for p in twins.paths)
    assert all(current[p].numpy().tobytes() == kept[p].tobytes() for p in twins.paths)


def test_polyak_update_is_the_blend_and_copies_integers(twins):
    current, past = pair_trees(twins)
    a = {p: current[p].numpy().copy() for p in twins.paths}
    b = {p: past[p].numpy().copy() for p in twins.paths}
    for tau in (0.25, 0.5):  # a new tau never retraces
        twins.sync(tau=tau)
        for path in twins.paths:
            got = past[path].numpy()
            if got.dtype.kind == "f":
                t = got.dtype.type(tau)
                want = t * a[path] + (got.dtype.type(1) - t) * b[path]
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=path)
            else:
                assert np.array_equal(got, a[path]), path
            b[path] = got.copy()
    assert sum(key[0] == "blend" for key in twins._fns) == 1
    fn = next(f for key, f in twins._fns.items() if key[0] == "blend")
    assert fn.function.experimental_get_tracing_count() == 1


def test_swap_exchanges_values_and_leaves_optimizer_alone(twins):
    current, past = pair_trees(twins)
    perturb(past.values())
    everything = values(objckpt.tree(twins.current))
    a, b = values(current), values(past)
    twins.swap()
    for path in twins.paths:
        assert current[path].numpy().tobytes() == b[path].tobytes()
        assert past[path].numpy().tobytes() == a[path].tobytes()
    twinned = {id(v) for v in current.values()}
    for path, variable in objckpt.tree(twins.current).items():
        if id(variable) not in twinned:  # optimizer state
            assert variable.numpy().tobytes() == everything[path].tobytes(), path
    twins.swap()
    assert_bits(a, values(current))


def test_include_and_exclude_select_paths():
    twins = make_twins("module")
    perturb(objckpt.tree(twins.current).values())
    before = values(objckpt.tree(twins.past))
    twins.sync(include="^encoder/", exclude="/b$")
    current, past = pair_trees(twins)
    assert past["encoder/w"].numpy().tobytes() == current["encoder/w"].numpy().tobytes()
    for path in ("encoder/b", "layers/1/w", "step"):
        assert past[path].numpy().tobytes() == before[path].tobytes(), path
    with pytest.raises(errors.InvalidArgumentError, match="select no variable"):
        twins.sync(include="^nothing/")
    with pytest.raises(errors.InvalidArgumentError, match=r"Received: include='\('"):
        twins.sync(include="(")


class _Mixed(tf.Module):
    """Variables of every dtype the blend handles differently."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.f32 = tf.Variable(rng.standard_normal((4, 5)).astype(np.float32))
        self.f64 = tf.Variable(rng.standard_normal(7))
        self.f16 = tf.Variable(rng.standard_normal(3).astype(np.float16))
        self.count = tf.Variable(int(seed), dtype=tf.int64)


@pytest.mark.parametrize("tau", [0.3, 1.0])
def test_tensor_tau_blends_below_one_and_copies_at_one(tau):
    twins = objckpt.Twins(_Mixed(1), past=_Mixed(2))
    current, past = pair_trees(twins)
    a = {p: current[p].numpy() for p in twins.paths}
    b = {p: past[p].numpy() for p in twins.paths}
    tf.function(lambda t: twins.sync(tau=t))(tf.constant(tau))  # one traced call for any tau
    assert [key[0] for key in twins._fns] == ["blend_or_copy"]
    for path in twins.paths:
        got = past[path].numpy()
        if tau == 1.0 or got.dtype.kind != "f":
            assert got.tobytes() == a[path].tobytes(), path  # bit-exact copy
        else:
            t = float(np.float32(tau))  # the float32 tensor's value
            want = t * a[path].astype(np.float64) + (1 - t) * b[path].astype(np.float64)
            rtol = 1e-3 if got.dtype == np.float16 else 1e-6
            np.testing.assert_allclose(got, want, rtol=rtol, err_msg=path)


class _Many(tf.Module):
    """Enough variables (of every dtype) for the packed eager path."""

    def __init__(self, seed):
        self.parts = [_Mixed(seed * 100 + k) for k in range(12)]  # 48 variables


def test_packed_eager_path_matches_the_traced_one(monkeypatch):
    from objckpt import _compat

    packed_calls = []
    original = _compat.packed_pairs_call

    def spy(kind, current, past):
        call = original(kind, current, past)
        assert call is not None, "48 CPU resource variables take the packed path"
        return lambda *a: (packed_calls.append(kind), call(*a))[1]

    monkeypatch.setattr(_compat, "packed_pairs_call", spy)
    eager = objckpt.Twins(_Many(1), past=_Many(2))
    graph = objckpt.Twins(_Many(1), past=_Many(2))
    assert len(eager.paths) == 48
    for step, (kind, tau) in enumerate([("sync", 0.3), ("swap", None), ("sync", 1.0),
                                        ("sync", 0.05)]):
        perturb(objckpt.tree(eager.current).values())
        perturb(objckpt.tree(graph.current).values())
        if kind == "swap":
            eager.swap()
            tf.function(graph.swap)()
        else:
            eager.sync(tau=tau)
            tf.function(lambda t=tau: graph.sync(tau=t))()
        for side in ("current", "past"):
            got = values(objckpt.tree(getattr(eager, side)))
            want = values(objckpt.tree(getattr(graph, side)))
            for path in want:  # bit-equal to the traced function's result
                assert got[path].tobytes() == want[path].tobytes(), (step, side, path)
    assert packed_calls == ["blend", "swap", "copy", "blend"]


@pytest.mark.parametrize("tau", [-0.1, 1.5])
def test_tau_out_of_range(tau):
    twins = make_twins("module")
    with pytest.raises(errors.InvalidArgumentError, match=f"Received: tau={tau}"):
        twins.sync(tau=tau)


def test_past_with_another_structure_is_refused():
    current = network(build("module"))
    other = network(build("module"))
    other.extra = tf.Variable(1.0)
    other.encoder.w = tf.Variable(tf.zeros((3, 5)))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.Twins(current, past=other)
    message = str(info.value)
    assert "`extra`: only in past" in message
    assert "`encoder/w`: float32(3, 4) in current but float32(3, 5) in past" in message
    assert "Twins(model, past=factory())" in message
    with pytest.raises(errors.StructureMismatchError, match="the same variable"):
        objckpt.Twins(current, past=current)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_seed_scenario_past_is_exactly_one_update_behind(flavour):
    """Custom loop with Adam: each step computes current(x) and past(x), syncs,
    then updates current. past(x) must equal current(x) of the step before."""
    if flavour == "module":
        model = network(build("module"))
        twins = objckpt.Twins(model)  # past: a clone
        optimizer = tf.compat.v1.train.AdamOptimizer(0.05)
        x, y = tf.ones((2, 3)), tf.zeros((2, 2))

        def forward(training):
            del training
            return model(x)
    else:
        keras = keras_for(flavour)
        twins = objckpt.Twins(network(build(flavour, "subclassed")))  # past: a clone
        model = twins.current
        optimizer = keras.optimizers.Adam(0.05)
        x, y = inputs_for(model)

        def forward(training):
            return model(x, training=training)

    variables = [v for v in model.trainable_variables if tf.as_dtype(v.dtype).is_floating]
    twins.sync()
    previous = None
    for _ in range(5):
        current_out = forward(False).numpy()
        past_out = (twins.past(x, training=False) if hasattr(twins.past, "built")
                    else twins.past(x)).numpy()
        if previous is not None:
            assert past_out.tobytes() == previous.tobytes()
            assert current_out.tobytes() != previous.tobytes()
        twins.sync()
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((forward(True) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        previous = current_out


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_inside_a_tf_function_train_step_never_retraces(flavour):
    twins = make_twins(flavour)
    model = twins.current
    x, _ = inputs_for(model)
    variables = [v for v in model.trainable_variables if tf.as_dtype(v.dtype).is_floating]
    traces = []

    @tf.function
    def step(x, tau):
        traces.append(1)
        out = model(x)
        twins.sync()
        twins.sync(tau=tau)
        twins.swap()
        twins.swap()
        return out

    for tau in (0.1, 0.2, 0.3):
        step(x, tf.constant(tau, tf.float64))
    assert len(traces) == 1
    current, past = pair_trees(twins)
    for path in twins.paths:  # sync, then a blend of equal values, swapped twice
        np.testing.assert_allclose(past[path].numpy(), current[path].numpy(), rtol=1e-6)
    for fn in twins._fns.values():
        assert fn.function.experimental_get_tracing_count() == 1
    assert variables


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("on", ["batch", "epoch"])
def test_twin_sync_callback_in_fit(flavour, on):
    keras = keras_for(flavour)
    twins = make_twins(flavour)
    x, y = inputs_for(twins.current)
    callback = objckpt.callbacks.TwinSync(twins, every=2, on=on)
    assert isinstance(callback, keras.callbacks.Callback)
    assert isinstance(callback, objckpt.callbacks.TwinSync)
    twins.current.fit(x, y, epochs=4, batch_size=2, verbose=0, callbacks=[callback])
    # 8 samples / batch 2 = 4 batches per epoch, 4 epochs.
    assert callback.syncs == (16 // 2 if on == "batch" else 4 // 2)
    # The last sync ran after the last batch/epoch: past equals current now.
    current, past = pair_trees(twins)
    for path in twins.paths:
        assert current[path].numpy().tobytes() == past[path].numpy().tobytes(), path


def test_twin_sync_polyak_every_epoch():
    keras_for("keras3")
    twins = make_twins("keras3")
    before = values(pair_trees(twins)[1])
    x, y = inputs_for(twins.current)
    cb = objckpt.callbacks.TwinSync(twins, tau=0.5, on="epoch")
    twins.current.fit(x, y, epochs=1, batch_size=4, verbose=0, callbacks=[cb])
    current, past = (values(t) for t in pair_trees(twins))
    path = next(p for p in twins.paths if p.endswith("kernel"))
    np.testing.assert_allclose(past[path], 0.5 * current[path] + 0.5 * before[path], rtol=1e-6,
                               atol=1e-7)


@pytest.fixture(scope="module")
def keras3_twins():
    """Twins that argument checks are refused for (a refused TwinSync leaves them alone)."""
    keras_for("keras3")
    return make_twins("keras3")


@pytest.mark.parametrize("kwargs, match", [
    ({"every": 0}, "every must be a positive int"),
    ({"on": "step"}, 'on must be "batch" or "epoch"'),
    ({"tau": 2.0}, "Received: tau=2.0"),
])
def test_twin_sync_validates_its_arguments(keras3_twins, kwargs, match):
    twins = keras3_twins
    with pytest.raises(errors.InvalidArgumentError, match=match):
        objckpt.callbacks.TwinSync(twins, **kwargs)


def test_twin_sync_needs_twins_of_a_keras_model():
    with pytest.raises(errors.InvalidArgumentError, match=r"needs an objckpt\.Twins"):
        objckpt.callbacks.TwinSync(object())
    with pytest.raises(errors.InvalidArgumentError, match="needs a Keras model"):
        objckpt.callbacks.TwinSync(make_twins("module"))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_default_past_is_an_independent_clone(case):
    model = network(build(*case))
    twins = objckpt.Twins(model)  # no factory: objckpt.clone makes the past copy
    assert twins.past is not model and type(twins.past) is type(model)
    current, past = pair_trees(twins)
    assert_bits(values(current), values(past))
    assert not {id(v) for v in current.values()} & {id(v) for v in past.values()}
    if hasattr(model, "built"):
        x, _ = inputs_for(model)
        assert outputs(model, x).tobytes() == outputs(twins.past, x).tobytes()
    kept = values(past)
    perturb(current.values())
    assert_bits(kept, values(past))
    twins.sync()
    assert_bits(values(current), values(past))


def test_clone_failure_points_to_a_past_factory(tmp_path):
    model = network(build("module"))
    model.log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - an uncopyable attribute
    try:
        with pytest.raises(errors.CloneError, match=r"Twins\(model, past=factory\(\)\)"):
            objckpt.Twins(model)
        assert objckpt.Twins(model, past=network(build("module"))).paths
    finally:
        model.log.close()
