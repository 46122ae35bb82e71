"""The package's layering is a contract, checked on the source (no TF needed).

- Imports flow one way: a module imports only modules below it in `LAYERS` (function-body
  imports included), so there is no cycle.
- No module uses another module's private name (`from objckpt._x import _y`, `_x._y`).
- Only `objckpt/_compat/` touches `tensorflow.python`, `keras.src` or private TF/Keras
  attributes: outside it, `obj._name` (and `getattr(obj, "_name")`) is allowed only for names
  the same module defines (its own private attributes).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "objckpt"

# Bottom to top. A module may import only modules listed before it.
LAYERS = [
    "objckpt.errors",
    "objckpt._base",  # the sub-packages' __init__ modules (docstrings, no imports)
    "objckpt._bundle",
    "objckpt._formats",
    "objckpt._planning",
    "objckpt._inspect",
    "objckpt._ops",
    "objckpt._training",
    "objckpt._cli",
    "objckpt._base.api",  # pure: the calling convention, old argument orders detected and warned
    "objckpt._base.options",  # pure: argument checks of checkpoint directories (no TF)
    "objckpt._base.render",  # pure: text for people
    "objckpt._base.paths",  # pure: the path grammar
    "objckpt._base.names",  # pure: layer names and slot owners from saved variable names
    "objckpt._bundle.index",  # pure: TF's index table, read and validated before TF reads it
    "objckpt._bundle.objgraph",  # pure: the object graph entry, read and decoded without TF
    "objckpt._bundle.write",  # TF's bundle format written: data file layout, index table
    "objckpt._base.roles",
    "objckpt._compat",  # the package and its submodules
    "objckpt._bundle.fastio",  # parallel writes and RestoreV2, crc32c checks, direct restore
    "objckpt._bundle.state",  # the `checkpoint` state file: its one reader, one writer, meaning
    "objckpt._bundle.files",
    "objckpt._formats.savedobjects",  # pure: saved_model.pb decoded (its variables)
    "objckpt._formats.savedmodel",  # SavedModel directories as sources (no TF)
    "objckpt._formats.h5",  # pure: HDF5 files read as untrusted input (h5py, no TF)
    "objckpt._formats.kerash5",  # Keras 3 `.weights.h5` and `.keras` files as sources (no TF)
    "objckpt._formats.legacyh5",  # Keras 2 / tf_keras HDF5 weights and `.h5` models (no TF import)
    "objckpt._formats.registry",  # pure: the format registry (recognise, list, open, verify)
    "objckpt._inspect.meta",  # pure: a checkpoint's variables from its metadata (CLI inspect/diff)
    "objckpt._bundle.lock",
    "objckpt._planning.tree",
    "objckpt._planning.sources",
    "objckpt._planning.rules",
    "objckpt._planning.targets",
    "objckpt._planning.optstate",
    "objckpt._planning.plans",  # Plan and Match; a matched pair checked, problems worded
    "objckpt._planning.strategies",  # whole-model strategies: keras name, structure, export order
    "objckpt._planning.match",
    "objckpt._planning.checks",
    "objckpt._planning.pipeline",  # the one restore pipeline: open, plan, check, agree, fetch
    "objckpt._ops.snapshot",
    "objckpt._inspect.verify",
    "objckpt._inspect.diff",
    "objckpt._inspect.graph",
    "objckpt._ops.deferred",
    "objckpt._ops.migrate",
    "objckpt._ops.clone",
    "objckpt._ops.twins",
    "objckpt._ops.ensemble",
    "objckpt._ops.freeze",
    "objckpt._training.asyncwrite",
    "objckpt._training.retention",  # pure: which checkpoints of a directory to keep (Kept, policy)
    "objckpt._training.checkpointing",
    "objckpt._training.fitckpt",
    "objckpt.callbacks",
    "objckpt._training.manager",  # CheckpointManager: Checkpointing's directory, custom loops
    "objckpt",  # the public facade (imports the modules above lazily)
    "objckpt._cli.demo",  # uses the public API, as users do
    "objckpt._cli.terminal",  # the command line's words, TF's start-up noise kept off stderr
    "objckpt.cli",  # nothing imports it but __main__
    "objckpt.__main__",
]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> str:
    """The LAYERS entry a module belongs to (`objckpt._compat.graph` -> `objckpt._compat`)."""
    owners = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return max(owners, key=len) if owners else None


SOURCES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def _imports(module: str, tree: ast.AST):
    """(line, imported objckpt module, imported names) for every import in the module."""
    package = module if SOURCES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "objckpt":
                    yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "objckpt":
                continue
            names = [a.name for a in node.names]
            # `from objckpt._planning import tree` imports a module; `from objckpt._planning.tree
            # import x` names
            submodules = [n for n in names if f"{target}.{n}" in SOURCES]
            for name in submodules:
                yield node.lineno, f"{target}.{name}", ()
            others = [n for n in names if n not in submodules]
            if others or not submodules:
                yield node.lineno, target, tuple(others)


def test_every_module_has_a_layer():
    assert [m for m in SOURCES if _layer(m) is None] == []


def test_imports_flow_down():
    problems = []
    for module, tree in TREES.items():
        rank = LAYERS.index(_layer(module))
        for line, target, _ in _imports(module, tree):
            if _layer(target) == _layer(module):
                continue  # inside one layer (the _compat package)
            if LAYERS.index(_layer(target)) >= rank:
                problems.append(f"{SOURCES[module].name}:{line} {module} imports {target}")
    assert problems == []


def _defined_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, assignments, dataclass fields,
    parameters, attributes it sets on `self`/`cls`, and `_objckpt...` attributes it sets on
    other objects."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and (
                (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                or node.attr.startswith("_objckpt")):
            names.add(node.attr)  # our own attributes (on foreign objects: `_objckpt...`)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            names.add(node.args[1].value)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(tree: ast.AST):
    """(line, name) for `x._name` attribute reads and `getattr/hasattr(x, "_name")`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            yield node.lineno, node.attr, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _is_private(node.args[1].value):
            yield node.lineno, node.args[1].value, node.args[0]


