"""What saved variable names tell: layer names, and the weight each optimizer slot belongs to.

Pure Python, no TensorFlow: works on TF's `TrackableObjectGraph` proto and on `_objgraph`'s
duck type of it (`.nodes[i].children`, `.attributes`, `.slot_variables`).

An object-based checkpoint records each variable's name beside its object path (the
`VARIABLE_VALUE` attribute's `full_name`): `conv/kernel` (Keras 3 functional and Sequential
models, tf_keras, Keras 2), `mlp/linear_0/w` (Sonnet, or a `tf.Module` that creates its
variables in its `name_scope`), `Variable` (a bare `tf.Variable`). The part before the last
`/` ends with the name of the layer or module that created the variable. Optimizer variables:

- Keras 3: `<optimizer>/<weight path, / as _>_<role>`
  (`adam/sequential_encoder_kernel_momentum` for the weight `sequential/encoder/kernel`), kept
  in lists aligned with the optimizer's `_trainable_variables` list (`_momentums`, ...);
- tf_keras and Keras 2 (2.11+ optimizers): `<optimizer>/<role>/<weight name>`
  (`Adam/m/dense/kernel`);
- TF1 and Keras 2 legacy optimizers: TF's `slot_variables` table (not parsed here).

Names are used only where they are unambiguous; where they disagree, nothing is guessed.
Keras 3 records the TensorFlow name of a variable, which for a subclassed model built by
calling it drops the inner layers' scopes (`net/kernel` for the weight `net/conv2d/kernel`):
a name several layers would share, or one its Keras 3 slot names contradict, is not used.
"""

from __future__ import annotations

from objckpt._base import paths as _paths

__all__ = ["KERAS3_ROLES", "NAMED_ROLES", "layer_names", "name_agrees", "slot_links",
           "slot_role", "variable_names"]

# Roles Keras 3 optimizers append to the weight's path (`add_variable_from_reference`),
# longest first so that `velocity_hat` is not read as `hat` of `..._velocity`.
KERAS3_ROLES = ("accumulated_delta_var", "gradient_accumulator", "average_gradient",
                "accumulated_grad", "velocity_hat", "accumulator", "momentum", "velocity",
                "average", "linear", "norm")
# Roles tf_keras / Keras 2 (2.11+) optimizers put between their name and the weight's.
NAMED_ROLES = frozenset({"m", "v", "vhat", "momentum", "velocity", "velocity_hat",
                         "average_gradient", "accumulator", "linear", "accumulated_grad",
                         "accumulated_delta_var", "average", "rms", "mg", "accum_grad",
                         "accum_var"})
# An optimizer's lists that are not per-weight state.
_NOT_STATE = frozenset({"_variables", "_trainable_variables", "_trainable_variables_indices"})


def variable_names(graph) -> dict[int, str]:
    """node id -> saved name (`full_name`, without `:0`) of every variable node that has one."""
    out = {}
    for node_id, node in enumerate(graph.nodes):
        for attribute in node.attributes:
            if attribute.name == _paths.VARIABLE_VALUE and attribute.full_name:
                name = attribute.full_name
                out[node_id] = name[:-2] if name.endswith(":0") else name
                break
    return out


def _index(local_name: str) -> int | None:
    """A list index edge (`0`, `12`) as a number; None for any other name (untrusted input:
    only short ASCII digit strings are converted)."""
    if 0 < len(local_name) <= 18 and local_name.isascii() and local_name.isdigit():
        return int(local_name)
    return None


def _is_list(node) -> bool:
    return bool(node.children) and all(_index(c.local_name) is not None for c in node.children)


def _list_items(graph, node_id: int) -> list[int] | None:
    """The children of a list node in index order, or None unless they are `0`..`n-1`."""
    items = {}
    for child in graph.nodes[node_id].children:
        index = _index(child.local_name)
        if index is None or index in items:
            return None
        items[index] = child.node_id
    if sorted(items) != list(range(len(items))):
        return None
    return [items[i] for i in range(len(items))]


def name_agrees(names: dict, owner: int, slot: int) -> bool:
    """Whether a slot's saved name spells its owner's saved name (either naming scheme)."""
    weight, slot_name = names.get(owner), names.get(slot)
    if not weight or not slot_name:
        return False
    head = slot_name[:-len(weight) - 1] if slot_name.endswith("/" + weight) else ""
    if "/" in head:  # tf_keras: <optimizer>/<role>/<weight>
        return True
    leaf = slot_name.rpartition("/")[2]
    return leaf.startswith(weight.replace("/", "_") + "_")


def slot_role(names: dict, owner: int, slot: int, fallback: str) -> str:
    """The role of a slot (`momentum`, `m`, ...) as its saved name spells it, else fallback."""
    weight, slot_name = names.get(owner, ""), names.get(slot, "")
    if weight and slot_name.endswith("/" + weight):
        head = slot_name[:-len(weight) - 1]
        if "/" in head:
            return head.rpartition("/")[2]
    leaf = slot_name.rpartition("/")[2]
    known = next((role for role in KERAS3_ROLES if leaf.endswith("_" + role)), None)
    key = weight.replace("/", "_") + "_"
    if known is None and weight and leaf.startswith(key) and len(leaf) > len(key):
        return leaf[len(key):]
    return known or fallback


