"""The one casting policy (`_compat.fit`): lossless widening casts by default, lossy ones only
with `cast="lossy"`, the same through every door (restore, plan, restore_on_create,
load_ensemble, migrate) and from every source (TF checkpoint, Snapshot, safetensors, Keras
weights files); values equal NumPy's cast; a refused cast changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from flavours import keras_for

# (source dtype, variable dtype): every value of the first held exactly by the second.
WIDENING = [
    ("bfloat16", "float32"), ("bfloat16", "float64"), ("float16", "float32"),
    ("float16", "float64"), ("float32", "float64"), ("int8", "int16"), ("int8", "int32"),
    ("int8", "int64"), ("int16", "int32"), ("int16", "int64"), ("int32", "int64"),
    ("uint8", "int16"), ("uint8", "int32"), ("uint8", "int64"), ("uint16", "int32"),
    ("uint16", "int64"), ("uint32", "int64"),
]
# (source dtype, variable dtype): a cast that can change a value.
NARROWING = [
    ("float32", "bfloat16"), ("float32", "float16"), ("float64", "float32"),
    ("float16", "bfloat16"), ("bfloat16", "float16"), ("float32", "int32"),
    ("int64", "int32"), ("int32", "int8"), ("int8", "uint8"), ("int32", "float32"),
]


def _np(dtype: str):
    """This TF's NumPy type of `dtype` (bfloat16: ml_dtypes' from TF 2.13 on, TF's own on
    TF 2.12)."""
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


def _values(dtype: str, seed: int, n: int = 5) -> np.ndarray:
    """Values of `dtype` (integers within its range, floats of several magnitudes)."""
    rng = np.random.default_rng(seed)
    if tf.as_dtype(dtype).is_integer:
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=n).astype(dtype)
    return (rng.normal(size=n) * [1e-3, 1.0, 3.0, 100.0, 1e3][:n]).astype(_np(dtype))


class _Net(tf.Module):
    """One variable per pair, `v0`, `v1`, ..., of the given dtypes."""

    def __init__(self, dtypes, values=None):
        super().__init__()
        for i, dtype in enumerate(dtypes):
            value = np.zeros(5, _np(dtype)) if values is None else values[i]
            setattr(self, f"v{i}", tf.Variable(tf.constant(value, dtype=dtype)))


def _pairs(pairs, seed=0):
    wide = [b for _, b in pairs]
    values = [_values(a, seed + i) for i, (a, _) in enumerate(pairs)]
    source = _Net([a for a, _ in pairs], values)
    expected = [v.astype(_np(b)) for v, b in zip(values, wide)]  # NumPy's cast
    return source, wide, expected


def _equal(obj, expected, dtypes):
    for i, (want, dtype) in enumerate(zip(expected, dtypes)):
        got = getattr(obj, f"v{i}")
        assert got.dtype.name == dtype
        np.testing.assert_array_equal(got.numpy(), want)
        assert got.numpy().tobytes() == np.asarray(want).tobytes()


# --- the rule itself ---------------------------------------------------------------------


@pytest.mark.parametrize("pair", WIDENING + [("float8_e4m3fn", "float16"),
                                             ("float8_e5m2", "bfloat16"),
                                             ("float8_e4m3fn", "float32")])
def test_widening_fits_by_default_and_names_its_cast(pair):
    value, variable = ((3, 2), pair[0]), ((3, 2), pair[1])
    assert _compat.misfit(value, variable) == ""
    assert _compat.cast_of(value, variable) == f"{pair[0]} -> {pair[1]}"
    assert _compat.misfit(variable, value) == "dtype"  # and back it narrows


@pytest.mark.parametrize("pair", NARROWING)
def test_lossy_casts_fit_only_when_asked(pair):
    value, variable = ((4,), pair[0]), ((4,), pair[1])
    assert _compat.misfit(value, variable) == "dtype"
    assert _compat.misfit(value, variable, "lossy") == ""


def test_shapes_bools_and_strings_are_never_cast():
    assert _compat.misfit(((3,), "bfloat16"), ((4,), "float32"), "lossy") == "shape"
    assert _compat.misfit(((3,), "bool"), ((3,), "int32"), "lossy") == "dtype"
    assert _compat.misfit(((3,), "float32"), ((3,), "bool"), "lossy") == "dtype"
    assert _compat.misfit(((3,), "string"), ((3,), "float32"), "lossy") == "dtype"
    assert _compat.cast_of(((3,), "float32"), ((3,), "float32")) == ""


def test_a_cast_that_is_not_one_of_the_two_is_refused_by_every_door(tmp_path):
    source, wide, _ = _pairs(WIDENING[:1])
    for door in (lambda: objckpt.restore(_Net(wide), objckpt.snapshot(source), cast="all"),
                 lambda: objckpt.plan(_Net(wide), objckpt.snapshot(source), cast=True)):
        with pytest.raises(errors.InvalidArgumentError, match="cast='lossless' or cast='lossy'"):
            door()


# --- every source, every door ---------------------------------------------------------


def _sources(source, tmp_path):
    """The pairs' source values as a TF checkpoint, a Snapshot and a safetensors file."""
    return {"checkpoint": objckpt.save(source, str(tmp_path / "ckpt")),
            "snapshot": objckpt.snapshot(source),
            "safetensors": str(objckpt.export(source, str(tmp_path / "st")))}


