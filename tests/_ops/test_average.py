"""objckpt.average and objckpt.average_checkpoints: the weighted mean of N sources, equal to a
float64 NumPy reference, matched like restore, all or nothing."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import index as _bundle
from objckpt._ops import average as _average

from flavours import CASES, build, case_id, keras_for, train_more

# bfloat16: this TF's NumPy type (ml_dtypes' from TF 2.13 on, TF's own on TF 2.12)
FLOATS = (np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64)


class Net(tf.Module):
    """Weights of every float dtype, an int64 step and a random generator's state."""

    def __init__(self, seed: int, names=("f32", "f16", "bf16", "f64")):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.f32 = tf.Variable(rng.normal(size=(5, 7)).astype(np.float32))
        self.f16 = tf.Variable(rng.normal(size=(3, 4)).astype(np.float16))
        self.bf16 = tf.Variable(tf.constant(rng.normal(size=(6,)), tf.bfloat16))
        self.f64 = tf.Variable(rng.normal(size=(2, 2)))
        self.step = tf.Variable(seed * 10 + 1, dtype=tf.int64)
        self.rng = tf.random.Generator.from_seed(seed)


class Renamed(tf.Module):
    """The same weights under other attribute names (`a` is `f32` renamed)."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.a = tf.Variable(rng.normal(size=(5, 7)).astype(np.float32))
        self.step = tf.Variable(seed, dtype=tf.int64)


def _values(obj) -> dict:
    return {path: np.array(value) for path, value in objckpt.snapshot(obj).items()}


def _reference(arrays, weights, dtype):
    """The float64 mean, rounded once into dtype: what every test compares with."""
    w = np.asarray(weights, np.float64)
    w = w / w.sum()
    total = sum(w[k] * np.asarray(a).astype(np.float64) for k, a in enumerate(arrays))
    return np.asarray(total).astype(dtype)


def _ulps(a, b) -> int:
    """Largest distance in units in the last place between two arrays of one float dtype."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ia, ib = a.view(bits).astype(np.int64), b.view(bits).astype(np.int64)
    # sign-magnitude to a monotonic integer line
    magnitude = np.int64((1 << (8 * a.dtype.itemsize - 1)) - 1)
    ia = np.where(ia < 0, -(ia & magnitude), ia)
    ib = np.where(ib < 0, -(ib & magnitude), ib)
    return int(np.max(np.abs(ia - ib))) if a.size else 0


@pytest.fixture(scope="module")
def net_prefixes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("average_nets")
    nets = [Net(seed) for seed in (1, 2, 3)]
    for net in nets:
        net.rng.normal((3,))  # the generator's state moves on
    prefixes = [tf.train.Checkpoint(root=net).write(str(directory / f"net{k}"))
                for k, net in enumerate(nets)]
    return prefixes, [_values(net) for net in nets]


@pytest.mark.parametrize("weights", [None, (0.2, 0.3, 0.5), (3, 0, 1), (1e-3, 1e3, 1.0)])
def test_every_float_dtype_equals_the_float64_reference(net_prefixes, weights):
    prefixes, sources = net_prefixes
    target = Net(9)
    report = objckpt.average(target, prefixes, weights=weights)
    got = _values(target)
    w = (1, 1, 1) if weights is None else weights
    assert set(report.averaged) == {"f32", "f16", "bf16", "f64"}
    for path in report.averaged:
        dtype = got[path].dtype
        assert dtype in [np.dtype(f) for f in FLOATS]
        ref = _reference([s[path] for s in sources], w, dtype)
        assert _ulps(got[path], ref) <= 1, path
    assert report.weights == pytest.approx(tuple(np.asarray(w) / np.sum(w)))
    assert str(report).startswith("averaged 4 variables over 3 sources (weights ")
    assert "taken from source 2 (2): step, rng/_state_var" in str(report)
    assert sum(report.weights) == pytest.approx(1.0)


def test_integers_counters_and_generator_state_come_from_the_last_source(net_prefixes):
    prefixes, sources = net_prefixes
    target = Net(9)
    report = objckpt.average(target, prefixes)
    got = _values(target)
    taken = set(report.taken)
    assert "step" in taken and any(p.startswith("rng") for p in taken)
    for path in taken:
        assert np.array_equal(got[path], sources[-1][path]), path
    assert report.taken_from == 2
    assert int(target.step.numpy()) == 31


