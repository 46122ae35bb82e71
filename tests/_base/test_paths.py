"""The object-path grammar (`objckpt._base.paths`): escaping as TF escapes, slot paths,
checkpoint keys, and the walks of an object graph (breadth first, deferred edges, slots)."""

from __future__ import annotations

import types

import pytest

from objckpt._base import paths as _paths


@pytest.mark.parametrize("name", ["kernel", "a.b", "a/b", "..S", "./.", ".", "S", ""])
def test_escape_round_trips_and_matches_tf(name):
    from tensorflow.python.trackable import trackable_utils  # the oracle: TF's own escaping

    assert _paths.escape(name) == trackable_utils.escape_local_name(name)
    assert _paths.unescape(_paths.escape(name)) == name


def test_slot_paths_split_and_join():
    path = _paths.slot_path("dense/kernel", "optimizer", "m")
    assert path == "dense/kernel/.OPTIMIZER_SLOT/optimizer/m"
    assert _paths.split_slot(path) == ("dense/kernel", "optimizer", "m")
    assert _paths.split_slot("dense/kernel") is None
    assert _paths.path_of_key(_paths.checkpoint_key("a/b")) == "a/b"


def _proto(edges: dict[int, list[tuple[str, int]]], count: int):
    nodes = [types.SimpleNamespace(children=[types.SimpleNamespace(local_name=n, node_id=i)
                                             for n, i in edges.get(k, [])])
             for k in range(count)]
    return types.SimpleNamespace(nodes=nodes)


def test_graph_paths_are_breadth_first_shortest_and_escaped():
    # 0 -> a(1) -> deep(3) -> x(4); 0 -> b.c(2) -> x(4) again: x's first path is via b.c
    proto = _proto({0: [("a", 1), ("b.c", 2)], 1: [("deep", 3)], 2: [("x", 4)],
                    3: [("x", 4)]}, 5)
    assert _paths.graph_paths(proto) == {0: "", 1: "a", 2: "b..c", 3: "a/deep",
                                         4: "b..c/x"}
    assert _paths.graph_paths(proto, 1) == {1: "", 3: "deep", 4: "deep/x"}
    pruned = _paths.graph_paths(proto, skip=lambda node, name: name == "b.c")
    assert pruned == {0: "", 1: "a", 3: "a/deep", 4: "a/deep/x"}


def test_graph_walk_defers_follows_slots_and_ignores_ids_outside_the_graph():
    # 0 -> opt(1) -> vars(3) -> w(4); 0 -> layer(2) -> w(4): deferring `opt` gives w its
    # path through the layer, as `objckpt.graph` draws a trained Keras 3 model.
    proto = _proto({0: [("opt", 1), ("layer", 2), ("bad", 99), ("neg", -1)],
                    1: [("vars", 3)], 2: [("w", 4)], 3: [("w", 4)]}, 6)
    for node in proto.nodes:
        node.slot_variables = []
    proto.nodes[1].slot_variables = [types.SimpleNamespace(slot_name="m",
                                                           slot_variable_node_id=5)]
    plain = list(_paths.graph_walk(proto))
    assert plain == [(0, "opt", 1), (0, "layer", 2), (1, "vars", 3), (2, "w", 4)]
    deferred = list(_paths.graph_walk(proto, defer=lambda node, name: name == "opt"))
    assert deferred == [(0, "layer", 2), (2, "w", 4), (0, "opt", 1), (1, "vars", 3)]
    with_slots = list(_paths.graph_walk(proto, slots=True))
    assert with_slots == [*plain[:3], (1, "m", 5), (2, "w", 4)]
