"""`objckpt diff`: per-path differences between two checkpoints."""

import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import cli, errors
from objckpt._inspect import diff as _diff

from flavours import build, keras_for
from support import cli_in_process, run_cli


def _run(*args):
    """Runs `python -m objckpt ARGS` as users run it."""
    return run_cli(*args, blocked=False)


def _write(prefix, **variables) -> str:
    """Writes an object-based checkpoint of a tf.Module holding `variables`."""
    module = tf.Module()
    for name, value in variables.items():
        setattr(module, name, tf.Variable(value))
    return tf.train.Checkpoint(root=module).write(str(prefix))


def _saver_checkpoint(prefix, **variables) -> str:
    """Writes a name-based (TF1 Saver) checkpoint of global variables."""
    with tf.Graph().as_default():
        for name, value in variables.items():
            tf.compat.v1.get_variable(name.replace("__", "/"), initializer=tf.constant(value))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(sess, str(prefix), write_meta_graph=False)


def _cli(capsys, *argv):
    """Runs `objckpt diff ...` in-process: (exit status, stdout, stderr)."""
    return cli_in_process(capsys, "diff", *argv)


@pytest.mark.parametrize("flavour", ["module", "keras3"])
def test_identical_checkpoints_of_a_real_model_are_the_same(tmp_path, capsys, flavour):
    if flavour == "keras3":
        keras_for("keras3")
    obj = build(flavour)
    checkpoint = tf.train.Checkpoint(model=obj)
    a = checkpoint.save(str(tmp_path / "a" / "ckpt"))
    b = checkpoint.save(str(tmp_path / "b" / "ckpt"))  # save_counter differs: ignored
    result = _diff.diff(a, b)
    paths = [p for p in objckpt.read_tree(a) if p != "save_counter"]
    assert result.same and result.differ == 0
    assert result.equal == len(paths) > 4
    assert (result.a, result.b) == (a, b)
    assert result.values == result.shape_or_dtype == result.only_in_a == result.only_in_b == ()
    status, out, _ = _cli(capsys, a, b)
    assert status == 0
    assert out.splitlines() == [f"A: {a}", f"B: {b}", f"{len(paths)} equal, 0 differ (bit-exact)"]


def test_a_changed_value_of_a_trained_model(tmp_path, capsys):
    checkpoint = build("module")  # tf.train.Checkpoint(model=..., optimizer=...)
    a = checkpoint.write(str(tmp_path / "a"))
    w = checkpoint.model.encoder.w
    w.assign(w + tf.constant([[0.5, 0, 0, 0], [0, -0.25, 0, 0], [0, 0, 0, 0]]))
    b = checkpoint.write(str(tmp_path / "b"))
    result = _diff.diff(a, b)
    assert not result.same
    assert result.values == (_diff.ValueDiff("model/encoder/w", 0.5, 2, 12),)
    # optimizer slots and the other variables are unchanged
    assert result.equal == len(objckpt.read_tree(a)) - 1
    status, out, _ = _cli(capsys, a, b)
    assert status == 1
    assert "~ model/encoder/w: max |a-b| 0.5 at 2 of 12 values" in out.splitlines()
    assert out.splitlines()[-1] == f"{result.equal} equal, 1 differ: 1 in value (bit-exact)"


def test_count_and_max_over_many_values(tmp_path, capsys):
    base = np.zeros((4, 5), np.float32)
    changed = base.copy()
    changed.flat[:12] = np.linspace(0.05, 0.5, 12, dtype=np.float32)
    a = _write(tmp_path / "a", dense_kernel=base, bias=np.ones(3, np.float32))
    b = _write(tmp_path / "b", dense_kernel=changed, bias=np.ones(3, np.float32))
    result = _diff.diff(a, b)
    assert result.values == (_diff.ValueDiff("dense_kernel", 0.5, 12, 20),)
    assert result.equal == 1
    _, out, _ = _cli(capsys, a, b)
    assert "~ dense_kernel: max |a-b| 0.5 at 12 of 20 values" in out


