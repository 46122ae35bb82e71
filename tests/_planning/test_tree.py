"""objckpt.tree and objckpt.read_tree over every flavour."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import CASES, KERAS_FLAVOURS, build, case_id, checkpoint_paths


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def obj(request):
    flavour, kind = request.param
    return build(flavour, kind)


def test_tree_keys_equal_tf_checkpoint_keys(obj, tmp_path):
    prefix = tf.train.Checkpoint(root=obj).write(str(tmp_path / "tf"))
    paths = objckpt.tree(obj)
    assert set(paths) == checkpoint_paths(prefix)
    assert len(paths) == len(checkpoint_paths(prefix))


def test_tree_of_model_and_optimizer_checkpoint(obj, tmp_path):
    if isinstance(obj, tf.train.Checkpoint):
        root = obj
    else:
        root = tf.train.Checkpoint(model=obj, optimizer=obj.optimizer)
    prefix = root.write(str(tmp_path / "both"))
    paths = objckpt.tree(root)
    assert set(paths) == checkpoint_paths(prefix)
    optimizer_entries = [p for p in paths if "optimizer" in p]
    assert len(optimizer_entries) >= 4, "optimizer slots must be in the tree"


def test_tree_values_are_assignable_tf_variables(obj):
    paths = objckpt.tree(obj)
    for path, variable in paths.items():
        assert isinstance(variable, tf.Variable), path
    path, variable = next((p, v) for p, v in paths.items() if v.dtype == tf.float32)
    new = tf.fill(variable.shape, 3.0)
    variable.assign(new)
    assert np.array_equal(objckpt.tree(obj)[path].numpy(), new.numpy())


def test_shared_variable_appears_once(obj):
    paths = objckpt.tree(obj)
    ids = [id(v) for v in paths.values()]
    assert len(ids) == len(set(ids))


def test_slot_variables_keep_tf_form():
    root = build("module")
    paths = objckpt.tree(root)
    slots = [p for p in paths if "/.OPTIMIZER_SLOT/" in p]
    # Adam: m and v for each of the 6 float variables.
    assert len(slots) == 12
    assert "model/encoder/w/.OPTIMIZER_SLOT/optimizer/m" in slots


def test_read_tree_matches_live_tree(obj, tmp_path):
    prefix = tf.train.Checkpoint(root=obj).write(str(tmp_path / "tf"))
    entries = objckpt.read_tree(prefix)
    live = objckpt.tree(obj)
    assert list(entries) == list(live)  # same paths, same (breadth-first) order
    for path, variable in live.items():
        entry = entries[path]
        assert entry.shape == tuple(variable.shape), path
        assert entry.dtype == variable.dtype.base_dtype, path
        assert entry.key == path + "/.ATTRIBUTES/VARIABLE_VALUE"


def test_read_tree_reads_no_tensor_data(tmp_path):
    module = tf.Module()
    module.big = tf.Variable(tf.ones((4096,)))
    module.small = tf.Variable(2.0)
    prefix = objckpt.save(module, str(tmp_path / "m"))
    data = pathlib.Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # inside `big`'s bytes: any read of it fails its checksum
    data.write_bytes(bytes(raw))
    entries = objckpt.read_tree(prefix)
    assert entries["big"].shape == (4096,)
    assert entries.nbytes == 4096 * 4 + 4
    with pytest.raises(errors.CheckpointCorruptError):
        objckpt.restore(module, prefix)


def test_read_tree_of_directory_uses_newest(tmp_path):
    module = tf.Module()
    module.v = tf.Variable(1.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(root=module), str(tmp_path), 3)
    manager.save()
    module.w = tf.Variable([1.0, 2.0])
    newest = manager.save()
    entries = objckpt.read_tree(str(tmp_path))
    assert entries.prefix == newest
    assert set(entries) == {"v", "w", "save_counter"}  # TF's own bookkeeping is kept


def test_read_tree_reads_safetensors_files_and_folders_as_restore_does(tmp_path):
    """read_tree takes the sources restore takes: a safetensors file and the folder holding
    it, keyed by the names the file holds, with the shapes and dtypes restore checks."""
    import safetensors.numpy

    module = tf.Module()
    module.dense = tf.Module()
    module.dense.kernel = tf.Variable(tf.zeros((3, 4)))
    module.dense.bias = tf.Variable(tf.zeros((4,), tf.float16))
    values = {"dense/kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
              "dense/bias": np.ones(4, np.float16)}
    folder = tmp_path / "hf"
    folder.mkdir()
    path = str(folder / "model.safetensors")
    safetensors.numpy.save_file(values, path)
    for source in (path, str(folder)):
        entries = objckpt.read_tree(source)
        assert sorted(entries) == ["dense/bias", "dense/kernel"], source
        assert [(entries[k].shape, entries[k].dtype, entries[k].key) for k in sorted(entries)] == [
            ((4,), tf.float16, "dense/bias"), ((3, 4), tf.float32, "dense/kernel")], source
        assert entries.object_graph is None and entries.graph is None
        assert entries.nbytes == 4 * 2 + 12 * 4
    objckpt.restore(module, str(folder))  # what read_tree listed is what restore reads
    np.testing.assert_array_equal(module.dense.kernel.numpy(), values["dense/kernel"])


def test_name_based_checkpoint_is_refused_with_a_pointer(tmp_path):
    prefix = write_name_based(tmp_path / "tf1")
    with pytest.raises(errors.NotObjectBasedError) as info:
        objckpt.read_tree(prefix)
    message = str(info.value)
    assert prefix in message and "name-based" in message
    assert "objckpt.plan" in message and "objckpt.migrate" in message
    assert "`model_001/w`" in message
    assert isinstance(info.value, ValueError)


def test_tree_of_non_trackable_is_a_typed_error():
    with pytest.raises(errors.UnsupportedObjectError, match="Received: obj of type dict"):
        objckpt.tree({"a": 1})


def write_name_based(path) -> str:
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model_001"):
            tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, str(path))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_tree_of_an_optimizer_alone(flavour, tmp_path):
    model = build(flavour)
    prefix = tf.train.Checkpoint(root=model.optimizer).write(str(tmp_path / "opt"))
    paths = objckpt.tree(model.optimizer)
    assert set(paths) == checkpoint_paths(prefix)
    n = len(model.trainable_variables)
    if hasattr(model.optimizer, "get_slot_names"):
        # A slot-style optimizer (Keras 2's OptimizerV2): its m and v slots are keyed by the
        # variables they slot for, so they appear once the model is in the same tree.
        both = objckpt.tree(tf.train.Checkpoint(model=model, optimizer=model.optimizer))
        assert sum("/.OPTIMIZER_SLOT/optimizer/" in p for p in both) == 2 * n
    else:
        assert len(paths) >= 2 * n  # Adam: m and v per variable
