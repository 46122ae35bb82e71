"""What many test files share: host copies of variables, bit-equality, changing every
variable, building an optimizer's slots, and the environment of a child Python process.

flavours.py builds the models; this module checks them. Both are imported by name from
tests/helpers/ (pyproject.toml's `pythonpath = ["tests/helpers"]`; a worker script run as a
child process finds them beside itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, ValuesView

import numpy as np

HELPERS = os.path.dirname(os.path.abspath(__file__))  # tests/helpers/: helpers, worker scripts
ROOT = os.path.dirname(os.path.dirname(HELPERS))


def values(what) -> dict:
    """Host copies {path: array} of every variable: `what` is a {path: variable} mapping
    (objckpt.tree's) or an object, whose objckpt.tree is taken."""
    if not isinstance(what, Mapping):
        import objckpt

        what = objckpt.tree(what)
    return {path: np.array(variable.numpy()) for path, variable in what.items()}


def config_folder(path, config: dict) -> str:
    """A folder at `path` (a pathlib.Path, made if needed) holding `config` as its
    config.json, as a Hugging Face folder has one; returns it as a str."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def by_source(rules) -> dict:
    """A rule set's rules by their source pattern."""
    return {rule.source: rule for rule in rules}


def bits(array) -> tuple:
    """What bit-equality compares: dtype, shape and bytes (a string tensor's strings)."""
    array = np.asarray(array)
    data = array.tolist() if array.dtype == object else array.tobytes()
    return str(array.dtype), array.shape, data


def assert_bits(before: dict, after: dict, what: str = ""):
    """The same paths in the same order, each with the same dtype, shape and bytes."""
    assert list(before) == list(after), (
        f"{what}: paths differ: {sorted(set(before) ^ set(after))[:6]}")
    changed = [p for p in before if bits(before[p]) != bits(after[p])]
    assert not changed, f"{what}: {len(changed)} variables differ: {changed[:5]}"


def owned_state(model) -> list:
    """(name, dtype, shape, bytes) of every variable of a compiled Keras model and of its
    optimizer, and of every replica's component of a distributed one, found without objckpt
    (an oracle that does not depend on objckpt.tree)."""
    owned = model.optimizer.variables
    owned = owned() if callable(owned) else owned
    out, seen = [], set()
    for variable in [*model.variables, *owned]:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        for part in getattr(variable, "values", (variable,)):
            value = np.array(part.numpy())
            out.append((part.name, value.dtype, value.shape, value.tobytes()))
    return out


def assert_state_unchanged(before: list, model) -> None:
    """`owned_state(model)` equals `before`, variable by variable."""
    after = owned_state(model)
    assert len(after) == len(before)
    changed = [b[0] for b, a in zip(before, after) if a != b]
    assert not changed, f"changed: {changed}"


def _variables(what) -> list:
    if isinstance(what, Mapping):
        return list(what.values())
    if isinstance(what, (list, tuple, ValuesView, Iterator)):
        return list(what)
    import objckpt

    return list(objckpt.tree(what).values())


def perturb(what, amount: float = 1.0) -> None:
    """Changes every variable: float and complex by +amount, integers by +7, bools flipped,
    strings with "!" appended. `what`: an object (its objckpt.tree), a {path: variable}
    mapping or an iterable of variables."""
    import tensorflow as tf

    for variable in _variables(what):
        dtype = variable.dtype.base_dtype
        if dtype == tf.string:
            variable.assign(tf.strings.join([variable, "!"]))
        elif dtype == tf.bool:
            variable.assign(tf.logical_not(variable))
        elif dtype.is_floating or dtype.is_complex:
            variable.assign_add(tf.cast(tf.fill(variable.shape, amount), dtype))
        else:
            variable.assign_add(tf.cast(tf.fill(variable.shape, 7), dtype))


def build_optimizer(model) -> None:
    """Creates a compiled Keras model's optimizer slots, as Keras's own loaders and `fit` do
    before the first step, in every flavour."""
    import objckpt

    objckpt._compat.build_optimizer(model.optimizer, model.trainable_variables)


def python_env(*paths, environ=None, **extra) -> dict:
    """The environment (os.environ, or `environ`) of a child Python process that imports the
    working tree's objckpt, the helpers of tests/ and `paths`, with `extra` variables set."""
    environ = os.environ if environ is None else environ
    path = [ROOT, HELPERS, *map(str, paths), os.environ.get("PYTHONPATH", "")]
    return dict(environ, PYTHONPATH=os.pathsep.join(p for p in path if p), **extra)


_TF_BLOCKED = ("import sys; sys.modules.update(dict.fromkeys(('tensorflow', 'keras', "
               "'tf_keras'), None)); sys.argv[0] = 'objckpt'; from objckpt import cli; cli.run()")


def run_cli(*args, blocked: bool = True, env=None, paths=(), cwd=None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `objckpt ARGS` as a fresh process from this checkout, with TensorFlow, Keras and
    tf_keras blocked from import (blocked=False: `python -m objckpt` as users run it, TF
    importable); `env`: the environment to start from (python_env adds this checkout, the
    helpers and `paths`); `cwd`: the folder it runs in."""
    command = ["-c", _TF_BLOCKED] if blocked else ["-m", "objckpt"]
    return subprocess.run([sys.executable, *command, *map(str, args)], capture_output=True,
                          text=True, env=python_env(*paths, environ=env), cwd=cwd,
                          timeout=timeout, check=False)


def cli_in_process(capsys, *argv) -> tuple[int, str, str]:
    """Runs `objckpt ARGV` in this process (`cli.main`, TF as the test left it), with pytest's
    `capsys`: (exit status, stdout, stderr)."""
    from objckpt import cli

    status = cli.main(cli._parse(["objckpt", *map(str, argv)]))
    out, err = capsys.readouterr()
    return status, out, err


# --- multi-worker launches -----------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    """`count` TCP ports of 127.0.0.1 free now (another process may take one before a worker
    binds it: launchers retry on TF's "Could not start gRPC server")."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def kill_group(process: subprocess.Popen) -> None:
    """Kills a process started with start_new_session=True and its children; waits for it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def start_cluster(argvs: list, logs: list, env: dict) -> list[subprocess.Popen]:
    """One tf.distribute worker process per argv (a cluster of len(argvs) on free local
    ports, TF_CONFIG naming each its task), each in its own session, its output in
    logs[i]. If one fails to start, those started are killed."""
    ports = free_ports(len(argvs))
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    try:
        for i, argv in enumerate(argvs):
            config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
            with open(logs[i], "w") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, *map(str, argv)], env=dict(env, TF_CONFIG=json.dumps(config)),
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True))
    except BaseException:
        for process in processes:
            kill_group(process)
        raise
    return processes

