"""Fuzz objckpt (and plain TF) with thousands of mutated checkpoints; count the outcomes.

Usage:
  python benchmarks/fuzz_checkpoints.py [--cases 10000] [--seed 0] [--jobs 2]
                                        [--timeout 20] [--no-tf] [--groups index,graph]
                                        [--objckpt PATH] [--json out.json]
  python benchmarks/fuzz_checkpoints.py --repro MUTATION:BASE:SEED:OP [--keep DIR]

Base checkpoints are written in this environment's flavour (a Keras conv + BatchNorm +
Dense model after one Adam step, saved by objckpt.save and by tf.train.Checkpoint; a
tf.Module with TF1 Adam slots; a tf.train.CheckpointManager directory; a
callbacks.Checkpointing directory). Every mutation of `tests/helpers/fuzzlib.py` is applied to
each base it fits (crafted ones once, random damage with seed after seed until --cases
objckpt cases), and every operation runs in persistent worker subprocesses
(`tests/helpers/fuzz_worker.py`; --jobs of them in parallel), a crash or a hang (no answer within
--timeout seconds) recorded and the worker replaced. For each mutated checkpoint plain
TF's `tf.train.Checkpoint(...).read(prefix)` runs too (unless --no-tf), for comparison.

Prints, for objckpt and for plain TF, counts per mutation class (group, then each named
mutation with anything but ok/typed) x outcome, each distinct failure with what reproduces
it (mutation, base, seed, operation, error or signal; `--repro` runs one such case again,
`--keep DIR` leaves its files there), and the total time. Exit status 1
when objckpt has any crash, hang, untyped error, partial restore, silent wrong result or
deleted intact checkpoint (silent_undetectable excepted: no checksum can tell).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))

import fuzzlib as F  # noqa: E402

BAD = set(F.FAILURES) | {F.SILENT}


def _split(plan, jobs):
    """Round-robin by mutated case (mutation, base, seed), so each job gets a mix."""
    groups = collections.OrderedDict()
    for item in plan:
        groups.setdefault(item[:3], []).append(item)
    parts = [[] for _ in range(jobs)]
    for i, items in enumerate(groups.values()):
        parts[i % jobs].extend(items)
    return parts


def _table(rows, key, title) -> str:
    counts = collections.defaultdict(collections.Counter)
    for r in rows:
        counts[key(r)][r.outcome] += 1
    present = [o for o in F.OUTCOMES if any(c[o] for c in counts.values())]
    width = max([len(title)] + [len(k) for k in counts]) + 2
    cols = {o: max(8, len(o) + 2) for o in present}
    lines = [title.ljust(width) + "".join(f"{o:>{cols[o]}}" for o in present)
             + f"{'total':>8}"]
    for k in sorted(counts):
        c = counts[k]
        lines.append(k.ljust(width) + "".join(f"{c[o] or '':>{cols[o]}}" for o in present)
                     + f"{sum(c.values()):>8}")
    total = collections.Counter(r.outcome for r in rows)
    lines.append("all".ljust(width) + "".join(f"{total[o] or '':>{cols[o]}}" for o in present)
                 + f"{len(rows):>8}")
    return "\n".join(lines)


def _failures(rows, limit) -> list[str]:
    seen = collections.OrderedDict()
    for r in rows:
        if r.outcome in BAD:
            # one line per distinct (mutation, op, outcome, error text without paths)
            text = r.detail.split("`")[0][:160]
            seen.setdefault((r.mutation, r.op, r.outcome, text), [r, 0])[1] += 1
    out = []
    for (_, _, _, _), (r, n) in list(seen.items())[:limit]:
        out.append(f"  [{n}x] {r.repro()[:300]}")
    if len(seen) > limit:
        out.append(f"  ... {len(seen) - limit} more distinct failures (--failures N)")
    return out


def _report(rows, who) -> str:
    lines = [f"== {who}: {len(rows)} cases ==",
             _table(rows, lambda r: r.group, "class"), ""]
    noisy = {r.mutation for r in rows if r.outcome not in (F.OK, F.TYPED)}
    if noisy:
        lines.append(_table([r for r in rows if r.mutation in noisy],
                            lambda r: r.mutation, "mutation (any outcome but ok/typed)"))
        lines.append("")
    return "\n".join(lines)


def _repro(args) -> int:
    """Runs the given cases one by one and prints each raw result and its files."""
    if args.objckpt:
        os.environ["FUZZ_OBJCKPT_PATH"] = os.path.abspath(args.objckpt)
    plan = []
    for spec in args.repro:
        name, base, seed, op = spec.split(":")
        if name not in F.MUTATIONS or base not in F.BASES:
            print(f"unknown mutation or base in {spec!r}", file=sys.stderr)
            return 2
        plan.append((name, base, int(seed), op))
    work = args.keep or tempfile.mkdtemp(prefix="objckpt-fuzz-repro-")
    bases = args.bases or os.path.join(work, "bases")
    if not os.path.exists(os.path.join(bases, "bases.json")):
        F.make_bases(bases)
    pool = F.Pool(bases, timeout=args.timeout, standby=False)
    bad = False
    try:
        def show(i, n, row):
            print(f"{row.repro()}\n  note: {row.note}\n  files: "
                  f"{os.path.join(work, f'case-{i}')}", flush=True)

        rows = F.run_plan(pool, plan, bases, work, progress=show, keep=True)
        bad = any(r.outcome in BAD for r in rows)
    finally:
        pool.close()
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10000,
                        help="objckpt cases at least (plain TF runs come on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes in parallel")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds before a case counts as a hang")
    parser.add_argument("--no-tf", action="store_true", help="skip plain TF's runs")
    parser.add_argument("--groups", help="comma-separated: damage,index,graph,files")
    parser.add_argument("--bases", help="reuse base checkpoints written earlier here")
    parser.add_argument("--objckpt", help="import objckpt from this folder instead")
    parser.add_argument("--json", help="write every case's outcome here")
    parser.add_argument("--failures", type=int, default=60,
                        help="distinct failures to list (default 60)")
    parser.add_argument("--repro", action="append", metavar="MUTATION:BASE:SEED:OP",
                        help="run only this case (repeatable), e.g. "
                             "index.dim_negative:keras:0:restore")
    parser.add_argument("--keep", metavar="DIR", help="with --repro: write the cases here")
    args = parser.parse_args(argv)
    if args.repro:
        return _repro(args)
    if args.objckpt:
        os.environ["FUZZ_OBJCKPT_PATH"] = os.path.abspath(args.objckpt)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="objckpt-fuzz-")
    try:
        bases = args.bases or os.path.join(work, "bases")
        if not os.path.exists(os.path.join(bases, "bases.json")):
            F.make_bases(bases)
        with open(os.path.join(bases, "bases.json")) as f:
            info = json.load(f)
        groups = args.groups.split(",") if args.groups else None
        plan = F.plan_cases(seed=args.seed, count=args.cases, bench=True,
                            include_tf=not args.no_tf, groups=groups)
        objckpt_total = sum(op != F.TF_OP for *_, op in plan)
        print(f"flavour {info['flavour']}, TF {info['tf']}: {objckpt_total} objckpt cases"
              f" + {len(plan) - objckpt_total} plain TF runs over "
              f"{len({p[:3] for p in plan})} mutated checkpoints, {args.jobs} workers, "
              f"hang timeout {args.timeout:g} s", flush=True)
        rows, lock = [], threading.Lock()
        done = [0]
        errors = []

        def progress(i, n, row):
            with lock:
                done[0] += 1
                if done[0] % 500 == 0:
                    print(f"  {done[0]}/{len(plan)} ({time.monotonic() - started:.0f} s)",
                          flush=True)

        def job(part, k):
            try:
                pool = F.Pool(bases, timeout=args.timeout)
                try:
                    result = F.run_plan(pool, part, bases, os.path.join(work, f"job{k}"),
                                        progress=progress)
                finally:
                    pool.close()
                with lock:
                    rows.extend(result)
            except Exception as err:  # reported below
                errors.append(f"job {k}: {type(err).__name__}: {err}")

        threads = [threading.Thread(target=job, args=(part, k))
                   for k, part in enumerate(_split(plan, max(1, args.jobs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            print("\n".join(errors), file=sys.stderr)
            return 2
        elapsed = time.monotonic() - started
        ours = [r for r in rows if r.op != F.TF_OP]
        theirs = [r for r in rows if r.op == F.TF_OP]
        print()
        print(_report(ours, "objckpt"))
        print("objckpt failures (mutation base=B seed=S op=OP: outcome: error or signal):")
        print("\n".join(_failures(ours, args.failures)) or "  none")
        if theirs:
            print()
            print(_report(theirs, "plain TF (tf.train.Checkpoint(...).read)"))
            print("plain TF failures:")
            print("\n".join(_failures(theirs, args.failures)) or "  none")
        slow = sorted((r for r in rows if r.outcome != F.HANG and r.seconds >= 2),
                      key=lambda r: -r.seconds)[:10]
        if slow:
            print("\nslowest answered cases:")
            for r in slow:
                print(f"  {r.seconds:6.1f} s  {r.mutation} base={r.base} seed={r.seed} "
                      f"op={r.op}: {r.outcome}")
        print(f"\ntotal {elapsed:.0f} s for {len(rows)} runs ({len(ours)} objckpt, "
              f"{len(theirs)} plain TF); median case "
              f"{sorted(r.seconds for r in rows)[len(rows) // 2] * 1000:.0f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump([r.__dict__ for r in rows], f)
        return 1 if any(r.outcome in BAD for r in ours) else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
