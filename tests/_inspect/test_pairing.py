"""Which entries `diff` pairs: keys rewritten by rules, loose underscore matches, lossless
dtype pairs and their common dtype (TF-free)."""

import numpy as np
import pytest

from objckpt import errors
from objckpt._inspect import pairing


def test_without_rules_keys_pair_only_as_they_are():
    pairs = pairing.pair(["a/kernel", "fc_in/kernel"], ["a/kernel", "fc_in/_kernel"], ())
    assert pairs.matched == [("a/kernel", "a/kernel")]
    assert pairs.only_in_a == ["fc_in/kernel"]
    assert pairs.dropped == [] and pairs.rewritten == {} and pairs.taken == []


def test_the_first_matching_rule_rewrites_once_and_none_drops():
    rules = pairing.parse_rules([("^model_001/", ""), ("^model_", "other_"), ("^opt/", None)])
    pairs = pairing.pair(["model_001/w", "opt/m", "x"], ["w", "x"], rules)
    assert pairs.matched == [("model_001/w", "w"), ("x", "x")]
    assert pairs.dropped == ["opt/m"]
    assert pairs.rewritten == {"model_001/w": "w", "opt/m": None}


def test_with_rules_leading_underscores_pair_when_they_name_one_path():
    rules = pairing.parse_rules([("^old/", "")])
    pairs = pairing.pair(["old/fc_in/kernel"], ["fc_in/_kernel"], rules)
    assert pairs.matched == [("old/fc_in/kernel", "fc_in/_kernel")]
    ambiguous = pairing.pair(["old/k"], ["_k", "__k"], rules)
    assert ambiguous.matched == [] and ambiguous.only_in_a == ["old/k"]


def test_a_path_taken_by_an_earlier_key_is_reported():
    rules = pairing.parse_rules([("^(a|b)/", "")])
    pairs = pairing.pair(["a/w", "b/w"], ["w"], rules)
    assert pairs.matched == [("a/w", "w")]
    assert pairs.only_in_a == ["b/w"] and pairs.taken == [("b/w", "w")]


@pytest.mark.parametrize("rules, words", [
    (("^a/", ""), "a single rule"),
    ([("^a/",)], "must be (regex, replacement)"),
    ([("^a/", 3)], "must be a string or None"),
    ([("(", "")], "is not a valid regular expression"),
])
def test_bad_rules_are_typed_errors_with_the_fix(rules, words):
    with pytest.raises(errors.InvalidArgumentError, match="Fix:") as info:
        pairing.parse_rules(rules)
    assert words in str(info.value)


def test_lossless_pairs_and_their_common_dtype():
    assert pairing.lossless("bfloat16", "float32") and pairing.lossless("float32", "float16")
    assert not pairing.lossless("float32", "int32")
    x, y = pairing.common(np.array([1.5], np.float16), np.array([1.5], np.float32))
    assert x.dtype == y.dtype == np.float64 and x.tolist() == y.tolist() == [1.5]
    i, j = pairing.common(np.array([1], np.int8), np.array([2], np.int32))
    assert i.dtype == j.dtype == np.int32
