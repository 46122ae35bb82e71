"""load_ensemble and Ensemble: N independent members from N sources, batched or looped."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import CASES, FLAVOURS, _data, build, case_id, keras_for
from support import values


def write_tf1_scoped(directory, scope: str, value: float) -> str:
    """TF1 graph code: `w = get_variable('w', initializer=value)` under `scope`, saved."""
    prefix = os.path.join(str(directory), scope, "model.ckpt")
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope(scope):
            tf.compat.v1.get_variable("w", initializer=tf.constant(value))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, prefix)


class AddW(tf.Module):
    """The TF2 module of the seed scenario: x + w."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(0.0)

    def __call__(self, x):
        return x + self.w


@pytest.fixture(scope="module")
def tf1_prefixes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tf1_scopes")
    return [write_tf1_scoped(directory, f"model_00{k}", float(k)) for k in (1, 2, 3)]


def test_seed_three_tf1_checkpoints_under_scopes_give_11_12_13(tf1_prefixes):
    assert [n for n, _ in tf.train.list_variables(tf1_prefixes[1])] == ["model_002/w"]
    template = AddW()
    ensemble = objckpt.load_ensemble(template, tf1_prefixes, rules=[(r"^model_\d{3}/", "")])
    out = ensemble(tf.constant(10.0))
    assert out.numpy().tolist() == [11.0, 12.0, 13.0]
    assert float(ensemble.mean(tf.constant(10.0))) == 12.0
    assert ensemble.last_mode == "batched"
    assert ensemble(tf.constant(10.0), mode="loop").numpy().tolist() == [11.0, 12.0, 13.0]
    assert float(template.w) == 0.0  # the template is not a member and is left alone
    assert [float(m.w) for m in ensemble.members] == [1.0, 2.0, 3.0]


def test_seed_with_one_list_of_rules_per_member(tf1_prefixes):
    rules = [[(f"^model_00{k}/", "")] for k in (1, 2, 3)]
    ensemble = objckpt.load_ensemble(AddW(), tf1_prefixes, rules=rules)
    assert ensemble(tf.constant(10.0)).numpy().tolist() == [11.0, 12.0, 13.0]
    with pytest.raises(errors.InvalidArgumentError, match=r"2 lists of rules .* 3 sources"):
        objckpt.load_ensemble(AddW(), tf1_prefixes, rules=rules[:2])


def network(obj):
    return obj.model if isinstance(obj, tf.train.Checkpoint) else obj


def inputs_for(model):
    images, tokens, _ = _data(seed=5)
    if not hasattr(model, "built"):
        return tf.ones((2, 3))
    return images if model.name == "net" else [images, tokens]


def call(model, x):
    if hasattr(model, "built"):
        return model(x, training=False)
    return model(x)


