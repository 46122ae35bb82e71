"""Migration of TF1 name-based and Keras 2 / tf_keras checkpoints into today's models."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import FLAVOURS, KERAS_FLAVOURS, keras_for
from legacy import (
    LegacyKerasUnavailable,
    assert_tf1_adam_state_restored,
    cached_keras2_checkpoint,
    cached_tf1_checkpoint,
    conv_net,
    tf1_rewrite,
    tf1_rewrite_module,
)
from support import build_optimizer, run_cli

RULES = [("^model_001/", "")]


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return cached_tf1_checkpoint(tmp_path_factory)


def _predict(model, x):
    if hasattr(model, "built"):  # Keras: inference mode (BatchNorm on moving statistics)
        return model(tf.constant(x), training=False).numpy()
    return model(tf.constant(x)).numpy()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_tf1_saver_checkpoint_migrated_with_rules(flavour, tf1, tmp_path):
    model = tf1_rewrite_module() if flavour == "module" else tf1_rewrite(keras_for(flavour))
    plan = objckpt.plan(model, tf1["prefix"], rules=RULES, optimizer_state=False)
    assert plan.complete, plan.describe()
    assert plan.strategies() == {"rule": 8}  # rewritten, then by path or by name: "rule"
    assert sum("optimizer state" in s for s in plan.skipped) == 2 * 6 + 3  # slots, powers, step
    prefix = objckpt.migrate(model, tf1["prefix"], str(tmp_path / "out" / "ckpt"), rules=RULES)
    assert prefix == str(tmp_path / "out" / "ckpt")
    fresh = tf1_rewrite_module() if flavour == "module" else tf1_rewrite(keras_for(flavour))
    # A standard object-based checkpoint laid out for the model: plain TF reads it.
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    np.testing.assert_allclose(_predict(fresh, tf1["x"]), tf1["y"], atol=1e-6, rtol=0)
    assert objckpt.diff(prefix, objckpt.save(fresh, str(tmp_path / "again"))).same
    # The model that gave the layout is not changed by migrate.
    assert not np.allclose(_predict(model, tf1["x"]), tf1["y"], atol=1e-3)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_tf1_restore_directly_and_adam_slots_moved(flavour, tf1, tmp_path):
    keras = keras_for(flavour)
    model = tf1_rewrite(keras)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    build_optimizer(model)
    report = objckpt.restore(model, tf1["prefix"], rules=RULES, optimizer_state=True)
    np.testing.assert_allclose(_predict(model, tf1["x"]), tf1["y"], atol=1e-6, rtol=0)
    slots = assert_tf1_adam_state_restored(report, model, tf1["prefix"])
    kernel = next(m.target for m in report.plan.matches if m.source == "model_001/conv/kernel")
    m_slot = next(m.target for m in slots if m.source == "model_001/conv/kernel/Adam")
    v_slot = next(m.target for m in slots if m.source == "model_001/conv/kernel/Adam_1")
    assert m_slot != v_slot and kernel not in (m_slot, v_slot)


@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_keras2_checkpoint_into_keras3_by_structure(kind, tmp_path_factory):
    keras = keras_for("keras3", beside_tf_keras=True)  # the Keras 2 writer needs tf_keras
    try:
        legacy = cached_keras2_checkpoint(tmp_path_factory, kind=kind)
    except LegacyKerasUnavailable as err:
        pytest.skip(str(err))
    model = conv_net(keras, kind)
    # What users get today: TF's own restore matches nothing and says little.
    status = tf.train.Checkpoint(root=model).read(legacy["prefix"])
    with pytest.raises(AssertionError):
        status.assert_existing_objects_matched()
    report = objckpt.restore(model, legacy["prefix"], optimizer_state=False)
    # By the Keras names the weights were saved under where they line up (the functional
    # net names its layers), else by structure; never partly by path.
    strategies = report.plan.strategies()
    assert len(strategies) == 1 and strategies.get("keras name", strategies.get("structure")) \
        == 10, report.plan.describe()
    by = next(iter(strategies))
    np.testing.assert_allclose(_predict(model, legacy["x"]), legacy["y"], atol=1e-6, rtol=0)

    # Optimizer state moved when asked: Adam m/v of every weight and the step counter.
    model = conv_net(keras, kind)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.optimizer.build(model.trainable_variables)
    report = objckpt.restore(model, legacy["prefix"], optimizer_state=True)
    strategies = report.plan.strategies()
    assert strategies[by] == 10 and strategies["slot"] >= 2 * 8 + 1, \
        report.plan.describe()
    optimizer = model.optimizer
    index = optimizer._get_variable_index(model.get_layer("conv1").kernel)
    np.testing.assert_array_equal(optimizer._momentums[index].numpy(), legacy["m"])
    np.testing.assert_array_equal(optimizer._velocities[index].numpy(), legacy["v"])
    assert int(optimizer.iterations.numpy()) == int(legacy["iterations"])


def test_bad_plans_write_nothing(tf1, tmp_path):
    model = tf1_rewrite(keras_for("keras3"))
    out = str(tmp_path / "out" / "ckpt")
    with pytest.raises(errors.StructureMismatchError, match="name-based") as info:
        objckpt.migrate(model, tf1["prefix"], out)  # no rules: names do not line up
    assert "`model_001/conv/kernel`: in the source but not in the obj" in str(info.value)
    bad_shape = [("^model_001/", ""), ]
    with pytest.raises(errors.StructureMismatchError, match=r"shape \(144, 5\) in the source"):
        objckpt.migrate(model, tf1["prefix"], out,
                        rules=[("^model_001/dense/kernel$", "dense/kernel",
                                lambda t: tf.reshape(t, (144, 5, 1))[..., 0][:, :5]),
                               ("^model_001/conv/kernel$", "conv/kernel",
                                lambda t: tf.zeros((144, 5))), *bad_shape])
    with pytest.raises(errors.InvalidArgumentError, match="not a valid regular expression"):
        objckpt.migrate(model, tf1["prefix"], out, rules=[("(", "")])
    assert not os.path.exists(os.path.dirname(out)) or not os.listdir(os.path.dirname(out))


def test_rules_that_match_nothing_warn_and_are_listed(tf1):
    model = tf1_rewrite(keras_for("keras3"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = objckpt.plan(model, tf1["prefix"], rules=[*RULES, ("^nowhere/", "x/")],
                            optimizer_state=False)
    assert plan.unused_rules == ("rule 1 ('^nowhere/' -> 'x/')",)
    assert any("^nowhere/" in str(w.message) for w in caught)
    table = plan.describe()
    assert "rules that matched nothing (1):" in table and "model_001/conv/kernel" in table


def test_source_neither_object_nor_name_based(tmp_path):
    model = tf1_rewrite(keras_for("keras3"))
    junk = tmp_path / "junk"
    (tmp_path / "junk.index").write_bytes(b"not a checkpoint index at all")
    with pytest.raises(errors.CheckpointCorruptError, match=r"junk\.index"):
        objckpt.migrate(model, str(junk), str(tmp_path / "out"))
    with pytest.raises(errors.CheckpointNotFoundError, match="No checkpoint at prefix"):
        objckpt.migrate(model, str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert not list(tmp_path.glob("out*"))


def test_migrate_streams_in_shards_and_verifies(tf1, tmp_path, monkeypatch, capsys):
    from objckpt._ops import migrate as _migrate

    monkeypatch.setattr(_migrate, "_GROUP_BYTES", 1024)  # force one shard per big tensor
    model = tf1_rewrite(keras_for("keras3"))
    prefix = objckpt.migrate(model, tf1["prefix"], str(tmp_path / "ckpt"), rules=RULES,
                             progress=True)
    progress = capsys.readouterr().err
    assert progress.count("\rmigrate: ") > 2 and "(100%)" in progress  # a line per shard
    shards = sorted(p.name for p in tmp_path.glob("ckpt.data-*"))
    assert len(shards) > 2 and shards[0].endswith(f"-of-{len(shards):05d}")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no debris
    fresh = tf1_rewrite(keras_for("keras3"))
    objckpt.restore(fresh, prefix)
    np.testing.assert_allclose(_predict(fresh, tf1["x"]), tf1["y"], atol=1e-6, rtol=0)


# --- the command line ----------------------------------------------------------

TEMPLATE = '''
from legacy import tf1_rewrite_module


def build():
    return tf1_rewrite_module()


def broken():
    raise RuntimeError("no GPU here")
'''


def _cli(tmp_path, *args):
    """`python -m objckpt ARGS` in tmp_path, where the templates module is."""
    return run_cli(*args, blocked=False, paths=(tmp_path,), cwd=tmp_path, timeout=180)


@pytest.mark.subprocess
def test_cli_migrate_dry_run_then_write(tf1, tmp_path):
    import json

    (tmp_path / "templates.py").write_text(TEMPLATE)
    (tmp_path / "rules.json").write_text(json.dumps([["^model_001/", ""]]))
    out = str(tmp_path / "migrated" / "ckpt")
    dry = _cli(tmp_path, "migrate", tf1["prefix"], out, "--template", "templates:build",
               "--rules", "rules.json", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "conv/kernel" in dry.stdout and "model_001/conv/kernel" in dry.stdout
    assert dry.stdout.rstrip().splitlines()[-1].startswith("complete: rule 8")
    assert not (tmp_path / "migrated").exists()
    done = _cli(tmp_path, "migrate", tf1["prefix"], out, "--template", "templates:build",
                "--rules", "rules.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out}"
    fresh = tf1_rewrite_module()
    objckpt.restore(fresh, out)
    np.testing.assert_allclose(_predict(fresh, tf1["x"]), tf1["y"], atol=1e-6, rtol=0)


@pytest.mark.subprocess
def test_cli_migrate_bad_input_writes_nothing(tf1, tmp_path):
    from objckpt import cli

    (tmp_path / "templates.py").write_text(TEMPLATE)
    (tmp_path / "bad.json").write_text("[[\"^model_001/\", ")
    out = str(tmp_path / "out")
    broken = _cli(tmp_path, "migrate", tf1["prefix"], out, "--template", "templates:broken")
    assert broken.returncode == 1
    assert "templates:broken' raised RuntimeError: no GPU here. Nothing was written" in \
        broken.stderr
    with pytest.raises(errors.InvalidArgumentError, match=r"bad\.json: not valid JSON"):
        cli.load_rules(str(tmp_path / "bad.json"))
    (tmp_path / "shape.json").write_text('{"a": 1}')
    with pytest.raises(errors.InvalidArgumentError, match="expected a JSON list"):
        cli.load_rules(str(tmp_path / "shape.json"))
    with pytest.raises(errors.InvalidArgumentError, match="expected MODULE:CALLABLE"):
        cli.load_template("no_colon")
    incomplete = _cli(tmp_path, "migrate", tf1["prefix"], out, "--template", "templates:build")
    assert incomplete.returncode == 1 and "name-based" in incomplete.stderr
    assert not list(tmp_path.glob("out*"))


def test_optimizer_state_asked_but_nowhere_to_move_it(tf1):
    model = tf1_rewrite(keras_for("keras3"))  # no optimizer
    with pytest.raises(errors.StructureMismatchError, match="no optimizer variables to move"):
        objckpt.restore(model, tf1["prefix"], rules=RULES, optimizer_state=True)
    report = objckpt.restore(model, tf1["prefix"], rules=RULES, optimizer_state=True,
                             strict=False)
    assert len(report.restored) == 8 and "model_001/conv/kernel/Adam" in report.unexpected
