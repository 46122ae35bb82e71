"""The layout is said in four places, and they agree: the files of objckpt/, the import-linter
contracts in pyproject.toml, docs/layout.md and each sub-package's `__init__` docstring; and
every module has its test file, found by its name.

- Every module file is in the contracts (a top-level module or package in the `packages`
  contract, a module (or package) of a sub-package in its package's contract, a module of a
  package inside a sub-package (`_ops/freeze/`) in that package's own contract; the packages
  in UNLAYERED have no contract of their own, with the reason) and in docs/layout.md, under
  its package (a nested package's modules indented two more spaces under its `name/` line),
  in the contracts' order (`a | b` in a contract: neighbours in any order); and the other way
  round.
- Each sub-package's `__init__` docstring, a nested package's too, names (in backticks) every
  module docs/layout.md lists under it (`hf_<name>` names every `hf_...` module).
- The test of `objckpt/<package>/<module>.py` is `tests/<package>/test_<module>.py` (a
  top-level module's: `tests/test_<module>.py`, a nested package's module's:
  `tests/<package>/<nested>/test_<module>.py`); more files about one module, or the files
  that split its tests by aspect, are `test_<module>_<aspect>.py`. A module without one is
  in NO_TEST_FILE with the reason; an entry there that has a test file, or that matches no
  module, is stale. Every test file in
  a package's folder is named after a module (or package) of that package.
- Every `tests/....py` path that the code, docs and configuration mention exists.

The checks read the files each time (no list of modules is written here), so a module added,
renamed or moved shows up at once; each check is also run on a doctored copy to show that it
fails on the drift it is there for.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import shutil
from dataclasses import dataclass, field

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: import-linter's own dependency
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Sub-packages without a layers contract of their own, and why.
UNLAYERED = {
    "_compat": "one module per topic behind one facade (`_compat/__init__` loads each name from "
               "its module; tests/test_architecture.py checks that table), no order between them",
}

# Modules without a test file named after them, and where they are tested instead. A pattern
# (`*`) exempts the modules it matches that have no test file.
NO_TEST_FILE = {
    "objckpt/callbacks.py": "each callback is tested with what it drives: Checkpointing and "
                            "BestSnapshot in _training/test_checkpointing.py, TwinSync in "
                            "_ops/test_twins.py, FreezeSchedule in _ops/freeze/test_freezer.py",
    "objckpt/_compat/*.py": "TF's and Keras's private APIs, tested through the operations that "
                            "use them in every flavour (tests/_compat/ holds the ones with a "
                            "behaviour of their own)",
    "objckpt/rules/hf_*.py": "each architecture's rule set is tested against keras-hub in "
                             "rules/test_huggingface_*.py",
    "objckpt/_base/roles.py": "a generated table: integration/test_cross_flavour.py checks it is "
                              "what helpers/make_role_aliases.py writes",
    "objckpt/_ops/slicemean.py": "the model-free average of tensors stored in slices, tested "
                                 "against what TF writes and reads in "
                                 "distributed/test_sharded_average_cli.py",
    "objckpt/_bundle/objgraph.py": "the object graph read without TF, tested against TF's reader "
                                   "in _inspect/test_meta.py and _inspect/test_graph.py",
    "objckpt/_cli/terminal.py": "the command line's words, tested in _inspect/test_meta.py",
    "objckpt/_formats/h5.py": "HDF5 read as untrusted input, tested with damaged and hostile "
                              "files in _formats/test_kerash5.py and test_legacyh5.py",
    "objckpt/_formats/savedobjects.py": "saved_model.pb decoded, tested in "
                                        "_formats/test_savedmodel.py",
    "objckpt/_ops/averagework.py": "what average does with each variable, tested through "
                                   "objckpt.average in _ops/test_average.py (held route) and "
                                   "_ops/test_average_undo.py (streamed route, undo log)",
    "objckpt/_ops/clone/*.py": "the copiers of each kind and the walk, tested through clone in "
                               "_ops/clone/test_api.py (every kind, sharing, cycles, weak "
                               "references) and the table's dispatch in _ops/clone/test_table.py",
    "objckpt/_ops/freeze/*.py": "the Freezer's parts (its routes, guard, skipped updates and "
                                "selection), tested through the Freezer in "
                                "_ops/freeze/test_freezer.py and _ops/freeze/test_fit.py, with "
                                "every optimizer kind",
    "objckpt/_planning/checks.py": "why a plan cannot be applied: the errors of "
                                   "_planning/test_match.py and _base/test_names.py",
    "objckpt/_planning/plans.py": "Plan and Match, tested through objckpt.plan in "
                                  "_planning/test_match.py and _base/test_names.py",
    "objckpt/_planning/sources.py": "the sources, tested through each format's tests "
                                    "(_formats/) and _planning/test_tree.py",
    "objckpt/_planning/strategies.py": "the whole-model strategies, tested in "
                                       "_planning/test_match.py and "
                                       "integration/test_cross_flavour.py",
    "objckpt/_planning/targets.py": "the obj's variables indexed, tested through every plan "
                                    "(_planning/test_match.py, _base/test_names.py)",
    "objckpt/_training/commit.py": "the commit protocol, tested by crashing a save at every "
                                   "stage in _training/test_checkpointing.py (SIGKILLs, debris "
                                   "cleaned, the newest checkpoint kept, the lock)",
    "objckpt/_training/multiworker.py": "the multi-worker protocol needs several processes: "
                                        "distributed/test_distribute_fit.py (a follower, each "
                                        "worker's failure) and distributed/test_multiworker.py",
    "objckpt/_training/fitckpt.py": "resuming `model.fit`, tested in "
                                    "_training/test_checkpointing.py and "
                                    "integration/test_resume.py",
}

# Test files at the top of tests/ that are about the whole package, not one module.
WHOLE_PACKAGE_TESTS = {
    "test_architecture.py": "the import contracts and the private-name rules, on the source",
    "test_layout.py": "this file",
}
# Folders of tests/ that are not a package of objckpt (fixtures/: data files, no tests).
OTHER_FOLDERS = {"integration", "distributed", "helpers", "fixtures", "__pycache__"}

# Where tests/ paths are mentioned (CHANGELOG.md is history: its paths are left as they were).
MENTIONS = ("objckpt", "docs", "benchmarks", "colab", "tests", "README.md", "noxfile.py",
            "pyproject.toml")


# --- reading the four places -----------------------------------------------------------------

def package_files(package: pathlib.Path, key: str = "") -> dict[str, list[str]]:
    """{"": the top-level modules and packages, "<sub-package>": its modules and packages,
    "<sub-package>/<package>": a package inside it, its modules, ...} from the files (each name
    without `.py`; `__init__` left out, `__main__` kept)."""
    found: dict[str, list[str]] = {key: []}
    for path in sorted(package.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            found[key].append(path.name)
            found.update(package_files(path, f"{key}/{path.name}".lstrip("/")))
        elif path.suffix == ".py" and path.stem != "__init__":
            found[key].append(path.stem)
    found[key].sort()
    return found


def dotted(key: str) -> str:
    """A package's key (`_ops/freeze`) as import-linter names it (`objckpt._ops.freeze`)."""
    return "objckpt" + ("." + key.replace("/", ".") if key else "")


