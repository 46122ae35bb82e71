"""Export: an obj's variables written as safetensors, named and laid out by rules.

The variables are named and transformed here (each value transformed only when it is
written); the files are written by the safetensors format's write role in the format
registry (`_formats.safetensors_write`: the reference writer's bytes, sharding, the
temporary names and renames).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from objckpt import _compat, errors
from objckpt import rules as _ruleset
from objckpt._base import render as _render
from objckpt._formats import registry as _formats
from objckpt._formats import safetensors_write as _writer
from objckpt._ops import snapshot as _snapshot
from objckpt._planning import checks as _checks
from objckpt._planning import match as _match
from objckpt._planning import targets as _targets
from objckpt._planning import tree as _tree
from objckpt.rules import core as _rules_core
from objckpt.rules.huggingface import read_config as _read_hub_config

__all__ = ["Exported", "export"]

def _rule_set(rules):
    if rules is None or (isinstance(rules, (list, tuple)) and not rules):
        return None
    if isinstance(rules, _ruleset.RuleSet):
        return rules
    if isinstance(rules, (list, tuple)) and all(isinstance(r, _ruleset.Rule) for r in rules):
        return _ruleset.RuleSet(rules)
    raise errors.InvalidArgumentError(
        f"export needs rules that convert both ways: an objckpt.rules.RuleSet (or a list of "
        f"objckpt.rules.Rule). Received: rules={rules!r}; regex rules rewrite source keys "
        "one way only. Fix: write each as Rule('source.{i}.weight', 'target/{i}/kernel', "
        "transform).")


@dataclasses.dataclass
class _Tensor:
    """One tensor to write: its value is transformed (by `inverse`) when it is written."""

    name: str
    shown: str  # the variable's path, for messages
    value: object  # the variable's value (a tf.Tensor sharing its buffer)
    inverse: object  # the rule's inverse transform, or None
    rule: object
    dtype: str  # TF's dtype name, as written (transforms keep it; `export(dtype=)` casts)
    shape: tuple  # after the transform
    produced: str = ""  # the dtype the transform gives, when `dtype` is a cast of it

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * _writer.ITEMSIZE[_writer.DTYPES[self.dtype]]

    def array(self, path: str) -> np.ndarray:
        array = self._produce(path)
        if self.produced:  # cast as tf.cast casts (round to nearest even)
            import tensorflow as tf

            array = np.asarray(tf.cast(array, self.dtype).numpy())
        return array

    def _produce(self, path: str) -> np.ndarray:
        value, wanted = self.value, self.produced or self.dtype
        if isinstance(self.inverse, _Concat):
            return self.inverse(value)
        if self.inverse is not None:
            value = _transformed(self.inverse, value, self.shown, self.rule, path)
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if tuple(array.shape) != self.shape or array.dtype.name != wanted:
            raise errors.InvalidArgumentError(
                f"{self.rule!r}: the inverse transform of `{self.shown}` returned a "
                f"{array.dtype.name}{tuple(array.shape)} value; its output_shape said "
                f"{wanted}{self.shape}. Nothing was written to `{_render.safe(path)}`. "
                "Fix: make the transform's output_shape agree with what it returns.",
                source=path)
        return array if array.flags.c_contiguous else array.copy()  # 0-d stays 0-d


def _transformed(inverse, value, shown: str, rule, path: str):
    try:
        return inverse(value)
    except Exception as err:  # a user's transform may raise anything (TF's errors)
        raise errors.InvalidArgumentError(
            f"{rule!r}: the inverse transform fails on `{shown}` of shape "
            f"{tuple(value.shape)}: {_render.first_line(err)}. Nothing was written to "
            f"`{_render.safe(path)}`. Fix: attach the transform to the rule whose variables "
            "have the shape it expects.", source=path) from err


def _tensor(name, shown, value, inverse, rule, dtype, path) -> _Tensor:
    """The tensor to write; its shape from the transform's `output_shape` (objckpt.rules'
    transforms), so the value is transformed only when written, one tensor at a time.
    Other transforms are applied now."""
    shape = tuple(int(d) for d in value.shape)
    if inverse is not None:
        try:
            shape = tuple(inverse.output_shape(shape))
        except (AttributeError, NotImplementedError):  # not one of ours: transform it now
            value, inverse = _transformed(inverse, value, shown, rule, path), None
            shape = tuple(int(d) for d in value.shape)
        except errors.ObjckptError as err:
            raise errors.InvalidArgumentError(
                f"{rule!r}: the inverse transform fails on `{shown}` of shape "
                f"{tuple(value.shape)}: {_render.first_line(err)}. Nothing was written to "
                f"`{_render.safe(path)}`. Fix: attach the transform to the rule whose "
                "variables have the shape it expects.", source=path) from err
    return _Tensor(name, shown, value, inverse, rule, dtype, shape)


class Exported(str):
    """The path `objckpt.export` wrote (a str), and what it left out.

    Attributes:
      left_out: {object path: why} for each variable of the obj not written: random-generator
        state (Keras `SeedGenerator`s, `tf.random.Generator`s) always, optimizer state
        unless `optimizer_state=True`. Neither is a weight.
    """

    left_out: dict

    def __new__(cls, path: str, left_out: dict):
        self = super().__new__(cls, path)
        self.left_out = dict(left_out)
        return self


_RANDOM = ("random-generator state (a Keras SeedGenerator's or tf.random.Generator's), not a "
           "weight")
_OPTIMIZER = "optimizer state (written with optimizer_state=True)"


def _entries(obj, snap, rule_set, strict: bool, optimizer_state, path: str,
             left_out: dict) -> dict:
    """{name: _Tensor} in object-path order, renamed and transformed by the rules; what is
    no weight (random-generator state; optimizer state unless asked for) goes to `left_out`.

    A variable's default name is its path through the layers where it has one (a trained
    Keras 3 model's canonical path may run through its optimizer), else its object path."""
    keep_optimizer = _match.optimizer_mode(optimizer_state) is True
    variables = snap.origin() or _tree.tree(obj)
    targets = _targets.index_targets(obj, variables)
    random = {id(v) for v in _compat.random_state_variables(obj)} | {
        id(variables[p]) for p in targets.rng if p in variables}
    root = getattr(obj, "name", None)
    root = root if isinstance(root, str) else ""
    kinds = {kind.__name__ for kind in type(obj).__mro__}
    out, origin, unmatched = {}, {}, []
    for key, value in snap.items():
        own = targets.network.get(key, key)
        variable_name = targets.names.get(key, "")
        relative = (variable_name[len(root) + 1:] if root and
                    variable_name.startswith(root + "/") else "")
        aliases = (key, relative, variable_name)
        if key in variables and id(variables[key]) in random:
            left_out[own] = _RANDOM  # whatever strict is: readers take it for a weight
            continue
        if key in targets.optimizer_paths and not keep_optimizer:
            left_out[own] = _OPTIMIZER
            continue
        names, rule = [(own, None)], None
        if rule_set is not None:
            found = rule_set.export_names(own, *aliases)  # a Stack rule's: several
            if found is None:
                unmatched.append(own)
                if strict:
                    continue
            else:
                names, rule = found
                if kinds & set(getattr(rule, "unused_by", ())):  # a part the class lacks
                    left_out[own] = f"{rule.absent}; unused by {type(obj).__name__}"
                    continue
        for name, inverse in names:
            _add(out, origin, name, own, value, inverse, rule, path)
    if strict and unmatched:
        listed = [f"`{_render.safe(k)}`" for k in unmatched]
        raise errors.StructureMismatchError(
            f"{len(unmatched)} variable(s) of the obj match no rule's target, so they would "
            f"have no name in `{_render.safe(path)}`: {', '.join(listed[:8])}"
            f"{', ...' if len(listed) > 8 else ''}. Nothing was written. Fix: add rules for "
            "them, or pass strict=False to write them under their object paths.",
            problems=[f"{k}: matches no rule" for k in unmatched], source=path)
    return {name: _one(parts, path) for name, parts in out.items()}


