"""`objckpt.graph` / `objckpt graph`: the object dependency graph as DOT, SVG and PNG."""

import collections
import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._base import names as _names
from objckpt._bundle import objgraph as _objgraph

import legacy
from flavours import KERAS_FLAVOURS, build, keras_for
from support import run_cli

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAS_DOT, reason="Graphviz's `dot` is not installed (apt-get install graphviz); the "
    "missing-dot error path is tested instead")
NODE = re.compile(r'^  n(\d+) \[shape=(\w+), [^\n]*label="((?:[^"\\]|\\.)*)"\];$')
EDGE = re.compile(r'^  n(\d+) -> n(\d+)(?: \[(.*)\])?;$')


def _run(*args, env=None):
    return run_cli(*args, blocked=False, env=env)


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
    assert nodes[0][1] == "Functional [functional]"  # the class, then the model's name
    prefix = tf.train.Checkpoint(root=model).write(str(tmp_path / "ck"))
    on_disk, _ = _parse(objckpt.graph(prefix).dot)
    assert on_disk[0][1] == "root"
    variables = sorted(label.split("\\n")[-1] for shape, label in on_disk.values()
                       if shape == "ellipse")
    assert variables == sorted(label.split("\\n")[-1] for shape, label in nodes.values()
                               if shape == "ellipse")
    assert len(variables) == len(objckpt.read_tree(prefix))
    assert "without variables hidden" in live.dot  # Keras bookkeeping lists
    assert objckpt.graph(model, empty=True).nodes > live.nodes


# --- layer names on nodes, slots linked to their weights ----------------------------------

def _expected_layers(model, kind: str) -> dict:
    """{layer name: shape and dtype of the variables right under it}; auto-generated names
    (`dense_4`) are read from the model, they depend on what the process built before."""
    if kind == "sequential":
        return {"encoder": ["(3, 4) float32", "(4,) float32"],
                "head": ["(2,) float32", "(4, 2) float32"]}
    if kind == "functional":
        head = model.get_layer("head").layers
        return {
            "conv": ["(3, 3, 3, 4) float32", "(4,) float32"], "bn": ["(4,) float32"] * 4,
            "embed": ["(10, 3) float32"], "proj_x": ["(6,) float32", "(64, 6) float32"],
            "proj_e": ["(12, 6) float32", "(6,) float32"],
            "shared": ["(5,) float32", "(6, 5) float32"],
            head[0].name: ["(4,) float32", "(5, 4) float32"],
            head[1].name: ["(2,) float32", "(4, 2) float32"]}
    return {model.conv.name: ["(3, 3, 3, 4) float32", "(4,) float32"],
            model.bn.name: ["(4,) float32"] * 4,
            model.hidden.name: ["(6,) float32", "(64, 6) float32"],
            model.block.layers[0].name: ["(4,) float32", "(6, 4) float32"],
            model.block.layers[1].name: ["(2,) float32", "(4, 2) float32"]}


# The optimizer's own name and counters, where they tell: Keras 3 saves `adam/iteration`,
# Keras 2's OptimizerV2 `Adam/iter` (and its hyperparameters), tf_keras plain `iteration`.
COUNTERS = {"keras3": ["() float32", "() int64"], "tf_keras": ["() float32", "() int64"],
            "keras2": ["() float32"] * 4 + ["() int64"]}
ROLES = {"keras3": ("momentum", "velocity"), "tf_keras": ("m", "v"), "keras2": ("m", "v")}
LABEL = re.compile(r"^(.*) \[(.*)\]$")
SLOT_NODE = re.compile(r'^  n(\d+) \[shape=ellipse, style=filled, fillcolor="#fff2d9"', re.M)


