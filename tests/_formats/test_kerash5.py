"""Keras 3 `.weights.h5` and `.keras` files as sources: restore, plan, migrate, inspect and
verify them, and refuse damaged and hostile files with typed errors, changing nothing.

Files are written by Keras 3 itself (`model.save_weights`, `model.save`); restoring needs the
same architecture, found by Keras 3's own saving layout ("keras layout"). Keras 3 runs in the
keras3 and tf216 sessions; the tf_keras session restores a Keras 3 file into tf_keras.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import h5py
import numpy as np
import pytest

import objckpt
from objckpt import _compat, cli, errors
from objckpt._formats import h5 as _h5
from objckpt._inspect import meta as _meta

from flavours import _data, build_functional, build_subclassed, keras_for
from support import assert_bits, run_cli, values


def _sequential(keras, *, train=True):
    """Conv2D + BatchNorm + Dense in a Sequential with a nested Sequential, Adam trained."""
    model = keras.Sequential([
        keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
        keras.layers.Flatten(),
        keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    if train:
        images, _, targets = _data()
        model.fit(images, targets, epochs=1, batch_size=4, verbose=0)
    return model


def untrained_sequential():
    """The template of `objckpt migrate --template` (Keras 3)."""
    return _sequential(keras_for("keras3"), train=False)


BUILDERS = {"functional": build_functional, "subclassed": build_subclassed,
            "sequential": _sequential}


def _inputs(kind):
    images, tokens, _ = _data(seed=5)
    return [images, tokens] if kind == "functional" else images


def _trained_differently(keras, kind):
    """The same architecture, trained on other targets: every value differs from the file's."""
    model = BUILDERS[kind](keras, train=False)
    images, tokens, targets = _data(seed=3)
    model.fit(_inputs(kind) if kind != "functional" else [images, tokens], -targets,
              epochs=2, batch_size=4, verbose=0)
    return model


def _slots_by_owner(model) -> dict:
    """{(index of a weight in model.trainable_variables, role): its Adam state}, from the
    optimizer's own per-variable lists (an oracle independent of objckpt)."""
    optimizer = model.optimizer
    index = {id(v): i for i, v in enumerate(model.trainable_variables)}
    out = {}
    for role in ("_momentums", "_velocities"):
        for variable, slot in zip(optimizer._trainable_variables, getattr(optimizer, role)):
            out[(index[id(variable)], role)] = np.array(slot)
    return out


@pytest.fixture(scope="module")
def keras3():
    return keras_for("keras3")


@pytest.fixture(scope="module")
def files(keras3, tmp_path_factory):
    """{kind: (model, weights.h5 path, .keras path)} written by Keras 3."""
    out = {}
    for kind, builder in BUILDERS.items():
        directory = tmp_path_factory.mktemp(kind)
        model = builder(keras3)
        weights = str(directory / "w.weights.h5")
        whole = str(directory / "m.keras")
        model.save_weights(weights)
        model.save(whole)
        out[kind] = (model, weights, whole)
    return out


@pytest.mark.parametrize("fmt", ["weights.h5", "keras"])
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_restore_into_the_same_architecture(keras3, files, kind, fmt):
    source, weights, whole = files[kind]
    path = weights if fmt == "weights.h5" else whole
    target = _trained_differently(keras3, kind)
    x = _inputs(kind)
    assert not np.array_equal(source(x), target(x))
    plan = objckpt.plan(target, path)
    # Every network variable and every optimizer variable where Keras 3 saves it.
    assert plan.complete
    assert plan.strategies() == {
        "keras layout": len(target.variables) + len(target.optimizer.variables)}
    moved = len(target.optimizer.variables)
    assert (f"{moved} optimizer entries moved by their place in the Keras 3 "
                          "weights file (it records no owners): the obj's optimizer has the "
                          "same variables in the same shapes, so the same layers are assumed "
                          "trainable on both sides; if not, pass optimizer_state=False"
                          ) in plan.notes
    report = objckpt.restore(target, path)
    described = ("Keras 3 weights file" if fmt == "weights.h5" else "Keras 3 model file")
    assert report.source.startswith(f"{described} `{path}`")
    np.testing.assert_array_equal(source(x), target(x))
    # Optimizer state landed on the variable it belongs to (the optimizer's own lists).
    expected, got = _slots_by_owner(source), _slots_by_owner(target)
    assert expected.keys() == got.keys() and len(got) == 2 * len(target.trainable_variables)
    for key, value in expected.items():
        np.testing.assert_array_equal(value, got[key], err_msg=str(key))
    assert int(target.optimizer.iterations) == int(source.optimizer.iterations)


