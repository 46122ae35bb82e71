"""objckpt: look inside TF2 object-based checkpoints.

Commands:
  objckpt inspect PREFIX|DIRECTORY [--format text|json]
      The object tree: every variable's object path, shape, dtype and size,
      with per-object and overall totals. A directory means its newest
      intact checkpoint.

Exit status: 0 on success, 1 when the checkpoint cannot be read, 2 on a usage
error.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl.flags import argparse_flags

from objckpt import errors


def _parse(argv):
    parser = argparse_flags.ArgumentParser(
        prog="objckpt", description=__doc__,
        formatter_class=argparse_flags.argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="print a checkpoint's object tree")
    inspect.add_argument("source", metavar="PREFIX|DIRECTORY")
    inspect.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv[1:])
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    return args


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return ""  # unreachable


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _shape(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _params(entry) -> int:
    count = 1
    for dim in entry.shape:
        count *= dim
    return count


def inspect_json(entries) -> dict:
    """The JSON document `objckpt inspect --format json` prints."""
    return {
        "prefix": entries.prefix,
        "variables": [
            {"path": path, "shape": list(entry.shape), "dtype": entry.dtype.name,
             "nbytes": entry.nbytes, "key": entry.key, "name": entry.name}
            for path, entry in entries.items()],
        "total": {"variables": len(entries),
                  "parameters": sum(_params(e) for e in entries.values()),
                  "nbytes": entries.nbytes},
    }


def inspect_text(entries) -> str:
    """The object tree as indented text, objects with totals of their subtree."""
    slot_marker = "/.OPTIMIZER_SLOT/"
    plain = {p: e for p, e in entries.items() if slot_marker not in p}
    slots = {p: e for p, e in entries.items() if slot_marker in p}
    totals: dict[str, list[int]] = {}
    for path, entry in plain.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            total = totals.setdefault("/".join(parts[:depth]), [0, 0])
            total[0] += 1
            total[1] += entry.nbytes
    rows, seen = [], set()
    for path, entry in plain.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            node = "/".join(parts[:depth])
            if node not in seen:
                seen.add(node)
                count, nbytes = totals[node]
                rows.append(("  " * (depth - 1) + parts[depth - 1] + "/",
                             _count(count, "variable"), "", _size(nbytes)))
        rows.append(("  " * (len(parts) - 1) + parts[-1], _shape(entry.shape),
                     entry.dtype.name, _size(entry.nbytes)))
    if slots:
        rows.append(("optimizer slots (<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>):", "", "",
                     _size(sum(e.nbytes for e in slots.values()))))
        rows.extend(("  " + p, _shape(e.shape), e.dtype.name, _size(e.nbytes))
                    for p, e in slots.items())
    params = sum(_params(e) for e in entries.values())
    header = (f"checkpoint {entries.prefix}: {_count(len(entries), 'variable')}, "
              f"{_count(params, 'parameter')}, {_size(entries.nbytes)}")
    widths = [max([len(r[i]) for r in rows] + [len(h)])
              for i, h in enumerate(("object path", "shape", "dtype", "size"))]
    lines = [header, ""]
    for row in [("object path", "shape", "dtype", "size"), *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)).rstrip()
                     .ljust(sum(widths[:3]) + 4) + "  " + row[3].rjust(widths[3]))
    lines.append(f"{'total':<{sum(widths[:3]) + 4}}  {_size(entries.nbytes).rjust(widths[3])}")
    return "\n".join(lines)


def _inspect(args) -> int:
    from objckpt import _tree

    entries = _tree.read_tree(args.source)
    if args.format == "json":
        print(json.dumps(inspect_json(entries), indent=2))
    else:
        print(inspect_text(entries))
    return 0


def main(args) -> int:
    try:
        if args.command == "inspect":
            return _inspect(args)
    except errors.ObjckptError as err:
        print(f"objckpt {args.command}: {err}", file=sys.stderr)
        return 1
    raise app.UsageError(f"unknown command {args.command!r}")


def run():
    """Console-script entry point."""
    # A command-line tool may quiet TF's C++ start-up logging for its own
    # process; the library itself never configures TF.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main, flags_parser=_parse)


if __name__ == "__main__":
    run()
