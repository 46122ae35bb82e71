"""Whole-model strategies over what path matching left: saved names, structure, export order.

Each runs only when no network variable matched by path (the two sides use different naming
schemes) and is all or nothing: "keras name" pairs every leftover entry with a network
variable by the Keras/TF name it was saved under; "structure" goes layer by layer, in
depth-first order, by weight role (through `_roles.ROLE_ALIASES`) and shape, if and only if
the two sequences of layers line up exactly; "export order" pairs a Keras `model.export`'s
flat `variables/<i>` list with the obj's `model.variables` in order.
"""

from __future__ import annotations

import re

from objckpt import _compat
from objckpt._roles import ROLE_ALIASES as _ROLE_ALIASES
from objckpt._targets import is_optimizer_key

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
    """Saved names, then structure, over the leftovers; returns (still unmatched, note).

    Both run only when no network variable matched by path (the two sides use
    different naming schemes), and each is all or nothing. Keys are taken as
    rules rewrote them, so a rule renaming a leaf takes part.
    """
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
