"""The everyday path: train, save, build and compile the model again, restore with
the default options, train on; the next steps equal the uninterrupted run's, bit for bit.

Every flavour, every target state a user meets (compiled with its optimizer not built yet,
optimizer built on all weights, uncompiled), every way a training checkpoint is restored
(`restore` from a prefix, a TF checkpoint, a managed directory and a `.keras` file;
`restore_on_create`; `migrate`, API and CLI; `load_ensemble`), and an optimizer the
source built on a subset of the weights. `optimizer_state`: "auto" (default) and True move
the state by owner, building an optimizer not built yet as Keras's first step would; False
ignores optimizer entries on both sides.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import KERAS_FLAVOURS, KINDS, _data, build, keras_for
from support import HELPERS, assert_bits, build_optimizer, run_cli, values

CASES = [(f, k) for f in KERAS_FLAVOURS for k in KINDS]
FIT = {"batch_size": 4, "epochs": 1, "shuffle": False, "verbose": 0}


def _inputs(kind):
    images, tokens, targets = _data()
    return ([images, tokens] if kind == "functional" else images), targets


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def run(request, tmp_path_factory):
    """A model trained one epoch, saved every way; then trained one more epoch (the
    uninterrupted run's values after it)."""
    flavour, kind = request.param
    keras_for(flavour)
    tmp = tmp_path_factory.mktemp(f"resume-{flavour}-{kind}")
    model = build(flavour, kind)
    x, y = _inputs(kind)
    saved = {"prefix": objckpt.save(model, str(tmp / "prefix" / "ckpt")) or
             str(tmp / "prefix" / "ckpt"),
             "tf": tf.train.Checkpoint(model=model).write(str(tmp / "tf" / "ckpt"))}
    with objckpt.CheckpointManager(model, str(tmp / "dir")) as manager:
        manager.save(1)
    saved["directory"] = str(tmp / "dir")
    before = values(model)
    outputs = np.asarray(model(x, training=False))
    model.fit(x, y, **FIT)
    return {"flavour": flavour, "kind": kind, "saved": saved, "before": before,
            "outputs": outputs,
            "after": values(model), "x": x, "y": y, "tmp": tmp}


@pytest.mark.parametrize("state", ["compiled", "built"])
@pytest.mark.parametrize("source", ["prefix", "tf", "directory"])
def test_restore_into_a_fresh_compiled_model_trains_on_bit_exactly(run, source, state):
    model = build(run["flavour"], run["kind"], train=False)
    if state == "built":
        build_optimizer(model)
    report = objckpt.restore(model, run["saved"][source])
    assert not report.missing and not report.unexpected
    assert_bits(values(model), run["before"])
    model.fit(run["x"], run["y"], **FIT)
    assert_bits(values(model), run["after"])


def test_optimizer_state_true_does_the_same_into_an_unbuilt_optimizer(run):
    model = build(run["flavour"], run["kind"], train=False)
    objckpt.restore(model, run["saved"]["prefix"], optimizer_state=True)
    model.fit(run["x"], run["y"], **FIT)
    assert_bits(values(model), run["after"])


def test_uncompiled_model_gets_the_network_and_lists_the_optimizer_state(run):
    uncompiled = _uncompiled(run)
    report = objckpt.restore(uncompiled, run["saved"]["prefix"])
    assert np.asarray(uncompiled(run["x"], training=False)).tobytes() == \
        run["outputs"].tobytes()
    assert len(report.restored) == len(objckpt.tree(uncompiled))
    assert any("the obj has no optimizer to put it in" in s for s in report.skipped)
    with pytest.raises(objckpt.errors.StructureMismatchError, match="compile the model"):
        objckpt.restore(_uncompiled(run), run["saved"]["prefix"], optimizer_state=True)


def _uncompiled(run):
    keras = keras_for(run["flavour"])
    model = build(run["flavour"], run["kind"], train=False)
    if run["kind"] == "functional":  # the same layers in a model never compiled
        return keras.Model(model.inputs, model.outputs, name=model.name)
    uncompiled = type(model)()  # a subclassed model: the same class, called, not compiled
    uncompiled(_data()[0])
    return uncompiled


def test_optimizer_state_false_ignores_optimizer_entries_on_both_sides(run):
    model = build(run["flavour"], run["kind"], train=False)
    model.fit(run["x"], run["y"][::-1], **FIT)  # an optimizer with state of its own
    own = {p: v for p, v in values(model).items()
           if p.startswith("optimizer") or "OPTIMIZER_SLOT" in p}
    report = objckpt.restore(model, run["saved"]["prefix"], optimizer_state=False)
    got = values(model)
    for path, value in own.items():
        if path in run["before"] and not (path.startswith("optimizer/_trainable")):
            assert got[path].tobytes() == value.tobytes(), path
    assert report.skipped


def test_restore_on_create_lands_optimizer_state_as_keras_builds_it(run):
    model = build(run["flavour"], run["kind"], train=False)
    pending = objckpt.restore_on_create(model, run["saved"]["prefix"])
    model.fit(run["x"], run["y"], **FIT)
    pending.assert_done()
    assert_bits(values(model), run["after"])


def test_restore_on_create_into_an_uncompiled_model_skips_optimizer_state(run):
    model = _uncompiled(run)
    pending = objckpt.restore_on_create(model, run["saved"]["prefix"])
    pending.assert_done()
    assert any("no optimizer to put it in" in s for s in pending.skipped)
    with pytest.raises(objckpt.errors.StructureMismatchError, match="optimizer_state=True"):
        objckpt.restore_on_create(_uncompiled(run), run["saved"]["prefix"],
                                  optimizer_state=True)


def test_migrate_with_default_options_carries_the_optimizer(run):
    target = build(run["flavour"], run["kind"], train=False)
    out = objckpt.migrate(target, run["saved"]["tf"], str(run["tmp"] / "migrated" / "ckpt"))
    model = build(run["flavour"], run["kind"], train=False)
    objckpt.restore(model, out)
    model.fit(run["x"], run["y"], **FIT)
    assert_bits(values(model), run["after"])


def test_load_ensemble_of_training_checkpoints_with_default_and_auto(run):
    template = build(run["flavour"], run["kind"], train=False)
    for mode in (False, "auto"):
        ensemble = objckpt.load_ensemble(template, [run["saved"]["prefix"]] * 2,
                                         optimizer_state=mode)
        member = values(ensemble.members[1])
        for path, value in member.items():
            if path in run["before"] and not path.startswith("optimizer") \
                    and "OPTIMIZER_SLOT" not in path:
                assert value.tobytes() == run["before"][path].tobytes(), path


# --- an optimizer the source built on a subset of the weights (Keras 3) ------------------


def _untied(keras):
    """An encoder with two heads; only `used` is trained, so a custom loop that drops the
    missing gradients (as keras-hub LMs with an untied head do) builds Adam on the rest."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    unused = keras.layers.Dense(2, name="unused")(hidden)
    used = keras.layers.Dense(2, name="used")(hidden)
    model = keras.Model(inputs, [unused, used])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=[None, "mse"])
    return model


def _step(model, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x)[1] - y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(
        [(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None])


@pytest.mark.parametrize("state", ["compiled", "built", "trained"])
def test_subset_built_optimizer_restores_by_owner(tmp_path, state):
    keras = keras_for("keras3")
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    model = _untied(keras)
    _step(model, x, y)
    assert len(model.optimizer.variables) < 2 + 2 * len(model.trainable_variables)
    prefix = objckpt.save(model, str(tmp_path / "ckpt")) or str(tmp_path / "ckpt")
    _step(model, x, y)
    after = {v.path: v.numpy() for v in model.trainable_variables}

    fresh = _untied(keras)
    if state == "built":
        fresh.optimizer.build(fresh.trainable_variables)
    if state == "trained":  # both heads trained: every slot holds state of its own
        fresh.compile(optimizer=keras.optimizers.Adam(0.01), loss=["mse", "mse"])
        fresh.fit(x, [y, y], epochs=1, batch_size=4, verbose=0)
        assert all(np.any(slot.numpy()) for slot in fresh.optimizer.variables[2:])
    report = objckpt.restore(fresh, prefix)
    assert sum("no state in the source" in s for s in report.skipped) == 4  # m, v of 2
    assert any("start as a fresh optimizer's" in n for n in report.notes)
    unused = [v for v in fresh.trainable_variables if "unused" in v.path]
    for variable in unused:  # a fresh optimizer's slots for the head that got no gradient
        for slot in fresh.optimizer.variables:
            if variable.path.replace("/", "_") in slot.path:
                assert not np.any(slot.numpy()), slot.path
    _step(fresh, x, y)
    got = {v.path: v.numpy() for v in fresh.trainable_variables}
    assert {k: v.tobytes() for k, v in got.items()} == \
        {k: v.tobytes() for k, v in after.items()}
    # optimizer_state=False never looks at either optimizer
    objckpt.restore(_untied(keras), prefix, optimizer_state=False)


def test_keras_file_with_another_optimizer_layout_skips_not_misplaces(tmp_path):
    """A `.keras` file names optimizer variables by position only: with another layout
    (built on a subset) they are skipped, as Keras's loader skips them, never moved into
    another variable's slots."""
    keras = keras_for("keras3")
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    model = _untied(keras)
    _step(model, x, y)
    path = str(tmp_path / "m.keras")
    model.save(path)
    fresh = _untied(keras)
    fresh.optimizer.build(fresh.trainable_variables)
    report = objckpt.restore(fresh, path, strict=False)
    for slot in fresh.optimizer.variables[2:]:
        assert not np.any(slot.numpy()), slot.path
    assert any("records no owners" in n for n in report.notes)


def test_a_fix_line_never_suggests_what_fails_the_same_way(tmp_path):
    keras = keras_for("keras3")
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    model = _untied(keras)
    _step(model, x, y)
    prefix = objckpt.save(model, str(tmp_path / "ckpt")) or str(tmp_path / "ckpt")
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    other.compile(optimizer="adam", loss="mse")
    with pytest.raises(objckpt.errors.StructureMismatchError) as caught:
        objckpt.restore(other, prefix)
    assert "optimizer_state=True" not in str(caught.value)


@pytest.mark.subprocess
def test_cli_migrate_moves_optimizer_state_by_default(tmp_path):
    keras_for("keras3")
    module = tmp_path / "resume_template.py"
    module.write_text(
        "import sys\n"
        f"sys.path.insert(0, {HELPERS!r})\n"
        "from flavours import build\n"
        "def make():\n"
        "    return build('keras3', 'functional', train=False)\n")
    model = build("keras3", "functional")
    prefix = objckpt.save(model, str(tmp_path / "src" / "ckpt")) or \
        str(tmp_path / "src" / "ckpt")
    x, y = _inputs("functional")
    model.fit(x, y, **FIT)
    after = values(model)
    out = str(tmp_path / "out" / "ckpt")
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env_path}"
    try:
        result = run_cli("migrate", prefix, out, "--template", "resume_template:make",
                         blocked=False)
    finally:
        os.environ["PYTHONPATH"] = env_path
    assert result.returncode == 0, result.stderr
    fresh = build("keras3", "functional", train=False)
    objckpt.restore(fresh, out)
    fresh.fit(x, y, **FIT)
    assert_bits(values(fresh), after)
    bad = run_cli("migrate", prefix, out, "--template", "resume_template:make",
                  "--optimizer-state", "maybe", blocked=False)
    assert bad.returncode != 0
    assert "'maybe'" in bad.stderr and "auto" in bad.stderr


