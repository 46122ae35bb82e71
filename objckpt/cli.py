"""objckpt: look inside TF2 object-based checkpoints.

Commands:
  objckpt inspect PREFIX|DIRECTORY [--format text|json]
      The object tree: every variable's object path (through the layers;
      optimizer-owned paths last) with the name it was saved under, shape,
      dtype and size, with per-object and overall totals. A directory means
      its newest intact checkpoint. Name-based (TF1 Saver) checkpoints are
      listed by variable name.

  objckpt diff A B [--format text|json] [--rtol R] [--atol T] [--rules FILE]
      Per-path differences between two checkpoints (prefixes or directories):
      paths only in A (-) or only in B (+), shape or dtype (!), values (~).
      Object-based checkpoints are compared by object path (shown through
      the layers, with the saved variable name), name-based (TF1 Saver) ones
      by variable name. Values must be bit-identical (NaNs at the same
      positions are equal) unless a tolerance is given:
      |a - b| <= atol + rtol * |b|; with one, dtypes that differ by a
      lossless cast (bfloat16 and float32, float32 and float64, integer
      widening) are compared by value after it. --rules FILE (JSON, as for
      migrate) rewrites A's keys before they are compared with B's paths (also
      with leading underscores stripped): a TF1 checkpoint against its
      migrated form, a Hugging Face folder against an export of it.

  objckpt migrate SOURCE OUT --template MODULE:CALLABLE [--rules FILE]
                  [--at NAME] [--optimizer-state auto|true|false] [--no-strict]
                  [--cast lossless|lossy] [--dry-run]
      Writes SOURCE (a TF1 name-based or object-based checkpoint) as an
      object-based checkpoint at prefix OUT laid out for the obj that
      MODULE:CALLABLE returns (called with no arguments; it must build the
      model). --rules FILE is JSON: a list of [regex, replacement] pairs,
      e.g. [["^model_001/", ""]]. Each source key is rewritten by the first
      rule whose regex matches it (re.sub(regex, replacement, key, count=1)),
      once: rules never chain. Replacement null drops the entry; keys no rule
      matches stay as they are. The rewritten key then matches a variable by
      object path, by object path with leading underscores stripped, or by
      variable name. To chain, write one rule with a combined regex, or rules
      that each match the full original key; a rule that never applied is
      reported (shadowed by another rule, or matching no key). Optimizer
      state (--optimizer-state, default auto) moves by the variable it
      belongs to when the obj has an optimizer (a compiled model's is built
      as Keras's first training step would) and is skipped otherwise; keep
      global_step: it becomes the optimizer's iterations. --cast lossy also
      casts values to the obj's narrower dtypes (default lossless: only
      widening casts, e.g. bfloat16 -> float32). --dry-run prints the plan
      only.

  objckpt graph PREFIX|DIRECTORY [--format dot|svg|png] [--out FILE]
                [--depth N] [--empty]
      The object dependency graph as a picture: objects (boxes), variables
      with shape and dtype (ellipses), optimizer slot edges (dashed red),
      collapsed below depth N (default: automatic for large graphs). DOT
      text needs nothing extra; SVG and PNG need Graphviz's `dot` program.
      Without --out, DOT text goes to stdout; SVG/PNG need --out.

  objckpt verify PREFIX|DIRECTORY
      Reads every tensor once (checksums) and checks the object graph
      against the index, without loading a model; one line per problem. A
      directory means every checkpoint its state file names (without a state
      file: every checkpoint in it).

  objckpt average OUT SRC... [--weights W1,W2,...] [--non-weights last|first]
      Writes the weighted mean of N checkpoints of one structure (prefixes,
      directories or URLs) as a checkpoint at prefix OUT (local) laid out
      like the first SRC (same keys and object graph). Floating-point
      weights are averaged in float64 and rounded once into their dtype;
      integers, counters, random-generator state and optimizer state are
      copied from the last SRC (--non-weights first: the first). Weights:
      one finite number >= 0 per SRC, divided by their sum (default equal).
      Every SRC is checked against the first before anything is written;
      tensors are streamed one at a time. A sharded variable (stored in
      slices, one per shard) is written in the first SRC's slices: slice by
      slice where every SRC has the same slices, else each output slice
      gathered from the overlapping slices of each SRC (memory: a slice).

  objckpt demo [--out DIR] [--epochs N]
      A tour of a few seconds on a small Keras 3 model: Twins + TwinSync and
      Checkpointing during fit, restoring the best state, a TF1 Saver
      checkpoint migrated into Keras 3, object trees, timings and the graph
      picture (written under DIR, default a new temporary folder).

Every PREFIX, DIRECTORY, SOURCE, A, B and OUT may be a URL of object storage:
gs://bucket/run/ckpt (python3 -m pip install ".[gcs]" from a checkout),
s3://bucket/run (".[s3]"), or any other fsspec URL whose client is installed. Endpoints
and credentials come from each client's standard settings
(STORAGE_EMULATOR_HOST; AWS_ENDPOINT_URL and the AWS credential variables).
A remote checkpoint is downloaded into a private local copy, removed after.

inspect, diff, graph (DOT text) and average read checkpoints without importing
TensorFlow (local or remote) and answer in about a second; the other commands import it and
keep its start-up log lines off the terminal (errors still show).

Exit status: 0 on success (diff: the checkpoints are the same; verify: intact),
1 when a checkpoint cannot be read (diff: also when they differ; verify: any
problem), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

from absl import app
from absl.flags import argparse_flags

from objckpt import errors
from objckpt._base import render as _render
from objckpt._base.render import inspect_json, inspect_text  # noqa: F401 (public in the CLI)
from objckpt._cli import terminal as _terminal


def _parse(argv):
    from objckpt._cli import demo as _demo  # no TF: its DURATION only

    parser = argparse_flags.ArgumentParser(
        prog="objckpt", description=__doc__,
        formatter_class=argparse_flags.argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="print a checkpoint's object tree")
    inspect.add_argument("source", metavar="PREFIX|DIRECTORY")
    inspect.add_argument("--format", choices=("text", "json"), default="text")
    diff = commands.add_parser("diff", help="compare two checkpoints path by path")
    diff.add_argument("a", metavar="A", help="checkpoint prefix or directory")
    diff.add_argument("b", metavar="B", help="checkpoint prefix or directory")
    diff.add_argument("--format", choices=("text", "json"), default="text")
    diff.add_argument("--rtol", type=_tolerance, default=0.0, metavar="R",
                      help="relative tolerance (default 0: bit-exact)")
    diff.add_argument("--atol", type=_tolerance, default=0.0, metavar="T",
                      help="absolute tolerance (default 0: bit-exact)")
    diff.add_argument("--rules", metavar="FILE",
                      help="JSON list of [regex, replacement] pairs rewriting A's keys before "
                           "they are compared with B's paths, as migrate's --rules rewrite a "
                           "source's keys; replacement null leaves the entry out")
    migrate = commands.add_parser("migrate", help="write a checkpoint laid out for a model")
    migrate.add_argument("source", metavar="SOURCE", help="checkpoint prefix or directory")
    migrate.add_argument("out", metavar="OUT", help="prefix to write")
    migrate.add_argument("--template", required=True, metavar="MODULE:CALLABLE",
                         help="returns the built obj whose layout OUT takes")
    migrate.add_argument("--rules", metavar="FILE",
                         help="JSON list of [regex, replacement] pairs, e.g. "
                              "[[\"^model_001/\", \"\"]]; each key is rewritten once, by the "
                              "first rule whose regex matches it (rules never chain); "
                              "replacement null drops the entry")
    migrate.add_argument("--at", metavar="NAME", help="subtree of SOURCE to take values from")
    migrate.add_argument("--optimizer-state", nargs="?", const="true", default="auto",
                         choices=("auto", "true", "false"),
                         help="auto (default): move optimizer state by owner when the obj has "
                              "an optimizer (a compiled model's is built as Keras's first "
                              "step would), skip it otherwise; true: move it (the obj must "
                              "have an optimizer); false: skip it. Bare --optimizer-state: "
                              "true")
    migrate.add_argument("--no-strict", dest="strict", action="store_false",
                         help="write the obj's own values where the source has none")
    migrate.add_argument("--cast", default="lossless", choices=("lossless", "lossy"),
                         help="lossless (default): cast values to wider dtypes of the obj "
                              "(bfloat16 -> float32), refuse narrowing; lossy: also cast to "
                              "narrower dtypes (float32 -> bfloat16)")
    migrate.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    graph = commands.add_parser("graph", help="draw a checkpoint's object graph")
    graph.add_argument("source", metavar="PREFIX|DIRECTORY")
    graph.add_argument("--format", choices=("dot", "svg", "png"), default=None,
                       help="default: from --out's extension, else dot")
    graph.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    graph.add_argument("--depth", type=_depth, default=None, metavar="N",
                       help="collapse objects more than N edges below the root")
    graph.add_argument("--empty", action="store_true",
                       help="also draw objects with no variables below them")
    verify = commands.add_parser("verify", help="check checksums and the object graph")
    verify.add_argument("source", metavar="PREFIX|DIRECTORY")
    average = commands.add_parser("average", help="write the weighted mean of checkpoints")
    average.add_argument("out", metavar="OUT", help="prefix to write")
    average.add_argument("sources", metavar="SRC", nargs="+",
                         help="checkpoint prefixes or directories of one structure")
    average.add_argument("--weights", type=_weights, default=None, metavar="W1,W2,...",
                         help="one weight per SRC, divided by their sum (default: equal)")
    average.add_argument("--non-weights", choices=("last", "first"), default="last",
                         help="the SRC integers, counters and optimizer state are copied "
                              "from (default: last)")
    demo = commands.add_parser("demo", help=f"a tour on a small Keras 3 model ({_demo.DURATION})")
    demo.add_argument("--out", metavar="DIR", help="where to write (default: a new temp dir)")
    demo.add_argument("--epochs", type=_depth, default=6, metavar="N",
                      help="training epochs (default 6)")
    args = parser.parse_args(argv[1:])
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    return args


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number >= 0, received {text!r} (e.g. 1e-6; 0 is bit-exact)")
    return value


def _depth(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, received {text!r}")
    return value


def _inspect(args) -> int:
    from objckpt._inspect import meta as _meta

    entries = _meta.read(args.source)
    for note in entries.notes:  # an older checkpoint of a directory was used, and why
        print(f"objckpt inspect: note: {_render.safe_text(note)}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(_render.inspect_json(entries), indent=2))
    else:
        print(_render.inspect_text(entries))
    return 0


def _number(value):
    """A JSON-safe max |a-b|: a number, None (strings), or "nan"/"inf" as text."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def diff_json(result) -> dict:
    """The JSON document `objckpt diff --format json` prints."""
    return {
        "a": result.a,
        "b": result.b,
        "same": result.same,
        "rtol": result.rtol,
        "atol": result.atol,
        "equal": result.equal,
        "differ": result.differ,
        "only_in_a": list(result.only_in_a),
        "only_in_b": list(result.only_in_b),
        "shape_or_dtype": [{"path": d.path, "a": d.a, "b": d.b}
                           for d in result.shape_or_dtype],
        "values": [{"path": d.path, "max_abs_diff": _number(d.max_abs_diff),
                    "differing": d.differing, "size": d.size} for d in result.values],
        "notes": list(result.notes),
        "names": {path: {"network_path": shown, "name": name}
                  for path, (shown, name) in result.names.items()},
        "cast": [{"path": d.path, "a": d.a, "b": d.b} for d in result.cast],
        "rewritten": dict(result.rewritten),
        "paired": dict(result.paired),
    }