def _add(out: dict, origin: dict, name: str, own: str, value, inverse, rule,
         path: str) -> None:
    """One tensor to write under `name`, checked: a dtype safetensors holds, not the
    header's reserved name, no other variable's name unless their rules share a source."""
    shown = _render.safe(own)
    dtype = getattr(value.dtype, "name", str(value.dtype))
    if dtype not in _writer.DTYPES:
        raise errors.UnsupportedObjectError(
            f"`{shown}` is a {dtype} variable; safetensors has no {dtype} dtype (it holds "
            f"{', '.join(sorted(_writer.DTYPES))}). Nothing was written to `{_render.safe(path)}`. "
            "Fix: give the variable one of those dtypes, or save the whole obj with "
            "objckpt.save (TF's format holds every dtype).", obj=own, source=path)
    if name == "__metadata__":
        raise errors.InvalidArgumentError(
            f"`{shown}` would be written as `__metadata__`, the name safetensors "
            "reserves for its metadata. Fix: map it to another name with a "
            "rule.", source=path)
    if name in origin and not _shares_source(origin[name][0][1], rule):
        both = [(origin[name][0]), (shown, rule)]
        said = " and ".join(f"`{p}`" + (f" (by {r!r})" if r is not None else
                                        " (its own path)") for p, r in both)
        raise errors.InvalidArgumentError(
            f"Two variables would be written as `{_render.safe(name)}`: {said}. "
            "A name holds one tensor. Fix: make the rules' source names distinct "
            "(a placeholder for what differs), or put the more specific rule "
            "first.", source=path)
    origin.setdefault(name, []).append((shown, rule))
    out.setdefault(name, []).append(_tensor(name, shown, value, inverse, rule, dtype, path))


