"""restore: from prefixes, directories and snapshots, `at=`, `strict=False`, and all or
nothing on bad input (a typed error, every variable bit-identical), over every flavour."""

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import (
    CASES,
    KERAS_FLAVOURS,
    build,
    case_id,
    keras_for,
)
from support import assert_bits, perturb, values
from tests._planning.test_tree import write_name_based


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture
def obj(case):
    return build(*case)


# --- snapshot / restore round trips -------------------------------------------


def test_restore_from_prefix_and_directory(obj, tmp_path):
    before = values(objckpt.tree(obj))
    prefix = objckpt.save(obj, str(tmp_path / "one"))
    perturb(obj)
    report = objckpt.restore(obj, prefix)
    assert_bits(before, values(objckpt.tree(obj)))
    assert report.source == f"checkpoint `{prefix}`"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=obj), str(tmp_path / "dir"), 3)
    manager.save()
    perturb(obj)
    newest = manager.save()
    after = values(objckpt.tree(obj))
    perturb(obj)
    report = objckpt.restore(obj, str(tmp_path / "dir"))  # save_counter is not "unexpected"
    assert report.source == f"checkpoint `{newest}`" and report.unexpected == ()
    assert_bits(after, values(objckpt.tree(obj)))


def test_directory_falls_back_to_newest_intact_checkpoint(tmp_path):
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=module), str(tmp_path), 3)
    older = manager.save()
    module.v.assign([5.0, 6.0])
    newest = manager.save()
    os.remove(newest + ".data-00000-of-00001")
    module.v.assign([0.0, 0.0])
    report = objckpt.restore(module, str(tmp_path))
    assert report.source == f"checkpoint `{older}`"
    assert any(newest in note and "missing" in note for note in report.notes)
    assert module.v.numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("explicit", [True, False], ids=["at=model", "at=auto"])
def test_at_picks_model_subtree_of_model_and_optimizer_checkpoint(case, explicit, tmp_path):
    if case[0] == "module":
        root = build("module")
        model, optimizer = root.model, root.optimizer
    else:
        model = build(*case)
        optimizer = model.optimizer
        root = tf.train.Checkpoint(model=model, optimizer=optimizer)
    prefix = root.write(str(tmp_path / "both"))
    before = values(objckpt.tree(model))
    perturb(model)
    report = objckpt.restore(model, prefix, at="model" if explicit else None)
    assert_bits(before, values(objckpt.tree(model)))
    assert report.at == "model"
    assert report.unexpected == () and report.missing == ()
    if not explicit:
        assert any("used at='model'" in note for note in report.notes)


def test_at_with_no_such_subtree_names_the_choices(tmp_path):
    root = build("module")
    prefix = root.write(str(tmp_path / "both"))
    before = values(objckpt.tree(root.model))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(root.model, prefix, at="modle")
    assert "at='modle'" in str(info.value) and "`model`" in str(info.value)
    assert "`optimizer`" in str(info.value)
    assert_bits(before, values(objckpt.tree(root.model)))


def test_at_on_a_snapshot_uses_path_prefixes():
    root = build("module")
    snap = objckpt.snapshot(root)
    before = values(objckpt.tree(root.model))
    perturb(root.model)
    report = objckpt.restore(root.model, snap, at="model")
    assert report.at == "model"
    assert_bits(before, values(objckpt.tree(root.model)))


def test_strict_false_restores_what_matches_and_reports_the_rest():
    module = tf.Module()
    module.a = tf.Variable([1.0, 2.0])
    module.b = tf.Variable(3.0)
    source = objckpt.Snapshot({"a": [9.0, 8.0], "extra": [1.0]})
    with pytest.raises(errors.StructureMismatchError):
        objckpt.restore(module, source)
    report = objckpt.restore(module, source, strict=False)
    assert report.restored == ("a",)
    assert report.missing == ("b",)
    assert report.unexpected == ("extra",)
    assert module.a.numpy().tolist() == [9.0, 8.0] and module.b.numpy() == 3.0
    assert "missing from the source (1): `b`" in str(report)


def test_fused_restore_does_not_copy_and_copy_on_write_protects_the_snapshot():
    module = tf.Module()
    module.v = tf.Variable(tf.zeros((1000,)))
    snap = objckpt.snapshot(module)
    for _ in range(3):
        objckpt.restore(module, snap)
        module.v.assign_add(tf.ones((1000,)))
        assert float(snap["v"][0]) == 0.0
        assert float(module.v[0]) == 1.0