def perturbed(flavour, kind, k):
    """A trained obj of the flavour whose network values differ per k."""
    obj = build(flavour, kind)
    for variable in objckpt.tree(network(obj)).values():
        if variable.dtype.is_floating:
            variable.assign(variable * (1.0 + 0.1 * k) + 0.01 * k)
    return obj


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.slow
def test_each_member_holds_its_own_source_exactly(case, tmp_path):
    flavour, kind = case
    objs = [perturbed(flavour, kind, k) for k in range(3)]
    nets = [network(o) for o in objs]
    # Three kinds of source: a Snapshot, a prefix, a directory (of a training checkpoint).
    sources = [objckpt.snapshot(nets[0]), objckpt.save(nets[1], tmp_path / "one" / "ckpt")]
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=nets[2]), tmp_path / "run", 3)
    manager.save()
    sources.append(str(tmp_path / "run"))
    template = network(build(flavour, kind, train=False)) if flavour != "module" else \
        network(build(flavour, kind))
    template_before = values(objckpt.tree(template))
    ensemble = objckpt.load_ensemble(template, sources, strict=False)
    assert len(ensemble) == 3 and all(m is not template for m in ensemble.members)
    net_paths = [p for p, _ in objckpt._compat.network_variable_paths(template)]
    for k, (member, net) in enumerate(zip(ensemble.members, nets)):
        got = dict(objckpt._compat.network_variable_paths(member))
        want = dict(objckpt._compat.network_variable_paths(net))
        for path in net_paths:
            assert got[path].numpy().tobytes() == want[path].numpy().tobytes(), (k, path)
    after = values(objckpt.tree(template))
    assert all(after[p].tobytes() == template_before[p].tobytes() for p in template_before)

    x = inputs_for(template)
    expected = np.stack([call(net, x).numpy() for net in nets])
    auto = ensemble(x).numpy()
    looped = ensemble(x, mode="loop").numpy()
    np.testing.assert_allclose(auto, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(looped, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ensemble.mean(x).numpy(), expected.mean(0), rtol=1e-5, atol=1e-5)

    # Members are independent: changing one changes neither the others nor the sources.
    first = next(v for _, v in objckpt._compat.network_variable_paths(ensemble.members[0])
                 if v.dtype.is_floating and v.trainable)
    first.assign(first + 1.0)
    again = ensemble(x, mode="loop").numpy()
    assert not np.allclose(again[0], looped[0])
    np.testing.assert_array_equal(again[1:], looped[1:])


def mlp(flavour, seed):
    if flavour == "module":
        class MLP(tf.Module):
            def __init__(self):
                super().__init__()
                init = tf.random.stateless_normal
                self.w1 = tf.Variable(init((16, 32), seed=(seed, 1)))
                self.b1 = tf.Variable(init((32,), seed=(seed, 2)))
                self.w2 = tf.Variable(init((32, 4), seed=(seed, 3)))

            def __call__(self, x):
                return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2)

        return MLP()
    keras = keras_for(flavour)
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.BatchNormalization(),
                             keras.layers.Dense(32, activation="tanh"),
                             keras.layers.Dense(4)])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_batched_and_loop_give_the_same_numbers(flavour):
    members = [mlp(flavour, seed) for seed in range(4)]
    ensemble = objckpt.load_ensemble(mlp(flavour, 9), [objckpt.snapshot(m) for m in members])
    x = tf.random.stateless_normal((8, 16), seed=(0, 0))
    batched = ensemble(x, mode="batched").numpy()
    assert ensemble.last_mode == "batched" and ensemble.fallback_reason is None
    looped = ensemble(x, mode="loop").numpy()
    assert ensemble.last_mode == "loop"
    assert batched.shape == (4, 8, 4)
    np.testing.assert_allclose(batched, looped, rtol=1e-6, atol=1e-6)
    expected = np.stack([call(m, x).numpy() for m in members])
    np.testing.assert_allclose(batched, expected, rtol=1e-6, atol=1e-6)
    # Another batch size reuses the traced function; a member changed after loading is seen.
    assert ensemble(x[:3]).shape == (4, 3, 4)
    variable = objckpt.tree(ensemble.members[2])
    variable = next(v for v in variable.values() if len(v.shape) == 2)
    variable.assign(tf.zeros_like(variable))
    changed = ensemble(x).numpy()
    # The unchanged members, to float rounding: a batched kernel is not promised to give
    # the same bits from one call to the next (docs/guarantees.md); a change that leaked
    # from member 2 (zeroed) would be far larger.
    np.testing.assert_allclose(changed[[0, 1, 3]], batched[[0, 1, 3]], rtol=1e-6, atol=1e-6)
    assert not np.allclose(changed[2], batched[2])