def test_rtol_and_atol(tmp_path, capsys):
    a = _write(tmp_path / "a", w=np.array([1.0, 2.0, 100.0], np.float64))
    b = _write(tmp_path / "b", w=np.array([1.001, 2.0, 100.1], np.float64))
    exact = _diff.diff(a, b)
    assert exact.values[0].differing == 2
    assert exact.values[0].max_abs_diff == pytest.approx(0.1)
    by_atol = _diff.diff(a, b, atol=0.01)  # 0.001 is within, 0.1 is not
    assert by_atol.values == (_diff.ValueDiff("w", pytest.approx(0.1), 1, 3),)
    assert (by_atol.rtol, by_atol.atol) == (0.0, 0.01)
    assert _diff.diff(a, b, atol=0.2).same
    assert _diff.diff(a, b, rtol=2e-3).same  # |a-b| <= rtol * |b| everywhere
    assert _diff.diff(a, b, rtol=1e-4).values[0].differing == 2
    status, out, _ = _cli(capsys, a, b, "--atol", "0.01")
    assert status == 1
    assert out.splitlines()[-1] == "0 equal, 1 differ: 1 in value (rtol 0, atol 0.01)"
    assert _cli(capsys, a, b, "--rtol", "2e-3")[0] == 0


def test_missing_and_extra_paths(tmp_path, capsys):
    a = _write(tmp_path / "a", w=np.ones(2, np.float32), extra=np.ones(1, np.float32))
    b = _write(tmp_path / "b", w=np.ones(2, np.float32), other=np.int64(3))
    result = _diff.diff(a, b)
    assert result.only_in_a == ("extra",) and result.only_in_b == ("other",)
    assert result.equal == 1 and result.differ == 2 and not result.same
    status, out, _ = _cli(capsys, a, b)
    assert status == 1
    lines = out.splitlines()
    assert "- extra (only in A)" in lines and "+ other (only in B)" in lines
    assert lines[-1] == "1 equal, 2 differ: 1 only in A, 1 only in B (bit-exact)"


def test_shape_and_dtype_mismatch(tmp_path, capsys):
    a = _write(tmp_path / "a", w=np.zeros((3, 4), np.float32), b=np.zeros(4, np.float32))
    b = _write(tmp_path / "b", w=np.zeros((4, 3), np.float32), b=np.zeros(4, np.float64))
    result = _diff.diff(a, b)
    assert result.shape_or_dtype == (
        ("w", "float32 (3, 4)", "float32 (4, 3)"), ("b", "float32 (4,)", "float64 (4,)"))
    assert result.values == () and result.equal == 0
    status, out, _ = _cli(capsys, a, b)
    assert status == 1
    assert "! w: float32 (3, 4) vs float32 (4, 3)" in out.splitlines()
    assert "! b: float32 (4,) vs float64 (4,)" in out.splitlines()
    assert "2 differ: 2 in shape or dtype" in out


def test_a_directory_means_its_newest_checkpoint(tmp_path, capsys):
    checkpoint = build("module")
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), 3)
    first = manager.save()
    checkpoint.model.step.assign(7)
    newest = manager.save()
    same = _diff.diff(str(tmp_path), newest)
    assert same.same and same.a == newest
    result = _diff.diff(first, str(tmp_path))
    assert result.b == newest
    assert result.values == (_diff.ValueDiff("model/step", 6.0, 1, 1),)
    status, out, _ = _cli(capsys, first, tmp_path)
    assert status == 1 and f"B: {newest}" in out
    assert "~ model/step: max |a-b| 6 at 1 of 1 value" in out


def test_value_kinds_nan_float16_bfloat16_int_bool_string(tmp_path):
    nan = float("nan")
    a = _write(tmp_path / "a",
               f32=np.array([nan, 1.0, 2.0], np.float32),
               f16=tf.constant([1.0, 2.0, 3.0], tf.float16),
               bf16=tf.constant([1.0, nan, 3.0], tf.bfloat16),
               i64=np.array([1, -5, 2**40], np.int64),
               i8=np.int8(-128),
               flags=np.array([True, False, True]),
               text=tf.constant([b"a\x00", b"b", b"c"]),
               zero=np.array([0.0, 1.0], np.float32))
    b = _write(tmp_path / "b",
               f32=np.array([nan, 1.0, nan], np.float32),  # same-position NaN is equal
               f16=tf.constant([1.0, 2.5, 3.0], tf.float16),
               bf16=tf.constant([1.0, nan, 4.0], tf.bfloat16),
               i64=np.array([1, 5, 2**40 + 1], np.int64),
               i8=np.int8(127),
               flags=np.array([True, True, False]),
               text=tf.constant([b"a", b"b", b"c"]),  # b"a\x00" != b"a"
               zero=np.array([-0.0, 1.0], np.float32))
    values = {d.path: d for d in _diff.diff(a, b).values}
    assert set(values) == {"f32", "f16", "bf16", "i64", "i8", "flags", "text", "zero"}
    assert values["f32"].differing == 1 and math.isnan(values["f32"].max_abs_diff)
    assert values["f16"] == ("f16", 0.5, 1, 3)
    assert values["bf16"] == ("bf16", 1.0, 1, 3)
    assert values["i64"] == ("i64", 10.0, 2, 3)
    assert values["i8"] == ("i8", 255.0, 1, 1)
    assert values["flags"] == ("flags", 1.0, 2, 3)
    assert values["text"] == ("text", None, 1, 3)
    assert values["zero"] == ("zero", 0.0, 1, 2)  # bit-exact: -0.0 is not 0.0
    tolerant = {d.path: d for d in _diff.diff(a, b, atol=0.6).values}
    assert set(tolerant) == {"f32", "bf16", "i64", "i8", "flags", "text"}
    assert tolerant["i64"] == ("i64", 10.0, 2, 3)  # 2**40 vs 2**40 + 1 is not within 0.6
    assert {d.path: d.differing for d in _diff.diff(a, b, atol=1.0).values}["i64"] == 1
    doc = cli.diff_json(_diff.diff(a, b))
    json.dumps(doc, allow_nan=False)  # strict JSON: NaN is written as text
    by_path = {v["path"]: v for v in doc["values"]}
    assert by_path["f32"]["max_abs_diff"] == "nan" and by_path["text"]["max_abs_diff"] is None