@pytest.mark.parametrize("kind", ["checkpoint", "snapshot", "safetensors"])
def test_every_widening_pair_is_restored_exactly_and_listed(kind, tmp_path):
    source, wide, expected = _pairs(WIDENING)
    src = _sources(source, tmp_path)[kind]
    planned = objckpt.plan(_Net(wide), src)
    casts = {f"v{i}": f"{a} -> {b}" for i, (a, b) in enumerate(WIDENING)}
    assert planned.complete and planned.casts == casts
    described = planned.describe()
    assert f"dtype casts ({len(WIDENING)}):" in described
    assert all(f"{path}: {made}" in described for path, made in casts.items())
    obj = _Net(wide)
    report = objckpt.restore(obj, src)
    assert report.cast == casts
    _equal(obj, expected, wide)
    assert "cast: 1 bfloat16 -> float32" in str(report)


def test_restore_on_create_load_ensemble_and_migrate_widen_as_restore(tmp_path):
    source, wide, expected = _pairs(WIDENING)
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    obj = _Net(wide)
    pending = objckpt.restore_on_create(obj, prefix)
    pending.assert_done()
    assert pending.cast == {f"v{i}": f"{a} -> {b}" for i, (a, b) in enumerate(WIDENING)}
    _equal(obj, expected, wide)
    ensemble = objckpt.load_ensemble(_Net(wide), [prefix, objckpt.snapshot(source)])
    for member in ensemble.members:
        _equal(member, expected, wide)
    written = objckpt.migrate(_Net(wide), prefix, str(tmp_path / "migrated"))
    back = _Net(wide)
    tf.train.Checkpoint(root=back).read(written).assert_existing_objects_matched()
    _equal(back, expected, wide)


def test_widening_from_a_large_checkpoint_takes_the_fetched_route(tmp_path, monkeypatch):
    from objckpt._bundle import fastio as _fastio

    monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)  # streamed whenever it can be
    source, wide, expected = _pairs(WIDENING)
    obj = _Net(wide)
    objckpt.restore(obj, objckpt.save(source, str(tmp_path / "ckpt")))
    _equal(obj, expected, wide)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_a_keras_weights_file_in_half_precision_widens_into_float32(flavour, tmp_path):
    keras = keras_for(flavour, beside_tf_keras=True)

    def model(dtype):
        built = keras.Sequential([keras.layers.Dense(3, dtype=dtype, name="d")])
        built.build((None, 4))
        return built

    half = model("float16")
    rng = np.random.default_rng(0)
    half.set_weights([rng.normal(size=w.shape).astype("float16") for w in half.get_weights()])
    path = str(tmp_path / ("w.weights.h5" if flavour == "keras3" else "w.h5"))
    half.save_weights(path)
    full = model("float32")
    report = objckpt.restore(full, path)
    assert sorted(report.cast.values()) == ["float16 -> float32"] * 2
    for got, want in zip(full.get_weights(), half.get_weights()):
        np.testing.assert_array_equal(got, want.astype("float32"))


# --- narrowing: refused unless asked ----------------------------------------------------


def _refused(door, obj):
    before = [v.numpy().tobytes() for v in obj.variables]
    with pytest.raises(errors.StructureMismatchError) as caught:
        door()
    assert [v.numpy().tobytes() for v in obj.variables] == before  # nothing changed
    return str(caught.value)