# --- bad input: a typed error, and every variable bit-identical --------------


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def shared_obj(request):
    return build(*request.param)


@pytest.fixture
def guarded(shared_obj):
    """Yields an obj (shared by the bad-input tests: none may change it) and
    afterwards asserts every variable is bit-identical to before."""
    before = values(objckpt.tree(shared_obj))
    yield shared_obj
    assert_bits(before, values(objckpt.tree(shared_obj)))


def _replace(snap, position, new_value):
    items = dict(snap.items())
    path = list(items)[position]
    items[path] = new_value(items[path])
    return objckpt.Snapshot(items), path


def _label(obj, path: str) -> str:
    """How messages show the variable at `path` of obj (`Plan.label`), checked against
    its parts: the path people know in backquotes, then its name or slot owner."""
    the_plan = objckpt.plan(obj, objckpt.snapshot(obj))
    shown, note = the_plan.display(path)
    assert shown == path or not shown.startswith("optimizer/")
    return f"`{shown}`" + (f" [{note}]" if note else "")


@pytest.mark.parametrize("position", [0, "middle", -1])
@pytest.mark.parametrize("to_disk", [False, True], ids=["snapshot", "prefix"])
def test_wrong_shape_anywhere_changes_nothing(guarded, position, to_disk, tmp_path):
    snap = objckpt.snapshot(guarded)
    index = len(snap) // 2 if position == "middle" else position
    source, path = _replace(snap, index, lambda v: tf.zeros((*v.shape, 2), v.dtype))
    if to_disk:
        source = objckpt.save(source, str(tmp_path / "bad"))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(guarded, source, strict=False)
    message = str(info.value)
    expected_shape = tuple(objckpt.tree(guarded)[path].shape)
    shown = _label(guarded, path)  # the path people know, with its Keras/TF name
    assert f"{shown}: shape {(*expected_shape, 2)} in the source but {expected_shape}" in message
    assert "Nothing was restored" in message and "Fix:" in message
    assert info.value.problems and isinstance(info.value, ValueError)


def test_wrong_dtype_changes_nothing(guarded):
    snap = objckpt.snapshot(guarded)
    index = next(i for i, v in enumerate(snap.values()) if v.dtype == tf.float32)
    source, path = _replace(snap, index, lambda v: tf.cast(v, tf.float64))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(guarded, source)
    assert f"{_label(guarded, path)}: dtype float64 in the source but float32 in the obj" \
        in str(info.value)


