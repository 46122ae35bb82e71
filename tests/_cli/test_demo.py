"""`objckpt demo`: the README's main-job command, run as users run it."""

import re
import shutil

import pytest
import tensorflow as tf

import objckpt

from flavours import KERAS3_SESSION, requires_keras3_session
from support import run_cli

pytestmark = pytest.mark.subprocess  # every test runs `objckpt demo`


def _run(*args):
    return run_cli(*args, blocked=False)


@requires_keras3_session  # elsewhere the next test checks the demo's message
def test_demo_trains_restores_migrates_and_draws(tmp_path):
    out = tmp_path / "demo"
    result = _run("demo", "--out", str(out), "--epochs", "4")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout
    assert text.rstrip().endswith(f"All checks passed. Files are under {out}")
    for heading in ("train 4 epochs: Twins + TwinSync", "restore the best checkpoint",
                    "write a TF1 name-based checkpoint", "plan and migrate",
                    "verify checksums", "draw the object graph", "timings"):
        assert f"== {heading}" in text
    assert len(re.findall(r"^  epoch \d/4  loss [\d.]+  val_loss [\d.]+", text, re.M)) == 4
    # The restored best checkpoint gives the val_loss it was saved with.
    saved, restored = re.search(r"val_loss ([\d.]+) when saved, ([\d.]+) after restore",
                                text).groups()
    assert saved == restored
    # TF1 Adam slots and global_step moved by role; the rule-rewritten weights say "rule".
    assert re.search(r"^complete: (slot 9, rule 4|rule 4, slot 9)$", text, re.M)
    step = int(tf.train.load_checkpoint(str(out / "tf1" / "model.ckpt")).get_tensor(
        "global_step"))
    assert step == 30 and f"Keras 3 optimizer iterations {step} (TF1 global_step {step})" \
        in text
    # Its tables name weights as people know them: under their layers with the Keras name
    # beside them, Adam slots saying whose they are.
    assert re.search(r"^\s+_kernel  \[mlp/hidden/kernel\]", text, re.M), text
    assert "_trainable_variables" not in text
    assert re.search(r"optimizer/_variables/2  \[m of `_functional/_operations/1/_kernel`\]",
                     text), text
    # The migrated weights are TF1's bit for bit; the two forward passes may round apart by
    # float32 ulps (oneDNN picks kernels per CPU: 0 on some machines, 1.49e-07 on others).
    diff = float(re.search(r"max \|diff\| ([-+.\de]+)", text).group(1))
    assert diff <= 1e-6, diff
    # The demo reports its own timings; how fast it is belongs in benchmarks, not here.
    assert re.search(r"total \(wall, with imports\)\s+[\d.]+ s", text)
    # What it wrote is there and intact.
    assert objckpt.verify(out / "run").ok and objckpt.verify(out / "migrated" / "ckpt").ok
    assert tf.train.latest_checkpoint(str(out / "run")) is not None
    assert [n for n, _ in tf.train.list_variables(str(out / "tf1" / "model.ckpt"))][:3] == [
        "beta1_power", "beta2_power", "global_step"]
    picture = out / ("graph.svg" if shutil.which("dot") else "graph.dot")
    assert picture.exists() and picture.stat().st_size > 1000
    assert f"wrote {picture}" in text


@pytest.mark.skipif(KERAS3_SESSION, reason="Keras 3 is here: the demo runs (previous test)")
def test_demo_without_keras3_says_what_to_install(tmp_path):
    result = _run("demo", "--out", str(tmp_path / "demo"))
    assert result.returncode == 1
    assert "objckpt demo: objckpt demo trains and migrates into a Keras 3 model" in result.stderr
    assert "pip install 'tensorflow>=2.16'" in result.stderr


def test_bad_epochs_is_a_usage_error():
    result = _run("demo", "--epochs", "0")
    assert result.returncode == 2 and "expected a whole number >= 1" in result.stderr
