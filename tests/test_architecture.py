"""The package's architecture is a contract, checked on the source (no TF needed).

- `lint-imports` (import-linter, contracts in pyproject.toml `[tool.importlinter]`): imports
  flow down the sub-packages and down the modules inside each (function-body imports
  included), so there is no cycle; only `objckpt/_compat/` imports `tensorflow.python`,
  `keras.src` or `tf_keras.src` (tests/helpers/architecture_contracts.py); the TF-free modules
  reach no TensorFlow or Keras, through any chain. A deliberately bad import is shown to break them.
- What import-linter cannot see, checked here on the AST: no module uses another module's
  private name (`from objckpt._x.y import _z`, `y._z`); outside `_compat/`, `obj._name` (and
  `getattr(obj, "_name")`) is allowed only for names the same module defines (its own private
  attributes); `_compat`'s table of where each name lives matches its modules.
"""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: import-linter's own dependency
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "objckpt"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


SOURCES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def _unit(module: str) -> str:
    """What counts as one module for private names: a module, or the whole `_compat`."""
    return "objckpt._compat" if module.startswith("objckpt._compat") else module


# --- import-linter -----------------------------------------------------------------------

def _lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    command = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
           "COLUMNS": "300"}  # no wrapped lines
    return subprocess.run([*command, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.subprocess
def test_lint_imports_keeps_every_contract():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = CONFIG["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout
    for contract in contracts:
        assert f"{contract['name']} KEPT" in result.stdout


def _write(path: pathlib.Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.subprocess
def test_lint_imports_names_a_bad_import(tmp_path):
    """A copy of the package with four bad imports (function-body ones: those count too),
    each breaking its contract(s) alone (no chain through the others)."""
    shutil.copytree(PACKAGE, tmp_path / "objckpt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "tests" / "helpers").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "helpers" / "architecture_contracts.py",
                tmp_path / "tests" / "helpers")
    # up the sub-packages; up inside one; TF's private modules outside _compat; TF in a
    # TF-free module through another module
    _write(tmp_path / "objckpt/_inspect/graph.py",
           "\n\ndef _up():\n    from objckpt._ops import freeze\n\n    return freeze\n")
    _write(tmp_path / "objckpt/_bundle/index.py",
           "\n\ndef _up():\n    from objckpt._bundle import lock\n\n    return lock\n")
    _write(tmp_path / "objckpt/_planning/rules.py",
           "\n\ndef _private():\n    from tensorflow.python.ops import array_ops\n\n"
           "    return array_ops\n")
    _write(tmp_path / "objckpt/_training/retention.py",
           "\n\ndef _heavy():\n    from objckpt._bundle import fastio\n\n    return fastio\n")
    result = _lint_imports(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert f"Contracts: {len(CONFIG['contracts']) - 6} kept, 6 broken." in out, out
    assert "sub-packages import only the packages below them BROKEN" in out
    assert "objckpt._inspect.graph -> objckpt._ops.freeze" in out
    # graph reaching freeze also reaches TensorFlow through it
    assert "inspect, diff and graph of files import no TensorFlow or Keras BROKEN" in out
    assert "_bundle: modules import only the modules below them BROKEN" in out
    assert "objckpt._bundle.index -> objckpt._bundle.lock" in out
    assert "only _compat imports TF's and Keras's private modules BROKEN" in out
    assert ("objckpt._planning.rules -> tensorflow.python "
            "(l.") in out and "from tensorflow.python.ops import array_ops" in out
    assert ("the TF-free modules import no TensorFlow or Keras, directly or through others "
            "BROKEN") in out
    assert "objckpt._training.retention -> objckpt._bundle.fastio" in out
    # and NumPy, through the same imports
    assert "what callbacks import before fit (and objckpt.errors) imports no NumPy" in out
    assert "objckpt._bundle.fastio -> numpy" in out


def test_every_module_is_in_a_layers_contract():
    """A new module must be placed: in a sub-package's contract, or (public) in the top one."""
    placed = set()
    for contract in CONFIG["contracts"]:
        if contract["type"] != "layers":
            continue
        containers = contract.get("containers", [""])
        for container in containers:
            for layer in contract["layers"]:
                placed |= {f"{container}.{m.strip()}".lstrip(".") for m in layer.split("|")}
    unplaced = [m for m in SOURCES if m not in placed
                and m not in ("objckpt", "objckpt.__main__")
                and not m.startswith("objckpt._compat.")]  # _compat: one layer
    assert unplaced == []
    packages = {m for m in SOURCES if SOURCES[m].name == "__init__.py"} - {"objckpt"}
    assert packages <= placed  # every sub-package in the top contract


def test_compat_is_the_only_home_of_private_tf_modules_in_the_contract():
    contract = next(c for c in CONFIG["contracts"] if c["type"] == "private_externals")
    assert contract["allowed_modules"] == ["objckpt._compat"]
    assert sorted(contract["private_modules"]) == ["keras.src", "tensorflow.python",
                                                   "tf_keras.src"]


# --- what import-linter cannot check -----------------------------------------------------

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
            # `from objckpt._planning import tree` imports a module; `from
            # objckpt._planning.tree import x` names
            submodules = [n for n in names if f"{target}.{n}" in SOURCES]
            for name in submodules:
                yield node.lineno, f"{target}.{name}", ()
            others = [n for n in names if n not in submodules]
            if others or not submodules:
                yield node.lineno, target, tuple(others)


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


def _module_aliases(module: str, tree: ast.AST) -> dict[str, str]:
    """local name -> objckpt module, for `from objckpt.x import y as _y` and `import objckpt.x`."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("objckpt"):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in SOURCES:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SOURCES and alias.asname:
                    aliases[alias.asname] = alias.name
    return aliases


def test_no_private_names_across_modules():
    problems = []
    for module, tree in TREES.items():
        for line, target, names in _imports(module, tree):
            for name in names:
                if _is_private(name) and _unit(target) != _unit(module):
                    problems.append(f"{module}:{line} imports {target}.{name}")
        aliases = _module_aliases(module, tree)
        for line, name, value in _private_uses(tree):
            if isinstance(value, ast.Name) and value.id in aliases \
                    and _unit(aliases[value.id]) != _unit(module):
                problems.append(f"{module}:{line} uses {aliases[value.id]}.{name}")
    assert problems == []


def test_private_name_check_sees_aliased_modules():
    """The check above reads `from objckpt._base import render as _render`; `_render._x` is
    caught (so the rule can fail)."""
    tree = ast.parse("from objckpt._base import render as _render\n_render._secret()\n")
    aliases = _module_aliases("objckpt._ops.snapshot", tree)
    assert aliases == {"_render": "objckpt._base.render"}
    uses = [(name, value.id) for _, name, value in _private_uses(tree)]
    assert uses == [("_secret", "_render")]


@pytest.mark.parametrize("module", [m for m in SOURCES if _unit(m) != "objckpt._compat"])
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


def test_sub_packages_say_what_they_own():
    for module, tree in TREES.items():
        if SOURCES[module].name == "__init__.py" and module.count(".") == 1:
            doc = ast.get_docstring(tree) or ""
            assert len(doc) > 100 and "import" in doc, module
