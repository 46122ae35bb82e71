"""Whole-model strategies over what path matching left: saved names, structure, export order.

A Keras 2 / tf_keras HDF5 file (`save_weights("w.h5")`) is matched first as Keras's own
`load_weights` matches it: its weights found by layer and weight name take role renames
(`depthwise_kernel` -> `kernel`, `_roles.ROLE_ALIASES`); when names still leave a network
variable or entry over (auto-generated names drift between processes: `conv2d` in the file
is `conv2d_609` in the obj), "topological order" pairs the file's layers with weights with
the obj's (`model.layers`) by position and each layer's weights in Keras's HDF5 order, every
shape and dtype checked, all or nothing; the plan's note says why it was used or not.

The others run only when no network variable matched by path (the two sides use different naming
schemes) and are all or nothing: "keras name" pairs every leftover entry with a network
variable by the Keras/TF name it was saved under; "structure" goes layer by layer, in
depth-first order, by weight role (through `_roles.ROLE_ALIASES`) and shape, if and only if
the two sequences of layers line up exactly; "export order" pairs a Keras `model.export`'s
flat `variables/<i>` list with the obj's `model.variables` in order.
"""

from __future__ import annotations

import re

from objckpt import _compat
from objckpt._base import render as _render
from objckpt._base.roles import ROLE_ALIASES as _ROLE_ALIASES
from objckpt._planning.targets import is_optimizer_key

__all__ = ["match_structure"]


def _dfs_keys(paths: list[str]) -> dict:
    """Depth-first sort keys of paths listed breadth-first (TF's order)."""
    rank: dict = {}  # (rank of the parent prefix, edge) -> rank: linear in each path's length
    keys = {}
    for path in paths:
        node, key = -1, []
        for part in path.split("/"):
            node = rank.setdefault((node, part), len(rank))
            key.append(node)
        keys[path] = tuple(key)
    return keys


def _layers(paths_and_specs) -> list[tuple[str, list]]:
    """Groups (path, shape, id) by parent path, in depth-first order."""
    paths = [p for p, _, _ in paths_and_specs]
    order = _dfs_keys(paths)
    groups: dict = {}
    for path, shape, ident in sorted(paths_and_specs, key=lambda item: order[item[0]]):
        parent, _, leaf = path.rpartition("/")
        groups.setdefault(parent, []).append((leaf.lstrip("_") or leaf, tuple(shape), ident))
    return list(groups.items())


def _structure(source_left, target_left, aliases_of=lambda path: {}):
    """Matches leftovers layer by layer. Returns (pairs, ambiguous, note).

    aliases_of(target path) gives the role renames of the layer holding that
    variable ({old role: new role}); source roles are read through them.
    """
    src_layers = _layers(source_left)
    tgt_layers = _layers(target_left)
    if len(src_layers) != len(tgt_layers):
        return [], [], (f"structure: not used: the source has {len(src_layers)} unmatched "
                        f"layers with weights, the obj {len(tgt_layers)}")
    pairs, ambiguous = [], []
    for (src_name, src), (tgt_name, tgt) in zip(src_layers, tgt_layers):
        renames = aliases_of(tgt[0][2]) if tgt else {}
        src = [(renames.get(r, r), s, i) for r, s, i in src]
        if sorted((r, s) for r, s, _ in src) != sorted((r, s) for r, s, _ in tgt):
            describe = lambda ws: ", ".join(f"{r}{s}" for r, s, _ in ws)  # noqa: E731
            return [], [], (f"structure: not used: layer `{src_name or '(root)'}` of the source "
                            f"({describe(src)}) does not line up with `{tgt_name or '(root)'}` "
                            f"of the obj ({describe(tgt)})")
        for role, shape, src_ident in src:
            same = [t for r, s, t in tgt if r == role and s == shape]
            if len(same) == 1:
                pairs.append((src_ident, same[0]))
            else:
                ambiguous.append((src_ident, tuple(same)))
    return pairs, ambiguous, ""


