"""Optimizer state moves by the variable it belongs to, never by position (invariant 9).

Owners come from the source (TF slot tables, saved names, Keras 3 variable lists, TF1 slot
names); an entry whose owner feeds nothing is skipped and listed; an entry with no known
owner moves by path only when both sides lay out network and optimizer identically. An
entry placed by its owner reports strategy "slot"; one matched by a path a rule rewrote
reports "rule", as network variables do.
"""

from __future__ import annotations

from objckpt import _compat
from objckpt._base import paths as _paths
from objckpt._planning.rules import rewrite
from objckpt._planning.targets import candidates, is_optimizer_key

__all__ = ["place_optimizer_state"]

# Strategies that place a network variable where the source's own layout has it: the same
# path (a checkpoint), or the same place in a Keras 3 weights file (`layers/dense/vars/0`).
_SAME_LAYOUT = ("exact", "keras layout")


def place_optimizer_state(source, targets, view, rules, optimizer_left, chosen, unmatched,
                           skipped, notes) -> None:
    """Places optimizer entries by the variable they belong to; by path only when safe.

    An entry whose owner the source records goes to the obj's slot of the same role
    on the variable that owner feeds; if that owner feeds nothing, it is skipped and
    listed. An entry with no recorded owner (an iteration counter aside) moves by its
    path only when both sides lay out the network identically (every network
    variable matched by its exact path, nothing left over), where positions agree;
    otherwise it is unmatched, never guessed.
    """
    canon = lambda full: source.aliases.get(full, full)  # noqa: E731
    fed = {canon(view[entry[0]]): target for target, entry in chosen.items()}
    view_of = {canon(full): key for key, full in view.items()}
    key_of_name = {}
    for key, full in view.items():
        name = source.names.get(full, "")
        if name:
            key_of_name[name] = None if name in key_of_name else key
    owners = source.owners()
    # A Keras weights file holds a LoRA layer's merged kernel, not its factors (Keras's
    # loader zeroes them): a factor whose kernel is fed is in the same layout still.
    lora = targets.lora() if not source.keyed_by_path else {}
    network_exact = all(t in chosen and chosen[t][1] in _SAME_LAYOUT for t in targets.network
                        if t not in targets.rng and lora.get(t) not in chosen) \
        and not any(not is_optimizer_key(k) for k in unmatched)
    if network_exact and _same_optimizer_layout(source, targets, view, optimizer_left, chosen):
        # The same network and the same optimizer layout on both sides (a model restored
        # from its own checkpoint): every entry has its twin at the same path.
        by_layout = 0
        for key, new in optimizer_left:
            strategy, found = candidates(new, targets, new != key)
            chosen[found[0]] = _by_path(key, strategy if strategy in _SAME_LAYOUT else "exact",
                                        rules)
            by_layout += strategy == "keras layout"
        if by_layout:  # a Keras 3 weights file names no owners: say what was assumed
            notes.append(f"{by_layout} optimizer entries moved by their place in the Keras 3 "
                         "weights file (it records no owners): the obj's optimizer has the "
                         "same variables in the same shapes, so the same layers are assumed "
                         "trainable on both sides; if not, pass optimizer_state=False")
        return
    orphans = layout_skipped = untrained = 0
    with_slots = {target for target, _ in targets.slots}
    for key, new in optimizer_left:
        full = view[key]
        counter = None
        if _paths.split_slot(key) is None and not _compat.TF1_SLOT.match(key):
            counter = _compat.COUNTERS.get(key.rsplit("/", 1)[-1].lstrip("_"))
        if counter is not None and counter in targets.counters:
            found = [p for p in targets.counters[counter] if p not in chosen]
            if len(found) > 1:  # several optimizers: the one at the same place
                parent = new.rpartition("/")[0]
                found = [p for p in found if p.rpartition("/")[0] == parent]
            if len(found) == 1:
                chosen[found[0]] = (key, "slot", None)
                continue
        if counter in _compat.HYPERPARAMETERS and counter not in targets.counters:
            skipped.append(f"{full}: a hyperparameter of Keras 2's optimizer; the obj's "
                           "optimizer keeps none of that name")
            continue
        owner, role = owners.get(canon(full), (None, None))
        owner = view_of.get(canon(owner)) if owner is not None else None
        if owner is None:
            owner, role = _owner_by_name(source, view, key, key_of_name)
        if owner is not None:
            target = fed.get(canon(view.get(owner, owner)))
            if target is None:
                rewritten, _ = rewrite(owner, rules)
                if rewritten is not None:
                    _, found = candidates(rewritten, targets, rewritten != owner)
                    target = found[0] if len(found) == 1 else None
            if target is None:
                skipped.append(f"{full}: optimizer state of `{owner}`, which feeds no variable "
                               "of the obj")
                orphans += 1
                continue
            slot = targets.slots.get((target, _compat.SLOT_ALIASES.get(role, role)))
            if slot is not None and slot not in chosen:
                chosen[slot] = (key, "slot", None)
            elif slot is None and target not in with_slots and with_slots:
                # The obj's optimizer trains other variables only (built on a subset: a
                # weight that gets no gradient in its loop): nothing here to hold it.
                skipped.append(f"{full}: optimizer state of `{owner}`, a variable the obj's "
                               "optimizer does not train (it was built on the others)")
                untrained += 1
            else:
                unmatched.append(key)
            continue
        strategy, found = candidates(new, targets, new != key)
        if strategy == "keras layout":
            # A place in a Keras weights file (`optimizer/vars/3`) is a position: with
            # layouts that differ it names another variable's state (Keras's own loader
            # skips the optimizer then).
            skipped.append(f"{full}: optimizer state at a position of a Keras weights file, "
                           "which records no owners; the obj's optimizer has another "
                           "layout, so it is skipped, as Keras's own loader skips it")
            layout_skipped += 1
            continue
        if (network_exact and len(found) == 1 and found[0] not in chosen
                and found[0] in targets.optimizer_paths):
            chosen[found[0]] = _by_path(key, strategy, rules)
        elif key.rsplit("/", 1)[-1] in ("beta1_power", "beta2_power") and not found:
            skipped.append(f"{full}: TF1 Adam's running beta power; the obj's optimizer "
                           "computes it from the step count, which moves")
        else:
            unmatched.append(key)
    if untrained:
        notes.append(f"{untrained} optimizer entries of the source belong to variables the "
                     "obj's optimizer does not train (built on the others); they were skipped")
    if layout_skipped:
        notes.append(f"{layout_skipped} optimizer entries of a Keras weights file were skipped: "
                     "it records no owners and the obj's optimizer has another layout (built "
                     "on other variables); pass optimizer_state=False to skip them silently")
    if orphans:
        notes.append(f"{orphans} optimizer entries of the source belong to variables that feed "
                     "nothing in the obj; they were skipped (listed under skipped)")