def test_keras_file_resumes_bit_exactly(tmp_path):
    """A `.keras` file (weights and optimizer by position) into a fresh compiled model."""
    keras_for("keras3")
    model = build("keras3", "functional")
    x, y = _inputs("functional")
    model.save(str(tmp_path / "m.keras"))
    model.fit(x, y, **FIT)
    fresh = build("keras3", "functional", train=False)
    objckpt.restore(fresh, str(tmp_path / "m.keras"))
    fresh.fit(x, y, **FIT)
    assert_bits(values(fresh), values(model))


def test_module_with_a_tf1_optimizer_not_built_yet_resumes_bit_exactly(tmp_path):
    """tf.Module + TF1 Adam (slots created on the first apply_gradients): restoring builds
    the slots of the variables the source holds state for, as the first step would."""
    from flavours import build_module

    def step(ckpt):
        net, optimizer = ckpt.model, ckpt.optimizer
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(net(tf.ones((2, 3))) ** 2)
        variables = [v for v in net.trainable_variables if v.dtype.is_floating]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    trained = build_module()
    prefix = objckpt.save(trained, str(tmp_path / "ckpt")) or str(tmp_path / "ckpt")
    step(trained)
    fresh = build_module(train=False)
    assert not any("OPTIMIZER_SLOT" in p for p in objckpt.tree(fresh))
    report = objckpt.restore(fresh, prefix)
    assert not report.missing and not report.unexpected
    step(fresh)
    assert_bits(values(fresh), values(trained))


