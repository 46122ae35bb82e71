"""Timing helpers shared by the benchmarks: interleaved, autoranged medians."""

from __future__ import annotations

import gc
import re
import time

import numpy as np


def time_ops(operations: dict, repeats: int, samples: dict | None = None) -> dict:
    """Median milliseconds of each operation, measured in one run.

    Operations are interleaved round by round so machine drift hits all of
    them alike, in the reverse order every other round (no operation always
    runs first). As timeit does, a sample of a fast operation runs it several
    times back to back (enough for ~20 ms) and the garbage collector is off
    while a sample runs (it runs between samples, as usual). The first round
    is dropped (caches settling). `samples`, if given, receives each
    operation's kept per-round seconds (for `paired_ratio`).
    """
    inner = {}
    for name, fn in operations.items():
        fn()  # warm up: first calls trace functions and fill caches
        fn()
        start = time.perf_counter()
        fn()  # calibrate on a warm call, as timeit's autorange does
        once = time.perf_counter() - start
        inner[name] = max(1, min(50, int(0.02 / max(once, 1e-6))))
    times = {name: [] for name in operations}
    names = list(operations)
    for round_ in range(repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            fn = operations[name]
            gc.disable()
            try:
                start = time.perf_counter()
                for _ in range(inner[name]):
                    fn()
                times[name].append((time.perf_counter() - start) / inner[name])
            finally:
                gc.enable()
    if samples is not None:
        samples.update({name: s[1:] or s for name, s in times.items()})
    return {name: float(np.median(s[1:] or s)) * 1e3 for name, s in times.items()}


def paired_ratio(samples: dict, name: str, base: str) -> float:
    """Median over rounds of `name`'s time over `base`'s time in the same round.

    For targets on a small difference between two operations: a ratio per
    round cancels the drift between rounds, which the ratio of two medians
    does not.
    """
    return float(np.median(np.array(samples[name]) / np.array(samples[base])))


def met(value: float, target: str) -> bool:
    """Whether `value` meets a target written as '>= 30x', '<= 1.15x' or '<= 5 ms'."""
    op, number = re.match(r"([<>]=) ([\d.]+)", target).groups()
    return value >= float(number) if op == ">=" else value <= float(number)


def mlp_100mb(keras, seed: int):
    """The ~100 MB model of the format benchmarks: 25M float32 parameters in 3 Dense layers,
    seeded, in any Keras flavour."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((1024,))
    x = keras.layers.Dense(4096, activation="relu", name="up")(inputs)
    x = keras.layers.Dense(4096, activation="relu", name="mid")(x)
    outputs = keras.layers.Dense(1024, name="down")(x)
    return keras.Model(inputs, outputs, name="mlp_100mb")


def against_load_weights(source, model, path: str, what: str, describe: str,
                         repeats: int, target: str) -> dict:
    """Restores `model` from the weights file `path` that `source` saved: checks the values
    came through, then times `objckpt.restore` against `model.load_weights` (interleaved)."""
    import numpy as np

    import objckpt

    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.variables)
    report = objckpt.restore(model, path)
    assert len(report.restored) == len(model.variables), report
    for mine, theirs in zip(model.variables, source.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    ours, native = f"objckpt.restore(model, {what})", f"model.load_weights({what})"
    ms = time_ops({ours: lambda: objckpt.restore(model, path),
                   native: lambda: model.load_weights(path)}, repeats)
    ratio = ms[ours] / ms[native]
    return {"model": f"{model.name}: {describe}, {len(model.variables)} variables, "
                     f"{nbytes / 1e6:.0f} MB",
            "bytes": nbytes, "ms": ms,
            "ratios": [(f"restore({what.removeprefix('w')}) / model.load_weights", ratio,
                        target, met(ratio, target))]}


def print_result(result: dict) -> None:
    """A section's result as the runner prints it: each operation's median seconds and
    spread, each ratio with its target and whether it is met, the notes."""
    for name, value in result["s"].items():
        lo, hi = result["spread"][name]
        print(f"  {name:<72} {value:>8.2f} s  [{lo:.2f} .. {hi:.2f}]")
    for what, value, target, ok, *_ in result["ratios"]:
        mark = "" if ok is None else ("yes" if ok else "NO")
        print(f"  {what:<72} {value:>8.2f}  {target:<12} {mark}")
    for note in result["notes"]:
        print(f"  - {note}")