def test_missing_entry_changes_nothing(guarded):
    items = dict(objckpt.snapshot(guarded).items())
    path = list(items)[len(items) // 2]
    del items[path]
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(guarded, objckpt.Snapshot(items))
    assert f"{_label(guarded, path)}: in the obj but missing from the source" in str(info.value)
    assert "strict=False" in str(info.value)


def test_unexpected_entry_changes_nothing(guarded, tmp_path):
    items = dict(objckpt.snapshot(guarded).items())
    items["stray/kernel"] = tf.zeros((2,))
    prefix = objckpt.save(objckpt.Snapshot(items), str(tmp_path / "extra"))
    with pytest.raises(errors.StructureMismatchError,
                       match="`stray/kernel`: in the source but not in the obj"):
        objckpt.restore(guarded, prefix)


def test_missing_prefix(guarded, tmp_path):
    objckpt.save(guarded, str(tmp_path / "real"))
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.restore(guarded, str(tmp_path / "reel"))
    assert f"`{tmp_path / 'reel'}.index`" in str(info.value)
    assert str(tmp_path / "real") in str(info.value)  # names what is there
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("content", [b"", b"\x00\xffgarbage{{{", b"all_model_checkpoint_paths: 3"],
                         ids=["empty", "garbage", "wrong-type"])
def test_bad_state_file(guarded, tmp_path, content):
    objckpt.save(guarded, str(tmp_path / "ckpt-1"))
    (tmp_path / "checkpoint").write_bytes(content)
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.restore(guarded, str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / "checkpoint") in message
    assert str(tmp_path / "ckpt-1") in message  # the fix: pass this prefix


def test_truncated_index(guarded, tmp_path):
    prefix = objckpt.save(guarded, str(tmp_path / "ck"))
    index = pathlib.Path(prefix + ".index")
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    with pytest.raises(errors.CheckpointCorruptError, match="index file"):
        objckpt.restore(guarded, prefix)


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_damaged_data(guarded, tmp_path, damage):
    prefix = objckpt.save(guarded, str(tmp_path / "ck"))
    data = pathlib.Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    largest = max(objckpt.read_tree(prefix).values(), key=lambda e: e.nbytes)
    if damage == "truncate":
        raw = raw[: len(raw) - largest.nbytes // 2]
    else:
        # Flip a byte inside the largest tensor, away from the object graph.
        offset = raw.find(np.asarray(objckpt.snapshot(guarded)[
            largest.key.split("/.ATTRIBUTES/")[0]]).tobytes()[:16])
        assert offset >= 0
        raw[offset + 3] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.restore(guarded, prefix)
    assert f"`{prefix}`" in str(info.value)


def test_file_that_is_not_a_checkpoint(guarded, tmp_path):
    text = tmp_path / "weights.h5"
    text.write_text("not a checkpoint")
    with pytest.raises(errors.UnsupportedFormatError, match=r"is a file, not a checkpoint prefix"):
        objckpt.restore(guarded, str(text))  # (a FileNotFoundError, as it was before)
    (tmp_path / "fake.index").write_bytes(os.urandom(512))
    with pytest.raises(errors.CheckpointCorruptError, match="not a checkpoint index"):
        objckpt.restore(guarded, str(tmp_path / "fake"))


def test_name_based_checkpoint(guarded, tmp_path):
    prefix = write_name_based(tmp_path / "tf1")
    with pytest.raises(errors.NotObjectBasedError, match=r"objckpt\.migrate"):
        objckpt.read_tree(prefix)
    with pytest.raises(errors.StructureMismatchError, match=r"name-based .*rules=") as info:
        objckpt.restore(guarded, prefix)  # restorable through rules; none given here
    assert "Nothing was restored" in str(info.value)


def test_wrong_source_type(guarded):
    with pytest.raises(errors.UnsupportedFormatError, match="Received: source of type dict"):
        objckpt.restore(guarded, {"a": 1})


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_unbuilt_model_points_to_restore_on_create(flavour, tmp_path):
    trained = build(flavour, "subclassed")
    prefix = objckpt.save(trained, str(tmp_path / "ck"))
    unbuilt = build(flavour, "subclassed", call=False)
    with pytest.raises(errors.UnbuiltModelError) as info:
        objckpt.restore(unbuilt, prefix)
    assert "restore_on_create" in str(info.value) and "not built" in str(info.value)
    assert objckpt.tree(unbuilt) == {} or not unbuilt.built


def test_empty_module_is_unbuilt(tmp_path):
    source = objckpt.Snapshot({"v": [1.0]})
    with pytest.raises(errors.UnbuiltModelError):
        objckpt.restore(tf.Module(), source)
    with pytest.raises(errors.UnbuiltModelError, match="Nothing to save"):
        objckpt.save(tf.Module(), str(tmp_path / "empty"))


def nested_model(keras):
    keras.utils.set_random_seed(1)
    inner = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(8)],
                             name="inner")
    inputs = keras.Input((4,))
    x = inner(keras.layers.Dense(8, name="first")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_trained_model_under_a_named_subtree_restores_into_an_untrained_copy(flavour, tmp_path):
    """tf.train.Checkpoint(model=m) of a trained model: a Keras 3 nested Sequential's weights
    have canonical paths through the optimizer; at="model" still finds them by layer path."""
    keras = keras_for(flavour)
    trained = nested_model(keras)
    trained.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1, verbose=0)
    prefix = tf.train.Checkpoint(model=trained, epoch=tf.Variable(3)).write(
        str(tmp_path / "ck"))
    network = dict(objckpt._compat.network_variable_paths(trained))
    assert len(network) == 8
    for at in ("model", None):  # None: the `model` subtree is found and the report says so
        fresh = nested_model(keras)
        report = objckpt.restore(fresh, prefix, at=at, optimizer_state=False)
        assert len(report.restored) == 8
        got = dict(objckpt._compat.network_variable_paths(fresh))
        for path, variable in network.items():
            assert got[path].numpy().tobytes() == variable.numpy().tobytes(), (at, path)
