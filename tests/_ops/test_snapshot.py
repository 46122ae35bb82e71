"""Snapshots over every flavour: immutable, on the variables' devices, restored bit-exact
(restore's own tests: test_restore.py; save's: test_save.py)."""


import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import (
    CASES,
    KERAS_FLAVOURS,
    build,
    case_id,
    keras_for,
    train_more,
)
from support import assert_bits, perturb, values


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture
def obj(case):
    return build(*case)


# --- snapshot / restore round trips -------------------------------------------


def test_snapshot_is_immutable_while_training_continues(obj):
    before = values(objckpt.tree(obj))
    snap = objckpt.snapshot(obj)
    train_more(obj, epochs=2)
    assert {p: np.array(v) for p, v in snap.items()}.keys() == before.keys()
    assert_bits(before, snap.numpy())
    assert not all(np.array_equal(before[p], v) for p, v in values(objckpt.tree(obj)).items())


def test_restore_from_snapshot_is_bit_exact(obj):
    before = values(objckpt.tree(obj))
    snap = objckpt.snapshot(obj)
    for _ in range(3):  # the first restore runs eagerly, later ones fused
        perturb(obj)
        report = objckpt.restore(obj, snap)
        assert_bits(before, values(objckpt.tree(obj)))
    assert report.restored == tuple(before)
    assert report.missing == () and report.unexpected == ()


def test_snapshot_values_live_on_variable_devices_and_numpy_copies(obj):
    snap = objckpt.snapshot(obj)
    paths = objckpt.tree(obj)
    for path, value in snap.items():
        assert isinstance(value, tf.Tensor)
        assert value.device == paths[path].device or paths[path].device == ""
    host = snap.numpy()
    assert all(isinstance(a, np.ndarray) for a in host.values())
    assert snap.nbytes == sum(a.nbytes for a in host.values())


def test_snapshot_restores_into_an_identical_fresh_obj(case):
    source, target = build(*case), build(*case)
    perturb(target)
    objckpt.restore(target, objckpt.snapshot(source))
    assert_bits(values(objckpt.tree(source)), values(objckpt.tree(target)))


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_trained_model_saved_or_snapshotted_loads_into_an_untrained_copy(flavour, kind,
                                                                          tmp_path):
    """A trained Keras 3 model's weights have canonical paths through its optimizer; save
    records their paths through the layers too (as TF does), and a Snapshot knows them."""
    trained = build(flavour, kind)
    network = dict(objckpt._compat.network_variable_paths(trained))
    prefix = objckpt.save(trained, str(tmp_path / "ck"))
    untrained = build(flavour, kind, train=False)
    tf.train.Checkpoint(root=untrained).read(prefix).assert_existing_objects_matched()
    for source in (prefix, objckpt.snapshot(trained)):
        fresh = build(flavour, kind, train=False)
        objckpt.restore(fresh, source, optimizer_state=False)
        for target in (fresh, untrained):
            got = dict(objckpt._compat.network_variable_paths(target))
            assert sorted(got) == sorted(network)
            for path, variable in network.items():
                assert got[path].numpy().tobytes() == variable.numpy().tobytes(), path


def test_snapshot_is_unchanged_by_xla_compiled_training():
    keras = keras_for("keras3")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse", jit_compile=True)
    x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    model.fit(x, y, epochs=1, verbose=0)
    snap = objckpt.snapshot(model)
    kept = snap.numpy()
    objckpt.restore(model, snap)
    objckpt.restore(model, snap)  # now fused: the variables share the snapshot's buffers
    model.fit(x, y, epochs=3, verbose=0)
    assert_bits(kept, snap.numpy())


def test_distributed_variables_snapshot_and_restore():
    """A one-device MirroredStrategy (two replicas: tests/distributed/test_distribute_state.py)."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        module = tf.Module()
        module.w = tf.Variable(tf.ones((3, 2)))
        module.b = tf.Variable(tf.zeros((2,)))
        module.total = tf.Variable(5.0, synchronization=tf.VariableSynchronization.ON_READ,
                                   aggregation=tf.VariableAggregation.SUM)
    paths = objckpt.tree(module)
    assert type(paths["w"]).__name__ == "MirroredVariable"
    assert type(paths["total"]).__name__ == "SyncOnReadVariable"
    before = values(paths)
    snap = objckpt.snapshot(module)
    for _ in range(3):  # eager, then fused
        for variable in paths.values():  # (a SUM SyncOnRead variable has no assign_add)
            variable.assign(variable.value() + 1.0)
        objckpt.restore(module, snap)
        assert_bits(before, values(objckpt.tree(module)))
        for path, variable in objckpt.tree(module).items():  # the one replica's component
            (component,) = variable.values
            assert np.array(component.numpy()).tobytes() == before[path].tobytes(), path


@pytest.mark.subprocess
def test_console_script(tmp_path):
    import shutil
    import subprocess

    script = shutil.which("objckpt")
    if script is None:
        pytest.skip("objckpt is not installed as a package here (no console script)")
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    result = subprocess.run([script, "inspect", prefix], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert f"checkpoint {prefix}: 1 variable, 2 parameters, 8 B" in result.stdout