def test_optimizer_state_of_another_layout_is_never_guessed(keras3, tmp_path):
    """A file written with the conv layer frozen has fewer optimizer variables: they move
    nowhere by position; they are skipped and listed (as Keras's own loader skips them) and
    the network moves; the obj's optimizer keeps every value, counters and moments alike;
    with optimizer_state=False it is left alone too, without a word."""
    source = _sequential(keras3, train=False)
    source.layers[0].trainable = False
    source.compile(optimizer=keras3.optimizers.Adam(0.01), loss="mse")
    images, _, targets = _data()
    source.fit(images, targets, epochs=1, batch_size=4, verbose=0)
    path = str(tmp_path / "frozen.weights.h5")
    source.save_weights(path)
    target = _trained_differently(keras3, "sequential")
    state = [np.array(v) for v in target.optimizer.variables]
    report = objckpt.restore(target, path)
    assert len(report.restored) == 10 and not report.missing and not report.unexpected
    skipped = [s for s in report.skipped if "the obj's optimizer has another layout, so it "
               "is skipped, as Keras's own loader skips it" in s]
    assert [s.split(":")[0] for s in skipped] == [f"optimizer/vars/{i}" for i in range(14)]
    assert any(n.startswith("14 optimizer entries of a Keras weights file were skipped")
               for n in report.notes)
    # As Keras's own loader: the obj's optimizer is left as it was (counters and moments).
    assert not report.plan.fresh and len(state) == 18
    after = [np.array(v) for v in target.optimizer.variables]
    assert [a.tobytes() for a in after] == [s.tobytes() for s in state]
    quiet = objckpt.restore(target, path, optimizer_state=False)
    assert not [s for s in quiet.skipped if "another layout" in s] and not quiet.plan.fresh
    x = _inputs("sequential")
    np.testing.assert_array_equal(source(x), target(x))
    assert all(  # optimizer_state=False: the obj's optimizer state is left as it was
        np.array(v).tobytes() == a.tobytes() for v, a in zip(target.optimizer.variables, after))


def test_migrate_inspect_and_verify(keras3, files, tmp_path, capsys):
    source, weights, _ = files["sequential"]
    target = _sequential(keras3, train=False)
    prefix = objckpt.migrate(target, weights, str(tmp_path / "ckpt"))
    fresh = _sequential(keras3, train=False)
    objckpt.restore(fresh, prefix)
    np.testing.assert_array_equal(source(_inputs("sequential")), fresh(_inputs("sequential")))

    # The command line: objckpt migrate w.weights.h5 OUT --template MODULE:CALLABLE.
    out = str(tmp_path / "cli")
    assert cli.main(cli._parse(["objckpt", "migrate", weights, out, "--template",
                                f"{__name__}:untrained_sequential"])) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert objckpt.diff(prefix, out).same

    # The nested Sequential alone, from its place in the file (`at`): the same layout below.
    inner = keras3.Sequential([keras3.Input((64,)), keras3.layers.Dense(4, activation="relu"),
                               keras3.layers.Dense(2)])
    report = objckpt.restore(inner, weights, at="layers/sequential", optimizer_state=False)
    assert len(report.restored) == 4
    for mine, theirs in zip(inner.variables, source.layers[-1].variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    listed = _meta.read(weights)
    with h5py.File(weights, "r") as h5:
        expected = {name: (h5[name].shape, h5[name].dtype.name) for name in _datasets(h5)}
    assert {p: (v.shape, v.dtype.name) for p, v in listed.items()} == expected
    assert cli.main(cli._parse(["objckpt", "inspect", weights])) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"Keras 3 weights file `{weights}`: {len(expected)} variables, ")
    rows = [line.split() for line in out]
    assert [row[:3] for row in rows if row[:1] == ["0"]][:2] == [
        ["0", "(4,)", "float32"], ["0", "(3,", "3,"]]  # bn's gamma, conv2d's kernel
    start = next(i for i, row in enumerate(rows) if row[:1] == ["optimizer/"])
    optimizer = [row[0] for row in rows[start + 2:] if row[0].isdigit()]
    assert optimizer == [str(i) for i in range(18)]  # in Keras's order, not by text
    assert cli.main(cli._parse(["objckpt", "diff", weights, prefix])) != 0
    assert capsys.readouterr().err.startswith(
        f"objckpt diff: diff compares TF checkpoints; A is Keras 3 weights file `{weights}`.")

    report = objckpt.verify(weights)
    assert report.ok and report.tensors == len(expected)
    assert report.nbytes == sum(v.nbytes for v in listed.values())