def test_values_are_compared_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(_diff, "_CHUNK", 7)
    base = np.arange(100, dtype=np.float32)
    changed = base.copy()
    changed[[3, 40, 41, 99]] += np.array([1, 2, -3, 0.5], np.float32)
    a = _write(tmp_path / "a", w=base.reshape(10, 10))
    b = _write(tmp_path / "b", w=changed.reshape(10, 10))
    assert _diff.diff(a, b).values == (("w", 3.0, 4, 100),)
    assert _diff.diff(a, b, atol=2.5).values == (("w", 3.0, 1, 100),)


def test_name_based_checkpoints_by_variable_name(tmp_path, capsys):
    a = _saver_checkpoint(tmp_path / "a" / "model.ckpt",
                          dense__kernel=np.zeros((2, 3), np.float32),
                          dense__bias=np.zeros(3, np.float32))
    b = _saver_checkpoint(tmp_path / "b" / "model.ckpt",
                          dense__kernel=np.full((2, 3), 0.25, np.float32),
                          dense__bias=np.zeros(3, np.float32), head__w=np.ones(1, np.float32))
    with pytest.raises(errors.NotObjectBasedError):
        objckpt.read_tree(a)
    result = _diff.diff(a, b)
    assert result.values == (("dense/kernel", 0.25, 6, 6),)
    assert result.equal == 1 and result.only_in_b == ("head/w",)
    assert any("name-based" in note for note in result.notes)
    # a directory of Saver checkpoints resolves like a managed one
    assert _diff.diff(str(tmp_path / "a"), a).same
    status, out, _ = _cli(capsys, a, b)
    assert status == 1
    assert "~ dense/kernel: max |a-b| 0.25 at 6 of 6 values" in out
    assert "+ head/w (only in B)" in out


def test_name_based_against_object_based_notes_that_keys_rarely_line_up(tmp_path, capsys):
    a = _saver_checkpoint(tmp_path / "tf1", w=np.ones(2, np.float32))
    b = _write(tmp_path / "tf2", w=np.ones(2, np.float32))
    result = _diff.diff(a, b)
    assert result.same and result.equal == 1  # the name `w` happens to equal the path `w`
    (note,) = result.notes
    assert f"A (`{a}`) is name-based" in note and "rarely line up" in note
    _, out, _ = _cli(capsys, a, b)
    assert f"note: A (`{a}`) is name-based" in out


def test_name_based_against_object_based_compares_keys_as_they_are(tmp_path):
    a = _saver_checkpoint(tmp_path / "tf1", layer__w=np.ones(2, np.float32))
    b = _write(tmp_path / "tf2", w=np.ones(2, np.float32))
    result = _diff.diff(a, b)
    assert result.only_in_a == ("layer/w",) and result.only_in_b == ("w",)
    assert result.equal == 0


def test_a_nested_root_is_pointed_out(tmp_path):
    net = build("module").model
    a = tf.train.Checkpoint(net=net).write(str(tmp_path / "a"))
    b = tf.train.Checkpoint(root=net).write(str(tmp_path / "b"))
    result = _diff.diff(a, b)
    assert result.equal == 0 and len(result.only_in_a) == len(result.only_in_b) > 0
    (note,) = result.notes
    assert "under `net/`" in note and "tf.train.Checkpoint(net=obj)" in note