def _shares_source(first, rule) -> bool:
    """Whether two rules name one tensor on purpose: objckpt.rules.Rules with the same
    source pattern (a Split's parts, or tied weights)."""
    return first is not None and rule is not None and first.source == rule.source


def _listed(parts) -> str:
    return ", ".join(f"`{p.shown}` (by {p.rule!r})" for p in parts)


def _one(parts: list, path: str) -> _Tensor:
    """The tensor written under one name: a variable's; the parts of a Split concatenated
    in index order; or tied variables' one value, checked equal."""
    splits = [_rules_core.split_of(part.rule.transform if part.rule is not None else None)[0]
              for part in parts]
    name = _render.safe(parts[0].name)
    if splits[0] is not None or any(s is not None for s in splits):
        if not all(s is not None and s.same_cut(splits[0]) for s in splits):
            raise errors.InvalidArgumentError(
                f"The variables written as `{name}` come from rules that do not cut it the "
                f"same way: {_listed(parts)}. Nothing was written to `{_render.safe(path)}`. "
                "Fix: give every rule of one source pattern a Split with the same axis and "
                "parts (or sizes), each with its own index; or none, for tied weights.",
                source=path)
        return _fused(parts, splits, path)
    if len(parts) > 1:
        _check_tied(parts, path)
    return parts[0]