def test_damaged_files_are_refused_and_nothing_changes(keras3, files, tmp_path):
    _, weights, _ = files["sequential"]
    target = _trained_differently(keras3, "sequential")
    before = values(objckpt.tree(target))

    truncated = str(tmp_path / "cut.weights.h5")
    with open(weights, "rb") as handle:
        data = handle.read()
    with open(truncated, "wb") as handle:
        handle.write(data[: len(data) // 2])
    with pytest.raises(errors.CheckpointCorruptError, match=r"cut\.weights\.h5"):
        objckpt.restore(target, truncated)
    report = objckpt.verify(truncated)
    assert not report.ok

    shape = _edited(weights, tmp_path / "shape.weights.h5", "layers/dense/vars/0",
                    np.zeros((3, 3), "float32"))
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(target, shape)
    assert "layers/dense/vars/0" in str(caught.value) and "(3, 3)" in str(caught.value)

    text = _edited(weights, tmp_path / "text.weights.h5", "layers/dense/vars/1",
                   np.array([b"no", b"numbers"]))
    with pytest.raises(errors.CheckpointCorruptError,
                       match=r"at `layers/sequential/layers/dense/vars/1` cannot be read safely: "
                       r"its dtype `\|S7` is not a number type"):
        objckpt.restore(target, text)

    linked = str(tmp_path / "link.weights.h5")
    shutil.copy(weights, linked)
    with h5py.File(linked, "a") as h5:
        del h5["layers/sequential/layers/dense/vars/1"]
        h5["layers/sequential/layers/dense/vars/1"] = h5py.ExternalLink("/etc/passwd", "/x")
    with pytest.raises(errors.CheckpointCorruptError, match="external link"):
        objckpt.restore(target, linked)
    assert_bits(before, values(objckpt.tree(target)))


def _edited(weights, out, key, value) -> str:
    """A copy of `weights` whose dataset `.../<key>` holds `value` instead."""
    out = str(out)
    shutil.copy(weights, out)
    with h5py.File(out, "a") as h5:
        full = next(name for name in _datasets(h5) if name.endswith(key))
        del h5[full]
        h5[full] = value
    return out


def _datasets(h5) -> list:
    found = []
    h5.visititems(lambda name, item: found.append(name) if isinstance(item, h5py.Dataset)
                  else None)
    return found


@pytest.mark.parametrize("case", ["traversal", "absolute", "symlink", "bomb"])
def test_hostile_keras_zips_are_refused(keras3, files, tmp_path, case):
    _, _, whole = files["sequential"]
    target = _trained_differently(keras3, "sequential")
    before = values(objckpt.tree(target))
    hostile = str(tmp_path / f"{case}.keras")
    with zipfile.ZipFile(whole) as good, zipfile.ZipFile(hostile, "w") as bad:
        for info in good.infolist():
            bad.writestr(info, good.read(info))
        if case == "traversal":
            bad.writestr("../evil", b"x")
        elif case == "absolute":
            bad.writestr(zipfile.ZipInfo("/etc/evil"), b"x")
        elif case == "symlink":
            link = zipfile.ZipInfo("assets/link")
            link.external_attr = (0o120777 << 16)
            bad.writestr(link, "/etc/passwd")
        else:
            bad.writestr("assets/zeros", bytes(40 << 20), compress_type=zipfile.ZIP_DEFLATED)
    said = {"traversal": "member `../evil` climbs out of the archive",
            "absolute": "member `/etc/evil` has an absolute path",
            "symlink": "member `assets/link` is a symbolic link",
            "bomb": "member `assets/zeros` inflates"}[case]
    with pytest.raises(errors.CheckpointCorruptError, match=said):
        objckpt.restore(target, hostile)
    assert_bits(before, values(objckpt.tree(target)))


def _virtual_layout():
    layout = h5py.VirtualLayout(shape=(4,), dtype="f4")
    layout[:] = h5py.VirtualSource("/etc/other.h5", "data", shape=(4,))
    return layout


H5_ODDITIES = {
    "soft": (lambda h5: h5.__setitem__("odd", h5py.SoftLink("/a")), "it is a soft link"),
    "external": (lambda h5: h5.__setitem__("odd", h5py.ExternalLink("/etc/passwd", "/")),
                 "it is an external link to another file"),
    "compound": (lambda h5: h5.create_dataset(
        "odd", data=np.zeros(2, dtype=[("x", "f4"), ("y", "i4")])),
                 r"its dtype `\[\('x', '<f4'\), \('y', '<i4'\)\]` is not a number type"),
    "bomb": (lambda h5: h5.create_dataset("odd", shape=(1 << 30,), dtype="float64",
                                          chunks=(1 << 16,), compression="gzip"),
             "its 0 stored bytes would expand to 8,589,934,592 \\(more than 1000x\\)"),
    "never written": (lambda h5: h5.create_dataset("odd", shape=(1 << 37,), dtype="float64"),
                      "its 1,099,511,627,776 bytes of contiguous data have no place in the "
                      "file \\(never written\\)"),
    "null": (lambda h5: h5.create_dataset("odd", data=h5py.Empty("f4")),
             "it has no dataspace"),
    "virtual": (lambda h5: h5.create_virtual_dataset("odd", _virtual_layout()),
                "it is a virtual dataset \\(data in other files\\)"),
    "external raw data": (lambda h5: h5.create_dataset(
        "odd", shape=(10,), dtype="f4", external=[("/etc/hostname", 0, 40)]),
                          "its data is stored in external files"),
}


@pytest.mark.parametrize("case", list(H5_ODDITIES))
def test_h5_reader_refuses_what_keras_never_writes(tmp_path, case):
    path = str(tmp_path / "odd.h5")
    make, said = H5_ODDITIES[case]
    with h5py.File(path, "w") as h5:
        h5["a/vars/0"] = np.arange(4, dtype="float32").reshape(2, 2)
        make(h5)
    with _h5.open_file(path) as h5:
        assert h5.datasets("a") == {"a/vars/0": _h5.Dataset("a/vars/0", (2, 2), "float32", 16)}
        np.testing.assert_array_equal(h5.read("a/vars/0"), [[0, 1], [2, 3]])
        with pytest.raises(errors.CheckpointCorruptError,
                           match=f"HDF5 file `.*odd.h5` at `odd` cannot be read safely: {said}"):
            h5.datasets()
    with open(path, "rb") as handle:
        data = handle.read()
    with pytest.raises(errors.CheckpointCorruptError, match="start with HDF5's signature"):
        _h5.open_bytes(b"PK" + data[2:], "x.h5")


# Where Keras 3's save_weights puts `_sequential`'s weights: (key, shape, weight name).
SEQUENTIAL_LAYOUT = [
    ("layers/conv2d/vars/0", (3, 3, 3, 4), "kernel"), ("layers/conv2d/vars/1", (4,), "bias"),
    ("layers/batch_normalization/vars/0", (4,), "gamma"),
    ("layers/batch_normalization/vars/1", (4,), "beta"),
    ("layers/batch_normalization/vars/2", (4,), "moving_mean"),
    ("layers/batch_normalization/vars/3", (4,), "moving_variance"),
    ("layers/sequential/layers/dense/vars/0", (64, 4), "kernel"),
    ("layers/sequential/layers/dense/vars/1", (4,), "bias"),
    ("layers/sequential/layers/dense_1/vars/0", (4, 2), "kernel"),
    ("layers/sequential/layers/dense_1/vars/1", (2,), "bias")]


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras", "keras2"])
def test_every_flavour_lays_out_weights_as_keras3_saves_them(flavour, tmp_path):
    """The obj side of "keras layout" in each flavour, against the keys Keras 3 writes
    (checked against a real file where Keras 3 runs)."""
    keras = keras_for(flavour)
    model = _sequential(keras, train=False)
    laid_out = [(key, tuple(v.shape), _compat.variable_name(v).split(":")[0].rsplit("/", 1)[-1])
                for key, v in _compat.keras_weights_layout(model)
                if not key.startswith("optimizer/")]
    assert laid_out == SEQUENTIAL_LAYOUT
    if flavour == "keras3":
        path = str(tmp_path / "w.weights.h5")
        model.save_weights(path)
        with h5py.File(path, "r") as h5:
            network = [key for key in _datasets(h5) if not key.startswith("optimizer/")]
        assert sorted(network) == sorted(key for key, _, _ in SEQUENTIAL_LAYOUT)


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_a_keras3_file_restores_into_tf_keras(tmp_path, kind):
    """tf_keras lays out the same architecture as Keras 3 does: layers by class, own weights
    trainable first. Keras 3 writes, tf_keras reads, in one process (the tf_keras session)."""
    tf_keras = keras_for("tf_keras")
    keras3 = keras_for("keras3", beside_tf_keras=True)
    source = BUILDERS[kind](keras3)
    path = str(tmp_path / "w.weights.h5")
    source.save_weights(path)
    target = BUILDERS[kind](tf_keras, train=False)
    x = _inputs(kind)
    plan = objckpt.plan(target, path, optimizer_state=False)
    assert plan.strategies() == {"keras layout": len(target.variables)}
    moved = [s for s in plan.skipped if s.startswith("optimizer/vars/")]
    assert len(moved) == len(source.optimizer.variables)
    objckpt.restore(target, path, optimizer_state=False)
    variables = objckpt.tree(target)
    with h5py.File(path, "r") as h5:
        for match in plan.matches:  # every value as the file holds it
            np.testing.assert_array_equal(variables[match.target].numpy(), h5[match.source][()])
    # The same function (Keras 3 and tf_keras compute batch norm in other orders).
    np.testing.assert_allclose(source(x), target(x), rtol=1e-5, atol=1e-6)


def test_sharded_weights_restore_and_hostile_shard_names(keras3, files, tmp_path):
    source, _, _ = files["functional"]
    index = str(tmp_path / "w.weights.json")
    source.save_weights(index, max_shard_size=0.000002)  # GB: about 2 KB per shard
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".weights.h5"))
    assert len(shards) > 2
    target = _trained_differently(keras3, "functional")
    report = objckpt.restore(target, index)
    assert report.source == f"Keras 3 sharded weights `{index}` ({len(shards)} shard files)"
    np.testing.assert_array_equal(source(_inputs("functional")), target(_inputs("functional")))
    assert objckpt.verify(index).tensors == len(source.variables) + len(
        source.optimizer.variables)

    before = values(objckpt.tree(target))
    with open(index) as handle:
        text = handle.read()
    hostile = str(tmp_path / "evil.weights.json")
    with open(hostile, "w") as handle:
        handle.write(text.replace(shards[1], "../" + shards[1], 1))
    with pytest.raises(errors.CheckpointCorruptError,
                       match=f"names the shard `../{shards[1]}`; expected a file name beside"):
        objckpt.restore(target, hostile)
    os.remove(os.path.join(tmp_path, shards[-1]))
    with pytest.raises(errors.CheckpointCorruptError, match=f"{shards[-1]}` does not exist"):
        objckpt.restore(target, index)
    assert_bits(before, values(objckpt.tree(target)))


