"""The `objckpt` command line, run as users run it."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf

import objckpt
from objckpt import cli
from objckpt._inspect import meta as _meta

from flavours import build
from support import python_env, run_cli


def _run(*args):
    return run_cli(*args, blocked=False)


@pytest.mark.subprocess
def test_inspect_text_and_json_from_the_command_line(tmp_path):
    root = build("module")
    manager = tf.train.CheckpointManager(root, str(tmp_path), 2)
    prefix = manager.save()
    text = _run("inspect", str(tmp_path))
    assert text.returncode == 0, text.stderr
    out = text.stdout
    entries = objckpt.read_tree(prefix)
    assert f"checkpoint {prefix}: {len(entries)} variables" in out
    assert "  encoder/" in out and "(3, 4)" in out and "float32" in out
    assert "optimizer slots" in out and "model/encoder/w/.OPTIMIZER_SLOT/optimizer/m" in out
    assert out.rstrip().splitlines()[-1].startswith("total")
    js = _run("inspect", prefix, "--format", "json")
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc == cli.inspect_json(_meta.read(prefix))  # read without TF
    assert {v["path"]: (v["shape"], v["dtype"], v["key"], v["name"]) for v in doc["variables"]} \
        == {p: (list(e.shape), e.dtype.name, e.key, e.name) for p, e in entries.items()}
    assert all(v["network_path"] == v["path"] for v in doc["variables"])  # no optimizer path
    assert doc["total"]["variables"] == len(entries)
    assert doc["total"]["nbytes"] == sum(v["nbytes"] for v in doc["variables"])
    w = next(v for v in doc["variables"] if v["path"] == "model/encoder/w")
    assert w["shape"] == [3, 4] and w["dtype"] == "float32" and w["nbytes"] == 48


@pytest.mark.subprocess
def test_inspect_errors_exit_1_with_the_message(tmp_path):
    result = _run("inspect", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert f"No checkpoint at prefix `{tmp_path / 'missing'}`" in result.stderr


@pytest.mark.subprocess
def test_no_command_is_a_usage_error():
    result = _run()
    assert result.returncode == 2
    for command in ("inspect", "diff", "graph", "migrate", "verify", "demo"):
        assert f"objckpt {command} " in result.stderr, command


def test_inspect_text_totals_per_object(tmp_path):
    module = tf.Module()
    module.block = tf.Module()
    module.block.w = tf.Variable(tf.zeros((2, 3)))
    module.block.b = tf.Variable(tf.zeros((3,), tf.float64))
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    text = cli.inspect_text(objckpt.read_tree(prefix))
    lines = text.splitlines()
    block = next(line for line in lines if line.startswith("block/"))
    assert "2 variables" in block and "48 B" in block
    assert any(line.split()[:3] == ["b", "(3,)", "float64"] for line in lines)
    assert "2 variables, 9 parameters, 48 B" in lines[0]


@pytest.mark.subprocess
def test_import_is_cheap_and_does_not_import_tensorflow():
    code = ("import sys, objckpt; assert 'tensorflow' not in sys.modules, 'TF imported'; "
            "assert 'keras' not in sys.modules; print(objckpt.__version__, len(objckpt.__all__))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=python_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == objckpt.__version__


def test_migrate_casts_lossy_only_with_cast_lossy(tmp_path, monkeypatch, capsys):
    """`objckpt migrate --cast lossy` narrows as `objckpt.migrate(..., cast="lossy")` does;
    without it the narrowing is refused, the Fix names the argument, nothing is written."""
    source = tf.Module()
    source.w = tf.Variable([0.1, -2.5, 3.0001], dtype=tf.float64)
    prefix = objckpt.save(source, str(tmp_path / "wide"))
    (tmp_path / "narrow_templates.py").write_text(
        "import tensorflow as tf\n\n\ndef build():\n    module = tf.Module()\n"
        "    module.w = tf.Variable([0.0, 0.0, 0.0], dtype=tf.bfloat16)\n    return module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "out" / "ckpt")
    args = ["objckpt", "migrate", prefix, out, "--template", "narrow_templates:build"]
    assert cli.main(cli._parse([*args, "--dry-run"])) == 1
    assert "dtype float64 in the source but bfloat16 in the obj" in capsys.readouterr().out
    assert cli.main(cli._parse(args)) == 1
    assert "pass cast='lossy'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert cli.main(cli._parse([*args, "--cast", "lossy", "--dry-run"])) == 0
    assert "w: float64 -> bfloat16" in capsys.readouterr().out
    assert cli.main(cli._parse([*args, "--cast", "lossy"])) == 0
    back = tf.Module()
    back.w = tf.Variable([0.0, 0.0, 0.0], dtype=tf.bfloat16)
    tf.train.Checkpoint(root=back).read(out).assert_existing_objects_matched()
    assert back.w.numpy().tobytes() == tf.cast(source.w, tf.bfloat16).numpy().tobytes()