def diff_text(result) -> str:
    """One line per differing path, then the notes and a summary line.

    Paths and prefixes are shown through `_render.safe`, notes through `_render.safe_text`:
    one line each, whatever a checkpoint's names hold.
    """
    safe = _render.safe

    def shown(path: str) -> str:  # the network path and saved name, matched by `path`
        network, name = result.names.get(path, (path, ""))
        key = result.paired.get(path)  # with rules: the A key compared with B's path
        return safe(network) + _render.saved_name(network, name) + (
            f" (A: {safe(key)})" if key is not None else "")

    def shown_a(key: str) -> str:  # an A key, and what the rules made of it
        new = result.rewritten.get(key, key)
        return shown(key) + (f" -> {safe(new)}" if new != key else "")

    lines = [f"A: {safe(result.a)}", f"B: {safe(result.b)}"]
    for d in result.values:
        of = f"{d.differing:,} of {_render.count(d.size, 'value')}"
        if d.max_abs_diff is None:
            lines.append(f"~ {shown(d.path)}: {of} differ")
        else:
            lines.append(f"~ {shown(d.path)}: max |a-b| {d.max_abs_diff:.6g} at {of}")
    lines.extend(f"! {shown(d.path)}: {d.a} vs {d.b}" for d in result.shape_or_dtype)
    lines.extend(f"- {shown_a(path)} (only in A)" for path in result.only_in_a)
    lines.extend(f"+ {shown(path)} (only in B)" for path in result.only_in_b)
    lines.extend(f"note: {_render.safe_text(note)}" for note in result.notes)
    tolerance = ("bit-exact" if result.rtol == 0 and result.atol == 0
                 else f"rtol {result.rtol:g}, atol {result.atol:g}")
    summary = f"{result.equal:,} equal, {result.differ:,} differ"
    if result.differ:
        parts = [(len(result.values), "in value"),
                 (len(result.shape_or_dtype), "in shape or dtype"),
                 (len(result.only_in_a), "only in A"), (len(result.only_in_b), "only in B")]
        summary += ": " + ", ".join(f"{n:,} {what}" for n, what in parts if n)
    if result.cast:
        tolerance += f"; {len(result.cast):,} compared after a lossless cast"
    lines.append(f"{summary} ({tolerance})")
    return "\n".join(lines)