def _fused(parts: list, splits: list, path: str) -> _Tensor:
    split, name = splits[0], _render.safe(parts[0].name)
    by_index: dict = {}
    for part, cut in zip(parts, splits):
        by_index.setdefault(cut.index, []).append(part)
    missing = [i for i in range(split.count) if i not in by_index]
    extra = {i: ps for i, ps in by_index.items() if len(ps) > 1}
    if missing or extra:
        said = []
        if missing:
            said.append(f"no variable gives part(s) {missing} of {split.count}")
        for index, ps in sorted(extra.items()):
            said.append(f"part {index} comes from {len(ps)} variables: {_listed(ps)}")
        raise errors.InvalidArgumentError(
            f"Cannot write `{name}` from its parts ({split!r}, index aside): "
            f"{'; '.join(said)}. Found: {_listed(parts)}. Nothing was written to "
            f"`{_render.safe(path)}`. Fix: give each index 0..{split.count - 1} exactly one "
            "rule whose target is a variable of the obj (the parts must all be there to "
            "make the one tensor).", source=path)
    ordered = [by_index[i][0] for i in range(split.count)]
    shape0, dtype = ordered[0].shape, ordered[0].dtype
    rank = len(shape0)
    problem = ""
    if not -rank <= split.axis < rank:
        problem = f"axis {split.axis} is not an axis of a part of shape {shape0}"
    else:
        axis = split.axis % rank
        for index, part in enumerate(ordered):
            want = split.sizes[index] if split.sizes is not None else shape0[axis]
            other = tuple(d for a, d in enumerate(part.shape) if a != axis)
            if part.dtype != dtype or len(part.shape) != rank or other != tuple(
                    d for a, d in enumerate(shape0) if a != axis) or part.shape[axis] != want:
                problem = (f"part {index} `{part.shown}` is {part.dtype}{part.shape}, but "
                           f"part 0 `{ordered[0].shown}` is {dtype}{shape0} and the Split "
                           f"wants {want} along axis {split.axis}")
                break
    if problem:
        raise errors.InvalidArgumentError(
            f"Cannot concatenate the parts of `{name}` ({split!r}, index aside): {problem}. "
            f"Nothing was written to `{_render.safe(path)}`. Fix: attach the rules to "
            "variables of matching shapes and dtype, or correct the Split.", source=path)
    shape = tuple(sum(p.shape[axis] for p in ordered) if a == axis else d
                  for a, d in enumerate(shape0))
    shown = ", ".join(p.shown for p in ordered)
    return _Tensor(ordered[0].name, shown, None, _Concat(tuple(ordered), axis, path),
                   ordered[0].rule, dtype, shape)


@dataclasses.dataclass(frozen=True)
class _Concat:
    """The inverse of a Split group: each part through its own inverse, then concatenated
    (only when written, as every tensor)."""

    parts: tuple
    axis: int
    path: str

    def __call__(self, _):
        return np.concatenate([part.array(self.path) for part in self.parts], axis=self.axis)


def _differing(a: np.ndarray, b: np.ndarray) -> int:
    """How many values of two arrays of one dtype and shape differ in their bytes."""
    rows = max(a.size, 1)
    return int(np.sum(np.any(a.reshape(-1).view(np.uint8).reshape(rows, -1)
                             != b.reshape(-1).view(np.uint8).reshape(rows, -1), axis=1)))


def _check_tied(parts: list, path: str) -> None:
    """Tied weights: every variable, through its rule's inverse, must give the same bytes."""
    first = parts[0].array(path)
    for part in parts[1:]:
        array = part.array(path)
        if array.dtype != first.dtype or array.shape != first.shape or (
                array.tobytes() != first.tobytes()):
            how = (f"{array.dtype.name}{tuple(array.shape)} vs "
                   f"{first.dtype.name}{tuple(first.shape)}"
                   if array.dtype != first.dtype or array.shape != first.shape else
                   f"{_differing(array, first)} of {array.size} value(s) differ")
            raise errors.InvalidArgumentError(
                f"`{parts[0].shown}` (by {parts[0].rule!r}) and `{part.shown}` (by "
                f"{part.rule!r}) are tied by their rules (both written as "
                f"`{_render.safe(parts[0].name)}`), but their values differ after the "
                f"inverse transforms ({how}). Nothing was written to "
                f"`{_render.safe(path)}`. Fix: tie the weights in the obj (or copy one into "
                "the other) before exporting, or give them different source names.",
                source=path)