def test_non_weights_first_and_keep(net_prefixes):
    prefixes, sources = net_prefixes
    target = Net(9)
    report = objckpt.average(target, prefixes, non_weights="first")
    assert report.taken_from == 0 and int(target.step.numpy()) == 11
    kept = Net(9)
    before = _values(kept)
    report = objckpt.average(kept, prefixes, non_weights="keep")
    assert report.taken == () and report.taken_from is None
    after = _values(kept)
    for path in ("step", *[p for p in after if p.startswith("rng")]):
        assert np.array_equal(after[path], before[path]), path
    assert any("non_weights='keep'" in s for s in report.skipped)


def test_bfloat16_and_float16_sources_into_their_own_dtype_through_float64(tmp_path):
    # Values whose float32 sum would round differently from the float64 one.
    values = [np.array([1.0, 2.0 ** -8, 3.0], np.float32), np.array([2.0 ** -9, 1.0, -3.0]),
              np.array([0.5, 0.25, 1e-3])]
    prefixes = []
    for dtype in (tf.bfloat16, tf.float16):
        for k, value in enumerate(values):
            module = tf.Module()
            module.v = tf.Variable(tf.constant(value, dtype))
            prefixes.append(tf.train.Checkpoint(root=module).write(
                str(tmp_path / f"{dtype.name}{k}")))
    for dtype, chosen in ((tf.bfloat16, prefixes[:3]), (tf.float16, prefixes[3:])):
        target = tf.Module()
        target.v = tf.Variable(tf.zeros((3,), dtype))
        objckpt.average(target, chosen, weights=[1, 2, 3])
        stored = [tf.train.load_checkpoint(p).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")
                  for p in chosen]
        ref = _reference(stored, [1, 2, 3], dtype.as_numpy_dtype)
        assert _ulps(np.array(target.v.numpy()), ref) <= 1


def test_mixed_source_kinds_prefix_snapshot_and_weights_h5(tmp_path):
    keras = keras_for("keras3")

    def model():
        net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"),
                                keras.layers.Dense(2, name="d2")])
        return net

    rng = np.random.default_rng(0)
    models = []
    for _ in range(3):
        net = model()
        net.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in net.get_weights()])
        models.append(net)
    prefix = objckpt.save(models[0], str(tmp_path / "a"))
    snap = objckpt.snapshot(models[1])
    h5 = str(tmp_path / "c.weights.h5")
    models[2].save_weights(h5)
    target = model()
    report = objckpt.average(target, [prefix, snap, h5], weights=[1, 1, 2])
    assert len(report.averaged) == 4
    for k, weight in enumerate(target.weights):
        ref = _reference([m.weights[k].numpy() for m in models], [1, 1, 2], np.float32)
        assert _ulps(weight.numpy(), ref) <= 1
    assert "weights.h5" in report.sources[2]


def test_renamed_layers_through_rules(tmp_path):
    # Checkpoints of a module whose weight was called `a`, averaged into one that calls it
    # `f32`: matched by the rule, not by position.
    olds = [Renamed(1), Renamed(2)]
    prefixes = [tf.train.Checkpoint(root=old).write(str(tmp_path / f"old{k}"))
                for k, old in enumerate(olds)]
    target = tf.Module()
    target.f32 = tf.Variable(tf.zeros((5, 7)))
    target.step = tf.Variable(0, dtype=tf.int64)
    report = objckpt.average(target, prefixes, rules=[("^a$", "f32")], weights=[1, 3])
    ref = _reference([old.a.numpy() for old in olds], [1, 3], np.float32)
    assert _ulps(target.f32.numpy(), ref) <= 1
    assert report.averaged == ("f32",) and report.taken == ("step",)
    assert int(target.step.numpy()) == 2
    with pytest.raises(errors.StructureMismatchError, match="Source 0 of 2"):
        objckpt.average(target, prefixes)  # without the rule: `a` matches nothing


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_real_models_in_every_flavour_equal_restore_then_numpy(case, tmp_path):
    flavour, kind = case
    model = build(flavour, kind)
    prefixes = []
    for k in range(3):
        train_more(model)
        prefixes.append(objckpt.save(model, str(tmp_path / f"ckpt-{k}")))
    target = build(flavour, kind, train=False)
    # The oracle: each source restored on its own, read back through NumPy.
    restored = []
    for prefix in prefixes:
        objckpt.restore(target, prefix)
        restored.append(_values(target))
    weights = [1.0, 2.0, 5.0]
    report = objckpt.average(target, prefixes, weights=weights)
    got = _values(target)
    assert report.averaged and report.taken
    for path in report.averaged:
        ref = _reference([r[path] for r in restored], weights, got[path].dtype)
        assert _ulps(got[path], ref) <= 1, path
    for path in report.taken:  # optimizer state and counters: the last source's
        assert np.array_equal(got[path], restored[-1][path]), path
    network = (target.model.variables if flavour == "module" else target.weights)
    network = [v for v in network if "float" in str(v.dtype)]
    assert len(report.averaged) == len({id(v) for v in network})
    assert any(_values_differ(restored, path) for path in report.averaged)
    if flavour != "module":
        assert any("BatchNorm" in note for note in report.notes)


