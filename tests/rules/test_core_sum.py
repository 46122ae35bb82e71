"""Entries added into one variable as rules: `Sum`, and the `Crop`/`Pad` pair beside it.

Several rules of one target, each ending with a `Sum(parts, index)`, make one variable of
their entries added (term 0 gives the shape, another term may be one row added to every
row: `broadcast=(0,)`). The case that needs it: RoBERTa's position rows (less its two
reserved rows, `Crop(axis=0, before=2)`) plus its one token-type row, which keras-hub's
backbone has no layer for. The oracle is NumPy (slicing, `+` with broadcasting, `np.pad`)
and the `safetensors` library's own writer.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Crop, Pad, Rule, RuleSet, Stack, Sum, Transpose

import flavours
from flavours import keras_for

safetensors_numpy = pytest.importorskip("safetensors.numpy")

POSITIONS, HID, RESERVED = 6, 4, 2

FOLD = RuleSet([
    Rule("emb.position.weight", "position", Chain(Crop(axis=0, before=RESERVED), Sum(2, 0))),
    Rule("emb.token_type.weight", "position", Sum(2, 1, broadcast=(0,))),
    Rule("emb.word.weight", "word"),
])


def _arrays(seed: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"emb.position.weight": (POSITIONS + RESERVED, HID),
              "emb.token_type.weight": (1, HID), "emb.word.weight": (3, HID)}
    return {k: rng.standard_normal(shape).astype(dtype) for k, shape in shapes.items()}


def _folded(arrays: dict) -> np.ndarray:
    return arrays["emb.position.weight"][RESERVED:] + arrays["emb.token_type.weight"]


def _obj(flavour: str):
    """An obj with `position` (POSITIONS, HID) and `word` (3, HID)."""
    if flavour == "module":
        net = tf.Module()
        net.position = tf.Variable(tf.zeros((POSITIONS, HID)), name="position")
        net.word = tf.Variable(tf.zeros((3, HID)), name="word")
        return net
    keras = keras_for(flavour)

    class Emb(keras.layers.Layer):
        def build(self, shape):
            self.position = self.add_weight(name="position", shape=(POSITIONS, HID),
                                            initializer="zeros")
            self.word = self.add_weight(name="word", shape=(3, HID), initializer="zeros")

        def call(self, x):
            return x

    layer = Emb(name="emb")
    layer.build((None, HID))
    return layer


def _values(obj) -> dict:
    return {path: v.numpy() for path, v in objckpt.tree(obj).items()}


def _write(arrays: dict, path) -> str:
    safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    return str(path)


def _read(path) -> dict:
    return safetensors_numpy.load_file(str(path))


# --- the transforms ---------------------------------------------------------------------------

def test_crop_and_pad_are_numpy_slicing_and_zero_padding():
    value = np.arange(24, dtype=np.float32).reshape(6, 4)
    crop = Crop(axis=0, before=2, after=1)
    assert crop(value).tobytes() == value[2:5].tobytes()
    assert crop.output_shape((6, 4)) == (3, 4)
    assert np.asarray(crop(tf.constant(value))).tobytes() == value[2:5].tobytes()
    assert crop.inverse() == Pad(0, 2, 1) and Pad(0, 2, 1).inverse() == crop
    padded = crop.inverse()(value[2:5])
    assert padded.tobytes() == np.pad(value[2:5], [(2, 1), (0, 0)]).tobytes()
    assert np.asarray(Pad(-1, 1)(tf.constant(value))).shape == (6, 5)
    assert Pad(-1, 1).output_shape((6, 4)) == (6, 5)


@pytest.mark.parametrize("args, said", [
    ((0.5, 2), "needs an int axis and ints before >= 0"),
    ((0, -1), "needs an int axis and ints before >= 0"),
])
def test_crop_refuses_bad_arguments(args, said):
    with pytest.raises(errors.InvalidArgumentError, match=said):
        Crop(*args)


def test_crop_refuses_a_value_too_short_or_without_the_axis():
    with pytest.raises(errors.InvalidArgumentError, match=r"drops 3 slices along axis 0, but "
                                                          r"the value of shape \(2, 4\) has 2"):
        Crop(0, 2, 1).output_shape((2, 4))
    with pytest.raises(errors.InvalidArgumentError, match=r"works along axis 2, but received a "
                                                          r"value of shape \(2, 4\)"):
        Crop(2, 1)(np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("args, said", [
    ((1, 0), "parts must be an int >= 2"),
    ((2, 2), r"index must be an int in 0..1"),
    ((2, 1, (0, 0)), "broadcast must be a tuple of distinct int axes"),
    ((2, 0, (0,)), "term 0 has the variable's shape"),
])
def test_sum_refuses_bad_arguments(args, said):
    with pytest.raises(errors.InvalidArgumentError, match=said):
        Sum(*args)


def test_a_sum_term_runs_on_no_value_and_has_no_inverse_export_writes_zeros():
    with pytest.raises(errors.InvalidArgumentError, match="does not run on one value"):
        Sum(2, 1)(np.zeros(3))
    with pytest.raises(errors.InvalidArgumentError, match="no unique inverse"):
        Sum(2, 0).inverse()
    assert Sum(2, 0).export_part() is None
    zeros = Sum(2, 1, broadcast=(0,)).export_part()
    assert zeros.output_shape((6, 4)) == (1, 4)
    made = zeros(tf.ones((6, 4), tf.bfloat16))
    assert made.dtype == tf.bfloat16 and made.shape == (1, 4) and not np.any(made.numpy())
    assert Sum(3, 2, broadcast=(-1,)).term_shape((6, 4)) == (6, 1)


def test_a_stack_as_a_sum_term_is_refused():
    with pytest.raises(errors.InvalidArgumentError, match="a Sum's term is one entry"):
        Rule("w.{e}", "w", Chain(Stack("e", 2), Sum(2, 0)))


def test_export_names_gives_every_term_term_0_the_value():
    names = FOLD.export_names("position")[0]
    assert [n for n, _ in names] == ["emb.position.weight", "emb.token_type.weight"]
    (_, first), (_, second) = names
    value = np.arange(24, dtype=np.float32).reshape(POSITIONS, HID)
    assert first(value).tobytes() == np.pad(value, [(RESERVED, 0), (0, 0)]).tobytes()
    assert second(value).tobytes() == np.zeros((1, HID), np.float32).tobytes()


# --- restore and export, every flavour --------------------------------------------------------

@pytest.mark.parametrize("flavour", flavours.FLAVOURS)
def test_two_entries_restore_added_into_one_variable_and_export_back(flavour, tmp_path):
    obj, arrays = _obj(flavour), _arrays()
    source = _write(arrays, tmp_path / "emb.safetensors")
    the_plan = objckpt.plan(obj, source, rules=FOLD)
    assert the_plan.complete, the_plan.describe()
    by_target = {m.target.split("/")[-1]: m for m in the_plan.matches}
    assert by_target["position"].source == "emb.position.weight + emb.token_type.weight"
    report = objckpt.restore(obj, source, rules=FOLD)
    assert not report.unexpected and not report.missing
    got = {k.split("/")[-1]: v for k, v in _values(obj).items()}
    assert got["position"].tobytes() == _folded(arrays).tobytes()
    assert got["word"].tobytes() == arrays["emb.word.weight"].tobytes()
    out = objckpt.export(obj, tmp_path / "out" / "model.safetensors", rules=FOLD)
    written = _read(out)
    assert sorted(written) == sorted(arrays)
    want_position = np.pad(_folded(arrays), [(RESERVED, 0), (0, 0)])
    assert written["emb.position.weight"].tobytes() == want_position.tobytes()
    assert written["emb.token_type.weight"].tobytes() == np.zeros((1, HID), np.float32).tobytes()
    # the export, restored, gives the variable back bit for bit (x + 0 == x)
    again = _obj(flavour)
    objckpt.restore(again, out, rules=FOLD)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(_values(again).values(),
                                                          _values(obj).values()))


def _refused(obj, source, said: str, rules=FOLD):
    before = _values(obj)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(obj, source, rules=rules)
    assert said in str(info.value), str(info.value)
    after = _values(obj)
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)  # nothing changed
    return str(info.value)


def test_a_term_of_the_wrong_shape_is_refused_by_name_from_metadata(tmp_path, monkeypatch):
    from objckpt._planning import stacking as _stacking

    obj = _obj("module")
    obj.word.assign(tf.ones((3, HID)))
    arrays = _arrays()
    arrays["emb.token_type.weight"] = np.zeros((2, HID), np.float32)
    source = _write(arrays, tmp_path / "two_rows.safetensors")
    reads = []
    monkeypatch.setattr(_stacking, "_assembled", lambda *a: reads.append(a))
    said = _refused(obj, source, "term 1 `emb.token_type.weight` has shape (2, 4)")
    assert "but term 0 has (6, 4), so the term must have (1, 4)" in said
    assert "`position`" in said and not reads  # checked before a byte was read


def test_a_missing_term_is_refused_naming_the_rule_that_reads_it(tmp_path):
    obj = _obj("module")
    arrays = _arrays()
    del arrays["emb.token_type.weight"]
    with pytest.warns(UserWarning, match="matched no key"):
        _refused(obj, _write(arrays, tmp_path / "no_type.safetensors"),
                 "no entry gives part 1 of 2 (the source lacks what rule 1")


def test_terms_of_two_dtypes_and_a_term_0_of_the_wrong_shape_are_refused(tmp_path):
    obj = _obj("module")
    arrays = _arrays()
    arrays["emb.token_type.weight"] = arrays["emb.token_type.weight"].astype(np.float64)
    _refused(obj, _write(arrays, tmp_path / "dtypes.safetensors"),
             "are not float32, as those of rule 0")
    arrays = _arrays()
    arrays["emb.position.weight"] = np.zeros((POSITIONS + RESERVED + 1, HID), np.float32)
    arrays["emb.token_type.weight"] = np.zeros((1, HID), np.float32)
    with pytest.raises(errors.StructureMismatchError, match=r"shape \(7, 4\) in the source but "
                                                            r"\(6, 4\) in the obj"):
        objckpt.restore(obj, _write(arrays, tmp_path / "long.safetensors"), rules=FOLD)


def test_rules_of_a_sum_with_different_parts_are_refused(tmp_path):
    rules = RuleSet([FOLD[0], Rule("emb.token_type.weight", "position",
                                   Sum(3, 1, broadcast=(0,))), FOLD[2]])
    _refused(_obj("module"), _write(_arrays(), tmp_path / "emb.safetensors"),
             "each Sum the same parts", rules=rules)


def test_three_terms_with_a_transform_before_the_sum(tmp_path):
    """Term 1 transposed, term 2 a column added to every column; summed in index order."""
    obj = tf.Module()
    obj.w = tf.Variable(tf.zeros((3, 2)))
    rng = np.random.default_rng(2)
    arrays = {"a": rng.standard_normal((3, 2)).astype(np.float32),
              "b": rng.standard_normal((2, 3)).astype(np.float32),
              "c": rng.standard_normal((3, 1)).astype(np.float32)}
    rules = RuleSet([Rule("a", "w", Sum(3, 0)), Rule("b", "w", Chain(Transpose(), Sum(3, 1))),
                     Rule("c", "w", Sum(3, 2, broadcast=(1,)))])
    objckpt.restore(obj, _write(arrays, tmp_path / "abc.safetensors"), rules=rules)
    want = arrays["a"].copy()
    want += arrays["b"].T
    want += arrays["c"]
    assert obj.w.numpy().tobytes() == want.tobytes()
    written = _read(objckpt.export(obj, tmp_path / "out.safetensors", rules=rules))
    assert written["a"].tobytes() == want.tobytes()
    assert written["b"].tobytes() == np.zeros((2, 3), np.float32).tobytes()
    assert written["c"].tobytes() == np.zeros((3, 1), np.float32).tobytes()


def test_bfloat16_terms_are_widened_then_added_in_float32(tmp_path):
    """A float32 model gets the sum of the widened terms (what transformers computes in
    float32 from a bfloat16 file), no cast; a bfloat16 model that sum rounded once, a lossy
    cast refused unless asked for."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = _arrays(3, ml_dtypes.bfloat16)
    source = _write(arrays, tmp_path / "emb.safetensors")
    exact = _folded({k: v.astype(np.float32) for k, v in arrays.items()})
    assert not np.array_equal(exact.astype(ml_dtypes.bfloat16).astype(np.float32), exact)
    obj = _obj("module")
    report = objckpt.restore(obj, source, rules=FOLD)
    assert report.cast == {"word": "bfloat16 -> float32"}
    assert obj.position.numpy().tobytes() == exact.tobytes()
    written = _read(objckpt.export(obj, tmp_path / "out.safetensors", rules=FOLD))
    assert written["emb.position.weight"][RESERVED:].tobytes() == exact.tobytes()
    narrow = tf.Module()
    narrow.position = tf.Variable(tf.zeros((POSITIONS, HID), tf.bfloat16), name="position")
    narrow.word = tf.Variable(tf.zeros((3, HID), tf.bfloat16), name="word")
    with pytest.raises(errors.ObjckptError, match=r"(?s)position.*float32.*bfloat16.*cast="):
        objckpt.restore(narrow, source, rules=FOLD)
    assert not np.any(narrow.position.numpy().astype(np.float32))
    objckpt.restore(narrow, source, rules=FOLD, cast="lossy")
    want = exact.astype(ml_dtypes.bfloat16)
    assert np.asarray(narrow.position.numpy()).tobytes() == want.tobytes()