def match_structure(source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets,
                     rewritten):
    """Keras 2 HDF5 order, saved names, structure, export order over the leftovers;
    returns (still unmatched, note).

    A Keras 2 HDF5 file first takes role renames and, where names fall short, topological
    order (`_h5_topological`). The others run only when no network variable matched by path
    (the two sides use different naming schemes), and each is all or nothing. Keys are
    taken as rules rewrote them, so a rule renaming a leaf takes part.
    """
    ordered = ""
    if source.h5_layers:  # a Keras 2 HDF5 file: role renames, then Keras's own order
        unmatched = _h5_roles(source, targets, view, unmatched, chosen, rewritten)
        unmatched, applied, ordered = _h5_topological(
            source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets, rewritten)
        if applied:
            return unmatched, ordered
    unmatched, note = _by_structure(source, targets, view, unmatched, chosen, ambiguous,
                                    ambiguous_targets, rewritten)
    return unmatched, "; ".join(n for n in (ordered, note) if n)


def _by_structure(source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets,
                  rewritten):
    """Saved names, then structure, then export order (see `match_structure`)."""
    if any(p in chosen or p in ambiguous_targets for p in targets.network
           if p not in targets.rng):
        # Names line up at least in part: the rest is for rules, never for a guess.
        return unmatched, ""
    left_targets = [p for p in targets.network if p not in targets.rng]
    src_left = [(rewritten.get(key, (key, None))[0], source.specs[view[key]][0], key)
                for key in unmatched if not is_optimizer_key(key)]
    if not src_left or not left_targets:
        return unmatched, ""
    if len(src_left) != len(left_targets):
        return unmatched, (f"structure: not used: the source has {len(src_left)} network "
                           f"entries, the obj {len(left_targets)} network variables")
    rule_of = {key: rewritten.get(key, (key, None))[1] for _, _, key in src_left}
    pairs = _by_saved_name(source, targets, view, src_left)
    strategy = "keras name"
    amb, note = [], ""
    if pairs is None:
        strategy = "structure"
        holders = targets.holders()
        tgt_left = [(targets.network[p], tuple(targets.paths[p].shape), p) for p in left_targets]
        pairs, amb, note = _structure(src_left, tgt_left,
                                      lambda path: _ROLE_ALIASES.get(holders.get(path), {}))
    if not pairs and not amb:
        ordered = _by_export_order(source, targets, view, src_left, left_targets)
        if ordered:
            strategy, pairs, note = "export order", ordered, (
                "export order: the source's entries are a Keras `model.export` list "
                "(`variables/0`, `variables/1`, ...) whose saved names do not tell the "
                "variables apart; each was matched to the obj's variable at the same place in "
                "`model.variables`, every shape and dtype checked in that order")
    for key, target in pairs:  # "rule" when a rule rewrote the key (a renamed role)
        chosen[target] = (key, strategy if rule_of[key] is None else "rule", rule_of[key])
    for key, found in amb:
        ambiguous.append((view[key], found))
        ambiguous_targets.update(found)
    used = {k for k, _ in pairs} | {k for k, _ in amb}
    return [k for k in unmatched if k not in used], note


_EXPORT_KEY = re.compile(r"variables/(0|[1-9][0-9]{0,8})")


def _by_export_order(source, targets, view, src_left, left_targets):
    """Pairs a Keras export's flat `variables/<i>` list with the obj's `model.variables`
    in order, or None: only when every leftover key is such an entry, the indexes are
    0..n-1, n is the number of the obj's network variables, and every shape and dtype
    agrees in that order (the list is the exporting model's own `variables`)."""
    index = {}
    for _, _, key in src_left:
        found = _EXPORT_KEY.fullmatch(view[key])
        if found is None:
            return None
        index[int(found.group(1))] = key
    order = [p for p in targets.order() if p in set(left_targets)]
    if sorted(index) != list(range(len(order))) or len(order) != len(left_targets):
        return None
    pairs = []
    for i, path in enumerate(order):
        shape, dtype = source.specs[view[index[i]]]
        variable = targets.paths[path]
        if tuple(variable.shape) != tuple(shape) or variable.dtype.base_dtype != dtype:
            return None
        pairs.append((index[i], path))
    return pairs