@pytest.mark.subprocess
def test_command_line_reads_keras_files_without_tensorflow(files):
    """inspect, graph and verify of a `.keras` in a process where TF and Keras cannot import."""
    _, weights, whole = files["sequential"]

    def run(*args):
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(run("inspect", whole, "--format", "json"))["variables"]
    with h5py.File(weights, "r") as h5:  # the .keras holds the same weights file
        expected = sorted(_datasets(h5))
    assert sorted(v["path"] for v in listed) == expected
    conv = next(v for v in listed if v["path"] == "layers/conv2d/vars/0")
    assert conv == {"path": "layers/conv2d/vars/0", "network_path": "layers/conv2d/vars/0",
                    "shape": [3, 3, 3, 4], "dtype": "float32", "nbytes": 432,
                    "key": "layers/conv2d/vars/0", "name": ""}
    assert run("inspect", whole).startswith(
        f"Keras 3 model file `{whole}` (its model.weights.h5; config.json not loaded): "
        f"{len(expected)} variables, ")
    assert 'label="0\\n(3, 3, 3, 4) float32"' in run("graph", whole)
    assert run("verify", whole).splitlines()[-1] == (
        f"OK: {whole}: {len(expected)} tensors (0.0 MB) read intact with the shapes and dtypes "
        "their headers declare (HDF5 keeps no checksums of weights)")


