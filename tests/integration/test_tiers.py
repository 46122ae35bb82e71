"""The test tiers: the markers pyproject.toml declares, the quick run's marker
expression in noxfile.py, and conftest.py's guard that fails a quick-run test that starts a
Python process without the `subprocess` mark."""

from __future__ import annotations

import ast
import os
import re

import pytest

from support import ROOT

TIERS = {"slow", "multiworker", "subprocess", "fuzz"}


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _noxfile():
    """(QUICK, nox.options.sessions, the session functions' names) read from noxfile.py
    without importing nox."""
    tree = ast.parse(_read("noxfile.py"))
    quick = sessions = None
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            target = ast.unparse(node.targets[0])
            if target == "QUICK":
                quick = ast.literal_eval(node.value)
            elif target == "nox.options.sessions":
                sessions = ast.literal_eval(node.value)
    return quick, sessions, functions


def test_the_quick_run_leaves_out_every_declared_tier_and_only_those(pytestconfig):
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert declared >= TIERS, declared
    assert "--strict-markers" in pytestconfig.getini("addopts")
    quick, sessions, functions = _noxfile()
    assert set(re.findall(r"not (\w+)", quick)) == TIERS, quick
    assert re.fullmatch(r"not \w+( and not \w+)*", quick), quick
    # The matrix is the four sessions; the quick one is asked for by name.
    assert sessions == ["keras3", "tf_keras", "tf216", "keras2"]
    assert "quick" in functions and "quick" not in sessions
    assert "nox -s quick" in _read("README.md")


GUARDED = '''
import subprocess, sys
import pytest

def test_unmarked_launch():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.subprocess
def test_marked_launch():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_no_launch():
    subprocess.run(["true"], check=True)  # not Python: not counted
'''


@pytest.mark.subprocess
def test_guard_fails_a_quick_run_test_that_starts_python_unmarked(pytester):
    pytester.makeconftest(_read("tests/conftest.py"))
    markers = "\n".join(f"    {name}: a tier" for name in sorted(TIERS))
    pytester.makeini(f"[pytest]\naddopts = --strict-markers\nmarkers =\n{markers}\n")
    pytester.makepyfile(test_guarded=GUARDED)
    quick, _, _ = _noxfile()
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", quick)
    result.assert_outcomes(passed=2, errors=1, deselected=1)
    result.stdout.fnmatch_lines(["*test_unmarked_launch started a Python process*"
                                 "not marked @pytest.mark.subprocess*"])
    # Everything runs in the full matrix: no guard there.
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=3)