def test_no_private_names_across_modules():
    problems = []
    for module, tree in TREES.items():
        modules = {alias.asname or alias.name for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names
                   if alias.name.startswith("_") or alias.name.startswith("objckpt")}
        for line, target, names in _imports(module, tree):
            for name in names:
                if _is_private(name) and _layer(target) != _layer(module):
                    problems.append(f"{SOURCES[module].name}:{line} imports {target}.{name}")
        for line, name, value in _private_uses(tree):
            if isinstance(value, ast.Name) and value.id in modules:
                target = SOURCES.get(f"objckpt.{value.id}") or SOURCES.get(value.id)
                if _layer(f"objckpt.{value.id}") != _layer(module):
                    problems.append(f"{SOURCES[module].name}:{line} uses {value.id}.{name}")
    assert problems == []


@pytest.mark.parametrize("module", [m for m in SOURCES if _layer(m) != "objckpt._compat"])
def test_private_tf_and_keras_only_in_compat(module):
    tree = TREES[module]
    source = SOURCES[module].read_text()
    problems = [f"mentions {text}" for text in ("tensorflow.python", "keras.src")
                if text in source]
    own = _defined_names(tree)
    for line, name, _ in _private_uses(tree):
        if name not in own:
            problems.append(f"line {line}: ._{name.lstrip('_')} is not this module's")
    assert problems == []


def _all_of(tree: ast.AST) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            return [element.value for element in node.value.elts]
    return []


def test_compat_names_load_from_where_the_table_says():
    where = next(node.value for node in TREES["objckpt._compat"].body
                 if isinstance(node, ast.Assign) and node.targets[0].id == "_WHERE")
    table = {key.value: sorted(e.value for e in value.elts)
             for key, value in zip(where.keys, where.values)}
    submodules = {m.rsplit(".", 1)[1]: sorted(_all_of(t)) for m, t in TREES.items()
                  if m.startswith("objckpt._compat.")}
    assert table == submodules
    names = [name for names in table.values() for name in names]
    assert len(names) == len(set(names))  # one home per name


def test_tf_free_modules_import_no_tensorflow():
    """`callbacks` (constructed before fit) and the helpers it uses must stay cheap."""
    for module in ("objckpt._compat", "objckpt._compat.hooks", "objckpt._base.render",
                   "objckpt._base.paths", "objckpt._base.names", "objckpt.errors",
                   "objckpt._base.options",
                   "objckpt._training.retention", "objckpt._bundle.state"):
        imported = {alias.name.split(".")[0] for node in ast.walk(TREES[module])
                    if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in (node.names if isinstance(node, ast.Import)
                                  else [ast.alias(node.module or "")])}
        assert not imported & {"tensorflow", "keras", "tf_keras", "numpy"}, module