def _values_differ(restored, path) -> bool:
    return not np.array_equal(restored[0][path], restored[-1][path])


# --- bad inputs change nothing ---------------------------------------------------------------

def test_mismatched_shapes_among_sources_name_the_source_and_path(net_prefixes, tmp_path):
    prefixes, _ = net_prefixes
    odd = Net(4)
    odd.f32 = tf.Variable(tf.zeros((5, 8)))
    bad = tf.train.Checkpoint(root=odd).write(str(tmp_path / "odd"))
    target = Net(9)
    before = _values(target)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.average(target, [prefixes[0], bad, prefixes[1]])
    message = str(info.value)
    assert "Source 1 of 3" in message and "odd" in message and "`f32`" in message
    assert "(5, 8)" in message and "(5, 7)" in message
    after = _values(target)
    assert all(np.array_equal(before[p], after[p]) for p in before)


@pytest.mark.parametrize("weights, words", [
    ([1, 2], "3 sources but 2 weights"),
    ([1, -1, 1], "weights[1]"),
    ([1, float("nan"), 1], "weights[1]"),
    ([1, 1, float("inf")], "weights[2]"),
    ([0, 0, 0], "sum to 0"),
    ([1, "x", 1], "weights[1]"),
    ([True, 1, 1], "weights[0]"),
    ("111", "list of 3 numbers"),
])
def test_bad_weights_are_refused_before_anything(net_prefixes, weights, words):
    prefixes, _ = net_prefixes
    target = Net(9)
    before = _values(target)
    with pytest.raises(errors.InvalidArgumentError, match=r"(?s)" + _escaped(words)):
        objckpt.average(target, prefixes, weights=weights)
    after = _values(target)
    assert all(np.array_equal(before[p], after[p]) for p in before)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"sources": "run/ckpt"}, errors.InvalidArgumentError, "must be a list"),
    ({"sources": []}, errors.InvalidArgumentError, "sources is empty"),
    ({"non_weights": "mean"}, errors.InvalidArgumentError, "non_weights must be one of"),
    ({"strict": "yes"}, errors.InvalidArgumentError, "strict must be True or False"),
    ({"optimizer_state": "some"}, errors.InvalidArgumentError, "optimizer_state must be"),
])
def test_bad_arguments(net_prefixes, kwargs, error, words):
    prefixes, _ = net_prefixes
    arguments = {"sources": prefixes, **kwargs}
    with pytest.raises(error, match=words):
        objckpt.average(Net(9), **arguments)


def test_a_weight_only_some_sources_have_is_an_error_with_strict_false(net_prefixes, tmp_path):
    prefixes, _ = net_prefixes
    partial = tf.Module()
    partial.f32 = tf.Variable(tf.ones((5, 7)))
    lacking = tf.train.Checkpoint(root=partial).write(str(tmp_path / "partial"))
    target = Net(9)
    before = _values(target)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.average(target, [prefixes[0], lacking], strict=False)
    message = str(info.value)
    assert "`f16`" in message and "fed by source(s) 0 but not by source(s) 1" in message
    assert "partial" in message
    after = _values(target)
    assert all(np.array_equal(before[p], after[p]) for p in before)