def test_keras_hub_llama_with_an_untied_head_resumes_by_owner(tmp_path):
    """keras-hub Llama with an untied head: a loop on the backbone's output gives the head no
    gradient, so Adam is built on the other weights; restored into a fresh backbone whose
    optimizer is built on all of them (as fit builds it), the next step is bit-equal."""
    keras = keras_for("keras3")
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")

    def make():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=32, num_layers=1, num_query_heads=2, num_key_value_heads=1,
            hidden_dim=8, intermediate_dim=16, tie_word_embeddings=False)
        backbone.compile(optimizer=keras.optimizers.Adam(0.01))
        return backbone

    batch = {"token_ids": np.arange(8, dtype="int32").reshape(2, 4) % 32,
             "padding_mask": np.ones((2, 4), dtype="int32")}

    def step(backbone):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(backbone(batch) ** 2)
        grads = tape.gradient(loss, backbone.trainable_variables)
        backbone.optimizer.apply_gradients(
            [(g, v) for g, v in zip(grads, backbone.trainable_variables) if g is not None])

    trained = make()
    step(trained)
    built_on = len(trained.optimizer._trainable_variables)
    assert built_on < len(trained.trainable_variables)  # the head got no gradient
    prefix = objckpt.save(trained, str(tmp_path / "ckpt")) or str(tmp_path / "ckpt")
    step(trained)
    fresh = make()
    fresh.optimizer.build(fresh.trainable_variables)
    report = objckpt.restore(fresh, prefix)
    assert sum("no state in the source" in s for s in report.skipped) == \
        2 * (len(fresh.trainable_variables) - built_on)  # m and v of each head weight
    step(fresh)
    assert_bits({v.path: v.numpy() for v in fresh.trainable_variables},
                {v.path: v.numpy() for v in trained.trainable_variables})
    # Was "ambiguous, not guessed: `optimizer/_trainable_variables/2` ..." even without state.
    network = objckpt.restore(make(), prefix, optimizer_state=False)
    assert not network.missing and not network.unexpected


