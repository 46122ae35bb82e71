"""Timing helpers shared by the benchmarks: interleaved, autoranged medians."""

from __future__ import annotations

import gc
import re
import time

import numpy as np


def time_ops(operations: dict, repeats: int) -> dict:
    """Median milliseconds of each operation, measured in one run.

    Operations are interleaved round by round so machine drift hits all of
    them alike. As timeit does, a sample of a fast operation runs it several
    times back to back (enough for ~20 ms) and the garbage collector is off
    while a sample runs (it runs between samples, as usual). The first round
    is dropped (caches settling).
    """
    inner = {}
    for name, fn in operations.items():
        fn()  # warm up: first calls trace functions and fill caches
        fn()
        start = time.perf_counter()
        fn()  # calibrate on a warm call, as timeit's autorange does
        once = time.perf_counter() - start
        inner[name] = max(1, min(50, int(0.02 / max(once, 1e-6))))
    samples = {name: [] for name in operations}
    for _ in range(repeats):
        for name, fn in operations.items():
            gc.disable()
            try:
                start = time.perf_counter()
                for _ in range(inner[name]):
                    fn()
                samples[name].append((time.perf_counter() - start) / inner[name])
            finally:
                gc.enable()
    return {name: float(np.median(s[1:] or s)) * 1e3 for name, s in samples.items()}


def met(value: float, target: str) -> bool:
    """Whether `value` meets a target written as '>= 30x', '<= 1.15x' or '<= 5 ms'."""
    op, number = re.match(r"([<>]=) ([\d.]+)", target).groups()
    return value >= float(number) if op == ">=" else value <= float(number)
