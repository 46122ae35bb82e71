"""Rule sets proposed from names and shapes, where no rule set fits a source.

When a source's keys name none of the obj's variables (a safetensors file written by torch,
a checkpoint of another codebase), `plan` pairs the entries left over with the variables
left over, on evidence beyond their shapes: the weight's role (`weight` ~ `kernel`, `bias` ~
`beta`), a normalization's weight only with a normalization's, and a shared word (synonyms
folded; `post_attention` one word, not `attention`) or agreeing numbers, numbered siblings
compared by their place among their siblings (`layers.0` is the first of `block_1`,
`block_2`). Shapes must fit: equal, a torch `Linear` or conv weight transposed to a Keras
kernel, or a reshape that only splits or merges neighbouring axes. A pair is taken only when
each is the other's single best candidate: where the evidence ties, nothing is paired. Pairs
that differ only by their numbers become one rule with a `{i}` placeholder. The result is a
`objckpt.rules.RuleSet` on `Plan.proposed`, shown as Python in the plan's text: a
suggestion the user reviews. Nothing applies it: a restore without rules still fails, and
its error says a proposal is available. How often it is right (precision 1.0 on every
shipped Hugging Face set withheld and on tf-slim checkpoints) is measured by
tests/helpers/proposal_figures.py.

Cost: linear in the entries and variables, plus the pairs of an entry and a variable with the
same number of elements, which is bounded (`_PAIR_LIMIT`; beyond it nothing is proposed).
"""

from __future__ import annotations

import dataclasses
import re

from objckpt._base import render as _render
from objckpt._planning.match import Plan
from objckpt._planning.sources import Source
from objckpt._planning.targets import is_default_name, is_optimizer_key, strip
from objckpt.rules.core import Chain, ConvKernel, Reshape, Rule, RuleSet, Transpose
from objckpt.rules.huggingface import head_entries

__all__ = ["plan", "proposal_fix", "propose"]

_PAIR_LIMIT = 1_000_000  # (entry, variable) pairs of equal element counts scored at most
_WORD = re.compile(r"[A-Za-z]+|[0-9]+")
_NUMBER = re.compile(r"(?<![0-9])[0-9]+(?![0-9])")
_GLUED = re.compile(r"[A-Za-z]+([0-9]+)(?![0-9])")  # `sam3` of `sam3_mask_decoder`
# Words that name the same thing in torch / Hugging Face names and Keras names.
_SYNONYMS = {
    "layers": "layer", "h": "layer", "blocks": "layer", "block": "layer",
    "embed": "embed", "embedding": "embed", "embeddings": "embed", "emb": "embed",
    "wte": "embed", "tok": "embed", "token": "embed",
    "ln": "norm", "layernorm": "norm", "normalization": "norm", "bn": "norm", "norms": "norm",
    "batchnorm": "norm", "rmsnorm": "norm",
    "linear": "dense", "fc": "dense", "lin": "dense",
    "attn": "attention", "self": "attention", "mha": "attention",
    "ffn": "mlp", "feedforward": "mlp", "ff": "mlp", "ffw": "mlp",
    "lm": "head", "classifier": "head",
    "q": "query", "k": "key", "v": "value", "o": "output", "out": "output",
    "up": "intermediate", "down": "output", "wi": "intermediate", "wo": "output",
    "dw": "depthwise", "pw": "pointwise",
}
# Words that place the next word's part before or after it (`post_attention_layernorm`: the
# norm after the attention, not the attention's): the two make one word.
_PLACES = {"pre": "pre", "before": "pre", "post": "post", "after": "post"}
# A weight's role: the last part of its name, grouped by what it means.
_ROLES = {
    "weight": "w", "kernel": "w", "gamma": "w", "scale": "w", "embeddings": "w",
    "embedding": "w", "w": "w", "weights": "w",
    "bias": "b", "beta": "b", "offset": "b", "b": "b", "biases": "b",
    "running_mean": "mean", "moving_mean": "mean",
    "running_var": "var", "moving_variance": "var",
    "depthwise_weights": "w", "depthwise_kernel": "w",
}
# Last parts only a normalization's weights have.
_NORM_ROLES = {"gamma", "beta", "moving_mean", "moving_variance", "running_mean", "running_var"}


@dataclasses.dataclass(frozen=True)
class _Name:
    words: frozenset  # the words before the role, synonyms folded
    numbers: tuple  # the numbers, in order
    role: str  # the role group, or the last part itself
    last: str  # the last part, lowercased
    norm: bool = False  # a normalization's weight, by its words or its last part
    # The name's place among its siblings (the names that differ from it only by their
    # numbers): per number that differs between them, (its rank among their values, how
    # many values there are). () when it has no such sibling.
    place: tuple = ()


