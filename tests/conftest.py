"""Test-session set-up. The helpers in tests/helpers/ (support.py, flavours.py, ...) are
imported by name: pyproject.toml's [tool.pytest.ini_options] puts that folder on sys.path."""

import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest_plugins = ["pytester"]  # tests/integration/test_tiers.py runs the tier guard below


def _two_logical_cpus() -> None:
    """Splits the CPU into two logical devices, "/cpu:0" and "/cpu:1", so the tf.distribute
    tests run MirroredStrategy with two replicas on any machine (flavours.mirrored()).

    TF allows this only before its devices are initialized, which is why it happens here,
    before any test module runs an op. Ops still default to "/cpu:0"; only code that asks
    for every device (a MirroredStrategy() without a device list) sees the second one.
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    if cpus and len(tf.config.get_logical_device_configuration(cpus[0]) or []) < 2:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)


_two_logical_cpus()


# --- the tiers: a run that leaves out `subprocess` tests launches no Python process --------

_LAUNCHED: list = []
_PROCESS_MARKS = ("subprocess", "multiworker")
# TF1 graph code and Keras 2 write their checkpoints in a process of their own;
# tests/helpers/legacy.py runs each writer once per test process and caches what it wrote, a
# fixed cost the quick run keeps (it tests migration): those launches are not counted.
_WRITERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "legacy_writers")


def _is_python(args) -> bool:
    first = args[0] if isinstance(args, (list, tuple)) and args else args
    if not isinstance(first, (str, bytes, os.PathLike)):
        return False
    if isinstance(args, (list, tuple)) and len(args) > 1 and \
            os.fsdecode(args[1]).startswith(_WRITERS + os.sep):
        return False
    name = os.path.basename(os.fsdecode(first))
    return os.fsdecode(first) == sys.executable or name.startswith("python") or name == "objckpt"


def pytest_configure(config):
    """Where the marker expression leaves out `subprocess` tests (`nox -s quick`), every
    Python process a test starts is counted, and a test that starts one without the
    `subprocess` or `multiworker` mark fails: the quick tier stays what it says it is."""
    if "not subprocess" not in (config.option.markexpr or ""):
        return
    real_init = subprocess.Popen.__init__

    def counting_init(self, args, *rest, **kwargs):
        if _is_python(args):
            _LAUNCHED.append(args)
        real_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = counting_init
    config.stash[_GUARD] = real_init


def pytest_unconfigure(config):
    real_init = config.stash.get(_GUARD, None)
    if real_init is not None:
        subprocess.Popen.__init__ = real_init


_GUARD = pytest.StashKey[object]()


def pytest_runtest_setup(item):
    _LAUNCHED.clear()


@pytest.hookimpl(trylast=True)  # after the fixtures are torn down
def pytest_runtest_teardown(item):
    if item.config.stash.get(_GUARD, None) is None or not _LAUNCHED:
        return
    launched, _LAUNCHED[:] = list(_LAUNCHED), []
    if not any(item.get_closest_marker(mark) for mark in _PROCESS_MARKS):
        pytest.fail(f"{item.nodeid} started a Python process ({launched[0]!r}) but is not "
                    "marked @pytest.mark.subprocess (or multiworker): a run that leaves "
                    "those out (`nox -s quick`) must start none. Fix: mark the test, or "
                    "every test using the fixture that starts it.", pytrace=False)