def test_streamed_path_checks_every_checksum_before_assigning(net_prefixes, tmp_path,
                                                              monkeypatch):
    prefixes, sources = net_prefixes
    monkeypatch.setattr(_average, "HELD_BYTES", 0)  # as for a large model: stream
    target = Net(9)
    report = objckpt.average(target, prefixes, weights=[1, 2, 3])
    got = _values(target)
    for path in report.averaged:  # read in pieces from the files, every dtype
        ref = _reference([s[path] for s in sources], [1, 2, 3], got[path].dtype)
        assert _ulps(got[path], ref) <= 1, path
    for path in report.taken:
        assert np.array_equal(got[path], sources[-1][path]), path
    monkeypatch.setattr(_average, "HELD_BYTES", 1 << 30)  # every value read whole, held
    held = Net(9)
    objckpt.average(held, prefixes, weights=[1, 2, 3])
    assert all(np.array_equal(v, got[p]) for p, v in _values(held).items())
    # A source whose last bytes changed: refused before the first variable is assigned.
    damaged = str(tmp_path / "damaged")
    for suffix in (".index", ".data-00000-of-00001"):
        with open(prefixes[2] + suffix, "rb") as f:
            data = bytearray(f.read())
        if suffix != ".index":  # one bit of the last weight written: `f64`
            entry = _bundle.read_index(prefixes[2]).entries["f64/.ATTRIBUTES/VARIABLE_VALUE"]
            data[entry.offset + 3] ^= 0x10
        with open(damaged + suffix, "wb") as f:
            f.write(data)
    for held in (0, 1 << 30):  # checked first, then streamed; all read, then assigned
        monkeypatch.setattr(_average, "HELD_BYTES", held)
        fresh = Net(9)
        before = _values(fresh)
        with pytest.raises(errors.CheckpointCorruptError) as info:
            objckpt.average(fresh, [prefixes[0], prefixes[1], damaged])
        message = str(info.value)
        assert "Source 2 of 3" in message and "damaged" in message
        after = _values(fresh)
        assert all(np.array_equal(before[p], after[p]) for p in before)
    monkeypatch.setattr(_average, "HELD_BYTES", 0)
    with pytest.raises(errors.CheckpointCorruptError, match="f64.*checksum"):
        objckpt.average(Net(9), [prefixes[0], prefixes[1], damaged])


# --- the writer: no model --------------------------------------------------------------------

def test_writer_output_read_by_plain_tf_checkpoint_equals_the_reference(net_prefixes, tmp_path):
    prefixes, sources = net_prefixes
    out = str(tmp_path / "avg" / "ckpt")
    done = objckpt.average_checkpoints(prefixes, out, weights=[0.5, 0.25, 0.25])
    assert done["prefix"] == out and set(done["averaged"]) == {"f32", "f16", "bf16", "f64"}
    assert ([(n, tuple(shape)) for n, shape in tf.train.list_variables(out)]
            == [(n, tuple(shape)) for n, shape in tf.train.list_variables(prefixes[0])])
    fresh = Net(9)
    tf.train.Checkpoint(root=fresh).read(out).assert_consumed()
    got = _values(fresh)
    for path in done["averaged"]:
        ref = _reference([s[path] for s in sources], [0.5, 0.25, 0.25], got[path].dtype)
        assert _ulps(got[path], ref) <= 1, path
    for path in done["taken"]:
        assert np.array_equal(got[path], sources[-1][path]), path
    # the live average into the same structure gives the same bits
    live = Net(9)
    objckpt.average(live, prefixes, weights=[0.5, 0.25, 0.25])
    assert all(np.array_equal(v, got[p]) for p, v in _values(live).items())
    assert objckpt.verify(out).ok


def test_writer_keras_model_round_trip(tmp_path):
    keras_for("keras3")
    model = build("keras3")
    prefixes = []
    for k in range(2):
        train_more(model)
        prefixes.append(objckpt.save(model, str(tmp_path / f"ckpt-{k}")))
    out = objckpt.average_checkpoints(prefixes, str(tmp_path / "avg"))["prefix"]
    written, live = build("keras3", train=False), build("keras3", train=False)
    objckpt.restore(written, out)
    objckpt.average(live, prefixes)
    assert all(np.array_equal(v, _values(written)[p]) for p, v in _values(live).items())


def test_writer_refuses_mismatched_sources_and_writes_nothing(net_prefixes, tmp_path):
    prefixes, _ = net_prefixes
    odd = Net(4)
    odd.f16 = tf.Variable(tf.zeros((3, 5), tf.float16))
    bad = tf.train.Checkpoint(root=odd).write(str(tmp_path / "odd"))
    out = str(tmp_path / "out")
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.average_checkpoints([prefixes[0], bad], out)
    message = str(info.value)
    assert "source 1" in message and "`f16`" in message and "(3, 5)" in message
    assert not [name for name in os.listdir(tmp_path) if name.startswith("out")]


def test_writer_refuses_other_formats(tmp_path):
    keras = keras_for("keras3")
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    h5 = str(tmp_path / "w.weights.h5")
    net.save_weights(h5)
    with pytest.raises(errors.UnsupportedFormatError, match="objckpt.average"):
        objckpt.average_checkpoints([h5, h5], str(tmp_path / "out"))