def _parsed(name: str) -> _Name:
    parts = [p for p in re.split(r"[/.]", name) if p]
    last = parts[-1].lower() if parts else ""
    words, numbers = set(), []
    for part in parts[:-1]:
        place = ""
        for token in _WORD.findall(part):
            if token.isdigit():
                numbers.append(int(token))
                continue
            token = token.lower()
            if token in _PLACES:
                place = _PLACES[token]
                continue
            token = _SYNONYMS.get(token, token)
            words.add(f"{place}_{token}" if place else token)
            place = ""
    numbers += [int(t) for t in _WORD.findall(last) if t.isdigit()]
    norm = "norm" in words or last in _NORM_ROLES or any(w.endswith("_norm") for w in words)
    return _Name(frozenset(words), tuple(numbers), _ROLES.get(last, last), last, norm)


def _common(names: dict) -> set:
    """The words most of one side's names have."""
    counts: dict = {}
    for parsed in names.values():
        for word in parsed.words:
            counts[word] = counts.get(word, 0) + 1
    return {w for w, n in counts.items() if 2 * n > len(names) >= 4}


def _leading(names: dict):
    """The number glued to the word most of one side's names start with (a model's name:
    the `3` of keras-hub's `sam3_mask_decoder/...`, which tells none apart), or None."""
    counts: dict = {}
    for name in names:
        glued = _GLUED.match(name)
        if glued:
            counts[int(glued.group(1))] = counts.get(int(glued.group(1)), 0) + 1
    found = [n for n, c in counts.items() if 2 * c > len(names) >= 4]
    return found[0] if found else None


def _placed(names: dict, common: set) -> dict:
    """{name: its `_Name`, with its place among its siblings and without the `common` words
    (`transformer` in GPT-2's `transformer.h.0` and keras-hub's `transformer_layer_0`: most
    names of both sides have it, so it tells none apart), nor the number most of them lead
    with} for the names of one side."""
    if common:
        names = {name: dataclasses.replace(parsed, words=parsed.words - common)
                 for name, parsed in names.items()}
    leading = _leading(names)
    if leading is not None:
        names = {name: dataclasses.replace(parsed, numbers=parsed.numbers[1:])
                 if _GLUED.match(name) and int(_GLUED.match(name).group(1)) == leading
                 else parsed for name, parsed in names.items()}
    groups: dict = {}
    for name, parsed in names.items():
        groups.setdefault(_NUMBER.sub("#", name), []).append(name)
    out = {}
    for members in groups.values():
        if len(members) < 2:
            out.update((m, names[m]) for m in members)
            continue
        columns = list(zip(*(names[m].numbers for m in members)))
        ranks = [{n: rank for rank, n in enumerate(sorted(set(column)))} for column in columns]
        for member in members:
            numbers = names[member].numbers
            place = tuple((ranks[j][numbers[j]], len(ranks[j]))
                          for j in range(len(ranks)) if len(ranks[j]) > 1)
            out[member] = dataclasses.replace(names[member], place=place)
    return out


def _numbers(key: _Name, var: _Name):
    """What the numbers say of a pair: 1 for, 0 nothing, None against. Where both names
    have numbered siblings arranged alike (as many values of each number), their places
    decide (a first block numbered 0 on one side and 1 on the other is still the first);
    else their numbers must be equal."""
    if key.place and [n for _, n in key.place] == [n for _, n in var.place]:
        return 1 if key.place == var.place else None
    if (key.place and not var.numbers) or (var.place and not key.numbers):
        return None  # one of numbered siblings is not an unnumbered name's counterpart
    if key.numbers and var.numbers:
        return 1 if key.numbers == var.numbers else None
    return 0


def _score(key: _Name, var: _Name) -> int:
    """How well a source name fits a variable's name: 0 when it does not."""
    if key.role != var.role or key.norm != var.norm:  # a norm's bias is no dense's
        return 0
    shared = len(key.words & var.words)
    numbered = _numbers(key, var)
    if numbered is None or (not shared and not numbered):
        return 0
    return 4 * shared + 3 * numbered + (key.last == var.last)


def _size(shape) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def _bounds(shape) -> set:
    """Where a row-major layout of `shape` breaks between axes, in elements."""
    out, size = set(), 1
    for dim in shape[:-1]:
        size *= dim
        out.add(size)
    return out