def build_sequential(keras):
    """Sequential([Input, Dense(4, name="encoder"), Dense(2, name="head")]), Adam, one step:
    every weight has its own shape, so a slot's shape names its weight."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="encoder"),
                              keras.layers.Dense(2, name="head")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(4, 3)).astype("float32"),
              rng.normal(size=(4, 2)).astype("float32"), epochs=1, batch_size=4, verbose=0)
    return model


def _layers(dot: str) -> dict:
    """{layer name: sorted shape+dtype of the variables (not slots) drawn right under it}, for
    every box labelled `edge [name]` that has variables under it (a name drawn twice fails)."""
    nodes, edges = _parse(dot)
    slots = {int(i) for i in SLOT_NODE.findall(dot)}
    out = {}
    for node_id, (shape, label) in nodes.items():
        named = LABEL.match(label.split("\\n")[0])
        if shape != "box" or named is None:
            continue
        held = sorted(nodes[b][1].split("\\n")[-1] for a, b, attrs in edges
                      if a == node_id and not attrs and nodes[b][0] == "ellipse"
                      and b not in slots)
        if held:
            assert named[2] not in out, f"{named[2]} drawn twice"
            out[named[2]] = held
    return out


def _slot_links(dot: str, weights: int, roles: tuple) -> set:
    """The (weight, role, slot) dashed edges, checked: every yellow slot node has exactly one,
    from a variable of the same shape and dtype; each of `weights` weights has one per role."""
    nodes, edges = _parse(dot)
    slots = {int(i) for i in SLOT_NODE.findall(dot)}
    links = [(a, re.search(r'label="([^"]*)"', attrs)[1], b) for a, b, attrs in edges
             if "style=dashed" in attrs]
    assert sorted(b for _, _, b in links) == sorted(slots)  # no slot unlinked or linked twice
    by_weight = collections.defaultdict(list)
    for weight, role, slot in links:
        assert nodes[weight][0] == "ellipse" and weight not in slots
        assert nodes[weight][1].split("\\n")[-1] == nodes[slot][1].split("\\n")[-1]
        by_weight[weight].append(role)
    assert len(by_weight) == weights
    assert all(sorted(found) == sorted(roles) for found in by_weight.values()), by_weight
    return set(links)


KERAS_CASES = [(flavour, kind) for flavour in KERAS_FLAVOURS
               for kind in ("functional", "subclassed", "sequential")]


@pytest.mark.parametrize("flavour,kind", KERAS_CASES, ids=[f"{f}-{k}" for f, k in KERAS_CASES])
def test_layer_names_and_slot_links_live_and_saved(flavour, kind, tmp_path):
    keras = keras_for(flavour)
    model = build_sequential(keras) if kind == "sequential" else build(flavour, kind)
    prefix = tf.train.Checkpoint(root=model).write(str(tmp_path / "ck"))
    live, saved = objckpt.graph(model).dot, objckpt.graph(prefix).dot
    layers = _expected_layers(model, kind)
    counters = COUNTERS[flavour]
    optimizer_name = getattr(model.optimizer, "name", None) or model.optimizer._name
    assert _layers(live) == {**layers, optimizer_name: counters}
    if flavour == "keras3" and kind == "subclassed":
        # Keras 3 saves these weights under TF names without their layer (`net/kernel`, one
        # name for several layers): nothing is guessed.
        assert _layers(saved) == {optimizer_name: counters}
    elif flavour == "tf_keras":  # tf_keras saves `iteration`: its optimizer stays unnamed
        assert _layers(saved) == layers
    else:
        assert _layers(saved) == {**layers, optimizer_name: counters}
    weights = len(model.trainable_variables)
    assert _slot_links(live, weights, ROLES[flavour]) == \
        _slot_links(saved, weights, ROLES[flavour])  # same node ids: the same pairs


STATE_ROLES = {"keras3": ("average", "momentum", "velocity", "velocity_hat"),
               "tf_keras": ("average", "m", "v", "vhat"), "keras2": ("m", "v", "vhat")}


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_every_per_weight_state_is_linked_amsgrad_and_ema(flavour, tmp_path):
    """AMSGrad's `vhat` and the EMA copies (Keras 2's legacy Adam has no EMA) are slots too,
    in the live drawing as in the saved one."""
    keras = keras_for(flavour)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="encoder")])
    options = {"amsgrad": True} if flavour == "keras2" else {"amsgrad": True, "use_ema": True}
    model.compile(optimizer=keras.optimizers.Adam(0.01, **options), loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 4), "float32"), verbose=0)
    prefix = tf.train.Checkpoint(root=model).write(str(tmp_path / "ck"))
    live = _slot_links(objckpt.graph(model).dot, 2, STATE_ROLES[flavour])
    assert live == _slot_links(objckpt.graph(prefix).dot, 2, STATE_ROLES[flavour])


class Linear(tf.Module):
    """A Sonnet-like module: its variables are created in its name scope."""

    def __init__(self, n_in, n_out, name=None):
        super().__init__(name=name)
        with self.name_scope:
            self.w = tf.Variable(tf.random.stateless_normal((n_in, n_out), seed=(1, n_out)),
                                 name="w")
            self.b = tf.Variable(tf.zeros((n_out,)), name="b")

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


class MLP(tf.Module):
    def __init__(self):
        super().__init__(name="mlp")
        with self.name_scope:
            self.layers = [Linear(3, 4, name="linear_0"), Linear(4, 2, name="linear_1")]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def mlp_checkpoint():
    net = MLP()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(net(tf.ones((2, 3))) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables),
                                  net.trainable_variables))
    return tf.train.Checkpoint(model=net, optimizer=optimizer)


def test_module_layer_names_and_tf_slot_table(mlp_checkpoint, tmp_path):
    prefix = mlp_checkpoint.write(str(tmp_path / "ck"))
    live, saved = objckpt.graph(mlp_checkpoint).dot, objckpt.graph(prefix).dot
    layers = {"linear_0": ["(3, 4) float32", "(4,) float32"],
              "linear_1": ["(2,) float32", "(4, 2) float32"]}
    assert _layers(saved) == layers
    assert {k: v for k, v in _layers(live).items() if k in layers} == layers
    assert re.search(r'label="model \[mlp\]\\nMLP"', live)  # named, though no variable of its own
    assert _slot_links(live, 4, ("m", "v")) == _slot_links(saved, 4, ("m", "v"))


def test_names_from_a_checkpoint_are_escaped_data(tmp_path):
    module = tf.Module()
    hostile = ['q"uote', "back\\slash\\N", "new\nline", "<b>html</b>", "a/b.c", "x\\G;}",
               "c1\x85bidi\u202eend\u2028", "esc\x1b]0;t\x07"]
    for i, name in enumerate(hostile):
        setattr(module, name, tf.Variable(float(i)))
    module.layer = tf.Module()  # a layer name read from the saved names: hostile too
    module.layer.w = tf.Variable(1.0, name='ev"il<b>\x1b\u202e\\/w')
    module.layer.b = tf.Variable(2.0, name='ev"il<b>\x1b\u202e\\/b')
    prefix = tf.train.Checkpoint(root=module).write(str(tmp_path / "ck"))
    picture = objckpt.graph(prefix)
    nodes, _ = _parse(picture.dot)  # every line still a well-formed node or edge
    labels = {label.split("\\n")[0] for shape, label in nodes.values() if shape == "ellipse"}
    assert labels == {r"q\"uote", r"back\\slash\\N", r"new\\x0aline", "<b>html</b>", "a/b.c",
                      r"x\\G;}", r"c1\\x85bidi\\u202eend\\u2028", r"esc\\x1b]0;t\\x07", "w", "b"}
    assert r"layer [ev\"il<b>\\x1b\\u202e\\]" in {label for _, label in nodes.values()}
    assert not any(c in picture.dot for c in "\x85\u202e\u2028\x1b\x07")
    if HAS_DOT:
        svg = picture.render("svg").decode()
        assert "&lt;b&gt;html&lt;/b&gt;" in svg and "<b>" not in svg
        assert "back\\slash\\N" in svg and "x\\G;}" in svg and "new\\x0aline" in svg


# --- the name rules, on hand-made graphs (no TensorFlow) -----------------------------------

def _graph(edges: dict, names: dict):
    """An object graph as `_objgraph` reads one: {node: [(edge, child)]}, {variable node:
    saved name}."""
    count = 1 + max([*edges, *names, *(c for kids in edges.values() for _, c in kids)])
    return _objgraph.Graph(tuple(
        _objgraph.Node(tuple(_objgraph.Reference(c, e) for e, c in edges.get(i, ())),
                       (_objgraph.Attribute("VARIABLE_VALUE", names[i],
                                            f"{i}/.ATTRIBUTES/VARIABLE_VALUE"),)
                       if i in names else ()) for i in range(count)))


def test_layer_names_only_where_the_saved_names_agree():
    # root -> a (x/kernel, x/bias), b (y/kernel, z/bias), c (s/kernel), d (s/bias),
    # e (a plain `Variable`), list (0: m/kernel)
    edges = {0: [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5), ("list", 6)],
             1: [("kernel", 7), ("bias", 8)], 2: [("kernel", 9), ("bias", 10)],
             3: [("kernel", 11)], 4: [("bias", 12)], 5: [("v", 13)], 6: [("0", 14)]}
    names = {7: "x/kernel", 8: "x/bias:0", 9: "y/kernel", 10: "z/bias", 11: "s/kernel",
             12: "s/bias", 13: "Variable", 14: "m/kernel"}
    graph = _graph(edges, names)
    parents = {c: p for p, kids in edges.items() for _, c in kids}
    assert _names.layer_names(graph, parents) == {1: "x"}  # y/z disagree, s claimed twice
    # A Keras 3 slot name that spells another path for a's weight: a is not named either.
    assert _names.layer_names(graph, parents, [(7, "momentum", 99)],
                              {**names, 99: "adam/net_x_kernel_momentum"}) == {}


def test_slot_links_by_list_and_by_unique_name():
    # A Keras 3 optimizer (node 3): _trainable_variables [w1, w2], _momentums [s1, s2]; and
    # optimizer variables linked by their names only, one of them ambiguous.
    edges = {0: [("l1", 1), ("l2", 2), ("optimizer", 3), ("l3", 20)],
             1: [("kernel", 4)], 2: [("kernel", 5)], 20: [("kernel", 21)],
             3: [("_variables", 6), ("_trainable_variables", 7), ("_momentums", 8),
                 ("_iterations", 9), ("extra", 10)],
             6: [("0", 9), ("1", 11), ("2", 12)], 7: [("0", 4), ("1", 5)],
             8: [("0", 11), ("1", 12)],
             10: [("0", 13), ("1", 14), ("2", 15)]}
    names = {4: "net/kernel", 5: "net/kernel", 21: "dense/kernel", 9: "adam/iteration",
             11: "adam/net_conv_kernel_momentum", 12: "adam/net_dense_kernel_momentum",
             13: "Adam/v/dense/kernel", 14: "adam/dense_kernel_velocity_hat",
             15: "adam/net_kernel_velocity"}
    graph = _graph(edges, names)
    network = {0, 1, 2, 4, 5, 20, 21}
    links = _names.slot_links(graph, network)
    # The list pairs as the optimizer does, by its own lists (the weights' names, `net/kernel`
    # twice, could not); by name, one weight matches 13 and 14, and two match 15.
    assert links == [(4, "momentum", 11), (5, "momentum", 12), (21, "v", 13),
                     (21, "velocity_hat", 14)]
    assert _names.slot_role(names, 21, 13, "?") == "v"
    assert _names.slot_role({1: "a/b", 2: "opt/a_b_custom"}, 1, 2, "?") == "custom"
    assert _names.slot_role({1: "a/b", 2: "opt/other"}, 1, 2, "fallback") == "fallback"


def test_crafted_names_neither_crash_nor_take_quadratic_work():
    # List edges Python cannot or should not convert (a 5,000-digit index, a superscript
    # digit), and an optimizer variable named `m/m/m/...` 200,000 parts deep: each part is
    # a tf_keras role, and joining every suffix would take 10^10 steps.
    edges = {0: [("l", 1), ("optimizer", 2)], 1: [("kernel", 3)],
             2: [("_variables", 4), ("_trainable_variables", 5), ("_iterations", 6),
                 ("_momentums", 7)],
             4: [("9" * 5000, 8)], 5: [("0", 3)], 7: [("\u00b2", 8)]}
    names = {3: "m/kernel", 6: "adam/iteration", 8: "m/" * 200_000 + "x"}
    graph = _graph(edges, names)
    assert _names.slot_links(graph, {0, 1, 3}) == []
    parents = {1: 0, 2: 0, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2, 8: 4}  # the drawn tree
    # 4 is no list (its edge is not an index), so its variable's prefix names it.
    assert _names.layer_names(graph, parents) == {1: "m", 2: "adam", 4: "m"}


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


@pytest.mark.subprocess
def test_command_line(module_prefix, tmp_path):
    dot = _run("graph", module_prefix, "--depth", "2")
    assert dot.returncode == 0, dot.stderr
    # The same DOT as the library's, its caption's advice in the command line's words.
    assert "(--depth N to change)" in dot.stdout and "depth=N" not in dot.stdout
    assert dot.stdout == objckpt.graph(module_prefix, depth=2).dot.replace(
        "(depth=N to change)", "(--depth N to change)")
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
