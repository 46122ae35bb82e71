"""Text for people: sizes, shapes, counts, error causes, escaping. Pure Python, no TensorFlow.

Every place that shows a size, a shape or the cause of an error uses these, so the CLI, the
graph pictures, reports and error messages agree.

Names read from a checkpoint (object paths, checkpoint keys, saved variable names, names in
a `checkpoint` state file) are untrusted data (DESIGN.md, invariant 2): every text meant for
a terminal shows them through `safe`, so no name can forge a line of a table or send an
escape sequence to the terminal. JSON output needs no help: `json.dumps` escapes them.
"""

from __future__ import annotations

import re

__all__ = ["count", "elements", "first_line", "grouped", "inspect_json", "inspect_text",
           "listed", "mb", "safe", "safe_text", "saved_name", "shape", "size"]

# What a terminal must never receive raw: C0 controls (\n, \r, \t, ESC, NUL, ...), DEL, C1
# controls, the Unicode line and paragraph separators, bidi marks, embeddings, overrides and
# isolates (which reorder what a terminal shows), and lone surrogates (which cannot be encoded).
_CONTROLS = (r"\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
             r"\ud800-\udfff")
_UNSAFE_NAME = re.compile(r"[\\\x00-\x0a" + _CONTROLS + "]")  # backslash, controls
_UNSAFE_TEXT = re.compile(r"[\x00-\x0a" + _CONTROLS + "]")  # controls
_UNSAFE_LINES = re.compile(r"[\x00-\x09" + _CONTROLS + "]")  # controls but \n
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(name) -> str:
    """A name read from a checkpoint as one line of visible text, for terminals and tables.

    Control characters become visible escapes as Python writes them (`\\n`, `\\x1b`,
    `\\x00`, `\\x85`, `\\u202e`), and so does a backslash (`\\\\`), so the escaped text
    is unambiguous. Printable text, non-ASCII letters included (`café`, `層`), is kept, and a
    name that needs no escaping comes back unchanged.

    Example:
      >>> print(safe("dense\\x1b[2J\\nkernel"))
      dense\\x1b[2J\\nkernel
    """
    return _UNSAFE_NAME.sub(_visible, str(name))


def safe_text(text, *, lines: bool = False) -> str:
    """A message for people that may quote names: control characters escaped as by `safe`.

    Backslashes are kept (names in the text may be escaped already, and escaping them again
    would double them). `lines=True` keeps line breaks (`\\n`), for messages of several
    lines; otherwise the text stays one line.
    """
    return (_UNSAFE_LINES if lines else _UNSAFE_TEXT).sub(_visible, str(text))


def size(nbytes: float) -> str:
    """`512 B`, `1.5 KB`, `12.0 MB`, `2.1 GB` (decimal units)."""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def mb(nbytes: float) -> str:
    """`12.3 MB`: one fixed unit, for lines that compare sizes."""
    return f"{nbytes / 1e6:,.1f} MB"


def shape(dims) -> str:
    """A shape as Python writes a tuple: `()`, `(3,)`, `(2, 3)`."""
    dims = tuple(dims)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def elements(dims) -> int:
    """Number of elements of a fully defined shape."""
    total = 1
    for dim in dims:
        total *= int(dim)
    return total


def count(n: int, noun: str) -> str:
    """`1 variable`, `1,234 variables`."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def listed(items, limit: int = 20) -> list[str]:
    """Items as `  - item` lines, at most `limit` of them, then `  - ... and N more`."""
    items = list(items)
    lines = [f"  - {item}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"  - ... and {len(items) - limit} more")
    return lines


def grouped(items, limit: int = 5) -> list[str]:
    """`subject: reason` lines with one line per reason, in first-seen order.

    Lines that give the same reason become one: `reason (N): subject, subject, ... and K
    more` (at most `limit` subjects shown); a reason given once, and a line without `: `,
    stay as they are. So a report says "the obj has no optimizer to put it in" once, not once
    per optimizer entry.
    """
    groups: dict[str, list[str]] = {}
    for item in map(str, items):
        subject, sep, reason = item.partition(": ")
        groups.setdefault(reason if sep else item, []).append(item if not sep else subject)
    lines = []
    for reason, subjects in groups.items():
        if len(subjects) == 1:
            only = subjects[0]
            lines.append(only if only == reason else f"{only}: {reason}")
            continue
        shown = ", ".join(subjects[:limit])
        more = f" and {len(subjects) - limit:,} more" if len(subjects) > limit else ""
        lines.append(f"{reason} ({len(subjects):,}): {shown}{more}")
    return lines


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (TF's messages run to pages)."""
    text = getattr(err, "message", None) or str(err)
    # TF's messages may quote checkpoint keys: controls escaped, the line kept one line.
    return safe_text(text.strip().splitlines()[0]) if text.strip() else type(err).__name__