def test_restore_on_create_refuses_a_sum_rule_by_name(tmp_path):
    source = _write(_arrays(), tmp_path / "emb.safetensors")
    with pytest.raises(errors.InvalidArgumentError, match=r"makes one variable of several "
                                                          r"source entries.*restore_on_create"):
        objckpt.restore_on_create(_obj("module"), source, rules=FOLD)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_streamed_route_adds_the_terms_as_the_fetched_one_does(dtype, monkeypatch,
                                                                   tmp_path):
    """Above the streaming threshold a group is assembled and assigned one at a time: the
    same bytes as the fetched route, for float32 and widened bfloat16 terms."""
    from objckpt._bundle import fastio as _fastio
    from objckpt._planning import stacking as _stacking

    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = _arrays(5, np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    source = _write(arrays, tmp_path / "emb.safetensors")
    fetched = _obj("module")
    objckpt.restore(fetched, source, rules=FOLD)
    loaded = []
    real = _stacking._StackLoader.assign

    def spy(self):
        loaded.append([g.full for g, *_ in self.entries])
        return real(self)

    monkeypatch.setattr(_stacking._StackLoader, "assign", spy)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
    streamed = _obj("module")
    objckpt.restore(streamed, source, rules=FOLD)
    assert loaded == [["emb.position.weight + emb.token_type.weight"]]
    want = _folded({k: v.astype(np.float32) for k, v in arrays.items()})
    for obj in (fetched, streamed):
        assert obj.position.numpy().tobytes() == want.tobytes()