def _regroups(shape: tuple, target: tuple) -> bool:
    """Whether a reshape from `shape` to `target` only splits or merges neighbouring axes
    (`(16, 32)` -> `(16, 4, 8)`), keeping every element's place along the others; a reshape
    that moves elements between axes (`(16, 16)` -> `(4, 16, 4)`) is a layout change no
    name can tell, never proposed."""
    a, b = _bounds(shape), _bounds(target)
    return a <= b or b <= a


def _torch_heads(shape: tuple, target: tuple):
    """A torch (out, in) weight as a (heads, in, head_dim) kernel (Gemma's query), or None."""
    if len(shape) == 2 and len(target) == 3 and target[1] == shape[1] \
            and target[0] * target[2] == shape[0] and target[0] > 1:
        return Chain(Reshape(shape, (target[0], target[2], shape[1])), Transpose((0, 2, 1)))
    return None


def _fit(shape: tuple, target: tuple, torch_layout: bool):
    """(fits, transform, exactness) turning a value of `shape` into one of `target`."""
    reverse = tuple(reversed(shape))
    if torch_layout and len(shape) >= 2:
        if len(shape) == 2 and reverse == target:
            return True, Transpose(), 2
        layouts = {3: ("OIW", "WIO"), 4: ("OIHW", "HWIO"), 5: ("OIDHW", "DHWIO")}
        if len(shape) in layouts and len(shape) == len(target):
            conv = ConvKernel(*layouts[len(shape)])
            if conv.output_shape(shape) == target:
                return True, conv, 2
    if shape == target:
        return True, None, 2
    if _size(shape) != _size(target):
        return False, None, 0
    if len(shape) == 2 and reverse == target:
        return True, Transpose(), 1
    if torch_layout and len(shape) == 2:
        if _regroups(reverse, target):
            return True, Chain(Transpose(), Reshape(reverse, target)), 1
        heads = _torch_heads(shape, target)
        return (True, heads, 1) if heads is not None else (False, None, 0)
    if _regroups(shape, target):
        return True, Reshape(shape, target), 1
    return False, None, 0


def _target_names(paths, variables) -> dict:
    """{object path: the name a rule targets}: the variable's name where it is its own and
    says something, else the object path with leading underscores stripped."""
    names = {}
    for path, variable in variables.items():
        name = str(getattr(variable, "name", "") or "").removesuffix(":0")
        names.setdefault(name, []).append(path)
    out = {}
    for path in paths:
        name = str(getattr(variables[path], "name", "") or "").removesuffix(":0")
        good = name and len(names.get(name, ())) == 1 and not is_default_name(name)
        out[path] = name if good else strip(path)
    return out


def _pairs(keys: list, paths: list, specs: dict, variables: dict, shown: dict) -> dict:
    """{source key: (object path, transform)}: each the other's single best candidate."""
    by_size: dict = {}
    for path in paths:
        by_size.setdefault(_size(tuple(variables[path].shape)), []).append(path)
    if sum(len(by_size.get(_size(specs[k][0]), ())) for k in keys) > _PAIR_LIMIT:
        return {}
    parsed_paths = {shown[path]: _parsed(shown[path]) for path in paths}
    parsed_keys = {key: _parsed(key) for key in keys}
    common = _common(parsed_paths) & _common(parsed_keys)
    parsed_paths = _placed(parsed_paths, common)
    parsed_paths = {path: parsed_paths[shown[path]] for path in paths}
    parsed_keys = _placed(parsed_keys, common)
    best_key: dict = {}  # key -> (score, [(path, transform)])
    best_path: dict = {}  # path -> (score, [key])
    for key in keys:
        shape = tuple(specs[key][0])
        name = parsed_keys[key]
        for path in by_size.get(_size(shape), ()):
            var = parsed_paths[path]
            score = _score(name, var)
            if not score:
                continue
            target = tuple(variables[path].shape)
            fits, transform, exact = _fit(shape, target, name.last == "weight"
                                          and var.last == "kernel")
            if not fits:
                continue
            score = 4 * score + exact
            for best, what, item in ((best_key, key, (path, transform)),
                                     (best_path, path, key)):
                old = best.get(what)
                if old is None or score > old[0]:
                    best[what] = (score, [item])
                elif score == old[0]:
                    old[1].append(item)
    out = {}
    for key, (_, found) in best_key.items():
        if len(found) == 1:
            path, transform = found[0]
            if best_path[path][1] == [key]:
                out[key] = (path, transform)
    return out


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _pattern(text: str, numbers: tuple) -> str:
    """`text` with each of its numbers a placeholder ({i}, {j}, ...), braces escaped."""
    out, last, index = [], 0, 0
    for found in _NUMBER.finditer(text):
        out.append(_escape(text[last:found.start()]) + "{" + "ijklmn"[index] + "}")
        last, index = found.end(), index + 1
    return "".join(out) + _escape(text[last:])