def export(obj, path, *, rules=None, strict: bool = True, optimizer_state="auto",
           max_shard_size=None, metadata=None, dtype=None) -> str:
    """Writes obj's variables as safetensors, named and laid out by rules.

    Without rules each tensor is named by its object path (`dense/kernel` style, `/` kept,
    as `objckpt.tree(obj)` gives it), so `objckpt.restore(obj, path)` puts every value
    back. With an `objckpt.rules.RuleSet` each object path is renamed by the first rule
    whose target matches it and its value goes through the inverse of the rule's transform
    (a Keras kernel (in, out) becomes a torch weight (out, in) under `Transpose()`); the same
    set given to `restore` brings the file back, bit for bit.

    The header's `__metadata__` is `{"format": "pt"}` (Hugging Face's loaders refuse a file
    without a known format; the names and layouts the rules give are torch's), plus
    `metadata`. Optimizer state is not written unless `optimizer_state=True` (shared weights
    are for inference and fine-tuning, which start a fresh optimizer): "auto" and False
    leave it out.

    Args:
      obj: a trackable (Keras model or layer of any flavour, `tf.Module`,
        `tf.train.Checkpoint`).
      path: `<folder>/<name>.safetensors`, or a folder (the file is then
        `<folder>/model.safetensors`). Missing folders are created.
      rules: None, or an `objckpt.rules.RuleSet` (a list of `objckpt.rules.Rule`). A
        shipped Hugging Face set and a keras-hub model of a class it knows (a task model
        such as `BertMaskedLM`, or `BertBackbone`): the names of that model's Hub class
        (`bert.` + its head), and the folder's `config.json` names the class in
        `architectures` (written from the set's config when the folder has none).
      strict: with rules, a variable no rule's target matches is an error
        (True) or written under its object path (False).
      optimizer_state: "auto" or False: no optimizer state; True: written too.
      max_shard_size: bytes (int) or a size such as "5GB" / "2GiB": several
        `<name>-0000i-of-0000N.safetensors` files (split as Hugging Face
        splits: in name order, a new file when the next tensor would pass the
        size) and `<name>.safetensors.index.json`. One file when everything
        fits (no index), as Hugging Face does.
      metadata: str -> str pairs added to the header's `__metadata__`.
      dtype: None (default): each tensor in its variable's dtype. A floating dtype
        ("bfloat16", "float16", "float32", a `tf.DType`): every floating-point tensor
        written in it, cast as `tf.cast` casts (narrowing rounds: you asked for it), as
        the Hub publishes bfloat16 weights; integer and bool tensors keep theirs.

    Where the folder written to holds a Hugging Face `config.json` (one with
    `model_type` or `architectures`), its dtype (`torch_dtype`, and `dtype` where present,
    as transformers writes them) is set to the floating dtype written, so the two agree.

    Random-generator state (Keras `SeedGenerator`s, e.g. of Dropout layers, and
    `tf.random.Generator`s) is never written, whatever `strict` is: it is no weight, and
    readers of the file (transformers among them) take every tensor for one. Every weight is
    written as it is: export cannot tell which variables a restore filled, so one that a
    restore with strict=False left at its initial value (listed in that report's `missing`,
    e.g. the pooler of a backbone read from a folder without one) is written too. Check the
    restore's report before exporting.

    Returns:
      The path of the file written, or of the index when sharded: an `Exported` (a str)
      whose `left_out` maps each variable not written to why.

    Raises:
      InvalidArgumentError: a bad argument, two variables mapped to one name, a transform
        without an inverse.
      StructureMismatchError: (strict) variables no rule maps; they are listed.
      UnsupportedObjectError: a variable of a dtype safetensors lacks (string, complex).
      CheckpointWriteError: the files cannot be written; nothing under `path` changed.
      UnbuiltModelError: obj has no variables.
    """
    path = os.fspath(path)
    _writer.layout(path)  # the arguments checked before anything is read
    rule_set = _rule_set(rules)
    if not isinstance(strict, bool):
        raise errors.InvalidArgumentError(
            f"strict must be True or False. Received: strict={strict!r}. Fix: pass "
            "strict=False to write variables no rule maps under their paths.", source=path)
    _writer.shard_size(max_shard_size, path)
    _writer.header_metadata(metadata, path)
    wanted = _float_dtype(dtype, path)
    if isinstance(obj, _snapshot.Snapshot):
        raise errors.InvalidArgumentError(
            "objckpt.export needs the live obj (its layers name the variables); "
            "received a Snapshot. Fix: restore the Snapshot into the obj, then export "
            "the obj.", source=path)
    if rule_set is not None:  # a shipped set, made for a task model: its class's names
        rule_set = rule_set.for_model(obj)
    snap = _snapshot.snapshot(obj)
    left_out: dict = {}
    values = _entries(obj, snap, rule_set, strict, optimizer_state, path, left_out)
    if not values:
        raise errors.UnbuiltModelError(
            f"Nothing to export to `{_render.safe(path)}`: {_checks.describe_obj(obj)} has no "
            "variables to write. Fix: build the model (call it on a batch, or "
            "model.build(shape)) before exporting it.", source=path)
    if wanted is not None:
        values = {name: dataclasses.replace(t, dtype=wanted, produced=t.dtype)
                  if t.dtype in _FLOATS and t.dtype != wanted else t
                  for name, t in values.items()}
    written = _formats.writer("safetensors")(path, values, max_shard_size=max_shard_size,
                                             metadata=metadata)
    _hub_config(obj, rule_set, os.path.dirname(os.path.abspath(written)))
    floats = {t.dtype for t in values.values() if t.dtype in _FLOATS}
    if len(floats) == 1:
        _config_dtype(os.path.dirname(written), floats.pop())
    return Exported(written, left_out)