def test_checkpoint_manager_resumes_into_a_fresh_compiled_model(run):
    model = build(run["flavour"], run["kind"], train=False)
    with objckpt.CheckpointManager(model, run["saved"]["directory"]) as manager:
        manager.restore_latest()
    model.fit(run["x"], run["y"], **FIT)
    assert_bits(values(model), run["after"])


# --- other writers' checkpoints into a model compiled in this process ----------------------


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_tf1_saver_checkpoint_into_a_compiled_model_moves_adam_slots(flavour,
                                                                      tmp_path_factory):
    from legacy import assert_tf1_adam_state_restored, cached_tf1_checkpoint, tf1_rewrite

    keras = keras_for(flavour)
    tf1 = cached_tf1_checkpoint(tmp_path_factory)
    model = tf1_rewrite(keras)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")  # optimizer not built
    plan = objckpt.plan(model, tf1["prefix"], rules=[("^model_001/", "")])
    assert any("not built yet" in note for note in plan.notes), plan.notes
    report = objckpt.restore(model, tf1["prefix"], rules=[("^model_001/", "")])
    assert_tf1_adam_state_restored(report, model, tf1["prefix"])


def test_keras2_checkpoint_into_a_compiled_keras3_model_moves_adam_state(tmp_path_factory):
    from legacy import LegacyKerasUnavailable, cached_keras2_checkpoint, conv_net

    keras = keras_for("keras3", beside_tf_keras=True)  # the Keras 2 writer needs tf_keras
    try:
        legacy = cached_keras2_checkpoint(tmp_path_factory, kind="functional")
    except LegacyKerasUnavailable as err:
        pytest.skip(str(err))
    model = conv_net(keras, "functional")
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")  # optimizer not built
    report = objckpt.restore(model, legacy["prefix"])
    assert report.plan.strategies()["slot"] >= 2 * 8 + 1, report.plan.describe()
    optimizer = model.optimizer
    index = optimizer._get_variable_index(model.get_layer("conv1").kernel)
    np.testing.assert_array_equal(optimizer._momentums[index].numpy(), legacy["m"])
    np.testing.assert_array_equal(optimizer._velocities[index].numpy(), legacy["v"])
    assert int(optimizer.iterations.numpy()) == int(legacy["iterations"])


