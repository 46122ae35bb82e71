"""`objckpt.errors`: the families, the builtins each error keeps, the common attributes
(`problems`, `source`, `obj`, `fix`) on errors raised by real calls in every flavour, and
the multi-worker re-raise keeping the type and the attributes."""

from __future__ import annotations

import ast
import fcntl
import inspect
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._bundle import lock as _dirlock
from objckpt._planning import agree as _agree

from flavours import FLAVOURS, keras_for

# class -> (family, builtins it keeps)
TREE = {
    errors.CheckpointNotFoundError: (errors.SourceError, (FileNotFoundError,)),
    errors.CheckpointCorruptError: (errors.SourceError, (OSError,)),
    errors.NotObjectBasedError: (errors.SourceError, (ValueError,)),
    errors.UnsupportedFormatError: (errors.SourceError, (FileNotFoundError, TypeError)),
    errors.StructureMismatchError: (errors.MatchError, (ValueError,)),
    errors.AmbiguousMatchError: (errors.MatchError, (ValueError,)),
    errors.UntrackedVariableError: (errors.MatchError, (ValueError,)),
    errors.UnbuiltModelError: (errors.TargetError, (ValueError,)),
    errors.UnsupportedObjectError: (errors.TargetError, (TypeError,)),
    errors.DistributedVariableError: (errors.TargetError, (TypeError,)),
    errors.CloneError: (errors.TargetError, (TypeError,)),
    errors.DirectoryLockedError: (errors.DirectoryError, (BlockingIOError, OSError)),
    errors.CheckpointDirectoryError: (errors.DirectoryError, (FileExistsError, OSError)),
    errors.CheckpointWriteError: (errors.DirectoryError, (OSError,)),
    errors.InvalidArgumentError: (errors.UsageError, (ValueError,)),
    errors.TemplateError: (errors.UsageError, (RuntimeError,)),
    errors.GraphvizNotFoundError: (errors.UsageError, (FileNotFoundError,)),
    errors.MissingDependencyError: (errors.UsageError, (ImportError,)),
    errors.IncompatibleTensorFlowError: (errors.UsageError, (ImportError,)),
}
FAMILIES = (errors.SourceError, errors.MatchError, errors.TargetError, errors.DirectoryError,
            errors.UsageError)


def _defined_exceptions() -> set:
    return {cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException)
            and not issubclass(cls, Warning)
            and cls.__module__ == errors.__name__ and not name.startswith("_")}


def _defined_warnings() -> set:
    return {cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, Warning)
            and cls.__module__ == errors.__name__ and not name.startswith("_")}


def test_warnings_are_user_warnings_outside_the_error_families():
    assert {cls.__name__ for cls in _defined_warnings()} == {"BatchNormStatisticsWarning"}
    for cls in _defined_warnings():
        assert issubclass(cls, UserWarning) and not issubclass(cls, errors.ObjckptError)
        assert cls.__name__ in errors.__doc__


# --- the hierarchy --------------------------------------------------------------------------


def test_all_lists_every_exception_class_of_the_module():
    assert set(errors.__all__) == {cls.__name__ for cls in
                                   _defined_exceptions() | _defined_warnings()}
    assert "IncompatibleTensorFlowError" in errors.__all__
    assert errors.__all__ == sorted(errors.__all__)
    for name in errors.__all__:
        assert getattr(objckpt.errors, name) is getattr(errors, name)


def test_each_class_is_under_one_family_and_keeps_its_builtin():
    assert set(TREE) | set(FAMILIES) | {errors.ObjckptError} == _defined_exceptions()
    for family in FAMILIES:
        assert family.__bases__ == (errors.ObjckptError,), family
    for cls, (family, builtins) in TREE.items():
        assert [f for f in FAMILIES if issubclass(cls, f)] == [family], cls
        for builtin in builtins:
            assert issubclass(cls, builtin), (cls, builtin)
    assert issubclass(errors.AmbiguousMatchError, errors.StructureMismatchError)
    for cls in (errors.DistributedVariableError, errors.CloneError):
        assert issubclass(cls, errors.UnsupportedObjectError)