def _by_path(key: str, strategy: str, rules) -> tuple:
    """The plan's entry for an optimizer key matched by its own (rewritten) path: "rule",
    with the rule and its transform, when a rule rewrote it, as for network keys."""
    _, rule = rewrite(key, rules)
    return (key, strategy, None) if rule is None else (key, "rule", rule)


def _same_optimizer_layout(source, targets, view, optimizer_left, chosen) -> bool:
    """Whether every optimizer entry has a twin at its own path in the obj (and back),
    with the same shape and, where the source saved names, the same role at the end of
    the name (`adam/dense_kernel_momentum` ~ `adamw/dense_3_kernel_momentum`)."""
    wanted = {p for p in targets.optimizer_paths if p not in chosen}
    found = set()
    for key, new in optimizer_left:
        _, paths = candidates(new, targets, new != key)
        if len(paths) != 1 or paths[0] not in wanted or paths[0] in found:
            return False
        variable = targets.paths[paths[0]]
        if tuple(variable.shape) != tuple(source.specs[view[key]][0]):
            return False
        name = source.names.get(view[key], "")
        if name and _role_of(name) != _role_of(_compat.variable_name(variable)):
            return False
        found.add(paths[0])
    return found == wanted


def _role_of(name: str) -> str:
    """The role an optimizer variable's name ends in (`..._momentum` -> momentum; the
    owner's part of the name differs between instances: `dense_3_kernel`)."""
    leaf = name.split(":")[0].rsplit("/", 1)[-1]
    known = next((r for r in _compat.KERAS3_ROLES if leaf.endswith("_" + r)), None)
    return known or leaf.rsplit("_", 1)[-1]


def _owner_by_name(source, view, key, key_of_name):
    """(view key of the owner, role) from a TF1 slot name or a saved slot name."""
    parts = _paths.split_slot(key)
    if parts is not None:
        return parts[0], parts[2]
    tf1 = _compat.TF1_SLOT.match(key)
    if tf1 is not None:
        return tf1.group("var"), tf1.group("slot")
    named = _compat.NAMED_SLOT.match(source.names.get(view[key], ""))
    if named is not None and key_of_name.get(named.group("var")):
        return key_of_name[named.group("var")], named.group("slot")
    return None, None