def _by_saved_name(source, targets, view, src_left):
    """Pairs every leftover entry with a network variable by the Keras/TF name it was
    saved under (`Conv1/kernel`, role renames applied), or None unless all pair up
    one to one with equal shapes."""
    if not source.names:
        return None
    holders = None
    index: dict = {}
    for path in targets.network:
        if path in targets.rng:
            continue
        name = _compat.variable_name(targets.paths[path])
        index.setdefault(name, []).append(path)
        head, _, leaf = name.rpartition("/")
        if holders is None:
            holders = targets.holders()
        for old, new in _ROLE_ALIASES.get(holders.get(path), {}).items():
            if leaf.lstrip("_") == new:
                index.setdefault(f"{head}/{old}" if head else old, []).append(path)
    pairs, taken = [], set()
    for _, shape, key in src_left:
        name = source.names.get(view[key], "")
        name = name[:-2] if name.endswith(":0") else name
        found = index.get(name, [])
        if len(found) != 1 or found[0] in taken or \
                tuple(targets.paths[found[0]].shape) != tuple(shape):
            return None
        taken.add(found[0])
        pairs.append((key, found[0]))
    return pairs


def _rule_touched(chosen, rewritten, keys) -> bool:
    """Whether a rule rewrote one of keys: the user's rules then decide, never an order."""
    return any(rewritten.get(key, (key, None))[1] is not None for key in keys) or any(
        rule is not None for key, _, rule in chosen.values() if key in keys)


def _h5_roles(source, targets, view, unmatched, chosen, rewritten):
    """Entries of a Keras 2 HDF5 file that name a weight by its old role (`conv_dw_1/
    depthwise_kernel`) find it under the new one (`conv_dw_1/kernel`) in a layer of the
    class that renamed it: strategy "layer name". Returns the keys still unmatched."""
    left = [key for key in unmatched if not is_optimizer_key(key)
            and rewritten.get(key, (key, None))[1] is None]
    if not left or not any(_ROLE_ALIASES.values()):
        return unmatched
    index, holders, taken = targets.h5_names(), None, set()
    used = set()
    for key in left:
        head, _, leaf = view[key].rpartition("/")
        found = set()
        for holder, renames in _ROLE_ALIASES.items():
            new = renames.get(leaf)
            if new is None:
                continue
            if holders is None:
                holders = targets.holders()
            found.update(p for p in index.get(f"{head}/{new}" if head else new, ())
                         if holders.get(p) == holder)
        if len(found) != 1:
            continue
        path = found.pop()
        if path in chosen or path in taken or \
                tuple(targets.paths[path].shape) != tuple(source.specs[view[key]][0]):
            continue
        taken.add(path)
        used.add(key)
        chosen[path] = (key, "layer name", None)
    return [k for k in unmatched if k not in used]