# --- `objckpt inspect` ----------------------------------------------------------------

def _shown(path: str, entry) -> str:
    """The path people recognise (`_meta.Variable.shown`), else the canonical path."""
    return getattr(entry, "shown", path)


def inspect_json(entries) -> dict:
    """The JSON document `objckpt inspect --format json` prints.

    Each variable has its canonical object `path` (what checkpoint keys and `objckpt.diff`
    use), its `network_path` (the path through the layers, optimizers last), its saved
    `name`, shape, dtype, size and checkpoint key.
    """
    return {
        "prefix": entries.prefix,
        "variables": [
            {"path": path, "network_path": _shown(path, entry), "shape": list(entry.shape),
             "dtype": entry.dtype.name, "nbytes": entry.nbytes, "key": entry.key,
             "name": entry.name,
             **({"layout": entry.layout} if getattr(entry, "layout", "") else {})}
            for path, entry in entries.items()],
        "total": {"variables": len(entries),
                  "parameters": sum(elements(e.shape) for e in entries.values()),
                  "nbytes": entries.nbytes},
    }


def inspect_text(entries) -> str:
    """The object tree as indented text, objects with totals of their subtree.

    Variables are shown under their network path (a trained Keras 3 model's weights under
    its layers, not under `optimizer/_trainable_variables`) with the name they were saved
    under beside it (`_kernel  [sequential/encoder/kernel]`); TF optimizer slots (paths with
    `/.OPTIMIZER_SLOT/`) are listed after the tree. Names are shown through `safe`: one row
    per object or variable whatever the names hold.
    """
    slot_marker = "/.OPTIMIZER_SLOT/"  # _paths.OPTIMIZER_SLOT; _render imports nothing
    shown = {path: _shown(path, entry) for path, entry in entries.items()}
    plain = {shown[p]: e for p, e in entries.items() if slot_marker not in shown[p]}
    slots = {shown[p]: e for p, e in entries.items() if slot_marker in shown[p]}
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
                variables, nbytes = totals[node]
                rows.append(("  " * (depth - 1) + safe(parts[depth - 1]) + "/",
                             count(variables, "variable"), "", size(nbytes)))
        rows.append(("  " * (len(parts) - 1) + safe(parts[-1]) + _saved(path, entry)
                     + _layout(entry),
                     shape(entry.shape), entry.dtype.name, size(entry.nbytes)))
    if slots:
        rows.append(("optimizer slots (<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>):", "", "",
                     size(sum(e.nbytes for e in slots.values()))))
        rows.extend(("  " + safe(p) + _saved(p, e) + _layout(e), shape(e.shape), e.dtype.name,
                     size(e.nbytes)) for p, e in slots.items())
    params = sum(elements(e.shape) for e in entries.values())
    kind = (" (name-based, TF1 Saver: variables by global name)"
            if getattr(entries, "name_based", False) else "")
    what = safe_text(getattr(entries, "description", "")) or f"checkpoint {safe(entries.prefix)}"
    header = (f"{what}{kind}: {count(len(entries), 'variable')}, "
              f"{count(params, 'parameter')}, {size(entries.nbytes)}")
    widths = [max([len(r[i]) for r in rows] + [len(h)])
              for i, h in enumerate(("object path  [saved name]", "shape", "dtype", "size"))]
    lines = [header, ""]
    for row in [("object path  [saved name]", "shape", "dtype", "size"), *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)).rstrip()
                     .ljust(sum(widths[:3]) + 4) + "  " + row[3].rjust(widths[3]))
    lines.append(f"{'total':<{sum(widths[:3]) + 4}}  {size(entries.nbytes).rjust(widths[3])}")
    return "\n".join(lines)


def _saved(path: str, entry) -> str:
    return saved_name(path, getattr(entry, "name", ""))


def _layout(entry) -> str:
    """A partitioned tensor's layout beside its path ("  [2 shards of rows [0:5) [5:10)]")."""
    layout = getattr(entry, "layout", "")
    return f"  [{layout}]" if layout else ""


_DEFAULT_NAME = re.compile(r"Variable(_[0-9]+)?(:0)?")  # what TF names an unnamed tf.Variable


def saved_name(path: str, name: str) -> str:
    """`  [name]`: the name a variable was saved under, to show beside its object path;
    "" when it has none, it is the path itself, or it is TF's default `Variable` (`_N`)."""
    if not name or name == path or _DEFAULT_NAME.fullmatch(name):
        return ""
    return f"  [{safe(name)}]"
