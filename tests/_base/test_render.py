"""Names read from a checkpoint are data: every text output shows them escaped (invariant 2).

A crafted object name can hold a newline (forging rows of a table), ANSI/OSC escape sequences
(clearing the screen, retitling the terminal), NUL, C1 controls or bidi overrides. Text output
shows them as visible escapes (`\\n`, `\\x1b`, `\\u202e`); JSON output keeps them as data.
At the end, the other renderings of `objckpt._base.render`: sizes, shapes, counts, lists.
"""

import json
import os
import textwrap
import unicodedata

import pytest
import tensorflow as tf

import objckpt
from objckpt import cli, errors
from objckpt._base import render as _render

from support import cli_in_process, run_cli

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# Hostile names and how text output shows them.
HOSTILE = {
    "a\nb": "a\\nb",
    "evil\x1b[31m\nname": "evil\\x1b[31m\\nname",
    "cls\x1b[2J": "cls\\x1b[2J",
    "osc\x1b]0;x\x07": "osc\\x1b]0;x\\x07",
    "nul\x00z": "nul\\x00z",
    "rlo\u202eexe": "rlo\\u202eexe",
    "c1\x85\u2028\u2066x": "c1\\x85\\u2028\\u2066x",
    "tab\t\rcr": "tab\\t\\rcr",
    "back\\nslash": "back\\\\nslash",  # a backslash, not a newline: escaped too
}
PRINTABLE = "caf\u00e9_\u5c64"  # non-ASCII but printable: shown as is
NAMES = [*HOSTILE, PRINTABLE]
SHOWN = {**HOSTILE, PRINTABLE: PRINTABLE}
_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _raw_controls(text: str) -> list[str]:
    """Characters a terminal must not receive raw (line breaks between rows aside)."""
    return sorted({c for c in text if c != "\n" and (
        unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") or c in _BIDI)})


def _module(names, offset: float = 0.0) -> tf.Module:
    module = tf.Module()
    for i, name in enumerate(names):
        setattr(module, name, tf.Variable(float(i) + offset))
    return module


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> str:
    """A checkpoint of a tf.Module whose variables carry the hostile names."""
    root = tmp_path_factory.mktemp("hostile")
    return tf.train.Checkpoint(root=_module(NAMES)).write(str(root / "ck"))


_cli = cli_in_process


# --- _render.safe / safe_text -------------------------------------------------------------

@pytest.mark.parametrize("name, shown", [
    *HOSTILE.items(),
    ("\x7f\x9f\x1f", "\\x7f\\x9f\\x1f"),
    ("\u2029\u202a\u2069\u200f", "\\u2029\\u202a\\u2069\\u200f"),
    ("\ud800", "\\ud800"),  # a lone surrogate cannot even be encoded
    ("\\", "\\\\"),
])
def test_safe_escapes_controls_and_backslashes_visibly(name, shown):
    assert _render.safe(name) == shown
    assert not _raw_controls(_render.safe(name))
    assert "\n" not in _render.safe(name)


@pytest.mark.parametrize("name", [
    "", "model/encoder/w", "_functional/_operations/1/_kernel", "w/.OPTIMIZER_SLOT/opt/m",
    "layer_with_weights-0/kernel", PRINTABLE, "Ünïcödé ñame €", "名前/重み", "emoji \U0001f600",
])
def test_safe_keeps_names_that_need_no_escaping(name):
    assert _render.safe(name) == name
    assert _render.safe_text(name) == name


def test_safe_text_keeps_backslashes_and_optionally_line_breaks():
    message = "`a\\nb`: bad\x1b[2J\nsecond line\r"
    assert _render.safe_text(message) == "`a\\nb`: bad\\x1b[2J\\nsecond line\\r"
    assert _render.safe_text(message, lines=True) == "`a\\nb`: bad\\x1b[2J\nsecond line\\r"
    # Text quoting an already escaped name is left alone: no double escaping.
    assert _render.safe_text(_render.safe("x\x1by")) == "x\\x1by"


def test_first_line_of_an_error_escapes_controls():
    assert _render.first_line(ValueError("key `a\x1b[2J` not found\nmore")) == \
        "key `a\\x1b[2J` not found"


# --- objckpt inspect -----------------------------------------------------------------------

def test_inspect_text_shows_hostile_names_escaped_one_row_each(hostile, capsys):
    status, out, err = _cli(capsys, "inspect", hostile)
    assert status == 0, err
    assert not _raw_controls(out)
    lines = out.rstrip("\n").split("\n")
    # header, blank, column titles, one row per variable, total
    assert len(lines) == len(NAMES) + 4, lines
    assert lines[2].split() == ["object", "path", "[saved", "name]", "shape", "dtype", "size"]
    assert lines[-1].startswith("total")
    for name, shown in SHOWN.items():
        assert sum(line.split("  ")[0] == shown for line in lines) == 1, (name, lines)
    # Columns line up on the escaped text: every row's size column ends at the same place.
    assert len({len(line) for line in lines[2:]}) == 1, lines


def test_inspect_json_keeps_the_names_as_data(hostile, capsys):
    status, out, err = _cli(capsys, "inspect", hostile, "--format", "json")
    assert status == 0, err
    assert out == json.dumps(_render.inspect_json(objckpt.read_tree(hostile)), indent=2) + "\n"
    assert not _raw_controls(out)  # json.dumps escapes: \n, \u001b, ...
    assert sorted(v["path"] for v in json.loads(out)["variables"]) == sorted(NAMES)


@pytest.mark.subprocess
def test_inspect_from_the_command_line_sends_no_control_characters(hostile):
    result = run_cli("inspect", hostile, blocked=False, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert not _raw_controls(out)
    assert "evil\\x1b[31m\\nname" in out and PRINTABLE in out
    assert len(out.rstrip("\n").split("\n")) == len(NAMES) + 4


def test_a_prefix_named_by_the_state_file_is_escaped(tmp_path, capsys):
    directory = tmp_path / "run"
    directory.mkdir()
    prefix = tf.train.Checkpoint(root=_module(["w"])).write(str(directory / "ck\x1b[2J\nx"))
    tf.compat.v1.train.update_checkpoint_state(str(directory), prefix)
    status, out, err = _cli(capsys, "inspect", directory)
    assert status == 0, err
    assert not _raw_controls(out)
    assert out.startswith(f"checkpoint {directory}/ck\\x1b[2J\\nx: 1 variable")
    status, out, err = _cli(capsys, "verify", directory)
    assert status == 0, err
    assert not _raw_controls(out) and len(out.rstrip("\n").split("\n")) == 1
    assert "ck\\x1b[2J\\nx" in out


def test_errors_printed_by_the_command_line_send_no_control_characters(tmp_path, capsys):
    # A name-based checkpoint whose keys are hostile: `inspect` lists them escaped, and
    # `migrate` refuses a template that does not exist, quoting the path it was given.
    keys = sorted(HOSTILE)[:3]
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "tf1"), tensor_names=keys,
                      shape_and_slices=[""] * len(keys), tensors=[tf.constant(1.0)] * len(keys))
    status, out, err = _cli(capsys, "inspect", tmp_path / "tf1")
    assert status == 0 and "name-based" in out.splitlines()[0]
    assert not _raw_controls(out) and len(out.rstrip("\n").split("\n")) == len(keys) + 4
    status, out, err = _cli(capsys, "inspect", tmp_path / "gone\x1b[2J\nx")
    assert status == 1 and not out
    assert "No checkpoint at prefix" in err and "gone\\x1b[2J\\nx" in err
    assert not _raw_controls(err)


# --- objckpt diff --------------------------------------------------------------------------

def test_diff_text_shows_hostile_names_escaped_one_line_each(hostile, tmp_path, capsys):
    changed, kept = NAMES[: len(NAMES) // 2], NAMES[len(NAMES) // 2:]
    other = tf.train.Checkpoint(root=_module(changed, offset=1.0)).write(str(tmp_path / "b"))
    status, out, err = _cli(capsys, "diff", hostile, other)
    assert status == 1, err
    assert not _raw_controls(out)
    lines = out.rstrip("\n").split("\n")
    # A:, B:, one line per differing path, the summary
    assert len(lines) == 2 + len(NAMES) + 1, lines
    for name in changed:
        assert sum(line.startswith(f"~ {SHOWN[name]}: ") for line in lines) == 1, name
    for name in kept:
        assert f"- {SHOWN[name]} (only in A)" in lines
    status, out, err = _cli(capsys, "diff", hostile, other, "--format", "json")
    doc = json.loads(out)
    assert sorted(doc["only_in_a"]) == sorted(kept)
    assert sorted(v["path"] for v in doc["values"]) == sorted(changed)


def test_diff_text_of_a_nested_hostile_root(tmp_path, capsys):
    nested = tf.train.Checkpoint(**{"m\x1b]0;x\x07": _module(["w"])}).write(str(tmp_path / "a"))
    plain = tf.train.Checkpoint(root=_module(["w"])).write(str(tmp_path / "b"))
    text = cli.diff_text(objckpt._inspect.diff.diff(nested, plain))
    assert not _raw_controls(text)
    assert "under `m\\x1b]0;x\\x07/`" in text


# --- verify, plans, restore reports and errors ----------------------------------------------

def test_verify_problems_show_hostile_keys_escaped(hostile, tmp_path, capsys):
    reader = tf.train.load_checkpoint(hostile)
    names = sorted(reader.get_variable_to_shape_map())
    stray = "stray\x1b[2J\nkey"
    keys = [*names, stray]
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "bad"), tensor_names=keys,
                      shape_and_slices=[""] * len(keys),
                      tensors=[tf.constant(reader.get_tensor(k)) for k in names]
                      + [tf.constant(0.0)])
    report = objckpt.verify(str(tmp_path / "bad"))
    assert [p.where for p in report.problems] == [stray]
    text = report.describe()
    assert not _raw_controls(text)
    assert len(text.split("\n")) == 2 and "`stray\\x1b[2J\\nkey`" in text
    status, out, _ = _cli(capsys, "verify", tmp_path / "bad")
    assert status == 1 and out == text + "\n"


def test_plan_describe_and_migrate_dry_run_escape_names(hostile, tmp_path, monkeypatch, capsys):
    the_plan = objckpt.plan(_module(NAMES), hostile)
    text = the_plan.describe()
    assert not _raw_controls(text)
    lines = text.split("\n")
    assert len(lines) == 2 + len(NAMES) + 1 and lines[-1] == f"complete: exact {len(NAMES)}"
    for name, shown in SHOWN.items():
        assert sum(line.split()[0] == shown for line in lines[2:-1]) == 1, name
    assert len({line.index(" exact ") for line in lines[2:-1]}) == 1  # aligned
    partial = objckpt.plan(_module(NAMES[:2]), hostile).describe()
    assert not _raw_controls(partial)
    assert "source entries matching nothing (8):" in partial
    rlo = SHOWN["rlo\u202eexe"]
    assert f"  - {rlo}" in partial.split("\n"), partial
    # The command line's --dry-run prints the same table.
    (tmp_path / "hostile_template.py").write_text(textwrap.dedent(f"""
        import tensorflow as tf

        def build():
            module = tf.Module()
            for i, name in enumerate({NAMES!r}):
                setattr(module, name, tf.Variable(float(i)))
            return module
        """))
    monkeypatch.chdir(tmp_path)
    status, out, err = _cli(capsys, "migrate", hostile, tmp_path / "out", "--template",
                            "hostile_template:build", "--dry-run")
    assert status == 0, err
    assert out == text + "\n"


def test_restore_report_and_errors_escape_names(hostile):
    small = _module(NAMES[:2])
    report = objckpt.restore(small, hostile, strict=False)
    text = str(report)
    assert not _raw_controls(text)
    assert len(text.split("\n")) == 2
    assert f"not in the obj ({len(NAMES) - 2}): " in text and SHOWN["nul\x00z"] in text
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(small, hostile)
    message = str(caught.value)
    assert not _raw_controls(message)
    listed = [line for line in message.split("\n") if line.startswith("  - ")]
    assert len(listed) == len(NAMES) - 2
    assert "  - `osc\\x1b]0;x\\x07`: in the source but not in the obj" in listed
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.plan(_module(["w"]), tf.train.Checkpoint(
            **{"x\x1b[2J\ny": _module(["w"])}).write(
            os.path.join(os.path.dirname(hostile), "nested")), at="nothing")
    assert not _raw_controls(str(caught.value))
    assert "`x\\x1b[2J\\ny`" in str(caught.value)


# --- sizes, shapes, counts and lists ---------------------------------------------------------

def test_rendering():
    assert [_render.size(n) for n in (0, 999, 1000, 1_500_000, 3e12)] == [
        "0 B", "999 B", "1.0 KB", "1.5 MB", "3000.0 GB"]
    assert [_render.shape(s) for s in ((), (3,), (2, 3))] == ["()", "(3,)", "(2, 3)"]
    assert _render.count(1, "variable") == "1 variable"
    assert _render.count(1234, "variable") == "1,234 variables"
    assert _render.elements((2, 3, 4)) == 24 and _render.elements(()) == 1
    assert _render.mb(12_345_678) == "12.3 MB"
    assert _render.listed(["a", "b", "c"], limit=2) == ["  - a", "  - b", "  - ... and 1 more"]
    assert _render.first_line(ValueError("first\nsecond")) == "first"
    assert _render.first_line(ValueError("")) == "ValueError"