def test_the_module_docstring_draws_the_tree():
    doc = errors.__doc__
    for cls in _defined_exceptions():
        assert cls.__name__ in doc, cls
    # each class is drawn below its family
    for cls, (family, _) in TREE.items():
        assert doc.index(family.__name__) < doc.index(cls.__name__), cls


# --- the attributes -------------------------------------------------------------------------


def test_fix_is_parsed_from_the_message_and_an_explicit_one_wins():
    err = errors.InvalidArgumentError("Bad `x`: expected 1, received 2. Fix: pass x=1.")
    assert err.fix == "pass x=1."
    assert (err.problems, err.source, err.obj) == ((), None, None)
    # the last "Fix:" counts (a quoted error may hold one of its own)
    quoted = errors.ObjckptError("That error: A. Fix: a. Then: B.\nFix: b; or c.")
    assert quoted.fix == "b; or c."
    assert errors.TemplateError("failed, with no fix stated").fix is None
    assert errors.ObjckptError().fix is None
    explicit = errors.CheckpointCorruptError("Damaged. Fix: this.", fix="that", source="p")
    assert (explicit.fix, explicit.source) == ("that", "p")
    explicit.fix = None
    assert explicit.fix == "this."


def test_old_constructors_and_attributes_keep_working():
    mismatch = errors.StructureMismatchError("m", ("`a`: shape", "`b`: dtype"))
    assert mismatch.problems == ("`a`: shape", "`b`: dtype") and str(mismatch) == "m"
    untracked = errors.UntrackedVariableError("u", ("w (2,)",), obj="Model `m`")
    assert (untracked.problems, untracked.obj) == (("w (2,)",), "Model `m`")
    clone = errors.CloneError("c", "obj.log_file", int)
    assert (clone.path, clone.obj, clone.object_type) == ("obj.log_file", "obj.log_file", int)
    sharded = errors.DistributedVariableError("d", path="table", variable_type="ShardedVariable")
    assert (sharded.path, sharded.obj, sharded.variable_type) == ("table", "table",
                                                                   "ShardedVariable")
    locked = errors.DirectoryLockedError("l", directory="/run", holder="pid 1 on h")
    assert (locked.directory, locked.source, locked.holder) == ("/run", "/run", "pid 1 on h")
    written = errors.CheckpointWriteError("w", prefix="/run/ckpt-4")
    assert (written.prefix, written.source) == ("/run/ckpt-4", "/run/ckpt-4")
    found = errors.CheckpointDirectoryError("f", directory="/run", found=["/run/ckpt-1"])
    assert (found.directory, found.source, found.found) == ("/run", "/run", ("/run/ckpt-1",))
    # unset: the old empty defaults, the new None
    assert (errors.CloneError("c").path, errors.CloneError("c").obj) == ("", None)
    assert (errors.CheckpointWriteError("w").prefix, errors.CheckpointWriteError("w").source) \
        == ("", None)
    # an OSError built from one message keeps it as its text, with no errno
    assert (str(locked), locked.errno) == ("l", None)


def test_about_fills_only_what_is_unset():
    err = errors.CheckpointNotFoundError("n", source="/given")
    assert errors.about(err, source="/other", obj=tf.Module(name="net")) is err
    assert (err.source, err.obj) == ("/given", "Module `net`")
    snap = objckpt.Snapshot({"w": np.zeros(2, np.float32)})
    err = errors.StructureMismatchError("m")
    errors.about(err, source=snap, obj="a/path")
    assert (err.source, err.obj) == (repr(snap), "a/path")
    plain = ValueError("not ours")
    assert errors.about(plain, source="/p") is plain and not hasattr(plain, "source")


# --- real errors from real calls, in every flavour ------------------------------------------