def test_writer_without_google_crc32c_checks_with_its_own(net_prefixes, tmp_path, monkeypatch):
    import sys

    prefixes, _ = net_prefixes
    with_c = objckpt.average_checkpoints(prefixes, str(tmp_path / "c"))["prefix"]
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # not installed
    plain = objckpt.average_checkpoints(prefixes, str(tmp_path / "plain"))["prefix"]
    for suffix in (".index", ".data-00000-of-00001"):
        with open(with_c + suffix, "rb") as a, open(plain + suffix, "rb") as b:
            assert a.read() == b.read()


def test_directories_as_sources_use_their_newest_checkpoint(tmp_path):
    nets = [Net(seed) for seed in (1, 2)]
    directories = []
    for k, net in enumerate(nets):
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=net),
                                             str(tmp_path / f"run{k}"), max_to_keep=2)
        manager.save()
        net.f32.assign(net.f32 + 1.0)  # the newest checkpoint holds these values
        manager.save()
        directories.append(str(tmp_path / f"run{k}"))
    target = Net(9)
    objckpt.average(target, directories)
    ref = _reference([n.f32.numpy() for n in nets], [1, 1], np.float32)
    assert _ulps(target.f32.numpy(), ref) <= 1
    done = objckpt.average_checkpoints(directories, str(tmp_path / "avg"))
    assert all(s.endswith("ckpt-2") for s in done["sources"])
    written = tf.train.load_checkpoint(done["prefix"]).get_tensor(
        "f32/.ATTRIBUTES/VARIABLE_VALUE")
    assert np.array_equal(written, target.f32.numpy())


def test_optimizer_state_false_leaves_the_optimizer_alone(tmp_path):
    keras_for("keras3")
    model = build("keras3")
    prefixes = []
    for k in range(2):
        train_more(model)
        prefixes.append(objckpt.save(model, str(tmp_path / f"ckpt-{k}")))
    target = build("keras3")
    before = {id(v): np.array(v) for v in target.optimizer.variables}
    report = objckpt.average(target, prefixes, optimizer_state=False)
    assert not any(p.startswith("optimizer/_variables") or p == "optimizer/_iterations"
                   for p in report.taken)
    assert all(np.array_equal(np.array(v), before[id(v)]) for v in target.optimizer.variables)
    assert len(report.averaged) == len(target.weights)


def test_writer_averages_sources_of_other_float_dtypes_into_the_firsts(tmp_path):
    values = np.array([1.0, 2.0 ** -9, -3.25], np.float32)
    prefixes = []
    for k, dtype in enumerate((tf.float32, tf.bfloat16, tf.float16)):
        module = tf.Module()
        module.v = tf.Variable(tf.constant(values * (k + 1), dtype))
        prefixes.append(tf.train.Checkpoint(root=module).write(str(tmp_path / f"s{k}")))
    done = objckpt.average_checkpoints(prefixes, str(tmp_path / "avg"), weights=[1, 1, 2])
    stored = [tf.train.load_checkpoint(p).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")
              for p in prefixes]
    got = tf.train.load_checkpoint(done["prefix"]).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")
    assert got.dtype == np.float32
    assert _ulps(got, _reference(stored, [1, 1, 2], np.float32)) <= 1


# --- dtypes through the casting policy, BatchNorm statistics --------------------------------

# Values whose bfloat16 / float16 roundings differ from their float32 ones, in a 17 MiB
# tensor for the streamed route (above HELD_BYTES) and a small one for the held route.
def _f32_module(value):
    module = tf.Module()
    module.v = tf.Variable(value)
    return module