def test_keras3_weights_file_into_a_compiled_model(tmp_path):
    """Keras 3's `.weights.h5` of a compiled model holds its optimizer's variables too (by
    position): into a fresh compiled model the next step is the uninterrupted run's."""
    keras_for("keras3")
    model = build("keras3", "functional")
    x, y = _inputs("functional")
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    model.fit(x, y, **FIT)
    fresh = build("keras3", "functional", train=False)
    report = objckpt.restore(fresh, path)
    assert not report.missing and not report.unexpected
    assert fresh.optimizer.built
    fresh.fit(x, y, **FIT)
    assert_bits(values(fresh), values(model))


@pytest.mark.subprocess
def test_resume_in_a_fresh_process_is_bit_exact(tmp_path):
    """The flow users run every day, in two processes: train and save in one; build,
    compile, restore with the defaults and train on in another."""
    import subprocess
    import sys

    from flavours import session_flavour

    flavour = session_flavour()
    keras_for(flavour)
    worker = os.path.join(HELPERS, "resume_worker.py")
    for mode in ("train", "resume"):
        result = subprocess.run([sys.executable, worker, mode, flavour, "functional",
                                 str(tmp_path)], capture_output=True, text=True, timeout=300,
                                check=False)
        assert result.returncode == 0, result.stderr[-3000:]
    want = dict(np.load(tmp_path / "uninterrupted.npz"))
    got = dict(np.load(tmp_path / "resumed.npz"))
    assert len(want) > 20
    assert_bits(got, want)


def test_source_built_on_all_into_an_optimizer_built_on_a_subset(tmp_path):
    """The other way round: the obj's optimizer trains fewer variables than the source's;
    their state has nowhere to go and is skipped (listed), the rest moves by owner."""
    keras = keras_for("keras3")
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    source = _untied(keras)
    source.compile(optimizer=keras.optimizers.Adam(0.01), loss=["mse", "mse"])
    source.fit(x, [y, y], epochs=1, batch_size=4, verbose=0)  # Adam built on every weight
    prefix = objckpt.save(source, str(tmp_path / "ckpt")) or str(tmp_path / "ckpt")
    target = _untied(keras)
    _step(target, x, y)  # Adam built on the weights that get a gradient
    report = objckpt.restore(target, prefix)
    assert sum("does not train" in s for s in report.skipped) == 4  # m, v of 2 weights
    _step(source, x, y)
    _step(target, x, y)
    want = {v.path: v.numpy().tobytes() for v in source.trainable_variables}
    assert {v.path: v.numpy().tobytes() for v in target.trainable_variables} == want


def test_errors_name_network_variables_by_their_network_path(tmp_path):
    """A TF checkpoint of a trained Keras 3 model reaches nested layers' weights first
    through the optimizer (`optimizer/_trainable_variables/2`): a mismatch names them by
    their path through the layers, once, and the optimizer's slots fold into their line."""
    keras = keras_for("keras3")

    def make(units, train=True):
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(6, name="enc")(inputs)
        head = keras.Sequential([keras.layers.Dense(units), keras.layers.Dense(2)], name="head")
        model = keras.Model(inputs, head(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        if train:
            model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), verbose=0)
        return model

    prefix = tf.train.Checkpoint(root=make(4)).write(str(tmp_path / "tf"))
    assert any(k.startswith("optimizer/_trainable_variables/") for k in objckpt.read_tree(prefix))
    with pytest.raises(objckpt.errors.StructureMismatchError) as caught:
        objckpt.restore(make(5, train=False), prefix, at="root")
    message = str(caught.value)
    assert "3 problems" in message and "_trainable_variables" not in message
    assert message.count("(also its optimizer slots m, v)") == 3
    assert "[head/dense" in message and "optimizer_state=True" not in message
