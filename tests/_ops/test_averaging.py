"""`objckpt average OUT SRC...`: the weighted mean of checkpoints written without a model, in a
process where TensorFlow cannot be imported."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from support import run_cli

pytestmark = pytest.mark.subprocess


def _module(seed: int) -> tf.Module:
    rng = np.random.default_rng(seed)
    module = tf.Module()
    module.kernel = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32))
    module.half = tf.Variable(rng.normal(size=(5,)).astype(np.float16))
    module.brain = tf.Variable(tf.constant(rng.normal(size=(3,)), tf.bfloat16))
    module.step = tf.Variable(seed, dtype=tf.int64)
    module.optimizer = tf.Module()
    module.optimizer.m = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32))
    return module


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    directory = tmp_path_factory.mktemp("average_cli")
    modules = [_module(seed) for seed in (1, 2, 3)]
    prefixes = [tf.train.Checkpoint(root=m).write(str(directory / f"ckpt-{k}"))
                for k, m in enumerate(modules)]
    return directory, prefixes, modules


def _read(prefix) -> tf.Module:
    fresh = _module(0)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    return fresh


def _reference(arrays, weights, dtype):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return sum(w[k] * np.asarray(a).astype(np.float64) for k, a in enumerate(arrays)).astype(dtype)


def test_average_without_tensorflow_equals_the_reference(sources):
    directory, prefixes, modules = sources
    out = str(directory / "avg" / "ckpt")
    done = run_cli("average", out, *prefixes, "--weights", "1,2,5")
    assert done.returncode == 0, done.stderr
    assert "averaged 3 variables over 3 checkpoints" in done.stdout
    assert "2 other variables copied from" in done.stdout and "ckpt-2" in done.stdout
    got = _read(out)
    for name in ("kernel", "half", "brain"):
        want = _reference([getattr(m, name).numpy() for m in modules], [1, 2, 5],
                          getattr(got, name).dtype.as_numpy_dtype)
        have = np.asarray(getattr(got, name).numpy())
        # at most one unit in the last place from the float64 reference
        bits = {2: np.int16, 4: np.int32}[have.dtype.itemsize]
        assert np.max(np.abs(have.view(bits).astype(np.int64)
                             - want.view(bits).astype(np.int64))) <= 1, name
    assert int(got.step.numpy()) == 3  # the last source's
    assert np.array_equal(got.optimizer.m.numpy(), modules[2].optimizer.m.numpy())
    # the library's live average agrees bit for bit
    live = _module(0)
    objckpt.average(live, prefixes, weights=[1, 2, 5])
    for name in ("kernel", "half", "brain", "step"):
        assert np.array_equal(np.asarray(getattr(live, name).numpy()),
                              np.asarray(getattr(got, name).numpy())), name


def test_non_weights_first(sources):
    directory, prefixes, modules = sources
    out = str(directory / "first")
    done = run_cli("average", out, *prefixes, "--non-weights", "first")
    assert done.returncode == 0, done.stderr
    got = _read(out)
    assert int(got.step.numpy()) == 1
    assert np.array_equal(got.optimizer.m.numpy(), modules[0].optimizer.m.numpy())


@pytest.mark.parametrize("weights, words", [("1,2", "3 sources but 2 weights"),
                                            ("1,-1,1", "weights[1]"),
                                            ("0,0,0", "sum to 0")])
def test_bad_weights_exit_1_and_write_nothing(sources, weights, words):
    directory, prefixes, _ = sources
    out = directory / f"bad{abs(hash(weights))}"
    done = run_cli("average", str(out), *prefixes, "--weights", weights)
    assert done.returncode == 1 and words in done.stderr
    assert not list(directory.glob(out.name + "*"))


def test_malformed_weights_are_a_usage_error(sources):
    directory, prefixes, _ = sources
    done = run_cli("average", str(directory / "x"), *prefixes, "--weights", "a,b")
    assert done.returncode == 2 and "numbers separated by commas" in done.stderr


def test_mismatched_source_names_the_source_and_path(sources):
    directory, prefixes, _ = sources
    odd = _module(4)
    odd.kernel = tf.Variable(tf.zeros((4, 4)))
    bad = tf.train.Checkpoint(root=odd).write(str(directory / "odd"))
    done = run_cli("average", str(directory / "never"), prefixes[0], bad)
    assert done.returncode == 1
    assert "source 1" in done.stderr and "`kernel`" in done.stderr and "(4, 4)" in done.stderr
    assert not list(directory.glob("never*"))