def _loss_scaled(keras):
    """`_sequential` compiled with a `LossScaleOptimizer` around Adam."""
    model = keras.Sequential([
        keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
        keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(optimizer=keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=2.0 ** 10, dynamic_growth_steps=3),
        loss="mse")
    return model


def _state(model) -> dict:
    """{position: value} of the model's weights, then its optimizer's variables."""
    return {i: np.array(v) for i, v in enumerate([*model.weights, *model.optimizer.variables])}


@pytest.mark.parametrize("fmt", ["keras", "weights.h5"])
def test_loss_scale_optimizer_state_restores_as_keras_loads_it(keras3, tmp_path, fmt):
    """Keras saves a LossScaleOptimizer's inner variables twice (`optimizer/vars/4..` and
    `optimizer/inner_optimizer/vars/0..`): one entry each, every optimizer variable equal to
    Keras's own loader's, and the next step equal to the uninterrupted run's."""
    images, _, targets = _data()
    source = _loss_scaled(keras3)
    source.fit(images, targets, epochs=2, batch_size=4, verbose=0)  # 4 steps: the scale grew
    assert float(np.array(source.optimizer.variables[3])) == 2.0 ** 11  # dynamic_scale
    path = str(tmp_path / ("m.keras" if fmt == "keras" else "w.weights.h5"))
    source.save(path) if fmt == "keras" else source.save_weights(path)
    target = _loss_scaled(keras3)
    target.optimizer.build(target.trainable_variables)
    plan = objckpt.plan(target, path)
    assert plan.complete and plan.strategies() == {"keras layout": 8 + 4 + 2 + 2 * 6}
    assert not plan.unmatched_source
    assert "14 optimizer variables are saved twice (a LossScaleOptimizer's list and its " \
           "inner optimizer's)" in " ".join(plan.notes)
    report = objckpt.restore(target, path)
    assert not report.missing and not report.unexpected
    if fmt == "keras":
        oracle = keras3.models.load_model(path)
    else:
        oracle = _loss_scaled(keras3)
        oracle.optimizer.build(oracle.trainable_variables)
        oracle.load_weights(path)
    assert len(target.optimizer.variables) == 4 + 14
    assert_bits(_state(target), _state(oracle))
    assert_bits(_state(target), _state(source))
    for model in (target, oracle, source):  # the next step, from the same state
        model.train_on_batch(images[:4], targets[:4])
    assert_bits(_state(target), _state(oracle))
    assert_bits(_state(target), _state(source))


def test_loss_scale_optimizer_inner_copy_is_the_value_taken(keras3, tmp_path):
    """Where the two copies differ (an edited file), the inner optimizer's one is taken, as
    Keras's loader assigns it last."""
    images, _, targets = _data()
    source = _loss_scaled(keras3)
    source.fit(images, targets, epochs=1, batch_size=4, verbose=0)
    path = str(tmp_path / "w.weights.h5")
    source.save_weights(path)
    with h5py.File(path, "r+") as handle:  # the inner copy of m of the conv kernel
        handle["optimizer/inner_optimizer/vars/2"][...] = 7.0
    target, oracle = _loss_scaled(keras3), _loss_scaled(keras3)
    for model in (target, oracle):
        model.optimizer.build(model.trainable_variables)
    objckpt.restore(target, path)
    oracle.load_weights(path)
    assert np.all(np.array(target.optimizer.variables[6]) == 7.0)
    assert_bits(_state(target), _state(oracle))


def test_h5_opaque_two_byte_values_are_named_as_unrecorded_bfloat16(tmp_path):
    # h5py stores TF's own bfloat16 NumPy type (Keras 2 / tf_keras save_weights of a bfloat16
    # model) as opaque |V2 with no dtype attribute: not damage, an unrecorded type.
    path = str(tmp_path / "bf16.h5")
    with h5py.File(path, "w") as h5:
        h5["a/vars/0"] = np.arange(4, dtype="float32")
        h5["a/vars/1"] = np.arange(4, dtype="<u2").view("V2")
    with _h5.open_file(path) as h5:
        with pytest.raises(errors.CheckpointCorruptError) as caught:
            h5.datasets()
    said = str(caught.value)
    assert "at `a/vars/1` holds dtype `|V2`" in said and "bfloat16" in said
    assert "intact copy" not in said and "Fix: save the model as a TF checkpoint" in said