def _literal(key: str, target: str, transform) -> Rule:
    return Rule(_escape(key), _escape(target), transform)


def _names_of(variables: dict) -> dict:
    """{object path: the forms a rule's target may meet it by, in export or restore}."""
    out = {}
    for path, variable in variables.items():
        name = str(getattr(variable, "name", "") or "").removesuffix(":0")
        out[path] = {path, strip(path), name, strip(name)} - {""}
    return out


def _too_broad(rule: Rule, members: list, pairs: dict, target_of: dict,
               forms: dict) -> bool:
    """Whether a rule with placeholders names a variable other than its pairs' (or one of
    them by another key) in the export direction: then its pairs get one rule each."""
    wanted = {pairs[key][0]: key for key in members}
    for path, names in forms.items():
        for form in names:
            name = rule.source_name(form)
            if name is not None and wanted.get(path) != name:
                return True
    return False


def _rules(pairs: dict, keys: list, target_of: dict, variables: dict) -> list:
    """Rules for the pairs: one rule with placeholders for the pairs that differ only by
    their numbers (where it rewrites every key as its pair wants and takes no other key),
    else one rule per pair."""
    groups: dict = {}
    for key, (path, transform) in pairs.items():
        target = target_of[path]
        numbers = tuple(_NUMBER.findall(key))
        generic = numbers and numbers == tuple(_NUMBER.findall(target)) and len(numbers) <= 6
        group = (_pattern(key, numbers), _pattern(target, numbers), repr(transform)) \
            if generic else (key, target, repr(transform), "literal")
        groups.setdefault(group, []).append(key)
    literal = {g for g, members in groups.items() if len(members) < 2 or len(g) == 4}
    generic = [g for g in groups if g not in literal]
    if len(generic) * len(variables) > _PAIR_LIMIT:
        literal |= set(generic)
    else:
        forms = _names_of(variables)
        literal |= {g for g in generic if _too_broad(
            Rule(g[0], g[1]), groups[g], pairs, target_of, forms)}
    for _ in range(len(groups) + 1):
        rules, exact, generic = [], {}, []
        for group, members in groups.items():
            if group in literal:
                for key in members:
                    path, transform = pairs[key]
                    exact[key] = len(rules)
                    rules.append(_literal(key, target_of[path], transform))
            else:
                generic.append((len(rules), group))
                rules.append(Rule(group[0], group[1], pairs[members[0]][1]))
        if len(generic) * len(keys) > _PAIR_LIMIT:
            literal |= {group for _, group in generic}
            continue
        # Each key as restore rewrites it: by the first rule that matches (a literal rule
        # matches its own key only, so only the rules with placeholders are scanned).
        wrong = set()
        for key in keys:
            limit = exact.get(key, len(rules))
            for index, group in generic:
                if index > limit:
                    break
                rule = rules[index]
                if rule.source_regex.match(key):
                    want = target_of[pairs[key][0]] if key in pairs else None
                    if rule.source_regex.sub(rule.regex_rule()[1], key, count=1) != want:
                        wrong.add(group)
                    break
        if not wrong:
            return rules
        literal |= wrong
    return []


def propose(source: Source, variables: dict, the_plan: Plan) -> RuleSet | None:
    """A rule set pairing the plan's leftover network entries with its leftover network
    variables by names and shapes, or None when nothing pairs up."""
    heads = head_entries()  # a Hub class's task head: never paired with a backbone variable
    keys = [k for k in the_plan.unmatched_source if not is_optimizer_key(k)
            and k in source.specs and k not in heads]
    paths = [p for p in the_plan.unmatched_variables if not is_optimizer_key(p)
             and p in variables]
    if not keys or not paths:
        return None
    target_of = _target_names(paths, variables)
    pairs = _pairs(keys, paths, source.specs, variables, target_of)
    if not pairs:
        return None
    rules = _rules(pairs, keys, target_of, variables)
    return RuleSet(rules) if rules else None


def proposal_fix(source: Source, variables: dict, the_plan: Plan) -> str:
    """The fix a refused restore states when a rule set can be proposed, else ""."""
    proposed = propose(source, variables, the_plan)
    if proposed is None:
        return ""
    return (f"objckpt.plan(obj, source).proposed holds a rule set proposed from names and "
            f"shapes ({_render.count(len(proposed), 'rule')}): print the plan to review it "
            "as Python, then pass it as rules= (it is never applied on its own)")