def _diff(args) -> int:
    from objckpt._inspect import diff as _diff

    rules = load_rules(args.rules) if args.rules else None
    result = _diff.diff(args.a, args.b, rtol=args.rtol, atol=args.atol, rules=rules)
    if args.format == "json":
        print(json.dumps(diff_json(result), indent=2))
    else:
        print(diff_text(result))
    return 0 if result.same else 1


def load_rules(path: str) -> list:
    """Reads rules from a JSON file: [[regex, replacement-or-null], ...] (data, never code)."""
    try:
        with open(path, encoding="utf-8") as f:
            rules = json.load(f)
    except OSError as err:
        raise errors.InvalidArgumentError(
            f"--rules {path}: cannot read the file ({err.strerror}). Expected a JSON file like "
            '[["^model_001/", ""]]. Fix: pass the path of a readable rules file.') from err
    except ValueError as err:
        raise errors.InvalidArgumentError(
            f"--rules {path}: not valid JSON ({err}). Expected a list of [regex, replacement] "
            'pairs, e.g. [["^model_001/", ""], ["^global_step$", null]]. Fix: correct the '
            'file to be such a list.') from err
    if not isinstance(rules, list) or not all(isinstance(r, list) and len(r) == 2
                                              for r in rules):
        raise errors.InvalidArgumentError(
            f"--rules {path}: expected a JSON list of [regex, replacement] pairs. Received: "
            f"{json.dumps(rules)[:200]}. Fix: write the file as such pairs, e.g. "
            "[[\"^model_001/\", \"\"]].")
    return [tuple(r) for r in rules]