def _h5_topological(source, targets, view, unmatched, chosen, ambiguous, ambiguous_targets,
                    rewritten):
    """Pairs a Keras 2 HDF5 file's layers with the obj's by position, as Keras's
    `load_weights` does, when names leave a network variable or entry over, or pair
    weights of different shapes.

    Returns (unmatched, applied, note). Nothing is done (note "") when names matched every
    network variable with its shape, when the source is viewed under an `at` (the file's
    layers are not the obj's), or when rules rewrote its keys (the user's rules decide).
    Otherwise either the network pairs in chosen are replaced (applied) and the note says
    why, or nothing changes and the note says why the order could not be used.
    """
    network = [p for p in targets.network if p not in targets.rng]
    file_keys = {key for _, keys in source.h5_layers for key in keys}
    if not network or any(view.get(key) != key for key in file_keys) or \
            _rule_touched(chosen, rewritten, file_keys):
        return unmatched, False, ""
    left = sum(k in file_keys for k in unmatched)
    missing = sum(p not in chosen for p in network)
    other_shape = sum(p in chosen and tuple(targets.paths[p].shape) !=
                      tuple(source.specs[view[chosen[p][0]]][0]) for p in network)
    if not left and not missing and not other_shape and \
            not any(p in ambiguous_targets for p in network):
        return unmatched, False, ""  # names matched every weight: the file's names decide
    by_name = (f"names matched {len(network) - missing} of the obj's {len(network)} network "
               f"variables" + (f", {other_shape} of them to an entry of another shape"
                               if other_shape else "")
               + (f", and left {left} of the file's entries over" if left else ""))
    pairs, problem = _topological_pairs(source, targets, network)
    if problem:
        return unmatched, False, f"topological order: not used: {problem} ({by_name})"
    for path in network:
        chosen.pop(path, None)
    for key, path in pairs:
        chosen[path] = (key, "topological order", None)
    network_set = set(network)
    ambiguous[:] = [(a, found) for a, found in ambiguous
                    if a not in file_keys and a not in network_set]
    ambiguous_targets.difference_update(network_set)
    used = {key for key, _ in pairs}
    return [k for k in unmatched if k not in used], True, (
        f"topological order: {_drift(source, targets)} ({by_name}); the file's "
        f"{len(source.h5_layers)} layers with weights were paired with the obj's in "
        "`model.layers` order, and each layer's weights in the order Keras saves them, as "
        "Keras's `load_weights` does; every shape and dtype was checked")


def _topological_pairs(source, targets, network):
    """[(key, tree path)] pairing the file's layers with the obj's by position, or
    ([], problem) naming the first layer or weight that does not line up."""
    obj_layers = targets.h5_layers()
    file_layers = source.h5_layers
    if not obj_layers:
        return [], "the obj is no Keras model: it has no `layers` to pair in order"
    if len(file_layers) != len(obj_layers):
        return [], (f"the file has {len(file_layers)} layers with weights, the obj "
                    f"{len(obj_layers)}")
    pairs, fed = [], {}
    for k, ((file_layer, keys), (obj_layer, paths)) in enumerate(zip(file_layers,
                                                                     obj_layers)):
        where = (f"layer #{k} (`{_render.safe(file_layer)}` in the file, "
                 f"`{_render.safe(obj_layer)}` in the obj)")
        if len(keys) != len(paths):
            return [], f"{where} holds {len(keys)} weights in the file, {len(paths)} in the obj"
        for i, (key, path) in enumerate(zip(keys, paths)):
            if path is None or path not in targets.network:
                return [], f"{where}: its weight #{i} is no variable of the obj's tree"
            shape, dtype = source.specs[key]
            variable = targets.paths[path]
            if tuple(variable.shape) != tuple(shape) or variable.dtype.base_dtype != dtype:
                return [], (f"{where}: `{_render.safe(key)}` is {_render.shape(shape)} "
                            f"{dtype.name} in the file, its weight #{i} "
                            f"`{_render.safe(targets.shown(path))}` "
                            f"{_render.shape(tuple(variable.shape))} "
                            f"{variable.dtype.base_dtype.name} in the obj")
            if fed.get(path, key) != key:  # a weight two layers share: Keras writes it twice
                return [], (f"`{_render.safe(targets.shown(path))}` is a weight of two "
                            "layers; pass rules=... to say which entry feeds it")
            fed[path] = key
            pairs.append((key, path))
    missing = [p for p in network if p not in fed]
    if missing:
        return [], (f"{len(missing)} of the obj's network variables are in none of its "
                    f"layers (`{_render.safe(targets.shown(missing[0]))}`)")
    return pairs, ""


def _drift(source, targets) -> str:
    """Says how the file's layer names differ from the obj's, position by position."""
    differ = [(f, o) for (f, _), (o, _) in zip(source.h5_layers, targets.h5_layers())
              if f != o]
    if not differ:
        return "the file's layer names are the obj's"
    first = f"`{_render.safe(differ[0][0])}` in the file is `{_render.safe(differ[0][1])}` "
    first += "in the obj"
    more = f", and {len(differ) - 1} more" if len(differ) > 1 else ""
    return f"the file's layer names differ from the obj's ({first}{more})"