_FLOATS = ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")


def _float_dtype(dtype, path: str) -> str | None:
    """`export`'s `dtype` as a TF dtype name safetensors holds (None: each variable's)."""
    if dtype is None:
        return None
    name = getattr(dtype, "name", dtype)
    if not isinstance(name, str) or name not in _FLOATS or name not in _writer.DTYPES:
        raise errors.InvalidArgumentError(
            f"dtype must be None or a floating dtype safetensors holds. Received: "
            f"dtype={_render.safe_text(repr(dtype))}. Fix: pass one of "
            f"{', '.join(repr(f) for f in _FLOATS if f in _writer.DTYPES)}, or None to write "
            "each tensor in its variable's dtype.", source=path)
    return name


def _config_dtype(folder: str, written: str) -> None:
    """Sets the dtype of the Hugging Face `config.json` in `folder` (if any) to `written`:
    `torch_dtype`, and `dtype` where present, as transformers writes them."""
    config = os.path.join(folder or ".", "config.json")
    try:
        with open(config, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return  # none, or not JSON: not a Hugging Face config, left alone
    if not isinstance(data, dict) or not ({"model_type", "architectures"} & set(data)):
        return
    keys = [k for k in ("torch_dtype", "dtype") if k in data] or ["torch_dtype"]
    if all(data.get(k) == written for k in keys):
        return
    data.update({k: written for k in keys})
    temp = f"{config}.objckpt-tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(temp, config)


def _hub_config(obj, rule_set, folder: str) -> None:
    """A shipped Hugging Face set and a keras-hub model of a class it knows: the folder's
    `config.json` names that model's Hub class in `architectures` (`BertMaskedLM`:
    `["BertForMaskedLM"]`), the config the set was made from written when there is none;
    a backbone the set does not tie to one class (a Llama backbone serves `LlamaModel` and
    `LlamaForCausalLM`) keeps the folder's config, or gets the one it came from, as it was."""
    classes = getattr(rule_set, "classes", None) or {}
    hub = next((classes[k.__name__] for k in type(obj).__mro__ if k.__name__ in classes), None)
    target = os.path.join(folder, "config.json")
    config = dict(getattr(rule_set, "config", None) or {})
    if hub is None:  # a backbone of several classes: the config it came from, as it was
        hub = (config.get("architectures") or [None])[0]
        if hub is None or os.path.isfile(target):
            return
    if os.path.isfile(target):
        try:  # read as data, bounded; one that is no JSON object is left as it is
            config = _read_hub_config(folder)
        except errors.InvalidArgumentError:
            return
    elif not config:
        return
    config["architectures"] = [hub]
    staged = target + ".objckpt-tmp"
    with open(staged, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    os.replace(staged, target)
