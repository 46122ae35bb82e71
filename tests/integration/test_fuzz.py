"""Untrusted checkpoints: a bounded fuzz run and one regression per known case.

Every file objckpt reads is untrusted (DESIGN invariant 2): no input may crash, hang or
exhaust the process, raise anything but an `objckpt.errors` type, or half-restore
(invariant 1). `tests/helpers/fuzzlib.py` mutates small base checkpoints written in this session's
flavour (random damage, crafted index entries and footers with valid block checksums,
crafted object graphs with recomputed tensor checksums, FIFOs, symlinks, stray files and
state files) and runs objckpt's operations on each in a persistent worker subprocess
(`tests/helpers/fuzz_worker.py`), so that a crash or a hang is recorded, not fatal.

A few hundred cases in all; `benchmarks/fuzz_checkpoints.py` runs 10,000 and compares
plain TF. Outcomes: ok, typed, untyped, crash, hang, partial, silent,
silent_undetectable (two same-shape entries pointing at each other's bytes: no checksum
or structure can tell), deleted_intact. Only ok, typed and silent_undetectable pass.
"""

from __future__ import annotations

import collections
import os
import re

import pytest

import fuzzlib as F

# Seconds one case may take before it counts as a hang (its worker is then replaced).
TIMEOUT = float(os.environ.get("OBJCKPT_FUZZ_TIMEOUT", "10"))
GROUPS = ("damage", "index", "graph", "files", "safetensors")


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("fuzz-bases"))
    F.make_bases(directory)
    return directory


@pytest.fixture(scope="module")
def pool(bases):
    pool = F.Pool(bases, timeout=TIMEOUT)
    yield pool
    pool.close()


@pytest.fixture
def workdir(tmp_path):
    return str(tmp_path)