class Counting(tf.Module):
    """Writes a variable when called: cannot be batched over stacked weights."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(1.0)
        self.calls = tf.Variable(0)

    def __call__(self, x):
        self.calls.assign_add(1)
        return x * self.w


def test_unbatchable_members_fall_back_to_a_loop_with_the_reason():
    members = [Counting(), Counting()]
    members[1].w.assign(2.0)
    ensemble = objckpt.Ensemble(members)
    assert ensemble(tf.constant(3.0)).numpy().tolist() == [3.0, 6.0]
    assert ensemble.last_mode == "loop"
    assert "calls" in ensemble.fallback_reason and "AssignAddVariableOp" in \
        ensemble.fallback_reason
    with pytest.raises(errors.InvalidArgumentError, match="cannot be evaluated as one batched"):
        ensemble(tf.constant(3.0), mode="batched")
    with pytest.raises(errors.InvalidArgumentError, match="mode must be one of"):
        ensemble(tf.constant(3.0), mode="fast")


def test_bad_input_is_refused_with_the_member_and_source_named(tmp_path, tf1_prefixes):
    with pytest.raises(errors.InvalidArgumentError, match="one source per member"):
        objckpt.load_ensemble(AddW(), tf1_prefixes[0])
    with pytest.raises(errors.InvalidArgumentError, match="sources is empty"):
        objckpt.load_ensemble(AddW(), [])
    with pytest.raises(errors.UnsupportedObjectError, match="template must be a trackable"):
        objckpt.load_ensemble(object(), tf1_prefixes)
    with pytest.raises(errors.UnbuiltModelError, match="no variables yet"):
        objckpt.load_ensemble(tf.Module(), tf1_prefixes)
    missing = str(tmp_path / "nothing" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError, match=r"member 1 .*nothing"):
        objckpt.load_ensemble(AddW(), [tf1_prefixes[0], missing],
                              rules=[(r"^model_\d{3}/", "")])
    wide = tf.Module()
    wide.w = tf.Variable([1.0, 2.0])
    wrong = objckpt.save(wide, tmp_path / "wide" / "ckpt")
    with pytest.raises(errors.StructureMismatchError, match=r"member 2 \(source `.*wide") as info:
        objckpt.load_ensemble(AddW(), [*tf1_prefixes[:2], wrong],
                              rules=[[(r"^model_\d{3}/", "")]] * 2 + [[]])
    assert "float32[2]" in str(info.value) or "(2,)" in str(info.value)


def test_ensemble_members_must_share_one_architecture_and_not_variables():
    a, b = AddW(), AddW()
    c = tf.Module()
    c.w = tf.Variable([1.0])
    with pytest.raises(errors.StructureMismatchError, match=r"member 1 differs .*`w`"):
        objckpt.Ensemble([a, c])
    shared = tf.Module()
    shared.w = a.w
    with pytest.raises(errors.StructureMismatchError, match="own variables"):
        objckpt.Ensemble([a, shared])
    assert len(objckpt.Ensemble([a, b])) == 2


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_sources_of_one_structure_are_planned_once(flavour, tmp_path, monkeypatch):
    from objckpt._planning import match as _match

    planned = []
    make_plan = _match.make_plan
    monkeypatch.setattr(_match, "make_plan",
                        lambda *a, **k: planned.append(a[0].description) or make_plan(*a, **k))
    # Four runs of the same code (Keras names their layers and variables differently in
    # each run: mlp_3/dense_7/kernel) saved as prefixes, one of them as a Snapshot.
    nets = [mlp(flavour, seed) for seed in range(4)]
    x = tf.random.stateless_normal((5, 16), seed=(7, 8))
    for net in nets:
        call(net, x)
    sources = [objckpt.save(n, tmp_path / f"run{k}" / "ckpt") for k, n in enumerate(nets[:3])]
    sources.append(objckpt.snapshot(nets[3]))
    template = mlp(flavour, 99)
    call(template, x)
    ensemble = objckpt.load_ensemble(template, sources)
    assert len(planned) == 2  # one plan for the three prefixes, one for the Snapshot
    assert planned[0].endswith("ckpt`") and planned[1] == "Snapshot"
    for member, net in zip(ensemble.members, nets):
        got = dict(objckpt._compat.network_variable_paths(member))
        for path, want in objckpt._compat.network_variable_paths(net):
            assert got[path].numpy().tobytes() == want.numpy().tobytes(), path
    np.testing.assert_allclose(ensemble(x).numpy(),
                               np.stack([call(n, x).numpy() for n in nets]), rtol=1e-5,
                               atol=1e-5)
    # A source of another structure is planned on its own, and refused as before.
    wide = tf.Module()
    wide.w = tf.Variable([1.0, 2.0])
    with pytest.raises(errors.StructureMismatchError, match=r"member 1 \(source Module\)|"
                                                             r"member 1 \(source Snapshot\)"):
        objckpt.load_ensemble(template, [sources[0], objckpt.snapshot(wide)])


@pytest.mark.parametrize("flavour", ["tf_keras", "keras2"])
def test_mixed_precision_members_hold_their_float32_values(flavour):
    keras = keras_for(flavour)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        nets = []
        for seed in range(3):
            keras.utils.set_random_seed(seed)
            nets.append(keras.Sequential([keras.Input((16,)), keras.layers.Dense(8),
                                          keras.layers.Dense(4)]))
        ensemble = objckpt.load_ensemble(nets[0], [objckpt.snapshot(n) for n in nets])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for member, net in zip(ensemble.members, nets):
        got = dict(objckpt._compat.network_variable_paths(member))
        for path, want in objckpt._compat.network_variable_paths(net):
            assert want.dtype == tf.float32
            assert got[path].numpy().tobytes() == want.numpy().tobytes(), path
    x = tf.ones((2, 16))
    np.testing.assert_allclose(ensemble(x, mode="loop").numpy(),
                               np.stack([n(x).numpy() for n in nets]), rtol=1e-3)


class Counted(tf.Module):
    """A training module: an int64 step counter beside float weights (the kernel above
    `_fastio.MAP_BYTES`, so it takes the loader's read-into-a-new-tensor path)."""

    def __init__(self, k: int = 0):
        super().__init__()
        self.step = tf.Variable(10 + k, dtype=tf.int64)
        init = tf.random.stateless_normal
        self.kernel = tf.Variable(init((512, 1024), seed=(k, 1)))
        self.bias = tf.Variable(init((16,), seed=(k, 2)))

    def __call__(self, x):
        return tf.reduce_sum(self.kernel) * x + tf.reduce_sum(self.bias)


def _fetch_calls(monkeypatch) -> list:
    """The number of values of every fetch-stage call."""
    from objckpt._planning import pipeline as _pipeline

    calls = []
    fetch = _pipeline.Pipeline.fetch

    def counted(self, the_plan, variables, matches=None):
        values = fetch(self, the_plan, variables, matches)
        calls.append(len(values))
        return values

    monkeypatch.setattr(_pipeline.Pipeline, "fetch", counted)
    return calls


def test_tf_checkpoints_read_into_each_member_as_created_step_and_weights_exact(
        tmp_path, monkeypatch):
    """Above the streaming size each member's variables are created from values read one
    at a time from its TF checkpoint (each variable adopts the tensor read): every
    member's int64 step and weights are its checkpoint's, bit for bit, and the template
    keeps its own."""
    from objckpt._bundle import fastio as _fastio

    nets = [Counted(k) for k in range(3)]
    prefixes = [objckpt.save(n, tmp_path / f"run{k}" / "ckpt") for k, n in enumerate(nets)]
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    calls = _fetch_calls(monkeypatch)
    template = Counted(7)
    before = values(objckpt.tree(template))
    ensemble = objckpt.load_ensemble(template, prefixes)
    assert calls == [1] * 9  # 3 members x 3 variables, each read alone
    assert [int(m.step) for m in ensemble.members] == [10, 11, 12]
    for member, net in zip(ensemble.members, nets):
        for name in ("step", "kernel", "bias"):
            got, want = getattr(member, name), getattr(net, name)
            assert got.dtype == want.dtype
            assert got.numpy().tobytes() == want.numpy().tobytes(), name
    after = values(objckpt.tree(template))
    assert all(after[p].tobytes() == before[p].tobytes() for p in before)
    x = tf.constant(2.0)
    assert ensemble(x, mode="loop").numpy().tolist() == [float(n(x)) for n in nets]
    # Below the streaming size: every member's values fetched at once, the same members.
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1 << 40)
    del calls[:]
    again = objckpt.load_ensemble(template, prefixes)
    assert calls == [3, 3, 3]
    assert [int(m.step) for m in again.members] == [10, 11, 12]