def slot_links(graph, network: set, names: dict | None = None) -> list[tuple[int, str, int]]:
    """(weight node, role, slot node) for optimizer slots outside TF's `slot_variables` table.

    `network`: the node ids reached without entering an optimizer (the weights among them
    are what slots can belong to). Keras 3 optimizers: each list aligned with the
    optimizer's `_trainable_variables` (`_momentums`, `_velocities`, ...) pairs its i-th
    variable with the i-th weight, as the optimizer itself does; a list whose saved names
    contradict the pairing is left alone. Then, by saved name, for optimizer variables left:
    Keras 3's `<optimizer>/<path>_<role>` and tf_keras's `<optimizer>/<role>/<name>`,
    linked only when exactly one weight matches. Variables in TF's table are skipped.
    """
    names = variable_names(graph) if names is None else names
    table = {s.slot_variable_node_id for node in graph.nodes for s in node.slot_variables}
    by_name: dict = {}
    by_key: dict = {}
    for weight in sorted(n for n in network if n in names):
        by_name.setdefault(names[weight], []).append(weight)
        key = names[weight].replace("/", "_")
        # Keras 3 spells a weight without a Keras path (a tf.Variable) by its name: `w:0` as w_0
        for spelling in (key, key + "_0"):
            by_key.setdefault(spelling, []).append(weight)

    depth = max((name.count("/") + 1 for name in by_name), default=0)

    def named_owners(slot: int) -> set:
        return {w for w, _ in _owners_by_name(names[slot], by_name, by_key, depth)}

    listed: dict = {}  # list node -> its items: each list read once, however many refer to it

    def list_items(node_id: int):
        if node_id not in listed:
            listed[node_id] = _list_items(graph, node_id)
        return listed[node_id]

    links, linked, paired = [], set(table), set()  # paired: `_trainable_variables` lists done
    for node in graph.nodes:
        kids = {c.local_name: c.node_id for c in node.children}
        if "_trainable_variables" not in kids or "_variables" not in kids:
            continue
        trained_list = kids["_trainable_variables"]
        if trained_list in paired:
            continue  # another node refers to the same list: its pairings are made once
        paired.add(trained_list)
        trained = list_items(trained_list)
        if not trained or any(t not in names for t in trained):
            continue
        for local, kid in kids.items():
            items = None if local in _NOT_STATE else list_items(kid)
            if not items or len(items) != len(trained) or any(
                    i not in names or i in network or i in linked for i in items):
                continue
            if any(named_owners(i) - {t} for t, i in zip(trained, items)):
                continue  # a saved name spells another weight: not this list's pairing
            fallback = local.lstrip("_")
            for owner, slot in zip(trained, items):
                links.append((owner, slot_role(names, owner, slot, fallback), slot))
                linked.add(slot)
    for slot in sorted(names):
        if slot in network or slot in linked:
            continue
        found = _owners_by_name(names[slot], by_name, by_key, depth)
        if len(found) == 1:
            owner, role = found.pop()
            links.append((owner, role, slot))
    return links


def _owners_by_name(name: str, by_name: dict, by_key: dict, depth: int) -> set:
    """(weight, role) pairs a slot's saved name can spell; `depth`: the most `/`-separated
    parts a weight's name has (names are untrusted: the work stays linear in their length)."""
    found = set()
    parts = name.split("/")
    for i in range(max(2, len(parts) - depth), len(parts)):  # <optimizer>/<role>/<weight>
        if parts[i - 1] in NAMED_ROLES:
            found.update((w, parts[i - 1]) for w in by_name.get("/".join(parts[i:]), ()))
    if len(parts) > 1:  # Keras 3: <optimizer>/<weight path, / as _>_<role>
        leaf = parts[-1]
        for role in KERAS3_ROLES:
            if leaf.endswith("_" + role):
                found.update((w, role) for w in by_key.get(leaf[:-len(role) - 1], ()))
    return found


def layer_names(graph, parents: dict, links=(), names: dict | None = None) -> dict[int, str]:
    """node id -> the name of the layer or module it is, from its variables' saved names.

    An object is named when the variables hanging directly under it (`parents`: node id ->
    the node it hangs under in the drawn tree) share one saved prefix (`conv` for `conv/kernel`
    and `conv/bias`; `encoder` for `sequential/encoder/kernel`) that no other object claims.
    Lists are never named. An object holding a weight whose Keras 3 slot names spell another
    name (`links`: (weight, role, slot) outside TF's table) is not named.
    """
    names = variable_names(graph) if names is None else names
    distrusted = {parents.get(owner) for owner, _, slot in links
                  if not name_agrees(names, owner, slot)}
    direct: dict = {}
    for child, parent in parents.items():
        if child in names and parent is not None:
            direct.setdefault(parent, set()).add(names[child].rpartition("/")[0])
    claims: dict = {}
    for node_id, prefixes in direct.items():
        if len(prefixes) == 1 and node_id not in distrusted and \
                not _is_list(graph.nodes[node_id]):
            prefix = next(iter(prefixes))
            if prefix:
                claims.setdefault(prefix, []).append(node_id)
    return {nodes[0]: prefix.rpartition("/")[2] for prefix, nodes in claims.items()
            if len(nodes) == 1}