def _report(rows, bad) -> str:
    counts = collections.Counter(r.outcome for r in rows)
    lines = [f"{len(bad)} of {len(rows)} cases failed; outcomes: "
             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    seen = set()
    for r in bad:
        key = (r.mutation, r.op, r.outcome, r.detail[:120])
        if key in seen:
            continue
        seen.add(key)
        lines.append("  " + r.repro()[:400])
        if len(lines) > 80:
            lines.append("  ...")
            break
    return "\n".join(lines)


def test_plan_covers_every_mutation_and_operation():
    plan = F.plan_cases()
    names = {name for name, *_ in plan}
    assert names == {n for n, m in F.MUTATIONS.items() if not m.bench_only}
    ops = {op for *_, op in plan}
    assert ops == set(F.PREFIX_OPS) | set(F.DIR_OPS)
    assert {base for _, base, _, _ in plan} == set(F.BASES)
    assert 300 <= len(plan) <= 900, len(plan)  # a few hundred cases, a few minutes at most
    measured = {n for n, m in F.MUTATIONS.items() if m.regression}
    assert measured <= {r[1] for r in REGRESSIONS} | {"graph.root_children_10k"}


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.fuzz
@pytest.mark.subprocess
def test_fuzz(group, pool, bases, workdir):
    """No crash, hang, untyped error, partial restore, silently wrong result or deleted
    intact checkpoint, over every mutation class of the group."""
    rows = F.run_plan(pool, F.plan_cases(groups=(group,)), bases, workdir,
                      skip_after_hang=True)  # each hang costs the timeout: one per case
    assert {r.mutation for r in rows} == {
        n for n, m in F.MUTATIONS.items() if m.group == group and not m.bench_only}
    bad = [r for r in rows if r.outcome not in (F.OK, F.TYPED, F.UNDETECTABLE)]
    assert not bad, _report(rows, bad)


# The cases measured before the hardening (crash, untyped error, partial restore, hang), each
# with the error objckpt must raise instead: (id, mutation, base, operation, error type).
CORRUPT = "CheckpointCorruptError"
REGRESSIONS = [
    ("entry-unparseable-abort", "index.entry_unparseable", "keras", "restore", CORRUPT),
    ("negative-dim-abort", "index.dim_negative", "keras", "restore", CORRUPT),
    ("dims-overflow-abort", "index.dims_overflow", "keras", "restore", CORRUPT),
    ("graph-entry-2e32p1-segv", "index.graph_shape_2e32p1", "keras", "restore", CORRUPT),
    ("footer-beyond-file-indexerror", "index.footer_beyond_file", "keras", "restore",
     CORRUPT),
    ("footer-2e62-memoryerror", "index.footer_huge", "keras", "restore", CORRUPT),
    ("dtype-1000-typeerror", "index.dtype_1000", "keras", "restore", CORRUPT),
    ("node-id-out-of-range-indexerror", "graph.node_id_large", "module", "restore", CORRUPT),
    ("empty-graph-indexerror", "graph.empty", "keras", "restore", CORRUPT),
    ("dropped-node-indexerror", "graph.drop_node", "module", "restore", CORRUPT),
    ("node-id-minus-two-silent", "graph.node_id_minus_two", "keras", "restore", CORRUPT),
    # Partial restores: some variables assigned, then a ValueError. Any objckpt error will
    # do, with every variable bit-identical to before (checked by the outcome: "partial").
    ("duplicate-child-name-partial", "graph.duplicate_child_name", "module", "restore",
     "ObjckptError"),
    # Restored by the paths the checkpoint keys name (each value is the one saved under its
    # own path: the originals), or refused; never half of it.
    ("swapped-keys-partial", "graph.swap_keys_diff_shape", "module", "restore", None),
    ("state-file-fifo-hang", "files.state_fifo", "fit", "restore_dir", CORRUPT),
    ("index-fifo-hang", "files.index_fifo", "keras", "restore", CORRUPT),
    ("state-file-dev-zero-hang", "files.state_devzero", "fit", "restore_dir", CORRUPT),
]


@pytest.mark.parametrize("mutation, base, op, expected",
                         [r[1:] for r in REGRESSIONS], ids=[r[0] for r in REGRESSIONS])
@pytest.mark.subprocess
def test_regression(mutation, base, op, expected, pool, bases, workdir):
    case = F.make_case(mutation, base, 0, bases, os.path.join(workdir, "case"))
    outcome, detail, result = F.run_case(pool, case, op, os.path.join(workdir, "scratch"))
    if expected is None:  # the original values, or a typed error with nothing changed
        assert outcome in (F.OK, F.TYPED), f"{mutation} ({case.note}) {op}: {outcome}: {detail}"
        return
    assert outcome == F.TYPED, f"{mutation} ({case.note}) {op}: {outcome}: {detail}"
    assert expected in result["mro"], result["error"]


@pytest.mark.subprocess
def test_regression_10k_root_children_restore_in_time(pool, bases, workdir):
    """10,000 extra root children took 24 s to restore (TF: 0.1 s); it must finish within
    the hang timeout, with the original values."""
    case = F.make_case("graph.root_children_10k", "keras", 0, bases,
                       os.path.join(workdir, "case"))
    outcome, detail, _ = F.run_case(pool, case, "restore", os.path.join(workdir, "scratch"))
    assert outcome == F.OK, f"{outcome}: {detail}"


@pytest.mark.subprocess  # `bases` are written by a fuzz_worker process
def test_codec_rewrites_tf_index_byte_for_byte(bases):
    """The fuzz codec is faithful: TF's own index files decode and encode back to the same
    bytes, and a string tensor (the object graph) re-encodes to the same bytes and crc."""
    for kind in F.PREFIX_BASES:
        prefix = F.base_prefix(bases, kind)
        with open(prefix + ".index", "rb") as f:
            raw = f.read()
        bundle = F.Bundle.read(prefix)
        assert F.encode_table([tuple(e) for e in bundle.entries]) == raw
        entry = bundle.entry(F.OBJECT_GRAPH_KEY)
        assert F.encode_strings([bundle.graph_bytes()]) == (
            bundle.tensor_bytes(F.OBJECT_GRAPH_KEY), entry.crc32c)
        assert F.tensor_summary(bundle)  # every checksum verifies


# --- one validation: what `verify` passes, restore reads; what restore calls damaged, verify
# fails with the same words. In this process: the cases are consistent files or files whose
# damage the index and graph checks refuse before TF reads them (no crash, no hang).

AGREEMENT_GROUPS = ("damage", "index", "graph", "safetensors")


@pytest.fixture(scope="module")
def small_bases(tmp_path_factory):
    """The module base (a prefix) and the safetensors base (its values by object path),
    written in this process in well under a second."""
    import flavours
    import safetensors.numpy
    from support import values

    import objckpt

    directory = str(tmp_path_factory.mktemp("agreement-bases"))
    ckpt = flavours.build_module()
    objckpt.save(ckpt, os.path.join(directory, "module", "ckpt"))
    os.makedirs(os.path.join(directory, "safetensors"))
    safetensors.numpy.save_file(values(ckpt), os.path.join(directory, "safetensors",
                                                           F.SAFETENSORS_FILE))
    return directory


def _verify_and_restore(path: str):
    """(the verify report, the error restore raised or None) of one file."""
    import flavours

    import objckpt
    from objckpt import errors

    report = objckpt.verify(path)
    try:
        objckpt.restore(flavours.build_module(train=False), path)
    except errors.ObjckptError as err:
        return report, err
    return report, None


def _disagreement(report, err) -> str | None:
    """Why verify and restore disagree on a file, or None."""
    from objckpt import errors

    if report.ok:
        # Readable: restore reads it, unless the obj does not fit what it holds.
        if err is None or isinstance(err, errors.StructureMismatchError):
            return None
        return f"verify passed, restore raised {type(err).__name__}: {err}"
    if err is None:
        return f"verify failed, restore read it: {report.describe()}"
    if isinstance(err, errors.CheckpointCorruptError) and not any(
            p.reason in str(err) for p in report.problems):
        return (f"different reasons: verify: {[p.reason for p in report.problems]}; "
                f"restore: {err}")
    return None


def test_verify_and_restore_agree_on_every_fuzzed_file(small_bases, tmp_path):
    """Over every mutation of the module and safetensors bases (one seed each): a file
    passes both verify and restore (a mismatch with the obj aside) or fails both, and a
    restore that calls it damaged says so in the words of one of verify's problems."""
    cases = [(name, base) for name, m in F.MUTATIONS.items()
             if m.group in AGREEMENT_GROUPS and not m.bench_only
             for base in ("module", "safetensors") if base in m.bases]
    assert len(cases) >= 90, len(cases)
    disagreements, failed = [], 0
    for n, (name, base) in enumerate(cases):
        case = F.make_case(name, base, 0, small_bases, str(tmp_path / f"case-{n}"))
        report, err = _verify_and_restore(case.target)
        failed += not report.ok
        why = _disagreement(report, err)
        if why is not None:
            disagreements.append(f"{name} on {base}: {why[:600]}")
    assert not disagreements, "\n".join(disagreements)
    assert failed >= len(cases) // 2, failed  # most mutations are damage both refuse


def _craft(small_bases, tmp_path, mutation: str) -> str:
    return F.make_case(mutation, "module", 0, small_bases, str(tmp_path / "case")).target


def test_a_big_endian_bundle_header_fails_verify_as_restore_refuses_it(small_bases,
                                                                       tmp_path):
    """TF would read a big-endian bundle byte-swapped; objckpt's readers take the bytes as
    little-endian: verify and restore both refuse it, naming the header."""
    from objckpt import errors

    path = _craft(small_bases, tmp_path, "index.endianness_big")
    report, err = _verify_and_restore(path)
    reason = ("the header says its data is big-endian; objckpt reads the little-endian "
              "checkpoints TF writes on every common platform")
    assert [(p.where, reason in p.message) for p in report.problems] == [
        (path + ".index", True)]
    assert isinstance(err, errors.CheckpointCorruptError) and reason in str(err)
    assert report.problems[0].reason in str(err)


def test_a_deep_object_graph_chain_fails_verify_as_restore_refuses_it(small_bases, tmp_path,
                                                                      monkeypatch):
    """A chain of nodes whose object paths add up past the bound every reader of paths keeps
    (a few MB of graph would spell gigabytes of paths): verify reports it as the problem
    restore, plan and read_tree refuse; under the bound, all of them read it."""
    import objckpt
    from objckpt import errors
    from objckpt._base import paths as _paths

    path = _craft(small_bases, tmp_path, "graph.deep_chain")  # 5,000 nodes under the root
    report, err = _verify_and_restore(path)
    assert report.ok and err is None  # 5,000 deep: about 25 million characters of paths
    monkeypatch.setattr(_paths, "MAX_PATH_CHARS", 1_000_000)
    report, err = _verify_and_restore(path)
    reason = ("its object paths add up to more than 1,000,000 characters (nodes chained "
              "thousands of edges deep)")
    assert [(p.where, reason in p.message) for p in report.problems] == [
        ("_CHECKPOINTABLE_OBJECT_GRAPH", True)]
    assert isinstance(err, errors.CheckpointCorruptError)
    assert report.problems[0].reason in str(err)
    for read in (objckpt.read_tree, lambda p: objckpt.plan(_untrained_module(), p)):
        with pytest.raises(errors.CheckpointCorruptError, match=re.escape(reason)):
            read(path)


def _untrained_module():
    import flavours

    return flavours.build_module(train=False)