def test_a_damaged_last_tf_checkpoint_gives_no_ensemble(tmp_path, monkeypatch):
    """A flipped byte in the last checkpoint's kernel, read as its member is created: the
    error names that member and the entry, no ensemble is returned and the template keeps
    its values."""
    from objckpt._bundle import fastio as _fastio

    prefixes = [objckpt.save(Counted(k), tmp_path / f"run{k}" / "ckpt") for k in range(2)]
    data = f"{prefixes[1]}.data-00000-of-00001"
    raw = bytearray(open(data, "rb").read())
    raw[raw.find(Counted(1).kernel.numpy().tobytes()) + 4096] ^= 0xFF
    with open(data, "wb") as f:
        f.write(raw)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    template = Counted(7)
    before = values(objckpt.tree(template))
    with pytest.raises(errors.CheckpointCorruptError,
                       match=r"member 1 .*damaged.*`kernel/\.ATTRIBUTES") as caught:
        objckpt.load_ensemble(template, prefixes)
    assert caught.value.source == str(prefixes[1])
    after = values(objckpt.tree(template))
    assert all(after[p].tobytes() == before[p].tobytes() for p in before)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_members_read_as_created_from_checkpoints_in_every_flavour(flavour, tmp_path,
                                                                   monkeypatch):
    """Above the streaming size, members of every flavour (Dense and BatchNormalization,
    moving statistics included) are created from values read one at a time from their
    checkpoints: bit-equal to the networks saved, outputs equal."""
    from objckpt._bundle import fastio as _fastio

    x = tf.random.stateless_normal((5, 16), seed=(3, 4))
    nets = [mlp(flavour, seed) for seed in range(3)]
    for k, net in enumerate(nets):
        call(net, x)
        for variable in objckpt.tree(net).values():
            if variable.dtype.is_floating:
                variable.assign(variable * (1.0 + 0.1 * k) + 0.5 * k)
    prefixes = [objckpt.save(n, tmp_path / f"run{k}" / "ckpt") for k, n in enumerate(nets)]
    template = mlp(flavour, 99)
    call(template, x)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    calls = _fetch_calls(monkeypatch)
    ensemble = objckpt.load_ensemble(template, prefixes)
    count = len(objckpt.tree(template))
    assert calls == [1] * (3 * count)
    for member, net in zip(ensemble.members, nets):
        got = dict(objckpt._compat.network_variable_paths(member))
        for path, want in objckpt._compat.network_variable_paths(net):
            assert got[path].numpy().tobytes() == want.numpy().tobytes(), path
    np.testing.assert_allclose(ensemble(x, mode="loop").numpy(),
                               np.stack([call(n, x).numpy() for n in nets]), rtol=1e-5,
                               atol=1e-5)
