"""The argument checks shared by `callbacks.Checkpointing` and `CheckpointManager`
(`objckpt._base.options`): what each accepts, and the typed error that names the argument,
what it must be, what was received and the fix. (The checks of whole directories' arguments:
_training/test_checkpointing.py, test_manager.py, test_retention_policies.py.)"""

from __future__ import annotations

import math

import pytest

from objckpt import errors
from objckpt._base import options as _options


def test_check_choice():
    _options.check_choice("mode", "min", ("min", "max"))
    with pytest.raises(errors.InvalidArgumentError) as info:
        _options.check_choice("mode", "best", ("min", "max"))
    assert str(info.value) == ("mode must be one of 'min', 'max'. Received: mode='best'. "
                               "Fix: pass one of them.")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [1, 2, 10**9])
def test_check_count_accepts_whole_numbers_from_the_minimum(value):
    _options.check_count("max_to_keep", value, 1, "the newest checkpoints to keep")


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "3", None])
def test_check_count_refuses_the_rest(value):
    with pytest.raises(errors.InvalidArgumentError) as info:
        _options.check_count("max_to_keep", value, 1, "the newest checkpoints to keep")
    assert str(info.value) == (
        f"max_to_keep must be an int >= 1 (the newest checkpoints to keep). Received: "
        f"max_to_keep={value!r}. Fix: pass a whole number >= 1.")


@pytest.mark.parametrize("value", [None, 0.5, 6, 1e9])
def test_check_number_accepts_none_and_positive_finite_numbers(value):
    _options.check_number("keep_every_n_hours", value, "every this many hours")


@pytest.mark.parametrize("value", [0, -2.0, math.inf, math.nan, True, "6"])
def test_check_number_refuses_the_rest(value):
    with pytest.raises(errors.InvalidArgumentError) as info:
        _options.check_number("keep_every_n_hours", value, "every this many hours")
    assert str(info.value) == (
        f"keep_every_n_hours must be None or a number > 0 (every this many hours). Received: "
        f"keep_every_n_hours={value!r}. Fix: pass a finite number > 0, e.g. "
        "keep_every_n_hours=6, or None to turn it off.")