def load_template(spec: str):
    """Imports MODULE:CALLABLE and calls it; the user's own code, never checkpoint data."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise errors.InvalidArgumentError(
            f"--template {spec!r}: expected MODULE:CALLABLE. Fix: pass e.g. "
            "--template my_project.models:build_model.")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, attribute)
    except (ImportError, AttributeError) as err:
        raise errors.InvalidArgumentError(
            f"--template {spec!r}: cannot import it ({type(err).__name__}: {err}). The module "
            "must be importable from the current directory or PYTHONPATH. Fix: run from the "
            "project's directory, or add it to PYTHONPATH.") from err
    finally:
        sys.path.remove(os.getcwd())
    try:
        return factory()
    except Exception as err:
        raise errors.TemplateError(
            f"--template {spec!r} raised {type(err).__name__}: {err}. Nothing was written. Fix: "
            "make the callable return the built model (e.g. call it on a batch).") from err


def _migrate(args) -> int:
    from objckpt._ops import migrate as _migrate

    rules = load_rules(args.rules) if args.rules else []
    obj = load_template(args.template)
    optimizer_state = {"auto": "auto", "true": True, "false": False}[args.optimizer_state]
    cast = getattr(args, "cast", "lossless")
    if args.dry_run:
        from objckpt._ops import restore as _restore

        # The plan migrate would follow (the pipeline's open, plan and check stages: the
        # template's optimizer built first where it is not yet).
        plan = _restore.plan(obj, args.source, rules=rules, at=args.at,
                             optimizer_state=optimizer_state, cast=cast)
        print(_terminal.cli_words(plan.describe()))
        usable = plan.complete if args.strict else not (plan.mismatched or plan.ambiguous
                                                        or not plan.matches)
        return 0 if usable else 1
    prefix = _migrate.migrate(obj, args.source, args.out, rules=rules, at=args.at,
                              optimizer_state=optimizer_state, strict=args.strict,
                              cast=cast)
    print(f"wrote {_render.safe(prefix)}")
    return 0


def _graph(args) -> int:
    from objckpt._inspect import graph as _graph

    fmt = args.format
    if fmt is None:
        ext = os.path.splitext(args.out or "")[1].lstrip(".").lower()
        fmt = {"svg": "svg", "png": "png"}.get(ext, "dot")
    if fmt != "dot" and not args.out:
        raise app.UsageError(f"--format {fmt} writes binary or XML: pass --out FILE "
                             f"(e.g. --out graph.{fmt}); only DOT text goes to stdout.", exitcode=2)
    picture = _graph.graph(args.source, depth=args.depth, empty=args.empty)
    if not args.out:
        # The caption's advice in the CLI's words; names in the nodes are data, left as is.
        caption, _, rest = picture.dot.partition("\n  node [")
        sys.stdout.write(_terminal.cli_words(caption) + "\n  node [" + rest if rest
                         else picture.dot)
        return 0
    picture.save(args.out, format=fmt)
    print(f"wrote {_render.safe(args.out)}: {picture!r}")
    return 0


def _verify(args) -> int:
    from objckpt._inspect import verify as _verify

    report = _verify.verify(args.source)
    print(report.describe())
    return 0 if report.ok else 1


def _weights(text: str) -> list:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, e.g. 1,1,2; got {text!r}") from None


def _average(args) -> int:
    from objckpt._ops import averaging as _averaging

    done = _averaging.average_checkpoints(args.sources, args.out, weights=args.weights,
                                          non_weights=args.non_weights)
    shares = ", ".join(f"{w:.4g}" for w in done["weights"])
    print(f"wrote {_render.safe(done['prefix'])}: averaged {len(done['averaged'])} variables "
          f"over {len(done['sources'])} checkpoints (weights {shares}); "
          f"{len(done['taken'])} other variables copied from "
          f"{_render.safe(done['sources'][done['taken_from']])}")
    return 0


def _demo(args) -> int:
    from objckpt._cli import demo as _demo

    return _demo.run(out=args.out, epochs=args.epochs)


_COMMANDS = {"inspect": (_inspect, False), "diff": (_diff, False), "graph": (_graph, False),
             "migrate": (_migrate, True), "verify": (_verify, True),
             "average": (_average, False), "demo": (_demo, True)}


def main(args) -> int:
    command, imports_tf = _COMMANDS.get(args.command, (None, False))
    _terminal.quiet_clients()  # a remote URL's client: its INFO lines off the terminal
    try:
        if command is not None:
            with _terminal.quiet_tf() if imports_tf else contextlib.nullcontext():
                code = command(args)
            sys.stdout.flush()  # a reader that went away shows here, not at exit
            return code
    except BrokenPipeError:
        return _reader_gone()
    except errors.ObjckptError as err:
        # Messages escape the names they quote; this keeps any control character that got
        # through (from TF's own text, say) off the terminal all the same.
        text = _terminal.cli_words(_render.safe_text(err, lines=True))
        print(f"objckpt {args.command}: {text}", file=sys.stderr)
        return 1
    raise app.UsageError(f"unknown command {args.command!r}", exitcode=2)


# The exit status when stdout's reader went away (`objckpt inspect ... | head`): what a
# shell reports for a tool that SIGPIPE ended (128 + 13), as `cat` or `grep` end there.
CLOSED_PIPE_EXIT = 141


def _reader_gone() -> int:
    """Ends quietly after a BrokenPipeError on stdout, as Python's documentation advises:
    stdout goes to devnull, so the interpreter's last flush raises nothing either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)
    return CLOSED_PIPE_EXIT


def run():
    """Console-script entry point."""
    # A command-line tool may quiet TF's C++ start-up logging for its own
    # process; the library itself never configures TF.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main, flags_parser=_parse)


if __name__ == "__main__":
    run()