def _dense(flavour: str, units: int, *, built: bool = True):
    if flavour == "module":
        net = tf.Module(name="net")
        net.kernel = tf.Variable(tf.ones((3, units)), name="kernel")
        return net
    keras = keras_for(flavour)
    layers = [keras.Input((3,))] if built else []
    return keras.Sequential([*layers, keras.layers.Dense(units, name="dense")], name="net")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """flavour -> the prefix of a 2-unit model's checkpoint (written once per flavour)."""
    out, root = {}, tmp_path_factory.mktemp("errors")

    def get(flavour):
        if flavour not in out:
            out[flavour] = objckpt.save(_dense(flavour, 2), str(root / flavour / "ckpt"))
        return out[flavour]

    return get


def test_missing_prefix_is_checkpoint_not_found_with_source_and_fix(tmp_path):
    net = _dense("module", 2)
    missing = str(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.restore(net, missing)
    err = info.value
    assert isinstance(err, errors.SourceError) and isinstance(err, FileNotFoundError)
    assert err.source == missing
    assert err.fix == "check the path, or pass the directory to use its newest checkpoint."
    assert str(err).endswith("Fix: " + err.fix)
    assert err.obj == "Module `net`" and err.problems == ()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_shape_mismatch_names_path_obj_source_and_fix(flavour, saved):
    prefix = saved(flavour)
    net = _dense(flavour, 4)
    before = [v.numpy().copy() for v in net.variables]
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(net, prefix)
    err = info.value
    assert type(err) is errors.StructureMismatchError
    assert isinstance(err, errors.MatchError) and isinstance(err, ValueError)
    assert err.source == prefix
    assert err.obj == ("Module `net`" if flavour == "module" else "Sequential `net`")
    kernel = [line for line in err.problems if "kernel" in line]
    assert kernel and "(3, 2)" in kernel[0] and "(3, 4)" in kernel[0], err.problems
    assert all(line in str(err) for line in err.problems)
    assert err.fix and str(err).rstrip().endswith(err.fix)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, net.variables))
    # from a Snapshot: the source is the Snapshot's repr
    snap = objckpt.snapshot(_dense(flavour, 2))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(net, snap)
    assert info.value.source == repr(snap) and info.value.obj == err.obj


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras", "keras2"])
def test_unbuilt_model_is_a_target_error_naming_the_obj(flavour, saved):
    prefix = saved(flavour)
    net = _dense(flavour, 2, built=False)
    with pytest.raises(errors.UnbuiltModelError) as info:
        objckpt.restore(net, prefix)
    err = info.value
    assert isinstance(err, errors.TargetError) and isinstance(err, ValueError)
    assert err.obj == "Sequential `net`" and err.source == prefix
    assert err.fix.startswith("build it first")


def test_ambiguous_match_is_a_structure_mismatch():
    module = tf.Module(name="net")
    module.w = tf.Variable(tf.zeros((2,)))
    source = objckpt.Snapshot({"w": [1.0, 2.0], "old_w": [3.0, 4.0]})
    with pytest.raises(errors.AmbiguousMatchError) as info:
        objckpt.restore(module, source, rules=[("^old_", "")])
    err = info.value
    assert isinstance(err, errors.StructureMismatchError) and isinstance(err, ValueError)
    assert err.problems == ("ambiguous, not guessed: `w` could be any of `w`, `old_w`",)
    assert (err.source, err.obj) == (repr(source), "Module `net`")
    np.testing.assert_array_equal(module.w.numpy(), [0.0, 0.0])


def test_unsupported_formats(tmp_path):
    net = _dense("module", 2)
    text = tmp_path / "weights.bin"
    text.write_text("not a checkpoint")
    with pytest.raises(errors.UnsupportedFormatError) as info:
        objckpt.restore(net, str(text))
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, errors.SourceError)
    assert err.source == str(text) and err.fix.startswith("pass the prefix")
    with pytest.raises(errors.UnsupportedFormatError) as info:
        objckpt.restore(net, {"w": 1})
    assert isinstance(info.value, TypeError)
    assert info.value.fix == "pass objckpt.snapshot(obj) or a path."
    assert info.value.source is not None and info.value.obj == "Module `net`"