@pytest.mark.parametrize("kind", ["checkpoint", "snapshot", "safetensors"])
def test_narrowing_is_refused_with_the_argument_named_and_done_when_asked(kind, tmp_path):
    pairs = [p for p in NARROWING if p[0] != "int64" or kind != "safetensors"]
    source, narrow, _ = _pairs(pairs)
    values = [getattr(source, f"v{i}").numpy() for i in range(len(pairs))]
    src = _sources(source, tmp_path)[kind]
    obj = _Net(narrow)
    message = _refused(lambda: objckpt.restore(obj, src), obj)
    assert "Fix: pass cast='lossy'" in message
    for i, (a, b) in enumerate(pairs):
        assert f"`v{i}`: dtype {a} in the source but {b} in the obj" in message
    planned = objckpt.plan(_Net(narrow), src)
    assert len(planned.mismatched) == len(pairs) and not planned.matches
    planned = objckpt.plan(_Net(narrow), src, cast="lossy")
    assert planned.complete and len(planned.casts) == len(pairs)
    report = objckpt.restore(obj, src, cast="lossy")
    assert report.cast == {f"v{i}": f"{a} -> {b}" for i, (a, b) in enumerate(pairs)}
    # values as NumPy casts them (round to nearest even; floats to ints toward zero)
    _equal(obj, [v.astype(_np(b)) for v, (_, b) in zip(values, pairs)], narrow)


def test_every_other_door_refuses_narrowing_and_casts_when_asked(tmp_path):
    pairs = [("float32", "bfloat16"), ("int64", "int8")]
    source, narrow, _ = _pairs(pairs)
    values = [getattr(source, f"v{i}").numpy() for i in range(len(pairs))]
    expected = [v.astype(_np(b)) for v, (_, b) in zip(values, pairs)]
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    obj = _Net(narrow)
    assert "cast='lossy'" in _refused(lambda: objckpt.restore_on_create(obj, prefix), obj)
    template = _Net(narrow)
    assert "cast='lossy'" in _refused(lambda: objckpt.load_ensemble(template, [prefix]),
                                      template)
    assert "cast='lossy'" in _refused(
        lambda: objckpt.migrate(_Net(narrow), prefix, str(tmp_path / "out")), _Net(narrow))
    assert not list(tmp_path.glob("out*"))  # nothing written
    objckpt.restore_on_create(obj, prefix, cast="lossy").assert_done()
    _equal(obj, expected, narrow)
    members = objckpt.load_ensemble(template, [prefix], cast="lossy").members
    _equal(members[0], expected, narrow)
    written = objckpt.migrate(_Net(narrow), prefix, str(tmp_path / "out"), cast="lossy")
    back = _Net(narrow)
    tf.train.Checkpoint(root=back).read(written).assert_existing_objects_matched()
    _equal(back, expected, narrow)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_values_landing_as_layers_build_are_widened_and_narrowing_waits_refused(flavour,
                                                                              tmp_path):
    keras = keras_for(flavour)

    def model(dtype):
        return keras.Sequential([keras.layers.Dense(3, dtype=dtype, name="d")])

    half = model("float16")
    half.build((None, 4))
    rng = np.random.default_rng(1)
    half.set_weights([rng.normal(size=w.shape).astype("float16") for w in half.get_weights()])
    prefix = objckpt.save(half, str(tmp_path / "half"))
    full = model("float32")  # not built: values land as its layers build
    pending = objckpt.restore_on_create(full, prefix)
    full(np.ones((1, 4), "float32"))
    pending.assert_done()
    assert sorted(pending.cast.values()) == ["float16 -> float32"] * 2
    for got, want in zip(full.get_weights(), half.get_weights()):
        np.testing.assert_array_equal(got, want.astype("float32"))
    wide = objckpt.save(full, str(tmp_path / "full"))
    narrow = model("float16")
    pending = objckpt.restore_on_create(narrow, wide)
    with pytest.raises(errors.StructureMismatchError, match="cast='lossy'"):
        narrow(np.ones((1, 4), "float16"))  # refused as the layer builds, or
        pending.assert_done()  # listed as not landed
    assert pending.applied == ()
    narrow = model("float16")
    pending = objckpt.restore_on_create(narrow, wide, cast="lossy")
    narrow(np.ones((1, 4), "float16"))
    pending.assert_done()
    for got, want in zip(narrow.get_weights(), full.get_weights()):
        assert got.tobytes() == want.astype("float16").tobytes()
