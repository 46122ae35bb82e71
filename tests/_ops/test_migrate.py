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


def test_migrate_without_own_writer_writes_shards_and_verifies(tf1, tmp_path, monkeypatch,
                                                              capsys):
    """Where objckpt's bundle writer cannot write (no native crc32c here), groups of
    tensors are written by SaveV2 as shards and merged."""
    from objckpt._ops import migrate as _migrate

    monkeypatch.setattr(_migrate._fastio, "native_crc32c", lambda: None)
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


# --- streamed: one tensor at a time, all or nothing ---------------------------------


def _sharded_folder(folder, values: dict, shards: int = 2) -> None:
    """A Hugging Face style folder: `shards` safetensors files and their index."""
    import json

    st_numpy = pytest.importorskip("safetensors.numpy")
    names = list(values)
    weight_map = {}
    for k in range(shards):
        part = {n: values[n] for n in names[k::shards]}
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        st_numpy.save_file(part, str(folder / name))
        weight_map.update(dict.fromkeys(part, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}))


def _fetched_sizes(monkeypatch) -> list:
    """The bytes of every fetch-stage call's values, as the pipeline returns them."""
    from objckpt._planning import pipeline as _pipeline

    calls = []
    fetch = _pipeline.Pipeline.fetch

    def counted(self, the_plan, variables, matches=None):
        values = fetch(self, the_plan, variables, matches)
        calls.append([int(np.prod(v.shape)) * v.dtype.size for v in values])
        return values

    monkeypatch.setattr(_pipeline.Pipeline, "fetch", counted)
    return calls


def test_a_sharded_safetensors_folder_streams_into_one_checkpoint_bit_equal(
        tmp_path, monkeypatch):
    """A folder of two shards (float32, bfloat16 widened into float32, int64, bool, and a
    kernel stored transposed, turned by a rule's transform) is migrated one tensor at a
    time: large tensors read alone, small ones together up to the read size, into one data
    file that TF reads back bit-equal to the files' values."""
    from objckpt._ops import migrate as _migrate
    from tests._formats.test_safetensors_stream import _bits, _module, _values, _written

    written = _written(40)
    stored = dict(written)
    stored["proj/kernel_t"] = np.ascontiguousarray(stored.pop("proj/kernel").T)
    folder = tmp_path / "hub"
    folder.mkdir()
    _sharded_folder(folder, stored)
    wanted = dict(written)
    wanted["half/kernel"] = written["half/kernel"].astype(np.float32)  # widened: lossless
    model = _module(wanted)
    sizes = _fetched_sizes(monkeypatch)
    monkeypatch.setattr(_migrate, "_READ_BYTES", 1 << 20)
    rules = [(r"^proj/kernel_t$", "proj/kernel", tf.transpose)]
    prefix = objckpt.migrate(model, str(folder), str(tmp_path / "out" / "ckpt"), rules=rules)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "ckpt.data-00000-of-00001", "ckpt.index"]
    assert sorted(len(call) for call in sizes) == [1, 1, 1, 3]  # 3 large alone, 3 small
    assert all(len(call) == 1 or sum(call) <= 1 << 20 for call in sizes)
    assert all(not np.any(v) for v in _values(model).values())  # obj only gave the layout
    fresh = _module(wanted)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    assert {p: _bits(v) for p, v in _values(fresh).items()} == {
        p: _bits(v) for p, v in wanted.items()}


def _data_file(prefix: str) -> str:
    return f"{prefix}.data-00000-of-00001"