def test_corrupt_index_names_its_prefix(tmp_path):
    (tmp_path / "fake.index").write_bytes(b"\x00" * 64 + os.urandom(64))
    with pytest.raises(errors.CheckpointCorruptError) as info:
        objckpt.restore(_dense("module", 2), str(tmp_path / "fake"))
    assert info.value.source == str(tmp_path / "fake")
    assert info.value.fix and isinstance(info.value, OSError)


def test_locked_directory_is_a_directory_error(tmp_path):
    lock = _dirlock.DirectoryLock(str(tmp_path))
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"pid 4242 on elsewhere\n")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(errors.DirectoryLockedError) as info:
            lock.acquire()
    finally:
        os.close(fd)
    err = info.value
    assert isinstance(err, errors.DirectoryError) and isinstance(err, BlockingIOError)
    assert err.source == err.directory == str(tmp_path)
    assert err.holder == "pid 4242 on elsewhere"
    assert err.fix == "stop the other training run, or give this run its own directory."


# --- the multi-worker re-raise --------------------------------------------------------------


def _agreed(monkeypatch, failure) -> tuple[errors.ObjckptError, str]:
    """What a worker whose checks passed raises when the other worker failed with `failure`:
    the failing worker's half of `agree_across_workers` (what it sends), then this one's
    (what it raises from what the all-gather returned)."""
    sent = {}

    def gather(variables, kind, message):
        if kind:
            sent["row"] = ("worker:1", kind, message)
            return None
        return [sent["row"]]

    monkeypatch.setattr(_compat, "gather_failures", gather)
    _agree.agree_across_workers({}, failure, "objckpt.restore")  # the failing worker
    with pytest.raises(errors.ObjckptError) as info:
        _agree.agree_across_workers({}, None, "objckpt.restore")
    return info.value, sent["row"][2]


