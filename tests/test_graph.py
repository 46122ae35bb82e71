"""`objckpt.graph` / `objckpt graph`: the object dependency graph as DOT, SVG and PNG."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

import legacy
from flavours import KERAS_FLAVOURS, build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAS_DOT, reason="Graphviz's `dot` is not installed (apt-get install graphviz); the "
    "missing-dot error path is tested instead")
NODE = re.compile(r'^  n(\d+) \[shape=(\w+), [^\n]*label="((?:[^"\\]|\\.)*)"\];$')
EDGE = re.compile(r'^  n(\d+) -> n(\d+)(?: \[(.*)\])?;$')


def _run(*args, env=None):
    env = dict(os.environ if env is None else env,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "objckpt", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def _parse(dot: str):
    """(nodes {id: (shape, label)}, edges [(a, b, attrs)]); fails on any line it cannot read."""
    lines = dot.strip().splitlines()
    assert lines[0] == "digraph objckpt {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[4:-1]:
        node, edge = NODE.match(line), EDGE.match(line)
        assert node or edge, f"unexpected DOT line: {line!r}"
        if node:
            nodes[int(node[1])] = (node[2], node[3])
        else:
            edges.append((int(edge[1]), int(edge[2]), edge[3] or ""))
    return nodes, edges


@pytest.fixture(scope="module")
def module_prefix(tmp_path_factory):
    return tf.train.Checkpoint(root=build("module")).write(
        str(tmp_path_factory.mktemp("graph") / "ck"))


def test_module_checkpoint_objects_variables_and_slot_edges(module_prefix):
    entries = objckpt.read_tree(module_prefix)
    picture = objckpt.graph(module_prefix)
    nodes, edges = _parse(picture.dot)
    assert picture.nodes == len(nodes) and picture.edges == len(edges)
    assert picture.depth is None and picture.collapsed == 0
    ellipses = [label for shape, label in nodes.values() if shape == "ellipse"]
    assert len(ellipses) == len(entries)  # every variable and slot, once
    assert r"w\n(3, 4) float32" in ellipses  # model/encoder/w
    assert r"step\n() int64" in ellipses
    slots = [e for e in edges if "style=dashed" in e[2]]
    slot_entries = [p for p in entries if "/.OPTIMIZER_SLOT/" in p]
    assert len(slots) == len(slot_entries) == 12  # m and v of 6 float variables
    assert {re.search(r'label="(\w+)"', e[2])[1] for e in slots} == {"m", "v"}
    for a, b, _ in slots:  # from a variable to its slot
        assert nodes[a][0] == "ellipse" and nodes[b][0] == "ellipse"
    optimizer = [i for i, (_, label) in nodes.items() if label == "optimizer"]
    assert len(optimizer) == 1 and 'fillcolor="#fde9d9"' in picture.dot
    # The shared layer (model/shared, also model/layers/0) is one node; the second edge dotted.
    dotted = [e for e in edges if "style=dotted" in e[2]]
    assert len(dotted) == 1 and 'label="0"' in dotted[0][2]
    assert nodes[dotted[0][1]][1] == "shared"


def test_depth_collapses_subtrees_and_counts_what_they_hold(module_prefix):
    full = objckpt.graph(module_prefix)
    entries = objckpt.read_tree(module_prefix)
    shallow = objckpt.graph(module_prefix, depth=1)
    nodes, _ = _parse(shallow.dot)
    assert shallow.depth == 1 and shallow.nodes == len(nodes) < full.nodes
    folded = [label for shape, label in nodes.values() if shape == "folder"]
    assert {label.split("\\n")[0] for label in folded} == {"model", "optimizer"}
    counts = [re.search(r"\+(\d+) objects?, (\d+) variables?", label) for label in folded]
    assert sum(int(m[2]) for m in counts) == len(entries)
    assert shallow.collapsed == sum(int(m[1]) + int(m[2]) for m in counts)
    assert "collapsed below depth 1" in shallow.dot
    auto = objckpt.graph(module_prefix, max_nodes=8)
    assert auto.depth is not None and auto.nodes <= 8
    assert objckpt.graph(module_prefix, depth=50).depth is None  # nothing to collapse


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_live_keras_obj_shows_classes_and_matches_its_checkpoint(flavour, tmp_path):
    model = build(flavour, "functional")
    live = objckpt.graph(model)
    nodes, _ = _parse(live.dot)
    labels = [label for _, label in nodes.values()]
    assert any(label.endswith(r"\nConv2D") for label in labels), labels
    assert any(label.endswith(r"\nDense") for label in labels)
    assert nodes[0][1] == "Functional"
    prefix = tf.train.Checkpoint(root=model).write(str(tmp_path / "ck"))
    on_disk, _ = _parse(objckpt.graph(prefix).dot)
    variables = sorted(label.split("\\n")[-1] for shape, label in on_disk.values()
                       if shape == "ellipse")
    assert variables == sorted(label.split("\\n")[-1] for shape, label in nodes.values()
                               if shape == "ellipse")
    assert len(variables) == len(objckpt.read_tree(prefix))
    assert "without variables hidden" in live.dot  # Keras bookkeeping lists
    assert objckpt.graph(model, empty=True).nodes > live.nodes


def test_names_from_a_checkpoint_are_escaped_data(tmp_path):
    module = tf.Module()
    hostile = ['q"uote', "back\\slash\\N", "new\nline", "<b>html</b>", "a/b.c", "x\\G;}",
               "c1\x85bidi\u202eend\u2028", "esc\x1b]0;t\x07"]
    for i, name in enumerate(hostile):
        setattr(module, name, tf.Variable(float(i)))
    prefix = tf.train.Checkpoint(root=module).write(str(tmp_path / "ck"))
    picture = objckpt.graph(prefix)
    nodes, _ = _parse(picture.dot)  # every line still a well-formed node or edge
    labels = {label.split("\\n")[0] for shape, label in nodes.values() if shape == "ellipse"}
    assert labels == {r"q\"uote", r"back\\slash\\N", r"new\\x0aline", "<b>html</b>", "a/b.c",
                      r"x\\G;}", r"c1\\x85bidi\\u202eend\\u2028", r"esc\\x1b]0;t\\x07"}
    assert not any(c in picture.dot for c in "\x85\u202e\u2028\x1b\x07")
    if HAS_DOT:
        svg = picture.render("svg").decode()
        assert "&lt;b&gt;html&lt;/b&gt;" in svg and "<b>" not in svg
        assert "back\\slash\\N" in svg and "x\\G;}" in svg and "new\\x0aline" in svg


def test_name_based_checkpoint_is_drawn_from_its_names(tmp_path_factory):
    tf1 = legacy.cached_tf1_checkpoint(tmp_path_factory)
    nodes, _ = _parse(objckpt.graph(tf1["prefix"]).dot)
    labels = [label for _, label in nodes.values()]
    assert "model_001" in labels and "conv" in labels
    assert r"kernel\n(3, 3, 3, 4) float32" in labels
    assert sum(shape == "ellipse" for shape, _ in nodes.values()) == len(tf1["names"])
    assert "name-based (TF1 Saver) checkpoint" in objckpt.graph(tf1["prefix"]).dot


@needs_dot
def test_svg_and_png_render_and_display_inline(module_prefix, tmp_path):
    picture = objckpt.graph(module_prefix)
    svg = picture.render("svg")
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and b"float32" in svg
    assert picture.save(tmp_path / "g.png") == str(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    picture.save(tmp_path / "g.dot")
    assert (tmp_path / "g.dot").read_text() == picture.dot
    bundle = picture._repr_mimebundle_()
    assert list(bundle) == ["image/svg+xml"] and "<svg" in bundle["image/svg+xml"]


def test_without_graphviz_svg_raises_with_how_to_install(module_prefix, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    picture = objckpt.graph(module_prefix)
    with pytest.raises(errors.GraphvizNotFoundError) as caught:
        picture.render("svg")
    assert isinstance(caught.value, FileNotFoundError)
    message = str(caught.value)
    assert "apt-get install graphviz" in message and "pip install graphviz" in message
    assert "format='dot'" in message
    assert picture.render("dot").decode() == picture.dot  # DOT needs nothing
    bundle = picture._repr_mimebundle_()
    assert list(bundle) == ["text/plain"] and picture.dot in bundle["text/plain"]
    assert picture._repr_svg_() is None


def test_bad_arguments_raise_typed_errors(module_prefix, tmp_path):
    for depth in (0, True, 1.5):
        with pytest.raises(errors.InvalidArgumentError, match=re.escape(f"depth={depth!r}")):
            objckpt.graph(module_prefix, depth=depth)
    with pytest.raises(errors.InvalidArgumentError, match=r"format='jpeg'"):
        objckpt.graph(module_prefix).render("jpeg")
    with pytest.raises(errors.UnsupportedObjectError, match=r"Received: list"):
        objckpt.graph([1, 2])
    with pytest.raises(errors.CheckpointNotFoundError, match=re.escape(str(tmp_path / "no"))):
        objckpt.graph(tmp_path / "no")


def test_command_line(module_prefix, tmp_path):
    dot = _run("graph", module_prefix, "--depth", "2")
    assert dot.returncode == 0, dot.stderr
    assert dot.stdout == objckpt.graph(module_prefix, depth=2).dot
    out = tmp_path / ("g.svg" if HAS_DOT else "g.dot")
    hidden = dict(os.environ, PATH=str(tmp_path) + os.pathsep + os.path.dirname(sys.executable))
    written = _run("graph", module_prefix, "--out", str(out))
    assert written.returncode == 0, written.stderr
    assert f"wrote {out}" in written.stdout and out.stat().st_size > 0
    missing = _run("graph", module_prefix, "--out", str(tmp_path / "g.png"), env=hidden)
    assert missing.returncode == 1
    assert "objckpt graph: " in missing.stderr and "apt-get install graphviz" in missing.stderr
    assert not (tmp_path / "g.png").exists()
    usage = _run("graph", module_prefix, "--format", "png")
    assert usage.returncode == 2 and "pass --out FILE" in usage.stderr
    assert _run("graph", module_prefix, "--depth", "0").returncode == 2