def test_a_read_that_fails_mid_stream_leaves_the_prefix_as_it_was(tmp_path):
    """A TF checkpoint whose last tensor's bytes were damaged after it was written: migrate
    checks the plan from metadata, streams the first tensors, then TF's checksum of the
    damaged one fails. The error names the entry; the checkpoint already at the prefix is
    byte for byte what it was, no temporary file is left, and obj is unchanged."""
    def module(seed: int) -> tf.Module:
        m = tf.Module()
        rng = np.random.default_rng(seed)
        for i in range(4):
            setattr(m, f"w{i}", tf.Variable(rng.standard_normal((256, 256), np.float32)))
        return m

    source_model = module(1)
    source = objckpt.save(source_model, str(tmp_path / "src" / "ckpt"))
    raw = bytearray(open(_data_file(source), "rb").read())
    at = raw.find(source_model.w3.numpy().tobytes())
    assert at >= 0
    raw[at + 1000] ^= 0x55
    with open(_data_file(source), "wb") as f:
        f.write(raw)
    destination = str(tmp_path / "dst" / "ckpt")
    objckpt.save(module(2), destination)
    before = {p.name: p.read_bytes() for p in (tmp_path / "dst").iterdir()}
    target = module(3)
    kept = {p: v.numpy().tobytes() for p, v in objckpt.tree(target).items()}
    with pytest.raises(errors.CheckpointCorruptError, match=r"damaged.*`w3/\.ATTRIBUTES"):
        objckpt.migrate(target, source, destination)
    assert {p.name: p.read_bytes() for p in (tmp_path / "dst").iterdir()} == before
    assert {p: v.numpy().tobytes() for p, v in objckpt.tree(target).items()} == kept


def test_a_transform_that_does_not_fit_mid_stream_writes_nothing(tmp_path):
    """From safetensors, a rule's transform whose output shape is only known from its
    values returns the wrong shape for one entry: the fetch stage refuses it by name, and
    nothing is written at the prefix (no folder left either)."""
    st_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(4)
    values = {f"w{i}": rng.standard_normal((64, 32), np.float32) for i in range(3)}
    values["w2"][5, 5] = 1000.0  # the marker squeeze_last finds
    path = str(tmp_path / "m.safetensors")
    st_numpy.save_file(values, path)
    model = tf.Module()
    for name, value in values.items():
        setattr(model, name, tf.Variable(tf.zeros(value.shape)))

    def squeeze_last(t):  # (None, 32) when traced: right for w0 and w1, a row short for w2
        return t[:tf.shape(t)[0] - tf.cast(tf.reduce_max(t) == 1000.0, tf.int32)]

    with pytest.raises(errors.StructureMismatchError, match=r"transform of `w2` gave"):
        objckpt.migrate(model, path, str(tmp_path / "out" / "ckpt"),
                        rules=[(r"^(w\d)$", r"\1", squeeze_last)])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("kind", ["safetensors", "tf"])
def test_peak_memory_bounded_by_the_largest_tensor(kind, tmp_path):
    """A 302 MB source of six 50 MB tensors (a safetensors folder of two shards, or a TF
    checkpoint): migrate holds at most the largest tensor + its streaming slack + 48 MiB
    of margin beyond obj (reading every value first would hold the source's size)."""
    from objckpt._ops import migrate as _migrate
    from tests._formats.test_safetensors_stream import _module, _PeakAnon

    rng = np.random.default_rng(15)
    written = {f"block{i}/kernel": rng.standard_normal((3200, 4096), dtype=np.float32)
               for i in range(6)}
    written.update({f"block{i}/bias": rng.standard_normal(4096, dtype=np.float32)
                    for i in range(6)})
    largest = max(v.nbytes for v in written.values())
    if kind == "safetensors":
        source = tmp_path / "hub"
        source.mkdir()
        _sharded_folder(source, written)
        source = str(source)
    else:
        maker = _module(written)
        for path, variable in objckpt.tree(maker).items():
            variable.assign(written[path])
        source = objckpt.save(maker, str(tmp_path / "src" / "ckpt"))
        del maker
    model = _module(written)
    shapes = {p: v.shape for p, v in written.items()}
    del written
    out = str(tmp_path / "out" / "ckpt")
    with _PeakAnon() as peak:
        objckpt.migrate(model, source, out)
    bound = largest + _migrate._STREAM_SLACK + (48 << 20)
    assert peak.growth < bound, (peak.growth, bound)
    reader = tf.train.load_checkpoint(out)
    for path, shape in shapes.items():
        assert reader.get_tensor(f"{path}/.ATTRIBUTES/VARIABLE_VALUE").shape == shape
