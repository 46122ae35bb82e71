"""README.md and docs/: the page of figures is what benchmarks/run.py generates, links lead
somewhere, and the set-up commands stay on the first screen. (The keras3 session runs every
Python block of README.md and docs/ itself: noxfile.py.)"""

import importlib.util
import json
import os
import re

import pytest

from support import ROOT

PAGES = ["README.md", *sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md"))]


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _page_module():
    spec = importlib.util.spec_from_file_location(
        "objckpt_benchmarks_page", os.path.join(ROOT, "benchmarks", "page.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_page_is_generated_from_the_committed_results():
    page = _page_module()
    with open(os.path.join(ROOT, "benchmarks", "results.json")) as f:
        results = json.load(f)
    expected = page.render(results, results_path="benchmarks/results.json")
    assert _read("docs/benchmarks.md") == expected, (
        "docs/benchmarks.md differs from what benchmarks/run.py generates: run "
        "python3 benchmarks/run.py --render benchmarks/results.json --markdown docs/benchmarks.md")
    # Every figure on it comes from the results: each ratio's value is there.
    ratios = [row for section in results["sections"]
              for row in section["result"].get("ratios") or []]
    assert len(ratios) > 20
    for what, value, *_ in ratios:
        assert f"| {what.replace('|', chr(92) + '|')} | {page._number(value)} |" in expected


def test_page_renders_a_result_it_is_given():
    page = _page_module()
    text = page.render({
        "machine": {"cpus": 2, "cpu": "test CPU", "tensorflow": "9.9"},
        "settings": {"repeats": 3}, "command": "python3 benchmarks/run.py --repeats 3",
        "sections": [{"section": "cli", "title": "[cli] a model",
                      "result": {"ms": {"objckpt inspect": 120.04},
                                 "ratios": [["inspect / import tensorflow", 0.05, "<= 0.1x", True],
                                            ["diff / import tensorflow", 0.2, "<= 0.1x",
                                             False]]}}]})
    assert "2 CPUs (test CPU)" in text and "`repeats=3`" in text
    assert "### cli: a model" in text
    assert "| objckpt inspect | 120.0 |" in text
    assert "| diff / import tensorflow | 0.2 | <= 0.1x | **no** |" in text
    assert "Targets met in this run: 1 of 2. Not met:" in text
    assert "- cli: diff / import tensorflow 0.2 (target <= 0.1x)" in text


def test_page_renders_seconds_and_the_runs_merged_in():
    page = _page_module()
    text = page.render({
        "machine": {"cpus": 2}, "settings": {"repeats": 5},
        "command": "python3 benchmarks/run.py --repeats 5",
        "merged": [{"sections": ["remote"], "note": "shared cores",
                    "command": "python3 benchmarks/run.py --section remote --merge"}],
        "skipped": ["remote: s3: moto.server is not installed"],
        "sections": [{"section": "remote", "title": "[remote: gcs, 16 MiB] a module",
                      "result": {"s": {"objckpt.save": 1.25, "plain put_file": 1.0},
                                 "spread": {"objckpt.save": [1.2, 1.3],
                                            "plain put_file": [0.9, 1.1]},
                                 "ratios": [["save / put_file", 1.25, "<= 1.3x", True,
                                             [1.1, 1.4]],
                                            ["upload alone", 1.1, "", None, None]]}}]})
    assert "| operation | median s | min | max |" in text
    assert "| objckpt.save | 1.25 | 1.2 | 1.3 |" in text
    assert "| save / put_file | 1.25 | 1.1 .. 1.4 | <= 1.3x | yes |" in text
    assert "| upload alone | 1.1 | |  |  |" in text
    assert ("- sections remote measured by a later run, merged in: `python3 benchmarks/run.py "
            "--section remote --merge` (shared cores)") in text
    assert "- not measured: remote: s3: moto.server is not installed" in text
    assert "[remote](#remote)" in text and "Targets met in this run: 1 of 1." in text


@pytest.mark.parametrize("path", PAGES)
def test_relative_links_lead_to_files(path):
    text = _read(path)
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    missing = [link for link in local
               if not os.path.exists(os.path.join(ROOT, os.path.dirname(path), link))]
    assert not missing, f"{path} links to missing files: {missing}"


def test_readme_starts_with_the_two_set_up_commands_and_stays_short():
    lines = _read("README.md").splitlines()
    first_screen = "\n".join(lines[:24])
    assert "python3 -m pip install . && objckpt demo" in first_screen
    assert "python3 -m pip install nox && python3 -m nox" in first_screen
    assert len(lines) <= 450, len(lines)
    # .ci/run runs the second command, as the README says.
    assert "python3 -m nox" in _read(".ci/run")


@pytest.mark.parametrize("path", PAGES)
def test_python_blocks_are_meant_to_run(path):
    """Blocks that are not meant to run are ```text or ```console, never an unmarked fence
    (pytest-markdown-docs runs every ```python block; an unmarked one hides code from it)."""
    fences = re.findall(r"^```(.*)$", _read(path), re.M)
    openings = fences[0::2]
    assert all(info.split() and info.split()[0] in ("python", "text", "console")
               for info in openings), (path, openings)


def test_distributed_page_quotes_the_sharded_benchmark_as_recorded():
    """docs/distributed.md's table of the sharded benchmark holds results.json's figures."""
    with open(os.path.join(ROOT, "benchmarks", "results.json")) as f:
        sharded = json.load(f)["sharded"]
    seconds, ratios = sharded["s"], {row[0]: row[1] for row in sharded["ratios"]}
    page = _read("docs/distributed.md")
    for op, ours, theirs in (
            ("save", "objckpt.save(ckpt, prefix)",
             "tf.train.Checkpoint(model=model).write(prefix)"),
            ("restore", "objckpt.restore(ckpt, prefix)",
             "tf.train.Checkpoint(model=model).read(prefix).assert_consumed()")):
        memory = ratios[f"{ours}: coordinator peak RssAnon added, MiB (max over rounds)"]
        row = (f"| {op} | {seconds[ours]:.3f} s | {seconds[theirs]:.3f} s | "
               f"{ratios[f'{op}: tf.train.Checkpoint time / objckpt time']:.3f} | "
               f"{memory:.3f} MiB |")
        assert row in page, f"docs/distributed.md lacks {row!r}: quote benchmarks/results.json"