def contract_layers(pyproject: dict, package: str = "objckpt") -> dict[str, list[set[str]]]:
    """{"": the `layers` contract over the top-level names, "<sub-package>": its contract's
    layers, "<sub-package>/<package>": a nested package's}, each layer a set of names (`a | b`
    and `a : b` are one layer)."""
    layers: dict[str, list[set[str]]] = {}
    for contract in pyproject["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        containers = contract.get("containers", [])
        for container in containers or [package]:
            key = "" if container == package else container[len(package) + 1:].replace(".", "/")
            prefix = "" if containers else package + "."
            layers[key] = [{name.strip(" ()")[len(prefix):] for name in re.split(r"[|:]", layer)}
                           for layer in contract["layers"]]
    return layers


@dataclass
class Entry:
    """One line of docs/layout.md's tree (a package's text includes its lines below it; its
    `children` are the entries of its modules and packages, `modules` their names)."""

    name: str
    package: bool
    text: str
    modules: list[str] = field(default_factory=list)
    children: list[Entry] = field(default_factory=list)


def layout_entries(markdown: str) -> list[Entry]:
    """The `objckpt/` tree of docs/layout.md: its top-level entries in order, each package's
    module and package lines in order (two more spaces of indent each level down; a line
    indented deeper than one level below the last package continues the line above)."""
    block = re.search(r"```text\nobjckpt/\n(.*?)```", markdown, re.S)
    assert block, "docs/layout.md has no ```text block starting with `objckpt/`"
    root = Entry("", True, "")
    open_: list[Entry] = [root]  # the last entry of each level, outermost first
    for line in block.group(1).splitlines():
        entry = re.match(r"^((?:  )+)(\w+)(\.py|/)(?=\s|$)(.*)$", line)
        depth = len(entry.group(1)) // 2 if entry else 0
        if entry and depth <= len(open_) and open_[depth - 1].package:
            del open_[depth:]
            last = Entry(entry.group(2), entry.group(3) == "/", entry.group(4))
            parent = open_[-1]
            parent.children.append(last)
            parent.modules.append(last.name)
            for above in open_[1:]:
                above.text += " " + last.name + last.text
            open_.append(last)
        elif line.strip():
            for above in open_[1:]:
                above.text += " " + line.strip()
    return root.children


def package_entries(entries: list[Entry], key: str = ""):
    """(key, entry) of every package entry of the tree, nested ones included (`_ops/freeze`)."""
    for entry in entries:
        if entry.package:
            at = f"{key}/{entry.name}".lstrip("/")
            yield at, entry
            yield from package_entries(entry.children, at)


def docstring_of(package: pathlib.Path, name: str) -> str:
    return ast.get_docstring(ast.parse((package / name / "__init__.py").read_text())) or ""


# --- the checks: each returns its problems, worded for the one who fixes them ----------------

def _order_problems(where: str, listed: list[str], layers: list[set[str]]) -> list[str]:
    """The names both list, in the contract's order (the names only one of them lists are
    the other checks' problems: each is compared with the files)."""
    names = set(listed) & set().union(*layers)
    listed = [name for name in listed if name in names]
    expected = [sorted(layer & names) for layer in layers if layer & names]
    at = 0
    for layer in expected:
        if sorted(listed[at:at + len(layer)]) != layer:
            return [f"{where} lists {listed}, the contract orders them {expected} "
                    "(`a | b`: neighbours, any order)"]
        at += len(layer)
    return []


def _key(package: str, name: str) -> str:
    """The key of `name` inside `package` (`_ops`, `freeze` -> `_ops/freeze`)."""
    return f"{package}/{name}".lstrip("/")


def contract_problems(files: dict, layers: dict) -> list[str]:
    """Every module file is in the contracts, and every name a contract lists is a file."""
    problems = []
    for package, modules in files.items():
        names = [m for m in modules if not m.startswith("__")]
        where = "objckpt/" + (package + "/" if package else "")
        if package in UNLAYERED:
            if package in layers:
                problems.append(f"{where} has a contract: take it out of UNLAYERED")
            continue
        if package not in layers:
            problems.append(f"{where} has no layers contract in pyproject.toml: add one "
                            f"(containers = [\"{dotted(package)}\"]) listing {names}")
            continue
        listed = {name for layer in layers[package] for name in layer}
        for name in sorted(set(names) - listed):
            shown = name + ("/" if _key(package, name) in files else ".py")
            problems.append(f"{where}{shown} is in no contract: add it to pyproject.toml's "
                            f"layers of {dotted(package)}")
        for name in sorted(listed - set(names)):
            problems.append(f"pyproject.toml's contract of {where} names `{name}`, which is "
                            "no module there")
    for package in sorted(set(layers) - set(files)):
        problems.append(f"pyproject.toml has a contract for {dotted(package)}, no such package")
    for package in sorted(set(UNLAYERED) - set(files)):
        problems.append(f"UNLAYERED names objckpt/{package}/, no such package")
    return problems


def layout_problems(files: dict, layers: dict, entries: list[Entry]) -> list[str]:
    """docs/layout.md lists every file under its package, in the contracts' order."""
    problems = []
    top = [e.name for e in entries]
    for name in sorted(set(files[""]) - set(top)):
        problems.append(f"docs/layout.md does not list objckpt/{name}")
    for name in sorted(set(top) - set(files[""]) - {"__init__"}):
        problems.append(f"docs/layout.md lists objckpt/{name}, which does not exist")
    if "" in layers:
        problems += _order_problems("docs/layout.md's top level", top, layers[""])
    for key, entry in package_entries(entries):
        if key not in files:
            continue  # a top-level one is reported above, a nested one under its package
        where = f"docs/layout.md under {key}/"
        modules = [m for m in files[key] if not m.startswith("__")]
        for name, child in zip(entry.modules, entry.children):
            shown = name + ("/" if child.package else ".py")
            if name not in modules:
                problems.append(f"{where}: lists {shown}, which does not exist")
            elif child.package != (_key(key, name) in files):
                problems.append(f"{where}: lists {shown}, which is a "
                                f"{'module' if child.package else 'package'}")
        if key in layers:
            for name in modules:
                if name not in entry.modules:
                    shown = name + ("/" if _key(key, name) in files else ".py")
                    problems.append(f"docs/layout.md does not list objckpt/{key}/{shown}")
            problems += _order_problems(where, entry.modules, layers[key])
        else:
            words = set(re.findall(r"\w+", entry.text))
            for name in modules:
                if name not in words:
                    problems.append(f"{where}: `{name}` is not named")
    return problems


def docstring_problems(entries: list[Entry], files: dict, docstrings: dict) -> list[str]:
    """Each sub-package's docstring (a nested package's too) names (in backticks) every module
    and package listed under it."""
    problems = []
    for key, entry in package_entries(entries):
        if key not in docstrings:
            continue
        named = re.findall(r"`([\w<>]+)`", docstrings[key])
        patterns = [re.sub(r"<\w+>", "*", n) for n in named]
        modules = entry.modules or [m for m in files.get(key, []) if not m.startswith("__")]
        for module in modules:
            if not any(fnmatch.fnmatchcase(module, p) for p in patterns):
                problems.append(f"objckpt/{key}/__init__.py's docstring does not name "
                                f"`{module}`, which docs/layout.md lists under it")
    return problems


def naming_problems(package: pathlib.Path, tests: pathlib.Path,
                       exempt: dict | None = None) -> list[str]:
    """Every module has tests/<package>/test_<module>.py or test_<module>_<aspect>.py (a nested
    package's module: tests/<package>/<nested>/test_<module>.py; or a reason in NO_TEST_FILE),
    and every test file of a package's folder is named after one of its modules or packages
    (`tests/_ops/test_freeze.py`: the tests of the package objckpt/_ops/freeze/ as a whole)."""
    exempt = NO_TEST_FILE if exempt is None else exempt
    files = package_files(package)
    problems, used = [], set()
    for sub, modules in files.items():
        for module in modules:
            if module.startswith("__") or _key(sub, module) in files:
                continue  # the facade, `python -m`; a package's modules are its own
            source = f"{package.name}/{sub + '/' if sub else ''}{module}.py"
            test = tests / sub / f"test_{module}.py"
            rules = [p for p in exempt if fnmatch.fnmatchcase(source, p)]
            used.update(rules)
            found = [test] if test.exists() else sorted(test.parent.glob(f"test_{module}_*.py"))
            if found:
                test = found[0]
                if source in exempt:
                    problems.append(f"{source} has {test.relative_to(tests.parent)}: take it "
                                    "out of NO_TEST_FILE")
            elif not rules:
                problems.append(f"{source} has no test file: write "
                                f"{test.relative_to(tests.parent)} (or say in NO_TEST_FILE "
                                "where it is tested)")
    for rule in sorted(set(exempt) - used):
        problems.append(f"NO_TEST_FILE names {rule}, which matches no module: take it out")
    folders = sorted(p for p in tests.rglob("*") if p.is_dir()
                     and p.relative_to(tests).parts[0] not in OTHER_FOLDERS
                     and p.name != "__pycache__")
    for folder in folders:
        key = folder.relative_to(tests).as_posix()
        if key not in files:
            if key.rpartition("/")[0] in files:  # else its parent folder is the problem
                others = "" if "/" in key else \
                    f" (others: {sorted(OTHER_FOLDERS - {'__pycache__'})})"
                problems.append(f"tests/{key}/ is named after no package of objckpt/"
                                f"{key.rpartition('/')[0] + '/' if '/' in key else ''}{others}")
            continue
        for test in sorted(folder.glob("test_*.py")):
            stem = test.stem[len("test_"):]
            if not any(stem == m or stem.startswith(m + "_") for m in files[key]):
                problems.append(f"tests/{key}/{test.name} is named after no module of "
                                f"objckpt/{key}/: test_<module>[_<aspect>].py")
    for test in sorted(tests.glob("test_*.py")):
        if test.stem[len("test_"):] not in files[""] and test.name not in WHOLE_PACKAGE_TESTS:
            problems.append(f"tests/{test.name} is named after no top-level module of "
                            f"{package.name}/ (nor in WHOLE_PACKAGE_TESTS)")
    return problems


def mention_problems(root: pathlib.Path) -> list[str]:
    """Every `tests/....py` path the code, docs and configuration mention exists."""
    problems = []
    for place in MENTIONS:
        paths = [root / place] if (root / place).is_file() else sorted(
            p for p in (root / place).rglob("*") if p.suffix in (".py", ".md", ".toml"))
        for path in paths:
            if path == pathlib.Path(__file__).resolve():
                continue  # its examples of drift
            text = path.read_text(encoding="utf-8")
            for mention in sorted(set(re.findall(r"(?<![\w/.])tests/[\w/]*\w\.py\b", text))):
                if not (root / mention).exists():
                    problems.append(f"{path.relative_to(root)} mentions {mention}, which "
                                    "does not exist")
    return problems


# --- the checks on this repository -----------------------------------------------------------

def _read(root: pathlib.Path = ROOT):
    package = root / "objckpt"
    files = package_files(package)
    layers = contract_layers(tomllib.loads((root / "pyproject.toml").read_text()))
    entries = layout_entries((root / "docs" / "layout.md").read_text())
    docstrings = {name: docstring_of(package, name) for name in files if name}
    return files, layers, entries, docstrings


def test_every_module_file_is_in_the_contracts():
    files, layers, _, _ = _read()
    assert contract_problems(files, layers) == []


def test_layout_md_lists_every_module_in_the_contracts_order():
    files, layers, entries, _ = _read()
    assert layout_problems(files, layers, entries) == []


def test_package_docstrings_name_the_modules_of_the_layout():
    files, _, entries, docstrings = _read()
    assert docstring_problems(entries, files, docstrings) == []


def test_every_module_has_its_test_file():
    assert naming_problems(ROOT / "objckpt", ROOT / "tests") == []


def test_every_mentioned_test_path_exists():
    assert mention_problems(ROOT) == []


# --- each check fails on the drift it is there for (doctored copies) ------------------------

@pytest.fixture
def copy(tmp_path):
    """objckpt/, tests/ (its files' names only), pyproject.toml and docs/layout.md copied."""
    shutil.copytree(ROOT / "objckpt", tmp_path / "objckpt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for test in (ROOT / "tests").rglob("test_*.py"):
        target = tmp_path / test.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "layout.md", tmp_path / "docs")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _all_problems(root: pathlib.Path) -> list[str]:
    files, layers, entries, docstrings = _read(root)
    return (contract_problems(files, layers) + layout_problems(files, layers, entries)
            + docstring_problems(entries, files, docstrings)
            + naming_problems(root / "objckpt", root / "tests"))


def _edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_copy_has_no_problem(copy):
    assert _all_problems(copy) == []


def test_a_new_module_is_missed_in_every_place(copy):
    (copy / "objckpt" / "_bundle" / "extra.py").write_text('"""A new module."""\n')
    problems = _all_problems(copy)
    assert problems == [
        "objckpt/_bundle/extra.py is in no contract: add it to pyproject.toml's layers of "
        "objckpt._bundle",
        "docs/layout.md does not list objckpt/_bundle/extra.py",
        "objckpt/_bundle/extra.py has no test file: write tests/_bundle/test_extra.py (or say "
        "in NO_TEST_FILE where it is tested)",
    ], problems


def test_a_module_listed_out_of_order_or_gone(copy):
    files, layers, entries, _ = _read(copy)
    bundle = next(e for e in entries if e.name == "_bundle")
    bundle.modules[0], bundle.modules[1] = bundle.modules[1], bundle.modules[0]
    swapped = layout_problems(files, layers, entries)
    assert len(swapped) == 1 and swapped[0].startswith("docs/layout.md under _bundle/ lists ")
    assert "the contract orders them" in swapped[0]
    layers["_bundle"].append({"gone"})
    gone = contract_problems(files, layers)
    assert gone == ["pyproject.toml's contract of objckpt/_bundle/ names `gone`, which is no "
                    "module there"]


def test_a_package_listed_out_of_the_contracts_order(copy):
    files, layers, entries, _ = _read(copy)
    first, second = (i for i, e in enumerate(entries) if e.name in ("_planning", "_inspect"))
    entries[first], entries[second] = entries[second], entries[first]
    problems = layout_problems(files, layers, entries)
    assert len(problems) == 1 and problems[0].startswith("docs/layout.md's top level lists ")


def test_a_layer_group_may_be_listed_in_any_order(copy):
    files, layers, entries, _ = _read(copy)
    group = next(layer for layer in layers["rules"] if len(layer) > 1)
    rules = next(e for e in entries if e.name == "rules")
    at = [i for i, m in enumerate(rules.modules) if m in group]
    rules.modules[at[0]], rules.modules[at[-1]] = rules.modules[at[-1]], rules.modules[at[0]]
    assert layout_problems(files, layers, entries) == []


def test_a_docstring_that_forgets_a_module(copy):
    _edit(copy / "objckpt" / "_inspect" / "__init__.py", "(`verify`)", "(verify)")
    assert _all_problems(copy) == [
        "objckpt/_inspect/__init__.py's docstring does not name `verify`, which docs/layout.md "
        "lists under it"]


def test_a_module_of_an_unlayered_package_named_nowhere(copy):
    files, layers, entries, _ = _read(copy)
    files["_compat"].append("novel")
    assert layout_problems(files, layers, entries) == [
        "docs/layout.md under _compat/: `novel` is not named"]


def test_test_files_that_drift(copy):
    tests = copy / "tests"
    (tests / "_ops" / "test_renamed_module.py").write_text("")
    (tests / "_bundle" / "test_state.py").rename(tests / "_bundle" / "test_stat.py")
    (tests / "renamed_package").mkdir()
    problems = naming_problems(copy / "objckpt", tests)
    assert problems == [
        "objckpt/_bundle/state.py has no test file: write tests/_bundle/test_state.py (or say "
        "in NO_TEST_FILE where it is tested)",
        "tests/_bundle/test_stat.py is named after no module of objckpt/_bundle/: "
        "test_<module>[_<aspect>].py",
        "tests/_ops/test_renamed_module.py is named after no module of objckpt/_ops/: "
        "test_<module>[_<aspect>].py",
        "tests/renamed_package/ is named after no package of objckpt/ (others: ['distributed', "
        "'fixtures', 'helpers', 'integration'])",
    ], problems


def test_stale_exemptions(copy):
    exempt = {**NO_TEST_FILE, "objckpt/_ops/clone/api.py": "tested elsewhere",
              "objckpt/_ops/clone.py": "a module that became a package",
              "objckpt/_gone/*.py": "a package that was renamed"}
    assert naming_problems(copy / "objckpt", copy / "tests", exempt) == [
        "objckpt/_ops/clone/api.py has tests/_ops/clone/test_api.py: take it out of "
        "NO_TEST_FILE",
        "NO_TEST_FILE names objckpt/_gone/*.py, which matches no module: take it out",
        "NO_TEST_FILE names objckpt/_ops/clone.py, which matches no module: take it out",
    ]


def test_a_mention_of_a_moved_test_file(tmp_path):
    (tmp_path / "tests" / "_ops").mkdir(parents=True)
    (tmp_path / "tests" / "_ops" / "test_clone.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "See tests/_ops/test_clone.py and tests/test_clone.py; not a/tests/x.py.\n")
    assert mention_problems(tmp_path) == [
        "docs/a.md mentions tests/test_clone.py, which does not exist"]


# --- a package inside a package (objckpt/_ops/freeze/): the same checks one level down -----

def test_a_new_module_of_a_nested_package_is_missed_in_every_place(copy):
    (copy / "objckpt" / "_ops" / "freeze" / "extra.py").write_text('"""A new module."""\n')
    problems = _all_problems(copy)
    assert problems == [
        "objckpt/_ops/freeze/extra.py is in no contract: add it to pyproject.toml's layers "
        "of objckpt._ops.freeze",
        "docs/layout.md does not list objckpt/_ops/freeze/extra.py",
    ], problems  # (its test file: NO_TEST_FILE's `objckpt/_ops/freeze/*.py` says where)
    exempt = {k: v for k, v in NO_TEST_FILE.items() if not k.startswith("objckpt/_ops/freeze")}
    assert "objckpt/_ops/freeze/extra.py has no test file: write "\
        "tests/_ops/freeze/test_extra.py (or say in NO_TEST_FILE where it is tested)" in \
        naming_problems(copy / "objckpt", copy / "tests", exempt)


def test_a_new_nested_package_is_missed_in_every_place(copy):
    package = copy / "objckpt" / "_ops" / "novel"
    package.mkdir()
    (package / "__init__.py").write_text('"""A new package: `part`."""\n')
    (package / "part.py").write_text('"""Its module."""\n')
    problems = _all_problems(copy)
    assert problems == [
        "objckpt/_ops/novel/ is in no contract: add it to pyproject.toml's layers of "
        "objckpt._ops",
        "objckpt/_ops/novel/ has no layers contract in pyproject.toml: add one (containers = "
        "[\"objckpt._ops.novel\"]) listing ['part']",
        "docs/layout.md does not list objckpt/_ops/novel/",
        "objckpt/_ops/novel/part.py has no test file: write tests/_ops/novel/test_part.py (or "
        "say in NO_TEST_FILE where it is tested)",
    ], problems


def test_a_nested_package_out_of_order_listed_as_a_module_or_gone(copy):
    files, layers, entries, _ = _read(copy)
    freeze = next(c for e in entries if e.name == "_ops" for c in e.children if c.name == "freeze")
    freeze.modules[0], freeze.modules[-1] = freeze.modules[-1], freeze.modules[0]
    swapped = layout_problems(files, layers, entries)
    assert len(swapped) == 1 and swapped[0].startswith("docs/layout.md under _ops/freeze/ lists ")
    _edit(copy / "docs" / "layout.md", "    freeze/  ", "    freeze.py")
    files, layers, entries, _ = _read(copy)
    assert layout_problems(files, layers, entries) == [
        "docs/layout.md under _ops/: lists freeze.py, which is a package"]
    _edit(copy / "pyproject.toml", 'containers = ["objckpt._ops.freeze"]',
          'containers = ["objckpt._ops.frozen"]')
    files, layers, _, _ = _read(copy)
    assert contract_problems(files, layers) == [
        "objckpt/_ops/freeze/ has no layers contract in pyproject.toml: add one (containers = "
        "[\"objckpt._ops.freeze\"]) listing ['fit', 'freezer', 'guard', 'routes', 'selection', "
        "'skip']",
        "pyproject.toml has a contract for objckpt._ops.frozen, no such package"]


def test_a_nested_docstring_that_forgets_a_module(copy):
    _edit(copy / "objckpt" / "_ops" / "freeze" / "__init__.py", "`guard`", "guard")
    assert _all_problems(copy) == [
        "objckpt/_ops/freeze/__init__.py's docstring does not name `guard`, which "
        "docs/layout.md lists under it"]


def test_test_files_of_a_nested_package_that_drift(copy):
    tests = copy / "tests" / "_ops"
    (tests / "freeze" / "test_nothing.py").write_text("")
    (tests / "gone").mkdir()
    (tests / "gone" / "test_x.py").write_text("")
    assert naming_problems(copy / "objckpt", copy / "tests") == [
        "tests/_ops/freeze/test_nothing.py is named after no module of objckpt/_ops/freeze/: "
        "test_<module>[_<aspect>].py",
        "tests/_ops/gone/ is named after no package of objckpt/_ops/",
    ]