@pytest.mark.parametrize("cls", sorted(_defined_exceptions(), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_agreed_error_keeps_every_type_and_its_attributes(monkeypatch, cls):
    failure = cls("Cannot restore `net/w`: expected (2,), received (3,). Fix: write it again.",
                  problems=("`net/w`: shape (3,) in the source but (2,) in the obj",),
                  source="/shared/ckpt-3", obj="Sequential `net`")
    agreed, _ = _agreed(monkeypatch, failure)
    assert type(agreed) is cls
    assert agreed.problems == failure.problems
    assert (agreed.source, agreed.obj, agreed.fix) == ("/shared/ckpt-3", "Sequential `net`",
                                                       "write it again.")
    message = str(agreed)
    assert "failed on worker worker:1 " in message
    assert f"That worker's error: {cls.__name__}: Cannot restore `net/w`" in message
    assert "Fix: the cause on worker worker:1" in message


def test_agreed_distributed_variable_error_keeps_its_extras(monkeypatch):
    failure = errors.DistributedVariableError(
        "Cannot restore `net.table`: a ShardedVariable. Fix: restore into unsharded "
        "variables.", path="net.table", variable_type="ShardedVariable")
    agreed, _ = _agreed(monkeypatch, failure)
    assert type(agreed) is errors.DistributedVariableError
    assert isinstance(agreed, errors.UnsupportedObjectError)
    assert (agreed.path, agreed.variable_type) == ("net.table", "ShardedVariable")
    locked = errors.DirectoryLockedError("In use. Fix: wait.", directory="/run",
                                         holder="pid 1 on h")
    agreed, _ = _agreed(monkeypatch, locked)
    assert (type(agreed), agreed.directory, agreed.holder) == (
        errors.DirectoryLockedError, "/run", "pid 1 on h")


def test_agreed_error_from_another_error_is_an_objckpt_error(monkeypatch):
    agreed, _ = _agreed(monkeypatch, tf.errors.InvalidArgumentError(None, None, "nan found"))
    assert type(agreed) is errors.ObjckptError
    assert "That worker's error: InvalidArgumentError: nan found." in str(agreed)
    assert (agreed.problems, agreed.source, agreed.obj) == ((), None, None)
    assert agreed.fix.startswith("the cause on worker worker:1")


def test_agreed_error_is_bounded_and_rendered_safely(monkeypatch):
    evil = "dense\x1b[2J\nkernel"
    failure = errors.StructureMismatchError(
        "x" * 50_000 + ". Fix: " + evil,
        tuple(f"`{evil}/{i}`: shape (3,) in the source but (2,) in the obj" + "é" * 400
              for i in range(5000)), source="/ckpt/" + "層" * 5000, obj=evil)
    agreed, sent = _agreed(monkeypatch, failure)
    assert len(sent.encode()) <= _agree.AGREED_BYTES
    json.loads(sent)  # whole, not cut by the row
    assert type(agreed) is errors.StructureMismatchError
    assert 0 < len(agreed.problems) < 5000
    assert agreed.problems[0].startswith("`dense\\x1b[2J\\nkernel/0`: shape (3,)")
    assert agreed.obj == "dense\\x1b[2J\\nkernel"
    assert all("\x1b" not in line and "\n" not in line for line in agreed.problems)
    assert "\x1b" not in str(agreed) and "\x1b" not in (agreed.fix or "")
    # few problems: all of them, and a long list ends with how many more there were
    many = errors.StructureMismatchError("m", tuple(f"`p{i}`: missing" for i in range(100)))
    agreed, _ = _agreed(monkeypatch, many)
    assert agreed.problems[:-1] == many.problems[:len(agreed.problems) - 1]
    assert agreed.problems[-1] == f"... {100 - len(agreed.problems) + 1} more"


# --- every raise site states its fix --------------------------------------------------------

_PACKAGE = os.path.dirname(objckpt.__file__)
# Calls whose message is built elsewhere, each checked where it is built: (file, a piece of
# the call's text) -> why it has no "Fix:" of its own.
_BUILT_ELSEWHERE = {
    ("callbacks.py", 'f"FreezeSchedule[{epoch}]: {err}"'):
        "wraps the Freezer's InvalidArgumentError, whose own message ends with its Fix: "
        "(those raise sites are scanned too)",
}


def _string_parts(node) -> list[str]:
    """The string constants in node: literals and the literal parts of f-strings."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _assigned(scope) -> dict:
    """name (or `.attribute`) -> the string parts of what is assigned to it in scope."""
    out: dict = {}
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                key = (target.id if isinstance(target, ast.Name)
                       else "." + target.attr if isinstance(target, ast.Attribute) else None)
                if key:
                    out.setdefault(key, []).extend(_string_parts(node.value))
    return out


def objckpt_error_calls(source: str, filename: str = "<scanned>") -> list:
    """(filename, line, class name, call text, its message's string parts) for every call of
    an objckpt error class in a module's source: `errors.X(...)`, or `X(...)` with X
    imported from objckpt.errors. A name or attribute the call uses (a message held in a
    variable, a module constant) adds the strings assigned to it in the enclosing function
    and at module level (an attribute: anywhere in the module)."""
    names = {cls.__name__ for cls in _defined_exceptions()}
    tree = ast.parse(source)
    imported = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "objckpt.errors"
                for alias in node.names if alias.name in names}
    module_level = _assigned(ast.Module(body=[n for n in tree.body if not isinstance(
        n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))], type_ignores=[]))
    everywhere = _assigned(tree)
    calls = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node
        if isinstance(node, ast.Call):
            fn = node.func
            name = (fn.attr if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name)
                    and fn.value.id == "errors" and fn.attr in names
                    else imported.get(fn.id) if isinstance(fn, ast.Name) else None)
            if name:
                parts = _string_parts(node)
                local = _assigned(function) if function is not None else {}
                for used in ast.walk(node):
                    if isinstance(used, ast.Name):
                        parts += local.get(used.id, []) + module_level.get(used.id, [])
                    elif isinstance(used, ast.Attribute):
                        parts += everywhere.get("." + used.attr, [])
                calls.append((filename, node.lineno, name, ast.get_source_segment(source, node),
                              parts))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return calls


def test_every_objckpt_error_raised_in_the_package_states_a_fix():
    """Each `errors.X(...)` in objckpt/ has a "Fix:" sentence in its message (so `err.fix`
    is set), found statically: the call's literal and f-string parts, or the text assigned to
    a variable it uses."""
    calls, missing, excused = [], [], set()
    for folder, _, files in os.walk(_PACKAGE):
        for name in sorted(files):
            if name.endswith(".py") and name != "errors.py":
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    calls += objckpt_error_calls(f.read(), os.path.relpath(path, _PACKAGE))
    for filename, line, cls, text, parts in calls:
        if any("Fix:" in part for part in parts):
            continue
        why = [key for key in _BUILT_ELSEWHERE
               if key[0] == os.path.basename(filename) and key[1] in text]
        if why:
            excused.update(why)
            continue
        missing.append(f"{filename}:{line} {cls}: {' '.join(text.split())[:120]}")
    assert len(calls) > 100, len(calls)  # the scan sees the package's raise sites
    assert not missing, "errors without a 'Fix:' sentence:\n" + "\n".join(missing)
    assert excused == set(_BUILT_ELSEWHERE)  # no stale excuse


def test_the_fix_scan_can_fail():
    module = '''
from objckpt import errors
from objckpt.errors import CloneError as Refused
_HINT = "Fix: install it."
def f(x, why):
    message = f"bad {x}. Fix: pass another."
    if x:
        raise errors.InvalidArgumentError(f"x must be 1. Received: {x!r}.")
    if why:
        raise errors.GraphvizNotFoundError("no dot. " + _HINT)
    if x is None:
        raise Refused(f"cannot copy {x}")
    raise errors.UnsupportedObjectError(message)
'''
    calls = objckpt_error_calls(module)
    assert [(c[2], any("Fix:" in p for p in c[4])) for c in calls] == [
        ("InvalidArgumentError", False), ("GraphvizNotFoundError", True),
        ("CloneError", False), ("UnsupportedObjectError", True)]


# --- source and obj at every public entry point ---------------------------------------------


def test_plan_errors_name_source_and_obj(tmp_path, saved):
    missing = str(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.plan(_dense("module", 2), missing)
    assert (info.value.source, info.value.obj) == (missing, "Module `net`")
    assert info.value.fix.startswith("check the path")
    empty = tf.Module(name="empty")
    with pytest.raises(errors.UnbuiltModelError) as info:
        objckpt.plan(empty, saved("module"))
    assert (info.value.source, info.value.obj) == (saved("module"), "Module `empty`")
    assert info.value.fix.startswith("build it first")
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.plan(_dense("module", 2), saved("module"), strict="yes")
    assert info.value.source == saved("module") and info.value.fix.startswith("pass strict=")


def test_migrate_errors_name_source_and_obj(tmp_path, saved):
    out = str(tmp_path / "out" / "ckpt")
    missing = str(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.migrate(_dense("module", 2), missing, out)
    assert (info.value.source, info.value.obj) == (missing, "Module `net`")
    net = _dense("module", 4)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.migrate(net, saved("module"), out)
    err = info.value
    assert (err.source, err.obj) == (saved("module"), "Module `net`")
    assert any("(3, 2)" in line and "(3, 4)" in line for line in err.problems), err.problems
    assert err.fix and not os.path.exists(os.path.dirname(out))


def test_migrate_refuses_a_directory_prefix_before_any_work(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    # the source is missing too: the prefix is checked first, before the source is opened
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.migrate(_dense("module", 2), str(tmp_path / "nowhere" / "ckpt"), str(folder))
    err = info.value
    assert "is a directory" in str(err) and err.source == str(folder)
    assert err.fix.startswith(f"pass a prefix inside it, such as `{folder / 'ckpt'}`")
    assert err.obj == "Module `net`"
    assert os.listdir(folder) == [] and not os.path.exists(str(folder) + ".index")


def test_restore_on_create_errors_name_source_and_obj(tmp_path, saved):
    missing = str(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.restore_on_create(_dense("module", 2), missing)
    assert (info.value.source, info.value.obj) == (missing, "Module `net`")
    net = _dense("module", 4)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore_on_create(net, saved("module"))
    err = info.value
    assert (err.source, err.obj) == (saved("module"), "Module `net`") and err.fix
    np.testing.assert_array_equal(net.kernel.numpy(), np.ones((3, 4), np.float32))


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_restore_on_create_error_at_build_names_source_and_obj(flavour, tmp_path):
    keras = keras_for(flavour)
    narrow = keras.layers.Dense(2, name="dense")
    narrow.build((None, 3))
    prefix = objckpt.save(narrow, str(tmp_path / "ckpt"))
    for source, shown in [(prefix, prefix), (objckpt.snapshot(narrow), None)]:
        wide = keras.layers.Dense(4, name="dense")
        pending = objckpt.restore_on_create(wide, source)
        with pytest.raises(errors.StructureMismatchError) as info:
            wide(tf.ones((1, 3)))
        # a Snapshot: its repr, as objckpt.restore sets it
        assert (info.value.source, info.value.obj) == (shown or repr(source), "Dense `dense`")
        assert "was created as float32(3, 4)" in str(info.value) and info.value.fix
        with pytest.raises(errors.StructureMismatchError) as info:
            pending.assert_done()
        assert (info.value.source, info.value.obj) == (shown or repr(source), "Dense `dense`")


@pytest.mark.parametrize("compiled", [False, True], ids=["planned", "restored"])
def test_load_ensemble_errors_name_the_member_source_and_the_template(tmp_path, saved,
                                                                      compiled):
    keras = keras_for("keras3")
    template = _dense("keras3", 2)
    if compiled:  # optimizer state moves: each member is restored on its own
        template.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    good, missing = saved("keras3"), str(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.load_ensemble(template, [good, missing])
    err = info.value
    assert (err.source, err.obj) == (missing, "Sequential `net`")
    assert str(err).startswith(f"member 1 (source `{missing}`)")
    wide = objckpt.save(_dense("keras3", 4), str(tmp_path / "wide" / "ckpt"))
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.load_ensemble(template, [good, wide])
    err = info.value
    assert (err.source, err.obj) == (wide, "Sequential `net`") and err.fix
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.load_ensemble(template, [])
    assert info.value.obj == "Sequential `net`" and info.value.fix.startswith("pass one source")


def test_other_entry_points_set_source_and_obj(tmp_path):
    missing = str(tmp_path / "nowhere" / "ckpt")
    for read in (objckpt.read_tree, objckpt.verify):
        with pytest.raises(errors.CheckpointNotFoundError) as info:
            read(missing)
        assert info.value.source == missing, read
    empty = tf.Module(name="empty")
    with pytest.raises(errors.UnbuiltModelError) as info:
        objckpt.save(empty, str(tmp_path / "ckpt"))
    assert (info.value.source, info.value.obj) == (str(tmp_path / "ckpt"), "Module `empty`")
    assert info.value.fix.startswith("build the model")
    for make in (objckpt.Freezer, objckpt.Twins):
        with pytest.raises(errors.UnbuiltModelError) as info:
            make(empty)
        assert info.value.obj == "Module `empty`" and info.value.fix.startswith("build"), make
    with pytest.raises(errors.InvalidArgumentError) as info:
        objckpt.CheckpointManager(_dense("module", 2), str(tmp_path / "run"), max_to_keep=0)
    assert (info.value.source, info.value.obj) == (str(tmp_path / "run"), "Module `net`")