@pytest.mark.parametrize("held", [1 << 30, 0], ids=["held", "streamed"])
@pytest.mark.parametrize("narrow", [tf.bfloat16, tf.float16], ids=["bfloat16", "float16"])
def test_narrow_sources_widen_exactly_into_a_float32_obj(tmp_path, monkeypatch, held, narrow):
    import safetensors.tensorflow

    monkeypatch.setattr(_average, "HELD_BYTES", held)
    rng = np.random.default_rng(7)
    shape = (4, 33) if held else (1 << 20, 5)  # 20 MiB of float32 when streamed
    raw = [rng.normal(size=shape) * 3 for _ in range(4)]
    narrow_prefix = tf.train.Checkpoint(root=_f32_module(tf.constant(raw[0], narrow))).write(
        str(tmp_path / "narrow"))
    wide_prefix = tf.train.Checkpoint(root=_f32_module(raw[1].astype(np.float32))).write(
        str(tmp_path / "wide"))
    st_path = str(tmp_path / "model.safetensors")
    safetensors.tensorflow.save_file({"v": tf.constant(raw[2], narrow)}, st_path)
    snap = objckpt.snapshot(_f32_module(raw[3].astype(np.float32)))
    # what each source stores, exactly (narrow ones in their own dtype)
    stored = [tf.train.load_checkpoint(narrow_prefix).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE"),
              raw[1].astype(np.float32), tf.constant(raw[2], narrow).numpy(),
              raw[3].astype(np.float32)]
    assert stored[0].dtype == narrow.as_numpy_dtype and stored[2].dtype == stored[0].dtype
    weights = [1, 2, 3, 4]
    target = _f32_module(np.zeros(shape, np.float32))
    report = objckpt.average(target, [narrow_prefix, wide_prefix, st_path, snap],
                             weights=weights)
    assert report.averaged == ("v",)
    ref = _reference(stored, weights, np.float32)
    got = target.v.numpy()
    assert got.dtype == np.float32 and _ulps(got, ref) <= 1
    # the narrow sources alone (both files): their float64 mean of the stored values
    only = _f32_module(np.zeros(shape, np.float32))
    objckpt.average(only, [narrow_prefix, st_path], weights=[1, 3])
    assert _ulps(only.v.numpy(), _reference([stored[0], stored[2]], [1, 3], np.float32)) <= 1
    # a narrow checkpoint read as float32 bytes would be garbage: compare with restore
    restored = _f32_module(np.zeros(shape, np.float32))
    objckpt.restore(restored, narrow_prefix)
    single = _f32_module(np.zeros(shape, np.float32))
    objckpt.average(single, [narrow_prefix])
    assert np.array_equal(single.v.numpy(), restored.v.numpy())
    assert np.array_equal(single.v.numpy(), stored[0].astype(np.float32))


@pytest.mark.parametrize("held", [1 << 30, 0], ids=["held", "streamed"])
def test_a_narrowing_cast_is_refused_unless_lossy(tmp_path, monkeypatch, held):
    monkeypatch.setattr(_average, "HELD_BYTES", held)
    rng = np.random.default_rng(3)
    values = [rng.normal(size=(6, 5)) for _ in range(2)]
    wide = tf.train.Checkpoint(root=_f32_module(values[0])).write(str(tmp_path / "f64"))
    narrow = tf.train.Checkpoint(root=_f32_module(values[1].astype(np.float32))).write(
        str(tmp_path / "f32"))
    target = _f32_module(np.full((6, 5), 5.0, np.float32))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.average(target, [wide, narrow])
    assert "cast='lossy'" in str(info.value) and "Source 0 of 2" in str(info.value)
    assert np.array_equal(target.v.numpy(), np.full((6, 5), 5.0, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="cast must be"):
        objckpt.average(target, [wide, narrow], cast="widen")
    objckpt.average(target, [wide, narrow], cast="lossy")
    ref = _reference([values[0], values[1].astype(np.float32)], [1, 1], np.float32)
    assert _ulps(target.v.numpy(), ref) <= 1


def _bn_model(keras, seed):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense"),
                              keras.layers.BatchNormalization(name="bn1")])
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(0.5, 2, size=w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def test_averaged_batchnorm_statistics_warn_naming_layers_and_fix():
    import warnings

    keras = keras_for("keras3")
    members = [objckpt.snapshot(_bn_model(keras, seed)) for seed in (1, 2)]
    target = _bn_model(keras, 9)
    with pytest.warns(errors.BatchNormStatisticsWarning) as seen:
        report = objckpt.average(target, members)
    found = [w for w in seen if w.category is errors.BatchNormStatisticsWarning]
    assert len(found) == 1
    message = str(found[0].message)
    assert "objckpt.average" in message and "bn1" in message and "1 layer(s)" in message
    assert "objckpt.recalibrate_batchnorm(model, data)" in message
    assert found[0].filename == __file__  # points at the caller
    assert any("BatchNorm" in note for note in report.notes)
    # no BatchNorm: no warning
    plain = [objckpt.snapshot(keras.Sequential([keras.Input((4,)),
                                                keras.layers.Dense(3, name="dense")]))
             for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchNormStatisticsWarning)
        report = objckpt.average(keras.Sequential([keras.Input((4,)),
                                                   keras.layers.Dense(3, name="dense")]), plain)
    assert not any("BatchNorm" in note for note in report.notes)