def test_a_missing_checkpoint_is_a_typed_error_naming_the_path(tmp_path, capsys):
    good = _write(tmp_path / "good", w=np.ones(2, np.float32))
    missing = tmp_path / "missing"
    with pytest.raises(errors.CheckpointNotFoundError,
                       match=re.escape(f"No checkpoint at prefix `{missing}`")):
        _diff.diff(good, missing)
    status, _, err = _cli(capsys, missing, good)
    assert status == 1
    assert err.startswith(f"objckpt diff: No checkpoint at prefix `{missing}`")


def test_a_damaged_data_file_is_a_typed_error_naming_the_path(tmp_path):
    a = _write(tmp_path / "a", w=np.ones(1000, np.float32))
    b = _write(tmp_path / "b", w=np.ones(1000, np.float32))
    with open(b + ".data-00000-of-00001", "r+b") as f:
        f.seek(8)  # inside w's 4000 bytes, written before the object graph
        f.write(b"\xff" * 16)  # each tensor's crc32c is checked when it is read
    with pytest.raises(errors.CheckpointCorruptError,
                       match=re.escape(f"Checkpoint B `{b}`: the value of `w`") +
                       r".*its bytes do not match their checksum \(crc32c\)"):
        _diff.diff(a, b)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "x"])
def test_bad_tolerances(tmp_path, bad):
    a = _write(tmp_path / "a", w=np.ones(1, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match=r"rtol= must be a finite number >= 0"):
        _diff.diff(a, a, rtol=bad)


@pytest.mark.parametrize("argv", [["diff", "a"], ["diff", "a", "b", "--rtol", "-1"],
                                  ["diff", "a", "b", "--atol", "nan"],
                                  ["diff", "a", "b", "--format", "xml"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli._parse(["objckpt", *argv])
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.subprocess
def test_diff_from_the_command_line(tmp_path):
    a = _write(tmp_path / "a", w=np.zeros(4, np.float32), gone=np.zeros(1, np.float32))
    b = _write(tmp_path / "b", w=np.array([0, 0, 1.5, 0], np.float32))
    js = _run("diff", a, b, "--format", "json")
    assert js.returncode == 1, js.stderr
    doc = json.loads(js.stdout)
    assert doc == cli.diff_json(_diff.diff(a, b))
    assert doc["same"] is False and doc["equal"] == 0 and doc["differ"] == 2
    assert doc["values"] == [{"path": "w", "max_abs_diff": 1.5, "differing": 1, "size": 4}]
    assert doc["only_in_a"] == ["gone"] and doc["only_in_b"] == []
    text = _run("diff", a, os.path.dirname(a) + "/a.index")  # `prefix.index` works too
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[-1] == "2 equal, 0 differ (bit-exact)"
    missing = _run("diff", a, str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert f"objckpt diff: No checkpoint at prefix `{tmp_path / 'nope'}`" in missing.stderr
    usage = _run("diff", a)
    assert usage.returncode == 2


# --- keys as rules rewrite them; values across a lossless cast -------------------------

def _migrated_pair(tmp_path, scale=1.0):
    """A TF1 Saver checkpoint (`legacy/hidden/weights`, `legacy/hidden/biases`) and an
    object-based one of the same values laid out as `fc_in/_kernel`, `fc_in/bias`."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    bias = np.array([0.5, -1.0, 2.0], np.float32)
    (tmp_path / "tf1").mkdir(parents=True, exist_ok=True)
    a = _saver_checkpoint(tmp_path / "tf1" / "model.ckpt", legacy__hidden__weights=w,
                          legacy__hidden__biases=bias)
    module = tf.Module()
    module.fc_in = tf.Module()
    module.fc_in._kernel = tf.Variable(w * scale)
    module.fc_in.bias = tf.Variable(bias)
    b = tf.train.Checkpoint(root=module).write(str(tmp_path / "migrated" / "ckpt"))
    return a, b


RULES = [(r"^legacy/hidden/weights$", "fc_in/kernel"), (r"^legacy/hidden/biases$", "fc_in/bias")]


def test_rules_compare_a_tf1_checkpoint_with_its_migrated_form(tmp_path, capsys):
    """Without rules nothing lines up; with the migration's rules A's keys are compared as
    rewritten (`fc_in/kernel` meets `fc_in/_kernel`, as restore matches them)."""
    a, b = _migrated_pair(tmp_path)
    plain = _diff.diff(a, b)
    assert plain.equal == 0 and plain.differ == 4
    result = _diff.diff(a, b, rules=RULES)
    assert result.same and result.equal == 2
    assert result.rewritten == {"legacy/hidden/weights": "fc_in/kernel",
                                "legacy/hidden/biases": "fc_in/bias"}
    changed = _diff.diff(*_migrated_pair(tmp_path / "changed", scale=2.0), rules=RULES)
    assert changed.values == (("fc_in/_kernel", 5.0, 5, 6),)
    assert changed.paired == {"fc_in/_kernel": "legacy/hidden/weights"}
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([list(r) for r in RULES]))
    status, out, _ = _cli(capsys, *_migrated_pair(tmp_path / "cli", scale=2.0), "--rules",
                          rules_file)
    assert status == 1
    assert "~ fc_in/_kernel (A: legacy/hidden/weights): max |a-b| 5 at 5 of 6 values" in out
    assert "1 equal, 1 differ: 1 in value (bit-exact)" in out


def test_a_wrong_rule_shows_the_key_it_made(tmp_path, capsys):
    """A rule that rewrites `legacy/hidden/weights` to `fc_in/weights`: the line names the
    rewritten key beside the original; a rule with None leaves entries out, saying so."""
    a, b = _migrated_pair(tmp_path)
    result = _diff.diff(a, b, rules=[(r"^legacy/hidden/", "fc_in/")])
    assert result.only_in_a == ("legacy/hidden/biases", "legacy/hidden/weights")
    assert result.only_in_b == ("fc_in/_kernel", "fc_in/bias") and result.equal == 0
    assert result.rewritten["legacy/hidden/weights"] == "fc_in/weights"
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([["^legacy/hidden/", "fc_in/"]]))
    _, out, _ = _cli(capsys, a, b, "--rules", rules_file)
    assert "- legacy/hidden/weights -> fc_in/weights (only in A)" in out.splitlines()
    dropped = _diff.diff(a, b, rules=[("weights$", None), (r"^legacy/hidden/biases$",
                                                            "fc_in/bias")])
    assert dropped.only_in_a == () and dropped.only_in_b == ("fc_in/_kernel",)
    assert "rules left out 1 of A's entries (replacement None)" in dropped.notes
    with pytest.raises(errors.InvalidArgumentError, match=r"rule 0: '\(' is not a valid"):
        _diff.diff(a, b, rules=[("(", "x")])


def test_a_tolerance_compares_values_across_a_lossless_cast(tmp_path, capsys):
    """A float32 checkpoint against its bfloat16 copy: bit-exact, every tensor is a dtype
    difference; with --atol the values are compared after the (lossless) bfloat16 ->
    float32 cast, and a lossy pair (float16 against bfloat16: neither holds the other)
    stays a dtype difference."""
    values = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    a = _write(tmp_path / "a", w=values, n=np.arange(3, dtype=np.int32),
               x=np.zeros(2, np.float16))
    b = _write(tmp_path / "b", w=tf.cast(values, tf.bfloat16), n=np.arange(3, dtype=np.int64),
               x=tf.zeros(2, tf.bfloat16))
    exact = _diff.diff(a, b)
    assert [d.path for d in exact.shape_or_dtype] == ["w", "n", "x"] and exact.cast == ()
    loose = _diff.diff(a, b, atol=0.01)
    assert [d.path for d in loose.cast] == ["w", "n"] and loose.equal == 2
    assert loose.shape_or_dtype == (("x", "float16 (2,)", "bfloat16 (2,)"),)
    tight = _diff.diff(a, b, atol=1e-6)  # bfloat16 keeps 8 bits of mantissa
    assert [d.path for d in tight.values] == ["w"] and tight.values[0].max_abs_diff < 0.01
    status, out, _ = _cli(capsys, a, b, "--atol", "0.01")
    assert status == 1  # x still differs in dtype
    assert "1 equal" not in out and out.splitlines()[-1] == (
        "2 equal, 1 differ: 1 in shape or dtype (rtol 0, atol 0.01; 2 compared after a "
        "lossless cast)")


def test_safetensors_metadata_every_writer_puts_there_is_no_note(tmp_path, capsys):
    """`format` = `pt` is in every Hugging Face file: no note on stderr or in the result;
    other metadata still is one."""
    module = tf.Module()
    module.w = tf.Variable(np.ones(3, np.float32))
    a = objckpt.export(module, tmp_path / "a.safetensors")
    b = objckpt.export(module, tmp_path / "b.safetensors", metadata={"origin": "run 7"})
    result = _diff.diff(a, b)
    assert result.same
    assert result.notes == ("B: metadata `origin` = `run 7`",)
    status, out, err = _cli(capsys, a, a)
    assert status == 0 and "note" not in out + err and "format" not in out + err
